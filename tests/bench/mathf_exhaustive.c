/*
 * mathf_exhaustive.c — every one of the 2^32 binary32 inputs of mf_expf and mf_log1pf
 * (kernels/mathf.h) against the correct rounding, the explicit long test of docs/numerics.md §6
 * (`./dev test --long`; not in ctest).
 *
 *   mathf_exhaustive [THREADS [HARD_CASES_FILE]]
 *
 * MPFR for four billion inputs is too slow on two shared cores, so the correct rounding comes
 * from an independent reference in double written here (no table, a different reduction and
 * series than mathf.c) with a proven error bound REF_B: where both ends of y +- 2 REF_B |y|
 * round to the same float, that float is the correct rounding; where they do not (about one
 * input in 2^20) MPFR decides. Out of the references' range the answer follows from
 * monotonicity and MPFR at the range's ends (checked first). It also counts where the C
 * library's expf/log1pf and a copy of mathf.c compiled with -ffp-contract=fast -march=native
 * differ from it, and writes the inputs where mathf's fast path could not decide (the hard
 * cases test_mathf keeps) to HARD_CASES_FILE.
 * Exit status 0 when mathf misrounds nothing and the fast-math copy agrees everywhere.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/simd_internal.h"
#include "kernels/gemm.h"
#include "kernels/mathf.h"
#include "mathf_fastfp.h"
#include "mathf_mpfr.h"

#define REF_B 0x1p-46

/* 1/n! and 1/(2n+1) rounded to double once (n! is exact in double up to 18!) */
static double inv_fact[18], inv_odd[11];

