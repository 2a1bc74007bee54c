/*
 * transport.c — what both data planes share (see transport.h): the layout of a message's
 * payload arrays and the checks a receiver applies before it trusts a message.
 *
 * The ZeroMQ plane sends the arrays as frames of one block; the collective plane sends the
 * block itself, so a DISPATCH has the same bytes at the same offsets on either plane and one
 * function validates it for both.
 */
#include "worker/transport.h"

#include "common/limits.h"

int tp_msg_layout(const tp_msg *m, int hidden, size_t *off, size_t *len, size_t *total)
{
    size_t H = (size_t)hidden, rows = (size_t)m->n_rows, pairs = (size_t)m->n_pairs;
    int n = 0;
    if (m->kind == TP_COMBINE) {
        len[n++] = pairs * H * 2;
    } else {
        if (m->format == TP_FMT_FP8) {
            len[n++] = rows * H;
            len[n++] = rows * (H / EP_FP8_BLOCK) * (m->scales_e8m0 ? 1 : 4);
        } else {
            len[n++] = rows * H * 2;
        }
        len[n++] = pairs * 4; /* pair_row */
        len[n++] = pairs * 4; /* pair_expert */
        len[n++] = pairs * 4; /* pair_weight */
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        off[i] = at;
        at += tp_round(len[i]);
    }
    *total = at;
    return n;
}

size_t tp_msg_bytes(const tp_msg *m, int hidden)
{
    size_t off[TP_MAX_ARRAYS], len[TP_MAX_ARRAYS], total, bytes = 0;
    int n = tp_msg_layout(m, hidden, off, len, &total);
    for (int i = 0; i < n; i++)
        bytes += len[i];
    return bytes;
}

void tp_msg_point(tp_msg *m, int hidden, uint8_t *block)
{
    size_t off[TP_MAX_ARRAYS], len[TP_MAX_ARRAYS], total;
    tp_msg_layout(m, hidden, off, len, &total);
    int i = 0;
    if (m->kind == TP_COMBINE) {
        m->out = (uint16_t *)(void *)(block + off[0]);
        return;
    }
    if (m->format == TP_FMT_FP8) {
        m->codes = block + off[i++];
        m->scales = block + off[i++];
    } else {
        m->hidden = (uint16_t *)(void *)(block + off[i++]);
    }
    m->pair_row = (uint32_t *)(void *)(block + off[i++]);
    m->pair_expert = (uint32_t *)(void *)(block + off[i++]);
    m->pair_weight = (float *)(void *)(block + off[i]);
}

/* has_step: step_id present, or a request (the serving path: any epoch of the session). */
static int tp_check_common(const tp_check *c, bool has_src, uint32_t src, bool has_epoch,
                           uint64_t epoch, bool has_step, bool request, ep_err *err)
{
    if (!has_step || !has_epoch || !has_src)
        return ep_err_set(err, "step_id (or request), epoch or src_rank missing");
    if (!request && epoch != c->epoch)
        return ep_err_set(err, "epoch %llu, expected %llu", (unsigned long long)epoch,
                          (unsigned long long)c->epoch);
    if (src >= (uint32_t)c->world_size || (src == (uint32_t)c->rank && !c->self_ok))
        return ep_err_set(err, "src_rank %u is not a peer (world of %d, own rank %d)", src,
                          c->world_size, c->rank);
    return 0;
}

static uint64_t tp_topk(const tp_check *c)
{
    return c->topk > 0 && c->topk <= MC_MAX_TOPK ? (uint64_t)c->topk : MC_MAX_TOPK;
}

int tp_check_dispatch(const tp_check *c, const Epmoe__Dispatch *d, tp_msg *m, ep_err *err)
{
    bool rq = d->has_request && d->has_attempt && !d->has_step_id;
    if (tp_check_common(c, d->has_src_rank, d->src_rank, d->has_epoch, d->epoch,
                        d->has_step_id || rq, rq, err) != 0)
        return -1;
    if (!d->has_layer || !d->has_n_rows || !d->has_n_pairs || !d->has_format)
        return ep_err_set(err, "layer, n_rows, n_pairs or format missing");
    if (d->format != EPMOE__DISPATCH_FORMAT__DISPATCH_FP8 &&
        d->format != EPMOE__DISPATCH_FORMAT__DISPATCH_BF16)
        return ep_err_set(err, "unknown dispatch format %d", (int)d->format);
    if (d->n_rows > EP_MAX_TOKENS || d->n_pairs > (uint64_t)d->n_rows * tp_topk(c))
        return ep_err_set(err,
                          "n_rows %u, n_pairs %u: expected n_rows <= %d, n_pairs <= n_rows * %llu "
                          "(the model's top-k)",
                          d->n_rows, d->n_pairs, EP_MAX_TOKENS, (unsigned long long)tp_topk(c));
    *m = (tp_msg){.kind = TP_DISPATCH,
                  .step_id = d->step_id,
                  .epoch = d->epoch,
                  .layer = d->layer,
                  .src_rank = (int)d->src_rank,
                  .n_rows = (int)d->n_rows,
                  .n_pairs = (int)d->n_pairs,
                  .format = (tp_format)d->format,
                  .scales_e8m0 = d->format == EPMOE__DISPATCH_FORMAT__DISPATCH_FP8 &&
                                 d->has_scales_e8m0 && d->scales_e8m0,
                  .is_request = rq,
                  .request = rq ? d->request : 0,
                  .attempt = rq ? d->attempt : 0};
    return 0;
}

int tp_check_combine(const tp_check *c, const Epmoe__Combine *b, tp_msg *m, ep_err *err)
{
    bool rq = b->has_request && b->has_attempt && !b->has_step_id;
    if (tp_check_common(c, b->has_src_rank, b->src_rank, b->has_epoch, b->epoch,
                        b->has_step_id || rq, rq, err) != 0)
        return -1;
    if (!b->has_n_pairs || b->n_pairs > (uint64_t)EP_MAX_TOKENS * tp_topk(c))
        return ep_err_set(err, "n_pairs missing or above %llu (EP_MAX_TOKENS x the model's top-k)",
                          (unsigned long long)EP_MAX_TOKENS * tp_topk(c));
    *m = (tp_msg){.kind = TP_COMBINE,
                  .step_id = b->step_id,
                  .epoch = b->epoch,
                  .src_rank = (int)b->src_rank,
                  .n_pairs = (int)b->n_pairs,
                  .is_request = rq,
                  .request = rq ? b->request : 0,
                  .attempt = rq ? b->attempt : 0,
                  .refused = rq && b->has_refused && b->refused,
                  .server_epoch = b->has_server_epoch ? b->server_epoch : 0};
    return 0;
}

int tp_check_pairs(const tp_check *c, int n_rows, int n_pairs, const uint32_t *pair_row,
                   const uint32_t *pair_expert, ep_err *err)
{
    for (int p = 0; p < n_pairs; p++) {
        if (pair_row[p] >= (uint32_t)n_rows)
            return ep_err_set(err, "pair_row[%d] = %u, expected < n_rows %d", p, pair_row[p],
                              n_rows);
        uint32_t e = pair_expert[p];
        if (e >= (uint32_t)c->n_experts || (c->owned != NULL && !c->owned[e]))
            return ep_err_set(err, "pair_expert[%d] = %u is not an expert of rank %d", p, e,
                              c->rank);
    }
    return 0;
}
