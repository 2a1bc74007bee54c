/*
 * placement.c — placement tables (see placement.h).
 *
 * Storage: n_tables distinct layer tables; table j's replicas of expert e are
 * rank[off[j*E + e] .. off[j*E + e + 1]), ascending. layer_table[l] names layer l's table.
 */
#include "common/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"

struct pl_table {
    int n_layers, n_experts, n_ranks;
    int n_tables;
    uint16_t *layer_table; /* [n_layers] */
    uint32_t *off;         /* [n_tables * E + 1] */
    uint16_t *rank;        /* [off[n_tables * E]] */
};

struct pl_builder {
    int n_layers, n_experts, n_ranks;
    uint16_t **count; /* [n_layers][E], NULL until set */
    uint16_t **rank;  /* [n_layers][sum of that layer's counts] */
};

static int pl_check_dims(int L, int E, int P, ep_err *err)
{
    if (L < 1 || L > MC_MAX_LAYERS + MC_MAX_MTP || E < 1 || E > MC_MAX_EXPERTS || P < 1 ||
        P > EP_MAX_WORKERS)
        return ep_err_set(err,
                          "placement: %d layers, %d experts, %d ranks (expected 1..%d, 1..%d, "
                          "1..%d)",
                          L, E, P, MC_MAX_LAYERS + MC_MAX_MTP, MC_MAX_EXPERTS, EP_MAX_WORKERS);
    return 0;
}

void pl_free(pl_table **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    free((*self_p)->layer_table);
    free((*self_p)->off);
    free((*self_p)->rank);
    free(*self_p);
    *self_p = NULL;
}

static pl_table *pl_alloc(int L, int E, int P, int n_tables, size_t n_ranks_total)
{
    pl_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->n_layers = L;
    t->n_experts = E;
    t->n_ranks = P;
    t->n_tables = n_tables;
    t->layer_table = calloc((size_t)L, sizeof *t->layer_table);
    t->off = calloc((size_t)n_tables * (size_t)E + 1, sizeof *t->off);
    t->rank = malloc((n_ranks_total ? n_ranks_total : 1) * sizeof *t->rank);
    if (t->layer_table == NULL || t->off == NULL || t->rank == NULL)
        pl_free(&t);
    return t;
}

