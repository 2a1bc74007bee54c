/*
 * client_state.h — libepmoe's insides (prefix cl_), shared by the API (client.c), the I/O thread
 * (io.c), the coordinator's answer (info.c) and what all of them use (base.c: errors, the clock,
 * the request lists). Nothing here is exported (docs/client.md).
 *
 * Ownership: one mutex (mu) guards every request slot, both lists and the info; the I/O thread
 * is the only user of the ZeroMQ sockets. A request moves
 *
 *   FREE --submit--> QUEUED --sent--> FLIGHT --answer/deadline--> RELEASING --> DONE --> TAKEN
 *                      |                 |                          (the library's   (wait,
 *                      +--cancel-->  CANCELED <--cancel--------------+ zero-copy sends  poll)
 *                                                                    of its input are over)
 *   any finished state --epmoe_request_free--> FREE
 *
 * Inputs go out zero-copy from the caller's buffers; zc_refs counts the frames libzmq still
 * holds. A request is reported (DONE) or its cancel returns only when zc_refs is 0, so the
 * caller may reuse its buffers the moment it has the request back; a send stuck in a pipe
 * for CL_RELEASE_MS makes the I/O thread close that entry's socket (libzmq then drops it).
 */
#ifndef EPMOE_CLIENT_STATE_H
#define EPMOE_CLIENT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "client/epmoe.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/limits.h"
#include "epmoe.pb-c.h"

#define CL_DEFAULT_IN_FLIGHT  64
#define CL_MAX_IN_FLIGHT      4096
#define CL_DEFAULT_TIMEOUT_MS 30000
#define CL_DEFAULT_CONNECT_MS 5000
/* CLIENT_INFO is asked again only when news calls for it (docs/client.md "Epochs"): an
 * answer served in another epoch, a request resent or refused as not ready, an entry holding
 * a request silent for CL_REFRESH_WAIT_MS, a submit after CL_REFRESH_IDLE_MS without one, and
 * every CL_REFRESH_WAIT_MS while no member can take a request; never more often than that. */
#define CL_REFRESH_IDLE_MS 2000
#define CL_REFRESH_WAIT_MS 500
/* An entry's credit for this client until its first answer tells it (protocol.md). */
#define CL_CREDIT 64
/* An entry that refused for load (ERR_BUSY: it is full with other clients' requests) gets
 * nothing more for this long, doubling up to the max while it keeps refusing. */
#define CL_BUSY_BACKOFF_MS     2
#define CL_BUSY_BACKOFF_MAX_MS 64
/* A queue that cannot go anywhere is looked at again this often. */
#define CL_QUEUE_RETRY_MS 10
/* The I/O thread's longest sleep when nothing is due (it is woken for everything else). */
#define CL_IDLE_POLL_MS 1000
/* cl_pick_entry: members can take requests, but none has room now */
#define CL_PICK_WAIT (-2)
/* A finished request whose input libzmq still holds after this long has its sockets reset. */
#define CL_RELEASE_MS 100
/* Entries a request names in its timeout message at most. */
#define CL_MAX_TRIED 4
/* The largest Result body the client accepts (a message of a few hundred bytes, and times). */
#define CL_MAX_RESULT_BODY 8192
/* An entry between two sessions (a restarted coordinator welcomes it again, a reload
 * re-welcomes it) refuses with ERR_NOT_READY for about a heartbeat: the request goes to the
 * next member this much later, for at most CL_NOT_READY_TRIES refusals (5 s), then fails. */
#define CL_NOT_READY_RETRY_MS 50
#define CL_NOT_READY_TRIES    100
#define CL_MSG_MAX            256

typedef enum cl_state {
    CL_FREE = 0,
    CL_QUEUED,    /* submitted; the I/O thread has not sent it yet (in c->queue) */
    CL_FLIGHT,    /* sent; waiting for an answer */
    CL_RELEASING, /* finished; waiting for libzmq to let go of its input */
    CL_DONE,      /* finished and reported (in c->done, epmoe_fd readable) */
    CL_TAKEN,     /* returned by epmoe_wait or epmoe_poll */
    CL_CANCELED,  /* finished by epmoe_cancel */
    CL_ORPHAN     /* given up by epmoe_request_free_nowait: freed once libzmq let go of it */
} cl_state;

