/*
 * coord.h — the coordinator daemon: its sockets, its poll loop and the state its modules share
 * (prefix coord_).
 *
 * One thread owns everything (anchors-ops-style §1.1, §2.9 mdbroker): the ROUTER for workers
 * (coordinator.listen), the ROUTER for operators (coordinator.admin), and a signalfd, all in one
 * zmq_poll loop whose timeout is never infinite. Three modules act on the shared struct coord:
 *
 *   registry  (reg_)  worker lifecycle: REGISTER .. READY, heartbeats, liveness
 *   sequencer (seq_)  the FIFO of forward requests and the one step in flight
 *   admin     (adm_)  the admin RPC verbs and their replies
 *
 * They call each other directly (a worker lost fails the step in flight; a FORWARD goes to the
 * sequencer), always from the loop's thread. coord_update_state recomputes the cluster state
 * after anything that can change it, logs and reports the change to systemd.
 *
 * Contract: coord_create binds both sockets (errors name the spec line of the endpoint);
 * coord_run serves until SIGTERM/SIGINT or an admin SHUTDOWN, then stops in order (SHUTDOWN to
 * every registered worker, ERR_SHUTTING_DOWN to every queued request) and returns 0;
 * coord_destroy frees everything. No input from either socket can crash the daemon: every
 * message is checked, answered with an Error where the sender is known, and the loop goes on.
 */
#ifndef EPMOE_COORD_H
#define EPMOE_COORD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"
#include "coordinator/planner.h"
#include "coordinator/spec.h"

typedef enum coord_state {
    COORD_FORMING = 0, /* some worker never registered, or is dead */
    COORD_LOADING = 1, /* every worker registered, some not ready */
    COORD_READY = 2,   /* every worker ready: forward steps run */
    COORD_STOPPING = 3 /* SHUTDOWN or SIGTERM: no new work */
} coord_state;

typedef struct reg_registry reg_registry;
typedef struct seq_sequencer seq_sequencer;

typedef struct coord {
    const spec_cluster *spec; /* borrowed from main, outlives the daemon */
    const mc_config *cfg;
    uint64_t config_hash; /* mc_hash(cfg) */
    uint64_t session;     /* random per start: WELCOME, STEP and the data plane carry it */
    const plan_table *plan;
    void *zctx;
    void *wsock; /* ROUTER coordinator.listen (workers) */
    void *asock; /* ROUTER coordinator.admin (operators) */
    int sigfd;   /* signalfd for SIGTERM, SIGINT (stop) and SIGHUP (ignored for now) */
    reg_registry *reg;
    seq_sequencer *seq;
    coord_state state;
    bool stop;      /* leave the loop after this iteration */
    int64_t now_ms; /* CLOCK_MONOTONIC, refreshed once per loop iteration */
    int64_t next_heartbeat_ms;
    uint64_t watchdog_ms; /* half of WatchdogSec, 0 when off */
    int64_t next_watchdog_ms;
} coord;

/* Create the daemon and bind both sockets. The spec, config and plan are borrowed. */
coord *coord_create(const spec_cluster *spec, const mc_config *cfg, const plan_table *plan,
                    ep_err *err);
/* Serve until stopped; returns 0 after an orderly stop, -1 when the loop itself failed. */
int coord_run(coord *c, ep_err *err);
void coord_destroy(coord **self_p);

/* Recompute the cluster state from the registry; log and notify systemd on a change. */
void coord_update_state(coord *c);
/* Begin an orderly stop (SIGTERM, admin SHUTDOWN): stop taking work, answer queued requests
 * with ERR_SHUTTING_DOWN, send SHUTDOWN to the workers; the loop exits after this iteration. */
void coord_stop(coord *c, const char *reason);

const char *coord_state_name(coord_state s); /* "forming", "loading", "ready", "stopping" */
int64_t coord_clock_ms(void);                /* CLOCK_MONOTONIC in ms */

#endif
