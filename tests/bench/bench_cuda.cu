/*
 * bench_cuda.cu — the CUDA exact block GEMMs at DeepSeek-V4-Flash shapes (w1: N=2048, K=4096),
 * as a ratio to the device's own copy bandwidth measured in the same run.
 *
 * Weights of 16 experts (more than the H200's 50 MB L2) are cycled so they come from HBM.
 * Reported: effective weight bytes/s of each kernel over the D2D copy bandwidth (bytes read +
 * written per second), for M = 1, 8, 64 tokens. These kernels are the exact reference on the
 * GPU (one thread per output, double block sums), not the tensor-core path; the ratio says how
 * far from the memory bound they are. Run by tests/gpu/check.sh.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "kernels/cuda/cuda_backend.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static float ms_between(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

int main()
{
    if (cu_device_count() == 0) {
        printf("bench_cuda: no CUDA device, skipped\n");
        return 0;
    }
    char dev[128];
    cu_device_describe(0, dev, sizeof dev);
    const int N = 2048, K = 4096, E = 16, iters = 3;
    size_t wfp8 = (size_t)N * K, wfp4 = wfp8 / 2, sfp4 = (size_t)N * K / 32;
    size_t sfp8 = (size_t)(N / 128) * (K / 128) * 4;
    uint8_t *w8, *w4, *s4, *a;
    float *s8, *as, *out;
    CK(cudaMalloc(&w8, wfp8 * E));
    CK(cudaMalloc(&w4, wfp4 * E));
    CK(cudaMalloc(&s4, sfp4 * E));
    CK(cudaMalloc(&s8, sfp8 * E));
    CK(cudaMalloc(&a, (size_t)64 * K));
    CK(cudaMalloc(&as, (size_t)64 * (K / 128) * 4));
    CK(cudaMalloc(&out, (size_t)64 * N * 4));
    CK(cudaMemset(w8, 0x38, wfp8 * E));
    CK(cudaMemset(w4, 0x22, wfp4 * E));
    CK(cudaMemset(s4, 120, sfp4 * E));
    CK(cudaMemset(s8, 0, sfp8 * E));
    CK(cudaMemset(a, 0x38, (size_t)64 * K));
    CK(cudaMemset(as, 0, (size_t)64 * (K / 128) * 4));
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));

    /* baseline: device-to-device copy of the FP8 weight set */
    uint8_t *dst;
    CK(cudaMalloc(&dst, wfp8 * E));
    CK(cudaMemcpy(dst, w8, wfp8 * E, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(t0));
    for (int i = 0; i < iters; i++)
        CK(cudaMemcpy(dst, w8, wfp8 * E, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(t1));
    CK(cudaEventSynchronize(t1));
    double copy_bps = 2.0 * wfp8 * E * iters / (ms_between(t0, t1) / 1e3);
    printf("device %s\nD2D copy bandwidth (read+write): %.1f GB/s\n", dev, copy_bps / 1e9);
    printf("%-6s %-4s %12s %14s %10s\n", "kind", "M", "us/expert", "weight GB/s", "ratio");
    ep_err err;
    for (int M : {1, 8, 64}) {
        for (int fp4 = 0; fp4 < 2; fp4++) {
            size_t wb = fp4 ? wfp4 + sfp4 : wfp8 + sfp8;
            CK(cudaEventRecord(t0));
            for (int i = 0; i < iters; i++)
                for (int e = 0; e < E; e++) {
                    int rc =
                        fp4 ? cu_gemm_mxfp4_dev(M, N, K, a, as, w4 + wfp4 * e, s4 + sfp4 * e, out,
                                                NULL, &err)
                            : cu_gemm_fp8_dev(M, N, K, a, as, w8 + wfp8 * e,
                                              (float *)((uint8_t *)s8 + sfp8 * e), out, NULL, &err);
                    if (rc) {
                        fprintf(stderr, "%s\n", err.msg);
                        return 1;
                    }
                }
            CK(cudaEventRecord(t1));
            CK(cudaEventSynchronize(t1));
            double s = ms_between(t0, t1) / 1e3 / (iters * E);
            double bps = wb / s;
            printf("%-6s %-4d %12.1f %14.1f %10.3f\n", fp4 ? "mxfp4" : "fp8", M, s * 1e6, bps / 1e9,
                   bps / copy_bps);
        }
    }
    return 0;
}
