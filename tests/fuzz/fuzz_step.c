/*
 * fuzz_step.c — a worker's STEP validation on arbitrary frames (exec_step_check), against a
 * fixed session: H 128, 3 layers of which layer 0 is hash-routed, session and epoch fixed.
 *
 * Input: one byte (bit 0: a step ran before; the others: its id) then frames. Properties:
 * nothing crashes or reads outside the input; a refusal says why; an accepted STEP carries the
 * session and epoch, a layer of the model, at most EP_MAX_TOKENS tokens, payloads of exactly
 * hidden bf16 [T, H] (and ids int64 [T]), ids on the hash layer, finite hidden states, and an
 * id above the last.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "fuzz_frames.h"
#include "worker/exec.h"

#define FUZZ_SESSION 0x5E5510A5E5510A5Eull
#define FUZZ_EPOCH   1796000000000ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static exec_session *fuzz_session(void)
{
    static exec_session *s;
    if (s != NULL)
        return s;
    s = exec_session_new(4, 2);
    memset(&s->config, 0, sizeof s->config);
    s->config.hidden_size = 128;
    s->config.moe_intermediate_size = 128;
    s->config.n_routed_experts = 4;
    s->config.num_experts_per_tok = 2;
    s->config.num_hidden_layers = 2;
    s->config.num_hash_layers = 1;
    s->config.num_nextn_predict_layers = 1;
    s->config.vocab_size = 64;
    s->session = FUZZ_SESSION;
    s->epoch = FUZZ_EPOCH;
    s->world_size = 2;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR); /* a dropped or refused message is the expected case here */
    if (size < 1)
        return 0;
    exec_session *ses = fuzz_session();
    bool have_last = data[0] & 1;
    uint64_t last = data[0] >> 1;
    wire_msg *m = fuzz_message(data + 1, size - 1);
    if (m == NULL)
        return 0;
    ep_err err = {0};
    Epmoe__Step *req = (Epmoe__Step *)wire_unpack(&epmoe__step__descriptor, m, &err);
    if (req != NULL) {
        int rc = exec_step_check(ses, 3, have_last, last, req, m, &err);
        if (rc != 0 && err.msg[0] == '\0')
            abort();
        if (rc == 0) {
            bool ids = req->has_has_ids && req->has_ids;
            size_t T = req->n_tokens;
            if (req->session != FUZZ_SESSION || req->epoch != FUZZ_EPOCH || req->layer >= 3 ||
                T > EP_MAX_TOKENS || m->payload_len[0] != T * 128 * 2 ||
                (ids && m->payload_len[1] != T * 8) || (req->layer == 0 && !ids) ||
                (have_last && req->step_id <= last))
                abort();
            for (size_t i = 0; i < T * 128; i++) {
                uint16_t v = (uint16_t)(m->payload[0][2 * i] | m->payload[0][2 * i + 1] << 8);
                if ((v & 0x7F80) == 0x7F80)
                    abort();
            }
        }
        wire_free_unpacked(&req->base);
    } else if (err.msg[0] == '\0') {
        abort();
    }
    wire_msg_close(m);
    free(m);
    return 0;
}
