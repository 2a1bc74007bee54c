/*
 * backend_cpu.c — the CPU backend behind kernels/moe_backend.h: the layer of kernels/moe.h (the
 * numeric reference, with its AVX2 fast paths) and one GEMM thread pool. Everything is host
 * memory already, so each operation is a direct call; a step keeps pointers to the caller's
 * q/qs/topk_ids (the seam's contract keeps them alive until mb_step_free) and the shared
 * expert's output.
 *
 * The optional device operations (mb_dev_*) run on host memory: "device" buffers are malloc'd,
 * copies are memcpy, there is no stream (each operation is done when it returns), and a
 * device-resident step owns its q/qs and expert-output buffers. So the NCCL plane's step runs
 * on the CPU with the CPU's bits, which is how its unit test checks it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "kernels/backend.h"
#include "kernels/formats.h"
#include "kernels/moe.h"
#include "kernels/route.h"

typedef struct cpu_backend {
    mb_backend base;
    tpool *pool;
    isa_level impl;
} cpu_backend;

typedef struct cpu_layer {
    mb_layer base;
    moe_layer *l;
} cpu_layer;

typedef struct cpu_step {
    mb_step base;
    const moe_layer *l;
    int T;
    const uint8_t *q;
    const float *qs;
    const int32_t *topk_ids;
    uint16_t *shared; /* bf16 [T, H] once computed */
    /* a device-resident step's own buffers (mb_dev_step_begin) */
    uint8_t *own_q; /* e4m3 [T, H] */
    float *own_qs;  /* f32 [T, H/128] */
    uint16_t *eo;   /* bf16 [T*k, H], zeroed */
} cpu_step;

static cpu_backend *cpu_of(mb_backend *be)
{
    return (cpu_backend *)be;
}

static const moe_layer *layer_of(const mb_layer *l)
{
    return ((const cpu_layer *)l)->l;
}

static void cpu_destroy(mb_backend *be)
{
    tpool_destroy(&cpu_of(be)->pool);
    free(be);
}

static int cpu_device(const mb_backend *be, mb_device_info *info)
{
    snprintf(info->name, sizeof info->name, "cpu (%s kernels)",
             isa_name(((const cpu_backend *)be)->impl));
    return 0;
}

static uint64_t cpu_layer_footprint(const mb_backend *be, const mc_config *c, int n_experts)
{
    return 0; /* host memory: nothing to check in advance */
}

static uint64_t cpu_step_footprint(const mb_backend *be, const mc_config *c, int max_tokens)
{
    return 0;
}

static int cpu_reserve(mb_backend *be, const mc_config *c, uint64_t weight_bytes, int max_tokens,
                       ep_err *err)
{
    return 0;
}

static mb_layer *cpu_layer_load(mb_backend *be, const mc_config *c, const mb_layer_src *src,
                                const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                                void *progress_ctx, ep_err *err)
{
    cpu_layer *cl = calloc(1, sizeof *cl);
    if (!cl) {
        ep_err_set(err, "out of memory for a layer");
        return NULL;
    }
    moe_layer *old = reuse ? ((cpu_layer *)reuse)->l : NULL;
    cl->l = moe_layer_build(c, src, want, old, cpu_of(be)->impl, cpu_of(be)->pool, progress,
                            progress_ctx, err);
    if (!cl->l) {
        free(cl);
        return NULL;
    }
    cl->base.be = be;
    cl->base.index = src->layer;
    return &cl->base;
}

static void cpu_layer_free(mb_layer *l)
{
    moe_layer_free(&((cpu_layer *)l)->l);
    free(l);
}

static bool cpu_layer_owns(const mb_layer *l, int expert)
{
    return moe_layer_owns(layer_of(l), expert) != 0;
}

static uint64_t cpu_layer_bytes(const mb_layer *l)
{
    return moe_layer_bytes(layer_of(l));
}

