/*
 * test_coord_lifecycle.c — the real epmoe-coordinator against fake workers and admin clients:
 * registration, the config handshake, liveness, the admin verbs, startup errors and stopping.
 *
 * Proves: every spec worker registering moves the cluster forming -> loading -> ready; WELCOME
 * carries the rank, world size, epoch, config and placement the spec implies; an unknown name
 * gets ERR_UNKNOWN_WORKER naming the spec's workers and the daemon keeps serving; a wrong config
 * hash gets ERR_CONFIG_HASH naming both hashes and no LOAD; STATUS, WORKERS, SHARDS and CONFIG
 * answer what the test computes from its own spec and config.json; a silent worker is declared
 * dead, its experts move to the others in epoch 2 and come back in epoch 3 when it registers
 * again; a worker whose shard fails is replaced the same way; a restarted worker (a new
 * connection) is welcomed again, and so is a new connection of the same process (routing id
 * NAME/random/N) while its old one is open, but not one of another process; SHUTDOWN and SIGTERM
 * stop the daemon with exit 0 after sending SHUTDOWN to the workers; spec and config errors exit 78
 * with file:line:column messages.
 *
 * Usage: test_coord_lifecycle PATH/epmoe-coordinator
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "test.h"

static const char *coord_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

static itest *start(void)
{
    it_opts o;
    it_default_opts(&o);
    return it_start(coord_bin, &o);
}

/* The same on data_plane nccl: where the coordinator's FORWARD (a collective step) lives on. */
static itest *start_nccl(void)
{
    it_opts o;
    it_default_opts(&o);
    o.nccl = true;
    return it_start(coord_bin, &o);
}

TEST(all_workers_register_cluster_ready)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->state && strcmp(r->state, "forming") == 0);
    /* register three of four: still forming */
    for (int k = 0; k < 3; k++)
        CHECK_EQ(it_worker_register(t, it_worker_new(t, it_worker_name(t, k))), 0);
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->state && strcmp(r->state, "forming") == 0);
    /* the fourth welcomed but not loaded: loading */
    it_worker *last = it_worker_new(t, it_worker_name(t, 3));
    Epmoe__Register reg = EPMOE__REGISTER__INIT;
    reg.name = last->name;
    it_worker_send(last, EPMOE__MSG_TYPE__MSG_REGISTER, &reg.base);
    CHECK_EQ(it_wait_state(t, "loading", 3000), 0);
    CHECK_EQ(it_worker_register(t, last), 0);
    CHECK_EQ(it_wait_state(t, "ready", 3000), 0);
    /* WELCOME contents, from the spec: ranks in order, contiguous experts */
    for (int k = 0; k < t->n_w; k++) {
        it_worker *w = t->w[k];
        CHECK(w->welcome != NULL);
        if (w->welcome == NULL)
            continue;
        CHECK_EQ(w->rank, k);
        CHECK_EQ(w->world_size, 4);
        CHECK_EQ(w->epoch, it_epoch(t, 1));
        CHECK_EQ(w->welcome->n_expert_owner, IT_E);
        for (int e = 0; e < IT_E && w->welcome->n_expert_owner == IT_E; e++)
            CHECK_EQ(w->welcome->expert_owner[e], e / (IT_E / 4));
        CHECK_EQ(w->welcome->n_peers, 4);
        CHECK_EQ(w->config_hash, mc_hash(&t->cfg));
        CHECK(w->welcome->data_endpoint &&
              strncmp(w->welcome->data_endpoint, "tcp://127.0.0.1:", 16) == 0);
        CHECK(w->welcome->heartbeat_ms == 100 && w->welcome->liveness == 5);
        CHECK_STR_EQ(w->welcome->device, "cpu");
        CHECK_EQ(w->welcome->dispatch, EPMOE__DISPATCH_FORMAT__DISPATCH_FP8);
        for (size_t p = 0; p < w->welcome->n_peers; p++) {
            CHECK_EQ(w->welcome->peers[p]->rank, p);
            CHECK_STR_EQ(w->welcome->peers[p]->name, it_worker_name(t, (int)p));
        }
    }
    /* heartbeats flow to registered workers */
    it_pump(t, 350);
    for (int k = 0; k < t->n_w; k++)
        CHECK(t->w[k]->n_heartbeats >= 2);
    FINISH(t);
}

