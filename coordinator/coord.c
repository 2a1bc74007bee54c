/*
 * coord.c — the coordinator's sockets, its poll loop and the order of events (see coord.h).
 */
#include "coordinator/coord.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/auth.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/safetensors.h"
#include "common/sdnotify.h"
#include "common/wire.h"
#include "coordinator/admin.h"
#include "coordinator/cmetrics.h"
#include "coordinator/keys.h"
#include "coordinator/ncclboot.h"
#include "coordinator/outbox.h"
#include "coordinator/registry.h"
#include "coordinator/reload.h"
#include "coordinator/sequencer.h"
#include "coordinator/stats.h"

/* Worker messages handled per loop iteration before the admin socket gets its turn. */
#define COORD_BATCH 64
/* What one loop turn takes from the admin socket before the timers run: at most COORD_BATCH
 * messages, and no more once COORD_ADMIN_TURN_BYTES were taken or COORD_ADMIN_TURN_MS passed
 * (the first message is always taken). Heartbeats and liveness must run on time whatever a
 * client sends: 64 forwards of the largest size were 32 GiB for one turn. */
#define COORD_ADMIN_TURN_BYTES (64u << 20)
#define COORD_ADMIN_TURN_MS    10
/* Admin messages libzmq may queue per connection before the loop reads them (ZMQ_RCVHWM; the
 * default is 1000): a client sending faster than the loop reads waits in TCP instead of in the
 * coordinator's memory, whatever the loop is busy with. A client has one request in flight
 * (epmoectl) or a few; the forward queue itself holds EP_MAX_QUEUED_STEPS. */
#define COORD_ADMIN_RCVHWM 8
/* How long the last messages (SHUTDOWN to workers, the SHUTDOWN reply) may take to leave when
 * the daemon stops; LINGER is 0 the rest of the time. */
#define COORD_STOP_LINGER_MS 1000

struct coord {
    spec_cluster *spec; /* the running spec (a reload swaps it) */
    mc_config cfg;
    uint64_t config_hash; /* mc_hash(&cfg) */
    uint64_t session;     /* random per start: WELCOME, STEP and the data plane carry it */
    keys_cluster keys;    /* security: (spec->secure) */
    keys_cluster rl_keys; /* the keys of a reload waiting to be swapped in */
    auth_zap *zap;        /* security: admits workers and operators by key */
    /* the checkpoint's fingerprint as found at start (WELCOME.checkpoint) */
    Epmoe__CheckpointFile *ckpt;
    Epmoe__CheckpointFile **ckpt_ps;
    size_t n_ckpt;
    plan_epochs *pe; /* placement and its epochs */
    void *zctx;
    void *wsock; /* ROUTER coordinator.listen (workers) */
    void *asock; /* ROUTER coordinator.admin (operators) */
    int sigfd;   /* signalfd for SIGTERM, SIGINT (stop) and SIGHUP (reload) */
    reg_registry *reg;
    seq_sequencer *seq;
    nb_boot *nb; /* data_plane nccl: the communicator of the epoch; NULL for zmq */
    ob_box out;  /* what the handlers of the current input returned, not yet settled */
    coord_state state;
    bool stop;      /* leave the loop after this iteration */
    int64_t now_ms; /* CLOCK_MONOTONIC, refreshed once per loop iteration */
    int64_t next_heartbeat_ms;
    int64_t next_liveness_ms; /* a liveness check every quarter heartbeat */
    uint64_t watchdog_ms;     /* half of WatchdogSec, 0 when off */
    int64_t next_watchdog_ms;
    int64_t change_ms;   /* when the placement change in progress began (0: none) */
    rl_plan reload;      /* a validated reload waiting for the step in flight (spec != NULL) */
    char not_ready[600]; /* seq_env.not_ready */
    stats_window *stats; /* the load window (expert_parallel.window_steps) */
    cmx *mx;             /* Prometheus metrics */
    uint64_t steps_since_rebalance;
    int64_t rebalance_ms;     /* when the rebalance in progress was decided (0: none) */
    uint64_t rebalance_epoch; /* its epoch */
};

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
    case COORD_BLOCKED:
        return "blocked";
    }
    return "?";
}

static void coord_notify_status(coord *c)
{
    int missing, not_ready;
    reg_counts(c->reg, &missing, &not_ready);
    int n = reg_size(c->reg);
    sdn_notifyf("STATUS=cluster %s %s, epoch %" PRIu64 ": %d/%d workers registered, %d ready",
                c->spec->name, coord_state_name(c->state), plan_current(c->pe)->epoch, n - missing,
                n, n - not_ready);
}

/* How often liveness is checked between heartbeats: a quarter heartbeat, at least 10 ms. */
static int64_t coord_liveness_ms(const coord *c)
{
    int64_t q = c->spec->heartbeat_ms / 4;
    return q < 10 ? 10 : q;
}

/* Every member of t acknowledged t and is ready. */
static bool coord_members_ready(const coord *c, const plan_table *t)
{
    for (int r = 0; r < t->n_ranks; r++)
        if (t->member[r] && !reg_ready_in(c->reg, r, t->epoch))
            return false;
    return true;
}

static coord_state coord_compute_state(const coord *c)
{
    switch (plan_phase_of(c->pe)) {
    case PLAN_BLOCKED:
        return COORD_BLOCKED;
    case PLAN_FORMING: {
        int missing, not_ready;
        reg_counts(c->reg, &missing, &not_ready);
        return missing > 0 ? COORD_FORMING : COORD_LOADING;
    }
    case PLAN_PENDING:
    case PLAN_APPLYING:
        return COORD_LOADING;
    case PLAN_STABLE:
    case PLAN_STAGING: /* steps run in current while the staged epoch loads */
        break;
    }
    return coord_members_ready(c, plan_current(c->pe)) ? COORD_READY : COORD_LOADING;
}

/* The latest epoch is complete once every member acknowledged it; then recompute the cluster
 * state, log and notify systemd on a change. */
