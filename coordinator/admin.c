/*
 * admin.c — the admin RPC's wire format (see admin.h). Replies are built on the stack from the
 * facts given and packed into the outbox at once.
 */
#include "coordinator/admin.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/model_msg.h"

void adm_reply(ob_box *out, const uint8_t *ident, size_t ident_len, uint64_t id,
               Epmoe__AdminReply *reply, const wire_payload *payloads, int n_payloads)
{
    reply->has_id = 1;
    reply->id = id;
    if (!reply->has_ok) {
        reply->has_ok = 1;
        reply->ok = reply->error == NULL;
    }
    ob_send(out, OB_TO_ADMIN, -1, ident, ident_len, EPMOE__MSG_TYPE__MSG_ADMIN_REPLY, &reply->base,
            payloads, n_payloads);
}

void adm_reply_error(ob_box *out, const uint8_t *ident, size_t ident_len, uint64_t id,
                     const ep_err *err)
{
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.has_ok = 1;
    rep.ok = 0;
    rep.has_error_code = 1;
    rep.error_code = wire_code(err);
    rep.error = (char *)err->msg; /* borrowed: adm_reply packs it at once */
    log_debug(LOG_SUB_NET, "admin request %" PRIu64 " failed: %s", id, err->msg);
    adm_reply(out, ident, ident_len, id, &rep, NULL, 0);
}

void adm_error(ob_box *out, const uint8_t *ident, size_t ident_len, uint64_t id,
               Epmoe__ErrorCode code, const char *fmt, ...)
{
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    adm_reply_error(out, ident, ident_len, id, &err);
}

void adm_reply_workers(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f, bool status)
{
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)f->spec->name;
    rep.state = (char *)f->state;
    rep.has_cluster_state = 1;
    rep.cluster_state = (Epmoe__ClusterState)f->cluster_state;
    rep.has_epoch = 1;
    rep.epoch = f->plan->epoch;
    rep.n_workers = (size_t)f->n_workers;
    rep.workers = f->workers;
    if (status) {
        rep.has_config_hash = 1;
        rep.config_hash = f->config_hash;
        rep.model_path = (char *)f->spec->model_path;
        rep.has_steps_done = 1;
        rep.steps_done = f->steps_done;
        rep.has_steps_failed = 1;
        rep.steps_failed = f->steps_failed;
        rep.has_current_epoch = 1;
        rep.current_epoch = f->current_epoch;
        if (f->problem[0])
            rep.problem = (char *)f->problem;
        rep.has_balance = f->balance > 0;
        rep.balance = f->balance;
        rep.has_staged_epoch = f->staged_epoch != 0;
        rep.staged_epoch = f->staged_epoch;
        rep.has_requests_served = rep.has_requests_failed = rep.has_request_rate = 1;
        rep.requests_served = f->requests_served;
        rep.requests_failed = f->requests_failed;
        rep.request_rate = f->request_rate;
    }
    adm_reply(out, m->ident, m->ident_len, id, &rep, NULL, 0);
}

void adm_reply_shards(ob_box *out, const wire_msg *m, const Epmoe__AdminRequest *rq,
                      const adm_facts *f)
{
    uint64_t id = rq->id;
    char lname[64] = "";
    int layer = 0;
    const plan_table *p = f->plan;
    if (rq->layer != NULL || pl_stored(p->pl) > 1) {
        /* each MoE layer has its own table; without --layer the first is shown, named when
         * the layers differ */
        ep_err err;
        if (rq->layer != NULL && ck_layer_parse(f->cfg, rq->layer, &layer, &err) != 0) {
            adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                      "SHARDS: %s", err.msg);
            return;
        }
        int k = ck_layer_prefix(f->cfg, layer, lname, sizeof lname);
        if (k > 0 && lname[k - 1] == '.')
            lname[k - 1] = '\0';
    }
    int P = p->n_ranks;
    Epmoe__Shard *sh = calloc((size_t)P, sizeof *sh);
    Epmoe__Shard **sp = calloc((size_t)P, sizeof *sp);
    size_t slots = 0; /* replicas of the layer: more than E with redundant experts */
    for (int e = 0; e < p->n_experts; e++) {
        int n;
        plan_replicas(p, layer, e, &n);
        slots += (size_t)n;
    }
    uint32_t *ex = calloc(slots + 1, sizeof *ex);
    int *tmp = calloc((size_t)p->n_experts, sizeof *tmp);
    if (sh == NULL || sp == NULL || ex == NULL || tmp == NULL) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "the coordinator is out of memory");
        goto done;
    }
    size_t used = 0;
    for (int r = 0; r < P; r++) {
        int n = plan_rank_experts(p, layer, r, tmp, p->n_experts);
        epmoe__shard__init(&sh[r]);
        sh[r].has_rank = 1;
        sh[r].rank = (uint32_t)r;
        sh[r].worker = (char *)f->spec->workers[r].name;
        sh[r].n_experts = (size_t)n;
        sh[r].experts = ex + used;
        for (int i = 0; i < n; i++)
            ex[used + (size_t)i] = (uint32_t)tmp[i];
        used += (size_t)n;
        sp[r] = &sh[r];
    }
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)f->spec->name;
    rep.has_epoch = 1;
    rep.epoch = p->epoch;
    rep.placement = (char *)spec_placement_name(p->placement);
    rep.n_shards = (size_t)P;
    rep.shards = sp;
    if (lname[0])
        rep.layer = lname;
    adm_reply(out, m->ident, m->ident_len, id, &rep, NULL, 0);
