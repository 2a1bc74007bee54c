/*
 * epmoe.h — libepmoe, the client library attention engines link to call an epmoe cluster's MoE
 * layers (docs/client.md). Prefix epmoe_; nothing else is exported.
 *
 * Model: a client asks the coordinator (admin endpoint) once for the model's shape and the
 * cluster's members, then sends each layer call (a micro-batch of T tokens' hidden states) to an
 * entry worker, which routes, dispatches to the experts' owners, combines and answers. The
 * coordinator never sees a token. Several requests may be in flight; each completes with the
 * MoE output bit-identical to `epmoectl forward --local`, or fails with an explicit error at its
 * deadline. A request whose entry worker goes silent is sent again to another member.
 *
 * Buffers: every buffer given to epmoe_submit belongs to the caller and must stay valid, and
 * untouched, until the request completes (epmoe_wait/epmoe_poll returned it, or epmoe_cancel):
 * inputs are sent from it without a copy (and again if the request is resent), outputs are
 * written there when the answer arrives.
 *
 * Thread-safety: an epmoe_client may be used from any number of threads at once (an internal
 * mutex; one I/O thread per client owns the sockets). A request handle is used by one thread at
 * a time; it is a slot's address, which the library gives out again once the request was freed
 * (epmoe_poll hands out each request's user to tell them apart). No global state: two clients
 * in one process are independent.
 *
 * Errors: functions return EPMOE_OK (0) or a negative epmoe_status; the epmoe_error given (may
 * be NULL) receives the code and a message naming what was wrong (layer, token, field, peer).
 */
#ifndef EPMOE_H
#define EPMOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EPMOE_VERSION_MAJOR 0
#define EPMOE_VERSION_MINOR 4
#define EPMOE_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH (400 for 0.4.0), as zmq and sqlite3 give it: compare it
 * with epmoe_version_number() to learn whether the library loaded is the one compiled against. */
#define EPMOE_VERSION_NUMBER                                                                       \
    (EPMOE_VERSION_MAJOR * 10000 + EPMOE_VERSION_MINOR * 100 + EPMOE_VERSION_PATCH)

#if defined(__GNUC__)
#define EPMOE_API __attribute__((visibility("default")))
#else
#define EPMOE_API
#endif

typedef enum epmoe_status {
    EPMOE_OK = 0,
    EPMOE_EINVAL = -1,       /* a bad argument: layer, token count, missing ids, NULL buffer */
    EPMOE_EAGAIN = -2,       /* no slot: max_in_flight requests are held; free one, try again */
    EPMOE_ETIMEDOUT = -3,    /* the deadline passed before the answer */
    EPMOE_EBUSY = -4,        /* the cluster stayed saturated until the request's deadline */
    EPMOE_ENOTREADY = -5,    /* blocked; or no member could take it by its deadline (forming) */
    EPMOE_ESTALE = -6,       /* the cluster's model is no longer the one of epmoe_open (its
                              * config hash changed): open a new client */
    EPMOE_EREFUSED = -7,     /* a key was refused (CURVE), or the endpoint is not an epmoe
                              * coordinator's admin endpoint */
    EPMOE_EUNAVAILABLE = -8, /* no coordinator or member could be reached */
    EPMOE_EFAILED = -9,      /* the request failed in the cluster (the message says where) */
    EPMOE_ENOMEM = -10,
    EPMOE_ECANCELED = -11,    /* epmoe_cancel */
    EPMOE_EPROTO = -12,       /* a malformed answer */
    EPMOE_ENOTSUP = -13,      /* not on this cluster's data plane (data_plane: nccl) */
    EPMOE_EWAITTIMEOUT = -14, /* epmoe_wait's own timeout_ms passed; the request goes on */
    EPMOE_EINPROGRESS = -15,  /* the request is still in flight (epmoe_request_status) */
} epmoe_status;

#define EPMOE_ERROR_MAX 512

typedef struct epmoe_error {
    int code;        /* an epmoe_status */
    int remote_code; /* the cluster's ErrorCode (docs/protocol.md), 0 if none */
    char message[EPMOE_ERROR_MAX];
} epmoe_error;

/* A short name for a status: "EPMOE_EAGAIN: no slot (max_in_flight requests are held)". */
EPMOE_API const char *epmoe_strerror(int status);
/* "0.4.0": the library's version (the daemons' version too: one version for the project). */
EPMOE_API const char *epmoe_version(void);
/* EPMOE_VERSION_NUMBER of the library loaded (which may differ from the header's). */
EPMOE_API int epmoe_version_number(void);

#define EPMOE_OPTIONS_VERSION 1

/* Start from EPMOE_OPTIONS_INIT (zero, with size = sizeof(epmoe_options) and version =
 * EPMOE_OPTIONS_VERSION), then set the fields wanted; a zero field means its default. Later
 * versions only append fields. */
