/*
 * mathf.c — correctly rounded binary32 exp and log1p (mathf.h), in double with a rounding
 * test and a double-double fallback: the technique of CORE-MATH's binary32 functions, this
 * code and its error analysis written here (the tables come from kernels/mathf_tables.py).
 *
 * Why the bits cannot depend on the compiler or the instruction set: the result is the
 * correct rounding, which is unique, provided (1) the fast path's error bound holds and
 * (2) the double-double path is exact where it has to be. (1) holds whether or not a multiply
 * and an add are fused (a fused operation rounds once instead of twice). (2) needs Dekker's
 * products unfused, so contraction is switched off here in every way the compilers offer
 * (kernels/fp_exact.h: the C pragma for clang, GCC's optimize pragma, as GCC ignores the C one)
 * besides the build's -ffp-contract=off; test_mathf_flags compiles this file with
 * -ffp-contract=fast -march=native and checks that nothing changes. Only IEEE double
 * arithmetic is used (x86-64 and AArch64 evaluate double in double, FLT_EVAL_METHOD 0);
 * nothing from libm is called.
 */
#include "kernels/mathf.h"
#include "kernels/mathf_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fp_exact.h" /* after every other include: no contraction below */

/* ---- double-double arithmetic (value hi + lo, |lo| <= ulp(hi)/2) ---- */

/* a + b exactly, when |a| >= |b| or a == 0 */
static inline mf_dd fast_two_sum(double a, double b)
{
    double s = a + b;
    return (mf_dd){s, b - (s - a)};
}

/* a + b exactly (Knuth) */
static inline mf_dd two_sum(double a, double b)
{
    double s = a + b, bb = s - a;
    return (mf_dd){s, (a - (s - bb)) + (b - bb)};
}

/* Veltkamp: a = h + l, each half 26 bits wide, so products of halves are exact */
static inline void split(double a, double *h, double *l)
{
    double c = 134217729.0 * a; /* 2^27 + 1 */
    *h = c - (c - a);
    *l = a - *h;
}

/* a * b exactly (Dekker; no FMA so that every machine gets the same bits) */
static inline mf_dd two_prod(double a, double b)
{
    double p = a * b, ah, al, bh, bl;
    split(a, &ah, &al);
    split(b, &bh, &bl);
    return (mf_dd){p, ((ah * bh - p) + ah * bl + al * bh) + al * bl};
}

static inline mf_dd dd_add(mf_dd a, mf_dd b)
{
    mf_dd s = two_sum(a.hi, b.hi), t = two_sum(a.lo, b.lo);
    s = fast_two_sum(s.hi, s.lo + t.hi);
    return fast_two_sum(s.hi, s.lo + t.lo);
}

static inline mf_dd dd_mul(mf_dd a, mf_dd b)
{
    mf_dd p = two_prod(a.hi, b.hi);
    return fast_two_sum(p.hi, p.lo + (a.hi * b.lo + a.lo * b.hi));
}

static inline mf_dd dd_mul_d(mf_dd a, double b)
{
    mf_dd p = two_prod(a.hi, b);
    return fast_two_sum(p.hi, p.lo + a.lo * b);
}

/* a / b: q1 = a/b in double, then the quotient of the exact remainder corrects it */
static inline mf_dd dd_div(mf_dd a, mf_dd b)
{
    double q1 = a.hi / b.hi;
    mf_dd r = dd_add(a, dd_mul_d(b, -q1));
    double q2 = (r.hi + r.lo) / b.hi;
    return fast_two_sum(q1, q2);
}

/* hi + lo rounded to the nearest float: round hi + lo to odd in double (hi, moved one ulp
 * toward lo when hi is even and lo != 0), then to float; rounding to odd at 53 bits and then
 * to nearest at 24 or fewer (subnormals) is one correct rounding. */
static float dd_to_float(mf_dd v)
{
    double h = v.hi;
    if (v.lo != 0) {
        uint64_t b;
        memcpy(&b, &h, sizeof b);
        if ((b & 1) == 0) {
            b += (v.lo > 0) == (h > 0) ? 1 : (uint64_t)-1; /* away from / toward zero */
            memcpy(&h, &b, sizeof h);
        }
    }
    return (float)h;
}

