/*
 * sequencer.h — forward requests in, one step at a time out (prefix seq_).
 *
 * A FORWARD request is validated before it is queued (layer, n_tokens 1..EP_MAX_TOKENS, payload
 * sizes, token ids iff the layer is hash-routed and each id in [0, vocab)), admitted only while
 * the cluster is ready (ERR_NOT_READY otherwise, naming the workers that are not), and queued
 * FIFO up to EP_MAX_QUEUED_STEPS (ERR_BUSY beyond). One step is in flight at a time: rank r gets
 * tokens [floor(r*T/P), floor((r+1)*T/P)) as zero-copy slices of the request's own frames, the
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
 */
#ifndef EPMOE_SEQUENCER_H
#define EPMOE_SEQUENCER_H

#include <stdint.h>

#include "common/wire.h"
#include "coordinator/coord.h"

seq_sequencer *seq_create(int n_ranks, ep_err *err);
/* Free queued requests and the step record (no replies are sent: see seq_stop). */
void seq_destroy(seq_sequencer **self_p);

/* A FORWARD request from the admin socket. Takes ownership of m (heap-allocated, from
 * wire_recv) and req; replies at once on a validation or admission error. */
void seq_submit(coord *c, wire_msg *m, Epmoe__AdminRequest *req);
/* STEP_DONE or STEP_FAILED from the worker of rank. */
void seq_on_message(coord *c, int rank, const wire_msg *m);
/* A worker died or re-registered: its part of the step in flight is lost. */
void seq_worker_lost(coord *c, int rank, const char *why);
/* Time-driven work: the step deadline, the abort deadline; starts the next step when it can. */
void seq_tick(coord *c);
/* The next time seq_tick has something to do (INT64_MAX when nothing). */
int64_t seq_next_deadline(const coord *c);
/* Orderly stop: answer the step in flight and every queued request with ERR_SHUTTING_DOWN. */
void seq_stop(coord *c);

uint64_t seq_steps_done(const seq_sequencer *s);
uint64_t seq_steps_failed(const seq_sequencer *s);
int seq_queued(const seq_sequencer *s); /* waiting, not counting the step in flight */

#endif
