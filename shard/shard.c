/*
 * shard.c — the shard loader (shard.h).
 */
#include "shard/shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/limits.h"

static const char *const WNAME[3] = {"w1", "w3", "w2"};

static const st_tensor *find(const st_model *m, const char *prefix, const char *mid,
                             const char *suffix)
{
    char name[EP_MAX_NAME];
    snprintf(name, sizeof name, "%s%s%s", prefix, mid, suffix);
    return st_model_find(m, name);
}

/* Check the contract for the wanted experts: one ck_check_layer call for a contiguous range,
 * else the layer's own tensors and each wanted expert separately (same messages). */
static int check_layer(const st_model *m, const mc_config *c, int layer, const uint8_t *want,
                       ep_err *err)
{
    int E = c->n_routed_experts;
    if (!want)
        return ck_check_layer_shapes(m, c, layer, 0, E, err);
    int first = -1, last = -1, contiguous = 1;
    for (int e = 0; e < E; e++)
        if (want[e]) {
            if (first < 0)
                first = e;
            else if (last != e - 1)
                contiguous = 0;
            last = e;
        }
    if (first < 0)
        return ck_check_layer_shapes(m, c, layer, 0, 0, err);
    if (contiguous)
        return ck_check_layer_shapes(m, c, layer, first, last + 1, err);
    if (ck_check_layer_shapes(m, c, layer, 0, 0, err) < 0)
        return -1;
    for (int e = first; e <= last; e++)
        if (want[e] && ck_check_layer_shapes(m, c, layer, e, e + 1, err) < 0)
            return -1;
    return 0;
}

/* t's bytes in private memory (v's stage), their values checked (docs/numerics.md); kept until
 * shard_view_free or the stage's next view. NULL with err when the file no longer holds them or a
 * value is refused. */
static const void *stage(shard_view *v, const mc_config *c, const st_tensor *t, ep_err *err)
{
    shard_stage *st = v->stage ? v->stage : v->own;
    void *buf = shard_stage_alloc(st, (size_t)t->nbytes);
    if (buf == NULL) {
        ep_err_set(err, "tensor %s: out of memory for %llu bytes", t->name,
                   (unsigned long long)t->nbytes);
        return NULL;
    }
    if (st_tensor_read(t, 0, buf, (size_t)t->nbytes, err) != 0 ||
        ck_check_value_bytes(c, t, buf, err) != 0)
        return NULL;
    v->done += t->nbytes;
    if (v->progress)
        v->progress(v->progress_ctx, v->done);
    return buf;
}

/* Describe one linear (present and of the right dtype and shape: checked before). */
static int view_linear(shard_view *v, const st_model *m, const mc_config *c, const char *prefix,
                       const char *mid, mb_wformat fmt, int N, int K, mb_linear *out, ep_err *err)
{
    const st_tensor *w = find(m, prefix, mid, ".weight");
    const st_tensor *s = find(m, prefix, mid, ".scale");
    if (!w || !s)
        return ep_err_set(err, "tensor %s%s%s is missing", prefix, mid, w ? ".scale" : ".weight");
    out->format = fmt;
    out->N = N;
    out->K = K;
    out->w = stage(v, c, w, err);
    out->scale = out->w ? stage(v, c, s, err) : NULL;
    out->scale_e8m0 = s->dtype == ST_F8_E8M0;
    out->name = w->name;
    return out->scale ? 0 : -1;
}

static int view_router(const st_model *m, const mc_config *c, const char *pfx, shard_view *v,
                       ep_err *err)
{
    const st_tensor *norm = find(m, pfx, "ffn_norm", ".weight");
    const st_tensor *gate = find(m, pfx, "ffn.gate", ".weight");
    const st_tensor *extra = mc_layer_is_hash(c, v->src.layer)
                                 ? find(m, pfx, "ffn.gate", ".tid2eid")
                                 : find(m, pfx, "ffn.gate", ".bias");
    if (!norm || !gate || !extra)
        return ep_err_set(err, "%s: ffn_norm, gate weight or gate bias/tid2eid missing", v->name);
    const void *x = NULL;
    if ((v->src.norm = stage(v, c, norm, err)) == NULL ||
        (v->src.gate = stage(v, c, gate, err)) == NULL || (x = stage(v, c, extra, err)) == NULL)
        return -1;
    if (mc_layer_is_hash(c, v->src.layer))
        v->src.tid2eid = x;
    else
        v->src.bias = x;
    return 0;
}

