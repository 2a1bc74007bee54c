/* wire.c — see wire.h. */
#include "common/wire.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"

void wire_free_malloc(void *data, void *hint)
{
    (void)hint;
    free(data);
}

const char *wire_code_name(int code, const char *unknown)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&epmoe__error_code__descriptor, code);
    return v ? v->name : unknown;
}

const char *wire_type_name(uint16_t type)
{
    static _Thread_local char buf[32];
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&epmoe__msg_type__descriptor, type);
    if (v == NULL) {
        snprintf(buf, sizeof buf, "type %u", (unsigned)type);
        return buf;
    }
    return v->name; /* "MSG_REGISTER" */
}

int wire_socket_defaults(void *sock, int64_t max_msg, ep_err *err)
{
    int linger = 0;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0)
        return ep_err_set(err, "zmq_setsockopt(LINGER): %s", zmq_strerror(zmq_errno()));
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg) != 0)
        return ep_err_set(err, "zmq_setsockopt(MAXMSGSIZE): %s", zmq_strerror(zmq_errno()));
    return 0;
}

int wire_check_endpoint(const char *ep, ep_err *err)
{
    const char *forms = "expected tcp://HOST:PORT (PORT 1..65535) or ipc://PATH";
    if (strncmp(ep, "ipc://", 6) == 0) {
        if (ep[6] == '\0')
            return ep_err_set(err, "\"%.200s\": ipc:// without a path; %s", ep, forms);
        return 0;
    }
    if (strncmp(ep, "tcp://", 6) != 0)
        return ep_err_set(err, "\"%.200s\" is not a ZeroMQ endpoint; %s", ep, forms);
    const char *colon = strrchr(ep + 6, ':');
    if (colon == NULL || colon == ep + 6)
        return ep_err_set(err, "\"%.200s\": no HOST:PORT; %s", ep, forms);
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || errno != 0 || port < 1 || port > 65535)
        return ep_err_set(err, "\"%.200s\": port \"%.16s\" is not in 1..65535; %s", ep, colon + 1,
                          forms);
    return 0;
}

void wire_msg_close(wire_msg *m)
{
    for (int i = 0; i < m->n_frames; i++)
        zmq_msg_close(&m->frames[i]);
    m->n_frames = 0;
    m->n_payloads = 0;
    m->body = NULL;
    m->body_len = 0;
}

/* Discard the rest of a multipart message after a framing error. */
static void wire_drain(void *sock)
{
    int more = 1;
    size_t sz = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        zmq_msg_recv(&f, sock, 0);
        zmq_msg_close(&f);
    }
}

static bool wire_has_more(void *sock)
{
    int more = 0;
    size_t sz = sizeof more;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

/* Receive the next frame into m->frames[m->n_frames]. */
static int wire_recv_frame(void *sock, wire_msg *m, int flags)
{
    zmq_msg_t *f = &m->frames[m->n_frames];
    zmq_msg_init(f);
    if (zmq_msg_recv(f, sock, flags) < 0) {
        zmq_msg_close(f);
        return -1;
    }
    m->n_frames++;
    return 0;
}

static wire_rc wire_fail(void *sock, wire_msg *m, ep_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static wire_rc wire_fail(void *sock, wire_msg *m, ep_err *err, const char *fmt, ...)
{
    ep_err e; /* formatted before the drain and close, which the arguments may point into */
    EP_ERR_FROM_ARGS(&e, EP_ERR_MALFORMED, fmt);
    wire_drain(sock);
    wire_msg_close(m);
    if (err != NULL)
        *err = e;
    return WIRE_ERR;
}

static wire_rc wire_recv_ident(void *sock, wire_msg *m, int flags, ep_err *err)
{
    zmq_msg_t id;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, sock, flags) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&id);
        if (e == EAGAIN || e == EINTR)
            return WIRE_AGAIN;
        ep_err_set(err, "zmq_msg_recv: %s", zmq_strerror(e));
        return WIRE_ERR;
    }
    size_t n = zmq_msg_size(&id);
    m->ident_len = n <= WIRE_MAX_IDENT ? n : 0;
    memcpy(m->ident, zmq_msg_data(&id), m->ident_len);
    zmq_msg_close(&id);
    if (n > WIRE_MAX_IDENT)
        return wire_fail(sock, m, err, "routing id of %zu bytes (max %d)", n, WIRE_MAX_IDENT);
    return WIRE_OK;
}

