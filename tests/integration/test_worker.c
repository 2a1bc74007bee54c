/*
 * test_worker.c — real epmoe-worker processes against a fake coordinator in this test (a ROUTER
 * speaking wire.h), on tcp loopback, with checkpoints written by tests/unit/moe_gen.c.
 *
 * Proves:
 *  - registration (REGISTER fields), WELCOME -> CONFIG_ACK with the worker's own mc_hash, LOAD ->
 *    LOADING progress (monotonic, ending at the total) -> READY (epoch, hash, expert count);
 *  - STEP on 1, 2, 3 and 4 workers, tokens split like the coordinator splits them, reassembles
 *    to exactly (bit for bit) what moe_forward computes in this process over the whole batch,
 *    for T = 1, 7, 64, 300, fp4 and fp8 checkpoints, hash, score and MTP layers, dispatch fp8
 *    and bf16 (a second WELCOME switches the format: re-welcome and reload work), contiguous and
 *    round-robin placements; expert token counts add up to T x k;
 *  - a WELCOME whose hash the coordinator misstates: the worker acks its true hash, and after
 *    ERR_CONFIG_HASH exits 78; ERR_UNKNOWN_WORKER exits 78; an invalid WELCOME is answered
 *    ERR_BAD_REQUEST naming the field;
 *  - a checkpoint missing an expert tensor, and one of the other expert dtype: Error
 *    ERR_LOAD_FAILED naming the tensor, the worker stays up (STEP -> ERR_NOT_READY);
 *  - STEP_ABORT while a step waits for a peer -> STEP_FAILED; a step that outlives
 *    step_timeout_ms fails naming the peer not heard from; the next step is bit-exact;
 *  - garbage sent to a worker's data endpoint is ignored and the next step is bit-exact;
 *  - SIGTERM -> exit 0; SHUTDOWN -> exit 0; a silent coordinator -> the worker registers again;
 *  - --coordinator that is no endpoint (or port 99999) and a secret key others may read exit
 *    64 naming the option; Error{ERR_REFUSED} and Error{ERR_DUPLICATE} exit 78; a worker whose
 *    key the coordinator's ZAP handler refuses exits 78 saying so;
 *  - a forged COMBINE for the next step (with or without the session id) never changes a
 *    result; 64 stray DISPATCHes for future steps never block a later step; a worker killed and
 *    restarted while its peer queued DISPATCHes of 20 aborted steps for it runs its first step
 *    at once and exactly (each of these failed before the session, slots and grants); a worker
 *    away for 10,000 steps, whose peer's DISPATCH comes before its own STEP, runs its first
 *    step back at once (before, the DISPATCH was dropped beyond a window of 1,024 steps);
 *  - with the real epmoe-coordinator (cluster spec; requests through libepmoe at the workers'
 *    client endpoints): 2 and 3 workers, both
 *    dispatch formats, every layer kind, answers bit-identical to moe_forward; admin SHUTDOWN
 *    stops the coordinator and every worker with exit 0.
 */
#include <arpa/inet.h>
#include <epmoe.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/auth.h"
#include "common/limits.h"
#include "common/model_msg.h"
#include "common/safetensors_model.h"
#include "common/wire.h"
#include "kernels/moe.h"
#include "shard/shard.h"
#include "worker/transport.h"
#include "moe_gen.h"
#include "test.h"
#include "tests/isa_env.h"

#ifndef EPMOE_WORKER_BIN
#error "EPMOE_WORKER_BIN must name the epmoe-worker binary"
#endif
#ifndef EPMOE_COORDINATOR_BIN
#error "EPMOE_COORDINATOR_BIN must name the epmoe-coordinator binary"
#endif

#define MAXP   4
#define NT     300 /* tokens of the largest step */
#define WAIT_S 20  /* seconds any single expected message may take (Asan builds are slow) */

static void *zctx;

/* ---- time, processes --------------------------------------------------------------------------
 */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static pid_t children[64];
static int n_children;

/* The binaries under test; the environment may name others (e.g. an older build, to see a
 * new test fail on the code it was written against). */
static const char *worker_bin(void)
{
    const char *b = getenv("EPMOE_TEST_WORKER_BIN");
    return b && b[0] ? b : EPMOE_WORKER_BIN;
}

static pid_t spawn_worker(const char *endpoint, const char *name)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(worker_bin(), worker_bin(), "--coordinator", endpoint, "--name", name, "--threads",
              "1", (char *)NULL);
        _exit(127);
    }
    if (pid > 0 && n_children < 64)
        children[n_children++] = pid;
    return pid;
}

/* A worker with its own command line after the binary; stderr to log (NULL: inherited). */
static pid_t spawn_worker_argv(const char *const *args, const char *log)
{
    const char *argv[16] = {worker_bin()};
    int n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (log && freopen(log, "w", stderr) == NULL)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (pid > 0 && n_children < 64)
        children[n_children++] = pid;
    return pid;
}

static void forget_child(pid_t pid)
{
    for (int i = 0; i < n_children; i++)
        if (children[i] == pid)
            children[i] = children[--n_children];
}

/* Exit status of pid within timeout_s; -1 on timeout (then it is killed), 128+sig if signalled. */
static int wait_exit(pid_t pid, double timeout_s)
{
    double end = now_s() + timeout_s;
    int st;
    while (now_s() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            forget_child(pid);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    forget_child(pid);
    return -1;
}

static void kill_children(void)
{
    for (int i = 0; i < n_children; i++) {
        kill(children[i], SIGKILL);
        waitpid(children[i], NULL, 0);
    }
    n_children = 0;
}

static bool alive(pid_t pid)
{
    return waitpid(pid, NULL, WNOHANG) == 0;
}

/* A TCP port nobody listens on right now (bound to port 0, read back, closed). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* ---- the fake coordinator ---------------------------------------------------------------------
 */

/* Workers' routing ids are NAME/random (one per process): the fake coordinator keeps the last
 * id each name sent from, and addresses workers by name. */
#define FC_MAX_IDS 16

typedef struct fc {
    void *router;
    char endpoint[128];
    char name[FC_MAX_IDS][64], ident[FC_MAX_IDS][128];
    int n_ids;
} fc;

static const char *fc_ident(const fc *f, const char *who)
{
    for (int i = 0; i < f->n_ids; i++)
        if (strcmp(f->name[i], who) == 0)
            return f->ident[i];
    return who;
}

static void fc_learn(fc *f, const char *who, const char *ident)
{
    int i = 0;
    while (i < f->n_ids && strcmp(f->name[i], who) != 0)
        i++;
    if (i == FC_MAX_IDS)
        return;
    if (i == f->n_ids)
        f->n_ids++;
    snprintf(f->name[i], sizeof f->name[i], "%s", who);
    snprintf(f->ident[i], sizeof f->ident[i], "%s", ident);
}

static void fc_open(fc *f)
{
    memset(f, 0, sizeof *f);
    f->router = zmq_socket(zctx, ZMQ_ROUTER);
    int one = 1;
    wire_socket_defaults(f->router, EP_MAX_DATA_MSG, NULL);
    zmq_setsockopt(f->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    CHECK(zmq_bind(f->router, "tcp://127.0.0.1:*") == 0);
    size_t sz = sizeof f->endpoint;
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &sz);
}

static void fc_close(fc *f)
{
    zmq_close(f->router);
}

static void fc_send(fc *f, const char *who, uint16_t type, const ProtobufCMessage *body,
                    const wire_payload *pl, int n)
{
    ep_err err = {0};
    const char *id = fc_ident(f, who);
    if (wire_send(f->router, (const uint8_t *)id, strlen(id), type, body, pl, n, true, &err))
        TEST_FAIL_AT("sending %s to %s: %s", wire_type_name(type), who, err.msg);
}

/* The next message within timeout_s from anyone; *who gets the sender. 0, or -1 on timeout. */
static int fc_recv(fc *f, double timeout_s, wire_msg *m, char *who, size_t cap)
{
    double end = now_s() + timeout_s;
    for (;;) {
        long ms = (long)((end - now_s()) * 1000);
        if (ms <= 0)
            return -1;
        zmq_pollitem_t it = {.socket = f->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, ms) <= 0)
            continue;
        ep_err err;
        if (wire_recv(f->router, true, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, 0, m, &err) != WIRE_OK) {
            printf("  fake coordinator: %s\n", err.msg);
            continue;
        }
        char ident[128];
        size_t n = m->ident_len < sizeof ident - 1 ? m->ident_len : sizeof ident - 1;
        memcpy(ident, m->ident, n);
        ident[n] = '\0';
        snprintf(who, cap, "%.*s", (int)strcspn(ident, "/"), ident);
        fc_learn(f, who, ident);
        return 0;
    }
}

/* The next message from who of one of the types wanted (HEARTBEAT and LOADING are skipped
 * unless wanted; anything else from anyone is a failure). */
