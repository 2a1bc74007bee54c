/*
 * coord.c — the coordinator's sockets and poll loop (see coord.h).
 */
#include "coordinator/coord.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/limits.h"
#include "common/log.h"
#include "common/sdnotify.h"
#include "common/wire.h"
#include "coordinator/admin.h"
#include "coordinator/registry.h"
#include "coordinator/sequencer.h"

/* Worker messages handled per loop iteration before the admin socket gets its turn. */
#define COORD_BATCH 64
/* How long the last messages (SHUTDOWN to workers, the SHUTDOWN reply) may take to leave when
 * the daemon stops; LINGER is 0 the rest of the time. */
#define COORD_STOP_LINGER_MS 1000

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

void coord_update_state(coord *c)
{
    if (c->state == COORD_STOPPING)
        return;
    int missing, not_ready;
    reg_counts(c->reg, &missing, &not_ready);
    coord_state s = missing > 0 ? COORD_FORMING : not_ready > 0 ? COORD_LOADING : COORD_READY;
    if (s == c->state)
        return;
    log_info("cluster %s: %s -> %s (%d/%d workers ready)", c->spec->name,
             coord_state_name(c->state), coord_state_name(s), reg_size(c->reg) - not_ready,
             reg_size(c->reg));
    c->state = s;
    coord_notify_status(c);
}

void coord_stop(coord *c, const char *reason)
{
    if (c->stop)
        return;
    log_info("cluster %s: stopping (%s)", c->spec->name, reason);
    c->state = COORD_STOPPING;
    c->stop = true;
    sdn_notifyf("STOPPING=1\nSTATUS=stopping: %s", reason);
    seq_stop(c);
    reg_shutdown(c, reason);
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

/* A session id no earlier run of any coordinator is likely to have had: data-plane messages
 * of a previous run can never pass for this one's. */
static int coord_random_session(uint64_t *out, ep_err *err)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        return ep_err_errno(err, "getrandom (the session id)");
    *out = v;
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
    if (coord_random_session(&c->session, err) != 0)
        goto fail;
    c->sigfd = -1;
    c->state = COORD_FORMING;
    if (coord_signals(c, err) != 0)
        goto fail;
    c->reg = reg_create(spec, plan, err);
    if (c->reg == NULL)
        goto fail;
    c->seq = seq_create(spec->n_workers, err);
    if (c->seq == NULL)
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
    /* the sequencer's requests hold frames; free them before the context goes */
    seq_destroy(&c->seq);
    if (c->wsock)
        zmq_close(c->wsock);
    if (c->asock)
        zmq_close(c->asock);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    reg_destroy(&c->reg);
    if (c->sigfd >= 0)
        close(c->sigfd);
    free(c);
    *self_p = NULL;
}

/* ---- the loop ---- */

static void coord_drain_workers(coord *c)
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
                reg_worker *w = reg_find_ident(c->reg, m.ident, m.ident_len);
                if (w != NULL && w->state != REG_DEAD)
                    w->last_seen_ms = c->now_ms; /* garbage, but alive */
                wire_send_error(c->wsock, m.ident, m.ident_len, EPMOE__ERROR_CODE__ERR_MALFORMED, 0,
                                "%s", err.msg);
            }
            continue;
        }
        if (log_debug_enabled(LOG_SUB_NET))
            log_debug(LOG_SUB_NET, "worker socket: %s (%zu body bytes, %d payloads)",
                      wire_type_name(m.type), m.body_len, m.n_payloads);
        reg_on_message(c, &m);
        wire_msg_close(&m);
    }
}

static void coord_signal(coord *c)
{
    struct signalfd_siginfo si;
    while (read(c->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP)
            log_warn("SIGHUP: reloading the cluster spec is not implemented yet; ignored");
        else
            coord_stop(c, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
    }
}

/* Heartbeats, liveness, step deadlines and the watchdog. */
static void coord_timers(coord *c)
{
    if (c->now_ms >= c->next_heartbeat_ms) {
        reg_tick(c);
        c->next_heartbeat_ms = c->now_ms + c->spec->heartbeat_ms;
    }
    seq_tick(c);
    if (c->watchdog_ms > 0 && c->now_ms >= c->next_watchdog_ms) {
        sdn_notify("WATCHDOG=1"); /* the loop turned: that is the liveness we vouch for */
        c->next_watchdog_ms = c->now_ms + (int64_t)c->watchdog_ms;
    }
}

static long coord_poll_timeout(const coord *c)
{
    int64_t next = c->next_heartbeat_ms;
    int64_t s = seq_next_deadline(c);
    if (s < next)
        next = s;
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
            coord_signal(c);
        if (n > 0 && (items[0].revents & ZMQ_POLLIN))
            coord_drain_workers(c);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN))
            adm_drain(c);
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
