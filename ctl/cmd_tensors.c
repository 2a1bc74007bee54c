/*
 * cmd_tensors.c — two small tools around `epmoectl forward`'s tensor files:
 *
 *   epmoectl mkinput --model DIR --tokens T --out FILE [--seed N]
 *       A forward input for the model: hidden_states BF16 [T, H], values N(0, 1) with one in 64
 *       scaled by 20 (activations have outliers, and the FP8 quantizer must meet them), and
 *       input_ids I64 [T] uniform in [0, vocab). Deterministic for a seed on every host.
 *   epmoectl diff A B
 *       Compares two forward outputs tensor by tensor: bit-identical or not, and for BF16/F32
 *       tensors the largest absolute difference and how many elements differ. Exit 0 when
 *       every tensor is bit-identical, 1 when any differs, 65 when the files cannot be
 *       compared (missing tensor, dtype or shape mismatch).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/model_config.h"
#include "common/safetensors_writer.h"
#include "ctl/cmds.h"
#include "kernels/formats.h"

/* ---- mkinput ---- */

/* splitmix64: a seeded stream whose output is the same on every host */
static uint64_t mki_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* N(0, 1) by the sum of 12 uniforms (Irwin-Hall): no libm, so identical bits everywhere */
static float mki_gauss(uint64_t *s)
{
    double sum = 0;
    for (int i = 0; i < 12; i++)
        sum += (double)(mki_next(s) >> 11) * 0x1p-53;
    return (float)(sum - 6.0);
}

static void mkinput_usage(FILE *f)
{
    fprintf(f, "usage: epmoectl mkinput --model DIR --tokens T --out FILE [--seed N]\n"
               "  writes hidden_states BF16 [T, H] and input_ids I64 [T] for the model in DIR\n");
}

static int mki_write(const char *path, int T, int H, int vocab, uint64_t seed, ep_err *err)
{
    uint16_t *x = malloc((size_t)T * H * sizeof *x);
    int64_t *ids = malloc((size_t)T * sizeof *ids);
    int rc = -1;
    if (x == NULL || ids == NULL) {
        ep_err_set(err, "out of memory for %d tokens", T);
        goto out;
    }
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)T * H; i++) {
        float v = mki_gauss(&s);
        if (mki_next(&s) % 64 == 0)
            v *= 20.0f;
        x[i] = fmt_f32_to_bf16(v);
    }
    for (int t = 0; t < T; t++)
        ids[t] = (int64_t)(mki_next(&s) % (uint64_t)vocab);
    st_writer *w = st_writer_create();
    int64_t sx[2] = {T, H}, si[1] = {T};
    rc = w == NULL ? ep_err_set(err, "out of memory") : 0;
    if (rc == 0)
        rc = st_writer_add(w, "hidden_states", ST_BF16, 2, sx, x, err);
    if (rc == 0)
        rc = st_writer_add(w, "input_ids", ST_I64, 1, si, ids, err);
    if (rc == 0)
        rc = st_writer_write(w, path, err);
    st_writer_destroy(&w);
out:
    free(x);
    free(ids);
    return rc;
}

