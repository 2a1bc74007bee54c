/*
 * cmd_admin.c — the admin verbs of epmoectl: status, workers, shards, config, shutdown, drain,
 * undrain, reload, rebalance.
 *
 *   epmoectl [-o table|wide|json|yaml] status [--wait-ready [--wait-timeout S]]
 *   epmoectl [-o table|wide|json|yaml] workers
 *   epmoectl [-o table|wide|json|yaml] shards [--layer L]
 *   epmoectl [-o table|wide|json|yaml] config
 *   epmoectl [-o table|wide|json|yaml] shutdown
 *
 * Each sends one AdminRequest (ctl/rpc.h) and prints the reply: an aligned table for people,
 * or with -o json one object with "schema": 1 whose keys are documented in docs/operations.md
 * (the table may change between releases, the JSON only with a new schema number).
 *
 * Exit codes (ctl/cmds.h): 0 ok; 1 the coordinator answered with an error (printed as
 * "ERR_NAME: message"), or status --wait-ready timed out; 64 bad arguments; 69 the coordinator
 * did not answer; 76 its answer is not what the protocol promises (fields missing, an Error
 * message instead of a reply, a config whose hash does not match).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/model_config.h"
#include "common/model_msg.h"
#include "common/placement.h"
#include "ctl/cmds.h"
#include "ctl/rpc.h"
#include "ctl/show.h"

/* ---- output helpers ---- */

#define TBL_MAX_COLS 16

/* An aligned text table: every column as wide as its widest cell, two spaces between. */
typedef struct tbl {
    int ncol, nrow, cap;
    char **cell; /* [nrow][ncol], row 0 is the header */
} tbl;

static void tbl_row(tbl *t, const char *first, ...)
{
    if (t->nrow == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16;
        t->cell = realloc(t->cell, (size_t)t->cap * (size_t)t->ncol * sizeof *t->cell);
    }
    va_list ap;
    va_start(ap, first);
    for (int c = 0; c < t->ncol; c++) {
        const char *s = c == 0 ? first : va_arg(ap, const char *);
        t->cell[t->nrow * t->ncol + c] = strdup(s ? s : "-");
    }
    va_end(ap);
    t->nrow++;
}

static void tbl_print(tbl *t)
{
    int w[TBL_MAX_COLS] = {0};
    for (int r = 0; r < t->nrow; r++)
        for (int c = 0; c < t->ncol; c++) {
            int n = (int)strlen(t->cell[r * t->ncol + c]);
            w[c] = n > w[c] ? n : w[c];
        }
    for (int r = 0; r < t->nrow; r++) {
        for (int c = 0; c < t->ncol; c++) {
            const char *s = t->cell[r * t->ncol + c];
            if (c + 1 < t->ncol)
                printf("%-*s  ", w[c], s);
            else
                printf("%s\n", s);
        }
    }
    for (int i = 0; i < t->nrow * t->ncol; i++)
        free(t->cell[i]);
    free(t->cell);
    *t = (tbl){0};
}

static json_t *jstr(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* The head of every verb's -o json object: {"schema": 1, "cluster": ...}. */
static json_t *reply_json(const Epmoe__AdminReply *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "schema", json_integer(1));
    json_object_set_new(o, "cluster", jstr(r->cluster));
    return o;
}

/* -o json or -o yaml: the verb's object, not its table. */
static bool structured(const cmd_ctx *ctx)
{
    return ctx->output == CMD_OUT_JSON || ctx->output == CMD_OUT_YAML;
}

/* The verb's object in the format -o asked for (one tree, two notations); o is released. */
static void out_print(const cmd_ctx *ctx, json_t *o)
{
    if (ctx->output == CMD_OUT_YAML) {
        show_yaml(o);
        return;
    }
    json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    printf("\n");
    json_decref(o);
}

static void ago_text(const Epmoe__WorkerInfo *w, char *buf, size_t cap)
{
    if (!w->has_last_seen_ms)
        snprintf(buf, cap, "-");
    else if (w->last_seen_ms < 10000)
        snprintf(buf, cap, "%u ms", w->last_seen_ms);
    else
        snprintf(buf, cap, "%.1f s", w->last_seen_ms / 1000.0);
}

/* "40% 4.12 GB/s": progress, and the checkpoint read rate of the load (the last one when
 * ready) */
static void load_text(const Epmoe__WorkerInfo *w, char *buf, size_t cap)
{
    int n = w->bytes_total == 0
                ? snprintf(buf, cap, "-")
                : snprintf(buf, cap, "%d%%",
                           (int)((w->bytes_done < w->bytes_total ? w->bytes_done : w->bytes_total) *
                                 100 / w->bytes_total));
    if (w->has_load_gbps && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " %.2f GB/s", w->load_gbps);
}

static int protocol_error(const char *cmd, const cmd_ctx *ctx, const char *what)
{
    fprintf(stderr, "epmoectl %s: the coordinator at %s answered without %s\n", cmd,
            ctx->coordinator, what);
    return CMD_PROTOCOL;
}