pl_table *pl_flat(int n_layers, int n_experts, int n_ranks, const uint32_t *owner, ep_err *err)
{
    if (pl_check_dims(n_layers, n_experts, n_ranks, err) != 0)
        return NULL;
    for (int e = 0; e < n_experts; e++)
        if (owner[e] >= (uint32_t)n_ranks) {
            ep_err_set(err, "placement: expert %d owned by rank %u, expected < %d", e, owner[e],
                       n_ranks);
            return NULL;
        }
    pl_table *t = pl_alloc(n_layers, n_experts, n_ranks, 1, (size_t)n_experts);
    if (t == NULL) {
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    for (int e = 0; e < n_experts; e++) {
        t->off[e] = (uint32_t)e;
        t->rank[e] = (uint16_t)owner[e];
    }
    t->off[n_experts] = (uint32_t)n_experts;
    return t;
}

pl_table *pl_copy(const pl_table *t)
{
    size_t n = t->off[(size_t)t->n_tables * t->n_experts];
    pl_table *c = pl_alloc(t->n_layers, t->n_experts, t->n_ranks, t->n_tables, n);
    if (c == NULL)
        return NULL;
    memcpy(c->layer_table, t->layer_table, (size_t)t->n_layers * sizeof *c->layer_table);
    memcpy(c->off, t->off, ((size_t)t->n_tables * t->n_experts + 1) * sizeof *c->off);
    memcpy(c->rank, t->rank, n * sizeof *c->rank);
    return c;
}

/* ---- builder ---- */

pl_builder *pl_builder_new(int n_layers, int n_experts, int n_ranks, ep_err *err)
{
    if (pl_check_dims(n_layers, n_experts, n_ranks, err) != 0)
        return NULL;
    pl_builder *b = calloc(1, sizeof *b);
    if (b != NULL) {
        b->count = calloc((size_t)n_layers, sizeof *b->count);
        b->rank = calloc((size_t)n_layers, sizeof *b->rank);
    }
    if (b == NULL || b->count == NULL || b->rank == NULL) {
        pl_builder_free(&b);
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    b->n_layers = n_layers;
    b->n_experts = n_experts;
    b->n_ranks = n_ranks;
    return b;
}

void pl_builder_free(pl_builder **b_p)
{
    pl_builder *b = b_p ? *b_p : NULL;
    if (b == NULL)
        return;
    for (int l = 0; b->count && l < b->n_layers; l++) {
        free(b->count[l]);
        free(b->rank[l]);
    }
    free(b->count);
    free(b->rank);
    free(b);
    *b_p = NULL;
}

static void pl_sort16(uint16_t *a, int n)
{
    for (int i = 1; i < n; i++) { /* replica lists are short: insertion sort */
        uint16_t v = a[i];
        int j = i - 1;
        while (j >= 0 && a[j] > v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

int pl_builder_set(pl_builder *b, int layer, const uint16_t *count, const uint16_t *ranks,
                   ep_err *err)
{
    int E = b->n_experts, P = b->n_ranks;
    if (layer < 0 || layer >= b->n_layers)
        return ep_err_set(err, "placement: layer %d outside 0..%d", layer, b->n_layers - 1);
    size_t total = 0;
    for (int e = 0; e < E; e++) {
        if (count[e] < 1 || count[e] > P)
            return ep_err_set(err, "placement: layer %d expert %d has %u replicas (expected 1..%d)",
                              layer, e, count[e], P);
        total += count[e];
    }
    uint16_t *c = malloc((size_t)E * sizeof *c), *r = malloc(total * sizeof *r);
    if (c == NULL || r == NULL) {
        free(c);
        free(r);
        return ep_err_set(err, "placement: out of memory");
    }
    memcpy(c, count, (size_t)E * sizeof *c);
    memcpy(r, ranks, total * sizeof *r);
    size_t o = 0;
    for (int e = 0; e < E; o += c[e], e++) {
        pl_sort16(r + o, c[e]);
        for (int i = 0; i < c[e]; i++)
            if (r[o + i] >= P || (i > 0 && r[o + i] == r[o + i - 1])) {
                int bad = r[o + i];
                free(c);
                free(r);
                return ep_err_set(err, "placement: layer %d expert %d: rank %d %s", layer, e, bad,
                                  bad >= P ? "out of range" : "listed twice");
            }
    }
    free(b->count[layer]);
    free(b->rank[layer]);
    b->count[layer] = c;
    b->rank[layer] = r;
    return 0;
}

static size_t pl_layer_sum(const uint16_t *count, int E)
{
    size_t n = 0;
    for (int e = 0; e < E; e++)
        n += count[e];
    return n;
}

pl_table *pl_builder_finish(pl_builder **b_p, ep_err *err)
{
    pl_builder *b = *b_p;
    int L = b->n_layers, E = b->n_experts;
    int *first = malloc((size_t)L * sizeof *first); /* the layer whose table layer l reuses */
    size_t total = 0;
    int n_tables = 0;
    pl_table *t = NULL;
    if (first == NULL)
        goto oom;
    for (int l = 0; l < L; l++) {
        if (b->count[l] == NULL) {
            ep_err_set(err, "placement: layer %d was never set", l);
            goto fail;
        }
        size_t n = pl_layer_sum(b->count[l], E);
        first[l] = l;
        for (int j = 0; j < l && first[l] == l; j++)
            if (first[j] == j && memcmp(b->count[j], b->count[l], (size_t)E * 2) == 0 &&
                memcmp(b->rank[j], b->rank[l], n * 2) == 0)
                first[l] = j;
        if (first[l] == l) {
            total += n;
            n_tables++;
        }
    }
    t = pl_alloc(L, E, b->n_ranks, n_tables, total);
    if (t == NULL)
        goto oom;
    int j = 0;
    size_t o = 0;
    for (int l = 0; l < L; l++) {
        if (first[l] != l) {
            t->layer_table[l] = t->layer_table[first[l]];
            continue;
        }
        t->layer_table[l] = (uint16_t)j;
        size_t n = pl_layer_sum(b->count[l], E);
        memcpy(t->rank + o, b->rank[l], n * 2);
        for (int e = 0; e < E; e++) {
            t->off[(size_t)j * E + e] = (uint32_t)o;
            o += b->count[l][e];
        }
        j++;
    }
    t->off[(size_t)n_tables * E] = (uint32_t)o;
    free(first);
    pl_builder_free(b_p);
    return t;
oom:
    ep_err_set(err, "placement: out of memory");
fail:
    free(first);
    pl_builder_free(b_p);
    return NULL;
}

/* ---- queries ---- */

int pl_layers(const pl_table *t)
{
    return t->n_layers;
}

int pl_experts(const pl_table *t)
{
    return t->n_experts;
}

int pl_ranks(const pl_table *t)
{
    return t->n_ranks;
}

int pl_stored(const pl_table *t)
{
    return t->n_tables;
}

int pl_layer_stored(const pl_table *t, int layer)
{
    return t->layer_table[layer];
}

const uint16_t *pl_replicas(const pl_table *t, int layer, int expert, int *n)
{
    size_t i = (size_t)t->layer_table[layer] * t->n_experts + (size_t)expert;
    *n = (int)(t->off[i + 1] - t->off[i]);
    return t->rank + t->off[i];
}

bool pl_holds(const pl_table *t, int layer, int expert, int rank)
{
    if (layer < 0 || layer >= t->n_layers || expert < 0 || expert >= t->n_experts)
        return false;
    int n;
    const uint16_t *r = pl_replicas(t, layer, expert, &n);
    for (int i = 0; i < n && r[i] <= rank; i++)
        if (r[i] == rank)
            return true;
    return false;
}

int pl_rank_experts(const pl_table *t, int layer, int rank, int *out, int cap)
{
    if (layer < 0 || layer >= t->n_layers || rank < 0 || rank >= t->n_ranks)
        return -1;
    int k = 0;
    for (int e = 0; e < t->n_experts; e++) {
        if (!pl_holds(t, layer, e, rank))
            continue;
        if (k < cap)
            out[k] = e;
        k++;
    }
    return k;
}

/* Experts rank holds in each stored table, into per_table[n_tables]. */
static void pl_rank_per_table(const pl_table *t, int rank, int *per_table)
{
    for (int j = 0; j < t->n_tables; j++) {
        per_table[j] = 0;
        for (int e = 0; e < t->n_experts; e++) {
            size_t i = (size_t)j * t->n_experts + (size_t)e;
            for (uint32_t k = t->off[i]; k < t->off[i + 1] && t->rank[k] <= rank; k++)
                per_table[j] += t->rank[k] == rank;
        }
    }
}

int pl_rank_slots(const pl_table *t, int rank)
{
    int *pt = malloc((size_t)t->n_tables * sizeof *pt), n = 0;
    if (pt == NULL)
        return -1;
    pl_rank_per_table(t, rank, pt);
    for (int l = 0; l < t->n_layers; l++)
        n += pt[t->layer_table[l]];
    free(pt);
    return n;
}

int pl_rank_max(const pl_table *t, int rank)
{
    int *pt = malloc((size_t)t->n_tables * sizeof *pt), n = 0;
    if (pt == NULL)
        return -1;
    pl_rank_per_table(t, rank, pt);
    for (int j = 0; j < t->n_tables; j++)
        n = pt[j] > n ? pt[j] : n;
    free(pt);
    return n;
}

void pl_rank_counts(const pl_table *t, int *max, int *slots)
{
    int P = t->n_ranks, E = t->n_experts;
    int *uses = calloc((size_t)t->n_tables, sizeof *uses), *per = malloc((size_t)P * sizeof *per);
    memset(max, 0, (size_t)P * sizeof *max);
    memset(slots, 0, (size_t)P * sizeof *slots);
    if (uses == NULL || per == NULL) { /* slow but right */
        for (int r = 0; r < P; r++) {
            max[r] = pl_rank_max(t, r);
            slots[r] = pl_rank_slots(t, r);
        }
        free(uses);
        free(per);
        return;
    }
    for (int l = 0; l < t->n_layers; l++)
        uses[t->layer_table[l]]++;
    for (int j = 0; j < t->n_tables; j++) {
        memset(per, 0, (size_t)P * sizeof *per);
        for (uint32_t k = t->off[(size_t)j * E]; k < t->off[(size_t)(j + 1) * E]; k++)
            per[t->rank[k]]++;
        for (int r = 0; r < P; r++) {
            slots[r] += per[r] * uses[j];
            max[r] = per[r] > max[r] ? per[r] : max[r];
        }
    }
    free(uses);
    free(per);
}

int pl_members(const pl_table *t, uint8_t *member)
{
    memset(member, 0, (size_t)t->n_ranks);
    size_t n = t->off[(size_t)t->n_tables * t->n_experts];
    for (size_t k = 0; k < n; k++)
        member[t->rank[k]] = 1;
    int m = 0;
    for (int r = 0; r < t->n_ranks; r++)
        m += member[r];
    return m;
}

long pl_total_slots(const pl_table *t)
{
    long n = 0;
    for (int l = 0; l < t->n_layers; l++) {
        size_t j = t->layer_table[l];
        n += (long)(t->off[(j + 1) * t->n_experts] - t->off[j * t->n_experts]);
    }
    return n;
}

bool pl_same(const pl_table *a, const pl_table *b)
{
    if (a->n_layers != b->n_layers || a->n_experts != b->n_experts || a->n_ranks != b->n_ranks)
        return false;
    for (int l = 0; l < a->n_layers; l++)
        for (int e = 0; e < a->n_experts; e++) {
            int na, nb;
            const uint16_t *ra = pl_replicas(a, l, e, &na), *rb = pl_replicas(b, l, e, &nb);
            if (na != nb || memcmp(ra, rb, (size_t)na * 2) != 0)
                return false;
        }
    return true;
}

bool pl_flat_owner(const pl_table *t, uint32_t *owner)
{
    if (t->n_tables != 1 || t->off[t->n_experts] != (uint32_t)t->n_experts)
        return false;
    for (int e = 0; e < t->n_experts; e++)
        owner[e] = t->rank[e];
    return true;
}

long pl_gained(const pl_table *a, const pl_table *b)
{
    long n = 0;
    for (int l = 0; l < b->n_layers; l++)
        for (int e = 0; e < b->n_experts; e++) {
            int nb;
            const uint16_t *rb = pl_replicas(b, l, e, &nb);
            for (int i = 0; i < nb; i++)
                n += !pl_holds(a, l, e, rb[i]);
        }
    return n;
}

/* ---- wire ---- */

static void pl_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t pl_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

void pl_wire_free(pl_wire *w)
{
    free(w->layer_table);
    free(w->count);
    free(w->rank);
    memset(w, 0, sizeof *w);
}

int pl_encode(const pl_table *t, pl_wire *w, ep_err *err)
{
    size_t L = (size_t)t->n_layers, C = (size_t)t->n_tables * t->n_experts, R = t->off[C];
    memset(w, 0, sizeof *w);
    w->layer_table = malloc(L * 2);
    w->count = malloc(C * 2);
    w->rank = malloc(R * 2 + 1);
    if (w->layer_table == NULL || w->count == NULL || w->rank == NULL) {
        pl_wire_free(w);
        return ep_err_set(err, "placement: out of memory");
    }
    for (size_t l = 0; l < L; l++)
        pl_put16(w->layer_table + 2 * l, t->layer_table[l]);
    for (size_t i = 0; i < C; i++)
        pl_put16(w->count + 2 * i, (uint16_t)(t->off[i + 1] - t->off[i]));
    for (size_t k = 0; k < R; k++)
        pl_put16(w->rank + 2 * k, t->rank[k]);
    w->layer_table_len = L * 2;
    w->count_len = C * 2;
    w->rank_len = R * 2;
    return 0;
}

pl_table *pl_decode(int n_layers, int n_experts, int n_ranks, const uint8_t *layer_table,
                    size_t layer_table_len, const uint8_t *count, size_t count_len,
                    const uint8_t *rank, size_t rank_len, ep_err *err)
{
    if (pl_check_dims(n_layers, n_experts, n_ranks, err) != 0)
        return NULL;
    size_t L = (size_t)n_layers, E = (size_t)n_experts;
    if (layer_table_len != L * 2) {
        ep_err_set(err, "placement: layer_table has %zu bytes, expected %zu (uint16 [%zu layers])",
                   layer_table_len, L * 2, L);
        return NULL;
    }
    if (count_len == 0 || count_len % (E * 2) != 0 || count_len / (E * 2) > L) {
        ep_err_set(err,
                   "placement: replica_count has %zu bytes, expected uint16 [tables x %zu "
                   "experts] with 1..%zu tables",
                   count_len, E, L);
        return NULL;
    }
    size_t n_tables = count_len / (E * 2), total = 0;
    size_t used = 0; /* every stored table must serve some layer (members count them all) */
    for (size_t l = 0; l < L; l++) {
        size_t j = pl_get16(layer_table + 2 * l);
        if (j > used || j >= n_tables) {
            ep_err_set(err,
                       "placement: layer_table[%zu] = %zu, expected < %zu tables, each first used "
                       "in order",
                       l, j, n_tables);
            return NULL;
        }
        used += j == used;
    }
    if (used != n_tables) {
        ep_err_set(err, "placement: %zu tables stored, only %zu used by layer_table", n_tables,
                   used);
        return NULL;
    }
    for (size_t i = 0; i < n_tables * E; i++) {
        uint16_t c = pl_get16(count + 2 * i);
        if (c < 1 || c > n_ranks) {
            ep_err_set(err,
                       "placement: replica_count[%zu] (table %zu, expert %zu) = %u, "
                       "expected 1..%d",
                       i, i / E, i % E, c, n_ranks);
            return NULL;
        }
        total += c;
    }
    if (rank_len != total * 2) {
        ep_err_set(err, "placement: replica_rank has %zu bytes, expected %zu (uint16 [%zu])",
                   rank_len, total * 2, total);
        return NULL;
    }
    pl_table *t = pl_alloc(n_layers, n_experts, n_ranks, (int)n_tables, total);
    if (t == NULL) {
        ep_err_set(err, "placement: out of memory");
        return NULL;
    }
    for (size_t l = 0; l < L; l++)
        t->layer_table[l] = pl_get16(layer_table + 2 * l);
    size_t o = 0;
    for (size_t i = 0; i < n_tables * E; i++) {
        uint16_t c = pl_get16(count + 2 * i);
        t->off[i] = (uint32_t)o;
        for (uint16_t k = 0; k < c; k++, o++) {
            t->rank[o] = pl_get16(rank + 2 * o);
            if (t->rank[o] >= n_ranks || (k > 0 && t->rank[o] <= t->rank[o - 1])) {
                ep_err_set(err,
                           "placement: replica_rank[%zu] = %u (table %zu, expert %zu): expected "
                           "ascending ranks < %d",
                           o, t->rank[o], i / E, i % E, n_ranks);
                pl_free(&t);
                return NULL;
            }
        }
    }
    t->off[n_tables * E] = (uint32_t)o;
    return t;
}

void pl_ranges_text(const uint32_t *e, size_t n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && len + 24 < cap;) {
        size_t j = i;
        while (j + 1 < n && e[j + 1] == e[j] + 1)
            j++;
        int k = j > i ? snprintf(buf + len, cap - len, "%s%u-%u", i ? "," : "", e[i], e[j])
                      : snprintf(buf + len, cap - len, "%s%u", i ? "," : "", e[i]);
        len += (size_t)k;
        i = j + 1;
    }
}
