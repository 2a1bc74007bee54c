/*
 * gemm_avx2_pack.c — the AVX2 weight layouts (compiled with -mavx2 -mfma; gemm_drive.c calls in
 * only when cpuid reports both): the packers that lay a checkpoint's [N, K] weights out for the
 * kernels of gemm_avx2.c, and the FP8 tables both SIMD layouts carry beside the weights (the
 * AVX-512 packer, gemm_avx512_pack.c, calls gemm_f8_pack_tables too: it is integer code, the same
 * tables for any instruction set).
 *
 * ---- packed layouts ----
 * MXFP4: data [N/8][K/32][128 bytes], bscale [N/8][K/32][8 e8m0 codes].
 *   The 128 bytes of (octet o, block c) are 4 chunks q of 32 bytes; byte b of chunk q holds,
 *   for row 8o + b/4, t = (b>>1)&1, p = b&1: low nibble = k 32c + 8q + 2p + t, high nibble =
 *   k 32c + 8q + 4 + 2p + t. Masking and shifting a chunk then yields four int16 vectors, each
 *   8 rows x 1 k-pair (k, k+1) — the layout vpmaddwd wants against a broadcast (a_k, a_k+1);
 *   vpmaddubsw takes the bytes as they are, each 16-bit lane pairing k and k+2 of one row.
 * FP8: data [N/8][K/4][32 bytes]: chunk j of octet o holds k 4j..4j+3 of its 8 rows, row r at
 *   k 4j+i in byte 16*((r>>1)&1) + 8*((r>>2)&1) + 2i + (r&1): one byte interleave and one
 *   pshufb per vector lay 32 bytes into eight 4-double vectors (gemm_avx2.c, f8_q), and the
 *   int16 panel build gathers k-pairs of rows with one pshufb and one 64-bit interleave
 *   (f8i_panel).
 *   Beside it: nanrows [N/8][K/128] when any NaN code exists; for the integer path the lists
 *   of |w| < 2^-3 weights and the per-block overflow flags (gemm_internal.h).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cpu/gemm_internal.h"

/* ---- FP8 packing tables (both SIMD packers: gemm_avx512_pack.c calls in too) ----
 * For the integer FP8 paths, per (octet, 128-block): the list of weights with |w| < 2^-3 (their
 * exponent field e < 4: entries k | row << 8 | (w * 512) << 16) and whether every row's
 * 128-term int32 sums of A * W cannot overflow: |A| <= 1792, so 1792 * sum |W| <= 2^31 - 1
 * with W = w * 64 for e >= 4 (NaN codes included, as the kernels decode them). And the NaN
 * rows of each (octet, block), NULL when there is no NaN code. One pass, 32 codes at a time;
 * the lists and masks are rare in real weights, so their scalar parts cost little. */
#define F8_SAFE_WSUM 1198372

/* sum over 32 codes of |W| as 8 int32 lanes */
static inline __m256i f8_absw_sum32(__m256i c)
{
    const __m256i plo = _mm256_setr_epi8(0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0,
                                         0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0);
    const __m256i phi = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8);
    __m256i s = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i v =
            _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(c, 1) : _mm256_castsi256_si128(c));
        __m256i e = _mm256_and_si256(_mm256_srli_epi16(v, 3), _mm256_set1_epi16(15));
        __m256i pw = _mm256_or_si256(_mm256_shuffle_epi8(plo, e),
                                     _mm256_slli_epi16(_mm256_shuffle_epi8(phi, e), 8));
        __m256i mant =
            _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(7)), _mm256_set1_epi16(8));
        s = _mm256_add_epi32(s,
                             _mm256_madd_epi16(_mm256_mullo_epi16(mant, pw), _mm256_set1_epi16(1)));
    }
    return s;
}

static inline int32_t f8_wl(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    int32_t v = e == 0 ? m : (8 + m) << (e - 1);
    return (c & 0x80) ? -v : v;
}

