/*
 * sequencer.h — forward requests in, one step at a time out (prefix seq_).
 *
 * A FORWARD request is validated before it is queued (layer, n_tokens 1..EP_MAX_TOKENS, payload
 * sizes, token ids iff the layer is hash-routed and each id in [0, vocab)), admitted while the
 * cluster is ready or changing placement epochs (ERR_NOT_READY otherwise, naming the workers
 * that are not), and queued FIFO up to EP_MAX_QUEUED_STEPS (ERR_BUSY beyond). While an epoch is
 * being applied queued requests wait, each at most step_timeout_ms (then ERR_TIMEOUT), and run
 * in the new epoch. One step is in flight at a time, on the members of the epoch (the ranks that
 * own experts): the i-th of M members gets tokens [floor(i*T/M), floor((i+1)*T/M)) as zero-copy
 * slices of the request's own frames, the
 * STEP_DONE chunks are checked and reassembled in input order, and the client gets one
 * AdminReply with out bf16 [T, H], topk_ids int32 [T, k], topk_weights f32 [T, k].
 *
 * Failure semantics: the first failure of a step (STEP_FAILED, a malformed STEP_DONE, a worker
 * lost or unreachable, step_timeout_ms) answers the client at once (ERR_STEP_FAILED "worker a1
 * (rank 1): ...", ERR_TIMEOUT, ERR_WORKER_LOST) and sends STEP_ABORT to every live worker that
 * has not failed the step itself. The next step starts only when every rank answered the step
 * or is dead; a worker that still has not answered step_timeout_ms after the abort is declared
 * dead (it ignores the protocol), so the queue can never stall for good. Requests still queued
 * when the cluster leaves ready are answered with ERR_NOT_READY when their turn comes.
 *
 * A passive state machine (coord.h): the facts it needs come in a seq_env, and what it decides
 * goes into an ob_box — STEP and STEP_ABORT to ranks, AdminReplies to clients (formatted by
 * admin.h), and events: OB_EV_DECLARE_DEAD for a worker that ignored STEP_ABORT, OB_EV_ERROR
 * for an error text to show on a worker, OB_EV_STEP_END when a step closed (its record). Only
 * seq_pump closes a settled step and starts the next one, and only coord.c calls it, after it has
 * routed every event of the loop turn.
 */
#ifndef EPMOE_SEQUENCER_H
#define EPMOE_SEQUENCER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/model_config.h"
#include "common/wire.h"
#include "coordinator/outbox.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

/* What the sequencer needs to know from the rest of the daemon, per call. */
typedef struct seq_env {
    const spec_cluster *spec; /* worker names (index == rank), step_timeout_ms */
    const mc_config *cfg;
    uint64_t session;       /* STEP.session */
    const plan_table *plan; /* the epoch steps run in */
    int64_t now_ms;
    const char *state;     /* the cluster state's name, for messages */
    bool ready;            /* steps may start */
    bool wait;             /* not ready, but an epoch is being applied: requests wait queued */
    bool stopping;         /* refuse with ERR_SHUTTING_DOWN */
    const char *not_ready; /* "a1 (absent), ..." when not ready, for ERR_NOT_READY */
} seq_env;

typedef struct seq_sequencer seq_sequencer;

/* What a closed step leaves for the statistics and the metrics (seq_last_record, after
 * OB_EV_STEP_END): its outcome, and what its STEP_DONEs reported — the (token, expert) pairs per
 * expert and per rank that computed them (counted at the origins), the slowest worker's
 * dispatch / expert / combine times, bytes and data-plane messages summed. */
typedef struct seq_record {
    uint64_t step_id, epoch;
    int layer, n_tokens;
    bool ok;
    Epmoe__ErrorCode code; /* the failure's (ok false) */
    double seconds;        /* from the STEPs' sending to the last answer */
    int n_experts, n_ranks;
    uint32_t *expert_tokens; /* [n_experts] */
    uint32_t *rank_pairs;    /* [n_ranks] */
    bool have_load;          /* some worker reported routed pairs */
    double dispatch_s, expert_s, combine_s;
    uint64_t dispatch_bytes, combine_bytes;
    uint64_t messages;
} seq_record;

/* first_step: the id of the first step (coord.c: the start time in microseconds, so ids keep
 * increasing across restarts). max_queued_bytes: what the requests waiting may hold in all
 * (coord.c: EP_MAX_QUEUED_BYTES); one more is refused with ERR_BUSY. */
seq_sequencer *seq_create(int n_ranks, uint64_t first_step, uint64_t max_queued_bytes, ep_err *err);
/* Free queued requests and the step record (no replies are sent: see seq_stop). */
void seq_destroy(seq_sequencer **self_p);

/* A FORWARD request from the admin socket. Takes ownership of m (heap-allocated, from
 * wire_recv) and req; replies at once on a validation or admission error. Every refusal that
 * needs no look at the values (stopping, fields and sizes, not ready, busy) comes before the
 * value scan, so a request that is refused costs O(1) whatever its size (a flood of large
 * requests must not hold up the loop's heartbeats). */
void seq_submit(seq_sequencer *s, const seq_env *env, wire_msg *m, Epmoe__AdminRequest *req,
                ob_box *out);
/* STEP_DONE or STEP_FAILED from the worker of rank. */
void seq_on_message(seq_sequencer *s, const seq_env *env, int rank, const wire_msg *m, ob_box *out);
/* A worker died or re-registered: its part of the step in flight is lost. */
void seq_worker_lost(seq_sequencer *s, const seq_env *env, int rank, const char *why, ob_box *out);
/* The STEP of step_id could not be sent to rank (err: why). */
void seq_send_failed(seq_sequencer *s, const seq_env *env, int rank, uint64_t step_id,
                     const char *err, ob_box *out);
/* Time-driven work: the step deadline, the abort deadline. */
void seq_tick(seq_sequencer *s, const seq_env *env, ob_box *out);
/* Close the step in flight once every rank answered or is gone, then start queued requests
 * while no step is in flight (or answer them ERR_NOT_READY when the cluster is not ready). */
void seq_pump(seq_sequencer *s, const seq_env *env, ob_box *out);
/* The next time seq_tick or seq_pump has something to do (INT64_MAX when nothing). */
int64_t seq_next_deadline(const seq_sequencer *s, const seq_env *env);
/* A step is in flight (a new placement is sent only when none is). */
bool seq_busy(const seq_sequencer *s);
/* The spec's worker count changed (a reload); only while no step is in flight. */
int seq_resize(seq_sequencer *s, int n_ranks, ep_err *err);
/* Orderly stop: answer the step in flight and every queued request with ERR_SHUTTING_DOWN. */
void seq_stop(seq_sequencer *s, ob_box *out);

/* The last closed step (valid from its OB_EV_STEP_END until the next step starts). */
const seq_record *seq_last_record(const seq_sequencer *s);

uint64_t seq_steps_done(const seq_sequencer *s);
uint64_t seq_steps_failed(const seq_sequencer *s);
int seq_queued(const seq_sequencer *s); /* waiting, not counting the step in flight */

#endif
