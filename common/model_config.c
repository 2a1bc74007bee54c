/*
 * model_config.c — config.json -> mc_config, validation, canonical text and hash (see
 * model_config.h).
 *
 * Parsing has two layers. Extraction checks each JSON value's type and the field's own bounds,
 * so every integer fits an int before it is stored; then the cross-field rules run on the
 * struct. mc_validate applies the same per-field and cross-field rules to a struct received
 * from elsewhere, so a worker can never accept a config the coordinator would have refused.
 * Fields the MoE layer does not use (hc_*, compress_ratios, rope_*, ...) are ignored.
 *
 * Optional keys written as JSON null count as absent where Hugging Face configs use null for
 * "not set": quantization_config, quantization_config.scale_fmt, n_group, topk_group,
 * mlp_layer_types.
 *
 * Configs come from DeepSeek (num_hash_layers, a top-level expert_dtype) and from Hugging Face
 * transformers (mlp_layer_types, quantization_config.expert_dtype); where both spellings are
 * present they must agree. Fields whose meaning differs between engines are served as
 * docs/numerics.md documents or refused with what they would change.
 */
#include "common/model_config.h"
#include "common/rfile.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"

/* Longest JSON value text quoted in a message; longer values are cut with "...". */
enum { MC_TEXT_MAX = 80 };

/* ---- per-field rules -------------------------------------------------------------------- */

typedef enum int_rule {
    RULE_MULT128, /* positive multiple of EP_FP8_BLOCK, at most hi */
    RULE_ONE,     /* exactly 1 */
    RULE_RANGE,   /* lo..hi inclusive */
} int_rule;

typedef struct int_field {
    const char *key;
    size_t off; /* offset of the int in mc_config */
    bool required;
    int_rule rule;
    long long lo, hi;
} int_field;

static const int_field INT_FIELDS[] = {
    {"hidden_size", offsetof(mc_config, hidden_size), true, RULE_MULT128, 1, MC_MAX_HIDDEN},
    {"moe_intermediate_size", offsetof(mc_config, moe_intermediate_size), true, RULE_MULT128, 1,
     MC_MAX_INTER},
    {"n_routed_experts", offsetof(mc_config, n_routed_experts), true, RULE_RANGE, 1,
     MC_MAX_EXPERTS},
    {"n_shared_experts", offsetof(mc_config, n_shared_experts), true, RULE_ONE, 1, 1},
    {"num_experts_per_tok", offsetof(mc_config, num_experts_per_tok), true, RULE_RANGE, 1,
     MC_MAX_TOPK},
    {"num_hidden_layers", offsetof(mc_config, num_hidden_layers), true, RULE_RANGE, 1,
     MC_MAX_LAYERS},
    /* optional here: transformers writes mlp_layer_types instead (parse_hash_layers) */
    {"num_hash_layers", offsetof(mc_config, num_hash_layers), false, RULE_RANGE, 0, MC_MAX_LAYERS},
    {"num_nextn_predict_layers", offsetof(mc_config, num_nextn_predict_layers), false, RULE_RANGE,
     0, MC_MAX_MTP},
    {"vocab_size", offsetof(mc_config, vocab_size), true, RULE_RANGE, 0, MC_MAX_VOCAB},
};
enum { N_INT_FIELDS = sizeof INT_FIELDS / sizeof INT_FIELDS[0] };

typedef struct float_field {
    const char *key;
    size_t off; /* offset of the float in mc_config */
} float_field;

static const float_field FLOAT_FIELDS[] = {
    {"routed_scaling_factor", offsetof(mc_config, routed_scaling_factor)},
    {"swiglu_limit", offsetof(mc_config, swiglu_limit)},
    {"rms_norm_eps", offsetof(mc_config, rms_norm_eps)},
};
enum { N_FLOAT_FIELDS = sizeof FLOAT_FIELDS / sizeof FLOAT_FIELDS[0] };

static int *int_at(mc_config *c, const int_field *f)
{
    return (int *)((char *)c + f->off);
}

static int int_get(const mc_config *c, const int_field *f)
{
    return *(const int *)((const char *)c + f->off);
}

static float *float_at(mc_config *c, const float_field *f)
{
    return (float *)((char *)c + f->off);
}

static float float_get(const mc_config *c, const float_field *f)
{
    return *(const float *)((const char *)c + f->off);
}

