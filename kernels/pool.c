/*
 * pool.c — the thread pool (pool.h).
 *
 * A fixed set of pthreads waits for a job generation number to change. A new job bumps the
 * generation under the mutex and broadcasts; a worker first spins briefly on the generation
 * (back-to-back GEMMs of a MoE layer arrive microseconds apart, and a sleeping thread costs
 * tens of microseconds to wake) and then sleeps on the condition variable. The caller runs
 * share 0 itself and waits the same way for the pending count to reach zero.
 */
#include "kernels/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* Spin iterations (each one pause, ~10-60 ns) before a waiting thread sleeps. */
#define POOL_SPIN 4000

struct tpool {
    int n; /* compute threads, the caller included */
    pthread_t *threads;
    void **scratch;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint gen;
    atomic_int pending;
    int stop;
    tpool_task_fn fn;
    void *ctx;
};

typedef struct pool_arg {
    tpool *pool;
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
    tpool *p = arg.pool;
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
        tpool_task_fn fn = p->fn;
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

static void pool_stop_threads(tpool *p, int started)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < started; i++)
        pthread_join(p->threads[i], NULL);
}

static void pool_free_buffers(tpool *p)
{
    if (p->scratch)
        for (int i = 0; i < p->n; i++)
            free(p->scratch[i]);
    free(p->scratch);
    free(p->threads);
}

tpool *tpool_create(int nthreads, ep_err *err)
{
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    if (nthreads > TPOOL_MAX_THREADS)
        nthreads = TPOOL_MAX_THREADS;
    tpool *p = calloc(1, sizeof *p);
    if (!p) {
        ep_err_set(err, "tpool_create: out of memory");
        return NULL;
    }
    p->n = nthreads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    int started = 1;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        ep_err_set(err, "tpool_create: cannot initialise a mutex");
        goto fail_mutex;
    }
    if (pthread_cond_init(&p->work_cv, NULL) != 0) {
        ep_err_set(err, "tpool_create: cannot initialise a condition variable");
        goto fail_work_cv;
    }
    if (pthread_cond_init(&p->done_cv, NULL) != 0) {
        ep_err_set(err, "tpool_create: cannot initialise a condition variable");
        goto fail_done_cv;
    }
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    p->scratch = calloc((size_t)nthreads, sizeof *p->scratch);
    int ok = p->threads && p->scratch;
    for (int i = 0; ok && i < nthreads; i++)
        if (posix_memalign(&p->scratch[i], 64, TPOOL_SCRATCH) != 0) {
            p->scratch[i] = NULL;
            ok = 0;
        }
    if (!ok) {
        ep_err_set(err, "tpool_create: out of memory for %d threads", nthreads);
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
            ep_err_set(err, "tpool_create: cannot start thread %d of %d", started, nthreads);
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

void tpool_destroy(tpool **self_p)
{
    if (!self_p || !*self_p)
        return;
    tpool *p = *self_p;
    pool_stop_threads(p, p->n);
    pool_free_buffers(p);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    *self_p = NULL;
}

int tpool_size(const tpool *p)
{
    return p ? p->n : 1;
}

void *tpool_scratch(tpool *pool, int tid)
{
    return pool ? pool->scratch[tid] : NULL;
}

void tpool_run(tpool *p, tpool_task_fn fn, void *ctx)
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

/* ---- tpool_for ---- */

typedef struct for_ctx {
    tpool_for_fn fn;
    void *ctx;
    int n;
    atomic_int next;
} for_ctx;

static void for_share(void *vctx, int tid, int nthreads)
{
    for_ctx *f = vctx;
    (void)nthreads;
    for (;;) {
        int i = atomic_fetch_add_explicit(&f->next, 1, memory_order_relaxed);
        if (i >= f->n)
            return;
        f->fn(f->ctx, i, tid);
    }
}

void tpool_for(tpool *pool, int n, tpool_for_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    for_ctx f = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&f.next, 0);
    tpool_run(n > 1 ? pool : NULL, for_share, &f);
}
