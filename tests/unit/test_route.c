/*
 * test_route.c — the router (kernels/route.h) against the definitions of docs/numerics.md §2,
 * written again here independently (own bf16 rounding, own double sums), and the AVX2 fast
 * path against the reference bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model_config.h"
#include "kernels/route.h"
#include "mathf_mpfr.h"
#include "test.h"
#include "tests/isa_env.h"

/* ---- independent helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* Uniform in [-1, 1). */
static double rng_unit(void)
{
    return (double)(rng_next() >> 11) / 4503599627370496.0 - 1.0;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float bf(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* bf16 RNE by arithmetic, not bit tricks: round to a quantum of 2^(e-8) (8 significant bits),
 * never finer than the bf16 subnormal quantum 2^-133. */
static uint16_t t_bf16(float f)
{
    if (isnan(f))
        return 0x7FFF;
    if (f == 0.0f || isinf(f))
        return (uint16_t)(f32_bits(f) >> 16);
    int e;
    frexp((double)f, &e);
    int qe = e - 8 < -133 ? -133 : e - 8;
    double r = ldexp(nearbyint(ldexp((double)f, -qe)), qe);
    return (uint16_t)(f32_bits((float)r) >> 16);
}

/* A bf16 value with a random sign and magnitude spread over [2^-8, 2^2). */
static uint16_t rand_bf16(void)
{
    double v = rng_unit() * ldexp(1.0, (int)(rng_next() % 10) - 8);
    return t_bf16((float)v);
}

static void *xalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p)
        abort();
    memset(p, 0, (n + 63) / 64 * 64);
    return p;
}

/* Every implementation (an unsupported one runs the reference: route.h); NIMPL of them. */
static const isa_level IMPLS[] = {ISA_REF, ISA_AVX2, ISA_AVX512};
#define NIMPL ((int)(sizeof IMPLS / sizeof IMPLS[0]))

/* ---- ffn_norm ---- */

static void t_rmsnorm(int T, int H, const uint16_t *x, const uint16_t *g, float eps, uint16_t *y)
{
    for (int t = 0; t < T; t++) {
        double s = 0;
        for (int k = 0; k < H; k++)
            s += (double)bf(x[t * H + k]) * (double)bf(x[t * H + k]);
        float ms = (float)(s / H);
        float r = (float)(1.0 / (double)(float)sqrt((double)(float)((double)ms + (double)eps)));
        for (int k = 0; k < H; k++) {
            float xr = (float)((double)bf(x[t * H + k]) * (double)r);
            y[t * H + k] = t_bf16((float)((double)bf(g[k]) * (double)xr));
        }
    }
}

static void check_rmsnorm(int T, int H)
{
    uint16_t *x = xalloc((size_t)T * H * 2), *g = xalloc((size_t)H * 2);
    uint16_t *want = xalloc((size_t)T * H * 2), *got = xalloc((size_t)T * H * 2);
    for (int i = 0; i < T * H; i++)
        x[i] = rand_bf16();
    for (int k = 0; k < H; k++)
        g[k] = rand_bf16();
    if (T > 2)
        memset(x + H, 0, (size_t)H * 2); /* an all-zero row: r = 1/sqrt(eps) */
    t_rmsnorm(T, H, x, g, 1e-6f, want);
    for (int i = 0; i < NIMPL; i++) {
        memset(got, 0xAB, (size_t)T * H * 2);
        route_rmsnorm(IMPLS[i], T, H, x, g, 1e-6f, got);
        int bad = -1;
        for (int j = 0; j < T * H && bad < 0; j++)
            if (got[j] != want[j])
                bad = j;
        if (bad >= 0)
            TEST_FAIL_AT("rmsnorm %s T=%d H=%d: element %d is 0x%04x, expected 0x%04x",
                         isa_name(IMPLS[i]), T, H, bad, got[bad], want[bad]);
    }
    free(x);
    free(g);
    free(want);
    free(got);
}

TEST(rmsnorm_matches_definition_bitwise)
{
    int Ts[] = {1, 5, 300};
    for (int i = 0; i < 3; i++) {
        check_rmsnorm(Ts[i], 256);
        check_rmsnorm(Ts[i], 130); /* not a multiple of the vector widths */
    }
    check_rmsnorm(3, 4096);
}

/* ---- logits ---- */

