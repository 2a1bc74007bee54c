/*
 * exec_step.c — the coordinator's STEP (exec_state.h; docs/protocol.md "Forward steps"):
 * route, dispatch to every rank its pairs go to, compute the own pairs, answer the peers'
 * DISPATCHes, combine, STEP_DONE; on the NCCL plane the collective step of step_nccl.h.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/log.h"
#include "common/model_msg.h"
#include "common/safetensors.h"
#include "common/wire.h"
#include "worker/exec_state.h"
#include "worker/plan.h"
#include "shard/shard.h"
#include "worker/wmetrics.h"

/* ---- one step ---------------------------------------------------------------------------------
 */

typedef struct exec_step_s {
    exec_state *st;
    const mb_layer *layer;
    mb_step *ms; /* the backend's half of this step (route .. combine) */
    uint64_t step_id;
    int T, k, H, P, rank;
    uint16_t *x;  /* [T, H] aligned copy of the payload */
    int64_t *ids; /* [T] or NULL */
    uint16_t *xn;
    int32_t *topk_ids;
    float *topk_w;
    uint8_t *q;
    float *qs;
    uint16_t *eo;       /* [T, k, H] expert output per slot */
    uint16_t *out;      /* [T, H] when the step computed it itself (the NCCL plane) */
    int *n_pairs_to;    /* [P] pairs sent to each rank (own rank: computed locally) */
    uint32_t **slot_to; /* [P][n_pairs_to]: t*k + j of each pair, in wire order */
    uint8_t *heard_d;   /* [P] */
    uint8_t *heard_c;   /* [P] */
    int need_c;         /* COMBINEs still due: one per peer sent a DISPATCH */
    int layer_index;
    uint32_t *expert_tokens; /* [E] pairs of this worker's tokens per expert (the load) */
    uint64_t dispatch_bytes, combine_bytes;
    double compute_s;
    double t0, dispatch_s, expert_s, combine_s; /* where the step's time went */
    uint32_t messages;                          /* data-plane messages sent */
    bool aborted;                               /* by STEP_ABORT (answered) */
    bool abandoned;                             /* by RESET or TERM (not answered) */
    ep_err err; /* with its code: what the step's StepFailed reports */
} exec_step_s;

static void exec_step_free(exec_step_s *s)
{
    free(s->out);
    free(s->x);
    free(s->ids);
    free(s->xn);
    free(s->topk_ids);
    free(s->topk_w);
    free(s->q);
    free(s->qs);
    mb_step_free(&s->ms);
    free(s->eo);
    if (s->slot_to)
        for (int r = 0; r < s->P; r++)
            free(s->slot_to[r]);
    free(s->slot_to);
    free(s->n_pairs_to);
    free(s->heard_d);
    free(s->heard_c);
    free(s->expert_tokens);
}

static int exec_fail(exec_step_s *s, Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int exec_fail(exec_step_s *s, Epmoe__ErrorCode code, const char *fmt, ...)
{
    EP_ERR_FROM_ARGS(&s->err, (ep_err_code)code, fmt);
    return -1;
}

static void *exec_alloc(size_t n)
{
    return aligned_alloc(64, n ? (n + 63) / 64 * 64 : 64);
}

static int exec_step_alloc(exec_step_s *s, int E)
{
    size_t T = (size_t)s->T, H = (size_t)s->H, k = (size_t)s->k;
    s->x = exec_alloc(T * H * 2);
    s->xn = exec_alloc(T * H * 2);
    s->topk_ids = malloc(T * k * sizeof *s->topk_ids + 1);
    s->topk_w = malloc(T * k * sizeof *s->topk_w + 1);
    s->q = exec_alloc(T * H);
    s->qs = exec_alloc(T * (H / EP_FP8_BLOCK) * sizeof(float));
    s->eo = exec_alloc(T * k * H * 2);
    s->n_pairs_to = calloc((size_t)s->P, sizeof *s->n_pairs_to);
    s->slot_to = calloc((size_t)s->P, sizeof *s->slot_to);
    s->heard_d = calloc((size_t)s->P, 1);
    s->heard_c = calloc((size_t)s->P, 1);
    s->expert_tokens = calloc((size_t)E, sizeof *s->expert_tokens);
    if (!s->x || !s->xn || !s->topk_ids || !s->topk_w || !s->q || !s->qs || !s->eo ||
        !s->n_pairs_to || !s->slot_to || !s->heard_d || !s->heard_c || !s->expert_tokens)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "out of memory for a step of %d tokens", s->T);
    memset(s->eo, 0, T * k * H * 2);
    return 0;
}

/* Validate STEP against the session (exec_step_check) and copy its payloads (aligned). */
static int exec_step_parse(exec_step_s *s, const Epmoe__Step *req, const wire_msg *m)
{
    exec_state *st = s->st;
    if (exec_step_check(st->session, st->n_layers, st->have_last, st->last_step, req, m, &s->err) !=
        0)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "%s", s->err.msg);
    bool has_ids = req->has_has_ids && req->has_ids;
    size_t T = req->n_tokens, H = (size_t)st->session->config.hidden_size;
    s->layer = st->layers[req->layer];
    s->T = (int)T;
    if (exec_step_alloc(s, st->session->config.n_routed_experts) != 0)
        return -1;
    if (T)
        memcpy(s->x, m->payload[0], T * H * 2);
    if (has_ids) {
        s->ids = malloc(T * 8 + 1);
        if (s->ids == NULL)
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        if (T)
            memcpy(s->ids, m->payload[1], T * 8);
    }
    return 0;
}

