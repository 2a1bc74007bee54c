/*
 * epmoe-worker — one worker daemon per device: registers with the coordinator, loads its expert
 * shard, and runs MoE steps with its peers (docs/operations.md "epmoe-worker").
 *
 * Usage: epmoe-worker --coordinator ENDPOINT --name NAME [--threads N] [--device cpu|cuda:N]
 * Exit codes: 0 stopped (SIGTERM, SIGINT, SHUTDOWN), 64 usage, 70 cannot start, 78 refused by
 * the coordinator (unknown worker name or config hash mismatch: fix the spec or the binary).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/log.h"
#include "kernels/moe_backend.h"
#include "worker/control.h"

#define WORKER_EXIT_USAGE 64

static void usage(FILE *out)
{
    fprintf(out,
            "usage: epmoe-worker --coordinator ENDPOINT --name NAME [--threads N] [--device DEV]\n"
            "\n"
            "  --coordinator ENDPOINT  the coordinator's worker endpoint (coordinator.listen),\n"
            "                          e.g. tcp://10.0.0.1:7400\n"
            "                          (default $EPMOE_COORDINATOR_LISTEN)\n"
            "  --name NAME             this worker's name in the cluster spec\n"
            "  --threads N             expert GEMM threads (default: one per online CPU)\n"
            "  --device DEV            the device to run on: cpu (default) or cuda:N\n"
            "\n"
            "signals: SIGTERM/SIGINT stop (exit 0); SIGHUP is ignored\n"
            "exit codes: 0 stopped, 64 usage, 70 cannot start, 78 refused by the coordinator\n"
            "  (unknown worker name or config hash mismatch) or a device this host or build\n"
            "  cannot serve (no such GPU, a build without CUDA)\n"
            "environment: EPMOE_DEBUG=net,load,step,data,kernel (debug logs),\n"
            "  EPMOE_ISA=ref|avx2|avx512 (cap the CPU kernels' instruction set; default: the\n"
            "  best this CPU has)\n");
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

int main(int argc, char **argv)
{
    log_init("epmoe-worker");
    wctl_options opt = {.coordinator = getenv("EPMOE_COORDINATOR_LISTEN"), .device = "cpu"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "epmoe-worker: %s needs a value (see --help)\n", a);
            return WORKER_EXIT_USAGE;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--coordinator") == 0) {
            opt.coordinator = v;
        } else if (strcmp(a, "--name") == 0) {
            opt.name = v;
        } else if (strcmp(a, "--device") == 0) {
            opt.device = v;
        } else if (strcmp(a, "--threads") == 0) {
            if (parse_threads(v, &opt.threads) != 0) {
                fprintf(stderr, "epmoe-worker: --threads %s: expected 1..4096\n", v);
                return WORKER_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "epmoe-worker: unknown option %s (see --help)\n", a);
            return WORKER_EXIT_USAGE;
        }
    }
    if (opt.coordinator == NULL || opt.coordinator[0] == '\0' || opt.name == NULL ||
        opt.name[0] == '\0') {
        fprintf(stderr, "epmoe-worker: --coordinator and --name are required (see --help)\n");
        return WORKER_EXIT_USAGE;
    }
    if (strlen(opt.name) >= EP_MAX_NAME) {
        fprintf(stderr, "epmoe-worker: --name is longer than %d bytes\n", EP_MAX_NAME - 1);
        return WORKER_EXIT_USAGE;
    }
    mb_device_kind kind;
    int ordinal;
    ep_err err;
    if (mb_parse_device(opt.device, &kind, &ordinal, &err) < 0) {
        fprintf(stderr, "epmoe-worker: --device: %s\n", err.msg);
        return WORKER_EXIT_USAGE;
    }
    /* the kernels would ignore a misspelt cap: refuse it here instead */
    const char *isa = getenv("EPMOE_ISA");
    gemm_impl cap;
    if (isa && (gemm_impl_parse(isa, &cap) < 0 || cap == GEMM_IMPL_AUTO)) {
        fprintf(stderr, "epmoe-worker: EPMOE_ISA=%s: expected ref, avx2 or avx512\n", isa);
        return WORKER_EXIT_USAGE;
    }
    return wctl_run(&opt);
}