TEST(unknown_worker_is_refused_and_daemon_serves_on)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_worker *z = it_worker_new(t, "zz");
    CHECK(it_worker_register(t, z) != 0);
    CHECK_EQ(z->last_error_code, EPMOE__ERROR_CODE__ERR_UNKNOWN_WORKER);
    CHECK_STR_HAS(z->last_error, "worker \"zz\" is not in cluster spec");
    CHECK_STR_HAS(z->last_error, t->spec_path);
    CHECK_STR_HAS(z->last_error, "(workers: a0, a1, b0, b1)");
    CHECK_EQ(it_register_all(t), 0);
    FINISH(t);
}

TEST(config_hash_mismatch_gets_no_load)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_worker *w = it_worker_new(t, "a1");
    Epmoe__Register reg = EPMOE__REGISTER__INIT;
    reg.name = "a1";
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_REGISTER, &reg.base);
    it_pump(t, 200);
    CHECK(w->welcomed);
    uint64_t bad = mc_hash(&t->cfg) ^ 0x1;
    Epmoe__ConfigAck a = EPMOE__CONFIG_ACK__INIT;
    a.has_config_hash = 1;
    a.config_hash = bad;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_CONFIG_ACK, &a.base);
    it_pump(t, 300);
    CHECK(!w->loaded);
    CHECK_EQ(w->last_error_code, EPMOE__ERROR_CODE__ERR_CONFIG_HASH);
    char hx[32];
    snprintf(hx, sizeof hx, "0x%016" PRIx64, bad);
    CHECK_STR_HAS(w->last_error, hx);
    snprintf(hx, sizeof hx, "0x%016" PRIx64, mc_hash(&t->cfg));
    CHECK_STR_HAS(w->last_error, hx);
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL);
    CHECK(r && r->n_workers == 4);
    if (r && r->n_workers == 4) {
        CHECK_STR_EQ(r->workers[1]->state, "welcomed");
        CHECK(r->workers[1]->error != NULL);
        if (r->workers[1]->error)
            CHECK_STR_HAS(r->workers[1]->error, "config hash mismatch");
    }
    /* READY without LOAD is refused too */
    Epmoe__Ready rd = EPMOE__READY__INIT;
    rd.has_epoch = 1;
    rd.epoch = 1;
    rd.has_config_hash = 1;
    rd.config_hash = mc_hash(&t->cfg);
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_READY, &rd.base);
    it_pump(t, 200);
    CHECK_EQ(w->last_error_code, EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(w->last_error, "READY in state welcomed");
    FINISH(t);
}

