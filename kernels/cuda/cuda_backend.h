/*
 * cuda_backend.h — the GPU kernels, callable from C (prefix cu_).
 *
 * First kernels of the CUDA backend: the FP8 activation quantizer (spec §5.2 step 1) and the
 * exact block-scaled expert GEMMs (kernels/gemm.h's canonical definition: exact block sums in
 * double, one fp32 rounding, fp32 scale-and-accumulate with no contraction). Both are defined
 * to give the CPU backend's bits exactly; tests/gpu/ checks that on a device and skips without
 * one. Tensor-core kernels, which can only meet spec §7's tolerances, come later beside these.
 *
 * The host-pointer entry points copy in and out (for tests and tools); the _dev variants take
 * device pointers and a stream. Every function returns 0 or -1 with err set (CUDA error names
 * included); none exits.
 */
#ifndef EPMOE_CUDA_BACKEND_H
#define EPMOE_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no device or no driver (never an error). */
int cu_device_count(void);
/* "NVIDIA H200 (sm_90, 139 GiB)" or the reason there is none. */
void cu_device_describe(int dev, char *buf, int cap);

/* q e4m3 [M, K] and scale f32 [M, K/128] from x bf16 [M, K]; K % 128 == 0. */
int cu_act_quant(const uint16_t *x, int M, int K, bool pow2, uint8_t *q, float *scale, ep_err *err);

/* out f32 [M, N] = canonical FP8-block GEMM: a e4m3 [M, K] + a_scale [M, K/128];
 * w e4m3 [N, K] + w_scale f32 [N/128, K/128]. */
int cu_gemm_fp8(int M, int N, int K, const uint8_t *a, const float *a_scale, const uint8_t *w,
                const float *w_scale, float *out, ep_err *err);
/* out f32 [M, N] = canonical MXFP4 GEMM: w packed [N, K/2] + w_scale e8m0 [N, K/32]. */
int cu_gemm_mxfp4(int M, int N, int K, const uint8_t *a, const float *a_scale,
                  const uint8_t *w_packed, const uint8_t *w_scale, float *out, ep_err *err);

/* Device-pointer variants (stream 0 when stream is NULL): the same kernels without copies. */
int cu_gemm_fp8_dev(int M, int N, int K, const uint8_t *a, const float *a_scale, const uint8_t *w,
                    const float *w_scale, float *out, void *stream, ep_err *err);
int cu_gemm_mxfp4_dev(int M, int N, int K, const uint8_t *a, const float *a_scale,
                      const uint8_t *w_packed, const uint8_t *w_scale, float *out, void *stream,
                      ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
