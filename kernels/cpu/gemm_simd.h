/*
 * gemm_simd.h — what the SIMD GEMM files (gemm_avx2.c, gemm_avx512.c) share: the activation
 * tables, AVX2-level vector helpers (the AVX-512 file is compiled with a superset of AVX2) and
 * the FP8 activation preprocessing, whose tile layout both FP8 paths use. Static inline: each
 * file gets its own copy, compiled for its own instruction set. Not a public header.
 */
#ifndef EPMOE_GEMM_SIMD_H
#define EPMOE_GEMM_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/formats.h"

/* ---- tables ---- */

static double f8_act[256]; /* e4m3 code -> value * 2^1000 (NaN codes: 0) */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static inline int e4m3_nan(uint8_t c)
{
    return (c & 0x7F) == 0x7F;
}

static inline void tables_init(void)
{
    for (int c = 0; c < 256; c++) {
        float v = e4m3_nan((uint8_t)c) ? 0.0f : fmt_e4m3_to_f32((uint8_t)c);
        f8_act[c] = (double)v * 0x1p1000;
    }
}

/* ---- small vector helpers ---- */

/* 8 e8m0 codes -> 2^(c-127) as fp32, with fmt_e8m0_to_f32's special cases: c = 0 gives
 * 2^-127 (0x00400000), c = 255 gives NaN (0x7FC00000). */
static inline __m256 e8m0x8(const uint8_t *p)
{
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i bits = _mm256_slli_epi32(c, 23);
    __m256i sp = _mm256_or_si256(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()),
                                 _mm256_cmpeq_epi32(c, _mm256_set1_epi32(255)));
    bits = _mm256_or_si256(bits, _mm256_and_si256(sp, _mm256_set1_epi32(0x00400000)));
    return _mm256_castsi256_ps(bits);
}

/* e8m0x8 for codes known to lie in 1..254: the code is the fp32 exponent field. */
static inline __m256 e8m0x8_plain(const uint8_t *p)
{
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(c, 23));
}

/* lanes whose bit is set in `bits` become NaN */
static inline __m256 nan_lanes(__m256 p, unsigned bits)
{
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), sel), sel);
    return _mm256_or_ps(p, _mm256_castsi256_ps(_mm256_and_si256(m, _mm256_set1_epi32(0x7FC00000))));
}

/* Splitting e4m3 activations exactly into a "hi" and a "lo" part by exponent field e:
 *   hi = (8+m) * 2^(e-E0)               for e >= E0 (the value in units of 2^(E0-10))
 *   lo = value * 2^9 = (8+m) * 2^(e-1)  for 1 <= e < E0, m for e = 0 (units of 2^-9)
 * each signed, so that value = hi * 2^(E0-10) + lo * 2^-9 with one of them zero; NaN codes
 * give hi = lo = 0 and set their lane in nan. The powers of two come from nibble tables. */
typedef struct e4m3_split {
    __m256i hlo, hhi, llo; /* low / high byte of the hi power, the lo power, by e */
} e4m3_split;

static inline e4m3_split split_luts(int E0)
{
    uint8_t hlo[32], hhi[32], llo[32];
    for (int i = 0; i < 32; i++) {
        int e = i & 15;
        unsigned ph = e >= E0 ? 1u << (e - E0) : 0, pl = e >= E0 ? 0 : e == 0 ? 1 : 1u << (e - 1);
        hlo[i] = (uint8_t)(ph & 0xFF);
        hhi[i] = (uint8_t)(ph >> 8);
        llo[i] = (uint8_t)pl;
    }
    e4m3_split L;
    L.hlo = _mm256_loadu_si256((const __m256i *)hlo);
    L.hhi = _mm256_loadu_si256((const __m256i *)hhi);
    L.llo = _mm256_loadu_si256((const __m256i *)llo);
    return L;
}

/* v: 16 e4m3 codes sign-extended to int16 */
static inline void split16(__m256i v, const e4m3_split *L, __m256i *hi, __m256i *lo, __m256i *nan)
{
    __m256i e = _mm256_and_si256(_mm256_srli_epi16(v, 3), _mm256_set1_epi16(15));
    __m256i idx = _mm256_or_si256(e, _mm256_set1_epi16((short)0x8000)); /* high byte -> 0 */
    __m256i m = _mm256_and_si256(v, _mm256_set1_epi16(7));
    __m256i ph = _mm256_or_si256(_mm256_shuffle_epi8(L->hlo, idx),
                                 _mm256_slli_epi16(_mm256_shuffle_epi8(L->hhi, idx), 8));
    __m256i pl = _mm256_shuffle_epi8(L->llo, idx);
    __m256i mh = _mm256_or_si256(m, _mm256_set1_epi16(8));
    __m256i ml = _mm256_or_si256(
        m, _mm256_and_si256(_mm256_cmpgt_epi16(e, _mm256_setzero_si256()), _mm256_set1_epi16(8)));
    *nan =
        _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
    *hi = _mm256_andnot_si256(*nan, _mm256_sign_epi16(_mm256_mullo_epi16(mh, ph), v));
    *lo = _mm256_sign_epi16(_mm256_mullo_epi16(ml, pl), v);
}

