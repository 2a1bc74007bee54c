/* knobs.c — see knobs.h. The table is the one list: the docs and --help are written from it. */
#include "common/knobs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define KV(field)    ((ptrdiff_t)offsetof(knob_values, field))
#define KNOB_KERNELS (KNOB_WORKER | KNOB_CTL)
#define KNOB_DAEMONS (KNOB_WORKER | KNOB_COORDINATOR)
#define KNOB_ALL     (KNOB_WORKER | KNOB_COORDINATOR | KNOB_CTL)

static const knob_def knob_rows[] = {
    {"EPMOE_DEBUG", KNOB_SUBSYS, NULL, NULL, 0, 0, KNOB_ALL, KV(debug),
     "adds the debug lines of these subsystems to the log; unset: none"},
    {"EPMOE_ISA", KNOB_CHOICE, NULL, "ref|avx2|avx512", 0, 0, KNOB_KERNELS, KV(isa),
     "caps the CPU kernels' instruction set (same bits, only speed differs; a cap above the "
     "CPU's runs the widest it has); unset: the widest the CPU has"},
    {"EPMOE_GEMM", KNOB_CHOICE, NULL, "ref", 0, 0, KNOB_KERNELS, KV(gemm),
     "the older spelling of EPMOE_ISA=ref: plain-C kernels; unset: see EPMOE_ISA"},
    {"EPMOE_METRICS_PER_LAYER", KNOB_BOOL, "0", NULL, 0, 0, KNOB_WORKER, KV(metrics_per_layer),
     "1: step histograms by layer and expert pairs by (layer, expert): thousands of series "
     "instead of about 110"},
    {"EPMOE_TEST_NO_FAILOVER", KNOB_BOOL, "0", NULL, 0, 0, KNOB_WORKER | KNOB_CTL,
     KV(test_no_failover),
     "tests only: 1 turns the serving path's fault tolerance off (an entry fails a request "
     "where it would replay it; epmoectl forward never resends), to measure what it costs"},
    {"EPMOE_COORDINATOR_LISTEN", KNOB_STR, NULL, "an endpoint", 0, 0, KNOB_WORKER,
     KV(coordinator_listen),
     "the worker's --coordinator when the option is not given (the systemd unit's "
     "worker.env sets it)"},
    {"EPMOE_NCCL_LIBRARY", KNOB_STR, "libnccl.so.2", "a path", 0, 0, KNOB_WORKER, KV(nccl_library),
     "the NCCL library the nccl data plane opens (dlopen) when a GPU worker "
     "starts"},
    {"EPMOE_CUDA_MODULE", KNOB_STR, NULL, "a path", 0, 0, KNOB_KERNELS, KV(cuda_module),
     "epmoe's CUDA module for cuda:N devices; unset: libepmoe_cuda.so through the "
     "binary's RUNPATH and the loader's path"},
    {"EPMOE_CUDA_EXACT", KNOB_CHOICE, NULL, "ref", 0, 0, KNOB_KERNELS, KV(cuda_exact),
     "ref: the exact GEMM mode runs the plain reference kernels (same results, slower; for "
     "diagnosis); unset: the exact kernels"},
    {"EPMOE_CUDA_CUBLASLT", KNOB_CHOICE, NULL, "0|1|require", 0, 0, KNOB_KERNELS, KV(cuda_cublaslt),
     "cuBLASLt for fast-mode FP8 GEMMs: 0 never, 1 wherever it fits, require: fail the step "
     "rather than fall back (tests); unset: from EPMOE_CUDA_CUBLASLT_ROWS rows per expert"},
    {"EPMOE_CUDA_CUBLASLT_ROWS", KNOB_INT, "96", NULL, 0, 1 << 20, KNOB_KERNELS,
     KV(cuda_cublaslt_rows),
     "with EPMOE_CUDA_CUBLASLT unset, the average rows per expert from which a fast-mode FP8 "
     "GEMM uses cuBLASLt"},
    {"EPMOE_CUDA_FAST_ROWS", KNOB_INT, "16", NULL, 0, 1 << 20, KNOB_KERNELS, KV(cuda_fast_rows),
     "fast-mode GEMMs with at most this many rows per expert run the weight-streaming row "
     "kernels instead of tensor cores"},
    {"EPMOE_CUDA_SPLIT", KNOB_INT, "4", NULL, 1, 16, KNOB_KERNELS, KV(cuda_split),
     "the most ways the row kernels split a weight row over threads when the grid is small "
     "(4 or 16 where the blocks divide; same results, 16 not yet measured)"},
    {"EPMOE_CUDA_WAIT_S", KNOB_DOUBLE, "120", NULL, 0.01, 3600, KNOB_KERNELS, KV(cuda_wait_s),
     "seconds the CUDA backend waits for the device before a step fails instead of hanging"},
    {"EPMOE_CUDA_STAGE_BYTES", KNOB_INT, "33554432", NULL, 4096, 1 << 30, KNOB_KERNELS,
     KV(cuda_stage_bytes),
     "bytes of each of the two pinned buffers a GPU worker stages its shard through (whole "
     "256-byte units; small ones for tests)"},
    {"EPMOE_COORDINATOR", KNOB_STR, "tcp://127.0.0.1:7401", "an endpoint", 0, 0, KNOB_CTL,
     KV(coordinator), "epmoectl's --coordinator (the admin endpoint) when the option is not given"},
    {"EPMOE_KEY", KNOB_STR, NULL, "a path", 0, 0, KNOB_CTL, KV(key),
     "epmoectl's --key (this operator's secret key) when the option is not given; unset: none"},
    {"EPMOE_SERVER_KEY", KNOB_STR, NULL, "a path", 0, 0, KNOB_CTL, KV(server_key),
     "epmoectl's --server-key (the coordinator's public key) when the option is not given; "
     "unset: none"},
    {"JOURNAL_STREAM", KNOB_STR, NULL, "set by systemd", 0, 0, KNOB_ALL, KV(journal_stream),
     "set: stderr is the journal, so log lines carry `<N>` priority prefixes"},
    {"NOTIFY_SOCKET", KNOB_STR, NULL, "set by systemd", 0, 0, KNOB_DAEMONS, KV(notify_socket),
     "where the daemons send READY=1, STATUS=, WATCHDOG=1 (sd_notify); unset: no notifications"},
    {"WATCHDOG_USEC", KNOB_STR, NULL, "set by systemd", 0, 0, KNOB_DAEMONS, KV(watchdog_usec),
     "WatchdogSec= in microseconds: the daemons send WATCHDOG=1 every half of it"},
    {"WATCHDOG_PID", KNOB_STR, NULL, "set by systemd", 0, 0, KNOB_DAEMONS, KV(watchdog_pid),
     "the process WATCHDOG_USEC is meant for (an inherited one is ignored)"},
    {"EPMOE_LIBRARY", KNOB_STR, NULL, "a path", 0, 0, KNOB_PYTHON, -1,
     "the libepmoe.so.0 the Python package opens (and records at install); unset: the "
     "recorded one, then the loader's"},
    {"EPMOE_CTL", KNOB_STR, NULL, "a path", 0, 0, KNOB_PYTHON, -1,
     "the epmoectl epmoe.Admin runs (and pip install records); unset: EPMOE_BUILD_DIR's, "
     "the recorded one, then PATH"},
    {"EPMOE_BUILD_DIR", KNOB_STR, NULL, "a path", 0, 0, KNOB_PYTHON, -1,
     "a build tree whose ctl/epmoectl and daemons the Python package uses"},
    {"EPMOE_KEEP", KNOB_STR, NULL, "any text", 0, 0, KNOB_PYTHON, -1,
     "set: epmoe.Local keeps the directory it made for its cluster (for a post-mortem)"},
    {"EPMOE_CLIENT_SECRET", KNOB_STR, NULL, "Z85 text", 0, 0, KNOB_EXAMPLE, -1,
     "the example client's secret key, for a cluster with security:"},
    {"EPMOE_SERVER_PUBLIC", KNOB_STR, NULL, "Z85 text", 0, 0, KNOB_EXAMPLE, -1,
     "the coordinator's public key for the example client"},
};

