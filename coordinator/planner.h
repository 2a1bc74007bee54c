/*
 * planner.h — expert placement: the table of an epoch, the policies that build tables, and the
 * epoch machinery that moves the cluster from one table to the next (prefix plan_).
 *
 * ---- Tables ----
 *
 * A plan_table says, for every MoE layer (mc_num_layers: main then MTP) and routed expert, the
 * ranks holding a replica of it (common/placement.h: at least one, ascending; identical layers
 * stored once). Ranks are the spec's workers and keep their number across epochs. The ranks
 * that hold an expert in some layer are the epoch's members: they take part in its steps.
 *
 *   contiguous   rank r holds [r*E/P, (r+1)*E/P) in every layer (spec §1.4, the reference and
 *                vLLM MegaMoE layout; DeepGEMM's e / (E/P)); needs E % P == 0
 *   round_robin  expert e on rank e % P in every layer; any P <= E
 *   eplb         DeepSeek's EPLB (coordinator/eplb.h) with E + redundant_experts slots per
 *                layer; with no load known yet every expert weighs the same (so with
 *                redundant_experts = E every expert gets two replicas); plan_rebalance plans
 *                again from measured load, layer by layer
 *
 * plan_build errors: P < 1, P > EP_MAX_WORKERS, E < 1, E > MC_MAX_EXPERTS, P > E + redundant,
 * contiguous with E % P != 0, redundant experts with a policy other than eplb, more slots than
 * E x P, unknown placement. Messages name the numbers and the rule.
 *
 * The failover rule (plan_spread, docs/protocol.md "Placement epochs"), layer by layer: ranks
 * that may still own experts keep every replica they hold; replicas on the other ranks are
 * dropped when the expert has a replica left, so replicas make a loss free of loading; the
 * experts left with none are taken in ascending expert id, and each goes to the eligible rank
 * that holds the fewest experts of that layer at that moment (ties: the lowest rank), skipping
 * ranks that already hold max_per_rank. Deterministic, moves only what must move, keeps the
 * load even. Without replicas every layer gets the same result, as before issue 9.
 *
 * Rebalance (plan_rebalance): EPLB over the eligible ranks from each layer's load (a layer
 * without load keeps its table), then each new rank set is matched to the rank that already
 * holds most of it (greedy on overlap; within a node when hierarchical), so only changed
 * experts move.
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
 *   staging   a rebalance: the new table (`staged`) was sent with EPOCH{staged}; workers load
 *             what they gain while steps keep running in `current`; once every member of the
 *             staged table has prepared it, coord.c commits it at a step boundary (staging ->
 *             applying: latest = staged) and the switch itself loads nothing
 *
 * `latest` is the table workers were last told to serve (WELCOME, EPOCH, EPOCH_COMMIT);
 * `current` the last one every member acknowledged. A replan starts from the intended table
 * (pending, else latest), or from the spec's placement when restoring (rejoin: restore); any
 * replan while staging abandons the staged table first.
 */
#ifndef EPMOE_PLANNER_H
#define EPMOE_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "common/placement.h"
#include "coordinator/spec.h"

/* What a placement is planned for: the model, the ranks and the spec's rules. */
typedef struct plan_shape {
    spec_placement placement;
    int n_layers, n_experts, n_ranks;
    int redundant; /* extra slots per layer (eplb) */
    int n_groups;  /* expert groups (hierarchical eplb when they divide over the nodes) */
    int n_nodes;
    uint16_t rank_node[EP_MAX_WORKERS]; /* node index of each rank (ranks are node-major) */
} plan_shape;

typedef struct plan_table {
    plan_shape shape;
    pl_table *pl;
    int n_layers, n_experts, n_ranks; /* copies of shape's */
    uint8_t *member;                  /* [n_ranks]: 1 when the rank holds an expert */
    int n_members;
    int *rank_max, *rank_slots; /* [n_ranks]: plan_rank_max, plan_rank_slots (cached) */
    uint64_t epoch;
    spec_placement placement; /* the spec's rule the first table was built with */
} plan_table;

