/*
 * test_transport.c — the ZeroMQ data plane (worker/transport_zmq.h) over tcp loopback.
 *
 * Proves: P = 2, 3, 4 transports, one thread each, exchange DISPATCH and COMBINE for several
 * steps in every format (fp8 with e8m0 scales, fp8 with f32 scales, bf16), including empty
 * messages, and every array arrives bit for bit as sent (the receiver regenerates the expected
 * content from the same seed, never from what it received); a message for a step not started yet
 * is kept until taken; messages of finished steps are dropped; a newer DISPATCH from a peer
 * replaces an older one (a peer holds one slot), and one 10,000 steps beyond the last finished
 * step (its receiver was away) is kept and taken; a
 * COMBINE is kept only when granted, with the granted n_pairs; garbage frames and malformed
 * bodies (bad counts, payload size mismatch, pair_row out of range, unowned expert, wrong or
 * missing session, wrong epoch, own rank as source, wrong type) are each dropped with a reason
 * naming the fault, and a later well-formed step still completes; the PULL's MAXMSGSIZE is the
 * model's largest frame and RCVHWM is TPZ_RCVHWM, and a frame one byte above it never reaches the
 * transport (before, every frame up to 1 GiB was buffered whole). With security (CURVE + ZAP),
 * the ranks exchange as before, a stranger's key cannot connect, and a rank's key cannot speak
 * for another rank.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/auth.h"
#include "common/limits.h"
#include "common/wire.h"
#include "test.h"
#include "worker/transport_zmq.h"

#define H       256
#define E       16
#define EPOCH   7
#define TOPK    4
#define SESSION 0x5E55105E55105EULL

static void *zctx;

/* ---- deterministic content --------------------------------------------------------------------
 */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_fill(uint64_t *s, void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rng_next(s);
}

static int owner_of(int e, int P)
{
    return e * P / E;
}

static tp_format step_format(uint64_t step, bool *e8m0)
{
    *e8m0 = step % 3 == 0;
    return step % 3 == 2 ? TP_FMT_BF16 : TP_FMT_FP8;
}

/* The shape of the dispatch src sends dst in step; s is left where the contents start. */
static void gen_shape(tp_msg *m, uint64_t step, int src, int dst, uint64_t *s)
{
    *s = step * 1000003u + (uint64_t)src * 1009u + (uint64_t)dst;
    memset(m, 0, sizeof *m);
    m->kind = TP_DISPATCH;
    m->step_id = step;
    m->layer = (uint32_t)(step % 5);
    m->format = step_format(step, &m->scales_e8m0);
    m->n_rows = (step + (uint64_t)src + (uint64_t)dst) % 4 == 0 ? 0 : (int)(rng_next(s) % 40);
    m->n_pairs = m->n_rows ? m->n_rows + (int)(rng_next(s) % (uint64_t)m->n_rows) : 0;
}

/* The contents of that dispatch, into m's allocated arrays. */
static void gen_fill(tp_msg *m, uint64_t step, int src, int dst, int P)
{
    uint64_t s;
    tp_msg shape;
    gen_shape(&shape, step, src, dst, &s);
    size_t rows = (size_t)m->n_rows;
    if (m->format == TP_FMT_FP8) {
        rng_fill(&s, m->codes, rows * H);
        rng_fill(&s, m->scales, rows * (H / 128) * (m->scales_e8m0 ? 1 : 4));
    } else {
        rng_fill(&s, m->hidden, rows * H * 2);
    }
    int first = -1, n_own = 0;
    for (int e = 0; e < E; e++)
        if (owner_of(e, P) == dst) {
            if (first < 0)
                first = e;
            n_own++;
        }
    for (int p = 0; p < m->n_pairs; p++) {
        m->pair_row[p] = (uint32_t)(rng_next(&s) % rows);
        m->pair_expert[p] = (uint32_t)(first + (int)(rng_next(&s) % (uint64_t)n_own));
        rng_fill(&s, &m->pair_weight[p], 4);
    }
}

static void gen_combine(tp_msg *m, uint64_t step, int src, int dst, int n_pairs, bool fill)
{
    if (!fill) {
        memset(m, 0, sizeof *m);
        m->kind = TP_COMBINE;
        m->step_id = step;
        m->n_pairs = n_pairs;
        return;
    }
    uint64_t s = step * 7777u + (uint64_t)src * 31u + (uint64_t)dst + 99u;
    rng_fill(&s, m->out, (size_t)n_pairs * H * 2);
}

static int make_dispatch(tp_msg *m, uint64_t step, int src, int dst, int P)
{
    uint64_t s;
    gen_shape(m, step, src, dst, &s);
    if (tpz_msg_alloc(m, H, NULL) != 0)
        return -1;
    gen_fill(m, step, src, dst, P);
    return 0;
}

static int make_combine(tp_msg *m, uint64_t step, int src, int dst, int n_pairs)
{
    gen_combine(m, step, src, dst, n_pairs, false);
    if (tpz_msg_alloc(m, H, NULL) != 0)
        return -1;
    gen_combine(m, step, src, dst, n_pairs, true);
    return 0;
}

static bool same_bytes(const void *a, const void *b, size_t n)
{
    return n == 0 || memcmp(a, b, n) == 0;
}

