/*
 * gemm_avx2.c — the AVX2+FMA expert GEMMs (compiled with -mavx2 -mfma; gemm_drive.c calls in only
 * when cpuid reports both). Results equal gemm_ref.c bit for bit; tests/unit/test_gemm.c
 * proves it against an independent float64 model.
 *
 * Every kernel vectorises across output rows: a ymm register holds 8 rows (4 for doubles) of
 * one k, so a block partial P lands in the lanes of its rows with no horizontal sums, and the
 * per-block epilogue is lane-wise fp32 arithmetic in exactly the order of gemm.h. Each P is
 * the exact block sum rounded once; the sections below give the argument for each path.
 *
 *   MXFP4, one token        vpmaddubsw on two 7-bit activation digits       (mxs_kernel)
 *   MXFP4, two or more      vpmaddwd on int16 activations, <= 6 tokens/tile (mx_kernel)
 *   FP8, up to 5 tokens     exact double FMAs, weights decoded on the fly   (f8_direct)
 *   FP8, 6 or more          int32 sums with vpmaddwd + sparse corrections   (f8i_*)
 * The weights are decoded in registers from the packed layout, except in the many-token FP8
 * path, which decodes each (octet, 128-block) once per token tile into an int16 panel.
 *
 * ---- activations: an exact hi/lo split by exponent ----
 * An e4m3 value (8+m) * 2^(e-10) (m * 2^-9 for e = 0) is split, for a threshold E0, into
 *   hi = (8+m) * 2^(e-E0)           when e >= E0: the value in units of 2^(E0-10), an integer
 *   lo = value * 2^9                when e < E0:  |lo| < 2^(E0-1), an integer
 * so that value = hi * 2^(E0-10) + lo * 2^-9 exactly, one of the two being zero (split16).
 *
 * ---- FP8 x MXFP4 with vpmaddwd (two or more tokens) ----
 * E0 = 4: |hi| <= 14 * 2^11 = 28672 fits int16; |lo| <= 15 * 4 = 60. A weight w (e2m1) is
 * decoded to the unsigned byte w' = 2w + 12 in [0, 24] (no sign extension needed), and
 * sum(a * 2w) = sum(a * w') - 12 * sum(a): the correction depends on the token only and is the
 * accumulator's starting value. vpmaddwd multiplies int16 pairs into int32 exactly; with
 * |hi| <= 28672, w' <= 24 and 32 terms the running sum stays within +-33.1M. So
 *   S_hi = sum(hi * 2w)  exactly, in units of 2^-7,
 *   S_lo = sum(lo * 2w)  exactly, in units of 2^-10 (only when some lo is non-zero),
 *   S    = 8 * S_hi + S_lo, |S| <= 32 * 6 * 448 * 2^10 < 2^27, exact in int32,
 * and P = fp32(S) * unit: vcvtdq2ps rounds once to nearest even, the unit is a power of two
 * and |P| is 0 or >= 2^-10, so the scaling is exact. Quantized activation blocks rarely have
 * lo values (|a| < 2^-3 = amax / 1792 or less), so the lo pass runs only for blocks where some
 * token of the micro-tile needs it. Then acc = acc + (P * a_scale) * 2^(S-127), three
 * separate fp32 operations per lane.
 *
 * ---- FP8 x FP8 with doubles (up to 5 tokens) ----
 * e4m3 x e4m3 products have <= 8 significant bits, but a 128-term sum needs up to 43 bits
 * (units of 2^-18 up to 128 * 448^2 < 2^25), more than fp32 has and more than int32 holds.
 * A double holds every partial sum exactly, so an FMA that adds an exact product to an exact
 * partial sum rounds nothing, in any order. The weight is decoded without arithmetic into the
 * double with bit pattern sign<<63 | (e4m3 magnitude bits)<<49, whose value is w * 2^-1016
 * (e4m3 subnormals become double subnormals, still exact); activations are pre-scaled to
 * a * 2^1000 (exact, no overflow since |a| < 2^9). Products are a*w*2^-16 — exact — and every
 * partial sum is a multiple of 2^-34 below 2^9: 43 bits, exact in a double. At the block end
 * P = fp32(acc * 2^16), one rounding (vcvtpd2ps, nearest even). Then
 * acc32 = acc32 + P * (a_scale * w_scale).
 *
 * ---- FP8 x FP8 in integers (6 or more tokens) ----
 * See the section "FP8 x FP8, many tokens" below: the common case A * W is summed in int32
 * with vpmaddwd at twice the double rate, the rare small values are exact sparse corrections.
 *
 * ---- NaN codes ----
 * e4m3 NaN codes (0x7F, 0xFF) decode to ordinary numbers here, so they are handled beside the
 * sums: an activation block containing one gets a NaN activation scale (P * NaN = NaN, as the
 * reference's NaN P gives); FP8 weight rows with one in a block are OR-ed with a NaN pattern in
 * that block's P (nanrows, recorded at pack time). NaN results are NaN; their sign and payload
 * are not part of the contract. e8m0 codes 0 and 255 decode as fmt_e8m0_to_f32 does.
 *
 * The packed layouts and the packers are in gemm_avx2_pack.c.
 *
 * ---- threads ----
 * gemm_avx2_run is called by every thread of the pool. The work items are (token tile, chunk
 * of octets), taken from a shared counter; each output element is computed by one thread, so
 * no result depends on the split. Weights stream from memory once per token tile, with
 * software prefetching ahead of the hardware prefetcher.
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/gemm_simd.h"
#include "kernels/formats.h"
#include "kernels/fp_exact.h" /* last: no contraction below (docs/numerics.md §0) */

/* ---- FP8 x MXFP4 ---- */

/* One token's preprocessed activations for one K chunk (see mx_prep). */
typedef struct mx_tok {
    const uint32_t *hi, *lo;  /* (a_2j, a_2j+1) int16 pairs */
    const int32_t *chi, *clo; /* per 32-block: -12 * sum(hi), -12 * sum(lo) */
    const float *sa;          /* per 32-block: a_scale, or NaN when the block has a NaN code */
    const uint8_t *need;      /* per 32-block: some lo is non-zero */
    float *out;               /* this token's output at the current octet */
} mx_tok;

/* The micro-kernel keeps one int32 accumulator per token in a named variable (S0..S5; L0..L5
 * for the lo pass): arrays indexed by the token would live on the stack. T is a compile-time
 * constant in every instantiation, so the `if (T > t)` guards vanish. */

