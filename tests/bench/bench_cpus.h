/*
 * bench_cpus.h — which CPUs a benchmark side's threads ran on, read from the kernel (each thread
 * of /proc/self/task: its CPU time by its thread CPU clock, the CPU it last ran on from field
 * 39 of its stat), so a side whose threads were pinned together (OMP_PROC_BIND, an affinity
 * mask) shows it instead of just looking slow. The library under test owns its threads: nothing
 * is asked of them. Snapshot all of the process's threads before and after each timed run of a
 * side; a thread counts as busy in that run if it was on a CPU for at least a quarter of the
 * time of the run's busiest thread (so the other side's threads that spin a moment before
 * sleeping do not; relative, not against wall time, because on a loaded machine every thread
 * gets less). One run's last CPUs may coincide by chance on a loaded machine; over every run of
 * a side, threads that are free to move are seen on more than one CPU.
 */
#ifndef EPMOE_BENCH_CPUS_H
#define EPMOE_BENCH_CPUS_H

#include <stdint.h>

#define BC_MAX_TASKS 256
#define BC_MAX_CPUS  1024

typedef struct bc_snap {
    int n;
    int tid[BC_MAX_TASKS];
    uint64_t ns[BC_MAX_TASKS]; /* on-CPU time */
    int cpu[BC_MAX_TASKS];     /* last CPU */
} bc_snap;

typedef struct bc_side {
    uint64_t cpus[BC_MAX_CPUS / 64]; /* every CPU one of its busy threads was seen on */
    int runs;                        /* runs sampled */
    int busy_max;                    /* most busy threads in one run */
    int one_cpu;                     /* runs with >= 2 busy threads, all on one CPU */
} bc_side;

void bc_snap_take(bc_snap *s);
/* account the run between snapshots a and b to side */
void bc_side_add(bc_side *side, const bc_snap *a, const bc_snap *b);
/* "CPUs 0,1; up to 2 busy threads a run" into buf */
void bc_side_format(const bc_side *side, char *buf, int len);
/* 1 if the side had >= 2 busy threads in a run and every busy thread of every run was seen on
 * one and the same CPU */
int bc_side_pinned(const bc_side *side);
/* the CPUs the calling thread may run on (sched_getaffinity), as "0-1 (2 CPUs)" */
void bc_affinity_format(char *buf, int len);

#endif
