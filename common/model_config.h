/*
 * model_config.h — the resolved DeepSeek V4 model config (prefix mc_).
 *
 * The coordinator parses the checkpoint's config.json (spec §1) into an mc_config, validates
 * every field the MoE layer needs, resolves the expert dtype, and broadcasts the result with
 * its content hash; workers never read config.json themselves.
 *
 * expert_dtype (spec §1.2) is read from the top level (DeepSeek, vLLM) and from
 * quantization_config.expert_dtype (transformers 5.23); both present must agree. Neither -> fp4
 * (expert_dtype_given = false: "defaulted"); "fp4" -> MXFP4 routed experts and E8M0 scales on
 * every other FP8 linear; "fp8" -> FP8-block routed experts and F32 scales everywhere; any other
 * value or type -> error
 *   unsupported expert_dtype "X" in FILE: expected one of fp4, fp8
 * The hash layers come from num_hash_layers or from transformers' mlp_layer_types ("hash_moe" x n
 * then "moe"); both present must agree. model_type, when present, must be "deepseek_v4".
 * quantization_config.scale_fmt "float" and norm_topk_prob false are served or refused as
 * docs/numerics.md ("Config fields whose meaning differs between engines") says.
 *
 * Field errors name the field and what was expected, e.g.
 *   FILE: field "hidden_size": expected a positive multiple of 128, found 100
 * JSON syntax errors give FILE:line:column.
 */
#ifndef EPMOE_MODEL_CONFIG_H
#define EPMOE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef enum mc_expert_dtype { MC_FP4 = 0, MC_FP8 = 1 } mc_expert_dtype;

typedef struct mc_config {
    int hidden_size;              /* H, multiple of 128 */
    int moe_intermediate_size;    /* I, multiple of 128 */
    int n_routed_experts;         /* E */
    int n_shared_experts;         /* must be 1 (the reference asserts it) */
    int num_experts_per_tok;      /* top-k, 1..E */
    int num_hidden_layers;        /* MoE layers layers.0 .. layers.(L-1) */
    int num_hash_layers;          /* layers 0 .. num_hash_layers-1 route by tid2eid; <= L */
    int num_nextn_predict_layers; /* MTP blocks mtp.0 .. ; absent -> 0 */
    int vocab_size;               /* rows of tid2eid */
    float routed_scaling_factor;  /* multiplies routing weights (1.5 in V4) */
    float swiglu_limit;           /* SwiGLU clamp (10.0 in V4); > 0 */
    float rms_norm_eps;           /* ffn_norm epsilon (1e-6) */
    bool norm_topk_prob;          /* absent -> true; false is refused (numerics.md) */
    mc_expert_dtype expert_dtype; /* resolved */
    bool expert_dtype_given;      /* false: config.json had no expert_dtype at the top level
                                     or in quantization_config; fp4 was defaulted */
    bool scale_e8m0;              /* FP8-linear weight scales are E8M0 (fp4) rather than F32 */
    bool act_ue8m0;               /* quantization_config.scale_fmt == "ue8m0": activation
                                     scales are rounded up to powers of two (spec §3.4);
                                     absent or "float" (fp8 only): plain F32 scales */
} mc_config;

/* Parse config.json text (len bytes, not necessarily NUL-terminated). srcname names the file
 * in messages. Fills *out only on success. */
int mc_parse(const char *text, size_t len, const char *srcname, mc_config *out, ep_err *err);
/* Read and parse a file (bounded by MC_MAX_CONFIG_BYTES). */
int mc_load(const char *path, mc_config *out, ep_err *err);
/* Validate an mc_config built by other means (a received broadcast): same rules as mc_parse. */
int mc_validate(const mc_config *c, ep_err *err);

/* Canonical text of the resolved config: one "key=value\n" line for every field of mc_config,
 * in declaration order; integers in decimal, floats as "0x%08x" of their IEEE bits, bools as
 * 0/1, expert_dtype by name ("fp4"/"fp8"). Returns the length (snprintf semantics). */
int mc_canonical(const mc_config *c, char *buf, size_t cap);
/* 64-bit FNV-1a of mc_canonical: equal configs hash equal on every host. The hash covers exactly
 * the resolved fields above, not the bytes of config.json: key order, whitespace and fields the
 * MoE layer ignores do not change it; every resolved field (expert_dtype_given included) does. */
uint64_t mc_hash(const mc_config *c);

const char *mc_dtype_name(mc_expert_dtype d); /* "fp4" / "fp8" */
int mc_dtype_parse(const char *s, mc_expert_dtype *out);

/* MoE layers in the checkpoint: num_hidden_layers main layers then the MTP layers. Layer index
 * l in [0, mc_num_layers) names "layers.l" for l < num_hidden_layers, else "mtp.(l - L)". */
int mc_num_layers(const mc_config *c);
/* Hash-routed (tid2eid) layers are main layers below num_hash_layers; MTP never is. */
bool mc_layer_is_hash(const mc_config *c, int layer);

#endif
