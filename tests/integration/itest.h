/*
 * itest.h — the integration-test harness: a real epmoe-coordinator process, fake workers and
 * fake admin clients over real ZeroMQ sockets (prefix it_).
 *
 * it_start writes a model directory (config.json only: the coordinator reads nothing else) and
 * a cluster spec on 127.0.0.1 with free ports into a fresh mkdtemp directory, starts the
 * coordinator binary (fork/exec, stderr to coord.log there) and waits until its admin socket
 * answers. it_finish sends SIGTERM, checks that the process exits 0 promptly (under ASan this
 * also proves LeakSanitizer found nothing), prints the coordinator's log when the test failed,
 * and removes the directory.
 *
 * Single-threaded: every wait pumps all fake workers (heartbeats out, STEP answered according
 * to each worker's behaviour, everything else recorded), so workers stay alive while a test
 * waits for a reply.
 *
 * The fake workers' STEP answer is a pure function of what they were sent, so a test can check
 * the reassembled reply independently: for row i of a chunk of n tokens on rank r,
 *   out[i][h]     = in[i][h] ^ 0x5A5A                 (bf16 bits)
 *   topk_ids[i]   = {r, has_ids ? id[i] : in[i][0]}
 *   topk_wts[i]   = {(float)in[i][1], (float)n}
 * and STEP_DONE reports dispatch_bytes 1000 + r, combine_bytes 10 n.
 *
 * Placement epochs: a fake worker answers EPOCH with READY {epoch, n_experts it owns}, after
 * epoch_delay_ms (a worker loading gained experts), and records the epoch's members; the
 * chunk rule of it_check_forward uses the members of the epoch the latest step ran in.
 */
#ifndef EPMOE_ITEST_H
#define EPMOE_ITEST_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/model_config.h"
#include "common/wire.h"

/* The test model: small but complete (hash layer 0, MTP layer 4). */
#define IT_H     128
#define IT_E     8
#define IT_K     2
#define IT_L     4
#define IT_HASH  1
#define IT_MTP   1
#define IT_VOCAB 1000

#define IT_MAX_WORKERS 8
#define IT_MAX_CLIENTS 8

typedef enum it_behaviour {
    IT_OK = 0,   /* answer STEP with STEP_DONE */
    IT_FAIL,     /* answer STEP with STEP_FAILED */
    IT_HOLD,     /* keep the STEP unanswered; answer STEP_FAILED on STEP_ABORT */
    IT_MUTE,     /* read nothing, send nothing (a hung or vanished worker) */
    IT_BAD_DONE, /* answer STEP_DONE with a short out payload */
    IT_SLOW      /* answer STEP with STEP_DONE step_delay_ms after it came */
} it_behaviour;

typedef struct it_worker {
    char name[64];
    void *sock;
    int n_connections; /* its routing id is "name#n" for its n-th connection */
    it_behaviour behaviour;
    int64_t next_hb_ms;
    /* what it received */
    bool welcomed, loaded;
    int rank, world_size;
    uint64_t epoch, config_hash;
    Epmoe__Welcome *welcome; /* the last WELCOME, decoded */
    int n_heartbeats, n_steps, n_aborts, n_shutdowns, n_errors;
    /* the coordinator's heartbeats as they came: the last one, and the longest gap between
     * two (what a real worker's liveness counts); a test resets both to start measuring */
    int64_t last_hb_ms, max_hb_gap_ms;
    uint64_t held_step; /* IT_HOLD: the step it is sitting on (0: none) */
    int last_error_code;
    char last_error[1024];
    uint64_t last_abort;
    /* data_plane nccl: COMM_INIT is answered (rank 0 sends COMM_ID first) unless comm_silent */
    bool nccl, comm_silent;
    int n_comm_inits;
    uint32_t comm_gen;    /* of the last COMM_INIT */
    bool got_id;          /* the last COMM_INIT carried an id ... */
    uint8_t comm_id[128]; /* ... this one (rank 0: the one it made) */
    /* placement epochs */
    int n_epochs;          /* EPOCH messages received */
    int epoch_delay_ms;    /* answer EPOCH this long after it came (0: at once) */
    int64_t ready_due_ms;  /* a READY to send for `epoch` (0: none) */
    uint32_t members;      /* bit r: rank r is a member of `epoch` */
    uint32_t owned;        /* experts it owns in `epoch` */
    uint64_t last_step;    /* the last STEP it answered with STEP_DONE */
    uint32_t step_members; /* `members` when it answered it */
    int step_delay_ms;     /* IT_SLOW */
    wire_msg *slow_step;   /* IT_SLOW: the STEP it will answer at slow_due_ms */
    int64_t slow_due_ms;
    bool auto_join;      /* after it_worker_register: a later WELCOME is answered by
                          * itself (CONFIG_ACK, then READY on LOAD) */
    bool joining;        /* inside it_worker_join: every WELCOME is answered with CONFIG_ACK */
    int n_welcomes;      /* WELCOME messages received */
    char client_ep[128]; /* reported in READY.client_endpoint when set */
    const char *key;     /* security: the secret key it connects with (NULL: workers/NAME.key) */
} it_worker;

