/*
 * metrics_http.c — GET /metrics over HTTP with libmicrohttpd (see metrics.h).
 *
 * One internal polling thread (MHD_USE_INTERNAL_POLLING_THREAD) answers scrapes: GET /metrics
 * renders the registry (200, text/plain; version=0.0.4), any other path is 404, any other
 * method 405. Connections are limited and time out, so a slow or hostile client cannot pin the
 * thread or the memory. The daemons block their signals before this thread starts (they take
 * them through a signalfd), so it inherits that mask.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "common/metrics.h"

/* Scrapes served at once, and how long an idle connection may stay. */
#define MX_HTTP_CONNECTIONS 16
#define MX_HTTP_TIMEOUT_S   10

struct mx_http {
    struct MHD_Daemon *d;
    mx_registry *reg;
    int port;
};

static enum MHD_Result mx_answer(struct MHD_Connection *c, unsigned status, const char *type,
                                 char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (r == NULL) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result mx_handle(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls)
{
    mx_http *h = cls;
    (void)version;
    (void)upload;
    static const char *const text = "text/plain; charset=utf-8";
    if (*con_cls == NULL) { /* the first call only announces the request */
        *con_cls = h;
        return MHD_YES;
    }
    if (*upload_size != 0) { /* a body is read and ignored; the answer follows */
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        static char msg[] = "only GET /metrics\n";
        return mx_answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, msg, sizeof msg - 1,
                         MHD_RESPMEM_PERSISTENT);
    }
    if (strcmp(url, "/metrics") != 0) {
        static char msg[] = "not found: the metrics are at /metrics\n";
        return mx_answer(c, MHD_HTTP_NOT_FOUND, text, msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
    }
    size_t len = 0;
    char *body = mx_render(h->reg, &len);
    if (body == NULL) {
        static char msg[] = "out of memory\n";
        return mx_answer(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, msg, sizeof msg - 1,
                         MHD_RESPMEM_PERSISTENT);
    }
    return mx_answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
                     MHD_RESPMEM_MUST_FREE);
}

/* HOST:PORT -> an IPv4 socket address. */
static int mx_parse_addr(const char *addr, struct sockaddr_in *sa, ep_err *err)
{
    const char *colon = strrchr(addr, ':');
    char host[256];
    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= sizeof host)
        return ep_err_set(err, "metrics address \"%s\": expected HOST:PORT", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || port < 0 || port > 65535)
        return ep_err_set(err, "metrics address \"%s\": bad port", addr);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1)
        return 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || res == NULL)
        return ep_err_set(err, "metrics address \"%s\": cannot resolve %s: %s", addr, host,
                          gai_strerror(rc));
    sa->sin_addr = ((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 0;
}

mx_http *mx_http_start(mx_registry *r, const char *addr, ep_err *err)
{
    struct sockaddr_in sa;
    if (mx_parse_addr(addr, &sa, err) != 0)
        return NULL;
    mx_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        ep_err_set(err, "metrics: out of memory");
        return NULL;
    }
    h->reg = r;
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, ntohs(sa.sin_port), NULL, NULL,
                            mx_handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MX_HTTP_CONNECTIONS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)MX_HTTP_TIMEOUT_S,
                            MHD_OPTION_END);
    if (h->d == NULL) {
        free(h);
        ep_err_set(err,
                   "metrics: cannot serve HTTP on %s (address in use, or not an address of "
                   "this host?)",
                   addr);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : ntohs(sa.sin_port);
    return h;
}

int mx_http_port(const mx_http *h)
{
    return h ? h->port : 0;
}

void mx_http_stop(mx_http **self_p)
{
    mx_http *h = self_p ? *self_p : NULL;
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d);
    free(h);
    *self_p = NULL;
}
