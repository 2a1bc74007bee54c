/*
 * gemm_pack.c — packing steps the SIMD implementations share (plain C): the weight buffers,
 * the NaN-row masks of FP8 weights, and the integer FP8 path's tables (see "FP8 x FP8, many
 * tokens" in gemm_avx2.c). They depend only on the checkpoint's row-major weights, not on a
 * layout, so both gemm_avx2.c and gemm_avx512.c use them as they are.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/cpu/gemm_internal.h"

/* Weights of 2 MiB or more get transparent huge pages (where the system allows them on
 * request): loading a shard writes gigabytes of fresh memory, and faulting it in 4 KiB pages
 * cost more than the packing itself. */
#define HUGE_PAGE (2u << 20)

static void *weight_alloc(size_t n)
{
    n = (n + 63) / 64 * 64;
    void *p = NULL;
    if (n < HUGE_PAGE)
        return aligned_alloc(64, n);
    if (posix_memalign(&p, HUGE_PAGE, n) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* a hint: failure changes nothing */
#endif
    return p;
}

int gemm_pack_alloc(gemm_weight *w, size_t data, size_t scale, ep_err *err)
{
    w->data = weight_alloc(data);
    if (!w->data)
        return ep_err_set(err, "gemm: out of memory packing a %dx%d weight", w->N, w->K);
    w->data_bytes = data;
    w->bytes += data;
    if (scale) {
        w->bscale = malloc(scale);
        if (!w->bscale)
            return ep_err_set(err, "gemm: out of memory packing a %dx%d weight", w->N, w->K);
        w->bytes += scale;
    }
    return 0;
}

static int e4m3_nan(uint8_t c)
{
    return (c & 0x7F) == 0x7F;
}

/* The integer FP8 path's weight parts: W = w * 64 for |w| >= 2^-3 (exponent field e >= 4),
 * else 0 — what the kernels' in-register decoders compute, NaN codes included; and
 * WL = w * 512 for the |w| < 2^-3 values. */
static int32_t f8_W(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    int32_t v = e >= 4 ? (8 + m) << (e - 4) : 0;
    return (c & 0x80) ? -v : v;
}

static int32_t f8_WL(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    int32_t v = e >= 4 ? 0 : e == 0 ? m : (8 + m) << (e - 1);
    return (c & 0x80) ? -v : v;
}

/* Largest sum over a row's 128 k of |W| for which 128-term int32 sums of A * W cannot
 * overflow: |A| <= 1792, so sum |A * W| <= 1792 * sum |W| <= 2^31 - 1. */
#define F8_SAFE_WSUM 1198372

int gemm_pack_fp8_int_tables(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    int N = w->N, K = w->K, KB = K / 128;
    size_t nb = (size_t)(N / 8) * KB, nlo = 0;
    for (size_t i = 0; i < (size_t)N * K; i++)
        nlo += (src[i] & 0x78) < 0x20 && (src[i] & 0x7F) != 0; /* e < 4, not zero */
    w->lo_off = malloc((nb + 1) * sizeof(uint32_t));
    w->lo_ent = malloc((nlo ? nlo : 1) * sizeof(uint32_t));
    w->int_safe = malloc(nb);
    if (!w->lo_off || !w->lo_ent || !w->int_safe || nlo > UINT32_MAX)
        return ep_err_set(err, "gemm: out of memory packing a %dx%d weight", N, K);
    w->bytes += (nb + 1) * sizeof(uint32_t) + nlo * sizeof(uint32_t) + nb;
    uint32_t e = 0;
    for (int o = 0; o < N / 8; o++)
        for (int kb = 0; kb < KB; kb++) {
            size_t i = (size_t)o * KB + kb;
            w->lo_off[i] = e;
            int safe = 1;
            for (int r = 0; r < 8; r++) {
                const uint8_t *row = src + (size_t)(8 * o + r) * K + 128 * kb;
                int64_t sum = 0;
                for (int k = 0; k < 128; k++) {
                    int32_t W = f8_W(row[k]), WL = f8_WL(row[k]);
                    sum += W < 0 ? -W : W;
                    if (WL)
                        w->lo_ent[e++] =
                            (uint32_t)k | (uint32_t)r << 8 | (uint32_t)(uint16_t)WL << 16;
                }
                safe &= sum <= F8_SAFE_WSUM;
            }
            w->int_safe[i] = (uint8_t)safe;
        }
    w->lo_off[nb] = e;
    return 0;
}

int gemm_pack_fp8_nanrows(gemm_weight *w, const uint8_t *src, ep_err *err)
{
    int N = w->N, K = w->K, KB = K / 128;
    size_t n = (size_t)N * (size_t)K;
    /* e4m3 NaN codes are 0x7F and 0xFF: find one quickly before building the masks */
    const uint8_t *p = src;
    int any = 0;
    for (size_t i = 0; i < n && !any; i++)
        any = e4m3_nan(p[i]);
    if (!any)
        return 0;
    size_t nr = (size_t)(N / 8) * KB;
    w->nanrows = calloc(nr, 1);
    if (!w->nanrows)
        return ep_err_set(err, "gemm: out of memory packing a %dx%d weight", N, K);
    w->bytes += nr;
    for (int r = 0; r < N; r++)
        for (int k = 0; k < K; k++)
            if (e4m3_nan(src[(size_t)r * K + k]))
                w->nanrows[(size_t)(r / 8) * KB + k / 128] |= (uint8_t)(1u << (r % 8));
    return 0;
}
