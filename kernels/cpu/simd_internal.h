/*
 * simd_internal.h — the AVX2 entry points of the quantizer, the SwiGLU epilogue and its exp
 * (kernels/cpu/quant_avx2.c, swiglu_avx2.c, mathf_avx2.c; compiled with -mavx2 -mfma). Only
 * quant.c and swiglu.c call them (and the tests), and only after isa_best() / the caller
 * chose ISA_AVX2.
 */
#ifndef EPMOE_SIMD_INTERNAL_H
#define EPMOE_SIMD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The scale of one block from its amax (quant.c; shared by both implementations). */
float qt_block_scale(float amax, bool pow2);

#ifdef EPMOE_AVX2_KERNELS
/* One row of K (K % 128 == 0): bf16 or fp32 input, same contract as qt_act_rows. */
void qt_avx2_row_bf16(const uint16_t *x, int K, bool pow2, uint8_t *q, float *scale);
void qt_avx2_row_f32(const float *x, int K, bool pow2, uint8_t *q, float *scale);
void qt_avx2_e4m3_n(const float *x, size_t n, uint8_t *q);
void qt_avx2_bf16_n(const float *x, size_t n, uint16_t *out);
void qt_avx2_sum_bf16_rows(const uint16_t *const *rows, int n, const uint16_t *last, int H,
                           uint16_t *out);

/* One row of swiglu_rows (see swiglu.h). */
void swiglu_avx2_row(const float *acc1, const float *acc3, int I, float wrow, float limit,
                     bool pow2, uint8_t *q, float *scale);

/* y[i] = mf_expf(x[i]) for 8 floats (kernels/cpu/mathf_avx2.c); x and y may be the same. */
void mf_expf8_avx2(const float *x, float *y);
#else
/* Builds without the AVX2 files: isa_supported(ISA_AVX2) is 0, so these are never
 * reached. */
static inline void qt_avx2_row_bf16(const uint16_t *x, int K, bool pow2, uint8_t *q, float *s) {}
static inline void qt_avx2_row_f32(const float *x, int K, bool pow2, uint8_t *q, float *s) {}
static inline void qt_avx2_e4m3_n(const float *x, size_t n, uint8_t *q) {}
static inline void qt_avx2_bf16_n(const float *x, size_t n, uint16_t *out) {}
static inline void qt_avx2_sum_bf16_rows(const uint16_t *const *rows, int n, const uint16_t *last,
                                         int H, uint16_t *out)
{
}
static inline void swiglu_avx2_row(const float *acc1, const float *acc3, int I, float wrow,
                                   float limit, bool pow2, uint8_t *q, float *scale)
{
}
static inline void mf_expf8_avx2(const float *x, float *y) {}
#endif

#endif
