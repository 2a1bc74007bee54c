/*
 * sim_workers.c — N simulated workers speaking the real control protocol to a real
 * epmoe-coordinator, without weights or a data plane (issue 9: the coordinator at scale).
 *
 *   sim_workers --coordinator tcp://H:P --names w0000..w1023 | --prefix w --count N
 *               [--threads T] [--skew S] [--silence NAME --silence-after MS]
 *
 * Each simulated worker has its own DEALER (routing id NAME/sim) and walks the real lifecycle:
 * REGISTER -> WELCOME (decoded and checked: config, hash, placement table) -> CONFIG_ACK with
 * its own mc_hash -> LOAD -> READY {n_experts, n_slots}; EPOCH -> READY (staged: READY{staged},
 * then EPOCH_COMMIT -> READY); HEARTBEAT every heartbeat_ms; STEP -> STEP_DONE with the shapes
 * the coordinator checks (zero outputs) and a routing of its tokens: each token picks top-k
 * distinct experts by a Zipf(S) popularity (a fixed permutation per layer), its pairs go to a
 * replica by the real rule (pl_pick), and routed_expert / pair_rank carry that load, so the
 * coordinator's statistics, balance and rebalance work on it.
 *
 * --silence NAME: that worker stops reading and sending (a hung process) on SIGUSR1, or MS ms
 * after it was ready with --silence-after; the process prints "silenced NAME at EPOCH_MS"
 * (CLOCK_REALTIME ms) on stdout, so a driver can time the coordinator's reaction. Threads: the
 * workers are split over T threads, each one zmq_poll loop over its sockets. Runs until
 * SIGTERM/SIGINT or SHUTDOWN for all.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/limits.h"
#include "common/model_config.h"
#include "common/model_msg.h"
#include "common/placement.h"
#include "common/wire.h"

#define SIM_MAX 1024

typedef struct sim_worker {
    char name[64], ident[80];
    void *sock;
    int rank, world;
    uint64_t epoch, staged;
    const pl_table *pl, *staged_pl; /* the table in force, the staged one (shared, cached) */
    mc_config cfg;
    bool have_cfg, ready, silent, shut;
    int hb_ms;
    int64_t next_hb, ready_ms;
    uint64_t rng;
} sim_worker;

typedef struct sim_thread {
    pthread_t th;
    sim_worker *w;
    int n;
} sim_thread;

static const char *g_coord, *g_silence;
static int g_count;               /* simulated workers */
static atomic_int g_silenced;     /* of them silent */
static atomic_ullong g_ack_epoch; /* the newest epoch READY was sent for */
static atomic_int g_acks;         /* and how many sent it */
static int g_silence_after_ms;
static double g_skew = 1.2;
static atomic_int g_stop, g_silence_now;

/* Decoded tables shared by the simulated workers of this process: each worker receives and
 * checks its own message, but the bytes of one epoch's table are the same for all, so the
 * first decode is kept (a real worker decodes on its own host; here one process plays 1,024)
 * and the others compare bytes. */
typedef struct sim_cached {
    uint8_t *raw; /* the message's table fields, concatenated */
    size_t len;
    pl_table *t;
    struct sim_cached *next;
} sim_cached;

static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_cached *g_cache;