static int fc_expect(fc *f, const char *who, uint16_t type, double timeout_s, wire_msg *m)
{
    double end = now_s() + timeout_s;
    char from[64];
    while (fc_recv(f, end - now_s(), m, from, sizeof from) == 0) {
        if (strcmp(from, who) == 0 && m->type == type)
            return 0;
        bool quiet =
            m->type == EPMOE__MSG_TYPE__MSG_HEARTBEAT || m->type == EPMOE__MSG_TYPE__MSG_LOADING;
        if (!quiet)
            printf("  unexpected %s from %s while waiting for %s from %s\n",
                   wire_type_name(m->type), from, wire_type_name(type), who);
        wire_msg_close(m);
        if (!quiet)
            return -1;
    }
    printf("  timeout waiting for %s from %s\n", wire_type_name(type), who);
    return -1;
}

/* ---- checkpoints and the reference ------------------------------------------------------------
 */

typedef struct fixture {
    mc_config c;
    gen_model *g;
    char dir[64];
    st_model *m;
    moe_layer *layers[8]; /* every expert: the one-process reference */
    int n_layers;
    uint16_t *x;  /* bf16 [NT, H] */
    int64_t *ids; /* [NT] */
} fixture;

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); /* RNE; inputs are finite */
}

/* H 256, I 256, E 8, top-4, layers: 0 hash, 1 score, 2 MTP (score). fp8: F32 activation scales,
 * so the fp8 dispatch carries f32 scales there and e8m0 scales with fp4. */
static int fixture_init(fixture *f, mc_expert_dtype dt, int experts_made, bool reference)
{
    memset(f, 0, sizeof *f);
    f->c = gen_config(dt, 256, 256, 8, 4, 1000);
    f->c.num_hidden_layers = 2;
    if (dt == MC_FP8)
        f->c.act_ue8m0 = false;
    ep_err err = {0};
    if (mc_validate(&f->c, &err) != 0) {
        printf("  config: %s\n", err.msg);
        return -1;
    }
    gen_opts o = {.seed = dt == MC_FP4 ? 21 : 22, .experts_made = experts_made};
    f->g = gen_model_create(&f->c, &o);
    snprintf(f->dir, sizeof f->dir, "/tmp/epmoe_test_worker_XXXXXX");
    if (!mkdtemp(f->dir) || gen_model_write(f->g, f->dir, &err) != 0 ||
        !(f->m = st_model_open(f->dir, &err))) {
        printf("  writing the checkpoint: %s\n", err.msg);
        return -1;
    }
    f->n_layers = mc_num_layers(&f->c);
    for (int l = 0; reference && l < f->n_layers; l++)
        if (!(f->layers[l] = shard_load_moe_layer(f->m, &f->c, l, NULL, ISA_AUTO, &err))) {
            printf("  reference layer %d: %s\n", l, err.msg);
            return -1;
        }
    int H = f->c.hidden_size;
    f->x = malloc((size_t)NT * H * 2);
    f->ids = malloc(NT * sizeof *f->ids);
    uint64_t rs = 1234 + dt;
    for (int t = 0; t < NT; t++) {
        double amp = t % 17 == 3 ? 300.0 : t % 23 == 5 ? 1e-3 : 1.7;
        for (int i = 0; i < H; i++)
            f->x[(size_t)t * H + i] = bf16_of((float)(amp * gen_unit(&rs)));
        f->ids[t] = (int64_t)(gen_rand(&rs) % (uint64_t)f->c.vocab_size);
    }
    return 0;
}

static void fixture_free(fixture *f)
{
    for (int l = 0; l < f->n_layers; l++)
        moe_layer_free(&f->layers[l]);
    st_model_close(&f->m);
    gen_model_free(&f->g);
    if (f->dir[0])
        gen_model_remove(f->dir);
    free(f->x);
    free(f->ids);
}

typedef struct outs {
    uint16_t *out;
    int32_t *ids;
    float *w;
} outs;

static outs outs_new(const mc_config *c, int T)
{
    outs o = {calloc((size_t)T * c->hidden_size + 1, 2),
              calloc((size_t)T * c->num_experts_per_tok + 1, 4),
              calloc((size_t)T * c->num_experts_per_tok + 1, 4)};
    return o;
}

static void outs_free(outs *o)
{
    free(o->out);
    free(o->ids);
    free(o->w);
}

/* ---- a cluster of workers ---------------------------------------------------------------------
 */

typedef struct cluster {
    fc f;
    int P;
    pid_t pid[MAXP];
    char name[MAXP][16];
    char data_ep[MAXP][64];
    uint32_t owner[64];
    uint64_t epoch;
    uint64_t step_id;
    uint64_t session;
    int stagger_ms; /* run_step: the pause between the STEPs of consecutive ranks */
} cluster;

typedef struct welcome_opts {
    tp_format dispatch;
    bool round_robin;
    uint64_t hash_delta; /* added to the true hash: a coordinator that misstates it */
    int heartbeat_ms, liveness, step_timeout_ms;
    const mc_config *config; /* NULL: the fixture's */
    int owner_count_delta;   /* != 0: a broken expert_owner table */
} welcome_opts;

static int cluster_register(cluster *cl, int P)
{
    memset(cl, 0, sizeof *cl);
    fc_open(&cl->f);
    cl->P = P;
    cl->session = 0xC0FFEE0000000000ull ^ (uint64_t)getpid() << 8 ^ (uint64_t)P;
    for (int r = 0; r < P; r++) {
        snprintf(cl->name[r], sizeof cl->name[r], "w%d", r);
        snprintf(cl->data_ep[r], sizeof cl->data_ep[r], "tcp://127.0.0.1:%d", free_port());
        cl->pid[r] = spawn_worker(cl->f.endpoint, cl->name[r]);
    }
    bool seen[MAXP] = {false};
    for (int n = 0; n < P; n++) {
        wire_msg m;
        char who[64];
        if (fc_recv(&cl->f, WAIT_S, &m, who, sizeof who) != 0) {
            printf("  timeout waiting for REGISTER (%d of %d)\n", n, P);
            return -1;
        }
        int r = who[0] == 'w' ? atoi(who + 1) : -1;
        if (m.type != EPMOE__MSG_TYPE__MSG_REGISTER || r < 0 || r >= P || seen[r]) {
            printf("  unexpected %s from %s while waiting for REGISTER\n", wire_type_name(m.type),
                   who);
            wire_msg_close(&m);
            return -1;
        }
        seen[r] = true;
        ep_err err;
        Epmoe__Register *reg =
            (Epmoe__Register *)wire_unpack(&epmoe__register__descriptor, &m, &err);
        CHECK(reg != NULL);
        if (reg) {
            CHECK_STR_EQ(reg->name, cl->name[r]);
            CHECK_STR_EQ(reg->device, "cpu");
            CHECK(reg->n_capabilities >= 1 && strcmp(reg->capabilities[0], "cpu") == 0);
            /* every instruction set this CPU has, the chosen one among them */
            size_t want_caps = 1;
            for (int i = ISA_AVX2; i < ISA_COUNT; i++)
                if (isa_supported((isa_level)i)) {
                    CHECK(want_caps < reg->n_capabilities &&
                          strcmp(reg->capabilities[want_caps], isa_name((isa_level)i)) == 0);
                    want_caps++;
                }
            CHECK_EQ(reg->n_capabilities, want_caps);
            CHECK(reg->has_pid && (pid_t)reg->pid == cl->pid[r]);
            CHECK(reg->hostname && reg->hostname[0]);
            CHECK(reg->version && reg->version[0]);
        }
        wire_free_unpacked(reg ? &reg->base : NULL);
        wire_msg_close(&m);
    }
    return 0;
}

/* Registration failed: clean up the processes and the socket. */
static void cluster_abandon(cluster *cl)
{
    kill_children();
    fc_close(&cl->f);
}

static void send_welcome(cluster *cl, int r, const fixture *fx, const welcome_opts *o)
{
    const mc_config *c = o->config ? o->config : &fx->c;
    int E = c->n_routed_experts;
    for (int e = 0; e < E; e++)
        cl->owner[e] = (uint32_t)(o->round_robin ? e % cl->P : e * cl->P / E);
    Epmoe__ModelConfig mc;
    mmsg_from_config(c, &mc);
    Epmoe__Peer peers[MAXP], *pp[MAXP];
    for (int i = 0; i < cl->P; i++) {
        epmoe__peer__init(&peers[i]);
        peers[i].has_rank = 1;
        peers[i].rank = (uint32_t)i;
        peers[i].name = cl->name[i];
        peers[i].data_endpoint = cl->data_ep[i];
        pp[i] = &peers[i];
    }
    Epmoe__Welcome w = EPMOE__WELCOME__INIT;
    w.cluster = "test";
    w.has_rank = w.has_world_size = w.has_epoch = w.has_config_hash = 1;
    w.rank = (uint32_t)r;
    w.world_size = (uint32_t)cl->P;
    w.epoch = cl->epoch;
    w.config = &mc;
    w.config_hash = mc_hash(c) + o->hash_delta;
    w.model_path = (char *)fx->dir;
    w.n_expert_owner = (size_t)(E + o->owner_count_delta);
    w.expert_owner = cl->owner;
    w.n_peers = (size_t)cl->P;
    w.peers = pp;
    w.has_dispatch = 1;
    w.dispatch = (Epmoe__DispatchFormat)o->dispatch;
    w.has_heartbeat_ms = w.has_liveness = w.has_step_timeout_ms = 1;
    w.heartbeat_ms = (uint32_t)(o->heartbeat_ms ? o->heartbeat_ms : 500);
    w.liveness = (uint32_t)(o->liveness ? o->liveness : 40);
    w.step_timeout_ms = (uint32_t)(o->step_timeout_ms ? o->step_timeout_ms : 30000);
    w.data_endpoint = cl->data_ep[r];
    w.device = "cpu";
    w.has_session = 1;
    w.session = cl->session;
    fc_send(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_WELCOME, &w.base, NULL, 0);
}

