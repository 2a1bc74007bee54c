/*
 * cuda_steps.c — the CUDA backend's steps on host memory (cuda_internal.h): routing (the scores
 * on the host, from the device's exact logits), the expert MLP as grouped GEMMs planned on the
 * host, the shared expert, combine, and the whole layer on the device (mb_forward). Requests
 * larger than the step buffers run in chunks of them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/limits.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/route.h"

/* ---- routing ----------------------------------------------------------------------------- */

typedef struct score_job {
    const float *logits;
    float *scores;
    size_t n;
} score_job;

static void score_task(void *vctx, int tid, int nthreads)
{
    score_job *j = vctx;
    size_t a = j->n * (size_t)tid / (size_t)nthreads,
           z = j->n * (size_t)(tid + 1) / (size_t)nthreads;
    if (z > a)
        route_scores((int)(z - a), j->logits + a, j->scores + a);
}

/* Scores, selection and weights of T tokens from their logits (the C library's log1pf/expf:
 * docs/numerics.md §2.3; on the host so the bits are those of the CPU backend). */
static int host_select(cuda_backend *b, const cuda_layer *l, int T, float *logits,
                       int32_t *topk_ids, float *topk_w)
{
    score_job j = {.logits = logits, .scores = logits, .n = (size_t)T * (size_t)l->E};
    tpool_run(j.n >= 4096 ? b->pool : NULL, score_task, &j);
    if (!l->hash)
        route_topk(ISA_AUTO, T, l->E, l->k, logits, l->h_bias, topk_ids);
    route_weights(T, l->E, l->k, logits, topk_ids, l->cfg.norm_topk_prob,
                  l->cfg.routed_scaling_factor, topk_w);
    return 0;
}

/* Route tokens [t0, t0 + n) of x: device rmsnorm, logits, quantizer into the step buffers;
 * logits (and q, qs, xn when the host wants them) back; selection on the host. */
int cu_route_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, const uint16_t *x,
                  int32_t *topk_ids, float *topk_w, uint8_t *h_q, float *h_qs, uint16_t *h_xn,
                  ep_err *err)
{
    const cudev_ops *o = b->ops;
    size_t H = (size_t)l->H, E = (size_t)l->E, SC = H / EP_FP8_BLOCK;
    uint8_t *st = s->pinned;
    memcpy(st, x, (size_t)n * H * 2);
    if (o->h2d(b->d, s->x, st, (size_t)n * H * 2, err) < 0 ||
        o->rmsnorm(b->d, n, l->H, s->x, l->norm, l->cfg.rms_norm_eps, s->xn, err) < 0 ||
        o->logits(b->d, n, l->H, l->E, s->xn, l->gate_t, s->logits, err) < 0 ||
        o->quant(b->d, n, l->H, l->cfg.act_ue8m0, s->xn, s->q, s->qs, err) < 0)
        return -1;
    float *h_logits = (float *)st;
    uint8_t *sq = st + cu_align((size_t)n * E * 4);
    uint8_t *sqs = sq + cu_align((size_t)n * H);
    uint8_t *sxn = sqs + cu_align((size_t)n * SC * 4);
    if (o->d2h(b->d, h_logits, s->logits, (size_t)n * E * 4, err) < 0 ||
        (h_q && o->d2h(b->d, sq, s->q, (size_t)n * H, err) < 0) ||
        (h_qs && o->d2h(b->d, sqs, s->qs, (size_t)n * SC * 4, err) < 0) ||
        (h_xn && o->d2h(b->d, sxn, s->xn, (size_t)n * H * 2, err) < 0) || cu_wait(b, err) < 0)
        return -1;
    if (h_q)
        memcpy(h_q, sq, (size_t)n * H);
    if (h_qs)
        memcpy(h_qs, sqs, (size_t)n * SC * 4);
    if (h_xn)
        memcpy(h_xn, sxn, (size_t)n * H * 2);
    return host_select(b, l, n, h_logits, topk_ids, topk_w);
}

/* ---- the expert MLP ---------------------------------------------------------------------- */

/* The grouped MLP over rows already in s->a / s->as, sorted by expert: groups (host, n_groups
 * of them) give each expert's segment; weights s->w per row (or 1.0 for the shared expert);
 * bf16 results to dst at rows s->outrow (out_row false: row i -> i). */
