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
 *   - SiLU's exp comes from a host-built table over all bf16 inputs (backend_cuda.c, mf_expf).
 */
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

#include "kernels/combine_order.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/cuda_tuning.h"

/* A cached cuBLASLt algorithm for one (m, n, k, output type). */
typedef struct lt_algo {
    int m, n, k, dtype;
    bool found;
    cublasLtMatmulAlgo_t algo;
} lt_algo;

#define LT_CACHE 128
#define LT_WS    (32u << 20)

struct cudev {
    int ordinal;
    cudaStream_t stream;
    /* cuBLASLt, for the fast path's FP8 GEMMs at many rows per expert (NULL: unavailable) */
    cublasLtHandle_t lt;
    void *lt_ws;
    float *sc_t; /* activation scales transposed per group, as cuBLASLt reads them */
    size_t sc_t_cap;
    uint16_t *tmp; /* bf16 rows before the out_row scatter */
    size_t tmp_cap;
    lt_algo cache[LT_CACHE];
    int n_cache;
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
    /* cuBLASLt is optional: without it the fast path runs its own kernels */
    if (cublasLtCreate(&d->lt) != CUBLAS_STATUS_SUCCESS) {
        d->lt = NULL;
    } else if (cudaMalloc(&d->lt_ws, LT_WS) != cudaSuccess) {
        cudaGetLastError();
        cublasLtDestroy(d->lt);
        d->lt = NULL;
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
        if (d->lt)
            cublasLtDestroy(d->lt);
        cudaFree(d->lt_ws);
        cudaFree(d->sc_t);
        cudaFree(d->tmp);
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
#pragma unroll 16
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
__global__ static void k_swiglu(int I, const float *acc1, const float *acc3, int ld,
                                const float *w_row, float limit, bool pow2, const float *exp_table,
                                float exp_neg_limit, uint8_t *hq, float *hqs)
{
    __shared__ float red[128];
    size_t at = (size_t)blockIdx.y * I + (size_t)blockIdx.x * 128 + threadIdx.x;
    size_t in = (size_t)blockIdx.y * ld + (size_t)blockIdx.x * 128 + threadIdx.x;
    float g = cuk_bf16_round(acc1[in]);
    float u = cuk_bf16_round(acc3[in]);
    bool clamped = g > limit;
    g = clamped ? limit : g;
    u = u < -limit ? -limit : u;
    u = u > limit ? limit : u;
    /* exp(-g): g is bf16 (or the limit), so the host's mf_expf table has it */
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

static int dev_swiglu(cudev *d, int M, int I, const float *acc1, const float *acc3, int ld,
                      const float *w_row, float limit, bool pow2, const float *exp_table,
                      float exp_neg_limit, uint8_t *hq, float *hqs, ep_err *err)
{
    if (M == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    k_swiglu<<<dim3((unsigned)(I / 128), (unsigned)M), 128, 0, d->stream>>>(
        I, acc1, acc3, ld ? ld : I, w_row, limit, pow2, exp_table, exp_neg_limit, hq, hqs);
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
 * channel; its first thread orders the token's k slots (k <= 64) for all. */
__global__ static void k_combine(int k, int H, const int32_t *topk, const uint16_t *eo,
                                 const uint16_t *shared, uint16_t *out)
{
    __shared__ int slot[64];
    __shared__ int n_sh;
    const int32_t *ids = topk + (size_t)blockIdx.x * k;
    if (threadIdx.x == 0)
        n_sh = co_slots(ids, k, 64, slot);
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

/* ---- grouped GEMMs ---------------------------------------------------------------------- */

/* Activation scales [M, K/128] (row-major) -> per group [K/128][rows] (cuBLASLt's 1x128 layout:
 * the rows of one 128-block together), at offset KB * row0. */
__global__ static void k_scale_t(const cudev_group *groups, int KB, const float *as, float *out)
{
    const cudev_group G = groups[blockIdx.x];
    size_t n = (size_t)G.rows * KB;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        size_t r = i % G.rows, kb = i / G.rows;
        out[(size_t)KB * G.row0 + kb * G.rows + r] = as[(G.row0 + r) * (size_t)KB + kb];
    }
}

/* dst[rows[m]] = src[m] for bf16 rows of N (m < M). */
__global__ static void k_rows_out(int N, int M, const uint32_t *rows, const uint16_t *src,
                                  uint16_t *dst)
{
    int m = blockIdx.x;
    if (m >= M)
        return;
    const uint4 *s4 = (const uint4 *)(src + (size_t)m * N);
    uint4 *d4 = (uint4 *)(dst + (size_t)rows[m] * N);
    for (int i = threadIdx.x; i < N / 8; i += blockDim.x)
        d4[i] = s4[i];
}

/* The cached algorithm for an FP8 (e4m3 x e4m3, 128x128 weight and 1x128 activation scales)
 * GEMM D[m, n] (col-major, leading dimension ldd) = W[m, k] . X[n, k]^T, or NULL when
 * cuBLASLt offers none. */
static const cublasLtMatmulAlgo_t *lt_find(cudev *d, cublasLtMatmulDesc_t op, int m, int n, int k,
                                           cudaDataType_t dt, int ldd)
{
    int key = (int)dt * 4 + (ldd != m);
    for (int i = 0; i < d->n_cache; i++) {
        lt_algo *c = &d->cache[i];
        if (c->m == m && c->n == n && c->k == k && c->dtype == key)
            return c->found ? &c->algo : NULL;
    }
    lt_algo *c = &d->cache[d->n_cache < LT_CACHE ? d->n_cache++ : LT_CACHE - 1];
    c->m = m, c->n = n, c->k = k, c->dtype = key, c->found = false;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = LT_WS;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(d->lt, op, la, lb, ld, ld, pref, 1, &h, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        c->found = true;
        c->algo = h.algo;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    return c->found ? &c->algo : NULL;
}

static int lt_grow(void **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    if (cudaMalloc(p, need) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *cap = need;
    return 0;
}

/* w1 and w3 of group G can run as one [2N, K] matrix: adjacent weights and scales, and the
 * outputs interleaved per row as [w1 | w3]. */
static bool lt_fused(const cudev_gemm *g, const cudev_group *G, int ld)
{
    size_t N = (size_t)g->N, K = (size_t)g->K;
    return g->n_mats == 2 && G->w[1] == G->w[0] + N * K &&
           G->scale[1] == (const float *)G->scale[0] + (N / 128) * (K / 128) &&
           g->out2_f32 == g->out_f32 + N && ld == 2 * g->N;
}

/* One group's call(s). */
static int lt_group(cudev *d, cublasLtMatmulDesc_t op, const cudev_gemm *g, const cudev_group *G,
                    int ld, ep_err *err)
{
    const int N = g->N, K = g->K, KB = K / 128;
    bool bf = g->out_bf16 != NULL, fused = lt_fused(g, G, ld);
    cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    int calls = g->n_mats == 2 && !fused ? 2 : 1, m = fused ? 2 * N : N;
    const float *bsc = d->sc_t + (size_t)KB * G->row0;
    const uint8_t *B = g->a + (size_t)G->row0 * K;
    float alpha = 1.0f, beta = 0.0f;
    for (int c = 0; c < calls; c++) {
        const float *asc = (const float *)G->scale[c];
        void *D = bf ? (void *)((g->out_row ? d->tmp : g->out_bf16) + (size_t)G->row0 * N)
                     : (void *)((c ? g->out2_f32 : g->out_f32) + (size_t)G->row0 * ld);
        int ldd = bf ? N : ld;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &asc, sizeof asc);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bsc, sizeof bsc);
        const cublasLtMatmulAlgo_t *al = lt_find(d, op, m, (int)G->rows, K, dt, ldd);
        cublasLtMatrixLayout_t la, lb, ldl;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, m, K);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, (int)G->rows, K);
        cublasLtMatrixLayoutCreate(&ldl, dt, m, (int)G->rows, ldd);
        cublasStatus_t st = cublasLtMatmul(d->lt, op, &alpha, G->w[c], la, B, lb, &beta, D, ldl, D,
                                           ldl, al, d->lt_ws, LT_WS, d->stream);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ldl);
        if (st != CUBLAS_STATUS_SUCCESS)
            return ep_err_set(err, "cublasLtMatmul: status %d", (int)st);
    }
    return 0;
}

/* Why cuBLASLt's block-scaled FP8 matmul cannot take this GEMM, or NULL. Its scale layouts
 * (cuBLAS docs, "scaling factors layouts"): the 128x128 weight scales are K-major with a column
 * stride of K/128 rounded up to 4 (the checkpoint's is K/128, so K/128 % 4 == 0), every scale
 * start is 16-byte aligned (the activation scales of a group start at KB * row0 floats) and the
 * GEMM's M and N are multiples of 4 (N is the group's rows). */
static const char *lt_unfit(const cudev *d, const cudev_gemm *g)
{
    if (!d->lt)
        return "no cuBLASLt handle";
    if ((g->K / 128) % 4 != 0)
        return "K/128 is not a multiple of 4";
    for (int i = 0; i < g->n_groups; i++)
        if (g->h_groups[i].rows % 4 != 0)
            return "a group's row count is not a multiple of 4";
    return NULL;
}

/* The fast path's FP8 grouped GEMM with cuBLASLt's block-scaled FP8 matmul (128x128 weight and
 * 1x128 activation scales: the checkpoint's own format), one call per group. Returns 1 when
 * cuBLASLt cannot do it (no handle, no algorithm for some shape, no scratch): the caller runs
 * its own kernel; -1 on an error. */
static int lt_gemm(cudev *d, const cudev_gemm *g, ep_err *err)
{
    /* Default: cuBLASLt where the groups average cublaslt_rows (96) rows or more.
     * Measured on an H200 at V4-Flash shapes (docs/performance.md): 5.6x our tensor-core
     * kernel at 512 rows per expert, 0.83x at 64 (a near-constant ~17 us per call); it was
     * checked against the CPU backend there (test_cuda_kernels, "require"). MB_LT_NEVER;
     * MB_LT_ALWAYS: wherever it fits; MB_LT_REQUIRE (tests): a shape it cannot take is an
     * error instead of a quiet fallback, so a test knows which path it checked. */
    mb_cublaslt want = cu_tune_lt(g->tune);
    bool require = want == MB_LT_REQUIRE;
    if (g->format != MB_W_FP8 || want == MB_LT_NEVER)
        return 1;
    if (want == MB_LT_AUTO && (int64_t)g->M < (int64_t)cu_tune_lt_rows(g->tune) * g->n_groups)
        return 1;
    const char *why = lt_unfit(d, g);
    if (why != NULL) {
        if (require)
            return ep_err_set(err, "cuBLASLt required but %s", why);
        return 1;
    }
    const int N = g->N, K = g->K, KB = K / 128, ld = g->ld_out ? g->ld_out : N;
    bool bf = g->out_bf16 != NULL;
    cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    if (lt_grow((void **)&d->sc_t, &d->sc_t_cap, (size_t)g->M * KB * 4) < 0 ||
        (bf && g->out_row && lt_grow((void **)&d->tmp, &d->tmp_cap, (size_t)g->M * N * 2) < 0))
        return require ? ep_err_set(err, "cuBLASLt required but its scratch cannot be allocated")
                       : 1;
    cublasLtMatmulDesc_t op;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        return require ? ep_err_set(err, "cuBLASLt required but cublasLtMatmulDescCreate failed")
                       : 1;
    cublasOperation_t T = CUBLAS_OP_T, Nn = CUBLAS_OP_N;
    cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    cublasLtMatmulMatrixScale_t mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &Nn, sizeof Nn);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
    /* every shape must have an algorithm before anything is launched; the heuristic looks at
     * the scale pointers too (none set: no algorithm for any shape, seen on an H200 with
     * cuBLAS 13), so each query sees its group's */
    int rc = 0;
    for (int i = 0; i < g->n_groups && rc == 0; i++) {
        const cudev_group *G = &g->h_groups[i];
        const void *asc = G->scale[0], *bsc = d->sc_t + (size_t)KB * G->row0;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &asc, sizeof asc);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bsc, sizeof bsc);
        int m = lt_fused(g, G, ld) ? 2 * N : N;
        if (!lt_find(d, op, m, (int)G->rows, K, dt, bf ? N : ld))
            rc = require ? ep_err_set(err,
                                      "cuBLASLt required but it has no algorithm for m=%d n=%d "
                                      "k=%d",
                                      m, (int)G->rows, K)
                         : 1;
    }
    if (rc == 0) {
        k_scale_t<<<g->n_groups, 256, 0, d->stream>>>(g->groups, KB, g->a_scale, d->sc_t);
        for (int i = 0; i < g->n_groups && rc == 0; i++)
            rc = lt_group(d, op, g, &g->h_groups[i], ld, err);
        if (rc == 0 && bf && g->out_row)
            k_rows_out<<<g->M, 128, 0, d->stream>>>(N, g->M, g->out_row, d->tmp, g->out_bf16);
    }
    cublasLtMatmulDescDestroy(op);
    return rc;
}

