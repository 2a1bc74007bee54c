/*
 * pool.h — a fixed pool of worker threads for the CPU kernels (prefix tpool_): the expert
 * GEMMs split over N on it, the router over tokens, the MoE layer over experts and rows, and
 * the CUDA backend's host half scores tokens on it.
 *
 * A pool runs one job at a time: calls that share a pool must not overlap (a pool belongs to
 * one caller thread at a time; calls with pool NULL may run concurrently). Every function that
 * takes a pool accepts NULL and then runs on the calling thread alone. The split never changes
 * a result: the kernels compute each output element on one thread from its own inputs.
 */
#ifndef EPMOE_POOL_H
#define EPMOE_POOL_H

#include "common/error.h"

/* Threads in one pool (one per CPU on any machine we target). */
#define TPOOL_MAX_THREADS 256
/* Scratch each thread of a pool owns, 64-byte aligned: one tile of a GEMM's preprocessed
 * activations (kernels/cpu/gemm_drive.c). */
#define TPOOL_SCRATCH (1u << 20)

typedef struct tpool tpool;

/* nthreads <= 0 means one per online CPU (at most TPOOL_MAX_THREADS); the caller is one of
 * them, so nthreads - 1 threads are started. */
tpool *tpool_create(int nthreads, ep_err *err);
void tpool_destroy(tpool **self_p);
/* Threads that compute, the caller included; 1 for NULL. */
int tpool_size(const tpool *pool);

/* Run fn(ctx, tid, nthreads) on every thread of the pool (the caller is tid 0) and return when
 * all have finished. pool NULL: fn(ctx, 0, 1) on the caller. */
typedef void (*tpool_task_fn)(void *ctx, int tid, int nthreads);
void tpool_run(tpool *pool, tpool_task_fn fn, void *ctx);

/* Run fn(ctx, i, tid) once for every i in [0, n) on the threads of pool (tid: the thread,
 * 0 .. tpool_size - 1, so that fn can keep per-thread state); indices are taken in increasing
 * order from a shared counter. pool NULL: in order on the caller. */
typedef void (*tpool_for_fn)(void *ctx, int i, int tid);
void tpool_for(tpool *pool, int n, tpool_for_fn fn, void *ctx);

/* Scratch owned by thread tid of the pool: TPOOL_SCRATCH bytes. NULL for a NULL pool. */
void *tpool_scratch(tpool *pool, int tid);

#endif
