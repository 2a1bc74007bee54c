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
#include "coordinator/sequencer.h"

struct reg_registry {
    int n;
    reg_worker *w; /* [n], index == rank */
    /* WELCOME tables, the same for every worker of the epoch */
    uint32_t *owner; /* [n_experts] */
    size_t n_owner;
    Epmoe__Peer *peers;    /* [n] */
    Epmoe__Peer **peer_ps; /* [n] */
};

reg_registry *reg_create(const spec_cluster *spec, const plan_table *plan, ep_err *err)
{
    reg_registry *r = calloc(1, sizeof *r);
    if (r == NULL)
        goto fail_alloc;
    r->n = spec->n_workers;
    r->w = calloc((size_t)r->n, sizeof *r->w);
    r->peers = calloc((size_t)r->n, sizeof *r->peers);
    r->peer_ps = calloc((size_t)r->n, sizeof *r->peer_ps);
    r->owner = calloc((size_t)plan->n_experts, sizeof *r->owner);
    if (r->w == NULL || r->peers == NULL || r->peer_ps == NULL || r->owner == NULL)
        goto fail_alloc;
    r->n_owner = (size_t)plan->n_experts;
    for (int e = 0; e < plan->n_experts; e++)
        r->owner[e] = (uint32_t)plan->owner[e];
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
    free(r->owner);
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

static bool reg_registered(const reg_worker *w)
{
    return w->state != REG_ABSENT && w->state != REG_DEAD;
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
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
}

/* ---- sending ---- */

static void reg_send(coord *c, reg_worker *w, uint16_t type, const ProtobufCMessage *body)
{
    ep_err err;
    if (wire_send(c->wsock, w->ident, w->ident_len, type, body, NULL, 0, true, &err) != 0)
        log_debug(LOG_SUB_NET, "worker %s: %s", w->spec->name, err.msg);
}

static void reg_send_welcome(coord *c, reg_worker *w)
{
    reg_registry *r = c->reg;
    const spec_worker *sw = w->spec;
    Epmoe__ModelConfig mc;
    mmsg_from_config(c->cfg, &mc);
    Epmoe__Welcome m = EPMOE__WELCOME__INIT;
    m.cluster = (char *)c->spec->name;
    m.has_rank = 1;
    m.rank = (uint32_t)sw->rank;
    m.has_world_size = 1;
    m.world_size = (uint32_t)r->n;
    m.has_epoch = 1;
    m.epoch = c->plan->epoch;
    m.config = &mc;
    m.has_config_hash = 1;
    m.config_hash = c->config_hash;
    m.model_path = (char *)c->spec->model_path;
    m.n_expert_owner = r->n_owner;
    m.expert_owner = r->owner;
    m.n_peers = (size_t)r->n;
    m.peers = r->peer_ps;
    m.has_dispatch = 1;
    m.dispatch = c->spec->dispatch == SPEC_DISPATCH_BF16 ? EPMOE__DISPATCH_FORMAT__DISPATCH_BF16
                                                         : EPMOE__DISPATCH_FORMAT__DISPATCH_FP8;
    m.has_heartbeat_ms = 1;
    m.heartbeat_ms = (uint32_t)c->spec->heartbeat_ms;
    m.has_liveness = 1;
    m.liveness = (uint32_t)c->spec->liveness;
    m.has_step_timeout_ms = 1;
    m.step_timeout_ms = (uint32_t)c->spec->step_timeout_ms;
    m.data_endpoint = (char *)sw->data;
    m.device = (char *)sw->device;
    m.has_gpu_gemm = 1;
    m.gpu_gemm = c->spec->gpu_gemm == SPEC_GPU_GEMM_FAST ? EPMOE__GPU_GEMM__GPU_GEMM_FAST
                                                         : EPMOE__GPU_GEMM__GPU_GEMM_EXACT;
    reg_send(c, w, EPMOE__MSG_TYPE__MSG_WELCOME, &m.base);
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

static void reg_error(coord *c, const wire_msg *m, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Error to the sender of m, also logged (these are worker bugs or misconfigurations). */
static void reg_error(coord *c, const wire_msg *m, Epmoe__ErrorCode code, const char *fmt, ...)
{
    char text[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    log_warn("worker socket: %s", text);
    wire_send_error(c->wsock, m->ident, m->ident_len, code, m->type, "%s", text);
}

/* ---- lifecycle ---- */

void reg_declare_dead(coord *c, int rank, const char *why)
{
    reg_worker *w = reg_worker_at(c->reg, rank);
    if (w == NULL || !reg_registered(w))
        return;
    log_info("worker %s (rank %d) is dead: %s", w->spec->name, rank, why);
    reg_set_error(w, "dead: %s", why);
    w->state = REG_DEAD;
    coord_update_state(c);
    seq_worker_lost(c, rank, why);
}

/* The list of spec workers for the unknown-worker message, cut to fit. */
static void reg_names_text(const coord *c, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->spec->n_workers; i++) {
        const char *name = c->spec->workers[i].name;
        if (len + strlen(name) + 24 > cap || i == 32) {
            snprintf(buf + len, cap - len, ", ... (%d in all)", c->spec->n_workers);
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

static void reg_on_register(coord *c, const wire_msg *m)
{
    ep_err err;
    Epmoe__Register *rq = (Epmoe__Register *)wire_unpack(&epmoe__register__descriptor, m, &err);
    if (rq == NULL) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    if (rq->name == NULL || !reg_name_ok(rq->name)) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "REGISTER without a worker name (1..%d characters)", SPEC_NAME_MAX);
        goto done;
    }
    const spec_worker *sw = spec_find_worker(c->spec, rq->name);
    if (sw == NULL) {
        char names[600];
        reg_names_text(c, names, sizeof names);
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_UNKNOWN_WORKER,
                  "worker \"%s\" is not in cluster spec %s (workers: %s)", rq->name, c->spec->file,
                  names);
        goto done;
    }
    if (rq->device != NULL && rq->device[0] != '\0' && strcmp(rq->device, sw->device) != 0) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s registered with device \"%.32s\" but cluster spec %s:%d:%d assigns "
                  "\"%s\"",
                  sw->name, rq->device, c->spec->file, sw->device_pos.line, sw->device_pos.col,
                  sw->device);
        goto done;
    }
    reg_worker *w = &c->reg->w[sw->rank];
    bool same_ident = w->ident_len == m->ident_len && memcmp(w->ident, m->ident, m->ident_len) == 0;
    int64_t expiry = (int64_t)c->spec->heartbeat_ms * c->spec->liveness;
    if (reg_registered(w) && !same_ident && c->now_ms - w->last_seen_ms < expiry) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_DUPLICATE,
                  "worker %s is already registered from another connection (last seen %" PRId64
                  " ms ago); a restarted worker must use its name as routing id, or wait %" PRId64
                  " ms until the old registration expires",
                  sw->name, c->now_ms - w->last_seen_ms, expiry);
        goto done;
    }
    /* A connection that registered before under another name gives that name up. */
    reg_worker *other = reg_find_ident(c->reg, m->ident, m->ident_len);
    if (other != NULL && other != w && reg_registered(other))
        reg_declare_dead(c, other->spec->rank,
                         "its connection registered again under another name");
    bool restart = reg_registered(w);
    w->state = REG_WELCOMED;
    memcpy(w->ident, m->ident, m->ident_len);
    w->ident_len = m->ident_len;
    w->last_seen_ms = c->now_ms;
    w->bytes_done = w->bytes_total = 0;
    w->n_experts = 0;
    w->pid = rq->has_pid ? rq->pid : 0;
    snprintf(w->hostname, sizeof w->hostname, "%s", rq->hostname ? rq->hostname : "");
    snprintf(w->version, sizeof w->version, "%s", rq->version ? rq->version : "");
    w->backend[0] = '\0';
    w->error[0] = '\0';
    reg_keep_device(w, rq->device_info);
    log_info("worker %s (rank %d) %s from %s pid %u", sw->name, sw->rank,
             restart ? "registered again (restart; its step in flight is lost)" : "registered",
             w->hostname[0] ? w->hostname : "?", (unsigned)w->pid);
    reg_send_welcome(c, w);
    /* the state first: the sequencer must not start the next step with this worker in it */
    coord_update_state(c);
    if (restart)
        seq_worker_lost(c, sw->rank, "the worker registered again (restarted)");
