/*
 * planner.c — static expert placements (see planner.h). Tables are small (E <= MC_MAX_EXPERTS)
 * and built once per epoch, so plain loops over the owner array are all we need.
 */
#include "coordinator/planner.h"

#include <stdlib.h>

static int plan_check(spec_placement p, int n_experts, int n_ranks, ep_err *err)
{
    if (n_ranks < 1 || n_ranks > EP_MAX_WORKERS)
        return ep_err_set(err, "placement: %d ranks (expected 1..%d)", n_ranks, EP_MAX_WORKERS);
    if (n_experts < 1 || n_experts > MC_MAX_EXPERTS)
        return ep_err_set(err, "placement: %d experts (expected 1..%d)", n_experts, MC_MAX_EXPERTS);
    if (n_ranks > n_experts)
        return ep_err_set(err,
                          "placement: %d ranks are more than the %d experts (every rank must "
                          "own at least one expert)",
                          n_ranks, n_experts);
    if (p != SPEC_PLACE_CONTIGUOUS && p != SPEC_PLACE_ROUND_ROBIN)
        return ep_err_set(err,
                          "placement: unknown placement %d (expected contiguous or "
                          "round_robin)",
                          (int)p);
    if (p == SPEC_PLACE_CONTIGUOUS && n_experts % n_ranks != 0)
        return ep_err_set(err,
                          "placement contiguous: %d ranks do not divide %d experts evenly "
                          "(needs n_experts %% ranks == 0)",
                          n_ranks, n_experts);
    return 0;
}

plan_table *plan_build(spec_placement p, int n_experts, int n_ranks, uint64_t epoch, ep_err *err)
{
    if (plan_check(p, n_experts, n_ranks, err) != 0)
        return NULL;
    plan_table *t = calloc(1, sizeof *t);
    int *owner = calloc((size_t)n_experts, sizeof *owner);
    if (t == NULL || owner == NULL) {
        free(t);
        free(owner);
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    int per_rank = n_experts / n_ranks; /* contiguous only: exact */
    for (int e = 0; e < n_experts; e++)
        owner[e] = p == SPEC_PLACE_CONTIGUOUS ? e / per_rank : e % n_ranks;
    *t = (plan_table){
        .n_experts = n_experts, .n_ranks = n_ranks, .owner = owner, .epoch = epoch, .placement = p};
    return t;
}

void plan_free(plan_table **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    free((*self_p)->owner);
    free(*self_p);
    *self_p = NULL;
}

int plan_rank_experts(const plan_table *t, int rank, int *out, int cap)
{
    if (t == NULL || rank < 0 || rank >= t->n_ranks)
        return -1;
    int n = 0;
    for (int e = 0; e < t->n_experts; e++) {
        if (t->owner[e] != rank)
            continue;
        if (n < cap)
            out[n] = e;
        n++;
    }
    return n;
}
