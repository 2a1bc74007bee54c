/*
 * cmetrics.c — the coordinator's metrics (see cmetrics.h). Series are created on first use and
 * cached by index, so a step's updates are array lookups, not label formatting.
 */
#include "coordinator/cmetrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"

static const char *const cmx_states[] = {"forming", "loading", "ready", "stopping", "blocked"};
#define CMX_N_STATES 5
static const char *const cmx_wstates[] = {"absent",      "welcomed", "loading",
                                          "load-failed", "ready",    "dead"};
#define CMX_N_WSTATES 6

#ifndef EPMOE_VERSION_STRING
#define EPMOE_VERSION_STRING "unknown"
#endif

static const char *const cmx_rebal_results[] = {"applied", "unchanged", "failed", "abandoned"};
static const char *const cmx_change_kinds[] = {"epoch", "staged", "abandoned"};

/* What the per-worker gauges last showed, so that they are set only when something changed
 * (cmx_workers runs after every event the loop settles). */
typedef struct cmx_wlast {
    int state;
    double up, done, total, ratio, experts;
} cmx_wlast;

struct cmx {
    mx_registry *reg;
    mx_http *http;
    int L, E, P;
    int n_main; /* main layers: layer l >= n_main is "mtp.(l - n_main)" */
    bool have_staged;
    cmx_wlast *wlast;                              /* [EP_MAX_WORKERS] */
    int wcount[CMX_N_WSTATES + 1], wdead, wmasked; /* last totals, -1: never set */
    /* families */
    mx_family *f_state, *f_epoch, *f_workers, *f_dead, *f_masked, *f_up, *f_load_bytes,
        *f_load_total, *f_load_ratio, *f_wexperts, *f_winfo, *f_changes, *f_build;
    mx_family *f_recv; /* payload bytes received, by socket: the coordinator carries no token */
    mx_family *f_steps, *f_step_s, *f_disp_s, *f_exp_s, *f_comb_s, *f_bytes, *f_msgs, *f_tokens;
    mx_family *f_expert_tokens, *f_layer_balance, *f_worker_load, *f_balance, *f_window;
    mx_family *f_rebal, *f_rebal_s, *f_rebal_plan_s, *f_moved, *f_refused;
    mx_family *f_req_s; /* the serving path's request latency, by layer */
    mx_series **req_s;  /* [L] */
    /* cached series */
    mx_series *state[CMX_N_STATES], *epoch[3], *workers[CMX_N_WSTATES], *dead, *masked;
    mx_series **up, **load_bytes, **load_total, **load_ratio, **wexperts; /* [P] */
    mx_series *step_s, *bytes[2], *msgs, *tokens, *balance, *window;
    mx_series **disp_s, **exp_s, **comb_s, **layer_balance; /* [L] */
    mx_series **expert_tokens;                              /* [L * E] */
    mx_series **worker_load;                                /* [L * P] */
    double *balance_by_layer;                               /* [L] */
};

