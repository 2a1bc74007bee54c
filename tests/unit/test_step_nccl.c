/*
 * test_step_nccl.c — the NCCL plane's step driver (worker/step_nccl.h) on the CPU: P ranks are P
 * threads, the communicator library is tests/unit/fake_comm.c and the device the CPU backend's
 * device operations on host memory (kernels/moe_backend.h mb_dev_*), so every rank runs the real
 * routing, quantization, expert and combine math of a generated checkpoint's layer, holding
 * only the experts the placement gives it.
 *
 * Proves: for P = 1 .. 4, uneven token counts (0 included), e8m0 and f32 scales and several
 * steps, every token's routing and output equal those of the whole layer in one process
 * (mb_forward on a CPU backend holding every expert: an independent path through the seam), bit
 * for bit, so each row went to the rank owning each expert it selected, with its pairs in
 * order, and came back to its [token, slot]; per-expert counts and the data-plane byte counts
 * match a direct count from that routing. Failures: a dead peer (ERR_TIMEOUT by the deadline),
 * a peer with another epoch (its counts refused, naming it), a peer that sends pairs of experts
 * the receiver does not own (refused by tp_check_pairs), a device failure (a rank whose backend
 * lacks the experts it is told it owns) and an owner's interruption all fail the step with their
 * code and leave the communicator aborted; a step on an aborted communicator fails at once
 * without touching the device.
 */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "epmoe.pb-c.h"
#include "fake_comm.h"
#include "kernels/formats.h"
#include "moe_gen.h"
#include "shard/shard.h"
#include "test.h"
#include "worker/step_nccl.h"

#define MAX_P      4
#define H          256
#define SC         (H / 128)
#define K          3
#define E          12
#define LAYER      1 /* a score layer (layer 0 is the hash layer) */
#define EPOCH      7
#define WATCHDOG_S 30

/* ---- the checkpoint ------------------------------------------------------------------------ */

/* Two generated checkpoints: [0] act_ue8m0 off (f32 scales travel), [1] on (e8m0). */
typedef struct fixture {
    char dir[64];
    mc_config c;
    st_model *m;
} fixture;

static fixture fx[2];

static int fixture_make(fixture *f, bool ue8m0, int seed)
{
    ep_err err = {0};
    f->c = gen_config(MC_FP4, H, 128, E, K, 97);
    f->c.act_ue8m0 = ue8m0;
    gen_opts o = {.seed = (uint64_t)seed};
    gen_model *g = gen_model_create(&f->c, &o);
    snprintf(f->dir, sizeof f->dir, "/tmp/epmoe_step_nccl_XXXXXX");
    int rc = g && mkdtemp(f->dir) && gen_model_write(g, f->dir, &err) == 0 ? 0 : -1;
    gen_model_free(&g);
    if (rc == 0 && (f->m = st_model_open(f->dir, &err)) == NULL)
        rc = -1;
    if (rc)
        printf("  fixture: %s\n", err.msg);
    return rc;
}

static void fixture_free(fixture *f)
{
    st_model_close(&f->m);
    gen_model_remove(f->dir);
}

/* One thread's CPU backend and layer LAYER holding the experts want names (NULL: all). */
static mb_backend *backend_new(void)
{
    ep_err err = {0};
    mb_options o = {.device = "cpu", .threads = 1};
    mb_backend *be = mb_create(&o, &err);
    if (be == NULL)
        printf("  backend: %s\n", err.msg);
    return be;
}

static mb_layer *layer_new(mb_backend *be, const fixture *f, const uint8_t *want)
{
    ep_err err = {0};
    mb_layer *l = shard_load_layer(be, f->m, &f->c, LAYER, want, NULL, NULL, NULL, &err);
    if (l == NULL)
        printf("  layer: %s\n", err.msg);
    return l;
}

/* Hidden state h of the token numbered g: a spread of values, different for every token. */
static uint16_t x_of(int g, int h)
{
    uint32_t u = (uint32_t)g * 2654435761u ^ (uint32_t)h * 40503u;
    u ^= u >> 13;
    u *= 0x5bd1e995u;
    u ^= u >> 15;
    return fmt_f32_to_bf16(((float)(u % 4001) - 2000.0f) / 500.0f);
}

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
    const fixture *f; /* fx[e8m0] */
    int steps;
    int tokens[MAX_P]; /* per rank and step: tokens[rank] + step */
    /* injections */
    int dead_rank, dead_from_step;
    int epoch_rank;     /* this rank runs at epoch EPOCH + 1 */
    int liar_rank;      /* this rank believes expert e belongs to (owner[e] + 1) % P */
    int fail_rank;      /* this rank's backend lacks the experts it owns: its experts fail */
    int interrupt_rank; /* this rank's idle function gives up */
    double timeout;
} world;

