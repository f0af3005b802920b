/* Call-stack capture and interning (see stack.h; docs/telemetry.md, "Call stacks").
 *
 * Capture: libunwind's unw_backtrace (DWARF CFI, cached per thread: works without frame
 * pointers), cut at the program's call into memtrace (util/entry.h), then past leading
 * frames of the CUDA runtime and driver and of memtrace's own libraries; Python frames
 * (profiler/pyframes.h) are put where the interpreter's eval loop sits.
 * Interning: a lock-free lookup in a private open-addressing index of (hash, id); a new
 * stack is appended to the shared area under the table's lock. */

#include "profiler/stack.h"

#include <elf.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memtrace/common.h"
#include "profiler/pyframes.h"
#include "util/assert.h"
#include "util/entry.h"

#ifdef MT_HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#else
#include <execinfo.h>
#endif

#define UNWIND_MAX  (MT_STACK_DEPTH_MAX + 32) /* frames unwound: the depth cap + memtrace's */
#define INDEX_SLOTS (2u * MT_STACK_ID_MAX)    /* private index: load <= 1/2 */
#define TRIM_MAX    32                        /* modules whose leading frames are cut */
#define PYIDX_SLOTS (2u * MT__STAB_PY)

typedef struct range_s {
    uintptr_t lo, hi;
} range_t;

struct mt__stab_s {
    uint8_t *area;
    size_t size;
    mt__stab_hdr_t *h;
    mt__stab_def_t *defs;
    uint64_t *frames;
    mt__stab_mod_t *mods;
    mt__stab_py_t *py;
    char *str;
    /* private */
    _Atomic uint64_t *index; /* (hash >> 32) << 32 | id; 0 = empty */
    _Atomic uint32_t *pyidx; /* pyid; 0 = empty; keys in pykey */
    const char *(*pykey)[2];
    pthread_mutex_t lock; /* appends to the area; everything below */
    uint32_t frames_used, str_used;
    range_t *known; /* modules recorded (max_modules) */
    uint32_t nknown;
    range_t trim[TRIM_MAX]; /* runtime, driver, memtrace: trimmed leading frames */
    _Atomic uint32_t ntrim;
    char exe[MT__STAB_PATH_MAX];
};

static _Thread_local int tl_busy;
static _Thread_local int64_t tl_left; /* bytes until the next sample */
static _Thread_local uint64_t tl_rng;

/* ---- layout ---- */

static size_t al64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static void layout(mt__stab_hdr_t *h)
{
    h->max_stacks = MT_STACK_ID_MAX;
    h->max_frames = MT__STAB_FRAMES;
    h->max_modules = MT__STAB_MODULES;
    h->max_py = MT__STAB_PY;
    h->str_bytes = MT__STAB_STR;
    h->defs_off = al64(sizeof(mt__stab_hdr_t));
    h->frames_off = al64(h->defs_off + (size_t)h->max_stacks * sizeof(mt__stab_def_t));
    h->mods_off = al64(h->frames_off + (size_t)h->max_frames * sizeof(uint64_t));
    h->py_off = al64(h->mods_off + (size_t)h->max_modules * sizeof(mt__stab_mod_t));
    h->str_off = al64(h->py_off + (size_t)h->max_py * sizeof(mt__stab_py_t));
}

size_t mt__stab_area_size(void)
{
    mt__stab_hdr_t h;
    memset(&h, 0, sizeof h);
    layout(&h);
    return (h.str_off + h.str_bytes + 4095) & ~(size_t)4095;
}

/* ---- module map ---- */

static bool known_ip(const mt__stab_t *t, uintptr_t ip)
{
    for (uint32_t i = 0; i < t->nknown; i++)
        if (ip >= t->known[i].lo && ip < t->known[i].hi)
            return true;
    return false;
}

static uint32_t str_put(mt__stab_t *t, const char *s, size_t n)
{
    if (n > t->h->str_bytes - t->str_used)
        return UINT32_MAX;
    uint32_t off = t->str_used;
    memcpy(t->str + off, s, n);
    t->str_used += (uint32_t)n;
    return off;
}

