/*
 * exec_state.h — what the files of the executor share (exec.h is its public face): the
 * thread's state and the functions one file calls in another. Only worker/exec*.c include it;
 * it stands below exec.h (the actor), so the files below the actor never include that.
 *
 *   exec.c          the actor: the thread, its pipe and loop, the session's state
 *   exec_core.c     what all of them use: replies on the pipe, freeing layers and staged loads
 *   exec_session.c  the validated WELCOME (exec_session.h), its placements, the STEP check
 *   exec_load.c     loading: the data plane of an epoch, the layers, EPOCH, staged, COMMIT
 *   exec_step.c     the coordinator's STEP on the ZeroMQ plane and on the NCCL plane
 *   serve.c         the serving path (origin and serving halves, serve.h); plan.c the plan
 */
#ifndef EPMOE_EXEC_INTERNAL_H
#define EPMOE_EXEC_INTERNAL_H

#include <stdatomic.h>
#include <pthread.h>
#include <time.h>

#include "worker/exec_pipe.h"
#include "worker/exec_session.h"
#include "worker/serve.h"
#include "worker/step_nccl.h"
#include "worker/transport_comm.h"
#include "worker/transport_zmq.h"

/* LOADING messages per second at most. */
#define EXEC_PROGRESS_INTERVAL_S 0.1
/* Pipe messages put aside while a step waits (a LOAD or SESSION the main loop must see next). */
#define EXEC_MAX_STASH 8

struct exec_actor {
    void *zctx;
    void *pipe;        /* the caller's end */
    void *thread_pipe; /* the thread's end, handed over at pthread_create */
    char endpoint[64];
    pthread_t thread;
    bool started;
    mb_backend *be;    /* handed to the thread */
    atomic_int cancel; /* RESET and TERM commands sent and not yet handled */
    bool secure;
    auth_keypair key; /* with security */
};

/* What a load keeps and reads: (layer, expert) slots the rank holds, the most in one layer, and
 * of those the ones the old layers already held. */
typedef struct exec_slots {
    int max_per_layer, slots, kept;
} exec_slots;

struct exec_progress;

typedef struct exec_state {
    struct exec_actor *actor;
    void *pipe; /* the thread's end */
    mb_backend *be;
    exec_session *session;
    mb_layer **layers; /* stay across sessions while the model and config do (shard_*) */
    int n_layers;
    uint64_t shard_hash;           /* the config the layers were loaded for */
    char shard_model[EP_MAX_PATH]; /* and the checkpoint */
    uint64_t shard_files;          /* exec_files_hash of the files they were read from */
    tpz_transport *tp;             /* data_plane zmq */
    /* what tp was built for: a later session or epoch with the same world reuses it */
    int tp_rank, tp_world, tp_hidden, tp_experts;
    char tp_bind[EP_MAX_PATH];
    char **tp_peers;  /* [tp_world] */
    tpc_comm *comm;   /* data_plane nccl: kept across the epochs of one session */
    sn_driver *sn;    /* for the communicator of the last COMM_INIT */
    int cuda_ordinal; /* N of cuda:N, for the communicator (tpc_nccl_ops' ctx) */
    bool ready;
    bool have_last;
    uint64_t last_step;
    bool stop;
    wire_msg stash[EXEC_MAX_STASH];
    int n_stash;
    /* a staged epoch (a rebalance): its session and layers, loaded beside the serving ones */
    exec_session *staged;
    mb_layer **staged_layers; /* [n_layers] */
    exec_slots staged_cost;   /* what preparing it read: its commit reports it */
    uint64_t staged_bytes;
    uint64_t staged_files; /* exec_files_hash of the files it was read from */
    double staged_load_s;
    /* the open step: STEP_DONE sent, its peers' DISPATCHes still served (sparse all-to-all) */
    struct exec_step_s *open;
    struct wmx *mx; /* the worker's metrics (thread-safe), or NULL */
    /* the serving path: the client endpoint and the requests of this worker's clients (made
     * at the first READY, kept for the thread's life), and when load was last reported */
    srv_server *srv;
    double reported_at;
    /* a staged load's turn between layers (exec.c's exec_serve_between_layers): the loader
     * calls the actor back through it rather than by name, so exec_load.c stands below exec.c */
    bool (*between_layers)(struct exec_progress *p);
} exec_state;

typedef struct exec_progress {
    exec_state *st;
    const exec_session *s; /* the session being loaded */
    uint64_t total;
    int layers_done, layers_total;
    double start, last; /* when the layers' load began; the last LOADING */
    bool serve;         /* a staged load: serve steps between layers */
    int served_at;      /* the layer boundary steps were last served at */
} exec_progress;

/* What the serving path may use now (serve.h). */
static inline srv_env exec_env(const exec_state *st)
{
    return (srv_env){.be = st->be,
                     .layers = st->layers,
                     .n_layers = st->n_layers,
                     .session = st->session,
                     .tp = st->tp,
                     .mx = st->mx,
                     .ready = st->ready && st->session != NULL && !st->session->nccl};
}

static inline double exec_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* exec_core.c */
void exec_send(exec_state *st, uint16_t type, const ProtobufCMessage *body, const wire_payload *pl,
               int n);
void exec_error(exec_state *st, Epmoe__ErrorCode code, uint16_t in_reply_to, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void exec_step_failed(exec_state *st, bool has_id, uint64_t step_id, Epmoe__ErrorCode code,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void exec_free_layers(mb_layer **layers, int n);
void exec_free_shard(exec_state *st);
void exec_drop_staged(exec_state *st);
/* exec_load.c */
void exec_load(exec_state *st, uint16_t in_reply_to);
void exec_epoch(exec_state *st, const wire_msg *m);
void exec_commit(exec_state *st, const wire_msg *m);
/* The data plane belongs to one session and epoch; the loaded layers may outlive both. */
void exec_close_plane(exec_state *st);
/* exec_step.c */
void exec_step(exec_state *st, wire_msg *m);
void exec_comm_init(exec_state *st, const wire_msg *m);
void exec_close_open(exec_state *st);
void exec_stash(exec_state *st, wire_msg *m);
/* STEP_ABORT between steps: closes the open step it names. */
void exec_abort_open(exec_state *st, const wire_msg *m);
void exec_serve_open(exec_state *st);
int exec_nccl_open(exec_state *st, ep_err *err);

#endif