int cu_mlp_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, int n_groups,
                cudev_group *h13, cudev_group *h2, int max_rows, bool routed, bool weights,
                uint16_t *dst, bool out_row, ep_err *err)
{
    const cudev_ops *o = b->ops;
    size_t gb = (size_t)n_groups * sizeof(cudev_group);
    if (o->h2d(b->d, s->g13, h13, gb, err) < 0 || o->h2d(b->d, s->g2, h2, gb, err) < 0)
        return -1;
    mb_wformat f = routed ? l->fmt : MB_W_FP8;
    cudev_gemm g = {.format = f,
                    .mode = b->gemm,
                    .N = l->I,
                    .K = l->H,
                    .M = n,
                    .n_mats = 2,
                    .n_groups = n_groups,
                    .groups = s->g13,
                    .h_groups = h13,
                    .max_rows = max_rows,
                    .a = s->a,
                    .a_scale = s->as,
                    .out_f32 = s->acc1,
                    .out2_f32 = s->acc3,
                    .ld_out = 2 * l->I,
                    .tune = &b->tune};
    if (o->gemm(b->d, &g, err) < 0 ||
        o->swiglu(b->d, n, l->I, s->acc1, s->acc3, 2 * l->I, weights ? s->w : NULL,
                  l->cfg.swiglu_limit, l->cfg.act_ue8m0, b->exp_table, l->exp_neg_limit, s->hq,
                  s->hqs, err) < 0)
        return -1;
    cudev_gemm g2 = {.format = f,
                     .mode = b->gemm,
                     .N = l->H,
                     .K = l->I,
                     .M = n,
                     .n_mats = 1,
                     .n_groups = n_groups,
                     .groups = s->g2,
                     .h_groups = h2,
                     .max_rows = max_rows,
                     .a = s->hq,
                     .a_scale = s->hqs,
                     .out_bf16 = dst,
                     .out_row = out_row ? s->outrow : NULL,
                     .tune = &b->tune};
    return o->gemm(b->d, &g2, err);
}

static void group_set(cudev_group *g13, cudev_group *g2, uint32_t row0, uint32_t rows,
                      const cu_mlp *m)
{
    g13->row0 = g2->row0 = row0;
    g13->rows = g2->rows = rows;
    g13->w[0] = m->w[MB_W1];
    g13->scale[0] = m->s[MB_W1];
    g13->w[1] = m->w[MB_W3];
    g13->scale[1] = m->s[MB_W3];
    g2->w[0] = m->w[MB_W2];
    g2->scale[0] = m->s[MB_W2];
    g2->w[1] = NULL;
    g2->scale[1] = NULL;
}

/* The shared expert on n rows of (q, qs) already on the device (s->q / s->qs rows 0..n-1 are
 * copied into the MLP input) -> bf16 rows in dst. */
static int shared_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, const uint8_t *q,
                       const float *qs, uint16_t *dst, ep_err *err)
{
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    for (int r0 = 0; r0 < n; r0 += s->P) {
        int m = n - r0 < s->P ? n - r0 : s->P;
        cudev_group *h = (cudev_group *)((uint8_t *)s->pinned + s->pinned_bytes -
                                         cu_align(2 * sizeof(cudev_group)));
        group_set(&h[0], &h[1], 0, (uint32_t)m, &l->shared);
        if (b->ops->d2d(b->d, s->a, q + (size_t)r0 * H, (size_t)m * H, err) < 0 ||
            b->ops->d2d(b->d, s->as, qs + (size_t)r0 * SC, (size_t)m * SC * 4, err) < 0 ||
            cu_mlp_pass(b, s, l, m, 1, &h[0], &h[1], m, false, false, dst + (size_t)r0 * H, false,
                        err) < 0)
            return -1;
        /* the next pass reuses h, a and as */
        if (n - r0 > s->P && cu_wait(b, err) < 0)
            return -1;
    }
    return 0;
}

