/*
 * transport.h — the data plane of one epoch: DISPATCH and COMBINE between workers (prefix tp_).
 *
 * Two planes share one payload layout and one validation (transport.c): the ZeroMQ plane
 * (transport_zmq.c, messages between host buffers, below) and the collective plane
 * (transport_comm.c over NCCL's transport_nccl.c or a test's fake: grouped sends and receives
 * between device buffers, "collective plane" further down).
 *
 * ZeroMQ plane contract (docs/protocol.md, proto/epmoe.proto): every worker binds one PULL at its
 * data endpoint and connects one PUSH per peer rank (never to itself), so a message to rank r goes
 * only to r. Every message is wire.h-framed; payloads travel zero-copy from one block the
 * sender filled in place (tp_msg_alloc) and arrive as views into the received frames.
 *
 * The owner thread (the executor) polls tp_socket() beside its other sockets and calls tp_pump
 * when it is readable. tp_pump validates each message completely before keeping it:
 *   session == ours and epoch == ours; with security, the ZAP user id of the sender (its key's
 *   name) is the name of the rank it claims; src_rank < world_size and != ours; step_id present;
 *   the payload count of the kind and format; n_rows <= EP_MAX_TOKENS and n_pairs <= n_rows x
 *   MC_MAX_TOPK before any product; payload sizes (fp8 codes n_rows*H, scales n_rows*H/128 bytes
 *   when scales_e8m0 else 4x that; bf16 hidden n_rows*H*2; pair arrays n_pairs*4 each; combine
 *   out n_pairs*H*2); pair_row < n_rows; pair_expert < E and owned by this rank (expert_owner,
 *   or owned: held in some layer; the executor checks the step's layer).
 * A message that fails any check is dropped: counted, its reason logged (rate-limited) and kept
 * in tp_last_drop; it never disturbs other messages.
 *
 * Buffer space a peer may hold (never more than it was granted):
 *   - one DISPATCH per peer, of a step not yet finished: a peer is at most one step ahead (the
 *     coordinator starts a step when every worker has answered the last), so a newer DISPATCH
 *     from the same peer replaces an older one (stale messages a restarted worker receives from
 *     its peers' queues give way to the current ones);
 *   - a COMBINE only when granted: tp_grant(step, peer, n_pairs) before the DISPATCH it answers
 *     goes out; a COMBINE that was not granted, or whose n_pairs differs, is dropped on arrival,
 *     and one kept under an earlier grant and never taken gives way to the newer grant's.
 * Messages of finished steps (tp_finish) are dropped. A DISPATCH of any later step is kept
 * (in its peer's one slot), however far ahead: a worker away for thousands of steps (drained,
 * stopped) gets its peers' DISPATCHes of its first step back before its own STEP.
 *
 * Step ids must increase within one transport's life (one placement epoch of one coordinator
 * session): "finished" means step_id <= the highest id passed to tp_finish.
 *
 * Sockets: MAXMSGSIZE is the largest frame this model can legitimately produce
 * (tp_max_frame), RCVHWM is TP_RCVHWM messages per peer connection, so what a connection can
 * make libzmq buffer before tp_pump sees it is bounded; with security the PULL is a CURVE server
 * (ZAP domain AUTH_DOMAIN_DATA) and each PUSH a CURVE client of its peer's key.
 *
 * What the transport does not know is checked by its owner: the layer matches the step's, one
 * DISPATCH per (step, peer).
 *
 * Without security a forged message with the right session and ids cannot be told from the
 * peer's (a PULL names no sender; docs/operations.md "Not protected"): on the STEP path a
 * forged DISPATCH that comes first makes the real one a duplicate (the step fails explicitly);
 * the serving path has no duplicate rule (every DISPATCH within the credits is kept, and the
 * origin takes only the COMBINE with its part's pair count), so a forged empty one is harmless.
 *
 * Arrays in a received tp_msg are aligned for their type (misaligned frames are copied), so the
 * owner can hand them to kernels directly. Not thread-safe: one owner thread.
 */
#ifndef EPMOE_TRANSPORT_H
#define EPMOE_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/wire.h"
#include "epmoe.pb-c.h"

/* Serving-path messages (docs/protocol.md "Serving path") one peer may have kept here at once,
 * per kind: an origin sends a peer at most this many DISPATCHes whose COMBINE is not back (its
 * credits), so an honest peer never meets the bound; more is dropped. */
#define TP_SERVE_CREDITS 16
/* Messages libzmq may queue per peer connection before tp_pump reads them: a step's DISPATCH
 * and COMBINE, and the serving path's credits of both kinds. */
