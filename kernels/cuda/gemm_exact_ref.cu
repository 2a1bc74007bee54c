/*
 * gemm_exact_ref.cu — the plain reference of the device's exact grouped GEMMs: the first
 * kernels checked bit for bit against the CPU backend on an H200 (docs/performance.md, run of
 * 2026-11-30), kept beside the fast ones in gemm_exact.cu with the same signature so that
 * tests/gpu/test_cuda_kernels can prove the two agree, and selectable at run time
 * (EPMOE_CUDA_EXACT=ref) should the fast ones ever be in doubt. About 0.17 of the copy
 * bandwidth at decode.
 *
 * Each warp owns RW consecutive weight rows of one group (expert) and streams them once per MB
 * activation rows. Per output (m, n):
 *   - block partial sums are exact: MXFP4 in int32 (e4m3 as a multiple of 2^-9 times e2m1 as a
 *     multiple of 2^-1: a 32-term sum is below 2^27), FP8 in double (products exact, every
 *     partial sum of a 128-block an integer multiple of 2^-18 below 2^43), so lanes may sum
 *     their shares in any order and combine them with shuffles;
 *   - the per-block fp32 chain (one rounding of the sum, scale multiplies, the add into acc)
 *     runs in block order in one lane per output, through shared memory;
 *   - a NaN activation code makes the block's P NaN, as in the reference.
 */
#include <limits.h>

#include "kernels/cuda/cuda_kernels.cuh"

#define EX_WARPS 4
#define EX_RW    8 /* weight rows per warp */
#define EX_MB    4 /* activation rows per pass: EX_RW * EX_MB lanes run the chains */

/* e4m3 code -> value * 2^9 (an exact integer); NaN codes give 0 (flagged by the caller). */
__device__ __forceinline__ int ex_e4m3_int(uint32_t b)
{
    int e = (int)((b >> 3) & 15), m = (int)(b & 7);
    int mag = e ? (8 | m) << (e - 1) : m;
    return (b & 0x80) ? -mag : mag;
}

/* e4m3 code -> double (exact); NaN codes give NaN. */
__device__ __forceinline__ double ex_e4m3_double(uint32_t b)
{
    uint32_t e = (b >> 3) & 15, m = b & 7, s = (b & 0x80) << 24;
    double v = e ? __hiloint2double((int)(s | ((e + 1016u) << 20) | (m << 17)), 0)
                 : (s ? -(double)m : (double)m) * 0x1p-9;
    return (e == 15 && m == 7) ? __longlong_as_double(0x7FF8000000000000ll) : v;
}

__device__ __forceinline__ bool ex_has_nan_code(uint32_t w)
{
    uint32_t t = (w & 0x7F7F7F7Fu) ^ 0x7F7F7F7Fu; /* a byte of 0x7F (or 0xFF) becomes 0 */
    return ((t - 0x01010101u) & ~t & 0x80808080u) != 0;
}

__device__ __forceinline__ void ex_store(const cudev_group &G, int row, int n, int N, int ld,
                                         float acc, float *out, uint16_t *obf, const uint32_t *orow)
{
    if (obf) {
        size_t r = orow ? orow[row] : (uint32_t)row;
        obf[r * N + n] = cuk_f32_to_bf16(acc);
    } else {
        out[(size_t)row * ld + n] = acc;
    }
}

/* MXFP4 weights: packed [N, K/2] (low nibble = even k), e8m0 scales [N, K/32]. A lane takes one
 * 32-block (16 weight bytes) per iteration; the warp covers 32 blocks = 1024 k. */
