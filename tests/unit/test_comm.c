/*
 * test_comm.c — the collective plane's communicator (worker/transport_comm.h tpc_*) over the fake
 * library of tests/unit/fake_comm.c: P ranks are P threads of this process.
 *
 * Proves: P = 1, 2, 4 communicators become ready and exchange buffers with every rank including
 * themselves, bit for bit; a dead peer at init or in an exchange, an asynchronous error and an
 * owner's interruption each end the wait by its deadline (or at once) with an error naming the
 * communicator and what was waited for, and leave the communicator aborted (the library's abort
 * called, nothing alive), after which exchanges are refused without touching the library; an
 * aborted communicator is rebuilt (init -> ready -> aborted -> init -> ready) and works; a shrink
 * keeps the survivors' order and refuses a wrong parent, an excluded self or a wrong rank; a slow
 * peer inside the deadline is waited for.
 *
 * Every rank thread is joined under a watchdog: a wait without its deadline would hang, and the
 * watchdog turns that into a failure instead of a stuck test.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_comm.h"
#include "test.h"
#include "worker/transport_comm.h"

#define MAX_P      8
#define WATCHDOG_S 20

typedef struct shared {
    pthread_barrier_t bar;
    tpc_id id, id2;
    fc_world *w;
    int P;
} shared;

typedef struct rank_ctx {
    shared *sh;
    int rank;
    fc_stream *s;
    tpc_comm *c;
    int rc, rc2;
    ep_err err, err2;
    double took;
    tpc_state states[8];
    int n_states;
    int idle_calls;
} rank_ctx;

typedef void (*rank_fn)(rank_ctx *r);

typedef struct thread_arg {
    rank_ctx *r;
    rank_fn fn;
} thread_arg;

static void *rank_main(void *p)
{
    thread_arg *a = p;
    a->fn(a->r);
    return NULL;
}

/* Run fn on P threads; a thread still running after WATCHDOG_S fails the whole test binary. */
static void run_ranks(shared *sh, int P, rank_ctx *r, rank_fn fn)
{
    pthread_t t[MAX_P];
    thread_arg a[MAX_P];
    sh->P = P;
    pthread_barrier_init(&sh->bar, NULL, (unsigned)P);
    for (int i = 0; i < P; i++) {
        r[i].sh = sh;
        r[i].rank = i;
        r[i].s = fc_stream_new(sh->w);
        a[i] = (thread_arg){.r = &r[i], .fn = fn};
        pthread_create(&t[i], NULL, rank_main, &a[i]);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WATCHDOG_S;
    for (int i = 0; i < P; i++)
        if (pthread_timedjoin_np(t[i], NULL, &until) != 0) {
            printf("FAIL: rank %d still running after %d s: a wait without a deadline\n", i,
                   WATCHDOG_S);
            fflush(stdout);
            _exit(1);
        }
    pthread_barrier_destroy(&sh->bar);
}

static void note_state(rank_ctx *r)
{
    r->states[r->n_states++] = tpc_get_state(r->c);
}

/* Create the communicator, share rank 0's id, begin init of (epoch, gen). */
static int begin(rank_ctx *r, uint64_t epoch, uint32_t gen)
{
    ep_err err = {0};
    if (r->c == NULL)
        r->c = tpc_create(fc_ops(), r->sh->w, &err);
    if (r->rank == 0)
        tpc_new_id(r->c, gen == 0 ? &r->sh->id : &r->sh->id2, &err);
    pthread_barrier_wait(&r->sh->bar);
    const tpc_id *id = gen == 0 ? &r->sh->id : &r->sh->id2;
    return tpc_begin_init(r->c, epoch, gen, r->rank, r->sh->P, id, &r->err);
}

/* Every rank sends bytes (src, dst, i) to every rank, itself included; 0 when all arrived. */
static size_t pattern_len(int src, int dst)
{
    return (size_t)(1 + 37 * src + 11 * dst);
}

static uint8_t pattern_byte(int src, int dst, size_t i)
{
    return (uint8_t)(src * 31 + dst * 7 + (int)i);
}

static int exchange_all(rank_ctx *r, const char *what, double timeout, ep_err *err)
{
    int P = r->sh->P;
    uint8_t *out[MAX_P], *in[MAX_P];
    tpc_xfer sends[MAX_P], recvs[MAX_P];
    for (int p = 0; p < P; p++) {
        out[p] = malloc(pattern_len(r->rank, p));
        in[p] = calloc(1, pattern_len(p, r->rank));
        for (size_t i = 0; i < pattern_len(r->rank, p); i++)
            out[p][i] = pattern_byte(r->rank, p, i);
        sends[p] = (tpc_xfer){.peer = p, .ptr = out[p], .bytes = pattern_len(r->rank, p)};
        recvs[p] = (tpc_xfer){.peer = p, .ptr = in[p], .bytes = pattern_len(p, r->rank)};
    }
    int rc = tpc_exchange(r->c, what, sends, P, recvs, P, r->s,
                          clk_mono_ms() + (int64_t)(timeout * 1000), NULL, NULL, err);
    for (int p = 0; p < P && rc == 0; p++)
        for (size_t i = 0; i < pattern_len(p, r->rank); i++)
            if (in[p][i] != pattern_byte(p, r->rank, i)) {
                rc = ep_err_set(err, "byte %zu from rank %d differs", i, p);
                break;
            }
    for (int p = 0; p < P; p++) {
        free(out[p]);
        free(in[p]);
    }
    return rc;
}

/* ---- ready and exchanging ------------------------------------------------------------------ */

static void body_ready_exchange(rank_ctx *r)
{
    r->rc = begin(r, 5, 0);
    note_state(r);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    note_state(r);
    for (int round = 0; round < 3 && r->rc == 0; round++)
        r->rc = exchange_all(r, "dispatch", 10, &r->err);
    note_state(r);
}

static void check_ready_exchange(int P)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, P, r, body_ready_exchange);
    for (int i = 0; i < P; i++) {
        CHECK_EQ(r[i].rc, 0);
        if (r[i].rc)
            printf("  rank %d: %s\n", i, r[i].err.msg);
        CHECK_EQ(r[i].states[0], TPC_INIT);
        CHECK_EQ(r[i].states[1], TPC_READY);
        CHECK_EQ(r[i].states[2], TPC_READY);
        CHECK_EQ(tpc_rank(r[i].c), i);
        CHECK_EQ(tpc_size(r[i].c), P);
        CHECK_EQ(tpc_epoch(r[i].c), 5);
    }
    CHECK_EQ(fc_aborts(sh.w), 0);
    CHECK_EQ(fc_live(sh.w), P);
    for (int i = 0; i < P; i++)
        tpc_destroy(&r[i].c);
    CHECK_EQ(fc_live(sh.w), 0); /* destroy releases the library communicator */
    fc_world_free(&sh.w);
}