static void cmx_families(cmx *m)
{
    m->f_state = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_state",
                             "1 for the state the cluster is in, 0 for the others", "state");
    m->f_epoch =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_placement_epoch",
                    "Placement epochs: current (served), latest (sent), staged (prepared)", "kind");
    m->f_workers =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_workers", "Workers of the spec by state", "state");
    m->f_dead = mx_family_s(m->reg, MX_GAUGE, "epmoe_workers_dead", "Workers declared dead", NULL);
    m->f_masked = mx_family_s(m->reg, MX_GAUGE, "epmoe_workers_masked",
                              "Registered workers that own no expert (drained or spare)", NULL);
    m->f_up = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_worker_up",
                          "1 when the worker is ready in the latest epoch", "worker");
    m->f_load_bytes = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_worker_load_bytes",
                                  "Checkpoint bytes the worker's load has read", "worker");
    m->f_load_total = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_worker_load_total_bytes",
                                  "Checkpoint bytes the worker's load reads in all", "worker");
    m->f_load_ratio = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_worker_load_progress_ratio",
                                  "Progress of the worker's load, 0..1", "worker");
    m->f_wexperts = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_worker_experts",
                                "The most experts the worker holds in one layer", "worker");
    m->f_winfo = mx_family_s(m->reg, MX_GAUGE, "epmoe_cluster_worker_info",
                             "1 per worker of the spec, labelled with its rank and device",
                             "worker,rank,device");
    m->f_build = mx_family_s(m->reg, MX_GAUGE, "epmoe_build_info",
                             "1, labelled with the version of this binary", "version");
    m->f_changes = mx_family_s(m->reg, MX_COUNTER, "epmoe_placement_changes_total",
                               "Placement epochs decided (epoch), staged, or abandoned", "kind");
    m->f_steps = mx_family_s(m->reg, MX_COUNTER, "epmoe_steps_total",
                             "Forward steps closed, by result and error code", "result,code");
    m->f_step_s =
        mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_step_duration_seconds",
                    "Forward step latency at the coordinator (STEPs out to last answer)", NULL);
    m->f_disp_s = mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_layer_dispatch_seconds",
                              "Dispatch time of a step (slowest worker), by MoE layer", "layer");
    m->f_exp_s =
        mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_layer_expert_seconds",
                    "Routed-expert compute time of a step (slowest worker), by MoE layer", "layer");
    m->f_comb_s = mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_layer_combine_seconds",
                              "Combine time of a step (slowest worker), by MoE layer", "layer");
    m->f_bytes = mx_family_s(m->reg, MX_COUNTER, "epmoe_dataplane_bytes_total",
                             "Data-plane payload bytes the workers sent", "kind");
    m->f_recv = mx_family_s(m->reg, MX_COUNTER, "epmoe_coordinator_payload_bytes_total",
                            "Tensor payload bytes the coordinator received, by socket (tokens "
                            "travel from clients to workers: only FORWARD on the NCCL plane brings "
                            "some here)",
                            "socket");
    m->f_msgs = mx_family_s(m->reg, MX_COUNTER, "epmoe_dataplane_messages_total",
                            "Data-plane messages the workers sent", NULL);
    m->f_tokens = mx_family_s(m->reg, MX_COUNTER, "epmoe_step_tokens_total",
                              "Tokens of the forward steps that succeeded", NULL);
    m->f_expert_tokens = mx_family_s(
        m->reg, MX_COUNTER, "epmoe_expert_tokens_total",
        "(token, expert) pairs routed to each expert of each MoE layer", "layer,expert");
    m->f_layer_balance =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_layer_balance_ratio",
                    "Measured max/mean worker load of a MoE layer over the window", "layer");
    m->f_worker_load =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_layer_worker_load_ratio",
                    "A worker's load of a MoE layer over the window / the mean", "layer,worker");
    m->f_balance =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_balance_ratio",
                    "Measured max/mean worker load, averaged over the loaded layers", NULL);
    m->f_window = mx_family_s(m->reg, MX_GAUGE, "epmoe_stats_window_steps",
                              "Steps in the load-statistics window", NULL);
    m->f_rebal = mx_family_s(m->reg, MX_COUNTER, "epmoe_rebalances_total", "Rebalances, by result",
                             "result");
    m->f_rebal_s =
        mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_rebalance_duration_seconds",
                    "From a rebalance decision to its epoch served by every member", NULL);
    m->f_rebal_plan_s = mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_rebalance_plan_seconds",
                                    "Time EPLB took to plan a rebalance", NULL);
    m->f_req_s =
        mx_family_s(m->reg, MX_HISTOGRAM, "epmoe_layer_request_duration_seconds",
                    "Serving path: SUBMIT to RESULT at the entries, by MoE layer", "layer");
    m->f_moved = mx_family_s(m->reg, MX_COUNTER, "epmoe_rebalance_moved_experts_total",
                             "(layer, expert, worker) replicas rebalances gave a worker", NULL);
}

