/*
 * swiglu.h — the SwiGLU epilogue between an expert's w1/w3 GEMMs and its w2 GEMM
 * (prefix swiglu_): spec §5.1, §5.2 steps 3-4 (P-REF).
 *
 * acc1, acc3 are the fp32 GEMM outputs [M, I] of w1 (gate) and w3 (up); I % 128 == 0. For
 * every element, in fp32 with the rounding points of the reference:
 *
 *   g  = bf16(acc1), u = bf16(acc3)                  round to nearest even, widened back
 *   g' = min(g, limit)                               gate clamped from above only
 *   u' = min(max(u, -limit), limit)
 *   h  = (g' / (1 + exp(-g'))) * u'                  exp: mf_expf, correctly rounded
 *   h  = w_row[m] * h                                routing weight; w_row NULL means 1.0f
 *                                                    (shared expert) and is still multiplied
 *   h_bf = bf16(h)
 *
 * then every row of h_bf is quantized per 128 channels exactly as qt_act_rows does (same
 * pow2 flag): q [M, I] e4m3 codes, scale [M, I/128] — the w2 GEMM's input.
 *
 * NaN and infinity do whatever the formulas give: the clamps are written as compares
 * (g > limit ? limit : g), so a NaN passes through them, the block's scale becomes NaN and
 * its codes 0x7F; g' = -inf gives silu = -inf / inf = NaN as well.
 *
 * The fast path vectorises everything, the exp too (mf_expf8_avx2: mf_expf's fast path on 8
 * lanes, the scalar mf_expf for the lanes it cannot decide; kernels/mathf.h is correctly
 * rounded, so any host and the GPU's table give the same bits). Both paths give the same bits;
 * tests prove it.
 */
#ifndef EPMOE_SWIGLU_H
#define EPMOE_SWIGLU_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/isa.h"

void swiglu_rows(const float *acc1, const float *acc3, int M, int I, const float *w_row,
                 float limit, bool pow2, uint8_t *q, float *scale);

/* The same with an explicit implementation (AUTO = isa_best()). */
void swiglu_rows_impl(isa_level impl, const float *acc1, const float *acc3, int M, int I,
                      const float *w_row, float limit, bool pow2, uint8_t *q, float *scale);

#endif
