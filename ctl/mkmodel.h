/*
 * mkmodel.h — write a synthetic DeepSeek V4 checkpoint (prefix mk_).
 *
 * The checkpoint is what `epmoectl inspect`, the coordinator and the workers read from a real
 * model directory (spec §1, §2): config.json, safetensors shards with every MoE tensor of every
 * main and MTP layer under its exact name, dtype and shape (the table of ck_layer_tensors, so
 * the generator and the checker share one contract), a few non-MoE tensors a loader must skip,
 * and model.safetensors.index.json when there is more than one shard.
 *
 * Formats (spec §3): expert_dtype fp4 -> routed experts MXFP4 (I8 nibbles + E8M0 per 32),
 * every FP8 linear with E8M0 block scales 2^ceil(log2(amax/448)); fp8 -> routed experts and
 * every FP8 linear FP8 E4M3 with F32 block scales amax/448 (Flash-Base). Scales come from the
 * data of each block or group.
 *
 * Values: Gaussian weights N(0, 1/sqrt(K)) (K = input features), ffn_norm 1 + N(0, 0.05),
 * gate N(0, 1/sqrt(H)), gate.bias 8 + U(-0.05, 0.05), tid2eid rows of top-k distinct uniform
 * expert ids. Every tensor's bytes depend only on the seed and the tensor's name: the same
 * options give byte-identical files on every host (the generator uses integer PRNG state and
 * IEEE basic operations only, no libm), and the shard count does not change any tensor.
 *
 * Full (--full): beside the MoE tensors, every tensor transformers' DeepseekV4ForCausalLM
 * (transformers 5.23) loads, in DeepSeek's original names (what its conversion_mapping.py
 * renames from): per main layer attn_norm, hc_attn_{fn,base,scale}, hc_ffn_*, attn.{attn_sink,
 * wq_a, q_norm, wq_b, wkv, norm, wo_a, wo_b}, the compressor of HCA/CSA layers (compress ratio
 * 128/4) and the indexer of CSA layers; embed, head, norm and hc_head_{fn,base,scale}; attention
 * sized by the MK_ATT_* constants (tiny, so a CPU runs generate()). Those tensors are BF16
 * (F32: attn_sink, ape, hc_*); MTP layers keep the short set (transformers ignores mtp.*). The
 * names and shapes were read from DeepseekV4ForCausalLM(config).save_pretrained(), which writes
 * the original names; python/tests/test_transformers.py loads the result and asserts nothing is
 * missing, unexpected or mismatched.
 *
 * Memory: shards are written one at a time; tensors are generated a few at a time (one per
 * thread) and handed to the shard's writer, so the peak is one shard's data plus one tensor per
 * thread.
 */
#ifndef EPMOE_CTL_MKMODEL_H
#define EPMOE_CTL_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"

typedef struct mk_options {
    const char *out_dir;          /* created if missing; its parent must exist */
    mc_expert_dtype expert_dtype; /* format of the tensors */
    bool omit_expert_dtype;       /* leave "expert_dtype" out of config.json (tensors unchanged) */
    bool full;                    /* also every tensor a DeepseekV4ForCausalLM needs (see below) */
    bool force;                   /* write into a non-empty out_dir (see mk_write_model) */
    int hidden;                   /* H, multiple of 128 */
    int inter;                    /* I, multiple of 128 */
    int experts;                  /* E routed experts */
    int topk;                     /* experts per token, <= E */
    int layers;                   /* main MoE layers */
    int hash_layers;              /* of which the first hash_layers are hash-routed */
    int mtp;                      /* MTP layers */
    int vocab;                    /* rows of tid2eid, embed and head */
    int shards;                   /* 1: model.safetensors; N > 1: N shards + index */
    uint64_t seed;                /* PRNG seed */
    int threads;                  /* generator threads; 0: one per online CPU. The bytes
                                     written do not depend on it. */
} mk_options;

/* Most generator threads (each holds one tensor being generated). */
#define MK_MAX_THREADS 64

/* The defaults: fp4, H 256, I 128, 16 experts, top-6, 4 layers (1 hash), 1 MTP layer,
 * vocab 1000, 2 shards, seed 1, threads 0 (all CPUs); out_dir NULL. */
void mk_options_init(mk_options *o);

/* What mk_write_model will write for o. */
typedef struct mk_plan {
    int tensors;    /* tensors in all shards */
    uint64_t bytes; /* tensor data bytes (the index's total_size) */
    int shards;     /* files model-*.safetensors (or 1: model.safetensors) */
} mk_plan;

/* Validate o and size the checkpoint. The sizes are checked by building the mc_config the
 * checkpoint will have and running mc_validate, so the rules are exactly config.json's; a
 * message names the option, e.g. "--hidden 100: expected a positive multiple of 128
 * (config.json field "hidden_size")". Also: out_dir given, shards in [1, layers + mtp] (shards
 * hold whole layers). plan may be NULL. */
int mk_check(const mk_options *o, mk_plan *plan, ep_err *err);

/* Threads mk_write_model uses for o: o->threads, or the online CPUs when 0, at most
 * MK_MAX_THREADS. */
int mk_threads(const mk_options *o);

/* The resolved config the written checkpoint describes (as the tensors are: expert_dtype_given
 * is true even with omit_expert_dtype, whose config.json resolves to fp4-assumed instead). */
int mk_config(const mk_options *o, mc_config *out, ep_err *err);

/* Write the checkpoint into o->out_dir: shards first, then the index, then config.json last,
 * so a directory with a config.json is complete. out_dir is created when missing (not its
 * parents). A non-empty out_dir is refused unless o->force; with force, config.json,
 * model.safetensors.index.json and every *.safetensors (and *.tmp of those) in it are removed
 * first, so no stale shard or index survives; other files are left alone. Fails when the file
 * system has less free space than the checkpoint needs. Errors name the path. */
int mk_write_model(const mk_options *o, ep_err *err);

#endif
