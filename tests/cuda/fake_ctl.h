/* Control functions of the fake driver (fake_libcuda.c), looked up in the very object
 * the cuda backend dlopens through MEMTRACE_LIBCUDA. Shared by the tests of this suite. */
#ifndef MT_TESTS_CUDA_FAKE_CTL_H
#define MT_TESTS_CUDA_FAKE_CTL_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

static struct {
    void *lib;
    void (*reset)(size_t capacity, int devices);
    void (*fail_next)(const char *name, unsigned count, CUresult res);
    void (*hold)(bool on);
    size_t (*ncalls)(void);
    const char *(*call)(size_t i, uint64_t *a, uint64_t *b);
    size_t (*count)(const char *name);
    size_t (*used)(void);
    long (*ctx_depth)(void);
    void (*idle)(void);                            /* waits until every stream's queue ran */
    void *(*shadow)(const void *dptr);             /* host address of a device byte */
    void (*age_events)(uint64_t ns);               /* recorded events move ns into the past */
    bool (*can_access)(int dev, const void *dptr); /* a kernel on dev could touch dptr */
} fk;

static inline int fake_ctl_open(void **state)
{
    (void)state;
    const char *path = getenv("MEMTRACE_LIBCUDA");
    if (path == NULL)
        return -1;
    fk.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (fk.lib == NULL)
        return -1;
    *(void **)&fk.reset = dlsym(fk.lib, "fake_cuda_reset");
    *(void **)&fk.fail_next = dlsym(fk.lib, "fake_cuda_fail");
    *(void **)&fk.hold = dlsym(fk.lib, "fake_cuda_hold");
    *(void **)&fk.ncalls = dlsym(fk.lib, "fake_cuda_ncalls");
    *(void **)&fk.call = dlsym(fk.lib, "fake_cuda_call");
    *(void **)&fk.count = dlsym(fk.lib, "fake_cuda_count");
    *(void **)&fk.used = dlsym(fk.lib, "fake_cuda_used");
    *(void **)&fk.ctx_depth = dlsym(fk.lib, "fake_cuda_ctx_depth");
    *(void **)&fk.idle = dlsym(fk.lib, "fake_cuda_idle");
    *(void **)&fk.shadow = dlsym(fk.lib, "fake_cuda_shadow");
    *(void **)&fk.age_events = dlsym(fk.lib, "fake_cuda_age_events");
    *(void **)&fk.can_access = dlsym(fk.lib, "fake_cuda_can_access");
    return fk.reset && fk.fail_next && fk.hold && fk.ncalls && fk.call && fk.count && fk.used &&
                   fk.ctx_depth && fk.idle && fk.shadow && fk.age_events && fk.can_access
               ? 0
               : -1;
}

static inline int fake_ctl_close(void **state)
{
    (void)state;
    dlclose(fk.lib);
    return 0;
}

/* Index of the first logged call named name at or after from, or SIZE_MAX. */
static inline size_t find_call(const char *name, size_t from, uint64_t *a, uint64_t *b)
{
    for (size_t i = from; i < fk.ncalls(); i++) {
        uint64_t x, y;
        if (strcmp(fk.call(i, &x, &y), name) == 0) {
            if (a)
                *a = x;
            if (b)
                *b = y;
            return i;
        }
    }
    return SIZE_MAX;
}

#endif
