/*
 * formats.h — the number formats of DeepSeek V4 checkpoints and activations (prefix fmt_).
 *
 * Bit-exact scalar definitions (spec §3). Every SIMD or CUDA path elsewhere must agree with
 * these bit for bit; tests/unit/test_formats.c checks every code exhaustively and, when the CUDA
 * toolkit headers are present, checks the encoders against the toolkit's host conversions.
 *
 *   bf16   upper half of an fp32; encode is round-to-nearest-even (RNE)
 *   e4m3   FP8 E4M3FN: bias 7, no infinities, 0x7F/0xFF are the only NaNs, max 448
 *   e8m0   UE8M0 scale: 2^(c-127); c = 255 is NaN
 *   e2m1   FP4: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives; no NaN or infinity
 *   mxfp4  e2m1 nibbles packed two per byte along K (low nibble = even k) + one e8m0 per 32 k
 */
#ifndef EPMOE_FORMATS_H
#define EPMOE_FORMATS_H

#include <stdint.h>
#include <string.h>

#include "common/limits.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- bf16 ---- */
static inline float fmt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* RNE; overflow rounds to infinity as IEEE does; every NaN becomes 0x7FFF (CUDA's
 * __float2bfloat16_rn canonical NaN, so CPU and GPU outputs compare bit for bit). */
uint16_t fmt_f32_to_bf16(float f);

/* ---- FP8 E4M3FN ---- */
float fmt_e4m3_to_f32(uint8_t c);

/* RNE with subnormals, saturating: |x| >= 448 and +-inf give +-448 (0x7E/0xFE); every NaN gives
 * 0x7F. This is CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), and every reference
 * quantizer reaches the same bytes by clamping to [-448, 448] before the cast (spec §3.2). */
uint8_t fmt_f32_to_e4m3(float x);

/* ---- E8M0 ---- */
/* 2^(c-127). c = 0 decodes to 2^-127 (fp32 subnormal 0x00400000), as PyTorch's
 * float8_e8m0fnu does; c = 255 decodes to NaN (spec §3.3). */
float fmt_e8m0_to_f32(uint8_t c);

/* The UE8M0 code of the smallest power of two >= |t|. For normal t this is the bit procedure of
 * spec §3.4 (exponent field, plus one when any mantissa bit is set). |t| <= 2^-127 (zero and
 * small subnormals) gives 0; |t| > 2^127, inf and NaN give 255 (NaN). Equal to CUDA's
 * __nv_cvt_float_to_e8m0(t, __NV_NOSAT, cudaRoundPosInf) for every input. */
uint8_t fmt_e8m0_ceil(float t);

/* ---- FP4 E2M1 ---- */
static inline float fmt_e2m1_to_f32(uint8_t nibble)
{
    static const float fmt_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                             4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                             -2.0f, -3.0f, -4.0f, -6.0f};
    return fmt_e2m1_table[nibble & 15];
}

/* RNE, saturating to +-6 (infinities too); every NaN gives 0x7 (+6). Equal to CUDA's
 * __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) for every input. */
uint8_t fmt_f32_to_e2m1(float x);

/* ---- MXFP4 rows ---- */
/* Dequantize one row of K weights: out[k] = e2m1(nibble k) * 2^(scale[k/32] - 127).
 * packed is [K/2] bytes, scale is [K/32] e8m0 codes; K % 32 == 0. */
void fmt_mxfp4_dequant_row(const uint8_t *packed, const uint8_t *scale, int K, float *out);

/* Quantize one row of K floats to MXFP4 the way DeepGEMM's per-token FP4 cast does: per group
 * of 32, scale = e8m0_ceil(max(amax, 2^-126) / 6), nibble = e2m1(x / scale). K % 32 == 0. */
void fmt_mxfp4_quant_row(const float *x, int K, uint8_t *packed, uint8_t *scale);

#ifdef __cplusplus
}
#endif

#endif
