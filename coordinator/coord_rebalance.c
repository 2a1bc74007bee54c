/*
 * coord_rebalance.c — the load window and the rebalance policy (see coord.h): what the workers
 * report goes into the window; REBALANCE and rebalance_every_steps plan from it, stage the new
 * epoch while steps go on in the current one, and commit it at a step boundary once every member
 * has prepared it. An automatic rebalance is staged only when it is at least 3 % better.
 */
#include "coordinator/coord_rebalance.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "coordinator/coord_state.h"

/* Measured max/mean worker load averaged over the layers with load in the current epoch
 * (0: none yet). */
double coord_measured_balance(const coord *c)
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
int coord_plan_rebalance(coord *c, plan_table **t_p, plan_report *rep, double *secs, ep_err *err)
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
const plan_table *coord_stage(coord *c, plan_table **t_p, const char *why)
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
bool coord_staged_prepared(const coord *c)
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
void coord_commit(coord *c)
{
    const plan_table *t = plan_commit(c->pe);
    reg_env renv = coord_reg_env(c);
    log_info("cluster %s: committing placement epoch %" PRIu64 " (prepared by its %d members)",
             c->spec->name, t->epoch, t->n_members);
    reg_send_commit(c->reg, &renv, &c->out);
    c->change_ms = c->now_ms;
    cmx_change(c->mx, "epoch");
}

void coord_on_stage_failed(coord *c, const ob_event *e)
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
void coord_on_step_end(coord *c)
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

/* Requests answered and failed, as an entry reported them: STATUS's counts and rate. */
static void coord_served(coord *c, const Epmoe__LoadReport *r)
{
    int64_t sec = clk_mono_ms() / 1000;
    int i = (int)(sec % COORD_RATE_S);
    if (c->served_sec[i] != sec) {
        c->served_sec[i] = sec;
        c->served_in[i] = 0;
    }
    uint64_t ok = r->has_answered ? r->answered : r->requests; /* a worker before issue 23 */
    c->served_ok += ok;
    c->served_in[i] += ok;
    for (size_t j = 0; j < r->n_failed_count; j++)
        c->served_failed += r->failed_count[j];
}

double coord_served_rate(const coord *c)
{
    int64_t sec = clk_mono_ms() / 1000;
    uint64_t n = 0;
    for (int i = 0; i < COORD_RATE_S; i++)
        if (c->served_sec[i] > sec - COORD_RATE_S)
            n += c->served_in[i];
    return (double)n / COORD_RATE_S;
}

/* The report's load into the window (its epoch's, in range): false when it does not enter. */
static bool coord_load_window(coord *c, const Epmoe__LoadReport *r)
{
    const plan_table *cur = plan_current(c->pe);
    int E = c->cfg.n_routed_experts, P = c->spec->n_workers;
    if (!r->has_epoch || r->epoch != cur->epoch || r->requests == 0 ||
        r->n_routed_expert != r->n_routed_tokens || r->n_pair_rank != r->n_pair_count)
        return false;
    uint32_t *et = calloc((size_t)E, sizeof *et), *rp = calloc((size_t)P, sizeof *rp);
    bool ok = et && rp;
    for (size_t i = 0; ok && i < r->n_routed_expert; i++)
        if ((ok = r->routed_expert[i] < (uint32_t)E))
            et[r->routed_expert[i]] += r->routed_tokens[i];
    for (size_t i = 0; ok && i < r->n_pair_rank; i++)
        if ((ok = r->pair_rank[i] < (uint32_t)P))
            rp[r->pair_rank[i]] += r->pair_count[i];
    if (ok)
        cmx_requests(c->mx, (int)r->layer, 0, r->has_tokens ? r->tokens : 0, et, E);
    if (ok && (ok = stats_add(c->stats, (int)r->layer, r->epoch, et, rp) == 0))
        cmx_balance(c->mx, &c->cfg, c->spec, c->stats, cur, (int)r->layer);
    free(et);
    free(rp);
    return ok;
}

void coord_on_load_report(coord *c, int rank, const wire_msg *m)
{
    ep_err err;
    Epmoe__LoadReport *r =
        (Epmoe__LoadReport *)wire_unpack(&epmoe__load_report__descriptor, m, &err);
    if (r == NULL || !r->has_layer || r->layer >= (uint32_t)mc_num_layers(&c->cfg)) {
        log_debug(LOG_SUB_PLAN, "LOAD_REPORT from rank %d dropped (%s)", rank,
                  r == NULL ? err.msg : "no layer, or out of range");
        wire_free_unpacked(r ? &r->base : NULL);
        return;
    }
    coord_served(c, r);
    cmx_requests(c->mx, (int)r->layer, r->has_answered ? r->answered : r->requests, 0, NULL, 0);
    cmx_served(c->mx, (int)r->layer, r);
    bool ok = coord_load_window(c, r);
    if (!ok && r->requests > 0)
        log_debug(LOG_SUB_PLAN,
                  "LOAD_REPORT from rank %d: its load is not in the window "
                  "(another epoch, or out of range)",
                  rank);
    uint64_t r_requests = ok ? r->requests : 0;
    wire_free_unpacked(&r->base);
    int every = c->spec->rebalance_every_steps;
    c->steps_since_rebalance += r_requests; /* a request is one layer's step */
    if (r_requests > 0 && every > 0 && c->steps_since_rebalance >= (uint64_t)every &&
        plan_phase_of(c->pe) == PLAN_STABLE && c->state == COORD_READY && !c->stop)
        coord_auto_rebalance(c);
}
