/*
 * transport_zmq.h — the ZeroMQ data plane of one epoch: DISPATCH and COMBINE (transport.h)
 * between host buffers of workers, over PUSH/PULL (prefix tpz_).
 *
 * Contract (docs/protocol.md, proto/epmoe.proto): every worker binds one PULL at its
 * data endpoint and connects one PUSH per peer rank (never to itself), so a message to rank r goes
 * only to r. Every message is wire.h-framed; payloads travel zero-copy from one block the
 * sender filled in place (tpz_msg_alloc) and arrive as views into the received frames.
 *
 * The owner thread (the executor) polls tpz_socket() beside its other sockets and calls tpz_pump
 * when it is readable. tpz_pump validates each message completely before keeping it:
 *   session == ours and epoch == ours; with security, the ZAP user id of the sender (its key's
 *   name) is the name of the rank it claims; src_rank < world_size and != ours; step_id present;
 *   the payload count of the kind and format; n_rows <= EP_MAX_TOKENS and n_pairs <= n_rows x
 *   k (the model's top-k) before any product; payload sizes (fp8 codes n_rows*H, scales
 *   n_rows*H/128 bytes when scales_e8m0 else 4x that; bf16 hidden n_rows*H*2; pair arrays
 *   n_pairs*4 each; combine out n_pairs*H*2); pair_row < n_rows; pair_expert < E and owned by
 *   this rank (expert_owner, or owned: held in some layer; the executor checks the step's layer).
 * A message that fails any check is dropped: counted, its reason logged (rate-limited) and kept
 * in tpz_last_drop; it never disturbs other messages.
 *
 * Buffer space a peer may hold (never more than it was granted):
 *   - one DISPATCH per peer, of a step not yet finished: a peer is at most one step ahead (the
 *     coordinator starts a step when every worker has answered the last), so a newer DISPATCH
 *     from the same peer replaces an older one (stale messages a restarted worker receives from
 *     its peers' queues give way to the current ones);
 *   - a COMBINE only when granted: tpz_grant(step, peer, n_pairs) before the DISPATCH it answers
 *     goes out; a COMBINE that was not granted, or whose n_pairs differs, is dropped on arrival,
 *     and one kept under an earlier grant and never taken gives way to the newer grant's.
 * Messages of finished steps (tpz_finish) are dropped. A DISPATCH of any later step is kept
 * (in its peer's one slot), however far ahead: a worker away for thousands of steps (drained,
 * stopped) gets its peers' DISPATCHes of its first step back before its own STEP.
 *
 * Step ids must increase within one transport's life (one placement epoch of one coordinator
 * session): "finished" means step_id <= the highest id passed to tpz_finish.
 *
 * Sockets: MAXMSGSIZE is the largest frame this model can legitimately produce
 * (tpz_max_frame), RCVHWM is TPZ_RCVHWM messages per peer connection, so what a connection can
 * make libzmq buffer before tpz_pump sees it is bounded; with security the PULL is a CURVE server
 * (ZAP domain AUTH_DOMAIN_DATA) and each PUSH a CURVE client of its peer's key.
 *
 * What the transport does not know is checked by its owner: the layer matches the step's, one
 * DISPATCH per (step, peer).
 *
 * Without security a forged message with the right session and ids cannot be told from the
 * peer's (a PULL names no sender; docs/operations.md "Not protected"): on the STEP path a
 * forged DISPATCH that comes first makes the real one a duplicate (the step fails explicitly);
 * the serving path has no duplicate rule (every DISPATCH within the credits is kept, and the
 * origin takes only the COMBINE with its part's pair count), so a forged empty one is harmless;
 * its credits are counted per connection (ZMQ_SRCFD), so a flood in a peer's name spends the
 * flood's connection's credits, never the peer's.
 *
 * Arrays in a received tp_msg are aligned for their type (misaligned frames are copied), so the
 * owner can hand them to kernels directly. Not thread-safe: one owner thread.
 */
#ifndef EPMOE_TRANSPORT_ZMQ_H
#define EPMOE_TRANSPORT_ZMQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/auth.h"
#include "common/error.h"
#include "common/wire.h"
#include "worker/transport.h"

/* Serving-path messages (docs/protocol.md "Serving path") one connection may have kept here at
 * once, per kind: an origin sends a peer at most this many DISPATCHes whose COMBINE is not back
 * (its credits), over its one connection, so an honest peer never meets the bound; more is
 * dropped. */
#define TPZ_SERVE_CREDITS 16
/* Messages libzmq may queue per peer connection before tpz_pump reads them: a step's DISPATCH
 * and COMBINE, and the serving path's credits of both kinds. */
#define TPZ_RCVHWM (4 + 2 * TPZ_SERVE_CREDITS)
/* Milliseconds a data-plane connection may leave data unacknowledged before it is dropped and
 * made again (ZMQ_TCP_MAXRT): twice the least progress timeout of the serving path. */
#define TPZ_TCP_MAXRT_MS 2000

typedef struct tpz_transport tpz_transport;

typedef struct tpz_config {
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
} tpz_config;

/* The largest frame a DISPATCH or COMBINE of this model can carry (EP_MAX_TOKENS rows, capped
 * at EP_MAX_DATA_MSG): the PULL's ZMQ_MAXMSGSIZE. */
