/*
 * test_model_config.c — config.json parsing, validation, canonical text and hash (mc_*).
 *
 * Expected values come from the spec (§1.1: the DeepSeek-V4-Flash config) and from float bit
 * patterns computed independently (Python struct.pack('<f', x)): 1.5 = 0x3fc00000,
 * 10.0 = 0x41200000, 1e-6 = 0x358637bd. Variants of the Flash config are made with Jansson
 * (an independent JSON implementation) by deleting or replacing one key.
 */
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/model_config.h"
#include "test.h"

/* The MoE-relevant fields of DeepSeek-V4-Flash's config.json (spec §1.1) plus fields the MoE
 * worker ignores (hc_*, compress_ratios, rope_*, ...). */
static const char FLASH[] =
    "{\n"
    "  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n"
    "  \"attention_bias\": false,\n"
    "  \"bos_token_id\": 0,\n"
    "  \"compress_ratios\": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,\n"
    "                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,\n"
    "                      4, 128, 4, 128, 4, 128, 4, 128, 4, 0],\n"
    "  \"eos_token_id\": 1,\n"
    "  \"expert_dtype\": \"fp4\",\n"
    "  \"hc_eps\": 1e-06,\n"
    "  \"hc_mult\": 4,\n"
    "  \"hc_sinkhorn_iters\": 20,\n"
    "  \"head_dim\": 512,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 4096,\n"
    "  \"index_head_dim\": 128,\n"
    "  \"index_n_heads\": 64,\n"
    "  \"index_topk\": 512,\n"
    "  \"max_position_embeddings\": 1048576,\n"
    "  \"model_type\": \"deepseek_v4\",\n"
    "  \"moe_intermediate_size\": 2048,\n"
    "  \"n_routed_experts\": 256,\n"
    "  \"n_shared_experts\": 1,\n"
    "  \"norm_topk_prob\": true,\n"
    "  \"num_attention_heads\": 64,\n"
    "  \"num_experts_per_tok\": 6,\n"
    "  \"num_hash_layers\": 3,\n"
    "  \"num_hidden_layers\": 43,\n"
    "  \"num_key_value_heads\": 1,\n"
    "  \"num_nextn_predict_layers\": 1,\n"
    "  \"o_groups\": 8,\n"
    "  \"o_lora_rank\": 1024,\n"
    "  \"q_lora_rank\": 1024,\n"
    "  \"qk_rope_head_dim\": 64,\n"
    "  \"quantization_config\": {\n"
    "    \"activation_scheme\": \"dynamic\",\n"
    "    \"fmt\": \"e4m3\",\n"
    "    \"quant_method\": \"fp8\",\n"
    "    \"scale_fmt\": \"ue8m0\",\n"
    "    \"weight_block_size\": [128, 128]\n"
    "  },\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 16,\n"
    "                   \"original_max_position_embeddings\": 65536, \"type\": \"yarn\"},\n"
    "  \"rope_theta\": 10000,\n"
    "  \"routed_scaling_factor\": 1.5,\n"
    "  \"scoring_func\": \"sqrtsoftplus\",\n"
    "  \"sliding_window\": 128,\n"
    "  \"swiglu_limit\": 10.0,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"topk_method\": \"noaux_tc\",\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.57.1\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 129280\n"
    "}\n";

/* The smallest config the rules accept. */
static const char MINIMAL[] =
    "{\"hidden_size\": 128, \"moe_intermediate_size\": 128, \"n_routed_experts\": 1,"
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 1, \"num_hidden_layers\": 1,"
    " \"num_hash_layers\": 0, \"vocab_size\": 0, \"routed_scaling_factor\": 1,"
    " \"swiglu_limit\": 10, \"rms_norm_eps\": 1e-6, \"scoring_func\": \"sqrtsoftplus\"}";

static int parse_text(const char *text, mc_config *c, ep_err *err)
{
    ep_err_clear(err);
    return mc_parse(text, strlen(text), "cfg.json", c, err);
}

/* Parse FLASH with one key replaced by the JSON text val (or deleted when val is NULL). A key
 * "a.b" addresses b inside the object a. */
static int parse_variant(const char *key, const char *val, mc_config *c, ep_err *err)
{
    json_error_t je;
    json_t *root = json_loads(FLASH, 0, &je);
    if (root == NULL) {
        printf("  test bug: FLASH does not parse: %s\n", je.text);
        exit(1);
    }
    json_t *obj = root;
    const char *leaf = key;
    const char *dot = strchr(key, '.');
    char head[64];
    if (dot != NULL) {
        snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
        obj = json_object_get(root, head);
        leaf = dot + 1;
    }
    if (val == NULL) {
        json_object_del(obj, leaf);
    } else {
        json_t *v = json_loads(val, JSON_DECODE_ANY, &je);
        if (v == NULL) {
            printf("  test bug: variant %s does not parse\n", val);
            exit(1);
        }
        json_object_set_new(obj, leaf, v);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = parse_text(text, c, err);
    free(text);
    return rc;
}

static mc_config flash(void)
{
    mc_config c;
    ep_err err;
    if (parse_text(FLASH, &c, &err) != 0) {
        printf("  FLASH config refused: %s\n", err.msg);
        exit(1);
    }
    return c;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

TEST(flash_config_resolves_every_field)
{
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_text(FLASH, &c, &err), 0);
    CHECK_EQ(c.hidden_size, 4096);
    CHECK_EQ(c.moe_intermediate_size, 2048);
    CHECK_EQ(c.n_routed_experts, 256);
    CHECK_EQ(c.n_shared_experts, 1);
    CHECK_EQ(c.num_experts_per_tok, 6);
    CHECK_EQ(c.num_hidden_layers, 43);
    CHECK_EQ(c.num_hash_layers, 3);
    CHECK_EQ(c.num_nextn_predict_layers, 1);
    CHECK_EQ(c.vocab_size, 129280);
    CHECK_EQ(bits(c.routed_scaling_factor), 0x3fc00000);
    CHECK_EQ(bits(c.swiglu_limit), 0x41200000);
    CHECK_EQ(bits(c.rms_norm_eps), 0x358637bd);
    CHECK(c.norm_topk_prob);
    CHECK_EQ(c.expert_dtype, MC_FP4);
    CHECK(c.expert_dtype_given);
    CHECK(c.scale_e8m0);
    CHECK(c.act_ue8m0);
    CHECK_EQ(mc_validate(&c, &err), 0);
}

TEST(minimal_config_takes_the_defaults)
{
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_text(MINIMAL, &c, &err), 0);
    CHECK_EQ(c.num_nextn_predict_layers, 0);
    CHECK(c.norm_topk_prob);
    CHECK_EQ(c.expert_dtype, MC_FP4);
    CHECK(!c.expert_dtype_given);
    CHECK(c.scale_e8m0);
    CHECK(!c.act_ue8m0);
    CHECK_EQ(bits(c.routed_scaling_factor), bits(1.0f)); /* a JSON integer as a float */
    CHECK_EQ(bits(c.swiglu_limit), 0x41200000);
}

