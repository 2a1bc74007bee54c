/*
 * info.c — the coordinator's CLIENT_INFO answer as libepmoe keeps it (cl_info), and which
 * member a request goes to (client_state.h): a ready one with room below the credit it gave
 * this client, the one holding least of them (docs/client.md "Flow control").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_state.h"

void cl_info_free(cl_info *info)
{
    free(info->members);
    info->members = NULL;
    info->n_members = 0;
}

static int cl_info_shape(const Epmoe__ModelConfig *m, epmoe_info *s, epmoe_error *err)
{
    if (m == NULL || !m->has_hidden_size || !m->has_num_hidden_layers ||
        !m->has_num_experts_per_tok || !m->has_n_routed_experts || m->hidden_size == 0 ||
        m->num_experts_per_tok == 0)
        return cl_fail(err, EPMOE_EPROTO, 0, "CLIENT_INFO without a complete model config");
    memset(s, 0, sizeof *s);
    s->hidden_size = m->hidden_size;
    s->n_main_layers = m->num_hidden_layers;
    s->n_layers = m->num_hidden_layers + m->num_nextn_predict_layers;
    s->n_hash_layers = m->num_hash_layers;
    s->topk = m->num_experts_per_tok;
    s->n_experts = m->n_routed_experts;
    s->vocab_size = m->vocab_size;
    bool fp8 = m->has_expert_dtype && m->expert_dtype == EPMOE__EXPERT_DTYPE__EXPERT_FP8;
    snprintf(s->expert_dtype, sizeof s->expert_dtype, "%s", fp8 ? "fp8" : "fp4");
    s->max_tokens = EP_MAX_TOKENS;
    return 0;
}

static void cl_info_member(const Epmoe__WorkerInfo *w, cl_member *m)
{
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", w->name ? w->name : "?");
    m->rank = w->rank;
    if (w->client_endpoint && strlen(w->client_endpoint) < sizeof m->endpoint)
        snprintf(m->endpoint, sizeof m->endpoint, "%s", w->client_endpoint);
    if (w->has_public_key && w->public_key.len == AUTH_KEY_BYTES) {
        m->has_key = true;
        memcpy(m->key, w->public_key.data, AUTH_KEY_BYTES);
    }
    snprintf(m->state, sizeof m->state, "%s", w->state ? w->state : "?");
    m->member = w->has_member && w->member;
    /* by the code: a state without one (an older coordinator) is neither ready nor dead */
    int st = w->has_worker_state ? (int)w->worker_state : 0;
    m->dead = st == EPMOE__WORKER_STATE__WORKER_DEAD;
    m->ready = m->member && st == EPMOE__WORKER_STATE__WORKER_READY && m->endpoint[0] != '\0';
}

int cl_info_from_reply(const Epmoe__AdminReply *r, cl_info *out, epmoe_error *err)
{
    memset(out, 0, sizeof *out);
    if (!r->ok)
        return cl_fail(err, cl_map_remote(r->has_error_code ? (int)r->error_code : -1),
                       r->has_error_code ? (int)r->error_code : 0, "%s",
                       r->error ? r->error : "CLIENT_INFO failed");
    int rc = cl_info_shape(r->config, &out->shape, err);
    if (rc != 0)
        return rc;
    if (r->n_workers > EP_MAX_WORKERS)
        return cl_fail(err, EPMOE_EPROTO, 0, "CLIENT_INFO with %zu workers (at most %d)",
                       r->n_workers, EP_MAX_WORKERS);
    out->shape.config_hash = r->config_hash;
    /* what the workers take (an older coordinator does not say: this build's limit) */
    if (r->has_max_tokens && r->max_tokens > 0 && r->max_tokens <= EP_MAX_TOKENS)
        out->shape.max_tokens = r->max_tokens;
    out->shape.epoch = r->has_current_epoch ? r->current_epoch : r->epoch;
    snprintf(out->cluster, sizeof out->cluster, "%s", r->cluster ? r->cluster : "?");
    snprintf(out->state, sizeof out->state, "%s", r->state ? r->state : "?");
    out->cluster_state = r->has_cluster_state ? (int)r->cluster_state : 0;
    out->blocked = out->cluster_state == EPMOE__CLUSTER_STATE__CLUSTER_BLOCKED;
    snprintf(out->problem, sizeof out->problem, "%s", r->problem ? r->problem : "");
    out->members = calloc(r->n_workers + 1, sizeof *out->members);
    if (out->members == NULL)
        return cl_fail(err, EPMOE_ENOMEM, 0, "out of memory");
    out->n_members = (uint32_t)r->n_workers;
    for (size_t i = 0; i < r->n_workers; i++)
        cl_info_member(r->workers[i], &out->members[i]);
    return 0;
}

static bool cl_usable(const epmoe_client *c, const cl_member *m)
{
    return m->ready && (!c->secure || m->has_key);
}

/* A member that is not ready yet (loading, registering again after a coordinator restart) but
 * has a client endpoint: it holds a request until it serves its epoch again, so it is the next
 * best entry when no member is ready. */
