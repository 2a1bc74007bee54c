/*
 * test_cuda_kernels.c — every CUDA kernel of the backend (kernels/cuda/cuda_dev.h) against the
 * CPU reference on random and adversarial inputs: bit for bit for the exact kernels, spec §7's
 * tolerance (DeepGEMM calc_diff) for the tensor-core GEMMs.
 *
 * Inputs: activations with outliers, tiny values, zeros and (where the definition says what
 * happens) NaN; e4m3 weight codes over the whole range including subnormals; scales of both
 * kinds (powers of two and plain fp32); groups of 1 to 200 rows; K not a multiple of the
 * kernels' 1024/512-wide passes. Exits 77 (skipped) without a CUDA device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/knobs.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/mathf.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/route.h"
#include "kernels/swiglu.h"
#include "test.h"

static const cudev_ops *D;

/* The EPMOE_CUDA_* knobs as this test sets them (setenv): the kernels take them from each GEMM
 * (cudev_gemm.tune), never from the environment. */
static const mb_cuda_tuning *tk_tune(void)
{
    static mb_cuda_tuning t;
    t = (mb_cuda_tuning){0};
    knob_values kv;
    ep_err err = {0};
    if (knob_load(&kv, KNOB_WORKER, &err) == 0)
        mb_cuda_tuning_from_knobs(&t, &kv);
    return &t;
}
static cudev *dev;

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static float gauss(void)
{
    float s = 0;
    for (int i = 0; i < 6; i++)
        s += (float)(rnd() & 0xFFFF) / 65536.0f;
    return s - 3.0f;
}

/* bf16 activations with outliers, tiny values and zeros */
static void fill_act(uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = gauss();
        uint32_t r = rnd() % 64;
        if (r == 0)
            v *= 1e-6f;
        else if (r == 1)
            v *= 300.0f;
        else if (r == 2)
            v = 0.0f;
        x[i] = fmt_f32_to_bf16(v);
    }
}

static uint8_t rand_e4m3(void)
{
    uint8_t c;
    do
        c = (uint8_t)rnd();
    while ((c & 0x7F) == 0x7F);
    return c;
}

/* ---- device helpers ---- */

static void *dput(const void *h, size_t n)
{
    void *d = NULL;
    ep_err err;
    if (D->alloc(dev, &d, n ? n : 1, &err) < 0 || (h && n && D->h2d(dev, d, h, n, &err) < 0)) {
        printf("  device: %s\n", err.msg);
        exit(1);
    }
    return d;
}

static int dsync(ep_err *err)
{
    for (;;) {
        int q = D->query(dev, err);
        if (q <= 0)
            return q;
    }
}

static void dget(void *h, const void *d, size_t n)
{
    ep_err err;
    if (D->d2h(dev, h, d, n, &err) < 0 || dsync(&err) < 0) {
        printf("  device: %s\n", err.msg);
        exit(1);
    }
}

static int same_bits(const void *a, const void *b, size_t n, const char *what)
{
    if (memcmp(a, b, n) == 0)
        return 1;
    const uint8_t *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i])
        i++;
    printf("  %s differs first at byte %zu of %zu (%02x vs %02x)\n", what, i, n, x[i], y[i]);
    return 0;
}

/* f32 arrays equal bit for bit, any NaN equal to any NaN */
static int same_f32(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], 4) != 0) {
            printf("  %s differs first at %zu of %zu: %a vs %a\n", what, i, n, a[i], b[i]);
            return 0;
        }
    return 1;
}

#define NEED_DEVICE()                                                                              \
    do {                                                                                           \
        if (!dev)                                                                                  \
            SKIP("no CUDA device");                                                                \
    } while (0)

/* ---- router ---- */

