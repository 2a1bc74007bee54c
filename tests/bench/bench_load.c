/*
 * bench_load.c — loading at memory speed: a warm load of a checkpoint's layers (the files in the
 * page cache) as a worker does it (shard_load: read and check every tensor, pack it on the
 * backend's threads) beside a memcpy of the same bytes into fresh memory, measured in the same
 * run (issue 27; docs/performance.md).
 *
 *   bench_load --model DIR [--threads N] [--runs R]
 *
 * Each round runs in a fresh child process (as a worker starting or forward --local: nothing of
 * its memory touched by a load before; in one process glibc may hand an earlier round's freed
 * memory out again, which flatters a load): first the baseline, per layer its tensors' bytes
 * memcpy'd from the files' mapping into fresh memory (one anonymous mmap, in the pages the system
 * gives by default, so the kernel faults and zeroes it as it does a load's; then unmapped), then
 * a load of every layer with shard_load, each layer timed by the load's progress (a layer's time
 * runs from the end of the one before). The first layer of a load reads into memory the process
 * has not touched yet; the later ones show what a shard of many layers costs per layer. Every
 * column is the best of --runs rounds (the machine may be shared: the best round is the least
 * disturbed), as GB/s of checkpoint bytes, and the ratio load ÷ memcpy is taken on them (1.00:
 * loading runs at the speed of a memcpy into fresh memory). The load average at the start and
 * the end is printed with the result.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_bounds.h"
#include "common/checkpoint.h"
#include "common/model_config.h"
#include "common/safetensors_model.h"
#include "kernels/moe_backend.h"
#include "shard/shard.h"
#include "tests/isa_env.h"

#define MAX_LAYERS 128
#define MAX_RUNS   32

typedef struct lctx {
    double t_last;
    int layer;
    double *t; /* [layers]: seconds of each layer's load */
} lctx;

/* shard_load's progress: a layer is done when layers_done passes it */
static int on_progress(void *vctx, uint64_t done, uint64_t total, int layers_done, int layers)
{
    (void)done;
    (void)total;
    (void)layers;
    lctx *p = vctx;
    double now = bench_now();
    while (p->layer < layers_done) {
        p->t[p->layer++] = now - p->t_last;
        p->t_last = now;
    }
    return 0;
}

/* Whether tensor i is one of layer pfx's MoE tensors (what a load of every expert reads): its
 * ffn_norm and everything under its ffn. (the gate, the experts, the shared expert). */
static int layer_tensor(const st_model *m, int i, const char *pfx)
{
    const st_tensor *t = st_model_at(m, i);
    size_t n = strlen(pfx);
    return strncmp(t->name, pfx, n) == 0 &&
           (strncmp(t->name + n, "ffn.", 4) == 0 || strncmp(t->name + n, "ffn_norm.", 9) == 0);
}

/* The baseline: layer L's tensors memcpy'd into one fresh allocation; seconds. */
static double memcpy_fresh(const st_model *m, const char *pfx, uint64_t bytes)
{
    double a = bench_now();
    /* mmap, not malloc: glibc may serve a large malloc from heap memory an earlier load freed,
     * which is not fresh (a baseline 3x faster after the first round showed it) */
    size_t len = bytes ? (size_t)bytes : 1;
    uint8_t *dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED) {
        fprintf(stderr, "bench_load: out of memory for %llu bytes\n", (unsigned long long)bytes);
        exit(1);
    }
    uint64_t at = 0;
    for (int i = 0; i < st_model_count(m); i++)
        if (layer_tensor(m, i, pfx)) {
            const st_tensor *t = st_model_at(m, i);
            if (t->nbytes > bytes - at) { /* the load reads fewer bytes than this layer has */
                fprintf(stderr,
                        "bench_load: %s: the tensors under %s exceed the %llu bytes a "
                        "load reads\n",
                        t->name, pfx, (unsigned long long)bytes);
                exit(1);
            }
            memcpy(dst + at, t->data, t->nbytes);
            at += t->nbytes;
        }
    double s = bench_now() - a;
    __asm__ volatile("" : : "r"(dst) : "memory"); /* the copy happens */
    munmap(dst, len);
    return s;
}

static double load_avg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static double min_of(const double *t, int n)
{
    double b = t[0];
    for (int i = 1; i < n; i++)
        b = t[i] < b ? t[i] : b;
    return b;
}

/* The page cache holds the checkpoint: every tensor of every layer read once. */
static void warm_cache(const st_model *m)
{
    volatile uint8_t sink = 0;
    for (int i = 0; i < st_model_count(m); i++) {
        const st_tensor *t = st_model_at(m, i);
        const uint8_t *p = t->data;
        for (uint64_t j = 0; j < t->nbytes; j += 4096)
            sink ^= p[j];
    }
    (void)sink;
}

typedef struct bench {
    mc_config c;
    st_model *m;
    int L, runs;
    uint64_t bytes[MAX_LAYERS];
    char pfx[MAX_LAYERS][64];
    double cp[MAX_LAYERS][MAX_RUNS], ld[MAX_LAYERS][MAX_RUNS];
} bench;

