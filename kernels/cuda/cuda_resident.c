/*
 * cuda_resident.c — the CUDA backend's optional device operations (moe_backend.h mb_dev_*, the
 * NCCL plane's): the same kernels as the host steps (cuda_steps.c) on device-resident rows, all
 * enqueued on the backend's one stream; the host waits only with a deadline.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/limits.h"
#include "kernels/cuda/cuda_internal.h"

/* mb_dev_experts (the front checked the counts; n_pairs > 0). */
int cuda_dev_experts(mb_backend *be, const mb_layer *ml, int n_rows, const uint8_t *d_q,
                     const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                     const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out,
                     ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    for (int p = 0; p < n_pairs; p++)
        if (h_pair_row[p] >= (uint32_t)n_rows || !cuda_layer_owns(ml, (int)h_pair_expert[p]))
            return ep_err_set(err, "%s: pair %d: row %u of %d or expert %u not loaded here",
                              l->name, p, h_pair_row[p], n_rows, h_pair_expert[p]);
    if (cu_ensure_step_bufs(b, &l->cfg, err) < 0)
        return -1;
    cu_bufs *s = &b->b;
    cu_pair_plan pp = {0};
    int rc = cu_plan_pairs(l, n_pairs, h_pair_expert, &pp, err);
    cu_mlp_stage ms = cu_stage_of(s);
    for (uint32_t c0 = 0; rc == 0 && c0 < (uint32_t)n_pairs; c0 += (uint32_t)s->P) {
        uint32_t c1 = (uint32_t)n_pairs - c0 < (uint32_t)s->P ? (uint32_t)n_pairs : c0 + s->P;
        int n = (int)(c1 - c0), max_rows;
        int ng = cu_plan_groups(l, pp.start, c0, c1, ms.g13, ms.g2, &max_rows);
        for (int i = 0; i < n; i++) {
            uint32_t p = pp.order[c0 + i];
            ms.rowidx[i] = h_pair_row[p];
            ms.outrow[i] = p;
            ms.w[i] = h_pair_w[p];
        }
        rc = b->ops->h2d(b->d, s->rowidx, ms.rowidx, (size_t)n * 4, err) < 0 ||
                     b->ops->h2d(b->d, s->outrow, ms.outrow, (size_t)n * 4, err) < 0 ||
                     b->ops->h2d(b->d, s->w, ms.w, (size_t)n * 4, err) < 0 ||
                     b->ops->gather(b->d, l->H, n, s->rowidx, d_q, d_qs, s->a, s->as, false, err) <
                         0 ||
                     cu_mlp_pass(b, s, l, n, ng, ms.g13, ms.g2, max_rows, true, true, d_out, true,
                                 err) < 0 ||
                     (c1 < (uint32_t)n_pairs && cu_wait(b, err) < 0)
                 ? -1
                 : 0;
    }
    cu_free_plan(&pp);
    return rc;
}

/* ---- device operations (moe_backend.h mb_dev_*: the NCCL plane's) --------------------------- */

void *cuda_dev_stream(mb_backend *be)
{
    cuda_backend *b = cb(be);
    return b->ops->stream(b->d);
}

int cuda_dev_poll(mb_backend *be, ep_err *err)
{
    cuda_backend *b = cb(be);
    return b->ops->query(b->d, err);
}

int cuda_dev_wait(mb_backend *be, int64_t deadline, ep_err *err)
{
    cuda_backend *b = cb(be);
    return cu_wait_until(b->ops, b->d, deadline, err);
}

int cuda_dev_alloc(mb_backend *be, void **d_p, size_t bytes, ep_err *err)
{
    cuda_backend *b = cb(be);
    return b->ops->alloc(b->d, d_p, bytes ? bytes : 1, err);
}

void cuda_dev_free(mb_backend *be, void *d_p)
{
    cuda_backend *b = cb(be);
    b->ops->free(b->d, d_p);
}

int cuda_dev_alloc_host(mb_backend *be, void **h_p, size_t bytes, ep_err *err)
{
    cuda_backend *b = cb(be);
    return b->ops->alloc_host(b->d, h_p, bytes ? bytes : 1, err);
}

void cuda_dev_free_host(mb_backend *be, void *h_p)
{
    cuda_backend *b = cb(be);
    b->ops->free_host(b->d, h_p);
}

