/*
 * planner.c — placement tables and the epoch machinery (see planner.h). Tables are small
 * (E <= MC_MAX_EXPERTS) and rebuilt once per epoch, so plain loops over the owner array are all
 * we need.
 */
#include "coordinator/planner.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ---- tables ---- */

static int plan_check(spec_placement p, int n_experts, int n_ranks, ep_err *err)
{
    if (n_ranks < 1 || n_ranks > EP_MAX_WORKERS)
        return ep_err_set(err, "placement: %d ranks (expected 1..%d)", n_ranks, EP_MAX_WORKERS);
    if (n_experts < 1 || n_experts > MC_MAX_EXPERTS)
        return ep_err_set(err, "placement: %d experts (expected 1..%d)", n_experts, MC_MAX_EXPERTS);
    if (n_ranks > n_experts)
        return ep_err_set(err,
                          "placement: %d ranks are more than the %d experts (every rank must "
                          "own at least one expert)",
                          n_ranks, n_experts);
    if (p != SPEC_PLACE_CONTIGUOUS && p != SPEC_PLACE_ROUND_ROBIN)
        return ep_err_set(err,
                          "placement: unknown placement %d (expected contiguous or "
                          "round_robin)",
                          (int)p);
    if (p == SPEC_PLACE_CONTIGUOUS && n_experts % n_ranks != 0)
        return ep_err_set(err,
                          "placement contiguous: %d ranks do not divide %d experts evenly "
                          "(needs n_experts %% ranks == 0)",
                          n_ranks, n_experts);
    return 0;
}

static plan_table *plan_alloc(int n_experts, int n_ranks)
{
    plan_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->owner = calloc((size_t)n_experts, sizeof *t->owner);
    t->member = calloc((size_t)n_ranks, 1);
    if (t->owner == NULL || t->member == NULL) {
        plan_free(&t);
        return NULL;
    }
    t->n_experts = n_experts;
    t->n_ranks = n_ranks;
    return t;
}

/* member[] and n_members from owner[]. */
static void plan_members(plan_table *t)
{
    memset(t->member, 0, (size_t)t->n_ranks);
    for (int e = 0; e < t->n_experts; e++)
        t->member[t->owner[e]] = 1;
    t->n_members = 0;
    for (int r = 0; r < t->n_ranks; r++)
        t->n_members += t->member[r];
}

