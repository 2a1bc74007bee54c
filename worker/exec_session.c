/*
 * exec_session.c — the session an executor works under: the validated WELCOME, its placements
 * and what a STEP must carry to run under it (exec_session.h).
 */
#include "worker/exec_session.h"

#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/model_msg.h"

/* ---- sessions ---------------------------------------------------------------------------------
 */

exec_session *exec_session_new(int n_experts, int world_size)
{
    exec_session *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->world_size = world_size;
    s->expert_owner = calloc((size_t)n_experts, sizeof *s->expert_owner);
    s->peer_endpoint = calloc((size_t)world_size, sizeof *s->peer_endpoint);
    s->peer_name = calloc((size_t)world_size, sizeof *s->peer_name);
    s->member = calloc((size_t)world_size, 1);
    if (s->expert_owner == NULL || s->peer_endpoint == NULL || s->peer_name == NULL ||
        s->member == NULL)
        exec_session_free(&s);
    return s;
}

void exec_session_free(exec_session **self_p)
{
    exec_session *s = *self_p;
    if (s == NULL)
        return;
    for (int r = 0; r < s->world_size; r++) {
        if (s->peer_endpoint)
            free(s->peer_endpoint[r]);
        if (s->peer_name)
            free(s->peer_name[r]);
    }
    free(s->peer_endpoint);
    free(s->peer_name);
    free(s->expert_owner);
    free(s->peer_key);
    free(s->checkpoint);
    free(s->member);
    pl_free(&s->place);
    free(s);
    *self_p = NULL;
}

/* A copy of s (its peers and config) for a staged epoch; NULL when out of memory. */
exec_session *exec_session_dup(const exec_session *s)
{
    exec_session *c = exec_session_new(s->config.n_routed_experts, s->world_size);
    if (c == NULL)
        return NULL;
    uint32_t *owner = c->expert_owner;
    uint8_t *member = c->member;
    char **pe = c->peer_endpoint, **pn = c->peer_name;
    *c = *s;
    c->expert_owner = owner;
    c->member = member;
    c->peer_endpoint = pe;
    c->peer_name = pn;
    c->place = s->place ? pl_copy(s->place) : NULL;
    memcpy(owner, s->expert_owner, (size_t)s->config.n_routed_experts * sizeof *owner);
    memcpy(member, s->member, (size_t)s->world_size);
    bool ok = s->place == NULL || c->place != NULL;
    /* the keys and the fingerprint are the copy's own (each session frees its arrays) */
    c->peer_key = NULL;
    c->checkpoint = NULL;
    if (ok && s->peer_key) {
        size_t n = (size_t)s->world_size * sizeof *s->peer_key;
        ok = (c->peer_key = malloc(n)) != NULL;
        if (ok)
            memcpy(c->peer_key, s->peer_key, n);
    }
    if (ok && s->n_checkpoint > 0) {
        size_t n = (size_t)s->n_checkpoint * sizeof *s->checkpoint;
        ok = (c->checkpoint = malloc(n)) != NULL;
        if (ok)
            memcpy(c->checkpoint, s->checkpoint, n);
    }
    for (int r = 0; r < s->world_size && ok; r++) {
        pe[r] = s->peer_endpoint[r] ? strdup(s->peer_endpoint[r]) : NULL;
        pn[r] = s->peer_name[r] ? strdup(s->peer_name[r]) : NULL;
        ok = (pe[r] || !s->peer_endpoint[r]) && (pn[r] || !s->peer_name[r]);
    }
    if (!ok)
        exec_session_free(&c);
    return c;
}

pl_table *exec_parse_placement(const exec_session *s, bool has_epoch, const uint32_t *owner,
                               size_t n_owner, const Epmoe__Placement *pm, const uint32_t *members,
                               size_t n_members, ep_err *err)
{
    if (!has_epoch) {
        ep_err_set(err, "epoch missing");
        return NULL;
    }
    pl_table *t = mmsg_placement_in(mc_num_layers(&s->config), s->config.n_routed_experts,
                                    s->world_size, owner, n_owner, pm, err);
    if (t == NULL)
        return NULL;
    if (n_members > (size_t)s->world_size) {
        ep_err_set(err, "%zu members, more than world_size %d", n_members, s->world_size);
        goto fail;
    }
    for (size_t i = 0; i < n_members; i++)
        if (members[i] >= (uint32_t)s->world_size || (i > 0 && members[i] <= members[i - 1])) {
            ep_err_set(err, "members[%zu] = %u: expected ascending ranks < world_size %d", i,
                       members[i], s->world_size);
            goto fail;
        }
    /* every holder must be a member: the others never get a STEP and would never answer */
    if (n_members > 0) {
        uint8_t *holds = malloc((size_t)s->world_size);
        if (holds == NULL) {
            ep_err_set(err, "out of memory");
            goto fail;
        }
        pl_members(t, holds);
        for (size_t i = 0; i < n_members; i++)
            holds[members[i]] = 0;
        for (int r = 0; r < s->world_size; r++)
            if (holds[r]) {
                free(holds);
                ep_err_set(err, "rank %d holds experts but is not a member", r);
                goto fail;
            }
        free(holds);
    }
    return t;
fail:
    pl_free(&t);
    return NULL;
}

