/*
 * test_cuda_host.c — the CUDA backend's host logic (kernels/cuda/backend_cuda.c) on a machine
 * without a GPU: a fake device behind kernels/cuda/cuda_dev.h that keeps "device memory" in
 * host memory and runs each kernel with the CPU reference.
 *
 * The fake is asynchronous like a real stream: copies and kernels are queued and run only when
 * the host polls the stream (query), and an upload reads its host source when it runs, not
 * when it is queued. So a backend that refills a pinned staging buffer before the upload from
 * it has happened, or reads a result before waiting, computes wrong bits here — and the tests
 * compare every result with the CPU backend bit for bit.
 *
 * The fake's SwiGLU is the device kernel's formula (expf from the backend's table over bf16
 * inputs), so the equality also proves the table trick gives the C library's bits.
 *
 * Properties proved: bit identity with the CPU backend for forward, the step API and the
 * device-resident step API (moe_backend.h mb_dev_*) on every layer kind and both expert dtypes,
 * including requests larger than one pass (chunking); one device allocation for a reserved shard's
 * weights; the device-memory check names both sizes; a failing copy or kernel, a device error
 * and a stream that never drains are explicit errors, never hangs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend_check.h"
#include "common/knobs.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_tuning.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/route.h"
#include "moe_gen.h"
#include "test.h"
#include "shard/shard.h"

/* ---- the fake device ---------------------------------------------------------------------- */

typedef enum { OP_COPY, OP_ZERO, OP_KERNEL } op_kind;

typedef struct fake_op {
    op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    void (*fn)(const void *args);
    uint8_t args[256];
} fake_op;

struct cudev {
    fake_op *q;
    int nq, cap;
    int allocs;         /* device allocations made */
    uint64_t allocated; /* bytes currently held */
};

/* Failure injection, for every fake device. */
static struct {
    uint64_t mem_free; /* what mem_info reports (0: 64 GiB) */
    int fail_h2d_at;   /* the Nth h2d fails (0: never) */
    int fail_gemm_at;  /* the Nth gemm launch fails */
    int query_error;   /* query reports a device error */
    int never_drains;  /* query always says busy */
    int h2d_count, gemm_count;
} fk;

static int fk_open(int ordinal, cudev **out, mb_device_info *info, ep_err *err)
{
    if (ordinal != 0)
        return ep_err_set(err, "no such CUDA device: this host has 1");
    *out = calloc(1, sizeof **out);
    snprintf(info->name, sizeof info->name, "Fake H200");
    info->sm_major = 9;
    info->mem_total = 141ull << 30;
    return *out ? 0 : ep_err_set(err, "out of memory");
}

static void fk_drain(cudev *d)
{
    for (int i = 0; i < d->nq; i++) {
        fake_op *o = &d->q[i];
        if (o->kind == OP_COPY)
            memcpy(o->dst, o->src, o->n);
        else if (o->kind == OP_ZERO)
            memset(o->dst, 0, o->n);
        else
            o->fn(o->args);
    }
    d->nq = 0;
}

static void fk_close(cudev *d)
{
    fk_drain(d);
    free(d->q);
    free(d);
}

static fake_op *fk_push(cudev *d, op_kind kind)
{
    if (d->nq == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->q = realloc(d->q, (size_t)d->cap * sizeof *d->q);
    }
    fake_op *o = &d->q[d->nq++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    return o;
}

static int fk_mem_info(cudev *d, uint64_t *f, uint64_t *t, ep_err *err)
{
    *t = 141ull << 30;
    *f = fk.mem_free ? fk.mem_free : (64ull << 30);
    return 0;
}

static int fk_alloc(cudev *d, void **p, size_t n, ep_err *err)
{
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p)
        return ep_err_set(err, "fake cudaMalloc of %zu bytes failed", n);
    d->allocs++;
    return 0;
}

static void fk_free(cudev *d, void *p)
{
    free(p);
}

static int fk_alloc_host(cudev *d, void **p, size_t n, ep_err *err)
{
    *p = malloc(n);
    return *p ? 0 : ep_err_set(err, "fake cudaMallocHost failed");
}

static int fk_copy(cudev *d, void *dst, const void *src, size_t n, ep_err *err)
{
    fake_op *o = fk_push(d, OP_COPY);
    o->dst = dst;
    o->src = src;
    o->n = n;
    return 0;
}

static int fk_h2d(cudev *d, void *dst, const void *src, size_t n, ep_err *err)
{
    if (fk.fail_h2d_at && ++fk.h2d_count == fk.fail_h2d_at)
        return ep_err_set(err, "cudaMemcpyAsync H2D: fake failure");
    return fk_copy(d, dst, src, n, err);
}

