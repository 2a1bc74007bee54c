/* sdnotify.c — see sdnotify.h and sd_notify(3). */
#include "common/sdnotify.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* What systemd set (sdn_init): a copy, so the caller's strings need not outlive it. */
static char sdn_socket[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
static bool sdn_socket_bad; /* set, but too long to be a socket path */
static uint64_t sdn_watchdog;

/* WATCHDOG_USEC, when WATCHDOG_PID (if set) names us: the variable may be inherited. */
static uint64_t sdn_watchdog_parse(const char *usec, const char *pid)
{
    if (usec == NULL)
        return 0;
    if (pid != NULL && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    char *end;
    unsigned long long v = strtoull(usec, &end, 10);
    return (*end == '\0' && v > 0) ? (uint64_t)v : 0;
}

void sdn_init(const sdn_env *env)
{
    const char *path = env ? env->notify_socket : NULL;
    sdn_socket[0] = '\0';
    sdn_socket_bad = false;
    if (path != NULL && strlen(path) < sizeof sdn_socket)
        snprintf(sdn_socket, sizeof sdn_socket, "%s", path);
    else if (path != NULL)
        sdn_socket_bad = true;
    sdn_watchdog = env ? sdn_watchdog_parse(env->watchdog_usec, env->watchdog_pid) : 0;
}

int sdn_notify(const char *state)
{
    if (sdn_socket_bad)
        return -1;
    const char *path = sdn_socket;
    if (path[0] == '\0')
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@'))
        return -1;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') /* abstract namespace */
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    ssize_t sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
    close(fd);
    return sent < 0 ? -1 : 0;
}

int sdn_notifyf(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return sdn_notify(buf);
}

uint64_t sdn_watchdog_usec(void)
{
    return sdn_watchdog;
}
