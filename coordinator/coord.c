/*
 * coord.c — the coordinator's sockets, its poll loop and the order of events (see coord.h).
 */
#include "coordinator/coord.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/limits.h"
#include "common/log.h"
#include "common/sdnotify.h"
#include "common/wire.h"
#include "coordinator/admin.h"
#include "coordinator/ncclboot.h"
#include "coordinator/outbox.h"
#include "coordinator/registry.h"
#include "coordinator/sequencer.h"

/* Worker messages handled per loop iteration before the admin socket gets its turn. */
#define COORD_BATCH 64
/* How long the last messages (SHUTDOWN to workers, the SHUTDOWN reply) may take to leave when
 * the daemon stops; LINGER is 0 the rest of the time. */
#define COORD_STOP_LINGER_MS 1000

struct coord {
    const spec_cluster *spec; /* borrowed from main, outlives the daemon */
    const mc_config *cfg;
    uint64_t config_hash; /* mc_hash(cfg) */
    const plan_table *plan;
    void *zctx;
    void *wsock; /* ROUTER coordinator.listen (workers) */
    void *asock; /* ROUTER coordinator.admin (operators) */
    int sigfd;   /* signalfd for SIGTERM, SIGINT (stop) and SIGHUP (ignored for now) */
    reg_registry *reg;
    seq_sequencer *seq;
    nb_boot *nb; /* data_plane nccl: the communicator of the epoch; NULL for zmq */
    ob_box out;  /* what the handlers of the current input returned, not yet settled */
    coord_state state;
    bool stop;      /* leave the loop after this iteration */
    int64_t now_ms; /* CLOCK_MONOTONIC, refreshed once per loop iteration */
    int64_t next_heartbeat_ms;
    uint64_t watchdog_ms; /* half of WatchdogSec, 0 when off */
    int64_t next_watchdog_ms;
    char not_ready[600]; /* seq_env.not_ready */
};

int64_t coord_clock_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

const char *coord_state_name(coord_state s)
{
    switch (s) {
    case COORD_FORMING:
        return "forming";
    case COORD_LOADING:
        return "loading";
    case COORD_READY:
        return "ready";
    case COORD_STOPPING:
        return "stopping";
    }
    return "?";
}

static void coord_notify_status(coord *c)
{
    int missing, not_ready;
    reg_counts(c->reg, &missing, &not_ready);
    int n = reg_size(c->reg);
    sdn_notifyf("STATUS=cluster %s %s: %d/%d workers registered, %d ready", c->spec->name,
                coord_state_name(c->state), n - missing, n, n - not_ready);
}

/* Recompute the cluster state from the registry; log and notify systemd on a change. */
static void coord_update_state(coord *c)
{
    if (c->state == COORD_STOPPING)
        return;
    int missing, not_ready;
    reg_counts(c->reg, &missing, &not_ready);
    coord_state s = missing > 0 ? COORD_FORMING : not_ready > 0 ? COORD_LOADING : COORD_READY;
    if (s == COORD_READY && c->nb != NULL && !nb_ready(c->nb))
        s = COORD_LOADING; /* every worker loaded, the NCCL communicator not built yet */
    if (s == c->state)
        return;
    log_info("cluster %s: %s -> %s (%d/%d workers ready)", c->spec->name,
             coord_state_name(c->state), coord_state_name(s), reg_size(c->reg) - not_ready,
             reg_size(c->reg));
    c->state = s;
    coord_notify_status(c);
}

/* ---- the facts each passive module gets ---- */

static reg_env coord_reg_env(const coord *c)
{
    return (reg_env){.spec = c->spec,
                     .cfg = c->cfg,
                     .config_hash = c->config_hash,
                     .plan = c->plan,
                     .now_ms = c->now_ms};
}