TEST(admin_verbs_answer_from_spec_and_config)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    it_client *c = it_client_new(t);
    char model[256];
    snprintf(model, sizeof model, "%s/model", t->dir);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r != NULL);
    if (r) {
        CHECK(r->ok);
        CHECK_EQ(r->id, c->want_id);
        CHECK_STR_EQ(r->cluster, "itest");
        CHECK_STR_EQ(r->state, "ready");
        CHECK_EQ(r->epoch, it_epoch(t, 1));
        CHECK_EQ(r->config_hash, mc_hash(&t->cfg));
        CHECK(r->model_path && strstr(r->model_path, "/model") != NULL);
        CHECK_EQ(r->steps_done, 0);
        CHECK_EQ(r->n_workers, 4);
        static const char *nodes[] = {"n0", "n0", "n1", "n1"};
        for (size_t k = 0; k < r->n_workers && r->n_workers == 4; k++) {
            CHECK_STR_EQ(r->workers[k]->name, it_worker_name(t, (int)k));
            CHECK_EQ(r->workers[k]->rank, k);
            CHECK_STR_EQ(r->workers[k]->node, nodes[k]);
            CHECK_STR_EQ(r->workers[k]->state, "ready");
            CHECK_STR_EQ(r->workers[k]->device, "cpu");
            CHECK(r->workers[k]->has_last_seen_ms && r->workers[k]->last_seen_ms < 1000);
            CHECK_EQ(r->workers[k]->bytes_total, 100);
            CHECK_EQ(r->workers[k]->n_experts, IT_E / 4);
            CHECK_STR_EQ(r->workers[k]->backend, "fake");
            CHECK_STR_EQ(r->workers[k]->hostname, "itest");
        }
    }
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL);
    CHECK(r && r->ok && r->n_workers == 4 && r->workers[3]->data_endpoint != NULL);
    /* SHARDS: contiguous, E/P experts per rank, the same for any layer */
    const char *layers[][2] = {{NULL, NULL},
                               {"2", "layers.2"},
                               {"layers.3", "layers.3"},
                               {"mtp.0", "mtp.0"},
                               {"4", "mtp.0"}};
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
        r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_SHARDS, layers[li][0]);
        CHECK(r && r->ok);
        if (r == NULL || !r->ok)
            continue;
        CHECK_STR_EQ(r->placement, "contiguous");
        if (layers[li][1])
            CHECK(r->layer && strcmp(r->layer, layers[li][1]) == 0);
        else
            CHECK(r->layer == NULL);
        CHECK_EQ(r->n_shards, 4);
        for (size_t k = 0; k < r->n_shards && r->n_shards == 4; k++) {
            CHECK_EQ(r->shards[k]->rank, k);
            CHECK_STR_EQ(r->shards[k]->worker, it_worker_name(t, (int)k));
            CHECK_EQ(r->shards[k]->n_experts, IT_E / 4);
            for (size_t e = 0; e < r->shards[k]->n_experts && r->shards[k]->n_experts == 2; e++)
                CHECK_EQ(r->shards[k]->experts[e], k * (IT_E / 4) + e);
        }
    }
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_SHARDS, "layers.9");
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    if (r && r->error) {
        CHECK_STR_HAS(r->error, "layers.9");
        CHECK_STR_HAS(r->error, "layers.0..layers.3");
    }
    /* CONFIG: the config.json the test wrote, resolved */
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_CONFIG, NULL);
    CHECK(r && r->ok && r->config != NULL);
    if (r && r->config) {
        Epmoe__ModelConfig *m = r->config;
        CHECK_EQ(m->hidden_size, IT_H);
        CHECK_EQ(m->n_routed_experts, IT_E);
        CHECK_EQ(m->num_experts_per_tok, IT_K);
        CHECK_EQ(m->num_hidden_layers, IT_L);
        CHECK_EQ(m->num_hash_layers, IT_HASH);
        CHECK_EQ(m->num_nextn_predict_layers, IT_MTP);
        CHECK_EQ(m->vocab_size, IT_VOCAB);
        CHECK(m->routed_scaling_factor == 1.5f);
        CHECK_EQ(m->expert_dtype, EPMOE__EXPERT_DTYPE__EXPERT_FP8);
        CHECK(m->has_expert_dtype_given && m->expert_dtype_given);
        CHECK(m->has_scale_e8m0 && !m->scale_e8m0); /* fp8: F32 scales everywhere */
        CHECK_EQ(r->config_hash, mc_hash(&t->cfg));
        CHECK(r->model_path && strstr(r->model_path, "model") != NULL);
    }
    /* an unknown verb and an id-less request are answered, not dropped */
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = 99;
    it_send(t, c, &rq, NULL, 0);
    r = it_wait(t, c, 3000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    if (r && r->error)
        CHECK_STR_HAS(r->error, "unknown verb 99");
    wire_payload junk = {.data = "xx", .len = 2};
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_STATUS;
    it_send(t, c, &rq, &junk, 1);
    r = it_wait(t, c, 3000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    FINISH(t);
}

TEST(silent_worker_dies_and_comes_back)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    it_worker *w = t->w[2];
    w->behaviour = IT_MUTE;
    int64_t t0 = it_now_ms();
    /* the survivors take its experts over in epoch 2 */
    CHECK_EQ(it_wait_epoch(t, it_epoch(t, 2), "ready", 3000), 0);
    int64_t took = it_now_ms() - t0;
    CHECK(took >= 400); /* liveness 5 x 100 ms, give or take a tick */
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->n_workers == 4);
    if (r && r->n_workers == 4) {
        CHECK_STR_EQ(r->workers[2]->state, "dead");
        CHECK(r->workers[2]->error && strstr(r->workers[2]->error, "silent for") != NULL);
        CHECK_STR_EQ(r->workers[1]->state, "ready");
        CHECK_EQ(r->workers[2]->n_experts, 0);
        CHECK_EQ(r->workers[0]->n_experts + r->workers[1]->n_experts + r->workers[3]->n_experts,
                 IT_E);
    }
    /* the dead registration: its heartbeats go unanswered (so that a worker relying on its own
     * liveness rule times out and registers again), other messages are refused */
    w->behaviour = IT_OK;
    it_pump(t, 50); /* read what queued up while it was mute */
    int hb0 = w->n_heartbeats;
    w->n_errors = 0;
    Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base);
    it_pump(t, 300);
    CHECK_EQ(w->n_errors, 0);
    CHECK_EQ(w->n_heartbeats, hb0); /* and the coordinator sends it none */
    Epmoe__Loading ld = EPMOE__LOADING__INIT;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_LOADING, &ld.base);
    it_pump(t, 200);
    CHECK_EQ(w->last_error_code, EPMOE__ERROR_CODE__ERR_WORKER_LOST);
    CHECK_STR_HAS(w->last_error, "worker b0 was declared dead: silent for");
    CHECK_STR_HAS(w->last_error, "register again");
    /* an unregistered connection (a worker of a coordinator that was restarted): told to
     * register at its first heartbeat, so it does at once (issue 26), and so are its other
     * messages */
    it_worker *u = it_worker_new(t, "stranger");
    it_worker_send(u, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base);
    it_pump(t, 200);
    CHECK_EQ(u->last_error_code, EPMOE__ERROR_CODE__ERR_NOT_REGISTERED);
    u->last_error_code = 0;
    it_worker_send(u, EPMOE__MSG_TYPE__MSG_LOADING, &ld.base);
    it_pump(t, 200);
    CHECK_EQ(u->last_error_code, EPMOE__ERROR_CODE__ERR_NOT_REGISTERED);
    CHECK_STR_HAS(u->last_error, "send REGISTER first");
    it_worker_reconnect(t, w);
    CHECK_EQ(it_worker_register(t, w), 0);
    /* rejoin: restore (the default) gives it its experts back in epoch 3 */
    CHECK_EQ(it_wait_epoch(t, it_epoch(t, 3), "ready", 3000), 0);
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->n_workers == 4 && r->workers[2]->n_experts == IT_E / 4);
    FINISH(t);
}

