/*
 * test_step_nccl.c — the NCCL plane's step driver (worker/step_nccl.h) on the CPU: P ranks are P
 * threads, the communicator library is tests/unit/fake_comm.c and the "device" a fake of
 * cuda_step.h over host memory whose routing and expert arithmetic are simple closed formulas of
 * a token's global number g (stored in x[t][0]).
 *
 * Proves: for P = 1 .. 4, uneven token counts (0 included), e8m0 and f32 scales and several
 * steps, every token's output equals the value computed here directly from g, so each row went
 * to the rank owning each expert it selected, with its pairs in order, and came back to its
 * [token, slot]; the fake device refuses a pair of an expert its rank does not own; per-expert
 * counts and the data-plane byte counts match a direct count. Failures: a dead peer (ERR_TIMEOUT
 * by the deadline), a peer with another epoch (its counts refused, naming it), a peer that sends
 * pairs of experts the receiver does not own (refused by tp_check_pairs), a device failure and
 * an owner's interruption all fail the step with their code and leave the communicator aborted;
 * a step on an aborted communicator fails at once without touching the device.
 */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "epmoe.pb-c.h"
#include "fake_comm.h"
#include "test.h"
#include "worker/step_nccl.h"

#define MAX_P      4
#define H          256
#define SC         (H / 128)
#define K          3
#define E          12
#define EPOCH      7
#define WATCHDOG_S 30

/* ---- the closed formulas ------------------------------------------------------------------- */

static uint16_t f2bf(float f) /* truncation: any fixed rounding does for a transport test */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int route_expert(int g, int j)
{
    return (g + j) % 7 == 0 ? -1 : (g * 5 + j * 3) % E;
}

static float route_weight(int j)
{
    return (float)(j + 1) / 8.0f;
}

static uint8_t code_of(uint16_t x)
{
    return (uint8_t)(x ^ (x >> 8));
}

static float scale_of(int g, int b)
{
    return ldexpf(1.0f, (g + b) % 5 - 2);
}

static uint16_t x_of(int g, int h)
{
    return h == 0 ? (uint16_t)g : (uint16_t)(g * 131 + h * 7);
}

static uint16_t expert_value(uint8_t code, float scale, int e, float w)
{
    return f2bf((float)code * scale * (float)(e + 1) * w);
}

static uint16_t expected_out(int g, int h)
{
    float acc = (float)code_of(x_of(g, h)); /* the fake's shared expert */
    for (int j = 0; j < K; j++) {
        int e = route_expert(g, j);
        if (e >= 0)
            acc +=
                bf2f(expert_value(code_of(x_of(g, h)), scale_of(g, h / 128), e, route_weight(j)));
    }
    return f2bf(acc);
}

/* ---- the fake device ------------------------------------------------------------------------- */

typedef struct fd_dev {
    fc_stream *stream;
    int rank;
    const uint32_t *owner; /* the true placement: experts refuse pairs that are not theirs */
    int step_begins;
    const char *fail_experts; /* inject: experts fail with this */
} fd_dev;

typedef struct fd_step {
    int T;
    uint8_t *q;
    float *qs;
    uint16_t *eo;
    int32_t *ids;
    bool shared;
} fd_step;

static void *fd_stream(void *dev)
{
    return ((fd_dev *)dev)->stream;
}

static int fd_wait(void *dev, double deadline, ep_err *err)
{
    return 0; /* every fake operation is done when it returns */
}

static int fd_alloc(void *dev, void **p, size_t bytes, ep_err *err)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? 0 : ep_err_set(err, "fake: out of memory");
}

static void fd_free(void *dev, void *p)
{
    free(p);
}

static int fd_copy(void *dev, void *dst, const void *src, size_t bytes, ep_err *err)
{
    memcpy(dst, src, bytes);
    return 0;
}

static void *fd_step_begin(void *dev, const void *layer, int T, const uint16_t *x,
                           const int64_t *ids, int32_t *topk_ids, float *topk_w, double deadline,
                           ep_err *err)
{
    ((fd_dev *)dev)->step_begins++;
    fd_step *s = calloc(1, sizeof *s);
    s->T = T;
    s->q = malloc((size_t)T * H + 1);
    s->qs = malloc((size_t)T * SC * 4 + 1);
    s->eo = calloc((size_t)T * K * H + 1, 2);
    s->ids = malloc((size_t)T * K * 4 + 1);
    for (int t = 0; t < T; t++) {
        int g = x[(size_t)t * H];
        for (int j = 0; j < K; j++) {
            topk_ids[t * K + j] = s->ids[t * K + j] = route_expert(g, j);
            topk_w[t * K + j] = route_weight(j);
        }
        for (int h = 0; h < H; h++)
            s->q[(size_t)t * H + h] = code_of(x[(size_t)t * H + h]);
        for (int b = 0; b < SC; b++)
            s->qs[t * SC + b] = scale_of(g, b);
    }
    return s;
}

