/*
 * cuda_internal.h — what the CUDA backend's host half shares among its files (not a public
 * header; prefix cu_, the vtable's entries cuda_):
 *
 *   backend_cuda.c   the backend object: creation, the vtable, sizes, arenas, step buffers
 *   cuda_load.c      loading a layer: staging, uploads, the router's and experts' tensors
 *   cuda_steps.c     routing, the expert MLP, steps and the whole layer (host memory in/out)
 *   cuda_resident.c  the optional device operations (moe_backend.h mb_dev_*: the NCCL plane's)
 *
 * Memory, numerics and waiting: backend_cuda.c's opening comment.
 */
#ifndef EPMOE_CUDA_INTERNAL_H
#define EPMOE_CUDA_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/pool.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_tuning.h"

/* Tokens per route/combine pass and expert rows per MLP pass: bound the step buffers (about
 * 1.5 GB at V4-Flash sizes) whatever a request holds. */
#define CU_STEP_TOKENS 8192
#define CU_PAIR_CHUNK  16384
/* Carving alignment (cudaMalloc's own is 256). */
#define CU_ALIGN 256
/* Device memory kept free beyond the reservation (CUDA context, cuBLASLt workspace, NCCL). */
#define CU_MEM_MARGIN (512ull << 20)

typedef struct cu_arena {
    atomic_int refs;
    const cudev_ops *ops;
    cudev *d;
    uint8_t *base;
    size_t size, used;
} cu_arena;

/* Device pointers of one expert MLP (w1, w3, w2 and their scales). */
typedef struct cu_mlp {
    const uint8_t *w[3];
    const void *s[3];
} cu_mlp;

/* The step buffers (device) and the staging buffer (pinned host). */
typedef struct cu_bufs {
    int C, P; /* tokens per pass, expert rows per pass; 0: not allocated */
    int H, I, E, k;
    void *dev;    /* one allocation, carved */
    void *pinned; /* one allocation */
    size_t pinned_bytes;
    /* route pass */
    uint16_t *x, *xn, *shared, *eo, *out;
    float *logits, *qs;
    uint8_t *q;
    int32_t *topk;
    /* MLP pass */
    uint8_t *a, *hq;
    float *as, *w, *acc1, *acc3, *hqs;
    uint32_t *rowidx, *outrow;
    uint16_t *mo;
    cudev_group *g13, *g2;
} cu_bufs;

typedef struct cuda_backend {
    mb_backend base;
    const cudev_ops *ops;
    cudev *d;
    mb_device_info info;
    mb_gemm_mode gemm;
    tpool *pool;      /* host threads: scores */
    cu_arena *arena;  /* where the next layers are carved from */
    float *exp_table; /* device [65536] */
    float *h_exp_table;
    cu_bufs b;
    void *stage[2]; /* pinned, stage_bytes each, for loading */
    size_t stage_bytes;
    double wait_s;
    mb_cuda_tuning tune; /* the options' (cuda_tuning.h); the kernels get it with each GEMM */
    bool step_busy;      /* the step buffers belong to an open step */
} cuda_backend;

typedef struct cuda_layer {
    mb_layer base;
    cu_arena *arena;
    mc_config cfg;
    char name[32];
    bool hash;
    int H, I, E, k;
    mb_wformat fmt;          /* routed experts */
    uint16_t *norm, *gate_t; /* device */
    float *h_bias;           /* host [E] */
    int64_t *h_tid2eid;      /* host [vocab, k] */
    uint8_t *owned;          /* host [E] */
    cu_mlp *experts;         /* host table of device pointers [E] */
    cu_mlp shared;
    uint64_t bytes;
    float exp_neg_limit;
} cuda_layer;

typedef struct cuda_step {
    mb_step base;
    const cuda_layer *l;
    int T;
    bool resident; /* T <= C: q/qs/shared stay in the step buffers */
    bool own_bufs; /* the backend's buffers were busy: these are the step's own */
    cu_bufs *bufs; /* the buffers this step uses */
    cu_bufs own;
    const uint8_t *h_q; /* the caller's, for the chunked path */
    const float *h_qs;
    const int32_t *topk_ids;
    bool shared_done;
    uint16_t *h_shared; /* chunked path: bf16 [T, H] */
} cuda_step;

typedef struct cu_pair_plan {
    uint32_t *order, *start;
} cu_pair_plan;

/* Staging layout of one MLP pass's small tables (at the end of the pinned buffer). */
typedef struct cu_mlp_stage {
    cudev_group *g13, *g2;
    uint32_t *rowidx, *outrow;
    float *w;
    uint8_t *big; /* the start of the pinned buffer: rows in, rows out */
} cu_mlp_stage;

static inline cuda_backend *cb(mb_backend *be)
{
    return (cuda_backend *)be;
}

static inline const cuda_layer *cl(const mb_layer *l)
{
    return (const cuda_layer *)l;
}

/* ---- backend_cuda.c: waits, sizes, arenas, step buffers ---- */

