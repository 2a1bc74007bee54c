/*
 * sim_clients.c — N simulated libepmoe clients asking a real epmoe-coordinator for CLIENT_INFO
 * the way the library does (issue 23 point 6: the coordinator's cost of clients), without a data
 * plane: the measurement of docs/performance.md "The coordinator with 1,000 clients".
 *
 *   sim_clients --coordinator tcp://H:P --count N --mode poll:MS | news
 *
 * Each client has its own DEALER to the admin endpoint (send queue of 4, as the library's) and
 * asks CLIENT_INFO once at start (epmoe_open). Then:
 *
 *   poll:MS  every MS ms, staggered over the clients: the library before issue 23, which asked
 *            every 500 ms while requests were in flight (MS = 500) and every 2 s otherwise;
 *   news     only when told that the epoch changed: the library after issue 23, which learns it
 *            from the serving epoch on every entry's answer. Here, with no data plane, the
 *            driver tells every client at once by SIGUSR2 (what each would read in its next
 *            answer); each asks once.
 *
 * Answers are counted, not decoded (their decoding is the client's cost, not the
 * coordinator's). SIGUSR1 prints "answers A bytes B asked Q" (cumulative) on stdout; "ready" is
 * printed once every client has its first answer. Runs until SIGTERM/SIGINT.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "common/limits.h"
#include "common/wire.h"

#define SC_MAX 4096

static atomic_int g_stop, g_report, g_news;

static void sc_signal(int sig)
{
    if (sig == SIGUSR1)
        atomic_store(&g_report, 1);
    else if (sig == SIGUSR2)
        atomic_store(&g_news, 1);
    else
        atomic_store(&g_stop, 1);
}

static int64_t sc_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

typedef struct sc_client {
    void *sock;
    uint64_t id;
    int64_t next_ms; /* the next question (poll mode; INT64_MAX: none) */
    bool answered;
} sc_client;

static int sc_ask(sc_client *c)
{
    Epmoe__AdminRequest rq = EPMOE__ADMIN_REQUEST__INIT;
    rq.has_id = rq.has_verb = 1;
    rq.id = ++c->id;
    rq.verb = EPMOE__ADMIN_VERB__ADMIN_CLIENT_INFO;
    ep_err e;
    return wire_send(c->sock, NULL, 0, EPMOE__MSG_TYPE__MSG_ADMIN_REQUEST, &rq.base, NULL, 0, true,
                     &e);
}

int main(int argc, char **argv)
{
    const char *coord = NULL, *mode = "news";
    int n = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--coordinator") == 0)
            coord = argv[i + 1];
        else if (strcmp(argv[i], "--count") == 0)
            n = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--mode") == 0)
            mode = argv[i + 1];
    }
    int poll_ms = strncmp(mode, "poll:", 5) == 0 ? atoi(mode + 5) : 0;
    if (coord == NULL || n < 1 || n > SC_MAX || (poll_ms <= 0 && strcmp(mode, "news") != 0)) {
        fprintf(stderr,
                "usage: sim_clients --coordinator EP --count N (1..%d) "
                "--mode poll:MS|news\n",
                SC_MAX);
        return 64;
    }
    signal(SIGINT, sc_signal);
    signal(SIGTERM, sc_signal);
    signal(SIGUSR1, sc_signal);
    signal(SIGUSR2, sc_signal);
    void *ctx = zmq_ctx_new();
    sc_client *cl = calloc((size_t)n, sizeof *cl);
    zmq_pollitem_t *it = calloc((size_t)n, sizeof *it);
    if (ctx == NULL || cl == NULL || it == NULL)
        return 1;
    int64_t t0 = sc_now_ms();
    for (int i = 0; i < n; i++) {
        int hwm = 4;
        cl[i].sock = zmq_socket(ctx, ZMQ_DEALER);
        if (cl[i].sock == NULL || wire_socket_defaults(cl[i].sock, EP_MAX_CTRL_MSG, NULL) != 0 ||
            zmq_setsockopt(cl[i].sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
            zmq_connect(cl[i].sock, coord) != 0) {
            fprintf(stderr, "sim_clients: client %d: %s\n", i, zmq_strerror(zmq_errno()));
            return 1;
        }
        it[i] = (zmq_pollitem_t){.socket = cl[i].sock, .events = ZMQ_POLLIN};
        sc_ask(&cl[i]);
        cl[i].next_ms = poll_ms ? t0 + poll_ms + (int64_t)poll_ms * i / n : INT64_MAX;
    }
    unsigned long long answers = 0, bytes = 0, asked = (unsigned long long)n;
    int n_ready = 0;
    while (!atomic_load(&g_stop)) {
        zmq_poll(it, n, 10);
        for (int i = 0; i < n; i++) {
            wire_msg m;
            ep_err e;
            if (!(it[i].revents & ZMQ_POLLIN))
                continue;
            while (wire_recv(cl[i].sock, false, EP_MAX_CTRL_MSG, 0, ZMQ_DONTWAIT, &m, &e) ==
                   WIRE_OK) {
                answers++;
                bytes += m.body_len;
                if (!cl[i].answered && ++n_ready == n) {
                    printf("ready %d clients in %lld ms\n", n, (long long)(sc_now_ms() - t0));
                    fflush(stdout);
                }
                cl[i].answered = true;
                wire_msg_close(&m);
            }
        }
        int64_t now = sc_now_ms();
        bool news = atomic_exchange(&g_news, 0) && !poll_ms; /* polling: the next poll learns */
        for (int i = 0; i < n; i++)
            if (news || now >= cl[i].next_ms) {
                asked += sc_ask(&cl[i]) == 0;
                if (poll_ms)
                    cl[i].next_ms = now + poll_ms;
            }
        if (atomic_exchange(&g_report, 0)) {
            printf("answers %llu bytes %llu asked %llu\n", answers, bytes, asked);
            fflush(stdout);
        }
    }
    for (int i = 0; i < n; i++)
        zmq_close(cl[i].sock);
    zmq_ctx_term(ctx);
    free(cl);
    free(it);
    return 0;
}
