/*
 * gemm_drive.c — the CPU expert GEMMs behind gemm.h (the contract, a header of its own, so the
 * implementations below this driver can include it): argument checks, packing, the tiling driver
 * that splits a call over the threads of a pool (kernels/pool.h), and running one or many
 * calls. The instruction set is chosen in kernels/isa.c; the kernels themselves are in
 * gemm_ref.c, gemm_avx2*.c and gemm_avx512.c.
 *
 * Every output element is computed by one thread from its own row and column, so the split
 * never changes a result.
 */
#include "kernels/gemm.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"

/* ---- instruction sets this build lacks ---- */

#ifndef EPMOE_AVX2_KERNELS
/* Not an x86-64 build: the SIMD files are not compiled, and isa_supported never lets a
 * caller reach these. */
int gemm_avx2_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    return ep_err_set(err, "gemm: AVX2 kernels are not built on this architecture");
}

int gemm_avx2_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err)
{
    return ep_err_set(err, "gemm: AVX2 kernels are not built on this architecture");
}
#endif

#ifndef EPMOE_AVX512_KERNELS
/* The compiler cannot build the AVX-512 file (or not x86-64): never chosen. */
int gemm_avx512_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    return ep_err_set(err, "gemm: AVX-512 kernels are not built");
}

int gemm_avx512_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err)
{
    return ep_err_set(err, "gemm: AVX-512 kernels are not built");
}
#endif

const gemm_kops *gemm_kops_of(isa_level impl)
{
#ifdef EPMOE_AVX2_KERNELS
    if (impl == ISA_AVX2)
        return &gemm_avx2_kops;
#endif
#ifdef EPMOE_AVX512_KERNELS
    if (impl == ISA_AVX512)
        return &gemm_avx512_kops;
#endif
    (void)impl;
    return NULL;
}

static int resolve_impl(isa_level *impl, const char *fn, ep_err *err)
{
    if (*impl == ISA_AUTO)
        *impl = isa_best();
    if ((unsigned)*impl >= ISA_COUNT)
        return ep_err_set(err, "%s: unknown implementation %d", fn, (int)*impl);
    if (!isa_supported(*impl))
        return ep_err_set(err, "%s: implementation %s requested, but this CPU (or build) lacks it",
                          fn, isa_name(*impl));
    return 0;
}

static int check_dims(int N, int K, const char *fn, ep_err *err)
{
    if (N <= 0 || N > GEMM_MAX_DIM || N % 128 != 0)
        return ep_err_set(err, "%s: N=%d must be a positive multiple of 128 and <= %d", fn, N,
                          GEMM_MAX_DIM);
    if (K <= 0 || K > GEMM_MAX_DIM || K % 128 != 0)
        return ep_err_set(err, "%s: K=%d must be a positive multiple of 128 and <= %d", fn, K,
                          GEMM_MAX_DIM);
    return 0;
}

static gemm_weight *weight_new(gemm_kind kind, isa_level impl, int N, int K, ep_err *err)
{
    gemm_weight *w = calloc(1, sizeof *w);
    if (!w) {
        ep_err_set(err, "gemm: out of memory for a weight header");
        return NULL;
    }
    w->kind = kind;
    w->impl = impl;
    w->N = N;
    w->K = K;
    w->bytes = sizeof *w;
    return w;
}

gemm_weight *gemm_pack_fp8(int N, int K, const uint8_t *wq, const float *w_scale, isa_level impl,
                           ep_err *err)
{
    if (check_dims(N, K, "gemm_pack_fp8", err) < 0 || resolve_impl(&impl, "gemm_pack_fp8", err) < 0)
        return NULL;
    gemm_weight *w = weight_new(GEMM_KIND_FP8, impl, N, K, err);
    if (!w)
        return NULL;
    size_t ns = (size_t)(N / 128) * (size_t)(K / 128);
    w->fscale = malloc(ns * sizeof(float));
    if (!w->fscale)
        goto fail_oom;
    memcpy(w->fscale, w_scale, ns * sizeof(float));
    w->bytes += ns * sizeof(float);
    if (impl != ISA_REF) {
        int rc =
            impl == ISA_AVX2 ? gemm_avx2_pack_fp8(w, wq, err) : gemm_avx512_pack_fp8(w, wq, err);
        if (rc < 0)
            goto fail;
    } else {
        w->data_bytes = (size_t)N * (size_t)K;
        w->data = malloc(w->data_bytes);
        if (!w->data)
            goto fail_oom;
        memcpy(w->data, wq, w->data_bytes);
        w->bytes += w->data_bytes;
    }
    return w;
fail_oom:
    ep_err_set(err, "gemm_pack_fp8: out of memory for a %dx%d weight", N, K);
fail:
    gemm_weight_free(&w);
    return NULL;
}

