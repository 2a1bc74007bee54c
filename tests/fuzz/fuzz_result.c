/*
 * fuzz_result.c — libepmoe taking a RESULT from an entry worker (cl_on_entry_msg,
 * client/client_state.h) on arbitrary frames: a client (id FUZZ_CLIENT) of a model with H 128
 * and top-2, with one request in flight (seq 7, n tokens, layer 1) sent to member 0.
 *
 * Input: one byte (bits 0-1: n - 1 tokens; bit 2: the caller asked for topk_ids and weights)
 * then frames (fuzz_frames.h). Properties: nothing crashes, leaks or writes outside the
 * caller's buffers; a RESULT for another client or seq leaves the request in flight; a refusal
 * for load puts it back in the library's queue (flow control, docs/client.md); an
 * answered request is EPMOE_OK only with out, topk_ids and topk_weights exactly the payloads
 * of [n, H] bf16, [n, k] int32 and [n, k] f32, and otherwise has a failure status and a message.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_state.h"
#include "common/log.h"
#include "fuzz_frames.h"

#define FUZZ_CLIENT 0xC11E47C11E47ull
#define FUZZ_H      128
#define FUZZ_K      2
#define FUZZ_SEQ    7

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static epmoe_client *fuzz_client(void)
{
    static epmoe_client *c;
    static cl_member member = {.name = "w0", .rank = 0, .ready = true, .member = true};
    static int fds[2];
    if (c != NULL)
        return c;
    c = calloc(1, sizeof *c);
    if (c == NULL || pipe(fds) != 0 || fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0)
        abort(); /* every answer writes to done_fd: it must never block */
    c->id = FUZZ_CLIENT;
    c->max_in_flight = 1;
    c->slots = calloc(1, sizeof *c->slots);
    c->flow = calloc(1, sizeof *c->flow); /* member 0's credit (flow control) */
    if (c->slots == NULL || c->flow == NULL)
        abort();
    c->cap_entries = 1;
    c->flow[0].credit = CL_CREDIT;
    c->info.shape.hidden_size = FUZZ_H;
    c->info.shape.topk = FUZZ_K;
    c->info.n_members = 1;
    c->info.members = &member;
    c->done_fd = fds[1];
    c->wake_fd = fds[1];
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cond, NULL);
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR);
    if (size < 1)
        return 0;
    epmoe_client *c = fuzz_client();
    uint32_t T = (uint32_t)(data[0] & 3) + 1;
    bool want_topk = data[0] & 4;
    static uint16_t out[4 * FUZZ_H + 1];
    static int32_t ids[4 * FUZZ_K + 1];
    static float w[4 * FUZZ_K + 1];
    const uint16_t canary = 0xBEEF;
    out[T * FUZZ_H] = canary;
    ids[T * FUZZ_K] = (int32_t)canary;
    w[T * FUZZ_K] = (float)canary;
    struct epmoe_request *r = &c->slots[0];
    memset(r, 0, sizeof *r);
    *r = (struct epmoe_request){.c = c,
                                .state = CL_FLIGHT,
                                .layer = 1,
                                .n_tokens = T,
                                .out = out,
                                .topk_ids = want_topk ? ids : NULL,
                                .topk_weights = want_topk ? w : NULL,
                                .seq = FUZZ_SEQ,
                                .deadline_ns = INT64_MAX,
                                .entry = 0,
                                .held_at = -1,
                                .avoid = -1};
    c->done_head = c->done_tail = NULL;
    c->queue_head = c->queue_tail = NULL;
    c->flow[0] = (cl_flow){.credit = CL_CREDIT, .backoff_ms = CL_BUSY_BACKOFF_MS};
    wire_msg *m = fuzz_message(data + 1, size - 1);
    if (m == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    cl_on_entry_msg(c, 0, m);
    pthread_mutex_unlock(&c->mu);
    if (out[T * FUZZ_H] != canary || ids[T * FUZZ_K] != (int32_t)canary ||
        w[T * FUZZ_K] != (float)canary)
        abort(); /* written past the caller's buffers */
    if (r->state == CL_QUEUED) {
        /* refused for load: back in the library's queue to be sent again (flow control) */
        if (c->queue_head != r)
            abort();
    } else if (r->state != CL_FLIGHT) {
        if (r->status == EPMOE_OK) {
            if (m->n_payloads != 3 || m->payload_len[0] != (size_t)T * FUZZ_H * 2 ||
                memcmp(out, m->payload[0], m->payload_len[0]) != 0)
                abort();
            if (want_topk && (m->payload_len[1] != (size_t)T * FUZZ_K * 4 ||
                              memcmp(ids, m->payload[1], m->payload_len[1]) != 0 ||
                              memcmp(w, m->payload[2], m->payload_len[2]) != 0))
                abort();
        } else if (r->message[0] == '\0' || memchr(r->message, 0, sizeof r->message) == NULL) {
            abort();
        }
    }
    wire_msg_close(m);
    free(m);
    return 0;
}