TEST(parse_reads_exactly_len_bytes)
{
    /* The buffer is not NUL-terminated at len: trailing bytes past len are not JSON. */
    char buf[sizeof MINIMAL + 16];
    memcpy(buf, MINIMAL, strlen(MINIMAL));
    memcpy(buf + strlen(MINIMAL), "garbage}}}}", 12);
    mc_config c;
    ep_err err;
    CHECK_EQ(mc_parse(buf, strlen(MINIMAL), "cfg.json", &c, &err), 0);
    CHECK_EQ(mc_parse(buf, strlen(MINIMAL) + 3, "cfg.json", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json:1:");
}

TEST(expert_dtype_resolution)
{
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_variant("expert_dtype", NULL, &c, &err), 0);
    CHECK_EQ(c.expert_dtype, MC_FP4);
    CHECK(!c.expert_dtype_given);
    CHECK(c.scale_e8m0);

    CHECK_EQ(parse_variant("expert_dtype", "\"fp4\"", &c, &err), 0);
    CHECK_EQ(c.expert_dtype, MC_FP4);
    CHECK(c.expert_dtype_given);
    CHECK(c.scale_e8m0);

    CHECK_EQ(parse_variant("expert_dtype", "\"fp8\"", &c, &err), 0);
    CHECK_EQ(c.expert_dtype, MC_FP8);
    CHECK(c.expert_dtype_given);
    CHECK(!c.scale_e8m0);
    CHECK(c.act_ue8m0); /* scale_fmt is independent of the expert dtype */

    static const struct {
        const char *json, *shown;
    } bad[] = {
        {"\"fp16\"", "fp16"},
        {"\"FP4\"", "FP4"},
        {"\"\"", ""},
        {"4", "4"},
        {"null", "null"},
        {"true", "true"},
        {"[\"fp4\"]", "[\"fp4\"]"},
        {"\"fp4 \"", "fp4 "},
        {"\"f\\np\"", "f\\x0ap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(parse_variant("expert_dtype", bad[i].json, &c, &err), -1);
        char want[160];
        snprintf(want, sizeof want,
                 "unsupported expert_dtype \"%s\" in cfg.json: expected one of fp4, fp8",
                 bad[i].shown);
        CHECK_STR_EQ(err.msg, want);
    }
}

TEST(every_required_field_missing_is_named)
{
    static const char *const keys[] = {
        "hidden_size",         "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
        "num_experts_per_tok", "num_hidden_layers",     "vocab_size",       "routed_scaling_factor",
        "swiglu_limit",        "rms_norm_eps",          "scoring_func",
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        mc_config c;
        ep_err err;
        CHECK_EQ(parse_variant(keys[i], NULL, &c, &err), -1);
        char want[128];
        snprintf(want, sizeof want, "cfg.json: missing field \"%s\"", keys[i]);
        CHECK_STR_EQ(err.msg, want);
    }
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_variant("num_hash_layers", NULL, &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: missing field \"num_hash_layers\" (or transformers' "
                          "\"mlp_layer_types\")");
}

TEST(optional_fields_may_be_absent)
{
    static const char *const keys[] = {"num_nextn_predict_layers",
                                       "norm_topk_prob",
                                       "topk_method",
                                       "hidden_act",
                                       "quantization_config",
                                       "quantization_config.fmt",
                                       "quantization_config.weight_block_size",
                                       "quantization_config.scale_fmt"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        mc_config c;
        ep_err err;
        CHECK_EQ(parse_variant(keys[i], NULL, &c, &err), 0);
    }
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_variant("num_nextn_predict_layers", NULL, &c, &err), 0);
    CHECK_EQ(c.num_nextn_predict_layers, 0);
    CHECK_EQ(parse_variant("norm_topk_prob", NULL, &c, &err), 0);
    CHECK(c.norm_topk_prob);
    CHECK_EQ(parse_variant("quantization_config", NULL, &c, &err), 0);
    CHECK(!c.act_ue8m0);
    CHECK_EQ(parse_variant("quantization_config", "null", &c, &err), 0);
    CHECK(!c.act_ue8m0);
    CHECK_EQ(parse_variant("quantization_config.scale_fmt", NULL, &c, &err), 0);
    CHECK(!c.act_ue8m0);
    CHECK_EQ(parse_variant("quantization_config.scale_fmt", "null", &c, &err), 0);
    CHECK(!c.act_ue8m0);
    CHECK_EQ(parse_variant("n_group", "null", &c, &err), 0);
    CHECK_EQ(parse_variant("n_group", "1", &c, &err), 0);
    CHECK_EQ(parse_variant("topk_group", "1", &c, &err), 0);
    CHECK_EQ(parse_variant("topk_group", "null", &c, &err), 0);
}

typedef struct variant_case {
    const char *key, *json, *msg;
} variant_case;

static void check_cases(const variant_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        mc_config c;
        ep_err err;
        int rc = parse_variant(cases[i].key, cases[i].json, &c, &err);
        if (rc != -1)
            printf("  %s = %s was accepted\n", cases[i].key, cases[i].json);
        CHECK_EQ(rc, -1);
        CHECK_STR_EQ(err.msg, cases[i].msg);
    }
}