static int fd_step_shared(void *step, ep_err *err)
{
    ((fd_step *)step)->shared = true;
    return 0;
}

static const uint8_t *fd_step_q(const void *step)
{
    return ((const fd_step *)step)->q;
}

static const float *fd_step_qs(const void *step)
{
    return ((const fd_step *)step)->qs;
}

static int fd_gather(void *dev, int h_, int n, const uint32_t *rows, const uint8_t *q,
                     const float *qs, bool e8m0, uint8_t *codes, void *scales, ep_err *err)
{
    for (int i = 0; i < n; i++) {
        memcpy(codes + (size_t)i * H, q + (size_t)rows[i] * H, H);
        for (int b = 0; b < SC; b++) {
            float v = qs[rows[i] * SC + b];
            uint32_t u;
            memcpy(&u, &v, 4);
            if (e8m0)
                ((uint8_t *)scales)[i * SC + b] = (uint8_t)(u >> 23); /* power of two */
            else
                ((float *)scales)[i * SC + b] = v;
        }
    }
    return 0;
}

static int fd_scales_to_f32(void *dev, size_t n, const uint8_t *e8m0, float *f32, ep_err *err)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)e8m0[i] << 23;
        memcpy(&f32[i], &u, 4);
    }
    return 0;
}

static int fd_experts(void *dev, const void *layer, int n_rows, const uint8_t *q, const float *qs,
                      int n_pairs, const uint32_t *row, const uint32_t *ex, const float *w,
                      uint16_t *out, ep_err *err)
{
    fd_dev *d = dev;
    if (d->fail_experts)
        return ep_err_set(err, "%s", d->fail_experts);
    for (int p = 0; p < n_pairs; p++) {
        if (d->owner[ex[p]] != (uint32_t)d->rank)
            return ep_err_set(err, "fake: expert %u is not on rank %d", ex[p], d->rank);
        if (row[p] >= (uint32_t)n_rows)
            return ep_err_set(err, "fake: row %u of %d", row[p], n_rows);
        for (int h = 0; h < H; h++)
            out[(size_t)p * H + h] = expert_value(q[(size_t)row[p] * H + h],
                                                  qs[row[p] * SC + h / 128], (int)ex[p], w[p]);
    }
    return 0;
}

static int fd_scatter(void *dev, int h_, int n, const uint32_t *slots, const uint16_t *rows,
                      uint16_t *eo, ep_err *err)
{
    for (int i = 0; i < n; i++)
        memcpy(eo + (size_t)slots[i] * H, rows + (size_t)i * H, H * 2);
    return 0;
}

static uint16_t *fd_step_eo(void *step, ep_err *err)
{
    return ((fd_step *)step)->eo;
}

static int fd_step_finish(void *step, uint16_t *out, double deadline, ep_err *err)
{
    fd_step *s = step;
    if (!s->shared)
        return ep_err_set(err, "fake: the shared expert was never started");
    for (int t = 0; t < s->T; t++)
        for (int h = 0; h < H; h++) {
            float acc = (float)s->q[(size_t)t * H + h];
            for (int j = 0; j < K; j++)
                if (s->ids[t * K + j] >= 0)
                    acc += bf2f(s->eo[((size_t)t * K + j) * H + h]);
            out[(size_t)t * H + h] = f2bf(acc);
        }
    return 0;
}

static void fd_step_free(void **step_p)
{
    fd_step *s = *step_p;
    if (s) {
        free(s->q);
        free(s->qs);
        free(s->eo);
        free(s->ids);
        free(s);
    }
    *step_p = NULL;
}

