/*
 * stale_lib — a libepmoe client across a model change (issue 23, defect 1), for
 * test_model_change.sh: it opens a client, sizes its buffers from epmoe_info (H, k) with guard
 * bytes on both sides of each (in an allocation of its own, so ASan sees a write past the guards
 * too), makes one request that must succeed, says so by creating READY, waits for GO (the test
 * restarted the coordinator on another checkpoint meanwhile), lets the library hear of the new
 * model in the background (3 s), then submits until a submit or a
 * request says EPMOE_ESTALE. Exit 0 when it did within 60 s, no guard byte changed, and
 * epmoe_info_get still gives the model of open with EPMOE_ESTALE; 1 otherwise, naming why.
 *
 *   stale_lib COORDINATOR LAYER READY GO
 */
#include <epmoe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GUARD      4096
#define GUARD_BYTE 0xA5
#define T          4

typedef struct guarded {
    unsigned char *base;
    size_t n;
} guarded;

static void *guarded_new(guarded *g, size_t n)
{
    g->n = n;
    g->base = malloc(n + 2 * GUARD);
    if (g->base == NULL) {
        fprintf(stderr, "stale_lib: out of memory\n");
        exit(1);
    }
    memset(g->base, GUARD_BYTE, n + 2 * GUARD);
    return g->base + GUARD;
}

static size_t guarded_damage(const guarded *g)
{
    size_t bad = 0;
    for (size_t i = 0; i < GUARD; i++)
        bad += (g->base[i] != GUARD_BYTE) + (g->base[GUARD + g->n + i] != GUARD_BYTE);
    return bad;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef struct bufs {
    guarded g[4];
    uint16_t *hidden, *out;
    int64_t *ids;
    int32_t *topk_ids;
    float *topk_w;
} bufs;

/* One request on b: its status (and err). */
static int call(epmoe_client *c, const epmoe_info *info, uint32_t layer, bufs *b, epmoe_error *err)
{
    epmoe_submit_args a = EPMOE_SUBMIT_ARGS_INIT;
    a.layer = layer;
    a.n_tokens = T;
    a.hidden_size = info->hidden_size;
    a.hidden = b->hidden;
    a.token_ids = b->ids;
    a.out = b->out;
    a.topk_ids = b->topk_ids;
    a.topk_weights = b->topk_w;
    a.timeout_ms = 5000;
    epmoe_request *rq = NULL;
    int rc = epmoe_submit(c, &a, &rq, err);
    if (rc == EPMOE_OK)
        rc = epmoe_wait(rq, -1, err);
    epmoe_request_free(&rq);
    return rc;
}

static int wait_file(const char *path, double seconds)
{
    for (double until = now_s() + seconds; now_s() < until; usleep(50 * 1000))
        if (access(path, F_OK) == 0)
            return 0;
    return -1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: stale_lib COORDINATOR LAYER READY GO\n");
        return 64;
    }
    epmoe_options o = EPMOE_OPTIONS_INIT;
    o.coordinator = argv[1];
    o.connect_timeout_ms = 10000;
    epmoe_client *c = NULL;
    epmoe_error err;
    epmoe_info info, later;
    uint32_t layer;
    if (epmoe_open(&o, &c, &err) != EPMOE_OK || epmoe_info_get(c, &info, &err) != EPMOE_OK ||
        epmoe_layer_index(&info, argv[2], &layer, &err) != EPMOE_OK) {
        fprintf(stderr, "stale_lib: %s\n", err.message);
        return 1;
    }
    size_t H = info.hidden_size, K = info.topk;
    bufs b;
    b.hidden = guarded_new(&b.g[0], T * H * 2);
    b.out = guarded_new(&b.g[1], T * H * 2);
    b.ids = guarded_new(&b.g[2], T * 8);
    b.topk_ids = guarded_new(&b.g[3], T * K * 4);
    b.topk_w = malloc(T * K * 4);
    for (size_t i = 0; i < T * H; i++)
        b.hidden[i] = (uint16_t)(0x3C00 + (i * 37 % 200)); /* 1.0 .. ~1.8 */
    for (int t = 0; t < T; t++)
        b.ids[t] = t * 7; /* below every vocabulary the test uses */
    int rc = call(c, &info, layer, &b, &err);
    if (rc != EPMOE_OK) {
        fprintf(stderr, "stale_lib: the first request: %s: %s\n", epmoe_strerror(rc), err.message);
        return 1;
    }
    printf("stale_lib: open on H %zu, config %016llx: ok\n", H,
           (unsigned long long)info.config_hash);
    fflush(stdout);
    FILE *f = fopen(argv[3], "w");
    if (f)
        fclose(f);
    if (wait_file(argv[4], 300) != 0) {
        fprintf(stderr, "stale_lib: no %s within 300 s\n", argv[4]);
        return 1;
    }
    /* the library's background CLIENT_INFO (every 2 s while idle) hears of the new model
     * before the next request is built: the case that read and wrote past the buffers */
    sleep(3);
    int n = 0, n_ok = 0;
    for (double until = now_s() + 60; rc != EPMOE_ESTALE && now_s() < until; n++) {
        rc = call(c, &info, layer, &b, &err);
        n_ok += rc == EPMOE_OK;
        if (rc != EPMOE_ESTALE)
            usleep(100 * 1000);
    }
    size_t damage = 0;
    for (int i = 0; i < 4; i++)
        damage += guarded_damage(&b.g[i]);
    printf("stale_lib: %d requests after the change (%d ok), last: %s: %s; %zu guard bytes "
           "changed\n",
           n, n_ok, epmoe_strerror(rc), err.message, damage);
    int info_rc = epmoe_info_get(c, &later, &err);
    int bad = rc != EPMOE_ESTALE || damage != 0 || info_rc != EPMOE_ESTALE ||
              later.hidden_size != info.hidden_size || later.config_hash != info.config_hash;
    if (info_rc != EPMOE_ESTALE || later.config_hash != info.config_hash)
        fprintf(stderr, "stale_lib: epmoe_info_get after the change: %s, config %016llx\n",
                epmoe_strerror(info_rc), (unsigned long long)later.config_hash);
    epmoe_close(&c);
    for (int i = 0; i < 4; i++)
        free(b.g[i].base);
    free(b.topk_w);
    return bad;
}
