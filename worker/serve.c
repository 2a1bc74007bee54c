/*
 * serve.c — the serving path of a worker (see serve.h).
 *
 * A request lives in one slot of a fixed pool; its id on the data plane is the slot index in
 * the low 16 bits above a counter that never repeats within the server's life, so a late
 * COMBINE of a finished request can never be taken for a new one. Its slots (token, expert
 * pairs) are sent in parts: one part per rank and attempt; a part is live until its COMBINE
 * came back (done) or it was replaced (a refusal, an epoch change).
 */
#include "worker/serve.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/checkpoint.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/wire.h"
#include "kernels/formats.h"
#include "worker/plan.h"
#include "worker/serve_experts.h"
#include "worker/wmetrics.h"

/* ---- the server ---------------------------------------------------------------------------- */

void srv_default_endpoint(const char *data_endpoint, char *out, size_t cap)
{
    if (strncmp(data_endpoint, "ipc://", 6) == 0) {
        snprintf(out, cap, "%s.client", data_endpoint);
        return;
    }
    const char *host = strncmp(data_endpoint, "tcp://", 6) == 0 ? data_endpoint + 6 : "127.0.0.1";
    const char *colon = strrchr(host, ':');
    int n = colon ? (int)(colon - host) : (int)strlen(host);
    snprintf(out, cap, "tcp://%.*s:*", n, host);
}

int64_t srv_max_frame(int hidden)
{
    int64_t x = (int64_t)EP_MAX_TOKENS * hidden * 2, ids = (int64_t)EP_MAX_TOKENS * 8;
    int64_t m = x > ids ? x : ids;
    return m > SRV_MAX_BODY ? m : SRV_MAX_BODY;
}

int srv_stall_ms(int64_t max_frame)
{
    return SRV_STALL_MS + (int)(max_frame * 1000 / SRV_MIN_RATE);
}

/* Heartbeats drop a connection that completes no frame for srv_stall_ms (serve_state.h). */
static int srv_socket_options(void *sock, int64_t max_frame, ep_err *err)
{
    int one = 1, ivl = SRV_HEARTBEAT_MS, timeout = srv_stall_ms(max_frame);
    if (wire_socket_defaults(sock, max_frame, err) != 0)
        return -1;
    if (zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout) != 0)
        return ep_err_set(err, "client endpoint: %s", zmq_strerror(zmq_errno()));
    return 0;
}

/* Bind, retrying for up to 2 s while the address is still held: the endpoint reopened at its
 * own address (exec_open_client), which libzmq releases asynchronously after zmq_close. */