done:
    wire_free_unpacked(&rq->base);
}

static void reg_on_config_ack(coord *c, reg_worker *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__ConfigAck *a = (Epmoe__ConfigAck *)wire_unpack(&epmoe__config_ack__descriptor, m, &err);
    if (a == NULL) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    if (w->state != REG_WELCOMED) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: CONFIG_ACK in state %s (expected once, after WELCOME)", w->spec->name,
                  reg_state_name(w->state));
    } else if (!a->has_config_hash) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: CONFIG_ACK without config_hash", w->spec->name);
    } else if (a->has_epoch && a->epoch != c->plan->epoch) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: CONFIG_ACK for epoch %" PRIu64 ", the current epoch is %" PRIu64,
                  w->spec->name, a->epoch, c->plan->epoch);
    } else if (a->config_hash != c->config_hash) {
        reg_set_error(w,
                      "config hash mismatch: the worker computed 0x%016" PRIx64
                      ", the coordinator 0x%016" PRIx64,
                      a->config_hash, c->config_hash);
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_CONFIG_HASH,
                  "worker %s: config hash 0x%016" PRIx64
                  " differs from the coordinator's 0x%016" PRIx64
                  " (the worker rebuilt another config from WELCOME: different epmoe versions?); "
                  "it gets no work",
                  w->spec->name, a->config_hash, c->config_hash);
    } else {
        Epmoe__Load l = EPMOE__LOAD__INIT;
        l.has_epoch = 1;
        l.epoch = c->plan->epoch;
        w->state = REG_LOADING;
        w->error[0] = '\0';
        log_debug(LOG_SUB_NET, "worker %s: config hash ok, LOAD", w->spec->name);
        reg_send(c, w, EPMOE__MSG_TYPE__MSG_LOAD, &l.base);
        coord_update_state(c);
    }
    wire_free_unpacked(&a->base);
}