static const sn_dev_ops fd_ops = {.stream = fd_stream,
                                  .wait = fd_wait,
                                  .alloc = fd_alloc,
                                  .free = fd_free,
                                  .alloc_host = fd_alloc,
                                  .free_host = fd_free,
                                  .h2d = fd_copy,
                                  .d2h = fd_copy,
                                  .step_begin = fd_step_begin,
                                  .step_shared = fd_step_shared,
                                  .step_q = fd_step_q,
                                  .step_qs = fd_step_qs,
                                  .gather = fd_gather,
                                  .scales_to_f32 = fd_scales_to_f32,
                                  .experts = fd_experts,
                                  .scatter = fd_scatter,
                                  .step_eo = fd_step_eo,
                                  .step_finish = fd_step_finish,
                                  .step_free = fd_step_free};

/* ---- ranks ----------------------------------------------------------------------------------- */

typedef struct world {
    fc_world *w;
    pthread_barrier_t bar;
    tpc_id id;
    int P;
    int session_world;      /* worker ranks of the session (P: the communicator is all of them) */
    uint32_t member[MAX_P]; /* worker rank of each communicator rank */
    uint32_t owner[E];      /* worker ranks */
    bool e8m0;
    int steps;
    int tokens[MAX_P]; /* per rank and step: tokens[rank] + step */
    /* injections */
    int dead_rank, dead_from_step;
    int epoch_rank;     /* this rank runs at epoch EPOCH + 1 */
    int liar_rank;      /* this rank believes expert e belongs to (owner[e] + 1) % P */
    int fail_rank;      /* this rank's experts fail */
    int interrupt_rank; /* this rank's idle function gives up */
    double timeout;
} world;

typedef struct rank_ctx {
    world *wd;
    int rank;
    fd_dev dev;
    tpc_comm *comm;
    sn_driver *drv;
    int rc, code, failed_step;
    ep_err err;
    int bad_outputs, steps_done;
    uint32_t expert_tokens[E];
    uint64_t dispatch_bytes;
    tpc_state state_after;
    int idle_calls;
} rank_ctx;

static int rank_tokens(const world *wd, int r, int step)
{
    return wd->tokens[r] == 0 ? 0 : wd->tokens[r] + step;
}

/* The global number of token t of rank r in step. */
static int token_g(int r, int step, int t)
{
    return 1 + r * 97 + step * 13 + t;
}

static int idle_give_up(void *ctx, ep_err *err)
{
    rank_ctx *r = ctx;
    if (++r->idle_calls < 5)
        return 0;
    return ep_err_set(err, "STEP_ABORT from the coordinator");
}

static void run_step(rank_ctx *r, int step)
{
    world *wd = r->wd;
    int T = rank_tokens(wd, r->rank, step);
    uint16_t *x = malloc((size_t)T * H * 2 + 1), *out = calloc((size_t)T * H + 1, 2);
    int32_t *ids = malloc((size_t)T * K * 4 + 1);
    float *w = malloc((size_t)T * K * 4 + 1);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            x[(size_t)t * H + h] = x_of(token_g(r->rank, step, t), h);
    sn_step io = {.step_id = (uint64_t)(10 + step),
                  .layer = NULL,
                  .layer_index = 2,
                  .T = T,
                  .x = x,
                  .topk_ids = ids,
                  .topk_w = w,
                  .out = out,
                  .expert_tokens = r->expert_tokens,
                  .deadline = clk_mono_s() + wd->timeout,
                  .idle = r->rank == wd->interrupt_rank ? idle_give_up : NULL,
                  .idle_ctx = r};
    r->rc = sn_run(r->drv, &io, &r->code, &r->err);
    if (r->rc == 0) {
        r->steps_done++;
        r->dispatch_bytes += io.dispatch_bytes;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                r->bad_outputs +=
                    out[(size_t)t * H + h] != expected_out(token_g(r->rank, step, t), h);
    } else {
        r->failed_step = step;
    }
    free(x);
    free(out);
    free(ids);
    free(w);
}