/* One request; prints the transport error itself (and the coordinator's, when it refused). */
static int call_rq(const cmd_ctx *ctx, const char *cmd, Epmoe__AdminRequest *rq, bool idempotent,
                   rpc_reply *out)
{
    ep_err err;
    int rc = rpc_call(ctx, rq, NULL, 0, idempotent, out, &err);
    if (rc != CMD_OK) {
        fprintf(stderr, "epmoectl %s: %s\n", cmd, err.msg);
        return rc;
    }
    if (!out->reply->has_ok || !out->reply->ok) {
        rc = rpc_report_error(cmd, out->reply);
        rpc_reply_free(out);
    }
    return rc;
}

static int call(const cmd_ctx *ctx, const char *cmd, Epmoe__AdminVerb verb, const char *layer,
                bool idempotent, rpc_reply *out)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = verb;
    rq.layer = (char *)layer;
    return call_rq(ctx, cmd, &rq, idempotent, out);
}

/* A verb about one worker (DRAIN, UNDRAIN); sent once. */
static int call_worker(const cmd_ctx *ctx, const char *cmd, Epmoe__AdminVerb verb,
                       const char *worker, rpc_reply *out)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = verb;
    rq.worker = (char *)worker;
    return call_rq(ctx, cmd, &rq, false, out);
}

/* An option given last, without its value: said so (not "unexpected argument"). */
static int missing_value(const char *cmd, const char *opt)
{
    fprintf(stderr, "epmoectl %s: %s needs a value (see epmoectl %s --help)\n", cmd, opt, cmd);
    return CMD_USAGE;
}

/* "--wait-timeout S" at argv[*i]: 1 consumed (S in *wait_s), 0 not this option, or CMD_USAGE. */
static int wait_timeout_opt(const char *cmd, int argc, char **argv, int *i, long *wait_s)
{
    if (strcmp(argv[*i], "--wait-timeout") != 0)
        return 0;
    if (*i + 1 >= argc)
        return missing_value(cmd, argv[*i]);
    char *end;
    *wait_s = strtol(argv[++*i], &end, 10);
    if (*end != '\0' || *wait_s < 1 || *wait_s > 86400) {
        fprintf(stderr, "epmoectl %s: --wait-timeout %s: expected seconds, 1..86400\n", cmd,
                argv[*i]);
        return CMD_USAGE;
    }
    return 1;
}

/* Only -h/--help, or nothing (-o was taken by epmoectl.c). */
static int no_args(const char *cmd, int argc, char **argv, const char *usage, cmd_ctx *ctx)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s", usage);
            return CMD_OK;
        }
        fprintf(stderr, "epmoectl %s: unexpected argument \"%s\" (see epmoectl %s --help)\n", cmd,
                argv[i], cmd);
        return CMD_USAGE;
    }
    return -1;
}

/* ---- workers (status, workers) ---- */

/* REGISTER's device description: null when the worker never sent one. */
static json_t *device_json(const Epmoe__DeviceInfo *d)
{
    if (d == NULL)
        return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "name", jstr(d->name));
    json_object_set_new(o, "backend", jstr(d->backend));
    json_object_set_new(o, "memory_total",
                        d->has_memory_total ? json_integer((json_int_t)d->memory_total)
                                            : json_null());
    json_object_set_new(o, "memory_free",
                        d->has_memory_free ? json_integer((json_int_t)d->memory_free)
                                           : json_null());
    char sm[16];
    snprintf(sm, sizeof sm, "%u.%u", d->sm_major, d->sm_minor);
    json_object_set_new(o, "compute_capability", d->has_sm_major ? jstr(sm) : json_null());
    return o;
}

/* "cuda:0 (NVIDIA H200, sm_90, 139 GiB)" for a GPU worker that described its device. */
static void device_text(const Epmoe__WorkerInfo *w, char *buf, size_t cap)
{
    const Epmoe__DeviceInfo *d = w->device_info;
    if (d && d->has_memory_total && d->name)
        snprintf(buf, cap, "%s (%s, sm_%u%u, %.0f GiB)", w->device ? w->device : "?", d->name,
                 d->sm_major, d->sm_minor, (double)d->memory_total / (1024.0 * 1024.0 * 1024.0));
    else
        snprintf(buf, cap, "%s", w->device ? w->device : "");
}

