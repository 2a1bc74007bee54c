/*
 * gemm_avx512.c — the AVX-512 (F, BW, VL, DQ) + VNNI expert GEMMs (compiled with those flags;
 * gemm_drive.c calls in only when cpuid reports all of them). Results equal gemm_ref.c bit for bit;
 * tests/unit/test_gemm.c proves it against an independent float64 model.
 *
 * As in gemm_avx2.c, every kernel vectorises across output rows, so a block partial P lands in
 * the lanes of its rows and the epilogue is lane-wise fp32 arithmetic in the order of gemm.h.
 * A zmm register holds 16 rows (int32 / fp32 lanes) or 8 rows (doubles).
 *
 *   MXFP4, any M            vpdpbusd on three 7-bit digits of every activation  (mx5_*)
 *   FP8, up to F8D_MAX      exact double FMAs, weights decoded on the fly       (f8d_*)
 *   FP8, more tokens        int32 sums with vpdpwssd + exact corrections        (f8i5_*)
 *
 * ---- FP8 x MXFP4: three digits, the same work for any activation ----
 * An e4m3 activation times 2^9 is an integer a9, |a9| <= 448 * 512 = 229376 < 2^18 (units
 * 2^-9; subnormals m * 2^-9 included). It is split into base-128 digits
 *   a9 = d0 + 128 * d1 + 16384 * d2,  d0 = a9 & 127, d1 = (a9 >> 7) & 127, d2 = a9 >> 14
 * (arithmetic shifts, so d2 in [-14, 14]): three signed bytes, whatever the value. A weight
 * nibble decodes (vpshufb) to the unsigned byte w' = 2w + 12 in [0, 24], and vpdpbusd adds four
 * w' * d products of one row into its int32 lane. With A_i = sum(w' * d_i) over a 32-block
 * (|A_i| <= 32 * 24 * 127) and the token's correction C = -12 * sum(a9),
 *   S = C + A0 + 128 * (A1 + 128 * A2) = sum(a9 * 2w),  |S| <= 32 * 12 * 229376 < 2^27,
 * exact in int32 at every step, in units of 2^-10. P = fp32(S) * 2^-10 rounds once (the unit is
 * a power of two and |P| is 0 or >= 2^-10). Then acc = acc + (P * a_scale) * 2^(S-127) in
 * fp32, in that order. There is no data-dependent second pass: AVX2 splits activations by size
 * and runs a "lo" pass for (tiles of) blocks that hold small values, which SwiGLU outputs do
 * often; here every block costs the same.
 *
 * ---- FP8 x FP8, few tokens: doubles ----
 * As in gemm_avx2.c: a weight byte becomes the double with bits sign << 63 | magnitude << 49
 * (value w * 2^-1016), activations are a * 2^1000, every product and partial sum is exact, and
 * P = fp32(sum * 2^16) rounds once. One vpshufb places 8 rows of one k into a zmm.
 *
 * ---- FP8 x FP8, many tokens: integers ----
 * The split of gemm_avx2.c ("FP8 x FP8, many tokens"): A = a * 4 (|a| >= 2), AL = a * 512,
 * W = w * 64 (|w| >= 2^-3), WL = w * 512, T1 = sum(A * W) dense with vpdpwssd over a panel of
 * 16 rows x 2 k per zmm built once per (16 rows, 128-block) and token tile, T2/T4 from the
 * pack-time lists of small weights, T3 = sum(AL * W) sparse over the token's small activations,
 * or — when a block holds many of them — dense in two halves of 64 k (each below 2^31: 64 *
 * 960 * 28672). Everything meets in double (exact) and rounds once.
 *
 * The packed layouts and the packers are in gemm_avx512_pack.c.
 *
 * ---- threads ----
 * The tiling and the split over rows (units of 16) are gemm_drive's (gemm_drive.c).
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

/* Tokens per MXFP4 micro-tile; FP8 token counts up to which the double path runs, tokens per
 * double micro-tile, and tokens per integer micro-tile. */
#define MX5_T   6
#define F8D_MAX 3
#define F8D_T   2
#define F8I5_T  8

/* ---- vector helpers ---- */

/* acc += vpdpbusd / vpdpwssd of w with the dword at p broadcast, as one instruction with an
 * embedded broadcast (the compiler emits a separate broadcast load and, with many tokens, runs
 * out of general registers for the pointers). */
#define DPBUSD_B(acc, w, p)                                                                        \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(p)))
#define DPWSSD_B(acc, w, p)                                                                        \
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(p)))

/* 16 e8m0 codes -> 2^(c-127) as fp32, with fmt_e8m0_to_f32's special cases (c = 0: 2^-127,
 * c = 255: NaN). */
static inline __m512 e8m0x16(const uint8_t *p)
{
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i bits = _mm512_slli_epi32(c, 23);
    __mmask16 sp = _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()) |
                   _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(255));
    bits = _mm512_mask_or_epi32(bits, sp, bits, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(bits);
}

/* e8m0x16 for codes known to lie in 1..254: the code is the fp32 exponent field. */
static inline __m512 e8m0x16_plain(const uint8_t *p)
{
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(c, 23));
}

