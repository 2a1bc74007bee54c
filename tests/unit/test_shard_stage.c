/*
 * test_shard_stage.c — the memory a load reads the checkpoint into (shard/stage.c): its chunks
 * are reused from one layer to the next, and a load's copies do not fault in 4 KiB pages of
 * fresh memory (issue 27: a warm load ran at 0.2-0.3 of a memcpy into fresh memory, the kernel
 * zeroing the copies page by page and then the packed weights again).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "kernels/moe_backend.h"
#include "moe_gen.h"
#include "shard/shard.h"
#include "test.h"

#define MIB ((size_t)1 << 20)

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

TEST(stage_hands_out_the_same_memory_after_a_reset)
{
    shard_stage *s = shard_stage_create();
    CHECK(s != NULL);
    size_t sizes[] = {10 * MIB, 3, 300 * MIB, MIB, 0, 5000};
    void *first[6];
    for (int i = 0; i < 6; i++) {
        first[i] = shard_stage_alloc(s, sizes[i]);
        CHECK(first[i] != NULL);
        CHECK_EQ((uintptr_t)first[i] % 64, 0);
        memset(first[i], 0x5a, sizes[i]); /* each its own bytes: none overlaps another */
    }
    CHECK((uint8_t *)first[1] >= (uint8_t *)first[0] + sizes[0]);
    size_t bytes = shard_stage_bytes(s);
    shard_stage_reset(s);
    for (int i = 0; i < 6; i++)
        CHECK(shard_stage_alloc(s, sizes[i]) == first[i]); /* the next layer, the same pages */
    CHECK_EQ(shard_stage_bytes(s), bytes);
    shard_stage_free(&s);
    CHECK(s == NULL);
    shard_stage_free(&s); /* twice: nothing */
}

/* Minor faults of touching n bytes in huge-page-hinted memory, as the stage allocates it: far
 * fewer than n / 4 KiB where the system gives transparent huge pages now. */
static long huge_control_faults(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 2 * MIB, n) != 0)
        return -1;
    madvise(p, n, MADV_HUGEPAGE);
    long f0 = minor_faults();
    memset(p, 1, n);
    long f = minor_faults() - f0;
    free(p);
    return f;
}

/* The defect: every tensor a load read went into its own malloc, faulted in 4 KiB pages of
 * fresh memory (229k faults for a 0.88 GB layer; sys time 3-5x user). A load of two layers now
 * faults its copies in huge pages once; the packed weights (2 MiB each here) in huge pages as
 * before. */
TEST(load_copies_fault_huge_pages_once)
{
#ifdef __SANITIZE_ADDRESS__
    SKIP("ASan's shadow memory faults in 4 KiB pages of its own (the normal build counts)");
#endif
    size_t control = 64 * MIB;
    if (huge_control_faults(control) > (long)(control / 4096 / 4))
        SKIP("this system gives no transparent huge pages now (MADV_HUGEPAGE)");
    mc_config c = gen_config(MC_FP4, 2048, 2048, 8, 6, 1000);
    c.num_hidden_layers = 2;
    c.num_hash_layers = 0;
    c.num_nextn_predict_layers = 0;
    gen_opts o = {.seed = 27};
    gen_model *g = gen_model_create(&c, &o);
    char dir[] = "/tmp/epmoe_stage_XXXXXX";
    ep_err err = {0};
    st_model *m = NULL;
    mb_options mo = {.device = "cpu", .threads = 1};
    mb_backend *be = mb_create(&mo, &err);
    CHECK(g && be && mkdtemp(dir) && gen_model_write(g, dir, &err) == 0 &&
          (m = st_model_open(dir, &err)) != NULL);
    if (!m) {
        printf("  %s\n", err.msg);
        return;
    }
    uint64_t copies = shard_layer_bytes(m, &c, 0, NULL, NULL, false) +
                      shard_layer_bytes(m, &c, 1, NULL, NULL, false);
    uint8_t want[2 * 8];
    memset(want, 1, sizeof want);
    mb_layer *out[2] = {NULL, NULL};
    long f0 = minor_faults();
    CHECK_EQ(shard_load(be, m, &c, want, NULL, 1, out, NULL, NULL, &err), 0);
    long faults = minor_faults() - f0;
    /* the old loader: >= copies / 4 KiB (30k here); now a few hundred huge pages and the
     * small scale tables */
    if (faults > (long)(copies / 4096 / 4))
        TEST_FAIL_AT("a load of %llu checkpoint bytes took %ld minor faults (4 KiB pages: %llu)",
                     (unsigned long long)copies, faults, (unsigned long long)(copies / 4096));
    CHECK(out[0] != NULL && out[1] != NULL);
    mb_layer_free(&out[0]);
    mb_layer_free(&out[1]);
    st_model_close(&m);
    gen_model_remove(dir);
    gen_model_free(&g);
    mb_destroy(&be);
}

int main(void)
{
    RUN(stage_hands_out_the_same_memory_after_a_reset);
    RUN(load_copies_fault_huge_pages_once);
    return test_report();
}