static json_t *worker_json(const Epmoe__WorkerInfo *w)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", jstr(w->name));
    json_object_set_new(o, "rank", json_integer(w->rank));
    json_object_set_new(o, "node", jstr(w->node));
    json_object_set_new(o, "device", jstr(w->device));
    json_object_set_new(o, "state", jstr(w->state));
    json_object_set_new(o, "data_endpoint", jstr(w->data_endpoint));
    json_object_set_new(o, "bytes_done", json_integer((json_int_t)w->bytes_done));
    json_object_set_new(o, "bytes_total", json_integer((json_int_t)w->bytes_total));
    json_object_set_new(
        o, "load_progress",
        w->bytes_total
            ? json_real((double)(w->bytes_done < w->bytes_total ? w->bytes_done : w->bytes_total) /
                        (double)w->bytes_total)
            : json_null());
    json_object_set_new(o, "load_gbps", w->has_load_gbps ? json_real(w->load_gbps) : json_null());
    json_object_set_new(o, "last_seen_ms",
                        w->has_last_seen_ms ? json_integer(w->last_seen_ms) : json_null());
    json_object_set_new(o, "hostname", jstr(w->hostname));
    json_object_set_new(o, "pid", w->has_pid ? json_integer(w->pid) : json_null());
    json_object_set_new(o, "backend", jstr(w->backend));
    json_object_set_new(o, "n_experts", json_integer(w->n_experts));
    json_object_set_new(o, "error", jstr(w->error));
    json_object_set_new(o, "device_info", device_json(w->device_info));
    json_object_set_new(o, "epoch",
                        w->has_epoch ? json_integer((json_int_t)w->epoch) : json_null());
    json_object_set_new(o, "member", json_boolean(w->member));
    json_object_set_new(o, "drained", json_boolean(w->drained));
    json_object_set_new(o, "bytes_read",
                        w->has_bytes_read ? json_integer((json_int_t)w->bytes_read) : json_null());
    json_object_set_new(o, "n_slots", json_integer(w->n_slots));
    json_object_set_new(o, "slots_read",
                        w->has_slots_read ? json_integer(w->slots_read) : json_null());
    json_object_set_new(o, "staged",
                        w->has_staged ? json_integer((json_int_t)w->staged) : json_null());
    json_object_set_new(o, "prepared", json_boolean(w->has_prepared && w->prepared));
    return o;
}

static json_t *workers_json(const Epmoe__AdminReply *r)
{
    json_t *a = json_array();
    for (size_t i = 0; i < r->n_workers; i++)
        json_array_append_new(a, worker_json(r->workers[i]));
    return a;
}

static void workers_table(const Epmoe__AdminReply *r, bool wide)
{
    tbl t = {.ncol = wide ? 13 : 8};
    if (wide)
        tbl_row(&t, "WORKER", "RANK", "NODE", "DEVICE", "STATE", "LOAD", "LAST SEEN", "EXPERTS",
                "DATA", "HOST", "PID", "BACKEND", "ERROR");
    else
        tbl_row(&t, "WORKER", "RANK", "NODE", "DEVICE", "STATE", "LOAD", "LAST SEEN", "ERROR");
    for (size_t i = 0; i < r->n_workers; i++) {
        const Epmoe__WorkerInfo *w = r->workers[i];
        char rank[16], load[40], ago[32], ex[16], pid[16], dev[256], state[64];
        snprintf(state, sizeof state, "%s%s", w->state ? w->state : "?",
                 w->drained ? ", drained" : "");
        device_text(w, dev, sizeof dev);
        snprintf(rank, sizeof rank, "%u", w->rank);
        load_text(w, load, sizeof load);
        ago_text(w, ago, sizeof ago);
        snprintf(ex, sizeof ex, "%u", w->n_experts);
        snprintf(pid, sizeof pid, "%u", w->pid);
        if (wide)
            tbl_row(&t, w->name, rank, w->node, dev, state, load, ago, ex, w->data_endpoint,
                    w->hostname, w->has_pid ? pid : NULL, w->backend, w->error);
        else
            tbl_row(&t, w->name, rank, w->node, dev, state, load, ago, w->error);
    }
    tbl_print(&t);
}

static const char status_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] status [--wait-ready [--wait-timeout S]]\n\n"
    "The cluster's state, epoch, config hash, model and step counters, and one line per worker\n"
    "(state, load progress, last seen, last error).\n\n"
    "  --wait-ready        poll until the cluster is ready; exit 1 if it is not within the\n"
    "                      wait timeout (the workers that are not ready are named)\n"
    "  --wait-timeout S    seconds to wait (default 60)\n";

