/*
 * test_swiglu.c — the SwiGLU epilogue (swiglu.h) against an independent model of spec §5.2
 * steps 3-4, for every implementation this CPU has.
 *
 * The model does each fp32 operation in double and rounds once to float (exact emulation of
 * one IEEE fp32 add, multiply or divide), rounds to bf16 with its own integer-free rule (the
 * two bf16 neighbours and a comparison in double, ties to the even one), and quantizes with
 * its own e4m3 search. exp is MPFR's correctly rounded binary32 exp (mathf_mpfr.c), the
 * definition's operation (docs/numerics.md §0): kernels/mathf.c must give exactly its bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "mathf_mpfr.h"
#include "test.h"
#include "tests/isa_env.h"

static uint64_t rng_s = 0xA54FF53A5F1D36F1ull;
static uint32_t rnd(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t u_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int same_float(float a, float b)
{
    return (isnan(a) && isnan(b)) || u_of(a) == u_of(b);
}

/* ---- the model ---- */

static float add32(float a, float b)
{
    return (float)((double)a + (double)b);
}
static float mul32(float a, float b)
{
    return (float)((double)a * (double)b);
}
static float div32(float a, float b)
{
    return (float)((double)a / (double)b);
}

/* nearest bf16 (8 significant bits), ties to even; overflow to inf; NaN stays NaN */
static float bf16_model(float x)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    double a = fabs((double)x);
    int e;
    frexp(a, &e);                        /* a in [2^(e-1), 2^e) */
    int q = e - 8 > -133 ? e - 8 : -133; /* quantum: 8 significant bits; bf16 subnormals 2^-133 */
    double lo = floor(a / ldexp(1, q)), r = a / ldexp(1, q) - lo;
    double n = r > 0.5 || (r == 0.5 && fmod(lo, 2) == 1) ? lo + 1 : lo;
    double v = ldexp(n, q); /* 2^128 when rounding past the largest bf16: (float) -> inf */
    return (float)(signbit(x) ? -v : v);
}

