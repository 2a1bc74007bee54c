/* itest.c — see itest.h. */
#include "itest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/model_msg.h"

int64_t it_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void it_default_opts(it_opts *o)
{
    *o = (it_opts){.n_workers = 4,
                   .heartbeat_ms = 100,
                   .liveness = 5,
                   .step_timeout_ms = 5000,
                   .expert_dtype = "fp8"};
}

/* Open a listening-free socket bound to an ephemeral port; the caller closes it. */
static int it_port_socket(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

int it_free_port(void)
{
    int port = -1;
    int fd = it_port_socket(&port);
    if (fd >= 0)
        close(fd);
    return port;
}

const char *it_worker_name(const itest *t, int rank)
{
    static _Thread_local char buf[16];
    int n0 = (t->o.n_workers + 1) / 2;
    if (rank < n0)
        snprintf(buf, sizeof buf, "a%d", rank);
    else
        snprintf(buf, sizeof buf, "b%d", rank - n0);
    return buf;
}

static int it_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs(text, f);
    return fclose(f);
}

static int it_write_files(itest *t)
{
    char path[256], text[4096];
    snprintf(path, sizeof path, "%s/model", t->dir);
    if (mkdir(path, 0700) != 0)
        return -1;
    char dtype[64] = "";
    if (t->o.expert_dtype)
        snprintf(dtype, sizeof dtype, "\"expert_dtype\": \"%s\", ", t->o.expert_dtype);
    int n = snprintf(text, sizeof text,
                     "{\"hidden_size\": %d, \"moe_intermediate_size\": 128, \"n_routed_experts\": "
                     "%d, \"n_shared_experts\": 1, \"num_experts_per_tok\": %d, "
                     "\"num_hidden_layers\": %d, \"num_hash_layers\": %d, "
                     "\"num_nextn_predict_layers\": %d, \"vocab_size\": %d, %s"
                     "\"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"rms_norm_eps\": "
                     "1e-6, \"scoring_func\": \"sqrtsoftplus\"}\n",
                     IT_H, IT_E, IT_K, IT_L, IT_HASH, IT_MTP, IT_VOCAB, dtype);
    snprintf(path, sizeof path, "%s/model/config.json", t->dir);
    ep_err err;
    if (it_write(path, text) != 0 || mc_parse(text, (size_t)n, path, &t->cfg, &err) != 0) {
        fprintf(stderr, "itest: config.json: %s\n", err.msg);
        return -1;
    }
    /* ports: hold every socket until all are chosen so none is handed out twice */
    int fds[2 + IT_MAX_WORKERS], ports[2 + IT_MAX_WORKERS], nf = 2 + IT_MAX_WORKERS;
    for (int i = 0; i < nf; i++)
        fds[i] = it_port_socket(&ports[i]);
    for (int i = 0; i < nf; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    snprintf(t->listen, sizeof t->listen, "tcp://127.0.0.1:%d", ports[0]);
    snprintf(t->admin, sizeof t->admin, "tcp://127.0.0.1:%d", ports[1]);
    for (int i = 0; i < IT_MAX_WORKERS; i++)
        t->data_port[i] = ports[2 + i];
    return it_write_spec(t);
}

int it_write_spec(itest *t)
{
    char text[8192];
    size_t len = (size_t)snprintf(
        text, sizeof text,
        "cluster:\n  name: itest\ncoordinator:\n  listen: \"%s\"\n  admin: \"%s\"\n"
        "  heartbeat_ms: %d\n  liveness: %d\n  step_timeout_ms: %d\nmodel:\n  path: model\n"
        "expert_parallel:\n  placement: contiguous\n  dispatch: fp8\n  data_plane: %s\n%snodes:\n",
        t->listen, t->admin, t->o.heartbeat_ms, t->o.liveness, t->o.step_timeout_ms,
        t->o.nccl ? "nccl" : "zmq", t->o.ep_extra ? t->o.ep_extra : "");
    int n0 = (t->o.n_workers + 1) / 2;
    for (int r = 0; r < t->o.n_workers; r++) {
        if (r == 0 || r == n0)
            len += (size_t)snprintf(text + len, sizeof text - len, "  - name: n%d\n    workers:\n",
                                    r == 0 ? 0 : 1);
        char dev[16] = "cpu";
        const char *name = it_worker_name(t, r);
        /* a device that stays with the name when a reload renumbers the ranks */
        if (t->o.nccl)
            snprintf(dev, sizeof dev, "\"cuda:%d\"", (name[0] - 'a') * 32 + atoi(name + 1));
        char client[128] = "";
        if (t->o.client_endpoints)
            snprintf(client, sizeof client, ", client: \"ipc://%s/%s.client\"", t->dir, name);
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "      - {name: %s, device: %s, data: \"tcp://127.0.0.1:%d\"%s}\n",
                                name, dev, t->data_port[r], client);
    }
    if (t->o.keys_dir)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "security:\n  coordinator_key: %s/coordinator.key\n"
                                "  worker_keys: %s/workers\n  operator_keys: %s/ops\n"
                                "  client_keys: %s/clients\n",
                                t->o.keys_dir, t->o.keys_dir, t->o.keys_dir, t->o.keys_dir);
    return it_write(t->spec_path, text);
}