/* The field's own bounds (no other field involved). v is wide so that a JSON integer can be
 * judged before it is narrowed to int. */
static int check_int(const char *src, const int_field *f, long long v, ep_err *err)
{
    switch (f->rule) {
    case RULE_MULT128:
        if (v <= 0 || v % EP_FP8_BLOCK != 0)
            return ep_err_set(err,
                              "%s: field \"%s\": expected a positive multiple of %d, found %lld",
                              src, f->key, EP_FP8_BLOCK, v);
        if (v > f->hi)
            return ep_err_set(err, "%s: field \"%s\": expected at most %lld, found %lld", src,
                              f->key, f->hi, v);
        return 0;
    case RULE_ONE:
        if (v != 1)
            return ep_err_set(err,
                              "%s: field \"%s\": expected 1 (DeepSeek V4 has exactly one shared "
                              "expert), found %lld",
                              src, f->key, v);
        return 0;
    case RULE_RANGE:
        if (v < f->lo || v > f->hi)
            return ep_err_set(err,
                              "%s: field \"%s\": expected an integer in [%lld, %lld], found %lld",
                              src, f->key, f->lo, f->hi, v);
        return 0;
    }
    return ep_err_set(err, "%s: field \"%s\": internal error: unknown rule", src, f->key);
}

/* v comes from a JSON number (a double) or from a received float. It must be a finite positive
 * number that survives narrowing to float without becoming 0 or overflowing. */
static int check_float(const char *src, const char *key, double v, ep_err *err)
{
    if (!isfinite(v) || !(v > 0))
        return ep_err_set(err, "%s: field \"%s\": expected a finite number > 0, found %.9g", src,
                          key, v);
    if (v > FLT_MAX || (float)v == 0.0f)
        return ep_err_set(err,
                          "%s: field \"%s\": expected a number > 0 within 32-bit float range, "
                          "found %.9g",
                          src, key, v);
    return 0;
}

/* Rules that relate fields to each other. */
static int check_cross(const char *src, const mc_config *c, ep_err *err)
{
    if (c->num_experts_per_tok > c->n_routed_experts)
        return ep_err_set(err,
                          "%s: field \"num_experts_per_tok\": expected at most n_routed_experts "
                          "(%d), found %d",
                          src, c->n_routed_experts, c->num_experts_per_tok);
    if (c->num_hash_layers > c->num_hidden_layers)
        return ep_err_set(err,
                          "%s: field \"num_hash_layers\": expected at most num_hidden_layers "
                          "(%d), found %d",
                          src, c->num_hidden_layers, c->num_hash_layers);
    if (c->num_hash_layers > 0 && c->vocab_size < 1)
        return ep_err_set(err,
                          "%s: field \"vocab_size\": expected at least 1 because num_hash_layers "
                          "is %d (hash layers look up tid2eid by token id), found %d",
                          src, c->num_hash_layers, c->vocab_size);
    return 0;
}

/* ---- JSON helpers ----------------------------------------------------------------------- */

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
        return "null";
    }
    return "an unknown value";
}

/* The value as JSON text, cut to MC_TEXT_MAX bytes. */
static const char *json_text(const json_t *v, char *buf, size_t cap)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY);
    if (s == NULL) {
        snprintf(buf, cap, "%s", json_kind(v));
        return buf;
    }
    if (strlen(s) > MC_TEXT_MAX)
        snprintf(buf, cap, "%.*s...", (int)MC_TEXT_MAX, s);
    else
        snprintf(buf, cap, "%s", s);
    free(s);
    return buf;
}

/* "a string ("4096")" for compound kinds; "true", "null" when the kind is the value. */
static const char *json_found(const json_t *v, char *buf, size_t cap)
{
    if (json_is_boolean(v) || json_is_null(v))
        return json_kind(v);
    char text[MC_TEXT_MAX + 8];
    snprintf(buf, cap, "%s (%s)", json_kind(v), json_text(v, text, sizeof text));
    return buf;
}

static int type_error(const char *src, const char *key, const char *expected, const json_t *v,
                      ep_err *err)
{
    char found[MC_TEXT_MAX + 32];
    return ep_err_set(err, "%s: field \"%s\": expected %s, found %s", src, key, expected,
                      json_found(v, found, sizeof found));
}