int cmd_mkinput(const cmd_ctx *ctx, int argc, char **argv)
{
    const char *model = NULL, *out = NULL;
    long tokens = 0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            mkinput_usage(stdout);
            return CMD_OK;
        }
        if (v == NULL) {
            fprintf(stderr, "epmoectl mkinput: %s needs a value (see --help)\n", a);
            return CMD_USAGE;
        }
        i++;
        if (strcmp(a, "--model") == 0)
            model = v;
        else if (strcmp(a, "--out") == 0)
            out = v;
        else if (strcmp(a, "--tokens") == 0) {
            tokens = strtol(v, &end, 10);
            if (*end || tokens < 1 || tokens > EP_MAX_TOKENS) {
                fprintf(stderr, "epmoectl mkinput: --tokens %s: expected 1..%d\n", v,
                        EP_MAX_TOKENS);
                return CMD_USAGE;
            }
        } else if (strcmp(a, "--seed") == 0) {
            seed = strtoull(v, &end, 10);
            if (*end || *v == '\0' || *v == '-') {
                fprintf(stderr, "epmoectl mkinput: --seed %s: expected an unsigned integer\n", v);
                return CMD_USAGE;
            }
        } else {
            fprintf(stderr, "epmoectl mkinput: unknown option %s (see --help)\n", a);
            return CMD_USAGE;
        }
    }
    if (model == NULL || out == NULL || tokens == 0) {
        mkinput_usage(stderr);
        return CMD_USAGE;
    }
    char cfgpath[EP_MAX_PATH];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", model);
    mc_config c;
    ep_err err;
    if (access(cfgpath, F_OK) != 0) { /* no such model: 66, like inspect (an invalid one: 78) */
        fprintf(stderr, "epmoectl mkinput: --model %s: %s: %s\n", model, cfgpath, strerror(errno));
        return CMD_NOINPUT;
    }
    if (mc_load(cfgpath, &c, &err) != 0) {
        fprintf(stderr, "epmoectl mkinput: %s\n", err.msg);
        return CMD_CONFIG;
    }
    if (mki_write(out, (int)tokens, c.hidden_size, c.vocab_size, seed, &err) != 0) {
        fprintf(stderr, "epmoectl mkinput: %s\n", err.msg);
        return CMD_CANTCREAT;
    }
    if (ctx->output == CMD_OUT_JSON)
        printf("{\"schema\": 1, \"file\": \"%s\", \"tokens\": %ld, \"hidden_size\": %d}\n", out,
               tokens, c.hidden_size);
    else
        printf("mkinput: wrote %s: hidden_states BF16 [%ld, %d], input_ids I64 [%ld]\n", out,
               tokens, c.hidden_size, tokens);
    return CMD_OK;
}

/* ---- diff ---- */

typedef struct diff_stat {
    const char *name;
    int64_t numel, differ;
    double max_abs;
    double calc_diff; /* DeepGEMM's 1 - 2 sum(ab) / sum(a^2 + b^2); float tensors */
    int identical;
} diff_stat;

static double diff_value(const st_tensor *t, int64_t i)
{
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return fmt_bf16_to_f32(h);
    }
    case ST_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case ST_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ST_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    default:
        return NAN;
    }
}

static int diff_tensor(const st_tensor *a, const st_tensor *b, diff_stat *d, ep_err *err)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim ||
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) != 0)
        return ep_err_set(err, "tensor \"%s\": dtype or shape differs (%s vs %s)", a->name,
                          st_dtype_name(a->dtype), st_dtype_name(b->dtype));
    size_t es = st_dtype_size(a->dtype);
    d->name = a->name;
    d->numel = a->numel;
    d->identical = memcmp(a->data, b->data, a->nbytes) == 0;
    d->differ = 0;
    d->max_abs = 0;
    d->calc_diff = 0;
    if (!d->identical && (a->dtype == ST_BF16 || a->dtype == ST_F32)) {
        double xy = 0, xx = 0, yy = 0;
        for (int64_t i = 0; i < a->numel; i++) {
            double x = diff_value(a, i), y = diff_value(b, i);
            xy += x * y, xx += x * x, yy += y * y;
        }
        /* a non-finite value makes the tensors incomparable: the largest difference */
        d->calc_diff = !isfinite(xy + xx + yy) ? 1.0 : xx + yy == 0 ? 0.0 : 1 - 2 * xy / (xx + yy);
    }
    for (int64_t i = 0; !d->identical && i < a->numel; i++) {
        if (memcmp((const uint8_t *)a->data + i * es, (const uint8_t *)b->data + i * es, es) == 0)
            continue;
        d->differ++;
        double x = diff_value(a, i), y = diff_value(b, i), e = fabs(x - y);
        if (e > d->max_abs || isnan(e))
            d->max_abs = isnan(e) ? INFINITY : e;
    }
    return 0;
}

/* A number for JSON, which has none for NaN or Inf: those become the strings "nan", "inf" and
 * "-inf", so no tensor is left out of the report. */
