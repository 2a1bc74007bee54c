/*
 * cuda_tuning.h — what a zero field of mb_cuda_tuning (kernels/moe_backend.h) stands for, for
 * the CUDA backend's host half and the kernels of the module alike (prefix cu_tune_).
 *
 * The kernels take their tuning from the GEMM they are given (cudev_gemm.tune) and the host
 * half from the backend's options; neither reads the environment.
 */
#ifndef EPMOE_CUDA_TUNING_H
#define EPMOE_CUDA_TUNING_H

#include "kernels/moe_backend.h"

/* Longest wait for the device to finish what was queued; longer is a hung device. */
#define CU_WAIT_S 120.0
/* Each of the two pinned load-staging buffers. */
#define CU_STAGE_BYTES (32u << 20)
/* cuBLASLt from this many rows per expert (measured on an H200: docs/performance.md). */
#define CU_LT_ROWS 96
/* The few-row kernels up to this many rows per expert. */
#define CU_FAST_ROWS 16
/* Most ways the row kernels split a row, until a device run has measured more. */
#define CU_SPLIT 4

static inline int cu_tune_lt_rows(const mb_cuda_tuning *t)
{
    int v = t ? t->cublaslt_rows : 0;
    return v == 0 ? CU_LT_ROWS : v < 0 ? 0 : v;
}

static inline int cu_tune_fast_rows(const mb_cuda_tuning *t)
{
    int v = t ? t->fast_rows : 0;
    return v == 0 ? CU_FAST_ROWS : v < 0 ? 0 : v;
}

static inline int cu_tune_split(const mb_cuda_tuning *t)
{
    int v = t ? t->split : 0;
    return v == 0 ? CU_SPLIT : v < 0 ? 1 : v;
}

static inline mb_cublaslt cu_tune_lt(const mb_cuda_tuning *t)
{
    return t ? t->cublaslt : MB_LT_AUTO;
}

static inline bool cu_tune_exact_ref(const mb_cuda_tuning *t)
{
    return t && t->exact_ref;
}

#endif
