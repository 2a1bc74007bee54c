/*
 * registry.c — worker lifecycle and liveness (see registry.h). mdbroker's worker_t with an
 * expiry per worker, plus the config handshake of docs/protocol.md.
 */
#include "coordinator/registry.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/model_msg.h"

struct reg_registry {
    int n;
    reg_worker *w; /* [n], index == rank */
    /* WELCOME's peer table, the same for every worker */
    Epmoe__Peer *peers;    /* [n] */
    Epmoe__Peer **peer_ps; /* [n] */
};

reg_registry *reg_create(const spec_cluster *spec, ep_err *err)
{
    reg_registry *r = calloc(1, sizeof *r);
    if (r == NULL)
        goto fail_alloc;
    r->n = spec->n_workers;
    r->w = calloc((size_t)r->n, sizeof *r->w);
    r->peers = calloc((size_t)r->n, sizeof *r->peers);
    r->peer_ps = calloc((size_t)r->n, sizeof *r->peer_ps);
    if (r->w == NULL || r->peers == NULL || r->peer_ps == NULL)
        goto fail_alloc;
    for (int i = 0; i < r->n; i++) {
        const spec_worker *sw = &spec->workers[i];
        r->w[i].spec = sw;
        epmoe__peer__init(&r->peers[i]);
        r->peers[i].has_rank = 1;
        r->peers[i].rank = (uint32_t)sw->rank;
        r->peers[i].name = (char *)sw->name;
        r->peers[i].data_endpoint = (char *)sw->data;
        r->peer_ps[i] = &r->peers[i];
    }
    return r;
fail_alloc:
    reg_destroy(&r);
    ep_err_set(err, "registry: out of memory");
    return NULL;
}

void reg_destroy(reg_registry **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    reg_registry *r = *self_p;
    free(r->w);
    free(r->peers);
    free(r->peer_ps);
    free(r);
    *self_p = NULL;
}

int reg_size(const reg_registry *r)
{
    return r->n;
}

reg_worker *reg_worker_at(reg_registry *r, int rank)
{
    return rank >= 0 && rank < r->n ? &r->w[rank] : NULL;
}

reg_worker *reg_find_ident(reg_registry *r, const uint8_t *ident, size_t len)
{
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        if (w->state != REG_ABSENT && w->ident_len == len && memcmp(w->ident, ident, len) == 0)
            return w;
    }
    return NULL;
}

const char *reg_state_name(reg_state s)
{
    switch (s) {
    case REG_ABSENT:
        return "absent";
    case REG_WELCOMED:
        return "welcomed";
    case REG_LOADING:
        return "loading";
    case REG_LOAD_FAILED:
        return "load-failed";
    case REG_READY:
        return "ready";
    case REG_DEAD:
        return "dead";
    }
    return "?";
}

bool reg_registered(const reg_worker *w)
{
    return w->state != REG_ABSENT && w->state != REG_DEAD;
}

bool reg_can_own(const reg_registry *r, int rank)
{
    if (rank < 0 || rank >= r->n)
        return false;
    const reg_worker *w = &r->w[rank];
    return (w->state == REG_WELCOMED && !w->hash_refused) || w->state == REG_LOADING ||
           w->state == REG_READY;
}

bool reg_ready_in(const reg_registry *r, int rank, uint64_t epoch)
{
    return rank >= 0 && rank < r->n && r->w[rank].state == REG_READY && r->w[rank].acked == epoch;
}

void reg_counts(const reg_registry *r, int *n_missing, int *n_not_ready)
{
    int missing = 0, not_ready = 0;
    for (int i = 0; i < r->n; i++) {
        if (!reg_registered(&r->w[i]))
            missing++;
        if (r->w[i].state != REG_READY)
            not_ready++;
    }
    *n_missing = missing;
    *n_not_ready = not_ready;
}

static int reg_progress_pct(const reg_worker *w)
{
    if (w->bytes_total == 0)
        return 0;
    uint64_t done = w->bytes_done < w->bytes_total ? w->bytes_done : w->bytes_total;
    return (int)(done * 100 / w->bytes_total);
}

