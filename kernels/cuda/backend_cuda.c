/*
 * backend_cuda.c — the CUDA backend behind kernels/moe_backend.h and kernels/cuda/cuda_step.h:
 * the host half (plain C). Every device action goes through a cudev_ops table (cuda_dev.h), so
 * this file builds and is tested without a GPU (tests/unit/test_cuda_host.c puts the CPU
 * reference behind the table).
 *
 * Memory:
 *   - weights: one device arena per placement (mb_reserve: one allocation, carved per tensor,
 *     256-byte aligned), reference-counted by the layers carved from it, so a new placement's
 *     arena can fill while the old one still serves. A layer loaded without a reservation gets
 *     an arena of its own. FP8 weight scales are stored as f32 (E8M0 decoded on the host),
 *     MXFP4 scales as their E8M0 bytes, the gate transposed to [H, E].
 *   - step buffers: one set, sized at mb_reserve for CU_STEP_TOKENS tokens and CU_PAIR_CHUNK
 *     expert rows per pass; bigger requests run in chunks of that size.
 *   - pinned host staging: loads copy each tensor from the (pageable) mapping into one of two
 *     pinned buffers and upload it asynchronously, so reading tensor i+1 overlaps the copy of
 *     tensor i; steps stage their inputs and outputs through one pinned buffer.
 *
 * Numerics: every kernel is the CPU reference's arithmetic (cuda_dev.h). Two parts of a step
 * stay on the host because their bits are the C library's: the scores (log1pf, expf of fp32
 * logits; computed from the device's exact logits) and the SiLU's expf, which reaches the
 * device as a table over every bf16 input (the gate value is bf16 by the time SiLU sees it).
 *
 * Waiting: the host waits for the stream only where results come back, by polling with a
 * deadline (CU_WAIT_S): a kernel or copy that never finishes is a step error, not a hang.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/limits.h"
#include "kernels/backend_internal.h"
#include "kernels/pool.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_step.h"
#include "kernels/formats.h"
#include "kernels/mathf.h"
#include "kernels/route.h"

/* Tokens per route/combine pass and expert rows per MLP pass: bound the step buffers (about
 * 1.5 GB at V4-Flash sizes) whatever a request holds. */
#define CU_STEP_TOKENS 8192
#define CU_PAIR_CHUNK  16384
/* Each of the two pinned load-staging buffers (EPMOE_CUDA_STAGE_BYTES overrides it, for tests). */
#define CU_STAGE_BYTES (32u << 20)
/* Carving alignment (cudaMalloc's own is 256). */
#define CU_ALIGN 256
/* Longest wait for the device to finish what was queued; longer is a hung device
 * (EPMOE_CUDA_WAIT_S overrides it, for tests). */
#define CU_WAIT_S 120.0
/* Device memory kept free beyond the reservation (CUDA context, cuBLASLt workspace, NCCL). */
#define CU_MEM_MARGIN (512ull << 20)

typedef struct cu_arena {
    atomic_int refs;
    const cudev_ops *ops;
    cudev *d;
    uint8_t *base;
    size_t size, used;
} cu_arena;

/* Device pointers of one expert MLP (w1, w3, w2 and their scales). */
typedef struct cu_mlp {
    const uint8_t *w[3];
    const void *s[3];
} cu_mlp;

/* The step buffers (device) and the staging buffer (pinned host). */
typedef struct cu_bufs {
    int C, P; /* tokens per pass, expert rows per pass; 0: not allocated */
    int H, I, E, k;
    void *dev;    /* one allocation, carved */
    void *pinned; /* one allocation */
    size_t pinned_bytes;
    /* route pass */
    uint16_t *x, *xn, *shared, *eo, *out;
    float *logits, *qs;
    uint8_t *q;
    int32_t *topk;
    /* MLP pass */
    uint8_t *a, *hq;
    float *as, *w, *acc1, *acc3, *hqs;
    uint32_t *rowidx, *outrow;
    uint16_t *mo;
    cudev_group *g13, *g2;
} cu_bufs;

typedef struct cuda_backend {
    mb_backend base;
    const cudev_ops *ops;
    cudev *d;
    mb_device_info info;
    mb_gemm_mode gemm;
    tpool *pool;      /* host threads: scores */
    cu_arena *arena;  /* where the next layers are carved from */
    float *exp_table; /* device [65536] */
    float *h_exp_table;
    cu_bufs b;
    void *stage[2]; /* pinned, stage_bytes each, for loading */
    size_t stage_bytes;
    double wait_s;
    bool step_busy; /* the step buffers belong to an open step */
} cuda_backend;

typedef struct cuda_layer {
    mb_layer base;
    cu_arena *arena;
    mc_config cfg;
    char name[32];
    bool hash;
    int H, I, E, k;
    mb_wformat fmt;          /* routed experts */
    uint16_t *norm, *gate_t; /* device */
    float *h_bias;           /* host [E] */
    int64_t *h_tid2eid;      /* host [vocab, k] */
    uint8_t *owned;          /* host [E] */
    cu_mlp *experts;         /* host table of device pointers [E] */
    cu_mlp shared;
    uint64_t bytes;
    float exp_neg_limit;
} cuda_layer;

typedef struct cuda_step {
    mb_step base;
    const cuda_layer *l;
    int T;
    bool resident; /* T <= C: q/qs/shared stay in the step buffers */
    bool own_bufs; /* the backend's buffers were busy: these are the step's own */
    cu_bufs *bufs; /* the buffers this step uses */
    cu_bufs own;
    const uint8_t *h_q; /* the caller's, for the chunked path */
    const float *h_qs;
    const int32_t *topk_ids;
    bool shared_done;
    uint16_t *h_shared; /* chunked path: bf16 [T, H] */
} cuda_step;

static cuda_backend *cb(mb_backend *be)
{
    return (cuda_backend *)be;
}

static const cuda_layer *cl(const mb_layer *l)
{
    return (const cuda_layer *)l;
}

