/*
 * spec.h — the cluster spec: a YAML file that names the coordinator's endpoints, the model and
 * every worker of the cluster (prefix spec_). docs/cluster-spec.md is the schema.
 *
 * Contract: spec_load / spec_parse either return a fully validated spec_cluster or NULL with one
 * message in err of the form
 *   FILE:LINE:COLUMN: what is wrong and what was expected
 * (1-based, at the start of the offending node). The loaded spec is self-contained: strings are
 * copied, relative model paths are already resolved against the spec file's directory, and
 * workers are numbered by rank (nodes in file order, workers in file order, 0..n_workers-1).
 * The spec knows nothing about the model: spec_check_experts cross-checks the worker count with
 * the model's expert count once config.json has been read.
 *
 * Positions (spec_pos) are kept for the fields a daemon may later have to complain about (an
 * endpoint that cannot be bound, a worker that registers with another device), so those errors
 * can point at the line of the spec too.
 */
#ifndef EPMOE_SPEC_H
#define EPMOE_SPEC_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "common/limits.h"

/* Longest cluster, node or worker name (the schema's charset [A-Za-z0-9._-]). */
#define SPEC_NAME_MAX 63

/* A position in the spec file, 1-based; {0, 0} when the value was not in the file (default). */
typedef struct spec_pos {
    int line, col;
} spec_pos;

typedef enum spec_placement {
    SPEC_PLACE_CONTIGUOUS = 0,  /* rank r owns [r*E/P, (r+1)*E/P) (spec §1.4); needs E % P == 0 */
    SPEC_PLACE_ROUND_ROBIN = 1, /* expert e -> rank e % P */
    SPEC_PLACE_EPLB = 2         /* DeepSeek's EPLB with redundant_experts (coordinator/eplb.h) */
} spec_placement;

/* Bounds of the load-statistics settings (issue 9). */
#define SPEC_MAX_WINDOW_STEPS 100000
#define SPEC_DEFAULT_WINDOW   1000
#define SPEC_MAX_REDUNDANT    (MC_MAX_EXPERTS * 64)
#define SPEC_MAX_METRICS_ADDR 64

typedef enum spec_dispatch {
    SPEC_DISPATCH_FP8 = 0, /* activations cross the all-to-all as FP8 e4m3 + UE8M0 scales */
    SPEC_DISPATCH_BF16 = 1
} spec_dispatch;

/* How dispatch and combine move between workers (docs/cluster-spec.md, docs/protocol.md). */
typedef enum spec_data_plane {
    SPEC_PLANE_ZMQ = 0, /* PUSH/PULL between the workers' data endpoints; any device mix */
    SPEC_PLANE_NCCL = 1 /* NCCL send/recv from device memory; every worker on cuda:N, fp8 */
} spec_data_plane;

/* What a worker that comes back after its experts moved to the others gets (issue 8). */
typedef enum spec_rejoin {
    SPEC_REJOIN_RESTORE = 0, /* a new epoch restores the spec's placement (default) */
    SPEC_REJOIN_STAY = 1     /* the placement stays; the worker waits as a spare */
} spec_rejoin;
/* Expert GEMMs of CUDA workers (kernels/moe_backend.h mb_gemm_mode): exact gives the CPU
 * backend's bits; fast uses tensor cores within spec §7's tolerances. */
typedef enum spec_gpu_gemm { SPEC_GPU_GEMM_EXACT = 0, SPEC_GPU_GEMM_FAST = 1 } spec_gpu_gemm;

typedef struct spec_worker {
    char name[EP_MAX_NAME]; /* unique in the cluster */
    char node[EP_MAX_NAME]; /* name of the node it is listed under */
    char device[32];        /* "cpu" or "cuda:N" */
    int cuda_index;         /* N of "cuda:N", -1 for cpu */
    char data[EP_MAX_NAME]; /* data-plane endpoint the worker binds; unique in the cluster */
    int rank;               /* order of appearance, 0-based */
    int node_index;         /* index into spec_cluster.nodes */
    char metrics[SPEC_MAX_METRICS_ADDR]; /* HOST:PORT of its /metrics, "" when off */
    /* client: the endpoint its client ROUTER binds (the serving path, libepmoe), unique in the
     * cluster; "" when absent: an ephemeral TCP port on its data endpoint's host */
    char client[EP_MAX_NAME];
    spec_pos pos; /* the worker's mapping */
    spec_pos name_pos, device_pos, data_pos, metrics_pos, client_pos;
} spec_worker;

typedef struct spec_node {
    char name[EP_MAX_NAME]; /* unique in the cluster */
    int first_worker;       /* its workers are ranks first_worker .. first_worker+n_workers-1 */
    int n_workers;
    spec_pos pos, name_pos;
} spec_node;

