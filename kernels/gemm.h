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
 * Implementations: one per instruction set (kernels/isa.h): ISA_REF (plain C, the
 * definition, kernels/cpu/gemm_ref.c), ISA_AVX2 and ISA_AVX512 (kernels/cpu/
 * gemm_avx2*.c, gemm_avx512.c). A gemm_weight is packed for one implementation; the tests
 * prove every implementation gives the reference's bits. The calls split over the threads of
 * a pool (kernels/pool.h).
 */
#ifndef EPMOE_GEMM_H
#define EPMOE_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/isa.h"
#include "kernels/pool.h"

typedef struct gemm_weight gemm_weight;

/* Pack weights for impl (AUTO = isa_best()). Inputs are copied; N % 128 == 0 and
 * K % 128 == 0. w_scale for FP8 is fp32 (callers decode E8M0 checkpoint scales exactly). */
gemm_weight *gemm_pack_fp8(int N, int K, const uint8_t *w, const float *w_scale, isa_level impl,
                           ep_err *err);
gemm_weight *gemm_pack_mxfp4(int N, int K, const uint8_t *w_packed, const uint8_t *w_scale,
                             isa_level impl, ep_err *err);
void gemm_weight_free(gemm_weight **self_p);
int gemm_weight_n(const gemm_weight *w);
int gemm_weight_k(const gemm_weight *w);
size_t gemm_weight_bytes(const gemm_weight *w); /* memory held */

/* out [M, N] fp32 = the canonical result above. a [M, K] e4m3, a_scale [M, K/128].
 * pool may be NULL (run on the calling thread). */
void gemm_run(const gemm_weight *w, int M, const uint8_t *a, const float *a_scale, float *out,
              tpool *pool);

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
void gemm_run_many(const gemm_job *jobs, int n, tpool *pool);

#endif
