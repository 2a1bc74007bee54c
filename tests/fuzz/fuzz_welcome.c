/*
 * fuzz_welcome.c — a worker's WELCOME validation on arbitrary frames (wctl_welcome_parse).
 *
 * Input: one byte (bit 0: the worker uses security) then frames (fuzz_frames.h). Properties:
 * nothing crashes, leaks or reads outside the input; a refusal says why; an accepted WELCOME
 * gives a session whose rank is below its world, whose every expert owner is a rank of the
 * world, whose every rank has a peer endpoint and name, and which has every peer's key when
 * the worker uses security.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"
#include "fuzz_frames.h"
#include "worker/welcome.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    log_set_level(LOG_ERROR); /* a dropped or refused message is the expected case here */
    if (size < 1)
        return 0;
    bool secure = data[0] & 1;
    wire_msg *m = fuzz_message(data + 1, size - 1);
    if (m == NULL)
        return 0;
    ep_err err = {{0}};
    Epmoe__Welcome *w = (Epmoe__Welcome *)wire_unpack(&epmoe__welcome__descriptor, m, &err);
    if (w != NULL) {
        exec_session *s = wctl_welcome_parse(w, secure, &err);
        if (s == NULL && err.msg[0] == '\0')
            abort();
        if (s != NULL) {
            if (s->rank < 0 || s->rank >= s->world_size || (secure && s->peer_key == NULL))
                abort();
            for (int e = 0; e < s->config.n_routed_experts; e++)
                if (s->expert_owner[e] >= (uint32_t)s->world_size)
                    abort();
            for (int r = 0; r < s->world_size; r++)
                if (s->peer_endpoint[r] == NULL || s->peer_name[r] == NULL)
                    abort();
        }
        exec_session_free(&s);
        wire_free_unpacked(&w->base);
    } else if (err.msg[0] == '\0') {
        abort();
    }
    wire_msg_close(m);
    free(m);
    return 0;
}