/* Check the frames already in m (version, type, body, payloads) and point body and payload[]
 * into them. The same rules for a socket's message and for frames held in memory. */
static int wire_frames_check(wire_msg *m, size_t max_body, size_t max_payload, ep_err *err)
{
    if (m->n_frames < 1)
        return ep_err_setc(err, EP_ERR_MALFORMED, "empty message");
    zmq_msg_t *v = &m->frames[0];
    if (zmq_msg_size(v) != strlen(WIRE_VERSION) ||
        memcmp(zmq_msg_data(v), WIRE_VERSION, strlen(WIRE_VERSION)) != 0)
        return ep_err_setc(err, EP_ERR_MALFORMED,
                           "not an epmoe message: first frame is not \"%s\" (%zu bytes)",
                           WIRE_VERSION, zmq_msg_size(v));
    if (m->n_frames < 2)
        return ep_err_setc(err, EP_ERR_MALFORMED,
                           "message ends after the version frame (type frame missing)");
    zmq_msg_t *t = &m->frames[1];
    if (zmq_msg_size(t) != 2)
        return ep_err_setc(err, EP_ERR_MALFORMED, "type frame has %zu bytes, expected 2",
                           zmq_msg_size(t));
    const uint8_t *tb = zmq_msg_data(t);
    m->type = (uint16_t)(tb[0] | (tb[1] << 8));
    if (m->n_frames < 3)
        return ep_err_setc(err, EP_ERR_MALFORMED, "%s: body frame missing",
                           wire_type_name(m->type));
    m->body = zmq_msg_data(&m->frames[2]);
    m->body_len = zmq_msg_size(&m->frames[2]);
    if (m->body_len > max_body)
        return ep_err_setc(err, EP_ERR_MALFORMED, "%s: body of %zu bytes exceeds the limit of %zu",
                           wire_type_name(m->type), m->body_len, max_body);
    size_t total = 0;
    for (int i = 3; i < m->n_frames; i++) {
        zmq_msg_t *p = &m->frames[i];
        m->payload[m->n_payloads] = zmq_msg_data(p);
        m->payload_len[m->n_payloads] = zmq_msg_size(p);
        m->n_payloads++;
        total += zmq_msg_size(p);
        if (total > max_payload)
            return ep_err_setc(err, EP_ERR_MALFORMED, "%s: payloads exceed the limit of %zu bytes",
                               wire_type_name(m->type), max_payload);
    }
    return 0;
}

