/*
 * route.c — the MoE router (route.h): reference implementations, the dispatch to the AVX2 fast
 * path, and the parts that have a single implementation (scores, hash lookup, weights).
 *
 * The reference functions are the definitions of docs/numerics.md §2 written out one IEEE
 * operation at a time; the build uses -ffp-contract=off, so the compiler fuses nothing.
 */
#include "kernels/route.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/route_internal.h"
#include "kernels/formats.h"
#include "kernels/mathf.h"

/* ---- implementation choice ---- */

#ifdef EPMOE_ROUTE_AVX2
static int route_avx2_ok(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#ifndef EPMOE_ROUTE_AVX512
/* The compiler cannot build the AVX-512 file: isa_supported(AVX512) is 0 as well. */
void route_avx512_gate_pack(int E, int H, const uint16_t *w, uint16_t *dst) {}
void route_avx512_logits_part(int H, int E, const double *const *xd, int tt, const uint16_t *gate,
                              int g0, int g1, float *const *logits)
{
}
#endif
#else
static int route_avx2_ok(void)
{
    return 0;
}
/* Not an x86-64 build: route_impl_resolve never picks AVX2, so these are never reached. */
void route_avx2_rmsnorm(int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                        uint16_t *y)
{
}
void route_avx2_gate_pack(int E, int H, const uint16_t *w, float *dst) {}
void route_avx2_logits(int T, int H, int E, const uint16_t *xn, const float *gate, float *logits) {}
void route_avx512_gate_pack(int E, int H, const uint16_t *w, uint16_t *dst) {}
void route_avx512_logits_part(int H, int E, const double *const *xd, int tt, const uint16_t *gate,
                              int g0, int g1, float *const *logits)
{
}
#endif

isa_level route_impl_resolve(isa_level impl)
{
    if (impl == ISA_AUTO)
        impl = isa_best();
    if (impl == ISA_AVX512 && isa_supported(ISA_AVX512))
        return ISA_AVX512;
    if (impl >= ISA_AVX2 && route_avx2_ok())
        return ISA_AVX2;
    return ISA_REF;
}

/* ---- ffn_norm ---- */

static void rmsnorm_ref(int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                        uint16_t *y)
{
    for (int t = 0; t < T; t++) {
        const uint16_t *xr = x + (size_t)t * H;
        uint16_t *yr = y + (size_t)t * H;
        double sum = 0.0;
        for (int k = 0; k < H; k++) {
            double v = (double)fmt_bf16_to_f32(xr[k]);
            sum = sum + v * v;
        }
        float ms = (float)(sum / (double)H);
        float r = 1.0f / sqrtf(ms + eps);
        for (int k = 0; k < H; k++)
            yr[k] = fmt_f32_to_bf16(fmt_bf16_to_f32(gain[k]) * (fmt_bf16_to_f32(xr[k]) * r));
    }
}

void route_rmsnorm(isa_level impl, int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                   uint16_t *y)
{
    if (T <= 0)
        return;
    if (route_impl_resolve(impl) >= ISA_AVX2)
        route_avx2_rmsnorm(T, H, x, gain, eps, y);
    else
        rmsnorm_ref(T, H, x, gain, eps, y);
}

/* ---- gate logits ---- */

static size_t groups_of(int E)
{
    return (size_t)(E + ROUTE_AVX2_GROUP - 1) / ROUTE_AVX2_GROUP;
}

size_t route_gate_bytes(isa_level impl, int E, int H)
{
    isa_level r = route_impl_resolve(impl);
    if (r == ISA_AVX512)
        return (size_t)(E + ROUTE_AVX512_GROUP - 1) / ROUTE_AVX512_GROUP * (size_t)H *
               ROUTE_AVX512_GROUP * sizeof(uint16_t);
    if (r == ISA_AVX2)
        return groups_of(E) * (size_t)H * ROUTE_AVX2_GROUP * sizeof(float);
    return (size_t)E * (size_t)H * sizeof(uint16_t);
}

void route_gate_pack(isa_level impl, int E, int H, const uint16_t *w, void *dst)
{
    isa_level r = route_impl_resolve(impl);
    if (r == ISA_AVX512)
        route_avx512_gate_pack(E, H, w, dst);
    else if (r == ISA_AVX2)
        route_avx2_gate_pack(E, H, w, dst);
    else
        memcpy(dst, w, (size_t)E * (size_t)H * sizeof(uint16_t));
}

static void logits_ref(int T, int H, int E, const uint16_t *xn, const uint16_t *w, float *logits)
{
    for (int t = 0; t < T; t++) {
        const uint16_t *xr = xn + (size_t)t * H;
        for (int e = 0; e < E; e++) {
            const uint16_t *wr = w + (size_t)e * H;
            double acc = 0.0;
            for (int k = 0; k < H; k++)
                acc = acc + (double)fmt_bf16_to_f32(xr[k]) * (double)fmt_bf16_to_f32(wr[k]);
            logits[(size_t)t * E + e] = (float)acc;
        }
    }
}

/* The AVX-512 logits as items for the pool: tiles of up to 4 tokens x 4 expert groups. */
#define LOGITS_TOKENS 64 /* tokens widened to double at a time (32 KB per token at H 4096) */
typedef struct logits_ctx {
    int T, H, E, G;
    const double *xd; /* [T][H] */
    const uint16_t *gate;
    float *logits;
} logits_ctx;

static void logits_item(void *vctx, int i, int tid)
{
    logits_ctx *c = vctx;
    int ng = (c->G + 3) / 4, t0 = i / ng * 4, g0 = i % ng * 4;
    int tt = c->T - t0 < 4 ? c->T - t0 : 4, g1 = g0 + 4 < c->G ? g0 + 4 : c->G;
    const double *xd[4];
    float *out[4];
    for (int t = 0; t < tt; t++) {
        xd[t] = c->xd + (size_t)(t0 + t) * c->H;
        out[t] = c->logits + (size_t)(t0 + t) * c->E;
    }
    route_avx512_logits_part(c->H, c->E, xd, tt, c->gate, g0, g1, out);
}

static void logits_avx512(int T, int H, int E, const uint16_t *xn, const uint16_t *gate,
                          float *logits, tpool *pool)
{
    int chunk = T < LOGITS_TOKENS ? T : LOGITS_TOKENS;
    double *xd = malloc((size_t)chunk * (size_t)H * sizeof(double));
    if (!xd) { /* without memory for the widened rows: the definition (same bits) */
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                const uint16_t *gw = gate +
                                     (size_t)(e / ROUTE_AVX512_GROUP) * H * ROUTE_AVX512_GROUP +
                                     e % ROUTE_AVX512_GROUP;
                double acc = 0.0;
                for (int k = 0; k < H; k++)
                    acc = acc + (double)fmt_bf16_to_f32(xn[(size_t)t * H + k]) *
                                    (double)fmt_bf16_to_f32(gw[(size_t)k * ROUTE_AVX512_GROUP]);
                logits[(size_t)t * E + e] = (float)acc;
            }
        return;
    }
    int G = (E + ROUTE_AVX512_GROUP - 1) / ROUTE_AVX512_GROUP;
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (size_t i = 0; i < (size_t)n * H; i++)
            xd[i] = (double)fmt_bf16_to_f32(xn[(size_t)t0 * H + i]);
        logits_ctx c = {n, H, E, G, xd, gate, logits + (size_t)t0 * E};
        tpool_for(pool, (n + 3) / 4 * ((G + 3) / 4), logits_item, &c);
    }
    free(xd);
}

