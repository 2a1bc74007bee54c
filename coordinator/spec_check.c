/*
 * spec_check.c — the cross-field rules of a cluster spec and the resolution of its paths (see
 * spec_check.h), and the check of its expert_parallel section against the model
 * (spec_check_experts, spec.h). The first error wins.
 */
#include "coordinator/spec_check.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* ---- cross-field rules -------------------------------------------------------------------- */

static void spec_worker_path(const spec_cluster *s, int i, char *buf, size_t cap)
{
    const spec_worker *w = &s->workers[i];
    snprintf(buf, cap, "nodes[%d].workers[%d]", w->node_index,
             i - s->nodes[w->node_index].first_worker);
}

/* Rules between two workers: i is checked against every earlier worker j. */
static int spec_check_pair(const spec_ctx *c, int i, int j)
{
    const spec_worker *w = &c->s->workers[i], *o = &c->s->workers[j];
    char path[96];
    spec_worker_path(c->s, i, path, sizeof path);
    if (strcmp(w->name, o->name) == 0)
        return spec_fail(c, w->name_pos,
                         "%s.name: duplicate worker name \"%s\" (first defined at line %d, "
                         "column %d)",
                         path, w->name, o->name_pos.line, o->name_pos.col);
    if (strcmp(w->data, o->data) == 0)
        return spec_fail(c, w->data_pos,
                         "%s.data: duplicate data endpoint \"%s\" (already used by worker %s at "
                         "line %d, column %d)",
                         path, w->data, o->name, o->data_pos.line, o->data_pos.col);
    if (w->metrics[0] && strcmp(w->metrics, o->metrics) == 0)
        return spec_fail(c, w->metrics_pos,
                         "%s.metrics: duplicate metrics address \"%s\" (already used by worker "
                         "%s at line %d, column %d)",
                         path, w->metrics, o->name, o->metrics_pos.line, o->metrics_pos.col);
    /* Several workers may share one GPU (each has its own stream and arena; tests and small
     * models do this), but NCCL refuses two ranks of a communicator on one device. */
    if (c->s->data_plane == SPEC_PLANE_NCCL && w->node_index == o->node_index &&
        w->cuda_index >= 0 && w->cuda_index == o->cuda_index)
        return spec_fail(c, w->device_pos,
                         "%s.device: device \"%s\" is already used by worker %s on this node "
                         "(line %d, column %d); data_plane nccl (line %d, column %d) needs one "
                         "worker per GPU",
                         path, w->device, o->name, o->device_pos.line, o->device_pos.col,
                         c->s->data_plane_pos.line, c->s->data_plane_pos.col);
    return 0;
}

/* NCCL moves device memory between GPUs: every worker must be on one, and the NCCL step
 * driver sends what the GPU quantized (fp8); bf16 dispatch is a ZeroMQ-plane option. */
static int spec_check_nccl(const spec_ctx *c)
{
    const spec_cluster *s = c->s;
    if (s->data_plane != SPEC_PLANE_NCCL)
        return 0;
    if (s->dispatch != SPEC_DISPATCH_FP8)
        return spec_fail(c, s->dispatch_pos,
                         "expert_parallel.dispatch: data_plane nccl (line %d, column %d) sends "
                         "fp8 dispatch only, found %s",
                         s->data_plane_pos.line, s->data_plane_pos.col,
                         spec_dispatch_name(s->dispatch));
    /* its step driver routes by one owner per expert, the same in every layer */
    if (s->placement == SPEC_PLACE_EPLB || s->redundant_experts > 0 || s->rebalance_every_steps > 0)
        return spec_fail(c, s->placement_pos.line ? s->placement_pos : s->data_plane_pos,
                         "expert_parallel: data_plane nccl (line %d, column %d) routes by one "
                         "owner per expert in every layer: placement eplb, redundant_experts and "
                         "rebalance_every_steps need data_plane zmq",
                         s->data_plane_pos.line, s->data_plane_pos.col);
    for (int i = 0; i < s->n_workers; i++) {
        const spec_worker *w = &s->workers[i];
        if (w->cuda_index >= 0)
            continue;
        char path[96];
        spec_worker_path(s, i, path, sizeof path);
        return spec_fail(c, w->device_pos,
                         "%s.device: data_plane nccl (line %d, column %d) requires every worker "
                         "on a cuda:N device, worker %s is on \"%s\"",
                         path, s->data_plane_pos.line, s->data_plane_pos.col, w->name, w->device);
    }
    return 0;
}

/* Whether the admin endpoint can only be reached from this host: ipc://, or tcp on a loopback
 * address (127.0.0.0/8, [::1], localhost). */
