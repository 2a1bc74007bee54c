/*
 * exec.c — the step executor thread (see exec.h).
 *
 * The thread owns: its end of the pipe, the backend, the session, one mb_layer per MoE layer
 * and the data-plane transport. Its loop polls the pipe and the data plane's PULL (so messages
 * of a fast peer are read and kept between steps) and handles one pipe message at a time.
 *
 * A step (docs/protocol.md):
 *   route + quantize own tokens -> one DISPATCH per peer (distinct rows in ascending token
 *   order; pairs in token order, then slot order) -> own pairs and the shared expert computed
 *   locally -> answer each peer's DISPATCH with a COMBINE, scatter each COMBINE into the
 *   [token, slot] expert outputs -> moe_combine -> STEP_DONE.
 * Every number a token's output depends on is computed by the same moe_* kernels on the same
 * inputs as moe_forward would (the FP8 codes and scales travel exactly: e8m0 only when the
 * config's act_ue8m0 makes every scale a power of two, and bf16 dispatch is re-quantized by the
 * receiver with the same moe_quant), and moe_combine fixes the summation order, so the result
 * is bit-identical to moe_forward over the whole batch.
 *
 * Cancellation: the caller counts up `cancel` before it sends RESET or TERM (the executor counts
 * down as it handles them), so a load stops at the next layer boundary while one is pending. A
 * waiting step reads the pipe itself: STEP_ABORT ends it with STEP_FAILED, another STEP is answered
 * ERR_BUSY, RESET and TERM end it unanswered, and anything else is stashed for the main loop to
 * handle after the step.
 */
#include "worker/exec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/safetensors.h"
#include "common/wire.h"
#include "kernels/formats.h"
#include "worker/exec_state.h"
#include "worker/plan.h"
#include "shard/shard.h"
#include "worker/wmetrics.h"

/* The session goes; the data plane stays open (unused) until the next LOAD or EPOCH replaces
 * it or the thread ends. Closing it here, in the same instant a frozen or cut-off worker's
 * sockets see their connections fail (SIGCONT after SIGSTOP, a link back up), lets libzmq 4.3
 * abort in session_base_t::clean_pipes on a half-sent multipart message; a second later its
 * I/O threads have cleaned up and the close is harmless. */
static void exec_drop_session(exec_state *st)
{
    if (st->srv)
        srv_epoch_begin(st->srv); /* its requests wait for the next session's epoch */
    exec_close_open(st);
    st->ready = false;
    st->have_last = false;
    exec_drop_staged(st);
    sn_destroy(&st->sn); /* an NCCL communicator belongs to its session */
    tpc_destroy(&st->comm);
    exec_session_free(&st->session);
}

/* ---- the thread -------------------------------------------------------------------------------
 */

static void exec_session_cmd(exec_state *st, const wire_msg *m)
{
    exec_session *s = NULL;
    if (m->body_len != sizeof s) {
        log_error("executor: SESSION body of %zu bytes", m->body_len);
        return;
    }
    memcpy(&s, m->body, sizeof s);
    exec_drop_session(st);
    st->session = s;
}

