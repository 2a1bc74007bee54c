/*
 * vs_ggml.c — one DeepSeek V4 MoE layer: epmoe's exact whole layer beside ggml's MoE matmuls of
 * the same shapes on both of ggml's CPU paths, and beside the machine's memory and FMA bounds,
 * all measured in one process, interleaved. Built only by tests/bench/vs_ggml.sh (ggml is not
 * part of epmoe: the script builds it from a source folder the caller gives and links this file
 * against it).
 *
 *   bench_vs_ggml --model DIR [--layer L] [--threads N] [--tokens 1,8,64,256] [--runs R]
 *                 [--clock wall|cpu]
 *
 * Per token count T:
 *   epmoe          mb_forward on the CPU backend (route, quantize, routed experts, shared
 *                  expert, combine; exact) with every expert of layer L of the checkpoint in DIR
 *                  loaded, on hidden states with the outlier channels of real ones (a few
 *                  channels 30-100x the rest, per-channel scales spread log-normally); the w2
 *                  inputs are then the SwiGLU outputs of real w1/w3 rows.
 *   ggml repacked  the layer's matmuls as llama.cpp runs them by default on x86: mul_mat_id of
 *                  w1 and w3 (MXFP4, all experts) on x, of w2 on a [I, k, T] input, with the
 *                  expert ids epmoe's router chose for these tokens, the expert weights in the
 *                  CPU device's extra buffer type "CPU_REPACK" (ggml_backend_dev_get_extra_bufts),
 *                  which repacks them on upload for its interleaved AVX2/AVX-512 kernels; the
 *                  shared expert's three matrices as dense Q8_0 mul_mat in the plain CPU buffer
 *                  (ggml has no repacked Q8_0 layout on x86, so llama.cpp leaves them there too;
 *                  the bench checks). Activations quantized to q8_0 inside ggml (inexact).
 *                  SwiGLU, routing and combine are not counted on ggml's side.
 *   ggml plain     the same graph on the same weight bytes in the plain CPU buffer
 *                  (ggml_vec_dot_mxfp4_q8_0): what this bench measured before.
 *   bound          max(memory, FMA): memory = the bytes the layer must read (every expert hit,
 *                  the shared expert, the gate) / the read bandwidth of an AVX-512 (or AVX2)
 *                  read-sum over 1 GiB with the same threads; FMA = 2 * MACs / the FP32 FMA peak
 *                  of the widest FMA the CPU has with the same threads.
 * That the repacked path is taken is shown, not assumed: ggml's own debug log of the repack
 * (captured), the weights' buffer type and chosen layout, the CPU device's supports_op on the
 * graph's nodes; and both ggml paths' outputs must agree, which proves they read the same weights.
 * The machine may be shared: each round runs every T once on all three, in an order rotated
 * every round, after a trial of the bounds; results keep their best round and the per-round
 * ratios give the spread. Round 0 (warm-up, routing, the check) is not timed. Before every timed
 * run the caches are flushed (a 128 MiB read): in a model the other layers' weights pass through
 * them between two steps of a layer.
 * --clock cpu (with --threads 1 only) times the three sides in process CPU time instead of wall
 * time: on a machine shared with other jobs a single-threaded run loses the CPU to them at
 * random moments, which wall time counts and CPU time does not. With one thread no side has a
 * second thread (epmoe's pool runs a one-thread task inline, ggml's OpenMP team of one is the
 * caller), so the process's CPU time is the side's; with more, both sides' threads spin while
 * they wait. What the load still costs, the shared caches and memory, it costs all three sides.
 * The bounds stay wall-clock best trials.
 * The load of the layer (checkpoint in the page cache -> packed weights) is timed as well.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_bounds.h"
#include "bench_cpus.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels/formats.h"
#include "kernels/moe_backend.h"
#include "shard/shard.h"
#include "tests/isa_env.h"

#define MAX_T    16
#define MAX_RUNS 32

enum { SIDE_EPMOE, SIDE_REPACK, SIDE_PLAIN, N_SIDES };
enum { PATH_REPACK, PATH_PLAIN, N_PATHS }; /* ggml's two paths; side = path + 1 */

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

