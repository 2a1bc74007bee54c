/* log.c — see log.h. A single fprintf per line keeps lines whole across threads. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"

static const char *log_prog = "epmoe";
static log_level log_min = LOG_INFO;
static unsigned log_subs;
static bool log_journal;

/* The one list of subsystems: EPMOE_DEBUG's values, --help and docs/operations.md. */
static const struct {
    const char *name;
    log_sub sub;
    const char *what;
} log_sub_names[] = {
    {"net", LOG_SUB_NET, "control-plane messages"}, {"plan", LOG_SUB_PLAN, "placement"},
    {"load", LOG_SUB_LOAD, "checkpoint loading"},   {"step", LOG_SUB_STEP, "forward steps"},
    {"data", LOG_SUB_DATA, "data-plane transfers"}, {"kernel", LOG_SUB_KERNEL, "kernel selection"},
};

const char *log_sub_name(int i)
{
    int n = (int)(sizeof log_sub_names / sizeof log_sub_names[0]);
    return i >= 0 && i < n ? log_sub_names[i].name : NULL;
}

const char *log_sub_what(int i)
{
    return log_sub_name(i) ? log_sub_names[i].what : NULL;
}

static int log_sub_bit(const char *name, unsigned *mask)
{
    if (strcmp(name, "all") == 0) {
        *mask = ~0u;
        return 0;
    }
    for (size_t i = 0; i < sizeof log_sub_names / sizeof log_sub_names[0]; i++)
        if (strcmp(name, log_sub_names[i].name) == 0) {
            *mask |= (unsigned)log_sub_names[i].sub;
            return 0;
        }
    return -1;
}

int log_sub_parse(const char *spec, unsigned *mask)
{
    char buf[256];
    *mask = 0;
    if (snprintf(buf, sizeof buf, "%s", spec) >= (int)sizeof buf)
        return -1;
    unsigned bits = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (log_sub_bit(tok, &bits) < 0)
            return -1;
    *mask = bits;
    return 0;
}

void log_init(const char *prog, unsigned debug, bool journal)
{
    if (prog != NULL) {
        const char *slash = strrchr(prog, '/');
        log_prog = slash ? slash + 1 : prog;
    }
    log_subs = debug;
    log_journal = journal;
}

void log_set_level(log_level level)
{
    log_min = level;
}

bool log_debug_enabled(log_sub sub)
{
    return (log_subs & (unsigned)sub) != 0;
}

static const char *log_level_name(log_level level)
{
    switch (level) {
    case LOG_ERROR:
        return "error";
    case LOG_WARN:
        return "warn";
    case LOG_INFO:
        return "info";
    default:
        return "debug";
    }
}

static void log_vemit(log_level level, const char *fmt, va_list ap)
{
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    if (log_journal)
        fprintf(stderr, "<%d>%s\n", (int)level, line);
    else
        fprintf(stderr, "%s[%d] %s: %s\n", log_prog, (int)getpid(), log_level_name(level), line);
}

void log_msg(log_level level, const char *fmt, ...)
{
    if (level > log_min)
        return;
    va_list ap;
    va_start(ap, fmt);
    log_vemit(level, fmt, ap);
    va_end(ap);
}

void log_limited(log_rate *r, int per_sec, log_level level, const char *fmt, ...)
{
    int64_t now = clk_mono_ms() / 1000;
    if (now != r->sec) {
        if (r->suppressed)
            log_msg(level, "(rate limit: %d more such lines were left out)", r->suppressed);
        r->sec = now;
        r->count = 0;
        r->suppressed = 0;
    }
    if (r->count >= per_sec) {
        r->suppressed++;
        return;
    }
    r->count++;
    if (level > log_min)
        return;
    va_list ap;
    va_start(ap, fmt);
    log_vemit(level, fmt, ap);
    va_end(ap);
}

void log_debug(log_sub sub, const char *fmt, ...)
{
    if (!log_debug_enabled(sub))
        return;
    va_list ap;
    va_start(ap, fmt);
    log_vemit(LOG_DEBUG, fmt, ap);
    va_end(ap);
}
