/*
 * ncclboot.c — the coordinator's side of the NCCL communicator (see ncclboot.h).
 */
#include "coordinator/ncclboot.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/log.h"

/* ncclUniqueId (NCCL_UNIQUE_ID_BYTES); the coordinator only relays it. */
#define NB_ID_BYTES 128

typedef enum nb_phase { NB_IDLE = 0, NB_WAIT_ID, NB_WAIT_DONE, NB_READY, NB_BACKOFF } nb_phase;

struct nb_boot {
    int n;
    nb_phase phase;
    uint64_t epoch;
    uint32_t gen, next_gen;
    uint8_t *done; /* [n]: COMM_DONE{ok} of this round */
    int n_done;
    int64_t t0_ms, deadline_ms, retry_at_ms;
    int retry_ms; /* 0: heartbeat_ms */
    char last_error[EP_ERR_MSG_MAX];
};

nb_boot *nb_create(int n_ranks, ep_err *err)
{
    nb_boot *b = calloc(1, sizeof *b);
    if (b == NULL || (b->done = calloc((size_t)n_ranks, 1)) == NULL) {
        free(b);
        ep_err_set(err, "out of memory");
        return NULL;
    }
    b->n = n_ranks;
    return b;
}

void nb_destroy(nb_boot **self_p)
{
    nb_boot *b = *self_p;
    if (b == NULL)
        return;
    free(b->done);
    free(b);
    *self_p = NULL;
}

bool nb_ready(const nb_boot *b)
{
    return b->phase == NB_READY;
}

static const char *nb_worker(const spec_cluster *spec, int rank)
{
    return rank >= 0 && rank < spec->n_workers ? spec->workers[rank].name : "?";
}

/* "rank 1 (a1), rank 3 (a3)": the ranks of this round without COMM_DONE{ok}. */
static void nb_missing_text(const nb_boot *b, const spec_cluster *spec, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < b->n && len + 64 < cap; r++)
        if (!b->done[r])
            len += (size_t)snprintf(buf + len, cap - len, "%srank %d (%s)", len ? ", " : "", r,
                                    nb_worker(spec, r));
}

void nb_not_ready_text(const nb_boot *b, const spec_cluster *spec, char *buf, size_t cap)
{
    char who[400];
    switch (b->phase) {
    case NB_READY:
        buf[0] = '\0';
        break;
    case NB_IDLE:
        snprintf(buf, cap, "NCCL communicator of epoch %" PRIu64 ": not built yet", b->epoch);
        break;
    case NB_WAIT_ID:
        snprintf(buf, cap,
                 "NCCL communicator of epoch %" PRIu64 ".%u: waiting for COMM_ID from rank 0 (%s)",
                 b->epoch, b->gen, nb_worker(spec, 0));
        break;
    case NB_WAIT_DONE:
        nb_missing_text(b, spec, who, sizeof who);
        snprintf(buf, cap,
                 "NCCL communicator of epoch %" PRIu64 ".%u: waiting for COMM_DONE from %s",
                 b->epoch, b->gen, who);
        break;
    case NB_BACKOFF:
        snprintf(buf, cap, "NCCL communicator: %s; retrying", b->last_error);
        break;
    }
}

static void nb_comm_init(nb_boot *b, const nb_env *env, int rank, const uint8_t *id, ob_box *out)
{
    Epmoe__CommInit m = EPMOE__COMM_INIT__INIT;
    m.has_epoch = m.has_generation = m.has_timeout_ms = 1;
    m.epoch = b->epoch;
    m.generation = b->gen;
    m.timeout_ms = (uint32_t)env->spec->step_timeout_ms;
    if (id != NULL) {
        m.has_nccl_id = 1;
        m.nccl_id.len = NB_ID_BYTES;
        m.nccl_id.data = (uint8_t *)id;
    }
    ob_to_rank(out, rank, EPMOE__MSG_TYPE__MSG_COMM_INIT, &m.base, NULL, 0);
}