#define TP_RCVHWM (4 + 2 * TP_SERVE_CREDITS)

typedef struct tp_transport tp_transport;

/* Values equal Epmoe__DispatchFormat. */
typedef enum tp_format { TP_FMT_FP8 = 0, TP_FMT_BF16 = 1 } tp_format;
typedef enum tp_kind { TP_DISPATCH = 0, TP_COMBINE = 1 } tp_kind;

typedef struct tp_config {
    int rank;                     /* this worker, < world_size */
    int world_size;               /* 1..EP_MAX_WORKERS */
    uint64_t session;             /* WELCOME.session every message must carry */
    uint64_t epoch;               /* placement epoch every message must carry */
    int hidden;                   /* H, a multiple of 128 */
    int n_experts;                /* E */
    int topk;                     /* k: n_pairs <= n_rows x k */
    const uint32_t *expert_owner; /* [E]: rank owning expert e (copied); unused when owned */
    const uint8_t *owned;         /* [E] or NULL: 1 where this rank holds expert e in some layer
                                   * (per-layer placements and replicas; copied) */
    const char *bind_endpoint;    /* PULL; "tcp://127.0.0.1:*" binds an ephemeral port */
    /* Security (key NULL: none): this worker's key pair, each rank's public key and the name
     * its key speaks for (the ZAP user id its messages must carry). Copied. */
    const auth_keypair *key;
    const uint8_t (*peer_key)[AUTH_KEY_BYTES]; /* [world_size] */
    const char *const *peer_name;              /* [world_size] */
} tp_config;

/* One data-plane message. For sending, the caller sets kind, step_id, layer, n_rows, n_pairs,
 * format and scales_e8m0, calls tp_msg_alloc, fills the arrays and calls tp_send. Received
 * messages carry the same fields with src_rank and epoch as sent. Unused arrays are NULL. */
typedef struct tp_msg {
    tp_kind kind;
    uint64_t step_id;
    uint64_t epoch;
    uint32_t layer; /* dispatch */
    int src_rank;
    int n_rows;            /* dispatch: distinct token rows */
    int n_pairs;           /* dispatch: (row, expert, weight) pairs; combine: output rows */
    tp_format format;      /* dispatch */
    bool scales_e8m0;      /* dispatch fp8: scales are e8m0 bytes, else f32 */
    uint8_t *codes;        /* fp8: e4m3 [n_rows, H] */
    void *scales;          /* fp8: [n_rows, H/128] uint8 e8m0 or float */
    uint16_t *hidden;      /* bf16: [n_rows, H] */
    uint32_t *pair_row;    /* dispatch: [n_pairs], < n_rows */
    uint32_t *pair_expert; /* dispatch: [n_pairs], owned by the receiver */
    float *pair_weight;    /* dispatch: [n_pairs] */
    uint16_t *out;         /* combine: bf16 [n_pairs, H], in the order of the dispatch's pairs */
    /* The serving path (is_request): the origin's request and attempt instead of step_id; any
     * epoch of the session is accepted (the owner checks the experts it holds), and a refused
     * COMBINE (the receiver does not hold an expert named) has no payload and says which epoch
     * the receiver serves. */
    bool is_request;
    uint64_t request;
    uint32_t attempt;
    bool refused;
    uint64_t server_epoch;
    struct tp_buf *buf; /* private: the storage the arrays live in */
} tp_msg;

/* The largest frame a DISPATCH or COMBINE of this model can carry (EP_MAX_TOKENS rows, capped
 * at EP_MAX_DATA_MSG): the PULL's ZMQ_MAXMSGSIZE. */
int64_t tp_max_frame(int hidden, int topk);

/* Create a transport in zctx and bind its PULL (options set before bind: linger 0, MAXMSGSIZE
 * tp_max_frame, RCVHWM TP_RCVHWM, CURVE with security). Errors name the endpoint. */
tp_transport *tp_create(void *zctx, const tp_config *cfg, ep_err *err);
void tp_destroy(tp_transport **self_p);

/* A transport without sockets, and a message handed to it as if tp_pump had read it (wm from
 * malloc, taken): the validation, slots and grants on their own, for tests and fuzz_dataplane.
 * tp_send, tp_socket and tp_pump must not be used on it. */
tp_transport *tp_create_unbound(const tp_config *cfg, ep_err *err);
void tp_deliver(tp_transport *tp, wire_msg *wm);

