/*
 * moe_backend.c — the front of the backend seam (moe_backend.h): device parsing, the choice of
 * backend, and dispatch to the chosen one's table. Argument checks shared by every backend
 * live here, so each backend sees only well-formed calls.
 */
#include "kernels/moe_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "kernels/backend_internal.h"

int mb_parse_device(const char *text, mb_device_kind *kind, int *ordinal, ep_err *err)
{
    if (text && strcmp(text, "cpu") == 0) {
        *kind = MB_DEV_CPU;
        *ordinal = 0;
        return 0;
    }
    if (text && strncmp(text, "cuda:", 5) == 0) {
        const char *p = text + 5;
        char *end;
        long n = strtol(p, &end, 10);
        if (p[0] >= '0' && p[0] <= '9' && *end == '\0' && n >= 0 && n <= 255) {
            *kind = MB_DEV_CUDA;
            *ordinal = (int)n;
            return 0;
        }
    }
    return ep_err_set(err, "device \"%s\": expected \"cpu\" or \"cuda:N\" with N in 0..255",
                      text ? text : "");
}

mb_backend *mb_create(const mb_options *o, ep_err *err)
{
    mb_device_kind kind;
    int ordinal;
    if (mb_parse_device(o->device ? o->device : "cpu", &kind, &ordinal, err) < 0)
        return NULL;
    return kind == MB_DEV_CPU ? mb_cpu_create(o, err) : mb_cuda_create(o, ordinal, err);
}

void mb_destroy(mb_backend **self_p)
{
    if (self_p && *self_p) {
        (*self_p)->vt->destroy(*self_p);
        *self_p = NULL;
    }
}

const char *mb_name(const mb_backend *be)
{
    return be->name;
}

int mb_set_gemm(mb_backend *be, mb_gemm_mode mode, ep_err *err)
{
    if (mode != MB_GEMM_EXACT && mode != MB_GEMM_FAST)
        return ep_err_set(err, "GEMM mode %d: expected exact or fast", (int)mode);
    return be->vt->set_gemm ? be->vt->set_gemm(be, mode, err) : 0;
}

int mb_device(const mb_backend *be, mb_device_info *info)
{
    memset(info, 0, sizeof *info);
    info->kind = be->kind;
    return be->vt->device(be, info);
}

uint64_t mb_layer_footprint(const mb_backend *be, const mc_config *c, int n_experts)
{
    return be->vt->layer_footprint(be, c, n_experts);
}

uint64_t mb_step_footprint(const mb_backend *be, const mc_config *c, int max_tokens)
{
    return be->vt->step_footprint(be, c, max_tokens);
}

int mb_reserve(mb_backend *be, const mc_config *c, uint64_t weight_bytes, int max_tokens,
               ep_err *err)
{
    if (max_tokens < 0 || max_tokens > EP_MAX_TOKENS)
        return ep_err_set(err, "mb_reserve: %d tokens, expected 0..%d", max_tokens, EP_MAX_TOKENS);
    return be->vt->reserve(be, c, weight_bytes, max_tokens, err);
}

mb_layer *mb_layer_load(mb_backend *be, const mc_config *c, const mb_layer_src *src,
                        const uint8_t *want, mb_layer *reuse, mb_progress_fn progress,
                        void *progress_ctx, ep_err *err)
{
    if (reuse && reuse->be != be) {
        ep_err_set(err, "%s: the layer to reuse belongs to another backend", src->name);
        return NULL;
    }
    if (reuse && reuse->index != src->layer) {
        ep_err_set(err, "%s: the layer to reuse is layer %d", src->name, reuse->index);
        return NULL;
    }
    return be->vt->layer_load(be, c, src, want, reuse, progress, progress_ctx, err);
}

void mb_layer_free(mb_layer **self_p)
{
    if (self_p && *self_p) {
        (*self_p)->be->vt->layer_free(*self_p);
        *self_p = NULL;
    }
}

int mb_layer_index(const mb_layer *l)
{
    return l->index;
}

