/*
 * isa.c — the choice of instruction set (isa.h): what cpuid reports, what this build compiled
 * (EPMOE_AVX2_KERNELS, EPMOE_AVX512_KERNELS from kernels/CMakeLists.txt) and the cap the
 * program set.
 */
#include "kernels/isa.h"

#include <stdatomic.h>
#include <string.h>

static const char *const IMPL_NAME[GEMM_IMPL_COUNT] = {"auto", "ref", "avx2", "avx512"};

/* Set once at start-up and read by every thread that resolves AUTO: atomic, so a test that
 * changes it between cases races with nothing. */
static atomic_int impl_cap = GEMM_IMPL_AUTO;

static int avx2_supported(void)
{
#ifdef EPMOE_AVX2_KERNELS
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0; /* not an x86-64 build: the SIMD files are not compiled */
#endif
}

static int avx512_supported(void)
{
#ifdef EPMOE_AVX512_KERNELS
    /* libgcc's cpuid also checks that the OS saves the zmm state (XCR0) */
    return avx2_supported() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
    return 0; /* the compiler cannot build the AVX-512 files (or not x86-64) */
#endif
}

int gemm_impl_supported(gemm_impl impl)
{
    switch (impl) {
    case GEMM_IMPL_AUTO:
    case GEMM_IMPL_REF:
        return 1;
    case GEMM_IMPL_AVX2:
        return avx2_supported();
    case GEMM_IMPL_AVX512:
        return avx512_supported();
    }
    return 0;
}

int gemm_impl_parse(const char *name, gemm_impl *impl)
{
    for (int i = 0; i < GEMM_IMPL_COUNT; i++)
        if (name && strcmp(name, IMPL_NAME[i]) == 0) {
            *impl = (gemm_impl)i;
            return 0;
        }
    return -1;
}

const char *gemm_impl_name(gemm_impl impl)
{
    return (unsigned)impl < GEMM_IMPL_COUNT ? IMPL_NAME[impl] : "unknown";
}

gemm_impl gemm_impl_cap_parse(const char *isa, const char *gemm)
{
    gemm_impl cap = GEMM_IMPL_AVX512;
    if (gemm && strcmp(gemm, "ref") == 0)
        cap = GEMM_IMPL_REF;
    gemm_impl want;
    if (isa && gemm_impl_parse(isa, &want) == 0 && want != GEMM_IMPL_AUTO && want < cap)
        cap = want;
    return cap == GEMM_IMPL_AVX512 ? GEMM_IMPL_AUTO : cap;
}

void gemm_impl_set_cap(gemm_impl cap)
{
    atomic_store_explicit(&impl_cap, (int)cap, memory_order_relaxed);
}

/* The one place the instruction set is chosen: the widest one the CPU has, at or below the
 * cap. */
gemm_impl gemm_impl_best(void)
{
    gemm_impl cap = (gemm_impl)atomic_load_explicit(&impl_cap, memory_order_relaxed);
    if (cap == GEMM_IMPL_AUTO || (unsigned)cap >= GEMM_IMPL_COUNT)
        cap = GEMM_IMPL_AVX512;
    for (int i = cap; i > GEMM_IMPL_REF; i--)
        if (gemm_impl_supported((gemm_impl)i))
            return (gemm_impl)i;
    return GEMM_IMPL_REF;
}
