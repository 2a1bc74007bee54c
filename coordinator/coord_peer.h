/*
 * coord_peer.h — data-plane verdicts of the coordinator daemon (prefix coord_; coord_peer.c):
 * a worker whose control connection lives but whose data plane is cut (a partition of its data
 * port) is found by the origins that get no COMBINE from it (PEER_UNREACHABLE, worker/serve.h)
 * and quarantined here: it owns no experts, as if drained, for a while that doubles each time
 * it is found again, then rejoins like an undrained worker.
 *
 * The verdict: each fresh report (within two liveness windows) of a member R about a member X
 * counts 1 / (the number of members R reports) against X: a worker cut off from everyone
 * reports everyone and spreads its blame thin, while the workers that cannot reach it blame
 * it alone. X is quarantined when its blame is at least 1 and larger than that of each of its
 * reporters; otherwise (equal blame: two workers reporting each other, as when only the link
 * between them is cut) nothing is decided and the origins fail the requests that need X,
 * naming it. Evaluated a heartbeat after a
 * report, so that the reports of one stall meet.
 */
#ifndef EPMOE_COORD_PEER_H
#define EPMOE_COORD_PEER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/wire.h"
#include "coordinator/coord_state.h"

/* PEER_UNREACHABLE from rank: kept for the next evaluation (dropped, logged at debug, when it
 * is of another epoch or names a non-member, itself or a rank out of range). */
void coord_on_peer_report(coord *c, int rank, const wire_msg *m);
/* Is rank quarantined from the data plane now (coord_eligible leaves it out)? */
bool coord_quarantined(const coord *c, int rank);
/* When coord_peer_tick has something to do (INT64_MAX: nothing). */
int64_t coord_peer_due(coord *c);
/* Decide what the reports say, and end the quarantines that are over (each replans). */
void coord_peer_tick(coord *c);
/* Rank was declared dead on the control plane: its quarantine ends (it registers afresh; if
 * its data plane is still cut the origins find it again, and the verdicts in a row count on). */
void coord_peer_forget(coord *c, int rank);
void coord_peer_free(coord *c);

#endif