static const pl_table *sim_table(const mc_config *c, int world, const uint32_t *owner,
                                 size_t n_owner, const Epmoe__Placement *pm, ep_err *err)
{
    size_t len = n_owner * 4 +
                 (pm ? pm->layer_table.len + pm->replica_count.len + pm->replica_rank.len + 4 : 0);
    uint8_t *raw = malloc(len + 1);
    if (raw == NULL)
        return NULL;
    size_t o = n_owner * 4;
    memcpy(raw, owner, n_owner * 4);
    if (pm) {
        memcpy(raw + o, pm->layer_table.data, pm->layer_table.len);
        o += pm->layer_table.len;
        memcpy(raw + o, pm->replica_count.data, pm->replica_count.len);
        o += pm->replica_count.len;
        memcpy(raw + o, pm->replica_rank.data, pm->replica_rank.len);
        o += pm->replica_rank.len;
        memcpy(raw + o, &pm->n_layers, 4);
    }
    pthread_mutex_lock(&g_cache_lock);
    sim_cached *h = g_cache;
    while (h && (h->len != len || memcmp(h->raw, raw, len) != 0))
        h = h->next;
    if (h == NULL) {
        pl_table *t = mmsg_placement_in(mc_num_layers(c), c->n_routed_experts, world, owner,
                                        n_owner, pm, err);
        if (t != NULL && (h = calloc(1, sizeof *h)) != NULL) {
            *h = (sim_cached){.raw = raw, .len = len, .t = t, .next = g_cache};
            g_cache = h;
            raw = NULL;
        } else {
            pl_free(&t);
        }
    }
    pthread_mutex_unlock(&g_cache_lock);
    free(raw);
    return h ? h->t : NULL;
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        atomic_store(&g_silence_now, 1);
    else
        atomic_store(&g_stop, 1);
}

static void sim_send(sim_worker *w, uint16_t type, const ProtobufCMessage *body,
                     const wire_payload *p, int n)
{
    ep_err err;
    if (wire_send(w->sock, NULL, 0, type, body, p, n, false, &err) != 0)
        fprintf(stderr, "sim %s: %s\n", w->name, err.msg);
}

static void sim_register(sim_worker *w)
{
    Epmoe__Register r = EPMOE__REGISTER__INIT;
    char *caps[1] = {"cpu"};
    r.name = w->name;
    r.device = "cpu";
    r.n_capabilities = 1;
    r.capabilities = caps;
    r.hostname = "sim";
    r.has_pid = 1;
    r.pid = (uint32_t)getpid();
    r.version = "sim";
    sim_send(w, EPMOE__MSG_TYPE__MSG_REGISTER, &r.base, NULL, 0);
}

static void sim_count_ack(uint64_t epoch)
{
    unsigned long long cur = atomic_load(&g_ack_epoch);
    while (epoch > cur && !atomic_compare_exchange_weak(&g_ack_epoch, &cur, epoch))
        ;
    if (epoch > cur)
        atomic_store(&g_acks, 0);
    if (epoch < atomic_load(&g_ack_epoch))
        return;
    if (atomic_fetch_add(&g_acks, 1) + 1 == g_count - atomic_load(&g_silenced)) {
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        printf("epoch %llu acknowledged by all %d live workers at %lld\n",
               (unsigned long long)epoch, g_count - atomic_load(&g_silenced),
               (long long)rt.tv_sec * 1000 + rt.tv_nsec / 1000000);
        fflush(stdout);
    }
}

static void sim_ready(sim_worker *w, const pl_table *t, uint64_t epoch, bool staged)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static const pl_table *counted; /* the table the counts below are of */
    static int max[SIM_MAX], slots_of[SIM_MAX];
    pthread_mutex_lock(&lock);
    if (counted != t) {
        pl_rank_counts(t, max, slots_of);
        counted = t;
    }
    int slots = slots_of[w->rank], most = max[w->rank];
    pthread_mutex_unlock(&lock);
    Epmoe__Ready r = EPMOE__READY__INIT;
    r.has_epoch = r.has_config_hash = r.has_n_experts = r.has_n_slots = r.has_slots_kept = 1;
    r.epoch = epoch;
    r.config_hash = mc_hash(&w->cfg);
    r.n_experts = (uint32_t)most;
    r.n_slots = (uint32_t)slots;
    r.slots_kept = (uint32_t)slots; /* nothing to read: no weights */
    r.has_staged = staged;
    r.staged = staged;
    r.backend = "sim";
    /* a client endpoint as a real worker reports (nothing binds it): CLIENT_INFO is the size a
     * real cluster's is (sim_clients) */
    char client_ep[64];
    snprintf(client_ep, sizeof client_ep, "tcp://10.%d.%d.%d:7600", w->rank >> 16 & 255,
             w->rank >> 8 & 255, w->rank & 255);
    r.client_endpoint = client_ep;
    sim_send(w, EPMOE__MSG_TYPE__MSG_READY, &r.base, NULL, 0);
    if (!staged) /* the last worker to acknowledge an epoch says when (CLOCK_REALTIME ms) */
        sim_count_ack(epoch);
}

