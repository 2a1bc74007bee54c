/*
 * cmd_forward.c — `epmoectl forward`: run one MoE layer on tokens from a safetensors file.
 *
 *   epmoectl forward --local --model DIR --layer L --input IN --output OUT [--threads N]
 *                    [--device cpu|cuda:N] [--gpu-gemm exact|fast]
 *
 *   epmoectl [--coordinator EP] forward --layer L --input IN --output OUT
 *
 * --local loads the layer (every expert) from the checkpoint in DIR and runs it in this
 * process on --device (default cpu: the reference backend; cuda:N runs the whole layer on that
 * GPU, --gpu-gemm picking its expert GEMMs). Without --local the request goes to the cluster
 * through libepmoe (<epmoe.h>, docs/client.md): the model's shape comes from the coordinator,
 * the input is read and checked against it here, and the tokens go to an entry worker, never
 * through the coordinator. The file formats are those of ctl/fwd_io.h; both paths write the
 * same output file.
 *
 * Exit codes (ctl/cmds.h): 64 bad command line (including an unknown --layer), 66 DIR, its
 * config.json or IN missing, 78 config.json invalid, 65 bad checkpoint or bad input data
 * (missing tensor, dtype, shape, H mismatch, token id out of range), 73 OUT not writable;
 * cluster path: 1 the cluster refused or the request failed (ERR_NAME: message), 69 neither the
 * coordinator nor a member answered, 76 an answer was not what the protocol promises, 77 a key
 * was refused.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/clock.h"
#include "common/knobs.h"
#include "common/limits.h"
#include "common/model_config.h"
#include "common/model_msg.h"
#include "common/safetensors_model.h"
#include "common/wire.h"
#include "ctl/cmds.h"
#include "ctl/fwd_io.h"
#include "common/auth.h"
#include "epmoe.pb-c.h"
#include <epmoe.h>
#include "ctl/show.h"
#include "kernels/gemm.h"
#include "kernels/moe_backend.h"
#include "shard/shard.h"

typedef struct fwd_args {
    bool local;
    const char *model, *layer, *input, *output;
    const char *device, *gpu_gemm; /* --local only; NULL: cpu, exact */
    const char *entry;             /* cluster only: the preferred entry worker (name or endpoint) */
    int threads;                   /* 0: one per CPU */
} fwd_args;

static void fwd_usage(FILE *out)
{
    fprintf(out, "usage: epmoectl forward --local --model DIR --layer L --input IN --output OUT "
                 "[--threads N]\n"
                 "                [--device cpu|cuda:N] [--gpu-gemm exact|fast]\n"
                 "       epmoectl [--coordinator EP] forward --layer L --input IN --output OUT\n"
                 "                [--entry WORKER]\n\n"
                 "Run one MoE layer on the tokens in IN and write its output to OUT: on the\n"
                 "cluster (the coordinator at --coordinator), or with --local in this process.\n\n"
                 "  --local        load the layer from DIR and run it in this process\n"
                 "  --model DIR    checkpoint directory (config.json + safetensors); --local only\n"
                 "  --layer L      L or layers.L (main layer), mtp.I (MTP layer)\n"
                 "  --input IN     safetensors: hidden_states BF16|F32 [T, H] (before ffn_norm),\n"
                 "                 input_ids I32|I64 [T] (required on hash-routed layers)\n"
                 "  --output OUT   safetensors: out BF16 [T, H], topk_ids I32 [T, k],\n"
                 "                 topk_weights F32 [T, k]\n"
                 "  --threads N    compute threads (default: one per CPU)\n"
                 "  --entry W      the cluster path's entry worker: its name or client endpoint\n"
                 "                 (default: one by rotation; another if it does not answer)\n"
                 "  --device DEV   --local only: cpu (default, the reference) or cuda:N\n"
                 "  --gpu-gemm G   --local on cuda:N: exact (default, the CPU's bits) or fast\n"
                 "                 (tensor cores, within spec section 7's tolerances)\n\n"
                 "exit codes: 0 ok, 64 usage, 65 bad checkpoint or input data, 66 missing file,\n"
                 "  69 device unusable (--local) or no answer, 70 internal error,\n"
                 "  73 cannot write OUT, 78 bad config.json\n");
}

