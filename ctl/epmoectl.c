/*
 * epmoectl — the operator's tool: admin RPC to a running coordinator, and offline tools that
 * work on checkpoints and tensors directly (mkmodel, inspect, forward --local).
 *
 * Usage: epmoectl [-o table|wide|json|yaml] [--coordinator ENDPOINT] [--timeout MS]
 *                 [--key FILE --server-key FILE.pub] COMMAND [ARGS]
 *        epmoectl --version
 * Explicit beats implicit: a flag overrides $EPMOE_COORDINATOR (and $EPMOE_KEY,
 * $EPMOE_SERVER_KEY), which overrides the default. -o FORMAT may also follow the command;
 * every global option also takes the --option=VALUE form (kubectl's, etcdctl's).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/knobs.h"
#include "common/log.h"
#include "common/version.h"
#include "ctl/cmds.h"
#include "kernels/isa.h"

#define CTL_DEFAULT_TIMEOUT_MS 10000

/* The output formats a command takes (-o): the admin verbs all four, the offline tools the
 * table and JSON they always had. */
#define CTL_FMT_BASIC (1u << CMD_OUT_TABLE | 1u << CMD_OUT_JSON)
#define CTL_FMT_ALL   (CTL_FMT_BASIC | 1u << CMD_OUT_YAML | 1u << CMD_OUT_WIDE)

static const struct {
    const char *name;
    cmd_fn fn;
    unsigned formats;
    const char *summary;
} ctl_cmds[] = {
    {"mkmodel", cmd_mkmodel, CTL_FMT_BASIC, "write a synthetic DeepSeek V4 checkpoint"},
    {"keygen", cmd_keygen, CTL_FMT_BASIC,
     "write a CURVE key pair (NAME.key, NAME.pub) for security:"},
    {"inspect", cmd_inspect, CTL_FMT_BASIC,
     "show a checkpoint's resolved config and check its tensors"},
    {"mkinput", cmd_mkinput, CTL_FMT_BASIC,
     "write a random forward input (hidden_states, input_ids) for a model"},
    {"diff", cmd_diff, CTL_FMT_BASIC,
     "compare two forward outputs tensor by tensor (bit-identical?)"},
    {"forward", cmd_forward, CTL_FMT_BASIC,
     "run one MoE layer (on the cluster, or --local in this process)"},
    {"status", cmd_status, CTL_FMT_ALL,
     "the cluster's state and workers (--wait-ready waits for ready)"},
    {"workers", cmd_workers, CTL_FMT_ALL,
     "every worker with everything the coordinator knows about it"},
    {"shards", cmd_shards, CTL_FMT_ALL, "which experts each rank owns"},
    {"config", cmd_config, CTL_FMT_ALL, "the model config the coordinator broadcasts"},
    {"shutdown", cmd_shutdown, CTL_FMT_ALL, "stop the coordinator (workers get SHUTDOWN)"},
    {"drain", cmd_drain, CTL_FMT_ALL,
     "move a worker's experts to the others (then it can be stopped)"},
    {"undrain", cmd_undrain, CTL_FMT_ALL, "let a drained worker own experts again"},
    {"reload", cmd_reload, CTL_FMT_ALL,
     "make the coordinator re-read its cluster spec (like SIGHUP)"},
    {"rebalance", cmd_rebalance, CTL_FMT_ALL,
     "place experts by the measured load (EPLB), or --dry-run"},
};

static const char *const ctl_format_names[] = {"table", "json", "yaml", "wide"};

