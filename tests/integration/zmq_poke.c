/*
 * zmq_poke.c — sends one deliberately malformed message to an epmoe socket (tests only).
 *
 *   zmq_poke ENDPOINT dealer|push KIND
 *
 * KIND: badversion (wrong tag), notype (tag only), badtype (3-byte type frame), nobody (no body
 * frame), garbage (valid framing, body not protobuf), unknown (type 999), junk (one 3 MB frame
 * of random bytes), toomany (12 payload frames), register_empty (REGISTER without a name).
 * With dealer, waits up to 2 s for an answer and prints "reply: <type> <bytes>" (an Error
 * reply's text is printed too); prints "no reply" otherwise. Exit 0 when the message was sent.
 * With $POKE_PUBLIC, $POKE_SECRET and $POKE_SERVER (Z85 keys) the socket is a CURVE client.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static void send_frames(void *s, const void *const *f, const size_t *l, int n)
{
    for (int i = 0; i < n; i++)
        zmq_send(s, f[i], l[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: zmq_poke ENDPOINT dealer|push KIND\n");
        return 64;
    }
    int dealer = strcmp(argv[2], "dealer") == 0;
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, dealer ? ZMQ_DEALER : ZMQ_PUSH);
    int linger = 2000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    /* A PUSH whose handshake is refused never gets a pipe: without a send timeout the send would
       block forever. */
    int sndtimeo = 3000;
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    const char *pub = getenv("POKE_PUBLIC"), *sec = getenv("POKE_SECRET");
    const char *srv = getenv("POKE_SERVER");
    if (pub && sec && srv && pub[0] &&
        (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, srv, 41) != 0 ||
         zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 41) != 0 ||
         zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 41) != 0)) {
        fprintf(stderr, "CURVE keys: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    if (zmq_connect(s, argv[1]) != 0) {
        fprintf(stderr, "connect %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    const char *k = argv[3];
    uint8_t t17[2] = {17, 0}, t999[2] = {0xE7, 0x03}, t10[2] = {10, 0};
    static uint8_t junk[3 << 20];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 2654435761u >> 13);
    if (strcmp(k, "badversion") == 0) {
        const void *f[] = {"EPMOE9", t17, ""};
        size_t l[] = {6, 2, 0};
        send_frames(s, f, l, 3);
    } else if (strcmp(k, "notype") == 0) {
        const void *f[] = {"EPMOE1"};
        size_t l[] = {6};
        send_frames(s, f, l, 1);
    } else if (strcmp(k, "badtype") == 0) {
        const void *f[] = {"EPMOE1", "abc", ""};
        size_t l[] = {6, 3, 0};
        send_frames(s, f, l, 3);
    } else if (strcmp(k, "nobody") == 0) {
        const void *f[] = {"EPMOE1", t17};
        size_t l[] = {6, 2};
        send_frames(s, f, l, 2);
    } else if (strcmp(k, "garbage") == 0) {
        const void *f[] = {"EPMOE1", t17, "\xff\xff\xff\xff\x0f\x0a\x99"};
        size_t l[] = {6, 2, 7};
        send_frames(s, f, l, 3);
    } else if (strcmp(k, "unknown") == 0) {
        const void *f[] = {"EPMOE1", t999, ""};
        size_t l[] = {6, 2, 0};
        send_frames(s, f, l, 3);
    } else if (strcmp(k, "junk") == 0) {
        zmq_send(s, junk, sizeof junk, 0);
    } else if (strcmp(k, "toomany") == 0) {
        const void *f[12] = {"EPMOE1", t17, ""};
        size_t l[12] = {6, 2, 0};
        for (int i = 3; i < 12; i++)
            f[i] = "x", l[i] = 1;
        send_frames(s, f, l, 12);
    } else if (strcmp(k, "register_empty") == 0) {
        const void *f[] = {"EPMOE1", t10, ""};
        size_t l[] = {6, 2, 0};
        send_frames(s, f, l, 3);
    } else {
        fprintf(stderr, "unknown kind %s\n", k);
        return 64;
    }
    if (dealer) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 2000) > 0) {
            zmq_msg_t m;
            int more = 1, i = 0;
            printf("reply:");
            while (more) {
                zmq_msg_init(&m);
                zmq_msg_recv(&m, s, 0);
                size_t n = zmq_msg_size(&m);
                const uint8_t *d = zmq_msg_data(&m);
                if (i == 1 && n == 2)
                    printf(" type %u", (unsigned)(d[0] | d[1] << 8));
                else if (i == 2) /* Error body: print printable bytes (the message text) */
                    for (size_t j = 0; j < n; j++)
                        putchar(d[j] >= 32 && d[j] < 127 ? d[j] : ' ');
                more = zmq_msg_more(&m);
                zmq_msg_close(&m);
                i++;
            }
            printf("\n");
        } else {
            printf("no reply\n");
        }
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    return 0;
}
