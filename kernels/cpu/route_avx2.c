/*
 * route_avx2.c — the AVX2+FMA fast path of the router (route.h), bit-identical to the
 * reference in route.c. Compiled with -mavx2 -mfma; route.c calls it only after cpuid said so.
 *
 * Each result is still one sequential chain of IEEE operations per token (and per expert);
 * the vectors only run several chains side by side:
 *   ffn_norm   four tokens per vector for the double sum of squares (k ascending in every
 *              lane), eight channels per vector for the fp32 output;
 *   logits     eight experts (two vectors of four doubles) times four tokens, k ascending.
 *              a * w of two bf16 values is exact in double, so the FMA rounds exactly where
 *              the reference's add does.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/bf16_avx2.h"
#include "kernels/cpu/route_internal.h"
#include "kernels/formats.h"
#include "kernels/fp_exact.h" /* last: no contraction below (docs/numerics.md §0) */

/* Four bf16 -> four doubles (exact). */
static inline __m256d bf16x4_to_pd(const uint16_t *p)
{
    __m128i h = _mm_loadl_epi64((const __m128i *)p);
    __m128i w = _mm_slli_epi32(_mm_cvtepu16_epi32(h), 16);
    return _mm256_cvtps_pd(_mm_castsi128_ps(w));
}

/* ---- ffn_norm ---- */

/* Sums of squares of four rows (rows may repeat), lane r = row r, k ascending. */
static __m256d sumsq4(const uint16_t *const rows[4], int H)
{
    __m256d acc = _mm256_setzero_pd();
    int k = 0;
    for (; k + 4 <= H; k += 4) {
        __m256d r0 = bf16x4_to_pd(rows[0] + k), r1 = bf16x4_to_pd(rows[1] + k);
        __m256d r2 = bf16x4_to_pd(rows[2] + k), r3 = bf16x4_to_pd(rows[3] + k);
        __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
        __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
        __m256d c0 = _mm256_permute2f128_pd(t0, t2, 0x20);
        __m256d c1 = _mm256_permute2f128_pd(t1, t3, 0x20);
        __m256d c2 = _mm256_permute2f128_pd(t0, t2, 0x31);
        __m256d c3 = _mm256_permute2f128_pd(t1, t3, 0x31);
        acc = _mm256_add_pd(acc, _mm256_mul_pd(c0, c0));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(c1, c1));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(c2, c2));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(c3, c3));
    }
    for (; k < H; k++) {
        __m256d c =
            _mm256_set_pd((double)fmt_bf16_to_f32(rows[3][k]), (double)fmt_bf16_to_f32(rows[2][k]),
                          (double)fmt_bf16_to_f32(rows[1][k]), (double)fmt_bf16_to_f32(rows[0][k]));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(c, c));
    }
    return acc;
}

static void scale_row(int H, const uint16_t *x, const uint16_t *gain, float r, uint16_t *y)
{
    __m256 rv = _mm256_set1_ps(r);
    int k = 0;
    for (; k + 8 <= H; k += 8) {
        __m256 p = _mm256_mul_ps(bf16x8_to_ps(gain + k), _mm256_mul_ps(bf16x8_to_ps(x + k), rv));
        _mm_storeu_si128((__m128i *)(y + k), ps_to_bf16x8(p));
    }
    for (; k < H; k++)
        y[k] = fmt_f32_to_bf16(fmt_bf16_to_f32(gain[k]) * (fmt_bf16_to_f32(x[k]) * r));
}

void route_avx2_rmsnorm(int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                        uint16_t *y)
{
    for (int t0 = 0; t0 < T; t0 += 4) {
        const uint16_t *rows[4];
        for (int r = 0; r < 4; r++)
            rows[r] = x + (size_t)(t0 + r < T ? t0 + r : T - 1) * H;
        double sums[4];
        _mm256_storeu_pd(sums, sumsq4(rows, H));
        for (int r = 0; r < 4 && t0 + r < T; r++) {
            float ms = (float)(sums[r] / (double)H);
            float rs = 1.0f / sqrtf(ms + eps);
            scale_row(H, rows[r], gain, rs, y + (size_t)(t0 + r) * H);
        }
    }
}

/* ---- gate logits ---- */

