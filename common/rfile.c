/* rfile.c — see rfile.h. */
#include "common/rfile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

FILE *rf_open(const char *path, const char *what, ep_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        ep_err_errno(err, "%s%s%s", path, what ? ": cannot open " : "", what ? what : "");
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        ep_err_set(err, "%s%s%s: not a regular file", path, what ? ": " : "", what ? what : "");
        close(fd);
        return NULL;
    }
    /* a regular file never blocks; clear the flag so reads behave as usual */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        ep_err_errno(err, "%s", path);
        close(fd);
    }
    return f;
}
