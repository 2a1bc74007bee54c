/*
 * gemm_internal.h — what kernels/cpu/gemm_drive.c shares with its implementations (gemm_ref.c,
 * gemm_avx2*.c, gemm_avx512.c, gemm_pack.c). Not a public header: callers use kernels/gemm.h.
 *
 * A gemm_weight holds the weights in the layout of the implementation it was packed for; the
 * implementations never see each other's layouts. Work is split over N in units of 8 rows
 * (AVX2) or 16 rows (AVX-512), the blocks every layout is built from; each output element is
 * computed by exactly one thread from its own row and column only, so results never depend on
 * the split.
 */
#ifndef EPMOE_GEMM_INTERNAL_H
#define EPMOE_GEMM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/gemm.h"

/* Largest N or K accepted by the packers: keeps every [N, K] size and every per-row int32
 * index far from overflow (V4 uses 4096 at most; limits.h bounds model dims at 65536). */
#define GEMM_MAX_DIM 65536
/* Scratch each pool thread owns for one tile of preprocessed activations (gemm_drive). */
#define GEMM_THREAD_SCRATCH TPOOL_SCRATCH
/* Prepared activations of one token tile at most (when more than one micro-tile of tokens
 * fits): about a third of a core's L2 on the machines we measured. */
#ifndef GEMM_TILE_BYTES
#define GEMM_TILE_BYTES (384u << 10)
#endif

typedef enum gemm_kind { GEMM_KIND_FP8 = 1, GEMM_KIND_MXFP4 = 2 } gemm_kind;

struct gemm_weight {
    gemm_kind kind;
    isa_level impl;
    int N, K;
    /* REF: w [N, K] e4m3 (FP8) or [N, K/2] packed nibbles (MXFP4), as given.
     * AVX2 / AVX512: see the layout comments at the top of gemm_avx2_pack.c /
     * gemm_avx512_pack.c. */
    uint8_t *data;
    size_t data_bytes;
    /* FP8: w_scale [N/128, K/128] fp32 (every impl). */
    float *fscale;
    /* MXFP4: e8m0 scales. REF: [N, K/32] as given; AVX2: [N/8][K/32][8]; AVX512:
     * [N/16][K/32][16]. */
    uint8_t *bscale;
    /* SIMD FP8 only: [N/8][K/128] bit r set when row r of the octet has a NaN code in that
     * block; NULL when the weights hold no NaN code at all. */
    uint8_t *nanrows;
    /* SIMD MXFP4 only: some e8m0 code is 0 or 255 (needs the slow scale decode). */
    int scale_special;
    /* SIMD FP8 only, for the integer paths: per (octet, 128-block) the list of weights with
     * |w| < 2^-3 (entries lo_ent[lo_off[i] .. lo_off[i+1]), each k | row << 8 | (w * 512) << 16)
     * and whether the block's int32 sums cannot overflow (int_safe). */
    uint32_t *lo_off, *lo_ent;
    uint8_t *int_safe;
    size_t bytes; /* everything above, struct included */
};

/* One gemm_run call, as the implementations see it: a gemm_job (gemm.h). */
typedef gemm_job gemm_call;

/* ---- reference (gemm_ref.c) ---- */

/* out[m][n] for every m and n in [n0, n1), straight from the definition in gemm.h. */
void gemm_ref_rows(const gemm_call *c, int n0, int n1);

/* ---- the SIMD implementations (gemm_avx2.c, gemm_avx512.c; x86-64 builds only) ---- */

/* Fill w->data / bscale / nanrows (and the integer FP8 path's tables) in the implementation's
 * layout; w->kind, impl, N, K, fscale already set. Returns 0, or -1 on allocation failure (err
 * filled). */
int gemm_avx2_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err);
int gemm_avx2_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err);
int gemm_avx512_pack_fp8(gemm_weight *w, const uint8_t *src, ep_err *err);
int gemm_avx512_pack_mxfp4(gemm_weight *w, const uint8_t *src, const uint8_t *scale, ep_err *err);
/* The FP8 tables both SIMD layouts carry beside the weights (w->nanrows, lo_off, lo_ent,
 * int_safe; gemm_avx2_pack.c), from the [N, K] codes src. Returns 0, or -1 on allocation
 * failure (err filled). */
int gemm_f8_pack_tables(gemm_weight *w, const uint8_t *src, ep_err *err);

/* The packed weights' memory (gemm_pack.c): w->data of `data` bytes, 64-byte aligned (huge
 * pages from 2 MiB on), and w->bscale of `scale` bytes when scale > 0. */
int gemm_pack_alloc(gemm_weight *w, size_t data, size_t scale, ep_err *err);

/* What a SIMD implementation gives the tiling driver (gemm_drive in gemm_drive.c). Rows are handed
 * out in units of `unit` rows (8 or 16); activations are preprocessed per token tile into the
 * thread's scratch (tile_prep) and then run against units [u0, u1) (tile_run, which adds to
 * out: the driver zeroes it first). ipath selects the many-token FP8 path. */
typedef struct gemm_kops {
    int unit;
    int (*ipath)(const gemm_weight *w, int M);
    size_t (*token_bytes)(const gemm_weight *w, int kn, int ipath);
    void (*tile_prep)(const gemm_call *c, int m0, int mt, int k0, int kn, void *base, int ipath);
    void (*tile_run)(const gemm_call *c, int u0, int u1, int m0, int mt, int k0, int kn, void *base,
                     int ipath);
} gemm_kops;

extern const gemm_kops gemm_avx2_kops;
extern const gemm_kops gemm_avx512_kops;

/* Work shared by the threads of one gemm_run: items are taken from `next` (start at 0). */
typedef struct gemm_sched {
    atomic_long next;
} gemm_sched;

/* Thread tid of nthreads computes its share of out with ops; scratch is this thread's buffer
 * of cap bytes for preprocessed activations (at least GEMM_MIN_SCRATCH). Every thread of the
 * call must run it (with the same sched) before out is complete. */
#define GEMM_MIN_SCRATCH (16u << 10)
void gemm_drive(const gemm_call *c, const gemm_kops *ops, gemm_sched *sched, int tid, int nthreads,
                void *scratch, size_t cap);
/* The kernels of a SIMD implementation; NULL for REF, AUTO, or one this build lacks. */
const gemm_kops *gemm_kops_of(isa_level impl);

#endif