static void coord_update_state(coord *c)
{
    if (c->state == COORD_STOPPING)
        return;
    plan_phase ph = plan_phase_of(c->pe);
    const plan_table *latest = plan_latest(c->pe);
    if ((ph == PLAN_FORMING || ph == PLAN_APPLYING) && coord_members_ready(c, latest)) {
        plan_applied(c->pe);
        stats_epoch(c->stats, latest->epoch);
        if (c->rebalance_ms > 0 && latest->epoch == c->rebalance_epoch) {
            log_info("cluster %s: rebalance epoch %" PRIu64 " served %" PRId64
                     " ms after it was decided",
                     c->spec->name, latest->epoch, c->now_ms - c->rebalance_ms);
            cmx_rebalance_done(c->mx, (double)(c->now_ms - c->rebalance_ms) / 1000.0);
            c->rebalance_ms = 0;
        }
        if (c->change_ms > 0)
            log_info("cluster %s: placement epoch %" PRIu64 " applied by its %d members, %" PRId64
                     " ms after the change began (%s)",
                     c->spec->name, latest->epoch, latest->n_members, c->now_ms - c->change_ms,
                     plan_why(c->pe));
        c->change_ms = 0;
    }
    coord_state s = coord_compute_state(c);
    const plan_table *staged = plan_staged(c->pe);
    cmx_epochs(c->mx, plan_current(c->pe)->epoch, plan_latest(c->pe)->epoch,
               staged ? staged->epoch : 0);
    if (s == COORD_READY && c->nb != NULL && !nb_ready(c->nb))
        s = COORD_LOADING; /* every member loaded, the NCCL communicator not built yet */
    if (s == c->state)
        return;
    log_info("cluster %s: %s -> %s (epoch %" PRIu64 "%s%s)", c->spec->name,
             coord_state_name(c->state), coord_state_name(s), plan_current(c->pe)->epoch,
             s == COORD_BLOCKED ? ": " : "", s == COORD_BLOCKED ? plan_problem(c->pe) : "");
    c->state = s;
    cmx_state(c->mx, coord_state_name(s));
    coord_notify_status(c);
}

/* ---- the facts each passive module gets ---- */

/* Whether the ROUTER still has a connection for ident: with ROUTER_MANDATORY a send to a routing
 * id whose connection closed fails with EHOSTUNREACH, so a HEARTBEAT (harmless to a live worker)
 * is the question. */
static bool coord_connected(void *ctx, const uint8_t *ident, size_t len)
{
    coord *c = ctx;
    Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
    hb.has_epoch = 1;
    hb.epoch = plan_latest(c->pe)->epoch;
    ep_err err;
    if (wire_send(c->wsock, ident, len, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base, NULL, 0, true,
                  &err) == 0)
        return true;
    return zmq_errno() != EHOSTUNREACH; /* EAGAIN: connected, its queue is full */
}

static reg_env coord_reg_env(const coord *c)
{
    return (reg_env){.spec = c->spec,
                     .cfg = &c->cfg,
                     .config_hash = c->config_hash,
                     .session = c->session,
                     .worker_key =
                         c->spec->secure ? (const uint8_t(*)[AUTH_KEY_BYTES])c->keys.worker : NULL,
                     .client_keys = c->spec->secure ? c->keys.serving : NULL,
                     .n_client_keys = c->spec->secure ? (size_t)c->keys.n_serving : 0,
                     .checkpoint = c->ckpt_ps,
                     .n_checkpoint = c->n_ckpt,
                     .connected = coord_connected,
                     .connected_ctx = (void *)c,
                     .plan = plan_latest(c->pe),
                     .now_ms = c->now_ms};
}

static seq_env coord_seq_env(coord *c)
{
    bool ready = c->state == COORD_READY && c->reload.spec == NULL;
    c->not_ready[0] = '\0';
    if (c->state == COORD_BLOCKED)
        snprintf(c->not_ready, sizeof c->not_ready, "%s", plan_problem(c->pe));
    else if (!ready)
        reg_not_ready_text(c->reg, c->not_ready, sizeof c->not_ready);
    if (!ready && c->not_ready[0] == '\0' && c->nb != NULL)
        nb_not_ready_text(c->nb, c->spec, c->not_ready, sizeof c->not_ready);
    /* once formed, a cluster that changes epochs (or swaps in a reloaded spec, or waits for a
     * restarted member) keeps requests queued instead of refusing them */
    bool changing = plan_phase_of(c->pe) != PLAN_FORMING && c->state == COORD_LOADING;
    return (seq_env){.spec = c->spec,
                     .cfg = &c->cfg,
                     .session = c->session,
                     .plan = plan_current(c->pe),
                     .now_ms = c->now_ms,
                     .state = coord_state_name(c->state),
                     .ready = ready,
                     .wait = !ready && (changing || c->reload.spec != NULL),
                     .stopping = c->state == COORD_STOPPING,
                     .not_ready = c->not_ready};
}

static nb_env coord_nb_env(const coord *c)
{
    const plan_table *p = plan_current(c->pe);
    return (nb_env){.spec = c->spec,
                    .epoch = p->epoch,
                    .member = p->member,
                    .now_ms = c->now_ms,
                    .all_ready = coord_compute_state(c) == COORD_READY && !c->stop};
}

/* The ranks that may own experts now: registered, usable, not drained. */
static void coord_eligible(const coord *c, uint8_t *eligible)
{
    for (int r = 0; r < c->spec->n_workers; r++)
        eligible[r] = reg_can_own(c->reg, r) && !plan_drained(c->pe, r);
}

/* Replan after a change (why: for the log and the workers); force: a new epoch even when the
 * table stays. Returns plan_replan's answer. */
