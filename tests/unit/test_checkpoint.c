/*
 * test_checkpoint.c — checkpoint names, the per-layer tensor table and the checker (ck_*).
 *
 * Expected names come from the spec (§2.2-§2.7) written out by hand; the vLLM mapping table
 * below was also run through Python's re with vLLM's two regexes, which agreed on every row.
 * The checker runs over an in-memory "checkpoint" that this file builds from the spec's tables
 * (build_layer), independently of ck_layer_tensors; the last test writes it to a real
 * safetensors file and checks it through st_model_open.
 */
#include <stdarg.h>

#include "common/checkpoint.h"
#include <unistd.h>

#include "common/safetensors_model.h"
#include "common/safetensors_writer.h"
#include "test.h"

/* ---- ck_map_name ------------------------------------------------------------------------ */

static const struct {
    const char *name, *fp4, *fp8;
} MAP_CASES[] = {
    /* routed experts, main and MTP layers */
    {"layers.0.ffn.experts.0.w1.scale", "layers.0.ffn.experts.0.w1.weight_scale",
     "layers.0.ffn.experts.0.w1.weight_scale_inv"},
    {"layers.0.ffn.experts.0.w2.scale", "layers.0.ffn.experts.0.w2.weight_scale",
     "layers.0.ffn.experts.0.w2.weight_scale_inv"},
    {"layers.0.ffn.experts.0.w3.scale", "layers.0.ffn.experts.0.w3.weight_scale",
     "layers.0.ffn.experts.0.w3.weight_scale_inv"},
    {"layers.42.ffn.experts.255.w2.scale", "layers.42.ffn.experts.255.w2.weight_scale",
     "layers.42.ffn.experts.255.w2.weight_scale_inv"},
    {"mtp.0.ffn.experts.7.w1.scale", "mtp.0.ffn.experts.7.w1.weight_scale",
     "mtp.0.ffn.experts.7.w1.weight_scale_inv"},
    {"mtp.0.ffn.experts.255.w3.scale", "mtp.0.ffn.experts.255.w3.weight_scale",
     "mtp.0.ffn.experts.255.w3.weight_scale_inv"},
    {"layers.0.ffn.experts.012.w1.scale", "layers.0.ffn.experts.012.w1.weight_scale",
     "layers.0.ffn.experts.012.w1.weight_scale_inv"},
    {".experts.3.w2.scale", ".experts.3.w2.weight_scale", ".experts.3.w2.weight_scale_inv"},
    {"x.experts.3.w2.scale", "x.experts.3.w2.weight_scale", "x.experts.3.w2.weight_scale_inv"},
    /* shared experts and other FP8 linears: always weight_scale_inv */
    {"layers.0.ffn.shared_experts.w1.scale", "layers.0.ffn.shared_experts.w1.weight_scale_inv",
     "layers.0.ffn.shared_experts.w1.weight_scale_inv"},
    {"layers.0.ffn.shared_experts.w2.scale", "layers.0.ffn.shared_experts.w2.weight_scale_inv",
     "layers.0.ffn.shared_experts.w2.weight_scale_inv"},
    {"layers.0.ffn.shared_experts.w3.scale", "layers.0.ffn.shared_experts.w3.weight_scale_inv",
     "layers.0.ffn.shared_experts.w3.weight_scale_inv"},
    {"mtp.0.ffn.shared_experts.w2.scale", "mtp.0.ffn.shared_experts.w2.weight_scale_inv",
     "mtp.0.ffn.shared_experts.w2.weight_scale_inv"},
    {"layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.weight_scale_inv",
     "layers.0.attn.wq_a.weight_scale_inv"},
    {"layers.0.attn.wq_b.scale", "layers.0.attn.wq_b.weight_scale_inv",
     "layers.0.attn.wq_b.weight_scale_inv"},
    {"layers.0.attn.wkv.scale", "layers.0.attn.wkv.weight_scale_inv",
     "layers.0.attn.wkv.weight_scale_inv"},
    {"layers.0.attn.wo_b.scale", "layers.0.attn.wo_b.weight_scale_inv",
     "layers.0.attn.wo_b.weight_scale_inv"},
    {"layers.5.attn.compressor.wkv.scale", "layers.5.attn.compressor.wkv.weight_scale_inv",
     "layers.5.attn.compressor.wkv.weight_scale_inv"},
    {"mtp.0.e_proj.scale", "mtp.0.e_proj.weight_scale_inv", "mtp.0.e_proj.weight_scale_inv"},
    {"mtp.0.h_proj.scale", "mtp.0.h_proj.weight_scale_inv", "mtp.0.h_proj.weight_scale_inv"},
    {"mtp.0.attn.wq_a.scale", "mtp.0.attn.wq_a.weight_scale_inv",
     "mtp.0.attn.wq_a.weight_scale_inv"},
    /* names that do not end in ".scale" are unchanged */
    {"layers.0.ffn.experts.0.w1.weight", "layers.0.ffn.experts.0.w1.weight",
     "layers.0.ffn.experts.0.w1.weight"},
    {"layers.0.ffn.shared_experts.w1.weight", "layers.0.ffn.shared_experts.w1.weight",
     "layers.0.ffn.shared_experts.w1.weight"},
    {"layers.0.hc_ffn_scale", "layers.0.hc_ffn_scale", "layers.0.hc_ffn_scale"},
    {"hc_head_scale", "hc_head_scale", "hc_head_scale"},
    {"mtp.0.hc_attn_scale", "mtp.0.hc_attn_scale", "mtp.0.hc_attn_scale"},
    {"layers.0.ffn.gate.bias", "layers.0.ffn.gate.bias", "layers.0.ffn.gate.bias"},
    {"layers.0.ffn.gate.tid2eid", "layers.0.ffn.gate.tid2eid", "layers.0.ffn.gate.tid2eid"},
    {"layers.0.ffn_norm.weight", "layers.0.ffn_norm.weight", "layers.0.ffn_norm.weight"},
    {"embed.weight", "embed.weight", "embed.weight"},
    {"layers.0.ffn.experts.12.w1.scales", "layers.0.ffn.experts.12.w1.scales",
     "layers.0.ffn.experts.12.w1.scales"},
    {"layers.0.ffn.experts.12.w1_scale", "layers.0.ffn.experts.12.w1_scale",
     "layers.0.ffn.experts.12.w1_scale"},
    {"scale", "scale", "scale"},
    {"", "", ""},
    /* look like routed experts but are not "\.experts\.\d+\.w[123]\.scale$" */
    {"layers.0.ffn.experts.x.w1.scale", "layers.0.ffn.experts.x.w1.weight_scale_inv",
     "layers.0.ffn.experts.x.w1.weight_scale_inv"},
    {"layers.0.ffn.experts.12.w4.scale", "layers.0.ffn.experts.12.w4.weight_scale_inv",
     "layers.0.ffn.experts.12.w4.weight_scale_inv"},
    {"layers.0.ffn.experts.12.w0.scale", "layers.0.ffn.experts.12.w0.weight_scale_inv",
     "layers.0.ffn.experts.12.w0.weight_scale_inv"},
    {"layers.0.ffn.experts..w1.scale", "layers.0.ffn.experts..w1.weight_scale_inv",
     "layers.0.ffn.experts..w1.weight_scale_inv"},
    {"layers.0.ffn.experts.1a.w1.scale", "layers.0.ffn.experts.1a.w1.weight_scale_inv",
     "layers.0.ffn.experts.1a.w1.weight_scale_inv"},
    {"layers.0.ffn.experts.a1.w1.scale", "layers.0.ffn.experts.a1.w1.weight_scale_inv",
     "layers.0.ffn.experts.a1.w1.weight_scale_inv"},
    {"layers.0.ffn.experts.12.w10.scale", "layers.0.ffn.experts.12.w10.weight_scale_inv",
     "layers.0.ffn.experts.12.w10.weight_scale_inv"},
    {"layers.0.ffn.experts.12.xw1.scale", "layers.0.ffn.experts.12.xw1.weight_scale_inv",
     "layers.0.ffn.experts.12.xw1.weight_scale_inv"},
    {"layers.0.ffn.experts.12.w1.scale.scale", "layers.0.ffn.experts.12.w1.scale.weight_scale_inv",
     "layers.0.ffn.experts.12.w1.scale.weight_scale_inv"},
    {"layers.0.ffn.fooexperts.1.w1.scale", "layers.0.ffn.fooexperts.1.w1.weight_scale_inv",
     "layers.0.ffn.fooexperts.1.w1.weight_scale_inv"},
    {"layers.0.ffn.experts1.w1.scale", "layers.0.ffn.experts1.w1.weight_scale_inv",
     "layers.0.ffn.experts1.w1.weight_scale_inv"},
    /* the regex wants a dot before "experts" */
    {"experts.12.w1.scale", "experts.12.w1.weight_scale_inv", "experts.12.w1.weight_scale_inv"},
    {".scale", ".weight_scale_inv", ".weight_scale_inv"},
};

