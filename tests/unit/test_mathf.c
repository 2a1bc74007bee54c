/*
 * test_mathf.c — kernels/mathf.h against MPFR (mathf_mpfr.c), the sampled check that runs in
 * CI: every 4096th of the 2^32 inputs, a few hundred inputs on each side of every threshold
 * (overflow, underflow to zero, the subnormal boundary, where e^x rounds to 1 and log1p(x) to
 * x, the branch and table boundaries, -1, the largest floats) and the inputs where the fast
 * path cannot decide (found by the exhaustive run, tests/bench/mathf_exhaustive.c). The
 * accurate path alone is checked on every 65536th input and the same thresholds.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/simd_internal.h"
#include "kernels/gemm.h"
#include "kernels/mathf.h"
#include "mathf_mpfr.h"
#include "test.h"

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

/* floats in order as integers: -inf .. -0 +0 .. +inf map to increasing values */
static int64_t ord_of(float f)
{
    uint32_t u = bits_of(f);
    return u >> 31 ? -(int64_t)(u & 0x7FFFFFFFu) - 1 : (int64_t)u;
}

static float f_of_ord(int64_t o)
{
    return o < 0 ? f_of((uint32_t)(-(o + 1)) | 0x80000000u) : f_of((uint32_t)o);
}

static int same(float a, float b)
{
    return (isnan(a) && isnan(b)) || bits_of(a) == bits_of(b);
}

/* The AVX2 path (swiglu_avx2.c's exp), 8 inputs at a time through a buffer: check_one's
 * fn is called per input, so the 7 before it ride along in the same vector. */
static float lanes[8];
static int nlanes;

static float avx2_expf(float x)
{
    lanes[nlanes++ & 7] = x;
    float in[8], out[8];
    for (int i = 0; i < 8; i++)
        in[i] = lanes[(nlanes + i) & 7]; /* x last */
    mf_expf8_avx2(in, out);
    float inplace[8];
    memcpy(inplace, in, sizeof inplace);
    mf_expf8_avx2(inplace, inplace); /* as swiglu_avx2.c calls it */
    if (memcmp(inplace, out, sizeof out))
        TEST_FAIL_AT("mf_expf8_avx2 in place differs around %a", (double)x);
    for (int i = 0; i < 7; i++)
        if (memcmp(&out[i], &(float){mf_expf(in[i])}, 4) && !(isnan(out[i]) && isnan(in[i])))
            TEST_FAIL_AT("mf_expf8_avx2 lane %d: %a gives %a, mf_expf %a", i, (double)in[i],
                         (double)out[i], (double)mf_expf(in[i]));
    return out[7];
}

typedef struct {
    const char *name;
    float (*fn)(float);
    float (*ref)(float);
    long checked, bad;
} target;

static void check_one(target *t, float x)
{
    float got = t->fn(x), want = t->ref(x);
    t->checked++;
    if (!same(got, want) && t->bad++ < 10)
        TEST_FAIL_AT("%s(%a) = %a (0x%08x), MPFR %a (0x%08x)", t->name, (double)x, (double)got,
                     bits_of(got), (double)want, bits_of(want));
}

/* n inputs on each side of c, c included */
static void around(target *t, float c, int n)
{
    int64_t o = ord_of(c);
    for (int64_t d = -n; d <= n; d++) {
        int64_t p = o + d;
        if (p >= ord_of(-INFINITY) && p <= ord_of(INFINITY))
            check_one(t, f_of_ord(p));
    }
}

/* The first float in [lo, hi] (in order) where pred turns true (pred false at lo, true at hi,
 * monotone): the threshold a rounding change happens at, found with MPFR. */
static float first_true(float lo, float hi, int (*pred)(float))
{
    int64_t a = ord_of(lo), b = ord_of(hi);
    while (b - a > 1) {
        int64_t m = a + (b - a) / 2;
        if (pred(f_of_ord(m)))
            b = m;
        else
            a = m;
    }
    return f_of_ord(b);
}

