/*
 * bench_bounds.h — the machine's limits as the benchmarks measure them, with their own threads
 * and in the same run as the results they bound (docs/performance.md): the read bandwidth of a
 * vector read-sum over a buffer, and the FP32 FMA peak of the widest FMA the CPU has (zmm with
 * AVX-512, else ymm). Each call is one trial; callers keep the best of several.
 */
#ifndef EPMOE_BENCH_BOUNDS_H
#define EPMOE_BENCH_BOUNDS_H

#include <stddef.h>

double bench_now(void); /* CLOCK_MONOTONIC seconds */
int bench_wide(void);   /* the FMA and read loops use zmm */
/* bytes/s of nthreads threads (<= 64) reading disjoint slices of buf [n floats, 64-byte aligned],
 * from the first thread's start to the last one's end */
double bench_read_bw(const float *buf, size_t n, int nthreads);
/* FP32 FLOP/s of nthreads threads (<= 64) running independent FMA chains */
double bench_fma_peak(int nthreads);

#endif