TEST(map_name_follows_vllm)
{
    for (size_t i = 0; i < sizeof MAP_CASES / sizeof MAP_CASES[0]; i++) {
        char out[EP_MAX_NAME];
        int n = ck_map_name(MAP_CASES[i].name, MC_FP4, out, sizeof out);
        CHECK_EQ(n, (int)strlen(MAP_CASES[i].fp4));
        CHECK_STR_EQ(out, MAP_CASES[i].fp4);
        n = ck_map_name(MAP_CASES[i].name, MC_FP8, out, sizeof out);
        CHECK_EQ(n, (int)strlen(MAP_CASES[i].fp8));
        CHECK_STR_EQ(out, MAP_CASES[i].fp8);
    }
}

TEST(map_name_every_scale_of_a_layer)
{
    /* All 3 x 2 routed-expert scales of expert 5 and the shared expert, layer 7 and mtp.0. */
    static const char *const pfx[] = {"layers.7.", "mtp.0."};
    for (int p = 0; p < 2; p++) {
        for (int w = 1; w <= 3; w++) {
            char in[128], want[128], out[128];
            snprintf(in, sizeof in, "%sffn.experts.5.w%d.scale", pfx[p], w);
            snprintf(want, sizeof want, "%sffn.experts.5.w%d.weight_scale", pfx[p], w);
            CHECK(ck_map_name(in, MC_FP4, out, sizeof out) > 0);
            CHECK_STR_EQ(out, want);
            snprintf(want, sizeof want, "%sffn.experts.5.w%d.weight_scale_inv", pfx[p], w);
            CHECK(ck_map_name(in, MC_FP8, out, sizeof out) > 0);
            CHECK_STR_EQ(out, want);
            snprintf(in, sizeof in, "%sffn.shared_experts.w%d.scale", pfx[p], w);
            snprintf(want, sizeof want, "%sffn.shared_experts.w%d.weight_scale_inv", pfx[p], w);
            CHECK(ck_map_name(in, MC_FP4, out, sizeof out) > 0);
            CHECK_STR_EQ(out, want);
            CHECK(ck_map_name(in, MC_FP8, out, sizeof out) > 0);
            CHECK_STR_EQ(out, want);
        }
    }
}

TEST(map_name_reports_a_short_buffer)
{
    const char *in = "layers.0.ffn.experts.0.w1.scale";
    const char *want = "layers.0.ffn.experts.0.w1.weight_scale";
    char out[64];
    size_t len = strlen(want);
    CHECK_EQ(ck_map_name(in, MC_FP4, out, len + 1), (int)len);
    CHECK_STR_EQ(out, want);
    CHECK_EQ(ck_map_name(in, MC_FP4, out, len), -1);
    CHECK_EQ(ck_map_name("abc", MC_FP4, out, 3), -1);
    CHECK_EQ(ck_map_name("abc", MC_FP4, out, 4), 3);
}

/* ---- layers ----------------------------------------------------------------------------- */

