/*
 * test_gemm.c — the expert GEMMs (gemm.h) against an independent float64 model of their
 * definition, for every implementation this CPU has.
 *
 * The model decodes every activation and weight code to double with ldexp (its own decoders,
 * not formats.c's), sums each block in double — exact, since every partial sum is an integer
 * multiple of 2^-18 below 2^25 (spec §5.8) — rounds the block sum to float once, and then
 * performs the fp32 scale steps of gemm.h with float variables (the build forbids contraction).
 * Outputs must match bit for bit (NaN only has to be NaN).
 *
 * The data is adversarial on purpose: activation blocks mixing +-448 with e4m3 subnormals,
 * zeros and values below 2^-3 (so the AVX2 MXFP4 "lo" pass and wide FP8 sums are exercised and
 * a naive fp32 accumulation would round differently), power-of-two (E8M0-decoded) and
 * arbitrary fp32 scales, NaN codes and the e8m0 codes 0 and 255. Invariance: a batch equals
 * its rows computed one at a time, in shuffled order, and with 1, 2 or 3 threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/gemm.h"
#include "test.h"
#include "tests/isa_env.h"

/* ---- random data ---- */

static uint64_t rng_s = 0x243F6A8885A308D3ull;
static uint32_t rnd(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}
static double rnd_unit(void)
{
    return (rnd() & 0xFFFFFF) / 16777216.0;
}

/* ---- the independent model ---- */

static double m_e4m3(uint8_t c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

static double m_e2m1(uint8_t nib)
{
    static const int halves[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    double v = ldexp(halves[nib & 7], -1);
    return (nib & 8) ? -v : v;
}

static float m_e8m0(uint8_t c)
{
    return c == 255 ? NAN : (float)ldexp(1.0, c - 127);
}

static void model_fp8(int M, int N, int K, const uint8_t *a, const float *as, const uint8_t *w,
                      const float *ws, float *out)
{
    int KB = K / 128;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int kb = 0; kb < KB; kb++) {
                double s = 0.0;
                for (int k = kb * 128; k < kb * 128 + 128; k++)
                    s += m_e4m3(a[(size_t)m * K + k]) * m_e4m3(w[(size_t)n * K + k]);
                float p = (float)s;
                float sig = as[m * KB + kb] * ws[(n / 128) * KB + kb];
                float t = p * sig;
                acc = acc + t;
            }
            out[(size_t)m * N + n] = acc;
        }
}

static void model_mxfp4(int M, int N, int K, const uint8_t *a, const float *as, const uint8_t *wp,
                        const uint8_t *ws, float *out)
{
    int KB = K / 128, KG = K / 32;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int g = 0; g < KG; g++) {
                double s = 0.0;
                for (int k = g * 32; k < g * 32 + 32; k++) {
                    uint8_t byte = wp[(size_t)n * (K / 2) + k / 2];
                    uint8_t nib = (k & 1) ? byte >> 4 : byte & 15;
                    s += m_e4m3(a[(size_t)m * K + k]) * m_e2m1(nib);
                }
                float p = (float)s;
                float t1 = p * as[m * KB + g / 4];
                float t2 = t1 * m_e8m0(ws[(size_t)n * KG + g]);
                acc = acc + t2;
            }
            out[(size_t)m * N + n] = acc;
        }
}

/* ---- generators ---- */

enum { ACT_UNIFORM, ACT_TYPICAL, ACT_ADVERSARIAL };

static uint8_t rnd_code_no_nan(void)
{
    for (;;) {
        uint8_t c = (uint8_t)rnd();
        if ((c & 0x7F) != 0x7F)
            return c;
    }
}

/* e4m3 codes: uniform over all non-NaN codes; "typical" (a quantized Gaussian: no value below
 * amax/1792 except by chance); adversarial per 32-block: a mix of +-448, subnormals (codes
 * 1..7), zeros and small normals, or all-zero blocks, or blocks of only tiny values. */