TEST(rmsnorm_and_logits_match_the_reference)
{
    NEED_DEVICE();
    static const int shapes[][3] = {{1, 4096, 256}, {37, 4096, 256}, {5, 256, 16}, {3, 7168, 384}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int T = shapes[s][0], H = shapes[s][1], E = shapes[s][2];
        uint16_t *x = malloc((size_t)T * H * 2), *g = malloc((size_t)H * 2);
        uint16_t *gate = malloc((size_t)E * H * 2), *gate_t = malloc((size_t)E * H * 2);
        uint16_t *xn = malloc((size_t)T * H * 2), *xn_d = malloc((size_t)T * H * 2);
        float *lg = malloc((size_t)T * E * 4), *lg_d = malloc((size_t)T * E * 4);
        fill_act(x, (size_t)T * H);
        for (int i = 0; i < H; i++)
            g[i] = fmt_f32_to_bf16(1.0f + 0.1f * gauss());
        for (int i = 0; i < E * H; i++)
            gate[i] = fmt_f32_to_bf16(0.02f * gauss());
        for (int e = 0; e < E; e++)
            for (int k = 0; k < H; k++)
                gate_t[(size_t)k * E + e] = gate[(size_t)e * H + k];
        route_rmsnorm(ISA_REF, T, H, x, g, 1e-6f, xn);
        route_logits(ISA_REF, T, H, E, xn, gate, lg, NULL);
        void *dx = dput(x, (size_t)T * H * 2), *dg = dput(g, (size_t)H * 2);
        void *dgt = dput(gate_t, (size_t)E * H * 2), *dxn = dput(NULL, (size_t)T * H * 2);
        void *dl = dput(NULL, (size_t)T * E * 4);
        ep_err err;
        CHECK_EQ(D->rmsnorm(dev, T, H, dx, dg, 1e-6f, dxn, &err), 0);
        CHECK_EQ(D->logits(dev, T, H, E, dxn, dgt, dl, &err), 0);
        dget(xn_d, dxn, (size_t)T * H * 2);
        dget(lg_d, dl, (size_t)T * E * 4);
        CHECK(same_bits(xn, xn_d, (size_t)T * H * 2, "rmsnorm"));
        CHECK(same_f32(lg, lg_d, (size_t)T * E, "logits"));
        D->free(dev, dx), D->free(dev, dg), D->free(dev, dgt), D->free(dev, dxn), D->free(dev, dl);
        free(x), free(g), free(gate), free(gate_t), free(xn), free(xn_d), free(lg), free(lg_d);
    }
}

/* ---- quantizer, SwiGLU, combine, data movement ---- */

TEST(quantizer_matches_the_reference)
{
    NEED_DEVICE();
    for (int pow2 = 0; pow2 < 2; pow2++) {
        int M = 41, K = 4096;
        uint16_t *x = malloc((size_t)M * K * 2);
        uint8_t *q = malloc((size_t)M * K), *qd = malloc((size_t)M * K);
        float *s = malloc((size_t)M * K / 128 * 4), *sd = malloc((size_t)M * K / 128 * 4);
        fill_act(x, (size_t)M * K);
        x[5] = 0x7FC0;                /* a NaN: its block's codes 0x7F, scale NaN */
        x[3 * K + 200] = 0x7F80;      /* +inf */
        for (int i = 0; i < 128; i++) /* an all-zero block: amax floor 1e-4 */
            x[7 * K + 256 + i] = 0;
        qt_act_rows_impl(ISA_REF, x, M, K, pow2, q, s);
        void *dx = dput(x, (size_t)M * K * 2), *dq = dput(NULL, (size_t)M * K);
        void *ds = dput(NULL, (size_t)M * K / 128 * 4);
        ep_err err;
        CHECK_EQ(D->quant(dev, M, K, pow2, dx, dq, ds, &err), 0);
        dget(qd, dq, (size_t)M * K);
        dget(sd, ds, (size_t)M * K / 128 * 4);
        CHECK(same_bits(q, qd, (size_t)M * K, pow2 ? "quant codes (pow2)" : "quant codes"));
        CHECK(same_f32(s, sd, (size_t)M * K / 128, "quant scales"));
        D->free(dev, dx), D->free(dev, dq), D->free(dev, ds);
        free(x), free(q), free(qd), free(s), free(sd);
    }
}