typedef struct spec_cluster {
    char file[EP_MAX_PATH]; /* the spec file as named by the caller (for messages) */
    char name[EP_MAX_NAME];
    char listen[EP_MAX_NAME];     /* coordinator ROUTER for workers */
    char admin[EP_MAX_NAME];      /* coordinator ROUTER for operator RPC */
    int heartbeat_ms;             /* 10..60000, default 1000 */
    int liveness;                 /* missed heartbeats before a worker is dead, 1..100, default 3 */
    int step_timeout_ms;          /* 100..3600000, default 30000 */
    char model_path[EP_MAX_PATH]; /* resolved: absolute, or relative to the process's cwd */
    char metrics[SPEC_MAX_METRICS_ADDR]; /* coordinator.metrics HOST:PORT, "" when off */
    spec_placement placement;
    int redundant_experts;     /* extra expert slots per layer (placement eplb) */
    int expert_groups;         /* expert groups for hierarchical eplb (default 1: none) */
    int window_steps;          /* steps the load statistics cover (default 1000) */
    int rebalance_every_steps; /* 0: off; else a rebalance is tried every N steps */
    spec_dispatch dispatch;
    spec_data_plane data_plane;
    spec_rejoin rejoin;
    int max_experts_per_worker; /* 0: no limit; else the most experts a failover may give one */
    spec_gpu_gemm gpu_gemm;     /* default exact */
    /* security: (docs/operations.md "Security"): CURVE on every socket. Paths resolved like
     * model.path (relative to the spec's directory). */
    bool secure;
    char coordinator_key[EP_MAX_PATH]; /* the coordinator's secret key (NAME.key, mode 0600) */
    char worker_keys[EP_MAX_PATH];     /* a directory with NAME.pub for every worker */
    char operator_keys[EP_MAX_PATH];   /* a directory of *.pub: who may use epmoectl */
    /* a directory of *.pub: the clients (libepmoe) that may submit requests and read
     * CLIENT_INFO, nothing else; "" when absent (no client key is admitted) */
    char client_keys[EP_MAX_PATH];
    spec_pos security_pos, coordinator_key_pos, worker_keys_pos, operator_keys_pos;
    spec_pos client_keys_pos;
    int n_workers;
    spec_worker *workers; /* [n_workers], index == rank */
    int n_nodes;
    spec_node *nodes; /* [n_nodes] in file order */
    spec_pos pos;     /* the top-level mapping */
    spec_pos listen_pos, admin_pos, model_pos, placement_pos, nodes_pos, max_experts_pos;
    spec_pos metrics_pos, redundant_pos, groups_pos;
    spec_pos dispatch_pos, data_plane_pos;
} spec_cluster;

/* Read and parse a spec file (at most SPEC_MAX_BYTES). A relative model path is resolved
 * against the real (symlink-free, absolute) directory of path, so it stays valid after the
 * daemon changes directory. */
spec_cluster *spec_load(const char *path, ep_err *err);

/* Parse spec text (len bytes, need not be NUL-terminated). file names the source in messages;
 * a relative model path is resolved against dirname(file) as written (kept relative when file
 * has no directory part). file may be NULL ("<spec>"). */
spec_cluster *spec_parse(const char *text, size_t len, const char *file, ep_err *err);

/* Free a spec; tolerates NULL and clears the caller's pointer. */
void spec_free(spec_cluster **self_p);

/* The worker with that name, or NULL. */
const spec_worker *spec_find_worker(const spec_cluster *s, const char *name);

/* Cross-check the cluster with the model's routed expert count: every placement needs
 * n_workers <= n_experts + redundant_experts (each worker owns at least one expert), contiguous
 * also needs n_experts % n_workers == 0 (the error points at the spec's nodes: key);
 * redundant_experts needs placement eplb and at most one replica of an expert per worker
 * (E + redundant <= E x P); expert_groups must divide n_experts; a max_experts_per_worker must
 * hold the spec's own placement (ceil((E + redundant) / P) experts). */
int spec_check_experts(const spec_cluster *s, int n_experts, ep_err *err);

const char *spec_placement_name(spec_placement p);   /* "contiguous" / "round_robin" / "eplb" */
const char *spec_dispatch_name(spec_dispatch d);     /* "fp8" / "bf16" */
const char *spec_data_plane_name(spec_data_plane p); /* "zmq" / "nccl" */
const char *spec_rejoin_name(spec_rejoin r);         /* "restore" / "stay" */
const char *spec_gpu_gemm_name(spec_gpu_gemm g);     /* "exact" / "fast" */

#endif
