/*
 * gemm.c — the public face of the expert GEMMs (gemm.h): implementation choice, argument
 * checks, packing, the split over N, and the thread pool.
 *
 * The pool is a fixed set of pthreads that wait for a job generation number to change. A new
 * job bumps the generation under the mutex and broadcasts; a worker first spins briefly on
 * the generation (back-to-back GEMMs of a MoE layer arrive microseconds apart, and a sleeping
 * thread costs tens of microseconds to wake) and then sleeps on the condition variable. The
 * caller runs share 0 itself and waits the same way for the pending count to reach zero.
 * Every output element is computed by one thread from its own row and column, so the split
 * never changes a result.
 */
#include "kernels/gemm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/gemm_internal.h"

/* ---- implementation choice ---- */

#ifdef EPMOE_AVX2_KERNELS
int gemm_avx2_supported(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
/* Not an x86-64 build: the AVX2 file is not compiled, and nothing may reach it. */
int gemm_avx2_supported(void)
{
    return 0;
}

int gemm_avx2_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    return ep_err_set(err, "gemm: AVX2 kernels are not built on this architecture");
}

int gemm_avx2_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err)
{
    return ep_err_set(err, "gemm: AVX2 kernels are not built on this architecture");
}

void gemm_avx2_octets(const gemm_call *c, int ro0, int ro1, void *scratch, size_t cap) {}
#endif

gemm_impl gemm_impl_best(void)
{
    const char *env = getenv("EPMOE_GEMM");
    if (env && strcmp(env, "ref") == 0)
        return GEMM_IMPL_REF;
    return gemm_avx2_supported() ? GEMM_IMPL_AVX2 : GEMM_IMPL_REF;
}

const char *gemm_impl_name(gemm_impl impl)
{
    switch (impl) {
    case GEMM_IMPL_AUTO:
        return "auto";
    case GEMM_IMPL_REF:
        return "ref";
    case GEMM_IMPL_AVX2:
        return "avx2";
    }
    return "unknown";
}

