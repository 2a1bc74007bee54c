/*
 * test_formats.c — the number formats against independent definitions (spec §3).
 *
 * Decoders are checked on every code against the formulas of the spec evaluated with ldexp.
 * Encoders are checked against a brute-force oracle — the nearest representable value found
 * by searching every code in double precision, ties to the even code — on every rounding
 * boundary (each representable value and each midpoint, +-8 ulp of fp32 around it) and on
 * 2^22 pseudo-random bit patterns. The comparison with the CUDA toolkit's own host
 * conversions over >= 10^8 inputs is test_formats_cuda.cpp.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/formats.h"
#include "test.h"

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t u_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* ---- independent definitions ---- */

static double e4m3_def(unsigned c)
{
    unsigned s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, (int)e - 10);
    return s ? -v : v;
}

/* nearest of the candidate values vals[0..n) (ascending magnitudes), ties to the even code */
static unsigned nearest_code(double a, const double *vals, unsigned n)
{
    unsigned best = 0;
    double bd = fabs(a - vals[0]);
    for (unsigned c = 1; c < n; c++) {
        double d = fabs(a - vals[c]);
        if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) {
            best = c;
            bd = d;
        }
    }
    return best;
}

static uint8_t e4m3_oracle(float x)
{
    static double vals[127];
    static int init;
    if (!init) {
        for (unsigned c = 0; c < 127; c++)
            vals[c] = e4m3_def(c);
        init = 1;
    }
    if (isnan(x))
        return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a >= 448.0)
        return sign | 0x7E;
    return sign | (uint8_t)nearest_code(a, vals, 127);
}

static uint8_t e2m1_oracle(float x)
{
    static const double vals[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    if (isnan(x))
        return 7;
    uint8_t sign = signbit(x) ? 8 : 0;
    double a = fabs((double)x);
    if (a >= 6.0)
        return sign | 7;
    return sign | (uint8_t)nearest_code(a, vals, 8);
}

static uint16_t bf16_oracle(float x)
{
    if (isnan(x))
        return 0x7FFF;
    uint32_t u = u_of(x);
    uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
    uint32_t lo = mag >> 16, hi = lo + 1;
    if (mag == (lo << 16))
        return (uint16_t)((sign >> 16) | lo);
    /* candidate values as doubles; hi may be the infinity pattern, whose "value" for rounding
     * purposes is 2^128 (IEEE rounds to inf exactly when the result would round past max) */
    double a = (double)f_of(mag);
    double vlo = (double)f_of(lo << 16);
    double vhi = hi == 0x7F80 ? ldexp(1.0, 128) : (double)f_of(hi << 16);
    double dl = a - vlo, dh = vhi - a;
    uint32_t pick = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return (uint16_t)((sign >> 16) | pick);
}

static uint8_t e8m0_ceil_oracle(float t)
{
    if (isnan(t) || isinf(t))
        return 255;
    double a = fabs((double)t);
    if (a <= ldexp(1.0, -127))
        return 0;
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int c = (m == 0.5 ? e - 1 : e) + 127;
    return c > 254 ? 255 : (uint8_t)c;
}

/* ---- decoders, every code ---- */

TEST(e4m3_decode_every_code)
{
    for (unsigned c = 0; c < 256; c++) {
        float f = fmt_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            CHECK(isnan(f));
            continue;
        }
        if ((double)f != e4m3_def(c) || !!signbit(f) != (c >> 7 != 0))
            TEST_FAIL_AT("e4m3 code %02x decodes to %.9g, spec says %.9g", c, f, e4m3_def(c));
    }
    CHECK_EQ(u_of(fmt_e4m3_to_f32(0x7E)), u_of(448.0f));
    CHECK_EQ(u_of(fmt_e4m3_to_f32(0x38)), u_of(1.0f));
    CHECK_EQ(u_of(fmt_e4m3_to_f32(0x01)), u_of(0.001953125f));
    CHECK_EQ(u_of(fmt_e4m3_to_f32(0x80)), 0x80000000u);
}