int shard_view_layer(const st_model *m, const mc_config *c, int layer, const uint8_t *want,
                     shard_view *v, ep_err *err)
{
    *v = (shard_view){.progress = v->progress,
                      .progress_ctx = v->progress_ctx,
                      .skip_shared = v->skip_shared,
                      .stage = v->stage};
    char pfx[EP_MAX_NAME], mid[64];
    if (ck_layer_prefix(c, layer, pfx, sizeof pfx) < 0)
        return ep_err_set(err, "layer %d outside [0, %d)", layer, mc_num_layers(c));
    snprintf(v->name, sizeof v->name, "%.*s", (int)strlen(pfx) - 1, pfx);
    v->src.layer = layer;
    v->src.name = v->name;
    int E = c->n_routed_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    v->experts = calloc((size_t)E * 3, sizeof *v->experts);
    if (!v->experts)
        return ep_err_set(err, "%s: out of memory", v->name);
    v->src.experts = v->experts;
    if (v->stage) {
        shard_stage_reset(v->stage);
    } else if ((v->own = shard_stage_create()) == NULL) {
        ep_err_set(err, "out of memory");
        goto fail;
    }
    if (check_layer(m, c, layer, want, err) < 0 || view_router(m, c, pfx, v, err) < 0)
        goto fail;
    for (int j = 0; j < 3 && !v->skip_shared; j++) {
        int N = j == MB_W2 ? H : I, K = j == MB_W2 ? I : H;
        snprintf(mid, sizeof mid, "ffn.shared_experts.%s", WNAME[j]);
        if (view_linear(v, m, c, pfx, mid, MB_W_FP8, N, K, &v->src.shared[j], err) < 0)
            goto fail;
    }
    mb_wformat fmt = c->expert_dtype == MC_FP4 ? MB_W_MXFP4 : MB_W_FP8;
    for (int e = 0; e < E; e++) {
        if (want && !want[e])
            continue;
        for (int j = 0; j < 3; j++) {
            int N = j == MB_W2 ? H : I, K = j == MB_W2 ? I : H;
            snprintf(mid, sizeof mid, "ffn.experts.%d.%s", e, WNAME[j]);
            if (view_linear(v, m, c, pfx, mid, fmt, N, K, &v->experts[(size_t)e * 3 + j], err) < 0)
                goto fail;
        }
    }
    return 0;
fail:
    ep_err_prefix(err, "loading %s", v->name);
    shard_view_free(v);
    return -1;
}

void shard_view_free(shard_view *v)
{
    shard_stage_free(&v->own);
    free(v->experts);
    v->experts = NULL;
    v->src.experts = NULL;
}

static uint64_t tensor_bytes(const st_model *m, const char *pfx, const char *mid,
                             const char *suffix)
{
    const st_tensor *t = find(m, pfx, mid, suffix);
    return t ? t->nbytes : 0;
}

static uint64_t mlp_bytes(const st_model *m, const char *pfx, const char *what)
{
    char mid[64];
    uint64_t n = 0;
    for (int j = 0; j < 3; j++) {
        snprintf(mid, sizeof mid, "%s.%s", what, WNAME[j]);
        n += tensor_bytes(m, pfx, mid, ".weight") + tensor_bytes(m, pfx, mid, ".scale");
    }
    return n;
}

uint64_t shard_layer_bytes(const st_model *m, const mc_config *c, int layer, const uint8_t *want,
                           const uint8_t *have, bool skip_shared)
{
    char pfx[EP_MAX_NAME], what[48];
    if (ck_layer_prefix(c, layer, pfx, sizeof pfx) < 0)
        return 0;
    uint64_t n =
        tensor_bytes(m, pfx, "ffn_norm", ".weight") + tensor_bytes(m, pfx, "ffn.gate", ".weight") +
        tensor_bytes(m, pfx, "ffn.gate", ".bias") + tensor_bytes(m, pfx, "ffn.gate", ".tid2eid");
    if (!skip_shared)
        n += mlp_bytes(m, pfx, "ffn.shared_experts");
    for (int e = 0; e < c->n_routed_experts; e++) {
        if ((want && !want[e]) || (have && have[e]))
            continue;
        snprintf(what, sizeof what, "ffn.experts.%d", e);
        n += mlp_bytes(m, pfx, what);
    }
    return n;
}

/* shard_load_layer with the copies in stage (NULL: a stage of the load's own) */
static mb_layer *load_layer(mb_backend *be, const st_model *m, const mc_config *c, int layer,
                            const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                            void *progress_ctx, shard_stage *stage, ep_err *err)
{
    shard_view v;
    v.stage = stage;
    /* Only the experts not already held are read (and checked) again. */
    int E = c->n_routed_experts;
    uint8_t *read = calloc((size_t)E, 1);
    if (!read) {
        ep_err_set(err, "out of memory");
        return NULL;
    }
    for (int e = 0; e < E; e++)
        read[e] = (!want || want[e]) && !(reuse && mb_layer_owns(reuse, e));
    mb_layer *l = NULL;
    v.progress = progress;
    v.progress_ctx = progress_ctx;
    v.skip_shared = reuse != NULL; /* the backends take it from reuse */
    if (shard_view_layer(m, c, layer, read, &v, err) == 0) {
        /* want as given (NULL: all), so reused experts are asked for too */
        uint8_t *all = NULL;
        if (!want && (all = malloc((size_t)E)) != NULL)
            memset(all, 1, (size_t)E);
        if (want || all)
            l = mb_layer_load(be, c, &v.src, want ? want : all, reuse, NULL, NULL, err);
        else
            ep_err_set(err, "out of memory");
        free(all);
        shard_view_free(&v);
    }
    free(read);
    return l;
}

