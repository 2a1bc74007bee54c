/*
 * control.c — the worker's main thread (see control.h).
 *
 * One loop, one owner per socket: the DEALER and the executor pipe are only touched here. The
 * executor's answers after a RESET belong to the old session until it acknowledges the RESET
 * (EXEC_EVT_RESET_DONE), so they are discarded until then (resets_pending).
 */
#include "worker/control.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/sdnotify.h"
#include "common/wire.h"
#include "worker/exec.h"
#include "worker/transport_comm_lib.h"
#include "worker/welcome.h"
#include "worker/wmetrics.h"

#ifndef EPMOE_VERSION_STRING
#define EPMOE_VERSION_STRING "unknown"
#endif

typedef enum wctl_state {
    WCTL_REGISTERING,
    WCTL_WELCOMED,
    WCTL_LOADING,
    WCTL_READY,
    WCTL_LOAD_FAILED,
    WCTL_BACKOFF,
} wctl_state;

static const char *const wctl_state_names[] = {"registering", "welcomed",    "loading",
                                               "ready",       "load-failed", "backoff"};

/* reconnect_at when the coordinator answered again during a backoff: reconnect now */
#define WCTL_RECONNECT_NOW INT64_MIN

typedef struct wctl {
    const wctl_options *opt;
    void *zctx;
    void *dealer;          /* NULL while backing off */
    void *retired;         /* the DEALER given up at the last backoff, closed at the reconnect */
    void *retired_mon;     /* its handshake monitor: a handshake there ends the backoff */
    void *lingering;       /* a retired DEALER that just reconnected, closed a backoff later */
    void *mon;             /* the DEALER's handshake monitor */
    auth_zap *zap;         /* security: admits the peers WELCOME names to the data endpoint */
    int64_t max_msg;       /* ZMQ_MAXMSGSIZE for the next DEALER */
    int failed_handshakes; /* in a row, without a reason (auth_monitor_read) */
    exec_actor *exec;
    mb_device_info dev; /* what REGISTER reports */
    char backend[32];
    /* the DEALER's routing id is ident/N for its N-th connection: ident (NAME/random) names
     * this process, N that connection (coordinator/registry.h, "Who is who") */
    char ident[80];
    unsigned n_connections;
    int sigfd;
    wctl_state state;
    int resets_pending; /* executor answers are stale until this many RESET_DONE came back */
    uint64_t epoch;
    int rank, world_size;
    int heartbeat_ms, liveness;
    char client_endpoint[EP_MAX_PATH]; /* the executor's, from its last READY ("": none yet) */
    int64_t last_heard, next_heartbeat, reconnect_at, next_watchdog;
    int backoff_ms;
    int64_t watchdog_ms; /* half of WatchdogSec, 0 when off */
    bool done;
    int exit_code;
    uint64_t staged; /* a staged epoch the executor prepares (0: none) */
    /* the executor holds a WELCOME's session (it serves clients in it) until a RESET: kept
     * while the coordinator is away or restarted, so that serving goes on without it */
    bool has_session;
    uint64_t session; /* its id (REGISTER names it: a restarted coordinator takes it over) */
    wmx *mx;          /* metrics, served when WELCOME names an address */
} wctl;

static const char *wctl_code_name(int code)
{
    return wire_code_name(code, "ERR_?");
}

static void wctl_set_state(wctl *w, wctl_state s, const char *detail)
{
    w->state = s;
    wmx_state(w->mx, wctl_state_names[s]);
    sdn_notifyf("STATUS=%s%s%s", wctl_state_names[s], detail ? ": " : "", detail ? detail : "");
    log_debug(LOG_SUB_NET, "state %s%s%s", wctl_state_names[s], detail ? ": " : "",
              detail ? detail : "");
}

/* ---- the coordinator link ---------------------------------------------------------------------
 */

static void wctl_send(wctl *w, uint16_t type, const ProtobufCMessage *body)
{
    ep_err err;
    if (w->dealer && wire_send(w->dealer, NULL, 0, type, body, NULL, 0, true, &err) != 0)
        log_warn("to the coordinator: %s", err.msg);
}

/* Move m's frames to sock (zero-copy). The first frame does not wait: a full queue to an absent
 * coordinator drops the message instead of blocking the loop. */
static void wctl_relay(wire_msg *m, void *sock, bool dontwait)
{
    for (int i = 0; i < m->n_frames; i++) {
        int flags = (i + 1 < m->n_frames ? ZMQ_SNDMORE : 0) | (dontwait ? ZMQ_DONTWAIT : 0);
        if (zmq_msg_send(&m->frames[i], sock, flags) < 0) {
            log_warn("relaying %s: %s", wire_type_name(m->type), zmq_strerror(zmq_errno()));
            return;
        }
    }
}