typedef struct cl_member {
    char name[EPMOE_NAME_MAX];
    uint32_t rank;
    char endpoint[256]; /* "" until the worker reported one */
    bool ready;         /* a member of the latest epoch, state ready, with an endpoint */
    bool dead;          /* WORKER_DEAD */
    char state[16];     /* the coordinator's word for it (for messages: decisions use the code) */
    bool member;
    bool has_key;
    uint8_t key[AUTH_KEY_BYTES];
} cl_member;

/* Flow control, per member index (docs/client.md "Flow control"). */
typedef struct cl_flow {
    uint32_t credit;       /* requests this client may hold there (its answers say) */
    uint32_t held;         /* requests sent there and not answered */
    int64_t busy_until_ns; /* it refused for load: nothing more before this */
    uint32_t backoff_ms;   /* the next refusal's pause */
    int64_t heard_ns;      /* its last answer to this client */
} cl_flow;

/* What CLIENT_INFO said, as the client keeps it. */
typedef struct cl_info {
    epmoe_info shape; /* n_members unused here */
    char cluster[64];
    char state[32];    /* the coordinator's word for it (for messages) */
    int cluster_state; /* Epmoe__ClusterState: what the library decides by */
    bool blocked;      /* CLUSTER_BLOCKED: no placement serves */
    char problem[256]; /* why the cluster is blocked ("" otherwise) */
    uint32_t n_members;
    cl_member *members; /* [n_members] */
} cl_info;

struct epmoe_request {
    epmoe_client *c;
    cl_state state;
    struct epmoe_request *prev, *next; /* in c->queue or c->done */
    /* the call */
    uint32_t layer, n_tokens;
    const uint16_t *hidden;
    const int64_t *token_ids;
    uint16_t *out;
    int32_t *topk_ids;
    float *topk_weights;
    void *user;
    uint64_t seq;
    uint32_t timeout_ms;
    int64_t submit_ns, deadline_ns, resend_ns, finished_ns, sent_ns;
    int entry;               /* member index it was last sent to (-1: none yet) */
    int held_at;             /* member whose credit it holds (-1: none) */
    int avoid;               /* member not to send it to again, unless the only one (-1) */
    bool waited;             /* it waits for room (no entry has credit left, or refused for load) */
    bool refused;            /* an entry refused it for load: EBUSY at the deadline */
    int tried[CL_MAX_TRIED]; /* member indexes it was sent to, in order */
    int n_tried, n_sends;
    int n_not_ready; /* ERR_NOT_READY refusals taken (CL_NOT_READY_TRIES) */
    uint64_t sent_mask[(EP_MAX_WORKERS + 63) / 64]; /* members whose sockets hold a send */
    atomic_int zc_refs;                             /* input frames libzmq still holds */
    atomic_int releasing; /* the free callback should wake the I/O thread */
    bool wait_release;    /* a cancel is waiting for zc_refs to reach 0 */
    /* the answer */
    int status, remote_code;
    char message[CL_MSG_MAX];
    uint64_t epoch;
    uint32_t entry_rank;
    char entry_name[EPMOE_NAME_MAX];
    bool replayed, resent;
    double queued_s, dispatch_s, experts_s, combine_s;
};

