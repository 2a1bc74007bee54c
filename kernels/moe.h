/*
 * moe.h — one DeepSeek V4 MoE layer on the CPU, split at the all-to-all seams (prefix moe_).
 * This is the CPU backend's layer (kernels/cpu/moe.c; kernels/cpu/backend_cpu.c puts it behind
 * kernels/moe_backend.h) and the numeric reference every other backend is checked against.
 *
 * Semantics: docs/numerics.md (profile P-REF of spec §4-§5). The layer is cut where an
 * expert-parallel runtime puts its communication:
 *
 *   origin rank (owns tokens)            owner rank (owns experts)          origin rank
 *   moe_route:  ffn_norm, gate, top-k
 *   moe_quant:  FP8 per-128 (dispatch) -->  moe_experts: w1,w3,SwiGLU,w2  --> moe_combine:
 *   moe_shared: shared expert on own tokens                                   ascending expert
 *                                                                            id, + shared, bf16
 *
 * Every quantity is computed per token, block partial sums are exact and every summation order
 * is fixed, so a token's output is bit-identical for any batch, token order, thread count,
 * vector width and expert placement. moe_forward runs the whole layer in one process and is
 * what `epmoectl forward --local` calls.
 *
 * Shapes: H = hidden_size, I = moe_intermediate_size, E = n_routed_experts, k = top-k.
 * Activations are bf16 (uint16_t bit patterns), row-major.
 *
 * A loaded layer is immutable: any of these functions may run on one layer from several threads
 * at once, each caller with its own tpool (a pool serves one caller at a time).
 */
#ifndef EPMOE_MOE_H
#define EPMOE_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "kernels/gemm.h"
#include "kernels/moe_backend.h"

typedef struct moe_layer moe_layer;

/* Build layer src->layer from its checkpoint tensors (kernels/moe_backend.h's mb_layer_src,
 * host pointers, already checked against the expert-dtype contract — shard/shard.h): ffn_norm,
 * gate weight, bias or tid2eid, the shared expert, and routed expert e when want[e] (want NULL:
 * every expert whose src->experts[3e].w is set). Weights are copied and packed for impl, so
 * src may go away afterwards. With reuse (an older layer of the same index and config), the
 * shared expert and every wanted expert reuse holds are shared with it (reference-counted)
 * instead of packed again; reuse stays fully usable and is freed by its owner whenever it
 * likes. The weights are packed by the threads of pool (may be NULL); progress (may be NULL)
 * is called from the caller's thread only. */
moe_layer *moe_layer_build(const mc_config *c, const mb_layer_src *src, const uint8_t *want,
                           moe_layer *reuse, isa_level impl, tpool *pool, mb_progress_fn progress,
                           void *progress_ctx, ep_err *err);
void moe_layer_free(moe_layer **self_p);
size_t moe_layer_bytes(const moe_layer *l); /* weight memory held */
const mc_config *moe_layer_config(const moe_layer *l);
int moe_layer_index(const moe_layer *l);
int moe_layer_owns(const moe_layer *l, int expert);

/* Route T tokens: x bf16 [T, H] (the MoE block input, before ffn_norm); ids int64 [T] token ids
 * (required on hash layers, ignored otherwise; may be NULL on score layers). Writes xn bf16
 * [T, H] (ffn_norm output, the input of every expert), topk_ids int32 [T, k] (-1 = none) and
 * topk_w f32 [T, k]. The gate may use the threads of pool (may be NULL). Errors: ids missing on
 * a hash layer, an id outside [0, vocab), a tid2eid entry outside [0, E). */
int moe_route(const moe_layer *l, int T, const uint16_t *x, const int64_t *ids, uint16_t *xn,
              int32_t *topk_ids, float *topk_w, tpool *pool, ep_err *err);

/* Quantize xn bf16 [T, H] to the FP8 dispatch format: q e4m3 [T, H], qs f32 [T, H/128]
 * (powers of two when the config's act_ue8m0). */
void moe_quant(const moe_layer *l, int T, const uint16_t *xn, uint8_t *q, float *qs);

/* Routed experts for a batch of pairs: pair p sends row pair_row[p] (of q/qs, n_rows rows) to
 * expert pair_expert[p] (which this layer must own) with routing weight pair_w[p]; out bf16
 * [n_pairs, H] is that expert's output for that row. Pairs may come in any order. */
int moe_experts(const moe_layer *l, int n_rows, const uint8_t *q, const float *qs, int n_pairs,
                const uint32_t *pair_row, const uint32_t *pair_expert, const float *pair_w,
                uint16_t *out, tpool *pool, ep_err *err);

/* The shared expert on T rows: out bf16 [T, H]. Fails only when its scratch memory cannot be
 * allocated. */
int moe_shared(const moe_layer *l, int T, const uint8_t *q, const float *qs, uint16_t *out,
               tpool *pool, ep_err *err);

/* Combine: out[t] = bf16( sum over slots j in ascending order of topk_ids[t][j] (ties: slot
 * order; id -1 skipped) of fp32(eo[t][j]), then + fp32(shared[t]) ), fp32 accumulation from
 * +0. eo bf16 [T, k, H] holds the expert outputs per slot. */
void moe_combine(int T, int k, int H, const int32_t *topk_ids, const uint16_t *eo,
                 const uint16_t *shared, uint16_t *out);

/* The whole layer in one process (this layer must own every expert the tokens select). */
int moe_forward(const moe_layer *l, int T, const uint16_t *x, const int64_t *ids, uint16_t *out,
                int32_t *topk_ids, float *topk_w, tpool *pool, ep_err *err);

#endif