static seq_env coord_seq_env(coord *c)
{
    bool ready = c->state == COORD_READY;
    c->not_ready[0] = '\0';
    if (!ready)
        reg_not_ready_text(c->reg, c->not_ready, sizeof c->not_ready);
    if (!ready && c->not_ready[0] == '\0' && c->nb != NULL)
        nb_not_ready_text(c->nb, c->spec, c->not_ready, sizeof c->not_ready);
    return (seq_env){.spec = c->spec,
                     .cfg = c->cfg,
                     .plan = c->plan,
                     .now_ms = c->now_ms,
                     .state = coord_state_name(c->state),
                     .ready = ready,
                     .stopping = c->state == COORD_STOPPING,
                     .not_ready = c->not_ready};
}

static nb_env coord_nb_env(const coord *c)
{
    int missing, not_ready;
    reg_counts(c->reg, &missing, &not_ready);
    return (nb_env){.spec = c->spec,
                    .epoch = c->plan->epoch,
                    .now_ms = c->now_ms,
                    .all_ready = missing == 0 && not_ready == 0 && c->state != COORD_STOPPING};
}

/* ---- settling: send what the handlers returned, route their events ---- */

static void coord_send(coord *c, ob_msg *m)
{
    void *sock = m->to == OB_TO_ADMIN ? c->asock : c->wsock;
    const uint8_t *ident = m->ident;
    size_t len = m->ident_len;
    const char *who = m->to == OB_TO_ADMIN ? "admin client" : "worker";
    if (m->to == OB_TO_RANK) {
        reg_worker *w = reg_worker_at(c->reg, m->rank);
        ident = w ? w->ident : NULL;
        len = w ? w->ident_len : 0;
        who = w ? w->spec->name : "?";
    }
    ep_err err;
    int rc;
    if (len == 0) {
        ep_err_set(&err, "sending %s: the worker has never registered", wire_type_name(m->type));
        rc = -1;
        for (int i = 0; i < m->n_payloads; i++)
            if (m->payload[i].free_fn)
                m->payload[i].free_fn((void *)m->payload[i].data, m->payload[i].hint);
    } else {
        rc = wire_send_packed(sock, ident, len, m->type, m->body, m->body_len, m->payload,
                              m->n_payloads, true, &err);
    }
    ob_mark_sent(&c->out);
    if (rc == 0)
        return;
    log_debug(LOG_SUB_NET, "%s %s: %s", who, m->to == OB_TO_RANK ? "" : "(by id)", err.msg);
    if (m->type == EPMOE__MSG_TYPE__MSG_STEP && m->to == OB_TO_RANK) {
        ob_event_add(&c->out, OB_EV_SEND_FAILED, m->rank, "%s", err.msg);
        ob_event *e = ob_last_event(&c->out);
        if (e != NULL)
            e->step_id = m->step_id;
    }
}

static void coord_flush(coord *c)
{
    while (c->out.n_sent < c->out.n_msg)
        coord_send(c, &c->out.msg[c->out.n_sent]);
}

/* Hand one event to the module that handles it. */
static void coord_route(coord *c, const ob_event *e)
{
    seq_env senv = coord_seq_env(c);
    switch (e->kind) {
    case OB_EV_LOST:
        seq_worker_lost(c->seq, &senv, e->rank, e->text, &c->out);
        break;
    case OB_EV_DECLARE_DEAD:
        reg_declare_dead(c->reg, e->rank, e->text, &c->out);
        break;
    case OB_EV_READY:
        break; /* the state update before each event covers it */
    case OB_EV_SEND_FAILED:
        seq_send_failed(c->seq, &senv, e->rank, e->step_id, e->text, &c->out);
        break;
    case OB_EV_ERROR: {
        reg_worker *w = reg_worker_at(c->reg, e->rank);
        if (w != NULL)
            reg_set_error(w, "%s", e->text);
        break;
    }
    }
}

/* After every input: send, route events in order, and let the sequencer move on only when
 * nothing else is pending. Each pass hands one event to one module, so no handler runs inside
 * another. */
