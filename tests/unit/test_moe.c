/*
 * test_moe.c — the MoE layer (kernels/moe.h) bit for bit against an independent float64 model
 * of docs/numerics.md, and the invariances the determinism contract promises.
 *
 * The checkpoints come from the tests' own generator (moe_gen.c: random weights quantized with
 * kernels/formats.h). The model below decodes every code with its own formulas (e4m3, e2m1,
 * e8m0 written out from spec §3), computes every block sum exactly in double, and performs each
 * fp32 operation as (float)(a op b) in double — exact for + - * / of two floats, since double
 * carries more than 2 x 24 + 2 bits — so every rounding point of the definition is explicit.
 * It shares no code with kernels/; exp and log1p are MPFR's correct roundings (mathf_mpfr.c),
 * which the definition names.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/safetensors_model.h"
#include "kernels/formats.h"
#include "kernels/moe.h"
#include "kernels/moe_backend.h"
#include "shard/shard.h"
#include "moe_gen.h"
#include "mathf_mpfr.h"
#include "test.h"
#include "tests/isa_env.h"

/* ---- independent number formats ---- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float bf(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* bf16 RNE by arithmetic: quantum 2^(e-8), never finer than the subnormal quantum 2^-133. */
static uint16_t t_bf16(float f)
{
    if (isnan(f))
        return 0x7FFF;
    if (f == 0.0f || isinf(f))
        return (uint16_t)(f32_bits(f) >> 16);
    int e;
    frexp((double)f, &e);
    int qe = e - 8 < -133 ? -133 : e - 8;
    double r = ldexp(nearbyint(ldexp((double)f, -qe)), qe);
    return (uint16_t)(f32_bits((float)r) >> 16);
}

static float rbf(float f) /* round to bf16 and widen back */
{
    return bf(t_bf16(f));
}

static double d_e4m3(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (c & 0x80) ? -v : v;
}

static double d_e2m1(uint8_t n)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (n & 8) ? -mag[n & 7] : mag[n & 7];
}

static double d_e8m0(uint8_t c)
{
    return ldexp(1.0, (int)c - 127);
}

/* e4m3 RNE of a finite x, saturating at 448: round |x| to its quantum (2^(e-4) for |x| in
 * [2^(e-1), 2^e), 2^-9 below the smallest normal 2^-6), then look the value up. */
static uint8_t t_e4m3(float x)
{
    double a = fabs((double)x);
    if (a > 448.0)
        a = 448.0;
    double q;
    if (a < ldexp(1.0, -6)) {
        q = ldexp(1.0, -9);
    } else {
        int e;
        frexp(a, &e);
        q = ldexp(1.0, e - 4);
    }
    double r = nearbyint(a / q) * q;
    for (int c = 0; c < 127; c++)
        if (d_e4m3((uint8_t)c) == r)
            return (uint8_t)((signbit(x) ? 0x80 : 0) | c);
    abort();
}

static float f_add(float a, float b)
{
    return (float)((double)a + (double)b);
}
static float f_mul(float a, float b)
{
    return (float)((double)a * (double)b);
}
static float f_div(float a, float b)
{
    return (float)((double)a / (double)b);
}

/* ---- the layer, written from the definition ---- */

typedef struct t_linear {
    const gen_linear *g;
    double *wd; /* decoded codes [N, K] (unscaled) */
} t_linear;

typedef struct t_layer {
    const mc_config *c;
    const gen_layer *g;
    t_linear ex[64][3];
    t_linear sh[3];
} t_layer;

static void t_linear_init(t_linear *l, const gen_linear *g)
{
    l->g = g;
    size_t n = (size_t)g->N * g->K;
    l->wd = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        l->wd[i] = g->mxfp4 ? d_e2m1((g->w[i / 2] >> (4 * (i % 2))) & 15) : d_e4m3(g->w[i]);
}

static void t_layer_init(t_layer *t, const mc_config *c, const gen_layer *g)
{
    memset(t, 0, sizeof *t);
    t->c = c;
    t->g = g;
    for (int e = 0; e < c->n_routed_experts; e++)
        for (int j = 0; j < 3; j++)
            t_linear_init(&t->ex[e][j], &g->experts[e * 3 + j]);
    for (int j = 0; j < 3; j++)
        t_linear_init(&t->sh[j], &g->shared[j]);
}

static void t_layer_free(t_layer *t)
{
    for (int e = 0; e < t->c->n_routed_experts; e++)
        for (int j = 0; j < 3; j++)
            free(t->ex[e][j].wd);
    for (int j = 0; j < 3; j++)
        free(t->sh[j].wd);
}

/* Activation quantizer per 128 channels: codes q [K], decoded qd [K], scales qs [K/128]. */
static void t_quant(const float *x, int K, bool pow2, double *qd, float *qs)
{
    const float inv448 = bits_f32(0x3B124925);
    for (int b = 0; b < K / 128; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 128; i++)
            if (fabsf(x[b * 128 + i]) > amax)
                amax = fabsf(x[b * 128 + i]);
        if (!(amax > 1e-4f))
            amax = 1e-4f;
        float s = f_mul(amax, inv448);
        if (pow2) {
            int e;
            double f = frexp((double)s, &e);
            s = f == 0.5 ? s : (float)ldexp(1.0, e);
        }
        qs[b] = s;
        for (int i = 0; i < 128; i++)
            qd[b * 128 + i] = d_e4m3(t_e4m3(f_div(x[b * 128 + i], s)));
    }
}

