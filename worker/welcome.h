/*
 * welcome.h — a worker's validation of the coordinator's WELCOME (welcome.c, prefix wctl_ as the
 * control thread it serves, control.h): the session the executor will work under, checked field
 * by field before anything of it is used or acknowledged.
 */
#ifndef EPMOE_WELCOME_H
#define EPMOE_WELCOME_H

#include <stdbool.h>

#include "common/error.h"
#include "epmoe.pb-c.h"
#include "worker/exec_session.h"

/* Bounds accepted from WELCOME: faster than 10 ms is a typo; liveness above 100 hides death. */
#define WCTL_MIN_HEARTBEAT_MS 10
#define WCTL_MAX_HEARTBEAT_MS 600000
#define WCTL_MAX_LIVENESS     100

/* Validate a WELCOME and build the executor's session: presence of every field it needs
 * (session included), 1 <= world_size <= EP_MAX_WORKERS, rank < world_size, the config
 * (mmsg_to_config), one expert_owner entry per routed expert each < world_size, peers covering
 * every rank exactly once with a data endpoint (and, when secure, a 32-byte public key),
 * model_path and data_endpoint present, heartbeat_ms and liveness within bounds, checkpoint
 * files (at most ST_MAX_SHARDS) each with a name, size, mtime and header hash. Errors name the
 * field and what was expected. */
exec_session *wctl_welcome_parse(const Epmoe__Welcome *w, bool secure, ep_err *err);

#endif