/* The endpoint actually bound (ephemeral port resolved), for the peers to connect to. */
const char *tp_endpoint(const tp_transport *tp);

/* Connect one PUSH per peer: endpoints[r] for every r != rank (endpoints[rank] is ignored).
 * ZeroMQ connects in the background, so a peer that binds later still gets its messages. */
int tp_connect(tp_transport *tp, const char *const *endpoints, ep_err *err);

/* ---- layout and validation, shared by both planes (transport.c) -------------------------- */

/* Payload arrays of a message at most (fp8 DISPATCH: codes, scales, pair_row, pair_expert,
 * pair_weight), and the alignment of each inside a message's block. */
#define TP_MAX_ARRAYS 5
#define TP_ALIGN      64

/* The block of m's shape (kind, format, scales_e8m0, n_rows, n_pairs): its arrays in wire order
 * at TP_ALIGN-aligned offsets off[i] with len[i] bytes each. Returns the number of arrays and
 * sets *total to the block's size (a multiple of TP_ALIGN). Counts must be within the limits
 * (tp_check_dispatch), so no product overflows. */
int tp_msg_layout(const tp_msg *m, int hidden, size_t *off, size_t *len, size_t *total);
/* Point m's arrays into block (laid out by tp_msg_layout). */
void tp_msg_point(tp_msg *m, int hidden, uint8_t *block);

/* What a receiver checks messages against. */
typedef struct tp_check {
    int rank, world_size, hidden, n_experts;
    uint64_t epoch;
    const uint8_t *owned; /* [n_experts]: 1 where this rank owns the expert */
    bool self_ok;         /* the collective plane: a rank also exchanges with itself */
} tp_check;

/* A DISPATCH body: every field present, epoch ours, src_rank a peer (or ourselves when
 * self_ok), a known format, n_rows <= EP_MAX_TOKENS and n_pairs <= n_rows * MC_MAX_TOPK.
 * Fills m's scalar fields (kind .. scales_e8m0), not its arrays. */
int tp_check_dispatch(const tp_check *c, const Epmoe__Dispatch *d, tp_msg *m, ep_err *err);
/* A COMBINE body: every field present, epoch ours, src_rank a peer, n_pairs within the limit. */
int tp_check_combine(const tp_check *c, const Epmoe__Combine *b, tp_msg *m, ep_err *err);
/* A DISPATCH's pairs (arrays on the host): pair_row < n_rows, pair_expert owned by c->rank. */
int tp_check_pairs(const tp_check *c, int n_rows, int n_pairs, const uint32_t *pair_row,
                   const uint32_t *pair_expert, ep_err *err);

/* ---- the ZeroMQ plane ------------------------------------------------------------------- */

/* Allocate the payload arrays of an outgoing message in one aligned block. */
int tp_msg_alloc(tp_msg *m, int hidden, ep_err *err);
/* Bytes of payload m carries (what dispatch_bytes/combine_bytes count). */
size_t tp_msg_bytes(const tp_msg *m, int hidden);
/* Free m's storage (a received message, or an allocated one never sent); m's arrays are
 * cleared. Tolerates a zeroed m. */
void tp_msg_release(tp_msg *m);

/* Allow rank peer one COMBINE of n_pairs rows for step_id (call before the DISPATCH it answers
 * goes out). A later grant to the same peer replaces this one. */
void tp_grant(tp_transport *tp, uint64_t step_id, int peer, int n_pairs);

/* Send m to rank dst (!= own rank) without blocking; session, epoch and src_rank are filled
 * in. The block
 * goes to ZeroMQ, which frees it once sent, and m's arrays are cleared whether or not the send
 * succeeded. Fails (naming the peer) when dst's queue is full. */
int tp_send(tp_transport *tp, int dst, tp_msg *m, ep_err *err);

/* The PULL socket, to poll for ZMQ_POLLIN; only tp_pump may read it. */
void *tp_socket(tp_transport *tp);

/* Read every message waiting on the PULL without blocking, validate it and keep it or drop it.
 * Returns the number kept. */
int tp_pump(tp_transport *tp);

/* Move a kept message of step_id into *out (the caller releases it). Returns 1, or 0 when
 * none is kept. */
int tp_take(tp_transport *tp, uint64_t step_id, tp_msg *out);
/* The oldest kept serving-path message (DISPATCH or COMBINE, any request) into *out: 1, or 0
 * when none is kept. Serving-path messages survive tp_finish and tp_set_placement*: a request
 * outlives steps and epochs (its owner matches COMBINEs with what it sent). */
