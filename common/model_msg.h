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

#include "common/error.h"
#include "common/model_config.h"
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

#endif
