/*
 * admin.h — the admin RPC of the coordinator (prefix adm_): AdminRequest in, AdminReply out,
 * on the ROUTER bound at coordinator.admin.
 *
 * Verbs: STATUS, WORKERS, SHARDS [layer], CONFIG, FORWARD (handed to the sequencer), SHUTDOWN
 * (replies ok, then stops the daemon). Every AdminReply echoes the request's id. A message that
 * is not a decodable AdminRequest gets an Error message (ERR_MALFORMED, ERR_UNKNOWN_TYPE) since
 * no id is known; a decoded request with a bad field gets AdminReply{ok: false, error_code:
 * ERR_BAD_REQUEST, error: "..."}.
 */
#ifndef EPMOE_ADMIN_H
#define EPMOE_ADMIN_H

#include <stdint.h>

#include "common/wire.h"
#include "coordinator/coord.h"

/* Read and handle every message waiting on the admin socket (at most a batch per call). */
void adm_drain(coord *c);

/* Send an AdminReply (the id is set here) with optional payloads (owned by the call when their
 * free_fn is set). Best effort: a client that went away is logged at debug level. */
void adm_send(coord *c, const uint8_t *ident, size_t ident_len, uint64_t id,
              Epmoe__AdminReply *reply, const wire_payload *payloads, int n_payloads);
/* Send AdminReply{ok: false, error_code, error} for request id. */
void adm_send_error(coord *c, const uint8_t *ident, size_t ident_len, uint64_t id,
                    Epmoe__ErrorCode code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