wire_rc wire_recv(void *sock, bool router, size_t max_body, size_t max_payload, int flags,
                  wire_msg *m, ep_err *err)
{
    memset(m, 0, offsetof(wire_msg, frames));
    m->n_frames = 0;
    if (router) {
        wire_rc rc = wire_recv_ident(sock, m, flags, err);
        if (rc != WIRE_OK)
            return rc;
        flags = 0; /* the rest of a multipart message is already here */
    }
    if (wire_recv_frame(sock, m, flags) != 0) {
        int e = zmq_errno();
        if (m->ident_len == 0 && (e == EAGAIN || e == EINTR))
            return WIRE_AGAIN;
        return wire_fail(sock, m, err, "zmq_msg_recv: %s", zmq_strerror(e));
    }
    /* ZeroMQ delivers all parts or none, so reading them before checking costs no waiting;
     * only the count is bounded here (the rest is drained). */
    while (wire_has_more(sock)) {
        if (m->n_frames == 3 + WIRE_MAX_PAYLOADS)
            return wire_fail(sock, m, err, "more than %d payload frames", WIRE_MAX_PAYLOADS);
        if (wire_recv_frame(sock, m, 0) != 0)
            return wire_fail(sock, m, err, "zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
    }
    if (wire_frames_check(m, max_body, max_payload, err) != 0) {
        wire_msg_close(m);
        return WIRE_ERR;
    }
    return WIRE_OK;
}

int wire_msg_from_frames(wire_msg *m, const uint8_t *const *frames, const size_t *lens, int n,
                         size_t max_body, size_t max_payload, ep_err *err)
{
    memset(m, 0, offsetof(wire_msg, frames));
    m->n_frames = 0;
    if (n > 3 + WIRE_MAX_PAYLOADS)
        return ep_err_setc(err, EP_ERR_MALFORMED, "more than %d payload frames", WIRE_MAX_PAYLOADS);
    for (int i = 0; i < n; i++) {
        if (zmq_msg_init_size(&m->frames[i], lens[i]) != 0) {
            wire_msg_close(m);
            return ep_err_set(err, "out of memory for a frame of %zu bytes", lens[i]);
        }
        m->n_frames++;
        if (lens[i])
            memcpy(zmq_msg_data(&m->frames[i]), frames[i], lens[i]);
    }
    if (wire_frames_check(m, max_body, max_payload, err) != 0) {
        wire_msg_close(m);
        return -1;
    }
    return 0;
}

void wire_msg_move(wire_msg *dst, wire_msg *src)
{
    memcpy(dst, src, offsetof(wire_msg, frames));
    dst->n_frames = 0;
    for (int i = 0; i < src->n_frames; i++) {
        zmq_msg_init(&dst->frames[i]);
        zmq_msg_move(&dst->frames[i], &src->frames[i]);
        dst->n_frames++;
    }
    /* the views must point into dst's frames: a small frame's bytes live inside its zmq_msg_t */
    if (dst->n_frames >= 3) {
        dst->body = zmq_msg_data(&dst->frames[2]);
        for (int i = 0; i < dst->n_payloads; i++)
            dst->payload[i] = zmq_msg_data(&dst->frames[3 + i]);
    }
    wire_msg_close(src);
}

const char *wire_user_id(const wire_msg *m)
{
    if (m->n_frames < 1)
        return NULL;
    /* zmq_msg_gets takes a non-const message but only reads its metadata */
    return zmq_msg_gets((zmq_msg_t *)&m->frames[0], "User-Id");
}

static int wire_send_frame(void *sock, const void *data, size_t len, bool more, bool dontwait)
{
    int flags = (more ? ZMQ_SNDMORE : 0) | (dontwait ? ZMQ_DONTWAIT : 0);
    return zmq_send(sock, data, len, flags) < 0 ? -1 : 0;
}

static int wire_send_payload(void *sock, const wire_payload *p, bool more, bool dontwait)
{
    int flags = (more ? ZMQ_SNDMORE : 0) | (dontwait ? ZMQ_DONTWAIT : 0);
    if (p->free_fn == NULL)
        return zmq_send(sock, p->data, p->len, flags) < 0 ? -1 : 0;
    zmq_msg_t msg;
    if (zmq_msg_init_data(&msg, (void *)p->data, p->len, p->free_fn, p->hint) != 0) {
        p->free_fn((void *)p->data, p->hint);
        return -1;
    }
    if (zmq_msg_send(&msg, sock, flags) < 0) {
        zmq_msg_close(&msg); /* calls free_fn */
        return -1;
    }
    return 0;
}

/* Payloads not yet handed to ZeroMQ when a send fails are still ours to free. */
static void wire_free_payloads(const wire_payload *payloads, int from, int n)
{
    for (int i = from; i < n; i++)
        if (payloads[i].free_fn)
            payloads[i].free_fn((void *)payloads[i].data, payloads[i].hint);
}

int wire_send_packed(void *sock, const uint8_t *ident, size_t ident_len, uint16_t type,
                     const uint8_t *body, size_t body_len, const wire_payload *payloads,
                     int n_payloads, bool dontwait, ep_err *err)
{
    uint8_t tb[2] = {(uint8_t)(type & 0xFF), (uint8_t)(type >> 8)};
    int sent = 0;
    if (ident_len && wire_send_frame(sock, ident, ident_len, true, dontwait) != 0)
        goto fail_send;
    /* after the first frame the rest of a multipart message never blocks */
    if (wire_send_frame(sock, WIRE_VERSION, strlen(WIRE_VERSION), true, dontwait && !ident_len) ||
        wire_send_frame(sock, tb, 2, true, false) ||
        wire_send_frame(sock, body, body_len, n_payloads > 0, false))
        goto fail_send;
    for (; sent < n_payloads; sent++)
        if (wire_send_payload(sock, &payloads[sent], sent + 1 < n_payloads, false) != 0) {
            sent++; /* that payload was freed by wire_send_payload */
            goto fail_send;
        }
    return 0;
fail_send:
    ep_err_set(err, "sending %s: %s", wire_type_name(type), zmq_strerror(zmq_errno()));
    wire_free_payloads(payloads, sent, n_payloads);
    return -1;
}

int wire_send(void *sock, const uint8_t *ident, size_t ident_len, uint16_t type,
              const ProtobufCMessage *body, const wire_payload *payloads, int n_payloads,
              bool dontwait, ep_err *err)
{
    size_t blen = body ? protobuf_c_message_get_packed_size(body) : 0;
    uint8_t stackbuf[512];
    uint8_t *bbuf = blen <= sizeof stackbuf ? stackbuf : malloc(blen);
    if (bbuf == NULL) {
        wire_free_payloads(payloads, 0, n_payloads);
        return ep_err_set(err, "out of memory packing %s (%zu bytes)", wire_type_name(type), blen);
    }
    if (body)
        protobuf_c_message_pack(body, bbuf);
    int rc = wire_send_packed(sock, ident, ident_len, type, body ? bbuf : NULL, blen, payloads,
                              n_payloads, dontwait, err);
    if (bbuf != stackbuf)
        free(bbuf);
    return rc;
}

/* ---- bounded unpacking ---- */

typedef struct wire_budget {
    size_t left;
} wire_budget;

static void *wire_budget_alloc(void *data, size_t size)
{
    wire_budget *b = data;
    if (size > b->left)
        return NULL;
    b->left -= size;
    return malloc(size);
}

static void wire_plain_free(void *data, void *ptr)
{
    (void)data;
    free(ptr);
}

/* Read a varint at *i of p[0..n); -1 when it runs past the end or beyond 10 bytes. */
static int wire_varint(const uint8_t *p, size_t n, size_t *i, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *i < n; shift += 7) {
        uint8_t b = p[(*i)++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Walk an encoded message that protobuf-c accepted and refuse strings with a NUL byte: they
 * would reach us cut at the NUL ("a0\0x" taken as "a0"), so a name could pass for another. */
static int wire_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                              int depth, ep_err *err)
{
    size_t i = 0;
    uint64_t key, len;
    while (i < n) {
        if (wire_varint(p, n, &i, &key) != 0)
            return 0; /* protobuf-c has judged the framing; nothing more to find here */
        switch (key & 7) {
        case 0:
            if (wire_varint(p, n, &i, &len) != 0)
                return 0;
            break;
        case 1:
            i += 8;
            break;
        case 5:
            i += 4;
            break;
        case 2: {
            if (wire_varint(p, n, &i, &len) != 0 || len > n - i)
                return 0;
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p + i, 0, len) != NULL)
                return ep_err_setc(err, EP_ERR_MALFORMED, "%s.%s: string contains a NUL byte",
                                   d->short_name, f->name);
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 8 &&
                wire_check_strings(f->descriptor, p + i, len, depth + 1, err) != 0)
                return -1;
            i += len;
            break;
        }
        default:
            return 0;
        }
    }
    return 0;
}

ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, const wire_msg *m,
                              ep_err *err)
{
    /* Decoded structs can be far larger than their encoding (a 2-byte sub-message becomes a
     * struct of ~100 bytes), hence the factor; the body itself is already bounded. */
    wire_budget b = {.left = 64 * m->body_len + (1u << 20)};
    ProtobufCAllocator a = {
        .alloc = wire_budget_alloc, .free = wire_plain_free, .allocator_data = &b};
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, &a, m->body_len, m->body);
    if (msg == NULL) {
        ep_err_setc(err, EP_ERR_MALFORMED, "%s: body of %zu bytes is not a valid %s message",
                    wire_type_name(m->type), m->body_len, desc->short_name);
    } else if (wire_check_strings(desc, m->body, m->body_len, 0, err) != 0) {
        ep_err_prefix(err, "%s", wire_type_name(m->type));
        wire_free_unpacked(msg);
        msg = NULL;
    }
    return msg;
}

