/*
 * bench_mathf.c — ns per call of mf_expf / mf_log1pf (kernels/mathf.h) against the C library's
 * expf / log1pf, measured in the same run on the same inputs (docs/performance.md).
 *
 *   bench_mathf [--runs R]
 *
 * Inputs: 4096 floats, exp's uniform in [-20, 20] (SiLU's -g and the router's logits), log1p's
 * the exps of those (what softplus feeds it), and the score sqrtf(log1p(exp(l))) as the router
 * computes it. Each figure is the fastest of R runs (default 7) of 2^24 calls; the accurate
 * (double-double) paths alone are timed as well, for the rare inputs that need them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/simd_internal.h"
#include "kernels/gemm.h"
#include "kernels/mathf.h"

#define N     4096
#define CALLS (1 << 24)

static float in_exp[N], in_log[N];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float libm_score(float l)
{
    return sqrtf(l > 20.0f ? l : log1pf(expf(l)));
}

static float mf_score(float l)
{
    return sqrtf(l > 20.0f ? l : mf_log1pf(mf_expf(l)));
}

/* ns per call, the fastest of runs */
static double time_fn(float (*fn)(float), const float *in, int runs)
{
    double best = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < runs; r++) {
        float acc = 0;
        double t0 = now();
        for (int c = 0; c < CALLS; c += N)
            for (int i = 0; i < N; i++)
                acc += fn(in[i]);
        double t = (now() - t0) / CALLS * 1e9;
        sink = sink + acc;
        if (t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    int runs = 7;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        in_exp[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 40.0 - 20.0);
        in_log[i] = expf(in_exp[i]);
    }
    struct {
        const char *name;
        float (*mf)(float), (*libm)(float);
        const float *in;
    } rows[] = {
        {"expf", mf_expf, expf, in_exp},
        {"log1pf", mf_log1pf, log1pf, in_log},
        {"score", mf_score, libm_score, in_exp},
    };
    printf("%-8s %12s %12s %8s\n", "function", "mf ns/call", "libm ns/call", "ratio");
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        double a = time_fn(rows[r].mf, rows[r].in, runs);
        double b = time_fn(rows[r].libm, rows[r].in, runs);
        printf("%-8s %12.2f %12.2f %8.2f\n", rows[r].name, a, b, a / b);
    }
#ifdef EPMOE_AVX2_KERNELS
    if (isa_supported(ISA_AVX2)) {
        double best = 1e30;
        volatile float sink = 0;
        float out[8];
        for (int r = 0; r < runs; r++) {
            double t0 = now();
            for (int c = 0; c < CALLS; c += N)
                for (int i = 0; i < N; i += 8) {
                    mf_expf8_avx2(in_exp + i, out);
                    sink = sink + out[i & 7];
                }
            double t = (now() - t0) / CALLS * 1e9;
            best = t < best ? t : best;
        }
        printf("%-8s %12.2f %12s %8.2f  (mf_expf8_avx2, SwiGLU's path: ns per element)\n",
               "expf x8", best, "", best / time_fn(expf, in_exp, runs));
    }
#endif
    printf("accurate paths alone: expf %.1f ns, log1pf %.1f ns\n",
           time_fn(mf_expf_accurate, in_exp, runs), time_fn(mf_log1pf_accurate, in_log, runs));
    return 0;
}