void route_avx2_gate_pack(int E, int H, const uint16_t *w, float *dst)
{
    int G = (E + ROUTE_AVX2_GROUP - 1) / ROUTE_AVX2_GROUP;
    for (int g = 0; g < G; g++)
        for (int k = 0; k < H; k++)
            for (int i = 0; i < ROUTE_AVX2_GROUP; i++) {
                int e = g * ROUTE_AVX2_GROUP + i;
                dst[((size_t)g * H + k) * ROUTE_AVX2_GROUP + i] =
                    e < E ? fmt_bf16_to_f32(w[(size_t)e * H + k]) : 0.0f;
            }
}

/* Four token rows (xd: doubles, rows may repeat) x one group of eight experts. */
static void logits_tile(int H, const double *const xd[4], const float *gw, double out[4][8])
{
    __m256d a0l = _mm256_setzero_pd(), a0h = a0l, a1l = a0l, a1h = a0l;
    __m256d a2l = a0l, a2h = a0l, a3l = a0l, a3h = a0l;
    for (int k = 0; k < H; k++) {
        const float *p = gw + (size_t)k * ROUTE_AVX2_GROUP;
        __m256d wl = _mm256_cvtps_pd(_mm_load_ps(p));
        __m256d wh = _mm256_cvtps_pd(_mm_load_ps(p + 4));
        __m256d b = _mm256_broadcast_sd(xd[0] + k);
        a0l = _mm256_fmadd_pd(b, wl, a0l);
        a0h = _mm256_fmadd_pd(b, wh, a0h);
        b = _mm256_broadcast_sd(xd[1] + k);
        a1l = _mm256_fmadd_pd(b, wl, a1l);
        a1h = _mm256_fmadd_pd(b, wh, a1h);
        b = _mm256_broadcast_sd(xd[2] + k);
        a2l = _mm256_fmadd_pd(b, wl, a2l);
        a2h = _mm256_fmadd_pd(b, wh, a2h);
        b = _mm256_broadcast_sd(xd[3] + k);
        a3l = _mm256_fmadd_pd(b, wl, a3l);
        a3h = _mm256_fmadd_pd(b, wh, a3h);
    }
    _mm256_storeu_pd(out[0], a0l);
    _mm256_storeu_pd(out[0] + 4, a0h);
    _mm256_storeu_pd(out[1], a1l);
    _mm256_storeu_pd(out[1] + 4, a1h);
    _mm256_storeu_pd(out[2], a2l);
    _mm256_storeu_pd(out[2] + 4, a2h);
    _mm256_storeu_pd(out[3], a3l);
    _mm256_storeu_pd(out[3] + 4, a3h);
}

/* Without memory for the widened rows: the definition, one chain at a time (same bits). */
static void logits_plain(int T, int H, int E, const uint16_t *xn, const float *gate, float *logits)
{
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            const float *gw = gate + (size_t)(e / ROUTE_AVX2_GROUP) * H * ROUTE_AVX2_GROUP;
            double acc = 0.0;
            for (int k = 0; k < H; k++)
                acc = acc + (double)fmt_bf16_to_f32(xn[(size_t)t * H + k]) *
                                (double)gw[(size_t)k * ROUTE_AVX2_GROUP + e % ROUTE_AVX2_GROUP];
            logits[(size_t)t * E + e] = (float)acc;
        }
}

void route_avx2_logits(int T, int H, int E, const uint16_t *xn, const float *gate, float *logits)
{
    double *xbuf = malloc((size_t)4 * (size_t)H * sizeof(double));
    if (!xbuf) {
        logits_plain(T, H, E, xn, gate, logits);
        return;
    }
    int G = (E + ROUTE_AVX2_GROUP - 1) / ROUTE_AVX2_GROUP;
    for (int t0 = 0; t0 < T; t0 += 4) {
        int nr = T - t0 < 4 ? T - t0 : 4;
        const double *xd[4];
        for (int r = 0; r < 4; r++) {
            xd[r] = xbuf + (size_t)(r < nr ? r : nr - 1) * H;
            if (r < nr)
                for (int k = 0; k < H; k++)
                    xbuf[(size_t)r * H + k] = (double)fmt_bf16_to_f32(xn[(size_t)(t0 + r) * H + k]);
        }
        for (int g = 0; g < G; g++) {
            double out[4][8];
            logits_tile(H, xd, gate + (size_t)g * H * ROUTE_AVX2_GROUP, out);
            for (int r = 0; r < nr; r++)
                for (int i = 0; i < ROUTE_AVX2_GROUP && g * ROUTE_AVX2_GROUP + i < E; i++)
                    logits[(size_t)(t0 + r) * E + g * ROUTE_AVX2_GROUP + i] = (float)out[r][i];
        }
    }
    free(xbuf);
}