/* The shape of a spec for a model (nodes, groups and redundant_experts from the spec). */
void plan_shape_of(const spec_cluster *spec, const mc_config *cfg, plan_shape *out);
/* A one-node shape with no redundancy (tests, tools). */
void plan_shape_simple(spec_placement p, int n_layers, int n_experts, int n_ranks, plan_shape *out);
/* The policy's table for a shape. */
plan_table *plan_build(const plan_shape *s, uint64_t epoch, ep_err *err);
/* plan_shape_of + plan_build. */
plan_table *plan_for_spec(const spec_cluster *spec, const mc_config *cfg, uint64_t epoch,
                          ep_err *err);
/* A table of shape s from a placement (taken: *pl_p is cleared, also on failure). */
plan_table *plan_from_pl(const plan_shape *s, pl_table **pl_p, uint64_t epoch, ep_err *err);
/* A copy with another epoch; NULL when out of memory. */
plan_table *plan_copy(const plan_table *t, uint64_t epoch);
/* Free a table; tolerates NULL and clears the caller's pointer. */
void plan_free(plan_table **self_p);

/* The experts rank holds in `layer`, in ascending id, into out[0..cap) (out may be NULL when cap
 * is 0). Returns how many (which may exceed cap: only cap are written), or -1 when rank or layer
 * is out of range. */
int plan_rank_experts(const plan_table *t, int layer, int rank, int *out, int cap);
/* The replicas of expert e in layer (ascending ranks), their number in *n. */
const uint16_t *plan_replicas(const plan_table *t, int layer, int expert, int *n);
bool plan_is_member(const plan_table *t, int rank);
/* The same replicas everywhere (the epochs may differ). */
bool plan_same(const plan_table *a, const plan_table *b);
/* The most experts rank holds in one layer, and (layer, expert) pairs over all layers. */
int plan_rank_max(const plan_table *t, int rank);
int plan_rank_slots(const plan_table *t, int rank);

/* The failover rule above: a new table (epoch `epoch`) where ranks with eligible[r] keep their
 * replicas and the others' experts go to the eligible ranks; max_per_rank 0 means no limit. NULL
 * with err ("3 workers can hold at most 6 of the 8 experts (max_experts_per_worker 2)") when
 * the eligible ranks cannot hold every expert. */
plan_table *plan_spread(const plan_table *from, const uint8_t *eligible, int max_per_rank,
                        uint64_t epoch, ep_err *err);

/* ---- load and balance ---- */

/* The load each rank of `layer` gets under t when expert e's load is w[e], split evenly over
 * its replicas (the replica rule's model), into load[n_ranks]; returns max/mean over the ranks
 * that hold an expert of the layer (1 when the layer has no load). */
double plan_layer_balance(const plan_table *t, int layer, const double *w, double *load);

typedef struct plan_report {
    double balance_before, balance_after; /* max/mean rank load, averaged over loaded layers */
    long moved;                           /* (layer, expert, rank) replicas gained */
    bool hierarchical;                    /* EPLB took the hierarchical policy */
    int n_layers;
    double *layer_before, *layer_after; /* [n_layers]; 0 for a layer without load */
    int *layer_moved;                   /* [n_layers] */
} plan_report;
void plan_report_free(plan_report *r);

/* A rebalanced table (epoch `epoch`) from `from` and the load weight[n_layers * E] over the
 * eligible ranks (see above); rep (optional) gets the balance before and after and what moves.
 * max_per_rank (0: none) bounds the slots of a rank. NULL with err when EPLB has no placement
 * for these ranks (too few slots, out of memory). */
plan_table *plan_rebalance(const plan_table *from, const double *weight, const uint8_t *eligible,
                           int max_per_rank, uint64_t epoch, plan_report *rep, ep_err *err);

/* ---- epochs ---- */

