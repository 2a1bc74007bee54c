/*
 * gemm_avx512_pack.c — the AVX-512 weight layouts (compiled with the AVX-512 flags; gemm_drive.c
 * calls in only when cpuid reports all of them): the packers that lay a checkpoint's [N, K]
 * weights out for the kernels of gemm_avx512.c.
 *
 * ---- packed layouts ----
 * MXFP4: data [N/16][K/32][256 bytes], bscale [N/16][K/32][16]. The 256 bytes of (group g,
 *   block c) are 4 chunks j of 64 bytes; byte 4r + i of chunk j holds row 16g + r: low nibble
 *   k = 32c + 8j + i, high nibble k = 32c + 8j + 4 + i (i < 4). Masking and one vpshufb turn a
 *   chunk into two vectors of 16 rows x 4 consecutive k, the operand vpdpbusd multiplies by a
 *   broadcast of 4 activation digits.
 * FP8: data [N/8][K/8][64 bytes]: chunk j of octet o holds k 8j..8j+7 of its 8 rows; 128-bit
 *   lane L holds rows 2L and 2L+1, row 2L+p at k 8j+i in byte 2i + p of the lane. nanrows and
 *   the integer path's tables are gemm_f8_pack_tables' (gemm_avx2_pack.c, per octet).
 */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/cpu/gemm_internal.h"

/* ---- packing ---- */

/* The nibble order of MXFP4 dwords: k0..k7 (low nibble first) -> k0 k4 k1 k5 k2 k6 k3 k7, i.e.
 * byte i = k_i | k_(4+i) << 4. Two delta swaps, 16 dwords at a time. */
static inline __m512i mx5_nibbles(__m512i x)
{
    __m512i t = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 8), x, _mm512_set1_epi32(0x0000FF00),
                                          0x28);                        /* (a^b)&c */
    x = _mm512_ternarylogic_epi32(x, t, _mm512_slli_epi32(t, 8), 0x96); /* a^b^c */
    t = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 4), x, _mm512_set1_epi32(0x00F000F0), 0x28);
    return _mm512_ternarylogic_epi32(x, t, _mm512_slli_epi32(t, 4), 0x96);
}

/* In place: r[i] dword j <-> r[j] dword i (a 16 x 16 dword transpose). */
static void transpose16x16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            u[i + j] = _mm512_unpacklo_epi64(t[i + j], t[i + 2 + j]);
            u[i + 2 + j] = _mm512_unpackhi_epi64(t[i + j], t[i + 2 + j]);
        }
    /* u[4a + b] holds, in each 128-bit lane l, dword 4l + (0, 2, 1, 3)[b] of rows 4a..4a+3;
     * the 128-bit lanes are transposed across the four row groups next */
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(u[i + j], u[i + 4 + j], 0x88);
            t[i + 4 + j] = _mm512_shuffle_i32x4(u[i + j], u[i + 4 + j], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        int b = j & 3, d = (j & 4 ? 4 : 0) + (b == 1 ? 2 : b == 2 ? 1 : b);
        r[d] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);     /* lanes l = 0 / 1 */
        r[d + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xDD); /* lanes l = 2 / 3 */
    }
}

/* The 16 x 16 e8m0 codes of rows [16g, 16g+16) x blocks [c, c+16) into [block][row] order;
 * returns whether a code is 0 or 255. */
static int mx5_scales16(const uint8_t *scale, int KG, uint8_t *dst)
{
    __m128i v[16], t[16];
    __m128i sp = _mm_setzero_si128();
    for (int r = 0; r < 16; r++) {
        v[r] = _mm_loadu_si128((const __m128i *)(scale + (size_t)r * KG));
        sp = _mm_or_si128(sp, _mm_or_si128(_mm_cmpeq_epi8(v[r], _mm_setzero_si128()),
                                           _mm_cmpeq_epi8(v[r], _mm_set1_epi8((char)0xFF))));
    }
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm_unpacklo_epi8(v[i], v[i + 1]);
        t[i + 1] = _mm_unpackhi_epi8(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            v[i + j] = _mm_unpacklo_epi16(t[i + j], t[i + 2 + j]);
            v[i + 2 + j] = _mm_unpackhi_epi16(t[i + j], t[i + 2 + j]);
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm_unpacklo_epi32(v[i + j], v[i + 4 + j]);
            t[i + 4 + j] = _mm_unpackhi_epi32(v[i + j], v[i + 4 + j]);
        }
    for (int j = 0; j < 8; j++) {
        v[j] = _mm_unpacklo_epi64(t[j], t[j + 8]);
        v[j + 8] = _mm_unpackhi_epi64(t[j], t[j + 8]);
    }
    /* v[i] now holds column c_i in the order of the index bits reversed (byte transposes by
     * unpacking interleave the halves): block index = bit-reversal of i over 4 bits */
    for (int i = 0; i < 16; i++) {
        int c = ((i & 1) << 3) | ((i & 2) << 1) | ((i & 4) >> 1) | ((i & 8) >> 3);
        _mm_storeu_si128((__m128i *)(dst + 16 * c), v[i]);
    }
    return !_mm_testz_si128(sp, sp);
}

