/*
 * keys.h — the CurveZMQ keys a cluster spec's security: section names (prefix keys_).
 *
 * security.coordinator_key is the coordinator's secret key (mode 0600; common/auth.h refuses
 * anything looser), security.worker_keys a directory with NAME.pub for every worker of the spec
 * (a key speaks for that worker only: the registry refuses a REGISTER whose name is not the
 * name its key was admitted as), security.operator_keys a directory whose *.pub may use the
 * admin socket, security.client_keys (optional) a directory whose *.pub are libepmoe clients:
 * admitted on the admin socket under the user id "client/NAME" (KEYS_CLIENT_PREFIX), where
 * coord.c lets them read CLIENT_INFO and nothing else, and never on coordinator.listen (a client
 * key that is also a worker's key is refused at load). keys_load reads them all; every error names
 * the spec line of the key and the file. The coordinator loads them at start and again for a reload
 * (which fails, keeping the old state, when a key is missing); `epmoe-coordinator --check` loads
 * them too.
 */
#ifndef EPMOE_KEYS_H
#define EPMOE_KEYS_H

#include <stdbool.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "common/auth.h"
#include "common/error.h"
#include "coordinator/spec.h"

typedef struct keys_cluster {
    auth_keypair coordinator;
    uint8_t (*worker)[AUTH_KEY_BYTES]; /* [n_workers], by rank */
    int n_workers;
    auth_list *operators;
    auth_list *clients; /* empty without security.client_keys */
    /* WELCOME.client_keys: the keys a worker's client ROUTER admits (the clients; the operators
     * only without client_keys);
     * data points into the two lists */
    ProtobufCBinaryData *serving;
    int n_serving;
} keys_cluster;

/* The user id prefix of client keys on the admin socket. */
#define KEYS_CLIENT_PREFIX "client/"

/* Load every key of s->security (s->secure must be true). 0, or -1 with err. */
int keys_load(const spec_cluster *s, keys_cluster *k, ep_err *err);
/* Free (tolerates a zeroed k) and wipe the secret. */
void keys_free(keys_cluster *k);

/* The workers' allow-list: each worker's key as its name. NULL with err when out of memory or
 * two workers share a key. */
auth_list *keys_worker_list(const spec_cluster *s, const keys_cluster *k, ep_err *err);
/* The admin socket's allow-list: the operators' keys, and the client keys as "client/NAME". */
auth_list *keys_operator_list(const keys_cluster *k, ep_err *err);
/* Whether an admin connection's user id (wire_user_id) is a client key's. */
bool keys_is_client(const char *user_id);

#endif
