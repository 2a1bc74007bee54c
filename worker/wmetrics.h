/*
 * wmetrics.h — a worker's Prometheus metrics (prefix wmx_). The main thread reports its
 * lifecycle, the executor its steps and loads; the registry is thread-safe (common/metrics.h),
 * so both update it directly. Served on the spec's per-worker `metrics` address, which WELCOME
 * carries (docs/operations.md "Metrics").
 *
 * Cardinality (docs/operations.md "Metrics", the budget): by default nothing is labelled by
 * layer or expert, so a worker serves about 215 series whatever the model (V4-Flash: 43 layers
 * + MTP, 256 experts); with per_layer (EPMOE_METRICS_PER_LAYER=1) the step histograms are
 * labelled by layer and the pairs by (layer, expert), thousands of series.
 *
 *   epmoe_build_info{version}                  1
 *   epmoe_worker_info{worker,rank,device}      1 (rank -1 until welcomed)
 *   epmoe_worker_state{state}                  1 for the worker's state
 *   epmoe_worker_epoch                         the placement epoch it serves
 *   epmoe_worker_steps_total{result}           steps answered: ok, failed
 *   epmoe_worker_step_duration_seconds[{layer}] its own part of a step (to STEP_DONE)
 *   epmoe_worker_dispatch_seconds[{layer}]     routing end to its last DISPATCH sent
 *   epmoe_worker_expert_seconds[{layer}]       routed-expert kernels (own and served pairs)
 *   epmoe_worker_combine_seconds[{layer}]      waiting for its COMBINEs
 *   epmoe_worker_dataplane_bytes_total{kind}     payload bytes sent: dispatch, combine
 *   epmoe_worker_dataplane_messages_total{kind}  data-plane messages sent: dispatch, combine
 *   epmoe_worker_expert_pairs_total            (token, expert) pairs this worker computed
 *   epmoe_worker_expert_tokens_total{layer,expert} the same by layer and expert (per_layer)
 *   epmoe_worker_weight_bytes                  backend memory its layers hold
 *   epmoe_worker_load_read_bytes_total         checkpoint bytes its loads read
 *   epmoe_worker_load_progress_ratio           the load in progress, 0..1
 *   epmoe_worker_loads_total{kind}             loads: load, epoch, staged, commit
 *   epmoe_handshakes_refused_total{domain,reason}  refused at the data endpoint (with a key)
 * The serving path (issue 23), at the entry unless said:
 *   epmoe_worker_requests_total{kind,result,code}  requests answered, by layer kind (routed,
 *                                              hash, mtp; unknown: not a layer of the model),
 *                                              result (ok, failed) and code
 *   epmoe_worker_request_duration_seconds[{layer}] SUBMIT to RESULT of the requests answered ok
 *   epmoe_worker_request_queue_seconds[{layer}]    SUBMIT to routed (waiting for an epoch)
 *   epmoe_worker_busy_refusals_total{limit}    SUBMITs refused ERR_BUSY: client, entry
 *   epmoe_worker_replays_total{reason}         parts dispatched again: refused (by a peer whose
 *                                              placement moved), epoch (an epoch change)
 *   epmoe_worker_resends_total                 SUBMITs a client resent while in flight (kept once)
 *   epmoe_worker_requests_in_flight{phase}     held now: waiting (for an epoch), running
 *   epmoe_worker_credits_in_use{kind}          dispatch: DISPATCHes sent to peers without their
 *                                              COMBINE (TPZ_SERVE_CREDITS per peer)
 *   epmoe_worker_expert_batch_pairs            (as a server) pairs per mb_experts call (histogram)
 *   epmoe_worker_expert_batch_jobs_total       DISPATCHes (and own parts) those calls ran
 *   epmoe_worker_expert_reads_total            distinct experts those calls read: pairs per
 *                                              expert read = expert_pairs_total / this
 *
 * Layers are labelled as epmoectl names them: "3", "mtp.0".
 */
#ifndef EPMOE_WMETRICS_H
#define EPMOE_WMETRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"

typedef struct wmx wmx;

wmx *wmx_create(bool per_layer, ep_err *err);
void wmx_destroy(wmx **self_p);
/* Serve /metrics on addr (once; a different address later restarts the server). "" stops it. */
int wmx_serve(wmx *m, const char *addr, ep_err *err);
int wmx_port(const wmx *m);

void wmx_state(wmx *m, const char *state);
/* A WELCOME: the info series, and the main layers of the model (the rest are mtp.I; 0: not
 * known yet). */
void wmx_session(wmx *m, const char *name, int rank, const char *device, int n_main_layers);
void wmx_epoch(wmx *m, uint64_t epoch);
void wmx_step_result(wmx *m, bool ok);
void wmx_step(wmx *m, int layer, double total_s, double dispatch_s, double expert_s,
              double combine_s);
void wmx_sent(wmx *m, bool combine, uint64_t bytes);
/* pairs this worker computed for expert e of layer (served or local) */
void wmx_expert_pairs(wmx *m, int layer, int expert, uint32_t pairs);
void wmx_load_progress(wmx *m, uint64_t done, uint64_t total);
void wmx_loaded(wmx *m, const char *kind, uint64_t bytes_read, uint64_t weight_bytes);
/* The serving path. A request answered at its entry: ok (code 0) or failed with its code. */
typedef enum wmx_kind { WMX_ROUTED = 0, WMX_HASH = 1, WMX_MTP = 2, WMX_UNKNOWN = 3 } wmx_kind;
void wmx_request(wmx *m, wmx_kind kind, int code);
/* An answered request's time from SUBMIT to RESULT, and to its routing. */
void wmx_request_times(wmx *m, int layer, double total_s, double queue_s);
void wmx_busy(wmx *m, bool client_limit); /* refused: the client's limit, or the entry's */
void wmx_replay(wmx *m, bool epoch);      /* dispatched again: an epoch change, or refused */
void wmx_resend(wmx *m);
/* One mb_experts call of the serving queue: jobs batched, their pairs, distinct experts read. */
void wmx_batch(wmx *m, int jobs, uint64_t pairs, uint64_t experts_read);
/* The gauges: requests held (waiting, running), DISPATCH credits in use. */
void wmx_in_flight(wmx *m, int waiting, int running, int credits);
/* With a key: epmoe_handshakes_refused_total{domain,reason} at 0 for the data endpoint; then
 * wmx_handshake_refused counts (an auth_refusal_fn: ctx is the wmx). */
void wmx_handshakes(wmx *m);
void wmx_handshake_refused(void *ctx, const char *domain, auth_reason reason);

#endif