static inline int32_t ld32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 16 e4m3 codes -> a9 = value * 2^9 as int32 (NaN codes give 0 and set their bit in *nan). */
static inline __m512i a9x16(const uint8_t *p, __mmask16 *nan)
{
    __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    __m512i e = _mm512_srli_epi32(mag, 3);
    __m512i m = _mm512_and_si512(mag, _mm512_set1_epi32(7));
    __mmask16 norm = _mm512_test_epi32_mask(e, e);
    __m512i mant = _mm512_mask_or_epi32(m, norm, m, _mm512_set1_epi32(8));
    __m512i sh =
        _mm512_max_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), _mm512_setzero_si512());
    __m512i v = _mm512_sllv_epi32(mant, sh);
    *nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
    v = _mm512_maskz_mov_epi32((__mmask16) ~*nan, v);
    __mmask16 neg = _mm512_movepi32_mask(c);
    return _mm512_mask_sub_epi32(v, neg, _mm512_setzero_si512(), v);
}

/* ---- FP8 x MXFP4 ---- */

/* One token's preprocessed activations for one K chunk (mx5_prep). */
typedef struct mx5_tile {
    int8_t *d0, *d1, *d2; /* digits per k */
    int32_t *corr;        /* per 32-block: -12 * sum(a9) */
    float *sa;            /* per 32-block: a_scale, or NaN when the block has a NaN code */
} mx5_tile;

static size_t mx5_token_bytes(int kn)
{
    size_t nb = (size_t)kn / 32;
    return 3 * round64((size_t)kn) + 2 * round64(nb * 4);
}

static mx5_tile mx5_tile_at(uint8_t *base, int kn, int t)
{
    size_t nb = (size_t)kn / 32;
    uint8_t *p = base + (size_t)t * mx5_token_bytes(kn);
    mx5_tile r;
    r.d0 = (int8_t *)p;
    r.d1 = (int8_t *)p + round64((size_t)kn);
    r.d2 = (int8_t *)p + 2 * round64((size_t)kn);
    p += 3 * round64((size_t)kn);
    r.corr = (int32_t *)p;
    r.sa = (float *)(p + round64(nb * 4));
    return r;
}

static void mx5_digits(__m512i v, int8_t *d0, int8_t *d1, int8_t *d2)
{
    const __m512i m127 = _mm512_set1_epi32(127);
    _mm_storeu_si128((__m128i *)d0, _mm512_cvtepi32_epi8(_mm512_and_si512(v, m127)));
    _mm_storeu_si128((__m128i *)d1,
                     _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srai_epi32(v, 7), m127)));
    _mm_storeu_si128((__m128i *)d2, _mm512_cvtepi32_epi8(_mm512_srai_epi32(v, 14)));
}

static void mx5_prep(const gemm_call *c, int m, int k0, int kn, mx5_tile d)
{
    int K = c->w->K, KB = K / 128;
    const uint8_t *a = c->a + (size_t)m * K + k0;
    for (int b = 0; b < kn / 32; b++) {
        __mmask16 n0, n1;
        __m512i v0 = a9x16(a + 32 * b, &n0), v1 = a9x16(a + 32 * b + 16, &n1);
        mx5_digits(v0, d.d0 + 32 * b, d.d1 + 32 * b, d.d2 + 32 * b);
        mx5_digits(v1, d.d0 + 32 * b + 16, d.d1 + 32 * b + 16, d.d2 + 32 * b + 16);
        d.corr[b] = -12 * _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
        d.sa[b] = (n0 | n1) ? NAN : c->a_scale[(size_t)m * KB + (k0 / 32 + b) / 4];
    }
}

typedef struct mx5_tok {
    const int8_t *d0, *d1, *d2;
    const int32_t *corr;
    const float *sa;
    float *out; /* this token's 16 outputs at the current group */
} mx5_tok;

#define MX5_FOR_T(X) X(0) X(1) X(2) X(3) X(4) X(5)

/* Blocks [0, nb) of one 16-row group for T tokens. The int32 accumulators of token t are
 * A<t>, B<t> (digit 0), C<t>, D<t> (digit 1), E<t>, F<t> (digit 2); with few tokens the low and
 * high nibble halves use separate chains (B, D, F) to hide the vpdpbusd latency, otherwise they
 * share one. The fp32 result of token t stays in O<t> across blocks. */
