/*
 * bench_client.c — what libepmoe adds to a round trip (docs/performance.md "libepmoe").
 *
 * An echo entry (a thread with a ROUTER) answers every SUBMIT with a RESULT of the right
 * sizes (out bf16 [T, H], topk [T, k]); a fake coordinator answers CLIENT_INFO. In the same
 * process and on the same kind of socket (tcp loopback, then ipc) it measures, one request at
 * a time, the round trip of
 *   raw:      a DEALER sending the SUBMIT frames with wire_send and reading the RESULT, and
 *   libepmoe: epmoe_submit + epmoe_wait (the I/O thread, the slot, the copy into out),
 * and, with D requests in flight (epmoe_poll on epmoe_fd), libepmoe's requests per second
 * against the raw socket keeping D in flight too. Reported as ratios to raw.
 *
 *   bench_client [T (1)] [H (4096)] [K (6)] [N (3000)] [D (16)]
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "client/epmoe.h"
#include "common/wire.h"

static int T = 1, H = 4096, K = 6, N = 3000, D = 16;

typedef struct echo {
    void *zctx, *coord, *entry;
    char coord_ep[128], entry_ep[128];
    atomic_bool stop;
    uint16_t *out;
    int32_t *ids;
    float *w;
} echo;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void echo_info(echo *e, const wire_msg *m)
{
    Epmoe__AdminRequest *rq =
        (Epmoe__AdminRequest *)wire_unpack(&epmoe__admin_request__descriptor, m, NULL);
    if (rq == NULL)
        return;
    Epmoe__ModelConfig mc = EPMOE__MODEL_CONFIG__INIT;
    mc.has_hidden_size = mc.has_num_hidden_layers = mc.has_num_experts_per_tok = 1;
    mc.has_n_routed_experts = mc.has_vocab_size = 1;
    mc.hidden_size = (uint32_t)H;
    mc.num_hidden_layers = 4;
    mc.num_experts_per_tok = (uint32_t)K;
    mc.n_routed_experts = 256;
    mc.vocab_size = 1000;
    Epmoe__WorkerInfo wi = EPMOE__WORKER_INFO__INIT, *wp = &wi;
    wi.name = "echo";
    wi.has_member = 1;
    wi.member = 1;
    wi.state = "ready";
    wi.client_endpoint = e->entry_ep;
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.has_id = rep.has_ok = rep.has_config_hash = 1;
    rep.id = rq->id;
    rep.ok = 1;
    rep.config = &mc;
    rep.n_workers = 1;
    rep.workers = &wp;
    wire_send(e->coord, m->ident, m->ident_len, EPMOE__MSG_TYPE__MSG_ADMIN_REPLY, &rep.base, NULL,
              0, true, NULL);
    wire_free_unpacked(&rq->base);
}

static void echo_submit(echo *e, const wire_msg *m)
{
    Epmoe__Submit *s = (Epmoe__Submit *)wire_unpack(&epmoe__submit__descriptor, m, NULL);
    if (s == NULL)
        return;
    Epmoe__Result r = EPMOE__RESULT__INIT;
    r.has_client = r.has_seq = r.has_n_tokens = 1;
    r.client = s->client;
    r.seq = s->seq;
    r.n_tokens = s->n_tokens;
    size_t t = s->n_tokens;
    wire_payload p[3] = {{.data = e->out, .len = t * (size_t)H * 2},
                         {.data = e->ids, .len = t * (size_t)K * 4},
                         {.data = e->w, .len = t * (size_t)K * 4}};
    wire_send(e->entry, m->ident, m->ident_len, EPMOE__MSG_TYPE__MSG_RESULT, &r.base, p, 3, true,
              NULL);
    wire_free_unpacked(&s->base);
}

static void *echo_main(void *arg)
{
    echo *e = arg;
    while (!atomic_load(&e->stop)) {
        zmq_pollitem_t it[2] = {{.socket = e->coord, .events = ZMQ_POLLIN},
                                {.socket = e->entry, .events = ZMQ_POLLIN}};
        zmq_poll(it, 2, 20);
        wire_msg m;
        ep_err err;
        while (wire_recv(e->coord, true, 1 << 20, 0, ZMQ_DONTWAIT, &m, &err) == WIRE_OK) {
            echo_info(e, &m);
            wire_msg_close(&m);
        }
        while (wire_recv(e->entry, true, 1 << 20, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err) ==
               WIRE_OK) {
            echo_submit(e, &m);
            wire_msg_close(&m);
        }
    }
    return NULL;
}

static void *bind_router(void *zctx, const char *at, char *ep, size_t cap)
{
    void *s = zmq_socket(zctx, ZMQ_ROUTER);
    wire_socket_defaults(s, (int64_t)EP_MAX_DATA_MSG, NULL);
    if (zmq_bind(s, at) != 0) {
        fprintf(stderr, "bind %s: %s\n", at, zmq_strerror(zmq_errno()));
        exit(1);
    }
    size_t len = cap;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One raw SUBMIT from sock (a DEALER to the entry). */