void reg_not_ready_text(const reg_registry *r, char *buf, size_t cap)
{
    size_t len = 0;
    int shown = 0, total = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->n; i++) {
        const reg_worker *w = &r->w[i];
        if (w->state == REG_READY)
            continue;
        total++;
        if (shown == 16 || len + 80 > cap)
            continue;
        int k = w->state == REG_LOADING
                    ? snprintf(buf + len, cap - len, "%s%s (loading %d%%, %.2f GB/s)",
                               shown ? ", " : "", w->spec->name, reg_progress_pct(w),
                               w->load_ms ? (double)w->load_read / w->load_ms / 1e6 : 0.0)
                    : snprintf(buf + len, cap - len, "%s%s (%s)", shown ? ", " : "", w->spec->name,
                               reg_state_name(w->state));
        if (k > 0 && (size_t)k < cap - len)
            len += (size_t)k;
        shown++;
    }
    if (total > shown && len + 32 < cap)
        snprintf(buf + len, cap - len, ", ... (%d in all)", total);
}

void reg_set_error(reg_worker *w, const char *fmt, ...)
{
    EP_FORMAT_ARGS(w->error, sizeof w->error, fmt);
}

/* ---- sending ---- */

static void reg_send(ob_box *out, reg_worker *w, uint16_t type, const ProtobufCMessage *body)
{
    ob_send(out, OB_TO_WORKER_ID, w->spec->rank, w->ident, w->ident_len, type, body, NULL, 0);
}

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

static void reg_send_welcome(reg_registry *r, const reg_env *env, reg_worker *w, ob_box *out)
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

bool reg_prepared(const reg_registry *r, int rank, uint64_t epoch)
{
    return rank >= 0 && rank < r->n && r->w[rank].state == REG_READY &&
           r->w[rank].staged == epoch && r->w[rank].prepared;
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

void reg_unstage(reg_registry *r)
{
    for (int i = 0; i < r->n; i++) {
        r->w[i].staged = 0;
        r->w[i].prepared = false;
    }
}

/* Keep REGISTER's device description (strings copied, bounded). */
static void reg_keep_device(reg_worker *w, const Epmoe__DeviceInfo *d)
{
    epmoe__device_info__init(&w->device);
    w->has_device = d != NULL;
    if (d == NULL)
        return;
    snprintf(w->dev_name, sizeof w->dev_name, "%s", d->name ? d->name : "");
    snprintf(w->dev_backend, sizeof w->dev_backend, "%s", d->backend ? d->backend : "");
    w->device.name = w->dev_name;
    w->device.backend = w->dev_backend;
    w->device.has_memory_total = d->has_memory_total;
    w->device.memory_total = d->memory_total;
    w->device.has_memory_free = d->has_memory_free;
    w->device.memory_free = d->memory_free;
    w->device.has_sm_major = d->has_sm_major;
    w->device.sm_major = d->sm_major;
    w->device.has_sm_minor = d->has_sm_minor;
    w->device.sm_minor = d->sm_minor;
}

static void reg_error(const wire_msg *m, ob_box *out, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Error to the sender of m, also logged (these are worker bugs or misconfigurations). */
static void reg_error(const wire_msg *m, ob_box *out, Epmoe__ErrorCode code, const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    log_warn("worker socket: %s", err.msg);
    ob_reply_error(out, OB_TO_WORKER_ID, -1, m->ident, m->ident_len, &err, m->type);
}

/* ---- lifecycle ---- */

void reg_declare_dead(reg_registry *r, int rank, const char *why, ob_box *out)
{
    reg_worker *w = reg_worker_at(r, rank);
    if (w == NULL || !reg_registered(w))
        return;
    log_info("worker %s (rank %d) is dead: %s", w->spec->name, rank, why);
    reg_set_error(w, "dead: %s", why);
    w->state = REG_DEAD;
    ob_event_add(out, OB_EV_LOST, rank, "%s", why);
}

void reg_unreachable(reg_registry *r, int rank, const char *err, ob_box *out)
{
    char why[EP_ERR_MSG_MAX];
    snprintf(why, sizeof why, "its connection is gone (%s)", err);
    reg_declare_dead(r, rank, why, out);
}

/* The list of spec workers for the unknown-worker message, cut to fit. */
static void reg_names_text(const spec_cluster *spec, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < spec->n_workers; i++) {
        const char *name = spec->workers[i].name;
        if (len + strlen(name) + 24 > cap || i == 32) {
            snprintf(buf + len, cap - len, ", ... (%d in all)", spec->n_workers);
            return;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", name);
    }
}

static int reg_name_ok(const char *name)
{
    size_t n = strnlen(name, SPEC_NAME_MAX + 1);
    return n > 0 && n <= SPEC_NAME_MAX;
}

/* The length of the part of routing id a that names its process, up to its last '/', when a
 * has epmoe-worker's form NAME/random/N (two '/' at least); 0 for any other routing id. */
static size_t reg_process_len(const uint8_t *a, size_t n)
{
    size_t slash = n;
    while (slash > 0 && a[slash - 1] != '/')
        slash--;
    if (slash < 2 || memchr(a, '/', slash - 1) == NULL)
        return 0;
    return slash - 1;
}

/* Whether two routing ids are connections of one process: the same NAME/random part, or (any
 * other form: one process per routing id) the same routing id. */
static bool reg_same_process(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    size_t ap = reg_process_len(a, an), bp = reg_process_len(b, bn);
    if (ap == 0 || bp == 0)
        return an == bn && memcmp(a, b, an) == 0;
    return ap == bp && memcmp(a, b, ap) == 0;
}

/* Whether w's registration has an open connection of another process than m's. */
static bool reg_held_elsewhere(const reg_env *env, const reg_worker *w, const wire_msg *m)
{
    if (!reg_registered(w) || reg_same_process(w->ident, w->ident_len, m->ident, m->ident_len))
        return false;
    if (env->connected != NULL)
        return env->connected(env->connected_ctx, w->ident, w->ident_len);
    int64_t expiry = (int64_t)env->spec->heartbeat_ms * env->spec->liveness;
    return env->now_ms - w->last_seen_ms < expiry;
}

/* The name REGISTER claims, checked for form; NULL after answering why not. */
static const char *reg_register_name(const wire_msg *m, const Epmoe__Register *rq, ob_box *out)
{
    if (rq->name == NULL || rq->name[0] == '\0') {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "REGISTER without a worker name (1..%d characters)", SPEC_NAME_MAX);
        return NULL;
    }
    if (!reg_name_ok(rq->name)) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "REGISTER with a worker name of %zu bytes (\"%.32s...\"); names have at most %d",
                  strlen(rq->name), rq->name, SPEC_NAME_MAX);
        return NULL;
    }
    return rq->name;
}