static void check_logits(int T, int H, int E, int threads)
{
    ep_err err = {0};
    tpool *pool = threads > 0 ? tpool_create(threads, &err) : NULL;
    uint16_t *x = xalloc((size_t)T * H * 2), *w = xalloc((size_t)E * H * 2);
    float *want = xalloc((size_t)T * E * 4), *got = xalloc((size_t)T * E * 4);
    for (int i = 0; i < T * H; i++)
        x[i] = rand_bf16();
    for (int i = 0; i < E * H; i++)
        w[i] = rand_bf16();
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            double s = 0;
            for (int k = 0; k < H; k++)
                s += (double)bf(x[t * H + k]) * (double)bf(w[e * H + k]);
            want[t * E + e] = (float)s;
        }
    for (int i = 0; i < NIMPL; i++) {
        void *packed = xalloc(route_gate_bytes(IMPLS[i], E, H));
        route_gate_pack(IMPLS[i], E, H, w, packed);
        route_logits(IMPLS[i], T, H, E, x, packed, got, pool);
        int bad = -1;
        for (int j = 0; j < T * E && bad < 0; j++)
            if (f32_bits(got[j]) != f32_bits(want[j]))
                bad = j;
        if (bad >= 0)
            TEST_FAIL_AT("logits %s T=%d H=%d E=%d: [%d][%d] = %a, expected %a", isa_name(IMPLS[i]),
                         T, H, E, bad / E, bad % E, got[bad], want[bad]);
        free(packed);
    }
    tpool_destroy(&pool);
    free(x);
    free(w);
    free(want);
    free(got);
}

TEST(logits_match_double_sum_bitwise)
{
    check_logits(1, 256, 16, 0);
    check_logits(5, 256, 13, 2); /* E not a multiple of the 8-expert groups */
    check_logits(300, 128, 16, 2);
    check_logits(2, 4096, 256, 3);
    check_logits(7, 256, 40, 0); /* one 4-token tile, then 3 single rows over 4 + 1 groups */
    /* the AVX-512 tiles: 1, 2, 3 and 4 tokens against 1-4 groups of 16, tails of groups, and
     * more tokens than one widened chunk */
    for (int T = 1; T <= 4; T++)
        check_logits(T, 128, 100, T % 2 + 1);
    check_logits(70, 64, 72, 2);
}

/* A sum whose result depends on the order: the double sum in ascending k must be what comes
 * out, not a pairwise or fp32 one. 2^30 + 1 - 2^30 in double is 1; in fp32 it would be 0. */
TEST(logits_accumulate_in_double_in_k_order)
{
    int H = 8, E = 1;
    uint16_t x[8] = {0}, w[8] = {0};
    x[0] = t_bf16(32768.0f), w[0] = t_bf16(32768.0f); /* 2^30 */
    x[1] = t_bf16(1.0f), w[1] = t_bf16(1.0f / 1024.0f);
    x[2] = t_bf16(-32768.0f), w[2] = t_bf16(32768.0f);
    for (int i = 0; i < NIMPL; i++) {
        void *packed = xalloc(route_gate_bytes(IMPLS[i], E, H));
        route_gate_pack(IMPLS[i], E, H, w, packed);
        float l;
        route_logits(IMPLS[i], 1, H, E, x, packed, &l, NULL);
        CHECK(l == 1.0f / 1024.0f);
        free(packed);
    }
}

/* ---- scores ---- */

TEST(score_is_sqrt_softplus_with_the_threshold)
{
    float ls[] = {-30.0f, -2.5f, -0.0f, 0.0f, 0.3f, 7.0f, 19.999998f, 20.0f, 20.000002f, 100.0f};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        float l = ls[i];
        float want = sqrtf(l > 20.0f ? l : mpfr_ref_log1pf(mpfr_ref_expf(l)));
        CHECK_EQ(f32_bits(route_score(l)), f32_bits(want));
        /* and close to the exact value */
        double exact = sqrt(l > 20.0f ? (double)l : log1p(exp((double)l)));
        CHECK_NEAR(route_score(l), exact, 4e-7 * exact);
    }
    CHECK(route_score(21.0f) == sqrtf(21.0f));
}

/* Logits where glibc 2.36's expf rounds the wrong way (e^l within 2^-46 of a midpoint) and
 * the score changed with it (tests/bench/mathf_libm_diff lists them): the score is the
 * correct rounding of each step, on every host. */
TEST(score_is_correctly_rounded_where_glibc_is_not)
{
    const float ls[] = {0x1.5b3c52p-14f, 0x1.cd3982p-14f, 0x1.dfb8fap-14f, 0x1.9655ecp-13f,
                        0x1.18e65ep-12f};
    const uint32_t want[] = {0x3f5523edu, 0x3f552476u, 0x3f55248cu, 0x3f55261cu, 0x3f552792u};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        float l = ls[i];
        CHECK_EQ(f32_bits(route_score(l)), f32_bits(sqrtf(mpfr_ref_log1pf(mpfr_ref_expf(l)))));
        CHECK_EQ(f32_bits(route_score(l)), want[i]);
    }
}

/* ---- selection ---- */