int gemm_f8_pack_tables(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    int N = w->N, K = w->K, KB = K / 128;
    size_t nb = (size_t)(N / 8) * KB, cap = 1024, e = 0;
    w->lo_off = malloc((nb + 1) * sizeof(uint32_t));
    w->lo_ent = malloc(cap * sizeof(uint32_t));
    w->int_safe = malloc(nb);
    if (!w->lo_off || !w->lo_ent || !w->int_safe)
        return ep_err_set(err, "gemm: out of memory packing a %dx%d weight", N, K);
    for (int o = 0; o < N / 8; o++)
        for (int kb = 0; kb < KB; kb++) {
            size_t i = (size_t)o * KB + kb;
            w->lo_off[i] = (uint32_t)e;
            int safe = 1;
            unsigned nanb = 0;
            for (int r = 0; r < 8; r++) {
                const uint8_t *row = src + (size_t)(8 * o + r) * K + 128 * kb;
                __m256i sum = _mm256_setzero_si256();
                for (int q = 0; q < 4; q++) {
                    __m256i c = _mm256_loadu_si256((const __m256i *)(row + 32 * q));
                    sum = _mm256_add_epi32(sum, f8_absw_sum32(c));
                    __m256i mag = _mm256_and_si256(c, _mm256_set1_epi8(0x7F));
                    __m256i z = _mm256_setzero_si256();
                    /* e < 4 (bits 5, 6 clear) and not zero: a WL entry */
                    uint32_t small = (uint32_t)_mm256_movemask_epi8(_mm256_andnot_si256(
                        _mm256_cmpeq_epi8(mag, z),
                        _mm256_cmpeq_epi8(_mm256_and_si256(c, _mm256_set1_epi8(0x60)), z)));
                    nanb |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(mag, _mm256_set1_epi8(0x7F)))
                                ? 1u << r
                                : 0;
                    for (; small; small &= small - 1) {
                        int k = 32 * q + __builtin_ctz(small);
                        if (e == cap) {
                            uint32_t *n2 = realloc(w->lo_ent, 2 * cap * sizeof(uint32_t));
                            if (!n2)
                                return ep_err_set(err, "gemm: out of memory packing a %dx%d weight",
                                                  N, K);
                            w->lo_ent = n2;
                            cap *= 2;
                        }
                        w->lo_ent[e++] = (uint32_t)k | (uint32_t)r << 8 |
                                         (uint32_t)(uint16_t)f8_wl(row[k]) << 16;
                    }
                }
                __m128i s4 =
                    _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
                safe &= _mm_cvtsi128_si32(s4) <= F8_SAFE_WSUM;
            }
            w->int_safe[i] = (uint8_t)safe;
            if (nanb && !w->nanrows) {
                w->nanrows = calloc(nb, 1);
                if (!w->nanrows)
                    return ep_err_set(err, "gemm: out of memory packing a %dx%d weight", N, K);
                w->bytes += nb;
            }
            if (nanb)
                w->nanrows[i] = (uint8_t)nanb;
        }
    if (e > UINT32_MAX)
        return ep_err_set(err, "gemm: a %dx%d weight has too many small values", N, K);
    w->lo_off[nb] = (uint32_t)e;
    w->bytes += (nb + 1) * sizeof(uint32_t) + e * sizeof(uint32_t) + nb;
    return 0;
}

/* ---- packing ---- */

/* The nibbles of 8 MXFP4 dwords (k0..k7 each, low nibble first) in the layout's order: byte
 * 2t + p = k(2p + t) | k(2p + t + 4) << 4, i.e. nibbles k0 k4 k2 k6 k1 k5 k3 k7: a perfect
 * shuffle of the nibbles (two delta swaps) and a swap of bytes 1 and 2. */
static inline __m256i mx_nibbles8(__m256i x)
{
    __m256i t = _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi32(x, 8), x),
                                 _mm256_set1_epi32(0x0000FF00));
    x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi32(t, 8)));
    t = _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi32(x, 4), x),
                         _mm256_set1_epi32(0x00F000F0));
    x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi32(t, 4)));
    const __m256i swap12 = _mm256_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15, 0,
                                            2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    return _mm256_shuffle_epi8(x, swap12);
}

/* In place: r[i] dword j <-> r[j] dword i (an 8 x 8 dword transpose). */
static void transpose8x8(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) /* u[i + b]: rows i..i+3, dword (0, 2, 1, 3)[b] of a lane */
        for (int j = 0; j < 2; j++) {
            u[i + j] = _mm256_unpacklo_epi64(t[i + j], t[i + 2 + j]);
            u[i + 2 + j] = _mm256_unpackhi_epi64(t[i + j], t[i + 2 + j]);
        }
    for (int b = 0; b < 4; b++) {
        int d = b == 1 ? 2 : b == 2 ? 1 : b;
        r[d] = _mm256_permute2x128_si256(u[b], u[4 + b], 0x20);     /* lane 0: dwords 0-3 */
        r[d + 4] = _mm256_permute2x128_si256(u[b], u[4 + b], 0x31); /* lane 1: dwords 4-7 */
    }
}

