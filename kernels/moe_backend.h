/*
 * moe_backend.h — the one seam between a worker's executor and the math of a MoE layer
 * (prefix mb_).
 *
 * A backend is a device context: `cpu` (kernels/cpu/: the exact reference + AVX2 paths and a
 * GEMM thread pool) or `cuda:N` (kernels/cuda/: one device, one stream, one device arena for the
 * shard's weights, pinned staging buffers). A worker creates one backend for its device and
 * never asks which it got: every operation below takes and returns host memory, so the
 * executor and the ZeroMQ data plane are the same for every device. A data plane that moves
 * device memory itself (the NCCL plane, worker/step_nccl.c) uses the optional device operations
 * at the end of this header: the CUDA backend runs them on its device, the CPU backend on host
 * memory (so the same step runs, and is tested, on the CPU); a backend without them refuses
 * each call with a message (ggml-backend's optional operations, NULL = unsupported).
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

/* Capabilities one device reports at most (mb_device_info.caps). */
#define MB_MAX_CAPS (ISA_COUNT + 4)

typedef enum mb_device_kind { MB_DEV_CPU = 0, MB_DEV_CUDA = 1 } mb_device_kind;
/* Expert GEMM path of the CUDA backend (the spec's expert_parallel.gpu_gemm). */
typedef enum mb_gemm_mode { MB_GEMM_EXACT = 0, MB_GEMM_FAST = 1 } mb_gemm_mode;

typedef struct mb_backend mb_backend;
typedef struct mb_layer mb_layer;
typedef struct mb_step mb_step;

/* When the CUDA backend's fast FP8 GEMMs go through cuBLASLt (EPMOE_CUDA_CUBLASLT). */
typedef enum mb_cublaslt {
    MB_LT_AUTO = 0, /* where the groups average cublaslt_rows rows or more (unset) */
    MB_LT_NEVER,    /* "0" */
    MB_LT_ALWAYS,   /* "1": wherever it fits */
    MB_LT_REQUIRE,  /* "require" (tests): a shape it cannot take fails instead of falling back */
} mb_cublaslt;

/* The CUDA backend's tuning: the EPMOE_CUDA_* knobs (docs/operations.md), read by a program's
 * main (common/knobs.h) and passed down here; nothing under kernels/ reads the environment. A zero
 * field is the default, so a zeroed struct is the backend every caller had before. */
typedef struct mb_cuda_tuning {
    double wait_s;        /* longest wait for queued device work; 0: 120 s; 0.01..3600 */
    size_t stage_bytes;   /* each of the two pinned load-staging buffers; 0: 32 MiB; 4 KiB..1 GiB */
    mb_cublaslt cublaslt; /* fast FP8 GEMMs through cuBLASLt */
    int cublaslt_rows;    /* MB_LT_AUTO's threshold, rows per expert; 0: 96; < 0: none */
    int fast_rows;        /* fast GEMMs of at most this many rows per expert take the few-row
                           * kernels; 0: 16; < 0: never */
    bool exact_ref;       /* exact GEMMs by their plain reference kernels (EPMOE_CUDA_EXACT=ref) */
    int split;            /* most ways the row kernels split a row; 0: 4; < 0: 1 (no split) */
    const char *module;   /* the CUDA module's file; NULL or "": libepmoe_cuda.so, found by the
                           * loader's search (the first CUDA backend's choice holds for the
                           * process: the module is loaded once) */
} mb_cuda_tuning;

typedef struct mb_options {
    const char *device;  /* "cpu" or "cuda:N" */
    int threads;         /* host threads (GEMM pool; host work of CUDA); <= 0: one per CPU */
    isa_level impl;      /* CPU kernels; ISA_AUTO: the best this CPU has */
    mb_gemm_mode gemm;   /* CUDA expert GEMMs */
    mb_cuda_tuning cuda; /* zero: the defaults */
} mb_options;

/* The EPMOE_CUDA_* values a main read with knob_load (common/knobs.h; a program that reads
 * the kernel knobs, so every field holds its row's value or default) as the backend's tuning,
 * with the meaning they had when the kernels read the environment: a row count of 0 is "none"
 * (cublaslt_rows, fast_rows < 0), cuBLASLt's "0" / "1" / "require" / unset. */
struct knob_values;
void mb_cuda_tuning_from_knobs(mb_cuda_tuning *t, const struct knob_values *kv);