static void ctl_usage(FILE *out)
{
    fprintf(out, "usage: epmoectl [-o FORMAT] [--coordinator ENDPOINT] [--timeout MS]\n"
                 "                [--key FILE --server-key FILE.pub] COMMAND [ARGS]\n"
                 "       epmoectl --version\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof ctl_cmds / sizeof ctl_cmds[0]; i++)
        fprintf(out, "  %-10s %s\n", ctl_cmds[i].name, ctl_cmds[i].summary);
    fprintf(out,
            "\n'epmoectl COMMAND --help' describes a command.\n\n"
            "options (each also as --option=VALUE):\n"
            "  -o, --output FORMAT     table (default) or json (stable, schema 1); the admin\n"
            "                          commands also take yaml (the JSON's tree) and wide (the\n"
            "                          table with every column)\n"
            "  --coordinator ENDPOINT  admin endpoint (default $EPMOE_COORDINATOR or %s)\n"
            "  --timeout MS            what a command may wait for the coordinator, retries\n"
            "                          included (default %d)\n"
            "  --key FILE              this operator's secret key, for a coordinator with\n"
            "                          security: (default $EPMOE_KEY)\n"
            "  --server-key FILE.pub   the coordinator's public key (default $EPMOE_SERVER_KEY)\n"
            "  --version               print the version and build, exit 0\n"
            "\n"
            "exit codes: 0 ok, 1 request failed, 64 usage, 65 bad data or checkpoint, 66 no "
            "input,\n  69 coordinator unavailable, 70 internal error, 73 cannot create output, "
            "76 protocol\n  error, 77 the coordinator refused this key, 78 bad config or cluster "
            "spec\n",
            knob_find("EPMOE_COORDINATOR")->def, CTL_DEFAULT_TIMEOUT_MS);
    knob_usage(out, KNOB_CTL);
}

/* "-o json" / "--output=yaml": the output format, 0; -1 and a message when v is none. */
static int ctl_output(const char *v, cmd_ctx *ctx)
{
    for (size_t f = 0; f < sizeof ctl_format_names / sizeof ctl_format_names[0]; f++)
        if (strcmp(v, ctl_format_names[f]) == 0) {
            ctx->output = (cmd_output)f;
            return 0;
        }
    fprintf(stderr, "epmoectl: -o \"%s\": expected table, wide, json or yaml\n", v);
    return -1;
}

/* Take "-o FORMAT" (and "-oFORMAT", "--output FORMAT", "--output=FORMAT", except for forward,
 * whose --output is its output file) out of the command's arguments: -o may come before or
 * after the command. Returns the new argc, or -1. */
static int ctl_take_output(int argc, char **argv, cmd_ctx *ctx)
{
    bool output_is_file = strcmp(argv[0], "forward") == 0;
    int n = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool is_o = strcmp(a, "-o") == 0 || (!output_is_file && strcmp(a, "--output") == 0);
        if (is_o && i + 1 < argc) {
            if (ctl_output(argv[++i], ctx) != 0)
                return -1;
        } else if (strncmp(a, "-o", 2) == 0 && a[2] != '\0') {
            if (ctl_output(a + 2, ctx) != 0)
                return -1;
        } else if (!output_is_file && strncmp(a, "--output=", 9) == 0) {
            if (ctl_output(a + 9, ctx) != 0)
                return -1;
        } else {
            argv[n++] = argv[i];
        }
    }
    argv[n] = NULL;
    return n;
}

/* One global option with its value; CMD_OK or CMD_USAGE (with a message). */
static int ctl_global_opt(const char *name, const char *v, cmd_ctx *ctx)
{
    if (strcmp(name, "-o") == 0 || strcmp(name, "--output") == 0)
        return ctl_output(v, ctx) == 0 ? CMD_OK : CMD_USAGE;
    if (strcmp(name, "--key") == 0) {
        ctx->key_path = v;
    } else if (strcmp(name, "--server-key") == 0) {
        ctx->server_key_path = v;
    } else if (strcmp(name, "--coordinator") == 0) {
        ctx->coordinator = v;
    } else if (strcmp(name, "--timeout") == 0) {
        char *end;
        long ms = strtol(v, &end, 10);
        if (v[0] == '\0' || *end != '\0' || ms < 1 || ms > 86400000) {
            fprintf(stderr, "epmoectl: --timeout \"%s\": expected milliseconds, 1..86400000\n", v);
            return CMD_USAGE;
        }
        ctx->timeout_ms = (int)ms;
    } else {
        fprintf(stderr, "epmoectl: unknown option %s (see epmoectl --help)\n", name);
        return CMD_USAGE;
    }
    return CMD_OK;
}

