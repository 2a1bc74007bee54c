/*
 * backend.h — what kernels/backend.c (the front of moe_backend.h) shares with the backends
 * behind it (kernels/cpu/backend_cpu.c, kernels/cuda/backend_cuda.c). Not a public header: the
 * public face is moe_backend.h, a header of its own below this one, so every backend includes
 * the seam's types without reaching up to the front; kernels/backend_create.c, above the
 * backends, is the one place that names them.
 *
 * Every backend object starts with the common part below, so the front can dispatch on
 * be->vt without knowing the rest (Redis ae.c picks ae_epoll.c the same way, at build time;
 * here the device string picks at run time). The entries after the host ones are the optional
 * device operations (moe_backend.h, mb_dev_*): NULL means unsupported, and the front refuses
 * the call (ggml-backend-impl.h's optional entries of ggml_backend_i).
 */
#ifndef EPMOE_KERNELS_BACKEND_H
#define EPMOE_KERNELS_BACKEND_H

#include "kernels/moe_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mb_vtable {
    void (*destroy)(mb_backend *be);
    int (*device)(const mb_backend *be, mb_device_info *info);
    int (*set_gemm)(mb_backend *be, mb_gemm_mode mode, ep_err *err); /* NULL: exact only */
    uint64_t (*layer_footprint)(const mb_backend *be, const mc_config *c, int n_experts);
    uint64_t (*step_footprint)(const mb_backend *be, const mc_config *c, int max_tokens);
    int (*reserve)(mb_backend *be, const mc_config *c, uint64_t weight_bytes, int max_tokens,
                   ep_err *err);
    mb_layer *(*layer_load)(mb_backend *be, const mc_config *c, const mb_layer_src *src,
                            const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                            void *progress_ctx, ep_err *err);
    void (*layer_free)(mb_layer *l);
    bool (*layer_owns)(const mb_layer *l, int expert);
    uint64_t (*layer_bytes)(const mb_layer *l);
    mb_step *(*step_begin)(mb_backend *be, const mb_layer *l, int T, const uint16_t *x,
                           const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q,
                           float *qs, uint16_t *xn, ep_err *err);
    int (*step_shared)(mb_step *s, ep_err *err);
    int (*steps_shared)(mb_step *const *s, int n, ep_err *err); /* NULL: step_shared each */
    int (*step_finish)(mb_step *s, const uint16_t *eo, uint16_t *out, ep_err *err);
    void (*step_free)(mb_step *s);
    int (*experts)(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *q, const float *qs,
                   int n_pairs, const uint32_t *pair_row, const uint32_t *pair_expert,
                   const float *pair_w, uint16_t *out, ep_err *err);
    int (*quant)(mb_backend *be, const mb_layer *l, int n, const uint16_t *xn, uint8_t *q,
                 float *qs, ep_err *err);
    int (*forward)(mb_backend *be, const mb_layer *l, int T, const uint16_t *x, const int64_t *ids,
                   uint16_t *out, int32_t *topk_ids, float *topk_w, ep_err *err);

    /* ---- optional device operations (NULL: unsupported; all or none) ---- */
    void *(*dev_stream)(mb_backend *be);
    int (*dev_poll)(mb_backend *be, ep_err *err);
    int (*dev_wait)(mb_backend *be, int64_t deadline, ep_err *err);
    int (*dev_alloc)(mb_backend *be, void **d_p, size_t bytes, ep_err *err);
    void (*dev_free)(mb_backend *be, void *d_p);
    int (*dev_alloc_host)(mb_backend *be, void **h_p, size_t bytes, ep_err *err);
    void (*dev_free_host)(mb_backend *be, void *h_p);
    int (*dev_h2d)(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err);
    int (*dev_d2h)(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err);
    mb_step *(*dev_step_begin)(mb_backend *be, const mb_layer *l, int T, const uint16_t *h_x,
                               const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w,
                               int64_t deadline, ep_err *err);
    const uint8_t *(*dev_step_q)(const mb_step *s);
    const float *(*dev_step_qs)(const mb_step *s);
    int (*dev_gather)(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
                      const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err);
    int (*dev_scales_to_f32)(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32,
                             ep_err *err);
    int (*dev_experts)(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *d_q,
                       const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                       const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out,
                       ep_err *err);
    int (*dev_scatter)(mb_backend *be, int H, int n, const uint32_t *d_slots,
                       const uint16_t *d_rows, uint16_t *d_eo, ep_err *err);
    uint16_t *(*dev_step_eo)(mb_step *s, ep_err *err);
    int (*dev_step_finish)(mb_step *s, uint16_t *h_out, int64_t deadline, ep_err *err);
} mb_vtable;

struct mb_backend {
    const mb_vtable *vt;
    mb_device_kind kind;
    char name[32];
};

struct mb_layer {
    mb_backend *be;
    int index;
    int hidden; /* H (set by the front) */
};

struct mb_step {
    mb_backend *be;
};

/* The backends' constructors (o->device already parsed). mb_cuda_create exists in every
 * build: without CUDA it fails saying so. */
mb_backend *mb_cpu_create(const mb_options *o, ep_err *err);
mb_backend *mb_cuda_create(const mb_options *o, int ordinal, ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
