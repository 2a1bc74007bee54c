/*
 * bf16_avx2.h — bf16 conversions on 8 lanes for the AVX2 files (route_avx2.c, quant_avx2.c;
 * include it only from files compiled with -mavx2). Bit-identical to formats.h's scalar ones.
 */
#ifndef EPMOE_BF16_AVX2_H
#define EPMOE_BF16_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* Eight bf16 -> eight floats (exact). */
static inline __m256 bf16x8_to_ps(const uint16_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* fmt_f32_to_bf16 on eight lanes: RNE on the low 16 bits (a carry into the exponent is IEEE's
 * overflow to infinity), every NaN to 0x7FFF. The sign bit cannot be reached by the carry
 * except from NaN patterns, which the select replaces. */
static inline __m128i ps_to_bf16x8(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    r = _mm256_srli_epi32(r, 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FFF), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#endif