gemm_weight *gemm_pack_mxfp4(int N, int K, const uint8_t *w_packed, const uint8_t *w_scale,
                             isa_level impl, ep_err *err)
{
    if (check_dims(N, K, "gemm_pack_mxfp4", err) < 0 ||
        resolve_impl(&impl, "gemm_pack_mxfp4", err) < 0)
        return NULL;
    gemm_weight *w = weight_new(GEMM_KIND_MXFP4, impl, N, K, err);
    if (!w)
        return NULL;
    if (impl != ISA_REF) {
        int rc = impl == ISA_AVX2 ? gemm_avx2_pack_mxfp4(w, w_packed, w_scale, err)
                                  : gemm_avx512_pack_mxfp4(w, w_packed, w_scale, err);
        if (rc < 0)
            goto fail;
    } else {
        size_t nd = (size_t)N * (size_t)(K / 2), ns = (size_t)N * (size_t)(K / 32);
        w->data = malloc(nd);
        w->bscale = malloc(ns);
        if (!w->data || !w->bscale)
            goto fail_oom;
        memcpy(w->data, w_packed, nd);
        memcpy(w->bscale, w_scale, ns);
        w->data_bytes = nd;
        w->bytes += nd + ns;
    }
    return w;
fail_oom:
    ep_err_set(err, "gemm_pack_mxfp4: out of memory for a %dx%d weight", N, K);
fail:
    gemm_weight_free(&w);
    return NULL;
}

void gemm_weight_free(gemm_weight **self_p)
{
    if (!self_p || !*self_p)
        return;
    gemm_weight *w = *self_p;
    free(w->data);
    free(w->fscale);
    free(w->bscale);
    free(w->nanrows);
    free(w->lo_off);
    free(w->lo_ent);
    free(w->int_safe);
    free(w);
    *self_p = NULL;
}

int gemm_weight_n(const gemm_weight *w)
{
    return w->N;
}

int gemm_weight_k(const gemm_weight *w)
{
    return w->K;
}

size_t gemm_weight_bytes(const gemm_weight *w)
{
    return w->bytes;
}

/* ---- the tiling driver (every SIMD implementation) ---- */

static void zero_out(const gemm_call *c, int m0, int mt, int r0, int r1)
{
    for (int m = m0; m < m0 + mt; m++)
        memset(c->out + (size_t)m * c->w->N + r0, 0, (size_t)(r1 - r0) * sizeof(float));
}

/* How one call is cut into work: every thread computes the same plan. */
typedef struct gemm_plan {
    int ipath;
    int kc;     /* K per tile: K, or a multiple of 128 when a micro-tile of K does not fit */
    int mc;     /* tokens per tile */
    int chunk;  /* row units per work item */
    long nch;   /* items per token tile */
    long ntile; /* token tiles */
} gemm_plan;

static void plan_of(const gemm_call *c, const gemm_kops *ops, size_t cap, int nthreads,
                    gemm_plan *p)
{
    const gemm_weight *w = c->w;
    int M = c->M, K = w->K, units = w->N / ops->unit;
    p->ipath = ops->ipath(w, M);
    /* Tiles: the whole K when a micro-tile of tokens fits the scratch (weights then stream
     * once, sequentially, per tile of tokens); otherwise the largest multiple of 128 that
     * does. */
    int want = M < 6 ? M : 6;
    int kc = K;
    for (;;) {
        size_t tb = ops->token_bytes(w, kc, p->ipath);
        if (tb * (size_t)want <= cap || kc == 128)
            break;
        kc = (kc / 2 + 127) / 128 * 128;
    }
    p->kc = kc;
    /* Tokens per tile: as many as fit GEMM_TILE_BYTES (at least one micro-tile), so that a
     * tile's prepared activations stay in L2 while every row unit runs against them. */
    size_t tb = ops->token_bytes(w, kc, p->ipath);
    /* the many-token FP8 path builds a weight panel per tile: twice the tokens amortise it */
    size_t tile_max = p->ipath ? 2 * GEMM_TILE_BYTES : GEMM_TILE_BYTES;
    size_t tile_cap = cap < tile_max ? cap : tile_max;
    if (tile_cap < tb * (size_t)want)
        tile_cap = cap < tb * (size_t)want ? cap : tb * (size_t)want;
    int mc = (int)(tile_cap / tb);
    if (mc > M)
        mc = M;
    if (mc < M && mc >= 6)
        mc -= mc % 6;
    p->mc = mc < 1 ? 1 : mc;
    /* Four items per thread and token tile: long enough streams for the prefetchers (shorter
     * chunks measured 5-20 % slower in decode), short enough to balance. */
    int chunk = units / (4 * nthreads);
    p->chunk = chunk < 1 ? 1 : chunk;
    p->nch = (units + p->chunk - 1) / p->chunk;
    p->ntile = (M + p->mc - 1) / p->mc;
}

