/*
 * cuda_backend.cu — see cuda_backend.h.
 *
 * Bit-exactness with the CPU backend rests on four facts: fp32 max is exact; the quantizer's
 * multiply and division are done with the _rn intrinsics (IEEE, never contracted into an FMA);
 * __nv_cvt_float_to_fp8(.., __NV_SATFINITE, __NV_E4M3) is the encoder fmt_f32_to_e4m3 was
 * proven equal to over all 2^32 inputs; and every GEMM block partial is an exact sum (products
 * of e4m3 x e4m3 or e4m3 x e2m1 values are exact in double and a 128-term sum of them fits a
 * double's 53 bits, spec §5.8), so the order of the double additions does not matter.
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_backend.h"

#define CU_BLOCK 128 /* FP8 activation and weight block along K */
#define CU_GROUP 32  /* MXFP4 scale group along K */

static int cu_check(cudaError_t e, const char *what, ep_err *err)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError(); /* clear a sticky launch error */
    return ep_err_set(err, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

extern "C" int cu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void cu_device_describe(int dev, char *buf, int cap)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, (size_t)cap, "no CUDA device %d", dev);
        return;
    }
    snprintf(buf, (size_t)cap, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

/* ---- number formats on the device (formats.h semantics) ---- */

__device__ static float cu_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ static float cu_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24, e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15 && m == 7)
        return __uint_as_float(0x7FC00000u | sign);
    if (e == 0) {
        float v = (float)m * 0.001953125f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

__device__ static float cu_e8m0_to_f32(uint8_t c)
{
    if (c == 255)
        return __uint_as_float(0x7FC00000u);
    return __uint_as_float(c == 0 ? 0x00400000u : (uint32_t)c << 23);
}

__device__ static float cu_e2m1_to_f32(uint8_t n)
{
    const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float a = v[n & 7];
    return (n & 8) ? -a : a;
}

/* smallest power of two >= t for normal positive t (spec §3.4), as an fp32 value */
__device__ static float cu_pow2_ceil(float t)
{
    uint32_t b = __float_as_uint(t) & 0x7FFFFFFFu;
    uint32_t c = (b >> 23) + ((b & 0x7FFFFFu) != 0);
    if (b >= 0x7F800000u || c > 254)
        return __uint_as_float(0x7FC00000u);
    if ((b >> 23) == 0)
        c = b <= 0x00400000u ? 0 : 1;
    return cu_e8m0_to_f32((uint8_t)c);
}

/* ---- activation quantizer: one block of 128 threads per (row, 128-channel block) ---- */

__global__ static void cu_act_quant_kernel(const uint16_t *x, int K, bool pow2, uint8_t *q,
                                           float *scale)
{
    __shared__ float red[CU_BLOCK];
    int row = blockIdx.y, blk = blockIdx.x, i = threadIdx.x;
    size_t at = (size_t)row * K + (size_t)blk * CU_BLOCK + i;
    float v = cu_bf16_to_f32(x[at]);
    red[i] = fabsf(v);
    __syncthreads();
    /* NaN-propagating max, as the CPU quantizer (and torch.amax) */
    for (int s = CU_BLOCK / 2; s > 0; s >>= 1) {
        if (i < s && (red[i + s] > red[i] || isnan(red[i + s])))
            red[i] = red[i + s];
        __syncthreads();
    }
    float amax = red[0];
    if (amax < 1e-4f) /* a NaN amax stays NaN */
        amax = 1e-4f;
    float t = __fmul_rn(amax, __uint_as_float(0x3B124925u)); /* fp32(1/448) */
    float s = pow2 ? cu_pow2_ceil(t) : t;
    float y = fminf(fmaxf(__fdiv_rn(v, s), -448.0f), 448.0f);
    q[at] = (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
    if (i == 0)
        scale[(size_t)row * (K / CU_BLOCK) + blk] = s;
}

/* ---- exact block GEMMs: one thread per output element (reference speed, exact bits) ---- */

__global__ static void cu_gemm_fp8_kernel(int M, int N, int K, const uint8_t *a, const float *sa,
                                          const uint8_t *w, const float *sw, float *out)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N || m >= M)
        return;
    int kb_n = K / CU_BLOCK;
    float acc = 0.0f;
    for (int kb = 0; kb < kb_n; kb++) {
        double p = 0.0;
        for (int k = kb * CU_BLOCK; k < (kb + 1) * CU_BLOCK; k++)
            p += (double)cu_e4m3_to_f32(a[(size_t)m * K + k]) *
                 (double)cu_e4m3_to_f32(w[(size_t)n * K + k]);
        float sig = __fmul_rn(sa[(size_t)m * kb_n + kb], sw[(size_t)(n / CU_BLOCK) * kb_n + kb]);
        acc = __fadd_rn(acc, __fmul_rn((float)p, sig));
    }
    out[(size_t)m * N + n] = acc;
}

