/*
 * transport.h — what both data planes of an epoch share (prefix tp_): the DISPATCH and COMBINE
 * message, the layout of its payload arrays in one block, and the checks a receiver applies
 * before it trusts a message (transport.c).
 *
 * Two planes move these messages between workers: the ZeroMQ plane (transport_zmq.h, prefix
 * tpz_: messages between host buffers) and the collective plane (transport_comm.h, prefix tpc_:
 * grouped sends and receives between device buffers over NCCL or a test's fake). A DISPATCH has
 * the same bytes at the same offsets on either plane, so one function validates it for both.
 */
#ifndef EPMOE_TRANSPORT_H
#define EPMOE_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/error.h"
#include "epmoe.pb-c.h"

/* Values equal Epmoe__DispatchFormat. */
typedef enum tp_format { TP_FMT_FP8 = 0, TP_FMT_BF16 = 1 } tp_format;
typedef enum tp_kind { TP_DISPATCH = 0, TP_COMBINE = 1 } tp_kind;

/* One data-plane message. For sending, the caller sets kind, step_id, layer, n_rows, n_pairs,
 * format and scales_e8m0, gives the arrays their storage (tpz_msg_alloc, or a block laid out by
 * tp_msg_layout) and fills them. Received messages carry the same fields with src_rank and epoch
 * as sent. Unused arrays are NULL. */
typedef struct tp_msg {
    tp_kind kind;
    uint64_t step_id;
    uint64_t epoch;
    uint32_t layer; /* dispatch */
    int src_rank;
    int n_rows;            /* dispatch: distinct token rows */
    int n_pairs;           /* dispatch: (row, expert, weight) pairs; combine: output rows */
    tp_format format;      /* dispatch */
    bool scales_e8m0;      /* dispatch fp8: scales are e8m0 bytes, else f32 */
    uint8_t *codes;        /* fp8: e4m3 [n_rows, H] */
    void *scales;          /* fp8: [n_rows, H/128] uint8 e8m0 or float */
    uint16_t *hidden;      /* bf16: [n_rows, H] */
    uint32_t *pair_row;    /* dispatch: [n_pairs], < n_rows */
    uint32_t *pair_expert; /* dispatch: [n_pairs], owned by the receiver */
    float *pair_weight;    /* dispatch: [n_pairs] */
    uint16_t *out;         /* combine: bf16 [n_pairs, H], in the order of the dispatch's pairs */
    /* The serving path (is_request): the origin's request and attempt instead of step_id; any
     * epoch of the session is accepted (the owner checks the experts it holds), and a refused
     * COMBINE (the receiver does not hold an expert named) has no payload and says which epoch
     * the receiver serves. */
    bool is_request;
    uint64_t request;
    uint32_t attempt;
    bool refused;
    uint64_t server_epoch;
    struct tpz_buf *buf; /* private to the ZeroMQ plane: the storage the arrays live in */
} tp_msg;

/* ---- layout ------------------------------------------------------------------------------- */

/* Payload arrays of a message at most (fp8 DISPATCH: codes, scales, pair_row, pair_expert,
 * pair_weight), and the alignment of each inside a message's block. */
#define TP_MAX_ARRAYS 5
#define TP_ALIGN      64

/* n bytes rounded up to TP_ALIGN: the room an array takes in a block. */
static inline size_t tp_round(size_t n)
{
    return (n + TP_ALIGN - 1) / TP_ALIGN * TP_ALIGN;
}

/* The block of m's shape (kind, format, scales_e8m0, n_rows, n_pairs): its arrays in wire order
 * at TP_ALIGN-aligned offsets off[i] with len[i] bytes each. Returns the number of arrays and
 * sets *total to the block's size (a multiple of TP_ALIGN). Counts must be within the limits
 * (tp_check_dispatch), so no product overflows. */
int tp_msg_layout(const tp_msg *m, int hidden, size_t *off, size_t *len, size_t *total);
/* Point m's arrays into block (laid out by tp_msg_layout). */
void tp_msg_point(tp_msg *m, int hidden, uint8_t *block);
/* Bytes of payload m carries (what dispatch_bytes/combine_bytes count). */
size_t tp_msg_bytes(const tp_msg *m, int hidden);

/* ---- checks ------------------------------------------------------------------------------- */

/* What a receiver checks messages against. */
typedef struct tp_check {
    int rank, world_size, hidden, n_experts;
    int topk; /* the model's k: an honest DISPATCH carries at most k pairs a row (0: MC_MAX_TOPK) */
    uint64_t epoch;
    const uint8_t *owned; /* [n_experts]: 1 where this rank owns the expert */
    bool self_ok;         /* the collective plane: a rank also exchanges with itself */
} tp_check;

/* A DISPATCH body: every field present, epoch ours, src_rank a peer (or ourselves when
 * self_ok), a known format, n_rows <= EP_MAX_TOKENS and n_pairs <= n_rows * k (the model's
 * top-k: what one DISPATCH can make the receiver compute and answer is what an honest one can).
 * Fills m's scalar fields (kind .. scales_e8m0), not its arrays. */
int tp_check_dispatch(const tp_check *c, const Epmoe__Dispatch *d, tp_msg *m, ep_err *err);
/* A COMBINE body: every field present, epoch ours, src_rank a peer, n_pairs <= EP_MAX_TOKENS * k.
 */
int tp_check_combine(const tp_check *c, const Epmoe__Combine *b, tp_msg *m, ep_err *err);
/* A DISPATCH's pairs (arrays on the host): pair_row < n_rows, pair_expert owned by c->rank. */
int tp_check_pairs(const tp_check *c, int n_rows, int n_pairs, const uint32_t *pair_row,
                   const uint32_t *pair_expert, ep_err *err);

#endif
