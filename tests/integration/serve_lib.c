/*
 * serve_lib — a libepmoe client for the tests: REPEAT layer calls of IN (epmoectl forward's
 * input file), INFLIGHT at a time through <epmoe.h>, waited for on the completion descriptor
 * (poll(2) + epmoe_poll, as an event loop would); every answer must equal the first, which is
 * written to OUT (forward's output format). Exit 0, or 1 naming the request that failed (an
 * EPMOE_EBUSY too: within max_in_flight, flow control is the library's). ENTRY: the preferred
 * entry worker (options.entry).
 *
 *   serve_lib COORDINATOR LAYER IN OUT INFLIGHT REPEAT [ENTRY]
 */
#include <epmoe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model_config.h"
#include "ctl/fwd_io.h"

typedef struct slot {
    epmoe_request *rq;
    uint16_t *out;
    int32_t *ids;
    float *w;
} slot;

/* One finished request: compared with the first (kept in *first). */
static int lib_check(slot *s, int T, int H, int k, slot *first, int *n_first)
{
    epmoe_request_info ri;
    epmoe_request_status(s->rq, &ri);
    if (ri.status != EPMOE_OK) {
        fprintf(stderr, "serve_lib: %s\n", ri.message);
        return -1;
    }
    size_t no = (size_t)T * (size_t)H * 2, ni = (size_t)T * (size_t)k * 4;
    if (*n_first == 0) {
        first->out = malloc(no);
        first->ids = malloc(ni);
        first->w = malloc(ni);
        memcpy(first->out, s->out, no);
        memcpy(first->ids, s->ids, ni);
        memcpy(first->w, s->w, ni);
    } else if (memcmp(first->out, s->out, no) || memcmp(first->ids, s->ids, ni) ||
               memcmp(first->w, s->w, ni)) {
        fprintf(stderr, "serve_lib: an answer (entry %s) differs from the first\n", ri.entry);
        return -1;
    }
    (*n_first)++;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: serve_lib COORDINATOR LAYER IN OUT INFLIGHT REPEAT [ENTRY]\n");
        return 64;
    }
    int D = atoi(argv[5]), N = atoi(argv[6]);
    epmoe_options o = {.size = sizeof o,
                       .version = EPMOE_OPTIONS_VERSION,
                       .coordinator = argv[1],
                       .entry = argc == 8 ? argv[7] : NULL,
                       .max_in_flight = (uint32_t)D,
                       .timeout_ms = 30000};
    epmoe_client *cl = NULL;
    epmoe_error e = {0};
    epmoe_info info;
    if (D < 1 || N < 1 || epmoe_open(&o, &cl, &e) != EPMOE_OK ||
        epmoe_info_get(cl, &info, &e) != EPMOE_OK) {
        fprintf(stderr, "serve_lib: %s\n", e.message);
        return 1;
    }
    mc_config c = fwdio_config_of(&info);
    uint32_t layer;
    fwdio_input in;
    ep_err err;
    if (epmoe_layer_index(&info, argv[2], &layer, &e) != EPMOE_OK ||
        fwdio_read(argv[3], &c, (int)layer, &in, &err) != 0) {
        fprintf(stderr, "serve_lib: %s\n", e.message[0] ? e.message : err.msg);
        return 1;
    }
    int T = in.T, H = c.hidden_size, k = c.num_experts_per_tok;
    slot *s = calloc((size_t)D, sizeof *s), first = {0};
    for (int i = 0; i < D; i++) {
        s[i].out = malloc((size_t)T * H * 2);
        s[i].ids = malloc((size_t)T * k * 4);
        s[i].w = malloc((size_t)T * k * 4);
    }
    int sent = 0, done = 0, rc = 0;
    while (done < N && rc == 0) {
        for (int i = 0; i < D && sent < N; i++) {
            if (s[i].rq != NULL)
                continue;
            epmoe_submit_args a = {.size = sizeof(epmoe_submit_args),
                                   .version = EPMOE_SUBMIT_ARGS_VERSION,
                                   .hidden_size = (uint32_t)H,
                                   .layer = layer,
                                   .n_tokens = (uint32_t)T,
                                   .hidden = in.x,
                                   .token_ids = in.ids,
                                   .out = s[i].out,
                                   .topk_ids = s[i].ids,
                                   .topk_weights = s[i].w,
                                   .user = &s[i]};
            if (epmoe_submit(cl, &a, &s[i].rq, &e) != EPMOE_OK) {
                fprintf(stderr, "serve_lib: submit: %s\n", e.message);
                rc = 1;
                break;
            }
            sent++;
        }
        struct pollfd p = {.fd = epmoe_fd(cl), .events = POLLIN};
        if (rc || poll(&p, 1, 40000) <= 0) {
            rc = rc ? rc : (fprintf(stderr, "serve_lib: nothing completed in 40 s\n"), 1);
            break;
        }
        epmoe_request *fin[16];
        int n = epmoe_poll(cl, fin, NULL, 16);
        for (int j = 0; j < n; j++) {
            slot *sl = epmoe_request_user(fin[j]);
            if (lib_check(sl, T, H, k, &first, &done) != 0)
                rc = 1;
            epmoe_request_free(&sl->rq);
        }
    }
    if (rc == 0 && fwdio_write(argv[4], T, H, k, first.out, first.ids, first.w, &err) != 0) {
        fprintf(stderr, "serve_lib: %s\n", err.msg);
        rc = 1;
    }
    for (int i = 0; i < D; i++) {
        epmoe_request_free(&s[i].rq);
        free(s[i].out), free(s[i].ids), free(s[i].w);
    }
    free(s), free(first.out), free(first.ids), free(first.w);
    fwdio_input_free(&in);
    epmoe_close(&cl);
    return rc;
}
