/*
 * swiglu.c — the SwiGLU epilogue (swiglu.h): the scalar reference and the dispatch to the
 * AVX2 path (kernels/cpu/swiglu_avx2.c). The reference works one 128-block at a time and
 * hands each block of bf16-rounded h to the quantizer's reference.
 */
#include "kernels/swiglu.h"

#include <math.h>

#include "kernels/cpu/simd_internal.h"
#include "kernels/formats.h"
#include "kernels/mathf.h"
#include "kernels/quant.h"

static float bf16_round(float x)
{
    return fmt_bf16_to_f32(fmt_f32_to_bf16(x));
}

static void ref_row(const float *acc1, const float *acc3, int I, float wrow, float limit, bool pow2,
                    uint8_t *q, float *scale)
{
    for (int b = 0; b < I / 128; b++) {
        float h[128];
        for (int i = 0; i < 128; i++) {
            float g = bf16_round(acc1[128 * b + i]);
            float u = bf16_round(acc3[128 * b + i]);
            g = g > limit ? limit : g;
            u = u < -limit ? -limit : u;
            u = u > limit ? limit : u;
            float silu = g / (1.0f + mf_expf(-g));
            float hv = silu * u;
            hv = wrow * hv;
            h[i] = bf16_round(hv);
        }
        qt_act_rows_f32_impl(ISA_REF, h, 1, 128, pow2, q + 128 * b, scale + b);
    }
}

void swiglu_rows_impl(isa_level impl, const float *acc1, const float *acc3, int M, int I,
                      const float *w_row, float limit, bool pow2, uint8_t *q, float *scale)
{
    if (impl == ISA_AUTO)
        impl = isa_best();
    /* the AVX-512 implementation uses the AVX2 epilogue (about 2 % of a layer) */
    int avx2 = impl >= ISA_AVX2 && isa_supported(ISA_AVX2);
    for (int m = 0; m < M; m++) {
        const float *a1 = acc1 + (size_t)m * I, *a3 = acc3 + (size_t)m * I;
        uint8_t *qr = q + (size_t)m * I;
        float *sr = scale + (size_t)m * (I / 128);
        float wrow = w_row ? w_row[m] : 1.0f;
        if (avx2)
            swiglu_avx2_row(a1, a3, I, wrow, limit, pow2, qr, sr);
        else
            ref_row(a1, a3, I, wrow, limit, pow2, qr, sr);
    }
}

void swiglu_rows(const float *acc1, const float *acc3, int M, int I, const float *w_row,
                 float limit, bool pow2, uint8_t *q, float *scale)
{
    swiglu_rows_impl(ISA_AUTO, acc1, acc3, M, I, w_row, limit, pow2, q, scale);
}