/* Returns -1 to go on, else the exit code. */
static int fwd_parse(int argc, char **argv, fwd_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            fwd_usage(stdout);
            return CMD_OK;
        }
        if (strcmp(o, "--local") == 0) {
            a->local = true;
            continue;
        }
        const char **slot = strcmp(o, "--model") == 0      ? &a->model
                            : strcmp(o, "--layer") == 0    ? &a->layer
                            : strcmp(o, "--input") == 0    ? &a->input
                            : strcmp(o, "--output") == 0   ? &a->output
                            : strcmp(o, "--device") == 0   ? &a->device
                            : strcmp(o, "--gpu-gemm") == 0 ? &a->gpu_gemm
                            : strcmp(o, "--entry") == 0    ? &a->entry
                                                           : NULL;
        bool threads = strcmp(o, "--threads") == 0;
        if (!slot && !threads) {
            fprintf(stderr, "epmoectl forward: unknown option %s (see epmoectl forward --help)\n",
                    o);
            return CMD_USAGE;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "epmoectl forward: option %s needs a value\n", o);
            return CMD_USAGE;
        }
        const char *v = argv[++i];
        if (slot) {
            *slot = v;
            continue;
        }
        char *end;
        long n = strtol(v, &end, 10);
        if (*end != '\0' || n < 1 || n > 4096) {
            fprintf(stderr, "epmoectl forward: --threads %s: expected an integer in 1..4096\n", v);
            return CMD_USAGE;
        }
        a->threads = (int)n;
    }
    const char *missing = !a->model && a->local ? "--model"
                          : !a->layer           ? "--layer"
                          : !a->input           ? "--input"
                          : !a->output          ? "--output"
                                                : NULL;
    if (missing) {
        fprintf(stderr, "epmoectl forward: %s is required (see epmoectl forward --help)\n",
                missing);
        return CMD_USAGE;
    }
    if (a->local && a->entry) {
        fprintf(stderr, "epmoectl forward: --entry is for the cluster path (not --local)\n");
        return CMD_USAGE;
    }
    if (!a->local && (a->model || a->threads || a->device || a->gpu_gemm)) {
        fprintf(stderr,
                "epmoectl forward: %s is for --local only (the cluster's workers load "
                "the model the coordinator names)\n",
                a->model     ? "--model"
                : a->threads ? "--threads"
                : a->device  ? "--device"
                             : "--gpu-gemm");
        return CMD_USAGE;
    }
    mb_device_kind kind;
    int ordinal;
    ep_err err;
    if (a->device && mb_parse_device(a->device, &kind, &ordinal, &err) < 0) {
        fprintf(stderr, "epmoectl forward: --device: %s\n", err.msg);
        return CMD_USAGE;
    }
    if (a->gpu_gemm && strcmp(a->gpu_gemm, "exact") != 0 && strcmp(a->gpu_gemm, "fast") != 0) {
        fprintf(stderr, "epmoectl forward: --gpu-gemm %s: expected exact or fast\n", a->gpu_gemm);
        return CMD_USAGE;
    }
    return -1;
}

/* config.json of DIR: 66 when DIR or the file is missing, 78 when it does not validate. */
static int fwd_config(const char *dir, mc_config *c)
{
    char path[EP_MAX_PATH];
    struct stat sb;
    ep_err err = {0};
    if (stat(dir, &sb) != 0) {
        fprintf(stderr, "epmoectl forward: model directory %s: %s\n", dir, strerror(errno));
        return CMD_NOINPUT;
    }
    if (!S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "epmoectl forward: model directory %s: not a directory\n", dir);
        return CMD_NOINPUT;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "epmoectl forward: %s: %s\n", path, strerror(errno));
        return CMD_NOINPUT;
    }
    if (mc_load(path, c, &err) < 0) {
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
        return CMD_CONFIG;
    }
    return CMD_OK;
}

typedef struct fwd_load {
    const char *name;
    uint64_t total;
} fwd_load;

