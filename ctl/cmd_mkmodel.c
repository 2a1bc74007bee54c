/*
 * cmd_mkmodel.c — `epmoectl mkmodel`: write a synthetic DeepSeek V4 checkpoint (ctl/mkmodel.h).
 *
 * Exit codes: 0 written; 64 bad options (the message names the option); 73 the output
 * directory cannot be created or written (exists and is not empty without --force, missing
 * parent, no space, I/O error).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/cmds.h"
#include "ctl/mkmodel.h"

static void mkmodel_usage(FILE *out)
{
    mk_options d;
    mk_options_init(&d);
    fprintf(out,
            "usage: epmoectl mkmodel --out DIR --expert-dtype fp4|fp8 [options]\n\n"
            "Write a synthetic DeepSeek V4 checkpoint: config.json, safetensors shards with every\n"
            "MoE tensor (MXFP4 or FP8-block experts, scales computed from Gaussian weights) and\n"
            "the non-MoE tensors a loader must skip. Same options and seed: same bytes.\n\n"
            "  --out DIR               output directory (created; its parent must exist)\n"
            "  --expert-dtype fp4|fp8  fp4: MXFP4 experts, E8M0 scales; fp8: FP8 experts, F32 "
            "scales\n"
            "  --omit-expert-dtype     leave expert_dtype out of config.json (tensors unchanged)\n"
            "  --full                  also every tensor transformers' DeepseekV4ForCausalLM\n"
            "                          loads (attention, compressor, indexer, mHC, hc_head),\n"
            "                          tiny attention, so an engine runs the whole model\n"
            "  --hidden N              hidden size H, multiple of 128 (%d)\n"
            "  --inter N               expert intermediate size I, multiple of 128 (%d)\n"
            "  --experts N             routed experts (%d)\n"
            "  --topk N                experts per token (%d)\n"
            "  --layers N              main MoE layers (%d)\n"
            "  --hash-layers N         of which hash-routed, the first N (%d)\n"
            "  --mtp N                 MTP layers (%d)\n"
            "  --vocab N               vocabulary size (%d)\n"
            "  --shards N              safetensors files; 1 writes model.safetensors (%d)\n"
            "  --seed N                PRNG seed (%" PRIu64 ")\n"
            "  --threads N             generator threads, 0: one per CPU (output is the same)\n"
            "  --force                 write into a non-empty DIR, replacing its config.json,\n"
            "                          index and *.safetensors\n\n"
            "exit codes: 0 written, 64 bad options, 73 cannot create the output\n",
            d.hidden, d.inter, d.experts, d.topk, d.layers, d.hash_layers, d.mtp, d.vocab, d.shards,
            d.seed);
}

/* "--name VALUE" or "--name=VALUE" at argv[*i]; advances *i past a separate value. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *matched)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    *matched = false;
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=') {
        *matched = true;
        return a + n + 1;
    }
    if (a[n] != '\0')
        return NULL;
    *matched = true;
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static int parse_int(const char *opt, const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (v[0] == '\0' || *end != '\0' || errno != 0 || x < INT_MIN || x > INT_MAX) {
        fprintf(stderr, "epmoectl mkmodel: %s %s: expected an integer\n", opt, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_u64(const char *opt, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0) {
        fprintf(stderr, "epmoectl mkmodel: %s %s: expected an unsigned 64-bit integer\n", opt, v);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

static int parse_args(int argc, char **argv, mk_options *o, bool *dtype_given, int *rc)
{
    static const struct {
        const char *name;
        size_t off;
    } ints[] = {
        {"--hidden", offsetof(mk_options, hidden)},
        {"--inter", offsetof(mk_options, inter)},
        {"--experts", offsetof(mk_options, experts)},
        {"--topk", offsetof(mk_options, topk)},
        {"--layers", offsetof(mk_options, layers)},
        {"--hash-layers", offsetof(mk_options, hash_layers)},
        {"--mtp", offsetof(mk_options, mtp)},
        {"--vocab", offsetof(mk_options, vocab)},
        {"--shards", offsetof(mk_options, shards)},
        {"--threads", offsetof(mk_options, threads)},
    };
    *rc = CMD_USAGE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool m;
        const char *v;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            mkmodel_usage(stdout);
            *rc = CMD_OK;
            return -1;
        }
        if (strcmp(a, "--force") == 0) {
            o->force = true;
            continue;
        }
        if (strcmp(a, "--omit-expert-dtype") == 0) {
            o->omit_expert_dtype = true;
            continue;
        }
        if (strcmp(a, "--full") == 0) {
            o->full = true;
            continue;
        }
        bool done = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++) {
            v = opt_value(argc, argv, &i, ints[k].name, &m);
            if (!m)
                continue;
            if (v == NULL) {
                fprintf(stderr, "epmoectl mkmodel: option %s needs a value\n", ints[k].name);
                return -1;
            }
            if (parse_int(ints[k].name, v, (int *)((char *)o + ints[k].off)) != 0)
                return -1;
            done = true;
        }
        if (done)
            continue;
        static const char *const strs[] = {"--out", "--expert-dtype", "--seed"};
        for (int k = 0; k < 3 && !done; k++) {
            v = opt_value(argc, argv, &i, strs[k], &m);
            if (!m)
                continue;
            if (v == NULL) {
                fprintf(stderr, "epmoectl mkmodel: option %s needs a value\n", strs[k]);
                return -1;
            }
            if (k == 0) {
                o->out_dir = v;
            } else if (k == 1) {
                if (mc_dtype_parse(v, &o->expert_dtype) != 0) {
                    fprintf(stderr, "epmoectl mkmodel: --expert-dtype %s: expected fp4 or fp8\n",
                            v);
                    return -1;
                }
                *dtype_given = true;
            } else if (parse_u64("--seed", v, &o->seed) != 0) {
                return -1;
            }
            done = true;
        }
        if (!done) {
            fprintf(stderr,
                    "epmoectl mkmodel: unknown argument \"%s\" (see epmoectl mkmodel --help)\n", a);
            return -1;
        }
    }
    return 0;
}

static void print_summary(const cmd_ctx *ctx, const mk_options *o, const mk_plan *p)
{
    const char *dt = mc_dtype_name(o->expert_dtype);
    if (ctx->output == CMD_OUT_JSON) {
        json_t *j = json_pack("{s:i,s:s,s:s,s:b,s:b,s:i,s:I,s:i}", "schema", 1, "dir", o->out_dir,
                              "expert_dtype", dt, "expert_dtype_in_config", !o->omit_expert_dtype,
                              "full", o->full, "tensors", p->tensors, "bytes", (json_int_t)p->bytes,
                              "shards", p->shards);
        if (j != NULL)
            json_dumpf(j, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(j);
        return;
    }
    printf("mkmodel: wrote %s: expert_dtype %s%s, %d tensors, %" PRIu64 " bytes, %d shard%s\n",
           o->out_dir, dt, o->omit_expert_dtype ? " (not in config.json)" : "", p->tensors,
           p->bytes, p->shards, p->shards == 1 ? "" : "s");
}

int cmd_mkmodel(const cmd_ctx *ctx, int argc, char **argv)
{
    mk_options o;
    mk_options_init(&o);
    bool dtype_given = false;
    int rc;
    if (parse_args(argc, argv, &o, &dtype_given, &rc) != 0)
        return rc;
    if (o.out_dir == NULL) {
        fprintf(stderr, "epmoectl mkmodel: --out DIR is required\n");
        return CMD_USAGE;
    }
    if (!dtype_given) {
        fprintf(stderr, "epmoectl mkmodel: --expert-dtype fp4|fp8 is required\n");
        return CMD_USAGE;
    }
    ep_err err = {0};
    mk_plan plan;
    if (mk_check(&o, &plan, &err) != 0) {
        fprintf(stderr, "epmoectl mkmodel: %s\n", err.msg);
        return CMD_USAGE;
    }
    if (mk_write_model(&o, &err) != 0) {
        fprintf(stderr, "epmoectl mkmodel: %s\n", err.msg);
        return CMD_CANTCREAT;
    }
    print_summary(ctx, &o, &plan);
    return CMD_OK;
}