static void cmx_cache(cmx *m)
{
    for (int i = 0; i < CMX_N_STATES; i++)
        m->state[i] = mx_series1(m->f_state, cmx_states[i]);
    m->epoch[0] = mx_series1(m->f_epoch, "current");
    m->epoch[1] = mx_series1(m->f_epoch, "latest");
    for (int i = 0; i < CMX_N_WSTATES; i++)
        m->workers[i] = mx_series1(m->f_workers, cmx_wstates[i]);
    m->dead = mx_series0(m->f_dead);
    m->masked = mx_series0(m->f_masked);
    m->step_s = mx_series0(m->f_step_s);
    m->bytes[0] = mx_series1(m->f_bytes, "dispatch");
    m->bytes[1] = mx_series1(m->f_bytes, "combine");
    m->msgs = mx_series0(m->f_msgs);
    mx_series1(m->f_recv, "admin"); /* present from the start, at 0 */
    mx_series1(m->f_recv, "workers");
    m->tokens = mx_series0(m->f_tokens);
    m->window = mx_series0(m->f_window);
    /* Counters exist from the start at 0 for every label value they can take, so that rate()
     * and increase() see the first failed step or rebalance (a series born at 1 is not an
     * increase). epmoe_balance_ratio has no value before the first measured step: absent. */
    mx_series2(m->f_steps, "ok", "ERR_NONE");
    const ProtobufCEnumDescriptor *codes = &epmoe__error_code__descriptor;
    for (unsigned i = 0; i < codes->n_values; i++)
        if (codes->values[i].value != 0)
            mx_series2(m->f_steps, "failed", codes->values[i].name);
    for (size_t i = 0; i < sizeof cmx_change_kinds / sizeof *cmx_change_kinds; i++)
        mx_series1(m->f_changes, cmx_change_kinds[i]);
    for (size_t i = 0; i < sizeof cmx_rebal_results / sizeof *cmx_rebal_results; i++)
        mx_series1(m->f_rebal, cmx_rebal_results[i]);
    mx_series0(m->f_moved);
    mx_series0(m->f_rebal_s);
    mx_series0(m->f_rebal_plan_s);
    mx_set(mx_series1(m->f_build, EPMOE_VERSION_STRING), 1);
}

/* One info series per worker of the spec (again after a reload changed it). */
static void cmx_worker_info(cmx *m, const spec_cluster *spec)
{
    mx_clear(m->f_winfo);
    for (int r = 0; r < spec->n_workers; r++) {
        char rv[16];
        snprintf(rv, sizeof rv, "%d", r);
        const char *v[3] = {spec->workers[r].name, rv, spec->workers[r].device};
        mx_set(mx_series_of(m->f_winfo, v), 1);
    }
}

static void cmx_forget_workers(cmx *m)
{
    for (int r = 0; r < EP_MAX_WORKERS; r++)
        m->wlast[r] =
            (cmx_wlast){.state = -1, .up = -1, .done = -1, .total = -1, .ratio = -1, .experts = -1};
    for (int i = 0; i <= CMX_N_WSTATES; i++)
        m->wcount[i] = -1;
    m->wdead = m->wmasked = -1;
}

/* The refusal counters, at 0 for both domains and every reason. */
static void cmx_handshakes(cmx *m)
{
    m->f_refused = mx_family_s(m->reg, MX_COUNTER, "epmoe_handshakes_refused_total",
                               "Connections a CURVE socket refused, by ZAP domain and reason",
                               "domain,reason");
    const char *domains[2] = {AUTH_DOMAIN_WORKERS, AUTH_DOMAIN_OPERATORS};
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < AUTH_N_REASONS; r++)
            mx_series2(m->f_refused, domains[d], auth_reason_name((auth_reason)r));
}

void cmx_handshake_refused(void *ctx, const char *domain, auth_reason reason)
{
    cmx *m = ctx;
    if (m != NULL && m->f_refused != NULL)
        mx_add(mx_series2(m->f_refused, domain, auth_reason_name(reason)), 1);
}