/* got equals what src would have sent dst, field by field and bit by bit. */
static bool dispatch_matches(const tp_msg *got, int dst, int P)
{
    tp_msg want;
    if (make_dispatch(&want, got->step_id, got->src_rank, dst, P) != 0)
        return false;
    size_t rows = (size_t)want.n_rows, pairs = (size_t)want.n_pairs;
    bool ok = got->kind == TP_DISPATCH && got->epoch == EPOCH && got->layer == want.layer &&
              got->n_rows == want.n_rows && got->n_pairs == want.n_pairs &&
              got->format == want.format && got->scales_e8m0 == want.scales_e8m0;
    if (ok && want.format == TP_FMT_FP8)
        ok = same_bytes(got->codes, want.codes, rows * H) &&
             same_bytes(got->scales, want.scales, rows * (H / 128) * (want.scales_e8m0 ? 1 : 4));
    if (ok && want.format == TP_FMT_BF16)
        ok = same_bytes(got->hidden, want.hidden, rows * H * 2);
    ok = ok && same_bytes(got->pair_row, want.pair_row, pairs * 4) &&
         same_bytes(got->pair_expert, want.pair_expert, pairs * 4) &&
         same_bytes(got->pair_weight, want.pair_weight, pairs * 4);
    tpz_msg_release(&want);
    return ok;
}

static bool combine_matches(const tp_msg *got, int dst, int expect_pairs)
{
    tp_msg want;
    if (got->n_pairs != expect_pairs ||
        make_combine(&want, got->step_id, got->src_rank, dst, expect_pairs) != 0)
        return false;
    bool ok =
        got->kind == TP_COMBINE && same_bytes(got->out, want.out, (size_t)expect_pairs * H * 2);
    tpz_msg_release(&want);
    return ok;
}

/* ---- a world of P transports ------------------------------------------------------------------
 */

static uint32_t owners[E];

/* Security for a world: every rank's key pair, public keys and names. */
typedef struct world_sec {
    auth_keypair keys[8];
    uint8_t pubs[8][AUTH_KEY_BYTES];
    const char *names[8];
} world_sec;

static void world_open_with(tpz_transport **tp, int P, const world_sec *sec)
{
    for (int e = 0; e < E; e++)
        owners[e] = (uint32_t)owner_of(e, P);
    const char *eps[8];
    for (int r = 0; r < P; r++) {
        tpz_config cfg = {.rank = r,
                          .world_size = P,
                          .session = SESSION,
                          .epoch = EPOCH,
                          .hidden = H,
                          .n_experts = E,
                          .topk = TOPK,
                          .expert_owner = owners,
                          .bind_endpoint = "tcp://127.0.0.1:*"};
        if (sec) {
            cfg.key = &sec->keys[r];
            cfg.peer_key = sec->pubs;
            cfg.peer_name = sec->names;
        }
        ep_err err = {0};
        tp[r] = tpz_create(zctx, &cfg, &err);
        if (tp[r] == NULL)
            printf("  tpz_create: %s\n", err.msg);
        CHECK(tp[r] != NULL);
        eps[r] = tp[r] ? tpz_endpoint(tp[r]) : "";
        CHECK_STR_HAS(eps[r], "tcp://127.0.0.1:");
    }
    for (int r = 0; r < P; r++) {
        ep_err err;
        CHECK(tp[r] && tpz_connect(tp[r], eps, &err) == 0);
    }
}

static void world_open(tpz_transport **tp, int P)
{
    world_open_with(tp, P, NULL);
}

static void world_close(tpz_transport **tp, int P)
{
    for (int r = 0; r < P; r++) {
        tpz_destroy(&tp[r]);
        CHECK(tp[r] == NULL);
    }
}

/* Wait up to 5 s for a kept message of step; 1 when one was taken. */
static int wait_take(tpz_transport *tp, uint64_t step, tp_msg *out)
{
    for (int i = 0; i < 500; i++) {
        if (tpz_take(tp, step, out))
            return 1;
        zmq_pollitem_t it = {.socket = tpz_socket(tp), .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10) > 0)
            tpz_pump(tp);
    }
    return 0;
}

/* Wait up to 5 s until tp has dropped n messages in all. */
static bool wait_dropped(tpz_transport *tp, uint64_t n)
{
    for (int i = 0; i < 500 && tpz_dropped(tp) < n; i++) {
        zmq_pollitem_t it = {.socket = tpz_socket(tp), .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10) > 0)
            tpz_pump(tp);
    }
    return tpz_dropped(tp) >= n;
}

/* ---- one rank's steps, on its own thread ------------------------------------------------------
 */

typedef struct rank_ctx {
    tpz_transport *tp;
    int rank, P, steps;
    char fail[256]; /* first failure, "" when none */
    uint64_t bytes;
} rank_ctx;

static int run_step(rank_ctx *c, uint64_t step)
{
    int P = c->P, sent_pairs[8] = {0}, got_d = 0, got_c = 0;
    ep_err err;
    for (int dst = 0; dst < P; dst++) {
        if (dst == c->rank)
            continue;
        tp_msg m;
        if (make_dispatch(&m, step, c->rank, dst, P) != 0)
            return snprintf(c->fail, sizeof c->fail, "alloc"), -1;
        sent_pairs[dst] = m.n_pairs;
        c->bytes += tp_msg_bytes(&m, H);
        tpz_grant(c->tp, step, dst, m.n_pairs);
        if (tpz_send(c->tp, dst, &m, &err) != 0)
            return snprintf(c->fail, sizeof c->fail, "send: %s", err.msg), -1;
    }
    while (got_d < P - 1 || got_c < P - 1) {
        tp_msg m;
        if (!wait_take(c->tp, step, &m))
            return snprintf(c->fail, sizeof c->fail, "step %llu: timeout (%d dispatch, %d combine)",
                            (unsigned long long)step, got_d, got_c),
                   -1;
        if (m.kind == TP_DISPATCH) {
            got_d++;
            if (!dispatch_matches(&m, c->rank, P))
                snprintf(c->fail, sizeof c->fail, "step %llu: dispatch from %d differs",
                         (unsigned long long)step, m.src_rank);
            tp_msg r;
            if (make_combine(&r, step, c->rank, m.src_rank, m.n_pairs) != 0 ||
                tpz_send(c->tp, m.src_rank, &r, &err) != 0)
                snprintf(c->fail, sizeof c->fail, "combine send failed");
        } else {
            got_c++;
            if (!combine_matches(&m, c->rank, sent_pairs[m.src_rank]))
                snprintf(c->fail, sizeof c->fail, "step %llu: combine from %d differs",
                         (unsigned long long)step, m.src_rank);
        }
        tpz_msg_release(&m);
    }
    tpz_finish(c->tp, step);
    return c->fail[0] ? -1 : 0;
}

