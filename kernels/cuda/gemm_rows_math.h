/*
 * gemm_rows_math.h — the integer arithmetic of the exact MXFP4 GEMM kernel (gemm_exact.cu),
 * written once for the device and the host (prefix rxm_), so tests/unit/test_cuda_math.c can
 * prove on a machine without a GPU that it computes kernels/cpu/gemm_ref.c's block sums.
 *
 * A 32-block sum of e4m3 activations times e2m1 weights is P = sum_k a_k w_k with a_k = e4m3 x
 * 2^9 (an integer, |a| < 2^18) and w_k = e2m1 x 2 (an integer, |w| <= 12); P x 2^-10 is the
 * exact block sum and |P| < 2^27. The kernel splits each a into three signed 6-bit digits,
 * a = d2 2^12 + d1 2^6 + d0 (each |d| <= 63), keeps them as int8x4 words, decodes four weight
 * nibbles at a time into an int8x4 word with byte permutes, and sums with dp4a: three int32
 * chains recombined as (s2 << 12) + (s1 << 6) + s0 = P exactly.
 *
 * The byte permute is PTX prmt.b32 in its generic form: result byte i is source byte
 * (c >> 4i) & 7 of {b, a}, and when bit 3 of that selector is set the selected byte's sign bit
 * is replicated over the result byte (the host emulation follows that definition).
 */
#ifndef EPMOE_GEMM_ROWS_MATH_H
#define EPMOE_GEMM_ROWS_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define RXM_FN static __host__ __device__ __forceinline__
#else
#define RXM_FN static inline
#endif

/* prmt.b32 d, a, b, c (generic form). */
RXM_FN uint32_t rxm_prmt(uint32_t a, uint32_t b, uint32_t c)
{
#ifdef __CUDA_ARCH__
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    uint64_t src = ((uint64_t)b << 32) | a;
    uint32_t d = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t sel = (c >> (4 * i)) & 15;
        uint32_t byte = (uint32_t)(src >> (8 * (sel & 7))) & 0xFF;
        if (sel & 8)
            byte = (byte & 0x80) ? 0xFF : 0x00;
        d |= byte << (8 * i);
    }
    return d;
#endif
}

/* dp4a: c + the sum of the four products of the signed bytes of a and b. */
RXM_FN int rxm_dp4a(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(uint8_t)((uint32_t)a >> (8 * i)) *
             (int)(int8_t)(uint8_t)((uint32_t)b >> (8 * i));
    return c;
#endif
}

/* e4m3 code -> |value| x 2^9, an exact integer below 2^18 (NaN codes are flagged elsewhere). */
RXM_FN int rxm_e4m3_mag(uint32_t b)
{
    int e = (int)((b >> 3) & 15), m = (int)(b & 7);
    return e ? (8 | m) << (e - 1) : m;
}

/* Four e4m3 codes (the bytes of w) -> their three digit words: byte i of d[j] is the signed
 * digit j of code i. */
RXM_FN void rxm_digits4(uint32_t w, uint32_t d[3])
{
    d[0] = d[1] = d[2] = 0;
    for (int b = 0; b < 4; b++) {
        uint32_t c = (w >> (8 * b)) & 0xFF;
        int v = rxm_e4m3_mag(c);
        int s = (c & 0x80) ? -1 : 1;
        for (int j = 0; j < 3; j++)
            d[j] |= (uint32_t)(uint8_t)(int8_t)(s * ((v >> (6 * j)) & 63)) << (8 * b);
    }
}

/* Four e2m1 nibbles (the low 16 bits of x; nibble i = element i) -> four int8 of value x 2. */
RXM_FN uint32_t rxm_e2m1x4(uint32_t x)
{
    uint32_t sel = x & 0x7777u;
    uint32_t pos = rxm_prmt(0x03020100u, 0x0C080604u, sel); /* 0 1 2 3 4 6 8 12 */
    uint32_t neg = rxm_prmt(0xFDFEFF00u, 0xF4F8FAFCu, sel); /* their negations */
    uint32_t sgn = rxm_prmt(x << 4, x, 0xD9C8u);            /* 0xFF where a nibble's bit 3 is set */
    return (pos & ~sgn) | (neg & sgn);
}

/* A 32-block's 16 weight bytes (4 words) -> eight int8x4 words, element order kept. */
RXM_FN void rxm_fp4_decode(const uint32_t w[4], uint32_t w8[8])
{
    for (int i = 0; i < 4; i++) {
        w8[2 * i] = rxm_e2m1x4(w[i] & 0xFFFF);
        w8[2 * i + 1] = rxm_e2m1x4(w[i] >> 16);
    }
}

/* P of one 32-block from its 24 digit words (for its 8 groups of 4 k: d0, d1, d2 each) and
 * its decoded weights. The recombination multiplies (a shift of a negative int is undefined
 * in C); every intermediate stays below 2^31. */
RXM_FN int rxm_fp4_dot(const uint32_t dig[24], const uint32_t w8[8])
{
    int s0 = 0, s1 = 0, s2 = 0;
    for (int q = 0; q < 8; q++) {
        s0 = rxm_dp4a((int)dig[3 * q + 0], (int)w8[q], s0);
        s1 = rxm_dp4a((int)dig[3 * q + 1], (int)w8[q], s1);
        s2 = rxm_dp4a((int)dig[3 * q + 2], (int)w8[q], s2);
    }
    return s2 * 4096 + s1 * 64 + s0;
}

#endif
