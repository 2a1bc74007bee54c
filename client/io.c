/*
 * io.c — libepmoe's I/O thread (client_state.h): the only user of the client's ZeroMQ sockets. It
 * sends what epmoe_submit queued where there is room (flow control: each entry's credit, told in
 * its answers; what has no room waits in the queue), reads RESULTs into the callers' buffers,
 * resends a request whose entry is silent (or no longer a ready member) to the next member,
 * fails it at its deadline, and asks the coordinator for CLIENT_INFO when news calls for it
 * (docs/client.md "Threads", "Flow control", "Epochs"; docs/protocol.md "Serving path").
 *
 * Every state change happens under c->mu; the thread holds it while it works and drops it
 * only to wait in zmq_poll.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <protobuf-c/protobuf-c.h>
#include <zmq.h>

#include "client/client_state.h"
#include "common/wire.h"

/* ---- wake-ups and releases ---- */

void cl_io_wake(epmoe_client *c)
{
    uint64_t one = 1;
    ssize_t n = write(c->wake_fd, &one, sizeof one);
    (void)n;
}

/* libzmq let go of an input frame (called from its I/O thread, or ours on a failed send). */
static void cl_zc_free(void *data, void *hint)
{
    (void)data;
    struct epmoe_request *r = hint;
    if (atomic_fetch_sub(&r->zc_refs, 1) == 1 && atomic_load(&r->releasing))
        cl_io_wake(r->c);
}

static void cl_publish(epmoe_client *c, struct epmoe_request *r)
{
    r->state = CL_DONE;
    bool was_empty = c->done_head == NULL;
    cl_list_push(&c->done_head, &c->done_tail, r);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t n = write(c->done_fd, &one, sizeof one);
        (void)n;
    }
    pthread_cond_broadcast(&c->cond);
}

void cl_flow_release(epmoe_client *c, struct epmoe_request *r)
{
    if (r->held_at >= 0 && (uint32_t)r->held_at < c->cap_entries && c->flow[r->held_at].held > 0)
        c->flow[r->held_at].held--;
    r->held_at = -1;
}

void cl_finish(epmoe_client *c, struct epmoe_request *r)
{
    cl_flow_release(c, r);
    r->finished_ns = clk_mono_ns();
    r->state = CL_RELEASING;
    /* releasing before the count: either we see 0 here or cl_zc_free sees releasing */
    atomic_store(&r->releasing, 1);
    if (atomic_load(&r->zc_refs) == 0)
        cl_publish(c, r);
}

static void cl_fail_stale(epmoe_client *c, struct epmoe_request *r)
{
    r->status = EPMOE_ESTALE;
    r->remote_code = 0;
    snprintf(r->message, sizeof r->message, "layer %u: %s", r->layer, c->stale_why);
    cl_finish(c, r);
}

void cl_go_stale(epmoe_client *c, const char *why)
{
    if (c->stale)
        return;
    c->stale = true;
    snprintf(c->stale_why, sizeof c->stale_why, "%s", why);
    while (c->queue_head != NULL) {
        struct epmoe_request *r = c->queue_head;
        cl_list_remove(&c->queue_head, &c->queue_tail, r);
        cl_fail_stale(c, r);
    }
    for (uint32_t k = 0; k < c->max_in_flight; k++) {
        struct epmoe_request *r = &c->slots[k];
        if (r->state == CL_FLIGHT && !r->wait_release)
            cl_fail_stale(c, r);
    }
}

/* ---- sockets ---- */

static void cl_entry_close(epmoe_client *c, int i)
{
    if (c->entry[i] != NULL) {
        zmq_close(c->entry[i]); /* linger 0: libzmq drops (and releases) what it still holds */
        c->entry[i] = NULL;
    }
    c->entry_ep[i][0] = '\0';
}

/* A DEALER to ep; hwm bounds what it queues while the peer is away. */
static void *cl_socket(epmoe_client *c, const uint8_t *server_key, const char *ep, int hwm,
                       epmoe_error *err)
{
    void *s = zmq_socket(c->zctx, ZMQ_DEALER);
    ep_err e = {0};
    int ivl = 1000, ttl = 3000;
    if (s == NULL || wire_socket_defaults(s, (int64_t)EP_MAX_DATA_MSG, &e) != 0 ||
        zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &ttl, sizeof ttl) != 0 ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        (c->secure && auth_client(s, &c->kp, server_key, &e) != 0) || zmq_connect(s, ep) != 0) {
        cl_fail(err, EPMOE_EUNAVAILABLE, 0, "%s: %s", ep,
                e.msg[0] ? e.msg : zmq_strerror(zmq_errno()));
        if (s)
            zmq_close(s);
        return NULL;
    }
    return s;
}

/* The DEALER to member i, connected on first use (and again when its endpoint changed). */
static void *cl_entry_socket(epmoe_client *c, int i)
{
    const cl_member *m = &c->info.members[i];
    if (c->entry[i] != NULL && strcmp(c->entry_ep[i], m->endpoint) == 0)
        return c->entry[i];
    cl_entry_close(c, i);
    c->entry[i] = cl_socket(c, m->key, m->endpoint, (int)c->max_in_flight * 2 + 16, NULL);
    if (c->entry[i] != NULL)
        snprintf(c->entry_ep[i], sizeof c->entry_ep[i], "%s", m->endpoint);
    return c->entry[i];
}