static int dev_gemm(cudev *d, const cudev_gemm *g, ep_err *err)
{
    if (g->M == 0 || g->n_groups == 0)
        return 0;
    if (dev_select(d, err) < 0)
        return -1;
    if (g->N % 128 || g->K % 128 || (g->n_mats != 1 && g->n_mats != 2))
        return ep_err_set(err, "grouped GEMM: N=%d K=%d mats=%d", g->N, g->K, g->n_mats);
    const char *what = "exact GEMM launch";
    if (g->mode == MB_GEMM_EXACT) {
        if (cu_tune_exact_ref(g->tune))
            cuk_gemm_exact_ref(g, d->stream);
        else
            cuk_gemm_exact(g, d->stream);
    } else if (g->max_rows <= cu_tune_fast_rows(g->tune)) {
        /* a few rows per expert: streaming the weights is all that matters; MXFP4 runs the
         * exact kernel (memory-bound already), FP8 its fp32-summing twin */
        what = "few-row GEMM launch";
        cuk_gemm_rows(g, g->format == MB_W_MXFP4, d->stream);
    } else {
        what = "tensor-core GEMM launch";
        int rc = lt_gemm(d, g, err);
        if (rc < 0)
            return -1;
        if (rc > 0)
            cuk_gemm_fast(g, d->stream);
    }
    return dev_launched(what, err);
}

