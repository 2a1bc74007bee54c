/*
 * exec_core.c — what every file of the executor uses (exec_state.h): its replies on the pipe
 * (ERROR, STEP_FAILED, any message) and freeing what it holds. It calls nothing of exec.c,
 * exec_load.c or exec_step.c, so those stand above it.
 */
#include <stdlib.h>

#include "common/log.h"
#include "common/wire.h"
#include "worker/exec_state.h"

/* ---- replies ----------------------------------------------------------------------------------
 */

void exec_send(exec_state *st, uint16_t type, const ProtobufCMessage *body, const wire_payload *pl,
               int n)
{
    ep_err err;
    if (wire_send(st->pipe, NULL, 0, type, body, pl, n, false, &err) != 0)
        log_error("executor: %s", err.msg);
}

void exec_error(exec_state *st, Epmoe__ErrorCode code, uint16_t in_reply_to, const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    Epmoe__Error e;
    wire_error_body(&e, &err, in_reply_to);
    exec_send(st, EPMOE__MSG_TYPE__MSG_ERROR, &e.base, NULL, 0);
}

void exec_step_failed_err(exec_state *st, bool has_id, uint64_t step_id, const ep_err *err)
{
    log_warn("step %llu failed: %s", (unsigned long long)step_id, err->msg);
    Epmoe__StepFailed f = EPMOE__STEP_FAILED__INIT;
    f.has_step_id = has_id;
    f.step_id = step_id;
    f.has_code = 1;
    f.code = wire_code(err);
    f.message = (char *)err->msg; /* borrowed for the packing */
    exec_send(st, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &f.base, NULL, 0);
}

void exec_step_failed(exec_state *st, bool has_id, uint64_t step_id, Epmoe__ErrorCode code,
                      const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    exec_step_failed_err(st, has_id, step_id, &err);
}

/* ---- state ------------------------------------------------------------------------------------
 */

void exec_free_layers(mb_layer **layers, int n)
{
    for (int i = 0; layers && i < n; i++)
        mb_layer_free(&layers[i]);
    free(layers);
}

void exec_free_shard(exec_state *st)
{
    exec_free_layers(st->layers, st->n_layers);
    st->layers = NULL;
    st->n_layers = 0;
}

void exec_drop_staged(exec_state *st)
{
    exec_free_layers(st->staged_layers, st->n_layers);
    st->staged_layers = NULL;
    exec_session_free(&st->staged);
}