static int coord_replan(coord *c, bool from_base, bool force, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int coord_replan(coord *c, bool from_base, bool force, const char *fmt, ...)
{
    char why[EP_ERR_MSG_MAX];
    EP_FORMAT_ARGS(why, sizeof why, fmt);
    uint8_t *eligible = calloc((size_t)c->spec->n_workers, 1);
    if (eligible == NULL) {
        log_error("placement: out of memory (%s)", why);
        return 0;
    }
    coord_eligible(c, eligible);
    bool staging = plan_phase_of(c->pe) == PLAN_STAGING;
    int rc = force ? plan_replan_new(c->pe, eligible, from_base, why)
                   : plan_replan(c->pe, eligible, from_base, why);
    free(eligible);
    if (staging && plan_phase_of(c->pe) != PLAN_STAGING) { /* the change abandoned a rebalance */
        reg_unstage(c->reg);
        c->rebalance_ms = 0;
        cmx_change(c->mx, "abandoned");
        cmx_rebalance(c->mx, "abandoned", -1, 0);
    }
    if (rc != 0 && c->change_ms == 0)
        c->change_ms = c->now_ms;
    return rc;
}

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

/* ---- load statistics and rebalance ---- */

/* Measured max/mean worker load averaged over the layers with load in the current epoch
 * (0: none yet). */
static double coord_measured_balance(const coord *c)
{
    const plan_table *cur = plan_current(c->pe);
    uint8_t *holds = malloc((size_t)cur->n_ranks);
    double sum = 0;
    int n = 0;
    for (int l = 0; holds != NULL && l < cur->n_layers; l++) {
        memset(holds, 0, (size_t)cur->n_ranks);
        for (int e = 0; e < cur->n_experts; e++) {
            int k;
            const uint16_t *reps = plan_replicas(cur, l, e, &k);
            for (int i = 0; i < k; i++)
                holds[reps[i]] = 1;
        }
        double b = stats_measured_balance(c->stats, l, holds);
        if (b > 0) {
            sum += b;
            n++;
        }
    }
    free(holds);
    return n > 0 ? sum / n : 0;
}

/* Plan a rebalance from the window: *t_p is the new table, or NULL when it would change nothing;
 * rep gets the balance before and after. 0, or -1 with err. */
static int coord_plan_rebalance(coord *c, plan_table **t_p, plan_report *rep, double *secs,
                                ep_err *err)
{
    const plan_table *latest = plan_latest(c->pe);
    size_t LE = (size_t)latest->n_layers * latest->n_experts;
    *t_p = NULL;
    if (stats_steps(c->stats) == 0)
        return ep_err_set(err,
                          "no load statistics yet: the window (window_steps %d) has no step of "
                          "this coordinator; run forward steps first",
                          c->spec->window_steps);
    double *w = malloc(LE * sizeof *w);
    uint8_t *eligible = calloc((size_t)c->spec->n_workers, 1);
    if (w == NULL || eligible == NULL) {
        free(w);
        free(eligible);
        return ep_err_set(err, "the coordinator is out of memory");
    }
    stats_weights(c->stats, w);
    coord_eligible(c, eligible);
    double t0 = clk_mono_s();
    *t_p = plan_rebalance(latest, w, eligible, plan_max_per_rank(c->pe), 0, rep, err);
    *secs = clk_mono_s() - t0;
    free(w);
    free(eligible);
    if (*t_p == NULL)
        return -1;
    if (plan_same(*t_p, latest))
        plan_free(t_p);
    return 0;
}

/* Start a staged epoch: workers load what they gain while steps go on in the current one. */
static const plan_table *coord_stage(coord *c, plan_table **t_p, const char *why)
{
    const plan_table *t = plan_stage(c->pe, t_p, why);
    if (t == NULL)
        return NULL;
    reg_env renv = coord_reg_env(c);
    if (reg_send_staged(c->reg, &renv, t, why, &c->out) <= 0) {
        plan_unstage(c->pe, "no worker could be sent the staged epoch");
        reg_unstage(c->reg);
        return NULL;
    }
    log_info("cluster %s: staged placement epoch %" PRIu64 " sent (%d members): %s", c->spec->name,
             t->epoch, t->n_members, why);
    c->rebalance_ms = c->now_ms;
    c->rebalance_epoch = t->epoch;
    cmx_change(c->mx, "staged");
    return t;
}

/* Every member of the staged epoch prepared it. */
static bool coord_staged_prepared(const coord *c)
{
    const plan_table *t = plan_staged(c->pe);
    if (t == NULL)
        return false;
    for (int r = 0; r < t->n_ranks; r++)
        if (t->member[r] && !reg_prepared(c->reg, r, t->epoch))
            return false;
    return true;
}

/* At a step boundary: the staged epoch becomes the one served. */
static void coord_commit(coord *c)
{
    const plan_table *t = plan_commit(c->pe);
    reg_env renv = coord_reg_env(c);
    log_info("cluster %s: committing placement epoch %" PRIu64 " (prepared by its %d members)",
             c->spec->name, t->epoch, t->n_members);
    reg_send_commit(c->reg, &renv, &c->out);
    c->change_ms = c->now_ms;
    cmx_change(c->mx, "epoch");
}

static void coord_on_stage_failed(coord *c, const ob_event *e)
{
    const plan_table *t = plan_staged(c->pe);
    if (t == NULL || t->epoch != e->epoch)
        return;
    char why[EP_ERR_MSG_MAX + 128];
    snprintf(why, sizeof why, "worker %s could not prepare it: %s", c->spec->workers[e->rank].name,
             e->text);
    plan_unstage(c->pe, why);
    reg_unstage(c->reg);
    c->rebalance_ms = 0;
    cmx_change(c->mx, "abandoned");
    cmx_rebalance(c->mx, "abandoned", -1, 0);
}

/* rebalance_every_steps: plan from the window; stage it when it is at least 3 % better. */
static void coord_auto_rebalance(coord *c)
{
    plan_table *t = NULL;
    plan_report rep = {0};
    double secs = 0;
    ep_err err;
    c->steps_since_rebalance = 0;
    if (coord_plan_rebalance(c, &t, &rep, &secs, &err) != 0) {
        log_warn("cluster %s: automatic rebalance: %s", c->spec->name, err.msg);
        cmx_rebalance(c->mx, "failed", -1, 0);
    } else if (t == NULL || rep.balance_after > rep.balance_before * 0.97) {
        log_info("cluster %s: automatic rebalance: balance %.3f, %.3f after a new plan: kept",
                 c->spec->name, rep.balance_before, rep.balance_after);
        cmx_rebalance(c->mx, "unchanged", secs, 0);
    } else {
        char why[160];
        snprintf(why, sizeof why,
                 "rebalance (every %d steps): balance %.3f -> %.3f, %ld replicas move",
                 c->spec->rebalance_every_steps, rep.balance_before, rep.balance_after, rep.moved);
        long moved = rep.moved;
        if (coord_stage(c, &t, why) != NULL)
            cmx_rebalance(c->mx, "applied", secs, moved);
    }
    plan_free(&t);
    plan_report_free(&rep);
}

/* A step closed: metrics, the load window, and the automatic rebalance. */
static void coord_on_step_end(coord *c)
{
    const seq_record *r = seq_last_record(c->seq);
    cmx_step(c->mx, &c->cfg, c->spec, r);
    if (!r->ok)
        return;
    const plan_table *cur = plan_current(c->pe);
    if (r->have_load && r->epoch == cur->epoch && r->expert_tokens != NULL &&
        r->n_ranks == c->spec->n_workers) {
        if (stats_add(c->stats, r->layer, r->epoch, r->expert_tokens, r->rank_pairs) != 0)
            log_warn("statistics: step %" PRIu64 " not recorded (out of memory)", r->step_id);
        cmx_balance(c->mx, &c->cfg, c->spec, c->stats, cur, r->layer);
    }
    int every = c->spec->rebalance_every_steps;
    if (every > 0 && ++c->steps_since_rebalance >= (uint64_t)every &&
        plan_phase_of(c->pe) == PLAN_STABLE && c->state == COORD_READY && !c->stop)
        coord_auto_rebalance(c);
}

/* The load of a worker's serving-path requests (LOAD_REPORT): one entry of the load window,
 * as a step's STEP_DONE is (the serving path has no steps). Reports of another epoch, or with a
 * layer, expert or rank out of range, are dropped. */
static void coord_on_load_report(coord *c, int rank, const wire_msg *m)
{
    ep_err err;
    Epmoe__LoadReport *r =
        (Epmoe__LoadReport *)wire_unpack(&epmoe__load_report__descriptor, m, &err);
    const plan_table *cur = plan_current(c->pe);
    int E = c->cfg.n_routed_experts, P = c->spec->n_workers;
    uint32_t *et = calloc((size_t)E, sizeof *et), *rp = calloc((size_t)P, sizeof *rp);
    bool ok = r && et && rp && r->has_layer && r->layer < (uint32_t)mc_num_layers(&c->cfg) &&
              r->has_epoch && r->epoch == cur->epoch && r->n_routed_expert == r->n_routed_tokens &&
              r->n_pair_rank == r->n_pair_count;
    for (size_t i = 0; ok && i < r->n_routed_expert; i++)
        if ((ok = r->routed_expert[i] < (uint32_t)E))
            et[r->routed_expert[i]] += r->routed_tokens[i];
    for (size_t i = 0; ok && i < r->n_pair_rank; i++)
        if ((ok = r->pair_rank[i] < (uint32_t)P))
            rp[r->pair_rank[i]] += r->pair_count[i];
    if (ok)
        cmx_requests(c->mx, (int)r->layer, r->has_requests ? r->requests : 0,
                     r->has_tokens ? r->tokens : 0, et, E);
    if (ok && stats_add(c->stats, (int)r->layer, r->epoch, et, rp) == 0)
        cmx_balance(c->mx, &c->cfg, c->spec, c->stats, cur, (int)r->layer);
    else
        log_debug(LOG_SUB_PLAN, "LOAD_REPORT from rank %d dropped (%s)", rank,
                  r == NULL ? err.msg : "another epoch, or out of range");
    free(et);
    free(rp);
    uint64_t r_requests = ok && r->has_requests ? r->requests : 0;
    wire_free_unpacked(r ? &r->base : NULL);
    int every = c->spec->rebalance_every_steps;
    if (ok)
        c->steps_since_rebalance += r_requests; /* a request is one layer's step */
    if (ok && every > 0 && c->steps_since_rebalance >= (uint64_t)every &&
        plan_phase_of(c->pe) == PLAN_STABLE && c->state == COORD_READY && !c->stop)
        coord_auto_rebalance(c);
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

static void coord_swap_reload(coord *c);

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

/* ---- reload ---- */

/* Drains carried over by name into a new planner. */
static void coord_carry_drains(const plan_epochs *old, const spec_cluster *os, plan_epochs *pe,
                               const spec_cluster *ns)
{
    for (int r = 0; r < os->n_workers; r++) {
        const spec_worker *w =
            plan_drained(old, r) ? spec_find_worker(ns, os->workers[r].name) : NULL;
        if (w != NULL)
            plan_set_drained(pe, w->rank, true);
    }
}

/* The load window for the running spec: a new one (history lost, logged) when the worker count
 * or window_steps changed. */
static void coord_restat(coord *c, int old_workers, int old_window)
{
    if (c->spec->n_workers == old_workers && c->spec->window_steps == old_window)
        return;
    ep_err err;
    stats_window *s = stats_create(mc_num_layers(&c->cfg), c->cfg.n_routed_experts,
                                   c->spec->n_workers, c->spec->window_steps, &err);
    if (s == NULL) {
        log_error("reload: %s; the load statistics keep their old window", err.msg);
        return;
    }
    stats_destroy(&c->stats);
    c->stats = s;
    log_info("cluster %s: load statistics start over (%d workers, window_steps %d)", c->spec->name,
             c->spec->n_workers, c->spec->window_steps);
}

/* A new world (ranks, peers or timeouts): new registry, planner and sequencer size; every
 * registered worker is welcomed again into the new placement. Returns -1 (old state kept) when
 * memory runs out. */
static int coord_swap_world(coord *c, ep_err *err)
{
    rl_plan *rl = &c->reload;
    bool formed = plan_phase_of(c->pe) != PLAN_FORMING;
    reg_registry *reg = reg_create(rl->spec, err);
    plan_epochs *pe = reg ? plan_epochs_create(rl->base, rl->spec->rejoin,
                                               rl->spec->max_experts_per_worker, formed, err)
                          : NULL;
    if (pe == NULL || seq_resize(c->seq, rl->spec->n_workers, err) != 0) {
        reg_destroy(&reg);
        plan_epochs_destroy(&pe);
        return -1;
    }
    reg_adopt(reg, c->reg, "removed from the cluster spec by a reload", &c->out);
    reg_unstage(reg); /* a rebalance being prepared is abandoned with the old world */
    coord_carry_drains(c->pe, c->spec, pe, rl->spec);
    int old_workers = c->spec->n_workers, old_window = c->spec->window_steps;
    reg_destroy(&c->reg);
    plan_epochs_destroy(&c->pe);
    spec_free(&c->spec);
    c->reg = reg;
    c->pe = pe;
    c->spec = rl->spec;
    rl->spec = NULL;
    c->rebalance_ms = 0;
    coord_restat(c, old_workers, old_window);
    cmx_respec(c->mx, c->spec);
    if (formed) {
        coord_replan(c, plan_rejoin(pe) == SPEC_REJOIN_RESTORE, true, "cluster spec reloaded");
        plan_send(pe);
    }
    reg_env renv = coord_reg_env(c);
    reg_rewelcome(c->reg, &renv, &c->out);
    return 0;
}

/* The reload's keys take over (security: the workers a reload adds are admitted, the
 * operators' directory is read again). Nothing to do without security. */
static void coord_swap_keys(coord *c)
{
    if (!c->spec->secure)
        return;
    ep_err err;
    auth_list *w = keys_worker_list(c->spec, &c->rl_keys, &err);
    auth_list *o = w ? keys_operator_list(&c->rl_keys, &err) : NULL;
    if (w == NULL || o == NULL || auth_zap_allow(c->zap, AUTH_DOMAIN_WORKERS, w, &err) != 0 ||
        auth_zap_allow(c->zap, AUTH_DOMAIN_OPERATORS, o, &err) != 0) {
        if (o == NULL)
            auth_list_free(&w);
        log_error("reload: the new keys cannot be installed (%s); the old allow-lists stay",
                  err.msg);
        keys_free(&c->rl_keys);
        return;
    }
    keys_free(&c->keys);
    c->keys = c->rl_keys;
    memset(&c->rl_keys, 0, sizeof c->rl_keys);
}

/* Swap the validated reload in (no step is in flight). */
static void coord_swap_reload(coord *c)
{
    rl_plan *rl = &c->reload;
    ep_err err;
    int rc = 0;
    if (rl->world_changed) {
        rc = coord_swap_world(c, &err);
    } else if (plan_reconfigure(c->pe, rl->base, rl->spec->rejoin,
                                rl->spec->max_experts_per_worker) != 0) {
        rc = ep_err_set(&err, "out of memory");
    } else {
        reg_respec(c->reg, rl->spec);
        int old_window = c->spec->window_steps;
        spec_free(&c->spec);
        c->spec = rl->spec;
        rl->spec = NULL;
        coord_restat(c, c->spec->n_workers, old_window);
        coord_replan(c, plan_rejoin(c->pe) == SPEC_REJOIN_RESTORE, false, "cluster spec reloaded");
    }
    if (rc != 0) {
        log_error("reload of %s failed while swapping; the old spec keeps serving: %s",
                  rl->spec->file, err.msg);
        keys_free(&c->rl_keys);
    } else {
        coord_swap_keys(c);
        log_info("cluster %s: reloaded cluster spec %s (%s)", c->spec->name, c->spec->file,
                 rl->summary);
    }
    rl_free(rl);
}

/* Build and validate; the swap follows once no step is in flight. 0, or -1 with err. */
static int coord_reload(coord *c, char *summary, size_t cap, ep_err *err)
{
    if (c->reload.spec != NULL)
        return ep_err_set(err, "a reload is already waiting for the step in flight");
    rl_plan rl;
    if (rl_build(c->spec->file, c->spec, &c->cfg, plan_last_epoch(c->pe), &rl, err) != 0 ||
        (rl.spec->secure && keys_load(rl.spec, &c->rl_keys, err) != 0)) {
        log_error("reload of %s failed; the old spec keeps serving: %s", c->spec->file, err->msg);
        rl_free(&rl);
        return -1;
    }
    snprintf(summary, cap, "%s", rl.summary);
    c->reload = rl;
    return 0;
}

/* Bind a ROUTER. No ROUTER_HANDOVER: with it, a peer that connects under a routing id already
 * in use makes libzmq 4.3 abort (stream_engine_base.cpp, !_io_error) — one stranger connecting
 * twice under one id stopped the cluster. Without it a second connection under a used id is
 * never routed to (libzmq ignores it), and workers need no handover: each connection has a
 * routing id of its own (NAME/random/N), and the registry knows a reconnect of the same process
 * by the NAME/random part (registry.h). MAXMSGSIZE is max_msg, the largest frame a peer of the
 * socket may legitimately send (workers: the model's largest, a [EP_MAX_TOKENS, H] bf16 payload;
 * operators: coord_admin_max_frame), so a peer cannot make the daemon buffer more per frame; with
 * security the socket is a CURVE server whose ZAP domain names its allow-list. */
static int coord_bind(coord *c, void *sock, const char *ep, spec_pos pos, const char *key,
                      const char *domain, int64_t max_msg, ep_err *err)
{
    int one = 1;
    int ivl = c->spec->heartbeat_ms;
    int timeout = c->spec->heartbeat_ms * c->spec->liveness;
    if (wire_socket_defaults(sock, max_msg, err) != 0 ||
        (c->spec->secure && auth_server(sock, &c->keys.coordinator, domain, err) != 0) ||
        zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
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

/* The admin socket's MAXMSGSIZE: the largest frame of a legal request. On data_plane zmq no
 * admin request carries a payload (FORWARD is refused: clients submit to the workers), so a
 * frame is at most a body; libzmq then drops a peer that announces a larger frame before it
 * buffers a byte of it. On nccl a FORWARD's hidden payload is the model's largest frame. */
static int64_t coord_admin_max_frame(const coord *c)
{
    return c->nb == NULL ? (int64_t)EP_MAX_CTRL_MSG : mmsg_max_frame(&c->cfg);
}

static int coord_signals(coord *c, ep_err *err)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP); /* reload the cluster spec */
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

/* The wall clock in units of 1/per s: where this run's epochs (per = 1000) and step ids
 * (per = 1000000) start, so that they keep increasing across restarts of the coordinator
 * (a run would need more than one epoch a millisecond, or one step a microsecond, on average
 * to reach the next run's start). */
static uint64_t coord_first_id(uint64_t per)
{
    struct timespec t = clk_wall();
    return (uint64_t)t.tv_sec * per + (uint64_t)t.tv_nsec / (1000000000u / per);
}

/* security: the keys, and the ZAP handler with both allow-lists, before any socket binds. */
static int coord_security(coord *c, ep_err *err)
{
    if (!c->spec->secure)
        return 0;
    if (keys_load(c->spec, &c->keys, err) != 0 || (c->zap = auth_zap_start(c->zctx, err)) == NULL)
        return -1;
    auth_zap_on_refusal(c->zap, cmx_handshake_refused, c->mx); /* zap stops before mx goes */
    auth_list *w = keys_worker_list(c->spec, &c->keys, err);
    if (w == NULL || auth_zap_allow(c->zap, AUTH_DOMAIN_WORKERS, w, err) != 0)
        return -1;
    auth_list *o = keys_operator_list(&c->keys, err);
    if (o == NULL || auth_zap_allow(c->zap, AUTH_DOMAIN_OPERATORS, o, err) != 0)
        return -1;
    log_info("security: CURVE on both sockets; %d worker keys, %d operator keys", c->keys.n_workers,
             auth_list_count(c->keys.operators));
    return 0;
}

/* The checkpoint's fingerprint, broadcast in WELCOME: a worker whose files differ refuses to
 * load. A model directory with no safetensors at all (a config-only directory) has none. */
static int coord_fingerprint(coord *c, ep_err *err)
{
    st_model *m = st_model_open(c->spec->model_path, err);
    if (m == NULL) {
        if (st_model_has_files(c->spec->model_path))
            return ep_err_prefix(err, "%s:%d:%d: model.path: the checkpoint cannot be read",
                                 c->spec->file, c->spec->model_pos.line, c->spec->model_pos.col);
        log_warn("model %s holds no safetensors files: the workers' checkpoint is not checked "
                 "against a fingerprint",
                 c->spec->model_path);
        ep_err_clear(err);
        return 0;
    }
    int n = st_model_nfiles(m);
    c->ckpt = calloc((size_t)n, sizeof *c->ckpt);
    c->ckpt_ps = calloc((size_t)n, sizeof *c->ckpt_ps);
    st_file_print *p = calloc((size_t)n, sizeof *p);
    int rc = c->ckpt && c->ckpt_ps && p ? 0 : ep_err_set(err, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        st_model_print(m, i, &p[i]);
        Epmoe__CheckpointFile *f = &c->ckpt[i];
        epmoe__checkpoint_file__init(f);
        f->name = strdup(p[i].name);
        f->has_size = f->has_mtime_ns = f->has_header_hash = 1;
        f->size = p[i].size;
        f->mtime_ns = p[i].mtime_ns;
        f->header_hash = p[i].header_hash;
        c->ckpt_ps[i] = f;
        c->n_ckpt = (size_t)i + 1;
        if (f->name == NULL)
            rc = ep_err_set(err, "out of memory");
    }
    free(p);
    st_model_close(&m);
    return rc;
}

coord *coord_create(spec_cluster **spec_p, const mc_config *cfg, ep_err *err)
{
    ep_err_clear(err);
    coord *c = calloc(1, sizeof *c);
    if (c == NULL) {
        spec_free(spec_p);
        ep_err_set(err, "out of memory");
        return NULL;
    }
    c->spec = *spec_p;
    *spec_p = NULL;
    const spec_cluster *spec = c->spec;
    c->cfg = *cfg;
    c->config_hash = mc_hash(cfg);
    c->sigfd = -1;
    c->state = COORD_FORMING;
    if (coord_signals(c, err) != 0 || coord_random_session(&c->session, err) != 0)
        goto fail;
    plan_table *base = plan_for_spec(spec, cfg, coord_first_id(1000), err);
    if (base == NULL)
        goto fail;
    c->pe = plan_epochs_create(base, spec->rejoin, spec->max_experts_per_worker, false, err);
    plan_free(&base);
    if (c->pe == NULL)
        goto fail;
    c->reg = reg_create(spec, err);
    if (c->reg == NULL)
        goto fail;
    c->seq = seq_create(spec->n_workers, coord_first_id(1000000), EP_MAX_QUEUED_BYTES, err);
    if (c->seq == NULL)
        goto fail;
    c->stats = stats_create(mc_num_layers(cfg), cfg->n_routed_experts, spec->n_workers,
                            spec->window_steps, err);
    if (c->stats == NULL)
        goto fail;
    c->mx = cmx_create(spec, cfg, err); /* after coord_signals: its thread keeps them blocked */
    if (c->mx == NULL)
        goto fail;
    cmx_state(c->mx, coord_state_name(c->state));
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
    if (coord_security(c, err) != 0 || coord_fingerprint(c, err) != 0)
        goto fail;
    int hwm = COORD_ADMIN_RCVHWM;
    if (zmq_setsockopt(c->asock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0) {
        ep_err_set(err, "zmq_setsockopt(RCVHWM): %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (coord_bind(c, c->wsock, spec->listen, spec->listen_pos, "coordinator.listen",
                   AUTH_DOMAIN_WORKERS, mmsg_max_frame(cfg), err) != 0 ||
        coord_bind(c, c->asock, spec->admin, spec->admin_pos, "coordinator.admin",
                   AUTH_DOMAIN_OPERATORS, coord_admin_max_frame(c), err) != 0)
        goto fail;
    c->now_ms = clk_mono_ms();
    c->next_heartbeat_ms = c->now_ms + spec->heartbeat_ms;
    c->next_liveness_ms = c->now_ms + coord_liveness_ms(c);
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
    auth_zap_stop(&c->zap); /* its REP socket goes before the context */
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    keys_free(&c->keys);
    keys_free(&c->rl_keys);
    for (size_t i = 0; i < c->n_ckpt; i++)
        free(c->ckpt[i].name);
    free(c->ckpt);
    free(c->ckpt_ps);
    reg_destroy(&c->reg);
    nb_destroy(&c->nb);
    plan_epochs_destroy(&c->pe);
    rl_free(&c->reload);
    cmx_destroy(&c->mx);
    stats_destroy(&c->stats);
    spec_free(&c->spec);
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
    case EPMOE__MSG_TYPE__MSG_LOAD_REPORT:
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
    if (m->type == EPMOE__MSG_TYPE__MSG_LOAD_REPORT) {
        coord_on_load_report(c, rank, m);
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

/* The facts the read-only verbs report; workers[] is allocated (free it). */
static int coord_facts(coord *c, adm_facts *f)
{
    reg_env renv = coord_reg_env(c);
    int n = reg_size(c->reg);
    *f = (adm_facts){.spec = c->spec,
                     .cfg = &c->cfg,
                     .config_hash = c->config_hash,
                     .plan = plan_latest(c->pe),
                     .current_epoch = plan_current(c->pe)->epoch,
                     .problem = plan_problem(c->pe),
                     .state = coord_state_name(c->state),
                     .steps_done = seq_steps_done(c->seq),
                     .steps_failed = seq_steps_failed(c->seq),
                     .balance = coord_measured_balance(c),
                     .staged_epoch = plan_staged(c->pe) ? plan_staged(c->pe)->epoch : 0,
                     .n_workers = n,
                     .worker_key =
                         c->spec->secure ? (const uint8_t(*)[AUTH_KEY_BYTES])c->keys.worker : NULL};
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
        wi[i].has_drained = 1;
        wi[i].drained = plan_drained(c->pe, i);
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

/* DRAIN and UNDRAIN answer the epoch that carries the change, and what happens. */
static void coord_reply_epoch(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq,
                              const char *text)
{
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = c->spec->name;
    rep.has_epoch = 1;
    rep.epoch = plan_last_epoch(c->pe);
    rep.message = (char *)text;
    adm_reply(&c->out, m->ident, m->ident_len, rq->id, &rep, NULL, 0);
}

/* The rank of the worker a DRAIN/UNDRAIN names, or -1 after answering why not. */
static int coord_verb_worker(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq,
                             const char *verb)
{
    const spec_worker *w = rq->worker ? spec_find_worker(c->spec, rq->worker) : NULL;
    if (w == NULL) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "%s: %s%.64s%s is not a worker of cluster spec %s", verb, rq->worker ? "\"" : "",
                  rq->worker ? rq->worker : "no worker named", rq->worker ? "\"" : "",
                  c->spec->file);
        return -1;
    }
    if (plan_phase_of(c->pe) == PLAN_FORMING) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_NOT_READY,
                  "%s %s: cluster %s is still forming its first placement", verb, w->name,
                  c->spec->name);
        return -1;
    }
    return w->rank;
}

static void coord_on_drain(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq)
{
    int r = coord_verb_worker(c, m, rq, "DRAIN");
    if (r < 0)
        return;
    const char *name = c->spec->workers[r].name;
    char text[EP_ERR_MSG_MAX + 128];
    if (!plan_drained(c->pe, r)) {
        uint8_t *eligible = calloc((size_t)c->spec->n_workers, 1);
        ep_err err;
        if (eligible == NULL) {
            adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BUSY,
                      "the coordinator is out of memory");
            return;
        }
        coord_eligible(c, eligible);
        eligible[r] = 0;
        int ok = plan_try(c->pe, eligible, &err);
        free(eligible);
        if (ok != 0) {
            adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                      "DRAIN %s: the other workers cannot take its experts: %s", name, err.msg);
            return;
        }
        plan_set_drained(c->pe, r, true);
        coord_replan(c, false, false, "worker %s drained by an operator", name);
    }
    snprintf(text, sizeof text,
             "worker %s is drained; it owns no experts from placement epoch %" PRIu64
             " on and can be stopped once that epoch is current",
             name, plan_last_epoch(c->pe));
    coord_reply_epoch(c, m, rq, text);
}

static void coord_on_undrain(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq)
{
    int r = coord_verb_worker(c, m, rq, "UNDRAIN");
    if (r < 0)
        return;
    const char *name = c->spec->workers[r].name;
    if (plan_drained(c->pe, r)) {
        plan_set_drained(c->pe, r, false);
        coord_replan(c, plan_rejoin(c->pe) == SPEC_REJOIN_RESTORE, false,
                     "worker %s undrained by an operator", name);
    }
    const char *how = plan_is_member(plan_latest(c->pe), r) || plan_phase_of(c->pe) == PLAN_PENDING
                          ? "it may own experts again"
                      : !reg_can_own(c->reg, r) ? "it gets experts once it is registered and ready"
                      : plan_rejoin(c->pe) == SPEC_REJOIN_STAY
                          ? "it waits as a spare (rejoin: stay)"
                          : "no expert moves";
    char text[EP_ERR_MSG_MAX];
    snprintf(text, sizeof text, "worker %s is not drained; %s (placement epoch %" PRIu64 ")", name,
             how, plan_last_epoch(c->pe));
    coord_reply_epoch(c, m, rq, text);
}

static void coord_on_reload(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq)
{
    char summary[EP_ERR_MSG_MAX], text[EP_ERR_MSG_MAX + 128];
    ep_err err;
    if (coord_reload(c, summary, sizeof summary, &err) != 0) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "reload failed, the old cluster spec keeps serving: %s", err.msg);
        return;
    }
    snprintf(text, sizeof text, "cluster spec %s reloaded: %s", c->spec->file, summary);
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = c->spec->name;
    rep.message = text;
    adm_reply(&c->out, m->ident, m->ident_len, rq->id, &rep, NULL, 0);
}

