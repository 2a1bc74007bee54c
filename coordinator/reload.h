/*
 * reload.h — build and validate the state a reloaded cluster spec asks for (prefix rl_).
 *
 * `epmoectl reload` and SIGHUP re-read the spec file; rl_build parses it (errors name
 * FILE:LINE:COLUMN), checks it against the model and against what a running coordinator cannot
 * change (its own listen and admin endpoints, the model path, a kept worker's device), builds
 * the new spec's placement, and says what changed. Nothing of the running daemon is touched:
 * coord.c swaps the result in once no step is in flight, or keeps the old state serving when
 * rl_build fails (nginx's ngx_init_cycle, anchors-ops-style §2).
 *
 * The world of the cluster (what WELCOME told each worker: ranks, peers, data endpoints,
 * heartbeat_ms, liveness, step_timeout_ms, dispatch, gpu_gemm, metrics addresses) either stays —
 * then only the placement rules may differ (placement, rejoin, max_experts_per_worker,
 * redundant_experts, expert_groups, window_steps, rebalance_every_steps) and a new epoch follows
 * if the placement does — or changes, and every worker is welcomed again into the new world
 * (keeping the experts it has loaded and still owns). When the same workers keep the same ranks
 * (only timeouts, dispatch, gpu_gemm or endpoints changed) the placement in force stays, a
 * rebalanced one included; only new ranks start from the spec's placement.
 */
#ifndef EPMOE_RELOAD_H
#define EPMOE_RELOAD_H

#include <stdbool.h>

#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

typedef struct rl_plan {
    spec_cluster *spec; /* the new spec (owned; coord.c takes it on the swap) */
    plan_table *base;   /* its placement (owned) */
    bool world_changed; /* every worker is welcomed again */
    bool ranks_changed; /* workers added, removed or renumbered: a new registry and planner */
    /* placement, max_experts_per_worker, redundant_experts or expert_groups changed: the
     * placement is decided again (from the spec's with rejoin: restore) */
    bool placement_changed;
    char summary[EP_ERR_MSG_MAX]; /* "workers added: b2; step_timeout_ms 30000 -> 5000" */
} rl_plan;

/* Read path and build the new state against the running spec old and the model; base gets epoch
 * `epoch`. 0, or -1 with err (FILE:LINE:COLUMN: what and what was expected). */
int rl_build(const char *path, const spec_cluster *old, const mc_config *cfg, uint64_t epoch,
             rl_plan *out, ep_err *err);
/* Free what out still owns. */
void rl_free(rl_plan *p);

#endif