/* K in several chunks: a row's blocks must be added in K order, so each thread owns a fixed
 * range of units through all chunks. */
static void drive_chunked_k(const gemm_call *c, const gemm_kops *ops, const gemm_plan *p, int tid,
                            int nthreads, void *scratch)
{
    int M = c->M, K = c->w->K, U = ops->unit, units = c->w->N / U;
    int u0 = (int)((long)units * tid / nthreads), u1 = (int)((long)units * (tid + 1) / nthreads);
    if (u0 >= u1)
        return;
    for (int m0 = 0; m0 < M; m0 += p->mc) {
        int mt = M - m0 < p->mc ? M - m0 : p->mc;
        zero_out(c, m0, mt, u0 * U, u1 * U);
        for (int k0 = 0; k0 < K; k0 += p->kc) {
            int kn = K - k0 < p->kc ? K - k0 : p->kc;
            ops->tile_prep(c, m0, mt, k0, kn, scratch, p->ipath);
            ops->tile_run(c, u0, u1, m0, mt, k0, kn, scratch, p->ipath);
        }
    }
}

/* Work item `item` (< ntile * nch) of a whole-K call: one token tile against one chunk of row
 * units. *prepared names the tile this thread's scratch holds (-1: none); a thread prepares a
 * token tile the first time it takes an item from it. */
static void drive_item(const gemm_call *c, const gemm_kops *ops, const gemm_plan *p, long item,
                       void *scratch, long *prepared)
{
    int M = c->M, K = c->w->K, U = ops->unit, units = c->w->N / U;
    long tile = item / p->nch;
    int u0 = (int)(item % p->nch) * p->chunk, u1 = u0 + p->chunk < units ? u0 + p->chunk : units;
    int m0 = (int)tile * p->mc, mt = M - m0 < p->mc ? M - m0 : p->mc;
    if (tile != *prepared) {
        ops->tile_prep(c, m0, mt, 0, K, scratch, p->ipath);
        *prepared = tile;
    }
    zero_out(c, m0, mt, u0 * U, u1 * U);
    ops->tile_run(c, u0, u1, m0, mt, 0, K, scratch, p->ipath);
}

void gemm_drive(const gemm_call *c, const gemm_kops *ops, gemm_sched *sched, int tid, int nthreads,
                void *scratch, size_t cap)
{
    gemm_plan p;
    plan_of(c, ops, cap, nthreads, &p);
    if (p.kc < c->w->K) {
        drive_chunked_k(c, ops, &p, tid, nthreads, scratch);
        return;
    }
    /* Whole K per tile: threads take (token tile, unit chunk) items in increasing order from
     * a shared counter, so a thread the OS holds back costs little, and each output element
     * is still computed by one thread alone. */
    long prepared = -1;
    for (;;) {
        long item = atomic_fetch_add_explicit(&sched->next, 1, memory_order_relaxed);
        if (item >= p.nch * p.ntile)
            break;
        drive_item(c, ops, &p, item, scratch, &prepared);
    }
}

/* ---- running ---- */

typedef struct run_ctx {
    gemm_call call;
    tpool *pool;
    const gemm_kops *ops;
    gemm_sched sched;
} run_ctx;

static void run_share(void *vctx, int tid, int nthreads)
{
    run_ctx *r = vctx;
    const gemm_weight *w = r->call.w;
    if (w->impl == ISA_REF) {
        int octets = w->N / 8;
        int ro0 = (int)((long)octets * tid / nthreads);
        int ro1 = (int)((long)octets * (tid + 1) / nthreads);
        if (ro0 < ro1)
            gemm_ref_rows(&r->call, ro0 * 8, ro1 * 8);
        return;
    }
    void *scratch = tpool_scratch(r->pool, tid);
    if (scratch) {
        gemm_drive(&r->call, r->ops, &r->sched, tid, nthreads, scratch, GEMM_THREAD_SCRATCH);
        return;
    }
    /* No pool: a per-call buffer, or a small one on the stack if memory is short (smaller
     * tiles, same results). */
    void *heap = NULL;
    if (posix_memalign(&heap, 64, GEMM_THREAD_SCRATCH) == 0) {
        gemm_drive(&r->call, r->ops, &r->sched, tid, nthreads, heap, GEMM_THREAD_SCRATCH);
        free(heap);
        return;
    }
    _Alignas(64) uint8_t stack[GEMM_MIN_SCRATCH];
    gemm_drive(&r->call, r->ops, &r->sched, tid, nthreads, stack, sizeof stack);
}

