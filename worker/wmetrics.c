/*
 * wmetrics.c — a worker's metrics (see wmetrics.h). Without per_layer every step histogram is
 * one series (the coordinator has the per-layer view of the cluster); with it, per-layer series
 * are cached by index (up to MC_MAX_LAYERS + MC_MAX_MTP) and per-(layer, expert) series live in
 * a table grown on first use.
 */
#include "worker/wmetrics.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/wire.h"

#define WMX_LAYERS (MC_MAX_LAYERS + MC_MAX_MTP)

#ifndef EPMOE_VERSION_STRING
#define EPMOE_VERSION_STRING "unknown"
#endif

static const char *const wmx_states[] = {"registering", "welcomed",    "loading",
                                         "ready",       "load-failed", "backoff"};
#define WMX_N_STATES 6
static const char *const wmx_load_kinds[] = {"load", "epoch", "staged", "commit"};
#define WMX_N_LOAD_KINDS 4
static const char *const wmx_kinds[] = {"routed", "hash", "mtp", "unknown"};
#define WMX_N_KINDS 4
/* The codes a request can fail with at its entry: at 0 from the start (others on first use) */
static const int wmx_codes[] = {EP_ERR_NONE,        EP_ERR_MALFORMED,     EP_ERR_BAD_REQUEST,
                                EP_ERR_CONFIG_HASH, EP_ERR_NOT_READY,     EP_ERR_STEP_FAILED,
                                EP_ERR_TIMEOUT,     EP_ERR_SHUTTING_DOWN, EP_ERR_BUSY};
#define WMX_N_CODES 9
/* pairs per mb_experts call: 1 .. 65536 */
static const double wmx_pair_buckets[] = {1,   2,    4,    8,    16,   32,    64,    128,  256,
                                          512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};

struct wmx {
    mx_registry *reg;
    mx_http *http;
    char addr[64];
    bool per_layer;    /* the step histograms by layer, and pairs by (layer, expert) */
    atomic_int n_main; /* main layers of the session's model: the rest are mtp.I */
    mx_family *f_state, *f_epoch, *f_steps, *f_step_s, *f_disp_s, *f_exp_s, *f_comb_s, *f_bytes,
        *f_msgs, *f_tokens, *f_pairs, *f_weight, *f_read, *f_progress, *f_loads, *f_refused,
        *f_build, *f_info;
    /* the serving path */
    mx_family *f_req, *f_req_s, *f_queue_s, *f_busy, *f_replays, *f_resends, *f_inflight,
        *f_credits, *f_batch, *f_batch_jobs, *f_reads;
    mx_series *req[WMX_N_KINDS][WMX_N_CODES], *busy[2], *replays[2], *resends, *inflight[2],
        *credits, *batch, *batch_jobs, *reads;
    mx_series *req_s[WMX_LAYERS], *queue_s[WMX_LAYERS];
    mx_series *state[WMX_N_STATES], *epoch, *ok, *failed, *bytes[2], *msgs[2], *weight, *read,
        *progress, *pairs, *loads[WMX_N_LOAD_KINDS];
    /* [0] is the only series without per_layer */
    mx_series *step_s[WMX_LAYERS], *disp_s[WMX_LAYERS], *exp_s[WMX_LAYERS], *comb_s[WMX_LAYERS];
    mx_series **tokens[WMX_LAYERS]; /* per_layer: [MC_MAX_EXPERTS] per layer, on first use */
};

static mx_family *wmx_hist(wmx *m, const char *name, const char *help)
{
    return mx_family_s(m->reg, MX_HISTOGRAM, name, help, m->per_layer ? "layer" : NULL);
}

static void wmx_families(wmx *m)
{
    m->f_state =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_state", "1 for the worker's state", "state");
    m->f_epoch =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_epoch", "The placement epoch served", NULL);
    m->f_steps = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_steps_total",
                             "Steps answered, by result", "result");
    m->f_step_s = wmx_hist(m, "epmoe_worker_step_duration_seconds",
                           "The worker's own part of a step, to its STEP_DONE");
    m->f_disp_s = wmx_hist(m, "epmoe_worker_dispatch_seconds",
                           "From the end of routing to the last DISPATCH sent");
    m->f_exp_s = wmx_hist(m, "epmoe_worker_expert_seconds",
                          "Routed-expert kernels of a step (own and served pairs)");
    m->f_comb_s = wmx_hist(m, "epmoe_worker_combine_seconds", "Waiting for the step's COMBINEs");
    m->f_bytes = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_dataplane_bytes_total",
                             "Data-plane payload bytes sent", "kind");
    m->f_msgs = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_dataplane_messages_total",
                            "Data-plane messages sent", "kind");
    m->f_pairs = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_expert_pairs_total",
                             "(token, expert) pairs this worker computed", NULL);
    if (m->per_layer)
        m->f_tokens = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_expert_tokens_total",
                                  "(token, expert) pairs this worker computed, by layer and expert",
                                  "layer,expert");
    m->f_weight = mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_weight_bytes",
                              "Backend memory the loaded layers hold", NULL);
    m->f_read = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_load_read_bytes_total",
                            "Checkpoint bytes the loads read", NULL);
    m->f_progress = mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_load_progress_ratio",
                                "Progress of the load in progress, 0..1 (1 when none)", NULL);
    m->f_loads = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_loads_total",
                             "Loads: load, epoch, staged, commit", "kind");
    m->f_build = mx_family_s(m->reg, MX_GAUGE, "epmoe_build_info",
                             "1, labelled with the version of this binary", "version");
    m->f_info = mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_info",
                            "1, labelled with the worker's name, rank and device (rank -1 until "
                            "a coordinator welcomed it)",
                            "worker,rank,device");
}

