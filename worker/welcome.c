/*
 * welcome.c — WELCOME validation (welcome.h: wctl_welcome_parse): the session a worker will
 * work under, checked field by field before anything of it is used.
 */
#include "worker/welcome.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/limits.h"
#include "common/model_msg.h"
#include "common/wire.h"

/* ---- WELCOME validation -----------------------------------------------------------------------
 */

static int wctl_check_peer_key(const Epmoe__Peer *p, exec_session *s, ep_err *err)
{
    if (!p->has_public_key || p->public_key.len != AUTH_KEY_BYTES)
        return ep_err_set(err,
                          "WELCOME: peer rank %u has no 32-byte public_key, but this worker uses "
                          "security (--key): is the cluster spec's security: section missing?",
                          p->rank);
    memcpy(s->peer_key[p->rank], p->public_key.data, AUTH_KEY_BYTES);
    return 0;
}

static int wctl_check_peers(const Epmoe__Welcome *w, bool secure, exec_session *s, ep_err *err)
{
    if (secure && (s->peer_key = calloc(w->n_peers ? w->n_peers : 1, sizeof *s->peer_key)) == NULL)
        return ep_err_set(err, "out of memory");
    if (w->n_peers != w->world_size)
        return ep_err_set(err, "WELCOME: %zu peers, expected one per rank (world_size %u)",
                          w->n_peers, w->world_size);
    for (size_t i = 0; i < w->n_peers; i++) {
        const Epmoe__Peer *p = w->peers[i];
        if (!p->has_rank || p->rank >= w->world_size)
            return ep_err_set(err, "WELCOME: peers[%zu].rank missing or not below world_size %u", i,
                              w->world_size);
        if (s->peer_endpoint[p->rank] != NULL)
            return ep_err_set(err, "WELCOME: rank %u appears twice in peers", p->rank);
        if (p->data_endpoint == NULL || p->data_endpoint[0] == '\0' ||
            strlen(p->data_endpoint) >= EP_MAX_PATH)
            return ep_err_set(err, "WELCOME: peers[%zu] (rank %u) has no usable data_endpoint", i,
                              p->rank);
        char fallback[32];
        snprintf(fallback, sizeof fallback, "rank%u", p->rank);
        const char *name =
            p->name && p->name[0] && strlen(p->name) < EP_MAX_NAME ? p->name : fallback;
        s->peer_endpoint[p->rank] = strdup(p->data_endpoint);
        s->peer_name[p->rank] = strdup(name);
        if (!s->peer_endpoint[p->rank] || !s->peer_name[p->rank])
            return ep_err_set(err, "out of memory");
        if (secure && wctl_check_peer_key(p, s, err) != 0)
            return -1;
    }
    return 0; /* n_peers == world_size and no rank twice: every rank is covered */
}

static int wctl_check_strings(const Epmoe__Welcome *w, exec_session *s, ep_err *err)
{
    if (w->model_path == NULL || w->model_path[0] == '\0' ||
        strlen(w->model_path) >= sizeof s->model_path)
        return ep_err_set(err, "WELCOME: model_path missing or longer than %d bytes", EP_MAX_PATH);
    if (w->data_endpoint == NULL || w->data_endpoint[0] == '\0' ||
        strlen(w->data_endpoint) >= sizeof s->data_endpoint)
        return ep_err_set(err, "WELCOME: data_endpoint missing or longer than %d bytes",
                          EP_MAX_PATH);
    if (w->client_endpoint != NULL && strlen(w->client_endpoint) >= sizeof s->client_endpoint)
        return ep_err_set(err, "WELCOME: client_endpoint longer than %d bytes", EP_MAX_PATH);
    snprintf(s->model_path, sizeof s->model_path, "%s", w->model_path);
    snprintf(s->data_endpoint, sizeof s->data_endpoint, "%s", w->data_endpoint);
    snprintf(s->client_endpoint, sizeof s->client_endpoint, "%s",
             w->client_endpoint ? w->client_endpoint : "");
    return 0;
}

/* The coordinator's checkpoint fingerprint. */
static int wctl_check_checkpoint(const Epmoe__Welcome *w, exec_session *s, ep_err *err)
{
    if (w->n_checkpoint > ST_MAX_SHARDS)
        return ep_err_set(err, "WELCOME: %zu checkpoint files, at most %d", w->n_checkpoint,
                          ST_MAX_SHARDS);
    if (w->n_checkpoint == 0)
        return 0;
    s->checkpoint = calloc(w->n_checkpoint, sizeof *s->checkpoint);
    if (s->checkpoint == NULL)
        return ep_err_set(err, "out of memory");
    for (size_t i = 0; i < w->n_checkpoint; i++) {
        const Epmoe__CheckpointFile *f = w->checkpoint[i];
        if (f->name == NULL || f->name[0] == '\0' || strlen(f->name) >= EP_MAX_NAME ||
            !f->has_size || !f->has_mtime_ns || !f->has_header_hash)
            return ep_err_set(err,
                              "WELCOME: checkpoint[%zu] needs a name (< %d bytes), size, "
                              "mtime_ns and header_hash",
                              i, EP_MAX_NAME);
        st_file_print *p = &s->checkpoint[i];
        snprintf(p->name, sizeof p->name, "%s", f->name);
        p->size = f->size;
        p->mtime_ns = f->mtime_ns;
        p->header_hash = f->header_hash;
    }
    s->n_checkpoint = (int)w->n_checkpoint;
    return 0;
}

