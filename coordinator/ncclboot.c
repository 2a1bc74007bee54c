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
    int n; /* worker ranks of the spec */
    nb_phase phase;
    uint64_t epoch;
    uint32_t gen, next_gen;
    int *world; /* [n_world]: the worker rank of each communicator rank (the round's members) */
    int n_world;
    uint8_t *done; /* [n], by worker rank: COMM_DONE{ok} of this round */
    int n_done;
    /* the last communicator that became ready and was not invalidated: what a shrink starts from */
    bool has_parent;
    uint64_t parent_epoch;
    uint32_t parent_gen;
    int *parent_world;
    int n_parent;
    int64_t t0_ms, deadline_ms, retry_at_ms;
    int retry_ms; /* 0: heartbeat_ms */
    char last_error[EP_ERR_MSG_MAX];
};

nb_boot *nb_create(int n_ranks, ep_err *err)
{
    nb_boot *b = calloc(1, sizeof *b);
    if (b == NULL || (b->done = calloc((size_t)n_ranks, 1)) == NULL ||
        (b->world = calloc((size_t)n_ranks, sizeof *b->world)) == NULL ||
        (b->parent_world = calloc((size_t)n_ranks, sizeof *b->parent_world)) == NULL) {
        nb_destroy(&b);
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
    free(b->world);
    free(b->parent_world);
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

/* "rank 1 (a1), rank 3 (a3)": the members of this round without COMM_DONE{ok}. */
static void nb_missing_text(const nb_boot *b, const spec_cluster *spec, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < b->n_world && len + 64 < cap; i++) {
        int r = b->world[i];
        if (!b->done[r])
            len += (size_t)snprintf(buf + len, cap - len, "%srank %d (%s)", len ? ", " : "", r,
                                    nb_worker(spec, r));
    }
}

/* The communicator rank of worker rank r in this round, or -1. */
static int nb_comm_rank(const nb_boot *b, int r)
{
    for (int i = 0; i < b->n_world; i++)
        if (b->world[i] == r)
            return i;
    return -1;
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
                 "NCCL communicator of epoch %" PRIu64 ".%u: waiting for COMM_ID from rank %d (%s)",
                 b->epoch, b->gen, b->world[0], nb_worker(spec, b->world[0]));
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

/* COMM_INIT to communicator rank i: new (id NULL only for rank 0) or shrink (ex set). */
static void nb_comm_init(nb_boot *b, const nb_env *env, int i, const uint8_t *id,
                         const uint32_t *ex, int n_ex, ob_box *out)
{
    uint32_t members[EP_MAX_WORKERS];
    for (int k = 0; k < b->n_world; k++)
        members[k] = (uint32_t)b->world[k];
    Epmoe__CommInit m = EPMOE__COMM_INIT__INIT;
    m.has_epoch = m.has_generation = m.has_timeout_ms = m.has_rank = m.has_size = 1;
    m.epoch = b->epoch;
    m.generation = b->gen;
    m.timeout_ms = (uint32_t)env->spec->step_timeout_ms;
    m.rank = (uint32_t)i;
    m.size = (uint32_t)b->n_world;
    m.n_members = (size_t)b->n_world;
    m.members = members;
    if (id != NULL) {
        m.has_nccl_id = 1;
        m.nccl_id.len = NB_ID_BYTES;
        m.nccl_id.data = (uint8_t *)id;
    }
    if (ex != NULL) {
        m.has_shrink = m.has_parent_epoch = m.has_parent_generation = 1;
        m.shrink = 1;
        m.parent_epoch = b->parent_epoch;
        m.parent_generation = b->parent_gen;
        m.n_exclude_ranks = (size_t)n_ex;
        m.exclude_ranks = (uint32_t *)ex;
    }
    ob_to_rank(out, b->world[i], EPMOE__MSG_TYPE__MSG_COMM_INIT, &m.base, NULL, 0);
}

/* The parent less some of its ranks, in the same order? Then exclude[] lists them. */
static int nb_shrinkable(const nb_boot *b, uint32_t *exclude, int *n_exclude)
{
    int old_rank[EP_MAX_WORKERS];
    *n_exclude = 0;
    if (!b->has_parent || b->parent_epoch == b->epoch)
        return 0; /* a rebuild within an epoch: the members did not change */
    for (int i = 0; i < b->n_world; i++) {
        old_rank[i] = -1;
        for (int k = 0; k < b->n_parent; k++)
            if (b->parent_world[k] == b->world[i])
                old_rank[i] = k;
    }
    return nb_shrink_plan(b->n_parent, old_rank, b->n_world, exclude, n_exclude);
}

static void nb_start(nb_boot *b, const nb_env *env, ob_box *out)
{
    b->n_world = 0;
    for (int r = 0; r < b->n && r < env->spec->n_workers; r++)
        if (env->member == NULL || env->member[r])
            b->world[b->n_world++] = r;
    if (b->n_world == 0)
        return;
    b->gen = b->next_gen++;
    memset(b->done, 0, (size_t)b->n);
    b->n_done = 0;
    b->t0_ms = env->now_ms;
    b->deadline_ms =
        env->now_ms + env->spec->step_timeout_ms + 2 * (int64_t)env->spec->heartbeat_ms;
    uint32_t ex[EP_MAX_WORKERS];
    int n_ex = 0;
    if (nb_shrinkable(b, ex, &n_ex)) {
        log_info("NCCL communicator of epoch %" PRIu64 ".%u: shrinking that of epoch %" PRIu64
                 ".%u from %d to %d ranks",
                 b->epoch, b->gen, b->parent_epoch, b->parent_gen, b->n_parent, b->n_world);
        b->has_parent = false; /* a shrink that fails is retried as a new communicator */
        b->phase = NB_WAIT_DONE;
        for (int i = 0; i < b->n_world; i++)
            nb_comm_init(b, env, i, NULL, ex, n_ex, out);
        return;
    }
    b->phase = NB_WAIT_ID;
    log_info("NCCL communicator of epoch %" PRIu64 ".%u: %d ranks; asking rank %d (%s) for its id",
             b->epoch, b->gen, b->n_world, b->world[0], nb_worker(env->spec, b->world[0]));
    nb_comm_init(b, env, 0, NULL, NULL, 0, out);
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
            log_info("NCCL communicator of epoch %" PRIu64 ".%u: a member is not ready; a new "
                     "round follows",
                     b->epoch, b->gen);
        if (b->phase != NB_BACKOFF)
            b->phase = NB_IDLE; /* a ready communicator stays the parent a shrink can use */
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
    } else if (rank != b->world[0] || !id->has_nccl_id || id->nccl_id.len != NB_ID_BYTES) {
        ob_error(out, OB_TO_RANK, rank, NULL, 0, EPMOE__ERROR_CODE__ERR_BAD_REQUEST, m->type,
                 "COMM_ID from rank %d with %zu id bytes: only rank %d (communicator rank 0) "
                 "sends one, of %d bytes",
                 rank, id->has_nccl_id ? id->nccl_id.len : 0, b->world[0], NB_ID_BYTES);
    } else {
        for (int i = 1; i < b->n_world; i++)
            nb_comm_init(b, env, i, id->nccl_id.data, NULL, 0, out);
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
    if (!nb_current(b, d->has_epoch, d->epoch, d->has_generation, d->generation) ||
        nb_comm_rank(b, rank) < 0) {
        log_debug(LOG_SUB_NET, "COMM_DONE of another round from rank %d: dropped", rank);
    } else if (!d->has_ok || !d->ok) {
        char text[EP_ERR_MSG_MAX];
        snprintf(text, sizeof text, "NCCL communicator of epoch %" PRIu64 ".%u: rank %d (%s): %s",
                 b->epoch, b->gen, rank, nb_worker(env->spec, rank),
                 d->message ? d->message : "failed (no reason given)");
        nb_fail(b, env, &rank, 1, text, out);
    } else if (!b->done[rank]) {
        b->done[rank] = 1;
        if (++b->n_done == b->n_world) {
            b->phase = NB_READY;
            b->retry_ms = 0;
            b->last_error[0] = '\0';
            b->has_parent = true;
            b->parent_epoch = b->epoch;
            b->parent_gen = b->gen;
            memcpy(b->parent_world, b->world, (size_t)b->n_world * sizeof *b->world);
            b->n_parent = b->n_world;
            log_info("NCCL communicator of epoch %" PRIu64 ".%u ready: %d ranks in %" PRId64 " ms",
                     b->epoch, b->gen, b->n_world, env->now_ms - b->t0_ms);
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
        ranks[n++] = b->world[0]; /* the others never got the id: not their fault */
        snprintf(text, sizeof text,
                 "NCCL communicator of epoch %" PRIu64 ".%u not ready after %" PRId64
                 " ms: rank %d (%s) sent no COMM_ID",
                 b->epoch, b->gen, ms, b->world[0], nb_worker(env->spec, b->world[0]));
    } else {
        for (int i = 0; i < b->n_world; i++)
            if (!b->done[b->world[i]])
                ranks[n++] = b->world[i];
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
    b->has_parent = false; /* the workers aborted theirs: nothing left to shrink */
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
