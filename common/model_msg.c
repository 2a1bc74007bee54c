/* model_msg.c — see model_msg.h. */
#include "common/model_msg.h"

#include <string.h>

#include "common/limits.h"

void mmsg_from_config(const mc_config *c, Epmoe__ModelConfig *out)
{
    epmoe__model_config__init(out);
#define MMSG_SET(field, value)                                                                     \
    do {                                                                                           \
        out->has_##field = 1;                                                                      \
        out->field = (value);                                                                      \
    } while (0)
    MMSG_SET(hidden_size, (uint32_t)c->hidden_size);
    MMSG_SET(moe_intermediate_size, (uint32_t)c->moe_intermediate_size);
    MMSG_SET(n_routed_experts, (uint32_t)c->n_routed_experts);
    MMSG_SET(n_shared_experts, (uint32_t)c->n_shared_experts);
    MMSG_SET(num_experts_per_tok, (uint32_t)c->num_experts_per_tok);
    MMSG_SET(num_hidden_layers, (uint32_t)c->num_hidden_layers);
    MMSG_SET(num_hash_layers, (uint32_t)c->num_hash_layers);
    MMSG_SET(num_nextn_predict_layers, (uint32_t)c->num_nextn_predict_layers);
    MMSG_SET(vocab_size, (uint32_t)c->vocab_size);
    MMSG_SET(routed_scaling_factor, c->routed_scaling_factor);
    MMSG_SET(swiglu_limit, c->swiglu_limit);
    MMSG_SET(rms_norm_eps, c->rms_norm_eps);
    MMSG_SET(norm_topk_prob, c->norm_topk_prob);
    MMSG_SET(expert_dtype, c->expert_dtype == MC_FP8 ? EPMOE__EXPERT_DTYPE__EXPERT_FP8
                                                     : EPMOE__EXPERT_DTYPE__EXPERT_FP4);
    MMSG_SET(expert_dtype_given, c->expert_dtype_given);
    MMSG_SET(scale_e8m0, c->scale_e8m0);
    MMSG_SET(act_ue8m0, c->act_ue8m0);
#undef MMSG_SET
}

/* Integers arrive as uint32; anything above INT32_MAX is rejected here, ranges by mc_validate. */
static int mmsg_int(protobuf_c_boolean has, uint32_t v, const char *name, int *out, ep_err *err)
{
    if (!has)
        return ep_err_set(err, "model config: field \"%s\" is missing", name);
    if (v > 0x7FFFFFFFu)
        return ep_err_set(err, "model config: field \"%s\": %u is out of range", name, v);
    *out = (int)v;
    return 0;
}

static int mmsg_present(protobuf_c_boolean has, const char *name, ep_err *err)
{
    return has ? 0 : ep_err_set(err, "model config: field \"%s\" is missing", name);
}

