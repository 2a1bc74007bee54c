/*
 * serve.h — the serving path of a worker (prefix srv_): clients submit MoE layer calls at this
 * worker's client endpoint, and it is their origin; it also answers the DISPATCHes other
 * origins send it. docs/protocol.md "Serving path".
 *
 * Origin half: SUBMIT -> route + quantize (mb_step_begin) -> the dispatch plan (plan.h) -> one
 * DISPATCH per rank its pairs go to (at most TPZ_SERVE_CREDITS without their COMBINE per rank;
 * more wait) and its own pairs into the serving queue -> the COMBINEs scattered into [T, k, H]
 * -> mb_step_finish -> RESULT. The shared expert runs in between, for every request of a layer
 * in flight at once (mb_steps_shared), when nothing waits for this worker, or else at the
 * combine (a GPU starts it at the start). A refused part (the receiver's
 * placement moved) is dispatched again under the current placement after a short backoff; a
 * placement change (srv_epoch_begin/end around the executor's epoch switch) restarts every
 * request in flight in the new epoch, so a request is computed with one epoch's layers and
 * never lost to a dead owner once the coordinator has moved its experts. A request that is not
 * answered by its deadline fails with ERR_TIMEOUT naming the ranks it waited for.
 *
 * Serving half: DISPATCHes of any origin (and this worker's own pairs) wait in one queue; each
 * srv_run takes every job waiting and runs each layer's jobs as one mb_experts call (rows of all
 * of them concatenated), so an expert's rows from several requests form one GEMM. The exact
 * kernels give the same bits whatever the batch, so batching never shows in a result.
 *
 * Not thread-safe: the executor thread owns the server and lends it what it needs (srv_env)
 * at every call, since its layers, session and data plane change under epochs.
 */
#ifndef EPMOE_SERVE_H
#define EPMOE_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"
#include "worker/serve_state.h"

/* The largest frame a legal SUBMIT of a model of this hidden size carries: hidden states bf16
 * [EP_MAX_TOKENS, H] (the token ids, [EP_MAX_TOKENS] int64, and the body are smaller). */
int64_t srv_max_frame(int hidden);
/* Bind the client ROUTER at endpoint ("tcp://HOST:*" binds an ephemeral port). max_frame
 * (srv_max_frame of the model) is its ZMQ_MAXMSGSIZE: libzmq closes a connection that announces
 * a larger frame before buffering any of it; a connection that stalls mid-frame is closed
 * after srv_stall_ms(max_frame) (serve_state.h). With key, a CURVE server with that key pair
 * (ZAP domain AUTH_DOMAIN_CLIENTS: the keys WELCOME.client_keys names may submit). */
srv_server *srv_create(void *zctx, const char *endpoint, const auth_keypair *key, int64_t max_frame,
                       ep_err *err);
/* The bound srv_create was given. */
int64_t srv_get_max_frame(const srv_server *s);
/* How long a connection may go without completing a frame: SRV_STALL_MS plus max_frame at
 * SRV_MIN_RATE. */
int srv_stall_ms(int64_t max_frame);
/* Fail every request still held (ERR_SHUTTING_DOWN) and close. NULL-safe. */
void srv_destroy(srv_server **self_p);
/* The endpoint bound (ephemeral port resolved), for READY. */
const char *srv_endpoint(const srv_server *s);
/* The ROUTER, to poll for ZMQ_POLLIN. */
void *srv_socket(srv_server *s);
/* The default client endpoint for a data endpoint: an ephemeral port on its host
 * ("tcp://10.0.0.1:7500" -> "tcp://10.0.0.1:*"; "ipc://P" -> "ipc://P.client"). */
void srv_default_endpoint(const char *data_endpoint, char *out, size_t cap);

/* A SUBMIT body r and its payload frames in m against env's session: 0 when it may be served,
 * else -1 with the code to answer (ERR_BAD_REQUEST, ERR_NOT_READY, ERR_CONFIG_HASH) and err
 * naming what is wrong. Reads nothing beyond m's frames (fuzz_submit). */
int srv_check_submit(const srv_env *env, const Epmoe__Submit *r, const wire_msg *m,
                     Epmoe__ErrorCode *code, ep_err *err);
/* Read every SUBMIT waiting on the client socket and start (or refuse) each. */
void srv_on_client(srv_server *s, const srv_env *env);
/* Whether request (an id of this server) waits for the COMBINE of its attempt from src_rank:
 * the tpz_awaits_fn the executor gives the data plane (ctx: the server), so a COMBINE no part
 * waits for is dropped on arrival (srv_on_data would drop it anyway) and takes no credit. */
bool srv_awaits(void *ctx, uint64_t request, uint32_t attempt, int src_rank);
/* Take the serving path's messages the data plane kept: DISPATCHes into the queue, COMBINEs to
 * their requests. */
void srv_on_data(srv_server *s, const srv_env *env);
/* Run the queue (batched per layer), send what can be sent, answer what is complete, retry
 * refused parts, fail what passed its deadline. Call after srv_on_client / srv_on_data. */
void srv_run(srv_server *s, const srv_env *env);
/* Milliseconds until srv_run has something to do on its own (a retry or a deadline); 1000 if
 * nothing. */
int64_t srv_idle_timeout_ms(const srv_server *s);

/* The placement, the layers or the data plane are about to change (EPOCH, EPOCH_COMMIT, a new
 * session): every request in flight drops what it holds of the old ones (its backend step, its
 * sent parts) and waits; queued DISPATCHes of peers stay. */
void srv_epoch_begin(srv_server *s);
/* They changed (env->ready: serving again): the waiting requests start again in the new epoch. */
void srv_epoch_end(srv_server *s, const srv_env *env);

/* The load of the requests this worker was the origin of since the last call, as LOAD_REPORT
 * bodies: calls fn once per layer with load (fn sends it). */
typedef void (*srv_report_fn)(void *ctx, const Epmoe__LoadReport *r);
void srv_report(srv_server *s, const srv_env *env, srv_report_fn fn, void *ctx);

/* The peers found suspect since the last call (no COMBINE for the progress timeout), as
 * PEER_UNREACHABLE bodies: calls fn once per peer (fn sends it to the coordinator). */
typedef void (*srv_peer_fn)(void *ctx, const Epmoe__PeerUnreachable *u);
void srv_peer_reports(srv_server *s, const srv_env *env, srv_peer_fn fn, void *ctx);

void srv_get_stats(const srv_server *s, srv_stats *out);

/* EPMOE_TEST_NO_FAILOVER (tests only, set once by main before any server runs): off, an origin
 * fails a request where it would replay it (a refused part, a suspect peer, a placement change),
 * so that the fault tolerance's steady-state cost can be measured against a run without it. */
void srv_set_failover(bool on);

#endif
