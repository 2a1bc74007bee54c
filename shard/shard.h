/*
 * shard.h — the shard loader: from a safetensors checkpoint to layers on a backend, for a worker
 * and for epmoectl forward --local alike (prefix shard_).
 *
 * This is where checkpoint reading lives (the kernels never open a file): for one MoE layer and
 * the experts a worker wants, it checks the tensors against the expert-dtype contract
 * (ck_check_layer_shapes: names, dtypes, shapes), reads their bytes into private memory with
 * st_tensor_read and checks their values there (ck_check_value_bytes: the one value policy of
 * docs/numerics.md), then describes those copies to the backend (mb_layer_src). Reading rather
 * than pointing into the mapping means a checkpoint truncated while it is loaded fails the load
 * with a message naming the file, never kills the worker with SIGBUS; the copies live until the
 * backend has taken the layer (one layer's wanted bytes at a time). For a whole shard it also
 * sizes the backend memory first (mb_reserve: the device-memory check of a GPU worker) and
 * reports progress in checkpoint bytes read.
 *
 * Placement is given per layer (want[layer * E + e] != 0: layer `layer` holds expert e), so a
 * layer-by-layer placement needs nothing new here.
 */
#ifndef EPMOE_SHARD_H
#define EPMOE_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "kernels/moe.h"
#include "kernels/moe_backend.h"

/* Where a load puts the tensors' bytes it reads (stage.c): large chunks in transparent huge
 * pages that one view after another reuses, so the layers of a load after the first read into
 * memory already faulted in instead of fresh pages the kernel must zero. One view at a time:
 * shard_view_layer resets the stage, so the previous view must be done (the backend has taken
 * its layer) first. Not thread-safe. */
typedef struct shard_stage shard_stage;
shard_stage *shard_stage_create(void);
void shard_stage_free(shard_stage **self_p);
void shard_stage_reset(shard_stage *s);            /* every chunk free again (kept) */
void *shard_stage_alloc(shard_stage *s, size_t n); /* 64-byte aligned; NULL when out of memory */
size_t shard_stage_bytes(const shard_stage *s);    /* the chunks' size together */

/* One layer's tensors as the backend takes them: private copies, freed by shard_view_free. */
typedef struct shard_view {
    mb_layer_src src;
    mb_linear *experts; /* [E * 3], .w NULL for experts not wanted */
    char name[32];
    /* the tensors' bytes, read from the files: in the caller's stage (kept across views), or
     * with stage NULL in one of the view's own that shard_view_free releases */
    shard_stage *stage;
    shard_stage *own;
    /* told the bytes read so far after each tensor (shard_load_layer sets them) */
    mb_progress_fn progress;
    void *progress_ctx;
    uint64_t done;
    bool skip_shared; /* leave the shared expert unread (a reused layer provides it) */
} shard_view;

/* Check, read and describe layer `layer` for the experts in want ([E]; NULL: all). Errors name
 * the tensor and what was expected (missing tensor, dtype, shape, a value the policy refuses,
 * a file that no longer holds the bytes). v's progress fields, skip_shared and stage are kept
 * (zero them, or set them). */
int shard_view_layer(const st_model *m, const mc_config *c, int layer, const uint8_t *want,
                     shard_view *v, ep_err *err);
void shard_view_free(shard_view *v);

/* Checkpoint bytes a load of this layer reads: router, shared expert (unless skip_shared) and
 * the experts in want ([E]; NULL: all) that `have` ([E] or NULL) does not already hold. */
uint64_t shard_layer_bytes(const st_model *m, const mc_config *c, int layer, const uint8_t *want,
                           const uint8_t *have, bool skip_shared);

/* Load one layer onto a backend (reuse: an older layer of the same index whose experts are
 * kept; may be NULL). progress gets bytes read within this layer, after each tensor read (the
 * reading is where a load's time goes; the backend's conversion of the bytes in memory then
 * reports nothing). */
mb_layer *shard_load_layer(mb_backend *be, const st_model *m, const mc_config *c, int layer,
                           const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                           void *progress_ctx, ep_err *err);

/* The CPU reference layer straight from a checkpoint (tools and tests). */
moe_layer *shard_load_moe_layer(const st_model *m, const mc_config *c, int layer,
                                const uint8_t *want, isa_level impl, ep_err *err);

/* Progress of a whole shard: checkpoint bytes read so far and in total, layers done. Return
 * non-zero to stop the load at the next layer (a RESET or TERM arrived): shard_load then
 * returns 1. */
typedef int (*shard_progress_fn)(void *ctx, uint64_t done, uint64_t total, int layers_done,
                                 int layers_total);

/* Load every MoE layer (mc_num_layers) of a worker's shard: want is [n_layers * E] (layer L
 * holds expert e when want[L * E + e]); old is the previous shard's layers ([n_layers] or NULL)
 * whose experts are reused; out receives [n_layers] layers. First the backend memory of the new
 * layers plus the step buffers of max_tokens tokens is reserved (a GPU worker fails here, before
 * reading anything, when they do not fit). Returns 0, 1 when stopped by progress (out freed),
 * -1 on error (out freed, err set). */
int shard_load(mb_backend *be, const st_model *m, const mc_config *c, const uint8_t *want,
               mb_layer *const *old, int max_tokens, mb_layer **out, shard_progress_fn progress,
               void *progress_ctx, ep_err *err);

#endif
