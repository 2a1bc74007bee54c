/*
 * coord_create.c — creating the coordinator daemon (signals, session, placement, modules, keys,
 * the checkpoint's fingerprint, both sockets) and destroying it (see coord.h).
 */
#include "coordinator/coord.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/limits.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/safetensors_model.h"
#include "common/sdnotify.h"
#include "coordinator/coord_state.h"
#include "coordinator/coord_peer.h"

/* Admin messages libzmq may queue per connection before the loop reads them (ZMQ_RCVHWM; the
 * default is 1000): a client sending faster than the loop reads waits in TCP instead of in the
 * coordinator's memory, whatever the loop is busy with. A client has one request in flight
 * (epmoectl) or a few; the forward queue itself holds EP_MAX_QUEUED_STEPS. */
#define COORD_ADMIN_RCVHWM 8

/* Bind a ROUTER. No ROUTER_HANDOVER: with it, a peer that connects under a routing id already
 * in use makes libzmq 4.3 abort (stream_engine_base.cpp, !_io_error) — one stranger connecting
 * twice under one id stopped the cluster. Without it a second connection under a used id is
 * never routed to (libzmq ignores it), and workers need no handover: each connection has a
 * routing id of its own (NAME/random/N), and the registry knows a reconnect of the same process
 * by the NAME/random part (registry.h). MAXMSGSIZE is max_msg, the largest frame a peer of the
 * socket may legitimately send (workers: the model's largest, a [EP_MAX_TOKENS, H] bf16 payload;
 * operators: coord_admin_max_frame), so a peer cannot make the daemon buffer more per frame; with
 * security the socket is a CURVE server whose ZAP domain names its allow-list.
 * No ZMQ_HEARTBEAT_IVL either: libzmq 4.3.4 (up to its master) stops reading a connection whose
 * queue is at RCVHWM, marks it failed without closing it when the peer resets it, and its
 * heartbeat timer then writes to it: "Assertion failed: !_io_error (stream_engine_base.cpp:331)"
 * (timer_event -> out_event), 1,000 clients going away with questions queued stopped the
 * coordinator. Peers' PINGs are still answered, and a worker's carry a TTL (worker/control.c)
 * after which libzmq closes its silent connection as before; any other dead peer's connection
 * is found by TCP keepalive (probes after heartbeat x liveness idle, liveness of them a
 * heartbeat apart, whole seconds), which fails it through the poller, not the timer. */
static int coord_bind(coord *c, void *sock, const char *ep, spec_pos pos, const char *key,
                      const char *domain, int64_t max_msg, ep_err *err)
{
    int one = 1;
    int intvl = (c->spec->heartbeat_ms + 999) / 1000; /* seconds, TCP's unit */
    int idle = intvl * c->spec->liveness, cnt = c->spec->liveness;
    if (wire_socket_defaults(sock, max_msg, err) != 0 ||
        (c->spec->secure && auth_server(sock, &c->keys.coordinator, domain, err) != 0) ||
        zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE_IDLE, &idle, sizeof idle) != 0 ||
        zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE_INTVL, &intvl, sizeof intvl) != 0 ||
        zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE_CNT, &cnt, sizeof cnt) != 0) {
        if (err->msg[0] == '\0')
            ep_err_set(err, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
        return ep_err_prefix(err, "%s:%d:%d: %s", c->spec->file, pos.line, pos.col, key);
    }
    if (zmq_bind(sock, ep) != 0)
        return ep_err_set(err, "%s:%d:%d: %s: cannot bind %s: %s", c->spec->file, pos.line, pos.col,
                          key, ep, zmq_strerror(zmq_errno()));
    return 0;
}

/* The admin socket's MAXMSGSIZE: the largest frame of a legal request. On data_plane zmq no
 * admin request carries a payload (FORWARD is refused: clients submit to the workers), so a
 * frame is at most a body; libzmq then drops a peer that announces a larger frame before it
 * buffers a byte of it. On nccl a FORWARD's hidden payload is the model's largest frame. */
static int64_t coord_admin_max_frame(const coord *c)
{
    return c->nb == NULL ? (int64_t)EP_MAX_CTRL_MSG : mmsg_max_frame(&c->cfg);
}

