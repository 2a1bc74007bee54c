/*
 * moe_backend.h — the one seam between a worker's executor and the math of a MoE layer
 * (prefix mb_).
 *
 * A backend is a device context: `cpu` (kernels/cpu/: the exact reference + AVX2 paths and a
 * GEMM thread pool) or `cuda:N` (kernels/cuda/: one device, one stream, one device arena for the
 * shard's weights, pinned staging buffers). A worker creates one backend for its device and
 * never asks which it got: every operation below takes and returns host memory, so the
 * executor and the ZeroMQ data plane are the same for every device. (The NCCL data plane works
 * on device memory and uses kernels/cuda/cuda_step.h instead.)
 *
 * Semantics (docs/numerics.md): the CPU backend defines the bits. The CUDA backend in
 * MB_GEMM_EXACT mode gives the same bits for every operation; in MB_GEMM_FAST mode its expert
 * GEMMs run on tensor cores and meet spec §7's tolerances (routing, quantization, SwiGLU and
 * combine stay exact).
 *
 * Weights enter as the checkpoint holds them (host pointers, possibly unaligned views of a
 * mapping, already checked against the expert-dtype contract by the caller — shard/shard.h);
 * the backend copies, packs or uploads them, so the source may be unmapped afterwards.
 *
 * A step at the tokens' origin:
 *   mb_step_begin    route + quantize the origin's T tokens (q/qs are the FP8 dispatch bytes)
 *   mb_step_shared   start the shared expert on the step's q/qs (CPU: computes it now; CUDA:
 *                    enqueues it, so it overlaps the dispatch)
 *   mb_experts       routed experts on any rows (own or received), any number of times
 *   mb_step_finish   combine the [T, k, H] expert outputs with the shared expert -> out [T, H]
 * A backend runs one operation at a time (one caller thread); steps are separate objects so
 * several may be open.
 *
 * Errors: -1 with err naming the layer, tensor, device call or size; a CUDA launch or copy that
 * fails is an error of the operation, never a hang or an abort.
 */
#ifndef EPMOE_MOE_BACKEND_H
#define EPMOE_MOE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "kernels/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mb_device_kind { MB_DEV_CPU = 0, MB_DEV_CUDA = 1 } mb_device_kind;
/* Expert GEMM path of the CUDA backend (the spec's expert_parallel.gpu_gemm). */
typedef enum mb_gemm_mode { MB_GEMM_EXACT = 0, MB_GEMM_FAST = 1 } mb_gemm_mode;

typedef struct mb_backend mb_backend;
typedef struct mb_layer mb_layer;
typedef struct mb_step mb_step;

typedef struct mb_options {
    const char *device; /* "cpu" or "cuda:N" */
    int threads;        /* host threads (GEMM pool; host work of CUDA); <= 0: one per CPU */
    gemm_impl impl;     /* CPU kernels; GEMM_IMPL_AUTO: the best this CPU has */
    mb_gemm_mode gemm;  /* CUDA expert GEMMs */
} mb_options;

/* What REGISTER reports and `epmoectl workers` shows. */
typedef struct mb_device_info {
    mb_device_kind kind;
    int ordinal;        /* N of cuda:N; 0 for cpu */
    char name[128];     /* "NVIDIA H200" or the CPU kernels' name */
    uint64_t mem_total; /* device memory (CUDA), bytes; 0 for cpu */
    uint64_t mem_free;  /* at the time of the call */
    int sm_major, sm_minor;
} mb_device_info;

/* Parse "cpu" or "cuda:N" (N in 0..255). Errors name the text and the accepted forms. */
int mb_parse_device(const char *text, mb_device_kind *kind, int *ordinal, ep_err *err);
/* Whether this build can serve a device kind (CUDA needs a CUDA build; a device need not be
 * present for this to be true). */
bool mb_build_supports(mb_device_kind kind);

/* Create the backend for o->device. A CUDA device that does not exist, or a build without
 * CUDA, is an error that says which. */
mb_backend *mb_create(const mb_options *o, ep_err *err);
void mb_destroy(mb_backend **self_p);
/* "cpu-avx512", "cpu-avx2", "cpu-ref", "cuda-exact", "cuda-fast". */
const char *mb_name(const mb_backend *be);
/* The expert GEMM path for the layers that follow (CUDA; the CPU is always exact and accepts
 * either). */
int mb_set_gemm(mb_backend *be, mb_gemm_mode mode, ep_err *err);
int mb_device(const mb_backend *be, mb_device_info *info);

/* ---- weights ---------------------------------------------------------------------------- */

typedef enum mb_wformat { MB_W_FP8 = 0, MB_W_MXFP4 = 1 } mb_wformat;

/* One linear layer as stored: FP8 block (w e4m3 [N, K]; scale [N/128, K/128] as e8m0 bytes when
 * scale_e8m0, else f32) or MXFP4 (w packed e2m1 [N, K/2], low nibble = even k; scale e8m0
 * [N, K/32]). Pointers need no alignment. w == NULL: not present (an expert not loaded). */
typedef struct mb_linear {
    mb_wformat format;
    int N, K;
    const uint8_t *w;
    const void *scale;
    bool scale_e8m0;
    const char *name; /* the weight tensor's name, for messages */
} mb_linear;

enum { MB_W1 = 0, MB_W3 = 1, MB_W2 = 2 };

