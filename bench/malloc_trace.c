/* An LD_PRELOAD malloc interposer that records a program's heap requests and writes them at
 * exit as an allocation trace in RMM's logging CSV (analysis/trace_csv.h), for bench_alloc's
 * replay table (bench/record_torch_trace.sh drives it).
 *
 *   MALLOC_TRACE_OUT=FILE      where the CSV goes (required; nothing is recorded without it)
 *   MALLOC_TRACE_ONLY=aligned  record only posix_memalign/aligned_alloc/memalign (PyTorch's CPU
 *                              allocator gets every tensor storage from posix_memalign, so this
 *                              is the tensor storages); default: every entry point
 *   MALLOC_TRACE_MIN=BYTES     record only requests of at least BYTES (default 1)
 *   MALLOC_TRACE_MAX_EVENTS=N  capacity of the event buffer (default 64 M); past it, events
 *                              are counted as dropped and the writer says so on stderr
 *
 * Why the design is what it is:
 * - The real allocator is glibc's, reached through its exported __libc_* entry points, so
 *   there is no dlsym bootstrap (dlsym itself calls calloc) and nothing to initialise.
 * - Recording is an atomic fetch-add of a slot in one preallocated (MAP_NORESERVE) array of
 *   fixed-size events: thread-safe, no lock, no allocation on the hot path.
 * - A free is given its slot BEFORE the memory goes back, an allocation AFTER it is obtained:
 *   so when another thread gets the same address back, its allocate follows the free in the
 *   buffer, and the trace never shows one address live twice.
 * - Frees carry no size and cannot know whether their pointer was recorded (a filter may have
 *   skipped it). The writer, single-threaded at exit, replays the buffer against a table of
 *   live recorded pointers: a free of a pointer it does not hold is dropped, the others get
 *   their allocation's size, as the format wants.
 * - A thread-local guard makes calls made while recording or writing (stdio's buffers) pass
 *   straight through.
 * - Time is CLOCK_REALTIME's time of day, as RMM writes it; the replay ignores it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t size);

#define EXPORT __attribute__((visibility("default")))

enum { EV_ALLOC = 0, EV_FREE = 1 };

/* One recorded call. Invariant: a slot with ready == 0 was claimed by a thread still writing
 * it (or by nobody, past next); the writer skips it. */
typedef struct ev_s {
    uint64_t ptr;     /* address returned or freed */
    uint64_t size;    /* bytes requested; 0 on a free */
    uint64_t time_ns; /* CLOCK_REALTIME ns */
    uint32_t tid;     /* kernel thread id */
    uint8_t action;   /* EV_ALLOC or EV_FREE */
    _Atomic uint8_t ready;
} ev_t;

static ev_t *g_ev;               /* g_cap slots, or NULL when not recording */
static size_t g_cap;             /* slots */
static _Atomic size_t g_next;    /* slots claimed (may exceed g_cap: the excess is dropped) */
static bool g_only_aligned;      /* record only the aligned entry points */
static size_t g_min = 1;         /* smallest recorded request, bytes */
static char g_out[4096];         /* output path */
static _Thread_local int t_busy; /* > 0 inside the recorder or the writer */
static _Thread_local uint32_t t_tid;

static void record(int action, void *p, size_t size)
{
    if (g_ev == NULL || p == NULL || t_busy)
        return;
    if (action == EV_ALLOC && size < g_min)
        return;
    t_busy++;
    size_t i = atomic_fetch_add_explicit(&g_next, 1, memory_order_relaxed);
    if (i < g_cap) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (t_tid == 0)
            t_tid = (uint32_t)syscall(SYS_gettid);
        ev_t *e = &g_ev[i];
        e->ptr = (uint64_t)(uintptr_t)p;
        e->size = action == EV_ALLOC ? size : 0;
        e->time_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
        e->tid = t_tid;
        e->action = (uint8_t)action;
        atomic_store_explicit(&e->ready, 1, memory_order_release);
    }
    t_busy--;
}

/* ---- the interposed entry points ---- */

EXPORT void *malloc(size_t size)
{
    void *p = __libc_malloc(size);
    if (!g_only_aligned)
        record(EV_ALLOC, p, size);
    return p;
}

EXPORT void *calloc(size_t n, size_t size)
{
    void *p = __libc_calloc(n, size);
    if (!g_only_aligned && p != NULL)
        record(EV_ALLOC, p, n * size); /* no overflow: calloc checked it */
    return p;
}

EXPORT void *realloc(void *old, size_t size)
{
    /* A realloc is a free of the old block and an allocate of the new one, as a device
     * allocator (which cannot grow in place) would see it. */
    if (old != NULL)
        record(EV_FREE, old, 0);
    void *p = __libc_realloc(old, size);
    if (p == NULL && size != 0 && old != NULL) {
        /* Failed: the old block is still live; put it back in the trace. */
        record(EV_ALLOC, old, malloc_usable_size(old));
        return NULL;
    }
    if (!g_only_aligned)
        record(EV_ALLOC, p, size);
    return p;
}

EXPORT void free(void *p)
{
    if (p == NULL)
        return;
    record(EV_FREE, p, 0);
    __libc_free(p);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    void *p = __libc_memalign(align, size);
    if (p == NULL)
        return ENOMEM;
    record(EV_ALLOC, p, size);
    *out = p;
    return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t size)
{
    void *p = __libc_memalign(align, size);
    record(EV_ALLOC, p, size);
    return p;
}

EXPORT void *memalign(size_t align, size_t size)
{
    void *p = __libc_memalign(align, size);
    record(EV_ALLOC, p, size);
    return p;
}

/* ---- start and exit ---- */

