/* log.c — see log.h. A single fprintf per line keeps lines whole across threads. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *log_prog = "epmoe";
static log_level log_min = LOG_INFO;
static unsigned log_subs;
static bool log_journal;

static const struct {
    const char *name;
    log_sub sub;
} log_sub_names[] = {
    {"net", LOG_SUB_NET},   {"plan", LOG_SUB_PLAN}, {"load", LOG_SUB_LOAD},
    {"step", LOG_SUB_STEP}, {"data", LOG_SUB_DATA}, {"kernel", LOG_SUB_KERNEL},
};

static unsigned log_parse_subs(const char *spec)
{
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "all") == 0)
            return ~0u;
        for (size_t i = 0; i < sizeof log_sub_names / sizeof log_sub_names[0]; i++)
            if (strcmp(tok, log_sub_names[i].name) == 0)
                mask |= (unsigned)log_sub_names[i].sub;
    }
    return mask;
}

void log_init(const char *prog)
{
    if (prog != NULL) {
        const char *slash = strrchr(prog, '/');
        log_prog = slash ? slash + 1 : prog;
    }
    const char *dbg = getenv("EPMOE_DEBUG");
    log_subs = dbg ? log_parse_subs(dbg) : 0;
    log_journal = getenv("JOURNAL_STREAM") != NULL;
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

void log_debug(log_sub sub, const char *fmt, ...)
{
    if (!log_debug_enabled(sub))
        return;
    va_list ap;
    va_start(ap, fmt);
    log_vemit(LOG_DEBUG, fmt, ap);
    va_end(ap);
}
