/*
 * vs_ggml.c — one DeepSeek V4 MoE layer: epmoe's exact whole layer beside ggml's MoE matmuls of
 * the same shapes and beside the machine's memory and FMA bounds, all measured in one run on
 * one machine. Built only by tests/bench/vs_ggml.sh (ggml is not part of epmoe: the script
 * builds it from a source folder the caller gives and links this file against it).
 *
 *   bench_vs_ggml --model DIR [--layer L] [--threads N] [--tokens 1,8,64,256] [--runs R]
 *
 * Per token count T:
 *   epmoe   mb_forward on the CPU backend (route, quantize, routed experts, shared expert,
 *           combine; exact) with every expert of layer L of the checkpoint in DIR loaded, on
 *           hidden states with the outlier channels of real ones (a few channels 30-100x the
 *           rest, per-channel scales spread log-normally); the w2 inputs are then the SwiGLU
 *           outputs of real w1/w3 rows. Best of R runs.
 *   ggml    the layer's matmuls in ggml (what llama.cpp runs for this layer): mul_mat_id of
 *           w1 and w3 (MXFP4, all experts) on x, mul_mat_id of w2 on a [I, k, T] input, with
 *           the expert ids epmoe's router chose for these tokens, and the shared expert's three
 *           matrices as dense Q8_0 mul_mat; activations quantized to q8_0 inside ggml (inexact).
 *           SwiGLU, routing and combine are not counted on ggml's side. Best of R runs.
 *   bound   max(memory, FMA): memory = the bytes the layer must read (every expert hit, the
 *           shared expert, the gate) / the read bandwidth of an AVX-512 (or AVX2) read-sum
 *           over 1 GiB with the same threads; FMA = 2 * MACs / the FP32 FMA peak of the widest
 *           FMA the CPU has with the same threads.
 * The machine may be shared: every result and bound keeps its best trial, and the trials are
 * spread over the run (each round runs every T once, after a trial of the bounds).
 * Before every timed run the caches are flushed (a 128 MiB read): in a model the other layers'
 * weights pass through them between two steps of a layer.
 * The load of the layer (checkpoint in the page cache -> packed weights) is timed as well.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_bounds.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels/formats.h"
#include "kernels/moe_backend.h"
#include "shard/shard.h"
#include "tests/isa_env.h"

#define MAX_T    16
#define MAX_RUNS 32

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double unit(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static double gauss(void)
{
    double u = unit() + 1e-12, v = unit();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- inputs ---- */

/* Hidden states [T, H] (before ffn_norm) with the structure of real ones: per-channel scales
 * spread log-normally and a few massive channels. */
static void hidden_states(int T, int H, uint16_t *x)
{
    double *scale = malloc((size_t)H * sizeof(double));
    for (int c = 0; c < H; c++)
        scale[c] = exp(0.6 * gauss());
    for (int i = 0; i < 4; i++) /* outlier channels */
        scale[(int)(unit() * H) % H] *= 30.0 + 70.0 * unit();
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++)
            x[(size_t)t * H + c] = fmt_f32_to_bf16((float)(0.1 * gauss() * scale[c]));
    free(scale);
}

/* Evict the caches before a timed run: in a model, the other layers' weights pass through the
 * caches between two steps of this one, so nothing of it may be served from L3 here. */
static float *flush_buf;
#define FLUSH_FLOATS ((size_t)32 << 20) /* 128 MiB, several times any L3 we know */

static void flush_caches(void)
{
    float s = 0;
    for (size_t i = 0; i < FLUSH_FLOATS; i += 16)
        s += flush_buf[i];
    flush_buf[0] = s * 0.0f;
}

/* The bounds: best read bandwidth and FMA peak over trials spread through the whole run (the
 * machine is shared: the best trial is the least disturbed one, as for the results). */
typedef struct bounds {
    float *buf;
    size_t n;
    int threads;
    double bw, fma;
} bounds;

static void bounds_trial(bounds *b)
{
    double bw = bench_read_bw(b->buf, b->n, b->threads), f = bench_fma_peak(b->threads);
    b->bw = bw > b->bw ? bw : b->bw;
    b->fma = f > b->fma ? f : b->fma;
}

/* ---- epmoe ---- */

typedef struct layer_run {
    int T;
    double best_s;
    int distinct;
    int32_t *ids; /* [T, k] */
} layer_run;

