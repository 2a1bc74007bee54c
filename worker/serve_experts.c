/*
 * serve_experts.c — the serving half of the serving path (serve_experts.h, serve_state.h): the
 * DISPATCHes of every origin (this worker's own parts included) wait in one queue, and each
 * turn runs each layer's as one mb_experts call, rows concatenated and pairs re-indexed, so an
 * expert's rows from several requests form one GEMM. The exact kernels give every pair the
 * same bits in any batch; a DISPATCH naming an expert this worker does not hold in the layer is
 * answered with a refused COMBINE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/log.h"
#include "worker/serve_experts.h"
#include "worker/wmetrics.h"

int srv_push_job(srv_server *s, srv_job j)
{
    if (s->n_jobs == s->cap_jobs) {
        int cap = s->cap_jobs ? 2 * s->cap_jobs : 64;
        srv_job *n = realloc(s->job, (size_t)cap * sizeof *n);
        if (n == NULL)
            return -1;
        s->job = n;
        s->cap_jobs = cap;
    }
    s->job[s->n_jobs++] = j;
    return 0;
}

/* A peer's DISPATCH into the queue (bf16 rows quantized and e8m0 scales widened at run). */
void srv_on_dispatch(srv_server *s, tp_msg *d)
{
    srv_job j = {.src = d->src_rank,
                 .layer = (int)d->layer,
                 .request = d->request,
                 .attempt = d->attempt,
                 .msg = *d};
    if (srv_push_job(s, j) != 0) {
        log_limited(&s->log, SRV_LOG_PER_SEC, LOG_WARN,
                    "serving: out of memory queueing a DISPATCH from rank %d", d->src_rank);
        tpz_msg_release(d);
    }
    *d = (tp_msg){0};
}

/* ---- the serving half ---------------------------------------------------------------------- */

/* The rows and scales of a job as the experts take them: q e4m3 [rows, H], qs f32. */
typedef struct srv_rows {
    int n_rows, n_pairs;
    const uint8_t *q;
    const float *qs;
    const uint32_t *row, *expert;
    const float *w;
    uint8_t *qbuf;
    float *qsbuf;
    uint32_t *rowbuf, *expbuf;
    float *wbuf;
} srv_rows;

static void srv_rows_free(srv_rows *r)
{
    free(r->qbuf);
    free(r->qsbuf);
    free(r->rowbuf);
    free(r->expbuf);
    free(r->wbuf);
}

/* An own part's rows: its distinct tokens' q/qs and its pairs. */
static int srv_own_rows(srv_req *q, const srv_part *p, srv_rows *r)
{
    size_t H = (size_t)q->H, SC = H / EP_FP8_BLOCK;
    r->qbuf = srv_alloc((size_t)p->n * H);
    r->qsbuf = srv_alloc((size_t)p->n * SC * 4);
    r->rowbuf = malloc((size_t)p->n * 4 + 4);
    r->expbuf = malloc((size_t)p->n * 4 + 4);
    r->wbuf = malloc((size_t)p->n * 4 + 4);
    if (!r->qbuf || !r->qsbuf || !r->rowbuf || !r->expbuf || !r->wbuf)
        return -1;
    int row = -1, last_t = -1;
    for (int i = 0; i < p->n; i++) {
        uint32_t slot = p->slot[i];
        int t = (int)(slot / (uint32_t)q->k);
        if (t != last_t) {
            row++;
            last_t = t;
            memcpy(r->qbuf + (size_t)row * H, q->q + (size_t)t * H, H);
            memcpy(r->qsbuf + (size_t)row * SC, q->qs + (size_t)t * SC, SC * 4);
        }
        r->rowbuf[i] = (uint32_t)row;
        r->expbuf[i] = (uint32_t)q->topk_ids[slot];
        r->wbuf[i] = q->topk_w[slot];
    }
    *r = (srv_rows){.n_rows = row + 1,
                    .n_pairs = p->n,
                    .q = r->qbuf,
                    .qs = r->qsbuf,
                    .row = r->rowbuf,
                    .expert = r->expbuf,
                    .w = r->wbuf,
                    .qbuf = r->qbuf,
                    .qsbuf = r->qsbuf,
                    .rowbuf = r->rowbuf,
                    .expbuf = r->expbuf,
                    .wbuf = r->wbuf};
    return 0;
}

