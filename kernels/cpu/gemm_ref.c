/*
 * gemm_ref.c — the reference expert GEMMs: the definition of gemm.h in plain C, on the
 * weights exactly as the checkpoint lays them out.
 *
 * Exact block sums in integers. Every e4m3 value is an integer multiple of 2^-9 of magnitude
 * <= 448 = 229376 * 2^-9, and every e2m1 value a multiple of 2^-1 of magnitude <= 6 = 12 * 2^-1.
 * So in units of 2^-18 (FP8 x FP8) a product is an integer of magnitude <= 229376^2 < 2^36 and
 * a 128-term block sum stays below 2^43; in units of 2^-10 (FP8 x MXFP4) a product is <= 2^22
 * and a 32-term sum < 2^27. int64 holds both exactly; (float)S rounds once (round to nearest
 * even) and the power-of-two unit scaling after it is exact (|P| is 0 or >= 2^-18). A NaN code
 * in the block makes P NaN.
 */
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/formats.h"
#include "kernels/fp_exact.h" /* last: no contraction below (docs/numerics.md §0) */

static int e4m3_is_nan(uint8_t c)
{
    return (c & 0x7F) == 0x7F;
}

/* e4m3 code -> value * 2^9 (an integer); NaN codes give 0 and are handled by the caller. */
static void e4m3_int_table(int32_t t[256])
{
    for (int c = 0; c < 256; c++)
        t[c] = e4m3_is_nan((uint8_t)c) ? 0 : (int32_t)(fmt_e4m3_to_f32((uint8_t)c) * 512.0f);
}

static void ref_fp8(const gemm_call *c, int n0, int n1)
{
    const gemm_weight *w = c->w;
    int K = w->K, KB = K / 128;
    int32_t t[256];
    e4m3_int_table(t);
    for (int m = 0; m < c->M; m++) {
        const uint8_t *a = c->a + (size_t)m * K;
        for (int n = n0; n < n1; n++) {
            const uint8_t *wr = w->data + (size_t)n * K;
            float acc = 0.0f;
            for (int kb = 0; kb < KB; kb++) {
                int64_t s = 0;
                int nan = 0;
                for (int k = kb * 128; k < kb * 128 + 128; k++) {
                    nan |= e4m3_is_nan(a[k]) | e4m3_is_nan(wr[k]);
                    s += (int64_t)t[a[k]] * t[wr[k]];
                }
                float p = nan ? NAN : (float)s * 0x1p-18f;
                float sig =
                    c->a_scale[(size_t)m * KB + kb] * w->fscale[(size_t)(n / 128) * KB + kb];
                acc = acc + p * sig;
            }
            c->out[(size_t)m * w->N + n] = acc;
        }
    }
}

static void ref_mxfp4(const gemm_call *c, int n0, int n1)
{
    const gemm_weight *w = c->w;
    int K = w->K, KB = K / 128, KG = K / 32;
    int32_t t[256];
    e4m3_int_table(t);
    int32_t w2[16]; /* e2m1 value * 2 */
    for (int i = 0; i < 16; i++)
        w2[i] = (int32_t)(fmt_e2m1_to_f32((uint8_t)i) * 2.0f);
    for (int m = 0; m < c->M; m++) {
        const uint8_t *a = c->a + (size_t)m * K;
        for (int n = n0; n < n1; n++) {
            const uint8_t *wr = w->data + (size_t)n * (K / 2);
            const uint8_t *sr = w->bscale + (size_t)n * KG;
            float acc = 0.0f;
            for (int g = 0; g < KG; g++) {
                int64_t s = 0;
                int nan = 0;
                for (int k = g * 32; k < g * 32 + 32; k++) {
                    uint8_t nib = (uint8_t)((wr[k / 2] >> (4 * (k & 1))) & 15);
                    nan |= e4m3_is_nan(a[k]);
                    s += (int64_t)t[a[k]] * w2[nib];
                }
                float p = nan ? NAN : (float)s * 0x1p-10f;
                acc = acc + (p * c->a_scale[(size_t)m * KB + g / 4]) * fmt_e8m0_to_f32(sr[g]);
            }
            c->out[(size_t)m * w->N + n] = acc;
        }
    }
}

void gemm_ref_rows(const gemm_call *c, int n0, int n1)
{
    if (c->w->kind == GEMM_KIND_FP8)
        ref_fp8(c, n0, n1);
    else
        ref_mxfp4(c, n0, n1);
}
