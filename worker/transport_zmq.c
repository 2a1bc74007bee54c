/*
 * transport_zmq.c — the data plane over ZeroMQ PUSH/PULL (see transport_zmq.h).
 *
 * Outgoing: one block per message holds every payload array at 64-byte aligned offsets; each
 * payload frame is a zero-copy slice of it and holds one reference, so the block is freed by
 * ZeroMQ's I/O thread when the last frame has gone out (hence the atomic count).
 * Incoming: the wire_msg (its frames) is kept whole and the tp_msg arrays point into it;
 * ZeroMQ gives no alignment guarantee for frame data (small frames live inside zmq_msg_t,
 * others may be slices of a shared receive buffer), so a misaligned array is copied once.
 */
#include "worker/transport_zmq.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/auth.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/wire.h"

/* A data-plane body is a handful of varints (< 64 bytes); anything longer is not ours. */
#define TPZ_MAX_BODY 1024
/* How long tpz_create waits for an endpoint still held (EADDRINUSE) before failing. */
#define TPZ_BIND_RETRY_MS      2000
#define TPZ_BIND_RETRY_STEP_MS 10
/* Drop reasons logged per second at most; the rest are counted and summarised. */
#define TPZ_LOG_PER_SEC 10

struct tpz_buf {
    atomic_int refs; /* outgoing: payload frames ZeroMQ has not freed yet */
    wire_msg *in;    /* incoming: the frames the arrays point into */
    uint8_t *data;   /* outgoing payloads, or incoming arrays copied for alignment */
};

/* What one peer holds in this worker: at most one DISPATCH, and a COMBINE only if granted. */
typedef struct tpz_peer {
    tp_msg dispatch, combine;
    bool has_dispatch, has_combine;
    bool granted; /* a COMBINE of grant_pairs rows for grant_step may come */
    uint64_t grant_step;
    int grant_pairs;
} tpz_peer;

/* A kept serving-path message, in arrival order; conn: the connection it came on (its file
 * descriptor, ZMQ_SRCFD), -1 when none is known (tpz_deliver). */
typedef struct tpz_rq_node {
    tp_msg m;
    int conn;
    struct tpz_rq_node *next;
} tpz_rq_node;

/* Connections told apart by their descriptor: beyond this one, credits fall back to the rank
 * the message claims (a process has far fewer descriptors open; the bound keeps the table
 * small whatever libzmq reports). */
#define TPZ_MAX_CONN_FD 65536

struct tpz_transport {
    void *zctx;
    void *pull;
    void **push; /* [world_size], NULL for own rank and before tpz_connect */
    int rank, world_size, hidden, n_experts, topk;
    uint64_t session, epoch;
    uint8_t *owned; /* [E]: this rank holds expert e (in some layer) */
    char endpoint[EP_MAX_PATH];
    bool secure;
    auth_keypair key;
    uint8_t (*peer_key)[AUTH_KEY_BYTES]; /* [world_size] with security */
    char **peer_name;                    /* [world_size] with security: expected user ids */
    tpz_peer *peer;                      /* [world_size] */
    int n_pending;
    /* the serving path: kept messages in arrival order, and how many of each kind per peer */
    tpz_rq_node *rq_head, **rq_tail;
    int (*rq_count)[2];   /* [world_size][kind]: messages of no known connection */
    int (*conn_count)[2]; /* [n_conn][kind]: per connection (descriptor), grown on demand */
    int n_conn;
    bool have_finished;
    uint64_t finished_upto;
    uint64_t dropped;
    char last_drop[EP_ERR_MSG_MAX];
    log_rate log;         /* drop reasons: TPZ_LOG_PER_SEC lines a second */
    tpz_awaits_fn awaits; /* the serving path's COMBINEs the owner waits for (NULL: any) */
    void *awaits_ctx;
};

/* ---- blocks ---------------------------------------------------------------------------------- */

static void tpz_buf_free(struct tpz_buf *b)
{
    if (b->in) {
        wire_msg_close(b->in);
        free(b->in);
    }
    free(b->data);
    free(b);
}

/* ZeroMQ's free_fn for payload frames: runs on the I/O thread. */
static void tpz_buf_unref(void *data, void *hint)
{
    (void)data;
    struct tpz_buf *b = hint;
    if (atomic_fetch_sub(&b->refs, 1) == 1)
        tpz_buf_free(b);
}

/* The payload arrays of m in wire order (m's members) with their sizes; returns the count. */
static int tpz_arrays(tp_msg *m, int hidden, void ***ptr, size_t *len)
{
    size_t off[TP_MAX_ARRAYS], total;
    int n = tp_msg_layout(m, hidden, off, len, &total), i = 0;
    if (m->kind == TP_COMBINE) {
        ptr[i] = (void **)&m->out;
        return n;
    }
    if (m->format == TP_FMT_FP8) {
        ptr[i++] = (void **)&m->codes;
        ptr[i++] = &m->scales;
    } else {
        ptr[i++] = (void **)&m->hidden;
    }
    ptr[i++] = (void **)&m->pair_row;
    ptr[i++] = (void **)&m->pair_expert;
    ptr[i] = (void **)&m->pair_weight;
    return n;
}