TEST(restart_reregisters_and_duplicate_is_refused)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    /* a restarted a1 (its old connection closed, a new one) starts over at welcomed (the
     * coordinator may have noticed the closed connection first and moved its experts: either
     * way it is welcomed again) */
    it_worker *w = t->w[1];
    it_worker_reconnect(t, w);
    Epmoe__Register reg = EPMOE__REGISTER__INIT;
    reg.name = "a1";
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_REGISTER, &reg.base);
    for (int i = 0; i < 150 && !w->welcomed; i++)
        it_pump(t, 20);
    CHECK(w->welcomed);
    CHECK_EQ(it_worker_register(t, w), 0);
    CHECK_EQ(it_wait_state(t, "ready", 3000), 0);
    /* a second process claiming b0 while b0's connection is open: refused, for good */
    it_worker *dup = it_worker_new(t, "b0-impostor");
    Epmoe__Register r2 = EPMOE__REGISTER__INIT;
    r2.name = "b0";
    it_worker_send(dup, EPMOE__MSG_TYPE__MSG_REGISTER, &r2.base);
    it_pump(t, 200);
    CHECK_EQ(dup->last_error_code, EPMOE__ERROR_CODE__ERR_DUPLICATE);
    CHECK_STR_HAS(dup->last_error, "registered from another connection that is still open");
    /* a device other than the spec's is refused for good (the worker exits 78), naming the
     * spec line */
    it_worker *dev = it_worker_new(t, "x");
    Epmoe__Register r3 = EPMOE__REGISTER__INIT;
    r3.name = "b1";
    r3.device = "cuda:0";
    it_worker_send(dev, EPMOE__MSG_TYPE__MSG_REGISTER, &r3.base);
    it_pump(t, 200);
    CHECK_EQ(dev->last_error_code, EPMOE__ERROR_CODE__ERR_REFUSED);
    CHECK_STR_HAS(dev->last_error, "cluster.yaml:");
    CHECK_STR_HAS(dev->last_error, "assigns \"cpu\"");
    CHECK_EQ(it_wait_state(t, "ready", 1000), 0);
    FINISH(t);
}

