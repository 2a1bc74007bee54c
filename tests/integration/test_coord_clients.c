/*
 * test_coord_clients.c — the coordinator's part of the serving path (issue 15) against a real
 * epmoe-coordinator process and fake workers (itest.h).
 *
 * Proves: CLIENT_INFO answers the config, its hash, the epochs and, per worker, the client
 * endpoint that worker reported in READY (none before it reported one), and nothing a client
 * does not need; a worker's spec client: endpoint reaches it in WELCOME; data_plane nccl
 * refuses CLIENT_INFO with ERR_NOT_SUPPORTED naming the data plane; libepmoe pointed at
 * coordinator.listen (not the admin endpoint) fails with EPMOE_EREFUSED saying so; with security: a
 * client key (security.client_keys) reads CLIENT_INFO, with each worker's public key (and WELCOME
 * gives every worker the client keys its client endpoint admits, no operator's), but is refused
 * (ERR_REFUSED) for STATUS, DRAIN, SHUTDOWN and FORWARD and cannot register as a worker, an
 * operator key may use CLIENT_INFO too, and a key in no list gets no answer at all; libepmoe opens
 * with the client key (a0, which reported an endpoint, is a ready member; b0 is not) and is refused
 * with the stranger's.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/epmoe.h"
#include "common/auth.h"
#include "itest.h"
#include "test.h"

static const char *coord_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

static const Epmoe__WorkerInfo *find_worker(const Epmoe__AdminReply *r, const char *name)
{
    for (size_t i = 0; r && i < r->n_workers; i++)
        if (r->workers[i]->name && strcmp(r->workers[i]->name, name) == 0)
            return r->workers[i];
    return NULL;
}

TEST(client_info_serves_the_client_endpoints_workers_reported)
{
    it_opts o;
    it_default_opts(&o);
    o.n_workers = 2;
    o.client_endpoints = true;
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_worker *w0 = it_worker_new(t, it_worker_name(t, 0));
    snprintf(w0->client_ep, sizeof w0->client_ep, "tcp://127.0.0.1:45678");
    it_worker *w1 = it_worker_new(t, it_worker_name(t, 1)); /* reports none */
    CHECK_EQ(it_worker_register(t, w0), 0);
    CHECK_EQ(it_worker_register(t, w1), 0);
    CHECK_EQ(it_wait_state(t, "ready", 5000), 0);
    /* the spec's client: reaches the worker in WELCOME */
    char want[160];
    snprintf(want, sizeof want, "ipc://%s/%s.client", t->dir, w0->name);
    CHECK(w0->welcome && w0->welcome->client_endpoint);
    if (w0->welcome && w0->welcome->client_endpoint)
        CHECK_STR_EQ(w0->welcome->client_endpoint, want);
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *st = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(st && st->ok);
    uint64_t hash = st ? st->config_hash : 0;
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO, NULL);
    CHECK(r && r->ok);
    if (r == NULL || !r->ok) {
        FINISH(t);
        return;
    }
    CHECK(r->config && r->config->hidden_size == IT_H && r->config->num_experts_per_tok == IT_K);
    CHECK(r->config && r->config->num_hidden_layers == IT_L &&
          r->config->num_hash_layers == IT_HASH);
    CHECK(r->has_config_hash && r->config_hash == hash);
    CHECK(r->has_epoch && r->epoch == it_epoch(t, 1));
    CHECK(r->has_current_epoch && r->current_epoch == it_epoch(t, 1));
    CHECK(r->has_max_tokens && r->max_tokens == EP_MAX_TOKENS); /* the cluster's, for clients */
    CHECK_STR_EQ(r->state ? r->state : "", "ready");
    CHECK(r->has_cluster_state && r->cluster_state == EPMOE__CLUSTER_STATE__CLUSTER_READY);
    CHECK_EQ(r->n_workers, 2);
    const Epmoe__WorkerInfo *a = find_worker(r, w0->name), *b = find_worker(r, w1->name);
    CHECK(a && b);
    if (a && b) {
        CHECK_STR_EQ(a->client_endpoint ? a->client_endpoint : "", "tcp://127.0.0.1:45678");
        CHECK(b->client_endpoint == NULL);
        CHECK_STR_EQ(a->state ? a->state : "", "ready");
        CHECK(a->has_worker_state && a->worker_state == EPMOE__WORKER_STATE__WORKER_READY);
        CHECK(a->has_member && a->member && a->has_rank && a->rank == 0);
        CHECK(!a->has_public_key); /* no security */
        /* what a client needs, nothing more */
        CHECK(a->data_endpoint == NULL && a->hostname == NULL && !a->has_pid);
    }
    FINISH(t);
}

