/*
 * transport_comm_lib.h — the communicator library under the collective plane (transport_comm.h):
 * a vtable of non-blocking operations on device buffers (prefix tpc_). NCCL's is in
 * transport_nccl.c; the unit tests run the plane over a fake of threads (tests/unit/fake_comm.h).
 * The plane's state machine drives it; nothing else calls it.
 */
#ifndef EPMOE_TRANSPORT_COMM_LIB_H
#define EPMOE_TRANSPORT_COMM_LIB_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Bytes of a communicator id (NCCL_UNIQUE_ID_BYTES; checked in transport_nccl.c). */
#define TPC_ID_BYTES 128

typedef struct tpc_id {
    uint8_t bytes[TPC_ID_BYTES];
} tpc_id;

typedef struct tpc_handle tpc_handle; /* the library's communicator (ncclComm_t) */

/* One transfer of a grouped exchange: bytes of device memory at ptr, to or from peer. */
typedef struct tpc_xfer {
    int peer;
    void *ptr;
    size_t bytes;
} tpc_xfer;

/* A communicator library. Nothing here blocks; the state machine polls. 0 / -1 with err. */
typedef struct tpc_ops {
    const char *name; /* "nccl" */
    int (*unique_id)(void *ctx, tpc_id *id, ep_err *err);
    /* Start creating the communicator of rank among nranks sharing id (ncclCommInitRankConfig
     * with blocking = 0). */
    int (*init)(void *ctx, int nranks, const tpc_id *id, int rank, tpc_handle **out, ep_err *err);
    /* Start a communicator of parent's ranks but the excluded ones (ncclCommShrink). */
    int (*shrink)(void *ctx, tpc_handle *h, const int *exclude, int n_exclude, tpc_handle **out,
                  ep_err *err);
    /* 0 idle, 1 still working (init, or a group being enqueued), -1 broken (err: why). */
    int (*status)(tpc_handle *h, ep_err *err);
    /* One group of sends and receives, enqueued on stream (sizes match the peers' by contract;
     * transfers of 0 bytes are left out by the caller on both sides). */
    int (*exchange)(tpc_handle *h, const tpc_xfer *sends, int n_sends, const tpc_xfer *recvs,
                    int n_recvs, void *stream, ep_err *err);
    /* 0 when everything enqueued on stream has finished, 1 while pending, -1 on an error. */
    int (*stream_query)(void *ctx, void *stream, ep_err *err);
    /* Stop everything h has in flight and free it (ncclCommAbort); h is invalid afterwards. */
    void (*abort)(tpc_handle *h);
} tpc_ops;

/* NCCL's operations, or NULL in a build without NCCL or where libnccl cannot be loaded (it is
 * opened at the first call). Their ctx is a pointer to the worker's CUDA ordinal (int), made
 * the thread's current device before a communicator is created, or NULL to use the current
 * device. */
const tpc_ops *tpc_nccl_ops(void);
/* The file tpc_nccl_ops opens (EPMOE_NCCL_LIBRARY, which main reads); NULL: libnccl.so.2. It
 * counts only before the first tpc_nccl_ops or tpc_nccl_why: the library is opened once. */
void tpc_nccl_set_library(const char *file);
/* Why tpc_nccl_ops() is NULL (the library and dlerror, or "this build has no NCCL"); NULL when
 * it is not. */
const char *tpc_nccl_why(void);

#endif