/* Which rank computes each (token, slot) pair (the dispatch plan, plan.h: one replica of its
 * expert in the step's layer by the replica rule), and each destination's slots in wire order.
 * Counts the load too. */
static int exec_plan_pairs(exec_step_s *s)
{
    int Tk = s->T * s->k;
    int *dest = malloc((size_t)Tk * sizeof *dest + 1);
    if (dest == NULL)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
    dp_route(s->st->session->place, s->layer_index, s->rank, s->topk_ids, NULL, Tk, NULL, dest,
             s->expert_tokens);
    dp_plan p;
    int rc = dp_group(&p, s->P, s->k, NULL, dest, Tk, &s->err);
    free(dest);
    if (rc != 0)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "%s", s->err.msg);
    for (int r = 0; r < s->P; r++) {
        s->n_pairs_to[r] = p.count[r];
        s->slot_to[r] = p.slot[r]; /* the step's now */
        p.slot[r] = NULL;
    }
    dp_plan_free(&p);
    return 0;
}

static void exec_tick(exec_step_s *s, double t0)
{
    s->compute_s += clk_mono_s() - t0;
}

static int exec_send_dispatches(exec_step_s *s)
{
    exec_session *ses = s->st->session;
    for (int r = 0; r < s->P; r++) {
        /* sparse: a peer none of our tokens go to gets nothing (and owes no COMBINE) */
        if (r == s->rank || !ses->member[r] || s->n_pairs_to[r] == 0)
            continue;
        tp_msg d = {.kind = TP_DISPATCH,
                    .step_id = s->step_id,
                    .layer = (uint32_t)mb_layer_index(s->layer),
                    .n_rows = dp_rows(s->slot_to[r], s->n_pairs_to[r], s->k),
                    .n_pairs = s->n_pairs_to[r],
                    .format = ses->dispatch,
                    .scales_e8m0 = ses->dispatch == TP_FMT_FP8 && ses->config.act_ue8m0};
        if (tpz_msg_alloc(&d, s->H, &s->err) != 0)
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "DISPATCH to rank %d (%s): %s",
                             r, ses->peer_name[r], s->err.msg);
        if (dp_fill(s->slot_to[r], s->n_pairs_to[r], s->k, s->H, s->topk_ids, s->topk_w, s->q,
                    s->qs, s->xn, &d, &s->err) != 0) {
            tpz_msg_release(&d);
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "%s", s->err.msg);
        }
        size_t bytes = tp_msg_bytes(&d, s->H);
        s->dispatch_bytes += bytes;
        tpz_grant(s->st->tp, s->step_id, r, d.n_pairs); /* before its answer can arrive */
        if (tpz_send(s->st->tp, r, &d, &s->err) != 0)
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "DISPATCH to %s: %s",
                             ses->peer_name[r], s->err.msg);
        wmx_sent(s->st->mx, false, bytes);
        s->messages++;
        s->need_c++;
    }
    return 0;
}

/* Scatter n rows of out (bf16 [n, H]) into eo at the slots given. */
static void exec_scatter(exec_step_s *s, const uint32_t *slots, int n, const uint16_t *out)
{
    size_t H = (size_t)s->H;
    for (int p = 0; p < n; p++)
        memcpy(s->eo + (size_t)slots[p] * H, out + (size_t)p * H, H * 2);
}

/* The pairs this worker computed, per expert, into its metrics. */
static void exec_count_pairs(exec_step_s *s, const uint32_t *expert, int n)
{
    if (s->st->mx == NULL || n == 0)
        return;
    int E = s->st->session->config.n_routed_experts;
    uint32_t *c = calloc((size_t)E, sizeof *c);
    for (int p = 0; c != NULL && p < n; p++)
        if (expert[p] < (uint32_t)E)
            c[expert[p]]++;
    for (int e = 0; c != NULL && e < E; e++)
        if (c[e])
            wmx_expert_pairs(s->st->mx, s->layer_index, e, c[e]);
    free(c);
}