static void gen_act(uint8_t *a, size_t n, int mode)
{
    for (size_t i = 0; i < n; i += 32) {
        int kind = mode == ACT_ADVERSARIAL ? (int)(rnd() % 5) : -1;
        for (size_t j = i; j < i + 32 && j < n; j++) {
            uint8_t c;
            if (mode == ACT_UNIFORM) {
                c = rnd_code_no_nan();
            } else if (mode == ACT_TYPICAL) {
                double g = (rnd_unit() + rnd_unit() + rnd_unit() - 1.5) * 2.0;
                double v = g * 160.0;
                if (v > 448)
                    v = 448;
                if (v < -448)
                    v = -448;
                /* nearest e4m3 by search: slow but independent */
                double best = 1e9;
                c = 0;
                for (int k = 0; k < 256; k++) {
                    double d = fabs(m_e4m3((uint8_t)k) - v);
                    if (d < best) {
                        best = d;
                        c = (uint8_t)k;
                    }
                }
            } else {
                uint32_t r = rnd();
                uint8_t sign = (uint8_t)((r >> 8) & 0x80);
                switch (kind) {
                case 0: /* everything mixed */
                    switch (r % 6) {
                    case 0:
                        c = 0x7E | sign; /* 448 */
                        break;
                    case 1:
                        c = (uint8_t)(1 + r / 7 % 7) | sign; /* subnormal */
                        break;
                    case 2:
                        c = sign; /* +-0 */
                        break;
                    case 3:
                        c = (uint8_t)(0x08 + r / 7 % 24) | sign; /* 2^-6 .. < 2^-3 */
                        break;
                    default:
                        c = rnd_code_no_nan();
                        break;
                    }
                    break;
                case 1:
                    c = 0;
                    break;
                case 2:
                    c = (uint8_t)(r % 0x20) | sign; /* only tiny values */
                    break;
                case 3:
                    c = (r & 1) ? (uint8_t)(0x7E | sign) : (uint8_t)(1 | sign);
                    break;
                default:
                    c = rnd_code_no_nan();
                    break;
                }
            }
            a[j] = c;
        }
    }
}

/* fp32 scales: powers of two (as E8M0 decodes them) or arbitrary positive floats spanning
 * several binades */
static void gen_scales(float *s, size_t n, int pow2)
{
    for (size_t i = 0; i < n; i++) {
        if (pow2)
            s[i] = (float)ldexp(1.0, (int)(rnd() % 24) - 16);
        else
            s[i] = (float)(ldexp(1.0 + rnd_unit(), (int)(rnd() % 24) - 16));
    }
}

/* ---- comparison ---- */

static int same_bits(float x, float y)
{
    if (isnan(x) && isnan(y))
        return 1;
    uint32_t a, b;
    memcpy(&a, &x, 4);
    memcpy(&b, &y, 4);
    return a == b;
}

static int count_mismatch(const float *got, const float *want, size_t n, size_t *first)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!same_bits(got[i], want[i])) {
            if (!bad)
                *first = i;
            bad++;
        }
    return bad;
}

/* The reference and every SIMD implementation this CPU has, up to the $EPMOE_ISA cap. */
static int n_impls(isa_level *impls)
{
    int n = 0;
    impls[n++] = ISA_REF;
    for (int i = ISA_AVX2; i <= (int)isa_best(); i++)
        if (isa_supported((isa_level)i))
            impls[n++] = (isa_level)i;
    return n;
}

typedef struct problem {
    int kind; /* GEMM_KIND_FP8 or GEMM_KIND_MXFP4 */
    int M, N, K;
    uint8_t *a, *w, *wsb;
    float *as, *ws, *want;
} problem;

