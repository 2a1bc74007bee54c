/*
 * test_wire.c — message framing over real ZeroMQ sockets (inproc and tcp loopback).
 *
 * Proves: a message round-trips with body and zero-copy payloads intact; every framing fault
 * (wrong version, missing frames, bad type frame, oversized body or payloads, too many
 * payloads, garbage body) is reported with a message naming it and leaves the socket usable for
 * the next message; the bounded allocator refuses a body that would expand beyond its budget.
 */
#include <string.h>
#include <zmq.h>

#include "common/wire.h"
#include "test.h"

static void *ctx;

/* A connected ROUTER (server) / DEALER (client) pair on inproc. */
static void pair_open(void **router, void **dealer, const char *ep)
{
    *router = zmq_socket(ctx, ZMQ_ROUTER);
    *dealer = zmq_socket(ctx, ZMQ_DEALER);
    CHECK(wire_socket_defaults(*router, 1 << 20, NULL) == 0);
    CHECK(wire_socket_defaults(*dealer, 1 << 20, NULL) == 0);
    CHECK(zmq_bind(*router, ep) == 0);
    CHECK(zmq_setsockopt(*dealer, ZMQ_ROUTING_ID, "w0", 2) == 0);
    CHECK(zmq_connect(*dealer, ep) == 0);
}

static void pair_close(void *router, void *dealer)
{
    zmq_close(router);
    zmq_close(dealer);
}

static int freed;
static void count_free(void *data, void *hint)
{
    (void)hint;
    free(data);
    freed++;
}

TEST(round_trip_with_payloads)
{
    void *r, *d;
    pair_open(&r, &d, "inproc://rt");
    Epmoe__Register reg = EPMOE__REGISTER__INIT;
    reg.name = "w0";
    reg.device = "cpu";
    uint8_t *big = malloc(100000);
    for (int i = 0; i < 100000; i++)
        big[i] = (uint8_t)(i * 7);
    freed = 0;
    wire_payload p[2] = {{.data = "abc", .len = 3},
                         {.data = big, .len = 100000, .free_fn = count_free}};
    ep_err err;
    CHECK(wire_send(d, NULL, 0, EPMOE__MSG_TYPE__MSG_REGISTER, &reg.base, p, 2, false, &err) == 0);
    wire_msg m;
    CHECK_EQ(wire_recv(r, true, 4096, 1 << 20, 0, &m, &err), WIRE_OK);
    CHECK_EQ(m.ident_len, 2);
    CHECK(memcmp(m.ident, "w0", 2) == 0);
    CHECK_EQ(m.type, EPMOE__MSG_TYPE__MSG_REGISTER);
    CHECK_EQ(m.n_payloads, 2);
    CHECK_EQ(m.payload_len[0], 3);
    CHECK(memcmp(m.payload[0], "abc", 3) == 0);
    CHECK_EQ(m.payload_len[1], 100000);
    CHECK(m.payload_len[1] == 100000 && m.payload[1][99999] == (uint8_t)(99999 * 7));
    Epmoe__Register *got = (Epmoe__Register *)wire_unpack(&epmoe__register__descriptor, &m, &err);
    CHECK(got != NULL);
    if (got) {
        CHECK_STR_EQ(got->name, "w0");
        CHECK_STR_EQ(got->device, "cpu");
    }
    wire_free_unpacked(&got->base);
    wire_msg_close(&m);
    CHECK_EQ(freed, 1); /* the zero-copy payload was released by ZeroMQ exactly once */

    /* and back through the ROUTER with the routing id */
    CHECK(wire_send(r, (const uint8_t *)"w0", 2, EPMOE__MSG_TYPE__MSG_LOAD, NULL, NULL, 0, true,
                    &err) == 0);
    CHECK_EQ(wire_recv(d, false, 4096, 0, 0, &m, &err), WIRE_OK);
    CHECK_EQ(m.type, EPMOE__MSG_TYPE__MSG_LOAD);
    CHECK_EQ(m.body_len, 0);
    wire_msg_close(&m);
    pair_close(r, d);
}