static void status_print(const cmd_ctx *ctx, const Epmoe__AdminReply *r)
{
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, r->config_hash);
    if (structured(ctx)) {
        json_t *o = reply_json(r);
        json_object_set_new(o, "state", jstr(r->state));
        json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch));
        json_object_set_new(o, "current_epoch", json_integer((json_int_t)r->current_epoch));
        json_object_set_new(o, "problem", jstr(r->problem));
        json_object_set_new(o, "config_hash", json_string(hash));
        json_object_set_new(o, "model_path", jstr(r->model_path));
        json_object_set_new(o, "steps_done", json_integer((json_int_t)r->steps_done));
        json_object_set_new(o, "steps_failed", json_integer((json_int_t)r->steps_failed));
        json_object_set_new(o, "requests_served", json_integer((json_int_t)r->requests_served));
        json_object_set_new(o, "requests_failed", json_integer((json_int_t)r->requests_failed));
        json_object_set_new(o, "request_rate", json_real(r->request_rate));
        json_object_set_new(o, "balance", r->has_balance ? json_real(r->balance) : json_null());
        json_object_set_new(o, "staged_epoch",
                            r->has_staged_epoch ? json_integer((json_int_t)r->staged_epoch)
                                                : json_null());
        json_object_set_new(o, "workers", workers_json(r));
        out_print(ctx, o);
        return;
    }
    int ready = 0;
    for (size_t i = 0; i < r->n_workers; i++)
        ready += r->workers[i]->state && strcmp(r->workers[i]->state, "ready") == 0;
    printf("cluster      %s\n", r->cluster);
    printf("state        %s (%d/%zu workers ready)\n", r->state, ready, r->n_workers);
    if (r->current_epoch == r->epoch)
        printf("epoch        %" PRIu64 "\n", r->epoch);
    else
        printf("epoch        %" PRIu64 " (epoch %" PRIu64 " is being applied)\n", r->current_epoch,
               r->epoch);
    if (r->has_staged_epoch)
        printf("rebalance    epoch %" PRIu64 " is being prepared (steps run in %" PRIu64 ")\n",
               r->staged_epoch, r->current_epoch);
    if (r->has_balance)
        printf("balance      %.3f (max/mean worker load, measured)\n", r->balance);
    if (r->problem)
        printf("problem      %s\n", r->problem);
    printf("config hash  %s\n", hash);
    printf("model        %s\n", r->model_path ? r->model_path : "-");
    printf("steps        %" PRIu64 " done, %" PRIu64 " failed\n", r->steps_done, r->steps_failed);
    printf("requests     %" PRIu64 " served (%.1f/s over the last 10 s), %" PRIu64 " failed\n\n",
           r->requests_served, r->request_rate, r->requests_failed);
    workers_table(r, ctx->output == CMD_OUT_WIDE);
}

static void not_ready_text(const Epmoe__AdminReply *r, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < r->n_workers && len + 80 < cap; i++) {
        const Epmoe__WorkerInfo *w = r->workers[i];
        if (w->state && strcmp(w->state, "ready") == 0)
            continue;
        len += (size_t)snprintf(buf + len, cap - len, "%s%s (%s)", len ? ", " : "",
                                w->name ? w->name : "?", w->state ? w->state : "?");
    }
}

int cmd_status(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    bool wait = false;
    long wait_s = 60;
    for (int i = 1; i < argc; i++) {
        int o;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s", status_usage);
            return CMD_OK;
        } else if (strcmp(argv[i], "--wait-ready") == 0) {
            wait = true;
        } else if ((o = wait_timeout_opt("status", argc, argv, &i, &wait_s)) != 0) {
            if (o != 1)
                return o;
        } else {
            fprintf(stderr,
                    "epmoectl status: unexpected argument \"%s\" (see epmoectl status "
                    "--help)\n",
                    argv[i]);
            return CMD_USAGE;
        }
    }
    int64_t t0 = clk_mono_ms();
    for (;;) {
        rpc_reply rr;
        int rc = call(ctx, "status", EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL, true, &rr);
        if (rc != CMD_OK)
            return rc;
        const Epmoe__AdminReply *r = rr.reply;
        if (r->state == NULL || r->cluster == NULL) {
            rpc_reply_free(&rr);
            return protocol_error("status", ctx, "the cluster's name and state");
        }
        bool ready = strcmp(r->state, "ready") == 0;
        bool expired = clk_mono_ms() - t0 >= (int64_t)wait_s * 1000;
        if (!wait || ready || expired) {
            status_print(ctx, r);
            if (wait && !ready) {
                char who[2048];
                not_ready_text(r, who, sizeof who);
                fprintf(stderr,
                        "epmoectl status: cluster %s is still %s after %ld s; not ready: %s\n",
                        r->cluster, r->state, wait_s, who);
                rc = CMD_FAILED;
            }
            rpc_reply_free(&rr);
            return rc;
        }
        rpc_reply_free(&rr);
        usleep(200000);
    }
}

static const char workers_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] workers\n\n"
    "Every worker of the cluster spec with everything the coordinator knows about it: rank,\n"
    "node, device, state, load progress, last seen, experts owned, data endpoint, host, pid,\n"
    "backend and last error.\n";

int cmd_workers(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    int rc = no_args("workers", argc, argv, workers_usage, ctx);
    if (rc >= 0)
        return rc;
    rpc_reply rr;
    if ((rc = call(ctx, "workers", EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL, true, &rr)) != CMD_OK)
        return rc;
    const Epmoe__AdminReply *r = rr.reply;
    if (structured(ctx)) {
        json_t *o = reply_json(r);
        json_object_set_new(o, "state", jstr(r->state));
        json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch));
        json_object_set_new(o, "workers", workers_json(r));
        out_print(ctx, o);
    } else {
        workers_table(r, true);
    }
    rpc_reply_free(&rr);
    return CMD_OK;
}