static size_t cu_align(size_t n)
{
    return (n + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN;
}

/* Wait for the stream until deadline: 0, or -1 naming the timeout or the device error. */
/* Poll the stream until it drains or deadline passes. The first CU_SPIN_S seconds poll
 * without sleeping: a step's waits are tens to hundreds of microseconds, and a sleep costs more
 * than that in timer slack; longer waits (loading, huge steps) poll every 100 us. */
#define CU_SPIN_S 0.01
static int cu_wait_until(const cudev_ops *ops, cudev *d, double deadline, ep_err *err)
{
    struct timespec nap = {0, 100000};
    double spin_end = clk_mono_s() + CU_SPIN_S;
    for (;;) {
        int q = ops->query(d, err);
        if (q <= 0)
            return q;
        double now = clk_mono_s();
        if (now > deadline)
            return ep_err_set(err, "the device did not finish its queued work in time");
        if (now > spin_end)
            nanosleep(&nap, NULL);
    }
}

static int cu_wait(cuda_backend *b, ep_err *err)
{
    return cu_wait_until(b->ops, b->d, clk_mono_s() + b->wait_s, err);
}

/* ---- sizes ------------------------------------------------------------------------------- */

static size_t linear_bytes(mb_wformat f, size_t N, size_t K)
{
    if (f == MB_W_MXFP4)
        return cu_align(N * K / 2) + cu_align(N * (K / EP_MXFP4_GROUP));
    return cu_align(N * K) + cu_align((N / EP_FP8_BLOCK) * (K / EP_FP8_BLOCK) * sizeof(float));
}

static size_t mlp_bytes(mb_wformat f, size_t H, size_t I)
{
    return 2 * linear_bytes(f, I, H) + linear_bytes(f, H, I);
}

static uint64_t cuda_layer_footprint(const mb_backend *be, const mc_config *c, int n_experts)
{
    size_t H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    size_t E = (size_t)c->n_routed_experts;
    mb_wformat f = c->expert_dtype == MC_FP4 ? MB_W_MXFP4 : MB_W_FP8;
    return cu_align(H * 2) + cu_align(E * H * 2) + mlp_bytes(MB_W_FP8, H, I) +
           (uint64_t)n_experts * mlp_bytes(f, H, I);
}

/* The step buffers' layout for C tokens and P rows (sizes only when base is NULL). */
static size_t bufs_layout(cu_bufs *s, uint8_t *base)
{
    size_t C = (size_t)s->C, P = (size_t)s->P, H = (size_t)s->H, I = (size_t)s->I;
    size_t E = (size_t)s->E, k = (size_t)s->k, off = 0;
#define CARVE(field, bytes)                                                                        \
    do {                                                                                           \
        if (base)                                                                                  \
            s->field = (void *)(base + off);                                                       \
        off += cu_align(bytes);                                                                    \
    } while (0)
    CARVE(x, C * H * 2);
    CARVE(xn, C * H * 2);
    CARVE(shared, C * H * 2);
    CARVE(eo, C * k * H * 2);
    CARVE(out, C * H * 2);
    CARVE(logits, C * E * 4);
    CARVE(q, C * H);
    CARVE(qs, C * (H / EP_FP8_BLOCK) * 4);
    CARVE(topk, C * k * 4);
    CARVE(a, P * H);
    CARVE(as, P * (H / EP_FP8_BLOCK) * 4);
    CARVE(w, P * 4);
    CARVE(rowidx, P * 4);
    CARVE(outrow, P * 4);
    CARVE(acc1, P * I * 4 * 2); /* [P, 2I]: w1's outputs, then w3's, per row (acc3 = acc1 + I) */
    if (base)
        s->acc3 = s->acc1 + I;
    CARVE(hq, P * I);
    CARVE(hqs, P * (I / EP_FP8_BLOCK) * 4);
    CARVE(mo, P * H * 2);
    CARVE(g13, (E + 1) * sizeof(cudev_group));
    CARVE(g2, (E + 1) * sizeof(cudev_group));
#undef CARVE
    return off;
}

/* The small tables of an MLP pass (groups, gather and output rows, weights) and the shared
 * expert's two groups, kept after the big region of the pinned buffer so that filling one never
 * overwrites what an upload still in the stream has to read. */
static size_t tables_bytes(const cu_bufs *s)
{
    size_t E1 = (size_t)s->E + 1, P = (size_t)s->P;
    return cu_align(2 * E1 * sizeof(cudev_group)) + 3 * cu_align(P * 4) +
           cu_align(2 * sizeof(cudev_group));
}

/* Pinned staging for one pass: the largest of what a pass moves each way (the big region),
 * then the tables. */
static size_t bufs_big_bytes(const cu_bufs *s)
{
    size_t C = (size_t)s->C, P = (size_t)s->P, H = (size_t)s->H, E = (size_t)s->E;
    size_t k = (size_t)s->k, SC = H / EP_FP8_BLOCK;
    size_t route_in = C * H * 2;
    size_t route_out = C * E * 4 + C * H + C * SC * 4 + C * H * 2;
    size_t comb_in = C * k * H * 2 + C * k * 4 + C * H * 2;
    size_t mlp_in = P * H + P * SC * 4;
    size_t mlp_out = P * H * 2;
    size_t m = route_in;
    m = m > route_out ? m : route_out;
    m = m > comb_in ? m : comb_in;
    m = m > mlp_in ? m : mlp_in;
    m = m > mlp_out ? m : mlp_out;
    return cu_align(m + 4 * CU_ALIGN);
}

static size_t bufs_pinned_bytes(const cu_bufs *s)
{
    return bufs_big_bytes(s) + tables_bytes(s);
}

static uint64_t bufs_bytes(const mc_config *c, int max_tokens)
{
    cu_bufs s = {.C = max_tokens < CU_STEP_TOKENS ? (max_tokens > 0 ? max_tokens : 1)
                                                  : CU_STEP_TOKENS,
                 .H = c->hidden_size,
                 .I = c->moe_intermediate_size,
                 .E = c->n_routed_experts,
                 .k = c->num_experts_per_tok};
    s.P = s.C * s.k < CU_PAIR_CHUNK ? s.C * s.k : CU_PAIR_CHUNK;
    return bufs_layout(&s, NULL);
}

static uint64_t cuda_step_footprint(const mb_backend *be, const mc_config *c, int max_tokens)
{
    return bufs_bytes(c, max_tokens) + 65536 * sizeof(float);
}

/* ---- arenas ------------------------------------------------------------------------------ */

static void arena_unref(cu_arena **a_p)
{
    cu_arena *a = *a_p;
    *a_p = NULL;
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        a->ops->free(a->d, a->base);
        free(a);
    }
}

static cu_arena *arena_new(cuda_backend *b, size_t bytes, ep_err *err)
{
    cu_arena *a = calloc(1, sizeof *a);
    if (!a) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    atomic_init(&a->refs, 1);
    a->ops = b->ops;
    a->d = b->d;
    a->size = bytes;
    if (b->ops->alloc(b->d, (void **)&a->base, bytes, err) < 0) {
        free(a);
        ep_err_prefix(err, "%s: a %.1f MiB weight arena", b->info.name, (double)bytes / (1 << 20));
        return NULL;
    }
    return a;
}

static void *arena_carve(cu_arena *a, size_t bytes)
{
    bytes = cu_align(bytes);
    if (a->used + bytes > a->size)
        return NULL;
    void *p = a->base + a->used;
    a->used += bytes;
    return p;
}

static int free_step_bufs(cuda_backend *b, cu_bufs *s)
{
    if (s->dev)
        b->ops->free(b->d, s->dev);
    if (s->pinned)
        b->ops->free_host(b->d, s->pinned);
    memset(s, 0, sizeof *s);
    return 0;
}

static int alloc_step_bufs(cuda_backend *b, cu_bufs *s, const mc_config *c, int max_tokens,
                           ep_err *err)
{
    memset(s, 0, sizeof *s);
    s->C = max_tokens < CU_STEP_TOKENS ? (max_tokens > 0 ? max_tokens : 1) : CU_STEP_TOKENS;
    s->H = c->hidden_size;
    s->I = c->moe_intermediate_size;
    s->E = c->n_routed_experts;
    s->k = c->num_experts_per_tok;
    s->P = s->C * s->k < CU_PAIR_CHUNK ? s->C * s->k : CU_PAIR_CHUNK;
    size_t dev = bufs_layout(s, NULL);
    s->pinned_bytes = bufs_pinned_bytes(s);
    if (b->ops->alloc(b->d, &s->dev, dev, err) < 0 ||
        b->ops->alloc_host(b->d, &s->pinned, s->pinned_bytes, err) < 0) {
        ep_err_prefix(err, "step buffers for %d tokens", s->C);
        free_step_bufs(b, s);
        return -1;
    }
    bufs_layout(s, s->dev);
    return 0;
}

/* The step buffers fit this config (same shapes, at least `tokens` per pass)? */
static bool bufs_fit(const cu_bufs *s, const mc_config *c)
{
    return s->dev && s->H == c->hidden_size && s->I == c->moe_intermediate_size &&
           s->E == c->n_routed_experts && s->k == c->num_experts_per_tok;
}

static int ensure_step_bufs(cuda_backend *b, const mc_config *c, ep_err *err)
{
    if (bufs_fit(&b->b, c))
        return 0;
    if (cu_wait(b, err) < 0)
        return -1;
    free_step_bufs(b, &b->b);
    return alloc_step_bufs(b, &b->b, c, CU_STEP_TOKENS, err);
}

static int cuda_reserve(mb_backend *be, const mc_config *c, uint64_t weight_bytes, int max_tokens,
                        ep_err *err)
{
    cuda_backend *b = cb(be);
    uint64_t free_b = 0, total_b = 0;
    if (b->step_busy)
        return ep_err_set(err, "mb_reserve: a step is open on %s", b->info.name);
    if (b->ops->mem_info(b->d, &free_b, &total_b, err) < 0)
        return -1;
    /* our own step buffers will be replaced: count them as free */
    uint64_t own = b->b.dev ? bufs_bytes(c, b->b.C) : 0;
    uint64_t steps = cuda_step_footprint(be, c, max_tokens);
    uint64_t need = weight_bytes + steps + CU_MEM_MARGIN;
    if (need > free_b + own)
        return ep_err_set(err,
                          "%s: the shard needs %.2f GiB of weights and %.2f GiB of step buffers "
                          "(+ %.2f GiB margin), but the device has %.2f GiB free of %.2f GiB",
                          b->info.name, (double)weight_bytes / (1u << 30),
                          (double)steps / (1u << 30), (double)CU_MEM_MARGIN / (1u << 30),
                          (double)free_b / (1u << 30), (double)total_b / (1u << 30));
    if (cu_wait(b, err) < 0)
        return -1;
    free_step_bufs(b, &b->b);
    if (alloc_step_bufs(b, &b->b, c, max_tokens, err) < 0)
        return -1;
    cu_arena *a = weight_bytes ? arena_new(b, weight_bytes, err) : NULL;
    if (weight_bytes && !a)
        return -1;
    arena_unref(&b->arena);
    b->arena = a;
    return 0;
}

/* ---- loading ----------------------------------------------------------------------------- */

typedef struct up_ctx {
    cuda_backend *b;
    int next; /* staging buffer to fill next */
    bool pending[2];
    mb_progress_fn progress;
    void *progress_ctx;
    uint64_t done;
    double deadline;
} up_ctx;

/* Copy `bytes` from host src (any memory) to device dst through the staging buffers: the
 * memcpy into one buffer overlaps the upload from the other. fill(dst_stage, off, n, ctx)
 * produces the staged bytes (a plain copy, or a decode/transpose). */
