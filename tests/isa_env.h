/*
 * isa_env.h — the EPMOE_ISA / EPMOE_GEMM knobs in a test or benchmark program, read the way
 * the daemons read them: the kernels take no environment (kernels/isa.h), so a program run
 * under EPMOE_ISA (test_moe_isa_avx2, vs_ggml.sh's AVX2 floor) hands the cap over itself,
 * first thing in main.
 */
#ifndef EPMOE_TESTS_ISA_ENV_H
#define EPMOE_TESTS_ISA_ENV_H

#include <stdlib.h>

#include "kernels/isa.h"

static inline void test_isa_cap_from_env(void)
{
    isa_set_cap(isa_cap_parse(getenv("EPMOE_ISA"), getenv("EPMOE_GEMM")));
}

#endif
