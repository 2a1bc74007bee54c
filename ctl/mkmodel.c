/*
 * mkmodel.c — the synthetic DeepSeek V4 checkpoint generator (see mkmodel.h).
 *
 * Layout. The checkpoint is a list of units: embed.weight, the MoE layers (main layers 0..L-1
 * then MTP layers 0..M-1), then head.weight and norm.weight. MoE layer l of n goes to shard
 * l*S/n (S <= n shards), so every shard holds whole, consecutive layers and none is empty; the
 * embedding rides in the first shard, head and norm in the last. A layer's tensors are its MoE
 * tensors in the order of ck_layer_tensors, then the non-MoE tensors a loader must skip.
 * Shards are written one after the other; within a layer, up to `threads` items are generated
 * at once and added to the shard's writer in table order.
 *
 * Determinism. Each tensor (each weight+scale pair) draws from its own xoshiro256** stream
 * seeded from FNV-1a(name) and the seed through splitmix64. Gaussians come from Box-Muller with
 * a logarithm and sine/cosine written here as polynomials in double precision: IEEE basic
 * operations (and sqrt) are correctly rounded, the build forbids FMA contraction and C11 on
 * x86-64/aarch64 evaluates doubles in double (FLT_EVAL_METHOD 0), so the bits do not depend on
 * the host's libm, the thread count or the shard count.
 */
#include "ctl/mkmodel.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/safetensors_writer.h"
#include "kernels/formats.h"

#define MK_INDEX_NAME  "model.safetensors.index.json"
#define MK_SINGLE_NAME "model.safetensors"
#define MK_CONFIG_NAME "config.json"

/* Spec §1.1 values every V4 checkpoint has. */
#define MK_ROUTED_SCALING 1.5
#define MK_SWIGLU_LIMIT   10.0
#define MK_RMS_EPS        1e-6
/* Flash's e_score_correction_bias values sit near 8.08; ours are 8 + U(-0.05, 0.05). */
#define MK_BIAS_CENTER 8.0
#define MK_BIAS_HALF   0.05
#define MK_NORM_STD    0.05
/* hc_ffn_fn is [24, hc_mult * H] with hc_mult = 4 (spec §2.3: [24, 16384] at H 4096). */
#define MK_HC_MULT 4
#define MK_HC_ROWS 24
/* Block amax floor, as the reference act_quant: keeps an all-zero block's scale finite and
 * its E8M0 code well inside [1, 254]. */
#define MK_AMAX_FLOOR 1e-4f

void mk_options_init(mk_options *o)
{
    *o = (mk_options){
        .out_dir = NULL,
        .expert_dtype = MC_FP4,
        .omit_expert_dtype = false,
        .force = false,
        .hidden = 256,
        .inter = 128,
        .experts = 16,
        .topk = 6,
        .layers = 4,
        .hash_layers = 1,
        .mtp = 1,
        .vocab = 1000,
        .shards = 2,
        .seed = 1,
        .threads = 0,
    };
}

/* ---- PRNG and Gaussians ----------------------------------------------------------------- */