/* Own pairs and the shared expert, on own tokens. */
static int exec_local(exec_step_s *s)
{
    int n = s->n_pairs_to[s->rank];
    uint32_t *row = malloc((size_t)n * 4 + 1), *ex = malloc((size_t)n * 4 + 1);
    float *w = malloc((size_t)n * 4 + 1);
    uint16_t *out = exec_alloc((size_t)n * (size_t)s->H * 2);
    int rc = 0;
    if (!row || !ex || !w || !out) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        goto done;
    }
    for (int p = 0; p < n; p++) {
        uint32_t slot = s->slot_to[s->rank][p];
        row[p] = slot / (uint32_t)s->k;
        ex[p] = (uint32_t)s->topk_ids[slot];
        w[p] = s->topk_w[slot];
    }
    double t0 = clk_mono_s();
    /* the shared expert first: a GPU backend runs it while the host plans the local pairs */
    if (mb_step_shared(s->ms, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "shared expert: %s", s->err.msg);
        goto done;
    }
    if (n && mb_experts(s->st->be, s->layer, s->T, s->q, s->qs, n, row, ex, w, out, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "local experts: %s", s->err.msg);
        goto done;
    }
    exec_scatter(s, s->slot_to[s->rank], n, out);
    exec_tick(s, t0);
    s->expert_s += clk_mono_s() - t0;
    exec_count_pairs(s, ex, n);
done:
    free(row);
    free(ex);
    free(w);
    free(out);
    return rc;
}

/* Answer a peer's DISPATCH with its COMBINE. Malformed-for-this-step messages are dropped. */
static int exec_on_dispatch(exec_step_s *s, tp_msg *d)
{
    exec_session *ses = s->st->session;
    int src = d->src_rank;
    if (d->layer != (uint32_t)mb_layer_index(s->layer) || s->heard_d[src]) {
        log_warn("step %llu: dropped a DISPATCH from rank %d (%s): %s",
                 (unsigned long long)s->step_id, src, ses->peer_name[src],
                 s->heard_d[src] ? "duplicate" : "layer differs from the step's");
        return 0;
    }
    for (int p = 0; p < d->n_pairs; p++)
        if (!mb_layer_owns(s->layer, (int)d->pair_expert[p])) {
            log_warn("step %llu: dropped a DISPATCH from rank %d (%s): pair %d names expert %u, "
                     "which this worker does not hold in layer %d",
                     (unsigned long long)s->step_id, src, ses->peer_name[src], p, d->pair_expert[p],
                     s->layer_index);
            return 0;
        }
    size_t H = (size_t)s->H, SC = H / EP_FP8_BLOCK, rows = (size_t)d->n_rows;
    uint8_t *q = d->codes, *qbuf = NULL;
    const void *qs = d->scales;
    float *qsbuf = NULL;
    bool e8m0 = d->format != TP_FMT_BF16 && d->scales_e8m0; /* the backend widens the codes */
    tp_msg c = {.kind = TP_COMBINE, .step_id = s->step_id, .n_pairs = d->n_pairs};
    int rc = 0;
    if (d->format == TP_FMT_BF16)
        q = qbuf = exec_alloc(rows * H);
    if (d->format == TP_FMT_BF16)
        qs = qsbuf = exec_alloc(rows * SC * 4);
    if ((d->format == TP_FMT_BF16 && !qbuf) || (qs == NULL && rows) ||
        tpz_msg_alloc(&c, s->H, &s->err) != 0) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "out of memory");
        goto done;
    }
    double t0 = clk_mono_s();
    if (d->format == TP_FMT_BF16 && rows &&
        mb_quant(s->st->be, s->layer, d->n_rows, d->hidden, q, qsbuf, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "quantizing rank %d's rows: %s", src,
                       s->err.msg);
        goto done;
    }
    if (d->n_pairs &&
        mb_experts_scaled(s->st->be, s->layer, d->n_rows, q, qs, e8m0, d->n_pairs, d->pair_row,
                          d->pair_expert, d->pair_weight, c.out, &s->err)) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "experts for rank %d (%s): %s", src,
                       ses->peer_name[src], s->err.msg);
        goto done;
    }
    exec_tick(s, t0);
    s->expert_s += clk_mono_s() - t0;
    exec_count_pairs(s, d->pair_expert, d->n_pairs);
    size_t bytes = tp_msg_bytes(&c, s->H);
    s->combine_bytes += bytes;
    if (tpz_send(s->st->tp, src, &c, &s->err) != 0) {
        rc = exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "COMBINE to %s: %s",
                       ses->peer_name[src], s->err.msg);
        goto done;
    }
    wmx_sent(s->st->mx, true, bytes);
    s->messages++;
    s->heard_d[src] = 1;
done:
    tpz_msg_release(&c);
    free(qbuf);
    free(qsbuf);
    return rc;
}

static void exec_on_combine(exec_step_s *s, const tp_msg *c)
{
    int src = c->src_rank;
    const char *name = s->st->session->peer_name[src];
    if (s->heard_c[src]) {
        log_warn("step %llu: dropped a duplicate COMBINE from rank %d (%s)",
                 (unsigned long long)s->step_id, src, name);
        return;
    }
    if (c->n_pairs != s->n_pairs_to[src]) {
        log_warn("step %llu: dropped a COMBINE from rank %d (%s) with %d pairs, %d were sent",
                 (unsigned long long)s->step_id, src, name, c->n_pairs, s->n_pairs_to[src]);
        return;
    }
    exec_scatter(s, s->slot_to[src], c->n_pairs, c->out);
    s->heard_c[src] = 1;
    s->need_c--;
}