static void cmx_free_arrays(cmx *m)
{
    free(m->up);
    free(m->load_bytes);
    free(m->load_total);
    free(m->load_ratio);
    free(m->wexperts);
    free(m->disp_s);
    free(m->req_s);
    free(m->exp_s);
    free(m->comb_s);
    free(m->layer_balance);
    free(m->expert_tokens);
    free(m->worker_load);
    free(m->balance_by_layer);
    free(m->wlast);
}

cmx *cmx_create(const spec_cluster *spec, const mc_config *cfg, ep_err *err)
{
    cmx *m = calloc(1, sizeof *m);
    if (m == NULL || (m->reg = mx_create(err)) == NULL)
        goto fail;
    m->L = mc_num_layers(cfg);
    m->E = cfg->n_routed_experts;
    m->P = spec->n_workers;
    /* per-worker caches for any spec a reload may bring (EP_MAX_WORKERS) */
    size_t L = (size_t)m->L, E = (size_t)m->E, P = EP_MAX_WORKERS;
    m->up = calloc(P, sizeof *m->up);
    m->load_bytes = calloc(P, sizeof *m->load_bytes);
    m->load_total = calloc(P, sizeof *m->load_total);
    m->load_ratio = calloc(P, sizeof *m->load_ratio);
    m->wexperts = calloc(P, sizeof *m->wexperts);
    m->disp_s = calloc(L, sizeof *m->disp_s);
    m->req_s = calloc(L, sizeof *m->req_s);
    m->exp_s = calloc(L, sizeof *m->exp_s);
    m->comb_s = calloc(L, sizeof *m->comb_s);
    m->layer_balance = calloc(L, sizeof *m->layer_balance);
    m->expert_tokens = calloc(L * E, sizeof *m->expert_tokens);
    m->worker_load = calloc(L * P, sizeof *m->worker_load);
    m->balance_by_layer = calloc(L, sizeof *m->balance_by_layer);
    m->wlast = calloc(P, sizeof *m->wlast);
    m->n_main = cfg->num_hidden_layers;
    if (!m->wlast || !m->up || !m->load_bytes || !m->load_total || !m->load_ratio || !m->wexperts ||
        !m->disp_s || !m->exp_s || !m->comb_s || !m->layer_balance || !m->expert_tokens ||
        !m->worker_load || !m->balance_by_layer || !m->req_s) {
        ep_err_set(err, "metrics: out of memory");
        goto fail;
    }
    cmx_families(m);
    cmx_cache(m);
    cmx_forget_workers(m);
    cmx_worker_info(m, spec);
    if (spec->secure)
        cmx_handshakes(m);
    if (spec->metrics[0]) {
        m->http = mx_http_start(m->reg, spec->metrics, err);
        if (m->http == NULL) {
            ep_err_prefix(err, "%s:%d:%d: coordinator.metrics", spec->file, spec->metrics_pos.line,
                          spec->metrics_pos.col);
            goto fail;
        }
        log_info("metrics: serving http://%s/metrics", spec->metrics);
    }
    return m;
fail:
    if (m != NULL && m->reg == NULL && err->msg[0] == '\0')
        ep_err_set(err, "metrics: out of memory");
    cmx_destroy(&m);
    return NULL;
}

void cmx_destroy(cmx **self_p)
{
    cmx *m = self_p ? *self_p : NULL;
    if (m == NULL)
        return;
    mx_http_stop(&m->http); /* no scrape may run once the registry goes */
    mx_destroy(&m->reg);
    cmx_free_arrays(m);
    free(m);
    *self_p = NULL;
}

int cmx_port(const cmx *m)
{
    return m ? mx_http_port(m->http) : 0;
}

void cmx_state(cmx *m, const char *state)
{
    for (int i = 0; m && i < CMX_N_STATES; i++)
        mx_set(m->state[i], strcmp(state, cmx_states[i]) == 0);
}