/* A peer's DISPATCH's rows (quantized here when it came as bf16). */
static int srv_msg_rows(const srv_env *env, const mb_layer *l, tp_msg *d, srv_rows *r, ep_err *err)
{
    size_t H = (size_t)env->session->config.hidden_size, SC = H / EP_FP8_BLOCK;
    size_t rows = (size_t)d->n_rows;
    *r = (srv_rows){.n_rows = d->n_rows,
                    .n_pairs = d->n_pairs,
                    .q = d->codes,
                    .qs = d->scales,
                    .row = d->pair_row,
                    .expert = d->pair_expert,
                    .w = d->pair_weight};
    if (d->format == TP_FMT_BF16) {
        r->q = r->qbuf = srv_alloc(rows * H);
        r->qs = r->qsbuf = srv_alloc(rows * SC * 4);
        if (!r->qbuf || !r->qsbuf)
            return ep_err_set(err, "out of memory");
        return rows ? mb_quant(env->be, l, d->n_rows, d->hidden, r->qbuf, r->qsbuf, err) : 0;
    }
    if (d->scales_e8m0) {
        r->qs = r->qsbuf = srv_alloc(rows * SC * 4);
        if (!r->qsbuf)
            return ep_err_set(err, "out of memory");
        mb_widen_scales(rows * SC, d->scales, r->qsbuf); /* the backend's format math */
    }
    return 0;
}

/* Whether layer l holds every expert the job names. */
static bool srv_holds(const mb_layer *l, const srv_rows *r)
{
    for (int p = 0; p < r->n_pairs; p++)
        if (!mb_layer_owns(l, (int)r->expert[p]))
            return false;
    return true;
}

/* Deliver a job's expert outputs (out bf16 [n_pairs, H]; NULL: refused). */
static void srv_deliver(srv_server *s, const srv_env *env, srv_job *j, const uint16_t *out,
                        int n_pairs)
{
    size_t H = (size_t)env->session->config.hidden_size;
    if (j->own != NULL) {
        srv_req *q = j->own;
        srv_part *p = &q->part[j->part];
        if (!p->live || p->attempt != j->attempt)
            return;
        if (out == NULL) {
            p->refused = true;
            q->retry_at = clk_mono_ms();
            return;
        }
        for (int i = 0; i < p->n; i++)
            memcpy(q->eo + (size_t)p->slot[i] * H, out + (size_t)i * H, H * 2);
        p->done = true;
        q->t_own = clk_mono_s();
        return;
    }
    if (j->msg.kind != TP_DISPATCH || env->tp == NULL)
        return;
    tp_msg c = {.kind = TP_COMBINE,
                .is_request = true,
                .request = j->request,
                .attempt = j->attempt,
                .n_pairs = n_pairs,
                .refused = out == NULL};
    ep_err err;
    if (out != NULL) {
        if (tpz_msg_alloc(&c, (int)H, &err) != 0) {
            log_limited(&s->log, SRV_LOG_PER_SEC, LOG_WARN, "serving: COMBINE for rank %d: %s",
                        j->src, err.msg);
            return;
        }
        memcpy(c.out, out, (size_t)n_pairs * H * 2);
    } else if (tpz_msg_alloc(&c, (int)H, &err) != 0) {
        return;
    }
    size_t bytes = out ? tp_msg_bytes(&c, (int)H) : 0;
    if (tpz_send(env->tp, j->src, &c, &err) != 0)
        log_limited(&s->log, SRV_LOG_PER_SEC, LOG_WARN, "serving: COMBINE to %s: %s",
                    env->session->peer_name[j->src], err.msg);
    else
        wmx_sent(env->mx, true, bytes);
    int layer = j->layer < 0 ? -1 - j->layer : j->layer; /* srv_serve marks taken jobs so */
    if (s->load && layer < s->L) {
        s->load[layer].combine_bytes += bytes;
        s->load[layer].messages++;
    }
}

/* Count a job's pairs per expert into the metrics. */
static void srv_count(const srv_env *env, int layer, const srv_rows *r)
{
    if (env->mx == NULL)
        return;
    for (int p = 0; p < r->n_pairs; p++)
        wmx_expert_pairs(env->mx, layer, (int)r->expert[p], 1);
}

/* A batch's pairs and the distinct experts it reads (each expert's weights once a call): how
 * well the batching shares weight reads (docs/performance.md "Serving path"). */
static uint64_t srv_count_reads(srv_server *s, const uint32_t *expert, size_t n)
{
    uint8_t *seen = s->E > 0 ? calloc((size_t)s->E, 1) : NULL;
    uint64_t reads = 0;
    for (size_t p = 0; seen && p < n; p++)
        if (expert[p] < (uint32_t)s->E && !seen[expert[p]]) {
            seen[expert[p]] = 1;
            reads++;
        }
    s->stats.expert_reads += reads;
    s->stats.pairs += n;
    free(seen);
    return reads;
}