/* The e8m0 codes of 8 rows x blocks [c, c+16) (rows KG apart) into [block][row] order at dst;
 * returns whether a code is 0 or 255. */
static int mx_scales16(const uint8_t *scale, int KG, uint8_t *dst)
{
    __m128i v[8], a[8], b[8], sp = _mm_setzero_si128();
    for (int r = 0; r < 8; r++) {
        v[r] = _mm_loadu_si128((const __m128i *)(scale + (size_t)r * KG));
        sp = _mm_or_si128(sp, _mm_or_si128(_mm_cmpeq_epi8(v[r], _mm_setzero_si128()),
                                           _mm_cmpeq_epi8(v[r], _mm_set1_epi8((char)0xFF))));
    }
    for (int i = 0; i < 4; i++) { /* rows 2i, 2i+1 paired per block: blocks 0-7 / 8-15 */
        a[i] = _mm_unpacklo_epi8(v[2 * i], v[2 * i + 1]);
        a[4 + i] = _mm_unpackhi_epi8(v[2 * i], v[2 * i + 1]);
    }
    for (int h = 0; h < 8; h += 4) /* rows 0-3 and 4-7 per block, 4 blocks a vector */
        for (int i = 0; i < 2; i++) {
            b[h + 2 * i] = _mm_unpacklo_epi16(a[h + 2 * i], a[h + 2 * i + 1]);
            b[h + 2 * i + 1] = _mm_unpackhi_epi16(a[h + 2 * i], a[h + 2 * i + 1]);
        }
    /* b[h + 0/1]: rows 0-3 of blocks h*2 + 0-3 / 4-7; b[h + 2/3]: rows 4-7 of the same */
    for (int h = 0; h < 8; h += 4)
        for (int i = 0; i < 2; i++) {
            int blk = 2 * h + 4 * i; /* first block of b[h + i] */
            _mm_storeu_si128((__m128i *)(dst + 8 * blk),
                             _mm_unpacklo_epi32(b[h + i], b[h + 2 + i]));
            _mm_storeu_si128((__m128i *)(dst + 8 * (blk + 2)),
                             _mm_unpackhi_epi32(b[h + i], b[h + 2 + i]));
        }
    return !_mm_testz_si128(sp, sp);
}

int gemm_avx2_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err)
{
    int N = w->N, K = w->K, KG = K / 32;
    size_t rb = (size_t)K / 2;
    if (gemm_pack_alloc(w, (size_t)N * rb, (size_t)N * (size_t)KG, err) < 0)
        return -1;
    for (int o = 0; o < N / 8; o++) {
        const uint8_t *rows = src + (size_t)8 * o * rb;
        /* two blocks (32 bytes of each row) at a time: dword d of a row is chunk d % 4 of block
         * 2c' + d / 4 */
        for (int c = 0; c < KG; c += 2) {
            __m256i r[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_si256((const __m256i *)(rows + (size_t)i * rb + 16 * c));
            transpose8x8(r);
            uint8_t *dst = w->data + ((size_t)o * KG + c) * 128;
            for (int d = 0; d < 8; d++)
                _mm256_store_si256((__m256i *)(dst + 32 * d), mx_nibbles8(r[d]));
        }
        const uint8_t *sc = scale + (size_t)8 * o * KG;
        int c = 0;
        for (; c + 16 <= KG; c += 16)
            w->scale_special |= mx_scales16(sc + c, KG, w->bscale + ((size_t)o * KG + c) * 8);
        for (; c < KG; c++) /* K not a multiple of 512 */
            for (int r = 0; r < 8; r++) {
                uint8_t v = sc[(size_t)r * KG + c];
                w->scale_special |= v == 0 || v == 255;
                w->bscale[((size_t)o * KG + c) * 8 + r] = v;
            }
    }
    return 0;
}

int gemm_avx2_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    int N = w->N, K = w->K;
    if (gemm_pack_alloc(w, (size_t)N * (size_t)K, 0, err) < 0)
        return -1;
    for (int o = 0; o < N / 8; o++)
        for (int j = 0; j < K / 4; j++) {
            uint8_t *dst = w->data + ((size_t)o * (K / 4) + j) * 32;
            for (int r = 0; r < 8; r++)
                for (int i = 0; i < 4; i++)
                    dst[16 * ((r >> 1) & 1) + 8 * ((r >> 2) & 1) + 2 * i + (r & 1)] =
                        src[(size_t)(8 * o + r) * K + 4 * j + i];
        }
    return gemm_f8_pack_tables(w, src, err);
}
