/* coord_peer.c — data-plane verdicts (coord_peer.h). */
#include "coordinator/coord_peer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* The first quarantine lasts this many liveness windows; each verdict in a row doubles it, up
 * to 2^COORD_DP_MAX_STRIKES times. */
#define COORD_DP_FIRST_WINDOWS 10
#define COORD_DP_MAX_STRIKES   6

static int64_t coord_dp_window(const coord *c)
{
    return (int64_t)c->spec->heartbeat_ms * c->spec->liveness;
}

static int64_t coord_dp_quarantine_ms(const coord *c, int strikes)
{
    int n = strikes < COORD_DP_MAX_STRIKES ? strikes : COORD_DP_MAX_STRIKES;
    return COORD_DP_FIRST_WINDOWS * coord_dp_window(c) << n;
}

/* The arrays for the spec's ranks (a reload may change them: the reports start afresh). */
static int coord_dp_shape(coord *c)
{
    int n = c->spec->n_workers;
    if (c->dp_n == n && c->dp_report != NULL)
        return 0;
    coord_peer_free(c);
    c->dp_report = calloc((size_t)n * (size_t)n, sizeof *c->dp_report);
    c->dp_until = calloc((size_t)n, sizeof *c->dp_until);
    c->dp_verdict = calloc((size_t)n, sizeof *c->dp_verdict);
    c->dp_strikes = calloc((size_t)n, sizeof *c->dp_strikes);
    if (!c->dp_report || !c->dp_until || !c->dp_verdict || !c->dp_strikes) {
        coord_peer_free(c);
        return -1;
    }
    c->dp_n = n;
    return 0;
}

void coord_peer_free(coord *c)
{
    free(c->dp_report);
    free(c->dp_until);
    free(c->dp_verdict);
    free(c->dp_strikes);
    c->dp_report = c->dp_until = c->dp_verdict = NULL;
    c->dp_strikes = NULL;
    c->dp_n = 0;
    c->dp_due = 0;
}

bool coord_quarantined(const coord *c, int rank)
{
    return rank >= 0 && rank < c->dp_n && c->dp_until[rank] > 0;
}

void coord_on_peer_report(coord *c, int rank, const wire_msg *m)
{
    ep_err err;
    Epmoe__PeerUnreachable *u =
        (Epmoe__PeerUnreachable *)wire_unpack(&epmoe__peer_unreachable__descriptor, m, &err);
    const plan_table *t = plan_current(c->pe);
    const char *drop = NULL;
    if (u == NULL)
        drop = err.msg;
    else if (!u->has_epoch || !u->has_rank || u->epoch != t->epoch)
        drop = "of another epoch";
    else if (coord_dp_shape(c) != 0)
        drop = "out of memory";
    else if ((int)u->rank >= c->dp_n || (int)u->rank == rank || !plan_is_member(t, rank) ||
             !plan_is_member(t, (int)u->rank) || coord_quarantined(c, rank) ||
             coord_quarantined(c, (int)u->rank))
        drop = "not about another member, or not from a member";
    if (drop != NULL) {
        log_debug(LOG_SUB_PLAN, "PEER_UNREACHABLE from rank %d dropped (%s)", rank, drop);
    } else {
        int x = (int)u->rank;
        log_info("worker %s reports that %s answered none of its DISPATCHes for %u ms "
                 "(placement epoch %" PRIu64 ")",
                 c->spec->workers[rank].name, c->spec->workers[x].name, u->silent_ms, t->epoch);
        c->dp_report[(size_t)rank * (size_t)c->dp_n + (size_t)x] = c->now_ms;
        if (c->dp_due == 0)
            c->dp_due = c->now_ms + c->spec->heartbeat_ms;
    }
    wire_free_unpacked(u ? &u->base : NULL);
}

