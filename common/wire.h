/*
 * wire.h — framing of every epmoe ZeroMQ message (prefix wire_).
 *
 * Layout (proto/epmoe.proto, docs/protocol.md), after the routing-id frame on ROUTER sockets:
 *   frame 0  "EPMOE1"            version tag
 *   frame 1  uint16 LE           message type (Epmoe__MsgType)
 *   frame 2  protobuf body       may be empty (all fields absent)
 *   frame 3+ payloads            raw tensor bytes declared by the body (<= WIRE_MAX_PAYLOADS)
 *
 * wire_recv reads one whole message (ZeroMQ delivers all parts or none) and checks the frame
 * structure, the version and the sizes before anyone unpacks it; a malformed message is drained
 * and reported, never half-read. wire_unpack decodes the body with an allocator whose budget is
 * bounded by the body size, so a hostile body cannot make us allocate without bound (the
 * protobuf-c repeated-field overflow history, anchors-ops-style §1.2). Semantic validation of
 * the fields is the receiver's job.
 *
 * Payloads are sent zero-copy when the caller hands over ownership (free_fn), else copied.
 */
#ifndef EPMOE_WIRE_H
#define EPMOE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <zmq.h>

#include "common/error.h"
#include "epmoe.pb-c.h"

#define WIRE_VERSION      "EPMOE1"
#define WIRE_MAX_PAYLOADS 8
#define WIRE_MAX_IDENT    255

typedef struct wire_payload {
    const void *data;
    size_t len;
    /* When set, ZeroMQ takes ownership of data and calls free_fn(data, hint) once sent. */
    void (*free_fn)(void *data, void *hint);
    void *hint;
} wire_payload;

typedef struct wire_msg {
    uint8_t ident[WIRE_MAX_IDENT]; /* routing id (ROUTER sockets), ident_len 0 otherwise */
    size_t ident_len;
    uint16_t type;
    const uint8_t *body;
    size_t body_len;
    int n_payloads;
    const uint8_t *payload[WIRE_MAX_PAYLOADS];
    size_t payload_len[WIRE_MAX_PAYLOADS];
    /* owned frames */
    zmq_msg_t frames[3 + WIRE_MAX_PAYLOADS];
    int n_frames;
} wire_msg;

typedef enum wire_rc {
    WIRE_OK = 0,
    WIRE_ERR = -1,   /* a malformed message was consumed; err says why; ident kept if read */
    WIRE_AGAIN = -2, /* nothing to read (ZMQ_DONTWAIT) or interrupted by a signal */
} wire_rc;

/* Receive one message. router: the socket is a ROUTER (first frame is the routing id).
 * max_body bounds frame 2; max_payload bounds the payload bytes in total. flags: 0 or
 * ZMQ_DONTWAIT. On WIRE_OK the caller owns m and must wire_msg_close it; on WIRE_ERR m is
 * already closed but m->ident/ident_len stay valid for an error reply. */
wire_rc wire_recv(void *sock, bool router, size_t max_body, size_t max_payload, int flags,
                  wire_msg *m, ep_err *err);
void wire_msg_close(wire_msg *m);

/* Build m from frames held in memory (copied), with wire_recv's checks: what fuzz targets and
 * tests feed the parsers that sit behind a socket. 0, or -1 with err (m is then closed). */
int wire_msg_from_frames(wire_msg *m, const uint8_t *const *frames, const size_t *lens, int n,
                         size_t max_body, size_t max_payload, ep_err *err);

/* Move src's frames into dst (zmq_msg_move; src is left closed). A wire_msg must never be
 * copied by value: a frame of up to 33 bytes keeps its bytes inside its zmq_msg_t, so the
 * copy's body and payload pointers would point into the original. */
void wire_msg_move(wire_msg *dst, wire_msg *src);

/* The ZAP user id the sender authenticated as (common/auth.h: its key's name), or NULL when
 * the socket has no authentication. */
const char *wire_user_id(const wire_msg *m);

/* Send one message. ident/ident_len: routing id for ROUTER sockets (NULL/0 otherwise). body may
 * be NULL (empty frame). Sends with ZMQ_DONTWAIT when dontwait, so a ROUTER with
 * ROUTER_MANDATORY reports an unreachable or congested peer instead of blocking. Payloads whose
 * free_fn is set are owned by the call from here on, whether it succeeds or not. */
int wire_send(void *sock, const uint8_t *ident, size_t ident_len, uint16_t type,
              const ProtobufCMessage *body, const wire_payload *payloads, int n_payloads,
              bool dontwait, ep_err *err);

/* The same with a body already packed (body_len 0: empty frame). */
int wire_send_packed(void *sock, const uint8_t *ident, size_t ident_len, uint16_t type,
                     const uint8_t *body, size_t body_len, const wire_payload *payloads,
                     int n_payloads, bool dontwait, ep_err *err);

/* Decode m's body as desc with a bounded allocator. A string field with a NUL byte is refused
 * (it would arrive cut at the NUL). Free with wire_free_unpacked. */
ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, const wire_msg *m,
                              ep_err *err);
void wire_free_unpacked(ProtobufCMessage *msg);

/* The wire code of an error: err's code, EPMOE__ERROR_CODE__ERR_STEP_FAILED ("failed, the
 * message says why") for one no layer classified (EP_ERR_GENERIC). */
Epmoe__ErrorCode wire_code(const ep_err *err);
/* The one "code + message" body: an Error {wire_code(err), err->msg, in_reply_to (0: absent)}.
 * err's message is borrowed: err must outlive the packing of e. The worker's replies, the
 * coordinator's outbox and wire_send_error all build their Error bodies here. */
void wire_error_body(Epmoe__Error *e, const ep_err *err, uint16_t in_reply_to);
/* Send err as an Error message (best effort: a failed send is not reported). */
void wire_reply_error(void *sock, const uint8_t *ident, size_t ident_len, const ep_err *err,
                      uint16_t in_reply_to);
/* The same with the code and a formatted message. */
void wire_send_error(void *sock, const uint8_t *ident, size_t ident_len, Epmoe__ErrorCode code,
                     uint16_t in_reply_to, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* "ERR_BUSY", "ERR_TIMEOUT", ... for a wire ErrorCode; `unknown` (which may be NULL) for a
 * number the proto does not name. Static strings. */
const char *wire_code_name(int code, const char *unknown);

/* "REGISTER", "STEP_DONE", ... or "type N" for unknown types (static or thread-local). */
const char *wire_type_name(uint16_t type);

/* Options every epmoe socket gets before bind/connect: linger 0 (a stopping daemon never hangs
 * in zmq_ctx_term) and ZMQ_MAXMSGSIZE (a peer sending more is disconnected by libzmq). */
int wire_socket_defaults(void *sock, int64_t max_msg, ep_err *err);

/* An endpoint a client may connect to: tcp://HOST:PORT with PORT 1..65535, or ipc://PATH.
 * (libzmq takes "tcp://h:99999" and retries it for ever; a typo must be an error instead.) */
int wire_check_endpoint(const char *ep, ep_err *err);

/* Payload free function for buffers from malloc. */
void wire_free_malloc(void *data, void *hint);

#endif