/* security: make sock a CURVE client of the coordinator with the secret key in key_path. */
static void it_curve(itest *t, void *sock, const char *key_path)
{
    if (t->o.keys_dir == NULL)
        return;
    char cpub[256];
    snprintf(cpub, sizeof cpub, "%s/coordinator.pub", t->o.keys_dir);
    auth_keypair kp;
    uint8_t server[AUTH_KEY_BYTES];
    ep_err err;
    if (auth_load_secret(key_path, &kp, &err) != 0 || auth_load_public(cpub, server, &err) != 0 ||
        auth_client(sock, &kp, server, &err) != 0)
        fprintf(stderr, "itest: CURVE client with %s: %s\n", key_path, err.msg);
}

static void *it_socket(itest *t, int type)
{
    void *s = zmq_socket(t->zctx, type);
    wire_socket_defaults(s, (int64_t)EP_MAX_DATA_MSG, NULL);
    return s;
}

itest *it_start(const char *coord_bin, const it_opts *o)
{
    itest *t = calloc(1, sizeof *t);
    t->o = *o;
    snprintf(t->dir, sizeof t->dir, "/tmp/epmoe-itest-XXXXXX");
    if (mkdtemp(t->dir) == NULL) {
        perror("mkdtemp");
        free(t);
        return NULL;
    }
    snprintf(t->spec_path, sizeof t->spec_path, "%s/cluster.yaml", t->dir);
    snprintf(t->log_path, sizeof t->log_path, "%s/coord.log", t->dir);
    t->zctx = zmq_ctx_new();
    t->exit_status = -1;
    if (it_write_files(t) != 0) {
        fprintf(stderr, "itest: cannot write the test files in %s\n", t->dir);
        it_finish(&t, false);
        return NULL;
    }
    t->pid = fork();
    if (t->pid == 0) {
        int fd = open(t->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(coord_bin, coord_bin, "--cluster", t->spec_path, (char *)NULL);
        perror("exec");
        _exit(127);
    }
    /* up when the admin socket answers */
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    if (r == NULL) {
        fprintf(stderr, "itest: the coordinator did not answer STATUS\n");
        it_finish(&t, true);
        return NULL;
    }
    t->epoch1 = r->epoch;
    return t;
}

uint64_t it_epoch(const itest *t, int n)
{
    return t->epoch1 + (uint64_t)(n - 1);
}

int it_wait_exit(itest *t, int ms)
{
    if (t->pid <= 0)
        return t->exit_status;
    int64_t end = it_now_ms() + ms;
    for (;;) {
        int st;
        pid_t p = waitpid(t->pid, &st, WNOHANG);
        if (p == t->pid) {
            t->pid = 0;
            t->exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return t->exit_status;
        }
        if (it_now_ms() >= end)
            return -1;
        usleep(5000);
    }
}

static void it_client_clear(it_client *c)
{
    if (c->reply)
        wire_free_unpacked(&c->reply->base);
    c->reply = NULL;
    if (c->msg) {
        wire_msg_close(c->msg);
        free(c->msg);
    }
    c->msg = NULL;
    c->have_reply = false;
    c->error_type_code = -1;
}

static void it_worker_free(it_worker *w)
{
    if (w->slow_step) {
        wire_msg_close(w->slow_step);
        free(w->slow_step);
    }
    if (w->welcome)
        wire_free_unpacked(&w->welcome->base);
    if (w->sock)
        zmq_close(w->sock);
    free(w);
}

static void it_dump_log(const itest *t)
{
    FILE *f = fopen(t->log_path, "r");
    if (f == NULL)
        return;
    char line[2048];
    printf("---- %s ----\n", t->log_path);
    while (fgets(line, sizeof line, f))
        fputs(line, stdout);
    printf("---- end ----\n");
    fclose(f);
}

int it_finish(itest **tp, bool dump_log)
{
    itest *t = *tp;
    if (t == NULL)
        return -1;
    int rc = t->exit_status;
    if (t->pid > 0) {
        kill(t->pid, SIGTERM);
        rc = it_wait_exit(t, 5000);
        if (rc < 0) {
            printf("  itest: the coordinator did not exit within 5 s of SIGTERM\n");
            kill(t->pid, SIGKILL);
            it_wait_exit(t, 5000);
        }
    }
    if (dump_log || rc != 0)
        it_dump_log(t);
    for (int i = 0; i < t->n_w; i++)
        it_worker_free(t->w[i]);
    for (int i = 0; i < t->n_cl; i++) {
        it_client_clear(t->cl[i]);
        zmq_close(t->cl[i]->sock);
        free(t->cl[i]);
    }
    if (t->zctx)
        zmq_ctx_term(t->zctx);
    char path[256];
    const char *files[] = {"model/config.json", "cluster.yaml",   "coord.log",      "out.txt",
                           "err.txt",           "in.safetensors", "out.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", t->dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/model", t->dir);
    rmdir(path);
    rmdir(t->dir);
    free(t);
    *tp = NULL;
    return rc;
}

/* ---- fake workers ---- */

it_worker *it_worker_new(itest *t, const char *name)
{
    if (t->n_w == IT_MAX_WORKERS) {
        fprintf(stderr, "itest: more than %d fake workers\n", IT_MAX_WORKERS);
        abort();
    }
    it_worker *w = calloc(1, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->rank = -1;
    w->nccl = t->o.nccl;
    t->w[t->n_w++] = w;
    it_worker_reconnect(t, w);
    return w;
}

void it_worker_reconnect(itest *t, it_worker *w)
{
    if (w->sock) {
        zmq_close(w->sock);
        /* as a restarted process: its old connection is closed by the time it registers (the
         * coordinator refuses a name whose other connection is still open) */
        usleep(200000);
    }
    w->sock = it_socket(t, ZMQ_DEALER);
    /* a routing id of this connection's own, as epmoe-worker uses ("NAME#n") */
    char ident[96];
    snprintf(ident, sizeof ident, "%s#%d", w->name, ++w->n_connections);
    zmq_setsockopt(w->sock, ZMQ_ROUTING_ID, ident, strlen(ident));
    char key[256];
    snprintf(key, sizeof key, "%s/workers/%s.key", t->o.keys_dir ? t->o.keys_dir : "", w->name);
    it_curve(t, w->sock, w->key ? w->key : key);
    zmq_connect(w->sock, t->listen);
    w->welcomed = w->loaded = false;
    w->held_step = 0;
    w->auto_join = w->joining = false;
    w->ready_due_ms = 0;
}

int it_worker_send(it_worker *w, uint16_t type, const ProtobufCMessage *body)
{
    return wire_send(w->sock, NULL, 0, type, body, NULL, 0, false, NULL);
}

static void it_send_step_failed(it_worker *w, uint64_t step_id, const char *text)
{
    Epmoe__StepFailed f = EPMOE__STEP_FAILED__INIT;
    f.has_step_id = 1;
    f.step_id = step_id;
    f.has_code = 1;
    f.code = EPMOE__ERROR_CODE__ERR_STEP_FAILED;
    f.message = (char *)text;
    f.has_comm_aborted = w->nccl; /* as the NCCL step driver does on every failure */
    f.comm_aborted = w->nccl;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &f.base);
}

/* COMM_INIT: rank 0 of a new communicator makes an id and sends COMM_ID; then COMM_DONE. */
static void it_on_comm_init(it_worker *w, const wire_msg *m)
{
    Epmoe__CommInit *ci = (Epmoe__CommInit *)wire_unpack(&epmoe__comm_init__descriptor, m, NULL);
    if (ci == NULL)
        return;
    w->n_comm_inits++;
    w->comm_gen = ci->generation;
    w->got_id = ci->has_nccl_id && ci->nccl_id.len == sizeof w->comm_id;
    if (w->got_id)
        memcpy(w->comm_id, ci->nccl_id.data, sizeof w->comm_id);
    if (!w->comm_silent) {
        if (!ci->has_nccl_id) {
            for (size_t i = 0; i < sizeof w->comm_id; i++)
                w->comm_id[i] = (uint8_t)(i * 7 + ci->generation);
            Epmoe__CommId id = EPMOE__COMM_ID__INIT;
            id.has_epoch = id.has_generation = id.has_nccl_id = 1;
            id.epoch = ci->epoch;
            id.generation = ci->generation;
            id.nccl_id.len = sizeof w->comm_id;
            id.nccl_id.data = w->comm_id;
            it_worker_send(w, EPMOE__MSG_TYPE__MSG_COMM_ID, &id.base);
        }
        Epmoe__CommDone d = EPMOE__COMM_DONE__INIT;
        d.has_epoch = d.has_generation = d.has_ok = 1;
        d.epoch = ci->epoch;
        d.generation = ci->generation;
        d.ok = 1;
        it_worker_send(w, EPMOE__MSG_TYPE__MSG_COMM_DONE, &d.base);
    }
    wire_free_unpacked(&ci->base);
}

/* The fake step: see itest.h for the function it computes. */
static void it_answer_step(it_worker *w, const Epmoe__Step *s, const wire_msg *m)
{
    size_t n = s->n_tokens;
    bool ids = s->has_has_ids && s->has_ids;
    if (m->n_payloads != (ids ? 2 : 1) || m->payload_len[0] != n * IT_H * 2 ||
        (ids && m->payload_len[1] != n * 8)) {
        it_send_step_failed(w, s->step_id, "fake worker: STEP payloads do not match n_tokens");
        return;
    }
    size_t out_len = n * IT_H * 2 + (w->behaviour == IT_BAD_DONE ? 2 : 0);
    uint16_t *out = malloc(out_len + 2);
    int32_t *tid = malloc(n * IT_K * 4 + 4);
    float *wts = malloc(n * IT_K * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        uint16_t in[IT_H];
        memcpy(in, m->payload[0] + i * IT_H * 2, sizeof in);
        for (int h = 0; h < IT_H; h++)
            out[i * IT_H + h] = in[h] ^ 0x5A5A;
        int64_t id = 0;
        if (ids)
            memcpy(&id, m->payload[1] + i * 8, 8);
        tid[i * IT_K] = w->rank;
        tid[i * IT_K + 1] = ids ? (int32_t)id : (int32_t)in[0];
        wts[i * IT_K] = (float)in[1];
        wts[i * IT_K + 1] = (float)n;
    }
    w->last_step = s->step_id;
    w->step_members = w->members;
    Epmoe__StepDone d = EPMOE__STEP_DONE__INIT;
    d.has_step_id = 1;
    d.step_id = s->step_id;
    d.has_n_tokens = 1;
    d.n_tokens = (uint32_t)n;
    d.has_dispatch_bytes = 1;
    d.dispatch_bytes = 1000 + (uint64_t)w->rank;
    d.has_combine_bytes = 1;
    d.combine_bytes = 10 * n;
    wire_payload p[3] = {{.data = out, .len = out_len, .free_fn = wire_free_malloc},
                         {.data = tid, .len = n * IT_K * 4, .free_fn = wire_free_malloc},
                         {.data = wts, .len = n * IT_K * 4, .free_fn = wire_free_malloc}};
    wire_send(w->sock, NULL, 0, EPMOE__MSG_TYPE__MSG_STEP_DONE, &d.base, p, 3, false, NULL);
}

/* Returns true when it kept m (IT_SLOW answers later). */
static bool it_on_step(it_worker *w, wire_msg *m)
{
    Epmoe__Step *s = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, m, NULL);
    if (s == NULL)
        return false;
    w->n_steps++;
    bool kept = false;
    switch (w->behaviour) {
    case IT_SLOW:
        if (w->slow_step == NULL) {
            w->slow_step = m;
            w->slow_due_ms = it_now_ms() + w->step_delay_ms;
            kept = true;
        }
        break;
    case IT_FAIL: {
        char text[128];
        snprintf(text, sizeof text, "injected failure on %s", w->name);
        it_send_step_failed(w, s->step_id, text);
        break;
    }
    case IT_HOLD:
        w->held_step = s->step_id;
        break;
    default:
        it_answer_step(w, s, m);
        break;
    }
    wire_free_unpacked(&s->base);
    return kept;
}

/* IT_SLOW: answer the kept STEP once it is due. */
static void it_slow_answer(it_worker *w)
{
    if (w->slow_step == NULL || it_now_ms() < w->slow_due_ms)
        return;
    Epmoe__Step *s = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, w->slow_step, NULL);
    if (s != NULL)
        it_answer_step(w, s, w->slow_step);
    wire_free_unpacked(s ? &s->base : NULL);
    wire_msg_close(w->slow_step);
    free(w->slow_step);
    w->slow_step = NULL;
}