TEST(swiglu_with_the_exp_table_matches_the_reference)
{
    NEED_DEVICE();
    int M = 33, I = 2048;
    float limit = 10.0f;
    float *a1 = malloc((size_t)M * I * 4), *a3 = malloc((size_t)M * I * 4), w[64];
    float *tab = malloc(65536 * 4);
    for (uint32_t h = 0; h < 65536; h++)
        tab[h] = mf_expf(-fmt_bf16_to_f32((uint16_t)h)); /* as backend_cuda.c builds it */
    for (size_t i = 0; i < (size_t)M * I; i++) {
        a1[i] = 4.0f * gauss() + (i % 101 == 0 ? 30.0f : 0.0f); /* some above the limit */
        a3[i] = 4.0f * gauss() - (i % 103 == 0 ? 30.0f : 0.0f);
        if (i % 997 == 0)
            a1[i] = -90.0f; /* exp(-g) overflows to inf: silu = -0 */
    }
    for (int m = 0; m < M; m++)
        w[m] = 0.05f + 0.9f * (float)(rnd() % 1000) / 1000.0f;
    for (int pass = 0; pass < 3; pass++) { /* weights, no weights (shared), non-pow2 scales */
        bool pow2 = pass != 2;
        const float *wr = pass == 1 ? NULL : w;
        uint8_t *q = malloc((size_t)M * I), *qd = malloc((size_t)M * I);
        float *s = malloc((size_t)M * I / 128 * 4), *sd = malloc((size_t)M * I / 128 * 4);
        swiglu_rows_impl(ISA_REF, a1, a3, M, I, wr, limit, pow2, q, s);
        void *d1 = dput(a1, (size_t)M * I * 4), *d3 = dput(a3, (size_t)M * I * 4);
        void *dw = dput(w, sizeof w), *dt = dput(tab, 65536 * 4);
        void *dq = dput(NULL, (size_t)M * I), *ds = dput(NULL, (size_t)M * I / 128 * 4);
        ep_err err;
        CHECK_EQ(D->swiglu(dev, M, I, d1, d3, 0, wr ? dw : NULL, limit, pow2, dt, mf_expf(-limit),
                           dq, ds, &err),
                 0);
        dget(qd, dq, (size_t)M * I);
        dget(sd, ds, (size_t)M * I / 128 * 4);
        CHECK(same_bits(q, qd, (size_t)M * I, "swiglu codes"));
        CHECK(same_f32(s, sd, (size_t)M * I / 128, "swiglu scales"));
        D->free(dev, d1), D->free(dev, d3), D->free(dev, dw), D->free(dev, dt), D->free(dev, dq);
        D->free(dev, ds);
        free(q), free(qd), free(s), free(sd);
    }
    free(a1), free(a3), free(tab);
}