/* One MoE layer's tensors. Shapes from the config: H, I, E, k, vocab. */
typedef struct mb_layer_src {
    int layer;                /* 0..mc_num_layers-1 */
    const char *name;         /* "layers.3" / "mtp.0" */
    const uint16_t *norm;     /* ffn_norm.weight bf16 [H] */
    const uint16_t *gate;     /* ffn.gate.weight bf16 [E, H] */
    const float *bias;        /* ffn.gate.bias f32 [E] (score layers) */
    const int64_t *tid2eid;   /* ffn.gate.tid2eid int64 [vocab, k] (hash layers) */
    mb_linear shared[3];      /* w1, w3, w2 of the shared expert */
    const mb_linear *experts; /* [E * 3]: w1, w3, w2 of expert e at 3e .. 3e+2 */
} mb_layer_src;

/* Weight bytes read so far (for LOADING progress); called at least once per expert. */
typedef void (*mb_progress_fn)(void *ctx, uint64_t bytes_done);

/* Backend memory (device memory for CUDA) a layer of this config holding n_experts routed
 * experts takes, and the step buffers a backend needs for max_tokens tokens. The shard loader
 * adds these up for the device-memory check. */
uint64_t mb_layer_footprint(const mb_backend *be, const mc_config *c, int n_experts);
uint64_t mb_step_footprint(const mb_backend *be, const mc_config *c, int max_tokens);

/* Reserve room for weight_bytes of weights (mb_layer_footprint summed) plus the step buffers of
 * max_tokens tokens. CUDA: one device allocation (the arena) that the layers loaded next are
 * carved from; fails with a message naming both sizes and the device's free memory when they
 * do not fit. A later call starts a new arena for the layers that follow (a new placement); the
 * old one lives until its last layer is freed. CPU: checks nothing, allocates per layer. */
int mb_reserve(mb_backend *be, const mc_config *c, uint64_t weight_bytes, int max_tokens,
               ep_err *err);

/* Build a layer: router and shared expert from src, routed expert e when want[e] (want NULL:
 * every expert whose src->experts[3e].w is set). When reuse is given (an older layer of the
 * same index and config on the same backend), the shared expert and the wanted experts it
 * holds come from it instead of src (no reading or packing: shared on the CPU, a device copy
 * on CUDA), so a new placement costs only the experts it gains. reuse stays usable (it can keep
 * serving steps until the switch) and is freed by its owner. progress may be NULL. */
mb_layer *mb_layer_load(mb_backend *be, const mc_config *c, const mb_layer_src *src,
                        const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                        void *progress_ctx, ep_err *err);
void mb_layer_free(mb_layer **self_p);
int mb_layer_index(const mb_layer *l);
bool mb_layer_owns(const mb_layer *l, int expert);
uint64_t mb_layer_bytes(const mb_layer *l); /* backend memory held */

/* ---- steps (host memory in and out) ---------------------------------------------------- */

/* Route and quantize T tokens: x bf16 [T, H] (before ffn_norm), ids int64 [T] (hash layers;
 * may be NULL on score layers). Writes topk_ids int32 [T, k], topk_w f32 [T, k], q e4m3 [T, H],
 * qs f32 [T, H/128] and, when xn is not NULL, the ffn_norm output bf16 [T, H]. The step keeps
 * what mb_step_shared and mb_step_finish need. Errors: ids missing on a hash layer, a bad token
 * id or tid2eid entry (naming the token), T outside 0..EP_MAX_TOKENS. */
mb_step *mb_step_begin(mb_backend *be, const mb_layer *l, int T, const uint16_t *x,
                       const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q, float *qs,
                       uint16_t *xn, ep_err *err);
/* Start (CUDA) or run (CPU) the shared expert on the step's q/qs. */
int mb_step_shared(mb_step *s, ep_err *err);
/* The shared expert of n open steps of one layer (steps whose shared expert ran already are
 * skipped): the CPU runs their rows as one GEMM, so concurrent requests read the shared
 * expert's weights once, with the same bits as one step at a time (the exact kernels' rows
 * are independent); a backend without a batched form runs them one by one. */
int mb_steps_shared(mb_step *const *steps, int n, ep_err *err);
/* out bf16 [T, H] = combine of eo bf16 [T, k, H] (the expert output of slot (t, j) at row
 * t*k + j; slots with topk_ids -1 are skipped) with the shared expert (run here if
 * mb_step_shared was not called). */
int mb_step_finish(mb_step *s, const uint16_t *eo, uint16_t *out, ep_err *err);
void mb_step_free(mb_step **self_p);

/* Routed experts for pairs: pair p sends row pair_row[p] of (q [n_rows, H], qs [n_rows, H/128])
 * to expert pair_expert[p] (owned by l) with weight pair_w[p]; out bf16 [n_pairs, H]. */
int mb_experts(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *q, const float *qs,
               int n_pairs, const uint32_t *pair_row, const uint32_t *pair_expert,
               const float *pair_w, uint16_t *out, ep_err *err);

/* Quantize bf16 rows [n, H] to the dispatch format (a bf16 DISPATCH's receiver). */
int mb_quant(mb_backend *be, const mb_layer *l, int n, const uint16_t *xn, uint8_t *q, float *qs,
             ep_err *err);

/* The whole layer in one process (l must own every expert the tokens select): out bf16 [T, H],
 * topk_ids, topk_w as mb_step_begin. The CUDA backend keeps everything on the device. */
int mb_forward(mb_backend *be, const mb_layer *l, int T, const uint16_t *x, const int64_t *ids,
               uint16_t *out, int32_t *topk_ids, float *topk_w, ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