static inline __attribute__((always_inline)) void mx5_kernel(const int T, const int SPEC,
                                                             const uint8_t *wd, const uint8_t *ws,
                                                             int nb, const mx5_tok *tk)
{
    const int SPLIT = T <= 3;
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const __m512 unit = _mm512_set1_ps(0x1p-10f);
#define MX5_PTRS(t)                                                                                \
    const mx5_tok *k##t = &tk[T > t ? t : 0];                                                      \
    __m512 O##t = _mm512_setzero_ps();                                                             \
    if (T > t)                                                                                     \
        O##t = _mm512_loadu_ps(k##t->out);
    MX5_FOR_T(MX5_PTRS)
    for (int b = 0; b < nb; b++) {
        const uint8_t *wp = wd + 256 * b;
        /* weights stream from memory once: fetch ahead of the hardware prefetcher */
        for (int l = 0; l < 256; l += 64)
            _mm_prefetch((const char *)(wp + GEMM_PREFETCH + l), _MM_HINT_T0);
        if ((b & 3) == 0)
            _mm_prefetch((const char *)(ws + 16 * b + GEMM_PREFETCH / 16), _MM_HINT_T0);
        __m512i A0, A1, A2, A3, A4, A5, B0, B1, B2, B3, B4, B5;
        __m512i C0, C1, C2, C3, C4, C5, D0, D1, D2, D3, D4, D5;
        __m512i E0, E1, E2, E3, E4, E5, F0, F1, F2, F3, F4, F5;
#define MX5_INIT(t)                                                                                \
    if (T > t) {                                                                                   \
        A##t = _mm512_set1_epi32(k##t->corr[b]);                                                   \
        C##t = E##t = _mm512_setzero_si512();                                                      \
        if (SPLIT)                                                                                 \
            B##t = D##t = F##t = _mm512_setzero_si512();                                           \
    }
        MX5_FOR_T(MX5_INIT)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i x = _mm512_load_si512((const void *)(wp + 64 * j));
            __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(x, m0f));
            __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(x, 4), m0f));
            int o = 32 * b + 8 * j;
#define MX5_MAC(t)                                                                                 \
    if (T > t) {                                                                                   \
        A##t = _mm512_dpbusd_epi32(A##t, lo, _mm512_set1_epi32(ld32(k##t->d0 + o)));               \
        C##t = _mm512_dpbusd_epi32(C##t, lo, _mm512_set1_epi32(ld32(k##t->d1 + o)));               \
        E##t = _mm512_dpbusd_epi32(E##t, lo, _mm512_set1_epi32(ld32(k##t->d2 + o)));               \
        if (SPLIT) {                                                                               \
            B##t = _mm512_dpbusd_epi32(B##t, hi, _mm512_set1_epi32(ld32(k##t->d0 + o + 4)));       \
            D##t = _mm512_dpbusd_epi32(D##t, hi, _mm512_set1_epi32(ld32(k##t->d1 + o + 4)));       \
            F##t = _mm512_dpbusd_epi32(F##t, hi, _mm512_set1_epi32(ld32(k##t->d2 + o + 4)));       \
        } else {                                                                                   \
            A##t = _mm512_dpbusd_epi32(A##t, hi, _mm512_set1_epi32(ld32(k##t->d0 + o + 4)));       \
            C##t = _mm512_dpbusd_epi32(C##t, hi, _mm512_set1_epi32(ld32(k##t->d1 + o + 4)));       \
            E##t = _mm512_dpbusd_epi32(E##t, hi, _mm512_set1_epi32(ld32(k##t->d2 + o + 4)));       \
        }                                                                                          \
    }
            MX5_FOR_T(MX5_MAC)
        }
        __m512 wsc = SPEC ? e8m0x16(ws + 16 * b) : e8m0x16_plain(ws + 16 * b);
