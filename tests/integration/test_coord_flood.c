/*
 * test_coord_flood.c — the coordinator's liveness under a flood of large admin messages, against
 * a real epmoe-coordinator process and fake workers (itest.h).
 *
 * Proves: while a client sends large FORWARDs as fast as it can, every worker still gets the
 * coordinator's heartbeats on time (no gap of 4 heartbeats; liveness is 5), and the
 * coordinator's memory stays bounded:
 *   - data_plane nccl, the cluster waiting for a communicator: 64 requests of 2 MiB queue, the
 *     rest are refused as busy, and the coordinator holds no more than the queue (that a refusal
 *     scans no value is test_sequencer's);
 *   - data_plane zmq: FORWARD is not the coordinator's, no admin request carries a payload, so
 *     the admin socket's MAXMSGSIZE drops the flooding client at the frame header (16 MiB
 *     frames, EP_MAX_TOKENS tokens: not one is buffered); a small
 *     FORWARD still gets its explicit refusal, and STATUS answers.
 * The flood runs in a child process, so the fake workers are pumped the whole time.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/limits.h"
#include "itest.h"
#include "test.h"

static const char *coord_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

/* A gap of this many heartbeats fails the test (the workers' liveness is 5; the old loop
 * left 4.6 in the nccl case, ~1 when idle; ctest runs this test alone, RUN_SERIAL). */
#define FLOOD_MAX_GAP_BEATS 4

/* The payload stays the child's: every request sends the same buffer, zero-copy. */
static void flood_keep(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

/* The child: n FORWARDs of T tokens to admin as fast as they go, then the replies for 3 s. */
static void flood_child(const char *admin, int n, int T)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, sndtimeo = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    zmq_connect(s, admin);
    size_t len = (size_t)T * IT_H * 2;
    uint16_t *hidden = calloc(len, 1); /* zeros: finite bf16 */
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_id = rq.has_verb = rq.has_n_tokens = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.2";
    rq.n_tokens = (uint32_t)T;
    int sent = 0, answered = 0;
    for (int i = 0; i < n && hidden; i++) {
        rq.id = 0x7000 + (uint64_t)i;
        wire_payload p = {.data = hidden, .len = len, .free_fn = flood_keep};
        sent += wire_send(s, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &rq.base, &p, 1, false,
                          NULL) == 0;
    }
    int64_t end = it_now_ms() + 3000;
    while (answered < sent && it_now_ms() < end) {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        wire_msg m;
        if (wire_recv(s, false, EP_MAX_CTRL_MSG, 0, ZMQ_DONTWAIT, &m, NULL) == WIRE_OK) {
            answered++;
            wire_msg_close(&m);
        }
    }
    printf("  flood: %d of %d FORWARDs of %d tokens sent, %d answered\n", sent, n, T, answered);
    fflush(stdout);
    zmq_close(s);
    zmq_ctx_term(ctx);
    free(hidden);
    _exit(0);
}

/* Run the flood while pumping the workers; 0 when the child finished within 60 s. Each
 * worker's max_hb_gap_ms then covers the flood and 300 ms after it. */
static int flood(itest *t, int n, int T)
{
    for (int i = 0; i < t->n_w; i++)
        t->w[i]->last_hb_ms = t->w[i]->max_hb_gap_ms = 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        flood_child(t->admin, n, T);
    if (pid < 0)
        return -1;
    int status = 0;
    pid_t done = 0;
    int64_t end = it_now_ms() + 60000;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && it_now_ms() < end)
        it_pump(t, 20);
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    it_pump(t, 300);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* The coordinator's peak resident memory (VmHWM) in MiB, -1 when unknown. */
static long coord_hwm_mib(const itest *t)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)t->pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb / 1024;
}