int mmsg_to_config(const Epmoe__ModelConfig *m, mc_config *out, ep_err *err)
{
    mc_config c;
    memset(&c, 0, sizeof c);
    if (m == NULL)
        return ep_err_set(err, "model config missing");
#define MMSG_INT(field)                                                                            \
    if (mmsg_int(m->has_##field, m->field, #field, &c.field, err) != 0)                            \
        return -1;
#define MMSG_ANY(field, conv)                                                                      \
    if (mmsg_present(m->has_##field, #field, err) != 0)                                            \
        return -1;                                                                                 \
    c.field = conv(m->field);
    MMSG_INT(hidden_size)
    MMSG_INT(moe_intermediate_size)
    MMSG_INT(n_routed_experts)
    MMSG_INT(n_shared_experts)
    MMSG_INT(num_experts_per_tok)
    MMSG_INT(num_hidden_layers)
    MMSG_INT(num_hash_layers)
    MMSG_INT(num_nextn_predict_layers)
    MMSG_INT(vocab_size)
    MMSG_ANY(routed_scaling_factor, (float))
    MMSG_ANY(swiglu_limit, (float))
    MMSG_ANY(rms_norm_eps, (float))
    MMSG_ANY(norm_topk_prob, (bool))
    MMSG_ANY(expert_dtype_given, (bool))
    MMSG_ANY(scale_e8m0, (bool))
    MMSG_ANY(act_ue8m0, (bool))
#undef MMSG_INT
#undef MMSG_ANY
    if (!m->has_expert_dtype)
        return ep_err_set(err, "model config: field \"expert_dtype\" is missing");
    if (m->expert_dtype == EPMOE__EXPERT_DTYPE__EXPERT_FP4)
        c.expert_dtype = MC_FP4;
    else if (m->expert_dtype == EPMOE__EXPERT_DTYPE__EXPERT_FP8)
        c.expert_dtype = MC_FP8;
    else
        return ep_err_set(err, "model config: field \"expert_dtype\": unknown value %d",
                          (int)m->expert_dtype);
    if (c.scale_e8m0 != (c.expert_dtype == MC_FP4))
        return ep_err_set(err, "model config: scale_e8m0 (%d) contradicts expert_dtype %s",
                          (int)c.scale_e8m0, mc_dtype_name(c.expert_dtype));
    if (mc_validate(&c, err) != 0)
        return -1;
    *out = c;
    return 0;
}

int mmsg_placement_out(const pl_table *t, uint32_t *owner, bool *flat, Epmoe__Placement *m,
                       pl_wire *w, ep_err *err)
{
    epmoe__placement__init(m);
    memset(w, 0, sizeof *w);
    *flat = pl_flat_owner(t, owner);
    if (*flat)
        return 0;
    if (pl_encode(t, w, err) != 0)
        return -1;
    m->has_n_layers = 1;
    m->n_layers = (uint32_t)pl_layers(t);
    m->has_layer_table = m->has_replica_count = m->has_replica_rank = 1;
    m->layer_table = (ProtobufCBinaryData){.len = w->layer_table_len, .data = w->layer_table};
    m->replica_count = (ProtobufCBinaryData){.len = w->count_len, .data = w->count};
    m->replica_rank = (ProtobufCBinaryData){.len = w->rank_len, .data = w->rank};
    return 0;
}

pl_table *mmsg_placement_in(int n_layers, int n_experts, int n_ranks, const uint32_t *owner,
                            size_t n_owner, const Epmoe__Placement *m, ep_err *err)
{
    if (m != NULL && n_owner > 0) {
        ep_err_set(err, "both expert_owner and placement given (expected one)");
        return NULL;
    }
    if (m == NULL) {
        if (n_owner != (size_t)n_experts) {
            ep_err_set(err, "expert_owner has %zu entries, expected n_routed_experts %d", n_owner,
                       n_experts);
            return NULL;
        }
        for (size_t e = 0; e < n_owner; e++)
            if (owner[e] >= (uint32_t)n_ranks) {
                ep_err_set(err, "expert_owner[%zu] = %u, expected < world_size %d", e, owner[e],
                           n_ranks);
                return NULL;
            }
        return pl_flat(n_layers, n_experts, n_ranks, owner, err);
    }
    if (!m->has_n_layers || m->n_layers != (uint32_t)n_layers) {
        ep_err_set(err, "placement.n_layers %s%u, expected the model's %d MoE layers",
                   m->has_n_layers ? "" : "(absent) ", m->has_n_layers ? m->n_layers : 0, n_layers);
        return NULL;
    }
    return pl_decode(n_layers, n_experts, n_ranks, m->layer_table.data, m->layer_table.len,
                     m->replica_count.data, m->replica_count.len, m->replica_rank.data,
                     m->replica_rank.len, err);
}

int64_t mmsg_max_frame(const mc_config *c)
{
    int64_t T = EP_MAX_TOKENS, max = EP_MAX_CTRL_MSG;
    int64_t sizes[3] = {T * c->hidden_size * 2, T * 8, T * c->num_experts_per_tok * 4};
    for (int i = 0; i < 3; i++)
        if (sizes[i] > max)
            max = sizes[i];
    return max;
}