__attribute__((constructor)) static void trace_start(void)
{
    t_busy++;
    const char *out = getenv("MALLOC_TRACE_OUT");
    const char *only = getenv("MALLOC_TRACE_ONLY");
    const char *min = getenv("MALLOC_TRACE_MIN");
    const char *cap = getenv("MALLOC_TRACE_MAX_EVENTS");
    if (out == NULL || out[0] == '\0' || strlen(out) >= sizeof g_out)
        goto done;
    snprintf(g_out, sizeof g_out, "%s", out);
    g_only_aligned = only != NULL && strcmp(only, "aligned") == 0;
    if (min != NULL)
        g_min = strtoull(min, NULL, 10);
    g_cap = cap != NULL ? strtoull(cap, NULL, 10) : (size_t)64 << 20;
    void *m = mmap(NULL, g_cap * sizeof(ev_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "malloc_trace: cannot map %zu events: not recording\n", g_cap);
        goto done;
    }
    /* The variable is inherited by child processes (the shell of a popen, say): each would
     * overwrite the parent's file, so only this process records. */
    unsetenv("MALLOC_TRACE_OUT");
    g_ev = m;
done:
    t_busy--;
}

/* Open-addressing table of live recorded pointers: pointer -> size. 0 marks an empty slot,
 * a deleted one keeps its key with size UINT64_MAX (a tombstone). */
typedef struct live_s {
    uint64_t *key, *val;
    size_t cap, used; /* cap a power of two; used counts keys and tombstones */
} live_t;

static size_t live_find(const live_t *t, uint64_t k)
{
    size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull >> 20) & (t->cap - 1);
    while (t->key[i] != 0 && t->key[i] != k)
        i = (i + 1) & (t->cap - 1);
    return i;
}

static int live_grow(live_t *t)
{
    live_t n = {.cap = t->cap ? t->cap * 2 : 1 << 16};
    n.key = __libc_calloc(n.cap, sizeof *n.key);
    n.val = __libc_calloc(n.cap, sizeof *n.val);
    if (n.key == NULL || n.val == NULL) {
        __libc_free(n.key);
        __libc_free(n.val);
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (t->key[i] != 0 && t->val[i] != UINT64_MAX) {
            size_t j = live_find(&n, t->key[i]);
            n.key[j] = t->key[i];
            n.val[j] = t->val[i];
            n.used++;
        }
    __libc_free(t->key);
    __libc_free(t->val);
    *t = n;
    return 0;
}

static void write_time(FILE *f, uint64_t ns)
{
    uint64_t us = ns / 1000, day = us % 86400000000ull;
    fprintf(f, "%02u:%02u:%02u.%06u", (unsigned)(day / 3600000000ull),
            (unsigned)(day / 60000000ull % 60), (unsigned)(day / 1000000ull % 60),
            (unsigned)(day % 1000000ull));
}

__attribute__((destructor)) static void trace_write(void)
{
    if (g_ev == NULL)
        return;
    t_busy++;
    ev_t *ev = g_ev;
    g_ev = NULL; /* other threads still running record nothing from here on */
    size_t n = atomic_load(&g_next), dropped = 0, skipped = 0, rows = 0, repaired = 0;
    if (n > g_cap) {
        dropped = n - g_cap;
        n = g_cap;
    }
    FILE *f = fopen(g_out, "w");
    live_t live = {0};
    if (f == NULL || live_grow(&live) < 0) {
        fprintf(stderr, "malloc_trace: cannot write %s\n", g_out);
        goto done;
    }
    fprintf(f, "Thread,Time,Action,Pointer,Size,Stream\n");
    for (size_t i = 0; i < n; i++) {
        const ev_t *e = &ev[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire)) {
            skipped++;
            continue;
        }
        size_t j = live_find(&live, e->ptr);
        bool held = live.key[j] == e->ptr && live.val[j] != UINT64_MAX;
        uint64_t size = e->size;
        if (e->action == EV_FREE) {
            if (!held)
                continue; /* never recorded (filtered, or allocated before we started) */
            size = live.val[j];
            live.val[j] = UINT64_MAX;
        } else {
            if (held) {
                /* A free went unrecorded (a skipped slot) or came out of order: close the
                 * old lifetime first, and say so (a correct recording has none). */
                repaired++;
                fprintf(f, "%u,", e->tid);
                write_time(f, e->time_ns);
                fprintf(f, ",free,0x%llx,%llu,0\n", (unsigned long long)e->ptr,
                        (unsigned long long)live.val[j]);
                rows++;
            } else if (live.key[j] == 0) {
                if ((live.used + 1) * 2 > live.cap) {
                    if (live_grow(&live) < 0)
                        break;
                    j = live_find(&live, e->ptr);
                }
                live.used++;
            }
            live.key[j] = e->ptr;
            live.val[j] = e->size;
        }
        fprintf(f, "%u,", e->tid);
        write_time(f, e->time_ns);
        fprintf(f, ",%s,0x%llx,%llu,0\n", e->action == EV_FREE ? "free" : "allocate",
                (unsigned long long)e->ptr, (unsigned long long)size);
        rows++;
    }
    if (dropped || skipped)
        fprintf(stderr, "malloc_trace: %zu events dropped (buffer full), %zu unfinished\n", dropped,
                skipped);
    if (repaired)
        fprintf(stderr, "malloc_trace: %zu allocations of a live address (free out of order)\n",
                repaired);
    fprintf(stderr, "malloc_trace: %zu rows written to %s\n", rows, g_out);
done:
    if (f != NULL)
        fclose(f);
    __libc_free(live.key);
    __libc_free(live.val);
    /* The buffer stays mapped: a thread still running may have read g_ev before it became
     * NULL and be writing its slot. */
    t_busy--;
}