static void exec_handle(exec_state *st, wire_msg *m)
{
    switch (m->type) {
    case EXEC_CMD_SESSION:
        exec_session_cmd(st, m);
        break;
    case EXEC_CMD_RESET:
        atomic_fetch_sub(&st->actor->cancel, 1);
        exec_drop_session(st);
        exec_send(st, EXEC_EVT_RESET_DONE, NULL, NULL, 0);
        break;
    case EXEC_CMD_TERM:
        st->stop = true;
        break;
    case EPMOE__MSG_TYPE__MSG_LOAD:
        exec_load(st, EPMOE__MSG_TYPE__MSG_LOAD);
        break;
    case EPMOE__MSG_TYPE__MSG_EPOCH:
        exec_epoch(st, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP:
        exec_step(st, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP_ABORT:
        exec_abort_open(st, m);
        break;
    case EPMOE__MSG_TYPE__MSG_EPOCH_COMMIT:
        exec_commit(st, m);
        break;
    case EXEC_CMD_METRICS:
        if (m->body_len == sizeof st->mx)
            memcpy(&st->mx, m->body, sizeof st->mx);
        break;
    case EPMOE__MSG_TYPE__MSG_COMM_INIT:
        exec_comm_init(st, m);
        break;
    default:
        log_warn("executor: unexpected %s on the pipe", wire_type_name(m->type));
    }
}

/* LOAD_REPORT to the coordinator (relayed by the control thread). */
static void exec_send_report(void *ctx, const Epmoe__LoadReport *r)
{
    exec_send(ctx, EPMOE__MSG_TYPE__MSG_LOAD_REPORT, &r->base, NULL, 0);
}

/* PEER_UNREACHABLE to the coordinator (relayed by the control thread). */
static void exec_send_peer(void *ctx, const Epmoe__PeerUnreachable *u)
{
    exec_send(ctx, EPMOE__MSG_TYPE__MSG_PEER_UNREACHABLE, &u->base, NULL, 0);
}

/* The serving path's turn: clients' SUBMITs, the data plane's request messages, the queue. */
static void exec_serve(exec_state *st, bool client_readable)
{
    if (st->srv == NULL)
        return;
    srv_env env = exec_env(st);
    if (client_readable)
        srv_on_client(st->srv, &env);
    srv_on_data(st->srv, &env);
    srv_run(st->srv, &env);
    srv_peer_reports(st->srv, &env, exec_send_peer, st);
    double now = clk_mono_s();
    if (now - st->reported_at >= 1.0 && env.ready) {
        st->reported_at = now;
        srv_report(st->srv, &env, exec_send_report, st);
    }
}

/* A staged load at a layer boundary: serve the steps that came and the open step's peers;
 * false when a command that supersedes the staged load came (stashed for the loop). */
static bool exec_serve_between_layers(exec_progress *p)
{
    exec_state *st = p->st;
    for (;;) {
        if (st->tp) {
            tpz_pump(st->tp);
            exec_serve_open(st);
        }
        exec_serve(st, true);
        if (st->n_stash > 0) /* a step's wait set something aside: it comes first */
            return false;
        wire_msg m;
        ep_err err;
        wire_rc rc =
            wire_recv(st->pipe, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err);
        if (rc == WIRE_AGAIN)
            return true;
        if (rc == WIRE_ERR) {
            log_error("executor: %s", err.msg);
            continue;
        }
        if (m.type != EPMOE__MSG_TYPE__MSG_STEP && m.type != EPMOE__MSG_TYPE__MSG_STEP_ABORT &&
            m.type != EXEC_CMD_METRICS) {
            exec_stash(st, &m);
            return false;
        }
        exec_handle(st, &m);
        wire_msg_close(&m);
    }
}

static void exec_loop(exec_state *st)
{
    while (!st->stop) {
        if (st->n_stash > 0) {
            wire_msg m;
            wire_msg_move(&m, &st->stash[0]);
            for (int i = 1; i < st->n_stash; i++)
                wire_msg_move(&st->stash[i - 1], &st->stash[i]);
            st->n_stash--;
            exec_handle(st, &m);
            wire_msg_close(&m);
            continue;
        }
        zmq_pollitem_t it[3] = {
            {.socket = st->pipe, .events = ZMQ_POLLIN},
            {.socket = st->srv ? srv_socket(st->srv) : NULL, .events = ZMQ_POLLIN},
            {.socket = st->tp ? tpz_socket(st->tp) : NULL, .events = ZMQ_POLLIN}};
        /* the client socket is polled only with a server, the data plane's only with one */
        zmq_pollitem_t *items = it;
        int n = 1;
        if (st->srv)
            n = 2;
        if (st->tp) {
            if (!st->srv)
                it[1] = it[2];
            n++;
        }
        long timeout = st->srv ? (long)srv_idle_timeout_ms(st->srv) + 1 : 1000;
        int rc_poll = zmq_poll(items, n, timeout > 1000 ? 1000 : timeout);
        bool client_in = st->srv && rc_poll > 0 && it[1].revents;
        bool data_in = st->tp && rc_poll > 0 && it[n - 1].revents;
        if (data_in) {
            tpz_pump(st->tp);
            exec_serve_open(st);
        }
        exec_serve(st, client_in);
        if (rc_poll <= 0 || !it[0].revents)
            continue;
        wire_msg m;
        ep_err err;
        wire_rc rc =
            wire_recv(st->pipe, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err);
        if (rc == WIRE_ERR)
            log_error("executor: %s", err.msg);
        if (rc != WIRE_OK)
            continue;
        exec_handle(st, &m);
        wire_msg_close(&m);
        /* the requests that waited for what the message brought (an epoch ready after a
         * WELCOME) start now, not at the next wake-up up to a second later */
        if (st->srv) {
            srv_env env = exec_env(st);
            srv_run(st->srv, &env);
        }
    }
}

static void *exec_main(void *arg)
{
    exec_actor *a = arg;
    exec_state st = {.actor = a,
                     .be = a->be,
                     .pipe = a->thread_pipe,
                     .between_layers = exec_serve_between_layers};
    exec_loop(&st);
    if (st.tp)
        tpz_set_awaits(st.tp, NULL, NULL); /* it points at the server */
    srv_destroy(&st.srv);
    exec_drop_session(&st);
    exec_close_plane(&st);
    exec_free_shard(&st);
    for (int i = 0; i < st.n_stash; i++)
        wire_msg_close(&st.stash[i]);
    zmq_close(st.pipe);
    return NULL;
}

/* Both ends of the pipe, made here so that a failure is an error of exec_start rather than a
 * thread that never reports back (the thread gets its end with the thread's creation, which
 * orders every access). */
static int exec_pipe_pair(exec_actor *a, ep_err *err)
{
    int linger = 0;
    a->pipe = zmq_socket(a->zctx, ZMQ_PAIR);
    if (a->pipe == NULL || zmq_setsockopt(a->pipe, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(a->pipe, a->endpoint) != 0)
        return ep_err_set(err, "executor pipe: %s", zmq_strerror(zmq_errno()));
    a->thread_pipe = zmq_socket(a->zctx, ZMQ_PAIR);
    if (a->thread_pipe == NULL ||
        zmq_setsockopt(a->thread_pipe, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_connect(a->thread_pipe, a->endpoint) != 0)
        return ep_err_set(err, "executor pipe (the thread's end): %s", zmq_strerror(zmq_errno()));
    return 0;
}

exec_actor *exec_start(void *zctx, mb_backend **be_p, const auth_keypair *key, ep_err *err)
{
    exec_actor *a = calloc(1, sizeof *a);
    if (a == NULL) {
        mb_destroy(be_p);
        ep_err_set(err, "executor: out of memory");
        return NULL;
    }
    a->zctx = zctx;
    a->be = *be_p;
    *be_p = NULL;
    if (key) {
        a->secure = true;
        a->key = *key;
    }
    /* a number, not the address: a new actor may get a stopped one's address while libzmq still
     * holds that one's inproc name */
    static atomic_uint seq;
    snprintf(a->endpoint, sizeof a->endpoint, "inproc://epmoe-exec-%u", atomic_fetch_add(&seq, 1));
    if (exec_pipe_pair(a, err) != 0)
        goto fail;
    if (pthread_create(&a->thread, NULL, exec_main, a) != 0) {
        ep_err_set(err, "executor: cannot start its thread");
        goto fail;
    }
    a->started = true;
    return a;
fail:
    exec_stop(&a);
    return NULL;
}

void *exec_pipe(exec_actor *a)
{
    return a->pipe;
}

int exec_send_cmd(exec_actor *a, uint16_t cmd, ep_err *err)
{
    if (cmd == EXEC_CMD_RESET || cmd == EXEC_CMD_TERM)
        atomic_fetch_add(&a->cancel, 1);
    return wire_send(a->pipe, NULL, 0, cmd, NULL, NULL, 0, false, err);
}

int exec_send_metrics(exec_actor *a, struct wmx *m, ep_err *err)
{
    if (zmq_send(a->pipe, WIRE_VERSION, strlen(WIRE_VERSION), ZMQ_SNDMORE) < 0)
        goto fail;
    uint8_t tb[2] = {(uint8_t)(EXEC_CMD_METRICS & 0xFF), (uint8_t)(EXEC_CMD_METRICS >> 8)};
    if (zmq_send(a->pipe, tb, 2, ZMQ_SNDMORE) < 0 || zmq_send(a->pipe, &m, sizeof m, 0) < 0)
        goto fail;
    return 0;
fail:
    return ep_err_set(err, "executor pipe: %s", zmq_strerror(zmq_errno()));
}

int exec_send_session(exec_actor *a, exec_session **s_p, ep_err *err)
{
    exec_session *s = *s_p;
    *s_p = NULL;
    if (zmq_send(a->pipe, WIRE_VERSION, strlen(WIRE_VERSION), ZMQ_SNDMORE) < 0)
        goto fail;
    uint8_t tb[2] = {(uint8_t)(EXEC_CMD_SESSION & 0xFF), (uint8_t)(EXEC_CMD_SESSION >> 8)};
    if (zmq_send(a->pipe, tb, 2, ZMQ_SNDMORE) < 0 || zmq_send(a->pipe, &s, sizeof s, 0) < 0)
        goto fail;
    return 0;
fail:
    exec_session_free(&s);
    return ep_err_set(err, "executor pipe: %s", zmq_strerror(zmq_errno()));
}

void exec_stop(exec_actor **self_p)
{
    exec_actor *a = *self_p;
    if (a == NULL)
        return;
    if (a->started) {
        exec_send_cmd(a, EXEC_CMD_TERM, NULL);
        pthread_join(a->thread, NULL);
    }
    if (a->pipe)
        zmq_close(a->pipe);
    if (!a->started && a->thread_pipe)
        zmq_close(a->thread_pipe); /* a started thread closes its own end */
    mb_destroy(&a->be);
    explicit_bzero(&a->key, sizeof a->key);
    free(a);
    *self_p = NULL;
}

const char *exec_backend_name(const exec_actor *a)
{
    return mb_name(a->be);
}
