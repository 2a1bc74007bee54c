/*
 * backend_check.c — see backend_check.h.
 */
#include "backend_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "kernels/formats.h"
#include "shard/shard.h"

double bchk_calc_diff_bf16(const uint16_t *x, const uint16_t *y, size_t n)
{
    double xy = 0, xx = 0, yy = 0;
    for (size_t i = 0; i < n; i++) {
        double a = fmt_bf16_to_f32(x[i]), b = fmt_bf16_to_f32(y[i]);
        if (!isfinite(a) || !isfinite(b))
            return 1.0;
        xy += a * b;
        xx += a * a;
        yy += b * b;
    }
    return xx + yy == 0 ? 0.0 : 1.0 - 2.0 * xy / (xx + yy);
}

static uint64_t bc_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double bc_unit(uint64_t *s)
{
    return (double)(bc_rand(s) >> 11) * 0x1p-52 - 1.0;
}

typedef struct bc_ctx {
    mb_backend *be, *ref;
    const bchk_opts *o;
    const mc_config *c;
    const char *layer_name;
    int T;
    int fails;
} bc_ctx;

static void bc_fail(bc_ctx *x, const char *what, const char *detail)
{
    printf("  %s, T=%d: %s%s%s\n", x->layer_name, x->T, what, detail ? ": " : "",
           detail ? detail : "");
    x->fails++;
}

/* Bit equality; NaNs of any payload count as equal for f32 data (the devices' NaN payloads
 * differ, and every consumer turns a NaN into the canonical bf16 NaN). */
static bool bc_same_f32(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], 4) != 0)
            return false;
    return true;
}

static void bc_bf16(bc_ctx *x, const char *what, const uint16_t *got, const uint16_t *want,
                    size_t n)
{
    if (x->o->exact) {
        for (size_t i = 0; i < n; i++)
            if (got[i] != want[i]) {
                char d[128];
                snprintf(d, sizeof d, "first difference at %zu: %04x vs %04x (of %zu)", i, got[i],
                         want[i], n);
                bc_fail(x, what, d);
                return;
            }
        return;
    }
    double cd = bchk_calc_diff_bf16(got, want, n);
    if (!(cd < x->o->tol)) {
        char d[96];
        snprintf(d, sizeof d, "calc_diff %.3g >= %.3g", cd, x->o->tol);
        bc_fail(x, what, d);
    }
}

typedef struct bc_bufs {
    uint16_t *x, *out_a, *out_b, *xn_a, *xn_b, *eo;
    int64_t *ids;
    int32_t *id_a, *id_b;
    float *w_a, *w_b, *qs_a, *qs_b;
    uint8_t *q_a, *q_b;
} bc_bufs;

static void bc_free(bc_bufs *b)
{
    free(b->x), free(b->out_a), free(b->out_b), free(b->xn_a), free(b->xn_b), free(b->eo);
    free(b->ids), free(b->id_a), free(b->id_b), free(b->w_a), free(b->w_b);
    free(b->qs_a), free(b->qs_b), free(b->q_a), free(b->q_b);
}

static int bc_alloc(bc_bufs *b, int T, const mc_config *c, uint64_t *seed)
{
    size_t H = (size_t)c->hidden_size, k = (size_t)c->num_experts_per_tok, N = (size_t)T;
    memset(b, 0, sizeof *b);
    b->x = malloc(N * H * 2 + 2);
    b->out_a = malloc(N * H * 2 + 2);
    b->out_b = malloc(N * H * 2 + 2);
    b->xn_a = malloc(N * H * 2 + 2);
    b->xn_b = malloc(N * H * 2 + 2);
    b->eo = calloc(N * k * H + 1, 2);
    b->ids = malloc(N * 8 + 8);
    b->id_a = malloc(N * k * 4 + 4);
    b->id_b = malloc(N * k * 4 + 4);
    b->w_a = malloc(N * k * 4 + 4);
    b->w_b = malloc(N * k * 4 + 4);
    b->q_a = malloc(N * H + 1);
    b->q_b = malloc(N * H + 1);
    b->qs_a = malloc(N * (H / 128) * 4 + 4);
    b->qs_b = malloc(N * (H / 128) * 4 + 4);
    if (!b->x || !b->out_a || !b->out_b || !b->xn_a || !b->xn_b || !b->eo || !b->ids || !b->id_a ||
        !b->id_b || !b->w_a || !b->w_b || !b->q_a || !b->q_b || !b->qs_a || !b->qs_b)
        return -1;
    /* hidden states with outliers: most channels small, a few tokens and channels huge */
    for (size_t t = 0; t < N; t++) {
        double amp = t % 13 == 5 ? 200.0 : t % 17 == 3 ? 1e-3 : 1.5;
        for (size_t i = 0; i < H; i++) {
            double v = amp * bc_unit(seed);
            if (i % 97 == 11)
                v *= 40.0;
            b->x[t * H + i] = fmt_f32_to_bf16((float)v);
        }
        b->ids[t] = (int64_t)(bc_rand(seed) % (uint64_t)c->vocab_size);
    }
    return 0;
}

