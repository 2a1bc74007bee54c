/*
 * test_cuda_math.c — the integer arithmetic of the CUDA backend's exact MXFP4 kernel
 * (kernels/cuda/gemm_rows_math.h), run on the host: the device compiles the very same
 * functions, so this proves on a machine without a GPU that the kernel's block sums are
 * kernels/cpu/gemm_ref.c's. Expected values come from kernels/formats.h's decoders and plain
 * integer arithmetic, never from the functions under test.
 *
 * Properties: the byte permute follows PTX prmt's definition (copy and sign-replicate);
 * four e2m1 nibbles decode to 2 x their values for every one of the 65,536 inputs; every
 * e4m3 code's three 6-bit digits recombine to its value x 2^9 (in every byte position);
 * decode + dp4a chains give the exact block sum for random and extreme blocks.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/gemm_rows_math.h"
#include "kernels/formats.h"
#include "test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int8_t byte_of(uint32_t w, int i)
{
    return (int8_t)(uint8_t)(w >> (8 * i));
}

TEST(prmt_copies_and_replicates_signs_as_ptx_defines)
{
    /* bytes of {b, a}: a = 0x80 7F 01 FE (b3..b0), b = 0x11 22 33 44 */
    uint32_t a = 0x807F01FEu, b = 0x11223344u;
    /* copy: result bytes = source bytes 0, 5, 3, 7 */
    uint32_t want =
        (uint32_t)0xFE | (uint32_t)0x33 << 8 | (uint32_t)0x80 << 16 | (uint32_t)0x11 << 24;
    CHECK_EQ(rxm_prmt(a, b, 0x7350), want);
    /* sign replicate (bit 3): byte 0 (0xFE, negative) -> 0xFF; byte 2 (0x7F) -> 0x00; byte 3
     * (0x80) -> 0xFF; byte 4 (0x44) -> 0x00 */
    CHECK_EQ(rxm_prmt(a, b, 0xCBA8), 0x00FF00FFu);
    CHECK_EQ(rxm_dp4a((int)0x02FF7F80u, (int)0x01010101u, 5), 5 + 2 - 1 + 127 - 128);
}

TEST(e2m1_nibbles_decode_to_twice_their_values)
{
    int bad = 0;
    for (uint32_t x = 0; x < 65536 && bad < 5; x++) {
        uint32_t w = rxm_e2m1x4(x);
        for (int i = 0; i < 4; i++) {
            float v = fmt_e2m1_to_f32((uint8_t)((x >> (4 * i)) & 15));
            if (byte_of(w, i) != (int8_t)(int)(2.0f * v)) {
                TEST_FAIL_AT("x=%04x nibble %d: %d, expected %d", x, i, byte_of(w, i),
                             (int)(2.0f * v));
                bad++;
            }
        }
    }
}

TEST(e4m3_digits_recombine_to_the_value_times_512)
{
    for (int pos = 0; pos < 4; pos++)
        for (uint32_t c = 0; c < 256; c++) {
            if ((c & 0x7F) == 0x7F)
                continue; /* NaN codes are flagged separately */
            uint32_t w = (0x38383838u & ~(0xFFu << (8 * pos))) | c << (8 * pos);
            uint32_t d[3];
            rxm_digits4(w, d);
            int v = byte_of(d[2], pos) * 4096 + byte_of(d[1], pos) * 64 + byte_of(d[0], pos);
            CHECK_EQ(v, (int)(fmt_e4m3_to_f32((uint8_t)c) * 512.0f));
            for (int j = 0; j < 3; j++)
                CHECK(byte_of(d[j], pos) >= -63 && byte_of(d[j], pos) <= 63);
        }
}

/* The block sum as gemm_ref.c defines it: sum of (e4m3 x 512) x (e2m1 x 2) in int64. */
static int64_t ref_block(const uint8_t a[32], const uint8_t w[16])
{
    int64_t s = 0;
    for (int k = 0; k < 32; k++) {
        uint8_t nib = (uint8_t)((w[k / 2] >> (4 * (k & 1))) & 15);
        s += (int64_t)(fmt_e4m3_to_f32(a[k]) * 512.0f) * (int64_t)(fmt_e2m1_to_f32(nib) * 2.0f);
    }
    return s;
}

static int block_via_kernel_math(const uint8_t a[32], const uint8_t w[16])
{
    uint32_t dig[24], wx[4], w8[8];
    for (int q = 0; q < 8; q++) {
        uint32_t codes;
        memcpy(&codes, a + 4 * q, 4);
        rxm_digits4(codes, &dig[3 * q]);
    }
    memcpy(wx, w, 16);
    rxm_fp4_decode(wx, w8);
    return rxm_fp4_dot(dig, w8);
}

TEST(decode_and_dp4a_chains_give_the_exact_block_sum)
{
    uint8_t a[32], w[16];
    for (int iter = 0; iter < 200000; iter++) {
        int kind = iter % 4;
        for (int k = 0; k < 32; k++) {
            uint8_t c = (uint8_t)rnd();
            if ((c & 0x7F) == 0x7F)
                c = 0;
            if (kind == 1) /* the largest magnitudes: the sum's extremes */
                c = (uint8_t)((rnd() & 0x80) | 0x7E);
            else if (kind == 2) /* subnormals and zeros */
                c = (uint8_t)((rnd() & 0x80) | (rnd() & 7));
            a[k] = c;
        }
        for (int i = 0; i < 16; i++)
            w[i] = kind == 1 ? (uint8_t)((rnd() & 1 ? 0xF0 : 0x70) | (rnd() & 1 ? 0x0F : 0x07))
                             : (uint8_t)rnd();
        int64_t want = ref_block(a, w);
        int got = block_via_kernel_math(a, w);
        if (got != want) {
            TEST_FAIL_AT("iteration %d (kind %d): %d, expected %lld", iter, kind, got,
                         (long long)want);
            return;
        }
    }
    /* the most negative and most positive sums */
    memset(a, 0x7E, 32);
    memset(w, 0x77, 16);
    CHECK_EQ(block_via_kernel_math(a, w), ref_block(a, w));
    memset(w, 0xFF, 16);
    CHECK_EQ(block_via_kernel_math(a, w), ref_block(a, w));
}

int main(void)
{
    RUN(prmt_copies_and_replicates_signs_as_ptx_defines);
    RUN(e2m1_nibbles_decode_to_twice_their_values);
    RUN(e4m3_digits_recombine_to_the_value_times_512);
    RUN(decode_and_dp4a_chains_give_the_exact_block_sum);
    return test_report();
}
