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
 * a time. No global state: two clients in one process are independent.
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

#if defined(__GNUC__)
#define EPMOE_API __attribute__((visibility("default")))
#else
#define EPMOE_API
#endif

typedef enum epmoe_status {
    EPMOE_OK = 0,
    EPMOE_EINVAL = -1,       /* a bad argument: layer, token count, missing ids, NULL buffer */
    EPMOE_EAGAIN = -2,       /* the in-flight limit is reached: wait for a request, try again */
    EPMOE_ETIMEDOUT = -3,    /* the deadline passed before the answer */
    EPMOE_EBUSY = -4,        /* the cluster stayed saturated until the request's deadline */
    EPMOE_ENOTREADY = -5,    /* the cluster is not ready (forming, loading, blocked) */
    EPMOE_ESTALE = -6,       /* the model config changed under a reload (config hash) */
    EPMOE_EREFUSED = -7,     /* a key was refused (CURVE), or the endpoint is not epmoe's */
    EPMOE_EUNAVAILABLE = -8, /* no coordinator or member could be reached */
    EPMOE_EFAILED = -9,      /* the request failed in the cluster (the message says where) */
    EPMOE_ENOMEM = -10,
    EPMOE_ECANCELED = -11, /* epmoe_cancel */
    EPMOE_EPROTO = -12,    /* a malformed answer */
    EPMOE_ENOTSUP = -13,   /* not on this cluster's data plane (data_plane: nccl) */
} epmoe_status;

#define EPMOE_ERROR_MAX 512

typedef struct epmoe_error {
    int code;        /* an epmoe_status */
    int remote_code; /* the cluster's ErrorCode (docs/protocol.md), 0 if none */
    char message[EPMOE_ERROR_MAX];
} epmoe_error;

/* A short name for a status: "EPMOE_EAGAIN: the in-flight limit is reached". */
EPMOE_API const char *epmoe_strerror(int status);
/* "0.4.0": the library's version (the daemons' version too). */
EPMOE_API const char *epmoe_version(void);

#define EPMOE_OPTIONS_VERSION 1

/* Zero-initialise, set size = sizeof(epmoe_options) and version = EPMOE_OPTIONS_VERSION, then
 * the fields wanted; a zero field means its default. Later versions only append fields. */
typedef struct epmoe_options {
    size_t size;
    uint32_t version;
    const char *coordinator;       /* the admin endpoint, e.g. "tcp://127.0.0.1:7401" (required) */
    const char *client_secret_key; /* CURVE: this client's secret key, Z85 (40 chars); NULL: none */
    const char *client_public_key; /* and its public key (NULL: derived from the secret) */
    const char *server_key;        /* the coordinator's public key, Z85 (with client keys) */
    const char *entry;             /* preferred entry worker: its name, or its client endpoint
                                    * (e.g. "ipc:///run/epmoe/w0.client"); NULL: one by rotation */
    uint32_t max_in_flight;        /* requests in flight at most (default 64, <= 4096) */
    uint32_t timeout_ms;           /* default deadline of a request (default 30000) */
    uint32_t connect_timeout_ms;   /* epmoe_open's wait for the coordinator (default 5000) */
    uint32_t resend_ms;            /* send a request again to another member when its entry has
                                    * not answered in this long and nobody said it died (default
                                    * timeout / 2; a dead entry is replaced at once) */
} epmoe_options;

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
    uint64_t config_hash;
    uint64_t epoch; /* the current placement epoch, as last heard */
    uint32_t n_members;
    const epmoe_member *members; /* [n_members], valid until the next epmoe_info call */
    uint32_t max_tokens;         /* tokens per request at most (EP_MAX_TOKENS) */
} epmoe_info;

/* The model's shape and the cluster as last heard (asked again on news of a change). */
EPMOE_API int epmoe_info_get(epmoe_client *c, epmoe_info *info, epmoe_error *err);

/* One MoE layer call. layer: 0..n_layers-1 (MTP layers after the main ones). hidden bf16
 * [n_tokens, H] (the MoE block input, before ffn_norm); token_ids int64 [n_tokens] (required
 * on hash layers, may be NULL elsewhere); out bf16 [n_tokens, H]; topk_ids int32 [n_tokens, k]
 * and topk_weights f32 [n_tokens, k] may be NULL. Non-blocking: EPMOE_EAGAIN when
 * max_in_flight requests hold a slot. timeout_ms 0: the client's default. *req is the handle
 * to wait on; it holds one of the max_in_flight slots from here until epmoe_request_free
 * (after epmoe_wait/epmoe_poll returned it, or epmoe_cancel). */
typedef struct epmoe_submit_args {
    uint32_t layer;
    uint32_t n_tokens;
    const uint16_t *hidden;
    const int64_t *token_ids;
    uint16_t *out;
    int32_t *topk_ids;
    float *topk_weights;
    uint32_t timeout_ms;
    void *user; /* returned by epmoe_request_user */
} epmoe_submit_args;

EPMOE_API int epmoe_submit(epmoe_client *c, const epmoe_submit_args *a, epmoe_request **req,
                           epmoe_error *err);

/* Block until req completes or timeout_ms passes (-1: no limit beyond the request's own
 * deadline). Returns the request's status (EPMOE_OK: out holds the answer), or EPMOE_EAGAIN if
 * timeout_ms passed first (req stays in flight). Once it returned anything but EPMOE_EAGAIN
 * the request's status stays readable (epmoe_request_status) until epmoe_request_free. */
EPMOE_API int epmoe_wait(epmoe_request *req, int timeout_ms, epmoe_error *err);
/* Completed requests, without blocking: up to max of them into done[]; returns their number.
 * Each is then finished as by epmoe_wait (its status readable, epmoe_request_free it). */
EPMOE_API int epmoe_poll(epmoe_client *c, epmoe_request **done, int max);
/* A descriptor that is readable while a completed request waits to be taken by epmoe_poll or
 * epmoe_wait (level-triggered; for poll/epoll/asyncio). Owned by the client. */
EPMOE_API int epmoe_fd(epmoe_client *c);
/* Give the request up: its buffers are released when this returns (a late answer is dropped;
 * if the library's own send still reads the input, this waits for that send to finish or be
 * discarded). The request is then finished with EPMOE_ECANCELED, is never reported by
 * epmoe_poll, and still needs epmoe_request_free. A finished request is left as it is. */
EPMOE_API void epmoe_cancel(epmoe_request *req);
/* Return a finished request's slot to the pool (NULL-safe; clears *req_p). A request still in
 * flight is canceled first. */
EPMOE_API void epmoe_request_free(epmoe_request **req_p);

typedef struct epmoe_request_info {
    int status;          /* epmoe_status; EPMOE_EAGAIN while in flight */
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