void cmx_epochs(cmx *m, uint64_t current, uint64_t latest, uint64_t staged)
{
    if (m == NULL)
        return;
    mx_set(m->epoch[0], (double)current);
    mx_set(m->epoch[1], (double)latest);
    bool have = staged != 0; /* no staged epoch: no series, not a 0 */
    if (have != m->have_staged) {
        mx_clear(m->f_epoch);
        m->epoch[0] = mx_series1(m->f_epoch, "current");
        m->epoch[1] = mx_series1(m->f_epoch, "latest");
        m->epoch[2] = have ? mx_series1(m->f_epoch, "staged") : NULL;
        mx_set(m->epoch[0], (double)current);
        mx_set(m->epoch[1], (double)latest);
        m->have_staged = have;
    }
    mx_set(m->epoch[2], (double)staged);
}

void cmx_change(cmx *m, const char *kind)
{
    if (m != NULL)
        mx_add(mx_series1(m->f_changes, kind), 1);
}

void cmx_respec(cmx *m, const spec_cluster *spec)
{
    if (m == NULL)
        return;
    m->P = spec->n_workers;
    mx_clear(m->f_up);
    mx_clear(m->f_load_bytes);
    mx_clear(m->f_load_total);
    mx_clear(m->f_load_ratio);
    mx_clear(m->f_wexperts);
    mx_clear(m->f_worker_load);
    size_t P = EP_MAX_WORKERS;
    memset(m->up, 0, P * sizeof *m->up);
    memset(m->load_bytes, 0, P * sizeof *m->load_bytes);
    memset(m->load_total, 0, P * sizeof *m->load_total);
    memset(m->load_ratio, 0, P * sizeof *m->load_ratio);
    memset(m->wexperts, 0, P * sizeof *m->wexperts);
    memset(m->worker_load, 0, (size_t)m->L * P * sizeof *m->worker_load);
    memset(m->balance_by_layer, 0, (size_t)m->L * sizeof *m->balance_by_layer);
    cmx_forget_workers(m);
    cmx_worker_info(m, spec);
}

static mx_series *cmx_worker_series(mx_family *f, mx_series **cache, int r, const char *name)
{
    if (cache[r] == NULL)
        cache[r] = mx_series1(f, name);
    return cache[r];
}

/* Set g to v when it differs from what it last showed (*last). */
static void cmx_set_changed(mx_family *f, mx_series **cache, int r, const char *name, double *last,
                            double v)
{
    if (*last == v)
        return;
    *last = v;
    mx_set(cmx_worker_series(f, cache, r, name), v);
}

void cmx_workers(cmx *m, const spec_cluster *spec, reg_registry *reg, const plan_table *latest)
{
    if (m == NULL || spec->n_workers != m->P)
        return;
    int by_state[CMX_N_WSTATES] = {0}, masked = 0;
    for (int r = 0; r < m->P; r++) {
        const reg_worker *w = reg_worker_at(reg, r);
        const char *name = spec->workers[r].name;
        cmx_wlast *k = &m->wlast[r];
        if ((unsigned)w->state < CMX_N_WSTATES)
            by_state[w->state]++;
        bool member = plan_is_member(latest, r);
        masked += reg_registered(w) && !member;
        double ratio = w->bytes_total          ? (double)w->bytes_done / (double)w->bytes_total
                       : w->state == REG_READY ? 1.0
                                               : 0.0;
        cmx_set_changed(m->f_up, m->up, r, name, &k->up,
                        w->state == REG_READY && w->acked == latest->epoch);
        cmx_set_changed(m->f_load_bytes, m->load_bytes, r, name, &k->done, (double)w->bytes_done);
        cmx_set_changed(m->f_load_total, m->load_total, r, name, &k->total, (double)w->bytes_total);
        cmx_set_changed(m->f_load_ratio, m->load_ratio, r, name, &k->ratio, ratio > 1 ? 1 : ratio);
        cmx_set_changed(m->f_wexperts, m->wexperts, r, name, &k->experts,
                        member ? plan_rank_max(latest, r) : 0);
    }
    for (int i = 0; i < CMX_N_WSTATES; i++)
        if (m->wcount[i] != by_state[i])
            mx_set(m->workers[i], m->wcount[i] = by_state[i]);
    if (m->wdead != by_state[REG_DEAD])
        mx_set(m->dead, m->wdead = by_state[REG_DEAD]);
    if (m->wmasked != masked)
        mx_set(m->masked, m->wmasked = masked);
}