static void t_topk(int E, int k, const float *s, const float *bias, int32_t *ids)
{
    /* sort all experts by (sel desc, NaN last, id asc) with a plain insertion sort */
    int order[4096];
    float sel[4096];
    for (int e = 0; e < E; e++) {
        order[e] = e;
        sel[e] = bias ? (float)((double)s[e] + (double)bias[e]) : s[e];
    }
    for (int i = 1; i < E; i++)
        for (int j = i; j > 0; j--) {
            int a = order[j - 1], b = order[j];
            int swap;
            if (isnan(sel[a]) != isnan(sel[b]))
                swap = isnan(sel[a]);
            else if (isnan(sel[a]) || sel[a] == sel[b])
                swap = a > b;
            else
                swap = sel[b] > sel[a];
            if (!swap)
                break;
            order[j - 1] = b;
            order[j] = a;
        }
    for (int j = 0; j < k; j++)
        ids[j] = order[j];
}

TEST(topk_ties_pick_the_lower_id)
{
    int E = 16, k = 6;
    float s[16], bias[16];
    int32_t ids[6];
    for (int e = 0; e < E; e++) {
        s[e] = 0.25f;
        bias[e] = 0.0f;
    }
    for (int i = 0; i < NIMPL; i++) {
        route_topk(IMPLS[i], 1, E, k, s, NULL, ids);
        for (int j = 0; j < k; j++)
            CHECK_EQ(ids[j], j);
    }
    /* distinct scores that tie after + bias (8 + 0.5 and 8 + (0.5 + 2^-24) round to the same
     * fp32): the lower id wins although its unbiased score is smaller. */
    for (int e = 0; e < E; e++) {
        s[e] = 0.01f * (float)e;
        bias[e] = 8.0f;
    }
    s[9] = 0.5f;
    s[4] = 0.5f + ldexpf(1.0f, -24);
    s[12] = 0.5f + ldexpf(1.0f, -23);
    CHECK(s[4] + bias[4] == s[9] + bias[9]);
    CHECK(s[4] != s[9]);
    for (int i = 0; i < NIMPL; i++) {
        route_topk(IMPLS[i], 1, E, 3, s, bias, ids);
        CHECK_EQ(ids[0], 4);
        CHECK_EQ(ids[1], 9);
        CHECK_EQ(ids[2], 12);
        /* -0 and +0 tie too */
        float z[4] = {-0.0f, 0.0f, -0.0f, -1.0f};
        route_topk(IMPLS[i], 1, 4, 4, z, NULL, ids);
        CHECK_EQ(ids[0], 0);
        CHECK_EQ(ids[1], 1);
        CHECK_EQ(ids[2], 2);
        CHECK_EQ(ids[3], 3);
    }
}

TEST(topk_ranks_nan_below_every_number)
{
    float s[6] = {NAN, -INFINITY, NAN, 1.0f, -5.0f, NAN};
    int32_t ids[6];
    int want[6] = {3, 4, 1, 0, 2, 5};
    for (int i = 0; i < NIMPL; i++) {
        route_topk(IMPLS[i], 1, 6, 6, s, NULL, ids);
        for (int j = 0; j < 6; j++)
            CHECK_EQ(ids[j], want[j]);
    }
}

TEST(topk_fast_equals_reference_and_definition)
{
    int Ts[] = {1, 5, 300};
    int Es[] = {256, 16, 7};
    int ks[] = {6, 4, 7};
    for (int c = 0; c < 3; c++) {
        int T = Ts[c], E = Es[c], k = ks[c];
        float *s = xalloc((size_t)T * E * 4), *bias = xalloc((size_t)E * 4);
        int32_t *a = xalloc((size_t)T * k * 4), *b = xalloc((size_t)T * k * 4);
        int32_t want[64];
        for (int e = 0; e < E; e++) /* few distinct bias values: many ties in sel */
            bias[e] = 8.0f + ldexpf((float)(rng_next() % 3), -20);
        for (int i = 0; i < T * E; i++)
            s[i] = route_score((float)rng_unit() * 4.0f);
        for (int i = 0; i < T * E; i += 37)
            s[i] = s[i / 2]; /* exact duplicates */
        route_topk(ISA_REF, T, E, k, s, bias, a);
        route_topk(ISA_AVX2, T, E, k, s, bias, b);
        int mism = 0;
        for (int t = 0; t < T; t++) {
            t_topk(E, k, s + (size_t)t * E, bias, want);
            for (int j = 0; j < k; j++)
                mism += a[t * k + j] != want[j] || b[t * k + j] != want[j];
        }
        CHECK_EQ(mism, 0);
        free(s);
        free(bias);
        free(a);
        free(b);
    }
}

