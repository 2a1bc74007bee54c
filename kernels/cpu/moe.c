/*
 * moe.c — one DeepSeek V4 MoE layer on the CPU (moe.h): building a layer from its checkpoint
 * tensors, routing, the expert MLPs, the shared expert and the combine. Semantics:
 * docs/numerics.md.
 *
 * Memory: everything the layer owns besides the packed GEMM weights — ffn_norm gain, packed
 * gate, bias or tid2eid, the expert table — lives in one arena, sized first and carved after
 * one allocation (llm.c's malloc_and_point_parameters). The expert GEMM weights are packed by
 * kernels/gemm.h, which allocates each one itself (its packers take no destination buffer);
 * each expert's three weights sit in one reference-counted moe_mlp, so a new placement's layer
 * can share the experts it keeps with the old layer while the old one still serves.
 *
 * Results never depend on how work is grouped: moe_experts batches the rows of one expert into
 * one GEMM (in chunks of at most MOE_GEMM_ROWS rows), moe_forward cuts large batches into
 * MOE_FORWARD_TOKENS pieces, and every GEMM row, SwiGLU element and combine sum is a function
 * of its own token only (gemm.h, swiglu.h).
 */
#include "kernels/moe.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "kernels/combine_order.h"
#include "kernels/formats.h"
#include "kernels/quant.h"
#include "kernels/route.h"
#include "kernels/swiglu.h"

/* Rows per expert GEMM call: bounds the scratch of moe_experts/moe_shared (about 40 KB per row
 * at V4 sizes) while keeping the GEMMs wide enough to stream each weight once per chunk. */
#define MOE_GEMM_ROWS 256
/* Tokens per piece of moe_forward: bounds its [T, k, H] buffers. */
#define MOE_FORWARD_TOKENS 1024

enum { W1 = MB_W1, W3 = MB_W3, W2 = MB_W2 };

/* One expert MLP's packed weights, shared by every layer object that holds the expert. */
typedef struct moe_mlp {
    atomic_int refs;
    gemm_weight *w[3]; /* w1, w3, w2 */
    size_t bytes;
} moe_mlp;

struct moe_layer {
    mc_config cfg;
    int layer;
    char name[32]; /* "layers.3" / "mtp.0", for messages */
    bool hash;
    isa_level impl; /* what the weights were packed for (resolved) */
    int H, I, E, k;
    /* the arena and what is carved from it */
    void *arena;
    size_t arena_bytes;
    uint16_t *norm;    /* ffn_norm gain, bf16 [H] */
    void *gate;        /* route_gate_pack layout */
    float *bias;       /* [E], score layers */
    int64_t *tid2eid;  /* [vocab, k], hash layers */
    uint8_t *owned;    /* [E] */
    moe_mlp **experts; /* [E]; NULL where not owned */
    moe_mlp *shared;
};

/* ---- expert weights ---- */