static int fk_memset0(cudev *d, void *dst, size_t n, ep_err *err)
{
    fake_op *o = fk_push(d, OP_ZERO);
    o->dst = dst;
    o->n = n;
    return 0;
}

static int fk_query(cudev *d, ep_err *err)
{
    if (fk.query_error)
        return ep_err_set(err, "the device stream: an illegal memory access was encountered");
    if (fk.never_drains)
        return 1;
    fk_drain(d);
    return 0;
}

static void *fk_stream(cudev *d)
{
    return d;
}

#define FK_KERNEL(d, fn_, T, a)                                                                    \
    do {                                                                                           \
        _Static_assert(sizeof(T) <= 256, "kernel arguments fit");                                  \
        fake_op *o_ = fk_push(d, OP_KERNEL);                                                       \
        o_->fn = fn_;                                                                              \
        memcpy(o_->args, &(a), sizeof(T));                                                         \
    } while (0)

typedef struct {
    int T, H;
    const uint16_t *x, *gain;
    float eps;
    uint16_t *xn;
} a_rms;
static void run_rms(const void *v)
{
    const a_rms *a = v;
    route_rmsnorm(ISA_REF, a->T, a->H, a->x, a->gain, a->eps, a->xn);
}
static int fk_rmsnorm(cudev *d, int T, int H, const uint16_t *x, const uint16_t *g, float eps,
                      uint16_t *xn, ep_err *err)
{
    a_rms a = {T, H, x, g, eps, xn};
    FK_KERNEL(d, run_rms, a_rms, a);
    return 0;
}

typedef struct {
    int T, H, E;
    const uint16_t *xn, *gate_t;
    float *logits;
} a_log;
static void run_logits(const void *v)
{
    const a_log *a = v;
    uint16_t *g = malloc((size_t)a->E * a->H * 2);
    for (int e = 0; e < a->E; e++)
        for (int k = 0; k < a->H; k++)
            g[(size_t)e * a->H + k] = a->gate_t[(size_t)k * a->E + e];
    route_logits(ISA_REF, a->T, a->H, a->E, a->xn, g, a->logits, NULL);
    free(g);
}
static int fk_logits(cudev *d, int T, int H, int E, const uint16_t *xn, const uint16_t *gate_t,
                     float *logits, ep_err *err)
{
    a_log a = {T, H, E, xn, gate_t, logits};
    FK_KERNEL(d, run_logits, a_log, a);
    return 0;
}

typedef struct {
    int M, K;
    bool pow2;
    const uint16_t *x;
    uint8_t *q;
    float *qs;
} a_q;
static void run_quant(const void *v)
{
    const a_q *a = v;
    qt_act_rows_impl(ISA_REF, a->x, a->M, a->K, a->pow2, a->q, a->qs);
}
static int fk_quant(cudev *d, int M, int K, bool pow2, const uint16_t *x, uint8_t *q, float *qs,
                    ep_err *err)
{
    a_q a = {M, K, pow2, x, q, qs};
    FK_KERNEL(d, run_quant, a_q, a);
    return 0;
}

typedef struct {
    int H, n;
    const uint32_t *rows;
    const uint8_t *q;
    const float *qs;
    uint8_t *qo;
    void *qso;
    bool e8m0;
} a_ga;
static void run_gather(const void *v)
{
    const a_ga *a = v;
    size_t H = (size_t)a->H, SC = H / 128;
    for (int i = 0; i < a->n; i++) {
        memcpy(a->qo + (size_t)i * H, a->q + (size_t)a->rows[i] * H, H);
        for (size_t b = 0; b < SC; b++) {
            float s = a->qs[(size_t)a->rows[i] * SC + b];
            if (a->e8m0)
                ((uint8_t *)a->qso)[(size_t)i * SC + b] = fmt_e8m0_ceil(s);
            else
                ((float *)a->qso)[(size_t)i * SC + b] = s;
        }
    }
}
static int fk_gather(cudev *d, int H, int n, const uint32_t *rows, const uint8_t *q,
                     const float *qs, uint8_t *qo, void *qso, bool e8m0, ep_err *err)
{
    a_ga a = {H, n, rows, q, qs, qo, qso, e8m0};
    FK_KERNEL(d, run_gather, a_ga, a);
    return 0;
}