static void ref_init(void)
{
    double f = 1.0;
    for (int n = 0; n < 18; n++) {
        f *= n ? n : 1;
        inv_fact[n] = 1.0 / f;
    }
    for (int n = 0; n < 11; n++)
        inv_odd[n] = 1.0 / (2 * n + 1);
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static int same(float a, float b)
{
    return (isnan(a) && isnan(b)) || bits_of(a) == bits_of(b);
}

/* Knuth's two-sum: a + b = s + e exactly */
static double two_sum(double a, double b, double *e)
{
    double s = a + b, bb = s - a;
    *e = (a - (s - bb)) + (b - bb);
    return s;
}

/* e^x for -104 < x <= 89. x = k ln2 + r with k nearest x/ln2, |r| <= 0.3466; ln2 = L1 + L2,
 * L1 32 bits wide: k L1 is exact (|k| <= 151), x - k L1 is exact (k != 0 means |x| > 0.34,
 * ulp(x) >= 2^-25; both are multiples of 2^-32 and the difference is below 2^-1); r is within
 * 2^-54 |r|+ 2^-80 of x - k ln2. e^r by Taylor to degree 17 (remainder < 2^-80) in Horner:
 * Higham's bound (ASNA Thm 5.3) gives |p^ - p| <= gamma_35 sum |a_i||r|^i = gamma_35 e^|r|
 * <= 35.1 * 2^-53 * e^(2|r|) e^r < 70.3 * 2^-53 e^r (the coefficients' own rounding is the
 * gamma's 35th term). 2^k is exact. Total < 71 * 2^-53 < 2^-46.8 relative: REF_B = 2^-46. */
static double ref_exp(float x)
{
    const double L1 = 0x1.62e42fefp-1, L2 = 0x1.473de6af278edp-34;
    double xd = x;
    double kd = (xd * 0x1.71547652b82fep+0 + 0x1.8p52) - 0x1.8p52;
    double r = (xd - kd * L1) - kd * L2;
    double p = inv_fact[17];
    for (int n = 16; n >= 0; n--)
        p = p * r + inv_fact[n];
    int k = (int)kd;
    uint64_t b = (uint64_t)(k + 1023) << 52;
    double s;
    memcpy(&s, &b, sizeof s);
    return p * s;
}

/* log1p(x) for -1 < x < inf, x != 0. u = 1 + x = uh + ul exactly; uh = 2^e m, m in
 * [sqrt 1/2, sqrt 2); f = (m - 1) + ul 2^-e (m - 1 exact by Sterbenz; one rounding, 2^-53 |f|),
 * s = f/(2 + f) (two more: |s| within 3.01 * 2^-53 |s|, |s| <= 0.1716), log(1 + f) = 2s P(s^2),
 * P(w) = sum_{n<=10} w^n/(2n+1) (remainder < 2^-60), all terms positive, so Horner is within
 * gamma_21 P; 2s P within (3.01 + 21.1 + 1) * 2^-53 of log(1 + f). e ln2 = e L1 (exact) +
 * e L2 (rounded, < 2^-82); with |e ln2| >= 2|log m| - (no cancellation beyond a factor 2) the
 * sum's rounding and the above give < 2 * 25.2 * 2^-53 + 2^-53 < 2^-47.3 relative: REF_B. */
static double ref_log1p(float x)
{
    const double L1 = 0x1.62e42fefp-1, L2 = 0x1.473de6af278edp-34;
    double ul, uh = two_sum(1.0, x, &ul);
    uint64_t b;
    memcpy(&b, &uh, sizeof b);
    int e = (int)(b >> 52) - 1023;
    uint64_t mb = (b & ((1ull << 52) - 1)) | (1023ull << 52);
    double m;
    memcpy(&m, &mb, sizeof m);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    uint64_t sb = (uint64_t)(1023 - e) << 52;
    double sc;
    memcpy(&sc, &sb, sizeof sc);
    double f = (m - 1.0) + ul * sc;
    double s = f / (2.0 + f), w = s * s;
    double p = inv_odd[10];
    for (int n = 9; n >= 0; n--)
        p = p * w + inv_odd[n];
    double lm = 2.0 * s * p;
    return e * L1 + (e * L2 + lm);
}

/* The correct rounding of a value within REF_B of y, or NAN when y cannot decide it. */
static float decide(double y)
{
    double d = (y < 0 ? -y : y) * (2 * REF_B);
    float lo = (float)(y - d), hi = (float)(y + d);
    return lo == hi ? lo : NAN;
}

typedef struct {
    int fn; /* 0 exp, 1 log1p */
    uint64_t begin, end;
    uint64_t misrounded, libm_differs, fastfp_differs, mpfr_calls, hard, avx2_differs;
    uint32_t hard_cases[4096];
    uint32_t first_bad;
} job;

static float expected(int fn, float x, job *j)
{
    if (fn == 0) {
        if (isnan(x))
            return x;
        if (!(x > -104.0f))
            return 0.0f; /* checked with MPFR at -104 (and e^x is increasing) */
        if (x > 89.0f)
            return INFINITY; /* likewise at 89 */
        float r = decide(ref_exp(x));
        if (isnan(r)) {
            j->mpfr_calls++;
            r = mpfr_ref_expf(x);
        }
        return r;
    }
    if (isnan(x) || x < -1.0f)
        return NAN;
    if (x == -1.0f)
        return -INFINITY;
    if (x == 0.0f || isinf(x))
        return x;
    float r = decide(ref_log1p(x));
    if (isnan(r)) {
        j->mpfr_calls++;
        r = mpfr_ref_log1pf(x);
    }
    return r;
}

/* The facts the out-of-range shortcuts rest on, from MPFR, and the references themselves
 * against MPFR on every 65536th input where they decide (a broken reference stops the run
 * instead of reporting misroundings that are its own). */
static int check_ends(void)
{
    int ok = mpfr_ref_expf(-104.0f) == 0.0f && mpfr_ref_expf(89.0f) == INFINITY;
    if (!ok)
        fprintf(stderr, "mathf_exhaustive: MPFR disagrees with the range ends -104 and 89\n");
    job j = {0};
    for (uint64_t i = 0; i < 1ull << 32 && ok; i += 65536) {
        float x = f_of((uint32_t)i);
        for (int fn = 0; fn < 2; fn++) {
            float want = fn ? mpfr_ref_log1pf(x) : mpfr_ref_expf(x);
            if (!same(expected(fn, x, &j), want)) {
                fprintf(stderr, "mathf_exhaustive: the %s reference is wrong at %a\n",
                        fn ? "log1p" : "exp", (double)x);
                ok = 0;
            }
        }
    }
    return ok;
}

/* mf_expf8_avx2 (SwiGLU's exp) on the 8 inputs ending at i against mf_expf's results */
static void check_avx2(job *j, uint64_t i, const float *got)
{
#ifdef EPMOE_AVX2_KERNELS
    float x[8], y[8];
    for (int l = 0; l < 8; l++)
        x[l] = f_of((uint32_t)(i - 7 + (uint64_t)l));
    mf_expf8_avx2(x, y);
    for (int l = 0; l < 8; l++)
        j->avx2_differs += !same(y[l], got[l]);
#endif
}

static void *run(void *arg)
{
    job *j = arg;
    int avx2 = j->fn == 0 && isa_supported(ISA_AVX2);
    float last8[8];
    for (uint64_t i = j->begin; i < j->end; i++) {
        float x = f_of((uint32_t)i), want = expected(j->fn, x, j), got, fast, libm, y;
        int decided;
        if (j->fn == 0) {
            got = mf_expf(x);
            fast = mfx_expf(x);
            libm = expf(x);
            decided = mf_expf_fast(x, &y);
        } else {
            got = mf_log1pf(x);
            fast = mfx_log1pf(x);
            libm = log1pf(x);
            decided = mf_log1pf_fast(x, &y);
        }
        if (!same(got, want) && j->misrounded++ == 0)
            j->first_bad = (uint32_t)i;
        j->fastfp_differs += !same(fast, got);
        j->libm_differs += !same(libm, want);
        if (!decided && j->hard < 4096)
            j->hard_cases[j->hard++] = (uint32_t)i;
        last8[i & 7] = got;
        if (avx2 && (i & 7) == 7)
            check_avx2(j, i, last8);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int nthreads = argc > 1 ? atoi(argv[1]) : 2;
    if (nthreads < 1 || nthreads > 64)
        nthreads = 2;
    FILE *hf = argc > 2 ? fopen(argv[2], "w") : NULL;
    ref_init();
    if (!check_ends())
        return 1;
    int fail = 0;
    for (int fn = 0; fn < 2; fn++) {
        job *jobs = calloc((size_t)nthreads, sizeof *jobs);
        pthread_t *th = calloc((size_t)nthreads, sizeof *th);
        if (!jobs || !th)
            return 1;
        uint64_t per = (1ull << 32) / (uint64_t)nthreads;
        for (int t = 0; t < nthreads; t++) {
            jobs[t].fn = fn;
            jobs[t].begin = per * (uint64_t)t;
            jobs[t].end = t == nthreads - 1 ? 1ull << 32 : per * (uint64_t)(t + 1);
            pthread_create(&th[t], NULL, run, &jobs[t]);
        }
        job sum = {0};
        for (int t = 0; t < nthreads; t++) {
            pthread_join(th[t], NULL);
            if (jobs[t].misrounded && !sum.misrounded)
                sum.first_bad = jobs[t].first_bad;
            sum.misrounded += jobs[t].misrounded;
            sum.libm_differs += jobs[t].libm_differs;
            sum.fastfp_differs += jobs[t].fastfp_differs;
            sum.mpfr_calls += jobs[t].mpfr_calls;
            sum.hard += jobs[t].hard;
            sum.avx2_differs += jobs[t].avx2_differs;
            for (uint64_t h = 0; hf && h < jobs[t].hard; h++)
                fprintf(hf, "%s 0x%08" PRIx32 "\n", fn ? "log1p" : "exp", jobs[t].hard_cases[h]);
        }
        const char *name = fn ? "mf_log1pf" : "mf_expf";
        printf("%s: 4294967296 inputs, %" PRIu64 " misrounded, %" PRIu64
               " fast-path fallbacks, %" PRIu64 " MPFR calls; -ffp-contract=fast -march=native "
               "copy differs on %" PRIu64 "; C library %s misrounds %" PRIu64 "\n",
               name, sum.misrounded, sum.hard, sum.mpfr_calls, sum.fastfp_differs,
               fn ? "log1pf" : "expf", sum.libm_differs);
        if (fn == 0)
            printf("mf_expf8_avx2 (SwiGLU's AVX2 exp) differs from mf_expf on %" PRIu64
                   " inputs%s\n",
                   sum.avx2_differs, isa_supported(ISA_AVX2) ? "" : " (no AVX2: not run)");
        if (sum.misrounded)
            printf("%s: first misrounded input 0x%08" PRIx32 "\n", name, sum.first_bad);
        fail |= sum.misrounded != 0 || sum.fastfp_differs != 0 || sum.avx2_differs != 0;
        free(jobs);
        free(th);
    }
    if (hf)
        fclose(hf);
    return fail;
}