static problem make(int kind, int M, int N, int K, int act_mode, int pow2)
{
    problem p = {.kind = kind, .M = M, .N = N, .K = K};
    p.a = malloc((size_t)M * K);
    p.as = malloc((size_t)M * (K / 128) * sizeof(float));
    p.want = malloc((size_t)M * N * sizeof(float));
    gen_act(p.a, (size_t)M * K, act_mode);
    gen_scales(p.as, (size_t)M * (K / 128), pow2);
    if (kind == GEMM_KIND_FP8) {
        p.w = malloc((size_t)N * K);
        gen_act(p.w, (size_t)N * K, act_mode == ACT_TYPICAL ? ACT_UNIFORM : act_mode);
        p.ws = malloc((size_t)(N / 128) * (K / 128) * sizeof(float));
        gen_scales(p.ws, (size_t)(N / 128) * (K / 128), pow2);
        model_fp8(M, N, K, p.a, p.as, p.w, p.ws, p.want);
    } else {
        p.w = malloc((size_t)N * K / 2);
        for (size_t i = 0; i < (size_t)N * K / 2; i++)
            p.w[i] = (uint8_t)rnd();
        p.wsb = malloc((size_t)N * (K / 32));
        for (size_t i = 0; i < (size_t)N * (K / 32); i++)
            p.wsb[i] = (uint8_t)(112 + rnd() % 24);
        model_mxfp4(M, N, K, p.a, p.as, p.w, p.wsb, p.want);
    }
    return p;
}

static void unmake(problem *p)
{
    free(p->a);
    free(p->as);
    free(p->w);
    free(p->wsb);
    free(p->ws);
    free(p->want);
}

static gemm_weight *pack(const problem *p, isa_level impl)
{
    ep_err err = {0};
    gemm_weight *w = p->kind == GEMM_KIND_FP8
                         ? gemm_pack_fp8(p->N, p->K, p->w, p->ws, impl, &err)
                         : gemm_pack_mxfp4(p->N, p->K, p->w, p->wsb, impl, &err);
    if (!w)
        printf("  pack failed: %s\n", err.msg);
    return w;
}

/* Run every implementation on p (pool may be NULL) and compare with the model. */
static void check_problem(const problem *p, tpool *pool, const char *what)
{
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    float *out = malloc((size_t)p->M * p->N * sizeof(float));
    for (int i = 0; i < ni; i++) {
        gemm_weight *w = pack(p, impls[i]);
        CHECK(w != NULL);
        if (!w)
            continue;
        memset(out, 0xFF, (size_t)p->M * p->N * sizeof(float));
        gemm_run(w, p->M, p->a, p->as, out, pool);
        size_t first = 0;
        int bad = count_mismatch(out, p->want, (size_t)p->M * p->N, &first);
        if (bad)
            TEST_FAIL_AT("%s %s M=%d N=%d K=%d: %d mismatches, first [%zu]: got %a want %a", what,
                         isa_name(impls[i]), p->M, p->N, p->K, bad, first, out[first],
                         p->want[first]);
        gemm_weight_free(&w);
    }
    free(out);
}

/* ---- tests ---- */

static const int shapes[][3] = {
    {1, 128, 128},  {3, 256, 384},   {8, 384, 256},  {17, 128, 2048},
    {64, 256, 512}, {300, 128, 384}, {5, 2048, 128}, {2, 128, 4096},
};

static void run_grid(int kind, tpool *pool)
{
    int ns = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < ns; s++)
        for (int mode = 0; mode < 3; mode++) {
            int pow2 = (s + mode) % 2;
            problem p = make(kind, shapes[s][0], shapes[s][1], shapes[s][2], mode, pow2);
            char what[64];
            snprintf(what, sizeof what, "%s act=%d pow2=%d",
                     kind == GEMM_KIND_FP8 ? "fp8" : "mxfp4", mode, pow2);
            check_problem(&p, pool, what);
            unmake(&p);
        }
}

TEST(fp8_equals_float64_model)
{
    ep_err err = {0};
    tpool *pool = tpool_create(2, &err);
    CHECK(pool != NULL);
    run_grid(GEMM_KIND_FP8, pool);
    tpool_destroy(&pool);
}

