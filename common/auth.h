/*
 * auth.h — CurveZMQ keys, allow-lists and the ZAP handler every epmoe daemon runs when the
 * cluster spec has a `security:` section (prefix auth_).
 *
 * Keys: a key pair is two files written by `epmoectl keygen`: NAME.key (the secret key and its
 * public key, mode 0600) and NAME.pub (the public key, for whoever must admit NAME). Both use
 * czmq's certificate text format (zcert), so keys made with czmq's tools work too:
 *
 *   curve
 *       public-key = "<40 Z85 characters>"
 *       secret-key = "<40 Z85 characters>"      (NAME.key only)
 *
 * A .pub file may also be a bare 40-character Z85 line. A secret-key file that anyone but its
 * owner may read or write (mode & 077) is refused, as ssh refuses such identity files.
 *
 * Allow-lists map a public key to the name it speaks for (a worker's name, an operator's file
 * name). The ZAP handler (RFC 27) is a thread bound to inproc://zeromq.zap.01 in the daemon's
 * ZeroMQ context; every CURVE server socket names its allow-list by ZAP domain. A key in the
 * domain's list is admitted with user id = its name (wire_user_id() on every message from that
 * connection); any other key, or another mechanism, is refused with 400 and logged with the
 * peer's address (at most AUTH_LOG_PER_SEC lines a second for each domain and reason, then a
 * count). Lists may be replaced
 * while the handler runs (a worker learns its peers' keys from WELCOME).
 *
 * The handler must be running before a CURVE server socket binds: libzmq admits everyone when
 * no ZAP handler is bound.
 */
#ifndef EPMOE_AUTH_H
#define EPMOE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/limits.h"

#define AUTH_KEY_BYTES 32
#define AUTH_Z85_LEN   40
/* Refusals logged per second at most, for each (domain, reason); the rest are counted. */
#define AUTH_LOG_PER_SEC 5
/* Keys in one allow-list: every worker of the largest cluster plus as many operators. */
#define AUTH_MAX_KEYS (2 * EP_MAX_WORKERS)

/* ZAP domains of epmoe's CURVE server sockets. */
#define AUTH_DOMAIN_WORKERS   "epmoe-workers"   /* coordinator.listen */
#define AUTH_DOMAIN_OPERATORS "epmoe-operators" /* coordinator.admin */
#define AUTH_DOMAIN_DATA      "epmoe-data"      /* a worker's data endpoint */
#define AUTH_DOMAIN_CLIENTS   "epmoe-clients"   /* a worker's client endpoint */

typedef struct auth_keypair {
    uint8_t pub[AUTH_KEY_BYTES];
    uint8_t sec[AUTH_KEY_BYTES];
} auth_keypair;

/* Whether this libzmq supports CURVE (built with libsodium). */
bool auth_available(void);

/* Write DIR/NAME.key (0600) and DIR/NAME.pub (0644) with a fresh key pair. NAME must be a plain
 * file name (no '/', not "." or "..", 1..EP_MAX_NAME-1 bytes); existing files are never
 * overwritten. Errors name the file. */
int auth_keygen(const char *dir, const char *name, ep_err *err);

/* Read a secret-key file (refused when group or others may access it). */
int auth_load_secret(const char *path, auth_keypair *kp, ep_err *err);
/* Read a public key from a .pub file (or the public key of a .key file). */
int auth_load_public(const char *path, uint8_t pub[AUTH_KEY_BYTES], ep_err *err);
/* Z85 text of a public key (out has AUTH_Z85_LEN + 1 bytes), for messages. */
void auth_z85(const uint8_t key[AUTH_KEY_BYTES], char *out);

/* ---- allow-lists ---- */
typedef struct auth_list auth_list;
auth_list *auth_list_new(void);
void auth_list_free(auth_list **self_p);
/* Admit key as name. The same key under two names is an error (a key speaks for one name). */
int auth_list_add(auth_list *l, const uint8_t key[AUTH_KEY_BYTES], const char *name, ep_err *err);
/* Add every DIR/\*.pub, each under its file name without ".pub". */
int auth_list_add_dir(auth_list *l, const char *dir, ep_err *err);
int auth_list_count(const auth_list *l);
/* Add every entry of from to l (same rule as auth_list_add). */
int auth_list_merge(auth_list *l, const auth_list *from, ep_err *err);
/* The same, each name with prefix before it (one socket admitting two kinds of key tells them
 * apart by the user id: "client/NAME"; a file name cannot hold '/'). */
