/*
 * mathf_fastfp.h — kernels/mathf.c compiled a second time with -ffp-contract=fast
 * -march=native and its functions renamed mfx_ (tests/unit/CMakeLists.txt, epmoe_mathf_fastfp):
 * test_mathf_flags and the exhaustive bench compare it with the normal build bit for bit.
 */
#ifndef EPMOE_MATHF_FASTFP_H
#define EPMOE_MATHF_FASTFP_H

float mfx_expf(float x);
float mfx_log1pf(float x);
float mfx_expf_accurate(float x);
float mfx_log1pf_accurate(float x);

#endif
