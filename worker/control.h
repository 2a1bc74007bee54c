/*
 * control.h — the worker's main thread: the coordinator link and the worker lifecycle
 * (prefix wctl_).
 *
 * The main thread owns the DEALER to the coordinator (routing id NAME/random/N: random chosen
 * once per process, N counting its connections; the coordinator takes a reconnect of this
 * process for the same worker, and refuses a second process under the same name with
 * ERR_DUPLICATE while the first is connected), the executor's pipe (worker/exec.h) and a signalfd,
 * all in one zmq_poll loop whose timeout never exceeds one second. Lifecycle (docs/protocol.md,
 * docs/operations.md):
 *
 *   registering --WELCOME--> welcomed --LOAD--> loading --READY--> ready
 *                                                      \--Error--> load-failed (LOAD retries)
 *   loading, ready, load-failed --EPOCH--> loading (the executor keeps the experts it still
 *   owns and loads the gained ones) --READY of that epoch--> ready
 *   any state, coordinator silent for liveness x heartbeat_ms --> backoff: the executor drops
 *   its session and data plane (the loaded layers stay), the DEALER is closed, and after 1,
 *   2, 4 ... 32 s (Paranoid Pirate) it is reopened and REGISTER sent again.
 *
 * The WELCOME is validated field by field before anything is acknowledged; CONFIG_ACK carries
 * this worker's own mc_hash of the config it rebuilt. LOAD, EPOCH, STEP and STEP_ABORT are
 * relayed to the executor verbatim and its answers relayed back verbatim; a STEP when not ready is
 * answered STEP_FAILED{ERR_NOT_READY} here. HEARTBEAT goes out every heartbeat_ms once welcomed,
 * and any message from the coordinator counts as a sign of life. Error{ERR_WORKER_LOST}
 * ("declared dead") and Error{ERR_NOT_REGISTERED, "... send REGISTER first"} (the coordinator
 * restarted) also lead to backoff and a new REGISTER.
 *
 * The DEALER's ZMQ_MAXMSGSIZE is EP_MAX_DATA_MSG until the first WELCOME names the model, then
 * the model's largest control frame (mmsg_max_frame) on every later connection. A monitor
 * watches its handshakes: a refused key, or a coordinator that uses CURVE when this worker does
 * not (or the reverse), ends the worker with exit 78 and the reason.
 *
 * Exit: SHUTDOWN from the coordinator, SIGTERM or SIGINT -> 0 (the executor is stopped first);
 * Error{ERR_UNKNOWN_WORKER}, Error{ERR_CONFIG_HASH}, Error{ERR_REFUSED} (device or key does not
 * fit the spec), Error{ERR_DUPLICATE} (another live process holds this name) or a CURVE
 * handshake the coordinator refuses -> 78 (EX_CONFIG: an operator must act); a failure to start
 * -> 70. SIGHUP is logged and ignored.
 * systemd: STATUS= on every state change, READY=1 once the shard is loaded and READY sent,
 * WATCHDOG=1 from the loop every half WatchdogSec when enabled.
 */
#ifndef EPMOE_CONTROL_H
#define EPMOE_CONTROL_H

#include "common/auth.h"
#include "common/error.h"
#include "kernels/gemm.h"
#include "kernels/moe_backend.h"

/* Heartbeat settings before the first WELCOME (zguide Paranoid Pirate values). */
#define WCTL_DEFAULT_HEARTBEAT_MS 1000
#define WCTL_DEFAULT_LIVENESS     3
/* Reconnect backoff: doubles from the first value up to the second. */
#define WCTL_BACKOFF_INIT_MS 1000
#define WCTL_BACKOFF_MAX_MS  32000

/* ZeroMQ I/O threads of the worker's context (control and data plane). */
#define WCTL_IO_THREADS 2

enum { WCTL_EXIT_OK = 0, WCTL_EXIT_SOFTWARE = 70, WCTL_EXIT_CONFIG = 78 };

typedef struct wctl_options {
    const char *coordinator; /* ZeroMQ endpoint of coordinator.listen */
    const char *name;        /* worker name of the cluster spec (the DEALER's routing id prefix) */
    const char *device;      /* "cpu" or "cuda:N" */
    int threads;             /* GEMM threads (<= 0: one per online CPU) */
    isa_level impl;          /* ISA_AUTO */
    /* Security (NULL: none): this worker's key pair (--key) and the coordinator's public key
     * (--coordinator-key). The control link, the data endpoint and every PUSH to a peer then
     * use CURVE, and the data endpoint admits only the peers WELCOME names, each by its key. */
    const auth_keypair *key;
    const uint8_t *coordinator_key;
    /* EPMOE_METRICS_PER_LAYER=1: the step histograms by layer and the pairs by (layer, expert)
     * (thousands of series at V4-Flash size; off: about 110) */
    bool metrics_per_layer;
    mb_cuda_tuning cuda; /* the EPMOE_CUDA_* knobs (main.c reads them) */
} wctl_options;

/* Run the worker until it is told to stop; returns the process exit code (above). */
int wctl_run(const wctl_options *opt);

#endif
