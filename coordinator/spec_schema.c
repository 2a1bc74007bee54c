/*
 * spec_schema.c — the sections of a cluster spec, their fields' handlers and the checks of their
 * values: names, hosts, endpoints, devices, metrics addresses, choices (see spec_schema.h). Each
 * mapping is one spec_section, each key one spec_field; spec_walk (spec_yaml.c) applies them.
 */
#include "coordinator/spec_schema.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

/* ---- value checks ------------------------------------------------------------------------- */

/* ASCII only: isalnum() would follow the locale. */
#define SPEC_NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_"

static bool spec_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= SPEC_NAME_MAX && strspn(s, SPEC_NAME_CHARS) == n;
}

static bool spec_host_ok(const char *h, size_t n)
{
    const char *allowed = SPEC_NAME_CHARS; /* host names and IPv4 addresses */
    if (n > 0 && h[0] == '[') {            /* IPv6 literal */
        if (n < 3 || h[n - 1] != ']')
            return false;
        h++;
        n -= 2;
        allowed = "0123456789abcdefABCDEF:.";
    }
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strchr(allowed, h[i]) == NULL)
            return false;
    return true;
}

/* sockaddr_un.sun_path on Linux, NUL included: the longest ipc:// path libzmq can bind. */
#define SPEC_SUN_PATH sizeof(((struct sockaddr_un *)0)->sun_path)
_Static_assert(SPEC_SUN_PATH == 108, "the ipc path message says 107 bytes");

/* NULL when port (what follows HOST:) is a number 1..65535, else what is wrong with it. */
static const char *spec_port_problem(const char *port)
{
    size_t pn = strlen(port);
    if (pn == 0 || pn > 5 || strspn(port, "0123456789") != pn)
        return "the port is not a number";
    long p = strtol(port, NULL, 10);
    if (p < 1 || p > 65535)
        return "the port is out of range";
    return NULL;
}

/* NULL when s is a valid endpoint, else what is wrong with it. bind: the coordinator binds it
 * (listen, admin) and may use the "*" host (all interfaces); peers connect to data endpoints,
 * so those need a real host. */
static const char *spec_endpoint_problem(const char *s, bool bind)
{
    if (strncmp(s, "ipc://", 6) == 0) {
        size_t n = strlen(s + 6);
        if (n == 0)
            return "empty ipc path";
        if (n >= SPEC_SUN_PATH)
            return "ipc path longer than 107 bytes (the Unix socket limit)";
        return NULL;
    }
    if (strncmp(s, "tcp://", 6) != 0)
        return "unsupported transport";
    const char *hp = s + 6, *colon = strrchr(hp, ':');
    if (colon == NULL)
        return "no :PORT";
    size_t hn = (size_t)(colon - hp);
    if (hn == 1 && hp[0] == '*') {
        if (!bind)
            return "peers connect to it, so the host cannot be *";
    } else if (!spec_host_ok(hp, hn)) {
        return bind ? "bad host (expected a name, an IPv4 address, [IPv6] or *)"
                    : "bad host (expected a name, an IPv4 address or [IPv6])";
    }
    return spec_port_problem(colon + 1);
}

/* "cpu" -> -1, "cuda:N" (N 0..255, no leading zeros) -> N, anything else -> -2. */
static int spec_device_index(const char *s)
{
    if (strcmp(s, "cpu") == 0)
        return -1;
    if (strncmp(s, "cuda:", 5) != 0)
        return -2;
    const char *d = s + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 3 || strspn(d, "0123456789") != n || (n > 1 && d[0] == '0'))
        return -2;
    int v = atoi(d);
    return v <= 255 ? v : -2;
}

/* ---- the schema tables -------------------------------------------------------------------- */

/* Where a field's value and its position go in the struct being filled. */
#define SPEC_POS(type, member) .has_pos = true, .pos_off = offsetof(type, member)
#define SPEC_STR(type, member) .off = offsetof(type, member), .cap = sizeof(((type *)0)->member)

