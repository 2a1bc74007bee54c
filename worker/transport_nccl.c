/*
 * transport_nccl.c — NCCL under the collective plane (tpc_nccl_ops, see transport_comm_lib.h).
 *
 * Every communicator is non-blocking (ncclConfig_t.blocking = 0): init, shrink and
 * ncclGroupEnd return at once (ncclInProgress) and ncclCommGetAsyncError tells when they are
 * done or broken, so transport_comm.c can hold every wait to a deadline. Transfers run on the
 * executor's CUDA stream; completion is that stream draining (cudaStreamQuery).
 *
 * libnccl is opened at run time (dlopen, as vLLM's pynccl does), not linked: one worker binary
 * serves CPU and ZeroMQ-plane GPU workers on hosts without NCCL, and a host asked for
 * data_plane nccl without it gets an error naming the library instead of a binary that does not
 * start. EPMOE_NCCL_LIBRARY names another file (main hands it to tpc_nccl_set_library). Built
 * only with NCCL's header (EPMOE_HAVE_NCCL); otherwise tpc_nccl_ops() is NULL and
 * tpc_nccl_why() says so.
 */
#include "worker/transport_comm_lib.h"

#ifdef EPMOE_HAVE_NCCL

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_dev.h"

/* The NCCL entry points this file calls, resolved from the library (types from nccl.h). */
static struct {
    __typeof__(&ncclGetErrorString) get_error_string;
    __typeof__(&ncclGetLastError) get_last_error;
    __typeof__(&ncclGetUniqueId) get_unique_id;
    __typeof__(&ncclCommInitRankConfig) init_rank_config;
    __typeof__(&ncclCommGetAsyncError) get_async_error;
    __typeof__(&ncclCommAbort) abort;
    __typeof__(&ncclGroupStart) group_start;
    __typeof__(&ncclGroupEnd) group_end;
    __typeof__(&ncclSend) send;
    __typeof__(&ncclRecv) recv;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    __typeof__(&ncclCommShrink) shrink; /* NULL in an NCCL older than 2.27 */
#endif
} nl;
static pthread_once_t tpn_once = PTHREAD_ONCE_INIT;
static char tpn_why[512]; /* empty once loaded */
static char tpn_file[512] = "libnccl.so.2";

void tpc_nccl_set_library(const char *file)
{
    snprintf(tpn_file, sizeof tpn_file, "%s", file && file[0] ? file : "libnccl.so.2");
}

static void *tpn_sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (f == NULL && tpn_why[0] == '\0')
        snprintf(tpn_why, sizeof tpn_why, "%s has no %s (NCCL older than this build's %d.%d)",
                 tpn_file, name, NCCL_MAJOR, NCCL_MINOR);
    return f;
}

static void tpn_load(void)
{
    const char *file = tpn_file;
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(tpn_why, sizeof tpn_why,
                 "data_plane nccl needs NCCL, and %s cannot be loaded (%s); install NCCL or set "
                 "EPMOE_NCCL_LIBRARY",
                 file, e ? e : "not found");
        return;
    }
    /* object pointer -> function pointer through memcpy: dlsym's documented use, ISO-clean */
#define TPN_SYM(field, name)                                                                       \
    do {                                                                                           \
        void *f_ = tpn_sym(lib, name);                                                             \
        memcpy(&nl.field, &f_, sizeof nl.field);                                                   \
    } while (0)
    TPN_SYM(get_error_string, "ncclGetErrorString");
    TPN_SYM(get_last_error, "ncclGetLastError");
    TPN_SYM(get_unique_id, "ncclGetUniqueId");
    TPN_SYM(init_rank_config, "ncclCommInitRankConfig");
    TPN_SYM(get_async_error, "ncclCommGetAsyncError");
    TPN_SYM(abort, "ncclCommAbort");
    TPN_SYM(group_start, "ncclGroupStart");
    TPN_SYM(group_end, "ncclGroupEnd");
    TPN_SYM(send, "ncclSend");
    TPN_SYM(recv, "ncclRecv");
    bool required_ok = tpn_why[0] == '\0';
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    void *f = dlsym(lib, "ncclCommShrink"); /* optional: without it a shrink is a rebuild */
    memcpy(&nl.shrink, &f, sizeof nl.shrink);
#endif
#undef TPN_SYM
    if (!required_ok) {
        dlclose(lib);
        memset(&nl, 0, sizeof nl);
    }
}

_Static_assert(sizeof(ncclUniqueId) == TPC_ID_BYTES, "TPC_ID_BYTES is NCCL_UNIQUE_ID_BYTES");

/* tpc_handle is ncclComm_t's struct: the handle is the ncclComm_t itself. */
static ncclComm_t tpn_comm(tpc_handle *h)
{
    return (ncclComm_t)(void *)h;
}

static int tpn_check(ncclResult_t r, ncclComm_t comm, const char *what, ep_err *err)
{
    if (r == ncclSuccess || r == ncclInProgress)
        return 0;
    const char *last = comm ? nl.get_last_error(comm) : NULL;
    return ep_err_set(err, "%s: %s%s%s", what, nl.get_error_string(r), last && last[0] ? ": " : "",
                      last ? last : "");
}

/* NCCL binds a communicator to the calling thread's current device: make it the worker's
 * (ctx: the CUDA ordinal, an int, or NULL to leave the current device). */