#define MX5_EPILOGUE(t)                                                                            \
    if (T > t) {                                                                                   \
        if (SPLIT) {                                                                               \
            A##t = _mm512_add_epi32(A##t, B##t);                                                   \
            C##t = _mm512_add_epi32(C##t, D##t);                                                   \
            E##t = _mm512_add_epi32(E##t, F##t);                                                   \
        }                                                                                          \
        __m512i s_ = _mm512_add_epi32(C##t, _mm512_slli_epi32(E##t, 7));                           \
        s_ = _mm512_add_epi32(A##t, _mm512_slli_epi32(s_, 7));                                     \
        __m512 p_ = _mm512_mul_ps(_mm512_cvtepi32_ps(s_), unit);                                   \
        p_ = _mm512_mul_ps(p_, _mm512_set1_ps(k##t->sa[b]));                                       \
        O##t = _mm512_add_ps(O##t, _mm512_mul_ps(p_, wsc));                                        \
    }
        MX5_FOR_T(MX5_EPILOGUE)
    }
#define MX5_STORE(t)                                                                               \
    if (T > t)                                                                                     \
        _mm512_storeu_ps(k##t->out, O##t);
    MX5_FOR_T(MX5_STORE)
}

typedef void (*mx5_fn)(const uint8_t *wd, const uint8_t *ws, int nb, const mx5_tok *tk);

#define MX5_KERNEL_T(n, spec)                                                                      \
    static __attribute__((noinline)) void mx5_kernel_##n##_##spec(                                 \
        const uint8_t *wd, const uint8_t *ws, int nb, const mx5_tok *tk)                           \
    {                                                                                              \
        mx5_kernel(n, spec, wd, ws, nb, tk);                                                       \
    }
MX5_KERNEL_T(1, 0)
MX5_KERNEL_T(2, 0)
MX5_KERNEL_T(3, 0)
MX5_KERNEL_T(4, 0)
MX5_KERNEL_T(5, 0)
MX5_KERNEL_T(6, 0)
MX5_KERNEL_T(1, 1)
MX5_KERNEL_T(2, 1)
MX5_KERNEL_T(3, 1)
MX5_KERNEL_T(4, 1)
MX5_KERNEL_T(5, 1)
MX5_KERNEL_T(6, 1)

/* [spec][T] */
static const mx5_fn mx5_kernels[2][MX5_T + 1] = {
    {NULL, mx5_kernel_1_0, mx5_kernel_2_0, mx5_kernel_3_0, mx5_kernel_4_0, mx5_kernel_5_0,
     mx5_kernel_6_0},
    {NULL, mx5_kernel_1_1, mx5_kernel_2_1, mx5_kernel_3_1, mx5_kernel_4_1, mx5_kernel_5_1,
     mx5_kernel_6_1}};

static void mx5_tile_prep(const gemm_call *c, int m0, int mt, int k0, int kn, uint8_t *base)
{
    for (int t = 0; t < mt; t++)
        mx5_prep(c, m0 + t, k0, kn, mx5_tile_at(base, kn, t));
}

static void mx5_tile_run(const gemm_call *c, int u0, int u1, int m0, int mt, int k0, int kn,
                         uint8_t *base)
{
    const gemm_weight *w = c->w;
    int N = w->N, KG = w->K / 32, spec = w->scale_special != 0;
    int ng = (mt + MX5_T - 1) / MX5_T;
    for (int u = u0; u < u1; u++) {
        const uint8_t *wd = w->data + ((size_t)u * KG + k0 / 32) * 256;
        const uint8_t *ws = w->bscale + ((size_t)u * KG + k0 / 32) * 16;
        for (int g = 0, t0 = 0; g < ng; g++) {
            int T = mt / ng + (g < mt % ng);
            mx5_tok tk[MX5_T];
            for (int t = 0; t < T; t++) {
                mx5_tile d = mx5_tile_at(base, kn, t0 + t);
                tk[t] = (mx5_tok){d.d0,   d.d1, d.d2,
                                  d.corr, d.sa, c->out + (size_t)(m0 + t0 + t) * N + 16 * u};
            }
            mx5_kernels[spec][T](wd, ws, kn / 32, tk);
            t0 += T;
        }
    }
}

/* ---- FP8 x FP8, few tokens: doubles ---- */

typedef struct f8d_tok {
    const double *a; /* activation * 2^1000 */
    const float *sa; /* per 128-block: a_scale, or NaN when the block has a NaN code */
    float *out;      /* this token's 8 outputs at the current octet */
} f8d_tok;

/* word 2i of each 128-bit lane -> bytes 6-7 of its qword 0, word 2i+1 -> bytes 6-7 of qword 1 */
static inline __m512i f8d_place(int i)
{
    const char z = (char)0x80;
    char a = (char)(4 * i), b = (char)(4 * i + 1), c = (char)(4 * i + 2), d = (char)(4 * i + 3);
    return _mm512_broadcast_i32x4(_mm_setr_epi8(z, z, z, z, z, z, a, b, z, z, z, z, z, z, c, d));
}

/* lanes whose bit is set in `bits` become NaN */
static inline __m256 nan_lanes8(__m256 p, unsigned bits)
{
    return _mm256_mask_mov_ps(p, (__mmask8)bits,
                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
}

/* Blocks [0, nkb) of one octet for T tokens. Each token's k are spread over KS accumulators
 * (FMA latency); every partial sum is exact, so any grouping gives the same block sum. */
static inline __attribute__((always_inline)) void f8d_kernel(const int T, const uint8_t *wd,
                                                             int nkb, const f8d_tok *tk,
                                                             const float *wsc, const uint8_t *nanr)
{
    const int KS = T == 1 ? 8 : T == 2 ? 4 : 2;
    __m256 O[F8D_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        O[t] = _mm256_loadu_ps(tk[t].out);
    for (int kb = 0; kb < nkb; kb++) {
        __m512d A[16];
#pragma GCC unroll 16
        for (int i = 0; i < T * KS; i++)
            A[i] = _mm512_setzero_pd();
        const uint8_t *p = wd + (size_t)kb * 1024;
        for (int j = 0; j < 16; j++) {
            _mm_prefetch((const char *)(p + 64 * j + GEMM_PREFETCH), _MM_HINT_T0);
            __m512i x = _mm512_load_si512((const void *)(p + 64 * j));
            __m512i c2 = _mm512_add_epi8(x, x);
            __m512i cs = _mm512_and_si512(x, _mm512_set1_epi8((char)0x80));
            __m512i wl = _mm512_unpacklo_epi8(c2, cs), wh = _mm512_unpackhi_epi8(c2, cs);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m512d q =
                    _mm512_castsi512_pd(_mm512_shuffle_epi8(i < 4 ? wl : wh, f8d_place(i & 3)));
                int k = 128 * kb + 8 * j + i;
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    int x_ = t * KS + i % KS;
                    A[x_] = _mm512_fmadd_pd(q, _mm512_set1_pd(tk[t].a[k]), A[x_]);
                }
            }
        }
        unsigned nanb = nanr ? nanr[kb] : 0;
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512d s = A[t * KS];
#pragma GCC unroll 8
            for (int i = 1; i < KS; i++)
                s = _mm512_add_pd(s, A[t * KS + i]);
            __m256 pv = _mm512_cvtpd_ps(_mm512_mul_pd(s, _mm512_set1_pd(0x1p16)));
            if (__builtin_expect(nanb != 0, 0))
                pv = nan_lanes8(pv, nanb);
            pv = _mm256_mul_ps(pv, _mm256_set1_ps(tk[t].sa[kb] * wsc[kb]));
            O[t] = _mm256_add_ps(O[t], pv);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        _mm256_storeu_ps(tk[t].out, O[t]);
}

static __attribute__((noinline)) void f8d_kernel_1(const uint8_t *wd, int nkb, const f8d_tok *tk,
                                                   const float *wsc, const uint8_t *nanr)
{
    f8d_kernel(1, wd, nkb, tk, wsc, nanr);
}

static __attribute__((noinline)) void f8d_kernel_2(const uint8_t *wd, int nkb, const f8d_tok *tk,
                                                   const float *wsc, const uint8_t *nanr)
{
    f8d_kernel(2, wd, nkb, tk, wsc, nanr);
}

static void f8d_tile_run(const gemm_call *c, int u0, int u1, int m0, int mt, int k0, int kn,
                         uint8_t *base)
{
    const gemm_weight *w = c->w;
    int N = w->N, K = w->K, KB = K / 128, nkb = kn / 128;
    size_t tb = f8_token_bytes(kn, 0);
    int ng = (mt + F8D_T - 1) / F8D_T;
    for (int o = 2 * u0; o < 2 * u1; o++) {
        const uint8_t *wd = w->data + (size_t)o * K * 8 + (size_t)k0 * 8;
        const float *wsc = w->fscale + (size_t)(o / 16) * KB + k0 / 128;
        const uint8_t *nanr = w->nanrows ? w->nanrows + (size_t)o * KB + k0 / 128 : NULL;
        for (int g = 0, t0 = 0; g < ng; g++) {
            int T = mt / ng + (g < mt % ng);
            f8d_tok tk[F8D_T];
            for (int t = 0; t < T; t++) {
                uint8_t *p = base + (size_t)(t0 + t) * tb;
                tk[t] = (f8d_tok){(const double *)p, (const float *)(p + round64((size_t)kn * 8)),
                                  c->out + (size_t)(m0 + t0 + t) * N + 8 * o};
            }
            if (T == 1)
                f8d_kernel_1(wd, nkb, tk, wsc, nanr);
            else
                f8d_kernel_2(wd, nkb, tk, wsc, nanr);
            t0 += T;
        }
    }
}

/* ---- FP8 x FP8, many tokens: integers ---- */

/* 32 sign-extended e4m3 codes (int16) -> W = (8+m) * 2^(e-4) (0 for e < 4), signed. */
static inline __m512i f8i5_w32(__m512i v)
{
    const __m512i plo = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0));
    const __m512i phi =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8));
    __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 3), _mm512_set1_epi16(15));
    __m512i pw = _mm512_or_si512(_mm512_shuffle_epi8(plo, e),
                                 _mm512_slli_epi16(_mm512_shuffle_epi8(phi, e), 8));
    __m512i mant = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi16(7)), _mm512_set1_epi16(8));
    __m512i r = _mm512_mullo_epi16(mant, pw);
    return _mm512_mask_sub_epi16(r, _mm512_movepi16_mask(v), _mm512_setzero_si512(), r);
}

