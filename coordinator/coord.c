/*
 * coord.c — the coordinator's poll loop and the order of events (see coord.h): it reads the
 * worker socket, the admin socket and the signals, runs the timers, and after each input settles
 * (sends what the handlers returned, routes their events one at a time). What the loop calls
 * lives in the module's other files (coord_state.h maps them).
 */
#include "coordinator/coord.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <zmq.h>

#include "common/limits.h"
#include "common/log.h"
#include "common/sdnotify.h"
#include "coordinator/coord_state.h"
#include "coordinator/coord_peer.h"
#include "coordinator/coord_admin.h"
#include "coordinator/coord_rebalance.h"
#include "coordinator/coord_reload.h"

/* Worker messages handled per loop iteration before the admin socket gets its turn. */
#define COORD_BATCH 64
/* What one loop turn takes from the admin socket before the timers run: at most COORD_BATCH
 * messages, and no more once COORD_ADMIN_TURN_BYTES were taken or COORD_ADMIN_TURN_MS passed
 * (the first message is always taken). Heartbeats and liveness must run on time whatever a
 * client sends: 64 forwards of the largest size were 32 GiB for one turn. */
#define COORD_ADMIN_TURN_BYTES (64u << 20)
#define COORD_ADMIN_TURN_MS    10
/* How long the last messages (SHUTDOWN to workers, the SHUTDOWN reply) may take to leave when
 * the daemon stops; LINGER is 0 the rest of the time. */
#define COORD_STOP_LINGER_MS 1000

/* ---- settling: send what the handlers returned, route their events ---- */

static void coord_free_payloads(ob_msg *m)
{
    for (int i = 0; i < m->n_payloads; i++)
        if (m->payload[i].free_fn)
            m->payload[i].free_fn((void *)m->payload[i].data, m->payload[i].hint);
}