TEST(client_info_is_refused_on_the_nccl_data_plane)
{
    it_opts o;
    it_default_opts(&o);
    o.n_workers = 2;
    o.nccl = true;
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO, NULL);
    CHECK(r && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_NOT_SUPPORTED);
    if (r && r->error)
        CHECK_STR_HAS(r->error, "not on this data plane (nccl)");
    FINISH(t);
}

TEST(libepmoe_on_a_non_admin_endpoint_is_erefused)
{
    it_opts o;
    it_default_opts(&o);
    o.n_workers = 1;
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    /* coordinator.listen, the workers' socket: it answers a client's question with an Error */
    epmoe_options lo = EPMOE_OPTIONS_INIT;
    lo.coordinator = t->listen;
    lo.connect_timeout_ms = 3000;
    epmoe_client *lc = NULL;
    epmoe_error lerr;
    CHECK_EQ(epmoe_open(&lo, &lc, &lerr), EPMOE_EREFUSED);
    CHECK_STR_HAS(lerr.message, "not an epmoe coordinator's admin endpoint");
    CHECK_STR_HAS(lerr.message, t->listen);
    CHECK(lc == NULL);
    FINISH(t);
}

static int keygen(const char *dir, const char *sub, const char *name)
{
    char d[256];
    ep_err err;
    snprintf(d, sizeof d, "%s%s%s", dir, sub[0] ? "/" : "", sub);
    mkdir(d, 0700);
    if (auth_keygen(d, name, &err) != 0) {
        printf("  keygen %s/%s: %s\n", d, name, err.msg);
        return -1;
    }
    return 0;
}

static Epmoe__AdminReply *call_worker_verb(itest *t, it_client *c, Epmoe__AdminVerb verb,
                                           const char *worker)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = verb;
    rq.worker = (char *)worker;
    it_send(t, c, &rq, NULL, 0);
    return it_wait(t, c, 5000);
}

static void expect_refused(Epmoe__AdminReply *r, const char *verb)
{
    if (r == NULL || r->ok || r->error_code != EPMOE__ERROR_CODE__ERR_REFUSED)
        TEST_FAIL_AT("%s with a client key: expected ERR_REFUSED, got %s (code %d)", verb,
                     r == NULL ? "no answer"
                     : r->ok   ? "ok"
                               : "an error",
                     r ? (int)r->error_code : -1);
    else
        CHECK_STR_HAS(r->error ? r->error : "", "a client key may only read CLIENT_INFO");
}

/* epmoe_open with the secret key in key_path against t's coordinator. */
static int lib_open(itest *t, const char *dir, const char *key_path, epmoe_client **c,
                    epmoe_error *err)
{
    auth_keypair kp;
    uint8_t server[AUTH_KEY_BYTES];
    char cpub[256], sec[AUTH_Z85_LEN + 1], srv[AUTH_Z85_LEN + 1];
    ep_err e;
    snprintf(cpub, sizeof cpub, "%s/coordinator.pub", dir);
    if (auth_load_secret(key_path, &kp, &e) != 0 || auth_load_public(cpub, server, &e) != 0)
        return -100;
    zmq_z85_encode(sec, kp.sec, AUTH_KEY_BYTES);
    zmq_z85_encode(srv, server, AUTH_KEY_BYTES);
    epmoe_options o = {.size = sizeof o, .version = EPMOE_OPTIONS_VERSION};
    o.coordinator = t->admin;
    o.client_secret_key = sec;
    o.server_key = srv;
    o.connect_timeout_ms = 3000;
    return epmoe_open(&o, c, err);
}