/* ---- shards ---- */

static const char shards_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] shards [--layer L]\n\n"
    "The placement of one MoE layer (L, layers.L or mtp.I; default the first): which routed\n"
    "experts each rank holds (ranges like 0-31,64). An expert listed on several ranks has\n"
    "replicas (redundant_experts); each MoE layer has its own table after a rebalance.\n";

int cmd_shards(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    const char *layer = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s", shards_usage);
            return CMD_OK;
        } else if (strcmp(argv[i], "--layer") == 0) {
            if (i + 1 >= argc)
                return missing_value("shards", argv[i]);
            layer = argv[++i];
        } else {
            fprintf(stderr,
                    "epmoectl shards: unexpected argument \"%s\" (see epmoectl shards "
                    "--help)\n",
                    argv[i]);
            return CMD_USAGE;
        }
    }
    rpc_reply rr;
    int rc = call(ctx, "shards", EPMOE__ADMIN_VERB__ADMIN_SHARDS, layer, true, &rr);
    if (rc != CMD_OK)
        return rc;
    const Epmoe__AdminReply *r = rr.reply;
    if (r->placement == NULL) {
        rpc_reply_free(&rr);
        return protocol_error("shards", ctx, "the placement");
    }
    char *ranges = malloc(65536);
    if (structured(ctx)) {
        json_t *o = reply_json(r), *a = json_array();
        json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch));
        json_object_set_new(o, "placement", jstr(r->placement));
        json_object_set_new(o, "layer", jstr(r->layer));
        for (size_t i = 0; i < r->n_shards; i++) {
            const Epmoe__Shard *s = r->shards[i];
            json_t *so = json_object(), *ex = json_array();
            for (size_t e = 0; e < s->n_experts; e++)
                json_array_append_new(ex, json_integer(s->experts[e]));
            pl_ranges_text(s->experts, s->n_experts, ranges, 65536);
            json_object_set_new(so, "rank", json_integer(s->rank));
            json_object_set_new(so, "worker", jstr(s->worker));
            json_object_set_new(so, "experts", ex);
            json_object_set_new(so, "ranges", json_string(ranges));
            json_array_append_new(a, so);
        }
        json_object_set_new(o, "shards", a);
        out_print(ctx, o);
    } else {
        if (r->layer)
            printf("placement %s, epoch %" PRIu64 ", layer %s\n\n", r->placement, r->epoch,
                   r->layer);
        else
            printf("placement %s, epoch %" PRIu64 "; the same for every layer\n\n", r->placement,
                   r->epoch);
        tbl t = {.ncol = 4};
        tbl_row(&t, "RANK", "WORKER", "COUNT", "EXPERTS");
        for (size_t i = 0; i < r->n_shards; i++) {
            const Epmoe__Shard *s = r->shards[i];
            char rank[16], count[16];
            snprintf(rank, sizeof rank, "%u", s->rank);
            snprintf(count, sizeof count, "%zu", s->n_experts);
            pl_ranges_text(s->experts, s->n_experts, ranges, 65536);
            tbl_row(&t, rank, s->worker, count, ranges);
        }
        tbl_print(&t);
    }
    free(ranges);
    rpc_reply_free(&rr);
    return CMD_OK;
}

/* ---- config ---- */

static const char config_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] config\n\n"
    "The model config the coordinator resolved from config.json and broadcasts to the workers:\n"
    "sizes, expert_dtype (given in config.json or defaulted), scale_e8m0, act_ue8m0 and the\n"
    "config hash the workers acknowledge.\n";

static void config_json(const cmd_ctx *ctx, const Epmoe__AdminReply *r, const mc_config *c,
                        const char *hash)
{
    json_t *o = reply_json(r);
    json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch));
    json_object_set_new(o, "model", jstr(r->model_path));
    json_object_set_new(o, "expert_dtype", json_string(mc_dtype_name(c->expert_dtype)));
    json_object_set_new(o, "expert_dtype_given", json_boolean(c->expert_dtype_given));
    json_object_set_new(o, "scale_e8m0", json_boolean(c->scale_e8m0));
    json_object_set_new(o, "act_ue8m0", json_boolean(c->act_ue8m0));
    json_object_set_new(o, "config_hash", json_string(hash));
    json_object_set_new(o, "config", show_config_json(c));
    out_print(ctx, o);
}

static void config_table(const Epmoe__AdminReply *r, const mc_config *c, const char *hash)
{
    printf("cluster       %s (epoch %" PRIu64 ")\n", r->cluster ? r->cluster : "-", r->epoch);
    printf("model         %s\n", r->model_path ? r->model_path : "-");
    show_config_text(c);
    printf("routing       scaling %g, swiglu_limit %g, rms_norm_eps %g, norm_topk_prob %s\n",
           show_short_float(c->routed_scaling_factor), show_short_float(c->swiglu_limit),
           show_short_float(c->rms_norm_eps), c->norm_topk_prob ? "true" : "false");
    printf("config hash   %s\n", hash);
}

