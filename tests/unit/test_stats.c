/*
 * test_stats.c — the coordinator's load window (coordinator/stats.h): sums follow steps in and
 * out of the window, rank loads count only the current epoch, the measured balance by hand.
 */
#include "coordinator/stats.h"

#include "test.h"

static ep_err err;

TEST(window_slides_and_epochs_reset_rank_loads)
{
    /* 2 layers, 4 experts, 2 ranks, a window of 3 steps */
    stats_window *s = stats_create(2, 4, 2, 3, &err);
    CHECK(s != NULL);
    if (s == NULL)
        return;
    stats_epoch(s, 1);
    const uint32_t e1[4] = {5, 0, 1, 0}, r1[2] = {4, 2};
    const uint32_t e2[4] = {0, 2, 0, 2}, r2[2] = {1, 3};
    CHECK_EQ(stats_add(s, 0, 1, e1, r1), 0);
    CHECK_EQ(stats_add(s, 0, 1, e2, r2), 0);
    CHECK_EQ(stats_add(s, 1, 1, e1, r1), 0);
    CHECK_EQ(stats_steps(s), 3);
    CHECK_EQ(stats_layer_steps(s, 0), 2);
    const uint64_t *ec = stats_expert_counts(s, 0), *rc = stats_rank_counts(s, 0);
    CHECK(ec[0] == 5 && ec[1] == 2 && ec[2] == 1 && ec[3] == 2);
    CHECK(rc[0] == 5 && rc[1] == 5);
    const uint8_t both[2] = {1, 1};
    CHECK(stats_measured_balance(s, 0, both) == 1.0);       /* 5 and 5 */
    CHECK(stats_measured_balance(s, 1, both) == 4.0 / 3.0); /* 4 and 2: max 4 / mean 3 */
    /* a fourth step pushes the first out */
    CHECK_EQ(stats_add(s, 0, 1, e2, r2), 0);
    CHECK_EQ(stats_steps(s), 3);
    CHECK(ec[0] == 0 && ec[1] == 4 && ec[3] == 4);
    CHECK(rc[0] == 2 && rc[1] == 6);
    double w[8];
    stats_weights(s, w);
    CHECK(w[1] == 4 && w[4] == 5 && w[6] == 1);
    /* a new epoch: rank loads start over, expert counts stay */
    stats_epoch(s, 2);
    CHECK(rc[0] == 0 && rc[1] == 0 && ec[1] == 4);
    CHECK(stats_measured_balance(s, 0, both) == 0);
    CHECK_EQ(stats_add(s, 0, 2, e1, r1), 0); /* evicts an epoch-1 entry: rank sums untouched */
    CHECK(rc[0] == 4 && rc[1] == 2);
    const uint8_t one[2] = {1, 0};
    CHECK(stats_measured_balance(s, 0, one) == 1.0);
    CHECK_EQ(stats_add(s, 5, 2, e1, r1), -1);
    stats_destroy(&s);
    CHECK(s == NULL);
}

int main(void)
{
    RUN(window_slides_and_epochs_reset_rank_loads);
    return test_report();
}
