/*
 * bench_cuda.cu — the CUDA backend at DeepSeek-V4-Flash shapes (H 4096, I 2048, 256 experts,
 * top-6), every number a ratio to a baseline measured in the same run:
 *
 *   1. the device-to-device copy bandwidth (bytes read + written per second): the memory bound;
 *   2. decode: one token through 6 routed experts (MXFP4) + the shared expert (FP8), the
 *      grouped GEMMs and SwiGLU only, weights cycled over 256 experts so they come from HBM;
 *      weight bytes per second / copy bandwidth, exact and fast;
 *   3. grouped GEMM (w1 and w3 fused, N 2 x 2048, K 4096) over 256 experts at 8 / 64 / 512 rows
 *      per expert: TFLOP/s, and the ratio to cuBLASLt FP8 doing the same FLOPs as one dense
 *      GEMM, and to cuBLASLt's block-scaled FP8 (1x128 activation, 128x128 weight scales) run
 *      per expert where this cuBLASLt offers it;
 *   4. the whole layer through the backend (mb_forward: routing, experts, shared, combine;
 *      host copies in and out included) at T = 1, 64, 256, 4096, exact and fast: tokens/s.
 *
 * Weights are random bytes (valid codes); one expert's bytes are loaded 256 times, so the
 * device holds 256 distinct copies. Prints a table last. Never changes a device setting.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "common/knobs.h" /* a C header without C++ guards */
}
#include "common/model_config.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/formats.h"
#include "kernels/moe_backend.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static const int H = 4096, I = 2048, E = 256, TOPK = 6;
static const cudev_ops *D;

/* The EPMOE_CUDA_* knobs as the environment sets them now (this program sets some itself): the
 * kernels take them from each GEMM and backend's options, never from the environment. */
static const mb_cuda_tuning *bc_tune(void)
{
    static mb_cuda_tuning t;
    t = (mb_cuda_tuning){};
    knob_values kv;
    ep_err err = {};
    if (knob_load(&kv, KNOB_WORKER, &err) == 0)
        mb_cuda_tuning_from_knobs(&t, &kv);
    return &t;
}
static cudev *dev;
static cudaStream_t st;
static char table[8192];
static size_t tlen;

#define ROW(...) (tlen += (size_t)snprintf(table + tlen, sizeof table - tlen, __VA_ARGS__))

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__global__ static void k_fill(uint8_t *p, size_t n, uint32_t seed, uint8_t mask, uint8_t lo,
                              uint8_t span)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        uint8_t v = (uint8_t)h;
        if (span)
            v = (uint8_t)(lo + v % span);
        else if ((v & 0x7F) == 0x7F)
            v = 0x38;
        p[i] = v & mask;
    }
}

static void *dalloc(size_t n)
{
    void *p;
    CK(cudaMalloc(&p, n));
    return p;
}

/* random e4m3 codes (no NaN), random nibbles, or scale codes in [lo, lo + span) */
static void fill(void *p, size_t n, uint32_t seed, int lo, int span)
{
    k_fill<<<1024, 256, 0, st>>>((uint8_t *)p, n, seed, 0xFF, (uint8_t)lo, (uint8_t)span);
    CK(cudaGetLastError());
}

