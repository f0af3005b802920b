/* The program-facing entry points of the preload library: the calling thread's current
 * tag (a stack per thread), marks, statistics, snapshots, and PyTorch's optional
 * pluggable-allocator entry points. Python's memtrace package calls these by symbol
 * through ctypes; C programs may declare and call them too (preload/README.md). */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "preload/api.h"
#include "preload/hooks_graph.h"
#include "preload/preload.h"
#include "util/assert.h"

/* ---- the calling thread's tag ----
 * Invariant: 0 <= tls_depth <= MEMTRACE_TAG_DEPTH; tls_tag is the current tag, and
 * tls_stack[0..tls_depth) holds the tags that were current before each push. */
static _Thread_local int tls_tag;
static _Thread_local int tls_depth;
static _Thread_local uint8_t tls_stack[MEMTRACE_TAG_DEPTH];

int mt__preload_tag(void)
{
    return tls_tag;
}

/* A tag id this process may use: a built-in one, or a user id registered here. */
static bool tag_known(int id)
{
    mt_preload_t *P = mt__preload();
    return id >= 0 && id < MT_TAG_USER_FIRST + atomic_load(&P->ntags_user);
}

/* Names the allocators accept: 1..31 bytes, no control characters, not "tag<N>" (the
 * consumers' name for an unlabelled id). */
static bool name_ok(const char *name)
{
    if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof mt__preload()->tag_names[0])
        return false;
    for (const char *c = name; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return false;
    if (strncmp(name, "tag", 3) == 0 && name[3] != '\0' &&
        strspn(name + 3, "0123456789") == strlen(name + 3))
        return false;
    return true;
}

MT_HOOK int memtrace_tag_lookup(const char *name)
{
    if (name == NULL)
        return MT_EINVAL;
    for (int t = 0; t < MT_TAG_USER_FIRST; t++)
        if (strcmp(name, mt_tag_builtin_name(t)) == 0)
            return t;
    mt_preload_t *P = mt__preload();
    int n = atomic_load(&P->ntags_user);
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_USER_FIRST + n; t++)
        if (strcmp(name, P->tag_names[t]) == 0)
            return t;
    return MT_ENOENT;
}

MT_HOOK int memtrace_tag_register(const char *name)
{
    if (!name_ok(name))
        return MT_EINVAL;
    int id = memtrace_tag_lookup(name);
    if (id >= 0)
        return id;
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    pthread_mutex_lock(&P->mu);
    int n = atomic_load(&P->ntags_user);
    int rc = MT_ENOMEM;
    id = memtrace_tag_lookup(name); /* another thread may have registered it meanwhile */
    if (id >= 0) {
        rc = id;
    } else if (MT_TAG_USER_FIRST + n < MT_TAG_MAX) {
        id = MT_TAG_USER_FIRST + n;
        snprintf(P->tag_names[id], sizeof P->tag_names[id], "%s", name);
        rc = mt__preload_register_tag(P, id, -1);
        if (rc == 0) {
            mt_assert(memtrace_tag_lookup(name) == MT_ENOENT); /* ids stay one per name */
            atomic_store(&P->ntags_user, n + 1);
            rc = id;
        } else {
            P->tag_names[id][0] = '\0';
        }
    }
    pthread_mutex_unlock(&P->mu);
    return rc;
}

MT_HOOK const char *memtrace_tag_name(int id)
{
    if (!tag_known(id))
        return NULL;
    return id < MT_TAG_USER_FIRST ? mt_tag_builtin_name(id) : mt__preload()->tag_names[id];
}

MT_HOOK int memtrace_tag_current(void)
{
    return tls_tag;
}

MT_HOOK int memtrace_tag_set(int id)
{
    if (!tag_known(id))
        return MT_EINVAL;
    int prev = tls_tag;
    tls_tag = id;
    return prev;
}