static void wctl_send_register(wctl *w)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    /* the backend's (mb_device_info.caps: "cpu", the instruction sets, the GPU's), then the data
     * planes this build adds */
    char *caps[MB_MAX_CAPS + 1];
    size_t n_caps = 0;
    for (int i = 0; i < w->dev.n_caps; i++)
        caps[n_caps++] = w->dev.caps[i];
    if (w->dev.kind == MB_DEV_CUDA && tpc_nccl_ops() != NULL)
        caps[n_caps++] = "nccl"; /* this build can serve data_plane nccl */
    Epmoe__DeviceInfo d = EPMOE__DEVICE_INFO__INIT;
    d.name = w->dev.name;
    d.backend = w->backend;
    if (w->dev.kind == MB_DEV_CUDA) {
        d.has_memory_total = d.has_memory_free = d.has_sm_major = d.has_sm_minor = 1;
        d.memory_total = w->dev.mem_total;
        d.memory_free = w->dev.mem_free;
        d.sm_major = (uint32_t)w->dev.sm_major;
        d.sm_minor = (uint32_t)w->dev.sm_minor;
    }
    Epmoe__Register r = EPMOE__REGISTER__INIT;
    r.name = (char *)w->opt->name;
    r.device = (char *)w->opt->device;
    r.n_capabilities = n_caps;
    r.capabilities = caps;
    r.device_info = &d;
    r.hostname = host;
    r.has_pid = 1;
    r.pid = (uint32_t)getpid();
    r.version = EPMOE_VERSION_STRING;
    r.client_endpoint = w->client_endpoint[0] ? w->client_endpoint : NULL;
    r.has_session = w->has_session;
    r.session = w->session;
    wctl_send(w, EPMOE__MSG_TYPE__MSG_REGISTER, &r.base);
}

/* Stop watching d's handshakes. */
static void wctl_stop_monitor(wctl *w, void *d)
{
    if (w->mon) {
        zmq_socket_monitor(d, NULL, 0);
        zmq_close(w->mon);
        w->mon = NULL;
    }
}

/* Close d and its monitor (the monitor first: it watches d). */
static void wctl_close_dealer_with(wctl *w, void *d)
{
    wctl_stop_monitor(w, d);
    zmq_close(d);
}

/* Stop watching the retired DEALER (its monitor first: it watches that socket). */
static void wctl_stop_retired_monitor(wctl *w)
{
    if (w->retired_mon) {
        zmq_socket_monitor(w->retired, NULL, 0);
        zmq_close(w->retired_mon);
        w->retired_mon = NULL;
    }
}

