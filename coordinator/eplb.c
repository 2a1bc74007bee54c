/*
 * eplb.c — DeepSeek's EPLB in C (see eplb.h). Written from the algorithm's description; the
 * packs are kept in a binary heap ordered by (load, index) so that a plan for 1,024 ranks stays
 * O(n log m) per layer.
 */
#include "coordinator/eplb.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int eplb_check(const eplb_shape *s, ep_err *err)
{
    int E = s->n_experts, R = s->n_slots, G = s->n_ranks, N = s->n_nodes;
    if (s->n_layers < 1 || E < 1 || G < 1 || N < 1 || s->n_groups < 1)
        return ep_err_set(err,
                          "eplb: %d layers, %d experts, %d ranks, %d nodes, %d groups "
                          "(each must be >= 1)",
                          s->n_layers, E, G, N, s->n_groups);
    if (R < E || R < G)
        return ep_err_set(err,
                          "eplb: %d slots cannot hold the %d experts on %d ranks (each "
                          "expert needs a slot, each rank at least one)",
                          R, E, G);
    if ((int64_t)R > (int64_t)E * G)
        return ep_err_set(err,
                          "eplb: %d slots need more than one copy of an expert on some rank "
                          "(at most %d experts x %d ranks)",
                          R, E, G);
    return 0;
}

bool eplb_hierarchical(const eplb_shape *s)
{
    int g = s->n_groups, N = s->n_nodes, E = s->n_experts, G = s->n_ranks, R = s->n_slots;
    if (N <= 1 || g % N != 0 || E % g != 0 || G % N != 0 || R % G != 0)
        return false;
    /* each node's copies must fit on its ranks once each, every rank holding one */
    return R / N >= G / N && (int64_t)(R / N) <= (int64_t)(E / N) * (G / N);
}

/* ---- pack ---- */

typedef struct eplb_item {
    double w;
    int i;
} eplb_item;

static int eplb_by_weight_desc(const void *a, const void *b)
{
    const eplb_item *x = a, *y = b;
    if (x->w != y->w)
        return x->w > y->w ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i; /* ties: lower index first */
}

typedef struct eplb_heap {
    int *pack; /* heap of pack indices */
    int n;
    const double *load;
} eplb_heap;

static bool eplb_less(const eplb_heap *h, int a, int b)
{
    double la = h->load[a], lb = h->load[b];
    return la < lb || (la == lb && a < b);
}