/* ---- sending ---- */

static int64_t cl_resend_ns(const epmoe_client *c, const struct epmoe_request *r)
{
    /* A backstop for an entry that went silent while nobody said so (a coordinator that is
     * down too): an entry the coordinator declares dead is replaced at the next CLIENT_INFO
     * (cl_take_info). Half the deadline, so a long prefill is not computed twice because it
     * takes a while. */
    uint32_t ms = c->resend_ms;
    if (ms == 0)
        ms = r->timeout_ms / 2 ? r->timeout_ms / 2 : 1;
    return (int64_t)ms * 1000000;
}

static void cl_note_tried(struct epmoe_request *r, int i)
{
    for (int k = 0; k < r->n_tried; k++)
        if (r->tried[k] == i)
            return;
    if (r->n_tried < CL_MAX_TRIED)
        r->tried[r->n_tried++] = i;
}

/* SUBMIT r to member i, its input zero-copy. 0, or -1 when the send failed (nothing held). */
static int cl_send(epmoe_client *c, struct epmoe_request *r, int i, int64_t now)
{
    void *s = cl_entry_socket(c, i);
    if (s == NULL)
        return -1;
    int64_t left = (r->deadline_ns - now) / 1000000;
    Epmoe__Submit sb = EPMOE__SUBMIT__INIT;
    sb.has_client = sb.has_seq = sb.has_layer = sb.has_n_tokens = sb.has_has_ids = 1;
    sb.has_config_hash = sb.has_timeout_ms = sb.has_resent = 1;
    sb.client = c->id;
    sb.seq = r->seq;
    sb.layer = r->layer;
    sb.n_tokens = r->n_tokens;
    sb.has_ids = r->token_ids != NULL;
    sb.config_hash = c->info.shape.config_hash;
    sb.timeout_ms = left < 1 ? 1 : (uint32_t)left;
    sb.resent = r->n_sends > 0;
    wire_payload p[2] = {
        {.data = r->hidden,
         .len = (size_t)r->n_tokens * c->info.shape.hidden_size * 2,
         .free_fn = cl_zc_free,
         .hint = r},
        {.data = r->token_ids, .len = (size_t)r->n_tokens * 8, .free_fn = cl_zc_free, .hint = r}};
    int np = r->token_ids ? 2 : 1;
    atomic_fetch_add(&r->zc_refs, np);
    ep_err e;
    if (wire_send(s, NULL, 0, EPMOE__MSG_TYPE__MSG_SUBMIT, &sb.base, p, np, true, &e) != 0)
        return -1; /* wire_send released the frames */
    r->sent_mask[i / 64] |= 1ull << (i % 64);
    cl_flow_release(c, r);
    r->held_at = i;
    c->flow[i].held++;
    r->entry = i;
    cl_note_tried(r, i);
    r->resent = r->n_sends > 0;
    r->n_sends++;
    r->waited = false; /* it found room */
    r->sent_ns = now;
    r->resend_ns = now + cl_resend_ns(c, r);
    return 0;
}

/* Send r to an entry with room (avoiding r->avoid), trying each member once. 0: sent; -1:
 * nobody can take it now (r->waited when members are there but hold their credit). */
static int cl_dispatch(epmoe_client *c, struct epmoe_request *r, int64_t now)
{
    int avoid = r->avoid;
    for (uint32_t k = 0; k < c->info.n_members; k++) {
        int i = cl_pick_entry(c, avoid, now);
        if (i == CL_PICK_WAIT)
            r->waited = true;
        if (i < 0)
            return -1;
        if (cl_send(c, r, i, now) == 0) {
            r->avoid = -1;
            return 0;
        }
        avoid = i; /* that one failed: the next */
    }
    return -1;
}

/* r goes back to the queue's front (it is older than what waits there). */
static void cl_requeue(epmoe_client *c, struct epmoe_request *r, int avoid)
{
    cl_flow_release(c, r);
    r->avoid = avoid;
    r->state = CL_QUEUED;
    r->next = c->queue_head;
    r->prev = NULL;
    if (c->queue_head)
        c->queue_head->prev = r;
    else
        c->queue_tail = r;
    c->queue_head = r;
}

/* In order: what cannot go now waits, and what was queued after it waits behind it. */
static void cl_send_queued(epmoe_client *c, int64_t now)
{
    if (c->queue_head != NULL && now - c->last_submit_ns >= (int64_t)CL_REFRESH_IDLE_MS * 1000000)
        c->info_urgent = true; /* the first request after a quiet while: is the info current? */
    while (c->queue_head != NULL) {
        struct epmoe_request *r = c->queue_head;
        c->last_submit_ns = now;
        if (cl_dispatch(c, r, now) != 0)
            return;
        cl_list_remove(&c->queue_head, &c->queue_tail, r);
        r->state = CL_FLIGHT;
    }
}

