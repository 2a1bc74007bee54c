/*
 * test_cuda_backend.c — the CUDA backend on a real device against the CPU backend, through the
 * seam a worker uses (tests/unit/backend_check.h): every layer kind, both expert dtypes, both
 * activation-scale kinds, several token counts; exact mode bit for bit, fast mode within spec
 * §7's tolerance with identical top-k ids. One model has V4-Flash's shapes (H 4096, I 2048,
 * 256 experts, top-6; 16 experts materialised and routing steered onto them). Exits 77 without
 * a CUDA device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_check.h"
#include "common/knobs.h"
#include "kernels/moe_backend.h"
#include "moe_gen.h"
#include "test.h"

static bool have_device;

static mb_backend *make(const char *device, mb_gemm_mode mode)
{
    ep_err err = {0};
    mb_options o = {.device = device, .threads = 0, .gemm = mode};
    /* the EPMOE_CUDA_* knobs as check.sh sets them (EPMOE_CUDA_WAIT_S) */
    knob_values kv;
    if (knob_load(&kv, KNOB_WORKER, &err) == 0)
        mb_cuda_tuning_from_knobs(&o.cuda, &kv);
    mb_backend *be = mb_create(&o, &err);
    if (!be)
        printf("  %s: %s\n", device, err.msg);
    return be;
}

static int model_dir(char *dir, size_t cap, mc_config *c, const gen_opts *go)
{
    ep_err err = {0};
    snprintf(dir, cap, "/tmp/epmoe_cuda_backend_XXXXXX");
    gen_model *g = gen_model_create(c, go);
    int rc = g && mkdtemp(dir) && gen_model_write(g, dir, &err) == 0 ? 0 : -1;
    if (rc)
        printf("  model: %s\n", err.msg);
    gen_model_free(&g);
    return rc;
}

static void run_model(mc_config *c, const gen_opts *go, const int *Ts, int n_T, int max_layers)
{
    char dir[64];
    if (model_dir(dir, sizeof dir, c, go) != 0) {
        CHECK(0);
        return;
    }
    mb_backend *ref = make("cpu", MB_GEMM_EXACT);
    for (int mode = 0; mode < 2; mode++) {
        mb_backend *be = make("cuda:0", mode ? MB_GEMM_FAST : MB_GEMM_EXACT);
        CHECK(be && ref);
        if (be && ref) {
            bchk_opts o = {.exact = mode == 0,
                           .tol = 1e-3,
                           .Ts = Ts,
                           .n_T = n_T,
                           .max_layers = max_layers,
                           .seed = 99 + (uint64_t)mode};
            int fails = bchk_compare(be, ref, dir, &o);
            if (fails)
                printf("  %s %s: %d comparisons failed\n", mb_name(be),
                       c->expert_dtype == MC_FP4 ? "fp4" : "fp8", fails);
            CHECK_EQ(fails, 0);
        }
        mb_destroy(&be);
    }
    mb_destroy(&ref);
    gen_model_remove(dir);
}

TEST(small_models_agree_with_the_cpu_backend)
{
    if (!have_device)
        SKIP("no CUDA device");
    static const int Ts[] = {1, 6, 64, 300};
    for (int dt = 0; dt < 2; dt++)
        for (int pow2 = 0; pow2 < 2; pow2++) {
            if (dt == 0 && !pow2)
                continue; /* Flash's activation scales are powers of two */
            mc_config c = gen_config(dt ? MC_FP8 : MC_FP4, 512, 256, 32, 4, 211);
            c.act_ue8m0 = pow2;
            gen_opts go = {.seed = 3 + (uint64_t)dt * 2 + (uint64_t)pow2};
            run_model(&c, &go, Ts, 4, 0);
        }
}

TEST(a_v4_flash_shaped_layer_agrees_with_the_cpu_backend)
{
    if (!have_device)
        SKIP("no CUDA device");
    static const int Ts[] = {1, 64, 256};
    /* one score-routed layer; 16 of 256 experts exist and the gate bias keeps routing on them */
    mc_config c = gen_config(MC_FP4, 4096, 2048, 256, 6, 1024);
    c.num_hidden_layers = 1;
    c.num_hash_layers = 0;
    c.num_nextn_predict_layers = 0;
    gen_opts go = {.seed = 17, .experts_made = 16, .bias_unmade = -1e4f};
    uint8_t want[256] = {0};
    memset(want, 1, 16);
    char dir[64];
    if (model_dir(dir, sizeof dir, &c, &go) != 0) {
        CHECK(0);
        return;
    }
    mb_backend *ref = make("cpu", MB_GEMM_EXACT);
    for (int mode = 0; mode < 2; mode++) {
        mb_backend *be = make("cuda:0", mode ? MB_GEMM_FAST : MB_GEMM_EXACT);
        CHECK(be && ref);
        if (be && ref) {
            bchk_opts o = {
                .exact = mode == 0, .tol = 1e-3, .Ts = Ts, .n_T = 3, .seed = 7, .want = want};
            CHECK_EQ(bchk_compare(be, ref, dir, &o), 0);
        }
        mb_destroy(&be);
    }
    mb_destroy(&ref);
    gen_model_remove(dir);
}

TEST(a_shard_that_does_not_fit_is_refused_with_both_sizes)
{
    if (!have_device)
        SKIP("no CUDA device");
    mb_backend *be = make("cuda:0", MB_GEMM_EXACT);
    if (!be)
        return;
    mc_config c = gen_config(MC_FP4, 4096, 2048, 256, 6, 1024);
    ep_err err = {0};
    CHECK_EQ(mb_reserve(be, &c, 1ull << 50, 4096, &err), -1);
    CHECK_STR_HAS(err.msg, "GiB of weights and ");
    CHECK_STR_HAS(err.msg, "GiB free of ");
    mb_destroy(&be);
}

int main(void)
{
    mb_device_kind kind;
    int ord;
    ep_err err;
    mb_backend *probe =
        mb_parse_device("cuda:0", &kind, &ord, &err) == 0 ? make("cuda:0", 0) : NULL;
    have_device = probe != NULL;
    if (probe) {
        mb_device_info info;
        mb_device(probe, &info);
        printf("device: %s (sm_%d%d)\n", info.name, info.sm_major, info.sm_minor);
    }
    mb_destroy(&probe);
    RUN(small_models_agree_with_the_cpu_backend);
    RUN(a_v4_flash_shaped_layer_agrees_with_the_cpu_backend);
    RUN(a_shard_that_does_not_fit_is_refused_with_both_sizes);
    return test_report();
}
