/*
 * registry.c — the table of workers, what it answers, and liveness (see registry.h). mdbroker's
 * worker_t with an expiry per worker; the config handshake of docs/protocol.md is in
 * registry_recv.c (what workers send) and registry_send.c (what they are sent).
 */
#include "coordinator/registry.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/registry_internal.h"

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

bool reg_prepared(const reg_registry *r, int rank, uint64_t epoch)
{
    return rank >= 0 && rank < r->n && r->w[rank].state == REG_READY &&
           r->w[rank].staged == epoch && r->w[rank].prepared;
}

void reg_unstage(reg_registry *r)
{
    for (int i = 0; i < r->n; i++) {
        r->w[i].staged = 0;
        r->w[i].prepared = false;
    }
}

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
    o->has_worker_state = 1;
    o->worker_state = (Epmoe__WorkerState)(w->state + 1); /* the same order, from 1 */
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

void reg_respec(reg_registry *r, const spec_cluster *spec)
{
    for (int i = 0; i < r->n && i < spec->n_workers; i++) {
        const spec_worker *sw = &spec->workers[i];
        r->w[i].spec = sw;
        r->peers[i].name = (char *)sw->name;
        r->peers[i].data_endpoint = (char *)sw->data;
    }
}

/* reg_worker_info sends w->state + 1 as the wire's WorkerState */
static_assert(REG_ABSENT + 1 == EPMOE__WORKER_STATE__WORKER_ABSENT, "WorkerState");
static_assert(REG_WELCOMED + 1 == EPMOE__WORKER_STATE__WORKER_WELCOMED, "WorkerState");
static_assert(REG_LOADING + 1 == EPMOE__WORKER_STATE__WORKER_LOADING, "WorkerState");
static_assert(REG_LOAD_FAILED + 1 == EPMOE__WORKER_STATE__WORKER_LOAD_FAILED, "WorkerState");
static_assert(REG_READY + 1 == EPMOE__WORKER_STATE__WORKER_READY, "WorkerState");
static_assert(REG_DEAD + 1 == EPMOE__WORKER_STATE__WORKER_DEAD, "WorkerState");