static void fwd_progress(void *ctx, uint64_t done)
{
    const fwd_load *p = ctx;
    fprintf(stderr, "\rloading %s: %3d%%", p->name, p->total ? (int)(done * 100 / p->total) : 100);
    if (done >= p->total)
        fprintf(stderr, "\n");
}

static void fwd_report(const cmd_ctx *ctx, const fwd_args *a, const char *layer, int T, int k,
                       double load_s, uint64_t load_bytes, double run_s)
{
    double gbps = load_s > 0 ? (double)load_bytes / load_s / 1e9 : 0.0;
    if (ctx->output == CMD_OUT_JSON) {
        json_t *j = json_pack("{s:i,s:s,s:s,s:i,s:i,s:f,s:I,s:f,s:f}", "schema", 1, "layer", layer,
                              "output", a->output, "tokens", T, "topk", k, "load_seconds", load_s,
                              "load_bytes", (json_int_t)load_bytes, "load_gbps", gbps,
                              "forward_seconds", run_s);
        show_json_line(j);
        return;
    }
    printf("%s: %d tokens through %s (top-%d) in %.3f s (load %.3f s, %.2f GB at %.2f GB/s)\n",
           a->output, T, layer, k, run_s, load_s, (double)load_bytes / 1e9, gbps);
}

/* The layer named by --layer (its canonical name in name) and the validated input; an epmoectl
 * exit code. Shared by the local and the cluster path so both accept and refuse the same. */
static int fwd_prepare(const mc_config *c, const fwd_args *a, int *layer, char *name, size_t cap,
                       fwdio_input *in)
{
    ep_err err = {0};
    if (ck_layer_parse(c, a->layer, layer, &err) < 0) {
        fprintf(stderr, "epmoectl forward: --layer: %s\n", err.msg);
        return CMD_USAGE;
    }
    int nl = ck_layer_prefix(c, *layer, name, cap);
    if (nl > 0)
        name[nl - 1] = '\0'; /* "layers.3." -> "layers.3" */
    int rc = fwdio_read(a->input, c, *layer, in, &err);
    if (rc != CMD_OK)
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
    return rc;
}

/* The CUDA backend's tuning from the knobs main read (a ctx without them: the defaults). */
static mb_cuda_tuning fwd_cuda_tuning(const cmd_ctx *ctx)
{
    mb_cuda_tuning t = {0};
    if (ctx->knobs)
        mb_cuda_tuning_from_knobs(&t, ctx->knobs);
    return t;
}

static int fwd_local(const cmd_ctx *ctx, const fwd_args *a)
{
    mc_config c;
    int rc = fwd_config(a->model, &c);
    if (rc != CMD_OK)
        return rc;
    ep_err err = {0};
    int layer;
    char name[EP_MAX_NAME];
    fwdio_input in;
    if ((rc = fwd_prepare(&c, a, &layer, name, sizeof name, &in)) != CMD_OK)
        return rc;
    st_model *m = NULL;
    mb_backend *be = NULL;
    mb_layer *l = NULL;
    int k = c.num_experts_per_tok;
    uint16_t *out = malloc((size_t)in.T * (size_t)c.hidden_size * sizeof(uint16_t));
    int32_t *ids = malloc((size_t)in.T * (size_t)k * sizeof(int32_t));
    float *w = malloc((size_t)in.T * (size_t)k * sizeof(float));
    if (!out || !ids || !w) {
        fprintf(stderr, "epmoectl forward: out of memory for %d tokens\n", in.T);
        rc = CMD_SOFTWARE;
        goto out;
    }
    mb_options bo = {.device = a->device ? a->device : "cpu",
                     .threads = a->threads,
                     .gemm = a->gpu_gemm && strcmp(a->gpu_gemm, "fast") == 0 ? MB_GEMM_FAST
                                                                             : MB_GEMM_EXACT,
                     .cuda = fwd_cuda_tuning(ctx)};
    if (!(be = mb_create(&bo, &err))) {
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
        rc = CMD_UNAVAILABLE;
        goto out;
    }
    double t0 = clk_mono_s();
    fwd_load prog = {.name = name};
    if ((m = st_model_open(a->model, &err)) != NULL) {
        prog.total = shard_layer_bytes(m, &c, layer, NULL, NULL, false);
        l = shard_load_layer(be, m, &c, layer, NULL, NULL,
                             isatty(STDERR_FILENO) ? fwd_progress : NULL, &prog, &err);
    }
    if (!l) {
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
        rc = CMD_DATAERR;
        goto out;
    }
    double t1 = clk_mono_s();
    if (mb_forward(be, l, in.T, in.x, in.ids, out, ids, w, &err) < 0) {
        /* the input was validated; what is left is bad checkpoint data (a tid2eid entry) */
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
        rc = CMD_DATAERR;
        goto out;
    }
    double t2 = clk_mono_s();
    if ((rc = fwdio_write(a->output, in.T, c.hidden_size, k, out, ids, w, &err)) != CMD_OK) {
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
        goto out;
    }
    fwd_report(ctx, a, name, in.T, k, t1 - t0, prog.total, t2 - t1);
out:
    mb_layer_free(&l);
    mb_destroy(&be);
    st_model_close(&m);
    fwdio_input_free(&in);
    free(out);
    free(ids);
    free(w);
    return rc;
}