static void sim_welcome(sim_worker *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__Welcome *wm = (Epmoe__Welcome *)wire_unpack(&epmoe__welcome__descriptor, m, &err);
    if (wm == NULL || wm->config == NULL || mmsg_to_config(wm->config, &w->cfg, &err) != 0) {
        fprintf(stderr, "sim %s: bad WELCOME: %s\n", w->name, err.msg);
        wire_free_unpacked(wm ? &wm->base : NULL);
        return;
    }
    w->pl = sim_table(&w->cfg, (int)wm->world_size, wm->expert_owner, wm->n_expert_owner,
                      wm->placement, &err);
    if (w->pl == NULL)
        fprintf(stderr, "sim %s: WELCOME placement: %s\n", w->name, err.msg);
    w->rank = (int)wm->rank;
    w->world = (int)wm->world_size;
    w->epoch = wm->epoch;
    w->hb_ms = (int)wm->heartbeat_ms;
    w->have_cfg = true;
    w->ready = false;
    Epmoe__ConfigAck a = EPMOE__CONFIG_ACK__INIT;
    a.has_config_hash = a.has_epoch = 1;
    a.config_hash = mc_hash(&w->cfg);
    a.epoch = w->epoch;
    sim_send(w, EPMOE__MSG_TYPE__MSG_CONFIG_ACK, &a.base, NULL, 0);
    wire_free_unpacked(&wm->base);
}

static void sim_epoch(sim_worker *w, const wire_msg *m)
{
    ep_err err;
    Epmoe__Epoch *e = (Epmoe__Epoch *)wire_unpack(&epmoe__epoch__descriptor, m, &err);
    const pl_table *t =
        e ? sim_table(&w->cfg, w->world, e->expert_owner, e->n_expert_owner, e->placement, &err)
          : NULL;
    if (t == NULL) {
        fprintf(stderr, "sim %s: bad EPOCH: %s\n", w->name, err.msg);
        wire_free_unpacked(e ? &e->base : NULL);
        return;
    }
    if (e->has_staged && e->staged) {
        w->staged_pl = t;
        w->staged = e->epoch;
        sim_ready(w, t, e->epoch, true);
    } else {
        w->pl = t;
        w->epoch = e->epoch;
        sim_ready(w, t, e->epoch, false);
    }
    wire_free_unpacked(&e->base);
}

static void sim_commit(sim_worker *w, const wire_msg *m)
{
    Epmoe__EpochCommit *c =
        (Epmoe__EpochCommit *)wire_unpack(&epmoe__epoch_commit__descriptor, m, NULL);
    if (c && c->has_epoch && c->epoch == w->staged && w->staged_pl) {
        w->pl = w->staged_pl;
        w->staged_pl = NULL;
        w->epoch = w->staged;
        sim_ready(w, w->pl, w->epoch, false);
    }
    wire_free_unpacked(c ? &c->base : NULL);
}

static uint32_t sim_rand(sim_worker *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)(w->rng >> 11);
}

