/*
 * registry.h — the workers of the cluster and their lifecycle (prefix reg_).
 *
 * One entry per worker of the spec, index == rank. A worker moves
 *
 *   absent --REGISTER--> welcomed --CONFIG_ACK(hash ok)--> loading --READY--> ready
 *                          |  CONFIG_ACK(hash differs): Error ERR_CONFIG_HASH, stays welcomed
 *                          |  Error ERR_LOAD_FAILED from the worker: load-failed (LOADING or
 *                          |  READY later moves it on again)
 *   any registered state --silent for liveness x heartbeat_ms--> dead --REGISTER--> welcomed
 *
 * A REGISTER for a worker that is already registered (a restart: with ROUTER_HANDOVER the new
 * connection takes the routing id over) starts it again at welcomed and fails its in-flight
 * step with ERR_WORKER_LOST. A REGISTER under a name whose current registration is alive but
 * comes from another routing id is refused with ERR_DUPLICATE.
 *
 * Workers are found by the routing id they registered from; any message from a registered
 * worker counts as a sign of life. Messages from a routing id that has not registered get
 * Error ERR_BAD_REQUEST ("send REGISTER first"); messages from a worker declared dead get
 * Error ERR_WORKER_LOST ("register again"); HEARTBEATs from either are dropped unanswered, so
 * such a worker stops hearing from us and registers again by its own liveness rule.
 */
#ifndef EPMOE_REGISTRY_H
#define EPMOE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/wire.h"
#include "coordinator/coord.h"

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
    int64_t last_seen_ms; /* coord_clock_ms of its last message; 0 when never seen */
    uint64_t bytes_done, bytes_total;
    uint64_t load_read; /* checkpoint bytes read by the load under way or the last one ... */
    uint32_t load_ms;   /* ... in this long (0: unknown) */
    uint32_t pid;
    uint32_t n_experts;
    char hostname[EP_MAX_NAME];
    char version[64];
    char backend[64];
    char error[REG_ERROR_MAX]; /* last load, config or step error; "" when none */
    /* REGISTER's device_info (GPU name, memory, compute capability), for WORKERS */
    bool has_device;
    Epmoe__DeviceInfo device; /* its strings point into dev_name / dev_backend */
    char dev_name[128];
    char dev_backend[64];
} reg_worker;

reg_registry *reg_create(const spec_cluster *spec, const plan_table *plan, ep_err *err);
void reg_destroy(reg_registry **self_p);

int reg_size(const reg_registry *r);
reg_worker *reg_worker_at(reg_registry *r, int rank); /* NULL when out of range */
/* The registered worker (any state but absent) that uses this routing id, or NULL. */
reg_worker *reg_find_ident(reg_registry *r, const uint8_t *ident, size_t len);

/* Counts for the cluster state: workers never registered or dead, and workers not ready. */
void reg_counts(const reg_registry *r, int *n_missing, int *n_not_ready);
/* "a1 (absent), a2 (loading 40%)": the workers that are not ready, for error messages. */
void reg_not_ready_text(const reg_registry *r, char *buf, size_t cap);

/* Handle a lifecycle message from the worker socket (REGISTER, CONFIG_ACK, LOADING, READY,
 * HEARTBEAT, ERROR). Errors go back to the sender as Error messages. */
void reg_on_message(coord *c, const wire_msg *m);
/* Every heartbeat_ms: declare silent workers dead, send HEARTBEAT to the others. */
void reg_tick(coord *c);
/* Declare a registered worker dead now (log, error text, fail its step, update the state). */
void reg_declare_dead(coord *c, int rank, const char *why);
/* Send SHUTDOWN{reason} to every registered worker (best effort). */
void reg_shutdown(coord *c, const char *reason);
/* Record an error text on a worker (shown by status). */
void reg_set_error(reg_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Fill a WorkerInfo for admin replies; strings point into the registry (valid until the next
 * registry change). */
void reg_worker_info(coord *c, int rank, Epmoe__WorkerInfo *out);

const char *reg_state_name(reg_state s); /* absent welcomed loading load-failed ready dead */

#endif