TEST(ranks_become_ready_and_exchange_with_every_rank_and_themselves)
{
    check_ready_exchange(1);
    check_ready_exchange(2);
    check_ready_exchange(4);
}

/* ---- a dead peer at init ------------------------------------------------------------------- */

static void body_init_dead_peer(rank_ctx *r)
{
    if (r->rank == r->sh->P - 1) { /* dead: takes the id, never calls init */
        pthread_barrier_wait(&r->sh->bar);
        return;
    }
    r->rc = begin(r, 5, 0);
    double t0 = clk_mono_s();
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 300, NULL, NULL, &r->err);
    r->took = clk_mono_s() - t0;
    note_state(r);
}

TEST(a_dead_peer_at_init_fails_by_the_deadline_and_aborts)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 3, r, body_init_dead_peer);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].rc, -1);
        char want[128];
        snprintf(want, sizeof want,
                 "fake communicator of epoch 5.0, rank %d of 3: not ready: init "
                 "not done after",
                 i);
        CHECK_STR_HAS(r[i].err.msg, want);
        CHECK_STR_HAS(r[i].err.msg, "; aborted");
        CHECK_EQ(r[i].states[0], TPC_ABORTED);
        CHECK_STR_HAS(tpc_last_error(r[i].c), "not ready: init not done after");
        CHECK_EQ(tpc_last_fault(r[i].c), TPC_FAULT_DEADLINE);
        CHECK(r[i].took >= 0.299 && r[i].took < 10); /* deadlines are whole ms: <= 1 ms early */
        tpc_destroy(&r[i].c);
    }
    CHECK_EQ(fc_aborts(sh.w), 2);
    CHECK_EQ(fc_live(sh.w), 0);
    fc_world_free(&sh.w);
}

/* ---- an asynchronous error during init ----------------------------------------------------- */

static void body_init_async_error(rank_ctx *r)
{
    r->rc = begin(r, 9, 0);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    note_state(r);
}