/* A small model: H 256, I 128, E 8, top-2, 4 main layers of which 2 hash-routed, 1 MTP layer. */
static mc_config small_config(mc_expert_dtype dt, bool given)
{
    mc_config c = {
        .hidden_size = 256,
        .moe_intermediate_size = 128,
        .n_routed_experts = 8,
        .n_shared_experts = 1,
        .num_experts_per_tok = 2,
        .num_hidden_layers = 4,
        .num_hash_layers = 2,
        .num_nextn_predict_layers = 1,
        .vocab_size = 100,
        .routed_scaling_factor = 1.5f,
        .swiglu_limit = 10.0f,
        .rms_norm_eps = 1e-6f,
        .norm_topk_prob = true,
        .expert_dtype = dt,
        .expert_dtype_given = given,
        .scale_e8m0 = dt == MC_FP4,
        .act_ue8m0 = true,
    };
    return c;
}

static mc_config flash_config(mc_expert_dtype dt)
{
    mc_config c = small_config(dt, true);
    c.hidden_size = 4096;
    c.moe_intermediate_size = 2048;
    c.n_routed_experts = 256;
    c.num_experts_per_tok = 6;
    c.num_hidden_layers = 43;
    c.num_hash_layers = 3;
    c.vocab_size = 129280;
    return c;
}

TEST(layer_prefix)
{
    mc_config c = flash_config(MC_FP4);
    char buf[32];
    CHECK_EQ(ck_layer_prefix(&c, 0, buf, sizeof buf), 9);
    CHECK_STR_EQ(buf, "layers.0.");
    CHECK_EQ(ck_layer_prefix(&c, 42, buf, sizeof buf), 10);
    CHECK_STR_EQ(buf, "layers.42.");
    CHECK_EQ(ck_layer_prefix(&c, 43, buf, sizeof buf), 6);
    CHECK_STR_EQ(buf, "mtp.0.");
    CHECK_EQ(ck_layer_prefix(&c, 44, buf, sizeof buf), -1);
    CHECK_EQ(ck_layer_prefix(&c, -1, buf, sizeof buf), -1);
    CHECK_EQ(ck_layer_prefix(&c, 42, buf, 10), -1); /* no room for the NUL */
    CHECK_EQ(ck_layer_prefix(&c, 42, buf, 11), 10);
}

TEST(layer_parse_accepts_the_three_forms)
{
    mc_config c = flash_config(MC_FP4);
    static const struct {
        const char *text;
        int layer;
    } ok[] = {
        {"0", 0},        {"3", 3},        {"42", 42},       {"43", 43},
        {"layers.0", 0}, {"layers.3", 3}, {"layers.3.", 3}, {"layers.42", 42},
        {"mtp.0", 43},   {"mtp.0.", 43},  {"007", 7},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int l = -1;
        ep_err err;
        CHECK_EQ(ck_layer_parse(&c, ok[i].text, &l, &err), 0);
        CHECK_EQ(l, ok[i].layer);
    }
}

TEST(layer_parse_errors_name_text_and_range)
{
    mc_config c = flash_config(MC_FP4);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"mtp.2", "layer \"mtp.2\": the model has 1 MTP layer (mtp.0)"},
        {"mtp.1", "layer \"mtp.1\": the model has 1 MTP layer (mtp.0)"},
        {"layers.43", "layer \"layers.43\": the model has 43 main layers (layers.0..layers.42)"},
        {"layers.99999999999999999999",
         "layer \"layers.99999999999999999999\": the model has 43 main layers "
         "(layers.0..layers.42)"},
        {"44", "layer \"44\": expected a layer index in [0, 44) (43 main layers then 1 MTP layer)"},
        {"foo", "layer \"foo\": expected L, layers.L or mtp.I (e.g. 3, layers.3, mtp.0)"},
        {"", "layer \"\": expected L, layers.L or mtp.I"},
        {"layers.", "layer \"layers.\": expected L"},
        {"layers.-1", "layer \"layers.-1\": expected L"},
        {"mtp.x", "layer \"mtp.x\": expected L"},
        {"+3", "layer \"+3\": expected L"},
        {" 3", "layer \" 3\": expected L"},
        {"3..", "layer \"3..\": expected L"},
        {"layer.3", "layer \"layer.3\": expected L"},
        {"mtp.0.1", "layer \"mtp.0.1\": expected L"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int l = -7;
        ep_err err;
        CHECK_EQ(ck_layer_parse(&c, bad[i].text, &l, &err), -1);
        CHECK_STR_HAS(err.msg, bad[i].msg);
        CHECK_EQ(l, -7);
    }

    int l;
    ep_err err;
    c.num_nextn_predict_layers = 0;
    CHECK_EQ(ck_layer_parse(&c, "mtp.0", &l, &err), -1);
    CHECK_STR_EQ(err.msg, "layer \"mtp.0\": the model has no MTP layers");
    c.num_nextn_predict_layers = 2;
    CHECK_EQ(ck_layer_parse(&c, "mtp.5", &l, &err), -1);
    CHECK_STR_EQ(err.msg, "layer \"mtp.5\": the model has 2 MTP layers (mtp.0..mtp.1)");
    CHECK_EQ(ck_layer_parse(&c, "mtp.1", &l, &err), 0);
    CHECK_EQ(l, 44);
    c.num_hidden_layers = 1;
    c.num_hash_layers = 0;
    CHECK_EQ(ck_layer_parse(&c, "layers.1", &l, &err), -1);
    CHECK_STR_EQ(err.msg, "layer \"layers.1\": the model has 1 main layer (layers.0)");
}

/* ---- an in-memory checkpoint built from the spec's tables -------------------------------- */

enum { MAX_T = 4096 };
typedef struct ckpt {
    st_tensor t[MAX_T];
    char names[MAX_T][EP_MAX_NAME];
    int n;
} ckpt;

static ckpt g_ck;

static void ck_reset(ckpt *k)
{
    k->n = 0;
}