__global__ static void cu_gemm_mxfp4_kernel(int M, int N, int K, const uint8_t *a, const float *sa,
                                            const uint8_t *wp, const uint8_t *ws, float *out)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N || m >= M)
        return;
    float acc = 0.0f;
    for (int c = 0; c < K / CU_GROUP; c++) {
        double p = 0.0;
        for (int k = c * CU_GROUP; k < (c + 1) * CU_GROUP; k++) {
            uint8_t b = wp[(size_t)n * (K / 2) + k / 2];
            uint8_t nib = (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
            p += (double)cu_e4m3_to_f32(a[(size_t)m * K + k]) * (double)cu_e2m1_to_f32(nib);
        }
        float t = __fmul_rn((float)p, sa[(size_t)m * (K / CU_BLOCK) + c / 4]);
        acc = __fadd_rn(acc, __fmul_rn(t, cu_e8m0_to_f32(ws[(size_t)n * (K / CU_GROUP) + c])));
    }
    out[(size_t)m * N + n] = acc;
}

/* ---- device-pointer entry points ---- */

static int cu_gemm_shape(const char *what, int M, int N, int K, ep_err *err)
{
    if (M < 1 || N < CU_BLOCK || K < CU_BLOCK || N % CU_BLOCK || K % CU_BLOCK)
        return ep_err_set(err, "%s: bad shape M=%d N=%d K=%d", what, M, N, K);
    return 0;
}

extern "C" int cu_gemm_fp8_dev(int M, int N, int K, const uint8_t *a, const float *a_scale,
                               const uint8_t *w, const float *w_scale, float *out, void *stream,
                               ep_err *err)
{
    if (cu_gemm_shape("cu_gemm_fp8", M, N, K, err))
        return -1;
    cu_gemm_fp8_kernel<<<dim3((N + 127) / 128, M), 128, 0, (cudaStream_t)stream>>>(
        M, N, K, a, a_scale, w, w_scale, out);
    return cu_check(cudaGetLastError(), "cu_gemm_fp8 launch", err);
}

extern "C" int cu_gemm_mxfp4_dev(int M, int N, int K, const uint8_t *a, const float *a_scale,
                                 const uint8_t *w_packed, const uint8_t *w_scale, float *out,
                                 void *stream, ep_err *err)
{
    if (cu_gemm_shape("cu_gemm_mxfp4", M, N, K, err))
        return -1;
    cu_gemm_mxfp4_kernel<<<dim3((N + 127) / 128, M), 128, 0, (cudaStream_t)stream>>>(
        M, N, K, a, a_scale, w_packed, w_scale, out);
    return cu_check(cudaGetLastError(), "cu_gemm_mxfp4 launch", err);
}

/* ---- host wrappers: copy in, run, copy out ---- */

typedef struct cu_buf {
    void *p;
} cu_buf;

static int cu_upload(cu_buf *b, const void *host, size_t n, ep_err *err)
{
    if (cu_check(cudaMalloc(&b->p, n ? n : 1), "cudaMalloc", err))
        return -1;
    return host ? cu_check(cudaMemcpy(b->p, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D", err)
                : 0;
}

static void cu_free_all(cu_buf *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i].p)
            cudaFree(bufs[i].p);
}

