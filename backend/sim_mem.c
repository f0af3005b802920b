/* Device memory of the sim backend: segments, virtual memory and pinned host memory.
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
 * whose pages are mprotect'ed read/write on map.
 * All bookkeeping lives on the host; nothing is ever written into "device" memory. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend_sim.h"
#include "backend/sim_internal.h"
#include "util/grow.h"

#define SIM_BIG_ALIGN SIM_VM_GRANULARITY /* sizes >= 2 MiB get 2 MiB pages */
#define SIM_VA_FACTOR 4                  /* device address range / capacity */
#define SIM_VA_MAX    ((size_t)1 << 44)  /* 16 TiB: far below the 47-bit user space */

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
    sim_range_t *nv = mt__grow(r->v, &r->cap, r->n + extra, sizeof *nv, 16);
    if (nv == NULL)
        return MT_ENOMEM;
    r->v = nv;
    return 0;
}

/* ---- device memory ---- */

static sim_t *to_sim(const mt_backend_t *b)
{
    return (sim_t *)b;
}

/* Rounded size and alignment of a segment of `size` bytes, as the device accounts it. */
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

int mt__sim_malloc(mt_backend_t *b, size_t size, void **out)
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
    } else if (mt__sim_managed_evict_locked(s, rounded),
               rounded > s->capacity - s->context - s->others - s->seg_bytes - s->mapped_bytes -
                             s->mstats.device_bytes) {
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

int mt__sim_free(mt_backend_t *b, void *ptr)
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

int mt__sim_process_used(mt_backend_t *b, uint64_t *bytes)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    *bytes = s->context + s->seg_bytes + s->mapped_bytes + s->mstats.device_bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mt__sim_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    *free_bytes = s->capacity - s->context - s->others - s->seg_bytes - s->mapped_bytes -
                  s->mstats.device_bytes;
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

bool mt__sim_is_device_ptr(const mt_backend_t *b, const void *ptr)
{
    sim_t *s = to_sim(b);
    uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)s->dev_base;
    if (p >= base && p - base < s->dev_size)
        return true;
    pthread_mutex_lock(&s->mu);
    bool r = vm_containing(s, p) != NULL || mt__sim_managed_span_locked(s, ptr, 1);
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
        } else {
            ok = mt__sim_managed_span_locked(s, ptr, n); /* reachable from the device */
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ---- virtual memory ---- */

size_t mt__sim_vm_granularity(const mt_backend_t *b)
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

int mt__sim_vm_reserve(mt_backend_t *b, size_t size, void **out)
{
    mt__sim_call_hook(to_sim(b), "vm_reserve");
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
    /* The device's address space, as cuMemAddressReserve runs out of it. */
    bool room = s->va_space == 0 || (s->va_used <= s->va_space && size <= s->va_space - s->va_used);
    if (room) {
        s->va_used += size;
        v->next = s->vms;
        s->vms = v;
    }
    pthread_mutex_unlock(&s->mu);
    if (!room) {
        munmap(p, size);
        free(v->mapped);
        free(v);
        return MT_ENOMEM;
    }
    *out = p;
    return 0;
}

int mt__sim_vm_release(mt_backend_t *b, void *base, size_t size)
{
    mt__sim_call_hook(to_sim(b), "vm_release");
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
    else {
        *pp = v->next;
        s->va_used -= size;
    }
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

int mt__sim_vm_map(mt_backend_t *b, void *addr, size_t size)
{
    mt__sim_call_hook(to_sim(b), "vm_map");
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
    mt__sim_managed_evict_locked(s, size);
    if (size > s->capacity - s->context - s->others - s->seg_bytes - s->mapped_bytes -
                   s->mstats.device_bytes) {
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

int mt__sim_vm_unmap(mt_backend_t *b, void *addr, size_t size)
{
    mt__sim_call_hook(to_sim(b), "vm_unmap");
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

int mt__sim_host_malloc(mt_backend_t *b, size_t size, void **out)
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

int mt__sim_host_free(mt_backend_t *b, void *ptr)
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

/* ---- setup and teardown ---- */

int mt__sim_mem_init(sim_t *s)
{
    /* Room for SIM_VA_FACTOR x capacity of address space (see the top of the file), at
     * least the capacity itself. */
    size_t va =
        s->capacity <= SIM_VA_MAX / SIM_VA_FACTOR ? s->capacity * SIM_VA_FACTOR : SIM_VA_MAX;
    s->dev_size = (va > s->capacity ? va : s->capacity) & ~(SIM_MIN_ALIGN - 1);
    /* The device range is 2 MiB aligned so big segments get 2 MiB pages, as on a GPU. */
    s->map_len = align_up(s->dev_size, SIM_VM_GRANULARITY);
    s->dev_base = mmap_aligned(s->map_len, SIM_VM_GRANULARITY, PROT_READ | PROT_WRITE);
    if (s->dev_base == NULL)
        goto fail_map;
    if (ranges_insert_at(&s->free_r, 0, (sim_range_t){0, s->dev_size}) != 0)
        goto fail_ranges;
    return 0;

fail_ranges:
    munmap(s->dev_base, s->map_len);
fail_map:
    return MT_ENOMEM;
}

void mt__sim_mem_fini(sim_t *s)
{
    mt__sim_managed_fini(s);
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
}

/* ---- checker (backend_sim.h) ---- */

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
    if (mapped != s->mapped_bytes ||
        s->context + s->others + s->seg_bytes + s->mapped_bytes + s->mstats.device_bytes >
            s->capacity)
        return MT_EIO;
    return mt__sim_managed_check_locked(s);
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
