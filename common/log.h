/*
 * log.h — one line per event on stderr (prefix log_).
 *
 * Lines carry the syslog priority prefix "<N>" when stderr is the journal (JOURNAL_STREAM is
 * set, as under systemd), so journald files them at the right level; on a terminal they read
 * "epmoe-worker[1234] warn: ...". Debug lines are switched per subsystem by the environment,
 * like NCCL_DEBUG_SUBSYS: EPMOE_DEBUG=net,plan (or "all"), which main reads (common/knobs.h)
 * and hands to log_init with JOURNAL_STREAM.
 */
#ifndef EPMOE_LOG_H
#define EPMOE_LOG_H

#include <stdbool.h>
#include <stdint.h>

typedef enum log_level { LOG_ERROR = 3, LOG_WARN = 4, LOG_INFO = 6, LOG_DEBUG = 7 } log_level;

/* Debug subsystems (bit mask). Names as written in EPMOE_DEBUG. */
typedef enum log_sub {
    LOG_SUB_NET = 1 << 0,    /* "net": control-plane messages */
    LOG_SUB_PLAN = 1 << 1,   /* "plan": placement */
    LOG_SUB_LOAD = 1 << 2,   /* "load": checkpoint loading */
    LOG_SUB_STEP = 1 << 3,   /* "step": forward steps */
    LOG_SUB_DATA = 1 << 4,   /* "data": data-plane transfers */
    LOG_SUB_KERNEL = 1 << 5, /* "kernel": kernel selection */
} log_sub;

/* Name the program in every line; debug: the log_sub bits to print (EPMOE_DEBUG); journal:
 * stderr is the journal (JOURNAL_STREAM set). Safe to call more than once. */
void log_init(const char *prog, unsigned debug, bool journal);

/* "net,step" (or "all") -> log_sub bits; -1 for a name that is no subsystem. */
int log_sub_parse(const char *spec, unsigned *mask);

/* The i-th subsystem's name as EPMOE_DEBUG spells it, NULL past the last (the one list). */
const char *log_sub_name(int i);
/* What the i-th subsystem's lines are about ("control-plane messages"), NULL past the last. */
const char *log_sub_what(int i);

/* Lowest level printed (default LOG_INFO; LOG_WARN with log_set_quiet). */
void log_set_level(log_level level);

bool log_debug_enabled(log_sub sub);

void log_msg(log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_debug(log_sub sub, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A rate limit for lines a peer can cause (a flood of malformed messages must not become a
 * flood of lines): at most per_sec lines a second through one log_rate; the rest are counted,
 * and the first line of a later second says how many were left out. Zero-initialise. */
typedef struct log_rate {
    int64_t sec; /* the monotonic second count is for */
    int count, suppressed;
} log_rate;
void log_limited(log_rate *r, int per_sec, log_level level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)

#endif
