/*
 * reload.c — build and validate a reloaded cluster spec (see reload.h).
 */
#include "coordinator/reload.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Append to a summary, "; "-separated, cut to fit. */
static void rl_note(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void rl_note(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 8 >= cap)
        return;
    if (len > 0)
        len += (size_t)snprintf(buf + len, cap - len, "; ");
    EP_FORMAT_ARGS(buf + len, cap - len, fmt);
}

/* What the coordinator cannot change while it runs. */
static int rl_check_fixed(const spec_cluster *n, const spec_cluster *o, ep_err *err)
{
    if (strcmp(n->listen, o->listen) != 0)
        return ep_err_set(err,
                          "%s:%d:%d: coordinator.listen: changed from \"%s\" to \"%s\"; the "
                          "coordinator's own endpoints change only with a restart",
                          n->file, n->listen_pos.line, n->listen_pos.col, o->listen, n->listen);
    if (strcmp(n->admin, o->admin) != 0)
        return ep_err_set(err,
                          "%s:%d:%d: coordinator.admin: changed from \"%s\" to \"%s\"; the "
                          "coordinator's own endpoints change only with a restart",
                          n->file, n->admin_pos.line, n->admin_pos.col, o->admin, n->admin);
    if (strcmp(n->metrics, o->metrics) != 0)
        return ep_err_set(err,
                          "%s:%d:%d: coordinator.metrics: changed from \"%s\" to \"%s\"; the "
                          "coordinator's own endpoints change only with a restart",
                          n->file, n->metrics_pos.line, n->metrics_pos.col, o->metrics, n->metrics);
    if (strcmp(n->model_path, o->model_path) != 0)
        return ep_err_set(err,
                          "%s:%d:%d: model.path: changed from \"%s\" to \"%s\"; another model "
                          "needs a new coordinator",
                          n->file, n->model_pos.line, n->model_pos.col, o->model_path,
                          n->model_path);
    if (n->secure != o->secure || strcmp(n->coordinator_key, o->coordinator_key) != 0 ||
        strcmp(n->worker_keys, o->worker_keys) != 0 ||
        strcmp(n->operator_keys, o->operator_keys) != 0 ||
        strcmp(n->client_keys, o->client_keys) != 0) {
        spec_pos at = n->secure ? n->security_pos : n->pos;
        return ep_err_set(err,
                          "%s:%d:%d: security: changed; the coordinator's keys and key "
                          "directories change only with a restart (a reload re-reads the keys in "
                          "them)",
                          n->file, at.line, at.col);
    }
    for (int i = 0; i < n->n_workers; i++) {
        const spec_worker *w = &n->workers[i];
        const spec_worker *ow = spec_find_worker(o, w->name);
        if (ow != NULL && strcmp(ow->device, w->device) != 0)
            return ep_err_set(err,
                              "%s:%d:%d: worker %s: device changed from \"%s\" to \"%s\"; stop "
                              "the worker, reload, then start it on the new device",
                              n->file, w->device_pos.line, w->device_pos.col, w->name, ow->device,
                              w->device);
    }
    return 0;
}

/* Workers added and removed, by name. */
static void rl_membership(const spec_cluster *n, const spec_cluster *o, char *buf, size_t cap)
{
    char added[512] = "", removed[512] = "";
    for (int i = 0; i < n->n_workers; i++)
        if (spec_find_worker(o, n->workers[i].name) == NULL)
            rl_note(added, sizeof added, "%s", n->workers[i].name);
    for (int i = 0; i < o->n_workers; i++)
        if (spec_find_worker(n, o->workers[i].name) == NULL)
            rl_note(removed, sizeof removed, "%s", o->workers[i].name);
    if (added[0])
        rl_note(buf, cap, "workers added: %s", added);
    if (removed[0])
        rl_note(buf, cap, "workers removed: %s", removed);
}

