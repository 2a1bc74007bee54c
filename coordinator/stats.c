/*
 * stats.c — the sliding window of step loads (see stats.h). A ring of entries, each with its
 * nonzero (expert, pairs) and (rank, pairs) lists; running sums per layer are updated as entries
 * enter and leave.
 */
#include "coordinator/stats.h"

#include <stdlib.h>
#include <string.h>

typedef struct stats_entry {
    int layer;
    uint64_t epoch;
    int n_e, n_r;
    uint32_t *idx; /* [n_e + n_r]: expert ids, then ranks */
    uint32_t *cnt; /* [n_e + n_r] */
} stats_entry;

struct stats_window {
    int L, E, P, cap;
    stats_entry *ring; /* [cap] */
    int head, n;       /* oldest entry, entries held */
    uint64_t epoch;    /* rank sums count entries of this epoch */
    uint64_t *esum;    /* [L * E] */
    uint64_t *rsum;    /* [L * P] */
    int *layer_steps;  /* [L] */
};

stats_window *stats_create(int n_layers, int n_experts, int n_ranks, int window_steps, ep_err *err)
{
    stats_window *s = calloc(1, sizeof *s);
    if (s == NULL)
        goto oom;
    s->L = n_layers;
    s->E = n_experts;
    s->P = n_ranks;
    s->cap = window_steps;
    s->ring = calloc((size_t)window_steps, sizeof *s->ring);
    s->esum = calloc((size_t)n_layers * n_experts, sizeof *s->esum);
    s->rsum = calloc((size_t)n_layers * n_ranks, sizeof *s->rsum);
    s->layer_steps = calloc((size_t)n_layers, sizeof *s->layer_steps);
    if (s->ring == NULL || s->esum == NULL || s->rsum == NULL || s->layer_steps == NULL)
        goto oom;
    return s;
oom:
    stats_destroy(&s);
    ep_err_set(err, "statistics: out of memory for a window of %d steps", window_steps);
    return NULL;
}

void stats_destroy(stats_window **self_p)
{
    stats_window *s = self_p ? *self_p : NULL;
    if (s == NULL)
        return;
    for (int i = 0; s->ring && i < s->cap; i++) {
        free(s->ring[i].idx);
        free(s->ring[i].cnt);
    }
    free(s->ring);
    free(s->esum);
    free(s->rsum);
    free(s->layer_steps);
    free(s);
    *self_p = NULL;
}

/* Add (sign +1) or remove (-1) an entry's counts from the sums. */
static void stats_apply(stats_window *s, const stats_entry *e, int sign)
{
    uint64_t *es = s->esum + (size_t)e->layer * s->E, *rs = s->rsum + (size_t)e->layer * s->P;
    for (int i = 0; i < e->n_e; i++)
        es[e->idx[i]] += sign > 0 ? e->cnt[i] : -(uint64_t)e->cnt[i];
    if (e->epoch == s->epoch)
        for (int i = e->n_e; i < e->n_e + e->n_r; i++)
            rs[e->idx[i]] += sign > 0 ? e->cnt[i] : -(uint64_t)e->cnt[i];
    s->layer_steps[e->layer] += sign;
}

int stats_add(stats_window *s, int layer, uint64_t epoch, const uint32_t *expert_tokens,
              const uint32_t *rank_pairs)
{
    if (layer < 0 || layer >= s->L)
        return -1;
    int ne = 0, nr = 0;
    for (int e = 0; e < s->E; e++)
        ne += expert_tokens[e] != 0;
    for (int r = 0; r < s->P; r++)
        nr += rank_pairs[r] != 0;
    stats_entry fresh = {.layer = layer, .epoch = epoch, .n_e = ne, .n_r = nr};
    fresh.idx = malloc((size_t)(ne + nr + 1) * sizeof *fresh.idx);
    fresh.cnt = malloc((size_t)(ne + nr + 1) * sizeof *fresh.cnt);
    if (fresh.idx == NULL || fresh.cnt == NULL) {
        free(fresh.idx);
        free(fresh.cnt);
        return -1;
    }
    int k = 0;
    for (int e = 0; e < s->E; e++)
        if (expert_tokens[e]) {
            fresh.idx[k] = (uint32_t)e;
            fresh.cnt[k++] = expert_tokens[e];
        }
    for (int r = 0; r < s->P; r++)
        if (rank_pairs[r]) {
            fresh.idx[k] = (uint32_t)r;
            fresh.cnt[k++] = rank_pairs[r];
        }
    int slot = (s->head + s->n) % s->cap;
    if (s->n == s->cap) { /* the oldest leaves */
        stats_entry *old = &s->ring[s->head];
        stats_apply(s, old, -1);
        free(old->idx);
        free(old->cnt);
        slot = s->head;
        s->head = (s->head + 1) % s->cap;
        s->n--;
    }
    s->ring[slot] = fresh;
    s->n++;
    stats_apply(s, &s->ring[slot], +1);
    return 0;
}

void stats_epoch(stats_window *s, uint64_t epoch)
{
    if (epoch == s->epoch)
        return;
    s->epoch = epoch;
    memset(s->rsum, 0, (size_t)s->L * s->P * sizeof *s->rsum);
    for (int i = 0; i < s->n; i++) { /* entries already of this epoch (none, usually) */
        const stats_entry *e = &s->ring[(s->head + i) % s->cap];
        if (e->epoch != epoch)
            continue;
        uint64_t *rs = s->rsum + (size_t)e->layer * s->P;
        for (int j = e->n_e; j < e->n_e + e->n_r; j++)
            rs[e->idx[j]] += e->cnt[j];
    }
}

int stats_steps(const stats_window *s)
{
    return s->n;
}

int stats_layer_steps(const stats_window *s, int layer)
{
    return layer >= 0 && layer < s->L ? s->layer_steps[layer] : 0;
}

void stats_weights(const stats_window *s, double *w)
{
    for (size_t i = 0; i < (size_t)s->L * s->E; i++)
        w[i] = (double)s->esum[i];
}

const uint64_t *stats_expert_counts(const stats_window *s, int layer)
{
    return s->esum + (size_t)layer * s->E;
}

const uint64_t *stats_rank_counts(const stats_window *s, int layer)
{
    return s->rsum + (size_t)layer * s->P;
}

double stats_measured_balance(const stats_window *s, int layer, const uint8_t *holds)
{
    const uint64_t *rs = stats_rank_counts(s, layer);
    uint64_t total = 0, mx = 0;
    int n = 0;
    for (int r = 0; r < s->P; r++) {
        if (!holds[r])
            continue;
        n++;
        total += rs[r];
        mx = rs[r] > mx ? rs[r] : mx;
    }
    if (total == 0 || n == 0)
        return 0;
    return (double)mx / ((double)total / n);
}