/* ---- the cluster path (libepmoe: the serving path, docs/client.md) ---- */

/* epmoectl's exit code for a library status; the message names the cluster's error code. */
static int fwd_status(const epmoe_error *e)
{
    const char *code = NULL;
    if (e->remote_code > 0) {
        code = wire_code_name(e->remote_code, NULL);
    } else if (e->code == EPMOE_ETIMEDOUT) {
        code = "ERR_TIMEOUT";
    } else if (e->code == EPMOE_ENOTREADY) {
        code = "ERR_NOT_READY";
    }
    fprintf(stderr, "epmoectl forward: %s%s%s\n", code ? code : "", code ? ": " : "", e->message);
    switch (e->code) {
    case EPMOE_EUNAVAILABLE:
        return CMD_UNAVAILABLE;
    case EPMOE_EREFUSED:
        return CMD_NOPERM;
    case EPMOE_EPROTO:
        return CMD_PROTOCOL;
    case EPMOE_EINVAL:
        return e->remote_code ? CMD_FAILED : CMD_USAGE;
    default:
        return CMD_FAILED;
    }
}

/* The Z85 text of a key file's public and secret keys (ctl/rpc.c reads the same files). */
static int fwd_keys(const cmd_ctx *ctx, char *pub, char *sec, char *server, epmoe_options *o)
{
    if (ctx->key_path == NULL)
        return CMD_OK;
    auth_keypair kp;
    uint8_t srv[AUTH_KEY_BYTES];
    ep_err err = {0};
    if (auth_load_secret(ctx->key_path, &kp, &err) != 0 ||
        (ctx->server_key_path && auth_load_public(ctx->server_key_path, srv, &err) != 0)) {
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
        return CMD_CONFIG;
    }
    auth_z85(kp.pub, pub);
    auth_z85(kp.sec, sec);
    explicit_bzero(&kp, sizeof kp);
    o->client_public_key = pub;
    o->client_secret_key = sec;
    if (ctx->server_key_path) {
        auth_z85(srv, server);
        o->server_key = server;
    }
    return CMD_OK;
}

static void fwd_cluster_report(const cmd_ctx *ctx, const fwd_args *a, const char *layer, int T,
                               int k, const epmoe_request_info *ri)
{
    if (ctx->output == CMD_OUT_JSON) {
        json_t *j =
            json_pack("{s:i,s:s,s:s,s:i,s:i,s:f,s:s,s:I,s:s,s:b,s:b}", "schema", 1, "layer", layer,
                      "output", a->output, "tokens", T, "topk", k, "forward_seconds", ri->total_s,
                      "coordinator", ctx->coordinator, "epoch", (json_int_t)ri->epoch, "entry",
                      ri->entry, "replayed", ri->replayed != 0, "resent", ri->resent != 0);
        show_json_line(j);
        return;
    }
    printf(
        "%s: %d tokens through %s (top-%d) on the cluster in %.3f s (entry %s, epoch %llu%s%s)\n",
        a->output, T, layer, k, ri->total_s, ri->entry, (unsigned long long)ri->epoch,
        ri->replayed ? ", replayed" : "", ri->resent ? ", resent" : "");
}

