/*
 * gemm.h — exact block-scaled expert GEMMs: FP8 activations x (FP8-block | MXFP4) weights
 * (prefix gemm_).
 *
 * Canonical definition (docs/numerics.md, spec §5.2/§5.3/§5.8). Activations are M rows of K
 * e4m3 codes with one fp32 scale per 128 channels, a_scale [M, K/128]. For output (m, n):
 *
 *   FP8 block  (W [N, K] e4m3, w_scale [N/128, K/128] fp32, blocks kb of 128 along K):
 *       P   = fp32( exact sum_{k in kb} e4m3(a[m][k]) * e4m3(W[n][k]) )    -- one rounding
 *       sig = a_scale[m][kb] * w_scale[n/128][kb]                          -- fp32 multiply
 *       acc = acc + P * sig                                                -- fp32 mul, fp32 add
 *   MXFP4      (W packed [N, K/2] e2m1 nibbles, low nibble = even k; w_scale [N, K/32] e8m0):
 *       P   = fp32( exact sum_{k in c} e4m3(a[m][k]) * e2m1(W[n][k]) )     -- c: 32-wide block
 *       acc = acc + (P * a_scale[m][c/4]) * 2^(w_scale[n][c] - 127)        -- fp32, in that order
 *
 * acc starts at +0 and takes blocks in increasing K order; out[m][n] = acc (fp32; callers round
 * to bf16). Each block sum fits a double exactly (spec §5.8), so "exact" is well defined and
 * every implementation gives the same bits for any M, thread count or vector width: a row's
 * result never depends on the other rows in the batch. Multiply and add are never fused.
 *
 * Implementations (instruction sets): GEMM_IMPL_REF (plain C, the definition), GEMM_IMPL_AVX2
 * (AVX2+FMA, the floor of the fast paths) and GEMM_IMPL_AVX512 (AVX-512 F/BW/VL/DQ + VNNI).
 * The best one the CPU has is chosen at runtime in one place, gemm_impl_best(); the
 * environment variable EPMOE_ISA=ref|avx2|avx512 caps it (tests and comparisons). A gemm_weight
 * is packed for one implementation; the tests prove every implementation gives the
 * reference's bits.
 */
#ifndef EPMOE_GEMM_H
#define EPMOE_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef enum gemm_impl {
    GEMM_IMPL_AUTO = 0,
    GEMM_IMPL_REF,
    GEMM_IMPL_AVX2,
    GEMM_IMPL_AVX512
} gemm_impl;
#define GEMM_IMPL_COUNT 4 /* AUTO included */

typedef struct gemm_weight gemm_weight;
typedef struct gemm_pool gemm_pool;

/* The best implementation this CPU (and this build) supports: AVX512 when cpuid reports
 * AVX-512 F, BW, VL, DQ and VNNI (with OS support), else AVX2 when it reports AVX2 and FMA, else
 * REF. $EPMOE_ISA (ref, avx2 or avx512) caps the choice: the best supported one at or below
 * it; an unknown value is ignored (gemm_impl_parse lets a daemon refuse it). The older
 * EPMOE_GEMM=ref still selects the reference. */
gemm_impl gemm_impl_best(void);
/* Whether this CPU and build can run impl (AUTO and REF: always). */
int gemm_impl_supported(gemm_impl impl);
/* "auto", "ref", "avx2", "avx512" */
const char *gemm_impl_name(gemm_impl impl);
/* The implementation named name (one of gemm_impl_name's, "auto" included); -1 if none. */
int gemm_impl_parse(const char *name, gemm_impl *impl);

/* Pack weights for impl (AUTO = gemm_impl_best()). Inputs are copied; N % 128 == 0 and
 * K % 128 == 0. w_scale for FP8 is fp32 (callers decode E8M0 checkpoint scales exactly). */
gemm_weight *gemm_pack_fp8(int N, int K, const uint8_t *w, const float *w_scale, gemm_impl impl,
                           ep_err *err);
gemm_weight *gemm_pack_mxfp4(int N, int K, const uint8_t *w_packed, const uint8_t *w_scale,
                             gemm_impl impl, ep_err *err);
void gemm_weight_free(gemm_weight **self_p);
int gemm_weight_n(const gemm_weight *w);
int gemm_weight_k(const gemm_weight *w);
size_t gemm_weight_bytes(const gemm_weight *w); /* memory held */

/* A fixed pool of worker threads used to split a GEMM over N (and over batched calls).
 * nthreads <= 0 means one per online CPU. A pool runs one gemm_run at a time: calls that
 * share a pool must not overlap (calls with pool NULL may run concurrently). */
gemm_pool *gemm_pool_create(int nthreads, ep_err *err);
void gemm_pool_destroy(gemm_pool **self_p);
int gemm_pool_size(const gemm_pool *p);

/* Run fn(ctx, i, tid) once for every i in [0, n) on the threads of pool (tid: the thread,
 * 0 .. gemm_pool_size - 1, so that fn can keep per-thread state); indices are taken in
 * increasing order from a shared counter. pool NULL: in order on the caller. Like gemm_run, it
 * must not overlap another call on the same pool. */
typedef void (*gemm_for_fn)(void *ctx, int i, int tid);
void gemm_pool_for(gemm_pool *pool, int n, gemm_for_fn fn, void *ctx);

/* out [M, N] fp32 = the canonical result above. a [M, K] e4m3, a_scale [M, K/128].
 * pool may be NULL (run on the calling thread). */
void gemm_run(const gemm_weight *w, int M, const uint8_t *a, const float *a_scale, float *out,
              gemm_pool *pool);

/* Several independent GEMMs (e.g. w1 and w3 of every expert of a step) as one parallel pass:
 * the pool's threads take work from all of them, so a step pays one start and one wait instead
 * of one per GEMM, and small GEMMs keep every thread busy. Each job's result is exactly
 * gemm_run's (outputs must not overlap). */
typedef struct gemm_job {
    const gemm_weight *w;
    int M;
    const uint8_t *a;
    const float *a_scale;
    float *out;
} gemm_job;
void gemm_run_many(const gemm_job *jobs, int n, gemm_pool *pool);

#endif
