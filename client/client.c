/*
 * client.c — libepmoe's public API (client/epmoe.h): options, the slot pool, submit, wait,
 * poll, cancel, status. The sockets live in io.c; this file only touches the shared state
 * under c->mu (client_state.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "client/client_state.h"

static void cl_ok(epmoe_error *err)
{
    if (err != NULL) {
        err->code = EPMOE_OK;
        err->remote_code = 0;
        err->message[0] = '\0';
    }
}

const char *epmoe_strerror(int status)
{
    switch (status) {
    case EPMOE_OK:
        return "EPMOE_OK: success";
    case EPMOE_EINVAL:
        return "EPMOE_EINVAL: a bad argument";
    case EPMOE_EAGAIN:
        return "EPMOE_EAGAIN: no slot (max_in_flight requests are held)";
    case EPMOE_ETIMEDOUT:
        return "EPMOE_ETIMEDOUT: the deadline passed before the answer";
    case EPMOE_EBUSY:
        return "EPMOE_EBUSY: the cluster refused the request for load";
    case EPMOE_ENOTREADY:
        return "EPMOE_ENOTREADY: the cluster is not ready";
    case EPMOE_ESTALE:
        return "EPMOE_ESTALE: the cluster's model is not the one of epmoe_open";
    case EPMOE_EREFUSED:
        return "EPMOE_EREFUSED: refused (a key, or not an epmoe admin endpoint)";
    case EPMOE_EUNAVAILABLE:
        return "EPMOE_EUNAVAILABLE: no coordinator or member could be reached";
    case EPMOE_EFAILED:
        return "EPMOE_EFAILED: the request failed in the cluster";
    case EPMOE_ENOMEM:
        return "EPMOE_ENOMEM: out of memory";
    case EPMOE_ECANCELED:
        return "EPMOE_ECANCELED: canceled";
    case EPMOE_EPROTO:
        return "EPMOE_EPROTO: a malformed answer";
    case EPMOE_ENOTSUP:
        return "EPMOE_ENOTSUP: not on this cluster's data plane";
    case EPMOE_EWAITTIMEOUT:
        return "EPMOE_EWAITTIMEOUT: the wait's own timeout passed (the request goes on)";
    case EPMOE_EINPROGRESS:
        return "EPMOE_EINPROGRESS: the request is still in flight";
    default:
        return "EPMOE_E?: unknown status";
    }
}

const char *epmoe_version(void)
{
#define CL_STR2(x) #x
#define CL_STR(x)  CL_STR2(x)
    return CL_STR(EPMOE_VERSION_MAJOR) "." CL_STR(EPMOE_VERSION_MINOR) "." CL_STR(
        EPMOE_VERSION_PATCH);
}

int epmoe_version_number(void)
{
    return EPMOE_VERSION_NUMBER;
}

/* The done list lost an entry: epmoe_fd stops being readable when it is empty. */
static void cl_done_take(epmoe_client *c, struct epmoe_request *r)
{
    cl_list_remove(&c->done_head, &c->done_tail, r);
    r->state = CL_TAKEN;
    if (c->done_head == NULL) {
        uint64_t v;
        ssize_t n = read(c->done_fd, &v, sizeof v); /* reset the counter: not readable */
        (void)n;
    }
}

/* ---- options and open ---- */

static int cl_z85_key(const char *z85, uint8_t key[AUTH_KEY_BYTES], const char *what,
                      epmoe_error *err)
{
    if (strlen(z85) != AUTH_Z85_LEN || zmq_z85_decode(key, z85) == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "options.%s: expected a %d-character Z85 key", what,
                       AUTH_Z85_LEN);
    return 0;
}

