/*
 * bench_layer.c — one whole MoE layer at DeepSeek-V4-Flash shapes: tokens/s and where the time
 * goes.
 *
 *   bench_layer [--threads N] [--experts N] [--only fp4|fp8] [--runs R] [--tokens 1,8,64,256]
 *               [--model DIR] [--cpu-time 0|1]
 *
 * --model DIR measures layer 0 of that checkpoint with every expert loaded instead of the
 * generated 16-expert layer below; --cpu-time 1 (with --threads 1) times the phases in thread
 * CPU time, which the load of a shared machine does not inflate. Token inputs are hidden
 * states with per-channel scales and outlier channels, as real ones.
 *
 * Shapes: H 4096, I 2048, 256 experts logically, top-6, one shared expert. Only the first
 * --experts (default 16) routed experts are materialised (generated with the tests' generator,
 * tests/unit/moe_gen.c, written to a temporary checkpoint and loaded with shard_load_moe_layer
 * owning exactly those). Routing is steered onto them through the gate bias: the loaded experts get
 * bias ~8 (like Flash), the other 240 get -1e4, so selection — which still computes all 256
 * logits and scans all 256 scores — never picks an unloaded one. Consequence: each loaded expert
 * sees about T*6/16 rows where a full layer would give it T*6/256, so the expert GEMMs run with
 * larger M than a real layer at the same T (flattering at large T; decode, T <= 8, is alike).
 *
 * Per T the layer runs as moe_forward does (route, quantize, experts, shared, combine), each
 * phase timed. "experts" and "shared" are whole expert MLPs (row gather, w1, w3, SwiGLU +
 * requantization, w2, bf16 output); the SwiGLU share is measured by replaying the same
 * epilogues (same rows per expert) on their own, and "GEMMs" is experts + shared - SwiGLU
 * (so it also holds the row gather and output rounding, a few memcpy-sized passes). Columns
 * come from the fastest of --runs runs (the machine may be shared; the best run is the least
 * disturbed one), percentages of its layer time; SwiGLU is the fastest replay.
 *
 * A second table puts each row beside the machine's bounds, measured in the same run with the
 * same threads (tests/bench/bench_bounds.c; best of trials spread through the run, before
 * every T, wall clock even with --cpu-time): bound = max(memory, FMA), memory = the bytes the
 * layer must read (every expert hit, the shared expert, the gate; counted as vs_ggml.c does)
 * / the read bandwidth of a vector read-sum over 1 GiB, FMA = 2 * MACs / the FP32 FMA peak.
 * "÷ bound" is the layer's time over that bound (1.00 = at the machine's limit); "of read
 * bandwidth" is the bytes read per second of the layer over the read-sum's, the number that
 * says how close decode (T = 1) is to streaming its weights at memory speed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/safetensors_model.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/swiglu.h"
#include "bench_bounds.h"
#include "moe_gen.h"
#include "shard/shard.h"
#include "tests/isa_env.h"

#define MAX_RUNS 32
#define MAX_T    4096

/* --cpu-time: phases in the calling thread's CPU time (with --threads 1 every phase runs on
 * it), which other jobs on a shared machine do not inflate */
static int cpu_time;

