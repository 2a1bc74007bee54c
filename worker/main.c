/*
 * epmoe-worker — one worker daemon per device: registers with the coordinator, loads its expert
 * shard, and runs MoE steps with its peers (docs/operations.md "epmoe-worker").
 *
 * Usage: epmoe-worker --coordinator ENDPOINT --name NAME [--threads N] [--device cpu|cuda:N]
 *                     [--key FILE --coordinator-key FILE.pub]
 *        epmoe-worker --version
 * Exit codes: 0 stopped (SIGTERM, SIGINT, SHUTDOWN), 64 usage (including an endpoint that is
 * not one, a key file that cannot be used), 70 cannot start, 78 refused by the coordinator or
 * a device this host or build cannot serve.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "common/knobs.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/sdnotify.h"
#include "common/version.h"
#include "common/wire.h"
#include "kernels/isa.h"
#include "kernels/moe_backend.h"
#include "worker/control.h"
#include "worker/serve.h"
#include "worker/transport_comm_lib.h"

#define WORKER_EXIT_USAGE 64

static void usage(FILE *out)
{
    fprintf(out,
            "usage: epmoe-worker --coordinator ENDPOINT --name NAME [--threads N] [--device DEV]\n"
            "                    [--key FILE --coordinator-key FILE.pub]\n"
            "       epmoe-worker --version\n"
            "\n"
            "  --coordinator ENDPOINT  the coordinator's worker endpoint (coordinator.listen),\n"
            "                          e.g. tcp://10.0.0.1:7400\n"
            "                          (default $EPMOE_COORDINATOR_LISTEN)\n"
            "  --name NAME             this worker's name in the cluster spec\n"
            "  --threads N             expert GEMM threads (default: one per online CPU)\n"
            "  --device DEV            the device to run on: cpu (default) or cuda:N\n"
            "  --key FILE              this worker's secret key (epmoectl keygen; mode 0600):\n"
            "                          CURVE on every socket, for a spec with security:\n"
            "  --coordinator-key FILE  the coordinator's public key (its .pub file)\n"
            "  --version               print the version and build, exit 0\n"
            "\n"
            "signals: SIGTERM/SIGINT stop (exit 0); SIGHUP is ignored\n"
            "exit codes: 0 stopped, 64 usage, 70 cannot start, 78 refused by the coordinator\n"
            "  (unknown worker name, config hash mismatch, device or key not the spec's, another\n"
            "  live process with this name) or a device this host or build cannot serve (no such\n"
            "  GPU, a build without CUDA)\n");
    knob_usage(out, KNOB_WORKER);
}

static int parse_threads(const char *v, int *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 4096)
        return -1;
    *out = (int)n;
    return 0;
}

typedef struct worker_args {
    wctl_options opt;
    const char *key_path, *coordinator_key_path;
} worker_args;

/* The options that take a value (an unknown one is "unknown", not "needs a value"). */
static bool known_option(const char *o)
{
    static const char *const known[] = {"--coordinator",     "--name",   "--device", "--key",
                                        "--coordinator-key", "--threads"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(o, known[i]) == 0)
            return true;
    return false;
}

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, worker_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(o, "--version") == 0) {
            ep_version_print("epmoe-worker");
            return 0;
        }
        if (!known_option(o)) {
            fprintf(stderr, "epmoe-worker: unknown option %s (see --help)\n", o);
            return WORKER_EXIT_USAGE;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "epmoe-worker: %s needs a value (see --help)\n", o);
            return WORKER_EXIT_USAGE;
        }
        const char *v = argv[++i];
        if (strcmp(o, "--coordinator") == 0) {
            a->opt.coordinator = v;
        } else if (strcmp(o, "--name") == 0) {
            a->opt.name = v;
        } else if (strcmp(o, "--device") == 0) {
            a->opt.device = v;
        } else if (strcmp(o, "--key") == 0) {
            a->key_path = v;
        } else if (strcmp(o, "--coordinator-key") == 0) {
            a->coordinator_key_path = v;
        } else if (strcmp(o, "--threads") == 0) {
            if (parse_threads(v, &a->opt.threads) != 0) {
                fprintf(stderr, "epmoe-worker: --threads %s: expected 1..4096\n", v);
                return WORKER_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "epmoe-worker: unknown option %s (see --help)\n", o);
            return WORKER_EXIT_USAGE;
        }
    }
    return -1;
}