/* Handle what the data plane holds for this step. */
static int exec_drain(exec_step_s *s)
{
    tp_msg m;
    while (tpz_take(s->st->tp, s->step_id, &m)) {
        int rc = 0;
        if (!s->st->session->member[m.src_rank])
            log_warn("step %llu: dropped a message from rank %d, not a member of epoch %llu",
                     (unsigned long long)s->step_id, m.src_rank,
                     (unsigned long long)s->st->session->epoch);
        else if (m.kind == TP_COMBINE && s->heard_c == NULL)
            log_warn("step %llu: dropped a COMBINE from rank %d: the step's own part is done",
                     (unsigned long long)s->step_id, m.src_rank);
        else if (m.kind == TP_DISPATCH)
            rc = exec_on_dispatch(s, &m);
        else
            exec_on_combine(s, &m);
        tpz_msg_release(&m);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* The peers a step still waits for, for the timeout message. */
static void exec_missing(const exec_step_s *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int r = 0; r < s->P && n < cap; r++) {
        if (r == s->rank || s->n_pairs_to[r] == 0 || s->heard_c[r])
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "%srank %d (%s): COMBINE", n ? ", " : "", r,
                              s->st->session->peer_name[r]);
    }
}

void exec_stash(exec_state *st, wire_msg *m)
{
    if (st->n_stash == EXEC_MAX_STASH) {
        log_error("executor: dropped %s (stash full)", wire_type_name(m->type));
        wire_msg_close(m);
        return;
    }
    wire_msg_move(&st->stash[st->n_stash++], m);
}

/* One pipe message during a step. Returns -1 when the step must end. */
static int exec_step_pipe(exec_step_s *s)
{
    exec_state *st = s->st;
    wire_msg m;
    ep_err err;
    wire_rc rc =
        wire_recv(st->pipe, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &err);
    if (rc != WIRE_OK)
        return 0;
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP_ABORT) {
        Epmoe__StepAbort *a =
            (Epmoe__StepAbort *)wire_unpack(&epmoe__step_abort__descriptor, &m, &err);
        bool ours = a && a->has_step_id && a->step_id == s->step_id;
        wire_free_unpacked(a ? &a->base : NULL);
        wire_msg_close(&m);
        if (!ours)
            return 0;
        s->aborted = true;
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "step %llu aborted by the coordinator", (unsigned long long)s->step_id);
    }
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP) {
        Epmoe__Step *o = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, &m, &err);
        exec_step_failed(st, o && o->has_step_id, o ? o->step_id : 0, EPMOE__ERROR_CODE__ERR_BUSY,
                         "step %llu is still running", (unsigned long long)s->step_id);
        wire_free_unpacked(o ? &o->base : NULL);
        wire_msg_close(&m);
        return 0;
    }
    /* RESET and TERM end the step unanswered (the caller discards the old session's answers);
     * anything else waits in the stash until the step is over. */
    bool end = m.type == EXEC_CMD_RESET || m.type == EXEC_CMD_TERM;
    exec_stash(st, &m);
    if (!end)
        return 0;
    s->abandoned = true;
    return -1;
}

/* Wait for the COMBINEs of our DISPATCHes, answering peers' DISPATCHes as they come. */
static int exec_wait_peers(exec_step_s *s, int64_t deadline)
{
    exec_state *st = s->st;
    while (s->need_c > 0) {
        if (exec_drain(s) != 0)
            return -1;
        if (s->need_c == 0)
            break;
        int64_t left = deadline - clk_mono_ms();
        if (left <= 0) {
            char who[EP_ERR_MSG_MAX / 2];
            exec_missing(s, who, sizeof who);
            return exec_fail(s, EPMOE__ERROR_CODE__ERR_TIMEOUT,
                             "step %llu timed out after %d ms waiting for %s",
                             (unsigned long long)s->step_id, st->session->step_timeout_ms, who);
        }
        zmq_pollitem_t it[2] = {{.socket = st->pipe, .events = ZMQ_POLLIN},
                                {.socket = tpz_socket(st->tp), .events = ZMQ_POLLIN}};
        if (zmq_poll(it, 2, left > 1000 ? 1000 : (long)left) < 0)
            continue; /* EINTR */
        if (it[1].revents)
            tpz_pump(st->tp);
        if (it[0].revents && exec_step_pipe(s) != 0)
            return -1;
    }
    return 0;
}

/* Sparse (index, count) lists of the nonzero entries of a[n] (the load STEP_DONE reports). */
static size_t exec_sparse(const uint32_t *a, int n, uint32_t *idx, uint32_t *cnt)
{
    size_t k = 0;
    for (int i = 0; i < n; i++)
        if (a[i]) {
            idx[k] = (uint32_t)i;
            cnt[k++] = a[i];
        }
    return k;
}