/* A string as it appears in a message: control bytes escaped, cut to MC_TEXT_MAX. */
static const char *printable(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; s[i] != '\0' && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (i >= MC_TEXT_MAX) {
            o += (size_t)snprintf(buf + o, cap - o, "...");
            break;
        }
        if (ch < 0x20 || ch == 0x7f)
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o] = '\0';
    return buf;
}

/* A string field that, when present, must equal want. */
static int check_string_is(const char *src, const char *key, const json_t *v, const char *want,
                           ep_err *err)
{
    if (json_is_string(v) && strcmp(json_string_value(v), want) == 0)
        return 0;
    char text[MC_TEXT_MAX + 8];
    return ep_err_set(err, "%s: field \"%s\": expected \"%s\", found %s", src, key, want,
                      json_text(v, text, sizeof text));
}

/* ---- extraction ------------------------------------------------------------------------- */

static int parse_ints(const char *src, const json_t *root, mc_config *c, ep_err *err)
{
    for (int i = 0; i < N_INT_FIELDS; i++) {
        const int_field *f = &INT_FIELDS[i];
        const json_t *v = json_object_get(root, f->key);
        if (v == NULL) {
            if (f->required)
                return ep_err_set(err, "%s: missing field \"%s\"", src, f->key);
            *int_at(c, f) = 0; /* num_nextn_predict_layers defaults to 0; num_hash_layers is
                                  resolved by parse_hash_layers */
            continue;
        }
        if (!json_is_integer(v))
            return type_error(src, f->key, "an integer", v, err);
        long long n = (long long)json_integer_value(v);
        if (check_int(src, f, n, err) != 0)
            return -1;
        *int_at(c, f) = (int)n; /* within [lo, hi], which fits an int */
    }
    return 0;
}

static int parse_floats(const char *src, const json_t *root, mc_config *c, ep_err *err)
{
    for (int i = 0; i < N_FLOAT_FIELDS; i++) {
        const float_field *f = &FLOAT_FIELDS[i];
        const json_t *v = json_object_get(root, f->key);
        if (v == NULL)
            return ep_err_set(err, "%s: missing field \"%s\"", src, f->key);
        if (!json_is_number(v)) /* integers are numbers too: "swiglu_limit": 10 */
            return type_error(src, f->key, "a number", v, err);
        double d = json_number_value(v);
        if (check_float(src, f->key, d, err) != 0)
            return -1;
        *float_at(c, f) = (float)d;
    }
    return 0;
}

/* One expert_dtype value; key is where it was found ("expert_dtype" at the top level or
 * "quantization_config.expert_dtype"). */
static int dtype_value(const char *src, const char *key, const json_t *v, mc_expert_dtype *out,
                       ep_err *err)
{
    if (json_is_string(v) && mc_dtype_parse(json_string_value(v), out) == 0)
        return 0;
    char text[MC_TEXT_MAX + 8];
    const char *shown = json_is_string(v) ? printable(json_string_value(v), text, sizeof text)
                                          : json_text(v, text, sizeof text);
    return ep_err_set(err, "unsupported %s \"%s\" in %s: expected one of fp4, fp8", key, shown,
                      src);
}

/* DeepSeek's and vLLM's configs put expert_dtype at the top level; transformers 5.23 keeps it in
 * quantization_config (FineGrainedFP8Config) and copies a top-level one there. Either place
 * counts as given; both must agree, because each engine reads a different one. Neither keeps the
 * seed's default fp4 (expert_dtype_given false), so configs that parsed before hash the same. */
static int parse_expert_dtype(const char *src, const json_t *root, mc_config *c, ep_err *err)
{
    const json_t *top = json_object_get(root, "expert_dtype");
    const json_t *q = json_object_get(root, "quantization_config");
    const json_t *qv = json_is_object(q) ? json_object_get(q, "expert_dtype") : NULL;
    mc_expert_dtype a = MC_FP4, b = MC_FP4;
    if (top != NULL && dtype_value(src, "expert_dtype", top, &a, err) != 0)
        return -1;
    if (qv != NULL && dtype_value(src, "quantization_config.expert_dtype", qv, &b, err) != 0)
        return -1;
    if (top != NULL && qv != NULL && a != b)
        return ep_err_set(err,
                          "%s: field \"expert_dtype\" is \"%s\" but field "
                          "\"quantization_config.expert_dtype\" is \"%s\": they must agree "
                          "(DeepSeek's code and vLLM read the first, transformers the second)",
                          src, mc_dtype_name(a), mc_dtype_name(b));
    c->expert_dtype = top != NULL ? a : b;
    c->expert_dtype_given = top != NULL || qv != NULL;
    c->scale_e8m0 = c->expert_dtype == MC_FP4;
    return 0;
}

