/* This process's bytes on a device, as NVML counts them per compute process
 * (docs/outside.md). libnvidia-ml.so.1 is dlopen'ed on first use, like the driver: a machine
 * without it (or a container whose pids NVML does not see) answers MT_ENOTSUP, and the
 * split of the device's memory then has no "other processes" part. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda_internal.h"

/* nvml.h's types, as its ABI fixes them (nvmlProcessInfo_t of the _v3 call). */
typedef struct nvml_proc_s {
    unsigned int pid;
    unsigned long long used; /* bytes; NVML_VALUE_NOT_AVAILABLE (~0ULL) when not known */
    unsigned int gpu_instance, compute_instance;
} nvml_proc_t;
typedef void *nvml_dev_t;
enum { NVML_OK = 0, NVML_INSUFFICIENT_SIZE = 7 };
#define NVML_PROCS_MAX 4096u

/* Loaded once per process; lib NULL after a failed load (then never tried again). */
static struct {
    void *lib;
    int (*init)(void);
    int (*by_bus)(const char *bus, nvml_dev_t *dev);
    int (*procs)(nvml_dev_t dev, unsigned int *n, nvml_proc_t *out);
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void)
{
    const char *path = getenv("MEMTRACE_LIBNVML");
    void *lib =
        dlopen(path != NULL && *path != '\0' ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return;
    *(void **)&nv.init = dlsym(lib, "nvmlInit_v2");
    *(void **)&nv.by_bus = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&nv.procs = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (nv.init == NULL || nv.by_bus == NULL || nv.procs == NULL || nv.init() != NVML_OK) {
        dlclose(lib);
        memset(&nv, 0, sizeof nv);
        return;
    }
    nv.lib = lib; /* kept for the process's life, as NVML's own state is */
}

int mt__cuda_process_used(mt_backend_t *b, uint64_t *bytes)
{
    cuda_t *c = (cuda_t *)b; /* the cuda backend's object: its ops call this */
    pthread_once(&nv_once, nv_load);
    if (nv.lib == NULL || c->drv.DeviceGetPCIBusId == NULL)
        return MT_ENOTSUP;
    pthread_mutex_lock(&c->mu);
    if (c->nvml_dev == NULL && !c->nvml_tried) {
        c->nvml_tried = true;
        char bus[32];
        nvml_dev_t d = NULL;
        if (c->drv.DeviceGetPCIBusId(bus, (int)sizeof bus, c->dev) == CUDA_SUCCESS &&
            nv.by_bus(bus, &d) == NVML_OK)
            c->nvml_dev = d;
    }
    nvml_dev_t dev = c->nvml_dev;
    pthread_mutex_unlock(&c->mu);
    if (dev == NULL)
        return MT_ENOTSUP;
    unsigned int n = 64;
    nvml_proc_t *v = NULL;
    int rc = MT_ENOTSUP;
    for (;;) {
        nvml_proc_t *nvv = realloc(v, n * sizeof *v);
        if (nvv == NULL) {
            rc = MT_ENOMEM;
            break;
        }
        v = nvv;
        unsigned int got = n;
        int r = nv.procs(dev, &got, v);
        if (r == NVML_INSUFFICIENT_SIZE && got > n && got <= NVML_PROCS_MAX) {
            n = got; /* more processes than room: ask again with what NVML said */
            continue;
        }
        if (r != NVML_OK)
            break;
        unsigned int self = (unsigned int)getpid();
        for (unsigned int i = 0; i < got && i < n; i++)
            if (v[i].pid == self && v[i].used != ~0ULL) {
                *bytes = v[i].used;
                rc = 0;
                break;
            }
        break;
    }
    free(v);
    return rc;
}