static void coord_settle(coord *c)
{
    for (;;) {
        coord_flush(c);
        coord_update_state(c);
        ob_event e;
        if (ob_take_event(&c->out, &e)) {
            coord_route(c, &e);
            continue;
        }
        int before = c->out.n_msg + c->out.n_ev;
        if (c->nb != NULL) {
            nb_env nenv = coord_nb_env(c);
            nb_pump(c->nb, &nenv, &c->out);
            coord_update_state(c);
        }
        seq_env senv = coord_seq_env(c);
        seq_pump(c->seq, &senv, &c->out);
        if (c->out.n_msg + c->out.n_ev == before)
            break;
    }
    ob_clear(&c->out);
}

/* Begin an orderly stop (SIGTERM, admin SHUTDOWN): stop taking work, answer queued requests
 * with ERR_SHUTTING_DOWN, send SHUTDOWN to the workers; the loop exits after this iteration. */
static void coord_stop(coord *c, const char *reason)
{
    if (c->stop)
        return;
    log_info("cluster %s: stopping (%s)", c->spec->name, reason);
    c->state = COORD_STOPPING;
    c->stop = true;
    sdn_notifyf("STOPPING=1\nSTATUS=stopping: %s", reason);
    seq_stop(c->seq, &c->out);
    reg_shutdown(c->reg, reason, &c->out);
}

/* ---- setup ---- */

static int coord_bind(coord *c, void *sock, const char *ep, spec_pos pos, const char *key,
                      ep_err *err)
{
    int one = 1;
    int ivl = c->spec->heartbeat_ms;
    int timeout = c->spec->heartbeat_ms * c->spec->liveness;
    if (wire_socket_defaults(sock, (int64_t)EP_MAX_DATA_MSG, err) != 0 ||
        zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout) != 0) {
        if (err->msg[0] == '\0')
            ep_err_set(err, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
        return ep_err_prefix(err, "%s:%d:%d: %s", c->spec->file, pos.line, pos.col, key);
    }
    if (zmq_bind(sock, ep) != 0)
        return ep_err_set(err, "%s:%d:%d: %s: cannot bind %s: %s", c->spec->file, pos.line, pos.col,
                          key, ep, zmq_strerror(zmq_errno()));
    return 0;
}

static int coord_signals(coord *c, ep_err *err)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP); /* reload is not implemented: logged and ignored, never fatal */
    /* Blocked before the ZeroMQ context exists, so its I/O threads inherit the mask and the
     * signals only ever arrive through the signalfd. */
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
        return ep_err_errno(err, "sigprocmask");
    c->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (c->sigfd < 0)
        return ep_err_errno(err, "signalfd");
    return 0;
}

