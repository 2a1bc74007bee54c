/*
 * cuda_dev.cu — the device half of the CUDA backend (cuda_dev.h): CUDA runtime calls and the
 * kernels, exact ones first. Built for sm_90 (+ PTX) with --fmad=false, so every multiply and
 * add below rounds where it is written; the _rn intrinsics make that explicit where it matters.
 *
 * Bit-exactness with the CPU backend (docs/numerics.md) rests on:
 *   - fp32/double add, multiply, divide and sqrt are IEEE round-to-nearest-even on the device;
 *   - the sequential sums of the reference (RMSNorm's sum of squares, the gate logits) run in
 *     the same order in one thread each;
 *   - GEMM block sums are exact (integers for MXFP4, doubles for FP8 — every partial sum of a
 *     block is representable, spec §5.8), so their order is free, and the per-block fp32
 *     chain runs in block order in one thread per output;
 *   - __nv_cvt_float_to_fp8(.., __NV_SATFINITE, __NV_E4M3) is the encoder fmt_f32_to_e4m3 was
 *     proven equal to over all 2^32 inputs (test_formats_cuda);
 *   - SiLU's expf comes from a host-built table over all bf16 inputs (backend_cuda.c).
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_kernels.cuh"

struct cudev {
    int ordinal;
    cudaStream_t stream;
};

static int dev_check(cudaError_t e, const char *what, ep_err *err)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError(); /* clear a non-sticky error */
    return ep_err_set(err, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The runtime's current device is per host thread, and the executor thread is not the one that
 * opened the device: select it before every call (a no-op when already current). */
static int dev_select(cudev *d, ep_err *err)
{
    static __thread int current = -1;
    if (current == d->ordinal)
        return 0;
    if (dev_check(cudaSetDevice(d->ordinal), "cudaSetDevice", err) < 0)
        return -1;
    current = d->ordinal;
    return 0;
}

static int dev_launched(const char *what, ep_err *err)
{
    return dev_check(cudaGetLastError(), what, err);
}

/* ---- context and memory ------------------------------------------------------------------ */

static int dev_open(int ordinal, cudev **out, mb_device_info *info, ep_err *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ep_err_set(err, "no usable CUDA device (%s: %s)", cudaGetErrorName(e),
                          cudaGetErrorString(e));
    }
    if (ordinal >= n)
        return ep_err_set(err, "no such CUDA device: this host has %d", n);
    cudaDeviceProp p;
    if (dev_check(cudaSetDevice(ordinal), "cudaSetDevice", err) < 0 ||
        dev_check(cudaGetDeviceProperties(&p, ordinal), "cudaGetDeviceProperties", err) < 0)
        return -1;
    if (p.major < 9)
        return ep_err_set(err, "%s is sm_%d%d; epmoe's kernels need sm_90 (Hopper) or newer",
                          p.name, p.major, p.minor);
    cudev *d = (cudev *)calloc(1, sizeof *d);
    if (!d)
        return ep_err_set(err, "out of memory");
    d->ordinal = ordinal;
    if (dev_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "cudaStreamCreate",
                  err) < 0) {
        free(d);
        return -1;
    }
    snprintf(info->name, sizeof info->name, "%.127s", p.name);
    info->sm_major = p.major;
    info->sm_minor = p.minor;
    info->mem_total = p.totalGlobalMem;
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess)
        info->mem_free = f;
    cudaGetLastError();
    *out = d;
    return 0;
}

static void dev_close(cudev *d)
{
    if (!d)
        return;
    if (dev_select(d, NULL) == 0) {
        cudaStreamSynchronize(d->stream);
        cudaStreamDestroy(d->stream);
    }
    cudaGetLastError();
    free(d);
}