static void fill_f32(float *p, size_t n, float v)
{
    float *h = (float *)malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = v;
    CK(cudaMemcpy(p, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
}

static float ms_of(cudaEvent_t a, cudaEvent_t b)
{
    float ms;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* ---- 1. copy bandwidth ---- */

static double copy_bandwidth(void)
{
    size_t n = (size_t)2 << 30;
    void *a = dalloc(n), *b = dalloc(n);
    CK(cudaMemsetAsync(a, 1, n, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
    double best = 0;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        double bps = 2.0 * (double)n / (ms_of(e0, e1) * 1e-3);
        best = bps > best ? bps : best;
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    return best;
}

/* ---- expert weights on the device ---- */

typedef struct wset {
    bool fp4;
    int n;                       /* experts */
    uint8_t *w13, *w2;           /* [n][2][N*K...] and [n][...] */
    uint8_t *s13, *s2;           /* scales */
    size_t wb13, sb13, wb2, sb2; /* per matrix */
} wset;

static void wset_make(wset *s, bool fp4, int n)
{
    s->fp4 = fp4;
    s->n = n;
    s->wb13 = fp4 ? (size_t)I * H / 2 : (size_t)I * H;
    s->sb13 = fp4 ? (size_t)I * H / 32 : (size_t)(I / 128) * (H / 128) * 4;
    s->wb2 = fp4 ? (size_t)H * I / 2 : (size_t)H * I;
    s->sb2 = fp4 ? (size_t)H * I / 32 : (size_t)(H / 128) * (I / 128) * 4;
    s->w13 = (uint8_t *)dalloc(s->wb13 * 2 * n);
    s->s13 = (uint8_t *)dalloc(s->sb13 * 2 * n);
    s->w2 = (uint8_t *)dalloc(s->wb2 * n);
    s->s2 = (uint8_t *)dalloc(s->sb2 * n);
    fill(s->w13, s->wb13 * 2 * n, 1, 0, 0);
    fill(s->w2, s->wb2 * n, 2, 0, 0);
    if (fp4) {
        fill(s->s13, s->sb13 * 2 * n, 3, 118, 8);
        fill(s->s2, s->sb2 * n, 4, 118, 8);
    } else {
        fill_f32((float *)s->s13, s->sb13 * 2 * n / 4, 1e-3f);
        fill_f32((float *)s->s2, s->sb2 * n / 4, 1e-3f);
    }
}

static void wset_free(wset *s)
{
    CK(cudaFree(s->w13));
    CK(cudaFree(s->s13));
    CK(cudaFree(s->w2));
    CK(cudaFree(s->s2));
}

static void group_of(const wset *s, int e, uint32_t row0, uint32_t rows, cudev_group *g13,
                     cudev_group *g2)
{
    g13->row0 = g2->row0 = row0;
    g13->rows = g2->rows = rows;
    g13->w[0] = s->w13 + s->wb13 * (2 * (size_t)e);
    g13->w[1] = s->w13 + s->wb13 * (2 * (size_t)e + 1);
    g13->scale[0] = s->s13 + s->sb13 * (2 * (size_t)e);
    g13->scale[1] = s->s13 + s->sb13 * (2 * (size_t)e + 1);
    g2->w[0] = s->w2 + s->wb2 * (size_t)e;
    g2->scale[0] = s->s2 + s->sb2 * (size_t)e;
    g2->w[1] = NULL;
    g2->scale[1] = NULL;
}

typedef struct act {
    int M;
    uint8_t *a, *hq;
    float *as, *acc1, *acc3, *hqs, *w, *tab;
    uint16_t *out;
    cudev_group *g13, *g2; /* device tables */
} act;

static void act_make(act *x, int M)
{
    x->M = M;
    x->a = (uint8_t *)dalloc((size_t)M * H);
    x->as = (float *)dalloc((size_t)M * H / 128 * 4);
    /* the backend's layout: per row w1's outputs then w3's (one GEMM call can write both) */
    x->acc1 = (float *)dalloc((size_t)M * I * 4 * 2);
    x->acc3 = x->acc1 + I;
    x->hq = (uint8_t *)dalloc((size_t)M * I);
    x->hqs = (float *)dalloc((size_t)M * I / 128 * 4);
    x->w = (float *)dalloc((size_t)M * 4);
    x->tab = (float *)dalloc(65536 * 4);
    x->out = (uint16_t *)dalloc((size_t)M * H * 2);
    x->g13 = (cudev_group *)dalloc(2 * 300 * sizeof(cudev_group));
    x->g2 = x->g13 + 300;
    fill(x->a, (size_t)M * H, 5, 0, 0);
    fill_f32(x->as, (size_t)M * H / 128, 0.01f);
    fill_f32(x->w, (size_t)M, 0.3f);
    fill_f32(x->tab, 65536, 0.5f);
}

static void act_free(act *x)
{
    void *p[] = {x->a, x->as, x->acc1, x->hq, x->hqs, x->w, x->tab, x->out, x->g13};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        CK(cudaFree(p[i]));
}

/* one MLP over groups already in x->g13/g2 (host copies h13/h2) */
static void mlp(act *x, mb_wformat f, mb_gemm_mode mode, int M, int ng, cudev_group *h13,
                cudev_group *h2, int max_rows, bool weights)
{
    ep_err err;
    cudev_gemm g = {f,        mode, I,     H,       M,       2,     ng,   x->g13, h13,
                    max_rows, x->a, x->as, x->acc1, x->acc3, 2 * I, NULL, NULL};
    cudev_gemm g2 = {f,        mode,  H,      I,    M,    1, ng,     x->g2, h2,
                     max_rows, x->hq, x->hqs, NULL, NULL, 0, x->out, NULL};
    g.tune = g2.tune = bc_tune();
    if (D->gemm(dev, &g, &err) ||
        D->swiglu(dev, M, I, x->acc1, x->acc3, 2 * I, weights ? x->w : NULL, 10.0f, true, x->tab,
                  0.0f, x->hq, x->hqs, &err) ||
        D->gemm(dev, &g2, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        exit(1);
    }
}

/* ---- 2. decode ---- */

/* One token per iteration: 6 routed experts (different ones each time, so the weights come
 * from HBM) and the shared expert; per iteration 14 group tables, host h and device d: [0, 7)
 * for w1+w3 (routed 0..5, shared 6), [7, 14) for w2. */
typedef struct decode_set {
    wset r, sh;
    act x;
    int iters;
    cudev_group *h, *d;
} decode_set;

static void decode_set_make(decode_set *s, int iters)
{
    wset_make(&s->r, true, E);
    wset_make(&s->sh, false, 1);
    act_make(&s->x, 8);
    s->iters = iters;
    s->h = (cudev_group *)malloc(sizeof(cudev_group) * 14 * iters);
    s->d = (cudev_group *)dalloc(sizeof(cudev_group) * 14 * iters);
    for (int it = 0; it < iters; it++) {
        cudev_group *t = s->h + (size_t)it * 14;
        for (int j = 0; j < TOPK; j++)
            group_of(&s->r, (it * 37 + j * 41) % E, (uint32_t)j, 1, &t[j], &t[7 + j]);
        group_of(&s->sh, 0, 0, 1, &t[6], &t[13]);
    }
    CK(cudaMemcpy(s->d, s->h, sizeof(cudev_group) * 14 * iters, cudaMemcpyHostToDevice));
}

static void decode_set_free(decode_set *s)
{
    s->x.g13 = (cudev_group *)dalloc(16); /* act_free frees g13 */
    act_free(&s->x);
    CK(cudaFree(s->d));
    free(s->h);
    wset_free(&s->r);
    wset_free(&s->sh);
}

static void bench_decode(double copy_bps)
{
    decode_set ds;
    decode_set_make(&ds, 200);
    wset &r = ds.r, &sh = ds.sh;
    act &x = ds.x;
    const int iters = ds.iters;
    cudev_group *h13 = ds.h, *d_tabs = ds.d;
    size_t bytes =
        TOPK * (2 * (r.wb13 + r.sb13) + r.wb2 + r.sb2) + 2 * (sh.wb13 + sh.sb13) + sh.wb2 + sh.sb2;
    printf("decode: %.1f MB of weights per token\n", (double)bytes / 1e6);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int mode = 0; mode < 2; mode++) {
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            CK(cudaEventRecord(e0, st));
            for (int it = 0; it < iters; it++) {
                cudev_group *t = h13 + (size_t)it * 14, *dt = d_tabs + (size_t)it * 14;
                x.g13 = dt;
                x.g2 = dt + 7;
                mlp(&x, MB_W_MXFP4, (mb_gemm_mode)mode, TOPK, TOPK, t, t + 7, 1, true);
                x.g13 = dt + 6;
                x.g2 = dt + 13;
                mlp(&x, MB_W_FP8, (mb_gemm_mode)mode, 1, 1, t + 6, t + 13, 1, false);
            }
            CK(cudaEventRecord(e1, st));
            double s = ms_of(e0, e1) * 1e-3 / iters;
            best = s < best ? s : best;
        }
        double bps = (double)bytes / best;
        printf("decode %-5s: %.1f us/token, %.0f GB/s of weights, %.3f of copy bandwidth\n",
               mode ? "fast" : "exact", best * 1e6, bps / 1e9, bps / copy_bps);
        ROW("| decode, 1 token, 6 experts + shared | %s | %.1f us | %.0f GB/s | %.3f x copy "
            "bandwidth |\n",
            mode ? "fast" : "exact", best * 1e6, bps / 1e9, bps / copy_bps);
    }
    decode_set_free(&ds);
}

/* Where decode's time goes (bench_cuda decode-parts): each launch of one token's MLPs alone,
 * over the same cycled experts, for the exact kernels, the reference exact kernels
 * (EPMOE_CUDA_EXACT=ref) and the fast path: us per call and the GEMMs' weight bytes/s. */
static void bench_decode_parts(double copy_bps)
{
    decode_set ds;
    decode_set_make(&ds, 100);
    wset &r = ds.r, &sh = ds.sh;
    act &x = ds.x;
    const int iters = ds.iters;
    cudev_group *h = ds.h, *dt = ds.d;
    const char *names[6] = {"routed w1+w3 (6 x MXFP4)", "routed swiglu+quant",
                            "routed w2 (6 x MXFP4)",    "shared w1+w3 (FP8)",
                            "shared swiglu+quant",      "shared w2 (FP8)"};
    size_t bytes[6] = {TOPK * 2 * (r.wb13 + r.sb13), 0, TOPK * (r.wb2 + r.sb2),
                       2 * (sh.wb13 + sh.sb13),      0, sh.wb2 + sh.sb2};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 1)
            setenv("EPMOE_CUDA_EXACT", "ref", 1);
        for (int part = 0; part < 6; part++) {
            bool shared = part >= 3;
            int ng = shared ? 1 : TOPK, kind = part % 3;
            mb_wformat f = shared ? MB_W_FP8 : MB_W_MXFP4;
            mb_gemm_mode gm = mode == 2 ? MB_GEMM_FAST : MB_GEMM_EXACT;
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                CK(cudaEventRecord(e0, st));
                for (int it = 0; it < iters; it++) {
                    cudev_group *t = h + (size_t)it * 14 + (shared ? 6 : 0);
                    cudev_group *d = dt + (size_t)it * 14 + (shared ? 6 : 0);
                    ep_err err;
                    cudev_gemm g = {f, gm,  I,    H,      ng,     2,     ng,   d,   t,
                                    1, x.a, x.as, x.acc1, x.acc3, 2 * I, NULL, NULL};
                    cudev_gemm g2 = {f, gm,   H,     I,    ng,   1, ng,    d + 7, t + 7,
                                     1, x.hq, x.hqs, NULL, NULL, 0, x.out, NULL};
                    g.tune = g2.tune = bc_tune();
                    int rc = kind == 0 ? D->gemm(dev, &g, &err)
                             : kind == 2
                                 ? D->gemm(dev, &g2, &err)
                                 : D->swiglu(dev, ng, I, x.acc1, x.acc3, 2 * I, shared ? NULL : x.w,
                                             10.0f, true, x.tab, 0.0f, x.hq, x.hqs, &err);
                    if (rc) {
                        fprintf(stderr, "bench: %s\n", err.msg);
                        exit(1);
                    }
                }
                CK(cudaEventRecord(e1, st));
                double s = ms_of(e0, e1) * 1e-3 / iters;
                best = s < best ? s : best;
            }
            const char *mn = mode == 0 ? "exact" : mode == 1 ? "exact-ref" : "fast";
            if (bytes[part])
                printf("decode part %-9s %-26s %8.1f us  %6.0f GB/s  %.3f of copy\n", mn,
                       names[part], best * 1e6, bytes[part] / best / 1e9,
                       bytes[part] / best / copy_bps);
            else
                printf("decode part %-9s %-26s %8.1f us\n", mn, names[part], best * 1e6);
        }
        if (mode == 1)
            unsetenv("EPMOE_CUDA_EXACT");
    }
    decode_set_free(&ds);
}

/* ---- 3. grouped GEMM vs cuBLASLt ---- */

static cublasLtHandle_t lt;
static void *lt_ws;
static const size_t LT_WS = 64u << 20;

/* cuBLASLt FP8 (e4m3 x e4m3 -> bf16) D[m, n] = A^T B with A [k, m], B [k, n] col-major,
 * optional block scales. Returns seconds per call (best of 3 runs of reps calls), or -1 when
 * cuBLASLt offers no algorithm. */
static double lt_gemm(int m, int n, int k, const void *A, const void *B, void *Dm, int reps,
                      bool blockscaled, const float *sa, const float *sb, int n_calls,
                      size_t strideA)
{
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        return -1;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof N);
    if (blockscaled) {
        cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        cublasLtMatmulMatrixScale_t mbm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mbm, sizeof mbm);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    }
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &LT_WS,
                                         sizeof LT_WS);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    double best = -1;
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &h, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        float alpha = 1.0f, beta = 0.0f;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        bool ok = true;
        for (int r = 0; r < 4 && ok; r++) {
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < reps && ok; i++)
                for (int c = 0; c < n_calls && ok; c++)
                    ok = cublasLtMatmul(lt, op, &alpha, (const uint8_t *)A + strideA * c, la, B, lb,
                                        &beta, Dm, ld, Dm, ld, &h.algo, lt_ws, LT_WS,
                                        st) == CUBLAS_STATUS_SUCCESS;
            CK(cudaEventRecord(e1, st));
            double s = ms_of(e0, e1) * 1e-3 / reps;
            if (r > 0 && ok && (best < 0 || s < best)) /* the first run warms up */
                best = s;
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        if (!ok)
            best = -1;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return best;
}