/* CONFIG_ACK from every worker (any order) with the true hash of the config. */
static int expect_acks(cluster *cl, uint64_t want_hash)
{
    bool seen[MAXP] = {false};
    for (int n = 0; n < cl->P; n++) {
        wire_msg m;
        char who[64];
        int r = -1;
        do {
            if (fc_recv(&cl->f, WAIT_S, &m, who, sizeof who) != 0) {
                printf("  timeout waiting for CONFIG_ACK (%d of %d)\n", n, cl->P);
                return -1;
            }
            r = who[0] == 'w' ? atoi(who + 1) : -1;
            if (m.type == EPMOE__MSG_TYPE__MSG_HEARTBEAT)
                wire_msg_close(&m);
        } while (m.type == EPMOE__MSG_TYPE__MSG_HEARTBEAT);
        if (m.type != EPMOE__MSG_TYPE__MSG_CONFIG_ACK || r < 0 || r >= cl->P || seen[r]) {
            printf("  unexpected %s from %s while waiting for CONFIG_ACK\n", wire_type_name(m.type),
                   who);
            wire_msg_close(&m);
            return -1;
        }
        seen[r] = true;
        ep_err err;
        Epmoe__ConfigAck *a =
            (Epmoe__ConfigAck *)wire_unpack(&epmoe__config_ack__descriptor, &m, &err);
        CHECK(a && a->has_config_hash && a->config_hash == want_hash);
        CHECK(a && a->has_epoch && a->epoch == cl->epoch);
        wire_free_unpacked(a ? &a->base : NULL);
        wire_msg_close(&m);
    }
    return 0;
}

static void send_load(cluster *cl, int r)
{
    Epmoe__Load l = EPMOE__LOAD__INIT;
    l.has_epoch = 1;
    l.epoch = cl->epoch;
    fc_send(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_LOAD, &l.base, NULL, 0);
}

/* LOADING progress then READY from every worker. */
static int expect_ready(cluster *cl, const fixture *fx)
{
    uint64_t last_done[MAXP] = {0}, total[MAXP] = {0};
    bool ready[MAXP] = {false}, progress_ok = true;
    int n_ready = 0;
    double end = now_s() + 3 * WAIT_S;
    while (n_ready < cl->P) {
        wire_msg m;
        char who[64];
        if (fc_recv(&cl->f, end - now_s(), &m, who, sizeof who) != 0) {
            printf("  timeout waiting for READY (%d of %d)\n", n_ready, cl->P);
            return -1;
        }
        int r = who[0] == 'w' ? atoi(who + 1) : -1;
        ep_err err;
        if (r < 0 || r >= cl->P) {
            wire_msg_close(&m);
            continue;
        }
        if (m.type == EPMOE__MSG_TYPE__MSG_LOADING) {
            Epmoe__Loading *l =
                (Epmoe__Loading *)wire_unpack(&epmoe__loading__descriptor, &m, &err);
            if (l && l->has_bytes_done && l->has_bytes_total) {
                progress_ok &= l->bytes_done >= last_done[r] && l->bytes_done <= l->bytes_total;
                progress_ok &= l->has_elapsed_ms; /* the coordinator's GB/s */
                last_done[r] = l->bytes_done;
                total[r] = l->bytes_total;
            }
            wire_free_unpacked(l ? &l->base : NULL);
        } else if (m.type == EPMOE__MSG_TYPE__MSG_READY) {
            Epmoe__Ready *rd = (Epmoe__Ready *)wire_unpack(&epmoe__ready__descriptor, &m, &err);
            uint32_t owned = 0;
            for (int e = 0; e < fx->c.n_routed_experts; e++)
                owned += cl->owner[e] == (uint32_t)r;
            CHECK(rd && rd->epoch == cl->epoch && rd->config_hash == mc_hash(&fx->c));
            CHECK(rd && rd->has_n_experts && rd->n_experts == owned);
            CHECK(rd && rd->backend && strncmp(rd->backend, "cpu-", 4) == 0);
            /* the kernels the worker chose: the best this CPU has (EPMOE_ISA unset here) */
            CHECK(rd && rd->backend && strcmp(rd->backend + 4, isa_name(isa_best())) == 0);
            /* what the load read and how long it took: the rate in status / workers */
            CHECK(rd && rd->has_bytes_read && rd->bytes_read == total[r] && rd->has_load_ms);
            wire_free_unpacked(rd ? &rd->base : NULL);
            CHECK(total[r] > 0 && last_done[r] == total[r]); /* progress ended at the total */
            n_ready += !ready[r];
            ready[r] = true;
        } else if (m.type != EPMOE__MSG_TYPE__MSG_HEARTBEAT) {
            printf("  unexpected %s from %s while loading\n", wire_type_name(m.type), who);
            if (m.type == EPMOE__MSG_TYPE__MSG_ERROR) {
                Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, &m, &err);
                printf("  error: %s\n", e && e->message ? e->message : "?");
                wire_free_unpacked(e ? &e->base : NULL);
            }
            wire_msg_close(&m);
            return -1;
        }
        wire_msg_close(&m);
    }
    CHECK(progress_ok);
    return 0;
}

/* WELCOME + LOAD on every worker, with a new epoch. */
static int cluster_welcome_load(cluster *cl, const fixture *fx, const welcome_opts *o)
{
    cl->epoch++;
    for (int r = 0; r < cl->P; r++)
        send_welcome(cl, r, fx, o);
    if (expect_acks(cl, mc_hash(&fx->c)) != 0)
        return -1;
    for (int r = 0; r < cl->P; r++)
        send_load(cl, r);
    return expect_ready(cl, fx);
}

static void cluster_shutdown(cluster *cl)
{
    Epmoe__Shutdown s = EPMOE__SHUTDOWN__INIT;
    s.reason = "test over";
    for (int r = 0; r < cl->P; r++)
        fc_send(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_SHUTDOWN, &s.base, NULL, 0);
    for (int r = 0; r < cl->P; r++)
        CHECK_EQ(wait_exit(cl->pid[r], WAIT_S), 0);
    fc_close(&cl->f);
}

/* ---- steps ------------------------------------------------------------------------------------
 */

static void send_step(cluster *cl, int r, const fixture *fx, int layer, int T, bool with_ids)
{
    int H = fx->c.hidden_size;
    int t0 = (int)((long)r * T / cl->P), t1 = (int)((long)(r + 1) * T / cl->P);
    Epmoe__Step s = EPMOE__STEP__INIT;
    s.has_step_id = s.has_epoch = s.has_layer = s.has_n_tokens = s.has_has_ids = 1;
    s.step_id = cl->step_id;
    s.epoch = cl->epoch;
    s.layer = (uint32_t)layer;
    s.n_tokens = (uint32_t)(t1 - t0);
    s.has_ids = with_ids;
    s.has_session = 1;
    s.session = cl->session;
    wire_payload pl[2] = {{.data = fx->x + (size_t)t0 * H, .len = (size_t)(t1 - t0) * H * 2},
                          {.data = fx->ids + t0, .len = (size_t)(t1 - t0) * 8}};
    fc_send(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_STEP, &s.base, pl, with_ids ? 2 : 1);
}

/* The STEP_FAILED message from who (its text into buf), or -1. */
static int expect_step_failed(cluster *cl, int r, char *buf, size_t cap, int *code)
{
    wire_msg m;
    if (fc_expect(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_STEP_FAILED, WAIT_S, &m) != 0)
        return -1;
    ep_err err;
    Epmoe__StepFailed *f =
        (Epmoe__StepFailed *)wire_unpack(&epmoe__step_failed__descriptor, &m, &err);
    snprintf(buf, cap, "%s", f && f->message ? f->message : "");
    *code = f && f->has_code ? (int)f->code : -1;
    wire_free_unpacked(f ? &f->base : NULL);
    wire_msg_close(&m);
    return 0;
}

