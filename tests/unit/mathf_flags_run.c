/*
 * mathf_flags_run.c — prints one 64-bit digest per part of the layer's arithmetic: mf_expf and
 * mf_log1pf (fast and accurate paths) over every 1021st float, the routing scores, the SwiGLU
 * epilogue of every implementation this CPU has, and whole MoE layers (both expert dtypes, a
 * hash and a score layer, every implementation). It is built twice: against epmoe_kernels and
 * against epmoe_kernels_fastfp (the same sources compiled with -ffp-contract=fast
 * -march=native); check_mathf_flags.sh runs both and requires the same lines, so the layer's
 * bits depend neither on contraction nor on the instruction set the compiler may use.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors_model.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/mathf.h"
#include "kernels/moe.h"
#include "kernels/route.h"
#include "kernels/swiglu.h"
#include "moe_gen.h"
#include "shard/shard.h"

typedef struct {
    uint64_t h;
} digest;

static void dg_bytes(digest *d, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        d->h = (d->h ^ b[i]) * 0x100000001b3ull;
}

static void dg_float(digest *d, float f)
{
    dg_bytes(d, &f, sizeof f);
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void functions(void)
{
    digest e = {0xcbf29ce484222325ull}, l = e, ea = e, la = e, s = e;
    for (uint64_t i = 0; i < 1ull << 32; i += 1021) {
        float x = f_of((uint32_t)i);
        dg_float(&e, mf_expf(x));
        dg_float(&l, mf_log1pf(x));
        dg_float(&s, route_score(x));
        if (i % (1021 * 16) == 0) {
            dg_float(&ea, mf_expf_accurate(x));
            dg_float(&la, mf_log1pf_accurate(x));
        }
    }
    printf("mf_expf %016llx\nmf_log1pf %016llx\n", (unsigned long long)e.h,
           (unsigned long long)l.h);
    printf("mf_expf_accurate %016llx\nmf_log1pf_accurate %016llx\n", (unsigned long long)ea.h,
           (unsigned long long)la.h);
    printf("route_score %016llx\n", (unsigned long long)s.h);
}

static void swiglu(void)
{
    enum { M = 64, I = 512 };
    float *a1 = malloc(sizeof(float) * M * I), *a3 = malloc(sizeof(float) * M * I), w[M];
    uint8_t *q = malloc(M * I);
    float *sc = malloc(sizeof(float) * M * (I / 128));
    uint64_t rs = 7;
    for (int i = 0; i < M * I; i++) {
        a1[i] = (float)(12.0 * gen_unit(&rs)); /* the gate's whole interesting range */
        a3[i] = (float)(3.0 * gen_unit(&rs));
    }
    for (int m = 0; m < M; m++)
        w[m] = (float)(0.5 + 0.5 * gen_unit(&rs));
    for (int impl = ISA_REF; impl <= ISA_AVX512; impl++) {
        if (!isa_supported((isa_level)impl))
            continue;
        digest d = {0xcbf29ce484222325ull};
        for (int pow2 = 0; pow2 < 2; pow2++) {
            swiglu_rows_impl((isa_level)impl, a1, a3, M, I, pow2 ? w : NULL, 7.0f, pow2, q, sc);
            dg_bytes(&d, q, M * I);
            dg_bytes(&d, sc, sizeof(float) * M * (I / 128));
        }
        printf("swiglu impl %d %016llx\n", impl, (unsigned long long)d.h);
    }
    free(a1);
    free(a3);
    free(q);
    free(sc);
}

static int layers(mc_expert_dtype dt)
{
    mc_config c = dt == MC_FP4 ? gen_config(MC_FP4, 256, 256, 12, 6, 1000)
                               : gen_config(MC_FP8, 256, 384, 16, 4, 1000);
    ep_err err = {0};
    if (mc_validate(&c, &err) < 0)
        return fprintf(stderr, "config: %s\n", err.msg), -1;
    gen_opts o = {.seed = 21 + dt};
    gen_model *g = gen_model_create(&c, &o);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/epmoe_mathf_flags_XXXXXX");
    st_model *m = NULL;
    if (!mkdtemp(dir) || gen_model_write(g, dir, &err) < 0 || !(m = st_model_open(dir, &err)))
        return fprintf(stderr, "checkpoint: %s\n", err.msg), -1;
    enum { T = 64 };
    int H = c.hidden_size, k = c.num_experts_per_tok;
    uint16_t *x = malloc((size_t)T * H * 2), *out = malloc((size_t)T * H * 2);
    int64_t tok[T];
    int32_t *ids = malloc(sizeof(int32_t) * T * k);
    float *wt = malloc(sizeof(float) * T * k);
    uint64_t rs = 5 + dt;
    for (int t = 0; t < T; t++) {
        double amp = t % 17 == 3 ? 300.0 : t % 23 == 5 ? 1e-3 : 1.7;
        for (int i = 0; i < H; i++)
            x[(size_t)t * H + i] = fmt_f32_to_bf16((float)(amp * gen_unit(&rs)));
        tok[t] = (int64_t)(gen_rand(&rs) % (uint64_t)(c.vocab_size - 1));
    }
    int rc = 0;
    for (int layer = 0; layer < mc_num_layers(&c) && rc == 0; layer++)
        for (int impl = ISA_REF; impl <= ISA_AVX512; impl++) {
            if (!isa_supported((isa_level)impl))
                continue;
            moe_layer *l = shard_load_moe_layer(m, &c, layer, NULL, (isa_level)impl, &err);
            if (!l || moe_forward(l, T, x, tok, out, ids, wt, NULL, &err) < 0) {
                fprintf(stderr, "layer %d: %s\n", layer, err.msg);
                rc = -1;
                moe_layer_free(&l);
                break;
            }
            digest d = {0xcbf29ce484222325ull};
            dg_bytes(&d, out, (size_t)T * H * 2);
            dg_bytes(&d, ids, sizeof(int32_t) * T * k);
            dg_bytes(&d, wt, sizeof(float) * T * k);
            printf("layer %s %d impl %d %016llx\n", dt == MC_FP4 ? "fp4" : "fp8", layer, impl,
                   (unsigned long long)d.h);
            moe_layer_free(&l);
        }
    st_model_close(&m);
    gen_model_free(&g);
    gen_model_remove(dir);
    free(x);
    free(out);
    free(ids);
    free(wt);
    return rc;
}

int main(void)
{
    functions();
    swiglu();
    if (layers(MC_FP4) < 0 || layers(MC_FP8) < 0)
        return 1;
    return 0;
}