typedef struct mk_rng {
    uint64_t s[4];
    double spare; /* Box-Muller's second value */
    bool has_spare;
} mk_rng;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** 1.0 (Blackman and Vigna). */
static uint64_t rng_next(mk_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* The stream of one tensor: a function of the seed and the name only. */
static void rng_init(mk_rng *r, uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    uint64_t x = seed;
    x = splitmix64(&x) ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->has_spare = false;
}

/* Uniform in [0, 1), 53 bits. */
static double rng_unit(mk_rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1p-53;
}

/* Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject). */
static uint32_t rng_below(mk_rng *r, uint32_t n)
{
    uint64_t m = (rng_next(r) >> 32) * (uint64_t)n;
    if ((uint32_t)m < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while ((uint32_t)m < t)
            m = (rng_next(r) >> 32) * (uint64_t)n;
    }
    return (uint32_t)(m >> 32);
}

/* ln(u) for u in (0, 1]: u = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172, series to s^21 (error < 1e-18). */
static double mk_ln(double u)
{
    uint64_t b;
    memcpy(&b, &u, sizeof b);
    int e = (int)((b >> 52) & 0x7ff) - 1023;
    b = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double m;
    memcpy(&m, &b, sizeof m);
    /* Branch-free: the comparison is a coin flip on random input. */
    static const double halve[2] = {1.0, 0.5};
    int hi = m > 1.4142135623730951;
    m *= halve[hi];
    e += hi;
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 21;
    p = p * s2 + 1.0 / 19;
    p = p * s2 + 1.0 / 17;
    p = p * s2 + 1.0 / 15;
    p = p * s2 + 1.0 / 13;
    p = p * s2 + 1.0 / 11;
    p = p * s2 + 1.0 / 9;
    p = p * s2 + 1.0 / 7;
    p = p * s2 + 1.0 / 5;
    p = p * s2 + 1.0 / 3;
    p = p * s2 + 1.0;
    return (double)e * 0.69314718055994531 + 2.0 * s * p;
}

/* sin and cos of 2*pi*v for v in [0, 1): quadrant from 4v (exact), Taylor series on
 * [0, pi/2) to degree 17/18 (error < 1e-13). */
static void mk_sincos_2pi(double v, double *sn, double *cs)
{
    double x = v * 4.0;
    int q = (int)x;
    double a = (x - (double)q) * 1.5707963267948966, a2 = a * a;
    /* Horner in a^2 with the Taylor coefficients 1/n!, alternating. */
    double sp = 1.0 / 355687428096000.0;
    sp = sp * a2 - 1.0 / 1307674368000.0;
    sp = sp * a2 + 1.0 / 6227020800.0;
    sp = sp * a2 - 1.0 / 39916800.0;
    sp = sp * a2 + 1.0 / 362880.0;
    sp = sp * a2 - 1.0 / 5040.0;
    sp = sp * a2 + 1.0 / 120.0;
    sp = sp * a2 - 1.0 / 6.0;
    sp = sp * a2 + 1.0;
    double s = a * sp;
    double cp = -1.0 / 6402373705728000.0;
    cp = cp * a2 + 1.0 / 20922789888000.0;
    cp = cp * a2 - 1.0 / 87178291200.0;
    cp = cp * a2 + 1.0 / 479001600.0;
    cp = cp * a2 - 1.0 / 3628800.0;
    cp = cp * a2 + 1.0 / 40320.0;
    cp = cp * a2 - 1.0 / 720.0;
    cp = cp * a2 + 1.0 / 24.0;
    cp = cp * a2 - 0.5;
    cp = cp * a2 + 1.0;
    /* Rotate by q quarter turns without branching (q is random): odd q swaps sine and cosine
     * and negates the new cosine; q >= 2 negates both. Multiplying by +-1 is exact. */
    static const double sign[2] = {1.0, -1.0};
    const double sc[2] = {s, cp};
    const int odd = q & 1, half = (q >> 1) & 1;
    *sn = sc[odd] * sign[half];
    *cs = sc[odd ^ 1] * sign[odd] * sign[half];
}

/* One Box-Muller pair of standard normals. */
static void rng_normal_pair(mk_rng *r, double *z0, double *z1)
{
    double u = (double)((rng_next(r) >> 11) + 1) * 0x1p-53; /* (0, 1]: ln is finite */
    double v = rng_unit(r);
    double rad = sqrt(-2.0 * mk_ln(u));
    double sn, cs;
    mk_sincos_2pi(v, &sn, &cs);
    *z0 = rad * cs;
    *z1 = rad * sn;
}

/* out[i] = mean + std * N(0, 1). The stream is a sequence of pairs; an odd count keeps the
 * second value of the last pair for the next call, so splitting a fill into calls does not
 * change the values. */
static void rng_gauss(mk_rng *r, float *out, size_t n, double mean, double std)
{
    size_t i = 0;
    if (n > 0 && r->has_spare) {
        out[i++] = (float)(mean + std * r->spare);
        r->has_spare = false;
    }
    for (; i + 2 <= n; i += 2) {
        double z0, z1;
        rng_normal_pair(r, &z0, &z1);
        out[i] = (float)(mean + std * z0);
        out[i + 1] = (float)(mean + std * z1);
    }
    if (i < n) {
        double z0;
        rng_normal_pair(r, &z0, &r->spare);
        r->has_spare = true;
        out[i] = (float)(mean + std * z0);
    }
}

/* ---- little-endian stores --------------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_u32(p, u);
}

/* ---- tensor items ----------------------------------------------------------------------- */

typedef enum mk_gen {
    GEN_BF16,    /* BF16 mean + N(0, std) */
    GEN_F32,     /* F32 mean + N(0, std) */
    GEN_BIAS,    /* F32 MK_BIAS_CENTER + U(-MK_BIAS_HALF, MK_BIAS_HALF) */
    GEN_TID2EID, /* I64 [vocab, k]: k distinct uniform ids in [0, E) per row */
    GEN_MXFP4,   /* I8 [N, K/2] + F8_E8M0 [N, K/32] from N(0, std) */
    GEN_FP8,     /* F8_E4M3 [N, K] + (F8_E8M0 | F32) [N/128, K/128] from N(0, std) */
} mk_gen;

/* One tensor, or one weight+scale pair (GEN_MXFP4, GEN_FP8). */
typedef struct mk_item {
    char name[EP_MAX_NAME];
    char scale_name[EP_MAX_NAME]; /* pairs only */
    mk_gen gen;
    st_dtype dtype, scale_dtype;
    int ndim;
    int64_t shape[2], scale_shape[2];
    int64_t rows, cols; /* logical [N, K] of a quantized pair */
    double mean, std;
    int experts; /* GEN_TID2EID: E */
} mk_item;

typedef struct mk_list {
    mk_item *items;
    int count, cap;
} mk_list;

static mk_item *list_push(mk_list *l, ep_err *err)
{
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        mk_item *ni = realloc(l->items, (size_t)cap * sizeof *ni);
        if (ni == NULL) {
            ep_err_set(err, "out of memory for the tensor list");
            return NULL;
        }
        l->items = ni;
        l->cap = cap;
    }
    mk_item *it = &l->items[l->count++];
    memset(it, 0, sizeof *it);
    return it;
}

static int64_t item_numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static uint64_t item_bytes(const mk_item *it)
{
    uint64_t b = (uint64_t)item_numel(it->shape, it->ndim) * st_dtype_size(it->dtype);
    if (it->gen == GEN_MXFP4 || it->gen == GEN_FP8)
        b += (uint64_t)item_numel(it->scale_shape, 2) * st_dtype_size(it->scale_dtype);
    return b;
}

static int item_tensors(const mk_item *it)
{
    return it->gen == GEN_MXFP4 || it->gen == GEN_FP8 ? 2 : 1;
}

static bool has_suffix(const char *s, const char *sfx)
{
    size_t n = strlen(s), m = strlen(sfx);
    return n >= m && strcmp(s + n - m, sfx) == 0;
}