static void reg_on_loading(coord *c, reg_worker *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__Loading *l = (Epmoe__Loading *)wire_unpack(&epmoe__loading__descriptor, m, &err);
    if (l == NULL) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    if (w->state != REG_LOADING && w->state != REG_LOAD_FAILED) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
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

static void reg_on_ready(coord *c, reg_worker *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__Ready *r = (Epmoe__Ready *)wire_unpack(&epmoe__ready__descriptor, m, &err);
    if (r == NULL) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s", err.msg);
        return;
    }
    int owned = plan_rank_experts(c->plan, w->spec->rank, NULL, 0);
    if (w->state != REG_LOADING && w->state != REG_LOAD_FAILED) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY in state %s (expected after LOAD)", w->spec->name,
                  reg_state_name(w->state));
    } else if (!r->has_epoch || r->epoch != c->plan->epoch) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY for epoch %" PRIu64 "%s, the current epoch is %" PRIu64,
                  w->spec->name, r->has_epoch ? r->epoch : 0, r->has_epoch ? "" : " (absent)",
                  c->plan->epoch);
    } else if (!r->has_config_hash || r->config_hash != c->config_hash) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_CONFIG_HASH,
                  "worker %s: READY with config hash 0x%016" PRIx64 "%s, the coordinator's is "
                  "0x%016" PRIx64,
                  w->spec->name, r->has_config_hash ? r->config_hash : 0,
                  r->has_config_hash ? "" : " (absent)", c->config_hash);
    } else if (r->has_n_experts && (int)r->n_experts != owned) {
        reg_error(c, m, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "worker %s: READY with %u experts, but rank %d owns %d in epoch %" PRIu64,
                  w->spec->name, (unsigned)r->n_experts, w->spec->rank, owned, c->plan->epoch);
    } else {
        w->state = REG_READY;
        w->n_experts = (uint32_t)owned;
        if (r->has_bytes_loaded)
            w->bytes_done = w->bytes_total = r->bytes_loaded;
        if (r->has_bytes_read && r->has_load_ms) {
            w->load_read = r->bytes_read;
            w->load_ms = r->load_ms;
        }
        snprintf(w->backend, sizeof w->backend, "%s", r->backend ? r->backend : "");
        w->error[0] = '\0';
        log_info("worker %s (rank %d) is ready (%s, %d experts)", w->spec->name, w->spec->rank,
                 w->backend[0] ? w->backend : "backend?", owned);
        coord_update_state(c);
    }
    wire_free_unpacked(&r->base);
}

/* An Error from a worker: a load failure, or a complaint about one of our messages. */
static void reg_on_error(coord *c, reg_worker *w, const wire_msg *m)
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
        if (w->state == REG_LOADING || w->state == REG_READY) {
            bool was_ready = w->state == REG_READY;
            w->state = REG_LOAD_FAILED;
            coord_update_state(c);
            if (was_ready)
                seq_worker_lost(c, w->spec->rank, "the worker reported a load failure");
        }
    } else {
        log_warn("worker %s reports error %d%s%s: %s", w->spec->name,
                 e->has_code ? (int)e->code : -1, e->has_in_reply_to ? " to " : "",
                 e->has_in_reply_to ? wire_type_name((uint16_t)e->in_reply_to) : "", text);
        reg_set_error(w, "%s", text);
    }
    wire_free_unpacked(&e->base);
}

/* Message types a worker may send on coordinator.listen. */
static bool reg_worker_type(uint16_t type)
{
    switch (type) {
    case EPMOE__MSG_TYPE__MSG_REGISTER:
    case EPMOE__MSG_TYPE__MSG_CONFIG_ACK:
    case EPMOE__MSG_TYPE__MSG_LOADING:
    case EPMOE__MSG_TYPE__MSG_READY:
    case EPMOE__MSG_TYPE__MSG_HEARTBEAT:
    case EPMOE__MSG_TYPE__MSG_ERROR:
    case EPMOE__MSG_TYPE__MSG_STEP_DONE:
    case EPMOE__MSG_TYPE__MSG_STEP_FAILED:
        return true;
    default:
        return false;
    }
}

