/*
 * quant_avx2.c — the AVX2 activation quantizer (quant.h), bit-identical to quant.c's
 * reference: the same fp32 compares, multiply and division, lane-wise, and an e4m3 encoder
 * that is fmt_f32_to_e4m3 in integer vector arithmetic (tests check it on every fp32 input).
 */
#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/bf16_avx2.h"
#include "kernels/cpu/simd_internal.h"
#include "kernels/formats.h"

/* fmt_f32_to_e4m3 on 8 lanes, as int32 codes. Same cases, same integer rounding:
 *   NaN -> 0x7F (no sign); |x| >= 448 (inf too) -> sign|0x7E;
 *   normal e4m3 range [2^-6, 448): RNE-shift the magnitude bits right by 20, rebias by 120<<3;
 *   below 2^-6: round mant * 2^(exp-150) / 2^-9 to an integer with RNE (a variable shift of
 *   21..24 bits); below 2^-10 the result is 0. */
static inline __m256i e4m3x8(__m256 x)
{
    const __m256i one = _mm256_set1_epi32(1);
    __m256i u = _mm256_castps_si256(x);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    /* normal */
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), one);
    __m256i rn = _mm256_srli_epi32(
        _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), lsb)), 20);
    rn = _mm256_sub_epi32(rn, _mm256_set1_epi32(120 << 3));
    /* subnormal */
    __m256i exp = _mm256_srli_epi32(a, 23);
    __m256i mant = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7FFFFF)),
                                   _mm256_set1_epi32(0x800000));
    __m256i sh = _mm256_sub_epi32(_mm256_set1_epi32(141), exp);
    __m256i half_m1 = _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(sh, one)), one);
    __m256i keep_lsb = _mm256_and_si256(_mm256_srlv_epi32(mant, sh), one);
    __m256i rs = _mm256_srlv_epi32(_mm256_add_epi32(mant, _mm256_add_epi32(half_m1, keep_lsb)), sh);
    rs = _mm256_and_si256(rs, _mm256_cmpgt_epi32(exp, _mm256_set1_epi32(116)));
    /* select */
    __m256i is_norm = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x3C800000 - 1));
    __m256i is_sat = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43E00000 - 1));
    __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    __m256i code = _mm256_blendv_epi8(rs, rn, is_norm);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7E), is_sat);
    code = _mm256_or_si256(code, sign);
    return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), is_nan);
}

/* 32 codes (4 x 8 int32 in 0..255) -> 32 bytes in order. */
static inline void store_codes(uint8_t *q, __m256i c0, __m256i c1, __m256i c2, __m256i c3)
{
    __m256i p01 = _mm256_packus_epi32(c0, c1), p23 = _mm256_packus_epi32(c2, c3);
    __m256i b = _mm256_packus_epi16(p01, p23);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
}

void qt_avx2_e4m3_n(const float *x, size_t n, uint8_t *q)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        store_codes(q + i, e4m3x8(_mm256_loadu_ps(x + i)), e4m3x8(_mm256_loadu_ps(x + i + 8)),
                    e4m3x8(_mm256_loadu_ps(x + i + 16)), e4m3x8(_mm256_loadu_ps(x + i + 24)));
    if (i < n) {
        float tail[32] = {0};
        uint8_t out[32];
        for (size_t j = 0; i + j < n; j++)
            tail[j] = x[i + j];
        store_codes(out, e4m3x8(_mm256_loadu_ps(tail)), e4m3x8(_mm256_loadu_ps(tail + 8)),
                    e4m3x8(_mm256_loadu_ps(tail + 16)), e4m3x8(_mm256_loadu_ps(tail + 24)));
        for (size_t j = 0; i + j < n; j++)
            q[i + j] = out[j];
    }
}

/* One 128-block already widened to fp32. */
static void block_f32(const __m256 *v, bool pow2, uint8_t *q, float *scale)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int i = 0; i < 16; i++) {
        __m256 a = _mm256_and_ps(v[i], absmask);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, a); /* NaN lanes are caught by `nan` */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float amax = _mm256_movemask_ps(nan) ? NAN : _mm_cvtss_f32(m4);
    float s = qt_block_scale(amax, pow2);
    __m256 sv = _mm256_set1_ps(s);
    for (int i = 0; i < 16; i += 4)
        store_codes(q + 8 * i, e4m3x8(_mm256_div_ps(v[i], sv)), e4m3x8(_mm256_div_ps(v[i + 1], sv)),
                    e4m3x8(_mm256_div_ps(v[i + 2], sv)), e4m3x8(_mm256_div_ps(v[i + 3], sv)));
    *scale = s;
}

void qt_avx2_row_f32(const float *x, int K, bool pow2, uint8_t *q, float *scale)
{
    for (int b = 0; b < K / 128; b++) {
        __m256 v[16];
        for (int i = 0; i < 16; i++)
            v[i] = _mm256_loadu_ps(x + 128 * b + 8 * i);
        block_f32(v, pow2, q + 128 * b, scale + b);
    }
}

void qt_avx2_row_bf16(const uint16_t *x, int K, bool pow2, uint8_t *q, float *scale)
{
    for (int b = 0; b < K / 128; b++) {
        __m256 v[16];
        for (int i = 0; i < 16; i++) {
            __m256i h =
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + 128 * b + 8 * i)));
            v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
        }
        block_f32(v, pow2, q + 128 * b, scale + b);
    }
}

/* ---- bf16 outputs ---- */

void qt_avx2_bf16_n(const float *x, size_t n, uint16_t *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), ps_to_bf16x8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        out[i] = fmt_f32_to_bf16(x[i]);
}

void qt_avx2_sum_bf16_rows(const uint16_t *const *rows, int n, const uint16_t *last, int H,
                           uint16_t *out)
{
    int h = 0;
    for (; h + 8 <= H; h += 8) {
        __m256 y = _mm256_setzero_ps();
        for (int i = 0; i < n; i++)
            y = _mm256_add_ps(y, bf16x8_to_ps(rows[i] + h));
        y = _mm256_add_ps(y, bf16x8_to_ps(last + h));
        _mm_storeu_si128((__m128i *)(out + h), ps_to_bf16x8(y));
    }
    for (; h < H; h++) {
        float y = 0.0f;
        for (int i = 0; i < n; i++)
            y = y + fmt_bf16_to_f32(rows[i][h]);
        out[h] = fmt_f32_to_bf16(y + fmt_bf16_to_f32(last[h]));
    }
}
