/*
 * checkpoint.c — checkpoint names, the per-layer tensor contract and its checker (see
 * checkpoint.h).
 *
 * The tensor table of a layer is generated one entry at a time (spec_at), so checking a layer
 * of 256 experts allocates nothing. The checker looks tensors up through a callback, which
 * lets it run over an st_model or over any in-memory table (tests).
 */
#include "common/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Table layout: ffn_norm, gate.weight, gate.bias|tid2eid, the shared expert's 3 weight+scale
 * pairs, then 3 weight+scale pairs per routed expert. */
enum { CK_FIXED = 9, CK_PER_EXPERT = 6, CK_SHARED0 = 3 };

static const char *const PROJ[3] = {"w1", "w2", "w3"};

/* ---- names ------------------------------------------------------------------------------ */

int ck_layer_prefix(const mc_config *c, int layer, char *buf, size_t cap)
{
    if (layer < 0 || layer >= mc_num_layers(c))
        return -1;
    int n = layer < c->num_hidden_layers
                ? snprintf(buf, cap, "layers.%d.", layer)
                : snprintf(buf, cap, "mtp.%d.", layer - c->num_hidden_layers);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

/* Decimal digits only, no sign; values past 10^9 saturate (every valid index is far below). */
static int parse_index(const char *s, size_t len, long *out)
{
    if (len == 0)
        return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        if (v < 1000000000L)
            v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* "1 MTP layer (mtp.0)", "43 main layers (layers.0..layers.42)"; n >= 1. */
static const char *count_text(int n, const char *what, const char *pfx, char *buf, size_t cap)
{
    if (n == 1)
        snprintf(buf, cap, "1 %s layer (%s0)", what, pfx);
    else
        snprintf(buf, cap, "%d %s layers (%s0..%s%d)", n, what, pfx, pfx, n - 1);
    return buf;
}

int ck_layer_parse(const mc_config *c, const char *text, int *layer, ep_err *err)
{
    const int L = c->num_hidden_layers, M = c->num_nextn_predict_layers;
    size_t len = strlen(text);
    const char *num = text;
    enum { BARE, MAIN, MTP } kind = BARE;
    if (strncmp(text, "layers.", 7) == 0) {
        kind = MAIN;
        num += 7;
    } else if (strncmp(text, "mtp.", 4) == 0) {
        kind = MTP;
        num += 4;
    }
    size_t nlen = len - (size_t)(num - text);
    if (nlen > 0 && num[nlen - 1] == '.') /* "layers.3." as written in tensor-name prefixes */
        nlen--;
    long v;
    char range[96];
    if (parse_index(num, nlen, &v) != 0)
        return ep_err_set(err,
                          "layer \"%.64s\": expected L, layers.L or mtp.I (e.g. 3, layers.3, "
                          "mtp.0)",
                          text);
    switch (kind) {
    case MAIN:
        if (v >= L)
            return ep_err_set(err, "layer \"%.64s\": the model has %s", text,
                              count_text(L, "main", "layers.", range, sizeof range));
        *layer = (int)v;
        return 0;
    case MTP:
        if (M == 0)
            return ep_err_set(err, "layer \"%.64s\": the model has no MTP layers", text);
        if (v >= M)
            return ep_err_set(err, "layer \"%.64s\": the model has %s", text,
                              count_text(M, "MTP", "mtp.", range, sizeof range));
        *layer = L + (int)v;
        return 0;
    case BARE:
        /* A bare number is the layer index of mc_num_layers: MTP layers follow the main ones
         * (spec §2.5: mtp.I is layer num_hidden_layers + I, as vLLM names it). */
        if (v >= L + M)
            return ep_err_set(err,
                              "layer \"%.64s\": expected a layer index in [0, %d) (%d main layers "
                              "then %d MTP layer%s)",
                              text, L + M, L, M, M == 1 ? "" : "s");
        *layer = (int)v;
        return 0;
    }
    return ep_err_set(err, "layer \"%.64s\": internal error", text);
}

/* Does stem end in "\.experts\.\d+\.w[123]"? Hand-written form of vLLM's regex (ASCII digits). */
static bool is_routed_expert_stem(const char *stem, size_t n)
{
    static const char exp[] = ".experts.";
    const size_t elen = sizeof exp - 1;
    if (n < 3 || stem[n - 3] != '.' || stem[n - 2] != 'w' || stem[n - 1] < '1' || stem[n - 1] > '3')
        return false;
    size_t d = n - 3; /* one past the last digit */
    size_t b = d;
    while (b > 0 && stem[b - 1] >= '0' && stem[b - 1] <= '9')
        b--;
    if (b == d || b < elen)
        return false;
    return memcmp(stem + b - elen, exp, elen) == 0;
}

int ck_map_name(const char *name, mc_expert_dtype dt, char *out, size_t cap)
{
    static const char sfx[] = ".scale";
    const size_t slen = sizeof sfx - 1;
    size_t n = strlen(name);
    const char *repl = NULL;
    if (n >= slen && memcmp(name + n - slen, sfx, slen) == 0) {
        n -= slen;
        repl =
            dt == MC_FP4 && is_routed_expert_stem(name, n) ? ".weight_scale" : ".weight_scale_inv";
    }
    int w = snprintf(out, cap, "%.*s%s", (int)n, name, repl != NULL ? repl : "");
    return w < 0 || (size_t)w >= cap ? -1 : w;
}

/* ---- the tensor table ------------------------------------------------------------------- */

static bool layer_args_ok(const mc_config *c, int layer, int e_begin, int e_end)
{
    return layer >= 0 && layer < mc_num_layers(c) && e_begin >= 0 && e_begin <= e_end &&
           e_end <= c->n_routed_experts;
}

int ck_layer_tensor_count(const mc_config *c, int layer, int e_begin, int e_end)
{
    if (!layer_args_ok(c, layer, e_begin, e_end))
        return -1;
    return CK_FIXED + CK_PER_EXPERT * (e_end - e_begin);
}

static void set_spec(ck_tensor_spec *s, st_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    s->dtype = dt;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = ndim > 1 ? d1 : 0;
}

/* Weight (which == 0) or scale (which == 1) of projection p (0 w1, 1 w2, 2 w3): w1/w3 are
 * [I, H] (out, in), w2 is [H, I]. */
static void proj_spec(const mc_config *c, bool routed, int p, int which, ck_tensor_spec *s)
{
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
    const int64_t N = p == 1 ? H : I, K = p == 1 ? I : H;
    if (routed && c->expert_dtype == MC_FP4) {
        if (which == 0)
            set_spec(s, ST_I8, 2, N, K / 2); /* two E2M1 nibbles per byte */
        else
            set_spec(s, ST_F8_E8M0, 2, N, K / EP_MXFP4_GROUP);
        return;
    }
    if (which == 0) {
        set_spec(s, ST_F8_E4M3, 2, N, K);
        return;
    }
    /* FP8 block scales follow scale_e8m0. In a valid config that is (expert_dtype == fp4), so
     * fp8 routed experts get F32; mismatch_hint probes fp8 with E8M0 on purpose. */
    set_spec(s, c->scale_e8m0 ? ST_F8_E8M0 : ST_F32, 2, N / EP_FP8_BLOCK, K / EP_FP8_BLOCK);
}

/* Entry idx of the table of (layer, experts from e_begin); args already checked. */
static void spec_at(const mc_config *c, int layer, int e_begin, int idx, ck_tensor_spec *s)
{
    char pfx[32];
    ck_layer_prefix(c, layer, pfx, sizeof pfx);
    const int64_t H = c->hidden_size, E = c->n_routed_experts;
    if (idx == 0) {
        snprintf(s->name, sizeof s->name, "%sffn_norm.weight", pfx);
        set_spec(s, ST_BF16, 1, H, 0);
    } else if (idx == 1) {
        snprintf(s->name, sizeof s->name, "%sffn.gate.weight", pfx);
        set_spec(s, ST_BF16, 2, E, H);
    } else if (idx == 2 && mc_layer_is_hash(c, layer)) {
        snprintf(s->name, sizeof s->name, "%sffn.gate.tid2eid", pfx);
        set_spec(s, ST_I64, 2, c->vocab_size, c->num_experts_per_tok);
    } else if (idx == 2) {
        snprintf(s->name, sizeof s->name, "%sffn.gate.bias", pfx);
        set_spec(s, ST_F32, 1, E, 0);
    } else if (idx < CK_FIXED) {
        int j = idx - CK_SHARED0;
        snprintf(s->name, sizeof s->name, "%sffn.shared_experts.%s.%s", pfx, PROJ[j / 2],
                 j % 2 == 0 ? "weight" : "scale");
        proj_spec(c, false, j / 2, j % 2, s);
    } else {
        int j = (idx - CK_FIXED) % CK_PER_EXPERT;
        int e = e_begin + (idx - CK_FIXED) / CK_PER_EXPERT;
        snprintf(s->name, sizeof s->name, "%sffn.experts.%d.%s.%s", pfx, e, PROJ[j / 2],
                 j % 2 == 0 ? "weight" : "scale");
        proj_spec(c, true, j / 2, j % 2, s);
    }
}

int ck_layer_tensors(const mc_config *c, int layer, int e_begin, int e_end, ck_tensor_spec *out,
                     int cap)
{
    int n = ck_layer_tensor_count(c, layer, e_begin, e_end);
    if (n < 0 || n > cap)
        return -1;
    for (int i = 0; i < n; i++)
        spec_at(c, layer, e_begin, i, &out[i]);
    return n;
}

/* ---- the checker ------------------------------------------------------------------------ */

static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
    return buf;
}

static bool tensor_matches(const st_tensor *t, const ck_tensor_spec *s)
{
    if (t->dtype != s->dtype || t->ndim != s->ndim)
        return false;
    for (int i = 0; i < s->ndim; i++)
        if (t->shape[i] != s->shape[i])
            return false;
    return true;
}

typedef enum check_result { CHECK_OK = 0, CHECK_MISSING = -1, CHECK_MISMATCH = -2 } check_result;

/* Check the table against the lookup; err may be NULL (probing another contract). Routed
 * experts are checked before the fixed tensors so that a checkpoint of the other expert dtype
 * is reported on an expert tensor, the one that tells the story. */
static check_result check_table(ck_lookup_fn lookup, const void *ctx, const mc_config *c, int layer,
                                int e_begin, int e_end, ep_err *err)
{
    const int n = CK_FIXED + CK_PER_EXPERT * (e_end - e_begin);
    ck_tensor_spec s;
    for (int k = 0; k < n; k++) {
        int idx = k < n - CK_FIXED ? CK_FIXED + k : k - (n - CK_FIXED);
        spec_at(c, layer, e_begin, idx, &s);
        const st_tensor *t = lookup(ctx, s.name);
        if (t == NULL) {
            ep_err_set(err, "missing tensor \"%s\" (expert_dtype %s)", s.name,
                       mc_dtype_name(c->expert_dtype));
            return CHECK_MISSING;
        }
        if (!tensor_matches(t, &s)) {
            char want[64], got[ST_MAX_DIMS * 22 + 4];
            ep_err_set(err, "tensor \"%s\": expected %s %s for expert_dtype %s, found %s %s",
                       s.name, st_dtype_name(s.dtype),
                       shape_text(s.ndim, s.shape, want, sizeof want),
                       mc_dtype_name(c->expert_dtype), st_dtype_name(t->dtype),
                       shape_text(t->ndim, t->shape, got, sizeof got));
            return CHECK_MISMATCH;
        }
    }
    return CHECK_OK;
}

/* Why the layer mismatched, when the tensors found are a whole contract of their own. "" when
 * they are not. */
static const char *mismatch_hint(ck_lookup_fn lookup, const void *ctx, const mc_config *c,
                                 int layer, int e_begin, int e_end, char *buf, size_t cap)
{
    mc_config other = *c;
    other.expert_dtype = c->expert_dtype == MC_FP4 ? MC_FP8 : MC_FP4;
    other.scale_e8m0 = other.expert_dtype == MC_FP4;
    if (check_table(lookup, ctx, &other, layer, e_begin, e_end, NULL) == CHECK_OK) {
        if (c->expert_dtype == MC_FP4 && !c->expert_dtype_given)
            snprintf(buf, cap,
                     "; config.json has no expert_dtype (top level or in quantization_config), so "
                     "fp4 (MXFP4) was defaulted, but these experts are FP8 block experts: set "
                     "\"expert_dtype\": \"fp8\"");
        else
            snprintf(buf, cap,
                     "; the checkpoint's experts look like %s experts but config.json says "
                     "expert_dtype \"%s\"",
                     mc_dtype_name(other.expert_dtype), mc_dtype_name(c->expert_dtype));
        return buf;
    }
    /* Converted checkpoints exist whose experts are FP8 with E8M0 block scales (spec §1.2). */
    mc_config conv = *c;
    conv.expert_dtype = MC_FP8;
    conv.scale_e8m0 = true;
    if (check_table(lookup, ctx, &conv, layer, e_begin, e_end, NULL) == CHECK_OK) {
        snprintf(buf, cap,
                 "; these experts are FP8 block experts with E8M0 scales, which neither "
                 "expert_dtype describes (fp8 expects F32 scales, fp4 MXFP4 experts)");
        return buf;
    }
    return "";
}

/* ---- values (docs/numerics.md, "NaN and Inf") --------------------------------------------- */

/* Bytes read per chunk when checking a tensor's values. */
#define CK_CHUNK (1u << 20)

/* "element 17" or "element [3, 17]". */
static const char *where_text(const st_tensor *t, uint64_t i, char *buf, size_t cap)
{
    if (t->ndim == 2 && t->shape[1] > 0)
        snprintf(buf, cap, "element [%llu, %llu]", (unsigned long long)(i / (uint64_t)t->shape[1]),
                 (unsigned long long)(i % (uint64_t)t->shape[1]));
    else
        snprintf(buf, cap, "element %llu", (unsigned long long)i);
    return buf;
}

/* Why element i (bytes at p) is refused, or NULL when it is allowed. */
static const char *bad_value(const mc_config *c, st_dtype dt, const uint8_t *p, char *buf,
                             size_t cap)
{
    uint32_t u32;
    int64_t i64;
    switch (dt) {
    case ST_BF16:
        u32 = (uint32_t)(p[0] | p[1] << 8);
        if ((u32 & 0x7F80u) == 0x7F80u)
            return (u32 & 0x7Fu) ? "NaN" : "Inf";
        return NULL;
    case ST_F32:
        memcpy(&u32, p, 4);
        if ((u32 & 0x7F800000u) == 0x7F800000u)
            return (u32 & 0x7FFFFFu) ? "NaN" : "Inf";
        return NULL;
    case ST_F8_E8M0:
        return p[0] == 0xFF ? "scale code 255 (NaN)" : NULL;
    case ST_F8_E4M3:
        return (p[0] & 0x7F) == 0x7F ? "e4m3 code 0x7f/0xff (NaN)" : NULL;
    case ST_I64:
        memcpy(&i64, p, 8);
        if (i64 >= 0 && i64 < c->n_routed_experts)
            return NULL;
        snprintf(buf, cap, "expert id %lld outside [0, %d)", (long long)i64, c->n_routed_experts);
        return buf;
    default:
        return NULL; /* I8 (packed e2m1): every code is a finite number */
    }
}

/* Check n bytes of t's values that start at element first. */
static int check_chunk(const mc_config *c, const st_tensor *t, const uint8_t *p, size_t n,
                       uint64_t first, ep_err *err)
{
    size_t es = st_dtype_size(t->dtype);
    if (es == 0 || t->dtype == ST_I8) /* packed e2m1: every code is a finite number */
        return 0;
    for (size_t b = 0; b + es <= n; b += es) {
        char why[96], where[64];
        const char *bad = bad_value(c, t->dtype, p + b, why, sizeof why);
        if (bad != NULL)
            return ep_err_set(err,
                              "tensor \"%s\": %s is %s; epmoe refuses NaN, Inf and out-of-range "
                              "values in weights (docs/numerics.md)",
                              t->name, where_text(t, first + b / es, where, sizeof where), bad);
    }
    return 0;
}

int ck_check_value_bytes(const mc_config *c, const st_tensor *t, const void *bytes, ep_err *err)
{
    return check_chunk(c, t, bytes, (size_t)t->nbytes, 0, err);
}

int ck_check_values(const mc_config *c, const st_tensor *t, ep_err *err)
{
    size_t es = st_dtype_size(t->dtype);
    if (es == 0 || t->nbytes == 0 || t->dtype == ST_I8)
        return 0;
    size_t chunk = CK_CHUNK - CK_CHUNK % es;
    uint8_t *buf = malloc(chunk);
    if (buf == NULL)
        return ep_err_set(err, "tensor \"%s\": out of memory checking its values", t->name);
    int rc = 0;
    for (uint64_t off = 0; off < t->nbytes && rc == 0; off += chunk) {
        size_t n = t->nbytes - off < chunk ? (size_t)(t->nbytes - off) : chunk;
        rc = st_tensor_read(t, off, buf, n, err);
        if (rc == 0)
            rc = check_chunk(c, t, buf, n, off / es, err);
    }
    free(buf);
    return rc;
}

int ck_check_input(const void *x, int T, int H, int token_base, ep_err *err)
{
    /* bytes, not uint16_t loads: a received frame promises no alignment */
    const uint8_t *p = x;
    size_t n = (size_t)T * (size_t)H;
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        if ((v & 0x7F80u) == 0x7F80u)
            return ep_err_set(err,
                              "token %zu, channel %zu: the hidden state is %s (bf16 bits 0x%04x); "
                              "inputs must be finite (docs/numerics.md)",
                              (size_t)token_base + i / (size_t)H, i % (size_t)H,
                              (v & 0x7Fu) ? "NaN" : "Inf", v);
    }
    return 0;
}