/* r's entry is silent, stopping or gone: the next member, or the queue. */
static void cl_resend(epmoe_client *c, struct epmoe_request *r, int64_t now)
{
    int old = r->entry;
    c->info_stale = true; /* is it still a member? */
    cl_flow_release(c, r);
    r->avoid = old;
    if (cl_dispatch(c, r, now) != 0)
        cl_requeue(c, r, old);
}

/* ---- timers ---- */

static void cl_timeout(epmoe_client *c, struct epmoe_request *r)
{
    char tried[CL_MSG_MAX / 2] = "";
    size_t len = 0;
    for (int k = 0; k < r->n_tried && len + 1 < sizeof tried; k++)
        len += (size_t)snprintf(tried + len, sizeof tried - len, "%s%s", k ? ", " : "",
                                c->info.members[r->tried[k]].name);
    r->status = EPMOE_ETIMEDOUT;
    r->remote_code = 0;
    snprintf(r->message, sizeof r->message, "layer %u: no answer within %u ms (sent to %s)",
             r->layer, r->timeout_ms, r->n_tried ? tried : "no entry: no member was ready");
    cl_finish(c, r);
}

/* A request never sent because no member could take it, at its deadline (or the cluster
 * blocked meanwhile): the words epmoe_submit used to refuse it with at once. */
static void cl_not_ready(epmoe_client *c, struct epmoe_request *r)
{
    r->status = EPMOE_ENOTREADY;
    if (c->info.blocked) {
        r->remote_code = EPMOE__ERROR_CODE__ERR_NOT_READY;
        snprintf(r->message, sizeof r->message, "cluster %s is blocked: %s", c->info.cluster,
                 c->info.problem[0] ? c->info.problem : "no placement over the workers left");
    } else {
        char why[CL_MSG_MAX - 128];
        cl_not_ready_text(&c->info, c->secure, why, sizeof why);
        r->remote_code = 0;
        snprintf(r->message, sizeof r->message, "cluster %s: no member can take requests: %s",
                 c->info.cluster, why);
    }
    cl_finish(c, r);
}

/* A request at its deadline: EBUSY when it waited for room until then, or was refused for load
 * and its retry is not answered (the cluster stayed saturated), else ETIMEDOUT. */
static void cl_expire(epmoe_client *c, struct epmoe_request *r)
{
    if (r->state == CL_QUEUED) {
        cl_list_remove(&c->queue_head, &c->queue_tail, r);
        r->state = CL_FLIGHT;
    }
    if (r->n_sends == 0 && !r->waited && !cl_has_entry(c)) {
        cl_not_ready(c, r);
        return;
    }
    if (!r->waited && !r->refused) {
        cl_timeout(c, r);
        return;
    }
    char last[CL_MSG_MAX / 2];
    snprintf(last, sizeof last, "%s", r->message); /* the last refusal's words, if any */
    r->status = EPMOE_EBUSY;
    r->remote_code = EPMOE__ERROR_CODE__ERR_BUSY;
    snprintf(r->message, sizeof r->message,
             "layer %u: the cluster stayed saturated for %u ms: every entry this client may use "
             "held its credit of requests or refused for load%s%s",
             r->layer, r->timeout_ms, last[0] ? "; last: " : "", last);
    cl_finish(c, r);
}

/* A finished request whose input is still held: reset the sockets that hold it. */
static void cl_force_release(epmoe_client *c, struct epmoe_request *r)
{
    for (uint32_t i = 0; i < c->cap_entries; i++)
        if (r->sent_mask[i / 64] & (1ull << (i % 64)))
            cl_entry_close(c, (int)i);
    memset(r->sent_mask, 0, sizeof r->sent_mask);
}

/* An entry that holds r and has said nothing for CL_REFRESH_WAIT_MS since it was sent may be
 * gone: that is news to ask the coordinator about (an entry answering others is alive). */
static void cl_check_silence(epmoe_client *c, const struct epmoe_request *r, int64_t now,
                             int64_t *next)
{
    if (r->entry < 0 || (uint32_t)r->entry >= c->cap_entries)
        return;
    int64_t heard =
        c->flow[r->entry].heard_ns > r->sent_ns ? c->flow[r->entry].heard_ns : r->sent_ns;
    int64_t due = heard + (int64_t)CL_REFRESH_WAIT_MS * 1000000;
    if (now >= due)
        c->info_stale = true;
    else if (due < *next)
        *next = due;
}