/* Whether what WELCOME told the workers differs, with the differences noted. */
static bool rl_world_changed(const spec_cluster *n, const spec_cluster *o, char *buf, size_t cap)
{
    bool changed = n->n_workers != o->n_workers;
    for (int i = 0; i < n->n_workers && !changed; i++)
        changed = strcmp(n->workers[i].name, o->workers[i].name) != 0 ||
                  strcmp(n->workers[i].data, o->workers[i].data) != 0 ||
                  strcmp(n->workers[i].metrics, o->workers[i].metrics) != 0 ||
                  strcmp(n->workers[i].client, o->workers[i].client) != 0;
    if (changed)
        rl_note(buf, cap, "ranks, data, client endpoints or metrics addresses changed");
    rl_membership(n, o, buf, cap);
    const struct {
        const char *key;
        int was, now;
    } ints[] = {{"heartbeat_ms", o->heartbeat_ms, n->heartbeat_ms},
                {"liveness", o->liveness, n->liveness},
                {"step_timeout_ms", o->step_timeout_ms, n->step_timeout_ms},
                {"dispatch", (int)o->dispatch, (int)n->dispatch},
                {"gpu_gemm", (int)o->gpu_gemm, (int)n->gpu_gemm}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].was == ints[i].now)
            continue;
        changed = true;
        if (strcmp(ints[i].key, "dispatch") == 0)
            rl_note(buf, cap, "dispatch %s -> %s", spec_dispatch_name(o->dispatch),
                    spec_dispatch_name(n->dispatch));
        else if (strcmp(ints[i].key, "gpu_gemm") == 0)
            rl_note(buf, cap, "gpu_gemm %s -> %s", spec_gpu_gemm_name(o->gpu_gemm),
                    spec_gpu_gemm_name(n->gpu_gemm));
        else
            rl_note(buf, cap, "%s %d -> %d", ints[i].key, ints[i].was, ints[i].now);
    }
    return changed;
}

/* Notes the placement rules that changed; whether one that shapes the placement did. */
static bool rl_rules(const spec_cluster *n, const spec_cluster *o, char *buf, size_t cap)
{
    bool shaped =
        n->placement != o->placement || n->max_experts_per_worker != o->max_experts_per_worker ||
        n->redundant_experts != o->redundant_experts || n->expert_groups != o->expert_groups;
    if (n->placement != o->placement)
        rl_note(buf, cap, "placement %s -> %s", spec_placement_name(o->placement),
                spec_placement_name(n->placement));
    if (n->rejoin != o->rejoin)
        rl_note(buf, cap, "rejoin %s -> %s", spec_rejoin_name(o->rejoin),
                spec_rejoin_name(n->rejoin));
    const struct {
        const char *key;
        int was, now;
    } ints[] = {{"max_experts_per_worker", o->max_experts_per_worker, n->max_experts_per_worker},
                {"redundant_experts", o->redundant_experts, n->redundant_experts},
                {"expert_groups", o->expert_groups, n->expert_groups},
                {"window_steps", o->window_steps, n->window_steps},
                {"rebalance_every_steps", o->rebalance_every_steps, n->rebalance_every_steps}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].was != ints[i].now)
            rl_note(buf, cap, "%s %d -> %d", ints[i].key, ints[i].was, ints[i].now);
    return shaped;
}

int rl_build(const char *path, const spec_cluster *old, const mc_config *cfg, uint64_t epoch,
             rl_plan *out, ep_err *err)
{
    *out = (rl_plan){0};
    out->spec = spec_load(path, err);
    if (out->spec == NULL)
        return -1;
    if (spec_check_experts(out->spec, cfg->n_routed_experts, err) != 0 ||
        rl_check_fixed(out->spec, old, err) != 0)
        goto fail;
    out->base = plan_for_spec(out->spec, cfg, epoch, err);
    if (out->base == NULL) {
        ep_err_prefix(err, "%s", out->spec->file);
        goto fail;
    }
    out->world_changed = rl_world_changed(out->spec, old, out->summary, sizeof out->summary);
    out->ranks_changed = out->spec->n_workers != old->n_workers;
    for (int i = 0; i < out->spec->n_workers && !out->ranks_changed; i++)
        out->ranks_changed = strcmp(out->spec->workers[i].name, old->workers[i].name) != 0;
    out->placement_changed = rl_rules(out->spec, old, out->summary, sizeof out->summary);
    if (out->summary[0] == '\0')
        snprintf(out->summary, sizeof out->summary, "nothing changed");
    return 0;
fail:
    rl_free(out);
    return -1;
}

void rl_free(rl_plan *p)
{
    spec_free(&p->spec);
    plan_free(&p->base);
}
