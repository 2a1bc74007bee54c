/*
 * test_plan.c — the dispatch plan (worker/plan.h) and the serving path's batching.
 *
 * The plan is checked against the replica rule written out here from docs/protocol.md (the
 * i-th pair of expert e in a set, counted in slot order, goes to replica (origin + i) mod n),
 * independently of pl_pick; skipping ranks that may not compute takes the next replica in
 * order. Batching: the serving path runs DISPATCHes of several origins for one layer as one
 * mb_experts call, and the shared expert of the requests of a layer as one mb_steps_shared
 * call; that must give every pair and every token the bits it gets alone (mb_forward of its
 * request), whatever the mix.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model_config.h"
#include "common/placement.h"
#include "common/safetensors_model.h"
#include "kernels/formats.h"
#include "kernels/moe_backend.h"
#include "moe_gen.h"
#include "test.h"
#include "worker/plan.h"
#include "shard/shard.h"

/* A 2-layer table of E experts over P ranks: layer 0 one owner each, layer 1 with replicas. */
static pl_table *make_table(int E, int P, uint64_t *rs)
{
    ep_err err;
    pl_builder *b = pl_builder_new(2, E, P, &err);
    uint16_t count[64], ranks[64 * 8];
    int n = 0;
    for (int e = 0; e < E; e++) {
        count[e] = 1;
        ranks[n++] = (uint16_t)(e % P);
    }
    pl_builder_set(b, 0, count, ranks, &err);
    n = 0;
    for (int e = 0; e < E; e++) {
        count[e] = (uint16_t)(1 + gen_rand(rs) % 3);
        int first = (int)(gen_rand(rs) % (uint64_t)P);
        for (int j = 0; j < count[e]; j++)
            ranks[n++] = (uint16_t)((first + j) % P);
    }
    pl_builder_set(b, 1, count, ranks, &err);
    return pl_builder_finish(&b, &err);
}

/* The rule, written out: replicas sorted ascending (pl_replicas' order). */
static int rule(const pl_table *t, int layer, int e, int origin, int i, const uint8_t *ok)
{
    int n;
    const uint16_t *r = pl_replicas(t, layer, e, &n);
    int at = (origin + i) % n;
    for (int d = 0; d < n; d++) {
        int rank = r[(at + d) % n];
        if (ok == NULL || ok[rank])
            return rank;
    }
    return -2;
}

TEST(route_follows_the_replica_rule_and_skips_ranks_that_may_not_compute)
{
    uint64_t rs = 5;
    const int E = 16, P = 5, T = 37, k = 4;
    pl_table *t = make_table(E, P, &rs);
    CHECK(t != NULL);
    int32_t ids[T * k];
    for (int i = 0; i < T * k; i++)
        ids[i] = i % 11 == 3 ? -1 : (int32_t)(gen_rand(&rs) % E);
    uint8_t ok[P];
    memset(ok, 1, sizeof ok);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            ok[2] = 0;
        for (int layer = 0; layer < 2; layer++)
            for (int origin = 0; origin < P; origin++) {
                int dest[T * k], seen[E];
                uint32_t pairs[E];
                memset(seen, 0, sizeof seen);
                memset(pairs, 0, sizeof pairs);
                dp_route(t, layer, origin, ids, NULL, T * k, ok, dest, pairs);
                int bad = 0;
                for (int i = 0; i < T * k; i++) {
                    int want = ids[i] < 0 ? -1 : rule(t, layer, ids[i], origin, seen[ids[i]]++, ok);
                    bad += dest[i] != want;
                }
                CHECK_EQ(bad, 0);
                for (int e = 0; e < E; e++)
                    CHECK_EQ((int)pairs[e], seen[e]);
            }
    }
    /* a subset (a replay): the count restarts over the subset's pairs */
    uint32_t sub[] = {1, 5, 9, 30, 31, 77};
    int dest[6], seen[E];
    memset(seen, 0, sizeof seen);
    dp_route(t, 1, 3, ids, sub, 6, NULL, dest, NULL);
    for (int i = 0; i < 6; i++) {
        int e = ids[sub[i]];
        CHECK_EQ(dest[i], e < 0 ? -1 : rule(t, 1, e, 3, seen[e]++, NULL));
    }
    pl_free(&t);
}