/* Decode chunk p (32 bytes = 8 rows x 8 k) into v0..v3: 8 rows x k-pair j, int16 w' = 2w+12. */
#define MX_DECODE(p)                                                                               \
    __m256i x_ = _mm256_load_si256((const __m256i *)(p));                                          \
    __m256i dl_ = _mm256_shuffle_epi8(lut, _mm256_and_si256(x_, m0f));                             \
    __m256i dh_ = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x_, 4), m0f));       \
    __m256i v0 = _mm256_and_si256(dl_, m00ff), v1 = _mm256_srli_epi16(dl_, 8);                     \
    __m256i v2 = _mm256_and_si256(dh_, m00ff), v3 = _mm256_srli_epi16(dh_, 8);

/* S<t> += the four k-pairs of the decoded chunk against token t's pairs A<t>[i..i+3] */
#define MX_MAC(t, S, A, i)                                                                         \
    if (T > t) {                                                                                   \
        __m256i s_ = S##t;                                                                         \
        s_ = _mm256_add_epi32(s_, _mm256_madd_epi16(v0, _mm256_set1_epi32((int)A##t[(i)])));       \
        s_ = _mm256_add_epi32(s_, _mm256_madd_epi16(v1, _mm256_set1_epi32((int)A##t[(i) + 1])));   \
        s_ = _mm256_add_epi32(s_, _mm256_madd_epi16(v2, _mm256_set1_epi32((int)A##t[(i) + 2])));   \
        s_ = _mm256_add_epi32(s_, _mm256_madd_epi16(v3, _mm256_set1_epi32((int)A##t[(i) + 3])));   \
        __asm__("" : "+x"(s_)); /* keep the chain: reassociated, it spills */                      \
        S##t = s_;                                                                                 \
    }

/* one 32-block: 4 chunks */
#define MX_BLOCK(S, A, wp, pair0)                                                                  \
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)                                            \
    {                                                                                              \
        MX_DECODE((wp) + 32 * q)                                                                   \
        MX_MAC(0, S, A, (pair0) + 4 * q)                                                           \
        MX_MAC(1, S, A, (pair0) + 4 * q)                                                           \
        MX_MAC(2, S, A, (pair0) + 4 * q)                                                           \
        MX_MAC(3, S, A, (pair0) + 4 * q)                                                           \
        MX_MAC(4, S, A, (pair0) + 4 * q)                                                           \
        MX_MAC(5, S, A, (pair0) + 4 * q)                                                           \
    }

#define MX_FOR_T(X) X(0) X(1) X(2) X(3) X(4) X(5)

/* Blocks [0, nb) of one octet (wd, ws point at the chunk's first block) for T tokens. */
static inline __attribute__((always_inline)) void mx_kernel(const int T, const int SPEC,
                                                            const uint8_t *wd, const uint8_t *ws,
                                                            int nb, const mx_tok *tk)
{
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    const __m256i m00ff = _mm256_set1_epi16(0x00FF);
#define MX_PTRS(t)                                                                                 \
    const mx_tok *k##t = &tk[T > t ? t : 0];                                                       \
    const uint32_t *H##t = k##t->hi, *P##t = k##t->lo;
    MX_FOR_T(MX_PTRS)
    for (int b = 0; b < nb; b++) {
        const uint8_t *wp = wd + 128 * b;
        /* weights stream from memory once: fetch ahead of the hardware prefetcher */
        _mm_prefetch((const char *)(wp + GEMM_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(wp + GEMM_PREFETCH + 64), _MM_HINT_T0);
        if ((b & 7) == 0)
            _mm_prefetch((const char *)(ws + 8 * b + GEMM_PREFETCH / 16), _MM_HINT_T0);
        __m256i S0, S1, S2, S3, S4, S5;
#define MX_INIT_HI(t) S##t = _mm256_set1_epi32(k##t->chi[b]);
        MX_FOR_T(MX_INIT_HI)
        MX_BLOCK(S, H, wp, 16 * b)
        int need = 0;
#define MX_NEED(t)                                                                                 \
    if (T > t)                                                                                     \
        need |= k##t->need[b];
        MX_FOR_T(MX_NEED)
        __m256 unit = _mm256_set1_ps(0x1p-7f);
        if (__builtin_expect(need, 0)) {
            __m256i L0, L1, L2, L3, L4, L5;
#define MX_INIT_LO(t) L##t = _mm256_set1_epi32(k##t->clo[b]);
            MX_FOR_T(MX_INIT_LO)
            /* decode again rather than let the compiler keep (spill) the hi pass's 16 decoded
             * vectors for this rare path: hide that wq == wp */
            const uint8_t *wq = wp;
            __asm__("" : "+r"(wq));
            MX_BLOCK(L, P, wq, 16 * b)
#define MX_COMBINE(t) S##t = _mm256_add_epi32(_mm256_slli_epi32(S##t, 3), L##t);
            MX_FOR_T(MX_COMBINE)
            unit = _mm256_set1_ps(0x1p-10f);
        }
        __m256 wsc = SPEC ? e8m0x8(ws + 8 * b) : e8m0x8_plain(ws + 8 * b);
#define MX_EPILOGUE(t)                                                                             \
    if (T > t) {                                                                                   \
        __m256 p_ = _mm256_mul_ps(_mm256_cvtepi32_ps(S##t), unit);                                 \
        p_ = _mm256_mul_ps(p_, _mm256_set1_ps(k##t->sa[b]));                                       \
        p_ = _mm256_mul_ps(p_, wsc);                                                               \
        _mm256_storeu_ps(k##t->out, _mm256_add_ps(_mm256_loadu_ps(k##t->out), p_));                \
    }
        MX_FOR_T(MX_EPILOGUE)
    }
}

/* ---- FP8 x MXFP4, one or two tokens: vpmaddubsw on two 7-bit activation digits ----
 *
 * With few tokens the decode dominates, and vpmaddubsw takes the decoded bytes as they come
 * out of vpshufb (no widening to int16). It needs the activation as signed bytes, so hi is
 * taken in units of 2^-5 instead (every |a| >= 2^-2 is a multiple of 2^-5; |hi| <= 448 * 32 =
 * 14336) and split into two digits hi = 128 * d1 + d0, d0 in [0, 127], d1 in [-112, 112];
 * lo (|a| < 2^-2, not a multiple of 2^-5) is a * 2^9, |lo| <= 127, one digit. A vpmaddubsw
 * lane is w'_k * d_k + w'_k+2 * d_k+2 with w' <= 24: |.| <= 6144, and four of them added in
 * int16 stay below 24576, so they are summed in int16 for 4 steps and then widened with
 * vpmaddwd (x1 for d0, x128 for d1), which also adds the two lanes of a row (t = 0, 1).
 *   I = sum(hi * 2w), units 2^-6 (with the -12 * sum(hi) correction as starting value);
 *   S = 16 * I + sum(lo * 2w), units 2^-10, when some lo is non-zero.
 * The digits are stored per 8 k in the order 0 2 1 3 4 6 5 7, so that one broadcast dword
 * matches the bytes (k, k+2) of row lanes t = 0 and t = 1 of a decoded chunk. */

typedef struct mxs_tok {
    const int8_t *d0, *d1, *lo; /* per k, permuted as above */
    const int32_t *chi, *clo;   /* per 32-block: -12 * sum(hi), -12 * sum(lo) */
    const float *sa;
    const uint8_t *need;
    float *out;
} mxs_tok;

static inline int32_t ld32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc (int16) = or += the two halves of a decoded chunk against digits dg[8q..8q+7] */
#define MXS_STEP(acc, first, dg, q)                                                                \
    do {                                                                                           \
        __m256i m_ = _mm256_maddubs_epi16(dl_, _mm256_set1_epi32(ld32((dg) + 8 * (q))));           \
        acc = (first) ? m_ : _mm256_add_epi16(acc, m_);                                            \
        acc = _mm256_add_epi16(                                                                    \
            acc, _mm256_maddubs_epi16(dh_, _mm256_set1_epi32(ld32((dg) + 8 * (q) + 4))));          \
    } while (0)

#define MXS_DECODE(p)                                                                              \
    __m256i x_ = _mm256_load_si256((const __m256i *)(p));                                          \
    __m256i dl_ = _mm256_shuffle_epi8(lut, _mm256_and_si256(x_, m0f));                             \
    __m256i dh_ = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x_, 4), m0f));

static inline __attribute__((always_inline)) void mxs_kernel(const int T, const int SPEC,
                                                             const uint8_t *wd, const uint8_t *ws,
                                                             int nb, const mxs_tok *tk)
{
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    const __m256i one16 = _mm256_set1_epi16(1), w128 = _mm256_set1_epi16(128);
    const mxs_tok *k0 = &tk[0], *k1 = &tk[T > 1 ? 1 : 0];
    for (int b = 0; b < nb; b++) {
        const uint8_t *wp = wd + 128 * b;
        /* weights stream from memory once: fetch ahead of the hardware prefetcher */
        _mm_prefetch((const char *)(wp + GEMM_PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(wp + GEMM_PREFETCH + 64), _MM_HINT_T0);
        if ((b & 7) == 0)
            _mm_prefetch((const char *)(ws + 8 * b + GEMM_PREFETCH / 16), _MM_HINT_T0);
        const int8_t *a0 = k0->d0 + 32 * b, *c0 = k0->d1 + 32 * b;
        const int8_t *a1 = k1->d0 + 32 * b, *c1 = k1->d1 + 32 * b;
        __m256i I0 = _mm256_set1_epi32(k0->chi[b]), I1 = _mm256_set1_epi32(k1->chi[b]);
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            __m256i A0 = _mm256_setzero_si256(), B0 = A0, A1 = A0, B1 = A0;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                int q = 2 * g + h;
                MXS_DECODE(wp + 32 * q)
                MXS_STEP(A0, h == 0, a0, q);
                MXS_STEP(B0, h == 0, c0, q);
                if (T > 1) {
                    MXS_STEP(A1, h == 0, a1, q);
                    MXS_STEP(B1, h == 0, c1, q);
                }
            }
            I0 = _mm256_add_epi32(I0, _mm256_madd_epi16(A0, one16));
            I0 = _mm256_add_epi32(I0, _mm256_madd_epi16(B0, w128));
            if (T > 1) {
                I1 = _mm256_add_epi32(I1, _mm256_madd_epi16(A1, one16));
                I1 = _mm256_add_epi32(I1, _mm256_madd_epi16(B1, w128));
            }
        }
        int need = k0->need[b] | (T > 1 ? k1->need[b] : 0);
        __m256 unit = _mm256_set1_ps(0x1p-6f);
        if (__builtin_expect(need, 0)) {
            const uint8_t *wq = wp; /* see mx_kernel */
            __asm__("" : "+r"(wq));
            const int8_t *l0 = k0->lo + 32 * b, *l1 = k1->lo + 32 * b;
            __m256i L0 = _mm256_set1_epi32(k0->clo[b]), L1 = _mm256_set1_epi32(k1->clo[b]);
            for (int g = 0; g < 2; g++) {
                __m256i A0 = _mm256_setzero_si256(), A1 = A0;
                for (int h = 0; h < 2; h++) {
                    int q = 2 * g + h;
                    MXS_DECODE(wq + 32 * q)
                    MXS_STEP(A0, h == 0, l0, q);
                    if (T > 1)
                        MXS_STEP(A1, h == 0, l1, q);
                }
                L0 = _mm256_add_epi32(L0, _mm256_madd_epi16(A0, one16));
                L1 = _mm256_add_epi32(L1, _mm256_madd_epi16(A1, one16));
            }
            I0 = _mm256_add_epi32(_mm256_slli_epi32(I0, 4), L0);
            I1 = _mm256_add_epi32(_mm256_slli_epi32(I1, 4), L1);
            unit = _mm256_set1_ps(0x1p-10f);
        }
        __m256 wsc = SPEC ? e8m0x8(ws + 8 * b) : e8m0x8_plain(ws + 8 * b);
        __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(I0), unit);
        p = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_set1_ps(k0->sa[b])), wsc);
        _mm256_storeu_ps(k0->out, _mm256_add_ps(_mm256_loadu_ps(k0->out), p));
        if (T > 1) {
            p = _mm256_mul_ps(_mm256_cvtepi32_ps(I1), unit);
            p = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_set1_ps(k1->sa[b])), wsc);
            _mm256_storeu_ps(k1->out, _mm256_add_ps(_mm256_loadu_ps(k1->out), p));
        }
    }
}

typedef void (*mx_fn)(const uint8_t *wd, const uint8_t *ws, int nb, const void *tk);

#define MX_KERNEL_T(n, spec)                                                                       \
    static __attribute__((noinline)) void mx_kernel_##n##_##spec(                                  \
        const uint8_t *wd, const uint8_t *ws, int nb, const void *tk)                              \
    {                                                                                              \
        mx_kernel(n, spec, wd, ws, nb, (const mx_tok *)tk);                                        \
    }
#define MXS_KERNEL_T(n, spec)                                                                      \
    static __attribute__((noinline)) void mxs_kernel_##n##_##spec(                                 \
        const uint8_t *wd, const uint8_t *ws, int nb, const void *tk)                              \
    {                                                                                              \
        mxs_kernel(n, spec, wd, ws, nb, (const mxs_tok *)tk);                                      \
    }
MX_KERNEL_T(1, 0)
MX_KERNEL_T(2, 0)
MX_KERNEL_T(3, 0)
MX_KERNEL_T(4, 0)
MX_KERNEL_T(5, 0)
MX_KERNEL_T(6, 0)
MX_KERNEL_T(1, 1)
MX_KERNEL_T(2, 1)
MX_KERNEL_T(3, 1)
MX_KERNEL_T(4, 1)
MX_KERNEL_T(5, 1)
MX_KERNEL_T(6, 1)
MXS_KERNEL_T(1, 0)
MXS_KERNEL_T(1, 1)

/* [spec][T] */
static const mx_fn mx_kernels[2][7] = {{NULL, mx_kernel_1_0, mx_kernel_2_0, mx_kernel_3_0,
                                        mx_kernel_4_0, mx_kernel_5_0, mx_kernel_6_0},
                                       {NULL, mx_kernel_1_1, mx_kernel_2_1, mx_kernel_3_1,
                                        mx_kernel_4_1, mx_kernel_5_1, mx_kernel_6_1}};
/* [spec]; only the one-token instantiation is used: with two tokens this kernel spills and the
 * vpmaddwd kernel is faster */
static const mx_fn mxs_kernels[2] = {mxs_kernel_1_0, mxs_kernel_1_1};

/* ---- FP8 x FP8 ---- */

typedef struct f8_tok {
    const double *a; /* activation * 2^1000 */
    const float *sa; /* per 128-block: a_scale, or NaN when the block has a NaN code */
    float *out;
} f8_tok;

/* Weight chunk (32 bytes: 4 k x 8 rows) -> w * 2^-1016 as doubles: f8_q(i, h) = rows 4h..4h+3
 * of k 4j+i. Each byte c becomes the top 16 bits of a qword, (c & 0x80) << 8 | (c & 0x7F) << 1:
 * sign at bit 63, magnitude bits at 55..49. One byte interleave makes those 16-bit words (wl:
 * rows 0-3, wh: rows 4-7 of each k), and one pshufb per output moves two words of each 128-bit
 * lane to the top of the lane's two qwords, zeroing the rest. */
#define F8_DECODE_BEGIN(ptr)                                                                       \
    __m256i f8x_ = _mm256_load_si256((const __m256i *)(ptr));                                      \
    __m256i f8c2_ = _mm256_add_epi8(f8x_, f8x_);                                                   \
    __m256i f8cs_ = _mm256_and_si256(f8x_, _mm256_set1_epi8((char)0x80));                          \
    __m256i f8wl_ = _mm256_unpacklo_epi8(f8c2_, f8cs_);                                            \
    __m256i f8wh_ = _mm256_unpackhi_epi8(f8c2_, f8cs_);

/* word 2i of the lane -> bytes 6-7 of qword 0, word 2i+1 -> bytes 6-7 of qword 1 */
static inline __m256i f8_place_mask(int i)
{
    const char z = (char)0x80;
    char a = (char)(4 * i), b = (char)(4 * i + 1), c = (char)(4 * i + 2), d = (char)(4 * i + 3);
    return _mm256_setr_epi8(z, z, z, z, z, z, a, b, z, z, z, z, z, z, c, d, z, z, z, z, z, z, a, b,
                            z, z, z, z, z, z, c, d);
}

#define f8_q(i, h) _mm256_castsi256_pd(_mm256_shuffle_epi8((h) ? f8wh_ : f8wl_, f8_place_mask(i)))

/* out[t] += P * (sa * ws) for one 128-block; A[2t], A[2t+1] hold rows 0-3 / 4-7 scaled by
 * `scale` (a power of two that makes them the exact block sum). */
static inline __attribute__((always_inline)) void f8_epilogue(const int T, __m256d *A,
                                                              __m256d scale, const f8_tok *tk,
                                                              int kbl, float wsc, unsigned nanb)
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        __m128 p0 = _mm256_cvtpd_ps(_mm256_mul_pd(A[2 * t], scale));
        __m128 p1 = _mm256_cvtpd_ps(_mm256_mul_pd(A[2 * t + 1], scale));
        __m256 p = _mm256_set_m128(p1, p0);
        if (__builtin_expect(nanb != 0, 0))
            p = nan_lanes(p, nanb);
        float sig = tk[t].sa[kbl] * wsc;
        p = _mm256_mul_ps(p, _mm256_set1_ps(sig));
        _mm256_storeu_ps(tk[t].out, _mm256_add_ps(_mm256_loadu_ps(tk[t].out), p));
    }
}

/* Decode-on-the-fly kernel for few tokens: blocks [0, nkb) of one octet. With one or two
 * tokens the two accumulators per token would be FMA-latency bound, so the k of a chunk are
 * spread over KS = 4 / T independent accumulator pairs and added at the block end; every
 * partial sum is exact, so any grouping gives the same sums. */
static inline __attribute__((always_inline)) void f8_direct(const int T, const uint8_t *wd, int nkb,
                                                            const f8_tok *tk, const float *wsc,
                                                            const uint8_t *nanr)
{
    const int KS = T == 1 ? 4 : T == 2 ? 2 : 1;
    for (int kb = 0; kb < nkb; kb++) {
        __m256d A[8], B[8]; /* A[2*(t*KS+s)+h]: token t, k-split s, half h */
#pragma GCC unroll 16
        for (int i = 0; i < 2 * T * KS; i++)
            A[i] = _mm256_setzero_pd();
        const uint8_t *p = wd + (size_t)kb * 1024;
        for (int j = 0; j < 32; j++) {
            if ((j & 1) == 0)
                _mm_prefetch((const char *)(p + 32 * j + GEMM_PREFETCH), _MM_HINT_T0);
            F8_DECODE_BEGIN(p + 32 * j)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m256d q0 = f8_q(i, 0), q1 = f8_q(i, 1);
                int k = 128 * kb + 4 * j + i, sp = i % KS;
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    __m256d b = _mm256_broadcast_sd(tk[t].a + k);
                    int x = 2 * (t * KS + sp);
                    A[x] = _mm256_fmadd_pd(q0, b, A[x]);
                    A[x + 1] = _mm256_fmadd_pd(q1, b, A[x + 1]);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m256d h0 = A[2 * t * KS], h1 = A[2 * t * KS + 1];
#pragma GCC unroll 4
            for (int sp = 1; sp < KS; sp++) {
                h0 = _mm256_add_pd(h0, A[2 * (t * KS + sp)]);
                h1 = _mm256_add_pd(h1, A[2 * (t * KS + sp) + 1]);
            }
            B[2 * t] = h0;
            B[2 * t + 1] = h1;
        }
        f8_epilogue(T, B, _mm256_set1_pd(0x1p16), tk, kb, wsc[kb], nanr ? nanr[kb] : 0);
    }
}

/* ---- FP8 x FP8, many tokens: exact int32 sums with vpmaddwd ----
 *
 * Doubles give half the multiply rate of fp32, so with enough tokens to amortise a decoded
 * panel the common case is done in integers instead. Split activations and weights by size:
 *   A  = a * 4    when |a| >= 2     (every such e4m3 value is a multiple of 2^-2; |A| <= 1792)
 *   AL = a * 512  when |a| <  2     (|AL| <= 960)
 *   W  = w * 64   when |w| >= 2^-3  (a multiple of 2^-6; |W| <= 28672)
 *   WL = w * 512  when |w| <  2^-3  (|WL| <= 60)
 * so that, exactly, sum(a * w) = T1 * 2^-8 + T2 * 2^-11 + T3 * 2^-15 + T4 * 2^-18 with
 *   T1 = sum(A * W)   dense, vpmaddwd on int16 pairs into int32;
 *   T2 = sum(A * WL)  over the few |w| < 2^-3 (a list per weight block, made at pack time);
 *   T3 = sum(AL * W)  over the few |a| < 2 (a list per token block, made per call);
 *   T4 = sum(AL * WL) over the same weight list.
 * T1 cannot overflow int32 when 1792 * sum_k |W_k| < 2^31 for every row of the block
 * (int_safe, decided at pack time; typical blocks satisfy it about twice over); otherwise the
 * block is summed in four int32 parts of 32 k (each |part| <= 32 * 1792 * 30720 < 2^31) added
 * in double. T3 is accumulated in int32 over at most 64 list entries at a time (64 * 960 *
 * 30720 < 2^31), T2 + T4 in int64. All parts meet in double, where every partial sum is a
 * multiple of 2^-18 below 2^25 — exact — and P = fp32(sum) rounds once. A block whose lists
 * are empty and whose T1 fits int32 skips the doubles: P = fp32(T1) * 2^-8. */

typedef struct f8i_tok {
    const uint32_t *ap; /* (A_2j, A_2j+1) int16 pairs */
    const int16_t *al;  /* AL per k */
    const uint8_t *ent; /* per 128-block: the k with AL != 0, cnt[b] of them at ent + 128 b */
    const uint8_t *cnt;
    const float *sa; /* per 128-block: a_scale, or NaN when the block has a NaN code */
    float *out;
} f8i_tok;

/* 16 sign-extended e4m3 codes (as int16) -> W = (8+m) * 2^(e-4) (0 for e < 4), signed. The
 * power of two comes from two nibble tables (its low and high byte). */
static inline __m256i f8i_w16(__m256i v)
{
    const __m256i plo = _mm256_setr_epi8(0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0,
                                         0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0);
    const __m256i phi = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8);
    __m256i e = _mm256_and_si256(_mm256_srli_epi16(v, 3), _mm256_set1_epi16(15));
    __m256i pw = _mm256_or_si256(_mm256_shuffle_epi8(plo, e),
                                 _mm256_slli_epi16(_mm256_shuffle_epi8(phi, e), 8));
    __m256i mant = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(7)), _mm256_set1_epi16(8));
    return _mm256_sign_epi16(_mm256_mullo_epi16(mant, pw), v);
}

/* One (octet, 128-block) of packed FP8 weights -> Wp[j] = W of rows 0-7 at k-pair (2j, 2j+1),
 * as vpmaddwd wants them. A chunk's bytes 0-15 hold rows 0,1 (low 8) and 4,5; bytes 16-31
 * rows 2,3 and 6,7, each row's 4 k at stride 2 (see the FP8 layout). */
static void f8i_panel(const uint8_t *p, __m256i *Wp)
{
    const __m256i gather = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15, 0,
                                            1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
    for (int j = 0; j < 32; j++) {
        __m256i v0 = f8i_w16(_mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(p + 32 * j))));
        __m256i v1 =
            f8i_w16(_mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(p + 32 * j + 16))));
        v0 = _mm256_shuffle_epi8(v0, gather);
        v1 = _mm256_shuffle_epi8(v1, gather);
        _mm256_store_si256(Wp + 2 * j, _mm256_unpacklo_epi64(v0, v1));
        _mm256_store_si256(Wp + 2 * j + 1, _mm256_unpackhi_epi64(v0, v1));
    }
}

