/*
 * serve_load — a libepmoe client that keeps requests in flight while a test does things to the
 * cluster (a coordinator away for a minute, restarted, reloaded): INFLIGHT layer calls of IN
 * (epmoectl forward's input file) at a time through one epmoe_client, opened once, until the
 * file STOP exists. Every answer must equal the first, which is written to OUT (forward's output
 * format, for the caller to compare with forward --local). Counts every request as ok, failed
 * (an error status; the first ones are printed) or wrong (an answer that differs), and measures
 * the longest pause with no completion; pauses over 250 ms are printed with their end on the
 * wall clock (ms since the epoch), so that a script can set them beside its events.
 *
 * With $EPMOE_KEY (a client's secret key file) and $EPMOE_SERVER_KEY (the coordinator's public
 * key file) the client uses CURVE, as epmoectl does.
 *
 * With TIMELINE, one line "<ms since the Unix epoch> OK|FAIL|WRONG" per finished request is
 * appended to that file (the fault suite's client timeline format, tests/faults/fault_numbers.py).
 *
 * Last line: "serve_load: N ok, F failed, W wrong, longest pause P ms". Exit 0 when F = W = 0
 * and N > 0, else 1.
 *
 *   serve_load COORDINATOR LAYER IN OUT INFLIGHT STOP [TIMEOUT_MS (30000) [TIMELINE]]
 */
#include <epmoe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/model_config.h"
#include "ctl/fwd_io.h"

typedef struct slot {
    epmoe_request *rq;
    uint16_t *out;
    int32_t *ids;
    float *w;
} slot;

typedef struct tally {
    long ok, failed, wrong;
    int64_t last_done_ms, longest_ms;
    slot first;
    size_t no, ni;
    FILE *timeline; /* NULL: none */
} tally;