TEST(mxfp4_equals_float64_model)
{
    ep_err err = {0};
    tpool *pool = tpool_create(2, &err);
    CHECK(pool != NULL);
    run_grid(GEMM_KIND_MXFP4, pool);
    tpool_destroy(&pool);
}

/* The exactness claim itself: a block where summing the products in fp32, in order, gives a
 * different float than the exact sum rounded once; the implementations must give the latter.
 * Block 0: 16 products 448 * 6 (sum 43008, fp32 ulp 2^-8 there) and then 16 products
 * 2^-9 * 0.5 = 2^-10, each below half an ulp: fp32 in order drops every one of them, the exact
 * sum keeps 16 * 2^-10 = 2^-6. Blocks 1-3 are 32 * 2^-10 = 2^-5 each (small values only: the
 * AVX2 "lo" pass alone). */
TEST(block_sum_is_exact_then_rounded_once)
{
    enum { N = 128, K = 128 };
    uint8_t a[K];
    float as[1] = {1.0f};
    for (int k = 0; k < K; k++)
        a[k] = k < 16 ? 0x7E : 0x01; /* 448, 2^-9 */
    static uint8_t wp[N * K / 2], wsb[N * K / 32];
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < K / 2; j++)
            wp[n * (K / 2) + j] = j < 8 ? 0x77 : 0x11; /* 6, 6 | 0.5, 0.5 */
        for (int g = 0; g < K / 32; g++)
            wsb[n * (K / 32) + g] = 127;
    }
    float naive = 0.0f;
    for (int k = 0; k < 16; k++)
        naive += 448.0f * 6.0f;
    for (int k = 16; k < 32; k++)
        naive += 0x1p-9f * 0.5f;
    float want = (float)(43008.0 + 16 * 0x1p-10);
    CHECK(want != naive); /* the test can tell the two apart */
    want = want + 0x1p-5f;
    want = want + 0x1p-5f;
    want = want + 0x1p-5f;
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int i = 0; i < ni; i++) {
        ep_err err = {0};
        gemm_weight *w = gemm_pack_mxfp4(N, K, wp, wsb, impls[i], &err);
        CHECK(w != NULL);
        if (!w)
            continue;
        float out[N];
        gemm_run(w, 1, a, as, out, NULL);
        CHECK(same_bits(out[0], want));
        CHECK(same_bits(out[N - 1], want));
        gemm_weight_free(&w);
    }
}

TEST(nan_codes_and_special_scales)
{
    int M = 4, N = 256, K = 256;
    for (int kind = GEMM_KIND_FP8; kind <= GEMM_KIND_MXFP4; kind++) {
        problem p = make(kind, M, N, K, ACT_ADVERSARIAL, 0);
        p.a[1 * K + 200] = 0x7F; /* token 1, block 1: NaN */
        p.a[3 * K + 5] = 0xFF;   /* token 3, block 0: NaN */
        if (kind == GEMM_KIND_FP8) {
            p.w[(size_t)17 * K + 130] = 0xFF; /* row 17, block 1 */
            p.w[(size_t)200 * K + 3] = 0x7F;  /* row 200, block 0 */
            model_fp8(M, N, K, p.a, p.as, p.w, p.ws, p.want);
        } else {
            p.wsb[(size_t)9 * (K / 32) + 2] = 255; /* NaN scale */
            p.wsb[(size_t)10 * (K / 32) + 0] = 0;  /* 2^-127 */
            p.wsb[(size_t)11 * (K / 32) + 3] = 254;
            model_mxfp4(M, N, K, p.a, p.as, p.w, p.wsb, p.want);
        }
        CHECK(isnan(p.want[1 * N + 0]) && isnan(p.want[3 * N + 100]));
        CHECK(!isnan(p.want[0 * N + 0]) && !isnan(p.want[2 * N + 0]));
        if (kind == GEMM_KIND_FP8)
            CHECK(isnan(p.want[0 * N + 17]) && isnan(p.want[2 * N + 200]));
        else
            CHECK(isnan(p.want[0 * N + 9]) && !isnan(p.want[0 * N + 10]));
        check_problem(&p, NULL, kind == GEMM_KIND_FP8 ? "fp8 nan" : "mxfp4 nan");
        unmake(&p);
    }
}

