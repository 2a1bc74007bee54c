/*
 * outbox.c — the messages and events a passive module returns (see outbox.h). Arrays grow by
 * doubling; a box holds what one loop turn produces (a few messages per worker at most).
 */
#include "coordinator/outbox.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static void ob_free_payloads(wire_payload *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i].free_fn)
            p[i].free_fn((void *)p[i].data, p[i].hint);
}

static int ob_grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (p == NULL)
        return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

ob_msg *ob_send(ob_box *b, ob_to to, int rank, const uint8_t *ident, size_t ident_len,
                uint16_t type, const ProtobufCMessage *body, const wire_payload *payloads,
                int n_payloads)
{
    wire_payload p[WIRE_MAX_PAYLOADS];
    int np = n_payloads < WIRE_MAX_PAYLOADS ? n_payloads : WIRE_MAX_PAYLOADS;
    if (np > 0)
        memcpy(p, payloads, (size_t)np * sizeof *p);
    size_t blen = body ? protobuf_c_message_get_packed_size(body) : 0;
    uint8_t *bbuf = blen ? malloc(blen) : NULL;
    if ((blen && bbuf == NULL) || ident_len > WIRE_MAX_IDENT ||
        ob_grow((void **)&b->msg, &b->cap_msg, b->n_msg + 1, sizeof *b->msg) != 0) {
        log_error("outbox: cannot queue %s (out of memory)", wire_type_name(type));
        free(bbuf);
        ob_free_payloads(p, np);
        return NULL;
    }
    if (blen)
        protobuf_c_message_pack(body, bbuf);
    ob_msg *m = &b->msg[b->n_msg++];
    memset(m, 0, sizeof *m);
    m->to = to;
    m->rank = rank;
    if (ident_len)
        memcpy(m->ident, ident, ident_len);
    m->ident_len = ident_len;
    m->type = type;
    m->body = bbuf;
    m->body_len = blen;
    if (np > 0)
        memcpy(m->payload, p, (size_t)np * sizeof *p);
    m->n_payloads = np;
    return m;
}

ob_msg *ob_to_rank(ob_box *b, int rank, uint16_t type, const ProtobufCMessage *body,
                   const wire_payload *payloads, int n_payloads)
{
    return ob_send(b, OB_TO_RANK, rank, NULL, 0, type, body, payloads, n_payloads);
}

void ob_to_worker_id(ob_box *b, const uint8_t *ident, size_t ident_len, uint16_t type,
                     const ProtobufCMessage *body)
{
    ob_send(b, OB_TO_WORKER_ID, -1, ident, ident_len, type, body, NULL, 0);
}

void ob_reply_error(ob_box *b, ob_to to, int rank, const uint8_t *ident, size_t ident_len,
                    const ep_err *err, uint16_t in_reply_to)
{
    Epmoe__Error e;
    wire_error_body(&e, err, in_reply_to);
    ob_send(b, to, rank, ident, ident_len, EPMOE__MSG_TYPE__MSG_ERROR, &e.base, NULL, 0);
}

void ob_error(ob_box *b, ob_to to, int rank, const uint8_t *ident, size_t ident_len,
              Epmoe__ErrorCode code, uint16_t in_reply_to, const char *fmt, ...)
{
    ep_err e;
    EP_ERR_FROM_ARGS(&e, (ep_err_code)code, fmt);
    ob_reply_error(b, to, rank, ident, ident_len, &e, in_reply_to);
}

void ob_event_add(ob_box *b, ob_kind kind, int rank, const char *fmt, ...)
{
    if (ob_grow((void **)&b->ev, &b->cap_ev, b->n_ev + 1, sizeof *b->ev) != 0) {
        log_error("outbox: cannot queue event %d for rank %d (out of memory)", (int)kind, rank);
        return;
    }
    ob_event *e = &b->ev[b->n_ev++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->rank = rank;
    EP_FORMAT_ARGS(e->text, sizeof e->text, fmt);
}

ob_event *ob_last_event(ob_box *b)
{
    return b->n_ev > b->ev_head ? &b->ev[b->n_ev - 1] : NULL;
}

bool ob_take_event(ob_box *b, ob_event *out)
{
    if (b->ev_head >= b->n_ev)
        return false;
    *out = b->ev[b->ev_head++];
    return true;
}

void ob_mark_sent(ob_box *b)
{
    ob_msg *m = &b->msg[b->n_sent++];
    m->n_payloads = 0; /* ZeroMQ owns them now, sent or not (wire_send_packed) */
}

void ob_clear(ob_box *b)
{
    for (int i = 0; i < b->n_msg; i++) {
        if (i >= b->n_sent)
            ob_free_payloads(b->msg[i].payload, b->msg[i].n_payloads);
        free(b->msg[i].body);
    }
    b->n_msg = b->n_sent = 0;
    b->n_ev = b->ev_head = 0;
}

void ob_free(ob_box *b)
{
    ob_clear(b);
    free(b->msg);
    free(b->ev);
    *b = (ob_box){0};
}