/* quantization_config.scale_fmt. epmoe reads it as DeepSeek's reference does: the rounding of the
 * FP8 activation scales ("ue8m0": powers of two, spec §3.4). transformers writes it as the storage
 * format of the weight scales ("float": F32, its default; "ue8m0": E8M0). The two readings agree
 * for "ue8m0" and for "float" with FP8 experts (F32 weight scales; plain activation scales, as
 * vLLM's FP8-expert path computes them). "float" with FP4 experts contradicts the checkpoint's
 * E8M0 scales and would drop the reference's activation rounding, so it is refused
 * (docs/numerics.md, "Config fields whose meaning differs between engines"). */
static int parse_scale_fmt(const char *src, const json_t *sf, mc_config *c, ep_err *err)
{
    if (!json_is_string(sf))
        return type_error(src, "quantization_config.scale_fmt", "a string", sf, err);
    const char *s = json_string_value(sf);
    if (strcmp(s, "ue8m0") == 0) {
        c->act_ue8m0 = true;
        return 0;
    }
    if (strcmp(s, "float") != 0) {
        char text[MC_TEXT_MAX + 8];
        return ep_err_set(err,
                          "%s: field \"quantization_config.scale_fmt\": expected \"ue8m0\" or "
                          "\"float\", found \"%s\"",
                          src, printable(s, text, sizeof text));
    }
    if (c->expert_dtype == MC_FP4)
        return ep_err_set(err,
                          "%s: field \"quantization_config.scale_fmt\": \"float\" is refused with "
                          "expert_dtype fp4: to transformers it says the weight scales are F32, "
                          "but FP4 checkpoints carry E8M0 scales; to epmoe it would turn off the "
                          "power-of-two rounding of FP8 activation scales that DeepSeek V4's "
                          "reference does, changing the layer's output by about 6 %% (relative "
                          "L2); write \"ue8m0\", V4's published value",
                          src);
    c->act_ue8m0 = false;
    return 0;
}

static int parse_quantization(const char *src, const json_t *root, mc_config *c, ep_err *err)
{
    c->act_ue8m0 = false;
    const json_t *q = json_object_get(root, "quantization_config");
    if (q == NULL || json_is_null(q))
        return 0;
    if (!json_is_object(q))
        return type_error(src, "quantization_config", "an object", q, err);

    const json_t *fmt = json_object_get(q, "fmt");
    if (fmt != NULL && check_string_is(src, "quantization_config.fmt", fmt, "e4m3", err) != 0)
        return -1;

    const json_t *wbs = json_object_get(q, "weight_block_size");
    if (wbs != NULL) {
        bool ok = json_is_array(wbs) && json_array_size(wbs) == 2;
        for (size_t i = 0; ok && i < 2; i++) {
            const json_t *d = json_array_get(wbs, i);
            ok = json_is_integer(d) && json_integer_value(d) == EP_FP8_BLOCK;
        }
        if (!ok) {
            char text[MC_TEXT_MAX + 8];
            return ep_err_set(err,
                              "%s: field \"quantization_config.weight_block_size\": expected "
                              "[%d, %d], found %s",
                              src, EP_FP8_BLOCK, EP_FP8_BLOCK, json_text(wbs, text, sizeof text));
        }
    }

    const json_t *sf = json_object_get(q, "scale_fmt");
    if (sf != NULL && !json_is_null(sf))
        return parse_scale_fmt(src, sf, c, err);
    return 0;
}

/* Keys whose only accepted values are fixed by what the MoE layer implements. */
static int parse_fixed(const char *src, const json_t *root, ep_err *err)
{
    const json_t *v = json_object_get(root, "scoring_func");
    if (v == NULL)
        return ep_err_set(err, "%s: missing field \"scoring_func\"", src);
    if (check_string_is(src, "scoring_func", v, "sqrtsoftplus", err) != 0)
        return -1;

    v = json_object_get(root, "topk_method");
    if (v != NULL && check_string_is(src, "topk_method", v, "noaux_tc", err) != 0)
        return -1;
    v = json_object_get(root, "hidden_act");
    if (v != NULL && check_string_is(src, "hidden_act", v, "silu", err) != 0)
        return -1;

    static const char *const group_keys[] = {"n_group", "topk_group"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(root, group_keys[i]);
        if (v == NULL || json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 1))
            continue;
        char text[MC_TEXT_MAX + 8];
        return ep_err_set(err,
                          "%s: field \"%s\": expected null or 1 (group-limited routing is not "
                          "supported), found %s",
                          src, group_keys[i], json_text(v, text, sizeof text));
    }
    return 0;
}

