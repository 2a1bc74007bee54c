/*
 * admin.h — the admin RPC's wire format (prefix adm_): parse an AdminRequest, format an
 * AdminReply. No state and no decisions: coord.c decides what a verb does (and hands FORWARD to
 * the sequencer); the functions here only turn facts into replies, queued in an ob_box.
 *
 * Verbs: STATUS, WORKERS, SHARDS [layer], CONFIG, FORWARD, SHUTDOWN, REBALANCE (the reply's
 * formatting; coord.c plans). Every AdminReply echoes the
 * request's id. A message that is not a decodable AdminRequest gets an Error message
 * (ERR_MALFORMED, ERR_UNKNOWN_TYPE) since no id is known; a decoded request with a bad field gets
 * AdminReply{ok: false, error_code: ERR_BAD_REQUEST, error: "..."}.
 */
#ifndef EPMOE_ADMIN_H
#define EPMOE_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/model_config.h"
#include "common/wire.h"
#include "coordinator/outbox.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"
#include "coordinator/stats.h"

/* What the read-only verbs report, gathered by coord.c. */
typedef struct adm_facts {
    const spec_cluster *spec;
    const mc_config *cfg;
    uint64_t config_hash;
    const plan_table *plan; /* the latest placement (what the workers were last told) */
    uint64_t current_epoch; /* the epoch steps run in */
    const char *problem;    /* why the cluster is blocked, "" otherwise */
    const char *state;      /* the cluster state's name */
    int cluster_state;      /* and its code (Epmoe__ClusterState) */
    uint64_t steps_done, steps_failed;
    double balance;              /* measured max/mean worker load, layer average (0: unknown) */
    uint64_t staged_epoch;       /* a rebalance epoch being prepared (0: none) */
    Epmoe__WorkerInfo **workers; /* [n_workers], by rank */
    int n_workers;
    const uint8_t (*worker_key)[AUTH_KEY_BYTES]; /* security: each worker's key; NULL: none */
    /* the serving path as the entries reported it: requests answered and failed, and answered
     * per second over the last 10 s */
    uint64_t requests_served, requests_failed;
    double request_rate;
} adm_facts;

/* The AdminRequest m carries (free it with wire_free_unpacked), or NULL after queuing the
 * answer: an Error message when m is not a decodable AdminRequest, AdminReply{ok: false} when
 * it lacks an id or a verb or carries payloads on a verb other than FORWARD. */
Epmoe__AdminRequest *adm_parse(const wire_msg *m, ob_box *out);

/* Queue an AdminReply (the id is set here; ok is set from error when not set) with optional
 * payloads (owned by the box when their free_fn is set). */
void adm_reply(ob_box *out, const uint8_t *ident, size_t ident_len, uint64_t id,
               Epmoe__AdminReply *reply, const wire_payload *payloads, int n_payloads);
/* Queue AdminReply{ok: false, error_code, error} for request id, from err's code and message. */
void adm_reply_error(ob_box *out, const uint8_t *ident, size_t ident_len, uint64_t id,
                     const ep_err *err);
/* The same with the code and a formatted message. */
void adm_error(ob_box *out, const uint8_t *ident, size_t ident_len, uint64_t id,
               Epmoe__ErrorCode code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* STATUS (status: true) or WORKERS. */
void adm_reply_workers(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f,
                       bool status);
/* SHARDS: the placement of the epoch; rq->layer, when given, is checked and echoed. */
void adm_reply_shards(ob_box *out, const wire_msg *m, const Epmoe__AdminRequest *rq,
                      const adm_facts *f);
void adm_reply_config(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f);
/* CLIENT_INFO: what a client (libepmoe) needs: config, hash, epochs, and per worker only its
 * name, rank, state, membership, client endpoint (its last READY's) and public key (security).
 * data_plane nccl: ERR_BAD_REQUEST "not on this data plane (nccl)" (docs/client.md). */
void adm_reply_client_info(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f);
/* What REBALANCE decided (coord.c), for its reply. */
typedef struct adm_rebalance {
    uint64_t epoch_before, epoch_after;
    const plan_report *report;
    bool applied;
    double plan_seconds;
    int window_steps;
    const mc_config *cfg;
    const stats_window *stats; /* for the measured balance per layer */
    const plan_table *current; /* the table the window's rank loads were measured under */
} adm_rebalance;

/* REBALANCE: RebalanceInfo with the loaded layers (docs/operations.md "epmoectl rebalance"). */
void adm_reply_rebalance(ob_box *out, const wire_msg *m, uint64_t id, const char *cluster,
                         const adm_rebalance *rb);
/* SHUTDOWN: ok, state stopping. */
void adm_reply_shutdown(ob_box *out, const wire_msg *m, uint64_t id, const adm_facts *f);
/* An unknown verb. */
void adm_reply_unknown_verb(ob_box *out, const wire_msg *m, const Epmoe__AdminRequest *rq);

#endif
