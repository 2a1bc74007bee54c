/*
 * moe_gen.c — random MoE checkpoints for tests and benchmarks (moe_gen.h).
 */
#include "moe_gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/limits.h"
#include "common/safetensors_writer.h"
#include "kernels/formats.h"

uint64_t gen_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

double gen_unit(uint64_t *s)
{
    return (double)(gen_rand(s) >> 11) / 4503599627370496.0 - 1.0;
}

mc_config gen_config(mc_expert_dtype dt, int H, int I, int E, int k, int vocab)
{
    mc_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = H;
    c.moe_intermediate_size = I;
    c.n_routed_experts = E;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = k;
    c.num_hidden_layers = 3;
    c.num_hash_layers = 1;
    c.num_nextn_predict_layers = 1;
    c.vocab_size = vocab;
    c.routed_scaling_factor = 1.5f;
    c.swiglu_limit = 10.0f;
    c.rms_norm_eps = 1e-6f;
    c.norm_topk_prob = true;
    c.expert_dtype = dt;
    c.expert_dtype_given = true;
    c.scale_e8m0 = dt == MC_FP4;
    c.act_ue8m0 = true;
    return c;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) {
        fprintf(stderr, "moe_gen: out of memory\n");
        abort();
    }
    return p;
}

/* Draw W [N, K] with std sigma (uniform), rows scaled by 2^(-1..1) so that scales differ, and
 * quantize it the way the checkpoint stores it. */
static void make_linear(gen_linear *l, int N, int K, bool mxfp4, bool e8m0, float sigma,
                        uint64_t *rs)
{
    l->N = N;
    l->K = K;
    l->mxfp4 = mxfp4;
    l->e8m0 = e8m0;
    float *x = xcalloc((size_t)N * K, sizeof(float));
    double amp = sigma * sqrt(3.0);
    for (int n = 0; n < N; n++) {
        double rowamp = amp * ldexp(1.0, (int)(gen_rand(rs) % 3) - 1);
        for (int k = 0; k < K; k++)
            x[(size_t)n * K + k] = (float)(gen_unit(rs) * rowamp);
    }
    if (mxfp4) {
        l->w = xcalloc((size_t)N * K / 2, 1);
        l->s8 = xcalloc((size_t)N * K / 32, 1);
        for (int n = 0; n < N; n++)
            fmt_mxfp4_quant_row(x + (size_t)n * K, K, l->w + (size_t)n * K / 2,
                                l->s8 + (size_t)n * K / 32);
        free(x);
        return;
    }
    int nb = N / 128, kb = K / 128;
    l->w = xcalloc((size_t)N * K, 1);
    if (e8m0)
        l->s8 = xcalloc((size_t)nb * kb, 1);
    else
        l->s32 = xcalloc((size_t)nb * kb, sizeof(float));
    for (int bn = 0; bn < nb; bn++)
        for (int bk = 0; bk < kb; bk++) {
            float amax = 0.0f;
            for (int n = bn * 128; n < bn * 128 + 128; n++)
                for (int k = bk * 128; k < bk * 128 + 128; k++)
                    amax = fmaxf(amax, fabsf(x[(size_t)n * K + k]));
            float s;
            if (e8m0) {
                uint8_t c = fmt_e8m0_ceil(amax / 448.0f);
                l->s8[bn * kb + bk] = c;
                s = fmt_e8m0_to_f32(c);
            } else {
                s = amax / 448.0f;
                l->s32[bn * kb + bk] = s;
            }
            for (int n = bn * 128; n < bn * 128 + 128; n++)
                for (int k = bk * 128; k < bk * 128 + 128; k++)
                    l->w[(size_t)n * K + k] = fmt_f32_to_e4m3(x[(size_t)n * K + k] / s);
        }
    free(x);
}

static void free_linear(gen_linear *l)
{
    free(l->w);
    free(l->s8);
    free(l->s32);
}

static uint16_t bf16_of(double v)
{
    return fmt_f32_to_bf16((float)v);
}