/* cuBLASLt's block-scaled FP8 (1x128 activation and 128x128 weight scales: the FP8 experts'
 * own format), one call per expert, at R rows per expert: seconds per grouped call. Run last:
 * its scale-tensor layout is the library's, and a mistake there must not cost the rest. */
static double bench_blockscaled(int R)
{
    wset r;
    wset_make(&r, false, E);
    void *Bm = dalloc((size_t)R * H), *Dm = dalloc((size_t)2 * I * R * 2);
    fill(Bm, (size_t)R * H, 9, 0, 0);
    float *sa = (float *)dalloc((size_t)(2 * I / 128 + 1) * (H / 128) * 4 * 2);
    float *sb = (float *)dalloc((size_t)(H / 128) * (R + 128) * 4 * 2);
    fill_f32(sa, (size_t)(2 * I / 128 + 1) * (H / 128) * 2, 1e-3f);
    fill_f32(sb, (size_t)(H / 128) * (R + 128) * 2, 1e-2f);
    double t = lt_gemm(2 * I, R, H, r.w13, Bm, Dm, 1, true, sa, sb, E, r.wb13 * 2);
    CK(cudaFree(sa));
    CK(cudaFree(sb));
    CK(cudaFree(Bm));
    CK(cudaFree(Dm));
    wset_free(&r);
    return t;
}