static int push_plain(mk_list *l, const char *name, mk_gen gen, st_dtype dt, int ndim, int64_t d0,
                      int64_t d1, double mean, double std, ep_err *err)
{
    mk_item *it = list_push(l, err);
    if (it == NULL)
        return -1;
    snprintf(it->name, sizeof it->name, "%s", name);
    it->gen = gen;
    it->dtype = dt;
    it->ndim = ndim;
    it->shape[0] = d0;
    it->shape[1] = ndim > 1 ? d1 : 0;
    it->mean = mean;
    it->std = std;
    return 0;
}

/* An FP8 block linear [N, K] named STEM.weight / STEM.scale. */
static int push_fp8(mk_list *l, const char *stem, int64_t N, int64_t K, bool e8m0, ep_err *err)
{
    mk_item *it = list_push(l, err);
    if (it == NULL)
        return -1;
    snprintf(it->name, sizeof it->name, "%s.weight", stem);
    snprintf(it->scale_name, sizeof it->scale_name, "%s.scale", stem);
    it->gen = GEN_FP8;
    it->dtype = ST_F8_E4M3;
    it->scale_dtype = e8m0 ? ST_F8_E8M0 : ST_F32;
    it->ndim = 2;
    it->shape[0] = it->rows = N;
    it->shape[1] = it->cols = K;
    it->scale_shape[0] = N / EP_FP8_BLOCK;
    it->scale_shape[1] = K / EP_FP8_BLOCK;
    it->std = 1.0 / sqrt((double)K);
    return 0;
}

/* The MoE tensors of one layer, from the checker's table: weights pair with the scale that
 * follows them; the rest are told apart by name. */
static int push_moe(mk_list *l, const mc_config *c, int layer, ep_err *err)
{
    int n = ck_layer_tensor_count(c, layer, 0, c->n_routed_experts);
    ck_tensor_spec *t = n > 0 ? calloc((size_t)n, sizeof *t) : NULL;
    if (t == NULL)
        return ep_err_set(err, "out of memory for the tensor table of layer %d", layer);
    int rc = 0;
    if (ck_layer_tensors(c, layer, 0, c->n_routed_experts, t, n) != n) {
        rc = ep_err_set(err, "internal error: tensor table of layer %d", layer);
        goto out;
    }
    const double H = c->hidden_size;
    for (int i = 0; i < n && rc == 0; i++) {
        const ck_tensor_spec *s = &t[i];
        if (s->dtype == ST_I8 || s->dtype == ST_F8_E4M3) {
            if (i + 1 >= n || !has_suffix(t[i + 1].name, ".scale")) {
                rc = ep_err_set(err, "internal error: \"%s\" has no scale after it", s->name);
                break;
            }
            mk_item *it = list_push(l, err);
            if (it == NULL) {
                rc = -1;
                break;
            }
            snprintf(it->name, sizeof it->name, "%s", s->name);
            snprintf(it->scale_name, sizeof it->scale_name, "%s", t[i + 1].name);
            it->gen = s->dtype == ST_I8 ? GEN_MXFP4 : GEN_FP8;
            it->dtype = s->dtype;
            it->scale_dtype = t[i + 1].dtype;
            it->ndim = 2;
            memcpy(it->shape, s->shape, sizeof it->shape);
            memcpy(it->scale_shape, t[i + 1].shape, sizeof it->scale_shape);
            it->rows = s->shape[0];
            it->cols = s->dtype == ST_I8 ? 2 * s->shape[1] : s->shape[1];
            it->std = 1.0 / sqrt((double)it->cols);
            i++;
        } else if (has_suffix(s->name, "ffn_norm.weight")) {
            rc = push_plain(l, s->name, GEN_BF16, s->dtype, s->ndim, s->shape[0], s->shape[1], 1.0,
                            MK_NORM_STD, err);
        } else if (has_suffix(s->name, "gate.weight")) {
            rc = push_plain(l, s->name, GEN_BF16, s->dtype, s->ndim, s->shape[0], s->shape[1], 0.0,
                            1.0 / sqrt(H), err);
        } else if (has_suffix(s->name, "gate.bias")) {
            rc = push_plain(l, s->name, GEN_BIAS, s->dtype, s->ndim, s->shape[0], s->shape[1], 0.0,
                            0.0, err);
        } else if (has_suffix(s->name, "gate.tid2eid")) {
            rc = push_plain(l, s->name, GEN_TID2EID, s->dtype, s->ndim, s->shape[0], s->shape[1],
                            0.0, 0.0, err);
            if (rc == 0)
                l->items[l->count - 1].experts = c->n_routed_experts;
        } else {
            rc = ep_err_set(err, "internal error: no generator for \"%s\"", s->name);
        }
    }
out:
    free(t);
    return rc;
}

/* Non-MoE tensors of a layer: enough of attention, mHC and MTP for a loader to have to skip
 * them (spec §2.3, §2.5), kept small. */