/* One GEMM row: out [N] fp32 from one quantized activation row. */
static void t_gemm(const t_linear *l, const double *qd, const float *qs, float *out)
{
    const gen_linear *g = l->g;
    int N = g->N, K = g->K;
    for (int n = 0; n < N; n++) {
        const double *w = l->wd + (size_t)n * K;
        float acc = 0.0f;
        if (g->mxfp4) {
            for (int c = 0; c < K / 32; c++) {
                double p = 0;
                for (int k = c * 32; k < c * 32 + 32; k++)
                    p += qd[k] * w[k];
                float ws = (float)d_e8m0(g->s8[(size_t)n * (K / 32) + c]);
                acc = f_add(acc, f_mul(f_mul((float)p, qs[c / 4]), ws));
            }
        } else {
            for (int kb = 0; kb < K / 128; kb++) {
                double p = 0;
                for (int k = kb * 128; k < kb * 128 + 128; k++)
                    p += qd[k] * w[k];
                size_t si = (size_t)(n / 128) * (K / 128) + kb;
                float ws = g->e8m0 ? (float)d_e8m0(g->s8[si]) : g->s32[si];
                acc = f_add(acc, f_mul((float)p, f_mul(qs[kb], ws)));
            }
        }
        out[n] = acc;
    }
}

/* One expert MLP on one token: o [H] bf16. */
static void t_mlp(const t_layer *t, const t_linear *l, const double *qd, const float *qs,
                  float wrow, uint16_t *o)
{
    const mc_config *c = t->c;
    int H = c->hidden_size, I = c->moe_intermediate_size;
    float lim = c->swiglu_limit;
    float *a1 = malloc(I * sizeof(float)), *a3 = malloc(I * sizeof(float));
    float *h = malloc(I * sizeof(float)), *hs = malloc(I / 128 * sizeof(float));
    double *hd = malloc(I * sizeof(double));
    float *out = malloc(H * sizeof(float));
    t_gemm(&l[0], qd, qs, a1);
    t_gemm(&l[1], qd, qs, a3);
    for (int i = 0; i < I; i++) {
        float g = rbf(a1[i]), u = rbf(a3[i]);
        g = g > lim ? lim : g;
        u = u < -lim ? -lim : u > lim ? lim : u;
        float silu = f_div(g, f_add(1.0f, mpfr_ref_expf(-g)));
        h[i] = rbf(f_mul(wrow, f_mul(silu, u)));
    }
    t_quant(h, I, c->act_ue8m0, hd, hs);
    t_gemm(&l[2], hd, hs, out);
    for (int n = 0; n < H; n++)
        o[n] = t_bf16(out[n]);
    free(a1);
    free(a3);
    free(h);
    free(hs);
    free(hd);
    free(out);
}