done:
    free(sh);
    free(sp);
    free(ex);
    free(tmp);
}

void adm_reply_config(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f)
{
    Epmoe__ModelConfig mc;
    mmsg_from_config(f->cfg, &mc);
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)f->spec->name;
    rep.config = &mc;
    rep.has_config_hash = 1;
    rep.config_hash = f->config_hash;
    rep.model_path = (char *)f->spec->model_path;
    rep.has_epoch = 1;
    rep.epoch = f->plan->epoch;
    adm_reply(out, m->ident, m->ident_len, id, &rep, NULL, 0);
}

void adm_reply_client_info(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f)
{
    if (f->spec->data_plane == SPEC_PLANE_NCCL) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_NOT_SUPPORTED,
                  "CLIENT_INFO: cluster %s serves clients not on this data plane (nccl): its "
                  "steps are collective; use data_plane zmq",
                  f->spec->name);
        return;
    }
    int n = f->n_workers;
    Epmoe__WorkerInfo *wi = calloc((size_t)n + 1, sizeof *wi);
    Epmoe__WorkerInfo **wp = calloc((size_t)n + 1, sizeof *wp);
    if (wi == NULL || wp == NULL) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "the coordinator is out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) { /* a client key learns nothing it does not need */
        const Epmoe__WorkerInfo *src = f->workers[i];
        epmoe__worker_info__init(&wi[i]);
        wi[i].name = src->name;
        wi[i].has_rank = src->has_rank;
        wi[i].rank = src->rank;
        wi[i].state = src->state;
        wi[i].has_worker_state = src->has_worker_state;
        wi[i].worker_state = src->worker_state;
        wi[i].has_member = src->has_member;
        wi[i].member = src->member;
        wi[i].has_epoch = src->has_epoch;
        wi[i].epoch = src->epoch;
        wi[i].client_endpoint = src->client_endpoint;
        if (f->worker_key != NULL) {
            wi[i].has_public_key = 1;
            wi[i].public_key.len = AUTH_KEY_BYTES;
            wi[i].public_key.data = (uint8_t *)f->worker_key[i];
        }
        wp[i] = &wi[i];
    }
    Epmoe__ModelConfig mc;
    mmsg_from_config(f->cfg, &mc);
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)f->spec->name;
    rep.state = (char *)f->state;
    rep.has_cluster_state = 1;
    rep.cluster_state = (Epmoe__ClusterState)f->cluster_state;
    if (f->problem[0]) /* blocked: clients refuse requests at once, saying why */
        rep.problem = (char *)f->problem;
    rep.config = &mc;
    rep.has_config_hash = 1;
    rep.config_hash = f->config_hash;
    rep.has_epoch = rep.has_current_epoch = 1;
    rep.epoch = f->plan->epoch;
    rep.current_epoch = f->current_epoch;
    rep.has_max_tokens = 1;
    rep.max_tokens = EP_MAX_TOKENS; /* what a worker's SUBMIT takes (worker/serve.c) */
    rep.n_workers = (size_t)n;
    rep.workers = wp;
    adm_reply(out, m->ident, m->ident_len, id, &rep, NULL, 0);
done:
    free(wi);
    free(wp);
}

void adm_reply_shutdown(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f)
{
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)f->spec->name;
    rep.state = "stopping";
    rep.has_cluster_state = 1;
    rep.cluster_state = EPMOE__CLUSTER_STATE__CLUSTER_STOPPING;
    adm_reply(out, m->ident, m->ident_len, id, &rep, NULL, 0);
}

void adm_reply_unknown_verb(ob_box *out, const wire_msg *m, const Epmoe__AdminRequest *rq)
{
    adm_error(out, m->ident, m->ident_len, rq->id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
              "unknown verb %d (expected STATUS 1, WORKERS 2, SHARDS 3, CONFIG 4, FORWARD 5, "
              "SHUTDOWN 6, DRAIN 7, UNDRAIN 8, RELOAD 9, REBALANCE 20, CLIENT_INFO 21)",
              (int)rq->verb);
}