/* Members as a bit mask (absent: every rank of the world) and the experts rank owns. */
static void it_placement(it_worker *w, const uint32_t *members, size_t n_members,
                         const uint32_t *owner, size_t n_owner)
{
    w->members = 0;
    for (size_t i = 0; i < n_members; i++)
        if (members[i] < 32)
            w->members |= 1u << members[i];
    if (n_members == 0)
        w->members = w->world_size >= 32 ? ~0u : (1u << w->world_size) - 1;
    w->owned = 0;
    for (size_t e = 0; e < n_owner; e++)
        w->owned += owner[e] == (uint32_t)w->rank;
}

static void it_on_epoch(it_worker *w, const wire_msg *m)
{
    Epmoe__Epoch *ep = (Epmoe__Epoch *)wire_unpack(&epmoe__epoch__descriptor, m, NULL);
    if (ep == NULL || !ep->has_epoch) {
        wire_free_unpacked(ep ? &ep->base : NULL);
        return;
    }
    w->n_epochs++;
    w->epoch = ep->epoch;
    it_placement(w, ep->members, ep->n_members, ep->expert_owner, ep->n_expert_owner);
    w->ready_due_ms = it_now_ms() + w->epoch_delay_ms;
    wire_free_unpacked(&ep->base);
}

static void it_send_ready(it_worker *w)
{
    Epmoe__Ready rd = EPMOE__READY__INIT;
    rd.has_epoch = 1;
    rd.epoch = w->epoch;
    rd.has_config_hash = 1;
    rd.config_hash = w->config_hash;
    rd.has_n_experts = 1;
    rd.n_experts = w->owned;
    rd.has_bytes_loaded = 1;
    rd.bytes_loaded = 100;
    rd.backend = "fake";
    rd.has_bytes_read = rd.has_load_ms = 1; /* 4.5 GB read in 1.5 s: 3.00 GB/s */
    rd.bytes_read = 4500000000ull;
    rd.load_ms = 1500;
    rd.client_endpoint = w->client_ep[0] ? w->client_ep : NULL;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_READY, &rd.base);
}