/* The options that need more than presence; an exit code or -1. */
static int check_args(worker_args *a, auth_keypair *kp, uint8_t *server)
{
    ep_err err = {0};
    wctl_options *o = &a->opt;
    if (o->coordinator == NULL || o->coordinator[0] == '\0') {
        fprintf(stderr, "epmoe-worker: --coordinator is required (or $EPMOE_COORDINATOR_LISTEN; "
                        "see --help)\n");
        return WORKER_EXIT_USAGE;
    }
    if (o->name == NULL || o->name[0] == '\0') {
        fprintf(stderr, "epmoe-worker: --name is required (see --help)\n");
        return WORKER_EXIT_USAGE;
    }
    if (wire_check_endpoint(o->coordinator, &err) != 0) {
        fprintf(stderr, "epmoe-worker: --coordinator %s\n", err.msg);
        return WORKER_EXIT_USAGE;
    }
    if (strlen(o->name) >= EP_MAX_NAME) {
        fprintf(stderr, "epmoe-worker: --name is longer than %d bytes\n", EP_MAX_NAME - 1);
        return WORKER_EXIT_USAGE;
    }
    mb_device_kind kind;
    int ordinal;
    if (mb_parse_device(o->device, &kind, &ordinal, &err) < 0) {
        fprintf(stderr, "epmoe-worker: --device: %s\n", err.msg);
        return WORKER_EXIT_USAGE;
    }
    if ((a->key_path == NULL) != (a->coordinator_key_path == NULL)) {
        fprintf(stderr, "epmoe-worker: --key and --coordinator-key go together\n");
        return WORKER_EXIT_USAGE;
    }
    if (a->key_path == NULL)
        return -1;
    if (auth_load_secret(a->key_path, kp, &err) != 0 ||
        auth_load_public(a->coordinator_key_path, server, &err) != 0) {
        fprintf(stderr, "epmoe-worker: %s\n", err.msg);
        return WORKER_EXIT_USAGE;
    }
    o->key = kp;
    o->coordinator_key = server;
    return -1;
}

/* The environment, read once (common/knobs.h): a bad value is a usage error, like an option's. */
static int load_knobs(knob_values *kv)
{
    ep_err err = {0};
    if (knob_load(kv, KNOB_WORKER, &err) < 0) {
        fprintf(stderr, "epmoe-worker: %s\n", err.msg);
        return WORKER_EXIT_USAGE;
    }
    log_init("epmoe-worker", kv->debug, kv->journal_stream != NULL);
    sdn_init(&(sdn_env){kv->notify_socket, kv->watchdog_usec, kv->watchdog_pid});
    tpc_nccl_set_library(kv->nccl_library);
    /* the kernels read no environment: their ISA cap is handed over once, before any runs */
    isa_set_cap(isa_cap_parse(kv->isa, kv->gemm));
    srv_set_failover(!kv->test_no_failover);
    return -1;
}

int main(int argc, char **argv)
{
    knob_values kv;
    int krc = load_knobs(&kv);
    if (krc >= 0)
        return krc;
    worker_args a = {.opt = {.coordinator = kv.coordinator_listen,
                             .device = "cpu",
                             .metrics_per_layer = kv.metrics_per_layer}};
    auth_keypair kp;
    uint8_t server[AUTH_KEY_BYTES];
    int rc = parse_args(argc, argv, &a);
    if (rc < 0)
        rc = check_args(&a, &kp, server);
    mb_cuda_tuning_from_knobs(&a.opt.cuda, &kv);
    if (rc < 0)
        rc = wctl_run(&a.opt);
    explicit_bzero(&kp, sizeof kp);
    return rc;
}