/* One token count: its inputs, the routing epmoe chose, and every timed round of every side. */
typedef struct tcase {
    int T;
    int distinct;                /* experts hit */
    uint16_t *x;                 /* [T, H] bf16 hidden states */
    int32_t *ids;                /* [T, k], epmoe's router, filled in round 0 */
    double t[N_SIDES][MAX_RUNS]; /* seconds of timed round r */
} tcase;

/* The clock of the timed runs: CLOCK_MONOTONIC, or the process's CPU time (--clock cpu). */
static int cpu_clock;

static double side_now(void)
{
    if (!cpu_clock)
        return bench_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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

typedef struct epmoe_side {
    mb_backend *be;
    st_model *m;
    mb_layer *l;
    uint16_t *out; /* [maxT, H] */
    int64_t *tok;  /* [maxT] */
    float *w;      /* [maxT, k] */
    double load_s;
    uint64_t load_bytes;
} epmoe_side;

static int epmoe_fail(const ep_err *err)
{
    fprintf(stderr, "bench_vs_ggml: %s\n", err->msg);
    return -1;
}

/* Load layer `layer` of the checkpoint in dir on the CPU backend, timing the load. */
static int epmoe_open(epmoe_side *s, const char *dir, int layer, int threads, int maxT,
                      mc_config *c)
{
    ep_err err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (mc_load(path, c, &err) < 0)
        return epmoe_fail(&err);
    mb_options o = {.device = "cpu", .threads = threads};
    s->be = mb_create(&o, &err);
    s->m = s->be ? st_model_open(dir, &err) : NULL;
    if (!s->m)
        return epmoe_fail(&err);
    s->load_bytes = shard_layer_bytes(s->m, c, layer, NULL, NULL, false);
    double t0 = bench_now();
    s->l = shard_load_layer(s->be, s->m, c, layer, NULL, NULL, NULL, NULL, &err);
    s->load_s = bench_now() - t0;
    if (!s->l)
        return epmoe_fail(&err);
    s->out = malloc((size_t)maxT * c->hidden_size * 2);
    s->tok = calloc((size_t)maxT, sizeof *s->tok);
    s->w = malloc((size_t)maxT * c->num_experts_per_tok * sizeof(float));
    return 0;
}

static int epmoe_run(epmoe_side *s, tcase *tc)
{
    ep_err err = {0};
    if (mb_forward(s->be, s->l, tc->T, tc->x, s->tok, s->out, tc->ids, s->w, &err) < 0)
        return epmoe_fail(&err);
    return 0;
}

static void epmoe_close(epmoe_side *s)
{
    free(s->out);
    free(s->tok);
    free(s->w);
    mb_layer_free(&s->l);
    st_model_close(&s->m);
    mb_destroy(&s->be);
}

/* ---- ggml ---- */

/* What the bench saw of ggml's repack: its own debug lines ("repack tensor w1 with ..."), kept
 * to be printed with the results; other ggml messages above debug level go to stderr. */
static char repack_log[1024];

static void ggml_log_capture(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (strstr(text, "repack tensor")) {
        size_t n = strlen(repack_log);
        snprintf(repack_log + n, sizeof repack_log - n, "%s%.*s", n ? "; " : "",
                 (int)strcspn(text, "\n"), text);
    } else if (level != GGML_LOG_LEVEL_DEBUG) {
        fputs(text, stderr);
    }
}

/* The CPU device's extra buffer type named name (what llama.cpp offers weights first), or NULL. */
static ggml_backend_buffer_type_t cpu_extra_buft(const char *name)
{
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t *b = get ? get(ggml_backend_reg_dev_get(reg, 0)) : NULL;
    for (; b && *b; b++)
        if (!strcmp(ggml_backend_buft_name(*b), name))
            return *b;
    return NULL;
}

/* Tensors of one ggml context, placed in one buffer of one buffer type. */
typedef struct ggml_weights {
    struct ggml_context *ctx; /* no_alloc: the buffer holds the data */
    ggml_backend_buffer_t buf;
    struct ggml_tensor *t[3]; /* w1, w3, w2 or the shared expert's s1, s3, s2 */
} ggml_weights;

/* w1, w3 [H -> I] and w2 [I -> H] of type type, E of them (E = 1: one 2-d matrix each). */
static int weights_alloc(ggml_weights *w, ggml_backend_buffer_type_t buft, enum ggml_type type,
                         int H, int I, int E, const char *prefix)
{
    struct ggml_init_params p = {.mem_size = 4 * ggml_tensor_overhead(), .no_alloc = true};
    static const char *names[3] = {"1", "3", "2"};
    w->ctx = ggml_init(p);
    for (int i = 0; i < 3; i++) {
        int64_t in = i < 2 ? H : I, outn = i < 2 ? I : H;
        w->t[i] = E > 1 ? ggml_new_tensor_3d(w->ctx, type, in, outn, E)
                        : ggml_new_tensor_2d(w->ctx, type, in, outn);
        ggml_format_name(w->t[i], "%s%s", prefix, names[i]);
    }
    w->buf = ggml_backend_alloc_ctx_tensors_from_buft(w->ctx, buft);
    if (!w->buf) {
        fprintf(stderr, "bench_vs_ggml: allocating %s weights in %s failed\n", prefix,
                ggml_backend_buft_name(buft));
        return -1;
    }
    return 0;
}

static void weights_free(ggml_weights *w)
{
    ggml_backend_buffer_free(w->buf);
    ggml_free(w->ctx);
}

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

/* ggml's weights: the experts once in the plain CPU buffer and once uploaded (the same bytes)
 * into CPU_REPACK; the shared expert in the plain CPU buffer, used by both graphs. */
typedef struct ggml_side {
    ggml_weights experts[N_PATHS], shared;
    char layout[32];       /* what ggml's repack chose, from its log ("mxfp4_8x8"), or "?" */
    int shared_repackable; /* ggml has a repacked Q8_0 layout here (llama.cpp would use it) */
    struct ggml_context *ctx[MAX_T];
    struct ggml_cgraph *gf[N_PATHS][MAX_T];
    struct ggml_cplan plan[N_PATHS][MAX_T];
    struct ggml_tensor *y[N_PATHS][MAX_T][3]; /* the expert matmuls' outputs */
} ggml_side;

/* Whether ggml has a repacked layout for a [ne0, ne1] tensor of type on this CPU: its repack
 * buffer sets the tensor's extra (its kernel traits) at allocation, NULL when it has none. */
static int repack_has_layout(ggml_backend_buffer_type_t buft, enum ggml_type type, int ne0, int ne1)
{
    struct ggml_init_params p = {.mem_size = ggml_tensor_overhead(), .no_alloc = true};
    struct ggml_context *ctx = ggml_init(p);
    ggml_new_tensor_2d(ctx, type, ne0, ne1);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    int has = buf && ggml_get_first_tensor(ctx)->extra != NULL;
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return has;
}

static int ggml_weights_setup(ggml_side *g, const mc_config *c)
{
    int H = c->hidden_size, I = c->moe_intermediate_size, E = c->n_routed_experts;
    ggml_backend_buffer_type_t cpu = ggml_backend_cpu_buffer_type(),
                               repack = cpu_extra_buft("CPU_REPACK");
    if (!repack || !repack_has_layout(repack, GGML_TYPE_MXFP4, H, I) ||
        !repack_has_layout(repack, GGML_TYPE_MXFP4, I, H)) {
        fprintf(stderr,
                "bench_vs_ggml: this ggml build has no repacked MXFP4 layout for these "
                "shapes on this CPU (CPU_REPACK: %s)\n",
                repack ? "present" : "absent");
        return -1;
    }
    g->shared_repackable = repack_has_layout(repack, GGML_TYPE_Q8_0, H, I);
    if (weights_alloc(&g->experts[PATH_PLAIN], cpu, GGML_TYPE_MXFP4, H, I, E, "w") < 0 ||
        weights_alloc(&g->experts[PATH_REPACK], repack, GGML_TYPE_MXFP4, H, I, E, "w") < 0 ||
        weights_alloc(&g->shared, cpu, GGML_TYPE_Q8_0, H, I, 1, "s") < 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        struct ggml_tensor *plain = g->experts[PATH_PLAIN].t[i];
        if (!g->experts[PATH_REPACK].t[i]->extra) { /* its set_tensor would have no repack */
            fprintf(stderr, "bench_vs_ggml: ggml chose no repacked layout for %s\n", plain->name);
            return -1;
        }
        fill_blocks(plain);
        fill_blocks(g->shared.t[i]);
        /* the repack buffer's set_tensor is the repack: same bytes in, its layout out */
        ggml_backend_tensor_set(g->experts[PATH_REPACK].t[i], plain->data, 0, ggml_nbytes(plain));
    }
    const char *with = strstr(repack_log, " with ");
    snprintf(g->layout, sizeof g->layout, "%.*s", with ? (int)strcspn(with + 6, ";") : 1,
             with ? with + 6 : "?");
    return 0;
}

static struct ggml_tensor *new_f32(struct ggml_context *ctx, int64_t a, int64_t b, int64_t c,
                                   double scale)
{
    struct ggml_tensor *t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a, b, c);
    float *p = t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++)
        p[i] = (float)(scale * gauss());
    return t;
}