/* The GNU build id of a loaded object, from its PT_NOTE segments in memory. */
static int build_id(const struct dl_phdr_info *info, uint8_t *out, int cap)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
        const uint8_t *end = p + ph->p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)(const void *)p;
            size_t nsz = (nh->n_namesz + 3) & ~3u, dsz = (nh->n_descsz + 3) & ~3u;
            const uint8_t *name = p + sizeof(*nh), *desc = name + nsz;
            if (desc + dsz > end)
                break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
                int n = nh->n_descsz < (unsigned)cap ? (int)nh->n_descsz : cap;
                memcpy(out, desc, (size_t)n);
                return n;
            }
            p = desc + dsz;
        }
    }
    return 0;
}

static bool trim_path(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    return strncmp(b, "libcudart", 9) == 0 || strncmp(b, "libcuda.", 8) == 0 ||
           strncmp(b, "libmemtrace", 11) == 0 || strncmp(b, "libcublas", 9) == 0;
}

static int scan_cb(struct dl_phdr_info *info, size_t sz, void *ud)
{
    (void)sz;
    mt__stab_t *t = ud;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        lo = ph->p_vaddr < lo ? ph->p_vaddr : lo;
        hi = ph->p_vaddr + ph->p_memsz > hi ? ph->p_vaddr + ph->p_memsz : hi;
    }
    if (hi == 0)
        return 0;
    uintptr_t base = info->dlpi_addr;
    range_t r = {base + lo, base + hi};
    for (uint32_t i = 0; i < t->nknown; i++)
        if (t->known[i].lo == r.lo && t->known[i].hi == r.hi)
            return 0;
    uint32_t n = atomic_load_explicit(&t->h->nmods, memory_order_relaxed);
    if (n >= t->h->max_modules)
        return 1;
    const char *path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : t->exe;
    size_t plen = strnlen(path, MT__STAB_PATH_MAX - 1);
    uint32_t off = str_put(t, path, plen);
    if (off == UINT32_MAX)
        return 1;
    mt__stab_mod_t *m = &t->mods[n];
    memset(m, 0, sizeof *m);
    m->base = base;
    m->size = hi;
    m->path_off = off;
    m->path_len = (uint32_t)plen;
    m->bid_len = (uint8_t)build_id(info, m->bid, (int)sizeof m->bid);
    t->known[t->nknown++] = r;
    uint32_t nt = atomic_load_explicit(&t->ntrim, memory_order_relaxed);
    if (trim_path(path) && nt < TRIM_MAX) {
        t->trim[nt] = r;
        atomic_store_explicit(&t->ntrim, nt + 1, memory_order_release);
    }
    atomic_store_explicit(&t->h->nmods, n + 1, memory_order_release);
    return 0;
}

/* Records the modules not yet known. Caller holds t->lock (or is create). */
static void scan_modules(mt__stab_t *t)
{
    dl_iterate_phdr(scan_cb, t);
}

/* memtrace's own module when it is a shared library (libmemtrace.so, the preload): its
 * leading frames are cut like the runtime's. */
static int self_cb(struct dl_phdr_info *info, size_t sz, void *ud)
{
    (void)sz;
    mt__stab_t *t = ud;
    uintptr_t me = (uintptr_t)&mt__stab_capture;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (me >= lo && me < lo + ph->p_memsz && info->dlpi_name && info->dlpi_name[0]) {
            uint32_t nt = atomic_load_explicit(&t->ntrim, memory_order_relaxed);
            if (nt < TRIM_MAX) {
                t->trim[nt] = (range_t){lo, lo + ph->p_memsz};
                atomic_store_explicit(&t->ntrim, nt + 1, memory_order_release);
            }
            return 1;
        }
    }
    return 0;
}

/* ---- lifecycle ---- */