#define F8I_MAC(t)                                                                                 \
    if (T > t)                                                                                     \
        S##t = _mm256_add_epi32(S##t, _mm256_madd_epi16(w_, _mm256_set1_epi32((int)ap##t[j])));
#define F8I_PTR(t) const uint32_t *ap##t = tk[T > t ? t : 0].ap + 64 * kb;
#define F8I_STORE(t)                                                                               \
    if (T > t)                                                                                     \
        t1[t] = S##t;

/* t1[t] = T1 of k-pairs [j0, j1) of block kb for T tokens */
static inline __attribute__((always_inline)) void
f8i_kernel(const int T, const __m256i *Wp, int j0, int j1, int kb, const f8i_tok *tk, __m256i *t1)
{
    MX_FOR_T(F8I_PTR)
    __m256i S0 = _mm256_setzero_si256(), S1 = S0, S2 = S0, S3 = S0, S4 = S0, S5 = S0;
    for (int j = j0; j < j1; j++) {
        __m256i w_ = _mm256_load_si256(Wp + j);
        MX_FOR_T(F8I_MAC)
    }
    MX_FOR_T(F8I_STORE)
}

#define F8I_KERNEL_T(n)                                                                            \
    static __attribute__((noinline)) void f8i_kernel_##n(const __m256i *Wp, int j0, int j1,        \
                                                         int kb, const f8i_tok *tk, __m256i *t1)   \
    {                                                                                              \
        f8i_kernel(n, Wp, j0, j1, kb, tk, t1);                                                     \
    }