/* CONFIG_ACK {hash of the last WELCOME's config, its epoch}, as epmoe-worker answers every
 * WELCOME (hash 0 when the config cannot be read: the coordinator refuses it); READY carries
 * the same hash. */
static void it_ack_welcome(it_worker *w)
{
    mc_config cfg;
    Epmoe__ConfigAck a = EPMOE__CONFIG_ACK__INIT;
    a.has_config_hash = a.has_epoch = 1;
    a.config_hash = mmsg_to_config(w->welcome->config, &cfg, NULL) == 0 ? mc_hash(&cfg) : 0;
    a.epoch = w->welcome->epoch;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_CONFIG_ACK, &a.base);
    w->config_hash = a.config_hash;
}

/* Returns true when it kept m. */
static bool it_worker_handle(it_worker *w, wire_msg *m)
{
    switch (m->type) {
    case EPMOE__MSG_TYPE__MSG_HEARTBEAT: {
        int64_t now = it_now_ms();
        if (w->last_hb_ms > 0 && now - w->last_hb_ms > w->max_hb_gap_ms)
            w->max_hb_gap_ms = now - w->last_hb_ms;
        w->last_hb_ms = now;
        w->n_heartbeats++;
        break;
    }
    case EPMOE__MSG_TYPE__MSG_WELCOME: {
        Epmoe__Welcome *wl = (Epmoe__Welcome *)wire_unpack(&epmoe__welcome__descriptor, m, NULL);
        if (wl == NULL)
            break;
        if (w->welcome)
            wire_free_unpacked(&w->welcome->base);
        w->welcome = wl;
        w->welcomed = true;
        w->n_welcomes++;
        w->rank = (int)wl->rank;
        w->world_size = (int)wl->world_size;
        w->epoch = wl->epoch;
        w->config_hash = wl->config_hash;
        it_placement(w, wl->members, wl->n_members, wl->expert_owner, wl->n_expert_owner);
        if (w->auto_join || w->joining)
            it_ack_welcome(w);
        break;
    }
    case EPMOE__MSG_TYPE__MSG_EPOCH:
        it_on_epoch(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_LOAD:
        w->loaded = true;
        if (w->auto_join)
            w->ready_due_ms = it_now_ms() + w->epoch_delay_ms;
        break;
    case EPMOE__MSG_TYPE__MSG_COMM_INIT:
        it_on_comm_init(w, m);
        break;
    case EPMOE__MSG_TYPE__MSG_STEP:
        return it_on_step(w, m);
    case EPMOE__MSG_TYPE__MSG_STEP_ABORT: {
        Epmoe__StepAbort *a =
            (Epmoe__StepAbort *)wire_unpack(&epmoe__step_abort__descriptor, m, NULL);
        w->n_aborts++;
        if (a != NULL) {
            w->last_abort = a->step_id;
            if (w->held_step != 0 && a->step_id == w->held_step) {
                it_send_step_failed(w, w->held_step, "aborted");
                w->held_step = 0;
            }
            wire_free_unpacked(&a->base);
        }
        break;
    }
    case EPMOE__MSG_TYPE__MSG_SHUTDOWN:
        w->n_shutdowns++;
        break;
    case EPMOE__MSG_TYPE__MSG_ERROR: {
        Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, m, NULL);
        w->n_errors++;
        if (e != NULL) {
            w->last_error_code = e->has_code ? (int)e->code : -1;
            snprintf(w->last_error, sizeof w->last_error, "%s", e->message ? e->message : "");
            wire_free_unpacked(&e->base);
        }
        break;
    }
    default:
        break;
    }
    return false;
}

