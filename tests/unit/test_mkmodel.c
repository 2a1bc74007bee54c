/*
 * test_mkmodel.c — the synthetic checkpoint generator (mk_*).
 *
 * Every check reads the written files back through the safetensors reader and decodes them with
 * the (exhaustively tested) format decoders; expected names, dtypes and shapes for the default
 * sizes (H 256, I 128, E 16, top-6, 4 layers of which 1 hash, 1 MTP, vocab 1000) are written out
 * by hand from spec §2.3-§2.5, not taken from ck_layer_tensors. Quantization properties are
 * checked from the definitions: a tight power-of-two scale puts the unrounded group maximum in
 * (3, 6] (MXFP4) or (224, 448] (FP8, E8M0); round-to-nearest-even can then bring it down to
 * the grid point 3 or 224, so the test asks for [3, 6] / [224, 448] per group and for most
 * groups strictly above the lower end (a scale one power of two too large would put every
 * group at or below it).
 */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "ctl/mkmodel.h"
#include "kernels/formats.h"
#include "test.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static char tmp_root[64];

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* A fresh path under the test's temporary root (not created). */
static const char *out_path(const char *name)
{
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 256, "%s/%s", tmp_root, name);
    rm_tree(p);
    return p;
}

static mk_options defaults(const char *dir, mc_expert_dtype dt)
{
    mk_options o;
    mk_options_init(&o);
    o.out_dir = dir;
    o.expert_dtype = dt;
    return o;
}

/* Write a model with o; NULL (and a failed check) when mk_write_model fails. */
static st_model *write_open(const mk_options *o)
{
    ep_err err = {0};
    if (mk_write_model(o, &err) != 0) {
        TEST_FAIL_AT("mk_write_model: %s", err.msg);
        return NULL;
    }
    st_model *m = st_model_open(o->out_dir, &err);
    if (m == NULL)
        TEST_FAIL_AT("st_model_open: %s", err.msg);
    return m;
}

static int load_config(const char *dir, mc_config *c)
{
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    ep_err err = {0};
    int rc = mc_load(p, c, &err);
    if (rc != 0)
        TEST_FAIL_AT("mc_load: %s", err.msg);
    return rc;
}

/* The tensor has this dtype and shape (ndim 1 when d1 < 0). */
static void check_tensor(const st_model *m, const char *name, st_dtype dt, int64_t d0, int64_t d1)
{
    const st_tensor *t = st_model_find(m, name);
    if (t == NULL) {
        TEST_FAIL_AT("missing tensor %s", name);
        return;
    }
    int ndim = d1 < 0 ? 1 : 2;
    if (t->dtype != dt || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        TEST_FAIL_AT("%s: expected %s [%lld, %lld], found %s ndim %d [%lld, %lld]", name,
                     st_dtype_name(dt), (long long)d0, (long long)d1, st_dtype_name(t->dtype),
                     t->ndim, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : -1));
}

static float f32_at(const st_tensor *t, int64_t i)
{
    float f;
    memcpy(&f, (const uint8_t *)t->data + 4 * i, sizeof f);
    return f;
}

static float bf16_at(const st_tensor *t, int64_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + 2 * i, sizeof h);
    return fmt_bf16_to_f32(h);
}

static int64_t i64_at(const st_tensor *t, int64_t i)
{
    int64_t v;
    memcpy(&v, (const uint8_t *)t->data + 8 * i, sizeof v);
    return v;
}

static uint8_t u8_at(const st_tensor *t, int64_t i)
{
    return ((const uint8_t *)t->data)[i];
}

/* Running mean, standard deviation and tail counts (|x| > 1 and 2 sigma, sigma the expected
 * standard deviation). */
typedef struct moments {
    double sigma;
    double n, sum, sum2, beyond1, beyond2;
} moments;

static void mom_add(moments *s, double x)
{
    s->n += 1;
    s->sum += x;
    s->sum2 += x * x;
    s->beyond1 += fabs(x) > s->sigma;
    s->beyond2 += fabs(x) > 2 * s->sigma;
}

static double mom_mean(const moments *s)
{
    return s->sum / s->n;
}

static double mom_std(const moments *s)
{
    double m = mom_mean(s);
    return sqrt(s->sum2 / s->n - m * m);
}

static bool read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(*buf, 1, (size_t)n, f);
    fclose(f);
    return *len == (size_t)n;
}

static bool files_equal(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool ok = read_file(a, &x, &nx) && read_file(b, &y, &ny) && nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return ok;
}

static bool file_exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* ---- config.json ------------------------------------------------------------------------ */

