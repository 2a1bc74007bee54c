/*
 * exec_load.c — loading (exec_state.h): the data plane of an epoch, the layers a rank holds
 * (only what it gains is read), EPOCH, a staged epoch beside the serving one, EPOCH_COMMIT.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/safetensors_model.h"
#include "common/wire.h"
#include "kernels/formats.h"
#include "worker/exec_state.h"
#include "worker/plan.h"
#include "shard/shard.h"
#include "worker/wmetrics.h"

/* ---- loading ----------------------------------------------------------------------------------
 */

/* The data plane belongs to one session and epoch; the loaded layers may outlive both. */
void exec_close_plane(exec_state *st)
{
    exec_close_open(st);
    tpz_destroy(&st->tp);
    for (int r = 0; st->tp_peers && r < st->tp_world; r++)
        free(st->tp_peers[r]);
    free(st->tp_peers);
    st->tp_peers = NULL;
    st->ready = false;
    st->have_last = false;
}

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
    m.elapsed_ms = (uint32_t)((clk_mono_s() - p->start) * 1000.0);
    exec_send(p->st, EPMOE__MSG_TYPE__MSG_LOADING, &m.base, NULL, 0);
    p->last = clk_mono_s();
}

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
        (p->last == 0 || clk_mono_s() - p->last >= EXEC_PROGRESS_INTERVAL_S || done == total))
        exec_send_loading(p, done); /* a staged load says nothing until it is prepared */
    if (p->serve && boundary) {
        p->served_at = layers_done;
        if (!p->st->between_layers(p))
            return 1;
    }
    return atomic_load(&p->st->actor->cancel) > 0;
}

/* Whether the open data plane serves the session's world (rank, peers, endpoints, shapes), in
 * the same coordinator session, and its epoch is not older: then only the placement changes
 * (tpz_set_placement), or nothing at all when a WELCOME brought the same epoch again (a reload
 * that changed timeouts: rebinding lost what the peers had in flight to the old sockets). A
 * plane is never reused for another session (a coordinator started afresh), so its messages
 * carry the session it was built for. */
static bool exec_plane_fits(const exec_state *st)
{
    const exec_session *s = st->session;
    if (st->tp == NULL || st->tp_peers == NULL || s->rank != st->tp_rank ||
        s->world_size != st->tp_world || s->config.hidden_size != st->tp_hidden ||
        s->config.n_routed_experts != st->tp_experts || s->epoch < tpz_epoch(st->tp) ||
        s->session != tpz_session(st->tp) || strcmp(s->data_endpoint, st->tp_bind) != 0)
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
        /* one epoch of a session is one placement: the same epoch again changes nothing */
        int rc = s->epoch == tpz_epoch(st->tp)
                     ? 0
                     : tpz_set_placement_owned(st->tp, s->epoch, owned, err);
        free(owned);
        return rc;
    }
    exec_close_plane(st);
    tpz_config cfg = {.rank = s->rank,
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
    st->tp = tpz_create(st->actor->zctx, &cfg, err);
    free(owned);
    if (st->tp == NULL || exec_plane_key(st, err) != 0)
        return -1;
    return tpz_connect(st->tp, (const char *const *)s->peer_endpoint, err);
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
    p->start = clk_mono_s();
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
    char bound[EP_MAX_PATH] = "";
    if (st->srv && srv_get_max_frame(st->srv) < srv_max_frame(s->config.hidden_size)) {
        /* a reload to a model with wider hidden states: its SUBMITs need a larger frame bound,
         * which libzmq takes only before bind; the requests held fail (ERR_SHUTTING_DOWN) and
         * the endpoint is bound again at the same address, so READY's endpoint stays */
        snprintf(bound, sizeof bound, "%s", srv_endpoint(st->srv));
        log_warn("client endpoint %s: reopened for hidden size %d", bound, s->config.hidden_size);
        if (st->tp)
            tpz_set_awaits(st->tp, NULL, NULL);
        srv_destroy(&st->srv);
    }
    if (st->srv == NULL && !s->nccl) {
        char ep[EP_MAX_PATH];
        if (bound[0])
            snprintf(ep, sizeof ep, "%s", bound);
        else if (s->client_endpoint[0])
            snprintf(ep, sizeof ep, "%s", s->client_endpoint);
        else
            srv_default_endpoint(s->data_endpoint, ep, sizeof ep);
        ep_err err = {0};
        st->srv = srv_create(st->actor->zctx, ep, st->actor->secure ? &st->actor->key : NULL,
                             srv_max_frame(s->config.hidden_size), &err);
        if (st->srv == NULL)
            log_error("no client endpoint (the serving path is off): %s", err.msg);
        else
            log_info("client endpoint %s", srv_endpoint(st->srv));
    }
    if (st->srv) {
        srv_env env = exec_env(st);
        srv_epoch_end(st->srv, &env);
        if (st->tp) /* COMBINEs no request of this server waits for take no credit */
            tpz_set_awaits(st->tp, srv_awaits, st->srv);
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
    if (st->comm != NULL && tpc_get_state(st->comm) == TPC_READY) {
        r.has_comm_epoch = r.has_comm_generation = r.has_comm_rank = r.has_comm_size = 1;
        r.comm_epoch = tpc_epoch(st->comm);
        r.comm_generation = tpc_generation(st->comm);
        r.comm_rank = (uint32_t)tpc_rank(st->comm);
        r.comm_size = (uint32_t)tpc_size(st->comm);
    }
    exec_send(st, EPMOE__MSG_TYPE__MSG_READY, &r.base, NULL, 0);
}

/* LOAD and EPOCH: the data plane of the session's epoch, then the layers. */
void exec_load(exec_state *st, uint16_t in_reply_to)
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
    double t0 = clk_mono_s();
    ep_err err = {0};
    exec_progress p = {.st = st, .s = s, .served_at = -1};
    int L = mc_num_layers(&s->config);
    exec_slots c = exec_count_slots(s, st->layers, st->n_layers);
    mb_layer **layers = calloc((size_t)L, sizeof *layers);
    uint64_t files = 0;
    int rc = layers ? exec_open_data_plane(st, &err) : ep_err_set(&err, "out of memory");
    if (rc == 0)
        rc = exec_load_into(st, s, st->layers, st->n_layers, layers, &p, &c, &files, &err);
    double load_s = p.start > 0 ? clk_mono_s() - p.start : 0;
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
        clk_mono_s() - t0, st->tp ? tpz_endpoint(st->tp) : "nccl (built on COMM_INIT)",
        s->n_members);
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
    ep_err err = {0};
    double t0 = clk_mono_s();
    uint64_t files = 0;
    int rc = layers ? exec_load_into(st, s, st->layers, st->n_layers, layers, &p, &c, &files, &err)
                    : ep_err_set(&err, "out of memory");
    /* steps served between layers count in: the rate is a lower bound */
    double load_s = p.start > 0 ? clk_mono_s() - p.start : 0;
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
             (unsigned long long)s->epoch, clk_mono_s() - t0, c.slots, c.kept, c.slots - c.kept,
             (unsigned long long)p.total, (unsigned long long)st->session->epoch);
    wmx_loaded(st->mx, "staged", p.total, exec_layer_bytes(st->layers, st->n_layers));
    exec_send_ready(st, s, layers, p.total, c, true, load_s);
}

/* EPOCH: validate against the session, adopt the placement, load (or stage). */
void exec_epoch(exec_state *st, const wire_msg *m)
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
void exec_commit(exec_state *st, const wire_msg *m)
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
    if (tpz_set_placement_owned(st->tp, epoch, owned, &err2) != 0)
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
