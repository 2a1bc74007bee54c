/*
 * backend.c — the front of the backend seam (moe_backend.h): device parsing and dispatch to
 * the chosen backend's table (backend.h). Argument checks shared by every backend live here,
 * so each backend sees only well-formed calls. Which backend a device string makes is
 * kernels/backend_create.c's, above the backends, so this front stays below them.
 */
#include "kernels/moe_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "kernels/backend.h"
#include "kernels/formats.h"

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

static void mb_add_cap(mb_device_info *info, const char *cap)
{
    if (info->n_caps < MB_MAX_CAPS)
        snprintf(info->caps[info->n_caps++], sizeof info->caps[0], "%s", cap);
}

/* Every backend runs its host work on this CPU, so every device lists the CPU's instruction
 * sets first. */
static void mb_fill_caps(mb_device_info *info)
{
    info->n_caps = 0;
    mb_add_cap(info, "cpu");
    for (int i = ISA_AVX2; i < ISA_COUNT; i++)
        if (isa_supported((isa_level)i))
            mb_add_cap(info, isa_name((isa_level)i));
    if (info->kind == MB_DEV_CUDA) {
        char sm[16];
        snprintf(sm, sizeof sm, "sm_%d%d", info->sm_major, info->sm_minor);
        mb_add_cap(info, "cuda");
        mb_add_cap(info, sm);
    }
}

int mb_device(const mb_backend *be, mb_device_info *info)
{
    memset(info, 0, sizeof *info);
    info->kind = be->kind;
    int rc = be->vt->device(be, info);
    mb_fill_caps(info);
    return rc;
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
    mb_layer *l = be->vt->layer_load(be, c, src, want, reuse, progress, progress_ctx, err);
    if (l)
        l->hidden = c->hidden_size;
    return l;
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

/* ---- the scales as a DISPATCH carries them ----------------------------------------------------
 */

void mb_widen_scales(size_t n, const uint8_t *e8m0, float *f32)
{
    for (size_t i = 0; i < n; i++)
        f32[i] = fmt_e8m0_to_f32(e8m0[i]);
}

int mb_narrow_scales(size_t n, const float *f32, uint8_t *e8m0, size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        e8m0[i] = fmt_e8m0_ceil(f32[i]);
        if (fmt_e8m0_to_f32(e8m0[i]) != f32[i]) {
            *bad = i;
            return -1;
        }
    }
    return 0;
}

int mb_experts_scaled(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *q,
                      const void *qs, bool qs_e8m0, int n_pairs, const uint32_t *pair_row,
                      const uint32_t *pair_expert, const float *pair_w, uint16_t *out, ep_err *err)
{
    if (!qs_e8m0)
        return mb_experts(be, l, n_rows, q, qs, n_pairs, pair_row, pair_expert, pair_w, out, err);
    if (n_rows < 0 || n_rows > EP_MAX_TOKENS)
        return ep_err_set(err, "mb_experts: %d rows, %d pairs", n_rows, n_pairs);
    /* every backend takes f32 scales on the host: widen here, once, for all of them */
    size_t n = (size_t)n_rows * (size_t)(l->hidden / EP_FP8_BLOCK);
    float *wide = malloc(n * sizeof *wide + 1);
    if (wide == NULL)
        return ep_err_set(err, "layer %d: out of memory for %d rows' scales", l->index, n_rows);
    mb_widen_scales(n, qs, wide);
    int rc = mb_experts(be, l, n_rows, q, wide, n_pairs, pair_row, pair_expert, pair_w, out, err);
    free(wide);
    return rc;
}

/* ---- device operations --------------------------------------------------------------------- */

bool mb_has_dev(const mb_backend *be)
{
    return be->vt->dev_step_begin != NULL;
}

static int mb_no_dev(const mb_backend *be, const char *fn, ep_err *err)
{
    return ep_err_set(err, "%s: the %s backend has no device operations", fn, be->name);
}

void *mb_dev_stream(mb_backend *be)
{
    return be->vt->dev_stream ? be->vt->dev_stream(be) : NULL;
}

int mb_dev_poll(mb_backend *be, ep_err *err)
{
    return be->vt->dev_poll ? be->vt->dev_poll(be, err) : mb_no_dev(be, "mb_dev_poll", err);
}

int mb_dev_wait(mb_backend *be, int64_t deadline, ep_err *err)
{
    return be->vt->dev_wait ? be->vt->dev_wait(be, deadline, err)
                            : mb_no_dev(be, "mb_dev_wait", err);
}

int mb_dev_alloc(mb_backend *be, void **d_p, size_t bytes, ep_err *err)
{
    if (be->vt->dev_alloc == NULL)
        return mb_no_dev(be, "mb_dev_alloc", err);
    return be->vt->dev_alloc(be, d_p, bytes ? bytes : 1, err);
}

void mb_dev_free(mb_backend *be, void *d_p)
{
    if (be->vt->dev_free && d_p)
        be->vt->dev_free(be, d_p);
}