TEST(an_async_error_during_init_aborts_naming_the_library_error)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    fc_fail_status(sh.w, 1, 0, "injected: unhandled system error");
    run_ranks(&sh, 2, r, body_init_async_error);
    CHECK_EQ(r[1].rc, -1);
    CHECK_STR_HAS(r[1].err.msg, "fake communicator of epoch 9.0, rank 1 of 2: not ready: init: "
                                "injected: unhandled system error; aborted");
    CHECK_EQ(r[1].states[0], TPC_ABORTED);
    CHECK_EQ(tpc_last_fault(r[1].c), TPC_FAULT_LIBRARY);
    CHECK_EQ(fc_aborts(sh.w), 1);
    for (int i = 0; i < 2; i++)
        tpc_destroy(&r[i].c);
    fc_world_free(&sh.w);
}

/* ---- a dead peer in an exchange -------------------------------------------------------------- */

static void body_exchange_dead_peer(rank_ctx *r)
{
    r->rc = begin(r, 5, 0);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    pthread_barrier_wait(&r->sh->bar);
    if (r->rc != 0 || r->rank == r->sh->P - 1)
        return; /* the last rank dies between steps */
    double t0 = clk_mono_s();
    r->rc = exchange_all(r, "dispatch", 0.3, &r->err);
    r->took = clk_mono_s() - t0;
    note_state(r);
    r->rc2 = exchange_all(r, "combine", 10, &r->err2);
    note_state(r);
}

TEST(a_dead_peer_in_an_exchange_fails_by_the_deadline_aborts_and_refuses_more)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 3, r, body_exchange_dead_peer);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].rc, -1);
        CHECK_STR_HAS(r[i].err.msg, "dispatch not done after");
        CHECK_STR_HAS(r[i].err.msg, "; aborted");
        CHECK(r[i].took >= 0.299 && r[i].took < 10); /* deadlines are whole ms: <= 1 ms early */
        CHECK_EQ(r[i].states[0], TPC_ABORTED);
        /* the next exchange is refused at once, naming why */
        CHECK_EQ(r[i].rc2, -1);
        CHECK_STR_HAS(r[i].err2.msg, "combine impossible: the communicator is aborted after: "
                                     "dispatch not done after");
        CHECK_EQ(r[i].states[1], TPC_ABORTED);
    }
    CHECK_EQ(fc_aborts(sh.w), 2);
    CHECK_EQ(fc_live(sh.w), 1); /* only the dead rank's, which never aborted */
    for (int i = 0; i < 3; i++)
        tpc_destroy(&r[i].c);
    fc_world_free(&sh.w);
}

/* ---- an asynchronous error in an exchange ---------------------------------------------------- */

static void body_exchange_async_error(rank_ctx *r)
{
    r->rc = begin(r, 5, 0);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    pthread_barrier_wait(&r->sh->bar);
    if (r->rank == 0)
        fc_fail_status(r->sh->w, 0, 0, "injected: remote process exited");
    pthread_barrier_wait(&r->sh->bar);
    if (r->rc == 0)
        r->rc = exchange_all(r, "combine", 10, &r->err);
    note_state(r);
}

TEST(an_async_error_in_an_exchange_aborts_at_once)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 1, r, body_exchange_async_error);
    /* with P = 1 the exchange is all self sends: it would complete, were it not for the error */
    CHECK_EQ(r[0].rc, -1);
    CHECK_STR_HAS(r[0].err.msg, "combine: injected: remote process exited; aborted");
    CHECK_EQ(r[0].states[0], TPC_ABORTED);
    CHECK_EQ(fc_aborts(sh.w), 1);
    tpc_destroy(&r[0].c);
    fc_world_free(&sh.w);
}

/* ---- the owner interrupts a wait ------------------------------------------------------------- */

static int idle_abort_third(void *ctx, ep_err *err)
{
    rank_ctx *r = ctx;
    if (++r->idle_calls < 3)
        return 0;
    return ep_err_set(err, "STEP_ABORT from the coordinator");
}

static void body_interrupt(rank_ctx *r)
{
    if (r->rank == 1) {
        pthread_barrier_wait(&r->sh->bar);
        return;
    }
    r->rc = begin(r, 5, 0);
    double t0 = clk_mono_s();
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 30000, idle_abort_third, r, &r->err);
    r->took = clk_mono_s() - t0;
    note_state(r);
}

TEST(the_owner_interrupts_a_wait_and_the_communicator_is_aborted)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 2, r, body_interrupt);
    CHECK_EQ(r[0].rc, -1);
    CHECK_STR_HAS(r[0].err.msg, "abandoned: STEP_ABORT from the coordinator; aborted");
    CHECK_EQ(r[0].idle_calls, 3);
    CHECK_EQ(tpc_last_fault(r[0].c), TPC_FAULT_ABANDONED);
    CHECK(r[0].took < 10);
    CHECK_EQ(r[0].states[0], TPC_ABORTED);
    CHECK_EQ(fc_aborts(sh.w), 1);
    tpc_destroy(&r[0].c);
    fc_world_free(&sh.w);
}