__attribute__((format(printf, 5, 6))) static void add(ckpt *k, st_dtype dt, int64_t d0, int64_t d1,
                                                      const char *fmt, ...)
{
    if (k->n >= MAX_T) {
        printf("  test bug: checkpoint table full\n");
        exit(1);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->names[k->n], EP_MAX_NAME, fmt, ap);
    va_end(ap);
    st_tensor *t = &k->t[k->n];
    memset(t, 0, sizeof *t);
    t->name = k->names[k->n];
    t->dtype = dt;
    t->ndim = d1 < 0 ? 1 : 2;
    t->shape[0] = d0;
    t->shape[1] = d1 < 0 ? 0 : d1;
    t->numel = d0 * (d1 < 0 ? 1 : d1);
    k->n++;
}

static st_tensor *find(ckpt *k, const char *name)
{
    for (int i = 0; i < k->n; i++)
        if (strcmp(k->names[i], name) == 0)
            return &k->t[i];
    return NULL;
}

static void drop(ckpt *k, const char *name)
{
    for (int i = 0; i < k->n; i++) {
        if (strcmp(k->names[i], name) == 0) {
            k->n--;
            for (int j = i; j < k->n; j++) {
                memcpy(k->names[j], k->names[j + 1], EP_MAX_NAME);
                k->t[j] = k->t[j + 1];
                k->t[j].name = k->names[j];
            }
            return;
        }
    }
    printf("  test bug: no tensor %s to drop\n", name);
    exit(1);
}

static const st_tensor *lookup(const void *ctx, const char *name)
{
    return find((ckpt *)ctx, name);
}

typedef enum expert_layout {
    MXFP4,    /* Flash: I8 packed E2M1 + E8M0 per 32 */
    FP8_F32,  /* Flash-Base: F8_E4M3 + F32 per 128x128 */
    FP8_E8M0, /* converted checkpoints: F8_E4M3 + E8M0 per 128x128 */
} expert_layout;

/* One MoE layer per spec §2.3-§2.5: prefix "layers.L." or "mtp.I."; hash layers carry tid2eid,
 * the others bias; the shared expert's scales are E8M0 when shared_e8m0 else F32. */
static void build_layer(ckpt *k, const mc_config *c, const char *pfx, bool hash, expert_layout lay,
                        bool shared_e8m0, int e_begin, int e_end)
{
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size, E = c->n_routed_experts;
    add(k, ST_BF16, H, -1, "%sffn_norm.weight", pfx);
    add(k, ST_BF16, E, H, "%sffn.gate.weight", pfx);
    if (hash)
        add(k, ST_I64, c->vocab_size, c->num_experts_per_tok, "%sffn.gate.tid2eid", pfx);
    else
        add(k, ST_F32, E, -1, "%sffn.gate.bias", pfx);
    st_dtype ss = shared_e8m0 ? ST_F8_E8M0 : ST_F32;
    add(k, ST_F8_E4M3, I, H, "%sffn.shared_experts.w1.weight", pfx);
    add(k, ss, I / 128, H / 128, "%sffn.shared_experts.w1.scale", pfx);
    add(k, ST_F8_E4M3, I, H, "%sffn.shared_experts.w3.weight", pfx);
    add(k, ss, I / 128, H / 128, "%sffn.shared_experts.w3.scale", pfx);
    add(k, ST_F8_E4M3, H, I, "%sffn.shared_experts.w2.weight", pfx);
    add(k, ss, H / 128, I / 128, "%sffn.shared_experts.w2.scale", pfx);
    for (int e = e_begin; e < e_end; e++) {
        for (int w = 1; w <= 3; w++) {
            int64_t N = w == 2 ? H : I, K = w == 2 ? I : H;
            if (lay == MXFP4) {
                add(k, ST_I8, N, K / 2, "%sffn.experts.%d.w%d.weight", pfx, e, w);
                add(k, ST_F8_E8M0, N, K / 32, "%sffn.experts.%d.w%d.scale", pfx, e, w);
            } else {
                add(k, ST_F8_E4M3, N, K, "%sffn.experts.%d.w%d.weight", pfx, e, w);
                add(k, lay == FP8_F32 ? ST_F32 : ST_F8_E8M0, N / 128, K / 128,
                    "%sffn.experts.%d.w%d.scale", pfx, e, w);
            }
        }
    }
}

/* The whole small model in one layout: the real Flash (MXFP4, E8M0 everywhere) or Flash-Base
 * (FP8 experts, F32 everywhere) form. */
static void build_model(ckpt *k, const mc_config *c, expert_layout lay, bool shared_e8m0)
{
    ck_reset(k);
    for (int l = 0; l < mc_num_layers(c); l++) {
        char pfx[32];
        if (l < c->num_hidden_layers)
            snprintf(pfx, sizeof pfx, "layers.%d.", l);
        else
            snprintf(pfx, sizeof pfx, "mtp.%d.", l - c->num_hidden_layers);
        build_layer(k, c, pfx, l < c->num_hash_layers, lay, shared_e8m0, 0, c->n_routed_experts);
    }
}

/* ---- the tensor table ------------------------------------------------------------------- */

static const ck_tensor_spec *spec_named(const ck_tensor_spec *s, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0)
            return &s[i];
    return NULL;
}

static void check_spec(const ck_tensor_spec *s, int n, const char *name, st_dtype dt, int64_t d0,
                       int64_t d1)
{
    const ck_tensor_spec *p = spec_named(s, n, name);
    if (p == NULL) {
        TEST_FAIL_AT("no table entry %s", name);
        return;
    }
    if (p->dtype != dt || p->ndim != (d1 < 0 ? 1 : 2) || p->shape[0] != d0 ||
        (d1 >= 0 && p->shape[1] != d1))
        TEST_FAIL_AT("%s: dtype %d ndim %d shape [%lld, %lld], want dtype %d [%lld, %lld]", name,
                     (int)p->dtype, p->ndim, (long long)p->shape[0], (long long)p->shape[1],
                     (int)dt, (long long)d0, (long long)d1);
}

