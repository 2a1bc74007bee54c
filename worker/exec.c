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

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/safetensors.h"
#include "common/wire.h"
#include "kernels/formats.h"
#include "worker/serve.h"
#include "worker/shard.h"
#include "worker/step_nccl.h"
#include "worker/wmetrics.h"

/* LOADING messages per second at most. */
#define EXEC_PROGRESS_INTERVAL_S 0.1
/* Pipe messages put aside while a step waits (a LOAD or SESSION the main loop must see next). */
#define EXEC_MAX_STASH 8

struct exec_actor {
    void *zctx;
    void *pipe;        /* the caller's end */
    void *thread_pipe; /* the thread's end, handed over at pthread_create */
    char endpoint[64];
    pthread_t thread;
    bool started;
    mb_backend *be;    /* handed to the thread */
    atomic_int cancel; /* RESET and TERM commands sent and not yet handled */
    bool secure;
    auth_keypair key; /* with security */
};

/* What a load keeps and reads: (layer, expert) slots the rank holds, the most in one layer, and
 * of those the ones the old layers already held. */
typedef struct exec_slots {
    int max_per_layer, slots, kept;
} exec_slots;

typedef struct exec_state {
    exec_actor *actor;
    void *pipe; /* the thread's end */
    mb_backend *be;
    exec_session *session;
    mb_layer **layers; /* stay across sessions while the model and config do (shard_*) */
    int n_layers;
    uint64_t shard_hash;           /* the config the layers were loaded for */
    char shard_model[EP_MAX_PATH]; /* and the checkpoint */
    uint64_t shard_files;          /* exec_files_hash of the files they were read from */
    tp_transport *tp;              /* data_plane zmq */
    /* what tp was built for: a later session or epoch with the same world reuses it */
    int tp_rank, tp_world, tp_hidden, tp_experts;
    char tp_bind[EP_MAX_PATH];
    char **tp_peers;  /* [tp_world] */
    tp_comm *comm;    /* data_plane nccl: kept across the epochs of one session */
    sn_driver *sn;    /* for the communicator of the last COMM_INIT */
    int cuda_ordinal; /* N of cuda:N, for the communicator (tp_nccl_ops' ctx) */
    bool ready;
    bool have_last;
    uint64_t last_step;
    bool stop;
    wire_msg stash[EXEC_MAX_STASH];
    int n_stash;
    /* a staged epoch (a rebalance): its session and layers, loaded beside the serving ones */
    exec_session *staged;
    mb_layer **staged_layers; /* [n_layers] */
    exec_slots staged_cost;   /* what preparing it read: its commit reports it */
    uint64_t staged_bytes;
    uint64_t staged_files; /* exec_files_hash of the files it was read from */
    double staged_load_s;
    /* the open step: STEP_DONE sent, its peers' DISPATCHes still served (sparse all-to-all) */
    struct exec_step_s *open;
    struct wmx *mx; /* the worker's metrics (thread-safe), or NULL */
    /* the serving path: the client endpoint and the requests of this worker's clients (made
     * at the first READY, kept for the thread's life), and when load was last reported */
    srv_server *srv;
    double reported_at;
} exec_state;

/* What the serving path may use now (serve.h). */
static srv_env exec_env(const exec_state *st)
{
    return (srv_env){.be = st->be,
                     .layers = st->layers,
                     .n_layers = st->n_layers,
                     .session = st->session,
                     .tp = st->tp,
                     .mx = st->mx,
                     .ready = st->ready && st->session != NULL && !st->session->nccl};
}

static double exec_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- sessions ---------------------------------------------------------------------------------
 */

exec_session *exec_session_new(int n_experts, int world_size)
{
    exec_session *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->world_size = world_size;
    s->expert_owner = calloc((size_t)n_experts, sizeof *s->expert_owner);
    s->peer_endpoint = calloc((size_t)world_size, sizeof *s->peer_endpoint);
    s->peer_name = calloc((size_t)world_size, sizeof *s->peer_name);
    s->member = calloc((size_t)world_size, 1);
    if (s->expert_owner == NULL || s->peer_endpoint == NULL || s->peer_name == NULL ||
        s->member == NULL)
        exec_session_free(&s);
    return s;
}

void exec_session_free(exec_session **self_p)
{
    exec_session *s = *self_p;
    if (s == NULL)
        return;
    for (int r = 0; r < s->world_size; r++) {
        if (s->peer_endpoint)
            free(s->peer_endpoint[r]);
        if (s->peer_name)
            free(s->peer_name[r]);
    }
    free(s->peer_endpoint);
    free(s->peer_name);
    free(s->expert_owner);
    free(s->peer_key);
    free(s->checkpoint);
    free(s->member);
    pl_free(&s->place);
    free(s);
    *self_p = NULL;
}

/* A copy of s (its peers and config) for a staged epoch; NULL when out of memory. */
static exec_session *exec_session_dup(const exec_session *s)
{
    exec_session *c = exec_session_new(s->config.n_routed_experts, s->world_size);
    if (c == NULL)
        return NULL;
    uint32_t *owner = c->expert_owner;
    uint8_t *member = c->member;
    char **pe = c->peer_endpoint, **pn = c->peer_name;
    *c = *s;
    c->expert_owner = owner;
    c->member = member;
    c->peer_endpoint = pe;
    c->peer_name = pn;
    c->place = s->place ? pl_copy(s->place) : NULL;
    memcpy(owner, s->expert_owner, (size_t)s->config.n_routed_experts * sizeof *owner);
    memcpy(member, s->member, (size_t)s->world_size);
    bool ok = s->place == NULL || c->place != NULL;
    /* the keys and the fingerprint are the copy's own (each session frees its arrays) */
    c->peer_key = NULL;
    c->checkpoint = NULL;
    if (ok && s->peer_key) {
        size_t n = (size_t)s->world_size * sizeof *s->peer_key;
        ok = (c->peer_key = malloc(n)) != NULL;
        if (ok)
            memcpy(c->peer_key, s->peer_key, n);
    }
    if (ok && s->n_checkpoint > 0) {
        size_t n = (size_t)s->n_checkpoint * sizeof *s->checkpoint;
        ok = (c->checkpoint = malloc(n)) != NULL;
        if (ok)
            memcpy(c->checkpoint, s->checkpoint, n);
    }
    for (int r = 0; r < s->world_size && ok; r++) {
        pe[r] = s->peer_endpoint[r] ? strdup(s->peer_endpoint[r]) : NULL;
        pn[r] = s->peer_name[r] ? strdup(s->peer_name[r]) : NULL;
        ok = (pe[r] || !s->peer_endpoint[r]) && (pn[r] || !s->peer_name[r]);
    }
    if (!ok)
        exec_session_free(&c);
    return c;
}

pl_table *exec_parse_placement(const exec_session *s, bool has_epoch, const uint32_t *owner,
                               size_t n_owner, const Epmoe__Placement *pm, const uint32_t *members,
                               size_t n_members, ep_err *err)
{
    if (!has_epoch) {
        ep_err_set(err, "epoch missing");
        return NULL;
    }
    pl_table *t = mmsg_placement_in(mc_num_layers(&s->config), s->config.n_routed_experts,
                                    s->world_size, owner, n_owner, pm, err);
    if (t == NULL)
        return NULL;
    if (n_members > (size_t)s->world_size) {
        ep_err_set(err, "%zu members, more than world_size %d", n_members, s->world_size);
        goto fail;
    }
    for (size_t i = 0; i < n_members; i++)
        if (members[i] >= (uint32_t)s->world_size || (i > 0 && members[i] <= members[i - 1])) {
            ep_err_set(err, "members[%zu] = %u: expected ascending ranks < world_size %d", i,
                       members[i], s->world_size);
            goto fail;
        }
    /* every holder must be a member: the others never get a STEP and would never answer */
    if (n_members > 0) {
        uint8_t *holds = malloc((size_t)s->world_size);
        if (holds == NULL) {
            ep_err_set(err, "out of memory");
            goto fail;
        }
        pl_members(t, holds);
        for (size_t i = 0; i < n_members; i++)
            holds[members[i]] = 0;
        for (int r = 0; r < s->world_size; r++)
            if (holds[r]) {
                free(holds);
                ep_err_set(err, "rank %d holds experts but is not a member", r);
                goto fail;
            }
        free(holds);
    }
    return t;
fail:
    pl_free(&t);
    return NULL;
}

void exec_adopt_placement(exec_session *s, pl_table **pl_p, const uint32_t *members,
                          size_t n_members)
{
    pl_free(&s->place);
    s->place = *pl_p;
    *pl_p = NULL;
    int E = s->config.n_routed_experts;
    if (!pl_flat_owner(s->place, s->expert_owner))
        for (int e = 0; e < E; e++) { /* NCCL's view: the first replica of layer 0 */
            int n;
            s->expert_owner[e] = pl_replicas(s->place, 0, e, &n)[0];
        }
    memset(s->member, n_members == 0, (size_t)s->world_size);
    for (size_t i = 0; i < n_members; i++)
        s->member[members[i]] = 1;
    s->n_members = n_members == 0 ? s->world_size : (int)n_members;
}

int exec_check_placement(const exec_session *s, bool has_epoch, const uint32_t *owner,
                         size_t n_owner, const uint32_t *members, size_t n_members, ep_err *err)
{
    pl_table *t = exec_parse_placement(s, has_epoch, owner, n_owner, NULL, members, n_members, err);
    int rc = t ? 0 : -1;
    pl_free(&t);
    return rc;
}

void exec_set_placement(exec_session *s, const uint32_t *owner, const uint32_t *members,
                        size_t n_members)
{
    pl_table *t =
        pl_flat(mc_num_layers(&s->config), s->config.n_routed_experts, s->world_size, owner, NULL);
    if (t != NULL)
        exec_adopt_placement(s, &t, members, n_members);
}

const char *exec_backend_name(const exec_actor *a)
{
    return mb_name(a->be);
}

/* ---- replies ----------------------------------------------------------------------------------
 */

static void exec_send(exec_state *st, uint16_t type, const ProtobufCMessage *body,
                      const wire_payload *pl, int n)
{
    ep_err err;
    if (wire_send(st->pipe, NULL, 0, type, body, pl, n, false, &err) != 0)
        log_error("executor: %s", err.msg);
}