/* model_type, when present, must be V4's: a config of another model (DeepSeek V4.1's nests its
 * fields under text_config, has 384 experts and no hash layers) is never read as V4. */
static int parse_model_type(const char *src, const json_t *root, ep_err *err)
{
    const json_t *v = json_object_get(root, "model_type");
    if (v == NULL || (json_is_string(v) && strcmp(json_string_value(v), "deepseek_v4") == 0))
        return 0;
    if (!json_is_string(v))
        return type_error(src, "model_type", "the string \"deepseek_v4\"", v, err);
    char text[MC_TEXT_MAX + 8];
    return ep_err_set(err,
                      "%s: model_type \"%s\" is not served: epmoe serves the MoE layers of "
                      "DeepSeek V4 (model_type \"deepseek_v4\", fields at the top level) and does "
                      "not read another model's config as V4",
                      src, printable(json_string_value(v), text, sizeof text));
}

/* transformers' spelling of the hash layers: one entry per main layer, "hash_moe" for a layer
 * routed by tid2eid, "moe" for a top-k layer. epmoe (like DeepSeek's reference) serves hash
 * layers only as the first layers, so the list must be "hash_moe" x n then only "moe". */
static int parse_mlp_layer_types(const char *src, const json_t *v, int layers, int *n_hash,
                                 ep_err *err)
{
    if (!json_is_array(v))
        return type_error(src, "mlp_layer_types", "an array of \"hash_moe\" and \"moe\"", v, err);
    if (json_array_size(v) != (size_t)layers)
        return ep_err_set(err,
                          "%s: field \"mlp_layer_types\": expected %d entries "
                          "(num_hidden_layers), found %zu",
                          src, layers, json_array_size(v));
    int n = 0, first_moe = -1;
    for (int i = 0; i < layers; i++) {
        const json_t *e = json_array_get(v, (size_t)i);
        const char *s = json_is_string(e) ? json_string_value(e) : "";
        if (strcmp(s, "moe") == 0) {
            first_moe = first_moe < 0 ? i : first_moe;
        } else if (strcmp(s, "hash_moe") == 0 && first_moe < 0) {
            n++;
        } else if (strcmp(s, "hash_moe") == 0) {
            return ep_err_set(err,
                              "%s: field \"mlp_layer_types\"[%d]: \"hash_moe\" after \"moe\" "
                              "at [%d]: epmoe serves hash-routed layers only as the first layers "
                              "(\"hash_moe\" x n, then only \"moe\")",
                              src, i, first_moe);
        } else {
            char found[MC_TEXT_MAX + 32];
            return ep_err_set(err,
                              "%s: field \"mlp_layer_types\"[%d]: expected \"hash_moe\" or "
                              "\"moe\", found %s",
                              src, i, json_found(e, found, sizeof found));
        }
    }
    *n_hash = n;
    return 0;
}

/* num_hash_layers (DeepSeek, vLLM) or mlp_layer_types (transformers, which drops the former when
 * it saves); both present must agree. parse_ints has range-checked num_hash_layers already. */
static int parse_hash_layers(const char *src, const json_t *root, mc_config *c, ep_err *err)
{
    const json_t *n = json_object_get(root, "num_hash_layers");
    const json_t *types = json_object_get(root, "mlp_layer_types");
    if (types != NULL && json_is_null(types))
        types = NULL;
    if (n == NULL && types == NULL)
        return ep_err_set(err,
                          "%s: missing field \"num_hash_layers\" (or transformers' "
                          "\"mlp_layer_types\")",
                          src);
    if (types == NULL)
        return 0;
    int from_types = 0;
    if (parse_mlp_layer_types(src, types, c->num_hidden_layers, &from_types, err) != 0)
        return -1;
    if (n != NULL && from_types != c->num_hash_layers)
        return ep_err_set(err,
                          "%s: field \"num_hash_layers\" is %d but field \"mlp_layer_types\" "
                          "starts with %d \"hash_moe\": they must agree",
                          src, c->num_hash_layers, from_types);
    c->num_hash_layers = from_types;
    return 0;
}