typedef void (*stage_fill_fn)(void *stage, size_t off, size_t n, const void *ctx);

static void fill_copy(void *stage, size_t off, size_t n, const void *src)
{
    memcpy(stage, (const uint8_t *)src + off, n);
}

static int upload(up_ctx *u, void *dst, size_t bytes, stage_fill_fn fill, const void *ctx,
                  ep_err *err)
{
    cuda_backend *b = u->b;
    for (size_t off = 0; off < bytes;) {
        size_t n = bytes - off < b->stage_bytes ? bytes - off : b->stage_bytes;
        int i = u->next;
        /* the buffer's previous upload must be done before it is refilled; the stream runs in
         * order, so waiting for it also waits for the other buffer's (older or newer) upload */
        if (u->pending[i]) {
            if (cu_wait_until(b->ops, b->d, u->deadline, err) < 0)
                return -1;
            u->pending[0] = u->pending[1] = false;
        }
        fill(b->stage[i], off, n, ctx);
        if (b->ops->h2d(b->d, (uint8_t *)dst + off, b->stage[i], n, err) < 0)
            return -1;
        u->pending[i] = true;
        u->next = 1 - i;
        off += n;
    }
    return 0;
}

typedef struct fp8_scale_src {
    const void *scale;
    bool e8m0;
} fp8_scale_src;

/* FP8 scales as f32: E8M0 codes decoded exactly, f32 copied (possibly unaligned source). */
static void fill_fp8_scale(void *stage, size_t off, size_t n, const void *vctx)
{
    const fp8_scale_src *s = vctx;
    if (!s->e8m0) {
        memcpy(stage, (const uint8_t *)s->scale + off, n);
        return;
    }
    float *o = stage;
    const uint8_t *c = (const uint8_t *)s->scale + off / 4;
    for (size_t i = 0; i < n / 4; i++)
        o[i] = fmt_e8m0_to_f32(c[i]);
}

/* Bytes of one linear's weights and (device-form) scales. */
static void linear_sizes(mb_wformat f, size_t N, size_t K, size_t *wb, size_t *sb)
{
    *wb = f == MB_W_MXFP4 ? N * K / 2 : N * K;
    *sb = f == MB_W_MXFP4 ? N * (K / EP_MXFP4_GROUP) : (N / EP_FP8_BLOCK) * (K / EP_FP8_BLOCK) * 4;
}

/* Carve one expert MLP: the three weights first, then the three scale tensors, so w1 and w3
 * (and their scales) are adjacent and a library GEMM can run them as one [2I, H] matrix. */
static int carve_mlp(cu_arena *a, mb_wformat f, size_t H, size_t I, cu_mlp *m)
{
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < 3; j++) {
            size_t wb, sb;
            linear_sizes(f, j == MB_W2 ? H : I, j == MB_W2 ? I : H, &wb, &sb);
            void *p = arena_carve(a, pass ? sb : wb);
            if (!p)
                return -1;
            if (pass)
                m->s[j] = p;
            else
                m->w[j] = p;
        }
    return 0;
}

static int upload_linear(up_ctx *u, const mb_linear *t, const uint8_t *dw, const void *ds,
                         ep_err *err)
{
    if (!t->w || !t->scale)
        return ep_err_set(err, "tensor %s: no data", t->name ? t->name : "?");
    size_t wb, sb;
    linear_sizes(t->format, (size_t)t->N, (size_t)t->K, &wb, &sb);
    if (upload(u, (void *)dw, wb, fill_copy, t->w, err) < 0)
        return ep_err_prefix(err, "tensor %s", t->name);
    fp8_scale_src fs = {.scale = t->scale, .e8m0 = t->scale_e8m0};
    int rc = t->format == MB_W_MXFP4 ? upload(u, (void *)ds, sb, fill_copy, t->scale, err)
                                     : upload(u, (void *)ds, sb, fill_fp8_scale, &fs, err);
    if (rc < 0)
        return ep_err_prefix(err, "tensor %s", t->name);
    /* progress counts checkpoint bytes: FP8 E8M0 scales were 1 byte each there, 4 here */
    u->done += wb + (t->format == MB_W_FP8 && t->scale_e8m0 ? sb / 4 : sb);
    return 0;
}

static int upload_mlp(up_ctx *u, cu_arena *a, const cuda_layer *l, const mb_linear t[3], cu_mlp *m,
                      ep_err *err)
{
    if (carve_mlp(a, t[0].format, (size_t)l->H, (size_t)l->I, m) < 0)
        return ep_err_set(err, "%s: the weight arena is full", l->name);
    for (int j = 0; j < 3; j++)
        if (upload_linear(u, &t[j], m->w[j], m->s[j], err) < 0)
            return -1;
    if (u->progress)
        u->progress(u->progress_ctx, u->done);
    return 0;
}

/* An expert the old layer holds: a device-to-device copy into the new arena. */
static int copy_mlp(cuda_backend *b, cu_arena *a, const cuda_layer *l, const cu_mlp *from,
                    mb_wformat f, cu_mlp *m, ep_err *err)
{
    size_t H = (size_t)l->H, I = (size_t)l->I;
    if (carve_mlp(a, f, H, I, m) < 0)
        return ep_err_set(err, "%s: the weight arena is full", l->name);
    for (int j = 0; j < 3; j++) {
        size_t wb, sb;
        linear_sizes(f, j == MB_W2 ? H : I, j == MB_W2 ? I : H, &wb, &sb);
        if (b->ops->d2d(b->d, (void *)m->w[j], from->w[j], wb, err) < 0 ||
            b->ops->d2d(b->d, (void *)m->s[j], from->s[j], sb, err) < 0)
            return ep_err_prefix(err, "%s: keeping an expert", l->name);
    }
    return 0;
}

typedef struct gate_src {
    const uint16_t *gate;
    int E, H;
} gate_src;

/* The gate transposed to [H, E] (the device reads one k for every expert at once). */
static void fill_gate_t(void *stage, size_t off, size_t n, const void *vctx)
{
    const gate_src *g = vctx;
    uint16_t *o = stage;
    size_t first = off / 2, count = n / 2;
    for (size_t i = 0; i < count; i++) {
        size_t idx = first + i, k = idx / (size_t)g->E, e = idx % (size_t)g->E;
        uint16_t v;
        memcpy(&v, (const uint8_t *)g->gate + (e * (size_t)g->H + k) * 2, 2);
        o[i] = v;
    }
}

static int load_router(cuda_backend *b, up_ctx *u, cuda_layer *l, const mb_layer_src *src,
                       ep_err *err)
{
    size_t H = (size_t)l->H, E = (size_t)l->E;
    if (!src->norm || !src->gate || (l->hash ? !src->tid2eid : !src->bias))
        return ep_err_set(err, "%s: ffn_norm, gate weight or %s missing", l->name,
                          l->hash ? "tid2eid" : "gate bias");
    l->norm = arena_carve(l->arena, H * 2);
    l->gate_t = arena_carve(l->arena, E * H * 2);
    if (!l->norm || !l->gate_t)
        return ep_err_set(err, "%s: the weight arena is full", l->name);
    gate_src gs = {.gate = src->gate, .E = l->E, .H = l->H};
    if (upload(u, l->norm, H * 2, fill_copy, src->norm, err) < 0 ||
        upload(u, l->gate_t, E * H * 2, fill_gate_t, &gs, err) < 0)
        return ep_err_prefix(err, "%s: router", l->name);
    u->done += H * 2 + E * H * 2;
    if (l->hash) {
        size_t n = (size_t)l->cfg.vocab_size * (size_t)l->k;
        if (!(l->h_tid2eid = malloc(n * sizeof(int64_t))))
            return ep_err_set(err, "%s: out of memory for tid2eid", l->name);
        memcpy(l->h_tid2eid, src->tid2eid, n * sizeof(int64_t));
        u->done += n * sizeof(int64_t);
    } else {
        if (!(l->h_bias = malloc(E * sizeof(float))))
            return ep_err_set(err, "%s: out of memory", l->name);
        memcpy(l->h_bias, src->bias, E * sizeof(float));
        u->done += E * sizeof(float);
    }
    return 0;
}

static void cuda_layer_free(mb_layer *ml)
{
    cuda_layer *l = (cuda_layer *)ml;
    arena_unref(&l->arena);
    free(l->h_bias);
    free(l->h_tid2eid);
    free(l->owned);
    free(l->experts);
    free(l);
}