/* One round in a fresh child process (a worker starting, forward --local): nothing of the
 * process's memory has been touched by a load before, as in the case issue 27 measured; an
 * earlier round's freed memory, which glibc may hand out again, would flatter the load. The
 * child sends its times back through a pipe. */
static void round_child(bench *b, const mb_options *o, const uint8_t *want, int fd)
{
    ep_err err = {0};
    double t[2 * MAX_LAYERS];
    mb_layer **out = calloc((size_t)b->L, sizeof *out);
    mb_backend *be = mb_create(o, &err);
    if (!out || !be) {
        fprintf(stderr, "bench_load: %s\n", be ? "out of memory" : err.msg);
        _exit(1);
    }
    for (int l = 0; l < b->L; l++)
        t[b->L + l] = memcpy_fresh(b->m, b->pfx[l], b->bytes[l]);
    lctx p = {.t = t, .t_last = bench_now()};
    if (shard_load(be, b->m, &b->c, want, NULL, 1, out, on_progress, &p, &err) != 0) {
        fprintf(stderr, "bench_load: %s\n", err.msg);
        _exit(1);
    }
    size_t n = 2 * (size_t)b->L * sizeof t[0];
    _exit(write(fd, t, n) == (ssize_t)n ? 0 : 1);
}

static void bench_round(bench *b, int r, const mb_options *o, const uint8_t *want)
{
    int fd[2];
    double t[2 * MAX_LAYERS];
    if (pipe(fd) < 0) {
        perror("bench_load: pipe");
        exit(1);
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        round_child(b, o, want, fd[1]);
    }
    close(fd[1]);
    size_t n = 2 * (size_t)b->L * sizeof t[0];
    ssize_t got = pid > 0 ? read(fd[0], t, n) : -1;
    int status = 0;
    close(fd[0]);
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || status != 0 || got != (ssize_t)n) {
        fprintf(stderr, "bench_load: round %d failed\n", r + 1);
        exit(1);
    }
    for (int l = 0; l < b->L; l++) {
        b->ld[l][r] = t[l];
        b->cp[l][r] = t[b->L + l];
    }
    fprintf(stderr, "round %d/%d done\n", r + 1, b->runs);
}

static void print_result(const bench *b, int threads, double load0, double load1)
{
    printf("bench_load: %s, %d layers (H %d, I %d, %d %s experts); %d threads; best of %d "
           "rounds; load average %.1f at the start, %.1f at the end\n\n",
           st_model_dir(b->m), b->L, b->c.hidden_size, b->c.moe_intermediate_size,
           b->c.n_routed_experts, mc_dtype_name(b->c.expert_dtype), threads, b->runs, load0, load1);
    printf("| layer | checkpoint bytes | memcpy into fresh memory | load (shard_load) | load ÷ "
           "memcpy |\n|---|---|---|---|---|\n");
    for (int l = 0; l < b->L; l++) {
        double c = min_of(b->cp[l], b->runs), d = min_of(b->ld[l], b->runs);
        double g = (double)b->bytes[l] / 1e9;
        printf("| %d%s | %.2f GB | %.2f GB/s | %.2f GB/s | **%.2f** |\n", l,
               l == 0 ? " (first)" : "", g, g / c, g / d, c / d);
    }
}

int main(int argc, char **argv)
{
    test_isa_cap_from_env();
    const char *dir = NULL;
    int threads = 0;
    static bench b = {.runs = 3};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs"))
            b.runs = atoi(argv[i + 1]);
        else
            dir = NULL, i = argc;
    }
    if (!dir || argc % 2 == 0 || b.runs < 1 || b.runs > MAX_RUNS) {
        fprintf(stderr, "usage: bench_load --model DIR [--threads N] [--runs R (<= %d)]\n",
                MAX_RUNS);
        return 64;
    }
    ep_err err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mb_options o = {.device = "cpu", .threads = threads};
    if (mc_load(path, &b.c, &err) < 0 || !(b.m = st_model_open(dir, &err))) {
        fprintf(stderr, "bench_load: %s\n", err.msg);
        return 1;
    }
    b.L = mc_num_layers(&b.c);
    if (b.L > MAX_LAYERS) {
        fprintf(stderr, "bench_load: %s has %d layers, at most %d\n", dir, b.L, MAX_LAYERS);
        return 64;
    }
    for (int l = 0; l < b.L; l++) {
        ck_layer_prefix(&b.c, l, b.pfx[l], sizeof b.pfx[l]);
        b.bytes[l] = shard_layer_bytes(b.m, &b.c, l, NULL, NULL, false);
    }
    size_t E = (size_t)b.c.n_routed_experts;
    uint8_t *want = malloc((size_t)b.L * E);
    if (!want)
        return 1;
    memset(want, 1, (size_t)b.L * E);
    warm_cache(b.m);
    double load0 = load_avg();
    for (int r = 0; r < b.runs; r++)
        bench_round(&b, r, &o, want);
    print_result(&b, threads, load0, load_avg());
    free(want);
    st_model_close(&b.m);
    return 0;
}
