/*
 * cmd_inspect.c — `epmoectl inspect`: a checkpoint's resolved config, its MoE tensors per
 * layer, and whether they match the expert dtype (ck_check_model).
 *
 *   epmoectl inspect --model DIR [--map] [-o table|json]
 *
 * Table and JSON show the same facts; the JSON (schema 1) is documented in docs/operations.md.
 * The formats in the layer inventory are read from the tensors (expert 0 and the shared
 * expert), not from config.json, so a mismatch shows what is really there.
 * --map prints checkpoint_name<TAB>vLLM_name (ck_map_name under the resolved expert dtype) for
 * every tensor, sorted by name; the check still runs and decides the exit code.
 *
 * Exit codes: 0 consistent; 65 the check failed or a shard is unreadable (the error on stderr,
 * and in the JSON's "check"); 66 DIR or its config.json does not exist; 78 config.json is
 * invalid (the message names the field or value); 64 bad arguments.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "ctl/cmds.h"
#include "ctl/show.h"

typedef struct in_args {
    const char *model;
    bool map;
    cmd_output output;
} in_args;

/* What one MoE layer holds. */
typedef struct in_layer {
    char name[32]; /* "layers.3" / "mtp.0" */
    const char *kind;
    char routed[64], shared[64];
    int tensors;
    uint64_t bytes;
} in_layer;

typedef struct in_report {
    in_layer *layers;
    int nlayers;
    int other_tensors, tensors, files;
    uint64_t other_bytes, bytes;
} in_report;

static void inspect_usage(FILE *out)
{
    fprintf(out,
            "usage: epmoectl inspect --model DIR [--map] [-o table|json]\n\n"
            "Show a checkpoint's resolved config (expert_dtype given or defaulted), its MoE\n"
            "tensors per layer and other tensors, and check every MoE tensor's dtype and shape\n"
            "against the expert dtype.\n\n"
            "  --model DIR   checkpoint directory (config.json + safetensors)\n"
            "  --map         print checkpoint_name<TAB>vllm_name for every tensor instead\n"
            "  -o FORMAT     table (default) or json (schema 1, see docs/operations.md)\n\n"
            "exit codes: 0 consistent, 64 usage, 65 check failed or unreadable shard, 66 no such\n"
            "  directory or config.json, 78 invalid config.json\n");
}

static int parse_args(const cmd_ctx *ctx, int argc, char **argv, in_args *a, int *rc)
{
    a->model = NULL;
    a->map = false;
    a->output = ctx->output;
    *rc = CMD_USAGE;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            inspect_usage(stdout);
            *rc = CMD_OK;
            return -1;
        }
        if (strcmp(s, "--map") == 0) {
            a->map = true;
            continue;
        }
        /* -o FORMAT was taken out by epmoectl.c, before or after the command */
        if (strncmp(s, "--model=", 8) == 0) {
            a->model = s + 8;
        } else if (strcmp(s, "--model") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "epmoectl inspect: option %s needs a value\n", s);
                return -1;
            }
            a->model = argv[++i];
        } else {
            fprintf(stderr,
                    "epmoectl inspect: unknown argument \"%s\" (see epmoectl inspect --help)\n", s);
            return -1;
        }
    }
    if (a->model == NULL) {
        fprintf(stderr, "epmoectl inspect: --model DIR is required\n");
        return -1;
    }
    return 0;
}

/* ---- inventory -------------------------------------------------------------------------- */

/* "MXFP4 (I8 + E8M0/32)" etc. from the weight and scale actually present under stem. */
static void describe_format(const st_model *m, const char *stem, char *buf, size_t cap)
{
    char wn[EP_MAX_NAME], sn[EP_MAX_NAME];
    snprintf(wn, sizeof wn, "%s.weight", stem);
    snprintf(sn, sizeof sn, "%s.scale", stem);
    const st_tensor *w = st_model_find(m, wn), *s = st_model_find(m, sn);
    if (w == NULL || s == NULL) {
        snprintf(buf, cap, "missing");
        return;
    }
    if (w->dtype == ST_I8 && s->dtype == ST_F8_E8M0)
        snprintf(buf, cap, "MXFP4 (I8 + E8M0/32)");
    else if (w->dtype == ST_F8_E4M3 && s->dtype == ST_F32)
        snprintf(buf, cap, "FP8 block (F8_E4M3 + F32/128x128)");
    else if (w->dtype == ST_F8_E4M3 && s->dtype == ST_F8_E8M0)
        snprintf(buf, cap, "FP8 block (F8_E4M3 + E8M0/128x128)");
    else
        snprintf(buf, cap, "unknown (%s + %s)", st_dtype_name(w->dtype), st_dtype_name(s->dtype));
}

