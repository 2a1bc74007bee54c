/*
 * test_eplb.c — DeepSeek's EPLB in C (coordinator/eplb.h).
 *
 * Expected plans come from outside the code under test: the README example of
 * deepseek-ai/EPLB (hierarchical; its published output) and small global examples worked by
 * hand below. Property tests check every plan of many random shapes: every expert has a copy,
 * every rank holds exactly its slots, no rank holds an expert twice, the same input gives the
 * same plan. The Zipf case is the acceptance: 256 experts, 64 ranks, 32 redundant
 * slots, max/mean rank load <= 1.05, printed beside the contiguous placement's ratio.
 */
#include "coordinator/eplb.h"

#include <math.h>
#include <stdint.h>

#include "test.h"

static ep_err err;

/* deepseek-ai/EPLB README: 2 layers x 12 experts, 4 groups, 2 nodes, 8 GPUs, 16 slots. */
TEST(readme_example_hierarchical)
{
    const double w[2 * 12] = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                              20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
    const int want[2 * 16] = {5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                              7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1};
    eplb_shape s = {
        .n_layers = 2, .n_experts = 12, .n_slots = 16, .n_ranks = 8, .n_nodes = 2, .n_groups = 4};
    int got[32], rank[32];
    CHECK(eplb_hierarchical(&s));
    CHECK_EQ(eplb_plan(&s, w, got, rank, &err), 0);
    for (int i = 0; i < 32; i++) {
        if (got[i] != want[i])
            TEST_FAIL_AT("layer %d slot %d: expert %d, the README says %d", i / 16, i % 16, got[i],
                         want[i]);
        CHECK_EQ(rank[i], (i % 16) / 2); /* two slots per GPU, GPU-major */
    }
}

/* Global, worked by hand. weights 10 40 20 30, 6 slots on 2 ranks (3 each).
 * replicate: 40 is the highest load per copy -> e1 gets a 2nd copy (20 each); then 30 -> e3
 * (15 each). Copies 0..5 = e0 e1 e2 e3 e1 e3 with loads 10 20 20 15 20 15.
 * pack, heaviest first (ties: lower copy): c1(e1,20) -> r0; c2(e2,20) -> r1; c4(e1,20): r0 and
 * r1 both 20, r0 is lower but holds e1 -> r1 (40); c3(e3,15) -> r0 (35); c5(e3,15): r0 (35) is
 * lighter but holds e3 -> r1 (55, full); c0(e0,10) -> r0 (45).
 * (DeepSeek's pack would put both copies of e1 on r0 and of e3 on r1: 50/50 with no real
 * replica; here a rank never holds an expert twice.) */
TEST(global_hand_worked_replica_constraint)
{
    const double w[4] = {10, 40, 20, 30};
    const int want[6] = {1, 3, 0, 2, 1, 3};
    eplb_shape s = {
        .n_layers = 1, .n_experts = 4, .n_slots = 6, .n_ranks = 2, .n_nodes = 1, .n_groups = 1};
    int got[6], rank[6];
    CHECK(!eplb_hierarchical(&s));
    CHECK_EQ(eplb_plan(&s, w, got, rank, &err), 0);
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(got[i], want[i]);
        CHECK_EQ(rank[i], i / 3);
    }
}

/* Global, uneven slots, worked by hand. weights 8 1 1 6 4, 7 slots on 3 ranks: 2 each and
 * one extra slot for the first rank that asks for a third.
 * replicate: e0 (8) then e3 (6): copies e0 e1 e2 e3 e4 e0 e3, loads 4 1 1 3 4 4 3.
 * pack, heaviest first: c0(e0,4) -> r0; c4(e4,4) -> r1; c5(e0,4) -> r2; c3(e3,3): all at 4 ->
 * r0 (7, two copies); c6(e3,3): r1 and r2 at 4 -> r1 (7); c1(e1,1): r2 (4) -> 5; c2(e2,1):
 * every rank holds two, one may take the extra slot: the lightest, r2 (6).
 * Ranks: r0 {e0 e3}, r1 {e4 e3}, r2 {e0 e1 e2}; loads 7 7 6 (a third slot fixed on r0 would
 * have given 8 7 5). */
TEST(global_hand_worked_uneven_slots)
{
    const double w[5] = {8, 1, 1, 6, 4};
    const int want[7] = {0, 3, 4, 3, 0, 1, 2}, want_rank[7] = {0, 0, 1, 1, 2, 2, 2};
    eplb_shape s = {
        .n_layers = 1, .n_experts = 5, .n_slots = 7, .n_ranks = 3, .n_nodes = 1, .n_groups = 1};
    int got[7], rank[7];
    CHECK_EQ(eplb_plan(&s, w, got, rank, &err), 0);
    for (int i = 0; i < 7; i++) {
        CHECK_EQ(got[i], want[i]);
        CHECK_EQ(rank[i], want_rank[i]);
    }
}