void exec_adopt_placement(exec_session *s, pl_table **pl_p, const uint32_t *members,
                          size_t n_members)
{
    pl_free(&s->place);
    s->place = *pl_p;
    *pl_p = NULL;
    int E = s->config.n_routed_experts;
    if (!pl_flat_owner(s->place, s->expert_owner))
        for (int e = 0; e < E; e++) { /* NCCL's view: the first replica of layer 0 */
            int n;
            s->expert_owner[e] = pl_replicas(s->place, 0, e, &n)[0];
        }
    memset(s->member, n_members == 0, (size_t)s->world_size);
    for (size_t i = 0; i < n_members; i++)
        s->member[members[i]] = 1;
    s->n_members = n_members == 0 ? s->world_size : (int)n_members;
}

int exec_check_placement(const exec_session *s, bool has_epoch, const uint32_t *owner,
                         size_t n_owner, const uint32_t *members, size_t n_members, ep_err *err)
{
    pl_table *t = exec_parse_placement(s, has_epoch, owner, n_owner, NULL, members, n_members, err);
    int rc = t ? 0 : -1;
    pl_free(&t);
    return rc;
}

void exec_set_placement(exec_session *s, const uint32_t *owner, const uint32_t *members,
                        size_t n_members)
{
    pl_table *t =
        pl_flat(mc_num_layers(&s->config), s->config.n_routed_experts, s->world_size, owner, NULL);
    if (t != NULL)
        exec_adopt_placement(s, &t, members, n_members);
}

/* ---- what a STEP must carry -------------------------------------------------------------- */

int exec_step_check(const exec_session *ses, int n_layers, bool have_last, uint64_t last_step,
                    const Epmoe__Step *req, const wire_msg *m, ep_err *err)
{
    unsigned long long id = req->has_step_id ? (unsigned long long)req->step_id : 0;
    if (!req->has_step_id)
        return ep_err_set(err, "STEP without step_id");
    if (!req->has_epoch || !req->has_layer || !req->has_n_tokens || !req->has_session)
        return ep_err_set(err, "STEP %llu: session, epoch, layer or n_tokens missing", id);
    if (req->session != ses->session)
        return ep_err_set(err, "STEP %llu: session %016llx, this worker was welcomed into %016llx",
                          id, (unsigned long long)req->session, (unsigned long long)ses->session);
    if (req->epoch != ses->epoch)
        return ep_err_set(err, "STEP %llu: epoch %llu, this worker is at epoch %llu", id,
                          (unsigned long long)req->epoch, (unsigned long long)ses->epoch);
    if (have_last && req->step_id <= last_step)
        return ep_err_set(err, "STEP %llu: step ids must increase (last was %llu)", id,
                          (unsigned long long)last_step);
    if (req->layer >= (uint32_t)n_layers)
        return ep_err_set(err, "STEP %llu: layer %u outside [0, %d)", id, req->layer, n_layers);
    if (req->n_tokens > EP_MAX_TOKENS)
        return ep_err_set(err, "STEP %llu: %u tokens, at most %d", id, req->n_tokens,
                          EP_MAX_TOKENS);
    bool has_ids = req->has_has_ids && req->has_ids;
    size_t T = req->n_tokens, H = (size_t)ses->config.hidden_size;
    if (m->n_payloads != (has_ids ? 2 : 1) || m->payload_len[0] != T * H * 2 ||
        (has_ids && m->payload_len[1] != T * 8))
        return ep_err_set(err,
                          "STEP %llu: payloads of %d frames (%zu, %zu bytes), expected hidden "
                          "bf16 [%zu, %zu]%s",
                          id, m->n_payloads, m->n_payloads > 0 ? m->payload_len[0] : 0,
                          m->n_payloads > 1 ? m->payload_len[1] : 0, T, H,
                          has_ids ? " and ids int64" : "");
    if (mc_layer_is_hash(&ses->config, (int)req->layer) && !has_ids)
        return ep_err_set(err, "STEP %llu: layer %u is hash-routed: token ids are required", id,
                          req->layer);
    if (ck_check_input(m->payload[0], (int)T, (int)H, 0, err) != 0)
        return ep_err_prefix(err, "STEP %llu (tokens counted in this worker's chunk)", id);
    return 0;
}
