/*
 * swiglu_avx2.c — the AVX2 SwiGLU epilogue (swiglu.h), bit-identical to swiglu.c's reference:
 * the same fp32 operations lane-wise, bf16 rounding in integer arithmetic as
 * fmt_f32_to_bf16 does it, and mf_expf (kernels/mathf.h) 8 lanes at a time (mathf_avx2.c).
 */
#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/simd_internal.h"

/* fmt_bf16_to_f32(fmt_f32_to_bf16(x)) on 8 lanes: RNE on the low 16 bits (a carry may reach
 * the exponent: overflow to inf, as IEEE), every NaN becomes 0x7FFF0000. */
static inline __m256 bf16_round8(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r),
                            _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF0000)), nan);
}

void swiglu_avx2_row(const float *acc1, const float *acc3, int I, float wrow, float limit,
                     bool pow2, uint8_t *q, float *scale)
{
    const __m256 lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
    const __m256 one = _mm256_set1_ps(1.0f), wv = _mm256_set1_ps(wrow);
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < I / 128; b++) {
        _Alignas(32) float h[128];
        for (int i = 0; i < 128; i += 8) {
            __m256 g = bf16_round8(_mm256_loadu_ps(acc1 + 128 * b + i));
            __m256 u = bf16_round8(_mm256_loadu_ps(acc3 + 128 * b + i));
            /* compares are false for NaN, so NaN passes through like the reference's ?: */
            g = _mm256_blendv_ps(g, lim, _mm256_cmp_ps(g, lim, _CMP_GT_OQ));
            u = _mm256_blendv_ps(u, nlim, _mm256_cmp_ps(u, nlim, _CMP_LT_OQ));
            u = _mm256_blendv_ps(u, lim, _mm256_cmp_ps(u, lim, _CMP_GT_OQ));
            _Alignas(32) float e[8];
            _mm256_store_ps(e, _mm256_xor_ps(g, signbit));
            mf_expf8_avx2(e, e);
            __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, _mm256_load_ps(e)));
            __m256 hv = _mm256_mul_ps(wv, _mm256_mul_ps(silu, u));
            _mm256_store_ps(h + i, bf16_round8(hv));
        }
        qt_avx2_row_f32(h, 128, pow2, q + 128 * b, scale + b);
    }
}
