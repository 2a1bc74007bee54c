/*
 * quant.c — the activation quantizer (quant.h): the scalar reference and the dispatch to the
 * AVX2 path (kernels/cpu/quant_avx2.c, also used by the AVX-512 implementation), which gives the
 * same bits.
 */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/simd_internal.h"
#include "kernels/formats.h"

float qt_block_scale(float amax, bool pow2)
{
    const uint32_t inv448_bits = 0x3B124925u; /* fp32(1/448), spec §3.4 */
    float inv448;
    memcpy(&inv448, &inv448_bits, sizeof inv448);
    if (amax < 1e-4f) /* a NaN amax stays NaN */
        amax = 1e-4f;
    float t = amax * inv448;
    return pow2 ? fmt_e8m0_to_f32(fmt_e8m0_ceil(t)) : t;
}

static void ref_block(const float *x, bool pow2, uint8_t *q, float *scale)
{
    float amax = 0.0f;
    int nan = 0;
    for (int i = 0; i < 128; i++) {
        float v = fabsf(x[i]);
        if (v != v)
            nan = 1;
        else if (v > amax)
            amax = v;
    }
    float s = qt_block_scale(nan ? NAN : amax, pow2);
    for (int i = 0; i < 128; i++)
        q[i] = fmt_f32_to_e4m3(x[i] / s);
    *scale = s;
}

static int use_avx2(isa_level impl)
{
    if (impl == ISA_AUTO)
        impl = isa_best();
    /* The AVX-512 implementation uses the AVX2 quantizer (it is < 0.1 % of a layer). A SIMD
     * request on a CPU without AVX2 falls back to the reference: same bits. */
    return impl >= ISA_AVX2 && isa_supported(ISA_AVX2);
}

void qt_act_rows_f32_impl(isa_level impl, const float *x, int M, int K, bool pow2, uint8_t *q,
                          float *scale)
{
    int avx2 = use_avx2(impl);
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * K;
        uint8_t *qr = q + (size_t)m * K;
        float *sr = scale + (size_t)m * (K / 128);
        if (avx2) {
            qt_avx2_row_f32(xr, K, pow2, qr, sr);
            continue;
        }
        for (int b = 0; b < K / 128; b++)
            ref_block(xr + 128 * b, pow2, qr + 128 * b, sr + b);
    }
}

void qt_act_rows_impl(isa_level impl, const uint16_t *x_bf16, int M, int K, bool pow2, uint8_t *q,
                      float *scale)
{
    int avx2 = use_avx2(impl);
    for (int m = 0; m < M; m++) {
        const uint16_t *xr = x_bf16 + (size_t)m * K;
        uint8_t *qr = q + (size_t)m * K;
        float *sr = scale + (size_t)m * (K / 128);
        if (avx2) {
            qt_avx2_row_bf16(xr, K, pow2, qr, sr);
            continue;
        }
        for (int b = 0; b < K / 128; b++) {
            float xf[128];
            for (int i = 0; i < 128; i++)
                xf[i] = fmt_bf16_to_f32(xr[128 * b + i]);
            ref_block(xf, pow2, qr + 128 * b, sr + b);
        }
    }
}

void qt_act_rows(const uint16_t *x_bf16, int M, int K, bool pow2, uint8_t *q, float *scale)
{
    qt_act_rows_impl(ISA_AUTO, x_bf16, M, K, pow2, q, scale);
}

void qt_act_rows_f32(const float *x, int M, int K, bool pow2, uint8_t *q, float *scale)
{
    qt_act_rows_f32_impl(ISA_AUTO, x, M, K, pow2, q, scale);
}

void qt_f32_to_bf16_n(isa_level impl, const float *x, size_t n, uint16_t *out)
{
    if (use_avx2(impl)) {
        qt_avx2_bf16_n(x, n, out);
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = fmt_f32_to_bf16(x[i]);
}

void qt_sum_bf16_rows(isa_level impl, const uint16_t *const *rows, int n, const uint16_t *last,
                      int H, uint16_t *out)
{
    if (use_avx2(impl)) {
        qt_avx2_sum_bf16_rows(rows, n, last, H, out);
        return;
    }
    for (int h = 0; h < H; h++) {
        float y = 0.0f;
        for (int i = 0; i < n; i++)
            y = y + fmt_bf16_to_f32(rows[i][h]);
        out[h] = fmt_f32_to_bf16(y + fmt_bf16_to_f32(last[h]));
    }
}

void qt_f32_to_e4m3_n(isa_level impl, const float *x, size_t n, uint8_t *q)
{
    if (use_avx2(impl)) {
        qt_avx2_e4m3_n(x, n, q);
        return;
    }
    for (size_t i = 0; i < n; i++)
        q[i] = fmt_f32_to_e4m3(x[i]);
}