static const char *cmx_code_name(int code)
{
    return wire_code_name(code, "ERR_UNKNOWN");
}

/* A layer as epmoectl names it: "3", or "mtp.0" past the main layers. */
static void cmx_layer_label(const cmx *m, int l, char *v, size_t cap)
{
    if (l < m->n_main)
        snprintf(v, cap, "%d", l);
    else
        snprintf(v, cap, "mtp.%d", l - m->n_main);
}

static mx_series *cmx_layer_series(const cmx *m, mx_family *f, mx_series **cache, int l)
{
    if (cache[l] == NULL) {
        char v[16];
        cmx_layer_label(m, l, v, sizeof v);
        cache[l] = mx_series1(f, v);
    }
    return cache[l];
}

void cmx_step(cmx *m, const mc_config *cfg, const spec_cluster *spec, const seq_record *r)
{
    if (m == NULL)
        return;
    (void)cfg;
    (void)spec;
    mx_add(mx_series2(m->f_steps, r->ok ? "ok" : "failed", cmx_code_name(r->ok ? 0 : r->code)), 1);
    if (!r->ok || r->layer < 0 || r->layer >= m->L)
        return;
    mx_observe(m->step_s, r->seconds);
    mx_observe(cmx_layer_series(m, m->f_disp_s, m->disp_s, r->layer), r->dispatch_s);
    mx_observe(cmx_layer_series(m, m->f_exp_s, m->exp_s, r->layer), r->expert_s);
    mx_observe(cmx_layer_series(m, m->f_comb_s, m->comb_s, r->layer), r->combine_s);
    mx_add(m->bytes[0], (double)r->dispatch_bytes);
    mx_add(m->bytes[1], (double)r->combine_bytes);
    mx_add(m->msgs, (double)r->messages);
    mx_add(m->tokens, r->n_tokens);
    for (int e = 0; r->expert_tokens && e < r->n_experts && e < m->E; e++) {
        if (r->expert_tokens[e] == 0)
            continue;
        mx_series **c = &m->expert_tokens[(size_t)r->layer * m->E + e];
        if (*c == NULL) {
            char lv[16], ev[16];
            cmx_layer_label(m, r->layer, lv, sizeof lv);
            snprintf(ev, sizeof ev, "%d", e);
            *c = mx_series2(m->f_expert_tokens, lv, ev);
        }
        mx_add(*c, r->expert_tokens[e]);
    }
}

void cmx_balance(cmx *m, const mc_config *cfg, const spec_cluster *spec, const stats_window *st,
                 const plan_table *current, int layer)
{
    if (m == NULL || layer < 0 || layer >= m->L || spec->n_workers != m->P)
        return;
    (void)cfg;
    uint8_t *holds = calloc((size_t)m->P, 1);
    if (holds == NULL)
        return;
    for (int e = 0; e < current->n_experts; e++) {
        int n;
        const uint16_t *reps = plan_replicas(current, layer, e, &n);
        for (int i = 0; i < n; i++)
            holds[reps[i]] = 1;
    }
    double b = stats_measured_balance(st, layer, holds);
    if (b > 0) {
        mx_set(cmx_layer_series(m, m->f_layer_balance, m->layer_balance, layer), b);
        m->balance_by_layer[layer] = b;
        const uint64_t *rc = stats_rank_counts(st, layer);
        double total = 0;
        int n = 0;
        for (int r = 0; r < m->P; r++)
            if (holds[r]) {
                total += (double)rc[r];
                n++;
            }
        for (int r = 0; r < m->P && total > 0; r++) {
            mx_series **c = &m->worker_load[(size_t)layer * EP_MAX_WORKERS + r];
            if (!holds[r] && *c == NULL)
                continue;
            if (*c == NULL) {
                char lv[16];
                cmx_layer_label(m, layer, lv, sizeof lv);
                *c = mx_series2(m->f_worker_load, lv, spec->workers[r].name);
            }
            mx_set(*c, holds[r] ? (double)rc[r] / (total / n) : 0);
        }
    }
    double sum = 0;
    int loaded = 0;
    for (int l = 0; l < m->L; l++)
        if (m->balance_by_layer[l] > 0) {
            sum += m->balance_by_layer[l];
            loaded++;
        }
    if (loaded && m->balance == NULL) /* absent until a layer has a measured balance */
        m->balance = mx_series0(m->f_balance);
    if (loaded)
        mx_set(m->balance, sum / loaded);
    mx_set(m->window, stats_steps(st));
    free(holds);
}

