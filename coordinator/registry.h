/*
 * registry.h — the workers of the cluster and their lifecycle (prefix reg_).
 *
 * A passive state machine (coord.h): every function gets the facts it needs in a reg_env,
 * changes only the registry, and returns what happened in an ob_box — messages to send and
 * events (OB_EV_LOST when a registered worker is gone, OB_EV_READY when one acknowledged the
 * epoch). It never calls the sequencer or the planner; coord.c routes the events.
 *
 * One entry per worker of the spec, index == rank. A worker moves
 *
 *   absent --REGISTER--> welcomed --CONFIG_ACK(hash ok)--> loading --READY--> ready
 *                          |  CONFIG_ACK(hash differs): Error ERR_CONFIG_HASH, stays welcomed
 *                          |  Error ERR_LOAD_FAILED from the worker: load-failed (LOADING or
 *                          |  READY later moves it on again)
 *   any registered state --silent for liveness x heartbeat_ms--> dead --REGISTER--> welcomed
 *   loading, ready, load-failed --EPOCH sent--> loading --READY{epoch}--> ready
 *   ready --EPOCH{staged} sent--> ready (staged) --READY{staged}--> ready (prepared)
 *         --EPOCH_COMMIT sent--> loading --READY{epoch}--> ready
 *
 * Placement epochs: each worker remembers the epoch it was last told (WELCOME or EPOCH) and the
 * one it last acknowledged (READY). READY for an older epoch than the one the worker was told
 * is a superseded acknowledgement (it was still loading when a newer epoch came): dropped. A
 * CONFIG_ACK for a welcome whose epoch has since been replaced is answered with a new WELCOME.
 * A worker whose connection is gone (a send fails with EHOSTUNREACH) is declared dead at once:
 * ZeroMQ has already dropped its routing id, so nothing will reach it until it registers again.
 *
 * REGISTER is checked in this order: a name (1..SPEC_NAME_MAX bytes; a longer one is named by
 * its length); a name of the spec (ERR_UNKNOWN_WORKER); with security, the connection's key
 * (its ZAP user id) is that name's key (ERR_REFUSED); the device is the spec's (ERR_REFUSED: a
 * permanent refusal, the worker exits 78); the name is not registered from another connection
 * that is still open (ERR_DUPLICATE: a second process under a live worker's name; the
 * coordinator asks coord.c whether the old routing id is still connected, so a restarted
 * process, whose old connection closed with it, is accepted at once). epmoe-worker gives each
 * of its connections a routing id of its own, NAME/random/N, whose NAME/random part names the
 * process: a REGISTER from another connection of the same process (a reconnect after a silence,
 * while the old connection may still be open here) is never a duplicate; any other routing id
 * names a process of its own. A REGISTER for a registered name from a closed connection or from
 * the same process (a restart) starts the worker again at welcomed and reports it lost
 * (OB_EV_LOST).
 *
 * Workers are found by the routing id they registered from; any message from a registered
 * worker counts as a sign of life. Messages from a routing id that has not registered get
 * Error ERR_NOT_REGISTERED ("send REGISTER first"); messages from a worker declared dead get
 * Error ERR_WORKER_LOST ("register again"); HEARTBEATs from either are dropped unanswered, so
 * such a worker stops hearing from us and registers again by its own liveness rule.
 */
#ifndef EPMOE_REGISTRY_H
#define EPMOE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/model_config.h"
#include "common/wire.h"
#include "coordinator/outbox.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

typedef enum reg_state {
    REG_ABSENT = 0,  /* never registered */
    REG_WELCOMED,    /* WELCOME sent, waiting for CONFIG_ACK (or its hash was wrong) */
    REG_LOADING,     /* LOAD sent */
    REG_LOAD_FAILED, /* the worker reported ERR_LOAD_FAILED */
    REG_READY,       /* serving */
    REG_DEAD         /* silent for liveness x heartbeat_ms */
} reg_state;

#define REG_ERROR_MAX 512