/* Largest magnitudes everywhere (codes near +-448, mostly one sign): the FP8 block sums reach
 * 128 * 448^2 ~ 2^24.6, past what an int32 sum of (a*4) * (w*64) can hold, so an
 * implementation that sums in integers must split or widen; and enough tokens to take the
 * many-token paths. */
TEST(largest_magnitudes)
{
    for (int kind = GEMM_KIND_FP8; kind <= GEMM_KIND_MXFP4; kind++) {
        problem p = make(kind, 13, 256, 512, ACT_UNIFORM, 1);
        for (int i = 0; i < 13 * 512; i++)
            p.a[i] = (uint8_t)(0x78 + rnd() % 7) | (rnd() % 16 == 0 ? 0x80 : 0);
        if (kind == GEMM_KIND_FP8) {
            for (int i = 0; i < 256 * 512; i++)
                p.w[i] = (uint8_t)(0x78 + rnd() % 7) | (rnd() % 16 == 0 ? 0x80 : 0);
            model_fp8(p.M, p.N, p.K, p.a, p.as, p.w, p.ws, p.want);
        } else {
            for (int i = 0; i < 256 * 256; i++)
                p.w[i] = 0x77; /* 6, 6 */
            model_mxfp4(p.M, p.N, p.K, p.a, p.as, p.w, p.wsb, p.want);
        }
        check_problem(&p, NULL, "largest magnitudes");
        unmake(&p);
    }
}

/* Scales that overflow and underflow fp32 in the epilogue: inf, subnormal products. */
TEST(extreme_scales)
{
    for (int kind = GEMM_KIND_FP8; kind <= GEMM_KIND_MXFP4; kind++) {
        problem p = make(kind, 3, 128, 256, ACT_UNIFORM, 0);
        for (int i = 0; i < 3 * 2; i++)
            p.as[i] = i % 2 ? 0x1p-140f : 0x1.8p100f;
        if (kind == GEMM_KIND_FP8) {
            p.ws[0] = 0x1p60f;
            p.ws[1] = 0x1p-20f;
            model_fp8(p.M, p.N, p.K, p.a, p.as, p.w, p.ws, p.want);
        } else {
            for (int i = 0; i < 128 * 8; i++)
                p.wsb[i] = (uint8_t)(i % 3 == 0 ? 1 : i % 3 == 1 ? 200 : 127);
            model_mxfp4(p.M, p.N, p.K, p.a, p.as, p.w, p.wsb, p.want);
        }
        check_problem(&p, NULL, "extreme scales");
        unmake(&p);
    }
}