static void exec_error(exec_state *st, Epmoe__ErrorCode code, uint16_t in_reply_to, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));

static void exec_error(exec_state *st, Epmoe__ErrorCode code, uint16_t in_reply_to, const char *fmt,
                       ...)
{
    char text[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    Epmoe__Error e = EPMOE__ERROR__INIT;
    e.has_code = e.has_in_reply_to = 1;
    e.code = code;
    e.in_reply_to = in_reply_to;
    e.message = text;
    exec_send(st, EPMOE__MSG_TYPE__MSG_ERROR, &e.base, NULL, 0);
}

static void exec_step_failed(exec_state *st, bool has_id, uint64_t step_id, Epmoe__ErrorCode code,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void exec_step_failed(exec_state *st, bool has_id, uint64_t step_id, Epmoe__ErrorCode code,
                             const char *fmt, ...)
{
    char text[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    log_warn("step %llu failed: %s", (unsigned long long)step_id, text);
    Epmoe__StepFailed f = EPMOE__STEP_FAILED__INIT;
    f.has_step_id = has_id;
    f.step_id = step_id;
    f.has_code = 1;
    f.code = code;
    f.message = text;
    exec_send(st, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &f.base, NULL, 0);
}

/* ---- state ------------------------------------------------------------------------------------
 */

static void exec_free_layers(mb_layer **layers, int n)
{
    for (int i = 0; layers && i < n; i++)
        mb_layer_free(&layers[i]);
    free(layers);
}

static void exec_free_shard(exec_state *st)
{
    exec_free_layers(st->layers, st->n_layers);
    st->layers = NULL;
    st->n_layers = 0;
}

static void exec_drop_staged(exec_state *st)
{
    exec_free_layers(st->staged_layers, st->n_layers);
    st->staged_layers = NULL;
    exec_session_free(&st->staged);
}

static void exec_close_open(exec_state *st);

/* The data plane belongs to one session and epoch; the loaded layers may outlive both. */
static void exec_close_plane(exec_state *st)
{
    exec_close_open(st);
    tp_destroy(&st->tp);
    for (int r = 0; st->tp_peers && r < st->tp_world; r++)
        free(st->tp_peers[r]);
    free(st->tp_peers);
    st->tp_peers = NULL;
    st->ready = false;
    st->have_last = false;
}

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
    tp_comm_destroy(&st->comm);
    exec_session_free(&st->session);
}

/* ---- loading ----------------------------------------------------------------------------------
 */

typedef struct exec_progress {
    exec_state *st;
    const exec_session *s; /* the session being loaded */
    uint64_t total;
    int layers_done, layers_total;
    double start, last; /* when the layers' load began; the last LOADING */
    bool serve;         /* a staged load: serve steps between layers */
    int served_at;      /* the layer boundary steps were last served at */
} exec_progress;

static void exec_send_loading(exec_progress *p, uint64_t done)
{
    Epmoe__Loading m = EPMOE__LOADING__INIT;
    m.has_epoch = m.has_bytes_done = m.has_bytes_total = 1;
    m.has_layers_done = m.has_layers_total = 1;
    m.epoch = p->s->epoch;
    m.bytes_done = done;
    m.bytes_total = p->total;
    m.layers_done = (uint32_t)p->layers_done;
    m.layers_total = (uint32_t)p->layers_total;
    m.has_elapsed_ms = 1; /* bytes_done / elapsed_ms: the load's rate in status / workers */
    m.elapsed_ms = (uint32_t)((exec_now() - p->start) * 1000.0);
    exec_send(p->st, EPMOE__MSG_TYPE__MSG_LOADING, &m.base, NULL, 0);
    p->last = exec_now();
}

static bool exec_serve_between_layers(exec_progress *p);
static void exec_serve(exec_state *st, bool client_readable);

/* shard_load's progress: LOADING at most every EXEC_PROGRESS_INTERVAL_S, and a stop request
 * while a RESET or TERM is pending. A staged load serves steps at each layer boundary: shard_load
 * reports a new layers_done before it starts that layer, when no backend call is under way. */
static int exec_on_progress(void *ctx, uint64_t done, uint64_t total, int layers_done,
                            int layers_total)
{
    exec_progress *p = ctx;
    bool boundary = layers_done != p->served_at;
    p->total = total;
    p->layers_done = layers_done;
    p->layers_total = layers_total;
    wmx_load_progress(p->st->mx, done, total);
    if (!p->serve &&
        (p->last == 0 || exec_now() - p->last >= EXEC_PROGRESS_INTERVAL_S || done == total))
        exec_send_loading(p, done); /* a staged load says nothing until it is prepared */
    if (p->serve && boundary) {
        p->served_at = layers_done;
        if (!exec_serve_between_layers(p))
            return 1;
    }
    return atomic_load(&p->st->actor->cancel) > 0;
}

static int exec_nccl_open(exec_state *st, ep_err *err);

/* Whether the open data plane serves the session's world (rank, peers, endpoints, shapes), in
 * the same coordinator session, and its epoch is newer: then only the placement changes
 * (tp_set_placement). A plane is never reused for another session (a restarted coordinator), so
 * its messages carry the session it was built for. */
static bool exec_plane_fits(const exec_state *st)
{
    const exec_session *s = st->session;
    if (st->tp == NULL || st->tp_peers == NULL || s->rank != st->tp_rank ||
        s->world_size != st->tp_world || s->config.hidden_size != st->tp_hidden ||
        s->config.n_routed_experts != st->tp_experts || s->epoch <= tp_epoch(st->tp) ||
        s->session != tp_session(st->tp) || strcmp(s->data_endpoint, st->tp_bind) != 0)
        return false;
    for (int r = 0; r < s->world_size; r++)
        if (r != s->rank && strcmp(s->peer_endpoint[r], st->tp_peers[r]) != 0)
            return false;
    return true;
}

/* Remember what the plane was built for (exec_plane_fits). */
static int exec_plane_key(exec_state *st, ep_err *err)
{
    const exec_session *s = st->session;
    st->tp_rank = s->rank;
    st->tp_world = s->world_size;
    st->tp_hidden = s->config.hidden_size;
    st->tp_experts = s->config.n_routed_experts;
    snprintf(st->tp_bind, sizeof st->tp_bind, "%s", s->data_endpoint);
    st->tp_peers = calloc((size_t)s->world_size, sizeof *st->tp_peers);
    for (int r = 0; st->tp_peers && r < s->world_size; r++)
        if ((st->tp_peers[r] = strdup(s->peer_endpoint[r])) == NULL)
            return ep_err_set(err, "out of memory");
    return st->tp_peers ? 0 : ep_err_set(err, "out of memory");
}

/* [E]: 1 where rank holds expert e in some layer (the data plane's check; the executor checks
 * the step's layer). */
static uint8_t *exec_owned_any(const exec_session *s)
{
    int E = s->config.n_routed_experts, L = mc_num_layers(&s->config);
    uint8_t *o = calloc((size_t)E, 1);
    for (int l = 0; o != NULL && l < L; l++)
        for (int e = 0; e < E; e++)
            o[e] |= pl_holds(s->place, l, e, s->rank);
    return o;
}

/* The data plane of the session's epoch: the open one with the new placement when it fits,
 * else a new one. Rebinding drops whatever the peers had in flight to the old sockets and
 * makes them reconnect; keeping the sockets within a coordinator's epochs avoids both. */
static int exec_open_data_plane(exec_state *st, ep_err *err)
{
    exec_session *s = st->session;
    if (s->nccl) {
        exec_close_plane(st);
        return exec_nccl_open(st, err);
    }
    uint8_t *owned = exec_owned_any(s);
    if (owned == NULL)
        return ep_err_set(err, "out of memory");
    if (exec_plane_fits(st)) {
        int rc = tp_set_placement_owned(st->tp, s->epoch, owned, err);
        free(owned);
        return rc;
    }
    exec_close_plane(st);
    tp_config cfg = {.rank = s->rank,
                     .world_size = s->world_size,
                     .session = s->session,
                     .epoch = s->epoch,
                     .hidden = s->config.hidden_size,
                     .n_experts = s->config.n_routed_experts,
                     .topk = s->config.num_experts_per_tok,
                     .expert_owner = s->expert_owner,
                     .owned = owned,
                     .bind_endpoint = s->data_endpoint};
    if (st->actor->secure && s->peer_key == NULL) {
        free(owned);
        return ep_err_set(err, "this worker has a key (--key) but WELCOME gave no peer keys");
    }
    if (st->actor->secure) {
        cfg.key = &st->actor->key;
        cfg.peer_key = (const uint8_t(*)[AUTH_KEY_BYTES])s->peer_key;
        cfg.peer_name = (const char *const *)s->peer_name;
    }
    st->tp = tp_create(st->actor->zctx, &cfg, err);
    free(owned);
    if (st->tp == NULL || exec_plane_key(st, err) != 0)
        return -1;
    return tp_connect(st->tp, (const char *const *)s->peer_endpoint, err);
}

/* The identity of the checkpoint files m opened (names, sizes, modification times, header
 * hashes): loaded experts are kept for a new session only when the files are still these, so a
 * checkpoint regenerated under the same path and config is never mixed with the old one. */
static uint64_t exec_files_hash(const st_model *m)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (int i = 0; i < st_model_nfiles(m); i++) {
        st_file_print f;
        st_model_print(m, i, &f);
        uint64_t v[3] = {f.size, (uint64_t)f.mtime_ns, f.header_hash};
        const unsigned char *b[2] = {(const unsigned char *)f.name, (const unsigned char *)v};
        size_t n[2] = {strlen(f.name) + 1, sizeof v};
        for (int k = 0; k < 2; k++)
            for (size_t j = 0; j < n[k]; j++) {
                h ^= b[k][j];
                h *= 0x100000001b3ull;
            }
    }
    return h;
}

static exec_slots exec_count_slots(const exec_session *s, mb_layer *const *old, int n_old)
{
    int E = s->config.n_routed_experts, L = mc_num_layers(&s->config);
    exec_slots c = {0};
    for (int l = 0; l < L; l++) {
        int n = 0;
        for (int e = 0; e < E; e++) {
            if (!pl_holds(s->place, l, e, s->rank))
                continue;
            n++;
            c.kept += l < n_old && old[l] && mb_layer_owns(old[l], e);
        }
        c.slots += n;
        c.max_per_layer = n > c.max_per_layer ? n : c.max_per_layer;
    }
    return c;
}

/* Load every layer of session s into out[L] (the experts the rank holds in each layer), reusing
 * what old[n_old] holds (old stays usable); 1 when cancelled or abandoned, -1 on error. */
static int exec_load_into(exec_state *st, const exec_session *s, mb_layer **old, int n_old,
                          mb_layer **out, exec_progress *p, exec_slots *cost, uint64_t *files,
                          ep_err *err)
{
    const mc_config *c = &s->config;
    int E = c->n_routed_experts, L = mc_num_layers(c);
    uint8_t *want = calloc((size_t)L * (size_t)E, 1);
    st_model *m = NULL;
    int rc = -1;
    if (want == NULL) {
        ep_err_set(err, "out of memory");
        goto done;
    }
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++)
            want[(size_t)l * E + e] = pl_holds(s->place, l, e, s->rank);
    if ((m = st_model_open(s->model_path, err)) == NULL)
        goto done;
    /* the files opened are the files loaded: compare those with the coordinator's */
    if (s->n_checkpoint > 0 && st_model_check_prints(m, s->checkpoint, s->n_checkpoint, err) != 0)
        goto done;
    *files = exec_files_hash(m);
    if (n_old > 0 && *files != st->shard_files) {
        log_info("the checkpoint's files changed since the loaded experts were read: reading "
                 "every expert again");
        old = NULL;
        n_old = 0;
        *cost = exec_count_slots(s, NULL, 0);
    }
    p->start = exec_now();
    rc = mb_set_gemm(st->be, s->gpu_gemm, err);
    if (rc == 0)
        rc = shard_load(st->be, m, c, want, n_old == L ? old : NULL, EP_MAX_TOKENS, out,
                        exec_on_progress, p, err);
done:
    st_model_close(&m);
    free(want);
    return rc;
}

