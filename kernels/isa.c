/*
 * isa.c — the choice of instruction set (isa.h): what cpuid reports, what this build compiled
 * (EPMOE_AVX2_KERNELS, EPMOE_AVX512_KERNELS from kernels/CMakeLists.txt) and the cap the
 * program set.
 */
#include "kernels/isa.h"

#include <stdatomic.h>
#include <string.h>

static const char *const IMPL_NAME[ISA_COUNT] = {"auto", "ref", "avx2", "avx512"};

/* Set once at start-up and read by every thread that resolves AUTO: atomic, so a test that
 * changes it between cases races with nothing. */
static atomic_int impl_cap = ISA_AUTO;

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

int isa_supported(isa_level impl)
{
    switch (impl) {
    case ISA_AUTO:
    case ISA_REF:
        return 1;
    case ISA_AVX2:
        return avx2_supported();
    case ISA_AVX512:
        return avx512_supported();
    }
    return 0;
}

int isa_parse(const char *name, isa_level *impl)
{
    for (int i = 0; i < ISA_COUNT; i++)
        if (name && strcmp(name, IMPL_NAME[i]) == 0) {
            *impl = (isa_level)i;
            return 0;
        }
    return -1;
}

const char *isa_name(isa_level impl)
{
    return (unsigned)impl < ISA_COUNT ? IMPL_NAME[impl] : "unknown";
}

isa_level isa_cap_parse(const char *isa, const char *gemm)
{
    isa_level cap = ISA_AVX512;
    if (gemm && strcmp(gemm, "ref") == 0)
        cap = ISA_REF;
    isa_level want;
    if (isa && isa_parse(isa, &want) == 0 && want != ISA_AUTO && want < cap)
        cap = want;
    return cap == ISA_AVX512 ? ISA_AUTO : cap;
}

void isa_set_cap(isa_level cap)
{
    atomic_store_explicit(&impl_cap, (int)cap, memory_order_relaxed);
}

/* The one place the instruction set is chosen: the widest one the CPU has, at or below the
 * cap. */
isa_level isa_best(void)
{
    isa_level cap = (isa_level)atomic_load_explicit(&impl_cap, memory_order_relaxed);
    if (cap == ISA_AUTO || (unsigned)cap >= ISA_COUNT)
        cap = ISA_AVX512;
    for (int i = cap; i > ISA_REF; i--)
        if (isa_supported((isa_level)i))
            return (isa_level)i;
    return ISA_REF;
}