TEST(combine_gather_scatter_match_the_reference)
{
    NEED_DEVICE();
    int T = 29, k = 6, H = 4096;
    int32_t *ids = malloc((size_t)T * k * 4);
    uint16_t *eo = malloc((size_t)T * k * H * 2), *sh = malloc((size_t)T * H * 2);
    uint16_t *out = malloc((size_t)T * H * 2), *outd = malloc((size_t)T * H * 2);
    for (int i = 0; i < T * k; i++)
        ids[i] = (int32_t)(rnd() % 256);
    ids[3] = ids[4]; /* a tie: slot order */
    ids[10] = -1;    /* padding: skipped */
    fill_act(eo, (size_t)T * k * H);
    fill_act(sh, (size_t)T * H);
    moe_combine(T, k, H, ids, eo, sh, out);
    void *di = dput(ids, (size_t)T * k * 4), *de = dput(eo, (size_t)T * k * H * 2);
    void *dsh = dput(sh, (size_t)T * H * 2), *dout = dput(NULL, (size_t)T * H * 2);
    ep_err err;
    CHECK_EQ(D->combine(dev, T, k, H, di, de, dsh, dout, &err), 0);
    dget(outd, dout, (size_t)T * H * 2);
    CHECK(same_bits(out, outd, (size_t)T * H * 2, "combine"));
    /* gather rows (f32 and e8m0 scales) and scatter them back */
    int n = 17;
    uint32_t rows[17];
    uint8_t *q = malloc((size_t)T * H), *g = malloc((size_t)n * H);
    float *qs = malloc((size_t)T * H / 128 * 4), *gs = malloc((size_t)n * H / 128 * 4);
    uint8_t *ge = malloc((size_t)n * H / 128);
    for (int i = 0; i < T * H; i++)
        q[i] = rand_e4m3();
    for (int i = 0; i < T * H / 128; i++)
        qs[i] = fmt_e8m0_to_f32((uint8_t)(100 + rnd() % 40));
    for (int i = 0; i < n; i++)
        rows[i] = (uint32_t)((i * 7 + 3) % T);
    void *dr = dput(rows, sizeof rows), *dq = dput(q, (size_t)T * H);
    void *dqs = dput(qs, (size_t)T * H / 128 * 4), *dg = dput(NULL, (size_t)n * H);
    void *dgs = dput(NULL, (size_t)n * H / 128 * 4), *dge = dput(NULL, (size_t)n * H / 128);
    void *dgf = dput(NULL, (size_t)n * H / 128 * 4);
    CHECK_EQ(D->gather(dev, H, n, dr, dq, dqs, dg, dgs, false, &err), 0);
    CHECK_EQ(D->gather(dev, H, n, dr, dq, dqs, dg, dge, true, &err), 0);
    CHECK_EQ(D->e8m0_to_f32(dev, (size_t)n * H / 128, dge, dgf, &err), 0);
    dget(g, dg, (size_t)n * H);
    dget(gs, dgf, (size_t)n * H / 128 * 4);
    dget(ge, dge, (size_t)n * H / 128);
    for (int i = 0; i < n; i++) {
        CHECK(memcmp(g + (size_t)i * H, q + (size_t)rows[i] * H, H) == 0);
        CHECK(memcmp(gs + (size_t)i * H / 128, qs + (size_t)rows[i] * H / 128, H / 128 * 4) == 0);
        for (int b = 0; b < H / 128; b++)
            CHECK_EQ(ge[(size_t)i * H / 128 + b], fmt_e8m0_ceil(qs[(size_t)rows[i] * H / 128 + b]));
    }
    uint16_t *dst = calloc((size_t)T * H, 2);
    void *ddst = dput(dst, (size_t)T * H * 2);
    CHECK_EQ(D->scatter(dev, H, n, dr, de, ddst, &err), 0);
    dget(dst, ddst, (size_t)T * H * 2);
    for (int i = 0; i < n; i++)
        CHECK(memcmp(dst + (size_t)rows[i] * H, eo + (size_t)i * H, (size_t)H * 2) == 0 ||
              rows[i] != rows[i]);
    D->free(dev, di), D->free(dev, de), D->free(dev, dsh), D->free(dev, dout), D->free(dev, dr);
    D->free(dev, dq), D->free(dev, dqs), D->free(dev, dg), D->free(dev, dgs), D->free(dev, dge);
    D->free(dev, dgf), D->free(dev, ddst);
    free(ids), free(eo), free(sh), free(out), free(outd), free(q), free(g), free(qs), free(gs);
    free(ge), free(dst);
}

/* ---- grouped GEMMs ---- */

typedef struct gcase {
    bool fp4, pow2;
    int N, K;
    int n_groups;
    int rows[6];
} gcase;

static double calc_diff_f32(const float *x, const float *y, size_t n)
{
    double xy = 0, xx = 0, yy = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i]))
            return isnan(x[i]) && isnan(y[i]) ? 0 : 1;
        xy += (double)x[i] * y[i];
        xx += (double)x[i] * x[i];
        yy += (double)y[i] * y[i];
    }
    return xx + yy == 0 ? 0 : 1 - 2 * xy / (xx + yy);
}

/* One grouped GEMM case on the device in both modes against gemm_run (the reference) per
 * group; the exact mode bit for bit, the fast one within tol. */
/* One grouped GEMM case. fused: each group's w1 and w3 (and their scales) adjacent in device
 * memory and the outputs interleaved per row [w1 | w3] (the backend's layout: a library GEMM
 * may run both as one); otherwise separate buffers. */