/* The values of every tensor of the table (after its dtypes and shapes passed). */
static int check_table_values(ck_lookup_fn lookup, const void *ctx, const mc_config *c, int layer,
                              int e_begin, int e_end, ep_err *err)
{
    const int n = CK_FIXED + CK_PER_EXPERT * (e_end - e_begin);
    ck_tensor_spec s;
    for (int k = 0; k < n; k++) {
        spec_at(c, layer, e_begin, k, &s);
        if (ck_check_values(c, lookup(ctx, s.name), err) != 0)
            return -1;
    }
    return 0;
}

/* Dtypes and shapes of the table (values: also every value). */
static int check_layer(ck_lookup_fn lookup, const void *ctx, const mc_config *c, int layer,
                       int e_begin, int e_end, bool values, ep_err *err)
{
    if (layer < 0 || layer >= mc_num_layers(c))
        return ep_err_set(err, "layer %d out of range: the model has %d MoE layers", layer,
                          mc_num_layers(c));
    if (e_begin < 0 || e_begin > e_end || e_end > c->n_routed_experts)
        return ep_err_set(err,
                          "expert range [%d, %d) out of range: the model has %d routed experts",
                          e_begin, e_end, c->n_routed_experts);
    check_result r = check_table(lookup, ctx, c, layer, e_begin, e_end, err);
    if (r == CHECK_MISMATCH) {
        char hint[256];
        const char *h = mismatch_hint(lookup, ctx, c, layer, e_begin, e_end, hint, sizeof hint);
        if (h[0] != '\0' && err != NULL) {
            char msg[EP_ERR_MSG_MAX];
            memcpy(msg, err->msg, sizeof msg);
            ep_err_set(err, "%s%s", msg, h);
        }
    }
    if (r != CHECK_OK)
        return -1;
    return values ? check_table_values(lookup, ctx, c, layer, e_begin, e_end, err) : 0;
}