static void make_layer(const mc_config *c, int li, const gen_opts *o, int made, gen_layer *L,
                       uint64_t *rs)
{
    int H = c->hidden_size, I = c->moe_intermediate_size, E = c->n_routed_experts;
    int k = c->num_experts_per_tok;
    float s13 = o->w13_sigma > 0 ? o->w13_sigma : 0.2f;
    float s2 = o->w2_sigma > 0 ? o->w2_sigma : 0.05f;
    L->hash = mc_layer_is_hash(c, li);
    L->norm = xcalloc((size_t)H, 2);
    for (int h = 0; h < H; h++)
        L->norm[h] = bf16_of(1.0 + 0.25 * gen_unit(rs));
    L->gate = xcalloc((size_t)E * H, 2);
    double gs = 2.0 / sqrt((double)H);
    for (size_t i = 0; i < (size_t)E * H; i++)
        L->gate[i] = bf16_of(gs * gen_unit(rs));
    if (L->hash) {
        L->tid2eid = xcalloc((size_t)c->vocab_size * k, sizeof(int64_t));
        int perm[MC_MAX_EXPERTS];
        for (int v = 0; v < c->vocab_size; v++) {
            for (int e = 0; e < made; e++)
                perm[e] = e;
            for (int j = 0; j < k; j++) { /* k distinct materialised experts, random order */
                int r = j + (int)(gen_rand(rs) % (uint64_t)(made - j));
                int tmp = perm[j];
                perm[j] = perm[r];
                perm[r] = tmp;
                L->tid2eid[(size_t)v * k + j] = perm[j];
            }
        }
    } else {
        L->bias = xcalloc((size_t)E, sizeof(float));
        for (int e = 0; e < E; e++) /* a few distinct values near the real ~8.08 */
            L->bias[e] = e < made ? 8.0f + ldexpf((float)(gen_rand(rs) % 5), -12) : o->bias_unmade;
    }
    L->experts = xcalloc((size_t)E * 3, sizeof(gen_linear));
    bool fp4 = c->expert_dtype == MC_FP4;
    for (int e = 0; e < made; e++)
        for (int j = 0; j < 3; j++) {
            int N = j == 2 ? H : I, K = j == 2 ? I : H;
            make_linear(&L->experts[e * 3 + j], N, K, fp4, false, j == 2 ? s2 : s13, rs);
        }
    for (int j = 0; j < 3; j++) {
        int N = j == 2 ? H : I, K = j == 2 ? I : H;
        make_linear(&L->shared[j], N, K, false, c->scale_e8m0, j == 2 ? s2 : s13, rs);
    }
}

gen_model *gen_model_create(const mc_config *c, const gen_opts *o)
{
    gen_model *g = xcalloc(1, sizeof *g);
    g->cfg = *c;
    g->n_layers = mc_num_layers(c);
    g->experts_made = o->experts_made > 0 && o->experts_made < c->n_routed_experts
                          ? o->experts_made
                          : c->n_routed_experts;
    g->layers = xcalloc((size_t)g->n_layers, sizeof(gen_layer));
    uint64_t rs = o->seed ? o->seed : 0x243F6A8885A308D3ull;
    for (int l = 0; l < g->n_layers; l++)
        make_layer(c, l, o, g->experts_made, &g->layers[l], &rs);
    return g;
}

void gen_model_free(gen_model **self_p)
{
    if (!self_p || !*self_p)
        return;
    gen_model *g = *self_p;
    int E = g->cfg.n_routed_experts;
    for (int l = 0; l < g->n_layers; l++) {
        gen_layer *L = &g->layers[l];
        free(L->norm);
        free(L->gate);
        free(L->bias);
        free(L->tid2eid);
        for (int i = 0; i < E * 3; i++)
            free_linear(&L->experts[i]);
        free(L->experts);
        for (int j = 0; j < 3; j++)
            free_linear(&L->shared[j]);
    }
    free(g->layers);
    free(g);
    *self_p = NULL;
}

