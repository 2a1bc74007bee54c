/*
 * coord_rebalance.h — the load window and the rebalance policy of the coordinator daemon
 * (prefix coord_; coord_rebalance.c).
 */
#ifndef EPMOE_COORD_REBALANCE_H
#define EPMOE_COORD_REBALANCE_H

#include <stdbool.h>

#include "common/error.h"
#include "common/wire.h"
#include "coordinator/outbox.h"
#include "coordinator/planner.h"
#include "coordinator/coord_state.h"

/* Measured max/mean worker load averaged over the layers with load in the current epoch
 * (0: none yet). */
double coord_measured_balance(const coord *c);
/* Plan a rebalance from the window: *t_p is the new table, or NULL when it would change nothing;
 * rep gets the balance before and after. 0, or -1 with err. */
int coord_plan_rebalance(coord *c, plan_table **t_p, plan_report *rep, double *secs, ep_err *err);
/* Start a staged epoch: workers load what they gain while steps go on in the current one. */
const plan_table *coord_stage(coord *c, plan_table **t_p, const char *why);
/* Every member of the staged epoch prepared it. */
bool coord_staged_prepared(const coord *c);
/* At a step boundary: the staged epoch becomes the one served. */
void coord_commit(coord *c);
void coord_on_stage_failed(coord *c, const ob_event *e);
/* A step closed: metrics, the load window, and the automatic rebalance. */
void coord_on_step_end(coord *c);
/* The load of a worker's serving-path requests (LOAD_REPORT): one entry of the load window,
 * as a step's STEP_DONE is (the serving path has no steps); reports of another epoch, or with
 * an expert or rank out of range, do not enter it. Its requests answered and failed, their
 * timings and data-plane traffic count whatever the epoch (metrics, STATUS); a layer out of
 * range drops the report. */
void coord_on_load_report(coord *c, int rank, const wire_msg *m);
/* Requests answered per second over the last COORD_RATE_S seconds (STATUS). */
double coord_served_rate(const coord *c);

#endif