static int exp_is_inf(float x)
{
    return isinf(mpfr_ref_expf(x));
}
static int exp_nonzero(float x)
{
    return mpfr_ref_expf(x) > 0.0f;
}
static int exp_normal(float x)
{
    return mpfr_ref_expf(x) >= FLT_MIN;
}
static int exp_ge_1(float x)
{
    return mpfr_ref_expf(x) >= 1.0f;
}
static int exp_gt_1(float x)
{
    return mpfr_ref_expf(x) > 1.0f;
}
static int log1p_below_x(float x) /* for x > 0: log1p(x) rounds below x */
{
    return mpfr_ref_log1pf(x) < x;
}
static int log1p_is_x_neg(float x) /* for x < 0, increasing to 0: log1p(x) rounds to x */
{
    return mpfr_ref_log1pf(x) == x;
}

/* The inputs where the fast path's rounding test fails (tests/bench/mathf_exhaustive, every
 * one of the 2^32): the accurate path decides them. */
static const uint32_t HARD_EXP[] = {
#include "mathf_hard_exp.inc"
};
static const uint32_t HARD_LOG1P[] = {
#include "mathf_hard_log1p.inc"
};

static void thresholds_exp(target *t)
{
    const int n = 256;
    around(t, first_true(88.0f, 89.0f, exp_is_inf), n);      /* overflow */
    around(t, first_true(-105.0f, -100.0f, exp_nonzero), n); /* underflow to +0 */
    around(t, first_true(-90.0f, -80.0f, exp_normal), n);    /* subnormal boundary */
    around(t, first_true(-0x1p-20f, 0.0f, exp_ge_1), n);     /* e^x rounds to 1 from below */
    around(t, first_true(0.0f, 0x1p-20f, exp_gt_1), n);      /* and from above */
    float c[] = {-104.0f,   89.0f,      0.0f,      -0.0f,         FLT_MAX,
                 -FLT_MAX,  FLT_MIN,    -FLT_MIN,  1.0f,          -1.0f,
                 0x1p-126f, -0x1p-149f, 0x1p-149f, 0x1.62e43p-1f, -0x1.62e43p-1f};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        around(t, c[i], n);
    check_one(t, INFINITY);
    check_one(t, -INFINITY);
    check_one(t, NAN);
    check_one(t, -NAN);
}

static void thresholds_log1p(target *t)
{
    const int n = 256;
    around(t, first_true(0x1p-30f, 0x1p-20f, log1p_below_x), n);    /* log1p(x) = x ends, x > 0 */
    around(t, first_true(-0x1p-20f, -0x1p-30f, log1p_is_x_neg), n); /* and x < 0 */
    around(t, -1.0f, n); /* -1 + ulp .. and x < -1 (NaN) */
    float c[] = {0.0f,
                 -0.0f,
                 0x1p-5f,
                 -0x1p-5f,
                 0x1p24f,
                 0x1p53f,
                 FLT_MAX,
                 FLT_MIN,
                 -FLT_MIN,
                 0x1p-149f,
                 -0x1p-149f,
                 0x1.6a09e6p+0f - 1.0f,
                 0x1.6a09e6p-1f - 1.0f};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        around(t, c[i], n);
    for (int e = -1; e <= 30; e++) {
        around(t, ldexpf(1.0f, e) - 1.0f, 16);       /* 1 + x a power of two */
        around(t, ldexpf(1.4140625f, e) - 1.0f, 16); /* table bucket 52 | 53 (c > sqrt 2) */
    }
    check_one(t, INFINITY);
    check_one(t, -INFINITY);
    check_one(t, NAN);
    check_one(t, -NAN);
}

static void sampled(target *t, uint64_t step)
{
    for (uint64_t i = 0; i < 1ull << 32; i += step)
        check_one(t, f_of((uint32_t)i));
}