MT_HOOK int memtrace_tag_push(int id)
{
    if (!tag_known(id))
        return MT_EINVAL;
    if (tls_depth == MEMTRACE_TAG_DEPTH)
        return MT_EOVERFLOW;
    tls_stack[tls_depth++] = (uint8_t)tls_tag;
    tls_tag = id;
    mt_assert(tls_depth > 0 && tls_depth <= MEMTRACE_TAG_DEPTH);
    return 0;
}

MT_HOOK int memtrace_tag_pop(void)
{
    if (tls_depth == 0)
        return MT_EINVAL;
    tls_tag = tls_stack[--tls_depth];
    mt_assert(tls_depth >= 0 && tls_tag >= 0 && tls_tag < MT_TAG_MAX);
    return 0;
}

MT_HOOK int memtrace_tag_depth(void)
{
    return tls_depth;
}

/* ---- marks ---- */

/* Marks go through one allocator, so each reaches consumers once per process, ordered
 * with that allocator's events and carrying its totals: the first device in use (device
 * 0 on sim, where it exists from the start). Before any allocator exists a mark makes
 * none (that would create a context on device 0 in every process, every DDP rank's
 * included): it is kept here and emitted by the first allocator made, ahead of all of
 * its events. Invariant: queued marks exist only while no device's allocator is ready,
 * or until the creator of the first one flushes them (it takes early_mu after
 * publishing the allocator, and mark_emit checks readiness under early_mu). */
#define EARLY_MARKS 64

typedef struct {
    int kind;
    uint64_t addr;
    uint64_t size;
    int tag;
} early_mark_t;

static pthread_mutex_t early_mu = PTHREAD_MUTEX_INITIALIZER;
static early_mark_t early[EARLY_MARKS];
static size_t nearly;        /* queued marks */
static size_t early_dropped; /* marks past EARLY_MARKS, lost */

static mt_alloc_t *first_ready(void)
{
    mt_preload_t *P = mt__preload();
    for (int d = 0; d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            return a;
    }
    return NULL;
}

static int mark_emit(int kind, uint64_t addr, uint64_t size, int tag)
{
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    mt_alloc_t *a = first_ready();
    if (a == NULL) {
        pthread_mutex_lock(&early_mu);
        a = first_ready();
        if (a == NULL && nearly < EARLY_MARKS)
            early[nearly++] = (early_mark_t){kind, addr, size, tag};
        else if (a == NULL)
            early_dropped++;
        pthread_mutex_unlock(&early_mu);
        if (a == NULL)
            return 0;
    }
    mt__guard_enter();
    mt_alloc_emit(a, kind, addr, size, tag);
    mt__guard_leave();
    return 0;
}

void mt__preload_marks_flush(mt_alloc_t *a)
{
    pthread_mutex_lock(&early_mu);
    mt__guard_enter();
    for (size_t i = 0; i < nearly; i++)
        mt_alloc_emit(a, early[i].kind, early[i].addr, early[i].size, early[i].tag);
    mt__guard_leave();
    if (early_dropped > 0)
        mt__preload_say(MT_LOG_WARN, "%zu marks made before the first allocation were lost",
                        early_dropped);
    nearly = 0;
    early_dropped = 0;
    pthread_mutex_unlock(&early_mu);
}

void mt__preload_marks_fork_child(void)
{
    pthread_mutex_init(&early_mu, NULL);
    nearly = 0; /* the parent's: emitted (or not) by the parent */
    early_dropped = 0;
}

MT_HOOK int memtrace_mark(int mark, uint64_t payload)
{
    if (mark < MT_MARK_ITERATION || mark > MT_MARK_WARMUP_END)
        return MT_EINVAL;
    return mark_emit(MT_EV_MARK, (uint64_t)mark, payload, tls_tag);
}

MT_HOOK int memtrace_mark_named(const char *name)
{
    if (name == NULL || name[0] == '\0')
        return MT_EINVAL;
    mt_event_rec_t ev = {0};
    mt_event_mark_name_pack(&ev, name);
    return mark_emit(MT_EV_MARK_NAMED, ev.addr, ev.size, MT_TAG_OTHER); /* lines carry none */
}

/* ---- statistics, peaks, cache, snapshots ---- */