Epmoe__AdminRequest *adm_parse(const wire_msg *m, ob_box *out)
{
    ep_err err;
    if (m->type != EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST) {
        if (m->type != EPMOE__MSG_TYPE__MSG_ERROR)
            ob_error(out, OB_TO_ADMIN, -1, m->ident, m->ident_len,
                     EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE, m->type,
                     "coordinator.admin accepts ADMIN_REQUEST only, not %s (workers connect to "
                     "coordinator.listen)",
                     wire_type_name(m->type));
        return NULL;
    }
    Epmoe__AdminRequest *rq =
        (Epmoe__AdminRequest *)wire_unpack(&epmoe__admin_request__descriptor, m, &err);
    if (rq == NULL) {
        ob_error(out, OB_TO_ADMIN, -1, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_MALFORMED,
                 m->type, "%s", err.msg);
        return NULL;
    }
    uint64_t id = rq->has_id ? rq->id : 0;
    if (!rq->has_id || !rq->has_verb) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "AdminRequest without %s", rq->has_id ? "a verb" : "an id");
        goto refuse;
    }
    if (rq->verb != EPMOE__ADMIN_VERB__ADMIN_FORWARD && m->n_payloads > 0) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "%d unexpected payloads (only FORWARD carries payloads)", m->n_payloads);
        goto refuse;
    }
    log_debug(LOG_SUB_NET, "admin request %" PRIu64 ": verb %d", id, (int)rq->verb);
    return rq;
refuse:
    wire_free_unpacked(&rq->base);
    return NULL;
}

/* The measured balance of one layer under the current table (0: no load in the window). */
static double adm_measured(const adm_rebalance *rb, int layer)
{
    const plan_table *t = rb->current;
    uint8_t *holds = calloc((size_t)t->n_ranks, 1);
    if (holds == NULL)
        return 0;
    for (int e = 0; e < t->n_experts; e++) {
        int n;
        const uint16_t *reps = plan_replicas(t, layer, e, &n);
        for (int i = 0; i < n; i++)
            holds[reps[i]] = 1;
    }
    double b = stats_measured_balance(rb->stats, layer, holds);
    free(holds);
    return b;
}

void adm_reply_rebalance(ob_box *out, const wire_msg *m, uint64_t id, const char *cluster,
                         const adm_rebalance *rb)
{
    const plan_report *rep = rb->report;
    int L = rep->n_layers, n = 0;
    Epmoe__LayerBalance *lb = calloc((size_t)L + 1, sizeof *lb);
    Epmoe__LayerBalance **lp = calloc((size_t)L + 1, sizeof *lp);
    char(*names)[32] = calloc((size_t)L + 1, sizeof *names);
    if (lb == NULL || lp == NULL || names == NULL) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "the coordinator is out of memory");
        goto done;
    }
    for (int l = 0; l < L; l++) {
        if (rep->layer_before[l] <= 0)
            continue; /* no load in the window */
        Epmoe__LayerBalance *b = &lb[n];
        epmoe__layer_balance__init(b);
        b->has_layer = b->has_before = b->has_after = b->has_moved = 1;
        b->layer = (uint32_t)l;
        int k = ck_layer_prefix(rb->cfg, l, names[n], sizeof names[n]);
        if (k > 0 && names[n][k - 1] == '.')
            names[n][k - 1] = '\0';
        b->name = names[n];
        b->before = rep->layer_before[l];
        b->after = rep->layer_after[l];
        b->moved = (uint32_t)rep->layer_moved[l];
        double meas = adm_measured(rb, l);
        b->has_measured = meas > 0;
        b->measured = meas;
        lp[n] = b;
        n++;
    }
    Epmoe__RebalanceInfo ri = EPMOE__REBALANCE_INFO__INIT;
    ri.has_epoch_before = ri.has_epoch_after = ri.has_balance_before = ri.has_balance_after = 1;
    ri.has_moved_experts = ri.has_applied = ri.has_hierarchical = ri.has_window_steps = 1;
    ri.has_plan_seconds = 1;
    ri.epoch_before = rb->epoch_before;
    ri.epoch_after = rb->epoch_after;
    ri.balance_before = rep->balance_before;
    ri.balance_after = rep->balance_after;
    ri.moved_experts = rep->moved > 0 ? (uint64_t)rep->moved : 0;
    ri.applied = rb->applied;
    ri.hierarchical = rep->hierarchical;
    ri.window_steps = (uint32_t)rb->window_steps;
    ri.plan_seconds = rb->plan_seconds;
    ri.n_layers = (size_t)n;
    ri.layers = lp;
    Epmoe__AdminReply r = EPMOE__ADMIN_REPLY__INIT;
    r.cluster = (char *)cluster;
    r.has_epoch = 1;
    r.epoch = rb->epoch_after;
    r.rebalance = &ri;
    adm_reply(out, m->ident, m->ident_len, id, &r, NULL, 0);
done:
    free(lb);
    free(lp);
    free(names);
}