TEST(wrong_json_types_are_named)
{
    static const variant_case cases[] = {
        {"hidden_size", "\"4096\"",
         "cfg.json: field \"hidden_size\": expected an integer, found a string (\"4096\")"},
        {"hidden_size", "4096.0",
         "cfg.json: field \"hidden_size\": expected an integer, found a real number (4096.0)"},
        {"num_experts_per_tok", "true",
         "cfg.json: field \"num_experts_per_tok\": expected an integer, found true"},
        {"vocab_size", "null", "cfg.json: field \"vocab_size\": expected an integer, found null"},
        {"n_routed_experts", "[256]",
         "cfg.json: field \"n_routed_experts\": expected an integer, found an array ([256])"},
        {"num_nextn_predict_layers", "1.0",
         "cfg.json: field \"num_nextn_predict_layers\": expected an integer, found a real number "
         "(1.0)"},
        {"swiglu_limit", "\"10\"",
         "cfg.json: field \"swiglu_limit\": expected a number, found a string (\"10\")"},
        {"rms_norm_eps", "{}",
         "cfg.json: field \"rms_norm_eps\": expected a number, found an object ({})"},
        {"routed_scaling_factor", "false",
         "cfg.json: field \"routed_scaling_factor\": expected a number, found false"},
        {"norm_topk_prob", "1",
         "cfg.json: field \"norm_topk_prob\": expected true or false, found an integer (1)"},
        {"norm_topk_prob", "\"true\"",
         "cfg.json: field \"norm_topk_prob\": expected true or false, found a string (\"true\")"},
        {"scoring_func", "5",
         "cfg.json: field \"scoring_func\": expected \"sqrtsoftplus\", found 5"},
        {"topk_method", "null",
         "cfg.json: field \"topk_method\": expected \"noaux_tc\", found null"},
        {"quantization_config", "[]",
         "cfg.json: field \"quantization_config\": expected an object, found an array ([])"},
        {"quantization_config.scale_fmt", "5",
         "cfg.json: field \"quantization_config.scale_fmt\": expected a string, found an integer "
         "(5)"},
        {"quantization_config.weight_block_size", "[128.0, 128]",
         "cfg.json: field \"quantization_config.weight_block_size\": expected [128, 128], found "
         "[128.0, 128]"},
    };
    check_cases(cases, sizeof cases / sizeof cases[0]);
}

TEST(floats_may_be_written_as_integers)
{
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_variant("swiglu_limit", "10", &c, &err), 0);
    CHECK_EQ(bits(c.swiglu_limit), 0x41200000);
    CHECK_EQ(parse_variant("routed_scaling_factor", "2", &c, &err), 0);
    CHECK_EQ(bits(c.routed_scaling_factor), 0x40000000);
    CHECK_EQ(parse_variant("rms_norm_eps", "1e-5", &c, &err), 0);
    CHECK_EQ(bits(c.rms_norm_eps), 0x3727c5ac);
}