static void gemm_case(const gcase *c, double tol, int with_nan, int fused)
{
    int M = 0, N = c->N, K = c->K;
    for (int g = 0; g < c->n_groups; g++)
        M += c->rows[g];
    size_t wb = c->fp4 ? (size_t)N * K / 2 : (size_t)N * K;
    size_t sb = c->fp4 ? (size_t)N * K / 32 : (size_t)(N / 128) * (K / 128) * 4;
    uint16_t *x = malloc((size_t)M * K * 2);
    uint8_t *a = malloc((size_t)M * K);
    float *as = malloc((size_t)M * K / 128 * 4);
    fill_act(x, (size_t)M * K);
    qt_act_rows_impl(ISA_REF, x, M, K, c->pow2, a, as);
    if (with_nan)
        a[(size_t)(M / 2) * K + 77] = 0x7F; /* a NaN code: that row's block P is NaN */
    uint8_t *w[6][2];
    void *s[6][2];
    cudev_group hg[6];
    float *ref = malloc((size_t)M * N * 4 * 2), *got = malloc((size_t)M * N * 4 * 2);
    ep_err err;
    int row0 = 0;
    for (int g = 0; g < c->n_groups; g++) {
        hg[g].row0 = (uint32_t)row0;
        hg[g].rows = (uint32_t)c->rows[g];
        for (int mat = 0; mat < 2; mat++) {
            w[g][mat] = malloc(wb);
            s[g][mat] = malloc(sb);
            uint8_t *ws = s[g][mat];
            for (size_t i = 0; i < wb; i++)
                w[g][mat][i] = c->fp4 ? (uint8_t)rnd() : rand_e4m3();
            if (c->fp4)
                for (size_t i = 0; i < sb; i++)
                    ws[i] = (uint8_t)(118 + rnd() % 14);
            else
                for (size_t i = 0; i < sb / 4; i++)
                    ((float *)ws)[i] = c->pow2 ? fmt_e8m0_to_f32((uint8_t)(115 + rnd() % 8))
                                               : 1e-3f * (1 + gauss() * 0.1f);
            gemm_weight *gw = c->fp4 ? gemm_pack_mxfp4(N, K, w[g][mat], ws, ISA_REF, &err)
                                     : gemm_pack_fp8(N, K, w[g][mat], (float *)ws, ISA_REF, &err);
            gemm_run(gw, c->rows[g], a + (size_t)row0 * K, as + (size_t)row0 * K / 128,
                     ref + (size_t)mat * M * N + (size_t)row0 * N, NULL);
            gemm_weight_free(&gw);
        }
        if (fused) { /* one allocation: w1, w3, then both scale tensors */
            uint8_t *blk = dput(NULL, 2 * wb + 2 * sb);
            for (int mat = 0; mat < 2; mat++) {
                hg[g].w[mat] = blk + mat * wb;
                hg[g].scale[mat] = blk + 2 * wb + mat * sb;
                D->h2d(dev, (void *)hg[g].w[mat], w[g][mat], wb, &err);
                D->h2d(dev, (void *)hg[g].scale[mat], s[g][mat], sb, &err);
            }
        } else {
            for (int mat = 0; mat < 2; mat++) {
                hg[g].w[mat] = dput(w[g][mat], wb);
                hg[g].scale[mat] = dput(s[g][mat], sb);
            }
        }
        row0 += c->rows[g];
    }
    void *dgr = dput(hg, sizeof hg), *da = dput(a, (size_t)M * K);
    void *das = dput(as, (size_t)M * K / 128 * 4);
    float *do1 = dput(NULL, (size_t)M * N * 4 * 2),
          *do3 = fused ? do1 + N : dput(NULL, (size_t)M * N * 4);
    int ld = fused ? 2 * N : N;
    /* mode 0: the exact kernels, 1: their plain reference (EPMOE_CUDA_EXACT=ref), 2: fast */
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 1)
            setenv("EPMOE_CUDA_EXACT", "ref", 1);
        int max_rows = 0;
        for (int g = 0; g < c->n_groups; g++)
            max_rows = c->rows[g] > max_rows ? c->rows[g] : max_rows;
        cudev_gemm G = {.format = c->fp4 ? MB_W_MXFP4 : MB_W_FP8,
                        .mode = mode == 2 ? MB_GEMM_FAST : MB_GEMM_EXACT,
                        .N = N,
                        .K = K,
                        .M = M,
                        .n_mats = 2,
                        .n_groups = c->n_groups,
                        .groups = dgr,
                        .h_groups = hg,
                        .max_rows = max_rows,
                        .a = da,
                        .a_scale = das,
                        .out_f32 = do1,
                        .out2_f32 = do3,
                        .ld_out = ld,
                        .tune = tk_tune()};
        int grc = D->gemm(dev, &G, &err);
        if (grc != 0)
            printf("  gemm: %s\n", err.msg);
        CHECK_EQ(grc, 0);
        unsetenv("EPMOE_CUDA_EXACT");
        float *o = malloc((size_t)M * N * 4 * 2);
        if (fused) {
            dget(o, do1, (size_t)M * N * 4 * 2);
            for (int r = 0; r < M; r++) {
                memcpy(got + (size_t)r * N, o + (size_t)r * 2 * N, (size_t)N * 4);
                memcpy(got + (size_t)M * N + (size_t)r * N, o + (size_t)r * 2 * N + N,
                       (size_t)N * 4);
            }
        } else {
            dget(got, do1, (size_t)M * N * 4);
            dget(got + (size_t)M * N, do3, (size_t)M * N * 4);
        }
        free(o);
        char what[128];
        snprintf(what, sizeof what, "%s %s gemm N=%d K=%d groups=%d pow2=%d nan=%d fused=%d lt=%s",
                 mode == 2 ? "fast"
                 : mode    ? "exact-ref"
                           : "exact",
                 c->fp4 ? "mxfp4" : "fp8", N, K, c->n_groups, c->pow2, with_nan, fused,
                 getenv("EPMOE_CUDA_CUBLASLT") ? getenv("EPMOE_CUDA_CUBLASLT") : "0");
        if (mode < 2) {
            CHECK(same_f32(ref, got, (size_t)2 * M * N, what));
        } else if (!with_nan) {
            double cd = calc_diff_f32(ref, got, (size_t)2 * M * N);
            if (!(cd < tol)) {
                printf("  %s: calc_diff %.3g >= %.3g; first values %g/%g %g/%g\n", what, cd, tol,
                       ref[0], got[0], ref[1], got[1]);
                TEST_FAIL_AT("fast GEMM outside the tolerance");
            }
        }
    }
    for (int g = 0; g < c->n_groups; g++)
        for (int mat = 0; mat < 2; mat++) {
            if (!fused)
                D->free(dev, (void *)hg[g].w[mat]), D->free(dev, (void *)hg[g].scale[mat]);
            else if (mat == 0)
                D->free(dev, (void *)hg[g].w[0]);
            free(w[g][mat]), free(s[g][mat]);
        }
    D->free(dev, dgr), D->free(dev, da), D->free(dev, das), D->free(dev, do1);
    if (!fused)
        D->free(dev, do3);
    free(x), free(a), free(as), free(ref), free(got);
}

