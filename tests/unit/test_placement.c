/*
 * test_placement.c — placement tables (common/placement.h): building, identical layers stored
 * once, queries, the wire form (round trip and every refusal), and the replica rule.
 */
#include "common/placement.h"

#include "test.h"

static ep_err err;

/* 3 layers, 4 experts, 3 ranks: layers 0 and 2 equal, layer 1 with replicas. */
static pl_table *sample(void)
{
    pl_builder *b = pl_builder_new(3, 4, 3, &err);
    const uint16_t c0[4] = {1, 1, 1, 1}, r0[4] = {0, 0, 1, 2};
    const uint16_t c1[4] = {2, 1, 3, 1}, r1[7] = {2, 0, 1, 2, 1, 0, 0};
    if (b == NULL || pl_builder_set(b, 0, c0, r0, &err) || pl_builder_set(b, 1, c1, r1, &err) ||
        pl_builder_set(b, 2, c0, r0, &err)) {
        pl_builder_free(&b);
        return NULL;
    }
    return pl_builder_finish(&b, &err);
}

TEST(build_and_query)
{
    pl_table *t = sample();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(pl_stored(t), 2); /* layers 0 and 2 share one table */
    int n;
    const uint16_t *r = pl_replicas(t, 1, 0, &n);
    CHECK_EQ(n, 2);
    CHECK_EQ(r[0], 0); /* sorted: given as 2, 0 */
    CHECK_EQ(r[1], 2);
    r = pl_replicas(t, 1, 2, &n);
    CHECK_EQ(n, 3);
    CHECK(pl_holds(t, 1, 2, 0) && pl_holds(t, 1, 2, 1) && pl_holds(t, 1, 2, 2));
    CHECK(pl_holds(t, 2, 1, 0) && !pl_holds(t, 2, 1, 1));
    int out[4];
    CHECK_EQ(pl_rank_experts(t, 1, 0, out, 4), 3); /* e0, e2, e3 */
    CHECK_EQ(out[0], 0);
    CHECK_EQ(out[1], 2);
    CHECK_EQ(out[2], 3);
    CHECK_EQ(pl_rank_experts(t, 0, 0, out, 4), 2);
    CHECK_EQ(pl_rank_slots(t, 0), 2 + 3 + 2);
    CHECK_EQ(pl_rank_max(t, 0), 3);
    CHECK_EQ(pl_total_slots(t), 4 + 7 + 4);
    uint8_t m[3];
    CHECK_EQ(pl_members(t, m), 3);
    uint32_t owner[4];
    CHECK(!pl_flat_owner(t, owner));
    pl_table *c = pl_copy(t);
    CHECK(c && pl_same(t, c));
    CHECK_EQ(pl_gained(t, c), 0);
    pl_free(&c);
    pl_free(&t);
    CHECK(t == NULL);
}

TEST(flat_tables)
{
    const uint32_t owner[4] = {0, 0, 1, 1};
    pl_table *t = pl_flat(5, 4, 2, owner, &err);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    uint32_t o[4];
    CHECK(pl_flat_owner(t, o));
    CHECK_EQ(o[3], 1);
    CHECK_EQ(pl_stored(t), 1);
    CHECK_EQ(pl_rank_slots(t, 1), 10);
    pl_table *s = sample();
    CHECK(s != NULL && !pl_same(t, s));
    pl_free(&s);
    pl_free(&t);
    const uint32_t bad[4] = {0, 2, 0, 0};
    CHECK(pl_flat(5, 4, 2, bad, &err) == NULL);
    CHECK_STR_HAS(err.msg, "expert 1 owned by rank 2");
}

TEST(builder_refusals)
{
    pl_builder *b = pl_builder_new(2, 2, 2, &err);
    const uint16_t c[2] = {1, 2}, dup[3] = {0, 1, 1}, big[3] = {0, 0, 2}, zero[2] = {0, 1};
    CHECK_EQ(pl_builder_set(b, 0, c, dup, &err), -1);
    CHECK_STR_HAS(err.msg, "expert 1: rank 1 listed twice");
    CHECK_EQ(pl_builder_set(b, 0, c, big, &err), -1);
    CHECK_STR_HAS(err.msg, "rank 2 out of range");
    CHECK_EQ(pl_builder_set(b, 0, zero, big, &err), -1);
    CHECK_STR_HAS(err.msg, "expert 0 has 0 replicas");
    CHECK_EQ(pl_builder_set(b, 2, c, big, &err), -1);
    const uint16_t ok[3] = {1, 0, 1};
    CHECK_EQ(pl_builder_set(b, 0, c, ok, &err), 0);
    pl_table *t = pl_builder_finish(&b, &err); /* layer 1 never set */
    CHECK(t == NULL && b == NULL);
    CHECK_STR_HAS(err.msg, "layer 1 was never set");
    CHECK(pl_builder_new(0, 2, 2, &err) == NULL);
}

