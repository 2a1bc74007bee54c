/*
 * admin.c — the admin RPC verbs (see admin.h). Replies are built on the stack from the daemon's
 * state and sent at once; only FORWARD outlives its message (the sequencer owns it).
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
#include "coordinator/registry.h"
#include "coordinator/sequencer.h"

/* Messages handled per socket per loop iteration, so one busy socket cannot starve the other. */
#define ADM_BATCH 64

void adm_send(coord *c, const uint8_t *ident, size_t ident_len, uint64_t id,
              Epmoe__AdminReply *reply, const wire_payload *payloads, int n_payloads)
{
    reply->has_id = 1;
    reply->id = id;
    if (!reply->has_ok) {
        reply->has_ok = 1;
        reply->ok = reply->error == NULL;
    }
    ep_err err;
    if (wire_send(c->asock, ident, ident_len, EPMOE__MSG_TYPE__MSG_ADMIN_REPLY, &reply->base,
                  payloads, n_payloads, true, &err) != 0)
        log_debug(LOG_SUB_NET, "admin reply %" PRIu64 ": %s", id, err.msg);
}

void adm_send_error(coord *c, const uint8_t *ident, size_t ident_len, uint64_t id,
                    Epmoe__ErrorCode code, const char *fmt, ...)
{
    char text[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.has_ok = 1;
    rep.ok = 0;
    rep.has_error_code = 1;
    rep.error_code = code;
    rep.error = text;
    log_debug(LOG_SUB_NET, "admin request %" PRIu64 " failed: %s", id, text);
    adm_send(c, ident, ident_len, id, &rep, NULL, 0);
}

/* Workers for STATUS and WORKERS: every field. */
static void adm_reply_workers(coord *c, const wire_msg *m, uint64_t id, bool status)
{
    int n = reg_size(c->reg);
    Epmoe__WorkerInfo *wi = calloc((size_t)n, sizeof *wi);
    Epmoe__WorkerInfo **wp = calloc((size_t)n, sizeof *wp);
    if (wi == NULL || wp == NULL) {
        adm_send_error(c, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                       "the coordinator is out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        reg_worker_info(c, i, &wi[i]);
        wp[i] = &wi[i];
    }
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)c->spec->name;
    rep.state = (char *)coord_state_name(c->state);
    rep.has_epoch = 1;
    rep.epoch = c->plan->epoch;
    rep.n_workers = (size_t)n;
    rep.workers = wp;
    if (status) {
        rep.has_config_hash = 1;
        rep.config_hash = c->config_hash;
        rep.model_path = (char *)c->spec->model_path;
        rep.has_steps_done = 1;
        rep.steps_done = seq_steps_done(c->seq);
        rep.has_steps_failed = 1;
        rep.steps_failed = seq_steps_failed(c->seq);
    }
    adm_send(c, m->ident, m->ident_len, id, &rep, NULL, 0);
done:
    free(wi);
    free(wp);
}

static void adm_reply_shards(coord *c, const wire_msg *m, const Epmoe__AdminRequest *rq)
{
    uint64_t id = rq->id;
    char lname[64] = "";
    if (rq->layer != NULL) {
        /* Placement is the same for every layer; the layer is checked and echoed so that a
         * script asking about a layer that does not exist hears about it. */
        int layer;
        ep_err err;
        if (ck_layer_parse(c->cfg, rq->layer, &layer, &err) != 0) {
            adm_send_error(c, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                           "SHARDS: %s", err.msg);
            return;
        }
        int k = ck_layer_prefix(c->cfg, layer, lname, sizeof lname);
        if (k > 0 && lname[k - 1] == '.')
            lname[k - 1] = '\0';
    }
    const plan_table *p = c->plan;
    int P = p->n_ranks;
    Epmoe__Shard *sh = calloc((size_t)P, sizeof *sh);
    Epmoe__Shard **sp = calloc((size_t)P, sizeof *sp);
    uint32_t *ex = calloc((size_t)p->n_experts, sizeof *ex);
    int *tmp = calloc((size_t)p->n_experts, sizeof *tmp);
    if (sh == NULL || sp == NULL || ex == NULL || tmp == NULL) {
        adm_send_error(c, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                       "the coordinator is out of memory");
        goto done;
    }
    size_t used = 0;
    for (int r = 0; r < P; r++) {
        int n = plan_rank_experts(p, r, tmp, p->n_experts);
        epmoe__shard__init(&sh[r]);
        sh[r].has_rank = 1;
        sh[r].rank = (uint32_t)r;
        sh[r].worker = (char *)c->spec->workers[r].name;
        sh[r].n_experts = (size_t)n;
        sh[r].experts = ex + used;
        for (int i = 0; i < n; i++)
            ex[used + (size_t)i] = (uint32_t)tmp[i];
        used += (size_t)n;
        sp[r] = &sh[r];
    }
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)c->spec->name;
    rep.has_epoch = 1;
    rep.epoch = p->epoch;
    rep.placement = (char *)spec_placement_name(p->placement);
    rep.n_shards = (size_t)P;
    rep.shards = sp;
    if (lname[0])
        rep.layer = lname;
    adm_send(c, m->ident, m->ident_len, id, &rep, NULL, 0);
done:
    free(sh);
    free(sp);
    free(ex);
    free(tmp);
}