static int run_epmoe(const char *dir, int layer, int threads, int runs, layer_run *lr, int nT,
                     mc_config *c, double *load_s, uint64_t *load_bytes, bounds *bd)
{
    ep_err err = {{0}};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (mc_load(path, c, &err) < 0) {
        fprintf(stderr, "bench_vs_ggml: %s\n", err.msg);
        return -1;
    }
    mb_options o = {.device = "cpu", .threads = threads};
    mb_backend *be = mb_create(&o, &err);
    st_model *m = be ? st_model_open(dir, &err) : NULL;
    if (!m) {
        fprintf(stderr, "bench_vs_ggml: %s\n", err.msg);
        return -1;
    }
    *load_bytes = shard_layer_bytes(m, c, layer, NULL, NULL, false);
    double t0 = bench_now();
    mb_layer *l = shard_load_layer(be, m, c, layer, NULL, NULL, NULL, NULL, &err);
    *load_s = bench_now() - t0;
    if (!l) {
        fprintf(stderr, "bench_vs_ggml: %s\n", err.msg);
        return -1;
    }
    int H = c->hidden_size, k = c->num_experts_per_tok, E = c->n_routed_experts, maxT = 0;
    for (int i = 0; i < nT; i++)
        maxT = lr[i].T > maxT ? lr[i].T : maxT;
    uint16_t *x[MAX_T], *out = malloc((size_t)maxT * H * 2);
    int64_t *tok = calloc((size_t)maxT, sizeof *tok);
    float *w = malloc((size_t)maxT * k * sizeof(float));
    for (int i = 0; i < nT; i++) {
        x[i] = malloc((size_t)lr[i].T * H * 2);
        hidden_states(lr[i].T, H, x[i]);
        lr[i].ids = malloc((size_t)lr[i].T * k * sizeof(int32_t));
        lr[i].best_s = 1e30;
    }
    /* round 0 warms up; every round runs each T once (after a bounds trial), so each result's
     * trials are spread over the whole phase */
    for (int r = 0; r <= runs; r++) {
        bounds_trial(bd);
        for (int i = 0; i < nT; i++) {
            flush_caches();
            double a = bench_now();
            if (mb_forward(be, l, lr[i].T, x[i], tok, out, lr[i].ids, w, &err) < 0) {
                fprintf(stderr, "bench_vs_ggml: %s\n", err.msg);
                return -1;
            }
            double dt = bench_now() - a;
            if (r > 0 && dt < lr[i].best_s)
                lr[i].best_s = dt;
        }
    }
    for (int i = 0; i < nT; i++) {
        char *hit = calloc((size_t)E, 1);
        lr[i].distinct = 0;
        for (int j = 0; j < lr[i].T * k; j++)
            lr[i].distinct += hit[lr[i].ids[j]]++ == 0;
        free(hit);
        free(x[i]);
        fprintf(stderr, "epmoe T=%d: %.3f ms\n", lr[i].T, lr[i].best_s * 1e3);
    }
    free(out);
    free(tok);
    free(w);
    mb_layer_free(&l);
    st_model_close(&m);
    mb_destroy(&be);
    return 0;
}

/* ---- ggml ---- */

/* Random blocks with sane scales: MXFP4 e8m0 exponents near 2^0, Q8_0 fp16 scales 2^-7. */
static void fill_blocks(struct ggml_tensor *t)
{
    size_t n = ggml_nbytes(t), bs = ggml_type_size(t->type);
    uint8_t *p = t->data, pat[65521]; /* a prime-sized random pattern: ggml's speed does not
                                         depend on the values, only the scales must be sane */
    for (size_t i = 0; i < sizeof pat; i++)
        pat[i] = (uint8_t)(unit() * 256);
    for (size_t i = 0; i < n; i += sizeof pat)
        memcpy(p + i, pat, n - i < sizeof pat ? n - i : sizeof pat);
    for (size_t b = 0; b + bs <= n; b += bs) {
        if (t->type == GGML_TYPE_MXFP4) {
            p[b] = (uint8_t)(120 + (int)(unit() * 8));
        } else { /* Q8_0: fp16 d first */
            p[b] = 0x00;
            p[b + 1] = 0x20;
        }
    }
}

static void fill_f32(struct ggml_tensor *t, double scale)
{
    float *p = t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++)
        p[i] = (float)(scale * gauss());
}