/* Thread entry: one step, the one numbered c->steps. */
static void *run_one_step(void *arg)
{
    rank_ctx *c = arg;
    run_step(c, (uint64_t)c->steps);
    return NULL;
}

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    for (int s = 1; s <= c->steps; s++)
        if (run_step(c, (uint64_t)s) != 0)
            break;
    return NULL;
}

static void run_world(int P, int steps)
{
    tpz_transport *tp[8] = {0};
    world_open(tp, P);
    rank_ctx ctx[8];
    pthread_t th[8];
    for (int r = 0; r < P; r++) {
        ctx[r] = (rank_ctx){.tp = tp[r], .rank = r, .P = P, .steps = steps};
        pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    }
    for (int r = 0; r < P; r++) {
        pthread_join(th[r], NULL);
        if (ctx[r].fail[0])
            printf("  P=%d rank %d: %s\n", P, r, ctx[r].fail);
        CHECK(ctx[r].fail[0] == '\0');
        CHECK(ctx[r].bytes > 0);
        CHECK_EQ(tpz_dropped(tp[r]), 0);
        CHECK_EQ(tpz_pending(tp[r]), 0);
    }
    world_close(tp, P);
}

TEST(round_trip_two_ranks_all_formats)
{
    run_world(2, 6);
}

TEST(round_trip_three_ranks_all_formats)
{
    run_world(3, 6);
}

TEST(round_trip_four_ranks_all_formats)
{
    run_world(4, 9);
}

TEST(empty_messages_round_trip)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    tp_msg m = {.kind = TP_DISPATCH, .step_id = 4, .format = TP_FMT_FP8, .scales_e8m0 = true};
    ep_err err;
    CHECK(tpz_msg_alloc(&m, H, &err) == 0);
    CHECK_EQ(tp_msg_bytes(&m, H), 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(m.buf == NULL && m.codes == NULL); /* handed to ZeroMQ */
    tp_msg got;
    CHECK(wait_take(tp[1], 4, &got));
    CHECK_EQ(got.kind, TP_DISPATCH);
    CHECK_EQ(got.n_rows, 0);
    CHECK_EQ(got.n_pairs, 0);
    CHECK_EQ(got.src_rank, 0);
    tpz_msg_release(&got);
    tp_msg c = {.kind = TP_COMBINE, .step_id = 4};
    CHECK(tpz_msg_alloc(&c, H, &err) == 0);
    tpz_grant(tp[0], 4, 1, 0);
    CHECK(tpz_send(tp[1], 0, &c, &err) == 0);
    CHECK(wait_take(tp[0], 4, &got));
    CHECK_EQ(got.kind, TP_COMBINE);
    CHECK_EQ(got.n_pairs, 0);
    tpz_msg_release(&got);
    world_close(tp, 2);
}

/* Pump tp until it keeps n messages (up to 5 s). */
static void wait_pending(tpz_transport *tp, int n)
{
    for (int i = 0; i < 500 && tpz_pending(tp) < n; i++) {
        zmq_pollitem_t it = {.socket = tpz_socket(tp), .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10) > 0)
            tpz_pump(tp);
    }
}