/* The layer's matmuls for one T on path p's expert weights, and its compute plan. */
static int ggml_graph_build(ggml_side *g, int p, int i, struct ggml_tensor *in[5], int threads)
{
    struct ggml_context *ctx = g->ctx[i];
    struct ggml_tensor *x = in[0], *ids = in[1], *act = in[2], *x2 = in[3], *sact = in[4];
    struct ggml_tensor **w = g->experts[p].t, **s = g->shared.t;
    struct ggml_cgraph *gf = g->gf[p][i] = ggml_new_graph(ctx);
    g->y[p][i][0] = ggml_mul_mat_id(ctx, w[0], x, ids);
    g->y[p][i][1] = ggml_mul_mat_id(ctx, w[1], x, ids);
    g->y[p][i][2] = ggml_mul_mat_id(ctx, w[2], act, ids);
    for (int j = 0; j < 3; j++)
        ggml_build_forward_expand(gf, g->y[p][i][j]);
    ggml_build_forward_expand(gf, ggml_mul_mat(ctx, s[0], x2));
    ggml_build_forward_expand(gf, ggml_mul_mat(ctx, s[1], x2));
    ggml_build_forward_expand(gf, ggml_mul_mat(ctx, s[2], sact));
    g->plan[p][i] = ggml_graph_plan(gf, threads, NULL);
    g->plan[p][i].work_data = malloc(g->plan[p][i].work_size + 1);
    return g->plan[p][i].work_data ? 0 : -1;
}