/* Walk the slots: deadlines, resends, releases. Returns the ns until the next timer. */
static int64_t cl_timers(epmoe_client *c, int64_t now)
{
    int64_t next = INT64_MAX;
    for (uint32_t k = 0; k < c->max_in_flight; k++) {
        struct epmoe_request *r = &c->slots[k];
        bool held = atomic_load(&r->zc_refs) > 0;
        int64_t release_due = r->finished_ns + (int64_t)CL_RELEASE_MS * 1000000;
        if (r->state == CL_ORPHAN) { /* nobody waits for it: its slot returns once released */
            if (!held)
                cl_slot_free(c, r);
            else if (now >= release_due)
                cl_force_release(c, r);
            else
                next = release_due < next ? release_due : next;
            continue;
        }
        if (r->wait_release || r->state == CL_RELEASING) {
            if (!held && r->wait_release) {
                pthread_cond_broadcast(&c->cond);
            } else if (!held) {
                cl_publish(c, r);
            } else if (now - r->finished_ns >= (int64_t)CL_RELEASE_MS * 1000000) {
                cl_force_release(c, r);
            } else {
                int64_t due = r->finished_ns + (int64_t)CL_RELEASE_MS * 1000000;
                next = due < next ? due : next;
            }
            continue;
        }
        if (r->state == CL_QUEUED && r->n_sends == 0 && c->info.blocked) {
            cl_list_remove(&c->queue_head, &c->queue_tail, r);
            cl_not_ready(c, r); /* no placement serves: waiting would not help */
        } else if (r->state == CL_QUEUED && now >= r->deadline_ns)
            cl_expire(c, r);
        else if (r->state == CL_QUEUED)
            next = r->deadline_ns < next ? r->deadline_ns : next;
        if (r->state != CL_FLIGHT)
            continue;
        if (now >= r->deadline_ns) {
            cl_expire(c, r);
            continue;
        }
        if (now >= r->resend_ns)
            cl_resend(c, r, now);
        if (r->state != CL_FLIGHT)
            continue;
        cl_check_silence(c, r, now, &next);
        int64_t due = r->resend_ns < r->deadline_ns ? r->resend_ns : r->deadline_ns;
        next = due < next ? due : next;
    }
    if (c->queue_head != NULL) /* waiting for room: answers wake us, refusals' pauses do not */
        next = next < now + (int64_t)CL_QUEUE_RETRY_MS * 1000000
                   ? next
                   : now + (int64_t)CL_QUEUE_RETRY_MS * 1000000;
    return next == INT64_MAX ? INT64_MAX : next - now;
}

/* ---- CLIENT_INFO ---- */

static int cl_ask_info(epmoe_client *c, int64_t now)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_id = rq.has_verb = 1;
    rq.id = ++c->info_id_seq;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO;
    ep_err e;
    c->info_sent_ns = now;
    if (wire_send(c->admin, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &rq.base, NULL, 0, true,
                  &e) != 0)
        return -1;
    c->info_id = rq.id;
    return 0;
}

/* A CLIENT_INFO for another model than the one of open (a coordinator restarted on another
 * checkpoint) is never adopted: the caller sized its buffers for the model of open, and every
 * request is built from it, so adopting would read and write past them. The client goes stale. */
static bool cl_same_model(epmoe_client *c, const cl_info *fresh)
{
    const epmoe_info *a = &c->info.shape, *b = &fresh->shape;
    if (a->config_hash == b->config_hash)
        return true;
    char why[160];
    snprintf(why, sizeof why,
             "the cluster's model changed since epmoe_open (config hash %016" PRIx64
             " -> %016" PRIx64 ", H %u -> %u, vocab %u -> %u): open a new client",
             a->config_hash, b->config_hash, a->hidden_size, b->hidden_size, a->vocab_size,
             b->vocab_size);
    cl_go_stale(c, why);
    return false;
}

/* A fresh info: entry sockets whose member moved are closed, requests whose entry is no
 * longer a ready member go to the next one now. */
static void cl_take_info(epmoe_client *c, cl_info *fresh, int64_t now)
{
    if (!cl_same_model(c, fresh)) {
        cl_info_free(fresh);
        return;
    }
    cl_info old = c->info;
    c->info = *fresh;
    for (uint32_t i = 0; i < c->cap_entries; i++) {
        const cl_member *m = i < c->info.n_members ? &c->info.members[i] : NULL;
        bool moved = m == NULL || strcmp(c->entry_ep[i], m->endpoint) != 0 ||
                     (i < old.n_members && memcmp(old.members[i].key, m->key, AUTH_KEY_BYTES));
        if (c->entry[i] != NULL && moved)
            cl_entry_close(c, (int)i);
        if (moved || i >= old.n_members || strcmp(old.members[i].name, m->name) != 0)
            c->flow[i] = (cl_flow){.credit = CL_CREDIT, .backoff_ms = CL_BUSY_BACKOFF_MS};
        c->flow[i].held = 0; /* counted again below: a member's index may have changed */
    }
    for (uint32_t k = 0; k < c->max_in_flight; k++) {
        struct epmoe_request *r = &c->slots[k];
        if (r->held_at >= 0 && (uint32_t)r->held_at < c->info.n_members)
            c->flow[r->held_at].held++;
        else
            r->held_at = -1;
        /* gone (dead, moved, no longer a member), or not ready while another one is */
        if (r->state == CL_FLIGHT && !r->wait_release && r->entry >= 0 &&
            (!cl_entry_reachable(c, r->entry) ||
             (!c->info.members[r->entry].ready && cl_has_ready_entry(c))))
            r->resend_ns = now;
    }
    cl_info_free(&old);
}

/* A coordinator forming or loading with no member ready (restarted: its workers are
 * registering again) knows less than the last view, whose entries serve on meanwhile. */
