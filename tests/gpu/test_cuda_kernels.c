/*
 * test_cuda_kernels.c — every CUDA kernel against the CPU backend, bit for bit.
 *
 * The CUDA quantizer and exact block GEMMs are defined to give the CPU reference's bits (see
 * kernels/cuda/cuda_backend.h), so the comparison is equality, not a tolerance. Inputs cover
 * both scale kinds (powers of two and plain fp32), adversarial activation blocks (tiny and huge
 * values mixed, zeros, +-448 and subnormal e4m3 codes) and shapes with several M, N, K.
 * Exits 77 (skipped) when there is no CUDA device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/formats.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "test.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static float gauss(void)
{
    float s = 0;
    for (int i = 0; i < 6; i++)
        s += (float)(rnd() & 0xFFFF) / 65536.0f;
    return s - 3.0f;
}

/* bf16 activations with the occasional tiny, huge and zero value */
static void fill_act(uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = gauss();
        uint32_t r = rnd() % 64;
        if (r == 0)
            v *= 1e-6f;
        else if (r == 1)
            v *= 300.0f;
        else if (r == 2)
            v = 0.0f;
        x[i] = fmt_f32_to_bf16(v);
    }
}

static uint8_t rand_e4m3(void)
{
    uint8_t c;
    do
        c = (uint8_t)rnd();
    while ((c & 0x7F) == 0x7F);
    return c;
}

static int bits_equal(const void *a, const void *b, size_t n, const char *what)
{
    if (memcmp(a, b, n) == 0)
        return 1;
    const uint8_t *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i])
        i++;
    printf("  %s differs first at byte %zu (%02x vs %02x)\n", what, i, x[i], y[i]);
    return 0;
}

TEST(act_quant_matches_cpu)
{
    if (cu_device_count() == 0)
        SKIP("no CUDA device");
    for (int pow2 = 0; pow2 < 2; pow2++) {
        int M = 37, K = 1024;
        uint16_t *x = malloc((size_t)M * K * 2);
        uint8_t *q = malloc((size_t)M * K), *qg = malloc((size_t)M * K);
        float *s = malloc((size_t)M * K / 128 * 4), *sg = malloc((size_t)M * K / 128 * 4);
        fill_act(x, (size_t)M * K);
        qt_act_rows_impl(GEMM_IMPL_REF, x, M, K, pow2, q, s);
        ep_err err;
        CHECK(cu_act_quant(x, M, K, pow2, qg, sg, &err) == 0);
        CHECK(bits_equal(q, qg, (size_t)M * K, "codes"));
        CHECK(bits_equal(s, sg, (size_t)M * K / 128 * 4, "scales"));
        free(x), free(q), free(qg), free(s), free(sg);
    }
}

static void gemm_case(int fp4, int pow2, int M, int N, int K)
{
    size_t na = (size_t)M * K;
    uint16_t *x = malloc(na * 2);
    uint8_t *a = malloc(na);
    float *as = malloc(na / 128 * 4);
    fill_act(x, na);
    qt_act_rows_impl(GEMM_IMPL_REF, x, M, K, pow2, a, as);
    float *ref = malloc((size_t)M * N * 4), *got = malloc((size_t)M * N * 4);
    ep_err err;
    gemm_weight *w = NULL;
    int rc;
    if (fp4) {
        uint8_t *wp = malloc((size_t)N * K / 2), *ws = malloc((size_t)N * K / 32);
        for (size_t i = 0; i < (size_t)N * K / 2; i++)
            wp[i] = (uint8_t)rnd();
        for (size_t i = 0; i < (size_t)N * K / 32; i++)
            ws[i] = (uint8_t)(120 + rnd() % 12);
        w = gemm_pack_mxfp4(N, K, wp, ws, GEMM_IMPL_REF, &err);
        rc = cu_gemm_mxfp4(M, N, K, a, as, wp, ws, got, &err);
        free(wp), free(ws);
    } else {
        uint8_t *wq = malloc((size_t)N * K);
        float *ws = malloc((size_t)(N / 128) * (K / 128) * 4);
        for (size_t i = 0; i < (size_t)N * K; i++)
            wq[i] = rand_e4m3();
        for (size_t i = 0; i < (size_t)(N / 128) * (K / 128); i++)
            ws[i] =
                pow2 ? fmt_e8m0_to_f32((uint8_t)(115 + rnd() % 8)) : 1e-3f * (1 + gauss() * 0.1f);
        w = gemm_pack_fp8(N, K, wq, ws, GEMM_IMPL_REF, &err);
        rc = cu_gemm_fp8(M, N, K, a, as, wq, ws, got, &err);
        free(wq), free(ws);
    }
    CHECK(w != NULL);
    CHECK(rc == 0);
    if (rc != 0)
        printf("  %s\n", err.msg);
    gemm_run(w, M, a, as, ref, NULL);
    char what[96];
    snprintf(what, sizeof what, "%s gemm M=%d N=%d K=%d pow2=%d", fp4 ? "mxfp4" : "fp8", M, N, K,
             pow2);
    CHECK(bits_equal(ref, got, (size_t)M * N * 4, what));
    gemm_weight_free(&w);
    free(x), free(a), free(as), free(ref), free(got);
}

TEST(gemms_match_cpu)
{
    if (cu_device_count() == 0)
        SKIP("no CUDA device");
    static const int shapes[][3] = {
        {1, 256, 512}, {7, 384, 256}, {64, 2048, 1024}, {300, 256, 2048}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int fp4 = 0; fp4 < 2; fp4++)
            for (int pow2 = 0; pow2 < 2; pow2++)
                gemm_case(fp4, pow2, shapes[i][0], shapes[i][1], shapes[i][2]);
}

int main(void)
{
    char dev[128];
    if (cu_device_count() > 0) {
        cu_device_describe(0, dev, sizeof dev);
        printf("device: %s\n", dev);
    }
    RUN(act_quant_matches_cpu);
    RUN(gemms_match_cpu);
    return test_report();
}
