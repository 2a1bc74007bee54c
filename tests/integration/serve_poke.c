/*
 * serve_poke — a raw client of a worker's client endpoint (docs/protocol.md "Serving path"),
 * for the tests: it speaks SUBMIT/RESULT itself, without libepmoe, so the worker's side is
 * tested on its own and with requests libepmoe would never send.
 *
 *   serve_poke ENDPOINT MODEL_DIR LAYER IN OUT [INFLIGHT [REPEAT]]
 *       submits IN (epmoectl forward's input file) REPEAT times (default 1), INFLIGHT at a time
 *       (default 1), checks every answer is the same, writes the first to OUT (forward's output
 *       format) and prints "replayed N, epochs E1..E2" on stdout. Exit 0, or 1 with the error.
 *   serve_poke ENDPOINT MODEL_DIR LAYER IN - bad KIND
 *       one malformed request; prints the RESULT's code name and message. KIND: layer (a layer
 *       past the last), zero (0 tokens), many (EP_MAX_TOKENS + 1 tokens claimed, the input's
 *       rows sent: a frame above the endpoint's bound is closed unanswered), noids (a hash layer
 *       without ids), hash (a wrong config hash), nan (a NaN in the hidden states).
 *   serve_poke ENDPOINT MODEL_DIR LAYER IN - flood N
 *       N requests back to back from one client, request 1 sent twice (a resend while in
 *       flight: answered once), more than the entry takes from one client at a time; waits for
 *       the N answers and prints "ok A busy B other C" (the metrics test compares the entry's
 *       counters with what the client saw). Exit 0 when every answer is ok or ERR_BUSY.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/limits.h"
#include "common/model_config.h"
#include "common/wire.h"
#include "ctl/fwd_io.h"
#include "epmoe.pb-c.h"

typedef struct poke {
    void *sock;
    mc_config c;
    uint64_t hash;
    fwdio_input in;
    int layer;
} poke;

/* send_T: the rows the payloads carry (0: T). */
static int poke_send(poke *p, uint64_t seq, uint32_t layer, uint32_t T, uint32_t send_T,
                     const uint16_t *x, const int64_t *ids, bool with_hash, uint64_t hash)
{
    Epmoe__Submit s = EPMOE__SUBMIT__INIT;
    s.has_client = s.has_seq = s.has_layer = s.has_n_tokens = s.has_has_ids = 1;
    s.client = 0x5e5e5e5e12345678ull;
    s.seq = seq;
    s.layer = layer;
    s.n_tokens = T;
    s.has_ids = ids != NULL;
    s.has_config_hash = with_hash;
    s.config_hash = hash;
    s.has_timeout_ms = 1;
    s.timeout_ms = 20000;
    size_t H = (size_t)p->c.hidden_size;
    size_t rows = send_T ? send_T : T;
    wire_payload pl[2] = {{.data = x, .len = rows * H * 2}, {.data = ids, .len = rows * 8}};
    ep_err err;
    if (wire_send(p->sock, NULL, 0, EPMOE__MSG_TYPE__MSG_SUBMIT, &s.base, pl, ids ? 2 : 1, false,
                  &err) != 0) {
        fprintf(stderr, "serve_poke: send: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* One RESULT: 0 with the message (caller closes), -1 on timeout or a broken one. */
static int poke_recv(poke *p, wire_msg *m, Epmoe__Result **r)
{
    zmq_pollitem_t it = {.socket = p->sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 30000) <= 0) {
        fprintf(stderr, "serve_poke: no answer in 30 s\n");
        return -1;
    }
    ep_err err;
    if (wire_recv(p->sock, false, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, 0, m, &err) != WIRE_OK) {
        fprintf(stderr, "serve_poke: recv: %s\n", err.msg);
        return -1;
    }
    *r = (Epmoe__Result *)wire_unpack(&epmoe__result__descriptor, m, &err);
    if (m->type != EPMOE__MSG_TYPE__MSG_RESULT || *r == NULL) {
        fprintf(stderr, "serve_poke: answer of type %s: %s\n", wire_type_name(m->type),
                *r ? "" : err.msg);
        wire_msg_close(m);
        return -1;
    }
    return 0;
}

static int poke_bad(poke *p, const char *kind)
{
    const uint16_t *x = p->in.x;
    const int64_t *ids = p->in.ids;
    uint32_t T = (uint32_t)p->in.T, layer = (uint32_t)p->layer, send_T = 0;
    bool with_hash = true;
    uint64_t hash = p->hash;
    if (strcmp(kind, "layer") == 0) {
        layer = (uint32_t)mc_num_layers(&p->c);
    } else if (strcmp(kind, "zero") == 0) {
        T = 0;
    } else if (strcmp(kind, "many") == 0) {
        /* claimed, with the input's rows: a frame of EP_MAX_TOKENS + 1 rows is above the
         * endpoint's bound, and libzmq closes such a connection unanswered */
        T = EP_MAX_TOKENS + 1;
        send_T = (uint32_t)p->in.T;
        ids = NULL;
    } else if (strcmp(kind, "noids") == 0) {
        layer = 0;
        ids = NULL;
    } else if (strcmp(kind, "hash") == 0) {
        hash ^= 1;
    } else if (strcmp(kind, "nan") == 0) {
        ((uint16_t *)x)[3] = 0x7fc0;
    } else {
        fprintf(stderr, "serve_poke: unknown bad kind %s\n", kind);
        return 1;
    }
    if (poke_send(p, 1, layer, T, send_T, x, ids, with_hash, hash) != 0)
        return 1;
    wire_msg m;
    Epmoe__Result *r;
    if (poke_recv(p, &m, &r) != 0)
        return 1;
    printf("%s %s\n",
           protobuf_c_enum_descriptor_get_value(&epmoe__error_code__descriptor, r->code)->name,
           r->message ? r->message : "");
    int rc = r->has_code && r->code != EPMOE__ERROR_CODE__ERR_NONE ? 0 : 1;
    wire_free_unpacked(&r->base);
    wire_msg_close(&m);
    return rc;
}

static int poke_flood(poke *p, int n)
{
    uint32_t T = (uint32_t)p->in.T, layer = (uint32_t)p->layer;
    int ok = 0, busy = 0, other = 0;
    for (int i = 0; i <= n; i++) /* 1, 1, 2, 3, ..., n */
        if (poke_send(p, (uint64_t)(i ? i : 1), layer, T, 0, p->in.x, p->in.ids, true, p->hash) !=
            0)
            return 1;
    for (int got = 0; got < n; got++) {
        wire_msg m;
        Epmoe__Result *r;
        if (poke_recv(p, &m, &r) != 0)
            return 1;
        int code = r->has_code ? (int)r->code : 0;
        ok += code == EPMOE__ERROR_CODE__ERR_NONE;
        busy += code == EPMOE__ERROR_CODE__ERR_BUSY;
        other += code != EPMOE__ERROR_CODE__ERR_NONE && code != EPMOE__ERROR_CODE__ERR_BUSY;
        wire_free_unpacked(&r->base);
        wire_msg_close(&m);
    }
    printf("ok %d busy %d other %d\n", ok, busy, other);
    return other == 0 ? 0 : 1;
}

static int poke_run(poke *p, const char *out, int inflight, int repeat)
{
    size_t T = (size_t)p->in.T, H = (size_t)p->c.hidden_size, k = (size_t)p->c.num_experts_per_tok;
    uint16_t *first = NULL;
    int32_t *ids = NULL;
    float *w = NULL;
    int sent = 0, got = 0, replayed = 0;
    uint64_t e_lo = UINT64_MAX, e_hi = 0;
    while (got < repeat) {
        while (sent < repeat && sent - got < inflight)
            if (poke_send(p, (uint64_t)++sent, (uint32_t)p->layer, (uint32_t)T, 0, p->in.x,
                          p->in.ids, true, p->hash) != 0)
                return 1;
        wire_msg m;
        Epmoe__Result *r;
        if (poke_recv(p, &m, &r) != 0)
            return 1;
        got++;
        if (r->has_code && r->code != EPMOE__ERROR_CODE__ERR_NONE) {
            fprintf(
                stderr, "serve_poke: request %llu: %s %s\n", (unsigned long long)r->seq,
                protobuf_c_enum_descriptor_get_value(&epmoe__error_code__descriptor, r->code)->name,
                r->message ? r->message : "");
            return 1;
        }
        if (m.n_payloads != 3 || m.payload_len[0] != T * H * 2 || m.payload_len[1] != T * k * 4 ||
            m.payload_len[2] != T * k * 4) {
            fprintf(stderr, "serve_poke: request %llu: payloads do not match [%zu, %zu]\n",
                    (unsigned long long)r->seq, T, H);
            return 1;
        }
        replayed += r->replayed;
        e_lo = r->epoch < e_lo ? r->epoch : e_lo;
        e_hi = r->epoch > e_hi ? r->epoch : e_hi;
        if (first == NULL) {
            first = malloc(T * H * 2);
            ids = malloc(T * k * 4);
            w = malloc(T * k * 4);
            memcpy(first, m.payload[0], T * H * 2);
            memcpy(ids, m.payload[1], T * k * 4);
            memcpy(w, m.payload[2], T * k * 4);
        } else if (memcmp(first, m.payload[0], T * H * 2) != 0 ||
                   memcmp(ids, m.payload[1], T * k * 4) != 0) {
            fprintf(stderr, "serve_poke: request %llu differs from the first answer\n",
                    (unsigned long long)r->seq);
            return 1;
        }
        wire_free_unpacked(&r->base);
        wire_msg_close(&m);
    }
    ep_err err;
    if (fwdio_write(out, (int)T, (int)H, (int)k, first, ids, w, &err) != 0) {
        fprintf(stderr, "serve_poke: %s\n", err.msg);
        return 1;
    }
    printf("replayed %d, epochs %llu..%llu\n", replayed, (unsigned long long)e_lo,
           (unsigned long long)e_hi);
    free(first);
    free(ids);
    free(w);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: serve_poke ENDPOINT MODEL_DIR LAYER IN OUT [INFLIGHT [REPEAT]]\n"
                        "       serve_poke ENDPOINT MODEL_DIR LAYER IN - bad KIND\n"
                        "       serve_poke ENDPOINT MODEL_DIR LAYER IN - flood N\n");
        return 64;
    }
    poke p = {.layer = atoi(argv[3])};
    char path[EP_MAX_PATH];
    ep_err err;
    snprintf(path, sizeof path, "%s/config.json", argv[2]);
    if (mc_load(path, &p.c, &err) < 0 || fwdio_read(argv[4], &p.c, p.layer, &p.in, &err) != 0) {
        fprintf(stderr, "serve_poke: %s\n", err.msg);
        return 1;
    }
    p.hash = mc_hash(&p.c);
    void *ctx = zmq_ctx_new();
    p.sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(p.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(p.sock, argv[1]) != 0) {
        fprintf(stderr, "serve_poke: connect %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    int rc =
        argc >= 8 && strcmp(argv[6], "bad") == 0 ? poke_bad(&p, argv[7])
        : argc >= 8 && strcmp(argv[6], "flood") == 0
            ? poke_flood(&p, atoi(argv[7]))
            : poke_run(&p, argv[5], argc > 6 ? atoi(argv[6]) : 1, argc > 7 ? atoi(argv[7]) : 1);
    fwdio_input_free(&p.in);
    zmq_close(p.sock);
    zmq_ctx_term(ctx);
    return rc;
}