extern "C" int cu_act_quant(const uint16_t *x, int M, int K, bool pow2, uint8_t *q, float *scale,
                            ep_err *err)
{
    if (M < 1 || K < CU_BLOCK || K % CU_BLOCK)
        return ep_err_set(err, "cu_act_quant: bad shape [%d, %d]", M, K);
    size_t n = (size_t)M * K, ns = (size_t)M * (K / CU_BLOCK);
    cu_buf b[3] = {{NULL}, {NULL}, {NULL}};
    int rc = -1;
    if (cu_upload(&b[0], x, n * 2, err) || cu_upload(&b[1], NULL, n, err) ||
        cu_upload(&b[2], NULL, ns * 4, err))
        goto out;
    cu_act_quant_kernel<<<dim3(K / CU_BLOCK, M), CU_BLOCK>>>((const uint16_t *)b[0].p, K, pow2,
                                                             (uint8_t *)b[1].p, (float *)b[2].p);
    if (cu_check(cudaGetLastError(), "cu_act_quant launch", err) ||
        cu_check(cudaMemcpy(q, b[1].p, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H", err) ||
        cu_check(cudaMemcpy(scale, b[2].p, ns * 4, cudaMemcpyDeviceToHost), "cudaMemcpy D2H", err))
        goto out;
    rc = 0;
out:
    cu_free_all(b, 3);
    return rc;
}

extern "C" int cu_gemm_fp8(int M, int N, int K, const uint8_t *a, const float *a_scale,
                           const uint8_t *w, const float *w_scale, float *out, ep_err *err)
{
    if (cu_gemm_shape("cu_gemm_fp8", M, N, K, err))
        return -1;
    size_t kb = (size_t)K / CU_BLOCK;
    cu_buf b[5] = {{NULL}, {NULL}, {NULL}, {NULL}, {NULL}};
    int rc = -1;
    if (cu_upload(&b[0], a, (size_t)M * K, err) || cu_upload(&b[1], a_scale, M * kb * 4, err) ||
        cu_upload(&b[2], w, (size_t)N * K, err) ||
        cu_upload(&b[3], w_scale, (N / CU_BLOCK) * kb * 4, err) ||
        cu_upload(&b[4], NULL, (size_t)M * N * 4, err))
        goto out;
    if (cu_gemm_fp8_dev(M, N, K, (const uint8_t *)b[0].p, (const float *)b[1].p,
                        (const uint8_t *)b[2].p, (const float *)b[3].p, (float *)b[4].p, NULL,
                        err) ||
        cu_check(cudaMemcpy(out, b[4].p, (size_t)M * N * 4, cudaMemcpyDeviceToHost),
                 "cudaMemcpy D2H", err))
        goto out;
    rc = 0;
out:
    cu_free_all(b, 5);
    return rc;
}

extern "C" int cu_gemm_mxfp4(int M, int N, int K, const uint8_t *a, const float *a_scale,
                             const uint8_t *w_packed, const uint8_t *w_scale, float *out,
                             ep_err *err)
{
    if (cu_gemm_shape("cu_gemm_mxfp4", M, N, K, err))
        return -1;
    cu_buf b[5] = {{NULL}, {NULL}, {NULL}, {NULL}, {NULL}};
    int rc = -1;
    if (cu_upload(&b[0], a, (size_t)M * K, err) ||
        cu_upload(&b[1], a_scale, (size_t)M * (K / CU_BLOCK) * 4, err) ||
        cu_upload(&b[2], w_packed, (size_t)N * K / 2, err) ||
        cu_upload(&b[3], w_scale, (size_t)N * (K / CU_GROUP), err) ||
        cu_upload(&b[4], NULL, (size_t)M * N * 4, err))
        goto out;
    if (cu_gemm_mxfp4_dev(M, N, K, (const uint8_t *)b[0].p, (const float *)b[1].p,
                          (const uint8_t *)b[2].p, (const uint8_t *)b[3].p, (float *)b[4].p, NULL,
                          err) ||
        cu_check(cudaMemcpy(out, b[4].p, (size_t)M * N * 4, cudaMemcpyDeviceToHost),
                 "cudaMemcpy D2H", err))
        goto out;
    rc = 0;
out:
    cu_free_all(b, 5);
    return rc;
}