TEST(exact_gemms_match_the_reference_and_fast_ones_are_within_tolerance)
{
    NEED_DEVICE();
    static const gcase cases[] = {
        {true, true, 2048, 4096, 3, {1, 2, 5}},
        {true, true, 4096, 2048, 2, {1, 7}},
        {false, true, 2048, 4096, 2, {1, 3}},
        {false, false, 256, 384, 3, {17, 1, 64}},
        {true, true, 384, 640, 4, {65, 1, 3, 130}},
        {false, true, 512, 1152, 2, {200, 9}},
        {true, true, 128, 128, 1, {1}},
    };
    /* the fast path picks by rows per group: the few-row kernels, cuBLASLt (FP8, on or off),
     * or the tensor-core kernel; the shapes above are not all cuBLASLt's (K/128 and rows must
     * be multiples of 4), so with "1" some fall back to the tensor-core kernel */
    for (int lt = 1; lt >= 0; lt--) {
        setenv("EPMOE_CUDA_CUBLASLT", lt ? "1" : "0", 1);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int fused = 0; fused < 2; fused++)
                if (lt || !cases[i].fp4)
                    gemm_case(&cases[i], 1e-3, 0, fused);
    }
    /* shapes cuBLASLt takes, with "require": a quiet fallback would be an error, so these
     * check cuBLASLt itself (its scale layouts, the fused w1+w3 call, bf16 rows) */
    static const gcase lt_cases[] = {
        {false, true, 512, 1024, 2, {32, 64}},
        {false, false, 256, 512, 3, {20, 4, 48}},
        {false, true, 2048, 4096, 2, {64, 24}},
    };
    setenv("EPMOE_CUDA_CUBLASLT", "require", 1);
    for (size_t i = 0; i < sizeof lt_cases / sizeof lt_cases[0]; i++)
        for (int fused = 0; fused < 2; fused++)
            gemm_case(&lt_cases[i], 1e-3, 0, fused);
    unsetenv("EPMOE_CUDA_CUBLASLT");
    gemm_case(&cases[0], 1e-3, 1, 0);
    gemm_case(&cases[2], 1e-3, 1, 1);
    /* rows split 16 ways (EPMOE_CUDA_SPLIT=16): the same bits, the same fast results */
    setenv("EPMOE_CUDA_SPLIT", "16", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        gemm_case(&cases[i], 1e-3, 0, 1);
    unsetenv("EPMOE_CUDA_SPLIT");
    /* the default: cuBLASLt where the groups average 96 rows or more (this one), our kernels
     * below */
    static const gcase dflt = {false, true, 512, 1024, 2, {128, 96}};
    for (int fused = 0; fused < 2; fused++)
        gemm_case(&dflt, 1e-3, 0, fused);
}

