/*
 * mathf_mpfr.h — MPFR's correctly rounded binary32 exp and log1p (subnormals and overflow as
 * IEEE 754 binary32 has them): the oracle of test_mathf and of the exhaustive bench.
 * Not thread-safe unless MPFR was built thread-safe (Debian's is: TLS).
 */
#ifndef EPMOE_MATHF_MPFR_H
#define EPMOE_MATHF_MPFR_H

float mpfr_ref_expf(float x);
float mpfr_ref_log1pf(float x);

#endif