/* Takes ownership of m (heap). */
static void it_client_handle(it_client *c, wire_msg *m)
{
    if (m->type == EPMOE__MSG_TYPE__MSG_ERROR) {
        Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, m, NULL);
        c->error_type_code = e && e->has_code ? (int)e->code : 0;
        if (e)
            wire_free_unpacked(&e->base);
        c->have_reply = true;
        wire_msg_close(m);
        free(m);
        return;
    }
    Epmoe__AdminReply *r =
        (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, m, NULL);
    if (r == NULL || !r->has_id || r->id != c->want_id) {
        if (r)
            wire_free_unpacked(&r->base);
        wire_msg_close(m);
        free(m);
        return;
    }
    c->reply = r;
    c->msg = m;
    c->have_reply = true;
}

void *it_raw_dealer(itest *t, const char *ep, const char *id)
{
    void *s = it_socket(t, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id));
    zmq_connect(s, ep);
    return s;
}

int it_raw_recv(itest *t, void *sock, int ms, int *code, char *msg, size_t cap)
{
    int64_t end = it_now_ms() + ms;
    while (it_now_ms() < end) {
        it_pump(t, 5);
        wire_msg m;
        if (wire_recv(sock, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, NULL) !=
            WIRE_OK)
            continue;
        int type = m.type;
        if (type == EPMOE__MSG_TYPE__MSG_ERROR) {
            Epmoe__Error *e = (Epmoe__Error *)wire_unpack(&epmoe__error__descriptor, &m, NULL);
            *code = e && e->has_code ? (int)e->code : -1;
            snprintf(msg, cap, "%s", e && e->message ? e->message : "");
            if (e)
                wire_free_unpacked(&e->base);
        }
        wire_msg_close(&m);
        return type;
    }
    return -1;
}