typedef struct epmoe_options {
    size_t size;
    uint32_t version;
    const char *coordinator;       /* the admin endpoint, e.g. "tcp://127.0.0.1:7401" (required) */
    const char *client_secret_key; /* CURVE: this client's secret key, Z85 (40 chars); NULL: none */
    const char *client_public_key; /* and its public key (NULL: derived from the secret) */
    const char *server_key;        /* the coordinator's public key, Z85 (with client keys) */
    const char *entry;             /* preferred entry worker: a member's name (another name is
                                    * EPMOE_EINVAL at open), or a client endpoint (e.g.
                                    * "ipc:///run/epmoe-clients/w0.client"); NULL: by load */
    uint32_t max_in_flight;        /* requests in flight at most (default 64, <= 4096) */
    uint32_t timeout_ms;           /* default deadline of a request (default 30000) */
    uint32_t connect_timeout_ms;   /* epmoe_open's wait for the coordinator (default 5000) */
    uint32_t resend_ms;            /* send a request again to another member when its entry has
                                    * not answered in this long and nobody said it died (default
                                    * timeout / 2; a dead entry is replaced at once) */
} epmoe_options;

#define EPMOE_OPTIONS_INIT                                                                         \
    {                                                                                              \
        .size = sizeof(epmoe_options), .version = EPMOE_OPTIONS_VERSION                            \
    }

typedef struct epmoe_client epmoe_client;
typedef struct epmoe_request epmoe_request;

/* Connect to the coordinator, read the model and the members, connect to the entry worker(s).
 * Fails (EPMOE_EUNAVAILABLE, EPMOE_EREFUSED, EPMOE_ENOTSUP, ...) with a message naming the
 * endpoint. *out is NULL on failure. */
EPMOE_API int epmoe_open(const epmoe_options *opts, epmoe_client **out, epmoe_error *err);
/* Fail every request still in flight (EPMOE_ECANCELED), stop the I/O thread, free. NULL-safe;
 * clears *client_p. */
EPMOE_API void epmoe_close(epmoe_client **client_p);

#define EPMOE_NAME_MAX 64

typedef struct epmoe_member {
    char name[EPMOE_NAME_MAX];
    uint32_t rank;
    char client_endpoint[256];
    int ready; /* a member of the current epoch and ready */
} epmoe_member;

typedef struct epmoe_info {
    uint32_t hidden_size;   /* H */
    uint32_t n_layers;      /* MoE layers: main then MTP */
    uint32_t n_main_layers; /* num_hidden_layers; layer L >= this is mtp.(L - n_main_layers) */
    uint32_t n_hash_layers; /* layers below this need token ids */
    uint32_t topk;          /* k */
    uint32_t n_experts;     /* routed experts */
    uint32_t vocab_size;    /* token ids are < this */
    char expert_dtype[8];   /* "fp4" or "fp8" */
    uint64_t config_hash;   /* the model's, pinned at epmoe_open */
    uint64_t epoch;         /* the current placement epoch, as last heard */
    uint32_t n_members;     /* epmoe_info_members gives them */
    uint32_t max_tokens;    /* tokens per request at most, as the cluster said */
} epmoe_info;

/* The model's shape and the cluster as last heard (asked again on news of a change). The model
 * is the one of epmoe_open, for the client's life: once the cluster serves another (a restart on
 * another checkpoint), this returns EPMOE_ESTALE, info still filled with the model of open. */
EPMOE_API int epmoe_info_get(epmoe_client *c, epmoe_info *info, epmoe_error *err);
/* The members as last heard, copied into the caller's out[cap]; *n receives their number (which
 * may exceed cap: then the first cap are copied). Safe against other threads' calls. */
EPMOE_API int epmoe_info_members(epmoe_client *c, epmoe_member *out, uint32_t cap, uint32_t *n,
                                 epmoe_error *err);

#define EPMOE_SUBMIT_ARGS_VERSION 1

/* One MoE layer call. Start from EPMOE_SUBMIT_ARGS_INIT (size and version set; later versions
 * only append fields). layer: 0..n_layers-1 (MTP layers after the main ones). hidden_size: the
 * H the caller sized its buffers for (required: another H than the model's is EPMOE_EINVAL).
 * hidden bf16 [n_tokens, H] (the MoE block input, before ffn_norm); token_ids int64 [n_tokens]
 * (required on hash layers, may be NULL elsewhere); out bf16 [n_tokens, H]; topk_ids int32
 * [n_tokens, k] and topk_weights f32 [n_tokens, k] may be NULL. config_hash: 0, or the
 * epmoe_info.config_hash the caller read (another is EPMOE_ESTALE). Non-blocking: EPMOE_EAGAIN
 * when max_in_flight requests hold a slot; EPMOE_ESTALE once the cluster serves another model
 * than the one of epmoe_open; EPMOE_ENOTREADY when the cluster is blocked. A request no member can
 * take yet (forming, loading, workers registering again) waits for one until its deadline, then
 * finishes EPMOE_ENOTREADY. timeout_ms 0: the client's default. *req is the handle to wait
 * on; it holds one of the max_in_flight slots from here until epmoe_request_free (after
 * epmoe_wait/epmoe_poll returned it, or epmoe_cancel). */
