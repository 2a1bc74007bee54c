/*
 * test_quant.c — the activation quantizer (quant.h) against an independent model of spec
 * §5.2 step 1 / §3.4, for every implementation this CPU has.
 *
 * The model computes in double and rounds once to float, which for a single fp32 multiply or
 * division gives exactly the fp32 result (53 >= 2 * 24 + 2 bits); it takes the power-of-two
 * ceiling with frexp and encodes e4m3 by searching the nearest of all 127 magnitudes (ties to
 * the even code), saturating to 448. The AVX2 e4m3 encoder is compared with fmt_f32_to_e4m3
 * (itself proven exhaustively in test_formats) on every fp32 bit pattern in the normal build
 * and on every 61st in the sanitizer build (EPMOE_QUANT_SAMPLE=1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "test.h"
#include "tests/isa_env.h"

static uint64_t rng_s = 0x3C6EF372FE94F82Bull;
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

static double e4m3_mag(int c) /* c in 0..126 */
{
    int e = c >> 3, m = c & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

static uint8_t model_e4m3(float x)
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

static float model_scale(float amax, int pow2)
{
    if (!(amax >= 1e-4f) && !isnan(amax))
        amax = 1e-4f;
    float t = (float)((double)amax * (double)f_of(0x3B124925u));
    if (!pow2)
        return t;
    if (isnan(t) || isinf(t))
        return NAN;
    int e;
    double f = frexp(t, &e); /* t = f * 2^e, f in [0.5, 1) */
    return (float)(f == 0.5 ? ldexp(1.0, e - 1) : ldexp(1.0, e));
}

static void model_rows(const float *x, int M, int K, int pow2, uint8_t *q, float *scale)
{
    for (int m = 0; m < M; m++)
        for (int b = 0; b < K / 128; b++) {
            const float *xb = x + (size_t)m * K + 128 * b;
            float amax = 0;
            int nan = 0;
            for (int i = 0; i < 128; i++) {
                if (isnan(xb[i]))
                    nan = 1;
                else if (fabsf(xb[i]) > amax)
                    amax = fabsf(xb[i]);
            }
            float s = model_scale(nan ? NAN : amax, pow2);
            scale[m * (K / 128) + b] = s;
            for (int i = 0; i < 128; i++)
                q[(size_t)m * K + 128 * b + i] = model_e4m3((float)((double)xb[i] / (double)s));
        }
}

/* ---- data ---- */

/* rows of blocks of different character: Gaussian-ish, all zero, tiny (amax < 1e-4), huge,
 * mixed magnitudes, values at e4m3 rounding boundaries after scaling, one NaN, one inf,
 * subnormal fp32 */
static void gen_rows(float *x, int M, int K)
{
    for (int m = 0; m < M; m++)
        for (int b = 0; b < K / 128; b++) {
            float *xb = x + (size_t)m * K + 128 * b;
            int kind = (int)(rnd() % 11);
            for (int i = 0; i < 128; i++) {
                float g = ((rnd() & 0xFFFF) / 65536.0f - 0.5f) * 4.0f;
                switch (kind) {
                case 0:
                    xb[i] = g;
                    break;
                case 1:
                    xb[i] = (rnd() & 1) ? 0.0f : -0.0f;
                    break;
                case 2:
                    xb[i] = g * 1e-6f;
                    break;
                case 3:
                    xb[i] = g * 3e37f;
                    break;
                case 4:
                    xb[i] = ldexpf(g, (int)(rnd() % 40) - 20);
                    break;
                case 5: /* scaled e4m3 midpoints */
                    xb[i] = (float)((e4m3_mag((int)(rnd() % 126)) + e4m3_mag((int)(rnd() % 126))) /
                                    2 * (g < 0 ? -1 : 1) / 64.0);
                    break;
                case 6:
                    xb[i] = i == 77 ? NAN : g;
                    break;
                case 7:
                    xb[i] = i == 3 ? -INFINITY : g;
                    break;
                case 8:
                    xb[i] = f_of(rnd() & 0x807FFFFFu); /* fp32 subnormals */
                    break;
                case 9: /* amax a few ulp either side of the 1e-4 floor */
                    xb[i] = i == 0 ? f_of(u_of(1e-4f) + (rnd() % 9) - 4) : g * 1e-5f;
                    break;
                default: /* amax just above the floor */
                    xb[i] = g * 3e-4f;
                    break;
                }
            }
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

/* ---- tests ---- */

TEST(rows_f32_equal_model)
{
    int M = 40, K = 1024;
    float *x = malloc((size_t)M * K * sizeof(float));
    uint8_t *q = malloc((size_t)M * K), *qm = malloc((size_t)M * K);
    float *s = malloc((size_t)M * (K / 128) * sizeof(float)),
          *sm = malloc((size_t)M * (K / 128) * sizeof(float));
    gen_rows(x, M, K);
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int pow2 = 0; pow2 <= 1; pow2++) {
        model_rows(x, M, K, pow2, qm, sm);
        for (int i = 0; i < ni; i++) {
            qt_act_rows_f32_impl(impls[i], x, M, K, pow2, q, s);
            int badq = 0, bads = 0;
            for (int j = 0; j < M * K; j++)
                badq += q[j] != qm[j];
            for (int j = 0; j < M * (K / 128); j++)
                bads += !same_float(s[j], sm[j]);
            if (badq || bads)
                TEST_FAIL_AT("%s pow2=%d: %d codes and %d scales differ", isa_name(impls[i]), pow2,
                             badq, bads);
        }
    }
    free(x);
    free(q);
    free(qm);
    free(s);
    free(sm);
}

TEST(rows_bf16_equal_model)
{
    int M = 25, K = 512;
    float *x = malloc((size_t)M * K * sizeof(float));
    uint16_t *xb = malloc((size_t)M * K * sizeof(uint16_t));
    uint8_t *q = malloc((size_t)M * K), *qm = malloc((size_t)M * K);
    float s[25 * 4], sm[25 * 4];
    gen_rows(x, M, K);
    for (int j = 0; j < M * K; j++) {
        xb[j] = (uint16_t)(u_of(x[j]) >> 16); /* truncation: any bf16 pattern will do */
        x[j] = f_of((uint32_t)xb[j] << 16);
    }
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int pow2 = 0; pow2 <= 1; pow2++) {
        model_rows(x, M, K, pow2, qm, sm);
        for (int i = 0; i < ni; i++) {
            qt_act_rows_impl(impls[i], xb, M, K, pow2, q, s);
            int bad = 0;
            for (int j = 0; j < M * K; j++)
                bad += q[j] != qm[j];
            for (int j = 0; j < M * (K / 128); j++)
                bad += !same_float(s[j], sm[j]);
            if (bad)
                TEST_FAIL_AT("%s pow2=%d: %d differences", isa_name(impls[i]), pow2, bad);
        }
    }
    /* the default entry points agree with the explicit best implementation */
    qt_act_rows(xb, M, K, true, q, s);
    model_rows(x, M, K, 1, qm, sm);
    CHECK(memcmp(q, qm, (size_t)M * K) == 0);
    free(x);
    free(xb);
    free(q);
    free(qm);
}

/* Spec facts the model encodes, checked directly: the 1e-4 floor, pow2 scales are E8M0
 * values, amax maps to <= 448, NaN and inf behave as documented. */
TEST(scale_rules_from_the_spec)
{
    float x[128] = {0};
    uint8_t q[128];
    float s;
    qt_act_rows_f32(x, 1, 128, true, q, &s);
    CHECK(same_float(s, fmt_e8m0_to_f32(fmt_e8m0_ceil(1e-4f * f_of(0x3B124925u)))));
    CHECK(s == 0x1p-22f); /* 1e-4/448 = 2.23e-7 -> 2^-22 */
    x[5] = 448.0f;
    qt_act_rows_f32(x, 1, 128, true, q, &s);
    CHECK(s == 1.0f && q[5] == 0x7E);
    qt_act_rows_f32(x, 1, 128, false, q, &s);
    CHECK(s == 448.0f * f_of(0x3B124925u) && q[5] == 0x7E);
    x[6] = NAN;
    qt_act_rows_f32(x, 1, 128, true, q, &s);
    CHECK(isnan(s) && q[0] == 0x7F && q[5] == 0x7F);
    x[6] = INFINITY;
    qt_act_rows_f32(x, 1, 128, false, q, &s);
    CHECK(isinf(s) && q[5] == 0 && q[6] == 0x7F);
}

/* fmt_f32_to_e4m3 on every fp32 input (every 61st with EPMOE_QUANT_SAMPLE). */
TEST(avx2_encoder_equals_fmt_on_every_float)
{
    if (isa_best() < ISA_AVX2)
        SKIP("no AVX2 on this CPU (or EPMOE_ISA=ref)");
    const char *sample = getenv("EPMOE_QUANT_SAMPLE");
    uint64_t step = sample && *sample == '1' ? 61 : 1;
    enum { CH = 1 << 16 };
    static float x[CH];
    static uint8_t q[CH];
    uint64_t bad = 0, checked = 0;
    for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)CH * step) {
        int n = 0;
        for (uint64_t u = base; u < base + (uint64_t)CH * step && u < (1ull << 32); u += step)
            x[n++] = f_of((uint32_t)u);
        qt_f32_to_e4m3_n(ISA_AVX2, x, (size_t)n, q);
        for (int i = 0; i < n; i++)
            if (q[i] != fmt_f32_to_e4m3(x[i])) {
                if (bad++ < 5)
                    printf("  0x%08x: avx2 0x%02x fmt 0x%02x\n", u_of(x[i]), q[i],
                           fmt_f32_to_e4m3(x[i]));
            }
        checked += (uint64_t)n;
    }
    printf("  %llu inputs checked\n", (unsigned long long)checked);
    CHECK_EQ(bad, 0);
    /* and odd lengths (the vector tail) */
    for (int n = 1; n < 70; n += 7) {
        for (int i = 0; i < n; i++)
            x[i] = f_of(rnd());
        memset(q, 0xAA, 80);
        qt_f32_to_e4m3_n(ISA_AVX2, x, (size_t)n, q);
        for (int i = 0; i < n; i++)
            CHECK_EQ(q[i], fmt_f32_to_e4m3(x[i]));
        CHECK_EQ(q[n], 0xAA);
    }
}