static int coord_signals(coord *c, ep_err *err)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP); /* reload the cluster spec */
    /* Blocked before the ZeroMQ context exists, so its I/O threads inherit the mask and the
     * signals only ever arrive through the signalfd. */
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
        return ep_err_errno(err, "sigprocmask");
    c->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (c->sigfd < 0)
        return ep_err_errno(err, "signalfd");
    return 0;
}

/* A session id no earlier run of any coordinator is likely to have had: data-plane messages
 * of a previous run can never pass for this one's. */
static int coord_random_session(uint64_t *out, ep_err *err)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        return ep_err_errno(err, "getrandom (the session id)");
    *out = v;
    return 0;
}

/* The wall clock in units of 1/per s: where this run's epochs (per = 1000) and step ids
 * (per = 1000000) start, so that they keep increasing across restarts of the coordinator
 * (a run would need more than one epoch a millisecond, or one step a microsecond, on average
 * to reach the next run's start). */
static uint64_t coord_first_id(uint64_t per)
{
    struct timespec t = clk_wall();
    return (uint64_t)t.tv_sec * per + (uint64_t)t.tv_nsec / (1000000000u / per);
}

/* security: the keys, and the ZAP handler with both allow-lists, before any socket binds. */
static int coord_security(coord *c, ep_err *err)
{
    if (!c->spec->secure)
        return 0;
    if (keys_load(c->spec, &c->keys, err) != 0 || (c->zap = auth_zap_start(c->zctx, err)) == NULL)
        return -1;
    auth_zap_on_refusal(c->zap, cmx_handshake_refused, c->mx); /* zap stops before mx goes */
    auth_list *w = keys_worker_list(c->spec, &c->keys, err);
    if (w == NULL || auth_zap_allow(c->zap, AUTH_DOMAIN_WORKERS, w, err) != 0)
        return -1;
    auth_list *o = keys_operator_list(&c->keys, err);
    if (o == NULL || auth_zap_allow(c->zap, AUTH_DOMAIN_OPERATORS, o, err) != 0)
        return -1;
    log_info("security: CURVE on both sockets; %d worker keys, %d operator keys", c->keys.n_workers,
             auth_list_count(c->keys.operators));
    return 0;
}

/* The checkpoint's fingerprint, broadcast in WELCOME: a worker whose files differ refuses to
 * load. A model directory with no safetensors at all (a config-only directory) has none. */
static int coord_fingerprint(coord *c, ep_err *err)
{
    st_model *m = st_model_open(c->spec->model_path, err);
    if (m == NULL) {
        if (st_model_has_files(c->spec->model_path))
            return ep_err_prefix(err, "%s:%d:%d: model.path: the checkpoint cannot be read",
                                 c->spec->file, c->spec->model_pos.line, c->spec->model_pos.col);
        log_warn("model %s holds no safetensors files: the workers' checkpoint is not checked "
                 "against a fingerprint",
                 c->spec->model_path);
        ep_err_clear(err);
        return 0;
    }
    int n = st_model_nfiles(m);
    c->ckpt = calloc((size_t)n, sizeof *c->ckpt);
    c->ckpt_ps = calloc((size_t)n, sizeof *c->ckpt_ps);
    st_file_print *p = calloc((size_t)n, sizeof *p);
    int rc = c->ckpt && c->ckpt_ps && p ? 0 : ep_err_set(err, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        st_model_print(m, i, &p[i]);
        Epmoe__CheckpointFile *f = &c->ckpt[i];
        epmoe__checkpoint_file__init(f);
        f->name = strdup(p[i].name);
        f->has_size = f->has_mtime_ns = f->has_header_hash = 1;
        f->size = p[i].size;
        f->mtime_ns = p[i].mtime_ns;
        f->header_hash = p[i].header_hash;
        c->ckpt_ps[i] = f;
        c->n_ckpt = (size_t)i + 1;
        if (f->name == NULL)
            rc = ep_err_set(err, "out of memory");
    }
    free(p);
    st_model_close(&m);
    return rc;
}

