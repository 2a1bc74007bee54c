/*
 * serve_internal.h — what the two halves of the serving path share (serve.h): a request and its
 * parts, a job of the serving queue, the server. Only worker/serve*.c include it.
 *
 *   serve.c          the server and the origin half: SUBMIT, plan, DISPATCH, COMBINE, RESULT
 *   serve_experts.c  the serving half: the queue of DISPATCHes, one mb_experts call a layer
 */
#ifndef EPMOE_SERVE_INTERNAL_H
#define EPMOE_SERVE_INTERNAL_H

#include <stdlib.h>
#include <time.h>

#include "common/wire.h"
#include "worker/serve.h"

#define SRV_MAX_BODY 1024

typedef struct srv_part {
    int peer;
    uint32_t attempt;
    int n;          /* pairs */
    uint32_t *slot; /* [n] ascending */
    bool live, sent, done, refused;
    bool credit; /* sent to a peer, its COMBINE not back: holds one of the peer's credits */
} srv_part;

typedef enum srv_phase {
    SRV_FREE = 0,
    SRV_WAITING = 1, /* accepted, not routed yet (no epoch to serve, or restarting) */
    SRV_RUNNING = 2,
} srv_phase;

typedef struct srv_req {
    srv_phase phase;
    uint64_t id;
    uint8_t ident[WIRE_MAX_IDENT];
    size_t ident_len;
    uint64_t client, seq;
    int layer, T, k, H;
    uint16_t *x;
    int64_t *ids;
    int32_t *topk_ids;
    float *topk_w;
    uint8_t *q;
    float *qs;
    uint16_t *xn;
    uint16_t *eo; /* [T, k, H] */
    mb_step *ms;
    srv_part *part;
    int n_parts, cap_parts;
    uint32_t attempt;
    bool replayed, started_once;
    bool shared; /* the shared expert ran (or, on a device, was started) for this attempt */
    double t_arrive, t_routed, t_sent, t_experts, deadline, retry_at, backoff;
    double t_own, t_shared, t_back; /* own pairs done, shared expert done, last COMBINE in */
    uint64_t epoch;
} srv_req;

/* A DISPATCH to serve (a peer's, or this worker's own part of a request). */
typedef struct srv_job {
    int src; /* the origin rank */
    int layer;
    uint64_t request;
    uint32_t attempt;
    tp_msg msg; /* a peer's DISPATCH (released after) */
    srv_req *own;
    int part; /* own: the part it computes */
} srv_job;

typedef struct srv_load {
    uint32_t requests, tokens;
    uint32_t *expert; /* [E] */
    uint32_t *rank;   /* [P] */
} srv_load;

struct srv_server {
    struct wmx *mx; /* the worker's metrics, as the executor last lent them */
    void *sock;
    char endpoint[EP_MAX_PATH];
    srv_req req[SRV_MAX_REQUESTS];
    uint64_t next_id;
    srv_job *job;
    int n_jobs, cap_jobs;
    int *out_credit; /* [P] live sent parts without their COMBINE, per rank */
    int P, E, L;
    srv_load *load; /* [L] */
    srv_stats stats;
};

static inline double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void *srv_alloc(size_t n)
{
    return aligned_alloc(64, n ? (n + 63) / 64 * 64 : 64);
}

/* serve_experts.c */
int srv_push_job(srv_server *s, srv_job j);
/* A peer's DISPATCH into the queue (d's storage taken). */
void srv_on_dispatch(srv_server *s, tp_msg *d);
/* Every queued job, one mb_experts call per layer; outputs to their requests and origins. */
void srv_serve(srv_server *s, const srv_env *env);

#endif