static int spec_put_str(spec_ctx *c, const ynode *val, const spec_field *f, const char *path,
                        void *obj, const char *s)
{
    if (strlen(s) >= f->cap)
        return spec_fail(c, val->pos, "%s: longer than %zu bytes", path, f->cap - 1);
    memcpy((char *)obj + f->off, s, strlen(s) + 1);
    return 0;
}

static int spec_h_section(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                          const char *path, void *obj)
{
    return spec_walk(c, val, f->sub, path, obj);
}

static int spec_h_int(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                      const char *path, void *obj)
{
    long long v = 0;
    if (spec_int(c, val, path, f->lo, f->hi, &v) != 0)
        return -1;
    *(int *)(void *)((char *)obj + f->off) = (int)v;
    return 0;
}

static int spec_h_name(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                       const char *path, void *obj)
{
    char buf[64];
    const char *s = spec_str(c, val, path, "a name");
    if (s == NULL)
        return -1;
    if (!spec_name_ok(s))
        return spec_fail(c, val->pos,
                         "%s: bad name %s (expected 1..%d characters from A-Z a-z 0-9 . _ -)", path,
                         spec_quote(s, val->len, buf, sizeof buf), SPEC_NAME_MAX);
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_endpoint(spec_ctx *c, const ynode *val, const spec_field *f, const char *path,
                         void *obj, bool bind)
{
    char buf[64];
    const char *s = spec_str(c, val, path, "an endpoint");
    if (s == NULL)
        return -1;
    const char *problem = spec_endpoint_problem(s, bind);
    if (problem != NULL)
        return spec_fail(c, val->pos,
                         "%s: bad endpoint %s: %s (expected tcp://HOST:PORT with PORT "
                         "1..65535, or ipc://PATH)",
                         path, spec_quote(s, val->len, buf, sizeof buf), problem);
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_h_bind_endpoint(spec_ctx *c, const ynode *key, const ynode *val,
                                const spec_field *f, const char *path, void *obj)
{
    return spec_endpoint(c, val, f, path, obj, true);
}

static int spec_h_peer_endpoint(spec_ctx *c, const ynode *key, const ynode *val,
                                const spec_field *f, const char *path, void *obj)
{
    return spec_endpoint(c, val, f, path, obj, false);
}

static int spec_h_path(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                       const char *path, void *obj)
{
    const char *s = spec_str(c, val, path, "a path");
    return s == NULL ? -1 : spec_put_str(c, val, f, path, obj, s);
}

/* Index of val in names[0..n), or -1 with "unknown WHAT "x" (expected one of ...)". */
static int spec_choice(spec_ctx *c, const ynode *val, const char *path, const char *what,
                       const char *const *names, int n)
{
    char buf[64], list[256] = "";
    const char *s = spec_str(c, val, path, what);
    if (s == NULL)
        return -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0)
            return i;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    }
    spec_fail(c, val->pos, "%s: unknown %s %s (expected one of %s)", path, what,
              spec_quote(s, val->len, buf, sizeof buf), list);
    return -1;
}

static const char *const spec_placement_names[] = {"contiguous", "round_robin", "eplb"};
static const char *const spec_dispatch_names[] = {"fp8", "bf16"};
static const char *const spec_data_plane_names[] = {"zmq", "nccl"};
static const char *const spec_rejoin_names[] = {"restore", "stay"};
static const char *const spec_gpu_gemm_names[] = {"exact", "fast"};

static int spec_h_placement(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                            const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "placement", spec_placement_names, 3);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->placement = (spec_placement)i;
    return 0;
}

static int spec_h_dispatch(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                           const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "dispatch format", spec_dispatch_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->dispatch = (spec_dispatch)i;
    return 0;
}

static int spec_h_data_plane(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                             const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "data plane", spec_data_plane_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->data_plane = (spec_data_plane)i;
    return 0;
}

static int spec_h_rejoin(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                         const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "rejoin policy", spec_rejoin_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->rejoin = (spec_rejoin)i;
    return 0;
}

