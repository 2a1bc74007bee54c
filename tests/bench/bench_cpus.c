/*
 * bench_cpus.c — see bench_cpus.h.
 */
#include "bench_cpus.h"

#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* stat field 39 (processor): fields after the command, which is in parentheses and may hold
 * spaces, so count from its closing parenthesis (field 2 ends there; field 3 follows) */
static int task_cpu(int tid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 39; field++)
        p = strchr(p + 1, ' ');
    return p ? atoi(p + 1) : -1;
}

/* The thread's CPU time, exact: the clock id glibc's pthread_getcpuclockid makes from a thread
 * id (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED). /proc's schedstat is only brought up to date at a
 * tick or a switch, so a run shorter than a tick read 0 for a thread still running. */
static uint64_t task_ns(int tid)
{
    struct timespec ts;
    clockid_t id = (clockid_t)((~(unsigned)tid << 3) | 6u);
    if (clock_gettime(id, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void bc_snap_take(bc_snap *s)
{
    s->n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && s->n < BC_MAX_TASKS) {
        int tid = atoi(e->d_name);
        if (tid <= 0)
            continue;
        s->tid[s->n] = tid;
        s->ns[s->n] = task_ns(tid);
        s->cpu[s->n] = task_cpu(tid);
        s->n++;
    }
    if (d)
        closedir(d);
}

static int snap_find(const bc_snap *s, int tid)
{
    for (int i = 0; i < s->n; i++)
        if (s->tid[i] == tid)
            return i;
    return -1;
}

/* on-CPU nanoseconds of b's thread i since snapshot a */
static uint64_t delta_ns(const bc_snap *a, const bc_snap *b, int i)
{
    int j = snap_find(a, b->tid[i]);
    return b->ns[i] - (j >= 0 ? a->ns[j] : 0);
}

void bc_side_add(bc_side *side, const bc_snap *a, const bc_snap *b)
{
    uint64_t most = 0;
    for (int i = 0; i < b->n; i++)
        most = delta_ns(a, b, i) > most ? delta_ns(a, b, i) : most;
    int busy = 0, first_cpu = -1, same = 1;
    for (int i = 0; i < b->n; i++) {
        int cpu = b->cpu[i];
        if (most == 0 || 4 * delta_ns(a, b, i) < most || cpu < 0 || cpu >= BC_MAX_CPUS)
            continue;
        busy++;
        side->cpus[cpu / 64] |= 1ull << (cpu % 64);
        same &= first_cpu < 0 || cpu == first_cpu;
        first_cpu = first_cpu < 0 ? cpu : first_cpu;
    }
    side->runs++;
    side->busy_max = busy > side->busy_max ? busy : side->busy_max;
    side->one_cpu += busy >= 2 && same;
}

/* CPU numbers of a mask as ranges: "0-3,6" */
static int mask_format(const uint64_t *m, char *buf, int len)
{
    int pos = 0, count = 0;
    buf[0] = 0;
    for (int c = 0; c < BC_MAX_CPUS; c++) {
        if (!(m[c / 64] >> (c % 64) & 1))
            continue;
        int e = c;
        while (e + 1 < BC_MAX_CPUS && (m[(e + 1) / 64] >> ((e + 1) % 64) & 1))
            e++;
        for (int x = c; x <= e; x++)
            count++;
        if (pos < len)
            pos += e > c ? snprintf(buf + pos, (size_t)(len - pos), "%s%d-%d", pos ? "," : "", c, e)
                         : snprintf(buf + pos, (size_t)(len - pos), "%s%d", pos ? "," : "", c);
        c = e;
    }
    return count;
}

void bc_side_format(const bc_side *side, char *buf, int len)
{
    char cpus[256];
    int n = mask_format(side->cpus, cpus, sizeof cpus);
    snprintf(buf, (size_t)len,
             "CPUs %s (%d); up to %d busy threads a run; %d of %d runs had all "
             "their busy threads on one CPU",
             n ? cpus : "none seen", n, side->busy_max, side->one_cpu, side->runs);
}

int bc_side_pinned(const bc_side *side)
{
    int n = 0;
    for (int i = 0; i < BC_MAX_CPUS / 64; i++)
        n += __builtin_popcountll(side->cpus[i]);
    return side->busy_max >= 2 && n == 1;
}

void bc_affinity_format(char *buf, int len)
{
    cpu_set_t set;
    uint64_t m[BC_MAX_CPUS / 64] = {0};
    if (sched_getaffinity(0, sizeof set, &set) < 0) {
        snprintf(buf, (size_t)len, "unknown");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && c < BC_MAX_CPUS; c++)
        if (CPU_ISSET(c, &set))
            m[c / 64] |= 1ull << (c % 64);
    char cpus[256];
    int n = mask_format(m, cpus, sizeof cpus);
    snprintf(buf, (size_t)len, "%s (%d CPUs)", cpus, n);
}
