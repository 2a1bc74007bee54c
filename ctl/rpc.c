/* rpc.c — see rpc.h. */
#include "ctl/rpc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/limits.h"

static int64_t rpc_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A random request id, so that replies to another client's or an earlier run's request can
 * never be taken for ours. */
static uint64_t rpc_random_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        id = ((uint64_t)t.tv_nsec << 20) ^ (uint64_t)t.tv_sec ^ ((uint64_t)getpid() << 40);
    }
    return id ? id : 1;
}

const char *rpc_error_name(int code)
{
    static _Thread_local char buf[32];
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&epmoe__error_code__descriptor, code);
    if (v == NULL) {
        snprintf(buf, sizeof buf, "error %d", code);
        return buf;
    }
    return v->name;
}

int rpc_report_error(const char *cmd, const Epmoe__AdminReply *r)
{
    fprintf(stderr, "epmoectl %s: %s: %s\n", cmd,
            rpc_error_name(r->has_error_code ? (int)r->error_code : 0),
            r->error ? r->error : "(the coordinator gave no message)");
    return CMD_FAILED;
}

void rpc_reply_free(rpc_reply *r)
{
    if (r->reply)
        wire_free_unpacked(&r->reply->base);
    if (r->msg) {
        wire_msg_close(r->msg);
        free(r->msg);
    }
    if (r->zctx)
        zmq_ctx_term(r->zctx);
    *r = (rpc_reply){0};
}

/* One message from the coordinator: 1 = our reply (in out), 0 = not ours (discarded), or a
 * CMD_ code for a protocol surprise. */
static int rpc_take(const cmd_ctx *ctx, void *sock, uint64_t id, rpc_reply *out, ep_err *err)
{
    wire_msg *m = malloc(sizeof *m);
    if (m == NULL)
        return ep_err_set(err, "out of memory"), CMD_SOFTWARE;
    ep_err e;
    wire_rc rc = wire_recv(sock, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, m, &e);
    if (rc == WIRE_AGAIN) {
        free(m);
        return 0;
    }
    if (rc == WIRE_ERR) {
        free(m);
        ep_err_set(err, "coordinator at %s sent a malformed message: %s", ctx->coordinator, e.msg);
        return CMD_PROTOCOL;
    }
    int result = CMD_PROTOCOL;
    if (m->type == EPMOE__MSG_TYPE__MSG_ERROR) {
        Epmoe__Error *x = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, m, &e);
        ep_err_set(err, "coordinator at %s refused the request: %s: %s", ctx->coordinator,
                   rpc_error_name(x && x->has_code ? (int)x->code : 0),
                   x && x->message ? x->message : "(no message)");
        if (x)
            wire_free_unpacked(&x->base);
    } else if (m->type != EPMOE__MSG_TYPE__MSG_ADMIN_REPLY) {
        ep_err_set(err, "coordinator at %s answered %s, expected ADMIN_REPLY", ctx->coordinator,
                   wire_type_name(m->type));
    } else {
        Epmoe__AdminReply *r =
            (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, m, &e);
        if (r == NULL) {
            ep_err_set(err, "coordinator at %s: %s", ctx->coordinator, e.msg);
        } else if (!r->has_id || r->id != id) {
            wire_free_unpacked(&r->base); /* a late answer to an earlier try */
            result = 0;
        } else {
            out->reply = r;
            out->msg = m;
            return 1;
        }
    }
    wire_msg_close(m);
    free(m);
    return result;
}

/* One try: send, wait up to timeout_ms. 1 = reply in out, 0 = timed out, else a CMD_ code. */
static int rpc_try(const cmd_ctx *ctx, void *zctx, Epmoe__AdminRequest *req,
                   const wire_payload *payloads, int n_payloads, rpc_reply *out, ep_err *err)
{
    void *sock = zmq_socket(zctx, ZMQ_DEALER);
    if (sock == NULL)
        return ep_err_set(err, "zmq_socket: %s", zmq_strerror(zmq_errno())), CMD_SOFTWARE;
    int rc = 0;
    if (wire_socket_defaults(sock, (int64_t)EP_MAX_DATA_MSG, err) != 0) {
        rc = CMD_SOFTWARE;
        goto done;
    }
    if (zmq_connect(sock, ctx->coordinator) != 0) {
        ep_err_set(err,
                   "--coordinator %s: not a ZeroMQ endpoint (%s); expected tcp://HOST:PORT or "
                   "ipc://PATH",
                   ctx->coordinator, zmq_strerror(zmq_errno()));
        rc = CMD_USAGE;
        goto done;
    }
    if (wire_send(sock, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &req->base, payloads,
                  n_payloads, false, err) != 0) {
        rc = CMD_UNAVAILABLE;
        goto done;
    }
    int64_t end = rpc_now_ms() + ctx->timeout_ms;
    for (int64_t left = ctx->timeout_ms; left > 0; left = end - rpc_now_ms()) {
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, (long)left) > 0 && (rc = rpc_take(ctx, sock, req->id, out, err)) != 0)
            break;
    }
done:
    zmq_close(sock);
    return rc;
}

int rpc_call(const cmd_ctx *ctx, Epmoe__AdminRequest *req, const wire_payload *payloads,
             int n_payloads, bool idempotent, rpc_reply *out, ep_err *err)
{
    *out = (rpc_reply){0};
    void *zctx = zmq_ctx_new();
    if (zctx == NULL)
        return ep_err_set(err, "zmq_ctx_new: %s", zmq_strerror(zmq_errno())), CMD_SOFTWARE;
    req->has_id = 1;
    req->id = rpc_random_id();
    int tries = idempotent ? 1 + RPC_RETRIES : 1;
    for (int i = 0; i < tries; i++) {
        int rc = rpc_try(ctx, zctx, req, payloads, n_payloads, out, err);
        if (rc == 1) {
            out->zctx = zctx;
            return CMD_OK;
        }
        if (rc != 0) {
            zmq_ctx_term(zctx);
            return rc;
        }
    }
    zmq_ctx_term(zctx);
    if (tries > 1)
        ep_err_set(err, "coordinator at %s did not answer within %d ms (%d tries)",
                   ctx->coordinator, ctx->timeout_ms, tries);
    else
        ep_err_set(err, "coordinator at %s did not answer within %d ms", ctx->coordinator,
                   ctx->timeout_ms);
    return CMD_UNAVAILABLE;
}