static mb_step *cpu_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x,
                               const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q,
                               float *qs, uint16_t *xn, ep_err *err)
{
    const moe_layer *l = layer_of(ml);
    size_t H = (size_t)moe_layer_config(l)->hidden_size;
    cpu_step *s = calloc(1, sizeof *s);
    uint16_t *own_xn = xn ? NULL : malloc((size_t)T * H * 2 + 1);
    if (!s || (!xn && !own_xn)) {
        ep_err_set(err, "out of memory for a step of %d tokens", T);
        goto fail;
    }
    s->base.be = be;
    s->l = l;
    s->T = T;
    s->q = q;
    s->qs = qs;
    s->topk_ids = topk_ids;
    if (T > 0) {
        if (moe_route(l, T, x, ids, xn ? xn : own_xn, topk_ids, topk_w, cpu_of(be)->pool, err) < 0)
            goto fail;
        moe_quant(l, T, xn ? xn : own_xn, q, qs);
    }
    free(own_xn);
    return &s->base;
fail:
    free(own_xn);
    free(s);
    return NULL;
}

static int cpu_step_shared(mb_step *ms, ep_err *err)
{
    cpu_step *s = (cpu_step *)ms;
    if (s->shared || s->T == 0)
        return 0;
    size_t H = (size_t)moe_layer_config(s->l)->hidden_size;
    s->shared = malloc((size_t)s->T * H * 2);
    if (!s->shared)
        return ep_err_set(err, "out of memory for the shared expert of %d tokens", s->T);
    return moe_shared(s->l, s->T, s->q, s->qs, s->shared, cpu_of(ms->be)->pool, err);
}

/* The pending steps' rows gathered, one moe_shared call, the rows handed back. */
static int cpu_steps_shared(mb_step *const *ms, int n, ep_err *err)
{
    const moe_layer *l = ((cpu_step *)ms[0])->l;
    size_t H = (size_t)moe_layer_config(l)->hidden_size, SC = H / EP_FP8_BLOCK, T = 0;
    for (int i = 0; i < n; i++) {
        cpu_step *s = (cpu_step *)ms[i];
        if (s->l != l || ms[i]->be != ms[0]->be)
            return ep_err_set(err, "mb_steps_shared: steps of different layers or backends");
        if (!s->shared)
            T += (size_t)s->T;
    }
    if (T > EP_MAX_TOKENS) /* one call bounds its tokens: run them one by one */
        T = 0;
    uint8_t *q = T ? malloc(T * H) : NULL;
    float *qs = T ? malloc(T * SC * sizeof *qs) : NULL;
    uint16_t *out = T ? malloc(T * H * 2) : NULL;
    int rc = 0;
    if (q && qs && out) {
        size_t t0 = 0;
        for (int i = 0; i < n; i++) {
            cpu_step *s = (cpu_step *)ms[i];
            if (s->shared)
                continue;
            memcpy(q + t0 * H, s->q, (size_t)s->T * H);
            memcpy(qs + t0 * SC, s->qs, (size_t)s->T * SC * sizeof *qs);
            t0 += (size_t)s->T;
        }
        rc = moe_shared(l, (int)T, q, qs, out, cpu_of(ms[0]->be)->pool, err);
        for (int i = 0, t = 0; rc == 0 && i < n; i++) {
            cpu_step *s = (cpu_step *)ms[i];
            if (s->shared || s->T == 0)
                continue;
            s->shared = malloc((size_t)s->T * H * 2);
            if (s->shared)
                memcpy(s->shared, out + (size_t)t * H, (size_t)s->T * H * 2);
            t += s->T;
        }
    }
    free(q);
    free(qs);
    free(out);
    for (int i = 0; rc == 0 && i < n; i++) /* what is left: too many tokens or no memory */
        rc = cpu_step_shared(ms[i], err);
    return rc;
}

static int cpu_step_finish(mb_step *ms, const uint16_t *eo, uint16_t *out, ep_err *err)
{
    cpu_step *s = (cpu_step *)ms;
    if (s->T == 0)
        return 0;
    if (cpu_step_shared(ms, err) < 0)
        return -1;
    const mc_config *c = moe_layer_config(s->l);
    moe_combine(s->T, c->num_experts_per_tok, c->hidden_size, s->topk_ids, eo, s->shared, out);
    return 0;
}