static int push_other(mk_list *l, const mc_config *c, int layer, ep_err *err)
{
    char pfx[32], name[EP_MAX_NAME];
    ck_layer_prefix(c, layer, pfx, sizeof pfx);
    const int64_t H = c->hidden_size;
    if (layer < c->num_hidden_layers) {
        snprintf(name, sizeof name, "%sattn_norm.weight", pfx);
        if (push_plain(l, name, GEN_BF16, ST_BF16, 1, H, 0, 1.0, MK_NORM_STD, err) != 0)
            return -1;
        snprintf(name, sizeof name, "%sattn.wq_a", pfx);
        if (push_fp8(l, name, EP_FP8_BLOCK, H, c->scale_e8m0, err) != 0)
            return -1;
        snprintf(name, sizeof name, "%shc_ffn_fn", pfx);
        if (push_plain(l, name, GEN_F32, ST_F32, 2, MK_HC_ROWS, MK_HC_MULT * H, 0.0,
                       1.0 / sqrt((double)(MK_HC_MULT * H)), err) != 0)
            return -1;
        snprintf(name, sizeof name, "%shc_ffn_base", pfx);
        if (push_plain(l, name, GEN_F32, ST_F32, 1, MK_HC_ROWS, 0, 0.0, 0.1, err) != 0)
            return -1;
        snprintf(name, sizeof name, "%shc_ffn_scale", pfx);
        return push_plain(l, name, GEN_F32, ST_F32, 1, 3, 0, 1.0, 0.1, err);
    }
    static const char *const projs[] = {"e_proj", "h_proj"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s", pfx, projs[i]);
        if (push_fp8(l, name, H, H, c->scale_e8m0, err) != 0)
            return -1;
    }
    static const char *const norms[] = {"enorm", "hnorm", "norm"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s%s.weight", pfx, norms[i]);
        if (push_plain(l, name, GEN_BF16, ST_BF16, 1, H, 0, 1.0, MK_NORM_STD, err) != 0)
            return -1;
    }
    return 0;
}

/* A checkpoint is units 0..n+1 (n = mc_num_layers): unit 0 is embed.weight, unit 1+l is MoE
 * layer l, unit n+1 is head.weight and norm.weight. */
static int unit_count(const mc_config *c)
{
    return mc_num_layers(c) + 2;
}

static int unit_shard(const mc_config *c, int u, int S)
{
    const int n = mc_num_layers(c);
    if (u == 0)
        return 0;
    if (u == n + 1)
        return S - 1;
    return (int)((int64_t)(u - 1) * S / n);
}

/* The items of unit u, appended to l in file order. */
static int unit_items(const mc_config *c, int u, mk_list *l, ep_err *err)
{
    const int n = mc_num_layers(c);
    const int64_t H = c->hidden_size, V = c->vocab_size;
    const double sH = 1.0 / sqrt((double)H);
    if (u == 0)
        return push_plain(l, "embed.weight", GEN_BF16, ST_BF16, 2, V, H, 0.0, sH, err);
    if (u == n + 1) {
        if (push_plain(l, "head.weight", GEN_BF16, ST_BF16, 2, V, H, 0.0, sH, err) != 0)
            return -1;
        return push_plain(l, "norm.weight", GEN_BF16, ST_BF16, 1, H, 0, 1.0, MK_NORM_STD, err);
    }
    if (push_moe(l, c, u - 1, err) != 0)
        return -1;
    return push_other(l, c, u - 1, err);
}

/* ---- generation ------------------------------------------------------------------------- */

/* MXFP4: row by row, DeepGEMM's per-32 cast (fmt_mxfp4_quant_row). */
static void gen_mxfp4(const mk_item *it, mk_rng *r, float *row, uint8_t *w, uint8_t *sc)
{
    const int64_t N = it->rows, K = it->cols;
    for (int64_t n = 0; n < N; n++) {
        rng_gauss(r, row, (size_t)K, 0.0, it->std);
        fmt_mxfp4_quant_row(row, (int)K, w + n * (K / 2), sc + n * (K / EP_MXFP4_GROUP));
    }
}

/* FP8 block: 128 rows at a time (slab holds [128, K] floats). E8M0: s = 2^ceil(log2(amax/448)),
 * exact power of two; F32: s = amax/448 unrounded (Flash-Base). q = e4m3(x / s). */
static void gen_fp8(const mk_item *it, mk_rng *r, float *slab, uint8_t *w, uint8_t *sc)
{
    const int64_t N = it->rows, K = it->cols, B = EP_FP8_BLOCK, KB = K / B;
    const bool e8m0 = it->scale_dtype == ST_F8_E8M0;
    for (int64_t n0 = 0; n0 < N; n0 += B) {
        rng_gauss(r, slab, (size_t)(B * K), 0.0, it->std);
        for (int64_t kb = 0; kb < KB; kb++) {
            float amax = 0.0f;
            for (int64_t i = 0; i < B; i++)
                for (int64_t k = kb * B; k < (kb + 1) * B; k++) {
                    float v = fabsf(slab[i * K + k]);
                    amax = v > amax ? v : amax;
                }
            if (amax < MK_AMAX_FLOOR)
                amax = MK_AMAX_FLOOR;
            float s;
            int64_t si = (n0 / B) * KB + kb;
            if (e8m0) {
                uint8_t code = fmt_e8m0_ceil(amax / 448.0f);
                s = fmt_e8m0_to_f32(code);
                sc[si] = code;
            } else {
                s = amax / 448.0f;
                put_f32(sc + 4 * si, s);
            }
            for (int64_t i = 0; i < B; i++)
                for (int64_t k = kb * B; k < (kb + 1) * B; k++)
                    w[(n0 + i) * K + k] = fmt_f32_to_e4m3(slab[i * K + k] / s);
        }
    }
}

static void gen_tid2eid(const mk_item *it, mk_rng *r, uint8_t *out)
{
    const int64_t V = it->shape[0], k = it->shape[1];
    uint32_t pick[MC_MAX_TOPK];
    for (int64_t v = 0; v < V; v++) {
        for (int64_t j = 0; j < k; j++) {
            bool dup;
            do {
                pick[j] = rng_below(r, (uint32_t)it->experts);
                dup = false;
                for (int64_t i = 0; i < j; i++)
                    dup = dup || pick[i] == pick[j];
            } while (dup);
            put_u64(out + 8 * (v * k + j), pick[j]);
        }
    }
}