/* STEP_DONE once this worker's tokens are combined; returns 0 when sent. */
static int exec_send_done(exec_step_s *s)
{
    size_t T = (size_t)s->T, H = (size_t)s->H, k = (size_t)s->k;
    uint16_t *out = s->out ? s->out : malloc(T * H * 2 + 1);
    s->out = NULL; /* the message's (or freed) from here */
    if (out == NULL) {
        exec_step_failed(s->st, true, s->step_id, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "out of memory for the output");
        return -1;
    }
    double t0 = clk_mono_s();
    if (s->ms != NULL && mb_step_finish(s->ms, s->eo, out, &s->err) != 0) {
        free(out);
        exec_step_failed(s->st, true, s->step_id, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "combine: %s",
                         s->err.msg);
        return -1;
    }
    exec_tick(s, t0);
    int E = s->st->session->config.n_routed_experts;
    size_t cap = (size_t)(E > s->P ? E : s->P);
    uint32_t *buf = malloc(4 * cap * sizeof *buf + 4);
    uint32_t *pairs = calloc((size_t)s->P, sizeof *pairs);
    Epmoe__StepDone d = EPMOE__STEP_DONE__INIT;
    if (buf != NULL && pairs != NULL) {
        for (int r = 0; r < s->P; r++)
            pairs[r] = (uint32_t)s->n_pairs_to[r];
        if (s->st->session->nccl) /* the collective counts what each rank computed */
            for (int e = 0; e < E; e++)
                pairs[s->rank] += s->expert_tokens[e];
        d.routed_expert = buf;
        d.routed_tokens = buf + cap;
        d.n_routed_expert = d.n_routed_tokens =
            exec_sparse(s->expert_tokens, E, d.routed_expert, d.routed_tokens);
        d.pair_rank = buf + 2 * cap;
        d.pair_count = buf + 3 * cap;
        d.n_pair_rank = d.n_pair_count = exec_sparse(pairs, s->P, d.pair_rank, d.pair_count);
    }
    double total = clk_mono_s() - s->t0;
    d.has_step_id = d.has_n_tokens = d.has_dispatch_bytes = d.has_combine_bytes = 1;
    d.has_compute_seconds = d.has_dispatch_seconds = d.has_expert_seconds = 1;
    d.has_combine_seconds = d.has_messages_sent = 1;
    d.step_id = s->step_id;
    d.n_tokens = (uint32_t)s->T;
    d.dispatch_bytes = s->dispatch_bytes;
    d.combine_bytes = s->combine_bytes;
    d.compute_seconds = s->compute_s;
    d.dispatch_seconds = s->dispatch_s;
    d.expert_seconds = s->expert_s;
    d.combine_seconds = s->combine_s;
    d.messages_sent = s->messages;
    wire_payload pl[3] = {
        {.data = out, .len = T * H * 2, .free_fn = wire_free_malloc},
        {.data = s->topk_ids, .len = T * k * 4, .free_fn = wire_free_malloc},
        {.data = s->topk_w, .len = T * k * 4, .free_fn = wire_free_malloc},
    };
    s->topk_ids = NULL; /* owned by the message now */
    s->topk_w = NULL;
    exec_send(s->st, EPMOE__MSG_TYPE__MSG_STEP_DONE, &d.base, pl, 3);
    free(buf);
    free(pairs);
    wmx_step(s->st->mx, s->layer_index, total, s->dispatch_s, s->expert_s, s->combine_s);
    wmx_step_result(s->st->mx, true);
    return 0;
}

/* Route, dispatch, compute, wait, combine. */
static int exec_step_run(exec_step_s *s)
{
    exec_state *st = s->st;
    int64_t deadline = clk_deadline_ms(st->session->step_timeout_ms);
    double t0 = clk_mono_s();
    s->t0 = t0;
    s->ms = mb_step_begin(st->be, s->layer, s->T, s->x, s->ids, s->topk_ids, s->topk_w, s->q, s->qs,
                          s->xn, &s->err);
    if (s->ms == NULL)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, "STEP %llu: %s",
                         (unsigned long long)s->step_id, s->err.msg);
    exec_tick(s, t0);
    double routed = clk_mono_s();
    if (exec_plan_pairs(s) != 0 || exec_send_dispatches(s) != 0)
        return -1;
    s->dispatch_s = clk_mono_s() - routed;
    if (exec_local(s) != 0)
        return -1;
    double waiting = clk_mono_s();
    int rc = exec_wait_peers(s, deadline);
    s->combine_s = clk_mono_s() - waiting;
    return rc;
}

/* The open step is over (the next STEP, STEP_ABORT, a placement message or a reset): its
 * messages are dropped from now on. */
void exec_close_open(exec_state *st)
{
    exec_step_s *o = st->open;
    if (o == NULL)
        return;
    if (st->tp)
        tpz_finish(st->tp, o->step_id);
    exec_step_free(o);
    free(o);
    st->open = NULL;
}

/* Keep a step whose STEP_DONE went out open, to serve its peers' DISPATCHes: only what serving
 * needs stays allocated. */
static void exec_keep_open(exec_state *st, exec_step_s *s)
{
    uint8_t *heard = s->heard_d;
    s->heard_d = NULL;
    exec_step_free(s);
    s->heard_d = heard;
    s->x = NULL;
    s->ids = NULL;
    s->xn = NULL;
    s->topk_ids = NULL;
    s->topk_w = NULL;
    s->q = NULL;
    s->qs = NULL;
    s->ms = NULL;
    s->eo = NULL;
    s->slot_to = NULL;
    s->n_pairs_to = NULL;
    s->heard_c = NULL;
    s->expert_tokens = NULL;
    s->out = NULL;
    st->open = s;
}