static bool spec_admin_local(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0)
        return true;
    const char *hp = ep + 6, *colon = strrchr(hp, ':');
    if (strncmp(ep, "tcp://", 6) != 0 || colon == NULL)
        return false;
    size_t hn = (size_t)(colon - hp);
    if ((hn == 9 && strncmp(hp, "localhost", 9) == 0) || (hn == 5 && strncmp(hp, "[::1]", 5) == 0))
        return true;
    char host[64];
    if (hn >= sizeof host || hn < 4 || strncmp(hp, "127.", 4) != 0)
        return false;
    memcpy(host, hp, hn);
    host[hn] = '\0';
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1;
}

/* The spec endpoint other than worker i's client endpoint that equals it: its key ("listen",
 * "workers[j].data", ...) in what and its position, or false when there is none. Every other
 * endpoint is checked, since two sockets cannot bind one endpoint. */
static bool spec_client_clash(const spec_cluster *s, int i, char *what, size_t cap, spec_pos *at)
{
    const char *ep = s->workers[i].client;
    if (strcmp(ep, s->listen) == 0 || strcmp(ep, s->admin) == 0) {
        bool l = strcmp(ep, s->listen) == 0;
        snprintf(what, cap, "coordinator.%s", l ? "listen" : "admin");
        *at = l ? s->listen_pos : s->admin_pos;
        return true;
    }
    for (int j = 0; j < s->n_workers; j++) {
        const spec_worker *o = &s->workers[j];
        bool data = strcmp(ep, o->data) == 0, client = j < i && strcmp(ep, o->client) == 0;
        if (!data && !client)
            continue;
        char opath[96];
        spec_worker_path(s, j, opath, sizeof opath);
        snprintf(what, cap, "%s.%s (worker %s)", opath, data ? "data" : "client", o->name);
        *at = data ? o->data_pos : o->client_pos;
        return true;
    }
    return false;
}

static int spec_check_clients(const spec_ctx *c)
{
    const spec_cluster *s = c->s;
    for (int i = 0; i < s->n_workers; i++) {
        const spec_worker *w = &s->workers[i];
        char what[160], path[96];
        spec_pos at;
        if (!w->client[0] || !spec_client_clash(s, i, what, sizeof what, &at))
            continue;
        spec_worker_path(s, i, path, sizeof path);
        return spec_fail(c, w->client_pos,
                         "%s.client: duplicate endpoint \"%s\" (already used by %s at line %d, "
                         "column %d); every socket needs an endpoint of its own",
                         path, w->client, what, at.line, at.col);
    }
    return 0;
}

int spec_cross_check(const spec_ctx *c)
{
    const spec_cluster *s = c->s;
    if (spec_check_nccl(c) != 0)
        return -1;
    if (strcmp(s->listen, s->admin) == 0)
        return spec_fail(c, s->admin_pos,
                         "coordinator.admin: endpoint \"%s\" is also coordinator.listen (line %d, "
                         "column %d); the two sockets need different endpoints",
                         s->admin, s->listen_pos.line, s->listen_pos.col);
    for (int i = 0; i < s->n_nodes; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(s->nodes[i].name, s->nodes[j].name) == 0)
                return spec_fail(c, s->nodes[i].name_pos,
                                 "nodes[%d].name: duplicate node name \"%s\" (first defined at "
                                 "line %d, column %d)",
                                 i, s->nodes[i].name, s->nodes[j].name_pos.line,
                                 s->nodes[j].name_pos.col);
    for (int i = 0; i < s->n_workers; i++) {
        const spec_worker *w = &s->workers[i];
        if (strcmp(w->data, s->listen) == 0 || strcmp(w->data, s->admin) == 0) {
            char path[96];
            spec_worker_path(s, i, path, sizeof path);
            bool l = strcmp(w->data, s->listen) == 0;
            spec_pos at = l ? s->listen_pos : s->admin_pos;
            return spec_fail(c, w->data_pos,
                             "%s.data: duplicate data endpoint \"%s\" (already used by "
                             "coordinator.%s at line %d, column %d)",
                             path, w->data, l ? "listen" : "admin", at.line, at.col);
        }
        if (w->metrics[0] && strcmp(w->metrics, s->metrics) == 0) {
            char path[96];
            spec_worker_path(s, i, path, sizeof path);
            return spec_fail(c, w->metrics_pos,
                             "%s.metrics: duplicate metrics address \"%s\" (already used by "
                             "coordinator.metrics at line %d, column %d)",
                             path, w->metrics, s->metrics_pos.line, s->metrics_pos.col);
        }
        for (int j = 0; j < i; j++)
            if (spec_check_pair(c, i, j) != 0)
                return -1;
    }
    if (spec_check_clients(c) != 0)
        return -1;
    /* Without authentication one SHUTDOWN from anyone who can connect stops the cluster. */
    if (!s->secure && !spec_admin_local(s->admin))
        return spec_fail(c, s->admin_pos,
                         "coordinator.admin: \"%s\" can be reached from other hosts, and without a "
                         "security: section anyone who connects may stop the cluster; bind it to "
                         "127.0.0.1, [::1], localhost or ipc://PATH, or add security: "
                         "(docs/operations.md, \"Security\")",
                         s->admin);
    return 0;
}

