/*
 * sequencer.c — the forward queue and the step in flight (see sequencer.h).
 *
 * Zero copy: a request keeps its received frames (wire_msg) and every STEP payload is a slice
 * of them handed to ZeroMQ with a free function that drops one reference. The references are
 * atomic because libzmq calls free functions from its I/O thread; the loop's thread drops its
 * own reference once the client has been answered, and whoever drops the last frees the frames.
 */
#include "coordinator/sequencer.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/checkpoint.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/log.h"
#include "coordinator/admin.h"

typedef struct seq_request {
    atomic_int refs; /* the sequencer's own + one per payload slice held by ZeroMQ */
    wire_msg *msg;   /* the FORWARD: payload[0] hidden bf16 [T, H], payload[1] ids int64 [T] */
    uint64_t id;
    int layer;
    int n_tokens;
    bool has_ids;
    int64_t queued_ms; /* when it was queued: it waits for a ready cluster step_timeout_ms */
    uint64_t bytes;    /* its frames, counted in queued_bytes while it waits */
    struct seq_request *next;
} seq_request;

/* How a rank stands in the step in flight. */
enum { SEQ_PENDING = 0, SEQ_DONE, SEQ_FAILED, SEQ_GONE };

typedef struct seq_step {
    bool active;
    seq_request *req; /* NULL once the client has been answered with an error */
    uint64_t step_id;
    uint64_t epoch; /* the placement epoch it runs in */
    int layer, n_tokens, hidden, topk;
    double t0;                 /* clk_mono_s when the step began */
    int64_t deadline_ms;       /* step_timeout_ms after the start */
    bool failed;               /* the client got an error; the ranks are settling */
    int64_t abort_deadline_ms; /* step_timeout_ms after the abort */
    int pending;               /* ranks that have neither answered nor died */
    uint8_t *answer;           /* [P] SEQ_* */
    int *begin, *count;        /* [P] token chunk of each rank */
    uint8_t *out;              /* bf16 [T, H] */
    uint8_t *ids;              /* int32 [T, k] */
    uint8_t *wts;              /* f32 [T, k] */
    uint64_t dispatch_bytes, combine_bytes;
} seq_step;

struct seq_sequencer {
    int P;
    seq_request *head, *tail;
    int n_queued;
    uint64_t queued_bytes;     /* frames of the queued requests */
    uint64_t max_queued_bytes; /* seq_create's bound on them */
    seq_step step;
    uint64_t last_step_id;
    uint64_t steps_done, steps_failed;
    seq_record rec; /* the step in flight's */
    int rec_E, rec_P;
    /* The last closed step's (seq_last_record): seq_pump may start the next step, and begin
     * its record, before the loop routes the closed one's OB_EV_STEP_END; the two swap. */
    seq_record closed;
    int closed_E, closed_P;
};

seq_sequencer *seq_create(int n_ranks, uint64_t first_step, uint64_t max_queued_bytes, ep_err *err)
{
    seq_sequencer *s = calloc(1, sizeof *s);
    if (s == NULL)
        goto fail;
    s->P = n_ranks;
    s->last_step_id = first_step - 1;
    s->max_queued_bytes = max_queued_bytes;
    s->step.answer = calloc((size_t)n_ranks, 1);
    s->step.begin = calloc((size_t)n_ranks, sizeof(int));
    s->step.count = calloc((size_t)n_ranks, sizeof(int));
    if (s->step.answer == NULL || s->step.begin == NULL || s->step.count == NULL)
        goto fail;
    return s;
fail:
    seq_destroy(&s);
    ep_err_set(err, "sequencer: out of memory");
    return NULL;
}