/* The primitives on their own, by hand. */
TEST(pack_and_replicate_by_hand)
{
    /* 6 items into 2 packs of 3: 5 4 3 3 2 1 (indices 0..5): 5 -> p0, 4 -> p1, 3 (i2) -> p1
     * (4 < 5), 3 (i3) -> p0 (5 < 7), 2 -> p1 (7 < 8; full at 9), 1 -> p0 (9). */
    const double w[6] = {5, 4, 3, 3, 2, 1};
    int pack[6], slot[6];
    CHECK_EQ(eplb_pack(w, NULL, 6, 2, pack, slot, &err), 0);
    const int wp[6] = {0, 1, 1, 0, 1, 0}, ws[6] = {0, 0, 1, 1, 2, 2};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ(pack[i], wp[i]);
        CHECK_EQ(slot[i], ws[i]);
    }
    /* replicate 3 experts (9 3 6) into 6 copies: e0 (9 -> 4.5 per copy), e2 (6 -> 3), e0
     * (4.5 -> 3); more than 3 x 3 copies with at most 3 each is refused */
    const double r[3] = {9, 3, 6};
    int p2l[6], cnt[3];
    CHECK_EQ(eplb_replicate(r, 3, 6, 3, p2l, cnt, &err), 0);
    const int wl[6] = {0, 1, 2, 0, 2, 0};
    for (int i = 0; i < 6; i++)
        CHECK_EQ(p2l[i], wl[i]);
    CHECK_EQ(cnt[0], 3);
    CHECK_EQ(cnt[1], 1);
    CHECK_EQ(cnt[2], 2);
    CHECK_EQ(eplb_replicate(r, 3, 10, 3, p2l, cnt, &err), -1);
    CHECK_STR_HAS(err.msg, "at most 3 copies");
}