/* The spec worker a REGISTER claims, or NULL after answering why not. */
static const spec_worker *reg_check_register(reg_registry *r, const reg_env *env, const wire_msg *m,
                                             const Epmoe__Register *rq, ob_box *out)
{
    const spec_cluster *spec = env->spec;
    const char *name = reg_register_name(m, rq, out);
    if (name == NULL)
        return NULL;
    const spec_worker *sw = spec_find_worker(spec, name);
    if (sw == NULL) {
        char names[600];
        reg_names_text(spec, names, sizeof names);
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_UNKNOWN_WORKER,
                  "worker \"%s\" is not in cluster spec %s (workers: %s)", name, spec->file, names);
        return NULL;
    }
    const char *uid = wire_user_id(m);
    if (env->worker_key != NULL && (uid == NULL || strcmp(uid, sw->name) != 0)) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_REFUSED,
                  "this connection's key is worker %s's, and a key registers its own worker "
                  "only: it may not register as %s",
                  uid ? uid : "(none)", sw->name);
        return NULL;
    }
    if (rq->device != NULL && rq->device[0] != '\0' && strcmp(rq->device, sw->device) != 0) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_REFUSED,
                  "worker %s registered with device \"%.32s\" but cluster spec %s:%d:%d assigns "
                  "\"%s\"; start it with --device %s (or change the spec)",
                  sw->name, rq->device, spec->file, sw->device_pos.line, sw->device_pos.col,
                  sw->device, sw->device);
        return NULL;
    }
    reg_worker *w = &r->w[sw->rank];
    if (reg_held_elsewhere(env, w, m)) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_DUPLICATE,
                  "worker %s is registered from another connection that is still open (pid %u "
                  "on %s): two processes run under one name; stop one of them",
                  sw->name, (unsigned)w->pid, w->hostname[0] ? w->hostname : "?");
        return NULL;
    }
    return sw;
}

