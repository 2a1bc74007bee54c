/*
 * mathf_internal.h — what kernels/mathf.c shares with its vector fast path
 * (kernels/cpu/mathf_avx2.c): the double-double type, exp's table and constants, and the error
 * bound of exp's fast path. The vector code repeats the scalar fast path's operations in the
 * same order, so it computes the same double and passes its rounding test on the same inputs.
 */
#ifndef EPMOE_MATHF_INTERNAL_H
#define EPMOE_MATHF_INTERNAL_H

typedef struct {
    double hi, lo;
} mf_dd;

/* 2^(j/64) = hi + lo (|error| < 2^-106 relative), j = 0..63 */
extern const mf_dd mf_exp_tab[64];
/* 1/n! = hi + lo, n = 0..10 */
extern const mf_dd mf_fact_inv[11];

/* ln2/64 = C1 + C2 + C3 (+ < 2^-128): C1 29 bits and C2 32 bits wide, so that k C1 and k C2
 * are exact for |k| < 2^21; C1 <= 2^-6 with ulp 2^-35, so x - k C1 is exact too (Sterbenz:
 * k != 0 only for |x| > 2^-8, whose ulp is 2^-31 or more, and |x - k C1| < 2^-7). */
#define MF_EXP_C1  0x1.62e42ff000000p-7
#define MF_EXP_C2  -0x1.718432a200000p-41
#define MF_EXP_C3  0x1.3c7673007e5edp-75
#define MF_EXP_INV 0x1.71547652b82fep+6 /* 64/ln2 */

/* Beyond these e^x rounds to +0 or +inf: e^-104 < 2^-150 (half the least subnormal),
 * e^89 > 2^128. The inputs between keep every intermediate normal in double. */
#define MF_EXP_LO -104.0f
#define MF_EXP_HI 89.0f

/* Error of y against e^x / 2^e (relative): r's rounding (2^-53 |r|, |r| < 2^-7.5) and the
 * dropped ln2/64 remainder (|k| 2^-128) move e^r by < 2^-60; the Taylor polynomial of degree
 * 6 is within r^7/7! < 2^-65 of e^r - 1; its Horner evaluation in double gives q within
 * 3 * 2^-53 |q| < 2^-58.9 of that (|q| < 2^-7.4); T q and T_lo + T q round with < 2^-59.4
 * and < 2^-62 relative to y; the final add rounds by 2^-53 |y|; the table is within 2^-106.
 * Altogether |y - e^x/2^e| < 1.1 * 2^-53 |y|, and scaling by 2^e is exact (normal range).
 * With half an ulp for y +- c|y| the test needs c >= 2.1 * 2^-53: c = 3 * 2^-53. */
#define MF_EXP_FAST_C 0x1.8p-52

#endif
