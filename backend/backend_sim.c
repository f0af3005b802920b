/* The sim backend: host memory posing as a device of fixed capacity.
 *
 * Device memory is one virtual range reserved with mmap (MAP_NORESERVE, so pages are
 * committed only when touched); segment mallocs are carved from it by best fit over an
 * address-ordered list of free ranges, which is plenty for calls the caching allocator
 * makes almost never. The range spans SIM_VA_FACTOR times the capacity, and a malloc is
 * refused when the capacity's BYTES run out, not for want of a contiguous hole: a GPU
 * maps a cudaMalloc's physical pages wherever they are free, so 24 MiB succeed with 30 MiB
 * free in two holes there, and must here too. Each malloc/free spends its modelled
 * cost for real (a busy-wait), so wall-clock benchmarks see what caching saves.
 * Virtual memory (expandable segments) is modelled with separate PROT_NONE reservations
 * whose pages are mprotect'ed read/write on map. Streams and events: sim_stream.c.
 * All bookkeeping lives on the host; nothing is ever written into "device" memory.
 * With MEMTRACE_SIM_DEVICES=N one create makes a group of N such devices, each with its
 * own range, capacity and streams; they share the event lock (cross-device waits) and
 * the peer copy cost model. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend_sim.h"
#include "backend/sim_internal.h"
#include "util/log.h"
#include "util/grow.h"

#define GIB                  ((size_t)1 << 30)
#define SIM_DEFAULT_CAPACITY (8 * GIB)
#define SIM_BIG_ALIGN        SIM_VM_GRANULARITY /* sizes >= 2 MiB get 2 MiB pages */
#define SIM_VA_FACTOR        4                  /* device address range / capacity */
#define SIM_VA_MAX           ((size_t)1 << 44)  /* 16 TiB: far below the 47-bit user space */

static const mt_backend_ops_t sim_ops;

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) & ~(a - 1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spends d ns of wall-clock time on this thread and books it as modelled device time.
 * A busy-wait rather than a sleep: sleeps overshoot by tens of microseconds, which is
 * the very order of magnitude being modelled. */
static void spend(sim_t *s, uint64_t d)
{
    if (d == 0)
        return;
    pthread_mutex_lock(&s->cost_mu);
    uint64_t end = now_ns() + d;
    while (now_ns() < end) {
    }
    pthread_mutex_unlock(&s->cost_mu);
    mt__backend_add_modelled_ns(&s->base, d);
}

/* ---- sorted range arrays ---- */

static int ranges_insert_at(sim_ranges_t *r, size_t i, sim_range_t v)
{
    sim_range_t *nv = mt__grow(r->v, &r->cap, r->n + 1, sizeof *nv, 16);
    if (nv == NULL)
        return MT_ENOMEM;
    r->v = nv;
    memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof *r->v);
    r->v[i] = v;
    r->n++;
    return 0;
}

static void ranges_remove_at(sim_ranges_t *r, size_t i)
{
    memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof *r->v);
    r->n--;
}

