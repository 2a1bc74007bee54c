/*
 * test_formats_cuda.cpp — epmoe's encoders against the CUDA toolkit's host conversions.
 *
 * cuda_fp8.h, cuda_fp4.h and cuda_bf16.h define the conversions the GPU kernels use
 * (__NV_SATFINITE e4m3, RN e2m1, RP e8m0, RN bf16) as host functions too, so they are an
 * independent oracle that needs no GPU. Checked: all 2^32 fp32 bit patterns (about 40 s on two
 * cores; EPMOE_FORMATS_SAMPLE=1 checks every 32nd pattern instead), plus every pattern within
 * +-64 ulp of every rounding boundary of every format.
 * Skips (exit 77) when the toolkit headers are absent, which CMake decides.
 */
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/formats.h"

static float f_of(uint32_t u)
{
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

/* Returns the number of mismatching formats at x, printing the first few. */
static int compare_at(uint32_t u, long *printed)
{
    float x = f_of(u);
    int bad = 0;
    uint8_t e4 = fmt_f32_to_e4m3(x);
    uint8_t e4c = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    uint8_t e2 = fmt_f32_to_e2m1(x);
    uint8_t e2c = (uint8_t)__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    uint8_t e8 = fmt_e8m0_ceil(x);
    uint8_t e8c = (uint8_t)__nv_cvt_float_to_e8m0(x, __NV_NOSAT, cudaRoundPosInf);
    __nv_bfloat16 bc = __float2bfloat16_rn(x);
    uint16_t b = fmt_f32_to_bf16(x), bcu;
    std::memcpy(&bcu, &bc, sizeof bcu);
    bad = (e4 != e4c) + (e2 != e2c) + (e8 != e8c) + (b != bcu);
    if (bad && (*printed)++ < 10)
        std::printf("  mismatch at %08x (%.9g): e4m3 %02x/%02x e2m1 %x/%x e8m0 %02x/%02x "
                    "bf16 %04x/%04x (epmoe/cuda)\n",
                    u, x, e4, e4c, e2, e2c, e8, e8c, b, bcu);
    return bad;
}

static void sweep(uint64_t begin, uint64_t end, unsigned shift, long *bad, long *printed)
{
    for (uint64_t i = begin; i < end; i++) {
        uint32_t u =
            (uint32_t)(i << shift) | (shift ? ((uint32_t)i * 2654435761u) >> (32 - shift) : 0);
        *bad += compare_at(u, printed) != 0;
    }
}

static long boundaries(long *printed)
{
    std::vector<float> pts;
    for (unsigned c = 0; c < 127; c++) { /* e4m3 values and midpoints */
        float v = fmt_e4m3_to_f32((uint8_t)c);
        float next = c < 126 ? fmt_e4m3_to_f32((uint8_t)(c + 1)) : 480.0f;
        pts.push_back(v);
        pts.push_back((v + next) / 2);
    }
    for (float v : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f})
        pts.push_back(v);
    for (int e = -149; e <= 127; e++)
        pts.push_back(std::ldexp(1.0f, e));
    pts.push_back(f_of(0x7F7FFFFFu));
    long bad = 0;
    for (float p : pts) {
        uint32_t u;
        std::memcpy(&u, &p, sizeof u);
        for (int d = -64; d <= 64; d++) {
            bad += compare_at(u + (uint32_t)d, printed) != 0;
            bad += compare_at((u + (uint32_t)d) ^ 0x80000000u, printed) != 0;
        }
    }
    for (uint32_t u :
         {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0u, 0x80000000u})
        bad += compare_at(u, printed) != 0;
    return bad;
}

int main()
{
    long printed = 0;
    long bad = boundaries(&printed);
    std::printf("boundaries: %ld mismatching inputs\n", bad);

    const char *sample = std::getenv("EPMOE_FORMATS_SAMPLE");
    const unsigned shift = (sample && std::strcmp(sample, "1") == 0) ? 5 : 0;
    const uint64_t n = (uint64_t)1 << (32 - shift);
    const unsigned nt = 2;
    std::vector<long> tbad(nt, 0), tprinted(nt, 0);
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; t++)
        th.emplace_back(sweep, n / nt * t, n / nt * (t + 1), shift, &tbad[t], &tprinted[t]);
    for (auto &t : th)
        t.join();
    long sbad = 0;
    for (unsigned t = 0; t < nt; t++)
        sbad += tbad[t];
    std::printf("sweep of %llu bit patterns: %ld mismatching inputs\n", (unsigned long long)n,
                sbad);
    bad += sbad;
    std::printf("%s\n", bad ? "FAIL" : "ok");
    return bad ? 1 : 0;
}