static double e4m3_mag(int c)
{
    int e = c >> 3, m = c & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

static uint8_t e4m3_model(float x)
{
    if (isnan(x))
        return 0x7F;
    double a = fabs((double)x);
    int best = 0;
    double bd = a;
    for (int c = 1; c <= 126; c++) {
        double d = fabs(a - e4m3_mag(c));
        if (d < bd || (d == bd && (c & 1) == 0)) {
            best = c;
            bd = d;
        }
    }
    if (a >= 448)
        best = 126;
    return (uint8_t)(best | (signbit(x) ? 0x80 : 0));
}

static float scale_model(float amax, int pow2)
{
    if (!(amax >= 1e-4f) && !isnan(amax))
        amax = 1e-4f;
    float t = mul32(amax, f_of(0x3B124925u));
    if (!pow2)
        return t;
    if (isnan(t) || isinf(t))
        return NAN;
    int e;
    double f = frexp(t, &e);
    return (float)(f == 0.5 ? ldexp(1.0, e - 1) : ldexp(1.0, e));
}

static void model(const float *a1, const float *a3, int M, int I, const float *w, float limit,
                  int pow2, uint8_t *q, float *scale)
{
    for (int m = 0; m < M; m++)
        for (int b = 0; b < I / 128; b++) {
            float h[128], amax = 0;
            int nan = 0;
            for (int i = 0; i < 128; i++) {
                size_t j = (size_t)m * I + 128 * b + i;
                float g = bf16_model(a1[j]), u = bf16_model(a3[j]);
                if (g > limit)
                    g = limit;
                if (u < -limit)
                    u = -limit;
                if (u > limit)
                    u = limit;
                float silu = div32(g, add32(1.0f, mpfr_ref_expf(-g)));
                float hv = mul32(silu, u);
                hv = mul32(w ? w[m] : 1.0f, hv);
                h[i] = bf16_model(hv);
                if (isnan(h[i]))
                    nan = 1;
                else if (fabsf(h[i]) > amax)
                    amax = fabsf(h[i]);
            }
            float s = scale_model(nan ? NAN : amax, pow2);
            scale[m * (I / 128) + b] = s;
            for (int i = 0; i < 128; i++)
                q[(size_t)m * I + 128 * b + i] = e4m3_model(div32(h[i], s));
        }
}

/* ---- data ---- */

static float rnd_acc(void)
{
    /* NaNs with small and large payloads of both signs, infinities, values whose bf16
     * rounding overflows or carries into the exponent */
    static const uint32_t special[] = {0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu,
                                       0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu,
                                       0xFF7FFFFFu, 0x3F7FFFFFu, 0x00000001u, 0x80000000u};
    uint32_t r = rnd();
    switch (r % 16) {
    case 0:
        if ((r >> 4) & 1)
            return f_of(special[(r >> 5) % (sizeof special / sizeof special[0])]);
        return f_of(rnd()); /* any bit pattern: NaN, inf, subnormal, huge */
    case 1:
        return 0.0f;
    case 2: /* around the clamp limit and bf16 rounding boundaries there */
        return f_of(u_of(10.0f) + (rnd() % 0x20000) - 0x10000) * ((r >> 8) & 1 ? -1 : 1);
    case 3:
        return ((rnd() & 0xFFFF) / 65536.0f - 0.5f) * 1e4f;
    default:
        return ((rnd() & 0xFFFF) / 65536.0f - 0.5f) * 24.0f;
    }
}

static int n_impls(isa_level *impls)
{
    int n = 0;
    impls[n++] = ISA_REF;
    for (int i = ISA_AVX2; i <= (int)isa_best(); i++)
        if (isa_supported((isa_level)i))
            impls[n++] = (isa_level)i;
    return n;
}

static void check_case(int M, int I, int with_w, float limit, int pow2)
{
    size_t n = (size_t)M * I;
    float *a1 = malloc(n * sizeof(float)), *a3 = malloc(n * sizeof(float));
    float *w = malloc((size_t)M * sizeof(float));
    for (size_t j = 0; j < n; j++) {
        a1[j] = rnd_acc();
        a3[j] = rnd_acc();
    }
    for (int m = 0; m < M; m++)
        w[m] = (rnd() & 0xFFFF) / 65536.0f * 1.5f;
    uint8_t *q = malloc(n), *qm = malloc(n);
    float *s = malloc((size_t)M * (I / 128) * sizeof(float));
    float *sm = malloc((size_t)M * (I / 128) * sizeof(float));
    model(a1, a3, M, I, with_w ? w : NULL, limit, pow2, qm, sm);
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int i = 0; i < ni; i++) {
        swiglu_rows_impl(impls[i], a1, a3, M, I, with_w ? w : NULL, limit, pow2, q, s);
        int badq = 0, bads = 0;
        for (size_t j = 0; j < n; j++)
            badq += q[j] != qm[j];
        for (int j = 0; j < M * (I / 128); j++)
            bads += !same_float(s[j], sm[j]);
        if (badq || bads)
            TEST_FAIL_AT("%s M=%d I=%d w=%d limit=%g pow2=%d: %d codes, %d scales differ",
                         isa_name(impls[i]), M, I, with_w, limit, pow2, badq, bads);
    }
    free(a1);
    free(a3);
    free(w);
    free(q);
    free(qm);
    free(s);
    free(sm);
}

TEST(equals_model_routed_and_shared)
{
    check_case(7, 2048, 1, 10.0f, 1); /* routed expert: routing weights, pow2 scales */
    check_case(5, 2048, 0, 10.0f, 1); /* shared expert: w_row NULL = 1.0 */
    check_case(3, 384, 1, 10.0f, 0);  /* Flash-Base style F32 activation scales */
    check_case(2, 256, 1, 7.0f, 1);   /* another limit */
}

/* The clamps: gate from above only, up on both sides; checked on single values. */
TEST(clamp_directions)
{
    float a1[128], a3[128];
    for (int i = 0; i < 128; i++) {
        a1[i] = -30.0f; /* below -limit: not clamped, silu(-30) ~ -2.8e-12 */
        a3[i] = -30.0f; /* clamped to -10 */
    }
    a1[0] = 30.0f; /* clamped to 10 */
    a3[0] = 30.0f; /* clamped to 10 */
    uint8_t q[128];
    float s;
    swiglu_rows(a1, a3, 1, 128, NULL, 10.0f, false, q, &s);
    float h0 = 10.0f / (1.0f + mpfr_ref_expf(-10.0f)) * 10.0f;
    uint32_t hb = u_of(h0);
    hb = (hb + 0x7FFF + ((hb >> 16) & 1)) & 0xFFFF0000u;
    float amax = f_of(hb);
    CHECK(same_float(s, amax * f_of(0x3B124925u)));
    CHECK_EQ(q[0], 0x7E); /* the block maximum maps to 448 */
    /* element 1: silu(-30) * -10 > 0, tiny: rounds to e4m3 zero */
    CHECK_EQ(q[1], 0x00);
}

int main(void)
{
    test_isa_cap_from_env();
    RUN(equals_model_routed_and_shared);
    RUN(clamp_directions);
    return test_report();
}