/* A DEALER to the worker socket with routing id ident, and REGISTER name on it. */
static void *register_as(itest *t, const char *ident, const char *name)
{
    void *s = it_raw_dealer(t, t->listen, ident);
    Epmoe__Register r = EPMOE__REGISTER__INIT;
    r.name = (char *)name;
    wire_send(s, NULL, 0, EPMOE__MSG_TYPE__MSG_REGISTER, &r.base, NULL, 0, false, NULL);
    return s;
}

/* The answer to a REGISTER on s: WELCOME (returns 0), an Error (returns its code), or -1 when
 * neither came within 3 s. */
static int register_answer(itest *t, void *s)
{
    int64_t end = it_now_ms() + 3000;
    int code = -1, type = 0;
    char msg[512];
    while (type >= 0 && it_now_ms() < end) {
        type = it_raw_recv(t, s, (int)(end - it_now_ms()), &code, msg, sizeof msg);
        if (type == EPMOE__MSG_TYPE__MSG_WELCOME)
            return 0;
        if (type == EPMOE__MSG_TYPE__MSG_ERROR)
            return code;
    }
    return -1;
}

/* epmoe-worker's routing ids are NAME/random/N: a new connection of the same process (a
 * reconnect after a silence, its old connection still open at the coordinator) takes its
 * worker over; another process (another random part) is a duplicate while the first is
 * connected. The coordinator has no ROUTER_HANDOVER, so a reconnect is never a routing id
 * taken over: without the process rule the reconnect would be refused as a duplicate. */
TEST(a_reconnect_of_the_same_process_is_no_duplicate)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    void *first = register_as(t, "a0/0badcafe/1", "a0");
    CHECK_EQ(register_answer(t, first), 0);
    void *again = register_as(t, "a0/0badcafe/2", "a0");
    CHECK_EQ(register_answer(t, again), 0);
    void *other = register_as(t, "a0/12345678/1", "a0");
    CHECK_EQ(register_answer(t, other), EPMOE__ERROR_CODE__ERR_DUPLICATE);
    /* a routing id of another form is a process of its own */
    void *plain = register_as(t, "a0/0badcafe", "a0");
    CHECK_EQ(register_answer(t, plain), EPMOE__ERROR_CODE__ERR_DUPLICATE);
    zmq_close(first);
    zmq_close(again);
    zmq_close(other);
    zmq_close(plain);
    FINISH(t);
}