TEST(wire_round_trip)
{
    pl_table *t = sample();
    pl_wire w;
    CHECK(t && pl_encode(t, &w, &err) == 0);
    if (t == NULL)
        return;
    CHECK_EQ(w.layer_table_len, 6);
    CHECK_EQ(w.count_len, 2 * 4 * 2);
    CHECK_EQ(w.rank_len, (4 + 7) * 2);
    pl_table *d = pl_decode(3, 4, 3, w.layer_table, w.layer_table_len, w.count, w.count_len, w.rank,
                            w.rank_len, &err);
    CHECK(d != NULL && pl_same(t, d));
    pl_free(&d);
    /* refusals, each naming the array */
#define DECODE(L, E, P)                                                                            \
    pl_decode(L, E, P, w.layer_table, w.layer_table_len, w.count, w.count_len, w.rank, w.rank_len, \
              &err)
    CHECK(DECODE(2, 4, 3) == NULL);
    CHECK_STR_HAS(err.msg, "layer_table has 6 bytes, expected 4");
    CHECK(DECODE(3, 4, 2) == NULL); /* rank 2 is out of range for 2 ranks */
    CHECK_STR_HAS(err.msg, "expected 1..2");
    w.rank[10] = 0; /* table 1 expert 0 (replica_rank[4..5]): ranks 0, 0 */
    CHECK(DECODE(3, 4, 3) == NULL);
    CHECK_STR_HAS(err.msg, "replica_rank[5]");
    w.layer_table[2] = 7;
    CHECK(DECODE(3, 4, 3) == NULL);
    CHECK_STR_HAS(err.msg, "layer_table[1] = 7");
    w.layer_table[2] = 0; /* table 1 is never used */
    CHECK(DECODE(3, 4, 3) == NULL);
    CHECK_STR_HAS(err.msg, "only 1 used");
    w.layer_table[2] = 1;
    CHECK(pl_decode(3, 4, 3, w.layer_table, 6, w.count, 5, w.rank, w.rank_len, &err) == NULL);
    CHECK_STR_HAS(err.msg, "replica_count has 5 bytes");
    CHECK(pl_decode(3, 4, 3, w.layer_table, 6, w.count, w.count_len, w.rank, 4, &err) == NULL);
    CHECK_STR_HAS(err.msg, "replica_rank has 4 bytes, expected 22");
    pl_wire_free(&w);
    pl_free(&t);
}

/* The rule of docs/protocol.md: the i-th pair of an expert at origin o goes to replica
 * (o + i) mod n. Worked out: replicas {1, 4, 6}, origin 2: pairs 0 1 2 3 -> 6 1 4 6. */
TEST(replica_rule)
{
    const uint16_t reps[3] = {1, 4, 6};
    CHECK_EQ(pl_pick(reps, 3, 2, 0), 6);
    CHECK_EQ(pl_pick(reps, 3, 2, 1), 1);
    CHECK_EQ(pl_pick(reps, 3, 2, 2), 4);
    CHECK_EQ(pl_pick(reps, 3, 2, 3), 6);
    CHECK_EQ(pl_pick(reps, 1, 5, 9), 1);
    /* many origins with one pair each spread evenly */
    int hits[3] = {0};
    for (int o = 0; o < 300; o++)
        hits[pl_pick(reps, 3, o, 0) == 1 ? 0 : pl_pick(reps, 3, o, 0) == 4 ? 1 : 2]++;
    CHECK(hits[0] == 100 && hits[1] == 100 && hits[2] == 100);
}

int main(void)
{
    RUN(build_and_query);
    RUN(flat_tables);
    RUN(builder_refusals);
    RUN(wire_round_trip);
    RUN(replica_rule);
    return test_report();
}