static void reg_client_endpoint_is(reg_worker *w, const char *ep, const char *what);

void reg_on_register(reg_registry *r, const reg_env *env, const wire_msg *m, ob_box *out)
{
    ep_err err;
    Epmoe__Register *rq = (Epmoe__Register *)wire_unpack(&epmoe__register__descriptor, m, &err);
    if (rq == NULL) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    const spec_worker *sw = reg_check_register(r, env, m, rq, out);
    if (sw == NULL)
        goto done;
    reg_worker *w = &r->w[sw->rank];
    /* A connection that registered before under another name gives that name up. */
    reg_worker *other = reg_find_ident(r, m->ident, m->ident_len);
    if (other != NULL && other != w && reg_registered(other))
        reg_declare_dead(r, other->spec->rank, "its connection registered again under another name",
                         out);
    bool restart = reg_registered(w);
    w->state = REG_WELCOMED;
    memcpy(w->ident, m->ident, m->ident_len);
    w->ident_len = m->ident_len;
    w->last_seen_ms = env->now_ms;
    w->bytes_done = w->bytes_total = 0;
    w->n_experts = 0;
    w->acked = 0;
    w->bytes_read = 0;
    w->slots_read = 0;
    w->staged = 0;
    w->prepared = false;
    w->hash_refused = false;
    w->pid = rq->has_pid ? rq->pid : 0;
    snprintf(w->hostname, sizeof w->hostname, "%s", rq->hostname ? rq->hostname : "");
    reg_client_endpoint_is(w, rq->client_endpoint, "REGISTER");
    snprintf(w->version, sizeof w->version, "%s", rq->version ? rq->version : "");
    w->backend[0] = '\0';
    w->error[0] = '\0';
    reg_keep_device(w, rq->device_info);
    log_info("worker %s (rank %d) %s from %s pid %u", sw->name, sw->rank,
             restart ? "registered again (restart; its step in flight is lost)" : "registered",
             w->hostname[0] ? w->hostname : "?", (unsigned)w->pid);
    reg_send_welcome(r, env, w, out);
    if (restart)
        ob_event_add(out, OB_EV_LOST, sw->rank, "the worker registered again (restarted)");
done:
    wire_free_unpacked(&rq->base);
}

static void reg_on_config_ack(reg_registry *r, const reg_env *env, reg_worker *w, const wire_msg *m,
                              ob_box *out)
{
    ep_err err;
    Epmoe__ConfigAck *a = (Epmoe__ConfigAck *)wire_unpack(&epmoe__config_ack__descriptor, m, &err);
    if (a == NULL) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    uint64_t epoch = env->plan->epoch;
    if (w->state != REG_WELCOMED) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: CONFIG_ACK in state %s (expected once, after WELCOME)", w->spec->name,
                  reg_state_name(w->state));
    } else if (!a->has_config_hash) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: CONFIG_ACK without config_hash", w->spec->name);
    } else if (a->has_epoch && a->epoch != w->epoch) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: CONFIG_ACK for epoch %" PRIu64
                  ", it was welcomed into epoch %" PRIu64,
                  w->spec->name, a->epoch, w->epoch);
    } else if (w->epoch != epoch && a->config_hash == env->config_hash) {
        /* the placement changed since the WELCOME: welcome it into the latest one */
        log_debug(LOG_SUB_NET, "worker %s: welcomed into epoch %" PRIu64 ", now %" PRIu64,
                  w->spec->name, w->epoch, epoch);
        reg_send_welcome(r, env, w, out);
    } else if (a->config_hash != env->config_hash) {
        reg_set_error(w,
                      "config hash mismatch: the worker computed 0x%016" PRIx64
                      ", the coordinator 0x%016" PRIx64,
                      a->config_hash, env->config_hash);
        w->hash_refused = true;
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_CONFIG_HASH,
                  "worker %s: config hash 0x%016" PRIx64
                  " differs from the coordinator's 0x%016" PRIx64
                  " (the worker rebuilt another config from WELCOME: different epmoe versions?); "
                  "it gets no work",
                  w->spec->name, a->config_hash, env->config_hash);
    } else {
        Epmoe__Load l = EPMOE__LOAD__INIT;
        l.has_epoch = 1;
        l.epoch = epoch;
        w->state = REG_LOADING;
        w->error[0] = '\0';
        log_debug(LOG_SUB_NET, "worker %s: config hash ok, LOAD", w->spec->name);
        reg_send(out, w, EPMOE__MSG_TYPE__MSG_LOAD, &l.base);
    }
    wire_free_unpacked(&a->base);
}