/* Both paths' graphs for one T, on the same inputs: x is epmoe's hidden states, ids the experts
 * epmoe's router chose for them (tc->ids, filled by the warm-up round). */
static int ggml_graphs_setup(ggml_side *g, int i, const tcase *tc, const mc_config *c, int threads)
{
    int T = tc->T, H = c->hidden_size, I = c->moe_intermediate_size, k = c->num_experts_per_tok;
    size_t in_f = (size_t)T * (2 * (size_t)H + (size_t)k * I + I + k),
           out_f = (size_t)T * ((size_t)k * (2 * I + H) + 2 * I + H);
    struct ggml_init_params ip = {.mem_size = (in_f + N_PATHS * out_f) * sizeof(float) +
                                              64 * ggml_tensor_overhead() +
                                              N_PATHS * ggml_graph_overhead() + ((size_t)1 << 20),
                                  .no_alloc = false};
    struct ggml_context *ctx = g->ctx[i] = ggml_init(ip);
    if (!ctx)
        return -1;
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H, 1, T);
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, k, T);
    for (int64_t j = 0; j < (int64_t)T * H; j++)
        ((float *)x->data)[j] = fmt_bf16_to_f32(tc->x[j]);
    memcpy(ids->data, tc->ids, (size_t)T * k * sizeof(int32_t));
    struct ggml_tensor *in[5] = {x, ids, new_f32(ctx, I, k, T, 0.1), ggml_reshape_2d(ctx, x, H, T),
                                 new_f32(ctx, I, T, 1, 0.1)};
    for (int p = 0; p < N_PATHS; p++)
        if (ggml_graph_build(g, p, i, in, threads) < 0)
            return -1;
    return 0;
}

