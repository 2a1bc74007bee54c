/*
 * mkmodel_gen.c — the values of a synthetic checkpoint's tensors (see mkmodel_internal.h).
 *
 * Determinism. Each tensor (each weight+scale pair) draws from its own xoshiro256** stream
 * seeded from FNV-1a(name) and the seed through splitmix64. Gaussians come from Box-Muller with
 * a logarithm and sine/cosine written here as polynomials in double precision: IEEE basic
 * operations (and sqrt) are correctly rounded, the build forbids FMA contraction and C11 on
 * x86-64/aarch64 evaluates doubles in double (FLT_EVAL_METHOD 0), so the bits do not depend on
 * the host's libm, the thread count or the shard count.
 */
#include "ctl/mkmodel_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/formats.h"

/* Block amax floor, as the reference act_quant: keeps an all-zero block's scale finite and
 * its E8M0 code well inside [1, 254]. */
#define MK_AMAX_FLOOR 1e-4f

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
    const int64_t numel = mk_item_numel(it->shape, it->ndim);
    const size_t nbytes = (size_t)numel * st_dtype_size(it->dtype);
    size_t scratch = 0, sbytes = 0;
    if (it->gen == GEN_MXFP4)
        scratch = (size_t)it->cols;
    else if (it->gen == GEN_FP8)
        scratch = (size_t)(EP_FP8_BLOCK * it->cols);
    else if (it->gen == GEN_BF16 || it->gen == GEN_F32)
        scratch = (size_t)numel;
    if (it->gen == GEN_MXFP4 || it->gen == GEN_FP8)
        sbytes = (size_t)mk_item_numel(it->scale_shape, 2) * st_dtype_size(it->scale_dtype);

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
int mk_gen_window(const mk_item *items, int n, uint64_t seed, st_writer *w, ep_err *err)
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
        if (rc == 0 && mk_item_tensors(it) == 2)
            rc = st_writer_add(w, it->scale_name, it->scale_dtype, 2, it->scale_shape,
                               jobs[i].sdata, err);
        free(jobs[i].data);
        free(jobs[i].sdata);
    }
    return rc;
}