static double exec_gbps(uint64_t bytes, double s)
{
    return s > 0 ? (double)bytes / s / 1e9 : 0.0;
}

static uint64_t exec_layer_bytes(mb_layer *const *layers, int n)
{
    uint64_t bytes = 0;
    for (int l = 0; l < n; l++)
        bytes += mb_layer_bytes(layers[l]);
    return bytes;
}

/* The client endpoint, once the worker first serves an epoch (the serving path; with
 * security a CURVE server with the worker's key, admitting WELCOME.client_keys). A failure to
 * bind is logged and the worker serves steps without it. */
static void exec_open_client(exec_state *st)
{
    const exec_session *s = st->session;
    if (st->srv == NULL && !s->nccl) {
        char ep[EP_MAX_PATH];
        if (s->client_endpoint[0])
            snprintf(ep, sizeof ep, "%s", s->client_endpoint);
        else
            srv_default_endpoint(s->data_endpoint, ep, sizeof ep);
        ep_err err = {{0}};
        st->srv = srv_create(st->actor->zctx, ep, st->actor->secure ? &st->actor->key : NULL, &err);
        if (st->srv == NULL)
            log_error("no client endpoint (the serving path is off): %s", err.msg);
        else
            log_info("client endpoint %s", srv_endpoint(st->srv));
    }
    if (st->srv) {
        srv_env env = exec_env(st);
        srv_epoch_end(st->srv, &env);
    }
}

/* READY for session s with its layers: n_experts is the most it holds in one layer. */
static void exec_send_ready(exec_state *st, const exec_session *s, mb_layer *const *layers,
                            uint64_t bytes_read, exec_slots c, bool staged, double load_s)
{
    Epmoe__Ready r = EPMOE__READY__INIT;
    r.has_epoch = r.has_config_hash = r.has_bytes_loaded = r.has_n_experts = 1;
    r.epoch = s->epoch;
    r.config_hash = s->config_hash;
    r.bytes_loaded = exec_layer_bytes(layers, st->n_layers);
    r.n_experts = (uint32_t)c.max_per_layer;
    r.has_bytes_read = r.has_experts_kept = r.has_load_ms = 1;
    r.bytes_read = bytes_read;
    /* per layer on average: experts_kept predates per-layer placement */
    r.experts_kept = (uint32_t)(st->n_layers > 0 ? c.kept / st->n_layers : 0);
    r.load_ms = (uint32_t)(load_s * 1000.0);
    r.has_n_slots = r.has_slots_kept = 1;
    r.n_slots = (uint32_t)c.slots;
    r.slots_kept = (uint32_t)c.kept;
    r.has_staged = staged;
    r.staged = staged;
    r.backend = (char *)mb_name(st->be);
    r.client_endpoint = st->srv ? (char *)srv_endpoint(st->srv) : NULL;
    if (st->comm != NULL && tp_comm_get_state(st->comm) == TP_COMM_READY) {
        r.has_comm_epoch = r.has_comm_generation = r.has_comm_rank = r.has_comm_size = 1;
        r.comm_epoch = tp_comm_epoch(st->comm);
        r.comm_generation = tp_comm_generation(st->comm);
        r.comm_rank = (uint32_t)tp_comm_rank(st->comm);
        r.comm_size = (uint32_t)tp_comm_size(st->comm);
    }
    exec_send(st, EPMOE__MSG_TYPE__MSG_READY, &r.base, NULL, 0);
}

/* LOAD and EPOCH: the data plane of the session's epoch, then the layers. */
static void exec_load(exec_state *st, uint16_t in_reply_to)
{
    if (st->session == NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, in_reply_to, "%s before WELCOME",
                   wire_type_name(in_reply_to));
        return;
    }
    exec_close_open(st);
    if (st->srv)
        srv_epoch_begin(st->srv); /* the layers and the data plane are about to change */
    st->ready = false;
    st->have_last = false;
    exec_drop_staged(st);
    exec_session *s = st->session;
    if (st->n_layers > 0 &&
        (st->shard_hash != s->config_hash || strcmp(st->shard_model, s->model_path) != 0))
        exec_free_shard(st); /* another model or config: nothing to keep */
    double t0 = exec_now();
    ep_err err = {{0}};
    exec_progress p = {.st = st, .s = s, .served_at = -1};
    int L = mc_num_layers(&s->config);
    exec_slots c = exec_count_slots(s, st->layers, st->n_layers);
    mb_layer **layers = calloc((size_t)L, sizeof *layers);
    uint64_t files = 0;
    int rc = layers ? exec_open_data_plane(st, &err) : ep_err_set(&err, "out of memory");
    if (rc == 0)
        rc = exec_load_into(st, s, st->layers, st->n_layers, layers, &p, &c, &files, &err);
    double load_s = p.start > 0 ? exec_now() - p.start : 0;
    /* the old layers gave their kept experts to the new ones (or the load failed half-way and
     * they may have): either way only the new layers are to be trusted */
    exec_free_shard(st);
    if (rc != 0) {
        free(layers);
        exec_close_plane(st);
        if (rc > 0) {
            log_info("load abandoned (reset or shutdown)");
            return;
        }
        log_error("load failed: %s", err.msg);
        exec_error(st, EPMOE__ERROR_CODE__ERR_LOAD_FAILED, in_reply_to, "%s", err.msg);
        return;
    }
    st->layers = layers;
    st->n_layers = L;
    st->shard_hash = s->config_hash;
    snprintf(st->shard_model, sizeof st->shard_model, "%s", s->model_path);
    st->shard_files = files;
    st->ready = true;
    log_info(
        "epoch %llu: %d layers, %d (layer, expert) slots, at most %d experts a layer (%d "
        "kept, %d read: %llu bytes at %.2f GB/s) from %s in %.2f s; data plane %s (%d members)",
        (unsigned long long)s->epoch, st->n_layers, c.slots, c.max_per_layer, c.kept,
        c.slots - c.kept, (unsigned long long)p.total, exec_gbps(p.total, load_s), s->model_path,
        exec_now() - t0, st->tp ? tp_endpoint(st->tp) : "nccl (built on COMM_INIT)", s->n_members);
    wmx_loaded(st->mx, in_reply_to == EPMOE__MSG_TYPE__MSG_LOAD ? "load" : "epoch", p.total,
               exec_layer_bytes(st->layers, st->n_layers));
    wmx_epoch(st->mx, s->epoch);
    exec_open_client(st);
    exec_send_ready(st, s, st->layers, p.total, c, false, load_s);
}

/* A staged EPOCH (a rebalance): the new epoch's layers are loaded beside the serving ones, which
 * keep serving steps between layers; READY {epoch, staged} when prepared. */
static void exec_stage(exec_state *st, exec_session **s_p)
{
    const uint16_t EPOCH = EPMOE__MSG_TYPE__MSG_EPOCH;
    exec_session *s = *s_p;
    exec_drop_staged(st);
    int L = mc_num_layers(&s->config);
    exec_slots c = exec_count_slots(s, st->layers, st->n_layers);
    mb_layer **layers = calloc((size_t)L, sizeof *layers);
    exec_progress p = {.st = st, .s = s, .serve = true, .served_at = -1};
    ep_err err = {{0}};
    double t0 = exec_now();
    uint64_t files = 0;
    int rc = layers ? exec_load_into(st, s, st->layers, st->n_layers, layers, &p, &c, &files, &err)
                    : ep_err_set(&err, "out of memory");
    /* steps served between layers count in: the rate is a lower bound */
    double load_s = p.start > 0 ? exec_now() - p.start : 0;
    if (rc != 0) {
        free(layers);
        exec_session_free(s_p);
        if (rc > 0) {
            log_info("staged epoch abandoned (a newer command came)");
            return;
        }
        log_error("staged epoch: load failed: %s", err.msg);
        exec_error(st, EPMOE__ERROR_CODE__ERR_LOAD_FAILED, EPOCH, "staged epoch: %s", err.msg);
        return;
    }
    st->staged = s;
    *s_p = NULL;
    st->staged_layers = layers;
    st->staged_cost = c;
    st->staged_files = files;
    st->staged_bytes = p.total;
    st->staged_load_s = load_s;
    log_info("staged epoch %llu prepared in %.2f s: %d slots (%d kept, %d read: %llu bytes), "
             "serving epoch %llu meanwhile",
             (unsigned long long)s->epoch, exec_now() - t0, c.slots, c.kept, c.slots - c.kept,
             (unsigned long long)p.total, (unsigned long long)st->session->epoch);
    wmx_loaded(st->mx, "staged", p.total, exec_layer_bytes(st->layers, st->n_layers));
    exec_send_ready(st, s, layers, p.total, c, true, load_s);
}

