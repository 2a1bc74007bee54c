/*
 * coord.h — the coordinator daemon: its sockets, its poll loop and the order of events
 * (prefix coord_).
 *
 * One thread owns everything (anchors-ops-style §1.1, §2.9 mdbroker): the ROUTER for workers
 * (coordinator.listen), the ROUTER for operators (coordinator.admin), and a signalfd, all in one
 * zmq_poll loop whose timeout is never infinite. The coord module (coord.c, the loop, and the
 * coord_*.c files it calls; coord_state.h maps them) is the only one that reads or writes a
 * socket and the only one that calls the others:
 *
 *   registry  (reg_)  worker lifecycle: REGISTER .. READY, heartbeats, liveness
 *   planner   (plan_) the placement tables and their epochs
 *   reload    (rl_)   builds and validates a reloaded spec (coord.c swaps it in)
 *   sequencer (seq_)  the FIFO of forward requests and the one step in flight
 *   admin     (adm_)  parses AdminRequests and formats AdminReplies
 *   outbox    (ob_)   what a handler returns: messages to send, events to route
 *
 * The registry, planner and sequencer are passive state machines: a handler changes its own
 * state and returns what happened in an ob_box; it never calls another module. After each
 * input (a message, a signal, a timer) coord.c settles: it sends the queued messages in order,
 * then routes the queued events one at a time (a worker lost -> the sequencer; a worker to
 * declare dead -> the registry; ...), recomputing the cluster state before each, and lets the
 * sequencer start the next step only when nothing else is pending. So no handler ever runs
 * inside another, and the order of events is decided here, in one place.
 *
 * Placement epochs (docs/protocol.md): a worker lost, a drain, an undrain, a rejoin or a reload
 * makes the planner decide a new table; coord.c sends it (EPOCH) once no step is in flight,
 * holds new steps meanwhile (queued requests wait, each at most step_timeout_ms), and the
 * epoch is current when every member has acknowledged it (READY {epoch}).
 *
 * Contract: coord_create binds both sockets (errors name the spec line of the endpoint);
 * coord_run serves until SIGTERM/SIGINT or an admin SHUTDOWN, then stops in order (SHUTDOWN to
 * every registered worker, ERR_SHUTTING_DOWN to every queued request) and returns 0;
 * coord_destroy frees everything. No input from either socket can crash the daemon: every
 * message is checked, answered with an Error where the sender is known, and the loop goes on.
 */
#ifndef EPMOE_COORD_H
#define EPMOE_COORD_H

#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

typedef struct coord coord;

/* Create the daemon and bind both sockets. Takes the spec (*spec_p is cleared, also on
 * failure: a reload replaces it); the config is copied. */
coord *coord_create(spec_cluster **spec_p, const mc_config *cfg, ep_err *err);
/* Serve until stopped; returns 0 after an orderly stop, -1 when the loop itself failed. */
int coord_run(coord *c, ep_err *err);
void coord_destroy(coord **self_p);

#endif