static bool cl_info_knows_less(const epmoe_client *c, const cl_info *fresh)
{
    if (fresh->cluster_state != EPMOE__CLUSTER_STATE__CLUSTER_FORMING &&
        fresh->cluster_state != EPMOE__CLUSTER_STATE__CLUSTER_LOADING)
        return false;
    for (uint32_t i = 0; i < fresh->n_members; i++)
        if (fresh->members[i].ready)
            return false;
    return cl_has_ready_entry(c);
}

static void cl_on_admin(epmoe_client *c, int64_t now)
{
    for (int k = 0; k < 16; k++) {
        wire_msg m;
        ep_err e;
        wire_rc rc = wire_recv(c->admin, false, EP_MAX_CTRL_MSG, 0, ZMQ_DONTWAIT, &m, &e);
        if (rc == WIRE_AGAIN)
            return;
        if (rc == WIRE_ERR)
            continue;
        Epmoe__AdminReply *r = NULL;
        if (m.type == EPMOE__MSG_TYPE__MSG_ADMIN_REPLY)
            r = (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, &m, &e);
        if (r != NULL && r->has_id && r->id == c->info_id) {
            cl_info fresh;
            c->info_id = 0;
            c->info_stale = false;
            bool got = cl_info_from_reply(r, &fresh, NULL) == 0;
            if (got && cl_info_knows_less(c, &fresh))
                cl_info_free(&fresh);
            else if (got)
                cl_take_info(c, &fresh, now);
            /* a refusal keeps the last info: serving goes on in the current epoch */
        }
        if (r != NULL)
            wire_free_unpacked(&r->base);
        wire_msg_close(&m);
    }
}

static bool cl_any_in_flight(const epmoe_client *c)
{
    return c->n_free < (int)c->max_in_flight;
}

/* CLIENT_INFO only when news calls for it (client_state.h): at once for news not asked about
 * yet, else at most every CL_REFRESH_WAIT_MS (one question at a time, an unanswered one given
 * up after that: the coordinator may be away); and while no member is ready, every
 * CL_REFRESH_WAIT_MS (CL_REFRESH_IDLE_MS when idle). Returns the ns until it is due again,
 * INT64_MAX when no news is pending: then the coordinator hears nothing from this client. */
static int64_t cl_info_timer(epmoe_client *c, int64_t now)
{
    bool waiting = !cl_has_ready_entry(c);
    if (!c->info_stale && !c->info_urgent && !waiting)
        return INT64_MAX;
    int64_t every =
        (int64_t)(waiting && !cl_any_in_flight(c) && !c->info_stale ? CL_REFRESH_IDLE_MS
                                                                    : CL_REFRESH_WAIT_MS) *
        1000000;
    int64_t due = c->info_sent_ns + every;
    if (c->info_urgent && c->info_id == 0)
        due = now;
    if (now >= due) {
        if (cl_ask_info(c, now) == 0)
            c->info_urgent = false;
        due = now + every;
    }
    return due - now;
}

/* ---- results ---- */

static void *cl_arena_alloc(void *data, size_t size)
{
    epmoe_client *c = data;
    size = (size + 15) & ~(size_t)15;
    if (size > sizeof c->arena - c->arena_used)
        return NULL;
    void *p = c->arena + c->arena_used;
    c->arena_used += size;
    return p;
}

static void cl_arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* the arena is reset per message */
}

/* The request seq names: in flight, or queued to be sent again after it was sent once. */
static struct epmoe_request *cl_find(epmoe_client *c, uint64_t seq)
{
    for (uint32_t k = 0; k < c->max_in_flight; k++) {
        struct epmoe_request *r = &c->slots[k];
        if (r->seq == seq && !r->wait_release &&
            (r->state == CL_FLIGHT || (r->state == CL_QUEUED && r->n_sends > 0)))
            return r;
    }
    return NULL;
}

/* What every answer of entry i tells: its credit for this client, and the epoch it serves.
 * An epoch the info does not know is news: the first time at once, again at most every
 * CL_REFRESH_WAIT_MS while answers keep telling it (an entry ahead of the coordinator's
 * current epoch during a staged switch, or behind it). */
static void cl_note_entry(epmoe_client *c, int i, const Epmoe__Result *res)
{
    cl_flow *f = &c->flow[i];
    f->heard_ns = clk_mono_ns();
    if (res->has_credit && res->credit > 0)
        f->credit = res->credit < CL_MAX_IN_FLIGHT ? res->credit : CL_MAX_IN_FLIGHT;
    if (!res->has_code || res->code == EPMOE__ERROR_CODE__ERR_NONE)
        f->backoff_ms = CL_BUSY_BACKOFF_MS;
    if (!res->has_serving_epoch || res->serving_epoch == c->info.shape.epoch)
        return;
    c->info_stale = true;
    if (res->serving_epoch != c->told_epoch)
        c->info_urgent = true;
    c->told_epoch = res->serving_epoch;
}