F8I_KERNEL_T(1)
F8I_KERNEL_T(2)
F8I_KERNEL_T(3)
F8I_KERNEL_T(4)
F8I_KERNEL_T(5)
F8I_KERNEL_T(6)

typedef void (*f8i_fn)(const __m256i *Wp, int j0, int j1, int kb, const f8i_tok *tk, __m256i *t1);
static const f8i_fn f8i_kernels[7] = {NULL,         f8i_kernel_1, f8i_kernel_2, f8i_kernel_3,
                                      f8i_kernel_4, f8i_kernel_5, f8i_kernel_6};

/* The |w| < 2^-3 weights of one panel as vpmaddwd vectors: lov[i] holds WL at (row r, k & 1)
 * of k-pair loj[i], zero elsewhere; only the k-pairs that have such a weight get a vector. */
typedef struct f8i_lo {
    __m256i lov[64];
    int loj[64];
    int n;
} f8i_lo;

static void f8i_lo_build(const uint32_t *lo, int nlo, f8i_lo *L)
{
    L->n = 0;
    for (int i = 0; i < nlo; i++) {
        uint32_t e = lo[i];
        int k = (int)(e & 127), r = (int)((e >> 8) & 7), j = k / 2, x = 0;
        while (x < L->n && L->loj[x] != j)
            x++;
        if (x == L->n) {
            L->lov[x] = _mm256_setzero_si256();
            L->loj[x] = j;
            L->n++;
        }
        int16_t *lanes = (int16_t *)&L->lov[x];
        lanes[2 * r + (k & 1)] = (int16_t)(e >> 16);
    }
}

