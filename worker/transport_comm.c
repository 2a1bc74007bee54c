/*
 * transport_comm.c — the collective plane's communicator: its state machine, its deadlines and
 * its aborts, over a library vtable (see transport_comm.h).
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
#include "worker/transport_comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/limits.h"
#include "common/log.h"

/* Polls without sleeping before a wait starts to sleep, and the sleeps after that. */
#define TPC_SPIN_POLLS     200
#define TPC_SHORT_SLEEP_NS 20000L /* 20 us while the first TPC_SHORT_POLLS polls */
#define TPC_SHORT_POLLS    2000
#define TPC_LONG_SLEEP_NS  500000L /* 0.5 ms: an init takes seconds */

struct tpc_comm {
    const tpc_ops *ops;
    void *ctx;
    tpc_handle *h;      /* the communicator begun or ready */
    tpc_handle *parent; /* a shrink's parent, released once the child is ready */
    tpc_state state;
    uint64_t epoch;
    uint32_t gen;
    int rank, size;
    double begun; /* when the communicator was begun (for "not ready after N ms") */
    char last_error[EP_ERR_MSG_MAX];
    tpc_fault fault;
};

static void tpc_pause(int polls)
{
    if (polls < TPC_SPIN_POLLS)
        return;
    struct timespec ts = {0, polls < TPC_SHORT_POLLS ? TPC_SHORT_SLEEP_NS : TPC_LONG_SLEEP_NS};
    nanosleep(&ts, NULL);
}

const char *tpc_state_name(tpc_state s)
{
    static const char *const names[] = {"none", "init", "ready", "aborted"};
    return (unsigned)s < 4 ? names[s] : "?";
}

tpc_comm *tpc_create(const tpc_ops *ops, void *ctx, ep_err *err)
{
    if (ops == NULL) {
        const char *why = tpc_nccl_why();
        ep_err_set(err, "%s",
                   why ? why : "no collective library: data_plane nccl is not available");
        return NULL;
    }
    tpc_comm *c = calloc(1, sizeof *c);
    if (c == NULL) {
        ep_err_set(err, "communicator: out of memory");
        return NULL;
    }
    c->ops = ops;
    c->ctx = ctx;
    return c;
}

/* Drop the library communicators held (teardown or abort: the same call, ncclCommAbort). */
static void tpc_release(tpc_comm *c)
{
    if (c->h)
        c->ops->abort(c->h);
    if (c->parent)
        c->ops->abort(c->parent);
    c->h = NULL;
    c->parent = NULL;
}

void tpc_destroy(tpc_comm **self_p)
{
    tpc_comm *c = *self_p;
    if (c == NULL)
        return;
    tpc_release(c);
    free(c);
    *self_p = NULL;
}

/* "nccl communicator of epoch 3.1, rank 1 of 2" */
static void tpc_name(const tpc_comm *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s communicator of epoch %llu.%u, rank %d of %d", c->ops->name,
             (unsigned long long)c->epoch, c->gen, c->rank, c->size);
}

void tpc_abort(tpc_comm *c, const char *why)
{
    char name[160];
    tpc_name(c, name, sizeof name);
    if (c->state == TPC_INIT || c->state == TPC_READY) {
        snprintf(c->last_error, sizeof c->last_error, "%s", why);
        if (c->fault == TPC_FAULT_NONE)
            c->fault = TPC_FAULT_ABANDONED; /* the owner's own abort */
        log_warn("%s: %s; aborted", name, why);
    }
    tpc_release(c);
    c->state = TPC_ABORTED;
}

