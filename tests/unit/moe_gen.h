/*
 * moe_gen.h — a random DeepSeek V4 MoE checkpoint for tests and benchmarks (prefix gen_).
 *
 * The generator is the tests' own, independent of `epmoectl mkmodel`: it draws float weights,
 * quantizes them with kernels/formats.h (MXFP4 rows, FP8 128x128 blocks with E8M0 or F32
 * scales), keeps the raw codes in memory (so a test can decode them with its own formulas) and
 * writes config.json plus one model.safetensors with exactly the names and dtypes of spec §2.3
 * to §2.5 (checked by common/checkpoint.h).
 */
#ifndef EPMOE_TEST_MOE_GEN_H
#define EPMOE_TEST_MOE_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/model_config.h"

/* One linear W [N, K] as stored. */
typedef struct gen_linear {
    int N, K;
    bool mxfp4;  /* packed e2m1 [N, K/2] + e8m0 [N, K/32]; else e4m3 [N, K] + block scales */
    bool e8m0;   /* FP8 block scales are E8M0 codes (s8) rather than F32 (s32) */
    uint8_t *w;  /* codes; NULL when the expert is not materialised */
    uint8_t *s8; /* e8m0 codes: [N, K/32] (mxfp4) or [N/128, K/128] */
    float *s32;  /* F32 block scales [N/128, K/128] */
} gen_linear;

typedef struct gen_layer {
    bool hash;
    uint16_t *norm;      /* bf16 [H] */
    uint16_t *gate;      /* bf16 [E, H] */
    float *bias;         /* [E] (score layers) */
    int64_t *tid2eid;    /* [vocab, k] (hash layers) */
    gen_linear *experts; /* [E][3]: w1, w3, w2 */
    gen_linear shared[3];
} gen_layer;

typedef struct gen_opts {
    uint64_t seed;
    int experts_made;  /* experts 0..experts_made-1 get tensors; 0 = all */
    float bias_unmade; /* bias of the experts without tensors (steers selection away) */
    float w13_sigma;   /* std of w1/w3 elements (0: 0.2) */
    float w2_sigma;    /* std of w2 elements (0: 0.05) */
} gen_opts;

typedef struct gen_model {
    mc_config cfg;
    int n_layers; /* mc_num_layers */
    int experts_made;
    gen_layer *layers;
} gen_model;

gen_model *gen_model_create(const mc_config *c, const gen_opts *o);
void gen_model_free(gen_model **self_p);

/* Write dir/config.json (the fields mc_parse reads, giving back c) and dir/model.safetensors. */
int gen_model_write(const gen_model *g, const char *dir, ep_err *err);
int gen_config_write(const mc_config *c, const char *path, ep_err *err);
/* Remove what gen_model_write wrote in dir (config.json, model.safetensors), then dir. */
void gen_model_remove(const char *dir);

/* The config the tests start from: validated fields for expert dtype dt. */
mc_config gen_config(mc_expert_dtype dt, int H, int I, int E, int k, int vocab);

/* Deterministic random numbers shared by the tests (xorshift64). */
uint64_t gen_rand(uint64_t *state);
double gen_unit(uint64_t *state); /* uniform in [-1, 1) */

#endif