/* EPOCH: validate against the session, adopt the placement, load (or stage). */
static void exec_epoch(exec_state *st, const wire_msg *m)
{
    const uint16_t EPOCH = EPMOE__MSG_TYPE__MSG_EPOCH;
    ep_err err;
    Epmoe__Epoch *ep = (Epmoe__Epoch *)wire_unpack(&epmoe__epoch__descriptor, m, &err);
    if (ep == NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_MALFORMED, EPOCH, "%s", err.msg);
        return;
    }
    exec_session *s = st->session;
    bool staged = ep->has_staged && ep->staged;
    pl_table *t = NULL;
    if (s == NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, EPOCH, "EPOCH before WELCOME");
    } else if ((t = exec_parse_placement(s, ep->has_epoch, ep->expert_owner, ep->n_expert_owner,
                                         ep->placement, ep->members, ep->n_members, &err)) ==
               NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, EPOCH, "EPOCH: %s", err.msg);
    } else if (staged && (!st->ready || st->n_layers == 0)) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, EPOCH,
                   "staged EPOCH %llu while not serving an epoch", (unsigned long long)ep->epoch);
    } else if (staged) {
        exec_session *n = exec_session_dup(s);
        if (n == NULL) {
            exec_error(st, EPMOE__ERROR_CODE__ERR_LOAD_FAILED, EPOCH, "out of memory");
        } else {
            n->epoch = ep->epoch;
            exec_adopt_placement(n, &t, ep->members, ep->n_members);
            log_info("staged epoch %llu: %s", (unsigned long long)n->epoch,
                     ep->reason ? ep->reason : "new placement");
            exec_stage(st, &n);
        }
    } else {
        s->epoch = ep->epoch;
        exec_adopt_placement(s, &t, ep->members, ep->n_members);
        log_info("epoch %llu: %s", (unsigned long long)s->epoch,
                 ep->reason ? ep->reason : "new placement");
        exec_load(st, EPOCH);
    }
    pl_free(&t);
    wire_free_unpacked(&ep->base);
}

/* EPOCH_COMMIT: the staged epoch is served from now on. */
static void exec_commit(exec_state *st, const wire_msg *m)
{
    const uint16_t COMMIT = EPMOE__MSG_TYPE__MSG_EPOCH_COMMIT;
    ep_err err;
    Epmoe__EpochCommit *c =
        (Epmoe__EpochCommit *)wire_unpack(&epmoe__epoch_commit__descriptor, m, &err);
    if (c == NULL || !c->has_epoch) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_MALFORMED, COMMIT, "%s",
                   c ? "EPOCH_COMMIT without an epoch" : err.msg);
        wire_free_unpacked(c ? &c->base : NULL);
        return;
    }
    uint64_t epoch = c->epoch;
    wire_free_unpacked(&c->base);
    if (st->staged == NULL || st->staged->epoch != epoch || !st->ready) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, COMMIT,
                   "EPOCH_COMMIT %llu: no such staged epoch prepared (staged: %llu)",
                   (unsigned long long)epoch,
                   (unsigned long long)(st->staged ? st->staged->epoch : 0));
        return;
    }
    exec_close_open(st);
    uint8_t *owned = exec_owned_any(st->staged);
    if (owned == NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_LOAD_FAILED, COMMIT, "out of memory");
        return;
    }
    if (st->srv)
        srv_epoch_begin(st->srv);
    exec_free_shard(st); /* drops the experts the new epoch does not hold */
    st->n_layers = mc_num_layers(&st->staged->config);
    st->layers = st->staged_layers;
    st->staged_layers = NULL;
    st->shard_files = st->staged_files;
    exec_session_free(&st->session);
    st->session = st->staged;
    st->staged = NULL;
    ep_err err2;
    if (tp_set_placement_owned(st->tp, epoch, owned, &err2) != 0)
        log_error("epoch %llu committed: %s", (unsigned long long)epoch, err2.msg);
    free(owned);
    /* what this epoch cost is what preparing it read: READY says so (nothing is read now) */
    exec_slots n = st->staged_cost;
    log_info("epoch %llu committed: %d slots, at most %d experts a layer (%d members)",
             (unsigned long long)epoch, n.slots, n.max_per_layer, st->session->n_members);
    wmx_loaded(st->mx, "commit", 0, exec_layer_bytes(st->layers, st->n_layers));
    wmx_epoch(st->mx, epoch);
    exec_open_client(st);
    exec_send_ready(st, st->session, st->layers, st->staged_bytes, n, false, st->staged_load_s);
}

/* ---- one step ---------------------------------------------------------------------------------
 */

typedef struct exec_step_s {
    exec_state *st;
    const mb_layer *layer;
    mb_step *ms; /* the backend's half of this step (route .. combine) */
    uint64_t step_id;
    int T, k, H, P, rank;
    uint16_t *x;  /* [T, H] aligned copy of the payload */
    int64_t *ids; /* [T] or NULL */
    uint16_t *xn;
    int32_t *topk_ids;
    float *topk_w;
    uint8_t *q;
    float *qs;
    uint16_t *eo;       /* [T, k, H] expert output per slot */
    uint16_t *out;      /* [T, H] when the step computed it itself (the NCCL plane) */
    int *n_pairs_to;    /* [P] pairs sent to each rank (own rank: computed locally) */
    uint32_t **slot_to; /* [P][n_pairs_to]: t*k + j of each pair, in wire order */
    uint8_t *heard_d;   /* [P] */
    uint8_t *heard_c;   /* [P] */
    int need_c;         /* COMBINEs still due: one per peer sent a DISPATCH */
    int layer_index;
    uint32_t *expert_tokens; /* [E] pairs of this worker's tokens per expert (the load) */
    uint64_t dispatch_bytes, combine_bytes;
    double compute_s;
    double t0, dispatch_s, expert_s, combine_s; /* where the step's time went */
    uint32_t messages;                          /* data-plane messages sent */
    bool aborted;                               /* by STEP_ABORT (answered) */
    bool abandoned;                             /* by RESET or TERM (not answered) */
    ep_err err;
    Epmoe__ErrorCode code;
} exec_step_s;

static void exec_step_free(exec_step_s *s)
{
    free(s->out);
    free(s->x);
    free(s->ids);
    free(s->xn);
    free(s->topk_ids);
    free(s->topk_w);
    free(s->q);
    free(s->qs);
    mb_step_free(&s->ms);
    free(s->eo);
    if (s->slot_to)
        for (int r = 0; r < s->P; r++)
            free(s->slot_to[r]);
    free(s->slot_to);
    free(s->n_pairs_to);
    free(s->heard_d);
    free(s->heard_c);
    free(s->expert_tokens);
}

static int exec_fail(exec_step_s *s, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int exec_fail(exec_step_s *s, Epmoe__ErrorCode code, const char *fmt, ...)
{
    char text[EP_ERR_MSG_MAX]; /* the arguments may include s->err.msg itself */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(s->err.msg, text, sizeof text);
    s->code = code;
    return -1;
}

static void *exec_alloc(size_t n)
{
    return aligned_alloc(64, n ? (n + 63) / 64 * 64 : 64);
}

static int exec_step_alloc(exec_step_s *s, int E)
{
    size_t T = (size_t)s->T, H = (size_t)s->H, k = (size_t)s->k;
    s->x = exec_alloc(T * H * 2);
    s->xn = exec_alloc(T * H * 2);
    s->topk_ids = malloc(T * k * sizeof *s->topk_ids + 1);
    s->topk_w = malloc(T * k * sizeof *s->topk_w + 1);
    s->q = exec_alloc(T * H);
    s->qs = exec_alloc(T * (H / EP_FP8_BLOCK) * sizeof(float));
    s->eo = exec_alloc(T * k * H * 2);
    s->n_pairs_to = calloc((size_t)s->P, sizeof *s->n_pairs_to);
    s->slot_to = calloc((size_t)s->P, sizeof *s->slot_to);
    s->heard_d = calloc((size_t)s->P, 1);
    s->heard_c = calloc((size_t)s->P, 1);
    s->expert_tokens = calloc((size_t)E, sizeof *s->expert_tokens);
    if (!s->x || !s->xn || !s->topk_ids || !s->topk_w || !s->q || !s->qs || !s->eo ||
        !s->n_pairs_to || !s->slot_to || !s->heard_d || !s->heard_c || !s->expert_tokens)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "out of memory for a step of %d tokens", s->T);
    memset(s->eo, 0, T * k * H * 2);
    return 0;
}

/* Validate STEP against the session and copy its payloads (aligned). */
int exec_step_check(const exec_session *ses, int n_layers, bool have_last, uint64_t last_step,
                    const Epmoe__Step *req, const wire_msg *m, ep_err *err)
{
    unsigned long long id = req->has_step_id ? (unsigned long long)req->step_id : 0;
    if (!req->has_step_id)
        return ep_err_set(err, "STEP without step_id");
    if (!req->has_epoch || !req->has_layer || !req->has_n_tokens || !req->has_session)
        return ep_err_set(err, "STEP %llu: session, epoch, layer or n_tokens missing", id);
    if (req->session != ses->session)
        return ep_err_set(err, "STEP %llu: session %016llx, this worker was welcomed into %016llx",
                          id, (unsigned long long)req->session, (unsigned long long)ses->session);
    if (req->epoch != ses->epoch)
        return ep_err_set(err, "STEP %llu: epoch %llu, this worker is at epoch %llu", id,
                          (unsigned long long)req->epoch, (unsigned long long)ses->epoch);
    if (have_last && req->step_id <= last_step)
        return ep_err_set(err, "STEP %llu: step ids must increase (last was %llu)", id,
                          (unsigned long long)last_step);
    if (req->layer >= (uint32_t)n_layers)
        return ep_err_set(err, "STEP %llu: layer %u outside [0, %d)", id, req->layer, n_layers);
    if (req->n_tokens > EP_MAX_TOKENS)
        return ep_err_set(err, "STEP %llu: %u tokens, at most %d", id, req->n_tokens,
                          EP_MAX_TOKENS);
    bool has_ids = req->has_has_ids && req->has_ids;
    size_t T = req->n_tokens, H = (size_t)ses->config.hidden_size;
    if (m->n_payloads != (has_ids ? 2 : 1) || m->payload_len[0] != T * H * 2 ||
        (has_ids && m->payload_len[1] != T * 8))
        return ep_err_set(err,
                          "STEP %llu: payloads of %d frames (%zu, %zu bytes), expected hidden "
                          "bf16 [%zu, %zu]%s",
                          id, m->n_payloads, m->n_payloads > 0 ? m->payload_len[0] : 0,
                          m->n_payloads > 1 ? m->payload_len[1] : 0, T, H,
                          has_ids ? " and ids int64" : "");
    if (mc_layer_is_hash(&ses->config, (int)req->layer) && !has_ids)
        return ep_err_set(err, "STEP %llu: layer %u is hash-routed: token ids are required", id,
                          req->layer);
    if (ck_check_input(m->payload[0], (int)T, (int)H, 0, err) != 0)
        return ep_err_prefix(err, "STEP %llu (tokens counted in this worker's chunk)", id);
    return 0;
}

