/*
 * test_planner.c — expert placement tables (coordinator/planner.h).
 *
 * Expected tables are written out by hand from the definitions: contiguous gives rank r the
 * range [r*E/P, (r+1)*E/P) (spec §1.4); round_robin gives expert e to rank e % P; the failover
 * rule (planner.h) gives each orphaned expert, in ascending id, to the eligible rank holding the
 * fewest at that moment (ties: lowest rank), up to max_per_rank. The epoch machinery's phases
 * are driven by hand: decided (pending), sent (applying), acknowledged (stable), blocked.
 */
#include "coordinator/planner.h"

#include "test.h"

static ep_err err;

/* A table of 3 layers (two main, one MTP) on one node. */
static plan_table *build(spec_placement p, int n_experts, int n_ranks, uint64_t epoch)
{
    plan_shape s;
    plan_shape_simple(p, 3, n_experts, n_ranks, &s);
    return plan_build(&s, epoch, &err);
}

/* Every layer: one replica per expert, owned as want[] says. */
static void check_owners(const plan_table *t, const int *want, int n)
{
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(t->n_experts, n);
    for (int l = 0; l < t->n_layers; l++)
        for (int e = 0; e < n; e++) {
            int k;
            const uint16_t *r = plan_replicas(t, l, e, &k);
            if (k != 1 || r[0] != want[e])
                TEST_FAIL_AT("layer %d expert %d: %d replicas, first on %d, expected rank %d", l, e,
                             k, r[0], want[e]);
        }
}