static void wmx_serving_families(wmx *m)
{
    m->f_req = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_requests_total",
                           "Requests answered at this entry, by layer kind, result and error code",
                           "kind,result,code");
    m->f_req_s = wmx_hist(m, "epmoe_worker_request_duration_seconds",
                          "SUBMIT to RESULT at this entry, of the requests answered ok");
    m->f_queue_s = wmx_hist(m, "epmoe_worker_request_queue_seconds",
                            "SUBMIT to routed at this entry (waiting for an epoch to serve)");
    m->f_busy =
        mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_busy_refusals_total",
                    "SUBMITs refused ERR_BUSY, by the limit reached: client, entry", "limit");
    m->f_replays =
        mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_replays_total",
                    "Requests dispatched again: refused by a peer, or an epoch change", "reason");
    m->f_resends = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_resends_total",
                               "SUBMITs a client resent while in flight (kept once)", NULL);
    m->f_inflight =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_requests_in_flight",
                    "Requests this entry holds: waiting for an epoch, running", "phase");
    m->f_credits =
        mx_family_s(m->reg, MX_GAUGE, "epmoe_worker_credits_in_use",
                    "Credits in use; dispatch: DISPATCHes sent without their COMBINE", "kind");
    m->f_batch = mx_family_new(m->reg, MX_HISTOGRAM, "epmoe_worker_expert_batch_pairs",
                               "(token, expert) pairs per expert call of the serving queue", NULL,
                               wmx_pair_buckets, 17);
    m->f_batch_jobs = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_expert_batch_jobs_total",
                                  "DISPATCHes (and own parts) the serving queue's calls ran", NULL);
    m->f_reads = mx_family_s(m->reg, MX_COUNTER, "epmoe_worker_expert_reads_total",
                             "Distinct experts the serving queue's calls read", NULL);
}

/* Every serving series at 0 from the start (per-layer histograms: on first use). */
static void wmx_serving_series(wmx *m)
{
    for (int k = 0; k < WMX_N_KINDS; k++)
        for (int c = 0; c < WMX_N_CODES; c++) {
            const char *v[3] = {wmx_kinds[k], c ? "failed" : "ok",
                                wire_code_name(wmx_codes[c], "ERR_UNKNOWN")};
            m->req[k][c] = mx_series_of(m->f_req, v);
        }
    m->busy[0] = mx_series1(m->f_busy, "entry");
    m->busy[1] = mx_series1(m->f_busy, "client");
    m->replays[0] = mx_series1(m->f_replays, "refused");
    m->replays[1] = mx_series1(m->f_replays, "epoch");
    m->resends = mx_series0(m->f_resends);
    m->inflight[0] = mx_series1(m->f_inflight, "waiting");
    m->inflight[1] = mx_series1(m->f_inflight, "running");
    m->credits = mx_series1(m->f_credits, "dispatch");
    m->batch = mx_series0(m->f_batch);
    m->batch_jobs = mx_series0(m->f_batch_jobs);
    m->reads = mx_series0(m->f_reads);
    if (!m->per_layer) {
        m->req_s[0] = mx_series0(m->f_req_s);
        m->queue_s[0] = mx_series0(m->f_queue_s);
    }
}

