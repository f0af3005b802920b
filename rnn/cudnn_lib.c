/* Run-time loading of libcudnn and of the CUDA runtime calls the cudnn path makes (see
 * cudnn_lib.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "rnn/cudnn_internal.h"

typedef struct sym_s {
    const char *name;
    size_t off;
    int lib; /* 0 libcudnn, 1 the runtime */
} sym_t;

static const sym_t syms[] = {
#define MT__DNN_SYM(f) {#f, offsetof(mt__dnn_t, f), 0},
#define MT__RT_SYM(f)  {#f, offsetof(mt__dnn_t, f), 1},
    MT__DNN_FNS(MT__DNN_SYM) MT__CUDART_FNS(MT__RT_SYM)
#undef MT__DNN_SYM
#undef MT__RT_SYM
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static mt__dnn_t table;
static void *libs[2];
static int loaded; /* table holds every symbol (under mu; read after it was set) */

static void *open_lib(const char *env, const char *dflt, char *err, size_t errlen)
{
    const char *path = getenv(env);
    if (path == NULL || *path == '\0')
        path = dflt;
    /* RTLD_LOCAL: cuDNN's symbols must not become candidates for the program's lookups. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        snprintf(err, errlen, "cannot load %s (%s): %s", path, env, dlerror());
    return h;
}

int mt__dnn_open(const mt__dnn_t **out, char *err, size_t errlen)
{
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (!loaded) {
        char dnn[32], rt[32];
        snprintf(dnn, sizeof dnn, "libcudnn.so.%d", CUDNN_MAJOR);
        snprintf(rt, sizeof rt, "libcudart.so.%d", CUDART_VERSION / 1000);
        libs[0] = open_lib("MEMTRACE_LIBCUDNN", dnn, err, errlen);
        libs[1] = libs[0] ? open_lib("MEMTRACE_LIBCUDART", rt, err, errlen) : NULL;
        rc = libs[0] && libs[1] ? 0 : MT_ENODEV;
        for (size_t i = 0; rc == 0 && i < sizeof syms / sizeof syms[0]; i++) {
            void *fn = dlsym(libs[syms[i].lib], syms[i].name);
            if (fn == NULL) {
                snprintf(err, errlen, "%s lacks %s", syms[i].lib ? "the CUDA runtime" : "libcudnn",
                         syms[i].name);
                rc = MT_ENODEV;
            }
            memcpy((char *)&table + syms[i].off, &fn, sizeof fn);
        }
        if (rc != 0) {
            for (int k = 0; k < 2; k++)
                if (libs[k])
                    dlclose(libs[k]);
            memset(libs, 0, sizeof libs);
            memset(&table, 0, sizeof table);
        }
        loaded = rc == 0;
    }
    pthread_mutex_unlock(&mu);
    *out = rc == 0 ? &table : NULL;
    return rc;
}

/* ---- status codes and the device guard ---- */

/* cuDNN 9 groups its status codes by thousands. */
int mt__dnn_status(cudnnStatus_t s)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return 0;
    switch ((int)s / 1000) {
    case 1:
        return MT_ENODEV; /* not initialised: no driver or device */
    case 2:
        return MT_EINVAL;
    case 3:
        return MT_ENOTSUP;
    default:
        if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
            s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
            return MT_ENOMEM;
        return MT_EIO;
    }
}

/* Maps s, logging the failing call once when it failed. */
int mt__dnn_check(const mt_rnn_t *m, cudnnStatus_t s, const char *what)
{
    int rc = mt__dnn_status(s);
    if (rc) {
        /* cuDNN 9 says why in its per-thread last-error text: the status alone rarely does. */
        char why[512] = "";
        mt__dnn->cudnnGetLastErrorString(why, sizeof why);
        plog(m, MT_LOG_ERROR, "rnn: cudnn: %s failed: %s (%d)%s%s", what,
             mt__dnn->cudnnGetErrorString(s), (int)s, why[0] ? ": " : "", why);
    }
    return rc;
}

int mt__dnn_dev_enter(const mt_rnn_t *m, dev_guard_t *g)
{
    g->switched = false;
    int dev = mt_backend_device(m->backend);
    cudaError_t e = mt__dnn->cudaGetDevice(&g->prev);
    if (e == cudaSuccess && g->prev != dev) {
        e = mt__dnn->cudaSetDevice(dev);
        g->switched = e == cudaSuccess;
    }
    if (e != cudaSuccess) {
        plog(m, MT_LOG_WARN, "rnn: cudnn unavailable: selecting device %d: %s (%d)", dev,
             mt__dnn->cudaGetErrorString(e), (int)e);
        return MT_ENODEV;
    }
    return 0;
}

void mt__dnn_dev_leave(const dev_guard_t *g)
{
    if (g->switched)
        mt__dnn->cudaSetDevice(g->prev);
}