/* bf16 RNE by arithmetic (not bit tricks): round to 8 significant bits, never finer than the
 * bf16 subnormal quantum 2^-133; NaN -> 0x7FFF. */
static uint16_t model_bf16(float f)
{
    if (isnan(f))
        return 0x7FFF;
    if (f == 0.0f || isinf(f))
        return (uint16_t)(u_of(f) >> 16);
    int e;
    frexp((double)f, &e);
    int qe = e - 8 < -133 ? -133 : e - 8;
    double r = ldexp(nearbyint(ldexp((double)f, -qe)), qe);
    return (uint16_t)(u_of((float)r) >> 16); /* r beyond FLT_MAX becomes inf: IEEE overflow */
}

static float bf_val(uint16_t h)
{
    return f_of((uint32_t)h << 16);
}

/* awkward fp32 values: ties at the bf16 rounding point, carries into the exponent, overflow to
 * inf, subnormals, both zeros, NaN */
static float odd_float(void)
{
    switch (rnd() % 8) {
    case 0:
        return f_of((rnd() & 0xFFFF0000u) | 0x8000u); /* a tie */
    case 1:
        return f_of(0x7F7FFFFFu - (rnd() & 0x7FFF)); /* near FLT_MAX: may round to inf */
    case 2:
        return f_of(rnd() & 0x807FFFFFu); /* subnormal */
    case 3:
        return rnd() & 1 ? -0.0f : 0.0f;
    case 4:
        return NAN;
    default:
        return f_of(rnd() * 2654435761u);
    }
}

