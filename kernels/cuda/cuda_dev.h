/*
 * cuda_dev.h — the thin interface between the CUDA backend's host logic (backend_cuda.c, plain
 * C, built and tested without a GPU) and the device (cuda_dev.cu: CUDA runtime calls and kernel
 * launches) (prefix cudev_).
 *
 * Everything the backend does to a device goes through one cudev_ops table, so a test can put a
 * fake behind it (tests/unit/test_cuda_host.c: host memory, the CPU reference kernels, injected
 * failures) and check the host logic — grouping and offset tables, the arena layout, staging,
 * the device-memory check and every error path — on a machine without a GPU.
 *
 * All operations are asynchronous on the context's one stream, in call order, except open,
 * close, mem_info, alloc/free and query. "Device pointer" means memory from alloc (or carved
 * from it); host pointers given to h2d/d2h should come from alloc_host (pinned) for real
 * asynchrony. Each function returns 0 or -1 with err naming the call and the CUDA error.
 *
 * The kernels' arithmetic is docs/numerics.md's, one IEEE operation at a time (device code is
 * built with --fmad=false); each is described by the CPU function it must match bit for bit.
 */
#ifndef EPMOE_CUDA_DEV_H
#define EPMOE_CUDA_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/moe_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudev cudev;

/* One group of a grouped expert GEMM: rows [row0, row0 + rows) of the activations go through
 * one expert's weights (device pointers; w[1]/scale[1] only for a fused w1+w3 call). */
typedef struct cudev_group {
    uint32_t row0, rows;
    const uint8_t *w[2];
    const void *scale[2];
} cudev_group;

/* A grouped GEMM (kernels/gemm.h's canonical definition per row, exact mode; spec §7 in fast
 * mode): for each group g and row m of it, out[m][n] = W_g[n] . a[m] over K, with a e4m3
 * [M, K] and a_scale f32 [M, K/128]. Weights: MB_W_FP8 (e4m3 [N, K], scale f32 [N/128, K/128])
 * or MB_W_MXFP4 (packed [N, K/2], scale e8m0 [N, K/32]). n_mats = 2 computes w[0] into out_f32
 * and w[1] into out2_f32 (w1 and w3 share their activations), rows ld_out floats apart (0: N);
 * when w[1] directly follows w[0] (and scale[1] scale[0]) and out2_f32 = out_f32 + N with
 * ld_out = 2N, a library GEMM may do both as one. With out_bf16 set instead, each result is
 * rounded to bf16 and row m is written to row out_row[m] (out_row NULL: m). */
typedef struct cudev_gemm {
    mb_wformat format;
    mb_gemm_mode mode;
    int N, K, M;
    int n_mats;
    int n_groups;
    const cudev_group *groups;   /* device [n_groups] */
    const cudev_group *h_groups; /* the same, on the host (tile planning, the fake) */
    int max_rows;                /* largest group's rows */
    const uint8_t *a;
    const float *a_scale;
    float *out_f32, *out2_f32; /* [M, N], rows ld_out apart */
    int ld_out;
    uint16_t *out_bf16;      /* [., N] */
    const uint32_t *out_row; /* [M] or NULL */
    /* which kernels run (cuBLASLt, the few-row and reference kernels, row splits): the
     * backend's options (cuda_tuning.h); NULL: the defaults. Last, so positional initialisers
     * of the fields above stay valid. */
    const mb_cuda_tuning *tune;
} cudev_gemm;