void route_logits(isa_level impl, int T, int H, int E, const uint16_t *xn, const void *gate,
                  float *logits, tpool *pool)
{
    if (T <= 0)
        return;
    isa_level r = route_impl_resolve(impl);
    if (r == ISA_AVX512)
        logits_avx512(T, H, E, xn, gate, logits, pool);
    else if (r == ISA_AVX2)
        route_avx2_logits(T, H, E, xn, gate, logits);
    else
        logits_ref(T, H, E, xn, gate, logits);
}

/* ---- scores ---- */

float route_score(float logit)
{
    float sp = logit > 20.0f ? logit : mf_log1pf(mf_expf(logit));
    return sqrtf(sp);
}

void route_scores(int n, const float *logits, float *scores)
{
    for (int i = 0; i < n; i++)
        scores[i] = route_score(logits[i]);
}

/* ---- selection ---- */

/* The total order of selection: a (value va, expert ea) ranks before b. Larger values first,
 * NaN after every number, equal values (+0 == -0) and NaN pairs by lower expert id. */
static inline int ranks_before(float va, int ea, float vb, int eb)
{
    if (isnan(va))
        return isnan(vb) && ea < eb;
    if (isnan(vb))
        return 1;
    if (va != vb)
        return va > vb;
    return ea < eb;
}

