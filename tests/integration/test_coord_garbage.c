/*
 * test_coord_garbage.c — hostile and broken input on both coordinator sockets.
 *
 * Proves: on coordinator.listen and coordinator.admin alike, a wrong version tag, a bad type
 * frame, a missing body, a body that does not decode, an unknown type, a message of the other
 * socket's kind and 3 MB of random junk each get an Error reply with the right code (the ROUTER
 * knows the sender), and the daemon keeps serving: a registered worker stays ready, STATUS and
 * a FORWARD work afterwards, and it still stops cleanly (exit 0, no leaks under ASan). A
 * REGISTER whose name hides a NUL byte ("a0\0x", which used to register as a0) is refused as
 * malformed naming the field; a 100 KB name is refused naming its length (it used to be
 * reported as "REGISTER without a worker name"); a FORWARD of more frames than a socket's
 * MAXMSGSIZE (the model's largest frame) admits never reaches the daemon, which serves on.
 * Connections that share a routing id (which aborted libzmq under ROUTER_HANDOVER) never stop
 * the daemon, nor does a connection that goes away while libzmq has stopped reading it (its
 * queue full), which aborted libzmq 4.3.4 through the daemon's own ZeroMQ heartbeat.
 *
 * Usage: test_coord_garbage PATH/epmoe-coordinator
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "itest.h"
#include "test.h"

static const char *coord_bin;

#define FINISH(t) CHECK_EQ(it_finish(&(t), test_cur_failed), 0)

typedef struct frame {
    const void *data;
    size_t len;
} frame;

/* Send raw frames, then wait (pumping the fake workers) for the Error that comes back: its code,
 * -2 for another message, -3 for no answer. */
static int send_raw_expect_error(itest *t, void *sock, const frame *f, int n, char *msg, size_t cap)
{
    for (int i = 0; i < n; i++)
        zmq_send(sock, f[i].data, f[i].len, i + 1 < n ? ZMQ_SNDMORE : 0);
    int code = -1, type = it_raw_recv(t, sock, 3000, &code, msg, cap);
    if (type < 0)
        return -3; /* no answer */
    return type == EPMOE__MSG_TYPE__MSG_ERROR ? code : -2;
}