size_t cu_align(size_t n);
int cu_wait_until(const cudev_ops *ops, cudev *d, int64_t deadline, ep_err *err);
int cu_wait(cuda_backend *b, ep_err *err);
/* clk_mono_ms when a wait started now must be over (EPMOE_CUDA_WAIT_S). */
int64_t cu_deadline(const cuda_backend *b);
uint64_t cuda_layer_footprint(const mb_backend *be, const mc_config *c, int n_experts);
size_t cu_bufs_big_bytes(const cu_bufs *s);
void cu_arena_unref(cu_arena **a_p);
cu_arena *cu_arena_new(cuda_backend *b, size_t bytes, ep_err *err);
void *cu_arena_carve(cu_arena *a, size_t bytes);
int cu_free_step_bufs(cuda_backend *b, cu_bufs *s);
int cu_alloc_step_bufs(cuda_backend *b, cu_bufs *s, const mc_config *c, int max_tokens,
                       ep_err *err);
int cu_ensure_step_bufs(cuda_backend *b, const mc_config *c, ep_err *err);

/* ---- cuda_load.c: layers ---- */

void cuda_layer_free(mb_layer *ml);
mb_layer *cuda_layer_load(mb_backend *be, const mc_config *c, const mb_layer_src *src,
                          const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                          void *progress_ctx, ep_err *err);
bool cuda_layer_owns(const mb_layer *l, int e);
uint64_t cuda_layer_bytes(const mb_layer *l);

/* ---- cuda_steps.c: routing, the expert MLP, steps ---- */

int cu_route_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, const uint16_t *x,
                  int32_t *topk_ids, float *topk_w, uint8_t *h_q, float *h_qs, uint16_t *h_xn,
                  ep_err *err);
int cu_mlp_pass(cuda_backend *b, cu_bufs *s, const cuda_layer *l, int n, int n_groups,
                cudev_group *h13, cudev_group *h2, int max_rows, bool routed, bool weights,
                uint16_t *dst, bool out_row, ep_err *err);
int cu_plan_groups(const cuda_layer *l, const uint32_t *start, uint32_t c0, uint32_t c1,
                   cudev_group *g13, cudev_group *g2, int *max_rows);
int cu_plan_pairs(const cuda_layer *l, int n_pairs, const uint32_t *pair_expert, cu_pair_plan *pp,
                  ep_err *err);
void cu_free_plan(cu_pair_plan *pp);
cu_mlp_stage cu_stage_of(cu_bufs *s);
int cuda_experts(mb_backend *be, const mb_layer *ml, int n_rows, const uint8_t *q, const float *qs,
                 int n_pairs, const uint32_t *pair_row, const uint32_t *pair_expert,
                 const float *pair_w, uint16_t *out, ep_err *err);
int cuda_quant(mb_backend *be, const mb_layer *ml, int n, const uint16_t *xn, uint8_t *q, float *qs,
               ep_err *err);
int cu_hash_ids(const cuda_layer *l, int T, const int64_t *ids, int32_t *topk_ids, ep_err *err);
void cuda_step_free(mb_step *ms);
cuda_step *cu_step_new(cuda_backend *b, const cuda_layer *l, int T, ep_err *err);
mb_step *cuda_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x,
                         const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q,
                         float *qs, uint16_t *xn, ep_err *err);
int cuda_step_shared(mb_step *ms, ep_err *err);
int cuda_step_finish(mb_step *ms, const uint16_t *eo, uint16_t *out, ep_err *err);
int cuda_forward(mb_backend *be, const mb_layer *ml, int T, const uint16_t *x, const int64_t *ids,
                 uint16_t *out, int32_t *topk_ids, float *topk_w, ep_err *err);

/* ---- cuda_resident.c: device operations ---- */

int cuda_dev_experts(mb_backend *be, const mb_layer *ml, int n_rows, const uint8_t *d_q,
                     const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                     const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out,
                     ep_err *err);
void *cuda_dev_stream(mb_backend *be);
int cuda_dev_poll(mb_backend *be, ep_err *err);
int cuda_dev_wait(mb_backend *be, int64_t deadline, ep_err *err);
int cuda_dev_alloc(mb_backend *be, void **d_p, size_t bytes, ep_err *err);
void cuda_dev_free(mb_backend *be, void *d_p);
int cuda_dev_alloc_host(mb_backend *be, void **h_p, size_t bytes, ep_err *err);
void cuda_dev_free_host(mb_backend *be, void *h_p);
int cuda_dev_h2d(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err);
int cuda_dev_d2h(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err);
mb_step *cuda_dev_step_begin(mb_backend *be, const mb_layer *ml, int T, const uint16_t *h_x,
                             const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w,
                             int64_t deadline, ep_err *err);
const uint8_t *cuda_dev_step_q(const mb_step *ms);
const float *cuda_dev_step_qs(const mb_step *ms);
uint16_t *cuda_dev_step_eo(mb_step *ms, ep_err *err);
int cuda_dev_gather(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
                    const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err);
int cuda_dev_scales_to_f32(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32,
                           ep_err *err);
int cuda_dev_scatter(mb_backend *be, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                     uint16_t *d_eo, ep_err *err);
int cuda_dev_step_finish(mb_step *ms, uint16_t *h_out, int64_t deadline, ep_err *err);

#endif
