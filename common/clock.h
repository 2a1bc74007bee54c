/*
 * clock.h — the one clock of the code base (prefix clk_), after Redis's monotonic.h.
 *
 * Time that is measured or waited for comes from CLOCK_MONOTONIC, read here and nowhere else:
 * it never jumps with the wall clock (NTP, an operator's `date`), so a timeout neither fires
 * early nor hangs when the time of day is set. Its unit is the nanosecond in an int64 (292
 * years before it wraps), the resolution the kernels' and the client's timings need.
 *
 * Deadlines are int64 milliseconds on that clock (clk_mono_ms, clk_deadline_ms): every
 * timeout an operator or a caller sets is in milliseconds (the spec's *_timeout_ms, the
 * client's timeout_ms, epmoectl --timeout), and zmq_poll waits in milliseconds, so a deadline
 * compares and subtracts with no conversion on the way. Durations that are reported in seconds
 * (a step's phases, load times) are clk_mono_s differences. The data plane's waits (the
 * collective plane, the NCCL step, a device's stream) take clk_mono_ms deadlines too.
 *
 * The wall clock (CLOCK_REALTIME) is for what is reported as a time of day or must differ
 * between runs: timestamps, ids seeded from the time, pthread_cond_timedwait on a default
 * condition variable (clk_wall_in_ms). Header-only, so any library may use it without a link
 * dependency (the kernels included).
 */
#ifndef EPMOE_CLOCK_H
#define EPMOE_CLOCK_H

#include <stdint.h>
#include <time.h>

#define CLK_NS_PER_MS 1000000LL
#define CLK_NS_PER_S  1000000000LL

/* The monotonic clock in nanoseconds. */
static inline int64_t clk_mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * CLK_NS_PER_S + t.tv_nsec;
}

/* The same clock in the deadline unit, milliseconds. */
static inline int64_t clk_mono_ms(void)
{
    return clk_mono_ns() / CLK_NS_PER_MS;
}

/* The same clock in seconds, for durations reported in seconds. */
static inline double clk_mono_s(void)
{
    return (double)clk_mono_ns() * 1e-9;
}

/* The deadline timeout_ms from now (ms on the monotonic clock). */
static inline int64_t clk_deadline_ms(int64_t timeout_ms)
{
    return clk_mono_ms() + timeout_ms;
}

/* Milliseconds left until deadline_ms, 0 once it has passed (a zmq_poll timeout). */
static inline int64_t clk_left_ms(int64_t deadline_ms)
{
    int64_t left = deadline_ms - clk_mono_ms();
    return left > 0 ? left : 0;
}

/* The timespec `ms` milliseconds after `base` (ms >= 0). */
static inline struct timespec clk_timespec_add_ms(struct timespec base, int64_t ms)
{
    int64_t ns = (int64_t)base.tv_nsec + (ms % 1000) * CLK_NS_PER_MS;
    base.tv_sec += (time_t)(ms / 1000 + ns / CLK_NS_PER_S);
    base.tv_nsec = (long)(ns % CLK_NS_PER_S);
    return base;
}

/* The absolute monotonic time `ms` from now, for a condition variable whose clock was set to
 * CLOCK_MONOTONIC (pthread_condattr_setclock). */
static inline struct timespec clk_mono_in_ms(int64_t ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return clk_timespec_add_ms(t, ms);
}

/* The wall clock as a timespec (time of day, seeds that must differ between runs). */
static inline struct timespec clk_wall(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t;
}

/* The absolute wall time `ms` from now, for pthread_cond_timedwait on a default condition
 * variable (which waits on CLOCK_REALTIME). */
static inline struct timespec clk_wall_in_ms(int64_t ms)
{
    return clk_timespec_add_ms(clk_wall(), ms);
}

#endif
