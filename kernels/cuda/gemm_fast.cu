/*
 * gemm_fast.cu — the grouped expert GEMMs on tensor cores (expert_parallel.gpu_gemm: fast):
 * FP8 e4m3 MMA (mma.sync m16n8k32, fp32 accumulation) with the per-128 scale promotion into an
 * fp32 accumulator that DeepGEMM uses, within spec §7's tolerances (not the CPU's bits).
 *
 * Tiles: 64 rows (of one group) x 128 weight rows x 128 k per step, 8 warps of 32 x 32. Each
 * 128-block's MMAs accumulate into a fresh fragment that is then scaled by a_scale[row] *
 * w_scale and added to the running one. The next step's tiles are read from global memory into
 * registers while the current one is multiplied.
 *
 * MXFP4 weights become e4m3 in shared memory: every e2m1 value is exactly an e4m3 value, and a
 * 32-block's E8M0 scale is folded in relative to the largest of its 128-block (a shift by
 * d = s_max - s of up to 8 binades stays exact in e4m3's subnormals; smaller values round), so
 * one scale per (row, 128-block) remains, as for FP8.
 */
#include "kernels/cuda/cuda_kernels.cuh"

#define FT_BM      64
#define FT_BN      128
#define FT_BK      128
#define FT_LDS     (FT_BK + 16) /* padded row: the fragment loads of a warp hit 32 banks */
#define FT_THREADS 256
#define FT_SHIFTS  10 /* relative scale shifts 0..8 exact, 9 = "smaller" (rounded) */

__device__ __forceinline__ void ft_mma(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* The group and the 64-row tile of blockIdx.y (tiles numbered group by group). */
__device__ __forceinline__ bool ft_tile(const cudev_group *groups, int n_groups, int tile,
                                        cudev_group *G, int *m0)
{
    for (int g = 0; g < n_groups; g++) {
        int t = ((int)groups[g].rows + FT_BM - 1) / FT_BM;
        if (tile < t) {
            *G = groups[g];
            *m0 = tile * FT_BM;
            return true;
        }
        tile -= t;
    }
    return false;
}

struct ft_regs {
    uint4 a[2]; /* 64 x 128 bytes of activations: 2 x 16 bytes per thread */
    uint4 b[4]; /* FP8: 128 x 128 weight bytes; MXFP4: b[0..1] = 128 x 64 packed bytes */
};

__device__ __forceinline__ void ft_load(ft_regs &R, const cudev_group &G, int m0, int n0, int kb,
                                        int K, bool fp4, const uint8_t *a, const uint8_t *W)
{
    int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int idx = tid + i * FT_THREADS; /* 0..511: row idx/8, 16-byte chunk idx%8 */
        int r = idx >> 3, ch = idx & 7;
        R.a[i] = make_uint4(0, 0, 0, 0);
        if (m0 + r < (int)G.rows)
            R.a[i] =
                *(const uint4 *)(a + (size_t)(G.row0 + m0 + r) * K + (size_t)kb * FT_BK + ch * 16);
    }
    if (!fp4) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int idx = tid + i * FT_THREADS; /* 0..1023: weight row idx/8, chunk idx%8 */
            int r = idx >> 3, ch = idx & 7;
            R.b[i] = *(const uint4 *)(W + (size_t)(n0 + r) * K + (size_t)kb * FT_BK + ch * 16);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int idx = tid + i * FT_THREADS; /* 0..511: weight row idx/4, 32-block idx%4 */
            int r = idx >> 2, ch = idx & 3;
            R.b[i] = *(const uint4 *)(W + (size_t)(n0 + r) * (K / 2) + (size_t)kb * 64 + ch * 16);
        }
    }
}

