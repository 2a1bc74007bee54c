/*
 * fwd_io.c — reading and checking the input of `epmoectl forward`, writing its output
 * (fwd_io.h).
 */
#include "ctl/fwd_io.h"

#include <epmoe.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checkpoint.h"
#include "common/limits.h"
#include "common/safetensors_writer.h"
#include "ctl/cmds.h"
#include "kernels/formats.h"

static void shape_text(const st_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static int read_hidden(const char *path, const st_file *f, int H, fwdio_input *in, ep_err *err)
{
    const st_tensor *t = st_find(f, "hidden_states");
    char shape[128];
    if (!t)
        return ep_err_set(err,
                          "%s: tensor \"hidden_states\" is missing (expected BF16 or F32 "
                          "[T, %d])",
                          path, H);
    if (t->dtype != ST_BF16 && t->dtype != ST_F32)
        return ep_err_set(err, "%s: tensor \"hidden_states\": dtype %s, expected BF16 or F32", path,
                          st_dtype_name(t->dtype));
    shape_text(t, shape, sizeof shape);
    if (t->ndim != 2)
        return ep_err_set(err, "%s: tensor \"hidden_states\": shape %s, expected [T, %d]", path,
                          shape, H);
    if (t->shape[1] != H)
        return ep_err_set(err,
                          "%s: tensor \"hidden_states\": shape %s, expected [T, %d]: the model's "
                          "hidden_size is %d, the input has %" PRId64 " channels",
                          path, shape, H, H, t->shape[1]);
    if (t->shape[0] < 1 || t->shape[0] > EP_MAX_TOKENS)
        return ep_err_set(err,
                          "%s: tensor \"hidden_states\": shape %s: expected 1 to %d tokens (rows)",
                          path, shape, EP_MAX_TOKENS);
    in->T = (int)t->shape[0];
    in->H = H;
    size_t n = (size_t)in->T * (size_t)H;
    in->x = malloc(n * sizeof(uint16_t));
    if (!in->x)
        return ep_err_set(err, "%s: out of memory for %d x %d hidden states", path, in->T, H);
    if (t->dtype == ST_BF16) {
        memcpy(in->x, t->data, n * sizeof(uint16_t));
    } else {
        const unsigned char *p = t->data;
        for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, p + i * sizeof v, sizeof v); /* the mapping may be unaligned */
            in->x[i] = fmt_f32_to_bf16(v);
        }
    }
    /* the same policy the cluster applies (ERR_BAD_REQUEST there): docs/numerics.md */
    if (ck_check_input(in->x, in->T, H, 0, err) != 0)
        return ep_err_prefix(err, "%s: tensor \"hidden_states\"", path);
    return 0;
}

static int read_ids(const char *path, const st_file *f, const mc_config *c, int layer,
                    fwdio_input *in, ep_err *err)
{
    const st_tensor *t = st_find(f, "input_ids");
    char shape[128];
    if (!t) {
        if (!mc_layer_is_hash(c, layer))
            return 0;
        char pfx[EP_MAX_NAME];
        int n = ck_layer_prefix(c, layer, pfx, sizeof pfx);
        return ep_err_set(err,
                          "%s: tensor \"input_ids\" is missing: layer %.*s routes by token id "
                          "(tid2eid), so it needs I32 or I64 [%d]",
                          path, n > 0 ? n - 1 : 0, pfx, in->T);
    }
    if (t->dtype != ST_I32 && t->dtype != ST_I64)
        return ep_err_set(err, "%s: tensor \"input_ids\": dtype %s, expected I32 or I64", path,
                          st_dtype_name(t->dtype));
    shape_text(t, shape, sizeof shape);
    if (t->ndim != 1 || t->shape[0] != in->T)
        return ep_err_set(err,
                          "%s: tensor \"input_ids\": shape %s, expected [%d] (one id per row of "
                          "hidden_states)",
                          path, shape, in->T);
    in->ids = malloc((size_t)in->T * sizeof(int64_t));
    if (!in->ids)
        return ep_err_set(err, "%s: out of memory for %d token ids", path, in->T);
    const unsigned char *p = t->data;
    for (int i = 0; i < in->T; i++) {
        int64_t v;
        if (t->dtype == ST_I64) {
            memcpy(&v, p + (size_t)i * 8, 8);
        } else {
            int32_t v32;
            memcpy(&v32, p + (size_t)i * 4, 4);
            v = v32;
        }
        if (v < 0 || (c->vocab_size > 0 && v >= c->vocab_size))
            return ep_err_set(err,
                              "%s: tensor \"input_ids\": element %d is %" PRId64
                              ", outside the vocabulary [0, %d)",
                              path, i, v, c->vocab_size);
        in->ids[i] = v;
    }
    return 0;
}

int fwdio_read(const char *path, const mc_config *c, int layer, fwdio_input *in, ep_err *err)
{
    memset(in, 0, sizeof *in);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ep_err_errno(err, "input %s", path);
        return errno == ENOENT || errno == ENOTDIR ? CMD_NOINPUT : CMD_DATAERR;
    }
    st_file *f = st_open(path, err);
    if (!f)
        return CMD_DATAERR;
    int rc = CMD_OK;
    if (read_hidden(path, f, c->hidden_size, in, err) < 0 ||
        read_ids(path, f, c, layer, in, err) < 0) {
        fwdio_input_free(in);
        rc = CMD_DATAERR;
    }
    st_close(&f);
    return rc;
}

void fwdio_input_free(fwdio_input *in)
{
    free(in->x);
    free(in->ids);
    in->x = NULL;
    in->ids = NULL;
}

int fwdio_write(const char *path, int T, int H, int k, const uint16_t *out, const int32_t *topk_ids,
                const float *topk_w, ep_err *err)
{
    st_writer *w = st_writer_create();
    if (!w) {
        ep_err_set(err, "%s: out of memory", path);
        return CMD_SOFTWARE;
    }
    int64_t s_out[2] = {T, H}, s_k[2] = {T, k};
    int rc = CMD_OK;
    if (st_writer_add(w, "out", ST_BF16, 2, s_out, out, err) < 0 ||
        st_writer_add(w, "topk_ids", ST_I32, 2, s_k, topk_ids, err) < 0 ||
        st_writer_add(w, "topk_weights", ST_F32, 2, s_k, topk_w, err) < 0)
        rc = CMD_SOFTWARE;
    else if (st_writer_write(w, path, err) < 0)
        rc = CMD_CANTCREAT;
    st_writer_destroy(&w);
    return rc;
}

mc_config fwdio_config_of(const epmoe_info *i)
{
    mc_config c = {0};
    c.hidden_size = (int)i->hidden_size;
    c.num_hidden_layers = (int)i->n_main_layers;
    c.num_hash_layers = (int)i->n_hash_layers;
    c.num_nextn_predict_layers = (int)(i->n_layers - i->n_main_layers);
    c.num_experts_per_tok = (int)i->topk;
    c.n_routed_experts = (int)i->n_experts;
    c.vocab_size = (int)i->vocab_size;
    return c;
}