void wire_free_unpacked(ProtobufCMessage *msg)
{
    static ProtobufCAllocator a = {.alloc = NULL, .free = wire_plain_free, .allocator_data = NULL};
    if (msg)
        protobuf_c_message_free_unpacked(msg, &a);
}

/* ep_err_code mirrors the wire's ErrorCode value for value (error.h): a code can pass from
 * an ep_err to a body by a cast. */
#define WIRE_SAME_CODE(x) static_assert((int)EP_##x == (int)EPMOE__ERROR_CODE__##x, #x)
WIRE_SAME_CODE(ERR_NONE);
WIRE_SAME_CODE(ERR_MALFORMED);
WIRE_SAME_CODE(ERR_UNKNOWN_TYPE);
WIRE_SAME_CODE(ERR_BAD_REQUEST);
WIRE_SAME_CODE(ERR_UNKNOWN_WORKER);
WIRE_SAME_CODE(ERR_CONFIG_HASH);
WIRE_SAME_CODE(ERR_NOT_READY);
WIRE_SAME_CODE(ERR_STEP_FAILED);
WIRE_SAME_CODE(ERR_TIMEOUT);
WIRE_SAME_CODE(ERR_WORKER_LOST);
WIRE_SAME_CODE(ERR_LOAD_FAILED);
WIRE_SAME_CODE(ERR_DUPLICATE);
WIRE_SAME_CODE(ERR_SHUTTING_DOWN);
WIRE_SAME_CODE(ERR_BUSY);
WIRE_SAME_CODE(ERR_NOT_REGISTERED);
WIRE_SAME_CODE(ERR_COMM_FAILED);
WIRE_SAME_CODE(ERR_REFUSED);
WIRE_SAME_CODE(ERR_NOT_SUPPORTED);
static_assert((int)EPMOE__ERROR_CODE__ERR_REFUSED < (int)EP_ERR_GENERIC,
              "EP_ERR_GENERIC is a wire code");