/* The int16 panel of one 16-row unit (octets p0 and p1, each at the block's first chunk):
 * Wp[j] holds, in dword lane r, (W[r][2j], W[r][2j+1]). A chunk's words (after widening) sit
 * at 16L + 2i + p for row 2L+p, k i; one two-source word permute gathers two k-pairs of 8 rows,
 * and a 256-bit shuffle joins the two octets. */
static void f8i5_panel(const uint8_t *p0, const uint8_t *p1, __m512i *Wp)
{
    static const uint16_t idx[2][32] = {
#define IX(d, s, q) (uint16_t)(16 * (((d)&7) >> 1) + 4 * (q) + 2 * (s) + ((d)&1))
#define IX2(d, q0)  IX(d, 0, (q0) + ((d) >> 3)), IX(d, 1, (q0) + ((d) >> 3))
#define IX8(d0, q0) IX2(d0, q0), IX2(d0 + 1, q0), IX2(d0 + 2, q0), IX2(d0 + 3, q0)
        {IX8(0, 0), IX8(4, 0), IX8(8, 0), IX8(12, 0)},
        {IX8(0, 2), IX8(4, 2), IX8(8, 2), IX8(12, 2)},
#undef IX8
#undef IX2
#undef IX
    };
    const __m512i ia = _mm512_loadu_si512(idx[0]), ib = _mm512_loadu_si512(idx[1]);
    for (int j = 0; j < 16; j++) {
        /* the next blocks of both octets, ahead of the hardware prefetcher */
        _mm_prefetch((const char *)(p0 + 64 * j + 2048), _MM_HINT_T0);
        _mm_prefetch((const char *)(p1 + 64 * j + 2048), _MM_HINT_T0);
        __m512i P[2][2];
        for (int h = 0; h < 2; h++) {
            const uint8_t *p = (h ? p1 : p0) + 64 * j;
            __m512i lo = f8i5_w32(_mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)p)));
            __m512i hi =
                f8i5_w32(_mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)(p + 32))));
            P[h][0] = _mm512_permutex2var_epi16(lo, ia, hi);
            P[h][1] = _mm512_permutex2var_epi16(lo, ib, hi);
        }
        Wp[4 * j + 0] = _mm512_shuffle_i64x2(P[0][0], P[1][0], 0x44);
        Wp[4 * j + 1] = _mm512_shuffle_i64x2(P[0][0], P[1][0], 0xEE);
        Wp[4 * j + 2] = _mm512_shuffle_i64x2(P[0][1], P[1][1], 0x44);
        Wp[4 * j + 3] = _mm512_shuffle_i64x2(P[0][1], P[1][1], 0xEE);
    }
}

