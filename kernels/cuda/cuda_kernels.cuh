/*
 * cuda_kernels.cuh — device helpers shared by the CUDA backend's kernels, and the launchers of
 * the grouped expert GEMMs (gemm_exact.cu, gemm_fast.cu) (prefix cuk_).
 *
 * The number-format helpers are kernels/formats.h's definitions on the device, bit for bit.
 */
#ifndef EPMOE_CUDA_KERNELS_CUH
#define EPMOE_CUDA_KERNELS_CUH

#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_dev.h"

#define CUK_QNAN 0x7FC00000u /* the CPU's NAN (and the e8m0 code 255 decode) */

__device__ __forceinline__ float cuk_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* fmt_f32_to_bf16: RNE, overflow to inf, every NaN -> 0x7FFF. */
__device__ __forceinline__ uint16_t cuk_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FFF;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float cuk_bf16_round(float f)
{
    return cuk_bf16_to_f32(cuk_f32_to_bf16(f));
}

/* fmt_e8m0_to_f32: 2^(c-127); code 0 is 2^-127 (subnormal), 255 NaN. */
__device__ __forceinline__ float cuk_e8m0_to_f32(uint8_t c)
{
    if (c == 255)
        return __uint_as_float(CUK_QNAN);
    return __uint_as_float(c == 0 ? 0x00400000u : (uint32_t)c << 23);
}

/* fmt_e8m0_ceil. */
__device__ __forceinline__ uint8_t cuk_e8m0_ceil(float t)
{
    uint32_t a = __float_as_uint(t) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u)
        return 255;
    uint32_t e = a >> 23, m = a & 0x7FFFFFu;
    if (e == 0)
        return a <= 0x00400000u ? 0 : 1;
    uint32_t c = e + (m != 0);
    return c > 254 ? 255 : (uint8_t)c;
}

/* fmt_f32_to_e4m3: RNE, saturating to +-448, NaN -> 0x7F. */
__device__ __forceinline__ uint8_t cuk_f32_to_e4m3(float x)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* qt_block_scale over the 128 values of a block, one per thread of a 128-thread block: amax
 * (NaN-propagating), max(amax, 1e-4), times fp32(1/448), to a power of two when pow2. red is
 * 128 floats of shared memory; every thread gets the scale. */
__device__ __forceinline__ float cuk_block_scale(float v, bool pow2, float *red)
{
    int tid = threadIdx.x;
    red[tid] = fabsf(v);
    __syncthreads();
    for (int s = 64; s > 0; s >>= 1) {
        if (tid < s) {
            float a = red[tid], b = red[tid + s];
            red[tid] = (isnan(b) || b > a) ? b : a; /* a NaN a stays: b > NaN is false */
        }
        __syncthreads();
    }
    float amax = red[0];
    __syncthreads();  /* red is reused by the caller's next block */
    if (amax < 1e-4f) /* a NaN amax stays NaN */
        amax = 1e-4f;
    float t = __fmul_rn(amax, __uint_as_float(0x3B124925u)); /* fp32(1/448) */
    return pow2 ? cuk_e8m0_to_f32(cuk_e8m0_ceil(t)) : t;
}

/* Launchers (enqueue on the stream; the caller checks cudaGetLastError). */
int cuk_gemm_exact(const cudev_gemm *g, cudaStream_t stream);
/* The reference device kernels (gemm_exact_ref.cu): same results, simpler, slower. */
int cuk_gemm_exact_ref(const cudev_gemm *g, cudaStream_t stream);
/* The one-thread-per-weight-row kernels (gemm_exact.cu): exact, or (FP8 only) fp32 sums. */
int cuk_gemm_rows(const cudev_gemm *g, bool exact, cudaStream_t stream);
int cuk_gemm_fast(const cudev_gemm *g, cudaStream_t stream);

#endif
