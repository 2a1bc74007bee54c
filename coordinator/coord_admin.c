/*
 * coord_admin.c — what the admin verbs do (see admin.h for their wire format): the read-only
 * verbs report the facts gathered here; DRAIN, UNDRAIN, RELOAD and REBALANCE change the cluster
 * through the state, reload and rebalance files; FORWARD goes to the sequencer.
 */
#include "coordinator/coord_admin.h"

#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/limits.h"
#include "coordinator/admin.h"
#include "coordinator/coord_state.h"
#include "coordinator/coord_rebalance.h"
#include "coordinator/coord_reload.h"

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
                     .cluster_state = (int)c->state + 1, /* the same order, from 1 */
                     .steps_done = seq_steps_done(c->seq),
                     .steps_failed = seq_steps_failed(c->seq),
                     .balance = coord_measured_balance(c),
                     .staged_epoch = plan_staged(c->pe) ? plan_staged(c->pe)->epoch : 0,
                     .requests_served = c->served_ok,
                     .requests_failed = c->served_failed,
                     .request_rate = coord_served_rate(c),
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
void coord_on_admin(coord *c, wire_msg *m)
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

/* coord_facts sends c->state + 1 as the wire's ClusterState */
static_assert(COORD_FORMING + 1 == EPMOE__CLUSTER_STATE__CLUSTER_FORMING, "ClusterState");
static_assert(COORD_LOADING + 1 == EPMOE__CLUSTER_STATE__CLUSTER_LOADING, "ClusterState");
static_assert(COORD_READY + 1 == EPMOE__CLUSTER_STATE__CLUSTER_READY, "ClusterState");
static_assert(COORD_STOPPING + 1 == EPMOE__CLUSTER_STATE__CLUSTER_STOPPING, "ClusterState");
static_assert(COORD_BLOCKED + 1 == EPMOE__CLUSTER_STATE__CLUSTER_BLOCKED, "ClusterState");