static bool cl_reachable(const epmoe_client *c, const cl_member *m)
{
    return m->member && m->endpoint[0] && !m->dead && (!c->secure || m->has_key);
}

/* The preferred member (options.entry: a name or a client endpoint) if ok for it, or -1. */
static int cl_preferred(const epmoe_client *c, bool (*ok)(const epmoe_client *, const cl_member *))
{
    if (!c->entry_pref[0])
        return -1;
    for (uint32_t i = 0; i < c->info.n_members; i++) {
        const cl_member *m = &c->info.members[i];
        if (strcmp(m->name, c->entry_pref) == 0 || strcmp(m->endpoint, c->entry_pref) == 0)
            return ok(c, m) ? (int)i : -1;
    }
    return -1;
}

bool cl_has_ready_entry(const epmoe_client *c)
{
    for (uint32_t i = 0; i < c->info.n_members; i++)
        if (cl_usable(c, &c->info.members[i]))
            return true;
    return false;
}

bool cl_has_entry(const epmoe_client *c)
{
    for (uint32_t i = 0; i < c->info.n_members; i++)
        if (cl_reachable(c, &c->info.members[i]))
            return true;
    return false;
}

bool cl_entry_reachable(const epmoe_client *c, int i)
{
    return i >= 0 && (uint32_t)i < c->info.n_members && cl_reachable(c, &c->info.members[i]);
}

/* Member i can take one more request of this client now: below its credit, and not pausing
 * after a refusal for load. */
static bool cl_has_room(const epmoe_client *c, uint32_t i, int64_t now)
{
    const cl_flow *f = &c->flow[i];
    return f->held < f->credit && now >= f->busy_until_ns;
}

/* a holds less of its credit than b */
static bool cl_less_held(const cl_flow *a, const cl_flow *b)
{
    return (uint64_t)a->held * b->credit < (uint64_t)b->held * a->credit;
}

/* The member by what it holds among those ok; *full when one was ok but had no room. */
static int cl_pick_among(epmoe_client *c, int avoid, int64_t now,
                         bool (*ok)(const epmoe_client *, const cl_member *), bool *full)
{
    uint32_t n = c->info.n_members;
    int pref = cl_preferred(c, ok);
    if (pref >= 0 && pref != avoid) {
        if (cl_has_room(c, (uint32_t)pref, now))
            return pref;
        *full = true;
        /* out of credit: its own answers will make room. Refusing for load (full with other
         * clients' requests), the others take this one meanwhile. */
        if (now >= c->flow[pref].busy_until_ns)
            return -1;
    }
    int best = -1, only = -1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (c->rotor + k) % n;
        if (!ok(c, &c->info.members[i]))
            continue;
        if (!cl_has_room(c, i, now)) {
            *full = true;
        } else if ((int)i == avoid) {
            only = (int)i;
        } else if (best < 0 || cl_less_held(&c->flow[i], &c->flow[best])) {
            best = (int)i;
        }
    }
    if (best >= 0)
        c->rotor = (uint32_t)best + 1;
    return best >= 0 ? best : only;
}

/* A ready member first, else one that will be; none with room while some are full: wait. */
int cl_pick_entry(epmoe_client *c, int avoid, int64_t now)
{
    if (c->info.n_members == 0)
        return -1;
    bool full = false;
    int i = cl_pick_among(c, avoid, now, cl_usable, &full);
    if (i >= 0 || full)
        return i >= 0 ? i : CL_PICK_WAIT;
    i = cl_pick_among(c, avoid, now, cl_reachable, &full);
    return i >= 0 ? i : full ? CL_PICK_WAIT : -1;
}

void cl_not_ready_text(const cl_info *info, bool secure, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    if (info->n_members == 0)
        snprintf(buf, cap, "no workers");
    for (uint32_t i = 0; i < info->n_members && len + 1 < cap; i++) {
        const cl_member *m = &info->members[i];
        const char *why = !m->member                          ? "not a member"
                          : !m->endpoint[0]                   ? "no client endpoint"
                          : m->ready && !m->has_key && secure ? "no public key"
                                                              : m->state;
        len += (size_t)snprintf(buf + len, cap - len, "%s%s (%s)", i ? ", " : "", m->name, why);
    }
}

int cl_check_entry(const epmoe_client *c, epmoe_error *err)
{
    /* an endpoint may be one a worker has not reported yet; a name is one of the spec's */
    if (!c->entry_pref[0] || strstr(c->entry_pref, "://") != NULL)
        return 0;
    char names[256] = "";
    size_t len = 0;
    for (uint32_t i = 0; i < c->info.n_members; i++) {
        if (strcmp(c->info.members[i].name, c->entry_pref) == 0)
            return 0;
        if (len + 1 < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                    c->info.members[i].name);
    }
    return cl_fail(err, EPMOE_EINVAL, 0,
                   "options.entry \"%.64s\": no such worker in cluster %s (workers: %s); give a "
                   "worker's name or a client endpoint (scheme://...)",
                   c->entry_pref, c->info.cluster, c->info.n_members ? names : "none");
}