/* DISPATCHes for the open step, between steps (the main loop and a staged load call this). */
void exec_serve_open(exec_state *st)
{
    if (st->open == NULL)
        return;
    st->open->need_c = 0;
    if (exec_drain(st->open) != 0) {
        /* its STEP_DONE is out: the peer whose COMBINE is missing fails the step */
        log_warn("step %llu: serving a peer failed: %s", (unsigned long long)st->open->step_id,
                 st->open->err.msg);
        exec_close_open(st);
    }
}

/* ---- the NCCL data plane (data_plane nccl; docs/protocol.md "NCCL data plane") -------------
 *
 * The executor owns the communicator (tpc_comm over NCCL) and the step driver (step_nccl.h).
 * COMM_INIT builds the communicator, waiting with its deadline while it still reads the pipe;
 * a STEP runs sn_run instead of the ZeroMQ exchange above, and a failed one tells the
 * coordinator that the communicator was aborted (StepFailed.comm_aborted).
 */

/* The communicator object and the driver; the library's communicator comes with COMM_INIT. */
int exec_nccl_open(exec_state *st, ep_err *err)
{
    exec_session *s = st->session;
    mb_device_info info;
    if (mb_device(st->be, &info) != 0 || info.kind != MB_DEV_CUDA)
        return ep_err_set(err,
                          "data_plane nccl needs a cuda:N device; this worker runs the %s "
                          "backend",
                          mb_name(st->be));
    if (s->dispatch != TP_FMT_FP8)
        return ep_err_set(err, "data_plane nccl sends fp8 dispatch only");
    st->cuda_ordinal = info.ordinal;
    if (st->comm == NULL && (st->comm = tpc_create(tpc_nccl_ops(), &st->cuda_ordinal, err)) == NULL)
        return -1;
    return 0;
}

/* The step driver for the communicator COMM_INIT built (its world: the epoch's members). */
static int exec_nccl_driver(exec_state *st, const Epmoe__CommInit *ci, ep_err *err)
{
    exec_session *s = st->session;
    sn_config cfg = {.rank = s->rank,
                     .world_size = s->world_size,
                     .comm_rank = tpc_rank(st->comm),
                     .comm_size = tpc_size(st->comm),
                     .members = ci->n_members ? ci->members : NULL,
                     .epoch = s->epoch,
                     .hidden = s->config.hidden_size,
                     .topk = s->config.num_experts_per_tok,
                     .n_experts = s->config.n_routed_experts,
                     .expert_owner = s->expert_owner,
                     .scales_e8m0 = s->config.act_ue8m0,
                     .peer_name = (const char *const *)s->peer_name};
    sn_destroy(&st->sn);
    st->sn = sn_create(&cfg, st->be, st->comm, err);
    return st->sn != NULL ? 0 : -1;
}

/* Between polls of a step's waits: the step's own pipe handling (STEP_ABORT, RESET, TERM). */
static int exec_nccl_idle(void *ctx, ep_err *err)
{
    exec_step_s *s = ctx;
    if (exec_step_pipe(s) == 0)
        return 0;
    return ep_err_set(err, "%s", s->abandoned ? "the session was reset" : s->err.msg);
}

static int exec_nccl_step(exec_step_s *s)
{
    exec_state *st = s->st;
    s->out = malloc((size_t)s->T * (size_t)s->H * 2 + 1);
    if (s->out == NULL || st->sn == NULL)
        return exec_fail(s, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "STEP %llu: %s",
                         (unsigned long long)s->step_id,
                         s->out ? "no NCCL communicator yet (COMM_INIT)" : "out of memory");
    sn_step io = {.step_id = s->step_id,
                  .layer = s->layer,
                  .layer_index = (uint32_t)mb_layer_index(s->layer),
                  .T = s->T,
                  .x = s->x,
                  .ids = s->ids,
                  .topk_ids = s->topk_ids,
                  .topk_w = s->topk_w,
                  .out = s->out,
                  .expert_tokens = s->expert_tokens,
                  .deadline = clk_deadline_ms(st->session->step_timeout_ms),
                  .idle = exec_nccl_idle,
                  .idle_ctx = s};
    double t0 = clk_mono_s();
    int code = 0;
    ep_err err = {0};
    int rc = sn_run(st->sn, &io, &code, &err);
    s->compute_s += clk_mono_s() - t0; /* on the GPU the exchange overlaps the kernels */
    s->dispatch_bytes = io.dispatch_bytes;
    s->combine_bytes = io.combine_bytes;
    return rc == 0 ? 0 : exec_fail(s, (Epmoe__ErrorCode)code, "%s", err.msg);
}

