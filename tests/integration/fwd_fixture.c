/*
 * fwd_fixture.c — files for test_forward_local.sh: a small generated checkpoint (the unit
 * tests' generator, tests/unit/moe_gen.c), good and broken input files, and the expected
 * output of each layer as epmoectl forward must write it.
 *
 *   fwd_fixture DIR
 *
 * writes DIR/model/ (config.json + model.safetensors: H 256, I 256, 8 experts, top-4, layers
 * 0 (hash), 1, 2 and mtp.0, vocab 500), DIR/badcfg/config.json (not JSON), the inputs
 *   in_bf16        hidden_states BF16 [5, 256], input_ids I64 [5]
 *   in_f32         the same values as F32 plus noise below a quarter bf16 ulp (rounds back to
 *                  the same bf16), input_ids I32
 *   in_noids       hidden_states only
 *   in_nohidden    input_ids only
 *   in_i32hidden   hidden_states I32 [5, 256]
 *   in_badH        hidden_states BF16 [5, 128]
 *   in_badid       input_ids with element 2 = 500 (= vocab_size)
 *   in_idshape     input_ids I64 [4]
 * and expect_L.safetensors for L in layers.0, layers.1, mtp.0: out BF16 [5, 256], topk_ids
 * I32 [5, 4], topk_weights F32 [5, 4], computed with moe_forward in this process (the numerics
 * are proven by test_moe; this checks the command's plumbing byte for byte).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/safetensors_model.h"
#include "common/safetensors_writer.h"
#include "kernels/formats.h"
#include "kernels/moe.h"
#include "shard/shard.h"
#include "moe_gen.h"
#include "tests/isa_env.h"

enum { T = 5, H = 256, K = 4, VOCAB = 500 };

static int fail(const char *what, const ep_err *err)
{
    fprintf(stderr, "fwd_fixture: %s: %s\n", what, err ? err->msg : "");
    return 1;
}

static int write_input(const char *dir, const char *name, st_dtype hdt, int hdim1,
                       const void *hidden, st_dtype idt, int nids, const void *ids)
{
    ep_err err = {0};
    st_writer *w = st_writer_create();
    int64_t hs[2] = {T, hdim1}, is[1] = {nids};
    if (hidden && st_writer_add(w, "hidden_states", hdt, 2, hs, hidden, &err) < 0)
        return fail(name, &err);
    if (ids && st_writer_add(w, "input_ids", idt, 1, is, ids, &err) < 0)
        return fail(name, &err);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    int rc = st_writer_write(w, path, &err);
    st_writer_destroy(&w);
    return rc < 0 ? fail(name, &err) : 0;
}

static int write_expect(const char *dir, const char *name, const st_model *m, const mc_config *c,
                        int layer, const uint16_t *x, const int64_t *ids)
{
    ep_err err = {0};
    moe_layer *l = shard_load_moe_layer(m, c, layer, NULL, ISA_AUTO, &err);
    if (!l)
        return fail(name, &err);
    uint16_t out[T * H];
    int32_t top[T * K];
    float w[T * K];
    if (moe_forward(l, T, x, ids, out, top, w, NULL, &err) < 0)
        return fail(name, &err);
    moe_layer_free(&l);
    st_writer *sw = st_writer_create();
    int64_t so[2] = {T, H}, sk[2] = {T, K};
    char path[512];
    snprintf(path, sizeof path, "%s/expect_%s.safetensors", dir, name);
    if (st_writer_add(sw, "out", ST_BF16, 2, so, out, &err) < 0 ||
        st_writer_add(sw, "topk_ids", ST_I32, 2, sk, top, &err) < 0 ||
        st_writer_add(sw, "topk_weights", ST_F32, 2, sk, w, &err) < 0 ||
        st_writer_write(sw, path, &err) < 0)
        return fail(name, &err);
    st_writer_destroy(&sw);
    return 0;
}

int main(int argc, char **argv)
{
    test_isa_cap_from_env();
    if (argc != 2) {
        fprintf(stderr, "usage: fwd_fixture DIR\n");
        return 64;
    }
    const char *dir = argv[1];
    char path[512];
    ep_err err = {0};
    mc_config c = gen_config(MC_FP4, H, 256, 8, K, VOCAB);
    gen_opts o = {.seed = 5};
    gen_model *g = gen_model_create(&c, &o);
    snprintf(path, sizeof path, "%s/model", dir);
    mkdir(path, 0755);
    if (gen_model_write(g, path, &err) < 0)
        return fail("model", &err);
    gen_model_free(&g);
    snprintf(path, sizeof path, "%s/badcfg", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/badcfg/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs("{\"hidden_size\": 256,\n  oops\n", f) < 0 || fclose(f) != 0)
        return fail("badcfg", NULL);

    static uint16_t x[T * H], xh[T * 128];
    static float xf[T * H];
    static int32_t hi32[T * H];
    int64_t ids[T], bad[T];
    int32_t ids32[T];
    uint64_t rs = 77;
    for (int i = 0; i < T * H; i++) {
        x[i] = fmt_f32_to_bf16((float)(1.5 * gen_unit(&rs)));
        float v = fmt_bf16_to_f32(x[i]);
        /* bf16 has 8 significant bits; 2^-11 relative is under a quarter ulp */
        xf[i] = v + v * ldexpf((float)gen_unit(&rs), -11);
        hi32[i] = (int32_t)i;
    }
    for (int i = 0; i < T * 128; i++)
        xh[i] = x[i];
    for (int t = 0; t < T; t++) {
        ids[t] = bad[t] = (int64_t)(gen_rand(&rs) % VOCAB);
        ids32[t] = (int32_t)ids[t];
    }
    bad[2] = VOCAB;
    if (write_input(dir, "in_bf16", ST_BF16, H, x, ST_I64, T, ids) ||
        write_input(dir, "in_f32", ST_F32, H, xf, ST_I32, T, ids32) ||
        write_input(dir, "in_noids", ST_BF16, H, x, ST_I64, 0, NULL) ||
        write_input(dir, "in_nohidden", ST_BF16, H, NULL, ST_I64, T, ids) ||
        write_input(dir, "in_i32hidden", ST_I32, H, hi32, ST_I64, T, ids) ||
        write_input(dir, "in_badH", ST_BF16, 128, xh, ST_I64, T, ids) ||
        write_input(dir, "in_badid", ST_BF16, H, x, ST_I64, T, bad) ||
        write_input(dir, "in_idshape", ST_BF16, H, x, ST_I64, T - 1, ids))
        return 1;

    snprintf(path, sizeof path, "%s/model", dir);
    st_model *m = st_model_open(path, &err);
    if (!m)
        return fail("open model", &err);
    int rc = write_expect(dir, "layers.0", m, &c, 0, x, ids) ||
             write_expect(dir, "layers.1", m, &c, 1, x, ids) ||
             write_expect(dir, "mtp.0", m, &c, 3, x, ids);
    st_model_close(&m);
    return rc;
}