static int64_t now_ms(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The request's end on the wall clock, for the fault suite's numbers (fault_numbers.py). */
static void load_mark(const tally *t, const char *kind)
{
    if (t->timeline == NULL)
        return;
    fprintf(t->timeline, "%lld %s\n", (long long)now_ms(CLOCK_REALTIME), kind);
    fflush(t->timeline); /* the suite reads it while this runs */
}

/* One finished request: counted and compared with the first. */
static void load_count(tally *t, const slot *s)
{
    epmoe_request_info ri;
    epmoe_request_status(s->rq, &ri);
    int64_t now = now_ms(CLOCK_MONOTONIC);
    if (ri.status != EPMOE_OK) {
        if (t->failed++ < 20)
            fprintf(stderr, "serve_load: failed: %s\n", ri.message);
        return;
    }
    if (now - t->last_done_ms > 250)
        printf("serve_load: pause %lld ms ending at %lld\n", (long long)(now - t->last_done_ms),
               (long long)now_ms(CLOCK_REALTIME));
    if (now - t->last_done_ms > t->longest_ms)
        t->longest_ms = now - t->last_done_ms;
    t->last_done_ms = now;
    if (t->ok + t->wrong == 0) {
        memcpy(t->first.out, s->out, t->no);
        memcpy(t->first.ids, s->ids, t->ni);
        memcpy(t->first.w, s->w, t->ni);
        t->ok++;
    } else if (memcmp(t->first.out, s->out, t->no) || memcmp(t->first.ids, s->ids, t->ni) ||
               memcmp(t->first.w, s->w, t->ni)) {
        if (t->wrong++ < 20)
            fprintf(stderr, "serve_load: an answer (entry %s) differs from the first\n", ri.entry);
    } else {
        t->ok++;
    }
}

/* One finished request: counted, and its end written to the timeline. */
static void load_check(tally *t, const slot *s)
{
    long wrong = t->wrong, ok = t->ok;
    load_count(t, s);
    load_mark(t, t->ok > ok ? "OK" : t->wrong > wrong ? "WRONG" : "FAIL");
}

/* CURVE keys from $EPMOE_KEY and $EPMOE_SERVER_KEY (Z85 into pub, sec, server). */
static int load_keys(epmoe_options *o, char *pub, char *sec, char *server)
{
    const char *key = getenv("EPMOE_KEY"), *srv_path = getenv("EPMOE_SERVER_KEY");
    if (key == NULL || srv_path == NULL)
        return 0;
    auth_keypair kp;
    uint8_t srv[AUTH_KEY_BYTES];
    ep_err err = {0};
    if (auth_load_secret(key, &kp, &err) != 0 || auth_load_public(srv_path, srv, &err) != 0) {
        fprintf(stderr, "serve_load: %s\n", err.msg);
        return -1;
    }
    auth_z85(kp.pub, pub);
    auth_z85(kp.sec, sec);
    auth_z85(srv, server);
    o->client_public_key = pub;
    o->client_secret_key = sec;
    o->server_key = server;
    return 0;
}

static int load_alloc(slot *s, size_t no, size_t ni)
{
    s->out = malloc(no);
    s->ids = malloc(ni);
    s->w = malloc(ni);
    return s->out && s->ids && s->w ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 7 || argc > 9) {
        fprintf(
            stderr,
            "usage: serve_load COORDINATOR LAYER IN OUT INFLIGHT STOP [TIMEOUT_MS [TIMELINE]]\n");
        return 64;
    }
    int D = atoi(argv[5]);
    const char *stop = argv[6];
    epmoe_options o = {.size = sizeof o,
                       .version = EPMOE_OPTIONS_VERSION,
                       .coordinator = argv[1],
                       .max_in_flight = (uint32_t)(D > 0 ? D : 1),
                       .timeout_ms = argc >= 8 ? (uint32_t)atoi(argv[7]) : 30000};
    epmoe_client *cl = NULL;
    epmoe_error e = {0};
    epmoe_info info;
    char pub[AUTH_Z85_LEN + 1], sec[AUTH_Z85_LEN + 1], server[AUTH_Z85_LEN + 1];
    if (load_keys(&o, pub, sec, server) != 0)
        return 1;
    if (D < 1 || epmoe_open(&o, &cl, &e) != EPMOE_OK || epmoe_info_get(cl, &info, &e) != EPMOE_OK) {
        fprintf(stderr, "serve_load: %s\n", e.message);
        return 1;
    }
    mc_config c = fwdio_config_of(&info);
    uint32_t layer;
    fwdio_input in;
    ep_err err;
    if (epmoe_layer_index(&info, argv[2], &layer, &e) != EPMOE_OK ||
        fwdio_read(argv[3], &c, (int)layer, &in, &err) != 0) {
        fprintf(stderr, "serve_load: %s\n", e.message[0] ? e.message : err.msg);
        return 1;
    }
    int T = in.T, H = c.hidden_size, k = c.num_experts_per_tok;
    tally t = {.no = (size_t)T * H * 2, .ni = (size_t)T * k * 4};
    if (argc == 9 && (t.timeline = fopen(argv[8], "a")) == NULL) {
        perror(argv[8]);
        return 1;
    }
    slot *s = calloc((size_t)D, sizeof *s);
    int rc = s == NULL || load_alloc(&t.first, t.no, t.ni) != 0;
    for (int i = 0; i < D && rc == 0; i++)
        rc = load_alloc(&s[i], t.no, t.ni);
    t.last_done_ms = now_ms(CLOCK_MONOTONIC);
    bool stopping = false;
    int in_flight = 0;
    while (rc == 0 && (!stopping || in_flight > 0)) {
        stopping = stopping || access(stop, F_OK) == 0;
        for (int i = 0; i < D && !stopping; i++) {
            if (s[i].rq != NULL)
                continue;
            epmoe_submit_args a = EPMOE_SUBMIT_ARGS_INIT;
            a.layer = layer;
            a.n_tokens = (uint32_t)T;
            a.hidden_size = (uint32_t)H;
            a.hidden = in.x;
            a.token_ids = in.ids;
            a.out = s[i].out;
            a.topk_ids = s[i].ids;
            a.topk_weights = s[i].w;
            a.user = &s[i];
            if (epmoe_submit(cl, &a, &s[i].rq, &e) != EPMOE_OK) {
                /* a request refused at once (the cluster blocked) is a failed one too */
                if (t.failed++ < 20)
                    fprintf(stderr, "serve_load: submit: %s\n", e.message);
                load_mark(&t, "FAIL");
                s[i].rq = NULL;
                break;
            }
            in_flight++;
        }
        struct pollfd p = {.fd = epmoe_fd(cl), .events = POLLIN};
        if (rc != 0 || poll(&p, 1, 100) < 0)
            break;
        epmoe_request *fin[16];
        void *user[16];
        int n = epmoe_poll(cl, fin, user, 16);
        for (int j = 0; j < n; j++) {
            slot *sl = user[j];
            load_check(&t, sl);
            epmoe_request_free(&sl->rq);
            in_flight--;
        }
    }
    int64_t tail = now_ms(CLOCK_MONOTONIC) - t.last_done_ms;
    if (tail > t.longest_ms && !stopping)
        t.longest_ms = tail;
    if (t.ok > 0 && fwdio_write(argv[4], T, H, k, t.first.out, t.first.ids, t.first.w, &err) != 0) {
        fprintf(stderr, "serve_load: %s\n", err.msg);
        rc = 1;
    }
    printf("serve_load: %ld ok, %ld failed, %ld wrong, longest pause %lld ms\n", t.ok, t.failed,
           t.wrong, (long long)t.longest_ms);
    for (int i = 0; s && i < D; i++) {
        epmoe_request_free(&s[i].rq);
        free(s[i].out), free(s[i].ids), free(s[i].w);
    }
    free(s), free(t.first.out), free(t.first.ids), free(t.first.w);
    fwdio_input_free(&in);
    epmoe_close(&cl);
    if (t.timeline != NULL)
        fclose(t.timeline);
    return rc == 0 && t.failed == 0 && t.wrong == 0 && t.ok > 0 ? 0 : 1;
}