static double grouped_fp8_best[3]; /* our best FP8 grouped time per rows setting */

static void bench_grouped(void)
{
    static const int rows_per_expert[] = {8, 64, 512};
    CK(cudaMalloc(&lt_ws, LT_WS));
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        printf("cuBLASLt unavailable\n");
        return;
    }
    for (int fp4 = 1; fp4 >= 0; fp4--) {
        wset r;
        wset_make(&r, fp4, E);
        for (size_t ri = 0; ri < 3; ri++) {
            int R = rows_per_expert[ri], M = R * E;
            act x;
            act_make(&x, M);
            cudev_group *h13 = (cudev_group *)malloc(sizeof(cudev_group) * 2 * E);
            for (int e = 0; e < E; e++)
                group_of(&r, e, (uint32_t)(e * R), (uint32_t)R, &h13[e], &h13[E + e]);
            CK(cudaMemcpy(x.g13, h13, sizeof(cudev_group) * E, cudaMemcpyHostToDevice));
            double flops = 2.0 * 2.0 * M * (double)I * H; /* w1 and w3 */
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            /* 0: exact; 1: fast, our kernels; 2: fast with cuBLASLt's block-scaled FP8 (FP8) */
            double t[3] = {0, 0, 0};
            for (int mode = 0; mode < (fp4 ? 2 : 3); mode++) {
                ep_err err;
                setenv("EPMOE_CUDA_CUBLASLT", mode == 2 ? "1" : "0", 1);
                cudev_gemm g = {fp4 ? MB_W_MXFP4 : MB_W_FP8,
                                mode ? MB_GEMM_FAST : MB_GEMM_EXACT,
                                I,
                                H,
                                M,
                                2,
                                E,
                                x.g13,
                                h13,
                                R,
                                x.a,
                                x.as,
                                x.acc1,
                                x.acc3,
                                2 * I,
                                NULL,
                                NULL};
                g.tune = bc_tune();
                int reps = mode == 0 && R >= 64 ? 1 : 3;
                double best = 1e30;
                for (int rep = 0; rep < 2; rep++) {
                    CK(cudaEventRecord(e0, st));
                    for (int i = 0; i < reps; i++)
                        if (D->gemm(dev, &g, &err)) {
                            fprintf(stderr, "bench: %s\n", err.msg);
                            exit(1);
                        }
                    CK(cudaEventRecord(e1, st));
                    double s = ms_of(e0, e1) * 1e-3 / reps;
                    best = s < best ? s : best;
                }
                t[mode] = best;
            }
            unsetenv("EPMOE_CUDA_CUBLASLT");
            if (!fp4)
                grouped_fp8_best[ri] = t[1] < t[2] ? t[1] : t[2];
            /* cuBLASLt: the same FLOPs as one dense FP8 GEMM (m = 2 x I: w1 and w3) */
            void *Bm = dalloc((size_t)M * H), *Dm = dalloc((size_t)2 * I * M * 2);
            fill(Bm, (size_t)M * H, 9, 0, 0);
            double lt_dense = lt_gemm(2 * I, M, H, r.w13, Bm, Dm, 3, false, NULL, NULL, 1, 0);
            CK(cudaFree(Bm));
            CK(cudaFree(Dm));
            const char *fmt = fp4 ? "MXFP4" : "FP8";
            static const char *const path[3] = {"exact", "fast", "fast+cuBLASLt"};
            for (int mode = 0; mode < (fp4 ? 2 : 3); mode++) {
                double tf = flops / t[mode] / 1e12;
                printf("grouped %-5s %-13s rows/expert %3d: %7.1f TFLOP/s; cuBLASLt dense FP8 "
                       "%.1f TFLOP/s (ratio %.3f)\n",
                       fmt, path[mode], R, tf, lt_dense > 0 ? flops / lt_dense / 1e12 : 0,
                       lt_dense > 0 ? lt_dense / t[mode] : 0);
                ROW("| grouped GEMM w1+w3, %s weights, %d rows/expert | %s | %.3f ms | %.1f "
                    "TFLOP/s | %.3f x cuBLASLt FP8 dense, same FLOPs (%.0f TFLOP/s) |\n",
                    fmt, R, path[mode], t[mode] * 1e3, tf, lt_dense > 0 ? lt_dense / t[mode] : 0,
                    lt_dense > 0 ? flops / lt_dense / 1e12 : 0);
            }
            free(h13);
            act_free(&x);
        }
        wset_free(&r);
    }
    for (size_t ri = 0; ri < 3; ri++) {
        int R = rows_per_expert[ri];
        double tb = bench_blockscaled(R);
        double flops = 2.0 * 2.0 * R * E * (double)I * H;
        if (tb > 0) {
            printf("cuBLASLt block-scaled FP8 per expert, %d rows/expert: %.1f TFLOP/s; our best "
                   "FP8 grouped / cuBLASLt = %.3f\n",
                   R, flops / tb / 1e12, tb / grouped_fp8_best[ri]);
            ROW("| cuBLASLt block-scaled FP8, one call per expert, %d rows/expert | - | %.3f ms | "
                "%.1f TFLOP/s | ours (best FP8 path) %.3f x |\n",
                R, tb * 1e3, flops / tb / 1e12, tb / grouped_fp8_best[ri]);
        } else {
            printf("cuBLASLt block-scaled FP8: no algorithm for %d rows/expert\n", R);
            ROW("| cuBLASLt block-scaled FP8, %d rows/expert | - | n/a | n/a | - |\n", R);
        }
    }
    cublasLtDestroy(lt);
    CK(cudaFree(lt_ws));
}

