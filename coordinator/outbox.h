/*
 * outbox.h — what a passive coordinator module returns: messages to send and events for the
 * loop to route (prefix ob_).
 *
 * The registry, planner and sequencer never touch a socket and never call each other
 * (DESIGN.md, "The coordinator is one event loop"). Each handler gets an ob_box from coord.c
 * and appends to it: the messages its decision produces (packed at once, so the caller's
 * protobuf structs may live on the stack) and the events other modules must hear about
 * (a worker lost, a worker to declare dead, ...). coord.c then sends the messages in order
 * and feeds the events, one at a time and in order, to the module that handles each — so the
 * order of events is decided in one place and no handler ever runs inside another.
 *
 * Ownership: payloads with a free_fn belong to the box from ob_send on; they go to ZeroMQ when
 * coord.c sends the message, or are freed by ob_clear. A box that runs out of memory drops the
 * message (logged) and frees its payloads: the peer's own timeouts cover a lost message.
 */
#ifndef EPMOE_OUTBOX_H
#define EPMOE_OUTBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/limits.h"
#include "common/wire.h"

/* Where a message goes. */
typedef enum ob_to {
    OB_TO_RANK = 0,  /* the registered worker of rank (coord.c resolves its routing id) */
    OB_TO_WORKER_ID, /* a routing id on coordinator.listen (a sender not known as a rank) */
    OB_TO_ADMIN      /* a routing id on coordinator.admin */
} ob_to;

typedef struct ob_msg {
    ob_to to;
    int rank; /* OB_TO_RANK */
    uint8_t ident[WIRE_MAX_IDENT];
    size_t ident_len;
    uint16_t type;
    uint8_t *body; /* packed protobuf (malloc), NULL when empty */
    size_t body_len;
    wire_payload payload[WIRE_MAX_PAYLOADS];
    int n_payloads;
    uint64_t step_id; /* a STEP: a failed send is reported to the sequencer with this id */
} ob_msg;

typedef enum ob_kind {
    /* registry: a registered worker is gone (declared dead, restarted, or its shard failed):
     * whatever it held in the step in flight is lost. text: why. */
    OB_EV_LOST = 1,
    /* sequencer: a worker ignores the protocol (no answer to STEP_ABORT): declare it dead. */
    OB_EV_DECLARE_DEAD,
    /* registry: a worker acknowledged epoch `epoch` with READY. */
    OB_EV_READY,
    /* coord.c: a STEP could not be sent (text: the ZeroMQ error; rank -1: not a worker). */
    OB_EV_SEND_FAILED,
    /* sequencer: an error text to show on the worker of rank (its step failed because of it). */
    OB_EV_ERROR,
    /* registry: a worker that was loading reported ERR_LOAD_FAILED (text: its message). */
    OB_EV_LOAD_FAILED,
    /* registry: a worker prepared staged epoch `epoch` (READY {staged}). */
    OB_EV_PREPARED,
    /* registry: a ready worker could not prepare staged epoch `epoch` (text: why). */
    OB_EV_STAGE_FAILED,
    /* sequencer: a step closed (seq_last_record describes it). */
    OB_EV_STEP_END,
} ob_kind;

typedef struct ob_event {
    ob_kind kind;
    int rank;
    uint64_t epoch;   /* OB_EV_READY */
    uint64_t step_id; /* OB_EV_SEND_FAILED */
    char text[EP_ERR_MSG_MAX];
} ob_event;

typedef struct ob_box {
    ob_msg *msg;
    int n_msg, cap_msg;
    int n_sent; /* messages [0, n_sent) were handed to ZeroMQ by coord.c */
    ob_event *ev;
    int ev_head, n_ev, cap_ev; /* events [ev_head, n_ev) are not taken yet */
} ob_box;

/* Queue a message. body may be NULL; payloads are taken over (see above). Returns the queued
 * message (to set step_id) or NULL when it was dropped. */
ob_msg *ob_send(ob_box *b, ob_to to, int rank, const uint8_t *ident, size_t ident_len,
                uint16_t type, const ProtobufCMessage *body, const wire_payload *payloads,
                int n_payloads);
/* The same to the worker of rank / to a routing id on the worker socket / on the admin socket. */
ob_msg *ob_to_rank(ob_box *b, int rank, uint16_t type, const ProtobufCMessage *body,
                   const wire_payload *payloads, int n_payloads);
void ob_to_worker_id(ob_box *b, const uint8_t *ident, size_t ident_len, uint16_t type,
                     const ProtobufCMessage *body);
/* An Error message {err's code, err's message, in_reply_to} (wire_error_body) to a rank or a
 * routing id on the worker or admin socket. */
void ob_reply_error(ob_box *b, ob_to to, int rank, const uint8_t *ident, size_t ident_len,
                    const ep_err *err, uint16_t in_reply_to);
/* The same with the code and a formatted message. */
void ob_error(ob_box *b, ob_to to, int rank, const uint8_t *ident, size_t ident_len,
              Epmoe__ErrorCode code, uint16_t in_reply_to, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

/* Queue an event with a formatted text. */
void ob_event_add(ob_box *b, ob_kind kind, int rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The queued event itself, to set its other fields; NULL when it was dropped. */
ob_event *ob_last_event(ob_box *b);
/* Take the oldest event not yet taken into *out; false when none is left. */
bool ob_take_event(ob_box *b, ob_event *out);

/* coord.c sends msg[n_sent] and counts it sent (its payloads now belong to ZeroMQ). */
void ob_mark_sent(ob_box *b);
/* Forget every message and event; payloads of messages not sent are freed. The box stays
 * usable. */
void ob_clear(ob_box *b);
/* ob_clear and free the arrays. */
void ob_free(ob_box *b);

#endif
