/*
 * cuda_module.c — the CUDA module loader (cudev_cuda_ops, cudev_set_device, cudev_stream_query
 * in cuda_dev.h).
 *
 * The device half of the CUDA backend (cuda_dev.cu and the kernels) is a shared module,
 * libepmoe_cuda.so, that links cudart and cuBLASLt; epmoectl, epmoe-worker and the tests link
 * only this loader. It opens the module at the first cuda:N request (dlopen, as
 * worker/transport_nccl.c opens NCCL), so one set of binaries runs on every host: a CPU worker
 * or the CLI never loads CUDA (start-up time, memory), and a host without CUDA 13 runs them
 * instead of failing to start them, while a cuda:N request there fails with an error naming
 * the library that is missing.
 *
 * Where: the file the first caller names (mb_cuda_tuning.module, which a program's main fills
 * from $EPMOE_CUDA_MODULE) when it names one, else CUDEV_MODULE_FILE through the loader's
 * search: the binaries' RUNPATH ($ORIGIN/../lib/epmoe when installed, the module's build folder
 * in a build tree), LD_LIBRARY_PATH, the system's library folders.
 */
#include "kernels/cuda/cuda_dev.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef EPMOE_CUDA_BUILD

#include <dlfcn.h>
#include <pthread.h>

static pthread_mutex_t cum_mu = PTHREAD_MUTEX_INITIALIZER;
static bool cum_tried;              /* loaded once: the first caller's file holds */
static const cudev_module *cum_mod; /* NULL: cum_why says why */
static char cum_why[EP_ERR_MSG_MAX];

/* A module built from this header: every table the size this build expects. */
static int cum_check(const cudev_module *m, const char *file)
{
    if (m && m->size == sizeof(cudev_module) && m->ops_size == sizeof(cudev_ops) &&
        m->rt_size == sizeof(cudev_rt) && m->ops && m->rt)
        return 0;
    snprintf(cum_why, sizeof cum_why,
             "%s is not this version's CUDA module (its tables have another shape); install the "
             "module built with these binaries",
             file);
    return -1;
}

static void cum_load(const char *file)
{
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(cum_why, sizeof cum_why,
                 "a cuda device needs epmoe's CUDA module, and %s cannot be loaded (%s); install "
                 "it with CUDA 13 (cudart, cuBLASLt) or set EPMOE_CUDA_MODULE",
                 file, e ? e : "not found");
        return;
    }
    void *sym = dlsym(lib, CUDEV_MODULE_ENTRY);
    cudev_module_fn entry = NULL;
    /* object pointer -> function pointer through memcpy: dlsym's documented use, ISO-clean */
    memcpy(&entry, &sym, sizeof entry);
    if (entry == NULL) {
        snprintf(cum_why, sizeof cum_why, "%s has no %s: not epmoe's CUDA module", file,
                 CUDEV_MODULE_ENTRY);
        dlclose(lib);
        return;
    }
    const cudev_module *m = entry();
    if (cum_check(m, file) < 0) {
        dlclose(lib);
        return;
    }
    cum_mod = m; /* never closed: its kernels stay registered for the process's life */
}

static const cudev_module *cum_get(const char *file, ep_err *err)
{
    pthread_mutex_lock(&cum_mu);
    if (!cum_tried)
        cum_load(file && file[0] ? file : CUDEV_MODULE_FILE);
    cum_tried = true;
    pthread_mutex_unlock(&cum_mu);
    if (cum_mod == NULL)
        ep_err_set(err, "%s", cum_why);
    return cum_mod;
}

#else /* a build without CUDA: there is no module to load */

static const cudev_module *cum_get(const char *file, ep_err *err)
{
    ep_err_set(err, "this build of epmoe has no CUDA support (rebuild with the CUDA toolkit "
                    "installed, EPMOE_CUDA=ON)");
    return NULL;
}

#endif

const cudev_ops *cudev_cuda_ops(const char *file, ep_err *err)
{
    const cudev_module *m = cum_get(file, err);
    return m ? m->ops : NULL;
}

int cudev_set_device(int ordinal, ep_err *err)
{
    const cudev_module *m = cum_get(NULL, err);
    return m ? m->rt->set_device(ordinal, err) : -1;
}

int cudev_stream_query(void *stream, ep_err *err)
{
    const cudev_module *m = cum_get(NULL, err);
    return m ? m->rt->stream_query(stream, err) : -1;
}