/* Validate STEP against the session (exec_step_check) and copy its payloads (aligned). */
static int exec_step_parse(exec_step_s *s, const Epmoe__Step *req, const wire_msg *m)
{
    exec_state *st = s->st;
    if (exec_step_check(st->session, st->n_layers, st->have_last, st->last_step, req, m, &s->err) !=
        0)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "%s", s->err.msg);
    bool has_ids = req->has_has_ids && req->has_ids;
    size_t T = req->n_tokens, H = (size_t)st->session->config.hidden_size;
    s->layer = st->layers[req->layer];
    s->T = (int)T;
    if (exec_step_alloc(s, st->session->config.n_routed_experts) != 0)
        return -1;
    if (T)
        memcpy(s->x, m->payload[0], T * H * 2);
    if (has_ids) {
        s->ids = malloc(T * 8 + 1);
        if (s->ids == NULL)
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        if (T)
            memcpy(s->ids, m->payload[1], T * 8);
    }
    return 0;
}

/* Which rank computes each (token, slot) pair: one replica of its expert in the step's layer,
 * chosen by the rule of common/placement.h (round-robin over the pairs of that expert, starting
 * at this origin's offset). dest[T*k]; -1 for empty slots. Counts the load too. */
static int exec_route_pairs(exec_step_s *s, int *dest)
{
    const pl_table *t = s->st->session->place;
    int Tk = s->T * s->k, E = pl_experts(t);
    uint32_t *seq = calloc((size_t)E, sizeof *seq);
    if (seq == NULL)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
    for (int i = 0; i < Tk; i++) {
        int32_t e = s->topk_ids[i];
        dest[i] = -1;
        if (e < 0 || e >= E)
            continue;
        int n;
        const uint16_t *reps = pl_replicas(t, s->layer_index, e, &n);
        dest[i] = pl_pick(reps, n, s->rank, seq[e]++);
        s->expert_tokens[e]++;
    }
    free(seq);
    return 0;
}

/* Count each destination's pairs and record their [token, slot] in wire order. */
static int exec_plan_pairs(exec_step_s *s)
{
    int Tk = s->T * s->k;
    int *dest = malloc((size_t)Tk * sizeof *dest + 1);
    if (dest == NULL || exec_route_pairs(s, dest) != 0) {
        free(dest);
        return dest ? -1 : exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
    }
    for (int i = 0; i < Tk; i++)
        if (dest[i] >= 0)
            s->n_pairs_to[dest[i]]++;
    for (int r = 0; r < s->P; r++) {
        s->slot_to[r] = malloc((size_t)s->n_pairs_to[r] * sizeof **s->slot_to + 1);
        if (s->slot_to[r] == NULL) {
            free(dest);
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        }
    }
    int *fill = calloc((size_t)s->P, sizeof *fill);
    if (fill == NULL) {
        free(dest);
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
    }
    for (int i = 0; i < Tk; i++)
        if (dest[i] >= 0)
            s->slot_to[dest[i]][fill[dest[i]]++] = (uint32_t)i;
    free(fill);
    free(dest);
    return 0;
}

static void exec_tick(exec_step_s *s, double t0)
{
    s->compute_s += exec_now() - t0;
}

/* The e8m0 code of a power-of-two scale; fails when the scale is not one. */
static int exec_e8m0(exec_step_s *s, float v, int t, uint8_t *out)
{
    uint8_t c = fmt_e8m0_ceil(v);
    if (fmt_e8m0_to_f32(c) != v)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "token %d: activation scale %g is not a power of two (e8m0 dispatch)", t,
                         (double)v);
    *out = c;
    return 0;
}

/* Fill the DISPATCH for rank r (shape already set, arrays allocated). */
static int exec_fill_dispatch(exec_step_s *s, int r, tp_msg *d)
{
    size_t H = (size_t)s->H, SC = H / EP_FP8_BLOCK;
    int row = -1, last_t = -1;
    for (int p = 0; p < d->n_pairs; p++) {
        uint32_t slot = s->slot_to[r][p];
        int t = (int)slot / s->k;
        if (t != last_t) {
            row++;
            last_t = t;
            if (d->format == TP_FMT_BF16) {
                memcpy(d->hidden + (size_t)row * H, s->xn + (size_t)t * H, H * 2);
            } else {
                memcpy(d->codes + (size_t)row * H, s->q + (size_t)t * H, H);
                const float *qs = s->qs + (size_t)t * SC;
                if (!d->scales_e8m0)
                    memcpy((float *)d->scales + (size_t)row * SC, qs, SC * 4);
                else
                    for (size_t b = 0; b < SC; b++)
                        if (exec_e8m0(s, qs[b], t, (uint8_t *)d->scales + (size_t)row * SC + b))
                            return -1;
            }
        }
        d->pair_row[p] = (uint32_t)row;
        d->pair_expert[p] = (uint32_t)s->topk_ids[slot];
        d->pair_weight[p] = s->topk_w[slot];
    }
    return 0;
}

static int exec_count_rows(const exec_step_s *s, int r)
{
    int rows = 0, last_t = -1;
    for (int p = 0; p < s->n_pairs_to[r]; p++) {
        int t = (int)s->slot_to[r][p] / s->k;
        rows += t != last_t;
        last_t = t;
    }
    return rows;
}

static int exec_send_dispatches(exec_step_s *s)
{
    exec_session *ses = s->st->session;
    for (int r = 0; r < s->P; r++) {
        /* sparse: a peer none of our tokens go to gets nothing (and owes no COMBINE) */
        if (r == s->rank || !ses->member[r] || s->n_pairs_to[r] == 0)
            continue;
        tp_msg d = {.kind = TP_DISPATCH,
                    .step_id = s->step_id,
                    .layer = (uint32_t)mb_layer_index(s->layer),
                    .n_rows = exec_count_rows(s, r),
                    .n_pairs = s->n_pairs_to[r],
                    .format = ses->dispatch,
                    .scales_e8m0 = ses->dispatch == TP_FMT_FP8 && ses->config.act_ue8m0};
        if (tp_msg_alloc(&d, s->H, &s->err) != 0)
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "DISPATCH to rank %d (%s): %s",
                             r, ses->peer_name[r], s->err.msg);
        if (exec_fill_dispatch(s, r, &d) != 0) {
            tp_msg_release(&d);
            return -1;
        }
        size_t bytes = tp_msg_bytes(&d, s->H);
        s->dispatch_bytes += bytes;
        tp_grant(s->st->tp, s->step_id, r, d.n_pairs); /* before its answer can arrive */
        if (tp_send(s->st->tp, r, &d, &s->err) != 0)
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "DISPATCH to %s: %s",
                             ses->peer_name[r], s->err.msg);
        wmx_sent(s->st->mx, false, bytes);
        s->messages++;
        s->need_c++;
    }
    return 0;
}

/* Scatter n rows of out (bf16 [n, H]) into eo at the slots given. */
static void exec_scatter(exec_step_s *s, const uint32_t *slots, int n, const uint16_t *out)
{
    size_t H = (size_t)s->H;
    for (int p = 0; p < n; p++)
        memcpy(s->eo + (size_t)slots[p] * H, out + (size_t)p * H, H * 2);
}

/* The pairs this worker computed, per expert, into its metrics. */
static void exec_count_pairs(exec_step_s *s, const uint32_t *expert, int n)
{
    if (s->st->mx == NULL || n == 0)
        return;
    int E = s->st->session->config.n_routed_experts;
    uint32_t *c = calloc((size_t)E, sizeof *c);
    for (int p = 0; c != NULL && p < n; p++)
        if (expert[p] < (uint32_t)E)
            c[expert[p]]++;
    for (int e = 0; c != NULL && e < E; e++)
        if (c[e])
            wmx_expert_pairs(s->st->mx, s->layer_index, e, c[e]);
    free(c);
}

/* Own pairs and the shared expert, on own tokens. */
static int exec_local(exec_step_s *s)
{
    int n = s->n_pairs_to[s->rank];
    uint32_t *row = malloc((size_t)n * 4 + 1), *ex = malloc((size_t)n * 4 + 1);
    float *w = malloc((size_t)n * 4 + 1);
    uint16_t *out = exec_alloc((size_t)n * (size_t)s->H * 2);
    int rc = 0;
    if (!row || !ex || !w || !out) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        goto done;
    }
    for (int p = 0; p < n; p++) {
        uint32_t slot = s->slot_to[s->rank][p];
        row[p] = slot / (uint32_t)s->k;
        ex[p] = (uint32_t)s->topk_ids[slot];
        w[p] = s->topk_w[slot];
    }
    double t0 = exec_now();
    /* the shared expert first: a GPU backend runs it while the host plans the local pairs */
    if (mb_step_shared(s->ms, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "shared expert: %s", s->err.msg);
        goto done;
    }
    if (n && mb_experts(s->st->be, s->layer, s->T, s->q, s->qs, n, row, ex, w, out, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "local experts: %s", s->err.msg);
        goto done;
    }
    exec_scatter(s, s->slot_to[s->rank], n, out);
    exec_tick(s, t0);
    s->expert_s += exec_now() - t0;
    exec_count_pairs(s, ex, n);