void reg_on_message(coord *c, const wire_msg *m)
{
    if (!reg_worker_type(m->type)) {
        wire_send_error(c->wsock, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE,
                        m->type, "coordinator.listen does not accept %s from a worker",
                        wire_type_name(m->type));
        return;
    }
    if (m->type == EPMOE__MSG_TYPE__MSG_REGISTER) {
        reg_on_register(c, m);
        return;
    }
    reg_worker *w = reg_find_ident(c->reg, m->ident, m->ident_len);
    /* Peers we do not count as registered: never answer an Error (two confused peers would
     * ping-pong forever), and never a HEARTBEAT — an answer is a sign of life to the worker, so
     * answering its heartbeats would keep it from ever timing out and registering again (after
     * a coordinator restart, or once it was declared dead). Other messages get told why. */
    bool answer =
        m->type != EPMOE__MSG_TYPE__MSG_ERROR && m->type != EPMOE__MSG_TYPE__MSG_HEARTBEAT;
    if (w == NULL) {
        if (answer)
            wire_send_error(c->wsock, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_NOT_REGISTERED,
                            m->type,
                            "%s from a connection that has not registered: send REGISTER first",
                            wire_type_name(m->type));
        else
            log_debug(LOG_SUB_NET, "%s from a connection that has not registered: dropped",
                      wire_type_name(m->type));
        return;
    }
    if (w->state == REG_DEAD) {
        if (answer)
            wire_send_error(c->wsock, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_WORKER_LOST,
                            m->type, "worker %s was declared %s; register again", w->spec->name,
                            w->error);
        else
            log_debug(LOG_SUB_NET, "%s from dead worker %s: dropped", wire_type_name(m->type),
                      w->spec->name);
        return;
    }
    w->last_seen_ms = c->now_ms;
    switch (m->type) {
    case EPMOE__MSG_TYPE__MSG_CONFIG_ACK:
        reg_on_config_ack(c, w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_LOADING:
        reg_on_loading(c, w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_READY:
        reg_on_ready(c, w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_ERROR:
        reg_on_error(c, w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP_DONE:
    case EPMOE__MSG_TYPE__MSG_STEP_FAILED:
        seq_on_message(c, w->spec->rank, m);
        break;
    default:
        break; /* HEARTBEAT: the sign of life is all it carries */
    }
}

void reg_tick(coord *c)
{
    int64_t expiry = (int64_t)c->spec->heartbeat_ms * c->spec->liveness;
    Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
    hb.has_epoch = 1;
    hb.epoch = c->plan->epoch;
    for (int i = 0; i < c->reg->n; i++) {
        reg_worker *w = &c->reg->w[i];
        if (!reg_registered(w))
            continue;
        int64_t silent = c->now_ms - w->last_seen_ms;
        if (silent > expiry) {
            char why[160];
            snprintf(why, sizeof why, "silent for %" PRId64 " ms (liveness %d x heartbeat %d ms)",
                     silent, c->spec->liveness, c->spec->heartbeat_ms);
            reg_declare_dead(c, i, why);
            continue;
        }
        reg_send(c, w, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base);
    }
}

void reg_shutdown(coord *c, const char *reason)
{
    Epmoe__Shutdown s = EPMOE__SHUTDOWN__INIT;
    s.reason = (char *)reason;
    for (int i = 0; i < c->reg->n; i++)
        if (reg_registered(&c->reg->w[i]))
            reg_send(c, &c->reg->w[i], EPMOE__MSG_TYPE__MSG_SHUTDOWN, &s.base);
}

void reg_worker_info(coord *c, int rank, Epmoe__WorkerInfo *o)
{
    reg_worker *w = &c->reg->w[rank];
    const spec_worker *sw = w->spec;
    epmoe__worker_info__init(o);
    o->name = (char *)sw->name;
    o->node = (char *)sw->node;
    o->has_rank = 1;
    o->rank = (uint32_t)sw->rank;
    o->device = (char *)sw->device;
    o->state = (char *)reg_state_name(w->state);
    o->data_endpoint = (char *)sw->data;
    o->has_bytes_done = 1;
    o->bytes_done = w->bytes_done;
    o->has_bytes_total = 1;
    o->bytes_total = w->bytes_total;
    if (w->load_ms > 0) {
        o->has_load_gbps = 1;
        o->load_gbps = (double)w->load_read / (double)w->load_ms / 1e6;
    }
    if (w->last_seen_ms > 0) {
        int64_t ago = c->now_ms - w->last_seen_ms;
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
    o->has_n_experts = 1;
    o->n_experts = (uint32_t)plan_rank_experts(c->plan, sw->rank, NULL, 0);
    if (w->error[0])
        o->error = w->error;
    if (w->has_device)
        o->device_info = &w->device;
}