static void mlp_unref(moe_mlp **m_p)
{
    moe_mlp *m = *m_p;
    *m_p = NULL;
    if (m == NULL || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    for (int j = 0; j < 3; j++)
        gemm_weight_free(&m->w[j]);
    free(m);
}

static moe_mlp *mlp_ref(moe_mlp *m)
{
    atomic_fetch_add(&m->refs, 1);
    return m;
}

/* Bytes of a linear's tensors as stored (weight + scale), for progress. */
static uint64_t linear_src_bytes(const mb_linear *t)
{
    uint64_t N = (uint64_t)t->N, K = (uint64_t)t->K;
    if (t->format == MB_W_MXFP4)
        return N * K / 2 + N * K / EP_MXFP4_GROUP;
    uint64_t ns = (N / EP_FP8_BLOCK) * (K / EP_FP8_BLOCK);
    return N * K + ns * (t->scale_e8m0 ? 1 : 4);
}

/* Pack one linear. FP8 scales are decoded to fp32 first (E8M0 codes exactly; f32 copied from a
 * possibly unaligned source); the caller's contract check has refused code 255. */
static gemm_weight *pack_linear(const mb_linear *t, isa_level impl, ep_err *err)
{
    if (t->w == NULL || t->scale == NULL) {
        ep_err_set(err, "tensor %s: no data", t->name ? t->name : "?");
        return NULL;
    }
    gemm_weight *g = NULL;
    if (t->format == MB_W_MXFP4) {
        g = gemm_pack_mxfp4(t->N, t->K, t->w, t->scale, impl, err);
    } else {
        size_t ns = (size_t)(t->N / EP_FP8_BLOCK) * (size_t)(t->K / EP_FP8_BLOCK);
        float *scale = malloc(ns * sizeof(float));
        if (!scale) {
            ep_err_set(err, "out of memory for %zu scales", ns);
        } else {
            if (t->scale_e8m0)
                for (size_t i = 0; i < ns; i++)
                    scale[i] = fmt_e8m0_to_f32(((const uint8_t *)t->scale)[i]);
            else
                memcpy(scale, t->scale, ns * sizeof(float));
            g = gemm_pack_fp8(t->N, t->K, t->w, scale, impl, err);
            free(scale);
        }
    }
    if (!g)
        ep_err_prefix(err, "tensor %s", t->name ? t->name : "?");
    return g;
}

typedef struct build_ctx {
    mb_progress_fn progress;
    void *progress_ctx;
    atomic_uint_fast64_t done;
} build_ctx;

/* Count bytes read; only the caller's thread (tid 0) reports, since progress callbacks need not
 * be thread-safe. */
static void build_progress(build_ctx *bc, uint64_t bytes, int tid)
{
    uint64_t done = atomic_fetch_add(&bc->done, bytes) + bytes;
    if (bc->progress && tid == 0)
        bc->progress(bc->progress_ctx, done);
}

/* An expert MLP (or the shared expert) without weights yet: pack_all packs them. */
static moe_mlp *mlp_new(ep_err *err)
{
    moe_mlp *m = calloc(1, sizeof *m);
    if (!m)
        ep_err_set(err, "out of memory for an expert");
    else
        atomic_init(&m->refs, 1);
    return m;
}

/* The linears a layer build packs: the shared expert's and every new expert's three, packed
 * by the backend's threads in parallel (the load is bound by packing and page faults, not by
 * one reader). The first failure is kept; later tasks are skipped. */
typedef struct pack_job {
    moe_mlp *m;
    int j; /* 0..2: w1, w3, w2 */
    const mb_linear *t;
} pack_job;

typedef struct pack_ctx {
    pack_job *jobs;
    isa_level impl;
    build_ctx *bc;
    atomic_int failed;
    pthread_mutex_t mu;
    ep_err *err;
} pack_ctx;

static void pack_task(void *vctx, int i, int tid)
{
    pack_ctx *pc = vctx;
    if (atomic_load(&pc->failed))
        return;
    pack_job *jb = &pc->jobs[i];
    ep_err e = {0};
    gemm_weight *g = pack_linear(jb->t, pc->impl, &e);
    if (!g) {
        pthread_mutex_lock(&pc->mu);
        if (!atomic_exchange(&pc->failed, 1))
            *pc->err = e;
        pthread_mutex_unlock(&pc->mu);
        return;
    }
    jb->m->w[jb->j] = g;
    build_progress(pc->bc, linear_src_bytes(jb->t), tid);
}

static int pack_all(pack_job *jobs, int n, isa_level impl, build_ctx *bc, tpool *pool, ep_err *err)
{
    pack_ctx pc = {.jobs = jobs, .impl = impl, .bc = bc, .err = err};
    atomic_init(&pc.failed, 0);
    pthread_mutex_init(&pc.mu, NULL);
    tpool_for(pool, n, pack_task, &pc);
    pthread_mutex_destroy(&pc.mu);
    for (int i = 0; i < n; i++)
        if (jobs[i].m->w[jobs[i].j])
            jobs[i].m->bytes += gemm_weight_bytes(jobs[i].m->w[jobs[i].j]);
    return atomic_load(&pc.failed) ? -1 : 0;
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Size the arena, allocate it once and point the layer's tables into it. */
static int carve_arena(moe_layer *l, ep_err *err)
{
    size_t H = (size_t)l->H, E = (size_t)l->E;
    size_t sz_norm = align64(H * sizeof(uint16_t));
    size_t sz_gate = align64(route_gate_bytes(l->impl, l->E, l->H));
    size_t sz_bias = l->hash ? 0 : align64(E * sizeof(float));
    size_t sz_tid =
        l->hash ? align64((size_t)l->cfg.vocab_size * (size_t)l->k * sizeof(int64_t)) : 0;
    size_t sz_owned = align64(E);
    size_t sz_experts = align64(E * sizeof(moe_mlp *));
    l->arena_bytes = sz_norm + sz_gate + sz_bias + sz_tid + sz_owned + sz_experts;
    if (posix_memalign(&l->arena, 64, l->arena_bytes) != 0) {
        l->arena = NULL;
        return ep_err_set(err, "%s: out of memory for a %zu-byte weight arena", l->name,
                          l->arena_bytes);
    }
    memset(l->arena, 0, l->arena_bytes);
    uint8_t *p = l->arena;
    l->norm = (uint16_t *)p;
    p += sz_norm;
    l->gate = p;
    p += sz_gate;
    l->bias = sz_bias ? (float *)p : NULL;
    p += sz_bias;
    l->tid2eid = sz_tid ? (int64_t *)p : NULL;
    p += sz_tid;
    l->owned = p;
    p += sz_owned;
    l->experts = (moe_mlp **)p;
    return 0;
}

static int build_router(moe_layer *l, const mb_layer_src *src, build_ctx *bc, ep_err *err)
{
    size_t H = (size_t)l->H, E = (size_t)l->E;
    if (!src->norm || !src->gate || (l->hash ? !src->tid2eid : !src->bias))
        return ep_err_set(err, "%s: ffn_norm, gate weight or %s missing", l->name,
                          l->hash ? "tid2eid" : "gate bias");
    memcpy(l->norm, src->norm, H * sizeof(uint16_t));
    /* The mapping may not be 2-byte aligned; pack from an aligned copy. */
    uint16_t *w = malloc(E * H * sizeof(uint16_t));
    if (!w)
        return ep_err_set(err, "%s: out of memory for the gate weight", l->name);
    memcpy(w, src->gate, E * H * sizeof(uint16_t));
    route_gate_pack(l->impl, l->E, l->H, w, l->gate);
    free(w);
    uint64_t bytes = (H + E * H) * sizeof(uint16_t);
    if (l->hash) {
        size_t n = (size_t)l->cfg.vocab_size * (size_t)l->k;
        memcpy(l->tid2eid, src->tid2eid, n * sizeof(int64_t));
        bytes += n * sizeof(int64_t);
    } else {
        memcpy(l->bias, src->bias, E * sizeof(float));
        bytes += E * sizeof(float);
    }
    build_progress(bc, bytes, 0);
    return 0;
}

/* Take what reuse holds, and queue the rest (the shared expert and each wanted expert) for
 * pack_all; jobs has room for 3 * (E + 1). */
static int plan_experts(moe_layer *l, const mb_layer_src *src, const uint8_t *want,
                        moe_layer *reuse, pack_job *jobs, int *n_jobs, ep_err *err)
{
    int n = 0;
    if (reuse && reuse->shared) {
        l->shared = mlp_ref(reuse->shared);
    } else {
        if (!(l->shared = mlp_new(err)))
            return -1;
        for (int j = 0; j < 3; j++)
            jobs[n++] = (pack_job){l->shared, j, &src->shared[j]};
    }
    for (int e = 0; e < l->E; e++) {
        const mb_linear *t = src->experts ? &src->experts[(size_t)e * 3] : NULL;
        bool w = want ? want[e] != 0 : (t && t[0].w != NULL);
        if (!w)
            continue;
        if (reuse && reuse->experts[e]) {
            l->experts[e] = mlp_ref(reuse->experts[e]);
        } else if (!t) {
            *n_jobs = n;
            return ep_err_set(err, "%s: expert %d wanted but not given", l->name, e);
        } else {
            if (!(l->experts[e] = mlp_new(err))) {
                *n_jobs = n;
                return -1;
            }
            for (int j = 0; j < 3; j++)
                jobs[n++] = (pack_job){l->experts[e], j, &t[j]};
        }
        l->owned[e] = 1;
    }
    *n_jobs = n;
    return 0;
}

static int build_experts(moe_layer *l, const mb_layer_src *src, const uint8_t *want,
                         moe_layer *reuse, build_ctx *bc, tpool *pool, ep_err *err)
{
    pack_job *jobs = malloc(3 * ((size_t)l->E + 1) * sizeof *jobs);
    if (!jobs)
        return ep_err_set(err, "%s: out of memory", l->name);
    int n = 0;
    int rc = plan_experts(l, src, want, reuse, jobs, &n, err);
    if (rc == 0)
        rc = pack_all(jobs, n, l->impl, bc, pool, err);
    free(jobs);
    return rc;
}

static int check_reuse(const moe_layer *l, const moe_layer *reuse, ep_err *err)
{
    if (reuse == NULL)
        return 0;
    if (reuse->layer != l->layer || reuse->impl != l->impl || reuse->H != l->H ||
        reuse->I != l->I || reuse->E != l->E || reuse->cfg.expert_dtype != l->cfg.expert_dtype)
        return ep_err_set(err,
                          "%s: the layer to reuse experts from (%s) has another shape, "
                          "dtype or kernel set",
                          l->name, reuse->name);
    return 0;
}

moe_layer *moe_layer_build(const mc_config *c, const mb_layer_src *src, const uint8_t *want,
                           moe_layer *reuse, isa_level impl, tpool *pool, mb_progress_fn progress,
                           void *progress_ctx, ep_err *err)
{
    if (mc_validate(c, err) < 0)
        return NULL;
    if (src->layer < 0 || src->layer >= mc_num_layers(c)) {
        ep_err_set(err, "layer %d outside [0, %d)", src->layer, mc_num_layers(c));
        return NULL;
    }
    if (impl == ISA_AUTO)
        impl = isa_best();
    moe_layer *l = calloc(1, sizeof *l);
    if (!l) {
        ep_err_set(err, "out of memory for a layer");
        return NULL;
    }
    l->cfg = *c;
    l->layer = src->layer;
    l->hash = mc_layer_is_hash(c, src->layer);
    l->impl = impl;
    l->H = c->hidden_size;
    l->I = c->moe_intermediate_size;
    l->E = c->n_routed_experts;
    l->k = c->num_experts_per_tok;
    snprintf(l->name, sizeof l->name, "%s", src->name ? src->name : "layer");
    build_ctx bc = {.progress = progress, .progress_ctx = progress_ctx};
    atomic_init(&bc.done, 0);
    if (check_reuse(l, reuse, err) < 0 || carve_arena(l, err) < 0 ||
        build_router(l, src, &bc, err) < 0 ||
        build_experts(l, src, want, reuse, &bc, pool, err) < 0)
        goto fail;
    if (progress)
        progress(progress_ctx, atomic_load(&bc.done));
    return l;
fail:
    ep_err_prefix(err, "loading %s", l->name);
    moe_layer_free(&l);
    return NULL;
}

void moe_layer_free(moe_layer **self_p)
{
    if (!self_p || !*self_p)
        return;
    moe_layer *l = *self_p;
    mlp_unref(&l->shared);
    if (l->experts)
        for (int e = 0; e < l->E; e++)
            mlp_unref(&l->experts[e]);
    free(l->arena);
    free(l);
    *self_p = NULL;
}

size_t moe_layer_bytes(const moe_layer *l)
{
    size_t n = l->arena_bytes + (l->shared ? l->shared->bytes : 0);
    for (int e = 0; e < l->E; e++)
        if (l->experts[e])
            n += l->experts[e]->bytes;
    return n;
}

const mc_config *moe_layer_config(const moe_layer *l)
{
    return &l->cfg;
}

int moe_layer_index(const moe_layer *l)
{
    return l->layer;
}

int moe_layer_owns(const moe_layer *l, int expert)
{
    return expert >= 0 && expert < l->E && l->owned[expert];
}

/* ---- routing ---- */

static int check_tokens(const moe_layer *l, int T, ep_err *err)
{
    if (T < 0 || T > EP_MAX_TOKENS)
        return ep_err_set(err, "%s: %d tokens, expected 0..%d", l->name, T, EP_MAX_TOKENS);
    return 0;
}

/* What routing needs besides the token count: a hash-routed layer routes by token id. */
static int check_route_input(const moe_layer *l, int T, const int64_t *ids, ep_err *err)
{
    if (check_tokens(l, T, err) < 0)
        return -1;
    if (T > 0 && l->hash && !ids)
        return ep_err_set(err, "%s is hash-routed (tid2eid): token ids are required", l->name);
    return 0;
}

int moe_route(const moe_layer *l, int T, const uint16_t *x, const int64_t *ids, uint16_t *xn,
              int32_t *topk_ids, float *topk_w, tpool *pool, ep_err *err)
{
    if (check_route_input(l, T, ids, err) < 0)
        return -1;
    if (T == 0)
        return 0;
    /* Hash lookups first: a bad token id fails before any arithmetic. */
    if (l->hash && route_hash(T, l->k, l->E, l->cfg.vocab_size, ids, l->tid2eid, topk_ids, err) < 0)
        return ep_err_prefix(err, "%s", l->name);
    float *scores = malloc((size_t)T * (size_t)l->E * sizeof(float));
    if (!scores)
        return ep_err_set(err, "%s: out of memory for %d x %d gate scores", l->name, T, l->E);
    route_rmsnorm(l->impl, T, l->H, x, l->norm, l->cfg.rms_norm_eps, xn);
    route_logits(l->impl, T, l->H, l->E, xn, l->gate, scores, pool);
    route_scores(T * l->E, scores, scores);
    if (!l->hash)
        route_topk(l->impl, T, l->E, l->k, scores, l->bias, topk_ids);
    route_weights(T, l->E, l->k, scores, topk_ids, l->cfg.norm_topk_prob,
                  l->cfg.routed_scaling_factor, topk_w);
    free(scores);
    return 0;
}

void moe_quant(const moe_layer *l, int T, const uint16_t *xn, uint8_t *q, float *qs)
{
    if (T > 0)
        qt_act_rows(xn, T, l->H, l->cfg.act_ue8m0, q, qs);
}

/* ---- the expert MLP ---- */

/* Scratch for up to MOE_GEMM_ROWS rows of one expert MLP. */
typedef struct mlp_scratch {
    uint8_t *aq; /* [R, H] gathered input codes */
    float *aqs;  /* [R, H/128] */
    float *acc1; /* [R, I] */
    float *acc3; /* [R, I] */
    float *wrow; /* [R] */
    uint8_t *hq; /* [R, I] */
    float *hqs;  /* [R, I/128] */
    float *o;    /* [R, H] */
} mlp_scratch;

static int scratch_alloc(const moe_layer *l, int rows, mlp_scratch *s, ep_err *err)
{
    size_t R = (size_t)rows, H = (size_t)l->H, I = (size_t)l->I;
    memset(s, 0, sizeof *s);
    s->aq = malloc(R * H);
    s->aqs = malloc(R * (H / EP_FP8_BLOCK) * sizeof(float));
    s->acc1 = malloc(R * I * sizeof(float));
    s->acc3 = malloc(R * I * sizeof(float));
    s->wrow = malloc(R * sizeof(float));
    s->hq = malloc(R * I);
    s->hqs = malloc(R * (I / EP_FP8_BLOCK) * sizeof(float));
    s->o = malloc(R * H * sizeof(float));
    if (!s->aq || !s->aqs || !s->acc1 || !s->acc3 || !s->wrow || !s->hq || !s->hqs || !s->o)
        return ep_err_set(err, "%s: out of memory for expert scratch (%d rows)", l->name, rows);
    return 0;
}

static void scratch_free(mlp_scratch *s)
{
    free(s->aq);
    free(s->aqs);
    free(s->acc1);
    free(s->acc3);
    free(s->wrow);
    free(s->hq);
    free(s->hqs);
    free(s->o);
}

/* One expert's rows within a batch: rows [row0, row0 + M) of the scratch. */
typedef struct mlp_piece {
    gemm_weight *const *w; /* w1, w3, w2 */
    int row0, M;
} mlp_piece;

/* Pieces of one batch at most (besides MOE_GEMM_ROWS rows). */
#define MOE_BATCH_PIECES 64
/* Rows per SwiGLU / output-rounding task of the pool. */
#define MOE_ROW_TASK 4

typedef struct rows_task {
    const moe_layer *l;
    mlp_scratch *s;
    int R;
    const float *wrow;
    /* rounding: row r of s->o goes to out + dst[r] * H (dst NULL: row r) */
    uint16_t *out;
    const uint32_t *dst;
} rows_task;

static void swiglu_task(void *ctx, int i, int tid)
{
    rows_task *t = ctx;
    const moe_layer *l = t->l;
    int r0 = i * MOE_ROW_TASK, n = t->R - r0 < MOE_ROW_TASK ? t->R - r0 : MOE_ROW_TASK;
    size_t I = (size_t)l->I;
    swiglu_rows(t->s->acc1 + r0 * I, t->s->acc3 + r0 * I, n, l->I, t->wrow ? t->wrow + r0 : NULL,
                l->cfg.swiglu_limit, l->cfg.act_ue8m0, t->s->hq + r0 * I,
                t->s->hqs + r0 * (I / EP_FP8_BLOCK));
}

static void round_task(void *ctx, int i, int tid)
{
    rows_task *t = ctx;
    size_t H = (size_t)t->l->H;
    for (int r = i * MOE_ROW_TASK; r < t->R && r < (i + 1) * MOE_ROW_TASK; r++)
        qt_f32_to_bf16_n(t->l->impl, t->s->o + r * H, H,
                         t->out + (t->dst ? t->dst[r] : (uint32_t)r) * H);
}

/* The expert MLPs of np pieces whose R rows are gathered into s->aq / s->aqs, in three
 * parallel passes: w1 and w3 of every piece, SwiGLU (weights wrow, or 1.0 when NULL) of every
 * row, w2 of every piece. fp32 results in s->o [R, H]. */
static void mlp_batch(const moe_layer *l, const mlp_piece *pc, int np, int R, const float *wrow,
                      mlp_scratch *s, tpool *pool)
{
    size_t H = (size_t)l->H, I = (size_t)l->I;
    gemm_job jobs[2 * MOE_BATCH_PIECES] = {{0}};
    for (int i = 0; i < np; i++) {
        size_t r = (size_t)pc[i].row0;
        const uint8_t *a = s->aq + r * H;
        const float *as = s->aqs + r * (H / EP_FP8_BLOCK);
        jobs[2 * i] = (gemm_job){pc[i].w[W1], pc[i].M, a, as, s->acc1 + r * I};
        jobs[2 * i + 1] = (gemm_job){pc[i].w[W3], pc[i].M, a, as, s->acc3 + r * I};
    }
    gemm_run_many(jobs, 2 * np, pool);
    rows_task t = {.l = l, .s = s, .R = R, .wrow = wrow};
    tpool_for(pool, (R + MOE_ROW_TASK - 1) / MOE_ROW_TASK, swiglu_task, &t);
    for (int i = 0; i < np; i++) {
        size_t r = (size_t)pc[i].row0;
        jobs[i] = (gemm_job){pc[i].w[W2], pc[i].M, s->hq + r * I, s->hqs + r * (I / EP_FP8_BLOCK),
                             s->o + r * H};
    }
    gemm_run_many(jobs, np, pool);
}

/* bf16 rounding of the batch's R result rows, row r to out row dst[r] (dst NULL: r). */
static void round_rows(const moe_layer *l, mlp_scratch *s, int R, uint16_t *out,
                       const uint32_t *dst, tpool *pool)
{
    rows_task t = {.l = l, .s = s, .R = R, .out = out, .dst = dst};
    tpool_for(pool, (R + MOE_ROW_TASK - 1) / MOE_ROW_TASK, round_task, &t);
}

/* Group the pairs by expert, keeping their order within an expert (counting sort): the pairs
 * of expert e are order[start[e] .. start[e+1]). Expert E is the shared expert (moe_forward). */
static int group_pairs(const moe_layer *l, int n_pairs, const uint32_t *pair_expert,
                       uint32_t *start, uint32_t *order, ep_err *err)
{
    int E = l->E + 1;
    uint32_t *fill = calloc((size_t)E, sizeof *fill);
    if (!fill)
        return ep_err_set(err, "%s: out of memory grouping %d pairs", l->name, n_pairs);
    for (int p = 0; p < n_pairs; p++)
        start[pair_expert[p] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    for (int p = 0; p < n_pairs; p++) {
        uint32_t e = pair_expert[p];
        order[start[e] + fill[e]++] = (uint32_t)p;
    }
    free(fill);
    return 0;
}

/* All experts' pairs in batches of at most MOE_GEMM_ROWS rows and MOE_BATCH_PIECES pieces (an
 * expert with more rows is cut into pieces), each batch as one mlp_batch: the one-token experts
 * of a decode step run as one parallel pass instead of one call each. The shared expert's pairs
 * (expert E; moe_forward only) go first, so its compute-bound GEMMs share passes with the
 * memory-bound small experts. */
static void experts_batched(const moe_layer *l, const uint8_t *q, const float *qs,
                            const uint32_t *pair_row, const float *pair_w, const uint32_t *start,
                            const uint32_t *order, uint16_t *out, mlp_scratch *s, uint32_t *dst,
                            tpool *pool)
{
    size_t H = (size_t)l->H, nb = H / EP_FP8_BLOCK;
    mlp_piece pc[MOE_BATCH_PIECES];
    int np = 0, R = 0;
    for (int i = 0; i <= l->E + 1; i++) {
        int e = i == 0 ? l->E : i - 1, last = i == l->E + 1;
        uint32_t c0 = last ? 0 : start[e], c1 = last ? 0 : start[e + 1];
        while (c0 < c1 || (last && R > 0)) {
            int M = (int)(c1 - c0);
            if (M > MOE_GEMM_ROWS - R)
                M = MOE_GEMM_ROWS - R;
            if (M > 0) {
                for (int m = 0; m < M; m++) {
                    uint32_t p = order[c0 + m];
                    memcpy(s->aq + (size_t)(R + m) * H, q + pair_row[p] * H, H);
                    memcpy(s->aqs + (size_t)(R + m) * nb, qs + pair_row[p] * nb,
                           nb * sizeof(float));
                    s->wrow[R + m] = pair_w[p];
                    dst[R + m] = p;
                }
                pc[np++] = (mlp_piece){e == l->E ? l->shared->w : l->experts[e]->w, R, M};
                R += M;
                c0 += (uint32_t)M;
            }
            if (R == MOE_GEMM_ROWS || np == MOE_BATCH_PIECES || (last && R > 0)) {
                mlp_batch(l, pc, np, R, s->wrow, s, pool);
                round_rows(l, s, R, out, dst, pool);
                np = R = 0;
            }
        }
    }
}

/* moe_experts on checked pairs; pair_expert E means the shared expert (with pair_w 1). */
static int experts_run(const moe_layer *l, const uint8_t *q, const float *qs, int n_pairs,
                       const uint32_t *pair_row, const uint32_t *pair_expert, const float *pair_w,
                       uint16_t *out, tpool *pool, ep_err *err)
{
    if (n_pairs == 0)
        return 0;
    uint32_t *start = calloc((size_t)l->E + 2, sizeof *start);
    uint32_t *order = malloc((size_t)n_pairs * sizeof *order);
    uint32_t *dst = malloc(MOE_GEMM_ROWS * sizeof *dst);
    mlp_scratch s;
    memset(&s, 0, sizeof s);
    int rows = n_pairs < MOE_GEMM_ROWS ? n_pairs : MOE_GEMM_ROWS;
    int rc = -1;
    if (!start || !order || !dst) {
        ep_err_set(err, "%s: out of memory grouping %d pairs", l->name, n_pairs);
        goto out;
    }
    if (scratch_alloc(l, rows, &s, err) < 0 ||
        group_pairs(l, n_pairs, pair_expert, start, order, err) < 0)
        goto out;
    experts_batched(l, q, qs, pair_row, pair_w, start, order, out, &s, dst, pool);
    rc = 0;
out:
    scratch_free(&s);
    free(start);
    free(order);
    free(dst);
    return rc;
}

int moe_experts(const moe_layer *l, int n_rows, const uint8_t *q, const float *qs, int n_pairs,
                const uint32_t *pair_row, const uint32_t *pair_expert, const float *pair_w,
                uint16_t *out, tpool *pool, ep_err *err)
{
    if (n_rows < 0 || n_pairs < 0)
        return ep_err_set(err, "%s: moe_experts: %d rows, %d pairs", l->name, n_rows, n_pairs);
    for (int p = 0; p < n_pairs; p++) {
        if (pair_row[p] >= (uint32_t)n_rows)
            return ep_err_set(err, "%s: pair %d: row %" PRIu32 " outside [0, %d)", l->name, p,
                              pair_row[p], n_rows);
        if (pair_expert[p] >= (uint32_t)l->E || !l->owned[pair_expert[p]])
            return ep_err_set(err, "%s: pair %d: expert %" PRIu32 " is not loaded here", l->name, p,
                              pair_expert[p]);
    }
    return experts_run(l, q, qs, n_pairs, pair_row, pair_expert, pair_w, out, pool, err);
}

int moe_shared(const moe_layer *l, int T, const uint8_t *q, const float *qs, uint16_t *out,
               tpool *pool, ep_err *err)
{
    if (check_tokens(l, T, err) < 0)
        return -1;
    if (T == 0)
        return 0;
    mlp_scratch s;
    int rows = T < MOE_GEMM_ROWS ? T : MOE_GEMM_ROWS;
    if (scratch_alloc(l, rows, &s, err) < 0) {
        scratch_free(&s);
        return -1;
    }
    size_t H = (size_t)l->H, nb = H / EP_FP8_BLOCK;
    for (int t0 = 0; t0 < T; t0 += MOE_GEMM_ROWS) {
        int M = T - t0 < MOE_GEMM_ROWS ? T - t0 : MOE_GEMM_ROWS;
        memcpy(s.aq, q + t0 * H, M * H);
        memcpy(s.aqs, qs + t0 * nb, M * nb * sizeof(float));
        mlp_piece pc = {l->shared->w, 0, M};
        mlp_batch(l, &pc, 1, M, NULL, &s, pool);
        round_rows(l, &s, M, out + (size_t)t0 * H, NULL, pool);
    }
    scratch_free(&s);
    return 0;
}

/* ---- combine ---- */

void moe_combine(int T, int k, int H, const int32_t *topk_ids, const uint16_t *eo,
                 const uint16_t *shared, uint16_t *out)
{
    for (int t = 0; t < T; t++) {
        const int32_t *ids = topk_ids + (size_t)t * k;
        int slot[MC_MAX_TOPK];
        int n = co_slots(ids, k, MC_MAX_TOPK, slot);
        const uint16_t *rows[MC_MAX_TOPK];
        for (int i = 0; i < n; i++)
            rows[i] = eo + ((size_t)t * k + (size_t)slot[i]) * H;
        qt_sum_bf16_rows(ISA_AUTO, rows, n, shared + (size_t)t * H, H, out + (size_t)t * H);
    }
}

/* ---- the whole layer ---- */

typedef struct fwd_bufs {
    uint16_t *xn, *eo;
    uint8_t *q;
    float *qs, *pw;
    uint32_t *prow, *pexp;
} fwd_bufs;

static void fwd_free(fwd_bufs *b)
{
    free(b->xn);
    free(b->eo);
    free(b->q);
    free(b->qs);
    free(b->pw);
    free(b->prow);
    free(b->pexp);
}

static int fwd_piece(const moe_layer *l, int T, const uint16_t *x, const int64_t *ids,
                     uint16_t *out, int32_t *topk_ids, float *topk_w, fwd_bufs *b, tpool *pool,
                     ep_err *err)
{
    size_t k = (size_t)l->k;
    if (moe_route(l, T, x, ids, b->xn, topk_ids, topk_w, pool, err) < 0)
        return -1;
    moe_quant(l, T, b->xn, b->q, b->qs);
    /* One pair per slot, in (token, slot) order, so the experts write the output of slot
     * (t, j) to row t * k + j of eo; then one pair per token for the shared expert (expert E,
     * weight 1: SwiGLU multiplies by it exactly), whose rows follow: the routed and the shared
     * experts run in the same passes. moe_route never leaves a slot empty (-1), and routes only
     * to experts this layer owns (checked: the caller must own every expert). */
    int n = T * (int)k;
    for (int i = 0; i < n; i++) {
        if (topk_ids[i] < 0 || topk_ids[i] >= l->E || !l->owned[topk_ids[i]])
            return ep_err_set(err, "%s: token %d routes to expert %d, which is not loaded here",
                              l->name, i / (int)k, topk_ids[i]);
        b->prow[i] = (uint32_t)(i / (int)k);
        b->pexp[i] = (uint32_t)topk_ids[i];
        b->pw[i] = topk_w[i];
    }
    for (int t = 0; t < T; t++) {
        b->prow[n + t] = (uint32_t)t;
        b->pexp[n + t] = (uint32_t)l->E;
        b->pw[n + t] = 1.0f;
    }
    if (experts_run(l, b->q, b->qs, n + T, b->prow, b->pexp, b->pw, b->eo, pool, err) < 0)
        return -1;
    moe_combine(T, l->k, l->H, topk_ids, b->eo, b->eo + (size_t)n * l->H, out);
    return 0;
}

int moe_forward(const moe_layer *l, int T, const uint16_t *x, const int64_t *ids, uint16_t *out,
                int32_t *topk_ids, float *topk_w, tpool *pool, ep_err *err)
{
    if (check_route_input(l, T, ids, err) < 0)
        return -1;
    if (T == 0)
        return 0;
    size_t P = (size_t)(T < MOE_FORWARD_TOKENS ? T : MOE_FORWARD_TOKENS);
    size_t H = (size_t)l->H, k = (size_t)l->k;
    fwd_bufs b = {
        .xn = malloc(P * H * sizeof(uint16_t)),
        .eo = malloc(P * (k + 1) * H * sizeof(uint16_t)), /* routed slots, then shared rows */
        .q = malloc(P * H),
        .qs = malloc(P * (H / EP_FP8_BLOCK) * sizeof(float)),
        .pw = malloc(P * (k + 1) * sizeof(float)),
        .prow = malloc(P * (k + 1) * sizeof(uint32_t)),
        .pexp = malloc(P * (k + 1) * sizeof(uint32_t)),
    };
    int rc = 0;
    if (!b.xn || !b.eo || !b.q || !b.qs || !b.pw || !b.prow || !b.pexp) {
        rc = ep_err_set(err, "%s: out of memory for %zu tokens", l->name, P);
    } else {
        for (int t0 = 0; t0 < T && rc == 0; t0 += (int)P) {
            int n = T - t0 < (int)P ? T - t0 : (int)P;
            rc = fwd_piece(l, n, x + (size_t)t0 * H, ids ? ids + t0 : NULL, out + (size_t)t0 * H,
                           topk_ids + (size_t)t0 * k, topk_w + (size_t)t0 * k, &b, pool, err);
        }
    }
    fwd_free(&b);
    return rc;
}
