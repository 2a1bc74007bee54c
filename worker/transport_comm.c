/*
 * transport_comm.c — the collective plane's communicator: its state machine, its deadlines and
 * its aborts, over a library vtable (see transport.h).
 *
 * Why abort on every failed wait: a grouped send/receive that a dead or late peer never
 * matches stays queued on the executor's stream, and so would everything enqueued after it;
 * only aborting the communicator (ncclCommAbort) takes it off the device. The step that failed
 * is reported, and the coordinator rebuilds the communicator (COMM_INIT) before the next one.
 *
 * Polling: waits spin briefly (a GPU exchange of a few MB takes tens of microseconds), then
 * sleep in short steps, calling the owner's idle function between polls so it can read its
 * pipe (STEP_ABORT, RESET) while it waits.
 */
#include "worker/transport.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/limits.h"
#include "common/log.h"

/* Polls without sleeping before a wait starts to sleep, and the sleeps after that. */
#define TP_SPIN_POLLS     200
#define TP_SHORT_SLEEP_NS 20000L /* 20 us while the first TP_SHORT_POLLS polls */
#define TP_SHORT_POLLS    2000
#define TP_LONG_SLEEP_NS  500000L /* 0.5 ms: an init takes seconds */

struct tp_comm {
    const tp_comm_ops *ops;
    void *ctx;
    tp_comm_handle *h;      /* the communicator begun or ready */
    tp_comm_handle *parent; /* a shrink's parent, released once the child is ready */
    tp_comm_state state;
    uint64_t epoch;
    uint32_t gen;
    int rank, size;
    double begun; /* when the communicator was begun (for "not ready after N ms") */
    char last_error[EP_ERR_MSG_MAX];
    tp_comm_fault fault;
};

static void tp_pause(int polls)
{
    if (polls < TP_SPIN_POLLS)
        return;
    struct timespec ts = {0, polls < TP_SHORT_POLLS ? TP_SHORT_SLEEP_NS : TP_LONG_SLEEP_NS};
    nanosleep(&ts, NULL);
}

const char *tp_comm_state_name(tp_comm_state s)
{
    static const char *const names[] = {"none", "init", "ready", "aborted"};
    return (unsigned)s < 4 ? names[s] : "?";
}

tp_comm *tp_comm_create(const tp_comm_ops *ops, void *ctx, ep_err *err)
{
    if (ops == NULL) {
        const char *why = tp_nccl_why();
        ep_err_set(err, "%s",
                   why ? why : "no collective library: data_plane nccl is not available");
        return NULL;
    }
    tp_comm *c = calloc(1, sizeof *c);
    if (c == NULL) {
        ep_err_set(err, "communicator: out of memory");
        return NULL;
    }
    c->ops = ops;
    c->ctx = ctx;
    return c;
}

/* Drop the library communicators held (teardown or abort: the same call, ncclCommAbort). */
static void tp_comm_release(tp_comm *c)
{
    if (c->h)
        c->ops->abort(c->h);
    if (c->parent)
        c->ops->abort(c->parent);
    c->h = NULL;
    c->parent = NULL;
}

void tp_comm_destroy(tp_comm **self_p)
{
    tp_comm *c = *self_p;
    if (c == NULL)
        return;
    tp_comm_release(c);
    free(c);
    *self_p = NULL;
}

/* "nccl communicator of epoch 3.1, rank 1 of 2" */
static void tp_comm_name(const tp_comm *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s communicator of epoch %llu.%u, rank %d of %d", c->ops->name,
             (unsigned long long)c->epoch, c->gen, c->rank, c->size);
}

void tp_comm_abort(tp_comm *c, const char *why)
{
    char name[160];
    tp_comm_name(c, name, sizeof name);
    if (c->state == TP_COMM_INIT || c->state == TP_COMM_READY) {
        snprintf(c->last_error, sizeof c->last_error, "%s", why);
        if (c->fault == TP_FAULT_NONE)
            c->fault = TP_FAULT_ABANDONED; /* the owner's own abort */
        log_warn("%s: %s; aborted", name, why);
    }
    tp_comm_release(c);
    c->state = TP_COMM_ABORTED;
}