static inline __m256d lo4_pd(__m256i x)
{
    return _mm256_cvtepi32_pd(_mm256_castsi256_si128(x));
}

static inline __m256d hi4_pd(__m256i x)
{
    return _mm256_cvtepi32_pd(_mm256_extracti128_si256(x, 1));
}

/* The exact block sum of one token (T1 given as int32, or in double when the block was summed
 * in parts) plus T2..T4, rounded once; then out += P * (sa * ws). F collects T2 * 16 + T3
 * (units 2^-15), G collects T4 (units 2^-18). */
static inline __attribute__((always_inline)) void f8i_finish(const f8i_tok *tk, int kb,
                                                             const __m256i *Wp, const f8i_lo *L,
                                                             const __m256i *t1, const double *t1d,
                                                             float wsc, unsigned nanb)
{
    const uint32_t *ap = tk->ap + 64 * kb;
    const int16_t *al = tk->al + 128 * kb;
    __m256i F = _mm256_setzero_si256(), G = F;
    for (int i = 0; i < L->n; i++) {
        uint32_t alp;
        memcpy(&alp, al + 2 * L->loj[i], sizeof alp);
        F = _mm256_add_epi32(F,
                             _mm256_madd_epi16(L->lov[i], _mm256_set1_epi32((int)ap[L->loj[i]])));
        G = _mm256_add_epi32(G, _mm256_madd_epi16(L->lov[i], _mm256_set1_epi32((int)alp)));
    }
    F = _mm256_slli_epi32(F, 4);
    int na = tk->cnt[kb];
    const uint8_t *ent = tk->ent + 128 * kb;
    __m256d d0 = _mm256_setzero_pd(), d1 = d0;
    for (int i0 = 0; i0 < na; i0 += 64) { /* T3; F stays below 2^31 for 64 entries */
        for (int i = i0; i < na && i < i0 + 64; i++) {
            int k = ent[i];
            uint32_t v = (uint16_t)al[k], pair = (k & 1) ? v << 16 : v;
            F = _mm256_add_epi32(
                F, _mm256_madd_epi16(_mm256_load_si256(Wp + k / 2), _mm256_set1_epi32((int)pair)));
        }
        if (i0 + 64 < na) { /* more than 64: move F to double and go on */
            d0 = _mm256_fmadd_pd(lo4_pd(F), _mm256_set1_pd(0x1p-15), d0);
            d1 = _mm256_fmadd_pd(hi4_pd(F), _mm256_set1_pd(0x1p-15), d1);
            F = _mm256_setzero_si256();
        }
    }
    __m256 p;
    int fz = _mm256_testz_si256(F, F), gz = _mm256_testz_si256(G, G);
    if (t1 && fz && gz && na <= 64) {
        p = _mm256_mul_ps(_mm256_cvtepi32_ps(*t1), _mm256_set1_ps(0x1p-8f));
    } else {
        if (t1) {
            d0 = _mm256_fmadd_pd(lo4_pd(*t1), _mm256_set1_pd(0x1p-8), d0);
            d1 = _mm256_fmadd_pd(hi4_pd(*t1), _mm256_set1_pd(0x1p-8), d1);
        } else {
            d0 = _mm256_add_pd(d0, _mm256_loadu_pd(t1d));
            d1 = _mm256_add_pd(d1, _mm256_loadu_pd(t1d + 4));
        }
        d0 = _mm256_fmadd_pd(lo4_pd(F), _mm256_set1_pd(0x1p-15), d0);
        d1 = _mm256_fmadd_pd(hi4_pd(F), _mm256_set1_pd(0x1p-15), d1);
        if (!gz) {
            d0 = _mm256_fmadd_pd(lo4_pd(G), _mm256_set1_pd(0x1p-18), d0);
            d1 = _mm256_fmadd_pd(hi4_pd(G), _mm256_set1_pd(0x1p-18), d1);
        }
        p = _mm256_set_m128(_mm256_cvtpd_ps(d1), _mm256_cvtpd_ps(d0));
    }
    if (__builtin_expect(nanb != 0, 0))
        p = nan_lanes(p, nanb);
    p = _mm256_mul_ps(p, _mm256_set1_ps(tk->sa[kb] * wsc));
    _mm256_storeu_ps(tk->out, _mm256_add_ps(_mm256_loadu_ps(tk->out), p));
}

