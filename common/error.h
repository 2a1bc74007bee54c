/*
 * error.h — the error record every fallible function fills (prefix ep_err).
 *
 * Contract: functions return 0 on success and -1 on failure (or NULL for constructors) and,
 * on failure, write one human-readable message into the caller's ep_err that names what was
 * wrong and where: file:line:column, tensor name, field, peer, and what was expected. Callers
 * add context outward with ep_err_prefix ("loading shard: " + inner message), like a
 * backtrace read left to right. Only main() and tests exit; library code never does.
 */
#ifndef EPMOE_ERROR_H
#define EPMOE_ERROR_H

#include "common/limits.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ep_err {
    char msg[EP_ERR_MSG_MAX];
} ep_err;

/* Set the message (printf format). Returns -1 so that `return ep_err_set(err, ...)` reads as
 * the failure it is. err may be NULL (the message is dropped). */
int ep_err_set(ep_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepend context to the current message: "ctx: old message". Returns -1. */
int ep_err_prefix(ep_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set the message from errno: "<formatted>: <strerror(errno)>". Returns -1. */
int ep_err_errno(ep_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the record (empty message). */
void ep_err_clear(ep_err *err);

#ifdef __cplusplus
}
#endif

#endif