/* The whole layer on both backends. */
static void bc_forward(bc_ctx *x, const mb_layer *la, const mb_layer *lb, bc_bufs *b)
{
    size_t H = (size_t)x->c->hidden_size, k = (size_t)x->c->num_experts_per_tok;
    ep_err ea = {{0}}, eb = {{0}};
    int ra = mb_forward(x->be, la, x->T, b->x, b->ids, b->out_a, b->id_a, b->w_a, &ea);
    int rb = mb_forward(x->ref, lb, x->T, b->x, b->ids, b->out_b, b->id_b, b->w_b, &eb);
    if (ra != 0 || rb != 0) {
        bc_fail(x, "mb_forward failed", ra ? ea.msg : eb.msg);
        return;
    }
    if (memcmp(b->id_a, b->id_b, (size_t)x->T * k * 4) != 0)
        bc_fail(x, "mb_forward: top-k ids differ", NULL);
    if (!bc_same_f32(b->w_a, b->w_b, (size_t)x->T * k))
        bc_fail(x, "mb_forward: top-k weights differ", NULL);
    bc_bf16(x, "mb_forward: out", b->out_a, b->out_b, (size_t)x->T * H);
}

/* The step API: begin, shared, experts on own and on "received" rows, finish. */
static void bc_steps(bc_ctx *x, const mb_layer *la, const mb_layer *lb, bc_bufs *b)
{
    const mc_config *c = x->c;
    size_t H = (size_t)c->hidden_size, k = (size_t)c->num_experts_per_tok, SC = H / 128;
    size_t T = (size_t)x->T, n = T * k;
    ep_err e = {{0}};
    mb_step *sa =
        mb_step_begin(x->be, la, x->T, b->x, b->ids, b->id_a, b->w_a, b->q_a, b->qs_a, b->xn_a, &e);
    if (!sa) {
        bc_fail(x, "mb_step_begin failed", e.msg);
        return;
    }
    mb_step *sb = mb_step_begin(x->ref, lb, x->T, b->x, b->ids, b->id_b, b->w_b, b->q_b, b->qs_b,
                                b->xn_b, &e);
    if (!sb) {
        bc_fail(x, "reference mb_step_begin failed", e.msg);
        mb_step_free(&sa);
        return;
    }
    if (memcmp(b->id_a, b->id_b, n * 4) != 0 || !bc_same_f32(b->w_a, b->w_b, n))
        bc_fail(x, "mb_step_begin: routing differs", NULL);
    if (memcmp(b->xn_a, b->xn_b, T * H * 2) != 0)
        bc_fail(x, "mb_step_begin: ffn_norm output differs", NULL);
    if (memcmp(b->q_a, b->q_b, T * H) != 0 || !bc_same_f32(b->qs_a, b->qs_b, T * SC))
        bc_fail(x, "mb_step_begin: FP8 dispatch bytes differ", NULL);
    if (mb_step_shared(sa, &e) != 0)
        bc_fail(x, "mb_step_shared failed", e.msg);
    /* pairs: even slots are "own" (rows = tokens), odd slots arrive from a "peer" as a compact
     * set of distinct rows in reverse token order */
    uint32_t *prow = malloc(n * 4 + 4), *pexp = malloc(n * 4 + 4), *slot = malloc(n * 4 + 4);
    uint32_t *rmap = malloc(T * 4 + 4);
    float *pw = malloc(n * 4 + 4);
    uint16_t *o_a = malloc(n * H * 2 + 2), *o_b = malloc(n * H * 2 + 2);
    uint8_t *cq = malloc(T * H + 1);
    float *cqs = malloc(T * SC * 4 + 4);
    if (!prow || !pexp || !slot || !rmap || !pw || !o_a || !o_b || !cq || !cqs) {
        bc_fail(x, "out of memory", NULL);
        goto done;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t np = 0, nr = 0;
        for (size_t t = 0; t < T; t++)
            rmap[t] = UINT32_MAX;
        for (size_t tt = 0; tt < T; tt++) {
            size_t t = pass ? T - 1 - tt : tt;
            for (size_t j = (size_t)pass; j < k; j += 2) {
                if (pass && rmap[t] == UINT32_MAX) {
                    rmap[t] = (uint32_t)nr;
                    memcpy(cq + nr * H, b->q_b + t * H, H);
                    memcpy(cqs + nr * SC, b->qs_b + t * SC, SC * 4);
                    nr++;
                }
                prow[np] = pass ? rmap[t] : (uint32_t)t;
                pexp[np] = (uint32_t)b->id_b[t * k + j];
                pw[np] = b->w_b[t * k + j];
                slot[np] = (uint32_t)(t * k + j);
                np++;
            }
        }
        int rows = pass ? (int)nr : x->T;
        const uint8_t *qq = pass ? cq : b->q_b;
        const float *qqs = pass ? cqs : b->qs_b;
        int ra = mb_experts(x->be, la, rows, qq, qqs, (int)np, prow, pexp, pw, o_a, &e);
        int rb = ra ? 0 : mb_experts(x->ref, lb, rows, qq, qqs, (int)np, prow, pexp, pw, o_b, &e);
        if (ra || rb) {
            bc_fail(x, pass ? "mb_experts (received rows) failed" : "mb_experts failed", e.msg);
            continue;
        }
        bc_bf16(x, pass ? "mb_experts on received rows" : "mb_experts on own rows", o_a, o_b,
                np * H);
        for (size_t p = 0; p < np; p++)
            memcpy(b->eo + (size_t)slot[p] * H, o_b + p * H, H * 2);
    }
    /* both finish on the reference's expert outputs: the combine and the shared expert alone */
    if (mb_step_finish(sa, b->eo, b->out_a, &e) != 0 ||
        mb_step_finish(sb, b->eo, b->out_b, &e) != 0)
        bc_fail(x, "mb_step_finish failed", e.msg);
    else
        bc_bf16(x, "mb_step_finish: out", b->out_a, b->out_b, T * H);
    /* mb_quant of the bf16 rows (a bf16 DISPATCH's receiver) */
    if (mb_quant(x->be, la, x->T, b->xn_b, b->q_a, b->qs_a, &e) != 0)
        bc_fail(x, "mb_quant failed", e.msg);
    else if (memcmp(b->q_a, b->q_b, T * H) != 0 || !bc_same_f32(b->qs_a, b->qs_b, T * SC))
        bc_fail(x, "mb_quant differs", NULL);
done:
    mb_step_free(&sa);
    mb_step_free(&sb);
    free(prow), free(pexp), free(slot), free(rmap), free(pw), free(o_a), free(o_b), free(cq),
        free(cqs);
}