/* Index of the first range with off >= off. */
static size_t ranges_lower_bound(const sim_ranges_t *r, size_t off)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->v[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the range containing off, or SIZE_MAX. */
static size_t ranges_find_containing(const sim_ranges_t *r, size_t off)
{
    size_t i = ranges_lower_bound(r, off + 1);
    if (i == 0)
        return SIZE_MAX;
    i--;
    return off - r->v[i].off < r->v[i].size ? i : SIZE_MAX;
}

/* Returns [off, off+size) to the free list, merging with touching neighbours. The array
 * can only grow by one element, so callers reserve room before changing anything. */
static void free_ranges_put(sim_ranges_t *f, size_t off, size_t size)
{
    size_t i = ranges_lower_bound(f, off);
    bool merge_prev = i > 0 && f->v[i - 1].off + f->v[i - 1].size == off;
    bool merge_next = i < f->n && off + size == f->v[i].off;
    if (merge_prev && merge_next) {
        f->v[i - 1].size += size + f->v[i].size;
        ranges_remove_at(f, i);
    } else if (merge_prev) {
        f->v[i - 1].size += size;
    } else if (merge_next) {
        f->v[i].off = off;
        f->v[i].size += size;
    } else {
        /* Room was reserved by ranges_reserve(); cannot fail. */
        (void)ranges_insert_at(f, i, (sim_range_t){off, size});
    }
}

static int ranges_reserve(sim_ranges_t *r, size_t extra)
{
    if (r->n + extra <= r->cap)
        return 0;
    size_t cap = r->cap ? r->cap : 16;
    while (cap < r->n + extra)
        cap *= 2;
    sim_range_t *nv = realloc(r->v, cap * sizeof *nv);
    if (nv == NULL)
        return MT_ENOMEM;
    r->v = nv;
    r->cap = cap;
    return 0;
}

/* ---- device memory ---- */

static sim_t *to_sim(const mt_backend_t *b)
{
    return (sim_t *)b;
}

/* Rounded size and alignment of a segment of `size` bytes, as the device accounts it. */
/* The test hook of mt__sim_set_call_hook, if any, for one blocking call. */
static void call_hook(sim_t *s, const char *call)
{
    pthread_mutex_lock(&s->mu);
    void (*cb)(void *, const char *) = s->call_cb;
    void *ud = s->call_ud;
    pthread_mutex_unlock(&s->mu);
    if (cb != NULL)
        cb(ud, call);
}

static void segment_geometry(size_t size, size_t *rounded, size_t *align)
{
    if (size >= SIM_BIG_ALIGN) {
        *align = SIM_BIG_ALIGN;
        *rounded = align_up(size, SIM_BIG_ALIGN);
    } else {
        *align = SIM_MIN_ALIGN;
        *rounded = align_up(size, SIM_MIN_ALIGN);
    }
}

/* Best fit over the free ranges: the smallest range that holds an aligned piece of
 * `size` bytes. Returns the offset or SIZE_MAX. Caller holds mu. */
static size_t carve(sim_t *s, size_t size, size_t align)
{
    sim_ranges_t *f = &s->free_r;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < f->n; i++) {
        size_t start = align_up(f->v[i].off, align);
        size_t end = f->v[i].off + f->v[i].size;
        if (start > end || end - start < size)
            continue;
        if (best == SIZE_MAX || f->v[i].size < f->v[best].size)
            best = i;
    }
    if (best == SIZE_MAX)
        return SIZE_MAX;
    /* Splitting a range leaves up to two pieces (head padding and tail): one more entry. */
    if (ranges_reserve(f, 1) != 0 || ranges_reserve(&s->used_r, 1) != 0)
        return SIZE_MAX;
    sim_range_t r = f->v[best];
    size_t start = align_up(r.off, align);
    size_t head = start - r.off;
    size_t tail = r.off + r.size - (start + size);
    ranges_remove_at(f, best);
    if (tail > 0)
        (void)ranges_insert_at(f, best, (sim_range_t){start + size, tail});
    if (head > 0)
        (void)ranges_insert_at(f, best, (sim_range_t){r.off, head});
    return start;
}