static int wctl_connect(wctl *w, ep_err *err)
{
    /* The DEALER of the last backoff is closed only now, a backoff later: a worker that was
     * frozen (SIGSTOP) or cut off sees its connections fail the moment it runs again, and
     * closing a socket in that same instant can make libzmq 4.3 abort on a half-sent multipart
     * message (session_base_t::clean_pipes); by now its I/O thread has cleaned up. One that
     * has just reconnected (the coordinator is back: wctl_read_retired) is in that instant
     * again, so it lingers until the next connect. */
    wctl_stop_retired_monitor(w);
    if (w->lingering)
        zmq_close(w->lingering);
    w->lingering = NULL;
    if (w->retired && w->reconnect_at == WCTL_RECONNECT_NOW)
        w->lingering = w->retired;
    else if (w->retired)
        zmq_close(w->retired);
    w->retired = NULL;
    void *d = zmq_socket(w->zctx, ZMQ_DEALER);
    if (d == NULL)
        return ep_err_set(err, "zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
    int ivl = w->heartbeat_ms, timeout = w->heartbeat_ms * w->liveness;
    int ttl = timeout < 100 ? 100 : timeout; /* below 100 ms TTL has no effect (zmq docs) */
    char id[sizeof w->ident + 16];
    int id_len = snprintf(id, sizeof id, "%s/%u", w->ident, ++w->n_connections);
    if (wire_socket_defaults(d, w->max_msg, err) != 0 ||
        (w->opt->key && auth_client(d, w->opt->key, w->opt->coordinator_key, err) != 0) ||
        zmq_setsockopt(d, ZMQ_ROUTING_ID, id, (size_t)id_len) != 0 ||
        zmq_setsockopt(d, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(d, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout) != 0 ||
        zmq_setsockopt(d, ZMQ_HEARTBEAT_TTL, &ttl, sizeof ttl) != 0) {
        if (!err->msg[0])
            ep_err_set(err, "DEALER options: %s", zmq_strerror(zmq_errno()));
        zmq_close(d);
        return -1;
    }
    /* also without a key: a coordinator that uses CURVE refuses the handshake, and that must
     * end in a message and exit 78, not in endless silent retries */
    if ((w->mon = auth_monitor(w->zctx, d, err)) == NULL) {
        zmq_close(d);
        return -1;
    }
    if (zmq_connect(d, w->opt->coordinator) != 0) {
        ep_err_set(err, "cannot connect to the coordinator at %s: %s", w->opt->coordinator,
                   zmq_strerror(zmq_errno()));
        wctl_close_dealer_with(w, d);
        return -1;
    }
    w->dealer = d;
    w->last_heard = clk_mono_ms();
    wctl_send_register(w);
    char detail[EP_MAX_PATH + 32];
    snprintf(detail, sizeof detail, "registering with %s", w->opt->coordinator);
    wctl_set_state(w, WCTL_REGISTERING, detail);
    return 0;
}

static void wctl_exec_reset(wctl *w)
{
    ep_err err;
    w->has_session = false;
    if (exec_send_cmd(w->exec, EXEC_CMD_RESET, &err) == 0)
        w->resets_pending++;
    else
        log_error("executor: %s", err.msg);
}

/* The coordinator went silent (or refused us for now): register again later. A refusal drops
 * the session; a silence keeps it serving: clients' requests go on in the current epoch while
 * the coordinator is away (docs/protocol.md "Serving path"), and the next WELCOME replaces it. */
static void wctl_backoff_keep(wctl *w, const char *why, bool keep_serving)
{
    if (keep_serving) {
        log_warn("%s: serving on in epoch %llu, registering again in %d ms", why,
                 (unsigned long long)w->epoch, w->backoff_ms);
    } else {
        log_warn("%s: dropping the session (the loaded shard stays), registering again in %d ms",
                 why, w->backoff_ms);
        wctl_exec_reset(w);
    }
    /* Not closed now: see wctl_connect. Its monitor stays: the handshake of its automatic
     * reconnect is the first sign that the coordinator is back (wctl_read_retired). */
    wctl_stop_retired_monitor(w);
    if (w->retired)
        zmq_close(w->retired);
    w->retired = w->dealer;
    w->retired_mon = w->mon;
    w->mon = NULL;
    w->dealer = NULL;
    w->reconnect_at = clk_deadline_ms(w->backoff_ms);
    w->backoff_ms =
        w->backoff_ms * 2 > WCTL_BACKOFF_MAX_MS ? WCTL_BACKOFF_MAX_MS : w->backoff_ms * 2;
    wctl_set_state(w, WCTL_BACKOFF, why);
}

static void wctl_backoff(wctl *w, const char *why)
{
    wctl_backoff_keep(w, why, false);
}

/* ---- coordinator messages ---------------------------------------------------------------------
 */

static void wctl_on_error(wctl *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, m, &err);
    if (e == NULL) {
        log_warn("coordinator: %s", err.msg);
        return;
    }
    int code = e->has_code ? (int)e->code : 0;
    const char *text = e->message ? e->message : "";
    if (code == EPMOE__ERROR_CODE__ERR_UNKNOWN_WORKER ||
        code == EPMOE__ERROR_CODE__ERR_CONFIG_HASH || code == EPMOE__ERROR_CODE__ERR_REFUSED ||
        code == EPMOE__ERROR_CODE__ERR_DUPLICATE) {
        log_error("the coordinator refuses worker %s: %s: %s — fix the cluster spec, the "
                  "command line or the binary (or stop the other process), then restart",
                  w->opt->name, wctl_code_name(code), text);
        sdn_notifyf("STATUS=refused by the coordinator: %s", wctl_code_name(code));
        w->exit_code = WCTL_EXIT_CONFIG;
        w->done = true;
    } else if (code == EPMOE__ERROR_CODE__ERR_NOT_REGISTERED) {
        /* a coordinator that does not know this connection (it was restarted): it placed
         * nothing anywhere yet, so the session goes on serving until its WELCOME replaces it,
         * and this worker registers at once (it answers: no backoff can help) */
        char why[EP_ERR_MSG_MAX];
        snprintf(why, sizeof why, "coordinator: %s: %s", wctl_code_name(code), text);
        wctl_backoff_keep(w, why, w->has_session);
        w->reconnect_at = WCTL_RECONNECT_NOW;
    } else if (code == EPMOE__ERROR_CODE__ERR_WORKER_LOST) {
        /* declared dead: the others serve in an epoch without us; start over, after the
         * backoff */
        char why[EP_ERR_MSG_MAX];
        snprintf(why, sizeof why, "coordinator: %s: %s", wctl_code_name(code), text);
        wctl_backoff(w, why);
    } else {
        log_warn("coordinator: %s: %s (in reply to %s)", wctl_code_name(code), text,
                 e->has_in_reply_to ? wire_type_name((uint16_t)e->in_reply_to) : "?");
    }
    wire_free_unpacked(&e->base);
}

/* Admit exactly the session's peers to the data endpoint, each key as its worker's name. */
static int wctl_admit_peers(wctl *w, const exec_session *s, ep_err *err)
{
    auth_list *l = auth_list_new();
    if (l == NULL)
        return ep_err_set(err, "out of memory");
    for (int r = 0; r < s->world_size; r++)
        if (r != s->rank && auth_list_add(l, s->peer_key[r], s->peer_name[r], err) != 0) {
            auth_list_free(&l);
            return ep_err_prefix(err, "WELCOME: peers");
        }
    return auth_zap_allow(w->zap, AUTH_DOMAIN_DATA, l, err);
}

/* Admit exactly these client keys to the client endpoint (WELCOME.client_keys, or
 * CLIENT_KEYS after a reload). Each key speaks for its own Z85 text, so that the serving path
 * can tell a connection whose key a later list no longer holds (auth_admits). */
static int wctl_admit_clients(wctl *w, const ProtobufCBinaryData *keys, size_t n, const char *what,
                              ep_err *err)
{
    auth_list *l = auth_list_new();
    if (l == NULL)
        return ep_err_set(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (keys[i].len != AUTH_KEY_BYTES || i >= AUTH_MAX_KEYS) {
            auth_list_free(&l);
            return ep_err_set(err, "%s: client_keys[%zu] has %zu bytes, expected %d", what, i,
                              keys[i].len, AUTH_KEY_BYTES);
        }
        char name[AUTH_Z85_LEN + 1];
        auth_z85(keys[i].data, name);
        if (auth_list_add(l, keys[i].data, name, err) != 0) {
            auth_list_free(&l);
            return ep_err_prefix(err, "%s: client_keys", what);
        }
    }
    return auth_zap_allow(w->zap, AUTH_DOMAIN_CLIENTS, l, err);
}

/* CLIENT_KEYS: a reload changed the client allow-list; it applies at once, session or not. */
static void wctl_on_client_keys(wctl *w, const wire_msg *m)
{
    ep_err err = {0};
    Epmoe__ClientKeys *k =
        (Epmoe__ClientKeys *)wire_unpack(&epmoe__client_keys__descriptor, m, &err);
    if (k != NULL && w->zap == NULL)
        ep_err_set(&err, "CLIENT_KEYS to a worker without --key");
    if (k == NULL || w->zap == NULL ||
        wctl_admit_clients(w, k->client_keys, k->n_client_keys, "CLIENT_KEYS", &err) != 0) {
        log_error("%s (the old client allow-list stays)", err.msg);
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                        EPMOE__MSG_TYPE__MSG_CLIENT_KEYS, "worker %s: %s", w->opt->name, err.msg);
    } else {
        log_info("client allow-list replaced: %zu keys", k->n_client_keys);
    }
    wire_free_unpacked(k ? &k->base : NULL);
}