/* A batch equals its rows one at a time, in shuffled order, with 1, 2 or 3 threads. */
TEST(results_independent_of_batch_order_and_threads)
{
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    int M = 37, N = 384, K = 512;
    for (int kind = GEMM_KIND_FP8; kind <= GEMM_KIND_MXFP4; kind++) {
        problem p = make(kind, M, N, K, ACT_ADVERSARIAL, 1);
        for (int i = 0; i < ni; i++) {
            gemm_weight *w = pack(&p, impls[i]);
            CHECK(w != NULL);
            if (!w)
                continue;
            float *base = malloc((size_t)M * N * sizeof(float));
            float *got = malloc((size_t)M * N * sizeof(float));
            gemm_run(w, M, p.a, p.as, base, NULL);
            size_t first = 0;
            CHECK_EQ(count_mismatch(base, p.want, (size_t)M * N, &first), 0);
            for (int nt = 1; nt <= 3; nt++) {
                ep_err err = {0};
                tpool *pool = tpool_create(nt, &err);
                CHECK(pool != NULL);
                CHECK_EQ(tpool_size(pool), nt);
                gemm_run(w, M, p.a, p.as, got, pool);
                CHECK_EQ(count_mismatch(got, base, (size_t)M * N, &first), 0);
                /* one row at a time, in a shuffled order */
                int perm[37];
                for (int m = 0; m < M; m++)
                    perm[m] = m;
                for (int m = M - 1; m > 0; m--) {
                    int j = (int)(rnd() % (unsigned)(m + 1)), t = perm[m];
                    perm[m] = perm[j];
                    perm[j] = t;
                }
                memset(got, 0, (size_t)M * N * sizeof(float));
                for (int m = 0; m < M; m++) {
                    int r = perm[m];
                    gemm_run(w, 1, p.a + (size_t)r * K, p.as + (size_t)r * (K / 128),
                             got + (size_t)r * N, pool);
                }
                CHECK_EQ(count_mismatch(got, base, (size_t)M * N, &first), 0);
                /* a shuffled batch gives the shuffled rows */
                uint8_t *sa = malloc((size_t)M * K);
                float *ss = malloc((size_t)M * (K / 128) * sizeof(float));
                for (int m = 0; m < M; m++) {
                    memcpy(sa + (size_t)m * K, p.a + (size_t)perm[m] * K, (size_t)K);
                    memcpy(ss + (size_t)m * (K / 128), p.as + (size_t)perm[m] * (K / 128),
                           (K / 128) * sizeof(float));
                }
                gemm_run(w, M, sa, ss, got, pool);
                for (int m = 0; m < M; m++)
                    CHECK_EQ(count_mismatch(got + (size_t)m * N, base + (size_t)perm[m] * N,
                                            (size_t)N, &first),
                             0);
                free(sa);
                free(ss);
                tpool_destroy(&pool);
                CHECK(pool == NULL);
            }
            free(base);
            free(got);
            gemm_weight_free(&w);
        }
        unmake(&p);
    }
}

/* gemm_run_many: a mix of kinds, shapes and token counts (zero included) as one pass gives each
 * job the model's bits, with 1, 2 or 3 threads, for every implementation. */
TEST(run_many_equals_the_model)
{
    enum { NJ = 7 };
    static const int spec[NJ][4] = {
        /* kind, M, N, K */
        {GEMM_KIND_MXFP4, 1, 256, 512}, {GEMM_KIND_MXFP4, 3, 128, 256},
        {GEMM_KIND_FP8, 1, 256, 256},   {GEMM_KIND_MXFP4, 0, 128, 128},
        {GEMM_KIND_FP8, 9, 128, 384},   {GEMM_KIND_MXFP4, 13, 384, 128},
        {GEMM_KIND_FP8, 2, 128, 128},
    };
    problem p[NJ];
    for (int j = 0; j < NJ; j++)
        p[j] = make(spec[j][0], spec[j][1] ? spec[j][1] : 1, spec[j][2], spec[j][3],
                    ACT_ADVERSARIAL, j % 2);
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int i = 0; i < ni; i++)
        for (int nt = 1; nt <= 3; nt++) {
            ep_err err = {0};
            tpool *pool = tpool_create(nt, &err);
            gemm_weight *w[NJ];
            gemm_job jobs[NJ];
            for (int j = 0; j < NJ; j++) {
                w[j] = pack(&p[j], impls[i]);
                jobs[j] = (gemm_job){.w = w[j],
                                     .M = spec[j][1],
                                     .a = p[j].a,
                                     .a_scale = p[j].as,
                                     .out = malloc((size_t)p[j].M * p[j].N * sizeof(float))};
                memset(jobs[j].out, 0xFF, (size_t)p[j].M * p[j].N * sizeof(float));
            }
            gemm_run_many(jobs, NJ, pool);
            for (int j = 0; j < NJ; j++) {
                size_t first = 0;
                if (spec[j][1] > 0) {
                    int bad =
                        count_mismatch(jobs[j].out, p[j].want, (size_t)spec[j][1] * p[j].N, &first);
                    if (bad)
                        TEST_FAIL_AT("%s threads %d job %d: %d mismatches, first %zu",
                                     isa_name(impls[i]), nt, j, bad, first);
                } else {
                    uint32_t u;
                    memcpy(&u, jobs[j].out, 4);
                    CHECK_EQ(u, 0xFFFFFFFFu); /* M = 0 writes nothing */
                }
                free(jobs[j].out);
                gemm_weight_free(&w[j]);
            }
            tpool_destroy(&pool);
        }
    for (int j = 0; j < NJ; j++)
        unmake(&p[j]);
}

