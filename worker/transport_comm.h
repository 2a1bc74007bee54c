/*
 * transport_comm.h — the collective data plane (prefix tpc_): grouped sends and receives of
 * DISPATCH and COMBINE blocks (laid out and checked as transport.h says) between device buffers.
 *
 * A communicator of P ranks, one per GPU worker, moving device buffers with grouped sends and
 * receives on the executor's stream. The library under it is a vtable (tpc_ops): NCCL's
 * (tpc_nccl_ops) in the worker, a fake of threads exchanging host memory in the unit tests, so
 * the state machine and every deadline run on the CPU.
 *
 * States: NONE -> INIT (tpc_begin_init / tpc_begin_shrink, non-blocking) -> READY
 * (tpc_wait_ready) -> ABORTED (any failure: an asynchronous error, a deadline passed, the
 * owner interrupted a wait) -> INIT again (rebuilt: a new communicator, or a shrink of a READY
 * one). Every wait has a deadline (clk_mono_ms, common/clock.h); a wait that fails aborts the
 * library communicator (ncclCommAbort), so nothing stays queued on the stream, and the error
 * names the epoch, generation, rank and what was waited for. Only READY exchanges. One owner
 * thread.
 */
#ifndef EPMOE_TRANSPORT_COMM_H
#define EPMOE_TRANSPORT_COMM_H

#include <stdint.h>

#include "common/clock.h" /* clk_mono_ms: the clock of every deadline here */
#include "common/error.h"
#include "worker/transport_comm_lib.h"

/* Called between polls of a wait; returns non-zero (err set) to give up (the owner was told to
 * abandon the step or drop the session): the wait then aborts the communicator. */
typedef int (*tpc_idle_fn)(void *ctx, ep_err *err);

typedef enum tpc_state { TPC_NONE = 0, TPC_INIT = 1, TPC_READY = 2, TPC_ABORTED = 3 } tpc_state;

/* What ended the last failed wait (for the step's error code). */
typedef enum tpc_fault {
    TPC_FAULT_NONE = 0,
    TPC_FAULT_LIBRARY = 1,  /* the library or the device reported an error */
    TPC_FAULT_DEADLINE = 2, /* the deadline passed */
    TPC_FAULT_ABANDONED = 3 /* the owner's idle function gave up, or the owner aborted */
} tpc_fault;

typedef struct tpc_comm tpc_comm;

tpc_comm *tpc_create(const tpc_ops *ops, void *ctx, ep_err *err);
/* Aborts a live communicator. */
void tpc_destroy(tpc_comm **self_p);

/* A new id for rank 0 of a new communicator to hand to the others. */
int tpc_new_id(tpc_comm *c, tpc_id *id, ep_err *err);
/* Begin the communicator (epoch, generation) of rank among size ranks sharing id; a
 * communicator still held is aborted first. */
int tpc_begin_init(tpc_comm *c, uint64_t epoch, uint32_t generation, int rank, int size,
                   const tpc_id *id, ep_err *err);
/* Begin (epoch, generation) as the READY communicator (parent_epoch, parent_generation) less
 * the ranks exclude[0..n) (ascending, of the parent). Checked first: that communicator is the
 * one held and READY, exclude is valid and leaves this rank in, and rank/size are what the
 * survivors' order gives (old rank less the excluded ranks below it). */
int tpc_begin_shrink(tpc_comm *c, uint64_t epoch, uint32_t generation, uint64_t parent_epoch,
                     uint32_t parent_generation, const uint32_t *exclude, int n_exclude, int rank,
                     int size, ep_err *err);
/* Wait for the communicator begun to become READY: 0, or -1 with the communicator ABORTED and
 * err naming it ("... not ready after N ms", the library's error, or the owner's reason). */
int tpc_wait_ready(tpc_comm *c, int64_t deadline, tpc_idle_fn idle, void *idle_ctx, ep_err *err);
/* One grouped exchange on stream, waited for until everything enqueued on stream is done
 * (what = "dispatch counts", "dispatch", "combine" names it in errors). A communicator that is
 * not READY fails at once; a failed or late exchange aborts it. */
int tpc_exchange(tpc_comm *c, const char *what, const tpc_xfer *sends, int n_sends,
                 const tpc_xfer *recvs, int n_recvs, void *stream, int64_t deadline,
                 tpc_idle_fn idle, void *idle_ctx, ep_err *err);
/* Abort now (the owner's own failure mid-step: nothing of the step may stay queued). */
void tpc_abort(tpc_comm *c, const char *why);

tpc_state tpc_get_state(const tpc_comm *c);
const char *tpc_state_name(tpc_state s); /* "none", "init", "ready", "aborted" */
uint64_t tpc_epoch(const tpc_comm *c);
uint32_t tpc_generation(const tpc_comm *c);
int tpc_rank(const tpc_comm *c);
int tpc_size(const tpc_comm *c);
/* Why the communicator was aborted ("" if it never was), and what kind of failure that was. */
const char *tpc_last_error(const tpc_comm *c);
tpc_fault tpc_last_fault(const tpc_comm *c);

#endif