static int cl_options(epmoe_client *c, const epmoe_options *o, epmoe_error *err)
{
    if (o == NULL || o->size < offsetof(epmoe_options, connect_timeout_ms) + sizeof(uint32_t) ||
        o->version == 0 || o->version > EPMOE_OPTIONS_VERSION)
        return cl_fail(err, EPMOE_EINVAL, 0,
                       "options: set size = sizeof(epmoe_options) and version = %d",
                       EPMOE_OPTIONS_VERSION);
    if (o->coordinator == NULL || o->coordinator[0] == '\0' ||
        strlen(o->coordinator) >= sizeof c->coordinator)
        return cl_fail(err, EPMOE_EINVAL, 0, "options.coordinator: the admin endpoint is required");
    snprintf(c->coordinator, sizeof c->coordinator, "%s", o->coordinator);
    if (o->entry != NULL)
        snprintf(c->entry_pref, sizeof c->entry_pref, "%s", o->entry);
    c->max_in_flight = o->max_in_flight ? o->max_in_flight : CL_DEFAULT_IN_FLIGHT;
    if (c->max_in_flight > CL_MAX_IN_FLIGHT)
        return cl_fail(err, EPMOE_EINVAL, 0, "options.max_in_flight: %u is more than %d",
                       c->max_in_flight, CL_MAX_IN_FLIGHT);
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : CL_DEFAULT_TIMEOUT_MS;
    c->connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : CL_DEFAULT_CONNECT_MS;
    bool has_resend = o->size >= offsetof(epmoe_options, resend_ms) + sizeof(uint32_t);
    c->resend_ms = has_resend ? o->resend_ms : 0; /* 0: per request, timeout / 2 */
    if (o->client_secret_key == NULL)
        return 0;
    c->secure = true;
    if (cl_z85_key(o->client_secret_key, c->kp.sec, "client_secret_key", err) != 0)
        return err ? err->code : EPMOE_EINVAL;
    if (o->client_public_key != NULL) {
        if (cl_z85_key(o->client_public_key, c->kp.pub, "client_public_key", err) != 0)
            return err ? err->code : EPMOE_EINVAL;
    } else {
        char pub[AUTH_Z85_LEN + 1];
        if (zmq_curve_public(pub, o->client_secret_key) != 0 ||
            zmq_z85_decode(c->kp.pub, pub) == NULL)
            return cl_fail(err, EPMOE_EINVAL, 0,
                           "options.client_secret_key: no public key derives");
    }
    if (o->server_key == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0,
                       "options.server_key: the coordinator's public key is required with a "
                       "client key");
    return cl_z85_key(o->server_key, c->server_key, "server_key", err);
}

static int cl_alloc(epmoe_client *c, epmoe_error *err)
{
    c->slots = calloc(c->max_in_flight, sizeof *c->slots);
    c->free_list = calloc(c->max_in_flight, sizeof *c->free_list);
    if (c->slots == NULL || c->free_list == NULL)
        return cl_fail(err, EPMOE_ENOMEM, 0, "out of memory for %u request slots",
                       c->max_in_flight);
    for (uint32_t i = 0; i < c->max_in_flight; i++) {
        c->slots[i].c = c;
        atomic_init(&c->slots[i].zc_refs, 0);
        atomic_init(&c->slots[i].releasing, 0);
        c->free_list[c->n_free++] = &c->slots[c->max_in_flight - 1 - i];
    }
    c->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->done_fd < 0 || c->wake_fd < 0)
        return cl_fail(err, EPMOE_ENOMEM, 0, "eventfd: %s", strerror(errno));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&c->mu, NULL);
    if (getrandom(&c->id, sizeof c->id, 0) != (ssize_t)sizeof c->id)
        return cl_fail(err, EPMOE_ENOMEM, 0, "getrandom: %s", strerror(errno));
    /* clients start their rotation at different members, so that many short-lived clients
     * (one epmoectl forward each) spread over the entries rather than all taking the first */
    c->rotor = (uint32_t)(c->id >> 32);
    c->next_seq = 1;
    return 0;
}

static void cl_free_client(epmoe_client *c)
{
    cl_info_free(&c->info);
    free(c->slots);
    free(c->free_list);
    if (c->done_fd > 0)
        close(c->done_fd);
    if (c->wake_fd > 0)
        close(c->wake_fd);
    explicit_bzero(&c->kp, sizeof c->kp);
    free(c);
}