static void *rank_main(void *p)
{
    rank_ctx *r = p;
    world *wd = r->wd;
    ep_err err = {0};
    r->dev = (fd_dev){
        .stream = fc_stream_new(wd->w), .rank = (int)wd->member[r->rank], .owner = wd->owner};
    if (r->rank == wd->fail_rank)
        r->dev.fail_experts = "fake: injected device fault";
    r->comm = tpc_create(fc_ops(), wd->w, &err);
    if (r->rank == 0)
        tpc_new_id(r->comm, &wd->id, &err);
    pthread_barrier_wait(&wd->bar);
    tpc_begin_init(r->comm, EPOCH, 0, r->rank, wd->P, &wd->id, &err);
    if (tpc_wait_ready(r->comm, clk_mono_s() + 10, NULL, NULL, &r->err) != 0) {
        r->rc = -1;
        return NULL;
    }
    uint32_t owner[E];
    for (int e = 0; e < E; e++)
        owner[e] = r->rank == wd->liar_rank ? (wd->owner[e] + 1) % (uint32_t)wd->P : wd->owner[e];
    static const char *const names[MAX_P + 2] = {"w0", "w1", "w2", "w3", "w4", "w5"};
    bool sub = wd->session_world != wd->P;
    sn_config cfg = {.rank = (int)wd->member[r->rank],
                     .world_size = wd->session_world,
                     .comm_rank = r->rank,
                     .comm_size = wd->P,
                     .members = sub ? wd->member : NULL,
                     .epoch = r->rank == wd->epoch_rank ? EPOCH + 1 : EPOCH,
                     .hidden = H,
                     .topk = K,
                     .n_experts = E,
                     .expert_owner = owner,
                     .scales_e8m0 = wd->e8m0,
                     .peer_name = names};
    r->drv = sn_create(&cfg, &fd_ops, &r->dev, r->comm, &r->err);
    for (int step = 0; step < wd->steps && r->drv && r->rc == 0; step++) {
        if (r->rank == wd->dead_rank && step >= wd->dead_from_step)
            break;
        run_step(r, step);
    }
    r->state_after = tpc_get_state(r->comm);
    return NULL;
}

static void run_world(world *wd, rank_ctx *r)
{
    pthread_t t[MAX_P];
    pthread_barrier_init(&wd->bar, NULL, (unsigned)wd->P);
    for (int i = 0; i < wd->P; i++) {
        r[i] = (rank_ctx){.wd = wd, .rank = i};
        pthread_create(&t[i], NULL, rank_main, &r[i]);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WATCHDOG_S;
    for (int i = 0; i < wd->P; i++)
        if (pthread_timedjoin_np(t[i], NULL, &until) != 0) {
            printf("FAIL: rank %d still running after %d s: a wait without a deadline\n", i,
                   WATCHDOG_S);
            fflush(stdout);
            _exit(1);
        }
    pthread_barrier_destroy(&wd->bar);
}

static void free_world(world *wd, rank_ctx *r)
{
    for (int i = 0; i < wd->P; i++) {
        sn_destroy(&r[i].drv);
        tpc_destroy(&r[i].comm);
    }
    fc_world_free(&wd->w);
}

static void world_init(world *wd, int P)
{
    *wd = (world){.w = fc_world_new(),
                  .P = P,
                  .steps = 3,
                  .dead_rank = -1,
                  .epoch_rank = -1,
                  .liar_rank = -1,
                  .fail_rank = -1,
                  .interrupt_rank = -1,
                  .timeout = 10,
                  .session_world = P};
    for (int i = 0; i < P; i++)
        wd->member[i] = (uint32_t)i;
    for (int e = 0; e < E; e++)
        wd->owner[e] = (uint32_t)((e * 7) % P); /* scattered: not contiguous */
    static const int tokens[MAX_P] = {5, 0, 9, 2};
    for (int i = 0; i < P; i++)
        wd->tokens[i] = tokens[i];
}

/* ---- the data path --------------------------------------------------------------------------- */

/* members: the worker ranks of the communicator's ranks in a session of session_world ranks
 * (NULL: the communicator is the session) */
static void check_world_in(int P, bool e8m0, int session_world, const uint32_t *members)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, P);
    wd.e8m0 = e8m0;
    if (members) {
        wd.session_world = session_world;
        for (int i = 0; i < P; i++)
            wd.member[i] = members[i];
        for (int e = 0; e < E; e++)
            wd.owner[e] = members[(e * 7) % P];
    }
    run_world(&wd, r);
    uint32_t want_tokens[E] = {0};
    uint64_t want_bytes[MAX_P] = {0};
    for (int src = 0; src < P; src++)
        for (int step = 0; step < wd.steps; step++) {
            int rows[MAX_P] = {0}, pairs[MAX_P] = {0};
            for (int t = 0; t < rank_tokens(&wd, src, step); t++) {
                int seen[MAX_P] = {0};
                for (int j = 0; j < K; j++) {
                    int e = route_expert(token_g(src, step, t), j);
                    if (e < 0)
                        continue;
                    int dst = 0;
                    while (wd.member[dst] != wd.owner[e])
                        dst++;
                    want_tokens[e]++;
                    pairs[dst]++;
                    rows[dst] += !seen[dst];
                    seen[dst] = 1;
                }
            }
            for (int dst = 0; dst < P; dst++)
                if (dst != src)
                    want_bytes[src] +=
                        (uint64_t)rows[dst] * (H + SC * (e8m0 ? 1 : 4)) + (uint64_t)pairs[dst] * 12;
        }
    for (int i = 0; i < P; i++) {
        CHECK_EQ(r[i].rc, 0);
        if (r[i].rc)
            printf("  P %d rank %d: %s\n", P, i, r[i].err.msg);
        CHECK_EQ(r[i].steps_done, wd.steps);
        CHECK_EQ(r[i].bad_outputs, 0);
        CHECK_EQ(r[i].dispatch_bytes, want_bytes[i]);
        CHECK_EQ(r[i].state_after, TPC_READY);
        for (int e = 0; e < E; e++)
            if (wd.owner[e] == wd.member[i])
                CHECK_EQ(r[i].expert_tokens[e], want_tokens[e]);
    }
    free_world(&wd, r);
}