typedef enum plan_phase {
    PLAN_FORMING = 0,
    PLAN_STABLE,
    PLAN_PENDING,
    PLAN_APPLYING,
    PLAN_BLOCKED,
    PLAN_STAGING
} plan_phase;

typedef struct plan_epochs plan_epochs;

/* The machinery for a spec: base is the spec's placement (copied; its epoch is the first).
 * formed: false for a new coordinator (phase forming), true to continue from an earlier state
 * (a reload: the caller replans at once). */
plan_epochs *plan_epochs_create(const plan_table *base, spec_rejoin rejoin, int max_per_rank,
                                bool formed, ep_err *err);
void plan_epochs_destroy(plan_epochs **self_p);

plan_phase plan_phase_of(const plan_epochs *pe);
/* forming stable pending applying blocked staging */
const char *plan_phase_name(plan_phase p);
const plan_table *plan_current(const plan_epochs *pe);
const plan_table *plan_latest(const plan_epochs *pe);
const plan_table *plan_base(const plan_epochs *pe);
/* The staged table (phase staging), else NULL. */
const plan_table *plan_staged(const plan_epochs *pe);
/* Why the cluster is blocked ("" otherwise). */
const char *plan_problem(const plan_epochs *pe);
spec_rejoin plan_rejoin(const plan_epochs *pe);
int plan_max_per_rank(const plan_epochs *pe);
/* Operator drains: a drained rank is never eligible (coord.c asks before computing eligible). */
bool plan_drained(const plan_epochs *pe, int rank);
void plan_set_drained(plan_epochs *pe, int rank, bool drained);
/* The highest epoch decided so far (the next new epoch is one more). */
uint64_t plan_last_epoch(const plan_epochs *pe);

/* Something changed which ranks may own experts (eligible[r], computed by coord.c from the
 * registry and the drains). Decide the table: from the spec's placement when from_base
 * (restore), else from the intended one. why is logged and sent with the epoch. Returns 1 when
 * a new epoch is pending, 0 when nothing changes, -1 when blocked (plan_problem says why).
 * In phase forming nothing is decided (returns 0). A staged table is abandoned first. */
int plan_replan(plan_epochs *pe, const uint8_t *eligible, bool from_base, const char *why);
/* The same, but a new epoch even when the table does not change (a reload that changes the
 * world welcomes every worker again into a new epoch). */
int plan_replan_new(plan_epochs *pe, const uint8_t *eligible, bool from_base, const char *why);
/* The same decision without changing anything: 0 when a placement exists, else -1 with err
 * (a drain asks first, so that an impossible drain is refused instead of blocking). */
int plan_try(const plan_epochs *pe, const uint8_t *eligible, ep_err *err);
/* The pending table is being sent: pending -> applying. Returns it (latest). */
const plan_table *plan_send(plan_epochs *pe);
/* Why the pending (or latest, or staged) epoch was decided. */
const char *plan_why(const plan_epochs *pe);
/* Every member of latest acknowledged it: forming/applying -> stable (current = latest). */
void plan_applied(plan_epochs *pe);
/* A reload that keeps the world (same ranks): the spec's placement and rules become these
 * (base copied; its epoch is ignored). The caller replans. 0, or -1 when out of memory. */
int plan_reconfigure(plan_epochs *pe, const plan_table *base, spec_rejoin rejoin, int max_per_rank);
/* A member of latest could not load its experts: blocked with that problem. */
void plan_block(plan_epochs *pe, const char *problem);

/* A rebalance: stable -> staging with *t_p (taken and cleared; its epoch becomes the next one).
 * Returns the staged table, or NULL when not stable (nothing taken then... the table is freed). */
const plan_table *plan_stage(plan_epochs *pe, plan_table **t_p, const char *why);
/* Every member of the staged table prepared it: staging -> applying, latest = staged. */
const plan_table *plan_commit(plan_epochs *pe);
/* The staged table is dropped (a worker could not load it): staging -> stable. */
void plan_unstage(plan_epochs *pe, const char *why);

#endif