TEST(e8m0_decode_every_code)
{
    for (unsigned c = 0; c < 255; c++) {
        float f = fmt_e8m0_to_f32((uint8_t)c);
        if ((double)f != ldexp(1.0, (int)c - 127))
            TEST_FAIL_AT("e8m0 code %u decodes to %.9g", c, f);
    }
    CHECK(isnan(fmt_e8m0_to_f32(255)));
    CHECK_EQ(u_of(fmt_e8m0_to_f32(0)), 0x00400000u);
    CHECK_EQ(u_of(fmt_e8m0_to_f32(127)), u_of(1.0f));
}

TEST(e2m1_decode_every_code)
{
    static const double vals[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (unsigned c = 0; c < 16; c++) {
        float f = fmt_e2m1_to_f32((uint8_t)c);
        double want = (c & 8) ? -vals[c & 7] : vals[c & 7];
        CHECK((double)f == want);
        CHECK(!!signbit(f) == ((c & 8) != 0));
    }
}

TEST(bf16_decode_every_code)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fmt_bf16_to_f32((uint16_t)h);
        if (u_of(f) != h << 16)
            TEST_FAIL_AT("bf16 %04x -> %08x", h, u_of(f));
    }
}

/* ---- encoders ---- */

/* Compare every encoder with its oracle at x, counting mismatches (first few printed). */
static int enc_mismatches;
static void check_encoders_at(float x)
{
    uint8_t e4 = fmt_f32_to_e4m3(x), e4o = e4m3_oracle(x);
    uint8_t e2 = fmt_f32_to_e2m1(x), e2o = e2m1_oracle(x);
    uint16_t b = fmt_f32_to_bf16(x), bo = bf16_oracle(x);
    uint8_t e8 = fmt_e8m0_ceil(x), e8o = e8m0_ceil_oracle(x);
    if (e4 != e4o || e2 != e2o || b != bo || e8 != e8o) {
        if (enc_mismatches++ < 10)
            TEST_FAIL_AT("x=%.9g (%08x): e4m3 %02x/%02x e2m1 %x/%x bf16 %04x/%04x e8m0 %02x/%02x "
                         "(got/oracle)",
                         x, u_of(x), e4, e4o, e2, e2o, b, bo, e8, e8o);
    }
}

static void check_around(float v)
{
    uint32_t u = u_of(v);
    for (int d = -8; d <= 8; d++) {
        check_encoders_at(f_of(u + (uint32_t)d));
        check_encoders_at(-f_of(u + (uint32_t)d));
    }
}

TEST(encoders_on_every_rounding_boundary)
{
    enc_mismatches = 0;
    for (unsigned c = 0; c < 127; c++) {
        double v = e4m3_def(c), next = c < 126 ? e4m3_def(c + 1) : 480.0;
        check_around((float)v);
        check_around((float)((v + next) / 2)); /* midpoints are exact in fp32 */
    }
    static const float e2m1_points[] = {0,    0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                                        2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f, 7.0f};
    for (size_t i = 0; i < sizeof e2m1_points / sizeof e2m1_points[0]; i++)
        check_around(e2m1_points[i]);
    for (int e = -149; e <= 127; e++)
        check_around(ldexpf(1.0f, e)); /* e8m0 ceil boundaries, fp32 exponent boundaries */
    check_around(f_of(0x00400000u));
    check_around(f_of(0x7F7FFFFFu)); /* bf16 overflow to inf */
    check_around(f_of(0x7F7F8000u));
    check_encoders_at(INFINITY);
    check_encoders_at(-INFINITY);
    check_encoders_at(NAN);
    check_encoders_at(-NAN);
    check_encoders_at(f_of(0x7F800001u)); /* signalling NaN */
    CHECK_EQ(enc_mismatches, 0);
}

TEST(encoders_on_random_bit_patterns)
{
    enc_mismatches = 0;
    for (int i = 0; i < (1 << 22); i++)
        check_encoders_at(f_of(rng32()));
    CHECK_EQ(enc_mismatches, 0);
}