int tpz_msg_alloc(tp_msg *m, int hidden, ep_err *err)
{
    if (m->n_rows < 0 || m->n_rows > EP_MAX_TOKENS || m->n_pairs < 0 ||
        m->n_pairs > EP_MAX_TOKENS * MC_MAX_TOPK)
        return ep_err_set(err, "data-plane message of %d rows and %d pairs exceeds the limits",
                          m->n_rows, m->n_pairs);
    size_t off[TP_MAX_ARRAYS], len[TP_MAX_ARRAYS], total;
    tp_msg_layout(m, hidden, off, len, &total);
    if (total > EP_MAX_DATA_MSG)
        return ep_err_set(err, "data-plane message of %zu bytes exceeds EP_MAX_DATA_MSG (%u)",
                          total, EP_MAX_DATA_MSG);
    struct tpz_buf *b = calloc(1, sizeof *b);
    uint8_t *data = aligned_alloc(TP_ALIGN, total ? total : TP_ALIGN);
    if (b == NULL || data == NULL) {
        free(b);
        free(data);
        return ep_err_set(err, "out of memory for a data-plane message of %zu bytes", total);
    }
    b->data = data;
    tp_msg_point(m, hidden, data);
    m->buf = b;
    return 0;
}

static void tpz_msg_clear_arrays(tp_msg *m)
{
    m->codes = NULL;
    m->scales = NULL;
    m->hidden = NULL;
    m->pair_row = NULL;
    m->pair_expert = NULL;
    m->pair_weight = NULL;
    m->out = NULL;
    m->buf = NULL;
}

void tpz_msg_release(tp_msg *m)
{
    if (m == NULL)
        return;
    if (m->buf)
        tpz_buf_free(m->buf);
    tpz_msg_clear_arrays(m);
}

/* ---- create, connect, destroy -----------------------------------------------------------------
 */

/* Bind, retrying while the address is still held: a transport of the previous epoch bound
 * the same endpoint, and ZeroMQ releases a listener asynchronously after zmq_close. */