/* The |w| < 2^-3 weights of one 16-row panel as vpdpwssd vectors: lov[i] holds WL at (row r,
 * k & 1) of k-pair loj[i], zero elsewhere. */
typedef struct f8i5_lo {
    __m512i lov[64];
    int loj[64];
    int n;
} f8i5_lo;

static void f8i5_lo_add(const uint32_t *lo, int nlo, int row0, f8i5_lo *L, int8_t *slot)
{
    for (int i = 0; i < nlo; i++) {
        uint32_t e = lo[i];
        int k = (int)(e & 127), r = row0 + (int)((e >> 8) & 7), j = k / 2;
        if (slot[j] < 0) {
            slot[j] = (int8_t)L->n;
            L->lov[L->n] = _mm512_setzero_si512();
            L->loj[L->n++] = j;
        }
        int16_t *lanes = (int16_t *)&L->lov[slot[j]];
        lanes[2 * r + (k & 1)] = (int16_t)(e >> 16);
    }
}

/* One token's activations for the integer path: a9 = 128 * A' + AL' with A' = a9 >> 7
 * (|A'| <= 1792) and AL' = a9 & 127, as int16 pairs (k 2j, 2j+1), interleaved: hl[2j] is the
 * A' pair, hl[2j + 1] the AL' pair (one pointer per token in the kernels). */
typedef struct f8i5_tile {
    uint32_t *hl;
    float *sa; /* per 128-block: a_scale, or NaN when the block has a NaN code */
} f8i5_tile;

static size_t f8i5_token_bytes(int kn)
{
    return round64((size_t)kn * 4) + round64((size_t)kn / 128 * 4);
}

static f8i5_tile f8i5_tile_at(uint8_t *base, int kn, int t)
{
    uint8_t *p = base + (size_t)t * f8i5_token_bytes(kn);
    f8i5_tile r;
    r.hl = (uint32_t *)p;
    r.sa = (float *)(p + round64((size_t)kn * 4));
    return r;
}

static void f8i5_prep(const gemm_call *c, int m, int k0, int kn, f8i5_tile d)
{
    int K = c->w->K, KB = K / 128;
    const uint8_t *a = c->a + (size_t)m * K + k0;
    for (int b = 0; b < kn / 128; b++) {
        __mmask16 nan = 0;
        for (int i = 128 * b; i < 128 * b + 128; i += 16) {
            __mmask16 n;
            __m512i v = a9x16(a + i, &n);
            nan |= n;
            /* words: A' and AL' of k i..i+15 -> dwords (A'_2j, A'_2j+1), (AL'_2j, AL'_2j+1) */
            __m512i h = _mm512_srai_epi32(v, 7), l = _mm512_and_si512(v, _mm512_set1_epi32(127));
            __m512i hw = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(h));
            __m512i lw = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(l));
            /* 64-bit interleave of the pair dwords: (h0 l0 h1 l1 ...) */
            __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            _mm512_storeu_si512(d.hl + i, _mm512_permutex2var_epi32(hw, idx, lw));
        }
        d.sa[b] = nan ? NAN : c->a_scale[(size_t)m * KB + k0 / 128 + b];
    }
}

typedef struct f8i5_tok {
    const uint32_t *hl;
    const float *sa;
    float *out; /* this token's 16 outputs at the current unit */
} f8i5_tok;