static int load_experts(cuda_backend *b, up_ctx *u, cuda_layer *l, const mb_layer_src *src,
                        const uint8_t *want, const cuda_layer *reuse, ep_err *err)
{
    if (reuse) {
        if (copy_mlp(b, l->arena, l, &reuse->shared, MB_W_FP8, &l->shared, err) < 0)
            return -1;
    } else if (upload_mlp(u, l->arena, l, src->shared, &l->shared, err) < 0) {
        return -1;
    }
    for (int e = 0; e < l->E; e++) {
        const mb_linear *t = src->experts ? &src->experts[(size_t)e * 3] : NULL;
        bool w = want ? want[e] != 0 : (t && t[0].w != NULL);
        if (!w)
            continue;
        if (reuse && reuse->owned[e]) {
            if (copy_mlp(b, l->arena, l, &reuse->experts[e], l->fmt, &l->experts[e], err) < 0)
                return -1;
        } else if (!t) {
            return ep_err_set(err, "%s: expert %d wanted but not given", l->name, e);
        } else if (upload_mlp(u, l->arena, l, t, &l->experts[e], err) < 0) {
            return -1;
        }
        l->owned[e] = 1;
    }
    return 0;
}

static int count_wanted(const mb_layer_src *src, const uint8_t *want, int E)
{
    int n = 0;
    for (int e = 0; e < E; e++)
        n += want ? want[e] != 0 : (src->experts && src->experts[(size_t)e * 3].w != NULL);
    return n;
}

static mb_layer *cuda_layer_load(mb_backend *be, const mc_config *c, const mb_layer_src *src,
                                 const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                                 void *progress_ctx, ep_err *err)
{
    cuda_backend *b = cb(be);
    cuda_layer *l = calloc(1, sizeof *l);
    if (!l) {
        ep_err_set(err, "out of memory for a layer");
        return NULL;
    }
    l->base.be = be;
    l->base.index = src->layer;
    l->cfg = *c;
    l->hash = mc_layer_is_hash(c, src->layer);
    l->H = c->hidden_size;
    l->I = c->moe_intermediate_size;
    l->E = c->n_routed_experts;
    l->k = c->num_experts_per_tok;
    l->fmt = c->expert_dtype == MC_FP4 ? MB_W_MXFP4 : MB_W_FP8;
    l->exp_neg_limit = mf_expf(-c->swiglu_limit);
    snprintf(l->name, sizeof l->name, "%s", src->name ? src->name : "layer");
    l->owned = calloc((size_t)l->E, 1);
    l->experts = calloc((size_t)l->E, sizeof *l->experts);
    const cuda_layer *old = reuse ? cl(reuse) : NULL;
    if (!l->owned || !l->experts) {
        ep_err_set(err, "out of memory");
        goto fail;
    }
    if (mc_validate(c, err) < 0)
        goto fail;
    if (old && (old->H != l->H || old->I != l->I || old->E != l->E || old->fmt != l->fmt)) {
        ep_err_set(err, "the layer to reuse experts from has another shape or dtype");
        goto fail;
    }
    uint64_t need = cuda_layer_footprint(be, c, count_wanted(src, want, l->E));
    if (!b->arena || b->arena->size - b->arena->used < need) {
        /* no reservation (or too small): this layer gets an arena of its own */
        uint64_t free_b = 0, total_b = 0;
        if (b->ops->mem_info(b->d, &free_b, &total_b, err) < 0)
            goto fail;
        if (need + CU_MEM_MARGIN > free_b) {
            ep_err_set(err, "%s: %s needs %.2f GiB, the device has %.2f GiB free of %.2f GiB",
                       b->info.name, l->name, (double)need / (1u << 30),
                       (double)free_b / (1u << 30), (double)total_b / (1u << 30));
            goto fail;
        }
        if (!(l->arena = arena_new(b, need, err)))
            goto fail;
    } else {
        l->arena = b->arena;
        atomic_fetch_add(&l->arena->refs, 1);
    }
    up_ctx u = {.b = b,
                .progress = progress,
                .progress_ctx = progress_ctx,
                .deadline = clk_mono_s() + b->wait_s};
    if (load_router(b, &u, l, src, err) < 0 || load_experts(b, &u, l, src, want, old, err) < 0)
        goto fail;
    if (cu_wait(b, err) < 0) /* the staging buffers are reused by the next layer */
        goto fail;
    l->bytes = need;
    return &l->base;
fail:
    ep_err_prefix(err, "loading %s on %s", l->name, b->info.name);
    cu_wait(b, NULL);
    cuda_layer_free(&l->base);
    return NULL;
}

static bool cuda_layer_owns(const mb_layer *l, int e)
{
    return e >= 0 && e < cl(l)->E && cl(l)->owned[e];
}

static uint64_t cuda_layer_bytes(const mb_layer *l)
{
    return cl(l)->bytes;
}

/* ---- routing ----------------------------------------------------------------------------- */

typedef struct score_job {
    const float *logits;
    float *scores;
    size_t n;
} score_job;

static void score_task(void *vctx, int tid, int nthreads)
{
    score_job *j = vctx;
    size_t a = j->n * (size_t)tid / (size_t)nthreads,
           z = j->n * (size_t)(tid + 1) / (size_t)nthreads;
    if (z > a)
        route_scores((int)(z - a), j->logits + a, j->scores + a);
}

/* Scores, selection and weights of T tokens from their logits (the C library's log1pf/expf:
 * docs/numerics.md §2.3; on the host so the bits are those of the CPU backend). */
static int host_select(cuda_backend *b, const cuda_layer *l, int T, float *logits,
                       int32_t *topk_ids, float *topk_w)
{
    score_job j = {.logits = logits, .scores = logits, .n = (size_t)T * (size_t)l->E};
    tpool_run(j.n >= 4096 ? b->pool : NULL, score_task, &j);
    if (!l->hash)
        route_topk(GEMM_IMPL_AUTO, T, l->E, l->k, logits, l->h_bias, topk_ids);
    route_weights(T, l->E, l->k, logits, topk_ids, l->cfg.norm_topk_prob,
                  l->cfg.routed_scaling_factor, topk_w);
    return 0;
}

/* Route tokens [t0, t0 + n) of x: device rmsnorm, logits, quantizer into the step buffers;
 * logits (and q, qs, xn when the host wants them) back; selection on the host. */
static int route_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, const uint16_t *x,
                      int32_t *topk_ids, float *topk_w, uint8_t *h_q, float *h_qs, uint16_t *h_xn,
                      ep_err *err)
{
    const cudev_ops *o = b->ops;
    size_t H = (size_t)l->H, E = (size_t)l->E, SC = H / EP_FP8_BLOCK;
    uint8_t *st = s->pinned;
    memcpy(st, x, (size_t)n * H * 2);
    if (o->h2d(b->d, s->x, st, (size_t)n * H * 2, err) < 0 ||
        o->rmsnorm(b->d, n, l->H, s->x, l->norm, l->cfg.rms_norm_eps, s->xn, err) < 0 ||
        o->logits(b->d, n, l->H, l->E, s->xn, l->gate_t, s->logits, err) < 0 ||
        o->quant(b->d, n, l->H, l->cfg.act_ue8m0, s->xn, s->q, s->qs, err) < 0)
        return -1;
    float *h_logits = (float *)st;
    uint8_t *sq = st + cu_align((size_t)n * E * 4);
    uint8_t *sqs = sq + cu_align((size_t)n * H);
    uint8_t *sxn = sqs + cu_align((size_t)n * SC * 4);
    if (o->d2h(b->d, h_logits, s->logits, (size_t)n * E * 4, err) < 0 ||
        (h_q && o->d2h(b->d, sq, s->q, (size_t)n * H, err) < 0) ||
        (h_qs && o->d2h(b->d, sqs, s->qs, (size_t)n * SC * 4, err) < 0) ||
        (h_xn && o->d2h(b->d, sxn, s->xn, (size_t)n * H * 2, err) < 0) || cu_wait(b, err) < 0)
        return -1;
    if (h_q)
        memcpy(h_q, sq, (size_t)n * H);
    if (h_qs)
        memcpy(h_qs, sqs, (size_t)n * SC * 4);
    if (h_xn)
        memcpy(h_xn, sxn, (size_t)n * H * 2);
    return host_select(b, l, n, h_logits, topk_ids, topk_w);
}

/* ---- the expert MLP ---------------------------------------------------------------------- */

/* The grouped MLP over rows already in s->a / s->as, sorted by expert: groups (host, n_groups
 * of them) give each expert's segment; weights s->w per row (or 1.0 for the shared expert);
 * bf16 results to dst at rows s->outrow (out_row false: row i -> i). */