coord *coord_create(spec_cluster **spec_p, const mc_config *cfg, ep_err *err)
{
    ep_err_clear(err);
    coord *c = calloc(1, sizeof *c);
    if (c == NULL) {
        spec_free(spec_p);
        ep_err_set(err, "out of memory");
        return NULL;
    }
    c->spec = *spec_p;
    *spec_p = NULL;
    const spec_cluster *spec = c->spec;
    c->cfg = *cfg;
    c->config_hash = mc_hash(cfg);
    c->sigfd = -1;
    c->state = COORD_FORMING;
    if (coord_signals(c, err) != 0 || coord_random_session(&c->session, err) != 0)
        goto fail;
    plan_table *base = plan_for_spec(spec, cfg, coord_first_id(1000), err);
    if (base == NULL)
        goto fail;
    c->pe = plan_epochs_create(base, spec->rejoin, spec->max_experts_per_worker, false, err);
    plan_free(&base);
    if (c->pe == NULL)
        goto fail;
    c->reg = reg_create(spec, err);
    if (c->reg == NULL)
        goto fail;
    c->seq = seq_create(spec->n_workers, coord_first_id(1000000), EP_MAX_QUEUED_BYTES, err);
    if (c->seq == NULL)
        goto fail;
    c->stats = stats_create(mc_num_layers(cfg), cfg->n_routed_experts, spec->n_workers,
                            spec->window_steps, err);
    if (c->stats == NULL)
        goto fail;
    c->mx = cmx_create(spec, cfg, err); /* after coord_signals: its thread keeps them blocked */
    if (c->mx == NULL)
        goto fail;
    cmx_state(c->mx, coord_state_name(c->state));
    if (spec->data_plane == SPEC_PLANE_NCCL && (c->nb = nb_create(spec->n_workers, err)) == NULL)
        goto fail;
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        ep_err_set(err, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    c->wsock = zmq_socket(c->zctx, ZMQ_ROUTER);
    c->asock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (c->wsock == NULL || c->asock == NULL) {
        ep_err_set(err, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (coord_security(c, err) != 0 || coord_fingerprint(c, err) != 0)
        goto fail;
    int hwm = COORD_ADMIN_RCVHWM;
    if (zmq_setsockopt(c->asock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0) {
        ep_err_set(err, "zmq_setsockopt(RCVHWM): %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (coord_bind(c, c->wsock, spec->listen, spec->listen_pos, "coordinator.listen",
                   AUTH_DOMAIN_WORKERS, mmsg_max_frame(cfg), err) != 0 ||
        coord_bind(c, c->asock, spec->admin, spec->admin_pos, "coordinator.admin",
                   AUTH_DOMAIN_OPERATORS, coord_admin_max_frame(c), err) != 0)
        goto fail;
    c->now_ms = clk_mono_ms();
    c->next_heartbeat_ms = c->now_ms + spec->heartbeat_ms;
    c->next_liveness_ms = c->now_ms + coord_liveness_ms(c);
    c->watchdog_ms = sdn_watchdog_usec() / 2000;
    c->next_watchdog_ms = c->now_ms;
    return c;
fail:
    coord_destroy(&c);
    return NULL;
}

void coord_destroy(coord **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    coord *c = *self_p;
    /* the sequencer's requests and the outbox hold frames; free them before the context goes */
    seq_destroy(&c->seq);
    ob_free(&c->out);
    if (c->wsock)
        zmq_close(c->wsock);
    if (c->asock)
        zmq_close(c->asock);
    auth_zap_stop(&c->zap); /* its REP socket goes before the context */
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    keys_free(&c->keys);
    keys_free(&c->rl_keys);
    for (size_t i = 0; i < c->n_ckpt; i++)
        free(c->ckpt[i].name);
    free(c->ckpt);
    free(c->ckpt_ps);
    reg_destroy(&c->reg);
    nb_destroy(&c->nb);
    plan_epochs_destroy(&c->pe);
    rl_free(&c->reload);
    cmx_destroy(&c->mx);
    stats_destroy(&c->stats);
    coord_peer_free(c);
    spec_free(&c->spec);
    if (c->sigfd >= 0)
        close(c->sigfd);
    free(c);
    *self_p = NULL;
}