typedef struct {
    size_t n;
    const uint8_t *in;
    float *out;
} a_e8;
static void run_e8(const void *v)
{
    const a_e8 *a = v;
    for (size_t i = 0; i < a->n; i++)
        a->out[i] = fmt_e8m0_to_f32(a->in[i]);
}
static int fk_e8m0(cudev *d, size_t n, const uint8_t *in, float *out, ep_err *err)
{
    a_e8 a = {n, in, out};
    FK_KERNEL(d, run_e8, a_e8, a);
    return 0;
}

/* The grouped GEMM with the CPU reference: per group and matrix, the weights packed for the
 * reference (their layout is the checkpoint's) and gemm_run on the group's rows. */
typedef struct {
    cudev_gemm g;
} a_gemm;
static void run_gemm(const void *v)
{
    const a_gemm *a = v;
    const cudev_gemm *g = &a->g;
    size_t K = (size_t)g->K, N = (size_t)g->N, SC = K / 128;
    ep_err err;
    for (int i = 0; i < g->n_groups; i++) {
        const cudev_group *G = &g->groups[i]; /* the device table, as the kernel reads it */
        for (int mat = 0; mat < g->n_mats; mat++) {
            gemm_weight *w =
                g->format == MB_W_MXFP4
                    ? gemm_pack_mxfp4(g->N, g->K, G->w[mat], G->scale[mat], ISA_REF, &err)
                    : gemm_pack_fp8(g->N, g->K, G->w[mat], G->scale[mat], ISA_REF, &err);
            float *o = malloc((size_t)G->rows * N * 4 + 4);
            gemm_run(w, (int)G->rows, g->a + (size_t)G->row0 * K, g->a_scale + (size_t)G->row0 * SC,
                     o, NULL);
            for (uint32_t r = 0; r < G->rows; r++) {
                size_t row = G->row0 + r;
                if (g->out_bf16) {
                    size_t dst = g->out_row ? g->out_row[row] : row;
                    for (size_t n = 0; n < N; n++)
                        g->out_bf16[dst * N + n] = fmt_f32_to_bf16(o[r * N + n]);
                } else {
                    size_t ld = g->ld_out ? (size_t)g->ld_out : N;
                    memcpy((mat ? g->out2_f32 : g->out_f32) + row * ld, o + r * N, N * 4);
                }
            }
            free(o);
            gemm_weight_free(&w);
        }
    }
}
static int fk_gemm(cudev *d, const cudev_gemm *g, ep_err *err)
{
    if (fk.fail_gemm_at && ++fk.gemm_count == fk.fail_gemm_at)
        return ep_err_set(err, "exact GEMM launch: fake failure (too many resources requested)");
    /* the kernel reads the device copy of the group table when it runs; the host copy may
     * be reused by then */
    a_gemm a = {.g = *g};
    a.g.h_groups = NULL;
    FK_KERNEL(d, run_gemm, a_gemm, a);
    return 0;
}

/* The device kernel's SwiGLU: expf(-g) from the table, then the reference quantizer. */
typedef struct {
    int M, I, ld;
    const float *acc1, *acc3, *w_row;
    float limit;
    bool pow2;
    const float *tab;
    float enl;
    uint8_t *hq;
    float *hqs;
} a_sw;
static void run_swiglu(const void *v)
{
    const a_sw *a = v;
    float h[128];
    for (int m = 0; m < a->M; m++)
        for (int b = 0; b < a->I / 128; b++) {
            for (int i = 0; i < 128; i++) {
                size_t at = (size_t)m * a->ld + (size_t)b * 128 + i;
                float g = fmt_bf16_to_f32(fmt_f32_to_bf16(a->acc1[at]));
                float u = fmt_bf16_to_f32(fmt_f32_to_bf16(a->acc3[at]));
                bool clamped = g > a->limit;
                g = clamped ? a->limit : g;
                u = u < -a->limit ? -a->limit : u;
                u = u > a->limit ? a->limit : u;
                float e = clamped ? a->enl : a->tab[fmt_f32_to_bf16(g)];
                float hv = (g / (1.0f + e)) * u;
                hv = (a->w_row ? a->w_row[m] : 1.0f) * hv;
                h[i] = fmt_bf16_to_f32(fmt_f32_to_bf16(hv));
            }
            qt_act_rows_f32_impl(ISA_REF, h, 1, 128, a->pow2,
                                 a->hq + (size_t)m * a->I + (size_t)b * 128,
                                 a->hqs + (size_t)m * (a->I / 128) + b);
        }
}
static int fk_swiglu(cudev *d, int M, int I, const float *acc1, const float *acc3, int ld,
                     const float *w_row, float limit, bool pow2, const float *tab, float enl,
                     uint8_t *hq, float *hqs, ep_err *err)
{
    a_sw a = {M, I, ld ? ld : I, acc1, acc3, w_row, limit, pow2, tab, enl, hq, hqs};
    FK_KERNEL(d, run_swiglu, a_sw, a);
    return 0;
}