static int mlp_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, int n_groups,
                    cudev_group *h13, cudev_group *h2, int max_rows, bool routed, bool weights,
                    uint16_t *dst, bool out_row, ep_err *err)
{
    const cudev_ops *o = b->ops;
    size_t gb = (size_t)n_groups * sizeof(cudev_group);
    if (o->h2d(b->d, s->g13, h13, gb, err) < 0 || o->h2d(b->d, s->g2, h2, gb, err) < 0)
        return -1;
    mb_wformat f = routed ? l->fmt : MB_W_FP8;
    cudev_gemm g = {.format = f,
                    .mode = b->gemm,
                    .N = l->I,
                    .K = l->H,
                    .M = n,
                    .n_mats = 2,
                    .n_groups = n_groups,
                    .groups = s->g13,
                    .h_groups = h13,
                    .max_rows = max_rows,
                    .a = s->a,
                    .a_scale = s->as,
                    .out_f32 = s->acc1,
                    .out2_f32 = s->acc3,
                    .ld_out = 2 * l->I};
    if (o->gemm(b->d, &g, err) < 0 ||
        o->swiglu(b->d, n, l->I, s->acc1, s->acc3, 2 * l->I, weights ? s->w : NULL,
                  l->cfg.swiglu_limit, l->cfg.act_ue8m0, b->exp_table, l->exp_neg_limit, s->hq,
                  s->hqs, err) < 0)
        return -1;
    cudev_gemm g2 = {.format = f,
                     .mode = b->gemm,
                     .N = l->H,
                     .K = l->I,
                     .M = n,
                     .n_mats = 1,
                     .n_groups = n_groups,
                     .groups = s->g2,
                     .h_groups = h2,
                     .max_rows = max_rows,
                     .a = s->hq,
                     .a_scale = s->hqs,
                     .out_bf16 = dst,
                     .out_row = out_row ? s->outrow : NULL};
    return o->gemm(b->d, &g2, err);
}

static void group_set(cudev_group *g13, cudev_group *g2, uint32_t row0, uint32_t rows,
                      const cu_mlp *m)
{
    g13->row0 = g2->row0 = row0;
    g13->rows = g2->rows = rows;
    g13->w[0] = m->w[MB_W1];
    g13->scale[0] = m->s[MB_W1];
    g13->w[1] = m->w[MB_W3];
    g13->scale[1] = m->s[MB_W3];
    g2->w[0] = m->w[MB_W2];
    g2->scale[0] = m->s[MB_W2];
    g2->w[1] = NULL;
    g2->scale[1] = NULL;
}

/* The shared expert on n rows of (q, qs) already on the device (s->q / s->qs rows 0..n-1 are
 * copied into the MLP input) -> bf16 rows in dst. */
static int shared_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, const uint8_t *q,
                       const float *qs, uint16_t *dst, ep_err *err)
{
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    for (int r0 = 0; r0 < n; r0 += s->P) {
        int m = n - r0 < s->P ? n - r0 : s->P;
        cudev_group *h = (cudev_group *)((uint8_t *)s->pinned + s->pinned_bytes -
                                         cu_align(2 * sizeof(cudev_group)));
        group_set(&h[0], &h[1], 0, (uint32_t)m, &l->shared);
        if (b->ops->d2d(b->d, s->a, q + (size_t)r0 * H, (size_t)m * H, err) < 0 ||
            b->ops->d2d(b->d, s->as, qs + (size_t)r0 * SC, (size_t)m * SC * 4, err) < 0 ||
            mlp_pass(b, s, l, m, 1, &h[0], &h[1], m, false, false, dst + (size_t)r0 * H, false,
                     err) < 0)
            return -1;
        /* the next pass reuses h, a and as */
        if (n - r0 > s->P && cu_wait(b, err) < 0)
            return -1;
    }
    return 0;
}

