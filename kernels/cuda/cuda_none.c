/*
 * cuda_none.c — the device half of the CUDA backend in a build without CUDA: there is none, so
 * mb_create("cuda:N") fails with a message that says so (backend_cuda.c).
 */
#include "kernels/cuda/cuda_dev.h"

const cudev_ops *cudev_cuda_ops(void)
{
    return NULL;
}