TEST(future_steps_are_kept_and_finished_steps_dropped)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    ep_err err;
    tp_msg m, got;
    /* rank 0 is ahead: its step 5 arrives while rank 1 still runs step 4 */
    CHECK(make_dispatch(&m, 5, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    wait_pending(tp[1], 1);
    CHECK_EQ(tpz_pending(tp[1]), 1);
    tpz_finish(tp[1], 4);
    CHECK_EQ(tpz_pending(tp[1]), 1); /* step 5's message survives the end of step 4 */
    CHECK(tpz_take(tp[1], 5, &got) == 1);
    CHECK(dispatch_matches(&got, 1, 2));
    tpz_msg_release(&got);
    tpz_finish(tp[1], 5);
    /* late messages of finished steps (an aborted step's stragglers) are dropped */
    uint64_t d0 = tpz_dropped(tp[1]);
    CHECK(make_dispatch(&m, 3, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(wait_dropped(tp[1], d0 + 1));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "of step 3 from rank 0: that step is finished");
    /* tpz_finish also discards what was kept for the finished step */
    CHECK(make_dispatch(&m, 6, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    wait_pending(tp[1], 1);
    CHECK_EQ(tpz_pending(tp[1]), 1);
    tpz_finish(tp[1], 6);
    CHECK_EQ(tpz_pending(tp[1]), 0);
    CHECK(tpz_take(tp[1], 6, &got) == 0);
    /* rank 1 was away for 10,000 steps (drained): the DISPATCH of its first step back comes
     * before its STEP, and is kept for it (before, a window of 1,024 steps dropped it and the
     * step waited for its timeout) */
    d0 = tpz_dropped(tp[1]);
    CHECK(make_dispatch(&m, 6 + 10000, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    wait_pending(tp[1], 1);
    CHECK_EQ(tpz_pending(tp[1]), 1);
    CHECK_EQ(tpz_dropped(tp[1]), d0);
    tpz_finish(tp[1], 6 + 10000 - 1); /* its STEP: every earlier step is settled */
    int taken = tpz_take(tp[1], 6 + 10000, &got);
    CHECK_EQ(taken, 1);
    if (taken == 1) {
        CHECK(dispatch_matches(&got, 1, 2));
        tpz_msg_release(&got);
    }
    CHECK_EQ(tpz_pending(tp[1]), 0);
    world_close(tp, 2);
}

TEST(a_peer_holds_one_dispatch_and_only_granted_combines)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    ep_err err;
    tp_msg m, got;
    /* stale DISPATCHes (steps that failed while rank 1 was away) give way to the newest: however
     * many a peer queued, it holds one slot */
    for (uint64_t step = 10; step <= 40; step++) {
        CHECK(make_dispatch(&m, step, 0, 1, 2) == 0);
        CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    }
    CHECK(wait_dropped(tp[1], 30));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "of step 39 from rank 0: replaced by a newer one");
    CHECK_EQ(tpz_pending(tp[1]), 1);
    CHECK(tpz_take(tp[1], 40, &got) == 1);
    CHECK(dispatch_matches(&got, 1, 2));
    tpz_msg_release(&got);
    /* a second DISPATCH of the same step from the same peer is a duplicate */
    CHECK(make_dispatch(&m, 41, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(make_dispatch(&m, 41, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(wait_dropped(tp[1], 31));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "a duplicate");
    CHECK(tpz_take(tp[1], 41, &got) == 1);
    tpz_msg_release(&got);
    /* COMBINEs: not granted (a forged answer for the next step), granted with other n_pairs,
     * then the granted one; a second after it was used is not kept either */
    uint64_t d0 = tpz_dropped(tp[0]);
    CHECK(make_combine(&m, 42, 1, 0, 3) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    CHECK(wait_dropped(tp[0], d0 + 1));
    CHECK_STR_HAS(tpz_last_drop(tp[0]), "COMBINE of step 42 from rank 1: no DISPATCH of that step");
    tpz_grant(tp[0], 42, 1, 3);
    CHECK(make_combine(&m, 42, 1, 0, 2) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    CHECK(wait_dropped(tp[0], d0 + 2));
    CHECK_STR_HAS(tpz_last_drop(tp[0]), "2 pairs, 3 were dispatched");
    CHECK(make_combine(&m, 42, 1, 0, 3) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    CHECK(wait_take(tp[0], 42, &got));
    CHECK(combine_matches(&got, 0, 3));
    tpz_msg_release(&got);
    CHECK(make_combine(&m, 42, 1, 0, 3) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    CHECK(wait_dropped(tp[0], d0 + 3));
    /* tpz_finish withdraws a grant not used */
    tpz_grant(tp[0], 43, 1, 1);
    tpz_finish(tp[0], 43);
    CHECK(make_combine(&m, 44, 1, 0, 1) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    CHECK(wait_dropped(tp[0], d0 + 4));
    CHECK_EQ(tpz_pending(tp[0]), 0);
    /* a COMBINE kept under a grant and never taken gives way to the one of a newer grant (the
     * peer still holds one slot; found by fuzz_dataplane: the first was leaked) */
    tpz_grant(tp[0], 45, 1, 1);
    CHECK(make_combine(&m, 45, 1, 0, 1) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    wait_pending(tp[0], 1);
    tpz_grant(tp[0], 46, 1, 2);
    CHECK(make_combine(&m, 46, 1, 0, 2) == 0);
    CHECK(tpz_send(tp[1], 0, &m, &err) == 0);
    CHECK(wait_dropped(tp[0], d0 + 5));
    CHECK_STR_HAS(tpz_last_drop(tp[0]), "COMBINE of step 45 from rank 1: replaced by the COMBINE");
    CHECK_EQ(tpz_pending(tp[0]), 1);
    CHECK(tpz_take(tp[0], 46, &got) == 1);
    CHECK(combine_matches(&got, 0, 2));
    tpz_msg_release(&got);
    CHECK_EQ(tpz_pending(tp[0]), 0);
    world_close(tp, 2);
}

/* A new placement epoch on the same sockets: the old epoch's messages are dropped, the new
 * one's pass over the connections already made, and the epoch only moves forward. */
TEST(a_new_epoch_keeps_the_sockets_and_drops_the_old_epoch)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    ep_err err;
    tp_msg m, got;
    /* kept for a step of the old epoch, then the epoch moves on: gone */
    CHECK(make_dispatch(&m, 7, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    wait_pending(tp[1], 1);
    CHECK_EQ(tpz_pending(tp[1]), 1);
    CHECK_EQ(tpz_set_placement(tp[1], EPOCH + 1, owners, &err), 0);
    CHECK_EQ(tpz_pending(tp[1]), 0);
    CHECK_EQ(tpz_epoch(tp[1]), EPOCH + 1);
    /* a straggler of the old epoch is dropped */
    uint64_t d0 = tpz_dropped(tp[1]);
    CHECK(make_dispatch(&m, 8, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(wait_dropped(tp[1], d0 + 1));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "epoch");
    /* the sender moves too: its message arrives over the same connection */
    CHECK_EQ(tpz_set_placement(tp[0], EPOCH + 1, owners, &err), 0);
    CHECK(make_dispatch(&m, 9, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(wait_take(tp[1], 9, &got));
    CHECK_EQ(got.epoch, EPOCH + 1);
    got.epoch = EPOCH; /* dispatch_matches compares the rest with the generator's message */
    CHECK(dispatch_matches(&got, 1, 2));
    tpz_msg_release(&got);
    /* never back, never the same */
    CHECK_EQ(tpz_set_placement(tp[1], EPOCH + 1, owners, &err), -1);
    CHECK_STR_HAS(err.msg, "does not follow epoch");
    CHECK_EQ(tpz_set_placement(tp[1], 1, owners, &err), -1);
    world_close(tp, 2);
}

/* ---- hostile input ----------------------------------------------------------------------------
 */

static void send_frames(void *s, const void *const *f, const size_t *l, int n)
{
    for (int i = 0; i < n; i++)
        zmq_send(s, f[i], l[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

/* Send a DISPATCH with the given body and payload sizes (contents zero unless set). */
static void send_dispatch(void *s, const Epmoe__Dispatch *d, const size_t *len, int n,
                          const uint32_t *rows, const uint32_t *experts)
{
    static uint8_t zero[1 << 16];
    wire_payload p[8];
    for (int i = 0; i < n; i++)
        p[i] = (wire_payload){.data = zero, .len = len[i]};
    if (rows && n >= 3)
        p[n - 3].data = rows;
    if (experts && n >= 2)
        p[n - 2].data = experts;
    CHECK(wire_send(s, NULL, 0, EPMOE__MSG_TYPE__MSG_DISPATCH, &d->base, p, n, false, NULL) == 0);
}

static Epmoe__Dispatch good_body(uint64_t step, int n_rows, int n_pairs)
{
    Epmoe__Dispatch d = EPMOE__DISPATCH__INIT;
    d.has_step_id = d.has_epoch = d.has_layer = d.has_src_rank = 1;
    d.has_n_rows = d.has_n_pairs = d.has_format = d.has_scales_e8m0 = d.has_session = 1;
    d.step_id = step;
    d.session = SESSION;
    d.epoch = EPOCH;
    d.src_rank = 0;
    d.n_rows = (uint32_t)n_rows;
    d.n_pairs = (uint32_t)n_pairs;
    d.format = EPMOE__DISPATCH_FORMAT__DISPATCH_FP8;
    d.scales_e8m0 = 1;
    return d;
}

TEST(garbage_and_malformed_messages_are_dropped)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    /* a stranger that speaks raw ZeroMQ to rank 1's data endpoint */
    void *raw = zmq_socket(zctx, ZMQ_PUSH);
    CHECK(zmq_connect(raw, tpz_endpoint(tp[1])) == 0);
    uint64_t dropped = 0;
    const uint8_t t_disp[2] = {60, 0}, t_step[2] = {17, 0};
#define EXPECT_DROP(needle)                                                                        \
    do {                                                                                           \
        dropped++;                                                                                 \
        CHECK(wait_dropped(tp[1], dropped));                                                       \
        CHECK_STR_HAS(tpz_last_drop(tp[1]), needle);                                               \
    } while (0)
    {
        const void *f[] = {"hello"};
        size_t l[] = {5};
        send_frames(raw, f, l, 1);
        EXPECT_DROP("not an epmoe message");
    }
    {
        const void *f[] = {"EPMOE1", t_disp,
                           "\x0a\x7f"
                           "abc"};
        size_t l[] = {6, 2, 5};
        send_frames(raw, f, l, 3);
        EXPECT_DROP("not a valid Dispatch");
    }
    {
        const void *f[] = {"EPMOE1", t_step, ""};
        size_t l[] = {6, 2, 0};
        send_frames(raw, f, l, 3);
        EXPECT_DROP("MSG_STEP is not a data-plane message");
    }
    const size_t H8 = H, SC = H / 128;
    uint32_t rows_ok[2] = {0, 1}, rows_bad[2] = {0, 2};
    uint32_t exp_ok[2] = {8, 15}, exp_bad[2] = {8, 3}, exp_range[2] = {8, 16};
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        d.has_n_rows = 0;
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("n_rows, n_pairs or format missing");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        size_t l[] = {2 * H8 - 1, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("codes payload has 511 bytes, expected 512");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        d.scales_e8m0 = 0; /* f32 scales: 4 bytes each */
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("scales payload has 4 bytes, expected 16");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        size_t l[] = {2 * H8, 2 * SC, 8, 8};
        send_dispatch(raw, &d, l, 4, rows_ok, exp_ok);
        EXPECT_DROP("4 payloads, expected 5");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_bad, exp_ok);
        EXPECT_DROP("pair_row[1] = 2, expected < n_rows 2");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_bad);
        EXPECT_DROP("pair_expert[1] = 3 is not an expert of rank 1");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_range);
        EXPECT_DROP("pair_expert[1] = 16 is not an expert");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 200);
        size_t l[] = {2 * H8, 2 * SC, 800, 800, 800};
        send_dispatch(raw, &d, l, 5, NULL, NULL);
        EXPECT_DROP("n_pairs <= n_rows * 4 (the model's top-k)");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        d.session = SESSION + 1;
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("is not this cluster's (a stale or forged message)");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        d.has_session = 0;
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("session missing");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        d.epoch = EPOCH + 1;
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("epoch 8, expected 7");
    }
    {
        Epmoe__Dispatch d = good_body(1, 2, 2);
        d.src_rank = 1;
        size_t l[] = {2 * H8, 2 * SC, 8, 8, 8};
        send_dispatch(raw, &d, l, 5, rows_ok, exp_ok);
        EXPECT_DROP("src_rank 1 is not a peer");
    }
    {
        Epmoe__Combine c = EPMOE__COMBINE__INIT;
        c.has_step_id = c.has_epoch = c.has_src_rank = c.has_n_pairs = c.has_session = 1;
        c.step_id = 1;
        c.session = SESSION;
        c.epoch = EPOCH;
        c.n_pairs = 3;
        static uint8_t out[3 * H * 2];
        wire_payload p = {.data = out, .len = sizeof out - 2};
        CHECK(wire_send(raw, NULL, 0, EPMOE__MSG_TYPE__MSG_COMBINE, &c.base, &p, 1, false, NULL) ==
              0);
        EXPECT_DROP("out payload has 1534 bytes, expected 1536");
    }
    CHECK_EQ(tpz_pending(tp[1]), 0);
    /* the well-formed exchange still works, with garbage interleaved mid-step */
    tp_msg m;
    ep_err err;
    CHECK(make_dispatch(&m, 9, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    const void *f[] = {"EPMOE1"};
    size_t l[] = {6};
    send_frames(raw, f, l, 1);
    EXPECT_DROP("type frame missing");
    tp_msg got;
    CHECK(wait_take(tp[1], 9, &got));
    CHECK(dispatch_matches(&got, 1, 2));
    tpz_msg_release(&got);
    /* a frame above the largest this model can produce never reaches the transport: libzmq
     * drops the connection at the frame header (MAXMSGSIZE), before buffering it */
    int64_t max = 0;
    int hwm = 0;
    size_t len = sizeof max;
    CHECK(zmq_getsockopt(tpz_socket(tp[1]), ZMQ_MAXMSGSIZE, &max, &len) == 0);
    CHECK(max == tpz_max_frame(H, TOPK) && max == (int64_t)EP_MAX_TOKENS * TOPK * H * 2);
    len = sizeof hwm;
    CHECK(zmq_getsockopt(tpz_socket(tp[1]), ZMQ_RCVHWM, &hwm, &len) == 0);
    CHECK_EQ(hwm, TPZ_RCVHWM);
    size_t over = (size_t)tpz_max_frame(H, TOPK) + 1;
    void *big = calloc(1, over);
    Epmoe__Combine c = EPMOE__COMBINE__INIT;
    wire_payload bp = {.data = big, .len = over};
    CHECK(big &&
          wire_send(raw, NULL, 0, EPMOE__MSG_TYPE__MSG_COMBINE, &c.base, &bp, 1, false, NULL) == 0);
    CHECK(make_dispatch(&m, 10, 0, 1, 2) == 0);
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    CHECK(wait_take(tp[1], 10, &got));
    tpz_msg_release(&got);
    /* the oversized message is never seen (with a 1 GiB bound it arrived and was dropped) */
    for (int i = 0; i < 300 && tpz_dropped(tp[1]) == dropped; i++) {
        zmq_pollitem_t it = {.socket = tpz_socket(tp[1]), .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10) > 0)
            tpz_pump(tp[1]);
    }
    CHECK_EQ(tpz_dropped(tp[1]), dropped);
    free(big);
    zmq_close(raw);
    world_close(tp, 2);
#undef EXPECT_DROP
}

/* The serving path (docs/operations.md "Not protected"): a stranger that sniffed the session
 * and a request's (request, attempt) sends an empty DISPATCH "from rank 0" before rank 0's real
 * one. Both are kept, in arrival order, and the real one arrives whole: there is no duplicate
 * rule to win (the origin takes only the COMBINE with its part's pair count, so the forgery's
 * empty answer is dropped there, and the real request completes). */
TEST(a_forged_request_dispatch_does_not_displace_the_real_one)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    ep_err err;
    const uint64_t request = 0x1234000500000007ull;
    void *raw = zmq_socket(zctx, ZMQ_PUSH);
    CHECK(zmq_connect(raw, tpz_endpoint(tp[1])) == 0);
    Epmoe__Dispatch d = good_body(0, 0, 0);
    d.has_step_id = 0;
    d.has_request = d.has_attempt = 1;
    d.request = request;
    d.attempt = 2;
    size_t len[5] = {0, 0, 0, 0, 0};
    send_dispatch(raw, &d, len, 5, NULL, NULL);
    wait_pending(tp[1], 1);
    CHECK_EQ(tpz_pending(tp[1]), 1);
    tp_msg m, got;
    CHECK(make_dispatch(&m, 0, 0, 1, 2) == 0); /* step 0's generator: the contents to check */
    CHECK(m.n_pairs > 0);
    m.is_request = true;
    m.request = request;
    m.attempt = 2;
    CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    wait_pending(tp[1], 2);
    CHECK_EQ(tpz_pending(tp[1]), 2);
    CHECK_EQ(tpz_dropped(tp[1]), 0);
    int taken = tpz_take_request(tp[1], &got); /* the forgery, first */
    CHECK_EQ(taken, 1);
    if (taken == 1) {
        CHECK(got.is_request && got.request == request && got.n_pairs == 0);
        tpz_msg_release(&got);
    }
    taken = tpz_take_request(tp[1], &got); /* the real one, whole */
    CHECK_EQ(taken, 1);
    if (taken == 1) {
        CHECK(got.is_request && got.request == request && got.attempt == 2 && got.src_rank == 0);
        CHECK(dispatch_matches(&got, 1, 2));
        tpz_msg_release(&got);
    }
    CHECK_EQ(tpz_pending(tp[1]), 0);
    zmq_close(raw);
    world_close(tp, 2);
}

/* Issue 26 defect 7: the validator allowed 64 pairs a row whatever the model's k, so one forged
 * DISPATCH of 1,024 rows could claim 65,536 pairs (6.8 s of expert work and a 64 MiB COMBINE
 * at H 4096). An honest origin sends at most k pairs a row (top-k of each token; hash-routed
 * layers pick k experts too, and the shared expert never travels): k + 1 is refused. */
TEST(a_dispatch_claiming_more_than_top_k_pairs_a_row_is_dropped)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    void *raw = zmq_socket(zctx, ZMQ_PUSH);
    CHECK(zmq_connect(raw, tpz_endpoint(tp[1])) == 0);
    const int rows = 2;
    for (int extra = 0; extra <= 1; extra++) {
        int pairs = rows * TOPK + extra;
        Epmoe__Dispatch d = good_body(0, rows, pairs);
        d.has_step_id = 0;
        d.has_request = d.has_attempt = 1;
        d.request = 0x77000000010000ull + (uint64_t)extra;
        d.attempt = 1;
        size_t len[5] = {(size_t)rows * H, (size_t)rows * H / 128, (size_t)pairs * 4,
                         (size_t)pairs * 4, (size_t)pairs * 4};
        send_dispatch(raw, &d, len, 5, NULL, NULL);
    }
    CHECK(wait_dropped(tp[1], 1));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "top-k");
    wait_pending(tp[1], 1);
    tp_msg got;
    CHECK_EQ(tpz_take_request(tp[1], &got), 1); /* k pairs a row: an honest shape, kept */
    CHECK_EQ(got.n_pairs, rows * TOPK);
    tpz_msg_release(&got);
    CHECK_EQ(tpz_take_request(tp[1], &got), 0);
    zmq_close(raw);
    world_close(tp, 2);
}

/* Issue 26 defect 7: 20,000 forged DISPATCHes a second in rank 0's name filled rank 0's
 * credits at the receiver, so rank 0's real DISPATCHes were dropped "beyond the peer's
 * credits". Credits are counted per connection: a flood spends its own connection's, and the
 * real peer's connection keeps all of its own. */
TEST(a_flood_in_a_peers_name_does_not_spend_that_peers_credits)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    ep_err err;
    void *raw = zmq_socket(zctx, ZMQ_PUSH);
    CHECK(zmq_connect(raw, tpz_endpoint(tp[1])) == 0);
    const int flood = 2 * TPZ_SERVE_CREDITS;
    for (int i = 0; i < flood; i++) {
        Epmoe__Dispatch d = good_body(0, 0, 0);
        d.has_step_id = 0;
        d.has_request = d.has_attempt = 1;
        d.request = 0x66000000000000ull + (uint64_t)i;
        d.attempt = 1;
        size_t len[5] = {0, 0, 0, 0, 0};
        send_dispatch(raw, &d, len, 5, NULL, NULL);
    }
    CHECK(wait_dropped(tp[1], (uint64_t)(flood - TPZ_SERVE_CREDITS)));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "beyond");
    CHECK_EQ(tpz_pending(tp[1]), TPZ_SERVE_CREDITS);
    int real = 0;
    for (int i = 0; i < TPZ_SERVE_CREDITS; i++) { /* rank 0's real ones, all its credits */
        tp_msg m;
        CHECK(make_dispatch(&m, 0, 0, 1, 2) == 0);
        m.is_request = true;
        m.request = 0x55000000000000ull + (uint64_t)i;
        m.attempt = 1;
        CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    }
    wait_pending(tp[1], 2 * TPZ_SERVE_CREDITS);
    CHECK_EQ(tpz_dropped(tp[1]), (uint64_t)(flood - TPZ_SERVE_CREDITS));
    tp_msg got;
    while (tpz_take_request(tp[1], &got) == 1) {
        if (got.n_pairs > 0 && dispatch_matches(&got, 1, 2))
            real++;
        tpz_msg_release(&got);
    }
    CHECK_EQ(real, TPZ_SERVE_CREDITS);
    zmq_close(raw);
    world_close(tp, 2);
}

static bool awaits_one(void *ctx, uint64_t request, uint32_t attempt, int src_rank)
{
    return request == *(const uint64_t *)ctx && attempt == 1 && src_rank == 0;
}

/* Issue 26 defect 7, the other half: a forged DISPATCH in rank 1's name at rank 0 is answered
 * with a COMBINE to rank 1 over rank 0's own, real connection, so a flood of forgeries filled
 * that connection's COMBINE credits at rank 1 and rank 0's real COMBINEs were dropped "beyond
 * the credits". With the owner's tpz_awaits_fn, a COMBINE no part waits for is dropped on
 * arrival and takes no credit. */
TEST(combines_no_part_awaits_take_no_credit)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    ep_err err;
    uint64_t wanted = 0x44000000000001ull;
    tpz_set_awaits(tp[1], awaits_one, &wanted);
    const int junk = 2 * TPZ_SERVE_CREDITS;
    for (int i = 0; i < junk + TPZ_SERVE_CREDITS; i++) {
        tp_msg m;
        CHECK(make_combine(&m, 0, 0, 1, 2) == 0);
        m.is_request = true;
        m.request = i < junk ? 0x33000000000000ull + (uint64_t)i : wanted;
        m.attempt = 1;
        CHECK(tpz_send(tp[0], 1, &m, &err) == 0);
    }
    wait_pending(tp[1], TPZ_SERVE_CREDITS);
    CHECK(wait_dropped(tp[1], (uint64_t)junk));
    CHECK_EQ(tpz_dropped(tp[1]), (uint64_t)junk);
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "no such part in flight");
    int real = 0;
    tp_msg got;
    while (tpz_take_request(tp[1], &got) == 1) {
        real += got.request == wanted && got.n_pairs == 2 && combine_matches(&got, 1, 2);
        tpz_msg_release(&got);
    }
    CHECK_EQ(real, TPZ_SERVE_CREDITS);
    world_close(tp, 2);
}

TEST(send_to_self_or_unknown_rank_fails)
{
    tpz_transport *tp[2] = {0};
    world_open(tp, 2);
    tp_msg m = {.kind = TP_COMBINE, .step_id = 1, .n_pairs = 1};
    ep_err err = {0};
    CHECK(tpz_msg_alloc(&m, H, &err) == 0);
    CHECK(tpz_send(tp[0], 0, &m, &err) != 0);
    CHECK_STR_HAS(err.msg, "no connection to rank 0");
    CHECK(m.buf == NULL); /* released on failure too */
    CHECK(tpz_msg_alloc(&m, H, &err) == 0);
    CHECK(tpz_send(tp[0], 5, &m, &err) != 0);
    CHECK_STR_HAS(err.msg, "rank 5");
    world_close(tp, 2);
}

TEST(bind_failure_names_the_endpoint)
{
    tpz_config cfg = {.rank = 0,
                      .world_size = 1,
                      .epoch = 1,
                      .hidden = H,
                      .n_experts = E,
                      .topk = TOPK,
                      .expert_owner = owners,
                      .bind_endpoint = "tcp://300.1.1.1:5"};
    ep_err err = {0};
    CHECK(tpz_create(zctx, &cfg, &err) == NULL);
    CHECK_STR_HAS(err.msg, "cannot bind tcp://300.1.1.1:5");
}

/* A step between rank 0 and rank 1 of a secure world: both DISPATCH, both COMBINE. */
static void secure_exchange(tpz_transport **tp, uint64_t step)
{
    rank_ctx c0 = {.tp = tp[0], .rank = 0, .P = 2, .steps = (int)step};
    rank_ctx c1 = {.tp = tp[1], .rank = 1, .P = 2, .steps = (int)step};
    pthread_t th;
    pthread_create(&th, NULL, run_one_step, &c0);
    CHECK(run_step(&c1, step) == 0);
    pthread_join(th, NULL);
    if (c0.fail[0] || c1.fail[0])
        printf("  %s %s\n", c0.fail, c1.fail);
    CHECK(c0.fail[0] == '\0');
}

TEST(with_security_only_each_ranks_own_key_gets_through)
{
    if (!auth_available())
        SKIP("libzmq without CURVE");
    ep_err err = {0};
    auth_zap *zap = auth_zap_start(zctx, &err);
    CHECK(zap != NULL);
    world_sec sec;
    static const char *const names[3] = {"w0", "w1", "w2"};
    auth_list *allow = auth_list_new();
    for (int r = 0; r < 3; r++) {
        char pub[AUTH_Z85_LEN + 1], secz[AUTH_Z85_LEN + 1];
        CHECK(zmq_curve_keypair(pub, secz) == 0);
        zmq_z85_decode(sec.keys[r].pub, pub);
        zmq_z85_decode(sec.keys[r].sec, secz);
        memcpy(sec.pubs[r], sec.keys[r].pub, AUTH_KEY_BYTES);
        sec.names[r] = names[r];
        CHECK(auth_list_add(allow, sec.keys[r].pub, names[r], &err) == 0);
    }
    CHECK(auth_zap_allow(zap, AUTH_DOMAIN_DATA, allow, &err) == 0);
    tpz_transport *tp[2] = {0};
    world_open_with(tp, 2, &sec);
    secure_exchange(tp, 1);
    /* w2's key is admitted (it is in the list) but may not speak for rank 0 */
    void *liar = zmq_socket(zctx, ZMQ_PUSH);
    int linger = 0;
    zmq_setsockopt(liar, ZMQ_LINGER, &linger, sizeof linger);
    CHECK(auth_client(liar, &sec.keys[2], sec.pubs[1], &err) == 0);
    CHECK(zmq_connect(liar, tpz_endpoint(tp[1])) == 0);
    Epmoe__Dispatch d = good_body(2, 0, 0);
    size_t l[] = {0, 0, 0, 0, 0};
    send_dispatch(liar, &d, l, 5, NULL, NULL);
    CHECK(wait_dropped(tp[1], 1));
    CHECK_STR_HAS(tpz_last_drop(tp[1]), "claims rank 0 (w0) but comes with the key of w2");
    CHECK_EQ(tpz_pending(tp[1]), 0);
    /* a key nobody listed cannot even connect: refused by ZAP, nothing reaches the transport */
    auth_keypair stranger;
    char pub[AUTH_Z85_LEN + 1], secz[AUTH_Z85_LEN + 1];
    zmq_curve_keypair(pub, secz);
    zmq_z85_decode(stranger.pub, pub);
    zmq_z85_decode(stranger.sec, secz);
    void *out = zmq_socket(zctx, ZMQ_PUSH);
    zmq_setsockopt(out, ZMQ_LINGER, &linger, sizeof linger);
    CHECK(auth_client(out, &stranger, sec.pubs[1], &err) == 0);
    CHECK(zmq_connect(out, tpz_endpoint(tp[1])) == 0);
    zmq_send(out, "", 0, ZMQ_DONTWAIT); /* queued: the handshake fails before it can leave */
    for (int i = 0; i < 500 && auth_zap_refused(zap) == 0; i++)
        usleep(10000);
    CHECK(auth_zap_refused(zap) >= 1);
    for (int i = 0; i < 20; i++) {
        zmq_pollitem_t it = {.socket = tpz_socket(tp[1]), .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10) > 0)
            tpz_pump(tp[1]);
    }
    CHECK_EQ(tpz_dropped(tp[1]), 1); /* only the liar's message ever arrived */
    /* and the ranks go on */
    secure_exchange(tp, 4);
    zmq_close(out);
    zmq_close(liar);
    world_close(tp, 2);
    auth_zap_stop(&zap);
}

int main(void)
{
    zctx = zmq_ctx_new();
    RUN(round_trip_two_ranks_all_formats);
    RUN(round_trip_three_ranks_all_formats);
    RUN(round_trip_four_ranks_all_formats);
    RUN(empty_messages_round_trip);
    RUN(future_steps_are_kept_and_finished_steps_dropped);
    RUN(a_peer_holds_one_dispatch_and_only_granted_combines);
    RUN(a_new_epoch_keeps_the_sockets_and_drops_the_old_epoch);
    RUN(garbage_and_malformed_messages_are_dropped);
    RUN(a_forged_request_dispatch_does_not_displace_the_real_one);
    RUN(a_dispatch_claiming_more_than_top_k_pairs_a_row_is_dropped);
    RUN(a_flood_in_a_peers_name_does_not_spend_that_peers_credits);
    RUN(combines_no_part_awaits_take_no_credit);
    RUN(send_to_self_or_unknown_rank_fails);
    RUN(bind_failure_names_the_endpoint);
    RUN(with_security_only_each_ranks_own_key_gets_through);
    zmq_ctx_term(zctx);
    return test_report();
}
