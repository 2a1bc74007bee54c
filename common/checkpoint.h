/*
 * checkpoint.h — DeepSeek V4 checkpoint names and the expert-dtype contract (prefix ck_).
 *
 * Names are bare (spec §2.2): "layers.L.ffn.experts.E.w1.weight", ".scale", "mtp.I.ffn...".
 * This module knows, for a resolved mc_config, which MoE tensors every layer must hold and with
 * which dtype and shape (spec §2.3, §2.4, §2.5), maps checkpoint names to vLLM's names
 * (spec §2.7), and checks a checkpoint against the contract.
 *
 * Per MoE layer P ("layers.L." or "mtp.I."), with H, I, E from the config:
 *   P ffn_norm.weight                  BF16 [H]
 *   P ffn.gate.weight                  BF16 [E, H]
 *   P ffn.gate.bias                    F32  [E]         score-routed layers only
 *   P ffn.gate.tid2eid                 I64  [vocab, k]  hash layers only
 *   P ffn.experts.e.w1|w3.weight/.scale   fp4: I8 [I, H/2] + F8_E8M0 [I, H/32]
 *                                         fp8: F8_E4M3 [I, H] + F32 [I/128, H/128]
 *   P ffn.experts.e.w2.weight/.scale      fp4: I8 [H, I/2] + F8_E8M0 [H, I/32]
 *                                         fp8: F8_E4M3 [H, I] + F32 [H/128, I/128]
 *   P ffn.shared_experts.w1|w3.weight/.scale  F8_E4M3 [I, H] + (E8M0 if fp4 else F32) [I/128,
 * H/128] P ffn.shared_experts.w2.weight/.scale     F8_E4M3 [H, I] + (E8M0 if fp4 else F32) [H/128,
 * I/128]
 */
#ifndef EPMOE_CHECKPOINT_H
#define EPMOE_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"

/* "layers.L." for a main layer, "mtp.I." for an MTP layer (layer index as in mc_num_layers).
 * Returns the length written, or -1 when the layer is out of range or the name does not fit. */
int ck_layer_prefix(const mc_config *c, int layer, char *buf, size_t cap);

/* Parse an operator's layer name: "L", "layers.L" or "mtp.I" (also "mtp.I." etc. without the
 * trailing dot). A bare "L" is the layer index of mc_num_layers (mtp.I is num_hidden_layers + I,
 * as vLLM numbers it). Errors name the text and the valid range. */
int ck_layer_parse(const mc_config *c, const char *text, int *layer, ep_err *err);

/* Map a checkpoint name to the name vLLM loads it under, exactly as vLLM's DeepSeek V4 mapper
 * does for scales: with fp4, "(\.experts\.\d+\.w[123])\.scale$" -> "\1.weight_scale" and every
 * other ".scale" -> ".weight_scale_inv"; with fp8, every ".scale" -> ".weight_scale_inv". Main
 * and MTP layers alike; any other name is returned unchanged. Returns the length written, or
 * -1 when it does not fit in cap. */
int ck_map_name(const char *name, mc_expert_dtype dt, char *out, size_t cap);

/* Expected dtype and shape of one tensor. */
typedef struct ck_tensor_spec {
    char name[EP_MAX_NAME];
    st_dtype dtype;
    int ndim;
    int64_t shape[2];
} ck_tensor_spec;

/* The MoE tensors of one layer that a worker owning experts [e_begin, e_end) needs: ffn_norm,
 * gate weight, bias or tid2eid, the shared expert, and w1/w2/w3 weight+scale of each owned
 * expert. Returns the count written (at most cap), or -1 if cap is too small. Use
 * ck_layer_tensor_count for the size. */
int ck_layer_tensors(const mc_config *c, int layer, int e_begin, int e_end, ck_tensor_spec *out,
                     int cap);
int ck_layer_tensor_count(const mc_config *c, int layer, int e_begin, int e_end);

/* Check that the checkpoint holds every tensor of ck_layer_tensors with the expected dtype and
 * shape. The first mismatch fails with a message naming the tensor, the expected and the found
 * dtype/shape, and the expert dtype in force — and, when the found tensors are those of the
 * other expert dtype, says so (e.g. FP8 experts under a config that omits expert_dtype). Then
 * every tensor's values (ck_check_values). inspect and the worker's loader both run this check,
 * so a checkpoint inspect passes is one every worker loads. */
int ck_check_layer(const st_model *m, const mc_config *c, int layer, int e_begin, int e_end,
                   ep_err *err);
/* The same without the values: for a loader that checks the values in the bytes it has read
 * (ck_check_value_bytes), so they are read once. */
int ck_check_layer_shapes(const st_model *m, const mc_config *c, int layer, int e_begin, int e_end,
                          ep_err *err);
/* Every layer, every expert. */
int ck_check_model(const st_model *m, const mc_config *c, ep_err *err);
/* Every layer, every expert, headers only (ck_check_layer_shapes): what the coordinator checks
 * before it starts, so a checkpoint no worker could load is refused once, with the message a
 * worker would give. */
int ck_check_model_shapes(const st_model *m, const mc_config *c, ep_err *err);

/* The value policy (docs/numerics.md, "NaN and Inf"), one for inspect, the loader, forward
 * --local and the cluster. Weights: no NaN or Inf in BF16 or F32 tensors (ffn_norm, gate weight
 * and bias, F32 block scales), no E8M0 scale code 255 (NaN), no E4M3 NaN code (0x7f, 0xff) in
 * FP8 weights, every tid2eid entry in [0, E). The bytes are read with st_tensor_read (a file
 * truncated since it was opened fails with a message). The message names the tensor and the
 * element. */
int ck_check_values(const mc_config *c, const st_tensor *t, ep_err *err);
/* The same over t's bytes already in memory (t->nbytes of them). */
int ck_check_value_bytes(const mc_config *c, const st_tensor *t, const void *bytes, ep_err *err);
/* Inputs: hidden states x bf16 [T, H] (any alignment) must be finite. The message names the token
 * (counted from token_base, so a chunk reports its tokens' indices in the whole request) and the
 * channel. */
int ck_check_input(const void *x, int T, int H, int token_base, ep_err *err);

/* The tensor named name, or NULL when absent; ctx is the lookup's own state (an st_model for
 * ck_check_layer, an in-memory table in tests). */
typedef const st_tensor *(*ck_lookup_fn)(const void *ctx, const char *name);
/* ck_check_layer over any lookup: same checks, same messages. Routed experts are checked before
 * the other tensors, so a checkpoint of the other expert dtype is reported on an expert tensor. */
int ck_check_layer_with(ck_lookup_fn lookup, const void *ctx, const mc_config *c, int layer,
                        int e_begin, int e_end, ep_err *err);

#endif