static inline float sel_of(const float *s, const float *bias, int e)
{
    return bias ? s[e] + bias[e] : s[e];
}

/* The definition: k scans, each taking the first-ranked expert not yet taken. */
static void topk_ref_row(int E, int k, const float *s, const float *bias, int32_t *ids)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= ids[i] == e;
            if (taken)
                continue;
            if (best < 0 || ranks_before(sel_of(s, bias, e), e, sel_of(s, bias, best), best))
                best = e;
        }
        ids[j] = best;
    }
}

/* One pass keeping the k first-ranked experts sorted; same order, so the same result. */
static void topk_fast_row(int E, int k, const float *s, const float *bias, int32_t *ids)
{
    float best[MC_MAX_TOPK];
    int n = 0;
    for (int e = 0; e < E; e++) {
        float v = sel_of(s, bias, e);
        if (n == k && !ranks_before(v, e, best[k - 1], ids[k - 1]))
            continue;
        int pos = n < k ? n++ : k - 1;
        while (pos > 0 && ranks_before(v, e, best[pos - 1], ids[pos - 1])) {
            best[pos] = best[pos - 1];
            ids[pos] = ids[pos - 1];
            pos--;
        }
        best[pos] = v;
        ids[pos] = e;
    }
}

void route_topk(isa_level impl, int T, int E, int k, const float *scores, const float *bias,
                int32_t *ids)
{
    int fast = route_impl_resolve(impl) != ISA_REF && k <= MC_MAX_TOPK;
    for (int t = 0; t < T; t++) {
        const float *s = scores + (size_t)t * E;
        int32_t *row = ids + (size_t)t * k;
        if (fast)
            topk_fast_row(E, k, s, bias, row);
        else
            topk_ref_row(E, k, s, bias, row);
    }
}

int route_hash(int T, int k, int E, int vocab, const int64_t *tokens, const int64_t *tid2eid,
               int32_t *ids, ep_err *err)
{
    for (int t = 0; t < T; t++) {
        int64_t id = tokens[t];
        if (id < 0 || id >= vocab)
            return ep_err_set(err, "token %d: id %" PRId64 " outside the vocabulary [0, %d)", t, id,
                              vocab);
        const int64_t *row = tid2eid + (size_t)id * (size_t)k;
        for (int j = 0; j < k; j++)
            if (row[j] < 0 || row[j] >= E)
                return ep_err_set(err,
                                  "token %d (id %" PRId64 "): tid2eid[%" PRId64 "][%d] = %" PRId64
                                  " is not an expert id in [0, %d)",
                                  t, id, id, j, row[j], E);
        for (int j = 0; j < k; j++)
            ids[(size_t)t * k + j] = (int32_t)row[j];
    }
    return 0;
}

void route_weights(int T, int E, int k, const float *scores, const int32_t *ids, bool norm,
                   float factor, float *w)
{
    for (int t = 0; t < T; t++) {
        const float *s = scores + (size_t)t * E;
        const int32_t *id = ids + (size_t)t * k;
        float *wr = w + (size_t)t * k;
        float sum = 0.0f;
        int first = 1;
        for (int j = 0; j < k; j++) {
            if (id[j] < 0)
                continue;
            /* The first term starts the sum (not 0 + s_0: identical except for s_0 = -0). */
            sum = first ? s[id[j]] : sum + s[id[j]];
            first = 0;
        }
        for (int j = 0; j < k; j++) {
            if (id[j] < 0)
                wr[j] = 0.0f;
            else if (norm)
                wr[j] = (s[id[j]] / sum) * factor;
            else
                wr[j] = s[id[j]] * factor;
        }
    }
}