static void wctl_on_welcome(wctl *w, const wire_msg *m)
{
    ep_err err = {0};
    Epmoe__Welcome *wm = (Epmoe__Welcome *)wire_unpack(&epmoe__welcome__descriptor, m, &err);
    exec_session *s = wm ? wctl_welcome_parse(wm, w->opt->key != NULL, &err) : NULL;
    if (s != NULL && w->zap != NULL &&
        (wctl_admit_peers(w, s, &err) != 0 ||
         wctl_admit_clients(w, wm->client_keys, wm->n_client_keys, "WELCOME", &err) != 0))
        exec_session_free(&s);
    if (s == NULL) {
        log_error("invalid WELCOME: %s", err.msg);
        if (w->dealer)
            wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                            EPMOE__MSG_TYPE__MSG_WELCOME, "worker %s: %s", w->opt->name, err.msg);
        wire_free_unpacked(wm ? &wm->base : NULL);
        return;
    }
    if (wm->config_hash != s->config_hash)
        log_warn("WELCOME: the coordinator's config hash %016llx differs from ours %016llx",
                 (unsigned long long)wm->config_hash, (unsigned long long)s->config_hash);
    if (wm->device && strcmp(wm->device, w->opt->device) != 0)
        log_warn("WELCOME: the cluster spec assigns device %s, this worker runs on %s", wm->device,
                 w->opt->device);
    w->rank = s->rank;
    w->world_size = s->world_size;
    w->epoch = s->epoch;
    w->staged = 0;
    w->heartbeat_ms = (int)wm->heartbeat_ms;
    w->liveness = (int)wm->liveness;
    w->max_msg = mmsg_max_frame(&s->config); /* for the next connection */
    wmx_session(w->mx, w->opt->name, s->rank, w->opt->device, s->config.num_hidden_layers);
    if (wmx_serve(w->mx, wm->metrics ? wm->metrics : "", &err) != 0)
        log_error("metrics: %s (the worker serves without them)", err.msg);
    uint64_t hash = s->config_hash;
    uint64_t session = s->session;
    wctl_exec_reset(w);
    if (exec_send_session(w->exec, &s, &err) != 0)
        log_error("executor: %s", err.msg);
    else
        w->has_session = true;
    w->session = session;
    Epmoe__ConfigAck ack = EPMOE__CONFIG_ACK__INIT;
    ack.has_config_hash = ack.has_epoch = 1;
    ack.config_hash = hash;
    ack.epoch = w->epoch;
    wctl_send(w, EPMOE__MSG_TYPE__MSG_CONFIG_ACK, &ack.base);
    w->next_heartbeat = clk_deadline_ms(w->heartbeat_ms);
    char detail[128];
    snprintf(detail, sizeof detail, "rank %d of %d, epoch %llu", w->rank, w->world_size,
             (unsigned long long)w->epoch);
    log_info("welcomed: %s, config hash %016llx", detail, (unsigned long long)hash);
    wctl_set_state(w, WCTL_WELCOMED, detail);
    wire_free_unpacked(&wm->base);
}

static void wctl_on_load(wctl *w, wire_msg *m)
{
    ep_err err;
    Epmoe__Load *l = (Epmoe__Load *)wire_unpack(&epmoe__load__descriptor, m, &err);
    uint16_t LOAD = EPMOE__MSG_TYPE__MSG_LOAD;
    if (l == NULL) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, LOAD, "%s", err.msg);
        return;
    }
    bool epoch_ok = !l->has_epoch || l->epoch == w->epoch;
    wire_free_unpacked(&l->base);
    if (w->state == WCTL_LOADING) {
        log_info("LOAD while loading: ignored");
        return;
    }
    if (w->state != WCTL_WELCOMED && w->state != WCTL_LOAD_FAILED && w->state != WCTL_READY) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, LOAD,
                        "worker %s: LOAD in state %s", w->opt->name, wctl_state_names[w->state]);
        return;
    }
    if (!epoch_ok) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, LOAD,
                        "worker %s: LOAD for another epoch (this worker is at epoch %llu)",
                        w->opt->name, (unsigned long long)w->epoch);
        return;
    }
    wctl_relay(m, exec_pipe(w->exec), false);
    wctl_set_state(w, WCTL_LOADING, "loading the shard");
}