/* ---- rebuilt after an abort ------------------------------------------------------------------ */

static void body_rebuild(rank_ctx *r)
{
    r->rc = begin(r, 5, 0);
    note_state(r);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    note_state(r);
    /* both abort their part of a failed step (as a worker does on its own failure) */
    tpc_abort(r->c, "step 3: local experts failed");
    note_state(r);
    r->rc2 = begin(r, 5, 1); /* the coordinator's next COMM_INIT: generation 1 */
    note_state(r);
    if (r->rc2 == 0)
        r->rc2 = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err2);
    note_state(r);
    if (r->rc2 == 0)
        r->rc2 = exchange_all(r, "dispatch", 10, &r->err2);
}

TEST(an_aborted_communicator_is_rebuilt_and_works)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 2, r, body_rebuild);
    const tpc_state want[] = {TPC_INIT, TPC_READY, TPC_ABORTED, TPC_INIT, TPC_READY};
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].rc, 0);
        CHECK_EQ(r[i].rc2, 0);
        if (r[i].rc2)
            printf("  rank %d: %s\n", i, r[i].err2.msg);
        CHECK_EQ(r[i].n_states, 5);
        for (int k = 0; k < 5; k++)
            CHECK_EQ(r[i].states[k], want[k]);
        CHECK_EQ(tpc_generation(r[i].c), 1);
        CHECK_STR_EQ(tpc_last_error(r[i].c), ""); /* the rebuilt one never failed */
        CHECK_EQ(tpc_last_fault(r[i].c), TPC_FAULT_NONE);
    }
    CHECK_EQ(fc_aborts(sh.w), 2);
    CHECK_EQ(fc_live(sh.w), 2);
    for (int i = 0; i < 2; i++)
        tpc_destroy(&r[i].c);
    fc_world_free(&sh.w);
}

/* ---- shrink ---------------------------------------------------------------------------------- */

static void body_shrink(rank_ctx *r)
{
    r->rc = begin(r, 5, 0);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    pthread_barrier_wait(&r->sh->bar);
    if (r->rank == 2)
        return; /* lost; the survivors 0, 1, 3 shrink */
    const uint32_t ex[1] = {2};
    int new_rank = r->rank == 3 ? 2 : r->rank;
    /* refused without touching the communicator: wrong parent, wrong rank */
    ep_err e;
    CHECK_EQ(tpc_begin_shrink(r->c, 6, 0, 4, 0, ex, 1, new_rank, 3, &e), -1);
    CHECK_STR_HAS(e.msg, "holds no ready communicator of epoch 4.0 (it holds ready epoch 5.0)");
    CHECK_EQ(tpc_begin_shrink(r->c, 6, 0, 5, 0, ex, 1, r->rank, 3, &e), r->rank == 3 ? -1 : 0);
    if (r->rank == 3) {
        CHECK_STR_HAS(e.msg, "rank 3 of 3 does not follow from rank 3 of 4 less 1 ranks (expected "
                             "rank 2 of 3)");
        CHECK_EQ(tpc_get_state(r->c), TPC_READY);
        r->rc = tpc_begin_shrink(r->c, 6, 0, 5, 0, ex, 1, new_rank, 3, &r->err);
    }
    note_state(r);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    note_state(r);
    /* exchange among the survivors with their new ranks */
    if (r->rc == 0) {
        rank_ctx me = *r;
        shared sub = *r->sh;
        sub.P = 3;
        me.sh = &sub;
        me.rank = new_rank;
        r->rc = exchange_all(&me, "dispatch", 10, &r->err);
    }
}

TEST(shrink_keeps_the_survivors_order_and_refuses_what_does_not_follow)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 4, r, body_shrink);
    for (int i = 0; i < 4; i++) {
        if (i == 2)
            continue;
        CHECK_EQ(r[i].rc, 0);
        if (r[i].rc)
            printf("  rank %d: %s\n", i, r[i].err.msg);
        CHECK_EQ(r[i].states[0], TPC_INIT);
        CHECK_EQ(r[i].states[1], TPC_READY);
        CHECK_EQ(tpc_size(r[i].c), 3);
        CHECK_EQ(tpc_rank(r[i].c), i == 3 ? 2 : i);
        CHECK_EQ(tpc_epoch(r[i].c), 6);
    }
    /* each survivor's parent was released once its child was ready */
    CHECK_EQ(fc_aborts(sh.w), 3);
    ep_err e;
    const uint32_t self[1] = {0};
    CHECK_EQ(tpc_begin_shrink(r[0].c, 7, 0, 6, 0, self, 1, 0, 2, &e), -1);
    CHECK_STR_HAS(e.msg, "this worker's rank 0 is excluded");
    tpc_abort(r[0].c, "test");
    const uint32_t one[1] = {1};
    CHECK_EQ(tpc_begin_shrink(r[0].c, 7, 0, 6, 0, one, 1, 0, 2, &e), -1);
    CHECK_STR_HAS(e.msg, "holds no ready communicator of epoch 6.0 (it holds aborted");
    for (int i = 0; i < 4; i++)
        tpc_destroy(&r[i].c);
    CHECK_EQ(fc_live(sh.w), 0);
    fc_world_free(&sh.w);
}

