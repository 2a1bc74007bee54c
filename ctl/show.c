/* show.c — see show.h. */
#include "ctl/show.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

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
                                 : "assumed: config.json has no expert_dtype");
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
