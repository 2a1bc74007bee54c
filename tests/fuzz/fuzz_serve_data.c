/*
 * fuzz_serve_data.c — the serving path's DISPATCH and COMBINE by request id (docs/protocol.md
 * "Serving path") at a worker's data plane, on a transport without sockets: rank 1 of 3, H 128,
 * 6 experts, top-2, fixed session and epoch (the model of fuzz_dataplane).
 *
 * Input: records [op u8][len u16 LE]: op bit 0 clear delivers a message made of the next len
 * bytes (frames, fuzz_frames.h); set, takes the oldest kept serving-path message. The first
 * record's bit 1 installs the owner's filter of awaited COMBINEs (tpz_set_awaits: here the
 * odd attempts of rank 0's and the even ones of rank 2's).
 * Properties: nothing crashes, leaks or reads outside the input; what is kept stays within the
 * credits (TPZ_SERVE_CREDITS of each kind per peer: messages of no known connection count by the
 * rank they claim); what is taken is a request's (no step id), from a peer, and whole: a
 * DISPATCH has at most k pairs a row, every pair_row below n_rows and every pair_expert an
 * expert of the model; a COMBINE has its rows unless refused, at most EP_MAX_TOKENS x k, and is
 * one the filter awaits when it is installed.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"
#include "fuzz_frames.h"
#include "worker/transport_zmq.h"

#define FUZZ_P 3
#define FUZZ_E 6
#define FUZZ_K 2

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool fuzz_awaits(void *ctx, uint64_t request, uint32_t attempt, int src_rank)
{
    (void)ctx;
    (void)request;
    return (attempt & 1) == (src_rank == 0);
}

static void fuzz_check_taken(const tp_msg *m, bool filtered)
{
    if (!m->is_request || m->step_id != 0 || m->src_rank < 0 || m->src_rank >= FUZZ_P ||
        m->src_rank == 1)
        abort();
    if (m->kind == TP_COMBINE) {
        if (m->n_pairs > EP_MAX_TOKENS * FUZZ_K || (m->refused && m->out != NULL) ||
            (!m->refused && m->n_pairs > 0 && m->out == NULL))
            abort();
        if (filtered && !fuzz_awaits(NULL, m->request, m->attempt, m->src_rank))
            abort();
        return;
    }
    if (m->n_pairs > m->n_rows * FUZZ_K)
        abort();
    if (m->n_pairs > 0 && (m->pair_row == NULL || m->pair_expert == NULL || m->pair_weight == NULL))
        abort();
    for (int p = 0; p < m->n_pairs; p++)
        if (m->pair_row[p] >= (uint32_t)m->n_rows || m->pair_expert[p] >= FUZZ_E)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR); /* a dropped message is the expected case here */
    static const uint32_t owner[FUZZ_E] = {0, 0, 1, 1, 2, 2};
    tpz_config cfg = {.rank = 1,
                      .world_size = FUZZ_P,
                      .session = 0xDA7A,
                      .epoch = 7,
                      .hidden = 128,
                      .n_experts = FUZZ_E,
                      .topk = FUZZ_K,
                      .expert_owner = owner};
    ep_err err;
    tpz_transport *tp = tpz_create_unbound(&cfg, &err);
    if (tp == NULL)
        abort();
    bool filtered = size > 0 && (data[0] & 2);
    if (filtered)
        tpz_set_awaits(tp, fuzz_awaits, NULL);
    size_t i = 0;
    while (i + 3 <= size) {
        uint8_t op = data[i] & 1;
        size_t len = (size_t)data[i + 1] | (size_t)data[i + 2] << 8;
        i += 3;
        if (op == 0) {
            if (len > size - i)
                len = size - i;
            wire_msg *m = fuzz_message(data + i, len);
            i += len;
            if (m != NULL)
                tpz_deliver(tp, m);
        } else {
            tp_msg m;
            if (tpz_take_request(tp, &m)) {
                fuzz_check_taken(&m, filtered);
                tpz_msg_release(&m);
            }
        }
        if (tpz_pending(tp) > 2 * TPZ_SERVE_CREDITS * (FUZZ_P - 1))
            abort();
    }
    tpz_destroy(&tp);
    return 0;
}