static int srv_bind(void *sock, const char *endpoint)
{
    for (int waited = 0;; waited += 10) {
        if (zmq_bind(sock, endpoint) == 0)
            return 0;
        if (zmq_errno() != EADDRINUSE || waited >= 2000)
            return -1;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* EPMOE_TEST_NO_FAILOVER clears it (srv_set_failover): tests measure what replay costs. */
static bool srv_failover = true;

void srv_set_failover(bool on)
{
    srv_failover = on;
}

srv_server *srv_create(void *zctx, const char *endpoint, const auth_keypair *key, int64_t max_frame,
                       ep_err *err)
{
    srv_server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        ep_err_set(err, "client endpoint: out of memory");
        return NULL;
    }
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)s;
    s->next_id = (seed & 0xffffffffull) << 16;
    s->max_frame = max_frame;
    s->sock = zmq_socket(zctx, ZMQ_ROUTER);
    if (s->sock == NULL || srv_socket_options(s->sock, max_frame, err) != 0 ||
        (key && auth_server(s->sock, key, AUTH_DOMAIN_CLIENTS, err) != 0)) {
        if (s->sock && !err->msg[0])
            ep_err_set(err, "client endpoint: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (srv_bind(s->sock, endpoint) != 0) {
        ep_err_set(err, "client endpoint %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto fail;
    }
    size_t len = sizeof s->endpoint;
    zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, s->endpoint, &len);
    s->secure = key != NULL;
    return s;
fail:
    if (s->sock)
        zmq_close(s->sock);
    free(s);
    return NULL;
}

int64_t srv_get_max_frame(const srv_server *s)
{
    return s->max_frame;
}

const char *srv_endpoint(const srv_server *s)
{
    return s->endpoint;
}

void *srv_socket(srv_server *s)
{
    return s->sock;
}

void srv_get_stats(const srv_server *s, srv_stats *out)
{
    *out = s->stats;
}

/* The per-world tables, (re)made when the world's shape changes. */
static int srv_shape(srv_server *s, const srv_env *env)
{
    const mc_config *c = &env->session->config;
    int P = env->session->world_size, E = c->n_routed_experts, L = mc_num_layers(c);
    s->n_main = c->num_hidden_layers;
    s->n_hash = c->num_hash_layers;
    if (s->out_credit && P == s->P && E == s->E && L == s->L)
        return 0;
    free(s->out_credit);
    free(s->heard_ms);
    free(s->suspect_ms);
    free(s->report_due);
    free(s->route_ok);
    for (int l = 0; s->load && l < s->L; l++) {
        free(s->load[l].expert);
        free(s->load[l].rank);
    }
    free(s->load);
    s->P = P;
    s->E = E;
    s->L = L;
    s->out_credit = calloc((size_t)P, sizeof *s->out_credit);
    s->heard_ms = calloc((size_t)P, sizeof *s->heard_ms);
    s->suspect_ms = calloc((size_t)P, sizeof *s->suspect_ms);
    s->report_due = calloc((size_t)P, 1);
    s->route_ok = calloc((size_t)P, 1);
    if (!s->heard_ms || !s->suspect_ms || !s->report_due || !s->route_ok)
        return -1;
    s->load = calloc((size_t)L, sizeof *s->load);
    for (int l = 0; s->load && l < L; l++) {
        s->load[l].expert = calloc((size_t)E, sizeof(uint32_t));
        s->load[l].rank = calloc((size_t)P, sizeof(uint32_t));
        if (!s->load[l].expert || !s->load[l].rank)
            return -1;
    }
    return s->out_credit && s->load ? 0 : -1;
}

/* ---- answering a client -------------------------------------------------------------------- */

static void srv_send_result(srv_server *s, const uint8_t *ident, size_t ident_len,
                            const Epmoe__Result *res, wire_payload *pl, int n)
{
    /* every answer tells the client its credit here and the epoch served (docs/protocol.md) */
    Epmoe__Result rr = *res, *r = &rr;
    rr.has_credit = 1;
    rr.credit = SRV_MAX_CLIENT_REQUESTS;
    rr.has_serving_epoch = s->serving_epoch != 0;
    rr.serving_epoch = s->serving_epoch;
    ep_err err;
    if (wire_send(s->sock, ident, ident_len, EPMOE__MSG_TYPE__MSG_RESULT, &r->base, pl, n, true,
                  &err) != 0)
        log_limited(&s->log, SRV_LOG_PER_SEC, LOG_WARN,
                    "serving: RESULT of request %llu of client %016llx not sent: %s",
                    (unsigned long long)r->seq, (unsigned long long)r->client, err.msg);
}

static void srv_refuse(srv_server *s, int layer, const uint8_t *ident, size_t ident_len,
                       uint64_t client, uint64_t seq, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

/* The kind a request of layer is counted under (metrics). */
static wmx_kind srv_kind(const srv_server *s, int layer)
{
    if (layer < 0 || layer >= s->L)
        return WMX_UNKNOWN;
    return layer >= s->n_main ? WMX_MTP : layer < s->n_hash ? WMX_HASH : WMX_ROUTED;
}

/* A Result {code, message} for request (client, seq) of layer (-1: not known), counted busy or
 * failed. */
static void srv_refuse_err(srv_server *s, int layer, const uint8_t *ident, size_t ident_len,
                           uint64_t client, uint64_t seq, const ep_err *err)
{
    Epmoe__Result r = EPMOE__RESULT__INIT;
    r.has_client = r.has_seq = r.has_code = 1;
    r.client = client;
    r.seq = seq;
    r.code = wire_code(err);
    r.message = (char *)err->msg; /* borrowed for the packing */
    srv_send_result(s, ident, ident_len, &r, NULL, 0);
    wmx_step_result(s->mx, false); /* a request that failed (or was refused) at its entry */
    wmx_request(s->mx, srv_kind(s, layer), (int)r.code);
    if (s->load && layer >= 0 && layer < s->L && r.code < SRV_N_CODES)
        s->load[layer].failed[r.code]++;
    if (err->code == EP_ERR_BUSY)
        s->stats.busy++;
    else
        s->stats.failed++;
}

static void srv_refuse(srv_server *s, int layer, const uint8_t *ident, size_t ident_len,
                       uint64_t client, uint64_t seq, Epmoe__ErrorCode code, const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    srv_refuse_err(s, layer, ident, ident_len, client, seq, &err);
}

/* ---- requests ------------------------------------------------------------------------------ */

/* Drop what a request holds of an epoch (its backend step and parts). */
static void srv_req_unroute(srv_server *s, srv_req *q)
{
    mb_step_free(&q->ms);
    for (int i = 0; i < q->n_parts; i++) {
        srv_part *p = &q->part[i];
        if (p->credit && s->out_credit && p->peer < s->P)
            s->out_credit[p->peer]--;
        free(p->slot);
    }
    q->n_parts = 0;
}

static void srv_req_free(srv_server *s, srv_req *q)
{
    srv_req_unroute(s, q);
    free(q->part);
    free(q->x);
    free(q->ids);
    free(q->topk_ids);
    free(q->topk_w);
    free(q->q);
    free(q->qs);
    free(q->xn);
    free(q->eo);
    /* its own jobs still queued refer to it */
    for (int j = 0; j < s->n_jobs; j++)
        if (s->job[j].own == q)
            s->job[j].own = NULL;
    *q = (srv_req){0};
}

static void srv_fail(srv_server *s, srv_req *q, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void srv_fail(srv_server *s, srv_req *q, Epmoe__ErrorCode code, const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    srv_refuse_err(s, q->layer, q->ident, q->ident_len, q->client, q->seq, &err);
    srv_req_free(s, q);
}

static srv_req *srv_find(srv_server *s, uint64_t id)
{
    srv_req *q = &s->req[id & 0xffff & (SRV_MAX_REQUESTS - 1)];
    return q->phase == SRV_RUNNING && q->id == id ? q : NULL;
}

static int srv_add_part(srv_req *q, int peer, uint32_t *slot, int n)
{
    if (q->n_parts == q->cap_parts) {
        int cap = q->cap_parts ? 2 * q->cap_parts : 8;
        srv_part *p = realloc(q->part, (size_t)cap * sizeof *p);
        if (p == NULL)
            return -1;
        q->part = p;
        q->cap_parts = cap;
    }
    q->part[q->n_parts++] = (srv_part){.peer = peer,
                                       .attempt = q->attempt,
                                       .n = n,
                                       .slot = slot,
                                       .live = true,
                                       .sent_ms = clk_mono_ms()};
    return 0;
}

/* The pairs no replica outside the suspect peers takes go to a member as the replica rule
 * says (a suspect one): they wait there for the coordinator's verdict (srv_stalled). */
static int srv_route_members(const srv_env *env, const srv_req *q, const uint32_t *slots, int n,
                             int *dest)
{
    const exec_session *ses = env->session;
    int *all = malloc((size_t)n * sizeof *all + 1);
    if (all == NULL)
        return -1;
    dp_route(ses->place, q->layer, ses->rank, q->topk_ids, slots, n, ses->member, all, NULL);
    for (int i = 0; i < n; i++)
        if (dest[i] == -2)
            dest[i] = all[i];
    free(all);
    return 0;
}

/* Plan the given slots (ascending) under the current placement into new parts. */
static int srv_plan(srv_server *s, const srv_env *env, srv_req *q, const uint32_t *slots, int n,
                    bool count_load, ep_err *err)
{
    const exec_session *ses = env->session;
    int *dest = malloc((size_t)n * sizeof *dest + 1);
    if (dest == NULL)
        return ep_err_set(err, "out of memory");
    srv_load *ld = count_load && s->load ? &s->load[q->layer] : NULL;
    int64_t now = clk_mono_ms();
    for (int r = 0; r < ses->world_size; r++) { /* around suspect peers where a replica allows */
        if (s->suspect_ms[r] > 0 && now - s->suspect_ms[r] >= SRV_SUSPECT_LAPSE * ses->progress_ms)
            s->suspect_ms[r] = 0; /* lapsed (no part went there meanwhile): tried again */
        s->route_ok[r] = ses->member[r] && !s->suspect_ms[r];
    }
    dp_route(ses->place, q->layer, ses->rank, q->topk_ids, slots, n, s->route_ok, dest,
             ld ? ld->expert : NULL);
    bool stranded = false; /* a pair whose replicas are all suspect */
    for (int i = 0; i < n && !stranded; i++)
        stranded = dest[i] == -2;
    if (stranded && srv_route_members(env, q, slots, n, dest) != 0) {
        free(dest);
        return ep_err_set(err, "out of memory");
    }
    for (int i = 0; i < n; i++)
        if (dest[i] == -2) {
            free(dest);
            return ep_err_set(err, "expert %d of layer %d has no replica on a member of epoch %llu",
                              q->topk_ids[slots ? slots[i] : (uint32_t)i], q->layer,
                              (unsigned long long)ses->epoch);
        }
    dp_plan p;
    if (dp_group(&p, ses->world_size, q->k, slots, dest, n, err) != 0) {
        free(dest);
        return -1;
    }
    free(dest);
    int rc = 0;
    for (int r = 0; r < p.P && rc == 0; r++) {
        if (p.count[r] == 0)
            continue;
        if (ld)
            ld->rank[r] += (uint32_t)p.count[r];
        rc = srv_add_part(q, r, p.slot[r], p.count[r]);
        if (rc == 0)
            p.slot[r] = NULL; /* the part's now */
    }
    dp_plan_free(&p);
    return rc == 0 ? 0 : ep_err_set(err, "out of memory");
}

/* Send part i if the peer has credit left (own parts go to the queue). */
static int srv_send_part(srv_server *s, const srv_env *env, srv_req *q, int i, ep_err *err)
{
    srv_part *p = &q->part[i];
    const exec_session *ses = env->session;
    if (p->peer == ses->rank) {
        p->sent = true;
        return srv_push_job(s, (srv_job){.src = ses->rank,
                                         .layer = q->layer,
                                         .request = q->id,
                                         .attempt = p->attempt,
                                         .own = q,
                                         .part = i}) == 0
                   ? 0
                   : ep_err_set(err, "out of memory");
    }
    if (env->tp == NULL || s->out_credit[p->peer] >= TPZ_SERVE_CREDITS)
        return 0; /* waits for credit */
    int rows = dp_rows(p->slot, p->n, q->k);
    tp_msg d = {.kind = TP_DISPATCH,
                .is_request = true,
                .request = q->id,
                .attempt = p->attempt,
                .layer = (uint32_t)q->layer,
                .n_rows = rows,
                .n_pairs = p->n,
                .format = ses->dispatch,
                .scales_e8m0 = ses->dispatch == TP_FMT_FP8 && ses->config.act_ue8m0};
    if (tpz_msg_alloc(&d, q->H, err) != 0)
        return -1;
    if (dp_fill(p->slot, p->n, q->k, q->H, q->topk_ids, q->topk_w, q->q, q->qs, q->xn, &d, err)) {
        tpz_msg_release(&d);
        return -1;
    }
    size_t bytes = tp_msg_bytes(&d, q->H);
    if (tpz_send(env->tp, p->peer, &d, err) != 0)
        return ep_err_prefix(err, "DISPATCH to %s", ses->peer_name[p->peer]);
    wmx_sent(env->mx, false, bytes);
    if (s->load) {
        s->load[q->layer].dispatch_bytes += bytes;
        s->load[q->layer].messages++;
    }
    p->sent = p->credit = true;
    p->sent_ms = clk_mono_ms();
    s->out_credit[p->peer]++;
    return 0;
}

/* Route and quantize a waiting request and send its parts. */
static int srv_start(srv_server *s, const srv_env *env, srv_req *q, ep_err *err)
{
    q->ms = mb_step_begin(env->be, env->layers[q->layer], q->T, q->x, q->ids, q->topk_ids,
                          q->topk_w, q->q, q->qs, q->xn, err);
    if (q->ms == NULL)
        return -1;
    q->t_routed = clk_mono_s();
    q->epoch = env->session->epoch;
    q->attempt++;
    memset(q->eo, 0, (size_t)q->T * (size_t)q->k * (size_t)q->H * 2);
    q->t_own = q->t_shared = q->t_back = 0;
    if (srv_plan(s, env, q, NULL, q->T * q->k, !q->started_once, err) != 0)
        return -1;
    if (!q->started_once && s->load) {
        s->load[q->layer].requests++;
        s->load[q->layer].tokens += (uint32_t)q->T;
    }
    q->started_once = true;
    q->phase = SRV_RUNNING;
    for (int i = 0; i < q->n_parts; i++)
        if (srv_send_part(s, env, q, i, err) != 0)
            return -1;
    /* The shared expert: a GPU backend starts it now (it overlaps the exchange); the CPU
     * computes it synchronously, so it runs when this worker has nothing else to do or at the
     * combine (srv_shared), after the turn has served the peers' DISPATCHes that wait for this
     * worker, never before them, and batched over the requests of the layer. */
    mb_device_info dev;
    q->shared = false;
    if (mb_device(env->be, &dev) == 0 && dev.kind != MB_DEV_CPU) {
        if (mb_step_shared(q->ms, err) != 0)
            return ep_err_prefix(err, "shared expert");
        q->shared = true;
        q->t_shared = clk_mono_s();
    }
    q->t_sent = clk_mono_s();
    return 0;
}

/* Replace the refused parts of q by parts under the current placement. */
static int srv_replay(srv_server *s, const srv_env *env, srv_req *q, ep_err *err)
{
    int n = 0;
    for (int i = 0; i < q->n_parts; i++)
        if (q->part[i].live && q->part[i].refused)
            n += q->part[i].n;
    uint32_t *slots = malloc((size_t)n * sizeof *slots + 1);
    if (slots == NULL)
        return ep_err_set(err, "out of memory");
    n = 0;
    for (int i = 0; i < q->n_parts; i++) {
        srv_part *p = &q->part[i];
        if (!p->live || !p->refused)
            continue;
        memcpy(slots + n, p->slot, (size_t)p->n * sizeof *slots);
        n += p->n;
        p->live = false;
    }
    /* ascending, as the plan wants (parts of different ranks interleave) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && slots[j - 1] > slots[j]; j--) {
            uint32_t t = slots[j];
            slots[j] = slots[j - 1];
            slots[j - 1] = t;
        }
    int first = q->n_parts;
    q->attempt++;
    q->replayed = true;
    s->stats.replays++;
    wmx_replay(s->mx, false);
    int rc = srv_plan(s, env, q, slots, n, false, err);
    free(slots);
    for (int i = first; rc == 0 && i < q->n_parts; i++)
        rc = srv_send_part(s, env, q, i, err);
    return rc;
}

/* ---- SUBMIT -------------------------------------------------------------------------------- */

int srv_check_submit(const srv_env *env, const Epmoe__Submit *r, const wire_msg *m,
                     Epmoe__ErrorCode *code, ep_err *err)
{
    *code = EPMOE__ERROR_CODE__ERR_BAD_REQUEST;
    if (!r->has_client || !r->has_seq || !r->has_layer || !r->has_n_tokens)
        return ep_err_set(err, "SUBMIT: client, seq, layer or n_tokens missing");
    if (env->session == NULL) {
        *code = EPMOE__ERROR_CODE__ERR_NOT_READY;
        return ep_err_set(err, "this worker has no session (not welcomed by a coordinator)");
    }
    const mc_config *c = &env->session->config;
    int L = mc_num_layers(c);
    if (r->has_config_hash && r->config_hash != env->session->config_hash) {
        *code = EPMOE__ERROR_CODE__ERR_CONFIG_HASH;
        return ep_err_set(err,
                          "config hash %016llx is not the cluster's (%016llx): the model config "
                          "changed (a reload); read the model's info again",
                          (unsigned long long)r->config_hash,
                          (unsigned long long)env->session->config_hash);
    }
    if (r->layer >= (uint32_t)L)
        return ep_err_set(err,
                          "layer %u does not exist: the model has %d MoE layers (0..%d, MTP "
                          "from %d)",
                          r->layer, L, L - 1, c->num_hidden_layers);
    if (r->n_tokens == 0 || r->n_tokens > EP_MAX_TOKENS)
        return ep_err_set(err, "%u tokens: expected 1..%d", r->n_tokens, EP_MAX_TOKENS);
    bool has_ids = r->has_has_ids && r->has_ids;
    size_t T = r->n_tokens, H = (size_t)c->hidden_size;
    if (m->n_payloads != (has_ids ? 2 : 1) || m->payload_len[0] != T * H * 2 ||
        (has_ids && m->payload_len[1] != T * 8))
        return ep_err_set(
            err, "payloads of %d frames (%zu, %zu bytes), expected hidden bf16 [%zu, %zu]%s",
            m->n_payloads, m->n_payloads > 0 ? m->payload_len[0] : 0,
            m->n_payloads > 1 ? m->payload_len[1] : 0, T, H, has_ids ? " and token ids int64" : "");
    if (mc_layer_is_hash(c, (int)r->layer) && !has_ids)
        return ep_err_set(err, "layer %u is hash-routed: token ids are required", r->layer);
    if (has_ids)
        for (size_t t = 0; t < T; t++) {
            int64_t id;
            memcpy(&id, m->payload[1] + 8 * t, 8);
            if (id < 0 || id >= c->vocab_size)
                return ep_err_set(err, "token %zu: id %lld outside [0, %d)", t, (long long)id,
                                  c->vocab_size);
        }
    return ck_check_input(m->payload[0], (int)T, (int)H, 0, err);
}

static int srv_count_client(const srv_server *s, uint64_t client)
{
    int n = 0;
    for (int i = 0; i < SRV_MAX_REQUESTS; i++)
        n += s->req[i].phase != SRV_FREE && s->req[i].client == client;
    return n;
}

static bool srv_duplicate(const srv_server *s, uint64_t client, uint64_t seq)
{
    for (int i = 0; i < SRV_MAX_REQUESTS; i++)
        if (s->req[i].phase != SRV_FREE && s->req[i].client == client && s->req[i].seq == seq)
            return true;
    return false;
}

static srv_req *srv_slot(srv_server *s)
{
    for (int i = 0; i < SRV_MAX_REQUESTS; i++) {
        srv_req *q = &s->req[(s->next_id + (uint64_t)i) & (SRV_MAX_REQUESTS - 1)];
        if (q->phase == SRV_FREE) {
            q->id = (s->next_id++ << 16) | (uint64_t)(q - s->req);
            return q;
        }
    }
    return NULL;
}

static int srv_req_alloc(srv_req *q, const wire_msg *m, bool has_ids)
{
    size_t T = (size_t)q->T, H = (size_t)q->H, k = (size_t)q->k;
    q->x = srv_alloc(T * H * 2);
    q->xn = srv_alloc(T * H * 2);
    q->topk_ids = malloc(T * k * 4);
    q->topk_w = malloc(T * k * 4);
    q->q = srv_alloc(T * H);
    q->qs = srv_alloc(T * (H / EP_FP8_BLOCK) * 4);
    q->eo = srv_alloc(T * k * H * 2);
    q->ids = has_ids ? malloc(T * 8) : NULL;
    if (!q->x || !q->xn || !q->topk_ids || !q->topk_w || !q->q || !q->qs || !q->eo ||
        (has_ids && !q->ids))
        return -1;
    memcpy(q->x, m->payload[0], T * H * 2);
    if (has_ids)
        memcpy(q->ids, m->payload[1], T * 8);
    return 0;
}

/* The connection m came on is closed once its refusal went out (serve_state.h,
 * SRV_REVOKE_CLOSE_MS): a revoked key keeps no connection open. */
static void srv_close_later(srv_server *s, const wire_msg *m)
{
    int fd = m->n_frames > 0 ? zmq_msg_get((zmq_msg_t *)&m->frames[0], ZMQ_SRCFD) : -1;
    if (fd < 0 || s->n_revoked >= SRV_MAX_REVOKED)
        return;
    for (int i = 0; i < s->n_revoked; i++)
        if (s->revoked[i].fd == fd)
            return;
    srv_revoked *v = &s->revoked[s->n_revoked];
    v->len = sizeof v->peer;
    if (getpeername(fd, (struct sockaddr *)&v->peer, &v->len) != 0)
        return;
    v->fd = fd;
    v->at_ms = clk_mono_ms() + SRV_REVOKE_CLOSE_MS;
    s->n_revoked++;
}

static void srv_close_revoked(srv_server *s)
{
    int64_t now = clk_mono_ms();
    for (int i = 0; i < s->n_revoked;) {
        srv_revoked *v = &s->revoked[i];
        if (now < v->at_ms) {
            i++;
            continue;
        }
        struct sockaddr_storage peer;
        socklen_t len = sizeof peer;
        if (getpeername(v->fd, (struct sockaddr *)&peer, &len) == 0 && len == v->len &&
            memcmp(&peer, &v->peer, len) == 0 && shutdown(v->fd, SHUT_RDWR) == 0)
            log_limited(&s->log, SRV_LOG_PER_SEC, LOG_INFO,
                        "client endpoint: closed a connection whose key a reload revoked");
        s->revoked[i] = s->revoked[--s->n_revoked];
    }
}

static void srv_submit(srv_server *s, const srv_env *env, wire_msg *m)
{
    ep_err err = {0};
    Epmoe__Submit *r = (Epmoe__Submit *)wire_unpack(&epmoe__submit__descriptor, m, &err);
    if (r == NULL) {
        srv_refuse(s, -1, m->ident, m->ident_len, 0, 0, EPMOE__ERROR_CODE__ERR_MALFORMED,
                   "SUBMIT: %s", err.msg);
        return;
    }
    uint64_t client = r->client, seq = r->seq;
    int layer = r->has_layer && r->layer < (uint32_t)s->L ? (int)r->layer : -1;
    Epmoe__ErrorCode code;
    srv_req *q = NULL;
    s->stats.submitted++;
    const char *uid = s->secure ? wire_user_id(m) : NULL;
    if (s->secure && !auth_admits(AUTH_DOMAIN_CLIENTS, uid)) {
        /* admitted at its handshake, revoked since by a reload (CLIENT_KEYS) */
        srv_refuse(s, layer, m->ident, m->ident_len, client, seq, EPMOE__ERROR_CODE__ERR_REFUSED,
                   "the key %s of this connection is no longer admitted (revoked by a reload)",
                   uid ? uid : "?");
        srv_close_later(s, m);
    } else if (srv_check_submit(env, r, m, &code, &err) != 0) {
        srv_refuse(s, layer, m->ident, m->ident_len, client, seq, code, "%s", err.msg);
    } else if (srv_duplicate(s, client, seq)) {
        wmx_resend(s->mx);
        log_debug(LOG_SUB_STEP, "request %llu of client %016llx resent while in flight: kept once",
                  (unsigned long long)seq, (unsigned long long)client);
    } else if (srv_count_client(s, client) >= SRV_MAX_CLIENT_REQUESTS) {
        wmx_busy(s->mx, true);
        srv_refuse(s, layer, m->ident, m->ident_len, client, seq, EPMOE__ERROR_CODE__ERR_BUSY,
                   "this client has %d requests in flight at this entry worker, its limit",
                   SRV_MAX_CLIENT_REQUESTS);
    } else if ((q = srv_slot(s)) == NULL) {
        wmx_busy(s->mx, false);
        srv_refuse(s, layer, m->ident, m->ident_len, client, seq, EPMOE__ERROR_CODE__ERR_BUSY,
                   "this entry worker holds %d requests in flight, its limit", SRV_MAX_REQUESTS);
    } else {
        const mc_config *c = &env->session->config;
        memcpy(q->ident, m->ident, m->ident_len);
        q->ident_len = m->ident_len;
        q->client = client;
        q->seq = seq;
        q->layer = (int)r->layer;
        q->T = (int)r->n_tokens;
        q->k = c->num_experts_per_tok;
        q->H = c->hidden_size;
        q->t_arrive = clk_mono_s();
        uint32_t ms = r->has_timeout_ms && r->timeout_ms ? r->timeout_ms
                                                         : (uint32_t)env->session->step_timeout_ms;
        q->deadline = clk_deadline_ms(ms);
        q->backoff = SRV_RETRY_MS;
        q->phase = SRV_WAITING;
        if (srv_req_alloc(q, m, r->has_has_ids && r->has_ids) != 0)
            srv_fail(s, q, EPMOE__ERROR_CODE__ERR_BUSY, "out of memory for %d tokens", q->T);
    }
    wire_free_unpacked(&r->base);
}

/* A message that is no epmoe message: answered with Error (ERR_MALFORMED, what is wrong), as
 * every ROUTER answers (docs/protocol.md), and logged within the rate limit. */
static void srv_framing_error(srv_server *s, const wire_msg *m, const ep_err *err)
{
    s->stats.malformed++;
    log_limited(&s->log, SRV_LOG_PER_SEC, LOG_WARN, "client endpoint: dropped a message: %s",
                err->msg);
    if (m->ident_len > 0)
        wire_reply_error(s->sock, m->ident, m->ident_len, err, 0);
}

static void srv_lend(srv_server *s, const srv_env *env)
{
    s->mx = env->mx;
    s->serving_epoch = env->ready && env->session ? env->session->epoch : 0;
}

void srv_on_client(srv_server *s, const srv_env *env)
{
    srv_lend(s, env);
    if (env->session != NULL)
        (void)srv_shape(s, env); /* the layer kinds of the requests' metrics */
    for (int n = 0; n < 1024; n++) {
        wire_msg m;
        ep_err err;
        wire_rc rc = wire_recv(s->sock, true, SRV_MAX_BODY, (size_t)s->max_frame * 2, ZMQ_DONTWAIT,
                               &m, &err);
        if (rc == WIRE_AGAIN)
            return;
        if (rc == WIRE_ERR) {
            srv_framing_error(s, &m, &err);
            continue;
        }
        if (m.type == EPMOE__MSG_TYPE__MSG_SUBMIT)
            srv_submit(s, env, &m);
        else
            wire_send_error(s->sock, m.ident, m.ident_len, EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE,
                            m.type, "a client endpoint takes SUBMIT only, not %s",
                            wire_type_name(m.type));
        wire_msg_close(&m);
    }
}

/* ---- the data plane ------------------------------------------------------------------------ */

bool srv_awaits(void *ctx, uint64_t request, uint32_t attempt, int src_rank)
{
    srv_req *q = srv_find(ctx, request);
    for (int i = 0; q && i < q->n_parts; i++)
        if (q->part[i].peer == src_rank && q->part[i].attempt == attempt && q->part[i].credit)
            return true;
    return false;
}

/* A COMBINE (or a refusal) from peer: it makes progress; a suspicion of it ends. Only answers
 * count: a peer cut off from this origin's DISPATCHes may still send its own. */
static void srv_heard(srv_server *s, const srv_env *env, int peer)
{
    s->heard_ms[peer] = clk_mono_ms();
    if (s->suspect_ms[peer] == 0)
        return;
    log_info("serving: rank %d (%s) answers again; no longer suspect", peer,
             env->session->peer_name[peer]);
    s->suspect_ms[peer] = 0;
    s->report_due[peer] = 0;
}

static void srv_on_combine(srv_server *s, const srv_env *env, tp_msg *c)
{
    srv_req *q = srv_find(s, c->request);
    srv_part *p = NULL;
    for (int i = 0; q && i < q->n_parts; i++)
        if (q->part[i].peer == c->src_rank && q->part[i].attempt == c->attempt && q->part[i].credit)
            p = &q->part[i];
    if (p == NULL || (!c->refused && c->n_pairs != p->n)) {
        log_debug(LOG_SUB_DATA, "COMBINE of request %016llx/%u from rank %d: %s",
                  (unsigned long long)c->request, c->attempt, c->src_rank,
                  p ? "pair count differs" : "no such part in flight (late or replaced)");
        return;
    }
    if (p->credit)
        s->out_credit[p->peer]--;
    p->credit = false;
    srv_heard(s, env, p->peer);
    if (!p->live)
        return; /* replaced by a replay: its slots are another part's */
    if (c->refused && !srv_failover) {
        srv_fail(s, q, EPMOE__ERROR_CODE__ERR_WORKER_LOST,
                 "request %llu: rank %d refused its pairs, and replay is off "
                 "(EPMOE_TEST_NO_FAILOVER)",
                 (unsigned long long)q->seq, c->src_rank);
        return;
    }
    if (c->refused) {
        p->refused = true;
        if (q->retry_at == 0)
            q->retry_at = clk_mono_ms() + q->backoff;
        log_debug(LOG_SUB_DATA, "request %016llx: rank %d (epoch %llu) refused %d pairs",
                  (unsigned long long)q->id, c->src_rank, (unsigned long long)c->server_epoch,
                  p->n);
        return;
    }
    size_t H = (size_t)q->H;
    for (int j = 0; j < p->n; j++)
        memcpy(q->eo + (size_t)p->slot[j] * H, c->out + (size_t)j * H, H * 2);
    p->done = true;
    q->t_back = clk_mono_s();
}

void srv_on_data(srv_server *s, const srv_env *env)
{
    if (env->tp == NULL || env->session == NULL || srv_shape(s, env) != 0)
        return;
    tp_msg m;
    while (tpz_take_request(env->tp, &m)) {
        if (m.kind == TP_DISPATCH) {
            srv_on_dispatch(s, &m);
            continue;
        }
        srv_on_combine(s, env, &m);
        tpz_msg_release(&m);
    }
}

/* ---- completing ---------------------------------------------------------------------------- */

static bool srv_complete(const srv_req *q)
{
    for (int i = 0; i < q->n_parts; i++)
        if (q->part[i].live && !q->part[i].done)
            return false;
    return true;
}

static void srv_hist_add(srv_hist *h, double v)
{
    h->n[mx_seconds_bucket(v)]++;
    h->sum += v;
}

/* An answered request into its layer's next LOAD_REPORT. */
static void srv_count_answer(srv_load *ld, double total_s, const Epmoe__Result *r)
{
    ld->answered++;
    srv_hist_add(&ld->total, total_s);
    srv_hist_add(&ld->dispatch, r->dispatch_seconds);
    srv_hist_add(&ld->experts, r->experts_seconds);
    srv_hist_add(&ld->combine, r->combine_seconds);
}

static void srv_answer(srv_server *s, const srv_env *env, srv_req *q)
{
    size_t T = (size_t)q->T, H = (size_t)q->H, k = (size_t)q->k;
    double t0 = clk_mono_s();
    uint16_t *out = malloc(T * H * 2);
    ep_err err;
    if (out == NULL || mb_step_finish(q->ms, q->eo, out, &err) != 0) {
        free(out);
        srv_fail(s, q, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "combine: %s",
                 out ? err.msg : "out of memory");
        return;
    }
    double t1 = clk_mono_s();
    Epmoe__Result r = EPMOE__RESULT__INIT;
    r.has_client = r.has_seq = r.has_epoch = r.has_entry_rank = r.has_replayed = 1;
    r.has_n_tokens = r.has_queued_seconds = r.has_dispatch_seconds = 1;
    r.has_experts_seconds = r.has_combine_seconds = 1;
    r.client = q->client;
    r.seq = q->seq;
    r.epoch = q->epoch;
    r.entry_rank = (uint32_t)env->session->rank;
    r.replayed = q->replayed;
    r.n_tokens = (uint32_t)q->T;
    r.queued_seconds = q->t_routed > q->t_arrive ? q->t_routed - q->t_arrive : 0;
    r.dispatch_seconds = q->t_sent - q->t_routed;
    r.experts_seconds = t0 - q->t_sent;
    r.combine_seconds = t1 - t0;
    wire_payload pl[3] = {
        {.data = out, .len = T * H * 2, .free_fn = wire_free_malloc},
        {.data = q->topk_ids, .len = T * k * 4, .free_fn = wire_free_malloc},
        {.data = q->topk_w, .len = T * k * 4, .free_fn = wire_free_malloc},
    };
    q->topk_ids = NULL; /* the message's now */
    q->topk_w = NULL;
    srv_send_result(s, q->ident, q->ident_len, &r, pl, 3);
    /* where a request's time went (docs/performance.md "Serving path" reads these) */
    log_debug(LOG_SUB_STEP,
              "request %016llx layer %d, %d tokens: routed %+.3f ms, sent %+.3f, own pairs done "
              "%+.3f, shared expert done %+.3f, last COMBINE %+.3f, answered %+.3f",
              (unsigned long long)q->id, q->layer, q->T, (q->t_routed - q->t_arrive) * 1e3,
              (q->t_sent - q->t_arrive) * 1e3, q->t_own ? (q->t_own - q->t_arrive) * 1e3 : 0,
              q->t_shared ? (q->t_shared - q->t_arrive) * 1e3 : 0,
              q->t_back ? (q->t_back - q->t_arrive) * 1e3 : 0, (clk_mono_s() - q->t_arrive) * 1e3);
    wmx_step(env->mx, q->layer, t1 - q->t_arrive, r.dispatch_seconds, r.experts_seconds,
             r.combine_seconds);
    wmx_step_result(env->mx, true);
    wmx_request(env->mx, srv_kind(s, q->layer), 0);
    wmx_request_times(env->mx, q->layer, t1 - q->t_arrive, r.queued_seconds);
    if (s->load)
        srv_count_answer(&s->load[q->layer], t1 - q->t_arrive, &r);
    s->stats.completed++;
    srv_req_free(s, q);
}

/* The ranks a request still waits for, for its timeout message. */
static void srv_missing(const srv_req *q, const srv_env *env, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < q->n_parts && n < cap; i++) {
        const srv_part *p = &q->part[i];
        if (!p->live || p->done)
            continue;
        const char *name = env->session && p->peer < env->session->world_size
                               ? env->session->peer_name[p->peer]
                               : "?";
        n += (size_t)snprintf(buf + n, cap - n, "%srank %d (%s)%s", n ? ", " : "", p->peer, name,
                              p->sent ? "" : " (not sent: no credit)");
    }
    if (n == 0)
        snprintf(buf, cap, "a placement this worker could serve (epoch %llu, %s)",
                 env->session ? (unsigned long long)env->session->epoch : 0ull,
                 env->ready ? "ready" : "not ready");
}

/* Peer has answered none of this origin's DISPATCHes for the progress timeout: suspect from
 * now, to be reported to the coordinator (srv_peer_reports). */
static void srv_suspect(srv_server *s, const srv_env *env, int peer, int64_t now)
{
    s->suspect_ms[peer] = now;
    s->report_due[peer] = 1;
    s->stats.suspicions++;
    log_warn("serving: rank %d (%s) answered none of this worker's DISPATCHes for %lld ms "
             "(the data plane to it is cut?); routing around it where a replica allows, "
             "reporting it to the coordinator",
             peer, env->session->peer_name[peer],
             (long long)(now - (s->heard_ms[peer] > 0 ? s->heard_ms[peer]
                                                      : now - env->session->progress_ms)));
}

/* The progress timeout of q's parts: a peer silent for it becomes suspect; parts sent to a
 * suspect peer before the suspicion are replayed (srv_replay routes around it where a replica
 * allows); a part that still waits for a suspect peer a progress timeout after the suspicion
 * (no replica elsewhere, and no new epoch from the coordinator's verdict) fails the request,
 * naming the peer. Returns true when q failed. */
static bool srv_stalled(srv_server *s, const srv_env *env, srv_req *q, int64_t now)
{
    const exec_session *ses = env->session;
    int64_t pt = ses->progress_ms;
    if (pt <= 0 || !srv_failover)
        return false;
    for (int i = 0; i < q->n_parts; i++) {
        srv_part *p = &q->part[i];
        int x = p->peer;
        if (!p->live || p->done || p->refused || x == ses->rank)
            continue;
        if (s->suspect_ms[x] > 0 && now - s->suspect_ms[x] >= SRV_SUSPECT_LAPSE * pt) {
            s->suspect_ms[x] = 0; /* lapsed: the peer is tried again */
            s->report_due[x] = 0;
        }
        if (s->suspect_ms[x] == 0 && now - p->sent_ms >= pt && now - s->heard_ms[x] >= pt)
            srv_suspect(s, env, x, now);
        if (s->suspect_ms[x] == 0)
            continue;
        if (p->sent_ms < s->suspect_ms[x]) { /* planned before the suspicion: plan again */
            p->refused = true;
            q->retry_at = now;
        } else if (now - s->suspect_ms[x] >= pt) {
            srv_fail(s, q, EPMOE__ERROR_CODE__ERR_WORKER_LOST,
                     "request %llu (layer %d): rank %d (%s) has answered none of the entry's "
                     "DISPATCHes for %lld ms (the data plane to it is cut?) and holds experts "
                     "with no replica elsewhere; reported to the coordinator, which has not "
                     "moved them",
                     (unsigned long long)q->seq, q->layer, x, ses->peer_name[x],
                     (long long)(now - s->suspect_ms[x] + pt));
            return true;
        }
    }
    return false;
}

static void srv_step_req(srv_server *s, const srv_env *env, srv_req *q, int64_t now)
{
    ep_err err = {0};
    if (now >= q->deadline) {
        char who[EP_ERR_MSG_MAX / 2];
        srv_missing(q, env, who, sizeof who);
        srv_fail(s, q, EPMOE__ERROR_CODE__ERR_TIMEOUT,
                 "request %llu (layer %d, %d tokens) timed out after %.0f ms waiting for %s",
                 (unsigned long long)q->seq, q->layer, q->T,
                 (double)q->deadline - q->t_arrive * 1e3, who);
        return;
    }
    if (!env->ready)
        return;
    if (q->phase == SRV_WAITING) {
        if (srv_start(s, env, q, &err) != 0)
            srv_fail(s, q, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "layer %d: %s", q->layer, err.msg);
        return;
    }
    for (int i = 0; i < q->n_parts; i++) /* parts waiting for credit */
        if (q->part[i].live && !q->part[i].sent && srv_send_part(s, env, q, i, &err) != 0) {
            srv_fail(s, q, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "%s", err.msg);
            return;
        }
    if (srv_stalled(s, env, q, now))
        return; /* failed */
    if (q->retry_at > 0 && now >= q->retry_at) {
        q->retry_at = 0;
        q->backoff = q->backoff * 2 < SRV_RETRY_MAX_MS ? q->backoff * 2 : SRV_RETRY_MAX_MS;
        if (srv_replay(s, env, q, &err) != 0) {
            srv_fail(s, q, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "replay: %s", err.msg);
            return;
        }
    }
}

/* The shared expert of the running requests that want (complete ones only, or all), one
 * mb_steps_shared call per layer: concurrent requests read its weights once. */
static void srv_shared(srv_server *s, bool complete_only)
{
    srv_req *cand[SRV_MAX_REQUESTS], *reqs[SRV_MAX_REQUESTS];
    mb_step *steps[SRV_MAX_REQUESTS];
    int nc = 0;
    for (int i = 0; i < SRV_MAX_REQUESTS; i++) { /* one pass over the slots */
        srv_req *q = &s->req[i];
        if (q->phase == SRV_RUNNING && !q->shared && (!complete_only || srv_complete(q)))
            cand[nc++] = q;
    }
    for (int i = 0; i < nc; i++) {
        if (cand[i] == NULL)
            continue;
        int layer = cand[i]->layer, n = 0;
        for (int j = i; j < nc; j++)
            if (cand[j] != NULL && cand[j]->layer == layer) {
                reqs[n] = cand[j];
                steps[n++] = cand[j]->ms;
                cand[j] = NULL;
            }
        ep_err err = {0};
        if (mb_steps_shared(steps, n, &err) != 0) /* mb_step_finish runs what is left */
            log_warn("serving: shared expert of %d requests of layer %d: %s", n, layer, err.msg);
        s->stats.shared_batches++;
        s->stats.shared_requests += (uint64_t)n;
        double now = clk_mono_s();
        for (int j = 0; j < n; j++) {
            reqs[j]->shared = true;
            reqs[j]->t_shared = now;
        }
    }
}

/* Nothing waits for this worker: no job queued, no SUBMIT or data-plane message pending. */
static bool srv_idle(const srv_server *s, const srv_env *env)
{
    int ev = 0;
    size_t len = sizeof ev;
    if (s->n_jobs > 0)
        return false;
    if (zmq_getsockopt(s->sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN))
        return false;
    len = sizeof ev;
    ev = 0;
    return env->tp == NULL ||
           !(zmq_getsockopt(tpz_socket(env->tp), ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN));
}

/* Answer every complete request, their shared experts batched first. */
static void srv_finish(srv_server *s, const srv_env *env)
{
    srv_shared(s, true);
    for (int i = 0; i < SRV_MAX_REQUESTS; i++) {
        srv_req *q = &s->req[i];
        if (q->phase == SRV_RUNNING && srv_complete(q))
            srv_answer(s, env, q);
    }
}

/* The requests held and the credits in use, into the metrics' gauges. */
static void srv_gauges(const srv_server *s)
{
    int n[3] = {0}, credits = 0;
    for (int i = 0; i < SRV_MAX_REQUESTS; i++)
        n[s->req[i].phase]++;
    for (int p = 0; s->out_credit && p < s->P; p++)
        credits += s->out_credit[p];
    wmx_in_flight(s->mx, n[SRV_WAITING], n[SRV_RUNNING], credits);
}

void srv_run(srv_server *s, const srv_env *env)
{
    srv_lend(s, env);
    srv_close_revoked(s);
    if (env->session == NULL || srv_shape(s, env) != 0) {
        int64_t now = clk_mono_ms();
        for (int i = 0; i < SRV_MAX_REQUESTS; i++)
            if (s->req[i].phase != SRV_FREE && now >= s->req[i].deadline)
                srv_fail(s, &s->req[i], EPMOE__ERROR_CODE__ERR_TIMEOUT,
                         "request %llu timed out: this worker has no session",
                         (unsigned long long)s->req[i].seq);
        return;
    }
    /* start and send before serving, so this worker's own parts join the batch */
    int64_t now = clk_mono_ms();
    for (int i = 0; i < SRV_MAX_REQUESTS; i++)
        if (s->req[i].phase != SRV_FREE)
            srv_step_req(s, env, &s->req[i], now);
    srv_finish(s, env); /* what the COMBINEs just completed: not behind this turn's batch */
    srv_serve(s, env);
    srv_finish(s, env); /* what this turn's own pairs completed */
    /* waiting for peers with nothing to serve: the shared expert of what is in flight now */
    if (srv_idle(s, env))
        srv_shared(s, false);
    srv_gauges(s);
}

int64_t srv_idle_timeout_ms(const srv_server *s)
{
    int64_t now = clk_mono_ms(), t = 1000;
    for (int i = 0; i < SRV_MAX_REQUESTS; i++) {
        const srv_req *q = &s->req[i];
        if (q->phase == SRV_FREE)
            continue;
        int64_t d = q->deadline - now;
        if (q->retry_at > 0 && q->retry_at - now < d)
            d = q->retry_at - now;
        for (int j = 0; j < q->n_parts; j++) /* progress timeouts: checked every 50 ms */
            if (q->part[j].live && !q->part[j].done && d > 50)
                d = 50;
        if (d < t)
            t = d;
    }
    return t > 0 ? t : 0;
}

/* ---- epochs -------------------------------------------------------------------------------- */

void srv_epoch_begin(srv_server *s)
{
    for (int i = 0; i < SRV_MAX_REQUESTS; i++) {
        srv_req *q = &s->req[i];
        if (q->phase != SRV_RUNNING)
            continue;
        if (!srv_failover) {
            srv_fail(s, q, EPMOE__ERROR_CODE__ERR_WORKER_LOST,
                     "request %llu: the placement changed, and replay is off "
                     "(EPMOE_TEST_NO_FAILOVER)",
                     (unsigned long long)q->seq);
            continue;
        }
        srv_req_unroute(s, q);
        q->phase = SRV_WAITING;
        q->replayed = true;
        wmx_replay(s->mx, true);
        q->retry_at = 0;
    }
    /* own jobs refer to parts that are gone; peers' DISPATCHes stay and are served (or
     * refused) by the layers of the new epoch */
    int n = 0;
    for (int j = 0; j < s->n_jobs; j++)
        if (s->job[j].own == NULL && s->job[j].msg.buf)
            s->job[n++] = s->job[j];
    s->n_jobs = n;
    if (s->out_credit)
        memset(s->out_credit, 0, (size_t)s->P * sizeof *s->out_credit);
    /* the new placement is the coordinator's answer to what was reported: try every peer */
    if (s->suspect_ms)
        memset(s->suspect_ms, 0, (size_t)s->P * sizeof *s->suspect_ms);
    if (s->report_due)
        memset(s->report_due, 0, (size_t)s->P);
}

void srv_epoch_end(srv_server *s, const srv_env *env)
{
    if (env->session != NULL && srv_shape(s, env) == 0)
        memset(s->out_credit, 0, (size_t)s->P * sizeof *s->out_credit);
    /* the waiting requests start at the next srv_run */
}

/* ---- load reports -------------------------------------------------------------------------- */

/* What the layer's report carries besides its load: the answered requests' timings and the
 * failed ones by code, the data-plane messages sent. n_codes: the failure codes counted. */
typedef struct srv_served {
    Epmoe__LatencyHistogram h[4];
    Epmoe__LatencyHistogram *hp[4];
    uint32_t code[SRV_N_CODES], count[SRV_N_CODES];
} srv_served;

static void srv_report_served(srv_load *ld, srv_served *sv, Epmoe__LoadReport *r)
{
    const srv_hist *src[4] = {&ld->total, &ld->dispatch, &ld->experts, &ld->combine};
    for (int i = 0; i < 4 && ld->answered; i++) {
        epmoe__latency_histogram__init(&sv->h[i]);
        sv->h[i].bucket = (uint32_t *)src[i]->n;
        sv->h[i].n_bucket = (size_t)mx_n_seconds_buckets + 1;
        sv->h[i].has_sum = 1;
        sv->h[i].sum = src[i]->sum;
        sv->hp[i] = &sv->h[i];
    }
    r->duration = sv->hp[0];
    r->dispatch = sv->hp[1];
    r->experts = sv->hp[2];
    r->combine = sv->hp[3];
    r->has_answered = r->has_dispatch_bytes = r->has_combine_bytes = r->has_messages = 1;
    r->answered = ld->answered;
    r->dispatch_bytes = ld->dispatch_bytes;
    r->combine_bytes = ld->combine_bytes;
    r->messages = ld->messages;
    size_t n = 0;
    for (uint32_t c = 0; c < SRV_N_CODES; c++)
        if (ld->failed[c]) {
            sv->code[n] = c;
            sv->count[n++] = ld->failed[c];
        }
    r->failed_code = sv->code;
    r->failed_count = sv->count;
    r->n_failed_code = r->n_failed_count = n;
}

/* The layer's load: its routed pairs by expert and by rank (buf: 2 * (E + P)). */
static void srv_report_load(const srv_server *s, const srv_load *ld, uint32_t *buf,
                            Epmoe__LoadReport *r)
{
    r->requests = ld->requests;
    r->tokens = ld->tokens;
    size_t ne = 0, np = 0;
    uint32_t *ei = buf, *ec = buf + s->E, *pr = buf + 2 * s->E, *pc = pr + s->P;
    for (int e = 0; e < s->E; e++)
        if (ld->expert[e]) {
            ei[ne] = (uint32_t)e;
            ec[ne++] = ld->expert[e];
        }
    for (int p = 0; p < s->P; p++)
        if (ld->rank[p]) {
            pr[np] = (uint32_t)p;
            pc[np++] = ld->rank[p];
        }
    r->routed_expert = ei;
    r->routed_tokens = ec;
    r->n_routed_expert = r->n_routed_tokens = ne;
    r->pair_rank = pr;
    r->pair_count = pc;
    r->n_pair_rank = r->n_pair_count = np;
}

static bool srv_load_empty(const srv_load *ld)
{
    uint32_t failed = 0;
    for (int c = 0; c < SRV_N_CODES; c++)
        failed |= ld->failed[c];
    return ld->requests == 0 && ld->answered == 0 && failed == 0 && ld->messages == 0;
}

void srv_report(srv_server *s, const srv_env *env, srv_report_fn fn, void *ctx)
{
    if (s->load == NULL || env->session == NULL)
        return;
    uint32_t *buf = malloc((size_t)(2 * (s->E + s->P)) * sizeof *buf + 4);
    for (int l = 0; buf && l < s->L; l++) {
        srv_load *ld = &s->load[l];
        if (srv_load_empty(ld))
            continue;
        Epmoe__LoadReport r = EPMOE__LOAD_REPORT__INIT;
        srv_served sv = {0};
        r.has_layer = r.has_requests = r.has_tokens = r.has_epoch = 1;
        r.epoch = env->session->epoch;
        r.layer = (uint32_t)l;
        srv_report_load(s, ld, buf, &r);
        srv_report_served(ld, &sv, &r);
        fn(ctx, &r);
        uint32_t *expert = ld->expert, *rank = ld->rank;
        memset(expert, 0, (size_t)s->E * sizeof *expert);
        memset(rank, 0, (size_t)s->P * sizeof *rank);
        *ld = (srv_load){.expert = expert, .rank = rank};
    }
    free(buf);
}

void srv_peer_reports(srv_server *s, const srv_env *env, srv_peer_fn fn, void *ctx)
{
    if (env->session == NULL || s->report_due == NULL || s->P != env->session->world_size)
        return;
    for (int r = 0; r < s->P; r++) {
        if (!s->report_due[r])
            continue;
        s->report_due[r] = 0;
        Epmoe__PeerUnreachable u = EPMOE__PEER_UNREACHABLE__INIT;
        u.has_epoch = u.has_rank = u.has_silent_ms = 1;
        u.epoch = env->session->epoch;
        u.rank = (uint32_t)r;
        int64_t since =
            s->heard_ms[r] > 0 ? s->heard_ms[r] : s->suspect_ms[r] - env->session->progress_ms;
        u.silent_ms = (uint32_t)(clk_mono_ms() - since);
        fn(ctx, &u);
    }
}

void srv_destroy(srv_server **self_p)
{
    srv_server *s = *self_p;
    if (s == NULL)
        return;
    /* how the serving went (docs/performance.md "Serving path" reads it) */
    log_info("serving: %llu requests submitted, %llu answered, %llu failed, %llu busy; %llu "
             "replays; %llu expert batches of %.2f jobs, %.2f pairs per expert read; %llu "
             "shared-expert batches of %.2f requests on average",
             (unsigned long long)s->stats.submitted, (unsigned long long)s->stats.completed,
             (unsigned long long)s->stats.failed, (unsigned long long)s->stats.busy,
             (unsigned long long)s->stats.replays, (unsigned long long)s->stats.batches,
             s->stats.batches ? (double)s->stats.batched_jobs / (double)s->stats.batches : 0.0,
             s->stats.expert_reads ? (double)s->stats.pairs / (double)s->stats.expert_reads : 0.0,
             (unsigned long long)s->stats.shared_batches,
             s->stats.shared_batches
                 ? (double)s->stats.shared_requests / (double)s->stats.shared_batches
                 : 0.0);
    for (int i = 0; i < SRV_MAX_REQUESTS; i++)
        if (s->req[i].phase != SRV_FREE)
            srv_fail(s, &s->req[i], EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN,
                     "the entry worker is stopping");
    for (int j = 0; j < s->n_jobs; j++)
        if (!s->job[j].own)
            tpz_msg_release(&s->job[j].msg);
    free(s->job);
    free(s->out_credit);
    free(s->heard_ms);
    free(s->suspect_ms);
    free(s->report_due);
    free(s->route_ok);
    for (int l = 0; s->load && l < s->L; l++) {
        free(s->load[l].expert);
        free(s->load[l].rank);
    }
    free(s->load);
    if (s->endpoint[0])
        zmq_unbind(s->sock, s->endpoint); /* starts releasing the address now */
    zmq_close(s->sock);
    free(s);
    *self_p = NULL;
}