static void f8_direct_any(int T, const uint8_t *wd, int nkb, const f8_tok *tk, const float *wsc,
                          const uint8_t *nanr)
{
    if (T == 1)
        f8_direct(1, wd, nkb, tk, wsc, nanr);
    else
        f8_direct(2, wd, nkb, tk, wsc, nanr);
}

/* ---- tiles: preprocessed activations for mt tokens x kn columns ---- */

/* Tokens of one micro-tile at most, and the token count up to which FP8 decodes weights on
 * the fly instead of through a panel. */
#define MX_TILE_T     6
#define F8_TILE_T     6
#define F8_DIRECT_MAX 5
#define F8_DIRECT_T   2

static size_t mx_token_bytes(int kn)
{
    size_t nb = (size_t)kn / 32;
    return 2 * round64((size_t)kn * 2) + 3 * round64(nb * 4) + round64(nb);
}

typedef struct mx_tile {
    uint32_t *hi, *lo;
    int32_t *chi, *clo;
    float *sa;
    uint8_t *need;
} mx_tile;

static mx_tile mx_tile_at(uint8_t *base, int kn, int t)
{
    size_t nb = (size_t)kn / 32;
    uint8_t *p = base + (size_t)t * mx_token_bytes(kn);
    mx_tile r;
    r.hi = (uint32_t *)p;
    p += round64((size_t)kn * 2);
    r.lo = (uint32_t *)p;
    p += round64((size_t)kn * 2);
    r.chi = (int32_t *)p;
    p += round64(nb * 4);
    r.clo = (int32_t *)p;
    p += round64(nb * 4);
    r.sa = (float *)p;
    p += round64(nb * 4);
    r.need = p;
    return r;
}