static void exec_nccl_failed(exec_step_s *s)
{
    exec_state *st = s->st;
    log_warn("step %llu failed: %s", (unsigned long long)s->step_id, s->err.msg);
    Epmoe__StepFailed f = EPMOE__STEP_FAILED__INIT;
    f.has_step_id = f.has_code = f.has_comm_aborted = 1;
    f.step_id = s->step_id;
    f.code = wire_code(&s->err);
    f.message = s->err.msg;
    f.comm_aborted = st->comm != NULL && tpc_get_state(st->comm) != TPC_READY;
    exec_send(st, EPMOE__MSG_TYPE__MSG_STEP_FAILED, &f.base, NULL, 0);
}

static void exec_comm_done(exec_state *st, uint64_t epoch, uint32_t gen, bool ok, const char *why)
{
    Epmoe__CommDone d = EPMOE__COMM_DONE__INIT;
    d.has_epoch = d.has_generation = d.has_ok = 1;
    d.epoch = epoch;
    d.generation = gen;
    d.ok = ok;
    d.message = ok ? NULL : (char *)why;
    exec_send(st, EPMOE__MSG_TYPE__MSG_COMM_DONE, &d.base, NULL, 0);
}

/* While a communicator is being built the pipe is still read: a STEP is refused, and RESET,
 * TERM, SESSION, LOAD or a newer COMM_INIT end the wait (they are handled next). */
static int exec_comm_idle(void *ctx, ep_err *err)
{
    exec_state *st = ctx;
    wire_msg m;
    ep_err e;
    if (wire_recv(st->pipe, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, ZMQ_DONTWAIT, &m, &e) !=
        WIRE_OK)
        return 0;
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP) {
        Epmoe__Step *o = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, &m, &e);
        exec_step_failed(st, o && o->has_step_id, o ? o->step_id : 0,
                         EPMOE__ERROR_CODE__ERR_NOT_READY, "the NCCL communicator is being built");
        wire_free_unpacked(o ? &o->base : NULL);
        wire_msg_close(&m);
        return 0;
    }
    if (m.type == EPMOE__MSG_TYPE__MSG_STEP_ABORT) {
        wire_msg_close(&m);
        return 0;
    }
    uint16_t type = m.type;
    exec_stash(st, &m);
    return ep_err_set(err, "interrupted by %s",
                      type == EXEC_CMD_RESET  ? "a reset"
                      : type == EXEC_CMD_TERM ? "shutdown"
                                              : wire_type_name(type));
}

/* This worker's rank and the size of the communicator COMM_INIT describes (absent: the
 * session's); the members, when given, must place this worker at that rank. */
static int exec_comm_world(const exec_session *s, const Epmoe__CommInit *ci, int *rank, int *size,
                           ep_err *err)
{
    *rank = ci->has_rank ? (int)ci->rank : s->rank;
    *size = ci->has_size ? (int)ci->size : s->world_size;
    if (*size < 1 || *size > s->world_size || *rank < 0 || *rank >= *size ||
        (ci->n_members &&
         (ci->n_members != (size_t)*size || ci->members[*rank] != (uint32_t)s->rank)))
        return ep_err_set(err,
                          "COMM_INIT: communicator rank %d of %d (%zu members) is not this "
                          "worker's place (rank %d of %d)",
                          *rank, *size, ci->n_members, s->rank, s->world_size);
    return 0;
}

/* Begin the communicator COMM_INIT asks for (rank 0 of a new one creates the id first). */
static int exec_comm_begin(exec_state *st, const Epmoe__CommInit *ci, ep_err *err)
{
    int rank, size;
    if (exec_comm_world(st->session, ci, &rank, &size, err) != 0)
        return -1;
    if (ci->has_shrink && ci->shrink)
        return tpc_begin_shrink(st->comm, ci->epoch, ci->generation, ci->parent_epoch,
                                ci->parent_generation, ci->exclude_ranks, (int)ci->n_exclude_ranks,
                                rank, size, err);
    tpc_id id;
    if (ci->has_nccl_id) {
        if (ci->nccl_id.len != TPC_ID_BYTES)
            return ep_err_set(err, "COMM_INIT: nccl_id of %zu bytes, expected %d", ci->nccl_id.len,
                              TPC_ID_BYTES);
        memcpy(id.bytes, ci->nccl_id.data, TPC_ID_BYTES);
    } else {
        if (rank != 0)
            return ep_err_set(err, "COMM_INIT without nccl_id: only rank 0 creates the id");
        if (tpc_new_id(st->comm, &id, err) != 0)
            return -1;
        Epmoe__CommId m = EPMOE__COMM_ID__INIT;
        m.has_epoch = m.has_generation = m.has_nccl_id = 1;
        m.epoch = ci->epoch;
        m.generation = ci->generation;
        m.nccl_id.len = TPC_ID_BYTES;
        m.nccl_id.data = id.bytes;
        exec_send(st, EPMOE__MSG_TYPE__MSG_COMM_ID, &m.base, NULL, 0);
    }
    return tpc_begin_init(st->comm, ci->epoch, ci->generation, rank, size, &id, err);
}