TEST(hash_uses_the_table_in_stored_order)
{
    int k = 4, E = 8, vocab = 5;
    int64_t tab[5 * 4] = {7, 0, 3, 5, 1, 2, 3, 4, 6, 6, 0, 2, 0, 1, 2, 3, 5, 4, 3, 2};
    int64_t tok[3] = {4, 0, 2};
    int32_t ids[12];
    ep_err err = {0};
    CHECK_EQ(route_hash(3, k, E, vocab, tok, tab, ids, &err), 0);
    int64_t want[12] = {5, 4, 3, 2, 7, 0, 3, 5, 6, 6, 0, 2};
    for (int i = 0; i < 12; i++)
        CHECK_EQ(ids[i], want[i]);
}

TEST(hash_errors_name_token_and_value)
{
    int64_t tab[2 * 2] = {0, 1, 1, 9};
    int32_t ids[4];
    ep_err err = {0};
    int64_t bad_tok[2] = {0, 2};
    CHECK_EQ(route_hash(2, 2, 4, 2, bad_tok, tab, ids, &err), -1);
    CHECK_STR_HAS(err.msg, "token 1");
    CHECK_STR_HAS(err.msg, "id 2");
    CHECK_STR_HAS(err.msg, "[0, 2)");
    int64_t neg_tok[1] = {-1};
    CHECK_EQ(route_hash(1, 2, 4, 2, neg_tok, tab, ids, &err), -1);
    CHECK_STR_HAS(err.msg, "token 0: id -1");
    int64_t tok[2] = {0, 1};
    CHECK_EQ(route_hash(2, 2, 4, 2, tok, tab, ids, &err), -1);
    CHECK_STR_HAS(err.msg, "token 1 (id 1)");
    CHECK_STR_HAS(err.msg, "= 9");
    CHECK_STR_HAS(err.msg, "[0, 4)");
    tab[3] = -1;
    CHECK_EQ(route_hash(2, 2, 4, 2, tok, tab, ids, &err), -1);
    CHECK_STR_HAS(err.msg, "= -1");
}

TEST(mtp_layers_never_hash)
{
    mc_config c = {0};
    c.num_hidden_layers = 3;
    c.num_hash_layers = 3;
    c.num_nextn_predict_layers = 2;
    CHECK(mc_layer_is_hash(&c, 0));
    CHECK(mc_layer_is_hash(&c, 2));
    CHECK(!mc_layer_is_hash(&c, 3)); /* mtp.0 */
    CHECK(!mc_layer_is_hash(&c, 4)); /* mtp.1 */
    c.num_hash_layers = 1;
    CHECK(!mc_layer_is_hash(&c, 1));
}

/* ---- weights ---- */

TEST(weights_sum_left_to_right_and_skip_padding)
{
    int E = 8, k = 4;
    float s[2 * 8]; /* [T, E]; both tokens get the same scores */
    for (int e = 0; e < E; e++)
        s[e] = s[E + e] = route_score((float)rng_unit() * 3.0f);
    int32_t ids[2 * 4] = {5, 1, 7, 2, 3, -1, 0, -1};
    float w[8];
    route_weights(2, E, k, s, ids, true, 1.5f, w);
    /* token 0 */
    float sum = (float)((double)(float)((double)(float)((double)s[5] + s[1]) + s[7]) + s[2]);
    for (int j = 0; j < 4; j++) {
        float want = (float)((double)(float)((double)s[ids[j]] / sum) * 1.5);
        CHECK_EQ(f32_bits(w[j]), f32_bits(want));
    }
    /* token 1: padding slots weigh 0 and stay out of the sum */
    float sum1 = (float)((double)s[3] + s[0]);
    CHECK_EQ(f32_bits(w[4]), f32_bits((float)((double)(float)((double)s[3] / sum1) * 1.5)));
    CHECK_EQ(f32_bits(w[5]), f32_bits(0.0f));
    CHECK_EQ(f32_bits(w[6]), f32_bits((float)((double)(float)((double)s[0] / sum1) * 1.5)));
    CHECK_EQ(f32_bits(w[7]), f32_bits(0.0f));
    /* norm_topk_prob false: s * factor */
    route_weights(1, E, k, s, ids, false, 1.5f, w);
    for (int j = 0; j < 4; j++)
        CHECK_EQ(f32_bits(w[j]), f32_bits((float)((double)s[ids[j]] * 1.5)));
}

int main(void)
{
    test_isa_cap_from_env();
    RUN(rmsnorm_matches_definition_bitwise);
    RUN(logits_match_double_sum_bitwise);
    RUN(logits_accumulate_in_double_in_k_order);
    RUN(score_is_sqrt_softplus_with_the_threshold);
    RUN(score_is_correctly_rounded_where_glibc_is_not);
    RUN(topk_ties_pick_the_lower_id);
    RUN(topk_ranks_nan_below_every_number);
    RUN(topk_fast_equals_reference_and_definition);
    RUN(hash_uses_the_table_in_stored_order);
    RUN(hash_errors_name_token_and_value);
    RUN(mtp_layers_never_hash);
    RUN(weights_sum_left_to_right_and_skip_padding);
    return test_report();
}