int tp_take_request(tp_transport *tp, tp_msg *out);

/* Step step_id is finished or abandoned: drop what is kept and granted for it and every earlier
 * step, and drop later arrivals for them. Also called with step - 1 when a step starts: what
 * is older than the step the coordinator runs now is stale. */
void tp_finish(tp_transport *tp, uint64_t step_id);

/* A new placement epoch on the same sockets (placement epochs, docs/protocol.md): messages must
 * carry `epoch` from now on and name experts of `expert_owner` ([E]) owned by this rank;
 * everything kept for the old epoch is dropped. epoch must be above the current one (so no
 * message of an earlier epoch can pass); the sockets and their connections stay, so no message
 * of the new epoch is lost to a reconnect. -1 with err when epoch does not increase. */
int tp_set_placement(tp_transport *tp, uint64_t epoch, const uint32_t *expert_owner, ep_err *err);
/* The same with the experts this rank holds in some layer (owned [E], copied): per-layer
 * placements and replicas (issue 9), and a committed staged epoch. */
int tp_set_placement_owned(tp_transport *tp, uint64_t epoch, const uint8_t *owned, ep_err *err);
uint64_t tp_epoch(const tp_transport *tp);
uint64_t tp_session(const tp_transport *tp);

/* Counters and the reason of the last dropped message ("" if none). */
uint64_t tp_dropped(const tp_transport *tp);
const char *tp_last_drop(const tp_transport *tp);
int tp_pending(const tp_transport *tp);

/* ---- the collective plane (transport_comm.c; NCCL in transport_nccl.c) -------------------
 *
 * A communicator of P ranks, one per GPU worker, moving device buffers with grouped sends and
 * receives on the executor's stream. The library under it is a vtable (tp_comm_ops): NCCL's
 * (tp_nccl_ops) in the worker, a fake of threads exchanging host memory in the unit tests, so
 * the state machine and every deadline run on the CPU.
 *
 * States: NONE -> INIT (tp_comm_begin_init / tp_comm_begin_shrink, non-blocking) -> READY
 * (tp_comm_wait_ready) -> ABORTED (any failure: an asynchronous error, a deadline passed, the
 * owner interrupted a wait) -> INIT again (rebuilt: a new communicator, or a shrink of a READY
 * one). Every wait has a deadline (CLOCK_MONOTONIC seconds); a wait that fails aborts the
 * library communicator (ncclCommAbort), so nothing stays queued on the stream, and the error
 * names the epoch, generation, rank and what was waited for. Only READY exchanges. One owner
 * thread.
 */

/* Bytes of a communicator id (NCCL_UNIQUE_ID_BYTES; checked in transport_nccl.c). */
#define TP_COMM_ID_BYTES 128

typedef struct tp_comm_id {
    uint8_t bytes[TP_COMM_ID_BYTES];
} tp_comm_id;

typedef struct tp_comm_handle tp_comm_handle; /* the library's communicator (ncclComm_t) */

/* One transfer of a grouped exchange: bytes of device memory at ptr, to or from peer. */
typedef struct tp_xfer {
    int peer;
    void *ptr;
    size_t bytes;
} tp_xfer;

/* A communicator library. Nothing here blocks; the state machine polls. 0 / -1 with err. */
typedef struct tp_comm_ops {
    const char *name; /* "nccl" */
    int (*unique_id)(void *ctx, tp_comm_id *id, ep_err *err);
    /* Start creating the communicator of rank among nranks sharing id (ncclCommInitRankConfig
     * with blocking = 0). */
    int (*init)(void *ctx, int nranks, const tp_comm_id *id, int rank, tp_comm_handle **out,
                ep_err *err);
    /* Start a communicator of parent's ranks but the excluded ones (ncclCommShrink). */
    int (*shrink)(void *ctx, tp_comm_handle *h, const int *exclude, int n_exclude,
                  tp_comm_handle **out, ep_err *err);
    /* 0 idle, 1 still working (init, or a group being enqueued), -1 broken (err: why). */
    int (*status)(tp_comm_handle *h, ep_err *err);
    /* One group of sends and receives, enqueued on stream (sizes match the peers' by contract;
     * transfers of 0 bytes are left out by the caller on both sides). */
    int (*exchange)(tp_comm_handle *h, const tp_xfer *sends, int n_sends, const tp_xfer *recvs,
                    int n_recvs, void *stream, ep_err *err);
    /* 0 when everything enqueued on stream has finished, 1 while pending, -1 on an error. */
    int (*stream_query)(void *ctx, void *stream, ep_err *err);
    /* Stop everything h has in flight and free it (ncclCommAbort); h is invalid afterwards. */
    void (*abort)(tp_comm_handle *h);
} tp_comm_ops;