static void adm_reply_config(coord *c, const wire_msg *m, uint64_t id)
{
    Epmoe__ModelConfig mc;
    mmsg_from_config(c->cfg, &mc);
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.cluster = (char *)c->spec->name;
    rep.config = &mc;
    rep.has_config_hash = 1;
    rep.config_hash = c->config_hash;
    rep.model_path = (char *)c->spec->model_path;
    rep.has_epoch = 1;
    rep.epoch = c->plan->epoch;
    adm_send(c, m->ident, m->ident_len, id, &rep, NULL, 0);
}

/* One received message; takes ownership of m (heap). */
static void adm_handle(coord *c, wire_msg *m)
{
    ep_err err;
    Epmoe__AdminRequest *rq = NULL;
    if (m->type != EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST) {
        if (m->type != EPMOE__MSG_TYPE__MSG_ERROR)
            wire_send_error(c->asock, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE,
                            m->type,
                            "coordinator.admin accepts ADMIN_REQUEST only, not %s (workers "
                            "connect to coordinator.listen)",
                            wire_type_name(m->type));
        goto done;
    }
    rq = (Epmoe__AdminRequest *)wire_unpack(&epmoe__admin_request__descriptor, m, &err);
    if (rq == NULL) {
        wire_send_error(c->asock, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type,
                        "%s", err.msg);
        goto done;
    }
    uint64_t id = rq->has_id ? rq->id : 0;
    if (!rq->has_id || !rq->has_verb) {
        adm_send_error(c, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                       "AdminRequest without %s", rq->has_id ? "a verb" : "an id");
        goto done;
    }
    if (rq->verb != EPMOE__ADMIN_VERB__ADMIN_FORWARD && m->n_payloads > 0) {
        adm_send_error(c, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                       "%d unexpected payloads (only FORWARD carries payloads)", m->n_payloads);
        goto done;
    }
    log_debug(LOG_SUB_NET, "admin request %" PRIu64 ": verb %d", id, (int)rq->verb);
    switch (rq->verb) {
    case EPMOE__ADMIN_VERB__ADMIN_STATUS:
        adm_reply_workers(c, m, id, true);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_WORKERS:
        adm_reply_workers(c, m, id, false);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_SHARDS:
        adm_reply_shards(c, m, rq);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_CONFIG:
        adm_reply_config(c, m, id);
        break;
    case EPMOE__ADMIN_VERB__ADMIN_FORWARD:
        seq_submit(c, m, rq); /* owns both from here */
        return;
    case EPMOE__ADMIN_VERB__ADMIN_SHUTDOWN: {
        Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
        rep.cluster = (char *)c->spec->name;
        rep.state = (char *)coord_state_name(COORD_STOPPING);
        adm_send(c, m->ident, m->ident_len, id, &rep, NULL, 0);
        coord_stop(c, "admin SHUTDOWN");
        break;
    }
    default:
        adm_send_error(c, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                       "unknown verb %d (expected STATUS 1, WORKERS 2, SHARDS 3, CONFIG 4, "
                       "FORWARD 5, SHUTDOWN 6)",
                       (int)rq->verb);
        break;
    }
done:
    if (rq)
        wire_free_unpacked(&rq->base);
    wire_msg_close(m);
    free(m);
}

void adm_drain(coord *c)
{
    for (int i = 0; i < ADM_BATCH && !c->stop; i++) {
        wire_msg *m = malloc(sizeof *m);
        if (m == NULL) {
            log_error("admin socket: out of memory");
            return;
        }
        ep_err err;
        wire_rc rc =
            wire_recv(c->asock, true, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, m, &err);
        if (rc == WIRE_AGAIN) {
            free(m);
            return;
        }
        if (rc == WIRE_ERR) {
            log_warn("admin socket: %s", err.msg);
            if (m->ident_len > 0)
                wire_send_error(c->asock, m->ident, m->ident_len, EPMOE__ERROR_CODE__ERR_MALFORMED,
                                0, "%s", err.msg);
            free(m);
            continue;
        }
        adm_handle(c, m);
    }
}