static int spec_h_gpu_gemm(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                           const char *path, void *obj)
{
    int i = spec_choice(c, val, path, "GPU GEMM path", spec_gpu_gemm_names, 2);
    if (i < 0)
        return -1;
    ((spec_cluster *)obj)->gpu_gemm = (spec_gpu_gemm)i;
    return 0;
}

/* NULL when s is a valid metrics address HOST:PORT (an IPv4 address or a name; PORT
 * 1..65535), else what is wrong with it. libmicrohttpd binds it, so no ZeroMQ scheme. */
static const char *spec_metrics_problem(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (strstr(s, "://") != NULL)
        return "no scheme: HOST:PORT, served over HTTP";
    if (colon == NULL || colon == s)
        return "expected HOST:PORT";
    if (!spec_host_ok(s, (size_t)(colon - s)) || s[0] == '[')
        return "bad host (expected an IPv4 address or a name)";
    return spec_port_problem(colon + 1);
}

static int spec_h_metrics(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                          const char *path, void *obj)
{
    char buf[64];
    const char *s = spec_str(c, val, path, "a metrics address");
    if (s == NULL)
        return -1;
    const char *problem = spec_metrics_problem(s);
    if (problem != NULL)
        return spec_fail(c, val->pos, "%s: bad metrics address %s: %s (e.g. \"127.0.0.1:9400\")",
                         path, spec_quote(s, val->len, buf, sizeof buf), problem);
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_h_device(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                         const char *path, void *obj)
{
    char buf[64];
    spec_worker *w = obj;
    const char *s = spec_str(c, val, path, "a device");
    if (s == NULL)
        return -1;
    int idx = spec_device_index(s);
    if (idx == -2)
        return spec_fail(c, val->pos,
                         "%s: bad device %s (expected \"cpu\" or \"cuda:N\" with N 0..255)", path,
                         spec_quote(s, val->len, buf, sizeof buf));
    w->cuda_index = idx;
    return spec_put_str(c, val, f, path, obj, s);
}

static int spec_grow_workers(spec_ctx *c)
{
    spec_cluster *s = c->s;
    if (s->n_workers < c->cap_workers)
        return 0;
    int cap = c->cap_workers ? 2 * c->cap_workers : 16;
    if (cap > EP_MAX_WORKERS)
        cap = EP_MAX_WORKERS;
    spec_worker *grown = realloc(s->workers, (size_t)cap * sizeof *grown);
    if (grown == NULL)
        return ep_err_set(c->err, "%s: out of memory", c->file);
    s->workers = grown;
    c->cap_workers = cap;
    return 0;
}

static const spec_field spec_worker_fields[] = {
    {.key = "name",
     .handle = spec_h_name,
     .required = true,
     SPEC_STR(spec_worker, name),
     SPEC_POS(spec_worker, name_pos)},
    {.key = "device",
     .handle = spec_h_device,
     .required = true,
     SPEC_STR(spec_worker, device),
     SPEC_POS(spec_worker, device_pos)},
    {.key = "data",
     .handle = spec_h_peer_endpoint,
     .required = true,
     SPEC_STR(spec_worker, data),
     SPEC_POS(spec_worker, data_pos)},
    {.key = "metrics",
     .handle = spec_h_metrics,
     SPEC_STR(spec_worker, metrics),
     SPEC_POS(spec_worker, metrics_pos)},
    {.key = "client",
     .handle = spec_h_peer_endpoint,
     SPEC_STR(spec_worker, client),
     SPEC_POS(spec_worker, client_pos)},
};
SPEC_SECTION(spec_worker_section, spec_worker_fields);

static int spec_h_workers(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                          const char *path, void *obj)
{
    spec_cluster *s = c->s;
    if (val->kind != YK_SEQ)
        return spec_type_error(c, val, path, "a sequence of workers (check indentation)");
    if (val->count == 0)
        return spec_fail(c, val->pos, "%s: expected at least one worker", path);
    int i = 0;
    for (const ynode *item = spec_node_at(c, val->first); item;
         item = spec_node_at(c, item->next)) {
        char ipath[128];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i++);
        if (s->n_workers == EP_MAX_WORKERS)
            return spec_fail(c, item->pos, "%s: more than %d workers (EP_MAX_WORKERS)", ipath,
                             EP_MAX_WORKERS);
        if (spec_grow_workers(c) != 0)
            return -1;
        spec_worker *w = &s->workers[s->n_workers];
        *w = (spec_worker){.rank = s->n_workers, .node_index = c->cur_node, .pos = item->pos};
        if (spec_walk(c, item, &spec_worker_section, ipath, w) != 0)
            return -1;
        s->n_workers++;
    }
    return 0;
}

