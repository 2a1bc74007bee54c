/*
 * sdnotify.h — systemd readiness, status and watchdog notifications (prefix sdn_).
 *
 * The notify protocol is one datagram to the AF_UNIX socket named by $NOTIFY_SOCKET, so it is
 * implemented here without linking libsystemd: outside systemd (no NOTIFY_SOCKET) every call is
 * a no-op, and the CPU test build needs no systemd at all. Daemons send "READY=1" only when they
 * actually serve, "STATUS=..." on state changes, and "WATCHDOG=1" from their main loop after a
 * liveness check, every half of the interval sdn_watchdog_usec reports (sd_watchdog_enabled).
 */
#ifndef EPMOE_SDNOTIFY_H
#define EPMOE_SDNOTIFY_H

#include <stdint.h>

/* The variables systemd sets, as main read them (common/knobs.h; NULL: unset). */
typedef struct sdn_env {
    const char *notify_socket; /* NOTIFY_SOCKET */
    const char *watchdog_usec; /* WATCHDOG_USEC */
    const char *watchdog_pid;  /* WATCHDOG_PID */
} sdn_env;

/* Take systemd's variables (copied); before it, or with NULL, every call is a no-op. */
void sdn_init(const sdn_env *env);

/* Send a notification (e.g. "READY=1\nSTATUS=serving"). Returns 0, or -1 when NOTIFY_SOCKET is
 * set but the send failed; 0 when not under systemd. */
int sdn_notify(const char *state);
int sdn_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog interval in microseconds when WatchdogSec= is set for this process, else 0. */
uint64_t sdn_watchdog_usec(void);

#endif