TEST(range_errors_name_field_expected_and_found)
{
    static const variant_case cases[] = {
        {"hidden_size", "100",
         "cfg.json: field \"hidden_size\": expected a positive multiple of 128, found 100"},
        {"hidden_size", "0",
         "cfg.json: field \"hidden_size\": expected a positive multiple of 128, found 0"},
        {"hidden_size", "-128",
         "cfg.json: field \"hidden_size\": expected a positive multiple of 128, found -128"},
        {"hidden_size", "65664",
         "cfg.json: field \"hidden_size\": expected at most 65536, found 65664"},
        {"hidden_size", "4294967296",
         "cfg.json: field \"hidden_size\": expected at most 65536, found 4294967296"},
        {"moe_intermediate_size", "2000",
         "cfg.json: field \"moe_intermediate_size\": expected a positive multiple of 128, found "
         "2000"},
        {"moe_intermediate_size", "65664",
         "cfg.json: field \"moe_intermediate_size\": expected at most 65536, found 65664"},
        {"n_routed_experts", "0",
         "cfg.json: field \"n_routed_experts\": expected an integer in [1, 4096], found 0"},
        {"n_routed_experts", "4097",
         "cfg.json: field \"n_routed_experts\": expected an integer in [1, 4096], found 4097"},
        {"n_shared_experts", "2",
         "cfg.json: field \"n_shared_experts\": expected 1 (DeepSeek V4 has exactly one shared "
         "expert), found 2"},
        {"n_shared_experts", "0",
         "cfg.json: field \"n_shared_experts\": expected 1 (DeepSeek V4 has exactly one shared "
         "expert), found 0"},
        {"num_experts_per_tok", "0",
         "cfg.json: field \"num_experts_per_tok\": expected an integer in [1, 64], found 0"},
        {"num_experts_per_tok", "65",
         "cfg.json: field \"num_experts_per_tok\": expected an integer in [1, 64], found 65"},
        {"num_hidden_layers", "0",
         "cfg.json: field \"num_hidden_layers\": expected an integer in [1, 1024], found 0"},
        {"num_hidden_layers", "1025",
         "cfg.json: field \"num_hidden_layers\": expected an integer in [1, 1024], found 1025"},
        {"num_hash_layers", "-1",
         "cfg.json: field \"num_hash_layers\": expected an integer in [0, 1024], found -1"},
        {"num_hash_layers", "44",
         "cfg.json: field \"num_hash_layers\": expected at most num_hidden_layers (43), found 44"},
        {"num_nextn_predict_layers", "17",
         "cfg.json: field \"num_nextn_predict_layers\": expected an integer in [0, 16], found 17"},
        {"num_nextn_predict_layers", "-1",
         "cfg.json: field \"num_nextn_predict_layers\": expected an integer in [0, 16], found -1"},
        {"vocab_size", "-1",
         "cfg.json: field \"vocab_size\": expected an integer in [0, 16777216], found -1"},
        {"vocab_size", "16777217",
         "cfg.json: field \"vocab_size\": expected an integer in [0, 16777216], found 16777217"},
        {"vocab_size", "0",
         "cfg.json: field \"vocab_size\": expected at least 1 because num_hash_layers is 3 (hash "
         "layers look up tid2eid by token id), found 0"},
        {"routed_scaling_factor", "0",
         "cfg.json: field \"routed_scaling_factor\": expected a finite number > 0, found 0"},
        {"swiglu_limit", "-10.0",
         "cfg.json: field \"swiglu_limit\": expected a finite number > 0, found -10"},
        {"rms_norm_eps", "1e39",
         "cfg.json: field \"rms_norm_eps\": expected a number > 0 within 32-bit float range, "
         "found 1e+39"},
        {"rms_norm_eps", "1e-50",
         "cfg.json: field \"rms_norm_eps\": expected a number > 0 within 32-bit float range, "
         "found 1e-50"},
        {"scoring_func", "\"softmax\"",
         "cfg.json: field \"scoring_func\": expected \"sqrtsoftplus\", found \"softmax\""},
        {"topk_method", "\"greedy\"",
         "cfg.json: field \"topk_method\": expected \"noaux_tc\", found \"greedy\""},
        {"hidden_act", "\"gelu\"",
         "cfg.json: field \"hidden_act\": expected \"silu\", found \"gelu\""},
        {"n_group", "8",
         "cfg.json: field \"n_group\": expected null or 1 (group-limited routing is not "
         "supported), found 8"},
        {"topk_group", "4",
         "cfg.json: field \"topk_group\": expected null or 1 (group-limited routing is not "
         "supported), found 4"},
        {"n_group", "1.0",
         "cfg.json: field \"n_group\": expected null or 1 (group-limited routing is not "
         "supported), found 1.0"},
        {"quantization_config.fmt", "\"e5m2\"",
         "cfg.json: field \"quantization_config.fmt\": expected \"e4m3\", found \"e5m2\""},
        {"quantization_config.weight_block_size", "[64, 64]",
         "cfg.json: field \"quantization_config.weight_block_size\": expected [128, 128], found "
         "[64, 64]"},
        {"quantization_config.weight_block_size", "[128]",
         "cfg.json: field \"quantization_config.weight_block_size\": expected [128, 128], found "
         "[128]"},
        {"quantization_config.weight_block_size", "[128, 128, 128]",
         "cfg.json: field \"quantization_config.weight_block_size\": expected [128, 128], found "
         "[128, 128, 128]"},
    };
    check_cases(cases, sizeof cases / sizeof cases[0]);

    /* top-k against a smaller expert count */
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_variant("n_routed_experts", "5", &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: field \"num_experts_per_tok\": expected at most "
                          "n_routed_experts (5), found 6");
    CHECK_EQ(parse_variant("n_routed_experts", "6", &c, &err), 0);
    CHECK_EQ(parse_variant("num_hash_layers", "43", &c, &err), 0);
    CHECK_EQ(parse_variant("num_hash_layers", "0", &c, &err), 0);
}

TEST(hash_layers_need_a_vocabulary)
{
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_text(MINIMAL, &c, &err), 0); /* vocab_size 0 is fine without hash layers */
    const char *with_hash =
        "{\"hidden_size\": 128, \"moe_intermediate_size\": 128, \"n_routed_experts\": 1,"
        " \"n_shared_experts\": 1, \"num_experts_per_tok\": 1, \"num_hidden_layers\": 1,"
        " \"num_hash_layers\": 1, \"vocab_size\": 0, \"routed_scaling_factor\": 1,"
        " \"swiglu_limit\": 10, \"rms_norm_eps\": 1e-6, \"scoring_func\": \"sqrtsoftplus\"}";
    CHECK_EQ(parse_text(with_hash, &c, &err), -1);
    CHECK_STR_HAS(err.msg, "field \"vocab_size\": expected at least 1");
}