static int ggml_run(ggml_side *g, int p, int i)
{
    if (ggml_graph_compute(g->gf[p][i], &g->plan[p][i]) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "bench_vs_ggml: ggml_graph_compute failed\n");
        return -1;
    }
    return 0;
}

/* max |repacked - plain| / max |plain| over the expert matmuls' outputs of graph i (both run). */
static double ggml_paths_diff(const ggml_side *g, int i)
{
    double d = 0, m = 0;
    for (int j = 0; j < 3; j++) {
        const float *a = g->y[PATH_REPACK][i][j]->data, *b = g->y[PATH_PLAIN][i][j]->data;
        for (int64_t e = 0; e < ggml_nelements(g->y[PATH_PLAIN][i][j]); e++) {
            d = fmax(d, fabs((double)a[e] - b[e]));
            m = fmax(m, fabs((double)b[e]));
        }
    }
    return m > 0 ? d / m : INFINITY;
}

/* Whether ggml's CPU device takes every node of graph i of path p through the buffers its
 * weights are in (its supports_op asks the repack buffer type for nodes on repacked weights). */
static int ggml_graph_supported(const ggml_side *g, int p, int i)
{
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0);
    for (int n = 0; n < ggml_graph_n_nodes(g->gf[p][i]); n++)
        if (!ggml_backend_dev_supports_op(dev, ggml_graph_node(g->gf[p][i], n)))
            return 0;
    return 1;
}

static void ggml_side_free(ggml_side *g, int nT)
{
    for (int i = 0; i < nT; i++) {
        for (int p = 0; p < N_PATHS; p++)
            free(g->plan[p][i].work_data);
        ggml_free(g->ctx[i]);
    }
    for (int p = 0; p < N_PATHS; p++)
        weights_free(&g->experts[p]);
    weights_free(&g->shared);
}

/* ---- the run ---- */

typedef struct run {
    epmoe_side ep;
    ggml_side gg;
    bounds bd;
    tcase tc[MAX_T];
    int nT, runs;
    double diff; /* worst ggml_paths_diff over the T's */
    int supported;
    int threads;
    bc_side cpus[N_SIDES]; /* where each side's threads ran, over the timed runs */
} run;

static int run_side(run *R, int side, int i)
{
    return side == SIDE_EPMOE ? epmoe_run(&R->ep, &R->tc[i]) : ggml_run(&R->gg, side - 1, i);
}

/* Round 0: epmoe routes every T (its ids feed ggml's graphs), then both ggml paths run once and
 * their outputs are compared. Nothing of it is timed. */
static int warm_up(run *R, const mc_config *c, int threads)
{
    int k = c->num_experts_per_tok, E = c->n_routed_experts;
    R->supported = 1;
    for (int i = 0; i < R->nT; i++) {
        tcase *tc = &R->tc[i];
        char *hit = calloc((size_t)E, 1);
        if (epmoe_run(&R->ep, tc) < 0 || ggml_graphs_setup(&R->gg, i, tc, c, threads) < 0 ||
            ggml_run(&R->gg, PATH_REPACK, i) < 0 || ggml_run(&R->gg, PATH_PLAIN, i) < 0)
            return -1;
        for (int j = 0; j < tc->T * k; j++)
            tc->distinct += hit[tc->ids[j]]++ == 0;
        free(hit);
        R->diff = fmax(R->diff, ggml_paths_diff(&R->gg, i));
        R->supported &= ggml_graph_supported(&R->gg, PATH_REPACK, i);
    }
    return 0;
}

/* Every round runs every T on the three sides, each after a cache flush, in an order rotated
 * every round so that no side always follows the same one. */