Epmoe__ErrorCode wire_code(const ep_err *err)
{
    /* a code the wire does not know (EP_ERR_GENERIC) goes as "failed, the message says why" */
    if (err == NULL || protobuf_c_enum_descriptor_get_value(&epmoe__error_code__descriptor,
                                                            (int)err->code) == NULL)
        return EPMOE__ERROR_CODE__ERR_STEP_FAILED;
    return (Epmoe__ErrorCode)err->code;
}

void wire_error_body(Epmoe__Error *e, const ep_err *err, uint16_t in_reply_to)
{
    epmoe__error__init(e);
    e->has_code = 1;
    e->code = wire_code(err);
    e->message = (char *)err->msg; /* borrowed: packing only reads it */
    if (in_reply_to) {
        e->has_in_reply_to = 1;
        e->in_reply_to = in_reply_to;
    }
}

void wire_reply_error(void *sock, const uint8_t *ident, size_t ident_len, const ep_err *err,
                      uint16_t in_reply_to)
{
    Epmoe__Error e;
    wire_error_body(&e, err, in_reply_to);
    wire_send(sock, ident, ident_len, EPMOE__MSG_TYPE__MSG_ERROR, &e.base, NULL, 0, true, NULL);
}

void wire_send_error(void *sock, const uint8_t *ident, size_t ident_len, Epmoe__ErrorCode code,
                     uint16_t in_reply_to, const char *fmt, ...)
{
    ep_err e;
    EP_ERR_FROM_ARGS(&e, (ep_err_code)code, fmt);
    wire_reply_error(sock, ident, ident_len, &e, in_reply_to);
}