static void seq_req_unref(seq_request *r)
{
    if (r == NULL || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    wire_msg_close(r->msg);
    free(r->msg);
    free(r);
}

/* ZeroMQ's free function for a STEP payload slice (may run on libzmq's I/O thread). */
static void seq_slice_free(void *data, void *hint)
{
    (void)data;
    seq_req_unref(hint);
}

static void seq_step_release(seq_step *st)
{
    seq_req_unref(st->req);
    st->req = NULL;
    free(st->out);
    free(st->ids);
    free(st->wts);
    st->out = st->ids = st->wts = NULL;
}

void seq_destroy(seq_sequencer **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    seq_sequencer *s = *self_p;
    while (s->head) {
        seq_request *r = s->head;
        s->head = r->next;
        seq_req_unref(r);
    }
    seq_step_release(&s->step);
    free(s->step.answer);
    free(s->step.begin);
    free(s->step.count);
    free(s->rec.expert_tokens);
    free(s->rec.rank_pairs);
    free(s->closed.expert_tokens);
    free(s->closed.rank_pairs);
    free(s);
    *self_p = NULL;
}

const seq_record *seq_last_record(const seq_sequencer *s)
{
    return &s->closed;
}

/* The step closed: its record becomes the closed one (the buffers swap, nothing is copied). */
static void seq_record_close(seq_sequencer *s)
{
    seq_record t = s->closed;
    s->closed = s->rec;
    s->rec = t;
    int e = s->closed_E, p = s->closed_P;
    s->closed_E = s->rec_E;
    s->closed_P = s->rec_P;
    s->rec_E = e;
    s->rec_P = p;
}

/* A fresh record for the step starting (arrays sized for E experts and P ranks). */
static int seq_record_begin(seq_sequencer *s, int E, uint64_t step_id, uint64_t epoch, int layer,
                            int T)
{
    seq_record *r = &s->rec;
    if (s->rec_E != E || s->rec_P != s->P) {
        free(r->expert_tokens);
        free(r->rank_pairs);
        r->expert_tokens = calloc((size_t)E, sizeof *r->expert_tokens);
        r->rank_pairs = calloc((size_t)s->P, sizeof *r->rank_pairs);
        s->rec_E = r->expert_tokens && r->rank_pairs ? E : 0;
        s->rec_P = s->P;
        if (s->rec_E == 0)
            return -1;
    }
    uint32_t *et = r->expert_tokens, *rp = r->rank_pairs;
    memset(et, 0, (size_t)E * sizeof *et);
    memset(rp, 0, (size_t)s->P * sizeof *rp);
    *r = (seq_record){.step_id = step_id,
                      .epoch = epoch,
                      .layer = layer,
                      .n_tokens = T,
                      .n_experts = E,
                      .n_ranks = s->P,
                      .expert_tokens = et,
                      .rank_pairs = rp};
    return 0;
}

/* Add one STEP_DONE's load and timings to the record (entries out of range are ignored). */
static void seq_record_add(seq_sequencer *s, const Epmoe__StepDone *d)
{
    seq_record *r = &s->rec;
    if (s->rec_E == 0)
        return;
    for (size_t i = 0; i < d->n_routed_expert && i < d->n_routed_tokens; i++)
        if (d->routed_expert[i] < (uint32_t)r->n_experts)
            r->expert_tokens[d->routed_expert[i]] += d->routed_tokens[i];
    for (size_t i = 0; i < d->n_pair_rank && i < d->n_pair_count; i++)
        if (d->pair_rank[i] < (uint32_t)r->n_ranks)
            r->rank_pairs[d->pair_rank[i]] += d->pair_count[i];
    r->have_load |= d->n_routed_expert > 0;
    if (d->has_dispatch_seconds && d->dispatch_seconds > r->dispatch_s)
        r->dispatch_s = d->dispatch_seconds;
    if (d->has_expert_seconds && d->expert_seconds > r->expert_s)
        r->expert_s = d->expert_seconds;
    if (d->has_combine_seconds && d->combine_seconds > r->combine_s)
        r->combine_s = d->combine_seconds;
    r->messages += d->has_messages_sent ? d->messages_sent : 0;
    r->dispatch_bytes += d->has_dispatch_bytes ? d->dispatch_bytes : 0;
    r->combine_bytes += d->has_combine_bytes ? d->combine_bytes : 0;
}

uint64_t seq_steps_done(const seq_sequencer *s)
{
    return s->steps_done;
}

uint64_t seq_steps_failed(const seq_sequencer *s)
{
    return s->steps_failed;
}

int seq_queued(const seq_sequencer *s)
{
    return s->n_queued;
}

/* "layers.3" / "mtp.0" for messages. */
static const char *seq_layer_name(const mc_config *cfg, int layer, char *buf, size_t cap)
{
    int n = ck_layer_prefix(cfg, layer, buf, cap);
    if (n > 0 && buf[n - 1] == '.')
        buf[n - 1] = '\0';
    else if (n <= 0)
        snprintf(buf, cap, "%d", layer);
    return buf;
}

/* ---- admission ---- */

/* What a request's frames hold. */
static uint64_t seq_msg_bytes(const wire_msg *m)
{
    uint64_t n = m->body_len;
    for (int i = 0; i < m->n_payloads; i++)
        n += m->payload_len[i];
    return n;
}

static int seq_check_ids(const mc_config *cfg, const uint8_t *p, int T, ep_err *err)
{
    for (int t = 0; t < T; t++) {
        int64_t id;
        memcpy(&id, p + (size_t)t * 8, 8); /* frames carry no alignment promise */
        if (id < 0 || id >= cfg->vocab_size)
            return ep_err_set(err,
                              "token %d: id %" PRId64 " is out of range (expected 0..%d, the "
                              "model's vocab_size is %d)",
                              t, id, cfg->vocab_size - 1, cfg->vocab_size);
    }
    return 0;
}

/* Validate a FORWARD request's fields and frame sizes against the model; fills layer and T.
 * O(1) in the payload: the values are seq_check_values's, after every cheaper refusal. */
static int seq_validate(const mc_config *cfg, const wire_msg *m, const Epmoe__AdminRequest *rq,
                        int *layer, int *T, ep_err *err)
{
    char lname[64];
    if (rq->layer == NULL)
        return ep_err_set(err, "FORWARD without a layer (expected L, layers.L or mtp.I)");
    if (ck_layer_parse(cfg, rq->layer, layer, err) != 0)
        return -1;
    seq_layer_name(cfg, *layer, lname, sizeof lname);
    if (!rq->has_n_tokens || rq->n_tokens < 1 || rq->n_tokens > EP_MAX_TOKENS)
        return ep_err_set(err, "n_tokens %s%u is out of range (expected 1..%d)",
                          rq->has_n_tokens ? "" : "(absent) ", rq->has_n_tokens ? rq->n_tokens : 0,
                          EP_MAX_TOKENS);
    *T = (int)rq->n_tokens;
    size_t H = (size_t)cfg->hidden_size;
    size_t want = (size_t)*T * H * 2;
    bool hash = mc_layer_is_hash(cfg, *layer);
    if (m->n_payloads < 1)
        return ep_err_set(err, "FORWARD without the hidden payload (bf16 [%d, %zu], %zu bytes)", *T,
                          H, want);
    if (m->payload_len[0] != want)
        return ep_err_set(err,
                          "hidden payload has %zu bytes, expected %zu (bf16 [n_tokens %d, "
                          "hidden_size %zu] x 2 bytes)",
                          m->payload_len[0], want, *T, H);
    if (hash) {
        if (!(rq->has_has_ids && rq->has_ids) || m->n_payloads < 2)
            return ep_err_set(err,
                              "layer %s is hash-routed (tid2eid): token ids int64 [%d] are "
                              "required (has_ids and payload 1)",
                              lname, *T);
        if (m->payload_len[1] != (size_t)*T * 8)
            return ep_err_set(err, "ids payload has %zu bytes, expected %zu (int64 [%d])",
                              m->payload_len[1], (size_t)*T * 8, *T);
        if (m->n_payloads > 2)
            return ep_err_set(err, "%d payloads, expected 2 (hidden bf16 [T, H], ids int64 [T])",
                              m->n_payloads);
        return 0;
    }
    if ((rq->has_has_ids && rq->has_ids) || m->n_payloads > 1)
        return ep_err_set(err,
                          "layer %s is score-routed: unexpected %s (expected 1 payload: hidden "
                          "bf16 [T, H])",
                          lname, m->n_payloads > 1 ? "payloads" : "has_ids");
    return 0;
}

/* The values of a request seq_validate passed: finite hidden states, ids in the vocabulary.
 * The only O(payload) admission work, so it runs last, on a request that will be queued. */
static int seq_check_values(const mc_config *cfg, const wire_msg *m, int layer, int T, ep_err *err)
{
    if (ck_check_input(m->payload[0], T, cfg->hidden_size, 0, err) != 0)
        return -1;
    return mc_layer_is_hash(cfg, layer) ? seq_check_ids(cfg, m->payload[1], T, err) : 0;
}

/* A refusal of request id with the cluster's state: ERR_SHUTTING_DOWN or ERR_NOT_READY. */
static void seq_refuse_not_ready(const seq_env *env, const uint8_t *ident, size_t ident_len,
                                 uint64_t id, ob_box *out)
{
    if (env->stopping) {
        adm_error(out, ident, ident_len, id, EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN,
                  "the coordinator is stopping");
        return;
    }
    adm_error(out, ident, ident_len, id, EPMOE__ERROR_CODE__ERR_NOT_READY,
              "cluster %s is %s, not ready; workers not ready: %s", env->spec->name, env->state,
              env->not_ready);
}

void seq_submit(seq_sequencer *s, const seq_env *env, wire_msg *m, Epmoe__AdminRequest *rq,
                ob_box *out)
{
    uint64_t id = rq->has_id ? rq->id : 0;
    int layer = 0, T = 0;
    ep_err err;
    seq_request *r = NULL;
    if (env->stopping) {
        seq_refuse_not_ready(env, m->ident, m->ident_len, id, out);
        goto reject;
    }
    if (seq_validate(env->cfg, m, rq, &layer, &T, &err) != 0) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "FORWARD: %s", err.msg);
        goto reject;
    }
    if (!env->ready && !env->wait) {
        seq_refuse_not_ready(env, m->ident, m->ident_len, id, out);
        goto reject;
    }
    if (s->n_queued >= EP_MAX_QUEUED_STEPS) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "%d forward requests are already queued (EP_MAX_QUEUED_STEPS); retry later",
                  s->n_queued);
        goto reject;
    }
    uint64_t bytes = seq_msg_bytes(m);
    if (s->queued_bytes + bytes > s->max_queued_bytes) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "the %d queued forward requests hold %llu bytes; this one's %llu would pass "
                  "the bound of %llu (EP_MAX_QUEUED_BYTES); retry later",
                  s->n_queued, (unsigned long long)s->queued_bytes, (unsigned long long)bytes,
                  (unsigned long long)s->max_queued_bytes);
        goto reject;
    }
    if (seq_check_values(env->cfg, m, layer, T, &err) != 0) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BAD_REQUEST,
                  "FORWARD: %s", err.msg);
        goto reject;
    }
    r = calloc(1, sizeof *r);
    if (r == NULL) {
        adm_error(out, m->ident, m->ident_len, id, EPMOE__ERROR_CODE__ERR_BUSY,
                  "the coordinator is out of memory");
        goto reject;
    }
    atomic_init(&r->refs, 1);
    r->msg = m;
    r->id = id;
    r->layer = layer;
    r->n_tokens = T;
    r->has_ids = mc_layer_is_hash(env->cfg, layer);
    r->queued_ms = env->now_ms;
    r->bytes = bytes;
    s->queued_bytes += bytes;
    if (s->tail)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    s->n_queued++;
    log_debug(LOG_SUB_STEP, "forward request %" PRIu64 " queued (layer %d, %d tokens, %d queued)",
              id, layer, T, s->n_queued);
    wire_free_unpacked(&rq->base);
    return;