static int timed_rounds(run *R)
{
    for (int r = 0; r < R->runs; r++) {
        bounds_trial(&R->bd);
        for (int i = 0; i < R->nT; i++) {
            for (int j = 0; j < N_SIDES; j++) {
                int side = (j + r) % N_SIDES;
                flush_caches();
                static bc_snap before, after; /* outside the timed span: /proc reads */
                bc_snap_take(&before);
                double a = side_now();
                if (run_side(R, side, i) < 0)
                    return -1;
                R->tc[i].t[side][r] = side_now() - a;
                bc_snap_take(&after);
                bc_side_add(&R->cpus[side], &before, &after);
            }
        }
        fprintf(stderr, "round %d/%d done\n", r + 1, R->runs);
    }
    return 0;
}

/* ---- results ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double best(const double *t, int n)
{
    double b = t[0];
    for (int r = 1; r < n; r++)
        b = t[r] < b ? t[r] : b;
    return b;
}

/* "median (min-max)" of num[r] / den[r] over the rounds */
static void ratio_spread(const double *num, const double *den, int n, char *buf, size_t len)
{
    double q[MAX_RUNS];
    for (int r = 0; r < n; r++)
        q[r] = num[r] / den[r];
    qsort(q, (size_t)n, sizeof q[0], cmp_double);
    double med = n % 2 ? q[n / 2] : 0.5 * (q[n / 2 - 1] + q[n / 2]);
    snprintf(buf, len, "%.2f (%.2f-%.2f)", med, q[0], q[n - 1]);
}

/* Each side's instruction set and the CPUs its threads ran on: pinning (OMP_PROC_BIND left in
 * the environment, an affinity mask) once put both of epmoe's threads on one core and made it
 * look 1.4-1.9x slower than ggml; such a run must say so rather than be read as a result. */
static void print_threads(const run *R)
{
    static const char *const name[N_SIDES] = {"epmoe", "ggml repacked", "ggml plain"};
    char buf[512];
    printf("instruction sets: epmoe %s; ggml's CPU backend AVX2 %s, FMA %s, AVX-512 %s, AVX-512 "
           "VNNI %s, AVX-VNNI %s\n",
           isa_name(isa_best()), ggml_cpu_has_avx2() ? "yes" : "no",
           ggml_cpu_has_fma() ? "yes" : "no", ggml_cpu_has_avx512() ? "yes" : "no",
           ggml_cpu_has_avx512_vnni() ? "yes" : "no", ggml_cpu_has_avx_vnni() ? "yes" : "no");
    bc_affinity_format(buf, sizeof buf);
    printf("threads: %d per side; the main thread may run on CPUs %s\n", R->threads, buf);
    for (int s = 0; s < N_SIDES; s++) {
        bc_side_format(&R->cpus[s], buf, sizeof buf);
        printf("  %s: %s\n", name[s], buf);
        if (bc_side_pinned(&R->cpus[s]))
            for (int k = 0; k < 2; k++)
                fprintf(k ? stderr : stdout,
                        "WARNING: %s's threads ran on ONE CPU in every run (pinned: "
                        "OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY or an affinity mask?): "
                        "its times measure the pinning, not the code\n",
                        name[s]);
    }
}

