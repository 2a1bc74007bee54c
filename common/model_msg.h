/*
 * model_msg.h — the resolved model config on the wire (prefix mmsg_).
 *
 * The coordinator broadcasts its mc_config in WELCOME as an Epmoe__ModelConfig; the worker
 * rebuilds the mc_config, validates it with the same rules as config.json (mc_validate) and
 * acknowledges with its own mc_hash. Floats travel as IEEE binary32, so the hashes agree
 * exactly when the config arrived intact.
 */
#ifndef EPMOE_MODEL_MSG_H
#define EPMOE_MODEL_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "common/placement.h"
#include "epmoe.pb-c.h"

/* Fill *out (already EPMOE__MODEL_CONFIG__INIT-ed or not) from c. Every field is set. */
void mmsg_from_config(const mc_config *c, Epmoe__ModelConfig *out);

/* Rebuild an mc_config; every field must be present and the result must pass mc_validate.
 * Errors name the missing or invalid field. */
int mmsg_to_config(const Epmoe__ModelConfig *m, mc_config *out, ep_err *err);

/* The largest frame a control message of this model may carry, for ZMQ_MAXMSGSIZE of the
 * sockets that carry STEP, STEP_DONE and FORWARD: hidden bf16 [EP_MAX_TOKENS, H], ids int64,
 * topk ids and weights [EP_MAX_TOKENS, k], or a body of EP_MAX_CTRL_MSG. */
int64_t mmsg_max_frame(const mc_config *c);

/* ---- placements (WELCOME, EPOCH): the flat expert_owner form or a Placement ---- */

/* How a table travels: owner[E] when it is flat (*flat true), else the Placement m whose bytes
 * live in w (free w with pl_wire_free after packing). owner is [E], caller's. */
int mmsg_placement_out(const pl_table *t, uint32_t *owner, bool *flat, Epmoe__Placement *m,
                       pl_wire *w, ep_err *err);
/* The table a message carries for L layers, E experts, P ranks: exactly one of expert_owner
 * (n_owner entries) and placement. Errors name the field and what was expected. */
pl_table *mmsg_placement_in(int n_layers, int n_experts, int n_ranks, const uint32_t *owner,
                            size_t n_owner, const Epmoe__Placement *m, ep_err *err);

#endif
