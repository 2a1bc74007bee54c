/*
 * cmds.h — the subcommands of epmoectl (prefix cmd_).
 *
 * Each subcommand lives in its own file ctl/cmd_<name>.c and has the signature of cmd_fn: it
 * parses its own arguments (argv[0] is the subcommand name), prints results to stdout and
 * errors to stderr, and returns an exit code from the table below. Global options (-o,
 * --coordinator) are parsed by epmoectl.c and passed in cmd_ctx.
 *
 * Exit codes (documented in --help and docs/operations.md; sysexits(3) values):
 */
#ifndef EPMOE_CTL_CMDS_H
#define EPMOE_CTL_CMDS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/moe_backend.h"

enum {
    CMD_OK = 0,           /* success */
    CMD_FAILED = 1,       /* the request was valid but failed (check failed, step failed) */
    CMD_USAGE = 64,       /* EX_USAGE: bad command line */
    CMD_DATAERR = 65,     /* EX_DATAERR: bad input file, inconsistent checkpoint */
    CMD_NOINPUT = 66,     /* EX_NOINPUT: an input file or directory does not exist */
    CMD_UNAVAILABLE = 69, /* EX_UNAVAILABLE: the coordinator did not answer */
    CMD_SOFTWARE = 70,    /* EX_SOFTWARE: internal error */
    CMD_CANTCREAT = 73,   /* EX_CANTCREAT: an output file cannot be written */
    CMD_PROTOCOL = 76,    /* EX_PROTOCOL: the coordinator answered something unexpected */
    CMD_NOPERM = 77,      /* EX_NOPERM: the coordinator refused this client's key */
    CMD_CONFIG = 78,      /* EX_CONFIG: bad config.json or cluster spec */
};

/* -o: table (people), wide (the table with every column), json and yaml (the same documented
 * tree, schema 1). Only the admin verbs take wide and yaml; epmoectl.c refuses them for the
 * offline tools. */
typedef enum cmd_output { CMD_OUT_TABLE, CMD_OUT_JSON, CMD_OUT_YAML, CMD_OUT_WIDE } cmd_output;

typedef struct cmd_ctx {
    cmd_output output;       /* -o FORMAT (before or after the command) */
    const char *coordinator; /* --coordinator ENDPOINT (admin socket), or $EPMOE_COORDINATOR */
    int timeout_ms;          /* --timeout MS: what one request may take, retries included */
    int64_t deadline_ms;     /* CLOCK_MONOTONIC ms by which a command of several requests must be
                                done (0: each request gets timeout_ms from its start) */
    const char *argv0;       /* path of the epmoectl binary (finds sibling tools) */
    int64_t max_msg;         /* ZMQ_MAXMSGSIZE of a reply frame (0: EP_MAX_CTRL_MSG); forward sets
                                the model's (mmsg_max_frame) once it knows the config */
    /* Security (NULL: none): --key / $EPMOE_KEY and --server-key / $EPMOE_SERVER_KEY, read
     * by ctl/rpc.c when a command talks to the coordinator. */
    const char *key_path;
    const char *server_key_path;
    /* The environment main read (common/knobs.h): the kernel knobs forward --local passes to
     * its backend. */
    const struct knob_values *knobs;
} cmd_ctx;

typedef int (*cmd_fn)(const cmd_ctx *ctx, int argc, char **argv);

/* offline tools */
int cmd_keygen(const cmd_ctx *ctx, int argc, char **argv);
int cmd_mkmodel(const cmd_ctx *ctx, int argc, char **argv);
int cmd_inspect(const cmd_ctx *ctx, int argc, char **argv);
int cmd_mkinput(const cmd_ctx *ctx, int argc, char **argv);
int cmd_diff(const cmd_ctx *ctx, int argc, char **argv);
int cmd_forward(const cmd_ctx *ctx, int argc, char **argv);

/* admin RPC to the coordinator (ctl/cmd_admin.c) */
int cmd_status(const cmd_ctx *ctx, int argc, char **argv);
int cmd_workers(const cmd_ctx *ctx, int argc, char **argv);
int cmd_shards(const cmd_ctx *ctx, int argc, char **argv);
int cmd_config(const cmd_ctx *ctx, int argc, char **argv);
int cmd_shutdown(const cmd_ctx *ctx, int argc, char **argv);
int cmd_drain(const cmd_ctx *ctx, int argc, char **argv);
int cmd_undrain(const cmd_ctx *ctx, int argc, char **argv);
int cmd_reload(const cmd_ctx *ctx, int argc, char **argv);
int cmd_rebalance(const cmd_ctx *ctx, int argc, char **argv);

#endif
