/*
 * bench_a2a.c — the CPU data plane (worker/transport_zmq.c) against raw ZeroMQ, same run.
 *
 *   bench_a2a [--iters N] [--runs R] [--io-threads N] [--tokens T[,T...]]
 *
 * P = 4 ranks, one thread and one tpz_transport each, on tcp loopback. DeepSeek-V4-Flash shapes:
 * H = 4096, 256 experts contiguous over the 4 ranks (64 each), top-6 distinct experts per token
 * chosen at random. Per iteration each rank sends every peer one DISPATCH (fp8 codes + e8m0
 * scales of the distinct tokens that selected one of the peer's experts, and the pairs), each
 * rank answers every DISPATCH with a bf16 COMBINE of n_pairs rows (echo: no expert compute), and
 * waits for its own COMBINEs. Gathering the rows and filling the reply are part of the time.
 *
 * Baseline: the same threads move the same byte volumes with raw ZeroMQ PUSH/PULL (one frame per
 * message, zmq_send copying from a ready buffer, the same dispatch-then-combine pattern), in
 * the same context, iterations interleaved with the transport's. Ratio = raw time / transport
 * time (goal >= 0.7). bytes/s counts payload bytes sent by all ranks.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/knobs.h"
#include "common/log.h"
#include "worker/transport_zmq.h"

#define P    4
#define H    4096
#define E    256
#define K    6
#define SC   (H / 128)
#define MAXR 16

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct rank_s {
    int rank, T;
    tpz_transport *tp;
    void *pull, *push[P]; /* raw baseline */
    uint8_t *codes;       /* [T, H] */
    uint8_t *scales;      /* [T, SC] e8m0 */
    int32_t *topk;        /* [T, K] */
    size_t bytes;         /* payload bytes sent, transport mode, last iteration */
    uint8_t *rawbuf;      /* source of the raw sends */
    char fail[256];
} rank_s;

static rank_s ranks[P];
static pthread_barrier_t bar;
static int iters = 10;
static double t_tp[MAXR], t_raw[MAXR];

static int owner(int e)
{
    return e / (E / P);
}

/* Rows and pairs rank r sends dst. */
static void count_for(const rank_s *r, int dst, int *rows, int *pairs)
{
    *rows = *pairs = 0;
    for (int t = 0; t < r->T; t++) {
        int hit = 0;
        for (int j = 0; j < K; j++)
            if (owner(r->topk[t * K + j]) == dst)
                hit = 1, (*pairs)++;
        *rows += hit;
    }
}

static int tp_iteration(rank_s *r, uint64_t step)
{
    ep_err err;
    r->bytes = 0;
    for (int dst = 0; dst < P; dst++) {
        if (dst == r->rank)
            continue;
        tp_msg m = {
            .kind = TP_DISPATCH, .step_id = step, .format = TP_FMT_FP8, .scales_e8m0 = true};
        count_for(r, dst, &m.n_rows, &m.n_pairs);
        if (tpz_msg_alloc(&m, H, &err) != 0)
            return snprintf(r->fail, sizeof r->fail, "%s", err.msg), -1;
        int row = 0, p = 0;
        for (int t = 0; t < r->T; t++) {
            int hit = 0;
            for (int j = 0; j < K; j++) {
                int e = r->topk[t * K + j];
                if (owner(e) != dst)
                    continue;
                hit = 1;
                m.pair_row[p] = (uint32_t)row;
                m.pair_expert[p] = (uint32_t)e;
                m.pair_weight[p++] = 0.25f;
            }
            if (hit) {
                memcpy(m.codes + (size_t)row * H, r->codes + (size_t)t * H, H);
                memcpy((uint8_t *)m.scales + (size_t)row * SC, r->scales + (size_t)t * SC, SC);
                row++;
            }
        }
        r->bytes += tp_msg_bytes(&m, H);
        if (tpz_send(r->tp, dst, &m, &err) != 0)
            return snprintf(r->fail, sizeof r->fail, "%s", err.msg), -1;
    }
    int got_d = 0, got_c = 0;
    while (got_d < P - 1 || got_c < P - 1) {
        tp_msg m;
        if (!tpz_take(r->tp, step, &m)) {
            zmq_pollitem_t it = {.socket = tpz_socket(r->tp), .events = ZMQ_POLLIN};
            if (zmq_poll(&it, 1, 5000) <= 0)
                return snprintf(r->fail, sizeof r->fail, "timeout"), -1;
            tpz_pump(r->tp);
            continue;
        }
        if (m.kind == TP_DISPATCH) {
            got_d++;
            tp_msg c = {.kind = TP_COMBINE, .step_id = step, .n_pairs = m.n_pairs};
            if (tpz_msg_alloc(&c, H, &err) != 0)
                return snprintf(r->fail, sizeof r->fail, "%s", err.msg), -1;
            for (int p = 0; p < m.n_pairs; p++) { /* echo: the row's codes, twice */
                uint8_t *o = (uint8_t *)c.out + (size_t)p * H * 2;
                const uint8_t *src = m.codes + (size_t)m.pair_row[p] * H;
                memcpy(o, src, H);
                memcpy(o + H, src, H);
            }
            r->bytes += tp_msg_bytes(&c, H);
            int src = m.src_rank;
            tpz_msg_release(&m);
            if (tpz_send(r->tp, src, &c, &err) != 0)
                return snprintf(r->fail, sizeof r->fail, "%s", err.msg), -1;
        } else {
            got_c++;
            tpz_msg_release(&m);
        }
    }
    tpz_finish(r->tp, step);
    return 0;
}

