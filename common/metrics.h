/*
 * metrics.h — Prometheus metrics: a registry of counters, gauges and histograms, rendered in the
 * text exposition format 0.0.4, and an HTTP endpoint serving it at /metrics (prefix mx_).
 *
 * The daemon's own thread updates values; the HTTP server (libmicrohttpd, Debian's
 * libmicrohttpd-dev: a maintained server library, not a hand-written one) renders them from its
 * own thread. One mutex guards the registry: updates are a few instructions under it, and a
 * scrape never waits for the daemon's event loop (an EPLB plan in progress does not delay it),
 * nor does the loop ever wait on HTTP.
 *
 * Naming (prometheus.io/docs/practices/naming): the callers use the epmoe_ prefix, base units
 * (seconds, bytes), _total for counters. A family has fixed label names; a series is one set of
 * label values, created on first use and kept (mx_clear drops a family's series, for label sets
 * that go away, such as the workers of a reloaded spec). Series pointers stay valid until their
 * family is cleared or the registry destroyed, so hot paths cache them.
 *
 * Errors: creating a family or series can fail only for a bad name, too many labels or out of
 * memory (NULL); updates on a NULL series are no-ops, so a daemon keeps serving without metrics
 * rather than failing.
 */
#ifndef EPMOE_METRICS_H
#define EPMOE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef enum mx_type { MX_COUNTER = 0, MX_GAUGE = 1, MX_HISTOGRAM = 2 } mx_type;

#define MX_MAX_LABELS  4
#define MX_MAX_BUCKETS 32

typedef struct mx_registry mx_registry;
typedef struct mx_family mx_family;
typedef struct mx_series mx_series;
typedef struct mx_http mx_http;

mx_registry *mx_create(ep_err *err);
void mx_destroy(mx_registry **self_p);

/* A family: name [a-zA-Z_:][a-zA-Z0-9_:]*, help text, label names as one comma-separated string
 * ("layer,worker"; NULL or "" for none). Histograms take their upper bounds (ascending, +Inf
 * implied). */
mx_family *mx_family_new(mx_registry *r, mx_type type, const char *name, const char *help,
                         const char *labels, const double *buckets, int n_buckets);
/* The same with mx_seconds_buckets for a histogram (latencies): what the daemons use. */
mx_family *mx_family_s(mx_registry *r, mx_type type, const char *name, const char *help,
                       const char *labels);
/* The series for these label values (one per label name); created when new. */
mx_series *mx_series_of(mx_family *f, const char *const *values);
/* Shorthands: a family without labels has one series. */
mx_series *mx_series0(mx_family *f);
mx_series *mx_series1(mx_family *f, const char *v0);
mx_series *mx_series2(mx_family *f, const char *v0, const char *v1);

void mx_set(mx_series *s, double v);     /* gauges */
void mx_add(mx_series *s, double v);     /* counters (v >= 0) and gauges */
void mx_observe(mx_series *s, double v); /* histograms */
double mx_value(const mx_series *s);     /* tests */
/* Drop every series of a family (its HELP and TYPE stay). */
void mx_clear(mx_family *f);
/* Histograms: merge observations counted elsewhere in this family's buckets (another process's
 * report): counts[n], one per bound then +Inf, not cumulative, and their sum. -1 (nothing
 * merged) when n is not the family's bounds + 1. */
int mx_observe_many(mx_series *s, const uint32_t *counts, int n, double sum);

/* The exposition text (malloc'ed, NUL-terminated; *len without the NUL), or NULL. */
char *mx_render(mx_registry *r, size_t *len);

/* Serve GET /metrics on addr "HOST:PORT" (HOST an IPv4 address or a name; PORT 0 picks one).
 * Errors name the address and the reason (bad host, port in use). */
mx_http *mx_http_start(mx_registry *r, const char *addr, ep_err *err);
int mx_http_port(const mx_http *h); /* the port bound */
void mx_http_stop(mx_http **self_p);

/* Default latency buckets, seconds: 100 us .. 60 s. */
extern const double mx_seconds_buckets[];
extern const int mx_n_seconds_buckets;
/* The bucket of mx_seconds_buckets a latency v falls in (mx_n_seconds_buckets: +Inf), for a
 * process that counts observations to report them (mx_observe_many merges them). */
int mx_seconds_bucket(double v);

#endif
