/*
 * bench_bounds.c — see bench_bounds.h. The loops are compiled for AVX2 and AVX-512 with target
 * attributes and chosen by cpuid, so the file builds without special flags.
 */
#include "bench_bounds.h"

#include <immintrin.h>
#include <pthread.h>
#include <time.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int bench_wide(void)
{
    return __builtin_cpu_supports("avx512f");
}

__attribute__((target("avx2"))) static double sum_avx2(const float *p, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
    }
    float f[8];
    _mm256_storeu_ps(f, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return f[0] + f[7];
}

__attribute__((target("avx512f"))) static double sum_avx512(const float *p, size_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

#define FMA_ITERS 10000000L
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* 12 independent chains (distinct starting values: equal chains would be merged into one by
 * the compiler) hide the FMA latency on every core we know */
__attribute__((target("avx2,fma"))) static double fma_avx2(void)
{
#define D2(i) __m256 a##i = _mm256_set1_ps(1 + i);
    CHAINS(D2)
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < FMA_ITERS; i++) {
#define F2(i) a##i = _mm256_fmadd_ps(a##i, m, c);
        CHAINS(F2)
        __asm__ volatile("" : "+x"(m), "+x"(c));
    }
    __m256 s = _mm256_setzero_ps();
#define S2(i) s = _mm256_add_ps(s, a##i);
    CHAINS(S2)
    float f[8];
    _mm256_storeu_ps(f, s);
    return f[0];
}

__attribute__((target("avx512f"))) static double fma_avx512(void)
{
#define D5(i) __m512 a##i = _mm512_set1_ps(1 + i);
    CHAINS(D5)
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < FMA_ITERS; i++) {
#define F5(i) a##i = _mm512_fmadd_ps(a##i, m, c);
        CHAINS(F5)
        __asm__ volatile("" : "+v"(m), "+v"(c));
    }
    __m512 s = _mm512_setzero_ps();
#define S5(i) s = _mm512_add_ps(s, a##i);
    CHAINS(S5)
    return _mm512_reduce_add_ps(s);
}

typedef struct par_arg {
    const float *p;
    size_t n;
    int fma;
    double sink, t0, t1;
    pthread_barrier_t *bar;
} par_arg;

static void *par_thread(void *va)
{
    par_arg *a = va;
    pthread_barrier_wait(a->bar);
    a->t0 = bench_now();
    if (a->fma)
        a->sink = bench_wide() ? fma_avx512() : fma_avx2();
    else
        a->sink = bench_wide() ? sum_avx512(a->p, a->n) : sum_avx2(a->p, a->n);
    a->t1 = bench_now();
    return NULL;
}

/* seconds from the first thread's start to the last one's end, as the threads saw them (the
 * caller may be scheduled late on a busy machine) */
static double par_run(int fma, const float *buf, size_t per, int nthreads)
{
    pthread_t th[64];
    par_arg arg[64];
    pthread_barrier_t bar;
    nthreads = nthreads < 1 ? 1 : nthreads > 64 ? 64 : nthreads;
    pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
    for (int t = 0; t < nthreads; t++) {
        arg[t] =
            (par_arg){.p = buf ? buf + per * (size_t)t : NULL, .n = per, .fma = fma, .bar = &bar};
        pthread_create(&th[t], NULL, par_thread, &arg[t]);
    }
    double t0 = 1e30, t1 = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        t0 = arg[t].t0 < t0 ? arg[t].t0 : t0;
        t1 = arg[t].t1 > t1 ? arg[t].t1 : t1;
    }
    pthread_barrier_destroy(&bar);
    return t1 - t0;
}

double bench_read_bw(const float *buf, size_t n, int nthreads)
{
    size_t per = n / (size_t)nthreads / 64 * 64;
    return (double)(per * (size_t)nthreads * sizeof(float)) / par_run(0, buf, per, nthreads);
}

double bench_fma_peak(int nthreads)
{
    double dt = par_run(1, NULL, 0, nthreads);
    return (double)FMA_ITERS * 12 * (bench_wide() ? 16 : 8) * 2 * nthreads / dt;
}