static void mx_prep(const gemm_call *c, int m, int k0, int kn, mx_tile d)
{
    int K = c->w->K, KB = K / 128;
    const uint8_t *a = c->a + (size_t)m * K + k0;
    const e4m3_split L = split_luts(4); /* hi: |a| >= 2^-3 in units of 2^-6 */
    for (int b = 0; b < kn / 32; b++) {
        __m256i v0, v1, h0, h1, l0, l1, n0, n1;
        codes32(a + 32 * b, &v0, &v1);
        split16(v0, &L, &h0, &l0, &n0);
        split16(v1, &L, &h1, &l1, &n1);
        _mm256_store_si256((__m256i *)(d.hi + 16 * b), h0);
        _mm256_store_si256((__m256i *)(d.hi + 16 * b + 8), h1);
        _mm256_store_si256((__m256i *)(d.lo + 16 * b), l0);
        _mm256_store_si256((__m256i *)(d.lo + 16 * b + 8), l1);
        /* hi is widened before it is summed (32 * 28672 > 2^15); lo pairs fit int16 */
        int32_t shi = hsum16x2(h0, _mm256_setzero_si256()) + hsum16x2(h1, _mm256_setzero_si256());
        int32_t slo = hsum16x2(l0, l1);
        d.chi[b] = -12 * shi;
        d.clo[b] = -12 * slo;
        d.need[b] = !_mm256_testz_si256(_mm256_or_si256(l0, l1), _mm256_or_si256(l0, l1));
        int nan = !_mm256_testz_si256(_mm256_or_si256(n0, n1), _mm256_or_si256(n0, n1));
        d.sa[b] = nan ? NAN : c->a_scale[(size_t)m * KB + (k0 / 32 + b) / 4];
    }
}

/* The small-M kernel's digits of token m (layout in the mxs comment), in the tile's hi/lo
 * areas: d0 and d1 share the hi area, lo uses the lo area. */
static void mxs_prep(const gemm_call *c, int m, int k0, int kn, mx_tile d)
{
    int K = c->w->K, KB = K / 128;
    const uint8_t *a = c->a + (size_t)m * K + k0;
    int8_t *d0 = (int8_t *)d.hi, *d1 = d0 + kn, *lo = (int8_t *)d.lo;
    const e4m3_split L = split_luts(5); /* hi: |a| >= 2^-2 in units of 2^-5 */
    const __m256i perm = _mm256_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15, 0,
                                          2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    const __m256i m127 = _mm256_set1_epi16(127);
    for (int b = 0; b < kn / 32; b++) {
        __m256i v0, v1, h0, h1, l0, l1, n0, n1;
        codes32(a + 32 * b, &v0, &v1);
        split16(v0, &L, &h0, &l0, &n0);
        split16(v1, &L, &h1, &l1, &n1);
        /* words -> bytes in k order (packs interleaves the 128-bit lanes), then the 0 2 1 3
         * order within each 4 */
#define MXS_PACK(x0, x1)                                                                           \
    _mm256_shuffle_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(x0, x1), 0xD8), perm)
        _mm256_storeu_si256((__m256i *)(d0 + 32 * b),
                            MXS_PACK(_mm256_and_si256(h0, m127), _mm256_and_si256(h1, m127)));
        _mm256_storeu_si256((__m256i *)(d1 + 32 * b),
                            MXS_PACK(_mm256_srai_epi16(h0, 7), _mm256_srai_epi16(h1, 7)));
        _mm256_storeu_si256((__m256i *)(lo + 32 * b), MXS_PACK(l0, l1));
#undef MXS_PACK
        int32_t shi = hsum16x2(h0, _mm256_setzero_si256()) + hsum16x2(h1, _mm256_setzero_si256());
        int32_t slo = hsum16x2(l0, l1);
        d.chi[b] = -12 * shi;
        d.clo[b] = -12 * slo;
        d.need[b] = !_mm256_testz_si256(_mm256_or_si256(l0, l1), _mm256_or_si256(l0, l1));
        int nan = !_mm256_testz_si256(_mm256_or_si256(n0, n1), _mm256_or_si256(n0, n1));
        d.sa[b] = nan ? NAN : c->a_scale[(size_t)m * KB + (k0 / 32 + b) / 4];
    }
}

/* One token: the vpmaddubsw kernel; two or more: vpmaddwd (with two tokens it needs fewer
 * registers than the vpmaddubsw kernel would). */
static void mx_tile_prep(const gemm_call *c, int m0, int mt, int k0, int kn, uint8_t *base)
{
    for (int t = 0; t < mt; t++) {
        if (mt == 1)
            mxs_prep(c, m0 + t, k0, kn, mx_tile_at(base, kn, t));
        else
            mx_prep(c, m0 + t, k0, kn, mx_tile_at(base, kn, t));
    }
}

static void mx_tile_run(const gemm_call *c, int ro0, int ro1, int m0, int mt, int k0, int kn,
                        uint8_t *base)
{
    const gemm_weight *w = c->w;
    int N = w->N, KG = w->K / 32, spec = w->scale_special != 0;
    int small = mt == 1;
    int ng = (mt + MX_TILE_T - 1) / MX_TILE_T;
    for (int o = ro0; o < ro1; o++) {
        const uint8_t *wd = w->data + ((size_t)o * KG + k0 / 32) * 128;
        const uint8_t *ws = w->bscale + ((size_t)o * KG + k0 / 32) * 8;
        if (small) {
            mxs_tok tk[2] = {{0}};
            for (int t = 0; t < mt; t++) {
                mx_tile d = mx_tile_at(base, kn, t);
                tk[t] = (mxs_tok){(const int8_t *)d.hi,
                                  (const int8_t *)d.hi + kn,
                                  (const int8_t *)d.lo,
                                  d.chi,
                                  d.clo,
                                  d.sa,
                                  d.need,
                                  c->out + (size_t)(m0 + t) * N + 8 * o};
            }
            mxs_kernels[spec](wd, ws, kn / 32, tk);
            continue;
        }
        for (int g = 0, t0 = 0; g < ng; g++) {
            int T = mt / ng + (g < mt % ng);
            mx_tok tk[MX_TILE_T] = {{0}};
            for (int t = 0; t < T; t++) {
                mx_tile d = mx_tile_at(base, kn, t0 + t);
                tk[t] = (mx_tok){d.hi,
                                 d.lo,
                                 d.chi,
                                 d.clo,
                                 d.sa,
                                 d.need,
                                 c->out + (size_t)(m0 + t0 + t) * N + 8 * o};
            }
            mx_kernels[spec][T](wd, ws, kn / 32, tk);
            t0 += T;
        }
    }
}