bool mb_layer_owns(const mb_layer *l, int expert)
{
    return l->be->vt->layer_owns(l, expert);
}

uint64_t mb_layer_bytes(const mb_layer *l)
{
    return l->be->vt->layer_bytes(l);
}

static int check_tokens(const char *what, int T, ep_err *err)
{
    if (T < 0 || T > EP_MAX_TOKENS)
        return ep_err_set(err, "%s: %d tokens, expected 0..%d", what, T, EP_MAX_TOKENS);
    return 0;
}

mb_step *mb_step_begin(mb_backend *be, const mb_layer *l, int T, const uint16_t *x,
                       const int64_t *ids, int32_t *topk_ids, float *topk_w, uint8_t *q, float *qs,
                       uint16_t *xn, ep_err *err)
{
    if (check_tokens("mb_step_begin", T, err) < 0)
        return NULL;
    return be->vt->step_begin(be, l, T, x, ids, topk_ids, topk_w, q, qs, xn, err);
}

int mb_step_shared(mb_step *s, ep_err *err)
{
    return s->be->vt->step_shared(s, err);
}

int mb_steps_shared(mb_step *const *steps, int n, ep_err *err)
{
    if (n <= 0)
        return 0;
    const mb_vtable *vt = steps[0]->be->vt;
    if (vt->steps_shared != NULL && n > 1)
        return vt->steps_shared(steps, n, err);
    for (int i = 0; i < n; i++)
        if (steps[i]->be->vt->step_shared(steps[i], err) != 0)
            return -1;
    return 0;
}

int mb_step_finish(mb_step *s, const uint16_t *eo, uint16_t *out, ep_err *err)
{
    return s->be->vt->step_finish(s, eo, out, err);
}

void mb_step_free(mb_step **self_p)
{
    if (self_p && *self_p) {
        (*self_p)->be->vt->step_free(*self_p);
        *self_p = NULL;
    }
}

int mb_experts(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *q, const float *qs,
               int n_pairs, const uint32_t *pair_row, const uint32_t *pair_expert,
               const float *pair_w, uint16_t *out, ep_err *err)
{
    if (n_rows < 0 || n_rows > EP_MAX_TOKENS || n_pairs < 0 ||
        n_pairs > EP_MAX_TOKENS * MC_MAX_TOPK)
        return ep_err_set(err, "mb_experts: %d rows, %d pairs", n_rows, n_pairs);
    for (int p = 0; p < n_pairs; p++) {
        if (pair_row[p] >= (uint32_t)n_rows)
            return ep_err_set(err, "layer %d: pair %d: row %u outside [0, %d)", l->index, p,
                              pair_row[p], n_rows);
        if (!l->be->vt->layer_owns(l, (int)pair_expert[p]))
            return ep_err_set(err, "layer %d: pair %d: expert %u is not loaded here", l->index, p,
                              pair_expert[p]);
    }
    if (n_pairs == 0)
        return 0;
    return be->vt->experts(be, l, n_rows, q, qs, n_pairs, pair_row, pair_expert, pair_w, out, err);
}

int mb_quant(mb_backend *be, const mb_layer *l, int n, const uint16_t *xn, uint8_t *q, float *qs,
             ep_err *err)
{
    if (check_tokens("mb_quant", n, err) < 0)
        return -1;
    return n ? be->vt->quant(be, l, n, xn, q, qs, err) : 0;
}

int mb_forward(mb_backend *be, const mb_layer *l, int T, const uint16_t *x, const int64_t *ids,
               uint16_t *out, int32_t *topk_ids, float *topk_w, ep_err *err)
{
    if (check_tokens("mb_forward", T, err) < 0)
        return -1;
    return T ? be->vt->forward(be, l, T, x, ids, out, topk_ids, topk_w, err) : 0;
}

bool mb_build_supports(mb_device_kind kind)
{
#ifdef EPMOE_CUDA_BUILD
    return kind == MB_DEV_CPU || kind == MB_DEV_CUDA;
#else
    return kind == MB_DEV_CPU;
#endif
}