void it_pump(itest *t, int ms)
{
    int64_t end = it_now_ms() + ms;
    do {
        zmq_pollitem_t items[IT_MAX_WORKERS + IT_MAX_CLIENTS];
        int kind[IT_MAX_WORKERS + IT_MAX_CLIENTS], idx[IT_MAX_WORKERS + IT_MAX_CLIENTS], n = 0;
        int64_t now = it_now_ms();
        for (int i = 0; i < t->n_w; i++) {
            it_worker *w = t->w[i];
            if (w->behaviour == IT_MUTE)
                continue;
            if (w->welcomed && now >= w->next_hb_ms) {
                Epmoe__Heartbeat hb = EPMOE__HEARTBEAT__INIT;
                it_worker_send(w, EPMOE__MSG_TYPE__MSG_HEARTBEAT, &hb.base);
                w->next_hb_ms = now + t->o.heartbeat_ms;
            }
            it_slow_answer(w);
            if (w->ready_due_ms > 0 && now >= w->ready_due_ms) {
                w->ready_due_ms = 0;
                it_send_ready(w);
            }
            items[n] = (zmq_pollitem_t){.socket = w->sock, .events = ZMQ_POLLIN};
            kind[n] = 0;
            idx[n++] = i;
        }
        for (int i = 0; i < t->n_cl; i++) {
            items[n] = (zmq_pollitem_t){.socket = t->cl[i]->sock, .events = ZMQ_POLLIN};
            kind[n] = 1;
            idx[n++] = i;
        }
        int64_t left = end - it_now_ms();
        if (zmq_poll(items, n, left < 0 ? 0 : left > 10 ? 10 : (long)left) <= 0)
            continue;
        for (int j = 0; j < n; j++) {
            if (!(items[j].revents & ZMQ_POLLIN))
                continue;
            void *sock = items[j].socket;
            for (;;) {
                wire_msg *m = malloc(sizeof *m);
                if (wire_recv(sock, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, m,
                              NULL) != WIRE_OK) {
                    free(m);
                    break;
                }
                if (kind[j] == 0) {
                    if (!it_worker_handle(t->w[idx[j]], m)) {
                        wire_msg_close(m);
                        free(m);
                    }
                } else {
                    it_client_handle(t->cl[idx[j]], m);
                }
            }
        }
    } while (it_now_ms() < end);
}

/* Pump until cond(arg) or ms pass. */
static bool it_pump_until(itest *t, bool (*cond)(void *), void *arg, int ms)
{
    int64_t end = it_now_ms() + ms;
    while (!cond(arg)) {
        if (it_now_ms() >= end)
            return false;
        it_pump(t, 5);
    }
    return true;
}

static bool it_cond_welcome(void *a)
{
    it_worker *w = a;
    return w->welcomed || w->n_errors > 0;
}

static bool it_cond_load(void *a)
{
    it_worker *w = a;
    return w->loaded || w->n_errors > 0;
}

int it_worker_hello(itest *t, it_worker *w)
{
    Epmoe__Register r = EPMOE__REGISTER__INIT;
    r.name = w->name;
    r.device = w->nccl ? "" : "cpu"; /* nccl: takes WELCOME.device (cuda:R) */
    r.hostname = "itest";
    r.has_pid = 1;
    r.pid = (uint32_t)getpid();
    r.version = "itest";
    w->welcomed = w->loaded = false;
    w->n_errors = 0;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_REGISTER, &r.base);
    return it_pump_until(t, it_cond_welcome, w, 5000) && w->welcomed ? 0 : -1;
}

