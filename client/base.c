/*
 * base.c — what every file of libepmoe uses (client_state.h): an error and the
 * mapping of a cluster's ErrorCode to an epmoe_status, the request lists. It calls nothing of
 * client.c, io.c or info.c, so those stand above it.
 */
#include <string.h>

#include "client/client_state.h"

int cl_fail(epmoe_error *err, int code, int remote, const char *fmt, ...)
{
    if (err != NULL) {
        err->code = code;
        err->remote_code = remote;
        EP_FORMAT_ARGS(err->message, sizeof err->message, fmt);
    }
    return code;
}

int cl_map_remote(int remote_code)
{
    switch (remote_code) {
    case EPMOE__ERROR_CODE__ERR_NONE:
        return EPMOE_OK;
    case EPMOE__ERROR_CODE__ERR_BUSY:
        return EPMOE_EBUSY;
    case EPMOE__ERROR_CODE__ERR_NOT_READY:
        return EPMOE_ENOTREADY;
    case EPMOE__ERROR_CODE__ERR_CONFIG_HASH:
        return EPMOE_ESTALE;
    case EPMOE__ERROR_CODE__ERR_TIMEOUT:
        return EPMOE_ETIMEDOUT;
    case EPMOE__ERROR_CODE__ERR_BAD_REQUEST:
        return EPMOE_EINVAL;
    case EPMOE__ERROR_CODE__ERR_NOT_SUPPORTED:
        return EPMOE_ENOTSUP;
    case EPMOE__ERROR_CODE__ERR_REFUSED:
        return EPMOE_EREFUSED;
    default:
        return EPMOE_EFAILED;
    }
}

/* ---- lists (under mu) ---- */

void cl_list_push(struct epmoe_request **head, struct epmoe_request **tail, struct epmoe_request *r)
{
    r->next = NULL;
    r->prev = *tail;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

void cl_list_remove(struct epmoe_request **head, struct epmoe_request **tail,
                    struct epmoe_request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        *head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        *tail = r->prev;
    r->prev = r->next = NULL;
}
