/*
 * backend_cuda.c — the CUDA backend behind kernels/moe_backend.h (its device operations too):
 * the host half (plain C): the backend object and its memory (this file), loading
 * (cuda_load.c), steps (cuda_steps.c) and the device operations (cuda_resident.c), which share
 * cuda_internal.h. Every device action goes through a cudev_ops table (cuda_dev.h), so
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
 *
 * Tuning (the wait, the staging size, which GEMM kernels run) comes from mb_options.cuda
 * (cuda_tuning.h); the kernels get it with each GEMM, and nothing here reads the environment.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/limits.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/formats.h"
#include "kernels/mathf.h"

size_t cu_align(size_t n)
{
    return (n + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN;
}

/* Poll the stream until it drains or deadline passes: 0, or -1 naming the timeout or the
 * device error. The first CU_SPIN_S seconds poll
 * without sleeping: a step's waits are tens to hundreds of microseconds, and a sleep costs more
 * than that in timer slack; longer waits (loading, huge steps) poll every 100 us. */
#define CU_SPIN_S 0.01
int cu_wait_until(const cudev_ops *ops, cudev *d, int64_t deadline, ep_err *err)
{
    struct timespec nap = {0, 100000};
    double spin_end = clk_mono_s() + CU_SPIN_S;
    for (;;) {
        int q = ops->query(d, err);
        if (q <= 0)
            return q;
        if (clk_mono_ms() > deadline)
            return ep_err_set(err, "the device did not finish its queued work in time");
        if (clk_mono_s() > spin_end)
            nanosleep(&nap, NULL);
    }
}

int64_t cu_deadline(const cuda_backend *b)
{
    return clk_mono_ms() + (int64_t)(b->wait_s * 1000.0);
}

int cu_wait(cuda_backend *b, ep_err *err)
{
    return cu_wait_until(b->ops, b->d, cu_deadline(b), err);
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

uint64_t cuda_layer_footprint(const mb_backend *be, const mc_config *c, int n_experts)
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
size_t cu_bufs_big_bytes(const cu_bufs *s)
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
    return cu_bufs_big_bytes(s) + tables_bytes(s);
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

void cu_arena_unref(cu_arena **a_p)
{
    cu_arena *a = *a_p;
    *a_p = NULL;
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        a->ops->free(a->d, a->base);
        free(a);
    }
}

cu_arena *cu_arena_new(cuda_backend *b, size_t bytes, ep_err *err)
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

void *cu_arena_carve(cu_arena *a, size_t bytes)
{
    bytes = cu_align(bytes);
    if (a->used + bytes > a->size)
        return NULL;
    void *p = a->base + a->used;
    a->used += bytes;
    return p;
}

int cu_free_step_bufs(cuda_backend *b, cu_bufs *s)
{
    if (s->dev)
        b->ops->free(b->d, s->dev);
    if (s->pinned)
        b->ops->free_host(b->d, s->pinned);
    memset(s, 0, sizeof *s);
    return 0;
}

int cu_alloc_step_bufs(cuda_backend *b, cu_bufs *s, const mc_config *c, int max_tokens, ep_err *err)
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
        cu_free_step_bufs(b, s);
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

int cu_ensure_step_bufs(cuda_backend *b, const mc_config *c, ep_err *err)
{
    if (bufs_fit(&b->b, c))
        return 0;
    if (cu_wait(b, err) < 0)
        return -1;
    cu_free_step_bufs(b, &b->b);
    return cu_alloc_step_bufs(b, &b->b, c, CU_STEP_TOKENS, err);
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
    cu_free_step_bufs(b, &b->b);
    if (cu_alloc_step_bufs(b, &b->b, c, max_tokens, err) < 0)
        return -1;
    cu_arena *a = weight_bytes ? cu_arena_new(b, weight_bytes, err) : NULL;
    if (weight_bytes && !a)
        return -1;
    cu_arena_unref(&b->arena);
    b->arena = a;
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
        cu_arena_unref(&b->arena);
        cu_free_step_bufs(b, &b->b);
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
    .dev_stream = cuda_dev_stream,
    .dev_poll = cuda_dev_poll,
    .dev_wait = cuda_dev_wait,
    .dev_alloc = cuda_dev_alloc,
    .dev_free = cuda_dev_free,
    .dev_alloc_host = cuda_dev_alloc_host,
    .dev_free_host = cuda_dev_free_host,
    .dev_h2d = cuda_dev_h2d,
    .dev_d2h = cuda_dev_d2h,
    .dev_step_begin = cuda_dev_step_begin,
    .dev_step_q = cuda_dev_step_q,
    .dev_step_qs = cuda_dev_step_qs,
    .dev_gather = cuda_dev_gather,
    .dev_scales_to_f32 = cuda_dev_scales_to_f32,
    .dev_experts = cuda_dev_experts,
    .dev_scatter = cuda_dev_scatter,
    .dev_step_eo = cuda_dev_step_eo,
    .dev_step_finish = cuda_dev_step_finish,
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

static double cu_clamp(double x, double lo, double hi)
{
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
    b->tune = o->cuda;
    b->wait_s = o->cuda.wait_s > 0 ? cu_clamp(o->cuda.wait_s, 0.01, 3600) : CU_WAIT_S;
    /* whole fp32 elements (the FP8 scale decode stages 4-byte values) */
    size_t stage = o->cuda.stage_bytes ? o->cuda.stage_bytes : CU_STAGE_BYTES;
    b->stage_bytes = (size_t)cu_clamp((double)stage, 4096, 1u << 30) & ~(size_t)255;
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
    const cudev_ops *ops = cudev_cuda_ops(o->cuda.module, err);
    if (ops == NULL) {
        ep_err_prefix(err, "cuda:%d", ordinal);
        return NULL;
    }
    return mb_cuda_create_with(o, ordinal, ops, err);
}