/* An expert drawn by Zipf(g_skew) popularity; layer l permutes which ids are hot. */
static int sim_expert(sim_worker *w, int E, int l)
{
    static _Thread_local double *cum;
    static _Thread_local int cum_e;
    if (cum_e != E) {
        free(cum);
        cum = malloc((size_t)E * sizeof *cum);
        for (int i = 0; i < E; i++)
            cum[i] = 1.0 / pow(i + 1, g_skew) + (i ? cum[i - 1] : 0);
        cum_e = E;
    }
    double u = ((double)sim_rand(w) + 0.5) / 4294967296.0 * cum[E - 1];
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cum[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (int)(((uint32_t)lo * 2654435761u + (uint32_t)l * 40503u) % (uint32_t)E);
}

static void sim_step(sim_worker *w, const wire_msg *m)
{
    Epmoe__Step *s = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, m, NULL);
    if (s == NULL || w->pl == NULL) {
        wire_free_unpacked(s ? &s->base : NULL);
        return;
    }
    int E = w->cfg.n_routed_experts, k = w->cfg.num_experts_per_tok, H = w->cfg.hidden_size;
    int n = (int)s->n_tokens, l = (int)s->layer;
    uint32_t *ecount = calloc((size_t)E, 4), *seq = calloc((size_t)E, 4);
    uint32_t *rcount = calloc((size_t)w->world, 4);
    uint32_t *eid = malloc((size_t)E * 4 + 4), *ecnt = malloc((size_t)E * 4 + 4);
    uint32_t *rid = malloc((size_t)w->world * 4 + 4), *rcnt = malloc((size_t)w->world * 4 + 4);
    int32_t *ids = malloc((size_t)n * k * 4 + 4);
    float *wts = malloc((size_t)n * k * 4 + 4);
    uint16_t *out = calloc((size_t)n * H + 1, 2);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do { /* k distinct experts per token */
                e = sim_expert(w, E, l);
                dup = false;
                for (int i = 0; i < j; i++)
                    dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e;
            wts[t * k + j] = 1.0f / (float)k;
            int nr;
            const uint16_t *reps = pl_replicas(w->pl, l < pl_layers(w->pl) ? l : 0, e, &nr);
            rcount[pl_pick(reps, nr, w->rank, seq[e]++)]++;
            ecount[e]++;
        }
    Epmoe__StepDone d = EPMOE__STEP_DONE__INIT;
    d.has_step_id = d.has_n_tokens = 1;
    d.step_id = s->step_id;
    d.n_tokens = (uint32_t)n;
    d.routed_expert = eid;
    d.routed_tokens = ecnt;
    d.pair_rank = rid;
    d.pair_count = rcnt;
    for (int e = 0; e < E; e++)
        if (ecount[e]) {
            eid[d.n_routed_expert] = (uint32_t)e;
            ecnt[d.n_routed_expert++] = ecount[e];
        }
    d.n_routed_tokens = d.n_routed_expert;
    for (int r = 0; r < w->world; r++)
        if (rcount[r]) {
            rid[d.n_pair_rank] = (uint32_t)r;
            rcnt[d.n_pair_rank++] = rcount[r];
        }
    d.n_pair_count = d.n_pair_rank;
    wire_payload p[3] = {{.data = out, .len = (size_t)n * H * 2},
                         {.data = ids, .len = (size_t)n * k * 4},
                         {.data = wts, .len = (size_t)n * k * 4}};
    sim_send(w, EPMOE__MSG_TYPE__MSG_STEP_DONE, &d.base, p, 3);
    free(ecount);
    free(seq);
    free(rcount);
    free(eid);
    free(ecnt);
    free(rid);
    free(rcnt);
    free(ids);
    free(wts);
    free(out);
    wire_free_unpacked(&s->base);
}