static void cpu_step_free(mb_step *ms)
{
    cpu_step *s = (cpu_step *)ms;
    free(s->shared);
    free(s->own_q);
    free(s->own_qs);
    free(s->eo);
    free(ms);
}

static int cpu_experts(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *q,
                       const float *qs, int n_pairs, const uint32_t *pair_row,
                       const uint32_t *pair_expert, const float *pair_w, uint16_t *out, ep_err *err)
{
    return moe_experts(layer_of(l), n_rows, q, qs, n_pairs, pair_row, pair_expert, pair_w, out,
                       cpu_of(be)->pool, err);
}

static int cpu_quant(mb_backend *be, const mb_layer *l, int n, const uint16_t *xn, uint8_t *q,
                     float *qs, ep_err *err)
{
    moe_quant(layer_of(l), n, xn, q, qs);
    return 0;
}

static int cpu_forward(mb_backend *be, const mb_layer *l, int T, const uint16_t *x,
                       const int64_t *ids, uint16_t *out, int32_t *topk_ids, float *topk_w,
                       ep_err *err)
{
    return moe_forward(layer_of(l), T, x, ids, out, topk_ids, topk_w, cpu_of(be)->pool, err);
}

/* ---- device operations on host memory ---------------------------------------------------- */

/* The backend itself: a handle that names this backend's (empty) queue to a communicator, which
 * then waits on it only for its own transfers; every operation below is done when it
 * returns. */
static void *cpu_dev_stream(mb_backend *be)
{
    return be;
}

static int cpu_dev_poll(mb_backend *be, ep_err *err)
{
    return 0;
}

static int cpu_dev_wait(mb_backend *be, int64_t deadline, ep_err *err)
{
    return 0;
}

static int cpu_dev_alloc(mb_backend *be, void **p, size_t bytes, ep_err *err)
{
    *p = malloc(bytes);
    return *p ? 0 : ep_err_set(err, "out of memory for a %zu-byte buffer", bytes);
}

static void cpu_dev_free(mb_backend *be, void *p)
{
    free(p);
}

static int cpu_dev_copy(mb_backend *be, void *dst, const void *src, size_t bytes, ep_err *err)
{
    memcpy(dst, src, bytes);
    return 0;
}

static mb_step *cpu_dev_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x,
                                   const int64_t *ids, int32_t *topk_ids, float *topk_w,
                                   int64_t deadline, ep_err *err)
{
    const mc_config *c = moe_layer_config(layer_of(ml));
    size_t H = (size_t)c->hidden_size, k = (size_t)c->num_experts_per_tok;
    uint8_t *q = malloc((size_t)T * H + 1);
    float *qs = malloc((size_t)T * (H / EP_FP8_BLOCK) * sizeof *qs + 1);
    uint16_t *eo = calloc((size_t)T * k * H + 1, 2);
    mb_step *ms = q && qs && eo
                      ? cpu_step_begin(be, ml, T, x, ids, topk_ids, topk_w, q, qs, NULL, err)
                      : NULL;
    if (ms == NULL) {
        if (!q || !qs || !eo)
            ep_err_set(err, "out of memory for a step of %d tokens", T);
        free(q);
        free(qs);
        free(eo);
        return NULL;
    }
    cpu_step *s = (cpu_step *)ms;
    s->own_q = q;
    s->own_qs = qs;
    s->eo = eo;
    return ms;
}

static const uint8_t *cpu_dev_step_q(const mb_step *ms)
{
    return ((const cpu_step *)ms)->own_q;
}

static const float *cpu_dev_step_qs(const mb_step *ms)
{
    return ((const cpu_step *)ms)->own_qs;
}

/* The CUDA gather's arithmetic: e8m0 codes by fmt_e8m0_ceil of scales known to be powers of
 * two. */