static int tp_comm_fail(tp_comm *c, tp_comm_fault fault, ep_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Abort and return -1 with "<name>: <why>; aborted" in err. */
static int tp_comm_fail(tp_comm *c, tp_comm_fault fault, ep_err *err, const char *fmt, ...)
{
    char why[EP_ERR_MSG_MAX], name[160];
    EP_FORMAT_ARGS(why, sizeof why, fmt);
    tp_comm_name(c, name, sizeof name);
    c->fault = fault;
    tp_comm_abort(c, why);
    return ep_err_set(err, "%s: %s; aborted", name, why);
}

int tp_comm_new_id(tp_comm *c, tp_comm_id *id, ep_err *err)
{
    if (c->ops->unique_id(c->ctx, id, err) != 0)
        return ep_err_prefix(err, "%s: creating a communicator id", c->ops->name);
    return 0;
}

static int tp_comm_check_shape(const tp_comm *c, int rank, int size, ep_err *err)
{
    if (size < 1 || size > EP_MAX_WORKERS || rank < 0 || rank >= size)
        return ep_err_set(err, "%s communicator: rank %d of %d out of range", c->ops->name, rank,
                          size);
    return 0;
}

static void tp_comm_begun(tp_comm *c, uint64_t epoch, uint32_t gen, int rank, int size)
{
    c->epoch = epoch;
    c->gen = gen;
    c->rank = rank;
    c->size = size;
    c->state = TP_COMM_INIT;
    c->begun = clk_mono_s();
    c->fault = TP_FAULT_NONE;
    c->last_error[0] = '\0';
}

int tp_comm_begin_init(tp_comm *c, uint64_t epoch, uint32_t generation, int rank, int size,
                       const tp_comm_id *id, ep_err *err)
{
    if (tp_comm_check_shape(c, rank, size, err) != 0)
        return -1;
    tp_comm_release(c);
    tp_comm_begun(c, epoch, generation, rank, size);
    ep_err e = {0};
    if (c->ops->init(c->ctx, size, id, rank, &c->h, &e) != 0) {
        c->h = NULL;
        return tp_comm_fail(c, TP_FAULT_LIBRARY, err, "init: %s", e.msg);
    }
    return 0;
}

/* The survivors keep their order: rank = old rank less the excluded ranks below it. */
static int tp_comm_check_shrink(const tp_comm *c, uint64_t pe, uint32_t pg, const uint32_t *ex,
                                int n, int rank, int size, ep_err *err)
{
    const char *lib = c->ops->name;
    if (c->state != TP_COMM_READY || c->epoch != pe || c->gen != pg)
        return ep_err_set(err,
                          "%s shrink: this worker holds no ready communicator of epoch %llu.%u "
                          "(it holds %s epoch %llu.%u)",
                          lib, (unsigned long long)pe, pg, tp_comm_state_name(c->state),
                          (unsigned long long)c->epoch, c->gen);
    int below = 0;
    for (int i = 0; i < n; i++) {
        if (ex[i] >= (uint32_t)c->size || (i > 0 && ex[i] <= ex[i - 1]))
            return ep_err_set(err,
                              "%s shrink: exclude_ranks[%d] = %u, expected ascending ranks "
                              "below %d",
                              lib, i, ex[i], c->size);
        if (ex[i] == (uint32_t)c->rank)
            return ep_err_set(err, "%s shrink: this worker's rank %d is excluded", lib, c->rank);
        below += ex[i] < (uint32_t)c->rank;
    }
    if (size != c->size - n || rank != c->rank - below)
        return ep_err_set(err,
                          "%s shrink: rank %d of %d does not follow from rank %d of %d less %d "
                          "ranks (expected rank %d of %d)",
                          lib, rank, size, c->rank, c->size, n, c->rank - below, c->size - n);
    return 0;
}

int tp_comm_begin_shrink(tp_comm *c, uint64_t epoch, uint32_t generation, uint64_t parent_epoch,
                         uint32_t parent_generation, const uint32_t *exclude, int n_exclude,
                         int rank, int size, ep_err *err)
{
    if (n_exclude < 1 || tp_comm_check_shrink(c, parent_epoch, parent_generation, exclude,
                                              n_exclude, rank, size, err) != 0) {
        if (n_exclude < 1)
            ep_err_set(err, "%s shrink: no rank to exclude", c->ops->name);
        return -1;
    }
    int ex[EP_MAX_WORKERS];
    for (int i = 0; i < n_exclude; i++)
        ex[i] = (int)exclude[i];
    tp_comm_handle *parent = c->h;
    c->h = NULL;
    c->parent = parent;
    tp_comm_begun(c, epoch, generation, rank, size);
    ep_err e = {0};
    if (c->ops->shrink(c->ctx, parent, ex, n_exclude, &c->h, &e) != 0) {
        c->h = NULL;
        return tp_comm_fail(c, TP_FAULT_LIBRARY, err, "shrink: %s", e.msg);
    }
    return 0;
}

/* 0 done, 1 pending, -1 broken (e set). */
static int tp_comm_progress(tp_comm *c, void *stream, ep_err *e)
{
    int rc = c->ops->status(c->h, e);
    if (rc != 0 || stream == NULL)
        return rc;
    return c->ops->stream_query(c->ctx, stream, e);
}

/* Poll until done, the deadline, a library error or the owner's interruption. */
static int tp_comm_wait(tp_comm *c, const char *what, void *stream, double deadline,
                        tp_idle_fn idle, void *idle_ctx, ep_err *err)
{
    double t0 = clk_mono_s();
    for (int polls = 0;; polls++) {
        ep_err e = {0};
        int rc = tp_comm_progress(c, stream, &e);
        if (rc == 0)
            return 0;
        if (rc < 0)
            return tp_comm_fail(c, TP_FAULT_LIBRARY, err, "%s: %s", what, e.msg);
        double now = clk_mono_s();
        if (now >= deadline)
            return tp_comm_fail(c, TP_FAULT_DEADLINE, err, "%s not done after %.0f ms", what,
                                (now - t0) * 1e3);
        if (idle != NULL && idle(idle_ctx, &e) != 0)
            return tp_comm_fail(c, TP_FAULT_ABANDONED, err, "%s abandoned: %s", what, e.msg);
        tp_pause(polls);
    }
}

int tp_comm_wait_ready(tp_comm *c, double deadline, tp_idle_fn idle, void *idle_ctx, ep_err *err)
{
    if (c->state != TP_COMM_INIT)
        return ep_err_set(err, "%s communicator: nothing to wait for (state %s)", c->ops->name,
                          tp_comm_state_name(c->state));
    if (tp_comm_wait(c, "not ready: init", NULL, deadline, idle, idle_ctx, err) != 0)
        return -1;
    if (c->parent) {
        c->ops->abort(c->parent); /* the shrink's parent is no longer needed */
        c->parent = NULL;
    }
    c->state = TP_COMM_READY;
    log_info("%s communicator of epoch %llu.%u ready: rank %d of %d (%.0f ms)", c->ops->name,
             (unsigned long long)c->epoch, c->gen, c->rank, c->size,
             (clk_mono_s() - c->begun) * 1e3);
    return 0;
}

int tp_comm_exchange(tp_comm *c, const char *what, const tp_xfer *sends, int n_sends,
                     const tp_xfer *recvs, int n_recvs, void *stream, double deadline,
                     tp_idle_fn idle, void *idle_ctx, ep_err *err)
{
    if (c->state != TP_COMM_READY) {
        char name[160];
        tp_comm_name(c, name, sizeof name);
        return ep_err_set(err, "%s: %s impossible: the communicator is %s%s%s", name, what,
                          tp_comm_state_name(c->state), c->last_error[0] ? " after: " : "",
                          c->last_error);
    }
    ep_err e = {0};
    if (c->ops->exchange(c->h, sends, n_sends, recvs, n_recvs, stream, &e) != 0)
        return tp_comm_fail(c, TP_FAULT_LIBRARY, err, "%s: %s", what, e.msg);
    return tp_comm_wait(c, what, stream, deadline, idle, idle_ctx, err);
}

tp_comm_state tp_comm_get_state(const tp_comm *c)
{
    return c->state;
}

uint64_t tp_comm_epoch(const tp_comm *c)
{
    return c->epoch;
}

uint32_t tp_comm_generation(const tp_comm *c)
{
    return c->gen;
}

int tp_comm_rank(const tp_comm *c)
{
    return c->rank;
}

int tp_comm_size(const tp_comm *c)
{
    return c->size;
}

const char *tp_comm_last_error(const tp_comm *c)
{
    return c->last_error;
}

tp_comm_fault tp_comm_last_fault(const tp_comm *c)
{
    return c->fault;
}