TEST(load_failure_is_visible)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    Epmoe__Error e = EPMOE__ERROR__INIT;
    e.has_code = 1;
    e.code = EPMOE__ERROR_CODE__ERR_LOAD_FAILED;
    e.message = "layers.0.ffn.experts.2.w1.weight: expected I8 [128, 64], found F8_E4M3";
    it_worker_send(t->w[1], EPMOE__MSG_TYPE__MSG_ERROR, &e.base);
    /* it can no longer serve its experts: the others take them over in epoch 2 */
    CHECK_EQ(it_wait_epoch(t, it_epoch(t, 2), "ready", 2000), 0);
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->n_workers == 4);
    if (r && r->n_workers == 4) {
        CHECK_STR_EQ(r->workers[1]->state, "load-failed");
        CHECK(r->workers[1]->error && strstr(r->workers[1]->error, "w1.weight") != NULL);
    }
    FINISH(t);
}

TEST(admin_shutdown_stops_workers_and_exits_0)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN, NULL);
    CHECK(r && r->ok);
    it_pump(t, 300);
    for (int k = 0; k < t->n_w; k++)
        CHECK_EQ(t->w[k]->n_shutdowns, 1);
    CHECK_EQ(it_wait_exit(t, 5000), 0);
    FINISH(t);
}

TEST(sigterm_answers_queued_work_and_exits_0)
{
    itest *t = start_nccl();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    t->w[0]->behaviour = IT_HOLD;
    it_client *c = it_client_new(t);
    static uint16_t hidden[4 * IT_H];
    it_make_input(4, 1, hidden, NULL);
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.2";
    rq.has_n_tokens = 1;
    rq.n_tokens = 4;
    wire_payload p = {.data = hidden, .len = sizeof hidden};
    it_send(t, c, &rq, &p, 1);
    it_pump(t, 100);
    int64_t t0 = it_now_ms();
    kill(t->pid, SIGTERM);
    Epmoe__AdminReply *r = it_wait(t, c, 3000);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN);
    CHECK_EQ(it_wait_exit(t, 5000), 0);
    CHECK(it_now_ms() - t0 < 2000);
    it_pump(t, 50);
    for (int k = 0; k < t->n_w; k++)
        CHECK_EQ(t->w[k]->n_shutdowns, 1);
    FINISH(t);
}