static void garbage_round(itest *t, void *sock, uint16_t good_type, uint16_t other_type)
{
    char msg[1024];
    uint8_t tb[2] = {(uint8_t)good_type, (uint8_t)(good_type >> 8)};
    uint8_t ob[2] = {(uint8_t)other_type, (uint8_t)(other_type >> 8)};
    uint8_t ub[2] = {0xE7, 0x03}; /* 999 */
    uint8_t junk_body[64];
    for (size_t i = 0; i < sizeof junk_body; i++)
        junk_body[i] = 0xFF;

    frame wrong_version[3] = {{"EPMOE9", 6}, {tb, 2}, {"", 0}};
    CHECK_EQ(send_raw_expect_error(t, sock, wrong_version, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);
    CHECK_STR_HAS(msg, "not an epmoe message");

    frame bad_type[3] = {{"EPMOE1", 6}, {tb, 1}, {"", 0}};
    CHECK_EQ(send_raw_expect_error(t, sock, bad_type, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);
    CHECK_STR_HAS(msg, "type frame has 1 bytes");

    frame no_body[2] = {{"EPMOE1", 6}, {tb, 2}};
    CHECK_EQ(send_raw_expect_error(t, sock, no_body, 2, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);
    CHECK_STR_HAS(msg, "body frame missing");

    frame only_tag[1] = {{"EPMOE1", 6}};
    CHECK_EQ(send_raw_expect_error(t, sock, only_tag, 1, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);

    frame garbage_body[3] = {{"EPMOE1", 6}, {tb, 2}, {junk_body, sizeof junk_body}};
    CHECK_EQ(send_raw_expect_error(t, sock, garbage_body, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);
    CHECK_STR_HAS(msg, "is not a valid");

    frame unknown[3] = {{"EPMOE1", 6}, {ub, 2}, {"", 0}};
    CHECK_EQ(send_raw_expect_error(t, sock, unknown, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE);
    CHECK_STR_HAS(msg, "type 999");

    frame wrong_socket[3] = {{"EPMOE1", 6}, {ob, 2}, {"", 0}};
    CHECK_EQ(send_raw_expect_error(t, sock, wrong_socket, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_UNKNOWN_TYPE);

    size_t big = 3u << 20;
    uint8_t *junk = malloc(big);
    uint32_t x = 12345;
    for (size_t i = 0; i < big; i++) {
        x = x * 1664525u + 1013904223u;
        junk[i] = (uint8_t)(x >> 24);
    }
    frame megajunk[1] = {{junk, big}};
    CHECK_EQ(send_raw_expect_error(t, sock, megajunk, 1, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);
    frame megajunk2[4] = {{"EPMOE1", 6}, {tb, 2}, {junk, 100}, {junk, big}};
    int code = send_raw_expect_error(t, sock, megajunk2, 4, msg, sizeof msg);
    CHECK(code == EPMOE__ERROR_CODE__ERR_MALFORMED || code == EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    free(junk);
}

/* The coordinator with the default itest spec (its fake workers not registered yet). */
static itest *start(void)
{
    it_opts o;
    it_default_opts(&o);
    return it_start(coord_bin, &o);
}

/* The same on data_plane nccl: where the coordinator's FORWARD (a collective step) lives on. */
static itest *start_nccl(void)
{
    it_opts o;
    it_default_opts(&o);
    o.nccl = true;
    return it_start(coord_bin, &o);
}

TEST(garbage_on_both_sockets_is_answered_and_survived)
{
    itest *t = start_nccl();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    CHECK_EQ(it_register_all(t), 0);
    void *ws = it_raw_dealer(t, t->listen, "junk-worker");
    void *as = it_raw_dealer(t, t->admin, "junk-admin");
    garbage_round(t, ws, EPMOE__MSG_TYPE__MSG_REGISTER, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST);
    garbage_round(t, as, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, EPMOE__MSG_TYPE__MSG_REGISTER);
    /* a registered worker sending garbage is answered too, and stays ready */
    char msg[1024];
    frame bad[3] = {{"EPMOE1", 6}, {"\x0c\x00", 2}, {"\xff\xff\xff", 3}}; /* CONFIG_ACK */
    void *w0 = t->w[0]->sock;
    for (int i = 0; i < 3; i++)
        zmq_send(w0, bad[i].data, bad[i].len, i < 2 ? ZMQ_SNDMORE : 0);
    it_pump(t, 200);
    CHECK_EQ(t->w[0]->last_error_code, EPMOE__ERROR_CODE__ERR_MALFORMED);
    (void)msg;
    /* still serving */
    CHECK_EQ(it_wait_state(t, "ready", 2000), 0);
    it_client *c = it_client_new(t);
    static uint16_t hidden[5 * IT_H];
    it_make_input(5, 4, hidden, NULL);
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_verb = 1;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_FORWARD;
    rq.layer = "layers.1";
    rq.has_n_tokens = 1;
    rq.n_tokens = 5;
    wire_payload p = {.data = hidden, .len = sizeof hidden};
    it_send(t, c, &rq, &p, 1);
    CHECK(it_wait(t, c, 5000) != NULL);
    char why[256] = "";
    CHECK_EQ(it_check_forward(t, c, 5, hidden, NULL, why, sizeof why), 0);
    zmq_close(ws);
    zmq_close(as);
    FINISH(t);
}

/* A REGISTER body with a name of n bytes (may hold NULs). */
static size_t register_body(uint8_t *buf, const char *name, size_t n)
{
    size_t i = 0;
    buf[i++] = 0x0a; /* field 1, length-delimited */
    size_t v = n;
    do {
        buf[i++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    memcpy(buf + i, name, n);
    return i + n;
}

TEST(names_with_nul_bytes_or_of_100kb_are_refused_for_what_they_are)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    void *ws = it_raw_dealer(t, t->listen, "strange-names");
    char msg[1024];
    uint8_t tb[2] = {EPMOE__MSG_TYPE__MSG_REGISTER, 0};
    static uint8_t body[100016];
    size_t n = register_body(body, "a0\0x", 4);
    frame nul[3] = {{"EPMOE1", 6}, {tb, 2}, {body, n}};
    CHECK_EQ(send_raw_expect_error(t, ws, nul, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_MALFORMED);
    CHECK_STR_HAS(msg, "Register.name: string contains a NUL byte");
    static char big[100000];
    memset(big, 'a', sizeof big);
    n = register_body(body, big, sizeof big);
    frame longname[3] = {{"EPMOE1", 6}, {tb, 2}, {body, n}};
    CHECK_EQ(send_raw_expect_error(t, ws, longname, 3, msg, sizeof msg),
             EPMOE__ERROR_CODE__ERR_BAD_REQUEST);
    CHECK_STR_HAS(msg, "REGISTER with a worker name of 100000 bytes");
    /* nobody registered as a0 */
    Epmoe__AdminReply *r = it_call(t, it_client_new(t), EPMOE__ADMIN_VERB__ADMIN_WORKERS, NULL);
    CHECK(r && r->n_workers > 0 && strcmp(r->workers[0]->state, "absent") == 0);
    zmq_close(ws);
    /* a frame one byte above the model's largest (hidden bf16 [EP_MAX_TOKENS, H]): libzmq drops
     * the connection before the daemon buffers or sees it, and the daemon serves on */
    size_t over = (size_t)EP_MAX_TOKENS * IT_H * 2 + 1;
    uint8_t *huge = calloc(1, over);
    void *as = it_raw_dealer(t, t->admin, "too-big");
    uint8_t ab[2] = {EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, 0};
    frame toobig[4] = {{"EPMOE1", 6}, {ab, 2}, {"", 0}, {huge, over}};
    CHECK_EQ(send_raw_expect_error(t, as, toobig, 4, msg, sizeof msg), -3); /* no answer */
    free(huge);
    zmq_close(as);
    r = it_call(t, it_client_new(t), EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->ok);
    FINISH(t);
}

/* Several connections under one routing id, each registering a worker of the spec, closed at
 * once, round after round: with ROUTER_HANDOVER libzmq 4.3 aborted the coordinator
 * ("Assertion failed: !_io_error", exit 134) within a few rounds; a peer must never be able to
 * stop it. The names are then free for real workers, and the daemon serves on. */
TEST(connections_sharing_a_routing_id_never_stop_the_coordinator)
{
    itest *t = start();
    CHECK(t != NULL);
    if (t == NULL)
        return;
    static uint8_t body[64];
    size_t n = register_body(body, "a0", 2);
    uint8_t tb[2] = {EPMOE__MSG_TYPE__MSG_REGISTER, 0};
    for (int round = 0; round < 100 && it_wait_exit(t, 0) < 0; round++) {
        void *s[4];
        for (int i = 0; i < 4; i++)
            s[i] = it_raw_dealer(t, t->listen, "twin");
        for (int k = 0; k < 20; k++)
            for (int i = 0; i < 4; i++) {
                zmq_send(s[i], "EPMOE1", 6, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(s[i], tb, 2, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(s[i], body, n, ZMQ_DONTWAIT);
            }
        it_pump(t, 20);
        for (int i = 0; i < 4; i++)
            zmq_close(s[i]);
    }
    CHECK_EQ(it_wait_exit(t, 0), -1); /* still running */
    /* the real workers register (a0 too, once its twin connections are gone) and serve */
    CHECK_EQ(it_register_all(t), 0);
    CHECK_EQ(it_wait_state(t, "ready", 5000), 0);
    Epmoe__AdminReply *r = it_call(t, it_client_new(t), EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->ok);
    FINISH(t);
}

/* A connection whose queue in the daemon is full, then closed: libzmq 4.3.4 stops reading a
 * connection whose queue is at RCVHWM; the next PING of the daemon's own ZMQ_HEARTBEAT_IVL to the
 * closed peer draws a RST, the engine marks itself failed (_io_error) without closing, and the
 * heartbeat timer after that writes to it: "Assertion failed: !_io_error
 * (src/stream_engine_base.cpp:331)", exit 134 (the abort of 1,000 polling clients going away,
 * docs/performance.md). A second connection under a routing id in use is never read by the
 * ROUTER, so it fills its queue for certain: 8 messages on the admin socket (its RCVHWM), the
 * default 1000 on the listen socket. The peer goes away at once: libzmq drops a connection
 * whose PONGs it does not read after ZMQ_HEARTBEAT_TIMEOUT (heartbeat x liveness, here 100 ms x
 * 30), and the abort needs the PING that draws the RST and the next one before that. */
TEST(a_full_connection_that_goes_away_never_stops_the_coordinator)
{
    it_opts o;
    it_default_opts(&o);
    o.liveness = 30;
    itest *t = it_start(coord_bin, &o);
    CHECK(t != NULL);
    if (t == NULL)
        return;
    const char *eps[2] = {t->admin, t->listen};
    int counts[2] = {64, 3000};
    uint8_t tb[2] = {EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, 0};
    for (int e = 0; e < 2; e++) {
        char msg[256];
        void *first = it_raw_dealer(t, eps[e], "full-twin");
        frame probe[3] = {{"EPMOE1", 6}, {tb, 2}, {"", 0}};
        send_raw_expect_error(t, first, probe, 3, msg, sizeof msg); /* first is connected */
        void *twin = it_raw_dealer(t, eps[e], "full-twin");
        /* the ROUTER reads one message of an ignored connection each time it wakes up on it,
         * as its routing id: each is the used id again, so none is ever routed. A send that
         * waits 200 ms means every queue on the way is full. */
        int wait_ms = 200;
        zmq_setsockopt(twin, ZMQ_SNDTIMEO, &wait_ms, sizeof wait_ms);
        for (int k = 0; k < counts[e] && zmq_send(twin, "full-twin", 9, 0) == 9; k++)
            ;
        it_pump(t, 100);
        zmq_close(twin);
        it_pump(t, 10 * 100);
        CHECK_EQ(it_wait_exit(t, 0), -1); /* still running */
        zmq_close(first);
    }
    Epmoe__AdminReply *r = it_call(t, it_client_new(t), EPMOE__ADMIN_VERB__ADMIN_STATUS, NULL);
    CHECK(r && r->ok);
    FINISH(t);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/epmoe-coordinator\n", argv[0]);
        return 2;
    }
    coord_bin = argv[1];
    RUN(garbage_on_both_sockets_is_answered_and_survived);
    RUN(names_with_nul_bytes_or_of_100kb_are_refused_for_what_they_are);
    RUN(connections_sharing_a_routing_id_never_stop_the_coordinator);
    RUN(a_full_connection_that_goes_away_never_stops_the_coordinator);
    return test_report();
}