int it_worker_join(itest *t, it_worker *w)
{
    if (!w->welcomed)
        return -1;
    /* the WELCOME that came while it was not joining yet, then any that follows (a newer epoch
     * was sent before the coordinator read this CONFIG_ACK) from the handler */
    it_ack_welcome(w);
    w->joining = true;
    bool loaded = it_pump_until(t, it_cond_load, w, 5000) && w->loaded;
    w->joining = false;
    if (!loaded)
        return -1;
    Epmoe__Loading l = EPMOE__LOADING__INIT;
    l.has_bytes_done = 1;
    l.bytes_done = 50;
    l.has_bytes_total = 1;
    l.bytes_total = 100;
    it_worker_send(w, EPMOE__MSG_TYPE__MSG_LOADING, &l.base);
    /* the READY for the epoch it was told last: an EPOCH that came with the LOAD is answered by
     * this one, not again by it_pump */
    w->ready_due_ms = 0;
    it_send_ready(w);
    w->next_hb_ms = 0;
    w->auto_join = true;
    return 0;
}

int it_worker_register(itest *t, it_worker *w)
{
    return it_worker_hello(t, w) == 0 ? it_worker_join(t, w) : -1;
}

int it_register_all(itest *t)
{
    for (int r = 0; r < t->o.n_workers; r++) {
        it_worker *w = it_worker_new(t, it_worker_name(t, r));
        if (it_worker_register(t, w) != 0) {
            printf("  itest: worker %s did not register (error %d: %s)\n", w->name,
                   w->last_error_code, w->last_error);
            return -1;
        }
    }
    return it_wait_state(t, "ready", 5000);
}

/* ---- admin clients ---- */

it_client *it_client_new(itest *t)
{
    char key[256];
    snprintf(key, sizeof key, "%s/ops/op.key", t->o.keys_dir ? t->o.keys_dir : "");
    return it_client_new_key(t, key);
}

it_client *it_client_new_key(itest *t, const char *key_path)
{
    if (t->n_cl == IT_MAX_CLIENTS) {
        fprintf(stderr, "itest: more than %d clients\n", IT_MAX_CLIENTS);
        abort();
    }
    it_client *c = calloc(1, sizeof *c);
    c->sock = it_socket(t, ZMQ_DEALER);
    c->error_type_code = -1;
    it_curve(t, c->sock, key_path);
    zmq_connect(c->sock, t->admin);
    t->cl[t->n_cl++] = c;
    return c;
}

void it_send(itest *t, it_client *c, Epmoe__AdminRequest *rq, const wire_payload *p, int n)
{
    static uint64_t next_id = 0x1000;
    it_client_clear(c);
    rq->has_id = 1;
    rq->id = ++next_id;
    c->want_id = rq->id;
    wire_send(c->sock, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &rq->base, p, n, false, NULL);
}

static bool it_cond_reply(void *a)
{
    return ((it_client *)a)->have_reply;
}

Epmoe__AdminReply *it_wait(itest *t, it_client *c, int ms)
{
    it_pump_until(t, it_cond_reply, c, ms);
    return c->reply;
}

Epmoe__AdminReply *it_call(itest *t, it_client *c, Epmoe__AdminVerb verb, const char *layer)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = verb;
    rq.layer = (char *)layer;
    it_send(t, c, &rq, NULL, 0);
    return it_wait(t, c, 10000);
}

/* Poll STATUS until it says state (and, when epoch > 0, current_epoch == epoch). */
static int it_wait_status(itest *t, const char *state, uint64_t epoch, int ms)
{
    if (t->state_client == NULL)
        t->state_client = it_client_new(t);
    it_client *c = t->state_client;
    int64_t end = it_now_ms() + ms;
    do {
        Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
        if (r && r->state && strcmp(r->state, state) == 0 &&
            (epoch == 0 || r->current_epoch == epoch))
            return 0;
        it_pump(t, 20);
    } while (it_now_ms() < end);
    return -1;
}

int it_wait_state(itest *t, const char *state, int ms)
{
    return it_wait_status(t, state, 0, ms);
}

int it_wait_epoch(itest *t, uint64_t epoch, const char *state, int ms)
{
    return it_wait_status(t, state, epoch, ms);
}

/* ---- forward data ---- */

it_fwd it_fwd_make(int T, uint32_t seed, bool ids)
{
    it_fwd in = {.T = T,
                 .hidden = malloc((size_t)T * IT_H * 2 + 2),
                 .ids = ids ? malloc((size_t)T * 8 + 8) : NULL};
    it_make_input(T, seed, in.hidden, in.ids);
    return in;
}

void it_fwd_free(it_fwd *in)
{
    free(in->hidden);
    free(in->ids);
}

void it_fwd_send(itest *t, it_client *c, const char *layer, const it_fwd *in)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = (char *)layer;
    rq.has_n_tokens = 1;
    rq.n_tokens = (uint32_t)in->T;
    rq.has_has_ids = 1;
    rq.has_ids = in->ids != NULL;
    wire_payload p[2] = {{.data = in->hidden, .len = (size_t)in->T * IT_H * 2},
                         {.data = in->ids, .len = (size_t)in->T * 8}};
    it_send(t, c, &rq, p, in->ids ? 2 : 1);
}

