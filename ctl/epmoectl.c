/*
 * epmoectl — the operator's tool: admin RPC to a running coordinator, and offline tools that
 * work on checkpoints and tensors directly (mkmodel, inspect, forward --local).
 *
 * Usage: epmoectl [-o table|json] [--coordinator ENDPOINT] [--timeout MS] COMMAND [ARGS]
 * Explicit beats implicit: a flag overrides $EPMOE_COORDINATOR, which overrides the default.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "ctl/cmds.h"

#define CTL_DEFAULT_COORDINATOR "tcp://127.0.0.1:7401"
#define CTL_DEFAULT_TIMEOUT_MS  10000

static const struct {
    const char *name;
    cmd_fn fn;
    const char *summary;
} ctl_cmds[] = {
    {"mkmodel", cmd_mkmodel, "write a synthetic DeepSeek V4 checkpoint"},
    {"inspect", cmd_inspect, "show a checkpoint's resolved config and check its tensors"},
    {"mkinput", cmd_mkinput, "write a random forward input (hidden_states, input_ids) for a model"},
    {"diff", cmd_diff, "compare two forward outputs tensor by tensor (bit-identical?)"},
    {"forward", cmd_forward, "run one MoE layer (on the cluster, or --local in this process)"},
    {"status", cmd_status, "the cluster's state and workers (--wait-ready waits for ready)"},
    {"workers", cmd_workers, "every worker with everything the coordinator knows about it"},
    {"shards", cmd_shards, "which experts each rank owns"},
    {"config", cmd_config, "the model config the coordinator broadcasts"},
    {"shutdown", cmd_shutdown, "stop the coordinator (workers get SHUTDOWN)"},
    {"drain", cmd_drain, "move a worker's experts to the others (then it can be stopped)"},
    {"undrain", cmd_undrain, "let a drained worker own experts again"},
    {"reload", cmd_reload, "make the coordinator re-read its cluster spec (like SIGHUP)"},
    {"rebalance", cmd_rebalance, "place experts by the measured load (EPLB), or --dry-run"},
};

static void ctl_usage(FILE *out)
{
    fprintf(out, "usage: epmoectl [-o table|json] [--coordinator ENDPOINT] [--timeout MS] "
                 "COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof ctl_cmds / sizeof ctl_cmds[0]; i++)
        fprintf(out, "  %-10s %s\n", ctl_cmds[i].name, ctl_cmds[i].summary);
    fprintf(out,
            "\n'epmoectl COMMAND --help' describes a command.\n\n"
            "options:\n"
            "  -o, --output FORMAT     table (default) or json (stable, schema 1)\n"
            "  --coordinator ENDPOINT  admin endpoint (default $EPMOE_COORDINATOR or %s)\n"
            "  --timeout MS            RPC timeout (default %d)\n\n"
            "exit codes: 0 ok, 1 request failed, 64 usage, 65 bad data or checkpoint, 66 no "
            "input,\n  69 coordinator unavailable, 70 internal error, 73 cannot create output, "
            "76 protocol\n  error, 78 bad config or cluster spec\n",
            CTL_DEFAULT_COORDINATOR, CTL_DEFAULT_TIMEOUT_MS);
}

/* Parse global options; returns the index of the command, or -1 with the exit code set. */
static int ctl_parse_global(int argc, char **argv, cmd_ctx *ctx, int *rc)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            ctl_usage(stdout);
            *rc = CMD_OK;
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "epmoectl: option %s needs a value\n", a);
            *rc = CMD_USAGE;
            return -1;
        }
        const char *v = argv[++i];
        if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (strcmp(v, "json") == 0)
                ctx->output = CMD_OUT_JSON;
            else if (strcmp(v, "table") == 0)
                ctx->output = CMD_OUT_TABLE;
            else {
                fprintf(stderr, "epmoectl: -o %s: expected table or json\n", v);
                *rc = CMD_USAGE;
                return -1;
            }
        } else if (strcmp(a, "--coordinator") == 0) {
            ctx->coordinator = v;
        } else if (strcmp(a, "--timeout") == 0) {
            char *end;
            long ms = strtol(v, &end, 10);
            if (*end != '\0' || ms < 1 || ms > 86400000) {
                fprintf(stderr, "epmoectl: --timeout %s: expected milliseconds, 1..86400000\n", v);
                *rc = CMD_USAGE;
                return -1;
            }
            ctx->timeout_ms = (int)ms;
        } else {
            fprintf(stderr, "epmoectl: unknown option %s (see epmoectl --help)\n", a);
            *rc = CMD_USAGE;
            return -1;
        }
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
    log_init("epmoectl");
    cmd_ctx ctx = {.output = CMD_OUT_TABLE,
                   .coordinator = getenv("EPMOE_COORDINATOR"),
                   .timeout_ms = CTL_DEFAULT_TIMEOUT_MS,
                   .argv0 = argv[0]};
    if (ctx.coordinator == NULL || ctx.coordinator[0] == '\0')
        ctx.coordinator = CTL_DEFAULT_COORDINATOR;
    int rc = CMD_OK;
    int ci = ctl_parse_global(argc, argv, &ctx, &rc);
    if (ci < 0)
        return rc;
    for (size_t i = 0; i < sizeof ctl_cmds / sizeof ctl_cmds[0]; i++)
        if (strcmp(argv[ci], ctl_cmds[i].name) == 0)
            return ctl_cmds[i].fn(&ctx, argc - ci, argv + ci);
    fprintf(stderr, "epmoectl: unknown command \"%s\" (see epmoectl --help)\n", argv[ci]);
    return CMD_USAGE;
}