static void nb_start(nb_boot *b, const nb_env *env, ob_box *out)
{
    b->gen = b->next_gen++;
    memset(b->done, 0, (size_t)b->n);
    b->n_done = 0;
    b->t0_ms = env->now_ms;
    b->deadline_ms =
        env->now_ms + env->spec->step_timeout_ms + 2 * (int64_t)env->spec->heartbeat_ms;
    b->phase = NB_WAIT_ID;
    log_info("NCCL communicator of epoch %" PRIu64 ".%u: asking rank 0 (%s) for its id", b->epoch,
             b->gen, nb_worker(env->spec, 0));
    nb_comm_init(b, env, 0, NULL, out);
}

/* The round failed: show text on each rank named, retry after the backoff. */
static void nb_fail(nb_boot *b, const nb_env *env, const int *ranks, int n_ranks, const char *text,
                    ob_box *out)
{
    snprintf(b->last_error, sizeof b->last_error, "%s", text);
    log_warn("%s", text);
    for (int i = 0; i < n_ranks; i++)
        ob_event_add(out, OB_EV_ERROR, ranks[i], "%s", text);
    if (b->retry_ms == 0)
        b->retry_ms = env->spec->heartbeat_ms;
    b->retry_at_ms = env->now_ms + b->retry_ms;
    b->retry_ms = b->retry_ms * 2 > NB_MAX_RETRY_MS ? NB_MAX_RETRY_MS : b->retry_ms * 2;
    b->phase = NB_BACKOFF;
}

void nb_pump(nb_boot *b, const nb_env *env, ob_box *out)
{
    if (env->epoch != b->epoch) {
        b->epoch = env->epoch;
        b->next_gen = 0;
        b->phase = NB_IDLE;
    }
    if (!env->all_ready) {
        if (b->phase != NB_IDLE && b->phase != NB_BACKOFF)
            nb_invalidate(b, "a worker is not ready");
        return;
    }
    if (b->phase == NB_BACKOFF && env->now_ms >= b->retry_at_ms)
        b->phase = NB_IDLE;
    if (b->phase == NB_IDLE)
        nb_start(b, env, out);
}

/* A message of this round? (epoch and generation present and current) */
static bool nb_current(const nb_boot *b, bool has_e, uint64_t e, bool has_g, uint32_t g)
{
    return has_e && has_g && e == b->epoch && g == b->gen &&
           (b->phase == NB_WAIT_ID || b->phase == NB_WAIT_DONE);
}

static void nb_on_id(nb_boot *b, const nb_env *env, int rank, const wire_msg *m, ob_box *out)
{
    ep_err err;
    Epmoe__CommId *id = (Epmoe__CommId *)wire_unpack(&epmoe__comm_id__descriptor, m, &err);
    if (id == NULL) {
        ob_error(out, OB_TO_RANK, rank, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type, "%s",
                 err.msg);
        return;
    }
    if (!nb_current(b, id->has_epoch, id->epoch, id->has_generation, id->generation) ||
        b->phase != NB_WAIT_ID) {
        log_debug(LOG_SUB_NET, "COMM_ID of another round from rank %d: dropped", rank);
    } else if (rank != 0 || !id->has_nccl_id || id->nccl_id.len != NB_ID_BYTES) {
        ob_error(out, OB_TO_RANK, rank, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, m->type,
                 "COMM_ID from rank %d with %zu id bytes: only rank 0 sends one, of %d bytes", rank,
                 id->has_nccl_id ? id->nccl_id.len : 0, NB_ID_BYTES);
    } else {
        for (int r = 1; r < b->n; r++)
            nb_comm_init(b, env, r, id->nccl_id.data, out);
        b->phase = NB_WAIT_DONE;
    }
    wire_free_unpacked(&id->base);
}