static ck_tensor_spec g_specs[MAX_T];

TEST(table_counts)
{
    mc_config c = small_config(MC_FP4, true);
    CHECK_EQ(ck_layer_tensor_count(&c, 0, 0, 8), 9 + 6 * 8);
    CHECK_EQ(ck_layer_tensor_count(&c, 0, 2, 5), 9 + 6 * 3);
    CHECK_EQ(ck_layer_tensor_count(&c, 3, 3, 3), 9);
    CHECK_EQ(ck_layer_tensor_count(&c, 4, 0, 8), 57); /* mtp.0 */
    CHECK_EQ(ck_layer_tensor_count(&c, 5, 0, 8), -1);
    CHECK_EQ(ck_layer_tensor_count(&c, -1, 0, 8), -1);
    CHECK_EQ(ck_layer_tensor_count(&c, 0, -1, 2), -1);
    CHECK_EQ(ck_layer_tensor_count(&c, 0, 5, 3), -1);
    CHECK_EQ(ck_layer_tensor_count(&c, 0, 0, 9), -1);
    CHECK_EQ(ck_layer_tensors(&c, 0, 0, 8, g_specs, 56), -1); /* cap too small */
    CHECK_EQ(ck_layer_tensors(&c, 0, 0, 8, g_specs, 57), 57);
    CHECK_EQ(ck_layer_tensors(&c, 0, 0, 9, g_specs, MAX_T), -1);

    mc_config f = flash_config(MC_FP8);
    CHECK_EQ(ck_layer_tensor_count(&f, 0, 0, 256), 9 + 6 * 256);
    CHECK_EQ(ck_layer_tensor_count(&f, 43, 128, 256), 9 + 6 * 128);
}

/* The table equals the spec-built layer entry for entry, for every kind of layer. */
TEST(table_equals_the_spec_layer)
{
    static const struct {
        mc_expert_dtype dt;
        expert_layout lay;
        bool shared_e8m0;
    } kinds[] = {{MC_FP4, MXFP4, true}, {MC_FP8, FP8_F32, false}};
    for (int kd = 0; kd < 2; kd++) {
        mc_config c = small_config(kinds[kd].dt, true);
        for (int l = 0; l < mc_num_layers(&c); l++) {
            static const int ranges[][2] = {{0, 8}, {2, 5}, {7, 8}, {4, 4}};
            for (int r = 0; r < 4; r++) {
                char pfx[32];
                ck_layer_prefix(&c, l, pfx, sizeof pfx);
                ck_reset(&g_ck);
                build_layer(&g_ck, &c, pfx, l < c.num_hash_layers, kinds[kd].lay,
                            kinds[kd].shared_e8m0, ranges[r][0], ranges[r][1]);
                int n = ck_layer_tensors(&c, l, ranges[r][0], ranges[r][1], g_specs, MAX_T);
                CHECK_EQ(n, g_ck.n);
                for (int i = 0; i < n && i < g_ck.n; i++) {
                    const st_tensor *t = find(&g_ck, g_specs[i].name);
                    if (t == NULL) {
                        TEST_FAIL_AT("%s is not in the spec layer", g_specs[i].name);
                        continue;
                    }
                    check_spec(g_specs, n, t->name, t->dtype, t->shape[0],
                               t->ndim == 1 ? -1 : t->shape[1]);
                    for (int j = 0; j < i; j++)
                        if (strcmp(g_specs[j].name, g_specs[i].name) == 0)
                            TEST_FAIL_AT("%s listed twice", g_specs[i].name);
                }
            }
        }
    }
}

TEST(table_flash_entries_by_hand)
{
    /* Spec §2.3 (Flash, fp4), layer 0 is hash-routed. */
    mc_config c = flash_config(MC_FP4);
    int n = ck_layer_tensors(&c, 0, 254, 256, g_specs, MAX_T);
    CHECK_EQ(n, 9 + 12);
    check_spec(g_specs, n, "layers.0.ffn_norm.weight", ST_BF16, 4096, -1);
    check_spec(g_specs, n, "layers.0.ffn.gate.weight", ST_BF16, 256, 4096);
    check_spec(g_specs, n, "layers.0.ffn.gate.tid2eid", ST_I64, 129280, 6);
    CHECK(spec_named(g_specs, n, "layers.0.ffn.gate.bias") == NULL);
    check_spec(g_specs, n, "layers.0.ffn.experts.254.w1.weight", ST_I8, 2048, 2048);
    check_spec(g_specs, n, "layers.0.ffn.experts.254.w1.scale", ST_F8_E8M0, 2048, 128);
    check_spec(g_specs, n, "layers.0.ffn.experts.255.w3.weight", ST_I8, 2048, 2048);
    check_spec(g_specs, n, "layers.0.ffn.experts.255.w3.scale", ST_F8_E8M0, 2048, 128);
    check_spec(g_specs, n, "layers.0.ffn.experts.255.w2.weight", ST_I8, 4096, 1024);
    check_spec(g_specs, n, "layers.0.ffn.experts.255.w2.scale", ST_F8_E8M0, 4096, 64);
    check_spec(g_specs, n, "layers.0.ffn.shared_experts.w1.weight", ST_F8_E4M3, 2048, 4096);
    check_spec(g_specs, n, "layers.0.ffn.shared_experts.w1.scale", ST_F8_E8M0, 16, 32);
    check_spec(g_specs, n, "layers.0.ffn.shared_experts.w3.scale", ST_F8_E8M0, 16, 32);
    check_spec(g_specs, n, "layers.0.ffn.shared_experts.w2.weight", ST_F8_E4M3, 4096, 2048);
    check_spec(g_specs, n, "layers.0.ffn.shared_experts.w2.scale", ST_F8_E8M0, 32, 16);
    CHECK(spec_named(g_specs, n, "layers.0.ffn.experts.253.w1.weight") == NULL);

    /* layer 3 is the first score-routed layer */
    n = ck_layer_tensors(&c, 3, 0, 0, g_specs, MAX_T);
    CHECK_EQ(n, 9);
    check_spec(g_specs, n, "layers.3.ffn.gate.bias", ST_F32, 256, -1);
    CHECK(spec_named(g_specs, n, "layers.3.ffn.gate.tid2eid") == NULL);

    /* Spec §2.4 (Flash-Base, fp8) and §2.5 (MTP: bias, never tid2eid). */
    mc_config b = flash_config(MC_FP8);
    n = ck_layer_tensors(&b, 43, 0, 1, g_specs, MAX_T);
    CHECK_EQ(n, 15);
    check_spec(g_specs, n, "mtp.0.ffn_norm.weight", ST_BF16, 4096, -1);
    check_spec(g_specs, n, "mtp.0.ffn.gate.bias", ST_F32, 256, -1);
    CHECK(spec_named(g_specs, n, "mtp.0.ffn.gate.tid2eid") == NULL);
    check_spec(g_specs, n, "mtp.0.ffn.experts.0.w1.weight", ST_F8_E4M3, 2048, 4096);
    check_spec(g_specs, n, "mtp.0.ffn.experts.0.w1.scale", ST_F32, 16, 32);
    check_spec(g_specs, n, "mtp.0.ffn.experts.0.w3.scale", ST_F32, 16, 32);
    check_spec(g_specs, n, "mtp.0.ffn.experts.0.w2.weight", ST_F8_E4M3, 4096, 2048);
    check_spec(g_specs, n, "mtp.0.ffn.experts.0.w2.scale", ST_F32, 32, 16);
    check_spec(g_specs, n, "mtp.0.ffn.shared_experts.w1.scale", ST_F32, 16, 32);
    check_spec(g_specs, n, "mtp.0.ffn.shared_experts.w2.scale", ST_F32, 32, 16);

    /* MTP is score-routed even when every main layer is hash-routed. */
    c.num_hash_layers = 43;
    n = ck_layer_tensors(&c, 43, 0, 0, g_specs, MAX_T);
    check_spec(g_specs, n, "mtp.0.ffn.gate.bias", ST_F32, 256, -1);
    n = ck_layer_tensors(&c, 42, 0, 0, g_specs, MAX_T);
    check_spec(g_specs, n, "layers.42.ffn.gate.tid2eid", ST_I64, 129280, 6);
}

