/*
 * plan.c — the dispatch plan (see plan.h).
 */
#include "worker/plan.h"

#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "kernels/moe_backend.h"

/* The replica of reps[n] for the i-th pair at origin, skipping ranks not ok when another one
 * is: the rule's pick first, then the next ones in order. */
static int dp_pick(const uint16_t *reps, int n, int origin, uint32_t i, const uint8_t *ok)
{
    int first = pl_pick(reps, n, origin, i);
    if (ok == NULL || ok[first])
        return first;
    int at = 0;
    while (at < n && reps[at] != first)
        at++;
    for (int d = 1; d < n; d++) {
        int r = reps[(at + d) % n];
        if (ok[r])
            return r;
    }
    return -2;
}

void dp_route(const pl_table *t, int layer, int origin, const int32_t *topk_ids,
              const uint32_t *slots, int n, const uint8_t *ranks_ok, int *dest,
              uint32_t *expert_pairs)
{
    int E = pl_experts(t);
    uint32_t seq_small[256], *seq = E <= 256 ? seq_small : calloc((size_t)E, sizeof *seq);
    if (seq == seq_small)
        memset(seq_small, 0, sizeof seq_small);
    for (int i = 0; i < n; i++) {
        uint32_t slot = slots ? slots[i] : (uint32_t)i;
        int32_t e = topk_ids[slot];
        dest[i] = -1;
        if (e < 0 || e >= E)
            continue;
        int nr;
        const uint16_t *reps = pl_replicas(t, layer, e, &nr);
        uint32_t at = seq ? seq[e]++ : 0;
        dest[i] = dp_pick(reps, nr, origin, at, ranks_ok);
        if (expert_pairs)
            expert_pairs[e]++;
    }
    if (seq != seq_small)
        free(seq);
}

int dp_group(dp_plan *p, int P, int k, const uint32_t *slots, const int *dest, int n, ep_err *err)
{
    *p = (dp_plan){.P = P};
    p->count = calloc((size_t)P, sizeof *p->count);
    p->rows = calloc((size_t)P, sizeof *p->rows);
    p->slot = calloc((size_t)P, sizeof *p->slot);
    int *last = malloc((size_t)P * sizeof *last);
    if (!p->count || !p->rows || !p->slot || !last)
        goto oom;
    for (int i = 0; i < n; i++)
        if (dest[i] >= 0)
            p->count[dest[i]]++;
    for (int r = 0; r < P; r++) {
        last[r] = -1;
        if (p->count[r] && (p->slot[r] = malloc((size_t)p->count[r] * sizeof **p->slot)) == NULL)
            goto oom;
        p->count[r] = 0;
    }
    /* slots come ascending (every caller lists them so), so each list is in wire order */
    for (int i = 0; i < n; i++) {
        int r = dest[i];
        if (r < 0)
            continue;
        uint32_t slot = slots ? slots[i] : (uint32_t)i;
        p->slot[r][p->count[r]++] = slot;
        int t = (int)(slot / (uint32_t)k);
        p->rows[r] += t != last[r];
        last[r] = t;
    }
    free(last);
    return 0;
oom:
    free(last);
    dp_plan_free(p);
    return ep_err_set(err, "dispatch plan: out of memory");
}

void dp_plan_free(dp_plan *p)
{
    if (p->slot)
        for (int r = 0; r < p->P; r++)
            free(p->slot[r]);
    free(p->slot);
    free(p->count);
    free(p->rows);
    *p = (dp_plan){0};
}

static int dp_scales(const float *qs, size_t SC, int t, bool e8m0, void *dst, size_t row,
                     ep_err *err)
{
    if (!e8m0) {
        memcpy((float *)dst + row * SC, qs, SC * 4);
        return 0;
    }
    size_t b; /* the backend's format math */
    if (mb_narrow_scales(SC, qs, (uint8_t *)dst + row * SC, &b) != 0)
        return ep_err_set(err,
                          "token %d: activation scale %g is not a power of two (e8m0 dispatch)", t,
                          (double)qs[b]);
    return 0;
}

int dp_rows(const uint32_t *slot, int n, int k)
{
    int rows = 0, last_t = -1;
    for (int i = 0; i < n; i++) {
        int t = (int)(slot[i] / (uint32_t)k);
        rows += t != last_t;
        last_t = t;
    }
    return rows;
}

int dp_fill(const uint32_t *slots, int n, int k, int H, const int32_t *topk_ids,
            const float *topk_w, const uint8_t *q, const float *qs, const uint16_t *xn, tp_msg *m,
            ep_err *err)
{
    size_t h = (size_t)H, SC = h / EP_FP8_BLOCK;
    int row = -1, last_t = -1;
    for (int i = 0; i < n; i++) {
        uint32_t slot = slots[i];
        int t = (int)(slot / (uint32_t)k);
        if (t != last_t) {
            row++;
            last_t = t;
            if (m->format == TP_FMT_BF16) {
                memcpy(m->hidden + (size_t)row * h, xn + (size_t)t * h, h * 2);
            } else {
                memcpy(m->codes + (size_t)row * h, q + (size_t)t * h, h);
                if (dp_scales(qs + (size_t)t * SC, SC, t, m->scales_e8m0, m->scales, (size_t)row,
                              err) != 0)
                    return -1;
            }
        }
        m->pair_row[i] = (uint32_t)row;
        m->pair_expert[i] = (uint32_t)topk_ids[slot];
        m->pair_weight[i] = topk_w[slot];
    }
    return 0;
}