/* Pairs sorted by expert (counting sort, stable): order[i] = pair index. */
static int sort_pairs(int n_pairs, int E, const uint32_t *pair_expert, uint32_t *order,
                      uint32_t *start)
{
    memset(start, 0, ((size_t)E + 1) * sizeof *start);
    for (int p = 0; p < n_pairs; p++)
        start[pair_expert[p] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    uint32_t *fill = calloc((size_t)E, sizeof *fill);
    if (!fill)
        return -1;
    for (int p = 0; p < n_pairs; p++) {
        uint32_t e = pair_expert[p];
        order[start[e] + fill[e]++] = (uint32_t)p;
    }
    free(fill);
    return 0;
}

/* Groups of sorted rows [c0, c1): one per expert run. Returns the count; *max_rows set. */
static int plan_groups(const cuda_layer *l, const uint32_t *start, uint32_t c0, uint32_t c1,
                       cudev_group *g13, cudev_group *g2, int *max_rows)
{
    int n = 0;
    *max_rows = 0;
    for (int e = 0; e < l->E; e++) {
        uint32_t a = start[e] > c0 ? start[e] : c0, z = start[e + 1] < c1 ? start[e + 1] : c1;
        if (z <= a)
            continue;
        group_set(&g13[n], &g2[n], a - c0, z - a, &l->experts[e]);
        if ((int)(z - a) > *max_rows)
            *max_rows = (int)(z - a);
        n++;
    }
    return n;
}

typedef struct pair_plan {
    uint32_t *order, *start;
} pair_plan;

static int plan_pairs(const cuda_layer *l, int n_pairs, const uint32_t *pair_expert, pair_plan *pp,
                      ep_err *err)
{
    pp->order = malloc((size_t)n_pairs * sizeof *pp->order + 1);
    pp->start = malloc(((size_t)l->E + 1) * sizeof *pp->start);
    if (!pp->order || !pp->start || sort_pairs(n_pairs, l->E, pair_expert, pp->order, pp->start))
        return ep_err_set(err, "out of memory grouping %d pairs", n_pairs);
    return 0;
}

static void free_plan(pair_plan *pp)
{
    free(pp->order);
    free(pp->start);
}

/* Staging layout of one MLP pass's small tables (at the end of the pinned buffer). */
typedef struct mlp_stage {
    cudev_group *g13, *g2;
    uint32_t *rowidx, *outrow;
    float *w;
    uint8_t *big; /* the start of the pinned buffer: rows in, rows out */
} mlp_stage;

static mlp_stage stage_of(cu_bufs *s)
{
    mlp_stage m;
    size_t E1 = (size_t)s->E + 1, P = (size_t)s->P;
    uint8_t *t = (uint8_t *)s->pinned + bufs_big_bytes(s);
    m.g13 = (cudev_group *)t;
    m.g2 = m.g13 + E1;
    t += cu_align(2 * E1 * sizeof(cudev_group));
    m.rowidx = (uint32_t *)t;
    m.outrow = (uint32_t *)(t + cu_align(P * 4));
    m.w = (float *)(t + 2 * cu_align(P * 4));
    m.big = s->pinned;
    return m;
}

static int cuda_experts(mb_backend *be, const mb_layer *ml, int n_rows, const uint8_t *q,
                        const float *qs, int n_pairs, const uint32_t *pair_row,
                        const uint32_t *pair_expert, const float *pair_w, uint16_t *out,
                        ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    cu_bufs *s = &b->b;
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    pair_plan pp = {0};
    int rc = plan_pairs(l, n_pairs, pair_expert, &pp, err);
    mlp_stage ms = stage_of(s);
    for (uint32_t c0 = 0; rc == 0 && c0 < (uint32_t)n_pairs; c0 += (uint32_t)s->P) {
        uint32_t c1 = (uint32_t)n_pairs - c0 < (uint32_t)s->P ? (uint32_t)n_pairs : c0 + s->P;
        int n = (int)(c1 - c0), max_rows;
        int ng = plan_groups(l, pp.start, c0, c1, ms.g13, ms.g2, &max_rows);
        /* gather the rows on the host, in sorted order, straight into the staging buffer */
        uint8_t *sa = ms.big, *sas = sa + cu_align((size_t)n * H);
        for (int i = 0; i < n; i++) {
            uint32_t p = pp.order[c0 + i];
            memcpy(sa + (size_t)i * H, q + (size_t)pair_row[p] * H, H);
            memcpy(sas + (size_t)i * SC * 4, qs + (size_t)pair_row[p] * SC, SC * 4);
            ms.w[i] = pair_w[p];
        }
        rc = b->ops->h2d(b->d, s->a, sa, (size_t)n * H, err) < 0 ||
                     b->ops->h2d(b->d, s->as, sas, (size_t)n * SC * 4, err) < 0 ||
                     b->ops->h2d(b->d, s->w, ms.w, (size_t)n * 4, err) < 0 ||
                     mlp_pass(b, s, l, n, ng, ms.g13, ms.g2, max_rows, true, true, s->mo, false,
                              err) < 0 ||
                     b->ops->d2h(b->d, sa, s->mo, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0
                 ? -1
                 : 0;
        for (int i = 0; rc == 0 && i < n; i++)
            memcpy(out + (size_t)pp.order[c0 + i] * H, sa + (size_t)i * H * 2, H * 2);
    }
    free_plan(&pp);
    if (rc < 0)
        ep_err_prefix(err, "%s on %s", l->name, b->info.name);
    return rc;
}

int mbc_experts(mb_backend *be, const mb_layer *ml, int n_rows, const uint8_t *d_q,
                const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out, ep_err *err)
{
    if (be->kind != MB_DEV_CUDA)
        return ep_err_set(err, "mbc_experts: not a CUDA backend");
    if (n_pairs == 0)
        return 0;
    if (n_rows < 0 || n_rows > EP_MAX_TOKENS || n_pairs < 0 ||
        n_pairs > EP_MAX_TOKENS * MC_MAX_TOPK)
        return ep_err_set(err, "mbc_experts: %d rows, %d pairs", n_rows, n_pairs);
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    for (int p = 0; p < n_pairs; p++)
        if (h_pair_row[p] >= (uint32_t)n_rows || !cuda_layer_owns(ml, (int)h_pair_expert[p]))
            return ep_err_set(err, "%s: pair %d: row %u of %d or expert %u not loaded here",
                              l->name, p, h_pair_row[p], n_rows, h_pair_expert[p]);
    if (ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    cu_bufs *s = &b->b;
    pair_plan pp = {0};
    int rc = plan_pairs(l, n_pairs, h_pair_expert, &pp, err);
    mlp_stage ms = stage_of(s);
    for (uint32_t c0 = 0; rc == 0 && c0 < (uint32_t)n_pairs; c0 += (uint32_t)s->P) {
        uint32_t c1 = (uint32_t)n_pairs - c0 < (uint32_t)s->P ? (uint32_t)n_pairs : c0 + s->P;
        int n = (int)(c1 - c0), max_rows;
        int ng = plan_groups(l, pp.start, c0, c1, ms.g13, ms.g2, &max_rows);
        for (int i = 0; i < n; i++) {
            uint32_t p = pp.order[c0 + i];
            ms.rowidx[i] = h_pair_row[p];
            ms.outrow[i] = p;
            ms.w[i] = h_pair_w[p];
        }
        rc = b->ops->h2d(b->d, s->rowidx, ms.rowidx, (size_t)n * 4, err) < 0 ||
                     b->ops->h2d(b->d, s->outrow, ms.outrow, (size_t)n * 4, err) < 0 ||
                     b->ops->h2d(b->d, s->w, ms.w, (size_t)n * 4, err) < 0 ||
                     b->ops->gather(b->d, l->H, n, s->rowidx, d_q, d_qs, s->a, s->as, false, err) <
                         0 ||
                     mlp_pass(b, s, l, n, ng, ms.g13, ms.g2, max_rows, true, true, d_out, true,
                              err) < 0 ||
                     (c1 < (uint32_t)n_pairs && cu_wait(b, err) < 0)
                 ? -1
                 : 0;
    }
    free_plan(&pp);
    return rc;
}

static int cuda_quant(mb_backend *be, const mb_layer *ml, int n, const uint16_t *xn, uint8_t *q,
                      float *qs, ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    cu_bufs *s = &b->b;
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    for (int t0 = 0; t0 < n; t0 += s->C) {
        int m = n - t0 < s->C ? n - t0 : s->C;
        uint8_t *st = s->pinned, *sq = st + cu_align((size_t)m * H * 2);
        uint8_t *sqs = sq + cu_align((size_t)m * H);
        memcpy(st, xn + (size_t)t0 * H, (size_t)m * H * 2);
        if (b->ops->h2d(b->d, s->xn, st, (size_t)m * H * 2, err) < 0 ||
            b->ops->quant(b->d, m, l->H, l->cfg.act_ue8m0, s->xn, s->q, s->qs, err) < 0 ||
            b->ops->d2h(b->d, sq, s->q, (size_t)m * H, err) < 0 ||
            b->ops->d2h(b->d, sqs, s->qs, (size_t)m * SC * 4, err) < 0 || cu_wait(b, err) < 0)
            return -1;
        memcpy(q + (size_t)t0 * H, sq, (size_t)m * H);
        memcpy(qs + (size_t)t0 * SC, sqs, (size_t)m * SC * 4);
    }
    return 0;
}

/* ---- steps ------------------------------------------------------------------------------- */

static int hash_ids(const cuda_layer *l, int T, const int64_t *ids, int32_t *topk_ids, ep_err *err)
{
    if (!l->hash)
        return 0;
    if (!ids)
        return ep_err_set(err, "%s is hash-routed (tid2eid): token ids are required", l->name);
    if (route_hash(T, l->k, l->E, l->cfg.vocab_size, ids, l->h_tid2eid, topk_ids, err) < 0)
        return ep_err_prefix(err, "%s", l->name);
    return 0;
}

/* The buffers a new step uses: the backend's, or its own when those are taken. */
static cu_bufs *step_bufs(cuda_backend *b, cuda_step *s, const mc_config *c, ep_err *err)
{
    if (ensure_step_bufs(b, c, err) < 0)
        return NULL;
    if (!b->step_busy) {
        b->step_busy = true;
        return &b->b;
    }
    if (alloc_step_bufs(b, &s->own, c, b->b.C, err) < 0)
        return NULL;
    s->own_bufs = true;
    return &s->own;
}

static void cuda_step_free(mb_step *ms)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    cu_wait(b, NULL); /* nothing of this step may still run on the buffers */
    if (s->own_bufs)
        free_step_bufs(b, &s->own);
    else if (s->bufs)
        b->step_busy = false;
    free(s->h_shared);
    free(s);
}

static cuda_step *step_new(cuda_backend *b, const cuda_layer *l, int T, ep_err *err)
{
    cuda_step *s = calloc(1, sizeof *s);
    if (!s) {
        ep_err_set(err, "out of memory for a step");
        return NULL;
    }
    s->base.be = &b->base;
    s->l = l;
    s->T = T;
    if (!(s->bufs = step_bufs(b, s, &l->cfg, err))) {
        free(s);
        return NULL;
    }
    s->resident = T <= s->bufs->C;
    return s;
}

static mb_step *cuda_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x,
                                const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q,
                                float *qs, uint16_t *xn, ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    /* hash lookups first: a bad token id fails before any device work */
    if (hash_ids(l, T, ids, topk_ids, err) < 0)
        return NULL;
    cuda_step *s = step_new(b, l, T, err);
    if (!s)
        return NULL;
    s->h_q = q;
    s->h_qs = qs;
    s->topk_ids = topk_ids;
    size_t H = (size_t)l->H, k = (size_t)l->k, SC = H / EP_FP8_BLOCK;
    for (int t0 = 0; t0 < T; t0 += s->bufs->C) {
        int n = T - t0 < s->bufs->C ? T - t0 : s->bufs->C;
        if (route_pass(b, s->bufs, l, n, x + (size_t)t0 * H, topk_ids + (size_t)t0 * k,
                       topk_w + (size_t)t0 * k, q + (size_t)t0 * H, qs + (size_t)t0 * SC,
                       xn ? xn + (size_t)t0 * H : NULL, err) < 0) {
            ep_err_prefix(err, "%s on %s", l->name, b->info.name);
            cuda_step_free(&s->base);
            return NULL;
        }
    }
    return &s->base;
}

static int cuda_step_shared(mb_step *ms, ep_err *err)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    const cuda_layer *l = s->l;
    cu_bufs *bf = s->bufs;
    if (s->shared_done || s->T == 0)
        return 0;
    s->shared_done = true;
    if (s->resident) /* q/qs of the one route pass are still in the buffers: no copy back */
        return shared_pass(b, bf, l, s->T, bf->q, bf->qs, bf->shared, err);
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    if (!(s->h_shared = malloc((size_t)s->T * H * 2)))
        return ep_err_set(err, "out of memory for the shared expert of %d tokens", s->T);
    for (int t0 = 0; t0 < s->T; t0 += bf->C) {
        int n = s->T - t0 < bf->C ? s->T - t0 : bf->C;
        uint8_t *st = bf->pinned, *sqs = st + cu_align((size_t)n * H);
        memcpy(st, s->h_q + (size_t)t0 * H, (size_t)n * H);
        memcpy(sqs, s->h_qs + (size_t)t0 * SC, (size_t)n * SC * 4);
        if (b->ops->h2d(b->d, bf->q, st, (size_t)n * H, err) < 0 ||
            b->ops->h2d(b->d, bf->qs, sqs, (size_t)n * SC * 4, err) < 0 ||
            shared_pass(b, bf, l, n, bf->q, bf->qs, bf->shared, err) < 0 ||
            b->ops->d2h(b->d, st, bf->shared, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0)
            return -1;
        memcpy(s->h_shared + (size_t)t0 * H, st, (size_t)n * H * 2);
    }
    return 0;
}

/* Combine tokens [t0, t0+n): eo and topk from the host, shared from the device buffer (already
 * there when resident, else uploaded); out back to the host. */
static int combine_pass(cuda_backend *b, cuda_step *s, int t0, int n, const uint16_t *eo,
                        uint16_t *out, ep_err *err)
{
    const cuda_layer *l = s->l;
    cu_bufs *bf = s->bufs;
    size_t H = (size_t)l->H, k = (size_t)l->k;
    uint8_t *st = bf->pinned, *stk = st + cu_align((size_t)n * k * H * 2);
    uint8_t *ssh = stk + cu_align((size_t)n * k * 4);
    memcpy(st, eo + (size_t)t0 * k * H, (size_t)n * k * H * 2);
    memcpy(stk, s->topk_ids + (size_t)t0 * k, (size_t)n * k * 4);
    if (!s->resident)
        memcpy(ssh, s->h_shared + (size_t)t0 * H, (size_t)n * H * 2);
    if (b->ops->h2d(b->d, bf->eo, st, (size_t)n * k * H * 2, err) < 0 ||
        b->ops->h2d(b->d, bf->topk, stk, (size_t)n * k * 4, err) < 0 ||
        (!s->resident && b->ops->h2d(b->d, bf->shared, ssh, (size_t)n * H * 2, err) < 0) ||
        b->ops->combine(b->d, n, l->k, l->H, bf->topk, bf->eo, bf->shared, bf->out, err) < 0 ||
        b->ops->d2h(b->d, st, bf->out, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0)
        return -1;
    memcpy(out + (size_t)t0 * H, st, (size_t)n * H * 2);
    return 0;
}

static int cuda_step_finish(mb_step *ms, const uint16_t *eo, uint16_t *out, ep_err *err)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    if (s->T == 0)
        return 0;
    if (cuda_step_shared(ms, err) < 0)
        return -1;
    for (int t0 = 0; t0 < s->T; t0 += s->bufs->C) {
        int n = s->T - t0 < s->bufs->C ? s->T - t0 : s->bufs->C;
        if (combine_pass(b, s, t0, n, eo, out, err) < 0)
            return ep_err_prefix(err, "%s on %s: combine", s->l->name, b->info.name);
    }
    return 0;
}

/* ---- the whole layer on the device ------------------------------------------------------- */

/* One forward pass of n <= C tokens: route (logits back, selection on the host), every routed
 * pair through the grouped MLP straight into eo's slots, the shared expert, the combine. */
static int forward_pass(cuda_backend *b, const cuda_layer *l, int n, const uint16_t *x,
                        const int64_t *ids, uint16_t *out, int32_t *topk_ids, float *topk_w,
                        ep_err *err)
{
    cu_bufs *s = &b->b;
    const cudev_ops *o = b->ops;
    size_t H = (size_t)l->H, k = (size_t)l->k;
    int n_pairs = n * l->k;
    if (hash_ids(l, n, ids, topk_ids, err) < 0 ||
        route_pass(b, s, l, n, x, topk_ids, topk_w, NULL, NULL, NULL, err) < 0)
        return -1;
    uint32_t *pexp = malloc((size_t)n_pairs * 4 + 1);
    pair_plan pp = {0};
    if (!pexp)
        return ep_err_set(err, "out of memory");
    for (int i = 0; i < n_pairs; i++)
        pexp[i] = (uint32_t)topk_ids[i];
    int rc = plan_pairs(l, n_pairs, pexp, &pp, err);
    mlp_stage ms = stage_of(s);
    for (int i = 0; rc == 0 && i < n_pairs; i++)
        if (!l->owned[pexp[i]])
            rc = ep_err_set(err, "%s: token %d selects expert %u, which is not loaded here",
                            l->name, i / l->k, pexp[i]);
    for (uint32_t c0 = 0; rc == 0 && c0 < (uint32_t)n_pairs; c0 += (uint32_t)s->P) {
        uint32_t c1 = (uint32_t)n_pairs - c0 < (uint32_t)s->P ? (uint32_t)n_pairs : c0 + s->P;
        int m = (int)(c1 - c0), max_rows;
        int ng = plan_groups(l, pp.start, c0, c1, ms.g13, ms.g2, &max_rows);
        for (int i = 0; i < m; i++) {
            uint32_t p = pp.order[c0 + i]; /* p = t * k + j: the slot */
            ms.rowidx[i] = p / (uint32_t)l->k;
            ms.outrow[i] = p;
            ms.w[i] = topk_w[p];
        }
        rc =
            o->h2d(b->d, s->rowidx, ms.rowidx, (size_t)m * 4, err) < 0 ||
                    o->h2d(b->d, s->outrow, ms.outrow, (size_t)m * 4, err) < 0 ||
                    o->h2d(b->d, s->w, ms.w, (size_t)m * 4, err) < 0 ||
                    o->gather(b->d, l->H, m, s->rowidx, s->q, s->qs, s->a, s->as, false, err) < 0 ||
                    mlp_pass(b, s, l, m, ng, ms.g13, ms.g2, max_rows, true, true, s->eo, true,
                             err) < 0 ||
                    /* the next chunk reuses the staged tables */
                    (c1 < (uint32_t)n_pairs && cu_wait(b, err) < 0)
                ? -1
                : 0;
    }
    free_plan(&pp);
    free(pexp);
    if (rc < 0)
        return -1;
    uint8_t *st = s->pinned;
    memcpy(st, topk_ids, (size_t)n * k * 4);
    if (shared_pass(b, s, l, n, s->q, s->qs, s->shared, err) < 0 ||
        o->h2d(b->d, s->topk, st, (size_t)n * k * 4, err) < 0 ||
        o->combine(b->d, n, l->k, l->H, s->topk, s->eo, s->shared, s->out, err) < 0 ||
        o->d2h(b->d, st, s->out, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0)
        return -1;
    memcpy(out, st, (size_t)n * H * 2);
    return 0;
}

static int cuda_forward(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x,
                        const int64_t *ids, uint16_t *out, int32_t *topk_ids, float *topk_w,
                        ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    if (b->step_busy)
        return ep_err_set(err, "mb_forward: a step is open on this backend");
    size_t H = (size_t)l->H, k = (size_t)l->k;
    for (int t0 = 0; t0 < T; t0 += b->b.C) {
        int n = T - t0 < b->b.C ? T - t0 : b->b.C;
        if (forward_pass(b, l, n, x + (size_t)t0 * H, ids ? ids + t0 : NULL, out + (size_t)t0 * H,
                         topk_ids + (size_t)t0 * k, topk_w + (size_t)t0 * k, err) < 0)
            return ep_err_prefix(err, "%s on %s", l->name, b->info.name);
    }
    return 0;
}

/* ---- device-resident steps (cuda_step.h) ------------------------------------------------- */

static cuda_backend *cuda_of(mb_backend *be, const char *fn, ep_err *err)
{
    if (be == NULL || be->kind != MB_DEV_CUDA) {
        ep_err_set(err, "%s: not a CUDA backend", fn);
        return NULL;
    }
    return cb(be);
}

void *mbc_stream(mb_backend *be)
{
    cuda_backend *b = cuda_of(be, "mbc_stream", NULL);
    return b ? b->ops->stream(b->d) : NULL;
}

int mbc_poll(mb_backend *be, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_poll", err);
    return b ? b->ops->query(b->d, err) : -1;
}

int mbc_wait(mb_backend *be, double deadline, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_wait", err);
    return b ? cu_wait_until(b->ops, b->d, deadline, err) : -1;
}

int mbc_alloc(mb_backend *be, void **d_p, size_t bytes, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_alloc", err);
    return b ? b->ops->alloc(b->d, d_p, bytes ? bytes : 1, err) : -1;
}

void mbc_free(mb_backend *be, void *d_p)
{
    cuda_backend *b = cuda_of(be, "mbc_free", NULL);
    if (b && d_p)
        b->ops->free(b->d, d_p);
}

int mbc_alloc_host(mb_backend *be, void **h_p, size_t bytes, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_alloc_host", err);
    return b ? b->ops->alloc_host(b->d, h_p, bytes ? bytes : 1, err) : -1;
}

void mbc_free_host(mb_backend *be, void *h_p)
{
    cuda_backend *b = cuda_of(be, "mbc_free_host", NULL);
    if (b && h_p)
        b->ops->free_host(b->d, h_p);
}

int mbc_h2d(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_h2d", err);
    return b ? (bytes ? b->ops->h2d(b->d, d_dst, h_src, bytes, err) : 0) : -1;
}

int mbc_d2h(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_d2h", err);
    return b ? (bytes ? b->ops->d2h(b->d, h_dst, d_src, bytes, err) : 0) : -1;
}

mb_step *mbc_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *h_x,
                        const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w, double deadline,
                        ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_step_begin", err);
    if (!b)
        return NULL;
    const cuda_layer *l = cl(ml);
    if (T < 0 || T > CU_STEP_TOKENS) {
        ep_err_set(err, "mbc_step_begin: %d tokens, a device-resident step holds 0..%d", T,
                   CU_STEP_TOKENS);
        return NULL;
    }
    if (hash_ids(l, T, h_ids, h_topk_ids, err) < 0)
        return NULL;
    cuda_step *s = step_new(b, l, T, err);
    if (!s)
        return NULL;
    if (!s->resident) {
        ep_err_set(err, "mbc_step_begin: %d tokens, the step buffers hold %d", T, s->bufs->C);
        cuda_step_free(&s->base);
        return NULL;
    }
    s->topk_ids = h_topk_ids;
    if (T > 0 &&
        route_pass(b, s->bufs, l, T, h_x, h_topk_ids, h_topk_w, NULL, NULL, NULL, err) < 0) {
        ep_err_prefix(err, "%s on %s", l->name, b->info.name);
        cuda_step_free(&s->base);
        return NULL;
    }
    (void)deadline;
    cu_bufs *bf = s->bufs;
    if (T > 0 && b->ops->memset0(b->d, bf->eo, (size_t)T * l->k * l->H * 2, err) < 0) {
        cuda_step_free(&s->base);
        return NULL;
    }
    return &s->base;
}

const uint8_t *mbc_step_q(const mb_step *ms)
{
    return ((const cuda_step *)ms)->bufs->q;
}

const float *mbc_step_qs(const mb_step *ms)
{
    return ((const cuda_step *)ms)->bufs->qs;
}

uint16_t *mbc_step_eo(mb_step *ms, ep_err *err)
{
    return ((cuda_step *)ms)->bufs->eo;
}

int mbc_gather(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
               const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_gather", err);
    if (!b)
        return -1;
    return n ? b->ops->gather(b->d, H, n, d_rows, d_q, d_qs, d_codes, d_scales, e8m0, err) : 0;
}

int mbc_scales_to_f32(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_scales_to_f32", err);
    if (!b)
        return -1;
    return n ? b->ops->e8m0_to_f32(b->d, n, d_e8m0, d_f32, err) : 0;
}

int mbc_scatter(mb_backend *be, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                uint16_t *d_eo, ep_err *err)
{
    cuda_backend *b = cuda_of(be, "mbc_scatter", err);
    if (!b)
        return -1;
    return n ? b->ops->scatter(b->d, H, n, d_slots, d_rows, d_eo, err) : 0;
}

int mbc_step_finish(mb_step *ms, uint16_t *h_out, double deadline, ep_err *err)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    const cuda_layer *l = s->l;
    cu_bufs *bf = s->bufs;
    if (s->T == 0)
        return 0;
    size_t H = (size_t)l->H, k = (size_t)l->k;
    uint8_t *st = bf->pinned;
    memcpy(st, s->topk_ids, (size_t)s->T * k * 4);
    if (cuda_step_shared(ms, err) < 0 ||
        b->ops->h2d(b->d, bf->topk, st, (size_t)s->T * k * 4, err) < 0 ||
        b->ops->combine(b->d, s->T, l->k, l->H, bf->topk, bf->eo, bf->shared, bf->out, err) < 0 ||
        b->ops->d2h(b->d, st, bf->out, (size_t)s->T * H * 2, err) < 0 ||
        cu_wait_until(b->ops, b->d, deadline, err) < 0)
        return -1;
    memcpy(h_out, st, (size_t)s->T * H * 2);
    return 0;
}