/* The payloads of an ok RESULT into the caller's buffers; 0, or -1 with r->message. */
static int cl_take_payloads(epmoe_client *c, struct epmoe_request *r, const Epmoe__Result *res,
                            const wire_msg *m, const char *entry)
{
    size_t T = r->n_tokens, H = c->info.shape.hidden_size, K = c->info.shape.topk;
    size_t want[3] = {T * H * 2, T * K * 4, T * K * 4};
    if (!res->has_n_tokens || res->n_tokens != r->n_tokens || m->n_payloads != 3 ||
        m->payload_len[0] != want[0] || m->payload_len[1] != want[1] ||
        m->payload_len[2] != want[2]) {
        snprintf(r->message, sizeof r->message,
                 "entry %s: RESULT for layer %u with %u tokens and %d payloads (%zu, %zu, %zu "
                 "bytes); expected %u tokens and 3 payloads (%zu, %zu, %zu)",
                 entry, r->layer, res->has_n_tokens ? res->n_tokens : 0, m->n_payloads,
                 m->n_payloads > 0 ? m->payload_len[0] : 0,
                 m->n_payloads > 1 ? m->payload_len[1] : 0,
                 m->n_payloads > 2 ? m->payload_len[2] : 0, r->n_tokens, want[0], want[1], want[2]);
        return -1;
    }
    memcpy(r->out, m->payload[0], want[0]);
    if (r->topk_ids)
        memcpy(r->topk_ids, m->payload[1], want[1]);
    if (r->topk_weights)
        memcpy(r->topk_weights, m->payload[2], want[2]);
    return 0;
}

static void cl_on_result(epmoe_client *c, int i, const Epmoe__Result *res, const wire_msg *m)
{
    if (!res->has_client || res->client != c->id || !res->has_seq)
        return;
    cl_note_entry(c, i, res);
    struct epmoe_request *r = cl_find(c, res->seq);
    if (r == NULL)
        return; /* a late answer (another entry won), or canceled: dropped */
    const char *entry = c->info.members[i].name;
    int code = res->has_code ? (int)res->code : 0;
    int64_t now = clk_mono_ns();
    if (r->state == CL_QUEUED && code == EPMOE__ERROR_CODE__ERR_BUSY)
        return; /* already waiting for room */
    if (code == EPMOE__ERROR_CODE__ERR_BUSY && now < r->deadline_ns) {
        /* the entry is full: r waits for room. Past the credit it told (sent before the
         * library knew it), the entry's own answers make room; full with other clients'
         * requests, it gets nothing more for a pause that grows while it keeps refusing. */
        cl_flow *f = &c->flow[i];
        if (r->held_at != i || f->held <= f->credit) {
            f->busy_until_ns = now + (int64_t)f->backoff_ms * 1000000;
            f->backoff_ms = f->backoff_ms * 2 < CL_BUSY_BACKOFF_MAX_MS ? f->backoff_ms * 2
                                                                       : CL_BUSY_BACKOFF_MAX_MS;
        }
        r->waited = r->refused = true;
        snprintf(r->message, sizeof r->message, "entry %s: layer %u: %s", entry, r->layer,
                 res->message ? res->message : "busy");
        if (r->state == CL_FLIGHT)
            cl_requeue(c, r, -1);
        return;
    }
    if (r->state == CL_QUEUED) { /* an earlier entry's answer while it waited to be resent */
        cl_list_remove(&c->queue_head, &c->queue_tail, r);
        r->state = CL_FLIGHT;
    }
    if (code == EPMOE__ERROR_CODE__ERR_NOT_READY || code == EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN)
        c->info_stale = true; /* the entry knows of a change: learn it */
    if (code == EPMOE__ERROR_CODE__ERR_SHUTTING_DOWN && now < r->deadline_ns) {
        /* the entry is stopping (not the request failing): another member takes it now */
        r->resend_ns = now;
        return;
    }
    int64_t retry_ns = clk_mono_ns() + (int64_t)CL_NOT_READY_RETRY_MS * 1000000;
    if (code == EPMOE__ERROR_CODE__ERR_NOT_READY && r->n_not_ready < CL_NOT_READY_TRIES &&
        retry_ns < r->deadline_ns) {
        /* an entry between sessions (welcomed again after a coordinator restart or a reload):
         * not this request's failure; the next member shortly (cl_timers) */
        r->n_not_ready++;
        r->resend_ns = retry_ns;
        return;
    }
    r->remote_code = code;
    if (code != EPMOE__ERROR_CODE__ERR_NONE) {
        r->status = cl_map_remote(code);
        snprintf(r->message, sizeof r->message, "entry %s: layer %u: %s", entry, r->layer,
                 res->message ? res->message : "failed");
    } else if (cl_take_payloads(c, r, res, m, entry) != 0) {
        r->status = EPMOE_EPROTO;
    } else {
        r->status = EPMOE_OK;
        r->message[0] = '\0';
    }
    r->epoch = res->epoch;
    r->entry_rank = res->has_entry_rank ? res->entry_rank : c->info.members[i].rank;
    snprintf(r->entry_name, sizeof r->entry_name, "%s", entry);
    r->replayed = res->replayed;
    r->queued_s = res->queued_seconds;
    r->dispatch_s = res->dispatch_seconds;
    r->experts_s = res->experts_seconds;
    r->combine_s = res->combine_seconds;
    cl_finish(c, r);
    if (code == EPMOE__ERROR_CODE__ERR_CONFIG_HASH) {
        /* the entry serves another model than the one of open: so does the cluster */
        char why[160];
        snprintf(why, sizeof why,
                 "entry %s serves another model than the one of epmoe_open (ERR_CONFIG_HASH): "
                 "open a new client",
                 entry);
        cl_go_stale(c, why);
    }
}