static int run_ggml(const mc_config *c, int threads, int runs, layer_run *lr, int nT,
                    double *best_s, bounds *bd)
{
    int H = c->hidden_size, I = c->moe_intermediate_size, E = c->n_routed_experts,
        k = c->num_experts_per_tok;
    size_t wbytes = 3 * (size_t)E * ggml_row_size(GGML_TYPE_MXFP4, H) * (size_t)I +
                    3 * ggml_row_size(GGML_TYPE_Q8_0, H) * (size_t)I;
    struct ggml_init_params wp = {.mem_size = wbytes + 16 * ggml_tensor_overhead() + (1 << 20),
                                  .mem_buffer = NULL,
                                  .no_alloc = false};
    struct ggml_context *wctx = ggml_init(wp);
    if (!wctx) {
        fprintf(stderr, "bench_vs_ggml: ggml_init of %zu bytes failed\n", wbytes);
        return -1;
    }
    struct ggml_tensor *w1 = ggml_new_tensor_3d(wctx, GGML_TYPE_MXFP4, H, I, E);
    struct ggml_tensor *w3 = ggml_new_tensor_3d(wctx, GGML_TYPE_MXFP4, H, I, E);
    struct ggml_tensor *w2 = ggml_new_tensor_3d(wctx, GGML_TYPE_MXFP4, I, H, E);
    struct ggml_tensor *s1 = ggml_new_tensor_2d(wctx, GGML_TYPE_Q8_0, H, I);
    struct ggml_tensor *s3 = ggml_new_tensor_2d(wctx, GGML_TYPE_Q8_0, H, I);
    struct ggml_tensor *s2 = ggml_new_tensor_2d(wctx, GGML_TYPE_Q8_0, I, H);
    struct ggml_tensor *all[6] = {w1, w3, w2, s1, s3, s2};
    for (int i = 0; i < 6; i++)
        fill_blocks(all[i]);
    struct ggml_context *ctx[MAX_T];
    struct ggml_cgraph *gf[MAX_T];
    for (int i = 0; i < nT; i++) {
        int T = lr[i].T;
        size_t abytes = (size_t)T * (H + (size_t)k * I + H + I) * sizeof(float) * 3 +
                        (size_t)T * k * 4 + (size_t)T * ((size_t)k * (2 * I + H) + 2 * I + H) * 4;
        struct ggml_init_params ap = {.mem_size = abytes + 64 * ggml_tensor_overhead() +
                                                  ggml_graph_overhead() + ((size_t)64 << 20),
                                      .mem_buffer = NULL,
                                      .no_alloc = false};
        ctx[i] = ggml_init(ap);
        struct ggml_tensor *x = ggml_new_tensor_3d(ctx[i], GGML_TYPE_F32, H, 1, T);
        struct ggml_tensor *ids = ggml_new_tensor_2d(ctx[i], GGML_TYPE_I32, k, T);
        struct ggml_tensor *act = ggml_new_tensor_3d(ctx[i], GGML_TYPE_F32, I, k, T);
        struct ggml_tensor *x2 = ggml_new_tensor_2d(ctx[i], GGML_TYPE_F32, H, T);
        struct ggml_tensor *sact = ggml_new_tensor_2d(ctx[i], GGML_TYPE_F32, I, T);
        fill_f32(x, 1.0);
        fill_f32(act, 0.1);
        fill_f32(x2, 1.0);
        fill_f32(sact, 0.1);
        memcpy(ids->data, lr[i].ids, (size_t)T * k * sizeof(int32_t));
        gf[i] = ggml_new_graph(ctx[i]);
        ggml_build_forward_expand(gf[i], ggml_mul_mat_id(ctx[i], w1, x, ids));
        ggml_build_forward_expand(gf[i], ggml_mul_mat_id(ctx[i], w3, x, ids));
        ggml_build_forward_expand(gf[i], ggml_mul_mat_id(ctx[i], w2, act, ids));
        ggml_build_forward_expand(gf[i], ggml_mul_mat(ctx[i], s1, x2));
        ggml_build_forward_expand(gf[i], ggml_mul_mat(ctx[i], s3, x2));
        ggml_build_forward_expand(gf[i], ggml_mul_mat(ctx[i], s2, sact));
        best_s[i] = 1e30;
    }
    for (int r = 0; r <= runs; r++) { /* as for epmoe: round 0 warms up */
        bounds_trial(bd);
        for (int i = 0; i < nT; i++) {
            flush_caches();
            double a = bench_now();
            if (ggml_graph_compute_with_ctx(ctx[i], gf[i], threads) != GGML_STATUS_SUCCESS) {
                fprintf(stderr, "bench_vs_ggml: ggml_graph_compute failed\n");
                return -1;
            }
            double dt = bench_now() - a;
            if (r > 0 && dt < best_s[i])
                best_s[i] = dt;
        }
    }
    for (int i = 0; i < nT; i++) {
        ggml_free(ctx[i]);
        fprintf(stderr, "ggml T=%d: %.3f ms\n", lr[i].T, best_s[i] * 1e3);
    }
    ggml_free(wctx);
    return 0;
}

