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
    CMD_CONFIG = 78,      /* EX_CONFIG: bad config.json or cluster spec */
};

typedef enum cmd_output { CMD_OUT_TABLE, CMD_OUT_JSON } cmd_output;

typedef struct cmd_ctx {
    cmd_output output;       /* -o table|json */
    const char *coordinator; /* --coordinator ENDPOINT (admin socket), or $EPMOE_COORDINATOR */
    int timeout_ms;          /* --timeout MS for RPCs */
    const char *argv0;       /* path of the epmoectl binary (finds sibling tools) */
} cmd_ctx;

typedef int (*cmd_fn)(const cmd_ctx *ctx, int argc, char **argv);

/* offline tools */
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
