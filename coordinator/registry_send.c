/*
 * registry_send.c — what the coordinator tells the workers through the registry (see
 * registry.h): WELCOME with the cluster's world and placement, EPOCH (current or staged),
 * EPOCH_COMMIT, HEARTBEAT and SHUTDOWN; each queued in the ob_box for coord.c to send.
 */
#include "coordinator/registry.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/model_msg.h"
#include "coordinator/registry_internal.h"

/* The placement as EPOCH and WELCOME carry it: owner [E] when flat, else a Placement; and the
 * members, ascending. */
typedef struct reg_tables {
    uint32_t *owner;
    bool flat;
    Epmoe__Placement placement;
    pl_wire wire;
    uint32_t *members;
    size_t n_members;
} reg_tables;

void reg_send(ob_box *out, reg_worker *w, uint16_t type, const ProtobufCMessage *body)
{
    ob_send(out, OB_TO_WORKER_ID, w->spec->rank, w->ident, w->ident_len, type, body, NULL, 0);
}

static int reg_tables_fill(const plan_table *p, reg_tables *t)
{
    ep_err err;
    memset(t, 0, sizeof *t);
    t->owner = malloc((size_t)p->n_experts * sizeof *t->owner);
    t->members = malloc((size_t)p->n_ranks * sizeof *t->members);
    if (t->owner == NULL || t->members == NULL ||
        mmsg_placement_out(p->pl, t->owner, &t->flat, &t->placement, &t->wire, &err) != 0)
        return -1;
    for (int r = 0; r < p->n_ranks; r++)
        if (p->member[r])
            t->members[t->n_members++] = (uint32_t)r;
    return 0;
}

static void reg_tables_free(reg_tables *t)
{
    free(t->owner);
    free(t->members);
    pl_wire_free(&t->wire);
}

void reg_send_welcome(reg_registry *r, const reg_env *env, reg_worker *w, ob_box *out)
{
    const spec_worker *sw = w->spec;
    const plan_table *p = env->plan;
    reg_tables tb;
    if (reg_tables_fill(p, &tb) != 0) {
        reg_tables_free(&tb);
        log_error("worker %s: out of memory for WELCOME", sw->name);
        return;
    }
    Epmoe__ModelConfig mc;
    mmsg_from_config(env->cfg, &mc);
    Epmoe__Welcome m = EPMOE__WELCOME__INIT;
    m.cluster = (char *)env->spec->name;
    m.has_rank = 1;
    m.rank = (uint32_t)sw->rank;
    m.has_world_size = 1;
    m.world_size = (uint32_t)r->n;
    m.has_epoch = 1;
    m.epoch = p->epoch;
    m.config = &mc;
    m.has_config_hash = 1;
    m.config_hash = env->config_hash;
    m.model_path = (char *)env->spec->model_path;
    m.n_expert_owner = tb.flat ? (size_t)p->n_experts : 0;
    m.expert_owner = tb.owner;
    m.placement = tb.flat ? NULL : &tb.placement;
    m.n_members = tb.n_members;
    m.members = tb.members;
    m.metrics = sw->metrics[0] ? (char *)sw->metrics : NULL;
    m.n_peers = (size_t)r->n;
    m.peers = r->peer_ps;
    m.has_dispatch = 1;
    m.dispatch = env->spec->dispatch == SPEC_DISPATCH_BF16 ? EPMOE__DISPATCH_FORMAT__DISPATCH_BF16
                                                           : EPMOE__DISPATCH_FORMAT__DISPATCH_FP8;
    m.has_heartbeat_ms = 1;
    m.heartbeat_ms = (uint32_t)env->spec->heartbeat_ms;
    m.has_liveness = 1;
    m.liveness = (uint32_t)env->spec->liveness;
    m.has_step_timeout_ms = 1;
    m.step_timeout_ms = (uint32_t)env->spec->step_timeout_ms;
    m.data_endpoint = (char *)sw->data;
    m.client_endpoint = sw->client[0] ? (char *)sw->client : NULL;
    m.n_client_keys = env->n_client_keys;
    m.client_keys = (ProtobufCBinaryData *)env->client_keys;
    m.device = (char *)sw->device;
    m.has_data_plane = 1;
    m.data_plane = env->spec->data_plane == SPEC_PLANE_NCCL ? EPMOE__DATA_PLANE__DATA_PLANE_NCCL
                                                            : EPMOE__DATA_PLANE__DATA_PLANE_ZMQ;
    m.has_gpu_gemm = 1;
    m.gpu_gemm = env->spec->gpu_gemm == SPEC_GPU_GEMM_FAST ? EPMOE__GPU_GEMM__GPU_GEMM_FAST
                                                           : EPMOE__GPU_GEMM__GPU_GEMM_EXACT;
    m.has_session = 1;
    m.session = env->session;
    m.n_checkpoint = env->n_checkpoint;
    m.checkpoint = env->checkpoint;
    for (int i = 0; i < r->n; i++) { /* each peer's key, so the data plane can be CURVE */
        r->peers[i].has_public_key = env->worker_key != NULL;
        r->peers[i].public_key.len = env->worker_key ? AUTH_KEY_BYTES : 0;
        r->peers[i].public_key.data = env->worker_key ? (uint8_t *)env->worker_key[i] : NULL;
    }
    reg_send(out, w, EPMOE__MSG_TYPE__MSG_WELCOME, &m.base);
    reg_tables_free(&tb);
    w->state = REG_WELCOMED;
    w->epoch = p->epoch;
}