static void reg_on_loading(reg_worker *w, const wire_msg *m, ob_box *out)
{
    ep_err err;
    Epmoe__Loading *l = (Epmoe__Loading *)wire_unpack(&epmoe__loading__descriptor, m, &err);
    if (l == NULL) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    if (w->state != REG_LOADING && w->state != REG_LOAD_FAILED) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: LOADING in state %s (expected after LOAD)", w->spec->name,
                  reg_state_name(w->state));
    } else {
        w->state = REG_LOADING;
        w->bytes_done = l->has_bytes_done ? l->bytes_done : 0;
        w->bytes_total = l->has_bytes_total ? l->bytes_total : 0;
        w->load_read = w->bytes_done;
        w->load_ms = l->has_elapsed_ms ? l->elapsed_ms : 0;
        log_debug(LOG_SUB_NET, "worker %s: loading %" PRIu64 "/%" PRIu64 " bytes", w->spec->name,
                  w->bytes_done, w->bytes_total);
    }
    wire_free_unpacked(&l->base);
}

/* READY {epoch, staged}: the worker prepared a staged epoch (it still serves its own). */
static void reg_on_prepared(reg_worker *w, const Epmoe__Ready *r, const wire_msg *m, ob_box *out)
{
    if (w->state != REG_READY || !r->has_epoch || r->epoch != w->staged || w->staged == 0) {
        log_debug(LOG_SUB_NET,
                  "worker %s: READY for staged epoch %" PRIu64 " dropped (staged: %" PRIu64 ")",
                  w->spec->name, r->has_epoch ? r->epoch : 0, w->staged);
        return;
    }
    w->prepared = true;
    log_info("worker %s (rank %d) prepared staged epoch %" PRIu64 " (%u slots, %u read)",
             w->spec->name, w->spec->rank, w->staged, r->has_n_slots ? (unsigned)r->n_slots : 0,
             r->has_n_slots && r->has_slots_kept && r->slots_kept <= r->n_slots
                 ? (unsigned)(r->n_slots - r->slots_kept)
                 : 0);
    ob_event_add(out, OB_EV_PREPARED, w->spec->rank, "prepared");
    ob_event *e = ob_last_event(out);
    if (e != NULL)
        e->epoch = w->staged;
    (void)m;
}

/* The client endpoint a READY or REGISTER reports, kept when it is one a client can connect
 * to. */
static void reg_client_endpoint_is(reg_worker *w, const char *ep, const char *what)
{
    ep_err err;
    if (ep == NULL)
        return;
    if (strlen(ep) >= sizeof w->client_ep || wire_check_endpoint(ep, &err) != 0) {
        log_warn("worker %s: %s with client endpoint \"%.64s\" that clients cannot use; "
                 "CLIENT_INFO keeps \"%s\"",
                 w->spec->name, what, ep, w->client_ep);
        return;
    }
    snprintf(w->client_ep, sizeof w->client_ep, "%s", ep);
}

static void reg_client_endpoint(reg_worker *w, const Epmoe__Ready *r)
{
    reg_client_endpoint_is(w, r->client_endpoint, "READY");
}