/* ---- the checker ------------------------------------------------------------------------ */

static int check(const mc_config *c, int layer, int e0, int e1, ep_err *err)
{
    ep_err_clear(err);
    return ck_check_layer_with(lookup, &g_ck, c, layer, e0, e1, err);
}

TEST(checker_accepts_matching_checkpoints)
{
    ep_err err;
    mc_config c = small_config(MC_FP4, false);
    build_model(&g_ck, &c, MXFP4, true);
    for (int l = 0; l < mc_num_layers(&c); l++) {
        CHECK_EQ(check(&c, l, 0, 8, &err), 0);
        CHECK_EQ(check(&c, l, 3, 5, &err), 0);
        CHECK_EQ(check(&c, l, 8, 8, &err), 0);
    }
    c.expert_dtype_given = true;
    CHECK_EQ(check(&c, 0, 0, 8, &err), 0);

    mc_config b = small_config(MC_FP8, true);
    build_model(&g_ck, &b, FP8_F32, false);
    for (int l = 0; l < mc_num_layers(&b); l++)
        CHECK_EQ(check(&b, l, 0, 8, &err), 0);

    /* Extra tensors are ignored: bias on a hash layer, tid2eid on a score layer, attention. */
    add(&g_ck, ST_F32, 8, -1, "layers.0.ffn.gate.bias");
    add(&g_ck, ST_I64, 100, 2, "layers.3.ffn.gate.tid2eid");
    add(&g_ck, ST_F8_E4M3, 1024, 256, "layers.0.attn.wq_a.weight");
    CHECK_EQ(check(&b, 0, 0, 8, &err), 0);
    CHECK_EQ(check(&b, 3, 0, 8, &err), 0);
}