void cl_on_entry_msg(epmoe_client *c, int i, const wire_msg *m)
{
    if (m->type != EPMOE__MSG_TYPE__MSG_RESULT)
        return;
    ProtobufCAllocator a = {.alloc = cl_arena_alloc, .free = cl_arena_free, .allocator_data = c};
    c->arena_used = 0;
    Epmoe__Result *res = (Epmoe__Result *)protobuf_c_message_unpack(&epmoe__result__descriptor, &a,
                                                                    m->body_len, m->body);
    if (res != NULL)
        cl_on_result(c, i, res, m);
}

static void cl_on_entry(epmoe_client *c, int i)
{
    for (int k = 0; k < 64 && c->entry[i] != NULL; k++) {
        wire_msg m;
        ep_err e;
        wire_rc rc = wire_recv(c->entry[i], false, CL_MAX_RESULT_BODY, EP_MAX_DATA_MSG,
                               ZMQ_DONTWAIT, &m, &e);
        if (rc == WIRE_AGAIN)
            return;
        if (rc == WIRE_ERR)
            continue;
        cl_on_entry_msg(c, i, &m);
        wire_msg_close(&m);
    }
}

/* ---- the thread ---- */

static void cl_drain_wake(epmoe_client *c)
{
    uint64_t v;
    ssize_t n = read(c->wake_fd, &v, sizeof v);
    (void)n;
}

static int cl_poll_items(epmoe_client *c, zmq_pollitem_t *it, int *idx)
{
    int n = 0;
    it[n++] = (zmq_pollitem_t){.fd = c->wake_fd, .events = ZMQ_POLLIN};
    it[n++] = (zmq_pollitem_t){.socket = c->admin, .events = ZMQ_POLLIN};
    for (uint32_t i = 0; i < c->cap_entries; i++)
        if (c->entry[i] != NULL) {
            idx[n] = (int)i;
            it[n++] = (zmq_pollitem_t){.socket = c->entry[i], .events = ZMQ_POLLIN};
        }
    return n;
}

static void cl_cancel_all(epmoe_client *c)
{
    for (uint32_t k = 0; k < c->max_in_flight; k++) {
        struct epmoe_request *r = &c->slots[k];
        if (r->state == CL_QUEUED || r->state == CL_FLIGHT || r->state == CL_RELEASING) {
            r->state = CL_CANCELED;
            r->status = EPMOE_ECANCELED;
            snprintf(r->message, sizeof r->message, "layer %u: the client was closed", r->layer);
        }
    }
    c->queue_head = c->queue_tail = NULL;
}

static void *cl_io_main(void *arg)
{
    epmoe_client *c = arg;
    zmq_pollitem_t *items = calloc(c->cap_entries + 2, sizeof *items);
    int *idx = calloc(c->cap_entries + 2, sizeof *idx);
    pthread_mutex_lock(&c->mu);
    while (!c->stopping && items != NULL && idx != NULL) {
        int64_t now = clk_mono_ns();
        cl_send_queued(c, now);
        int64_t wait = cl_timers(c, now);
        int64_t info = cl_info_timer(c, now);
        wait = info < wait ? info : wait;
        /* nothing due (no news, no request): a look every CL_IDLE_POLL_MS all the same */
        wait =
            wait < (int64_t)CL_IDLE_POLL_MS * 1000000 ? wait : (int64_t)CL_IDLE_POLL_MS * 1000000;
        int n = cl_poll_items(c, items, idx);
        pthread_mutex_unlock(&c->mu);
        long ms = (long)((wait + 999999) / 1000000);
        zmq_poll(items, n, ms < 0 ? 0 : ms);
        pthread_mutex_lock(&c->mu);
        now = clk_mono_ns();
        if (items[0].revents & ZMQ_POLLIN)
            cl_drain_wake(c);
        if (items[1].revents & ZMQ_POLLIN)
            cl_on_admin(c, now);
        for (int k = 2; k < n; k++)
            if (items[k].revents & ZMQ_POLLIN)
                cl_on_entry(c, idx[k]);
    }
    cl_cancel_all(c);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
    free(items);
    free(idx);
    return NULL;
}

/* ---- open and close ---- */

