/*
 * planner.h — expert placement: the table of an epoch, and the epoch machinery that moves the
 * cluster from one table to the next (prefix plan_).
 *
 * ---- Tables ----
 *
 * A plan_table maps every expert 0..n_experts-1 to exactly one rank 0..n_ranks-1 (the spec's
 * workers; a rank keeps its number across epochs). The ranks that own at least one expert are
 * the epoch's members: they take part in its steps. The table is the same for every MoE layer;
 * per-layer tables and replicas (EPLB, issue 9) will add a layer index and several owners per
 * expert behind the same accessors (plan_owner, plan_rank_experts, plan_is_member).
 *
 *   contiguous   rank r owns [r*E/P, (r+1)*E/P)  (spec §1.4, the reference and vLLM MegaMoE
 *                layout; DeepGEMM's e / (E/P)); needs E % P == 0
 *   round_robin  expert e belongs to rank e % P; any P <= E
 *
 * plan_build errors: P < 1, P > EP_MAX_WORKERS, E < 1, E > MC_MAX_EXPERTS, P > E, contiguous
 * with E % P != 0, unknown placement. Messages name the numbers and the rule.
 *
 * The failover rule (plan_spread, docs/protocol.md "Placement epochs"): ranks that may still own
 * experts keep every expert they own; the experts of the other ranks are taken in ascending
 * expert id, and each goes to the eligible rank that owns the fewest experts at that moment
 * (ties: the lowest rank), skipping ranks that already hold max_per_rank. Deterministic, moves
 * only what must move, and keeps the load even.
 *
 * ---- Epochs ----
 *
 * plan_epochs is a passive state machine (coord.h): coord.c tells it what happened (which
 * ranks may own experts, why) and it answers with what to do (a new epoch to send, nothing, or
 * that no placement exists). Phases:
 *
 *   forming   the spec's placement (epoch 1 of this coordinator) until every worker of the spec
 *             has acknowledged it once; losses before that only wait for the worker to return
 *   stable    every member acknowledged `current`; steps run in it
 *   pending   a new table is decided; it is sent once the step in flight has settled
 *   applying  the new table was sent (`latest`); waiting for its members' READY
 *   blocked   no placement over the eligible ranks (max_experts_per_worker, too few workers,
 *             or a member that failed to load): `problem` says why; any change replans
 *
 * `latest` is the table workers were last told (WELCOME, EPOCH); `current` the last one every
 * member acknowledged. A replan starts from the intended table (pending, else latest), or from
 * the spec's placement when restoring (rejoin: restore).
 */
#ifndef EPMOE_PLANNER_H
#define EPMOE_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "coordinator/spec.h"

typedef struct plan_table {
    int n_experts;   /* E */
    int n_ranks;     /* P */
    int *owner;      /* [n_experts]: the rank owning each expert (every layer) */
    uint8_t *member; /* [n_ranks]: 1 when the rank owns an expert */
    int n_members;
    uint64_t epoch;
    spec_placement placement; /* the spec's rule the first table was built with */
} plan_table;

plan_table *plan_build(spec_placement p, int n_experts, int n_ranks, uint64_t epoch, ep_err *err);
/* A copy with another epoch; NULL when out of memory. */
plan_table *plan_copy(const plan_table *t, uint64_t epoch);
/* Free a table; tolerates NULL and clears the caller's pointer. */
void plan_free(plan_table **self_p);

/* The experts rank owns, in ascending id, into out[0..cap) (out may be NULL when cap is 0).
 * Returns how many the rank owns (which may exceed cap: only cap are written), or -1 when rank
 * is not in 0..n_ranks-1. */
int plan_rank_experts(const plan_table *t, int rank, int *out, int cap);
int plan_owner(const plan_table *t, int expert);
bool plan_is_member(const plan_table *t, int rank);
/* The same owner for every expert (the epochs may differ). */
bool plan_same(const plan_table *a, const plan_table *b);

/* The failover rule above: a new table (epoch `epoch`) where ranks with eligible[r] keep their
 * experts and the others' go to the eligible ranks; max_per_rank 0 means no limit. NULL with
 * err ("3 workers can hold at most 6 of the 8 experts (max_experts_per_worker 2)") when the
 * eligible ranks cannot hold every expert. */
plan_table *plan_spread(const plan_table *from, const uint8_t *eligible, int max_per_rank,
                        uint64_t epoch, ep_err *err);

typedef enum plan_phase {
    PLAN_FORMING = 0,
    PLAN_STABLE,
    PLAN_PENDING,
    PLAN_APPLYING,
    PLAN_BLOCKED
} plan_phase;

typedef struct plan_epochs plan_epochs;

/* The machinery for a spec: base is the spec's placement (copied; its epoch is the first).
 * formed: false for a new coordinator (phase forming), true to continue from an earlier state
 * (a reload: the caller replans at once). */
plan_epochs *plan_epochs_create(const plan_table *base, spec_rejoin rejoin, int max_per_rank,
                                bool formed, ep_err *err);
void plan_epochs_destroy(plan_epochs **self_p);

plan_phase plan_phase_of(const plan_epochs *pe);
const char *plan_phase_name(plan_phase p); /* forming stable pending applying blocked */
const plan_table *plan_current(const plan_epochs *pe);
const plan_table *plan_latest(const plan_epochs *pe);
const plan_table *plan_base(const plan_epochs *pe);
/* Why the cluster is blocked ("" otherwise). */
const char *plan_problem(const plan_epochs *pe);
spec_rejoin plan_rejoin(const plan_epochs *pe);
/* Operator drains: a drained rank is never eligible (coord.c asks before computing eligible). */
bool plan_drained(const plan_epochs *pe, int rank);
void plan_set_drained(plan_epochs *pe, int rank, bool drained);
/* The highest epoch decided so far (the next new epoch is one more). */
uint64_t plan_last_epoch(const plan_epochs *pe);

/* Something changed which ranks may own experts (eligible[r], computed by coord.c from the
 * registry and the drains). Decide the table: from the spec's placement when from_base
 * (restore), else from the intended one. why is logged and sent with the epoch. Returns 1 when
 * a new epoch is pending, 0 when nothing changes, -1 when blocked (plan_problem says why).
 * In phase forming nothing is decided (returns 0). */
int plan_replan(plan_epochs *pe, const uint8_t *eligible, bool from_base, const char *why);
/* The same, but a new epoch even when the table does not change (a reload that changes the
 * world welcomes every worker again into a new epoch). */
int plan_replan_new(plan_epochs *pe, const uint8_t *eligible, bool from_base, const char *why);
/* The same decision without changing anything: 0 when a placement exists, else -1 with err
 * (a drain asks first, so that an impossible drain is refused instead of blocking). */
int plan_try(const plan_epochs *pe, const uint8_t *eligible, ep_err *err);
/* The pending table is being sent: pending -> applying. Returns it (latest). */
const plan_table *plan_send(plan_epochs *pe);
/* Why the pending (or latest) epoch was decided. */
const char *plan_why(const plan_epochs *pe);
/* Every member of latest acknowledged it: forming/applying -> stable (current = latest). */
void plan_applied(plan_epochs *pe);
/* A reload that keeps the world (same ranks): the spec's placement and rules become these
 * (base copied; its epoch is ignored). The caller replans. 0, or -1 when out of memory. */
int plan_reconfigure(plan_epochs *pe, const plan_table *base, spec_rejoin rejoin, int max_per_rank);
/* A member of latest could not load its experts: blocked with that problem. */
void plan_block(plan_epochs *pe, const char *problem);

#endif