TEST(syntax_errors_give_line_and_column)
{
    mc_config c;
    ep_err err;
    /* line 3, the ']' at column 8 */
    CHECK_EQ(parse_text("{\n  \"hidden_size\": 4096,\n  \"x\": ]\n}\n", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json:3:8: ");
    CHECK_STR_HAS(err.msg, "unexpected token");

    CHECK_EQ(parse_text("{\"hidden_size\": 4096, \"hidden_size\": 4096}", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json:1:");
    CHECK_STR_HAS(err.msg, "duplicate object key");

    CHECK_EQ(parse_text("", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json:");

    CHECK_EQ(parse_text("{} {}", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json:1:");

    CHECK_EQ(parse_text("[1, 2]", &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: expected a JSON object at the top level, found an array");

    CHECK_EQ(parse_text("{}", &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: missing field \"hidden_size\"");
}

TEST(failed_parse_leaves_output_untouched)
{
    mc_config c;
    memset(&c, 0x5a, sizeof c);
    mc_config before = c;
    ep_err err;
    CHECK_EQ(parse_variant("vocab_size", "0", &c, &err), -1);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

/* Every resolved field, in canonical order, of the Flash config. */
static const char FLASH_CANONICAL[] = "hidden_size=4096\n"
                                      "moe_intermediate_size=2048\n"
                                      "n_routed_experts=256\n"
                                      "n_shared_experts=1\n"
                                      "num_experts_per_tok=6\n"
                                      "num_hidden_layers=43\n"
                                      "num_hash_layers=3\n"
                                      "num_nextn_predict_layers=1\n"
                                      "vocab_size=129280\n"
                                      "routed_scaling_factor=0x3fc00000\n"
                                      "swiglu_limit=0x41200000\n"
                                      "rms_norm_eps=0x358637bd\n"
                                      "norm_topk_prob=1\n"
                                      "expert_dtype=fp4\n"
                                      "expert_dtype_given=1\n"
                                      "scale_e8m0=1\n"
                                      "act_ue8m0=1\n";

/* FNV-1a 64, written out here from its definition (offset basis 14695981039346656037,
 * prime 1099511628211). */
static uint64_t fnv1a(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

TEST(canonical_text_of_flash)
{
    mc_config c = flash();
    char buf[1024];
    int n = mc_canonical(&c, buf, sizeof buf);
    CHECK_STR_EQ(buf, FLASH_CANONICAL);
    CHECK_EQ(n, (int)strlen(FLASH_CANONICAL));
    CHECK_EQ(mc_canonical(&c, NULL, 0), n); /* snprintf semantics */
    char small[16];
    CHECK_EQ(mc_canonical(&c, small, sizeof small), n);
    CHECK_STR_EQ(small, "hidden_size=409");
    CHECK(mc_hash(&c) == fnv1a(FLASH_CANONICAL));

    mc_config b = c;
    b.expert_dtype = MC_FP8;
    b.scale_e8m0 = false;
    CHECK_EQ(mc_canonical(&b, buf, sizeof buf), n);
    CHECK_STR_HAS(buf, "\nexpert_dtype=fp8\nexpert_dtype_given=1\nscale_e8m0=0\n");
}

TEST(hash_is_stable_and_ignores_json_form)
{
    mc_config a = flash(), b = flash();
    CHECK(mc_hash(&a) == mc_hash(&b));

    /* The same object with its keys in reverse order, compact, and without the ignored keys. */
    json_error_t je;
    json_t *root = json_loads(FLASH, 0, &je);
    json_t *rev = json_object();
    json_t *keys = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) json_array_append_new(keys, json_string(k));
    for (size_t i = json_array_size(keys); i-- > 0;) {
        const char *key = json_string_value(json_array_get(keys, i));
        json_object_set(rev, key, json_object_get(root, key));
    }
    char *text = json_dumps(rev, JSON_COMPACT);
    CHECK(strncmp(text, "{\"vocab_size\":129280,", 21) == 0); /* really reversed */
    mc_config r;
    ep_err err;
    CHECK_EQ(parse_text(text, &r, &err), 0);
    CHECK(mc_hash(&r) == mc_hash(&a));
    free(text);

    static const char *const ignored[] = {"hc_mult",     "compress_ratios", "rope_scaling",
                                          "torch_dtype", "architectures",   "head_dim"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        json_object_del(root, ignored[i]);
    json_object_set_new(json_object_get(root, "quantization_config"), "activation_scheme",
                        json_string("static"));
    text = json_dumps(root, JSON_INDENT(8));
    CHECK_EQ(parse_text(text, &r, &err), 0);
    CHECK(mc_hash(&r) == mc_hash(&a));
    free(text);
    json_decref(keys);
    json_decref(rev);
    json_decref(root);

    /* Equal values written differently resolve to the same config. */
    CHECK_EQ(parse_variant("swiglu_limit", "10", &r, &err), 0);
    CHECK(mc_hash(&r) == mc_hash(&a));
    CHECK_EQ(parse_variant("swiglu_limit", "1e1", &r, &err), 0);
    CHECK(mc_hash(&r) == mc_hash(&a));
}

TEST(hash_changes_with_every_field)
{
    const mc_config base = flash();
    enum { NV = 17 };
    mc_config v[NV];
    for (int i = 0; i < NV; i++)
        v[i] = base;
    v[0].hidden_size = 2048;
    v[1].moe_intermediate_size = 1024;
    v[2].n_routed_experts = 128;
    v[3].n_shared_experts = 2; /* invalid, but the hash must still see it */
    v[4].num_experts_per_tok = 8;
    v[5].num_hidden_layers = 61;
    v[6].num_hash_layers = 0;
    v[7].num_nextn_predict_layers = 0;
    v[8].vocab_size = 129281;
    v[9].routed_scaling_factor = 2.5f;
    v[10].swiglu_limit = 7.0f;
    v[11].rms_norm_eps = 1e-5f;
    v[12].norm_topk_prob = false;
    v[13].expert_dtype = MC_FP8;
    v[14].expert_dtype_given = false;
    v[15].scale_e8m0 = false;
    v[16].act_ue8m0 = false;
    uint64_t h[NV + 1];
    h[NV] = mc_hash(&base);
    for (int i = 0; i < NV; i++)
        h[i] = mc_hash(&v[i]);
    for (int i = 0; i <= NV; i++)
        for (int j = i + 1; j <= NV; j++)
            if (h[i] == h[j])
                TEST_FAIL_AT("variants %d and %d hash equal", i, j);

    /* a float differing in its last bit */
    mc_config u = base;
    uint32_t b = bits(u.rms_norm_eps) + 1;
    memcpy(&u.rms_norm_eps, &b, sizeof b);
    CHECK(mc_hash(&u) != mc_hash(&base));
}

TEST(validate_applies_the_parse_rules)
{
    const mc_config base = flash();
    ep_err err;
    CHECK_EQ(mc_validate(&base, &err), 0);
    mc_config c = base;
    c.expert_dtype = MC_FP8;
    c.scale_e8m0 = false;
    CHECK_EQ(mc_validate(&c, &err), 0);

    c = base;
    c.hidden_size = 100;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_EQ(
        err.msg,
        "model config: field \"hidden_size\": expected a positive multiple of 128, found 100");
    c = base;
    c.n_shared_experts = 2;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"n_shared_experts\": expected 1");
    c = base;
    c.num_experts_per_tok = 257;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"num_experts_per_tok\": expected an integer in "
                           "[1, 64], found 257");
    c = base;
    c.n_routed_experts = 4;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_EQ(err.msg, "model config: field \"num_experts_per_tok\": expected at most "
                          "n_routed_experts (4), found 6");
    c = base;
    c.num_hash_layers = 44;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"num_hash_layers\": expected at most");
    c = base;
    c.vocab_size = 0;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"vocab_size\"");
    c = base;
    c.swiglu_limit = NAN;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"swiglu_limit\": expected a finite number > 0");
    c = base;
    c.routed_scaling_factor = INFINITY;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"routed_scaling_factor\"");
    c = base;
    c.rms_norm_eps = -1e-6f;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"rms_norm_eps\"");
    c = base;
    c.expert_dtype = (mc_expert_dtype)7;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_EQ(err.msg,
                 "unsupported expert_dtype \"7\" in model config: expected one of fp4, fp8");
    c = base;
    c.scale_e8m0 = false;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_EQ(err.msg,
                 "model config: field \"scale_e8m0\": expected 1 for expert_dtype fp4, found 0");
    c = base;
    c.expert_dtype = MC_FP8;
    c.scale_e8m0 = false;
    c.expert_dtype_given = false;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"expert_dtype_given\"");
}

TEST(load_reads_a_file_and_bounds_its_size)
{
    char dir[] = "/tmp/epmoe-mc-XXXXXX";
    if (mkdtemp(dir) == NULL)
        SKIP("mkdtemp failed");
    char path[256], big[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(big, sizeof big, "%s/big.json", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f != NULL) {
        fwrite(FLASH, 1, strlen(FLASH), f);
        fclose(f);
    }
    mc_config c;
    ep_err err;
    CHECK_EQ(mc_load(path, &c, &err), 0);
    CHECK_EQ(c.vocab_size, 129280);

    /* One byte over the limit: a valid JSON prefix padded with spaces. */
    f = fopen(big, "wb");
    CHECK(f != NULL);
    if (f != NULL) {
        fwrite(MINIMAL, 1, strlen(MINIMAL), f);
        for (size_t i = strlen(MINIMAL); i < MC_MAX_CONFIG_BYTES + 1u; i++)
            fputc(' ', f);
        fclose(f);
    }
    CHECK_EQ(mc_load(big, &c, &err), -1);
    CHECK_STR_HAS(err.msg, big);
    CHECK_STR_HAS(err.msg, "larger than 16777216 bytes");

    /* Exactly at the limit is read and parsed (trailing whitespace is JSON). */
    if (truncate(big, MC_MAX_CONFIG_BYTES) == 0) {
        CHECK_EQ(mc_load(big, &c, &err), 0);
    }

    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope.json", dir);
    CHECK_EQ(mc_load(missing, &c, &err), -1);
    CHECK_STR_HAS(err.msg, missing);
    CHECK_STR_HAS(err.msg, "No such file");

    CHECK_EQ(mc_load(dir, &c, &err), -1); /* a directory */
    CHECK_STR_HAS(err.msg, dir);

    f = fopen(path, "wb");
    if (f != NULL) {
        fputs("{\n  \"hidden_size\": 4096,\n  oops\n}", f);
        fclose(f);
    }
    CHECK_EQ(mc_load(path, &c, &err), -1);
    char want[300];
    snprintf(want, sizeof want, "%s:3:", path);
    CHECK_STR_HAS(err.msg, want);

    unlink(path);
    unlink(big);
    rmdir(dir);
}

/* ---- configs as engines write them (issue 24) --------------------------------------------- */

/* Load tests/data/hf-configs/NAME/config.json (written by transformers 5.23; see the README there).
 * Returns mc_load's result; -2 when the source directory is unknown. */
static int load_hf(const char *name, mc_config *c, ep_err *err)
{
    const char *src = getenv("EPMOE_SOURCE_DIR");
    if (src == NULL)
        return -2;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/hf-configs/%s/config.json", src, name);
    ep_err_clear(err);
    return mc_load(path, c, err);
}

#define NEED_SOURCE_DIR()                                                                          \
    do {                                                                                           \
        if (getenv("EPMOE_SOURCE_DIR") == NULL)                                                    \
            SKIP("EPMOE_SOURCE_DIR is not set (run through ctest)");                               \
    } while (0)

TEST(transformers_fp8_config_loads)
{
    NEED_SOURCE_DIR();
    mc_config c;
    ep_err err;
    /* save_pretrained of DeepseekV4Config(quantization_config=FineGrainedFP8Config(
     * expert_dtype="fp8")): no num_hash_layers, expert_dtype only in quantization_config,
     * scale_fmt "float" (F32 weight scales in transformers; plain activation scales here) */
    CHECK_EQ(load_hf("v4-fp8", &c, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    CHECK_EQ(c.expert_dtype, MC_FP8);
    CHECK(c.expert_dtype_given);
    CHECK(!c.scale_e8m0);
    CHECK(!c.act_ue8m0);
    CHECK_EQ(c.num_hash_layers, 1);
    CHECK_EQ(c.num_hidden_layers, 4);
    CHECK_EQ(c.n_routed_experts, 16);

    CHECK_EQ(load_hf("v4-fp4-ue8m0", &c, &err), 0);
    CHECK_EQ(c.expert_dtype, MC_FP4);
    CHECK(c.expert_dtype_given);
    CHECK(c.scale_e8m0);
    CHECK(c.act_ue8m0);
    CHECK_EQ(c.num_hash_layers, 1);
}

/* epmoe's own config through AutoConfig.from_pretrained + save_pretrained resolves to the same
 * config, hash included, as the file mkmodel wrote. */
TEST(autoconfig_round_trip_keeps_the_config_hash)
{
    NEED_SOURCE_DIR();
    static const char *const pairs[][2] = {{"mkmodel-fp4", "mkmodel-fp4-autoconfig"},
                                           {"mkmodel-fp8", "mkmodel-fp8-autoconfig"}};
    for (int i = 0; i < 2; i++) {
        mc_config a, b;
        ep_err err;
        CHECK_EQ(load_hf(pairs[i][0], &a, &err), 0);
        CHECK_EQ(load_hf(pairs[i][1], &b, &err), 0);
        if (err.msg[0])
            printf("  %s: %s\n", pairs[i][1], err.msg);
        CHECK_EQ(b.expert_dtype, i == 0 ? MC_FP4 : MC_FP8);
        CHECK(b.expert_dtype_given);
        CHECK_EQ(b.num_hash_layers, 1);
        CHECK(mc_hash(&a) == mc_hash(&b));
    }
}

TEST(transformers_configs_that_change_the_layer_are_refused)
{
    NEED_SOURCE_DIR();
    static const struct {
        const char *name, *msg[3];
    } cases[] = {
        {"dtype-conflict",
         {"field \"expert_dtype\" is \"fp4\"",
          "field \"quantization_config.expert_dtype\" is \"fp8\"", "must agree"}},
        {"hash-after-moe",
         {"field \"mlp_layer_types\"[1]: \"hash_moe\" after \"moe\" at [0]",
          "only as the first layers", NULL}},
        {"hash-conflict",
         {"field \"num_hash_layers\" is 2", "\"mlp_layer_types\" starts with 1 \"hash_moe\"",
          "must agree"}},
        {"fp4-scale-float",
         {"field \"quantization_config.scale_fmt\": \"float\" is refused with expert_dtype fp4",
          "about 6 %", "write \"ue8m0\""}},
        {"norm-topk-false", {"field \"norm_topk_prob\": false is refused", "10.2", "1.5"}},
        {"deepseek-v41",
         {"model_type \"deepseek_v41\" is not served", "model_type \"deepseek_v4\"", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mc_config c;
        ep_err err;
        CHECK_EQ(load_hf(cases[i].name, &c, &err), -1);
        CHECK_STR_HAS(err.msg, "hf-configs/");
        for (int j = 0; j < 3 && cases[i].msg[j] != NULL; j++)
            CHECK_STR_HAS(err.msg, cases[i].msg[j]);
    }
}

TEST(mlp_layer_types_give_the_hash_layers)
{
    mc_config c;
    ep_err err;
    /* FLASH has num_hash_layers 3 and 43 layers */
    static const char three[] = "[\"hash_moe\",\"hash_moe\",\"hash_moe\"" /* then 40 x moe */;
    char list[1024];
    snprintf(list, sizeof list, "%s", three);
    for (int i = 3; i < 43; i++)
        strncat(list, ",\"moe\"", sizeof list - strlen(list) - 1);
    strncat(list, "]", sizeof list - strlen(list) - 1);
    json_error_t je;
    json_t *root = json_loads(FLASH, 0, &je);
    json_object_set_new(root, "mlp_layer_types", json_loads(list, 0, &je));
    char *text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), 0); /* both present and agreeing */
    CHECK_EQ(c.num_hash_layers, 3);
    mc_config flash_c = flash();
    CHECK(mc_hash(&c) == mc_hash(&flash_c));
    free(text);
    json_object_del(root, "num_hash_layers");
    text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), 0); /* alone */
    CHECK_EQ(c.num_hash_layers, 3);
    CHECK(mc_hash(&c) == mc_hash(&flash_c));
    free(text);
    json_decref(root);

    CHECK_EQ(parse_variant("mlp_layer_types", "null", &c, &err), 0);
    CHECK_EQ(c.num_hash_layers, 3);

    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"\"hash_moe\"",
         "cfg.json: field \"mlp_layer_types\": expected an array of \"hash_moe\" and \"moe\", "
         "found a string (\"hash_moe\")"},
        {"[\"hash_moe\",\"moe\"]",
         "cfg.json: field \"mlp_layer_types\": expected 43 entries (num_hidden_layers), found 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(parse_variant("mlp_layer_types", bad[i].json, &c, &err), -1);
        CHECK_STR_EQ(err.msg, bad[i].msg);
    }
    /* a bad entry is named by its position */
    root = json_loads(FLASH, 0, &je);
    json_t *arr = json_loads(list, 0, &je);
    json_array_set_new(arr, 7, json_string("dense"));
    json_object_set_new(root, "mlp_layer_types", arr);
    text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: field \"mlp_layer_types\"[7]: expected \"hash_moe\" or "
                          "\"moe\", found a string (\"dense\")");
    free(text);
    json_array_set_new(arr, 7, json_integer(1));
    text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), -1);
    CHECK_STR_HAS(err.msg, "\"mlp_layer_types\"[7]: expected \"hash_moe\" or \"moe\", found an "
                           "integer (1)");
    free(text);
    json_decref(root);
}

TEST(expert_dtype_from_quantization_config)
{
    mc_config c, top;
    ep_err err;
    CHECK_EQ(parse_variant("expert_dtype", "\"fp8\"", &top, &err), 0);

    /* only in quantization_config: given, and the same config as the top-level spelling */
    json_error_t je;
    json_t *root = json_loads(FLASH, 0, &je);
    json_object_del(root, "expert_dtype");
    json_object_set_new(json_object_get(root, "quantization_config"), "expert_dtype",
                        json_string("fp8"));
    char *text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), 0);
    CHECK_EQ(c.expert_dtype, MC_FP8);
    CHECK(c.expert_dtype_given);
    CHECK(!c.scale_e8m0);
    CHECK(mc_hash(&c) == mc_hash(&top));
    free(text);

    /* both, agreeing */
    json_object_set_new(root, "expert_dtype", json_string("fp8"));
    text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), 0);
    CHECK(mc_hash(&c) == mc_hash(&top));
    free(text);

    /* both, disagreeing: the error names both */
    json_object_set_new(root, "expert_dtype", json_string("fp4"));
    text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: field \"expert_dtype\" is \"fp4\" but field "
                          "\"quantization_config.expert_dtype\" is \"fp8\": they must agree "
                          "(DeepSeek's code and vLLM read the first, transformers the second)");
    free(text);

    /* a bad value inside quantization_config is named there */
    json_object_del(root, "expert_dtype");
    json_object_set_new(json_object_get(root, "quantization_config"), "expert_dtype",
                        json_string("nvfp4"));
    text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), -1);
    CHECK_STR_EQ(err.msg, "unsupported quantization_config.expert_dtype \"nvfp4\" in cfg.json: "
                          "expected one of fp4, fp8");
    free(text);
    json_decref(root);

    /* neither: fp4 defaulted, as before */
    CHECK_EQ(parse_variant("expert_dtype", NULL, &c, &err), 0);
    CHECK_EQ(c.expert_dtype, MC_FP4);
    CHECK(!c.expert_dtype_given);
}