reject:
    wire_free_unpacked(&rq->base);
    wire_msg_close(m);
    free(m);
}

/* ---- the step ---- */

static const char *seq_answer_name(int a)
{
    return a == SEQ_PENDING  ? "pending"
           : a == SEQ_DONE   ? "done"
           : a == SEQ_FAILED ? "failed"
                             : "gone";
}

/* Answer the client of the step in flight with an error (once). */
static void seq_answer_error(seq_sequencer *s, const ep_err *err, ob_box *out)
{
    seq_step *st = &s->step;
    if (st->failed)
        return;
    st->failed = true;
    s->rec.code = wire_code(err);
    s->steps_failed++;
    if (st->req != NULL)
        adm_reply_error(out, st->req->msg->ident, st->req->msg->ident_len, st->req->id, err);
    seq_step_release(st);
}

static void seq_send_abort(seq_sequencer *s, ob_box *out)
{
    seq_step *st = &s->step;
    Epmoe__StepAbort a = EPMOE__STEP_ABORT__INIT;
    a.has_step_id = 1;
    a.step_id = st->step_id;
    for (int r = 0; r < s->P; r++) {
        if (st->answer[r] == SEQ_FAILED || st->answer[r] == SEQ_GONE)
            continue;
        ob_to_rank(out, r, EPMOE__MSG_TYPE__MSG_STEP_ABORT, &a.base, NULL, 0);
    }
}