/* ---- several GEMMs as one pass ---- */

typedef struct many_ctx {
    const gemm_call *calls;
    const gemm_plan *plans;
    const long *first; /* first[i]: index of call i's first item; first[n] = all items */
    int n;
    const gemm_kops *ops;
    tpool *pool;
    /* the items not taken yet: [head, tail) as head << 32 | tail */
    atomic_uint_least64_t range;
} many_ctx;

/* Take the next item from the front (from_back 0) or the back; -1 when none is left. */
static long many_take(many_ctx *r, int from_back)
{
    uint_least64_t v = atomic_load_explicit(&r->range, memory_order_relaxed), nv;
    for (;;) {
        uint32_t head = (uint32_t)(v >> 32), tail = (uint32_t)v;
        if (head >= tail)
            return -1;
        nv = from_back ? v - 1 : v + ((uint_least64_t)1 << 32);
        if (atomic_compare_exchange_weak_explicit(&r->range, &v, nv, memory_order_relaxed,
                                                  memory_order_relaxed))
            return from_back ? (long)tail - 1 : (long)head;
    }
}

/* Half the threads work from the front of the item list and half from the back, each moving
 * through the calls in order (so each prepares a call's activations about once): with the
 * compute-bound calls first (the shared expert of a step) and memory-bound ones after (small
 * experts), one thread computes while another streams weights, instead of both doing one kind
 * of work at a time. */
static void many_share(void *vctx, int tid, int nthreads)
{
    many_ctx *r = vctx;
    void *scratch = tpool_scratch(r->pool, tid);
    int cur = -1, back = tid % 2;
    long prepared = -1;
    for (;;) {
        long item = many_take(r, back);
        if (item < 0)
            break;
        int i = cur < 0 ? (back ? r->n - 1 : 0) : cur;
        while (item >= r->first[i + 1])
            i++;
        while (item < r->first[i])
            i--;
        if (i != cur) {
            cur = i;
            prepared = -1;
        }
        drive_item(&r->calls[i], r->ops, &r->plans[i], item - r->first[i], scratch, &prepared);
    }
}

/* Items are numbered call by call, so a thread moving through them prepares each call's
 * activations about once. Calls that need K in chunks, or another implementation than the
 * first, run on their own. */
void gemm_run_many(const gemm_job *jobs, int n, tpool *pool)
{
    enum { BATCH = 64 };
    if (n <= 0)
        return;
    if (!pool || tpool_size(pool) == 1 || jobs[0].w->impl == ISA_REF) {
        for (int i = 0; i < n; i++)
            gemm_run(jobs[i].w, jobs[i].M, jobs[i].a, jobs[i].a_scale, jobs[i].out, pool);
        return;
    }
    const gemm_kops *ops = gemm_kops_of(jobs[0].w->impl);
    gemm_call calls[BATCH];
    gemm_plan plans[BATCH];
    long first[BATCH + 1];
    int nthreads = tpool_size(pool);
    for (int i0 = 0; i0 < n; i0 += BATCH) {
        int m = 0;
        first[0] = 0;
        for (int i = i0; i < n && i < i0 + BATCH; i++) {
            const gemm_job *j = &jobs[i];
            if (j->M <= 0)
                continue;
            gemm_call c = {.w = j->w, .M = j->M, .a = j->a, .a_scale = j->a_scale, .out = j->out};
            gemm_plan p;
            if (j->w->impl == jobs[0].w->impl)
                plan_of(&c, ops, GEMM_THREAD_SCRATCH, nthreads, &p);
            if (j->w->impl != jobs[0].w->impl || p.kc < j->w->K) {
                gemm_run(j->w, j->M, j->a, j->a_scale, j->out, pool);
                continue;
            }
            calls[m] = c;
            plans[m] = p;
            first[m + 1] = first[m] + p.nch * p.ntile;
            m++;
        }
        if (m == 0)
            continue;
        many_ctx r = {
            .calls = calls, .plans = plans, .first = first, .n = m, .ops = ops, .pool = pool};
        atomic_init(&r.range, (uint_least64_t)first[m]); /* head 0, tail: every item */
        tpool_run(pool, many_share, &r);
    }
}

void gemm_run(const gemm_weight *w, int M, const uint8_t *a, const float *a_scale, float *out,
              tpool *pool)
{
    if (M <= 0)
        return;
    run_ctx r = {.call = {.w = w, .M = M, .a = a, .a_scale = a_scale, .out = out},
                 .pool = pool,
                 .ops = gemm_kops_of(w->impl)};
    atomic_init(&r.sched.next, 0);
    tpool_run(pool, run_share, &r);
}