typedef struct rank_ctx {
    world *wd;
    int rank;
    mb_backend *be, *ref_be; /* ref: the whole layer, for the expected outputs */
    mb_layer *layer, *ref;
    bool touched; /* the last step wrote routing results */
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

/* Values of the step that differ from the whole layer's in one process. */
static int check_outputs(rank_ctx *r, int T, const uint16_t *x, const uint16_t *out,
                         const int32_t *ids, const float *w)
{
    uint16_t *want = malloc((size_t)T * H * 2 + 1);
    int32_t *want_ids = malloc((size_t)T * K * 4 + 1);
    float *want_w = malloc((size_t)T * K * 4 + 1);
    ep_err err = {0};
    int bad = T;
    if (want && want_ids && want_w &&
        mb_forward(r->ref_be, r->ref, T, x, NULL, want, want_ids, want_w, &err) == 0) {
        bad = 0;
        for (size_t i = 0; i < (size_t)T * H; i++)
            bad += out[i] != want[i];
        for (size_t i = 0; i < (size_t)T * K; i++)
            bad += ids[i] != want_ids[i] || memcmp(&w[i], &want_w[i], 4) != 0;
    } else {
        printf("  reference: %s\n", err.msg);
    }
    free(want);
    free(want_ids);
    free(want_w);
    return bad;
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
    for (int i = 0; i < T * K; i++)
        ids[i] = -2; /* no expert: tells whether routing ran */
    sn_step io = {.step_id = (uint64_t)(10 + step),
                  .layer = r->layer,
                  .layer_index = LAYER,
                  .T = T,
                  .x = x,
                  .topk_ids = ids,
                  .topk_w = w,
                  .out = out,
                  .expert_tokens = r->expert_tokens,
                  .deadline = clk_mono_ms() + (int64_t)(wd->timeout * 1000),
                  .idle = r->rank == wd->interrupt_rank ? idle_give_up : NULL,
                  .idle_ctx = r};
    r->rc = sn_run(r->drv, &io, &r->code, &r->err);
    r->touched = false;
    for (int i = 0; i < T * K; i++)
        r->touched |= ids[i] != -2;
    if (r->rc == 0) {
        r->steps_done++;
        r->dispatch_bytes += io.dispatch_bytes;
        r->bad_outputs += check_outputs(r, T, x, out, ids, w);
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
    r->comm = tpc_create(fc_ops(), wd->w, &err);
    if (r->rank == 0)
        tpc_new_id(r->comm, &wd->id, &err);
    pthread_barrier_wait(&wd->bar);
    tpc_begin_init(r->comm, EPOCH, 0, r->rank, wd->P, &wd->id, &err);
    if (tpc_wait_ready(r->comm, clk_mono_ms() + 10000, NULL, NULL, &r->err) != 0) {
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
    r->drv = sn_create(&cfg, r->be, r->comm, &r->err);
    for (int step = 0; step < wd->steps && r->drv && r->rc == 0; step++) {
        if (r->rank == wd->dead_rank && step >= wd->dead_from_step)
            break;
        run_step(r, step);
    }
    r->state_after = tpc_get_state(r->comm);
    return NULL;
}

/* Rank i's backend with the experts the placement gives it (none on the failing rank), and the
 * whole layer for its expected outputs; loaded here, one at a time, before the threads start. */
static void rank_load(world *wd, rank_ctx *r)
{
    uint8_t want[E];
    for (int e = 0; e < E; e++)
        want[e] = r->rank != wd->fail_rank && wd->owner[e] == wd->member[r->rank];
    r->be = backend_new();
    r->ref_be = backend_new();
    r->layer = r->be ? layer_new(r->be, wd->f, want) : NULL;
    r->ref = r->ref_be ? layer_new(r->ref_be, wd->f, NULL) : NULL;
    if (r->layer == NULL || r->ref == NULL)
        r->rc = -1;
}

static void run_world(world *wd, rank_ctx *r)
{
    pthread_t t[MAX_P];
    pthread_barrier_init(&wd->bar, NULL, (unsigned)wd->P);
    for (int i = 0; i < wd->P; i++) {
        r[i] = (rank_ctx){.wd = wd, .rank = i};
        rank_load(wd, &r[i]);
    }
    for (int i = 0; i < wd->P; i++)
        pthread_create(&t[i], NULL, rank_main, &r[i]);
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
        mb_layer_free(&r[i].layer);
        mb_layer_free(&r[i].ref);
        mb_destroy(&r[i].be);
        mb_destroy(&r[i].ref_be);
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
                  .f = &fx[0],
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

/* The routing of rank src's tokens in step (the whole layer's, on ref's backend), counted: pairs
 * per expert, and the payload bytes src sends to other ranks. */
static void count_traffic(const world *wd, rank_ctx *ref, int src, int step, uint32_t *tokens,
                          uint64_t *bytes)
{
    int T = rank_tokens(wd, src, step);
    uint16_t *x = malloc((size_t)T * H * 2 + 1), *out = malloc((size_t)T * H * 2 + 1);
    int32_t *ids = malloc((size_t)T * K * 4 + 1);
    float *w = malloc((size_t)T * K * 4 + 1);
    ep_err err = {0};
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            x[(size_t)t * H + h] = x_of(token_g(src, step, t), h);
    CHECK_EQ(mb_forward(ref->ref_be, ref->ref, T, x, NULL, out, ids, w, &err), 0);
    int rows[MAX_P] = {0}, pairs[MAX_P] = {0};
    for (int t = 0; t < T; t++) {
        int seen[MAX_P] = {0};
        for (int j = 0; j < K; j++) {
            int e = ids[t * K + j];
            if (e < 0)
                continue;
            int dst = 0;
            while (wd->member[dst] != wd->owner[e])
                dst++;
            tokens[e]++;
            pairs[dst]++;
            rows[dst] += !seen[dst];
            seen[dst] = 1;
        }
    }
    for (int dst = 0; dst < wd->P; dst++)
        if (dst != src)
            bytes[src] +=
                (uint64_t)rows[dst] * (H + SC * (wd->e8m0 ? 1 : 4)) + (uint64_t)pairs[dst] * 12;
    free(x);
    free(out);
    free(ids);
    free(w);
}

/* members: the worker ranks of the communicator's ranks in a session of session_world ranks
 * (NULL: the communicator is the session) */
static void check_world_in(int P, bool e8m0, int session_world, const uint32_t *members)
{
    world wd;
    rank_ctx r[MAX_P];
    world_init(&wd, P);
    wd.e8m0 = e8m0;
    wd.f = &fx[e8m0];
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
        for (int step = 0; step < wd.steps; step++)
            count_traffic(&wd, &r[0], src, step, want_tokens, want_bytes);
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
    mb_backend *be = backend_new();
    CHECK(sn_create(&cfg, be, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "expert 0 is owned by rank 0, which is not in the communicator");
    cfg.comm_rank = 0;
    CHECK(sn_create(&cfg, be, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "communicator rank 0 of 3 is not worker rank 3");
    mb_destroy(&be);
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
    CHECK_STR_HAS(r[1].err.msg, "is not loaded here"); /* the backend refuses: a device fault */
    CHECK_EQ(r[1].state_after, TPC_ABORTED);           /* the driver's own abort */
    CHECK_EQ(r[0].rc, -1);                             /* left waiting for rank 1's combine */
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
    run_step(&r[0], 0);
    CHECK_EQ(r[0].rc, -1);
    CHECK_EQ(r[0].code, EPMOE__ERROR_CODE__ERR_COMM_FAILED);
    CHECK_STR_HAS(r[0].err.msg, "step 10: the nccl communicator is aborted after: step 9: experts "
                                "failed");
    CHECK(!r[0].touched); /* routing never ran */
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
    mb_backend *be = backend_new();
    CHECK(sn_create(&cfg, be, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "expert 3 owned by rank 2 of 2");
    owner[3] = 1;
    cfg.hidden = 200;
    CHECK(sn_create(&cfg, be, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "H 200");
    cfg.hidden = H;
    CHECK(sn_create(&cfg, NULL, c, &e) == NULL);
    CHECK_STR_HAS(e.msg, "nccl step: no backend");
    mb_destroy(&be);
    tpc_destroy(&c);
    fc_world_free(&w);
}

int main(void)
{
    if (fixture_make(&fx[0], false, 41) != 0 || fixture_make(&fx[1], true, 43) != 0) {
        printf("FAIL: cannot make the checkpoints\n");
        return 1;
    }
    RUN(outputs_match_the_direct_computation_for_one_to_four_ranks);
    RUN(a_communicator_of_some_workers_maps_its_ranks_to_theirs);
    RUN(a_dead_peer_fails_the_step_by_its_deadline_and_aborts);
    RUN(counts_from_another_epoch_are_refused_naming_the_sender);
    RUN(pairs_of_experts_the_receiver_does_not_own_are_refused);
    RUN(a_device_failure_fails_the_step_and_aborts);
    RUN(the_owner_abandons_a_waiting_step);
    RUN(a_step_on_an_aborted_communicator_fails_without_touching_the_device);
    RUN(bad_configurations_are_refused);
    fixture_free(&fx[0]);
    fixture_free(&fx[1]);
    return test_report();
}