static void coord_send(coord *c, ob_msg *m)
{
    void *sock = m->to == OB_TO_ADMIN ? c->asock : c->wsock;
    const uint8_t *ident = m->ident;
    size_t len = m->ident_len;
    int rank = m->rank;
    if (m->to == OB_TO_RANK) {
        reg_worker *w = reg_worker_at(c->reg, m->rank);
        ident = w ? w->ident : NULL;
        len = w ? w->ident_len : 0;
    } else if (m->to == OB_TO_WORKER_ID) {
        reg_worker *w = reg_find_ident(c->reg, m->ident, m->ident_len);
        rank = w && reg_registered(w) ? w->spec->rank : -1;
    }
    ep_err err;
    int rc, zerr = 0;
    if (len == 0) {
        ep_err_set(&err, "sending %s: the worker has never registered", wire_type_name(m->type));
        coord_free_payloads(m);
        rc = -1;
    } else {
        rc = wire_send_packed(sock, ident, len, m->type, m->body, m->body_len, m->payload,
                              m->n_payloads, true, &err);
        zerr = rc != 0 ? zmq_errno() : 0;
    }
    ob_mark_sent(&c->out);
    if (rc == 0)
        return;
    log_debug(LOG_SUB_NET, "%s to %s: %s", wire_type_name(m->type),
              m->to == OB_TO_ADMIN ? "an admin client" : "a worker", err.msg);
    /* ROUTER_MANDATORY: the routing id is gone, so is the worker's connection. Declared dead
     * first, so that a step it was part of fails naming the loss and the epoch change. */
    if (zerr == EHOSTUNREACH && m->to != OB_TO_ADMIN && rank >= 0 &&
        reg_registered(reg_worker_at(c->reg, rank)))
        reg_unreachable(c->reg, rank, zmq_strerror(zerr), &c->out);
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

/* A worker is gone: a new placement for the survivors (once the cluster has formed), then the
 * step in flight fails naming the worker and the epoch change. */
static void coord_on_lost(coord *c, const ob_event *e)
{
    const char *name = c->spec->workers[e->rank].name;
    char why[EP_ERR_MSG_MAX + 256];
    coord_peer_forget(c, e->rank); /* dead for both planes now: it registers afresh */
    int rc = coord_replan(c, false, false, "worker %s lost: %s", name, e->text);
    if (rc > 0)
        snprintf(why, sizeof why,
                 "%s; placement epoch %" PRIu64 " -> %" PRIu64
                 " moves its experts to the other workers",
                 e->text, plan_current(c->pe)->epoch, plan_last_epoch(c->pe));
    else if (rc < 0)
        snprintf(why, sizeof why, "%s; the cluster is blocked: %s", e->text, plan_problem(c->pe));
    else
        snprintf(why, sizeof why, "%s", e->text);
    coord_update_state(c);
    seq_env senv = coord_seq_env(c);
    seq_worker_lost(c->seq, &senv, e->rank, why, &c->out);
}

/* A worker acknowledged an epoch. One that owns nothing in the latest epoch and is not drained
 * has come back: rejoin restore gives the spec's placement back; stay keeps it as a spare (a
 * blocked cluster replans with it). */
static void coord_on_ready(coord *c, const ob_event *e)
{
    plan_phase ph = plan_phase_of(c->pe);
    bool restore = plan_rejoin(c->pe) == SPEC_REJOIN_RESTORE;
    const char *name = c->spec->workers[e->rank].name;
    if (ph == PLAN_FORMING || plan_drained(c->pe, e->rank))
        return;
    if (ph == PLAN_BLOCKED) /* one more worker may be all a blocked cluster needs */
        coord_replan(c, restore, false, "worker %s is ready (rejoin: %s)", name,
                     spec_rejoin_name(plan_rejoin(c->pe)));
    else if (!plan_is_member(plan_latest(c->pe), e->rank) && restore)
        coord_replan(c, true, false, "worker %s rejoined (rejoin: restore)", name);
}

/* A member's load failed: the cluster cannot become ready without it, so it is blocked with
 * the reason (forwards refused at once) until a change replans. Also when no epoch is being
 * applied: a restarted member that keeps its experts loads them again under the current epoch,
 * and waiting for it would leave the cluster `loading` for ever, every forward timing out. The
 * first placement (forming) refuses forwards already and names the worker. */
static void coord_on_load_failed(coord *c, const ob_event *e)
{
    plan_phase ph = plan_phase_of(c->pe);
    const plan_table *t =
        ph == PLAN_STABLE || ph == PLAN_STAGING ? plan_current(c->pe) : plan_latest(c->pe);
    if (ph == PLAN_FORMING || ph == PLAN_BLOCKED || !plan_is_member(t, e->rank))
        return;
    char problem[EP_ERR_MSG_MAX];
    snprintf(problem, sizeof problem,
             "worker %s could not load its experts of epoch %" PRIu64 ": %s",
             c->spec->workers[e->rank].name, t->epoch, e->text);
    if (ph == PLAN_STAGING)
        reg_unstage(c->reg); /* plan_block drops the staged epoch */
    plan_block(c->pe, problem);
}

/* Hand one event to the module that handles it. */
static void coord_route(coord *c, const ob_event *e)
{
    seq_env senv = coord_seq_env(c);
    switch (e->kind) {
    case OB_EV_LOST:
        coord_on_lost(c, e);
        break;
    case OB_EV_DECLARE_DEAD:
        reg_declare_dead(c->reg, e->rank, e->text, &c->out);
        break;
    case OB_EV_READY:
        coord_on_ready(c, e);
        break;
    case OB_EV_SEND_FAILED:
        seq_send_failed(c->seq, &senv, e->rank, e->step_id, e->text, &c->out);
        break;
    case OB_EV_ERROR: {
        reg_worker *w = reg_worker_at(c->reg, e->rank);
        if (w != NULL)
            reg_set_error(w, "%s", e->text);
        break;
    }
    case OB_EV_LOAD_FAILED:
        coord_on_load_failed(c, e);
        break;
    case OB_EV_PREPARED: /* coord_settle commits once every member has prepared */
        break;
    case OB_EV_STAGE_FAILED:
        coord_on_stage_failed(c, e);
        break;
    case OB_EV_STEP_END:
        coord_on_step_end(c);
        break;
    }
}

/* A decided epoch is sent once no step is in flight (a step never spans two epochs). */
static void coord_send_epoch(coord *c)
{
    const plan_table *t = plan_send(c->pe);
    reg_env renv = coord_reg_env(c);
    log_info("cluster %s: sending placement epoch %" PRIu64 " (%d members): %s", c->spec->name,
             t->epoch, t->n_members, plan_why(c->pe));
    reg_send_epoch(c->reg, &renv, plan_why(c->pe), &c->out);
    cmx_change(c->mx, "epoch");
}

/* After every input: send, route events in order, send a decided epoch or swap a reloaded spec
 * when no step is in flight, and let the sequencer move on only when nothing else is pending.
 * Each pass hands one event to one module, so no handler runs inside another. */
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
        if (!seq_busy(c->seq) && c->reload.spec != NULL && !c->stop) {
            coord_swap_reload(c);
            continue;
        }
        if (!seq_busy(c->seq) && plan_phase_of(c->pe) == PLAN_PENDING && !c->stop) {
            coord_send_epoch(c);
            continue;
        }
        if (!seq_busy(c->seq) && coord_staged_prepared(c) && !c->stop) {
            coord_commit(c);
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
    /* the per-worker gauges follow each change, not the next heartbeat (set only on change) */
    cmx_workers(c->mx, c->spec, c->reg, plan_latest(c->pe));
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
    case EPMOE__MSG_TYPE__MSG_LOAD_REPORT:
    case EPMOE__MSG_TYPE__MSG_PEER_UNREACHABLE:
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

/* A coordinator that was restarted keeps the session its workers serve in: the first REGISTER
 * of a spec worker that names one sets it, before anyone is welcomed (Register.session). The
 * workers welcomed again one after the other then keep exchanging their requests' DISPATCHes
 * (a new random session made each drop those of the others, silently, until the client's
 * resend). */
static void coord_adopt_session(coord *c, const wire_msg *m)
{
    if (c->session_fixed)
        return;
    Epmoe__Register *r = (Epmoe__Register *)wire_unpack(&epmoe__register__descriptor, m, NULL);
    if (r != NULL && r->name != NULL && spec_find_worker(c->spec, r->name) != NULL) {
        c->session_fixed = true;
        if (r->has_session && r->session != 0 && r->session != c->session) {
            c->session = r->session;
            log_info("session %016llx of worker %s taken over (its session before this "
                     "coordinator started)",
                     (unsigned long long)c->session, r->name);
        }
    }
    wire_free_unpacked(r ? &r->base : NULL);
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
        coord_adopt_session(c, m);
        renv = coord_reg_env(c);
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
    if (m->type == EPMOE__MSG_TYPE__MSG_LOAD_REPORT) {
        coord_on_load_report(c, rank, m);
        return;
    }
    if (m->type == EPMOE__MSG_TYPE__MSG_PEER_UNREACHABLE) {
        coord_on_peer_report(c, rank, m);
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
        cmx_received(c->mx, "workers", &m);
        coord_on_worker(c, &m);
        wire_msg_close(&m);
        coord_settle(c);
    }
}

/* The bytes a received message holds (its frames). */
static size_t coord_msg_bytes(const wire_msg *m)
{
    size_t n = m->body_len;
    for (int i = 0; i < m->n_payloads; i++)
        n += m->payload_len[i];
    return n;
}

/* Admin requests until the turn's share is used up (COORD_ADMIN_TURN_*): what is left waits in
 * libzmq for the next turn, after the timers. */
static void coord_read_admin(coord *c)
{
    int64_t t0 = clk_mono_ms();
    size_t taken = 0;
    for (int i = 0; i < COORD_BATCH && !c->stop; i++) {
        if (i > 0 && (taken >= COORD_ADMIN_TURN_BYTES || clk_mono_ms() - t0 >= COORD_ADMIN_TURN_MS))
            return;
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
            taken += coord_msg_bytes(m);
            cmx_received(c->mx, "admin", m);
            coord_on_admin(c, m);
        }
        coord_settle(c);
    }
}

static void coord_read_signals(coord *c)
{
    struct signalfd_siginfo si;
    while (read(c->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP) {
            char summary[EP_ERR_MSG_MAX];
            ep_err err;
            if (coord_reload(c, summary, sizeof summary, &err) == 0)
                log_info("SIGHUP: cluster spec %s validated: %s", c->spec->file, summary);
        } else {
            coord_stop(c, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
        }
    }
    coord_settle(c);
}

/* ---- timers ---- */

/* One periodic duty of the loop: when it is next due (INT64_MAX: never; the poll timeout is the
 * nearest) and what it does. A row marked every_turn runs on every turn whatever its due time:
 * its module keeps its own deadlines. The rows run in order; the heartbeat, which also checks
 * liveness, moves the liveness check on, so the two never run in the same turn. */
typedef struct coord_timer {
    const char *name;
    int64_t (*due)(coord *c);
    void (*run)(coord *c);
    bool every_turn;
} coord_timer;

static int64_t coord_heartbeat_due(coord *c)
{
    return c->next_heartbeat_ms;
}

static void coord_heartbeat(coord *c)
{
    reg_env renv = coord_reg_env(c);
    reg_tick(c->reg, &renv, &c->out);
    cmx_workers(c->mx, c->spec, c->reg, plan_latest(c->pe));
    c->next_heartbeat_ms = c->now_ms + c->spec->heartbeat_ms;
    c->next_liveness_ms = c->now_ms + coord_liveness_ms(c);
    coord_settle(c);
}

static int64_t coord_liveness_due(coord *c)
{
    return c->next_liveness_ms;
}

static void coord_liveness(coord *c)
{
    reg_env renv = coord_reg_env(c);
    reg_expire(c->reg, &renv, &c->out);
    c->next_liveness_ms = c->now_ms + coord_liveness_ms(c);
    coord_settle(c);
}

static int64_t coord_steps_due(coord *c)
{
    seq_env senv = coord_seq_env(c);
    return seq_next_deadline(c->seq, &senv);
}

static void coord_steps(coord *c)
{
    seq_env senv = coord_seq_env(c);
    seq_tick(c->seq, &senv, &c->out);
    coord_settle(c);
}

static int64_t coord_comm_due(coord *c)
{
    return c->nb != NULL ? nb_next_deadline(c->nb) : INT64_MAX;
}

static void coord_comm(coord *c)
{
    if (c->nb == NULL)
        return;
    nb_env nenv = coord_nb_env(c);
    nb_tick(c->nb, &nenv, &c->out);
    coord_settle(c);
}

static int64_t coord_watchdog_due(coord *c)
{
    return c->watchdog_ms > 0 ? c->next_watchdog_ms : INT64_MAX;
}

static void coord_watchdog(coord *c)
{
    sdn_notify("WATCHDOG=1"); /* the loop turned: that is the liveness we vouch for */
    c->next_watchdog_ms = c->now_ms + (int64_t)c->watchdog_ms;
}

static void coord_peer(coord *c)
{
    coord_peer_tick(c);
    coord_settle(c);
}

static const coord_timer coord_timer_table[] = {
    {"heartbeat", coord_heartbeat_due, coord_heartbeat, false},
    {"liveness", coord_liveness_due, coord_liveness, false},
    {"step deadlines", coord_steps_due, coord_steps, true},
    {"NCCL bootstrap", coord_comm_due, coord_comm, true},
    {"systemd watchdog", coord_watchdog_due, coord_watchdog, false},
    {"data-plane verdicts", coord_peer_due, coord_peer, false},
};
#define COORD_N_TIMERS (sizeof coord_timer_table / sizeof coord_timer_table[0])

static void coord_timers(coord *c)
{
    for (size_t i = 0; i < COORD_N_TIMERS; i++) {
        const coord_timer *t = &coord_timer_table[i];
        if (t->every_turn || c->now_ms >= t->due(c))
            t->run(c);
    }
}

/* Until the nearest timer, at most a second. */
static long coord_poll_timeout(coord *c)
{
    int64_t next = INT64_MAX;
    for (size_t i = 0; i < COORD_N_TIMERS; i++) {
        int64_t d = coord_timer_table[i].due(c);
        if (d < next)
            next = d;
    }
    int64_t wait = next - clk_mono_ms();
    return wait < 0 ? 0 : wait > 1000 ? 1000 : (long)wait;
}

static void coord_log_plan(const coord *c)
{
    if (!log_debug_enabled(LOG_SUB_PLAN))
        return;
    const plan_table *p = plan_latest(c->pe);
    int *e = malloc((size_t)p->n_experts * sizeof *e);
    for (int r = 0; e != NULL && r < p->n_ranks; r++) {
        int n = plan_rank_experts(p, 0, r, e, p->n_experts);
        log_debug(LOG_SUB_PLAN,
                  "epoch %" PRIu64 ": rank %d (%s) owns %d experts of layer 0, %d..%d (%d over "
                  "all layers)",
                  p->epoch, r, c->spec->workers[r].name, n, n > 0 ? e[0] : -1,
                  n > 0 ? e[n - 1] : -1, plan_rank_slots(p, r));
    }
    free(e);
}

int coord_run(coord *c, ep_err *err)
{
    coord_log_plan(c);
    log_info("cluster %s: serving workers on %s, admin on %s (%d workers, epoch %" PRIu64
             ", placement %s)",
             c->spec->name, c->spec->listen, c->spec->admin, c->spec->n_workers,
             plan_latest(c->pe)->epoch, spec_placement_name(c->spec->placement));
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
        c->now_ms = clk_mono_ms();
        if (n > 0 && (items[2].revents & ZMQ_POLLIN))
            coord_read_signals(c);
        if (n > 0 && (items[0].revents & ZMQ_POLLIN))
            coord_read_workers(c);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN))
            coord_read_admin(c);
        c->now_ms = clk_mono_ms(); /* the timers see the time they run at */
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