/* The bf16 output path of the GEMM: rounded rows written through out_row. */
/* One bf16-output GEMM (the w2 GEMM's form): rounded rows written where out_row says, in a
 * permuted order; exact bit for bit, fast within tol (calc_diff over the output). */
static void bf16_rows_case(bool fp4, mb_gemm_mode mode, int M, int N, int K, double tol)
{
    size_t wb = fp4 ? (size_t)N * K / 2 : (size_t)N * K;
    size_t sb = fp4 ? (size_t)N * K / 32 : (size_t)(N / 128) * (K / 128) * 4;
    uint16_t *x = malloc((size_t)M * K * 2);
    uint8_t *a = malloc((size_t)M * K), *wq = malloc(wb), *ws = malloc(sb);
    float *as = malloc((size_t)M * K / 128 * 4), *ref = malloc((size_t)M * N * 4);
    fill_act(x, (size_t)M * K);
    qt_act_rows_impl(ISA_REF, x, M, K, true, a, as);
    for (size_t i = 0; i < wb; i++)
        wq[i] = fp4 ? (uint8_t)rnd() : rand_e4m3();
    if (fp4)
        for (size_t i = 0; i < sb; i++)
            ws[i] = (uint8_t)(120 + rnd() % 8);
    else
        for (size_t i = 0; i < sb / 4; i++)
            ((float *)ws)[i] = fmt_e8m0_to_f32((uint8_t)(115 + rnd() % 8));
    ep_err err;
    gemm_weight *gw = fp4 ? gemm_pack_mxfp4(N, K, wq, ws, ISA_REF, &err)
                          : gemm_pack_fp8(N, K, wq, (float *)ws, ISA_REF, &err);
    gemm_run(gw, M, a, as, ref, NULL);
    gemm_weight_free(&gw);
    uint32_t *orow = malloc((size_t)M * 4);
    for (int m = 0; m < M; m++) /* a permutation: 7 is prime to every M used here */
        orow[m] = (uint32_t)((m * 7 + 3) % M);
    cudev_group hg = {.row0 = 0, .rows = (uint32_t)M};
    hg.w[0] = dput(wq, wb);
    hg.scale[0] = dput(ws, sb);
    void *dgr = dput(&hg, sizeof hg), *da = dput(a, (size_t)M * K),
         *das = dput(as, (size_t)M * K / 128 * 4);
    void *dor = dput(orow, (size_t)M * 4), *dout = dput(NULL, (size_t)M * N * 2);
    uint16_t *got = malloc((size_t)M * N * 2);
    cudev_gemm G = {.format = fp4 ? MB_W_MXFP4 : MB_W_FP8,
                    .mode = mode,
                    .N = N,
                    .K = K,
                    .M = M,
                    .n_mats = 1,
                    .n_groups = 1,
                    .groups = dgr,
                    .h_groups = &hg,
                    .max_rows = M,
                    .a = da,
                    .a_scale = das,
                    .out_bf16 = dout,
                    .out_row = dor,
                    .tune = tk_tune()};
    int grc = D->gemm(dev, &G, &err);
    if (grc != 0)
        printf("  gemm: %s\n", err.msg);
    CHECK_EQ(grc, 0);
    dget(got, dout, (size_t)M * N * 2);
    double xy = 0, xx = 0, yy = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            uint16_t want = fmt_f32_to_bf16(ref[(size_t)m * N + n]);
            uint16_t have = got[(size_t)orow[m] * N + n];
            double r = fmt_bf16_to_f32(want), h = fmt_bf16_to_f32(have);
            xy += r * h, xx += r * r, yy += h * h;
            if (mode == MB_GEMM_EXACT && have != want) {
                TEST_FAIL_AT("%s exact row %d col %d: %04x vs %04x", fp4 ? "mxfp4" : "fp8", m, n,
                             have, want);
                m = M;
                break;
            }
        }
    double cd = xx + yy == 0 ? 0 : 1 - 2 * xy / (xx + yy);
    if (mode == MB_GEMM_FAST && !(cd < tol))
        TEST_FAIL_AT("%s fast bf16 rows (M=%d): calc_diff %.3g >= %.3g", fp4 ? "mxfp4" : "fp8", M,
                     cd, tol);
    D->free(dev, (void *)hg.w[0]), D->free(dev, (void *)hg.scale[0]), D->free(dev, dgr);
    D->free(dev, da), D->free(dev, das), D->free(dev, dor), D->free(dev, dout);
    free(x), free(a), free(wq), free(ws), free(as), free(ref), free(got), free(orow);
}

