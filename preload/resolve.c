/* The preload library's symbol resolution (preload.h): the real runtime (after ours in
 * the lookup order, or loaded where RTLD_NEXT cannot see it), the real driver, and our
 * dlsym interposition. */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload/preload.h"

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym_fn(void)
{
    /* dlvsym is not interposed, so this never reaches our own dlsym. glibc >= 2.34
     * exports dlsym@GLIBC_2.34 from libc; older ones dlsym@GLIBC_2.2.5 from libdl. */
    static _Atomic(dlsym_fn) real; /* a cache of a constant, safe to race on */
    dlsym_fn f = atomic_load_explicit(&real, memory_order_relaxed);
    if (f == NULL) {
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (f == NULL)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        atomic_store_explicit(&real, f, memory_order_relaxed);
    }
    return f;
}

void *mt__preload_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = real_dlsym_fn();
    return f ? f(handle, name) : NULL;
}

/* The path of the object holding addr, or NULL. */
static const char *object_of(const void *addr)
{
    Dl_info di;
    return dladdr(addr, &di) != 0 ? di.dli_fname : NULL;
}

/* A CUDA runtime loaded where RTLD_NEXT cannot see it: by a plugin or by ctypes, both
 * RTLD_LOCAL. Found among the loaded objects as the first one that itself defines
 * cudaRuntimeGetVersion (a handle search also covers an object's dependencies, so a
 * plugin linked to the runtime would answer too: the definition's object decides).
 * The handle is kept open: pointers into the runtime are cached at every call site, so
 * it must not be unloaded under them. */
static struct {
    pthread_mutex_t mu;         /* serialises scans */
    _Atomic(void *) handle;     /* the runtime found, or NULL */
    char path[4096];            /* its path, valid once handle is set */
    unsigned long long scanned; /* dlpi_adds at the last scan that found none */
    bool warned;                /* the no-runtime warning was given (under mu) */
} local_rt = {.mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct rt_names_s {
    char **names; /* strdup'ed paths of the loaded objects, load order */
    size_t n, cap;
    unsigned long long adds; /* objects ever loaded (glibc's dlpi_adds) */
} rt_names_t;

static int collect_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    rt_names_t *l = arg;
    (void)size;
    l->adds = info->dlpi_adds;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') /* the program, the vDSO */
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **names = realloc(l->names, cap * sizeof *names);
        if (names == NULL)
            return 1;
        l->names = names;
        l->cap = cap;
    }
    if ((l->names[l->n] = strdup(info->dlpi_name)) != NULL)
        l->n++;
    return 0;
}

static int count_objects(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    *(unsigned long long *)arg = info->dlpi_adds;
    return 1;
}

/* Opens the loaded object path if it defines the runtime itself; NULL otherwise. */
static void *open_if_runtime(const char *path, const char *self)
{
    if (self != NULL && strcmp(path, self) == 0)
        return NULL;
    void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL)
        return NULL;
    void *marker = mt__preload_real_dlsym(h, "cudaRuntimeGetVersion");
    const char *owner = marker ? object_of(marker) : NULL;
    if (owner != NULL && strcmp(owner, path) == 0)
        return h;
    dlclose(h);
    return NULL;
}

/* The runtime's handle, scanning the loaded objects (not inside dl_iterate_phdr, whose
 * lock dlopen must not take under it) when none was found and objects were added since
 * the last scan. */
static void *local_runtime(void)
{
    void *h = atomic_load_explicit(&local_rt.handle, memory_order_acquire);
    if (h != NULL)
        return h;
    unsigned long long adds = 0;
    dl_iterate_phdr(count_objects, &adds);
    pthread_mutex_lock(&local_rt.mu);
    h = atomic_load_explicit(&local_rt.handle, memory_order_relaxed);
    if (h == NULL && adds != local_rt.scanned) {
        rt_names_t l = {0};
        dl_iterate_phdr(collect_object, &l);
        const char *self = object_of((const void *)&mt__preload_real_rt);
        for (size_t i = 0; i < l.n && h == NULL; i++)
            if ((h = open_if_runtime(l.names[i], self)) != NULL)
                snprintf(local_rt.path, sizeof local_rt.path, "%s", l.names[i]);
        for (size_t i = 0; i < l.n; i++)
            free(l.names[i]);
        free(l.names);
        local_rt.scanned = l.adds;
        if (h != NULL) {
            atomic_store_explicit(&local_rt.handle, h, memory_order_release);
            mt__preload_say(MT_LOG_DEBUG, "cuda runtime: %s, in a local scope", local_rt.path);
        }
    }
    pthread_mutex_unlock(&local_rt.mu);
    return h;
}

void *mt__preload_real_rt(const char *name)
{
    void *f = mt__preload_real_dlsym(RTLD_NEXT, name);
    if (f != NULL)
        return f;
    void *h = local_runtime();
    if (h == NULL) {
        pthread_mutex_lock(&local_rt.mu);
        bool say = !local_rt.warned;
        local_rt.warned = true;
        pthread_mutex_unlock(&local_rt.mu);
        if (say)
            mt__preload_say(
                MT_LOG_WARN,
                "cuda mode: %s: no CUDA runtime found among the loaded "
                "libraries; runtime calls memtrace forwards answer cudaErrorInsufficientDriver",
                name);
        return NULL;
    }
    /* Only the runtime's own definition: never one of ours, nor a dependency's. */
    f = mt__preload_real_dlsym(h, name);
    const char *owner = f ? object_of(f) : NULL;
    return owner != NULL && strcmp(owner, local_rt.path) == 0 ? f : NULL;
}

void *mt__preload_real_drv(const char *name)
{
    mt_preload_t *P = mt__preload();
    return P->libcuda ? mt__preload_real_dlsym(P->libcuda, name) : NULL;
}

/* Interposed dlsym: a program (or the CUDA runtime) looking up a hooked name gets our
 * function. Caveat, documented in the README: dlsym(RTLD_NEXT, ...) issued by another
 * library is resolved relative to this library rather than the caller. */
MT_HOOK void *dlsym(void *handle, const char *name)
{
    void *r = mt__preload_real_dlsym(handle, name);
    if (r == NULL || mt__preload_guard > 0)
        return r;
    void *ours = mt__preload_hook_by_name(name);
    return ours ? ours : r;
}
