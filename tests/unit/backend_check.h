/*
 * backend_check.h — one backend against the CPU reference backend on a checkpoint, for the
 * tests of other backends (prefix bchk_): tests/unit/test_cuda_host.c runs it over a fake
 * device, tests/gpu/test_cuda_backend.c over a real one.
 *
 * For every MoE layer of the model (hash, score and MTP layers) and every token count given,
 * both backends load the layer through the shard loader and run:
 *   - mb_forward (the whole layer in one process);
 *   - the step API as a worker uses it: mb_step_begin (routing and the FP8 dispatch bytes),
 *     mb_step_shared, mb_experts on the origin's own rows and on a compacted "received" subset
 *     of rows in another order, mb_step_finish;
 *   - mb_quant (a bf16 DISPATCH's receiver).
 * Routing, top-k ids and weights, q/qs and everything in exact mode must agree bit for bit;
 * with exact false the expert outputs and layer outputs must be within spec §7's tolerance
 * (DeepGEMM calc_diff < tol) and the top-k ids still identical.
 */
#ifndef EPMOE_TEST_BACKEND_CHECK_H
#define EPMOE_TEST_BACKEND_CHECK_H

#include <stdbool.h>

#include "kernels/moe_backend.h"

typedef struct bchk_opts {
    bool exact;    /* bit for bit; else calc_diff < tol */
    double tol;    /* fast mode: the largest calc_diff accepted */
    const int *Ts; /* token counts to run */
    int n_T;
    int max_layers; /* 0: every layer */
    uint64_t seed;
    const uint8_t *want; /* [E]: the experts to load (NULL: all); routing must stay on them */
} bchk_opts;

/* Returns the number of failed comparisons (0: agree), or -1 when the model could not be
 * loaded (message printed). Prints one line per failure. */
int bchk_compare(mb_backend *be, mb_backend *ref, const char *model_dir, const bchk_opts *o);

/* DeepGEMM's calc_diff over n bf16 values: 1 - 2 sum(xy) / sum(x^2 + y^2), in double (0 when
 * both are all zero; 1 when any value is not finite). */
double bchk_calc_diff_bf16(const uint16_t *x, const uint16_t *y, size_t n);

#endif