/* A path of the spec (cap EP_MAX_PATH) made relative to the spec file's directory. */
static int spec_resolve_path(const spec_ctx *c, char *p, spec_pos pos, const char *key)
{
    if (p[0] == '/' || p[0] == '\0' || c->basedir[0] == '\0')
        return 0;
    char joined[EP_MAX_PATH];
    size_t dl = strlen(c->basedir);
    const char *sep = c->basedir[dl - 1] == '/' ? "" : "/";
    int n = snprintf(joined, sizeof joined, "%s%s%s", c->basedir, sep, p);
    if (n < 0 || (size_t)n >= sizeof joined)
        return spec_fail(c, pos, "%s: relative to %s it is longer than %d bytes", key, c->basedir,
                         EP_MAX_PATH - 1);
    memcpy(p, joined, (size_t)n + 1);
    return 0;
}

int spec_resolve_model(const spec_ctx *c)
{
    spec_cluster *s = c->s;
    if (spec_resolve_path(c, s->model_path, s->model_pos, "model.path") != 0)
        return -1;
    if (!s->secure)
        return 0;
    if (spec_resolve_path(c, s->coordinator_key, s->coordinator_key_pos,
                          "security.coordinator_key") != 0 ||
        spec_resolve_path(c, s->worker_keys, s->worker_keys_pos, "security.worker_keys") != 0 ||
        spec_resolve_path(c, s->operator_keys, s->operator_keys_pos, "security.operator_keys") !=
            0 ||
        spec_resolve_path(c, s->client_keys, s->client_keys_pos, "security.client_keys") != 0)
        return -1;
    return 0;
}

int spec_check_experts(const spec_cluster *s, int n_experts, ep_err *err)
{
    int p = s->n_workers, red = s->redundant_experts;
    spec_pos at = s->nodes_pos, rp = s->redundant_pos, gp = s->groups_pos;
    if (n_experts < 1 || n_experts > MC_MAX_EXPERTS)
        return ep_err_set(err, "%s: the model has %d routed experts (expected 1..%d)", s->file,
                          n_experts, MC_MAX_EXPERTS);
    if (red > 0 && s->placement != SPEC_PLACE_EPLB)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.redundant_experts: %d needs placement eplb "
                          "(replicas are placed by EPLB; placement is %s)",
                          s->file, rp.line, rp.col, red, spec_placement_name(s->placement));
    if ((int64_t)n_experts + red > (int64_t)n_experts * p)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.redundant_experts: %d experts + %d redundant "
                          "need more than one replica of an expert on some of the %d workers",
                          s->file, rp.line, rp.col, n_experts, red, p);
    if (p > n_experts + red)
        return ep_err_set(err,
                          "%s:%d:%d: nodes: %d workers are more than the model's %d experts%s "
                          "(every worker must own at least one expert)",
                          s->file, at.line, at.col, p, n_experts + red,
                          red ? " and redundant slots" : "");
    if (s->placement == SPEC_PLACE_CONTIGUOUS && n_experts % p != 0)
        return ep_err_set(err,
                          "%s:%d:%d: nodes: %d workers do not divide the model's %d experts "
                          "evenly (placement contiguous needs n_routed_experts %% workers == 0; "
                          "round_robin and eplb do not)",
                          s->file, at.line, at.col, p, n_experts);
    if (n_experts % s->expert_groups != 0)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.expert_groups: %d groups do not divide the "
                          "model's %d experts",
                          s->file, gp.line, gp.col, s->expert_groups, n_experts);
    /* what the spec's placement gives its busiest worker */
    int most = (n_experts + red + p - 1) / p;
    spec_pos mp = s->max_experts_pos;
    if (s->max_experts_per_worker > 0 && s->max_experts_per_worker < most)
        return ep_err_set(err,
                          "%s:%d:%d: expert_parallel.max_experts_per_worker: %d is less than the "
                          "%d experts the placement gives a worker (%d experts over %d workers)",
                          s->file, mp.line, mp.col, s->max_experts_per_worker, most,
                          n_experts + red, p);
    return 0;
}