static void check_world(int P, bool e8m0)
{
    check_world_in(P, e8m0, P, NULL);
}

TEST(outputs_match_the_direct_computation_for_one_to_four_ranks)
{
    for (int P = 1; P <= MAX_P; P++) {
        check_world(P, false);
        check_world(P, true);
    }
}

TEST(a_communicator_of_some_workers_maps_its_ranks_to_theirs)
{
    /* the epoch's members are workers 1, 3 and 4 of 6: DISPATCH bodies carry worker ranks */
    const uint32_t members[3] = {1, 3, 4};
    check_world_in(3, true, 6, members);
    ep_err e;
    uint32_t owner[E] = {0};
    sn_config cfg = {.rank = 3,
                     .world_size = 6,
                     .comm_rank = 1,
                     .comm_size = 3,
                     .members = members,
                     .hidden = H,
                     .topk = K,
                     .n_experts = E,
                     .expert_owner = owner};
    fc_world *w = fc_world_new();
    tpc_comm *c = tpc_create(fc_ops(), w, &e);
    CHECK(sn_create(&cfg, &fd_ops, NULL, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "expert 0 is owned by rank 0, which is not in the communicator");
    cfg.comm_rank = 0;
    CHECK(sn_create(&cfg, &fd_ops, NULL, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "communicator rank 0 of 3 is not worker rank 3");
    tpc_destroy(&c);
    fc_world_free(&w);
}

/* ---- failures -------------------------------------------------------------------------------- */

TEST(a_dead_peer_fails_the_step_by_its_deadline_and_aborts)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, 3);
    wd.dead_rank = 2;
    wd.dead_from_step = 1;
    wd.timeout = 0.5;
    run_world(&wd, r);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(r[i].rc, -1);
        CHECK_EQ(r[i].failed_step, 1);
        CHECK_EQ(r[i].steps_done, 1);
        CHECK_EQ(r[i].code, EPMOE__ERROR_CODE__ERR_TIMEOUT);
        CHECK_STR_HAS(r[i].err.msg, "step 11: fake communicator of epoch 7.0");
        CHECK_STR_HAS(r[i].err.msg, "dispatch counts not done after");
        CHECK_EQ(r[i].state_after, TPC_ABORTED);
    }
    free_world(&wd, r);
}

TEST(counts_from_another_epoch_are_refused_naming_the_sender)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, 2);
    wd.epoch_rank = 1;
    wd.timeout = 0.5;
    run_world(&wd, r);
    /* rank 1 refuses rank 0's counts and rank 0 rank 1's: both see the other's epoch */
    CHECK_EQ(r[0].rc, -1);
    CHECK_EQ(r[0].code, EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    CHECK_STR_HAS(r[0].err.msg, "step 10: DISPATCH counts from rank 1 (w1): epoch 8, expected 7");
    CHECK_EQ(r[0].state_after, TPC_ABORTED);
    CHECK_STR_HAS(r[1].err.msg, "DISPATCH counts from rank 0 (w0): epoch 7, expected 8");
    free_world(&wd, r);
}

