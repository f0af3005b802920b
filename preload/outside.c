/* Device memory the drop-in does not serve from its allocators: what it forwards to the
 * driver (cuda mode) or, on sim, serves from the device's backend directly as the driver
 * would (see preload/README.md, "Memory outside the allocator"). Each such allocation is
 * remembered until its free with the library that asked, and both are reported to the
 * device's allocator (mt_alloc_note_outside), so the split of the device's used bytes
 * names libnccl, libcublas, ... rather than one "not seen" figure.
 *
 * The library is the file name of the module the exported hook returns to. A CUDA runtime
 * in between (a shared libcudart calling our driver hooks through cuGetProcAddress) is
 * looked through: the runtime hooks that forward record their own caller for the thread
 * (mt__preload_outer_push), and a driver hook reached from a runtime with no such record
 * walks the stack to the first module that is neither a runtime nor this library. */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload/hooks_cuda.h"
#include "preload/outside.h"
#include "preload/preload.h"
#include "util/addrmap.h"

/* ---- library names ---- */

#define LIB_MAX      63 /* names kept; more are reported unnamed (the allocator keeps 31) */
#define LIB_NAME_MAX 63
#define RA_CACHE     256 /* return addresses whose module is known, direct-mapped */
#define RT_CACHE     16  /* modules known to be, or not to be, a CUDA runtime */
#define WALK_DEPTH   48  /* frames looked at above a runtime */

/* Invariants (under mu): lib_n <= LIB_MAX; lib_name[1..lib_n] non-empty, distinct, never
 * changed once written (index 0 is "no name"); ra_key[i] != NULL => ra_lib[i] <= lib_n and
 * ra_key[i]'s module is not a CUDA runtime; rt_base[0..rt_n) distinct. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char lib_name[LIB_MAX + 1][LIB_NAME_MAX + 1];
static unsigned lib_n;
static const void *ra_key[RA_CACHE];
static uint8_t ra_lib[RA_CACHE];
static const void *rt_base[RT_CACHE];
static bool rt_is[RT_CACHE];
static unsigned rt_n;

/* The caller recorded by the outermost runtime hook that forwards on this thread. */
static _Thread_local const void *tls_outer;

const void *mt__preload_outer_push(const void *ra)
{
    const void *prev = tls_outer;
    if (prev == NULL)
        tls_outer = ra;
    return prev;
}

void mt__preload_outer_pop(const void *prev)
{
    tls_outer = prev;
}

/* The index of name (interned), 0 for an empty name or a full table. */
static unsigned intern(const char *name)
{
    size_t n = strnlen(name, LIB_NAME_MAX);
    if (n == 0)
        return 0;
    unsigned id = 0;
    pthread_mutex_lock(&mu);
    for (unsigned i = 1; i <= lib_n && id == 0; i++)
        if (strncmp(lib_name[i], name, n) == 0 && lib_name[i][n] == '\0')
            id = i;
    if (id == 0 && lib_n < LIB_MAX) {
        id = ++lib_n;
        memcpy(lib_name[id], name, n);
        lib_name[id][n] = '\0';
    }
    pthread_mutex_unlock(&mu);
    return id;
}

/* The file name of the module dladdr found; the main program's is its executable's. */
static const char *file_name(const Dl_info *di)
{
    const char *path = di->dli_fname != NULL ? di->dli_fname : "";
    const char *s = strrchr(path, '/');
    path = s != NULL ? s + 1 : path;
    return path[0] != '\0' ? path : program_invocation_short_name;
}

/* Whether the module di describes is a CUDA runtime: it defines cudaRuntimeGetVersion
 * itself (a dependency's definition does not count). The main program never is one to
 * us: a runtime linked into it is its own code. */