/* Pairs sorted by expert (counting sort, stable): order[i] = pair index. */
static int sort_pairs(int n_pairs, int E, const uint32_t *pair_expert, uint32_t *order,
                      uint32_t *start)
{
    memset(start, 0, ((size_t)E + 1) * sizeof *start);
    for (int p = 0; p < n_pairs; p++)
        start[pair_expert[p] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    uint32_t *fill = calloc((size_t)E, sizeof *fill);
    if (!fill)
        return -1;
    for (int p = 0; p < n_pairs; p++) {
        uint32_t e = pair_expert[p];
        order[start[e] + fill[e]++] = (uint32_t)p;
    }
    free(fill);
    return 0;
}

/* Groups of sorted rows [c0, c1): one per expert run. Returns the count; *max_rows set. */
int cu_plan_groups(const cuda_layer *l, const uint32_t *start, uint32_t c0, uint32_t c1,
                   cudev_group *g13, cudev_group *g2, int *max_rows)
{
    int n = 0;
    *max_rows = 0;
    for (int e = 0; e < l->E; e++) {
        uint32_t a = start[e] > c0 ? start[e] : c0, z = start[e + 1] < c1 ? start[e + 1] : c1;
        if (z <= a)
            continue;
        group_set(&g13[n], &g2[n], a - c0, z - a, &l->experts[e]);
        if ((int)(z - a) > *max_rows)
            *max_rows = (int)(z - a);
        n++;
    }
    return n;
}

int cu_plan_pairs(const cuda_layer *l, int n_pairs, const uint32_t *pair_expert, cu_pair_plan *pp,
                  ep_err *err)
{
    pp->order = malloc((size_t)n_pairs * sizeof *pp->order + 1);
    pp->start = malloc(((size_t)l->E + 1) * sizeof *pp->start);
    if (!pp->order || !pp->start || sort_pairs(n_pairs, l->E, pair_expert, pp->order, pp->start))
        return ep_err_set(err, "out of memory grouping %d pairs", n_pairs);
    return 0;
}

void cu_free_plan(cu_pair_plan *pp)
{
    free(pp->order);
    free(pp->start);
}

cu_mlp_stage cu_stage_of(cu_bufs *s)
{
    cu_mlp_stage m;
    size_t E1 = (size_t)s->E + 1, P = (size_t)s->P;
    uint8_t *t = (uint8_t *)s->pinned + cu_bufs_big_bytes(s);
    m.g13 = (cudev_group *)t;
    m.g2 = m.g13 + E1;
    t += cu_align(2 * E1 * sizeof(cudev_group));
    m.rowidx = (uint32_t *)t;
    m.outrow = (uint32_t *)(t + cu_align(P * 4));
    m.w = (float *)(t + 2 * cu_align(P * 4));
    m.big = s->pinned;
    return m;
}

int cuda_experts(mb_backend *be, const mb_layer *ml, int n_rows, const uint8_t *q, const float *qs,
                 int n_pairs, const uint32_t *pair_row, const uint32_t *pair_expert,
                 const float *pair_w, uint16_t *out, ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (cu_ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    cu_bufs *s = &b->b;
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    cu_pair_plan pp = {0};
    int rc = cu_plan_pairs(l, n_pairs, pair_expert, &pp, err);
    cu_mlp_stage ms = cu_stage_of(s);
    for (uint32_t c0 = 0; rc == 0 && c0 < (uint32_t)n_pairs; c0 += (uint32_t)s->P) {
        uint32_t c1 = (uint32_t)n_pairs - c0 < (uint32_t)s->P ? (uint32_t)n_pairs : c0 + s->P;
        int n = (int)(c1 - c0), max_rows;
        int ng = cu_plan_groups(l, pp.start, c0, c1, ms.g13, ms.g2, &max_rows);
        /* gather the rows on the host, in sorted order, straight into the staging buffer */
        uint8_t *sa = ms.big, *sas = sa + cu_align((size_t)n * H);
        for (int i = 0; i < n; i++) {
            uint32_t p = pp.order[c0 + i];
            memcpy(sa + (size_t)i * H, q + (size_t)pair_row[p] * H, H);
            memcpy(sas + (size_t)i * SC * 4, qs + (size_t)pair_row[p] * SC, SC * 4);
            ms.w[i] = pair_w[p];
        }
        rc = b->ops->h2d(b->d, s->a, sa, (size_t)n * H, err) < 0 ||
                     b->ops->h2d(b->d, s->as, sas, (size_t)n * SC * 4, err) < 0 ||
                     b->ops->h2d(b->d, s->w, ms.w, (size_t)n * 4, err) < 0 ||
                     cu_mlp_pass(b, s, l, n, ng, ms.g13, ms.g2, max_rows, true, true, s->mo, false,
                                 err) < 0 ||
                     b->ops->d2h(b->d, sa, s->mo, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0
                 ? -1
                 : 0;
        for (int i = 0; rc == 0 && i < n; i++)
            memcpy(out + (size_t)pp.order[c0 + i] * H, sa + (size_t)i * H * 2, H * 2);
    }
    cu_free_plan(&pp);
    if (rc < 0)
        ep_err_prefix(err, "%s on %s", l->name, b->info.name);
    return rc;
}

int cuda_quant(mb_backend *be, const mb_layer *ml, int n, const uint16_t *xn, uint8_t *q, float *qs,
               ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (cu_ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    cu_bufs *s = &b->b;
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    for (int t0 = 0; t0 < n; t0 += s->C) {
        int m = n - t0 < s->C ? n - t0 : s->C;
        uint8_t *st = s->pinned, *sq = st + cu_align((size_t)m * H * 2);
        uint8_t *sqs = sq + cu_align((size_t)m * H);
        memcpy(st, xn + (size_t)t0 * H, (size_t)m * H * 2);
        if (b->ops->h2d(b->d, s->xn, st, (size_t)m * H * 2, err) < 0 ||
            b->ops->quant(b->d, m, l->H, l->cfg.act_ue8m0, s->xn, s->q, s->qs, err) < 0 ||
            b->ops->d2h(b->d, sq, s->q, (size_t)m * H, err) < 0 ||
            b->ops->d2h(b->d, sqs, s->qs, (size_t)m * SC * 4, err) < 0 || cu_wait(b, err) < 0)
            return -1;
        memcpy(q + (size_t)t0 * H, sq, (size_t)m * H);
        memcpy(qs + (size_t)t0 * SC, sqs, (size_t)m * SC * 4);
    }
    return 0;
}

/* ---- steps ------------------------------------------------------------------------------- */

int cu_hash_ids(const cuda_layer *l, int T, const int64_t *ids, int32_t *topk_ids, ep_err *err)
{
    if (!l->hash)
        return 0;
    if (!ids)
        return ep_err_set(err, "%s is hash-routed (tid2eid): token ids are required", l->name);
    if (route_hash(T, l->k, l->E, l->cfg.vocab_size, ids, l->h_tid2eid, topk_ids, err) < 0)
        return ep_err_prefix(err, "%s", l->name);
    return 0;
}

/* The buffers a new step uses: the backend's, or its own when those are taken. */
static cu_bufs *step_bufs(cuda_backend *b, cuda_step *s, const mc_config *c, ep_err *err)
{
    if (cu_ensure_step_bufs(b, c, err) < 0)
        return NULL;
    if (!b->step_busy) {
        b->step_busy = true;
        return &b->b;
    }
    if (cu_alloc_step_bufs(b, &s->own, c, b->b.C, err) < 0)
        return NULL;
    s->own_bufs = true;
    return &s->own;
}

void cuda_step_free(mb_step *ms)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    cu_wait(b, NULL); /* nothing of this step may still run on the buffers */
    if (s->own_bufs)
        cu_free_step_bufs(b, &s->own);
    else if (s->bufs)
        b->step_busy = false;
    free(s->h_shared);
    free(s);
}

cuda_step *cu_step_new(cuda_backend *b, const cuda_layer *l, int T, ep_err *err)
{
    cuda_step *s = calloc(1, sizeof *s);
    if (!s) {
        ep_err_set(err, "out of memory for a step");
        return NULL;
    }
    s->base.be = &b->base;
    s->l = l;
    s->T = T;
    if (!(s->bufs = step_bufs(b, s, &l->cfg, err))) {
        free(s);
        return NULL;
    }
    s->resident = T <= s->bufs->C;
    return s;
}

mb_step *cuda_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x,
                         const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q,
                         float *qs, uint16_t *xn, ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    /* hash lookups first: a bad token id fails before any device work */
    if (cu_hash_ids(l, T, ids, topk_ids, err) < 0)
        return NULL;
    cuda_step *s = cu_step_new(b, l, T, err);
    if (!s)
        return NULL;
    s->h_q = q;
    s->h_qs = qs;
    s->topk_ids = topk_ids;
    size_t H = (size_t)l->H, k = (size_t)l->k, SC = H / EP_FP8_BLOCK;
    for (int t0 = 0; t0 < T; t0 += s->bufs->C) {
        int n = T - t0 < s->bufs->C ? T - t0 : s->bufs->C;
        if (cu_route_pass(b, s->bufs, l, n, x + (size_t)t0 * H, topk_ids + (size_t)t0 * k,
                          topk_w + (size_t)t0 * k, q + (size_t)t0 * H, qs + (size_t)t0 * SC,
                          xn ? xn + (size_t)t0 * H : NULL, err) < 0) {
            ep_err_prefix(err, "%s on %s", l->name, b->info.name);
            cuda_step_free(&s->base);
            return NULL;
        }
    }
    return &s->base;
}

int cuda_step_shared(mb_step *ms, ep_err *err)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    const cuda_layer *l = s->l;
    cu_bufs *bf = s->bufs;
    if (s->shared_done || s->T == 0)
        return 0;
    s->shared_done = true;
    if (s->resident) /* q/qs of the one route pass are still in the buffers: no copy back */
        return shared_pass(b, bf, l, s->T, bf->q, bf->qs, bf->shared, err);
    size_t H = (size_t)l->H, SC = H / EP_FP8_BLOCK;
    if (!(s->h_shared = malloc((size_t)s->T * H * 2)))
        return ep_err_set(err, "out of memory for the shared expert of %d tokens", s->T);
    for (int t0 = 0; t0 < s->T; t0 += bf->C) {
        int n = s->T - t0 < bf->C ? s->T - t0 : bf->C;
        uint8_t *st = bf->pinned, *sqs = st + cu_align((size_t)n * H);
        memcpy(st, s->h_q + (size_t)t0 * H, (size_t)n * H);
        memcpy(sqs, s->h_qs + (size_t)t0 * SC, (size_t)n * SC * 4);
        if (b->ops->h2d(b->d, bf->q, st, (size_t)n * H, err) < 0 ||
            b->ops->h2d(b->d, bf->qs, sqs, (size_t)n * SC * 4, err) < 0 ||
            shared_pass(b, bf, l, n, bf->q, bf->qs, bf->shared, err) < 0 ||
            b->ops->d2h(b->d, st, bf->shared, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0)
            return -1;
        memcpy(s->h_shared + (size_t)t0 * H, st, (size_t)n * H * 2);
    }
    return 0;
}

/* Combine tokens [t0, t0+n): eo and topk from the host, shared from the device buffer (already
 * there when resident, else uploaded); out back to the host. */
static int combine_pass(cuda_backend *b, cuda_step *s, int t0, int n, const uint16_t *eo,
                        uint16_t *out, ep_err *err)
{
    const cuda_layer *l = s->l;
    cu_bufs *bf = s->bufs;
    size_t H = (size_t)l->H, k = (size_t)l->k;
    uint8_t *st = bf->pinned, *stk = st + cu_align((size_t)n * k * H * 2);
    uint8_t *ssh = stk + cu_align((size_t)n * k * 4);
    memcpy(st, eo + (size_t)t0 * k * H, (size_t)n * k * H * 2);
    memcpy(stk, s->topk_ids + (size_t)t0 * k, (size_t)n * k * 4);
    if (!s->resident)
        memcpy(ssh, s->h_shared + (size_t)t0 * H, (size_t)n * H * 2);
    if (b->ops->h2d(b->d, bf->eo, st, (size_t)n * k * H * 2, err) < 0 ||
        b->ops->h2d(b->d, bf->topk, stk, (size_t)n * k * 4, err) < 0 ||
        (!s->resident && b->ops->h2d(b->d, bf->shared, ssh, (size_t)n * H * 2, err) < 0) ||
        b->ops->combine(b->d, n, l->k, l->H, bf->topk, bf->eo, bf->shared, bf->out, err) < 0 ||
        b->ops->d2h(b->d, st, bf->out, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0)
        return -1;
    memcpy(out + (size_t)t0 * H, st, (size_t)n * H * 2);
    return 0;
}

int cuda_step_finish(mb_step *ms, const uint16_t *eo, uint16_t *out, ep_err *err)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    if (s->T == 0)
        return 0;
    if (cuda_step_shared(ms, err) < 0)
        return -1;
    for (int t0 = 0; t0 < s->T; t0 += s->bufs->C) {
        int n = s->T - t0 < s->bufs->C ? s->T - t0 : s->bufs->C;
        if (combine_pass(b, s, t0, n, eo, out, err) < 0)
            return ep_err_prefix(err, "%s on %s: combine", s->l->name, b->info.name);
    }
    return 0;
}

/* ---- the whole layer on the device ------------------------------------------------------- */

/* One forward pass of n <= C tokens: route (logits back, selection on the host), every routed
 * pair through the grouped MLP straight into eo's slots, the shared expert, the combine. */
static int forward_pass(cuda_backend *b, const cuda_layer *l, int n, const uint16_t *x,
                        const int64_t *ids, uint16_t *out, int32_t *topk_ids, float *topk_w,
                        ep_err *err)
{
    cu_bufs *s = &b->b;
    const cudev_ops *o = b->ops;
    size_t H = (size_t)l->H, k = (size_t)l->k;
    int n_pairs = n * l->k;
    if (cu_hash_ids(l, n, ids, topk_ids, err) < 0 ||
        cu_route_pass(b, s, l, n, x, topk_ids, topk_w, NULL, NULL, NULL, err) < 0)
        return -1;
    uint32_t *pexp = malloc((size_t)n_pairs * 4 + 1);
    cu_pair_plan pp = {0};
    if (!pexp)
        return ep_err_set(err, "out of memory");
    for (int i = 0; i < n_pairs; i++)
        pexp[i] = (uint32_t)topk_ids[i];
    int rc = cu_plan_pairs(l, n_pairs, pexp, &pp, err);
    cu_mlp_stage ms = cu_stage_of(s);
    for (int i = 0; rc == 0 && i < n_pairs; i++)
        if (!l->owned[pexp[i]])
            rc = ep_err_set(err, "%s: token %d selects expert %u, which is not loaded here",
                            l->name, i / l->k, pexp[i]);
    for (uint32_t c0 = 0; rc == 0 && c0 < (uint32_t)n_pairs; c0 += (uint32_t)s->P) {
        uint32_t c1 = (uint32_t)n_pairs - c0 < (uint32_t)s->P ? (uint32_t)n_pairs : c0 + s->P;
        int m = (int)(c1 - c0), max_rows;
        int ng = cu_plan_groups(l, pp.start, c0, c1, ms.g13, ms.g2, &max_rows);
        for (int i = 0; i < m; i++) {
            uint32_t p = pp.order[c0 + i]; /* p = t * k + j: the slot */
            ms.rowidx[i] = p / (uint32_t)l->k;
            ms.outrow[i] = p;
            ms.w[i] = topk_w[p];
        }
        rc =
            o->h2d(b->d, s->rowidx, ms.rowidx, (size_t)m * 4, err) < 0 ||
                    o->h2d(b->d, s->outrow, ms.outrow, (size_t)m * 4, err) < 0 ||
                    o->h2d(b->d, s->w, ms.w, (size_t)m * 4, err) < 0 ||
                    o->gather(b->d, l->H, m, s->rowidx, s->q, s->qs, s->a, s->as, false, err) < 0 ||
                    cu_mlp_pass(b, s, l, m, ng, ms.g13, ms.g2, max_rows, true, true, s->eo, true,
                                err) < 0 ||
                    /* the next chunk reuses the staged tables */
                    (c1 < (uint32_t)n_pairs && cu_wait(b, err) < 0)
                ? -1
                : 0;
    }
    cu_free_plan(&pp);
    free(pexp);
    if (rc < 0)
        return -1;
    uint8_t *st = s->pinned;
    memcpy(st, topk_ids, (size_t)n * k * 4);
    if (shared_pass(b, s, l, n, s->q, s->qs, s->shared, err) < 0 ||
        o->h2d(b->d, s->topk, st, (size_t)n * k * 4, err) < 0 ||
        o->combine(b->d, n, l->k, l->H, s->topk, s->eo, s->shared, s->out, err) < 0 ||
        o->d2h(b->d, st, s->out, (size_t)n * H * 2, err) < 0 || cu_wait(b, err) < 0)
        return -1;
    memcpy(out, st, (size_t)n * H * 2);
    return 0;
}

int cuda_forward(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x, const int64_t *ids,
                 uint16_t *out, int32_t *topk_ids, float *topk_w, ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (cu_ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    if (b->step_busy)
        return ep_err_set(err, "mb_forward: a step is open on this backend");
    size_t H = (size_t)l->H, k = (size_t)l->k;
    for (int t0 = 0; t0 < T; t0 += b->b.C) {
        int n = T - t0 < b->b.C ? T - t0 : b->b.C;
        if (forward_pass(b, l, n, x + (size_t)t0 * H, ids ? ids + t0 : NULL, out + (size_t)t0 * H,
                         topk_ids + (size_t)t0 * k, topk_w + (size_t)t0 * k, err) < 0)
            return ep_err_prefix(err, "%s on %s", l->name, b->info.name);
    }
    return 0;
}