struct epmoe_client {
    /* options, resolved */
    char coordinator[256];
    char entry_pref[256];
    uint32_t max_in_flight, timeout_ms, connect_ms, resend_ms;
    bool secure;
    auth_keypair kp;
    uint8_t server_key[AUTH_KEY_BYTES];
    uint64_t id; /* Submit.client: random per client */
    /* shared state (mu) */
    pthread_mutex_t mu;
    pthread_cond_t cond;         /* a request finished, or a release came */
    struct epmoe_request *slots; /* [max_in_flight] */
    struct epmoe_request *queue_head, *queue_tail;
    struct epmoe_request *done_head, *done_tail;
    int n_free;
    struct epmoe_request **free_list; /* [max_in_flight] */
    int n_busy;                       /* slots not free */
    uint64_t next_seq;
    cl_info info; /* its model is the one of epmoe_open, for the client's life */
    /* the cluster serves another model (config hash) than the one of open: every request
     * fails with EPMOE_ESTALE (docs/client.md "A model change") */
    bool stale;
    char stale_why[160];
    bool stopping;
    uint32_t rotor;      /* the next member an unpinned request goes to */
    cl_flow *flow;       /* [cap_entries] */
    bool info_stale;     /* news says CLIENT_INFO changed: ask (at most every WAIT_MS) */
    bool info_urgent;    /* ask at once (news not asked about yet) */
    uint64_t told_epoch; /* the last serving epoch an answer told that info did not know */
    int64_t last_submit_ns;
    /* descriptors */
    int done_fd; /* epmoe_fd: readable while c->done is not empty */
    int wake_fd; /* wakes the I/O thread */
    /* the I/O thread's own (io.c) */
    void *zctx;
    void *admin;  /* DEALER to the coordinator */
    void **entry; /* [cap_entries] DEALER per member index, NULL until used */
    char (*entry_ep)[256];
    uint32_t cap_entries;
    uint64_t info_id; /* the CLIENT_INFO asked and not answered (0: none) */
    uint64_t info_id_seq;
    int64_t info_sent_ns;
    pthread_t thread;
    bool thread_started;
    _Alignas(16)
        uint8_t arena[4 * CL_MAX_RESULT_BODY]; /* Result bodies unpack here: no malloc per answer */
    size_t arena_used;
};

/* Fill err (may be NULL) and return code. */
int cl_fail(epmoe_error *err, int code, int remote, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An ErrorCode of the cluster as an epmoe_status (docs/client.md "Errors"). */
int cl_map_remote(int remote_code);

/* info.c: an AdminReply to CLIENT_INFO as a cl_info (members allocated; free with
 * cl_info_free). 0, or an epmoe_status with err. */
int cl_info_from_reply(const Epmoe__AdminReply *r, cl_info *out, epmoe_error *err);
void cl_info_free(cl_info *info);
/* The member to send a request to: a ready one with room below its credit (the preferred one,
 * else the one holding least of this client's requests, ties by rotation from c->rotor), never
 * `avoid` unless it is the only one; else one that will be ready. CL_PICK_WAIT when members
 * are there but none has room; -1 when none is. Under mu. */
int cl_pick_entry(epmoe_client *c, int avoid, int64_t now);
/* Whether any member can take a request now. Under mu. */
bool cl_has_entry(const epmoe_client *c);
/* Some member is ready (cl_has_entry: some member is ready or will be: it has a client
 * endpoint and is not dead); member i is such a member. */
bool cl_has_ready_entry(const epmoe_client *c);
bool cl_entry_reachable(const epmoe_client *c, int i);
/* options.entry names a member (or is an endpoint): 0, or EPMOE_EINVAL naming the members. */
int cl_check_entry(const epmoe_client *c, epmoe_error *err);
/* "a0 (no client endpoint), b0 (loading)": why no member can take a request. */
void cl_not_ready_text(const cl_info *info, bool secure, char *buf, size_t cap);

/* io.c */
int cl_io_open(epmoe_client *c, epmoe_error *err); /* connect, first CLIENT_INFO, thread */
/* One message from member i's entry socket: a RESULT answers its request in flight (by client
 * id and seq), anything else is ignored. I/O thread, under mu (fuzz_result feeds it). */
struct wire_msg;
void cl_on_entry_msg(epmoe_client *c, int i, const struct wire_msg *m);
void cl_io_close(epmoe_client *c);
void cl_io_wake(epmoe_client *c);
/* Under mu: the request is finished (status set): report it once libzmq let go of its input. */
void cl_finish(epmoe_client *c, struct epmoe_request *r);
/* Under mu: the cluster no longer serves the model of open (why: what changed); fails every
 * request queued or in flight with EPMOE_ESTALE. Once; later calls do nothing. */
void cl_go_stale(epmoe_client *c, const char *why);
/* Under mu: r's slot back to the pool. */
void cl_slot_free(epmoe_client *c, struct epmoe_request *r);
/* Under mu: r no longer counts against its entry's credit. */
void cl_flow_release(epmoe_client *c, struct epmoe_request *r);
void cl_list_remove(struct epmoe_request **head, struct epmoe_request **tail,
                    struct epmoe_request *r);
void cl_list_push(struct epmoe_request **head, struct epmoe_request **tail,
                  struct epmoe_request *r);

#endif