static const spec_field spec_node_fields[] = {
    {.key = "name",
     .handle = spec_h_name,
     .required = true,
     SPEC_STR(spec_node, name),
     SPEC_POS(spec_node, name_pos)},
    {.key = "workers", .handle = spec_h_workers, .required = true},
};
SPEC_SECTION(spec_node_section, spec_node_fields);

static int spec_h_nodes(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                        const char *path, void *obj)
{
    spec_cluster *s = c->s;
    s->nodes_pos = key->pos;
    if (val->kind != YK_SEQ)
        return spec_type_error(c, val, path, "a sequence of nodes (check indentation)");
    if (val->count == 0)
        return spec_fail(c, val->pos, "%s: expected at least one node", path);
    /* every node has a worker, so more nodes than EP_MAX_WORKERS cannot be valid */
    if (val->count > EP_MAX_WORKERS)
        return spec_fail(c, val->pos, "%s: more than %d nodes (EP_MAX_WORKERS)", path,
                         EP_MAX_WORKERS);
    s->nodes = calloc((size_t)val->count, sizeof *s->nodes);
    if (s->nodes == NULL)
        return ep_err_set(c->err, "%s: out of memory", c->file);
    int i = 0;
    for (const ynode *item = spec_node_at(c, val->first); item;
         item = spec_node_at(c, item->next)) {
        char ipath[64];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i);
        spec_node *n = &s->nodes[i];
        n->pos = item->pos;
        n->first_worker = s->n_workers;
        c->cur_node = i;
        if (spec_walk(c, item, &spec_node_section, ipath, n) != 0)
            return -1;
        n->n_workers = s->n_workers - n->first_worker;
        s->n_nodes = ++i;
    }
    return 0;
}

static const spec_field spec_cluster_fields[] = {
    {.key = "name", .handle = spec_h_name, .required = true, SPEC_STR(spec_cluster, name)},
};
SPEC_SECTION(spec_cluster_section, spec_cluster_fields);

#define SPEC_INT(type, member, min, max) .off = offsetof(type, member), .lo = (min), .hi = (max)

static const spec_field spec_coordinator_fields[] = {
    {.key = "listen",
     .handle = spec_h_bind_endpoint,
     .required = true,
     SPEC_STR(spec_cluster, listen),
     SPEC_POS(spec_cluster, listen_pos)},
    {.key = "admin",
     .handle = spec_h_bind_endpoint,
     .required = true,
     SPEC_STR(spec_cluster, admin),
     SPEC_POS(spec_cluster, admin_pos)},
    {.key = "heartbeat_ms", .handle = spec_h_int, SPEC_INT(spec_cluster, heartbeat_ms, 10, 60000)},
    {.key = "liveness", .handle = spec_h_int, SPEC_INT(spec_cluster, liveness, 1, 100)},
    {.key = "step_timeout_ms",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, step_timeout_ms, 100, 3600000)},
    {.key = "metrics",
     .handle = spec_h_metrics,
     SPEC_STR(spec_cluster, metrics),
     SPEC_POS(spec_cluster, metrics_pos)},
};
SPEC_SECTION(spec_coordinator_section, spec_coordinator_fields);

static const spec_field spec_model_fields[] = {
    {.key = "path",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, model_path),
     SPEC_POS(spec_cluster, model_pos)},
};
SPEC_SECTION(spec_model_section, spec_model_fields);