static const char *tag_name_cb(void *ud, int tag)
{
    (void)ud;
    return memtrace_tag_name(tag);
}

/* Writes j (taken) compactly into buf: the length it needs without the NUL (call again
 * with more room when it is >= cap), or MT_ENOMEM. */
static long dump(json_t *j, char *buf, size_t cap)
{
    if (j == NULL)
        return MT_ENOMEM;
    size_t need = json_dumpb(j, NULL, 0, JSON_COMPACT);
    if (need == 0) {
        json_decref(j);
        return MT_ENOMEM;
    }
    if (buf != NULL && need < cap) {
        json_dumpb(j, buf, need, JSON_COMPACT);
        buf[need] = '\0';
    }
    json_decref(j);
    return (long)need;
}

MT_HOOK long memtrace_stats_json(char *buf, size_t cap)
{
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    mt__guard_enter();
    json_t *devs = json_array();
    for (int d = 0; devs != NULL && d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        mt_alloc_stats_t st;
        if (a == NULL || mt_alloc_stats(a, &st) != 0)
            continue;
        json_t *j = mt_prof_stats_to_json(&st, (int)getpid(), d, tag_name_cb, NULL);
        if (j == NULL || json_array_append_new(devs, j) != 0) {
            json_decref(devs);
            devs = NULL;
        }
    }
    /* The managed allocators serving the program's cudaMallocManaged, with their figures. */
    json_t *mdevs = json_array();
    for (int d = 0; mdevs != NULL && d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->mready[d], memory_order_acquire);
        mt_alloc_stats_t st;
        mt_managed_stats_t ms;
        if (a == NULL || mt_alloc_stats(a, &st) != 0 || mt_alloc_managed_stats(a, &ms) != 0)
            continue;
        json_t *j = mt_prof_stats_to_json(&st, (int)getpid(), d, tag_name_cb, NULL);
        if (j != NULL)
            json_object_set_new(j, "managed",
                                json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "managed_bytes",
                                          (json_int_t)ms.managed_bytes, "device_bytes",
                                          (json_int_t)ms.device_bytes, "prefetches",
                                          (json_int_t)ms.prefetches, "prefetch_bytes",
                                          (json_int_t)ms.prefetch_bytes, "advises",
                                          (json_int_t)ms.advises, "faults", (json_int_t)ms.faults));
        if (j == NULL || json_array_append_new(mdevs, j) != 0) {
            json_decref(mdevs);
            mdevs = NULL;
        }
    }
    if (mdevs == NULL) {
        json_decref(devs);
        devs = NULL;
    }
    json_t *o = devs == NULL
                    ? NULL
                    : json_pack("{s:o,s:o,s:I,s:I,s:I}", "devices", devs, "managed_devices", mdevs,
                                "ooms", (json_int_t)atomic_load(&P->ooms), "unknown_frees",
                                (json_int_t)atomic_load(&P->unknown_frees), "host_bytes",
                                (json_int_t)atomic_load(&P->host_bytes));
    long rc = dump(o, buf, cap);
    mt__guard_leave();
    return rc;
}

MT_HOOK long memtrace_snapshot_json(char *buf, size_t cap)
{
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    mt__guard_enter();
    json_t *snaps = json_array();
    for (int d = 0; snaps != NULL && d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        mt_alloc_snapshot_t *s = NULL;
        if (a == NULL)
            continue;
        json_t *j = NULL;
        if (mt_alloc_snapshot(a, &s) == 0)
            j = mt_prof_snapshot_to_json(s, (int)getpid(), d, tag_name_cb, NULL);
        mt_alloc_snapshot_free(&s);
        if (j == NULL || json_array_append_new(snaps, j) != 0) {
            json_decref(snaps);
            snaps = NULL;
        }
    }
    long rc = dump(snaps, buf, cap);
    mt__guard_leave();
    return rc;
}

MT_HOOK int memtrace_reset_peak(void)
{
    mt_preload_t *P = mt__preload();
    for (int d = 0; d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            mt_alloc_reset_peak(a);
    }
    return P->init_rc;
}