typedef struct it_client {
    void *sock;
    uint64_t want_id;
    bool have_reply;
    Epmoe__AdminReply *reply; /* owned; freed by the next request or it_finish */
    wire_msg *msg;            /* its frames (payloads); owned */
    int error_type_code;      /* an Error message instead of an AdminReply: its code, else -1 */
} it_client;

typedef struct it_opts {
    int n_workers;            /* 1..IT_MAX_WORKERS, split over two nodes */
    int heartbeat_ms;         /* default 100 */
    int liveness;             /* default 5 */
    int step_timeout_ms;      /* default 5000 */
    const char *expert_dtype; /* NULL: config.json has no expert_dtype */
    bool nccl;                /* data_plane nccl, workers on cuda:R */
    const char *ep_extra;     /* more expert_parallel lines ("  rejoin: stay\n"), or NULL */
    bool client_endpoints;    /* each worker gets client: "ipc://DIR/NAME.client" */
    /* security: a directory with coordinator.key/.pub, workers/NAME.key/.pub, ops/ and
     * clients/ (*.key/.pub): the spec names them, fake workers connect with their key and
     * it_client_new with ops/op.key (NULL: no security) */
    const char *keys_dir;
} it_opts;

typedef struct itest {
    char dir[64];
    char spec_path[128], log_path[128];
    char listen[64], admin[64];
    int data_port[IT_MAX_WORKERS]; /* for every possible worker, so a reload can add some */
    it_opts o;
    mc_config cfg; /* parsed by the test from the config.json it wrote */
    pid_t pid;
    int exit_status; /* after it_wait_exit */
    void *zctx;
    it_worker *w[IT_MAX_WORKERS];
    int n_w;
    it_client *cl[IT_MAX_CLIENTS];
    int n_cl;
    it_client *state_client; /* it_wait_state's */
    uint64_t epoch1;         /* the coordinator's first epoch (its start time in ms) */
} itest;

void it_default_opts(it_opts *o);
int64_t it_now_ms(void);
/* A free TCP port on 127.0.0.1 (bound to port 0 and released). */
int it_free_port(void);

/* Write the files, start the coordinator, wait for its admin socket. NULL on failure (logged). */
itest *it_start(const char *coord_bin, const it_opts *o);
/* SIGTERM (if still running) and wait up to 5 s for the exit; print the coordinator's log when
 * dump_log; clean up. Returns the exit code (0 after an orderly stop), -1 when it hung. */
int it_finish(itest **t, bool dump_log);
/* Wait for the process to exit; returns its exit code, 128+signal, or -1 on timeout. */
int it_wait_exit(itest *t, int ms);

/* Write cluster.yaml from t->o again (a test changes t->o, then reloads). 0 or -1. */
int it_write_spec(itest *t);

/* Spec worker i's name: a0, a1 on node n0, then b0, b1, ... on n1. */
const char *it_worker_name(const itest *t, int rank);