int auth_list_merge_as(auth_list *l, const auth_list *from, const char *prefix, ep_err *err);
/* The i-th key (0 <= i < auth_list_count), or NULL. */
const uint8_t *auth_list_key(const auth_list *l, int i);
/* The name key speaks for, or NULL. */
const char *auth_list_find(const auth_list *l, const uint8_t key[AUTH_KEY_BYTES]);

/* ---- the ZAP handler ---- */
/* Why a connection was refused: its key is in no allow-list (ZAP), it does not speak CURVE
 * (a client without --key), its handshake does not decrypt (a wrong server key, a replayed or
 * forged handshake), or it is not a ZeroMQ peer at all (garbage, a stream cut mid-handshake). */
typedef enum auth_reason {
    AUTH_REASON_KEY = 0,
    AUTH_REASON_MECHANISM,
    AUTH_REASON_CRYPTO,
    AUTH_REASON_PROTOCOL,
    AUTH_N_REASONS
} auth_reason;
const char *auth_reason_name(auth_reason r); /* key, mechanism, crypto, protocol */
/* Told of every refusal, from the handler's thread (after it is logged). */
typedef void (*auth_refusal_fn)(void *ctx, const char *domain, auth_reason reason);

typedef struct auth_zap auth_zap;
/* The handler of this process: it also watches the handshakes of every CURVE server socket
 * auth_server() makes from then on (a socket monitor each, read in its thread: libzmq's ZAP
 * sees only the keys, not the connections that fail before: no CURVE, a wrong server key,
 * garbage). Each refusal is logged with the peer's address and the reason, rate limited like
 * ZAP's, and counted (auth_zap_on_refusal). */
auth_zap *auth_zap_start(void *zctx, ep_err *err);
void auth_zap_on_refusal(auth_zap *z, auth_refusal_fn fn, void *ctx);
/* Stop the thread and free every list. Tolerates NULL. */
void auth_zap_stop(auth_zap **self_p);
/* Set (or replace) the allow-list of domain; the list is taken, also on failure. */
int auth_zap_allow(auth_zap *z, const char *domain, auth_list *list, ep_err *err);
/* Connections refused so far (for tests and logs). */
uint64_t auth_zap_refused(auth_zap *z);
/* Whether name (a connection's ZAP user id, wire_user_id) is still a name in domain's current
 * allow-list of this process's handler: a connection admitted before a reload removed its key
 * is told apart by this (libzmq cannot close one connection of a server socket). False when
 * name is NULL or no handler runs. */
bool auth_admits(const char *domain, const char *name);

/* ---- sockets ---- */
/* Make sock a CURVE server with kp whose clients the ZAP handler checks against domain; the
 * running handler watches its handshakes (call it from sock's thread, before the bind). */
int auth_server(void *sock, const auth_keypair *kp, const char *domain, ep_err *err);
/* Make sock a CURVE client with kp that accepts only the server whose public key is server. */
int auth_client(void *sock, const auth_keypair *kp, const uint8_t server[AUTH_KEY_BYTES],
                ep_err *err);

/* Watch sock's handshakes: returns a PAIR socket to poll for ZMQ_POLLIN (close it with
 * zmq_close before sock), or NULL with err. */
void *auth_monitor(void *zctx, void *sock, ep_err *err);

typedef enum auth_event {
    AUTH_EV_NOTHING = -1, /* nothing waiting */
    AUTH_EV_OTHER = 0,
    AUTH_EV_REFUSED = 1, /* the server refused our key, or the mechanisms differ: permanent */
    AUTH_EV_FAILED = 2,  /* a handshake broke off without a reason: a restarting peer, or a
                            CURVE server that hung up on a plain client; permanent only when it
                            keeps happening (AUTH_FAILED_LIMIT in a row) */
    AUTH_EV_OK = 3       /* a handshake succeeded */
} auth_event;
/* Handshakes in a row that broke off without a reason before that counts as a refusal. */
#define AUTH_FAILED_LIMIT 5

/* Read one event from a monitor; why (REFUSED, FAILED) says what, naming the endpoint. */
auth_event auth_monitor_read(void *mon, char *why, size_t cap);

#endif