/* ---- main ---- */

int main(int argc, char **argv)
{
    test_isa_cap_from_env();
    const char *dir = NULL;
    int layer = 0, threads = 2, runs = 5, Ts[MAX_T] = {1, 8, 64, 256}, nT = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model"))
            dir = v;
        else if (!strcmp(a, "--layer"))
            layer = atoi(v);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--runs"))
            runs = atoi(v);
        else if (!strcmp(a, "--tokens")) {
            nT = 0;
            for (char *s = (char *)v; *s && nT < MAX_T;) {
                Ts[nT++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
            }
        }
    }
    if (!dir || threads < 1 || threads > 64 || runs < 1 || runs > MAX_RUNS || nT < 1) {
        fprintf(stderr, "usage: bench_vs_ggml --model DIR [--layer L] [--threads N] "
                        "[--tokens 1,8,64,256] [--runs R]\n");
        return 64;
    }
    /* bounds: trials now and in every round of both phases; each keeps its best */
    bounds bd = {.n = (size_t)1 << 28, .threads = threads}; /* 1 GiB of floats */
    bd.buf = aligned_alloc(64, bd.n * sizeof(float));
    for (size_t i = 0; i < bd.n; i++)
        bd.buf[i] = (float)(i & 1023);
    flush_buf = calloc(FLUSH_FLOATS, sizeof(float));
    for (int r = 0; r < 3; r++)
        bounds_trial(&bd);

    layer_run lr[MAX_T];
    memset(lr, 0, sizeof lr);
    for (int i = 0; i < nT; i++)
        lr[i].T = Ts[i];
    mc_config c;
    double load_s = 0, gg[MAX_T];
    uint64_t load_bytes = 0;
    if (run_epmoe(dir, layer, threads, runs, lr, nT, &c, &load_s, &load_bytes, &bd) < 0 ||
        run_ggml(&c, threads, runs, lr, nT, gg, &bd) < 0)
        return 1;
    double bw = bd.bw, fl = bd.fma;
    free(bd.buf);

    int H = c.hidden_size, I = c.moe_intermediate_size, k = c.num_experts_per_tok,
        E = c.n_routed_experts;
    double expert_bytes = 3.0 * ((double)H * I / 2 + (double)H * I / 32); /* MXFP4 + e8m0 */
    if (c.expert_dtype == MC_FP8)
        expert_bytes = 3.0 * ((double)H * I + (double)H * I / 16384 * 4);
    double shared_bytes = 3.0 * ((double)H * I + (double)H * I / 16384);
    double gate_bytes = (double)E * H * 2;
    printf("bench_vs_ggml: %s layer %d: H %d, I %d, %d experts (%s), top-%d; %d threads; epmoe "
           "%s\n",
           dir, layer, H, I, E, mc_dtype_name(c.expert_dtype), k, threads,
           gemm_impl_name(gemm_impl_best()));
    printf("read bandwidth %.1f GB/s, FP32 FMA peak %.0f GFLOP/s (%s); layer load %.2f GB in "
           "%.3f s = %.2f GB/s\n\n",
           bw / 1e9, fl / 1e9, bench_wide() ? "zmm" : "ymm", load_bytes / 1e9, load_s,
           load_bytes / load_s / 1e9);
    printf(
        "| T | experts hit | bytes read | memory bound | FMA bound | bound | epmoe (best of %d) | "
        "÷ bound | ggml matmuls (best of %d) | epmoe ÷ ggml |\n",
        runs, runs);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nT; i++) {
        int T = lr[i].T;
        double bytes = lr[i].distinct * expert_bytes + shared_bytes + gate_bytes;
        double macs = (double)T * (k + 1) * 3.0 * H * I;
        double tm = bytes / bw, tf = 2 * macs / fl, tb = tm > tf ? tm : tf;
        printf("| %d | %d | %.0f MB | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f | %.2f ms | "
               "%.2f |\n",
               T, lr[i].distinct, bytes / 1e6, tm * 1e3, tf * 1e3, tb * 1e3, lr[i].best_s * 1e3,
               lr[i].best_s / tb, gg[i] * 1e3, lr[i].best_s / gg[i]);
        free(lr[i].ids);
    }
    return 0;
}