/* DeepSeek V4's reference (and transformers) renormalise the top-k weights whatever
 * norm_topk_prob says, as scoring_func is not softmax; vLLM and epmoe follow the flag. false would
 * therefore change epmoe's layer and no one else's, so it is refused. */
static int parse_norm_topk(const char *src, const json_t *root, mc_config *c, ep_err *err)
{
    const json_t *v = json_object_get(root, "norm_topk_prob");
    c->norm_topk_prob = true;
    if (v == NULL || json_is_true(v))
        return 0;
    if (!json_is_boolean(v))
        return type_error(src, "norm_topk_prob", "true or false", v, err);
    return ep_err_set(err,
                      "%s: field \"norm_topk_prob\": false is refused: DeepSeek V4's reference "
                      "and transformers renormalise the top-k weights regardless, so false would "
                      "change only epmoe's layer (its weights would sum to routed_scaling_factor "
                      "x the top-k scores' sum, e.g. 10.2, instead of routed_scaling_factor, "
                      "1.5); write true or leave it out",
                      src);
}

static int parse_object(const char *src, const json_t *root, mc_config *out, ep_err *err)
{
    mc_config c;
    memset(&c, 0, sizeof c);
    if (parse_model_type(src, root, err) != 0 || parse_ints(src, root, &c, err) != 0 ||
        parse_hash_layers(src, root, &c, err) != 0 || parse_floats(src, root, &c, err) != 0 ||
        parse_fixed(src, root, err) != 0 || parse_norm_topk(src, root, &c, err) != 0)
        return -1;

    if (parse_expert_dtype(src, root, &c, err) != 0 ||
        parse_quantization(src, root, &c, err) != 0 || check_cross(src, &c, err) != 0)
        return -1;
    *out = c;
    return 0;
}

/* ---- public API ------------------------------------------------------------------------- */

int mc_parse(const char *text, size_t len, const char *srcname, mc_config *out, ep_err *err)
{
    const char *src = srcname != NULL ? srcname : "config.json";
    if (len > MC_MAX_CONFIG_BYTES)
        return ep_err_set(err, "%s: %zu bytes is larger than a config.json can be (%u)", src, len,
                          MC_MAX_CONFIG_BYTES);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return ep_err_set(err, "%s:%d:%d: %s", src, je.line, je.column, je.text);
    int rc;
    if (!json_is_object(root)) {
        rc = ep_err_set(err, "%s: expected a JSON object at the top level, found %s", src,
                        json_kind(root));
    } else {
        rc = parse_object(src, root, out, err);
    }
    json_decref(root);
    return rc;
}

int mc_load(const char *path, mc_config *out, ep_err *err)
{
    FILE *f = rf_open(path, NULL, err);
    if (f == NULL)
        return -1;
    /* Read at most one byte past the limit: enough to know the file is too large. */
    size_t cap = 16384, len = 0;
    char *buf = malloc(cap);
    int rc = -1;
    if (buf == NULL) {
        ep_err_set(err, "%s: out of memory", path);
        goto out;
    }
    for (;;) {
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len > MC_MAX_CONFIG_BYTES) {
            ep_err_set(err, "%s: larger than %u bytes (MC_MAX_CONFIG_BYTES); not a config.json",
                       path, MC_MAX_CONFIG_BYTES);
            goto out;
        }
        if (n == 0)
            break;
        if (len == cap) {
            size_t ncap = cap * 2 > MC_MAX_CONFIG_BYTES + 1u ? MC_MAX_CONFIG_BYTES + 1u : cap * 2;
            char *nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                ep_err_set(err, "%s: out of memory", path);
                goto out;
            }
            buf = nbuf;
            cap = ncap;
        }
    }
    if (ferror(f)) {
        ep_err_errno(err, "%s: read", path);
        goto out;
    }
    rc = mc_parse(buf, len, path, out, err);
out:
    free(buf);
    fclose(f);
    return rc;
}

