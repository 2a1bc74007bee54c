/*
 * serve_state.h — the state both halves of the serving path work on (serve.h, serve_experts.h):
 * a request and its parts, a job of the serving queue, the server, and what the executor lends
 * them at each call. Only worker/serve*.c and the executor's srv_env include it.
 *
 *   serve.c          the server and the origin half: SUBMIT, plan, DISPATCH, COMBINE, RESULT
 *   serve_experts.c  the serving half: the queue of DISPATCHes, one mb_experts call a layer
 */
#ifndef EPMOE_SERVE_STATE_H
#define EPMOE_SERVE_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/wire.h"
#include "kernels/moe_backend.h"
#include "worker/exec_session.h"
#include "worker/transport_zmq.h"

/* Requests one entry worker holds in flight at most, and one client (client id) of them;
 * beyond, a SUBMIT is answered ERR_BUSY at once. Every Result tells the client its credit
 * (SRV_MAX_CLIENT_REQUESTS), which libepmoe keeps to: it queues the rest. */
#define SRV_MAX_REQUESTS        256
#define SRV_MAX_CLIENT_REQUESTS 64
/* A refused part is dispatched again after this many ms, doubling up to SRV_RETRY_MAX_MS. */
#define SRV_RETRY_MS     2
#define SRV_RETRY_MAX_MS 100
/* Lines a second the serving path logs about what clients and peers send (the rest are
 * counted): a flood of malformed frames or a client that stopped reading costs no more. */
#define SRV_LOG_PER_SEC 10
/* The client endpoint pings every connection this often (ZMQ_HEARTBEAT_IVL) and drops one
 * that completes no frame for SRV_STALL_MS plus the time its largest frame takes at
 * SRV_MIN_RATE bytes a second (ZMQ_HEARTBEAT_TIMEOUT: libzmq resets it only when a whole frame
 * arrives, so a connection that announces a big frame and stalls, or trickles it, is closed
 * and what it made libzmq buffer is freed; an honest client answers every ping). */
#define SRV_HEARTBEAT_MS 1000
#define SRV_STALL_MS     10000
#define SRV_MIN_RATE     (16 << 20)
/* A peer that answered none of this origin's DISPATCHes for the progress timeout (the
 * session's liveness window) is suspect: routed around where a replica exists, reported to the
 * coordinator, whose verdict (a new epoch without it) the requests that need it wait for for
 * another progress timeout before failing. A suspicion lapses after this many progress
 * timeouts (the peer is tried again), at a COMBINE from the peer, or at an epoch change. */
#define SRV_SUSPECT_LAPSE 5

/* A connection whose key a reload revoked is closed this long after its refusal went out.
 * libzmq has no call to drop one peer of a ROUTER: the worker shuts down the connection's
 * descriptor (ZMQ_SRCFD) and libzmq drops it, after checking that the descriptor still has the
 * peer address it had at the refusal, so a descriptor reused since is never touched. */
#define SRV_REVOKE_CLOSE_MS 200
#define SRV_MAX_REVOKED     16
typedef struct srv_revoked {
    int fd;
    int64_t at_ms; /* clk_mono_ms when it is closed */
    socklen_t len;
    struct sockaddr_storage peer;
} srv_revoked;

typedef struct srv_server srv_server;
struct wmx;

/* What the executor lends the server at each call. ready: the layers and the data plane serve
 * the session's epoch. */
typedef struct srv_env {
    mb_backend *be;
    mb_layer *const *layers;
    int n_layers;
    const exec_session *session;
    tpz_transport *tp;
    struct wmx *mx;
    bool ready;
} srv_env;

/* Counters for tests and metrics. */
typedef struct srv_stats {
    uint64_t submitted, completed, failed, busy, replays, batches, batched_jobs;
    uint64_t malformed; /* client messages that were no epmoe message (answered Error) */
    uint64_t shared_batches, shared_requests; /* shared-expert calls and the requests in them */
    uint64_t pairs, expert_reads; /* routed pairs served; experts each batch read (distinct) */
    uint64_t suspicions;          /* peers found silent past the progress timeout */
} srv_stats;
#define SRV_MAX_BODY 1024

typedef struct srv_part {
    int peer;
    uint32_t attempt;
    int n;          /* pairs */
    uint32_t *slot; /* [n] ascending */
    bool live, sent, done, refused;
    int64_t sent_ms; /* clk_mono_ms when sent to a peer: its progress timeout runs from here */
    bool credit;     /* sent to a peer, its COMBINE not back: holds one of the peer's credits */
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
    double t_arrive, t_routed, t_sent, t_experts; /* the timeline, clk_mono_s */
    int64_t deadline, retry_at, backoff;          /* clk_mono_ms; retry_at 0: none */
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

/* Latencies counted in mx_seconds_buckets, for a LOAD_REPORT. */
typedef struct srv_hist {
    uint32_t n[MX_MAX_BUCKETS + 1];
    double sum;
} srv_hist;

/* Codes a request's failure is counted under in a LOAD_REPORT (0 .. SRV_N_CODES - 1). */
#define SRV_N_CODES 32

/* One layer's serving since the last LOAD_REPORT. */
typedef struct srv_load {
    uint32_t requests, tokens;
    uint32_t *expert; /* [E] */
    uint32_t *rank;   /* [P] */
    uint32_t answered, failed[SRV_N_CODES];
    srv_hist total, dispatch, experts, combine;       /* the answered requests' timings */
    uint64_t dispatch_bytes, combine_bytes, messages; /* data-plane messages sent */
} srv_load;

struct srv_server {
    struct wmx *mx;         /* the worker's metrics, as the executor last lent them */
    uint64_t serving_epoch; /* the epoch env said it serves (0: none), told in every Result */
    void *sock;
    bool secure; /* CURVE: every SUBMIT's key must still be on the allow-list (auth_admits) */
    char endpoint[EP_MAX_PATH];
    srv_req req[SRV_MAX_REQUESTS];
    uint64_t next_id;
    srv_job *job;
    int n_jobs, cap_jobs;
    int *out_credit; /* [P] live sent parts without their COMBINE, per rank */
    /* [P] per peer, clk_mono_ms: its last COMBINE to this origin, since when it is suspect
     * (0: not), and whether the coordinator is still to hear of it */
    int64_t *heard_ms, *suspect_ms;
    uint8_t *report_due, *route_ok; /* route_ok: a member and not suspect (srv_plan's scratch) */
    int P, E, L;
    srv_load *load; /* [L] */
    /* the model's main and hash-routed layers (the rest of L are MTP): the requests' kinds */
    int n_main, n_hash;
    srv_stats stats;
    int64_t max_frame; /* the socket's MAXMSGSIZE: the largest frame of a legal SUBMIT */
    log_rate log;      /* lines clients and peers cause: SRV_LOG_PER_SEC a second */
    srv_revoked revoked[SRV_MAX_REVOKED]; /* connections of revoked keys, to close */
    int n_revoked;
};

static inline void *srv_alloc(size_t n)
{
    return aligned_alloc(64, n ? (n + 63) / 64 * 64 : 64);
}

#endif
