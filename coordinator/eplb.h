/*
 * eplb.h — DeepSeek's expert-parallel load balancer (EPLB), in C (prefix eplb_).
 *
 * The algorithm of deepseek-ai/EPLB (eplb.py, reference/anchors-ep.md §1b), written from its
 * description: given the load of every (layer, logical expert), R physical slots on G ranks
 * (R/G each) and the node layout, choose how many copies each expert gets and which rank holds
 * each copy, so that every rank gets about the same load.
 *
 *   pack(w[n], m)        n items into m packs of n/m items each: items by weight,
 *                        heaviest first (ties: lower index first), each to the lightest pack
 *                        that still has room (ties: lower pack). n/m == 1: item i -> pack i.
 *   replicate(w[n], R)   one copy each, then each of the R - n extra copies goes to the expert
 *                        with the highest load per copy (ties: lower expert).
 *   hierarchical         (groups % nodes == 0): pack expert groups (E/groups consecutive
 *                        experts) onto nodes by group load; replicate each node's experts into
 *                        its R/N slots; pack each node's copies (load / copies) onto its G/N
 *                        ranks, R/G each.
 *   global               otherwise: the same with one group and one node.
 *
 * One deviation, because here a replica is a distinct holder of an expert (failover uses it,
 * and two copies on one rank would waste a slot): a rank never gets two copies of one expert.
 * replicate gives an expert at most as many copies as there are ranks in its scope, and pack
 * skips a pack that already holds a copy of the item's expert (taking the lightest other pack
 * with room; only when every pack with room holds one does it take the lightest anyway, which
 * the caller's checks make impossible for copies: see eplb_plan). Where the constraint never
 * binds, the result is DeepSeek's (test_eplb checks the README example).
 *
 * A second generalisation: R need not be a multiple of G (256 experts + 32 redundant on 64
 * ranks is 4.5 slots each). Every rank gets floor(R/G) slots and R % G ranks one more: the
 * first ones that ask for it, i.e. pack lets a pack at floor(R/G) items take one more while
 * extra slots are left (the lightest pack with room first, as before), so the light ranks take
 * the extra copies instead of ranks fixed in advance. With R % G == 0 this is DeepSeek's rule
 * exactly; hierarchical plans need it.
 *
 * Ranks are node-major: node i holds ranks [i*G/N, (i+1)*G/N). Output, per layer: slot s
 * (0..R-1) holds logical expert phy2log[l*R + s] on rank phy2rank[l*R + s]; slots are in rank
 * order, each rank's copies in the order it took them (with R % G == 0, rank s / (R/G): the
 * layout of eplb.py). Deterministic: the same input gives the same output (no randomness, ties
 * broken by index).
 */
#ifndef EPMOE_EPLB_H
#define EPMOE_EPLB_H

#include <stdbool.h>

#include "common/error.h"

typedef struct eplb_shape {
    int n_layers;  /* L */
    int n_experts; /* E logical experts per layer */
    int n_slots;   /* R physical slots per layer: E + redundant */
    int n_ranks;   /* G */
    int n_nodes;   /* N */
    int n_groups;  /* expert groups (1: none); hierarchical when n_groups % n_nodes == 0 */
} eplb_shape;

/* Check the shape: every count >= 1, R >= E (every expert a slot), R >= G (every rank a slot),
 * R <= E * G (a rank holds an expert at most once). Errors name the numbers and the rule.
 * Hierarchical also needs groups % N == 0, E % groups == 0, G % N == 0 and R % G == 0; a shape
 * without them is planned globally. */
int eplb_check(const eplb_shape *s, ep_err *err);
/* Whether eplb_plan takes the hierarchical policy for this shape. */
bool eplb_hierarchical(const eplb_shape *s);

/* Plan every layer: weight [L, E] (>= 0) -> phy2log [L, R] and phy2rank [L, R]. Returns 0, or
 * -1 with err (a bad shape, out of memory). */
int eplb_plan(const eplb_shape *s, const double *weight, int *phy2log, int *phy2rank, ep_err *err);

/* The primitives, exposed for the tests. pack: key[i] >= 0 is item i's expert (never two of one
 * key in a pack when avoidable; key NULL: no constraint); writes pack[n] and slot[n] (rank in
 * pack; pack p ends with n/m or n/m + 1 items, see above). replicate: cap = most copies one expert
 * may get; writes phy2log[n_phy] and cnt[n_log]. */
int eplb_pack(const double *w, const int *key, int n, int m, int *pack, int *slot, ep_err *err);
int eplb_replicate(const double *w, int n_log, int n_phy, int cap, int *phy2log, int *cnt,
                   ep_err *err);

#endif
