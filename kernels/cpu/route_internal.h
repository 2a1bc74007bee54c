/*
 * route_internal.h — what kernels/cpu/route.c shares with its fast paths (route_avx2.c, compiled
 * with -mavx2 -mfma; route_avx512.c, with the AVX-512 flags). Not a public header: callers use
 * kernels/route.h. route.c calls these only after cpuid reported the
 * instructions they use.
 */
#ifndef EPMOE_ROUTE_INTERNAL_H
#define EPMOE_ROUTE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Experts per group of the AVX2 gate layout: [ceil(E/8)][H][8] fp32 (the exact widening of the
 * bf16 weights; experts past E are zero). */
#define ROUTE_AVX2_GROUP 8

void route_avx2_rmsnorm(int T, int H, const uint16_t *x, const uint16_t *gain, float eps,
                        uint16_t *y);
void route_avx2_gate_pack(int E, int H, const uint16_t *w, float *dst);
void route_avx2_logits(int T, int H, int E, const uint16_t *xn, const float *gate, float *logits);

/* The AVX-512 gate layout: [ceil(E/16)][H][16] bf16 (experts past E are zero). */
#define ROUTE_AVX512_GROUP 16
void route_avx512_gate_pack(int E, int H, const uint16_t *w, uint16_t *dst);
/* Logits of tt <= 4 token rows (xd[t]: the row widened to double; logits[t]: its output row
 * [E]) against expert groups [g0, g1). */
void route_avx512_logits_part(int H, int E, const double *const *xd, int tt, const uint16_t *gate,
                              int g0, int g1, float *const *logits);

#endif