static int wctl_check_scalars(const Epmoe__Welcome *w, ep_err *err)
{
    if (!w->has_rank || !w->has_world_size || !w->has_epoch || !w->has_config_hash ||
        w->config == NULL || !w->has_heartbeat_ms || !w->has_liveness || !w->has_session)
        return ep_err_set(err, "WELCOME: rank, world_size, epoch, config, config_hash, "
                               "heartbeat_ms, liveness and session are required");
    if (w->world_size < 1 || w->world_size > EP_MAX_WORKERS)
        return ep_err_set(err, "WELCOME: world_size %u, expected 1..%d", w->world_size,
                          EP_MAX_WORKERS);
    if (w->rank >= w->world_size)
        return ep_err_set(err, "WELCOME: rank %u, expected < world_size %u", w->rank,
                          w->world_size);
    if (w->heartbeat_ms < WCTL_MIN_HEARTBEAT_MS || w->heartbeat_ms > WCTL_MAX_HEARTBEAT_MS)
        return ep_err_set(err, "WELCOME: heartbeat_ms %u, expected %d..%d", w->heartbeat_ms,
                          WCTL_MIN_HEARTBEAT_MS, WCTL_MAX_HEARTBEAT_MS);
    if (w->liveness < 1 || w->liveness > WCTL_MAX_LIVENESS)
        return ep_err_set(err, "WELCOME: liveness %u, expected 1..%d", w->liveness,
                          WCTL_MAX_LIVENESS);
    if (w->has_dispatch && w->dispatch != EPMOE__DISPATCH_FORMAT__DISPATCH_FP8 &&
        w->dispatch != EPMOE__DISPATCH_FORMAT__DISPATCH_BF16)
        return ep_err_set(err, "WELCOME: dispatch %d, expected DISPATCH_FP8 or DISPATCH_BF16",
                          (int)w->dispatch);
    if (w->has_gpu_gemm && w->gpu_gemm != EPMOE__GPU_GEMM__GPU_GEMM_EXACT &&
        w->gpu_gemm != EPMOE__GPU_GEMM__GPU_GEMM_FAST)
        return ep_err_set(err, "WELCOME: gpu_gemm %d, expected GPU_GEMM_EXACT or GPU_GEMM_FAST",
                          (int)w->gpu_gemm);
    if (w->has_step_timeout_ms && w->step_timeout_ms == 0)
        return ep_err_set(err, "WELCOME: step_timeout_ms 0, expected > 0");
    if (w->has_data_plane && w->data_plane != EPMOE__DATA_PLANE__DATA_PLANE_ZMQ &&
        w->data_plane != EPMOE__DATA_PLANE__DATA_PLANE_NCCL)
        return ep_err_set(err, "WELCOME: data_plane %d, expected DATA_PLANE_ZMQ or DATA_PLANE_NCCL",
                          (int)w->data_plane);
    return 0;
}

exec_session *wctl_welcome_parse(const Epmoe__Welcome *w, bool secure, ep_err *err)
{
    mc_config c;
    if (wctl_check_scalars(w, err) != 0)
        return NULL;
    if (mmsg_to_config(w->config, &c, err) != 0) {
        ep_err_prefix(err, "WELCOME: config");
        return NULL;
    }
    exec_session *s = exec_session_new(c.n_routed_experts, (int)w->world_size);
    if (s == NULL) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    s->config = c;
    pl_table *t = exec_parse_placement(s, true, w->expert_owner, w->n_expert_owner, w->placement,
                                       w->members, w->n_members, err);
    if (t == NULL) {
        ep_err_prefix(err, "WELCOME");
        exec_session_free(&s);
        return NULL;
    }
    if (wctl_check_peers(w, secure, s, err) != 0 || wctl_check_strings(w, s, err) != 0 ||
        wctl_check_checkpoint(w, s, err) != 0) {
        pl_free(&t);
        exec_session_free(&s);
        return NULL;
    }
    s->config_hash = mc_hash(&c);
    s->rank = (int)w->rank;
    s->epoch = w->epoch;
    s->session = w->session;
    exec_adopt_placement(s, &t, w->members, w->n_members);
    s->dispatch = w->has_dispatch ? (tp_format)w->dispatch : TP_FMT_FP8;
    s->gpu_gemm = w->has_gpu_gemm && w->gpu_gemm == EPMOE__GPU_GEMM__GPU_GEMM_FAST ? MB_GEMM_FAST
                                                                                   : MB_GEMM_EXACT;
    s->nccl = w->has_data_plane && w->data_plane == EPMOE__DATA_PLANE__DATA_PLANE_NCCL;
    s->step_timeout_ms =
        w->has_step_timeout_ms
            ? (int)(w->step_timeout_ms > 86400000u ? 86400000u : w->step_timeout_ms)
            : EXEC_DEFAULT_STEP_TIMEOUT_MS;
    /* the coordinator's own liveness window: a worker it would declare dead after this much
     * silence on the control plane is suspect after as much silence on the data plane; at
     * least EXEC_MIN_PROGRESS_MS, so that a busy peer of a test cluster with a tiny heartbeat
     * is not taken for a cut one */
    s->progress_ms = (int)(w->heartbeat_ms * w->liveness);
    if (s->progress_ms < EXEC_MIN_PROGRESS_MS)
        s->progress_ms = EXEC_MIN_PROGRESS_MS;
    return s;
}
