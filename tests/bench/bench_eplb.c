/*
 * bench_eplb.c — how long the planner takes to rebalance a large cluster (issue 9).
 *
 *   bench_eplb [--workers P] [--experts E] [--layers L] [--redundant R] [--runs N]
 *
 * Builds the eplb table of a P-worker cluster (E experts, L layers, E + R slots; R defaults to
 * what gives every worker a slot), then times plan_rebalance (EPLB per layer plus matching the
 * new rank sets onto the ranks that hold them) from a Zipf(1.2) load with the hot experts at
 * a different place in each layer. Prints the best of N runs and the balance before/after.
 * The baseline in the same run: eplb_plan alone (the algorithm without the matching).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/eplb.h"
#include "coordinator/planner.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int P = 1024, E = 384, L = 61, R = -1, runs = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--workers") == 0)
            P = v;
        else if (strcmp(argv[i], "--experts") == 0)
            E = v;
        else if (strcmp(argv[i], "--layers") == 0)
            L = v;
        else if (strcmp(argv[i], "--redundant") == 0)
            R = v;
        else if (strcmp(argv[i], "--runs") == 0)
            runs = v;
    }
    if (R < 0)
        R = P > E + 32 ? P - E : 32;
    ep_err err;
    plan_shape sh;
    plan_shape_simple(SPEC_PLACE_EPLB, L, E, P, &sh);
    sh.redundant = R;
    plan_table *t = plan_build(&sh, 1, &err);
    if (t == NULL) {
        fprintf(stderr, "bench_eplb: %s\n", err.msg);
        return 1;
    }
    double *w = malloc((size_t)L * E * sizeof *w);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < E; i++) /* the i-th most popular expert of layer l */
            w[(size_t)l * E + (size_t)((i * 2654435761u + (unsigned)l * 40503u) % (unsigned)E)] =
                1e6 / pow(i + 1, 1.2);
    uint8_t *all = malloc((size_t)P);
    memset(all, 1, (size_t)P);
    int *p2l = malloc((size_t)(E + R) * sizeof *p2l), *p2r = malloc((size_t)(E + R) * sizeof *p2r);
    eplb_shape es = {
        .n_layers = 1, .n_experts = E, .n_slots = E + R, .n_ranks = P, .n_nodes = 1, .n_groups = 1};
    double best = 1e30, best_alg = 1e30;
    plan_report rep = {0};
    for (int r = 0; r < runs; r++) {
        double a = now_s();
        plan_report_free(&rep);
        plan_table *n = plan_rebalance(t, w, all, 0, 2, &rep, &err);
        double b = now_s();
        for (int l = 0; l < L; l++)
            eplb_plan(&es, w + (size_t)l * E, p2l, p2r, &err);
        double c = now_s();
        if (n == NULL) {
            fprintf(stderr, "bench_eplb: %s\n", err.msg);
            return 1;
        }
        plan_free(&n);
        best = b - a < best ? b - a : best;
        best_alg = c - b < best_alg ? c - b : best_alg;
    }
    printf("rebalance of %d workers x %d layers x %d experts (%d slots a layer): best of %d "
           "%.3f s (EPLB alone %.3f s); balance %.3f -> %.3f, %ld replicas move\n",
           P, L, E, E + R, runs, best, best_alg, rep.balance_before, rep.balance_after, rep.moved);
    plan_report_free(&rep);
    plan_free(&t);
    free(w);
    free(all);
    free(p2l);
    free(p2r);
    return 0;
}
