/*
 * combine_order.h — the order in which a token's expert outputs are summed (spec §6, docs/
 * numerics.md): ascending expert id, equal ids in slot order, slots with id -1 left out. The
 * sum is not associative, so both backends must agree on it to give the same bits: written once
 * here for the CPU backend (kernels/cpu/moe.c) and the device (kernels/cuda/cuda_dev.cu).
 */
#ifndef EPMOE_COMBINE_ORDER_H
#define EPMOE_COMBINE_ORDER_H

#include <stdint.h>

#ifdef __CUDACC__
#define CO_FN static __host__ __device__ __forceinline__
#else
#define CO_FN static inline
#endif

/* The slots of ids[0..k) (at most max of them) in summation order, into slot; returns how many.
 * An insertion sort: k is the router's top-k (a few). */
CO_FN int co_slots(const int32_t *ids, int k, int max, int *slot)
{
    int n = 0;
    for (int j = 0; j < k && j < max; j++) {
        if (ids[j] < 0)
            continue;
        int pos = n++;
        while (pos > 0 && ids[slot[pos - 1]] > ids[j]) {
            slot[pos] = slot[pos - 1];
            pos--;
        }
        slot[pos] = j;
    }
    return n;
}

#endif