int gen_config_write(const mc_config *c, const char *path, ep_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return ep_err_errno(err, "%s", path);
    fprintf(f,
            "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
            " \"hidden_size\": %d, \"moe_intermediate_size\": %d, \"n_routed_experts\": %d,\n"
            " \"n_shared_experts\": 1, \"num_experts_per_tok\": %d, \"num_hidden_layers\": %d,\n"
            " \"num_hash_layers\": %d, \"num_nextn_predict_layers\": %d, \"vocab_size\": %d,\n"
            " \"routed_scaling_factor\": %.9g, \"swiglu_limit\": %.9g, \"rms_norm_eps\": %.9g,\n"
            " \"norm_topk_prob\": %s, \"scoring_func\": \"sqrtsoftplus\", \"topk_method\": "
            "\"noaux_tc\",\n \"hidden_act\": \"silu\",%s%s%s\n"
            " \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
            "\"weight_block_size\": [128, 128]%s}}\n",
            c->hidden_size, c->moe_intermediate_size, c->n_routed_experts, c->num_experts_per_tok,
            c->num_hidden_layers, c->num_hash_layers, c->num_nextn_predict_layers, c->vocab_size,
            (double)c->routed_scaling_factor, (double)c->swiglu_limit, (double)c->rms_norm_eps,
            c->norm_topk_prob ? "true" : "false",
            c->expert_dtype_given ? " \"expert_dtype\": \"" : "",
            c->expert_dtype_given ? mc_dtype_name(c->expert_dtype) : "",
            c->expert_dtype_given ? "\"," : "", c->act_ue8m0 ? ", \"scale_fmt\": \"ue8m0\"" : "");
    if (fclose(f) != 0)
        return ep_err_errno(err, "%s", path);
    return 0;
}

static int add(st_writer *w, const char *prefix, const char *name, st_dtype dt, int ndim,
               int64_t d0, int64_t d1, const void *data, ep_err *err)
{
    char full[EP_MAX_NAME];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    int64_t shape[2] = {d0, d1};
    return st_writer_add(w, full, dt, ndim, shape, data, err);
}

static int add_linear(st_writer *w, const char *prefix, const char *name, const gen_linear *l,
                      ep_err *err)
{
    char wn[128], sn[128];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(sn, sizeof sn, "%s.scale", name);
    if (l->mxfp4)
        return add(w, prefix, wn, ST_I8, 2, l->N, l->K / 2, l->w, err) ||
               add(w, prefix, sn, ST_F8_E8M0, 2, l->N, l->K / 32, l->s8, err);
    if (add(w, prefix, wn, ST_F8_E4M3, 2, l->N, l->K, l->w, err))
        return -1;
    if (l->e8m0)
        return add(w, prefix, sn, ST_F8_E8M0, 2, l->N / 128, l->K / 128, l->s8, err);
    return add(w, prefix, sn, ST_F32, 2, l->N / 128, l->K / 128, l->s32, err);
}

static const char *const WN[3] = {"w1", "w3", "w2"};

int gen_model_write(const gen_model *g, const char *dir, ep_err *err)
{
    const mc_config *c = &g->cfg;
    char path[EP_MAX_PATH];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (gen_config_write(c, path, err) < 0)
        return -1;
    st_writer *w = st_writer_create();
    if (!w)
        return ep_err_set(err, "out of memory");
    int rc = -1;
    int H = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok;
    for (int l = 0; l < g->n_layers; l++) {
        const gen_layer *L = &g->layers[l];
        char pfx[64], name[128];
        ck_layer_prefix(c, l, pfx, sizeof pfx);
        if (add(w, pfx, "ffn_norm.weight", ST_BF16, 1, H, 0, L->norm, err) ||
            add(w, pfx, "ffn.gate.weight", ST_BF16, 2, E, H, L->gate, err))
            goto out;
        if (L->hash ? add(w, pfx, "ffn.gate.tid2eid", ST_I64, 2, c->vocab_size, k, L->tid2eid, err)
                    : add(w, pfx, "ffn.gate.bias", ST_F32, 1, E, 0, L->bias, err))
            goto out;
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "ffn.shared_experts.%s", WN[j]);
            if (add_linear(w, pfx, name, &L->shared[j], err))
                goto out;
        }
        for (int e = 0; e < g->experts_made; e++)
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "ffn.experts.%d.%s", e, WN[j]);
                if (add_linear(w, pfx, name, &L->experts[e * 3 + j], err))
                    goto out;
            }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = st_writer_write(w, path, err);
out:
    st_writer_destroy(&w);
    return rc;
}

void gen_model_remove(const char *dir)
{
    char p[EP_MAX_PATH + 32];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}