typedef struct {
    int T, k, H;
    const int32_t *ids;
    const uint16_t *eo, *sh;
    uint16_t *out;
} a_cb;
static void run_combine(const void *v)
{
    const a_cb *a = v;
    moe_combine(a->T, a->k, a->H, a->ids, a->eo, a->sh, a->out);
}
static int fk_combine(cudev *d, int T, int k, int H, const int32_t *ids, const uint16_t *eo,
                      const uint16_t *sh, uint16_t *out, ep_err *err)
{
    a_cb a = {T, k, H, ids, eo, sh, out};
    FK_KERNEL(d, run_combine, a_cb, a);
    return 0;
}

typedef struct {
    int H, n;
    const uint32_t *rows;
    const uint16_t *src;
    uint16_t *dst;
} a_sc;
static void run_scatter(const void *v)
{
    const a_sc *a = v;
    for (int i = 0; i < a->n; i++)
        memcpy(a->dst + (size_t)a->rows[i] * a->H, a->src + (size_t)i * a->H, (size_t)a->H * 2);
}
static int fk_scatter(cudev *d, int H, int n, const uint32_t *rows, const uint16_t *src,
                      uint16_t *dst, ep_err *err)
{
    a_sc a = {H, n, rows, src, dst};
    FK_KERNEL(d, run_scatter, a_sc, a);
    return 0;
}

static const cudev_ops FAKE = {
    .open = fk_open,
    .close = fk_close,
    .mem_info = fk_mem_info,
    .alloc = fk_alloc,
    .free = fk_free,
    .alloc_host = fk_alloc_host,
    .free_host = fk_free,
    .h2d = fk_h2d,
    .d2h = fk_copy,
    .d2d = fk_copy,
    .memset0 = fk_memset0,
    .query = fk_query,
    .stream = fk_stream,
    .rmsnorm = fk_rmsnorm,
    .logits = fk_logits,
    .quant = fk_quant,
    .gather = fk_gather,
    .e8m0_to_f32 = fk_e8m0,
    .gemm = fk_gemm,
    .swiglu = fk_swiglu,
    .combine = fk_combine,
    .scatter = fk_scatter,
};

/* ---- fixtures ---------------------------------------------------------------------------- */

typedef struct fixture {
    char dir[64];
    mc_config c;
} fixture;

static int fixture_make(fixture *f, mc_expert_dtype dt, int H, int I, int E, int k, int seed)
{
    ep_err err = {0};
    f->c = gen_config(dt, H, I, E, k, 97);
    f->c.num_hidden_layers = 3;
    f->c.num_hash_layers = 1;
    f->c.num_nextn_predict_layers = 1;
    gen_opts o = {.seed = (uint64_t)seed};
    gen_model *g = gen_model_create(&f->c, &o);
    snprintf(f->dir, sizeof f->dir, "/tmp/epmoe_cuda_host_XXXXXX");
    int rc = g && mkdtemp(f->dir) && gen_model_write(g, f->dir, &err) == 0 ? 0 : -1;
    if (rc)
        printf("  fixture: %s\n", err.msg);
    gen_model_free(&g);
    return rc;
}

static mb_backend *fake_backend_tuned(mb_gemm_mode mode, const mb_cuda_tuning *t)
{
    ep_err err = {0};
    mb_options o = {.device = "cuda:0", .threads = 2, .gemm = mode, .cuda = *t};
    mb_backend *be = mb_cuda_create_with(&o, 0, &FAKE, &err);
    if (!be)
        printf("  fake backend: %s\n", err.msg);
    return be;
}

static mb_backend *fake_backend(mb_gemm_mode mode)
{
    return fake_backend_tuned(mode, &(mb_cuda_tuning){0});
}

static mb_backend *cpu_backend(void)
{
    ep_err err = {0};
    mb_options o = {.device = "cpu", .threads = 2};
    return mb_create(&o, &err);
}

/* ---- tests ------------------------------------------------------------------------------- */

