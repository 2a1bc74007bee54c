/*
 * cuda_tuning.c — the EPMOE_CUDA_* values a program's main read (common/knobs.h, knob_load)
 * into the CUDA backend's options (kernels/moe_backend.h mb_cuda_tuning), with the meaning they
 * had when the kernels read the environment themselves. Nothing under kernels/ reads it now.
 */
#include <stdbool.h>
#include <string.h>

#include "common/knobs.h"
#include "kernels/moe_backend.h"

static mb_cublaslt cut_lt(const char *text)
{
    if (text == NULL)
        return MB_LT_AUTO;
    return strcmp(text, "require") == 0 ? MB_LT_REQUIRE
           : strcmp(text, "0") == 0     ? MB_LT_NEVER
                                        : MB_LT_ALWAYS;
}

/* A row count where 0 means "none" (no threshold, never the few-row kernels): a negative
 * field, since a zero one is the default. */
static int cut_rows(int n)
{
    return n > 0 ? n : -1;
}

void mb_cuda_tuning_from_knobs(mb_cuda_tuning *t, const knob_values *kv)
{
    *t = (mb_cuda_tuning){
        .wait_s = kv->cuda_wait_s,
        .stage_bytes = kv->cuda_stage_bytes > 0 ? (size_t)kv->cuda_stage_bytes : 0,
        .cublaslt = cut_lt(kv->cuda_cublaslt),
        .cublaslt_rows = cut_rows(kv->cuda_cublaslt_rows),
        .fast_rows = cut_rows(kv->cuda_fast_rows),
        .exact_ref = kv->cuda_exact != NULL && strcmp(kv->cuda_exact, "ref") == 0,
        .split = kv->cuda_split,
        .module = kv->cuda_module,
    };
}