int epmoe_open(const epmoe_options *opts, epmoe_client **out, epmoe_error *err)
{
    cl_ok(err);
    if (out == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_open: out is NULL");
    *out = NULL;
    epmoe_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return cl_fail(err, EPMOE_ENOMEM, 0, "out of memory");
    c->done_fd = c->wake_fd = -1;
    int rc = cl_options(c, opts, err);
    if (rc == 0)
        rc = cl_alloc(c, err);
    if (rc == 0)
        rc = cl_io_open(c, err);
    if (rc == 0)
        rc = cl_check_entry(c, err);
    if (rc != 0) {
        cl_io_close(c);
        cl_free_client(c);
        return rc;
    }
    *out = c;
    return EPMOE_OK;
}

void epmoe_close(epmoe_client **client_p)
{
    if (client_p == NULL || *client_p == NULL)
        return;
    epmoe_client *c = *client_p;
    *client_p = NULL;
    cl_io_close(c); /* every request in flight is canceled, the sockets are gone */
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    cl_free_client(c);
}

/* ---- info ---- */

int epmoe_info_get(epmoe_client *c, epmoe_info *info, epmoe_error *err)
{
    cl_ok(err);
    if (c == NULL || info == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_info_get: NULL argument");
    pthread_mutex_lock(&c->mu);
    *info = c->info.shape;
    info->n_members = c->info.n_members;
    int rc = c->stale ? cl_fail(err, EPMOE_ESTALE, 0, "%s", c->stale_why) : EPMOE_OK;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int epmoe_info_members(epmoe_client *c, epmoe_member *out, uint32_t cap, uint32_t *n,
                       epmoe_error *err)
{
    cl_ok(err);
    if (c == NULL || n == NULL || (out == NULL && cap > 0))
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_info_members: NULL argument");
    pthread_mutex_lock(&c->mu);
    *n = c->info.n_members;
    for (uint32_t i = 0; i < c->info.n_members && i < cap; i++) {
        const cl_member *s = &c->info.members[i];
        epmoe_member *d = &out[i];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", s->name);
        d->rank = s->rank;
        snprintf(d->client_endpoint, sizeof d->client_endpoint, "%s", s->endpoint);
        d->ready = s->ready;
    }
    pthread_mutex_unlock(&c->mu);
    return EPMOE_OK;
}

int epmoe_layer_index(const epmoe_info *info, const char *name, uint32_t *layer, epmoe_error *err)
{
    cl_ok(err);
    if (info == NULL || name == NULL || layer == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_layer_index: NULL argument");
    const char *p = name;
    uint32_t base = 0, limit = info->n_main_layers;
    if (strncmp(p, "layers.", 7) == 0) {
        p += 7;
    } else if (strncmp(p, "mtp.", 4) == 0) {
        p += 4;
        base = info->n_main_layers;
        limit = info->n_layers - info->n_main_layers;
    } else {
        limit = info->n_layers;
    }
    char *end;
    errno = 0;
    unsigned long v = strtoul(p, &end, 10);
    if (p[0] < '0' || p[0] > '9' || *end != '\0' || errno != 0 || v >= limit)
        return cl_fail(err, EPMOE_EINVAL, 0,
                       "layer \"%.64s\": expected N, layers.N (N < %u) or mtp.I (I < %u)", name,
                       info->n_main_layers, info->n_layers - info->n_main_layers);
    *layer = base + (uint32_t)v;
    return EPMOE_OK;
}

/* ---- submit ---- */

/* The size of version 1 of epmoe_submit_args (later versions only append). */
#define CL_SUBMIT_ARGS_V1 (offsetof(epmoe_submit_args, config_hash) + sizeof(uint64_t))

/* The shape the caller sized its buffers for against the model of open. */
static int cl_check_shape(const epmoe_client *c, const epmoe_submit_args *a, epmoe_error *err)
{
    const epmoe_info *s = &c->info.shape;
    if (a->size < CL_SUBMIT_ARGS_V1 || a->version == 0 || a->version > EPMOE_SUBMIT_ARGS_VERSION)
        return cl_fail(err, EPMOE_EINVAL, 0,
                       "submit args: start from EPMOE_SUBMIT_ARGS_INIT (size %zu, version %u; "
                       "this library knows versions 1..%d)",
                       a->size, a->version, EPMOE_SUBMIT_ARGS_VERSION);
    if (c->stale)
        return cl_fail(err, EPMOE_ESTALE, 0, "layer %u: %s", a->layer, c->stale_why);
    if (a->config_hash != 0 && a->config_hash != s->config_hash)
        return cl_fail(err, EPMOE_ESTALE, 0,
                       "layer %u: config_hash %016" PRIx64 " is not the model's (%016" PRIx64
                       "): the buffers are for another model",
                       a->layer, a->config_hash, s->config_hash);
    if (a->hidden_size != s->hidden_size)
        return cl_fail(err, EPMOE_EINVAL, 0,
                       "layer %u: hidden_size %u: the model's H is %u (size hidden and out "
                       "[n_tokens, %u] and set hidden_size to it)",
                       a->layer, a->hidden_size, s->hidden_size, s->hidden_size);
    return 0;
}

static int cl_check_args(const epmoe_client *c, const epmoe_submit_args *a, epmoe_error *err)
{
    const epmoe_info *s = &c->info.shape;
    int rc = cl_check_shape(c, a, err);
    if (rc != 0)
        return rc;
    if (a->layer >= s->n_layers)
        return cl_fail(err, EPMOE_EINVAL, 0, "layer %u: the model has %u MoE layers (0..%u)",
                       a->layer, s->n_layers, s->n_layers ? s->n_layers - 1 : 0);
    if (a->n_tokens == 0 || a->n_tokens > s->max_tokens)
        return cl_fail(err, EPMOE_EINVAL, 0, "layer %u: %u tokens (expected 1..%u)", a->layer,
                       a->n_tokens, s->max_tokens);
    if (a->hidden == NULL || a->out == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "layer %u: %s is NULL", a->layer,
                       a->hidden == NULL ? "hidden" : "out");
    if (a->layer < s->n_hash_layers && a->token_ids == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0,
                       "layer %u is a hash layer (layers below %u route by token id): "
                       "token_ids is required",
                       a->layer, s->n_hash_layers);
    if (a->token_ids != NULL)
        for (uint32_t i = 0; i < a->n_tokens; i++)
            if (a->token_ids[i] < 0 || (uint64_t)a->token_ids[i] >= s->vocab_size)
                return cl_fail(err, EPMOE_EINVAL, 0,
                               "layer %u: token %u has id %" PRId64 " (expected 0..%u)", a->layer,
                               i, a->token_ids[i], s->vocab_size - 1);
    return 0;
}

static void cl_fill_request(epmoe_client *c, struct epmoe_request *r, const epmoe_submit_args *a)
{
    r->layer = a->layer;
    r->n_tokens = a->n_tokens;
    r->hidden = a->hidden;
    r->token_ids = a->layer < c->info.shape.n_hash_layers || a->token_ids ? a->token_ids : NULL;
    r->out = a->out;
    r->topk_ids = a->topk_ids;
    r->topk_weights = a->topk_weights;
    r->user = a->user;
    r->seq = c->next_seq++;
    r->timeout_ms = a->timeout_ms ? a->timeout_ms : c->timeout_ms;
    r->submit_ns = clk_mono_ns();
    r->deadline_ns = r->submit_ns + (int64_t)r->timeout_ms * 1000000;
    r->resend_ns = 0;
    r->entry = r->held_at = r->avoid = -1;
    r->waited = r->refused = false;
    r->n_tried = r->n_sends = r->n_not_ready = 0;
    memset(r->sent_mask, 0, sizeof r->sent_mask);
    r->wait_release = false;
    atomic_store(&r->releasing, 0); /* zc_refs is 0: a slot is free only once released */
    r->status = EPMOE_EAGAIN;
    r->remote_code = 0;
    r->message[0] = '\0';
    r->epoch = 0;
    r->entry_rank = 0;
    r->entry_name[0] = '\0';
    r->replayed = r->resent = false;
    r->queued_s = r->dispatch_s = r->experts_s = r->combine_s = 0;
}

int epmoe_submit(epmoe_client *c, const epmoe_submit_args *a, epmoe_request **req, epmoe_error *err)
{
    cl_ok(err);
    if (c == NULL || a == NULL || req == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_submit: NULL argument");
    *req = NULL;
    pthread_mutex_lock(&c->mu);
    int rc = cl_check_args(c, a, err);
    if (rc == 0 && c->n_free == 0)
        rc = cl_fail(err, EPMOE_EAGAIN, 0,
                     "%u requests hold every slot (max_in_flight): wait for one, free it, retry",
                     c->max_in_flight);
    if (rc == 0 && c->info.blocked) /* no placement serves: at once */
        rc = cl_fail(err, EPMOE_ENOTREADY, EPMOE__ERROR_CODE__ERR_NOT_READY,
                     "cluster %s is blocked: %s", c->info.cluster,
                     c->info.problem[0] ? c->info.problem : "no placement over the workers left");
    /* no member can take it yet (forming, loading, workers registering again after a
     * coordinator restart): it waits in the queue for one until its deadline (cl_expire) */
    if (rc != 0) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    struct epmoe_request *r = c->free_list[--c->n_free];
    cl_fill_request(c, r, a);
    r->state = CL_QUEUED;
    bool was_empty = c->queue_head == NULL;
    cl_list_push(&c->queue_head, &c->queue_tail, r);
    pthread_mutex_unlock(&c->mu);
    if (was_empty)
        cl_io_wake(c);
    *req = r;
    return EPMOE_OK;
}

/* ---- completion ---- */

static bool cl_finished(const struct epmoe_request *r)
{
    return r->state == CL_DONE || r->state == CL_TAKEN || r->state == CL_CANCELED;
}

static void cl_copy_error(const struct epmoe_request *r, epmoe_error *err)
{
    if (err == NULL)
        return;
    err->code = r->status;
    err->remote_code = r->remote_code;
    snprintf(err->message, sizeof err->message, "%s", r->message);
}

int epmoe_wait(epmoe_request *req, int timeout_ms, epmoe_error *err)
{
    cl_ok(err);
    if (req == NULL)
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_wait: NULL request");
    epmoe_client *c = req->c;
    struct timespec until = clk_mono_in_ms(timeout_ms >= 0 ? timeout_ms : 0);
    pthread_mutex_lock(&c->mu);
    if (req->state == CL_FREE) {
        pthread_mutex_unlock(&c->mu);
        return cl_fail(err, EPMOE_EINVAL, 0, "epmoe_wait: the request was freed");
    }
    int rc = 0;
    while (!cl_finished(req) && rc != ETIMEDOUT) {
        if (timeout_ms >= 0)
            rc = pthread_cond_timedwait(&c->cond, &c->mu, &until);
        else
            pthread_cond_wait(&c->cond, &c->mu);
    }
    if (!cl_finished(req)) {
        pthread_mutex_unlock(&c->mu);
        return cl_fail(err, EPMOE_EWAITTIMEOUT, 0, "layer %u: still in flight after %d ms",
                       req->layer, timeout_ms);
    }
    if (req->state == CL_DONE)
        cl_done_take(c, req);
    int status = req->status;
    cl_copy_error(req, err);
    pthread_mutex_unlock(&c->mu);
    return status;
}

int epmoe_poll(epmoe_client *c, epmoe_request **done, void **user, int max)
{
    if (c == NULL || done == NULL || max <= 0)
        return 0;
    int n = 0;
    pthread_mutex_lock(&c->mu);
    while (n < max && c->done_head != NULL) {
        struct epmoe_request *r = c->done_head;
        cl_done_take(c, r);
        if (user != NULL)
            user[n] = r->user;
        done[n++] = r;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

int epmoe_fd(epmoe_client *c)
{
    return c ? c->done_fd : -1;
}

void epmoe_cancel(epmoe_request *req)
{
    if (req == NULL)
        return;
    epmoe_client *c = req->c;
    pthread_mutex_lock(&c->mu);
    bool queued = req->state == CL_QUEUED;
    if (queued) /* a request queued again after a send may still have its input in a socket */
        cl_list_remove(&c->queue_head, &c->queue_tail, req);
    if (queued && atomic_load(&req->zc_refs) == 0) {
        /* nothing held */
    } else if (queued || req->state == CL_FLIGHT || req->state == CL_RELEASING) {
        cl_flow_release(c, req);
        /* its input may still sit in a socket: wait until libzmq lets go of it */
        req->wait_release = true;
        req->finished_ns = clk_mono_ns(); /* CL_RELEASE_MS from here, then sockets are reset */
        atomic_store(&req->releasing, 1);
        cl_io_wake(c);
        while (atomic_load(&req->zc_refs) > 0 && !c->stopping)
            pthread_cond_wait(&c->cond, &c->mu);
        req->wait_release = false;
    } else {
        pthread_mutex_unlock(&c->mu);
        return; /* already finished (or free) */
    }
    req->state = CL_CANCELED;
    req->status = EPMOE_ECANCELED;
    req->remote_code = 0;
    snprintf(req->message, sizeof req->message, "layer %u: canceled", req->layer);
    req->finished_ns = clk_mono_ns();
    pthread_mutex_unlock(&c->mu);
}

void epmoe_request_free(epmoe_request **req_p)
{
    if (req_p == NULL || *req_p == NULL)
        return;
    epmoe_request *r = *req_p;
    *req_p = NULL;
    epmoe_cancel(r); /* nothing when finished */
    epmoe_client *c = r->c;
    pthread_mutex_lock(&c->mu);
    if (r->state == CL_DONE)
        cl_done_take(c, r);
    cl_slot_free(c, r);
    pthread_mutex_unlock(&c->mu);
}

void cl_slot_free(epmoe_client *c, struct epmoe_request *r)
{
    if (r->state != CL_FREE) {
        r->state = CL_FREE;
        c->free_list[c->n_free++] = r;
    }
}

void epmoe_request_free_nowait(epmoe_request **req_p)
{
    if (req_p == NULL || *req_p == NULL)
        return;
    epmoe_request *r = *req_p;
    *req_p = NULL;
    epmoe_client *c = r->c;
    pthread_mutex_lock(&c->mu);
    if (r->state == CL_QUEUED)
        cl_list_remove(&c->queue_head, &c->queue_tail, r); /* never sent: nothing held */
    else if (r->state == CL_DONE)
        cl_done_take(c, r);
    if (r->state == CL_FLIGHT || r->state == CL_RELEASING) {
        /* the I/O thread returns the slot once libzmq let go of the input (a late answer
         * finds no request in flight and is dropped) */
        r->state = CL_ORPHAN;
        r->finished_ns = clk_mono_ns();
        atomic_store(&r->releasing, 1);
        cl_io_wake(c);
    } else if (r->state != CL_ORPHAN) {
        cl_slot_free(c, r);
    }
    pthread_mutex_unlock(&c->mu);
}

int epmoe_request_status(const epmoe_request *req, epmoe_request_info *info)
{
    if (req == NULL || info == NULL)
        return EPMOE_EINVAL;
    epmoe_client *c = req->c;
    pthread_mutex_lock(&c->mu);
    memset(info, 0, sizeof *info);
    bool fin = cl_finished(req);
    info->status = fin ? req->status : EPMOE_EINPROGRESS;
    info->remote_code = fin ? req->remote_code : 0;
    info->message = fin ? req->message : "";
    info->epoch = req->epoch;
    info->entry_rank = req->entry_rank;
    snprintf(info->entry, sizeof info->entry, "%s", req->entry_name);
    info->replayed = req->replayed;
    info->resent = req->resent;
    info->queued_s = req->queued_s;
    info->dispatch_s = req->dispatch_s;
    info->experts_s = req->experts_s;
    info->combine_s = req->combine_s;
    info->total_s = fin ? (double)(req->finished_ns - req->submit_ns) / 1e9 : 0;
    pthread_mutex_unlock(&c->mu);
    return EPMOE_OK;
}

void *epmoe_request_user(const epmoe_request *req)
{
    return req ? req->user : NULL;
}