int mt__stab_create(mt__stab_t **out, void *area, size_t size)
{
    *out = NULL;
    if (!area || size < mt__stab_area_size())
        return MT_EINVAL;
    mt__stab_t *t = calloc(1, sizeof *t);
    if (!t)
        return MT_ENOMEM;
    t->area = area;
    t->size = size;
    t->h = area;
    layout(t->h);
    t->h->hdr_size = sizeof(mt__stab_hdr_t);
    t->h->version = 1;
    t->defs = (mt__stab_def_t *)(void *)(t->area + t->h->defs_off);
    t->frames = (uint64_t *)(void *)(t->area + t->h->frames_off);
    t->mods = (mt__stab_mod_t *)(void *)(t->area + t->h->mods_off);
    t->py = (mt__stab_py_t *)(void *)(t->area + t->h->py_off);
    t->str = (char *)(t->area + t->h->str_off);
    /* The private index: reserved, touched as stacks arrive. */
    size_t isz =
        INDEX_SLOTS * sizeof(uint64_t) + PYIDX_SLOTS * (sizeof(uint32_t) + 2 * sizeof(void *));
    void *ix =
        mmap(NULL, isz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    t->known = calloc(MT__STAB_MODULES, sizeof(range_t));
    if (ix == MAP_FAILED || !t->known) {
        if (ix != MAP_FAILED)
            munmap(ix, isz);
        free(t->known);
        free(t);
        return MT_ENOMEM;
    }
    t->index = ix;
    t->pyidx = (_Atomic uint32_t *)(void *)((char *)ix + INDEX_SLOTS * sizeof(uint64_t));
    t->pykey = (const char *(*)[2])(void *)((char *)t->pyidx + PYIDX_SLOTS * sizeof(uint32_t));
    pthread_mutex_init(&t->lock, NULL);
    ssize_t n = readlink("/proc/self/exe", t->exe, sizeof t->exe - 1);
    if (n <= 0)
        snprintf(t->exe, sizeof t->exe, "[exe]");
    else
        t->exe[n] = '\0';
    dl_iterate_phdr(self_cb, t);
    scan_modules(t);
#ifdef MT_HAVE_LIBUNWIND
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
#else
    void *warm[4];
    (void)backtrace(warm, 4); /* loads libgcc_s now, not under an allocation */
#endif
    t->h->magic = MT__STAB_MAGIC;
    atomic_thread_fence(memory_order_release);
    *out = t;
    return 0;
}

void mt__stab_destroy(mt__stab_t **pt)
{
    if (!pt || !*pt)
        return;
    mt__stab_t *t = *pt;
    munmap((void *)t->index,
           INDEX_SLOTS * sizeof(uint64_t) + PYIDX_SLOTS * (sizeof(uint32_t) + 2 * sizeof(void *)));
    free(t->known);
    pthread_mutex_destroy(&t->lock);
    free(t);
    *pt = NULL;
}

/* ---- interning ---- */

static uint64_t hash_words(const uint64_t *w, int n, bool truncated)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n ^ ((uint64_t)truncated << 7);
    for (int i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h | 1; /* never 0: an empty slot */
}

static bool same(const mt__stab_t *t, uint32_t id, const uint64_t *w, int n, bool truncated)
{
    const mt__stab_def_t *d = &t->defs[id - 1];
    return d->n == n && (d->flags & 1) == truncated &&
           memcmp(&t->frames[d->off], w, (size_t)n * sizeof(*w)) == 0;
}

/* The id of the stack, or 0 when not found; *slot is where a new one goes. */
static uint32_t lookup(const mt__stab_t *t, uint64_t h, const uint64_t *w, int n, bool truncated,
                       size_t *slot)
{
    uint64_t key = h & ~(uint64_t)0xffffffff;
    for (size_t j = (size_t)(h & (INDEX_SLOTS - 1));; j = (j + 1) & (INDEX_SLOTS - 1)) {
        uint64_t e = atomic_load_explicit(&t->index[j], memory_order_acquire);
        if (e == 0) {
            *slot = j;
            return 0;
        }
        uint32_t id = (uint32_t)e;
        if ((e & ~(uint64_t)0xffffffff) == key && same(t, id, w, n, truncated))
            return id;
    }
}

uint32_t mt__stab_intern(mt__stab_t *t, const uint64_t *w, int n, bool truncated)
{
    if (n > MT_STACK_DEPTH_MAX)
        n = MT_STACK_DEPTH_MAX, truncated = true;
    uint64_t h = hash_words(w, n, truncated);
    size_t slot;
    uint32_t id = lookup(t, h, w, n, truncated, &slot);
    if (id)
        return id;
    pthread_mutex_lock(&t->lock);
    id = lookup(t, h, w, n, truncated, &slot); /* another thread may have added it */
    if (id)
        goto out;
    uint32_t ns = atomic_load_explicit(&t->h->nstacks, memory_order_relaxed);
    if (ns >= t->h->max_stacks || (uint64_t)t->frames_used + (uint64_t)n > t->h->max_frames) {
        atomic_fetch_add_explicit(&t->h->overflow, 1, memory_order_relaxed);
        id = MT_STACK_ID_OVERFLOW;
        goto out;
    }
    /* A return address outside every module known: something was loaded since. */
    for (int i = 0; i < n; i++) {
        if (!(w[i] & MT__STAB_PY_BIT) && !known_ip(t, (uintptr_t)w[i])) {
            scan_modules(t);
            break;
        }
    }
    memcpy(&t->frames[t->frames_used], w, (size_t)n * sizeof(*w));
    t->defs[ns] = (mt__stab_def_t){
        .off = t->frames_used, .n = (uint16_t)n, .flags = (uint16_t)(truncated ? 1 : 0)};
    t->frames_used += (uint32_t)n;
    id = ns + 1;
    atomic_store_explicit(&t->h->nstacks, id, memory_order_release);
    atomic_store_explicit(&t->index[slot], (h & ~(uint64_t)0xffffffff) | id, memory_order_release);
out:
    pthread_mutex_unlock(&t->lock);
    return id;
}

/* A Python (function, file) pair (interned strings: pointers identify them): its id, or
 * 0 with *slot where a new one goes. */
static uint32_t py_find(const mt__stab_t *t, const char *func, const char *file, size_t *slot)
{
    uintptr_t k = (uintptr_t)func * 31u ^ (uintptr_t)file;
    for (size_t j = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 40) & (PYIDX_SLOTS - 1);;
         j = (j + 1) & (PYIDX_SLOTS - 1)) {
        uint32_t id = atomic_load_explicit(&t->pyidx[j], memory_order_acquire);
        if (id == 0) {
            *slot = j;
            return 0;
        }
        if (t->pykey[j][0] == func && t->pykey[j][1] == file)
            return id;
    }
}