static void seq_fail(seq_sequencer *s, const seq_env *env, ob_box *out, Epmoe__ErrorCode code,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The first failure of a step: answer the client, abort the step on every worker. */
static void seq_fail(seq_sequencer *s, const seq_env *env, ob_box *out, Epmoe__ErrorCode code,
                     const char *fmt, ...)
{
    seq_step *st = &s->step;
    if (!st->active || st->failed)
        return;
    ep_err err;
    EP_ERR_FROM_ARGS(&err, (ep_err_code)code, fmt);
    log_info("step %" PRIu64 " failed: %s", st->step_id, err.msg);
    seq_answer_error(s, &err, out);
    st->abort_deadline_ms = env->now_ms + env->spec->step_timeout_ms;
    seq_send_abort(s, out);
}

static void seq_answer_ok(seq_sequencer *s, ob_box *out)
{
    seq_step *st = &s->step;
    Epmoe__ForwardInfo fi = EPMOE__FORWARD_INFO__INIT;
    fi.has_step_id = 1;
    fi.step_id = st->step_id;
    fi.has_layer = 1;
    fi.layer = (uint32_t)st->layer;
    fi.has_n_tokens = 1;
    fi.n_tokens = (uint32_t)st->n_tokens;
    fi.has_topk = 1;
    fi.topk = (uint32_t)st->topk;
    fi.has_hidden_size = 1;
    fi.hidden_size = (uint32_t)st->hidden;
    fi.has_seconds = 1;
    fi.seconds = clk_mono_s() - st->t0;
    fi.has_dispatch_bytes = 1;
    fi.dispatch_bytes = st->dispatch_bytes;
    fi.has_combine_bytes = 1;
    fi.combine_bytes = st->combine_bytes;
    Epmoe__AdminReply rep = EPMOE__ADMIN_REPLY__INIT;
    rep.forward = &fi;
    size_t T = (size_t)st->n_tokens, H = (size_t)st->hidden, k = (size_t)st->topk;
    wire_payload p[3] = {
        {.data = st->out, .len = T * H * 2, .free_fn = wire_free_malloc},
        {.data = st->ids, .len = T * k * 4, .free_fn = wire_free_malloc},
        {.data = st->wts, .len = T * k * 4, .free_fn = wire_free_malloc},
    };
    st->out = st->ids = st->wts = NULL; /* owned by the outbox now */
    s->steps_done++;
    log_debug(LOG_SUB_STEP, "step %" PRIu64 " done: %zu tokens in %.6f s", st->step_id, T,
              fi.seconds);
    adm_reply(out, st->req->msg->ident, st->req->msg->ident_len, st->req->id, &rep, p, 3);
    seq_step_release(st);
}

/* Close the step: every rank answered or is gone. */
static void seq_finish(seq_sequencer *s, ob_box *out)
{
    seq_step *st = &s->step;
    s->rec.ok = !st->failed;
    s->rec.seconds = clk_mono_s() - st->t0;
    if (!st->failed)
        seq_answer_ok(s, out);
    seq_step_release(st);
    st->active = false;
    seq_record_close(s);
    ob_event_add(out, OB_EV_STEP_END, -1, "step %" PRIu64, st->step_id);
}

static int seq_alloc_outputs(seq_step *st)
{
    size_t T = (size_t)st->n_tokens, H = (size_t)st->hidden, k = (size_t)st->topk;
    st->out = malloc(T * H * 2);
    st->ids = malloc(T * k * 4);
    st->wts = malloc(T * k * 4);
    return st->out && st->ids && st->wts ? 0 : -1;
}

/* Queue rank r's STEP. */
static void seq_send_step(seq_sequencer *s, const seq_env *env, int r, ob_box *out)
{
    seq_step *st = &s->step;
    seq_request *rq = st->req;
    size_t H = (size_t)st->hidden, b = (size_t)st->begin[r], n = (size_t)st->count[r];
    Epmoe__Step m = EPMOE__STEP__INIT;
    m.has_step_id = 1;
    m.step_id = st->step_id;
    m.has_epoch = 1;
    m.epoch = st->epoch;
    m.has_layer = 1;
    m.layer = (uint32_t)st->layer;
    m.has_n_tokens = 1;
    m.n_tokens = (uint32_t)n;
    m.has_has_ids = 1;
    m.has_ids = rq->has_ids;
    m.has_session = 1;
    m.session = env->session;
    wire_payload p[2] = {
        {.data = rq->msg->payload[0] + b * H * 2, .len = n * H * 2},
        {.data = rq->has_ids ? rq->msg->payload[1] + b * 8 : NULL, .len = n * 8},
    };
    int np = rq->has_ids ? 2 : 1;
    for (int i = 0; i < np && n > 0; i++) {
        p[i].free_fn = seq_slice_free;
        p[i].hint = rq;
        atomic_fetch_add(&rq->refs, 1);
    }
    ob_msg *om = ob_to_rank(out, r, EPMOE__MSG_TYPE__MSG_STEP, &m.base, p, np);
    if (om != NULL)
        om->step_id = st->step_id;
}

static void seq_start(seq_sequencer *s, const seq_env *env, seq_request *rq, ob_box *out)
{
    seq_step *st = &s->step;
    int P = s->P, T = rq->n_tokens;
    *st = (seq_step){.answer = st->answer, .begin = st->begin, .count = st->count};
    st->active = true;
    st->req = rq;
    st->step_id = ++s->last_step_id;
    st->layer = rq->layer;
    st->n_tokens = T;
    st->hidden = env->cfg->hidden_size;
    st->topk = env->cfg->num_experts_per_tok;
    st->t0 = clk_mono_s();
    st->deadline_ms = env->now_ms + env->spec->step_timeout_ms;
    if (seq_record_begin(s, env->cfg->n_routed_experts, st->step_id, env->plan->epoch, st->layer,
                         T) != 0)
        log_warn("step %" PRIu64 ": out of memory for its load record", st->step_id);
    /* the epoch's members, in rank order, own the tokens as data-parallel ranks would: the
     * i-th member of M gets [floor(i*T/M), floor((i+1)*T/M)); other ranks get no STEP */
    const plan_table *plan = env->plan;
    int M = plan->n_members, i = 0;
    st->epoch = plan->epoch;
    st->pending = M;
    for (int r = 0; r < P; r++) {
        st->answer[r] = plan_is_member(plan, r) ? SEQ_PENDING : SEQ_GONE;
        st->begin[r] = st->count[r] = 0;
        if (st->answer[r] != SEQ_PENDING)
            continue;
        st->begin[r] = (int)((int64_t)i * T / M);
        st->count[r] = (int)((int64_t)(i + 1) * T / M) - st->begin[r];
        i++;
    }
    if (seq_alloc_outputs(st) != 0) {
        for (int r = 0; r < P; r++)
            st->answer[r] = SEQ_GONE;
        st->pending = 0;
        ep_err oom;
        ep_err_setc(&oom, EP_ERR_STEP_FAILED,
                    "the coordinator is out of memory for the step's outputs");
        seq_answer_error(s, &oom, out);
        return; /* settled: seq_pump closes it */
    }
    char lname[64];
    log_debug(
        LOG_SUB_STEP, "step %" PRIu64 ": layer %s, %d tokens over %d ranks (epoch %" PRIu64 ")",
        st->step_id, seq_layer_name(env->cfg, st->layer, lname, sizeof lname), T, M, st->epoch);
    for (int r = 0; r < P; r++)
        if (st->answer[r] == SEQ_PENDING)
            seq_send_step(s, env, r, out);
}

/* While the cluster changes epochs, queued requests wait; one that has waited step_timeout_ms
 * is answered ERR_TIMEOUT (it never started: nothing was computed for it). */
static void seq_expire(seq_sequencer *s, const seq_env *env, ob_box *out)
{
    seq_request **pp = &s->head, *last = NULL;
    while (*pp != NULL) {
        seq_request *r = *pp;
        if (env->now_ms - r->queued_ms < env->spec->step_timeout_ms) {
            last = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        s->n_queued--;
        s->queued_bytes -= r->bytes;
        adm_error(out, r->msg->ident, r->msg->ident_len, r->id, EPMOE__ERROR_CODE__ERR_TIMEOUT,
                  "the request waited step_timeout_ms %d for cluster %s to be ready and never "
                  "ran (%s; workers not ready: %s)",
                  env->spec->step_timeout_ms, env->spec->name, env->state, env->not_ready);
        seq_req_unref(r);
    }
    s->tail = last;
}

void seq_pump(seq_sequencer *s, const seq_env *env, ob_box *out)
{
    for (;;) {
        if (s->step.active) {
            if (s->step.pending > 0)
                return;
            seq_finish(s, out);
            continue;
        }
        if (!env->ready && env->wait) {
            seq_expire(s, env, out);
            return;
        }
        seq_request *r = s->head;
        if (r == NULL)
            return;
        s->head = r->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->n_queued--;
        s->queued_bytes -= r->bytes;
        r->next = NULL;
        if (!env->ready) {
            seq_refuse_not_ready(env, r->msg->ident, r->msg->ident_len, r->id, out);
            seq_req_unref(r);
            continue;
        }
        seq_start(s, env, r, out);
        return; /* the STEPs must leave before anything else happens */
    }
}

/* Whether a worker's answer is for the step in flight (else it is logged and dropped). */
static bool seq_current(const seq_sequencer *s, int rank, bool has_id, uint64_t step_id,
                        const char *what)
{
    const seq_step *st = &s->step;
    if (st->active && has_id && step_id == st->step_id && st->answer[rank] == SEQ_PENDING)
        return true;
    log_debug(LOG_SUB_STEP,
              "rank %d: %s for step %" PRIu64 " ignored (step in flight %" PRIu64 ", rank %s)",
              rank, what, step_id, st->active ? st->step_id : 0,
              st->active ? seq_answer_name(st->answer[rank]) : "idle");
    return false;
}

/* Check a STEP_DONE's shape against the chunk rank r was given. */
static int seq_check_done(const seq_step *st, int r, const Epmoe__StepDone *d, const wire_msg *m,
                          ep_err *err)
{
    size_t n = (size_t)st->count[r], H = (size_t)st->hidden, k = (size_t)st->topk;
    if (!d->has_n_tokens || d->n_tokens != n)
        return ep_err_set(err, "STEP_DONE for %u tokens, the worker was given %zu",
                          d->has_n_tokens ? d->n_tokens : 0, n);
    if (m->n_payloads != 3)
        return ep_err_set(err,
                          "STEP_DONE with %d payloads, expected 3 (out, topk_ids, "
                          "topk_weights)",
                          m->n_payloads);
    size_t want[3] = {n * H * 2, n * k * 4, n * k * 4};
    static const char *what[3] = {"out bf16 [n, H]", "topk_ids int32 [n, k]",
                                  "topk_weights f32 [n, k]"};
    for (int i = 0; i < 3; i++)
        if (m->payload_len[i] != want[i])
            return ep_err_set(err, "STEP_DONE payload %d (%s) has %zu bytes, expected %zu", i,
                              what[i], m->payload_len[i], want[i]);
    return 0;
}

static void seq_on_done(seq_sequencer *s, const seq_env *env, int r, const wire_msg *m, ob_box *out)
{
    seq_step *st = &s->step;
    const char *name = env->spec->workers[r].name;
    ep_err err;
    Epmoe__StepDone *d = (Epmoe__StepDone *)wire_unpack(&epmoe__step_done__descriptor, m, &err);
    if (d == NULL) {
        ob_error(out, OB_TO_RANK, r, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type, "%s",
                 err.msg);
        /* we cannot tell which step it meant: the step timeout covers a lost answer */
        log_warn("worker %s: %s", name, err.msg);
        return;
    }
    if (!seq_current(s, r, d->has_step_id, d->step_id, "STEP_DONE"))
        goto done;
    st->answer[r] = SEQ_DONE;
    st->pending--;
    if (seq_check_done(st, r, d, m, &err) != 0) {
        st->answer[r] = SEQ_FAILED;
        ob_error(out, OB_TO_RANK, r, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, m->type,
                 "step %" PRIu64 ": %s", st->step_id, err.msg);
        ob_event_add(out, OB_EV_ERROR, r, "step %" PRIu64 ": malformed STEP_DONE: %s", st->step_id,
                     err.msg);
        seq_fail(s, env, out, EPMOE__ERROR_CODE__ERR_STEP_FAILED,
                 "worker %s (rank %d): malformed STEP_DONE: %s", name, r, err.msg);
    } else if (!st->failed) {
        size_t b = (size_t)st->begin[r], H = (size_t)st->hidden, k = (size_t)st->topk;
        memcpy(st->out + b * H * 2, m->payload[0], m->payload_len[0]);
        memcpy(st->ids + b * k * 4, m->payload[1], m->payload_len[1]);
        memcpy(st->wts + b * k * 4, m->payload[2], m->payload_len[2]);
        st->dispatch_bytes += d->has_dispatch_bytes ? d->dispatch_bytes : 0;
        st->combine_bytes += d->has_combine_bytes ? d->combine_bytes : 0;
        seq_record_add(s, d);
    }
done:
    wire_free_unpacked(&d->base);
}

static void seq_on_failed(seq_sequencer *s, const seq_env *env, int r, const wire_msg *m,
                          ob_box *out)
{
    seq_step *st = &s->step;
    const char *name = env->spec->workers[r].name;
    ep_err err;
    Epmoe__StepFailed *f =
        (Epmoe__StepFailed *)wire_unpack(&epmoe__step_failed__descriptor, m, &err);
    if (f == NULL) {
        ob_error(out, OB_TO_RANK, r, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type, "%s",
                 err.msg);
        log_warn("worker %s: %s", name, err.msg);
        return;
    }
    if (seq_current(s, r, f->has_step_id, f->step_id, "STEP_FAILED")) {
        const char *text = f->message && f->message[0] ? f->message : "(no message)";
        st->answer[r] = SEQ_FAILED;
        st->pending--;
        if (!st->failed) { /* after our STEP_ABORT this is only the acknowledgement */
            ob_event_add(out, OB_EV_ERROR, r, "step %" PRIu64 ": %s", st->step_id, text);
            seq_fail(s, env, out, EPMOE__ERROR_CODE__ERR_STEP_FAILED, "worker %s (rank %d): %s",
                     name, r, text);
        }
    }
    wire_free_unpacked(&f->base);
}

void seq_on_message(seq_sequencer *s, const seq_env *env, int rank, const wire_msg *m, ob_box *out)
{
    if (rank < 0 || rank >= s->P)
        return;
    if (m->type == EPMOE__MSG_TYPE__MSG_STEP_DONE)
        seq_on_done(s, env, rank, m, out);
    else
        seq_on_failed(s, env, rank, m, out);
}

void seq_worker_lost(seq_sequencer *s, const seq_env *env, int rank, const char *why, ob_box *out)
{
    seq_step *st = &s->step;
    if (!st->active || rank < 0 || rank >= s->P || st->answer[rank] != SEQ_PENDING)
        return;
    st->answer[rank] = SEQ_GONE;
    st->pending--;
    seq_fail(s, env, out, EPMOE__ERROR_CODE__ERR_WORKER_LOST,
             "worker %s (rank %d) was lost during step %" PRIu64 ": %s",
             env->spec->workers[rank].name, rank, st->step_id, why);
}

void seq_send_failed(seq_sequencer *s, const seq_env *env, int rank, uint64_t step_id,
                     const char *err, ob_box *out)
{
    seq_step *st = &s->step;
    if (!st->active || st->step_id != step_id || rank < 0 || rank >= s->P ||
        st->answer[rank] != SEQ_PENDING)
        return;
    st->answer[rank] = SEQ_GONE; /* never got the step: nothing to wait for */
    st->pending--;
    seq_fail(s, env, out, EPMOE__ERROR_CODE__ERR_WORKER_LOST,
             "worker %s (rank %d) is unreachable: %s", env->spec->workers[rank].name, rank, err);
}

/* "a1 (rank 1), a3 (rank 3)": the ranks still pending. */
static void seq_pending_text(const seq_sequencer *s, const seq_env *env, char *buf, size_t cap)
{
    const seq_step *st = &s->step;
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < s->P && len + 80 < cap; r++)
        if (st->answer[r] == SEQ_PENDING)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s (rank %d)", len ? ", " : "",
                                    env->spec->workers[r].name, r);
}

