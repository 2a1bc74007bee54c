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

static void check_owners(const plan_table *t, const int *want, int n)
{
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(t->n_experts, n);
    for (int e = 0; e < n; e++)
        if (t->owner[e] != want[e])
            TEST_FAIL_AT("expert %d: owner %d, expected %d", e, t->owner[e], want[e]);
}

TEST(contiguous_16_experts_4_ranks)
{
    const int want[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    plan_table *t = plan_build(SPEC_PLACE_CONTIGUOUS, 16, 4, 7, &err);
    check_owners(t, want, 16);
    if (t == NULL)
        return;
    CHECK_EQ(t->n_ranks, 4);
    CHECK_EQ(t->epoch, 7);
    CHECK_EQ(t->placement, SPEC_PLACE_CONTIGUOUS);
    int out[16];
    CHECK_EQ(plan_rank_experts(t, 2, out, 16), 4);
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
    plan_table *t = plan_build(SPEC_PLACE_CONTIGUOUS, 256, 8, 1, &err);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    int out[256];
    /* the two-nodes example: b3 (rank 7) owns experts 224..255 */
    CHECK_EQ(plan_rank_experts(t, 7, out, 256), 32);
    CHECK_EQ(out[0], 224);
    CHECK_EQ(out[31], 255);
    CHECK_EQ(plan_rank_experts(t, 0, out, 256), 32);
    CHECK_EQ(out[0], 0);
    CHECK_EQ(out[31], 31);
    CHECK_EQ(t->owner[32], 1);
    CHECK_EQ(t->owner[31], 0);
    plan_free(&t);
}

TEST(round_robin_16_experts_4_ranks)
{
    const int want[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    plan_table *t = plan_build(SPEC_PLACE_ROUND_ROBIN, 16, 4, 0, &err);
    check_owners(t, want, 16);
    plan_free(&t);
}

TEST(round_robin_16_experts_3_ranks)
{
    const int want[16] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
    plan_table *t = plan_build(SPEC_PLACE_ROUND_ROBIN, 16, 3, 0, &err);
    check_owners(t, want, 16);
    if (t == NULL)
        return;
    const int r0[6] = {0, 3, 6, 9, 12, 15}, r1[5] = {1, 4, 7, 10, 13}, r2[5] = {2, 5, 8, 11, 14};
    int out[16];
    CHECK_EQ(plan_rank_experts(t, 0, out, 16), 6);
    for (int i = 0; i < 6; i++)
        CHECK_EQ(out[i], r0[i]);
    CHECK_EQ(plan_rank_experts(t, 1, out, 16), 5);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(out[i], r1[i]);
    CHECK_EQ(plan_rank_experts(t, 2, out, 16), 5);
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
            plan_table *t = plan_build(pl, e_n, p_n, 0, &err);
            CHECK(t != NULL);
            if (t == NULL)
                continue;
            memset(hits, 0, sizeof hits);
            int total = 0;
            for (int r = 0; r < p_n; r++) {
                int n = plan_rank_experts(t, r, out, MC_MAX_EXPERTS);
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
    plan_table *t = plan_build(SPEC_PLACE_CONTIGUOUS, 16, 2, 0, &err);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    int out[4] = {-1, -1, -1, -1};
    CHECK_EQ(plan_rank_experts(t, 1, out, 3), 8);
    CHECK_EQ(out[0], 8);
    CHECK_EQ(out[2], 10);
    CHECK_EQ(out[3], -1); /* nothing past cap */
    CHECK_EQ(plan_rank_experts(t, 0, NULL, 0), 8);
    CHECK_EQ(plan_rank_experts(t, 2, out, 4), -1);
    CHECK_EQ(plan_rank_experts(t, -1, out, 4), -1);
    CHECK_EQ(plan_rank_experts(NULL, 0, out, 4), -1);
    plan_free(&t);
}

TEST(bad_shapes_are_refused_with_the_rule)
{
    CHECK(plan_build(SPEC_PLACE_CONTIGUOUS, 16, 0, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "placement: 0 ranks (expected 1..1024)");
    CHECK(plan_build(SPEC_PLACE_ROUND_ROBIN, 16, -2, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "-2 ranks");
    CHECK(plan_build(SPEC_PLACE_ROUND_ROBIN, 4096, EP_MAX_WORKERS + 1, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "1025 ranks (expected 1..1024)");
    CHECK(plan_build(SPEC_PLACE_CONTIGUOUS, 16, 3, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "placement contiguous: 3 ranks do not divide 16 experts evenly");
    CHECK(plan_build(SPEC_PLACE_ROUND_ROBIN, 4, 5, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "5 ranks are more than the 4 experts");
    CHECK(plan_build(SPEC_PLACE_CONTIGUOUS, 4, 8, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "8 ranks are more than the 4 experts");
    CHECK(plan_build(SPEC_PLACE_CONTIGUOUS, 0, 1, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "placement: 0 experts (expected 1..4096)");
    CHECK(plan_build(SPEC_PLACE_ROUND_ROBIN, MC_MAX_EXPERTS + 1, 1, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "4097 experts");
    CHECK(plan_build((spec_placement)7, 16, 4, 0, &err) == NULL);
    CHECK_STR_HAS(err.msg, "unknown placement 7");
}

TEST(spread_keeps_the_survivors_and_evens_the_load)
{
    plan_table *t = plan_build(SPEC_PLACE_CONTIGUOUS, 16, 4, 1, &err);
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
    plan_table *base = plan_build(SPEC_PLACE_CONTIGUOUS, 8, 4, 1, &err);
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
    return test_report();
}