/* One step over P workers; the reassembled outputs into got. Returns 0 when every worker
 * answered STEP_DONE with well-formed payloads. */
static int run_step(cluster *cl, const fixture *fx, int layer, int T, outs *got)
{
    const mc_config *c = &fx->c;
    int H = c->hidden_size, k = c->num_experts_per_tok;
    bool with_ids = mc_layer_is_hash(c, layer) || T % 2 == 1;
    cl->step_id++;
    for (int r = 0; r < cl->P; r++) {
        if (r > 0 && cl->stagger_ms > 0)
            usleep((useconds_t)cl->stagger_ms * 1000);
        send_step(cl, r, fx, layer, T, with_ids);
    }
    int done = 0, rc = 0;
    uint64_t pairs = 0;
    bool seen[MAXP] = {false};
    while (done < cl->P) {
        wire_msg m;
        char who[64];
        if (fc_recv(&cl->f, WAIT_S, &m, who, sizeof who) != 0) {
            printf("  step %llu: timeout (%d of %d answered)\n", (unsigned long long)cl->step_id,
                   done, cl->P);
            return -1;
        }
        int r = who[0] == 'w' ? atoi(who + 1) : -1;
        ep_err err;
        if (m.type == EPMOE__MSG_TYPE__MSG_STEP_FAILED) {
            Epmoe__StepFailed *f =
                (Epmoe__StepFailed *)wire_unpack(&epmoe__step_failed__descriptor, &m, &err);
            printf("  step %llu: %s failed: %s\n", (unsigned long long)cl->step_id, who,
                   f && f->message ? f->message : "?");
            wire_free_unpacked(f ? &f->base : NULL);
            rc = -1;
            done++;
        } else if (m.type == EPMOE__MSG_TYPE__MSG_STEP_DONE && r >= 0 && r < cl->P && !seen[r]) {
            seen[r] = true;
            done++;
            int t0 = (int)((long)r * T / cl->P), n = (int)((long)(r + 1) * T / cl->P) - t0;
            Epmoe__StepDone *d =
                (Epmoe__StepDone *)wire_unpack(&epmoe__step_done__descriptor, &m, &err);
            /* the load of its own tokens: per expert, the histogram of the topk_ids it sends
             * back; per computing rank, the same pairs again */
            bool load_ok = d != NULL && d->n_routed_expert == d->n_routed_tokens &&
                           d->n_pair_rank == d->n_pair_count && m.n_payloads == 3 &&
                           m.payload_len[1] == (size_t)n * k * 4;
            uint64_t routed = 0, computed = 0;
            for (size_t i = 0; load_ok && i < d->n_routed_expert; i++) {
                uint32_t e = d->routed_expert[i], hist = 0;
                for (size_t j = 0; j < (size_t)n * k; j++) {
                    int32_t id;
                    memcpy(&id, m.payload[1] + 4 * j, 4);
                    hist += id == (int32_t)e;
                }
                load_ok = hist == d->routed_tokens[i];
                routed += d->routed_tokens[i];
            }
            for (size_t i = 0; load_ok && i < d->n_pair_rank; i++)
                computed += d->pair_rank[i] < (uint32_t)cl->P ? d->pair_count[i] : 0;
            load_ok = load_ok && routed == (uint64_t)n * k && computed == routed;
            bool ok = d && d->step_id == cl->step_id && d->n_tokens == (uint32_t)n && load_ok &&
                      m.n_payloads == 3 && m.payload_len[0] == (size_t)n * H * 2 &&
                      m.payload_len[1] == (size_t)n * k * 4 &&
                      m.payload_len[2] == (size_t)n * k * 4;
            if (!ok) {
                printf("  step %llu: malformed STEP_DONE from %s\n",
                       (unsigned long long)cl->step_id, who);
                rc = -1;
            } else {
                for (size_t i = 0; i < d->n_routed_tokens; i++)
                    pairs += d->routed_tokens[i];
                memcpy(got->out + (size_t)t0 * H, m.payload[0], m.payload_len[0]);
                memcpy(got->ids + (size_t)t0 * k, m.payload[1], m.payload_len[1]);
                memcpy(got->w + (size_t)t0 * k, m.payload[2], m.payload_len[2]);
            }
            wire_free_unpacked(d ? &d->base : NULL);
        } else if (m.type != EPMOE__MSG_TYPE__MSG_HEARTBEAT) {
            printf("  unexpected %s from %s during a step\n", wire_type_name(m.type), who);
        }
        wire_msg_close(&m);
    }
    if (rc == 0 && pairs != (uint64_t)T * (uint64_t)k) {
        printf("  step %llu: expert token counts add up to %llu, expected T x k = %d\n",
               (unsigned long long)cl->step_id, (unsigned long long)pairs, T * k);
        rc = -1;
    }
    return rc;
}

/* First token where got and the reference differ (and in what), or -1. */
static int first_diff(const fixture *fx, const outs *got, const outs *want, int T,
                      const char **what)
{
    int H = fx->c.hidden_size, k = fx->c.num_experts_per_tok;
    for (int t = 0; t < T; t++) {
        *what = memcmp(got->ids + (size_t)t * k, want->ids + (size_t)t * k, (size_t)k * 4)
                    ? "topk_ids"
                : memcmp(got->w + (size_t)t * k, want->w + (size_t)t * k, (size_t)k * 4)
                    ? "topk_weights"
                : memcmp(got->out + (size_t)t * H, want->out + (size_t)t * H, (size_t)H * 2) ? "out"
                                                                                             : NULL;
        if (*what)
            return t;
    }
    return -1;
}

/* A step, checked bit for bit against moe_forward over the whole batch in this process. */
static void check_step(cluster *cl, const fixture *fx, int layer, int T, const char *label)
{
    outs got = outs_new(&fx->c, T), want = outs_new(&fx->c, T);
    ep_err err = {0};
    CHECK(moe_forward(fx->layers[layer], T, fx->x, fx->ids, want.out, want.ids, want.w, NULL,
                      &err) == 0);
    if (run_step(cl, fx, layer, T, &got) != 0) {
        TEST_FAIL_AT("%s: layer %d, T %d: the step failed", label, layer, T);
    } else {
        const char *what = NULL;
        int t = first_diff(fx, &got, &want, T, &what);
        if (t >= 0)
            TEST_FAIL_AT("%s: layer %d, T %d: token %d differs from moe_forward in %s", label,
                         layer, T, t, what);
    }
    outs_free(&got);
    outs_free(&want);
}

static void check_all_steps(cluster *cl, const fixture *fx, const char *label)
{
    static const int Ts[] = {1, 7, 64, 300};
    for (int layer = 0; layer < fx->n_layers; layer++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
            check_step(cl, fx, layer, Ts[i], label);
}

/* ---- the tests --------------------------------------------------------------------------------
 */

static fixture fx4, fx8;
static bool fx4_ok, fx8_ok;

/* P workers registered, welcomed with o and loaded from fx; false (the test failed, the workers
 * killed) when that did not work. */
static bool cluster_up(cluster *cl, int P, const fixture *fx, const welcome_opts *o)
{
    if (cluster_register(cl, P) == 0 && cluster_welcome_load(cl, fx, o) == 0)
        return true;
    TEST_FAIL_AT("cluster of %d workers", P);
    cluster_abandon(cl);
    return false;
}

static void run_cluster(const fixture *fx, int P, bool round_robin)
{
    cluster cl;
    if (cluster_register(&cl, P) != 0) {
        TEST_FAIL_AT("registration of %d workers", P);
        cluster_abandon(&cl);
        return;
    }
    static const tp_format fmts[2] = {TP_FMT_FP8, TP_FMT_BF16};
    for (int i = 0; i < 2; i++) {
        welcome_opts o = {.dispatch = fmts[i], .round_robin = round_robin};
        char label[96];
        snprintf(label, sizeof label, "%s experts, %d workers, %s dispatch%s",
                 mc_dtype_name(fx->c.expert_dtype), P, i ? "bf16" : "fp8",
                 round_robin ? ", round-robin" : "");
        if (cluster_welcome_load(&cl, fx, &o) != 0) {
            TEST_FAIL_AT("%s: welcome and load", label);
            break;
        }
        check_all_steps(&cl, fx, label);
    }
    cluster_shutdown(&cl);
    kill_children();
}

TEST(one_worker_is_bit_exact)
{
    if (!fx4_ok || !fx8_ok)
        SKIP("no fixture");
    run_cluster(&fx4, 1, false);
    run_cluster(&fx8, 1, false);
}

TEST(two_workers_are_bit_exact)
{
    if (!fx4_ok || !fx8_ok)
        SKIP("no fixture");
    run_cluster(&fx4, 2, false);
    run_cluster(&fx8, 2, false);
}

TEST(three_workers_are_bit_exact)
{
    if (!fx4_ok || !fx8_ok)
        SKIP("no fixture");
    run_cluster(&fx4, 3, true);
    run_cluster(&fx8, 3, false);
}

TEST(four_workers_are_bit_exact)
{
    if (!fx4_ok || !fx8_ok)
        SKIP("no fixture");
    run_cluster(&fx4, 4, false);
    run_cluster(&fx8, 4, true);
}

/* Error{code} from the fake, in reply to what, with a text that has needle. */
static void expect_error(cluster *cl, int r, int code, const char *needle)
{
    wire_msg m;
    if (fc_expect(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_ERROR, WAIT_S, &m) != 0) {
        TEST_FAIL_AT("no Error from %s", cl->name[r]);
        return;
    }
    ep_err err;
    Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, &m, &err);
    CHECK(e != NULL);
    if (e) {
        CHECK_EQ(e->code, code);
        CHECK_STR_HAS(e->message ? e->message : "", needle);
    }
    wire_free_unpacked(e ? &e->base : NULL);
    wire_msg_close(&m);
}