/* blame[x]: the fresh reports against x, each 1 / (the ranks its reporter reports). */
static void coord_dp_blame(const coord *c, double *blame)
{
    int n = c->dp_n;
    int64_t fresh = c->now_ms - 2 * coord_dp_window(c);
    for (int x = 0; x < n; x++)
        blame[x] = 0;
    for (int r = 0; r < n; r++) {
        const int64_t *row = &c->dp_report[(size_t)r * (size_t)n];
        int k = 0;
        for (int x = 0; x < n; x++)
            k += row[x] > fresh && !coord_quarantined(c, x);
        for (int x = 0; k > 0 && x < n; x++)
            if (row[x] > fresh && !coord_quarantined(c, x))
                blame[x] += 1.0 / k;
    }
}

/* The rank the blame convicts, or -1. */
static int coord_dp_convict(const coord *c, const double *blame)
{
    int n = c->dp_n, best = -1;
    int64_t fresh = c->now_ms - 2 * coord_dp_window(c);
    for (int x = 0; x < n; x++) {
        if (coord_quarantined(c, x) || blame[x] < 1.0 - 1e-9 ||
            (best >= 0 && blame[x] <= blame[best]))
            continue;
        bool above = true;
        for (int r = 0; r < n && above; r++)
            if (c->dp_report[(size_t)r * (size_t)n + (size_t)x] > fresh)
                above = blame[x] > blame[r] + 1e-9;
        if (above)
            best = x;
    }
    return plan_current(c->pe)->n_members > 1 ? best : -1;
}

static void coord_dp_quarantine(coord *c, int x, const double *blame)
{
    int n = c->dp_n;
    int64_t q = coord_dp_quarantine_ms(c, c->dp_strikes[x]);
    if (c->dp_verdict[x] > 0 && c->now_ms - c->dp_verdict[x] > 2 * q) /* long since: afresh */
        c->dp_strikes[x] = 0, q = coord_dp_quarantine_ms(c, 0);
    c->dp_strikes[x]++;
    c->dp_verdict[x] = c->now_ms;
    c->dp_until[x] = c->now_ms + q;
    for (int r = 0; r < n; r++) /* the reports of this stall are spent */
        c->dp_report[(size_t)r * (size_t)n + (size_t)x] =
            c->dp_report[(size_t)x * (size_t)n + (size_t)r] = 0;
    const char *name = c->spec->workers[x].name;
    log_warn("worker %s is dead for the data plane (blame %.2f from the origins that get no "
             "COMBINE from it); its control connection lives; it owns no experts for %" PRId64
             " ms (verdict %d in a row)",
             name, blame[x], q, c->dp_strikes[x]);
    coord_replan(c, false, false, "worker %s is cut off from the data plane", name);
}

void coord_peer_forget(coord *c, int rank)
{
    if (rank < 0 || rank >= c->dp_n)
        return;
    c->dp_until[rank] = 0;
    for (int r = 0; r < c->dp_n; r++)
        c->dp_report[(size_t)r * (size_t)c->dp_n + (size_t)rank] =
            c->dp_report[(size_t)rank * (size_t)c->dp_n + (size_t)r] = 0;
}

int64_t coord_peer_due(coord *c)
{
    int64_t due = c->dp_due > 0 ? c->dp_due : INT64_MAX;
    for (int r = 0; r < c->dp_n; r++)
        if (c->dp_until[r] > 0 && c->dp_until[r] < due)
            due = c->dp_until[r];
    return due;
}

void coord_peer_tick(coord *c)
{
    if (c->dp_n == 0)
        return;
    for (int r = 0; r < c->dp_n; r++)
        if (c->dp_until[r] > 0 && c->now_ms >= c->dp_until[r]) {
            c->dp_until[r] = 0;
            log_info("worker %s: its data-plane quarantine is over; it may own experts again",
                     c->spec->workers[r].name);
            coord_replan(c, plan_rejoin(c->pe) == SPEC_REJOIN_RESTORE, false,
                         "worker %s: its data-plane quarantine is over", c->spec->workers[r].name);
        }
    if (c->dp_due == 0 || c->now_ms < c->dp_due)
        return;
    c->dp_due = 0;
    double *blame = malloc((size_t)c->dp_n * sizeof *blame);
    if (blame == NULL)
        return;
    coord_dp_blame(c, blame);
    int x = coord_dp_convict(c, blame);
    if (x >= 0)
        coord_dp_quarantine(c, x, blame);
    free(blame);
}