wmx *wmx_create(bool per_layer, ep_err *err)
{
    wmx *m = calloc(1, sizeof *m);
    if (m == NULL || (m->reg = mx_create(err)) == NULL)
        goto fail;
    m->per_layer = per_layer;
    wmx_families(m);
    wmx_serving_families(m);
    wmx_serving_series(m);
    for (int i = 0; i < WMX_N_STATES; i++)
        m->state[i] = mx_series1(m->f_state, wmx_states[i]);
    m->epoch = mx_series0(m->f_epoch);
    m->ok = mx_series1(m->f_steps, "ok");
    m->failed = mx_series1(m->f_steps, "failed");
    m->bytes[0] = mx_series1(m->f_bytes, "dispatch");
    m->bytes[1] = mx_series1(m->f_bytes, "combine");
    m->msgs[0] = mx_series1(m->f_msgs, "dispatch");
    m->msgs[1] = mx_series1(m->f_msgs, "combine");
    m->pairs = mx_series0(m->f_pairs);
    m->weight = mx_series0(m->f_weight);
    m->read = mx_series0(m->f_read);
    m->progress = mx_series0(m->f_progress);
    for (int i = 0; i < WMX_N_LOAD_KINDS; i++) /* at 0 from the start: rate() sees the first */
        m->loads[i] = mx_series1(m->f_loads, wmx_load_kinds[i]);
    mx_set(mx_series1(m->f_build, EPMOE_VERSION_STRING), 1);
    if (!per_layer) {
        m->step_s[0] = mx_series0(m->f_step_s);
        m->disp_s[0] = mx_series0(m->f_disp_s);
        m->exp_s[0] = mx_series0(m->f_exp_s);
        m->comb_s[0] = mx_series0(m->f_comb_s);
    }
    atomic_store(&m->n_main, WMX_LAYERS);
    return m;
fail:
    if (m != NULL && m->reg == NULL)
        ep_err_set(err, "metrics: out of memory");
    wmx_destroy(&m);
    return NULL;
}

void wmx_destroy(wmx **self_p)
{
    wmx *m = self_p ? *self_p : NULL;
    if (m == NULL)
        return;
    mx_http_stop(&m->http);
    mx_destroy(&m->reg);
    for (int l = 0; l < WMX_LAYERS; l++)
        free(m->tokens[l]);
    free(m);
    *self_p = NULL;
}

int wmx_serve(wmx *m, const char *addr, ep_err *err)
{
    if (m == NULL || strcmp(addr, m->addr) == 0)
        return 0;
    mx_http_stop(&m->http);
    m->addr[0] = '\0';
    if (addr[0] == '\0')
        return 0;
    m->http = mx_http_start(m->reg, addr, err);
    if (m->http == NULL)
        return -1;
    snprintf(m->addr, sizeof m->addr, "%s", addr);
    log_info("metrics: serving http://%s/metrics", addr);
    return 0;
}

int wmx_port(const wmx *m)
{
    return m ? mx_http_port(m->http) : 0;
}

void wmx_state(wmx *m, const char *state)
{
    for (int i = 0; m && i < WMX_N_STATES; i++)
        mx_set(m->state[i], strcmp(state, wmx_states[i]) == 0);
}

void wmx_epoch(wmx *m, uint64_t epoch)
{
    if (m)
        mx_set(m->epoch, (double)epoch);
}

void wmx_step_result(wmx *m, bool ok)
{
    if (m)
        mx_add(ok ? m->ok : m->failed, 1);
}

/* A layer as epmoectl names it: "3", or "mtp.0" past the main layers. */
static void wmx_layer_label(const wmx *m, int l, char *v, size_t cap)
{
    int n_main = atomic_load(&m->n_main);
    if (l < n_main)
        snprintf(v, cap, "%d", l);
    else
        snprintf(v, cap, "mtp.%d", l - n_main);
}

static mx_series *wmx_layer(const wmx *m, mx_family *f, mx_series **cache, int l)
{
    if (!m->per_layer)
        return cache[0];
    if (l < 0 || l >= WMX_LAYERS)
        return NULL;
    if (cache[l] == NULL) {
        char v[16];
        wmx_layer_label(m, l, v, sizeof v);
        cache[l] = mx_series1(f, v);
    }
    return cache[l];
}

void wmx_step(wmx *m, int layer, double total_s, double dispatch_s, double expert_s,
              double combine_s)
{
    if (m == NULL)
        return;
    mx_observe(wmx_layer(m, m->f_step_s, m->step_s, layer), total_s);
    mx_observe(wmx_layer(m, m->f_disp_s, m->disp_s, layer), dispatch_s);
    mx_observe(wmx_layer(m, m->f_exp_s, m->exp_s, layer), expert_s);
    mx_observe(wmx_layer(m, m->f_comb_s, m->comb_s, layer), combine_s);
}

void wmx_sent(wmx *m, bool combine, uint64_t bytes)
{
    if (m == NULL)
        return;
    mx_add(m->bytes[combine], (double)bytes);
    mx_add(m->msgs[combine], 1);
}

