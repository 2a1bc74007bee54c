/*
 * mkmodel_internal.h — what the files of the checkpoint generator share (prefix mk_): the
 * model's constants, the list of tensor items a checkpoint holds (mkmodel_items.c) and the
 * generation of their values (mkmodel_gen.c). Only ctl/mkmodel*.c include it.
 */
#ifndef EPMOE_CTL_MKMODEL_INTERNAL_H
#define EPMOE_CTL_MKMODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/limits.h"
#include "common/model_config.h"
#include "common/safetensors_writer.h"
#include "ctl/mkmodel.h"

/* Spec §1.1 values every V4 checkpoint has. */
#define MK_ROUTED_SCALING 1.5
#define MK_SWIGLU_LIMIT   10.0
#define MK_RMS_EPS        1e-6
/* Flash's e_score_correction_bias values sit near 8.08; ours are 8 + U(-0.05, 0.05). */
#define MK_BIAS_CENTER 8.0
#define MK_BIAS_HALF   0.05
#define MK_NORM_STD    0.05
/* hc_ffn_fn is [24, hc_mult * H] with hc_mult = 4 (spec §2.3: [24, 16384] at H 4096). */
#define MK_HC_MULT 4
#define MK_HC_ROWS 24
/* --full: the attention of the tiny model (config.json writes the same values). Heads x head_dim
 * is split into MK_ATT_OGROUPS groups for wo_a; compress ratios are MK_CR_CSA (with an indexer)
 * and MK_CR_HCA. */
#define MK_ATT_HEADS    4
#define MK_ATT_HEAD_DIM 64
#define MK_ATT_ROPE_DIM 16
#define MK_ATT_Q_LORA   128
#define MK_ATT_OGROUPS  2
#define MK_ATT_O_LORA   64
#define MK_IDX_HEADS    2
#define MK_IDX_HEAD_DIM 32
#define MK_IDX_TOPK     4
#define MK_ATT_WINDOW   16
#define MK_CR_CSA       4
#define MK_CR_HCA       128

/* ---- tensor items (mkmodel_items.c) ---- */

typedef enum mk_gen {
    GEN_BF16,    /* BF16 mean + N(0, std) */
    GEN_F32,     /* F32 mean + N(0, std) */
    GEN_BIAS,    /* F32 MK_BIAS_CENTER + U(-MK_BIAS_HALF, MK_BIAS_HALF) */
    GEN_TID2EID, /* I64 [vocab, k]: k distinct uniform ids in [0, E) per row */
    GEN_MXFP4,   /* I8 [N, K/2] + F8_E8M0 [N, K/32] from N(0, std) */
    GEN_FP8,     /* F8_E4M3 [N, K] + (F8_E8M0 | F32) [N/128, K/128] from N(0, std) */
} mk_gen;

/* One tensor, or one weight+scale pair (GEN_MXFP4, GEN_FP8). */
typedef struct mk_item {
    char name[EP_MAX_NAME];
    char scale_name[EP_MAX_NAME]; /* pairs only */
    mk_gen gen;
    st_dtype dtype, scale_dtype;
    int ndim;
    int64_t shape[2], scale_shape[2];
    int64_t rows, cols; /* logical [N, K] of a quantized pair */
    double mean, std;
    int experts; /* GEN_TID2EID: E */
} mk_item;

typedef struct mk_list {
    mk_item *items;
    int count, cap;
} mk_list;

int64_t mk_item_numel(const int64_t *shape, int ndim);
uint64_t mk_item_bytes(const mk_item *it);
int mk_item_tensors(const mk_item *it);
bool mk_has_suffix(const char *s, const char *sfx);
/* A checkpoint is units 0..n+1 (n = mc_num_layers): unit 0 is embed.weight, unit 1+l is MoE
 * layer l, unit n+1 is head.weight and norm.weight. */
int mk_unit_count(const mc_config *c);
int mk_unit_shard(const mc_config *c, int u, int S);
/* The items of unit u, appended to l in file order. */
int mk_unit_items(const mc_config *c, bool full, int u, mk_list *l, ep_err *err);
/* The compress ratio of layer i (main then MTP; 0: sliding window only): Flash's pattern, two
 * sliding layers then CSA on odd, HCA on even indices. config.json's compress_ratios. */
int mk_compress_ratio(int i);

/* ---- generation (mkmodel_gen.c) ---- */

/* Generate items[0..n) on up to n threads (the caller's included), then add them to w in
 * order. Every job's buffers are freed, whatever fails. */
int mk_gen_window(const mk_item *items, int n, uint64_t seed, st_writer *w, ep_err *err);

#endif