int bchk_compare(mb_backend *be, mb_backend *ref, const char *model_dir, const bchk_opts *o)
{
    ep_err err = {{0}};
    char path[4200];
    mc_config c;
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    st_model *m = NULL;
    if (mc_load(path, &c, &err) < 0 || !(m = st_model_open(model_dir, &err))) {
        printf("  %s\n", err.msg);
        return -1;
    }
    bc_ctx x = {.be = be, .ref = ref, .o = o, .c = &c};
    uint64_t seed = o->seed ? o->seed : 0x9E3779B97F4A7C15ull;
    int L = mc_num_layers(&c);
    if (o->max_layers > 0 && o->max_layers < L)
        L = o->max_layers;
    for (int l = 0; l < L; l++) {
        mb_layer *la = shard_load_layer(be, m, &c, l, o->want, NULL, NULL, NULL, &err);
        mb_layer *lb = la ? shard_load_layer(ref, m, &c, l, o->want, NULL, NULL, NULL, &err) : NULL;
        char name[32];
        snprintf(name, sizeof name, "layer %d", l);
        x.layer_name = name;
        if (!la || !lb) {
            x.T = 0;
            bc_fail(&x, "loading failed", err.msg);
        }
        for (int i = 0; la && lb && i < o->n_T; i++) {
            bc_bufs b;
            x.T = o->Ts[i];
            if (bc_alloc(&b, x.T, &c, &seed) == 0) {
                bc_forward(&x, la, lb, &b);
                bc_steps(&x, la, lb, &b);
            } else {
                bc_fail(&x, "out of memory", NULL);
            }
            bc_free(&b);
        }
        mb_layer_free(&la);
        mb_layer_free(&lb);
    }
    st_model_close(&m);
    return x.fails;
}