static int tpn_device(void *ctx, ep_err *err)
{
    if (ctx == NULL)
        return 0;
    /* through the CUDA module (cuda_dev.h): the worker binary links no CUDA library */
    if (cudev_set_device(*(const int *)ctx, err) == 0)
        return 0;
    return ep_err_prefix(err, "device %d", *(const int *)ctx);
}

static ncclConfig_t tpn_config(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every call returns at once; we poll with a deadline */
    return cfg;
}

static int tpn_unique_id(void *ctx, tpc_id *id, ep_err *err)
{
    ncclUniqueId u;
    if (tpn_device(ctx, err) != 0 ||
        tpn_check(nl.get_unique_id(&u), NULL, "ncclGetUniqueId", err) != 0)
        return -1;
    memcpy(id->bytes, u.internal, sizeof id->bytes);
    return 0;
}

static int tpn_init(void *ctx, int nranks, const tpc_id *id, int rank, tpc_handle **out,
                    ep_err *err)
{
    ncclUniqueId u;
    if (tpn_device(ctx, err) != 0)
        return -1;
    memcpy(u.internal, id->bytes, sizeof u.internal);
    ncclConfig_t cfg = tpn_config();
    ncclComm_t comm = NULL;
    ncclResult_t r = nl.init_rank_config(&comm, nranks, u, rank, &cfg);
    if (tpn_check(r, comm, "ncclCommInitRankConfig", err) != 0) {
        if (comm)
            nl.abort(comm);
        return -1;
    }
    *out = (tpc_handle *)(void *)comm;
    return 0;
}

static int tpn_shrink(void *ctx, tpc_handle *h, const int *exclude, int n_exclude, tpc_handle **out,
                      ep_err *err)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    if (tpn_device(ctx, err) != 0)
        return -1;
    if (nl.shrink == NULL)
        return ep_err_set(err, "the NCCL loaded at run time has no ncclCommShrink (2.27 or later)");
    ncclComm_t parent = tpn_comm(h), comm = NULL;
    ncclResult_t async = ncclSuccess;
    nl.get_async_error(parent, &async);
    /* a parent that saw a peer fail has operations to terminate before it can shrink */
    int flags = async == ncclSuccess ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT;
    ncclConfig_t cfg = tpn_config();
    ncclResult_t r = nl.shrink(parent, (int *)exclude, n_exclude, &comm, &cfg, flags);
    if (tpn_check(r, parent, "ncclCommShrink", err) != 0) {
        if (comm)
            nl.abort(comm);
        return -1;
    }
    *out = (tpc_handle *)(void *)comm;
    return 0;
#else
    (void)ctx;
    (void)h;
    (void)exclude;
    (void)n_exclude;
    (void)out;
    return ep_err_set(err, "ncclCommShrink needs NCCL 2.27 or later (built with %d.%d)", NCCL_MAJOR,
                      NCCL_MINOR);
#endif
}

static int tpn_status(tpc_handle *h, ep_err *err)
{
    ncclComm_t comm = tpn_comm(h);
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = nl.get_async_error(comm, &async);
    if (r != ncclSuccess)
        return tpn_check(r, comm, "ncclCommGetAsyncError", err) == 0 ? 1 : -1;
    if (async == ncclInProgress)
        return 1;
    return tpn_check(async, comm, "NCCL", err);
}

static int tpn_exchange(tpc_handle *h, const tpc_xfer *sends, int n_sends, const tpc_xfer *recvs,
                        int n_recvs, void *stream, ep_err *err)
{
    ncclComm_t comm = tpn_comm(h);
    cudaStream_t s = (cudaStream_t)stream;
    if (tpn_check(nl.group_start(), comm, "ncclGroupStart", err) != 0)
        return -1;
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n_sends && r == ncclSuccess; i++)
        r = nl.send(sends[i].ptr, sends[i].bytes, ncclUint8, sends[i].peer, comm, s);
    for (int i = 0; i < n_recvs && r == ncclSuccess; i++)
        r = nl.recv(recvs[i].ptr, recvs[i].bytes, ncclUint8, recvs[i].peer, comm, s);
    /* the group must be closed even when a call in it failed */
    ncclResult_t end = nl.group_end();
    if (tpn_check(r, comm, "ncclSend/ncclRecv", err) != 0)
        return -1;
    return tpn_check(end, comm, "ncclGroupEnd", err);
}

static int tpn_stream_query(void *ctx, void *stream, ep_err *err)
{
    (void)ctx;
    return cudev_stream_query(stream, err);
}

static void tpn_abort(tpc_handle *h)
{
    if (h)
        nl.abort(tpn_comm(h));
}

static const tpc_ops tpn_ops = {.name = "nccl",
                                .unique_id = tpn_unique_id,
                                .init = tpn_init,
                                .shrink = tpn_shrink,
                                .status = tpn_status,
                                .exchange = tpn_exchange,
                                .stream_query = tpn_stream_query,
                                .abort = tpn_abort};

const tpc_ops *tpc_nccl_ops(void)
{
    pthread_once(&tpn_once, tpn_load);
    return tpn_why[0] == '\0' ? &tpn_ops : NULL;
}

const char *tpc_nccl_why(void)
{
    pthread_once(&tpn_once, tpn_load);
    return tpn_why[0] != '\0' ? tpn_why : NULL;
}

#else

void tpc_nccl_set_library(const char *file)
{
    (void)file; /* no NCCL in this build: nothing to open */
}

const tpc_ops *tpc_nccl_ops(void)
{
    return NULL;
}

const char *tpc_nccl_why(void)
{
    return "this build has no NCCL: data_plane nccl is not available";
}

#endif