TEST(pairs_of_experts_the_receiver_does_not_own_are_refused)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, 3);
    wd.liar_rank = 0; /* sends expert e's pairs to the next rank */
    wd.timeout = 0.5;
    run_world(&wd, r);
    int refused = 0;
    for (int i = 1; i < 3; i++)
        if (strstr(r[i].err.msg, "DISPATCH from rank 0 (w0): pair_expert[") &&
            strstr(r[i].err.msg, "is not an expert of rank")) {
            refused++;
            CHECK_EQ(r[i].code, EPMOE__ERROR_CODE__ERR_STEP_FAILED);
        }
    CHECK(refused >= 1);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(r[i].rc, -1);
        CHECK_EQ(r[i].state_after, TPC_ABORTED);
    }
    free_world(&wd, r);
}

TEST(a_device_failure_fails_the_step_and_aborts)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, 2);
    wd.fail_rank = 1;
    wd.timeout = 0.5;
    run_world(&wd, r);
    CHECK_EQ(r[1].rc, -1);
    CHECK_EQ(r[1].code, EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    CHECK_STR_HAS(r[1].err.msg, "step 10: experts for rank");
    CHECK_STR_HAS(r[1].err.msg, "fake: injected device fault");
    CHECK_EQ(r[1].state_after, TPC_ABORTED); /* the driver's own abort */
    CHECK_EQ(r[0].rc, -1);                   /* left waiting for rank 1's combine */
    CHECK_EQ(r[0].code, EPMOE__ERROR_CODE__ERR_TIMEOUT);
    CHECK_STR_HAS(r[0].err.msg, "combine not done after");
    free_world(&wd, r);
}

TEST(the_owner_abandons_a_waiting_step)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, 2);
    wd.dead_rank = 1;
    wd.dead_from_step = 0;
    wd.interrupt_rank = 0;
    wd.timeout = 30; /* the interruption, not the deadline, ends it */
    run_world(&wd, r);
    CHECK_EQ(r[0].rc, -1);
    CHECK_EQ(r[0].code, EPMOE__ERROR_CODE__ERR_STEP_FAILED);
    CHECK_STR_HAS(r[0].err.msg, "dispatch counts abandoned: STEP_ABORT from the coordinator");
    CHECK_EQ(r[0].state_after, TPC_ABORTED);
    free_world(&wd, r);
}

TEST(a_step_on_an_aborted_communicator_fails_without_touching_the_device)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, 1);
    wd.steps = 0;
    run_world(&wd, r);
    tpc_abort(r[0].comm, "step 9: experts failed");
    int before = r[0].dev.step_begins;
    run_step(&r[0], 0);
    CHECK_EQ(r[0].rc, -1);
    CHECK_EQ(r[0].code, EPMOE__ERROR_CODE__ERR_COMM_FAILED);
    CHECK_STR_HAS(r[0].err.msg, "step 10: the nccl communicator is aborted after: step 9: experts "
                                "failed");
    CHECK_EQ(r[0].dev.step_begins, before);
    free_world(&wd, r);
}

TEST(bad_configurations_are_refused)
{
    ep_err e;
    uint32_t owner[E] = {0};
    owner[3] = 2;
    sn_config cfg = {
        .rank = 0, .world_size = 2, .hidden = H, .topk = K, .n_experts = E, .expert_owner = owner};
    fc_world *w = fc_world_new();
    tpc_comm *c = tpc_create(fc_ops(), w, &e);
    CHECK(sn_create(&cfg, &fd_ops, NULL, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "expert 3 owned by rank 2 of 2");
    owner[3] = 1;
    cfg.hidden = 200;
    CHECK(sn_create(&cfg, &fd_ops, NULL, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "H 200");
    cfg.hidden = H;
    CHECK(sn_create(&cfg, NULL, NULL, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "this build has no CUDA device operations");
    tpc_destroy(&c);
    fc_world_free(&w);
}

int main(void)
{
    RUN(outputs_match_the_direct_computation_for_one_to_four_ranks);
    RUN(a_communicator_of_some_workers_maps_its_ranks_to_theirs);
    RUN(a_dead_peer_fails_the_step_by_its_deadline_and_aborts);
    RUN(counts_from_another_epoch_are_refused_naming_the_sender);
    RUN(pairs_of_experts_the_receiver_does_not_own_are_refused);
    RUN(a_device_failure_fails_the_step_and_aborts);
    RUN(the_owner_abandons_a_waiting_step);
    RUN(a_step_on_an_aborted_communicator_fails_without_touching_the_device);
    RUN(bad_configurations_are_refused);
    return test_report();
}
