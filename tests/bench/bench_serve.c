/*
 * bench_serve — the serving path under load (docs/performance.md "Serving path"): K client
 * processes on libepmoe, each with D requests of T tokens in flight, calling the MoE layers in
 * turn as a forward pass would, against a running cluster; beside it, in this process, the
 * baseline: the same tokens through the same layers with mb_forward (what `forward --local`
 * runs) on the same number of threads in total. Reports tokens/s and p50/p99 latency per layer
 * call, each as a ratio to the baseline.
 *
 *   bench_serve --coordinator EP --model DIR [--layers A-B] [--clients K] [--inflight D]
 *               [--tokens T] [--calls N] [--threads N] [--batch-local T] [--rtt]
 *
 * --batch-local T: the baseline runs T tokens per call (e.g. 64 for 64 single-token requests
 * in flight: the experts batch them, so the fair baseline is one forward of all 64); default
 * K * D * T. --rtt: also a raw ZeroMQ DEALER/ROUTER round trip of the same sizes on tcp
 * loopback, beside the client -> entry -> client round trip (goal d).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <epmoe.h>

#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "kernels/formats.h"
#include "kernels/moe_backend.h"
#include "shard/shard.h"

typedef struct args {
    const char *coordinator, *model;
    int layer0, layer1, clients, inflight, tokens, calls, threads, batch_local;
    int rtt;
} args;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Hidden states as production feeds them: most channels ~N(0, 1), a few outlier channels. */
static void fill_hidden(uint16_t *x, int T, int H, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            double u = (double)(s >> 11) / 9007199254740992.0 * 2 - 1;
            double amp = i % 512 == 7 ? 40.0 : 1.2;
            x[(size_t)t * H + i] = fmt_f32_to_bf16((float)(u * amp));
        }
}

/* ---- the baseline: mb_forward in this process ---------------------------------------------- */

/* A local call's pairs per expert it reads (each distinct expert's weights once). */
static double pairs_per_read(const int32_t *ti, int n, int E)
{
    uint8_t *seen = calloc((size_t)E, 1);
    int reads = 0;
    for (int p = 0; seen && p < n; p++)
        if (ti[p] >= 0 && ti[p] < E && !seen[ti[p]]) {
            seen[ti[p]] = 1;
            reads++;
        }
    free(seen);
    return reads ? (double)n / reads : 0;
}

static double local_tokens_per_s(const args *a, const mc_config *c, double *call_s, double *ppr)
{
    ep_err err = {0};
    st_model *m = st_model_open(a->model, &err);
    mb_options bo = {.device = "cpu", .threads = a->threads};
    mb_backend *be = m ? mb_create(&bo, &err) : NULL;
    if (be == NULL) {
        fprintf(stderr, "bench_serve: %s\n", err.msg);
        exit(1);
    }
    int T = a->batch_local, H = c->hidden_size, k = c->num_experts_per_tok;
    uint16_t *x = malloc((size_t)T * H * 2), *out = malloc((size_t)T * H * 2);
    int64_t *ids = malloc((size_t)T * 8);
    int32_t *ti = malloc((size_t)T * k * 4);
    float *tw = malloc((size_t)T * k * 4);
    fill_hidden(x, T, H, 1);
    for (int t = 0; t < T; t++)
        ids[t] = t % c->vocab_size;
    double total = 0, calls[2 * 32];
    int n = 0, reps = T <= 16 ? 32 : 5; /* a small call is short and noisy: more of them */
    if (a->layer1 - a->layer0 + 1 > 2)
        reps = 5;
    for (int l = a->layer0; l <= a->layer1; l++) {
        mb_layer *ly = shard_load_layer(be, m, c, l, NULL, NULL, NULL, NULL, &err);
        if (ly == NULL) {
            fprintf(stderr, "bench_serve: layer %d: %s\n", l, err.msg);
            exit(1);
        }
        mb_forward(be, ly, T, x, ids, out, ti, tw, &err); /* warm */
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            mb_forward(be, ly, T, x, ids, out, ti, tw, &err);
            double dt = now_s() - t0;
            total += dt;
            if (n < 2 * 32)
                calls[n] = dt;
            n++;
        }
        *ppr += pairs_per_read(ti, T * k, c->n_routed_experts) / (a->layer1 - a->layer0 + 1);
        mb_layer_free(&ly);
    }
    int nc = n < 2 * 32 ? n : 2 * 32;
    qsort(calls, (size_t)nc, sizeof *calls, cmp_d);
    *call_s = calls[nc / 2]; /* the median, beside the cluster's p50 */
    free(x), free(out), free(ids), free(ti), free(tw);
    mb_destroy(&be);
    st_model_close(&m);
    return (double)T * n / total;
}