coord *coord_create(const spec_cluster *spec, const mc_config *cfg, const plan_table *plan,
                    ep_err *err)
{
    ep_err_clear(err);
    coord *c = calloc(1, sizeof *c);
    if (c == NULL) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    c->spec = spec;
    c->cfg = cfg;
    c->config_hash = mc_hash(cfg);
    c->plan = plan;
    c->sigfd = -1;
    c->state = COORD_FORMING;
    if (coord_signals(c, err) != 0)
        goto fail;
    c->reg = reg_create(spec, err);
    if (c->reg == NULL)
        goto fail;
    c->seq = seq_create(spec->n_workers, err);
    if (c->seq == NULL)
        goto fail;
    if (spec->data_plane == SPEC_PLANE_NCCL && (c->nb = nb_create(spec->n_workers, err)) == NULL)
        goto fail;
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        ep_err_set(err, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    c->wsock = zmq_socket(c->zctx, ZMQ_ROUTER);
    c->asock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (c->wsock == NULL || c->asock == NULL) {
        ep_err_set(err, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (coord_bind(c, c->wsock, spec->listen, spec->listen_pos, "coordinator.listen", err) != 0 ||
        coord_bind(c, c->asock, spec->admin, spec->admin_pos, "coordinator.admin", err) != 0)
        goto fail;
    c->now_ms = coord_clock_ms();
    c->next_heartbeat_ms = c->now_ms + spec->heartbeat_ms;
    c->watchdog_ms = sdn_watchdog_usec() / 2000;
    c->next_watchdog_ms = c->now_ms;
    return c;
fail:
    coord_destroy(&c);
    return NULL;
}

void coord_destroy(coord **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    coord *c = *self_p;
    /* the sequencer's requests and the outbox hold frames; free them before the context goes */
    seq_destroy(&c->seq);
    ob_free(&c->out);
    if (c->wsock)
        zmq_close(c->wsock);
    if (c->asock)
        zmq_close(c->asock);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    reg_destroy(&c->reg);
    nb_destroy(&c->nb);
    if (c->sigfd >= 0)
        close(c->sigfd);
    free(c);
    *self_p = NULL;
}

/* ---- inputs ---- */

/* Message types a worker may send on coordinator.listen. */
static bool coord_worker_type(const coord *c, uint16_t type)
{
    switch (type) {
    case EPMOE__MSG_TYPE__MSG_COMM_ID:
    case EPMOE__MSG_TYPE__MSG_COMM_DONE:
        return c->nb != NULL;
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

/* A STEP_FAILED that says the worker aborted its NCCL communicator: the next step needs a new
 * one (the sequencer still handles the failure itself). */
static void coord_comm_aborted(coord *c, int rank, const wire_msg *m)
{
    ep_err err;
    Epmoe__StepFailed *f =
        (Epmoe__StepFailed *)wire_unpack(&epmoe__step_failed__descriptor, m, &err);
    if (f != NULL && f->has_comm_aborted && f->comm_aborted) {
        char why[128];
        snprintf(why, sizeof why, "step %" PRIu64 " failed on rank %d (%s)", f->step_id, rank,
                 c->spec->workers[rank].name);
        nb_invalidate(c->nb, why);
    }
    wire_free_unpacked(f ? &f->base : NULL);
}

/* One message from the worker socket: the registry says who sent it; step answers go to the
 * sequencer (and, on the NCCL plane, failures to the communicator too), NCCL bootstrap answers to
 * the communicator, lifecycle messages to the registry. */
static void coord_on_worker(coord *c, const wire_msg *m)
{
    reg_env renv = coord_reg_env(c);
    if (!coord_worker_type(c, m->type)) {
        ob_error(&c->out, OB_TO_WORKER_ID, -1, m->ident, m->ident_len,
                 EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE, m->type,
                 "coordinator.listen does not accept %s from a worker", wire_type_name(m->type));
        return;
    }
    if (m->type == EPMOE__MSG_TYPE__MSG_REGISTER) {
        reg_on_register(c->reg, &renv, m, &c->out);
        return;
    }
    int rank = reg_sender(c->reg, &renv, m, &c->out);
    if (rank < 0)
        return;
    if (m->type == EPMOE__MSG_TYPE__MSG_COMM_ID || m->type == EPMOE__MSG_TYPE__MSG_COMM_DONE) {
        nb_env nenv = coord_nb_env(c);
        nb_on_message(c->nb, &nenv, rank, m, &c->out);
        return;
    }
    if (m->type == EPMOE__MSG_TYPE__MSG_STEP_FAILED && c->nb != NULL)
        coord_comm_aborted(c, rank, m);
    if (m->type == EPMOE__MSG_TYPE__MSG_STEP_DONE || m->type == EPMOE__MSG_TYPE__MSG_STEP_FAILED) {
        seq_env senv = coord_seq_env(c);
        seq_on_message(c->seq, &senv, rank, m, &c->out);
    } else {
        reg_on_message(c->reg, &renv, rank, m, &c->out);
    }
}

static void coord_read_workers(coord *c)
{
    for (int i = 0; i < COORD_BATCH && !c->stop; i++) {
        wire_msg m;
        ep_err err;
        wire_rc rc =
            wire_recv(c->wsock, true, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err);
        if (rc == WIRE_AGAIN)
            return;
        if (rc == WIRE_ERR) {
            log_warn("worker socket: %s", err.msg);
            if (m.ident_len > 0) {
                reg_touch(c->reg, m.ident, m.ident_len, c->now_ms);
                ob_error(&c->out, OB_TO_WORKER_ID, -1, m.ident, m.ident_len,
                         EPMOE__ERROR_CODE__ERR_MALFORMED, 0, "%s", err.msg);
            }
            coord_settle(c);
            continue;
        }
        if (log_debug_enabled(LOG_SUB_NET))
            log_debug(LOG_SUB_NET, "worker socket: %s (%zu body bytes, %d payloads)",
                      wire_type_name(m.type), m.body_len, m.n_payloads);
        coord_on_worker(c, &m);
        wire_msg_close(&m);
        coord_settle(c);
    }
}

/* The facts the read-only verbs report; workers[] is allocated (free it). */
static int coord_facts(coord *c, adm_facts *f)
{
    reg_env renv = coord_reg_env(c);
    int n = reg_size(c->reg);
    *f = (adm_facts){.spec = c->spec,
                     .cfg = c->cfg,
                     .config_hash = c->config_hash,
                     .plan = c->plan,
                     .state = coord_state_name(c->state),
                     .steps_done = seq_steps_done(c->seq),
                     .steps_failed = seq_steps_failed(c->seq),
                     .n_workers = n};
    Epmoe__WorkerInfo *wi = calloc((size_t)n, sizeof *wi);
    f->workers = calloc((size_t)n, sizeof *f->workers);
    if (wi == NULL || f->workers == NULL) {
        free(wi);
        free(f->workers);
        f->workers = NULL;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        reg_worker_info(c->reg, &renv, i, &wi[i]);
        f->workers[i] = &wi[i];
    }
    return 0;
}

static void coord_facts_free(adm_facts *f)
{
    if (f->workers != NULL)
        free(f->workers[0]); /* the WorkerInfo array */
    free(f->workers);
    f->workers = NULL;
}

/* One admin request; takes ownership of m (heap). */
static void coord_on_admin(coord *c, wire_msg *m)
{
    Epmoe__AdminRequest *rq = adm_parse(m, &c->out);
    if (rq == NULL)
        goto done;
    if (rq->verb == EPMOE__ADMIN_VERB__ADMIN_FORWARD) {
        seq_env senv = coord_seq_env(c);
        seq_submit(c->seq, &senv, m, rq, &c->out); /* owns both from here */
        return;
    }
    adm_facts f;
    if (coord_facts(c, &f) != 0) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "the coordinator is out of memory");
        goto done;
    }
    switch (rq->verb) {
    case EPMOE__ADMIN_VERB__ADMIN_STATUS:
        adm_reply_workers(&c->out, m, rq->id, &f, true);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_WORKERS:
        adm_reply_workers(&c->out, m, rq->id, &f, false);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_SHARDS:
        adm_reply_shards(&c->out, m, rq, &f);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_CONFIG:
        adm_reply_config(&c->out, m, rq->id, &f);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN:
        adm_reply_shutdown(&c->out, m, rq->id, &f);
        coord_stop(c, "admin SHUTDOWN");
        break;
    default:
        adm_reply_unknown_verb(&c->out, m, rq);
        break;
    }
    coord_facts_free(&f);
done:
    if (rq)
        wire_free_unpacked(&rq->base);
    wire_msg_close(m);
    free(m);
}

static void coord_read_admin(coord *c)
{
    for (int i = 0; i < COORD_BATCH && !c->stop; i++) {
        wire_msg *m = malloc(sizeof *m);
        if (m == NULL) {
            log_error("admin socket: out of memory");
            return;
        }
        ep_err err;
        wire_rc rc =
            wire_recv(c->asock, true, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, m, &err);
        if (rc == WIRE_AGAIN) {
            free(m);
            return;
        }
        if (rc == WIRE_ERR) {
            log_warn("admin socket: %s", err.msg);
            if (m->ident_len > 0)
                ob_error(&c->out, OB_TO_ADMIN, -1, m->ident, m->ident_len,
                         EPMOE__ERROR_CODE__ERR_MALFORMED, 0, "%s", err.msg);
            free(m);
        } else {
            coord_on_admin(c, m);
        }
        coord_settle(c);
    }
}

static void coord_read_signals(coord *c)
{
    struct signalfd_siginfo si;
    while (read(c->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP)
            log_warn("SIGHUP: reloading the cluster spec is not implemented yet; ignored");
        else
            coord_stop(c, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
    }
    coord_settle(c);
}

/* Heartbeats, liveness, step deadlines and the watchdog. */
static void coord_timers(coord *c)
{
    if (c->now_ms >= c->next_heartbeat_ms) {
        reg_env renv = coord_reg_env(c);
        reg_tick(c->reg, &renv, &c->out);
        c->next_heartbeat_ms = c->now_ms + c->spec->heartbeat_ms;
        coord_settle(c);
    }
    seq_env senv = coord_seq_env(c);
    seq_tick(c->seq, &senv, &c->out);
    coord_settle(c);
    if (c->nb != NULL) {
        nb_env nenv = coord_nb_env(c);
        nb_tick(c->nb, &nenv, &c->out);
        coord_settle(c);
    }
    if (c->watchdog_ms > 0 && c->now_ms >= c->next_watchdog_ms) {
        sdn_notify("WATCHDOG=1"); /* the loop turned: that is the liveness we vouch for */
        c->next_watchdog_ms = c->now_ms + (int64_t)c->watchdog_ms;
    }
}

static long coord_poll_timeout(const coord *c)
{
    int64_t next = c->next_heartbeat_ms;
    int64_t s = seq_next_deadline(c->seq);
    if (s < next)
        next = s;
    if (c->nb != NULL && nb_next_deadline(c->nb) < next)
        next = nb_next_deadline(c->nb);
    if (c->watchdog_ms > 0 && c->next_watchdog_ms < next)
        next = c->next_watchdog_ms;
    int64_t wait = next - coord_clock_ms();
    return wait < 0 ? 0 : wait > 1000 ? 1000 : (long)wait;
}

static void coord_log_plan(const coord *c)
{
    if (!log_debug_enabled(LOG_SUB_PLAN))
        return;
    int *e = malloc((size_t)c->plan->n_experts * sizeof *e);
    for (int r = 0; e != NULL && r < c->plan->n_ranks; r++) {
        int n = plan_rank_experts(c->plan, r, e, c->plan->n_experts);
        log_debug(LOG_SUB_PLAN, "epoch %" PRIu64 ": rank %d (%s) owns %d experts, %d..%d",
                  c->plan->epoch, r, c->spec->workers[r].name, n, n > 0 ? e[0] : -1,
                  n > 0 ? e[n - 1] : -1);
    }
    free(e);
}

int coord_run(coord *c, ep_err *err)
{
    coord_log_plan(c);
    log_info("cluster %s: serving workers on %s, admin on %s (%d workers, epoch %" PRIu64 ")",
             c->spec->name, c->spec->listen, c->spec->admin, c->spec->n_workers, c->plan->epoch);
    sdn_notify("READY=1");
    coord_notify_status(c);
    while (!c->stop) {
        zmq_pollitem_t items[3] = {
            {.socket = c->wsock, .events = ZMQ_POLLIN},
            {.socket = c->asock, .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = c->sigfd, .events = ZMQ_POLLIN},
        };
        int n = zmq_poll(items, 3, coord_poll_timeout(c));
        if (n < 0 && zmq_errno() != EINTR)
            return ep_err_set(err, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        c->now_ms = coord_clock_ms();
        if (n > 0 && (items[2].revents & ZMQ_POLLIN))
            coord_read_signals(c);
        if (n > 0 && (items[0].revents & ZMQ_POLLIN))
            coord_read_workers(c);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN))
            coord_read_admin(c);
        if (!c->stop)
            coord_timers(c);
    }
    /* Let SHUTDOWN and the last replies leave before the sockets close. */
    int linger = COORD_STOP_LINGER_MS;
    zmq_setsockopt(c->wsock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->asock, ZMQ_LINGER, &linger, sizeof linger);
    log_info("cluster %s: stopped (%" PRIu64 " steps done, %" PRIu64 " failed)", c->spec->name,
             seq_steps_done(c->seq), seq_steps_failed(c->seq));
    return 0;
}