/* The SIMD tiling with little scratch (K split in chunks, few tokens per tile) and with a
 * K too large for one tile of the pool's scratch: same bits as the model, for every SIMD
 * implementation. */
TEST(simd_tiling_small_scratch_and_long_k)
{
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    if (ni == 1)
        SKIP("no SIMD implementation on this CPU (or EPMOE_ISA=ref)");
    for (int i = 1; i < ni; i++)
        for (int kind = GEMM_KIND_FP8; kind <= GEMM_KIND_MXFP4; kind++)
            for (int M = 2; M <= 13; M += 11) {
                problem p = make(kind, M, 128, 1024, ACT_ADVERSARIAL, 0);
                gemm_weight *w = pack(&p, impls[i]);
                CHECK(w != NULL);
                float *out = calloc((size_t)p.M * p.N, sizeof(float));
                static _Alignas(64) uint8_t small[GEMM_MIN_SCRATCH];
                gemm_call c = {.w = w, .M = p.M, .a = p.a, .a_scale = p.as, .out = out};
                gemm_sched sched;
                atomic_init(&sched.next, 0);
                gemm_drive(&c, gemm_kops_of(impls[i]), &sched, 0, 1, small, sizeof small);
                size_t first = 0;
                int bad = count_mismatch(out, p.want, (size_t)p.M * p.N, &first);
                if (bad)
                    TEST_FAIL_AT("%s kind %d M=%d small scratch: %d mismatches, first %zu",
                                 isa_name(impls[i]), kind, M, bad, first);
                free(out);
                gemm_weight_free(&w);
                unmake(&p);
            }
    /* K = 49152: 6 tokens do not fit the 1 MiB pool scratch, so K is split in chunks */
    ep_err err = {0};
    tpool *pool = tpool_create(2, &err);
    for (int kind = GEMM_KIND_FP8; kind <= GEMM_KIND_MXFP4; kind++) {
        problem p = make(kind, 7, 128, 49152, ACT_UNIFORM, 1);
        check_problem(&p, pool, "long K");
        unmake(&p);
    }
    tpool_destroy(&pool);
}

TEST(pack_rejects_bad_shapes_and_reports_sizes)
{
    ep_err err = {0};
    uint8_t w[256 * 256] = {0};
    float ws[4] = {1, 1, 1, 1};
    uint8_t wsb[256 * 8] = {0};
    CHECK(gemm_pack_fp8(100, 128, w, ws, ISA_REF, &err) == NULL);
    CHECK_STR_HAS(err.msg, "N=100");
    CHECK(gemm_pack_mxfp4(128, 96, w, wsb, ISA_AUTO, &err) == NULL);
    CHECK_STR_HAS(err.msg, "K=96");
    CHECK(gemm_pack_fp8(128, 0, w, ws, ISA_AUTO, &err) == NULL);
    CHECK_STR_HAS(err.msg, "K=0");
    CHECK(gemm_pack_fp8(128, 128, w, ws, (isa_level)7, &err) == NULL);
    CHECK_STR_HAS(err.msg, "implementation");
    isa_level impls[ISA_COUNT];
    int ni = n_impls(impls);
    for (int i = 0; i < ni; i++) {
        gemm_weight *a = gemm_pack_fp8(256, 256, w, ws, impls[i], &err);
        gemm_weight *b = gemm_pack_mxfp4(256, 256, w, wsb, impls[i], &err);
        CHECK(a && b);
        CHECK_EQ(gemm_weight_n(a), 256);
        CHECK_EQ(gemm_weight_k(b), 256);
        CHECK(gemm_weight_bytes(a) >= 256 * 256);
        CHECK(gemm_weight_bytes(b) >= 256 * 128 + 256 * 8);
        gemm_weight_free(&a);
        gemm_weight_free(&b);
        CHECK(a == NULL && b == NULL);
    }
    gemm_weight_free(NULL);
    tpool_destroy(NULL);
    CHECK_STR_EQ(isa_name(ISA_REF), "ref");
    CHECK_STR_EQ(isa_name(ISA_AVX2), "avx2");
    CHECK_STR_EQ(isa_name(ISA_AVX512), "avx512");
}

