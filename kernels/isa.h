/*
 * isa.h — the instruction set a CPU kernel runs with (the type isa_level, prefix isa_): an
 * ordered level, so a cap is a comparison.
 *
 * ISA_REF is the plain C reference (the definition), ISA_AVX2 AVX2+FMA (the floor
 * of the fast paths), ISA_AVX512 AVX-512 F/BW/VL/DQ + VNNI. Every kernel that takes a
 * isa_level gives the reference's bits with each of them; ISA_AUTO means "the best one",
 * chosen in one place, isa_best().
 *
 * The kernels read no environment: a program that honours the EPMOE_ISA / EPMOE_GEMM knobs
 * turns their values into a cap with isa_cap_parse and hands it over once at start-up
 * with isa_set_cap, before any kernel runs.
 */
#ifndef EPMOE_ISA_H
#define EPMOE_ISA_H

typedef enum isa_level { ISA_AUTO = 0, ISA_REF, ISA_AVX2, ISA_AVX512 } isa_level;
#define ISA_COUNT 4 /* AUTO included */

/* Whether this CPU and build can run impl (AUTO and REF: always). */
int isa_supported(isa_level impl);
/* "auto", "ref", "avx2", "avx512" */
const char *isa_name(isa_level impl);
/* The implementation named name (one of isa_name's, "auto" included); -1 if none. */
int isa_parse(const char *name, isa_level *impl);

/* The cap two knob values give (either may be NULL: unset): isa names the widest set allowed
 * (ref, avx2 or avx512; an unknown value or "auto" is ignored, isa_parse lets a daemon
 * refuse it); the older gemm = "ref" selects the reference. ISA_AUTO: no cap. */
isa_level isa_cap_parse(const char *isa, const char *gemm);
/* The cap isa_best honours from now on (ISA_AUTO, the default: none). Called once
 * at start-up, before any kernel runs (tests may call it again between their cases). */
void isa_set_cap(isa_level cap);

/* The best implementation this CPU (and this build) supports at or below the cap: AVX512 when
 * cpuid reports AVX-512 F, BW, VL, DQ and VNNI (with OS support), else AVX2 when it reports
 * AVX2 and FMA, else REF. */
isa_level isa_best(void);

#endif