/* The whole layer on one token. */
static void t_token(const t_layer *t, const uint16_t *x, int64_t tok, uint16_t *out, int32_t *ids,
                    float *wts)
{
    const mc_config *c = t->c;
    const gen_layer *g = t->g;
    int H = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok;
    float *xn = malloc(H * sizeof(float)), *sc = malloc(E * sizeof(float));
    double *qd = malloc(H * sizeof(double));
    float *qs = malloc(H / 128 * sizeof(float));
    uint16_t *o = malloc((size_t)(k + 1) * H * sizeof(uint16_t));

    double ss = 0;
    for (int i = 0; i < H; i++)
        ss += (double)bf(x[i]) * (double)bf(x[i]);
    float ms = (float)(ss / H);
    float r = f_div(1.0f, (float)sqrt((double)f_add(ms, c->rms_norm_eps)));
    for (int i = 0; i < H; i++)
        xn[i] = rbf(f_mul(bf(g->norm[i]), f_mul(bf(x[i]), r)));

    for (int e = 0; e < E; e++) {
        double s = 0;
        for (int i = 0; i < H; i++)
            s += (double)xn[i] * (double)bf(g->gate[(size_t)e * H + i]);
        float l = (float)s;
        sc[e] = (float)sqrt((double)(l > 20.0f ? l : mpfr_ref_log1pf(mpfr_ref_expf(l))));
    }
    if (g->hash) {
        for (int j = 0; j < k; j++)
            ids[j] = (int32_t)g->tid2eid[tok * k + j];
    } else {
        int taken[64] = {0};
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = 0;
            for (int e = 0; e < E; e++) {
                float v = f_add(sc[e], g->bias[e]);
                if (!taken[e] && (best < 0 || v > bv)) /* strict: ties keep the lower id */
                    best = e, bv = v;
            }
            taken[best] = 1;
            ids[j] = best;
        }
    }
    float sum = sc[ids[0]];
    for (int j = 1; j < k; j++)
        sum = f_add(sum, sc[ids[j]]);
    for (int j = 0; j < k; j++)
        wts[j] = f_mul(f_div(sc[ids[j]], sum), c->routed_scaling_factor);

    t_quant(xn, H, c->act_ue8m0, qd, qs);
    for (int j = 0; j < k; j++)
        t_mlp(t, t->ex[ids[j]], qd, qs, wts[j], o + (size_t)j * H);
    t_mlp(t, t->sh, qd, qs, 1.0f, o + (size_t)k * H);

    int order[64];
    for (int j = 0; j < k; j++)
        order[j] = j;
    for (int a = 1; a < k; a++) /* stable sort by id */
        for (int b = a; b > 0 && ids[order[b - 1]] > ids[order[b]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    for (int i = 0; i < H; i++) {
        float y = 0.0f;
        for (int j = 0; j < k; j++)
            y = f_add(y, bf(o[(size_t)order[j] * H + i]));
        y = f_add(y, bf(o[(size_t)k * H + i]));
        out[i] = t_bf16(y);
    }
    free(xn);
    free(sc);
    free(qd);
    free(qs);
    free(o);
}

/* ---- fixtures ---- */

enum { NT = 300 };

typedef struct fixture {
    mc_config c;
    gen_model *g;
    char dir[64];
    st_model *m;
    uint16_t *x;  /* [NT, H] */
    int64_t *tok; /* [NT] */
} fixture;

/* fp4: H 256, I 256, E 12, k 6; fp8: H 256, I 384, E 16, k 4, F32 activation scales. */
static int fixture_init(fixture *f, mc_expert_dtype dt)
{
    memset(f, 0, sizeof *f);
    f->c = dt == MC_FP4 ? gen_config(MC_FP4, 256, 256, 12, 6, 1000)
                        : gen_config(MC_FP8, 256, 384, 16, 4, 1000);
    if (dt == MC_FP8)
        f->c.act_ue8m0 = false;
    ep_err err = {0};
    if (mc_validate(&f->c, &err) < 0) {
        printf("  config: %s\n", err.msg);
        return -1;
    }
    gen_opts o = {.seed = dt == MC_FP4 ? 11 : 12};
    f->g = gen_model_create(&f->c, &o);
    snprintf(f->dir, sizeof f->dir, "/tmp/epmoe_test_moe_XXXXXX");
    if (!mkdtemp(f->dir) || gen_model_write(f->g, f->dir, &err) < 0 ||
        !(f->m = st_model_open(f->dir, &err))) {
        printf("  writing the checkpoint: %s\n", err.msg);
        return -1;
    }
    int H = f->c.hidden_size;
    f->x = malloc((size_t)NT * H * 2);
    f->tok = malloc(NT * sizeof(int64_t));
    uint64_t rs = 99 + dt;
    for (int t = 0; t < NT; t++) {
        /* most tokens ~N(0,1)-sized, a few large or tiny ones */
        double amp = t % 17 == 3 ? 300.0 : t % 23 == 5 ? 1e-3 : 1.7;
        for (int i = 0; i < H; i++)
            f->x[(size_t)t * H + i] = t_bf16((float)(amp * gen_unit(&rs)));
        f->tok[t] = (int64_t)(gen_rand(&rs) % (uint64_t)(f->c.vocab_size - 1));
    }
    return 0;
}

static void fixture_free(fixture *f)
{
    st_model_close(&f->m);
    gen_model_free(&f->g);
    if (f->dir[0])
        gen_model_remove(f->dir);
    free(f->x);
    free(f->tok);
}

static moe_layer *load(const fixture *f, int layer, const uint8_t *owned, isa_level impl)
{
    ep_err err = {0};
    moe_layer *l = shard_load_moe_layer(f->m, &f->c, layer, owned, impl, &err);
    if (!l)
        TEST_FAIL_AT("loading layer %d: %s", layer, err.msg);
    return l;
}

/* Outputs of T tokens. */
typedef struct outs {
    uint16_t *out;
    int32_t *ids;
    float *w;
} outs;

static outs outs_new(const mc_config *c, int T)
{
    outs o = {malloc((size_t)T * c->hidden_size * 2 + 1),
              malloc((size_t)T * c->num_experts_per_tok * 4 + 1),
              malloc((size_t)T * c->num_experts_per_tok * 4 + 1)};
    return o;
}

static void outs_free(outs *o)
{
    free(o->out);
    free(o->ids);
    free(o->w);
}

/* First difference between token rows [a0, a0+T) of a and [b0, b0+T) of b, or -1. */
static int outs_diff(const mc_config *c, const outs *a, int a0, const outs *b, int b0, int T,
                     const char **what)
{
    int H = c->hidden_size, k = c->num_experts_per_tok;
    for (int t = 0; t < T; t++) {
        if (memcmp(a->ids + (size_t)(a0 + t) * k, b->ids + (size_t)(b0 + t) * k, k * 4)) {
            *what = "topk_ids";
            return t;
        }
        if (memcmp(a->w + (size_t)(a0 + t) * k, b->w + (size_t)(b0 + t) * k, k * 4)) {
            *what = "topk_weights";
            return t;
        }
        if (memcmp(a->out + (size_t)(a0 + t) * H, b->out + (size_t)(b0 + t) * H, H * 2)) {
            *what = "out";
            return t;
        }
    }
    return -1;
}

static int run_forward(const fixture *f, const moe_layer *l, int t0, int T, outs *o, int o0,
                       tpool *pool)
{
    ep_err err = {0};
    int H = f->c.hidden_size, k = f->c.num_experts_per_tok;
    int rc = moe_forward(l, T, f->x + (size_t)t0 * H, f->tok + t0, o->out + (size_t)o0 * H,
                         o->ids + (size_t)o0 * k, o->w + (size_t)o0 * k, pool, &err);
    if (rc < 0)
        TEST_FAIL_AT("moe_forward: %s", err.msg);
    return rc;
}

/* ---- bit-exactness against the float64 model ---- */

static void check_layer_bitwise(fixture *f, int layer, tpool *pool)
{
    const mc_config *c = &f->c;
    t_layer ref;
    t_layer_init(&ref, c, &f->g->layers[layer]);
    outs want = outs_new(c, NT);
    int H = c->hidden_size, k = c->num_experts_per_tok;
    for (int t = 0; t < NT; t++)
        t_token(&ref, f->x + (size_t)t * H, f->tok[t], want.out + (size_t)t * H,
                want.ids + (size_t)t * k, want.w + (size_t)t * k);
    t_layer_free(&ref);

    moe_layer *l = load(f, layer, NULL, ISA_AUTO);
    static const int ranges[][2] = {{299, 1}, {13, 7}, {200, 64}, {0, NT}};
    outs got = outs_new(c, NT);
    for (int r = 0; l && r < 4; r++) {
        int t0 = ranges[r][0], T = ranges[r][1];
        if (run_forward(f, l, t0, T, &got, 0, pool) < 0)
            continue;
        const char *what = "";
        int d = outs_diff(c, &got, 0, &want, t0, T, &what);
        if (d >= 0)
            TEST_FAIL_AT("%s layer %d, T=%d: token %d differs from the float64 model in %s",
                         mc_dtype_name(c->expert_dtype), layer, T, t0 + d, what);
    }
    moe_layer_free(&l);
    /* the reference GEMMs give the same bits */
    l = load(f, layer, NULL, ISA_REF);
    if (l && run_forward(f, l, 13, 7, &got, 0, NULL) == 0) {
        const char *what = "";
        int d = outs_diff(c, &got, 0, &want, 13, 7, &what);
        if (d >= 0)
            TEST_FAIL_AT("%s layer %d, ref impl: token %d differs in %s",
                         mc_dtype_name(c->expert_dtype), layer, 13 + d, what);
    }
    moe_layer_free(&l);
    outs_free(&want);
    outs_free(&got);
}

static fixture FX[2];
static int fx_ok[2];

TEST(layer_matches_float64_model_bitwise)
{
    ep_err err = {0};
    tpool *pool = tpool_create(2, &err);
    CHECK(pool != NULL);
    for (int d = 0; d < 2; d++) {
        if (!fx_ok[d])
            continue;
        check_layer_bitwise(&FX[d], 0, pool); /* hash */
        check_layer_bitwise(&FX[d], 1, pool); /* score */
        check_layer_bitwise(&FX[d], 3, pool); /* mtp.0 */
    }
    tpool_destroy(&pool);
}

/* ---- invariances ---- */

static void check_invariance(fixture *f, int layer)
{
    const mc_config *c = &f->c;
    int H = c->hidden_size, k = c->num_experts_per_tok, E = c->n_routed_experts;
    ep_err err = {0};
    tpool *pools[3] = {tpool_create(1, &err), tpool_create(2, &err), tpool_create(3, &err)};
    moe_layer *l = load(f, layer, NULL, ISA_AUTO);
    if (!l || !pools[0] || !pools[1] || !pools[2])
        goto out;
    outs base = outs_new(c, NT), got = outs_new(c, NT);
    run_forward(f, l, 0, NT, &base, 0, pools[1]);
    const char *what = "";
    int d;

    /* thread counts, and no pool at all */
    for (int p = -1; p < 3; p++) {
        run_forward(f, l, 0, NT, &got, 0, p < 0 ? NULL : pools[p]);
        if ((d = outs_diff(c, &got, 0, &base, 0, NT, &what)) >= 0)
            TEST_FAIL_AT("layer %d, %d threads: token %d differs in %s", layer, p < 0 ? 0 : p + 1,
                         d, what);
    }
    /* the batch split in pieces */
    static const int pieces[] = {1, 2, 50, 247};
    for (int i = 0, t0 = 0; i < 4; t0 += pieces[i++])
        run_forward(f, l, t0, pieces[i], &got, t0, pools[2]);
    if ((d = outs_diff(c, &got, 0, &base, 0, NT, &what)) >= 0)
        TEST_FAIL_AT("layer %d, split batch: token %d differs in %s", layer, d, what);

    /* shuffled tokens */
    {
        fixture sh = *f;
        int perm[NT];
        uint64_t rs = 7;
        for (int t = 0; t < NT; t++)
            perm[t] = t;
        for (int t = NT - 1; t > 0; t--) {
            int r = (int)(gen_rand(&rs) % (uint64_t)(t + 1)), tmp = perm[t];
            perm[t] = perm[r];
            perm[r] = tmp;
        }
        sh.x = malloc((size_t)NT * H * 2);
        sh.tok = malloc(NT * sizeof(int64_t));
        for (int t = 0; t < NT; t++) {
            memcpy(sh.x + (size_t)t * H, f->x + (size_t)perm[t] * H, H * 2);
            sh.tok[t] = f->tok[perm[t]];
        }
        run_forward(&sh, l, 0, NT, &got, 0, pools[1]);
        for (int t = 0; t < NT; t++)
            if ((d = outs_diff(c, &got, t, &base, perm[t], 1, &what)) >= 0) {
                TEST_FAIL_AT("layer %d, shuffled: token %d differs in %s", layer, perm[t], what);
                break;
            }
        free(sh.x);
        free(sh.tok);
    }

    /* experts split over 1..4 owners (expert e on shard e % S, so ownership is not
     * contiguous): route on shard 0, run every pair on its owner in a scrambled order, combine */
    for (int S = 1; S <= 4; S++) {
        moe_layer *shard[4] = {0};
        uint8_t owned[4][64];
        int ok = 1;
        for (int s = 0; s < S; s++) {
            for (int e = 0; e < E; e++)
                owned[s][e] = e % S == s;
            ok &= (shard[s] = load(f, layer, owned[s], ISA_AUTO)) != NULL;
        }
        uint16_t *xn = malloc((size_t)NT * H * 2), *eo = malloc((size_t)NT * k * H * 2);
        uint16_t *shv = malloc((size_t)NT * H * 2), *po = malloc((size_t)NT * k * H * 2);
        uint8_t *q = malloc((size_t)NT * H);
        float *qs = malloc((size_t)NT * H / 128 * 4), *pw = malloc((size_t)NT * k * 4);
        uint32_t *prow = malloc((size_t)NT * k * 4), *pexp = malloc((size_t)NT * k * 4);
        uint32_t *pslot = malloc((size_t)NT * k * 4);
        if (ok && moe_route(shard[0], NT, f->x, f->tok, xn, got.ids, got.w, NULL, &err) < 0) {
            TEST_FAIL_AT("moe_route: %s", err.msg);
            ok = 0;
        }
        if (ok) {
            moe_quant(shard[0], NT, xn, q, qs);
            for (int s = 0; s < S && ok; s++) {
                int n = 0;
                for (int i = NT * k - 1; i >= 0; i--) /* reversed: pairs come in any order */
                    if (moe_layer_owns(shard[s], got.ids[i])) {
                        prow[n] = (uint32_t)(i / k);
                        pexp[n] = (uint32_t)got.ids[i];
                        pw[n] = got.w[i];
                        pslot[n++] = (uint32_t)i;
                    }
                if (moe_experts(shard[s], NT, q, qs, n, prow, pexp, pw, po, pools[s % 3], &err) <
                    0) {
                    TEST_FAIL_AT("moe_experts: %s", err.msg);
                    ok = 0;
                }
                for (int p = 0; p < n; p++)
                    memcpy(eo + (size_t)pslot[p] * H, po + (size_t)p * H, H * 2);
            }
        }
        if (ok && moe_shared(shard[S - 1], NT, q, qs, shv, pools[0], &err) < 0) {
            TEST_FAIL_AT("moe_shared: %s", err.msg);
            ok = 0;
        }
        if (ok) {
            moe_combine(NT, k, H, got.ids, eo, shv, got.out);
            if ((d = outs_diff(c, &got, 0, &base, 0, NT, &what)) >= 0)
                TEST_FAIL_AT("layer %d, %d shards: token %d differs in %s", layer, S, d, what);
        }
        for (int s = 0; s < S; s++)
            moe_layer_free(&shard[s]);
        free(xn);
        free(eo);
        free(shv);
        free(po);
        free(q);
        free(qs);
        free(pw);
        free(prow);
        free(pexp);
        free(pslot);
    }
    outs_free(&base);
    outs_free(&got);
out:
    moe_layer_free(&l);
    for (int p = 0; p < 3; p++)
        tpool_destroy(&pools[p]);
}

TEST(outputs_independent_of_batch_order_threads_and_shards)
{
    for (int d = 0; d < 2; d++) {
        if (!fx_ok[d])
            continue;
        check_invariance(&FX[d], 0);
        check_invariance(&FX[d], 2);
    }
}

/* ---- one layer, several callers ---- */

typedef struct caller {
    const fixture *f;
    const moe_layer *l;
    outs o;
    int rc;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    ep_err err = {0};
    tpool *pool = tpool_create(2, &err);
    int H = c->f->c.hidden_size;
    c->rc = pool ? 0 : -1;
    for (int rep = 0; rep < 3 && c->rc == 0; rep++) /* overlapping runs */
        c->rc = moe_forward(c->l, 64, c->f->x + (size_t)100 * H, c->f->tok + 100, c->o.out,
                            c->o.ids, c->o.w, pool, &err);
    tpool_destroy(&pool);
    return NULL;
}

TEST(concurrent_callers_share_one_layer)
{
    if (!fx_ok[0])
        SKIP("no fixture");
    fixture *f = &FX[0];
    moe_layer *l = load(f, 1, NULL, ISA_AUTO);
    if (!l)
        return;
    outs base = outs_new(&f->c, 64);
    run_forward(f, l, 100, 64, &base, 0, NULL);
    caller cs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        cs[i] = (caller){.f = f, .l = l, .o = outs_new(&f->c, 64)};
        CHECK_EQ(pthread_create(&th[i], NULL, caller_main, &cs[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(cs[i].rc, 0);
        const char *what = "";
        int d = outs_diff(&f->c, &cs[i].o, 0, &base, 0, 64, &what);
        if (d >= 0)
            TEST_FAIL_AT("caller %d: token %d differs in %s", i, d, what);
        outs_free(&cs[i].o);
    }
    outs_free(&base);
    moe_layer_free(&l);
}

/* ---- combine ---- */

TEST(combine_sums_in_ascending_expert_id_and_skips_padding)
{
    /* Three slots whose fp32 sum depends on the order: 1 + 2^-24 + 2^-24. In id order
     * (ids 2, 5, 9 -> values 2^-24, 2^-24, 1) it is 1 + 2^-23; in slot order it would be 1. */
    enum { H = 2, K = 4 };
    int32_t ids[K] = {9, 5, -1, 2};
    uint16_t eo[K * H], sh[H] = {0, 0}, out[H];
    uint16_t one = t_bf16(1.0f), tiny = t_bf16(ldexpf(1.0f, -24));
    uint16_t vals[K] = {one, tiny, t_bf16(1000.0f) /* padding: must be ignored */, tiny};
    for (int j = 0; j < K; j++)
        for (int h = 0; h < H; h++)
            eo[j * H + h] = vals[j];
    moe_combine(1, K, H, ids, eo, sh, out);
    /* 2^-24 + 2^-24 = 2^-23, + 1 = 1 + 2^-23 (exact in fp32), bf16 -> 1.0 */
    CHECK_EQ(out[0], one);
    /* the fp32 value before rounding is observable with a shared term that cancels 1 */
    sh[0] = t_bf16(-1.0f);
    moe_combine(1, K, H, ids, eo, sh, out);
    CHECK_EQ(out[0], t_bf16(ldexpf(1.0f, -23)));
    /* equal ids keep slot order and both count */
    int32_t dup[K] = {3, 3, -1, -1};
    uint16_t e2[K * H] = {one, tiny, tiny, tiny, 0, 0, 0, 0};
    uint16_t z[H] = {0, 0};
    moe_combine(1, K, H, dup, e2, z, out);
    CHECK_EQ(out[0], t_bf16(1.0f + ldexpf(1.0f, -24)));
    CHECK_EQ(out[1], t_bf16(2.0f * ldexpf(1.0f, -24)));
}

/* ---- errors and loading ---- */

TEST(route_errors_name_the_token_and_value)
{
    if (!fx_ok[0])
        SKIP("no fixture");
    fixture *f = &FX[0];
    const mc_config *c = &f->c;
    int H = c->hidden_size;
    moe_layer *l = load(f, 0, NULL, ISA_AUTO);
    if (!l)
        return;
    outs o = outs_new(c, 8);
    uint16_t *xn = malloc((size_t)8 * H * 2);
    ep_err err = {0};
    CHECK_EQ(moe_forward(l, 4, f->x, NULL, o.out, o.ids, o.w, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "layers.0");
    CHECK_STR_HAS(err.msg, "token ids are required");
    CHECK_EQ(moe_route(l, 4, f->x, NULL, xn, o.ids, o.w, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "token ids are required");
    int64_t ids[4] = {1, 2, 3, c->vocab_size};
    CHECK_EQ(moe_forward(l, 4, f->x, ids, o.out, o.ids, o.w, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "token 3: id 1000 outside the vocabulary [0, 1000)");
    ids[3] = -7;
    CHECK_EQ(moe_route(l, 4, f->x, ids, xn, o.ids, o.w, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "token 3: id -7");
    CHECK_EQ(moe_forward(l, -1, f->x, ids, o.out, o.ids, o.w, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "-1 tokens");
    CHECK_EQ(moe_forward(l, EP_MAX_TOKENS + 1, f->x, ids, o.out, o.ids, o.w, NULL, &err), -1);
    CHECK_STR_HAS(err.msg, "tokens, expected 0..");
    CHECK_EQ(moe_forward(l, 0, f->x, ids, o.out, o.ids, o.w, NULL, &err), 0);
    moe_layer_free(&l);

    /* score layers ignore ids, even absent ones */
    l = load(f, 1, NULL, ISA_AUTO);
    if (l)
        CHECK_EQ(moe_forward(l, 2, f->x, NULL, o.out, o.ids, o.w, NULL, &err), 0);
    moe_layer_free(&l);

    /* experts this layer does not own */
    uint8_t owned[64] = {0};
    owned[1] = owned[4] = 1;
    l = load(f, 1, owned, ISA_AUTO);
    if (l) {
        CHECK(moe_layer_owns(l, 4));
        CHECK(!moe_layer_owns(l, 5));
        CHECK(!moe_layer_owns(l, -1));
        CHECK(!moe_layer_owns(l, c->n_routed_experts));
        uint8_t *q = calloc((size_t)2 * H, 1);
        float qs[4] = {1, 1, 1, 1}, pw[2] = {1, 1};
        uint32_t prow[2] = {0, 1}, pexp[2] = {4, 5};
        CHECK_EQ(moe_experts(l, 2, q, qs, 2, prow, pexp, pw, o.out, NULL, &err), -1);
        CHECK_STR_HAS(err.msg, "pair 1: expert 5 is not loaded here");
        pexp[1] = 1;
        prow[1] = 2;
        CHECK_EQ(moe_experts(l, 2, q, qs, 2, prow, pexp, pw, o.out, NULL, &err), -1);
        CHECK_STR_HAS(err.msg, "pair 1: row 2 outside [0, 2)");
        prow[1] = 1;
        CHECK_EQ(moe_experts(l, 2, q, qs, 2, prow, pexp, pw, o.out, NULL, &err), 0);
        /* the whole layer needs every selected expert */
        CHECK_EQ(moe_forward(l, 8, f->x, NULL, o.out, o.ids, o.w, NULL, &err), -1);
        CHECK_STR_HAS(err.msg, "is not loaded here");
        free(q);
    }
    moe_layer_free(&l);
    outs_free(&o);
    free(xn);
}

typedef struct prog {
    uint64_t last, total;
    int calls, backwards;
} prog;

static void on_progress(void *ctx, uint64_t done)
{
    prog *p = ctx;
    if (done < p->last)
        p->backwards++;
    p->last = done;
    p->calls++;
}

/* The shard loader through the CPU backend (what a worker does): progress in checkpoint bytes,
 * only the wanted experts loaded, and a new placement that reuses an old layer's experts reads
 * only the router and the experts it gains — and computes the same bits. */
TEST(load_reports_progress_loads_only_owned_experts_and_reuses_kept_ones)
{
    if (!fx_ok[1])
        SKIP("no fixture");
    fixture *f = &FX[1];
    const mc_config *c = &f->c;
    ep_err err = {0};
    prog p = {0};
    mb_options bo = {.device = "cpu", .threads = 2};
    mb_backend *be = mb_create(&bo, &err);
    CHECK(be != NULL);
    if (!be)
        return;
    mb_layer *all = shard_load_layer(be, f->m, c, 1, NULL, NULL, on_progress, &p, &err);
    CHECK(all != NULL);
    uint64_t want = shard_layer_bytes(f->m, c, 1, NULL, NULL, false);
    CHECK(p.calls > 3);
    CHECK_EQ(p.backwards, 0);
    CHECK_EQ(p.last, want);
    /* the sum of the tensor sizes the contract lists */
    int n = ck_layer_tensor_count(c, 1, 0, c->n_routed_experts);
    ck_tensor_spec *specs = malloc((size_t)n * sizeof *specs);
    ck_layer_tensors(c, 1, 0, c->n_routed_experts, specs, n);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += st_model_find(f->m, specs[i].name)->nbytes;
    CHECK_EQ(want, sum);
    free(specs);

    uint8_t owned[64] = {0};
    owned[0] = owned[7] = owned[15] = 1;
    p = (prog){0};
    mb_layer *some = shard_load_layer(be, f->m, c, 1, owned, NULL, on_progress, &p, &err);
    CHECK(some != NULL);
    if (all && some) {
        CHECK(mb_layer_bytes(some) < mb_layer_bytes(all));
        CHECK_EQ(p.last, shard_layer_bytes(f->m, c, 1, owned, NULL, false));
        CHECK(p.last < want);
        for (int e = 0; e < c->n_routed_experts; e++)
            CHECK_EQ(mb_layer_owns(some, e), owned[e] != 0);
        CHECK_EQ(mb_layer_index(some), 1);
    }
    /* a new placement keeping experts 0 and 7, gaining 3: only the router and expert 3 are read */
    uint8_t next[64] = {0}, have[64] = {0};
    next[0] = next[7] = next[3] = 1;
    have[0] = have[7] = have[15] = 1;
    p = (prog){0};
    mb_layer *moved =
        some ? shard_load_layer(be, f->m, c, 1, next, some, on_progress, &p, &err) : NULL;
    CHECK(moved != NULL);
    if (moved) {
        CHECK_EQ(p.last, shard_layer_bytes(f->m, c, 1, next, have, true));
        CHECK(p.last < shard_layer_bytes(f->m, c, 1, next, NULL, false));
        for (int e = 0; e < c->n_routed_experts; e++)
            CHECK_EQ(mb_layer_owns(moved, e), next[e] != 0);
        /* the kept and the gained experts compute what a fresh load of all experts does */
        int H = c->hidden_size, R = 3;
        uint16_t *x = malloc((size_t)R * H * 2), *o1 = malloc((size_t)R * 3 * H * 2),
                 *o2 = malloc((size_t)R * 3 * H * 2);
        uint8_t *q = malloc((size_t)R * H);
        float *qs = malloc((size_t)R * (H / 128) * 4);
        for (int i = 0; i < R * H; i++)
            x[i] = fmt_f32_to_bf16((float)((i * 37) % 101 - 50) / 17.0f);
        CHECK_EQ(mb_quant(be, moved, R, x, q, qs, &err), 0);
        uint32_t prow[9], pexp[9];
        float pw[9];
        for (int i = 0; i < 9; i++) {
            prow[i] = (uint32_t)(i % R);
            pexp[i] = i % 3 == 0 ? 0u : i % 3 == 1 ? 7u : 3u;
            pw[i] = 0.25f * (float)(i + 1);
        }
        CHECK_EQ(mb_experts(be, moved, R, q, qs, 9, prow, pexp, pw, o1, &err), 0);
        CHECK_EQ(mb_experts(be, all, R, q, qs, 9, prow, pexp, pw, o2, &err), 0);
        CHECK(memcmp(o1, o2, (size_t)9 * H * 2) == 0);
        /* the old layer still serves after lending its experts */
        mb_layer_free(&some);
        CHECK_EQ(mb_experts(be, moved, R, q, qs, 9, prow, pexp, pw, o1, &err), 0);
        CHECK(memcmp(o1, o2, (size_t)9 * H * 2) == 0);
        free(x), free(o1), free(o2), free(q), free(qs);
    }
    mb_layer_free(&all);
    mb_layer_free(&some);
    mb_layer_free(&moved);
    mb_layer_free(&some); /* tolerates NULL */
    mb_destroy(&be);
}

TEST(load_errors_name_the_tensor)
{
    if (!fx_ok[0])
        SKIP("no fixture");
    fixture *f = &FX[0];
    ep_err err = {0};
    /* an fp8 config over fp4 tensors */
    mc_config c8 = f->c;
    c8.expert_dtype = MC_FP8;
    c8.scale_e8m0 = false;
    CHECK(shard_load_moe_layer(f->m, &c8, 1, NULL, ISA_AUTO, &err) == NULL);
    CHECK_STR_HAS(err.msg, "loading layers.1");
    CHECK_STR_HAS(err.msg, "layers.1.ffn.experts.0.w1.weight");
    CHECK(shard_load_moe_layer(f->m, &f->c, 4, NULL, ISA_AUTO, &err) == NULL);
    CHECK_STR_HAS(err.msg, "layer 4 outside [0, 4)");

    /* a NaN (255) scale code in expert 5 of layer 2: fatal when that expert is loaded only */
    gen_linear *w2 = &f->g->layers[2].experts[5 * 3 + 2];
    uint8_t saved = w2->s8[3];
    w2->s8[3] = 0xFF;
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/epmoe_test_moe_XXXXXX");
    st_model *m = NULL;
    if (!mkdtemp(dir) || gen_model_write(f->g, dir, &err) < 0 || !(m = st_model_open(dir, &err)))
        TEST_FAIL_AT("writing: %s", err.msg);
    w2->s8[3] = saved;
    if (m) {
        CHECK(shard_load_moe_layer(m, &f->c, 2, NULL, ISA_AUTO, &err) == NULL);
        CHECK_STR_HAS(err.msg, "\"layers.2.ffn.experts.5.w2.scale\": element [0, 3] is scale code "
                               "255 (NaN)");
        uint8_t owned[64] = {0};
        owned[4] = owned[6] = 1;
        moe_layer *l = shard_load_moe_layer(m, &f->c, 2, owned, ISA_AUTO, &err);
        CHECK(l != NULL);
        moe_layer_free(&l);
    }
    st_model_close(&m);
    gen_model_remove(dir);
}

int main(void)
{
    test_isa_cap_from_env();
    /* a per-instruction-set run (EPMOE_ISA) on a CPU without that set would only repeat the
     * default run */
    const char *isa = getenv("EPMOE_ISA");
    isa_level want;
    if (isa && isa_parse(isa, &want) == 0 && !isa_supported(want)) {
        printf("SKIP: this CPU lacks %s\n", isa);
        return 77;
    }
    printf("implementation: %s\n", isa_name(isa_best()));
    fx_ok[0] = fixture_init(&FX[0], MC_FP4) == 0;
    fx_ok[1] = fixture_init(&FX[1], MC_FP8) == 0;
    RUN(layer_matches_float64_model_bitwise);
    RUN(outputs_independent_of_batch_order_threads_and_shards);
    RUN(concurrent_callers_share_one_layer);
    RUN(combine_sums_in_ascending_expert_id_and_skips_padding);
    RUN(route_errors_name_the_token_and_value);
    RUN(load_reports_progress_loads_only_owned_experts_and_reuses_kept_ones);
    RUN(load_errors_name_the_tensor);
    if (!fx_ok[0] || !fx_ok[1])
        TEST_FAIL_AT("a fixture could not be built");
    fixture_free(&FX[0]);
    fixture_free(&FX[1]);
    return test_report();
}
