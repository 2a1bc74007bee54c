/*
 * fwd_io.h — the tensor files of `epmoectl forward` (prefix fwdio_), shared by the local path
 * (--local, this process runs the layer) and the cluster path (the coordinator runs it).
 *
 * Input (safetensors):
 *   hidden_states  BF16 or F32 [T, H]  the MoE block input before ffn_norm; F32 is rounded to
 *                                      BF16 (round to nearest even) on reading, as the layer's
 *                                      input is BF16 by definition (docs/numerics.md §1);
 *                                      every value must be finite (no NaN or Inf, after the
 *                                      rounding): the error names the token and channel
 *   input_ids      I32 or I64 [T]      token ids; required on hash-routed layers, optional
 *                                      elsewhere; when present every id must lie in
 *                                      [0, vocab_size)
 * Other tensors in the file are ignored. 1 <= T <= EP_MAX_TOKENS, H = the model's hidden_size.
 *
 * Output (safetensors, tensors in this order):
 *   out            BF16 [T, H]         the layer output
 *   topk_ids       I32  [T, k]         selected experts per token, in slot order
 *   topk_weights   F32  [T, k]         their routing weights
 *
 * Functions return an epmoectl exit code (ctl/cmds.h): CMD_OK, CMD_NOINPUT when the input file
 * does not exist, CMD_DATAERR for anything wrong in it, CMD_CANTCREAT when the output cannot
 * be written; err names the file, the tensor and the problem (missing, dtype, shape, value).
 */
#ifndef EPMOE_CTL_FWD_IO_H
#define EPMOE_CTL_FWD_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"

typedef struct fwdio_input {
    int T, H;
    uint16_t *x;  /* bf16 [T, H] */
    int64_t *ids; /* [T], NULL when the file has no input_ids */
} fwdio_input;

/* Read and validate path for layer `layer` of the model c (hash layers need input_ids). */
int fwdio_read(const char *path, const mc_config *c, int layer, fwdio_input *in, ep_err *err);
void fwdio_input_free(fwdio_input *in);

/* The config an input is checked against, from what a libepmoe client was told (the fields
 * fwdio_read and the layer names use; the rest zero). */
struct epmoe_info;
mc_config fwdio_config_of(const struct epmoe_info *info);

int fwdio_write(const char *path, int T, int H, int k, const uint16_t *out, const int32_t *topk_ids,
                const float *topk_w, ep_err *err);

#endif