MT_HOOK int memtrace_reset_accumulated(void)
{
    mt_preload_t *P = mt__preload();
    for (int d = 0; d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            mt_alloc_reset_accumulated(a);
    }
    return P->init_rc;
}

MT_HOOK int memtrace_set_allocator_settings(const char *conf, char *err, size_t errlen)
{
    mt_preload_t *P = mt__preload();
    int rc = P->init_rc;
    if (rc == 0 && conf == NULL)
        rc = MT_EINVAL;
    /* Every allocator gets the same string: the first refusal stops before the next. */
    for (int d = 0; d < P->ndevices && rc == 0; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            rc = mt_alloc_set_settings(a, conf, err, errlen);
    }
    return rc;
}

MT_HOOK int memtrace_empty_cache(void)
{
    mt_preload_t *P = mt__preload();
    int rc = P->init_rc;
    mt__guard_enter();
    for (int d = 0; d < P->ndevices && rc == 0; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            rc = mt_alloc_empty_cache(a);
    }
    mt__guard_leave();
    return rc;
}

MT_HOOK int memtrace_prefetch(void *ptr, size_t size, int location, struct CUstream_st *stream)
{
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    return mt__preload_managed_op(true, ptr, size, 0, location, stream);
}

MT_HOOK int memtrace_advise(void *ptr, size_t size, int advice, int location)
{
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    return mt__preload_managed_op(false, ptr, size, advice, location, NULL);
}

MT_HOOK const char *memtrace_library_path(void)
{
    Dl_info info;
    if (dladdr((void *)memtrace_library_path, &info) == 0 || info.dli_fname == NULL)
        return NULL;
    return info.dli_fname;
}

MT_HOOK const char *memtrace_strerror(int rc)
{
    return mt_strerror(rc);
}

/* ---- OOM observers ----
 * Every device's allocator calls mt__preload_oom_observer; it forwards to the program's
 * observers, copied under obs_mu so that one may be added or removed meanwhile. */

#define OOM_OBS_MAX 8
static pthread_mutex_t obs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    memtrace_oom_cb cb;
    void *ud;
} oom_obs[OOM_OBS_MAX];
static unsigned noom_obs; /* <= OOM_OBS_MAX, under obs_mu */

void mt__preload_oom_observer(void *ud, const mt_alloc_oom_info_t *info)
{
    (void)ud;
    pthread_mutex_lock(&obs_mu);
    unsigned n = noom_obs;
    __typeof__(oom_obs) obs;
    memcpy(obs, oom_obs, n * sizeof obs[0]);
    pthread_mutex_unlock(&obs_mu);
    for (unsigned i = 0; i < n; i++)
        obs[i].cb(obs[i].ud, info->device, info->requested, info->allocated, info->reserved,
                  info->limit, info->free, info->message);
}

MT_HOOK int memtrace_add_oom_observer(memtrace_oom_cb cb, void *ud)
{
    if (cb == NULL)
        return MT_EINVAL;
    pthread_mutex_lock(&obs_mu);
    int rc = noom_obs < OOM_OBS_MAX ? 0 : MT_EBUSY;
    if (rc == 0) {
        oom_obs[noom_obs].cb = cb;
        oom_obs[noom_obs++].ud = ud;
    }
    pthread_mutex_unlock(&obs_mu);
    return rc;
}