/* One layer's jobs [n] as one mb_experts call: rows concatenated, pairs re-indexed. */
static void srv_run_layer(srv_server *s, const srv_env *env, int layer, srv_job **jobs, int n)
{
    const mb_layer *l = env->layers[layer];
    size_t H = (size_t)env->session->config.hidden_size, SC = H / EP_FP8_BLOCK;
    srv_rows *rows = calloc((size_t)n, sizeof *rows);
    bool *ok = calloc((size_t)n, sizeof *ok);
    ep_err err = {0};
    size_t R = 0, Pn = 0;
    for (int i = 0; rows && ok && i < n; i++) {
        srv_job *j = jobs[i];
        int rc = j->own ? srv_own_rows(j->own, &j->own->part[j->part], &rows[i])
                        : srv_msg_rows(env, l, &j->msg, &rows[i], &err);
        ok[i] = rc == 0 && srv_holds(l, &rows[i]);
        if (!ok[i]) {
            srv_deliver(s, env, j, NULL, rows[i].n_pairs);
            continue;
        }
        R += (size_t)rows[i].n_rows;
        Pn += (size_t)rows[i].n_pairs;
    }
    uint8_t *q = srv_alloc(R * H);
    float *qs = srv_alloc(R * SC * 4);
    uint32_t *prow = malloc(Pn * 4 + 4), *pexp = malloc(Pn * 4 + 4);
    float *pw = malloc(Pn * 4 + 4);
    uint16_t *out = srv_alloc(Pn * H * 2);
    if (rows && ok && q && qs && prow && pexp && pw && out) {
        size_t r0 = 0, p0 = 0;
        for (int i = 0; i < n; i++) {
            if (!ok[i])
                continue;
            srv_rows *r = &rows[i];
            memcpy(q + r0 * H, r->q, (size_t)r->n_rows * H);
            memcpy(qs + r0 * SC, r->qs, (size_t)r->n_rows * SC * 4);
            for (int p = 0; p < r->n_pairs; p++) {
                prow[p0 + (size_t)p] = r->row[p] + (uint32_t)r0;
                pexp[p0 + (size_t)p] = r->expert[p];
                pw[p0 + (size_t)p] = r->w[p];
            }
            srv_count(env, layer, r);
            r0 += (size_t)r->n_rows;
            p0 += (size_t)r->n_pairs;
        }
        wmx_batch(env->mx, n, Pn, srv_count_reads(s, pexp, Pn));
        int rc = Pn ? mb_experts(env->be, l, (int)R, q, qs, (int)Pn, prow, pexp, pw, out, &err) : 0;
        if (rc != 0)
            log_error("serving: layer %d experts for %d jobs: %s", layer, n, err.msg);
        s->stats.batches++;
        s->stats.batched_jobs += (uint64_t)n;
        p0 = 0;
        for (int i = 0; i < n; i++) {
            if (!ok[i])
                continue;
            srv_deliver(s, env, jobs[i], rc == 0 ? out + p0 * H : NULL, rows[i].n_pairs);
            p0 += (size_t)rows[i].n_pairs;
        }
    } else {
        log_error("serving: out of memory for a batch of %d jobs (%zu rows)", n, R);
        for (int i = 0; i < n; i++)
            if (ok && ok[i])
                srv_deliver(s, env, jobs[i], NULL, rows ? rows[i].n_pairs : 0);
    }
    for (int i = 0; rows && i < n; i++)
        srv_rows_free(&rows[i]);
    free(rows);
    free(ok);
    free(q);
    free(qs);
    free(prow);
    free(pexp);
    free(pw);
    free(out);
}

/* A job still to run: an own part whose request lives, or a peer's DISPATCH. */
static bool srv_job_valid(const srv_job *j)
{
    return j->own != NULL || j->msg.buf != NULL;
}

/* Every queued job, one mb_experts call per layer. */
void srv_serve(srv_server *s, const srv_env *env)
{
    if (s->n_jobs == 0 || !env->ready)
        return;
    srv_job *job = s->job;
    int n = s->n_jobs;
    s->job = NULL;
    s->n_jobs = s->cap_jobs = 0;
    srv_job **sel = malloc((size_t)n * sizeof *sel);
    for (int i = 0; sel && i < n; i++) {
        int layer = job[i].layer;
        if (layer < 0 || !srv_job_valid(&job[i]))
            continue;
        int m = 0;
        for (int j = i; j < n; j++)
            if (job[j].layer == layer && srv_job_valid(&job[j])) {
                sel[m++] = &job[j];
                job[j].layer = -1 - layer; /* taken */
            }
        if (layer < env->n_layers && env->layers[layer] != NULL)
            srv_run_layer(s, env, layer, sel, m);
        else
            for (int j = 0; j < m; j++) /* no such layer here: the origin must look elsewhere */
                srv_deliver(s, env, sel[j], NULL, sel[j]->msg.n_pairs);
    }
    for (int i = 0; i < n; i++)
        if (!job[i].own)
            tpz_msg_release(&job[i].msg);
    free(sel);
    free(job);
}