/* ---- a client process ---------------------------------------------------------------------- */

typedef struct client_out {
    double seconds, tokens;
    int n_lat, failed;
    double lat[8192];
    double phase[4][8192]; /* at the entry: queued, dispatch, experts (the wait), combine */
} client_out;

static void run_client(const args *a, int id, client_out *o)
{
    epmoe_options op = {.size = sizeof op,
                        .version = EPMOE_OPTIONS_VERSION,
                        .coordinator = a->coordinator,
                        .max_in_flight = (uint32_t)a->inflight,
                        .timeout_ms = 60000};
    epmoe_client *cl;
    epmoe_error e = {0};
    if (epmoe_open(&op, &cl, &e) != EPMOE_OK) {
        fprintf(stderr, "bench_serve: client %d: %s\n", id, e.message);
        exit(1);
    }
    epmoe_info info;
    epmoe_info_get(cl, &info, &e);
    int T = a->tokens, H = (int)info.hidden_size, k = (int)info.topk, D = a->inflight;
    uint16_t *x = malloc((size_t)D * T * H * 2), *out = malloc((size_t)D * T * H * 2);
    int64_t *ids = malloc((size_t)D * T * 8);
    fill_hidden(x, D * T, H, 100 + (uint64_t)id);
    for (int i = 0; i < D * T; i++)
        ids[i] = (i * 31 + id) % (int)info.vocab_size;
    epmoe_request **req = calloc((size_t)D, sizeof *req);
    double *t_sub = calloc((size_t)D, sizeof *t_sub);
    int sent = 0, done = 0, nl = a->layer1 - a->layer0 + 1;
    double t0 = now_s();
    while (done < a->calls) {
        for (int s = 0; s < D && sent < a->calls; s++) {
            if (req[s] != NULL)
                continue;
            epmoe_submit_args sa = {.size = sizeof(epmoe_submit_args),
                                    .version = EPMOE_SUBMIT_ARGS_VERSION,
                                    .hidden_size = (uint32_t)H,
                                    .layer = (uint32_t)(a->layer0 + sent % nl),
                                    .n_tokens = (uint32_t)T,
                                    .hidden = x + (size_t)s * T * H,
                                    .token_ids = ids + (size_t)s * T,
                                    .out = out + (size_t)s * T * H,
                                    .user = (void *)(intptr_t)s};
            if (epmoe_submit(cl, &sa, &req[s], &e) != EPMOE_OK)
                break;
            t_sub[s] = now_s();
            sent++;
        }
        epmoe_request *fin[64];
        int n = epmoe_poll(cl, fin, NULL, 64);
        if (n == 0) {
            struct timespec ts = {0, 20000};
            /* the completion descriptor is what an event loop waits on; a short nap is the
             * same for a benchmark that has nothing else to do */
            (void)k;
            nanosleep(&ts, NULL);
            continue;
        }
        for (int i = 0; i < n; i++) {
            int s = (int)(intptr_t)epmoe_request_user(fin[i]);
            epmoe_request_info ri;
            epmoe_request_status(fin[i], &ri);
            if (ri.status != EPMOE_OK)
                o->failed++;
            if (o->n_lat < 8192) {
                o->phase[0][o->n_lat] = ri.queued_s;
                o->phase[1][o->n_lat] = ri.dispatch_s;
                o->phase[2][o->n_lat] = ri.experts_s;
                o->phase[3][o->n_lat] = ri.combine_s;
                o->lat[o->n_lat++] = now_s() - t_sub[s];
            }
            epmoe_request_free(&fin[i]);
            req[s] = NULL;
            done++;
        }
    }
    o->seconds = now_s() - t0;
    o->tokens = (double)done * T;
    free(x), free(out), free(ids), free(req), free(t_sub);
    epmoe_close(&cl);
}

