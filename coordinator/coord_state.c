/*
 * coord_state.c — the cluster's state (forming .. ready .. stopping), the facts each passive
 * module gets from the daemon (reg_env, seq_env, nb_env), replanning after a change, and the
 * beginning of an orderly stop (see coord.h, coord_state.h).
 */
#include "coordinator/coord_state.h"
#include "coordinator/coord_peer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"
#include "common/sdnotify.h"

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

void coord_notify_status(coord *c)
{
    int missing, not_ready;
    reg_counts(c->reg, &missing, &not_ready);
    int n = reg_size(c->reg);
    sdn_notifyf("STATUS=cluster %s %s, epoch %" PRIu64 ": %d/%d workers registered, %d ready",
                c->spec->name, coord_state_name(c->state), plan_current(c->pe)->epoch, n - missing,
                n, n - not_ready);
}

/* How often liveness is checked between heartbeats: a quarter heartbeat, at least 10 ms. */
int64_t coord_liveness_ms(const coord *c)
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
void coord_update_state(coord *c)
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

reg_env coord_reg_env(const coord *c)
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

seq_env coord_seq_env(coord *c)
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

nb_env coord_nb_env(const coord *c)
{
    const plan_table *p = plan_current(c->pe);
    return (nb_env){.spec = c->spec,
                    .epoch = p->epoch,
                    .member = p->member,
                    .now_ms = c->now_ms,
                    .all_ready = coord_compute_state(c) == COORD_READY && !c->stop};
}

/* The ranks that may own experts now: registered, usable, not drained, not quarantined from the
 * data plane (coord_peer.h). */
void coord_eligible(const coord *c, uint8_t *eligible)
{
    for (int r = 0; r < c->spec->n_workers; r++)
        eligible[r] = reg_can_own(c->reg, r) && !plan_drained(c->pe, r) && !coord_quarantined(c, r);
}

int coord_replan(coord *c, bool from_base, bool force, const char *fmt, ...)
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

/* Begin an orderly stop (SIGTERM, admin SHUTDOWN): stop taking work, answer queued requests
 * with ERR_SHUTTING_DOWN, send SHUTDOWN to the workers; the loop exits after this iteration. */
void coord_stop(coord *c, const char *reason)
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
