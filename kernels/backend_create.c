/*
 * backend_create.c — the one place that names the backends (moe_backend.h: mb_create): a
 * device string makes the CPU backend or the CUDA one. It stands above both, and the front
 * (backend.c) below them, so no file of the seam includes or calls upward (ggml keeps its
 * backend registry apart from ggml-backend.cpp the same way).
 */
#include "kernels/moe_backend.h"

#include "kernels/backend.h"

mb_backend *mb_create(const mb_options *o, ep_err *err)
{
    mb_device_kind kind;
    int ordinal;
    if (mb_parse_device(o->device ? o->device : "cpu", &kind, &ordinal, err) < 0)
        return NULL;
    return kind == MB_DEV_CPU ? mb_cpu_create(o, err) : mb_cuda_create(o, ordinal, err);
}