int mc_validate(const mc_config *c, ep_err *err)
{
    const char *src = "model config";
    for (int i = 0; i < N_INT_FIELDS; i++)
        if (check_int(src, &INT_FIELDS[i], int_get(c, &INT_FIELDS[i]), err) != 0)
            return -1;
    for (int i = 0; i < N_FLOAT_FIELDS; i++)
        if (check_float(src, FLOAT_FIELDS[i].key, float_get(c, &FLOAT_FIELDS[i]), err) != 0)
            return -1;
    if (c->expert_dtype != MC_FP4 && c->expert_dtype != MC_FP8)
        return ep_err_set(err, "unsupported expert_dtype \"%d\" in %s: expected one of fp4, fp8",
                          (int)c->expert_dtype, src);
    if (!c->expert_dtype_given && c->expert_dtype != MC_FP4)
        return ep_err_set(err,
                          "%s: field \"expert_dtype_given\": expected 1 for expert_dtype %s "
                          "(only fp4 is ever assumed), found 0",
                          src, mc_dtype_name(c->expert_dtype));
    if (!c->norm_topk_prob)
        return ep_err_set(err,
                          "%s: field \"norm_topk_prob\": expected 1 (DeepSeek V4 renormalises the "
                          "top-k weights), found 0",
                          src);
    bool want_e8m0 = c->expert_dtype == MC_FP4;
    if (c->scale_e8m0 != want_e8m0)
        return ep_err_set(err,
                          "%s: field \"scale_e8m0\": expected %d for expert_dtype %s, found %d",
                          src, want_e8m0, mc_dtype_name(c->expert_dtype), (int)c->scale_e8m0);
    return check_cross(src, c, err);
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int mc_canonical(const mc_config *c, char *buf, size_t cap)
{
    return snprintf(buf, cap,
                    "hidden_size=%d\n"
                    "moe_intermediate_size=%d\n"
                    "n_routed_experts=%d\n"
                    "n_shared_experts=%d\n"
                    "num_experts_per_tok=%d\n"
                    "num_hidden_layers=%d\n"
                    "num_hash_layers=%d\n"
                    "num_nextn_predict_layers=%d\n"
                    "vocab_size=%d\n"
                    "routed_scaling_factor=0x%08x\n"
                    "swiglu_limit=0x%08x\n"
                    "rms_norm_eps=0x%08x\n"
                    "norm_topk_prob=%d\n"
                    "expert_dtype=%s\n"
                    "expert_dtype_given=%d\n"
                    "scale_e8m0=%d\n"
                    "act_ue8m0=%d\n",
                    c->hidden_size, c->moe_intermediate_size, c->n_routed_experts,
                    c->n_shared_experts, c->num_experts_per_tok, c->num_hidden_layers,
                    c->num_hash_layers, c->num_nextn_predict_layers, c->vocab_size,
                    (unsigned)float_bits(c->routed_scaling_factor),
                    (unsigned)float_bits(c->swiglu_limit), (unsigned)float_bits(c->rms_norm_eps),
                    c->norm_topk_prob ? 1 : 0, mc_dtype_name(c->expert_dtype),
                    c->expert_dtype_given ? 1 : 0, c->scale_e8m0 ? 1 : 0, c->act_ue8m0 ? 1 : 0);
}

uint64_t mc_hash(const mc_config *c)
{
    /* 17 lines of at most ~40 bytes each: the canonical text always fits. */
    char buf[1024];
    int n = mc_canonical(c, buf, sizeof buf);
    if (n < 0 || (size_t)n >= sizeof buf)
        n = 0;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 offset basis */
    for (int i = 0; i < n; i++) {
        h ^= (unsigned char)buf[i];
        h *= 0x100000001b3ull; /* FNV-1a 64 prime */
    }
    return h;
}

const char *mc_dtype_name(mc_expert_dtype d)
{
    switch (d) {
    case MC_FP4:
        return "fp4";
    case MC_FP8:
        return "fp8";
    }
    return "invalid";
}

int mc_dtype_parse(const char *s, mc_expert_dtype *out)
{
    if (s == NULL)
        return -1;
    if (strcmp(s, "fp4") == 0) {
        *out = MC_FP4;
        return 0;
    }
    if (strcmp(s, "fp8") == 0) {
        *out = MC_FP8;
        return 0;
    }
    return -1;
}

int mc_num_layers(const mc_config *c)
{
    return c->num_hidden_layers + c->num_nextn_predict_layers;
}

bool mc_layer_is_hash(const mc_config *c, int layer)
{
    return layer >= 0 && layer < c->num_hash_layers && layer < c->num_hidden_layers;
}