TEST(backend_over_a_fake_device_gives_the_cpu_bits)
{
    static const int Ts[] = {1, 7, 64};
    for (int dt = 0; dt < 2; dt++) {
        fixture f;
        if (fixture_make(&f, dt ? MC_FP8 : MC_FP4, 256, 256, 16, 4, 11 + dt) != 0) {
            CHECK(0);
            continue;
        }
        mb_backend *be = fake_backend(MB_GEMM_EXACT), *ref = cpu_backend();
        CHECK(be && ref);
        if (be && ref) {
            CHECK_STR_EQ(mb_name(be), "cuda-exact");
            bchk_opts o = {.exact = true, .Ts = Ts, .n_T = 3, .seed = 5 + (uint64_t)dt};
            int fails = bchk_compare(be, ref, f.dir, &o);
            CHECK_EQ(fails, 0);
        }
        mb_destroy(&be);
        mb_destroy(&ref);
        gen_model_remove(f.dir);
    }
}

/* Requests larger than one pass of the step buffers (8192 tokens, 16384 expert rows) run in
 * chunks; the chunked paths give the same bits. */
TEST(requests_larger_than_the_step_buffers_run_in_chunks)
{
    static const int Ts[] = {9000};
    fixture f;
    if (fixture_make(&f, MC_FP4, 128, 128, 8, 2, 21) != 0) {
        CHECK(0);
        return;
    }
    mb_backend *be = fake_backend(MB_GEMM_EXACT), *ref = cpu_backend();
    CHECK(be && ref);
    if (be && ref) {
        bchk_opts o = {.exact = true, .Ts = Ts, .n_T = 1, .max_layers = 2, .seed = 77};
        CHECK_EQ(bchk_compare(be, ref, f.dir, &o), 0);
    }
    mb_destroy(&be);
    mb_destroy(&ref);
    gen_model_remove(f.dir);
}

/* One device allocation holds a reserved shard's weights; layers are carved from it, and a
 * new reservation (a new placement) fills while the old layers still work. */
TEST(a_reserved_shard_is_one_device_arena)
{
    fixture f;
    if (fixture_make(&f, MC_FP8, 256, 256, 8, 2, 31) != 0) {
        CHECK(0);
        return;
    }
    ep_err err = {0};
    mb_backend *be = fake_backend(MB_GEMM_EXACT);
    st_model *m = st_model_open(f.dir, &err);
    CHECK(be && m);
    if (be && m) {
        int L = mc_num_layers(&f.c), E = f.c.n_routed_experts;
        uint8_t *want = calloc((size_t)L * E, 1);
        for (int i = 0; i < L * E; i++)
            want[i] = (i % E) % 2 == 0;
        mb_layer *layers[8] = {0}, *next[8] = {0};
        cudev *d = NULL;
        /* the fake device's allocation counter lives in its context; reach it through a
         * device-resident call's stream (the fake's stream is its context) */
        d = (cudev *)mb_dev_stream(be);
        CHECK(d != NULL);
        int before = d ? d->allocs : 0;
        CHECK_EQ(shard_load(be, m, &f.c, want, NULL, 64, layers, NULL, NULL, &err), 0);
        /* the weight arena and the step buffers (device + pinned staging are not counted) */
        CHECK_EQ(d->allocs - before, 2);
        uint64_t held = 0, reserved = 0;
        for (int l = 0; l < L; l++) {
            held += mb_layer_bytes(layers[l]);
            reserved += mb_layer_footprint(be, &f.c, E / 2);
        }
        CHECK(held <= reserved);
        /* a new placement reusing the old layers: one new arena; old layers still serve */
        for (int i = 0; i < L * E; i++)
            want[i] = (i % E) < 3;
        before = d->allocs;
        CHECK_EQ(shard_load(be, m, &f.c, want, layers, 64, next, NULL, NULL, &err), 0);
        CHECK_EQ(d->allocs - before, 2);
        for (int e = 0; e < E; e++)
            CHECK_EQ(mb_layer_owns(next[1], e), e < 3);
        for (int l = 0; l < L; l++)
            mb_layer_free(&layers[l]);
        for (int l = 0; l < L; l++)
            mb_layer_free(&next[l]);
        free(want);
    }
    st_model_close(&m);
    mb_destroy(&be);
    gen_model_remove(f.dir);
}