/* Called between polls of a wait; returns non-zero (err set) to give up (the owner was told to
 * abandon the step or drop the session): the wait then aborts the communicator. */
typedef int (*tp_idle_fn)(void *ctx, ep_err *err);

typedef enum tp_comm_state {
    TP_COMM_NONE = 0,
    TP_COMM_INIT = 1,
    TP_COMM_READY = 2,
    TP_COMM_ABORTED = 3
} tp_comm_state;

/* What ended the last failed wait (for the step's error code). */
typedef enum tp_comm_fault {
    TP_FAULT_NONE = 0,
    TP_FAULT_LIBRARY = 1,  /* the library or the device reported an error */
    TP_FAULT_DEADLINE = 2, /* the deadline passed */
    TP_FAULT_ABANDONED = 3 /* the owner's idle function gave up, or the owner aborted */
} tp_comm_fault;

typedef struct tp_comm tp_comm;

/* NCCL's operations, or NULL in a build without NCCL or where libnccl cannot be loaded (it is
 * opened at the first call). Their ctx is a pointer to the worker's CUDA ordinal (int), made
 * the thread's current device before a communicator is created, or NULL to use the current
 * device. */
const tp_comm_ops *tp_nccl_ops(void);
/* Why tp_nccl_ops() is NULL (the library and dlerror, or "this build has no NCCL"); NULL when
 * it is not. */
const char *tp_nccl_why(void);

tp_comm *tp_comm_create(const tp_comm_ops *ops, void *ctx, ep_err *err);
/* Aborts a live communicator. */
void tp_comm_destroy(tp_comm **self_p);

/* A new id for rank 0 of a new communicator to hand to the others. */
int tp_comm_new_id(tp_comm *c, tp_comm_id *id, ep_err *err);
/* Begin the communicator (epoch, generation) of rank among size ranks sharing id; a
 * communicator still held is aborted first. */
int tp_comm_begin_init(tp_comm *c, uint64_t epoch, uint32_t generation, int rank, int size,
                       const tp_comm_id *id, ep_err *err);
/* Begin (epoch, generation) as the READY communicator (parent_epoch, parent_generation) less
 * the ranks exclude[0..n) (ascending, of the parent). Checked first: that communicator is the
 * one held and READY, exclude is valid and leaves this rank in, and rank/size are what the
 * survivors' order gives (old rank less the excluded ranks below it). */
int tp_comm_begin_shrink(tp_comm *c, uint64_t epoch, uint32_t generation, uint64_t parent_epoch,
                         uint32_t parent_generation, const uint32_t *exclude, int n_exclude,
                         int rank, int size, ep_err *err);
/* Wait for the communicator begun to become READY: 0, or -1 with the communicator ABORTED and
 * err naming it ("... not ready after N ms", the library's error, or the owner's reason). */
int tp_comm_wait_ready(tp_comm *c, double deadline, tp_idle_fn idle, void *idle_ctx, ep_err *err);
/* One grouped exchange on stream, waited for until everything enqueued on stream is done
 * (what = "dispatch counts", "dispatch", "combine" names it in errors). A communicator that is
 * not READY fails at once; a failed or late exchange aborts it. */
int tp_comm_exchange(tp_comm *c, const char *what, const tp_xfer *sends, int n_sends,
                     const tp_xfer *recvs, int n_recvs, void *stream, double deadline,
                     tp_idle_fn idle, void *idle_ctx, ep_err *err);
/* Abort now (the owner's own failure mid-step: nothing of the step may stay queued). */
void tp_comm_abort(tp_comm *c, const char *why);

tp_comm_state tp_comm_get_state(const tp_comm *c);
const char *tp_comm_state_name(tp_comm_state s); /* "none", "init", "ready", "aborted" */
uint64_t tp_comm_epoch(const tp_comm *c);
uint32_t tp_comm_generation(const tp_comm *c);
int tp_comm_rank(const tp_comm *c);
int tp_comm_size(const tp_comm *c);
/* Why the communicator was aborted ("" if it never was), and what kind of failure that was. */
const char *tp_comm_last_error(const tp_comm *c);
tp_comm_fault tp_comm_last_fault(const tp_comm *c);

/* The deadlines above are clk_mono_s seconds (common/clock.h). */

#endif