/* ---- 4. the whole layer ---- */

static uint8_t *hrand(size_t n, uint64_t seed, int lo, int span)
{
    uint8_t *p = (uint8_t *)malloc(n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint8_t v = (uint8_t)(s >> 24);
        p[i] = span ? (uint8_t)(lo + v % span) : ((v & 0x7F) == 0x7F ? 0x38 : v);
    }
    return p;
}

static void bench_layer(void)
{
    mc_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = H;
    c.moe_intermediate_size = I;
    c.n_routed_experts = E;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = TOPK;
    c.num_hidden_layers = 1;
    c.vocab_size = 1024;
    c.routed_scaling_factor = 1.5f;
    c.swiglu_limit = 10.0f;
    c.rms_norm_eps = 1e-6f;
    c.norm_topk_prob = true;
    c.expert_dtype = MC_FP4;
    c.expert_dtype_given = true;
    c.scale_e8m0 = true;
    c.act_ue8m0 = true;
    /* one expert's bytes, loaded 256 times */
    uint8_t *w13 = hrand((size_t)I * H / 2, 1, 0, 0), *s13 = hrand((size_t)I * H / 32, 2, 118, 8);
    uint8_t *w2 = hrand((size_t)H * I / 2, 3, 0, 0), *s2 = hrand((size_t)H * I / 32, 4, 118, 8);
    uint8_t *sw = hrand((size_t)I * H, 5, 0, 0),
            *ss = hrand((size_t)(I / 128) * (H / 128), 6, 118, 8);
    uint16_t *norm = (uint16_t *)malloc((size_t)H * 2),
             *gate = (uint16_t *)malloc((size_t)E * H * 2);
    float *bias = (float *)calloc(E, 4);
    for (int i = 0; i < H; i++)
        norm[i] = fmt_f32_to_bf16(1.0f);
    uint64_t s = 7;
    for (size_t i = 0; i < (size_t)E * H; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        gate[i] = fmt_f32_to_bf16((float)((int)(s % 2001) - 1000) * 1e-5f);
    }
    mb_linear *ex = (mb_linear *)calloc((size_t)E * 3, sizeof *ex);
    for (int e = 0; e < E; e++) {
        ex[3 * e + 0] = {MB_W_MXFP4, I, H, w13, s13, true, "w1"};
        ex[3 * e + 1] = {MB_W_MXFP4, I, H, w13, s13, true, "w3"};
        ex[3 * e + 2] = {MB_W_MXFP4, H, I, w2, s2, true, "w2"};
    }
    mb_layer_src src;
    memset(&src, 0, sizeof src);
    src.layer = 0;
    src.name = "layers.0";
    src.norm = norm;
    src.gate = gate;
    src.bias = bias;
    src.shared[0] = {MB_W_FP8, I, H, sw, ss, true, "shared.w1"};
    src.shared[1] = {MB_W_FP8, I, H, sw, ss, true, "shared.w3"};
    src.shared[2] = {MB_W_FP8, H, I, sw, ss, true, "shared.w2"};
    src.experts = ex;
    static const int Ts[] = {1, 64, 256, 4096};
    for (int mode = 0; mode < 2; mode++) {
        ep_err err;
        mb_options o = {"cuda:0", 0, ISA_AUTO, mode ? MB_GEMM_FAST : MB_GEMM_EXACT};
        o.cuda = *bc_tune();
        mb_backend *be = mb_create(&o, &err);
        if (!be) {
            printf("backend: %s\n", err.msg);
            return;
        }
        uint64_t weights = mb_layer_footprint(be, &c, E);
        double t0 = now_s();
        mb_layer *l = mb_reserve(be, &c, weights, 4096, &err) == 0
                          ? mb_layer_load(be, &c, &src, NULL, NULL, NULL, NULL, &err)
                          : NULL;
        double tl = now_s() - t0;
        if (!l) {
            printf("layer: %s\n", err.msg);
            mb_destroy(&be);
            return;
        }
        printf("layer load (%s): %.2f GB in %.2f s = %.1f GB/s\n", mb_name(be), weights / 1e9, tl,
               weights / 1e9 / tl);
        if (mode == 0)
            ROW("| layer load, 256 experts, from host memory | - | %.2f s | %.1f GB/s | - |\n", tl,
                weights / 1e9 / tl);
        for (size_t i = 0; i < 4; i++) {
            int T = Ts[i];
            uint16_t *x = (uint16_t *)malloc((size_t)T * H * 2),
                     *out = (uint16_t *)malloc((size_t)T * H * 2);
            int32_t *ids = (int32_t *)malloc((size_t)T * TOPK * 4);
            float *w = (float *)malloc((size_t)T * TOPK * 4);
            uint64_t r = 11 + T;
            for (size_t j = 0; j < (size_t)T * H; j++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                x[j] = fmt_f32_to_bf16((float)((int)(r % 2001) - 1000) * 1e-3f);
            }
            int reps = T >= 4096 ? 2 : T >= 256 ? 5 : 20;
            double best = 1e30;
            for (int rep = 0; rep < reps + 1; rep++) {
                double a = now_s();
                if (mb_forward(be, l, T, x, NULL, out, ids, w, &err) != 0) {
                    printf("forward: %s\n", err.msg);
                    break;
                }
                double b = now_s() - a;
                if (rep > 0 && b < best)
                    best = b;
            }
            printf("layer %-5s T=%4d: %.3f ms, %.0f tokens/s\n", mode ? "fast" : "exact", T,
                   best * 1e3, T / best);
            ROW("| whole layer (mb_forward, host in/out), T=%d | %s | %.3f ms | %.0f tokens/s | - "
                "|\n",
                T, mode ? "fast" : "exact", best * 1e3, T / best);
            free(x), free(out), free(ids), free(w);
        }
        mb_layer_free(&l);
        mb_destroy(&be);
    }
    free(w13), free(s13), free(w2), free(s2), free(sw), free(ss), free(norm), free(gate);
    free(bias), free(ex);
}