TEST(group_lists_each_slot_once_in_wire_order)
{
    const int P = 4, k = 3, n = 30;
    int dest[n];
    for (int i = 0; i < n; i++)
        dest[i] = i % 7 == 0 ? -1 : (i * 5 / 3) % P;
    dp_plan p;
    ep_err err;
    CHECK_EQ(dp_group(&p, P, k, NULL, dest, n, &err), 0);
    int total = 0;
    for (int r = 0; r < P; r++) {
        int rows = 0, last = -1;
        for (int j = 0; j < p.count[r]; j++) {
            uint32_t s = p.slot[r][j];
            CHECK_EQ(dest[s], r);
            if (j > 0)
                CHECK(s > p.slot[r][j - 1]);
            rows += (int)(s / k) != last;
            last = (int)(s / k);
        }
        CHECK_EQ(p.rows[r], rows);
        CHECK_EQ(dp_rows(p.slot[r], p.count[r], k), rows);
        total += p.count[r];
    }
    int want = 0;
    for (int i = 0; i < n; i++)
        want += dest[i] >= 0;
    CHECK_EQ(total, want);
    dp_plan_free(&p);
}

/* A generated model of config c on disk, its layer 1 loaded whole on a 2-thread CPU backend. */
typedef struct fixture {
    mc_config c;
    char dir[64];
    gen_model *g;
    st_model *m;
    mb_backend *be;
    mb_layer *l;
} fixture;

static bool fixture_open(fixture *f, mc_config c, uint64_t seed)
{
    ep_err err = {{0}};
    *f = (fixture){.c = c};
    snprintf(f->dir, sizeof f->dir, "/tmp/epmoe_test_plan_XXXXXX");
    CHECK_EQ(mc_validate(&f->c, &err), 0);
    gen_opts o = {.seed = seed};
    f->g = gen_model_create(&f->c, &o);
    if (!mkdtemp(f->dir) || gen_model_write(f->g, f->dir, &err) < 0 ||
        !(f->m = st_model_open(f->dir, &err))) {
        TEST_FAIL_AT("checkpoint: %s", err.msg);
        return false;
    }
    mb_options bo = {.device = "cpu", .threads = 2};
    f->be = mb_create(&bo, &err);
    f->l = f->be ? shard_load_layer(f->be, f->m, &f->c, 1, NULL, NULL, NULL, NULL, &err) : NULL;
    CHECK(f->l != NULL);
    return f->l != NULL;
}

static void fixture_close(fixture *f)
{
    mb_layer_free(&f->l);
    mb_destroy(&f->be);
    st_model_close(&f->m);
    if (f->g)
        gen_model_remove(f->dir);
    gen_model_free(&f->g);
}

/* Rows, pairs and outputs of one job. */
typedef struct job {
    int R, n;
    uint8_t *q;
    float *qs;
    uint32_t row[64], ex[64];
    float w[64];
    uint16_t *out;
} job;

TEST(experts_of_several_jobs_in_one_call_give_each_pair_its_own_bits)
{
    fixture f;
    if (!fixture_open(&f, gen_config(MC_FP4, 256, 256, 12, 6, 1000), 21)) {
        fixture_close(&f);
        return;
    }
    mc_config c = f.c;
    mb_backend *be = f.be;
    mb_layer *l = f.l;
    ep_err err = {{0}};
    int H = c.hidden_size, SC = H / 128;
    uint64_t rs = 77;
    job jobs[5];
    int totR = 0, totN = 0;
    for (int j = 0; l && j < 5; j++) {
        job *b = &jobs[j];
        b->R = 1 + (int)(gen_rand(&rs) % 9);
        b->n = b->R + (int)(gen_rand(&rs) % (uint64_t)(b->R * 5));
        uint16_t *x = malloc((size_t)b->R * H * 2);
        for (int i = 0; i < b->R * H; i++)
            x[i] = fmt_f32_to_bf16((float)(2.0 * gen_unit(&rs) * (i % 97 == 1 ? 40 : 1)));
        b->q = malloc((size_t)b->R * H);
        b->qs = malloc((size_t)b->R * SC * 4);
        CHECK_EQ(mb_quant(be, l, b->R, x, b->q, b->qs, &err), 0);
        free(x);
        for (int p = 0; p < b->n; p++) {
            b->row[p] = (uint32_t)(gen_rand(&rs) % (uint64_t)b->R);
            b->ex[p] = (uint32_t)(gen_rand(&rs) % 12);
            b->w[p] = (float)(0.1 + 0.5 * (gen_unit(&rs) + 1));
        }
        b->out = malloc((size_t)b->n * H * 2);
        CHECK_EQ(mb_experts(be, l, b->R, b->q, b->qs, b->n, b->row, b->ex, b->w, b->out, &err), 0);
        totR += b->R;
        totN += b->n;
    }
    /* every job at once, rows concatenated as srv_run_layer does */
    uint8_t *q = malloc((size_t)totR * H);
    float *qs = malloc((size_t)totR * SC * 4);
    uint32_t *row = malloc((size_t)totN * 4), *ex = malloc((size_t)totN * 4);
    float *w = malloc((size_t)totN * 4);
    uint16_t *out = malloc((size_t)totN * H * 2);
    int r0 = 0, p0 = 0;
    for (int j = 0; l && j < 5; j++) {
        job *b = &jobs[j];
        memcpy(q + (size_t)r0 * H, b->q, (size_t)b->R * H);
        memcpy(qs + (size_t)r0 * SC, b->qs, (size_t)b->R * SC * 4);
        for (int p = 0; p < b->n; p++) {
            row[p0 + p] = b->row[p] + (uint32_t)r0;
            ex[p0 + p] = b->ex[p];
            w[p0 + p] = b->w[p];
        }
        r0 += b->R;
        p0 += b->n;
    }
    if (l) {
        CHECK_EQ(mb_experts(be, l, totR, q, qs, totN, row, ex, w, out, &err), 0);
        p0 = 0;
        for (int j = 0; j < 5; j++) {
            CHECK(memcmp(out + (size_t)p0 * H, jobs[j].out, (size_t)jobs[j].n * H * 2) == 0);
            p0 += jobs[j].n;
        }
    }
    for (int j = 0; l && j < 5; j++)
        free(jobs[j].q), free(jobs[j].qs), free(jobs[j].out);
    free(q), free(qs), free(row), free(ex), free(w), free(out);
    fixture_close(&f);
}