static int fwd_cluster(const cmd_ctx *ctx, const fwd_args *a)
{
    char pub[AUTH_Z85_LEN + 1], sec[AUTH_Z85_LEN + 1], server[AUTH_Z85_LEN + 1];
    epmoe_options o = {.size = sizeof o,
                       .version = EPMOE_OPTIONS_VERSION,
                       .coordinator = ctx->coordinator,
                       .entry = a->entry,
                       .max_in_flight = 1,
                       .timeout_ms = ctx->timeout_ms > 0 ? (uint32_t)ctx->timeout_ms : 0,
                       .connect_timeout_ms = ctx->timeout_ms > 0 ? (uint32_t)ctx->timeout_ms : 0};
    if (ctx->knobs && ctx->knobs->test_no_failover)
        o.resend_ms = UINT32_MAX; /* EPMOE_TEST_NO_FAILOVER: never resent to another entry */
    int rc = fwd_keys(ctx, pub, sec, server, &o);
    if (rc != CMD_OK)
        return rc;
    epmoe_client *cl = NULL;
    epmoe_error e = {0};
    if (epmoe_open(&o, &cl, &e) != EPMOE_OK)
        return fwd_status(&e);
    explicit_bzero(sec, sizeof sec);
    epmoe_info info;
    if (epmoe_info_get(cl, &info, &e) != EPMOE_OK) {
        epmoe_close(&cl);
        return fwd_status(&e);
    }
    mc_config c = fwdio_config_of(&info);
    int layer;
    char name[EP_MAX_NAME];
    fwdio_input in;
    if ((rc = fwd_prepare(&c, a, &layer, name, sizeof name, &in)) != CMD_OK) {
        epmoe_close(&cl);
        return rc;
    }
    size_t T = (size_t)in.T, H = (size_t)c.hidden_size, k = (size_t)c.num_experts_per_tok;
    uint16_t *out = malloc(T * H * 2);
    int32_t *ids = malloc(T * k * 4);
    float *w = malloc(T * k * 4);
    epmoe_request *rq = NULL;
    epmoe_submit_args sa = {.size = sizeof(epmoe_submit_args),
                            .version = EPMOE_SUBMIT_ARGS_VERSION,
                            .hidden_size = (uint32_t)H,
                            .layer = (uint32_t)layer,
                            .n_tokens = (uint32_t)in.T,
                            .hidden = in.x,
                            .token_ids = mc_layer_is_hash(&c, layer) ? in.ids : NULL,
                            .out = out,
                            .topk_ids = ids,
                            .topk_weights = w};
    ep_err err = {0};
    if (!out || !ids || !w) {
        fprintf(stderr, "epmoectl forward: out of memory for %zu tokens\n", T);
        rc = CMD_SOFTWARE;
    } else if (epmoe_submit(cl, &sa, &rq, &e) != EPMOE_OK || epmoe_wait(rq, -1, &e) != EPMOE_OK) {
        rc = fwd_status(&e);
    } else if ((rc = fwdio_write(a->output, in.T, c.hidden_size, (int)k, out, ids, w, &err)) !=
               CMD_OK) {
        fprintf(stderr, "epmoectl forward: %s\n", err.msg);
    } else {
        epmoe_request_info ri;
        epmoe_request_status(rq, &ri);
        fwd_cluster_report(ctx, a, name, in.T, (int)k, &ri);
    }
    epmoe_request_free(&rq);
    epmoe_close(&cl);
    fwdio_input_free(&in);
    free(out);
    free(ids);
    free(w);
    return rc;
}

int cmd_forward(const cmd_ctx *ctx, int argc, char **argv)
{
    fwd_args a = {0};
    int rc = fwd_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    return a.local ? fwd_local(ctx, &a) : fwd_cluster(ctx, &a);
}
