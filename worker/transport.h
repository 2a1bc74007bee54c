/*
 * transport.h — the data plane of one epoch: DISPATCH and COMBINE between workers (prefix tp_).
 *
 * Contract (docs/protocol.md, proto/epmoe.proto): every worker binds one PULL at its data
 * endpoint and connects one PUSH per peer rank (never to itself), so a message to rank r goes
 * only to r. Every message is wire.h-framed; payloads travel zero-copy from one block the
 * sender filled in place (tp_msg_alloc) and arrive as views into the received frames.
 *
 * The owner thread (the executor) polls tp_socket() beside its other sockets and calls tp_pump
 * when it is readable. tp_pump validates each message completely before keeping it:
 *   epoch == ours; src_rank < world_size and != ours; step_id present; the payload count of the
 *   kind and format; n_rows <= EP_MAX_TOKENS and n_pairs <= EP_MAX_TOKENS * MC_MAX_TOPK before
 *   any product; payload sizes (fp8 codes n_rows*H, scales n_rows*H/128 bytes when scales_e8m0
 *   else 4x that; bf16 hidden n_rows*H*2; pair arrays n_pairs*4 each; combine out n_pairs*H*2);
 *   pair_row < n_rows; pair_expert < E and owned by this rank (expert_owner, or owned: held in
 *   some layer; the executor checks the step's layer).
 * A message that fails any check, or whose step is finished (tp_finish), is dropped: counted,
 * its reason logged (rate-limited) and kept in tp_last_drop; it never disturbs other messages.
 * Valid messages are kept until taken, also for steps the owner has not started yet (a fast
 * peer may be ahead), at most TP_MAX_PENDING of them.
 *
 * Step ids must increase within one transport's life (one placement epoch of one coordinator
 * session): "finished" means step_id <= the highest id passed to tp_finish.
 *
 * What the transport does not know is checked by its owner: the layer matches the step's, a
 * COMBINE's n_pairs equals that of the DISPATCH it answers, one message per (step, kind, peer).
 *
 * Arrays in a received tp_msg are aligned for their type (misaligned frames are copied), so the
 * owner can hand them to kernels directly. Not thread-safe: one owner thread.
 */
#ifndef EPMOE_TRANSPORT_H
#define EPMOE_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Messages kept for steps not yet taken, per peer of the world (at most two are legitimately
 * pending per peer and step: its DISPATCH and COMBINE; a peer can be one step ahead). */
#define TP_PENDING_PER_PEER 8

typedef struct tp_transport tp_transport;

/* Values equal Epmoe__DispatchFormat. */
typedef enum tp_format { TP_FMT_FP8 = 0, TP_FMT_BF16 = 1 } tp_format;
typedef enum tp_kind { TP_DISPATCH = 0, TP_COMBINE = 1 } tp_kind;

typedef struct tp_config {
    int rank;                     /* this worker, < world_size */
    int world_size;               /* 1..EP_MAX_WORKERS */
    uint64_t epoch;               /* placement epoch every message must carry */
    int hidden;                   /* H, a multiple of 128 */
    int n_experts;                /* E */
    const uint32_t *expert_owner; /* [E]: rank owning expert e (copied); unused when owned */
    const uint8_t *owned;         /* [E] or NULL: 1 where this rank holds expert e in some layer
                                   * (per-layer placements and replicas; copied) */
    const char *bind_endpoint;    /* PULL; "tcp://127.0.0.1:*" binds an ephemeral port */
} tp_config;

/* One data-plane message. For sending, the caller sets kind, step_id, layer, n_rows, n_pairs,
 * format and scales_e8m0, calls tp_msg_alloc, fills the arrays and calls tp_send. Received
 * messages carry the same fields with src_rank and epoch as sent. Unused arrays are NULL. */
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
    struct tp_buf *buf;    /* private: the storage the arrays live in */
} tp_msg;

/* Create a transport in zctx and bind its PULL (options set before bind: linger 0,
 * MAXMSGSIZE EP_MAX_DATA_MSG). Errors name the endpoint. */
tp_transport *tp_create(void *zctx, const tp_config *cfg, ep_err *err);
void tp_destroy(tp_transport **self_p);

/* The endpoint actually bound (ephemeral port resolved), for the peers to connect to. */
const char *tp_endpoint(const tp_transport *tp);

/* Connect one PUSH per peer: endpoints[r] for every r != rank (endpoints[rank] is ignored).
 * ZeroMQ connects in the background, so a peer that binds later still gets its messages. */
int tp_connect(tp_transport *tp, const char *const *endpoints, ep_err *err);

/* Allocate the payload arrays of an outgoing message in one aligned block. */
int tp_msg_alloc(tp_msg *m, int hidden, ep_err *err);
/* Bytes of payload m carries (what dispatch_bytes/combine_bytes count). */
size_t tp_msg_bytes(const tp_msg *m, int hidden);
/* Free m's storage (a received message, or an allocated one never sent); m's arrays are
 * cleared. Tolerates a zeroed m. */
void tp_msg_release(tp_msg *m);

/* Send m to rank dst (!= own rank) without blocking; epoch and src_rank are filled in. The block
 * goes to ZeroMQ, which frees it once sent, and m's arrays are cleared whether or not the send
 * succeeded. Fails (naming the peer) when dst's queue is full. */
int tp_send(tp_transport *tp, int dst, tp_msg *m, ep_err *err);

/* The PULL socket, to poll for ZMQ_POLLIN; only tp_pump may read it. */
void *tp_socket(tp_transport *tp);

/* Read every message waiting on the PULL without blocking, validate it and keep it or drop it.
 * Returns the number kept. */
int tp_pump(tp_transport *tp);

/* Move a kept message of step_id into *out (the caller releases it). Returns 1, or 0 when
 * none is kept. Messages come out in arrival order. */
int tp_take(tp_transport *tp, uint64_t step_id, tp_msg *out);

/* Step step_id is finished or abandoned: drop what is kept for it and every earlier step, and
 * drop later arrivals for them. */
void tp_finish(tp_transport *tp, uint64_t step_id);

/* A new placement epoch on the same sockets (placement epochs, docs/protocol.md): messages must
 * carry `epoch` from now on and name experts of `expert_owner` ([E]) owned by this rank;
 * everything kept for the old epoch is dropped. epoch must be above the current one (so no
 * message of an earlier epoch can pass); the sockets and their connections stay, so no message
 * of the new epoch is lost to a reconnect. -1 with err when epoch does not increase. */
int tp_set_placement(tp_transport *tp, uint64_t epoch, const uint32_t *expert_owner, ep_err *err);
/* The same with the experts this rank holds in some layer (owned [E], copied): per-layer
 * placements and replicas (issue 9), and a committed staged epoch. */
int tp_set_placement_owned(tp_transport *tp, uint64_t epoch, const uint8_t *owned, ep_err *err);
uint64_t tp_epoch(const tp_transport *tp);

/* Counters and the reason of the last dropped message ("" if none). */
uint64_t tp_dropped(const tp_transport *tp);
const char *tp_last_drop(const tp_transport *tp);
int tp_pending(const tp_transport *tp);

#endif