static void print_header(const run *R, const char *dir, int layer, int threads, const mc_config *c)
{
    const ggml_side *g = &R->gg;
    printf("bench_vs_ggml: %s layer %d: H %d, I %d, %d experts (%s), top-%d; %d threads; epmoe "
           "%s\n",
           dir, layer, c->hidden_size, c->moe_intermediate_size, c->n_routed_experts,
           mc_dtype_name(c->expert_dtype), c->num_experts_per_tok, threads, isa_name(isa_best()));
    printf("read bandwidth %.1f GB/s, FP32 FMA peak %.0f GFLOP/s (%s); layer load %.2f GB in "
           "%.3f s = %.2f GB/s\n",
           R->bd.bw / 1e9, R->bd.fma / 1e9, bench_wide() ? "zmm" : "ymm", R->ep.load_bytes / 1e9,
           R->ep.load_s, R->ep.load_bytes / R->ep.load_s / 1e9);
    printf("ggml repacked: expert weights in buffer %s, layout %s (ggml's log: %s); CPU device "
           "supports every node on them: %s; shared expert Q8_0 in %s (%s)\n",
           ggml_backend_buffer_name(g->experts[PATH_REPACK].buf), g->layout,
           repack_log[0] ? repack_log : "nothing", R->supported ? "yes" : "NO",
           ggml_backend_buffer_name(g->shared.buf),
           g->shared_repackable ? "ggml could repack it here, llama.cpp would"
                                : "ggml has no repacked Q8_0 layout here, as llama.cpp finds");
    printf("ggml plain: expert weights in buffer %s; the two paths' expert outputs agree to "
           "%.1e of their largest value (the same weights)\n",
           ggml_backend_buffer_name(g->experts[PATH_PLAIN].buf), R->diff);
    print_threads(R);
    printf("times: %s, %d rounds, the three sides interleaved\n\n",
           cpu_clock ? "process CPU time (--clock cpu)" : "wall clock", R->runs);
}

static void print_bounds(const run *R, const mc_config *c)
{
    int H = c->hidden_size, I = c->moe_intermediate_size, k = c->num_experts_per_tok,
        E = c->n_routed_experts, n = R->runs;
    double expert_bytes = 3.0 * ((double)H * I / 2 + (double)H * I / 32); /* MXFP4 + e8m0 */
    if (c->expert_dtype == MC_FP8)
        expert_bytes = 3.0 * ((double)H * I + (double)H * I / 16384 * 4);
    double shared_bytes = 3.0 * ((double)H * I + (double)H * I / 16384);
    double gate_bytes = (double)E * H * 2;
    printf("| T | experts hit | bytes read | memory bound | FMA bound | bound | epmoe (best of %d) "
           "| ÷ bound |\n|---|---|---|---|---|---|---|---|\n",
           n);
    for (int i = 0; i < R->nT; i++) {
        const tcase *tc = &R->tc[i];
        double bytes = tc->distinct * expert_bytes + shared_bytes + gate_bytes;
        double macs = (double)tc->T * (k + 1) * 3.0 * H * I;
        double tm = bytes / R->bd.bw, tf = 2 * macs / R->bd.fma, tb = tm > tf ? tm : tf;
        double te = best(tc->t[SIDE_EPMOE], n);
        printf("| %d | %d | %.0f MB | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f |\n", tc->T,
               tc->distinct, bytes / 1e6, tm * 1e3, tf * 1e3, tb * 1e3, te * 1e3, te / tb);
    }
}

/* The comparison: per T the repacked path (llama.cpp's default, the headline) and the plain one
 * as a second row; ratios of the best rounds and, per round, their median and range. */
static void print_comparison(const run *R)
{
    int n = R->runs;
    char a[64], b[64];
    printf("\n| T | ggml path | ggml (best of %d) | epmoe (best of %d) | epmoe ÷ ggml, best ÷ "
           "best | epmoe ÷ ggml per round: median (min-max) | ggml plain ÷ repacked per round "
           "|\n|---|---|---|---|---|---|---|\n",
           n, n);
    for (int i = 0; i < R->nT; i++) {
        const tcase *tc = &R->tc[i];
        double te = best(tc->t[SIDE_EPMOE], n);
        for (int side = SIDE_REPACK; side <= SIDE_PLAIN; side++) {
            double tg = best(tc->t[side], n);
            ratio_spread(tc->t[SIDE_EPMOE], tc->t[side], n, a, sizeof a);
            if (side == SIDE_REPACK)
                ratio_spread(tc->t[SIDE_PLAIN], tc->t[SIDE_REPACK], n, b, sizeof b);
            printf("| %d | %s | %.2f ms | %.2f ms | **%.2f** | %s | %s |\n", tc->T,
                   side == SIDE_REPACK ? "**repacked** (llama.cpp's default)" : "plain", tg * 1e3,
                   te * 1e3, te / tg, a, side == SIDE_REPACK ? b : "—");
        }
    }
}