/* ---- raw ZeroMQ round trip (goal d's baseline) ---------------------------------------------- */

typedef struct echo {
    void *ctx;
    char ep[64];
    size_t reply;
    int n;
} echo;

static void *echo_main(void *arg)
{
    echo *e = arg;
    void *s = zmq_socket(e->ctx, ZMQ_ROUTER);
    zmq_bind(s, "tcp://127.0.0.1:*");
    size_t len = sizeof e->ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, e->ep, &len);
    char *buf = calloc(1, e->reply + 1);
    for (int i = 0; i < e->n + 1; i++) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        zmq_msg_recv(&id, s, 0);
        zmq_msg_recv(&body, s, 0);
        zmq_msg_send(&id, s, ZMQ_SNDMORE);
        zmq_send(s, buf, e->reply, 0);
        zmq_msg_close(&body);
    }
    free(buf);
    zmq_close(s);
    return NULL;
}

static double raw_rtt_p50(size_t req, size_t reply, int n)
{
    echo e = {.ctx = zmq_ctx_new(), .reply = reply, .n = n};
    pthread_t th;
    pthread_create(&th, NULL, echo_main, &e);
    while (e.ep[0] == '\0')
        usleep(1000);
    void *d = zmq_socket(e.ctx, ZMQ_DEALER);
    zmq_connect(d, e.ep);
    char *buf = calloc(1, (req > reply ? req : reply) + 1);
    double *lat = malloc((size_t)n * sizeof *lat);
    zmq_send(d, buf, req, 0); /* connect and warm */
    zmq_recv(d, buf, reply, 0);
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        zmq_send(d, buf, req, 0);
        zmq_recv(d, buf, reply, 0);
        lat[i] = now_s() - t0;
    }
    pthread_join(th, NULL);
    qsort(lat, (size_t)n, sizeof *lat, cmp_d);
    double p50 = lat[n / 2];
    free(lat), free(buf);
    zmq_close(d);
    zmq_ctx_term(e.ctx);
    return p50;
}

