/*
 * mkmodel.c — the synthetic DeepSeek V4 checkpoint generator's options and the config they
 * describe (see mkmodel.h). The checkpoint's tensors: mkmodel_items.c; their values:
 * mkmodel_gen.c; the files: mkmodel_write.c.
 */
#include "ctl/mkmodel.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl/mkmodel_internal.h"

void mk_options_init(mk_options *o)
{
    *o = (mk_options){
        .out_dir = NULL,
        .expert_dtype = MC_FP4,
        .omit_expert_dtype = false,
        .full = false,
        .force = false,
        .hidden = 256,
        .inter = 128,
        .experts = 16,
        .topk = 6,
        .layers = 4,
        .hash_layers = 1,
        .mtp = 1,
        .vocab = 1000,
        .shards = 2,
        .seed = 1,
        .threads = 0,
    };
}

/* ---- options ---------------------------------------------------------------------------- */

/* config.json field -> option, for messages. */
static const struct {
    const char *field, *option;
    size_t off;
} MK_FIELDS[] = {
    {"hidden_size", "--hidden", offsetof(mk_options, hidden)},
    {"moe_intermediate_size", "--inter", offsetof(mk_options, inter)},
    {"n_routed_experts", "--experts", offsetof(mk_options, experts)},
    {"num_experts_per_tok", "--topk", offsetof(mk_options, topk)},
    {"num_hidden_layers", "--layers", offsetof(mk_options, layers)},
    {"num_hash_layers", "--hash-layers", offsetof(mk_options, hash_layers)},
    {"num_nextn_predict_layers", "--mtp", offsetof(mk_options, mtp)},
    {"vocab_size", "--vocab", offsetof(mk_options, vocab)},
};
enum { MK_NFIELDS = sizeof MK_FIELDS / sizeof MK_FIELDS[0] };

/* Append text to buf at *o, replacing config field names by their options. */
/* Append text to buf at *o, replacing config field names by their options. */
static void append_with_options(char *buf, size_t cap, size_t *o, const char *text)
{
    while (*text != '\0' && *o + 1 < cap) {
        int hit = -1;
        for (int i = 0; i < MK_NFIELDS && hit < 0; i++)
            if (strncmp(text, MK_FIELDS[i].field, strlen(MK_FIELDS[i].field)) == 0)
                hit = i;
        if (hit >= 0) {
            int w = snprintf(buf + *o, cap - *o, "%s", MK_FIELDS[hit].option);
            *o = w < 0 || (size_t)w >= cap - *o ? cap - 1 : *o + (size_t)w;
            text += strlen(MK_FIELDS[hit].field);
        } else {
            buf[(*o)++] = *text++;
        }
    }
    buf[*o] = '\0';
}

/* mc_validate says 'model config: field "KEY": REST'; say it in terms of options:
 * '--OPT: REST (config.json field "KEY")', field names in REST also shown as options. */
static int option_error(const mk_options *o, ep_err *err)
{
    const char *f = strstr(err->msg, "field \"");
    if (f == NULL)
        return ep_err_prefix(err, "invalid options");
    f += strlen("field \"");
    const char *q = strchr(f, '"');
    if (q == NULL || strncmp(q, "\": ", 3) != 0)
        return ep_err_prefix(err, "invalid options");
    for (int i = 0; i < MK_NFIELDS; i++) {
        if (strlen(MK_FIELDS[i].field) != (size_t)(q - f) ||
            strncmp(f, MK_FIELDS[i].field, (size_t)(q - f)) != 0)
            continue;
        char msg[EP_ERR_MSG_MAX];
        size_t n = 0;
        int val = *(const int *)((const char *)o + MK_FIELDS[i].off);
        int w = snprintf(msg, sizeof msg, "%s %d: ", MK_FIELDS[i].option, val);
        n = w < 0 ? 0 : (size_t)w;
        append_with_options(msg, sizeof msg, &n, q + 3);
        return ep_err_set(err, "%s (config.json field \"%s\")", msg, MK_FIELDS[i].field);
    }
    return ep_err_prefix(err, "invalid options");
}

int mk_config(const mk_options *o, mc_config *out, ep_err *err)
{
    mc_config c = {
        .hidden_size = o->hidden,
        .moe_intermediate_size = o->inter,
        .n_routed_experts = o->experts,
        .n_shared_experts = 1,
        .num_experts_per_tok = o->topk,
        .num_hidden_layers = o->layers,
        .num_hash_layers = o->hash_layers,
        .num_nextn_predict_layers = o->mtp,
        .vocab_size = o->vocab,
        .routed_scaling_factor = (float)MK_ROUTED_SCALING,
        .swiglu_limit = (float)MK_SWIGLU_LIMIT,
        .rms_norm_eps = (float)MK_RMS_EPS,
        .norm_topk_prob = true,
        .expert_dtype = o->expert_dtype,
        .expert_dtype_given = true,
        .scale_e8m0 = o->expert_dtype == MC_FP4,
        .act_ue8m0 = true,
    };
    if (o->expert_dtype != MC_FP4 && o->expert_dtype != MC_FP8)
        return ep_err_set(err, "--expert-dtype: expected fp4 or fp8");
    if (mc_validate(&c, err) != 0)
        return option_error(o, err);
    *out = c;
    return 0;
}

int mk_threads(const mk_options *o)
{
    long n = o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > MK_MAX_THREADS ? MK_MAX_THREADS : (int)n;
}