int cuda_dev_h2d(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err)
{
    cuda_backend *b = cb(be);
    return bytes ? b->ops->h2d(b->d, d_dst, h_src, bytes, err) : 0;
}

int cuda_dev_d2h(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err)
{
    cuda_backend *b = cb(be);
    return bytes ? b->ops->d2h(b->d, h_dst, d_src, bytes, err) : 0;
}

mb_step *cuda_dev_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *h_x,
                             const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w,
                             int64_t deadline, ep_err *err)
{
    cuda_backend *b = cb(be);
    const cuda_layer *l = cl(ml);
    if (T < 0 || T > CU_STEP_TOKENS) {
        ep_err_set(err, "mb_dev_step_begin: %d tokens, a device-resident step holds 0..%d", T,
                   CU_STEP_TOKENS);
        return NULL;
    }
    if (cu_hash_ids(l, T, h_ids, h_topk_ids, err) < 0)
        return NULL;
    cuda_step *s = cu_step_new(b, l, T, err);
    if (!s)
        return NULL;
    if (!s->resident) {
        ep_err_set(err, "mb_dev_step_begin: %d tokens, the step buffers hold %d", T, s->bufs->C);
        cuda_step_free(&s->base);
        return NULL;
    }
    s->topk_ids = h_topk_ids;
    if (T > 0 &&
        cu_route_pass(b, s->bufs, l, T, h_x, h_topk_ids, h_topk_w, NULL, NULL, NULL, err) < 0) {
        ep_err_prefix(err, "%s on %s", l->name, b->info.name);
        cuda_step_free(&s->base);
        return NULL;
    }
    (void)deadline;
    cu_bufs *bf = s->bufs;
    if (T > 0 && b->ops->memset0(b->d, bf->eo, (size_t)T * l->k * l->H * 2, err) < 0) {
        cuda_step_free(&s->base);
        return NULL;
    }
    return &s->base;
}

const uint8_t *cuda_dev_step_q(const mb_step *ms)
{
    return ((const cuda_step *)ms)->bufs->q;
}

const float *cuda_dev_step_qs(const mb_step *ms)
{
    return ((const cuda_step *)ms)->bufs->qs;
}

uint16_t *cuda_dev_step_eo(mb_step *ms, ep_err *err)
{
    return ((cuda_step *)ms)->bufs->eo;
}

int cuda_dev_gather(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
                    const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err)
{
    cuda_backend *b = cb(be);
    return n ? b->ops->gather(b->d, H, n, d_rows, d_q, d_qs, d_codes, d_scales, e8m0, err) : 0;
}

int cuda_dev_scales_to_f32(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32,
                           ep_err *err)
{
    cuda_backend *b = cb(be);
    return n ? b->ops->e8m0_to_f32(b->d, n, d_e8m0, d_f32, err) : 0;
}

int cuda_dev_scatter(mb_backend *be, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                     uint16_t *d_eo, ep_err *err)
{
    cuda_backend *b = cb(be);
    return n ? b->ops->scatter(b->d, H, n, d_slots, d_rows, d_eo, err) : 0;
}

int cuda_dev_step_finish(mb_step *ms, uint16_t *h_out, int64_t deadline, ep_err *err)
{
    cuda_step *s = (cuda_step *)ms;
    cuda_backend *b = cb(ms->be);
    const cuda_layer *l = s->l;
    cu_bufs *bf = s->bufs;
    if (s->T == 0)
        return 0;
    size_t H = (size_t)l->H, k = (size_t)l->k;
    uint8_t *st = bf->pinned;
    memcpy(st, s->topk_ids, (size_t)s->T * k * 4);
    if (cuda_step_shared(ms, err) < 0 ||
        b->ops->h2d(b->d, bf->topk, st, (size_t)s->T * k * 4, err) < 0 ||
        b->ops->combine(b->d, s->T, l->k, l->H, bf->topk, bf->eo, bf->shared, bf->out, err) < 0 ||
        b->ops->d2h(b->d, st, bf->out, (size_t)s->T * H * 2, err) < 0 ||
        cu_wait_until(b->ops, b->d, deadline, err) < 0)
        return -1;
    memcpy(h_out, st, (size_t)s->T * H * 2);
    return 0;
}