/* Generate one item into fresh buffers: *data holds the tensor, *sdata the scale of a pair
 * (else a 1-byte placeholder). Touches nothing shared, so items run on any thread. */
static int gen_item(const mk_item *it, uint64_t seed, uint8_t **data_p, uint8_t **sdata_p,
                    ep_err *err)
{
    mk_rng r;
    rng_init(&r, seed, it->name);
    const int64_t numel = item_numel(it->shape, it->ndim);
    const size_t nbytes = (size_t)numel * st_dtype_size(it->dtype);
    size_t scratch = 0, sbytes = 0;
    if (it->gen == GEN_MXFP4)
        scratch = (size_t)it->cols;
    else if (it->gen == GEN_FP8)
        scratch = (size_t)(EP_FP8_BLOCK * it->cols);
    else if (it->gen == GEN_BF16 || it->gen == GEN_F32)
        scratch = (size_t)numel;
    if (it->gen == GEN_MXFP4 || it->gen == GEN_FP8)
        sbytes = (size_t)item_numel(it->scale_shape, 2) * st_dtype_size(it->scale_dtype);

    uint8_t *data = malloc(nbytes ? nbytes : 1), *sdata = malloc(sbytes ? sbytes : 1);
    float *f = malloc(scratch ? scratch * sizeof *f : 1);
    if (data == NULL || sdata == NULL || f == NULL) {
        free(f);
        free(sdata);
        free(data);
        return ep_err_set(err, "tensor \"%s\": out of memory for %zu bytes", it->name, nbytes);
    }
    switch (it->gen) {
    case GEN_BF16:
        rng_gauss(&r, f, (size_t)numel, it->mean, it->std);
        for (int64_t i = 0; i < numel; i++)
            put_u16(data + 2 * i, fmt_f32_to_bf16(f[i]));
        break;
    case GEN_F32:
        rng_gauss(&r, f, (size_t)numel, it->mean, it->std);
        for (int64_t i = 0; i < numel; i++)
            put_f32(data + 4 * i, f[i]);
        break;
    case GEN_BIAS:
        for (int64_t i = 0; i < numel; i++)
            put_f32(data + 4 * i,
                    (float)(MK_BIAS_CENTER + (2.0 * rng_unit(&r) - 1.0) * MK_BIAS_HALF));
        break;
    case GEN_TID2EID:
        gen_tid2eid(it, &r, data);
        break;
    case GEN_MXFP4:
        gen_mxfp4(it, &r, f, data, sdata);
        break;
    case GEN_FP8:
        gen_fp8(it, &r, f, data, sdata);
        break;
    }
    free(f);
    *data_p = data;
    *sdata_p = sdata;
    return 0;
}

/* One item generated by a thread of the window. */
typedef struct mk_job {
    const mk_item *it;
    uint64_t seed;
    uint8_t *data, *sdata;
    int rc;
    ep_err err;
} mk_job;

static void *job_run(void *arg)
{
    mk_job *j = arg;
    j->rc = gen_item(j->it, j->seed, &j->data, &j->sdata, &j->err);
    return NULL;
}

/* Generate items[0..n) on up to n threads (the caller's included), then add them to w in
 * order. Every job's buffers are freed, whatever fails. */
static int gen_window(const mk_item *items, int n, uint64_t seed, st_writer *w, ep_err *err)
{
    mk_job jobs[MK_MAX_THREADS];
    pthread_t tids[MK_MAX_THREADS];
    bool started[MK_MAX_THREADS] = {false};
    for (int i = 0; i < n; i++)
        jobs[i] = (mk_job){.it = &items[i], .seed = seed, .rc = -1};
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&tids[i], NULL, job_run, &jobs[i]) == 0;
    job_run(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            job_run(&jobs[i]); /* no thread to be had: do it here */
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const mk_item *it = jobs[i].it;
        if (rc == 0 && jobs[i].rc != 0)
            rc = ep_err_set(err, "%s", jobs[i].err.msg);
        if (rc == 0)
            rc = st_writer_add(w, it->name, it->dtype, it->ndim, it->shape, jobs[i].data, err);
        if (rc == 0 && item_tensors(it) == 2)
            rc = st_writer_add(w, it->scale_name, it->scale_dtype, 2, it->scale_shape,
                               jobs[i].sdata, err);
        free(jobs[i].data);
        free(jobs[i].sdata);
    }
    return rc;
}

/* ---- options ---------------------------------------------------------------------------- */

/* config.json field -> option, for messages. */
static const struct {
    const char *field, *option;
    size_t off;
} MK_FIELDS[] = {
    {"hidden_size", "--hidden", offsetof(mk_options, hidden)},
    {"moe_intermediate_size", "--inter", offsetof(mk_options, inter)},
    {"n_routed_experts", "--experts", offsetof(mk_options, experts)},
    {"num_experts_per_tok", "--topk", offsetof(mk_options, topk)},
    {"num_hidden_layers", "--layers", offsetof(mk_options, layers)},
    {"num_hash_layers", "--hash-layers", offsetof(mk_options, hash_layers)},
    {"num_nextn_predict_layers", "--mtp", offsetof(mk_options, mtp)},
    {"vocab_size", "--vocab", offsetof(mk_options, vocab)},
};
enum { MK_NFIELDS = sizeof MK_FIELDS / sizeof MK_FIELDS[0] };