static void raw_send(void *sock, const uint16_t *hidden, uint64_t seq)
{
    Epmoe__Submit sb = EPMOE__SUBMIT__INIT;
    sb.has_client = sb.has_seq = sb.has_layer = sb.has_n_tokens = 1;
    sb.client = 1;
    sb.seq = seq;
    sb.layer = 1;
    sb.n_tokens = (uint32_t)T;
    wire_payload p = {.data = hidden, .len = (size_t)T * (size_t)H * 2};
    wire_send(sock, NULL, 0, EPMOE__MSG_TYPE__MSG_SUBMIT, &sb.base, &p, 1, false, NULL);
}

static void raw_recv(void *sock, uint16_t *out)
{
    wire_msg m;
    ep_err err;
    while (wire_recv(sock, false, 1 << 20, EP_MAX_DATA_MSG, 0, &m, &err) != WIRE_OK)
        ;
    Epmoe__Result *r = (Epmoe__Result *)wire_unpack(&epmoe__result__descriptor, &m, NULL);
    if (r != NULL && m.n_payloads == 3)
        memcpy(out, m.payload[0], m.payload_len[0]); /* what a caller gets: its own buffer */
    if (r != NULL)
        wire_free_unpacked(&r->base);
    wire_msg_close(&m);
}

typedef struct result {
    double p50, p99, rps;
} result;

static result summarize(double *lat, int n, double wall, int done)
{
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    return (result){.p50 = lat[n / 2], .p99 = lat[n * 99 / 100], .rps = done / wall};
}

static void run_raw(echo *e, uint16_t *hidden, uint16_t *out, double *lat, result *seq, result *par)
{
    void *s = zmq_socket(e->zctx, ZMQ_DEALER);
    wire_socket_defaults(s, (int64_t)EP_MAX_DATA_MSG, NULL);
    zmq_connect(s, e->entry_ep);
    raw_send(s, hidden, 1); /* connect and warm */
    raw_recv(s, out);
    for (int i = 0; i < N; i++) {
        double t0 = now_s();
        raw_send(s, hidden, (uint64_t)i + 2);
        raw_recv(s, out);
        lat[i] = now_s() - t0;
    }
    *seq = summarize(lat, N, 1, 0);
    double t0 = now_s();
    for (int i = 0; i < D; i++)
        raw_send(s, hidden, (uint64_t)i);
    for (int i = 0; i < N; i++) {
        raw_recv(s, out);
        if (i + D < N)
            raw_send(s, hidden, (uint64_t)i);
    }
    par->rps = N / (now_s() - t0);
    zmq_close(s);
}