/* ---- main ---- */

static int parse_tokens(const char *v, int *Ts)
{
    int nT = 0;
    for (char *s = (char *)v; *s && nT < MAX_T;) {
        Ts[nT++] = (int)strtol(s, &s, 10);
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return nT;
}

typedef struct args {
    const char *dir;
    int layer, threads, runs, Ts[MAX_T], nT, maxT;
} args;

/* 0, or -1 for a usage error. --clock cpu needs one thread: the CPU time of several threads is
 * their sum, not the latency, and both sides' threads spin while they wait. */
static int parse_args(int argc, char **argv, args *A)
{
    int bad = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model"))
            A->dir = v;
        else if (!strcmp(a, "--layer"))
            A->layer = atoi(v);
        else if (!strcmp(a, "--threads"))
            A->threads = atoi(v);
        else if (!strcmp(a, "--runs"))
            A->runs = atoi(v);
        else if (!strcmp(a, "--tokens"))
            A->nT = parse_tokens(v, A->Ts);
        else if (!strcmp(a, "--clock") && (!strcmp(v, "wall") || !strcmp(v, "cpu")))
            cpu_clock = !strcmp(v, "cpu");
        else
            bad = 1;
    }
    for (int i = 0; i < A->nT; i++)
        A->maxT = A->Ts[i] > A->maxT ? A->Ts[i] : A->maxT;
    if (bad || !A->dir || A->threads < 1 || A->threads > 64 || A->runs < 1 || A->runs > MAX_RUNS ||
        A->nT < 1 || A->maxT < 1 || A->maxT > 4096 || (cpu_clock && A->threads != 1)) {
        fprintf(stderr,
                "usage: bench_vs_ggml --model DIR [--layer L] [--threads N] "
                "[--tokens 1,8,64,256] [--runs R (<= %d)] [--clock wall|cpu (cpu: --threads 1 "
                "only)]\n",
                MAX_RUNS);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    test_isa_cap_from_env();
    args A = {.threads = 2, .runs = 5, .Ts = {1, 8, 64, 256}, .nT = 4};
    if (parse_args(argc, argv, &A) < 0)
        return 64;
    const char *dir = A.dir;
    int layer = A.layer, threads = A.threads, nT = A.nT, *Ts = A.Ts;
    ggml_log_set(ggml_log_capture, NULL);
    static run R; /* large: every round's times */
    R.nT = nT;
    R.runs = A.runs;
    R.threads = A.threads;
    /* bounds: trials now and in every round; each keeps its best */
    R.bd = (bounds){.n = (size_t)1 << 28, .threads = threads}; /* 1 GiB of floats */
    R.bd.buf = aligned_alloc(64, R.bd.n * sizeof(float));
    for (size_t i = 0; i < R.bd.n; i++)
        R.bd.buf[i] = (float)(i & 1023);
    flush_buf = calloc(FLUSH_FLOATS, sizeof(float));
    for (int r = 0; r < 3; r++)
        bounds_trial(&R.bd);

    mc_config c;
    if (epmoe_open(&R.ep, dir, layer, threads, A.maxT, &c) < 0 || ggml_weights_setup(&R.gg, &c) < 0)
        return 1;
    for (int i = 0; i < nT; i++) {
        R.tc[i].T = Ts[i];
        R.tc[i].x = malloc((size_t)Ts[i] * c.hidden_size * 2);
        R.tc[i].ids = malloc((size_t)Ts[i] * c.num_experts_per_tok * sizeof(int32_t));
        hidden_states(Ts[i], c.hidden_size, R.tc[i].x);
    }
    if (warm_up(&R, &c, threads) < 0 || timed_rounds(&R) < 0)
        return 1;
    print_header(&R, dir, layer, threads, &c);
    print_bounds(&R, &c);
    print_comparison(&R);
    for (int i = 0; i < nT; i++) {
        free(R.tc[i].x);
        free(R.tc[i].ids);
    }
    ggml_side_free(&R.gg, nT);
    epmoe_close(&R.ep);
    free(R.bd.buf);
    free(flush_buf);
    return 0;
}
