/*
 * mathf.h — correctly rounded binary32 exp and log1p of epmoe's own (prefix mf_), so the MoE
 * layer's bits do not depend on the host's C library, its FMA/SSE2 dispatch or the compiler's
 * contraction (docs/numerics.md §6).
 *
 * For every float x the result is the float nearest the exact value, ties to even (no tie
 * occurs for a finite nonzero input: e^x and log(1+x) are irrational there), with IEEE 754's
 * special values: mf_expf(NaN) = NaN, mf_expf(+inf) = +inf, mf_expf(-inf) = +0, overflow to
 * +inf and underflow through the subnormals to +0 as round-to-nearest gives them;
 * mf_log1pf(NaN) = NaN, mf_log1pf(-1) = -inf, mf_log1pf(x < -1) = NaN, mf_log1pf(+-0) = +-0,
 * mf_log1pf(+inf) = +inf. Floating-point exception flags and errno are not part of the
 * contract.
 *
 * How: a fast evaluation in double with a proven relative error bound, then a rounding test —
 * if both ends of the error interval round to the same float, that float is the answer; else
 * (2 of the 2^32 inputs for exp, 35 for log1p) an evaluation in double-double with an error
 * below about 2^-100 decides.
 * tests/unit/test_mathf.c and the exhaustive tests/bench/mathf_exhaustive.c check both against
 * MPFR.
 */
#ifndef EPMOE_MATHF_H
#define EPMOE_MATHF_H

float mf_expf(float x);
float mf_log1pf(float x);

/* The accurate (double-double) path alone, for every input: the same results as above, only
 * slower. For tests and benchmarks. */
float mf_expf_accurate(float x);
float mf_log1pf_accurate(float x);

/* The fast path's verdict, for tests and benchmarks: 1 and *y = the result when its rounding
 * test decides, 0 when the call would fall back to the accurate path. Special inputs (NaN,
 * infinities, out of range) count as decided. */
int mf_expf_fast(float x, float *y);
int mf_log1pf_fast(float x, float *y);

#endif