static double now(void)
{
    struct timespec ts;
    clock_gettime(cpu_time ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The machine's bounds with the pool's thread count, best of trials spread through the run. */
static struct {
    float *buf;
    size_t n;
    int threads;
    double bw, fma;
} bounds;

static void bounds_trial(void)
{
    double bw = bench_read_bw(bounds.buf, bounds.n, bounds.threads);
    double f = bench_fma_peak(bounds.threads);
    bounds.bw = bw > bounds.bw ? bw : bounds.bw;
    bounds.fma = f > bounds.fma ? f : bounds.fma;
}

/* One row of the main table, kept for the table of bounds printed at the end. */
#define MAX_ROWS 64
static struct row {
    mc_expert_dtype dt;
    int T, distinct, H, I, k, E;
    double total; /* best layer time, seconds */
} rows[MAX_ROWS];
static int nrows;

typedef struct bench {
    mc_config c;
    gen_model *g;
    st_model *m;
    moe_layer *l;
    char dir[64];
    int made;
} bench;

static void bench_setup(bench *b, mc_expert_dtype dt, int made)
{
    memset(b, 0, sizeof *b);
    b->made = made;
    b->c = gen_config(dt, 4096, 2048, 256, 6, 129280);
    b->c.num_hidden_layers = 1;
    b->c.num_hash_layers = 0;
    b->c.num_nextn_predict_layers = 0;
    gen_opts o = {.seed = 3 + dt, .experts_made = made, .bias_unmade = -1e4f};
    double t0 = now();
    b->g = gen_model_create(&b->c, &o);
    ep_err err = {0};
    snprintf(b->dir, sizeof b->dir, "/tmp/epmoe_bench_XXXXXX");
    if (!mkdtemp(b->dir) || gen_model_write(b->g, b->dir, &err) < 0 ||
        !(b->m = st_model_open(b->dir, &err))) {
        fprintf(stderr, "bench_layer: writing the checkpoint: %s\n", err.msg);
        exit(1);
    }
    uint8_t owned[256] = {0};
    memset(owned, 1, (size_t)made);
    double t1 = now();
    b->l = shard_load_moe_layer(b->m, &b->c, 0, owned, ISA_AUTO, &err);
    if (!b->l) {
        fprintf(stderr, "bench_layer: %s\n", err.msg);
        exit(1);
    }
    double t2 = now();
    fprintf(stderr, "%s: generated in %.1f s, loaded %zu MiB in %.1f s\n", mc_dtype_name(dt),
            t1 - t0, moe_layer_bytes(b->l) >> 20, t2 - t1);
}

/* Evict the caches before a timed run: read FLUSH_MIB of other memory (more than any last-level
 * cache), so T = 1 reads its weights from DRAM, as a layer does between the others. */
#define FLUSH_MIB 512
static void flush_caches(void)
{
    static uint8_t *buf;
    size_t n = (size_t)FLUSH_MIB << 20;
    if (buf == NULL && (buf = malloc(n)) != NULL)
        memset(buf, 1, n);
    uint64_t acc = 0;
    for (size_t i = 0; buf && i < n; i += 64)
        acc += buf[i];
    __asm__ volatile("" : : "r"(acc)); /* the reads happen: acc is used */
}

/* --model DIR: layer 0 of an existing checkpoint with every expert loaded (a full layer; the
 * routing is the checkpoint's own). */
static void bench_open(bench *b, const char *dir)
{
    memset(b, 0, sizeof *b);
    ep_err err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (mc_load(path, &b->c, &err) < 0 || !(b->m = st_model_open(dir, &err)) ||
        !(b->l = shard_load_moe_layer(b->m, &b->c, 0, NULL, ISA_AUTO, &err))) {
        fprintf(stderr, "bench_layer: %s\n", err.msg);
        exit(1);
    }
    b->made = b->c.n_routed_experts;
}

static void bench_teardown(bench *b)
{
    moe_layer_free(&b->l);
    st_model_close(&b->m);
    if (!b->g)
        return;
    gen_model_free(&b->g);
    gen_model_remove(b->dir);
}

typedef struct bufs {
    uint16_t *x, *xn, *eo, *sh, *out;
    int32_t *ids;
    float *w, *qs, *pw, *acc;
    uint8_t *q;
    uint32_t *prow, *pexp;
} bufs;

enum { PH_ROUTE, PH_QUANT, PH_EXPERTS, PH_SHARED, PH_COMBINE, PH_N };
static const char *const PH_NAME[PH_N] = {"route", "quant", "experts", "shared", "combine"};

/* One forward of T tokens, phase times in t[]. */
static void run_layer(const bench *b, int T, bufs *u, tpool *pool, double t[PH_N])
{
    ep_err err = {0};
    int k = b->c.num_experts_per_tok, H = b->c.hidden_size;
    double a = now();
    if (moe_route(b->l, T, u->x, NULL, u->xn, u->ids, u->w, pool, &err) < 0) {
        fprintf(stderr, "bench_layer: %s\n", err.msg);
        exit(1);
    }
    double r = now();
    moe_quant(b->l, T, u->xn, u->q, u->qs);
    double q = now();
    for (int i = 0; i < T * k; i++) {
        u->prow[i] = (uint32_t)(i / k);
        u->pexp[i] = (uint32_t)u->ids[i];
        u->pw[i] = u->w[i];
    }
    if (moe_experts(b->l, T, u->q, u->qs, T * k, u->prow, u->pexp, u->pw, u->eo, pool, &err) < 0) {
        fprintf(stderr, "bench_layer: %s\n", err.msg);
        exit(1);
    }
    double e = now();
    if (moe_shared(b->l, T, u->q, u->qs, u->sh, pool, &err) < 0) {
        fprintf(stderr, "bench_layer: %s\n", err.msg);
        exit(1);
    }
    double s = now();
    moe_combine(T, k, H, u->ids, u->eo, u->sh, u->out);
    double c = now();
    t[PH_ROUTE] = r - a;
    t[PH_QUANT] = q - r;
    t[PH_EXPERTS] = e - q;
    t[PH_SHARED] = s - e;
    t[PH_COMBINE] = c - s;
}

/* The SwiGLU epilogues of that forward alone: the same row counts per expert (in moe.c's
 * chunks of 256 rows) and for the shared expert, on GEMM-like fp32 inputs. */
static double run_swiglu(const bench *b, int T, bufs *u)
{
    int k = b->c.num_experts_per_tok, I = b->c.moe_intermediate_size;
    int count[257] = {0};
    for (int i = 0; i < T * k; i++)
        count[u->ids[i]]++;
    count[256] = T; /* the shared expert */
    double a = now();
    for (int e = 0; e < 257; e++)
        for (int m0 = 0; m0 < count[e]; m0 += 256) {
            int M = count[e] - m0 < 256 ? count[e] - m0 : 256;
            swiglu_rows(u->acc, u->acc + (size_t)256 * I, M, I, e == 256 ? NULL : u->pw,
                        b->c.swiglu_limit, b->c.act_ue8m0, u->q, u->qs);
        }
    return now() - a;
}

static void bench_dtype(mc_expert_dtype dt, int made, const char *model, const int *Ts, int nT,
                        int runs, tpool *pool)
{
    bench b;
    if (model) {
        bench_open(&b, model);
        dt = b.c.expert_dtype;
    } else {
        bench_setup(&b, dt, made);
    }
    int H = 4096, k = 6, maxT = 0;
    for (int i = 0; i < nT; i++)
        maxT = Ts[i] > maxT ? Ts[i] : maxT;
    size_t TT = (size_t)maxT;
    bufs u = {
        .x = malloc(TT * H * 2),
        .xn = malloc(TT * H * 2),
        .eo = malloc(TT * k * H * 2),
        .sh = malloc(TT * H * 2),
        .out = malloc(TT * H * 2),
        .ids = malloc(TT * k * 4),
        .w = malloc(TT * k * 4),
        .qs = malloc(TT * 32 * 4),
        .pw = malloc(TT * k * 4),
        .acc = malloc((size_t)2 * 256 * 2048 * 4),
        .q = malloc(TT * H),
        .prow = malloc(TT * k * 4),
        .pexp = malloc(TT * k * 4),
    };
    /* hidden states as real ones look: per-channel scales spread log-normally (a product of
     * uniforms stands in for exp(gauss)), four channels 30-100x the rest */
    uint64_t rs = 42;
    float *scale = malloc((size_t)H * sizeof(float));
    for (int c = 0; c < H; c++)
        scale[c] = (float)exp(0.6 * 1.7 * (gen_unit(&rs) + gen_unit(&rs) + gen_unit(&rs)));
    for (int i = 0; i < 4; i++)
        scale[(int)((gen_unit(&rs) * 0.5 + 0.5) * H) % H] *= (float)(65.0 + 35.0 * gen_unit(&rs));
    for (size_t i = 0; i < TT * H; i++)
        u.x[i] = fmt_f32_to_bf16((float)(0.2 * gen_unit(&rs) * scale[i % H]));
    free(scale);
    for (size_t i = 0; i < (size_t)2 * 256 * 2048; i++) /* w1/w3-output-like values */
        u.acc[i] = (float)(4.0 * gen_unit(&rs));

    for (int i = 0; i < nT; i++) {
        int T = Ts[i];
        double ph[PH_N][MAX_RUNS] = {{0}}, tot[MAX_RUNS] = {0}, gm[MAX_RUNS] = {0}, t[PH_N];
        run_layer(&b, T, &u, pool, t); /* warm-up */
        int distinct = 0, count[256] = {0};
        for (int j = 0; j < T * k; j++)
            distinct += count[u.ids[j]]++ == 0;
        for (int r = 0; r < runs; r++) {
            flush_caches();
            run_layer(&b, T, &u, pool, t);
            tot[r] = 0;
            for (int p = 0; p < PH_N; p++) {
                ph[p][r] = t[p];
                tot[r] += t[p];
            }
            gm[r] = run_swiglu(&b, T, &u);
        }
        int best = 0;
        double swi = gm[0];
        bounds_trial();
        for (int r = 1; r < runs; r++) {
            best = tot[r] < tot[best] ? r : best;
            swi = gm[r] < swi ? gm[r] : swi;
        }
        double total = tot[best];
        printf("| %s | %4d | %2d | %9.1f | %9.2f |", mc_dtype_name(dt), T, distinct, T / total,
               total * 1e3);
        for (int p = 0; p < PH_N; p++)
            printf(" %5.1f |", 100.0 * ph[p][best] / total);
        double mlp = ph[PH_EXPERTS][best] + ph[PH_SHARED][best];
        printf(" %5.1f | %5.1f |\n", 100.0 * swi / total, 100.0 * (mlp - swi) / total);
        fflush(stdout);
        if (nrows < MAX_ROWS)
            rows[nrows++] = (struct row){
                dt, T, distinct, H, b.c.moe_intermediate_size, k, b.c.n_routed_experts, total};
    }
    free(u.x);
    free(u.xn);
    free(u.eo);
    free(u.sh);
    free(u.out);
    free(u.ids);
    free(u.w);
    free(u.qs);
    free(u.pw);
    free(u.acc);
    free(u.q);
    free(u.prow);
    free(u.pexp);
    bench_teardown(&b);
}

/* The rows beside the bounds (see the top of the file). */
static void print_bounds(void)
{
    printf("\nbounds, same run, %d threads: read bandwidth %.1f GB/s, FP32 FMA peak %.0f GFLOP/s "
           "(%s), best trials (wall clock)\n\n",
           bounds.threads, bounds.bw / 1e9, bounds.fma / 1e9, bench_wide() ? "zmm" : "ymm");
    printf("| dtype | T | experts hit | bytes read | memory bound | FMA bound | ms/layer | ÷ bound "
           "| of read bandwidth |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        double hi = (double)r->H * r->I;
        double expert = r->dt == MC_FP8 ? 3.0 * (hi + hi / 16384 * 4) : 3.0 * (hi / 2 + hi / 32);
        double bytes = r->distinct * expert + 3.0 * (hi + hi / 16384) + (double)r->E * r->H * 2;
        double macs = (double)r->T * (r->k + 1) * 3.0 * hi;
        double tm = bytes / bounds.bw, tf = 2 * macs / bounds.fma, tb = tm > tf ? tm : tf;
        printf("| %s | %d | %d | %.0f MB | %.2f ms | %.2f ms | %.2f | %.2f | %.2f |\n",
               mc_dtype_name(r->dt), r->T, r->distinct, bytes / 1e6, tm * 1e3, tf * 1e3,
               r->total * 1e3, r->total / tb, tm / r->total);
    }
}

int main(int argc, char **argv)
{
    test_isa_cap_from_env();
    int threads = 0, made = 16, runs = 5, only = -1;
    const char *model = NULL;
    int Ts[16] = {1, 8, 64, 256}, nT = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_layer: %s needs a value\n", a);
            return 64;
        }
        i++;
        if (strcmp(a, "--threads") == 0) {
            threads = atoi(v);
        } else if (strcmp(a, "--cpu-time") == 0) {
            cpu_time = atoi(v) != 0;
        } else if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--experts") == 0) {
            made = atoi(v);
        } else if (strcmp(a, "--runs") == 0) {
            runs = atoi(v);
        } else if (strcmp(a, "--only") == 0) {
            only = strcmp(v, "fp8") == 0 ? MC_FP8 : MC_FP4;
        } else if (strcmp(a, "--tokens") == 0) {
            nT = 0;
            for (char *s = (char *)v; *s && nT < 16;) {
                Ts[nT++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
            }
        } else {
            fprintf(stderr, "usage: bench_layer [--threads N] [--experts N] [--only fp4|fp8] "
                            "[--runs R] [--tokens 1,8,64,256] [--model DIR] [--cpu-time 0|1]\n");
            return 64;
        }
    }
    if (made < 6 || made > 64 || runs < 1 || runs > MAX_RUNS) {
        fprintf(stderr, "bench_layer: --experts 6..64, --runs 1..%d\n", MAX_RUNS);
        return 64;
    }
    for (int i = 0; i < nT; i++)
        if (Ts[i] < 1 || Ts[i] > MAX_T) {
            fprintf(stderr, "bench_layer: tokens 1..%d\n", MAX_T);
            return 64;
        }
    ep_err err = {0};
    tpool *pool = tpool_create(threads, &err);
    if (!pool) {
        fprintf(stderr, "bench_layer: %s\n", err.msg);
        return 1;
    }
    bounds.threads = tpool_size(pool);
    bounds.n = (size_t)1 << 28; /* 1 GiB of floats: far beyond any cache */
    bounds.buf = aligned_alloc(64, bounds.n * sizeof(float));
    if (!bounds.buf) {
        fprintf(stderr, "bench_layer: no memory for the 1 GiB bandwidth buffer\n");
        return 1;
    }
    for (size_t i = 0; i < bounds.n; i++)
        bounds.buf[i] = (float)(i & 1023);
    for (int r = 0; r < 3; r++)
        bounds_trial();
    char loaded[64];
    mc_config mc;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", model ? model : "");
    if (model && mc_load(cfg, &mc, &err) == 0)
        snprintf(loaded, sizeof loaded, "all %d loaded", mc.n_routed_experts);
    else
        snprintf(loaded, sizeof loaded, "%d loaded", made);
    printf("bench_layer: H 4096, I 2048, 256 experts (%s), top-6, %d threads, %s, best of %d "
           "runs, each after reading %d MiB of other memory (the weights come from DRAM, as in a "
           "forward pass after the other layers, not from a cache warm from the last run)\n\n",
           loaded, tpool_size(pool), isa_name(isa_best()), runs, FLUSH_MIB);
    printf("| dtype | T | experts hit | tokens/s | ms/layer |");
    for (int p = 0; p < PH_N; p++)
        printf(" %s %% |", PH_NAME[p]);
    printf(" SwiGLU %% | GEMMs %% |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (model)
        bench_dtype(MC_FP4, made, model, Ts, nT, runs, pool);
    for (int d = MC_FP4; d <= MC_FP8 && !model; d++)
        if (only < 0 || only == d)
            bench_dtype((mc_expert_dtype)d, made, NULL, Ts, nT, runs, pool);
    print_bounds();
    free(bounds.buf);
    tpool_destroy(&pool);
    return 0;
}
