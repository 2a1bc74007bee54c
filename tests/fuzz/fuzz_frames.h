/*
 * fuzz_frames.h — the network fuzz targets' input format: a message as ZeroMQ frames.
 *
 * Input = records [u16 LE length][that many bytes], one per frame; a length past the end takes
 * the rest. At most FUZZ_MAX_FRAMES frames (more than wire.h accepts, so the count check is
 * reached). fuzz_message builds the wire_msg with wire_recv's checks (wire_msg_from_frames).
 */
#ifndef EPMOE_FUZZ_FRAMES_H
#define EPMOE_FUZZ_FRAMES_H

#include <stdint.h>
#include <stdlib.h>

#include "common/limits.h"
#include "common/wire.h"

#define FUZZ_MAX_FRAMES (4 + WIRE_MAX_PAYLOADS)

static inline int fuzz_frames(const uint8_t *d, size_t n, const uint8_t **f, size_t *l)
{
    int k = 0;
    size_t i = 0;
    while (i + 2 <= n && k < FUZZ_MAX_FRAMES) {
        size_t len = (size_t)d[i] | (size_t)d[i + 1] << 8;
        i += 2;
        if (len > n - i)
            len = n - i;
        f[k] = d + i;
        l[k++] = len;
        i += len;
    }
    return k;
}

/* The message of the input (heap-allocated), or NULL when wire.h refuses its frames (the
 * refusal must say why: a silent one aborts). */
static inline wire_msg *fuzz_message(const uint8_t *d, size_t n)
{
    const uint8_t *f[FUZZ_MAX_FRAMES];
    size_t l[FUZZ_MAX_FRAMES];
    int k = fuzz_frames(d, n, f, l);
    wire_msg *m = malloc(sizeof *m);
    ep_err err = {0};
    if (m == NULL)
        return NULL;
    if (wire_msg_from_frames(m, f, l, k, EP_MAX_CTRL_MSG, EP_MAX_DATA_MSG, &err) != 0) {
        if (err.msg[0] == '\0')
            abort();
        free(m);
        return NULL;
    }
    return m;
}

#endif
