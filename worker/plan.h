/*
 * plan.h — the dispatch plan: which rank computes each (token, expert) pair of a batch, and
 * what goes to each rank (prefix dp_). Pure: no sockets, no backend; the step path, the
 * serving path's origin and its replays share it.
 *
 * A batch of T tokens has T*k slots (slot t*k + j: the j-th expert of token t; topk_ids -1 is
 * an empty slot). dp_route picks one replica for each slot of a set (all slots, or the ones
 * being replayed) by the replica rule of common/placement.h: the i-th pair of expert e in the
 * set, counted in slot order from 0, goes to replica (origin + i) mod n of e's n replicas in the
 * layer. Any choice gives the same bits (docs/numerics.md); the rule only spreads the load.
 *
 * dp_group then lists, per destination rank, its slots in wire order (ascending slot, so rows
 * are distinct tokens in ascending order and pairs follow in slot order), and dp_fill writes
 * the DISPATCH of one destination from the origin's quantized rows.
 */
#ifndef EPMOE_PLAN_H
#define EPMOE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/placement.h"
#include "worker/transport.h"

/* dest[i] = the rank computing slot slots[i] (slots NULL: slot i, for i < n), -1 for an empty
 * slot. ranks_ok [P] or NULL: a rank that may not compute (dead, not a member) is skipped
 * among the replicas where another one is left; with none left dest is -2 ("no owner"). Adds
 * each routed pair to expert_pairs[e] when given. */
void dp_route(const pl_table *t, int layer, int origin, const int32_t *topk_ids,
              const uint32_t *slots, int n, const uint8_t *ranks_ok, int *dest,
              uint32_t *expert_pairs);

/* The slots of each destination in wire order. count [P] and slot lists owned by the plan. */
typedef struct dp_plan {
    int P;
    int *count;      /* [P] pairs per rank */
    uint32_t **slot; /* [P][count]: slot numbers, ascending */
    int *rows;       /* [P] distinct tokens per rank */
} dp_plan;

/* Group n slots (slots NULL: 0..n-1) by dest (from dp_route; negative entries left out). */
int dp_group(dp_plan *p, int P, int k, const uint32_t *slots, const int *dest, int n, ep_err *err);
void dp_plan_free(dp_plan *p);

/* Distinct tokens among n slots (ascending): a DISPATCH's n_rows. */
int dp_rows(const uint32_t *slot, int n, int k);
/* The rows and pairs of a DISPATCH for the slots slot[n] (ascending; m's shape set: n_rows =
 * dp_rows, n_pairs = n; arrays allocated). From the origin's [T, H] rows: q/qs (fp8; e8m0
 * scales when m->scales_e8m0, which must then be powers of two) or xn (bf16). -1 with err naming
 * the token when an e8m0 scale is not a power of two. */
int dp_fill(const uint32_t *slot, int n, int k, int H, const int32_t *topk_ids, const float *topk_w,
            const uint8_t *q, const float *qs, const uint16_t *xn, tp_msg *m, ep_err *err);

#endif