int it_fwd_check(const itest *t, const it_client *c, const it_fwd *in)
{
    char why[512] = "";
    int rc = it_check_forward(t, c, in->T, in->hidden, in->ids, why, sizeof why);
    if (rc != 0)
        printf("  T=%d: %s\n", in->T, why);
    return rc;
}

void it_make_input(int T, uint32_t seed, uint16_t *hidden, int64_t *ids)
{
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < IT_H; h++) {
            uint16_t v =
                (uint16_t)(((uint32_t)t * 7919u + (uint32_t)h * 31u + seed * 104729u) & 0x7FFF);
            /* finite: an all-ones exponent (NaN, Inf) is refused as input (docs/numerics.md) */
            hidden[(size_t)t * IT_H + h] = (v & 0x7F80u) == 0x7F80u ? (uint16_t)(v & ~0x0080u) : v;
        }
        if (ids)
            ids[t] = (int64_t)(((uint32_t)t * 37u + seed) % IT_VOCAB);
    }
}

int it_check_forward(const itest *t, const it_client *c, int T, const uint16_t *hidden,
                     const int64_t *ids, char *why, size_t cap)
{
    const Epmoe__AdminReply *r = c->reply;
    /* the members of the epoch the latest step ran in, in rank order */
    int rank_of[IT_MAX_WORKERS], P = 0;
    uint64_t latest = 0;
    uint32_t members = 0;
    for (int i = 0; i < t->n_w; i++)
        if (t->w[i]->last_step > latest) {
            latest = t->w[i]->last_step;
            members = t->w[i]->step_members;
        }
    for (int k = 0; k < t->o.n_workers; k++)
        if (members & (1u << k))
            rank_of[P++] = k;
    if (r == NULL || !r->ok)
        return snprintf(why, cap, "no ok reply (%s)", r && r->error ? r->error : "none"), -1;
    const Epmoe__ForwardInfo *f = r->forward;
    if (f == NULL || f->n_tokens != (uint32_t)T || f->topk != IT_K || f->hidden_size != IT_H)
        return snprintf(why, cap, "forward info missing or wrong"), -1;
    uint64_t disp = 0;
    for (int k = 0; k < P; k++)
        disp += 1000 + (uint64_t)rank_of[k];
    if (f->dispatch_bytes != disp || f->combine_bytes != 10 * (uint64_t)T)
        return snprintf(why, cap, "bytes %llu/%llu, expected %llu/%llu",
                        (unsigned long long)f->dispatch_bytes, (unsigned long long)f->combine_bytes,
                        (unsigned long long)disp, (unsigned long long)T * 10),
               -1;
    const wire_msg *m = c->msg;
    if (m == NULL || m->n_payloads != 3 || m->payload_len[0] != (size_t)T * IT_H * 2 ||
        m->payload_len[1] != (size_t)T * IT_K * 4 || m->payload_len[2] != (size_t)T * IT_K * 4)
        return snprintf(why, cap, "reply payloads have the wrong sizes"), -1;
    for (int tok = 0; tok < T; tok++) {
        /* the member whose chunk [floor(i T / M), floor((i+1) T / M)) holds tok (protocol.md) */
        int rank = -1, n_chunk = 0;
        for (int k = 0; k < P; k++) {
            long b = (long)k * T / P, e = (long)(k + 1) * T / P;
            if (tok >= b && tok < e) {
                rank = rank_of[k];
                n_chunk = (int)(e - b);
            }
        }
        uint16_t out[IT_H];
        int32_t tid[IT_K];
        float wts[IT_K];
        memcpy(out, m->payload[0] + (size_t)tok * IT_H * 2, sizeof out);
        memcpy(tid, m->payload[1] + (size_t)tok * IT_K * 4, sizeof tid);
        memcpy(wts, m->payload[2] + (size_t)tok * IT_K * 4, sizeof wts);
        const uint16_t *in = hidden + (size_t)tok * IT_H;
        for (int h = 0; h < IT_H; h++)
            if (out[h] != (in[h] ^ 0x5A5A))
                return snprintf(why, cap, "token %d: out[%d] = 0x%04x, expected 0x%04x", tok, h,
                                out[h], in[h] ^ 0x5A5A),
                       -1;
        int32_t want_id = ids ? (int32_t)ids[tok] : (int32_t)in[0];
        if (tid[0] != rank || tid[1] != want_id || wts[0] != (float)in[1] ||
            wts[1] != (float)n_chunk)
            return snprintf(why, cap,
                            "token %d: ids {%d, %d} weights {%g, %g}, expected {%d, %d} {%g, %g}",
                            tok, tid[0], tid[1], wts[0], wts[1], rank, want_id, (double)in[1],
                            (double)n_chunk),
                   -1;
    }
    return 0;
}