static void eplb_push(eplb_heap *h, int p)
{
    int i = h->n++;
    h->pack[i] = p;
    while (i > 0 && eplb_less(h, h->pack[i], h->pack[(i - 1) / 2])) {
        int t = h->pack[i];
        h->pack[i] = h->pack[(i - 1) / 2];
        h->pack[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static int eplb_pop(eplb_heap *h)
{
    int top = h->pack[0];
    h->pack[0] = h->pack[--h->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && eplb_less(h, h->pack[l], h->pack[m]))
            m = l;
        if (r < h->n && eplb_less(h, h->pack[r], h->pack[m]))
            m = r;
        if (m == i)
            break;
        int t = h->pack[i];
        h->pack[i] = h->pack[m];
        h->pack[m] = t;
        i = m;
    }
    return top;
}

/* Whether pack p (its first fill items in items[p*cap ..]) holds key k. */
static bool eplb_pack_has(const int *items, const int *key, int cap, int p, int fill, int k)
{
    for (int i = 0; i < fill; i++)
        if (key[items[(size_t)p * cap + i]] == k)
            return true;
    return false;
}

/* Item it was put into a pack that already holds its key (no pack with room was free of it):
 * swap it with an item j of another pack q such that neither pack then holds a key twice. */
static void eplb_unclash(const double *w, const int *key, int cap, int m, int *items,
                         const int *fill, double *load, int *pack, int *slot, int it)
{
    int p = pack[it], k = key[it];
    for (int q = 0; q < m; q++) {
        if (q == p || eplb_pack_has(items, key, cap, q, fill[q], k))
            continue;
        for (int i = 0; i < fill[q]; i++) {
            int j = items[(size_t)q * cap + i];
            if (key[j] == k || eplb_pack_has(items, key, cap, p, fill[p], key[j]))
                continue;
            items[(size_t)q * cap + i] = it;
            items[(size_t)p * cap + slot[it]] = j;
            int sj = slot[j];
            slot[j] = slot[it];
            slot[it] = sj;
            pack[j] = p;
            pack[it] = q;
            load[p] += w[j] - w[it];
            load[q] += w[it] - w[j];
            return;
        }
    }
}

/* Whether pack p may take another item: below base, or at base while extra slots are left. */
static bool eplb_room(const int *fill, int p, int base, int extra_left)
{
    return fill[p] < base || (fill[p] == base && extra_left > 0);
}

int eplb_pack(const double *w, const int *key, int n, int m, int *pack, int *slot, ep_err *err)
{
    if (m < 1 || n < m)
        return ep_err_set(err, "eplb: %d items cannot fill %d packs", n, m);
    /* every pack takes base items; n % m packs take one more: the first that ask for it */
    int base = n / m, extra = n % m, cap = base + (extra > 0);
    if (n == m) { /* DeepSeek's shortcut: item i -> pack i */
        for (int i = 0; i < n; i++) {
            pack[i] = i;
            slot[i] = 0;
        }
        return 0;
    }
    eplb_item *order = malloc((size_t)n * sizeof *order);
    int *items = malloc((size_t)m * (size_t)cap * sizeof *items);
    int *fill = calloc((size_t)m, sizeof *fill), *skipped = malloc((size_t)m * sizeof *skipped);
    double *load = calloc((size_t)m, sizeof *load);
    eplb_heap h = {.pack = malloc((size_t)m * sizeof(int)), .load = load};
    int rc = 0;
    if (!order || !items || !fill || !skipped || !load || !h.pack) {
        rc = ep_err_set(err, "eplb: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++)
        order[i] = (eplb_item){.w = w[i], .i = i};
    qsort(order, (size_t)n, sizeof *order, eplb_by_weight_desc);
    for (int p = 0; p < m; p++)
        eplb_push(&h, p);
    for (int k = 0; k < n; k++) {
        int it = order[k].i, n_skip = 0, p = -1;
        /* the lightest pack with room and without a copy of this item's expert; packs passed
         * over go back, packs that lost their room (the extra slots ran out) are dropped */
        while (h.n > 0) {
            int q = eplb_pop(&h);
            if (!eplb_room(fill, q, base, extra))
                continue;
            if (key && key[it] >= 0 && eplb_pack_has(items, key, cap, q, fill[q], key[it])) {
                skipped[n_skip++] = q;
                continue;
            }
            p = q;
            break;
        }
        bool clash = p < 0; /* every pack with room holds one: the lightest after all */
        if (clash) {
            p = skipped[0];
            memmove(skipped, skipped + 1, (size_t)(--n_skip) * sizeof *skipped);
        }
        if (fill[p] == base)
            extra--;
        pack[it] = p;
        slot[it] = fill[p];
        items[(size_t)p * cap + fill[p]++] = it;
        load[p] += w[it];
        if (eplb_room(fill, p, base, extra))
            eplb_push(&h, p);
        for (int i = 0; i < n_skip; i++)
            eplb_push(&h, skipped[i]);
        if (clash) {
            eplb_unclash(w, key, cap, m, items, fill, load, pack, slot, it);
            h.n = 0; /* the swap changed another pack's load: rebuild the heap (rare) */
            for (int q = 0; q < m; q++)
                if (eplb_room(fill, q, base, extra))
                    eplb_push(&h, q);
        }
    }
done:
    free(order);
    free(items);
    free(fill);
    free(skipped);
    free(load);
    free(h.pack);
    return rc;
}

/* ---- replicate ---- */

int eplb_replicate(const double *w, int n_log, int n_phy, int cap, int *phy2log, int *cnt,
                   ep_err *err)
{
    if (n_phy < n_log || (int64_t)n_phy > (int64_t)n_log * cap)
        return ep_err_set(err, "eplb: %d copies of %d experts with at most %d copies each", n_phy,
                          n_log, cap);
    for (int e = 0; e < n_log; e++) {
        phy2log[e] = e;
        cnt[e] = 1;
    }
    for (int i = n_log; i < n_phy; i++) {
        int best = -1;
        for (int e = 0; e < n_log; e++)
            if (cnt[e] < cap && (best < 0 || w[e] / cnt[e] > w[best] / cnt[best]))
                best = e;
        phy2log[i] = best;
        cnt[best]++;
    }
    return 0;
}

/* ---- one node of one layer: replicate its experts, pack the copies onto its ranks ---- */

typedef struct eplb_scratch {
    double *w, *wphy;
    int *phy2log, *cnt, *pack, *slot, *fill;
} eplb_scratch;

/* The node's n_log experts (weights w, ids log_id[i]) into its n_phy slots over its m ranks
 * (global ranks first..first+m-1): writes out_log[n_phy] and out_rank[n_phy], rank by rank,
 * each rank's copies in the order it took them. */
static int eplb_node(const double *w, const int *log_id, int n_log, int n_phy, int m, int first,
                     int *out_log, int *out_rank, eplb_scratch *s, ep_err *err)
{
    if (eplb_replicate(w, n_log, n_phy, m, s->phy2log, s->cnt, err) != 0)
        return -1;
    for (int i = 0; i < n_phy; i++)
        s->wphy[i] = w[s->phy2log[i]] / s->cnt[s->phy2log[i]];
    if (eplb_pack(s->wphy, s->phy2log, n_phy, m, s->pack, s->slot, err) != 0)
        return -1;
    for (int p = 0; p <= m; p++)
        s->fill[p] = 0;
    for (int i = 0; i < n_phy; i++)
        s->fill[s->pack[i] + 1]++;
    for (int p = 0; p < m; p++) /* fill[p]: the first output slot of pack p */
        s->fill[p + 1] += s->fill[p];
    for (int i = 0; i < n_phy; i++) {
        int o = s->fill[s->pack[i]] + s->slot[i];
        out_log[o] = log_id[s->phy2log[i]];
        out_rank[o] = first + s->pack[i];
    }
    return 0;
}

/* One layer: groups onto nodes (hierarchical), then each node on its own. */
static int eplb_layer(const eplb_shape *sh, bool hier, const double *w, int *out_log, int *out_rank,
                      eplb_scratch *s, int *mlog, ep_err *err)
{
    int E = sh->n_experts, R = sh->n_slots, G = sh->n_ranks;
    int N = hier ? sh->n_nodes : 1, g = hier ? sh->n_groups : 1, gsize = E / g;
    /* mlog[node*E/N + j]: the logical experts of each node, in group order */
    if (N == 1) {
        for (int e = 0; e < E; e++)
            mlog[e] = e;
    } else {
        for (int j = 0; j < g; j++) {
            s->w[j] = 0;
            for (int i = 0; i < gsize; i++)
                s->w[j] += w[j * gsize + i];
        }
        if (eplb_pack(s->w, NULL, g, N, s->pack, s->slot, err) != 0)
            return -1;
        for (int j = 0; j < g; j++)
            for (int i = 0; i < gsize; i++)
                mlog[(s->pack[j] * (g / N) + s->slot[j]) * gsize + i] = j * gsize + i;
    }
    int En = E / N, Rn = R / N;
    for (int n = 0; n < N; n++) {
        double *wn = s->w;
        for (int i = 0; i < En; i++)
            wn[i] = w[mlog[n * En + i]];
        if (eplb_node(wn, mlog + n * En, En, Rn, G / N, n * (G / N), out_log + n * Rn,
                      out_rank + n * Rn, s, err) != 0)
            return -1;
    }
    return 0;
}

int eplb_plan(const eplb_shape *sh, const double *weight, int *phy2log, int *phy2rank, ep_err *err)
{
    if (eplb_check(sh, err) != 0)
        return -1;
    bool hier = eplb_hierarchical(sh);
    size_t E = (size_t)sh->n_experts, R = (size_t)sh->n_slots;
    size_t big = (E > R ? E : R) + (size_t)sh->n_groups;
    eplb_scratch s = {.w = malloc(big * sizeof(double)),
                      .wphy = malloc(big * sizeof(double)),
                      .phy2log = malloc(big * sizeof(int)),
                      .cnt = malloc(big * sizeof(int)),
                      .pack = malloc(big * sizeof(int)),
                      .slot = malloc(big * sizeof(int)),
                      .fill = malloc(((size_t)sh->n_ranks + 1) * sizeof(int))};
    int *mlog = malloc(E * sizeof *mlog), rc = 0;
    if (!s.w || !s.wphy || !s.phy2log || !s.cnt || !s.pack || !s.slot || !s.fill || !mlog)
        rc = ep_err_set(err, "eplb: out of memory");
    for (int l = 0; rc == 0 && l < sh->n_layers; l++)
        rc = eplb_layer(sh, hier, weight + (size_t)l * E, phy2log + (size_t)l * R,
                        phy2rank + (size_t)l * R, &s, mlog, err);
    free(s.w);
    free(s.wphy);
    free(s.phy2log);
    free(s.cnt);
    free(s.pack);
    free(s.slot);
    free(s.fill);
    free(mlog);
    return rc;
}