it_worker *it_worker_new(itest *t, const char *name);
/* Close, wait 200 ms, and connect again with a new routing id (a restarted worker). */
void it_worker_reconnect(itest *t, it_worker *w);
int it_worker_send(it_worker *w, uint16_t type, const ProtobufCMessage *body);
/* REGISTER .. READY; 0 when the worker reached READY. The same as it_worker_hello, then
 * it_worker_join. */
int it_worker_register(itest *t, it_worker *w);
/* REGISTER, and wait for the WELCOME (not answered yet); 0 when welcomed. */
int it_worker_hello(itest *t, it_worker *w);
/* After it_worker_hello: CONFIG_ACK, LOAD, LOADING, READY; 0 when the worker reached READY.
 * Like epmoe-worker it answers every WELCOME with CONFIG_ACK: a newer epoch sent between the
 * WELCOME and the CONFIG_ACK brings a fresh WELCOME instead of LOAD (docs/protocol.md). */
int it_worker_join(itest *t, it_worker *w);
/* Connect and register every spec worker; 0 when all are ready. */
int it_register_all(itest *t);

it_client *it_client_new(itest *t);
/* An admin client connecting with the secret key in key_path (security: a CURVE client of the
 * coordinator's key). */
it_client *it_client_new_key(itest *t, const char *key_path);
/* Send an AdminRequest (its id is set to a fresh value) with payloads. */
void it_send(itest *t, it_client *c, Epmoe__AdminRequest *rq, const wire_payload *p, int n);
/* Pump until c has its reply (or ms pass); the reply or NULL. */
Epmoe__AdminReply *it_wait(itest *t, it_client *c, int ms);
/* Send a verb (layer optional) and wait. */
Epmoe__AdminReply *it_call(itest *t, it_client *c, Epmoe__AdminVerb verb, const char *layer);

/* Pump every fake worker for ms. */
void it_pump(itest *t, int ms);

/* A DEALER of the test's own (no fake worker behind it) to endpoint ep, with routing id id. */
void *it_raw_dealer(itest *t, const char *ep, const char *id);
/* Pump until a message arrives on sock (an it_raw_dealer) or ms pass. Returns its type, with an
 * Error's code in *code (-1 when it has none) and its text in msg (cap bytes); -1 when nothing
 * came. */
int it_raw_recv(itest *t, void *sock, int ms, int *code, char *msg, size_t cap);
/* Pump until STATUS says state (polling), or ms pass; 0 when reached. */
int it_wait_state(itest *t, const char *state, int ms);

/* FORWARD input for T tokens: hidden bf16 bits (finite) and (when layer is a hash layer) ids. */
void it_make_input(int T, uint32_t seed, uint16_t *hidden, int64_t *ids);
/* A FORWARD's input: T tokens of hidden bf16 and (hash layers) ids, from it_make_input. */
typedef struct it_fwd {
    int T;
    uint16_t *hidden;
    int64_t *ids; /* NULL on score layers */
} it_fwd;

it_fwd it_fwd_make(int T, uint32_t seed, bool ids);
void it_fwd_free(it_fwd *in);
/* Send FORWARD {layer, in} from c (no wait). */
void it_fwd_send(itest *t, it_client *c, const char *layer, const it_fwd *in);
/* it_check_forward on c's reply; prints why and returns -1 when it is not right. */
int it_fwd_check(const itest *t, const it_client *c, const it_fwd *in);
/* The n-th placement epoch of this coordinator run (n = 1: the first). Epochs start at the
 * coordinator's start time, not at 1, so that they keep increasing across restarts. */
uint64_t it_epoch(const itest *t, int n);
/* Pump until STATUS says state with current_epoch == epoch, or ms pass; 0 when reached. */
int it_wait_epoch(itest *t, uint64_t epoch, const char *state, int ms);

/* Check a FORWARD reply against the fake workers' function (and the chunk rule of
 * docs/protocol.md for which rank got which token); 0, or -1 with why. */
int it_check_forward(const itest *t, const it_client *c, int T, const uint16_t *hidden,
                     const int64_t *ids, char *why, size_t cap);

#endif