done:
    free(row);
    free(ex);
    free(w);
    free(out);
    return rc;
}

/* Answer a peer's DISPATCH with its COMBINE. Malformed-for-this-step messages are dropped. */
static int exec_on_dispatch(exec_step_s *s, tp_msg *d)
{
    exec_session *ses = s->st->session;
    int src = d->src_rank;
    if (d->layer != (uint32_t)mb_layer_index(s->layer) || s->heard_d[src]) {
        log_warn("step %llu: dropped a DISPATCH from rank %d (%s): %s",
                 (unsigned long long)s->step_id, src, ses->peer_name[src],
                 s->heard_d[src] ? "duplicate" : "layer differs from the step's");
        return 0;
    }
    for (int p = 0; p < d->n_pairs; p++)
        if (!mb_layer_owns(s->layer, (int)d->pair_expert[p])) {
            log_warn("step %llu: dropped a DISPATCH from rank %d (%s): pair %d names expert %u, "
                     "which this worker does not hold in layer %d",
                     (unsigned long long)s->step_id, src, ses->peer_name[src], p, d->pair_expert[p],
                     s->layer_index);
            return 0;
        }
    size_t H = (size_t)s->H, SC = H / EP_FP8_BLOCK, rows = (size_t)d->n_rows;
    uint8_t *q = d->codes, *qbuf = NULL;
    float *qs = d->scales, *qsbuf = NULL;
    tp_msg c = {.kind = TP_COMBINE, .step_id = s->step_id, .n_pairs = d->n_pairs};
    int rc = 0;
    if (d->format == TP_FMT_BF16)
        q = qbuf = exec_alloc(rows * H);
    if (d->format == TP_FMT_BF16 || d->scales_e8m0)
        qs = qsbuf = exec_alloc(rows * SC * 4);
    if ((d->format == TP_FMT_BF16 && !qbuf) || (qs == NULL && rows) ||
        tp_msg_alloc(&c, s->H, &s->err) != 0) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        goto done;
    }
    double t0 = exec_now();
    if (d->format == TP_FMT_BF16 && rows &&
        mb_quant(s->st->be, s->layer, d->n_rows, d->hidden, q, qs, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "quantizing rank %d's rows: %s", src,
                       s->err.msg);
        goto done;
    } else if (d->scales_e8m0)
        for (size_t i = 0; i < rows * SC; i++)
            qs[i] = fmt_e8m0_to_f32(((const uint8_t *)d->scales)[i]);
    if (d->n_pairs && mb_experts(s->st->be, s->layer, d->n_rows, q, qs, d->n_pairs, d->pair_row,
                                 d->pair_expert, d->pair_weight, c.out, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "experts for rank %d (%s): %s", src,
                       ses->peer_name[src], s->err.msg);
        goto done;
    }
    exec_tick(s, t0);
    s->expert_s += exec_now() - t0;
    exec_count_pairs(s, d->pair_expert, d->n_pairs);
    size_t bytes = tp_msg_bytes(&c, s->H);
    s->combine_bytes += bytes;
    if (tp_send(s->st->tp, src, &c, &s->err) != 0) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "COMBINE to %s: %s",
                       ses->peer_name[src], s->err.msg);
        goto done;
    }
    wmx_sent(s->st->mx, true, bytes);
    s->messages++;
    s->heard_d[src] = 1;
done:
    tp_msg_release(&c);
    free(qbuf);
    free(qsbuf);
    return rc;
}

static void exec_on_combine(exec_step_s *s, const tp_msg *c)
{
    int src = c->src_rank;
    const char *name = s->st->session->peer_name[src];
    if (s->heard_c[src]) {
        log_warn("step %llu: dropped a duplicate COMBINE from rank %d (%s)",
                 (unsigned long long)s->step_id, src, name);
        return;
    }
    if (c->n_pairs != s->n_pairs_to[src]) {
        log_warn("step %llu: dropped a COMBINE from rank %d (%s) with %d pairs, %d were sent",
                 (unsigned long long)s->step_id, src, name, c->n_pairs, s->n_pairs_to[src]);
        return;
    }
    exec_scatter(s, s->slot_to[src], c->n_pairs, c->out);
    s->heard_c[src] = 1;
    s->need_c--;
}

/* Handle what the data plane holds for this step. */
static int exec_drain(exec_step_s *s)
{
    tp_msg m;
    while (tp_take(s->st->tp, s->step_id, &m)) {
        int rc = 0;
        if (!s->st->session->member[m.src_rank])
            log_warn("step %llu: dropped a message from rank %d, not a member of epoch %llu",
                     (unsigned long long)s->step_id, m.src_rank,
                     (unsigned long long)s->st->session->epoch);
        else if (m.kind == TP_COMBINE && s->heard_c == NULL)
            log_warn("step %llu: dropped a COMBINE from rank %d: the step's own part is done",
                     (unsigned long long)s->step_id, m.src_rank);
        else if (m.kind == TP_DISPATCH)
            rc = exec_on_dispatch(s, &m);
        else
            exec_on_combine(s, &m);
        tp_msg_release(&m);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* The peers a step still waits for, for the timeout message. */
static void exec_missing(const exec_step_s *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int r = 0; r < s->P && n < cap; r++) {
        if (r == s->rank || s->n_pairs_to[r] == 0 || s->heard_c[r])
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "%srank %d (%s): COMBINE", n ? ", " : "", r,
                              s->st->session->peer_name[r]);
    }
}

static void exec_stash(exec_state *st, wire_msg *m)
{
    if (st->n_stash == EXEC_MAX_STASH) {
        log_error("executor: dropped %s (stash full)", wire_type_name(m->type));
        wire_msg_close(m);
        return;
    }
    wire_msg_move(&st->stash[st->n_stash++], m);
}

/* One pipe message during a step. Returns -1 when the step must end. */
static int exec_step_pipe(exec_step_s *s)
{
    exec_state *st = s->st;
    wire_msg m;
    ep_err err;
    wire_rc rc =
        wire_recv(st->pipe, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err);
    if (rc != WIRE_OK)
        return 0;
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP_ABORT) {
        Epmoe__StepAbort *a =
            (Epmoe__StepAbort *)wire_unpack(&epmoe__step_abort__descriptor, &m, &err);
        bool ours = a && a->has_step_id && a->step_id == s->step_id;
        wire_free_unpacked(a ? &a->base : NULL);
        wire_msg_close(&m);
        if (!ours)
            return 0;
        s->aborted = true;
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "step %llu aborted by the coordinator", (unsigned long long)s->step_id);
    }
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP) {
        Epmoe__Step *o = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, &m, &err);
        exec_step_failed(st, o && o->has_step_id, o ? o->step_id : 0, EPMOE__ERROR_CODE__ERR_BUSY,
                         "step %llu is still running", (unsigned long long)s->step_id);
        wire_free_unpacked(o ? &o->base : NULL);
        wire_msg_close(&m);
        return 0;
    }
    /* RESET and TERM end the step unanswered (the caller discards the old session's answers);
     * anything else waits in the stash until the step is over. */
    bool end = m.type == EXEC_CMD_RESET || m.type == EXEC_CMD_TERM;
    exec_stash(st, &m);
    if (!end)
        return 0;
    s->abandoned = true;
    return -1;
}

/* Wait for the COMBINEs of our DISPATCHes, answering peers' DISPATCHes as they come. */
static int exec_wait_peers(exec_step_s *s, double deadline)
{
    exec_state *st = s->st;
    while (s->need_c > 0) {
        if (exec_drain(s) != 0)
            return -1;
        if (s->need_c == 0)
            break;
        double left = deadline - exec_now();
        if (left <= 0) {
            char who[EP_ERR_MSG_MAX / 2];
            exec_missing(s, who, sizeof who);
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_TIMEOUT,
                             "step %llu timed out after %d ms waiting for %s",
                             (unsigned long long)s->step_id, st->session->step_timeout_ms, who);
        }
        zmq_pollitem_t it[2] = {{.socket = st->pipe, .events = ZMQ_POLLIN},
                                {.socket = tp_socket(st->tp), .events = ZMQ_POLLIN}};
        long ms = (long)(left * 1000) + 1;
        if (zmq_poll(it, 2, ms > 1000 ? 1000 : ms) < 0)
            continue; /* EINTR */
        if (it[1].revents)
            tp_pump(st->tp);
        if (it[0].revents && exec_step_pipe(s) != 0)
            return -1;
    }
    return 0;
}

/* Sparse (index, count) lists of the nonzero entries of a[n] (the load STEP_DONE reports). */
static size_t exec_sparse(const uint32_t *a, int n, uint32_t *idx, uint32_t *cnt)
{
    size_t k = 0;
    for (int i = 0; i < n; i++)
        if (a[i]) {
            idx[k] = (uint32_t)i;
            cnt[k++] = a[i];
        }
    return k;
}