TEST(device_memory_check_names_both_sizes)
{
    fixture f;
    if (fixture_make(&f, MC_FP4, 256, 256, 8, 2, 41) != 0) {
        CHECK(0);
        return;
    }
    ep_err err = {0};
    mb_backend *be = fake_backend(MB_GEMM_EXACT);
    st_model *m = st_model_open(f.dir, &err);
    if (be && m) {
        int L = mc_num_layers(&f.c), E = f.c.n_routed_experts;
        uint8_t *want = calloc((size_t)L * E, 1);
        memset(want, 1, (size_t)L * E);
        mb_layer *layers[8] = {0};
        fk.mem_free = 1 << 20; /* 1 MiB free */
        CHECK_EQ(shard_load(be, m, &f.c, want, NULL, EP_MAX_TOKENS, layers, NULL, NULL, &err), -1);
        CHECK_STR_HAS(err.msg, "Fake H200: the shard needs ");
        CHECK_STR_HAS(err.msg, "GiB of weights and ");
        CHECK_STR_HAS(err.msg, "GiB of step buffers");
        CHECK_STR_HAS(err.msg, "but the device has 0.00 GiB free of 141.00 GiB");
        CHECK(layers[0] == NULL);
        fk.mem_free = 0;
        free(want);
    }
    st_model_close(&m);
    mb_destroy(&be);
    gen_model_remove(f.dir);
}

/* A failing copy or kernel launch, a device error and a stream that never drains each make
 * the operation fail with a message; nothing hangs. */
TEST(device_failures_are_explicit_errors)
{
    fixture f;
    if (fixture_make(&f, MC_FP4, 128, 128, 4, 2, 51) != 0) {
        CHECK(0);
        return;
    }
    ep_err err = {0};
    mb_backend *be = fake_backend_tuned(MB_GEMM_EXACT, &(mb_cuda_tuning){.wait_s = 0.2});
    st_model *m = st_model_open(f.dir, &err);
    mb_layer *l = be && m ? shard_load_layer(be, m, &f.c, 1, NULL, NULL, NULL, NULL, &err) : NULL;
    CHECK(l != NULL);
    if (l) {
        int T = 3, H = f.c.hidden_size, k = f.c.num_experts_per_tok;
        uint16_t *x = calloc((size_t)T * H, 2), *out = malloc((size_t)T * H * 2);
        int32_t ids[64];
        float w[64];
        for (int i = 0; i < T * H; i++)
            x[i] = fmt_f32_to_bf16((float)(i % 7) - 3.0f);
        CHECK_EQ(mb_forward(be, l, T, x, NULL, out, ids, w, &err), 0);

        fk.fail_h2d_at = 2, fk.h2d_count = 0;
        CHECK_EQ(mb_forward(be, l, T, x, NULL, out, ids, w, &err), -1);
        CHECK_STR_HAS(err.msg, "H2D: fake failure");
        fk.fail_h2d_at = 0;

        fk.fail_gemm_at = 1, fk.gemm_count = 0;
        CHECK_EQ(mb_forward(be, l, T, x, NULL, out, ids, w, &err), -1);
        CHECK_STR_HAS(err.msg, "GEMM launch: fake failure");
        fk.fail_gemm_at = 0;

        fk.query_error = 1;
        CHECK_EQ(mb_forward(be, l, T, x, NULL, out, ids, w, &err), -1);
        CHECK_STR_HAS(err.msg, "illegal memory access");
        fk.query_error = 0;

        fk.never_drains = 1;
        double t0 = (double)time(NULL);
        mb_step *s =
            mb_step_begin(be, l, T, x, NULL, ids, w, (uint8_t *)out, (float *)x, NULL, &err);
        CHECK(s == NULL);
        CHECK_STR_HAS(err.msg, "did not finish its queued work in time");
        CHECK((double)time(NULL) - t0 < 30);
        fk.never_drains = 0;
        (void)k;
        /* and the backend still works afterwards */
        fk_query((cudev *)mb_dev_stream(be), &err);
        CHECK_EQ(mb_forward(be, l, T, x, NULL, out, ids, w, &err), 0);
        free(x);
        free(out);
    }
    mb_layer_free(&l);
    st_model_close(&m);
    mb_destroy(&be);
    gen_model_remove(f.dir);
}

/* One rank's NCCL-plane path through the device operations: every slot's row through a gather
 * into a "send buffer", the experts on it, the outputs scattered back into eo, the finish.
 * want_ids: the routing the step must give. */