static int sim_malloc(mt_backend_t *b, size_t size, void **out)
{
    sim_t *s = to_sim(b);
    size_t rounded, align;
    if (size > s->capacity)
        return MT_ENOMEM;
    segment_geometry(size, &rounded, &align);
    spend(s, atomic_load_explicit(&s->malloc_cost_ns, memory_order_relaxed));

    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->fail_next > 0) {
        s->fail_next--;
        rc = s->fail_rc;
    } else if (rounded > s->capacity - s->seg_bytes - s->mapped_bytes) {
        rc = MT_ENOMEM;
    } else {
        size_t off = carve(s, rounded, align);
        if (off == SIZE_MAX) {
            rc = MT_ENOMEM;
        } else {
            size_t i = ranges_lower_bound(&s->used_r, off);
            (void)ranges_insert_at(&s->used_r, i, (sim_range_t){off, rounded});
            s->seg_bytes += rounded;
            *out = s->dev_base + off;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int sim_free(mt_backend_t *b, void *ptr)
{
    sim_t *s = to_sim(b);
    uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)s->dev_base;
    if (p < base || p >= base + s->dev_size)
        return MT_ENOENT;
    size_t off = p - base;

    pthread_mutex_lock(&s->mu);
    size_t i = ranges_lower_bound(&s->used_r, off);
    bool known = i < s->used_r.n && s->used_r.v[i].off == off;
    pthread_mutex_unlock(&s->mu);
    if (!known)
        return MT_ENOENT;

    /* cudaFree synchronises the device: queued work may still touch the segment. */
    int rc = mt__sim_device_synchronize(b);
    if (rc != 0)
        return rc;
    spend(s, atomic_load_explicit(&s->free_cost_ns, memory_order_relaxed));

    pthread_mutex_lock(&s->mu);
    /* Look again: another thread may have freed it while we synchronised. */
    i = ranges_lower_bound(&s->used_r, off);
    rc = i < s->used_r.n && s->used_r.v[i].off == off ? ranges_reserve(&s->free_r, 1) : MT_ENOENT;
    if (rc != 0) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    size_t size = s->used_r.v[i].size;
    ranges_remove_at(&s->used_r, i);
    s->seg_bytes -= size;
    /* Give back the whole OS pages inside the segment; partial pages are shared with
     * neighbours (small segments are only 512-byte aligned). */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = align_up(p, pg), hi = (p + size) & ~(uintptr_t)(pg - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
    free_ranges_put(&s->free_r, off, size);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int sim_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    *free_bytes = s->capacity - s->seg_bytes - s->mapped_bytes;
    *total_bytes = s->capacity;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Caller holds mu. */
static sim_vm_t *vm_containing(sim_t *s, uintptr_t p)
{
    for (sim_vm_t *v = s->vms; v != NULL; v = v->next)
        if (p >= v->base && p - v->base < v->size)
            return v;
    return NULL;
}

static bool sim_is_device_ptr(const mt_backend_t *b, const void *ptr)
{
    sim_t *s = to_sim(b);
    uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)s->dev_base;
    if (p >= base && p - base < s->dev_size)
        return true;
    pthread_mutex_lock(&s->mu);
    bool r = vm_containing(s, p) != NULL;
    pthread_mutex_unlock(&s->mu);
    return r;
}

static bool page_mapped(const sim_vm_t *v, size_t i)
{
    return (v->mapped[i / 64] >> (i % 64)) & 1u;
}

static void page_set(sim_vm_t *v, size_t i, bool on)
{
    if (on)
        v->mapped[i / 64] |= (uint64_t)1 << (i % 64);
    else
        v->mapped[i / 64] &= ~((uint64_t)1 << (i % 64));
}

bool mt__sim_span_is_device(sim_t *s, const void *ptr, size_t n)
{
    uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)s->dev_base;
    if (n == 0 || p + n < p)
        return false;
    bool ok = false;
    pthread_mutex_lock(&s->mu);
    if (p >= base && p - base < s->dev_size) {
        size_t i = ranges_find_containing(&s->used_r, p - base);
        ok = i != SIZE_MAX && p + n <= base + s->used_r.v[i].off + s->used_r.v[i].size;
    } else {
        sim_vm_t *v = vm_containing(s, p);
        if (v != NULL && p + n <= v->base + v->size) {
            ok = true;
            size_t first = (p - v->base) / SIM_VM_GRANULARITY;
            size_t last = (p + n - 1 - v->base) / SIM_VM_GRANULARITY;
            for (size_t i = first; i <= last && ok; i++)
                ok = page_mapped(v, i);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ---- virtual memory ---- */

static size_t sim_vm_granularity(const mt_backend_t *b)
{
    return SIM_VM_GRANULARITY;
}

/* mmap's `len` bytes at an address aligned to `align` by over-reserving and trimming.
 * Returns NULL on failure. */
static void *mmap_aligned(size_t len, size_t align, int prot)
{
    size_t over = len + align;
    if (over < len)
        return NULL;
    uint8_t *raw = mmap(NULL, over, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *p = (uint8_t *)align_up((uintptr_t)raw, align);
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + over - (p + len));
    if (tail > 0)
        munmap(p + len, tail);
    return p;
}

static int sim_vm_reserve(mt_backend_t *b, size_t size, void **out)
{
    call_hook(to_sim(b), "vm_reserve");
    sim_t *s = to_sim(b);
    sim_vm_t *v = calloc(1, sizeof *v);
    if (v == NULL)
        return MT_ENOMEM;
    v->npages = size / SIM_VM_GRANULARITY;
    v->mapped = calloc((v->npages + 63) / 64, sizeof *v->mapped);
    void *p = v->mapped ? mmap_aligned(size, SIM_VM_GRANULARITY, PROT_NONE) : NULL;
    if (p == NULL) {
        free(v->mapped);
        free(v);
        return MT_ENOMEM;
    }
    v->base = (uintptr_t)p;
    v->size = size;
    pthread_mutex_lock(&s->mu);
    v->next = s->vms;
    s->vms = v;
    pthread_mutex_unlock(&s->mu);
    *out = p;
    return 0;
}

static int sim_vm_release(mt_backend_t *b, void *base, size_t size)
{
    call_hook(to_sim(b), "vm_release");
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    sim_vm_t **pp = &s->vms;
    while (*pp != NULL && (*pp)->base != (uintptr_t)base)
        pp = &(*pp)->next;
    sim_vm_t *v = *pp;
    int rc = 0;
    if (v == NULL)
        rc = MT_ENOENT;
    else if (v->size != size)
        rc = MT_EINVAL; /* cuMemAddressFree takes the whole reservation back */
    else if (v->nmapped > 0)
        rc = MT_EBUSY;
    else
        *pp = v->next;
    pthread_mutex_unlock(&s->mu);
    if (rc != 0)
        return rc;
    munmap(base, size);
    free(v->mapped);
    free(v);
    return 0;
}

/* Finds the reservation holding all of [addr, addr+size) and the page index range.
 * Caller holds mu. */
static sim_vm_t *vm_span(sim_t *s, void *addr, size_t size, size_t *first, size_t *count)
{
    uintptr_t p = (uintptr_t)addr;
    sim_vm_t *v = vm_containing(s, p);
    if (v == NULL || size > v->size - (p - v->base))
        return NULL;
    *first = (p - v->base) / SIM_VM_GRANULARITY;
    *count = size / SIM_VM_GRANULARITY;
    return v;
}

static int sim_vm_map(mt_backend_t *b, void *addr, size_t size)
{
    call_hook(to_sim(b), "vm_map");
    sim_t *s = to_sim(b);
    spend(s, atomic_load_explicit(&s->malloc_cost_ns, memory_order_relaxed));
    size_t first, count;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    sim_vm_t *v = vm_span(s, addr, size, &first, &count);
    if (v == NULL) {
        rc = MT_EINVAL;
        goto out;
    }
    for (size_t i = first; i < first + count; i++) {
        if (page_mapped(v, i)) {
            rc = MT_EINVAL; /* cuMemMap refuses to map over a mapping */
            goto out;
        }
    }
    if (s->fail_next > 0) {
        s->fail_next--;
        rc = s->fail_rc;
        goto out;
    }
    if (size > s->capacity - s->seg_bytes - s->mapped_bytes) {
        rc = MT_ENOMEM;
        goto out;
    }
    if (mprotect(addr, size, PROT_READ | PROT_WRITE) != 0) {
        rc = MT_ENOMEM;
        goto out;
    }
    for (size_t i = first; i < first + count; i++)
        page_set(v, i, true);
    v->nmapped += count;
    s->mapped_bytes += size;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int sim_vm_unmap(mt_backend_t *b, void *addr, size_t size)
{
    call_hook(to_sim(b), "vm_unmap");
    sim_t *s = to_sim(b);
    size_t first, count;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    sim_vm_t *v = vm_span(s, addr, size, &first, &count);
    if (v == NULL) {
        rc = MT_EINVAL;
        goto out;
    }
    for (size_t i = first; i < first + count; i++) {
        if (!page_mapped(v, i)) {
            rc = MT_EINVAL;
            goto out;
        }
    }
    /* Drop the contents first so the pages are really given back, then make any later
     * access fault, as an access to an unmapped device address would. */
    madvise(addr, size, MADV_DONTNEED);
    if (mprotect(addr, size, PROT_NONE) != 0) {
        rc = MT_EIO;
        goto out;
    }
    for (size_t i = first; i < first + count; i++)
        page_set(v, i, false);
    v->nmapped -= count;
    s->mapped_bytes -= size;
out:
    pthread_mutex_unlock(&s->mu);
    if (rc == 0)
        spend(s, atomic_load_explicit(&s->free_cost_ns, memory_order_relaxed));
    return rc;
}

/* ---- pinned host memory ---- */

static int sim_host_malloc(mt_backend_t *b, size_t size, void **out)
{
    sim_t *s = to_sim(b);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = align_up(size, pg);
    if (len < size)
        return MT_ENOMEM;
    sim_host_t *h = malloc(sizeof *h);
    if (h == NULL)
        return MT_ENOMEM;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        return MT_ENOMEM;
    }
    h->ptr = p;
    h->size = len;
    pthread_mutex_lock(&s->mu);
    h->next = s->hosts;
    s->hosts = h;
    pthread_mutex_unlock(&s->mu);
    *out = p;
    return 0;
}

static int sim_host_free(mt_backend_t *b, void *ptr)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    sim_host_t **pp = &s->hosts;
    while (*pp != NULL && (*pp)->ptr != ptr)
        pp = &(*pp)->next;
    sim_host_t *h = *pp;
    if (h != NULL)
        *pp = h->next;
    pthread_mutex_unlock(&s->mu);
    if (h == NULL)
        return MT_ENOENT;
    munmap(h->ptr, h->size);
    free(h);
    return 0;
}

/* ---- lifecycle ---- */

/* Frees one device: its streams, events and memory. Every device of the group was
 * synchronised first. */
static void device_free(sim_t *s)
{
    mt__sim_streams_fini(s);
    while (s->vms != NULL) {
        sim_vm_t *v = s->vms;
        s->vms = v->next;
        munmap((void *)v->base, v->size);
        free(v->mapped);
        free(v);
    }
    while (s->hosts != NULL) {
        sim_host_t *h = s->hosts;
        s->hosts = h->next;
        munmap(h->ptr, h->size);
        free(h);
    }
    munmap(s->dev_base, s->map_len);
    free(s->free_r.v);
    free(s->used_r.v);
    pthread_mutex_destroy(&s->cost_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Frees the group and its devices dev[0, made). */
static void group_free(sim_group_t *g, int made)
{
    /* A stream of one device may wait on a mark another device records. */
    for (int i = 0; i < made; i++)
        mt__sim_device_synchronize(&g->dev[i]->base);
    for (int i = 0; i < made; i++)
        device_free(g->dev[i]);
    pthread_cond_destroy(&g->ev_cv);
    pthread_mutex_destroy(&g->ev_mu);
    free(g->dev);
    free(g);
}

/* Only the handle mt_backend_create returned destroys; the others are borrowed. */
static void sim_destroy(mt_backend_t *b)
{
    sim_t *s = to_sim(b);
    if (s->owner)
        group_free(s->group, s->group->n);
}

static int sim_device_count(const mt_backend_t *b)
{
    return to_sim(b)->group->n;
}

static mt_backend_t *sim_get_device(mt_backend_t *b, int ordinal)
{
    return &to_sim(b)->group->dev[ordinal]->base;
}

/* Makes device `ordinal` of group g. */
static int device_new(sim_group_t *g, int ordinal, const mt_backend_cfg_t *cfg, size_t capacity,
                      uint64_t mcost, uint64_t fcost, sim_t **out)
{
    sim_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return MT_ENOMEM;
    s->base.ops = &sim_ops;
    s->base.device = ordinal;
    s->base.log = cfg->log;
    s->base.log_ud = cfg->log_ud;
    s->group = g;
    s->capacity = capacity;
    s->fail_rc = MT_ENOMEM;
    /* Room for SIM_VA_FACTOR x capacity of address space (see the top of the file), at
     * least the capacity itself. */
    size_t va = capacity <= SIM_VA_MAX / SIM_VA_FACTOR ? capacity * SIM_VA_FACTOR : SIM_VA_MAX;
    s->dev_size = (va > capacity ? va : capacity) & ~(SIM_MIN_ALIGN - 1);
    atomic_init(&s->malloc_cost_ns, mcost);
    atomic_init(&s->free_cost_ns, fcost);
    int rc = MT_ENOMEM;
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        goto fail_mutex;
    if (pthread_mutex_init(&s->cost_mu, NULL) != 0)
        goto fail_cost_mutex;
    /* The device range is 2 MiB aligned so big segments get 2 MiB pages, as on a GPU. */
    s->map_len = align_up(s->dev_size, SIM_VM_GRANULARITY);
    s->dev_base = mmap_aligned(s->map_len, SIM_VM_GRANULARITY, PROT_READ | PROT_WRITE);
    if (s->dev_base == NULL)
        goto fail_map;
    if (ranges_insert_at(&s->free_r, 0, (sim_range_t){0, s->dev_size}) != 0)
        goto fail_ranges;
    rc = mt__sim_streams_init(s);
    if (rc != 0)
        goto fail_streams;
    *out = s;
    return 0;

fail_streams:
fail_ranges:
    free(s->free_r.v);
    munmap(s->dev_base, s->map_len);
fail_map:
    pthread_mutex_destroy(&s->cost_mu);
fail_cost_mutex:
    pthread_mutex_destroy(&s->mu);
fail_mutex:
    free(s);
    return rc;
}

int mt__backend_sim_create(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    *out = NULL;
    mt_backend_cfg_t def = mt_backend_cfg_default();
    size_t capacity = cfg->sim_capacity ? cfg->sim_capacity : def.sim_capacity;
    if (capacity == 0)
        capacity = SIM_DEFAULT_CAPACITY;
    if (capacity < SIM_MIN_ALIGN)
        return MT_EINVAL;
    /* UINT64_MAX asks for the environment's value (see mt_backend_cfg_t). */
    uint64_t mcost =
        cfg->sim_malloc_cost_ns == UINT64_MAX ? def.sim_malloc_cost_ns : cfg->sim_malloc_cost_ns;
    uint64_t fcost =
        cfg->sim_free_cost_ns == UINT64_MAX ? def.sim_free_cost_ns : cfg->sim_free_cost_ns;
    uint64_t pcost =
        cfg->sim_peer_cost_ns == UINT64_MAX ? def.sim_peer_cost_ns : cfg->sim_peer_cost_ns;
    uint64_t bw = cfg->sim_peer_bandwidth ? cfg->sim_peer_bandwidth : def.sim_peer_bandwidth;
    int n = cfg->sim_devices ? cfg->sim_devices : def.sim_devices;
    if (n < 1 || n > MT_SIM_MAX_DEVICES || bw == 0) {
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "memtrace: sim backend: %d devices asked for, the sim models 1..%d", n,
                 MT_SIM_MAX_DEVICES);
        return MT_EINVAL;
    }
    if (cfg->device >= n) {
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "memtrace: device ordinal %d out of range: the sim backend has %d device%s",
                 cfg->device, n, n == 1 ? "" : "s");
        return MT_EINVAL;
    }

    sim_group_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return MT_ENOMEM;
    g->n = n;
    atomic_init(&g->peer_cost_ns, pcost);
    atomic_init(&g->peer_bandwidth, bw);
    g->dev = calloc((size_t)n, sizeof *g->dev);
    if (g->dev == NULL)
        goto fail_dev;
    if (pthread_mutex_init(&g->ev_mu, NULL) != 0)
        goto fail_ev_mu;
    if (pthread_cond_init(&g->ev_cv, NULL) != 0)
        goto fail_ev_cv;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = device_new(g, i, cfg, capacity, mcost, fcost, &g->dev[i]);
        if (rc != 0) {
            group_free(g, i); /* frees the group's mutex and cv too */
            return rc;
        }
    }
    g->dev[cfg->device]->owner = true;
    *out = &g->dev[cfg->device]->base;
    return 0;

fail_ev_cv:
    pthread_mutex_destroy(&g->ev_mu);
fail_ev_mu:
    free(g->dev);
fail_dev:
    free(g);
    return MT_ENOMEM;
}

/* The synchronisations as the backend's user calls them, through the test hook. */
static int sim_stream_synchronize(mt_backend_t *b, mt_stream_t *st)
{
    call_hook(to_sim(b), "stream_synchronize");
    return mt__sim_stream_synchronize(b, st);
}

static int sim_device_synchronize(mt_backend_t *b)
{
    call_hook(to_sim(b), "device_synchronize");
    return mt__sim_device_synchronize(b);
}

static int sim_event_synchronize(mt_backend_t *b, mt_event_t *ev)
{
    call_hook(to_sim(b), "event_synchronize");
    return mt__sim_event_synchronize(b, ev);
}

static int sim_event_create(mt_backend_t *b, mt_event_t **out)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    bool fail = s->ev_fail_next > 0;
    if (fail)
        s->ev_fail_next--;
    pthread_mutex_unlock(&s->mu);
    return fail ? MT_ENOMEM : mt__sim_event_create(b, out);
}

static const mt_backend_ops_t sim_ops = {
    .name = "sim",
    .kind = MT_BACKEND_SIM,
    .destroy = sim_destroy,
    .malloc = sim_malloc,
    .free = sim_free,
    .mem_get_info = sim_mem_get_info,
    .is_device_ptr = sim_is_device_ptr,
    .vm_granularity = sim_vm_granularity,
    .vm_reserve = sim_vm_reserve,
    .vm_release = sim_vm_release,
    .vm_map = sim_vm_map,
    .vm_unmap = sim_vm_unmap,
    .stream_create = mt__sim_stream_create,
    .stream_destroy = mt__sim_stream_destroy,
    .stream_synchronize = sim_stream_synchronize,
    .stream_wait_event = mt__sim_stream_wait_event,
    .launch_host_func = mt__sim_launch_host_func,
    .memcpy_async = mt__sim_memcpy_async,
    .memset_async = mt__sim_memset_async,
    .device_synchronize = sim_device_synchronize,
    .event_create = sim_event_create,
    .event_destroy = mt__sim_event_destroy,
    .event_record = mt__sim_event_record,
    .event_query = mt__sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .event_time_ns = mt__sim_event_time_ns,
    .host_malloc = sim_host_malloc,
    .host_free = sim_host_free,
    .device_count = sim_device_count,
    .get_device = sim_get_device,
    .memcpy_peer_async = mt__sim_memcpy_peer_async,
};

/* ---- test hooks (backend_sim.h) ---- */

bool mt__sim_is_sim(const mt_backend_t *b)
{
    return b != NULL && b->ops == &sim_ops;
}

int mt__sim_inject_malloc_failures(mt_backend_t *b, unsigned n)
{
    return mt__sim_inject_malloc_errors(b, n, MT_ENOMEM);
}

int mt__sim_inject_malloc_errors(mt_backend_t *b, unsigned n, int rc)
{
    if (!mt__sim_is_sim(b) || rc >= 0)
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    s->fail_next = n;
    s->fail_rc = rc;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mt__sim_set_call_hook(mt_backend_t *b, void (*cb)(void *ud, const char *call), void *ud)
{
    if (!mt__sim_is_sim(b))
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    s->call_cb = cb;
    s->call_ud = ud;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mt__sim_inject_event_failures(mt_backend_t *b, unsigned n)
{
    if (!mt__sim_is_sim(b))
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    s->ev_fail_next = n;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void mt__sim_set_costs(mt_backend_t *b, uint64_t malloc_ns, uint64_t free_ns)
{
    if (!mt__sim_is_sim(b))
        return;
    sim_t *s = to_sim(b);
    atomic_store_explicit(&s->malloc_cost_ns, malloc_ns, memory_order_relaxed);
    atomic_store_explicit(&s->free_cost_ns, free_ns, memory_order_relaxed);
}

size_t mt__sim_used_bytes(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return 0;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    size_t r = s->seg_bytes + s->mapped_bytes;
    pthread_mutex_unlock(&s->mu);
    return r;
}

size_t mt__sim_segment_count(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return 0;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    size_t r = s->used_r.n;
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* Merges the sorted free and used arrays and checks they tile [0, dev_size). */
static int check_locked(const sim_t *s)
{
    size_t fi = 0, ui = 0, pos = 0, used = 0, mapped = 0;
    bool prev_free = false;
    while (fi < s->free_r.n || ui < s->used_r.n) {
        bool take_free =
            ui == s->used_r.n || (fi < s->free_r.n && s->free_r.v[fi].off < s->used_r.v[ui].off);
        const sim_range_t *r = take_free ? &s->free_r.v[fi++] : &s->used_r.v[ui++];
        if (r->off != pos || r->size == 0 || r->size % SIM_MIN_ALIGN != 0)
            return MT_EIO;
        if (take_free && prev_free)
            return MT_EIO; /* two touching free ranges were not merged */
        prev_free = take_free;
        if (!take_free)
            used += r->size;
        pos += r->size;
    }
    if (pos != s->dev_size || used != s->seg_bytes)
        return MT_EIO;
    for (const sim_vm_t *v = s->vms; v != NULL; v = v->next) {
        size_t n = 0;
        for (size_t i = 0; i < v->npages; i++)
            n += page_mapped(v, i);
        if (n != v->nmapped || v->base % SIM_VM_GRANULARITY != 0)
            return MT_EIO;
        mapped += n * SIM_VM_GRANULARITY;
    }
    if (mapped != s->mapped_bytes || s->seg_bytes + s->mapped_bytes > s->capacity)
        return MT_EIO;
    return 0;
}

int mt__sim_check(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    int rc = check_locked(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