/* STEP_DONE once this worker's tokens are combined; returns 0 when sent. */
static int exec_send_done(exec_step_s *s)
{
    size_t T = (size_t)s->T, H = (size_t)s->H, k = (size_t)s->k;
    uint16_t *out = s->out ? s->out : malloc(T * H * 2 + 1);
    s->out = NULL; /* the message's (or freed) from here */
    if (out == NULL) {
        exec_step_failed(s->st, true, s->step_id, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "out of memory for the output");
        return -1;
    }
    double t0 = exec_now();
    if (s->ms != NULL && mb_step_finish(s->ms, s->eo, out, &s->err) != 0) {
        free(out);
        exec_step_failed(s->st, true, s->step_id, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "combine: %s",
                         s->err.msg);
        return -1;
    }
    exec_tick(s, t0);
    int E = s->st->session->config.n_routed_experts;
    size_t cap = (size_t)(E > s->P ? E : s->P);
    uint32_t *buf = malloc(4 * cap * sizeof *buf + 4);
    uint32_t *pairs = calloc((size_t)s->P, sizeof *pairs);
    Epmoe__StepDone d = EPMOE__STEP_DONE__INIT;
    if (buf != NULL && pairs != NULL) {
        for (int r = 0; r < s->P; r++)
            pairs[r] = (uint32_t)s->n_pairs_to[r];
        if (s->st->session->nccl) /* the collective counts what each rank computed */
            for (int e = 0; e < E; e++)
                pairs[s->rank] += s->expert_tokens[e];
        d.routed_expert = buf;
        d.routed_tokens = buf + cap;
        d.n_routed_expert = d.n_routed_tokens =
            exec_sparse(s->expert_tokens, E, d.routed_expert, d.routed_tokens);
        d.pair_rank = buf + 2 * cap;
        d.pair_count = buf + 3 * cap;
        d.n_pair_rank = d.n_pair_count = exec_sparse(pairs, s->P, d.pair_rank, d.pair_count);
    }
    double total = exec_now() - s->t0;
    d.has_step_id = d.has_n_tokens = d.has_dispatch_bytes = d.has_combine_bytes = 1;
    d.has_compute_seconds = d.has_dispatch_seconds = d.has_expert_seconds = 1;
    d.has_combine_seconds = d.has_messages_sent = 1;
    d.step_id = s->step_id;
    d.n_tokens = (uint32_t)s->T;
    d.dispatch_bytes = s->dispatch_bytes;
    d.combine_bytes = s->combine_bytes;
    d.compute_seconds = s->compute_s;
    d.dispatch_seconds = s->dispatch_s;
    d.expert_seconds = s->expert_s;
    d.combine_seconds = s->combine_s;
    d.messages_sent = s->messages;
    wire_payload pl[3] = {
        {.data = out, .len = T * H * 2, .free_fn = wire_free_malloc},
        {.data = s->topk_ids, .len = T * k * 4, .free_fn = wire_free_malloc},
        {.data = s->topk_w, .len = T * k * 4, .free_fn = wire_free_malloc},
    };
    s->topk_ids = NULL; /* owned by the message now */
    s->topk_w = NULL;
    exec_send(s->st, EPMOE__MSG_TYPE__MSG_STEP_DONE, &d.base, pl, 3);
    free(buf);
    free(pairs);
    wmx_step(s->st->mx, s->layer_index, total, s->dispatch_s, s->expert_s, s->combine_s);
    wmx_step_result(s->st->mx, true);
    return 0;
}

/* Route, dispatch, compute, wait, combine. */
static int exec_step_run(exec_step_s *s)
{
    exec_state *st = s->st;
    double deadline = exec_now() + st->session->step_timeout_ms / 1000.0;
    double t0 = exec_now();
    s->t0 = t0;
    s->ms = mb_step_begin(st->be, s->layer, s->T, s->x, s->ids, s->topk_ids, s->topk_w, s->q, s->qs,
                          s->xn, &s->err);
    if (s->ms == NULL)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "STEP %llu: %s",
                         (unsigned long long)s->step_id, s->err.msg);
    exec_tick(s, t0);
    double routed = exec_now();
    if (exec_plan_pairs(s) != 0 || exec_send_dispatches(s) != 0)
        return -1;
    s->dispatch_s = exec_now() - routed;
    if (exec_local(s) != 0)
        return -1;
    double waiting = exec_now();
    int rc = exec_wait_peers(s, deadline);
    s->combine_s = exec_now() - waiting;
    return rc;
}

/* The open step is over (the next STEP, STEP_ABORT, a placement message or a reset): its
 * messages are dropped from now on. */
static void exec_close_open(exec_state *st)
{
    exec_step_s *o = st->open;
    if (o == NULL)
        return;
    if (st->tp)
        tp_finish(st->tp, o->step_id);
    exec_step_free(o);
    free(o);
    st->open = NULL;
}

/* Keep a step whose STEP_DONE went out open, to serve its peers' DISPATCHes: only what serving
 * needs stays allocated. */
static void exec_keep_open(exec_state *st, exec_step_s *s)
{
    uint8_t *heard = s->heard_d;
    s->heard_d = NULL;
    exec_step_free(s);
    s->heard_d = heard;
    s->x = NULL;
    s->ids = NULL;
    s->xn = NULL;
    s->topk_ids = NULL;
    s->topk_w = NULL;
    s->q = NULL;
    s->qs = NULL;
    s->ms = NULL;
    s->eo = NULL;
    s->slot_to = NULL;
    s->n_pairs_to = NULL;
    s->heard_c = NULL;
    s->expert_tokens = NULL;
    s->out = NULL;
    st->open = s;
}

/* DISPATCHes for the open step, between steps (the main loop and a staged load call this). */
static void exec_serve_open(exec_state *st)
{
    if (st->open == NULL)
        return;
    st->open->need_c = 0;
    if (exec_drain(st->open) != 0) {
        /* its STEP_DONE is out: the peer whose COMBINE is missing fails the step */
        log_warn("step %llu: serving a peer failed: %s", (unsigned long long)st->open->step_id,
                 st->open->err.msg);
        exec_close_open(st);
    }
}

/* ---- the NCCL data plane (data_plane nccl; docs/protocol.md "NCCL data plane") -------------
 *
 * The executor owns the communicator (tp_comm over NCCL) and the step driver (step_nccl.h).
 * COMM_INIT builds the communicator, waiting with its deadline while it still reads the pipe;
 * a STEP runs sn_run instead of the ZeroMQ exchange above, and a failed one tells the
 * coordinator that the communicator was aborted (StepFailed.comm_aborted).
 */

/* The communicator object and the driver; the library's communicator comes with COMM_INIT. */
static int exec_nccl_open(exec_state *st, ep_err *err)
{
    exec_session *s = st->session;
    mb_device_info info;
    if (mb_device(st->be, &info) != 0 || info.kind != MB_DEV_CUDA)
        return ep_err_set(err,
                          "data_plane nccl needs a cuda:N device; this worker runs the %s "
                          "backend",
                          mb_name(st->be));
    if (s->dispatch != TP_FMT_FP8)
        return ep_err_set(err, "data_plane nccl sends fp8 dispatch only");
    st->cuda_ordinal = info.ordinal;
    if (st->comm == NULL &&
        (st->comm = tp_comm_create(tp_nccl_ops(), &st->cuda_ordinal, err)) == NULL)
        return -1;
    return 0;
}

/* The step driver for the communicator COMM_INIT built (its world: the epoch's members). */
static int exec_nccl_driver(exec_state *st, const Epmoe__CommInit *ci, ep_err *err)
{
    exec_session *s = st->session;
    sn_config cfg = {.rank = s->rank,
                     .world_size = s->world_size,
                     .comm_rank = tp_comm_rank(st->comm),
                     .comm_size = tp_comm_size(st->comm),
                     .members = ci->n_members ? ci->members : NULL,
                     .epoch = s->epoch,
                     .hidden = s->config.hidden_size,
                     .topk = s->config.num_experts_per_tok,
                     .n_experts = s->config.n_routed_experts,
                     .expert_owner = s->expert_owner,
                     .scales_e8m0 = s->config.act_ue8m0,
                     .peer_name = (const char *const *)s->peer_name};
    sn_destroy(&st->sn);
    st->sn = sn_create(&cfg, sn_cuda_dev_ops(), st->be, st->comm, err);
    return st->sn != NULL ? 0 : -1;
}

/* Between polls of a step's waits: the step's own pipe handling (STEP_ABORT, RESET, TERM). */
static int exec_nccl_idle(void *ctx, ep_err *err)
{
    exec_step_s *s = ctx;
    if (exec_step_pipe(s) == 0)
        return 0;
    return ep_err_set(err, "%s", s->abandoned ? "the session was reset" : s->err.msg);
}

static int exec_nccl_step(exec_step_s *s)
{
    exec_state *st = s->st;
    s->out = malloc((size_t)s->T * (size_t)s->H * 2 + 1);
    if (s->out == NULL || st->sn == NULL)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "STEP %llu: %s",
                         (unsigned long long)s->step_id,
                         s->out ? "no NCCL communicator yet (COMM_INIT)" : "out of memory");
    sn_step io = {.step_id = s->step_id,
                  .layer = s->layer,
                  .layer_index = (uint32_t)mb_layer_index(s->layer),
                  .T = s->T,
                  .x = s->x,
                  .ids = s->ids,
                  .topk_ids = s->topk_ids,
                  .topk_w = s->topk_w,
                  .out = s->out,
                  .expert_tokens = s->expert_tokens,
                  .deadline = exec_now() + st->session->step_timeout_ms / 1000.0,
                  .idle = exec_nccl_idle,
                  .idle_ctx = s};
    double t0 = exec_now();
    int code = 0;
    ep_err err = {{0}};
    int rc = sn_run(st->sn, &io, &code, &err);
    s->compute_s += exec_now() - t0; /* on the GPU the exchange overlaps the kernels */
    s->dispatch_bytes = io.dispatch_bytes;
    s->combine_bytes = io.combine_bytes;
    return rc == 0 ? 0 : exec_fail(s, (Epmoe__ErrorCode)code, "%s", err.msg);
}

static void exec_nccl_failed(exec_step_s *s)
{
    exec_state *st = s->st;
    log_warn("step %llu failed: %s", (unsigned long long)s->step_id, s->err.msg);
    Epmoe__StepFailed f = EPMOE__STEP_FAILED__INIT;
    f.has_step_id = f.has_code = f.has_comm_aborted = 1;
    f.step_id = s->step_id;
    f.code = s->code;
    f.message = s->err.msg;
    f.comm_aborted = st->comm != NULL && tp_comm_get_state(st->comm) != TP_COMM_READY;
    exec_send(st, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &f.base, NULL, 0);
}

static void exec_comm_done(exec_state *st, uint64_t epoch, uint32_t gen, bool ok, const char *why)
{
    Epmoe__CommDone d = EPMOE__COMM_DONE__INIT;
    d.has_epoch = d.has_generation = d.has_ok = 1;
    d.epoch = epoch;
    d.generation = gen;
    d.ok = ok;
    d.message = ok ? NULL : (char *)why;
    exec_send(st, EPMOE__MSG_TYPE__MSG_COMM_DONE, &d.base, NULL, 0);
}

/* While a communicator is being built the pipe is still read: a STEP is refused, and RESET,
 * TERM, SESSION, LOAD or a newer COMM_INIT end the wait (they are handled next). */
