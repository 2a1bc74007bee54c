/*
 * mathf_demo_cases.c — every routing score of a model's layers on one input that the C
 * library's expf/log1pf (what route_score called before kernels/mathf.c) round differently:
 * the logit, the old and the new score, and MPFR's correctly rounded exp and log1p, so
 * docs/numerics.md §6 can list each such case for the demo model
 * (tests/bench/mathf_demo_diff.sh makes the model and the input).
 *
 *   mathf_demo_cases MODEL_DIR INPUT.st
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "kernels/moe.h"
#include "kernels/route.h"
#include "mathf_mpfr.h"
#include "shard/shard.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void *read_all(const st_tensor *t, size_t n, ep_err *err)
{
    void *p = malloc(n);
    if (p && st_tensor_read(t, 0, p, n, err) < 0) {
        free(p);
        return NULL;
    }
    return p;
}

static int layer_cases(const st_model *m, const mc_config *c, int layer, int T, const uint16_t *x,
                       const int64_t *ids, ep_err *err)
{
    int H = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok, n = 0;
    char pfx[32], name[64];
    ck_layer_prefix(c, layer, pfx, sizeof pfx);
    snprintf(name, sizeof name, "%sffn.gate.weight", pfx);
    const st_tensor *gt = st_model_find(m, name);
    moe_layer *l = shard_load_moe_layer(m, c, layer, NULL, ISA_REF, err);
    uint16_t *xn = malloc((size_t)T * H * 2), *w = gt ? read_all(gt, (size_t)E * H * 2, err) : NULL;
    int32_t *tid = malloc(sizeof(int32_t) * T * k);
    float *tw = malloc(sizeof(float) * T * k), *lg = malloc(sizeof(float) * T * E);
    void *packed = aligned_alloc(32, (route_gate_bytes(ISA_REF, E, H) + 31) / 32 * 32);
    if (!l || !w || moe_route(l, T, x, ids, xn, tid, tw, NULL, err) < 0) {
        n = -1;
    } else {
        route_gate_pack(ISA_REF, E, H, w, packed);
        route_logits(ISA_REF, T, H, E, xn, packed, lg, NULL);
        for (int i = 0; i < T * E; i++) {
            float g = lg[i], o = sqrtf(g > 20.0f ? g : log1pf(expf(g))), s = route_score(g);
            if (bits_of(o) == bits_of(s))
                continue;
            n++;
            float e = mpfr_ref_expf(g);
            printf("| %s | %d | %d | `%a` | `%a` / `%a` | `%a` | `%a` | `%a` / `%a` |\n", pfx,
                   i / E, i % E, (double)g, (double)expf(g), (double)log1pf(expf(g)), (double)o,
                   (double)s, (double)e, (double)mpfr_ref_log1pf(e));
        }
    }
    moe_layer_free(&l);
    free(xn);
    free(w);
    free(tid);
    free(tw);
    free(lg);
    free(packed);
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: mathf_demo_cases MODEL_DIR INPUT.st\n");
        return 64;
    }
    ep_err err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", argv[1]);
    mc_config c;
    st_model *m = NULL;
    st_file *in = NULL;
    if (mc_load(path, &c, &err) < 0 || mc_validate(&c, &err) < 0 ||
        !(m = st_model_open(argv[1], &err)) || !(in = st_open(argv[2], &err))) {
        fprintf(stderr, "mathf_demo_cases: %s\n", err.msg);
        return 1;
    }
    const st_tensor *xt = st_find(in, "hidden_states"), *it = st_find(in, "input_ids");
    if (!xt || xt->dtype != ST_BF16 || !it) {
        fprintf(stderr, "mathf_demo_cases: %s needs hidden_states BF16 and input_ids\n", argv[2]);
        return 1;
    }
    int T = (int)xt->shape[0];
    uint16_t *x = read_all(xt, (size_t)T * c.hidden_size * 2, &err);
    int64_t *ids = read_all(it, (size_t)T * 8, &err);
    if (!x || !ids) {
        fprintf(stderr, "mathf_demo_cases: %s\n", err.msg);
        return 1;
    }
    printf("| layer | token | expert | logit | libm expf / log1pf | old score | new score | MPFR "
           "exp / log1p |\n|---|---|---|---|---|---|---|---|\n");
    int total = 0, scores = 0;
    for (int layer = 0; layer < mc_num_layers(&c); layer++) {
        int n = layer_cases(m, &c, layer, T, x, ids, &err);
        if (n < 0) {
            fprintf(stderr, "mathf_demo_cases: layer %d: %s\n", layer, err.msg);
            return 1;
        }
        total += n;
        scores += T * c.n_routed_experts;
    }
    printf("\n%d of %d scores differ\n", total, scores);
    free(x);
    free(ids);
    st_close(&in);
    st_model_close(&m);
    return 0;
}
