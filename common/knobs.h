/*
 * knobs.h — the environment variables epmoe reads, declared once (prefix knob_).
 *
 * One row per variable in knobs.c's table: name, type, default, range or choices, the programs
 * that read it, one line of doc (NCCL's NCCL_PARAM table). A program reads the environment
 * once, at the top of its main (knob_load), refuses a bad value there as a usage error, and
 * passes the values down as options: no module below a main reads the environment, so a kernel
 * never reads the environment per launch and a test sets a knob through the option, not setenv.
 *
 * docs/operations.md "Environment" lists exactly these rows, each line the one knob_doc_row
 * writes (test_knobs fails otherwise). An unset variable and an empty one mean the same: the
 * row's default. The systemd variables (JOURNAL_STREAM, NOTIFY_SOCKET, WATCHDOG_*) are rows too:
 * they are read here like ours, and their meaning stays with log.c and sdnotify.c.
 */
#ifndef EPMOE_KNOBS_H
#define EPMOE_KNOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/error.h"

/* Who reads a variable (a row's `progs`, knob_load's `prog`). */
typedef enum knob_prog {
    KNOB_WORKER = 1 << 0,      /* epmoe-worker */
    KNOB_COORDINATOR = 1 << 1, /* epmoe-coordinator */
    KNOB_CTL = 1 << 2,         /* epmoectl (forward --local runs the kernels too) */
    KNOB_PYTHON = 1 << 3,      /* the Python package: documented here, read by Python */
    KNOB_EXAMPLE = 1 << 4,     /* examples/client_example.c */
} knob_prog;

typedef enum knob_type {
    KNOB_STR,    /* text (a path, an endpoint): const char *, NULL when unset */
    KNOB_CHOICE, /* one of the row's choices: const char *, NULL when unset */
    KNOB_BOOL,   /* 0 or 1: bool */
    KNOB_INT,    /* an integer in [lo, hi]: int */
    KNOB_DOUBLE, /* a number in [lo, hi]: double */
    KNOB_SUBSYS, /* comma list of log.h's debug subsystems, or "all": unsigned log_sub mask */
} knob_type;

typedef struct knob_def {
    const char *name;
    knob_type type;
    const char *def;  /* the value unset means, as text parsed like a set one; NULL: none */
    const char *what; /* KNOB_CHOICE: "ref|avx2|avx512"; KNOB_STR: what the text is */
    double lo, hi;    /* KNOB_INT, KNOB_DOUBLE: the range, both ends included */
    unsigned progs;   /* knob_prog bits */
    ptrdiff_t at;     /* offsetof its knob_values field; -1: no C program reads it */
    const char *doc;  /* one line: what it does, and what unset means when def is NULL */
} knob_def;

/* Every value a C program reads, filled by knob_load (the rows its prog reads; the others stay
 * zero). Strings point into the environment: valid while it is not changed. */
typedef struct knob_values {
    /* every program */
    unsigned debug;             /* EPMOE_DEBUG: log_sub bits */
    const char *journal_stream; /* JOURNAL_STREAM: set when stderr is the journal */
    /* the daemons under systemd (sdnotify.h) */
    const char *notify_socket, *watchdog_usec, *watchdog_pid;
    /* the CPU kernels (worker, epmoectl forward --local) */
    const char *isa;  /* EPMOE_ISA: "ref", "avx2", "avx512"; NULL: the widest the CPU has */
    const char *gemm; /* EPMOE_GEMM: "ref" or NULL */
    /* the CUDA backend (worker, epmoectl forward --local on cuda:N) */
    const char *cuda_module;   /* EPMOE_CUDA_MODULE: NULL: the loader's libepmoe_cuda.so */
    const char *cuda_exact;    /* EPMOE_CUDA_EXACT: "ref" or NULL */
    const char *cuda_cublaslt; /* EPMOE_CUDA_CUBLASLT: "0", "1", "require"; NULL: by rows */
    int cuda_cublaslt_rows;    /* EPMOE_CUDA_CUBLASLT_ROWS */
    int cuda_fast_rows;        /* EPMOE_CUDA_FAST_ROWS */
    int cuda_split;            /* EPMOE_CUDA_SPLIT */
    double cuda_wait_s;        /* EPMOE_CUDA_WAIT_S */
    int cuda_stage_bytes;      /* EPMOE_CUDA_STAGE_BYTES */
    /* the worker */
    const char *coordinator_listen; /* EPMOE_COORDINATOR_LISTEN: --coordinator's default */
    bool metrics_per_layer;         /* EPMOE_METRICS_PER_LAYER */
    bool test_no_failover;          /* EPMOE_TEST_NO_FAILOVER (worker and epmoectl; tests) */
    const char *nccl_library;       /* EPMOE_NCCL_LIBRARY */
    /* epmoectl */
    const char *coordinator; /* EPMOE_COORDINATOR: --coordinator's default */
    const char *key;         /* EPMOE_KEY: --key's default, NULL: none */
    const char *server_key;  /* EPMOE_SERVER_KEY: --server-key's default, NULL: none */
} knob_values;

/* The table, in the order docs/operations.md lists it. */
const knob_def *knob_table(size_t *n);

/* The row of `name`, or NULL. */
const knob_def *knob_find(const char *name);

/* Read every row `prog` reads from the environment into *v (defaults for the unset ones).
 * Returns 0, or -1 with "NAME=VALUE: expected ..." in err for a value outside its row's type,
 * range or choices (main reports it as a usage error). */
int knob_load(knob_values *v, unsigned prog, ep_err *err);

/* Parse one row's text into *v (what knob_load does per row; a test's way to set a knob). */
int knob_set(knob_values *v, const knob_def *k, const char *text, ep_err *err);

/* The docs/operations.md "Environment" table line of row k (no newline) into buf. */
void knob_doc_row(const knob_def *k, char *buf, size_t cap);

/* The "environment:" lines of `prog`'s --help: every row it reads, with its values. */
void knob_usage(FILE *out, unsigned prog);

#endif