static void reg_on_ready(const reg_env *env, reg_worker *w, const wire_msg *m, ob_box *out)
{
    ep_err err;
    Epmoe__Ready *r = (Epmoe__Ready *)wire_unpack(&epmoe__ready__descriptor, m, &err);
    if (r == NULL) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    uint64_t epoch = w->epoch;
    if (r->has_staged && r->staged) {
        reg_on_prepared(w, r, m, out);
        wire_free_unpacked(&r->base);
        return;
    }
    int owned = plan_rank_max(env->plan, w->spec->rank);
    int slots = plan_rank_slots(env->plan, w->spec->rank);
    if (r->has_epoch && r->epoch < epoch &&
        (w->state == REG_LOADING || w->state == REG_LOAD_FAILED)) {
        /* it finished an epoch that was replaced while it loaded; the newer one follows */
        log_debug(LOG_SUB_NET,
                  "worker %s: READY for superseded epoch %" PRIu64 " (now %" PRIu64 "): dropped",
                  w->spec->name, r->epoch, epoch);
    } else if (w->state != REG_LOADING && w->state != REG_LOAD_FAILED) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY in state %s (expected after LOAD)", w->spec->name,
                  reg_state_name(w->state));
    } else if (!r->has_epoch || r->epoch != epoch) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY for epoch %" PRIu64 "%s, the worker was told epoch %" PRIu64,
                  w->spec->name, r->has_epoch ? r->epoch : 0, r->has_epoch ? "" : " (absent)",
                  epoch);
    } else if (!r->has_config_hash || r->config_hash != env->config_hash) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_CONFIG_HASH,
                  "worker %s: READY with config hash 0x%016" PRIx64 "%s, the coordinator's is "
                  "0x%016" PRIx64,
                  w->spec->name, r->has_config_hash ? r->config_hash : 0,
                  r->has_config_hash ? "" : " (absent)", env->config_hash);
    } else if (r->has_n_experts && (int)r->n_experts != owned) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY with %u experts, but rank %d owns %d in epoch %" PRIu64,
                  w->spec->name, (unsigned)r->n_experts, w->spec->rank, owned, epoch);
    } else if (r->has_n_slots && (int)r->n_slots != slots) {
        reg_error(m, out, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY with %u (layer, expert) slots, but rank %d holds %d in epoch "
                  "%" PRIu64,
                  w->spec->name, (unsigned)r->n_slots, w->spec->rank, slots, epoch);
    } else {
        w->state = REG_READY;
        w->acked = epoch;
        w->n_experts = (uint32_t)owned;
        if (r->has_bytes_loaded)
            w->bytes_done = w->bytes_total = r->bytes_loaded;
        w->bytes_read = r->has_bytes_read ? r->bytes_read : w->bytes_done;
        w->slots_read = r->has_n_slots && r->has_slots_kept && r->slots_kept <= r->n_slots
                            ? r->n_slots - r->slots_kept
                            : 0;
        if (r->has_bytes_read && r->has_load_ms && r->bytes_read > 0) {
            w->load_read = r->bytes_read; /* a load that kept every expert has no rate */
            w->load_ms = r->load_ms;
        }
        snprintf(w->backend, sizeof w->backend, "%s", r->backend ? r->backend : "");
        reg_client_endpoint(w, r);
        w->error[0] = '\0';
        log_info("worker %s (rank %d) is ready in epoch %" PRIu64
                 " (%s, %d experts, %u kept, %" PRIu64 " bytes read)",
                 w->spec->name, w->spec->rank, epoch, w->backend[0] ? w->backend : "backend?",
                 owned, r->has_experts_kept ? (unsigned)r->experts_kept : 0, w->bytes_read);
        ob_event_add(out, OB_EV_READY, w->spec->rank, "ready");
        ob_event *e = ob_last_event(out);
        if (e != NULL)
            e->epoch = epoch;
    }
    wire_free_unpacked(&r->base);
}

