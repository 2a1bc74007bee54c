/*
 * mkmodel_items.c — the tensors a synthetic checkpoint holds, as items (see mkmodel_internal.h).
 *
 * Layout. The checkpoint is a list of units: embed.weight, the MoE layers (main layers 0..L-1
 * then MTP layers 0..M-1), then head.weight and norm.weight. MoE layer l of n goes to shard
 * l*S/n (S <= n shards), so every shard holds whole, consecutive layers and none is empty; the
 * embedding rides in the first shard, head and norm in the last. A layer's tensors are its MoE
 * tensors in the order of ck_layer_tensors, then the non-MoE tensors a loader must skip.
 * Shards are written one after the other; within a layer, up to `threads` items are generated
 * at once and added to the shard's writer in table order.
 */
#include "ctl/mkmodel_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"

static mk_item *list_push(mk_list *l, ep_err *err)
{
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        mk_item *ni = realloc(l->items, (size_t)cap * sizeof *ni);
        if (ni == NULL) {
            ep_err_set(err, "out of memory for the tensor list");
            return NULL;
        }
        l->items = ni;
        l->cap = cap;
    }
    mk_item *it = &l->items[l->count++];
    memset(it, 0, sizeof *it);
    return it;
}

int64_t mk_item_numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

uint64_t mk_item_bytes(const mk_item *it)
{
    uint64_t b = (uint64_t)mk_item_numel(it->shape, it->ndim) * st_dtype_size(it->dtype);
    if (it->gen == GEN_MXFP4 || it->gen == GEN_FP8)
        b += (uint64_t)mk_item_numel(it->scale_shape, 2) * st_dtype_size(it->scale_dtype);
    return b;
}

int mk_item_tensors(const mk_item *it)
{
    return it->gen == GEN_MXFP4 || it->gen == GEN_FP8 ? 2 : 1;
}

bool mk_has_suffix(const char *s, const char *sfx)
{
    size_t n = strlen(s), m = strlen(sfx);
    return n >= m && strcmp(s + n - m, sfx) == 0;
}

static int push_plain(mk_list *l, const char *name, mk_gen gen, st_dtype dt, int ndim, int64_t d0,
                      int64_t d1, double mean, double std, ep_err *err)
{
    mk_item *it = list_push(l, err);
    if (it == NULL)
        return -1;
    snprintf(it->name, sizeof it->name, "%s", name);
    it->gen = gen;
    it->dtype = dt;
    it->ndim = ndim;
    it->shape[0] = d0;
    it->shape[1] = ndim > 1 ? d1 : 0;
    it->mean = mean;
    it->std = std;
    return 0;
}

/* An FP8 block linear [N, K] named STEM.weight / STEM.scale. */
static int push_fp8(mk_list *l, const char *stem, int64_t N, int64_t K, bool e8m0, ep_err *err)
{
    mk_item *it = list_push(l, err);
    if (it == NULL)
        return -1;
    snprintf(it->name, sizeof it->name, "%s.weight", stem);
    snprintf(it->scale_name, sizeof it->scale_name, "%s.scale", stem);
    it->gen = GEN_FP8;
    it->dtype = ST_F8_E4M3;
    it->scale_dtype = e8m0 ? ST_F8_E8M0 : ST_F32;
    it->ndim = 2;
    it->shape[0] = it->rows = N;
    it->shape[1] = it->cols = K;
    it->scale_shape[0] = N / EP_FP8_BLOCK;
    it->scale_shape[1] = K / EP_FP8_BLOCK;
    it->std = 1.0 / sqrt((double)K);
    return 0;
}

/* The MoE tensors of one layer, from the checker's table: weights pair with the scale that
 * follows them; the rest are told apart by name. */