#define F8I5_FOR_T(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* For T tokens over k-pairs [j0, j1) of block kb: s1[t] = sum(A' * W), s2[t] = sum(AL' * W). */
static inline __attribute__((always_inline)) void f8i5_kernel(const int T, const __m512i *Wp,
                                                              int j0, int j1, int kb,
                                                              const f8i5_tok *tk, __m512i *s1,
                                                              __m512i *s2)
{
#define F8I5_PTR(t) const uint32_t *hl##t = tk[T > t ? t : 0].hl + 128 * kb;
    F8I5_FOR_T(F8I5_PTR)
    __m512i S0 = _mm512_setzero_si512(), S1 = S0, S2 = S0, S3 = S0, S4 = S0, S5 = S0, S6 = S0,
            S7 = S0;
    __m512i L0 = S0, L1 = S0, L2 = S0, L3 = S0, L4 = S0, L5 = S0, L6 = S0, L7 = S0;
    for (int j = j0; j < j1; j++) {
        __m512i w_ = _mm512_load_si512(Wp + j);
#define F8I5_MAC(t)                                                                                \
    if (T > t) {                                                                                   \
        DPWSSD_B(S##t, w_, hl##t + 2 * j);                                                         \
        DPWSSD_B(L##t, w_, hl##t + 2 * j + 1);                                                     \
    }
        F8I5_FOR_T(F8I5_MAC)
    }
#define F8I5_STORE(t)                                                                              \
    if (T > t) {                                                                                   \
        s1[t] = S##t;                                                                              \
        s2[t] = L##t;                                                                              \
    }
    F8I5_FOR_T(F8I5_STORE)
}

typedef void (*f8i5_fn)(const __m512i *Wp, int j0, int j1, int kb, const f8i5_tok *tk, __m512i *s1,
                        __m512i *s2);
#define F8I5_KERNEL_T(n)                                                                           \
    static __attribute__((noinline)) void f8i5_kernel_##n(                                         \
        const __m512i *Wp, int j0, int j1, int kb, const f8i5_tok *tk, __m512i *s1, __m512i *s2)   \
    {                                                                                              \
        f8i5_kernel(n, Wp, j0, j1, kb, tk, s1, s2);                                                \
    }
F8I5_KERNEL_T(1)
F8I5_KERNEL_T(2)
F8I5_KERNEL_T(3)
F8I5_KERNEL_T(4)
F8I5_KERNEL_T(5)
F8I5_KERNEL_T(6)
F8I5_KERNEL_T(7)
F8I5_KERNEL_T(8)
static const f8i5_fn f8i5_kernels[F8I5_T + 1] = {NULL,          f8i5_kernel_1, f8i5_kernel_2,
                                                 f8i5_kernel_3, f8i5_kernel_4, f8i5_kernel_5,
                                                 f8i5_kernel_6, f8i5_kernel_7, f8i5_kernel_8};

static inline __m512d lo8_pd(__m512i x)
{
    return _mm512_cvtepi32_pd(_mm512_castsi512_si256(x));
}

static inline __m512d hi8_pd(__m512i x)
{
    return _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(x, 1));
}

/* d[0] / d[1] (rows 0-7 / 8-15, doubles) += x * unit (exact: x * unit is a multiple of 2^-18
 * below 2^25, and so is every sum of such terms here) */
static inline void f8i5_acc(__m512d *d, __m512i x, double unit)
{
    d[0] = _mm512_fmadd_pd(lo8_pd(x), _mm512_set1_pd(unit), d[0]);
    d[1] = _mm512_fmadd_pd(hi8_pd(x), _mm512_set1_pd(unit), d[1]);
}

/* The exact block sum of one token, rounded once; then out += P * (sa * ws). In:
 *   T1 = sum(A' * W)   units 2^-8   as int32 (s1), or in double (t1d) when summed in parts
 *   T3 = sum(AL' * W)  units 2^-15  (s2, |T3| <= 128 * 127 * 28672 < 2^29)
 * and from the small-weight vectors: T2 = sum(A' * WL) (units 2^-11, |16 T2| < 2^28) and
 * T4 = sum(AL' * WL) (units 2^-18). F = 16 T2 + T3 stays in int32. */
static void f8i5_finish(const f8i5_tok *tk, int kb, const f8i5_lo *L, const __m512i *s1, __m512i s2,
                        const __m512d *t1d, float wsc, unsigned nanb)
{
    __m512i F = _mm512_setzero_si512(), G = F;
    if (L->n) {
        const uint32_t *hl = tk->hl + 128 * kb;
        for (int i = 0; i < L->n; i++) {
            F = _mm512_dpwssd_epi32(F, L->lov[i], _mm512_set1_epi32((int)hl[2 * L->loj[i]]));
            G = _mm512_dpwssd_epi32(G, L->lov[i], _mm512_set1_epi32((int)hl[2 * L->loj[i] + 1]));
        }
        F = _mm512_slli_epi32(F, 4);
    }
    F = _mm512_add_epi32(F, s2);
    __m512 p;
    int fz = _mm512_test_epi32_mask(F, F) == 0, gz = _mm512_test_epi32_mask(G, G) == 0;
    if (s1 && fz && gz) {
        p = _mm512_mul_ps(_mm512_cvtepi32_ps(*s1), _mm512_set1_ps(0x1p-8f));
    } else {
        __m512d d[2];
        if (s1) {
            d[0] = _mm512_mul_pd(lo8_pd(*s1), _mm512_set1_pd(0x1p-8));
            d[1] = _mm512_mul_pd(hi8_pd(*s1), _mm512_set1_pd(0x1p-8));
        } else {
            d[0] = t1d[0];
            d[1] = t1d[1];
        }
        f8i5_acc(d, F, 0x1p-15);
        if (!gz)
            f8i5_acc(d, G, 0x1p-18);
        p = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d[0])), _mm512_cvtpd_ps(d[1]),
                               1);
    }
    if (__builtin_expect(nanb != 0, 0))
        p = _mm512_mask_mov_ps(p, (__mmask16)nanb,
                               _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
    p = _mm512_mul_ps(p, _mm512_set1_ps(tk->sa[kb] * wsc));
    _mm512_storeu_ps(tk->out, _mm512_add_ps(_mm512_loadu_ps(tk->out), p));
}

/* Many tokens: for each 16-row unit and 128-block, build the panel once and run it against
 * every token of the tile. */