/* 32 codes at p -> two sign-extended int16 vectors (codes 0-15, 16-31) */
static inline void codes32(const uint8_t *p, __m256i *v0, __m256i *v1)
{
    *v0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    *v1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
}

/* sum of the 16 int16 lanes of a and b */
static inline int32_t hsum16x2(__m256i a, __m256i b)
{
    __m256i s = _mm256_madd_epi16(_mm256_add_epi16(a, b), _mm256_set1_epi16(1));
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* Bytes ahead of the current block that the kernels prefetch: with two threads streaming
 * weights the hardware prefetcher alone left 10-40 % of the read bandwidth unused. */
#ifndef GEMM_PREFETCH
#define GEMM_PREFETCH 8192
#endif

static inline size_t round64(size_t x)
{
    return (x + 63) / 64 * 64;
}

/* FP8 tiles: doubles for the decode path (few tokens), integers for the many-token path */
static inline size_t f8_token_bytes(int kn, int ipath)
{
    if (ipath)
        return round64((size_t)kn * 2) * 2 + round64((size_t)kn) + round64((size_t)kn / 128) +
               round64((size_t)kn / 128 * 4);
    return round64((size_t)kn * 8) + round64((size_t)kn / 128 * 4);
}

typedef struct f8i_tile {
    uint32_t *ap;
    int16_t *al;
    uint8_t *ent, *cnt;
    float *sa;
} f8i_tile;

static inline f8i_tile f8i_tile_at(uint8_t *base, int kn, int t)
{
    uint8_t *p = base + (size_t)t * f8_token_bytes(kn, 1);
    f8i_tile r;
    r.ap = (uint32_t *)p;
    p += round64((size_t)kn * 2);
    r.al = (int16_t *)p;
    p += round64((size_t)kn * 2);
    r.ent = p;
    p += round64((size_t)kn);
    r.cnt = p;
    p += round64((size_t)kn / 128);
    r.sa = (float *)p;
    return r;
}

static inline void f8_prep(const gemm_call *c, int m, int k0, int kn, double *ad, float *sa)
{
    int K = c->w->K, KB = K / 128;
    const uint8_t *a = c->a + (size_t)m * K + k0;
    for (int b = 0; b < kn / 128; b++) {
        int nan = 0;
        for (int k = 128 * b; k < 128 * b + 128; k++) {
            ad[k] = f8_act[a[k]];
            nan |= e4m3_nan(a[k]);
        }
        sa[b] = nan ? NAN : c->a_scale[(size_t)m * KB + k0 / 128 + b];
    }
}

static inline void f8i_prep(const gemm_call *c, int m, int k0, int kn, f8i_tile d)
{
    int K = c->w->K, KB = K / 128;
    const uint8_t *a = c->a + (size_t)m * K + k0;
    int16_t *A = (int16_t *)d.ap;
    const e4m3_split L = split_luts(8); /* A: |a| >= 2 in units of 2^-2 */
    for (int b = 0; b < kn / 128; b++) {
        int n = 0;
        __m256i nan = _mm256_setzero_si256();
        for (int q = 0; q < 4; q++) {
            int k = 128 * b + 32 * q;
            __m256i v[2], h[2], l[2], nn[2];
            codes32(a + k, &v[0], &v[1]);
            for (int x = 0; x < 2; x++) {
                split16(v[x], &L, &h[x], &l[x], &nn[x]);
                _mm256_store_si256((__m256i *)(A + k + 16 * x), h[x]);
                _mm256_store_si256((__m256i *)(d.al + k + 16 * x), l[x]);
                nan = _mm256_or_si256(nan, nn[x]);
                /* the k with AL != 0: two mask bits per int16 lane */
                uint32_t nz = ~(uint32_t)_mm256_movemask_epi8(
                    _mm256_cmpeq_epi16(l[x], _mm256_setzero_si256()));
                while (nz) {
                    int bit = __builtin_ctz(nz);
                    d.ent[128 * b + n++] = (uint8_t)(32 * q + 16 * x + bit / 2);
                    nz &= ~(3u << bit);
                }
            }
        }
        d.cnt[b] = (uint8_t)n; /* n <= 128 */
        d.sa[b] = _mm256_testz_si256(nan, nan) ? c->a_scale[(size_t)m * KB + k0 / 128 + b] : NAN;
    }
}

#endif