/* Raw ZeroMQ: same sizes, one frame each; the first byte says dispatch (0) or combine (1). */
static int raw_recv(rank_s *r, zmq_msg_t *msg)
{
    zmq_msg_init(msg);
    zmq_pollitem_t it = {.socket = r->pull, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 5000) <= 0 || zmq_msg_recv(msg, r->pull, 0) < 0) {
        zmq_msg_close(msg);
        return snprintf(r->fail, sizeof r->fail, "raw: timeout"), -1;
    }
    return 0;
}

static int raw_iteration(rank_s *r)
{
    size_t hdr = 16; /* rank + kind + pairs, like a body */
    for (int dst = 0; dst < P; dst++) {
        if (dst == r->rank)
            continue;
        int rows, pairs;
        count_for(r, dst, &rows, &pairs);
        size_t n = hdr + (size_t)rows * (H + SC) + (size_t)pairs * 12;
        uint8_t *b = r->rawbuf;
        b[0] = 0;
        b[1] = (uint8_t)r->rank;
        memcpy(b + 4, &pairs, 4);
        if (zmq_send(r->push[dst], b, n, 0) < 0)
            return snprintf(r->fail, sizeof r->fail, "raw send"), -1;
    }
    int got_d = 0, got_c = 0;
    while (got_d < P - 1 || got_c < P - 1) {
        zmq_msg_t msg;
        if (raw_recv(r, &msg) != 0)
            return -1;
        const uint8_t *b = zmq_msg_data(&msg);
        if (b[0] == 0) {
            got_d++;
            int pairs, src = b[1];
            memcpy(&pairs, b + 4, 4);
            zmq_msg_close(&msg);
            uint8_t *o = r->rawbuf;
            o[0] = 1;
            if (zmq_send(r->push[src], o, hdr + (size_t)pairs * H * 2, 0) < 0)
                return snprintf(r->fail, sizeof r->fail, "raw send"), -1;
        } else {
            got_c++;
            zmq_msg_close(&msg);
        }
    }
    return 0;
}