typedef struct epmoe_submit_args {
    size_t size;      /* sizeof(epmoe_submit_args) */
    uint32_t version; /* EPMOE_SUBMIT_ARGS_VERSION */
    uint32_t layer;
    uint32_t n_tokens;
    uint32_t hidden_size;
    const uint16_t *hidden;
    const int64_t *token_ids;
    uint16_t *out;
    int32_t *topk_ids;
    float *topk_weights;
    uint32_t timeout_ms;
    void *user; /* returned by epmoe_request_user */
    uint64_t config_hash;
} epmoe_submit_args;

#define EPMOE_SUBMIT_ARGS_INIT                                                                     \
    {                                                                                              \
        .size = sizeof(epmoe_submit_args), .version = EPMOE_SUBMIT_ARGS_VERSION                    \
    }

EPMOE_API int epmoe_submit(epmoe_client *c, const epmoe_submit_args *a, epmoe_request **req,
                           epmoe_error *err);

/* Block until req completes or timeout_ms passes (-1: no limit beyond the request's own
 * deadline). Returns the request's status (EPMOE_OK: out holds the answer), or
 * EPMOE_EWAITTIMEOUT if timeout_ms passed first (req stays in flight). Once it returned
 * anything else the request's status stays readable (epmoe_request_status) until
 * epmoe_request_free. */
EPMOE_API int epmoe_wait(epmoe_request *req, int timeout_ms, epmoe_error *err);
/* Completed requests, without blocking: up to max of them into done[]; returns their number.
 * Each is then finished as by epmoe_wait (its status readable, epmoe_request_free it).
 * user[] (may be NULL) receives each one's epmoe_submit_args.user, read under the client's
 * lock: a handle is an address the library gives out again once it was freed, so a binding
 * whose threads share handles (one frees while another polls) identifies requests by user. */
EPMOE_API int epmoe_poll(epmoe_client *c, epmoe_request **done, void **user, int max);
/* A descriptor that is readable while a completed request waits to be taken by epmoe_poll or
 * epmoe_wait (level-triggered; for poll/epoll/asyncio). Owned by the client. */
EPMOE_API int epmoe_fd(epmoe_client *c);
/* Give the request up: its buffers are released when this returns (a late answer is dropped;
 * if the library's own send still reads the input, this waits for that send to finish or be
 * discarded). The request is then finished with EPMOE_ECANCELED, is never reported by
 * epmoe_poll, and still needs epmoe_request_free. A finished request is left as it is. */
EPMOE_API void epmoe_cancel(epmoe_request *req);
/* Return a finished request's slot to the pool (NULL-safe; clears *req_p). A request still in
 * flight is canceled first (which may wait for a send, see epmoe_cancel). */
EPMOE_API void epmoe_request_free(epmoe_request **req_p);
/* The same without ever blocking, for garbage-collected bindings (a finalizer): a request still
 * in flight is given up and its slot returns to the pool once the library's send of its input
 * is over; its buffers must stay valid until then (a binding keeps them alive with the slot
 * until epmoe_poll or a later call no longer reports it; simplest: keep them until the client
 * is closed). NULL-safe; clears *req_p. */
EPMOE_API void epmoe_request_free_nowait(epmoe_request **req_p);

typedef struct epmoe_request_info {
    int status;          /* epmoe_status; EPMOE_EINPROGRESS while in flight */
    int remote_code;     /* ErrorCode of a failure in the cluster */
    const char *message; /* the failure's message ("" when ok) */
    uint64_t epoch;      /* the placement epoch it completed in */
    uint32_t entry_rank; /* the entry worker that answered */
    char entry[EPMOE_NAME_MAX];
    int replayed; /* some pairs were dispatched again inside the cluster */
    int resent;   /* the library sent it to another entry worker */
    double queued_s, dispatch_s, experts_s, combine_s; /* at the entry worker */
    double total_s;                                    /* submit to completion, at the client */
} epmoe_request_info;

EPMOE_API int epmoe_request_status(const epmoe_request *req, epmoe_request_info *info);
EPMOE_API void *epmoe_request_user(const epmoe_request *req);

/* A layer's index from the CLI's name: "3", "layers.3" or "mtp.0" (n_main_layers + 0). */
EPMOE_API int epmoe_layer_index(const epmoe_info *info, const char *name, uint32_t *layer,
                                epmoe_error *err);

#ifdef __cplusplus
}
#endif

#endif