typedef struct reg_worker {
    const spec_worker *spec; /* name, node, device, data endpoint, rank */
    reg_state state;
    uint8_t ident[WIRE_MAX_IDENT]; /* routing id it registered from (valid unless absent) */
    size_t ident_len;
    int64_t last_seen_ms; /* clk_mono_ms of its last message; 0 when never seen */
    uint64_t bytes_done, bytes_total;
    uint64_t load_read; /* checkpoint bytes read by the load under way or the last one ... */
    uint32_t load_ms;   /* ... in this long (0: unknown) */
    uint32_t pid;
    uint32_t n_experts;
    uint64_t epoch;      /* the epoch it was last told (WELCOME, EPOCH) */
    uint64_t acked;      /* the epoch of its last accepted READY (0: none) */
    uint64_t bytes_read; /* checkpoint bytes its last READY read */
    uint32_t slots_read; /* (layer, expert) slots its last READY read */
    uint64_t staged;     /* a staged epoch it was sent and has not committed (0: none) */
    bool prepared;       /* it answered READY {staged} for it */
    bool hash_refused;   /* its CONFIG_ACK hash differed: it gets no work */
    char hostname[EP_MAX_NAME];
    char version[64];
    char backend[64];
    char error[REG_ERROR_MAX]; /* last load, config or step error; "" when none */
    /* the client endpoint of its last READY (CLIENT_INFO); "" until it reported one. Kept
     * while it is away: a client uses only the members that are ready. */
    char client_ep[EP_MAX_NAME];
    /* REGISTER's device_info (GPU name, memory, compute capability), for WORKERS */
    bool has_device;
    Epmoe__DeviceInfo device; /* its strings point into dev_name / dev_backend */
    char dev_name[128];
    char dev_backend[64];
} reg_worker;

/* Whether a routing id still has an open connection (coord.c probes the ROUTER). */
typedef bool (*reg_connected_fn)(void *ctx, const uint8_t *ident, size_t len);

/* What the registry needs to know from the rest of the daemon, per call. */
typedef struct reg_env {
    const spec_cluster *spec;
    const mc_config *cfg;
    uint64_t config_hash;
    uint64_t session; /* WELCOME.session */
    /* security: (NULL: none): each worker's public key by rank, for WELCOME.peers and for the
     * rule that a key registers its own worker only */
    const uint8_t (*worker_key)[AUTH_KEY_BYTES];
    const ProtobufCBinaryData *client_keys; /* WELCOME.client_keys (security:), or NULL */
    size_t n_client_keys;
    Epmoe__CheckpointFile **checkpoint; /* WELCOME.checkpoint: the fingerprint */
    size_t n_checkpoint;
    reg_connected_fn connected; /* NULL: a registration counts as open while heard from */
    void *connected_ctx;
    const plan_table *plan; /* the latest placement: WELCOME, LOAD, READY and EPOCH refer to it */
    int64_t now_ms;
} reg_env;

typedef struct reg_registry reg_registry;

reg_registry *reg_create(const spec_cluster *spec, ep_err *err);
void reg_destroy(reg_registry **self_p);

int reg_size(const reg_registry *r);
reg_worker *reg_worker_at(reg_registry *r, int rank); /* NULL when out of range */
/* The registered worker (any state but absent) that uses this routing id, or NULL. */
reg_worker *reg_find_ident(reg_registry *r, const uint8_t *ident, size_t len);
bool reg_registered(const reg_worker *w); /* neither absent nor dead */

/* Counts for the cluster state: workers never registered or dead, and workers not ready. */
void reg_counts(const reg_registry *r, int *n_missing, int *n_not_ready);
/* Whether the worker of rank may own experts: registered, its config hash accepted and its
 * last load not failed (a drain is the planner's business). */
bool reg_can_own(const reg_registry *r, int rank);
/* Whether the worker of rank acknowledged epoch and is ready. */
bool reg_ready_in(const reg_registry *r, int rank, uint64_t epoch);
/* "a1 (absent), a2 (loading 40%)": the workers that are not ready, for error messages. */
void reg_not_ready_text(const reg_registry *r, char *buf, size_t cap);

/* REGISTER from the worker socket. */
void reg_on_register(reg_registry *r, const reg_env *env, const wire_msg *m, ob_box *out);
/* The rank of the registered, live worker that sent m (any message counts as a sign of life),
 * or -1 when the sender is unknown or dead: then the sender was told so in out (never for an
 * Error or a HEARTBEAT, see above). */