static int push_moe(mk_list *l, const mc_config *c, int layer, ep_err *err)
{
    int n = ck_layer_tensor_count(c, layer, 0, c->n_routed_experts);
    ck_tensor_spec *t = n > 0 ? calloc((size_t)n, sizeof *t) : NULL;
    if (t == NULL)
        return ep_err_set(err, "out of memory for the tensor table of layer %d", layer);
    int rc = 0;
    if (ck_layer_tensors(c, layer, 0, c->n_routed_experts, t, n) != n) {
        rc = ep_err_set(err, "internal error: tensor table of layer %d", layer);
        goto out;
    }
    const double H = c->hidden_size;
    for (int i = 0; i < n && rc == 0; i++) {
        const ck_tensor_spec *s = &t[i];
        if (s->dtype == ST_I8 || s->dtype == ST_F8_E4M3) {
            if (i + 1 >= n || !mk_has_suffix(t[i + 1].name, ".scale")) {
                rc = ep_err_set(err, "internal error: \"%s\" has no scale after it", s->name);
                break;
            }
            mk_item *it = list_push(l, err);
            if (it == NULL) {
                rc = -1;
                break;
            }
            snprintf(it->name, sizeof it->name, "%s", s->name);
            snprintf(it->scale_name, sizeof it->scale_name, "%s", t[i + 1].name);
            it->gen = s->dtype == ST_I8 ? GEN_MXFP4 : GEN_FP8;
            it->dtype = s->dtype;
            it->scale_dtype = t[i + 1].dtype;
            it->ndim = 2;
            memcpy(it->shape, s->shape, sizeof it->shape);
            memcpy(it->scale_shape, t[i + 1].shape, sizeof it->scale_shape);
            it->rows = s->shape[0];
            it->cols = s->dtype == ST_I8 ? 2 * s->shape[1] : s->shape[1];
            it->std = 1.0 / sqrt((double)it->cols);
            i++;
        } else if (mk_has_suffix(s->name, "ffn_norm.weight")) {
            rc = push_plain(l, s->name, GEN_BF16, s->dtype, s->ndim, s->shape[0], s->shape[1], 1.0,
                            MK_NORM_STD, err);
        } else if (mk_has_suffix(s->name, "gate.weight")) {
            rc = push_plain(l, s->name, GEN_BF16, s->dtype, s->ndim, s->shape[0], s->shape[1], 0.0,
                            1.0 / sqrt(H), err);
        } else if (mk_has_suffix(s->name, "gate.bias")) {
            rc = push_plain(l, s->name, GEN_BIAS, s->dtype, s->ndim, s->shape[0], s->shape[1], 0.0,
                            0.0, err);
        } else if (mk_has_suffix(s->name, "gate.tid2eid")) {
            rc = push_plain(l, s->name, GEN_TID2EID, s->dtype, s->ndim, s->shape[0], s->shape[1],
                            0.0, 0.0, err);
            if (rc == 0)
                l->items[l->count - 1].experts = c->n_routed_experts;
        } else {
            rc = ep_err_set(err, "internal error: no generator for \"%s\"", s->name);
        }
    }
out:
    free(t);
    return rc;
}

/* Non-MoE tensors of a layer: enough of attention, mHC and MTP for a loader to have to skip
 * them (spec §2.3, §2.5), kept small. */
static int push_other(mk_list *l, const mc_config *c, int layer, ep_err *err)
{
    char pfx[32], name[EP_MAX_NAME];
    ck_layer_prefix(c, layer, pfx, sizeof pfx);
    const int64_t H = c->hidden_size;
    if (layer < c->num_hidden_layers) {
        snprintf(name, sizeof name, "%sattn_norm.weight", pfx);
        if (push_plain(l, name, GEN_BF16, ST_BF16, 1, H, 0, 1.0, MK_NORM_STD, err) != 0)
            return -1;
        snprintf(name, sizeof name, "%sattn.wq_a", pfx);
        if (push_fp8(l, name, EP_FP8_BLOCK, H, c->scale_e8m0, err) != 0)
            return -1;
        snprintf(name, sizeof name, "%shc_ffn_fn", pfx);
        if (push_plain(l, name, GEN_F32, ST_F32, 2, MK_HC_ROWS, MK_HC_MULT * H, 0.0,
                       1.0 / sqrt((double)(MK_HC_MULT * H)), err) != 0)
            return -1;
        snprintf(name, sizeof name, "%shc_ffn_base", pfx);
        if (push_plain(l, name, GEN_F32, ST_F32, 1, MK_HC_ROWS, 0, 0.0, 0.1, err) != 0)
            return -1;
        snprintf(name, sizeof name, "%shc_ffn_scale", pfx);
        return push_plain(l, name, GEN_F32, ST_F32, 1, 3, 0, 1.0, 0.1, err);
    }
    static const char *const projs[] = {"e_proj", "h_proj"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s", pfx, projs[i]);
        if (push_fp8(l, name, H, H, c->scale_e8m0, err) != 0)
            return -1;
    }
    static const char *const norms[] = {"enorm", "hnorm", "norm"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s%s.weight", pfx, norms[i]);
        if (push_plain(l, name, GEN_BF16, ST_BF16, 1, H, 0, 1.0, MK_NORM_STD, err) != 0)
            return -1;
    }
    return 0;
}