static int tpz_bind(void *sock, const char *endpoint)
{
    for (int waited = 0;; waited += TPZ_BIND_RETRY_STEP_MS) {
        if (zmq_bind(sock, endpoint) == 0)
            return 0;
        if (zmq_errno() != EADDRINUSE || waited >= TPZ_BIND_RETRY_MS)
            return -1;
        struct timespec ts = {0, TPZ_BIND_RETRY_STEP_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int64_t tpz_max_frame(int hidden, int topk)
{
    int64_t T = EP_MAX_TOKENS, H = hidden, k = topk;
    int64_t max = T * H * 2; /* bf16 rows; fp8 codes and scales are smaller */
    if (T * k * H * 2 > max)
        max = T * k * H * 2; /* a COMBINE answering the largest DISPATCH */
    if (T * k * 4 > max)
        max = T * k * 4;
    return max > (int64_t)EP_MAX_DATA_MSG ? (int64_t)EP_MAX_DATA_MSG : max;
}

/* Copy the security part of cfg. */
static int tpz_copy_security(tpz_transport *tp, const tpz_config *cfg)
{
    if (cfg->key == NULL)
        return 0;
    tp->secure = true;
    tp->key = *cfg->key;
    size_t P = (size_t)cfg->world_size;
    tp->peer_key = calloc(P, sizeof *tp->peer_key);
    tp->peer_name = calloc(P, sizeof *tp->peer_name);
    if (tp->peer_key == NULL || tp->peer_name == NULL)
        return -1;
    memcpy(tp->peer_key, cfg->peer_key, P * sizeof *tp->peer_key);
    for (size_t r = 0; r < P; r++)
        if ((tp->peer_name[r] = strdup(cfg->peer_name[r])) == NULL)
            return -1;
    return 0;
}

static int tpz_pull_options(tpz_transport *tp, ep_err *err)
{
    int hwm = TPZ_RCVHWM;
    if (wire_socket_defaults(tp->pull, tpz_max_frame(tp->hidden, tp->topk), err) != 0)
        return -1;
    if (zmq_setsockopt(tp->pull, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0)
        return ep_err_set(err, "data plane: RCVHWM: %s", zmq_strerror(zmq_errno()));
    if (tp->secure && auth_server(tp->pull, &tp->key, AUTH_DOMAIN_DATA, err) != 0)
        return ep_err_prefix(err, "data plane");
    return 0;
}

/* The transport's state from cfg, without sockets. */
static tpz_transport *tpz_new(void *zctx, const tpz_config *cfg, ep_err *err)
{
    if (cfg->world_size < 1 || cfg->world_size > EP_MAX_WORKERS || cfg->rank < 0 ||
        cfg->rank >= cfg->world_size || cfg->hidden <= 0 || cfg->hidden % EP_FP8_BLOCK != 0 ||
        cfg->hidden > MC_MAX_HIDDEN || cfg->n_experts < 1 || cfg->n_experts > MC_MAX_EXPERTS ||
        cfg->topk < 1 || cfg->topk > MC_MAX_TOPK) {
        ep_err_set(err, "transport: rank %d of %d, H %d, E %d, k %d out of range", cfg->rank,
                   cfg->world_size, cfg->hidden, cfg->n_experts, cfg->topk);
        return NULL;
    }
    tpz_transport *tp = calloc(1, sizeof *tp);
    if (tp == NULL)
        goto fail_alloc;
    tp->zctx = zctx;
    tp->rank = cfg->rank;
    tp->world_size = cfg->world_size;
    tp->hidden = cfg->hidden;
    tp->n_experts = cfg->n_experts;
    tp->topk = cfg->topk;
    tp->session = cfg->session;
    tp->epoch = cfg->epoch;
    tp->push = calloc((size_t)cfg->world_size, sizeof *tp->push);
    tp->owned = calloc((size_t)cfg->n_experts, 1);
    tp->peer = calloc((size_t)cfg->world_size, sizeof *tp->peer);
    tp->rq_count = calloc((size_t)cfg->world_size, sizeof *tp->rq_count);
    tp->rq_tail = &tp->rq_head;
    if (tp->push == NULL || tp->owned == NULL || tp->peer == NULL || tp->rq_count == NULL ||
        tpz_copy_security(tp, cfg) != 0)
        goto fail_alloc;
    for (int e = 0; e < cfg->n_experts; e++)
        tp->owned[e] =
            cfg->owned ? cfg->owned[e] != 0 : cfg->expert_owner[e] == (uint32_t)cfg->rank;
    return tp;
fail_alloc:
    ep_err_set(err, "transport: out of memory");
    tpz_destroy(&tp);
    return NULL;
}

tpz_transport *tpz_create_unbound(const tpz_config *cfg, ep_err *err)
{
    return tpz_new(NULL, cfg, err);
}

tpz_transport *tpz_create(void *zctx, const tpz_config *cfg, ep_err *err)
{
    tpz_transport *tp = tpz_new(zctx, cfg, err);
    if (tp == NULL)
        return NULL;
    tp->pull = zmq_socket(zctx, ZMQ_PULL);
    if (tp->pull == NULL) {
        ep_err_set(err, "data plane: zmq_socket(PULL): %s", zmq_strerror(zmq_errno()));
        goto fail_socket;
    }
    if (tpz_pull_options(tp, err) != 0)
        goto fail_bind;
    if (tpz_bind(tp->pull, cfg->bind_endpoint) != 0) {
        ep_err_set(err, "data plane: cannot bind %s: %s", cfg->bind_endpoint,
                   zmq_strerror(zmq_errno()));
        goto fail_bind;
    }
    size_t sz = sizeof tp->endpoint;
    if (zmq_getsockopt(tp->pull, ZMQ_LAST_ENDPOINT, tp->endpoint, &sz) != 0)
        snprintf(tp->endpoint, sizeof tp->endpoint, "%s", cfg->bind_endpoint);
    return tp;

fail_bind:
    zmq_close(tp->pull);
    tp->pull = NULL;
fail_socket:
    tpz_destroy(&tp);
    return NULL;
}

int tpz_connect(tpz_transport *tp, const char *const *endpoints, ep_err *err)
{
    for (int r = 0; r < tp->world_size; r++) {
        if (r == tp->rank || tp->push[r] != NULL)
            continue;
        void *s = zmq_socket(tp->zctx, ZMQ_PUSH);
        if (s == NULL)
            return ep_err_set(err, "data plane: zmq_socket(PUSH): %s", zmq_strerror(zmq_errno()));
        /* a PUSH receives nothing: the smallest bound libzmq takes. TCP_MAXRT (Linux:
         * TCP_USER_TIMEOUT): a connection whose data goes unacknowledged that long is dropped
         * and made again, so that once a cut data plane heals the peer is reached at once, not
         * at the next retransmission of a backoff grown during the cut (up to minutes); a
         * connect that gets no answer is given up and tried again after the same while, for
         * the SYN's backoff */
        int maxrt = TPZ_TCP_MAXRT_MS, cto = TPZ_TCP_MAXRT_MS / 2;
        if (zmq_setsockopt(s, ZMQ_TCP_MAXRT, &maxrt, sizeof maxrt) != 0 ||
            zmq_setsockopt(s, ZMQ_CONNECT_TIMEOUT, &cto, sizeof cto) != 0)
            log_debug(LOG_SUB_DATA, "data plane: TCP timeouts: %s", zmq_strerror(zmq_errno()));
        if (wire_socket_defaults(s, TPZ_MAX_BODY, err) != 0 ||
            (tp->secure && auth_client(s, &tp->key, tp->peer_key[r], err) != 0)) {
            zmq_close(s);
            return ep_err_prefix(err, "data plane: to rank %d", r);
        }
        if (zmq_connect(s, endpoints[r]) != 0) {
            ep_err_set(err, "data plane: cannot connect to rank %d at %s: %s", r, endpoints[r],
                       zmq_strerror(zmq_errno()));
            zmq_close(s);
            return -1;
        }
        tp->push[r] = s;
    }
    return 0;
}

void tpz_destroy(tpz_transport **self_p)
{
    tpz_transport *tp = *self_p;
    if (tp == NULL)
        return;
    if (tp->peer)
        tpz_finish(tp, UINT64_MAX); /* releases everything kept */
    tp_msg rq;
    while (tp->rq_count && tpz_take_request(tp, &rq))
        tpz_msg_release(&rq);
    free(tp->rq_count);
    free(tp->conn_count);
    if (tp->push)
        for (int r = 0; r < tp->world_size; r++)
            if (tp->push[r])
                zmq_close(tp->push[r]);
    if (tp->pull) {
        if (tp->endpoint[0])
            zmq_unbind(tp->pull, tp->endpoint); /* starts releasing the port now */
        zmq_close(tp->pull);
    }
    if (tp->peer_name)
        for (int r = 0; r < tp->world_size; r++)
            free(tp->peer_name[r]);
    free(tp->peer_name);
    free(tp->peer_key);
    explicit_bzero(&tp->key, sizeof tp->key);
    free(tp->push);
    free(tp->owned);
    free(tp->peer);
    free(tp);
    *self_p = NULL;
}

const char *tpz_endpoint(const tpz_transport *tp)
{
    return tp->endpoint;
}

void *tpz_socket(tpz_transport *tp)
{
    return tp->pull;
}

uint64_t tpz_dropped(const tpz_transport *tp)
{
    return tp->dropped;
}

const char *tpz_last_drop(const tpz_transport *tp)
{
    return tp->last_drop;
}

int tpz_pending(const tpz_transport *tp)
{
    return tp->n_pending;
}

/* ---- sending -------------------------------------------------------------------------------- */

int tpz_send(tpz_transport *tp, int dst, tp_msg *m, ep_err *err)
{
    struct tpz_buf *b = m->buf;
    if (b == NULL || dst < 0 || dst >= tp->world_size || tp->push[dst] == NULL) {
        tpz_msg_release(m);
        return ep_err_set(err, "data plane: no connection to rank %d (or message not allocated)",
                          dst);
    }
    void **ptr[TP_MAX_ARRAYS];
    size_t len[TP_MAX_ARRAYS];
    int n = m->refused ? 0 : tpz_arrays(m, tp->hidden, ptr, len);
    if (n == 0) { /* a refused COMBINE: no payload, the block is not needed */
        m->buf = NULL;
        tpz_msg_clear_arrays(m);
        tpz_buf_free(b);
    }
    wire_payload pl[TP_MAX_ARRAYS];
    for (int i = 0; i < n; i++)
        pl[i] = (wire_payload){.data = *ptr[i], .len = len[i], .free_fn = tpz_buf_unref, .hint = b};
    if (n > 0)
        atomic_store(&b->refs, n);
    tpz_msg_clear_arrays(m); /* the frames own the block from here on */
    int rc;
    if (m->kind == TP_DISPATCH) {
        Epmoe__Dispatch d = EPMOE__DISPATCH__INIT;
        d.has_step_id = !m->is_request;
        d.has_epoch = d.has_layer = d.has_src_rank = 1;
        d.has_n_rows = d.has_n_pairs = d.has_format = d.has_scales_e8m0 = 1;
        d.has_session = 1;
        d.has_request = d.has_attempt = m->is_request;
        d.request = m->request;
        d.attempt = m->attempt;
        d.session = tp->session;
        d.step_id = m->step_id;
        d.epoch = tp->epoch;
        d.layer = m->layer;
        d.src_rank = (uint32_t)tp->rank;
        d.n_rows = (uint32_t)m->n_rows;
        d.n_pairs = (uint32_t)m->n_pairs;
        d.format = (Epmoe__DispatchFormat)m->format;
        d.scales_e8m0 = m->format == TP_FMT_FP8 && m->scales_e8m0;
        rc = wire_send(tp->push[dst], NULL, 0, EPMOE__MSG_TYPE__MSG_DISPATCH, &d.base, pl, n, true,
                       err);
    } else {
        Epmoe__Combine c = EPMOE__COMBINE__INIT;
        c.has_step_id = !m->is_request;
        c.has_epoch = c.has_src_rank = c.has_n_pairs = 1;
        c.has_session = 1;
        c.has_request = c.has_attempt = c.has_server_epoch = m->is_request;
        c.has_refused = m->refused;
        c.request = m->request;
        c.attempt = m->attempt;
        c.refused = m->refused;
        c.server_epoch = tp->epoch;
        c.session = tp->session;
        c.step_id = m->step_id;
        c.epoch = tp->epoch;
        c.src_rank = (uint32_t)tp->rank;
        c.n_pairs = (uint32_t)m->n_pairs;
        rc = wire_send(tp->push[dst], NULL, 0, EPMOE__MSG_TYPE__MSG_COMBINE, &c.base, pl, n, true,
                       err);
    }
    if (rc != 0)
        ep_err_prefix(err, "data plane: to rank %d", dst);
    return rc;
}

/* ---- receiving ------------------------------------------------------------------------------ */

static void tpz_drop(tpz_transport *tp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void tpz_drop(tpz_transport *tp, const char *fmt, ...)
{
    EP_FORMAT_ARGS(tp->last_drop, sizeof tp->last_drop, fmt);
    tp->dropped++;
    log_limited(&tp->log, TPZ_LOG_PER_SEC, LOG_WARN, "data plane: dropped a message: %s",
                tp->last_drop);
}

/* Point *dst at payload i, copying it into the aligned area at *spare when misaligned. */
static void tpz_view(const wire_msg *wm, int i, size_t align, void **dst, uint8_t **spare)
{
    const uint8_t *p = wm->payload[i];
    size_t n = wm->payload_len[i];
    if (n == 0 || (uintptr_t)p % align == 0) {
        *dst = (void *)p;
        return;
    }
    memcpy(*spare, p, n);
    *dst = *spare;
    *spare += tp_round(n);
}

/* Bytes needed to copy the misaligned payloads among [0, n). */
static size_t tpz_spare_size(const wire_msg *wm, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (wm->payload_len[i] && (uintptr_t)wm->payload[i] % 4 != 0)
            total += tp_round(wm->payload_len[i]);
    return total;
}

/* What only the ZeroMQ plane checks (its messages come over the network, the collective
 * plane's from the communicator the coordinator built): the session, and with security that
 * the sender's key speaks for the rank it claims. */
static int tpz_check_sender(const tpz_transport *tp, bool has_session, uint64_t session,
                            bool has_src, uint32_t src, const wire_msg *wm, ep_err *err)
{
    if (!has_session)
        return ep_err_set(err, "session missing");
    if (session != tp->session)
        return ep_err_set(err, "session %016llx is not this cluster's (a stale or forged message)",
                          (unsigned long long)session);
    if (tp->secure && has_src && src < (uint32_t)tp->world_size) {
        const char *uid = wire_user_id(wm);
        if (uid == NULL || strcmp(uid, tp->peer_name[src]) != 0)
            return ep_err_set(err, "claims rank %u (%s) but comes with the key of %s", src,
                              tp->peer_name[src], uid ? uid : "nobody");
    }
    return 0;
}

static tp_check tpz_checker(const tpz_transport *tp)
{
    return (tp_check){.rank = tp->rank,
                      .world_size = tp->world_size,
                      .hidden = tp->hidden,
                      .n_experts = tp->n_experts,
                      .topk = tp->topk,
                      .epoch = tp->epoch,
                      .owned = tp->owned};
}

/* Every payload frame of wm holds exactly the bytes m's counts give its array. */
static int tpz_check_sizes(const tpz_transport *tp, const wire_msg *wm, const tp_msg *m,
                           ep_err *err)
{
    static const char *const dnames[2][TP_MAX_ARRAYS] = {
        {"codes", "scales", "pair_row", "pair_expert", "pair_weight"},
        {"hidden", "pair_row", "pair_expert", "pair_weight", ""}};
    size_t off[TP_MAX_ARRAYS], len[TP_MAX_ARRAYS], total;
    int n = tp_msg_layout(m, tp->hidden, off, len, &total);
    if (m->refused) {
        if (wm->n_payloads != 0)
            return ep_err_set(err, "a refused COMBINE with %d payloads, expected none",
                              wm->n_payloads);
        return 0;
    }
    if (wm->n_payloads != n) {
        if (m->kind == TP_COMBINE)
            return ep_err_set(err, "%d payloads, expected 1 (out)", wm->n_payloads);
        return ep_err_set(err, "%d payloads, expected %d for format %s", wm->n_payloads, n,
                          m->format == TP_FMT_FP8 ? "fp8" : "bf16");
    }
    for (int i = 0; i < n; i++)
        if (wm->payload_len[i] != len[i])
            return ep_err_set(err, "%s payload has %zu bytes, expected %zu",
                              m->kind == TP_COMBINE ? "out" : dnames[m->format][i],
                              wm->payload_len[i], len[i]);
    return 0;
}

/* Validate a DISPATCH's body and frame sizes and fill m's scalars. */
static int tpz_parse_dispatch(tpz_transport *tp, const wire_msg *wm, tp_msg *m, ep_err *err)
{
    Epmoe__Dispatch *d = (Epmoe__Dispatch *)wire_unpack(&epmoe__dispatch__descriptor, wm, err);
    if (d == NULL)
        return -1;
    tp_check c = tpz_checker(tp);
    int rc = tpz_check_sender(tp, d->has_session, d->session, d->has_src_rank, d->src_rank, wm,
                              err) == 0 &&
                     tp_check_dispatch(&c, d, m, err) == 0
                 ? tpz_check_sizes(tp, wm, m, err)
                 : -1;
    wire_free_unpacked(&d->base);
    return rc == 0 ? 0 : ep_err_prefix(err, "MSG_DISPATCH");
}

static int tpz_parse_combine(tpz_transport *tp, const wire_msg *wm, tp_msg *m, ep_err *err)
{
    Epmoe__Combine *b = (Epmoe__Combine *)wire_unpack(&epmoe__combine__descriptor, wm, err);
    if (b == NULL)
        return -1;
    tp_check c = tpz_checker(tp);
    int rc = tpz_check_sender(tp, b->has_session, b->session, b->has_src_rank, b->src_rank, wm,
                              err) == 0 &&
                     tp_check_combine(&c, b, m, err) == 0
                 ? tpz_check_sizes(tp, wm, m, err)
                 : -1;
    wire_free_unpacked(&b->base);
    return rc == 0 ? 0 : ep_err_prefix(err, "MSG_COMBINE");
}

/* Point m's arrays at wm's payloads (aligned) and hand wm to m. */
static int tpz_attach(tp_msg *m, wire_msg *wm, ep_err *err)
{
    struct tpz_buf *b = calloc(1, sizeof *b);
    size_t spare_len = tpz_spare_size(wm, wm->n_payloads);
    if (b == NULL || (spare_len && (b->data = aligned_alloc(TP_ALIGN, spare_len)) == NULL)) {
        free(b);
        return ep_err_set(err, "out of memory receiving a message");
    }
    uint8_t *spare = b->data;
    int i = 0;
    if (m->kind == TP_COMBINE) {
        if (!m->refused)
            tpz_view(wm, i++, 2, (void **)&m->out, &spare);
    } else {
        if (m->format == TP_FMT_FP8) {
            tpz_view(wm, i++, 1, (void **)&m->codes, &spare);
            tpz_view(wm, i++, 4, &m->scales, &spare);
        } else {
            tpz_view(wm, i++, 2, (void **)&m->hidden, &spare);
        }
        tpz_view(wm, i++, 4, (void **)&m->pair_row, &spare);
        tpz_view(wm, i++, 4, (void **)&m->pair_expert, &spare);
        tpz_view(wm, i++, 4, (void **)&m->pair_weight, &spare);
    }
    b->in = wm;
    m->buf = b;
    return 0;
}

static const char *tpz_kind_name(tp_kind k)
{
    return k == TP_DISPATCH ? "DISPATCH" : "COMBINE";
}

/* Validate wm; on success *m owns it. On failure the caller still owns wm. */
static int tpz_accept(tpz_transport *tp, wire_msg *wm, tp_msg *m, ep_err *err)
{
    int rc;
    if (wm->type == EPMOE__MSG_TYPE__MSG_DISPATCH)
        rc = tpz_parse_dispatch(tp, wm, m, err);
    else if (wm->type == EPMOE__MSG_TYPE__MSG_COMBINE)
        rc = tpz_parse_combine(tp, wm, m, err);
    else
        return ep_err_set(err, "%s is not a data-plane message", wire_type_name(wm->type));
    if (rc != 0)
        return -1;
    if (tpz_attach(m, wm, err) != 0)
        return -1;
    tp_check c = tpz_checker(tp);
    if (m->is_request)
        c.owned = NULL; /* the serving path refuses per layer what this rank does not hold */
    if (m->kind == TP_DISPATCH &&
        tp_check_pairs(&c, m->n_rows, m->n_pairs, m->pair_row, m->pair_expert, err) != 0) {
        m->buf->in = NULL; /* wm stays the caller's */
        tpz_msg_release(m);
        return ep_err_prefix(err, "DISPATCH of step %llu from rank %d",
                             (unsigned long long)m->step_id, m->src_rank);
    }
    return 0;
}

static void tpz_reject(tpz_transport *tp, tp_msg *m, const char *why)
{
    tpz_drop(tp, "%s of step %llu from rank %d: %s", tpz_kind_name(m->kind),
             (unsigned long long)m->step_id, m->src_rank, why);
    tpz_msg_release(m);
}

/* The connection m came on (its descriptor), or -1. */
static int tpz_conn(const tp_msg *m)
{
    const wire_msg *wm = m->buf ? m->buf->in : NULL;
    if (wm == NULL || wm->n_frames < 1)
        return -1;
    int fd = zmq_msg_get((zmq_msg_t *)&wm->frames[0], ZMQ_SRCFD);
    return fd >= 0 && fd < TPZ_MAX_CONN_FD ? fd : -1;
}

/* The credit counter a message of (conn, rank, kind) spends: its connection's when known, so a
 * stranger sending in a peer's name spends its own connection's credits, never the peer's
 * (without security a PULL cannot tell who sent a message, but libzmq knows which connection
 * it came on). NULL when the table cannot grow. */
static int *tpz_credit(tpz_transport *tp, int conn, int rank, tp_kind kind)
{
    if (conn < 0)
        return &tp->rq_count[rank][kind];
    if (conn >= tp->n_conn) {
        int n = conn + 64 < TPZ_MAX_CONN_FD ? conn + 64 : TPZ_MAX_CONN_FD;
        int(*c)[2] = realloc(tp->conn_count, (size_t)n * sizeof *c);
        if (c == NULL)
            return NULL;
        memset(c + tp->n_conn, 0, (size_t)(n - tp->n_conn) * sizeof *c);
        tp->conn_count = c;
        tp->n_conn = n;
    }
    return &tp->conn_count[conn][kind];
}

void tpz_set_awaits(tpz_transport *tp, tpz_awaits_fn fn, void *ctx)
{
    tp->awaits = fn;
    tp->awaits_ctx = ctx;
}

/* A serving-path message: kept in arrival order within the credits of its connection. */
static bool tpz_keep_request(tpz_transport *tp, tp_msg *m)
{
    if (m->kind == TP_COMBINE && tp->awaits &&
        !tp->awaits(tp->awaits_ctx, m->request, m->attempt, m->src_rank)) {
        tpz_drop(tp, "COMBINE of request %016llx/%u from rank %d: no such part in flight",
                 (unsigned long long)m->request, m->attempt, m->src_rank);
        tpz_msg_release(m);
        return false;
    }
    int conn = tpz_conn(m);
    int *count = tpz_credit(tp, conn, m->src_rank, m->kind);
    tpz_rq_node *n = count && *count < TPZ_SERVE_CREDITS ? malloc(sizeof *n) : NULL;
    if (n == NULL) {
        tpz_drop(tp, "%s of request %016llx from rank %d: %s", tpz_kind_name(m->kind),
                 (unsigned long long)m->request, m->src_rank,
                 count && *count >= TPZ_SERVE_CREDITS ? "beyond its connection's credits"
                                                      : "out of memory");
        tpz_msg_release(m);
        return false;
    }
    n->m = *m;
    n->conn = conn;
    n->next = NULL;
    *tp->rq_tail = n;
    tp->rq_tail = &n->next;
    (*count)++;
    tp->n_pending++;
    log_debug(LOG_SUB_DATA, "%s request %016llx/%u from rank %d: %d rows, %d pairs",
              tpz_kind_name(m->kind), (unsigned long long)m->request, m->attempt, m->src_rank,
              m->n_rows, m->n_pairs);
    return true;
}

int tpz_take_request(tpz_transport *tp, tp_msg *out)
{
    tpz_rq_node *n = tp->rq_head;
    if (n == NULL)
        return 0;
    tp->rq_head = n->next;
    if (tp->rq_head == NULL)
        tp->rq_tail = &tp->rq_head;
    *out = n->m;
    if (n->conn >= 0)
        tp->conn_count[n->conn][out->kind]--;
    else
        tp->rq_count[out->src_rank][out->kind]--;
    tp->n_pending--;
    free(n);
    return 1;
}

/* Keep m in its peer's slot if the peer may hold it (transport_zmq.h), else drop it. Returns
 * whether it was kept. */
static bool tpz_keep(tpz_transport *tp, tp_msg *m)
{
    if (m->is_request)
        return tpz_keep_request(tp, m);
    tpz_peer *p = &tp->peer[m->src_rank];
    char why[160];
    if (tp->have_finished && m->step_id <= tp->finished_upto) {
        tpz_reject(tp, m, "that step is finished");
        return false;
    }
    if (m->kind == TP_COMBINE) {
        if (!p->granted || p->grant_step != m->step_id || p->grant_pairs != m->n_pairs) {
            if (p->granted && p->grant_step == m->step_id)
                snprintf(why, sizeof why, "%d pairs, %d were dispatched", m->n_pairs,
                         p->grant_pairs);
            else
                snprintf(why, sizeof why, "no DISPATCH of that step went to that rank");
            tpz_reject(tp, m, why);
            return false;
        }
        p->granted = false; /* one COMBINE per grant */
        if (p->has_combine) {
            /* kept under an earlier grant and never taken: the owner has moved on */
            tpz_reject(tp, &p->combine, "replaced by the COMBINE of a newer grant");
            tp->n_pending--;
        }
        p->combine = *m;
        p->has_combine = true;
    } else {
        /* No window of step ids beyond the last finished one: a worker that was away (a
         * drain, SIGSTOP, a rejoin: stay spare) finished nothing for thousands of steps, and
         * its peers' DISPATCHes of its first step back come before its STEP. The slot bounds
         * what a peer holds, whatever the id. */
        if (p->has_dispatch && p->dispatch.step_id == m->step_id) {
            tpz_reject(tp, m, "a duplicate (one DISPATCH per step and peer)");
            return false;
        }
        if (p->has_dispatch) {
            /* the peer moved on: what it sent before belongs to a step that was settled */
            tpz_reject(tp, &p->dispatch, "replaced by a newer one from the same peer");
            tp->n_pending--;
        }
        p->dispatch = *m;
        p->has_dispatch = true;
    }
    tp->n_pending++;
    log_debug(LOG_SUB_DATA, "%s step %llu from rank %d: %d rows, %d pairs", tpz_kind_name(m->kind),
              (unsigned long long)m->step_id, m->src_rank, m->n_rows, m->n_pairs);
    return true;
}

/* Validate wm (heap-allocated, taken) and keep or drop it: 1 kept, 0 dropped. */
static int tpz_accept_or_drop(tpz_transport *tp, wire_msg *wm)
{
    ep_err err;
    tp_msg m = {0};
    if (tpz_accept(tp, wm, &m, &err) != 0) {
        wire_msg_close(wm);
        free(wm);
        tpz_drop(tp, "%s", err.msg);
        return 0;
    }
    return tpz_keep(tp, &m) ? 1 : 0;
}

void tpz_deliver(tpz_transport *tp, wire_msg *wm)
{
    tpz_accept_or_drop(tp, wm);
}

/* One message: 1 kept, 0 dropped, -1 nothing to read. */
static int tpz_recv_one(tpz_transport *tp)
{
    wire_msg *wm = malloc(sizeof *wm);
    if (wm == NULL)
        return -1;
    ep_err err;
    wire_rc rc = wire_recv(tp->pull, false, TPZ_MAX_BODY, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, wm, &err);
    if (rc != WIRE_OK) {
        free(wm);
        if (rc == WIRE_AGAIN)
            return -1;
        tpz_drop(tp, "%s", err.msg);
        return 0;
    }
    return tpz_accept_or_drop(tp, wm);
}

int tpz_pump(tpz_transport *tp)
{
    int kept = 0, rc;
    while ((rc = tpz_recv_one(tp)) >= 0)
        kept += rc;
    return kept;
}

void tpz_grant(tpz_transport *tp, uint64_t step_id, int peer, int n_pairs)
{
    if (peer < 0 || peer >= tp->world_size || peer == tp->rank)
        return;
    tpz_peer *p = &tp->peer[peer];
    p->granted = true;
    p->grant_step = step_id;
    p->grant_pairs = n_pairs;
}

int tpz_take(tpz_transport *tp, uint64_t step_id, tp_msg *out)
{
    for (int r = 0; r < tp->world_size; r++) {
        tpz_peer *p = &tp->peer[r];
        if (p->has_dispatch && p->dispatch.step_id == step_id) {
            *out = p->dispatch;
            p->has_dispatch = false;
        } else if (p->has_combine && p->combine.step_id == step_id) {
            *out = p->combine;
            p->has_combine = false;
        } else {
            continue;
        }
        tp->n_pending--;
        return 1;
    }
    return 0;
}

void tpz_finish(tpz_transport *tp, uint64_t step_id)
{
    if (!tp->have_finished || step_id > tp->finished_upto)
        tp->finished_upto = step_id;
    tp->have_finished = true;
    for (int r = 0; r < tp->world_size; r++) {
        tpz_peer *p = &tp->peer[r];
        if (p->has_dispatch && p->dispatch.step_id <= tp->finished_upto) {
            tpz_msg_release(&p->dispatch);
            p->has_dispatch = false;
            tp->n_pending--;
        }
        if (p->has_combine && p->combine.step_id <= tp->finished_upto) {
            tpz_msg_release(&p->combine);
            p->has_combine = false;
            tp->n_pending--;
        }
        if (p->granted && p->grant_step <= tp->finished_upto)
            p->granted = false;
    }
}

int tpz_set_placement_owned(tpz_transport *tp, uint64_t epoch, const uint8_t *owned, ep_err *err)
{
    if (epoch <= tp->epoch)
        return ep_err_set(err, "data plane: epoch %llu does not follow epoch %llu",
                          (unsigned long long)epoch, (unsigned long long)tp->epoch);
    tp->epoch = epoch;
    for (int e = 0; e < tp->n_experts; e++)
        tp->owned[e] = owned[e] != 0;
    /* nothing of the old epoch is kept or granted any more (the coordinator starts the new
     * epoch's steps once every member has it, so nothing of the new one is in flight yet) */
    for (int r = 0; r < tp->world_size; r++) {
        tpz_peer *p = &tp->peer[r];
        if (p->has_dispatch)
            tpz_msg_release(&p->dispatch);
        if (p->has_combine)
            tpz_msg_release(&p->combine);
        if (p->has_dispatch || p->has_combine)
            tp->n_pending -= p->has_dispatch + p->has_combine;
        *p = (tpz_peer){0};
    }
    /* the serving path's messages stay: a request outlives the epoch it started in */
    return 0;
}

int tpz_set_placement(tpz_transport *tp, uint64_t epoch, const uint32_t *expert_owner, ep_err *err)
{
    uint8_t *owned = malloc((size_t)tp->n_experts);
    if (owned == NULL)
        return ep_err_set(err, "data plane: out of memory");
    for (int e = 0; e < tp->n_experts; e++)
        owned[e] = expert_owner[e] == (uint32_t)tp->rank;
    int rc = tpz_set_placement_owned(tp, epoch, owned, err);
    free(owned);
    return rc;
}

uint64_t tpz_epoch(const tpz_transport *tp)
{
    return tp->epoch;
}

uint64_t tpz_session(const tpz_transport *tp)
{
    return tp->session;
}