static void run_lib(echo *e, uint16_t *hidden, uint16_t *out, double *lat, result *seq, result *par)
{
    epmoe_options o = {.size = sizeof o, .version = EPMOE_OPTIONS_VERSION};
    o.coordinator = e->coord_ep;
    o.max_in_flight = (uint32_t)D;
    epmoe_client *c = NULL;
    epmoe_error err;
    if (epmoe_open(&o, &c, &err) != EPMOE_OK) {
        fprintf(stderr, "epmoe_open: %s\n", err.message);
        exit(1);
    }
    epmoe_submit_args a = EPMOE_SUBMIT_ARGS_INIT;
    a.layer = 1;
    a.n_tokens = (uint32_t)T;
    a.hidden_size = (uint32_t)H;
    a.hidden = hidden;
    a.out = out;
    epmoe_request *rq;
    for (int i = -1; i < N; i++) { /* -1: connect and warm */
        double t0 = now_s();
        if (epmoe_submit(c, &a, &rq, &err) != EPMOE_OK || epmoe_wait(rq, -1, &err) != EPMOE_OK) {
            fprintf(stderr, "request: %s\n", err.message);
            exit(1);
        }
        epmoe_request_free(&rq);
        if (i >= 0)
            lat[i] = now_s() - t0;
    }
    *seq = summarize(lat, N, 1, 0);
    /* D in flight, completions through the descriptor and epmoe_poll */
    uint16_t *outs = malloc((size_t)D * (size_t)T * (size_t)H * 2);
    int sent = 0, done = 0;
    double t0 = now_s();
    for (; sent < D; sent++) {
        a.out = outs + (size_t)sent * (size_t)T * (size_t)H;
        a.user = a.out;
        epmoe_submit(c, &a, &rq, &err);
    }
    struct pollfd pf = {.fd = epmoe_fd(c), .events = POLLIN};
    epmoe_request *got[64];
    while (done < N) {
        poll(&pf, 1, 1000);
        int n = epmoe_poll(c, got, NULL, 64);
        for (int i = 0; i < n; i++) {
            a.out = epmoe_request_user(got[i]);
            a.user = a.out;
            epmoe_request_free(&got[i]);
            done++;
            if (sent < N) {
                epmoe_submit(c, &a, &rq, &err);
                sent++;
            }
        }
    }
    par->rps = N / (now_s() - t0);
    free(outs);
    epmoe_close(&c);
}

static void bench(const char *where)
{
    echo e = {0};
    e.zctx = zmq_ctx_new();
    char at[128];
    snprintf(at, sizeof at, "%s", where);
    if (strncmp(where, "ipc", 3) == 0)
        snprintf(at, sizeof at, "ipc:///tmp/epmoe-bench-client-%d", (int)getpid());
    e.coord = bind_router(e.zctx, "tcp://127.0.0.1:*", e.coord_ep, sizeof e.coord_ep);
    e.entry = bind_router(e.zctx, at, e.entry_ep, sizeof e.entry_ep);
    e.out = calloc((size_t)T * (size_t)H, 2);
    e.ids = calloc((size_t)T * (size_t)K, 4);
    e.w = calloc((size_t)T * (size_t)K, 4);
    pthread_t th;
    pthread_create(&th, NULL, echo_main, &e);
    uint16_t *hidden = calloc((size_t)T * (size_t)H, 2), *out = calloc((size_t)T * (size_t)H, 2);
    double *lat = calloc((size_t)N, sizeof *lat);
    result rs, rp, ls, lp;
    run_raw(&e, hidden, out, lat, &rs, &rp);
    run_lib(&e, hidden, out, lat, &ls, &lp);
    printf("%-4s T %d H %d k %d: one at a time p50 %.1f us (raw %.1f) = %.2fx, p99 %.1f us "
           "(raw %.1f) = %.2fx; %d in flight %.0f req/s (raw %.0f) = %.2fx\n",
           strncmp(where, "ipc", 3) == 0 ? "ipc" : "tcp", T, H, K, ls.p50 * 1e6, rs.p50 * 1e6,
           ls.p50 / rs.p50, ls.p99 * 1e6, rs.p99 * 1e6, ls.p99 / rs.p99, D, lp.rps, rp.rps,
           lp.rps / rp.rps);
    atomic_store(&e.stop, true);
    pthread_join(th, NULL);
    zmq_close(e.coord);
    zmq_close(e.entry);
    zmq_ctx_term(e.zctx);
    free(e.out);
    free(e.ids);
    free(e.w);
    free(hidden);
    free(out);
    free(lat);
}

int main(int argc, char **argv)
{
    int *v[] = {&T, &H, &K, &N, &D};
    for (int i = 1; i < argc && i <= 5; i++)
        *v[i - 1] = atoi(argv[i]);
    if (T < 1 || H < 1 || K < 1 || N < 10 || D < 1 || D > 64) {
        fprintf(stderr, "usage: bench_client [T] [H] [K] [N >= 10] [D 1..64]\n");
        return 2;
    }
    bench("tcp://127.0.0.1:*");
    bench("ipc");
    return 0;
}