TEST(gemm_bf16_rows_go_where_out_row_says)
{
    NEED_DEVICE();
    bf16_rows_case(true, MB_GEMM_EXACT, 5, 256, 256, 0);
    bf16_rows_case(false, MB_GEMM_EXACT, 5, 256, 512, 0);
    bf16_rows_case(true, MB_GEMM_FAST, 5, 256, 256, 1e-3);  /* few-row kernel */
    bf16_rows_case(true, MB_GEMM_FAST, 40, 256, 256, 1e-3); /* tensor-core kernel */
    setenv("EPMOE_CUDA_CUBLASLT", "0", 1);
    bf16_rows_case(false, MB_GEMM_FAST, 40, 256, 512, 1e-3); /* tensor-core kernel */
    setenv("EPMOE_CUDA_CUBLASLT", "require", 1);
    bf16_rows_case(false, MB_GEMM_FAST, 40, 256, 512, 1e-3); /* cuBLASLt + k_rows_out */
    unsetenv("EPMOE_CUDA_CUBLASLT");
}

int main(void)
{
    mb_device_info info;
    ep_err err;
    D = cudev_cuda_ops(tk_tune()->module, &err);
    memset(&info, 0, sizeof info);
    if (D && D->open(0, &dev, &info, &err) == 0)
        printf("device: %s (sm_%d%d, %.0f GiB)\n", info.name, info.sm_major, info.sm_minor,
               (double)info.mem_total / (1 << 30));
    else
        printf("no CUDA device: %s\n", err.msg);
    if (D == NULL || dev == NULL)
        dev = NULL;
    RUN(rmsnorm_and_logits_match_the_reference);
    RUN(quantizer_matches_the_reference);
    RUN(swiglu_with_the_exp_table_matches_the_reference);
    RUN(combine_gather_scatter_match_the_reference);
    RUN(exact_gemms_match_the_reference_and_fast_ones_are_within_tolerance);
    RUN(gemm_bf16_rows_go_where_out_row_says);
    if (dev)
        D->close(dev);
    return test_report();
}