/* ---- a slow peer ----------------------------------------------------------------------------- */

static void body_slow_peer(rank_ctx *r)
{
    if (r->rank == 1)
        usleep(200000);
    r->rc = begin(r, 5, 0);
    if (r->rank == 1)
        usleep(200000);
    if (r->rc == 0)
        r->rc = tpc_wait_ready(r->c, clk_mono_ms() + 10000, NULL, NULL, &r->err);
    if (r->rank == 1)
        usleep(200000);
    if (r->rc == 0)
        r->rc = exchange_all(r, "dispatch", 10, &r->err);
}

TEST(a_slow_peer_inside_the_deadline_is_waited_for)
{
    shared sh = {.w = fc_world_new()};
    rank_ctx r[MAX_P] = {0};
    run_ranks(&sh, 2, r, body_slow_peer);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].rc, 0);
        if (r[i].rc)
            printf("  rank %d: %s\n", i, r[i].err.msg);
        tpc_destroy(&r[i].c);
    }
    CHECK_EQ(fc_aborts(sh.w), 2); /* the two teardowns */
    fc_world_free(&sh.w);
}

#ifdef EPMOE_HAVE_NCCL
/* tpc_nccl_ops() opens libnccl once per process, so each case runs in a child: 0 when the
 * library given to tpc_nccl_set_library (EPMOE_NCCL_LIBRARY) loaded (want_ok) or was refused
 * with its name in the error (!want_ok). */
static int nccl_load_child(const char *file, bool want_ok)
{
    pid_t pid = fork();
    if (pid == 0) {
        tpc_nccl_set_library(file);
        const tpc_ops *ops = tpc_nccl_ops();
        ep_err e;
        tpc_comm *c = tpc_create(ops, NULL, &e);
        int ok = want_ok ? ops != NULL && c != NULL && tpc_nccl_why() == NULL
                         : ops == NULL && c == NULL && strstr(e.msg, file) != NULL &&
                               strstr(e.msg, "cannot be loaded") != NULL;
        if (!ok)
            fprintf(stderr, "  %s: ops %p, why: %s, create: %s\n", file, (const void *)ops,
                    tpc_nccl_why() ? tpc_nccl_why() : "-", c ? "ok" : e.msg);
        tpc_destroy(&c);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#endif

TEST(nccl_is_opened_at_run_time_and_a_missing_library_is_named)
{
#ifdef EPMOE_HAVE_NCCL
    CHECK_EQ(nccl_load_child("/nonexistent/libnccl.so.2", false), 0);
#ifdef EPMOE_TEST_NCCL_LIBRARY
    /* the library this build found: every entry point resolves (no GPU needed) */
    CHECK_EQ(nccl_load_child(EPMOE_TEST_NCCL_LIBRARY, true), 0);
#endif
#else
    ep_err e;
    CHECK(tpc_nccl_ops() == NULL);
    CHECK(tpc_create(tpc_nccl_ops(), NULL, &e) == NULL);
    CHECK_STR_HAS(e.msg, "this build has no NCCL");
#endif
}

int main(void)
{
    RUN(ranks_become_ready_and_exchange_with_every_rank_and_themselves);
    RUN(a_dead_peer_at_init_fails_by_the_deadline_and_aborts);
    RUN(an_async_error_during_init_aborts_naming_the_library_error);
    RUN(a_dead_peer_in_an_exchange_fails_by_the_deadline_aborts_and_refuses_more);
    RUN(an_async_error_in_an_exchange_aborts_at_once);
    RUN(the_owner_interrupts_a_wait_and_the_communicator_is_aborted);
    RUN(an_aborted_communicator_is_rebuilt_and_works);
    RUN(shrink_keeps_the_survivors_order_and_refuses_what_does_not_follow);
    RUN(a_slow_peer_inside_the_deadline_is_waited_for);
    RUN(nccl_is_opened_at_run_time_and_a_missing_library_is_named);
    return test_report();
}