/* Append text to buf at *o, replacing config field names by their options. */
static void append_with_options(char *buf, size_t cap, size_t *o, const char *text)
{
    while (*text != '\0' && *o + 1 < cap) {
        int hit = -1;
        for (int i = 0; i < MK_NFIELDS && hit < 0; i++)
            if (strncmp(text, MK_FIELDS[i].field, strlen(MK_FIELDS[i].field)) == 0)
                hit = i;
        if (hit >= 0) {
            int w = snprintf(buf + *o, cap - *o, "%s", MK_FIELDS[hit].option);
            *o = w < 0 || (size_t)w >= cap - *o ? cap - 1 : *o + (size_t)w;
            text += strlen(MK_FIELDS[hit].field);
        } else {
            buf[(*o)++] = *text++;
        }
    }
    buf[*o] = '\0';
}

/* mc_validate says 'model config: field "KEY": REST'; say it in terms of options:
 * '--OPT: REST (config.json field "KEY")', field names in REST also shown as options. */
static int option_error(const mk_options *o, ep_err *err)
{
    const char *f = strstr(err->msg, "field \"");
    if (f == NULL)
        return ep_err_prefix(err, "invalid options");
    f += strlen("field \"");
    const char *q = strchr(f, '"');
    if (q == NULL || strncmp(q, "\": ", 3) != 0)
        return ep_err_prefix(err, "invalid options");
    for (int i = 0; i < MK_NFIELDS; i++) {
        if (strlen(MK_FIELDS[i].field) != (size_t)(q - f) ||
            strncmp(f, MK_FIELDS[i].field, (size_t)(q - f)) != 0)
            continue;
        char msg[EP_ERR_MSG_MAX];
        size_t n = 0;
        int val = *(const int *)((const char *)o + MK_FIELDS[i].off);
        int w = snprintf(msg, sizeof msg, "%s %d: ", MK_FIELDS[i].option, val);
        n = w < 0 ? 0 : (size_t)w;
        append_with_options(msg, sizeof msg, &n, q + 3);
        return ep_err_set(err, "%s (config.json field \"%s\")", msg, MK_FIELDS[i].field);
    }
    return ep_err_prefix(err, "invalid options");
}

int mk_config(const mk_options *o, mc_config *out, ep_err *err)
{
    mc_config c = {
        .hidden_size = o->hidden,
        .moe_intermediate_size = o->inter,
        .n_routed_experts = o->experts,
        .n_shared_experts = 1,
        .num_experts_per_tok = o->topk,
        .num_hidden_layers = o->layers,
        .num_hash_layers = o->hash_layers,
        .num_nextn_predict_layers = o->mtp,
        .vocab_size = o->vocab,
        .routed_scaling_factor = (float)MK_ROUTED_SCALING,
        .swiglu_limit = (float)MK_SWIGLU_LIMIT,
        .rms_norm_eps = (float)MK_RMS_EPS,
        .norm_topk_prob = true,
        .expert_dtype = o->expert_dtype,
        .expert_dtype_given = true,
        .scale_e8m0 = o->expert_dtype == MC_FP4,
        .act_ue8m0 = true,
    };
    if (o->expert_dtype != MC_FP4 && o->expert_dtype != MC_FP8)
        return ep_err_set(err, "--expert-dtype: expected fp4 or fp8");
    if (mc_validate(&c, err) != 0)
        return option_error(o, err);
    *out = c;
    return 0;
}

int mk_check(const mk_options *o, mk_plan *plan, ep_err *err)
{
    if (o->out_dir == NULL || o->out_dir[0] == '\0')
        return ep_err_set(err, "--out: an output directory is required");
    if (strlen(o->out_dir) > EP_MAX_PATH - 64)
        return ep_err_set(err, "--out: path longer than %d bytes", EP_MAX_PATH - 64);
    if (o->threads < 0)
        return ep_err_set(err, "--threads %d: expected 0 (one per CPU) or a positive count",
                          o->threads);
    mc_config c;
    if (mk_config(o, &c, err) != 0)
        return -1;
    const int n = mc_num_layers(&c);
    if (o->shards < 1 || o->shards > n || o->shards > ST_MAX_SHARDS)
        return ep_err_set(err,
                          "--shards %d: expected 1..%d (shards hold whole layers: %d main + %d "
                          "MTP)",
                          o->shards, n < ST_MAX_SHARDS ? n : ST_MAX_SHARDS, o->layers, o->mtp);
    /* Count without materialising: a layer's MoE table is 9 + 6E entries. */
    int64_t tensors = 0;
    for (int u = 0; u < n; u++)
        tensors += ck_layer_tensor_count(&c, u, 0, c.n_routed_experts);
    if (tensors > ST_MAX_TENSORS)
        return ep_err_set(err,
                          "the checkpoint would have more than %d tensors (ST_MAX_TENSORS, the "
                          "most an index may list): use fewer --experts or --layers",
                          ST_MAX_TENSORS);
    mk_plan p = {.shards = o->shards};
    mk_list l = {0};
    int rc = 0;
    for (int u = 0; rc == 0 && u < unit_count(&c); u++) {
        l.count = 0;
        rc = unit_items(&c, u, &l, err);
        for (int i = 0; rc == 0 && i < l.count; i++) {
            p.tensors += item_tensors(&l.items[i]);
            p.bytes += item_bytes(&l.items[i]);
        }
    }
    free(l.items);
    if (rc != 0)
        return -1;
    if (p.tensors > ST_MAX_TENSORS)
        return ep_err_set(err, "the checkpoint would have %d tensors, more than %d", p.tensors,
                          ST_MAX_TENSORS);
    if (plan != NULL)
        *plan = p;
    return 0;
}

/* ---- output directory ------------------------------------------------------------------- */

static int join(char *buf, size_t cap, const char *dir, const char *name, ep_err *err)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return ep_err_set(err, "%s/%s: path too long", dir, name);
    return 0;
}

