/*
 * gemm_exact.cu — the grouped expert GEMMs that give the CPU backend's bits (kernels/gemm.h's
 * canonical definition, the same as kernels/cpu/gemm_ref.c), and their fp32-accumulating twin
 * for FP8 weights that the fast path uses at a few rows per expert.
 *
 * Threads own weight rows: each of a row's `split` threads streams a contiguous share of the
 * row once per pass of up to RX_MB activation rows (wide loads, the next step in flight while
 * the current one computes) and turns every block of it into the block's finished term
 *   MXFP4: v = (fp32(P) * a_scale) * 2^(ws-127)      FP8: v = fp32(P) * (a_scale * w_scale)
 * — per-block work, so its order is free. The definition's only sequential part, acc = acc + v
 * over blocks in increasing k, runs in one thread per (row, activation) in block order: inline
 * when a row has one thread, else over the terms its threads left in shared memory. Rows of
 * one thread keep the grid big enough at many experts; split rows keep it busy at a few.
 * Activations of the pass sit in shared memory in a decoded form every thread of a block
 * reads at the same address (a broadcast).
 *
 *   MXFP4: a block sum is sum_k a_k w_k with a_k = e4m3 x 2^9 (an integer below 2^18) and w_k =
 *          e2m1 x 2 (an integer, |w| <= 12): three dp4a chains over 6-bit digits of a
 *          (gemm_rows_math.h, whose arithmetic tests/unit/test_cuda_math.c proves on the host)
 *          give P exactly in int32 (|P| < 2^27); P * 2^-10 rounded once to fp32 is the
 *          reference's P.
 *   FP8:   products of two e4m3 values are exact in fp32 (8 significant bits) and every
 *          partial sum of a 128-block is an integer multiple of 2^-18 below 2^43, exact in
 *          double: the sum is exact in any order, rounded once to fp32 at the block's end.
 *          The fast twin sums in fp32 (inexact; spec §7's tolerance).
 * A NaN activation or weight code makes the block's P NaN, as in the reference.
 */
#include <cuda_fp16.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/cuda_tuning.h"
#include "kernels/cuda/gemm_rows_math.h"

#define RX_THREADS 128 /* threads per block */
#define RX_MB      4   /* activation rows per pass */

__device__ __forceinline__ bool rx_nan_word(uint32_t w)
{
    uint32_t t = (w & 0x7F7F7F7Fu) ^ 0x7F7F7F7Fu; /* a 0x7F or 0xFF byte becomes 0 */
    return ((t - 0x01010101u) & ~t & 0x80808080u) != 0;
}

/* The geometry of one launch: rows per block, threads per row, blocks per thread. */
typedef struct rx_geo {
    int split;  /* threads per weight row: 1, 4 or 16 */
    int rows;   /* weight rows per block: RX_THREADS / split */
    int nb;     /* blocks (of 32 or 128 k) per row */
    int nb_per; /* blocks per thread: nb / split */
} rx_geo;

/* The terms of a split row go to shared memory, slot (m, block, row): a warp's threads are 32
 * rows of one part (rloc = tid % rows), so they store one block's terms to 32 banks and read
 * the same activation block (a broadcast). Rows-major slots with the parts interleaved in a
 * warp made every store a 32-way bank conflict and every activation load 4-way: the MXFP4 decode
 * ran at 0.13 of the copy bandwidth (H200, bench_cuda decode-parts). */
__device__ __forceinline__ float *rx_slot(float *terms, const rx_geo &g, int rloc, int m, int c)
{
    return terms + ((size_t)m * g.nb + c) * g.rows + rloc;
}

/* The sequential chain of a split row: its first thread adds the terms in block order. */
__device__ __forceinline__ float rx_chain(float *terms, const rx_geo &g, int rloc, int m)
{
    const float *t = rx_slot(terms, g, rloc, m, 0);
    float s = 0.0f;
    for (int c = 0; c < g.nb; c++)
        s = __fadd_rn(s, t[(size_t)c * g.rows]);
    return s;
}

__device__ __forceinline__ void rx_store(const cudev_group &G, int m0, int m, int N, int n, int ld,
                                         float acc, float *out, uint16_t *obf, const uint32_t *orow)
{
    size_t row = G.row0 + (uint32_t)(m0 + m);
    if (obf)
        obf[(size_t)(orow ? orow[row] : row) * N + n] = cuk_f32_to_bf16(acc);
    else
        out[row * ld + n] = acc;
}

/* A block's finished term t of activation m: summed into acc[m] when the thread owns its
 * row, else left in the row's slot (acc stays in registers: every index is compile-time). */
#define RX_TERM(m, c, t)                                                                           \
    do {                                                                                           \
        if (split == 1)                                                                            \
            acc[m] = __fadd_rn(acc[m], (t));                                                       \
        else                                                                                       \
            *rx_slot(terms, g, rloc, (m), (c)) = (t);                                              \
    } while (0)