/* The MoE layer a tensor belongs to, or -1: "P" + "ffn." or "ffn_norm." for a layer prefix P
 * of the config. Names outside the config's layers count as other tensors. */
static int moe_layer_of(const mc_config *c, const char *name)
{
    const char *p;
    long base;
    long limit;
    if (strncmp(name, "layers.", 7) == 0) {
        p = name + 7;
        base = 0;
        limit = c->num_hidden_layers;
    } else if (strncmp(name, "mtp.", 4) == 0) {
        p = name + 4;
        base = c->num_hidden_layers;
        limit = c->num_nextn_predict_layers;
    } else {
        return -1;
    }
    if (*p < '0' || *p > '9')
        return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9' && v < 100000)
        v = v * 10 + (*p++ - '0');
    if (*p != '.' || v >= limit)
        return -1;
    p++;
    if (strncmp(p, "ffn.", 4) != 0 && strncmp(p, "ffn_norm.", 9) != 0)
        return -1;
    return (int)(base + v);
}

static int build_report(const st_model *m, const mc_config *c, in_report *r)
{
    memset(r, 0, sizeof *r);
    r->nlayers = mc_num_layers(c);
    r->layers = calloc((size_t)r->nlayers, sizeof *r->layers);
    if (r->layers == NULL)
        return -1;
    for (int l = 0; l < r->nlayers; l++) {
        in_layer *L = &r->layers[l];
        char pfx[32], stem[EP_MAX_NAME];
        ck_layer_prefix(c, l, pfx, sizeof pfx);
        snprintf(L->name, sizeof L->name, "%.*s", (int)strlen(pfx) - 1, pfx);
        L->kind = l >= c->num_hidden_layers ? "mtp" : mc_layer_is_hash(c, l) ? "hash" : "score";
        snprintf(stem, sizeof stem, "%sffn.experts.0.w1", pfx);
        describe_format(m, stem, L->routed, sizeof L->routed);
        snprintf(stem, sizeof stem, "%sffn.shared_experts.w1", pfx);
        describe_format(m, stem, L->shared, sizeof L->shared);
    }
    const st_file *seen[ST_MAX_SHARDS];
    for (int i = 0; i < st_model_count(m); i++) {
        const st_tensor *t = st_model_at(m, i);
        int l = moe_layer_of(c, t->name);
        if (l >= 0) {
            r->layers[l].tensors++;
            r->layers[l].bytes += t->nbytes;
        } else {
            r->other_tensors++;
            r->other_bytes += t->nbytes;
        }
        r->tensors++;
        r->bytes += t->nbytes;
        bool known = false;
        for (int f = 0; f < r->files && !known; f++)
            known = seen[f] == t->file;
        if (!known && r->files < ST_MAX_SHARDS)
            seen[r->files++] = t->file;
    }
    return 0;
}

/* ---- output ----------------------------------------------------------------------------- */

static int print_json(const char *dir, const mc_config *c, const in_report *r, const char *check)
{
    json_t *layers = json_array();
    for (int l = 0; layers != NULL && l < r->nlayers; l++) {
        const in_layer *L = &r->layers[l];
        json_t *o = json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:I}", "name", L->name, "index", l, "kind",
                              L->kind, "routed_experts", L->routed, "shared_expert", L->shared,
                              "tensors", L->tensors, "bytes", (json_int_t)L->bytes);
        if (o == NULL || json_array_append_new(layers, o) != 0) {
            json_decref(layers);
            layers = NULL;
        }
    }
    json_t *root = json_pack(
        "{s:i,s:s,s:s,s:b,s:b,s:b,s:o,s:o,s:{s:i,s:I},s:i,s:I,s:i,s:{s:b,s:s?}}", "schema", 1,
        "model", dir, "expert_dtype", mc_dtype_name(c->expert_dtype), "expert_dtype_given",
        c->expert_dtype_given, "scale_e8m0", c->scale_e8m0, "act_ue8m0", c->act_ue8m0, "config",
        show_config_json(c), "layers", layers, "other", "tensors", r->other_tensors, "bytes",
        (json_int_t)r->other_bytes, "tensors", r->tensors, "bytes", (json_int_t)r->bytes, "files",
        r->files, "check", "ok", check == NULL, "error", check);
    if (root == NULL) {
        fprintf(stderr, "epmoectl inspect: out of memory\n");
        return -1;
    }
    json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    printf("\n");
    json_decref(root);
    return 0;
}