TEST(shape_errors)
{
    eplb_shape s = {
        .n_layers = 1, .n_experts = 8, .n_slots = 6, .n_ranks = 2, .n_nodes = 1, .n_groups = 1};
    CHECK_EQ(eplb_check(&s, &err), -1);
    CHECK_STR_HAS(err.msg, "6 slots cannot hold the 8 experts");
    s.n_slots = 17;
    CHECK_EQ(eplb_check(&s, &err), -1);
    CHECK_STR_HAS(err.msg, "more than one copy");
    s.n_slots = 8;
    s.n_ranks = 9;
    CHECK_EQ(eplb_check(&s, &err), -1);
    s.n_ranks = 2;
    s.n_groups = 0;
    CHECK_EQ(eplb_check(&s, &err), -1);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Every property of one plan; returns the number of violations. */
static int check_plan(const eplb_shape *s, const int *p2l, const int *p2r)
{
    int E = s->n_experts, R = s->n_slots, G = s->n_ranks, bad = 0, extra = 0;
    int *cnt = calloc((size_t)E, sizeof *cnt), *slots = calloc((size_t)G, sizeof *slots);
    for (int l = 0; l < s->n_layers; l++) {
        const int *row = p2l + (size_t)l * R, *rk = p2r + (size_t)l * R;
        for (int e = 0; e < E; e++)
            cnt[e] = 0;
        for (int g = 0; g < G; g++)
            slots[g] = 0;
        for (int i = 0; i < R; i++) {
            if (row[i] < 0 || row[i] >= E || rk[i] < 0 || rk[i] >= G ||
                (i > 0 && rk[i] < rk[i - 1])) {
                bad++;
                continue;
            }
            cnt[row[i]]++;
            slots[rk[i]]++;
            for (int j = i - 1; j >= 0 && rk[j] == rk[i]; j--)
                bad += row[j] == row[i]; /* a rank's slots hold distinct experts */
        }
        for (int e = 0; e < E; e++)
            bad += cnt[e] < 1; /* every expert has a copy */
        extra = 0;
        for (int g = 0; g < G; g++) { /* every rank its slots: R/G, R % G of them one more */
            bad += slots[g] != R / G && slots[g] != R / G + 1;
            extra += slots[g] == R / G + 1;
        }
        bad += extra != R % G;
    }
    free(cnt);
    free(slots);
    return bad;
}

TEST(properties_random_shapes)
{
    int shapes = 0;
    for (int iter = 0; iter < 300; iter++) {
        int E = 1 + (int)(rnd() % 64), G = 1 + (int)(rnd() % 24);
        if (iter % 10 == 0) {
            E = 256;
            G = 8 << (rnd() % 4);
        }
        int N = 1 + (int)(rnd() % 4);
        if (G % N != 0)
            N = 1;
        int groups = 1 + (int)(rnd() % 8);
        if (E % groups != 0)
            groups = 1;
        int R = E + (int)(rnd() % (E + 1));
        if (R < G)
            R = G;
        if ((int64_t)R > (int64_t)E * G)
            continue;
        eplb_shape s = {.n_layers = 3,
                        .n_experts = E,
                        .n_slots = R,
                        .n_ranks = G,
                        .n_nodes = N,
                        .n_groups = groups};
        double *w = malloc((size_t)3 * E * sizeof *w);
        int *a = malloc((size_t)3 * R * sizeof *a), *b = malloc((size_t)3 * R * sizeof *b);
        int *ra = malloc((size_t)3 * R * sizeof *ra), *rb = malloc((size_t)3 * R * sizeof *rb);
        for (int i = 0; i < 3 * E; i++) /* skewed, with ties and zeros */
            w[i] = (double)((rnd() % 4 == 0) ? 0 : (rnd() % 1000) * (rnd() % 7 == 0 ? 50 : 1));
        if (eplb_plan(&s, w, a, ra, &err) != 0 || eplb_plan(&s, w, b, rb, &err) != 0) {
            TEST_FAIL_AT("E %d R %d G %d N %d groups %d: %s", E, R, G, N, groups, err.msg);
        } else {
            int bad = check_plan(&s, a, ra);
            if (bad)
                TEST_FAIL_AT("E %d R %d G %d N %d groups %d (%s): %d violations", E, R, G, N,
                             groups, eplb_hierarchical(&s) ? "hierarchical" : "global", bad);
            if (memcmp(a, b, (size_t)3 * R * sizeof *a) != 0 ||
                memcmp(ra, rb, (size_t)3 * R * sizeof *a) != 0)
                TEST_FAIL_AT("E %d R %d G %d: two plans of the same input differ", E, R, G);
            shapes++;
        }
        free(w);
        free(a);
        free(b);
        free(ra);
        free(rb);
    }
    CHECK(shapes > 200);
}

/* max/mean rank load of a plan (copies share their expert's load evenly). */
static double plan_balance(const eplb_shape *s, const double *w, const int *p2l, const int *p2r)
{
    int E = s->n_experts, R = s->n_slots, G = s->n_ranks;
    int *cnt = calloc((size_t)E, sizeof *cnt);
    double *load = calloc((size_t)G, sizeof *load), tot = 0, mx = 0;
    for (int i = 0; i < R; i++)
        cnt[p2l[i]]++;
    for (int i = 0; i < R; i++)
        load[p2r[i]] += w[p2l[i]] / cnt[p2l[i]];
    for (int g = 0; g < G; g++) {
        tot += load[g];
        mx = load[g] > mx ? load[g] : mx;
    }
    free(cnt);
    free(load);
    return mx / (tot / G);
}

/* Zipf (s = 1.2) popularity over 256 experts (hot ones at random ids), 64 ranks, 32 redundant
 * slots. The load is what a router makes of it: 20,000 tokens, each choosing 6 distinct experts
 * by that popularity (a token never selects one expert twice, so no expert gets more than a
 * sixth of the pairs). Without the top-k the hottest expert alone would take a quarter of the
 * load, 16.2 ranks' worth, and no placement with 32 extra copies could get below 16.2/15 = 1.08. */
TEST(zipf_256_experts_64_ranks_32_redundant)
{
    enum { E = 256, G = 64, RED = 32, T = 20000, K = 6 };
    double pop[E], cum[E], w[E] = {0};
    int perm[E];
    for (int i = 0; i < E; i++)
        perm[i] = i;
    for (int i = E - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < E; i++)
        pop[perm[i]] = 1.0 / pow(i + 1, 1.2);
    for (int i = 0; i < E; i++)
        cum[i] = pop[i] + (i ? cum[i - 1] : 0);
    for (int t = 0; t < T; t++) {
        int chosen[K], n = 0;
        while (n < K) {
            double u = (rnd() / 65536.0 + 0.5 / 65536.0) / 65536.0 * cum[E - 1];
            int e = 0;
            while (e < E - 1 && cum[e] < u)
                e++;
            bool dup = false;
            for (int j = 0; j < n; j++)
                dup |= chosen[j] == e;
            if (!dup)
                chosen[n++] = e;
        }
        for (int j = 0; j < K; j++)
            w[chosen[j]] += 1;
    }
    double mx = 0, tot = 0; /* contiguous: rank g owns experts [4g, 4g+4) */
    for (int g = 0; g < G; g++) {
        double l = 0;
        for (int e = g * (E / G); e < (g + 1) * (E / G); e++)
            l += w[e];
        mx = l > mx ? l : mx;
        tot += l;
    }
    double contiguous = mx / (tot / G);
    eplb_shape s = {.n_layers = 1,
                    .n_experts = E,
                    .n_slots = E + RED,
                    .n_ranks = G,
                    .n_nodes = 1,
                    .n_groups = 1};
    int p2l[E + RED], p2r[E + RED];
    CHECK_EQ(eplb_plan(&s, w, p2l, p2r, &err), 0);
    CHECK_EQ(check_plan(&s, p2l, p2r), 0);
    double eplb = plan_balance(&s, w, p2l, p2r);
    printf("  zipf s=1.2 (top-6 of 20000 tokens), 256 experts, 64 ranks, 32 redundant: "
           "max/mean contiguous %.3f, eplb %.3f\n",
           contiguous, eplb);
    CHECK(eplb <= 1.05);
    CHECK(contiguous > 2.0);
}

int main(void)
{
    RUN(readme_example_hierarchical);
    RUN(global_hand_worked_replica_constraint);
    RUN(global_hand_worked_uneven_slots);
    RUN(pack_and_replicate_by_hand);
    RUN(shape_errors);
    RUN(properties_random_shapes);
    RUN(zipf_256_experts_64_ranks_32_redundant);
    return test_report();
}
