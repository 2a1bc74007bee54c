/*
 * route_avx512.c — the AVX-512 gate logits of the router (route.h), bit-identical to the
 * reference in route.c. Compiled with the AVX-512 flags; route.c calls it only for the
 * ISA_AVX512 implementation on a CPU that has it.
 *
 * logit[t][e] is one sequential chain of double FMAs over k (a bf16 x bf16 product is exact in
 * double, so each FMA rounds exactly where the reference's add does). A zmm holds the chains of
 * 8 experts; the gate is stored as bf16 [ceil(E/16)][H][16] (half the bytes of a widened copy:
 * at one token the router is a read of the gate), widened in registers. The FMA latency is
 * hidden by running several chains side by side: 4 tokens x 1 group of 16 experts, 2 x 2 or
 * 1 x 4, always 8 accumulators.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/route_internal.h"

void route_avx512_gate_pack(int E, int H, const uint16_t *w, uint16_t *dst)
{
    int G = (E + ROUTE_AVX512_GROUP - 1) / ROUTE_AVX512_GROUP;
    for (int g = 0; g < G; g++)
        for (int k = 0; k < H; k++)
            for (int i = 0; i < ROUTE_AVX512_GROUP; i++) {
                int e = g * ROUTE_AVX512_GROUP + i;
                dst[((size_t)g * H + k) * ROUTE_AVX512_GROUP + i] =
                    e < E ? w[(size_t)e * H + k] : 0;
            }
}

/* TT tokens x GG groups (TT * GG <= 4); out[t][g][16] */
static inline __attribute__((always_inline)) void
tile(const int TT, const int GG, int H, const double *const *xd, const uint16_t *gate, double *out)
{
    __m512d acc[4][4][2];
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
        for (int g = 0; g < GG; g++)
            acc[t][g][0] = acc[t][g][1] = _mm512_setzero_pd();
    size_t gs = (size_t)H * ROUTE_AVX512_GROUP;
    for (int k = 0; k < H; k++) {
#pragma GCC unroll 4
        for (int g = 0; g < GG; g++) {
            const uint16_t *p = gate + g * gs + (size_t)k * ROUTE_AVX512_GROUP;
            __m512i v =
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)p)), 16);
            __m512 f = _mm512_castsi512_ps(v);
            __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
            __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1));
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                __m512d b = _mm512_set1_pd(xd[t][k]);
                acc[t][g][0] = _mm512_fmadd_pd(b, lo, acc[t][g][0]);
                acc[t][g][1] = _mm512_fmadd_pd(b, hi, acc[t][g][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
        for (int g = 0; g < GG; g++) {
            _mm512_storeu_pd(out + (t * GG + g) * 16, acc[t][g][0]);
            _mm512_storeu_pd(out + (t * GG + g) * 16 + 8, acc[t][g][1]);
        }
}

void route_avx512_logits_part(int H, int E, const double *const *xd, int tt, const uint16_t *gate,
                              int g0, int g1, float *const *logits)
{
    size_t gs = (size_t)H * ROUTE_AVX512_GROUP;
    for (int g = g0; g < g1;) {
        int rest = g1 - g, GG = tt == 1   ? (rest >= 4   ? 4
                                             : rest >= 2 ? 2
                                                         : 1)
                                : tt == 2 ? (rest >= 2 ? 2 : 1)
                                          : 1;
        double out[4 * 4 * 16];
        const uint16_t *gp = gate + (size_t)g * gs;
        if (tt == 1 && GG == 4)
            tile(1, 4, H, xd, gp, out);
        else if (tt <= 2 && GG == 2)
            tt == 1 ? tile(1, 2, H, xd, gp, out) : tile(2, 2, H, xd, gp, out);
        else if (tt == 1)
            tile(1, 1, H, xd, gp, out);
        else if (tt == 2)
            tile(2, 1, H, xd, gp, out);
        else if (tt == 3)
            tile(3, 1, H, xd, gp, out);
        else
            tile(4, 1, H, xd, gp, out);
        for (int t = 0; t < tt; t++)
            for (int gi = 0; gi < GG; gi++)
                for (int i = 0; i < 16; i++) {
                    int e = (g + gi) * ROUTE_AVX512_GROUP + i;
                    if (e < E)
                        logits[t][e] = (float)out[(t * GG + gi) * 16 + i];
                }
        g += GG;
    }
}
