/*
 * cuda_step.h — the device-resident step operations of the CUDA backend, for data planes that
 * move device memory themselves (the NCCL transport, worker/transport_nccl.c) (prefix mbc_).
 *
 * Everything here is enqueued on the backend's one stream (mbc_stream) in call order and
 * returns without waiting, except where a function says it waits. Pointers named d_* are device
 * memory, h_* host memory (pinned where it says so). Nothing here waits without a deadline:
 * mbc_poll reports whether the stream has drained, so a caller can wait for it with its own
 * deadline (and abort its communicator when a transfer is stuck).
 *
 * The bits are those of the host API in kernels/moe_backend.h (same kernels, same order); only
 * where the data lives differs. Only valid on a backend created for a cuda:N device
 * (mb_device() kind MB_DEV_CUDA); on any other backend every function fails with a message.
 */
#ifndef EPMOE_CUDA_STEP_H
#define EPMOE_CUDA_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/moe_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's cudaStream_t (as void *), for ncclSend/ncclRecv on the same stream. */
void *mbc_stream(mb_backend *be);
/* 0 when everything enqueued so far has finished, 1 while work is pending, -1 (err set) when
 * the device reported an error. Never blocks. */
int mbc_poll(mb_backend *be, ep_err *err);
/* Poll until the stream drains or `deadline` (CLOCK_MONOTONIC seconds) passes: 0, or -1 with
 * err "... timed out" / the device error. */
int mbc_wait(mb_backend *be, double deadline, ep_err *err);

/* Device and pinned host buffers for a data plane's own use (cudaMalloc / cudaMallocHost);
 * free with the matching function. Sizes of 0 give a valid 1-byte allocation. */
int mbc_alloc(mb_backend *be, void **d_p, size_t bytes, ep_err *err);
void mbc_free(mb_backend *be, void *d_p);
int mbc_alloc_host(mb_backend *be, void **h_p, size_t bytes, ep_err *err);
void mbc_free_host(mb_backend *be, void *h_p);
/* Asynchronous copies on the stream (host memory should be pinned for real asynchrony). */
int mbc_h2d(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err);
int mbc_d2h(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err);

/* Begin a step with device-resident results: as mb_step_begin, but q/qs stay on the device
 * (mbc_step_q / mbc_step_qs, valid until mb_step_free); topk_ids and topk_w come back to the
 * host (this function waits for them, until `deadline`: the dispatch plan needs them). */
mb_step *mbc_step_begin(mb_backend *be, const mb_layer *l, int T, const uint16_t *h_x,
                        const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w, double deadline,
                        ep_err *err);
const uint8_t *mbc_step_q(const mb_step *s); /* d: e4m3 [T, H] */
const float *mbc_step_qs(const mb_step *s);  /* d: f32 [T, H/128] */

/* Gather rows for sending: for i < n, row d_rows[i] of (d_q [., H], d_qs [., H/128]) goes to
 * row i of d_codes [n, H] and d_scales [n, H/128] — as e8m0 bytes when e8m0 (every scale must
 * be a power of two: act_ue8m0), else f32. */
int mbc_gather(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
               const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err);
/* e8m0 scale bytes -> f32 (n values). */
int mbc_scales_to_f32(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32, ep_err *err);

/* Routed experts on device rows: as mb_experts with d_q [n_rows, H], d_qs f32 [n_rows, H/128]
 * on the device and the pairs on the HOST (the caller has them there from validating what it
 * received; the grouping by expert is planned on the host and uploaded); out bf16
 * [n_pairs, H] on the device, row p for pair p. */
int mbc_experts(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *d_q,
                const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out, ep_err *err);

/* Scatter rows: row i of d_rows bf16 [n, H] goes to row d_slots[i] of d_eo bf16 [T*k, H]. */
int mbc_scatter(mb_backend *be, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                uint16_t *d_eo, ep_err *err);

/* A zeroed bf16 [T*k, H] buffer of the step for the expert outputs (valid until
 * mb_step_free); mbc_step_finish combines it. */
uint16_t *mbc_step_eo(mb_step *s, ep_err *err);
/* Shared expert (if mb_step_shared was not called) + combine of the step's eo on the device,
 * then out bf16 [T, H] copied to h_out; waits until `deadline` for the copy. */
int mbc_step_finish(mb_step *s, uint16_t *h_out, double deadline, ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