static const spec_field spec_ep_fields[] = {
    {.key = "placement", .handle = spec_h_placement, SPEC_POS(spec_cluster, placement_pos)},
    {.key = "redundant_experts",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, redundant_experts, 0, SPEC_MAX_REDUNDANT),
     SPEC_POS(spec_cluster, redundant_pos)},
    {.key = "expert_groups",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, expert_groups, 1, MC_MAX_EXPERTS),
     SPEC_POS(spec_cluster, groups_pos)},
    {.key = "window_steps",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, window_steps, 1, SPEC_MAX_WINDOW_STEPS)},
    {.key = "rebalance_every_steps",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, rebalance_every_steps, 0, 1000000000)},
    {.key = "dispatch", .handle = spec_h_dispatch, SPEC_POS(spec_cluster, dispatch_pos)},
    {.key = "data_plane", .handle = spec_h_data_plane, SPEC_POS(spec_cluster, data_plane_pos)},
    {.key = "rejoin", .handle = spec_h_rejoin},
    {.key = "max_experts_per_worker",
     .handle = spec_h_int,
     SPEC_INT(spec_cluster, max_experts_per_worker, 0, MC_MAX_EXPERTS),
     SPEC_POS(spec_cluster, max_experts_pos)},
    {.key = "gpu_gemm", .handle = spec_h_gpu_gemm},
};
SPEC_SECTION(spec_ep_section, spec_ep_fields);

static int spec_h_security(spec_ctx *c, const ynode *key, const ynode *val, const spec_field *f,
                           const char *path, void *obj)
{
    spec_cluster *s = obj;
    s->secure = true;
    s->security_pos = val->pos;
    return spec_walk(c, val, f->sub, path, obj);
}

static const spec_field spec_security_fields[] = {
    {.key = "coordinator_key",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, coordinator_key),
     SPEC_POS(spec_cluster, coordinator_key_pos)},
    {.key = "worker_keys",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, worker_keys),
     SPEC_POS(spec_cluster, worker_keys_pos)},
    {.key = "operator_keys",
     .handle = spec_h_path,
     .required = true,
     SPEC_STR(spec_cluster, operator_keys),
     SPEC_POS(spec_cluster, operator_keys_pos)},
    {.key = "client_keys",
     .handle = spec_h_path,
     SPEC_STR(spec_cluster, client_keys),
     SPEC_POS(spec_cluster, client_keys_pos)},
};
SPEC_SECTION(spec_security_section, spec_security_fields);

static const spec_field spec_top_fields[] = {
    {.key = "cluster", .handle = spec_h_section, .required = true, .sub = &spec_cluster_section},
    {.key = "coordinator",
     .handle = spec_h_section,
     .required = true,
     .sub = &spec_coordinator_section},
    {.key = "model", .handle = spec_h_section, .required = true, .sub = &spec_model_section},
    {.key = "expert_parallel", .handle = spec_h_section, .sub = &spec_ep_section},
    {.key = "nodes", .handle = spec_h_nodes, .required = true},
    {.key = "security", .handle = spec_h_security, .sub = &spec_security_section},
};
SPEC_SECTION(spec_top_section, spec_top_fields);

int spec_walk_top(spec_ctx *c)
{
    return spec_walk(c, &c->nodes[c->root], &spec_top_section, "", c->s);
}

const char *spec_placement_name(spec_placement p)
{
    return (unsigned)p < 3 ? spec_placement_names[p] : "unknown";
}

const char *spec_gpu_gemm_name(spec_gpu_gemm g)
{
    return (unsigned)g < 2 ? spec_gpu_gemm_names[g] : "unknown";
}

const char *spec_dispatch_name(spec_dispatch d)
{
    return (unsigned)d < 2 ? spec_dispatch_names[d] : "unknown";
}

const char *spec_data_plane_name(spec_data_plane p)
{
    return (unsigned)p < 2 ? spec_data_plane_names[p] : "unknown";
}

const char *spec_rejoin_name(spec_rejoin r)
{
    return (unsigned)r < 2 ? spec_rejoin_names[r] : "unknown";
}