static int cpu_dev_gather(mb_backend *be, int H, int n, const uint32_t *rows, const uint8_t *q,
                          const float *qs, bool e8m0, uint8_t *codes, void *scales, ep_err *err)
{
    size_t SC = (size_t)H / EP_FP8_BLOCK;
    for (size_t i = 0; i < (size_t)n; i++) {
        memcpy(codes + i * (size_t)H, q + (size_t)rows[i] * (size_t)H, (size_t)H);
        const float *from = qs + (size_t)rows[i] * SC;
        if (!e8m0) {
            memcpy((float *)scales + i * SC, from, SC * sizeof *from);
            continue;
        }
        for (size_t b = 0; b < SC; b++)
            ((uint8_t *)scales)[i * SC + b] = fmt_e8m0_ceil(from[b]);
    }
    return 0;
}

static int cpu_dev_scales_to_f32(mb_backend *be, size_t n, const uint8_t *e8m0, float *f32,
                                 ep_err *err)
{
    for (size_t i = 0; i < n; i++)
        f32[i] = fmt_e8m0_to_f32(e8m0[i]);
    return 0;
}

static int cpu_dev_scatter(mb_backend *be, int H, int n, const uint32_t *slots,
                           const uint16_t *rows, uint16_t *eo, ep_err *err)
{
    for (size_t i = 0; i < (size_t)n; i++)
        memcpy(eo + (size_t)slots[i] * (size_t)H, rows + i * (size_t)H, (size_t)H * 2);
    return 0;
}

static uint16_t *cpu_dev_step_eo(mb_step *ms, ep_err *err)
{
    return ((cpu_step *)ms)->eo;
}

static int cpu_dev_step_finish(mb_step *ms, uint16_t *out, int64_t deadline, ep_err *err)
{
    return cpu_step_finish(ms, ((cpu_step *)ms)->eo, out, err);
}

static const mb_vtable CPU_VT = {
    .destroy = cpu_destroy,
    .device = cpu_device,
    .layer_footprint = cpu_layer_footprint,
    .step_footprint = cpu_step_footprint,
    .reserve = cpu_reserve,
    .layer_load = cpu_layer_load,
    .layer_free = cpu_layer_free,
    .layer_owns = cpu_layer_owns,
    .layer_bytes = cpu_layer_bytes,
    .step_begin = cpu_step_begin,
    .step_shared = cpu_step_shared,
    .steps_shared = cpu_steps_shared,
    .step_finish = cpu_step_finish,
    .step_free = cpu_step_free,
    .experts = cpu_experts,
    .quant = cpu_quant,
    .forward = cpu_forward,
    .dev_stream = cpu_dev_stream,
    .dev_poll = cpu_dev_poll,
    .dev_wait = cpu_dev_wait,
    .dev_alloc = cpu_dev_alloc,
    .dev_free = cpu_dev_free,
    .dev_alloc_host = cpu_dev_alloc,
    .dev_free_host = cpu_dev_free,
    .dev_h2d = cpu_dev_copy,
    .dev_d2h = cpu_dev_copy,
    .dev_step_begin = cpu_dev_step_begin,
    .dev_step_q = cpu_dev_step_q,
    .dev_step_qs = cpu_dev_step_qs,
    .dev_gather = cpu_dev_gather,
    .dev_scales_to_f32 = cpu_dev_scales_to_f32,
    .dev_experts = cpu_experts, /* host memory already; moe_experts checks the pairs */
    .dev_scatter = cpu_dev_scatter,
    .dev_step_eo = cpu_dev_step_eo,
    .dev_step_finish = cpu_dev_step_finish,
};

mb_backend *mb_cpu_create(const mb_options *o, ep_err *err)
{
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) {
        ep_err_set(err, "out of memory for the CPU backend");
        return NULL;
    }
    b->base.vt = &CPU_VT;
    b->base.kind = MB_DEV_CPU;
    b->impl = o->impl == ISA_AUTO ? isa_best() : o->impl;
    snprintf(b->base.name, sizeof b->base.name, "cpu-%s", isa_name(b->impl));
    b->pool = tpool_create(o->threads, err);
    if (!b->pool) {
        free(b);
        return NULL;
    }
    return &b->base;
}