/* The worker was told epoch (EPOCH, EPOCH_COMMIT): loading until its READY. */
static void reg_to_loading(reg_worker *w, uint64_t epoch)
{
    w->state = REG_LOADING;
    w->epoch = epoch;
    w->staged = 0;
    w->prepared = false;
    w->bytes_done = w->bytes_total = 0;
}

/* EPOCH {env->plan} to one worker. */
static void reg_epoch_msg(const plan_table *p, reg_tables *tb, const char *reason, bool staged,
                          Epmoe__Epoch *m)
{
    epmoe__epoch__init(m);
    m->has_epoch = 1;
    m->epoch = p->epoch;
    m->n_expert_owner = tb->flat ? (size_t)p->n_experts : 0;
    m->expert_owner = tb->owner;
    m->placement = tb->flat ? NULL : &tb->placement;
    m->n_members = tb->n_members;
    m->members = tb->members;
    m->reason = (char *)reason;
    m->has_staged = staged;
    m->staged = staged;
}

void reg_send_epoch(reg_registry *r, const reg_env *env, const char *reason, ob_box *out)
{
    const plan_table *p = env->plan;
    reg_tables tb;
    if (reg_tables_fill(p, &tb) != 0) {
        reg_tables_free(&tb);
        log_error("out of memory for EPOCH %" PRIu64, p->epoch);
        return;
    }
    Epmoe__Epoch m;
    reg_epoch_msg(p, &tb, reason, false, &m);
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        /* a worker whose load failed is sent a placement only when it still owns experts in
         * it (it retries); otherwise it stays load-failed, not eligible, until it registers
         * again or an operator drains it */
        bool retry = w->state == REG_LOAD_FAILED && plan_is_member(p, i);
        if (w->state != REG_LOADING && w->state != REG_READY && !retry)
            continue;
        reg_send(out, w, EPMOE__MSG_TYPE__MSG_EPOCH, &m.base);
        reg_to_loading(w, p->epoch);
    }
    reg_tables_free(&tb);
}

int reg_send_staged(reg_registry *r, const reg_env *env, const plan_table *t, const char *reason,
                    ob_box *out)
{
    reg_tables tb;
    if (reg_tables_fill(t, &tb) != 0) {
        reg_tables_free(&tb);
        log_error("out of memory for staged EPOCH %" PRIu64, t->epoch);
        return -1;
    }
    Epmoe__Epoch m;
    reg_epoch_msg(t, &tb, reason, true, &m);
    int n = 0;
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        if (w->state != REG_READY) /* a staged epoch is only started on a ready cluster */
            continue;
        reg_send(out, w, EPMOE__MSG_TYPE__MSG_EPOCH, &m.base);
        w->staged = t->epoch;
        w->prepared = false;
        n++;
    }
    reg_tables_free(&tb);
    return n;
}

void reg_send_commit(reg_registry *r, const reg_env *env, ob_box *out)
{
    const plan_table *p = env->plan;
    Epmoe__EpochCommit m = EPMOE__EPOCH_COMMIT__INIT;
    m.has_epoch = 1;
    m.epoch = p->epoch;
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        if (w->staged != p->epoch || !reg_registered(w))
            continue;
        reg_send(out, w, EPMOE__MSG_TYPE__MSG_EPOCH_COMMIT, &m.base);
        reg_to_loading(w, p->epoch);
    }
}

void reg_tick(reg_registry *r, const reg_env *env, ob_box *out)
{
    int64_t expiry = (int64_t)env->spec->heartbeat_ms * env->spec->liveness;
    Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
    hb.has_epoch = 1;
    hb.epoch = env->plan->epoch;
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        if (!reg_registered(w))
            continue;
        int64_t silent = env->now_ms - w->last_seen_ms;
        if (silent > expiry) {
            char why[160];
            snprintf(why, sizeof why, "silent for %" PRId64 " ms (liveness %d x heartbeat %d ms)",
                     silent, env->spec->liveness, env->spec->heartbeat_ms);
            reg_declare_dead(r, i, why, out);
            continue;
        }
        reg_send(out, w, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base);
    }
}

void reg_shutdown(reg_registry *r, const char *reason, ob_box *out)
{
    Epmoe__Shutdown s = EPMOE__SHUTDOWN__INIT;
    s.reason = (char *)reason;
    for (int i = 0; i < r->n; i++)
        if (reg_registered(&r->w[i]))
            reg_send(out, &r->w[i], EPMOE__MSG_TYPE__MSG_SHUTDOWN, &s.base);
}

void reg_rewelcome(reg_registry *r, const reg_env *env, ob_box *out)
{
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        if (!reg_registered(w) || w->hash_refused)
            continue;
        w->bytes_done = w->bytes_total = 0;
        reg_send_welcome(r, env, w, out);
    }
}

void reg_send_client_keys(reg_registry *r, const reg_env *env, ob_box *out)
{
    Epmoe__ClientKeys m = EPMOE__CLIENT_KEYS__INIT;
    m.n_client_keys = env->n_client_keys;
    m.client_keys = (ProtobufCBinaryData *)env->client_keys;
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        /* after its WELCOME on the same connection (which may hold the old list) */
        if (reg_registered(w))
            reg_send(out, w, EPMOE__MSG_TYPE__MSG_CLIENT_KEYS, &m.base);
    }
}
