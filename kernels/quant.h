/*
 * quant.h — FP8 (e4m3) activation quantization per 128 channels (prefix qt_): spec §5.2 step 1
 * and §3.4, the P-REF act_quant.
 *
 * x is [M, K] row-major (bf16 or fp32), K % 128 == 0; q is [M, K] e4m3 codes and scale
 * [M, K/128] fp32. For each row and each 128-channel block:
 *
 *   amax  = max_i |x_i|, then amax = max(amax, 1e-4f)   fp32 compares; a NaN in the block makes
 *                                                       amax NaN (as torch.amax propagates it)
 *   t     = amax * fp32(1/448)                           fp32 multiply, 1/448 = 0x3B124925
 *   s     = pow2 ? fmt_e8m0_to_f32(fmt_e8m0_ceil(t)) : t
 *   q_i   = fmt_f32_to_e4m3(x_i / s)                     fp32 division; the encoder saturates
 *                                                       to +-448, which is the reference's
 *                                                       clamp to [-448, 448]; NaN gives 0x7F
 *   scale = s
 *
 * What NaN and infinity do is whatever these formulas give: a NaN in a block makes s NaN and
 * every code of the block 0x7F; an infinity makes amax = inf, so s = NaN (pow2: e8m0 code 255)
 * or inf (x/inf = 0 for finite x, inf/inf = NaN).
 *
 * qt_act_rows and qt_act_rows_f32 use the best implementation (isa_best(), so
 * EPMOE_ISA selects here too); the _impl variants take it explicitly, and
 * tests prove the implementations agree bit for bit.
 */
#ifndef EPMOE_QUANT_H
#define EPMOE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/isa.h"

void qt_act_rows(const uint16_t *x_bf16, int M, int K, bool pow2, uint8_t *q, float *scale);
void qt_act_rows_f32(const float *x, int M, int K, bool pow2, uint8_t *q, float *scale);

void qt_act_rows_impl(isa_level impl, const uint16_t *x_bf16, int M, int K, bool pow2, uint8_t *q,
                      float *scale);
void qt_act_rows_f32_impl(isa_level impl, const float *x, int M, int K, bool pow2, uint8_t *q,
                          float *scale);

/* q[i] = fmt_f32_to_e4m3(x[i]) for i < n, with the chosen implementation's encoder (AUTO =
 * best). Exposed so the vector encoder can be checked on every fp32 input. */
void qt_f32_to_e4m3_n(isa_level impl, const float *x, size_t n, uint8_t *q);

/* The layer's bf16 outputs (docs/numerics.md §3.3, §4), vectorised like the rest:
 *   qt_f32_to_bf16_n:  out[i] = fmt_f32_to_bf16(x[i])             (RNE, every NaN -> 0x7FFF)
 *   qt_sum_bf16_rows:  out[h] = bf16( ((+0 + fp32(rows[0][h])) + fp32(rows[1][h]) ...
 *                                      + fp32(rows[n-1][h])) + fp32(last[h]) )
 *                      fp32 adds in that order: the combine of one token (rows in ascending
 *                      expert id, last = the shared expert's output). */
void qt_f32_to_bf16_n(isa_level impl, const float *x, size_t n, uint16_t *out);
void qt_sum_bf16_rows(isa_level impl, const uint16_t *const *rows, int n, const uint16_t *last,
                      int H, uint16_t *out);

#endif