TEST(expf_is_correctly_rounded)
{
    target t = {"mf_expf", mf_expf, mpfr_ref_expf, 0, 0};
    sampled(&t, 4096);
    thresholds_exp(&t);
    for (size_t i = 0; i < sizeof HARD_EXP / sizeof HARD_EXP[0]; i++)
        check_one(&t, f_of(HARD_EXP[i]));
    printf("  %ld inputs, %ld misrounded\n", t.checked, t.bad);
}

TEST(log1pf_is_correctly_rounded)
{
    target t = {"mf_log1pf", mf_log1pf, mpfr_ref_log1pf, 0, 0};
    sampled(&t, 4096);
    thresholds_log1p(&t);
    for (size_t i = 0; i < sizeof HARD_LOG1P / sizeof HARD_LOG1P[0]; i++)
        check_one(&t, f_of(HARD_LOG1P[i]));
    printf("  %ld inputs, %ld misrounded\n", t.checked, t.bad);
}

TEST(accurate_paths_alone_are_correctly_rounded)
{
    target e = {"mf_expf_accurate", mf_expf_accurate, mpfr_ref_expf, 0, 0};
    target l = {"mf_log1pf_accurate", mf_log1pf_accurate, mpfr_ref_log1pf, 0, 0};
    sampled(&e, 65536);
    sampled(&l, 65536);
    thresholds_exp(&e);
    thresholds_log1p(&l);
}

TEST(avx2_expf_is_the_scalar_one)
{
#ifdef EPMOE_AVX2_KERNELS
    if (!isa_supported(ISA_AVX2))
        SKIP("no AVX2 on this CPU");
    target t = {"mf_expf8_avx2", avx2_expf, mpfr_ref_expf, 0, 0};
    sampled(&t, 4096);
    thresholds_exp(&t);
    for (size_t i = 0; i < sizeof HARD_EXP / sizeof HARD_EXP[0]; i++)
        check_one(&t, f_of(HARD_EXP[i]));
#else
    SKIP("built without the AVX2 kernels");
#endif
}

/* The hard cases really are hard: the fast path gives up on them (else the list is stale). */
TEST(hard_cases_reach_the_accurate_path)
{
    float y;
    for (size_t i = 0; i < sizeof HARD_EXP / sizeof HARD_EXP[0]; i++)
        CHECK_EQ(mf_expf_fast(f_of(HARD_EXP[i]), &y), 0);
    for (size_t i = 0; i < sizeof HARD_LOG1P / sizeof HARD_LOG1P[0]; i++)
        CHECK_EQ(mf_log1pf_fast(f_of(HARD_LOG1P[i]), &y), 0);
}

TEST(special_values)
{
    CHECK(mf_expf(INFINITY) == INFINITY);
    CHECK(bits_of(mf_expf(-INFINITY)) == 0);
    CHECK(isnan(mf_expf(NAN)));
    CHECK(bits_of(mf_expf(-0.0f)) == bits_of(1.0f));
    CHECK(mf_expf(89.0f) == INFINITY);
    CHECK(bits_of(mf_expf(-104.0f)) == 0);
    CHECK(mf_expf(-103.5f) > 0.0f); /* subnormal, not flushed */
    CHECK(mf_log1pf(-1.0f) == -INFINITY);
    CHECK(isnan(mf_log1pf(-1.5f)));
    CHECK(isnan(mf_log1pf(-INFINITY)));
    CHECK(isnan(mf_log1pf(NAN)));
    CHECK(mf_log1pf(INFINITY) == INFINITY);
    CHECK(bits_of(mf_log1pf(-0.0f)) == 0x80000000u);
    CHECK(bits_of(mf_log1pf(0.0f)) == 0);
    CHECK(mf_log1pf(0x1p-149f) == 0x1p-149f);
}

int main(void)
{
    RUN(special_values);
    RUN(expf_is_correctly_rounded);
    RUN(log1pf_is_correctly_rounded);
    RUN(accurate_paths_alone_are_correctly_rounded);
    RUN(hard_cases_reach_the_accurate_path);
    RUN(avx2_expf_is_the_scalar_one);
    return test_report();
}