static bool is_runtime(const Dl_info *di)
{
    pthread_mutex_lock(&mu);
    for (unsigned i = 0; i < rt_n; i++)
        if (rt_base[i] == di->dli_fbase) {
            bool r = rt_is[i];
            pthread_mutex_unlock(&mu);
            return r;
        }
    pthread_mutex_unlock(&mu);
    bool r = false;
    void *h = di->dli_fname != NULL && di->dli_fname[0] != '\0'
                  ? dlopen(di->dli_fname, RTLD_LAZY | RTLD_NOLOAD)
                  : NULL;
    if (h != NULL) {
        void *f = mt__preload_real_dlsym(h, "cudaRuntimeGetVersion");
        Dl_info fi;
        r = f != NULL && dladdr(f, &fi) != 0 && fi.dli_fbase == di->dli_fbase;
        dlclose(h);
    }
    pthread_mutex_lock(&mu);
    if (rt_n < RT_CACHE) {
        rt_base[rt_n] = di->dli_fbase;
        rt_is[rt_n++] = r;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* The module of this library, skipped by the walk. */
static const void *self_base(void)
{
    Dl_info di;
    return dladdr((const void *)self_base, &di) != 0 ? di.dli_fbase : NULL;
}

/* Above a runtime that called a driver hook on its own account: the first frame in a
 * module that is neither a runtime nor this library; else the runtime itself. */
static unsigned above_runtime(const Dl_info *rt)
{
    void *frames[WALK_DEPTH];
    int n = backtrace(frames, WALK_DEPTH);
    const void *self = self_base();
    for (int i = 1; i < n; i++) {
        Dl_info di;
        if (dladdr((const char *)frames[i] - 1, &di) == 0 || di.dli_fbase == self ||
            di.dli_fbase == rt->dli_fbase || is_runtime(&di))
            continue;
        return intern(file_name(&di));
    }
    return intern(file_name(rt));
}

/* The library index of the module that ra (a return address) lies in. Costs a dladdr the
 * first time per address (and a stack walk each time a runtime is the caller); only the
 * forwarded paths ask. */
static unsigned lib_of(const void *ra)
{
    if (ra == NULL)
        return 0;
    size_t slot = ((uintptr_t)ra >> 2) % RA_CACHE;
    pthread_mutex_lock(&mu);
    if (ra_key[slot] == ra) {
        unsigned id = ra_lib[slot];
        pthread_mutex_unlock(&mu);
        return id;
    }
    pthread_mutex_unlock(&mu);
    /* dladdr takes the loader's lock: never under mu, which a hook called from a
     * library's constructor (loader lock held) may need. */
    Dl_info di;
    if (dladdr((const char *)ra - 1, &di) == 0)
        return 0;
    if (is_runtime(&di))
        return above_runtime(&di); /* depends on the stack, not on ra: not cached */
    unsigned id = intern(file_name(&di));
    pthread_mutex_lock(&mu);
    ra_key[slot] = ra;
    ra_lib[slot] = (uint8_t)id;
    pthread_mutex_unlock(&mu);
    return id;
}

/* ---- forwarded allocations ---- */

/* A record packs size (bits 0..47), device (48..57) and library index (58..63). */
#define REC_SIZE_BITS 48
#define REC_DEV_BITS  10
_Static_assert(MT_PRELOAD_MAX_DEVICES <= 1 << REC_DEV_BITS, "a device ordinal fits its bits");
_Static_assert(LIB_MAX < 1 << (64 - REC_SIZE_BITS - REC_DEV_BITS), "a library index fits");

/* Invariants (under mu): every key of ptrs (device addresses) and handles (cuMemCreate
 * handles) is an allocation forwarded, or served on sim, and reported to its device's
 * allocator as MT_EV_OUTSIDE_ALLOC, not yet freed; its value packs what was reported. */
static mt__amap_t ptrs, handles;

static uint64_t pack(const mt__preload_fwd_t *r)
{
    return r->size | (uint64_t)r->device << REC_SIZE_BITS |
           (uint64_t)r->lib << (REC_SIZE_BITS + REC_DEV_BITS);
}

static mt__preload_fwd_t unpack(uint64_t v)
{
    return (mt__preload_fwd_t){
        .size = v & ((UINT64_C(1) << REC_SIZE_BITS) - 1),
        .device = (int)(v >> REC_SIZE_BITS & ((1u << REC_DEV_BITS) - 1)),
        .lib = (unsigned)(v >> (REC_SIZE_BITS + REC_DEV_BITS)),
    };
}

/* The allocator that reports device d's outside memory: the device's own when it exists;
 * else made now, but only on sim or when d's primary context is current (making it under
 * another context would make a primary context the program never asked for). NULL: the
 * allocation goes unreported, and is not remembered. */
static mt_alloc_t *reporter(int d)
{
    mt_preload_t *P = mt__preload();
    if (d < 0 || d >= P->ndevices)
        return NULL;
    mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
    if (a != NULL)
        return a;
    if (!P->sim && (mt__preload_drv_device() != d || !mt__preload_current_is_primary()))
        return NULL;
    return mt__preload_alloc(d, &a) == 0 ? a : NULL;
}

static void note(mt_alloc_t *a, bool freed, uint64_t key, const mt__preload_fwd_t *r)
{
    char name[LIB_NAME_MAX + 1];
    pthread_mutex_lock(&mu);
    memcpy(name, lib_name[r->lib], sizeof name);
    pthread_mutex_unlock(&mu);
    mt__guard_enter();
    (void)mt_alloc_note_outside(a, freed, key, r->size, name);
    mt__guard_leave();
}

void mt__preload_outside_alloc(int device, bool handle, uint64_t key, uint64_t size, const void *ra)
{
    if (key == 0 || size == 0 || size >> REC_SIZE_BITS != 0)
        return;
    mt_alloc_t *a = reporter(device);
    if (a == NULL)
        return;
    if (tls_outer != NULL) /* a runtime hook's caller, the runtime being ra's module */
        ra = tls_outer;
    mt__preload_fwd_t r = {.size = size, .device = device, .lib = lib_of(ra)};
    pthread_mutex_lock(&mu);
    int rc = mt__amap_put(handle ? &handles : &ptrs, key, pack(&r));
    pthread_mutex_unlock(&mu);
    if (rc == 0) /* else (no memory for the table) unreported, so its free is too */
        note(a, false, key, &r);
}

bool mt__preload_outside_take(bool handle, uint64_t key, mt__preload_fwd_t *out)
{
    uint64_t v = 0;
    pthread_mutex_lock(&mu);
    mt__amap_t *m = handle ? &handles : &ptrs;
    bool had = key != 0 && mt__amap_get(m, key, &v) == 0;
    if (had)
        (void)mt__amap_del(m, key);
    pthread_mutex_unlock(&mu);
    if (had)
        *out = unpack(v);
    return had;
}

void mt__preload_outside_untake(bool handle, uint64_t key, const mt__preload_fwd_t *r)
{
    pthread_mutex_lock(&mu);
    (void)mt__amap_put(handle ? &handles : &ptrs, key, pack(r));
    pthread_mutex_unlock(&mu);
}

void mt__preload_outside_freed(uint64_t key, const mt__preload_fwd_t *r)
{
    mt_alloc_t *a = atomic_load_explicit(&mt__preload()->ready[r->device], memory_order_acquire);
    if (a != NULL)
        note(a, true, key, r);
}

void mt__preload_outside_settle(uint64_t key, const mt__preload_fwd_t *r, bool freed)
{
    if (freed)
        mt__preload_outside_freed(key, r);
    else
        mt__preload_outside_untake(false, key, r);
}

/* Takes every record of device d (d < 0: every device) out into a list the caller frees. */
static size_t take_device(mt__amap_t *m, int d, uint64_t **keys, uint64_t **vals)
{
    size_t n = 0;
    *keys = *vals = NULL;
    pthread_mutex_lock(&mu);
    if (m->n > 0) {
        *keys = malloc(m->n * sizeof **keys);
        *vals = malloc(m->n * sizeof **vals);
    }
    for (size_t i = 0; *keys != NULL && *vals != NULL && i < m->cap; i++)
        if (m->keys[i] != 0 && (d < 0 || unpack(m->vals[i]).device == d)) {
            (*keys)[n] = m->keys[i];
            (*vals)[n++] = m->vals[i];
        }
    for (size_t i = 0; i < n; i++)
        (void)mt__amap_del(m, (*keys)[i]);
    pthread_mutex_unlock(&mu);
    return n;
}

void mt__preload_outside_drop(int device, mt_alloc_t *a, mt_backend_t *sim_backend)
{
    for (int h = 0; h < 2; h++) {
        uint64_t *keys, *vals;
        size_t n = take_device(h ? &handles : &ptrs, device, &keys, &vals);
        for (size_t i = 0; i < n; i++) {
            mt__preload_fwd_t r = unpack(vals[i]);
            if (sim_backend != NULL && !h) { /* what the driver's reset would free */
                mt__guard_enter();
                (void)mt_backend_free(sim_backend, (void *)(uintptr_t)keys[i]);
                mt__guard_leave();
            }
            if (a != NULL)
                note(a, true, keys[i], &r);
        }
        free(keys);
        free(vals);
    }
}

void mt__preload_outside_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    /* The parent's addresses mean nothing here; its tables are left as they are. */
    memset(&ptrs, 0, sizeof ptrs);
    memset(&handles, 0, sizeof handles);
}

/* ---- the device a driver allocation is on (cuda mode) ---- */

int mt__preload_ptr_device(uint64_t p, int fallback)
{
    __typeof__(&cuPointerGetAttribute) get = REAL(cuPointerGetAttribute);
    int d = -1;
    if (mt__preload()->sim || get == NULL ||
        get(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)p) != CUDA_SUCCESS || d < 0)
        return fallback;
    return d;
}