int64_t tpz_max_frame(int hidden, int topk);

/* Create a transport in zctx and bind its PULL (options set before bind: linger 0, MAXMSGSIZE
 * tpz_max_frame, RCVHWM TPZ_RCVHWM, CURVE with security). Errors name the endpoint. */
tpz_transport *tpz_create(void *zctx, const tpz_config *cfg, ep_err *err);
void tpz_destroy(tpz_transport **self_p);

/* A transport without sockets, and a message handed to it as if tpz_pump had read it (wm from
 * malloc, taken): the validation, slots and grants on their own, for tests and fuzz_dataplane.
 * tpz_send, tpz_socket and tpz_pump must not be used on it. */
tpz_transport *tpz_create_unbound(const tpz_config *cfg, ep_err *err);
void tpz_deliver(tpz_transport *tp, wire_msg *wm);

/* The endpoint actually bound (ephemeral port resolved), for the peers to connect to. */
const char *tpz_endpoint(const tpz_transport *tp);

/* Connect one PUSH per peer: endpoints[r] for every r != rank (endpoints[rank] is ignored).
 * ZeroMQ connects in the background, so a peer that binds later still gets its messages. */
int tpz_connect(tpz_transport *tp, const char *const *endpoints, ep_err *err);

/* Allocate the payload arrays of an outgoing message in one aligned block. */
int tpz_msg_alloc(tp_msg *m, int hidden, ep_err *err);
/* Free m's storage (a received message, or an allocated one never sent); m's arrays are
 * cleared. Tolerates a zeroed m. */
void tpz_msg_release(tp_msg *m);

/* Allow rank peer one COMBINE of n_pairs rows for step_id (call before the DISPATCH it answers
 * goes out). A later grant to the same peer replaces this one. */
void tpz_grant(tpz_transport *tp, uint64_t step_id, int peer, int n_pairs);

/* Send m to rank dst (!= own rank) without blocking; session, epoch and src_rank are filled
 * in. The block
 * goes to ZeroMQ, which frees it once sent, and m's arrays are cleared whether or not the send
 * succeeded. Fails (naming the peer) when dst's queue is full. */
int tpz_send(tpz_transport *tp, int dst, tp_msg *m, ep_err *err);

/* The PULL socket, to poll for ZMQ_POLLIN; only tpz_pump may read it. */
void *tpz_socket(tpz_transport *tp);

/* Read every message waiting on the PULL without blocking, validate it and keep it or drop it.
 * Returns the number kept. */
int tpz_pump(tpz_transport *tp);

/* Which serving-path COMBINEs the owner awaits: true when a part of (request, attempt) went to
 * src_rank and its COMBINE is not back (the origin's credit for it is held). With fn set, a
 * COMBINE it does not await is dropped on arrival, before it takes a credit: without security a
 * forged DISPATCH in a peer's name is answered with a COMBINE to that peer over this worker's own
 * connection, and a flood of those answers must not fill the credits the real COMBINEs need.
 * fn NULL (the default): every COMBINE within the credits is kept. */
typedef bool (*tpz_awaits_fn)(void *ctx, uint64_t request, uint32_t attempt, int src_rank);
void tpz_set_awaits(tpz_transport *tp, tpz_awaits_fn fn, void *ctx);

/* Move a kept message of step_id into *out (the caller releases it). Returns 1, or 0 when
 * none is kept. */
int tpz_take(tpz_transport *tp, uint64_t step_id, tp_msg *out);
/* The oldest kept serving-path message (DISPATCH or COMBINE, any request) into *out: 1, or 0
 * when none is kept. Serving-path messages survive tpz_finish and tpz_set_placement*: a request
 * outlives steps and epochs (its owner matches COMBINEs with what it sent). */
int tpz_take_request(tpz_transport *tp, tp_msg *out);

/* Step step_id is finished or abandoned: drop what is kept and granted for it and every earlier
 * step, and drop later arrivals for them. Also called with step - 1 when a step starts: what
 * is older than the step the coordinator runs now is stale. */
void tpz_finish(tpz_transport *tp, uint64_t step_id);

/* A new placement epoch on the same sockets (placement epochs, docs/protocol.md): messages must
 * carry `epoch` from now on and name experts of `expert_owner` ([E]) owned by this rank;
 * everything kept for the old epoch is dropped. epoch must be above the current one (so no
 * message of an earlier epoch can pass); the sockets and their connections stay, so no message
 * of the new epoch is lost to a reconnect. -1 with err when epoch does not increase. */
int tpz_set_placement(tpz_transport *tp, uint64_t epoch, const uint32_t *expert_owner, ep_err *err);
/* The same with the experts this rank holds in some layer (owned [E], copied): per-layer
 * placements and replicas (issue 9), and a committed staged epoch. */
int tpz_set_placement_owned(tpz_transport *tp, uint64_t epoch, const uint8_t *owned, ep_err *err);
uint64_t tpz_epoch(const tpz_transport *tp);
uint64_t tpz_session(const tpz_transport *tp);

/* Counters and the reason of the last dropped message ("" if none). */
uint64_t tpz_dropped(const tpz_transport *tp);
const char *tpz_last_drop(const tpz_transport *tp);
int tpz_pending(const tpz_transport *tp);

#endif