static void send_error(cluster *cl, int r, Epmoe__ErrorCode code, const char *text)
{
    Epmoe__Error e = EPMOE__ERROR__INIT;
    e.has_code = 1;
    e.code = code;
    e.message = (char *)text;
    fc_send(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_ERROR, &e.base, NULL, 0);
}

TEST(misstated_hash_and_unknown_name_exit_78)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    if (cluster_register(&cl, 2) != 0) {
        TEST_FAIL_AT("registration");
        cluster_abandon(&cl);
        return;
    }
    cl.epoch = 1;
    /* an invalid WELCOME is refused, naming the field, and the worker waits for a good one */
    welcome_opts bad = {.owner_count_delta = -1};
    send_welcome(&cl, 0, &fx4, &bad);
    expect_error(&cl, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "expert_owner has 7 entries");
    /* the coordinator states a hash that is not the config's: the worker acks its own */
    welcome_opts o = {.hash_delta = 1};
    send_welcome(&cl, 0, &fx4, &o);
    wire_msg m;
    CHECK(fc_expect(&cl.f, "w0", EPMOE__MSG_TYPE__MSG_CONFIG_ACK, WAIT_S, &m) == 0);
    ep_err err;
    Epmoe__ConfigAck *a = (Epmoe__ConfigAck *)wire_unpack(&epmoe__config_ack__descriptor, &m, &err);
    CHECK(a && a->config_hash == mc_hash(&fx4.c) && a->config_hash != mc_hash(&fx4.c) + 1);
    wire_free_unpacked(a ? &a->base : NULL);
    wire_msg_close(&m);
    send_error(&cl, 0, EPMOE__ERROR_CODE__ERR_CONFIG_HASH, "config hash differs");
    CHECK_EQ(wait_exit(cl.pid[0], WAIT_S), 78);
    /* a name the spec does not know */
    send_error(&cl, 1, EPMOE__ERROR_CODE__ERR_UNKNOWN_WORKER, "no worker w1 in the spec");
    CHECK_EQ(wait_exit(cl.pid[1], WAIT_S), 78);
    fc_close(&cl.f);
    kill_children();
}

static void load_fails_with(const fixture *fx, const mc_config *cfg, const char *needle)
{
    cluster cl;
    if (cluster_register(&cl, 1) != 0) {
        TEST_FAIL_AT("registration");
        cluster_abandon(&cl);
        return;
    }
    cl.epoch = 1;
    welcome_opts o = {.config = cfg};
    send_welcome(&cl, 0, fx, &o);
    CHECK(expect_acks(&cl, mc_hash(cfg)) == 0);
    /* STEP before the shard is loaded */
    send_step(&cl, 0, fx, 1, 3, false);
    char text[512];
    int code;
    CHECK(expect_step_failed(&cl, 0, text, sizeof text, &code) == 0);
    CHECK_EQ(code, EPMOE__ERROR_CODE__ERR_NOT_READY);
    send_load(&cl, 0);
    expect_error(&cl, 0, EPMOE__ERROR_CODE__ERR_LOAD_FAILED, needle);
    /* still alive, still not ready */
    usleep(200000);
    CHECK(alive(cl.pid[0]));
    cl.step_id = 5;
    send_step(&cl, 0, fx, 1, 3, false);
    CHECK(expect_step_failed(&cl, 0, text, sizeof text, &code) == 0);
    CHECK_EQ(code, EPMOE__ERROR_CODE__ERR_NOT_READY);
    CHECK_STR_HAS(text, "load-failed");
    cluster_shutdown(&cl);
    kill_children();
}

TEST(load_failure_names_the_tensor_and_worker_stays_up)
{
    fixture missing;
    if (fixture_init(&missing, MC_FP4, 6, false) != 0) {
        TEST_FAIL_AT("fixture");
        fixture_free(&missing);
        return;
    }
    /* experts 6 and 7 have no tensors in this checkpoint */
    load_fails_with(&missing, &missing.c, "layers.0.ffn.experts.6.w1");
    fixture_free(&missing);
    if (!fx4_ok)
        return;
    /* an fp4 checkpoint under a config that says fp8: a dtype mismatch naming the tensor */
    mc_config c8 = fx4.c;
    c8.expert_dtype = MC_FP8;
    c8.scale_e8m0 = false;
    load_fails_with(&fx4, &c8, "layers.0.ffn.experts.0.w1.weight");
}

TEST(step_abort_and_timeout_name_the_cause)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    welcome_opts o = {.dispatch = TP_FMT_FP8, .step_timeout_ms = 1500};
    if (!cluster_up(&cl, 2, &fx4, &o))
        return;
    /* w0 gets the step, w1 does not: w0 waits for w1's DISPATCH until aborted */
    cl.step_id++;
    send_step(&cl, 0, &fx4, 1, 64, false);
    usleep(300000);
    Epmoe__StepAbort ab = EPMOE__STEP_ABORT__INIT;
    ab.has_step_id = 1;
    ab.step_id = cl.step_id;
    fc_send(&cl.f, "w0", EPMOE__MSG_TYPE__MSG_STEP_ABORT, &ab.base, NULL, 0);
    char text[512];
    int code;
    CHECK(expect_step_failed(&cl, 0, text, sizeof text, &code) == 0);
    CHECK_STR_HAS(text, "aborted");
    /* the same, left to time out: the message names the silent peer */
    cl.step_id++;
    send_step(&cl, 0, &fx4, 2, 64, false);
    double t0 = now_s();
    CHECK(expect_step_failed(&cl, 0, text, sizeof text, &code) == 0);
    CHECK_EQ(code, EPMOE__ERROR_CODE__ERR_TIMEOUT);
    CHECK_STR_HAS(text, "rank 1 (w1)");
    CHECK(now_s() - t0 > 1.0);
    /* and the cluster still computes exactly */
    check_step(&cl, &fx4, 1, 64, "after abort and timeout");
    check_step(&cl, &fx4, 0, 7, "after abort and timeout");
    cluster_shutdown(&cl);
    kill_children();
}

TEST(garbage_on_the_data_plane_is_ignored)
{
    if (!fx8_ok)
        SKIP("no fixture");
    cluster cl;
    welcome_opts o = {.dispatch = TP_FMT_FP8};
    if (!cluster_up(&cl, 2, &fx8, &o))
        return;
    check_step(&cl, &fx8, 1, 64, "before garbage");
    void *push = zmq_socket(zctx, ZMQ_PUSH);
    int linger = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    CHECK(zmq_connect(push, cl.data_ep[1]) == 0);
    zmq_send(push, "garbage", 7, 0);
    zmq_send(push, "EPMOE1", 6, ZMQ_SNDMORE);
    zmq_send(push, "\x3c\x00", 2, ZMQ_SNDMORE);
    zmq_send(push, "\xff\xff\xff", 3, 0);
    /* a well-formed DISPATCH for the next step whose pair names an expert w1 does not own */
    Epmoe__Dispatch d = EPMOE__DISPATCH__INIT;
    d.has_step_id = d.has_epoch = d.has_layer = d.has_src_rank = 1;
    d.has_n_rows = d.has_n_pairs = d.has_format = 1;
    d.step_id = cl.step_id + 1;
    d.epoch = cl.epoch;
    d.layer = 1;
    d.src_rank = 0;
    d.n_rows = 1;
    d.n_pairs = 1;
    d.format = EPMOE__DISPATCH_FORMAT__DISPATCH_BF16;
    static uint16_t row[256];
    uint32_t prow = 0, pexp = 0;
    float pw = 1.0f;
    wire_payload pl[4] = {{.data = row, .len = sizeof row},
                          {.data = &prow, .len = 4},
                          {.data = &pexp, .len = 4},
                          {.data = &pw, .len = 4}};
    CHECK(wire_send(push, NULL, 0, EPMOE__MSG_TYPE__MSG_DISPATCH, &d.base, pl, 4, false, NULL) ==
          0);
    usleep(200000);
    check_step(&cl, &fx8, 1, 64, "after garbage");
    check_step(&cl, &fx8, 2, 300, "after garbage");
    zmq_close(push);
    cluster_shutdown(&cl);
    kill_children();
}