/* An Error from a worker: a load failure, or a complaint about one of our messages. */
static void reg_on_error(reg_worker *w, const wire_msg *m, ob_box *out)
{
    ep_err err;
    Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, m, &err);
    if (e == NULL) {
        /* never answer an Error with an Error: two confused peers would ping-pong forever */
        log_warn("worker %s: undecodable Error message: %s", w->spec->name, err.msg);
        return;
    }
    const char *text = e->message ? e->message : "(no message)";
    if (e->has_code && e->code == EPMOE__ERROR_CODE__ERR_LOAD_FAILED) {
        log_error("worker %s (rank %d) failed to load its shard: %s", w->spec->name, w->spec->rank,
                  text);
        reg_set_error(w, "load failed: %s", text);
        if (w->state == REG_READY && w->staged != 0) {
            /* the staged epoch could not be prepared; the worker still serves its own */
            ob_event_add(out, OB_EV_STAGE_FAILED, w->spec->rank, "%s", text);
            ob_event *ev = ob_last_event(out);
            if (ev != NULL)
                ev->epoch = w->staged;
            w->staged = 0;
        } else if (w->state == REG_LOADING || w->state == REG_READY) {
            bool was_ready = w->state == REG_READY;
            w->state = REG_LOAD_FAILED;
            if (was_ready)
                ob_event_add(out, OB_EV_LOST, w->spec->rank, "the worker reported a load failure");
            else
                ob_event_add(out, OB_EV_LOAD_FAILED, w->spec->rank, "%s", text);
        }
    } else {
        log_warn("worker %s reports error %d%s%s: %s", w->spec->name,
                 e->has_code ? (int)e->code : -1, e->has_in_reply_to ? " to " : "",
                 e->has_in_reply_to ? wire_type_name((uint16_t)e->in_reply_to) : "", text);
        reg_set_error(w, "%s", text);
    }
    wire_free_unpacked(&e->base);
}

int reg_sender(reg_registry *r, const reg_env *env, const wire_msg *m, ob_box *out)
{
    reg_worker *w = reg_find_ident(r, m->ident, m->ident_len);
    /* Peers we do not count as registered: never answer an Error (two confused peers would
     * ping-pong forever), and never a HEARTBEAT — an answer is a sign of life to the worker, so
     * answering its heartbeats would keep it from ever timing out and registering again (after
     * a coordinator restart, or once it was declared dead). Other messages get told why. */
    bool answer =
        m->type != EPMOE__MSG_TYPE__MSG_ERROR && m->type != EPMOE__MSG_TYPE__MSG_HEARTBEAT;
    if (w == NULL) {
        if (answer)
            ob_error(out, OB_TO_WORKER_ID, -1, m->ident, m->ident_len,
                     EPMOE__ERROR_CODE__ERR_NOT_REGISTERED, m->type,
                     "%s from a connection that has not registered: send REGISTER first",
                     wire_type_name(m->type));
        else
            log_debug(LOG_SUB_NET, "%s from a connection that has not registered: dropped",
                      wire_type_name(m->type));
        return -1;
    }
    if (w->state == REG_DEAD) {
        if (answer)
            ob_error(out, OB_TO_WORKER_ID, -1, m->ident, m->ident_len,
                     EPMOE__ERROR_CODE__ERR_WORKER_LOST, m->type,
                     "worker %s was declared %s; register again", w->spec->name, w->error);
        else
            log_debug(LOG_SUB_NET, "%s from dead worker %s: dropped", wire_type_name(m->type),
                      w->spec->name);
        return -1;
    }
    w->last_seen_ms = env->now_ms;
    return w->spec->rank;
}

void reg_on_message(reg_registry *r, const reg_env *env, int rank, const wire_msg *m, ob_box *out)
{
    reg_worker *w = reg_worker_at(r, rank);
    if (w == NULL)
        return;
    switch (m->type) {
    case EPMOE__MSG_TYPE__MSG_CONFIG_ACK:
        reg_on_config_ack(r, env, w, m, out);
        break;
    case EPMOE__MSG_TYPE__MSG_LOADING:
        reg_on_loading(w, m, out);
        break;
    case EPMOE__MSG_TYPE__MSG_READY:
        reg_on_ready(env, w, m, out);
        break;
    case EPMOE__MSG_TYPE__MSG_ERROR:
        reg_on_error(w, m, out);
        break;
    default:
        break; /* HEARTBEAT: the sign of life is all it carries */
    }
}

void reg_touch(reg_registry *r, const uint8_t *ident, size_t len, int64_t now_ms)
{
    reg_worker *w = reg_find_ident(r, ident, len);
    if (w != NULL && w->state != REG_DEAD)
        w->last_seen_ms = now_ms; /* garbage, but alive */
}