__global__ __launch_bounds__(FT_THREADS) static void k_fast(const cudev_group *groups, int n_groups,
                                                            int N, int K, bool fp4,
                                                            const uint8_t *a, const float *as,
                                                            float *out1, float *out2, uint16_t *obf,
                                                            const uint32_t *orow, int ld)
{
    __shared__ __align__(16) uint8_t As[FT_BM * FT_LDS];
    __shared__ __align__(16) uint8_t Bs[FT_BN * FT_LDS];
    __shared__ float a_sc[FT_BM], b_sc[FT_BN];
    __shared__ uint8_t smax[FT_BN];
    __shared__ uint8_t lut[FT_SHIFTS][16];
    cudev_group G;
    int m0;
    if (!ft_tile(groups, n_groups, blockIdx.y, &G, &m0))
        return; /* uniform over the block */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
    const int n0 = blockIdx.x * FT_BN, KB = K / FT_BK;
    const uint8_t *W = (blockIdx.z ? G.w[1] : G.w[0]);
    const void *S = (blockIdx.z ? G.scale[1] : G.scale[0]);
    const uint8_t *S8 = (const uint8_t *)S;
    float *out = blockIdx.z ? out2 : out1;
    if (fp4 && tid < FT_SHIFTS * 16) {
        int d = tid >> 4, nib = tid & 15;
        const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
        float v = __fmul_rn(e2m1[nib & 7], __uint_as_float((uint32_t)(127 - d) << 23)); /* 2^-d */
        lut[d][nib] = cuk_f32_to_e4m3((nib & 8) ? -v : v);
    }

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[i][j][c] = 0.0f;

    ft_regs R;
    ft_load(R, G, m0, n0, 0, K, fp4, a, W);
    for (int kb = 0; kb < KB; kb++) {
        __syncthreads(); /* the previous step's fragments are read */
                         /* registers -> shared memory */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int idx = tid + i * FT_THREADS, r = idx >> 3, ch = idx & 7;
            *(uint4 *)(As + r * FT_LDS + ch * 16) = R.a[i];
        }
        if (tid < FT_BM) {
            int r = m0 + tid;
            a_sc[tid] = r < (int)G.rows ? as[(size_t)(G.row0 + r) * KB + kb] : 0.0f;
        }
        if (!fp4) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int idx = tid + i * FT_THREADS, r = idx >> 3, ch = idx & 7;
                *(uint4 *)(Bs + r * FT_LDS + ch * 16) = R.b[i];
            }
            if (tid < FT_BN)
                b_sc[tid] = ((const float *)S)[(size_t)(n0 / 128) * KB + kb];
        } else {
            if (tid < FT_BN) {
                uint32_t s4 = *(const uint32_t *)(S8 + (size_t)(n0 + tid) * (K / 32) + kb * 4);
                uint32_t m = s4 & 0xFF;
                for (int j = 1; j < 4; j++)
                    m = max(m, (s4 >> (8 * j)) & 0xFF);
                smax[tid] = (uint8_t)m;
                b_sc[tid] = cuk_e8m0_to_f32((uint8_t)m);
            }
            __syncthreads(); /* smax ready */
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int idx = tid + i * FT_THREADS, r = idx >> 2, ch = idx & 3;
                uint32_t sj = S8[(size_t)(n0 + r) * (K / 32) + kb * 4 + ch];
                int d = (int)smax[r] - (int)sj;
                d = d > FT_SHIFTS - 1 ? FT_SHIFTS - 1 : d;
                uint32_t w[4] = {R.b[i].x, R.b[i].y, R.b[i].z, R.b[i].w};
                uint32_t o[8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t lo = 0, hi = 0;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        lo |= (uint32_t)lut[d][(w[j] >> (4 * b)) & 15] << (8 * b);
                        hi |= (uint32_t)lut[d][(w[j] >> (16 + 4 * b)) & 15] << (8 * b);
                    }
                    o[2 * j] = lo;
                    o[2 * j + 1] = hi;
                }
                uint4 *dst = (uint4 *)(Bs + r * FT_LDS + ch * 32);
                dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
                dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
            }
        }
        __syncthreads();
        if (kb + 1 < KB) /* in flight while this step multiplies */
            ft_load(R, G, m0, n0, kb + 1, K, fp4, a, W);

        float tmp[2][4][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    tmp[i][j][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < FT_BK / 32; kk++) {
            uint32_t af[2][4], bfr[4][2];
            int k0 = kk * 32 + t * 4;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const uint8_t *p = As + (wm + i * 16 + g) * FT_LDS + k0;
                af[i][0] = *(const uint32_t *)p;
                af[i][1] = *(const uint32_t *)(p + 8 * FT_LDS);
                af[i][2] = *(const uint32_t *)(p + 16);
                af[i][3] = *(const uint32_t *)(p + 8 * FT_LDS + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint8_t *p = Bs + (wn + j * 8 + g) * FT_LDS + k0;
                bfr[j][0] = *(const uint32_t *)p;
                bfr[j][1] = *(const uint32_t *)(p + 16);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    ft_mma(tmp[i][j], af[i], bfr[j]);
        }
        /* promote this 128-block: acc += tmp * a_scale[row] * w_scale[col] */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float sa0 = a_sc[wm + i * 16 + g], sa1 = a_sc[wm + i * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int c0 = wn + j * 8 + t * 2;
                float sb0 = b_sc[c0], sb1 = b_sc[c0 + 1];
                acc[i][j][0] = __fmaf_rn(tmp[i][j][0], sa0 * sb0, acc[i][j][0]);
                acc[i][j][1] = __fmaf_rn(tmp[i][j][1], sa0 * sb1, acc[i][j][1]);
                acc[i][j][2] = __fmaf_rn(tmp[i][j][2], sa1 * sb0, acc[i][j][2]);
                acc[i][j][3] = __fmaf_rn(tmp[i][j][3], sa1 * sb1, acc[i][j][3]);
            }
        }
    }
    /* write the tile's rows that belong to the group */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = m0 + wm + i * 16 + g + h * 8;
            if (r >= (int)G.rows)
                continue;
            size_t row = G.row0 + (uint32_t)r;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int n = n0 + wn + j * 8 + t * 2;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (obf) {
                    size_t o = orow ? orow[row] : row;
                    uint32_t pk =
                        (uint32_t)cuk_f32_to_bf16(v0) | ((uint32_t)cuk_f32_to_bf16(v1) << 16);
                    *(uint32_t *)(obf + o * N + n) = pk;
                } else {
                    *(float2 *)(out + row * ld + n) = make_float2(v0, v1);
                }
            }
        }
}

int cuk_gemm_fast(const cudev_gemm *g, cudaStream_t stream)
{
    int tiles = 0;
    for (int i = 0; i < g->n_groups; i++)
        tiles += ((int)g->h_groups[i].rows + FT_BM - 1) / FT_BM;
    if (tiles == 0)
        return 0;
    dim3 grid((unsigned)(g->N / FT_BN), (unsigned)tiles, (unsigned)g->n_mats);
    k_fast<<<grid, FT_THREADS, 0, stream>>>(
        g->groups, g->n_groups, g->N, g->K, g->format == MB_W_MXFP4, g->a, g->a_scale, g->out_f32,
        g->out2_f32, g->out_bf16, g->out_row, g->ld_out ? g->ld_out : g->N);
    return 0;
}
