/*
 * ncclboot.h — the NCCL data plane's communicator as the coordinator runs it: bootstrap,
 * deadline, rebuild (prefix nb_). Only for data_plane nccl (docs/protocol.md "NCCL data plane").
 *
 * A passive state machine (coord.h): facts in an nb_env, messages and events out in an ob_box.
 * The communicator's world is the epoch's members (the ranks that own experts), in ascending
 * worker rank: communicator rank i is the i-th member. One round builds the communicator of
 * (epoch, generation):
 *
 *   idle --every member READY--> wait-id: COMM_INIT{epoch, generation, timeout_ms, rank, size,
 *        members} to the first member, which creates the ncclUniqueId and answers COMM_ID
 *   wait-id --COMM_ID--> wait-done: COMM_INIT with the id to the other members (the id travels
 *        only on the control channel, which security: makes CURVE)
 *   wait-done --COMM_DONE{ok} from every rank--> ready: steps may run
 *   wait-id / wait-done --COMM_DONE{ok: false}, or no answer by the deadline--> failed: every
 *        rank that did not finish gets an error naming it (OB_EV_ERROR, shown by status), and a
 *        new round (generation + 1) starts after a backoff (heartbeat_ms doubling to 32 s)
 *   any --nb_invalidate (a step failed and the workers aborted their communicators)--> idle,
 *        generation + 1, nothing left to shrink; a member no longer ready also returns the
 *        round to idle, but the ready communicator it had stays the parent a shrink can use
 *
 * The deadline is the workers' timeout_ms (coordinator.step_timeout_ms) plus two heartbeats, so
 * a worker's own COMM_DONE{ok: false}, which says why, normally arrives first.
 *
 * Rebuilding over survivors: when a new placement epoch's members are the members of the last
 * ready communicator less some (a failover after a loss while no step ran, a drain), and that
 * communicator was not invalidated since, the round is a shrink: COMM_INIT{shrink,
 * parent_epoch, parent_generation, exclude_ranks} to every member, no id (ncclCommShrink on the
 * workers). A shrink round that fails is retried as a new communicator.
 */
#ifndef EPMOE_NCCLBOOT_H
#define EPMOE_NCCLBOOT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/wire.h"
#include "coordinator/outbox.h"
#include "coordinator/spec.h"

/* Backoff of a failed round: from heartbeat_ms, doubling, at most this. */
#define NB_MAX_RETRY_MS 32000

typedef struct nb_env {
    const spec_cluster *spec; /* worker names, step_timeout_ms, heartbeat_ms */
    uint64_t epoch;
    const uint8_t *member; /* [spec->n_workers]: 1 for the epoch's members */
    int64_t now_ms;
    bool all_ready; /* every member is READY in the epoch */
} nb_env;

typedef struct nb_boot nb_boot;

nb_boot *nb_create(int n_ranks, ep_err *err);
void nb_destroy(nb_boot **self_p);

/* The communicator of the current round is ready on every rank. */
bool nb_ready(const nb_boot *b);
/* "NCCL communicator of epoch 1.0: waiting for COMM_DONE from rank 1 (a1)" (for ERR_NOT_READY
 * and status; ranks are worker ranks), "" when ready. */
void nb_not_ready_text(const nb_boot *b, const spec_cluster *spec, char *buf, size_t cap);
/* Start a round when every worker is ready and none runs (or reset when they are not all
 * ready any more). */
void nb_pump(nb_boot *b, const nb_env *env, ob_box *out);
/* COMM_ID or COMM_DONE from the worker of rank (a worker rank). */
void nb_on_message(nb_boot *b, const nb_env *env, int rank, const wire_msg *m, ob_box *out);
/* The round's deadline. */
void nb_tick(nb_boot *b, const nb_env *env, ob_box *out);
/* The next time nb_tick or nb_pump has something to do (INT64_MAX when nothing). */
int64_t nb_next_deadline(const nb_boot *b);
/* The communicator is gone on some rank: build a new one before the next step. */
void nb_invalidate(nb_boot *b, const char *why);

/* Whether the new world (old_rank[r] = the rank in the old communicator of new rank r, or -1
 * for a worker that was not in it) is the old world of old_size ranks less some, in the same
 * order: then 1, with exclude[0..*n_exclude) the old ranks left out (ascending). */
int nb_shrink_plan(int old_size, const int *old_rank, int new_size, uint32_t *exclude,
                   int *n_exclude);

#endif
