/*
 * exec.h — the step executor of a worker: a thread that owns the model shard, the GEMM pool and
 * the data plane, and runs MoE steps with its peers (prefix exec_).
 *
 * Actor model (czmq zactor): exec_start creates the thread and an inproc PAIR pipe; the caller
 * keeps exec_pipe() and is its only user, the thread owns everything else. Both directions
 * speak wire.h framing (the internal commands' values: exec_pipe.h): the caller relays the
 * coordinator's LOAD, STEP and STEP_ABORT messages verbatim, plus the internal commands below; the
 * executor answers with protocol messages (LOADING, READY, Error, STEP_DONE, STEP_FAILED) that the
 * caller relays to the coordinator verbatim, plus EXEC_EVT_RESET_DONE.
 *
 *   EXEC_CMD_SESSION  body: an exec_session pointer (ownership passes): the placement to work
 *                     under from now on. Drops the data plane; the loaded layers stay.
 *   EXEC_CMD_RESET    drop the session and the data plane; answered by EXEC_EVT_RESET_DONE, so
 *                     the caller can discard answers that belonged to the old session. The
 *                     loaded layers stay (a coordinator restart does not make a worker read its
 *                     shard again).
 *   EXEC_CMD_TERM     leave the thread (exec_stop sends it).
 *   LOAD              bind the data plane, connect to the peers, open the checkpoint and check
 *                     its files against the session's fingerprint, load every MoE layer (main
 *                     and MTP) with the experts this rank owns; LOADING progress (at most ~10
 *                     per second) then READY, or Error{ERR_LOAD_FAILED} naming the cause (the
 *                     executor stays up, not ready). Layers already loaded for the same model
 *                     and config keep the experts the rank still owns: only the others are
 *                     read (READY.experts_kept, READY.bytes_read say how it went).
 *   EPOCH             the session moves to a new placement (epoch, owners, members), then
 *                     exactly as LOAD: gained experts are read, lost ones dropped, READY{epoch}.
 *   EPOCH {staged}    a rebalance: load the epoch's layers beside the ones serving (reusing
 *                     what they hold) while steps go on between layers; READY{epoch, staged}.
 *                     Any other command but STEP and STEP_ABORT abandons the staged load.
 *   EPOCH_COMMIT      serve the staged epoch from now on: its layers replace the old ones (lost
 *                     experts dropped), the data plane takes its epoch in place; READY{epoch}.
 *   STEP              route, dispatch, experts, combine (docs/protocol.md "Forward steps");
 *                     STEP_DONE or STEP_FAILED{code, message naming peer, tensor or index}. A
 *                     STEP must carry the session; its hidden states must be finite (a NaN or
 *                     Inf is ERR_BAD_REQUEST naming the token and channel). STEP_DONE goes out
 *                     once this worker's own tokens are combined; the step stays open to serve
 *                     its peers' DISPATCHes until the next STEP, STEP_ABORT or placement message
 *                     closes it (docs/protocol.md "Sparse all-to-all").
 *   STEP_ABORT        abandon that step if running (STEP_FAILED) or close it if open.
 *
 * While a step waits for its peers the executor also watches the pipe, so STEP_ABORT, RESET and
 * TERM interrupt it; a step that outlives step_timeout_ms fails naming the peers not heard from.
 * A step's output is bit-identical to moe_forward over the whole batch in one process.
 */
#ifndef EPMOE_EXEC_H
#define EPMOE_EXEC_H

#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"
#include "kernels/moe_backend.h"
#include "worker/exec_pipe.h"
#include "worker/exec_session.h"

typedef struct exec_actor exec_actor;

/* Start the executor thread in zctx with the worker's backend (*be_p is taken and NULLed, also
 * on failure) and, with security, the worker's key pair (copied; NULL: none). Returns once the
 * thread runs and its pipe is connected, or with an error when the pipe cannot be set up (it
 * never waits for ever). */
exec_actor *exec_start(void *zctx, mb_backend **be_p, const auth_keypair *key, ep_err *err);
/* Send TERM and join the thread (a load in progress stops at the next layer). */
void exec_stop(exec_actor **self_p);
/* The caller's end of the pipe (poll it for ZMQ_POLLIN; only the creating thread uses it). */
void *exec_pipe(exec_actor *a);

/* Send a command without a body (EXEC_CMD_RESET, EXEC_CMD_TERM). */
int exec_send_cmd(exec_actor *a, uint16_t cmd, ep_err *err);
/* Hand a session to the executor (EXEC_CMD_SESSION); *s_p is taken and NULLed, even on failure. */
int exec_send_session(exec_actor *a, exec_session **s_p, ep_err *err);
/* The worker's metrics (worker/wmetrics.h; thread-safe) for the executor to update; sent over
 * the pipe (EXEC_CMD_METRICS), NULL to stop. */
struct wmx;
int exec_send_metrics(exec_actor *a, struct wmx *m, ep_err *err);

/* "cpu-avx2", "cuda-exact", ...: what READY reports as the backend. */
const char *exec_backend_name(const exec_actor *a);

#endif