/* REBALANCE [dry_run]: plan from the window, report, and (unless dry_run, and when something
 * moves) start the staged epoch. */
static void coord_on_rebalance(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq)
{
    bool dry = rq->has_dry_run && rq->dry_run;
    plan_phase ph = plan_phase_of(c->pe);
    if (c->spec->data_plane == SPEC_PLANE_NCCL) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "REBALANCE: data_plane nccl routes by one owner per expert in every layer; "
                  "per-layer placement and replicas need data_plane zmq");
        return;
    }
    if (!dry && (ph != PLAN_STABLE || c->state != COORD_READY)) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_NOT_READY,
                  "REBALANCE: cluster %s is %s (placement %s); a rebalance starts from a ready "
                  "cluster with no placement change in progress",
                  c->spec->name, coord_state_name(c->state), plan_phase_name(ph));
        return;
    }
    plan_table *t = NULL;
    plan_report rep = {0};
    double secs = 0;
    ep_err err;
    if (coord_plan_rebalance(c, &t, &rep, &secs, &err) != 0) {
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_NOT_READY,
                  "REBALANCE: %s", err.msg);
        cmx_rebalance(c->mx, "failed", -1, 0);
        return;
    }
    adm_rebalance rb = {.epoch_before = plan_current(c->pe)->epoch,
                        .report = &rep,
                        .plan_seconds = secs,
                        .window_steps = stats_steps(c->stats),
                        .cfg = &c->cfg,
                        .stats = c->stats,
                        .current = plan_current(c->pe)};
    rb.epoch_after = rb.epoch_before;
    long moved = t != NULL ? rep.moved : 0;
    if (!dry && t != NULL) {
        char why[200];
        snprintf(why, sizeof why,
                 "rebalance by an operator: balance %.3f -> %.3f, %ld replicas move",
                 rep.balance_before, rep.balance_after, rep.moved);
        const plan_table *st = coord_stage(c, &t, why);
        if (st != NULL) {
            rb.epoch_after = st->epoch;
            rb.applied = true;
            cmx_rebalance(c->mx, "applied", secs, moved);
        }
    } else if (!dry) {
        cmx_rebalance(c->mx, "unchanged", secs, 0);
    }
    rep.moved = moved; /* nothing moves when the plan is the placement in force */
    adm_reply_rebalance(&c->out, m, rq->id, c->spec->name, &rb);
    plan_free(&t);
    plan_report_free(&rep);
}