TEST(sigterm_exits_zero)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    welcome_opts o = {.dispatch = TP_FMT_FP8};
    if (!cluster_up(&cl, 1, &fx4, &o))
        return;
    kill(cl.pid[0], SIGTERM);
    CHECK_EQ(wait_exit(cl.pid[0], WAIT_S), 0);
    /* also while still registering */
    pid_t p = spawn_worker(cl.f.endpoint, "w9");
    wire_msg m;
    CHECK(fc_expect(&cl.f, "w9", EPMOE__MSG_TYPE__MSG_REGISTER, WAIT_S, &m) == 0);
    wire_msg_close(&m);
    kill(p, SIGINT);
    CHECK_EQ(wait_exit(p, WAIT_S), 0);
    fc_close(&cl.f);
    kill_children();
}

TEST(silent_coordinator_makes_the_worker_register_again)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    if (cluster_register(&cl, 1) != 0) {
        TEST_FAIL_AT("registration");
        cluster_abandon(&cl);
        return;
    }
    cl.epoch = 1;
    welcome_opts o = {.heartbeat_ms = 100, .liveness = 3};
    send_welcome(&cl, 0, &fx4, &o);
    CHECK(expect_acks(&cl, mc_hash(&fx4.c)) == 0);
    /* now silence: heartbeats keep coming for ~300 ms, then REGISTER on a new connection */
    int heartbeats = 0;
    double t0 = now_s();
    bool registered = false;
    while (!registered && now_s() - t0 < WAIT_S) {
        wire_msg m;
        char who[64];
        if (fc_recv(&cl.f, WAIT_S, &m, who, sizeof who) != 0)
            break;
        heartbeats += m.type == EPMOE__MSG_TYPE__MSG_HEARTBEAT;
        registered = m.type == EPMOE__MSG_TYPE__MSG_REGISTER && strcmp(who, "w0") == 0;
        wire_msg_close(&m);
    }
    CHECK(registered);
    CHECK(heartbeats >= 1);
    CHECK(now_s() - t0 >= 0.3); /* not before liveness x heartbeat_ms */
    /* and it can be welcomed and loaded again */
    welcome_opts again = {.dispatch = TP_FMT_BF16};
    CHECK(cluster_welcome_load(&cl, &fx4, &again) == 0);
    check_step(&cl, &fx4, 1, 7, "after re-registering");
    cluster_shutdown(&cl);
    kill_children();
}

/* ---- the command line and refusals that restarting cannot fix ---------------------------------
 */

/* Whether the file at path contains needle. */
static bool file_has(const char *path, const char *needle)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

TEST(bad_endpoints_and_keys_are_usage_errors)
{
    char log[] = "/tmp/epmoe_test_worker_log_XXXXXX";
    int fd = mkstemp(log);
    close(fd);
    const char *garbage[] = {"--coordinator", "garbage", "--name", "w0", NULL};
    CHECK_EQ(wait_exit(spawn_worker_argv(garbage, log), WAIT_S), 64);
    CHECK(file_has(log, "\"garbage\" is not a ZeroMQ endpoint"));
    const char *port[] = {"--coordinator", "tcp://127.0.0.1:99999", "--name", "w0", NULL};
    CHECK_EQ(wait_exit(spawn_worker_argv(port, log), WAIT_S), 64);
    CHECK(file_has(log, "port \"99999\" is not in 1..65535"));
    /* a secret key others may read */
    char dir[] = "/tmp/epmoe_test_worker_keys_XXXXXX";
    ep_err err = {0};
    CHECK(mkdtemp(dir) != NULL);
    CHECK(auth_keygen(dir, "w0", &err) == 0);
    char key[128], pub[128];
    snprintf(key, sizeof key, "%s/w0.key", dir);
    snprintf(pub, sizeof pub, "%s/w0.pub", dir);
    chmod(key, 0644);
    const char *loose[] = {"--coordinator",
                           "tcp://127.0.0.1:9",
                           "--name",
                           "w0",
                           "--key",
                           key,
                           "--coordinator-key",
                           pub,
                           NULL};
    CHECK_EQ(wait_exit(spawn_worker_argv(loose, log), WAIT_S), 64);
    CHECK(file_has(log, "lets others read or change the secret key; chmod 600"));
    unlink(key);
    unlink(pub);
    rmdir(dir);
    unlink(log);
}

TEST(permanent_refusals_exit_78)
{
    static const Epmoe__ErrorCode codes[2] = {EPMOE__ERROR_CODE__ERR_REFUSED,
                                              EPMOE__ERROR_CODE__ERR_DUPLICATE};
    for (int i = 0; i < 2; i++) {
        cluster cl;
        if (cluster_register(&cl, 1) != 0) {
            TEST_FAIL_AT("registration");
            cluster_abandon(&cl);
            return;
        }
        send_error(&cl, 0, codes[i], "the spec's device for w0 is cuda:0 / w0 is alive elsewhere");
        CHECK_EQ(wait_exit(cl.pid[0], WAIT_S), 78);
        fc_close(&cl.f);
        kill_children();
    }
}

TEST(a_worker_whose_key_is_refused_exits_78)
{
    /* the fake coordinator as a CURVE server whose ZAP handler admits nobody */
    char dir[] = "/tmp/epmoe_test_worker_keys_XXXXXX";
    ep_err err = {0};
    CHECK(mkdtemp(dir) != NULL);
    CHECK(auth_keygen(dir, "coordinator", &err) == 0 && auth_keygen(dir, "w0", &err) == 0);
    char ckey[128], cpub[128], wkey[128], wpub[128], log[160];
    snprintf(ckey, sizeof ckey, "%s/coordinator.key", dir);
    snprintf(cpub, sizeof cpub, "%s/coordinator.pub", dir);
    snprintf(wkey, sizeof wkey, "%s/w0.key", dir);
    snprintf(wpub, sizeof wpub, "%s/w0.pub", dir);
    snprintf(log, sizeof log, "%s/w0.log", dir);
    void *ctx = zmq_ctx_new();
    auth_zap *zap = auth_zap_start(ctx, &err);
    auth_keypair kp;
    CHECK(zap && auth_load_secret(ckey, &kp, &err) == 0);
    CHECK(auth_zap_allow(zap, AUTH_DOMAIN_WORKERS, auth_list_new(), &err) == 0);
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    CHECK(auth_server(router, &kp, AUTH_DOMAIN_WORKERS, &err) == 0);
    CHECK(zmq_bind(router, "tcp://127.0.0.1:*") == 0);
    char ep[64];
    size_t sz = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &sz);
    const char *args[] = {"--coordinator",     ep,   "--name", "w0", "--key", wkey,
                          "--coordinator-key", cpub, NULL};
    CHECK_EQ(wait_exit(spawn_worker_argv(args, log), WAIT_S), 78);
    CHECK(file_has(log, "refused this process's key"));
    CHECK(auth_zap_refused(zap) >= 1);
    zmq_close(router);
    auth_zap_stop(&zap);
    zmq_ctx_term(ctx);
    unlink(ckey), unlink(cpub), unlink(wkey), unlink(wpub), unlink(log);
    rmdir(dir);
}

/* ---- hostile and stale peers on the data plane ------------------------------------------------
 */

/* A PUSH of the test's own to rank r's data endpoint. */
static void *data_push(cluster *cl, int r)
{
    void *push = zmq_socket(zctx, ZMQ_PUSH);
    int linger = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    CHECK(zmq_connect(push, cl->data_ep[r]) == 0);
    return push;
}

/* Pairs rank from sends rank to in a step of T tokens on layer (the reference's routing). */
static int pairs_between(const cluster *cl, const fixture *fx, int layer, int T, int from, int to)
{
    outs want = outs_new(&fx->c, T);
    ep_err err = {0};
    int k = fx->c.num_experts_per_tok, n = 0;
    CHECK(moe_forward(fx->layers[layer], T, fx->x, fx->ids, want.out, want.ids, want.w, NULL,
                      &err) == 0);
    int t0 = (int)((long)from * T / cl->P), t1 = (int)((long)(from + 1) * T / cl->P);
    for (int i = t0 * k; i < t1 * k; i++)
        n += want.ids[i] >= 0 && cl->owner[want.ids[i]] == (uint32_t)to;
    outs_free(&want);
    return n;
}

static void forge_combine(void *push, const cluster *cl, uint64_t session, uint64_t step, int src,
                          int n_pairs, int H)
{
    Epmoe__Combine c = EPMOE__COMBINE__INIT;
    c.has_step_id = c.has_epoch = c.has_src_rank = c.has_n_pairs = c.has_session = 1;
    c.step_id = step;
    c.epoch = cl->epoch;
    c.session = session;
    c.src_rank = (uint32_t)src;
    c.n_pairs = (uint32_t)n_pairs;
    uint16_t *out = malloc((size_t)n_pairs * H * 2 + 2);
    for (size_t i = 0; i < (size_t)n_pairs * H; i++)
        out[i] = 0x4000; /* 2.0: a wrong answer that is easy to see */
    wire_payload p = {.data = out, .len = (size_t)n_pairs * H * 2};
    CHECK(wire_send(push, NULL, 0, EPMOE__MSG_TYPE__MSG_COMBINE, &c.base, &p, 1, false, NULL) == 0);
    free(out);
}