typedef struct cudev_ops {
    /* context: select the device, create the stream; fill info (name, memory, sm). */
    int (*open)(int ordinal, cudev **out, mb_device_info *info, ep_err *err);
    void (*close)(cudev *d);
    int (*mem_info)(cudev *d, uint64_t *free_bytes, uint64_t *total_bytes, ep_err *err);
    int (*alloc)(cudev *d, void **p, size_t bytes, ep_err *err);
    void (*free)(cudev *d, void *p);
    int (*alloc_host)(cudev *d, void **p, size_t bytes, ep_err *err);
    void (*free_host)(cudev *d, void *p);
    int (*h2d)(cudev *d, void *dst, const void *src, size_t bytes, ep_err *err);
    int (*d2h)(cudev *d, void *dst, const void *src, size_t bytes, ep_err *err);
    int (*d2d)(cudev *d, void *dst, const void *src, size_t bytes, ep_err *err);
    int (*memset0)(cudev *d, void *dst, size_t bytes, ep_err *err);
    /* 0 when the stream is idle, 1 while busy, -1 on a device error. Never blocks. */
    int (*query)(cudev *d, ep_err *err);
    void *(*stream)(cudev *d); /* cudaStream_t */

    /* route_rmsnorm (reference order): x, xn bf16 [T, H], gain bf16 [H]. */
    int (*rmsnorm)(cudev *d, int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                   uint16_t *xn, ep_err *err);
    /* route_logits: logits f32 [T, E] from xn bf16 [T, H] and the gate TRANSPOSED, bf16 [H, E]
     * (the layout the device reads coalesced); sum in double, ascending k. */
    int (*logits)(cudev *d, int T, int H, int E, const uint16_t *xn, const uint16_t *gate_t,
                  float *logits, ep_err *err);
    /* qt_act_rows: q e4m3 [M, K], qs f32 [M, K/128] from x bf16 [M, K]. */
    int (*quant)(cudev *d, int M, int K, bool pow2, const uint16_t *x, uint8_t *q, float *qs,
                 ep_err *err);
    /* rows: q_out[i] = q[rows[i]], qs_out[i] = qs[rows[i]] (i < n); qs_out as e8m0 bytes when
     * e8m0 (fmt_e8m0_ceil of each scale, which the caller knows to be a power of two). */
    int (*gather)(cudev *d, int H, int n, const uint32_t *rows, const uint8_t *q, const float *qs,
                  uint8_t *q_out, void *qs_out, bool e8m0, ep_err *err);
    int (*e8m0_to_f32)(cudev *d, size_t n, const uint8_t *in, float *out, ep_err *err);
    int (*gemm)(cudev *d, const cudev_gemm *g, ep_err *err);
    /* swiglu_rows: acc1, acc3 f32 [M, I] (rows ld floats apart) -> hq e4m3 [M, I], hqs f32
     * [M, I/128]; w_row [M] (NULL: 1.0f). exp_table [65536]: exp(-g) for every bf16 bit pattern
     * g (built on the host with mf_expf, kernels/mathf.h, so the device needs no exp of its own);
     * exp_neg_limit = mf_expf(-limit). */
    int (*swiglu)(cudev *d, int M, int I, const float *acc1, const float *acc3, int ld,
                  const float *w_row, float limit, bool pow2, const float *exp_table,
                  float exp_neg_limit, uint8_t *hq, float *hqs, ep_err *err);
    /* moe_combine: out bf16 [T, H] from eo bf16 [T, k, H], topk_ids [T, k], shared bf16 [T, H]. */
    int (*combine)(cudev *d, int T, int k, int H, const int32_t *topk_ids, const uint16_t *eo,
                   const uint16_t *shared, uint16_t *out, ep_err *err);
    /* dst[rows[i]] = src[i] for bf16 rows of H (i < n). */
    int (*scatter)(cudev *d, int H, int n, const uint32_t *rows, const uint16_t *src, uint16_t *dst,
                   ep_err *err);
} cudev_ops;

/* The process-wide runtime calls the NCCL data plane makes besides a context's (it binds a
 * communicator to the calling thread's device and polls the executor's stream). */
typedef struct cudev_rt {
    int (*set_device)(int ordinal, ep_err *err);
    /* 0 when the stream is idle, 1 while busy, -1 on a device error. Never blocks. */
    int (*stream_query)(void *stream, ep_err *err);
} cudev_rt;

/* What the CUDA module (libepmoe_cuda.so: cuda_dev.cu and the kernels, linked with cudart and
 * cuBLASLt) hands out through its one exported symbol, CUDEV_MODULE_ENTRY. The sizes let the
 * loader refuse a module built from another version of this header instead of calling through
 * a table of another shape. */
typedef struct cudev_module {
    uint32_t size;     /* sizeof(cudev_module) */
    uint32_t ops_size; /* sizeof(cudev_ops) */
    uint32_t rt_size;  /* sizeof(cudev_rt) */
    const cudev_ops *ops;
    const cudev_rt *rt;
} cudev_module;

#define CUDEV_MODULE_FILE  "libepmoe_cuda.so"
#define CUDEV_MODULE_ENTRY "epmoe_cudev_module"
typedef const cudev_module *(*cudev_module_fn)(void);

/* The real device: the CUDA module, opened at the first call (cuda_module.c) from file (NULL or
 * "": CUDEV_MODULE_FILE through the loader's search). NULL with err saying why (a build without
 * CUDA, a module or CUDA library that cannot be loaded, naming the file and the loader's
 * reason); later calls give the same answer, whatever file they name. Thread-safe. */
const cudev_ops *cudev_cuda_ops(const char *file, ep_err *err);
/* The module's runtime calls (cudev_rt), loading it like cudev_cuda_ops(NULL) if no backend
 * has yet. */
int cudev_set_device(int ordinal, ep_err *err);
int cudev_stream_query(void *stream, ep_err *err);

/* The CUDA backend over any device ops (the front's mb_cuda_create passes cudev_cuda_ops). */
mb_backend *mb_cuda_create_with(const mb_options *o, int ordinal, const cudev_ops *ops,
                                ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