static void nb_on_done(nb_boot *b, const nb_env *env, int rank, const wire_msg *m, ob_box *out)
{
    ep_err err;
    Epmoe__CommDone *d = (Epmoe__CommDone *)wire_unpack(&epmoe__comm_done__descriptor, m, &err);
    if (d == NULL) {
        ob_error(out, OB_TO_RANK, rank, NULL, 0, EPMOE__ERROR_CODE__ERR_MALFORMED, m->type, "%s",
                 err.msg);
        return;
    }
    if (!nb_current(b, d->has_epoch, d->epoch, d->has_generation, d->generation)) {
        log_debug(LOG_SUB_NET, "COMM_DONE of another round from rank %d: dropped", rank);
    } else if (!d->has_ok || !d->ok) {
        char text[EP_ERR_MSG_MAX];
        snprintf(text, sizeof text, "NCCL communicator of epoch %" PRIu64 ".%u: rank %d (%s): %s",
                 b->epoch, b->gen, rank, nb_worker(env->spec, rank),
                 d->message ? d->message : "failed (no reason given)");
        nb_fail(b, env, &rank, 1, text, out);
    } else if (!b->done[rank]) {
        b->done[rank] = 1;
        if (++b->n_done == b->n) {
            b->phase = NB_READY;
            b->retry_ms = 0;
            b->last_error[0] = '\0';
            log_info("NCCL communicator of epoch %" PRIu64 ".%u ready: %d ranks in %" PRId64 " ms",
                     b->epoch, b->gen, b->n, env->now_ms - b->t0_ms);
        }
    }
    wire_free_unpacked(&d->base);
}

void nb_on_message(nb_boot *b, const nb_env *env, int rank, const wire_msg *m, ob_box *out)
{
    if (m->type == EPMOE__MSG_TYPE__MSG_COMM_ID)
        nb_on_id(b, env, rank, m, out);
    else if (m->type == EPMOE__MSG_TYPE__MSG_COMM_DONE)
        nb_on_done(b, env, rank, m, out);
}

void nb_tick(nb_boot *b, const nb_env *env, ob_box *out)
{
    if ((b->phase != NB_WAIT_ID && b->phase != NB_WAIT_DONE) || env->now_ms < b->deadline_ms)
        return;
    int ranks[EP_MAX_WORKERS], n = 0;
    char who[400], text[EP_ERR_MSG_MAX];
    int64_t ms = env->now_ms - b->t0_ms;
    if (b->phase == NB_WAIT_ID) {
        ranks[n++] = 0; /* the others never got the id: not their fault */
        snprintf(text, sizeof text,
                 "NCCL communicator of epoch %" PRIu64 ".%u not ready after %" PRId64
                 " ms: rank 0 (%s) sent no COMM_ID",
                 b->epoch, b->gen, ms, nb_worker(env->spec, 0));
    } else {
        for (int r = 0; r < b->n; r++)
            if (!b->done[r])
                ranks[n++] = r;
        nb_missing_text(b, env->spec, who, sizeof who);
        snprintf(text, sizeof text,
                 "NCCL communicator of epoch %" PRIu64 ".%u not ready after %" PRId64
                 " ms: %s did not finish",
                 b->epoch, b->gen, ms, who);
    }
    nb_fail(b, env, ranks, n, text, out);
}

int64_t nb_next_deadline(const nb_boot *b)
{
    if (b->phase == NB_WAIT_ID || b->phase == NB_WAIT_DONE)
        return b->deadline_ms;
    if (b->phase == NB_BACKOFF)
        return b->retry_at_ms;
    return INT64_MAX;
}

void nb_invalidate(nb_boot *b, const char *why)
{
    if (b->phase == NB_IDLE || b->phase == NB_BACKOFF)
        return;
    log_info("NCCL communicator of epoch %" PRIu64 ".%u: %s; a new one is built before the next "
             "step",
             b->epoch, b->gen, why);
    b->phase = NB_IDLE;
}

int nb_shrink_plan(int old_size, const int *old_rank, int new_size, uint32_t *exclude,
                   int *n_exclude)
{
    *n_exclude = 0;
    if (new_size < 1 || new_size >= old_size)
        return 0;
    for (int r = 0; r < new_size; r++)
        if (old_rank[r] < 0 || old_rank[r] >= old_size || (r > 0 && old_rank[r] <= old_rank[r - 1]))
            return 0; /* a newcomer, or another order: ncclCommShrink cannot make it */
    for (int o = 0, r = 0; o < old_size; o++) {
        if (r < new_size && old_rank[r] == o)
            r++;
        else
            exclude[(*n_exclude)++] = (uint32_t)o;
    }
    return 1;
}