TEST(a_client_key_reads_client_info_and_nothing_else)
{
    if (!auth_available())
        SKIP("this libzmq has no CURVE");
    char dir[] = "/tmp/epmoe_test_clients_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    it_opts o;
    it_default_opts(&o);
    o.n_workers = 2;
    o.keys_dir = dir;
    /* the names it_worker_name gives: a0 on n0, b0 on n1 */
    CHECK(keygen(dir, "", "coordinator") == 0 && keygen(dir, "workers", "a0") == 0 &&
          keygen(dir, "workers", "b0") == 0 && keygen(dir, "ops", "op") == 0 &&
          keygen(dir, "clients", "eng") == 0 && keygen(dir, "", "stranger") == 0);
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    char eng_key[256], stranger_key[256];
    snprintf(eng_key, sizeof eng_key, "%s/clients/eng.key", dir);
    snprintf(stranger_key, sizeof stranger_key, "%s/stranger.key", dir);
    /* a client key cannot register as a worker: ZAP refuses it on coordinator.listen */
    it_worker *impostor = it_worker_new(t, "b0");
    impostor->key = eng_key;
    it_worker_reconnect(t, impostor); /* again, with the client's key */
    CHECK(it_worker_hello(t, impostor) != 0);
    it_client *op = it_client_new(t);
    Epmoe__AdminReply *r = call_worker_verb(t, op, EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL);
    const Epmoe__WorkerInfo *b0 = find_worker(r, "b0");
    CHECK(b0 && b0->state && strcmp(b0->state, "absent") == 0);
    /* the real workers */
    it_worker *wa = it_worker_new(t, "a0"), *wb = it_worker_new(t, "b0");
    snprintf(wa->client_ep, sizeof wa->client_ep, "tcp://127.0.0.1:45001");
    CHECK_EQ(it_worker_register(t, wa), 0);
    CHECK_EQ(it_worker_register(t, wb), 0);
    CHECK_EQ(it_wait_state(t, "ready", 5000), 0);
    /* WELCOME tells each worker the keys its client endpoint admits: the client's only (with
     * security.client_keys an operator key is no client there: issue 26) */
    uint8_t eng_pub[AUTH_KEY_BYTES], op_pub[AUTH_KEY_BYTES];
    char kpath[256];
    ep_err perr;
    snprintf(kpath, sizeof kpath, "%s/clients/eng.pub", dir);
    CHECK(auth_load_public(kpath, eng_pub, &perr) == 0);
    snprintf(kpath, sizeof kpath, "%s/ops/op.pub", dir);
    CHECK(auth_load_public(kpath, op_pub, &perr) == 0);
    const Epmoe__Welcome *wl = wa->welcome;
    CHECK(wl && wl->n_client_keys == 1);
    for (size_t i = 0; wl && i < wl->n_client_keys; i++)
        CHECK(wl->client_keys[i].len == AUTH_KEY_BYTES &&
              memcmp(wl->client_keys[i].data, op_pub, AUTH_KEY_BYTES) != 0);
    if (wl && wl->n_client_keys == 1)
        CHECK(memcmp(wl->client_keys[0].data, eng_pub, AUTH_KEY_BYTES) == 0);
    /* an operator key may use CLIENT_INFO too */
    r = it_call(t, op, EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO, NULL);
    CHECK(r && r->ok);
    /* the client key: CLIENT_INFO with each worker's public key */
    it_client *eng = it_client_new_key(t, eng_key);
    r = it_call(t, eng, EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO, NULL);
    CHECK(r && r->ok && r->n_workers == 2);
    const char *names[2] = {"a0", "b0"};
    for (int i = 0; r && r->ok && i < 2; i++) {
        const Epmoe__WorkerInfo *w = find_worker(r, names[i]);
        char pub_path[256];
        uint8_t pub[AUTH_KEY_BYTES];
        ep_err err;
        snprintf(pub_path, sizeof pub_path, "%s/workers/%s.pub", dir, names[i]);
        CHECK(auth_load_public(pub_path, pub, &err) == 0);
        CHECK(w && w->has_public_key && w->public_key.len == AUTH_KEY_BYTES);
        if (w && w->has_public_key && w->public_key.len == AUTH_KEY_BYTES)
            CHECK(memcmp(w->public_key.data, pub, AUTH_KEY_BYTES) == 0);
    }
    const Epmoe__WorkerInfo *a0 = find_worker(r, "a0");
    CHECK(a0 && a0->client_endpoint && strcmp(a0->client_endpoint, "tcp://127.0.0.1:45001") == 0);
    /* ... and nothing else */
    expect_refused(it_call(t, eng, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL), "STATUS");
    expect_refused(it_call(t, eng, EPMOE__ADMIN_VERB__ADMIN_CONFIG, NULL), "CONFIG");
    expect_refused(call_worker_verb(t, eng, EPMOE__ADMIN_VERB__ADMIN_DRAIN, "a0"), "DRAIN");
    expect_refused(it_call(t, eng, EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN, NULL), "SHUTDOWN");
    uint16_t hidden[IT_H] = {0};
    Epmoe__AdminRequest fw = EPMOE__ADMIN_REQUEST__INIT;
    fw.has_verb = fw.has_n_tokens = 1;
    fw.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    fw.layer = "layers.2";
    fw.n_tokens = 1;
    wire_payload p = {.data = hidden, .len = sizeof hidden};
    it_send(t, eng, &fw, &p, 1);
    expect_refused(it_wait(t, eng, 5000), "FORWARD");
    /* nothing changed: still ready, nobody drained */
    CHECK_EQ(it_wait_state(t, "ready", 1000), 0);
    r = call_worker_verb(t, op, EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL);
    const Epmoe__WorkerInfo *wi = find_worker(r, "a0");
    CHECK(wi && !(wi->has_drained && wi->drained));
    /* a key in no list gets no answer (ZAP refuses the handshake) */
    it_client *stranger = it_client_new_key(t, stranger_key);
    CHECK(it_call(t, stranger, EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO, NULL) == NULL);
    /* libepmoe with the client key opens; with the stranger's it is refused, saying so */
    epmoe_client *lc = NULL;
    epmoe_error lerr;
    int rc = lib_open(t, dir, eng_key, &lc, &lerr);
    CHECK_EQ(rc, EPMOE_OK);
    if (rc != EPMOE_OK)
        printf("  epmoe_open with the client key: %s\n", lerr.message);
    epmoe_info info;
    CHECK(lc && epmoe_info_get(lc, &info, NULL) == 0 && info.n_members == 2);
    epmoe_member m[2];
    uint32_t nm = 0;
    CHECK(lc && epmoe_info_members(lc, m, 2, &nm, NULL) == 0 && nm == 2);
    CHECK(lc && info.hidden_size == IT_H && m[0].ready && !m[1].ready);
    epmoe_close(&lc);
    rc = lib_open(t, dir, stranger_key, &lc, &lerr);
    CHECK_EQ(rc, EPMOE_EREFUSED);
    CHECK_STR_HAS(lerr.message, "refused this process's key");
    CHECK(lc == NULL);
    FINISH(t);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ(system(cmd), 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/epmoe-coordinator\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    RUN(client_info_serves_the_client_endpoints_workers_reported);
    RUN(client_info_is_refused_on_the_nccl_data_plane);
    RUN(libepmoe_on_a_non_admin_endpoint_is_erefused);
    RUN(a_client_key_reads_client_info_and_nothing_else);
    return test_report();
}