/* Epoch `epoch` becomes the worker's: m goes to the executor (after a load in progress, so
 * epochs apply in order) and the worker is loading until the executor says READY. */
static void wctl_enter_epoch(wctl *w, wire_msg *m, uint64_t epoch, const char *doing)
{
    w->epoch = epoch;
    w->staged = 0;
    wctl_relay(m, exec_pipe(w->exec), false);
    char detail[128];
    snprintf(detail, sizeof detail, "%s placement epoch %llu", doing, (unsigned long long)epoch);
    wctl_set_state(w, WCTL_LOADING, detail);
}

/* A new placement epoch: the executor keeps what it still owns and loads what it gains. */
static void wctl_on_epoch(wctl *w, wire_msg *m)
{
    ep_err err;
    const uint16_t EPOCH = EPMOE__MSG_TYPE__MSG_EPOCH;
    Epmoe__Epoch *ep = (Epmoe__Epoch *)wire_unpack(&epmoe__epoch__descriptor, m, &err);
    if (ep == NULL || !ep->has_epoch) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, EPOCH, "%s",
                        ep ? "EPOCH without an epoch" : err.msg);
        wire_free_unpacked(ep ? &ep->base : NULL);
        return;
    }
    uint64_t epoch = ep->epoch;
    bool staged = ep->has_staged && ep->staged;
    wire_free_unpacked(&ep->base);
    if (staged) {
        /* a rebalance: the executor prepares it between the steps it keeps serving */
        if (w->state != WCTL_READY) {
            wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, EPOCH,
                            "worker %s: staged EPOCH in state %s (expected ready)", w->opt->name,
                            wctl_state_names[w->state]);
            return;
        }
        w->staged = epoch;
        wctl_relay(m, exec_pipe(w->exec), false);
        log_info("preparing staged placement epoch %llu", (unsigned long long)epoch);
        return;
    }
    if (w->state != WCTL_LOADING && w->state != WCTL_READY && w->state != WCTL_LOAD_FAILED) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, EPOCH,
                        "worker %s: EPOCH in state %s (expected after LOAD)", w->opt->name,
                        wctl_state_names[w->state]);
        return;
    }
    wctl_enter_epoch(w, m, epoch, "loading");
}

/* EPOCH_COMMIT: the staged epoch is served from now on (the executor switches, READY). */
static void wctl_on_commit(wctl *w, wire_msg *m)
{
    ep_err err;
    const uint16_t COMMIT = EPMOE__MSG_TYPE__MSG_EPOCH_COMMIT;
    Epmoe__EpochCommit *c =
        (Epmoe__EpochCommit *)wire_unpack(&epmoe__epoch_commit__descriptor, m, &err);
    if (c == NULL || !c->has_epoch) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, COMMIT, "%s",
                        c ? "EPOCH_COMMIT without an epoch" : err.msg);
        wire_free_unpacked(c ? &c->base : NULL);
        return;
    }
    uint64_t epoch = c->epoch;
    wire_free_unpacked(&c->base);
    if (w->state != WCTL_READY || epoch != w->staged) {
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, COMMIT,
                        "worker %s: EPOCH_COMMIT %llu in state %s (staged: %llu)", w->opt->name,
                        (unsigned long long)epoch, wctl_state_names[w->state],
                        (unsigned long long)w->staged);
        return;
    }
    wctl_enter_epoch(w, m, epoch, "switching to");
}

static void wctl_on_step(wctl *w, wire_msg *m)
{
    if (w->state == WCTL_READY) {
        wctl_relay(m, exec_pipe(w->exec), false);
        return;
    }
    ep_err err;
    Epmoe__Step *s = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, m, &err);
    Epmoe__StepFailed f = EPMOE__STEP_FAILED__INIT;
    char text[256];
    snprintf(text, sizeof text, "worker %s is %s, not ready", w->opt->name,
             wctl_state_names[w->state]);
    f.has_step_id = s && s->has_step_id;
    f.step_id = s ? s->step_id : 0;
    f.has_code = 1;
    f.code = EPMOE__ERROR_CODE__ERR_NOT_READY;
    f.message = text;
    wctl_send(w, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &f.base);
    wire_free_unpacked(s ? &s->base : NULL);
}

static void wctl_on_shutdown(wctl *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__Shutdown *s = (Epmoe__Shutdown *)wire_unpack(&epmoe__shutdown__descriptor, m, &err);
    log_info("SHUTDOWN from the coordinator%s%s", s && s->reason ? ": " : "",
             s && s->reason ? s->reason : "");
    wire_free_unpacked(s ? &s->base : NULL);
    w->exit_code = WCTL_EXIT_OK;
    w->done = true;
}

