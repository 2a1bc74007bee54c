/*
 * exec.h — the step executor of a worker: a thread that owns the model shard, the GEMM pool and
 * the data plane, and runs MoE steps with its peers (prefix exec_).
 *
 * Actor model (czmq zactor): exec_start creates the thread and an inproc PAIR pipe; the caller
 * keeps exec_pipe() and is its only user, the thread owns everything else. Both directions
 * speak wire.h framing: the caller relays the coordinator's LOAD, STEP and STEP_ABORT messages
 * verbatim, plus the internal commands below; the executor answers with protocol messages
 * (LOADING, READY, Error, STEP_DONE, STEP_FAILED) that the caller relays to the coordinator
 * verbatim, plus EXEC_EVT_RESET_DONE.
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"
#include "common/limits.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "common/wire.h"
#include "common/placement.h"
#include "epmoe.pb-c.h"
#include "kernels/moe_backend.h"
#include "worker/transport.h"

/* Internal message types on the pipe, above every MsgType of epmoe.proto. */
enum {
    EXEC_CMD_SESSION = 1000,
    EXEC_CMD_RESET = 1001,
    EXEC_CMD_TERM = 1002,
    EXEC_CMD_METRICS = 1003,
    EXEC_EVT_RESET_DONE = 1100,
};

/* Default when WELCOME carries no step_timeout_ms. */
#define EXEC_DEFAULT_STEP_TIMEOUT_MS 60000

/* The validated WELCOME an executor works under (built by wctl_welcome_parse). */
typedef struct exec_session {
    mc_config config;
    uint64_t config_hash; /* mc_hash(&config): this worker's own */
    int rank, world_size;
    uint64_t epoch;
    char model_path[EP_MAX_PATH];
    char data_endpoint[EP_MAX_PATH];   /* where to bind */
    char client_endpoint[EP_MAX_PATH]; /* the client ROUTER's; "": the default (serve.h) */
    uint32_t *expert_owner;            /* [n_routed_experts]: the flat owner (every layer, one
                                        * replica), else layer 0's first replica (NCCL's view) */
    pl_table *place;                   /* the replicas of every (layer, expert) */
    uint8_t *member;                   /* [world_size]: the rank takes part in steps */
    int n_members;
    char **peer_endpoint; /* [world_size], by rank */
    char **peer_name;     /* [world_size], by rank */
    tp_format dispatch;
    mb_gemm_mode gpu_gemm; /* expert GEMM path of a CUDA backend (spec gpu_gemm) */
    bool nccl;             /* data_plane nccl: steps run in worker/step_nccl.c */
    int step_timeout_ms;
    uint64_t session;                    /* WELCOME.session: STEP and the data plane carry it */
    uint8_t (*peer_key)[AUTH_KEY_BYTES]; /* [world_size] with security, else NULL */
    st_file_print *checkpoint;           /* the coordinator's fingerprint (n_checkpoint files) */
    int n_checkpoint;
} exec_session;

/* Check a STEP against a session before anything is allocated (what a STEP_FAILED
 * {ERR_BAD_REQUEST} says): step_id, session, epoch and layer present; the session's id and
 * epoch; a step id above last_step (when have_last); layer < n_layers; n_tokens <=
 * EP_MAX_TOKENS; the payloads' count and sizes (hidden bf16 [T, H], ids int64 [T] when has_ids);
 * ids on a hash layer; finite hidden states. Pure: the executor and fuzz_step call it. */
int exec_step_check(const exec_session *s, int n_layers, bool have_last, uint64_t last_step,
                    const Epmoe__Step *req, const wire_msg *m, ep_err *err);

/* An empty session with its tables allocated (E experts, P ranks); NULL when out of memory. */
exec_session *exec_session_new(int n_experts, int world_size);
void exec_session_free(exec_session **self_p);

/* Check a placement (WELCOME or EPOCH) against the session's config and world: exactly one of
 * expert_owner (one owner per routed expert, each < world_size) and a Placement (per-layer
 * tables with replicas, common/placement.h); members ascending, < world_size, and holding every
 * replica (n_members 0: every rank). Returns the table, or NULL with err naming the field and
 * what was expected. */
pl_table *exec_parse_placement(const exec_session *s, bool has_epoch, const uint32_t *owner,
                               size_t n_owner, const Epmoe__Placement *pm, const uint32_t *members,
                               size_t n_members, ep_err *err);
/* Adopt a checked placement (*pl_p taken) and its members (n_members 0: every rank). */
void exec_adopt_placement(exec_session *s, pl_table **pl_p, const uint32_t *members,
                          size_t n_members);
/* The flat forms of the two above (expert_owner only). */
int exec_check_placement(const exec_session *s, bool has_epoch, const uint32_t *owner,
                         size_t n_owner, const uint32_t *members, size_t n_members, ep_err *err);
void exec_set_placement(exec_session *s, const uint32_t *owner, const uint32_t *members,
                        size_t n_members);

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