static void f8i5_tile_run(const gemm_call *c, int u0, int u1, int m0, int mt, int k0, int kn,
                          uint8_t *base)
{
    const gemm_weight *w = c->w;
    int N = w->N, K = w->K, KB = K / 128, nkb = kn / 128;
    int ng = (mt + F8I5_T - 1) / F8I5_T;
    _Alignas(64) __m512i Wp[64];
    _Alignas(64) f8i5_lo L;
    _Alignas(64) __m512i s1[F8I5_T], s2[F8I5_T], q1[F8I5_T], q2[F8I5_T];
    _Alignas(64) __m512d t1d[F8I5_T][2];
    /* units outer: each octet's weights are read sequentially along K */
    for (int u = u0; u < u1; u++) {
        for (int kb = 0; kb < nkb; kb++) {
            size_t b0 = (size_t)(2 * u) * KB + k0 / 128 + kb, b1 = b0 + KB;
            const uint8_t *p0 = w->data + (size_t)(2 * u) * K * 8 + (size_t)(k0 + 128 * kb) * 8;
            f8i5_panel(p0, p0 + (size_t)K * 8, Wp);
            int safe = w->int_safe[b0] && w->int_safe[b1];
            int8_t slot[64];
            memset(slot, -1, sizeof slot);
            L.n = 0;
            f8i5_lo_add(w->lo_ent + w->lo_off[b0], (int)(w->lo_off[b0 + 1] - w->lo_off[b0]), 0, &L,
                        slot);
            f8i5_lo_add(w->lo_ent + w->lo_off[b1], (int)(w->lo_off[b1 + 1] - w->lo_off[b1]), 8, &L,
                        slot);
            float wsc = w->fscale[(size_t)(u / 8) * KB + k0 / 128 + kb];
            unsigned nanb =
                w->nanrows ? (unsigned)w->nanrows[b0] | (unsigned)w->nanrows[b1] << 8 : 0;
            for (int g = 0, t0 = 0; g < ng; g++) {
                int T = mt / ng + (g < mt % ng);
                f8i5_tok tk[F8I5_T];
                for (int t = 0; t < T; t++) {
                    f8i5_tile d = f8i5_tile_at(base, kn, t0 + t);
                    tk[t] = (f8i5_tok){d.hl, d.sa, c->out + (size_t)(m0 + t0 + t) * N + 16 * u};
                }
                if (safe) {
                    f8i5_kernels[T](Wp, 0, 64, kb, tk, s1, s2);
                    for (int t = 0; t < T; t++)
                        f8i5_finish(&tk[t], kb, &L, &s1[t], s2[t], NULL, wsc, nanb);
                } else {
                    /* T1 in four parts of 32 k, each below 2^31, added in double */
                    for (int t = 0; t < T; t++) {
                        t1d[t][0] = t1d[t][1] = _mm512_setzero_pd();
                        s2[t] = _mm512_setzero_si512();
                    }
                    for (int part = 0; part < 4; part++) {
                        f8i5_kernels[T](Wp, 16 * part, 16 * part + 16, kb, tk, q1, q2);
                        for (int t = 0; t < T; t++) {
                            f8i5_acc(t1d[t], q1[t], 0x1p-8);
                            s2[t] = _mm512_add_epi32(s2[t], q2[t]);
                        }
                    }
                    for (int t = 0; t < T; t++)
                        f8i5_finish(&tk[t], kb, &L, NULL, s2[t], t1d[t], wsc, nanb);
                }
                t0 += T;
            }
        }
    }
}

/* ---- what the driver calls (gemm_drive) ---- */

static int avx512_ipath(const gemm_weight *w, int M)
{
    return w->kind == GEMM_KIND_FP8 && M > F8D_MAX;
}

static size_t avx512_token_bytes(const gemm_weight *w, int kn, int ipath)
{
    if (w->kind == GEMM_KIND_MXFP4)
        return mx5_token_bytes(kn);
    return ipath ? f8i5_token_bytes(kn) : f8_token_bytes(kn, 0);
}

static void avx512_tile_prep(const gemm_call *c, int m0, int mt, int k0, int kn, void *base,
                             int ipath)
{
    pthread_once(&tables_once, tables_init);
    if (c->w->kind == GEMM_KIND_MXFP4) {
        mx5_tile_prep(c, m0, mt, k0, kn, base);
        return;
    }
    size_t tb = f8_token_bytes(kn, 0);
    for (int t = 0; t < mt; t++) {
        uint8_t *p = (uint8_t *)base + (size_t)t * tb;
        if (ipath)
            f8i5_prep(c, m0 + t, k0, kn, f8i5_tile_at(base, kn, t));
        else
            f8_prep(c, m0 + t, k0, kn, (double *)p, (float *)(p + round64((size_t)kn * 8)));
    }
}

static void avx512_tile_run(const gemm_call *c, int u0, int u1, int m0, int mt, int k0, int kn,
                            void *base, int ipath)
{
    if (c->w->kind == GEMM_KIND_MXFP4)
        mx5_tile_run(c, u0, u1, m0, mt, k0, kn, base);
    else if (ipath)
        f8i5_tile_run(c, u0, u1, m0, mt, k0, kn, base);
    else
        f8d_tile_run(c, u0, u1, m0, mt, k0, kn, base);
}

const gemm_kops gemm_avx512_kops = {
    .unit = 16,
    .ipath = avx512_ipath,
    .token_bytes = avx512_token_bytes,
    .tile_prep = avx512_tile_prep,
    .tile_run = avx512_tile_run,
};
