/*
 * fuzz_dataplane.c — the data plane's validation, slots and grants (worker/transport_zmq.h) on a
 * transport without sockets: rank 1 of 3, H 128, 6 experts, top-2, fixed session and epoch.
 *
 * Input: records [op u8][arg u8][len u16 LE]: op 0 delivers a message made of the next len
 * bytes (frames, fuzz_frames.h); op 1 grants peer arg>>4 & 3 a COMBINE of len & 63 pairs for
 * step 100 + (arg & 15); op 2 finishes step 100 + arg; op 3 takes what step 100 + arg holds.
 * Properties: nothing crashes, leaks or reads outside the input; a peer never holds more than
 * one DISPATCH and one COMBINE (so at most 4 messages are kept); what is taken is whole: its
 * step, a peer as source, the arrays of its counts, every pair_row below n_rows and every
 * pair_expert one of rank 1's.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"
#include "fuzz_frames.h"
#include "worker/transport_zmq.h"

#define FUZZ_P 3
#define FUZZ_E 6

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_check_taken(const tp_msg *m, uint64_t step)
{
    if (m->step_id != step || m->src_rank < 0 || m->src_rank >= FUZZ_P || m->src_rank == 1)
        abort();
    if (m->kind == TP_COMBINE) {
        if (m->n_pairs > 0 && m->out == NULL)
            abort();
        return;
    }
    if (m->n_pairs > 0 && (m->pair_row == NULL || m->pair_expert == NULL || m->pair_weight == NULL))
        abort();
    for (int p = 0; p < m->n_pairs; p++)
        if (m->pair_row[p] >= (uint32_t)m->n_rows || m->pair_expert[p] / 2 != 1)
            abort(); /* experts 2 and 3 are rank 1's */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR); /* a dropped or refused message is the expected case here */
    static const uint32_t owner[FUZZ_E] = {0, 0, 1, 1, 2, 2};
    tpz_config cfg = {.rank = 1,
                      .world_size = FUZZ_P,
                      .session = 0xDA7A,
                      .epoch = 7,
                      .hidden = 128,
                      .n_experts = FUZZ_E,
                      .topk = 2,
                      .expert_owner = owner};
    ep_err err;
    tpz_transport *tp = tpz_create_unbound(&cfg, &err);
    if (tp == NULL)
        abort();
    size_t i = 0;
    while (i + 4 <= size) {
        uint8_t op = data[i] & 3, arg = data[i + 1];
        size_t len = (size_t)data[i + 2] | (size_t)data[i + 3] << 8;
        i += 4;
        if (op == 0) {
            if (len > size - i)
                len = size - i;
            wire_msg *m = fuzz_message(data + i, len);
            i += len;
            if (m != NULL)
                tpz_deliver(tp, m);
        } else if (op == 1) {
            tpz_grant(tp, 100 + (arg & 15), arg >> 4 & 3, (int)(len & 63));
        } else if (op == 2) {
            tpz_finish(tp, 100 + arg);
        } else {
            tp_msg m;
            while (tpz_take(tp, 100 + arg, &m)) {
                fuzz_check_taken(&m, 100 + arg);
                tpz_msg_release(&m);
            }
        }
        if (tpz_pending(tp) > 2 * (FUZZ_P - 1))
            abort();
    }
    tpz_destroy(&tp);
    return 0;
}