/* Every worker got heartbeats during the flood, none more than FLOOD_MAX_GAP_BEATS apart. */
static void check_heartbeats(const itest *t)
{
    for (int i = 0; i < t->n_w; i++) {
        const it_worker *w = t->w[i];
        printf("  %s: longest gap between heartbeats %lld ms (heartbeat %d ms)\n", w->name,
               (long long)w->max_hb_gap_ms, t->o.heartbeat_ms);
        CHECK(w->last_hb_ms > 0);
        CHECK(w->max_hb_gap_ms < FLOOD_MAX_GAP_BEATS * t->o.heartbeat_ms);
    }
}

static itest *start(bool nccl, int silent_rank)
{
    it_opts o;
    it_default_opts(&o);
    o.n_workers = 2;
    o.nccl = nccl;
    itest *t = it_start(coord_bin, &o);
    for (int r = 0; t != NULL && r < o.n_workers; r++) {
        it_worker *w = it_worker_new(t, it_worker_name(t, r));
        w->comm_silent = r == silent_rank;
        if (it_worker_register(t, w) != 0)
            printf("  worker %d did not register: %s\n", r, w->last_error);
    }
    return t;
}

TEST(refused_forwards_cost_nothing_and_heartbeats_run_on_time)
{
    itest *t = start(true, 1); /* rank 1 never answers COMM_INIT: not ready */
    CHECK(t != NULL);
    if (t == NULL)
        return;
    /* 2 MiB requests: the queue's 64 (EP_MAX_QUEUED_STEPS) hold 128 MiB, the other 192 are
     * refused as busy */
    long before = coord_hwm_mib(t);
    CHECK_EQ(flood(t, 256, EP_MAX_TOKENS / 8), 0);
    check_heartbeats(t);
    long hwm = coord_hwm_mib(t);
    printf("  coordinator VmHWM %ld MiB before the flood, %ld MiB after (512 MiB sent)\n", before,
           hwm);
    CHECK(hwm > 0 && hwm < before + 128 + 96);
    it_client *c = it_client_new(t);
    Epmoe__AdminReply *r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r != NULL && r->ok);
    FINISH(t);
}

TEST(a_zmq_plane_coordinator_drops_oversized_admin_frames_unread)
{
    itest *t = start(false, -1);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_wait_state(t, "ready", 5000), 0);
    long before = coord_hwm_mib(t);
    CHECK_EQ(flood(t, 24, EP_MAX_TOKENS), 0);
    check_heartbeats(t);
    long hwm = coord_hwm_mib(t);
    printf("  coordinator VmHWM %ld MiB before the flood, %ld MiB after\n", before, hwm);
    CHECK(hwm > 0 && hwm < before + 16); /* not one 16 MiB frame was buffered */
    /* a FORWARD that fits is still answered with the reason */
    it_client *c = it_client_new(t);
    uint16_t hidden[4 * IT_H];
    it_make_input(4, 1, hidden, NULL);
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = rq.has_n_tokens = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.2";
    rq.n_tokens = 4;
    wire_payload p = {.data = hidden, .len = sizeof hidden};
    it_send(t, c, &rq, &p, 1);
    Epmoe__AdminReply *r = it_wait(t, c, 5000);
    CHECK(r != NULL && !r->ok && r->error_code == EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    if (r != NULL && r->error)
        CHECK_STR_HAS(r->error, "FORWARD is not the coordinator's");
    r = it_call(t, c, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r != NULL && r->ok);
    FINISH(t);
}

/* Under ASan the coordinator keeps what it frees in a quarantine (256 MiB by default), which
 * VmHWM would count: the peak measured must be the coordinator's own. (Other binaries ignore
 * ASAN_OPTIONS.) */
static void small_quarantine(void)
{
    const char *o = getenv("ASAN_OPTIONS");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%squarantine_size_mb=8", o ? o : "", o && *o ? ":" : "");
    setenv("ASAN_OPTIONS", buf, 1);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s COORDINATOR_BINARY\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    small_quarantine();
    RUN(refused_forwards_cost_nothing_and_heartbeats_run_on_time);
    RUN(a_zmq_plane_coordinator_drops_oversized_admin_frames_unread);
    return test_report();
}