static bool ctl_known_global(const char *name)
{
    static const char *const known[] = {"-o",           "--output",      "--key",
                                        "--server-key", "--coordinator", "--timeout"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i]) == 0)
            return true;
    return false;
}

/* Parse global options ("--opt VALUE", "--opt=VALUE", "-oFORMAT"); returns the index of the
 * command, or -1 with the exit code set. */
static int ctl_parse_global(int argc, char **argv, cmd_ctx *ctx, int *rc)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        char name[32];
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            ctl_usage(stdout);
            *rc = CMD_OK;
            return -1;
        }
        if (strcmp(a, "--version") == 0) {
            ep_version_print("epmoectl");
            *rc = CMD_OK;
            return -1;
        }
        if (eq && (size_t)(eq - a) < sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            *rc = ctl_global_opt(name, eq + 1, ctx);
        } else if (strncmp(a, "-o", 2) == 0 && a[2] != '\0') {
            *rc = ctl_global_opt("-o", a + 2, ctx);
        } else if (!ctl_known_global(a)) {
            *rc = ctl_global_opt(a, "", ctx); /* the unknown-option message */
        } else if (i + 1 >= argc) {
            fprintf(stderr, "epmoectl: option %s needs a value (see epmoectl --help)\n", a);
            *rc = CMD_USAGE;
        } else {
            *rc = ctl_global_opt(a, argv[++i], ctx);
        }
        if (*rc != CMD_OK)
            return -1;
    }
    if (i >= argc) {
        ctl_usage(stderr);
        *rc = CMD_USAGE;
        return -1;
    }
    return i;
}

int main(int argc, char **argv)
{
    knob_values kv;
    ep_err err = {0};
    if (knob_load(&kv, KNOB_CTL, &err) < 0) {
        fprintf(stderr, "epmoectl: %s\n", err.msg);
        return CMD_USAGE;
    }
    log_init("epmoectl", kv.debug, kv.journal_stream != NULL);
    /* the kernels read no environment: their ISA cap comes from the knobs (kernels/isa.h) */
    isa_set_cap(isa_cap_parse(kv.isa, kv.gemm));
    cmd_ctx ctx = {.output = CMD_OUT_TABLE,
                   .coordinator = kv.coordinator,
                   .key_path = kv.key,
                   .server_key_path = kv.server_key,
                   .knobs = &kv,
                   .timeout_ms = CTL_DEFAULT_TIMEOUT_MS,
                   .argv0 = argv[0]};
    int rc = CMD_OK;
    int ci = ctl_parse_global(argc, argv, &ctx, &rc);
    if (ci < 0)
        return rc;
    int cargc = ctl_take_output(argc - ci, argv + ci, &ctx);
    if (cargc < 0)
        return CMD_USAGE;
    for (size_t i = 0; i < sizeof ctl_cmds / sizeof ctl_cmds[0]; i++) {
        if (strcmp(argv[ci], ctl_cmds[i].name) != 0)
            continue;
        if (!(ctl_cmds[i].formats & 1u << ctx.output)) {
            fprintf(stderr,
                    "epmoectl %s: -o %s: expected table or json (yaml and wide are for "
                    "the admin commands)\n",
                    ctl_cmds[i].name, ctl_format_names[ctx.output]);
            return CMD_USAGE;
        }
        return ctl_cmds[i].fn(&ctx, cargc, argv + ci);
    }
    fprintf(stderr, "epmoectl: unknown command \"%s\" (see epmoectl --help)\n", argv[ci]);
    return CMD_USAGE;
}