static void print_table(const char *dir, const mc_config *c, const in_report *r, const char *check)
{
    printf("model         %s\n", dir);
    show_config_text(c);
    printf("config hash   %016" PRIx64 "\n\n", mc_hash(c));
    printf("%-10s %-6s %-36s %-36s %8s %14s\n", "LAYER", "KIND", "ROUTED EXPERTS", "SHARED EXPERT",
           "TENSORS", "BYTES");
    for (int l = 0; l < r->nlayers; l++) {
        const in_layer *L = &r->layers[l];
        printf("%-10s %-6s %-36s %-36s %8d %14" PRIu64 "\n", L->name, L->kind, L->routed, L->shared,
               L->tensors, L->bytes);
    }
    printf("\nother tensors %d (%" PRIu64 " bytes)\n", r->other_tensors, r->other_bytes);
    printf("total         %d tensors, %" PRIu64 " bytes in %d file%s\n", r->tensors, r->bytes,
           r->files, r->files == 1 ? "" : "s");
    printf("check         %s\n", check == NULL ? "ok" : "FAILED (see stderr)");
}

static int print_map(const st_model *m, const mc_config *c, cmd_output out)
{
    json_t *arr = out == CMD_OUT_JSON ? json_array() : NULL;
    if (out == CMD_OUT_JSON && arr == NULL)
        return -1;
    for (int i = 0; i < st_model_count(m); i++) {
        const char *name = st_model_at(m, i)->name;
        char mapped[EP_MAX_NAME + 16];
        if (ck_map_name(name, c->expert_dtype, mapped, sizeof mapped) < 0) {
            json_decref(arr);
            fprintf(stderr, "epmoectl inspect: tensor \"%s\": mapped name too long\n", name);
            return -1;
        }
        if (arr == NULL) {
            printf("%s\t%s\n", name, mapped);
        } else if (json_array_append_new(
                       arr, json_pack("{s:s,s:s}", "name", name, "mapped", mapped)) != 0) {
            json_decref(arr);
            return -1;
        }
    }
    if (arr != NULL) {
        /* the head every -o json object has (schema), then the map */
        json_t *o = json_pack("{s:i,s:s,s:o}", "schema", 1, "expert_dtype",
                              mc_dtype_name(c->expert_dtype), "tensors", arr);
        if (o == NULL)
            return -1;
        json_dumpf(o, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(o);
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------ */

/* 66 when DIR or DIR/config.json does not exist, 78 when the config is invalid. */
static int load_config(const char *dir, mc_config *c)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        fprintf(stderr, "epmoectl inspect: %s: %s\n", dir, strerror(errno));
        return CMD_NOINPUT;
    }
    if (!S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "epmoectl inspect: %s: not a directory\n", dir);
        return CMD_NOINPUT;
    }
    char path[EP_MAX_PATH];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path) {
        fprintf(stderr, "epmoectl inspect: %s: path too long\n", dir);
        return CMD_USAGE;
    }
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "epmoectl inspect: %s: %s\n", path, strerror(errno));
        return CMD_NOINPUT;
    }
    ep_err err = {0};
    if (mc_load(path, c, &err) != 0) {
        fprintf(stderr, "epmoectl inspect: %s\n", err.msg);
        return CMD_CONFIG;
    }
    return CMD_OK;
}

int cmd_inspect(const cmd_ctx *ctx, int argc, char **argv)
{
    in_args a;
    int rc;
    if (parse_args(ctx, argc, argv, &a, &rc) != 0)
        return rc;
    mc_config c;
    if ((rc = load_config(a.model, &c)) != CMD_OK)
        return rc;
    ep_err err = {0};
    st_model *m = st_model_open(a.model, &err);
    if (m == NULL) {
        fprintf(stderr, "epmoectl inspect: %s\n", err.msg);
        return CMD_DATAERR;
    }
    const char *check = NULL;
    if (ck_check_model(m, &c, &err) != 0)
        check = err.msg;

    in_report r;
    rc = CMD_OK;
    if (a.map) {
        if (print_map(m, &c, a.output) != 0)
            rc = CMD_SOFTWARE;
    } else if (build_report(m, &c, &r) != 0) {
        fprintf(stderr, "epmoectl inspect: out of memory\n");
        rc = CMD_SOFTWARE;
    } else {
        if (a.output == CMD_OUT_JSON) {
            if (print_json(a.model, &c, &r, check) != 0)
                rc = CMD_SOFTWARE;
        } else {
            print_table(a.model, &c, &r, check);
        }
        free(r.layers);
    }
    fflush(stdout);
    if (rc == CMD_OK && check != NULL) {
        fprintf(stderr, "epmoectl inspect: %s: check failed: %s\n", a.model, check);
        rc = CMD_DATAERR;
    }
    st_model_close(&m);
    return rc;
}
