/* error.c — see error.h. Messages are truncated, never overflowed. */
#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ep_err_set(ep_err *err, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int ep_err_prefix(ep_err *err, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    char ctx[EP_ERR_MSG_MAX];
    char old[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", ctx, old);
    return -1;
}

int ep_err_errno(ep_err *err, const char *fmt, ...)
{
    int saved = errno;
    if (err == NULL)
        return -1;
    char ctx[EP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    snprintf(err->msg, sizeof err->msg, "%s: %s", ctx, strerror(saved));
    errno = saved;
    return -1;
}

void ep_err_clear(ep_err *err)
{
    if (err != NULL)
        err->msg[0] = '\0';
}
