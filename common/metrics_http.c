/*
 * metrics_http.c — GET /metrics over HTTP with libmicrohttpd (see metrics.h).
 *
 * One internal polling thread (MHD_USE_INTERNAL_POLLING_THREAD) answers scrapes: GET /metrics
 * renders the registry (200, text/plain; version=0.0.4), any other path is 404, any other
 * method 405. The daemons block their signals before this thread starts (they take them
 * through a signalfd), so it inherits that mask.
 *
 * A stranger must not be able to blind the endpoint (slowloris: half-open requests that send
 * a byte now and then). Three limits together keep a slot for the scraper: at most
 * MX_HTTP_PER_ADDRESS connections from one address, MX_HTTP_CONNECTIONS in all, and a total
 * deadline per connection (MX_HTTP_DEADLINE_S from its accept, whatever it sends: libmicrohttpd's
 * own timeout is an idle one that every byte resets). The deadline is kept by a small reaper
 * thread that shuts down the sockets of connections past it; libmicrohttpd then sees them end
 * and closes them in its own thread (it tells us through NOTIFY_CLOSED before it closes the
 * descriptor, so the reaper never touches a descriptor that was reused).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/metrics.h"

/* Connections at once in all, and from one address: a Prometheus server (or an HA pair)
 * scrapes from one or two addresses with one connection each. */
#define MX_HTTP_CONNECTIONS 64
#define MX_HTTP_PER_ADDRESS 4
/* Idle timeout, and the total time a connection may stay open: a scrape is one request whose
 * answer is rendered at once (Prometheus' own scrape timeout is 10 s). */
#define MX_HTTP_TIMEOUT_S  5
#define MX_HTTP_DEADLINE_S 10
/* How often the reaper looks, ms. */
#define MX_HTTP_REAP_MS 250

typedef struct mx_conn {
    int fd;           /* -1: free slot */
    int64_t start_ms; /* accepted at (monotonic) */
    bool shut;        /* shut down by the reaper once */
} mx_conn;

struct mx_http {
    struct MHD_Daemon *d;
    mx_registry *reg;
    int port;
    pthread_t reaper;
    bool reaper_started;
    pthread_mutex_t mu; /* guards conn, stop */
    pthread_cond_t wake;
    bool stop;
    mx_conn conn[MX_HTTP_CONNECTIONS];
};

/* libmicrohttpd's thread: a connection starts or ends. */
static void mx_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode toe)
{
    mx_http *h = cls;
    (void)socket_context;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return;
    int fd = (int)ci->connect_fd;
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < MX_HTTP_CONNECTIONS; i++) {
        mx_conn *k = &h->conn[i];
        if (toe == MHD_CONNECTION_NOTIFY_STARTED && k->fd < 0) {
            *k = (mx_conn){.fd = fd, .start_ms = clk_mono_ms()};
            break;
        }
        if (toe == MHD_CONNECTION_NOTIFY_CLOSED && k->fd == fd) {
            k->fd = -1;
            break;
        }
    }
    pthread_mutex_unlock(&h->mu);
}

/* The reaper: connections past the deadline are shut down (each once). */
static void *mx_reaper(void *arg)
{
    mx_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        int64_t now = clk_mono_ms();
        for (int i = 0; i < MX_HTTP_CONNECTIONS; i++) {
            mx_conn *k = &h->conn[i];
            if (k->fd >= 0 && !k->shut && now - k->start_ms > MX_HTTP_DEADLINE_S * 1000) {
                shutdown(k->fd, SHUT_RDWR);
                k->shut = true;
            }
        }
        struct timespec until = clk_wall_in_ms(MX_HTTP_REAP_MS);
        pthread_cond_timedwait(&h->wake, &h->mu, &until);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void mx_reaper_stop(mx_http *h)
{
    if (!h->reaper_started)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->wake);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->reaper, NULL);
    h->reaper_started = false;
}

static void mx_http_free(mx_http *h)
{
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->wake);
    free(h);
}

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
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->wake, NULL);
    for (int i = 0; i < MX_HTTP_CONNECTIONS; i++)
        h->conn[i].fd = -1;
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, ntohs(sa.sin_port), NULL, NULL,
                            mx_handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MX_HTTP_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)MX_HTTP_PER_ADDRESS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)MX_HTTP_TIMEOUT_S,
                            MHD_OPTION_NOTIFY_CONNECTION, mx_notify, h, MHD_OPTION_END);
    if (h->d == NULL) {
        mx_http_free(h);
        ep_err_set(err,
                   "metrics: cannot serve HTTP on %s (address in use, or not an address of "
                   "this host?)",
                   addr);
        return NULL;
    }
    if (pthread_create(&h->reaper, NULL, mx_reaper, h) != 0) {
        MHD_stop_daemon(h->d);
        mx_http_free(h);
        ep_err_set(err, "metrics: cannot start the connection reaper thread");
        return NULL;
    }
    h->reaper_started = true;
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
    mx_reaper_stop(h); /* first: it may shut down a socket of the daemon */
    MHD_stop_daemon(h->d);
    mx_http_free(h);
    *self_p = NULL;
}
