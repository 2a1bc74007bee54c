/*
 * planner.c — placement tables, their policies and the epoch machinery (see planner.h).
 *
 * Tables are built layer by layer into a pl_builder, which stores identical layers once; the
 * failover rule and the rebalance work on each stored layer table once, since identical layers
 * give identical results.
 */
#include "coordinator/planner.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/eplb.h"

/* ---- shapes ---- */

void plan_shape_simple(spec_placement p, int n_layers, int n_experts, int n_ranks, plan_shape *out)
{
    memset(out, 0, sizeof *out);
    out->placement = p;
    out->n_layers = n_layers;
    out->n_experts = n_experts;
    out->n_ranks = n_ranks;
    out->n_groups = 1;
    out->n_nodes = 1;
}

void plan_shape_of(const spec_cluster *spec, const mc_config *cfg, plan_shape *out)
{
    plan_shape_simple(spec->placement, mc_num_layers(cfg), cfg->n_routed_experts, spec->n_workers,
                      out);
    out->redundant = spec->redundant_experts;
    out->n_groups = spec->expert_groups > 0 ? spec->expert_groups : 1;
    out->n_nodes = spec->n_nodes;
    for (int r = 0; r < spec->n_workers && r < EP_MAX_WORKERS; r++)
        out->rank_node[r] = (uint16_t)spec->workers[r].node_index;
}

static int plan_check(const plan_shape *s, ep_err *err)
{
    int P = s->n_ranks, E = s->n_experts, R = E + s->redundant;
    if (P < 1 || P > EP_MAX_WORKERS)
        return ep_err_set(err, "placement: %d ranks (expected 1..%d)", P, EP_MAX_WORKERS);
    if (E < 1 || E > MC_MAX_EXPERTS)
        return ep_err_set(err, "placement: %d experts (expected 1..%d)", E, MC_MAX_EXPERTS);
    if (s->n_layers < 1 || s->n_layers > MC_MAX_LAYERS + MC_MAX_MTP)
        return ep_err_set(err, "placement: %d layers (expected 1..%d)", s->n_layers,
                          MC_MAX_LAYERS + MC_MAX_MTP);
    if (s->placement != SPEC_PLACE_CONTIGUOUS && s->placement != SPEC_PLACE_ROUND_ROBIN &&
        s->placement != SPEC_PLACE_EPLB)
        return ep_err_set(err,
                          "placement: unknown placement %d (expected contiguous, round_robin or "
                          "eplb)",
                          (int)s->placement);
    if (s->redundant < 0 || (s->redundant > 0 && s->placement != SPEC_PLACE_EPLB))
        return ep_err_set(err,
                          "placement %s: %d redundant experts (replicas are planned by eplb "
                          "only)",
                          spec_placement_name(s->placement), s->redundant);
    if (P > R)
        return ep_err_set(err,
                          "placement: %d ranks are more than the %d expert slots (every rank "
                          "must own at least one expert)",
                          P, R);
    if ((int64_t)R > (int64_t)E * P)
        return ep_err_set(err,
                          "placement eplb: %d slots (%d experts + %d redundant) need more than "
                          "one replica of an expert on some of the %d ranks",
                          R, E, s->redundant, P);
    if (s->placement == SPEC_PLACE_CONTIGUOUS && E % P != 0)
        return ep_err_set(err,
                          "placement contiguous: %d ranks do not divide %d experts evenly "
                          "(needs n_experts %% ranks == 0)",
                          P, E);
    if (s->n_groups < 1 || E % s->n_groups != 0)
        return ep_err_set(err, "placement: %d expert groups do not divide %d experts", s->n_groups,
                          E);
    return 0;
}

/* ---- tables ---- */