TEST(contiguous_16_experts_4_ranks)
{
    const int want[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    plan_table *t = build(SPEC_PLACE_CONTIGUOUS, 16, 4, 7);
    check_owners(t, want, 16);
    if (t == NULL)
        return;
    CHECK_EQ(t->n_ranks, 4);
    CHECK_EQ(t->epoch, 7);
    CHECK_EQ(t->placement, SPEC_PLACE_CONTIGUOUS);
    int out[16];
    CHECK_EQ(plan_rank_experts(t, 0, 2, out, 16), 4);
    CHECK_EQ(out[0], 8);
    CHECK_EQ(out[1], 9);
    CHECK_EQ(out[2], 10);
    CHECK_EQ(out[3], 11);
    plan_free(&t);
    CHECK(t == NULL);
    plan_free(&t);
    plan_free(NULL);
}

TEST(contiguous_v4_flash_256_experts_8_ranks)
{
    plan_table *t = build(SPEC_PLACE_CONTIGUOUS, 256, 8, 1);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    int out[256];
    /* the two-nodes example: b3 (rank 7) owns experts 224..255 */
    CHECK_EQ(plan_rank_experts(t, 0, 7, out, 256), 32);
    CHECK_EQ(out[0], 224);
    CHECK_EQ(out[31], 255);
    CHECK_EQ(plan_rank_experts(t, 0, 0, out, 256), 32);
    CHECK_EQ(out[0], 0);
    CHECK_EQ(out[31], 31);
    CHECK(plan_replicas(t, 2, 32, &(int){0})[0] == 1);
    CHECK(plan_replicas(t, 2, 31, &(int){0})[0] == 0);
    plan_free(&t);
}

TEST(round_robin_16_experts_4_ranks)
{
    const int want[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    plan_table *t = build(SPEC_PLACE_ROUND_ROBIN, 16, 4, 0);
    check_owners(t, want, 16);
    plan_free(&t);
}

TEST(round_robin_16_experts_3_ranks)
{
    const int want[16] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
    plan_table *t = build(SPEC_PLACE_ROUND_ROBIN, 16, 3, 0);
    check_owners(t, want, 16);
    if (t == NULL)
        return;
    const int r0[6] = {0, 3, 6, 9, 12, 15}, r1[5] = {1, 4, 7, 10, 13}, r2[5] = {2, 5, 8, 11, 14};
    int out[16];
    CHECK_EQ(plan_rank_experts(t, 0, 0, out, 16), 6);
    for (int i = 0; i < 6; i++)
        CHECK_EQ(out[i], r0[i]);
    CHECK_EQ(plan_rank_experts(t, 0, 1, out, 16), 5);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(out[i], r1[i]);
    CHECK_EQ(plan_rank_experts(t, 0, 2, out, 16), 5);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(out[i], r2[i]);
    plan_free(&t);
}

/* Over many shapes: the ranks' lists are ascending and together hold every expert once. */
TEST(every_expert_is_owned_exactly_once)
{
    static int out[MC_MAX_EXPERTS];
    static int hits[MC_MAX_EXPERTS];
    const int shapes[][2] = {{1, 1},   {16, 1},      {16, 16},   {16, 3}, {256, 8},
                             {256, 7}, {4096, 1024}, {255, 254}, {257, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int p = 0; p < 2; p++) {
            int e_n = shapes[s][0], p_n = shapes[s][1];
            spec_placement pl = p ? SPEC_PLACE_ROUND_ROBIN : SPEC_PLACE_CONTIGUOUS;
            if (pl == SPEC_PLACE_CONTIGUOUS && e_n % p_n != 0)
                continue;
            plan_table *t = build(pl, e_n, p_n, 0);
            CHECK(t != NULL);
            if (t == NULL)
                continue;
            memset(hits, 0, sizeof hits);
            int total = 0;
            for (int r = 0; r < p_n; r++) {
                int n = plan_rank_experts(t, 0, r, out, MC_MAX_EXPERTS);
                CHECK(n >= 1);
                if (pl == SPEC_PLACE_CONTIGUOUS)
                    CHECK_EQ(n, e_n / p_n);
                else
                    CHECK(n == e_n / p_n || n == e_n / p_n + 1);
                for (int i = 0; i < n; i++) {
                    if (i > 0 && out[i] <= out[i - 1])
                        TEST_FAIL_AT("E=%d P=%d rank %d: list not ascending", e_n, p_n, r);
                    hits[out[i]]++;
                }
                total += n;
            }
            CHECK_EQ(total, e_n);
            for (int e = 0; e < e_n; e++)
                if (hits[e] != 1)
                    TEST_FAIL_AT("E=%d P=%d %s: expert %d owned %d times", e_n, p_n,
                                 spec_placement_name(pl), e, hits[e]);
            plan_free(&t);
        }
    }
}

TEST(rank_experts_reports_the_count_beyond_cap)
{
    plan_table *t = build(SPEC_PLACE_CONTIGUOUS, 16, 2, 0);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    int out[4] = {-1, -1, -1, -1};
    CHECK_EQ(plan_rank_experts(t, 0, 1, out, 3), 8);
    CHECK_EQ(out[0], 8);
    CHECK_EQ(out[2], 10);
    CHECK_EQ(out[3], -1); /* nothing past cap */
    CHECK_EQ(plan_rank_experts(t, 0, 0, NULL, 0), 8);
    CHECK_EQ(plan_rank_experts(t, 0, 2, out, 4), -1);
    CHECK_EQ(plan_rank_experts(t, 0, -1, out, 4), -1);
    CHECK_EQ(plan_rank_experts(NULL, 0, 0, out, 4), -1);
    plan_free(&t);
}

TEST(bad_shapes_are_refused_with_the_rule)
{
    CHECK(build(SPEC_PLACE_CONTIGUOUS, 16, 0, 0) == NULL);
    CHECK_STR_HAS(err.msg, "placement: 0 ranks (expected 1..1024)");
    CHECK(build(SPEC_PLACE_ROUND_ROBIN, 16, -2, 0) == NULL);
    CHECK_STR_HAS(err.msg, "-2 ranks");
    CHECK(build(SPEC_PLACE_ROUND_ROBIN, 4096, EP_MAX_WORKERS + 1, 0) == NULL);
    CHECK_STR_HAS(err.msg, "1025 ranks (expected 1..1024)");
    CHECK(build(SPEC_PLACE_CONTIGUOUS, 16, 3, 0) == NULL);
    CHECK_STR_HAS(err.msg, "placement contiguous: 3 ranks do not divide 16 experts evenly");
    CHECK(build(SPEC_PLACE_ROUND_ROBIN, 4, 5, 0) == NULL);
    CHECK_STR_HAS(err.msg, "5 ranks are more than the 4 expert slots");
    CHECK(build(SPEC_PLACE_CONTIGUOUS, 4, 8, 0) == NULL);
    CHECK_STR_HAS(err.msg, "8 ranks are more than the 4 expert slots");
    CHECK(build(SPEC_PLACE_CONTIGUOUS, 0, 1, 0) == NULL);
    CHECK_STR_HAS(err.msg, "placement: 0 experts (expected 1..4096)");
    CHECK(build(SPEC_PLACE_ROUND_ROBIN, MC_MAX_EXPERTS + 1, 1, 0) == NULL);
    CHECK_STR_HAS(err.msg, "4097 experts");
    CHECK(build((spec_placement)7, 16, 4, 0) == NULL);
    CHECK_STR_HAS(err.msg, "unknown placement 7");
}

TEST(spread_keeps_the_survivors_and_evens_the_load)
{
    plan_table *t = build(SPEC_PLACE_CONTIGUOUS, 16, 4, 1);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    /* rank 1 (4..7) is lost: 4 -> 0, 5 -> 2, 6 -> 3 (each then holds 5), 7 -> 0 */
    const uint8_t el[4] = {1, 0, 1, 1};
    plan_table *s = plan_spread(t, el, 0, 2, &err);
    const int want[16] = {0, 0, 0, 0, 0, 2, 3, 0, 2, 2, 2, 2, 3, 3, 3, 3};
    check_owners(s, want, 16);
    if (s != NULL) {
        CHECK_EQ(s->epoch, 2);
        CHECK_EQ(s->n_members, 3);
        CHECK(!plan_is_member(s, 1) && plan_is_member(s, 0));
        CHECK(!plan_same(s, t));
    }
    /* everyone eligible again: nothing moves (spreading from the failover table) */
    const uint8_t all[4] = {1, 1, 1, 1};
    plan_table *u = s ? plan_spread(s, all, 0, 3, &err) : NULL;
    CHECK(u != NULL && plan_same(u, s));
    /* a limit of 5: 4 -> 0, 5 -> 2, 6 -> 3, 7 has nowhere to go */
    CHECK(plan_spread(t, el, 5, 2, &err) == NULL);
    CHECK_STR_HAS(err.msg, "3 workers can hold at most 15 of the 16 experts "
                           "(max_experts_per_worker 5)");
    const uint8_t none[4] = {0, 0, 0, 0};
    CHECK(plan_spread(t, none, 0, 2, &err) == NULL);
    CHECK_STR_HAS(err.msg, "no worker is left that can own experts");
    plan_free(&u);
    plan_free(&s);
    plan_free(&t);
}

TEST(epochs_move_through_their_phases)
{
    plan_table *base = build(SPEC_PLACE_CONTIGUOUS, 8, 4, 1);
    plan_epochs *pe = base ? plan_epochs_create(base, SPEC_REJOIN_RESTORE, 0, false, &err) : NULL;
    CHECK(pe != NULL);
    if (pe == NULL) {
        plan_free(&base);
        return;
    }
    const uint8_t lost2[4] = {1, 1, 0, 1}, all[4] = {1, 1, 1, 1};
    CHECK_EQ(plan_phase_of(pe), PLAN_FORMING);
    CHECK_EQ(plan_replan(pe, lost2, false, "x"), 0); /* forming: losses wait for the worker */
    plan_applied(pe);
    CHECK_EQ(plan_phase_of(pe), PLAN_STABLE);
    CHECK_EQ(plan_replan(pe, lost2, false, "rank 2 lost"), 1);
    CHECK_EQ(plan_phase_of(pe), PLAN_PENDING);
    CHECK_EQ(plan_latest(pe)->epoch, 1); /* not sent yet */
    CHECK_EQ(plan_replan(pe, lost2, false, "again"), 0);
    const plan_table *sent = plan_send(pe);
    CHECK_EQ(sent->epoch, 2);
    CHECK_EQ(plan_phase_of(pe), PLAN_APPLYING);
    CHECK_EQ(plan_current(pe)->epoch, 1);
    plan_applied(pe);
    CHECK_EQ(plan_phase_of(pe), PLAN_STABLE);
    CHECK_EQ(plan_current(pe)->epoch, 2);
    CHECK_STR_EQ(plan_why(pe), "rank 2 lost");
    /* restore from the spec's placement when rank 2 is back */
    CHECK_EQ(plan_replan(pe, all, true, "back"), 1);
    CHECK(plan_send(pe)->epoch == 3 && plan_same(plan_latest(pe), base));
    plan_applied(pe);
    /* a member that cannot load blocks; the next change decides a new epoch */
    CHECK_EQ(plan_replan(pe, lost2, false, "lost again"), 1);
    plan_send(pe);
    plan_block(pe, "worker a0 could not load");
    CHECK_EQ(plan_phase_of(pe), PLAN_BLOCKED);
    CHECK_STR_EQ(plan_problem(pe), "worker a0 could not load");
    CHECK_EQ(plan_replan(pe, lost2, false, "retry"), 1);
    CHECK_EQ(plan_last_epoch(pe), 5);
    CHECK_STR_EQ(plan_problem(pe), "");
    /* drains are remembered per rank */
    plan_set_drained(pe, 3, true);
    CHECK(plan_drained(pe, 3) && !plan_drained(pe, 2) && !plan_drained(pe, 99));
    plan_epochs_destroy(&pe);
    CHECK(pe == NULL);
    plan_free(&base);
}

/* eplb with E redundant slots and no load yet: every expert gets two replicas on distinct ranks,
 * each rank the same number of slots, and every layer the same table (stored once). */
TEST(eplb_initial_placement_replicates_every_expert)
{
    plan_shape sh;
    plan_shape_simple(SPEC_PLACE_EPLB, 4, 8, 4, &sh);
    sh.redundant = 8;
    plan_table *t = plan_build(&sh, 1, &err);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(pl_stored(t->pl), 1);
    CHECK_EQ(t->n_members, 4);
    int per_rank[4] = {0};
    for (int e = 0; e < 8; e++) {
        int n;
        const uint16_t *r = plan_replicas(t, 3, e, &n);
        CHECK_EQ(n, 2);
        CHECK(n == 2 && r[0] != r[1]);
        for (int i = 0; i < n; i++)
            per_rank[r[i]]++;
    }
    for (int r = 0; r < 4; r++)
        CHECK_EQ(per_rank[r], 4);
    CHECK_EQ(plan_rank_slots(t, 0), 4 * 4);
    CHECK_EQ(plan_rank_max(t, 0), 4);
    plan_free(&t);
    /* redundancy is eplb's alone, and a rank holds an expert once */
    plan_shape_simple(SPEC_PLACE_CONTIGUOUS, 2, 8, 4, &sh);
    sh.redundant = 4;
    CHECK(plan_build(&sh, 1, &err) == NULL);
    CHECK_STR_HAS(err.msg, "replicas are planned by eplb only");
    plan_shape_simple(SPEC_PLACE_EPLB, 2, 8, 4, &sh);
    sh.redundant = 25;
    CHECK(plan_build(&sh, 1, &err) == NULL);
    CHECK_STR_HAS(err.msg, "more than one replica of an expert");
}

/* With a replica of every expert elsewhere, losing a rank loads nothing: the survivors keep
 * what they hold and every expert still has a replica. */
TEST(spread_over_replicas_loads_nothing)
{
    plan_shape sh;
    plan_shape_simple(SPEC_PLACE_EPLB, 3, 8, 4, &sh);
    sh.redundant = 8;
    plan_table *t = plan_build(&sh, 1, &err);
    const uint8_t el[4] = {1, 1, 0, 1};
    plan_table *s = t ? plan_spread(t, el, 0, 2, &err) : NULL;
    CHECK(s != NULL);
    if (s != NULL) {
        CHECK_EQ(pl_gained(t->pl, s->pl), 0);
        CHECK(!plan_is_member(s, 2));
        for (int l = 0; l < 3; l++)
            for (int e = 0; e < 8; e++) {
                int n;
                const uint16_t *r = plan_replicas(s, l, e, &n);
                CHECK(n >= 1);
                for (int i = 0; i < n; i++)
                    CHECK(r[i] != 2);
            }
        /* two ranks lost: experts held only by them go to the least loaded survivor */
        const uint8_t two[4] = {1, 0, 0, 1};
        plan_table *u = plan_spread(t, two, 0, 3, &err);
        CHECK(u != NULL);
        for (int e = 0; u && e < 8; e++) {
            int n;
            plan_replicas(u, 0, e, &n);
            CHECK(n >= 1);
        }
        plan_free(&u);
    }
    plan_free(&s);
    plan_free(&t);
}

/* Layers are planned one by one: a failover keeps each layer's own table. Worked by hand: 4
 * experts on 3 ranks, layer 0 owned {0,0,1,2}, layer 1 {2,1,1,0}; rank 1 is lost. Layer 0:
 * ranks 0 and 2 keep 2 and 1 experts, so expert 2 goes to rank 2. Layer 1: both keep one,
 * expert 1 goes to rank 0 (the lower), expert 2 to rank 2 (rank 0 now holds two). */
TEST(spread_per_layer_tables)
{
    pl_builder *b = pl_builder_new(2, 4, 3, &err);
    const uint16_t c[4] = {1, 1, 1, 1}, r0[4] = {0, 0, 1, 2}, r1[4] = {2, 1, 1, 0};
    CHECK(b && pl_builder_set(b, 0, c, r0, &err) == 0 && pl_builder_set(b, 1, c, r1, &err) == 0);
    pl_table *pl = pl_builder_finish(&b, &err);
    plan_shape sh;
    plan_shape_simple(SPEC_PLACE_ROUND_ROBIN, 2, 4, 3, &sh);
    plan_table *t = pl ? plan_from_pl(&sh, &pl, 1, &err) : NULL;
    const uint8_t el[3] = {1, 0, 1};
    plan_table *s = t ? plan_spread(t, el, 0, 2, &err) : NULL;
    CHECK(s != NULL);
    if (s != NULL) {
        const int want[2][4] = {{0, 0, 2, 2}, {2, 0, 2, 0}};
        for (int l = 0; l < 2; l++)
            for (int e = 0; e < 4; e++) {
                int n;
                const uint16_t *r = plan_replicas(s, l, e, &n);
                if (n != 1 || r[0] != want[l][e])
                    TEST_FAIL_AT("layer %d expert %d on rank %d, expected %d", l, e, r[0],
                                 want[l][e]);
            }
    }
    plan_free(&s);
    plan_free(&t);
}

/* The load model: replicas share their expert's load evenly. By hand: layer 0 of contiguous 8
 * experts on 4 ranks with loads 8 0 1 1 2 2 1 1: ranks 8, 2, 4, 2 -> max/mean 8 / 4 = 2. */
TEST(layer_balance_by_hand)
{
    plan_table *t = build(SPEC_PLACE_CONTIGUOUS, 8, 4, 1);
    const double w[8] = {8, 0, 1, 1, 2, 2, 1, 1};
    double load[4];
    CHECK(t && plan_layer_balance(t, 0, w, load) == 2.0);
    CHECK(load[0] == 8 && load[1] == 2 && load[2] == 4 && load[3] == 2);
    const double zero[8] = {0};
    CHECK(t && plan_layer_balance(t, 0, zero, load) == 1.0);
    plan_free(&t);
}

/* A rebalance from skewed load: balance improves in the loaded layer, a layer without load keeps
 * its table, the moves are counted, and planning the same load again changes nothing. */
TEST(rebalance_from_load)
{
    plan_shape sh;
    plan_shape_simple(SPEC_PLACE_EPLB, 3, 8, 4, &sh);
    sh.redundant = 4; /* 12 slots, 3 a rank */
    plan_table *t = plan_build(&sh, 1, &err);
    double w[3 * 8] = {0};
    const double hot[8] = {40, 1, 1, 1, 30, 1, 1, 1}; /* layer 1 only */
    memcpy(w + 8, hot, sizeof hot);
    const uint8_t all[4] = {1, 1, 1, 1};
    plan_report rep;
    plan_table *r = t ? plan_rebalance(t, w, all, 0, 2, &rep, &err) : NULL;
    CHECK(r != NULL);
    if (r == NULL) {
        plan_free(&t);
        return;
    }
    double load[4];
    double before = plan_layer_balance(t, 1, hot, load),
           after = plan_layer_balance(r, 1, hot, load);
    printf("  layer 1: max/mean %.3f -> %.3f, %ld replicas moved\n", before, after, rep.moved);
    CHECK(after < before);
    CHECK(rep.balance_before == before && rep.balance_after == after);
    CHECK_EQ(rep.layer_before[0], 0); /* no load: not reported */
    CHECK(rep.moved == rep.layer_moved[1] && rep.moved > 0);
    CHECK_EQ(pl_gained(t->pl, r->pl), rep.moved);
    for (int e = 0; e < 8; e++) { /* layers 0 and 2 kept */
        int n0, n1;
        const uint16_t *a = plan_replicas(t, 0, e, &n0), *b = plan_replicas(r, 0, e, &n1);
        CHECK(n0 == n1 && memcmp(a, b, (size_t)n0 * 2) == 0);
    }
    int n;
    plan_replicas(r, 1, 0, &n);
    CHECK(n >= 2); /* the hottest expert got replicas */
    plan_report rep2;
    plan_table *again = plan_rebalance(r, w, all, 0, 3, &rep2, &err);
    CHECK(again != NULL && plan_same(again, r)); /* matched onto the ranks that hold it */
    plan_report_free(&rep2);
    plan_free(&again);
    plan_report_free(&rep);
    plan_free(&r);
    plan_free(&t);
}

/* A rebalance goes through staging: steps keep running in current, the commit makes it latest
 * (applying), and any replan meanwhile abandons it. */
TEST(staged_epochs)
{
    plan_table *base = build(SPEC_PLACE_CONTIGUOUS, 8, 4, 1);
    plan_epochs *pe = base ? plan_epochs_create(base, SPEC_REJOIN_RESTORE, 0, true, &err) : NULL;
    CHECK(pe != NULL);
    if (pe == NULL) {
        plan_free(&base);
        return;
    }
    plan_table *t = build(SPEC_PLACE_ROUND_ROBIN, 8, 4, 0);
    const plan_table *st = plan_stage(pe, &t, "rebalance");
    CHECK(st != NULL && t == NULL);
    CHECK_EQ(plan_phase_of(pe), PLAN_STAGING);
    CHECK_EQ(st->epoch, 2);
    CHECK(plan_staged(pe) == st && plan_current(pe)->epoch == 1 && plan_latest(pe)->epoch == 1);
    CHECK_STR_EQ(plan_phase_name(PLAN_STAGING), "staging");
    t = build(SPEC_PLACE_ROUND_ROBIN, 8, 4, 0);
    CHECK(plan_stage(pe, &t, "twice") == NULL && t == NULL); /* only from stable */
    const plan_table *c = plan_commit(pe);
    CHECK(c != NULL && c->epoch == 2 && plan_phase_of(pe) == PLAN_APPLYING);
    plan_applied(pe);
    CHECK(plan_phase_of(pe) == PLAN_STABLE && plan_current(pe)->epoch == 2);
    /* staged again, then a worker is lost: the staged epoch is dropped, a new one decided */
    t = build(SPEC_PLACE_CONTIGUOUS, 8, 4, 0);
    CHECK(plan_stage(pe, &t, "back") != NULL);
    const uint8_t lost[4] = {1, 1, 1, 0};
    CHECK_EQ(plan_replan(pe, lost, false, "rank 3 lost"), 1);
    CHECK(plan_staged(pe) == NULL && plan_phase_of(pe) == PLAN_PENDING);
    CHECK_EQ(plan_send(pe)->epoch, 4); /* 3 was the abandoned staged one */
    plan_applied(pe);
    t = build(SPEC_PLACE_CONTIGUOUS, 8, 4, 0);
    CHECK(plan_stage(pe, &t, "x") != NULL);
    plan_unstage(pe, "a worker could not load it");
    CHECK(plan_phase_of(pe) == PLAN_STABLE && plan_staged(pe) == NULL);
    plan_epochs_destroy(&pe);
    plan_free(&base);
}

int main(void)
{
    RUN(contiguous_16_experts_4_ranks);
    RUN(contiguous_v4_flash_256_experts_8_ranks);
    RUN(round_robin_16_experts_4_ranks);
    RUN(round_robin_16_experts_3_ranks);
    RUN(every_expert_is_owned_exactly_once);
    RUN(rank_experts_reports_the_count_beyond_cap);
    RUN(bad_shapes_are_refused_with_the_rule);
    RUN(spread_keeps_the_survivors_and_evens_the_load);
    RUN(epochs_move_through_their_phases);
    RUN(eplb_initial_placement_replicates_every_expert);
    RUN(spread_over_replicas_loads_nothing);
    RUN(spread_per_layer_tables);
    RUN(layer_balance_by_hand);
    RUN(rebalance_from_load);
    RUN(staged_epochs);
    return test_report();
}