int cmd_config(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    int rc = no_args("config", argc, argv, config_usage, ctx);
    if (rc >= 0)
        return rc;
    rpc_reply rr;
    if ((rc = call(ctx, "config", EPMOE__ADMIN_VERB__ADMIN_CONFIG, NULL, true, &rr)) != CMD_OK)
        return rc;
    const Epmoe__AdminReply *r = rr.reply;
    mc_config c;
    ep_err err;
    if (r->config == NULL || !r->has_config_hash) {
        rc = protocol_error("config", ctx, "the config and its hash");
    } else if (mmsg_to_config(r->config, &c, &err) != 0) {
        fprintf(stderr, "epmoectl config: the coordinator at %s sent an invalid config: %s\n",
                ctx->coordinator, err.msg);
        rc = CMD_PROTOCOL;
    } else if (mc_hash(&c) != r->config_hash) {
        /* what a worker would refuse with ERR_CONFIG_HASH: different epmoe versions */
        fprintf(stderr,
                "epmoectl config: the coordinator's config hash %016" PRIx64 " differs from "
                "this epmoectl's hash of the config it sent, %016" PRIx64
                " (different epmoe versions?)\n",
                r->config_hash, mc_hash(&c));
        rc = CMD_PROTOCOL;
    } else {
        char hash[24];
        snprintf(hash, sizeof hash, "%016" PRIx64, r->config_hash);
        if (structured(ctx))
            config_json(ctx, r, &c, hash);
        else
            config_table(r, &c, hash);
    }
    rpc_reply_free(&rr);
    return rc;
}

/* ---- shutdown ---- */

static const char shutdown_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] shutdown\n\n"
    "Stop the coordinator: it answers, fails queued forward requests with ERR_SHUTTING_DOWN,\n"
    "sends SHUTDOWN to every worker and exits 0. Sent once (never retried).\n";

int cmd_shutdown(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    int rc = no_args("shutdown", argc, argv, shutdown_usage, ctx);
    if (rc >= 0)
        return rc;
    rpc_reply rr;
    if ((rc = call(ctx, "shutdown", EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN, NULL, false, &rr)) != CMD_OK)
        return rc;
    const Epmoe__AdminReply *r = rr.reply;
    if (structured(ctx)) {
        json_t *o = reply_json(r);
        json_object_set_new(o, "state", jstr(r->state));
        out_print(ctx, o);
    } else {
        printf("cluster %s: %s\n", r->cluster ? r->cluster : "-", r->state ? r->state : "stopping");
    }
    rpc_reply_free(&rr);
    return CMD_OK;
}

/* ---- drain, undrain, reload ---- */

static const char drain_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] drain NAME [--no-wait] [--wait-timeout S]\n\n"
    "drain moves worker NAME's experts to the other workers through a new placement epoch (the\n"
    "step in flight finishes first; no step fails) and, unless --no-wait, waits until that epoch\n"
    "is current: then NAME takes part in no step and can be stopped. The coordinator refuses a\n"
    "drain the other workers cannot absorb (max_experts_per_worker). epmoectl undrain NAME\n"
    "undoes it.\n\n"
    "  --no-wait          return once the coordinator accepted the drain\n"
    "  --wait-timeout S   seconds to wait for the epoch (default 60); exit 1 when it is not\n"
    "                     current by then\n";

static const char undrain_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] undrain NAME\n\n"
    "undrain lets worker NAME, drained by epmoectl drain, own experts again (the spec's\n"
    "rejoin: restore gives it the spec's placement back through a new epoch; stay keeps it a\n"
    "spare until a rebalance uses it). Returns once the coordinator accepted it.\n";

/* Poll STATUS until current_epoch >= epoch and the cluster is ready. */
static int wait_epoch(const cmd_ctx *ctx, const char *cmd, uint64_t epoch, long wait_s)
{
    int64_t t0 = clk_mono_ms();
    for (;;) {
        rpc_reply rr;
        int rc = call(ctx, cmd, EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL, true, &rr);
        if (rc != CMD_OK)
            return rc;
        const Epmoe__AdminReply *r = rr.reply;
        bool done = r->current_epoch >= epoch && r->state && strcmp(r->state, "ready") == 0;
        char state[64];
        snprintf(state, sizeof state, "%s", r->state ? r->state : "?");
        uint64_t cur = r->current_epoch;
        rpc_reply_free(&rr);
        if (done)
            return CMD_OK;
        if (clk_mono_ms() - t0 >= (int64_t)wait_s * 1000) {
            fprintf(stderr,
                    "epmoectl %s: placement epoch %" PRIu64 " is not current after %ld s (the "
                    "cluster is %s in epoch %" PRIu64 ")\n",
                    cmd, epoch, wait_s, state, cur);
            return CMD_FAILED;
        }
        usleep(100000);
    }
}