TEST(checker_names_missing_tensors)
{
    ep_err err;
    mc_config c = small_config(MC_FP4, true);
    build_model(&g_ck, &c, MXFP4, true);
    drop(&g_ck, "layers.0.ffn.experts.3.w2.scale");
    CHECK_EQ(check(&c, 0, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "missing tensor \"layers.0.ffn.experts.3.w2.scale\" (expert_dtype fp4)");
    CHECK_EQ(check(&c, 0, 0, 3, &err), 0); /* not owned, not needed */
    CHECK_EQ(check(&c, 0, 4, 8, &err), 0);

    drop(&g_ck, "layers.1.ffn.gate.tid2eid");
    CHECK_EQ(check(&c, 1, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "missing tensor \"layers.1.ffn.gate.tid2eid\" (expert_dtype fp4)");

    drop(&g_ck, "mtp.0.ffn.gate.bias");
    CHECK_EQ(check(&c, 4, 0, 0, &err), -1);
    CHECK_STR_EQ(err.msg, "missing tensor \"mtp.0.ffn.gate.bias\" (expert_dtype fp4)");

    drop(&g_ck, "layers.2.ffn_norm.weight");
    CHECK_EQ(check(&c, 2, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "missing tensor \"layers.2.ffn_norm.weight\" (expert_dtype fp4)");

    drop(&g_ck, "layers.3.ffn.shared_experts.w3.weight");
    CHECK_EQ(check(&c, 3, 0, 0, &err), -1);
    CHECK_STR_EQ(err.msg,
                 "missing tensor \"layers.3.ffn.shared_experts.w3.weight\" (expert_dtype fp4)");

    mc_config b = small_config(MC_FP8, true);
    build_model(&g_ck, &b, FP8_F32, false);
    drop(&g_ck, "layers.3.ffn.experts.7.w1.weight");
    CHECK_EQ(check(&b, 3, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "missing tensor \"layers.3.ffn.experts.7.w1.weight\" (expert_dtype fp8)");
}

TEST(checker_names_wrong_dtype_and_shape)
{
    ep_err err;
    mc_config c = small_config(MC_FP4, true);
    build_model(&g_ck, &c, MXFP4, true);
    st_tensor *t = find(&g_ck, "layers.0.ffn.experts.3.w1.weight");
    t->dtype = ST_F8_E4M3;
    t->shape[1] = 256;
    CHECK_EQ(check(&c, 0, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.0.ffn.experts.3.w1.weight\": expected I8 [128, 128] "
                          "for expert_dtype fp4, found F8_E4M3 [128, 256]");

    build_model(&g_ck, &c, MXFP4, true);
    find(&g_ck, "layers.2.ffn.experts.0.w2.scale")->dtype = ST_U8;
    CHECK_EQ(check(&c, 2, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.2.ffn.experts.0.w2.scale\": expected F8_E8M0 [256, 4] "
                          "for expert_dtype fp4, found U8 [256, 4]");

    build_model(&g_ck, &c, MXFP4, true);
    find(&g_ck, "layers.1.ffn.gate.weight")->shape[1] = 255;
    CHECK_EQ(check(&c, 1, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.1.ffn.gate.weight\": expected BF16 [8, 256] for "
                          "expert_dtype fp4, found BF16 [8, 255]");

    build_model(&g_ck, &c, MXFP4, true);
    find(&g_ck, "layers.0.ffn.gate.tid2eid")->shape[1] = 3;
    CHECK_EQ(check(&c, 0, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.0.ffn.gate.tid2eid\": expected I64 [100, 2] for "
                          "expert_dtype fp4, found I64 [100, 3]");

    build_model(&g_ck, &c, MXFP4, true);
    t = find(&g_ck, "mtp.0.ffn.gate.bias");
    t->ndim = 3;
    t->shape[0] = 1;
    t->shape[1] = 8;
    t->shape[2] = 1;
    CHECK_EQ(check(&c, 4, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"mtp.0.ffn.gate.bias\": expected F32 [8] for expert_dtype "
                          "fp4, found F32 [1, 8, 1]");

    build_model(&g_ck, &c, MXFP4, true);
    t = find(&g_ck, "layers.3.ffn_norm.weight");
    t->ndim = 0;
    CHECK_EQ(check(&c, 3, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.3.ffn_norm.weight\": expected BF16 [256] for "
                          "expert_dtype fp4, found BF16 []");

    /* The shared expert's scales follow scale_e8m0: F32 under fp4 is an error of its own. */
    build_model(&g_ck, &c, MXFP4, true);
    find(&g_ck, "layers.3.ffn.shared_experts.w2.scale")->dtype = ST_F32;
    CHECK_EQ(check(&c, 3, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.3.ffn.shared_experts.w2.scale\": expected F8_E8M0 "
                          "[2, 1] for expert_dtype fp4, found F32 [2, 1]");
    mc_config b = small_config(MC_FP8, true);
    build_model(&g_ck, &b, FP8_F32, false);
    find(&g_ck, "layers.3.ffn.shared_experts.w1.scale")->dtype = ST_F8_E8M0;
    CHECK_EQ(check(&b, 3, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.3.ffn.shared_experts.w1.scale\": expected F32 "
                          "[1, 2] for expert_dtype fp8, found F8_E8M0 [1, 2]");
}

TEST(checker_explains_fp8_experts_without_expert_dtype)
{
    ep_err err;
    mc_config c = small_config(MC_FP4, false); /* config.json had no expert_dtype */
    mc_config b = small_config(MC_FP8, true);
    build_model(&g_ck, &b, FP8_F32, false); /* a Flash-Base checkpoint */
    CHECK_EQ(check(&c, 2, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg,
                 "tensor \"layers.2.ffn.experts.0.w1.weight\": expected I8 [128, 128] for "
                 "expert_dtype fp4, found F8_E4M3 [128, 256]; config.json has no expert_dtype "
                 "(top level or in quantization_config), so fp4 (MXFP4) was defaulted, but these "
                 "experts are FP8 block experts: set \"expert_dtype\": \"fp8\"");
    /* hash and MTP layers alike, and a worker owning a later range */
    CHECK_EQ(check(&c, 0, 5, 8, &err), -1);
    CHECK_STR_HAS(err.msg, "\"layers.0.ffn.experts.5.w1.weight\"");
    CHECK_STR_HAS(err.msg, "set \"expert_dtype\": \"fp8\"");
    CHECK_EQ(check(&c, 4, 0, 8, &err), -1);
    CHECK_STR_HAS(err.msg, "\"mtp.0.ffn.experts.0.w1.weight\"");
    CHECK_STR_HAS(err.msg, "set \"expert_dtype\": \"fp8\"");
    /* owning no experts, the shared expert's F32 scales tell the same story */
    CHECK_EQ(check(&c, 3, 0, 0, &err), -1);
    CHECK_STR_HAS(err.msg, "\"layers.3.ffn.shared_experts.w1.scale\": expected F8_E8M0 [1, 2]");
    CHECK_STR_HAS(err.msg, "set \"expert_dtype\": \"fp8\"");

    /* config.json said fp4 explicitly */
    c.expert_dtype_given = true;
    CHECK_EQ(check(&c, 2, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.2.ffn.experts.0.w1.weight\": expected I8 [128, 128] "
                          "for expert_dtype fp4, found F8_E4M3 [128, 256]; the checkpoint's "
                          "experts look like fp8 experts but config.json says expert_dtype "
                          "\"fp4\"");

    /* A single odd expert is not "the other dtype": no explanation. */
    build_model(&g_ck, &c, MXFP4, true);
    st_tensor *t = find(&g_ck, "layers.2.ffn.experts.6.w3.weight");
    t->dtype = ST_F8_E4M3;
    t->shape[1] = 256;
    CHECK_EQ(check(&c, 2, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.2.ffn.experts.6.w3.weight\": expected I8 [128, 128] "
                          "for expert_dtype fp4, found F8_E4M3 [128, 256]");
}

TEST(checker_explains_fp4_experts_under_fp8)
{
    ep_err err;
    mc_config b = small_config(MC_FP8, true);
    mc_config c = small_config(MC_FP4, true);
    build_model(&g_ck, &c, MXFP4, true); /* a Flash checkpoint */
    CHECK_EQ(check(&b, 3, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "tensor \"layers.3.ffn.experts.0.w1.weight\": expected F8_E4M3 "
                          "[128, 256] for expert_dtype fp8, found I8 [128, 128]; the checkpoint's "
                          "experts look like fp4 experts but config.json says expert_dtype "
                          "\"fp8\"");
}

TEST(checker_explains_converted_fp8_e8m0_experts)
{
    /* FP8 experts with E8M0 block scales and no expert_dtype (spec §1.2, converted checkpoints). */
    ep_err err;
    mc_config c = small_config(MC_FP4, false);
    build_model(&g_ck, &c, FP8_E8M0, true);
    CHECK_EQ(check(&c, 3, 0, 8, &err), -1);
    CHECK_STR_HAS(err.msg, "tensor \"layers.3.ffn.experts.0.w1.weight\": expected I8 [128, 128] "
                           "for expert_dtype fp4, found F8_E4M3 [128, 256]; ");
    CHECK_STR_HAS(err.msg, "FP8 block experts with E8M0 scales, which neither expert_dtype "
                           "describes");
    mc_config b = small_config(MC_FP8, true);
    CHECK_EQ(check(&b, 3, 0, 8, &err), -1);
    CHECK_STR_HAS(err.msg, "tensor \"layers.3.ffn.experts.0.w1.scale\": expected F32 [1, 2] for "
                           "expert_dtype fp8, found F8_E8M0 [1, 2]; ");
    CHECK_STR_HAS(err.msg, "with E8M0 scales");
}

TEST(checker_rejects_bad_ranges)
{
    ep_err err;
    mc_config c = small_config(MC_FP4, true);
    build_model(&g_ck, &c, MXFP4, true);
    CHECK_EQ(check(&c, 5, 0, 8, &err), -1);
    CHECK_STR_EQ(err.msg, "layer 5 out of range: the model has 5 MoE layers");
    CHECK_EQ(check(&c, -1, 0, 8, &err), -1);
    CHECK_STR_HAS(err.msg, "layer -1 out of range");
    CHECK_EQ(check(&c, 0, 0, 9, &err), -1);
    CHECK_STR_EQ(err.msg, "expert range [0, 9) out of range: the model has 8 routed experts");
    CHECK_EQ(check(&c, 0, 4, 3, &err), -1);
    CHECK_STR_HAS(err.msg, "expert range [4, 3)");
}

/* Write the in-memory checkpoint as a real safetensors file (zero-filled data) and open it. */
static st_model *write_model(const ckpt *k, const char *dir)
{
    ep_err err;
    st_writer *w = st_writer_create();
    for (int i = 0; i < k->n; i++) {
        const st_tensor *t = &k->t[i];
        void *zero = calloc((size_t)t->numel, st_dtype_size(t->dtype));
        if (st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, zero, &err) != 0)
            printf("  writer: %s\n", err.msg);
        free(zero);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_writer_write(w, path, &err) != 0)
        printf("  writer: %s\n", err.msg);
    st_writer_destroy(&w);
    st_model *m = st_model_open(dir, &err);
    if (m == NULL)
        printf("  open: %s\n", err.msg);
    return m;
}

TEST(check_model_through_st_model)
{
    ep_err err;
    char dir[] = "/tmp/epmoe-ckpt-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);

    mc_config c = small_config(MC_FP4, false);
    build_model(&g_ck, &c, MXFP4, true);
    st_model *m = write_model(&g_ck, dir);
    CHECK(m != NULL);
    CHECK_EQ(ck_check_model(m, &c, &err), 0);
    CHECK_EQ(ck_check_layer(m, &c, 4, 2, 6, &err), 0);
    st_model_close(&m);

    drop(&g_ck, "mtp.0.ffn.experts.7.w3.scale");
    m = write_model(&g_ck, dir);
    CHECK_EQ(ck_check_model(m, &c, &err), -1);
    CHECK_STR_EQ(err.msg, "missing tensor \"mtp.0.ffn.experts.7.w3.scale\" (expert_dtype fp4)");
    CHECK_EQ(ck_check_layer(m, &c, 4, 2, 6, &err), 0); /* a worker without expert 7 loads */
    st_model_close(&m);

    mc_config b = small_config(MC_FP8, true);
    build_model(&g_ck, &b, FP8_F32, false);
    m = write_model(&g_ck, dir);
    CHECK_EQ(ck_check_model(m, &c, &err), -1);
    CHECK_STR_HAS(err.msg, "\"layers.0.ffn.experts.0.w1.weight\"");
    CHECK_STR_HAS(err.msg, "set \"expert_dtype\": \"fp8\"");
    CHECK_EQ(ck_check_model(m, &b, &err), 0);
    st_model_close(&m);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(map_name_follows_vllm);
    RUN(map_name_every_scale_of_a_layer);
    RUN(map_name_reports_a_short_buffer);
    RUN(layer_prefix);
    RUN(layer_parse_accepts_the_three_forms);
    RUN(layer_parse_errors_name_text_and_range);
    RUN(table_counts);
    RUN(table_equals_the_spec_layer);
    RUN(table_flash_entries_by_hand);
    RUN(checker_accepts_matching_checkpoints);
    RUN(checker_names_missing_tensors);
    RUN(checker_names_wrong_dtype_and_shape);
    RUN(checker_explains_fp8_experts_without_expert_dtype);
    RUN(checker_explains_fp4_experts_under_fp8);
    RUN(checker_explains_converted_fp8_e8m0_experts);
    RUN(checker_rejects_bad_ranges);
    RUN(check_model_through_st_model);
    return test_report();
}