void seq_tick(seq_sequencer *s, const seq_env *env, ob_box *out)
{
    seq_step *st = &s->step;
    if (st->active && !st->failed && env->now_ms >= st->deadline_ms) {
        char who[600], lname[64];
        seq_pending_text(s, env, who, sizeof who);
        seq_fail(s, env, out, EPMOE__ERROR_CODE__ERR_TIMEOUT,
                 "step %" PRIu64 " (layer %s, %d tokens) exceeded step_timeout_ms %d; no answer "
                 "from %s",
                 st->step_id, seq_layer_name(env->cfg, st->layer, lname, sizeof lname),
                 st->n_tokens, env->spec->step_timeout_ms, who);
    } else if (st->active && st->failed && env->now_ms >= st->abort_deadline_ms) {
        /* A live worker that ignores STEP_ABORT would hold the queue forever: nothing more is
         * waited for from it, and it is declared dead. */
        for (int r = 0; r < s->P; r++) {
            if (st->answer[r] != SEQ_PENDING)
                continue;
            st->answer[r] = SEQ_GONE;
            st->pending--;
            ob_event_add(out, OB_EV_DECLARE_DEAD, r,
                         "no answer to STEP_ABORT for step %" PRIu64 " within %d ms", st->step_id,
                         env->spec->step_timeout_ms);
        }
    }
}