static json_t *diff_num(double v)
{
    if (isnan(v))
        return json_string("nan");
    if (isinf(v))
        return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

/* One tensor's entry. */
static json_t *diff_json(const diff_stat *d)
{
    return json_pack("{s:s, s:b, s:I, s:I, s:o, s:o}", "name", d->name, "identical", d->identical,
                     "elements", (json_int_t)d->numel, "differ", (json_int_t)d->differ, "max_abs",
                     diff_num(d->max_abs), "calc_diff", diff_num(d->calc_diff));
}

static const char diff_usage[] =
    "usage: epmoectl diff A.safetensors B.safetensors [--max-calc-diff X]\n"
    "  exit 0: every tensor bit-identical (or, with --max-calc-diff, every float tensor within\n"
    "  DeepGEMM's calc_diff X and every integer tensor identical: spec section 7's check of a\n"
    "  tensor-core run); 1: some differ; 65: not comparable\n";

int cmd_diff(const cmd_ctx *ctx, int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("%s", diff_usage);
        return CMD_OK;
    }
    double tol = -1;
    if (argc == 5 && strcmp(argv[3], "--max-calc-diff") == 0) {
        char *end;
        tol = strtod(argv[4], &end);
        if (*end != '\0' || !(tol >= 0 && tol <= 1)) {
            fprintf(stderr, "epmoectl diff: --max-calc-diff %s: expected a number in [0, 1]\n",
                    argv[4]);
            return CMD_USAGE;
        }
        argc = 3;
    }
    if (argc != 3) {
        fprintf(stderr, "%s", diff_usage);
        return CMD_USAGE;
    }
    ep_err err;
    st_file *a = st_open(argv[1], &err), *b = NULL;
    if (a == NULL || (b = st_open(argv[2], &err)) == NULL) {
        fprintf(stderr, "epmoectl diff: %s\n", err.msg);
        st_close(&a);
        return CMD_NOINPUT;
    }
    int n = st_count(a), rc = CMD_OK;
    diff_stat *ds = calloc((size_t)n + 1, sizeof *ds);
    json_t *arr = json_array();
    for (int i = 0; i < n && rc != CMD_DATAERR; i++) {
        const st_tensor *ta = st_at(a, i), *tb = st_find(b, ta->name);
        if (tb == NULL)
            rc = ep_err_set(&err, "tensor \"%s\" is missing from %s", ta->name, argv[2]);
        else if (diff_tensor(ta, tb, &ds[i], &err) != 0)
            rc = -1;
        if (rc == -1) {
            rc = CMD_DATAERR;
            break;
        }
        bool is_float = ta->dtype == ST_BF16 || ta->dtype == ST_F32;
        if (!ds[i].identical && !(tol >= 0 && is_float && ds[i].calc_diff <= tol))
            rc = CMD_FAILED;
        json_array_append_new(arr, diff_json(&ds[i]));
    }
    if (rc == CMD_OK && st_count(b) != n) {
        rc = CMD_DATAERR;
        ep_err_set(&err, "%s has %d tensors, %s has %d", argv[1], n, argv[2], st_count(b));
    }
    if (rc == CMD_DATAERR) {
        fprintf(stderr, "epmoectl diff: %s\n", err.msg);
    } else if (ctx->output == CMD_OUT_JSON) {
        bool all_same = true;
        for (int i = 0; i < n; i++)
            all_same = all_same && ds[i].identical;
        json_t *o = json_pack("{s:i, s:b, s:b, s:o}", "schema", 1, "identical", all_same, "ok",
                              rc == CMD_OK, "tensors", json_incref(arr));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        for (int i = 0; i < n; i++)
            printf("%-14s %s (%lld elements, %lld differ, max |a-b| %g, calc_diff %.3g)\n",
                   ds[i].name, ds[i].identical ? "identical" : "DIFFERS", (long long)ds[i].numel,
                   (long long)ds[i].differ, ds[i].max_abs, ds[i].calc_diff);
    }
    json_decref(arr);
    free(ds);
    st_close(&a);
    st_close(&b);
    return rc;
}