/* One admin request; takes ownership of m (heap). */
static void coord_on_admin(coord *c, wire_msg *m)
{
    Epmoe__AdminRequest *rq = adm_parse(m, &c->out);
    if (rq == NULL)
        goto done;
    if (rq->verb != EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO && keys_is_client(wire_user_id(m))) {
        /* security.client_keys: the serving path's keys are no operator's */
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_REFUSED,
                  "a client key may only read CLIENT_INFO (key %s, verb %d)",
                  wire_user_id(m) + sizeof KEYS_CLIENT_PREFIX - 1, (int)rq->verb);
        goto done;
    }
    if (rq->verb == EPMOE__ADMIN_VERB__ADMIN_FORWARD && c->nb == NULL) {
        /* the serving path: tokens go from clients to entry workers, never through here */
        adm_error(&c->out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "FORWARD is not the coordinator's on data_plane zmq: clients submit to the "
                  "workers (libepmoe, epmoectl forward; docs/client.md), the coordinator carries "
                  "no token");
        goto done;
    }
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
    case EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO:
        adm_reply_client_info(&c->out, m, rq->id, &f);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN:
        adm_reply_shutdown(&c->out, m, rq->id, &f);
        coord_stop(c, "admin SHUTDOWN");
        break;
    case EPMOE__ADMIN_VERB__ADMIN_DRAIN:
        coord_on_drain(c, m, rq);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_UNDRAIN:
        coord_on_undrain(c, m, rq);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_RELOAD:
        coord_on_reload(c, m, rq);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_REBALANCE:
        coord_on_rebalance(c, m, rq);
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