void wmx_expert_pairs(wmx *m, int layer, int expert, uint32_t pairs)
{
    if (m == NULL || layer < 0 || layer >= WMX_LAYERS || expert < 0 || expert >= MC_MAX_EXPERTS)
        return;
    mx_add(m->pairs, pairs);
    if (!m->per_layer)
        return;
    if (m->tokens[layer] == NULL &&
        (m->tokens[layer] = calloc(MC_MAX_EXPERTS, sizeof *m->tokens[layer])) == NULL)
        return;
    mx_series **c = &m->tokens[layer][expert];
    if (*c == NULL) {
        char lv[16], ev[16];
        wmx_layer_label(m, layer, lv, sizeof lv);
        snprintf(ev, sizeof ev, "%d", expert);
        *c = mx_series2(m->f_tokens, lv, ev);
    }
    mx_add(*c, pairs);
}

void wmx_load_progress(wmx *m, uint64_t done, uint64_t total)
{
    if (m)
        mx_set(m->progress, total ? (double)(done < total ? done : total) / (double)total : 1.0);
}

void wmx_loaded(wmx *m, const char *kind, uint64_t bytes_read, uint64_t weight_bytes)
{
    if (m == NULL)
        return;
    int k = 0;
    while (k < WMX_N_LOAD_KINDS && strcmp(kind, wmx_load_kinds[k]) != 0)
        k++;
    mx_add(k < WMX_N_LOAD_KINDS ? m->loads[k] : mx_series1(m->f_loads, kind), 1);
    mx_add(m->read, (double)bytes_read);
    mx_set(m->weight, (double)weight_bytes);
    mx_set(m->progress, 1.0);
}

void wmx_handshakes(wmx *m)
{
    if (m == NULL)
        return;
    m->f_refused = mx_family_s(m->reg, MX_COUNTER, "epmoe_handshakes_refused_total",
                               "Connections a CURVE socket refused, by ZAP domain and reason",
                               "domain,reason");
    for (int r = 0; r < AUTH_N_REASONS; r++)
        mx_series2(m->f_refused, AUTH_DOMAIN_DATA, auth_reason_name((auth_reason)r));
}

void wmx_handshake_refused(void *ctx, const char *domain, auth_reason reason)
{
    wmx *m = ctx;
    if (m != NULL && m->f_refused != NULL)
        mx_add(mx_series2(m->f_refused, domain, auth_reason_name(reason)), 1);
}

void wmx_session(wmx *m, const char *name, int rank, const char *device, int n_main_layers)
{
    if (m == NULL)
        return;
    /* the layer labels are fixed once a series exists: set before the session's first step */
    if (n_main_layers > 0)
        atomic_store(&m->n_main, n_main_layers);
    char rv[16];
    snprintf(rv, sizeof rv, "%d", rank);
    mx_clear(m->f_info); /* one series: the rank may change with each WELCOME */
    const char *v[3] = {name, rv, device};
    mx_set(mx_series_of(m->f_info, v), 1);
}

/* ---- the serving path ---------------------------------------------------------------------- */

void wmx_request(wmx *m, wmx_kind kind, int code)
{
    if (m == NULL)
        return;
    int k = kind >= WMX_ROUTED && kind <= WMX_UNKNOWN ? (int)kind : WMX_UNKNOWN;
    for (int c = 0; c < WMX_N_CODES; c++)
        if (wmx_codes[c] == code) {
            mx_add(m->req[k][c], 1);
            return;
        }
    const char *v[3] = {wmx_kinds[k], code ? "failed" : "ok", wire_code_name(code, "ERR_UNKNOWN")};
    mx_add(mx_series_of(m->f_req, v), 1);
}

void wmx_request_times(wmx *m, int layer, double total_s, double queue_s)
{
    if (m == NULL)
        return;
    mx_observe(wmx_layer(m, m->f_req_s, m->req_s, layer), total_s);
    mx_observe(wmx_layer(m, m->f_queue_s, m->queue_s, layer), queue_s);
}

void wmx_busy(wmx *m, bool client_limit)
{
    if (m)
        mx_add(m->busy[client_limit], 1);
}

void wmx_replay(wmx *m, bool epoch)
{
    if (m)
        mx_add(m->replays[epoch], 1);
}

void wmx_resend(wmx *m)
{
    if (m)
        mx_add(m->resends, 1);
}

void wmx_batch(wmx *m, int jobs, uint64_t pairs, uint64_t experts_read)
{
    if (m == NULL)
        return;
    mx_observe(m->batch, (double)pairs);
    mx_add(m->batch_jobs, jobs);
    mx_add(m->reads, (double)experts_read);
}

void wmx_in_flight(wmx *m, int waiting, int running, int credits)
{
    if (m == NULL)
        return;
    mx_set(m->inflight[0], waiting);
    mx_set(m->inflight[1], running);
    mx_set(m->credits, credits);
}
