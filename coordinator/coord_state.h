/*
 * coord_state.h — the coordinator daemon's state (prefix coord_), shared by the files of the
 * coord module and by nothing else: coord.h is the daemon's interface.
 *
 * The module's files, from the loop down; each calls only the ones below it:
 *   coord.c            the poll loop: the sockets, the signals, the timers (a table), settling
 *   coord_admin.c      the admin verbs: what STATUS, DRAIN, RELOAD, REBALANCE ... do
 *   coord_reload.c     swapping a validated reload in (reload.c builds and validates it)
 *   coord_rebalance.c  the load window and the rebalance policy: plan, stage, commit
 *   coord_state.c      the cluster state, the facts each passive module gets, replanning, stop
 *   coord_create.c     creating the daemon (signals, keys, fingerprint, sockets), destroying it
 */
#ifndef EPMOE_COORD_STATE_H
#define EPMOE_COORD_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/clock.h"
#include "common/wire.h"
#include "coordinator/cmetrics.h"
#include "coordinator/keys.h"
#include "coordinator/ncclboot.h"
#include "coordinator/outbox.h"
#include "coordinator/planner.h"
#include "coordinator/registry.h"
#include "coordinator/reload.h"
#include "coordinator/sequencer.h"
#include "coordinator/spec.h"
#include "coordinator/stats.h"

typedef enum coord_state {
    COORD_FORMING = 0,  /* the first placement: some worker of the spec has not registered */
    COORD_LOADING = 1,  /* a placement epoch is being applied (or a member reloads its shard) */
    COORD_READY = 2,    /* every member of the epoch is ready: forward steps run */
    COORD_STOPPING = 3, /* SHUTDOWN or SIGTERM: no new work */
    COORD_BLOCKED = 4   /* no placement over the workers left (STATUS.problem says why) */
} coord_state;

/* STATUS's request rate: answered per second over this many seconds */
#define COORD_RATE_S 10

typedef struct coord coord; /* as in coord.h */

struct coord {
    spec_cluster *spec; /* the running spec (a reload swaps it) */
    mc_config cfg;
    uint64_t config_hash; /* mc_hash(&cfg) */
    uint64_t session;     /* random per start: WELCOME, STEP and the data plane carry it */
    bool session_fixed;   /* a worker was registered: the session can no longer be taken over */
    keys_cluster keys;    /* security: (spec->secure) */
    keys_cluster rl_keys; /* the keys of a reload waiting to be swapped in */
    auth_zap *zap;        /* security: admits workers and operators by key */
    /* the checkpoint's fingerprint as found at start (WELCOME.checkpoint) */
    Epmoe__CheckpointFile *ckpt;
    Epmoe__CheckpointFile **ckpt_ps;
    size_t n_ckpt;
    plan_epochs *pe; /* placement and its epochs */
    void *zctx;
    void *wsock; /* ROUTER coordinator.listen (workers) */
    void *asock; /* ROUTER coordinator.admin (operators) */
    int sigfd;   /* signalfd for SIGTERM, SIGINT (stop) and SIGHUP (reload) */
    reg_registry *reg;
    seq_sequencer *seq;
    nb_boot *nb; /* data_plane nccl: the communicator of the epoch; NULL for zmq */
    ob_box out;  /* what the handlers of the current input returned, not yet settled */
    coord_state state;
    bool stop;      /* leave the loop after this iteration */
    int64_t now_ms; /* CLOCK_MONOTONIC, refreshed once per loop iteration */
    int64_t next_heartbeat_ms;
    int64_t next_liveness_ms; /* a liveness check every quarter heartbeat */
    uint64_t watchdog_ms;     /* half of WatchdogSec, 0 when off */
    int64_t next_watchdog_ms;
    int64_t change_ms;   /* when the placement change in progress began (0: none) */
    rl_plan reload;      /* a validated reload waiting for the step in flight (spec != NULL) */
    char not_ready[600]; /* seq_env.not_ready */
    stats_window *stats; /* the load window (expert_parallel.window_steps) */
    cmx *mx;             /* Prometheus metrics */
    uint64_t steps_since_rebalance;
    int64_t rebalance_ms;     /* when the rebalance in progress was decided (0: none) */
    uint64_t rebalance_epoch; /* its epoch */
    /* the serving path's requests as the entries reported them (STATUS): answered, failed, and
     * the answered of each of the last COORD_RATE_S seconds (a ring by second) */
    uint64_t served_ok, served_failed;
    uint64_t served_in[COORD_RATE_S];
    int64_t served_sec[COORD_RATE_S];
    /* data-plane verdicts (coord_peer.c), per rank, sized for dp_n ranks */
    int dp_n;
    int64_t *dp_report;  /* [dp_n * dp_n]: when reporter r last reported x (0: not) */
    int64_t *dp_until;   /* quarantined until (0: not) */
    int64_t *dp_verdict; /* the last verdict about the rank */
    int *dp_strikes;     /* verdicts in a row: the quarantine doubles with each */
    int64_t dp_due;      /* the next evaluation of the reports (0: none) */
};

/* "forming", "loading", "ready", "stopping", "blocked" */
const char *coord_state_name(coord_state s);

void coord_notify_status(coord *c);
/* How often liveness is checked between heartbeats: a quarter heartbeat, at least 10 ms. */
int64_t coord_liveness_ms(const coord *c);
/* The latest epoch is complete once every member acknowledged it; then recompute the cluster
 * state, log and notify systemd on a change. */
void coord_update_state(coord *c);
reg_env coord_reg_env(const coord *c);
seq_env coord_seq_env(coord *c);
nb_env coord_nb_env(const coord *c);
/* The ranks that may own experts now: registered, usable, not drained. */
void coord_eligible(const coord *c, uint8_t *eligible);
/* Replan after a change (why: for the log and the workers); force: a new epoch even when the
 * table stays. Returns plan_replan's answer. */
int coord_replan(coord *c, bool from_base, bool force, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Begin an orderly stop (SIGTERM, admin SHUTDOWN): stop taking work, answer queued requests
 * with ERR_SHUTTING_DOWN, send SHUTDOWN to the workers; the loop exits after this iteration. */
void coord_stop(coord *c, const char *reason);

#endif