__global__ __launch_bounds__(EX_WARPS * 32) static void k_exact_fp4(const cudev_group *groups,
                                                                    int N, int K, const uint8_t *a,
                                                                    const float *as, float *out1,
                                                                    float *out2, uint16_t *obf,
                                                                    const uint32_t *orow, int ld)
{
    __shared__ int pbuf[EX_WARPS][EX_RW * EX_MB][33];
    __shared__ int wlut[16];
    if (threadIdx.x < 16) {
        int n3 = threadIdx.x & 7, e = n3 >> 1, mb = n3 & 1;
        int mag = e ? (2 | mb) << (e - 1) : mb; /* e2m1 value * 2 */
        wlut[threadIdx.x] = (threadIdx.x & 8) ? -mag : mag;
    }
    __syncthreads();
    const cudev_group G = groups[blockIdx.y];
    const uint8_t *W = (blockIdx.z ? G.w[1] : G.w[0]);
    const uint8_t *S = (const uint8_t *)(blockIdx.z ? G.scale[1] : G.scale[0]);
    float *out = blockIdx.z ? out2 : out1;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n0 = (blockIdx.x * EX_WARPS + warp) * EX_RW;
    if (n0 >= N)
        return;
    int nblk = K / 32, KH = K / 2, SC = K / 128;
    int my_r = lane / EX_MB, my_m = lane % EX_MB;
    bool chainer = lane < EX_RW * EX_MB;
    for (int m0 = 0; m0 < (int)G.rows; m0 += EX_MB) {
        int mb = (int)G.rows - m0 < EX_MB ? (int)G.rows - m0 : EX_MB;
        float acc = 0.0f;
        for (int it = 0; it * 32 < nblk; it++) {
            int c = it * 32 + lane;
            bool active = c < nblk;
            for (int m = 0; m < mb; m++) {
                size_t row = G.row0 + (uint32_t)(m0 + m);
                int A[32];
                bool nan = false;
                uint4 wv[EX_RW];
                if (active) {
                    const uint4 *ap = (const uint4 *)(a + row * (size_t)K + (size_t)c * 32);
                    uint4 v0 = ap[0], v1 = ap[1];
                    uint32_t aw[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                    for (int r = 0; r < EX_RW; r++)
                        wv[r] = *(const uint4 *)(W + (size_t)(n0 + r) * KH + (size_t)c * 16);
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        nan |= ex_has_nan_code(aw[j]);
#pragma unroll
                        for (int b = 0; b < 4; b++)
                            A[4 * j + b] = ex_e4m3_int((aw[j] >> (8 * b)) & 0xFF);
                    }
                }
#pragma unroll
                for (int r = 0; r < EX_RW; r++) {
                    int P = 0;
                    if (active) {
                        uint32_t ww[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
#pragma unroll
                        for (int j = 0; j < 4; j++)
#pragma unroll
                            for (int b = 0; b < 8; b++)
                                P += A[8 * j + b] * wlut[(ww[j] >> (4 * b)) & 15];
                        if (nan)
                            P = INT_MIN;
                    }
                    pbuf[warp][r * EX_MB + m][lane] = P;
                }
            }
            __syncwarp();
            if (chainer && my_m < mb) {
                size_t row = G.row0 + (uint32_t)(m0 + my_m);
                int n = n0 + my_r;
                for (int j = 0; j < 32 && it * 32 + j < nblk; j++) {
                    int cc = it * 32 + j;
                    int P = pbuf[warp][lane][j];
                    float p = P == INT_MIN ? __uint_as_float(CUK_QNAN)
                                           : __fmul_rn(__int2float_rn(P), 0x1p-10f);
                    float t = __fmul_rn(p, as[row * SC + cc / 4]);
                    acc = __fadd_rn(acc, __fmul_rn(t, cuk_e8m0_to_f32(S[(size_t)n * nblk + cc])));
                }
            }
            __syncwarp();
        }
        if (chainer && my_m < mb)
            ex_store(G, (int)(G.row0 + m0 + my_m), n0 + my_r, N, ld, acc, out, obf, orow);
    }
}

/* FP8 weights: e4m3 [N, K], f32 scales [N/128, K/128]. A lane takes 16 bytes per iteration, 8
 * lanes one 128-block; the warp covers 4 blocks = 512 k. */
__global__ __launch_bounds__(EX_WARPS * 32) static void k_exact_fp8(const cudev_group *groups,
                                                                    int N, int K, const uint8_t *a,
                                                                    const float *as, float *out1,
                                                                    float *out2, uint16_t *obf,
                                                                    const uint32_t *orow, int ld)
{
    __shared__ double pbuf[EX_WARPS][EX_RW * EX_MB][4];
    const cudev_group G = groups[blockIdx.y];
    const uint8_t *W = (blockIdx.z ? G.w[1] : G.w[0]);
    const float *S = (const float *)(blockIdx.z ? G.scale[1] : G.scale[0]);
    float *out = blockIdx.z ? out2 : out1;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n0 = (blockIdx.x * EX_WARPS + warp) * EX_RW;
    if (n0 >= N)
        return;
    int KB = K / 128;
    int my_r = lane / EX_MB, my_m = lane % EX_MB;
    bool chainer = lane < EX_RW * EX_MB;
    for (int m0 = 0; m0 < (int)G.rows; m0 += EX_MB) {
        int mb = (int)G.rows - m0 < EX_MB ? (int)G.rows - m0 : EX_MB;
        float acc = 0.0f;
        for (int it = 0; it * 4 < KB; it++) {
            int kb = it * 4 + lane / 8;
            bool active = kb < KB;
            size_t off = (size_t)it * 512 + (size_t)lane * 16;
            for (int m = 0; m < mb; m++) {
                size_t row = G.row0 + (uint32_t)(m0 + m);
                double A[16];
                uint4 wv[EX_RW];
                if (active) {
                    uint4 v = *(const uint4 *)(a + row * (size_t)K + off);
                    uint32_t aw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int r = 0; r < EX_RW; r++)
                        wv[r] = *(const uint4 *)(W + (size_t)(n0 + r) * K + off);
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int b = 0; b < 4; b++)
                            A[4 * j + b] = ex_e4m3_double((aw[j] >> (8 * b)) & 0xFF);
                }
#pragma unroll
                for (int r = 0; r < EX_RW; r++) {
                    double p = 0.0;
                    if (active) {
                        uint32_t ww[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
#pragma unroll
                        for (int j = 0; j < 4; j++)
#pragma unroll
                            for (int b = 0; b < 4; b++)
                                p = __fma_rn(A[4 * j + b],
                                             ex_e4m3_double((ww[j] >> (8 * b)) & 0xFF), p);
                    }
                    /* the 8 lanes of a block: exact partial sums, any order */
                    p = __dadd_rn(p, __shfl_xor_sync(0xFFFFFFFFu, p, 1));
                    p = __dadd_rn(p, __shfl_xor_sync(0xFFFFFFFFu, p, 2));
                    p = __dadd_rn(p, __shfl_xor_sync(0xFFFFFFFFu, p, 4));
                    if ((lane & 7) == 0)
                        pbuf[warp][r * EX_MB + m][lane / 8] = p;
                }
            }
            __syncwarp();
            if (chainer && my_m < mb) {
                size_t row = G.row0 + (uint32_t)(m0 + my_m);
                int n = n0 + my_r;
                for (int j = 0; j < 4 && it * 4 + j < KB; j++) {
                    int b = it * 4 + j;
                    float p = __double2float_rn(pbuf[warp][lane][j]);
                    float sig = __fmul_rn(as[row * KB + b], S[(size_t)(n / 128) * KB + b]);
                    acc = __fadd_rn(acc, __fmul_rn(p, sig));
                }
            }
            __syncwarp();
        }
        if (chainer && my_m < mb)
            ex_store(G, (int)(G.row0 + m0 + my_m), n0 + my_r, N, ld, acc, out, obf, orow);
    }
}

int cuk_gemm_exact_ref(const cudev_gemm *g, cudaStream_t stream)
{
    int rows_per_block = EX_WARPS * EX_RW;
    dim3 grid((unsigned)((g->N + rows_per_block - 1) / rows_per_block), (unsigned)g->n_groups,
              (unsigned)g->n_mats);
    if (g->format == MB_W_MXFP4)
        k_exact_fp4<<<grid, EX_WARPS * 32, 0, stream>>>(g->groups, g->N, g->K, g->a, g->a_scale,
                                                        g->out_f32, g->out2_f32, g->out_bf16,
                                                        g->out_row, g->ld_out ? g->ld_out : g->N);
    else
        k_exact_fp8<<<grid, EX_WARPS * 32, 0, stream>>>(g->groups, g->N, g->K, g->a, g->a_scale,
                                                        g->out_f32, g->out2_f32, g->out_bf16,
                                                        g->out_row, g->ld_out ? g->ld_out : g->N);
    return 0;
}