static void wctl_on_coordinator(wctl *w, wire_msg *m)
{
    log_debug(LOG_SUB_NET, "from the coordinator: %s", wire_type_name(m->type));
    switch (m->type) {
    case EPMOE__MSG_TYPE__MSG_ERROR:
        wctl_on_error(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_WELCOME:
        wctl_on_welcome(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_LOAD:
        wctl_on_load(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_EPOCH:
        wctl_on_epoch(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_EPOCH_COMMIT:
        wctl_on_commit(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP:
        wctl_on_step(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP_ABORT:
    case EPMOE__MSG_TYPE__MSG_COMM_INIT: /* the executor owns the NCCL communicator */
        if (w->state == WCTL_READY)
            wctl_relay(m, exec_pipe(w->exec), false);
        break;
    case EPMOE__MSG_TYPE__MSG_CLIENT_KEYS:
        wctl_on_client_keys(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_HEARTBEAT:
        break;
    case EPMOE__MSG_TYPE__MSG_SHUTDOWN:
        wctl_on_shutdown(w, m);
        break;
    default:
        wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE, m->type,
                        "worker %s does not handle %s", w->opt->name, wire_type_name(m->type));
    }
}

static void wctl_read_dealer(wctl *w)
{
    while (w->dealer && !w->done) {
        wire_msg m;
        ep_err err;
        wire_rc rc =
            wire_recv(w->dealer, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err);
        if (rc == WIRE_AGAIN)
            return;
        w->last_heard = clk_mono_ms(); /* any message is a sign of life */
        w->backoff_ms = WCTL_BACKOFF_INIT_MS;
        if (rc == WIRE_ERR) {
            log_warn("from the coordinator: %s", err.msg);
            wire_send_error(w->dealer, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, 0,
                            "worker %s: %s", w->opt->name, err.msg);
            continue;
        }
        wctl_on_coordinator(w, &m);
        wire_msg_close(&m);
    }
}

/* A handshake the coordinator refused: our key is not in its allow-list, it is not the server
 * we hold a key for, or one side uses security and the other not. Retrying cannot help. */
static void wctl_read_monitor(wctl *w)
{
    char why[512];
    auth_event ev;
    while (w->mon && (ev = auth_monitor_read(w->mon, why, sizeof why)) != AUTH_EV_NOTHING) {
        if (ev == AUTH_EV_OK) {
            w->failed_handshakes = 0;
            /* a coordinator that completed a handshake is alive: its WELCOME gets a whole
             * liveness window (a REGISTER queued while it was away just reached a restarted
             * one; giving up now made the WELCOME land on a retired socket, a backoff lost) */
            w->last_heard = clk_mono_ms();
        }
        if (ev == AUTH_EV_FAILED)
            w->failed_handshakes++;
        if (ev != AUTH_EV_REFUSED && w->failed_handshakes < AUTH_FAILED_LIMIT)
            continue;
        log_error("worker %s: %s; check --key and --coordinator-key against the cluster spec's "
                  "security: section, then restart",
                  w->opt->name, why);
        sdn_notifyf("STATUS=refused by the coordinator: %s", why);
        w->exit_code = WCTL_EXIT_CONFIG;
        w->done = true;
        return;
    }
}

/* The retired DEALER reconnected (libzmq keeps reconnecting it): the coordinator answers
 * again, so the backoff ends now instead of up to WCTL_BACKOFF_MAX_MS later. Without this a
 * long outage cost the rest of a grown backoff, and the REGISTER the retired connection still
 * held was welcomed by the returning coordinator and declared dead `liveness` heartbeats later
 * (nothing ever answered it). The new connection's REGISTER follows at once; the coordinator
 * takes it for the same process (NAME/random) and replaces the stale registration. */
static void wctl_read_retired(wctl *w)
{
    char why[512];
    auth_event ev;
    while (w->retired_mon &&
           (ev = auth_monitor_read(w->retired_mon, why, sizeof why)) != AUTH_EV_NOTHING)
        if (ev == AUTH_EV_OK && w->state == WCTL_BACKOFF && w->reconnect_at != WCTL_RECONNECT_NOW) {
            log_info("the coordinator at %s answers again: registering now, not in %lld ms",
                     w->opt->coordinator, (long long)(w->reconnect_at - clk_mono_ms()));
            w->reconnect_at = WCTL_RECONNECT_NOW;
        }
}

/* ---- executor messages ------------------------------------------------------------------------
 */

/* The epoch a READY from the executor is for (0 when it does not say, or when it only says a
 * staged epoch is prepared): a READY for an epoch that a newer EPOCH replaced while it loaded
 * does not make the worker ready. */
static uint64_t wctl_ready_epoch(wctl *w, const wire_msg *m)
{
    Epmoe__Ready *r = (Epmoe__Ready *)wire_unpack(&epmoe__ready__descriptor, m, NULL);
    uint64_t epoch = r && r->has_epoch && !(r->has_staged && r->staged) ? r->epoch : 0;
    /* what the next REGISTER says: the executor keeps the endpoint for the process's life */
    if (r && r->client_endpoint && strlen(r->client_endpoint) < sizeof w->client_endpoint)
        snprintf(w->client_endpoint, sizeof w->client_endpoint, "%s", r->client_endpoint);
    wire_free_unpacked(r ? &r->base : NULL);
    return epoch;
}

static void wctl_on_exec(wctl *w, wire_msg *m)
{
    if (m->type == EXEC_EVT_RESET_DONE) {
        if (w->resets_pending > 0)
            w->resets_pending--;
        return;
    }
    if (w->resets_pending > 0) {
        log_debug(LOG_SUB_NET, "discarding %s of a previous session", wire_type_name(m->type));
        return;
    }
    uint64_t ready_epoch = m->type == EPMOE__MSG_TYPE__MSG_READY ? wctl_ready_epoch(w, m) : 0;
    if (m->type == EPMOE__MSG_TYPE__MSG_READY && w->state == WCTL_LOADING &&
        ready_epoch == w->epoch) {
        char detail[128];
        snprintf(detail, sizeof detail, "rank %d of %d, epoch %llu", w->rank, w->world_size,
                 (unsigned long long)w->epoch);
        wctl_set_state(w, WCTL_READY, detail);
        wmx_epoch(w->mx, w->epoch);
        sdn_notify("READY=1");
        log_info("ready: %s", detail);
    } else if (m->type == EPMOE__MSG_TYPE__MSG_ERROR && w->state == WCTL_READY && w->staged) {
        w->staged = 0; /* the staged epoch could not be prepared; the served one goes on */
    } else if (m->type == EPMOE__MSG_TYPE__MSG_ERROR && w->state == WCTL_LOADING) {
        wctl_set_state(w, WCTL_LOAD_FAILED, "see the log");
    }
    if (w->dealer)
        wctl_relay(m, w->dealer, true);
}

static void wctl_read_exec(wctl *w)
{
    for (;;) {
        wire_msg m;
        ep_err err;
        wire_rc rc = wire_recv(exec_pipe(w->exec), false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG,
                               ZMQ_DONTWAIT, &m, &err);
        if (rc == WIRE_AGAIN)
            return;
        if (rc == WIRE_ERR) {
            log_error("executor pipe: %s", err.msg);
            continue;
        }
        wctl_on_exec(w, &m);
        wire_msg_close(&m);
    }
}

/* ---- signals and timers -----------------------------------------------------------------------
 */

static int wctl_signals(wctl *w, ep_err *err)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    /* blocked before any thread starts, so every thread inherits the mask and the signals
     * reach only the signalfd */
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return ep_err_set(err, "pthread_sigmask failed");
    signal(SIGPIPE, SIG_IGN);
    w->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (w->sigfd < 0)
        return ep_err_errno(err, "signalfd");
    return 0;
}

static void wctl_read_signals(wctl *w)
{
    struct signalfd_siginfo si;
    while (read(w->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP) {
            log_info("SIGHUP: nothing to reload in a worker (ignored)");
            continue;
        }
        log_info("%s: stopping", strsignal((int)si.ssi_signo));
        w->exit_code = WCTL_EXIT_OK;
        w->done = true;
    }
}

static bool wctl_welcomed(const wctl *w)
{
    return w->dealer && w->state != WCTL_REGISTERING && w->state != WCTL_BACKOFF;
}

static void wctl_timers(wctl *w)
{
    int64_t now = clk_mono_ms();
    if (w->state == WCTL_BACKOFF) {
        ep_err err = {0};
        if (now >= w->reconnect_at && wctl_connect(w, &err) != 0) {
            log_error("%s", err.msg);
            wctl_backoff(w, "reconnect failed");
        }
    } else if (now - w->last_heard > (int64_t)w->heartbeat_ms * w->liveness) {
        char why[128];
        snprintf(why, sizeof why, "coordinator silent for %lld ms",
                 (long long)(now - w->last_heard));
        /* also while registering again after an earlier silence: the session this worker
         * serves in is the last one it was welcomed into, whatever the link is doing */
        wctl_backoff_keep(w, why, w->has_session);
    } else if (wctl_welcomed(w) && now >= w->next_heartbeat) {
        Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
        hb.has_epoch = 1;
        hb.epoch = w->epoch;
        wctl_send(w, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base);
        w->next_heartbeat = now + w->heartbeat_ms;
    }
    if (w->watchdog_ms && now >= w->next_watchdog) {
        sdn_notify("WATCHDOG=1"); /* the loop is alive: it got here within one poll timeout */
        w->next_watchdog = now + w->watchdog_ms;
    }
}

static long wctl_poll_timeout(const wctl *w)
{
    int64_t now = clk_mono_ms(), next = now + 1000;
    if (w->state == WCTL_BACKOFF && w->reconnect_at < next)
        next = w->reconnect_at;
    if (w->state != WCTL_BACKOFF) {
        int64_t expiry = w->last_heard + (int64_t)w->heartbeat_ms * w->liveness + 1;
        if (expiry < next)
            next = expiry;
        if (wctl_welcomed(w) && w->next_heartbeat < next)
            next = w->next_heartbeat;
    }
    if (w->watchdog_ms && w->next_watchdog < next)
        next = w->next_watchdog;
    return next > now ? (long)(next - now) : 0;
}

static void wctl_loop(wctl *w)
{
    while (!w->done) {
        /* the DEALER and its monitor while connected, the retired one's monitor while backing
         * off */
        zmq_pollitem_t it[4] = {
            {.fd = w->sigfd, .events = ZMQ_POLLIN},
            {.socket = exec_pipe(w->exec), .events = ZMQ_POLLIN},
            {.socket = w->dealer ? w->dealer : w->retired_mon, .events = ZMQ_POLLIN},
            {.socket = w->mon, .events = ZMQ_POLLIN}};
        int n_items = w->dealer ? (w->mon ? 4 : 3) : w->retired_mon ? 3 : 2;
        int n = zmq_poll(it, n_items, wctl_poll_timeout(w));
        if (n < 0 && zmq_errno() != EINTR) {
            log_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            w->exit_code = WCTL_EXIT_SOFTWARE;
            break;
        }
        if (n > 0 && it[0].revents)
            wctl_read_signals(w);
        if (n > 0 && it[1].revents)
            wctl_read_exec(w);
        if (n > 0 && n_items > 2 && it[2].revents)
            w->dealer ? wctl_read_dealer(w) : wctl_read_retired(w);
        if (n > 0 && w->dealer && w->mon && it[3].revents)
            wctl_read_monitor(w);
        if (!w->done)
            wctl_timers(w);
    }
}

int wctl_run(const wctl_options *opt)
{
    wctl w = {.opt = opt,
              .sigfd = -1,
              .max_msg = EP_MAX_DATA_MSG,
              .heartbeat_ms = WCTL_DEFAULT_HEARTBEAT_MS,
              .liveness = WCTL_DEFAULT_LIVENESS,
              .backoff_ms = WCTL_BACKOFF_INIT_MS,
              .exit_code = WCTL_EXIT_OK};
    ep_err err = {0};
    if (wctl_signals(&w, &err) != 0)
        goto fail_signals;
    w.zctx = zmq_ctx_new();
    if (w.zctx == NULL) {
        ep_err_set(&err, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail_ctx;
    }
    /* two I/O threads: the data plane's sends and receives overlap (bench_a2a: about twice the
     * throughput of one at 64 tokens per rank, docs/performance.md) */
    zmq_ctx_set(w.zctx, ZMQ_IO_THREADS, WCTL_IO_THREADS);
    /* The device first: a worker that cannot serve its device says why and exits 78 at once
     * (retrying cannot make a GPU appear). */
    mb_options bo = {
        .device = opt->device, .threads = opt->threads, .impl = opt->impl, .cuda = opt->cuda};
    mb_backend *be = mb_create(&bo, &err);
    if (be == NULL) {
        log_error("cannot serve device %s: %s", opt->device, err.msg);
        zmq_ctx_term(w.zctx);
        close(w.sigfd);
        return WCTL_EXIT_CONFIG;
    }
    mb_device(be, &w.dev);
    snprintf(w.backend, sizeof w.backend, "%s", mb_name(be));
    /* A routing id of its own per connection, NAME/random/N: the random part names this
     * process, so the coordinator takes a reconnect of this process (after it was silent) for
     * the same worker even while the old connection is still open there, and refuses a second
     * process under the same name (an operator's mistake) with ERR_DUPLICATE. Two connections
     * never share a routing id: the coordinator's ROUTER has no ROUTER_HANDOVER (libzmq 4.3
     * can abort in a handover). The name part is cut to fit ZeroMQ's 255 bytes; the name
     * that counts is REGISTER's. */
    struct timespec ts = clk_wall();
    snprintf(w.ident, sizeof w.ident, "%.63s/%08x", opt->name,
             (unsigned)((uint32_t)getpid() * 2654435761u ^ (uint32_t)ts.tv_nsec));
    /* before any CURVE server socket exists: libzmq admits everyone while no handler is bound */
    if (opt->key && (w.zap = auth_zap_start(w.zctx, &err)) == NULL) {
        mb_destroy(&be);
        goto fail_exec;
    }
    w.exec = exec_start(w.zctx, &be, opt->key, &err);
    if (w.exec == NULL)
        goto fail_exec;
    /* metrics are best effort: a worker serves without them */
    w.mx = wmx_create(opt->metrics_per_layer, &err);
    wmx_session(w.mx, opt->name, -1, opt->device, 0);
    if (w.mx == NULL || exec_send_metrics(w.exec, w.mx, &err) != 0)
        log_error("metrics: %s", err.msg);
    if (w.zap != NULL && w.mx != NULL) {
        wmx_handshakes(w.mx);
        auth_zap_on_refusal(w.zap, wmx_handshake_refused, w.mx);
    }
    if (wctl_connect(&w, &err) != 0)
        goto fail_connect;
    uint64_t wd = sdn_watchdog_usec();
    w.watchdog_ms = (int64_t)(wd / 2000);
    w.next_watchdog = clk_mono_ms();
    log_info("worker %s (%s: %s, %s) registering with %s", opt->name, opt->device, w.dev.name,
             w.backend, opt->coordinator);
    wctl_loop(&w);
    sdn_notify("STOPPING=1");
    exec_stop(&w.exec);
    if (w.zap != NULL)
        auth_zap_on_refusal(w.zap, NULL, NULL); /* the handler outlives the metrics */
    wmx_destroy(&w.mx);                         /* after the executor: it updates them */
    if (w.dealer)
        wctl_close_dealer_with(&w, w.dealer);
    wctl_stop_retired_monitor(&w);
    if (w.retired)
        zmq_close(w.retired);
    if (w.lingering)
        zmq_close(w.lingering);
    auth_zap_stop(&w.zap);
    zmq_ctx_term(w.zctx);
    close(w.sigfd);
    return w.exit_code;

fail_connect:
    exec_stop(&w.exec);
    if (w.zap != NULL)
        auth_zap_on_refusal(w.zap, NULL, NULL);
    wmx_destroy(&w.mx);
fail_exec:
    auth_zap_stop(&w.zap);
    zmq_ctx_term(w.zctx);
fail_ctx:
    close(w.sigfd);
fail_signals:
    log_error("cannot start: %s", err.msg);
    return WCTL_EXIT_SOFTWARE;
}
