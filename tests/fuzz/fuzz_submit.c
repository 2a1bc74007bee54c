/*
 * fuzz_submit.c — a worker's client endpoint on arbitrary frames: a SUBMIT body and its payload
 * frames (srv_check_submit, worker/serve.h) against a fixed session: H 128, vocab 64, 3 MoE
 * layers of which layer 0 is hash-routed (the same model as fuzz_step).
 *
 * Input: frames (fuzz_frames.h), as a client's DEALER sends them. Properties: nothing crashes,
 * leaks or reads outside the input; a refusal carries a code of the protocol and says why; an
 * accepted SUBMIT names a layer of the model, 1..EP_MAX_TOKENS tokens, hidden states of exactly
 * bf16 [T, H], all finite, and token ids of exactly int64 [T], each below vocab_size, whenever it
 * has ids or its layer is hash-routed.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "fuzz_frames.h"
#include "worker/serve.h"

#define FUZZ_HASH 0xC0F1C0F1C0F1C0F1ull

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
    s->config_hash = FUZZ_HASH;
    s->world_size = 2;
    return s;
}

static float fuzz_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* What an accepted SUBMIT must be (the header's properties), checked independently. */
static void fuzz_check_accepted(const exec_session *s, const Epmoe__Submit *r, const wire_msg *m)
{
    size_t T = r->n_tokens, H = (size_t)s->config.hidden_size;
    bool ids = r->has_has_ids && r->has_ids;
    if (r->layer >= 3 || T < 1 || T > EP_MAX_TOKENS || m->payload_len[0] != T * H * 2)
        abort();
    if ((r->layer == 0 && !ids) || m->n_payloads != (ids ? 2 : 1))
        abort();
    for (size_t i = 0; i < T * H; i++) {
        uint16_t b;
        memcpy(&b, m->payload[0] + 2 * i, 2);
        if (!isfinite(fuzz_bf16(b)))
            abort();
    }
    for (size_t t = 0; ids && t < T; t++) {
        int64_t id;
        if (m->payload_len[1] != T * 8)
            abort();
        memcpy(&id, m->payload[1] + 8 * t, 8);
        if (id < 0 || id >= s->config.vocab_size)
            abort();
    }
    if (r->has_config_hash && r->config_hash != FUZZ_HASH)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR); /* a refused request is the expected case here */
    exec_session *ses = fuzz_session();
    wire_msg *m = fuzz_message(data, size);
    if (m == NULL)
        return 0;
    ep_err err = {0};
    Epmoe__Submit *r = (Epmoe__Submit *)wire_unpack(&epmoe__submit__descriptor, m, &err);
    if (r != NULL) {
        srv_env env = {.session = ses};
        Epmoe__ErrorCode code = EPMOE__ERROR_CODE__ERR_NONE;
        err.msg[0] = '\0';
        if (srv_check_submit(&env, r, m, &code, &err) == 0)
            fuzz_check_accepted(ses, r, m);
        else if (err.msg[0] == '\0' || code == EPMOE__ERROR_CODE__ERR_NONE ||
                 wire_code_name((int)code, NULL) == NULL)
            abort();
        wire_free_unpacked(&r->base);
    } else if (err.msg[0] == '\0') {
        abort();
    }
    wire_msg_close(m);
    free(m);
    return 0;
}