/* ---- sim: the driver's part, on the backend ---- */

int mt__preload_outside_sim_malloc(int device, size_t size, void **out)
{
    mt_alloc_t *a = NULL;
    int rc = mt__preload_alloc(device, &a);
    mt__guard_enter();
    if (rc == 0)
        rc = mt_backend_malloc(mt_alloc_backend(a), size, out);
    mt__guard_leave();
    /* As in cuda mode: the driver ran out, so the caches go back and it is asked again. */
    if (rc == MT_ENOMEM && mt__preload_release_cached()) {
        mt__guard_enter();
        rc = mt_backend_malloc(mt_alloc_backend(a), size, out);
        mt__guard_leave();
    }
    return rc;
}

int mt__preload_outside_sim_free(void *p, const mt__preload_fwd_t *r)
{
    mt_preload_t *P = mt__preload();
    mt_alloc_t *a = atomic_load_explicit(&P->ready[r->device], memory_order_acquire);
    if (a == NULL)
        return MT_ENOENT;
    mt_backend_t *b = mt_alloc_backend(a);
    /* After the device's work, stream-ordered frees too: stricter than the driver's order,
     * never weaker. */
    mt__guard_enter();
    int rc = mt_device_synchronize(b);
    if (rc == 0)
        rc = mt_backend_free(b, p);
    mt__guard_leave();
    return rc;
}

int mt__preload_outside_sim_pitch(size_t width, size_t height, size_t depth, const void *ra,
                                  void **out, size_t *pitch)
{
    if (out == NULL || pitch == NULL)
        return MT_EINVAL;
    if (width == 0 || height == 0 || depth == 0) {
        *out = NULL;
        *pitch = 0;
        return MT_EINVAL;
    }
    size_t pt = (width + MT_PRELOAD_PITCH_ALIGN - 1) & ~(size_t)(MT_PRELOAD_PITCH_ALIGN - 1);
    if (pt < width || height > SIZE_MAX / pt || depth > SIZE_MAX / (pt * height))
        return MT_ENOMEM;
    size_t size = pt * height * depth;
    int dev = mt__preload_current_device();
    int rc = mt__preload_outside_sim_malloc(dev, size, out);
    if (rc != 0)
        return rc;
    *pitch = pt;
    mt__preload_outside_alloc(dev, false, (uintptr_t)*out, size, ra);
    return 0;
}