int mb_dev_alloc_host(mb_backend *be, void **h_p, size_t bytes, ep_err *err)
{
    if (be->vt->dev_alloc_host == NULL)
        return mb_no_dev(be, "mb_dev_alloc_host", err);
    return be->vt->dev_alloc_host(be, h_p, bytes ? bytes : 1, err);
}

void mb_dev_free_host(mb_backend *be, void *h_p)
{
    if (be->vt->dev_free_host && h_p)
        be->vt->dev_free_host(be, h_p);
}

int mb_dev_h2d(mb_backend *be, void *d_dst, const void *h_src, size_t bytes, ep_err *err)
{
    if (be->vt->dev_h2d == NULL)
        return mb_no_dev(be, "mb_dev_h2d", err);
    return bytes ? be->vt->dev_h2d(be, d_dst, h_src, bytes, err) : 0;
}

int mb_dev_d2h(mb_backend *be, void *h_dst, const void *d_src, size_t bytes, ep_err *err)
{
    if (be->vt->dev_d2h == NULL)
        return mb_no_dev(be, "mb_dev_d2h", err);
    return bytes ? be->vt->dev_d2h(be, h_dst, d_src, bytes, err) : 0;
}

mb_step *mb_dev_step_begin(mb_backend *be, const mb_layer *l, int T, const uint16_t *h_x,
                           const int64_t *h_ids, int32_t *h_topk_ids, float *h_topk_w,
                           int64_t deadline, ep_err *err)
{
    if (be->vt->dev_step_begin == NULL) {
        mb_no_dev(be, "mb_dev_step_begin", err);
        return NULL;
    }
    if (check_tokens("mb_dev_step_begin", T, err) < 0)
        return NULL;
    return be->vt->dev_step_begin(be, l, T, h_x, h_ids, h_topk_ids, h_topk_w, deadline, err);
}

const uint8_t *mb_dev_step_q(const mb_step *s)
{
    return s->be->vt->dev_step_q ? s->be->vt->dev_step_q(s) : NULL;
}

const float *mb_dev_step_qs(const mb_step *s)
{
    return s->be->vt->dev_step_qs ? s->be->vt->dev_step_qs(s) : NULL;
}

int mb_dev_gather(mb_backend *be, int H, int n, const uint32_t *d_rows, const uint8_t *d_q,
                  const float *d_qs, bool e8m0, uint8_t *d_codes, void *d_scales, ep_err *err)
{
    if (be->vt->dev_gather == NULL)
        return mb_no_dev(be, "mb_dev_gather", err);
    return n ? be->vt->dev_gather(be, H, n, d_rows, d_q, d_qs, e8m0, d_codes, d_scales, err) : 0;
}

int mb_dev_scales_to_f32(mb_backend *be, size_t n, const uint8_t *d_e8m0, float *d_f32, ep_err *err)
{
    if (be->vt->dev_scales_to_f32 == NULL)
        return mb_no_dev(be, "mb_dev_scales_to_f32", err);
    return n ? be->vt->dev_scales_to_f32(be, n, d_e8m0, d_f32, err) : 0;
}

int mb_dev_experts(mb_backend *be, const mb_layer *l, int n_rows, const uint8_t *d_q,
                   const float *d_qs, int n_pairs, const uint32_t *h_pair_row,
                   const uint32_t *h_pair_expert, const float *h_pair_w, uint16_t *d_out,
                   ep_err *err)
{
    if (be->vt->dev_experts == NULL)
        return mb_no_dev(be, "mb_dev_experts", err);
    if (n_pairs == 0)
        return 0;
    if (n_rows < 0 || n_rows > EP_MAX_TOKENS || n_pairs < 0 ||
        n_pairs > EP_MAX_TOKENS * MC_MAX_TOPK)
        return ep_err_set(err, "mb_dev_experts: %d rows, %d pairs", n_rows, n_pairs);
    return be->vt->dev_experts(be, l, n_rows, d_q, d_qs, n_pairs, h_pair_row, h_pair_expert,
                               h_pair_w, d_out, err);
}

int mb_dev_scatter(mb_backend *be, int H, int n, const uint32_t *d_slots, const uint16_t *d_rows,
                   uint16_t *d_eo, ep_err *err)
{
    if (be->vt->dev_scatter == NULL)
        return mb_no_dev(be, "mb_dev_scatter", err);
    return n ? be->vt->dev_scatter(be, H, n, d_slots, d_rows, d_eo, err) : 0;
}

uint16_t *mb_dev_step_eo(mb_step *s, ep_err *err)
{
    if (s->be->vt->dev_step_eo == NULL) {
        mb_no_dev(s->be, "mb_dev_step_eo", err);
        return NULL;
    }
    return s->be->vt->dev_step_eo(s, err);
}

int mb_dev_step_finish(mb_step *s, uint16_t *h_out, int64_t deadline, ep_err *err)
{
    if (s->be->vt->dev_step_finish == NULL)
        return mb_no_dev(s->be, "mb_dev_step_finish", err);
    return s->be->vt->dev_step_finish(s, h_out, deadline, err);
}