static void forge_empty_dispatch(void *push, const cluster *cl, uint64_t step, int src)
{
    Epmoe__Dispatch d = EPMOE__DISPATCH__INIT;
    d.has_step_id = d.has_epoch = d.has_layer = d.has_src_rank = d.has_session = 1;
    d.has_n_rows = d.has_n_pairs = d.has_format = d.has_scales_e8m0 = 1;
    d.step_id = step;
    d.epoch = cl->epoch;
    d.session = cl->session;
    d.layer = 1;
    d.src_rank = (uint32_t)src;
    d.format = EPMOE__DISPATCH_FORMAT__DISPATCH_FP8;
    d.scales_e8m0 = 1;
    wire_payload p[5] = {{.len = 0}, {.len = 0}, {.len = 0}, {.len = 0}, {.len = 0}};
    static const uint8_t none[1];
    for (int i = 0; i < 5; i++)
        p[i].data = none;
    CHECK(wire_send(push, NULL, 0, EPMOE__MSG_TYPE__MSG_DISPATCH, &d.base, p, 5, false, NULL) == 0);
}

TEST(forged_combines_never_change_a_result)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    welcome_opts o = {.dispatch = TP_FMT_FP8, .step_timeout_ms = 5000};
    if (!cluster_up(&cl, 2, &fx4, &o))
        return;
    check_step(&cl, &fx4, 1, 64, "before the forgery");
    int T = 64, H = fx4.c.hidden_size;
    int n = pairs_between(&cl, &fx4, 1, T, 0, 1); /* what w0 will wait for from w1 */
    CHECK(n > 0);
    void *push = data_push(&cl, 0);
    /* "rank 1's" answer to the next step, planted before the step: once with this cluster's
     * session (an insider), once with a guessed one */
    forge_combine(push, &cl, cl.session, cl.step_id + 1, 1, n, H);
    forge_combine(push, &cl, 0x1234, cl.step_id + 1, 1, n, H);
    usleep(300000);
    check_step(&cl, &fx4, 1, T, "after a forged COMBINE for the next step");
    check_step(&cl, &fx4, 2, T, "after a forged COMBINE for the next step");
    zmq_close(push);
    cluster_shutdown(&cl);
    kill_children();
}

TEST(stray_future_dispatches_do_not_block_later_steps)
{
    if (!fx8_ok)
        SKIP("no fixture");
    cluster cl;
    welcome_opts o = {.dispatch = TP_FMT_FP8, .step_timeout_ms = 3000};
    if (!cluster_up(&cl, 2, &fx8, &o))
        return;
    check_step(&cl, &fx8, 1, 7, "before");
    void *push = data_push(&cl, 1);
    /* 32 tiny DISPATCHes "from rank 0" for steps that may come (near future) and for steps
     * that never will (far future) */
    for (int i = 0; i < 32; i++)
        forge_empty_dispatch(push, &cl, cl.step_id + 2 + (uint64_t)i, 0);
    for (int i = 0; i < 32; i++)
        forge_empty_dispatch(push, &cl, cl.step_id + 1000000 + (uint64_t)i, 0);
    usleep(300000);
    double t0 = now_s();
    for (int i = 0; i < 3; i++)
        check_step(&cl, &fx8, i % 3, 64, "after 64 stray DISPATCHes");
    CHECK(now_s() - t0 < 3.0 * WAIT_S); /* no step waited for a timeout */
    zmq_close(push);
    cluster_shutdown(&cl);
    kill_children();
}

TEST(a_worker_away_for_10000_steps_serves_its_first_step_back)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    /* a long step timeout: a dropped DISPATCH would stall the step for all of it */
    welcome_opts o = {.dispatch = TP_FMT_FP8, .step_timeout_ms = 20000};
    if (!cluster_up(&cl, 2, &fx4, &o))
        return;
    check_step(&cl, &fx4, 1, 64, "before w1 is away");
    /* 10,000 steps run without w1 (a maintenance drain, a SIGSTOP, a rejoin: stay spare); then
     * w0's STEP comes first and its DISPATCH reaches w1 before w1's own STEP, as it does when
     * the coordinator's STEPs leave one after the other */
    cl.step_id += 10000;
    cl.stagger_ms = 300;
    double t0 = now_s();
    check_step(&cl, &fx4, 1, 64, "first step after 10,000 steps away");
    CHECK(now_s() - t0 < 10.0); /* well under step_timeout_ms (20 s) */
    cl.stagger_ms = 0;
    check_step(&cl, &fx4, 0, 300, "second step after 10,000 steps away");
    cluster_shutdown(&cl);
    kill_children();
}

/* WELCOME (the cluster's current epoch) and LOAD for rank r alone, until READY. */
static int rewelcome_one(cluster *cl, int r, const fixture *fx, const welcome_opts *o)
{
    send_welcome(cl, r, fx, o);
    wire_msg m;
    if (fc_expect(&cl->f, cl->name[r], EPMOE__MSG_TYPE__MSG_CONFIG_ACK, WAIT_S, &m) != 0)
        return -1;
    wire_msg_close(&m);
    send_load(cl, r);
    for (double end = now_s() + 3 * WAIT_S; now_s() < end;) {
        char who[64];
        if (fc_recv(&cl->f, end - now_s(), &m, who, sizeof who) != 0)
            break;
        bool ready = m.type == EPMOE__MSG_TYPE__MSG_READY && strcmp(who, cl->name[r]) == 0;
        wire_msg_close(&m);
        if (ready)
            return 0;
    }
    return -1;
}

TEST(a_restarted_worker_ignores_what_peers_sent_while_it_was_gone)
{
    if (!fx4_ok)
        SKIP("no fixture");
    cluster cl;
    /* a long step timeout: the stall this proves gone lasted all of it, and a loaded machine
     * stays far below it */
    welcome_opts o = {.dispatch = TP_FMT_FP8, .step_timeout_ms = 20000};
    if (!cluster_up(&cl, 2, &fx4, &o))
        return;
    check_step(&cl, &fx4, 1, 64, "before the kill");
    kill(cl.pid[1], SIGKILL);
    CHECK_EQ(wait_exit(cl.pid[1], WAIT_S), 128 + SIGKILL);
    /* steps that fail while w1 is away (the coordinator aborts them): w0 sends a DISPATCH for
     * each into its queue to w1, more than a peer may legitimately have pending */
    for (int i = 0; i < 20; i++) {
        cl.step_id++;
        send_step(&cl, 0, &fx4, i % 3, 64, true);
        Epmoe__StepAbort ab = EPMOE__STEP_ABORT__INIT;
        ab.has_step_id = 1;
        ab.step_id = cl.step_id;
        fc_send(&cl.f, "w0", EPMOE__MSG_TYPE__MSG_STEP_ABORT, &ab.base, NULL, 0);
        char text[512];
        int code;
        CHECK(expect_step_failed(&cl, 0, text, sizeof text, &code) == 0);
        CHECK_STR_HAS(text, "aborted");
    }
    /* w1 comes back under its name and is welcomed into the same session and epoch */
    cl.pid[1] = spawn_worker(cl.f.endpoint, cl.name[1]);
    wire_msg m;
    CHECK(fc_expect(&cl.f, cl.name[1], EPMOE__MSG_TYPE__MSG_REGISTER, WAIT_S, &m) == 0);
    wire_msg_close(&m);
    CHECK(rewelcome_one(&cl, 1, &fx4, &o) == 0);
    /* the first step after its return completes at once and exactly */
    double t0 = now_s();
    check_step(&cl, &fx4, 1, 64, "first step after the restart");
    CHECK(now_s() - t0 < 10.0); /* well under step_timeout_ms (20 s) */
    check_step(&cl, &fx4, 0, 300, "second step after the restart");
    cluster_shutdown(&cl);
    kill_children();
}

/* ---- the real coordinator ---------------------------------------------------------------------
 */

typedef struct real_cluster {
    char dir[64];
    char listen[64], admin[64];
    pid_t coord;
    void *client;
    uint64_t next_id;
} real_cluster;