/* What REGISTER reports and `epmoectl workers` shows. */
typedef struct mb_device_info {
    mb_device_kind kind;
    int ordinal;        /* N of cuda:N; 0 for cpu */
    char name[128];     /* "NVIDIA H200" or the CPU kernels' name */
    uint64_t mem_total; /* device memory (CUDA), bytes; 0 for cpu */
    uint64_t mem_free;  /* at the time of the call */
    int sm_major, sm_minor;
    /* What the device can run, as REGISTER's capabilities list them: "cpu" and every
     * instruction set this CPU can run the kernels with (the chosen one is in mb_name, e.g.
     * cpu-avx512; EPMOE_ISA may have capped it below the best), then "cuda" and "sm_XY" on a
     * CUDA device. */
    int n_caps;
    char caps[MB_MAX_CAPS][16];
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
/* As mb_experts with the scales as a DISPATCH carries them: qs e8m0 codes [n_rows, H/128] when
 * qs_e8m0 (act_ue8m0: each scale a power of two), else f32 (then exactly mb_experts). The
 * backend widens the codes itself (fmt_e8m0_to_f32), so its callers do no format math. */
int mb_experts_scaled(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *q,
                      const void *qs, bool qs_e8m0, int n_pairs, const uint32_t *pair_row,
                      const uint32_t *pair_expert, const float *pair_w, uint16_t *out, ep_err *err);

/* Quantize bf16 rows [n, H] to the dispatch format (a bf16 DISPATCH's receiver). */
int mb_quant(mb_backend *be, const mb_layer *l, int n, const uint16_t *xn, uint8_t *q, float *qs,
             ep_err *err);

/* The whole layer in one process (l must own every expert the tokens select): out bf16 [T, H],
 * topk_ids, topk_w as mb_step_begin. The CUDA backend keeps everything on the device. */
int mb_forward(mb_backend *be, const mb_layer *l, int T, const uint16_t *x, const int64_t *ids,
               uint16_t *out, int32_t *topk_ids, float *topk_w, ep_err *err);

/* e8m0 scale codes [n] -> f32 [n] (fmt_e8m0_to_f32): what mb_experts_scaled does first, for a
 * caller that merges the rows of several DISPATCHes into one mb_experts call. */
void mb_widen_scales(size_t n, const uint8_t *e8m0, float *f32);
/* The other way, for a DISPATCH that carries e8m0 scales: f32 [n] -> e8m0 codes [n]
 * (fmt_e8m0_ceil). 0, or -1 with *bad the index of the first scale that is not a power of two
 * (act_ue8m0 makes every one a power of two; the codes before it are written). */
int mb_narrow_scales(size_t n, const float *f32, uint8_t *e8m0, size_t *bad);

/* ---- device operations (optional) ------------------------------------------------------ */

/* For data planes that move device memory themselves (the NCCL plane). Everything is enqueued
 * on the backend's one stream (mb_dev_stream) in call order and returns without waiting,
 * except where a function says it waits; nothing waits without a deadline (clk_mono_ms of
 * common/clock.h). Pointers named d_* are device memory (host memory on the CPU backend), h_* host
 * memory (pinned where the backend has such a thing). The bits are those of the host API above
 * (same kernels, same order); only where the data lives differs. A backend without device
 * operations (mb_has_dev false) fails every call below with a message naming itself. */
bool mb_has_dev(const mb_backend *be);

/* The backend's stream (a cudaStream_t as void *; on the CPU, whose operations are done when
 * they return, an opaque handle of its own), for a communicator's sends and receives on the
 * same stream. */
void *mb_dev_stream(mb_backend *be);
/* 0 when everything enqueued so far has finished, 1 while work is pending, -1 (err set) when
 * the device reported an error. Never blocks. */
int mb_dev_poll(mb_backend *be, ep_err *err);
/* Poll until the stream drains or deadline passes: 0, or -1 with err "... timed out" / the
 * device error. */
int mb_dev_wait(mb_backend *be, int64_t deadline, ep_err *err);

/* Device and pinned host buffers for a data plane's own use; free with the matching function.
 * Sizes of 0 give a valid 1-byte allocation. */
int mb_dev_alloc(mb_backend *be, void **d_p, size_t bytes, ep_err *err);
void mb_dev_free(mb_backend *be, void *d_p);
int mb_dev_alloc_host(mb_backend *be, void **h_p, size_t bytes, ep_err *err);
void mb_dev_free_host(mb_backend *be, void *h_p);
/* Asynchronous copies on the stream (host memory should be pinned for real asynchrony). */
int mb_dev_h2d(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err);
int mb_dev_d2h(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err);

/* Begin a step with device-resident results: as mb_step_begin, but q/qs stay on the device
 * (mb_dev_step_q / mb_dev_step_qs, valid until mb_step_free); topk_ids and topk_w come back to
 * the host (this function waits for them, until deadline: the dispatch plan needs them), and
 * h_topk_ids must stay valid until mb_step_free. Free the step with mb_step_free. */
mb_step *mb_dev_step_begin(mb_backend *be, const mb_layer *l, int T, const uint16_t *h_x,
                           const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w,
                           int64_t deadline, ep_err *err);
const uint8_t *mb_dev_step_q(const mb_step *s); /* d: e4m3 [T, H] */
const float *mb_dev_step_qs(const mb_step *s);  /* d: f32 [T, H/128] */

/* Gather rows for sending: for i < n, row d_rows[i] of (d_q [., H], d_qs [., H/128]) goes to
 * row i of d_codes [n, H] and d_scales [n, H/128] — as e8m0 bytes when e8m0 (every scale must
 * be a power of two: act_ue8m0), else f32. */
int mb_dev_gather(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
                  const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err);
/* e8m0 scale bytes -> f32 (n values). */
int mb_dev_scales_to_f32(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32,
                         ep_err *err);

/* Routed experts on device rows: as mb_experts with d_q [n_rows, H], d_qs f32 [n_rows, H/128]
 * on the device and the pairs on the HOST (the caller has them there from validating what it
 * received; the grouping by expert is planned on the host); out bf16 [n_pairs, H] on the
 * device, row p for pair p. */
int mb_dev_experts(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *d_q,
                   const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                   const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out,
                   ep_err *err);

/* Scatter rows: row i of d_rows bf16 [n, H] goes to row d_slots[i] of d_eo bf16 [T*k, H]. */
int mb_dev_scatter(mb_backend *be, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                   uint16_t *d_eo, ep_err *err);

/* A zeroed bf16 [T*k, H] device buffer of the step for the expert outputs (valid until
 * mb_step_free); mb_dev_step_finish combines it. */
uint16_t *mb_dev_step_eo(mb_step *s, ep_err *err);
/* Shared expert (if mb_step_shared was not called) + combine of the step's eo on the device,
 * then out bf16 [T, H] copied to h_out; waits until deadline for the copy. */
int mb_dev_step_finish(mb_step *s, uint16_t *h_out, int64_t deadline, ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