static const cudev_ops CUDA_OPS = {
    dev_open,      dev_close,   dev_mem_info, dev_alloc,   dev_free,    dev_alloc_host,
    dev_free_host, dev_h2d,     dev_d2h,      dev_d2d,     dev_memset0, dev_query,
    dev_stream,    dev_rmsnorm, dev_logits,   dev_quant,   dev_gather,  dev_e8m0_to_f32,
    dev_gemm,      dev_swiglu,  dev_combine,  dev_scatter,
};

static int rt_set_device(int ordinal, ep_err *err)
{
    return dev_check(cudaSetDevice(ordinal), "cudaSetDevice", err);
}

static int rt_stream_query(void *stream, ep_err *err)
{
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    if (e == cudaErrorNotReady)
        return 1;
    return dev_check(e, "cudaStreamQuery", err);
}

static const cudev_rt CUDA_RT = {rt_set_device, rt_stream_query};

static const cudev_module CUDA_MODULE = {
    sizeof(cudev_module), sizeof(cudev_ops), sizeof(cudev_rt), &CUDA_OPS, &CUDA_RT,
};

/* The module's one exported symbol (CUDEV_MODULE_ENTRY; everything else is hidden). */
extern "C" __attribute__((visibility("default"))) const cudev_module *epmoe_cudev_module(void)
{
    return &CUDA_MODULE;
}