/* The pair's id, added when new; 0 when the pairs or the names are full. */
static uint32_t py_id(mt__stab_t *t, const char *func, const char *file)
{
    size_t slot;
    uint32_t id = py_find(t, func, file, &slot);
    if (id)
        return id;
    pthread_mutex_lock(&t->lock);
    id = py_find(t, func, file, &slot);
    uint32_t np = atomic_load_explicit(&t->h->npy, memory_order_relaxed);
    size_t fl = strnlen(func, 1024), fi = strnlen(file, MT__STAB_PATH_MAX - 1);
    if (id == 0 && np < t->h->max_py && fl + fi <= t->h->str_bytes - t->str_used) {
        mt__stab_py_t *p = &t->py[np];
        p->func_off = str_put(t, func, fl);
        p->func_len = (uint32_t)fl;
        p->file_off = str_put(t, file, fi);
        p->file_len = (uint32_t)fi;
        t->pykey[slot][0] = func;
        t->pykey[slot][1] = file;
        id = np + 1;
        atomic_store_explicit(&t->h->npy, id, memory_order_release);
        atomic_store_explicit(&t->pyidx[slot], id, memory_order_release);
    }
    pthread_mutex_unlock(&t->lock);
    return id;
}

/* ---- capture ---- */

static uint64_t rng_next(void)
{
    if (tl_rng == 0)
        tl_rng = (uint64_t)(uintptr_t)&tl_rng ^ 0x2545f4914f6cdd1dull ^ (uint64_t)getpid() << 32;
    tl_rng ^= tl_rng << 13;
    tl_rng ^= tl_rng >> 7;
    tl_rng ^= tl_rng << 17;
    return tl_rng;
}

/* Bytes until the next sample: exponential with mean MT_STACK_SAMPLE_MEAN. */
static int64_t next_interval(void)
{
    double u = ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
    double x = -log(u) * (double)MT_STACK_SAMPLE_MEAN;
    return x > 1e15 ? (int64_t)1e15 : (int64_t)x + 1;
}

static bool sampled_in(uint64_t bytes)
{
    if (bytes >= MT_STACK_SAMPLE_MEAN)
        return true;
    if (tl_left == 0)
        tl_left = next_interval();
    tl_left -= (int64_t)bytes;
    if (tl_left > 0)
        return false;
    tl_left = next_interval();
    return true;
}

static bool in_trim(const mt__stab_t *t, uintptr_t ip)
{
    uint32_t n = atomic_load_explicit(&((mt__stab_t *)t)->ntrim, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++)
        if (ip >= t->trim[i].lo && ip < t->trim[i].hi)
            return true;
    return false;
}