/* Send raw frames from the dealer, then expect wire_recv to fail with needle, and the next
 * well-formed message to be received normally. */
static void expect_bad(void *r, void *d, const void *const *frames, const size_t *lens, int n,
                       size_t max_body, size_t max_payload, const char *needle)
{
    for (int i = 0; i < n; i++)
        zmq_send(d, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0);
    wire_msg m;
    ep_err err = {0};
    CHECK_EQ(wire_recv(r, true, max_body, max_payload, 0, &m, &err), WIRE_ERR);
    CHECK_STR_HAS(err.msg, needle);
    CHECK_EQ(m.ident_len, 2); /* still known, so the receiver can answer with an error */
    CHECK(wire_send(d, NULL, 0, EPMOE__MSG_TYPE__MSG_HEARTBEAT, NULL, NULL, 0, false, &err) == 0);
    CHECK_EQ(wire_recv(r, true, max_body, max_payload, 0, &m, &err), WIRE_OK);
    CHECK_EQ(m.type, EPMOE__MSG_TYPE__MSG_HEARTBEAT);
    wire_msg_close(&m);
}

TEST(framing_faults_are_reported_and_survived)
{
    void *r, *d;
    pair_open(&r, &d, "inproc://bad");
    const uint8_t t10[2] = {10, 0};
    {
        const void *f[] = {"EPMOE0", t10, ""};
        size_t l[] = {6, 2, 0};
        expect_bad(r, d, f, l, 3, 4096, 0, "not an epmoe message");
    }
    {
        const void *f[] = {"EPMOE1"};
        size_t l[] = {6};
        expect_bad(r, d, f, l, 1, 4096, 0, "type frame missing");
    }
    {
        const void *f[] = {"EPMOE1", "xyz", ""};
        size_t l[] = {6, 3, 0};
        expect_bad(r, d, f, l, 3, 4096, 0, "type frame has 3 bytes");
    }
    {
        const void *f[] = {"EPMOE1", t10};
        size_t l[] = {6, 2};
        expect_bad(r, d, f, l, 2, 4096, 0, "body frame missing");
    }
    {
        static uint8_t body[5000];
        const void *f[] = {"EPMOE1", t10, body};
        size_t l[] = {6, 2, sizeof body};
        expect_bad(r, d, f, l, 3, 4096, 0, "exceeds the limit of 4096");
    }
    {
        static uint8_t pay[3000];
        const void *f[] = {"EPMOE1", t10, "", pay, pay};
        size_t l[] = {6, 2, 0, sizeof pay, sizeof pay};
        expect_bad(r, d, f, l, 5, 4096, 5000, "payloads exceed the limit");
    }
    {
        const void *f[12] = {"EPMOE1", t10, ""};
        size_t l[12] = {6, 2, 0};
        for (int i = 3; i < 12; i++) {
            f[i] = "p";
            l[i] = 1;
        }
        expect_bad(r, d, f, l, 12, 4096, 1 << 20, "more than 8 payload frames");
    }
    pair_close(r, d);
}

TEST(garbage_bodies_fail_to_unpack)
{
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.type = EPMOE__MSG_TYPE__MSG_WELCOME;
    ep_err err;
    /* field 2 (rank, varint) with a truncated varint */
    static const uint8_t trunc[] = {0x10, 0xFF};
    m.body = trunc;
    m.body_len = sizeof trunc;
    CHECK(wire_unpack(&epmoe__welcome__descriptor, &m, &err) == NULL);
    CHECK_STR_HAS(err.msg, "not a valid Welcome message");
    /* a length-delimited field claiming more bytes than the body holds */
    static const uint8_t overlong[] = {0x0A, 0x7F, 'a'};
    m.body = overlong;
    m.body_len = sizeof overlong;
    CHECK(wire_unpack(&epmoe__welcome__descriptor, &m, &err) == NULL);
}

