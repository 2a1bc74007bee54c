/*
 * gemm_pack.c — the packed weights' memory, shared by the SIMD packers (gemm_avx2_pack.c,
 * gemm_avx512_pack.c; the FP8 tables they share are gemm_f8_pack_tables in gemm_avx2_pack.c).
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