void reg_expire(reg_registry *r, const reg_env *env, ob_box *out)
{
    int64_t expiry = (int64_t)env->spec->heartbeat_ms * env->spec->liveness;
    for (int i = 0; i < r->n; i++) {
        reg_worker *w = &r->w[i];
        int64_t silent = env->now_ms - w->last_seen_ms;
        if (!reg_registered(w) || silent <= expiry)
            continue;
        char why[160];
        snprintf(why, sizeof why, "silent for %" PRId64 " ms (liveness %d x heartbeat %d ms)",
                 silent, env->spec->liveness, env->spec->heartbeat_ms);
        reg_declare_dead(r, i, why, out);
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

void reg_worker_info(reg_registry *r, const reg_env *env, int rank, Epmoe__WorkerInfo *o)
{
    reg_worker *w = &r->w[rank];
    const spec_worker *sw = w->spec;
    epmoe__worker_info__init(o);
    o->name = (char *)sw->name;
    o->node = (char *)sw->node;
    o->has_rank = 1;
    o->rank = (uint32_t)sw->rank;
    o->device = (char *)sw->device;
    o->state = (char *)reg_state_name(w->state);
    o->data_endpoint = (char *)sw->data;
    o->client_endpoint = w->client_ep[0] ? w->client_ep : NULL;
    o->has_bytes_done = 1;
    o->bytes_done = w->bytes_done;
    o->has_bytes_total = 1;
    o->bytes_total = w->bytes_total;
    if (w->load_ms > 0) {
        o->has_load_gbps = 1;
        o->load_gbps = (double)w->load_read / (double)w->load_ms / 1e6;
    }
    if (w->last_seen_ms > 0) {
        int64_t ago = env->now_ms - w->last_seen_ms;
        o->has_last_seen_ms = 1;
        o->last_seen_ms = ago < 0 ? 0 : ago > UINT32_MAX ? UINT32_MAX : (uint32_t)ago;
    }
    if (w->hostname[0])
        o->hostname = w->hostname;
    if (w->pid) {
        o->has_pid = 1;
        o->pid = w->pid;
    }
    if (w->backend[0])
        o->backend = w->backend;
    o->has_n_experts = o->has_n_slots = 1;
    o->n_experts = (uint32_t)plan_rank_max(env->plan, sw->rank);
    o->n_slots = (uint32_t)plan_rank_slots(env->plan, sw->rank);
    if (w->staged) {
        o->has_staged = o->has_prepared = 1;
        o->staged = w->staged;
        o->prepared = w->prepared;
    }
    if (w->acked) {
        o->has_epoch = 1;
        o->epoch = w->acked;
        o->has_bytes_read = o->has_slots_read = 1;
        o->bytes_read = w->bytes_read;
        o->slots_read = w->slots_read;
    }
    o->has_member = 1;
    o->member = plan_is_member(env->plan, sw->rank);
    if (w->error[0])
        o->error = w->error;
    if (w->has_device)
        o->device_info = &w->device;
}

void reg_adopt(reg_registry *dst, const reg_registry *old, const char *reason, ob_box *out)
{
    Epmoe__Shutdown s = EPMOE__SHUTDOWN__INIT;
    s.reason = (char *)reason;
    for (int i = 0; i < old->n; i++) {
        const reg_worker *o = &old->w[i];
        reg_worker *w = NULL;
        for (int j = 0; j < dst->n && w == NULL; j++)
            if (strcmp(dst->w[j].spec->name, o->spec->name) == 0)
                w = &dst->w[j];
        if (w == NULL) {
            if (reg_registered(o)) {
                log_info("worker %s is not in the new cluster spec: SHUTDOWN", o->spec->name);
                ob_send(out, OB_TO_WORKER_ID, -1, o->ident, o->ident_len,
                        EPMOE__MSG_TYPE__MSG_SHUTDOWN, &s.base, NULL, 0);
            }
            continue;
        }
        const spec_worker *sw = w->spec;
        *w = *o;
        w->spec = sw;
        w->device.name = w->dev_name; /* they pointed into the old registry */
        w->device.backend = w->dev_backend;
    }
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

void reg_respec(reg_registry *r, const spec_cluster *spec)
{
    for (int i = 0; i < r->n && i < spec->n_workers; i++) {
        const spec_worker *sw = &spec->workers[i];
        r->w[i].spec = sw;
        r->peers[i].name = (char *)sw->name;
        r->peers[i].data_endpoint = (char *)sw->data;
    }
}
