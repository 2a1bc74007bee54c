/*
 * stats.h — the coordinator's load statistics: per-layer, per-expert token counts and per-rank
 * loads over a sliding window of steps (prefix stats_).
 *
 * Each closed step (seq_record) adds one entry: its layer, the (token, expert) pairs per expert
 * (what EPLB plans with: placement-free) and the pairs each rank computed (what a placement
 * made of them: the measured balance). The window holds the last window_steps steps over all
 * layers (expert_parallel.window_steps; a step is one layer's forward), kept sparse, so memory
 * follows the pairs seen, not layers x experts x window.
 *
 * The measured balance of a layer is max/mean of the per-rank pairs over the window's steps of
 * that layer in the current epoch (stats_epoch: rank loads of earlier epochs no longer say
 * anything about the placement in force; expert counts stay valid across epochs), the mean over
 * the ranks that hold an expert of the layer.
 *
 * A passive data structure owned by coord.c; no I/O.
 */
#ifndef EPMOE_STATS_H
#define EPMOE_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

typedef struct stats_window stats_window;

stats_window *stats_create(int n_layers, int n_experts, int n_ranks, int window_steps, ep_err *err);
void stats_destroy(stats_window **self_p);

/* One step of `layer` in `epoch`: expert_tokens[n_experts], rank_pairs[n_ranks] (dense). */
int stats_add(stats_window *s, int layer, uint64_t epoch, const uint32_t *expert_tokens,
              const uint32_t *rank_pairs);
/* The epoch now served: rank loads of other epochs stop counting. */
void stats_epoch(stats_window *s, uint64_t epoch);

int stats_steps(const stats_window *s); /* steps in the window */
int stats_layer_steps(const stats_window *s, int layer);
/* The window's pairs per (layer, expert) as weights [n_layers * n_experts] (EPLB's input). */
void stats_weights(const stats_window *s, double *w);
/* Pairs per expert of one layer over the window. */
const uint64_t *stats_expert_counts(const stats_window *s, int layer);
/* Pairs per rank of one layer over the window's steps of the current epoch. */
const uint64_t *stats_rank_counts(const stats_window *s, int layer);
/* max/mean rank load of a layer (holds[r]: rank r holds an expert of the layer); 0 when the
 * layer has no load in the current epoch. */
double stats_measured_balance(const stats_window *s, int layer, const uint8_t *holds);

#endif