mb_layer *shard_load_layer(mb_backend *be, const st_model *m, const mc_config *c, int layer,
                           const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                           void *progress_ctx, ep_err *err)
{
    return load_layer(be, m, c, layer, want, reuse, progress, progress_ctx, NULL, err);
}

moe_layer *shard_load_moe_layer(const st_model *m, const mc_config *c, int layer,
                                const uint8_t *want, isa_level impl, ep_err *err)
{
    shard_view v = {0};
    if (shard_view_layer(m, c, layer, want, &v, err) < 0)
        return NULL;
    moe_layer *l = moe_layer_build(c, &v.src, want, NULL, impl, NULL, NULL, NULL, err);
    shard_view_free(&v);
    return l;
}

/* ---- a whole shard ---- */

typedef struct load_ctx {
    shard_progress_fn progress;
    void *ctx;
    uint64_t base, total;
    int layer, layers;
    int stop;
} load_ctx;

static void layer_progress(void *vctx, uint64_t done)
{
    load_ctx *lc = vctx;
    if (lc->progress && !lc->stop)
        lc->stop = lc->progress(lc->ctx, lc->base + done, lc->total, lc->layer, lc->layers);
}

static void free_layers(mb_layer **out, int n)
{
    for (int l = 0; l < n; l++)
        mb_layer_free(&out[l]);
}

/* Checkpoint bytes each layer's load reads, given what the old layers hold. */
static int plan_bytes(mb_backend *be, const st_model *m, const mc_config *c, const uint8_t *want,
                      mb_layer *const *old, uint64_t *layer_bytes, uint64_t *weights, ep_err *err)
{
    int L = mc_num_layers(c), E = c->n_routed_experts;
    uint8_t *have = calloc((size_t)E, 1);
    if (!have)
        return ep_err_set(err, "out of memory");
    *weights = 0;
    for (int l = 0; l < L; l++) {
        const uint8_t *w = want + (size_t)l * E;
        int n = 0;
        for (int e = 0; e < E; e++) {
            n += w[e] != 0;
            have[e] = old && old[l] && mb_layer_owns(old[l], e);
        }
        *weights += mb_layer_footprint(be, c, n);
        layer_bytes[l] = shard_layer_bytes(m, c, l, w, have, old && old[l]);
    }
    free(have);
    return 0;
}

int shard_load(mb_backend *be, const st_model *m, const mc_config *c, const uint8_t *want,
               mb_layer *const *old, int max_tokens, mb_layer **out, shard_progress_fn progress,
               void *progress_ctx, ep_err *err)
{
    int L = mc_num_layers(c), E = c->n_routed_experts;
    uint64_t weights = 0, *lb = calloc((size_t)L, sizeof *lb);
    for (int l = 0; l < L; l++)
        out[l] = NULL;
    if (!lb)
        return ep_err_set(err, "out of memory");
    load_ctx lc = {.progress = progress, .ctx = progress_ctx, .layers = L};
    /* one stage for every layer: the second and later read into memory the first faulted in */
    shard_stage *stage = shard_stage_create();
    int rc = stage ? plan_bytes(be, m, c, want, old, lb, &weights, err)
                   : ep_err_set(err, "out of memory");
    for (int l = 0; rc == 0 && l < L; l++)
        lc.total += lb[l];
    if (rc == 0)
        rc = mb_reserve(be, c, weights, max_tokens, err);
    for (int l = 0; rc == 0 && l < L; l++) {
        lc.layer = l;
        layer_progress(&lc, 0);
        if (lc.stop) {
            rc = 1;
            break;
        }
        out[l] = load_layer(be, m, c, l, want + (size_t)l * E, old ? old[l] : NULL, layer_progress,
                            &lc, stage, err);
        if (!out[l])
            rc = -1;
        lc.base += lb[l];
    }
    free(lb);
    shard_stage_free(&stage);
    if (rc != 0) {
        free_layers(out, L);
        return rc;
    }
    if (progress)
        progress(progress_ctx, lc.total, lc.total, L, L);
    return 0;
}
