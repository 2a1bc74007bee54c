/*
 * rpc.h — epmoectl's admin RPC client (prefix rpc_): one AdminRequest to the coordinator's
 * admin socket, one AdminReply back.
 *
 * Lazy Pirate (zguide lpclient.c) under one deadline: a DEALER connects to ctx->coordinator and
 * sends the request with a random id; replies with another id (an answer to an earlier run) are
 * discarded. An idempotent request (status, workers, shards, config) that has no answer after a
 * third of the time is sent again on a fresh connection, RPC_RETRIES times, while the earlier
 * connections keep listening; the call never takes longer than ctx->timeout_ms (or, when set,
 * until ctx->deadline_ms: a command of several requests keeps one deadline). Then it gives up
 * with CMD_UNAVAILABLE and "coordinator at ENDPOINT did not answer within N ms (3 tries)". A
 * non-idempotent request (forward, shutdown) is sent once.
 *
 * With ctx->key the connection is a CURVE client of ctx->server_key; a handshake the
 * coordinator refuses ends the call at once with CMD_NOPERM naming the endpoint.
 *
 * Results: CMD_OK with the reply (which may say ok: false: see rpc_report_error);
 * CMD_UNAVAILABLE (no answer); CMD_PROTOCOL (the coordinator sent something that is not an
 * AdminReply, e.g. an Error message, or a reply that does not decode); CMD_USAGE (the endpoint
 * is not a ZeroMQ endpoint). err holds the message.
 */
#ifndef EPMOE_CTL_RPC_H
#define EPMOE_CTL_RPC_H

#include <stdbool.h>

#include "common/error.h"
#include "common/wire.h"
#include "ctl/cmds.h"

/* Extra tries of an idempotent request after the first timed out. */
#define RPC_RETRIES 2

typedef struct rpc_reply {
    Epmoe__AdminReply *reply; /* decoded */
    wire_msg *msg;            /* its frames: msg->payload[i], msg->payload_len[i] */
    void *zctx;
} rpc_reply;

/* Send req (its id is set here) with payloads (never taken over: free_fn must be NULL) and
 * wait for the reply. */
int rpc_call(const cmd_ctx *ctx, Epmoe__AdminRequest *req, const wire_payload *payloads,
             int n_payloads, bool idempotent, rpc_reply *out, ep_err *err);
/* Tolerates a zeroed or already freed reply. */
void rpc_reply_free(rpc_reply *r);

/* Print "epmoectl CMD: ERR_NAME: message" for a reply with ok false; returns CMD_FAILED. */
int rpc_report_error(const char *cmd, const Epmoe__AdminReply *r);
/* "ERR_NOT_READY", or "error N" for a code this build does not know. */
const char *rpc_error_name(int code);

#endif
