/*
 * formats.c — scalar, bit-exact number formats (see formats.h and spec §3).
 *
 * Encoders work on the fp32 bit pattern with integer arithmetic only, so their results never
 * depend on the floating-point environment (rounding mode, FTZ/DAZ) of the calling thread.
 */
#include "kernels/formats.h"

#include <string.h>

static inline uint32_t fmt_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float fmt_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round the integer m right by `shift` bits, ties to even. shift in [1, 31]. */
static inline uint32_t fmt_rne_shift(uint32_t m, unsigned shift)
{
    uint32_t keep = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (keep & 1u)))
        keep++;
    return keep;
}

uint16_t fmt_f32_to_bf16(float f)
{
    uint32_t u = fmt_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FFF;
    /* Rounding the low 16 bits away may carry into the exponent; that is RNE's overflow to inf
     * for the largest finite values, as IEEE requires. */
    uint32_t sign = u & 0x80000000u;
    uint32_t mag = fmt_rne_shift(u & 0x7FFFFFFFu, 16);
    return (uint16_t)((sign >> 16) | mag);
}

float fmt_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t e = (c >> 3) & 15u;
    uint32_t m = c & 7u;
    if (e == 15 && m == 7)
        return fmt_from_bits(0x7FC00000u | sign);
    if (e == 0) {
        /* subnormal: m * 2^-9, exact in fp32 */
        float v = (float)m * 0.001953125f;
        return sign ? -v : v;
    }
    return fmt_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

uint8_t fmt_f32_to_e4m3(float x)
{
    uint32_t u = fmt_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return 0x7F;
    if (a >= 0x43E00000u) /* 448 and above, inf included */
        return sign | 0x7E;
    if (a >= 0x3C800000u) {
        /* normal e4m3 range [2^-6, 448): keep 3 mantissa bits; a carry out of the mantissa
         * bumps the exponent, and 448 is the largest result reachable from below 448. */
        uint32_t r = fmt_rne_shift(a, 20);
        return sign | (uint8_t)(r - (120u << 3));
    }
    /* subnormal e4m3: round |x| / 2^-9 to an integer in [0, 8]; 8 is code 0x08 = 2^-6. */
    uint32_t exp = a >> 23;
    if (exp < 127 - 10) /* |x| < 2^-10: below half the smallest subnormal, rounds to 0 */
        return sign;
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u; /* |x| = mant * 2^(exp-150) */
    unsigned shift = (unsigned)(150 - 9) - exp;  /* |x| / 2^-9 = mant >> shift; 21..24 */
    return sign | (uint8_t)fmt_rne_shift(mant, shift);
}

float fmt_e8m0_to_f32(uint8_t c)
{
    if (c == 255)
        return fmt_from_bits(0x7FC00000u);
    if (c == 0)
        return fmt_from_bits(0x00400000u);
    return fmt_from_bits((uint32_t)c << 23);
}

uint8_t fmt_e8m0_ceil(float t)
{
    uint32_t a = fmt_bits(t) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u)
        return 255;
    uint32_t exp = a >> 23;
    uint32_t mant = a & 0x7FFFFFu;
    if (exp == 0) /* zero or subnormal: 2^-127 covers up to 0x00400000, 2^-126 the rest */
        return a <= 0x00400000u ? 0 : 1;
    uint32_t c = exp + (mant != 0);
    return c > 254 ? 255 : (uint8_t)c;
}

uint8_t fmt_f32_to_e2m1(float x)
{
    uint32_t u = fmt_bits(x);
    uint8_t sign = (uint8_t)((u >> 28) & 8);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return 7;
    /* Magnitudes in units of 0.5 map to codes 0..7 as 0,1,2,3,4,6,8,12. Rounding points are the
     * midpoints between neighbours; at a midpoint the even code wins (RNE on the 1-bit
     * mantissa): 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5->4.0. */
    static const uint32_t lim[7] = {
        0x3E800000u, /* 0.25 */ 0x3F400000u, /* 0.75 */ 0x3FA00000u, /* 1.25 */
        0x3FE00000u, /* 1.75 */ 0x40200000u, /* 2.5 */ 0x40600000u,  /* 3.5 */
        0x40A00000u,                                                 /* 5.0 */
    };
    uint8_t code = 0;
    while (code < 7 && a >= lim[code]) {
        /* at an exact midpoint, stay on the even code */
        if (a == lim[code] && (code & 1) == 0)
            break;
        code++;
    }
    return sign | code;
}

void fmt_mxfp4_dequant_row(const uint8_t *packed, const uint8_t *scale, int K, float *out)
{
    for (int k = 0; k < K; k += 2) {
        float s = fmt_e8m0_to_f32(scale[k / EP_MXFP4_GROUP]);
        uint8_t b = packed[k / 2];
        out[k] = fmt_e2m1_to_f32(b & 15) * s;
        out[k + 1] = fmt_e2m1_to_f32(b >> 4) * s;
    }
}

void fmt_mxfp4_quant_row(const float *x, int K, uint8_t *packed, uint8_t *scale)
{
    for (int g = 0; g < K; g += EP_MXFP4_GROUP) {
        float amax = 0.0f;
        for (int k = g; k < g + EP_MXFP4_GROUP; k++) {
            float v = x[k] < 0 ? -x[k] : x[k];
            amax = v > amax ? v : amax;
        }
        if (amax < 1.17549435e-38f)
            amax = 1.17549435e-38f; /* 2^-126: an all-zero group still gets a normal scale */
        uint8_t sc = fmt_e8m0_ceil(amax / 6.0f);
        float inv = 1.0f / fmt_e8m0_to_f32(sc); /* exact: a power of two */
        scale[g / EP_MXFP4_GROUP] = sc;
        for (int k = g; k < g + EP_MXFP4_GROUP; k += 2) {
            uint8_t lo = fmt_f32_to_e2m1(x[k] * inv);
            uint8_t hi = fmt_f32_to_e2m1(x[k + 1] * inv);
            packed[k / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}