static void f8_tile_prep(const gemm_call *c, int m0, int mt, int k0, int kn, uint8_t *base,
                         int ipath)
{
    size_t tb = f8_token_bytes(kn, ipath);
    for (int t = 0; t < mt; t++) {
        if (ipath) {
            f8i_prep(c, m0 + t, k0, kn, f8i_tile_at(base, kn, t));
            continue;
        }
        double *ad = (double *)(base + (size_t)t * tb);
        f8_prep(c, m0 + t, k0, kn, ad, (float *)(base + (size_t)t * tb + round64((size_t)kn * 8)));
    }
}

/* Many tokens: for each 128-block, for each octet, build the int16 panel once and run it
 * against every token of the tile. */
static void f8i_tile_run(const gemm_call *c, int ro0, int ro1, int m0, int mt, int k0, int kn,
                         uint8_t *base)
{
    const gemm_weight *w = c->w;
    int N = w->N, K = w->K, KB = K / 128, nkb = kn / 128;
    int ng = (mt + F8_TILE_T - 1) / F8_TILE_T;
    _Alignas(32) __m256i Wp[64];
    _Alignas(32) f8i_lo L;
    _Alignas(32) __m256i t1[F8_TILE_T];
    _Alignas(32) double t1d[F8_TILE_T][8];
    for (int kb = 0; kb < nkb; kb++) {
        for (int o = ro0; o < ro1; o++) {
            size_t bi = (size_t)o * KB + k0 / 128 + kb;
            f8i_panel(w->data + (size_t)o * K * 8 + (size_t)(k0 + 128 * kb) * 8, Wp);
            int safe = w->int_safe[bi];
            f8i_lo_build(w->lo_ent + w->lo_off[bi], (int)(w->lo_off[bi + 1] - w->lo_off[bi]), &L);
            float wsc = w->fscale[(size_t)(o / 16) * KB + k0 / 128 + kb];
            unsigned nanb = w->nanrows ? w->nanrows[bi] : 0;
            for (int g = 0, t0 = 0; g < ng; g++) {
                int T = mt / ng + (g < mt % ng);
                f8i_tok tk[F8_TILE_T];
                for (int t = 0; t < T; t++) {
                    f8i_tile d = f8i_tile_at(base, kn, t0 + t);
                    tk[t] = (f8i_tok){d.ap,  d.al, d.ent,
                                      d.cnt, d.sa, c->out + (size_t)(m0 + t0 + t) * N + 8 * o};
                }
                if (safe) {
                    f8i_kernels[T](Wp, 0, 64, kb, tk, t1);
                    for (int t = 0; t < T; t++)
                        f8i_finish(&tk[t], kb, Wp, &L, &t1[t], NULL, wsc, nanb);
                } else {
                    memset(t1d, 0, sizeof t1d);
                    for (int part = 0; part < 4; part++) {
                        f8i_kernels[T](Wp, 16 * part, 16 * part + 16, kb, tk, t1);
                        for (int t = 0; t < T; t++) {
                            __m256i x = t1[t];
                            __m256d lo4 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(x));
                            __m256d hi4 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(x, 1));
                            _mm256_storeu_pd(t1d[t], _mm256_fmadd_pd(lo4, _mm256_set1_pd(0x1p-8),
                                                                     _mm256_loadu_pd(t1d[t])));
                            _mm256_storeu_pd(t1d[t] + 4,
                                             _mm256_fmadd_pd(hi4, _mm256_set1_pd(0x1p-8),
                                                             _mm256_loadu_pd(t1d[t] + 4)));
                        }
                    }
                    for (int t = 0; t < T; t++)
                        f8i_finish(&tk[t], kb, Wp, &L, NULL, t1d[t], wsc, nanb);
                }
                t0 += T;
            }
        }
    }
}

static void f8_tile_run(const gemm_call *c, int ro0, int ro1, int m0, int mt, int k0, int kn,
                        uint8_t *base, int ipath)
{
    if (ipath) {
        f8i_tile_run(c, ro0, ro1, m0, mt, k0, kn, base);
        return;
    }
    const gemm_weight *w = c->w;
    int N = w->N, K = w->K, KB = K / 128, nkb = kn / 128;
    size_t tb = f8_token_bytes(kn, 0);
    f8_tok all[F8_DIRECT_T] = {{0}};
    int ng = (mt + F8_DIRECT_T - 1) / F8_DIRECT_T;
    for (int o = ro0; o < ro1; o++) {
        const uint8_t *wd = w->data + (size_t)o * K * 8 + (size_t)k0 * 8;
        const float *wsc = w->fscale + (size_t)(o / 16) * KB + k0 / 128;
        const uint8_t *nanr = w->nanrows ? w->nanrows + (size_t)o * KB + k0 / 128 : NULL;
        for (int g = 0, t0 = 0; g < ng; g++) {
            int T = mt / ng + (g < mt % ng);
            for (int t = 0; t < T; t++) {
                uint8_t *p = base + (size_t)(t0 + t) * tb;
                all[t] = (f8_tok){(const double *)p, (const float *)(p + round64((size_t)kn * 8)),
                                  c->out + (size_t)(m0 + t0 + t) * N + 8 * o};
            }
            f8_direct_any(T, wd, nkb, all, wsc, nanr);
            t0 += T;
        }
    }
}

/* ---- what the driver calls (gemm_drive) ---- */

static int avx2_ipath(const gemm_weight *w, int M)
{
    /* FP8 with more tokens than the decode path handles well: the integer path */
    return w->kind == GEMM_KIND_FP8 && M > F8_DIRECT_MAX;
}

static size_t avx2_token_bytes(const gemm_weight *w, int kn, int ipath)
{
    return w->kind == GEMM_KIND_FP8 ? f8_token_bytes(kn, ipath) : mx_token_bytes(kn);
}

static void avx2_tile_prep(const gemm_call *c, int m0, int mt, int k0, int kn, void *base,
                           int ipath)
{
    pthread_once(&tables_once, tables_init);
    if (c->w->kind == GEMM_KIND_FP8)
        f8_tile_prep(c, m0, mt, k0, kn, base, ipath);
    else
        mx_tile_prep(c, m0, mt, k0, kn, base);
}

static void avx2_tile_run(const gemm_call *c, int ro0, int ro1, int m0, int mt, int k0, int kn,
                          void *base, int ipath)
{
    if (c->w->kind == GEMM_KIND_FP8)
        f8_tile_run(c, ro0, ro1, m0, mt, k0, kn, base, ipath);
    else
        mx_tile_run(c, ro0, ro1, m0, mt, k0, kn, base);
}

const gemm_kops gemm_avx2_kops = {
    .unit = 8,
    .ipath = avx2_ipath,
    .token_bytes = avx2_token_bytes,
    .tile_prep = avx2_tile_prep,
    .tile_run = avx2_tile_run,
};