/* Files a previous mkmodel (or any checkpoint) left that would mix with ours. */
static bool is_checkpoint_file(const char *name)
{
    const char *base[] = {MK_CONFIG_NAME, MK_INDEX_NAME};
    for (int i = 0; i < 2; i++) {
        size_t m = strlen(base[i]);
        if (strcmp(name, base[i]) == 0 ||
            (strncmp(name, base[i], m) == 0 && strcmp(name + m, ".tmp") == 0))
            return true;
    }
    return has_suffix(name, ".safetensors") || has_suffix(name, ".safetensors.tmp");
}

/* Create dir, or accept an empty one, or (force) clear its checkpoint files. */
static int prepare_dir(const char *dir, bool force, ep_err *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT)
            return ep_err_errno(err, "%s", dir);
        if (mkdir(dir, 0777) != 0)
            return ep_err_errno(err, "%s: cannot create the output directory", dir);
        return 0;
    }
    if (!S_ISDIR(sb.st_mode))
        return ep_err_set(err, "%s: exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        return ep_err_errno(err, "%s", dir);
    int rc = 0;
    bool empty = true;
    struct dirent *e;
    errno = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        empty = false;
        if (!force)
            break;
        if (!is_checkpoint_file(e->d_name))
            continue;
        char path[EP_MAX_PATH];
        rc = join(path, sizeof path, dir, e->d_name, err);
        if (rc == 0 && unlink(path) != 0)
            rc = ep_err_errno(err, "%s: cannot remove", path);
    }
    closedir(d);
    if (rc == 0 && !empty && !force)
        rc = ep_err_set(err,
                        "%s: directory is not empty; refusing to overwrite it (--force replaces "
                        "its config.json, index and *.safetensors)",
                        dir);
    return rc;
}

static int check_space(const char *dir, uint64_t need, ep_err *err)
{
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0)
        return 0; /* unknown: let the writes tell */
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    if (avail < need)
        return ep_err_set(err,
                          "%s: the checkpoint needs %llu bytes but the file system has %llu "
                          "free",
                          dir, (unsigned long long)need, (unsigned long long)avail);
    return 0;
}

/* ---- config.json ------------------------------------------------------------------------ */

static int set_new(json_t *obj, const char *key, json_t *v)
{
    return v == NULL ? -1 : json_object_set_new(obj, key, v);
}