plan_table *plan_build(spec_placement p, int n_experts, int n_ranks, uint64_t epoch, ep_err *err)
{
    if (plan_check(p, n_experts, n_ranks, err) != 0)
        return NULL;
    plan_table *t = plan_alloc(n_experts, n_ranks);
    if (t == NULL) {
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    int per_rank = n_experts / n_ranks; /* contiguous only: exact */
    for (int e = 0; e < n_experts; e++)
        t->owner[e] = p == SPEC_PLACE_CONTIGUOUS ? e / per_rank : e % n_ranks;
    t->epoch = epoch;
    t->placement = p;
    plan_members(t);
    return t;
}

plan_table *plan_copy(const plan_table *t, uint64_t epoch)
{
    plan_table *c = plan_alloc(t->n_experts, t->n_ranks);
    if (c == NULL)
        return NULL;
    memcpy(c->owner, t->owner, (size_t)t->n_experts * sizeof *t->owner);
    c->epoch = epoch;
    c->placement = t->placement;
    plan_members(c);
    return c;
}

void plan_free(plan_table **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    free((*self_p)->owner);
    free((*self_p)->member);
    free(*self_p);
    *self_p = NULL;
}

int plan_rank_experts(const plan_table *t, int rank, int *out, int cap)
{
    if (t == NULL || rank < 0 || rank >= t->n_ranks)
        return -1;
    int n = 0;
    for (int e = 0; e < t->n_experts; e++) {
        if (t->owner[e] != rank)
            continue;
        if (n < cap)
            out[n] = e;
        n++;
    }
    return n;
}

int plan_owner(const plan_table *t, int expert)
{
    return t != NULL && expert >= 0 && expert < t->n_experts ? t->owner[expert] : -1;
}

bool plan_is_member(const plan_table *t, int rank)
{
    return t != NULL && rank >= 0 && rank < t->n_ranks && t->member[rank];
}

bool plan_same(const plan_table *a, const plan_table *b)
{
    return a->n_experts == b->n_experts && a->n_ranks == b->n_ranks &&
           memcmp(a->owner, b->owner, (size_t)a->n_experts * sizeof *a->owner) == 0;
}

plan_table *plan_spread(const plan_table *from, const uint8_t *eligible, int max_per_rank,
                        uint64_t epoch, ep_err *err)
{
    int E = from->n_experts, P = from->n_ranks, n_eligible = 0;
    plan_table *t = plan_copy(from, epoch);
    int *count = calloc((size_t)P, sizeof *count);
    if (t == NULL || count == NULL) {
        ep_err_set(err, "placement: out of memory");
        goto fail;
    }
    for (int r = 0; r < P; r++)
        n_eligible += eligible[r] != 0;
    for (int e = 0; e < E; e++)
        if (eligible[t->owner[e]])
            count[t->owner[e]]++;
    for (int e = 0; e < E; e++) {
        if (eligible[t->owner[e]])
            continue;
        int best = -1;
        for (int r = 0; r < P; r++)
            if (eligible[r] && (max_per_rank == 0 || count[r] < max_per_rank) &&
                (best < 0 || count[r] < count[best]))
                best = r;
        if (best < 0) {
            if (n_eligible == 0)
                ep_err_set(err, "no worker is left that can own experts (%d experts to place)", E);
            else
                ep_err_set(err,
                           "%d workers can hold at most %d of the %d experts "
                           "(max_experts_per_worker %d)",
                           n_eligible, n_eligible * max_per_rank, E, max_per_rank);
            goto fail;
        }
        t->owner[e] = best;
        count[best]++;
    }
    plan_members(t);
    free(count);
    return t;
fail:
    free(count);
    plan_free(&t);
    return NULL;
}

/* ---- epochs ---- */

struct plan_epochs {
    plan_table *base;    /* the spec's placement */
    plan_table *current; /* acknowledged by every member */
    plan_table *latest;  /* last sent (== current unless applying) */
    plan_table *pending; /* decided, not sent yet (phase pending) */
    plan_phase phase;
    spec_rejoin rejoin;
    int max_per_rank;
    uint8_t *drained; /* [n_ranks] */
    uint64_t last_epoch;
    char problem[EP_ERR_MSG_MAX];
    char why[EP_ERR_MSG_MAX];
};

plan_epochs *plan_epochs_create(const plan_table *base, spec_rejoin rejoin, int max_per_rank,
                                bool formed, ep_err *err)
{
    plan_epochs *pe = calloc(1, sizeof *pe);
    if (pe == NULL)
        goto fail;
    pe->base = plan_copy(base, base->epoch);
    pe->current = plan_copy(base, base->epoch);
    pe->latest = plan_copy(base, base->epoch);
    pe->drained = calloc((size_t)base->n_ranks, 1);
    if (pe->base == NULL || pe->current == NULL || pe->latest == NULL || pe->drained == NULL)
        goto fail;
    pe->phase = formed ? PLAN_STABLE : PLAN_FORMING;
    pe->rejoin = rejoin;
    pe->max_per_rank = max_per_rank;
    pe->last_epoch = base->epoch;
    snprintf(pe->why, sizeof pe->why, "the spec's %s placement",
             spec_placement_name(base->placement));
    return pe;
fail:
    plan_epochs_destroy(&pe);
    ep_err_set(err, "placement: out of memory");
    return NULL;
}

void plan_epochs_destroy(plan_epochs **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    plan_epochs *pe = *self_p;
    plan_free(&pe->base);
    plan_free(&pe->current);
    plan_free(&pe->latest);
    plan_free(&pe->pending);
    free(pe->drained);
    free(pe);
    *self_p = NULL;
}

plan_phase plan_phase_of(const plan_epochs *pe)
{
    return pe->phase;
}

const char *plan_phase_name(plan_phase p)
{
    static const char *const names[] = {"forming", "stable", "pending", "applying", "blocked"};
    return (unsigned)p < 5 ? names[p] : "?";
}

const plan_table *plan_current(const plan_epochs *pe)
{
    return pe->current;
}

const plan_table *plan_latest(const plan_epochs *pe)
{
    return pe->latest;
}

const plan_table *plan_base(const plan_epochs *pe)
{
    return pe->base;
}

const char *plan_problem(const plan_epochs *pe)
{
    return pe->phase == PLAN_BLOCKED ? pe->problem : "";
}

spec_rejoin plan_rejoin(const plan_epochs *pe)
{
    return pe->rejoin;
}

bool plan_drained(const plan_epochs *pe, int rank)
{
    return rank >= 0 && rank < pe->base->n_ranks && pe->drained[rank];
}

void plan_set_drained(plan_epochs *pe, int rank, bool drained)
{
    if (rank >= 0 && rank < pe->base->n_ranks)
        pe->drained[rank] = drained;
}

uint64_t plan_last_epoch(const plan_epochs *pe)
{
    return pe->last_epoch;
}

const char *plan_why(const plan_epochs *pe)
{
    return pe->why;
}

/* The table a replan starts from when it does not restore. */
static const plan_table *plan_intended(const plan_epochs *pe)
{
    return pe->pending ? pe->pending : pe->latest;
}

int plan_try(const plan_epochs *pe, const uint8_t *eligible, ep_err *err)
{
    plan_table *t = plan_spread(plan_intended(pe), eligible, pe->max_per_rank, 0, err);
    int rc = t ? 0 : -1;
    plan_free(&t);
    return rc;
}

static int plan_decide(plan_epochs *pe, const uint8_t *eligible, bool from_base, bool force,
                       const char *why)
{
    if (pe->phase == PLAN_FORMING)
        return 0;
    ep_err err;
    const plan_table *from = from_base ? pe->base : plan_intended(pe);
    /* a pending table was never sent: the new one takes its number */
    uint64_t epoch = pe->pending ? pe->last_epoch : pe->last_epoch + 1;
    plan_table *t = plan_spread(from, eligible, pe->max_per_rank, epoch, &err);
    if (t == NULL) {
        plan_free(&pe->pending);
        snprintf(pe->problem, sizeof pe->problem, "%s", err.msg);
        if (pe->phase != PLAN_BLOCKED)
            log_warn("placement: %s: blocked: %s", why, pe->problem);
        pe->phase = PLAN_BLOCKED;
        return -1;
    }
    bool latest_applied = pe->latest->epoch == pe->current->epoch;
    if (!force && plan_same(t, pe->latest) && (pe->phase != PLAN_BLOCKED || latest_applied)) {
        /* what the workers were last told: nothing to send (a blocked cluster whose members
         * never acknowledged latest gets a new epoch below, so that they load again) */
        plan_free(&t);
        plan_free(&pe->pending);
        pe->phase = latest_applied ? PLAN_STABLE : PLAN_APPLYING;
        return 0;
    }
    if (!force && pe->pending != NULL && plan_same(t, pe->pending)) {
        plan_free(&t);
        return 0;
    }
    plan_free(&pe->pending);
    pe->pending = t;
    pe->last_epoch = epoch;
    pe->phase = PLAN_PENDING;
    snprintf(pe->why, sizeof pe->why, "%s", why);
    log_info("placement: epoch %" PRIu64 " decided (%d members): %s", epoch, t->n_members, why);
    return 1;
}

int plan_replan(plan_epochs *pe, const uint8_t *eligible, bool from_base, const char *why)
{
    return plan_decide(pe, eligible, from_base, false, why);
}

int plan_replan_new(plan_epochs *pe, const uint8_t *eligible, bool from_base, const char *why)
{
    return plan_decide(pe, eligible, from_base, true, why);
}

const plan_table *plan_send(plan_epochs *pe)
{
    if (pe->pending != NULL) {
        plan_free(&pe->latest);
        pe->latest = pe->pending;
        pe->pending = NULL;
        pe->phase = PLAN_APPLYING;
    }
    return pe->latest;
}

void plan_applied(plan_epochs *pe)
{
    if (pe->phase != PLAN_FORMING && pe->phase != PLAN_APPLYING)
        return;
    plan_table *t = plan_copy(pe->latest, pe->latest->epoch);
    if (t == NULL) {
        log_error("placement: out of memory applying epoch %" PRIu64, pe->latest->epoch);
        return;
    }
    plan_free(&pe->current);
    pe->current = t;
    pe->phase = PLAN_STABLE;
}

void plan_block(plan_epochs *pe, const char *problem)
{
    plan_free(&pe->pending);
    snprintf(pe->problem, sizeof pe->problem, "%s", problem);
    pe->phase = PLAN_BLOCKED;
    log_warn("placement: blocked: %s", problem);
}

int plan_reconfigure(plan_epochs *pe, const plan_table *base, spec_rejoin rejoin, int max_per_rank)
{
    plan_table *b = plan_copy(base, pe->base->epoch);
    if (b == NULL)
        return -1;
    plan_free(&pe->base);
    pe->base = b;
    pe->rejoin = rejoin;
    pe->max_per_rank = max_per_rank;
    return 0;
}