/* 2^e as a double, -1022 <= e <= 1023 */
static inline double pow2i(int e)
{
    uint64_t b = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* The float nearest y when both ends of [y - c|y|, y + c|y|] round to it, where c covers the
 * error bound plus the rounding of y +- c|y| (half an ulp of y, 2^-53 |y|): *out and 1; else 0. */
static inline int round_test(double y, double c, float *out)
{
    double d = (y < 0 ? -y : y) * c;
    float lo = (float)(y - d), hi = (float)(y + d);
    if (lo != hi)
        return 0;
    *out = lo;
    return 1;
}

/* ---- exp ----
 * x = k ln2/64 + r, |r| <= ln2/128 (1 + 2^-40), k = 64 e + j: e^x = 2^e 2^(j/64) e^r. */

/* 2^(j/64) = hi + lo (|error| < 2^-106 relative) */
const mf_dd mf_exp_tab[64] = {
    {0x1.0000000000000p+0, 0x0p+0},
    {0x1.02c9a3e778061p+0, -0x1.19083535b085dp-56},
    {0x1.059b0d3158574p+0, 0x1.d73e2a475b465p-55},
    {0x1.0874518759bc8p+0, 0x1.186be4bb284ffp-57},
    {0x1.0b5586cf9890fp+0, 0x1.8a62e4adc610bp-54},
    {0x1.0e3ec32d3d1a2p+0, 0x1.03a1727c57b53p-59},
    {0x1.11301d0125b51p+0, -0x1.6c51039449b3ap-54},
    {0x1.1429aaea92de0p+0, -0x1.32fbf9af1369ep-54},
    {0x1.172b83c7d517bp+0, -0x1.19041b9d78a76p-55},
    {0x1.1a35beb6fcb75p+0, 0x1.e5b4c7b4968e4p-55},
    {0x1.1d4873168b9aap+0, 0x1.e016e00a2643cp-54},
    {0x1.2063b88628cd6p+0, 0x1.dc775814a8495p-55},
    {0x1.2387a6e756238p+0, 0x1.9b07eb6c70573p-54},
    {0x1.26b4565e27cddp+0, 0x1.2bd339940e9d9p-55},
    {0x1.29e9df51fdee1p+0, 0x1.612e8afad1255p-55},
    {0x1.2d285a6e4030bp+0, 0x1.0024754db41d5p-54},
    {0x1.306fe0a31b715p+0, 0x1.6f46ad23182e4p-55},
    {0x1.33c08b26416ffp+0, 0x1.32721843659a6p-54},
    {0x1.371a7373aa9cbp+0, -0x1.63aeabf42eae2p-54},
    {0x1.3a7db34e59ff7p+0, -0x1.5e436d661f5e3p-56},
    {0x1.3dea64c123422p+0, 0x1.ada0911f09ebcp-55},
    {0x1.4160a21f72e2ap+0, -0x1.ef3691c309278p-58},
    {0x1.44e086061892dp+0, 0x1.89b7a04ef80d0p-59},
    {0x1.486a2b5c13cd0p+0, 0x1.3c1a3b69062f0p-56},
    {0x1.4bfdad5362a27p+0, 0x1.d4397afec42e2p-56},
    {0x1.4f9b2769d2ca7p+0, -0x1.4b309d25957e3p-54},
    {0x1.5342b569d4f82p+0, -0x1.07abe1db13cadp-55},
    {0x1.56f4736b527dap+0, 0x1.9bb2c011d93adp-54},
    {0x1.5ab07dd485429p+0, 0x1.6324c054647adp-54},
    {0x1.5e76f15ad2148p+0, 0x1.ba6f93080e65ep-54},
    {0x1.6247eb03a5585p+0, -0x1.383c17e40b497p-54},
    {0x1.6623882552225p+0, -0x1.bb60987591c34p-54},
    {0x1.6a09e667f3bcdp+0, -0x1.bdd3413b26456p-54},
    {0x1.6dfb23c651a2fp+0, -0x1.bbe3a683c88abp-57},
    {0x1.71f75e8ec5f74p+0, -0x1.16e4786887a99p-55},
    {0x1.75feb564267c9p+0, -0x1.0245957316dd3p-54},
    {0x1.7a11473eb0187p+0, -0x1.41577ee04992fp-55},
    {0x1.7e2f336cf4e62p+0, 0x1.05d02ba15797ep-56},
    {0x1.82589994cce13p+0, -0x1.d4c1dd41532d8p-54},
    {0x1.868d99b4492edp+0, -0x1.fc6f89bd4f6bap-54},
    {0x1.8ace5422aa0dbp+0, 0x1.6e9f156864b27p-54},
    {0x1.8f1ae99157736p+0, 0x1.5cc13a2e3976cp-55},
    {0x1.93737b0cdc5e5p+0, -0x1.75fc781b57ebcp-57},
    {0x1.97d829fde4e50p+0, -0x1.d185b7c1b85d1p-54},
    {0x1.9c49182a3f090p+0, 0x1.c7c46b071f2bep-56},
    {0x1.a0c667b5de565p+0, -0x1.359495d1cd533p-54},
    {0x1.a5503b23e255dp+0, -0x1.d2f6edb8d41e1p-54},
    {0x1.a9e6b5579fdbfp+0, 0x1.0fac90ef7fd31p-54},
    {0x1.ae89f995ad3adp+0, 0x1.7a1cd345dcc81p-54},
    {0x1.b33a2b84f15fbp+0, -0x1.2805e3084d708p-57},
    {0x1.b7f76f2fb5e47p+0, -0x1.5584f7e54ac3bp-56},
    {0x1.bcc1e904bc1d2p+0, 0x1.23dd07a2d9e84p-55},
    {0x1.c199bdd85529cp+0, 0x1.11065895048ddp-55},
    {0x1.c67f12e57d14bp+0, 0x1.2884dff483cadp-54},
    {0x1.cb720dcef9069p+0, 0x1.503cbd1e949dbp-56},
    {0x1.d072d4a07897cp+0, -0x1.cbc3743797a9cp-54},
    {0x1.d5818dcfba487p+0, 0x1.2ed02d75b3707p-55},
    {0x1.da9e603db3285p+0, 0x1.c2300696db532p-54},
    {0x1.dfc97337b9b5fp+0, -0x1.1a5cd4f184b5cp-54},
    {0x1.e502ee78b3ff6p+0, 0x1.39e8980a9cc8fp-55},
    {0x1.ea4afa2a490dap+0, -0x1.e9c23179c2893p-54},
    {0x1.efa1bee615a27p+0, 0x1.dc7f486a4b6b0p-54},
    {0x1.f50765b6e4540p+0, 0x1.9d3e12dd8a18bp-54},
    {0x1.fa7c1819e90d8p+0, 0x1.74853f3a5931ep-55},
};

/* 1/n! = hi + lo, n = 0..10 */
const mf_dd mf_fact_inv[11] = {
    {0x1.0000000000000p+0, 0x0p+0},
    {0x1.0000000000000p+0, 0x0p+0},
    {0x1.0000000000000p-1, 0x0p+0},
    {0x1.5555555555555p-3, 0x1.5555555555555p-57},
    {0x1.5555555555555p-5, 0x1.5555555555555p-59},
    {0x1.1111111111111p-7, 0x1.1111111111111p-63},
    {0x1.6c16c16c16c17p-10, -0x1.f49f49f49f49fp-65},
    {0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-73},
    {0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-76},
    {0x1.71de3a556c734p-19, -0x1.c154f8ddc6c00p-73},
    {0x1.27e4fb7789f5cp-22, 0x1.cbbc05b4fa99ap-76},
};

typedef struct {
    double kd, t; /* k, x - k C1 (exact) */
    int j, e;
} exp_red;

static inline exp_red exp_reduce(float x)
{
    exp_red rd;
    double xd = x;
    /* nearest integer to x 64/ln2 (a neighbour would do as well: |r| grows by 2^-53 at most) */
    rd.kd = (xd * MF_EXP_INV + 0x1.8p52) - 0x1.8p52;
    int k = (int)rd.kd;
    rd.t = xd - rd.kd * MF_EXP_C1;
    rd.j = (int)((unsigned)k & 63u);
    rd.e = (k - rd.j) / 64;
    return rd;
}

int mf_expf_fast(float x, float *y)
{
    if (!(x > MF_EXP_LO)) { /* NaN, -inf, and everything that rounds to +0 */
        *y = x != x ? x + x : 0.0f;
        return 1;
    }
    if (x > MF_EXP_HI) {
        *y = INFINITY;
        return 1;
    }
    exp_red rd = exp_reduce(x);
    double r = (rd.t - rd.kd * MF_EXP_C2) - rd.kd * MF_EXP_C3;
    double q =
        r * (1.0 + r * (0x1p-1 + r * (mf_fact_inv[3].hi +
                                      r * (mf_fact_inv[4].hi +
                                           r * (mf_fact_inv[5].hi + r * mf_fact_inv[6].hi)))));
    const mf_dd *T = &mf_exp_tab[rd.j];
    double v = T->hi + (T->lo + T->hi * q);
    return round_test(v * pow2i(rd.e), MF_EXP_FAST_C, y);
}

/* Error below 2^-100 relative: r = x - k ln2/64 as a double-double within 2^-110 (k C2 exact,
 * k C3 rounded by 2^-53 |k C3| < 2^-111, the remainder of ln2/64 times k < 2^-114); the Taylor
 * polynomial of degree 10 is within r^11/11! < 2^-107 of e^r; each of its 10 double-double
 * Horner steps and the product with the table entry adds about 2^-104. */
float mf_expf_accurate(float x)
{
    if (!(x > MF_EXP_LO))
        return x != x ? x + x : 0.0f;
    if (x > MF_EXP_HI)
        return INFINITY;
    exp_red rd = exp_reduce(x);
    mf_dd r = two_sum(rd.t, -(rd.kd * MF_EXP_C2));
    r = fast_two_sum(r.hi, r.lo - rd.kd * MF_EXP_C3);
    mf_dd p = mf_fact_inv[10];
    for (int n = 9; n >= 0; n--)
        p = dd_add(dd_mul(p, r), mf_fact_inv[n]);
    p = dd_mul(p, mf_exp_tab[rd.j]);
    double s = pow2i(rd.e);
    return dd_to_float((mf_dd){p.hi * s, p.lo * s});
}

float mf_expf(float x)
{
    float y;
    if (mf_expf_fast(x, &y))
        return y;
    return mf_expf_accurate(x);
}

/* ---- log1p ----
 * |x| < 2^-5: log1p(x) = 2 atanh(s), s = x / (2 + x), |s| < 2^-6.
 * else u = 1 + x = 2^e m, m in [1, 2), c = 1 + (i + 1/2)/128 the centre of m's 1/128 bucket:
 * log1p(x) = e ln2 + log(c) + 2 atanh(t), t = (m - c)/(m + c), |t| < 2^-9. For c > sqrt 2 the
 * table holds log(c/2) and e counts one more, so that e ln2 and log(c) never cancel by more than
 * a factor 2 (u near 1 is the small branch). */

/* log(c_i) (i <= 52) or log(c_i / 2) (i > 52) = hi + lo */
static const mf_dd LOG_T[128] = {
    {0x1.ff00aa2b10bc0p-9, 0x1.2821ad5a6d353p-63},
    {0x1.7dc475f810a77p-7, -0x1.16d7687d3df21p-62},
    {0x1.3cea44346a575p-6, -0x1.0cb5a902b3a1cp-62},
    {0x1.b9fc027af9198p-6, -0x1.0ae69229dc868p-64},
    {0x1.1b0d98923d980p-5, -0x1.e9ae889bac481p-60},
    {0x1.58a5bafc8e4d5p-5, -0x1.ce55c2b4e2b72p-59},
    {0x1.95c830ec8e3ebp-5, 0x1.f5a0e80520bf2p-59},
    {0x1.d276b8adb0b52p-5, 0x1.1e3c53257fd47p-61},
    {0x1.075983598e471p-4, 0x1.80da5333c45b8p-59},
    {0x1.253f62f0a1417p-4, -0x1.c125963fc4cfdp-62},
    {0x1.42edcbea646f0p-4, 0x1.ddd4f935996c9p-59},
    {0x1.60658a93750c4p-4, -0x1.388458ec21b6ap-58},
    {0x1.7da766d7b12cdp-4, -0x1.eeedfcdd94131p-58},
    {0x1.9ab42462033adp-4, -0x1.2099e1c184e8ep-59},
    {0x1.b78c82bb0eda1p-4, 0x1.0878cf0327e21p-61},
    {0x1.d4313d66cb35dp-4, 0x1.790dd951d90fap-58},
    {0x1.f0a30c01162a6p-4, 0x1.85f325c5bbacdp-58},
    {0x1.0671512ca596ep-3, 0x1.50c647eb86499p-58},
    {0x1.14785846742acp-3, 0x1.a28813e3a7f07p-57},
    {0x1.2266f190a5acbp-3, 0x1.f547bf1809e88p-57},
    {0x1.303d718e47fd3p-3, -0x1.6b9c7d96091fap-63},
    {0x1.3dfc2b0ecc62ap-3, -0x1.ab3a8e7d81017p-58},
    {0x1.4ba36f39a55e5p-3, 0x1.68981bcc36756p-57},
    {0x1.59338d9982086p-3, -0x1.65d22aa8ad7cfp-58},
    {0x1.66acd4272ad51p-3, -0x1.0900e4e1ea8b2p-58},
    {0x1.740f8f54037a5p-3, -0x1.b264062a84cdbp-58},
    {0x1.815c0a14357ebp-3, -0x1.4be48073a0564p-58},
    {0x1.8e928de886d41p-3, -0x1.569d851a56770p-57},
    {0x1.9bb362e7dfb83p-3, 0x1.575e31f003e0cp-57},
    {0x1.a8becfc882f19p-3, -0x1.e8c37918c39ebp-58},
    {0x1.b5b519e8fb5a4p-3, 0x1.ba27fdc19e1a0p-57},
    {0x1.c2968558c18c1p-3, -0x1.73dee38a3fb6bp-57},
    {0x1.cf6354e09c5dcp-3, 0x1.239a07d55b695p-57},
    {0x1.dc1bca0abec7dp-3, 0x1.834c51998b6fcp-57},
    {0x1.e8c0252aa5a60p-3, -0x1.6e03a39bfc89bp-59},
    {0x1.f550a564b7b37p-3, 0x1.c5f6dfd018c37p-61},
    {0x1.00e6c45ad501dp-2, -0x1.cb9568ff6feadp-57},
    {0x1.071b85fcd590dp-2, 0x1.d1707f97bde80p-58},
    {0x1.0d46b579ab74bp-2, 0x1.03ec81c3cbd92p-57},
    {0x1.136870293a8b0p-2, 0x1.7b66298edd24ap-56},
    {0x1.1980d2dd4236fp-2, 0x1.9d3d1b0e4d147p-56},
    {0x1.1f8ff9e48a2f3p-2, -0x1.c9fdf9a0c4b07p-56},
    {0x1.2596010df763ap-2, -0x1.0f76c57075e9ep-58},
    {0x1.2b9303ab89d25p-2, -0x1.896b5fd852ad4p-56},
    {0x1.31871c9544185p-2, -0x1.51acc4c09b379p-60},
    {0x1.3772662bfd85bp-2, -0x1.b5629d8117de7p-59},
    {0x1.3d54fa5c1f710p-2, -0x1.e3265c6a1c98dp-56},
    {0x1.432ef2a04e814p-2, -0x1.29931715ac903p-56},
    {0x1.49006804009d1p-2, -0x1.9ffc341f177dcp-57},
    {0x1.4ec973260026ap-2, -0x1.42a87d977dc5ep-56},
    {0x1.548a2c3add263p-2, -0x1.819cf7e308ddbp-57},
    {0x1.5a42ab0f4cfe2p-2, -0x1.8ebcb7dee9a3dp-56},
    {0x1.5ff3070a793d4p-2, -0x1.bc60efafc6f6ep-57},
    {-0x1.602d08af091ecp-2, 0x1.6e8920c09b73fp-58},
    {-0x1.5a8cadbbedfa1p-2, 0x1.e6c2bdfb3e037p-58},
    {-0x1.54f431b7be1a9p-2, 0x1.aacfdbbdab914p-56},
    {-0x1.4f637ebba9810p-2, 0x1.58cb3124b9245p-56},
    {-0x1.49da7f3bcc41fp-2, 0x1.9964a168ccacap-57},
    {-0x1.44591e0539f49p-2, 0x1.2b125247b0fa5p-56},
    {-0x1.3edf463c1683ep-2, -0x1.83d680d3c1084p-56},
    {-0x1.396ce359bbf54p-2, 0x1.ce2b31b31e8b0p-58},
    {-0x1.3401e12aecba1p-2, 0x1.cd55b8a4746c0p-58},
    {-0x1.2e9e2bce12286p-2, -0x1.8251a3b83d97ap-62},
    {-0x1.2941afb186b7cp-2, 0x1.856e61c515740p-57},
    {-0x1.23ec5991eba49p-2, -0x1.bb75d1addf870p-60},
    {-0x1.1e9e1678899f4p-2, -0x1.512c3749a1e4ep-56},
    {-0x1.1956d3b9bc2fap-2, -0x1.7b9d68d50a15dp-56},
    {-0x1.14167ef367783p-2, -0x1.e0936abd4fa6ep-62},
    {-0x1.0edd060b78081p-2, 0x1.92b49ef282b09p-57},
    {-0x1.09aa572e6c6d4p-2, -0x1.43c2e68684d53p-57},
    {-0x1.047e60cde83b8p-2, 0x1.0779634061cbcp-56},
    {-0x1.feb2233ea07cdp-3, -0x1.8de00938b4c40p-61},
    {-0x1.f474b134df229p-3, 0x1.27c77ded76aadp-58},
    {-0x1.ea4449f04aaf5p-3, 0x1.d33919ab94074p-57},
    {-0x1.e020cc6235ab5p-3, -0x1.fea48dd7b81d1p-58},
    {-0x1.d60a17f903515p-3, 0x1.c0df841a71b7ap-57},
    {-0x1.cc000c9db3c52p-3, -0x1.53d154280394fp-57},
    {-0x1.c2028ab17f9b4p-3, -0x1.f11aa3853a5f1p-57},
    {-0x1.b811730b823d2p-3, -0x1.a0ee735d9f0ecp-60},
    {-0x1.ae2ca6f672bd4p-3, -0x1.ab5ca9eaa088ap-57},
    {-0x1.a454082e6ab05p-3, -0x1.df207dc5c34c6p-58},
    {-0x1.9a8778debaa38p-3, -0x1.f47dfd871f87fp-57},
    {-0x1.90c6db9fcbcd9p-3, -0x1.054473941ad99p-57},
    {-0x1.871213750e994p-3, -0x1.d685f35eea2a0p-57},
    {-0x1.7d6903caf5ad0p-3, 0x1.ac5f0c075b847p-59},
    {-0x1.73cb9074fd14dp-3, 0x1.521a000b4cf01p-57},
    {-0x1.6a399dabbd383p-3, -0x1.96332bd4b341fp-57},
    {-0x1.60b3100b09476p-3, 0x1.5b2623e05016bp-58},
    {-0x1.5737cc9018cddp-3, -0x1.4f4d710fec38ep-57},
    {-0x1.4dc7b897bc1c8p-3, 0x1.927d47803c5f4p-57},
    {-0x1.4462b9dc9b3dcp-3, 0x1.629c46c186385p-58},
    {-0x1.3b08b6757f2a9p-3, -0x1.70d6cdf05266cp-60},
    {-0x1.31b994d3a4f85p-3, 0x1.c4716bdfc0cc9p-58},
    {-0x1.28753bc11aba5p-3, 0x1.6394d9fa33311p-57},
    {-0x1.1f3b925f25d41p-3, -0x1.62c9ef939ac5dp-59},
    {-0x1.160c8024b27b1p-3, 0x1.2d56ff61c2bfbp-57},
    {-0x1.0ce7ecdccc28dp-3, 0x1.692a0055dc959p-57},
    {-0x1.03cdc0a51ec0dp-3, -0x1.39e2d3f8b7d10p-57},
    {-0x1.f57bc7d9005dbp-4, 0x1.9361574fb24e2p-58},
    {-0x1.e3707ee30487bp-4, -0x1.09ccecd579d99p-58},
    {-0x1.d179788219364p-4, -0x1.9daf7df76ad2ap-59},
    {-0x1.bf968769fca11p-4, 0x1.cdc9f6f5f38c7p-59},
    {-0x1.adc77ee5aea8cp-4, -0x1.37d8f39bee659p-58},
    {-0x1.9c0c32d4d2548p-4, -0x1.fb0be3ccc1532p-59},
    {-0x1.8a6477a91dc29p-4, 0x1.fa83214904842p-59},
    {-0x1.78d02263d82d3p-4, -0x1.abca5b4fdb880p-58},
    {-0x1.674f089365a7ap-4, 0x1.9acd8b33f8fdcp-58},
    {-0x1.55e10050e0384p-4, 0x1.45f9d61c68c1bp-58},
    {-0x1.4485e03dbdfadp-4, -0x1.1ba349aadbc6ep-58},
    {-0x1.333d7f8183f4bp-4, -0x1.a92afc8ef70b1p-58},
    {-0x1.2207b5c78549ep-4, 0x1.cc0fbce104eaap-58},
    {-0x1.10e45b3cae831p-4, 0x1.a4a128d192686p-58},
    {-0x1.ffa6911ab9301p-5, 0x1.cd9f1f95c2eedp-59},
    {-0x1.dda8adc67ee4ep-5, -0x1.4e6c986f44c55p-59},
    {-0x1.bbcebfc68f420p-5, -0x1.e5cf3a0f56f72p-60},
    {-0x1.9a187b573de7cp-5, 0x1.727626c86b3abp-59},
    {-0x1.788595a3577bap-5, -0x1.e5ef898b67923p-59},
    {-0x1.5715c4c03ceefp-5, 0x1.bbf88ec501b56p-61},
    {-0x1.35c8bfaa1306bp-5, 0x1.50830a65543a4p-63},
    {-0x1.149e3e4005a8dp-5, 0x1.53482d1f9d7d7p-61},
    {-0x1.e72bf2813ce51p-6, -0x1.75b44595cab18p-60},
    {-0x1.a55f548c5c43fp-6, -0x1.ec1a5f86d41f9p-62},
    {-0x1.63d6178690bd6p-6, 0x1.8ed4d357c9c97p-64},
    {-0x1.228fb1fea2e28p-6, 0x1.cd7b66e01c26dp-61},
    {-0x1.c317384c75f06p-7, -0x1.806208c04c220p-61},
    {-0x1.41929f96832f0p-7, 0x1.c5517f64bc223p-61},
    {-0x1.8121214586b54p-8, -0x1.c14b9f9377a1dp-65},
    {-0x1.0040155d5889ep-9, 0x1.8f98e1113f403p-65},
};

/* 1/(2n+1) = hi + lo, n = 0..8 */
static const mf_dd ODD_INV[9] = {
    {0x1.0000000000000p+0, 0x0p+0},
    {0x1.5555555555555p-2, 0x1.5555555555555p-56},
    {0x1.999999999999ap-3, -0x1.999999999999ap-57},
    {0x1.2492492492492p-3, 0x1.2492492492492p-57},
    {0x1.c71c71c71c71cp-4, 0x1.c71c71c71c71cp-58},
    {0x1.745d1745d1746p-4, -0x1.745d1745d1746p-59},
    {0x1.3b13b13b13b14p-4, -0x1.3b13b13b13b14p-58},
    {0x1.1111111111111p-4, 0x1.1111111111111p-60},
    {0x1.e1e1e1e1e1e1ep-5, 0x1.e1e1e1e1e1e1ep-61},
};

/* ln2 = LN2_1 + LN2_2 + LN2_3 (+ < 2^-155), LN2_1 40 bits wide so that e LN2_1 is exact; the
 * fast path drops LN2_3 (|e LN2_3| < 2^-95) */
#define LN2_1     0x1.62e42fefa4000p-1
#define LN2_2     -0x1.8432a1b0e2634p-43
#define LN2_3     0x1.f97b57a079a19p-103
#define LOG_SMALL 0x1p-5

typedef struct {
    int e, i;  /* u = 2^e m after the sqrt 2 adjustment; i the bucket */
    double mh; /* m (the high part of u scaled) */
    double sc; /* 2^-e0, the scale that took u's high part to m */
} log_red;

static inline log_red log_reduce(double uh)
{
    log_red rd;
    uint64_t b;
    memcpy(&b, &uh, sizeof b);
    int e0 = (int)(b >> 52) - 1023; /* uh >= 2^-1 and finite: normal */
    rd.i = (int)((b >> 45) & 127);
    rd.sc = pow2i(-e0);
    rd.mh = uh * rd.sc;
    rd.e = e0 + (rd.i > 52);
    return rd;
}

static inline double log_centre(int i)
{
    return 1.0 + ((double)i + 0.5) * 0x1p-7;
}

/* Small branch, error against log1p(x): 2 + x rounds by 2^-53, the division by 2^-53, so s is
 * within 2.01 * 2^-53 |s|; the odd series' tail beyond s^11 is below 2^-75 |s|, and its part
 * 2 s z P(z) (< 2^-13 of the sum) carries its own few roundings into < 2^-63; the final add
 * rounds by 2^-53. |y - log1p(x)| < 3.02 * 2^-53 |y|.
 * Table branch: t is within 2.01 * 2^-53 |t| (m + c and the division; m - c is exact by
 * Sterbenz), so 2 atanh(t) is within 2^-60 absolute (|t| < 2^-9) and the series' tail below
 * 2^-70; |log1p(x)| > 2^-5.1 there, so that is 2^-54.9 relative. e LN2_1 is exact; with the
 * table's hi the sum hi = e LN2_1 + L_hi rounds by 2^-53 |hi| <= 2^-52 |y| (no cancellation
 * beyond a factor 2); lo's three terms are below 2^-8 |y| and round with < 2^-60; the final
 * add rounds by 2^-53 |y|. |y - log1p(x)| < 3.3 * 2^-53 |y|.
 * With half an ulp for y +- c|y| the test needs c >= 4.3 * 2^-53: c = 8 * 2^-53. */
#define LOG_FAST_C 0x1p-50

static double log1p_small(double xd)
{
    double s = xd / (2.0 + xd), z = s * s;
    double p = ODD_INV[1].hi +
               z * (ODD_INV[2].hi + z * (ODD_INV[3].hi + z * (ODD_INV[4].hi + z * ODD_INV[5].hi)));
    double s2 = 2.0 * s;
    return s2 + s2 * (z * p);
}

static double log1p_table(double xd)
{
    log_red rd = log_reduce(1.0 + xd); /* exact below 2^53; above, log(u) moves < 2^-58 */
    double c = log_centre(rd.i);
    double t = (rd.mh - c) / (rd.mh + c), w = t * t;
    double at = 2.0 * t + 2.0 * t * (w * (ODD_INV[1].hi + w * (ODD_INV[2].hi + w * ODD_INV[3].hi)));
    double ed = (double)rd.e;
    double hi = ed * LN2_1 + LOG_T[rd.i].hi;
    double lo = (ed * LN2_2 + LOG_T[rd.i].lo) + at;
    return hi + lo;
}

/* The special inputs: 1 and *y set for NaN, x <= -1, +-0 and +inf. */
static inline int log1p_special(float x, float *y)
{
    if (!(x > -1.0f)) {
        *y = x == -1.0f ? -INFINITY : x != x ? x + x : NAN;
        return 1;
    }
    if (x == 0.0f || x == INFINITY) {
        *y = x;
        return 1;
    }
    return 0;
}

int mf_log1pf_fast(float x, float *y)
{
    if (log1p_special(x, y))
        return 1;
    double xd = x, ax = xd < 0 ? -xd : xd;
    double v = ax < LOG_SMALL ? log1p_small(xd) : log1p_table(xd);
    return round_test(v, LOG_FAST_C, y);
}

/* Accurate small branch: 2 + x exact as a double-double, s by the double-double division
 * (< 2^-104), the odd series to s^17 (tail < 2^-108 |s|) in double-double. */
static mf_dd log1p_small_dd(double xd)
{
    mf_dd s = dd_div((mf_dd){xd, 0.0}, two_sum(2.0, xd));
    mf_dd z = dd_mul(s, s);
    mf_dd p = ODD_INV[8];
    for (int n = 7; n >= 1; n--)
        p = dd_add(dd_mul(p, z), ODD_INV[n]);
    p = dd_add(dd_mul(p, z), ODD_INV[0]);
    return dd_mul(dd_mul_d(s, 2.0), p);
}

/* Accurate table branch: u = 1 + x exactly as a double-double, t by the double-double division,
 * the odd series to t^13 (tail < 2^-115 |t|), e ln2 as e LN2_1 (exact) + e LN2_2 (exact by
 * Dekker) + e LN2_3 (rounded: < 2^-147); |log1p(x)| > 2^-5.1 here, so all of it is within about
 * 2^-100 relative. */
static mf_dd log1p_table_dd(double xd)
{
    mf_dd u = two_sum(1.0, xd);
    log_red rd = log_reduce(u.hi);
    double c = log_centre(rd.i);
    mf_dd m = {rd.mh, u.lo * rd.sc};
    mf_dd num = two_sum(m.hi - c, m.lo); /* m.hi - c is exact (Sterbenz) */
    mf_dd den = dd_add(two_sum(m.hi, c), (mf_dd){m.lo, 0.0});
    mf_dd t = dd_div(num, den), w = dd_mul(t, t);
    mf_dd p = ODD_INV[6];
    for (int n = 5; n >= 0; n--)
        p = dd_add(dd_mul(p, w), ODD_INV[n]);
    mf_dd at = dd_mul(dd_mul_d(t, 2.0), p);
    double ed = (double)rd.e;
    mf_dd eln2 = dd_add((mf_dd){ed * LN2_1, 0.0}, two_prod(ed, LN2_2));
    eln2 = dd_add(eln2, (mf_dd){ed * LN2_3, 0.0});
    return dd_add(dd_add(eln2, LOG_T[rd.i]), at);
}

float mf_log1pf_accurate(float x)
{
    float y;
    if (log1p_special(x, &y))
        return y;
    double xd = x, ax = xd < 0 ? -xd : xd;
    return dd_to_float(ax < LOG_SMALL ? log1p_small_dd(xd) : log1p_table_dd(xd));
}

float mf_log1pf(float x)
{
    float y;
    if (mf_log1pf_fast(x, &y))
        return y;
    return mf_log1pf_accurate(x);
}