static void *rank_main(void *arg)
{
    rank_s *r = arg;
    for (int i = 0; i < iters; i++) {
        pthread_barrier_wait(&bar);
        double t0 = now();
        if (r->fail[0] == '\0')
            tp_iteration(r, (uint64_t)i + 1);
        pthread_barrier_wait(&bar);
        double t1 = now();
        if (r->rank == 0)
            t_tp[i % MAXR] = t1 - t0;
        if (r->fail[0] == '\0')
            raw_iteration(r);
        pthread_barrier_wait(&bar);
        if (r->rank == 0)
            t_raw[i % MAXR] = now() - t1;
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int setup(void *zctx, int T)
{
    static uint32_t owners[E];
    for (int e = 0; e < E; e++)
        owners[e] = (uint32_t)owner(e);
    const char *eps[P];
    char raw_eps[P][256];
    uint64_t s = 12345;
    for (int r = 0; r < P; r++) {
        rank_s *x = &ranks[r];
        memset(x, 0, sizeof *x);
        x->rank = r;
        x->T = T;
        tpz_config cfg = {.rank = r,
                          .world_size = P,
                          .epoch = 1,
                          .hidden = H,
                          .n_experts = E,
                          .expert_owner = owners,
                          .bind_endpoint = "tcp://127.0.0.1:*"};
        ep_err err;
        if ((x->tp = tpz_create(zctx, &cfg, &err)) == NULL)
            return fprintf(stderr, "%s\n", err.msg), -1;
        eps[r] = tpz_endpoint(x->tp);
        x->pull = zmq_socket(zctx, ZMQ_PULL);
        zmq_bind(x->pull, "tcp://127.0.0.1:*");
        size_t sz = sizeof raw_eps[r];
        zmq_getsockopt(x->pull, ZMQ_LAST_ENDPOINT, raw_eps[r], &sz);
        x->codes = malloc((size_t)T * H);
        x->scales = malloc((size_t)T * SC);
        x->topk = malloc((size_t)T * K * sizeof *x->topk);
        x->rawbuf = calloc(1, (size_t)T * K * H * 2 + 64 + (size_t)T * (H + SC + 12 * K));
        for (size_t i = 0; i < (size_t)T * H; i++)
            x->codes[i] = (uint8_t)rng_next(&s);
        for (size_t i = 0; i < (size_t)T * SC; i++)
            x->scales[i] = (uint8_t)(120 + rng_next(&s) % 8);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) {
                int e, dup;
                do {
                    e = (int)(rng_next(&s) % E);
                    dup = 0;
                    for (int q = 0; q < j; q++)
                        dup |= x->topk[t * K + q] == e;
                } while (dup);
                x->topk[t * K + j] = e;
            }
    }
    for (int r = 0; r < P; r++) {
        ep_err err;
        if (tpz_connect(ranks[r].tp, eps, &err) != 0)
            return fprintf(stderr, "%s\n", err.msg), -1;
        for (int d = 0; d < P; d++) {
            if (d == r)
                continue;
            int linger = 0;
            ranks[r].push[d] = zmq_socket(zctx, ZMQ_PUSH);
            zmq_setsockopt(ranks[r].push[d], ZMQ_LINGER, &linger, sizeof linger);
            zmq_connect(ranks[r].push[d], raw_eps[d]);
        }
    }
    return 0;
}

static void teardown(void)
{
    for (int r = 0; r < P; r++) {
        rank_s *x = &ranks[r];
        tpz_destroy(&x->tp);
        zmq_close(x->pull);
        for (int d = 0; d < P; d++)
            if (x->push[d])
                zmq_close(x->push[d]);
        free(x->codes);
        free(x->scales);
        free(x->topk);
        free(x->rawbuf);
    }
}

static int run_T(void *zctx, int T, int runs)
{
    if (setup(zctx, T) != 0)
        return -1;
    iters = runs + 2; /* two warm-up iterations */
    pthread_t th[P];
    pthread_barrier_init(&bar, NULL, P);
    for (int r = 0; r < P; r++)
        pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    for (int r = 0; r < P; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    int rc = 0;
    for (int r = 0; r < P; r++)
        if (ranks[r].fail[0]) {
            fprintf(stderr, "rank %d: %s\n", r, ranks[r].fail);
            rc = -1;
        }
    size_t bytes = 0;
    for (int r = 0; r < P; r++)
        bytes += ranks[r].bytes;
    int n = iters - 2 < MAXR ? iters - 2 : MAXR;
    double a[MAXR], b[MAXR];
    memcpy(a, t_tp + 2, (size_t)n * sizeof *a);
    memcpy(b, t_raw + 2, (size_t)n * sizeof *b);
    double mt = median(a, n), mr = median(b, n);
    printf("| %5d | %9.2f | %8.3f | %8.3f | %7.2f | %7.2f | %5.2f |\n", T, bytes / 1e6, mt * 1e3,
           mr * 1e3, bytes / mt / 1e9, bytes / mr / 1e9, mr / mt);
    fflush(stdout);
    teardown();
    return rc;
}

int main(int argc, char **argv)
{
    int runs = 10, io_threads = 1;
    int tokens[8] = {64, 256, 1024}, n_tokens = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--io-threads") == 0)
            io_threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--tokens") == 0) {
            n_tokens = 0;
            for (char *t = strtok(argv[i + 1], ","); t && n_tokens < 8; t = strtok(NULL, ","))
                tokens[n_tokens++] = atoi(t);
        } else {
            fprintf(stderr, "usage: bench_a2a [--runs R] [--io-threads N] [--tokens T,T,...]\n");
            return 64;
        }
    }
    if (runs < 1 || runs > MAXR)
        runs = runs < 1 ? 1 : MAXR;
    knob_values kv;
    ep_err kerr;
    if (knob_load(&kv, KNOB_WORKER, &kerr) < 0) { /* EPMOE_DEBUG=data, as for a worker */
        fprintf(stderr, "bench_a2a: %s\n", kerr.msg);
        return 64;
    }
    log_init("bench_a2a", kv.debug, false);
    void *zctx = zmq_ctx_new();
    zmq_ctx_set(zctx, ZMQ_IO_THREADS, io_threads);
    printf("P=%d ranks, H=%d, E=%d, top-%d, fp8 dispatch + e8m0 scales, bf16 combine, tcp "
           "loopback, %d ZeroMQ I/O thread(s), median of %d iterations\n\n",
           P, H, E, K, io_threads, runs);
    printf("| T/rank | MB/iter | tp ms | raw ms | tp GB/s | raw GB/s | ratio |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    for (int i = 0; i < n_tokens; i++)
        if (run_T(zctx, tokens[i], runs) != 0)
            rc = 1;
    zmq_ctx_term(zctx);
    return rc;
}