static void check_config(mc_expert_dtype dt, bool omit)
{
    mk_options o = defaults(out_path("cfg"), dt);
    o.omit_expert_dtype = omit;
    ep_err err = {0};
    CHECK_EQ(mk_write_model(&o, &err), 0);
    mc_config c;
    if (load_config(o.out_dir, &c) != 0)
        return;
    CHECK_EQ(c.hidden_size, 256);
    CHECK_EQ(c.moe_intermediate_size, 128);
    CHECK_EQ(c.n_routed_experts, 16);
    CHECK_EQ(c.n_shared_experts, 1);
    CHECK_EQ(c.num_experts_per_tok, 6);
    CHECK_EQ(c.num_hidden_layers, 4);
    CHECK_EQ(c.num_hash_layers, 1);
    CHECK_EQ(c.num_nextn_predict_layers, 1);
    CHECK_EQ(c.vocab_size, 1000);
    CHECK(c.routed_scaling_factor == 1.5f);
    CHECK(c.swiglu_limit == 10.0f);
    CHECK(c.rms_norm_eps == 1e-6f);
    CHECK(c.norm_topk_prob);
    CHECK(c.act_ue8m0);
    CHECK_EQ(c.expert_dtype, omit ? MC_FP4 : dt);
    CHECK_EQ(c.expert_dtype_given, !omit);
    CHECK_EQ(c.scale_e8m0, omit || dt == MC_FP4);

    /* The raw fields of spec §1.1 and a few irrelevant V4 fields. */
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", o.out_dir);
    json_error_t je;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    CHECK(j != NULL);
    if (j == NULL)
        return;
    CHECK_STR_EQ(json_string_value(json_object_get(j, "model_type")), "deepseek_v4");
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                 "DeepseekV4ForCausalLM");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "scoring_func")), "sqrtsoftplus");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "topk_method")), "noaux_tc");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "hidden_act")), "silu");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16");
    CHECK(json_is_true(json_object_get(j, "norm_topk_prob")));
    CHECK_EQ(json_integer_value(json_object_get(j, "hc_mult")), 4);
    CHECK(json_is_integer(json_object_get(j, "head_dim")));
    CHECK_EQ(json_array_size(json_object_get(j, "compress_ratios")), 5);
    json_t *q = json_object_get(j, "quantization_config");
    CHECK_STR_EQ(json_string_value(json_object_get(q, "quant_method")), "fp8");
    CHECK_STR_EQ(json_string_value(json_object_get(q, "fmt")), "e4m3");
    CHECK_STR_EQ(json_string_value(json_object_get(q, "scale_fmt")), "ue8m0");
    CHECK_STR_EQ(json_string_value(json_object_get(q, "activation_scheme")), "dynamic");
    json_t *wbs = json_object_get(q, "weight_block_size");
    CHECK_EQ(json_array_size(wbs), 2);
    CHECK_EQ(json_integer_value(json_array_get(wbs, 0)), 128);
    CHECK_EQ(json_integer_value(json_array_get(wbs, 1)), 128);
    json_t *ed = json_object_get(j, "expert_dtype"), *qed = json_object_get(q, "expert_dtype");
    if (omit) {
        CHECK(ed == NULL);
        CHECK(qed == NULL);
    } else {
        CHECK_STR_EQ(json_string_value(ed), dt == MC_FP4 ? "fp4" : "fp8");
        /* transformers' FineGrainedFP8Config keeps it there: the same value */
        CHECK_STR_EQ(json_string_value(qed), dt == MC_FP4 ? "fp4" : "fp8");
    }
    /* transformers' spelling of num_hash_layers 1 over 4 layers */
    json_t *mlt = json_object_get(j, "mlp_layer_types");
    CHECK_EQ(json_array_size(mlt), 4);
    for (size_t i = 0; i < 4; i++)
        CHECK_STR_EQ(json_string_value(json_array_get(mlt, i)), i == 0 ? "hash_moe" : "moe");
    json_decref(j);
}

TEST(config_fp4)
{
    check_config(MC_FP4, false);
}

TEST(config_fp8)
{
    check_config(MC_FP8, false);
}

TEST(config_fp8_omitted)
{
    check_config(MC_FP8, true);
}

/* ---- tensors ---------------------------------------------------------------------------- */