static int real_write_spec(real_cluster *rc, const fixture *fx, int P, const char *dispatch,
                           const char *placement)
{
    char text[4096], path[128];
    snprintf(rc->listen, sizeof rc->listen, "tcp://127.0.0.1:%d", free_port());
    snprintf(rc->admin, sizeof rc->admin, "tcp://127.0.0.1:%d", free_port());
    size_t n = (size_t)snprintf(
        text, sizeof text,
        "cluster: {name: wtest}\ncoordinator:\n  listen: \"%s\"\n  admin: \"%s\"\n"
        "  heartbeat_ms: 200\n  liveness: 25\n  step_timeout_ms: 20000\nmodel:\n  path: \"%s\"\n"
        "expert_parallel:\n  placement: %s\n  dispatch: %s\nnodes:\n  - name: here\n"
        "    workers:\n",
        rc->listen, rc->admin, fx->dir, placement, dispatch);
    for (int r = 0; r < P; r++)
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "      - {name: w%d, device: cpu, data: \"tcp://127.0.0.1:%d\"}\n", r,
                              free_port());
    snprintf(path, sizeof path, "%s/cluster.yaml", rc->dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* One admin request; the reply (and its frames in *m) or NULL. */
static Epmoe__AdminReply *real_call(real_cluster *rc, Epmoe__AdminRequest *rq,
                                    const wire_payload *pl, int n, wire_msg *m)
{
    rq->has_id = 1;
    rq->id = ++rc->next_id;
    ep_err err = {0};
    if (wire_send(rc->client, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &rq->base, pl, n, false,
                  &err) != 0)
        return NULL;
    double end = now_s() + 3 * WAIT_S;
    while (now_s() < end) {
        zmq_pollitem_t it = {.socket = rc->client, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        if (wire_recv(rc->client, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, 0, m, &err) != WIRE_OK)
            continue;
        Epmoe__AdminReply *r =
            m->type == EPMOE__MSG_TYPE__MSG_ADMIN_REPLY
                ? (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, m, &err)
                : NULL;
        if (r && r->id == rq->id)
            return r;
        wire_free_unpacked(r ? &r->base : NULL);
        wire_msg_close(m);
    }
    return NULL;
}

static int real_wait_ready(real_cluster *rc)
{
    double end = now_s() + 3 * WAIT_S;
    while (now_s() < end) {
        Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
        rq.has_verb = 1;
        rq.verb = EPMOE__ADMIN_VERB__ADMIN_STATUS;
        wire_msg m;
        Epmoe__AdminReply *r = real_call(rc, &rq, NULL, 0, &m);
        bool ready = r && r->state && strcmp(r->state, "ready") == 0;
        if (r) {
            wire_free_unpacked(&r->base);
            wire_msg_close(&m);
        }
        if (ready)
            return 0;
        usleep(100000);
    }
    printf("  the cluster did not become ready\n");
    return -1;
}

/* A layer call through libepmoe (the serving path: an entry worker, not the coordinator),
 * checked bit for bit against moe_forward. */
static void real_forward(real_cluster *rc, const fixture *fx, const char *layer_name, int layer,
                         int T, const char *label)
{
    const mc_config *c = &fx->c;
    epmoe_options o = {.size = sizeof o,
                       .version = EPMOE_OPTIONS_VERSION,
                       .coordinator = rc->admin,
                       .timeout_ms = (uint32_t)(WAIT_S * 1000)};
    epmoe_client *cl = NULL;
    epmoe_error e = {0};
    outs got = outs_new(c, T);
    epmoe_request *rq = NULL;
    epmoe_submit_args sa = {.size = sizeof(epmoe_submit_args),
                            .version = EPMOE_SUBMIT_ARGS_VERSION,
                            .hidden_size = (uint32_t)c->hidden_size,
                            .layer = (uint32_t)layer,
                            .n_tokens = (uint32_t)T,
                            .hidden = fx->x,
                            .token_ids = mc_layer_is_hash(c, layer) ? fx->ids : NULL,
                            .out = got.out,
                            .topk_ids = got.ids,
                            .topk_weights = got.w};
    if (epmoe_open(&o, &cl, &e) != EPMOE_OK || epmoe_submit(cl, &sa, &rq, &e) != EPMOE_OK ||
        epmoe_wait(rq, -1, &e) != EPMOE_OK) {
        TEST_FAIL_AT("%s: layer %s, T %d: %s", label, layer_name, T, e.message);
    } else {
        outs want = outs_new(c, T);
        ep_err err = {0};
        CHECK(moe_forward(fx->layers[layer], T, fx->x, fx->ids, want.out, want.ids, want.w, NULL,
                          &err) == 0);
        const char *what = NULL;
        int t = first_diff(fx, &got, &want, T, &what);
        if (t >= 0)
            TEST_FAIL_AT("%s: layer %s, T %d: token %d differs from moe_forward in %s", label,
                         layer_name, T, t, what);
        outs_free(&want);
    }
    epmoe_request_free(&rq);
    epmoe_close(&cl);
    outs_free(&got);
}

static void real_cluster_run(const fixture *fx, int P, const char *dispatch, const char *placement)
{
    real_cluster rc = {.next_id = 0};
    char label[96];
    snprintf(label, sizeof label, "real coordinator, %s experts, %d workers, %s dispatch",
             mc_dtype_name(fx->c.expert_dtype), P, dispatch);
    snprintf(rc.dir, sizeof rc.dir, "/tmp/epmoe_test_cluster_XXXXXX");
    if (!mkdtemp(rc.dir) || real_write_spec(&rc, fx, P, dispatch, placement) != 0) {
        TEST_FAIL_AT("%s: cannot write the spec", label);
        return;
    }
    char spec[128];
    snprintf(spec, sizeof spec, "%s/cluster.yaml", rc.dir);
    fflush(stdout);
    rc.coord = fork();
    if (rc.coord == 0) {
        execl(EPMOE_COORDINATOR_BIN, EPMOE_COORDINATOR_BIN, "--cluster", spec, (char *)NULL);
        _exit(127);
    }
    pid_t workers[MAXP];
    for (int r = 0; r < P; r++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", r);
        workers[r] = spawn_worker(rc.listen, name);
    }
    rc.client = zmq_socket(zctx, ZMQ_DEALER);
    wire_socket_defaults(rc.client, EP_MAX_DATA_MSG, NULL);
    zmq_connect(rc.client, rc.admin);
    if (real_wait_ready(&rc) == 0) {
        static const int Ts[] = {1, 64, 300};
        static const char *const names[] = {"layers.0", "1", "mtp.0"};
        for (int l = 0; l < 3; l++)
            for (int i = 0; i < 3; i++)
                real_forward(&rc, fx, names[l], l, Ts[i], label);
    } else {
        TEST_FAIL_AT("%s: not ready", label);
    }
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN;
    wire_msg m;
    Epmoe__AdminReply *r = real_call(&rc, &rq, NULL, 0, &m);
    CHECK(r && r->ok);
    if (r) {
        wire_free_unpacked(&r->base);
        wire_msg_close(&m);
    }
    CHECK_EQ(wait_exit(rc.coord, WAIT_S), 0);
    for (int i = 0; i < P; i++)
        CHECK_EQ(wait_exit(workers[i], WAIT_S), 0);
    zmq_close(rc.client);
    snprintf(spec, sizeof spec, "%s/cluster.yaml", rc.dir);
    unlink(spec);
    rmdir(rc.dir);
    kill_children();
}

TEST(real_coordinator_cluster_is_bit_exact)
{
    if (!fx4_ok || !fx8_ok)
        SKIP("no fixture");
    real_cluster_run(&fx4, 2, "fp8", "contiguous");
    real_cluster_run(&fx8, 3, "bf16", "round_robin");
}

int main(void)
{
    test_isa_cap_from_env();
    signal(SIGPIPE, SIG_IGN);
    zctx = zmq_ctx_new();
    fx4_ok = fixture_init(&fx4, MC_FP4, 0, true) == 0;
    fx8_ok = fixture_init(&fx8, MC_FP8, 0, true) == 0;
    CHECK(fx4_ok && fx8_ok);
    RUN(one_worker_is_bit_exact);
    RUN(two_workers_are_bit_exact);
    RUN(three_workers_are_bit_exact);
    RUN(four_workers_are_bit_exact);
    RUN(misstated_hash_and_unknown_name_exit_78);
    RUN(load_failure_names_the_tensor_and_worker_stays_up);
    RUN(step_abort_and_timeout_name_the_cause);
    RUN(garbage_on_the_data_plane_is_ignored);
    RUN(sigterm_exits_zero);
    RUN(silent_coordinator_makes_the_worker_register_again);
    RUN(bad_endpoints_and_keys_are_usage_errors);
    RUN(permanent_refusals_exit_78);
    RUN(a_worker_whose_key_is_refused_exits_78);
    RUN(forged_combines_never_change_a_result);
    RUN(stray_future_dispatches_do_not_block_later_steps);
    RUN(a_restarted_worker_ignores_what_peers_sent_while_it_was_gone);
    RUN(a_worker_away_for_10000_steps_serves_its_first_step_back);
    RUN(real_coordinator_cluster_is_bit_exact);
    kill_children();
    fixture_free(&fx4);
    fixture_free(&fx8);
    zmq_ctx_term(zctx);
    return test_report();
}