/* $EPMOE_ISA caps the choice (what the per-ISA test runs rely on); EPMOE_GEMM=ref still works;
 * unknown names are refused by isa_parse and ignored by isa_best. The knobs reach
 * the kernels the way a daemon hands them over (tests/isa_env.h). */
TEST(isa_override)
{
    char *old_isa = getenv("EPMOE_ISA") ? strdup(getenv("EPMOE_ISA")) : NULL;
    char *old_gemm = getenv("EPMOE_GEMM") ? strdup(getenv("EPMOE_GEMM")) : NULL;
    unsetenv("EPMOE_ISA");
    unsetenv("EPMOE_GEMM");
    test_isa_cap_from_env();
    isa_level best = isa_best();
    CHECK(isa_supported(best));
    for (int i = ISA_AVX512; i > (int)best; i--)
        CHECK(!isa_supported((isa_level)i));
    setenv("EPMOE_ISA", "ref", 1);
    test_isa_cap_from_env();
    CHECK_EQ(isa_best(), ISA_REF);
    setenv("EPMOE_ISA", "avx2", 1);
    test_isa_cap_from_env();
    CHECK_EQ(isa_best(), isa_supported(ISA_AVX2) ? ISA_AVX2 : ISA_REF);
    setenv("EPMOE_ISA", "avx512", 1);
    test_isa_cap_from_env();
    CHECK_EQ(isa_best(), best);
    setenv("EPMOE_ISA", "sse9", 1);
    test_isa_cap_from_env();
    CHECK_EQ(isa_best(), best);
    unsetenv("EPMOE_ISA");
    setenv("EPMOE_GEMM", "ref", 1);
    test_isa_cap_from_env();
    CHECK_EQ(isa_best(), ISA_REF);
    unsetenv("EPMOE_GEMM");
    isa_level got;
    CHECK_EQ(isa_parse("avx512", &got), 0);
    CHECK_EQ(got, ISA_AVX512);
    CHECK_EQ(isa_parse("AVX2", &got), -1);
    CHECK_EQ(isa_parse(NULL, &got), -1);
    if (old_isa)
        setenv("EPMOE_ISA", old_isa, 1);
    if (old_gemm)
        setenv("EPMOE_GEMM", old_gemm, 1);
    test_isa_cap_from_env();
    free(old_isa);
    free(old_gemm);
}

int main(void)
{
    test_isa_cap_from_env();
    RUN(fp8_equals_float64_model);
    RUN(mxfp4_equals_float64_model);
    RUN(block_sum_is_exact_then_rounded_once);
    RUN(nan_codes_and_special_scales);
    RUN(largest_magnitudes);
    RUN(extreme_scales);
    RUN(results_independent_of_batch_order_and_threads);
    RUN(simd_tiling_small_scratch_and_long_k);
    RUN(run_many_equals_the_model);
    RUN(pack_rejects_bad_shapes_and_reports_sizes);
    RUN(isa_override);
    return test_report();
}