/* Names, dtypes and shapes written out from spec §2.3-§2.5 for the default sizes. */
static void check_spec_tensors(const st_model *m, mc_expert_dtype dt)
{
    const st_dtype fp8_scale = dt == MC_FP4 ? ST_F8_E8M0 : ST_F32;
    /* hash layer 0: tid2eid, no bias; score layers and MTP: bias, no tid2eid */
    check_tensor(m, "layers.0.ffn.gate.tid2eid", ST_I64, 1000, 6);
    CHECK(st_model_find(m, "layers.0.ffn.gate.bias") == NULL);
    check_tensor(m, "layers.1.ffn.gate.bias", ST_F32, 16, -1);
    check_tensor(m, "layers.3.ffn.gate.bias", ST_F32, 16, -1);
    CHECK(st_model_find(m, "layers.1.ffn.gate.tid2eid") == NULL);
    check_tensor(m, "mtp.0.ffn.gate.bias", ST_F32, 16, -1);
    CHECK(st_model_find(m, "mtp.0.ffn.gate.tid2eid") == NULL);
    check_tensor(m, "layers.2.ffn_norm.weight", ST_BF16, 256, -1);
    check_tensor(m, "mtp.0.ffn_norm.weight", ST_BF16, 256, -1);
    check_tensor(m, "layers.2.ffn.gate.weight", ST_BF16, 16, 256);
    if (dt == MC_FP4) {
        check_tensor(m, "layers.2.ffn.experts.15.w1.weight", ST_I8, 128, 128);
        check_tensor(m, "layers.2.ffn.experts.15.w1.scale", ST_F8_E8M0, 128, 8);
        check_tensor(m, "layers.0.ffn.experts.0.w3.weight", ST_I8, 128, 128);
        check_tensor(m, "layers.0.ffn.experts.0.w3.scale", ST_F8_E8M0, 128, 8);
        check_tensor(m, "layers.3.ffn.experts.7.w2.weight", ST_I8, 256, 64);
        check_tensor(m, "layers.3.ffn.experts.7.w2.scale", ST_F8_E8M0, 256, 4);
        check_tensor(m, "mtp.0.ffn.experts.15.w2.weight", ST_I8, 256, 64);
        check_tensor(m, "mtp.0.ffn.experts.15.w2.scale", ST_F8_E8M0, 256, 4);
    } else {
        check_tensor(m, "layers.2.ffn.experts.15.w1.weight", ST_F8_E4M3, 128, 256);
        check_tensor(m, "layers.2.ffn.experts.15.w1.scale", ST_F32, 1, 2);
        check_tensor(m, "layers.0.ffn.experts.0.w3.weight", ST_F8_E4M3, 128, 256);
        check_tensor(m, "layers.0.ffn.experts.0.w3.scale", ST_F32, 1, 2);
        check_tensor(m, "layers.3.ffn.experts.7.w2.weight", ST_F8_E4M3, 256, 128);
        check_tensor(m, "layers.3.ffn.experts.7.w2.scale", ST_F32, 2, 1);
        check_tensor(m, "mtp.0.ffn.experts.15.w2.weight", ST_F8_E4M3, 256, 128);
        check_tensor(m, "mtp.0.ffn.experts.15.w2.scale", ST_F32, 2, 1);
    }
    CHECK(st_model_find(m, "layers.0.ffn.experts.16.w1.weight") == NULL);
    CHECK(st_model_find(m, "layers.4.ffn_norm.weight") == NULL);
    CHECK(st_model_find(m, "mtp.1.ffn_norm.weight") == NULL);
    check_tensor(m, "layers.1.ffn.shared_experts.w1.weight", ST_F8_E4M3, 128, 256);
    check_tensor(m, "layers.1.ffn.shared_experts.w1.scale", fp8_scale, 1, 2);
    check_tensor(m, "layers.1.ffn.shared_experts.w3.weight", ST_F8_E4M3, 128, 256);
    check_tensor(m, "layers.1.ffn.shared_experts.w3.scale", fp8_scale, 1, 2);
    check_tensor(m, "mtp.0.ffn.shared_experts.w2.weight", ST_F8_E4M3, 256, 128);
    check_tensor(m, "mtp.0.ffn.shared_experts.w2.scale", fp8_scale, 2, 1);

    /* non-MoE tensors a loader skips */
    check_tensor(m, "embed.weight", ST_BF16, 1000, 256);
    check_tensor(m, "head.weight", ST_BF16, 1000, 256);
    check_tensor(m, "norm.weight", ST_BF16, 256, -1);
    for (int l = 0; l < 4; l++) {
        char n[128];
        snprintf(n, sizeof n, "layers.%d.attn_norm.weight", l);
        check_tensor(m, n, ST_BF16, 256, -1);
        snprintf(n, sizeof n, "layers.%d.attn.wq_a.weight", l);
        check_tensor(m, n, ST_F8_E4M3, 128, 256);
        snprintf(n, sizeof n, "layers.%d.attn.wq_a.scale", l);
        check_tensor(m, n, fp8_scale, 1, 2);
        snprintf(n, sizeof n, "layers.%d.hc_ffn_fn", l);
        check_tensor(m, n, ST_F32, 24, 1024);
        snprintf(n, sizeof n, "layers.%d.hc_ffn_base", l);
        check_tensor(m, n, ST_F32, 24, -1);
        snprintf(n, sizeof n, "layers.%d.hc_ffn_scale", l);
        check_tensor(m, n, ST_F32, 3, -1);
    }
    check_tensor(m, "mtp.0.e_proj.weight", ST_F8_E4M3, 256, 256);
    check_tensor(m, "mtp.0.e_proj.scale", fp8_scale, 2, 2);
    check_tensor(m, "mtp.0.h_proj.weight", ST_F8_E4M3, 256, 256);
    check_tensor(m, "mtp.0.h_proj.scale", fp8_scale, 2, 2);
    check_tensor(m, "mtp.0.enorm.weight", ST_BF16, 256, -1);
    check_tensor(m, "mtp.0.hnorm.weight", ST_BF16, 256, -1);
    check_tensor(m, "mtp.0.norm.weight", ST_BF16, 256, -1);

    /* 5 MoE layers x (9 + 6 x 16), 4 x 6 attention/mHC, 7 MTP extras, embed/head/norm */
    CHECK_EQ(st_model_count(m), 5 * (9 + 6 * 16) + 4 * 6 + 7 + 3);
}

/* Every entry of the checker's table is present as specified. */
static void check_table_present(const st_model *m, const mc_config *c)
{
    for (int l = 0; l < mc_num_layers(c); l++) {
        int n = ck_layer_tensor_count(c, l, 0, c->n_routed_experts);
        ck_tensor_spec *t = calloc((size_t)n, sizeof *t);
        CHECK_EQ(ck_layer_tensors(c, l, 0, c->n_routed_experts, t, n), n);
        for (int i = 0; i < n; i++)
            check_tensor(m, t[i].name, t[i].dtype, t[i].shape[0],
                         t[i].ndim == 1 ? -1 : t[i].shape[1]);
        free(t);
    }
}

/* Tensors of the same shape hold different data (each has its own stream). */
static void check_distinct(const st_model *m, const char *a, const char *b)
{
    const st_tensor *x = st_model_find(m, a), *y = st_model_find(m, b);
    CHECK(x != NULL && y != NULL);
    if (x != NULL && y != NULL && x->nbytes == y->nbytes &&
        memcmp(x->data, y->data, x->nbytes) == 0)
        TEST_FAIL_AT("%s and %s hold the same bytes", a, b);
}

static void check_tensors(mc_expert_dtype dt)
{
    mk_options o = defaults(out_path("tensors"), dt);
    st_model *m = write_open(&o);
    mc_config c;
    if (m == NULL || load_config(o.out_dir, &c) != 0)
        goto out;
    check_spec_tensors(m, dt);
    check_table_present(m, &c);
    check_distinct(m, "layers.1.ffn.experts.0.w1.weight", "layers.1.ffn.experts.1.w1.weight");
    check_distinct(m, "layers.1.ffn.experts.0.w1.weight", "layers.1.ffn.experts.0.w3.weight");
    check_distinct(m, "layers.1.ffn.experts.0.w1.weight", "layers.2.ffn.experts.0.w1.weight");
    check_distinct(m, "layers.1.ffn.experts.0.w1.weight", "mtp.0.ffn.experts.0.w1.weight");
    check_distinct(m, "layers.1.ffn.shared_experts.w1.weight",
                   "layers.1.ffn.shared_experts.w3.weight");
    check_distinct(m, "layers.1.ffn.gate.bias", "layers.2.ffn.gate.bias");
    ep_err err = {0};
    CHECK_EQ(ck_check_model(m, &c, &err), 0);
    if (err.msg[0] != '\0')
        printf("  %s\n", err.msg);
out:
    st_model_close(&m);
}

