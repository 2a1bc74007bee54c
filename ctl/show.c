/* show.c — see show.h. */
#include "ctl/show.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

double show_short_float(float f)
{
    char buf[32];
    for (int prec = 1; prec < 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f;
}

json_t *show_config_json(const mc_config *c)
{
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, mc_hash(c));
    return json_pack(
        "{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:b,s:s}", "hidden_size", c->hidden_size,
        "moe_intermediate_size", c->moe_intermediate_size, "n_routed_experts", c->n_routed_experts,
        "n_shared_experts", c->n_shared_experts, "num_experts_per_tok", c->num_experts_per_tok,
        "num_hidden_layers", c->num_hidden_layers, "num_hash_layers", c->num_hash_layers,
        "num_nextn_predict_layers", c->num_nextn_predict_layers, "vocab_size", c->vocab_size,
        "routed_scaling_factor", show_short_float(c->routed_scaling_factor), "swiglu_limit",
        show_short_float(c->swiglu_limit), "rms_norm_eps", show_short_float(c->rms_norm_eps),
        "norm_topk_prob", c->norm_topk_prob, "hash", hash);
}

void show_config_text(const mc_config *c)
{
    printf("expert_dtype  %s (%s)\n", mc_dtype_name(c->expert_dtype),
           c->expert_dtype_given ? "given in config.json"
                                 : "defaulted: config.json has no expert_dtype, top level or in "
                                   "quantization_config");
    printf("scales        FP8-linear weight scales %s (scale_e8m0 %s); activation scales %s "
           "(act_ue8m0 %s)\n",
           c->scale_e8m0 ? "E8M0" : "F32", c->scale_e8m0 ? "true" : "false",
           c->act_ue8m0 ? "UE8M0 powers of two" : "F32", c->act_ue8m0 ? "true" : "false");
    printf("sizes         H %d, I %d, experts %d (+%d shared), top-%d\n", c->hidden_size,
           c->moe_intermediate_size, c->n_routed_experts, c->n_shared_experts,
           c->num_experts_per_tok);
    printf("layers        %d main (%d hash-routed), %d MTP; vocab %d\n", c->num_hidden_layers,
           c->num_hash_layers, c->num_nextn_predict_layers, c->vocab_size);
}

void show_json_line(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* ---- YAML ---- */

static bool yaml_is_block(json_t *v)
{
    return (json_is_object(v) && json_object_size(v) > 0) ||
           (json_is_array(v) && json_array_size(v) > 0);
}

/* A real as JSON writes it, with ".0" put in before an exponent that has no '.' before it. */
static void yaml_real(json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(9));
    if (s == NULL)
        return;
    char *e = strpbrk(s, "eE");
    if (e && memchr(s, '.', (size_t)(e - s)) == NULL)
        printf("%.*s.0%s", (int)(e - s), s, e);
    else
        printf("%s", s);
    free(s);
}

/* A scalar or an empty container, on the current line. JSON's string quoting is YAML's
 * double-quoted style (same escapes), so strings are written by jansson. */
static void yaml_scalar(json_t *v)
{
    if (json_is_real(v)) {
        yaml_real(v);
    } else if (json_is_object(v)) {
        printf("{}");
    } else if (json_is_array(v)) {
        printf("[]");
    } else {
        char *s = json_dumps(v, JSON_ENCODE_ANY);
        printf("%s", s ? s : "null");
        free(s);
    }
}

/* A key plain when it is an identifier YAML cannot read as anything but a string. */
static void yaml_key(const char *k)
{
    static const char *const special[] = {"y",   "n",    "yes",   "no",  "on",
                                          "off", "true", "false", "null"};
    bool plain = k[0] != '\0' && (isalpha((unsigned char)k[0]) || k[0] == '_');
    for (const char *p = k; plain && *p; p++)
        plain = isalnum((unsigned char)*p) || *p == '_';
    for (size_t i = 0; plain && i < sizeof special / sizeof special[0]; i++)
        plain = strcasecmp(k, special[i]) != 0;
    if (plain) {
        printf("%s:", k);
    } else {
        json_t *s = json_string(k);
        yaml_scalar(s);
        json_decref(s);
        printf(":");
    }
}

/* A non-empty container at indentation ind; cont: the line already holds "- " up to ind. */
static void yaml_block(json_t *v, int ind, bool cont)
{
    size_t i = 0;
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        {
            printf("%*s", cont && i == 0 ? 0 : ind, "");
            yaml_key(k);
            if (yaml_is_block(x)) {
                printf("\n");
                yaml_block(x, json_is_array(x) ? ind : ind + 2, false);
            } else {
                printf(" ");
                yaml_scalar(x);
                printf("\n");
            }
            i++;
        }
        return;
    }
    json_t *x;
    json_array_foreach(v, i, x)
    {
        printf("%*s- ", cont && i == 0 ? 0 : ind, "");
        if (yaml_is_block(x)) {
            yaml_block(x, ind + 2, true);
        } else {
            yaml_scalar(x);
            printf("\n");
        }
    }
}

void show_yaml(json_t *j)
{
    if (j == NULL)
        return;
    printf("---\n");
    if (yaml_is_block(j)) {
        yaml_block(j, 0, false);
    } else {
        yaml_scalar(j);
        printf("\n");
    }
    json_decref(j);
}
