/*
 * cmetrics.h — the coordinator's Prometheus metrics (prefix cmx_): the families it exposes and
 * the calls coord.c makes when something worth counting happens. docs/operations.md "Metrics"
 * lists every name; deploy/grafana/epmoe.json draws them.
 *
 * Cluster:   epmoe_build_info{version}, epmoe_cluster_state{state} (1 for the current state),
 *            epmoe_placement_epoch{kind=current|latest|staged} (staged absent when none),
 *            epmoe_workers{state}, epmoe_workers_dead, epmoe_workers_masked (registered, owning
 *            nothing: drained or spare), epmoe_placement_changes_total{kind=epoch|staged|
 *            abandoned}
 * Workers (the coordinator's view; a worker's own metrics are epmoe_worker_*):
 *            epmoe_cluster_worker_info{worker, rank, device}, epmoe_cluster_worker_up{worker},
 *            epmoe_cluster_worker_load_bytes{worker}, epmoe_cluster_worker_load_total_bytes
 *            {worker}, epmoe_cluster_worker_load_progress_ratio{worker},
 *            epmoe_cluster_worker_experts{worker} (the most experts it holds in one layer);
 *            set when they change (cmx_workers runs after every settled event)
 * Steps:     epmoe_steps_total{result=ok|failed, code} (every code at 0 from the start),
 *            epmoe_step_duration_seconds (histogram), epmoe_layer_dispatch_seconds{layer},
 *            epmoe_layer_expert_seconds{layer}, epmoe_layer_combine_seconds{layer}
 *            (histograms, the slowest worker of each step),
 *            epmoe_layer_request_duration_seconds{layer} (the serving path: SUBMIT to RESULT),
 *            epmoe_dataplane_bytes_total{kind=dispatch|combine},
 *            epmoe_dataplane_messages_total, epmoe_step_tokens_total
 * Load:      epmoe_expert_tokens_total{layer, expert} ((token, expert) pairs routed),
 *            epmoe_layer_balance_ratio{layer} (measured max/mean worker load in the window),
 *            epmoe_layer_worker_load_ratio{layer, worker} (load / mean: the heatmap),
 *            epmoe_balance_ratio (layer average; absent before the first measured step),
 *            epmoe_stats_window_steps
 * Security:  epmoe_handshakes_refused_total{domain, reason} (with security: only)
 * Rebalance: epmoe_rebalances_total{result=applied|unchanged|failed|abandoned},
 *            epmoe_rebalance_duration_seconds (histogram: decision to the new epoch served),
 *            epmoe_rebalance_plan_seconds (histogram), epmoe_rebalance_moved_experts_total
 *
 * Layers are labelled as epmoectl names them ("3", "mtp.0"); every counter exists at 0 for
 * every label value it can take.
 *
 * Served on coordinator.metrics when the spec gives it; without it the registry still exists
 * (cheap) and nothing listens.
 */
#ifndef EPMOE_CMETRICS_H
#define EPMOE_CMETRICS_H

#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/planner.h"
#include "coordinator/registry.h"
#include "coordinator/sequencer.h"
#include "coordinator/spec.h"
#include "common/wire.h"
#include "coordinator/stats.h"

typedef struct cmx cmx;

/* The families; serves HTTP on spec->metrics when set (errors name the address). */
cmx *cmx_create(const spec_cluster *spec, const mc_config *cfg, ep_err *err);
void cmx_destroy(cmx **self_p);
int cmx_port(const cmx *m); /* the HTTP port, 0 when not serving */

void cmx_state(cmx *m, const char *state);
void cmx_epochs(cmx *m, uint64_t current, uint64_t latest, uint64_t staged);
void cmx_change(cmx *m, const char *kind);
/* Worker gauges from the registry and the latest placement (a reload may change the names:
 * the per-worker series are rebuilt when the spec changes). */
void cmx_workers(cmx *m, const spec_cluster *spec, reg_registry *reg, const plan_table *latest);
/* A closed step. */
void cmx_step(cmx *m, const mc_config *cfg, const spec_cluster *spec, const seq_record *r);
/* Balance gauges of one layer after a step: measured ratio, and each holder's load / mean. */
void cmx_balance(cmx *m, const mc_config *cfg, const spec_cluster *spec, const stats_window *st,
                 const plan_table *current, int layer);
void cmx_rebalance(cmx *m, const char *result, double plan_seconds, long moved);
void cmx_rebalance_done(cmx *m, double seconds);
/* The serving path's requests of one layer as an entry reported them (LOAD_REPORT): those
 * answered count as ok steps (one request is one layer's step); tokens and (token, expert) pairs
 * are the load of those routed in the current epoch. */
void cmx_requests(cmx *m, int layer, uint32_t requests, uint32_t tokens,
                  const uint32_t *expert_tokens, int n_experts);
/* The rest of a LOAD_REPORT (issue 23): its requests failed by code, the timings of those
 * answered (the step histograms, epmoe_layer_request_duration_seconds{layer}) and the
 * data-plane messages the worker sent for the layer. */
void cmx_served(cmx *m, int layer, const Epmoe__LoadReport *r);
/* A message on socket ("admin", "workers"): its payload bytes count (the token bytes). */
void cmx_received(cmx *m, const char *socket, const wire_msg *msg);
/* A handshake a CURVE socket refused (an auth_refusal_fn: ctx is the cmx). */
void cmx_handshake_refused(void *ctx, const char *domain, auth_reason reason);
/* The spec changed (a reload, n_workers now): per-worker series are dropped (they come back
 * with the names). */
void cmx_respec(cmx *m, const spec_cluster *spec);

#endif
