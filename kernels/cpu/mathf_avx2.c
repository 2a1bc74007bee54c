/*
 * mathf_avx2.c — mf_expf on 8 floats with AVX2 (the SwiGLU epilogue's exp, swiglu_avx2.c): the
 * scalar fast path of kernels/mathf.c lane by lane, four doubles at a time, with the very same
 * operations in the same order (so the same double and the same rounding test), and the
 * scalar mf_expf for every lane the test cannot decide or that is out of range (NaN, overflow,
 * underflow). The result is the correct rounding either way, so it is mf_expf's bits on every
 * input; test_mathf checks the two against each other.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/simd_internal.h"
#include "kernels/mathf.h"
#include "kernels/mathf_internal.h"
#include "kernels/fp_exact.h" /* last: no contraction below (docs/numerics.md §0) */

/* 4 lanes of mf_expf_fast: *out the rounded floats, the mask of the lanes it decided */
static inline int exp4(__m128 xf, __m128 *out)
{
    __m256d xd = _mm256_cvtps_pd(xf);
    __m256d in = _mm256_and_pd(_mm256_cmp_pd(xd, _mm256_set1_pd(MF_EXP_LO), _CMP_GT_OQ),
                               _mm256_cmp_pd(xd, _mm256_set1_pd(MF_EXP_HI), _CMP_LE_OQ));
    xd = _mm256_and_pd(xd, in); /* out-of-range lanes compute e^0, harmlessly */
    const __m256d magic = _mm256_set1_pd(0x1.8p52);
    __m256d kd = _mm256_mul_pd(xd, _mm256_set1_pd(MF_EXP_INV));
    kd = _mm256_sub_pd(_mm256_add_pd(kd, magic), magic);
    __m128i k = _mm256_cvtpd_epi32(kd); /* kd is an integer: exact */
    __m256d t = _mm256_sub_pd(xd, _mm256_mul_pd(kd, _mm256_set1_pd(MF_EXP_C1)));
    __m256d r = _mm256_sub_pd(t, _mm256_mul_pd(kd, _mm256_set1_pd(MF_EXP_C2)));
    r = _mm256_sub_pd(r, _mm256_mul_pd(kd, _mm256_set1_pd(MF_EXP_C3)));
    /* q = r (1 + r (1/2 + r (1/3! + r (1/4! + r (1/5! + r 1/6!))))), as the scalar code */
    __m256d q = _mm256_mul_pd(r, _mm256_set1_pd(mf_fact_inv[6].hi));
    q = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(mf_fact_inv[5].hi), q));
    q = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(mf_fact_inv[4].hi), q));
    q = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(mf_fact_inv[3].hi), q));
    q = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(0x1p-1), q));
    q = _mm256_mul_pd(r, _mm256_add_pd(_mm256_set1_pd(1.0), q));
    __m128i j = _mm_and_si128(k, _mm_set1_epi32(63));
    __m128i e = _mm_srai_epi32(_mm_sub_epi32(k, j), 6); /* (k - j) / 64, exact */
    const double *tab = &mf_exp_tab[0].hi;              /* {hi, lo} pairs */
    __m128i j2 = _mm_add_epi32(j, j);
    __m256d th = _mm256_i32gather_pd(tab, j2, 8);
    __m256d tl = _mm256_i32gather_pd(tab + 1, j2, 8);
    __m256d v = _mm256_add_pd(th, _mm256_add_pd(tl, _mm256_mul_pd(th, q)));
    __m256i eb =
        _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(e, _mm_set1_epi32(1023))), 52);
    __m256d y = _mm256_mul_pd(v, _mm256_castsi256_pd(eb)); /* e^x > 0: |y| = y */
    __m256d d = _mm256_mul_pd(y, _mm256_set1_pd(MF_EXP_FAST_C));
    __m128 lo = _mm256_cvtpd_ps(_mm256_sub_pd(y, d)), hi = _mm256_cvtpd_ps(_mm256_add_pd(y, d));
    *out = lo;
    return _mm256_movemask_pd(in) & _mm_movemask_ps(_mm_cmpeq_ps(lo, hi));
}

void mf_expf8_avx2(const float *x, float *y)
{
    float xs[8]; /* y may be x: keep the inputs for the lanes that fall back */
    memcpy(xs, x, sizeof xs);
    for (int h = 0; h < 8; h += 4) {
        __m128 r;
        int ok = exp4(_mm_loadu_ps(xs + h), &r);
        _mm_storeu_ps(y + h, r);
        if (ok != 15)
            for (int i = 0; i < 4; i++)
                if (!(ok >> i & 1))
                    y[h + i] = mf_expf(xs[h + i]);
    }
}