int ck_check_layer_with(ck_lookup_fn lookup, const void *ctx, const mc_config *c, int layer,
                        int e_begin, int e_end, ep_err *err)
{
    return check_layer(lookup, ctx, c, layer, e_begin, e_end, true, err);
}

static const st_tensor *model_lookup(const void *ctx, const char *name)
{
    return st_model_find((const st_model *)ctx, name);
}

int ck_check_layer(const st_model *m, const mc_config *c, int layer, int e_begin, int e_end,
                   ep_err *err)
{
    return ck_check_layer_with(model_lookup, m, c, layer, e_begin, e_end, err);
}

int ck_check_layer_shapes(const st_model *m, const mc_config *c, int layer, int e_begin, int e_end,
                          ep_err *err)
{
    return check_layer(model_lookup, m, c, layer, e_begin, e_end, false, err);
}

int ck_check_model_shapes(const st_model *m, const mc_config *c, ep_err *err)
{
    for (int l = 0; l < mc_num_layers(c); l++)
        if (ck_check_layer_shapes(m, c, l, 0, c->n_routed_experts, err) != 0)
            return -1;
    return 0;
}

int ck_check_model(const st_model *m, const mc_config *c, ep_err *err)
{
    for (int l = 0; l < mc_num_layers(c); l++)
        if (ck_check_layer(m, c, l, 0, c->n_routed_experts, err) != 0)
            return -1;
    return 0;
}