static void message_print(const cmd_ctx *ctx, const char *cmd, const Epmoe__AdminReply *r)
{
    if (structured(ctx)) {
        json_t *o = reply_json(r);
        json_object_set_new(o, "epoch",
                            r->has_epoch ? json_integer((json_int_t)r->epoch) : json_null());
        json_object_set_new(o, "message", jstr(r->message));
        out_print(ctx, o);
    } else {
        printf("%s\n", r->message ? r->message : cmd);
    }
}

/* drain (undrain: false) NAME [--no-wait] [--wait-timeout S] */
static int drain_cmd(const cmd_ctx *gctx, int argc, char **argv, bool drain)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    const char *cmd = drain ? "drain" : "undrain", *name = NULL;
    bool wait = drain;
    long wait_s = 60;
    for (int i = 1; i < argc; i++) {
        int o;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s", drain ? drain_usage : undrain_usage);
            return CMD_OK;
        } else if (drain && strcmp(argv[i], "--no-wait") == 0) {
            wait = false;
        } else if (drain && (o = wait_timeout_opt(cmd, argc, argv, &i, &wait_s)) != 0) {
            if (o != 1)
                return o;
        } else if (name == NULL && argv[i][0] != '-') {
            name = argv[i];
        } else {
            fprintf(stderr, "epmoectl %s: unexpected argument \"%s\" (see epmoectl %s --help)\n",
                    cmd, argv[i], cmd);
            return CMD_USAGE;
        }
    }
    if (name == NULL) {
        fprintf(stderr, "epmoectl %s: which worker? (see epmoectl %s --help)\n", cmd, cmd);
        return CMD_USAGE;
    }
    rpc_reply rr;
    int rc = call_worker(ctx, cmd,
                         drain ? EPMOE__ADMIN_VERB__ADMIN_DRAIN : EPMOE__ADMIN_VERB__ADMIN_UNDRAIN,
                         name, &rr);
    if (rc != CMD_OK)
        return rc;
    uint64_t epoch = rr.reply->has_epoch ? rr.reply->epoch : 0;
    message_print(ctx, cmd, rr.reply);
    rpc_reply_free(&rr);
    return wait ? wait_epoch(ctx, cmd, epoch, wait_s) : CMD_OK;
}

int cmd_drain(const cmd_ctx *ctx, int argc, char **argv)
{
    return drain_cmd(ctx, argc, argv, true);
}

int cmd_undrain(const cmd_ctx *ctx, int argc, char **argv)
{
    return drain_cmd(ctx, argc, argv, false);
}

static const char reload_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] reload\n\n"
    "Make the coordinator read its cluster spec again (like SIGHUP): it builds and validates\n"
    "the new state, then swaps it in once no step is in flight (workers added or removed,\n"
    "timeouts and placement rules changed). A spec that fails keeps the old one serving; the\n"
    "error names FILE:LINE:COLUMN and the exit code is 78. Sent once (never retried).\n";

int cmd_reload(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    int rc = no_args("reload", argc, argv, reload_usage, ctx);
    if (rc >= 0)
        return rc;
    rpc_reply rr;
    if ((rc = call(ctx, "reload", EPMOE__ADMIN_VERB__ADMIN_RELOAD, NULL, false, &rr)) != CMD_OK)
        return rc == CMD_FAILED ? CMD_CONFIG : rc;
    message_print(ctx, "reload", rr.reply);
    rpc_reply_free(&rr);
    return CMD_OK;
}

/* ---- rebalance ---- */

static const char rebalance_usage[] =
    "usage: epmoectl [-o table|wide|json|yaml] rebalance [--dry-run] [--no-wait] [--wait-timeout "
    "S]\n\n"
    "Plan a new placement with EPLB from the load of the coordinator's window (the last\n"
    "expert_parallel.window_steps steps) and show its balance, max/mean worker load per layer,\n"
    "before and after. Unless --dry-run, apply it through a staged epoch: the workers load what\n"
    "they gain while steps keep running, the switch happens at a step boundary, and no step\n"
    "fails. Only changed experts move. Waits for the new epoch to be current unless --no-wait.\n\n"
    "  --dry-run          plan and show, change nothing\n"
    "  --no-wait          return once the staged epoch was started\n"
    "  --wait-timeout S   seconds to wait (default 120)\n";