/* Heartbeats, liveness, step deadlines and the watchdog. */
static void coord_timers(coord *c)
{
    if (c->now_ms >= c->next_heartbeat_ms) {
        reg_env renv = coord_reg_env(c);
        reg_tick(c->reg, &renv, &c->out);
        cmx_workers(c->mx, c->spec, c->reg, plan_latest(c->pe));
        c->next_heartbeat_ms = c->now_ms + c->spec->heartbeat_ms;
        c->next_liveness_ms = c->now_ms + coord_liveness_ms(c);
        coord_settle(c);
    } else if (c->now_ms >= c->next_liveness_ms) {
        reg_env renv = coord_reg_env(c);
        reg_expire(c->reg, &renv, &c->out);
        c->next_liveness_ms = c->now_ms + coord_liveness_ms(c);
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
    if (c->watchdog_ms > 0 && c->next_watchdog_ms < c->now_ms + 1) {
        sdn_notify("WATCHDOG=1"); /* the loop turned: that is the liveness we vouch for */
        c->next_watchdog_ms = c->now_ms + (int64_t)c->watchdog_ms;
    }
}

static long coord_poll_timeout(coord *c)
{
    int64_t next = c->next_heartbeat_ms;
    if (c->next_liveness_ms < next)
        next = c->next_liveness_ms;
    seq_env senv = coord_seq_env(c);
    int64_t s = seq_next_deadline(c->seq, &senv);
    if (s < next)
        next = s;
    if (c->nb != NULL && nb_next_deadline(c->nb) < next)
        next = nb_next_deadline(c->nb);
    if (c->watchdog_ms > 0 && c->next_watchdog_ms < next)
        next = c->next_watchdog_ms;
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
