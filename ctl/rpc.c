/* rpc.c — see rpc.h. */
#include "ctl/rpc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/clock.h"
#include "common/limits.h"

/* A random request id, so that replies to another client's or an earlier run's request can
 * never be taken for ours. */
static uint64_t rpc_random_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
        struct timespec t = clk_wall();
        id = ((uint64_t)t.tv_nsec << 20) ^ (uint64_t)t.tv_sec ^ ((uint64_t)getpid() << 40);
    }
    return id ? id : 1;
}

const char *rpc_error_name(int code)
{
    static _Thread_local char buf[32];
    const char *name = wire_code_name(code, NULL);
    if (name == NULL) {
        snprintf(buf, sizeof buf, "error %d", code);
        return buf;
    }
    return name;
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

/* The operator's keys, when the command line or the environment names them. */
typedef struct rpc_keys {
    bool secure;
    auth_keypair kp;
    uint8_t server[AUTH_KEY_BYTES];
} rpc_keys;

static int rpc_load_keys(const cmd_ctx *ctx, rpc_keys *k, ep_err *err)
{
    k->secure = false;
    if (ctx->key_path == NULL && ctx->server_key_path == NULL)
        return 0;
    if (ctx->key_path == NULL || ctx->server_key_path == NULL)
        return ep_err_set(err, "--key and --server-key ($EPMOE_KEY, $EPMOE_SERVER_KEY) go "
                               "together");
    if (auth_load_secret(ctx->key_path, &k->kp, err) != 0 ||
        auth_load_public(ctx->server_key_path, k->server, err) != 0)
        return -1;
    k->secure = true;
    return 0;
}

/* A DEALER to the coordinator (CURVE with a key) and, with security, its handshake monitor. */
static int rpc_socket(const cmd_ctx *ctx, const rpc_keys *k, void *zctx, void **sock, void **mon,
                      ep_err *err)
{
    if (wire_check_endpoint(ctx->coordinator, err) != 0)
        return ep_err_prefix(err, "--coordinator"), CMD_USAGE;
    *sock = zmq_socket(zctx, ZMQ_DEALER);
    *mon = NULL;
    if (*sock == NULL)
        return ep_err_set(err, "zmq_socket: %s", zmq_strerror(zmq_errno())), CMD_SOFTWARE;
    if (wire_socket_defaults(*sock, ctx->max_msg ? ctx->max_msg : (int64_t)EP_MAX_CTRL_MSG, err) !=
            0 ||
        (k->secure && auth_client(*sock, &k->kp, k->server, err) != 0) ||
        (*mon = auth_monitor(zctx, *sock, err)) == NULL)
        return CMD_SOFTWARE;
    if (zmq_connect(*sock, ctx->coordinator) != 0)
        return ep_err_set(err,
                          "--coordinator %s: not a ZeroMQ endpoint (%s); expected tcp://HOST:PORT "
                          "or ipc://PATH",
                          ctx->coordinator, zmq_strerror(zmq_errno())),
               CMD_USAGE;
    return 0;
}

typedef struct rpc_try {
    void *sock, *mon;
} rpc_try;

static void rpc_try_close(rpc_try *t)
{
    if (t->mon) {
        zmq_socket_monitor(t->sock, NULL, 0);
        zmq_close(t->mon);
    }
    if (t->sock)
        zmq_close(t->sock);
    *t = (rpc_try){0};
}

/* Start try n: a fresh connection and the request on it. 0, or a CMD_ code. */
static int rpc_try_start(const cmd_ctx *ctx, const rpc_keys *k, void *zctx,
                         Epmoe__AdminRequest *req, const wire_payload *payloads, int n_payloads,
                         rpc_try *t, ep_err *err)
{
    int rc = rpc_socket(ctx, k, zctx, &t->sock, &t->mon, err);
    if (rc == 0 && wire_send(t->sock, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &req->base,
                             payloads, n_payloads, false, err) != 0)
        rc = CMD_UNAVAILABLE;
    return rc;
}

/* Wait on every try started until one answers or end passes. 1 = reply in out, 0 = time is up,
 * else a CMD_ code (the coordinator refused our key: CMD_NOPERM). *failed counts handshakes
 * that broke off without a reason, in a row. */
static int rpc_wait(const cmd_ctx *ctx, rpc_try *t, int n, uint64_t id, int64_t end, int *failed,
                    rpc_reply *out, ep_err *err)
{
    for (int64_t left = end - clk_mono_ms(); left > 0; left = end - clk_mono_ms()) {
        /* the sockets, then the monitors there are (a NULL socket would poll fd 0) */
        zmq_pollitem_t it[2 * (1 + RPC_RETRIES)];
        int m = 0;
        for (int i = 0; i < n; i++)
            it[m++] = (zmq_pollitem_t){.socket = t[i].sock, .events = ZMQ_POLLIN};
        for (int i = 0; i < n; i++)
            if (t[i].mon)
                it[m++] = (zmq_pollitem_t){.socket = t[i].mon, .events = ZMQ_POLLIN};
        if (zmq_poll(it, m, (long)left) <= 0)
            continue;
        for (int i = 0, k = n; i < n; i++) {
            char why[512];
            auth_event ev = t[i].mon && (it[k++].revents & ZMQ_POLLIN)
                                ? auth_monitor_read(t[i].mon, why, sizeof why)
                                : AUTH_EV_NOTHING;
            *failed = ev == AUTH_EV_OK ? 0 : *failed + (ev == AUTH_EV_FAILED);
            if (ev == AUTH_EV_REFUSED || *failed >= AUTH_FAILED_LIMIT)
                return ep_err_set(err, "%s: check --key and --server-key", why), CMD_NOPERM;
            int rc = (it[i].revents & ZMQ_POLLIN) ? rpc_take(ctx, t[i].sock, id, out, err) : 0;
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

int rpc_call(const cmd_ctx *ctx, Epmoe__AdminRequest *req, const wire_payload *payloads,
             int n_payloads, bool idempotent, rpc_reply *out, ep_err *err)
{
    *out = (rpc_reply){0};
    rpc_keys keys;
    if (rpc_load_keys(ctx, &keys, err) != 0)
        return CMD_USAGE;
    void *zctx = zmq_ctx_new();
    if (zctx == NULL)
        return ep_err_set(err, "zmq_ctx_new: %s", zmq_strerror(zmq_errno())), CMD_SOFTWARE;
    req->has_id = 1;
    req->id = rpc_random_id();
    /* One deadline for the whole call (and the command's, when it set one): a retry is a fresh
     * connection that joins the earlier ones, which keep listening, never more time. */
    int64_t deadline = ctx->deadline_ms ? ctx->deadline_ms : clk_deadline_ms(ctx->timeout_ms);
    int tries = idempotent ? 1 + RPC_RETRIES : 1, n = 0, rc = 0, failed = 0;
    rpc_try t[1 + RPC_RETRIES] = {{0}};
    while (rc == 0 && n < tries && clk_mono_ms() < deadline) {
        if ((rc = rpc_try_start(ctx, &keys, zctx, req, payloads, n_payloads, &t[n++], err)) != 0)
            break;
        int64_t slice = (deadline - clk_mono_ms()) / (tries - n + 1);
        rc = rpc_wait(ctx, t, n, req->id, n < tries ? clk_deadline_ms(slice) : deadline, &failed,
                      out, err);
    }
    for (int i = 0; i < n; i++)
        rpc_try_close(&t[i]);
    explicit_bzero(&keys, sizeof keys);
    if (rc == 1) {
        out->zctx = zctx;
        return CMD_OK;
    }
    zmq_ctx_term(zctx);
    if (rc != 0)
        return rc;
    ep_err_set(err, "coordinator at %s did not answer within %d ms (%d %s)", ctx->coordinator,
               ctx->timeout_ms, n, n == 1 ? "try" : "tries");
    return CMD_UNAVAILABLE;
}