static void sim_message(sim_worker *w, const wire_msg *m)
{
    switch (m->type) {
    case EPMOE__MSG_TYPE__MSG_WELCOME:
        sim_welcome(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_LOAD:
        if (w->pl)
            sim_ready(w, w->pl, w->epoch, false);
        w->ready = true;
        w->ready_ms = now_ms();
        break;
    case EPMOE__MSG_TYPE__MSG_EPOCH:
        sim_epoch(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_EPOCH_COMMIT:
        sim_commit(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP:
        sim_step(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_SHUTDOWN:
        w->shut = true;
        break;
    default:
        break; /* HEARTBEAT, STEP_ABORT, Error: nothing to do */
    }
}

static void sim_tick(sim_worker *w, int64_t now)
{
    if (w->silent || w->shut)
        return;
    if (g_silence && strcmp(w->name, g_silence) == 0 && w->ready &&
        (atomic_load(&g_silence_now) ||
         (g_silence_after_ms > 0 && now - w->ready_ms >= g_silence_after_ms))) {
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        w->silent = true;
        atomic_fetch_add(&g_silenced, 1);
        printf("silenced %s at %lld\n", w->name,
               (long long)rt.tv_sec * 1000 + rt.tv_nsec / 1000000);
        fflush(stdout);
        return;
    }
    if (w->have_cfg && now >= w->next_hb) {
        Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
        hb.has_epoch = 1;
        hb.epoch = w->epoch;
        sim_send(w, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base, NULL, 0);
        w->next_hb = now + w->hb_ms;
    }
}

static void *sim_run(void *arg)
{
    sim_thread *t = arg;
    zmq_pollitem_t *it = calloc((size_t)t->n, sizeof *it);
    while (!atomic_load(&g_stop)) {
        int live = 0;
        for (int i = 0; i < t->n; i++) {
            it[i] = (zmq_pollitem_t){.socket = t->w[i].sock, .events = ZMQ_POLLIN};
            live += !t->w[i].shut;
        }
        if (live == 0)
            break;
        zmq_poll(it, t->n, 50);
        int64_t now = now_ms();
        for (int i = 0; i < t->n; i++) {
            sim_worker *w = &t->w[i];
            while (!w->silent && (it[i].revents & ZMQ_POLLIN)) {
                wire_msg m;
                ep_err err;
                if (wire_recv(w->sock, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m,
                              &err) != WIRE_OK)
                    break;
                sim_message(w, &m);
                wire_msg_close(&m);
            }
            sim_tick(w, now);
        }
    }
    free(it);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *prefix = "w";
    int count = 0, threads = 4;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--coordinator") == 0 && i + 1 < argc)
            g_coord = argv[++i];
        else if (strcmp(argv[i], "--prefix") == 0 && i + 1 < argc)
            prefix = argv[++i];
        else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
            count = atoi(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--skew") == 0 && i + 1 < argc)
            g_skew = atof(argv[++i]);
        else if (strcmp(argv[i], "--silence") == 0 && i + 1 < argc)
            g_silence = argv[++i];
        else if (strcmp(argv[i], "--silence-after") == 0 && i + 1 < argc)
            g_silence_after_ms = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: sim_workers --coordinator EP --count N [--prefix P] "
                            "[--threads T] [--skew S] [--silence NAME --silence-after MS]\n");
            return 64;
        }
    }
    if (g_coord == NULL || count < 1 || count > SIM_MAX || threads < 1 || threads > count) {
        fprintf(stderr, "sim_workers: --coordinator and --count 1..%d are required\n", SIM_MAX);
        return 64;
    }
    g_count = count;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGUSR1, on_signal);
    void *zctx = zmq_ctx_new();
    zmq_ctx_set(zctx, ZMQ_IO_THREADS, 2);
    zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, 2 * SIM_MAX + 64);
    sim_worker *w = calloc((size_t)count, sizeof *w);
    for (int i = 0; i < count; i++) {
        snprintf(w[i].name, sizeof w[i].name, "%s%04d", prefix, i);
        snprintf(w[i].ident, sizeof w[i].ident, "%s/sim", w[i].name);
        w[i].sock = zmq_socket(zctx, ZMQ_DEALER);
        w[i].hb_ms = 1000;
        w[i].rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 1) * 0x100000001b3ull;
        int linger = 0;
        zmq_setsockopt(w[i].sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(w[i].sock, ZMQ_ROUTING_ID, w[i].ident, strlen(w[i].ident));
        if (zmq_connect(w[i].sock, g_coord) != 0) {
            fprintf(stderr, "sim_workers: connect %s: %s\n", g_coord, zmq_strerror(zmq_errno()));
            return 70;
        }
        sim_register(&w[i]);
    }
    sim_thread *t = calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++) {
        int a = (int)((int64_t)i * count / threads), b = (int)((int64_t)(i + 1) * count / threads);
        t[i] = (sim_thread){.w = w + a, .n = b - a};
        pthread_create(&t[i].th, NULL, sim_run, &t[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(t[i].th, NULL);
    for (int i = 0; i < count; i++) {
        zmq_close(w[i].sock);
        ;
    }
    zmq_ctx_term(zctx);
    while (g_cache) {
        sim_cached *h = g_cache;
        g_cache = h->next;
        pl_free(&h->t);
        free(h->raw);
        free(h);
    }
    free(w);
    free(t);
    return 0;
}
