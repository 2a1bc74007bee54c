/*
 * coord_reload.c — swapping a reloaded cluster spec in (see reload.h): reload.c builds and
 * validates the new state without touching the running one; coord_reload keeps it waiting until
 * no step is in flight, then coord_swap_reload puts it in place (a new world, or new placement
 * rules in the same one) and the reload's keys take over. On any failure the old state serves.
 */
#include "coordinator/coord_reload.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/coord_state.h"
#include "coordinator/coord_peer.h"

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
    coord_peer_free(c); /* ranks may have moved: the data-plane verdicts start afresh */
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
    /* the workers' client endpoints too, at once: a key removed from client_keys is served
     * no more (nothing else in the reload needs to welcome anyone) */
    reg_env renv = coord_reg_env(c);
    reg_send_client_keys(c->reg, &renv, &c->out);
}

/* Swap the validated reload in (no step is in flight). The same workers in the same ranks keep
 * the registry and the placement in force (a rebalanced one is not replaced by the spec's: the
 * rules may change, as in any reload); when what WELCOME tells them changed too (timeouts,
 * dispatch, endpoints) each is welcomed again into the latest epoch, keeping all it loaded, and
 * its clients' requests wait for it or go to another member (libepmoe, ERR_NOT_READY). A
 * rebalance being prepared is abandoned with a new world (coord_swap_world). */
void coord_swap_reload(coord *c)
{
    rl_plan *rl = &c->reload;
    ep_err err;
    int rc = 0;
    bool staging = plan_phase_of(c->pe) == PLAN_STAGING;
    if (rl->world_changed && (rl->ranks_changed || staging)) {
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
        if (rl->world_changed)
            cmx_respec(c->mx, c->spec);
        /* only new rules decide the placement again: the one in force may be a rebalance's */
        if (rl->placement_changed)
            coord_replan(c, plan_rejoin(c->pe) == SPEC_REJOIN_RESTORE, false,
                         "cluster spec reloaded");
        if (rl->world_changed) {
            reg_env renv = coord_reg_env(c);
            reg_rewelcome(c->reg, &renv, &c->out);
        }
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
int coord_reload(coord *c, char *summary, size_t cap, ep_err *err)
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