int gemm_avx512_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err)
{
    int N = w->N, K = w->K, KG = K / 32;
    size_t rb = (size_t)K / 2;
    if (gemm_pack_alloc(w, (size_t)N * rb, (size_t)N * (size_t)KG, err) < 0)
        return -1;
    for (int g = 0; g < N / 16; g++) {
        const uint8_t *rows = src + (size_t)16 * g * rb;
        /* four blocks (64 bytes of each row) at a time: dword d of row r is chunk d % 4 of
         * block 4q + d / 4 */
        for (int q = 0; q < KG / 4; q++) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_loadu_si512((const void *)(rows + (size_t)i * rb + 64 * q));
            transpose16x16(r);
            uint8_t *dst = w->data + ((size_t)g * KG + 4 * q) * 256;
            for (int d = 0; d < 16; d++)
                _mm512_store_si512((void *)(dst + 64 * d), mx5_nibbles(r[d]));
        }
        const uint8_t *sc = scale + (size_t)16 * g * KG;
        int c = 0;
        for (; c + 16 <= KG; c += 16)
            w->scale_special |= mx5_scales16(sc + c, KG, w->bscale + ((size_t)g * KG + c) * 16);
        for (; c < KG; c++) /* K not a multiple of 512 */
            for (int r = 0; r < 16; r++) {
                uint8_t v = sc[(size_t)r * KG + c];
                w->scale_special |= v == 0 || v == 255;
                w->bscale[((size_t)g * KG + c) * 16 + r] = v;
            }
    }
    return 0;
}

/* The four 128-bit lanes of a, b, c, d transposed: out[l] = (a, b, c, d) lane l. */
static inline void lanes4x4(__m512i a, __m512i b, __m512i c, __m512i d, __m512i out[4])
{
    __m512i t0 = _mm512_shuffle_i32x4(a, b, 0x44), t1 = _mm512_shuffle_i32x4(a, b, 0xEE);
    __m512i t2 = _mm512_shuffle_i32x4(c, d, 0x44), t3 = _mm512_shuffle_i32x4(c, d, 0xEE);
    out[0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
    out[1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
    out[2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
    out[3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
}

int gemm_avx512_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    int N = w->N, K = w->K;
    if (gemm_pack_alloc(w, (size_t)N * (size_t)K, 0, err) < 0)
        return -1;
    /* 64 k of an octet's 8 rows at a time: interleaving the bytes of rows 2L and 2L+1 gives, in
     * 128-bit lane l, lane L of chunk 2l (low halves) or 2l+1 (high halves); a 4 x 4 lane
     * transpose assembles the chunks. */
    for (int o = 0; o < N / 8; o++)
        for (int k0 = 0; k0 < K; k0 += 64) {
            __m512i lo[4], hi[4], ch[4];
            for (int L = 0; L < 4; L++) {
                const uint8_t *r0 = src + (size_t)(8 * o + 2 * L) * K + k0;
                __m512i a = _mm512_loadu_si512((const void *)r0);
                __m512i b = _mm512_loadu_si512((const void *)(r0 + K));
                lo[L] = _mm512_unpacklo_epi8(a, b);
                hi[L] = _mm512_unpackhi_epi8(a, b);
            }
            uint8_t *dst = w->data + ((size_t)o * (K / 8) + k0 / 8) * 64;
            lanes4x4(lo[0], lo[1], lo[2], lo[3], ch);
            for (int l = 0; l < 4; l++)
                _mm512_store_si512((void *)(dst + 64 * (2 * l)), ch[l]);
            lanes4x4(hi[0], hi[1], hi[2], hi[3], ch);
            for (int l = 0; l < 4; l++)
                _mm512_store_si512((void *)(dst + 64 * (2 * l + 1)), ch[l]);
        }
    return gemm_f8_pack_tables(w, src, err);
}