/* Wait for the first CLIENT_INFO answer (watching the handshake: a refused key fails at once). */
static int cl_first_info(epmoe_client *c, void *mon, epmoe_error *err)
{
    int64_t until = clk_mono_ns() + (int64_t)c->connect_ms * 1000000;
    int failed = 0;
    char why[512] = "";
    cl_ask_info(c, clk_mono_ns());
    for (;;) {
        int64_t left = (until - clk_mono_ns()) / 1000000;
        if (left <= 0)
            return cl_fail(err, EPMOE_EUNAVAILABLE, 0,
                           "coordinator %s: no answer to CLIENT_INFO in %u ms%s%s", c->coordinator,
                           c->connect_ms, why[0] ? ": " : "", why);
        zmq_pollitem_t it[2] = {{.socket = c->admin, .events = ZMQ_POLLIN},
                                {.socket = mon, .events = ZMQ_POLLIN}};
        zmq_poll(it, mon ? 2 : 1, left);
        for (auth_event ev;
             mon && (ev = auth_monitor_read(mon, why, sizeof why)) != AUTH_EV_NOTHING;)
            if (ev == AUTH_EV_REFUSED || (ev == AUTH_EV_FAILED && ++failed >= AUTH_FAILED_LIMIT))
                return cl_fail(err, EPMOE_EREFUSED, 0, "coordinator %s: %s", c->coordinator, why);
        wire_msg m;
        ep_err e;
        wire_rc rc = wire_recv(c->admin, false, EP_MAX_CTRL_MSG, 0, ZMQ_DONTWAIT, &m, &e);
        if (rc == WIRE_AGAIN)
            continue;
        if (rc == WIRE_ERR)
            return cl_fail(err, EPMOE_EREFUSED, 0,
                           "coordinator %s: %s (is it an epmoe coordinator's admin endpoint?)",
                           c->coordinator, e.msg);
        Epmoe__AdminReply *r = NULL;
        if (m.type == EPMOE__MSG_TYPE__MSG_ADMIN_REPLY)
            r = (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, &m, &e);
        int code = EPMOE_EREFUSED;
        if (r == NULL) /* e.g. coordinator.listen, the workers' socket, answering Error */
            cl_fail(err, code, 0,
                    "coordinator %s: answered %s, not CLIENT_INFO: not an epmoe coordinator's "
                    "admin endpoint (coordinator.admin in the cluster spec)",
                    c->coordinator, wire_type_name(m.type));
        else if (r->has_id && r->id == c->info_id)
            code = cl_info_from_reply(r, &c->info, err);
        else
            code = 1; /* an older question's answer */
        if (r != NULL)
            wire_free_unpacked(&r->base);
        wire_msg_close(&m);
        if (code <= 0) {
            if (code < 0 && err != NULL) {
                char msg[EPMOE_ERROR_MAX];
                snprintf(msg, sizeof msg, "%s", err->message);
                snprintf(err->message, sizeof err->message, "%s: %s", c->coordinator, msg);
            }
            c->info_id = 0;
            return code;
        }
    }
}

int cl_io_open(epmoe_client *c, epmoe_error *err)
{
    c->cap_entries = EP_MAX_WORKERS;
    c->entry = calloc(c->cap_entries, sizeof *c->entry);
    c->entry_ep = calloc(c->cap_entries, sizeof *c->entry_ep);
    c->flow = calloc(c->cap_entries, sizeof *c->flow);
    c->zctx = zmq_ctx_new();
    if (c->entry == NULL || c->entry_ep == NULL || c->flow == NULL || c->zctx == NULL)
        return cl_fail(err, EPMOE_ENOMEM, 0, "out of memory");
    for (uint32_t i = 0; i < c->cap_entries; i++)
        c->flow[i] = (cl_flow){.credit = CL_CREDIT, .backoff_ms = CL_BUSY_BACKOFF_MS};
    zmq_ctx_set(c->zctx, ZMQ_BLOCKY, 0);
    ep_err e = {0};
    if (wire_check_endpoint(c->coordinator, &e) != 0)
        return cl_fail(err, EPMOE_EINVAL, 0, "options.coordinator: %s", e.msg);
    /* a coordinator that is away gets no pile of CLIENT_INFO questions when it is back */
    c->admin = cl_socket(c, c->server_key, c->coordinator, 4, err);
    if (c->admin == NULL)
        return EPMOE_EUNAVAILABLE;
    void *mon = auth_monitor(c->zctx, c->admin, &e);
    int rc = cl_first_info(c, mon, err);
    if (mon != NULL) {
        zmq_socket_monitor(c->admin, NULL, 0);
        zmq_close(mon);
    }
    if (rc != 0)
        return rc;
    c->last_submit_ns = clk_mono_ns();
    if (pthread_create(&c->thread, NULL, cl_io_main, c) != 0)
        return cl_fail(err, EPMOE_ENOMEM, 0, "cannot start the I/O thread: %s", strerror(errno));
    c->thread_started = true;
    return 0;
}

void cl_io_close(epmoe_client *c)
{
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->mu);
        cl_io_wake(c);
        pthread_join(c->thread, NULL);
        c->thread_started = false;
    }
    for (uint32_t i = 0; c->entry != NULL && i < c->cap_entries; i++)
        cl_entry_close(c, (int)i);
    if (c->admin != NULL)
        zmq_close(c->admin);
    c->admin = NULL;
    if (c->zctx != NULL)
        zmq_ctx_term(c->zctx); /* linger 0: every frame it held is released by now */
    c->zctx = NULL;
    free(c->entry);
    free(c->entry_ep);
    free(c->flow);
    c->entry = NULL;
    c->entry_ep = NULL;
    c->flow = NULL;
}