const knob_def *knob_table(size_t *n)
{
    *n = sizeof knob_rows / sizeof knob_rows[0];
    return knob_rows;
}

const knob_def *knob_find(const char *name)
{
    for (size_t i = 0; i < sizeof knob_rows / sizeof knob_rows[0]; i++)
        if (strcmp(knob_rows[i].name, name) == 0)
            return &knob_rows[i];
    return NULL;
}

/* "ref|avx2|avx512" holds `text` as one of its choices. */
static bool knob_is_choice(const char *choices, const char *text)
{
    size_t n = strlen(text);
    for (const char *c = choices; c != NULL; c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL) {
        const char *end = strchr(c, '|');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == n && strncmp(c, text, n) == 0)
            return true;
    }
    return false;
}

/* "ref|avx2|avx512" -> "ref, avx2 or avx512" (with `quote` around each: "`" for markdown). */
static void knob_choices_text(const char *choices, const char *quote, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (const char *c = choices; c != NULL && len < cap;) {
        const char *end = strchr(c, '|');
        int n = end ? (int)(end - c) : (int)strlen(c);
        const char *sep = c == choices ? "" : end ? ", " : " or ";
        len += (size_t)snprintf(buf + len, cap - len, "%s%s%.*s%s", sep, quote, n, c, quote);
        c = end ? end + 1 : NULL;
    }
}

/* log.h's subsystems: "net, plan, ... or all" (the one list, from log.c); in markdown (md)
 * quoted, each with what its lines are about. */
static void knob_subsys_text(bool md, char *buf, size_t cap)
{
    const char *q = md ? "`" : "";
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; log_sub_name(i) != NULL && len < cap; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%s%s%s", i ? ", " : "", q, log_sub_name(i),
                                q);
        if (md && len < cap)
            len += (size_t)snprintf(buf + len, cap - len, " (%s)", log_sub_what(i));
    }
    if (len < cap)
        snprintf(buf + len, cap - len, " or %sall%s", q, q);
}