uint32_t mt__stab_capture(mt__stab_t *t, int mode, uint64_t bytes)
{
    if (!t || mode <= MT_STACKS_OFF || tl_busy)
        return 0;
    if (mode == MT_STACKS_SAMPLED && !sampled_in(bytes))
        return 0;
    tl_busy = 1;
    void *ips[UNWIND_MAX];
#ifdef MT_HAVE_LIBUNWIND
    int n = unw_backtrace(ips, UNWIND_MAX);
#else
    int n = backtrace(ips, UNWIND_MAX);
#endif
    bool truncated = n >= UNWIND_MAX;
    /* Cut at the program's call into memtrace: the first frame is the program's. Without
     * a mark (a caller that is not an entry point), only this file's frames go. */
    int start = n > 1 ? 1 : 0;
    uintptr_t ra = mt__entry_ra;
    for (int i = 0; ra != 0 && i < n; i++) {
        /* aarch64's unwinders (libunwind's and glibc's backtrace) give a caller's frame as
         * its return address minus 1, inside the call; x86's give the address itself. */
        if ((uintptr_t)ips[i] == ra || (uintptr_t)ips[i] + 1 == ra) {
            start = i;
            break;
        }
    }
    while (start < n - 1 && in_trim(t, (uintptr_t)ips[start]))
        start++;
    int nn = n - start;
    const uintptr_t *nat = (const uintptr_t *)(const void *)(ips + start);
    uint64_t w[MT_STACK_DEPTH_MAX];
    int nw = 0;
    mt_pyframe_t py[MT_STACK_DEPTH_MAX];
    bool pytrunc = false;
    int np = mt__pyframes_capture(py, MT_STACK_DEPTH_MAX, &pytrunc);
    if (np > 0) {
        int32_t order[MT_STACK_DEPTH_MAX];
        int k = mt__pyframes_merge(nat, nn, py, np, order, MT_STACK_DEPTH_MAX);
        truncated = truncated || pytrunc || k >= MT_STACK_DEPTH_MAX;
        for (int i = 0; i < k; i++) {
            if (order[i] >= 0) {
                w[nw++] = nat[order[i]];
                continue;
            }
            const mt_pyframe_t *f = &py[-order[i] - 1];
            uint32_t id = py_id(t, f->func ? f->func : "?", f->file ? f->file : "?");
            uint32_t line = f->line > 0 ? (uint32_t)f->line : 0;
            w[nw++] = MT__STAB_PY_BIT | (uint64_t)(id & 0x7fffffffu) << 32 | line;
        }
    } else {
        if (nn > MT_STACK_DEPTH_MAX) {
            nn = MT_STACK_DEPTH_MAX;
            truncated = true;
        }
        for (int i = 0; i < nn; i++)
            w[nw++] = nat[i];
    }
    atomic_fetch_add_explicit(&t->h->captures, 1, memory_order_relaxed);
    uint32_t id = mt__stab_intern(t, w, nw, truncated);
    tl_busy = 0;
    return id;
}

void mt__stab_stats(const mt__stab_t *t, mt__stab_stats_t *out)
{
    memset(out, 0, sizeof *out);
    mt__stab_hdr_t *h = t->h;
    out->captures = atomic_load_explicit(&h->captures, memory_order_relaxed);
    out->overflow = atomic_load_explicit(&h->overflow, memory_order_relaxed);
    out->stacks = atomic_load_explicit(&h->nstacks, memory_order_acquire);
    out->modules = atomic_load_explicit(&h->nmods, memory_order_acquire);
    pthread_mutex_lock(&((mt__stab_t *)t)->lock);
    out->frames = t->frames_used;
    uint64_t str = t->str_used;
    pthread_mutex_unlock(&((mt__stab_t *)t)->lock);
    /* pages touched: each table grows from its start; the index is hashed (every slot
     * used may be a page of its own, at most the whole index) */
    uint64_t idx_pages = (uint64_t)out->stacks * 4096u;
    uint64_t idx_all = INDEX_SLOTS * sizeof(uint64_t);
    out->table_bytes = sizeof(mt__stab_hdr_t) + (uint64_t)out->stacks * sizeof(mt__stab_def_t) +
                       out->frames * sizeof(uint64_t) + out->modules * sizeof(mt__stab_mod_t) +
                       str + (idx_pages < idx_all ? idx_pages : idx_all);
    out->bound_bytes = mt__stab_area_size() + idx_all;
}
