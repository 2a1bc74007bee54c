/*
 * test_sdnotify.c — notifications reach a datagram socket the way systemd's does, and are
 * no-ops outside systemd.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/knobs.h"
#include "common/sdnotify.h"
#include "test.h"

/* What a daemon's main does at start-up: read systemd's variables, hand them to sdn_init. */
static void sdn_from_env(void)
{
    knob_values kv;
    ep_err e;
    CHECK_EQ(knob_load(&kv, KNOB_WORKER, &e), 0);
    sdn_init(&(sdn_env){kv.notify_socket, kv.watchdog_usec, kv.watchdog_pid});
}

TEST(notify_reaches_the_socket)
{
    char dir[] = "/tmp/epmoe-sdn-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/notify", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    setenv("NOTIFY_SOCKET", path, 1);
    sdn_from_env();
    CHECK_EQ(sdn_notifyf("READY=1\nSTATUS=%s", "serving"), 0);
    char buf[256] = {0};
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    CHECK_EQ(n, (ssize_t)strlen("READY=1\nSTATUS=serving"));
    CHECK_STR_EQ(buf, "READY=1\nSTATUS=serving");
    close(fd);
    unlink(path);
    rmdir(dir);
    unsetenv("NOTIFY_SOCKET");
    sdn_from_env();
    CHECK_EQ(sdn_notify("READY=1"), 0); /* not under systemd: nothing to do */
}

TEST(watchdog_interval)
{
    unsetenv("WATCHDOG_USEC");
    sdn_from_env();
    CHECK_EQ(sdn_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "2000000", 1);
    sdn_from_env();
    CHECK_EQ(sdn_watchdog_usec(), 2000000);
    setenv("WATCHDOG_PID", "1", 1); /* someone else's watchdog */
    sdn_from_env();
    CHECK_EQ(sdn_watchdog_usec(), 0);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    sdn_from_env();
    CHECK_EQ(sdn_watchdog_usec(), 2000000);
    setenv("WATCHDOG_USEC", "abc", 1);
    sdn_from_env();
    CHECK_EQ(sdn_watchdog_usec(), 0);
}

int main(void)
{
    RUN(notify_reaches_the_socket);
    RUN(watchdog_interval);
    return test_report();
}