/* ---- the backend ------------------------------------------------------------------------- */

static int cuda_device(const mb_backend *be, mb_device_info *info)
{
    *info = ((const cuda_backend *)be)->info;
    uint64_t f, t;
    if (cb((mb_backend *)be)->ops->mem_info(cb((mb_backend *)be)->d, &f, &t, NULL) == 0)
        info->mem_free = f;
    return 0;
}

static int cuda_set_gemm(mb_backend *be, mb_gemm_mode mode, ep_err *err)
{
    cuda_backend *b = cb(be);
    b->gemm = mode;
    snprintf(b->base.name, sizeof b->base.name, "cuda-%s", mode == MB_GEMM_FAST ? "fast" : "exact");
    return 0;
}

static void cuda_destroy(mb_backend *be)
{
    cuda_backend *b = cb(be);
    if (b->d) {
        cu_wait(b, NULL);
        arena_unref(&b->arena);
        free_step_bufs(b, &b->b);
        for (int i = 0; i < 2; i++)
            if (b->stage[i])
                b->ops->free_host(b->d, b->stage[i]);
        if (b->exp_table)
            b->ops->free(b->d, b->exp_table);
        b->ops->close(b->d);
    }
    free(b->h_exp_table);
    tpool_destroy(&b->pool);
    free(b);
}