int64_t seq_next_deadline(const seq_sequencer *s, const seq_env *env)
{
    const seq_step *st = &s->step;
    if (st->active)
        return st->failed ? st->abort_deadline_ms : st->deadline_ms;
    if (s->head != NULL && !env->ready && env->wait)
        return s->head->queued_ms + env->spec->step_timeout_ms;
    return INT64_MAX;
}

bool seq_busy(const seq_sequencer *s)
{
    return s->step.active;
}

int seq_resize(seq_sequencer *s, int n_ranks, ep_err *err)
{
    if (s->step.active)
        return ep_err_set(err, "sequencer: a step is in flight");
    if (n_ranks == s->P)
        return 0;
    uint8_t *a = calloc((size_t)n_ranks, 1);
    int *b = calloc((size_t)n_ranks, sizeof *b), *c = calloc((size_t)n_ranks, sizeof *c);
    if (a == NULL || b == NULL || c == NULL) {
        free(a);
        free(b);
        free(c);
        return ep_err_set(err, "sequencer: out of memory");
    }
    free(s->step.answer);
    free(s->step.begin);
    free(s->step.count);
    s->step.answer = a;
    s->step.begin = b;
    s->step.count = c;
    s->P = n_ranks;
    return 0;
}

void seq_stop(seq_sequencer *s, ob_box *out)
{
    if (s->step.active) {
        ep_err stop;
        ep_err_setc(&stop, EP_ERR_SHUTTING_DOWN,
                    "the coordinator is stopping; the step was abandoned");
        seq_answer_error(s, &stop, out);
    }
    while (s->head) {
        seq_request *r = s->head;
        s->head = r->next;
        adm_error(out, r->msg->ident, r->msg->ident_len, r->id,
                  EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN, "the coordinator is stopping");
        seq_req_unref(r);
    }
    s->tail = NULL;
    s->n_queued = 0;
    s->queued_bytes = 0;
}
