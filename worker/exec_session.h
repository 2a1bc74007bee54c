/*
 * exec_session.h — the session an executor works under (prefix exec_, exec_session.c): the
 * validated WELCOME (built by worker/welcome.c), its placements, and what a STEP must carry to
 * run under it. The executor (exec.h) takes one over its pipe; the serving path reads it.
 */
#ifndef EPMOE_EXEC_SESSION_H
#define EPMOE_EXEC_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"
#include "common/limits.h"
#include "common/model_config.h"
#include "common/placement.h"
#include "common/safetensors_model.h"
#include "common/wire.h"
#include "epmoe.pb-c.h"
#include "kernels/moe_backend.h"
#include "worker/transport.h"

/* The least progress timeout of the serving path (exec_session.progress_ms). */
#define EXEC_MIN_PROGRESS_MS 1000
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
    int progress_ms;  /* heartbeat_ms x liveness, at least EXEC_MIN_PROGRESS_MS (serve.h) */
    uint64_t session; /* WELCOME.session: STEP and the data plane carry it */
    uint8_t (*peer_key)[AUTH_KEY_BYTES]; /* [world_size] with security, else NULL */
    st_file_print *checkpoint;           /* the coordinator's fingerprint (n_checkpoint files) */
    int n_checkpoint;
} exec_session;

/* An empty session with its tables allocated (E experts, P ranks); NULL when out of memory. */
exec_session *exec_session_new(int n_experts, int world_size);
void exec_session_free(exec_session **self_p);
/* A copy of s (its peers and config) for a staged epoch; NULL when out of memory. */
exec_session *exec_session_dup(const exec_session *s);

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

/* Check a STEP against a session before anything is allocated (what a STEP_FAILED
 * {ERR_BAD_REQUEST} says): step_id, session, epoch and layer present; the session's id and
 * epoch; a step id above last_step (when have_last); layer < n_layers; n_tokens <=
 * EP_MAX_TOKENS; the payloads' count and sizes (hidden bf16 [T, H], ids int64 [T] when has_ids);
 * ids on a hash layer; finite hidden states. Pure: the executor and fuzz_step call it. */
int exec_step_check(const exec_session *s, int n_layers, bool have_last, uint64_t last_step,
                    const Epmoe__Step *req, const wire_msg *m, ep_err *err);

#endif
