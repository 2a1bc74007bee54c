/*
 * isa.h — the instruction set a CPU kernel runs with (the type gemm_impl, prefix gemm_impl_:
 * the expert GEMMs were its first user, and the name stays so that callers keep theirs).
 *
 * GEMM_IMPL_REF is the plain C reference (the definition), GEMM_IMPL_AVX2 AVX2+FMA (the floor
 * of the fast paths), GEMM_IMPL_AVX512 AVX-512 F/BW/VL/DQ + VNNI. Every kernel that takes a
 * gemm_impl gives the reference's bits with each of them; GEMM_IMPL_AUTO means "the best one",
 * chosen in one place, gemm_impl_best().
 *
 * The kernels read no environment: a program that honours the EPMOE_ISA / EPMOE_GEMM knobs
 * turns their values into a cap with gemm_impl_cap_parse and hands it over once at start-up
 * with gemm_impl_set_cap, before any kernel runs.
 */
#ifndef EPMOE_ISA_H
#define EPMOE_ISA_H

typedef enum gemm_impl {
    GEMM_IMPL_AUTO = 0,
    GEMM_IMPL_REF,
    GEMM_IMPL_AVX2,
    GEMM_IMPL_AVX512
} gemm_impl;
#define GEMM_IMPL_COUNT 4 /* AUTO included */

/* Whether this CPU and build can run impl (AUTO and REF: always). */
int gemm_impl_supported(gemm_impl impl);
/* "auto", "ref", "avx2", "avx512" */
const char *gemm_impl_name(gemm_impl impl);
/* The implementation named name (one of gemm_impl_name's, "auto" included); -1 if none. */
int gemm_impl_parse(const char *name, gemm_impl *impl);

/* The cap two knob values give (either may be NULL: unset): isa names the widest set allowed
 * (ref, avx2 or avx512; an unknown value or "auto" is ignored, gemm_impl_parse lets a daemon
 * refuse it); the older gemm = "ref" selects the reference. GEMM_IMPL_AUTO: no cap. */
gemm_impl gemm_impl_cap_parse(const char *isa, const char *gemm);
/* The cap gemm_impl_best honours from now on (GEMM_IMPL_AUTO, the default: none). Called once
 * at start-up, before any kernel runs (tests may call it again between their cases). */
void gemm_impl_set_cap(gemm_impl cap);

/* The best implementation this CPU (and this build) supports at or below the cap: AVX512 when
 * cpuid reports AVX-512 F, BW, VL, DQ and VNNI (with OS support), else AVX2 when it reports
 * AVX2 and FMA, else REF. */
gemm_impl gemm_impl_best(void);

#endif
