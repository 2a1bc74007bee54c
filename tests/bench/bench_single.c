/*
 * bench_single.c — one request at a time through libepmoe, timed in C: the C side of
 * tests/bench/bench_python.py (docs/performance.md "Python over libepmoe").
 *
 * A module (libbench_single.so) that bench_python.py loads beside the epmoe package, so that
 * the C loop and the Python loop run in one process, on one epmoe_client (the same sockets,
 * entry and I/O thread), interleaved in short chunks: the load of a shared machine drifts by
 * more than the difference being measured between two runs of a few hundred milliseconds.
 *
 * bench_single_loop makes n calls of a (epmoe_submit, epmoe_wait, epmoe_request_free, the
 * outputs into the caller's buffers) one after another and stores each call's wall-clock
 * time, from before epmoe_submit to after epmoe_request_free, in us[i] (microseconds).
 * Returns EPMOE_OK or the first failure's status.
 */
#include <epmoe.h>
#include <time.h>

int bench_single_loop(epmoe_client *c, const epmoe_submit_args *a, int n, double *us);

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

__attribute__((visibility("default"))) int
bench_single_loop(epmoe_client *c, const epmoe_submit_args *a, int n, double *us)
{
    for (int i = 0; i < n; i++) {
        epmoe_request *r = NULL;
        double t0 = now_us();
        int rc = epmoe_submit(c, a, &r, NULL);
        if (rc == EPMOE_OK)
            rc = epmoe_wait(r, -1, NULL);
        epmoe_request_free(&r);
        us[i] = now_us() - t0;
        if (rc != EPMOE_OK)
            return rc;
    }
    return EPMOE_OK;
}