/* The end of a pass: the split rows' chains, then the outputs. */
#define RX_FINISH()                                                                                \
    do {                                                                                           \
        if (split > 1)                                                                             \
            __syncthreads();                                                                       \
        if (part == 0 && n < N) {                                                                  \
            _Pragma("unroll") for (int m = 0; m < RX_MB; m++)                                      \
            {                                                                                      \
                if (m >= mb)                                                                       \
                    break;                                                                         \
                float r = split > 1 ? rx_chain(terms, g, rloc, m) : acc[m];                        \
                rx_store(G, m0, m, N, n, ld, r, out, obf, orow);                                   \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* ---- MXFP4 ---- */

/* Shared memory of one pass, per activation row: the digits of every 4 k as three int8x4
 * words, grouped by 32-block (24 words = 96 bytes per block: 6 broadcast 16-byte loads), the
 * block's NaN flag, and the row's activation scales; then the split rows' terms. */
static size_t rx_fp4_row_bytes(int K)
{
    return (size_t)K / 32 * 96 + (size_t)K / 32 + (size_t)K / 128 * 4;
}

__global__ __launch_bounds__(RX_THREADS) static void k_rows_fp4(
    const cudev_group *groups, int N, int K, const uint8_t *a, const float *as, float *out1,
    float *out2, uint16_t *obf, const uint32_t *orow, int mb_max, int ld, int split)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const cudev_group G = groups[blockIdx.y];
    const uint8_t *W = blockIdx.z ? G.w[1] : G.w[0];
    const uint8_t *S = (const uint8_t *)(blockIdx.z ? G.scale[1] : G.scale[0]);
    float *out = blockIdx.z ? out2 : out1;
    const int nblk = K / 32, SC = K / 128, tid = threadIdx.x;
    const rx_geo g = {split, RX_THREADS / split, nblk, nblk / split};
    const int rloc = tid % g.rows, part = tid / g.rows;
    const int n = blockIdx.x * g.rows + rloc;
    uint4 *dig = (uint4 *)smem;                           /* [mb][nblk][6] */
    uint8_t *nanf = smem + (size_t)mb_max * nblk * 96;    /* [mb][nblk] */
    float *asc = (float *)(nanf + (size_t)mb_max * nblk); /* [mb][SC] */
    float *terms = asc + (size_t)mb_max * SC;             /* [mb][nblk][rows] when split */
    const int cb = part * g.nb_per, ce = cb + g.nb_per;
    const uint8_t *wrow = W + (size_t)n * (K / 2);
    const uint8_t *srow = S + (size_t)n * nblk;
    for (int m0 = 0; m0 < (int)G.rows; m0 += mb_max) {
        int mb = (int)G.rows - m0 < mb_max ? (int)G.rows - m0 : mb_max;
        __syncthreads(); /* the previous pass is done with the shared rows */
        /* decode the pass's activations: one 4-k group per thread-step */
        for (int i = tid; i < mb * (K / 4); i += RX_THREADS) {
            int m = i / (K / 4), q = i % (K / 4);
            uint32_t w = *(const uint32_t *)(a + (size_t)(G.row0 + m0 + m) * K + (size_t)q * 4);
            uint32_t d[3];
            rxm_digits4(w, d);
            /* group q of block q/8: words (q%8)*3 .. +2 of the block's 24 */
            uint32_t *blk = (uint32_t *)(dig + ((size_t)m * nblk + q / 8) * 6);
            blk[(q % 8) * 3 + 0] = d[0];
            blk[(q % 8) * 3 + 1] = d[1];
            blk[(q % 8) * 3 + 2] = d[2];
        }
        for (int i = tid; i < mb * nblk; i += RX_THREADS) {
            int m = i / nblk, c = i % nblk;
            const uint32_t *p =
                (const uint32_t *)(a + (size_t)(G.row0 + m0 + m) * K + (size_t)c * 32);
            bool nan = false;
#pragma unroll
            for (int j = 0; j < 8; j++)
                nan |= rx_nan_word(p[j]);
            nanf[i] = nan;
        }
        for (int i = tid; i < mb * SC; i += RX_THREADS)
            asc[i] = as[(size_t)(G.row0 + m0 + i / SC) * SC + i % SC];
        __syncthreads();
        float acc[RX_MB];
#pragma unroll
        for (int m = 0; m < RX_MB; m++)
            acc[m] = 0.0f;
        if (n < N) {
            /* four blocks (64 weight bytes, 4 scale bytes) per step; the next step's are in
             * flight while this one is computed */
            const uint4 *wq = (const uint4 *)wrow;
            uint4 nxt[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                nxt[j] = wq[cb + j];
            uint32_t snx = *(const uint32_t *)(srow + cb);
            for (int c0 = cb; c0 < ce; c0 += 4) {
                uint4 cur[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    cur[j] = nxt[j];
                uint32_t sc4 = snx;
                if (c0 + 4 < ce) {
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        nxt[j] = wq[c0 + 4 + j];
                    snx = *(const uint32_t *)(srow + c0 + 4);
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = c0 + j;
                    uint32_t wx[4] = {cur[j].x, cur[j].y, cur[j].z, cur[j].w};
                    uint32_t w8[8];
                    rxm_fp4_decode(wx, w8);
                    float ws = cuk_e8m0_to_f32((uint8_t)(sc4 >> (8 * j)));
#pragma unroll
                    for (int m = 0; m < RX_MB; m++) {
                        if (m >= mb)
                            break;
                        const uint4 *dg = dig + ((size_t)m * nblk + c) * 6;
                        uint4 v[6];
#pragma unroll
                        for (int i = 0; i < 6; i++)
                            v[i] = dg[i];
                        int P = rxm_fp4_dot((const uint32_t *)v, w8);
                        float p = nanf[m * nblk + c] ? __uint_as_float(CUK_QNAN)
                                                     : __fmul_rn(__int2float_rn(P), 0x1p-10f);
                        float t = __fmul_rn(__fmul_rn(p, asc[m * SC + c / 4]), ws);
                        RX_TERM(m, c, t);
                    }
                }
            }
        }
        RX_FINISH();
    }
}

/* ---- FP8 ---- */

/* Per activation row: its K values as fp32 (exact e4m3 decodes) and its activation scales. */
static size_t rx_fp8_row_bytes(int K)
{
    return (size_t)K * 4 + (size_t)K / 128 * 4;
}

__device__ __forceinline__ float2 rx_e4m3x2(uint32_t two)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return __half22float2(*(__half2 *)&h);
}

/* EXACT: block sums in double (exact); else in fp32 (the fast path's few-row GEMM). */
template <bool EXACT>
__global__ __launch_bounds__(RX_THREADS) static void k_rows_fp8(
    const cudev_group *groups, int N, int K, const uint8_t *a, const float *as, float *out1,
    float *out2, uint16_t *obf, const uint32_t *orow, int mb_max, int ld, int split)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const cudev_group G = groups[blockIdx.y];
    const uint8_t *W = blockIdx.z ? G.w[1] : G.w[0];
    const float *S = (const float *)(blockIdx.z ? G.scale[1] : G.scale[0]);
    float *out = blockIdx.z ? out2 : out1;
    const int KB = K / 128, tid = threadIdx.x;
    const rx_geo g = {split, RX_THREADS / split, KB, KB / split};
    const int rloc = tid % g.rows, part = tid / g.rows;
    const int n = blockIdx.x * g.rows + rloc;
    float *av = (float *)smem;                /* [mb][K] */
    float *asc = av + (size_t)mb_max * K;     /* [mb][KB] */
    float *terms = asc + (size_t)mb_max * KB; /* [mb][KB][rows] when split */
    const int cb = part * g.nb_per, ce = cb + g.nb_per;
    const uint8_t *wrow = W + (size_t)n * K;
    const float *srow = S + (size_t)(n / 128) * KB;
    for (int m0 = 0; m0 < (int)G.rows; m0 += mb_max) {
        int mb = (int)G.rows - m0 < mb_max ? (int)G.rows - m0 : mb_max;
        __syncthreads();
        for (int i = tid; i < mb * (K / 2); i += RX_THREADS) {
            int m = i / (K / 2), q = i % (K / 2);
            uint32_t two = *(const uint16_t *)(a + (size_t)(G.row0 + m0 + m) * K + (size_t)q * 2);
            float2 f = rx_e4m3x2(two);
            av[(size_t)m * K + 2 * q] = f.x;
            av[(size_t)m * K + 2 * q + 1] = f.y;
        }
        for (int i = tid; i < mb * KB; i += RX_THREADS)
            asc[i] = as[(size_t)(G.row0 + m0 + i / KB) * KB + i % KB];
        __syncthreads();
        float acc[RX_MB];
#pragma unroll
        for (int m = 0; m < RX_MB; m++)
            acc[m] = 0.0f;
        if (n < N) {
            /* one 128-block (128 weight bytes) per step; the next step's are in flight while
             * this one is computed */
            const uint4 *wq = (const uint4 *)wrow;
            uint4 nxt[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                nxt[j] = wq[(size_t)cb * 8 + j];
            for (int kb = cb; kb < ce; kb++) {
                double pd[RX_MB];
                float pf[RX_MB];
#pragma unroll
                for (int m = 0; m < RX_MB; m++)
                    pd[m] = 0.0, pf[m] = 0.0f;
                uint4 cur[8];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    cur[j] = nxt[j];
                if (kb + 1 < ce) {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        nxt[j] = wq[(size_t)(kb + 1) * 8 + j];
                }
#pragma unroll
                for (int s = 0; s < 8; s++) { /* 8 x 16 weights */
                    uint32_t wx[4] = {cur[s].x, cur[s].y, cur[s].z, cur[s].w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        float2 w01 = rx_e4m3x2(wx[j] & 0xFFFF), w23 = rx_e4m3x2(wx[j] >> 16);
                        float wf[4] = {w01.x, w01.y, w23.x, w23.y};
                        int k0 = kb * 128 + s * 16 + j * 4;
#pragma unroll
                        for (int m = 0; m < RX_MB; m++) {
                            if (m >= mb)
                                break;
                            const float4 x = *(const float4 *)(av + (size_t)m * K + k0);
                            float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                            for (int b = 0; b < 4; b++) {
                                if (EXACT) /* the product is exact in fp32, the sum in double */
                                    pd[m] = __dadd_rn(pd[m], (double)__fmul_rn(xs[b], wf[b]));
                                else
                                    pf[m] = __fmaf_rn(xs[b], wf[b], pf[m]);
                            }
                        }
                    }
                }
                float ws = srow[kb];
#pragma unroll
                for (int m = 0; m < RX_MB; m++) {
                    if (m >= mb)
                        break;
                    float p = EXACT ? __double2float_rn(pd[m]) : pf[m];
                    float sig = __fmul_rn(asc[m * KB + kb], ws);
                    RX_TERM(m, kb, __fmul_rn(p, sig));
                }
            }
        }
        RX_FINISH();
    }
}

/* ---- launchers ---- */

/* Shared memory per block beyond the default 48 KB needs an opt-in per kernel. */
static void rx_optin(const void *fn, size_t bytes)
{
    if (bytes > 48 * 1024)
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* Split rows 4 ways when one thread per row would leave most of the GPU idle (a few experts of
 * a few rows: decode) and the blocks divide evenly (per thread a multiple of `step` blocks, the
 * prefetch step). tune->split = 16 (EPMOE_CUDA_SPLIT: benches and tests, until a device run has
 * measured it) allows 16 ways where the blocks divide: four times the loads in flight for a small
 * grid. */
static int rx_split(const cudev_gemm *g, int nb, int step)
{
    long blocks = (long)((g->N + RX_THREADS - 1) / RX_THREADS) * g->n_groups * g->n_mats;
    if (blocks >= 4L * 132)
        return 1;
    int most = cu_tune_split(g->tune), split = 1;
    for (int s = 4; s <= most && s <= 16; s *= 4) {
        if (nb % (s * step) != 0)
            break;
        split = s;
    }
    return split;
}

int cuk_gemm_rows(const cudev_gemm *g, bool exact, cudaStream_t stream)
{
    int mb = g->max_rows < RX_MB ? (g->max_rows > 0 ? g->max_rows : 1) : RX_MB;
    bool fp4 = g->format == MB_W_MXFP4;
    int nb = fp4 ? g->K / 32 : g->K / 128;
    int split = rx_split(g, nb, fp4 ? 4 : 1), rows = RX_THREADS / split;
    dim3 grid((unsigned)((g->N + rows - 1) / rows), (unsigned)g->n_groups, (unsigned)g->n_mats);
    size_t terms = split > 1 ? (size_t)mb * rows * nb * 4 : 0;
    int ld = g->ld_out ? g->ld_out : g->N;
    if (fp4) {
        size_t sh = (size_t)mb * rx_fp4_row_bytes(g->K) + terms;
        rx_optin((const void *)k_rows_fp4, sh);
        k_rows_fp4<<<grid, RX_THREADS, sh, stream>>>(g->groups, g->N, g->K, g->a, g->a_scale,
                                                     g->out_f32, g->out2_f32, g->out_bf16,
                                                     g->out_row, mb, ld, split);
    } else {
        size_t sh = (size_t)mb * rx_fp8_row_bytes(g->K) + terms;
        if (exact) {
            rx_optin((const void *)k_rows_fp8<true>, sh);
            k_rows_fp8<true><<<grid, RX_THREADS, sh, stream>>>(
                g->groups, g->N, g->K, g->a, g->a_scale, g->out_f32, g->out2_f32, g->out_bf16,
                g->out_row, mb, ld, split);
        } else {
            rx_optin((const void *)k_rows_fp8<false>, sh);
            k_rows_fp8<false><<<grid, RX_THREADS, sh, stream>>>(
                g->groups, g->N, g->K, g->a, g->a_scale, g->out_f32, g->out2_f32, g->out_bf16,
                g->out_row, mb, ld, split);
        }
    }
    return 0;
}

int cuk_gemm_exact(const cudev_gemm *g, cudaStream_t stream)
{
    return cuk_gemm_rows(g, true, stream);
}