TEST(unpack_budget_bounds_expansion)
{
    /* 100k empty WorkerInfo sub-messages: 2 bytes each on the wire, a ~150-byte struct plus a
     * pointer each in memory. That expansion exceeds the budget (64 x body + 1 MiB), so decoding
     * must fail cleanly instead of allocating. The same count of 1-field Shard entries fits. */
    size_t n = 100000;
    size_t need = n * (sizeof(Epmoe__WorkerInfo) + sizeof(void *));
    CHECK(need > 64 * 2 * n + (1u << 20)); /* the premise of this test */
    uint8_t *body = malloc(2 * n);
    for (size_t i = 0; i < n; i++) {
        body[2 * i] = (8 << 3) | 2; /* field 8 (workers), length-delimited, empty */
        body[2 * i + 1] = 0;
    }
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.type = EPMOE__MSG_TYPE__MSG_ADMIN_REPLY;
    m.body = body;
    m.body_len = 2 * n;
    ep_err err;
    CHECK(wire_unpack(&epmoe__admin_reply__descriptor, &m, &err) == NULL);
    CHECK_STR_HAS(err.msg, "not a valid AdminReply message");
    /* 1000 of them decode fine */
    m.body_len = 2 * 1000;
    Epmoe__AdminReply *ok =
        (Epmoe__AdminReply *)wire_unpack(&epmoe__admin_reply__descriptor, &m, &err);
    CHECK(ok != NULL && ok->n_workers == 1000);
    wire_free_unpacked(ok ? &ok->base : NULL);
    free(body);
}

TEST(tcp_loopback_zero_copy_large)
{
    void *pull = zmq_socket(ctx, ZMQ_PULL), *push = zmq_socket(ctx, ZMQ_PUSH);
    CHECK(wire_socket_defaults(pull, 64 << 20, NULL) == 0);
    CHECK(wire_socket_defaults(push, 64 << 20, NULL) == 0);
    CHECK(zmq_bind(pull, "tcp://127.0.0.1:*") == 0);
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &len);
    CHECK(zmq_connect(push, ep) == 0);
    size_t n = 8 << 20;
    uint8_t *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i ^ (i >> 8));
    wire_payload p = {.data = buf, .len = n, .free_fn = wire_free_malloc};
    ep_err err;
    CHECK(wire_send(push, NULL, 0, EPMOE__MSG_TYPE__MSG_DISPATCH, NULL, &p, 1, false, &err) == 0);
    wire_msg m;
    CHECK_EQ(wire_recv(pull, false, 4096, 64 << 20, 0, &m, &err), WIRE_OK);
    CHECK_EQ(m.payload_len[0], n);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= m.payload[0][i] == (uint8_t)(i ^ (i >> 8));
    CHECK(ok);
    wire_msg_close(&m);
    zmq_close(pull);
    zmq_close(push);
}

TEST(dontwait_on_empty_socket)
{
    void *r, *d;
    pair_open(&r, &d, "inproc://empty");
    wire_msg m;
    ep_err err;
    CHECK_EQ(wire_recv(r, true, 4096, 0, ZMQ_DONTWAIT, &m, &err), WIRE_AGAIN);
    CHECK_STR_EQ(wire_type_name(EPMOE__MSG_TYPE__MSG_STEP_DONE), "MSG_STEP_DONE");
    CHECK_STR_EQ(wire_type_name(999), "type 999");
    pair_close(r, d);
}

int main(void)
{
    ctx = zmq_ctx_new();
    RUN(round_trip_with_payloads);
    RUN(framing_faults_are_reported_and_survived);
    RUN(garbage_bodies_fail_to_unpack);
    RUN(unpack_budget_bounds_expansion);
    RUN(tcp_loopback_zero_copy_large);
    RUN(dontwait_on_empty_socket);
    zmq_ctx_term(ctx);
    return test_report();
}
