/*
 * placement.h — a placement table: which ranks hold each routed expert in each MoE layer, and
 * the rule that picks one of an expert's replicas for a (token, expert) pair (prefix pl_).
 *
 * The coordinator's planner builds tables, the registry sends them (WELCOME, EPOCH), the worker
 * routes with them, the simulation and the tests read them: one definition for all of them.
 *
 * A table covers L MoE layers (mc_num_layers: main then MTP), E routed experts and P ranks.
 * Layer l, expert e has n >= 1 replicas: distinct ranks in ascending order. Identical layers
 * share one stored table (a contiguous placement stores one layer for all of them), so the
 * tables of a 61-layer model cost what their distinct layers cost.
 *
 * The replica rule (pl_pick, docs/protocol.md "Replicas"): at the token's origin, the i-th
 * (token, expert e) pair of a step in token order (i counts pairs of e only, from 0) goes to
 * replica (origin + i) mod n of e's replicas. It is deterministic (a function of the step's
 * input and the table), spreads one origin's pairs round-robin over the replicas, and starts
 * different origins at different replicas, so each replica gets about 1/n of the expert's
 * tokens — the load model EPLB plans with. Which replica computes a pair never changes its
 * bits: the expert math is per (token, expert) on the same bytes (docs/numerics.md §5).
 *
 * Wire form (proto Placement): layer_table uint16 LE [L] (the stored table each layer uses),
 * replica_count uint16 LE [n_tables * E], replica_rank uint16 LE [sum of counts]. pl_decode
 * checks every size, count and rank before it keeps anything.
 */
#ifndef EPMOE_PLACEMENT_H
#define EPMOE_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef struct pl_table pl_table;
typedef struct pl_builder pl_builder;

/* The same owner for every layer, one replica each: owner[e] < n_ranks. */
pl_table *pl_flat(int n_layers, int n_experts, int n_ranks, const uint32_t *owner, ep_err *err);

/* Build a table layer by layer: every layer must be set once before pl_builder_finish. */
pl_builder *pl_builder_new(int n_layers, int n_experts, int n_ranks, ep_err *err);
/* Layer `layer`: count[e] replicas of expert e, their ranks in ranks[] expert after expert (in
 * any order within an expert; they are sorted here). Errors: a count of 0 or above n_ranks, a
 * rank out of range, a rank twice for one expert. */
int pl_builder_set(pl_builder *b, int layer, const uint16_t *count, const uint16_t *ranks,
                   ep_err *err);
/* The table (identical layers stored once); frees the builder and clears *b_p. */
pl_table *pl_builder_finish(pl_builder **b_p, ep_err *err);
void pl_builder_free(pl_builder **b_p);

pl_table *pl_copy(const pl_table *t);
void pl_free(pl_table **self_p);

int pl_layers(const pl_table *t);
int pl_experts(const pl_table *t);
int pl_ranks(const pl_table *t);
int pl_stored(const pl_table *t); /* distinct layer tables stored */
/* Which stored table layer l uses (layers with the same index are identical). */
int pl_layer_stored(const pl_table *t, int layer);

/* The replicas of expert e in layer l (ascending ranks) and their number in *n. */
const uint16_t *pl_replicas(const pl_table *t, int layer, int expert, int *n);
bool pl_holds(const pl_table *t, int layer, int expert, int rank);
/* The experts rank holds in layer l, ascending, into out[0..cap) (out may be NULL when cap is 0);
 * returns how many it holds (-1 when rank or layer is out of range). */
int pl_rank_experts(const pl_table *t, int layer, int rank, int *out, int cap);
/* (layer, expert) pairs rank holds over every layer, and the most it holds in one layer. */
int pl_rank_slots(const pl_table *t, int rank);
int pl_rank_max(const pl_table *t, int rank);
/* Both of the above for every rank at once (max[P], slots[P]), in one pass over the stored
 * tables: what a coordinator of 1,024 workers needs per epoch, not per question. */
void pl_rank_counts(const pl_table *t, int *max, int *slots);
/* member[r] = 1 when rank r holds an expert in some layer; returns how many do. */
int pl_members(const pl_table *t, uint8_t *member);
/* Replicas of every (layer, expert) summed over layers: L*E when nothing is replicated. */
long pl_total_slots(const pl_table *t);
bool pl_same(const pl_table *a, const pl_table *b);
/* Flat (every layer the same, one replica each): fills owner[E] and returns true. */
bool pl_flat_owner(const pl_table *t, uint32_t *owner);
/* (layer, expert, rank) replicas b holds that a does not: what moving from a to b loads. */
long pl_gained(const pl_table *a, const pl_table *b);

/* The replica for the i-th pair (of this expert, in token order) at origin `origin`. */
static inline int pl_pick(const uint16_t *reps, int n, int origin, uint32_t i)
{
    return reps[((uint32_t)origin + i) % (uint32_t)n];
}

/* Wire form (see above); the three buffers are malloc'ed (free them). */
typedef struct pl_wire {
    uint8_t *layer_table, *count, *rank;
    size_t layer_table_len, count_len, rank_len;
} pl_wire;
int pl_encode(const pl_table *t, pl_wire *w, ep_err *err);
void pl_wire_free(pl_wire *w);
/* Check and rebuild a table for n_layers x n_experts x n_ranks. Errors name the array, the
 * index and what was expected. */
pl_table *pl_decode(int n_layers, int n_experts, int n_ranks, const uint8_t *layer_table,
                    size_t layer_table_len, const uint8_t *count, size_t count_len,
                    const uint8_t *rank, size_t rank_len, ep_err *err);

/* An ascending list of expert ids as text for people: "0-3,8,10-11" (cut short to fit cap). */
void pl_ranges_text(const uint32_t *e, size_t n, char *buf, size_t cap);

#endif