/* One tensor PFX + SUFFIX: a linear's weight [N, K] (N(0, 1/sqrt(K))), a norm's [N]
 * (1 + N(0, MK_NORM_STD)) or, with F32, an F32 tensor N(mean, std). */
static int push_named(mk_list *l, const char *pfx, const char *suffix, mk_gen gen, int ndim,
                      int64_t d0, int64_t d1, double mean, double std, ep_err *err)
{
    char name[EP_MAX_NAME];
    snprintf(name, sizeof name, "%s%s", pfx, suffix);
    return push_plain(l, name, gen, gen == GEN_F32 ? ST_F32 : ST_BF16, ndim, d0, d1, mean, std,
                      err);
}

static int push_linear(mk_list *l, const char *pfx, const char *stem, int64_t N, int64_t K,
                       ep_err *err)
{
    char suffix[96];
    snprintf(suffix, sizeof suffix, "%s.weight", stem);
    return push_named(l, pfx, suffix, GEN_BF16, 2, N, K, 0.0, 1.0 / sqrt((double)K), err);
}

static int push_norm(mk_list *l, const char *pfx, const char *stem, int64_t N, ep_err *err)
{
    char suffix[96];
    snprintf(suffix, sizeof suffix, "%s.weight", stem);
    return push_named(l, pfx, suffix, GEN_BF16, 1, N, 0, 1.0, MK_NORM_STD, err);
}

/* A compressor (STEM = "attn.compressor" or "attn.indexer.compressor") over head_dim D at ratio
 * r: CSA's (r == MK_CR_CSA) overlaps two windows, so its projections are 2D wide. */
static int push_compressor(mk_list *l, const char *pfx, const char *stem, int r, int64_t D,
                           int64_t H, ep_err *err)
{
    const int64_t W = r == MK_CR_CSA ? 2 * D : D;
    char s[96];
    snprintf(s, sizeof s, "%s.ape", stem);
    if (push_named(l, pfx, s, GEN_F32, 2, r, W, 0.0, 0.02, err) != 0)
        return -1;
    snprintf(s, sizeof s, "%s.norm", stem);
    if (push_norm(l, pfx, s, D, err) != 0)
        return -1;
    snprintf(s, sizeof s, "%s.wgate", stem);
    if (push_linear(l, pfx, s, W, H, err) != 0)
        return -1;
    snprintf(s, sizeof s, "%s.wkv", stem);
    return push_linear(l, pfx, s, W, H, err);
}

/* The hyper-connection of one site ("hc_attn" / "hc_ffn"): fn [24, 4H], base [24], scale [3]. */
static int push_hc(mk_list *l, const char *pfx, const char *site, int64_t H, ep_err *err)
{
    char s[64];
    snprintf(s, sizeof s, "%s_fn", site);
    if (push_named(l, pfx, s, GEN_F32, 2, MK_HC_ROWS, MK_HC_MULT * H, 0.0,
                   1.0 / sqrt((double)(MK_HC_MULT * H)), err) != 0)
        return -1;
    snprintf(s, sizeof s, "%s_base", site);
    if (push_named(l, pfx, s, GEN_F32, 1, MK_HC_ROWS, 0, 0.0, 0.1, err) != 0)
        return -1;
    snprintf(s, sizeof s, "%s_scale", site);
    return push_named(l, pfx, s, GEN_F32, 1, 3, 0, 1.0, 0.1, err);
}