/* Run the coordinator on a spec; returns its exit code and its stderr in err. */
static int run_coord(const char *spec, char *err, size_t cap)
{
    char path[] = "/tmp/epmoe-itest-errXXXXXX";
    int fd = mkstemp(path);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        dup2(fd, 1);
        execl(coord_bin, coord_bin, "--cluster", spec, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    ssize_t n = pread(fd, err, cap - 1, 0);
    err[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(busy_ports_exit_69_and_sighup_reloads_an_unchanged_spec)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    char err[8192];
    CHECK_EQ(run_coord(t->spec_path, err, sizeof err), 69);
    CHECK_STR_HAS(err, "cluster.yaml:4:11: coordinator.listen: cannot bind tcp://127.0.0.1:");
    CHECK_STR_HAS(err, "Address already in use");
    /* SIGHUP reloads the spec; unchanged, nothing moves and the daemon serves on */
    kill(t->pid, SIGHUP);
    it_pump(t, 100);
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->ok && r->epoch == it_epoch(t, 1));
    FINISH(t);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

TEST(startup_errors_exit_78_with_position)
{
    char dir[] = "/tmp/epmoe-itest-cfgXXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char spec[128], model[128], cfg[160], err[8192];
    snprintf(spec, sizeof spec, "%s/bad.yaml", dir);
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(cfg, sizeof cfg, "%s/m/config.json", dir);
    mkdir(model, 0700);
    /* a spec error: the loader's file:line:column message, exit 78 */
    write_file(spec, "cluster:\n  name: x\ncoordinator:\n  listn: \"tcp://127.0.0.1:1\"\n");
    CHECK_EQ(run_coord(spec, err, sizeof err), 78);
    CHECK_STR_HAS(err, "bad.yaml:4:3: unknown key \"listn\" in coordinator");
    /* a missing config.json */
    const char *good =
        "cluster: {name: x}\n"
        "coordinator: {listen: \"tcp://127.0.0.1:1\", admin: \"tcp://127.0.0.1:2\"}\n"
        "model: {path: m}\n"
        "nodes:\n"
        "  - name: n\n"
        "    workers:\n"
        "      - {name: w0, device: cpu, data: \"tcp://127.0.0.1:3\"}\n"
        "      - {name: w1, device: cpu, data: \"tcp://127.0.0.1:4\"}\n"
        "      - {name: w2, device: cpu, data: \"tcp://127.0.0.1:5\"}\n";
    write_file(spec, good);
    CHECK_EQ(run_coord(spec, err, sizeof err), 78);
    CHECK_STR_HAS(err, "config.json");
    /* a bad config.json: the field */
    write_file(cfg, "{\"hidden_size\": 100}");
    CHECK_EQ(run_coord(spec, err, sizeof err), 78);
    CHECK_STR_HAS(err, "hidden_size");
    /* 3 workers cannot split 8 experts contiguously: points at nodes: (line 4, column 1) */
    write_file(cfg,
               "{\"hidden_size\": 128, \"moe_intermediate_size\": 128, \"n_routed_experts\": 8, "
               "\"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, "
               "\"num_hash_layers\": 0, \"vocab_size\": 10, \"routed_scaling_factor\": 1.5, "
               "\"swiglu_limit\": 10, \"rms_norm_eps\": 1e-6, \"scoring_func\": \"sqrtsoftplus\"}");
    CHECK_EQ(run_coord(spec, err, sizeof err), 78);
    CHECK_STR_HAS(err, "bad.yaml:4:1: nodes: 3 workers do not divide the model's 8 experts");
    /* --check on a good setup prints the placement and exits 0 */
    {
        char path[] = "/tmp/epmoe-itest-chkXXXXXX";
        int fd = mkstemp(path);
        write_file(spec,
                   "cluster: {name: x}\n"
                   "coordinator: {listen: \"tcp://127.0.0.1:1\", admin: \"tcp://127.0.0.1:2\"}\n"
                   "model: {path: m}\n"
                   "nodes:\n"
                   "  - name: n\n"
                   "    workers:\n"
                   "      - {name: w0, device: cpu, data: \"tcp://127.0.0.1:3\"}\n"
                   "      - {name: w1, device: cpu, data: \"tcp://127.0.0.1:4\"}\n");
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fd, 1);
            execl(coord_bin, coord_bin, "--cluster", spec, "--check", (char *)NULL);
            _exit(127);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        ssize_t n = pread(fd, err, sizeof err - 1, 0);
        err[n > 0 ? n : 0] = '\0';
        close(fd);
        unlink(path);
        CHECK_STR_HAS(err, "expert_dtype fp4 (defaulted");
        CHECK_STR_HAS(err, "w1");
        CHECK_STR_HAS(err, "4-7");
        CHECK_STR_HAS(err, "config hash 0x");
    }
    unlink(cfg);
    unlink(spec);
    rmdir(model);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/epmoe-coordinator\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    RUN(all_workers_register_cluster_ready);
    RUN(unknown_worker_is_refused_and_daemon_serves_on);
    RUN(config_hash_mismatch_gets_no_load);
    RUN(admin_verbs_answer_from_spec_and_config);
    RUN(silent_worker_dies_and_comes_back);
    RUN(restart_reregisters_and_duplicate_is_refused);
    RUN(a_reconnect_of_the_same_process_is_no_duplicate);
    RUN(load_failure_is_visible);
    RUN(admin_shutdown_stops_workers_and_exits_0);
    RUN(sigterm_answers_queued_work_and_exits_0);
    RUN(startup_errors_exit_78_with_position);
    RUN(busy_ports_exit_69_and_sighup_reloads_an_unchanged_spec);
    return test_report();
}