static int dev_path(mb_backend *be, const mb_layer *la, int T, int H, int k, const uint16_t *x,
                    const int32_t *want_ids, uint16_t *got)
{
    ep_err err = {0};
    int rc = -1;
    int32_t ids_a[64];
    float w_a[64];
    mb_step *s = mb_dev_step_begin(be, la, T, x, NULL, ids_a, w_a, INT64_MAX, &err);
    CHECK(s != NULL);
    if (s == NULL)
        return -1;
    CHECK(memcmp(ids_a, want_ids, (size_t)T * k * 4) == 0);
    int n = T * k;
    uint32_t rows[64], slots[64], prow[64], pexp[64];
    float pw[64];
    for (int i = 0; i < n; i++) {
        rows[i] = (uint32_t)(i / k);
        prow[i] = (uint32_t)i;
        pexp[i] = (uint32_t)ids_a[i];
        pw[i] = w_a[i];
        slots[i] = (uint32_t)i;
    }
    void *d_rows = NULL, *d_codes = NULL, *d_scales = NULL, *d_out = NULL, *d_slots = NULL;
    if (mb_dev_alloc(be, &d_rows, 256, &err) == 0 && mb_dev_alloc(be, &d_slots, 256, &err) == 0 &&
        mb_dev_alloc(be, &d_codes, (size_t)n * H, &err) == 0 &&
        mb_dev_alloc(be, &d_scales, (size_t)n * H / 128 * 4, &err) == 0 &&
        mb_dev_alloc(be, &d_out, (size_t)n * H * 2, &err) == 0) {
        rc = mb_dev_h2d(be, d_rows, rows, (size_t)n * 4, &err) ||
                     mb_dev_h2d(be, d_slots, slots, (size_t)n * 4, &err) ||
                     mb_dev_gather(be, H, n, d_rows, mb_dev_step_q(s), mb_dev_step_qs(s), false,
                                   d_codes, d_scales, &err) ||
                     mb_dev_experts(be, la, n, d_codes, d_scales, n, prow, pexp, pw, d_out, &err) ||
                     mb_dev_scatter(be, H, n, d_slots, d_out, mb_dev_step_eo(s, &err), &err) ||
                     mb_dev_step_finish(s, got, INT64_MAX, &err)
                 ? -1
                 : 0;
        mb_dev_free(be, d_rows), mb_dev_free(be, d_slots), mb_dev_free(be, d_codes);
        mb_dev_free(be, d_scales), mb_dev_free(be, d_out);
    }
    if (rc != 0)
        printf("  %s: %s\n", mb_name(be), err.msg);
    mb_step_free(&s);
    return rc;
}

/* The device-resident step API (what the NCCL plane uses) gives the CPU backend's bits. */
TEST(device_resident_steps_give_the_cpu_bits)
{
    fixture f;
    if (fixture_make(&f, MC_FP4, 256, 256, 8, 3, 61) != 0) {
        CHECK(0);
        return;
    }
    ep_err err = {0};
    mb_backend *be = fake_backend(MB_GEMM_EXACT), *ref = cpu_backend();
    st_model *m = st_model_open(f.dir, &err);
    int layer = 2, T = 9, H = f.c.hidden_size, k = f.c.num_experts_per_tok;
    mb_layer *la =
        be && m ? shard_load_layer(be, m, &f.c, layer, NULL, NULL, NULL, NULL, &err) : NULL;
    mb_layer *lb =
        ref && m ? shard_load_layer(ref, m, &f.c, layer, NULL, NULL, NULL, NULL, &err) : NULL;
    CHECK(la && lb);
    if (la && lb) {
        uint16_t *x = malloc((size_t)T * H * 2), *want = malloc((size_t)T * H * 2);
        uint16_t *got = malloc((size_t)T * H * 2);
        int32_t ids_b[64];
        float w_b[64];
        for (int i = 0; i < T * H; i++)
            x[i] = fmt_f32_to_bf16((float)((i * 7919) % 211 - 105) / 13.0f);
        CHECK_EQ(mb_forward(ref, lb, T, x, NULL, want, ids_b, w_b, &err), 0);
        CHECK_EQ(dev_path(be, la, T, H, k, x, ids_b, got), 0);
        CHECK(memcmp(got, want, (size_t)T * H * 2) == 0);
        /* the CPU backend's device operations (host memory) take the same path to the same
         * bits */
        memset(got, 0, (size_t)T * H * 2);
        CHECK_EQ(dev_path(ref, lb, T, H, k, x, ids_b, got), 0);
        CHECK(memcmp(got, want, (size_t)T * H * 2) == 0);
        free(x), free(want), free(got);
    }
    mb_layer_free(&la);
    mb_layer_free(&lb);
    st_model_close(&m);
    mb_destroy(&be);
    mb_destroy(&ref);
    gen_model_remove(f.dir);
}

TEST(without_a_device_the_errors_say_why)
{
    ep_err err = {0};
    mb_options o = {.device = "cuda:3", .threads = 1};
    CHECK(mb_cuda_create_with(&o, 3, &FAKE, &err) == NULL);
    CHECK_STR_HAS(err.msg, "cuda:3: no such CUDA device");
    mb_device_kind kind;
    int ord;
    CHECK_EQ(mb_parse_device("cuda:12", &kind, &ord, &err), 0);
    CHECK_EQ(ord, 12);
    CHECK_EQ(mb_parse_device("cuda:x", &kind, &ord, &err), -1);
    CHECK_STR_HAS(err.msg, "expected \"cpu\" or \"cuda:N\"");
    CHECK_EQ(mb_parse_device("cuda:256", &kind, &ord, &err), -1);
    CHECK_EQ(mb_parse_device("", &kind, &ord, &err), -1);
}