static const mb_vtable CUDA_VT = {
    .destroy = cuda_destroy,
    .device = cuda_device,
    .set_gemm = cuda_set_gemm,
    .layer_footprint = cuda_layer_footprint,
    .step_footprint = cuda_step_footprint,
    .reserve = cuda_reserve,
    .layer_load = cuda_layer_load,
    .layer_free = cuda_layer_free,
    .layer_owns = cuda_layer_owns,
    .layer_bytes = cuda_layer_bytes,
    .step_begin = cuda_step_begin,
    .step_shared = cuda_step_shared,
    .step_finish = cuda_step_finish,
    .step_free = cuda_step_free,
    .experts = cuda_experts,
    .quant = cuda_quant,
    .forward = cuda_forward,
};

/* mf_expf(-g) for every bf16 bit pattern g (kernels/mathf.h, correctly rounded): SiLU's only
 * transcendental, looked up on the device so its bits are the CPU backend's. */
static int build_exp_table(cuda_backend *b, ep_err *err)
{
    b->h_exp_table = malloc(65536 * sizeof(float));
    if (!b->h_exp_table)
        return ep_err_set(err, "out of memory");
    for (uint32_t h = 0; h < 65536; h++)
        b->h_exp_table[h] = mf_expf(-fmt_bf16_to_f32((uint16_t)h));
    if (b->ops->alloc(b->d, (void **)&b->exp_table, 65536 * sizeof(float), err) < 0 ||
        b->ops->h2d(b->d, b->exp_table, b->h_exp_table, 65536 * sizeof(float), err) < 0 ||
        cu_wait(b, err) < 0)
        return -1;
    return 0;
}

/* A numeric knob from the environment, clamped to [lo, hi]; def when unset or not a number. */
static double env_double(const char *name, double def, double lo, double hi)
{
    const char *v = getenv(name);
    char *end;
    double x = v ? strtod(v, &end) : def;
    if (!v || end == v || *end != '\0' || !(x == x))
        return def;
    return x < lo ? lo : x > hi ? hi : x;
}

mb_backend *mb_cuda_create_with(const mb_options *o, int ordinal, const cudev_ops *ops, ep_err *err)
{
    cuda_backend *b = calloc(1, sizeof *b);
    if (!b) {
        ep_err_set(err, "out of memory for the CUDA backend");
        return NULL;
    }
    b->base.vt = &CUDA_VT;
    b->base.kind = MB_DEV_CUDA;
    b->ops = ops;
    b->gemm = o->gemm;
    b->wait_s = env_double("EPMOE_CUDA_WAIT_S", CU_WAIT_S, 0.01, 3600);
    /* whole fp32 elements (the FP8 scale decode stages 4-byte values) */
    b->stage_bytes =
        (size_t)env_double("EPMOE_CUDA_STAGE_BYTES", CU_STAGE_BYTES, 4096, 1u << 30) & ~(size_t)255;
    snprintf(b->base.name, sizeof b->base.name, "cuda-%s",
             o->gemm == MB_GEMM_FAST ? "fast" : "exact");
    b->info.kind = MB_DEV_CUDA;
    b->info.ordinal = ordinal;
    if (ops->open(ordinal, &b->d, &b->info, err) < 0) {
        ep_err_prefix(err, "cuda:%d", ordinal);
        b->d = NULL;
        goto fail;
    }
    b->info.kind = MB_DEV_CUDA;
    b->info.ordinal = ordinal;
    if (!(b->pool = tpool_create(o->threads, err)))
        goto fail;
    for (int i = 0; i < 2; i++)
        if (ops->alloc_host(b->d, &b->stage[i], b->stage_bytes, err) < 0)
            goto fail;
    if (build_exp_table(b, err) < 0)
        goto fail;
    return &b->base;
fail:
    ep_err_prefix(err, "CUDA backend");
    cuda_destroy(&b->base);
    return NULL;
}

mb_backend *mb_cuda_create(const mb_options *o, int ordinal, ep_err *err)
{
    const cudev_ops *ops = cudev_cuda_ops(err);
    if (ops == NULL) {
        ep_err_prefix(err, "cuda:%d", ordinal);
        return NULL;
    }
    return mb_cuda_create_with(o, ordinal, ops, err);
}