int reg_sender(reg_registry *r, const reg_env *env, const wire_msg *m, ob_box *out);
/* A lifecycle message (CONFIG_ACK, LOADING, READY, HEARTBEAT, ERROR) from the worker of rank
 * (as reg_sender found it). */
void reg_on_message(reg_registry *r, const reg_env *env, int rank, const wire_msg *m, ob_box *out);
/* A malformed message from this routing id: still a sign of life from a registered worker. */
void reg_touch(reg_registry *r, const uint8_t *ident, size_t len, int64_t now_ms);
/* Declare the workers silent for more than liveness x heartbeat_ms dead (coord.c checks every
 * quarter heartbeat, so a death is noticed within a quarter heartbeat of its expiry). */
void reg_expire(reg_registry *r, const reg_env *env, ob_box *out);
/* Every heartbeat_ms: declare silent workers dead, send HEARTBEAT to the others. */
void reg_tick(reg_registry *r, const reg_env *env, ob_box *out);
/* Declare a registered worker dead now (logged, error text set, OB_EV_LOST). */
void reg_declare_dead(reg_registry *r, int rank, const char *why, ob_box *out);
/* Record an error text on a worker (shown by status). */
void reg_set_error(reg_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Send EPOCH {env->plan, reason} to every worker with a session (loading, ready or
 * load-failed); they move to loading. */
void reg_send_epoch(reg_registry *r, const reg_env *env, const char *reason, ob_box *out);
/* A staged epoch t (a rebalance): EPOCH {t, staged} to every ready worker; they keep serving
 * and answer READY {staged} (OB_EV_PREPARED) or a load error (OB_EV_STAGE_FAILED). Returns the
 * number of workers sent it, -1 when out of memory. */
int reg_send_staged(reg_registry *r, const reg_env *env, const plan_table *t, const char *reason,
                    ob_box *out);
/* Whether the worker of rank is ready and prepared staged epoch `epoch`. */
bool reg_prepared(const reg_registry *r, int rank, uint64_t epoch);
/* EPOCH_COMMIT {env->plan->epoch} to every worker sent that staged epoch; they move to loading
 * until their READY {epoch}. */
void reg_send_commit(reg_registry *r, const reg_env *env, ob_box *out);
/* Forget staged epochs (abandoned). */
void reg_unstage(reg_registry *r);
/* A send to the worker of rank failed because its connection is gone: declared dead. */
void reg_unreachable(reg_registry *r, int rank, const char *err, ob_box *out);
/* Send SHUTDOWN{reason} to every registered worker (best effort). */
void reg_shutdown(reg_registry *r, const char *reason, ob_box *out);

/* A reload: take over the state of every worker of old whose name is in dst's spec (its
 * connection, lifecycle state and epochs; the rank may differ). Workers of old that are not in
 * dst's spec are sent SHUTDOWN{reason}. */
void reg_adopt(reg_registry *dst, const reg_registry *old, const char *reason, ob_box *out);
/* A reload that keeps the world: the same workers in the same order, now described by spec
 * (the registry's references move to it before the old spec is freed). */
void reg_respec(reg_registry *r, const spec_cluster *spec);
/* Welcome every registered worker again into env->plan (the world changed: ranks, peers or
 * timeouts); they keep what they have loaded that they still own. */
void reg_rewelcome(reg_registry *r, const reg_env *env, ob_box *out);
/* CLIENT_KEYS with env's client keys to every registered worker (a reload re-read them): each
 * worker's client endpoint admits exactly those from now on, and refuses the SUBMITs of
 * connections whose key was removed. */
void reg_send_client_keys(reg_registry *r, const reg_env *env, ob_box *out);

/* Fill a WorkerInfo for admin replies; strings point into the registry and the spec (valid
 * until the next registry change). */
void reg_worker_info(reg_registry *r, const reg_env *env, int rank, Epmoe__WorkerInfo *out);

const char *reg_state_name(reg_state s); /* absent welcomed loading load-failed ready dead */

#endif