/* The EPMOE_CUDA_* knobs as knob_load reads them become the tuning that means what the text
 * meant when kernels/cuda read the environment (docs/operations.md): unset, the defaults; a
 * row count of 0, "none"; cuBLASLt's "0", "1" and "require". */
static mb_cuda_tuning tuning_with(const char *name, const char *text)
{
    static const char *const names[] = {"EPMOE_CUDA_WAIT_S",    "EPMOE_CUDA_STAGE_BYTES",
                                        "EPMOE_CUDA_CUBLASLT",  "EPMOE_CUDA_CUBLASLT_ROWS",
                                        "EPMOE_CUDA_FAST_ROWS", "EPMOE_CUDA_EXACT",
                                        "EPMOE_CUDA_SPLIT",     "EPMOE_CUDA_MODULE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unsetenv(names[i]);
    if (name)
        setenv(name, text, 1);
    knob_values kv;
    ep_err err = {0};
    mb_cuda_tuning t = {0};
    CHECK_EQ(knob_load(&kv, KNOB_WORKER, &err), 0);
    mb_cuda_tuning_from_knobs(&t, &kv);
    if (name)
        unsetenv(name);
    return t;
}

TEST(cuda_knobs_keep_their_meaning_as_options)
{
    mb_cuda_tuning t = tuning_with(NULL, NULL);
    CHECK(t.wait_s == 120);
    CHECK_EQ(t.stage_bytes, 32u << 20);
    CHECK_EQ(t.cublaslt, MB_LT_AUTO);
    CHECK_EQ(cu_tune_lt_rows(&t), 96);
    CHECK_EQ(cu_tune_fast_rows(&t), 16);
    CHECK_EQ(cu_tune_split(&t), 4);
    CHECK(!cu_tune_exact_ref(&t));
    CHECK(t.module == NULL);
    t = tuning_with("EPMOE_CUDA_WAIT_S", "0.2");
    CHECK(t.wait_s == 0.2);
    t = tuning_with("EPMOE_CUDA_STAGE_BYTES", "65536");
    CHECK_EQ(t.stage_bytes, 65536);
    CHECK_EQ(tuning_with("EPMOE_CUDA_CUBLASLT", "0").cublaslt, MB_LT_NEVER);
    CHECK_EQ(tuning_with("EPMOE_CUDA_CUBLASLT", "1").cublaslt, MB_LT_ALWAYS);
    CHECK_EQ(tuning_with("EPMOE_CUDA_CUBLASLT", "require").cublaslt, MB_LT_REQUIRE);
    t = tuning_with("EPMOE_CUDA_CUBLASLT_ROWS", "64");
    CHECK_EQ(cu_tune_lt_rows(&t), 64);
    t = tuning_with("EPMOE_CUDA_CUBLASLT_ROWS", "0");
    CHECK_EQ(cu_tune_lt_rows(&t), 0);
    t = tuning_with("EPMOE_CUDA_FAST_ROWS", "0");
    CHECK_EQ(cu_tune_fast_rows(&t), 0);
    t = tuning_with("EPMOE_CUDA_SPLIT", "16");
    CHECK_EQ(cu_tune_split(&t), 16);
    t = tuning_with("EPMOE_CUDA_SPLIT", "1");
    CHECK_EQ(cu_tune_split(&t), 1);
    t = tuning_with("EPMOE_CUDA_EXACT", "ref");
    CHECK(cu_tune_exact_ref(&t));
    t = tuning_with("EPMOE_CUDA_MODULE", "/opt/libepmoe_cuda.so");
    CHECK_STR_EQ(t.module, "/opt/libepmoe_cuda.so");
}

int main(void)
{
    RUN(backend_over_a_fake_device_gives_the_cpu_bits);
    RUN(requests_larger_than_the_step_buffers_run_in_chunks);
    RUN(a_reserved_shard_is_one_device_arena);
    RUN(device_memory_check_names_both_sizes);
    RUN(device_failures_are_explicit_errors);
    RUN(device_resident_steps_give_the_cpu_bits);
    RUN(without_a_device_the_errors_say_why);
    RUN(cuda_knobs_keep_their_meaning_as_options);
    return test_report();
}