/* --full: a main layer's attention, its norms and both hyper-connections (mkmodel.h). */
static int push_full_layer(mk_list *l, const mc_config *c, int layer, ep_err *err)
{
    char pfx[32];
    ck_layer_prefix(c, layer, pfx, sizeof pfx);
    const int64_t H = c->hidden_size, NH = MK_ATT_HEADS, D = MK_ATT_HEAD_DIM, Q = MK_ATT_Q_LORA;
    const int64_t G = MK_ATT_OGROUPS, O = MK_ATT_O_LORA;
    const int r = mk_compress_ratio(layer);
    if (push_norm(l, pfx, "attn_norm", H, err) != 0 || push_hc(l, pfx, "hc_attn", H, err) != 0 ||
        push_hc(l, pfx, "hc_ffn", H, err) != 0 ||
        push_named(l, pfx, "attn.attn_sink", GEN_F32, 1, NH, 0, 0.0, 0.5, err) != 0 ||
        push_linear(l, pfx, "attn.wq_a", Q, H, err) != 0 ||
        push_norm(l, pfx, "attn.q_norm", Q, err) != 0 ||
        push_linear(l, pfx, "attn.wq_b", NH * D, Q, err) != 0 ||
        push_linear(l, pfx, "attn.wkv", D, H, err) != 0 ||
        push_norm(l, pfx, "attn.norm", D, err) != 0 ||
        push_linear(l, pfx, "attn.wo_a", G * O, NH * D / G, err) != 0 ||
        push_linear(l, pfx, "attn.wo_b", H, G * O, err) != 0)
        return -1;
    if (r != 0 && push_compressor(l, pfx, "attn.compressor", r, D, H, err) != 0)
        return -1;
    if (r != MK_CR_CSA)
        return 0;
    if (push_compressor(l, pfx, "attn.indexer.compressor", r, MK_IDX_HEAD_DIM, H, err) != 0 ||
        push_linear(l, pfx, "attn.indexer.weights_proj", MK_IDX_HEADS, H, err) != 0)
        return -1;
    return push_linear(l, pfx, "attn.indexer.wq_b", MK_IDX_HEADS * MK_IDX_HEAD_DIM, Q, err);
}

int mk_compress_ratio(int i)
{
    return i < 2 ? 0 : (i % 2 ? MK_CR_CSA : MK_CR_HCA);
}

/* A checkpoint is units 0..n+1 (n = mc_num_layers): unit 0 is embed.weight, unit 1+l is MoE
 * layer l, unit n+1 is head.weight and norm.weight (and, full, hc_head_*). */
int mk_unit_count(const mc_config *c)
{
    return mc_num_layers(c) + 2;
}

int mk_unit_shard(const mc_config *c, int u, int S)
{
    const int n = mc_num_layers(c);
    if (u == 0)
        return 0;
    if (u == n + 1)
        return S - 1;
    return (int)((int64_t)(u - 1) * S / n);
}

/* The items of unit u, appended to l in file order. */
int mk_unit_items(const mc_config *c, bool full, int u, mk_list *l, ep_err *err)
{
    const int n = mc_num_layers(c);
    const int64_t H = c->hidden_size, V = c->vocab_size;
    const double sH = 1.0 / sqrt((double)H);
    if (u == 0)
        return push_plain(l, "embed.weight", GEN_BF16, ST_BF16, 2, V, H, 0.0, sH, err);
    if (u == n + 1) {
        if (push_plain(l, "head.weight", GEN_BF16, ST_BF16, 2, V, H, 0.0, sH, err) != 0 ||
            push_plain(l, "norm.weight", GEN_BF16, ST_BF16, 1, H, 0, 1.0, MK_NORM_STD, err) != 0)
            return -1;
        if (!full)
            return 0;
        if (push_named(l, "", "hc_head_fn", GEN_F32, 2, MK_HC_MULT, MK_HC_MULT * H, 0.0,
                       1.0 / sqrt((double)(MK_HC_MULT * H)), err) != 0 ||
            push_named(l, "", "hc_head_base", GEN_F32, 1, MK_HC_MULT, 0, 0.0, 0.1, err) != 0)
            return -1;
        return push_named(l, "", "hc_head_scale", GEN_F32, 1, 1, 0, 1.0, 0.1, err);
    }
    if (push_moe(l, c, u - 1, err) != 0)
        return -1;
    if (full && u - 1 < c->num_hidden_layers)
        return push_full_layer(l, c, u - 1, err);
    return push_other(l, c, u - 1, err);
}