static json_t *rebalance_json(const Epmoe__AdminReply *r, const Epmoe__RebalanceInfo *b, bool dry)
{
    json_t *o = reply_json(r), *layers = json_array();
    json_object_set_new(o, "epoch_before", json_integer((json_int_t)b->epoch_before));
    json_object_set_new(o, "epoch_after", json_integer((json_int_t)b->epoch_after));
    json_object_set_new(o, "balance_before", json_real(b->balance_before));
    json_object_set_new(o, "balance_after", json_real(b->balance_after));
    json_object_set_new(o, "moved_experts", json_integer((json_int_t)b->moved_experts));
    for (size_t i = 0; i < b->n_layers; i++) {
        const Epmoe__LayerBalance *l = b->layers[i];
        json_t *lo = json_object();
        json_object_set_new(lo, "layer", json_integer(l->layer));
        json_object_set_new(lo, "name", jstr(l->name));
        json_object_set_new(lo, "balance_before", json_real(l->before));
        json_object_set_new(lo, "balance_after", json_real(l->after));
        json_object_set_new(lo, "measured", l->has_measured ? json_real(l->measured) : json_null());
        json_object_set_new(lo, "moved_experts", json_integer(l->moved));
        json_array_append_new(layers, lo);
    }
    json_object_set_new(o, "layers", layers);
    json_object_set_new(o, "dry_run", json_boolean(dry));
    json_object_set_new(o, "applied", json_boolean(b->applied));
    json_object_set_new(o, "policy", json_string(b->hierarchical ? "hierarchical" : "global"));
    json_object_set_new(o, "window_steps", json_integer(b->window_steps));
    json_object_set_new(o, "plan_seconds", json_real(b->plan_seconds));
    return o;
}

static void rebalance_table(const Epmoe__RebalanceInfo *b, bool dry)
{
    printf("balance      %.3f -> %.3f (max/mean worker load, average of %zu loaded layers)\n",
           b->balance_before, b->balance_after, b->n_layers);
    printf("moves        %" PRIu64 " replicas (EPLB %s, %u steps in the window, planned in "
           "%.3f s)\n",
           b->moved_experts, b->hierarchical ? "hierarchical" : "global", b->window_steps,
           b->plan_seconds);
    if (dry)
        printf("epoch        %" PRIu64 " (dry run: nothing applied)\n\n", b->epoch_before);
    else if (b->applied)
        printf("epoch        %" PRIu64 " -> %" PRIu64 " (staged: workers load, then switch)\n\n",
               b->epoch_before, b->epoch_after);
    else
        printf("epoch        %" PRIu64 " (the plan changes nothing)\n\n", b->epoch_before);
    tbl t = {.ncol = 5};
    tbl_row(&t, "LAYER", "MEASURED", "BEFORE", "AFTER", "MOVED");
    for (size_t i = 0; i < b->n_layers; i++) {
        const Epmoe__LayerBalance *l = b->layers[i];
        char m[32], bf[32], af[32], mv[16];
        snprintf(m, sizeof m, l->has_measured ? "%.3f" : "-", l->measured);
        snprintf(bf, sizeof bf, "%.3f", l->before);
        snprintf(af, sizeof af, "%.3f", l->after);
        snprintf(mv, sizeof mv, "%u", l->moved);
        tbl_row(&t, l->name, m, bf, af, mv);
    }
    tbl_print(&t);
}

int cmd_rebalance(const cmd_ctx *gctx, int argc, char **argv)
{
    cmd_ctx lctx = *gctx, *ctx = &lctx;
    bool dry = false, wait = true;
    long wait_s = 120;
    for (int i = 1; i < argc; i++) {
        int o;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s", rebalance_usage);
            return CMD_OK;
        } else if (strcmp(argv[i], "--dry-run") == 0) {
            dry = true;
        } else if (strcmp(argv[i], "--no-wait") == 0) {
            wait = false;
        } else if ((o = wait_timeout_opt("rebalance", argc, argv, &i, &wait_s)) != 0) {
            if (o != 1)
                return o;
        } else {
            fprintf(stderr,
                    "epmoectl rebalance: unexpected argument \"%s\" (see epmoectl rebalance "
                    "--help)\n",
                    argv[i]);
            return CMD_USAGE;
        }
    }
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = rq.has_dry_run = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_REBALANCE;
    rq.dry_run = dry;
    rpc_reply rr;
    ep_err err;
    int rc = rpc_call(ctx, &rq, NULL, 0, dry, &rr, &err); /* a real rebalance is sent once */
    if (rc != CMD_OK) {
        fprintf(stderr, "epmoectl rebalance: %s\n", err.msg);
        return rc;
    }
    if (!rr.reply->has_ok || !rr.reply->ok) {
        rc = rpc_report_error("rebalance", rr.reply);
        rpc_reply_free(&rr);
        return rc;
    }
    const Epmoe__RebalanceInfo *b = rr.reply->rebalance;
    if (b == NULL) {
        rpc_reply_free(&rr);
        return protocol_error("rebalance", ctx, "the plan");
    }
    if (structured(ctx))
        out_print(ctx, rebalance_json(rr.reply, b, dry));
    else
        rebalance_table(b, dry);
    uint64_t epoch = b->epoch_after;
    bool applied = b->applied;
    rpc_reply_free(&rr);
    return wait && applied ? wait_epoch(ctx, "rebalance", epoch, wait_s) : CMD_OK;
}