/* What a row takes ("an integer in 1..16"), for a usage error or (md) the docs' markdown. */
static void knob_expected(const knob_def *k, bool md, char *buf, size_t cap)
{
    const char *quote = md ? "`" : "";
    switch (k->type) {
    case KNOB_CHOICE:
        knob_choices_text(k->what, quote, buf, cap);
        break;
    case KNOB_BOOL:
        snprintf(buf, cap, "%s0%s or %s1%s", quote, quote, quote, quote);
        break;
    case KNOB_INT:
        snprintf(buf, cap, "an integer in %.0f..%.0f", k->lo, k->hi);
        break;
    case KNOB_DOUBLE:
        snprintf(buf, cap, "a number in %g..%g", k->lo, k->hi);
        break;
    case KNOB_SUBSYS: {
        char list[400];
        knob_subsys_text(md, list, sizeof list);
        snprintf(buf, cap, "a comma list of %s", list);
        break;
    }
    default:
        snprintf(buf, cap, "%s", k->what);
    }
}

static int knob_bad(const knob_def *k, const char *text, ep_err *err)
{
    char want[512];
    knob_expected(k, false, want, sizeof want);
    return ep_err_set(err, "%s=%s: expected %s", k->name, text, want);
}

static int knob_number(const knob_def *k, const char *text, double *x)
{
    char *end;
    *x = strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(*x) || *x < k->lo || *x > k->hi)
        return -1;
    return k->type == KNOB_INT && *x != floor(*x) ? -1 : 0;
}

int knob_set(knob_values *v, const knob_def *k, const char *text, ep_err *err)
{
    if (k->at < 0)
        return 0;
    void *field = (char *)v + k->at;
    double x;
    unsigned mask;
    switch (k->type) {
    case KNOB_CHOICE:
        if (text != NULL && !knob_is_choice(k->what, text))
            return knob_bad(k, text, err);
        /* fall through */
    case KNOB_STR:
        *(const char **)field = text;
        return 0;
    case KNOB_BOOL:
        if (text == NULL || (strcmp(text, "0") != 0 && strcmp(text, "1") != 0))
            return knob_bad(k, text ? text : "", err);
        *(bool *)field = text[0] == '1';
        return 0;
    case KNOB_INT:
    case KNOB_DOUBLE:
        if (text == NULL || knob_number(k, text, &x) < 0)
            return knob_bad(k, text ? text : "", err);
        if (k->type == KNOB_INT)
            *(int *)field = (int)x;
        else
            *(double *)field = x;
        return 0;
    case KNOB_SUBSYS:
        if (text != NULL && log_sub_parse(text, &mask) < 0)
            return knob_bad(k, text, err);
        *(unsigned *)field = text ? mask : 0;
        return 0;
    }
    return knob_bad(k, text ? text : "", err);
}

int knob_load(knob_values *v, unsigned prog, ep_err *err)
{
    memset(v, 0, sizeof *v);
    for (size_t i = 0; i < sizeof knob_rows / sizeof knob_rows[0]; i++) {
        const knob_def *k = &knob_rows[i];
        if (!(k->progs & prog) || k->at < 0)
            continue;
        const char *text = getenv(k->name);
        if (text == NULL || text[0] == '\0')
            text = k->def;
        if (knob_set(v, k, text, err) < 0)
            return -1;
    }
    return 0;
}

static void knob_progs_text(unsigned progs, char *buf, size_t cap)
{
    static const char *const names[] = {"epmoe-worker", "epmoe-coordinator", "epmoectl",
                                        "the Python package", "examples/client_example.c"};
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0] && len < cap; i++)
        if (progs & 1u << i)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", names[i]);
}

void knob_doc_row(const knob_def *k, char *buf, size_t cap)
{
    char want[512], progs[128], def[128];
    knob_expected(k, true, want, sizeof want);
    knob_progs_text(k->progs, progs, sizeof progs);
    if (k->def != NULL)
        snprintf(def, sizeof def, "`%s`", k->def);
    else
        snprintf(def, sizeof def, "unset");
    snprintf(buf, cap, "| `%s` | %s | %s | %s | %s |", k->name, want, def, progs, k->doc);
}

void knob_usage(FILE *out, unsigned prog)
{
    fprintf(out, "environment (docs/operations.md, \"Environment\"):\n");
    for (size_t i = 0; i < sizeof knob_rows / sizeof knob_rows[0]; i++) {
        const knob_def *k = &knob_rows[i];
        if (!(k->progs & prog) || strncmp(k->name, "EPMOE_", 6) != 0) /* not systemd's */
            continue;
        char want[512];
        knob_expected(k, false, want, sizeof want);
        fprintf(out, "  %s: %s%s%s\n", k->name, want, k->def ? ", default " : "",
                k->def ? k->def : "");
    }
}
