/*
 * registry_recv.c — what the workers tell the coordinator (see registry.h): REGISTER, checked in
 * the order registry.h gives, CONFIG_ACK, LOADING, READY (current or staged) and Error, each
 * moving a worker through its lifecycle; and who sent a message at all (reg_sender).
 */
#include "coordinator/registry.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/registry_internal.h"

static void reg_error(const wire_msg *m, ob_box *out, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reg_client_endpoint_is(reg_worker *w, const char *ep, const char *what);

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

/* Error to the sender of m, also logged (these are worker bugs or misconfigurations). */
static void reg_error(const wire_msg *m, ob_box *out, Epmoe__ErrorCode code, const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    log_warn("worker socket: %s", err.msg);
    ob_reply_error(out, OB_TO_WORKER_ID, -1, m->ident, m->ident_len, &err, m->type);
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
     * ping-pong forever), and never a dead worker's HEARTBEAT — an answer is a sign of life to
     * the worker, so it would never time out and register again. A connection this coordinator
     * does not know at all (it was restarted) is told ERR_NOT_REGISTERED at its first
     * HEARTBEAT: the worker registers again at once, keeping its session meanwhile, instead of
     * liveness heartbeats later. Other messages get told why. */
    bool answer = m->type != EPMOE__MSG_TYPE__MSG_ERROR &&
                  (m->type != EPMOE__MSG_TYPE__MSG_HEARTBEAT || w == NULL);
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