void cmx_rebalance(cmx *m, const char *result, double plan_seconds, long moved)
{
    if (m == NULL)
        return;
    mx_add(mx_series1(m->f_rebal, result), 1);
    if (plan_seconds >= 0)
        mx_observe(mx_series0(m->f_rebal_plan_s), plan_seconds);
    if (moved > 0)
        mx_add(mx_series0(m->f_moved), (double)moved);
}

void cmx_requests(cmx *m, int layer, uint32_t requests, uint32_t tokens,
                  const uint32_t *expert_tokens, int n_experts)
{
    if (m == NULL || layer < 0 || layer >= m->L)
        return;
    mx_add(mx_series2(m->f_steps, "ok", cmx_code_name(0)), requests);
    mx_add(m->tokens, tokens);
    for (int e = 0; e < n_experts && e < m->E; e++) {
        if (expert_tokens[e] == 0)
            continue;
        mx_series **c = &m->expert_tokens[(size_t)layer * m->E + e];
        if (*c == NULL) {
            char lv[16], ev[16];
            cmx_layer_label(m, layer, lv, sizeof lv);
            snprintf(ev, sizeof ev, "%d", e);
            *c = mx_series2(m->f_expert_tokens, lv, ev);
        }
        mx_add(*c, expert_tokens[e]);
    }
}

/* A reported histogram into a series (a worker of another build, with other buckets: dropped). */
static void cmx_merge(mx_series *s, const Epmoe__LatencyHistogram *h)
{
    if (h != NULL && h->n_bucket <= (size_t)MX_MAX_BUCKETS + 1)
        (void)mx_observe_many(s, h->bucket, (int)h->n_bucket, h->has_sum ? h->sum : 0);
}

void cmx_served(cmx *m, int layer, const Epmoe__LoadReport *r)
{
    if (m == NULL || layer < 0 || layer >= m->L)
        return;
    for (size_t i = 0; i < r->n_failed_code && i < r->n_failed_count; i++)
        mx_add(mx_series2(m->f_steps, "failed", cmx_code_name((int)r->failed_code[i])),
               r->failed_count[i]);
    cmx_merge(m->step_s, r->duration);
    cmx_merge(cmx_layer_series(m, m->f_req_s, m->req_s, layer), r->duration);
    if (r->dispatch != NULL)
        cmx_merge(cmx_layer_series(m, m->f_disp_s, m->disp_s, layer), r->dispatch);
    if (r->experts != NULL)
        cmx_merge(cmx_layer_series(m, m->f_exp_s, m->exp_s, layer), r->experts);
    if (r->combine != NULL)
        cmx_merge(cmx_layer_series(m, m->f_comb_s, m->comb_s, layer), r->combine);
    mx_add(m->bytes[0], (double)r->dispatch_bytes);
    mx_add(m->bytes[1], (double)r->combine_bytes);
    mx_add(m->msgs, (double)r->messages);
}

void cmx_received(cmx *m, const char *socket, const wire_msg *msg)
{
    if (m == NULL || msg->n_payloads == 0)
        return;
    size_t n = 0;
    for (int i = 0; i < msg->n_payloads; i++)
        n += msg->payload_len[i];
    mx_add(mx_series1(m->f_recv, socket), (double)n);
}

void cmx_rebalance_done(cmx *m, double seconds)
{
    if (m != NULL)
        mx_observe(mx_series0(m->f_rebal_s), seconds);
}