plan_table *plan_from_pl(const plan_shape *s, pl_table **pl_p, uint64_t epoch, ep_err *err)
{
    plan_table *t = calloc(1, sizeof *t);
    if (t != NULL) {
        t->member = calloc((size_t)s->n_ranks, 1);
        t->rank_max = malloc((size_t)s->n_ranks * sizeof *t->rank_max);
        t->rank_slots = malloc((size_t)s->n_ranks * sizeof *t->rank_slots);
    }
    if (t == NULL || !t->member || !t->rank_max || !t->rank_slots) {
        pl_free(pl_p);
        if (t != NULL) {
            free(t->member);
            free(t->rank_max);
            free(t->rank_slots);
        }
        free(t);
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    t->shape = *s;
    t->pl = *pl_p;
    *pl_p = NULL;
    t->n_layers = s->n_layers;
    t->n_experts = s->n_experts;
    t->n_ranks = s->n_ranks;
    t->n_members = pl_members(t->pl, t->member);
    pl_rank_counts(t->pl, t->rank_max, t->rank_slots);
    t->epoch = epoch;
    t->placement = s->placement;
    return t;
}

/* One layer of an EPLB plan (R slots: phy2log, phy2rank mapped through rank_of) into b. */
static int plan_eplb_layer(pl_builder *b, int layer, int E, int R, const int *phy2log,
                           const int *phy2rank, const int *rank_of, ep_err *err)
{
    uint16_t *count = calloc((size_t)E, sizeof *count), *ranks = malloc((size_t)R * 2 + 2);
    int *fill = calloc((size_t)E + 1, sizeof *fill), rc;
    if (count == NULL || ranks == NULL || fill == NULL) {
        rc = ep_err_set(err, "placement: out of memory");
        goto done;
    }
    for (int s = 0; s < R; s++)
        count[phy2log[s]]++;
    for (int e = 0; e < E; e++)
        fill[e + 1] = fill[e] + count[e];
    for (int s = 0; s < R; s++)
        ranks[fill[phy2log[s]]++] = (uint16_t)rank_of[phy2rank[s]];
    rc = pl_builder_set(b, layer, count, ranks, err);
done:
    free(count);
    free(ranks);
    free(fill);
    return rc;
}

/* eplb with every expert weighing the same: one layer planned, the same for all. */
static pl_table *plan_eplb_uniform(const plan_shape *s, ep_err *err)
{
    int E = s->n_experts, P = s->n_ranks, R = E + s->redundant;
    eplb_shape es = {.n_layers = 1,
                     .n_experts = E,
                     .n_slots = R,
                     .n_ranks = P,
                     .n_nodes = s->n_nodes,
                     .n_groups = s->n_groups};
    double *w = malloc((size_t)E * sizeof *w);
    int *p2l = malloc((size_t)R * sizeof *p2l), *p2r = malloc((size_t)R * sizeof *p2r);
    int *rank_of = malloc((size_t)P * sizeof *rank_of);
    pl_builder *b = pl_builder_new(s->n_layers, E, P, err);
    pl_table *t = NULL;
    if (!w || !p2l || !p2r || !rank_of || !b) {
        if (b)
            ep_err_set(err, "placement: out of memory");
        goto done;
    }
    for (int e = 0; e < E; e++)
        w[e] = 1.0;
    for (int r = 0; r < P; r++)
        rank_of[r] = r;
    if (eplb_plan(&es, w, p2l, p2r, err) != 0)
        goto done;
    for (int l = 0; l < s->n_layers; l++)
        if (plan_eplb_layer(b, l, E, R, p2l, p2r, rank_of, err) != 0)
            goto done;
    t = pl_builder_finish(&b, err);
done:
    pl_builder_free(&b);
    free(w);
    free(p2l);
    free(p2r);
    free(rank_of);
    return t;
}

plan_table *plan_build(const plan_shape *s, uint64_t epoch, ep_err *err)
{
    if (plan_check(s, err) != 0)
        return NULL;
    pl_table *pl = NULL;
    if (s->placement == SPEC_PLACE_EPLB) {
        pl = plan_eplb_uniform(s, err);
    } else {
        int E = s->n_experts, per_rank = E / s->n_ranks; /* contiguous only: exact */
        uint32_t *owner = malloc((size_t)E * sizeof *owner);
        if (owner == NULL) {
            ep_err_set(err, "placement: out of memory");
            return NULL;
        }
        for (int e = 0; e < E; e++)
            owner[e] =
                (uint32_t)(s->placement == SPEC_PLACE_CONTIGUOUS ? e / per_rank : e % s->n_ranks);
        pl = pl_flat(s->n_layers, E, s->n_ranks, owner, err);
        free(owner);
    }
    return pl ? plan_from_pl(s, &pl, epoch, err) : NULL;
}

plan_table *plan_for_spec(const spec_cluster *spec, const mc_config *cfg, uint64_t epoch,
                          ep_err *err)
{
    plan_shape *s = malloc(sizeof *s);
    if (s == NULL) {
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    plan_shape_of(spec, cfg, s);
    plan_table *t = plan_build(s, epoch, err);
    free(s);
    return t;
}

plan_table *plan_copy(const plan_table *t, uint64_t epoch)
{
    pl_table *pl = pl_copy(t->pl);
    if (pl == NULL)
        return NULL;
    plan_table *c = plan_from_pl(&t->shape, &pl, epoch, NULL);
    if (c != NULL)
        c->placement = t->placement;
    return c;
}

void plan_free(plan_table **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    pl_free(&(*self_p)->pl);
    free((*self_p)->member);
    free((*self_p)->rank_max);
    free((*self_p)->rank_slots);
    free(*self_p);
    *self_p = NULL;
}

int plan_rank_experts(const plan_table *t, int layer, int rank, int *out, int cap)
{
    return t != NULL ? pl_rank_experts(t->pl, layer, rank, out, cap) : -1;
}

const uint16_t *plan_replicas(const plan_table *t, int layer, int expert, int *n)
{
    return pl_replicas(t->pl, layer, expert, n);
}

bool plan_is_member(const plan_table *t, int rank)
{
    return t != NULL && rank >= 0 && rank < t->n_ranks && t->member[rank];
}

bool plan_same(const plan_table *a, const plan_table *b)
{
    return pl_same(a->pl, b->pl);
}

int plan_rank_max(const plan_table *t, int rank)
{
    return rank >= 0 && rank < t->n_ranks ? t->rank_max[rank] : 0;
}

int plan_rank_slots(const plan_table *t, int rank)
{
    return rank >= 0 && rank < t->n_ranks ? t->rank_slots[rank] : 0;
}

/* ---- failover ---- */

/* Scratch for re-planning one layer table at a time. */
typedef struct plan_layer_buf {
    uint16_t *count; /* [E] */
    uint16_t *rank;  /* [E * P] worst case */
    int *held;       /* [P] experts per rank */
} plan_layer_buf;

static int plan_buf_init(plan_layer_buf *b, int E, int P)
{
    b->count = malloc((size_t)E * sizeof *b->count);
    b->rank = malloc((size_t)E * (size_t)P * sizeof *b->rank);
    b->held = malloc((size_t)P * sizeof *b->held);
    return b->count && b->rank && b->held ? 0 : -1;
}

static void plan_buf_free(plan_layer_buf *b)
{
    free(b->count);
    free(b->rank);
    free(b->held);
}

/* The failover rule for one layer of from into b (count, rank). */
static int plan_spread_layer(const plan_table *from, int layer, const uint8_t *eligible,
                             int max_per_rank, plan_layer_buf *b, ep_err *err)
{
    int E = from->n_experts, P = from->n_ranks, n_eligible = 0;
    uint16_t **at = malloc((size_t)E * sizeof *at); /* where expert e's list starts in b->rank */
    if (at == NULL)
        return ep_err_set(err, "placement: out of memory");
    memset(b->held, 0, (size_t)P * sizeof *b->held);
    for (int r = 0; r < P; r++)
        n_eligible += eligible[r] != 0;
    size_t o = 0;
    for (int e = 0; e < E; e++) { /* keep the replicas on eligible ranks */
        int n;
        const uint16_t *reps = plan_replicas(from, layer, e, &n);
        at[e] = b->rank + o;
        b->count[e] = 0;
        for (int i = 0; i < n; i++)
            if (eligible[reps[i]]) {
                b->rank[o++] = reps[i];
                b->count[e]++;
                b->held[reps[i]]++;
            }
        o += b->count[e] == 0; /* room for the one replica it gets below */
    }
    for (int e = 0; e < E; e++) {
        if (b->count[e] > 0)
            continue;
        int best = -1;
        for (int r = 0; r < P; r++)
            if (eligible[r] && (max_per_rank == 0 || b->held[r] < max_per_rank) &&
                (best < 0 || b->held[r] < b->held[best]))
                best = r;
        if (best < 0) {
            free(at);
            if (n_eligible == 0)
                return ep_err_set(err,
                                  "no worker is left that can own experts (%d experts to "
                                  "place)",
                                  E);
            return ep_err_set(err,
                              "%d workers can hold at most %d of the %d experts "
                              "(max_experts_per_worker %d)",
                              n_eligible, n_eligible * max_per_rank, E, max_per_rank);
        }
        at[e][0] = (uint16_t)best;
        b->count[e] = 1;
        b->held[best]++;
    }
    free(at);
    return 0;
}

plan_table *plan_spread(const plan_table *from, const uint8_t *eligible, int max_per_rank,
                        uint64_t epoch, ep_err *err)
{
    int L = from->n_layers, E = from->n_experts, P = from->n_ranks, last = -1;
    plan_layer_buf b = {0};
    pl_builder *bl = pl_builder_new(L, E, P, err);
    pl_table *pl = NULL;
    if (bl == NULL || plan_buf_init(&b, E, P) != 0) {
        if (bl != NULL)
            ep_err_set(err, "placement: out of memory");
        goto fail;
    }
    for (int l = 0; l < L; l++) {
        /* identical layers give identical results: b still holds the last stored table's */
        int j = pl_layer_stored(from->pl, l);
        if (j != last && plan_spread_layer(from, l, eligible, max_per_rank, &b, err) != 0)
            goto fail;
        last = j;
        if (pl_builder_set(bl, l, b.count, b.rank, err) != 0)
            goto fail;
    }
    pl = pl_builder_finish(&bl, err);
    plan_buf_free(&b);
    if (pl == NULL)
        return NULL;
    plan_table *t = plan_from_pl(&from->shape, &pl, epoch, err);
    if (t != NULL)
        t->placement = from->placement;
    return t;
fail:
    pl_builder_free(&bl);
    plan_buf_free(&b);
    return NULL;
}

/* ---- load and balance ---- */

double plan_layer_balance(const plan_table *t, int layer, const double *w, double *load)
{
    int P = t->n_ranks, holders = 0;
    uint8_t *holds = calloc((size_t)P, 1);
    double total = 0, mx = 0;
    for (int r = 0; r < P; r++)
        load[r] = 0;
    for (int e = 0; e < t->n_experts; e++) {
        int n;
        const uint16_t *reps = plan_replicas(t, layer, e, &n);
        for (int i = 0; i < n; i++) {
            load[reps[i]] += w[e] / n;
            if (holds)
                holds[reps[i]] = 1;
        }
        total += w[e];
    }
    for (int r = 0; r < P; r++) {
        holders += holds ? holds[r] : 1;
        mx = load[r] > mx ? load[r] : mx;
    }
    free(holds);
    if (total <= 0 || holders == 0)
        return 1.0;
    return mx / (total / holders);
}

void plan_report_free(plan_report *r)
{
    free(r->layer_before);
    free(r->layer_after);
    free(r->layer_moved);
    memset(r, 0, sizeof *r);
}

/* Slots for G' eligible ranks: the spec's E + redundant scaled to them, within what EPLB can
 * place (every expert and every rank a slot, no expert twice on a rank, max_per_rank). */
static int plan_rebalance_slots(const plan_shape *s, int G, int max_per_rank, ep_err *err)
{
    int E = s->n_experts;
    int64_t R = E + s->redundant;
    if (G != s->n_ranks)
        R = (R * G + s->n_ranks / 2) / s->n_ranks;
    if (R < E)
        R = E;
    if (R < G)
        R = G;
    if (R > (int64_t)E * G)
        R = (int64_t)E * G;
    if (max_per_rank > 0 && R > (int64_t)max_per_rank * G)
        R = (int64_t)max_per_rank * G;
    if (R < E || R < G)
        return ep_err_set(err,
                          "rebalance: %d workers with at most %d experts each cannot hold the "
                          "%d experts",
                          G, max_per_rank, E);
    return (int)R;
}

typedef struct plan_match {
    int ov, pack, rank;
} plan_match;

static int plan_by_overlap(const void *a, const void *b)
{
    const plan_match *x = a, *y = b;
    if (x->ov != y->ov)
        return x->ov > y->ov ? -1 : 1;
    if (x->pack != y->pack)
        return x->pack < y->pack ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Which eligible rank takes each pack (compact rank) of one layer's plan: the rank that already
 * holds most of the pack's experts (greedy, largest overlap first), within the pack's node when
 * hierarchical; packs left take the ranks left in ascending order. assign[G], elig[G]: the
 * eligible ranks, compact order. */
static int plan_match_packs(const plan_table *from, int layer, const int *p2l, const int *p2r,
                            int R, const int *elig, int G, bool by_node, int *assign, ep_err *err)
{
    int P = from->n_ranks;
    int *compact = malloc((size_t)P * sizeof *compact); /* rank -> compact index, -1 */
    uint8_t *taken = calloc((size_t)G, 1);
    size_t cap = (size_t)R * 4 + 16, n = 0;
    plan_match *m = malloc(cap * sizeof *m);
    int rc = 0;
    if (compact == NULL || taken == NULL || m == NULL) {
        rc = ep_err_set(err, "rebalance: out of memory");
        goto done;
    }
    for (int r = 0; r < P; r++)
        compact[r] = -1;
    for (int g = 0; g < G; g++) {
        compact[elig[g]] = g;
        assign[g] = -1;
    }
    for (int s = 0; s < R; s++) { /* (pack, rank) pairs, one per shared expert */
        int k;
        const uint16_t *reps = plan_replicas(from, layer, p2l[s], &k);
        for (int i = 0; i < k; i++) {
            int g = compact[reps[i]];
            if (g < 0 ||
                (by_node && from->shape.rank_node[elig[p2r[s]]] != from->shape.rank_node[reps[i]]))
                continue;
            if (n == cap) {
                plan_match *bigger = realloc(m, 2 * cap * sizeof *m);
                if (bigger == NULL) {
                    rc = ep_err_set(err, "rebalance: out of memory");
                    goto done;
                }
                m = bigger;
                cap *= 2;
            }
            m[n++] = (plan_match){.ov = 1, .pack = p2r[s], .rank = g};
        }
    }
    /* count equal (pack, rank) pairs */
    qsort(m, n, sizeof *m, plan_by_overlap);
    size_t u = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && m[j].pack == m[i].pack && m[j].rank == m[i].rank)
            j++;
        m[u] = m[i];
        m[u++].ov = (int)(j - i);
        i = j;
    }
    qsort(m, u, sizeof *m, plan_by_overlap);
    for (size_t i = 0; i < u; i++)
        if (assign[m[i].pack] < 0 && !taken[m[i].rank]) {
            assign[m[i].pack] = m[i].rank;
            taken[m[i].rank] = 1;
        }
    for (int c = 0; c < G; c++) { /* the rest in order, within the node when by_node */
        if (assign[c] >= 0)
            continue;
        for (int g = 0; g < G; g++)
            if (!taken[g] &&
                (!by_node || from->shape.rank_node[elig[g]] == from->shape.rank_node[elig[c]])) {
                assign[c] = g;
                taken[g] = 1;
                break;
            }
        if (assign[c] < 0) {
            rc = ep_err_set(err, "rebalance: no rank left for pack %d", c);
            goto done;
        }
    }
    for (int c = 0; c < G; c++)
        assign[c] = elig[assign[c]];
done:
    free(compact);
    free(taken);
    free(m);
    return rc;
}

/* The node layout of the eligible ranks for EPLB: n_nodes with ranks, when each has the same
 * number (else 1: global). */
static int plan_eligible_nodes(const plan_shape *s, const int *elig, int G)
{
    int n_nodes = 0, per = -1, count = 0;
    for (int g = 0; g <= G; g++) {
        if (g > 0 && (g == G || s->rank_node[elig[g]] != s->rank_node[elig[g - 1]])) {
            if (per >= 0 && per != count)
                return 1;
            per = count;
            n_nodes++;
            count = 0;
        }
        count++;
    }
    return n_nodes > 0 ? n_nodes : 1;
}

static int plan_rebalance_layers(const plan_table *from, const plan_table *base,
                                 const double *weight, const int *elig, int G, int R,
                                 pl_builder *bl, bool *hier, ep_err *err)
{
    int E = from->n_experts, L = from->n_layers;
    eplb_shape es = {.n_layers = 1,
                     .n_experts = E,
                     .n_slots = R,
                     .n_ranks = G,
                     .n_nodes = plan_eligible_nodes(&from->shape, elig, G),
                     .n_groups = from->shape.n_groups};
    int *p2l = malloc((size_t)R * sizeof *p2l), *p2r = malloc((size_t)R * sizeof *p2r);
    int *assign = malloc((size_t)G * sizeof *assign), rc = 0;
    plan_layer_buf b = {0};
    if (!p2l || !p2r || !assign || plan_buf_init(&b, E, from->n_ranks) != 0) {
        rc = ep_err_set(err, "rebalance: out of memory");
        goto done;
    }
    *hier = eplb_hierarchical(&es);
    for (int l = 0; rc == 0 && l < L; l++) {
        const double *w = weight + (size_t)l * E;
        double total = 0;
        for (int e = 0; e < E; e++)
            total += w[e];
        if (total <= 0) { /* no load seen: the layer keeps its table (failover rule applied) */
            size_t o = 0;
            for (int e = 0; e < E; e++) {
                int n;
                const uint16_t *reps = plan_replicas(base, l, e, &n);
                b.count[e] = (uint16_t)n;
                memcpy(b.rank + o, reps, (size_t)n * 2);
                o += (size_t)n;
            }
            rc = pl_builder_set(bl, l, b.count, b.rank, err);
            continue;
        }
        rc = eplb_plan(&es, w, p2l, p2r, err);
        if (rc == 0)
            rc = plan_match_packs(base, l, p2l, p2r, R, elig, G, *hier, assign, err);
        if (rc == 0)
            rc = plan_eplb_layer(bl, l, E, R, p2l, p2r, assign, err);
    }
done:
    free(p2l);
    free(p2r);
    free(assign);
    plan_buf_free(&b);
    return rc;
}

static int plan_fill_report(const plan_table *from, const plan_table *t, const double *weight,
                            plan_report *rep)
{
    int L = t->n_layers, E = t->n_experts, P = t->n_ranks, loaded = 0;
    memset(rep, 0, sizeof *rep);
    rep->n_layers = L;
    rep->layer_before = calloc((size_t)L, sizeof(double));
    rep->layer_after = calloc((size_t)L, sizeof(double));
    rep->layer_moved = calloc((size_t)L, sizeof(int));
    double *load = malloc((size_t)P * sizeof *load);
    if (!rep->layer_before || !rep->layer_after || !rep->layer_moved || !load) {
        free(load);
        plan_report_free(rep);
        return -1;
    }
    for (int l = 0; l < L; l++) {
        const double *w = weight + (size_t)l * E;
        double total = 0;
        for (int e = 0; e < E; e++) {
            total += w[e];
            int n;
            const uint16_t *reps = plan_replicas(t, l, e, &n);
            for (int i = 0; i < n; i++)
                rep->layer_moved[l] += !pl_holds(from->pl, l, e, reps[i]);
        }
        rep->moved += rep->layer_moved[l];
        if (total <= 0)
            continue;
        rep->layer_before[l] = plan_layer_balance(from, l, w, load);
        rep->layer_after[l] = plan_layer_balance(t, l, w, load);
        rep->balance_before += rep->layer_before[l];
        rep->balance_after += rep->layer_after[l];
        loaded++;
    }
    if (loaded > 0) {
        rep->balance_before /= loaded;
        rep->balance_after /= loaded;
    } else {
        rep->balance_before = rep->balance_after = 1.0;
    }
    free(load);
    return 0;
}

plan_table *plan_rebalance(const plan_table *from, const double *weight, const uint8_t *eligible,
                           int max_per_rank, uint64_t epoch, plan_report *rep, ep_err *err)
{
    int P = from->n_ranks, G = 0;
    int *elig = malloc((size_t)P * sizeof *elig);
    plan_table *base = NULL, *t = NULL;
    pl_builder *bl = NULL;
    pl_table *pl = NULL;
    if (elig == NULL) {
        ep_err_set(err, "rebalance: out of memory");
        goto done;
    }
    for (int r = 0; r < P; r++)
        if (eligible[r])
            elig[G++] = r;
    /* the eligible ranks first take over what ineligible ones held (layers without load keep
     * that), then EPLB plans the loaded layers */
    base = plan_spread(from, eligible, max_per_rank, epoch, err);
    int R = base ? plan_rebalance_slots(&from->shape, G, max_per_rank, err) : -1;
    if (R < 0 || (bl = pl_builder_new(from->n_layers, from->n_experts, P, err)) == NULL)
        goto done;
    bool hier = false;
    if (plan_rebalance_layers(from, base, weight, elig, G, R, bl, &hier, err) != 0)
        goto done;
    if ((pl = pl_builder_finish(&bl, err)) == NULL ||
        (t = plan_from_pl(&from->shape, &pl, epoch, err)) == NULL)
        goto done;
    t->placement = from->placement;
    if (rep != NULL) {
        if (plan_fill_report(from, t, weight, rep) != 0) {
            ep_err_set(err, "rebalance: out of memory");
            plan_free(&t);
            goto done;
        }
        rep->hierarchical = hier;
    }
done:
    pl_builder_free(&bl);
    plan_free(&base);
    free(elig);
    return t;
}

/* ---- epochs ---- */

struct plan_epochs {
    plan_table *base;    /* the spec's placement */
    plan_table *current; /* acknowledged by every member */
    plan_table *latest;  /* last sent (== current unless applying) */
    plan_table *pending; /* decided, not sent yet (phase pending) */
    plan_table *staged;  /* a rebalance being prepared (phase staging) */
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
    plan_free(&pe->staged);
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
    static const char *const names[] = {"forming",  "stable",  "pending",
                                        "applying", "blocked", "staging"};
    return (unsigned)p < 6 ? names[p] : "?";
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

const plan_table *plan_staged(const plan_epochs *pe)
{
    return pe->phase == PLAN_STAGING ? pe->staged : NULL;
}

const char *plan_problem(const plan_epochs *pe)
{
    return pe->phase == PLAN_BLOCKED ? pe->problem : "";
}

spec_rejoin plan_rejoin(const plan_epochs *pe)
{
    return pe->rejoin;
}

int plan_max_per_rank(const plan_epochs *pe)
{
    return pe->max_per_rank;
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

void plan_unstage(plan_epochs *pe, const char *why)
{
    if (pe->phase != PLAN_STAGING)
        return;
    log_warn("placement: staged epoch %" PRIu64 " abandoned: %s", pe->staged->epoch, why);
    plan_free(&pe->staged);
    pe->phase = PLAN_STABLE;
}

static int plan_decide(plan_epochs *pe, const uint8_t *eligible, bool from_base, bool force,
                       const char *why)
{
    if (pe->phase == PLAN_FORMING)
        return 0;
    plan_unstage(pe, why);
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
    plan_free(&pe->staged);
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
    /* the same world: the tables in force take the new rules (redundancy, groups, nodes) */
    plan_table *ts[3] = {pe->current, pe->latest, pe->pending};
    for (int i = 0; i < 3; i++)
        if (ts[i] != NULL)
            ts[i]->shape = b->shape;
    return 0;
}

const plan_table *plan_stage(plan_epochs *pe, plan_table **t_p, const char *why)
{
    if (pe->phase != PLAN_STABLE) {
        plan_free(t_p);
        return NULL;
    }
    pe->staged = *t_p;
    *t_p = NULL;
    pe->staged->epoch = ++pe->last_epoch;
    pe->phase = PLAN_STAGING;
    snprintf(pe->why, sizeof pe->why, "%s", why);
    log_info("placement: epoch %" PRIu64 " staged (%d members): %s", pe->staged->epoch,
             pe->staged->n_members, why);
    return pe->staged;
}

const plan_table *plan_commit(plan_epochs *pe)
{
    if (pe->phase != PLAN_STAGING)
        return NULL;
    plan_free(&pe->latest);
    pe->latest = pe->staged;
    pe->staged = NULL;
    pe->phase = PLAN_APPLYING;
    return pe->latest;
}