TEST(scale_fmt_and_norm_topk_prob_that_change_the_layer)
{
    mc_config c;
    ep_err err;
    /* "float" with FP8 experts: served, plain activation scales (docs/numerics.md) */
    json_error_t je;
    json_t *root = json_loads(FLASH, 0, &je);
    json_object_set_new(root, "expert_dtype", json_string("fp8"));
    json_object_set_new(json_object_get(root, "quantization_config"), "scale_fmt",
                        json_string("float"));
    char *text = json_dumps(root, 0);
    CHECK_EQ(parse_text(text, &c, &err), 0);
    CHECK(!c.act_ue8m0);
    free(text);
    json_decref(root);
    /* "float" with FP4 experts: refused, saying what it would change */
    CHECK_EQ(parse_variant("quantization_config.scale_fmt", "\"float\"", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json: field \"quantization_config.scale_fmt\": \"float\" is "
                           "refused with expert_dtype fp4");
    CHECK_STR_HAS(err.msg, "power-of-two rounding of FP8 activation scales");
    /* any other spelling: refused (it used to mean plain scales, silently) */
    static const char *const other[] = {"\"fp32\"", "\"UE8M0\"", "\"\""};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(parse_variant("quantization_config.scale_fmt", other[i], &c, &err), -1);
        CHECK_STR_HAS(err.msg, "cfg.json: field \"quantization_config.scale_fmt\": expected "
                               "\"ue8m0\" or \"float\", found ");
    }
    CHECK_EQ(parse_variant("norm_topk_prob", "false", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "cfg.json: field \"norm_topk_prob\": false is refused: DeepSeek V4's "
                           "reference and transformers renormalise");
    CHECK_EQ(parse_variant("norm_topk_prob", "true", &c, &err), 0);
    /* a received config must obey the same rule */
    c = flash();
    c.norm_topk_prob = false;
    CHECK_EQ(mc_validate(&c, &err), -1);
    CHECK_STR_HAS(err.msg, "model config: field \"norm_topk_prob\": expected 1");
}

TEST(model_type_must_be_deepseek_v4)
{
    mc_config c;
    ep_err err;
    CHECK_EQ(parse_variant("model_type", NULL, &c, &err), 0);
    CHECK_EQ(parse_variant("model_type", "\"deepseek_v41\"", &c, &err), -1);
    CHECK_STR_EQ(err.msg, "cfg.json: model_type \"deepseek_v41\" is not served: epmoe serves the "
                          "MoE layers of DeepSeek V4 (model_type \"deepseek_v4\", fields at the "
                          "top level) and does not read another model's config as V4");
    CHECK_EQ(parse_variant("model_type", "\"deepseek_v3\"", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "model_type \"deepseek_v3\" is not served");
    CHECK_EQ(parse_variant("model_type", "4", &c, &err), -1);
    CHECK_STR_HAS(err.msg, "field \"model_type\": expected the string \"deepseek_v4\"");
}

TEST(layers_and_dtype_names)
{
    mc_config c = flash();
    CHECK_EQ(mc_num_layers(&c), 44);
    CHECK(mc_layer_is_hash(&c, 0));
    CHECK(mc_layer_is_hash(&c, 2));
    CHECK(!mc_layer_is_hash(&c, 3));
    CHECK(!mc_layer_is_hash(&c, 42));
    CHECK(!mc_layer_is_hash(&c, 43)); /* mtp.0 is never hash-routed */
    CHECK(!mc_layer_is_hash(&c, -1));
    c.num_hash_layers = 43;
    CHECK(mc_layer_is_hash(&c, 42));
    CHECK(!mc_layer_is_hash(&c, 43));

    CHECK_STR_EQ(mc_dtype_name(MC_FP4), "fp4");
    CHECK_STR_EQ(mc_dtype_name(MC_FP8), "fp8");
    mc_expert_dtype d = MC_FP4;
    CHECK_EQ(mc_dtype_parse("fp8", &d), 0);
    CHECK_EQ(d, MC_FP8);
    CHECK_EQ(mc_dtype_parse("fp4", &d), 0);
    CHECK_EQ(d, MC_FP4);
    CHECK_EQ(mc_dtype_parse("fp16", &d), -1);
    CHECK_EQ(mc_dtype_parse("FP8", &d), -1);
    CHECK_EQ(mc_dtype_parse("", &d), -1);
    CHECK_EQ(mc_dtype_parse(NULL, &d), -1);
    CHECK_EQ(d, MC_FP4);
}

int main(void)
{
    RUN(flash_config_resolves_every_field);
    RUN(minimal_config_takes_the_defaults);
    RUN(parse_reads_exactly_len_bytes);
    RUN(expert_dtype_resolution);
    RUN(every_required_field_missing_is_named);
    RUN(optional_fields_may_be_absent);
    RUN(wrong_json_types_are_named);
    RUN(floats_may_be_written_as_integers);
    RUN(range_errors_name_field_expected_and_found);
    RUN(hash_layers_need_a_vocabulary);
    RUN(syntax_errors_give_line_and_column);
    RUN(failed_parse_leaves_output_untouched);
    RUN(canonical_text_of_flash);
    RUN(hash_is_stable_and_ignores_json_form);
    RUN(hash_changes_with_every_field);
    RUN(validate_applies_the_parse_rules);
    RUN(load_reads_a_file_and_bounds_its_size);
    RUN(layers_and_dtype_names);
    RUN(transformers_fp8_config_loads);
    RUN(autoconfig_round_trip_keeps_the_config_hash);
    RUN(transformers_configs_that_change_the_layer_are_refused);
    RUN(mlp_layer_types_give_the_hash_layers);
    RUN(expert_dtype_from_quantization_config);
    RUN(scale_fmt_and_norm_topk_prob_that_change_the_layer);
    RUN(model_type_must_be_deepseek_v4);
    return test_report();
}