static int tpc_fail(tpc_comm *c, tpc_fault fault, ep_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Abort and return -1 with "<name>: <why>; aborted" in err. */
static int tpc_fail(tpc_comm *c, tpc_fault fault, ep_err *err, const char *fmt, ...)
{
    char why[EP_ERR_MSG_MAX], name[160];
    EP_FORMAT_ARGS(why, sizeof why, fmt);
    tpc_name(c, name, sizeof name);
    c->fault = fault;
    tpc_abort(c, why);
    return ep_err_set(err, "%s: %s; aborted", name, why);
}

int tpc_new_id(tpc_comm *c, tpc_id *id, ep_err *err)
{
    if (c->ops->unique_id(c->ctx, id, err) != 0)
        return ep_err_prefix(err, "%s: creating a communicator id", c->ops->name);
    return 0;
}

static int tpc_check_shape(const tpc_comm *c, int rank, int size, ep_err *err)
{
    if (size < 1 || size > EP_MAX_WORKERS || rank < 0 || rank >= size)
        return ep_err_set(err, "%s communicator: rank %d of %d out of range", c->ops->name, rank,
                          size);
    return 0;
}

static void tpc_begun(tpc_comm *c, uint64_t epoch, uint32_t gen, int rank, int size)
{
    c->epoch = epoch;
    c->gen = gen;
    c->rank = rank;
    c->size = size;
    c->state = TPC_INIT;
    c->begun = clk_mono_s();
    c->fault = TPC_FAULT_NONE;
    c->last_error[0] = '\0';
}

int tpc_begin_init(tpc_comm *c, uint64_t epoch, uint32_t generation, int rank, int size,
                   const tpc_id *id, ep_err *err)
{
    if (tpc_check_shape(c, rank, size, err) != 0)
        return -1;
    tpc_release(c);
    tpc_begun(c, epoch, generation, rank, size);
    ep_err e = {0};
    if (c->ops->init(c->ctx, size, id, rank, &c->h, &e) != 0) {
        c->h = NULL;
        return tpc_fail(c, TPC_FAULT_LIBRARY, err, "init: %s", e.msg);
    }
    return 0;
}

/* The survivors keep their order: rank = old rank less the excluded ranks below it. */
static int tpc_check_shrink(const tpc_comm *c, uint64_t pe, uint32_t pg, const uint32_t *ex, int n,
                            int rank, int size, ep_err *err)
{
    const char *lib = c->ops->name;
    if (c->state != TPC_READY || c->epoch != pe || c->gen != pg)
        return ep_err_set(err,
                          "%s shrink: this worker holds no ready communicator of epoch %llu.%u "
                          "(it holds %s epoch %llu.%u)",
                          lib, (unsigned long long)pe, pg, tpc_state_name(c->state),
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

int tpc_begin_shrink(tpc_comm *c, uint64_t epoch, uint32_t generation, uint64_t parent_epoch,
                     uint32_t parent_generation, const uint32_t *exclude, int n_exclude, int rank,
                     int size, ep_err *err)
{
    if (n_exclude < 1 || tpc_check_shrink(c, parent_epoch, parent_generation, exclude, n_exclude,
                                          rank, size, err) != 0) {
        if (n_exclude < 1)
            ep_err_set(err, "%s shrink: no rank to exclude", c->ops->name);
        return -1;
    }
    int ex[EP_MAX_WORKERS];
    for (int i = 0; i < n_exclude; i++)
        ex[i] = (int)exclude[i];
    tpc_handle *parent = c->h;
    c->h = NULL;
    c->parent = parent;
    tpc_begun(c, epoch, generation, rank, size);
    ep_err e = {0};
    if (c->ops->shrink(c->ctx, parent, ex, n_exclude, &c->h, &e) != 0) {
        c->h = NULL;
        return tpc_fail(c, TPC_FAULT_LIBRARY, err, "shrink: %s", e.msg);
    }
    return 0;
}

/* 0 done, 1 pending, -1 broken (e set). */
static int tpc_progress(tpc_comm *c, void *stream, ep_err *e)
{
    int rc = c->ops->status(c->h, e);
    if (rc != 0 || stream == NULL)
        return rc;
    return c->ops->stream_query(c->ctx, stream, e);
}

/* Poll until done, the deadline, a library error or the owner's interruption. */
static int tpc_wait(tpc_comm *c, const char *what, void *stream, int64_t deadline, tpc_idle_fn idle,
                    void *idle_ctx, ep_err *err)
{
    int64_t t0 = clk_mono_ms();
    for (int polls = 0;; polls++) {
        ep_err e = {0};
        int rc = tpc_progress(c, stream, &e);
        if (rc == 0)
            return 0;
        if (rc < 0)
            return tpc_fail(c, TPC_FAULT_LIBRARY, err, "%s: %s", what, e.msg);
        int64_t now = clk_mono_ms();
        if (now >= deadline)
            return tpc_fail(c, TPC_FAULT_DEADLINE, err, "%s not done after %lld ms", what,
                            (long long)(now - t0));
        if (idle != NULL && idle(idle_ctx, &e) != 0)
            return tpc_fail(c, TPC_FAULT_ABANDONED, err, "%s abandoned: %s", what, e.msg);
        tpc_pause(polls);
    }
}

int tpc_wait_ready(tpc_comm *c, int64_t deadline, tpc_idle_fn idle, void *idle_ctx, ep_err *err)
{
    if (c->state != TPC_INIT)
        return ep_err_set(err, "%s communicator: nothing to wait for (state %s)", c->ops->name,
                          tpc_state_name(c->state));
    if (tpc_wait(c, "not ready: init", NULL, deadline, idle, idle_ctx, err) != 0)
        return -1;
    if (c->parent) {
        c->ops->abort(c->parent); /* the shrink's parent is no longer needed */
        c->parent = NULL;
    }
    c->state = TPC_READY;
    log_info("%s communicator of epoch %llu.%u ready: rank %d of %d (%.0f ms)", c->ops->name,
             (unsigned long long)c->epoch, c->gen, c->rank, c->size,
             (clk_mono_s() - c->begun) * 1e3);
    return 0;
}

int tpc_exchange(tpc_comm *c, const char *what, const tpc_xfer *sends, int n_sends,
                 const tpc_xfer *recvs, int n_recvs, void *stream, int64_t deadline,
                 tpc_idle_fn idle, void *idle_ctx, ep_err *err)
{
    if (c->state != TPC_READY) {
        char name[160];
        tpc_name(c, name, sizeof name);
        return ep_err_set(err, "%s: %s impossible: the communicator is %s%s%s", name, what,
                          tpc_state_name(c->state), c->last_error[0] ? " after: " : "",
                          c->last_error);
    }
    ep_err e = {0};
    if (c->ops->exchange(c->h, sends, n_sends, recvs, n_recvs, stream, &e) != 0)
        return tpc_fail(c, TPC_FAULT_LIBRARY, err, "%s: %s", what, e.msg);
    return tpc_wait(c, what, stream, deadline, idle, idle_ctx, err);
}

tpc_state tpc_get_state(const tpc_comm *c)
{
    return c->state;
}

uint64_t tpc_epoch(const tpc_comm *c)
{
    return c->epoch;
}

uint32_t tpc_generation(const tpc_comm *c)
{
    return c->gen;
}

int tpc_rank(const tpc_comm *c)
{
    return c->rank;
}

int tpc_size(const tpc_comm *c)
{
    return c->size;
}

const char *tpc_last_error(const tpc_comm *c)
{
    return c->last_error;
}

tpc_fault tpc_last_fault(const tpc_comm *c)
{
    return c->fault;
}
