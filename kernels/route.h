/*
 * route.h — the router of a DeepSeek V4 MoE layer: ffn_norm, gate logits, scores, top-k or
 * hash selection and routing weights (prefix route_). Spec §4; the bit-exact definitions are in
 * docs/numerics.md §2 and restated at each function.
 *
 * Shapes: T tokens, H = hidden_size, E = n_routed_experts, k = num_experts_per_tok.
 * Activations and the gate weight are bf16 bit patterns (uint16_t), row-major.
 *
 * Every function is defined per token by one fixed sequence of IEEE operations, so a token's
 * result never depends on T, on the other tokens or on the implementation. The implementation
 * argument picks the plain C reference (ISA_REF), the AVX2+FMA fast path (ISA_AVX2)
 * or, for the gate logits, an AVX-512 one (ISA_AVX512; its other steps are AVX2's). AUTO
 * = isa_best(), so EPMOE_ISA selects here too; tests/unit/test_route.c proves they agree
 * bit for bit. Asking for an instruction set the CPU lacks runs the widest it has below it
 * (same bits).
 */
#ifndef EPMOE_ROUTE_H
#define EPMOE_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/isa.h"
#include "kernels/pool.h"

/* The implementation the route functions actually run for impl (AUTO resolved; AVX512 and AVX2
 * only when the CPU has them). */
isa_level route_impl_resolve(isa_level impl);

/* ffn_norm (RMSNorm). x, y bf16 [T, H]; gain bf16 [H]. Per token, with fp32(.) the exact
 * widening of a bf16:
 *   sum  = sum over k = 0..H-1 in ascending order of (double)fp32(x_k)^2   (double adds)
 *   ms   = (float)(sum / (double)H)
 *   r    = 1.0f / sqrtf(ms + eps)                                          (fp32)
 *   y_k  = bf16_rne(fp32(gain_k) * (fp32(x_k) * r))                        (fp32, this order) */
void route_rmsnorm(isa_level impl, int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                   uint16_t *y);

/* Gate weight W bf16 [E, H] repacked for an implementation (the AVX2 layout interleaves
 * experts so that one vector holds four of them). route_gate_bytes is what route_gate_pack
 * writes; dst must be 32-byte aligned. */
size_t route_gate_bytes(isa_level impl, int E, int H);
void route_gate_pack(isa_level impl, int E, int H, const uint16_t *w, void *dst);

/* Gate logits, logits f32 [T, E], from xn bf16 [T, H] and a gate packed for the same impl:
 *   logit[t][e] = (float)( sum over k ascending of (double)fp32(xn[t][k]) * (double)fp32(W[e][k]) )
 * accumulated in double from +0. A product of two bf16 values is exact in double, so a fused
 * multiply-add gives the same bits as a multiply and an add. The AVX-512 path splits the
 * experts over the threads of pool (may be NULL); the others run on the caller. */
void route_logits(isa_level impl, int T, int H, int E, const uint16_t *xn, const void *gate,
                  float *logits, tpool *pool);

/* score = sqrtf(softplus(l)), softplus(l) = l > 20 ? l : log1p(exp(l)), fp32 with exp and
 * log1p correctly rounded (mf_expf, mf_log1pf: kernels/mathf.h), so no host's libm is part of
 * the bits. */
float route_score(float logit);
void route_scores(int n, const float *logits, float *scores);

/* Score routing (layers >= num_hash_layers and every MTP layer): for each token, the k experts
 * with the largest sel[e] = s[e] + bias[e] (fp32 add; bias NULL = no bias), in descending
 * order of sel. Ties go to the lower expert id; NaN ranks below every number (so the choice is
 * a total order and always deterministic). scores f32 [T, E], ids int32 [T, k], 1 <= k <= E.
 * The reference scans E experts k times; the fast path keeps a sorted list in one pass. */
void route_topk(isa_level impl, int T, int E, int k, const float *scores, const float *bias,
                int32_t *ids);

/* Hash routing (main layers < num_hash_layers): ids[t][j] = tid2eid[tokens[t]][j] in stored
 * order. tid2eid int64 [vocab, k]. Errors (nothing else is written after the first bad token):
 * a token id outside [0, vocab), or a table entry outside [0, E); messages name the token
 * index, its id and the bad value. */
int route_hash(int T, int k, int E, int vocab, const int64_t *tokens, const int64_t *tid2eid,
               int32_t *ids, ep_err *err);

/* Routing weights from the unbiased scores: with s_j = scores[t][ids[t][j]] over the slots
 * whose id is not -1 (a -1 slot gets weight 0 and is left out of the sum),
 *   norm:  sum = ((s_0 + s_1) + s_2) + ... in fp32, slot order;  w_j = (s_j / sum) * factor
 *   !norm: w_j = s_j * factor
 * (fp32, in that order). sum == 0 gives NaN weights, as the reference's division does. */
void route_weights(int T, int E, int k, const float *scores, const int32_t *ids, bool norm,
                   float factor, float *w);

#endif
