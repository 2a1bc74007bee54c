/*
 * route_internal.h — what kernels/route.c shares with its AVX2 fast path
 * (kernels/cpu/route_avx2.c, compiled with -mavx2 -mfma). Not a public header: callers use
 * kernels/route.h. route.c calls these only after cpuid reported AVX2 and FMA.
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

#endif