TEST(encode_decode_round_trip)
{
    for (unsigned c = 0; c < 256; c++)
        if ((c & 0x7F) != 0x7F)
            CHECK_EQ(fmt_f32_to_e4m3(fmt_e4m3_to_f32((uint8_t)c)), c);
    for (unsigned c = 0; c < 16; c++)
        CHECK_EQ(fmt_f32_to_e2m1(fmt_e2m1_to_f32((uint8_t)c)), c);
    for (unsigned c = 0; c < 255; c++)
        CHECK_EQ(fmt_e8m0_ceil(fmt_e8m0_to_f32((uint8_t)c)), c);
}

TEST(saturation_and_nan_rules)
{
    CHECK_EQ(fmt_f32_to_e4m3(448.0f), 0x7E);
    CHECK_EQ(fmt_f32_to_e4m3(464.0f), 0x7E); /* tie between 448 and 480: even wins */
    CHECK_EQ(fmt_f32_to_e4m3(1e30f), 0x7E);
    CHECK_EQ(fmt_f32_to_e4m3(-INFINITY), 0xFE);
    CHECK_EQ(fmt_f32_to_e4m3(-NAN), 0x7F);
    CHECK_EQ(fmt_f32_to_e2m1(5.0f), 0x6); /* 5 is the 4|6 midpoint: 4 has the even code */
    CHECK_EQ(fmt_f32_to_e2m1(-100.0f), 0xF);
    CHECK_EQ(fmt_f32_to_bf16(NAN), 0x7FFF);
    CHECK_EQ(fmt_e8m0_ceil(1.0f), 127);
    CHECK_EQ(fmt_e8m0_ceil(1.0000001f), 128);
    CHECK_EQ(fmt_e8m0_ceil(0.0f), 0);
}

/* MXFP4 rows: unpack order (low nibble = even k) and the group scale. */
TEST(mxfp4_row_layout)
{
    uint8_t packed[32], scale[2] = {127 + 1, 127 - 2};
    for (int j = 0; j < 32; j++)
        packed[j] = (uint8_t)((j & 15) | ((15 - (j & 15)) << 4));
    float out[64];
    fmt_mxfp4_dequant_row(packed, scale, 64, out);
    for (int k = 0; k < 64; k++) {
        unsigned nib = (k % 2 == 0) ? ((k / 2) & 15) : (15 - ((k / 2) & 15));
        double s = k < 32 ? 2.0 : 0.25;
        CHECK((double)out[k] == (double)fmt_e2m1_to_f32((uint8_t)nib) * s);
    }
}

TEST(mxfp4_quantize_then_dequantize)
{
    /* Values already on the e2m1 grid of their group's scale come back exactly; the scale is
     * the ceil power of two of amax/6. */
    float x[64], y[64];
    uint8_t packed[32], scale[2];
    for (int k = 0; k < 64; k++)
        x[k] = fmt_e2m1_to_f32((uint8_t)(k % 16)) * (k < 32 ? 0.5f : 8.0f);
    fmt_mxfp4_quant_row(x, 64, packed, scale);
    CHECK_EQ(scale[0], 127 - 1);
    CHECK_EQ(scale[1], 127 + 3);
    fmt_mxfp4_dequant_row(packed, scale, 64, y);
    for (int k = 0; k < 64; k++)
        CHECK(u_of(x[k]) == u_of(y[k]) || (x[k] == 0 && y[k] == 0));
}

int main(void)
{
    RUN(e4m3_decode_every_code);
    RUN(e8m0_decode_every_code);
    RUN(e2m1_decode_every_code);
    RUN(bf16_decode_every_code);
    RUN(encoders_on_every_rounding_boundary);
    RUN(encoders_on_random_bit_patterns);
    RUN(encode_decode_round_trip);
    RUN(saturation_and_nan_rules);
    RUN(mxfp4_row_layout);
    RUN(mxfp4_quantize_then_dequantize);
    return test_report();
}