MT_HOOK int memtrace_remove_oom_observer(memtrace_oom_cb cb, void *ud)
{
    pthread_mutex_lock(&obs_mu);
    int rc = MT_ENOENT;
    for (unsigned i = 0; i < noom_obs; i++) {
        if (oom_obs[i].cb == cb && oom_obs[i].ud == ud) {
            memmove(&oom_obs[i], &oom_obs[i + 1], (noom_obs - i - 1) * sizeof oom_obs[0]);
            noom_obs--;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&obs_mu);
    return rc;
}

/* ---- scoped statistics ---- */

_Static_assert(sizeof(struct memtrace_scope_stats) == sizeof(mt_alloc_scope_stats_t) &&
                   offsetof(struct memtrace_scope_stats, frees) ==
                       offsetof(mt_alloc_scope_stats_t, frees),
               "memtrace_scope_stats mirrors mt_alloc_scope_stats_t");

MT_HOOK int memtrace_stats_push(int device, const char *name)
{
    mt_alloc_t *a = NULL;
    int rc = mt__preload_alloc(device, &a);
    if (rc != 0)
        return rc;
    mt__guard_enter();
    rc = mt_alloc_stats_push(a, name);
    mt__guard_leave();
    return rc;
}

MT_HOOK int memtrace_stats_pop(int device, struct memtrace_scope_stats *out)
{
    mt_alloc_t *a = NULL;
    int rc = mt__preload_alloc(device, &a);
    if (rc != 0)
        return rc;
    mt__guard_enter();
    rc = mt_alloc_stats_pop(a, (mt_alloc_scope_stats_t *)out);
    mt__guard_leave();
    return rc;
}

/* ---- PyTorch's optional pluggable-allocator entry points ---- */

/* init_fn(device_count): nothing to prepare, allocators are created on first use. */
MT_HOOK void memtrace_init(int device_count)
{
    (void)device_count;
    (void)mt__preload();
}

/* reset_fn: torch.cuda.empty_cache(). */
MT_HOOK void memtrace_reset(void)
{
    (void)memtrace_empty_cache();
}

/* memory_fraction_fn(fraction, device): torch.cuda.set_per_process_memory_fraction. torch
 * checked the range; a device memtrace cannot reach is left alone (void: nothing to say). */
MT_HOOK void memtrace_memory_fraction(double fraction, int device)
{
    mt_alloc_t *a = NULL;
    mt__guard_enter();
    if (mt__preload_alloc(device, &a) == 0)
        (void)mt_alloc_set_memory_fraction(a, fraction);
    mt__guard_leave();
}

/* base_alloc_fn: the start and size of the block ptr lies in (IPC handles). */
MT_HOOK void *memtrace_base_alloc(void *ptr, size_t *size)
{
    mt_alloc_t *a = NULL;
    void *base = NULL;
    size_t sz = 0;
    mt__guard_enter();
    if (mt__preload_alloc_of(ptr, &a) != 0 || mt_alloc_block_info(a, ptr, &base, &sz, NULL) != 0)
        base = NULL;
    mt__guard_leave();
    if (size != NULL)
        *size = base ? sz : 0;
    return base;
}

/* record_stream_fn: ptr is used on stream too (tensor.record_stream). Stream 0 is torch's
 * default stream: s NULL records the legacy stream, as a free on stream 0 does. */
MT_HOOK void memtrace_record_stream(void *ptr, struct CUstream_st *stream)
{
    mt_alloc_t *a = NULL;
    mt_stream_t *s = NULL;
    mt__guard_enter();
    /* On a capturing stream the use is the graph's, at every replay: the capture keeps
     * the block once freed (hooks_graph.c), and no event is recorded into the graph. */
    if (mt__preload_alloc_of(ptr, &a) == 0 && !mt__preload_graph_use(a, ptr, stream) &&
        mt__preload_stream(mt_alloc_backend(a), stream, &s) == 0)
        (void)mt_alloc_record_stream(a, ptr, s);
    mt__guard_leave();
}

/* CUDA graphs (torch.cuda.graph): the capture's private pool, for a torch that calls
 * these; captures no hook saw are also found by asking the driver (hooks_graph.c). */
MT_HOOK void memtrace_begin_allocate_to_pool(int device, memtrace_mempool_id_t pool, void *filter)
{
    (void)filter;
    mt__preload_graph_pool_begin(device, pool.first, pool.second);
}

MT_HOOK void memtrace_end_allocate_to_pool(int device, memtrace_mempool_id_t pool)
{
    mt__preload_graph_pool_end(device, pool.first, pool.second);
}

MT_HOOK void memtrace_release_pool(int device, memtrace_mempool_id_t pool)
{
    mt__preload_graph_pool_release(device, pool.first, pool.second);
}