void exec_comm_init(exec_state *st, const wire_msg *m)
{
    ep_err err = {0};
    Epmoe__CommInit *ci = (Epmoe__CommInit *)wire_unpack(&epmoe__comm_init__descriptor, m, &err);
    if (ci == NULL) {
        exec_error(st, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type, "%s", err.msg);
        return;
    }
    int rc = 0;
    if (st->session == NULL || !st->session->nccl || !st->ready || st->comm == NULL)
        rc = ep_err_set(&err, "COMM_INIT: this worker has no loaded NCCL data plane");
    else if (!ci->has_epoch || ci->epoch != st->session->epoch || !ci->has_generation ||
             !ci->has_timeout_ms || ci->timeout_ms == 0)
        rc = ep_err_set(&err,
                        "COMM_INIT: epoch (this worker's is %llu), generation or timeout_ms "
                        "missing or wrong",
                        (unsigned long long)st->session->epoch);
    if (rc == 0)
        rc = exec_comm_begin(st, ci, &err);
    if (rc == 0)
        rc = tpc_wait_ready(st->comm, clk_deadline_ms(ci->timeout_ms), exec_comm_idle, st, &err);
    if (rc == 0 && exec_nccl_driver(st, ci, &err) != 0) {
        tpc_abort(st->comm, err.msg);
        rc = -1;
    }
    if (rc != 0)
        log_warn("%s", err.msg);
    exec_comm_done(st, ci->epoch, ci->generation, rc == 0, err.msg);
    wire_free_unpacked(&ci->base);
}

void exec_step(exec_state *st, wire_msg *m)
{
    ep_err err;
    exec_close_open(st); /* a new STEP: every step before it is complete everywhere */
    Epmoe__Step *req = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, m, &err);
    if (req == NULL || !req->has_step_id) {
        exec_step_failed(st, false, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, "%s",
                         req ? "STEP without step_id" : err.msg);
        wire_free_unpacked(req ? &req->base : NULL);
        return;
    }
    exec_step_s *s = calloc(1, sizeof *s);
    if (s == NULL) {
        exec_step_failed(st, true, req->step_id, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                         "out of memory");
        wire_free_unpacked(&req->base);
        return;
    }
    *s = (exec_step_s){.st = st, .step_id = req->step_id};
    if (!st->ready) {
        exec_step_failed(st, true, s->step_id, EPMOE__ERROR_CODE__ERR_NOT_READY,
                         "STEP %llu: the shard is not loaded", (unsigned long long)s->step_id);
        wire_free_unpacked(&req->base);
        free(s);
        return;
    }
    const mc_config *c = &st->session->config;
    s->k = c->num_experts_per_tok;
    s->H = c->hidden_size;
    s->P = st->session->world_size;
    s->rank = st->session->rank;
    if (!st->session->member[s->rank]) {
        exec_step_failed(st, true, s->step_id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                         "STEP %llu: rank %d owns no experts in epoch %llu (not a member)",
                         (unsigned long long)s->step_id, s->rank,
                         (unsigned long long)st->session->epoch);
        wire_free_unpacked(&req->base);
        free(s);
        return;
    }
    int rc = exec_step_parse(s, req, m);
    wire_free_unpacked(&req->base);
    if (rc != 0) {
        exec_step_failed_err(st, true, s->step_id, &s->err);
        wmx_step_result(st->mx, false);
        exec_step_free(s);
        free(s);
        return;
    }
    s->layer_index = mb_layer_index(s->layer);
    log_debug(LOG_SUB_STEP, "step %llu: layer %d, %d tokens", (unsigned long long)s->step_id,
              s->layer_index, s->T);
    /* the coordinator settled every earlier step before it started this one: what the data
     * plane still holds for them is stale (a restarted worker's peers' queued DISPATCHes) */
    if (st->tp && s->step_id > 0)
        tpz_finish(st->tp, s->step_id - 1);
    bool nccl = st->session->nccl; /* a collective: no open step to serve afterwards */
    rc = nccl ? exec_nccl_step(s) : exec_step_run(s);
    st->have_last = true;
    st->last_step = s->step_id;
    if (rc == 0 && exec_send_done(s) == 0 && !nccl) {
        exec_keep_open(st, s);
        exec_serve_open(st); /* DISPATCHes that came before the STEP wait in the transport */
        return;
    }
    if (rc != 0 && !s->abandoned) {
        if (nccl)
            exec_nccl_failed(s);
        else
            exec_step_failed_err(st, true, s->step_id, &s->err);
        wmx_step_result(st->mx, false);
    }
    if (st->tp)
        tpz_finish(st->tp, s->step_id);
    exec_step_free(s);
    free(s);
}

/* STEP_ABORT between steps: closes the open step it names (its STEP_DONE already went out). */
void exec_abort_open(exec_state *st, const wire_msg *m)
{
    Epmoe__StepAbort *a = (Epmoe__StepAbort *)wire_unpack(&epmoe__step_abort__descriptor, m, NULL);
    bool ours = a && a->has_step_id && st->open && a->step_id == st->open->step_id;
    wire_free_unpacked(a ? &a->base : NULL);
    if (ours)
        exec_close_open(st);
    else
        log_debug(LOG_SUB_STEP, "STEP_ABORT for a step not running: ignored");
}