static json_t *config_json(const mk_options *o, const mc_config *c)
{
    json_t *root = json_object(), *q = json_object(), *wbs = json_pack("[ii]", 128, 128),
           *cr = json_array(), *arch = json_pack("[s]", "DeepseekV4ForCausalLM");
    int bad = root == NULL || q == NULL || wbs == NULL || cr == NULL || arch == NULL;
    for (int i = 0; !bad && i < mc_num_layers(c); i++)
        /* Irrelevant to the MoE layer; the pattern of Flash (dense first layers, then
         * alternating compression ratios), one entry per layer incl. MTP. */
        bad |= json_array_append_new(cr, json_integer(i < 2 ? 0 : (i % 2 ? 4 : 128))) != 0;
    if (bad) {
        json_decref(root), json_decref(q), json_decref(wbs), json_decref(cr), json_decref(arch);
        return NULL;
    }
    bad |= set_new(root, "architectures", arch);
    bad |= set_new(root, "model_type", json_string("deepseek_v4"));
    bad |= set_new(root, "torch_dtype", json_string("bfloat16"));
    bad |= set_new(root, "hidden_size", json_integer(c->hidden_size));
    bad |= set_new(root, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
    bad |= set_new(root, "n_routed_experts", json_integer(c->n_routed_experts));
    bad |= set_new(root, "n_shared_experts", json_integer(c->n_shared_experts));
    bad |= set_new(root, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
    bad |= set_new(root, "norm_topk_prob", json_true());
    bad |= set_new(root, "routed_scaling_factor", json_real(MK_ROUTED_SCALING));
    bad |= set_new(root, "scoring_func", json_string("sqrtsoftplus"));
    bad |= set_new(root, "topk_method", json_string("noaux_tc"));
    bad |= set_new(root, "num_hash_layers", json_integer(c->num_hash_layers));
    bad |= set_new(root, "swiglu_limit", json_real(MK_SWIGLU_LIMIT));
    bad |= set_new(root, "hidden_act", json_string("silu"));
    bad |= set_new(root, "num_hidden_layers", json_integer(c->num_hidden_layers));
    bad |= set_new(root, "num_nextn_predict_layers", json_integer(c->num_nextn_predict_layers));
    bad |= set_new(root, "vocab_size", json_integer(c->vocab_size));
    bad |= set_new(root, "rms_norm_eps", json_real(MK_RMS_EPS));
    if (!o->omit_expert_dtype)
        bad |= set_new(root, "expert_dtype", json_string(mc_dtype_name(o->expert_dtype)));
    bad |= set_new(q, "quant_method", json_string("fp8"));
    bad |= set_new(q, "fmt", json_string("e4m3"));
    bad |= set_new(q, "scale_fmt", json_string("ue8m0"));
    bad |= set_new(q, "weight_block_size", wbs);
    bad |= set_new(q, "activation_scheme", json_string("dynamic"));
    bad |= set_new(root, "quantization_config", q);
    /* V4 fields the MoE layer ignores (spec §1.1), present so readers must skip them. */
    bad |= set_new(root, "hc_mult", json_integer(MK_HC_MULT));
    bad |= set_new(root, "hc_sinkhorn_iters", json_integer(20));
    bad |= set_new(root, "hc_eps", json_real(1e-6));
    bad |= set_new(root, "head_dim", json_integer(512));
    bad |= set_new(root, "q_lora_rank", json_integer(1024));
    bad |= set_new(root, "o_lora_rank", json_integer(1024));
    bad |= set_new(root, "o_groups", json_integer(8));
    bad |= set_new(root, "sliding_window", json_integer(128));
    bad |= set_new(root, "compress_ratios", cr);
    bad |= set_new(root, "max_position_embeddings", json_integer(1048576));
    bad |= set_new(root, "bos_token_id", json_integer(0));
    bad |= set_new(root, "eos_token_id", json_integer(1));
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int write_config(const mk_options *o, const mc_config *c, ep_err *err)
{
    char path[EP_MAX_PATH], tmp[EP_MAX_PATH];
    if (join(path, sizeof path, o->out_dir, MK_CONFIG_NAME, err) != 0 ||
        join(tmp, sizeof tmp, o->out_dir, MK_CONFIG_NAME ".tmp", err) != 0)
        return -1;
    json_t *root = config_json(o, c);
    if (root == NULL)
        return ep_err_set(err, "%s: out of memory", path);
    /* 15 significant digits print 1e-6 as 1e-06, not 9.9999999999999995e-07. */
    int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (rc != 0) {
        unlink(tmp);
        return ep_err_errno(err, "%s: write", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return ep_err_errno(err, "%s: rename to %s", tmp, path);
    }
    return 0;
}

/* ---- writing ---------------------------------------------------------------------------- */

int mk_threads(const mk_options *o)
{
    long n = o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > MK_MAX_THREADS ? MK_MAX_THREADS : (int)n;
}

typedef struct mk_index {
    char **names;
    const char **files;
    int count, cap;
} mk_index;

static int index_add(mk_index *ix, const char *name, const char *file, ep_err *err)
{
    if (ix->count == ix->cap) {
        int cap = ix->cap ? 2 * ix->cap : 256;
        char **nn = realloc(ix->names, (size_t)cap * sizeof *nn);
        if (nn == NULL)
            return ep_err_set(err, "out of memory for the index");
        ix->names = nn;
        const char **nf = realloc(ix->files, (size_t)cap * sizeof *nf);
        if (nf == NULL)
            return ep_err_set(err, "out of memory for the index");
        ix->files = nf;
        ix->cap = cap;
    }
    if ((ix->names[ix->count] = strdup(name)) == NULL)
        return ep_err_set(err, "out of memory for the index");
    ix->files[ix->count++] = file;
    return 0;
}

static void index_free(mk_index *ix)
{
    for (int i = 0; i < ix->count; i++)
        free(ix->names[i]);
    free(ix->names);
    free(ix->files);
}

/* Generate and write shard s; file is its name inside out_dir. Items are listed one unit at a
 * time, so the list stays one layer long. */
static int write_shard(const mk_options *o, const mc_config *c, int s, const char *file,
                       int threads, mk_index *ix, uint64_t *bytes, ep_err *err)
{
    mk_list l = {0};
    st_writer *w = st_writer_create();
    char path[EP_MAX_PATH];
    int rc = w == NULL ? ep_err_set(err, "out of memory") : 0;
    if (rc == 0)
        rc = join(path, sizeof path, o->out_dir, file, err);
    for (int u = 0; rc == 0 && u < unit_count(c); u++) {
        if (unit_shard(c, u, o->shards) != s)
            continue;
        l.count = 0;
        rc = unit_items(c, u, &l, err);
        for (int i = 0; rc == 0 && i < l.count; i += threads) {
            int n = l.count - i < threads ? l.count - i : threads;
            rc = gen_window(&l.items[i], n, o->seed, w, err);
        }
        for (int i = 0; rc == 0 && i < l.count; i++) {
            const mk_item *it = &l.items[i];
            rc = index_add(ix, it->name, file, err);
            if (rc == 0 && item_tensors(it) == 2)
                rc = index_add(ix, it->scale_name, file, err);
        }
    }
    if (rc == 0)
        rc = st_writer_write(w, path, err);
    if (rc == 0)
        *bytes += st_writer_bytes(w);
    st_writer_destroy(&w);
    free(l.items);
    return rc;
}

int mk_write_model(const mk_options *o, ep_err *err)
{
    mk_plan plan;
    mc_config c;
    if (mk_check(o, &plan, err) != 0 || mk_config(o, &c, err) != 0)
        return -1;
    if (prepare_dir(o->out_dir, o->force, err) != 0 ||
        check_space(o->out_dir, plan.bytes, err) != 0)
        return -1;

    const int S = o->shards;
    const int threads = mk_threads(o);
    char(*files)[64] = calloc((size_t)S, sizeof *files);
    mk_index ix = {0};
    int rc = files == NULL ? ep_err_set(err, "out of memory") : 0;
    uint64_t total = 0;
    for (int s = 0; rc == 0 && s < S; s++) {
        if (S == 1)
            snprintf(files[s], sizeof files[s], "%s", MK_SINGLE_NAME);
        else
            snprintf(files[s], sizeof files[s], "model-%05d-of-%05d.safetensors", s + 1, S);
        rc = write_shard(o, &c, s, files[s], threads, &ix, &total, err);
    }
    if (rc == 0 && S > 1) {
        char path[EP_MAX_PATH];
        rc = join(path, sizeof path, o->out_dir, MK_INDEX_NAME, err);
        if (rc == 0)
            rc =
                st_index_write(path, ix.count, (const char *const *)ix.names, ix.files, total, err);
    }
    if (rc == 0)
        rc = write_config(o, &c, err);
    index_free(&ix);
    free(files);
    return rc;
}