static int dev_mem_info(cudev *d, uint64_t *free_b, uint64_t *total_b, ep_err *err)
{
    size_t f = 0, t = 0;
    if (dev_select(d, err) < 0 || dev_check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo", err) < 0)
        return -1;
    *free_b = f;
    *total_b = t;
    return 0;
}

static int dev_alloc(cudev *d, void **p, size_t bytes, ep_err *err)
{
    *p = NULL;
    if (dev_select(d, err) < 0)
        return -1;
    if (dev_check(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc", err) < 0)
        return ep_err_prefix(err, "%zu bytes", bytes);
    return 0;
}

static void dev_free(cudev *d, void *p)
{
    if (p && dev_select(d, NULL) == 0)
        cudaFree(p);
    cudaGetLastError();
}

static int dev_alloc_host(cudev *d, void **p, size_t bytes, ep_err *err)
{
    *p = NULL;
    if (dev_select(d, err) < 0)
        return -1;
    if (dev_check(cudaMallocHost(p, bytes ? bytes : 1), "cudaMallocHost", err) < 0)
        return ep_err_prefix(err, "%zu pinned bytes", bytes);
    return 0;
}

static void dev_free_host(cudev *d, void *p)
{
    if (p)
        cudaFreeHost(p);
    cudaGetLastError();
}

static int dev_copy(cudev *d, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                    const char *what, ep_err *err)
{
    if (bytes == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    return dev_check(cudaMemcpyAsync(dst, src, bytes, kind, d->stream), what, err);
}

static int dev_h2d(cudev *d, void *dst, const void *src, size_t bytes, ep_err *err)
{
    return dev_copy(d, dst, src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync H2D", err);
}

static int dev_d2h(cudev *d, void *dst, const void *src, size_t bytes, ep_err *err)
{
    return dev_copy(d, dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync D2H", err);
}

static int dev_d2d(cudev *d, void *dst, const void *src, size_t bytes, ep_err *err)
{
    return dev_copy(d, dst, src, bytes, cudaMemcpyDeviceToDevice, "cudaMemcpyAsync D2D", err);
}

static int dev_memset0(cudev *d, void *dst, size_t bytes, ep_err *err)
{
    if (bytes == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    return dev_check(cudaMemsetAsync(dst, 0, bytes, d->stream), "cudaMemsetAsync", err);
}

static int dev_query(cudev *d, ep_err *err)
{
    if (dev_select(d, err) < 0)
        return -1;
    cudaError_t e = cudaStreamQuery(d->stream);
    if (e == cudaSuccess)
        return 0;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return 1;
    }
    return dev_check(e, "the device stream", err);
}

static void *dev_stream(cudev *d)
{
    return (void *)d->stream;
}

/* ---- router ------------------------------------------------------------------------------ */

/* One block per token: thread 0 runs the reference's sequential sum of squares (its order is
 * the definition), then every thread writes its share of the row. */
__global__ static void k_rmsnorm(int H, const uint16_t *x, const uint16_t *gain, float eps,
                                 uint16_t *xn)
{
    __shared__ float r_sh;
    const uint16_t *xr = x + (size_t)blockIdx.x * H;
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int k = 0; k < H; k++) {
            double v = (double)cuk_bf16_to_f32(xr[k]);
            sum = __dadd_rn(sum, __dmul_rn(v, v));
        }
        float ms = __double2float_rn(__ddiv_rn(sum, (double)H));
        r_sh = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    }
    __syncthreads();
    float r = r_sh;
    uint16_t *yr = xn + (size_t)blockIdx.x * H;
    for (int k = threadIdx.x; k < H; k += blockDim.x)
        yr[k] = cuk_f32_to_bf16(
            __fmul_rn(cuk_bf16_to_f32(gain[k]), __fmul_rn(cuk_bf16_to_f32(xr[k]), r)));
}

static int dev_rmsnorm(cudev *d, int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                       uint16_t *xn, ep_err *err)
{
    if (T == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_rmsnorm<<<T, 128, 0, d->stream>>>(H, x, gain, eps, xn);
    return dev_launched("rmsnorm launch", err);
}

/* One thread per (token, expert): the reference's ascending double sum over k. The token's row
 * is staged in shared memory; the gate is [H, E], so a warp reads 32 experts of one k at once.
 * A product of two bf16 values is exact in double, so the fused form rounds as the separate
 * multiply and add do. */
__global__ static void k_logits(int H, int E, const uint16_t *xn, const uint16_t *gate_t,
                                float *logits)
{
    extern __shared__ uint16_t xrow[];
    const uint16_t *xr = xn + (size_t)blockIdx.y * H;
    for (int k = threadIdx.x; k < H; k += blockDim.x)
        xrow[k] = xr[k];
    __syncthreads();
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E)
        return;
    double acc = 0.0;
    const uint16_t *g = gate_t + e;
#pragma unroll 8
    for (int k = 0; k < H; k++)
        acc = __fma_rn((double)cuk_bf16_to_f32(xrow[k]), (double)cuk_bf16_to_f32(g[(size_t)k * E]),
                       acc);
    logits[(size_t)blockIdx.y * E + e] = __double2float_rn(acc);
}

static int dev_logits(cudev *d, int T, int H, int E, const uint16_t *xn, const uint16_t *gate_t,
                      float *logits, ep_err *err)
{
    if (T == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    dim3 grid((unsigned)((E + 127) / 128), (unsigned)T);
    k_logits<<<grid, 128, (size_t)H * 2, d->stream>>>(H, E, xn, gate_t, logits);
    return dev_launched("logits launch", err);
}

/* ---- quantizer, SwiGLU ------------------------------------------------------------------- */

/* One block of 128 threads per (row, 128-channel block): qt_act_rows. */
__global__ static void k_quant(int K, bool pow2, const uint16_t *x, uint8_t *q, float *qs)
{
    __shared__ float red[128];
    size_t at = (size_t)blockIdx.y * K + (size_t)blockIdx.x * 128 + threadIdx.x;
    float v = cuk_bf16_to_f32(x[at]);
    float s = cuk_block_scale(v, pow2, red);
    q[at] = cuk_f32_to_e4m3(__fdiv_rn(v, s));
    if (threadIdx.x == 0)
        qs[(size_t)blockIdx.y * (K / 128) + blockIdx.x] = s;
}

static int dev_quant(cudev *d, int M, int K, bool pow2, const uint16_t *x, uint8_t *q, float *qs,
                     ep_err *err)
{
    if (M == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_quant<<<dim3((unsigned)(K / 128), (unsigned)M), 128, 0, d->stream>>>(K, pow2, x, q, qs);
    return dev_launched("quantizer launch", err);
}

/* One block of 128 threads per (row, 128-block of I): swiglu_rows' reference, one element per
 * thread, then the block quantized as qt_act_rows_f32 does. */
__global__ static void k_swiglu(int I, const float *acc1, const float *acc3, const float *w_row,
                                float limit, bool pow2, const float *exp_table, float exp_neg_limit,
                                uint8_t *hq, float *hqs)
{
    __shared__ float red[128];
    size_t at = (size_t)blockIdx.y * I + (size_t)blockIdx.x * 128 + threadIdx.x;
    float g = cuk_bf16_round(acc1[at]);
    float u = cuk_bf16_round(acc3[at]);
    bool clamped = g > limit;
    g = clamped ? limit : g;
    u = u < -limit ? -limit : u;
    u = u > limit ? limit : u;
    /* expf(-g): g is bf16 (or the limit), so the host's table has it */
    float e = clamped ? exp_neg_limit : exp_table[cuk_f32_to_bf16(g)];
    float silu = __fdiv_rn(g, __fadd_rn(1.0f, e));
    float hv = __fmul_rn(silu, u);
    hv = __fmul_rn(w_row ? w_row[blockIdx.y] : 1.0f, hv);
    float h = cuk_bf16_round(hv);
    float s = cuk_block_scale(h, pow2, red);
    hq[at] = cuk_f32_to_e4m3(__fdiv_rn(h, s));
    if (threadIdx.x == 0)
        hqs[(size_t)blockIdx.y * (I / 128) + blockIdx.x] = s;
}

static int dev_swiglu(cudev *d, int M, int I, const float *acc1, const float *acc3,
                      const float *w_row, float limit, bool pow2, const float *exp_table,
                      float exp_neg_limit, uint8_t *hq, float *hqs, ep_err *err)
{
    if (M == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_swiglu<<<dim3((unsigned)(I / 128), (unsigned)M), 128, 0, d->stream>>>(
        I, acc1, acc3, w_row, limit, pow2, exp_table, exp_neg_limit, hq, hqs);
    return dev_launched("SwiGLU launch", err);
}

/* ---- data movement ----------------------------------------------------------------------- */

/* One block per row: codes (16 bytes per thread-step) and the row's scales. */
__global__ static void k_gather(int H, const uint32_t *rows, const uint8_t *q, const float *qs,
                                uint8_t *q_out, void *qs_out, bool e8m0)
{
    size_t src = rows[blockIdx.x], dst = blockIdx.x;
    const uint4 *s4 = (const uint4 *)(q + src * H);
    uint4 *d4 = (uint4 *)(q_out + dst * H);
    for (int i = threadIdx.x; i < H / 16; i += blockDim.x)
        d4[i] = s4[i];
    int SC = H / 128;
    for (int b = threadIdx.x; b < SC; b += blockDim.x) {
        float s = qs[src * SC + b];
        if (e8m0)
            ((uint8_t *)qs_out)[dst * SC + b] = cuk_e8m0_ceil(s);
        else
            ((float *)qs_out)[dst * SC + b] = s;
    }
}

static int dev_gather(cudev *d, int H, int n, const uint32_t *rows, const uint8_t *q,
                      const float *qs, uint8_t *q_out, void *qs_out, bool e8m0, ep_err *err)
{
    if (n == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_gather<<<n, 128, 0, d->stream>>>(H, rows, q, qs, q_out, qs_out, e8m0);
    return dev_launched("gather launch", err);
}

__global__ static void k_e8m0_to_f32(size_t n, const uint8_t *in, float *out)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = cuk_e8m0_to_f32(in[i]);
}

static int dev_e8m0_to_f32(cudev *d, size_t n, const uint8_t *in, float *out, ep_err *err)
{
    if (n == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_e8m0_to_f32<<<(unsigned)((n + 255) / 256), 256, 0, d->stream>>>(n, in, out);
    return dev_launched("scale decode launch", err);
}

__global__ static void k_scatter(int H, const uint32_t *rows, const uint16_t *src, uint16_t *dst)
{
    const uint4 *s4 = (const uint4 *)(src + (size_t)blockIdx.x * H);
    uint4 *d4 = (uint4 *)(dst + (size_t)rows[blockIdx.x] * H);
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x)
        d4[i] = s4[i];
}

static int dev_scatter(cudev *d, int H, int n, const uint32_t *rows, const uint16_t *src,
                       uint16_t *dst, ep_err *err)
{
    if (n == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_scatter<<<n, 128, 0, d->stream>>>(H, rows, src, dst);
    return dev_launched("scatter launch", err);
}

/* ---- combine ----------------------------------------------------------------------------- */

/* moe_combine: per token, slots in ascending expert id (equal ids in slot order, -1 skipped),
 * fp32 sum from +0, then + shared, one bf16 rounding. One block per token, a thread per
 * channel; every thread sorts the token's k slots itself (k <= 64, a few compares). */
__global__ static void k_combine(int k, int H, const int32_t *topk, const uint16_t *eo,
                                 const uint16_t *shared, uint16_t *out)
{
    __shared__ int slot[64];
    __shared__ int n_sh;
    const int32_t *ids = topk + (size_t)blockIdx.x * k;
    if (threadIdx.x == 0) {
        int n = 0;
        for (int j = 0; j < k && j < 64; j++) {
            if (ids[j] < 0)
                continue;
            int pos = n++;
            while (pos > 0 && ids[slot[pos - 1]] > ids[j]) {
                slot[pos] = slot[pos - 1];
                pos--;
            }
            slot[pos] = j;
        }
        n_sh = n;
    }
    __syncthreads();
    int n = n_sh;
    size_t t = blockIdx.x;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float y = 0.0f;
        for (int i = 0; i < n; i++)
            y = __fadd_rn(y, cuk_bf16_to_f32(eo[(t * k + slot[i]) * H + h]));
        out[t * H + h] = cuk_f32_to_bf16(__fadd_rn(y, cuk_bf16_to_f32(shared[t * H + h])));
    }
}

static int dev_combine(cudev *d, int T, int k, int H, const int32_t *topk_ids, const uint16_t *eo,
                       const uint16_t *shared, uint16_t *out, ep_err *err)
{
    if (T == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_combine<<<T, 256, 0, d->stream>>>(k, H, topk_ids, eo, shared, out);
    return dev_launched("combine launch", err);
}

/* ---- grouped GEMMs ----------------------------------------------------------------------- */

static int dev_gemm(cudev *d, const cudev_gemm *g, ep_err *err)
{
    if (g->M == 0 || g->n_groups == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    if (g->N % 128 || g->K % 128 || (g->n_mats != 1 && g->n_mats != 2))
        return ep_err_set(err, "grouped GEMM: N=%d K=%d mats=%d", g->N, g->K, g->n_mats);
    int rc = g->mode == MB_GEMM_FAST ? cuk_gemm_fast(g, d->stream) : cuk_gemm_exact(g, d->stream);
    (void)rc;
    return dev_launched(g->mode == MB_GEMM_FAST ? "tensor-core GEMM launch" : "exact GEMM launch",
                        err);
}

static const cudev_ops CUDA_OPS = {
    dev_open,      dev_close,   dev_mem_info, dev_alloc,   dev_free,    dev_alloc_host,
    dev_free_host, dev_h2d,     dev_d2h,      dev_d2d,     dev_memset0, dev_query,
    dev_stream,    dev_rmsnorm, dev_logits,   dev_quant,   dev_gather,  dev_e8m0_to_f32,
    dev_gemm,      dev_swiglu,  dev_combine,  dev_scatter,
};

extern "C" const cudev_ops *cudev_cuda_ops(void)
{
    return &CUDA_OPS;
}