/* Steps of random sizes, their routed pairs by mb_experts, their shared expert batched (one
 * step's done alone first, as srv_shared meets it): each step's output is mb_forward's. */
TEST(shared_expert_of_several_steps_in_one_call_gives_each_step_its_own_bits)
{
    fixture f;
    if (!fixture_open(&f, gen_config(MC_FP8, 256, 256, 12, 4, 1000), 23)) {
        fixture_close(&f);
        return;
    }
    mc_config c = f.c;
    mb_backend *be = f.be;
    mb_layer *l = f.l;
    ep_err err = {{0}};
    enum { NS = 5 };
    size_t H = (size_t)c.hidden_size, SC = H / 128, k = (size_t)c.num_experts_per_tok;
    uint64_t rs = 91;
    mb_step *st[NS] = {0};
    uint16_t *x[NS], *want[NS], *eo[NS];
    uint8_t *q[NS];
    float *qs[NS], *tw[NS];
    int32_t *ti[NS];
    int T[NS];
    for (int j = 0; l && j < NS; j++) {
        T[j] = 1 + (int)(gen_rand(&rs) % 9);
        size_t n = (size_t)T[j];
        x[j] = malloc(n * H * 2), want[j] = malloc(n * H * 2), eo[j] = malloc(n * k * H * 2);
        q[j] = malloc(n * H), qs[j] = malloc(n * SC * 4);
        tw[j] = malloc(n * k * 4), ti[j] = malloc(n * k * 4);
        for (size_t i = 0; i < n * H; i++)
            x[j][i] = fmt_f32_to_bf16((float)(gen_unit(&rs) * (i % 89 == 3 ? 30 : 1)));
        CHECK_EQ(mb_forward(be, l, T[j], x[j], NULL, want[j], ti[j], tw[j], &err), 0);
        st[j] = mb_step_begin(be, l, T[j], x[j], NULL, ti[j], tw[j], q[j], qs[j], NULL, &err);
        CHECK(st[j] != NULL);
        uint32_t row[9 * MC_MAX_TOPK], ex[9 * MC_MAX_TOPK];
        for (size_t p = 0; p < n * k; p++)
            row[p] = (uint32_t)(p / k), ex[p] = (uint32_t)ti[j][p];
        CHECK_EQ(mb_experts(be, l, T[j], q[j], qs[j], (int)(n * k), row, ex, tw[j], eo[j], &err),
                 0);
    }
    if (l) {
        CHECK_EQ(mb_step_shared(st[2], &err), 0);
        CHECK_EQ(mb_steps_shared(st, NS, &err), 0);
    }
    for (int j = 0; l && j < NS; j++) {
        uint16_t *out = malloc((size_t)T[j] * H * 2);
        CHECK_EQ(mb_step_finish(st[j], eo[j], out, &err), 0);
        CHECK(memcmp(out, want[j], (size_t)T[j] * H * 2) == 0);
        free(out);
        mb_step_free(&st[j]);
        free(x[j]), free(want[j]), free(eo[j]), free(q[j]), free(qs[j]), free(tw[j]), free(ti[j]);
    }
    fixture_close(&f);
}

int main(void)
{
    RUN(route_follows_the_replica_rule_and_skips_ranks_that_may_not_compute);
    RUN(group_lists_each_slot_once_in_wire_order);
    RUN(experts_of_several_jobs_in_one_call_give_each_pair_its_own_bits);
    RUN(shared_expert_of_several_steps_in_one_call_gives_each_step_its_own_bits);
    return test_report();
}