static int resolve_impl(gemm_impl *impl, const char *fn, ep_err *err)
{
    if (*impl == GEMM_IMPL_AUTO)
        *impl = gemm_impl_best();
    if (*impl == GEMM_IMPL_REF)
        return 0;
    if (*impl == GEMM_IMPL_AVX2) {
        if (!gemm_avx2_supported())
            return ep_err_set(err, "%s: implementation avx2 requested, but this CPU lacks AVX2+FMA",
                              fn);
        return 0;
    }
    return ep_err_set(err, "%s: unknown implementation %d", fn, (int)*impl);
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

static gemm_weight *weight_new(gemm_kind kind, gemm_impl impl, int N, int K, ep_err *err)
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

gemm_weight *gemm_pack_fp8(int N, int K, const uint8_t *wq, const float *w_scale, gemm_impl impl,
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
    if (impl == GEMM_IMPL_AVX2) {
        if (gemm_avx2_pack_fp8(w, wq, err) < 0)
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
                             gemm_impl impl, ep_err *err)
{
    if (check_dims(N, K, "gemm_pack_mxfp4", err) < 0 ||
        resolve_impl(&impl, "gemm_pack_mxfp4", err) < 0)
        return NULL;
    gemm_weight *w = weight_new(GEMM_KIND_MXFP4, impl, N, K, err);
    if (!w)
        return NULL;
    if (impl == GEMM_IMPL_AVX2) {
        if (gemm_avx2_pack_mxfp4(w, w_packed, w_scale, err) < 0)
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

/* ---- thread pool ---- */

/* Spin iterations (each one pause, ~10-60 ns) before a waiting thread sleeps. */
#define POOL_SPIN 4000

struct gemm_pool {
    int n; /* compute threads, the caller included */
    pthread_t *threads;
    void **scratch;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint gen;
    atomic_int pending;
    int stop;
    gemm_task_fn fn;
    void *ctx;
};

typedef struct pool_arg {
    gemm_pool *pool;
    int tid;
} pool_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *pool_main(void *argp)
{
    pool_arg arg = *(pool_arg *)argp;
    free(argp);
    gemm_pool *p = arg.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < POOL_SPIN; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        int stop;
        pthread_mutex_lock(&p->mu);
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !p->stop)
            pthread_cond_wait(&p->work_cv, &p->mu);
        stop = p->stop;
        gemm_task_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        if (stop)
            return NULL;
        seen = g;
        fn(ctx, arg.tid, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void pool_stop_threads(gemm_pool *p, int started)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < started; i++)
        pthread_join(p->threads[i], NULL);
}

static void pool_free_buffers(gemm_pool *p)
{
    if (p->scratch)
        for (int i = 0; i < p->n; i++)
            free(p->scratch[i]);
    free(p->scratch);
    free(p->threads);
}

gemm_pool *gemm_pool_create(int nthreads, ep_err *err)
{
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    if (nthreads > GEMM_MAX_THREADS)
        nthreads = GEMM_MAX_THREADS;
    gemm_pool *p = calloc(1, sizeof *p);
    if (!p) {
        ep_err_set(err, "gemm_pool_create: out of memory");
        return NULL;
    }
    p->n = nthreads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    int started = 1;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        ep_err_set(err, "gemm_pool_create: cannot initialise a mutex");
        goto fail_mutex;
    }
    if (pthread_cond_init(&p->work_cv, NULL) != 0) {
        ep_err_set(err, "gemm_pool_create: cannot initialise a condition variable");
        goto fail_work_cv;
    }
    if (pthread_cond_init(&p->done_cv, NULL) != 0) {
        ep_err_set(err, "gemm_pool_create: cannot initialise a condition variable");
        goto fail_done_cv;
    }
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    p->scratch = calloc((size_t)nthreads, sizeof *p->scratch);
    int ok = p->threads && p->scratch;
    for (int i = 0; ok && i < nthreads; i++)
        if (posix_memalign(&p->scratch[i], 64, GEMM_THREAD_SCRATCH) != 0) {
            p->scratch[i] = NULL;
            ok = 0;
        }
    if (!ok) {
        ep_err_set(err, "gemm_pool_create: out of memory for %d threads", nthreads);
        goto fail_buffers;
    }
    for (; started < nthreads; started++) {
        pool_arg *arg = malloc(sizeof *arg);
        if (arg) {
            arg->pool = p;
            arg->tid = started;
        }
        if (!arg || pthread_create(&p->threads[started], NULL, pool_main, arg) != 0) {
            free(arg);
            ep_err_set(err, "gemm_pool_create: cannot start thread %d of %d", started, nthreads);
            goto fail_threads;
        }
    }
    return p;

fail_threads:
    pool_stop_threads(p, started);
fail_buffers:
    pool_free_buffers(p);
    pthread_cond_destroy(&p->done_cv);
fail_done_cv:
    pthread_cond_destroy(&p->work_cv);
fail_work_cv:
    pthread_mutex_destroy(&p->mu);
fail_mutex:
    free(p);
    return NULL;
}

void gemm_pool_destroy(gemm_pool **self_p)
{
    if (!self_p || !*self_p)
        return;
    gemm_pool *p = *self_p;
    pool_stop_threads(p, p->n);
    pool_free_buffers(p);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    *self_p = NULL;
}

int gemm_pool_size(const gemm_pool *p)
{
    return p ? p->n : 1;
}

void *gemm_pool_scratch(gemm_pool *pool, int tid)
{
    return pool ? pool->scratch[tid] : NULL;
}

void gemm_pool_run(gemm_pool *p, gemm_task_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int i = 0; i < POOL_SPIN; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* ---- running ---- */

typedef struct run_ctx {
    gemm_call call;
    gemm_pool *pool;
    gemm_avx2_sched sched;
} run_ctx;

static void run_share(void *vctx, int tid, int nthreads)
{
    run_ctx *r = vctx;
    const gemm_weight *w = r->call.w;
    if (w->impl == GEMM_IMPL_REF) {
        int octets = w->N / 8;
        int ro0 = (int)((long)octets * tid / nthreads);
        int ro1 = (int)((long)octets * (tid + 1) / nthreads);
        if (ro0 < ro1)
            gemm_ref_rows(&r->call, ro0 * 8, ro1 * 8);
        return;
    }
    void *scratch = gemm_pool_scratch(r->pool, tid);
    if (scratch) {
        gemm_avx2_run(&r->call, &r->sched, tid, nthreads, scratch, GEMM_THREAD_SCRATCH);
        return;
    }
    /* No pool: a per-call buffer, or a small one on the stack if memory is short (smaller
     * tiles, same results). */
    void *heap = NULL;
    if (posix_memalign(&heap, 64, GEMM_THREAD_SCRATCH) == 0) {
        gemm_avx2_run(&r->call, &r->sched, tid, nthreads, heap, GEMM_THREAD_SCRATCH);
        free(heap);
        return;
    }
    _Alignas(64) uint8_t stack[GEMM_AVX2_MIN_SCRATCH];
    gemm_avx2_run(&r->call, &r->sched, tid, nthreads, stack, sizeof stack);
}

void gemm_run(const gemm_weight *w, int M, const uint8_t *a, const float *a_scale, float *out,
              gemm_pool *pool)
{
    if (M <= 0)
        return;
    run_ctx r = {.call = {.w = w, .M = M, .a = a, .a_scale = a_scale, .out = out}, .pool = pool};
    atomic_init(&r.sched.next, 0);
    gemm_pool_run(pool, run_share, &r);
}