TEST(bf16_outputs_equal_model)
{
    enum { N = 4099, H = 1000, S = 7 };
    static float x[N];
    static uint16_t got[N], rows[S][H], last[H], want[H], out[H];
    for (int i = 0; i < N; i++)
        x[i] = odd_float();
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int i = 0; i < ni; i++) {
        qt_f32_to_bf16_n(impls[i], x, N, got);
        int bad = 0;
        for (int j = 0; j < N; j++)
            bad += got[j] != model_bf16(x[j]);
        if (bad)
            TEST_FAIL_AT("%s: %d of %d bf16 roundings differ", isa_name(impls[i]), bad, N);
    }
    /* sums: large and small terms whose order matters in fp32, and the specials */
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++)
            rows[s][h] = h % 5 == 0 ? model_bf16(odd_float())
                                    : model_bf16((float)ldexp((double)(int)(rnd() % 2001) - 1000,
                                                              (int)(rnd() % 40) - 20));
    for (int h = 0; h < H; h++)
        last[h] = model_bf16((float)ldexp((double)(int)(rnd() % 201) - 100, (int)(rnd() % 9) - 4));
    for (int n = 0; n <= S; n++) {
        const uint16_t *rp[S];
        for (int s = 0; s < n; s++)
            rp[s] = rows[(s * 3) % S];
        for (int h = 0; h < H; h++) {
            float y = 0.0f; /* fp32 adds from +0 in the given order */
            for (int s = 0; s < n; s++) {
                volatile float t = y + bf_val(rp[s][h]);
                y = t;
            }
            volatile float t = y + bf_val(last[h]);
            want[h] = model_bf16(t);
        }
        for (int i = 0; i < ni; i++) {
            qt_sum_bf16_rows(impls[i], rp, n, last, H, out);
            int bad = 0;
            for (int h = 0; h < H; h++)
                bad += out[h] != want[h];
            if (bad)
                TEST_FAIL_AT("%s: %d rows: %d of %d sums differ", isa_name(impls[i]), n, bad, H);
        }
    }
}

int main(void)
{
    test_isa_cap_from_env();
    RUN(rows_f32_equal_model);
    RUN(rows_bf16_equal_model);
    RUN(scale_rules_from_the_spec);
    RUN(avx2_encoder_equals_fmt_on_every_float);
    RUN(bf16_outputs_equal_model);
    return test_report();
}
