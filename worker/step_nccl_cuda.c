/*
 * step_nccl_cuda.c — the NCCL step's device operations: kernels/cuda/cuda_step.h, one to one
 * (see step_nccl.h). dev is the worker's mb_backend, layer an mb_layer, step an mb_step.
 *
 * cuda_step.h exists in every build (without CUDA each call fails with a message), so this
 * file has no #ifdef; a worker on a cpu device never gets here (spec: nccl needs cuda:N).
 */
#include "kernels/cuda/cuda_step.h"
#include "worker/step_nccl.h"

static void *snc_stream(void *dev)
{
    return mbc_stream(dev);
}

static int snc_wait(void *dev, double deadline, ep_err *err)
{
    return mbc_wait(dev, deadline, err);
}

static int snc_alloc(void *dev, void **d_p, size_t bytes, ep_err *err)
{
    return mbc_alloc(dev, d_p, bytes, err);
}

static void snc_free(void *dev, void *d_p)
{
    mbc_free(dev, d_p);
}

static int snc_alloc_host(void *dev, void **h_p, size_t bytes, ep_err *err)
{
    return mbc_alloc_host(dev, h_p, bytes, err);
}

static void snc_free_host(void *dev, void *h_p)
{
    mbc_free_host(dev, h_p);
}

static int snc_h2d(void *dev, void *d_dst, const void *h_src, size_t bytes, ep_err *err)
{
    return mbc_h2d(dev, d_dst, h_src, bytes, err);
}

static int snc_d2h(void *dev, void *h_dst, const void *d_src, size_t bytes, ep_err *err)
{
    return mbc_d2h(dev, h_dst, d_src, bytes, err);
}

static void *snc_step_begin(void *dev, const void *layer, int T, const uint16_t *h_x,
                            const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w,
                            double deadline, ep_err *err)
{
    return mbc_step_begin(dev, layer, T, h_x, h_ids, h_topk_ids, h_topk_w, deadline, err);
}

static int snc_step_shared(void *step, ep_err *err)
{
    return mb_step_shared(step, err);
}

static const uint8_t *snc_step_q(const void *step)
{
    return mbc_step_q(step);
}

static const float *snc_step_qs(const void *step)
{
    return mbc_step_qs(step);
}

static int snc_gather(void *dev, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
                      const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err)
{
    return mbc_gather(dev, H, n, d_rows, d_q, d_qs, e8m0, d_codes, d_scales, err);
}

static int snc_scales_to_f32(void *dev, size_t n, const uint8_t *d_e8m0, float *d_f32, ep_err *err)
{
    return mbc_scales_to_f32(dev, n, d_e8m0, d_f32, err);
}

static int snc_experts(void *dev, const void *layer, int n_rows, const uint8_t *d_q,
                       const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                       const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out,
                       ep_err *err)
{
    return mbc_experts(dev, layer, n_rows, d_q, d_qs, n_pairs, h_pair_row, h_pair_expert, h_pair_w,
                       d_out, err);
}

static int snc_scatter(void *dev, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                       uint16_t *d_eo, ep_err *err)
{
    return mbc_scatter(dev, H, n, d_slots, d_rows, d_eo, err);
}

static uint16_t *snc_step_eo(void *step, ep_err *err)
{
    return mbc_step_eo(step, err);
}

static int snc_step_finish(void *step, uint16_t *h_out, double deadline, ep_err *err)
{
    return mbc_step_finish(step, h_out, deadline, err);
}

static void snc_step_free(void **step_p)
{
    mb_step *s = *step_p;
    mb_step_free(&s);
    *step_p = NULL;
}

static const sn_dev_ops snc_ops = {.stream = snc_stream,
                                   .wait = snc_wait,
                                   .alloc = snc_alloc,
                                   .free = snc_free,
                                   .alloc_host = snc_alloc_host,
                                   .free_host = snc_free_host,
                                   .h2d = snc_h2d,
                                   .d2h = snc_d2h,
                                   .step_begin = snc_step_begin,
                                   .step_shared = snc_step_shared,
                                   .step_q = snc_step_q,
                                   .step_qs = snc_step_qs,
                                   .gather = snc_gather,
                                   .scales_to_f32 = snc_scales_to_f32,
                                   .experts = snc_experts,
                                   .scatter = snc_scatter,
                                   .step_eo = snc_step_eo,
                                   .step_finish = snc_step_finish,
                                   .step_free = snc_step_free};

const sn_dev_ops *sn_cuda_dev_ops(void)
{
    return &snc_ops;
}