/* ---- main ---------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: bench_serve --coordinator EP --model DIR [--layers A-B] [--clients K]\n"
                    "       [--inflight D] [--tokens T] [--calls N] [--threads N]\n"
                    "       [--batch-local T] [--rtt]\n");
    exit(64);
}

static void parse(int argc, char **argv, args *a)
{
    *a = (args){.clients = 1, .inflight = 1, .tokens = 1, .calls = 64, .threads = 2};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--rtt") == 0) {
            a->rtt = 1;
            continue;
        }
        if (v == NULL)
            usage();
        if (strcmp(argv[i], "--coordinator") == 0)
            a->coordinator = v;
        else if (strcmp(argv[i], "--model") == 0)
            a->model = v;
        else if (strcmp(argv[i], "--layers") == 0)
            sscanf(v, "%d-%d", &a->layer0, &a->layer1);
        else if (strcmp(argv[i], "--clients") == 0)
            a->clients = atoi(v);
        else if (strcmp(argv[i], "--inflight") == 0)
            a->inflight = atoi(v);
        else if (strcmp(argv[i], "--tokens") == 0)
            a->tokens = atoi(v);
        else if (strcmp(argv[i], "--calls") == 0)
            a->calls = atoi(v);
        else if (strcmp(argv[i], "--threads") == 0)
            a->threads = atoi(v);
        else if (strcmp(argv[i], "--batch-local") == 0)
            a->batch_local = atoi(v);
        else
            usage();
        i++;
    }
    if (a->coordinator == NULL || a->model == NULL || a->clients < 1 || a->clients > 64 ||
        a->inflight < 1 || a->tokens < 1)
        usage();
    if (a->layer1 < a->layer0)
        a->layer1 = a->layer0;
    if (a->batch_local <= 0)
        a->batch_local = a->clients * a->inflight * a->tokens;
}

int main(int argc, char **argv)
{
    args a;
    parse(argc, argv, &a);
    char path[4096];
    mc_config c;
    ep_err err;
    snprintf(path, sizeof path, "%s/config.json", a.model);
    if (mc_load(path, &c, &err) < 0) {
        fprintf(stderr, "bench_serve: %s\n", err.msg);
        return 1;
    }
    client_out *outs = calloc((size_t)a.clients, sizeof *outs);
    int fds[64][2];
    pid_t pids[64];
    for (int i = 0; i < a.clients; i++) {
        if (pipe(fds[i]) != 0)
            return 1;
        if ((pids[i] = fork()) == 0) {
            client_out *o = calloc(1, sizeof *o);
            run_client(&a, i, o);
            ssize_t w = write(fds[i][1], o, sizeof *o);
            _exit(w == (ssize_t)sizeof *o ? 0 : 1);
        }
        close(fds[i][1]);
    }
    double tok = 0, secs = 0, *lat = malloc((size_t)a.clients * 8192 * sizeof *lat);
    double *ph[4];
    for (int p = 0; p < 4; p++)
        ph[p] = malloc((size_t)a.clients * 8192 * sizeof *ph[p]);
    int nl = 0, failed = 0;
    for (int i = 0; i < a.clients; i++) {
        size_t got = 0;
        while (got < sizeof outs[i]) {
            ssize_t r = read(fds[i][0], (char *)&outs[i] + got, sizeof outs[i] - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        int st;
        waitpid(pids[i], &st, 0);
        tok += outs[i].tokens;
        secs = outs[i].seconds > secs ? outs[i].seconds : secs;
        failed += outs[i].failed;
        for (int j = 0; j < outs[i].n_lat; j++) {
            for (int p = 0; p < 4; p++)
                ph[p][nl] = outs[i].phase[p][j];
            lat[nl++] = outs[i].lat[j];
        }
    }
    qsort(lat, (size_t)nl, sizeof *lat, cmp_d);
    double p50 = nl ? lat[nl / 2] : 0, p99 = nl ? lat[(nl * 99) / 100] : 0;
    double serve_tps = secs > 0 ? tok / secs : 0;
    /* the baseline after the clients, so the cluster had the cores to itself while measured */
    double local_call, local_ppr = 0;
    double local_tps = local_tokens_per_s(&a, &c, &local_call, &local_ppr);
    printf("clients %d x in flight %d x %d tokens, layers %d-%d, %d calls each, %d failed\n",
           a.clients, a.inflight, a.tokens, a.layer0, a.layer1, a.calls, failed);
    printf("serve   %10.1f tokens/s  p50 %8.3f ms  p99 %8.3f ms\n", serve_tps, p50 * 1e3,
           p99 * 1e3);
    printf("local   %10.1f tokens/s  (%d tokens a call, %.3f ms a call (median), %d threads; %.2f "
           "pairs "
           "per expert read)\n",
           local_tps, a.batch_local, local_call * 1e3, a.threads, local_ppr);
    double med[4] = {0};
    for (int p = 0; p < 4; p++) {
        if (nl > 0) {
            qsort(ph[p], (size_t)nl, sizeof *ph[p], cmp_d);
            med[p] = ph[p][nl / 2];
        }
        free(ph[p]);
    }
    printf("entry   p50 queued %.3f ms, dispatch %.3f ms, experts %.3f ms, combine %.3f ms\n",
           med[0] * 1e3, med[1] * 1e3, med[2] * 1e3, med[3] * 1e3);
    printf("ratio   throughput %.3f of local; p50 - local call = %+.3f ms\n",
           local_tps > 0 ? serve_tps / local_tps : 0, (p50 - local_call) * 1e3);
    if (a.rtt) {
        size_t H = (size_t)c.hidden_size, k = (size_t)c.num_experts_per_tok, T = (size_t)a.tokens;
        double raw = raw_rtt_p50(T * H * 2 + T * 8 + 64, T * H * 2 + 2 * T * k * 4 + 64, 2000);
        printf("rtt     raw ZeroMQ p50 %.3f ms; client -> entry -> client p50 %.3f ms: %.2fx\n",
               raw * 1e3, p50 * 1e3, raw > 0 ? p50 / raw : 0);
    }
    free(outs);
    free(lat);
    return failed ? 1 : 0;
}
