/*
 * cuda_load.c — loading a layer onto the CUDA backend (cuda_internal.h): each tensor copied from
 * the (pageable) mapping into one of two pinned staging buffers and uploaded asynchronously, so
 * reading tensor i+1 overlaps the copy of tensor i; FP8 weight scales decoded to f32 on the
 * host, MXFP4 scales kept as their E8M0 bytes, the gate transposed to [H, E]. A reused layer's
 * tensors are copied on the device instead.
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

/* ---- loading ----------------------------------------------------------------------------- */

typedef struct up_ctx {
    cuda_backend *b;
    int next; /* staging buffer to fill next */
    bool pending[2];
    mb_progress_fn progress;
    void *progress_ctx;
    uint64_t done;
    int64_t deadline; /* clk_mono_ms */
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
            void *p = cu_arena_carve(a, pass ? sb : wb);
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
    l->norm = cu_arena_carve(l->arena, H * 2);
    l->gate_t = cu_arena_carve(l->arena, E * H * 2);
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

void cuda_layer_free(mb_layer *ml)
{
    cuda_layer *l = (cuda_layer *)ml;
    cu_arena_unref(&l->arena);
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

mb_layer *cuda_layer_load(mb_backend *be, const mc_config *c, const mb_layer_src *src,
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
        if (!(l->arena = cu_arena_new(b, need, err)))
            goto fail;
    } else {
        l->arena = b->arena;
        atomic_fetch_add(&l->arena->refs, 1);
    }
    up_ctx u = {
        .b = b, .progress = progress, .progress_ctx = progress_ctx, .deadline = cu_deadline(b)};
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

bool cuda_layer_owns(const mb_layer *l, int e)
{
    return e >= 0 && e < cl(l)->E && cl(l)->owned[e];
}

uint64_t cuda_layer_bytes(const mb_layer *l)
{
    return cl(l)->bytes;
}
