/*
 * error.h — the error record every fallible function fills (prefix ep_err).
 *
 * Contract: functions return 0 on success and -1 on failure (or NULL for constructors) and,
 * on failure, write one human-readable message into the caller's ep_err that names what was
 * wrong and where: file:line:column, tensor name, field, peer, and what was expected. Callers
 * add context outward with ep_err_prefix ("loading shard: " + inner message), like a
 * backtrace read left to right. Only main() and tests exit; library code never does.
 *
 * The record also carries a code (NCCL's ncclResult_t discipline): the kind of failure as the
 * wire names it (proto/epmoe.proto ErrorCode, the same numbers; common/wire.c asserts that they
 * stay equal), so a failure travels as one value from where it is found to the Error, Result or
 * StepFailed body that reports it, instead of a code and a message handed around apart. A
 * function that does not know the kind sets EP_ERR_GENERIC (ep_err_set), which the wire sends
 * as ERR_STEP_FAILED; ep_err_prefix keeps the kind an inner layer chose.
 *
 * Formatting happens in one place, ep_vformat: every printf-style helper of the code base
 * formats its arguments through EP_FORMAT_ARGS or EP_ERR_FROM_ARGS (one line instead of a
 * va_start/vsnprintf/va_end copy each).
 */
#ifndef EPMOE_ERROR_H
#define EPMOE_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#include "common/limits.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kinds of failure: proto/epmoe.proto's ErrorCode, value for value. */
typedef enum ep_err_code {
    EP_ERR_NONE = 0,
    EP_ERR_MALFORMED = 1,
    EP_ERR_UNKNOWN_TYPE = 2,
    EP_ERR_BAD_REQUEST = 3,
    EP_ERR_UNKNOWN_WORKER = 4,
    EP_ERR_CONFIG_HASH = 5,
    EP_ERR_NOT_READY = 6,
    EP_ERR_STEP_FAILED = 7,
    EP_ERR_TIMEOUT = 8,
    EP_ERR_WORKER_LOST = 9,
    EP_ERR_LOAD_FAILED = 10,
    EP_ERR_DUPLICATE = 11,
    EP_ERR_SHUTTING_DOWN = 12,
    EP_ERR_BUSY = 13,
    EP_ERR_NOT_REGISTERED = 14,
    EP_ERR_COMM_FAILED = 15,
    EP_ERR_REFUSED = 16,
    EP_ERR_NOT_SUPPORTED = 17,
    /* Not a wire code: a failure no layer has classified yet (ep_err_set's default). Sent as
     * it is, the wire reports it as ERR_STEP_FAILED, "failed, the message says why". */
    EP_ERR_GENERIC = 0x100,
} ep_err_code;

/* msg first: `ep_err e = {0}` clears both. */
typedef struct ep_err {
    char msg[EP_ERR_MSG_MAX];
    ep_err_code code; /* EP_ERR_NONE while the message is empty */
} ep_err;

/* The one formatter: vsnprintf into buf[cap], always NUL-terminated, cut (never overflowed)
 * when too long. Returns the length written. cap may be 0 (nothing written). */
size_t ep_vformat(char *buf, size_t cap, const char *fmt, va_list ap);

/* Run call with the variadic arguments of the enclosing printf-style function (whose last
 * named parameter is fmt) as the va_list named ap. */
#define EP_WITH_ARGS(fmt, ap, call)                                                                \
    do {                                                                                           \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        call;                                                                                      \
        va_end(ap);                                                                                \
    } while (0)

/* Format those arguments into buf[cap]. */
#define EP_FORMAT_ARGS(buf, cap, fmt)                                                              \
    EP_WITH_ARGS(fmt, ep_ap_, ep_vformat((buf), (cap), fmt, ep_ap_))

/* The same into an error record with its code (ep_err_vsetc). */
#define EP_ERR_FROM_ARGS(err, code, fmt)                                                           \
    EP_WITH_ARGS(fmt, ep_ap_, ep_err_vsetc((err), (code), fmt, ep_ap_))

/* Set code and message. The arguments may include err->msg itself (the message is formatted
 * aside first), so `ep_err_setc(err, c, "STEP 3: %s", err->msg)` is safe. Returns -1 so that
 * `return ep_err_setc(...)` reads as the failure it is. err may be NULL (the error is dropped). */
int ep_err_vsetc(ep_err *err, ep_err_code code, const char *fmt, va_list ap);
int ep_err_setc(ep_err *err, ep_err_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Set the message (printf format) with the code EP_ERR_GENERIC. Returns -1. */
int ep_err_set(ep_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepend context to the current message: "ctx: old message". The code stays. Returns -1. */
int ep_err_prefix(ep_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set the message from errno: "<formatted>: <strerror(errno)>", code EP_ERR_GENERIC. errno is
 * kept. Returns -1. */
int ep_err_errno(ep_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the record (EP_ERR_NONE, empty message). */
void ep_err_clear(ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
