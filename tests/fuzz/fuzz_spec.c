/*
 * fuzz_spec.c — the cluster spec loader on arbitrary bytes (coordinator/spec.h).
 *
 * Properties: spec_parse never crashes, leaks or reads outside the input; it either returns a
 * spec or fills the error; a returned spec holds 1..EP_MAX_WORKERS workers numbered by rank,
 * each found by its name; and spec_check_experts / plan_build agree on which expert counts
 * the cluster can serve.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/planner.h"
#include "coordinator/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ep_err err = {0};
    spec_cluster *s = spec_parse((const char *)data, size, "fuzz.yaml", &err);
    if (s == NULL) {
        if (err.msg[0] == '\0')
            abort(); /* a failure must say why */
        return 0;
    }
    if (s->n_workers < 1 || s->n_workers > EP_MAX_WORKERS || s->n_nodes < 1)
        abort();
    for (int i = 0; i < s->n_workers; i++)
        if (s->workers[i].rank != i || spec_find_worker(s, s->workers[i].name) != &s->workers[i])
            abort();
    const int experts[] = {1, 16, 256, 255};
    /* max_experts_per_worker bounds failovers, not the spec's own placement */
    int max = s->max_experts_per_worker;
    s->max_experts_per_worker = 0;
    for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++) {
        int ok = spec_check_experts(s, experts[i], &err) == 0;
        mc_config cfg = {.n_routed_experts = experts[i], .num_hidden_layers = 2};
        plan_table *t = plan_for_spec(s, &cfg, 1, &err);
        if (ok != (t != NULL))
            abort();
        plan_free(&t);
    }
    s->max_experts_per_worker = max;
    spec_free(&s);
    return 0;
}