int main(int argc, char **argv)
{
    mb_device_info info;
    ep_err err;
    D = cudev_cuda_ops(bc_tune()->module, &err);
    memset(&info, 0, sizeof info);
    if (!D || D->open(0, &dev, &info, &err) != 0) {
        printf("bench_cuda: no CUDA device (%s), skipped\n", err.msg);
        return 0;
    }
    st = (cudaStream_t)D->stream(dev);
    const char *only = argc > 1 ? argv[1] : "all";
    printf("device: %s (sm_%d%d, %.0f GiB)\n", info.name, info.sm_major, info.sm_minor,
           (double)info.mem_total / (1 << 30));
    double copy_bps = copy_bandwidth();
    printf("D2D copy bandwidth (read + write): %.0f GB/s\n", copy_bps / 1e9);
    ROW("| what | path | time | rate | ratio |\n|---|---|---|---|---|\n");
    ROW("| device-to-device copy (read + write) | - | - | %.0f GB/s | 1 |\n", copy_bps / 1e9);
    if (!strcmp(only, "all") || !strcmp(only, "decode"))
        bench_decode(copy_bps);
    if (!strcmp(only, "decode-parts"))
        bench_decode_parts(copy_bps);
    if (!strcmp(only, "all") || !strcmp(only, "layer"))
        bench_layer();
    if (!strcmp(only, "all") || !strcmp(only, "gemm"))
        bench_grouped();
    printf("\n%s", table);
    D->close(dev);
    return 0;
}