TEST(tensors_fp4)
{
    check_tensors(MC_FP4);
}

TEST(tensors_fp8)
{
    check_tensors(MC_FP8);
}

/* --full: the tensors transformers 5.23's DeepseekV4ForCausalLM loads, names and shapes as its
 * save_pretrained() writes them for this config (H 256, 4 heads of 64, q_lora 128, 2 output groups
 * of 64, indexer 2 heads of 32; layers 0-1 sliding, 2 HCA (ratio 128), 3 CSA (ratio 4)). */
static void check_full_tensors(const st_model *m)
{
    static const struct {
        const char *name;
        st_dtype dt;
        int64_t d0, d1;
    } want[] = {
        {"layers.0.attn_norm.weight", ST_BF16, 256, -1},
        {"layers.0.hc_attn_fn", ST_F32, 24, 1024},
        {"layers.0.hc_attn_base", ST_F32, 24, -1},
        {"layers.0.hc_attn_scale", ST_F32, 3, -1},
        {"layers.0.hc_ffn_fn", ST_F32, 24, 1024},
        {"layers.0.attn.attn_sink", ST_F32, 4, -1},
        {"layers.0.attn.wq_a.weight", ST_BF16, 128, 256},
        {"layers.0.attn.q_norm.weight", ST_BF16, 128, -1},
        {"layers.0.attn.wq_b.weight", ST_BF16, 256, 128},
        {"layers.0.attn.wkv.weight", ST_BF16, 64, 256},
        {"layers.0.attn.norm.weight", ST_BF16, 64, -1},
        {"layers.0.attn.wo_a.weight", ST_BF16, 128, 128},
        {"layers.0.attn.wo_b.weight", ST_BF16, 256, 128},
        {"layers.2.attn.compressor.ape", ST_F32, 128, 64},
        {"layers.2.attn.compressor.norm.weight", ST_BF16, 64, -1},
        {"layers.2.attn.compressor.wgate.weight", ST_BF16, 64, 256},
        {"layers.2.attn.compressor.wkv.weight", ST_BF16, 64, 256},
        {"layers.3.attn.compressor.ape", ST_F32, 4, 128},
        {"layers.3.attn.compressor.wkv.weight", ST_BF16, 128, 256},
        {"layers.3.attn.indexer.compressor.ape", ST_F32, 4, 64},
        {"layers.3.attn.indexer.compressor.norm.weight", ST_BF16, 32, -1},
        {"layers.3.attn.indexer.compressor.wgate.weight", ST_BF16, 64, 256},
        {"layers.3.attn.indexer.weights_proj.weight", ST_BF16, 2, 256},
        {"layers.3.attn.indexer.wq_b.weight", ST_BF16, 64, 128},
        {"hc_head_fn", ST_F32, 4, 1024},
        {"hc_head_base", ST_F32, 4, -1},
        {"hc_head_scale", ST_F32, 1, -1},
        {"embed.weight", ST_BF16, 1000, 256},
        {"head.weight", ST_BF16, 1000, 256},
        {"mtp.0.e_proj.weight", ST_F8_E4M3, 256, 256},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        check_tensor(m, want[i].name, want[i].dt, want[i].d0, want[i].d1);
    static const char *const absent[] = {"layers.1.attn.compressor.ape",
                                         "layers.2.attn.indexer.weights_proj.weight",
                                         "mtp.0.attn.wq_b.weight", "layers.0.attn.wq_a.scale"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        if (st_model_find(m, absent[i]) != NULL)
            TEST_FAIL_AT("%s: present, expected absent", absent[i]);
}

TEST(full_model)
{
    mk_options o = defaults(out_path("full"), MC_FP8);
    o.full = true;
    st_model *m = write_open(&o);
    mc_config c;
    if (m == NULL || load_config(o.out_dir, &c) != 0)
        goto out;
    check_full_tensors(m);
    ep_err err = {0};
    CHECK_EQ(ck_check_model(m, &c, &err), 0); /* the MoE contract is unchanged */
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", o.out_dir);
    json_error_t je;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    CHECK(j != NULL);
    if (j != NULL) {
        CHECK_EQ(json_integer_value(json_object_get(j, "num_attention_heads")), 4);
        CHECK_EQ(json_integer_value(json_object_get(j, "head_dim")), 64);
        CHECK_EQ(json_integer_value(json_object_get(j, "q_lora_rank")), 128);
        CHECK_EQ(json_integer_value(json_object_get(j, "o_groups")), 2);
        CHECK_EQ(json_integer_value(json_object_get(j, "o_lora_rank")), 64);
        CHECK_EQ(json_integer_value(json_object_get(j, "index_n_heads")), 2);
        CHECK_EQ(json_integer_value(json_object_get(j, "index_head_dim")), 32);
        json_t *cr = json_object_get(j, "compress_ratios");
        CHECK_EQ(json_integer_value(json_array_get(cr, 2)), 128);
        CHECK_EQ(json_integer_value(json_array_get(cr, 3)), 4);
    }
    json_decref(j);
out:
    st_model_close(&m);
}

TEST(omitted_fp8_fails_the_check)
{
    mk_options o = defaults(out_path("omit"), MC_FP8);
    o.omit_expert_dtype = true;
    st_model *m = write_open(&o);
    mc_config c;
    if (m != NULL && load_config(o.out_dir, &c) == 0) {
        check_spec_tensors(m, MC_FP8); /* the tensors are Flash-Base's */
        ep_err err = {0};
        CHECK_EQ(ck_check_model(m, &c, &err), -1);
        CHECK_STR_HAS(err.msg, "no expert_dtype");
        CHECK_STR_HAS(err.msg, "set \"expert_dtype\": \"fp8\"");
    }
    st_model_close(&m);
}

/* ---- values ----------------------------------------------------------------------------- */

/* MXFP4 weight [N, K/2] + E8M0 [N, K/32]: per group checks, dequantized moments. */
static void scan_mxfp4(const st_tensor *w, const st_tensor *s, moments *mom, int *groups,
                       int *above3)
{
    const int64_t N = w->shape[0], K = 2 * w->shape[1];
    for (int64_t n = 0; n < N; n++) {
        for (int64_t g = 0; g < K / 32; g++) {
            uint8_t code = u8_at(s, n * (K / 32) + g);
            CHECK(code > 0 && code < 255);
            float scale = fmt_e8m0_to_f32(code), gmax = 0;
            for (int64_t k = g * 32; k < g * 32 + 32; k++) {
                uint8_t b = u8_at(w, n * (K / 2) + k / 2);
                float v = fmt_e2m1_to_f32(k % 2 == 0 ? (b & 15) : (b >> 4));
                gmax = fabsf(v) > gmax ? fabsf(v) : gmax;
                mom_add(mom, (double)v * scale);
            }
            if (gmax == 0)
                continue;
            if (!(gmax >= 3 && gmax <= 6))
                TEST_FAIL_AT("%s row %lld group %lld: max |e2m1| %g outside [3, 6]", w->name,
                             (long long)n, (long long)g, gmax);
            (*groups)++;
            *above3 += gmax > 3;
        }
    }
}

/* FP8 block weight [N, K] + scale [N/128, K/128] (E8M0 or F32): per block checks. */
static void scan_fp8(const st_tensor *w, const st_tensor *s, moments *mom, int *blocks,
                     int *above224)
{
    const int64_t N = w->shape[0], K = w->shape[1], KB = K / 128;
    const bool e8m0 = s->dtype == ST_F8_E8M0;
    for (int64_t nb = 0; nb < N / 128; nb++) {
        for (int64_t kb = 0; kb < KB; kb++) {
            float scale;
            if (e8m0) {
                uint8_t code = u8_at(s, nb * KB + kb);
                CHECK(code > 0 && code < 255);
                scale = fmt_e8m0_to_f32(code);
            } else {
                scale = f32_at(s, nb * KB + kb);
                CHECK(isfinite(scale) && scale > 0);
            }
            float bmax = 0;
            for (int64_t i = nb * 128; i < nb * 128 + 128; i++)
                for (int64_t k = kb * 128; k < kb * 128 + 128; k++) {
                    float v = fmt_e4m3_to_f32(u8_at(w, i * K + k));
                    CHECK(!isnan(v));
                    bmax = fabsf(v) > bmax ? fabsf(v) : bmax;
                    mom_add(mom, (double)v * scale);
                }
            if (e8m0 && !(bmax >= 224 && bmax <= 448))
                TEST_FAIL_AT("%s block (%lld, %lld): max |e4m3| %g outside [224, 448]", w->name,
                             (long long)nb, (long long)kb, bmax);
            if (!e8m0 && bmax != 448)
                TEST_FAIL_AT("%s block (%lld, %lld): max |e4m3| %g, expected 448 (F32 scale "
                             "amax/448)",
                             w->name, (long long)nb, (long long)kb, bmax);
            (*blocks)++;
            *above224 += bmax > 224;
        }
    }
}

/* Mean ~ 0 within 6 standard errors; std within tol of sigma (sampling error is < 0.3% here,
 * MXFP4 quantization noise moves it by up to ~0.5%, FP8 by less than 0.1%). With tails, the
 * fractions beyond 1 and 2 sigma are a Gaussian's, 31.73% and 4.55% -- only for unquantized
 * values: with a power-of-two sigma and scale, quantized values pile up exactly on the
 * thresholds. */
static void check_moments(const char *what, const moments *mom, double tol, bool tails)
{
    double want = mom->sigma, sd = mom_std(mom), mean = mom_mean(mom);
    if (!(fabs(mean) < 6 * want / sqrt(mom->n)))
        TEST_FAIL_AT("%s: mean %g over %g values, expected ~0", what, mean, mom->n);
    if (!(fabs(sd / want - 1) < tol))
        TEST_FAIL_AT("%s: std %g, expected %g within %g%%", what, sd, want, 100 * tol);
    double f1 = mom->beyond1 / mom->n, f2 = mom->beyond2 / mom->n;
    if (tails && !(fabs(f1 - 0.3173) < 0.01 && fabs(f2 - 0.0455) < 0.004))
        TEST_FAIL_AT("%s: %.4f beyond 1 sigma, %.4f beyond 2 sigma; expected 0.3173, 0.0455", what,
                     f1, f2);
}

static const st_tensor *find2(const st_model *m, const char *fmt, const char *pfx, int e,
                              const char *proj, const char *what)
{
    char n[256];
    if (e >= 0)
        snprintf(n, sizeof n, fmt, pfx, e, proj, what);
    else
        snprintf(n, sizeof n, fmt, pfx, proj, what);
    const st_tensor *t = st_model_find(m, n);
    if (t == NULL)
        TEST_FAIL_AT("missing %s", n);
    return t;
}

static void check_values(mc_expert_dtype dt)
{
    mk_options o = defaults(out_path("values"), dt);
    st_model *m = write_open(&o);
    if (m == NULL)
        return;
    static const char *const pfx[] = {"layers.0.", "layers.1.", "layers.2.", "layers.3.", "mtp.0."};
    static const char *const proj[] = {"w1", "w2", "w3"};
    moments routed[3] = {{0}}, shared[3] = {{0}};
    for (int p = 0; p < 3; p++) /* w2 takes I = 128 inputs, w1/w3 take H = 256 */
        routed[p].sigma = shared[p].sigma = 1.0 / sqrt(p == 1 ? 128.0 : 256.0);
    int groups = 0, above = 0, blocks = 0, bab = 0, sblocks = 0, sbab = 0;
    for (int l = 0; l < 5; l++) {
        for (int p = 0; p < 3; p++) {
            for (int e = 0; e < 16; e++) {
                const st_tensor *w =
                    find2(m, "%sffn.experts.%d.%s.%s", pfx[l], e, proj[p], "weight");
                const st_tensor *s =
                    find2(m, "%sffn.experts.%d.%s.%s", pfx[l], e, proj[p], "scale");
                if (w == NULL || s == NULL)
                    continue;
                if (dt == MC_FP4)
                    scan_mxfp4(w, s, &routed[p], &groups, &above);
                else
                    scan_fp8(w, s, &routed[p], &blocks, &bab);
            }
            const st_tensor *w =
                find2(m, "%sffn.shared_experts.%s.%s", pfx[l], -1, proj[p], "weight");
            const st_tensor *s =
                find2(m, "%sffn.shared_experts.%s.%s", pfx[l], -1, proj[p], "scale");
            if (w != NULL && s != NULL)
                scan_fp8(w, s, &shared[p], &sblocks, &sbab);
        }
    }
    for (int p = 0; p < 3; p++) {
        char what[64];
        snprintf(what, sizeof what, "routed %s", proj[p]);
        check_moments(what, &routed[p], dt == MC_FP4 ? 0.015 : 0.01, false);
        snprintf(what, sizeof what, "shared %s", proj[p]);
        check_moments(what, &shared[p], 0.01, false);
    }
    if (dt == MC_FP4) {
        CHECK_EQ(groups, 5 * 16 * (128 * 8 * 2 + 256 * 4));
        CHECK(above > groups * 6 / 10); /* ~78% expected for Gaussian groups */
        printf("  MXFP4 groups with max |e2m1| > 3: %d of %d\n", above, groups);
    } else {
        CHECK_EQ(blocks, 5 * 16 * 3 * 2);
    }
    if (dt == MC_FP4) {
        CHECK_EQ(sblocks, 5 * 3 * 2);
        CHECK(sbab >= sblocks * 3 / 4); /* ~95% expected */
    }
    st_model_close(&m);
}

TEST(values_fp4)
{
    check_values(MC_FP4);
}

TEST(values_fp8)
{
    check_values(MC_FP8);
}

TEST(router_values)
{
    mk_options o = defaults(out_path("router"), MC_FP4);
    st_model *m = write_open(&o);
    if (m == NULL)
        return;
    /* tid2eid: 6 distinct ids in [0, 16) per row; each id about 1000*6/16 = 375 times
     * (binomial sd ~15; [275, 475] is more than 6 sd). */
    const st_tensor *t = st_model_find(m, "layers.0.ffn.gate.tid2eid");
    int count[16] = {0};
    bool ok_range = true, ok_distinct = true;
    for (int64_t v = 0; t != NULL && v < 1000; v++) {
        for (int j = 0; j < 6; j++) {
            int64_t id = i64_at(t, v * 6 + j);
            if (id < 0 || id >= 16) {
                ok_range = false;
                continue;
            }
            count[id]++;
            for (int i = 0; i < j; i++)
                ok_distinct = ok_distinct && i64_at(t, v * 6 + i) != id;
        }
    }
    CHECK(t != NULL);
    CHECK(ok_range);
    CHECK(ok_distinct);
    for (int e = 0; e < 16; e++)
        if (count[e] < 275 || count[e] > 475)
            TEST_FAIL_AT("tid2eid: expert %d chosen %d times, expected ~375", e, count[e]);

    /* gate.bias in [7.95, 8.05] and spread over it; gate weight N(0, 1/16); ffn_norm 1 +
     * N(0, 0.05) (in BF16). */
    static const char *const pfx[] = {"layers.1.", "layers.2.", "layers.3.", "mtp.0."};
    moments bias = {.sigma = 1}, gate = {.sigma = 1}, norm = {.sigma = 1};
    float bmin = 100, bmax = -100;
    for (int l = 0; l < 4; l++) {
        char n[128];
        snprintf(n, sizeof n, "%sffn.gate.bias", pfx[l]);
        const st_tensor *b = st_model_find(m, n);
        for (int e = 0; b != NULL && e < 16; e++) {
            float v = f32_at(b, e);
            CHECK(v >= 7.95f && v <= 8.05f);
            bmin = v < bmin ? v : bmin;
            bmax = v > bmax ? v : bmax;
            mom_add(&bias, v);
        }
        snprintf(n, sizeof n, "%sffn.gate.weight", pfx[l]);
        const st_tensor *g = st_model_find(m, n);
        for (int64_t i = 0; g != NULL && i < g->numel; i++)
            mom_add(&gate, bf16_at(g, i));
        snprintf(n, sizeof n, "%sffn_norm.weight", pfx[l]);
        const st_tensor *nw = st_model_find(m, n);
        for (int64_t i = 0; nw != NULL && i < nw->numel; i++)
            mom_add(&norm, bf16_at(nw, i));
    }
    CHECK_EQ(bias.n, 64);
    CHECK(bmax - bmin > 0.05f);
    CHECK_NEAR(mom_mean(&bias), 8.0, 0.015);
    CHECK_EQ(gate.n, 4 * 16 * 256);
    CHECK_NEAR(mom_mean(&gate), 0.0, 6 * 0.0625 / 128);
    CHECK_NEAR(mom_std(&gate), 0.0625, 0.0625 * 0.05);
    CHECK_EQ(norm.n, 4 * 256);
    /* The generator's own shape, unquantized: hc_ffn_fn is F32 N(0, 1/sqrt(4H)) = N(0, 1/32). */
    moments hc = {.sigma = 1.0 / 32};
    for (int l = 0; l < 4; l++) {
        char n[128];
        snprintf(n, sizeof n, "layers.%d.hc_ffn_fn", l);
        const st_tensor *h = st_model_find(m, n);
        for (int64_t i = 0; h != NULL && i < h->numel; i++)
            mom_add(&hc, f32_at(h, i));
    }
    CHECK_EQ(hc.n, 4 * 24 * 1024);
    check_moments("hc_ffn_fn", &hc, 0.01, true);
    CHECK_NEAR(mom_mean(&norm), 1.0, 6 * 0.05 / 32);
    CHECK_NEAR(mom_std(&norm), 0.05, 0.05 * 0.15);
    st_model_close(&m);
}

/* ---- determinism and sharding ----------------------------------------------------------- */

static const char *const FILES2[] = {"config.json", "model.safetensors.index.json",
                                     "model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"};

TEST(same_seed_same_bytes)
{
    mk_options a = defaults(out_path("seed_a"), MC_FP4);
    mk_options b = defaults(out_path("seed_b"), MC_FP4);
    mk_options c = defaults(out_path("seed_c"), MC_FP4);
    mk_options d = defaults(out_path("seed_d"), MC_FP4);
    b.threads = 1;
    c.threads = 3;
    d.seed = 2;
    ep_err err = {0};
    CHECK_EQ(mk_write_model(&a, &err), 0);
    CHECK_EQ(mk_write_model(&b, &err), 0);
    CHECK_EQ(mk_write_model(&c, &err), 0);
    CHECK_EQ(mk_write_model(&d, &err), 0);
    for (int i = 0; i < 4; i++) {
        char pa[512], pb[512], pc[512], pd[512];
        snprintf(pa, sizeof pa, "%s/%s", a.out_dir, FILES2[i]);
        snprintf(pb, sizeof pb, "%s/%s", b.out_dir, FILES2[i]);
        snprintf(pc, sizeof pc, "%s/%s", c.out_dir, FILES2[i]);
        snprintf(pd, sizeof pd, "%s/%s", d.out_dir, FILES2[i]);
        if (!files_equal(pa, pb) || !files_equal(pa, pc))
            TEST_FAIL_AT("%s differs between runs with the same seed", FILES2[i]);
        /* config and index depend on the sizes only; the shards on the seed */
        if (files_equal(pa, pd) != (i < 2))
            TEST_FAIL_AT("%s: seed 2 %s seed 1", FILES2[i], i < 2 ? "differs from" : "equals");
    }
}

/* The index lists every tensor once, in the file that holds it, with the right total. */
static void check_index(const char *dir, const st_model *m, int shards)
{
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_error_t je;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    CHECK(j != NULL);
    if (j == NULL)
        return;
    json_t *wm = json_object_get(j, "weight_map");
    CHECK_EQ(json_object_size(wm), st_model_count(m));
    uint64_t total = 0;
    for (int i = 0; i < st_model_count(m); i++) {
        const st_tensor *t = st_model_at(m, i);
        total += t->nbytes;
        const char *file = json_string_value(json_object_get(wm, t->name));
        const char *path = st_file_path(t->file);
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        if (file == NULL || strcmp(file, base) != 0)
            TEST_FAIL_AT("%s: index says %s, found in %s", t->name, file ? file : "(none)", base);
    }
    CHECK_EQ(json_integer_value(json_object_get(json_object_get(j, "metadata"), "total_size")),
             (long long)total);
    for (int s = 1; s <= shards; s++) {
        char n[64];
        snprintf(n, sizeof n, "model-%05d-of-%05d.safetensors", s, shards);
        CHECK(file_exists(dir, n));
    }
    json_decref(j);
}

/* Every tensor of layer prefix pfx lives in one file. */
static void check_whole_layer(const st_model *m, const char *pfx)
{
    const st_file *f = NULL;
    size_t n = strlen(pfx);
    for (int i = 0; i < st_model_count(m); i++) {
        const st_tensor *t = st_model_at(m, i);
        if (strncmp(t->name, pfx, n) != 0)
            continue;
        if (f == NULL)
            f = t->file;
        else if (f != t->file)
            TEST_FAIL_AT("%s is split across files", pfx);
    }
}

TEST(sharding_keeps_tensors)
{
    st_model *m[3] = {NULL, NULL, NULL};
    const char *dirs[3];
    for (int s = 0; s < 3; s++) {
        char name[32];
        snprintf(name, sizeof name, "shards%d", s + 1);
        mk_options o = defaults(out_path(name), MC_FP8);
        o.shards = s + 1;
        dirs[s] = o.out_dir;
        m[s] = write_open(&o);
    }
    if (m[0] == NULL || m[1] == NULL || m[2] == NULL)
        goto out;
    CHECK(file_exists(dirs[0], "model.safetensors"));
    CHECK(!file_exists(dirs[0], "model.safetensors.index.json"));
    check_index(dirs[1], m[1], 2);
    check_index(dirs[2], m[2], 3);
    CHECK(!file_exists(dirs[2], "model.safetensors"));
    for (int s = 1; s < 3; s++) {
        CHECK_EQ(st_model_count(m[s]), st_model_count(m[0]));
        for (int i = 0; i < st_model_count(m[0]); i++) {
            const st_tensor *a = st_model_at(m[0], i);
            const st_tensor *b = st_model_find(m[s], a->name);
            if (b == NULL || b->nbytes != a->nbytes || b->dtype != a->dtype ||
                memcmp(a->data, b->data, a->nbytes) != 0)
                TEST_FAIL_AT("%s differs with %d shards", a->name, s + 1);
        }
    }
    /* whole layers per shard, and every shard used */
    static const char *const pfx[] = {"layers.0.", "layers.1.", "layers.2.", "layers.3.", "mtp.0."};
    for (int l = 0; l < 5; l++)
        check_whole_layer(m[2], pfx[l]);
out:
    for (int s = 0; s < 3; s++)
        st_model_close(&m[s]);
}

/* ---- options and the output directory --------------------------------------------------- */

static void check_bad(mk_options o, const char *needle1, const char *needle2)
{
    ep_err err = {0};
    CHECK_EQ(mk_check(&o, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, needle1);
    CHECK_STR_HAS(err.msg, needle2);
    ep_err_clear(&err);
    CHECK_EQ(mk_write_model(&o, &err), -1);
    CHECK_STR_HAS(err.msg, needle1);
    CHECK(o.out_dir == NULL || !file_exists(o.out_dir, "config.json"));
}

TEST(bad_options)
{
    mk_options o = defaults(out_path("bad"), MC_FP4);
    mk_options b;
    b = o, b.hidden = 100;
    check_bad(b, "--hidden 100", "multiple of 128");
    b = o, b.inter = 0;
    check_bad(b, "--inter 0", "multiple of 128");
    b = o, b.experts = 0;
    check_bad(b, "--experts 0", "n_routed_experts");
    b = o, b.topk = 17;
    check_bad(b, "--topk 17", "at most --experts (16)");
    b = o, b.hash_layers = 5;
    check_bad(b, "--hash-layers 5", "at most --layers (4)");
    b = o, b.layers = 0;
    check_bad(b, "--layers 0", "num_hidden_layers");
    b = o, b.mtp = -1;
    check_bad(b, "--mtp -1", "num_nextn_predict_layers");
    b = o, b.vocab = 0;
    check_bad(b, "--vocab 0", "hash");
    b = o, b.shards = 0;
    check_bad(b, "--shards 0", "1..5");
    b = o, b.shards = 6;
    check_bad(b, "--shards 6", "whole layers");
    b = o, b.threads = -1;
    check_bad(b, "--threads -1", "positive");
    b = o, b.out_dir = NULL;
    check_bad(b, "--out", "required");
    b = o, b.expert_dtype = (mc_expert_dtype)7;
    check_bad(b, "--expert-dtype", "fp4 or fp8");
    mk_plan p;
    ep_err err = {0};
    CHECK_EQ(mk_check(&o, &p, &err), 0);
    CHECK_EQ(p.tensors, 559);
    CHECK_EQ(p.shards, 2);
}

TEST(output_directory)
{
    ep_err err = {0};
    /* the parent must exist */
    char deep[512];
    snprintf(deep, sizeof deep, "%s/no/such", tmp_root);
    mk_options o = defaults(deep, MC_FP4);
    CHECK_EQ(mk_write_model(&o, &err), -1);
    CHECK_STR_HAS(err.msg, deep);

    /* a non-empty directory needs force; force replaces the checkpoint files only */
    o = defaults(out_path("force"), MC_FP4);
    o.shards = 3;
    CHECK_EQ(mk_write_model(&o, &err), 0);
    char keep[512];
    snprintf(keep, sizeof keep, "%s/README", o.out_dir);
    FILE *f = fopen(keep, "w");
    if (f != NULL)
        fclose(f);
    o.shards = 1;
    ep_err_clear(&err);
    CHECK_EQ(mk_write_model(&o, &err), -1);
    CHECK_STR_HAS(err.msg, "not empty");
    CHECK_STR_HAS(err.msg, o.out_dir);
    CHECK(file_exists(o.out_dir, "model-00003-of-00003.safetensors"));
    o.force = true;
    CHECK_EQ(mk_write_model(&o, &err), 0);
    CHECK(file_exists(o.out_dir, "README"));
    CHECK(file_exists(o.out_dir, "model.safetensors"));
    CHECK(!file_exists(o.out_dir, "model.safetensors.index.json"));
    CHECK(!file_exists(o.out_dir, "model-00001-of-00003.safetensors"));
    CHECK(!file_exists(o.out_dir, "model-00003-of-00003.safetensors"));
    st_model *m = st_model_open(o.out_dir, &err);
    CHECK(m != NULL);
    st_model_close(&m);

    /* a file where the directory should be */
    ep_err_clear(&err);
    o = defaults(keep, MC_FP4);
    CHECK_EQ(mk_write_model(&o, &err), -1);
    CHECK_STR_HAS(err.msg, "not a directory");
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/test_mkmodel.XXXXXX");
    if (mkdtemp(tmp_root) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    RUN(config_fp4);
    RUN(config_fp8);
    RUN(config_fp8_omitted);
    RUN(tensors_fp4);
    RUN(tensors_fp8);
    RUN(full_model);
    RUN(omitted_fp8_fails_the_check);
    RUN(values_fp4);
    RUN(values_fp8);
    RUN(router_values);
    RUN(same_seed_same_bytes);
    RUN(sharding_keeps_tensors);
    RUN(bad_options);
    RUN(output_directory);
    rm_tree(tmp_root);
    return test_report();
}
