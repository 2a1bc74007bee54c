/*
 * planner.h — the expert placement table: which rank owns each routed expert (prefix plan_).
 *
 * A plan_table maps every expert 0..n_experts-1 to exactly one rank 0..n_ranks-1, and every rank
 * owns at least one expert. It is versioned by epoch: the coordinator builds a new table with a
 * higher epoch whenever the placement changes, and steps of an older epoch fail.
 *
 *   contiguous   rank r owns [r*E/P, (r+1)*E/P)  (spec §1.4, the reference and vLLM MegaMoE
 *                layout; DeepGEMM's e / (E/P)); needs E % P == 0
 *   round_robin  expert e belongs to rank e % P; any P <= E
 *
 * Errors (plan_build returns NULL): P < 1, P > EP_MAX_WORKERS, E < 1, E > MC_MAX_EXPERTS, P > E,
 * contiguous with E % P != 0, unknown placement. Messages name the numbers and the rule.
 */
#ifndef EPMOE_PLANNER_H
#define EPMOE_PLANNER_H

#include <stdint.h>

#include "common/error.h"
#include "coordinator/spec.h"

typedef struct plan_table {
    int n_experts; /* E */
    int n_ranks;   /* P */
    int *owner;    /* [n_experts]: the rank owning each expert */
    uint64_t epoch;
    spec_placement placement; /* how the table was built */
} plan_table;

plan_table *plan_build(spec_placement p, int n_experts, int n_ranks, uint64_t epoch, ep_err *err);

/* Free a table; tolerates NULL and clears the caller's pointer. */
void plan_free(plan_table **self_p);

/* The experts rank owns, in ascending id, into out[0..cap) (out may be NULL when cap is 0).
 * Returns how many the rank owns (which may exceed cap: only cap are written), or -1 when rank
 * is not in 0..n_ranks-1. */
int plan_rank_experts(const plan_table *t, int rank, int *out, int cap);

#endif