static int exec_comm_idle(void *ctx, ep_err *err)
{
    exec_state *st = ctx;
    wire_msg m;
    ep_err e;
    if (wire_recv(st->pipe, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &e) !=
        WIRE_OK)
        return 0;
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP) {
        Epmoe__Step *o = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, &m, &e);
        exec_step_failed(st, o && o->has_step_id, o ? o->step_id : 0,
                         EPMOE__ERROR_CODE__ERR_NOT_READY, "the NCCL communicator is being built");
        wire_free_unpacked(o ? &o->base : NULL);
        wire_msg_close(&m);
        return 0;
    }
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP_ABORT) {
        wire_msg_close(&m);
        return 0;
    }
    uint16_t type = m.type;
    exec_stash(st, &m);
    return ep_err_set(err, "interrupted by %s",
                      type == EXEC_CMD_RESET  ? "a reset"
                      : type == EXEC_CMD_TERM ? "shutdown"
                                              : wire_type_name(type));
}

/* This worker's rank and the size of the communicator COMM_INIT describes (absent: the
 * session's); the members, when given, must place this worker at that rank. */
static int exec_comm_world(const exec_session *s, const Epmoe__CommInit *ci, int *rank, int *size,
                           ep_err *err)
{
    *rank = ci->has_rank ? (int)ci->rank : s->rank;
    *size = ci->has_size ? (int)ci->size : s->world_size;
    if (*size < 1 || *size > s->world_size || *rank < 0 || *rank >= *size ||
        (ci->n_members &&
         (ci->n_members != (size_t)*size || ci->members[*rank] != (uint32_t)s->rank)))
        return ep_err_set(err,
                          "COMM_INIT: communicator rank %d of %d (%zu members) is not this "
                          "worker's place (rank %d of %d)",
                          *rank, *size, ci->n_members, s->rank, s->world_size);
    return 0;
}

/* Begin the communicator COMM_INIT asks for (rank 0 of a new one creates the id first). */
static int exec_comm_begin(exec_state *st, const Epmoe__CommInit *ci, ep_err *err)
{
    int rank, size;
    if (exec_comm_world(st->session, ci, &rank, &size, err) != 0)
        return -1;
    if (ci->has_shrink && ci->shrink)
        return tp_comm_begin_shrink(st->comm, ci->epoch, ci->generation, ci->parent_epoch,
                                    ci->parent_generation, ci->exclude_ranks,
                                    (int)ci->n_exclude_ranks, rank, size, err);
    tp_comm_id id;
    if (ci->has_nccl_id) {
        if (ci->nccl_id.len != TP_COMM_ID_BYTES)
            return ep_err_set(err, "COMM_INIT: nccl_id of %zu bytes, expected %d", ci->nccl_id.len,
                              TP_COMM_ID_BYTES);
        memcpy(id.bytes, ci->nccl_id.data, TP_COMM_ID_BYTES);
    } else {
        if (rank != 0)
            return ep_err_set(err, "COMM_INIT without nccl_id: only rank 0 creates the id");
        if (tp_comm_new_id(st->comm, &id, err) != 0)
            return -1;
        Epmoe__CommId m = EPMOE__COMM_ID__INIT;
        m.has_epoch = m.has_generation = m.has_nccl_id = 1;
        m.epoch = ci->epoch;
        m.generation = ci->generation;
        m.nccl_id.len = TP_COMM_ID_BYTES;
        m.nccl_id.data = id.bytes;
        exec_send(st, EPMOE__MSG_TYPE__MSG_COMM_ID, &m.base, NULL, 0);
    }
    return tp_comm_begin_init(st->comm, ci->epoch, ci->generation, rank, size, &id, err);
}

static void exec_comm_init(exec_state *st, const wire_msg *m)
{
    ep_err err = {{0}};
    Epmoe__CommInit *ci = (Epmoe__CommInit *)wire_unpack(&epmoe__comm_init__descriptor, m, &err);
    if (ci == NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type, "%s", err.msg);
        return;
    }
    int rc = 0;
    if (st->session == NULL || !st->session->nccl || !st->ready || st->comm == NULL)
        rc = ep_err_set(&err, "COMM_INIT: this worker has no loaded NCCL data plane");
    else if (!ci->has_epoch || ci->epoch != st->session->epoch || !ci->has_generation ||
             !ci->has_timeout_ms || ci->timeout_ms == 0)
        rc = ep_err_set(&err,
                        "COMM_INIT: epoch (this worker's is %llu), generation or timeout_ms "
                        "missing or wrong",
                        (unsigned long long)st->session->epoch);
    if (rc == 0)
        rc = exec_comm_begin(st, ci, &err);
    if (rc == 0)
        rc = tp_comm_wait_ready(st->comm, exec_now() + ci->timeout_ms / 1000.0, exec_comm_idle, st,
                                &err);
    if (rc == 0 && exec_nccl_driver(st, ci, &err) != 0) {
        tp_comm_abort(st->comm, err.msg);
        rc = -1;
    }
    if (rc != 0)
        log_warn("%s", err.msg);
    exec_comm_done(st, ci->epoch, ci->generation, rc == 0, err.msg);
    wire_free_unpacked(&ci->base);
}

static void exec_step(exec_state *st, wire_msg *m)
{
    ep_err err;
    exec_close_open(st); /* a new STEP: every step before it is complete everywhere */
    Epmoe__Step *req = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, m, &err);
    if (req == NULL || !req->has_step_id) {
        exec_step_failed(st, false, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s",
                         req ? "STEP without step_id" : err.msg);
        wire_free_unpacked(req ? &req->base : NULL);
        return;
    }
    exec_step_s *s = calloc(1, sizeof *s);
    if (s == NULL) {
        exec_step_failed(st, true, req->step_id, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "out of memory");
        wire_free_unpacked(&req->base);
        return;
    }
    *s = (exec_step_s){.st = st, .step_id = req->step_id, .code = EPMOE__ERROR_CODE__ERR_NONE};
    if (!st->ready) {
        exec_step_failed(st, true, s->step_id, EPMOE__ERROR_CODE__ERR_NOT_READY,
                         "STEP %llu: the shard is not loaded", (unsigned long long)s->step_id);
        wire_free_unpacked(&req->base);
        free(s);
        return;
    }
    const mc_config *c = &st->session->config;
    s->k = c->num_experts_per_tok;
    s->H = c->hidden_size;
    s->P = st->session->world_size;
    s->rank = st->session->rank;
    if (!st->session->member[s->rank]) {
        exec_step_failed(st, true, s->step_id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                         "STEP %llu: rank %d owns no experts in epoch %llu (not a member)",
                         (unsigned long long)s->step_id, s->rank,
                         (unsigned long long)st->session->epoch);
        wire_free_unpacked(&req->base);
        free(s);
        return;
    }
    int rc = exec_step_parse(s, req, m);
    wire_free_unpacked(&req->base);
    if (rc != 0) {
        exec_step_failed(st, true, s->step_id, s->code, "%s", s->err.msg);
        wmx_step_result(st->mx, false);
        exec_step_free(s);
        free(s);
        return;
    }
    s->layer_index = mb_layer_index(s->layer);
    log_debug(LOG_SUB_STEP, "step %llu: layer %d, %d tokens", (unsigned long long)s->step_id,
              s->layer_index, s->T);
    /* the coordinator settled every earlier step before it started this one: what the data
     * plane still holds for them is stale (a restarted worker's peers' queued DISPATCHes) */
    if (st->tp && s->step_id > 0)
        tp_finish(st->tp, s->step_id - 1);
    bool nccl = st->session->nccl; /* a collective: no open step to serve afterwards */
    rc = nccl ? exec_nccl_step(s) : exec_step_run(s);
    st->have_last = true;
    st->last_step = s->step_id;
    if (rc == 0 && exec_send_done(s) == 0 && !nccl) {
        exec_keep_open(st, s);
        exec_serve_open(st); /* DISPATCHes that came before the STEP wait in the transport */
        return;
    }
    if (rc != 0 && !s->abandoned) {
        if (nccl)
            exec_nccl_failed(s);
        else
            exec_step_failed(st, true, s->step_id, s->code, "%s", s->err.msg);
        wmx_step_result(st->mx, false);
    }
    if (st->tp)
        tp_finish(st->tp, s->step_id);
    exec_step_free(s);
    free(s);
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

/* STEP_ABORT between steps: closes the open step it names (its STEP_DONE already went out). */
static void exec_abort_open(exec_state *st, const wire_msg *m)
{
    Epmoe__StepAbort *a = (Epmoe__StepAbort *)wire_unpack(&epmoe__step_abort__descriptor, m, NULL);
    bool ours = a && a->has_step_id && st->open && a->step_id == st->open->step_id;
    wire_free_unpacked(a ? &a->base : NULL);
    if (ours)
        exec_close_open(st);
    else
        log_debug(LOG_SUB_STEP, "STEP_ABORT for a step not running: ignored");
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

/* A staged load at a layer boundary: serve the steps that came and the open step's peers;
 * false when a command that supersedes the staged load came (stashed for the loop). */
static bool exec_serve_between_layers(exec_progress *p)
{
    exec_state *st = p->st;
    for (;;) {
        if (st->tp) {
            tp_pump(st->tp);
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

/* LOAD_REPORT to the coordinator (relayed by the control thread). */
static void exec_send_report(void *ctx, const Epmoe__LoadReport *r)
{
    exec_send(ctx, EPMOE__MSG_TYPE__MSG_LOAD_REPORT, &r->base, NULL, 0);
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
    double now = exec_now();
    if (now - st->reported_at >= 1.0 && env.ready) {
        st->reported_at = now;
        srv_report(st->srv, &env, exec_send_report, st);
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
            {.socket = st->tp ? tp_socket(st->tp) : NULL, .events = ZMQ_POLLIN}};
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
        long timeout = st->srv ? (long)(srv_idle_timeout(st->srv) * 1000) + 1 : 1000;
        int rc_poll = zmq_poll(items, n, timeout > 1000 ? 1000 : timeout);
        bool client_in = st->srv && rc_poll > 0 && it[1].revents;
        bool data_in = st->tp && rc_poll > 0 && it[n - 1].revents;
        if (data_in) {
            tp_pump(st->tp);
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
    }
}

static void *exec_main(void *arg)
{
    exec_actor *a = arg;
    exec_state st = {.actor = a, .be = a->be, .pipe = a->thread_pipe};
    exec_loop(&st);
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
