/* error.c — see error.h. Messages are truncated, never overflowed. */
#include "common/error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

size_t ep_vformat(char *buf, size_t cap, const char *fmt, va_list ap)
{
    if (cap == 0)
        return 0;
    int n = vsnprintf(buf, cap, fmt, ap);
    if (n < 0) { /* an encoding error: an empty message rather than an undefined one */
        buf[0] = '\0';
        return 0;
    }
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

int ep_err_vsetc(ep_err *err, ep_err_code code, const char *fmt, va_list ap)
{
    if (err == NULL)
        return -1;
    char text[EP_ERR_MSG_MAX]; /* the arguments may include err->msg itself */
    ep_vformat(text, sizeof text, fmt, ap);
    memcpy(err->msg, text, sizeof text);
    err->code = code;
    return -1;
}

int ep_err_setc(ep_err *err, ep_err_code code, const char *fmt, ...)
{
    EP_ERR_FROM_ARGS(err, code, fmt);
    return -1;
}

int ep_err_set(ep_err *err, const char *fmt, ...)
{
    EP_ERR_FROM_ARGS(err, EP_ERR_GENERIC, fmt);
    return -1;
}

int ep_err_prefix(ep_err *err, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    char ctx[EP_ERR_MSG_MAX];
    EP_FORMAT_ARGS(ctx, sizeof ctx, fmt);
    return ep_err_setc(err, err->code, "%s: %s", ctx, err->msg);
}

int ep_err_errno(ep_err *err, const char *fmt, ...)
{
    int saved = errno;
    if (err == NULL)
        return -1;
    char ctx[EP_ERR_MSG_MAX];
    EP_FORMAT_ARGS(ctx, sizeof ctx, fmt);
    ep_err_setc(err, EP_ERR_GENERIC, "%s: %s", ctx, strerror(saved));
    errno = saved;
    return -1;
}

void ep_err_clear(ep_err *err)
{
    if (err != NULL) {
        err->code = EP_ERR_NONE;
        err->msg[0] = '\0';
    }
}
