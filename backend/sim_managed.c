/* Managed (unified) memory of the sim backend: cudaMallocManaged's pages that live on the
 * host or on the device and move when the other side touches them.
 *
 * The model (docs/managed-memory.md has the whole of it):
 * - An allocation is host memory (mmap'ed, 2 MiB aligned) cut into pages of
 *   SIM_MANAGED_PAGE bytes, the size of the driver's migration and eviction unit (its
 *   "VA block"); the allocation is accounted in whole pages.
 * - A page is unpopulated until first touched, then resident on the host, on the device, or
 *   on both (read-mostly copies). Device residency counts against the device's capacity,
 *   with segments and mapped pages.
 * - An access from a side that does not hold the page is a fault: the page migrates there
 *   (or is copied, for a read of a read-mostly page), unless advice says the accessor maps
 *   it instead: a device access to a page preferred on the host, or accessed-by the device,
 *   stays remote. The CPU cannot map device memory here, so a host access always migrates.
 * - A page needed on the device when the device is full pushes out the least recently used
 *   device pages (pages preferred on the device last); a cudaMalloc of the sim does the same
 *   (mt__sim_managed_evict_locked). When nothing can be pushed out the access is served
 *   remotely.
 * - Prefetches run on their stream (a host function) and cost bytes / bandwidth there;
 *   faults cost SIM_FAULT_NS each on top, on the stream of the copy that took them.
 * Only bookkeeping moves: the bytes stay where mmap put them, so every side reads them. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend_sim.h"
#include "backend/sim_internal.h"

#define SIM_MANAGED_PAGE SIM_VM_GRANULARITY /* 2 MiB */
#define SIM_FAULT_NS     20000u             /* one fault's fixed cost: the driver's round trip */

enum { ON_HOST = 1, ON_DEV = 2 };
enum { ADV_READ_MOSTLY = 1, ADV_PREF_HOST = 2, ADV_PREF_DEV = 4, ADV_ACCESSED_BY = 8 };

/* One page. Invariants: where is 0 (unpopulated) or a non-empty set of ON_*; both bits only
 * with ADV_READ_MOSTLY; PREF_HOST and PREF_DEV never both. */
typedef struct sim_mpage_s {
    uint8_t where;  /* ON_HOST | ON_DEV */
    uint8_t advice; /* ADV_* */
    uint64_t used;  /* sim_t.managed_tick at its last device-side use (LRU) */
} sim_mpage_t;

/* One managed allocation [base, base + npages * SIM_MANAGED_PAGE). */
struct sim_managed_s {
    struct sim_managed_s *next;
    uintptr_t base; /* SIM_MANAGED_PAGE aligned */
    size_t npages;
    sim_mpage_t *pages;
};

static sim_t *to_sim(const mt_backend_t *b)
{
    return (sim_t *)b;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Holds the calling stream worker for d ns (a copy engine busy migrating). */
static void spend_on_stream(uint64_t d)
{
    if (d == 0)
        return;
    uint64_t end = now_ns() + d;
    struct timespec ts = {(time_t)(end / 1000000000u), (long)(end % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* Modelled time of moving one page over the interconnect, ns. */
static uint64_t page_ns(const sim_t *s)
{
    uint64_t bw = atomic_load_explicit(&s->group->peer_bandwidth, memory_order_relaxed);
    return (uint64_t)((double)SIM_MANAGED_PAGE * 1e9 / (double)bw);
}

/* Caller holds mu. The allocation holding all of [p, p+n), or NULL. */
static sim_managed_t *find(const sim_t *s, uintptr_t p, size_t n)
{
    for (sim_managed_t *m = s->managed; m != NULL; m = m->next)
        if (p >= m->base && p - m->base < m->npages * SIM_MANAGED_PAGE)
            return n <= m->npages * SIM_MANAGED_PAGE - (p - m->base) ? m : NULL;
    return NULL;
}

bool mt__sim_managed_span_locked(const sim_t *s, const void *p, size_t n)
{
    return n > 0 && find(s, (uintptr_t)p, n) != NULL;
}

/* ---- residency (caller holds mu) ---- */

static size_t dev_room(const sim_t *s)
{
    size_t used = s->context + s->others + s->seg_bytes + s->mapped_bytes + s->mstats.device_bytes;
    return used < s->capacity ? s->capacity - used : 0;
}

static void set_where(sim_t *s, sim_mpage_t *pg, uint8_t where)
{
    if ((pg->where & ON_DEV) && !(where & ON_DEV))
        s->mstats.device_bytes -= SIM_MANAGED_PAGE;
    if (!(pg->where & ON_DEV) && (where & ON_DEV))
        s->mstats.device_bytes += SIM_MANAGED_PAGE;
    if ((pg->where & ON_HOST) && !(where & ON_HOST))
        s->mstats.host_bytes -= SIM_MANAGED_PAGE;
    if (!(pg->where & ON_HOST) && (where & ON_HOST))
        s->mstats.host_bytes += SIM_MANAGED_PAGE;
    pg->where = where;
    if (s->mstats.device_bytes > s->mstats.peak_device_bytes)
        s->mstats.peak_device_bytes = s->mstats.device_bytes;
}

/* The device page to push out: least recently used first, pages preferred on the device
 * only when no other is left. A pass larger than the device evicts its own first pages, as
 * the driver's thrashing does. */
static sim_mpage_t *victim(sim_t *s)
{
    sim_mpage_t *best = NULL;
    for (sim_managed_t *m = s->managed; m != NULL; m = m->next) {
        for (size_t i = 0; i < m->npages; i++) {
            sim_mpage_t *pg = &m->pages[i];
            if (!(pg->where & ON_DEV))
                continue;
            bool pref = pg->advice & ADV_PREF_DEV;
            bool best_pref = best != NULL && (best->advice & ADV_PREF_DEV);
            if (best == NULL || (best_pref && !pref) ||
                (best_pref == pref && pg->used < best->used))
                best = pg;
        }
    }
    return best;
}

/* Pushes device pages out until `need` bytes are free on the device or none is left to
 * push; returns the modelled time spent. */
static uint64_t evict(sim_t *s, size_t need)
{
    uint64_t ns = 0;
    while (dev_room(s) < need) {
        sim_mpage_t *pg = victim(s);
        if (pg == NULL)
            break;
        if (pg->where & ON_HOST) {
            set_where(s, pg, ON_HOST); /* a read-mostly copy: dropped, nothing moves */
            continue;
        }
        set_where(s, pg, ON_HOST);
        s->mstats.bytes_to_host += SIM_MANAGED_PAGE;
        s->mstats.evicted_bytes += SIM_MANAGED_PAGE;
        ns += page_ns(s);
    }
    s->mstats.migrate_ns += ns;
    return ns;
}

void mt__sim_managed_evict_locked(sim_t *s, size_t need)
{
    (void)evict(s, need);
}

/* Brings pg to the device (a copy if keep_host); false when the device has no room. */
static bool to_device(sim_t *s, sim_mpage_t *pg, bool keep_host, uint64_t *ns)
{
    *ns += evict(s, SIM_MANAGED_PAGE);
    if (dev_room(s) < SIM_MANAGED_PAGE)
        return false;
    if (pg->where != 0) {
        s->mstats.bytes_to_device += SIM_MANAGED_PAGE;
        *ns += page_ns(s);
    }
    set_where(s, pg, keep_host ? (uint8_t)(pg->where | ON_DEV) : (uint8_t)ON_DEV);
    return true;
}

static void to_host(sim_t *s, sim_mpage_t *pg, bool keep_dev, uint64_t *ns)
{
    if (pg->where & ON_DEV) {
        s->mstats.bytes_to_host += SIM_MANAGED_PAGE;
        *ns += page_ns(s);
    }
    set_where(s, pg, keep_dev ? (uint8_t)(pg->where | ON_HOST) : (uint8_t)ON_HOST);
}

/* One access of pages [first, last] of m from the device (dev) or the host; returns the
 * modelled time it cost. */
static uint64_t access_locked(sim_t *s, sim_managed_t *m, size_t first, size_t last, bool dev,
                              bool write)
{
    uint64_t ns = 0;
    uint8_t here = dev ? ON_DEV : ON_HOST;
    for (size_t i = first; i <= last; i++) {
        sim_mpage_t *pg = &m->pages[i];
        if (dev)
            pg->used = ++s->managed_tick;
        if (pg->where & here) {
            if (write && pg->where != here)
                set_where(s, pg, here); /* a write invalidates the other copy */
            continue;
        }
        bool maps =
            (pg->advice & ADV_PREF_HOST) || (pg->where != 0 && (pg->advice & ADV_ACCESSED_BY));
        if (dev && maps) {
            if (pg->where == 0)
                set_where(s, pg, ON_HOST); /* first touch at the preferred location */
            s->mstats.remote_accesses++;   /* the device maps the host page */
            continue;
        }
        s->mstats.faults++;
        ns += SIM_FAULT_NS;
        bool copy = (pg->advice & ADV_READ_MOSTLY) && !write;
        if (!dev) {
            to_host(s, pg, copy, &ns);
        } else if (!to_device(s, pg, copy, &ns)) {
            if (pg->where == 0)
                set_where(s, pg, ON_HOST); /* first touch where there is room */
            s->mstats.remote_accesses++;
        }
    }
    s->mstats.migrate_ns += ns;
    return ns;
}

/* ---- allocation ---- */

int mt__sim_managed_malloc(mt_backend_t *b, size_t size, void **out)
{
    sim_t *s = to_sim(b);
    size_t npages = size / SIM_MANAGED_PAGE + (size % SIM_MANAGED_PAGE != 0);
    if (npages > SIZE_MAX / SIM_MANAGED_PAGE - 1)
        return MT_ENOMEM;
    size_t len = npages * SIM_MANAGED_PAGE;
    sim_managed_t *m = calloc(1, sizeof *m);
    sim_mpage_t *pages = calloc(npages, sizeof *pages);
    uint8_t *raw = MAP_FAILED;
    if (m != NULL && pages != NULL)
        raw = mmap(NULL, len + SIM_MANAGED_PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        goto fail;
    /* Trim to an aligned range so that pages never straddle two allocations. */
    uintptr_t base = ((uintptr_t)raw + SIM_MANAGED_PAGE - 1) & ~(uintptr_t)(SIM_MANAGED_PAGE - 1);
    if (base > (uintptr_t)raw)
        munmap(raw, base - (uintptr_t)raw);
    size_t tail = (uintptr_t)raw + len + SIM_MANAGED_PAGE - (base + len);
    if (tail > 0)
        munmap((void *)(base + len), tail);
    m->base = base;
    m->npages = npages;
    m->pages = pages;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->fail_next > 0) {
        s->fail_next--;
        rc = s->fail_rc;
    } else {
        m->next = s->managed;
        s->managed = m;
        s->mstats.managed_bytes += len;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        munmap((void *)base, len);
        free(pages);
        free(m);
        return rc;
    }
    *out = (void *)base;
    return 0;

fail:
    free(pages);
    free(m);
    return MT_ENOMEM;
}

int mt__sim_managed_free(mt_backend_t *b, void *ptr)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    sim_managed_t *m = find(s, (uintptr_t)ptr, 1);
    bool known = m != NULL && m->base == (uintptr_t)ptr;
    pthread_mutex_unlock(&s->mu);
    if (!known)
        return MT_ENOENT;
    /* cudaFree synchronises the device: queued copies and prefetches may still touch it. */
    int rc = mt__sim_device_synchronize(b);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&s->mu);
    sim_managed_t **pp = &s->managed;
    while (*pp != NULL && (*pp)->base != (uintptr_t)ptr)
        pp = &(*pp)->next;
    m = *pp;
    if (m != NULL) {
        *pp = m->next;
        for (size_t i = 0; i < m->npages; i++)
            set_where(s, &m->pages[i], 0);
        s->mstats.managed_bytes -= m->npages * SIM_MANAGED_PAGE;
    }
    pthread_mutex_unlock(&s->mu);
    if (m == NULL)
        return MT_ENOENT; /* freed by another thread meanwhile */
    munmap((void *)m->base, m->npages * SIM_MANAGED_PAGE);
    free(m->pages);
    free(m);
    return 0;
}

void mt__sim_managed_fini(sim_t *s)
{
    while (s->managed != NULL) {
        sim_managed_t *m = s->managed;
        s->managed = m->next;
        munmap((void *)m->base, m->npages * SIM_MANAGED_PAGE);
        free(m->pages);
        free(m);
    }
}

bool mt__sim_is_managed(const mt_backend_t *b, const void *ptr, size_t n)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    bool r = mt__sim_managed_span_locked(s, ptr, n);
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* ---- work on streams ---- */

/* A prefetch or a device access, run when its stream reaches it. The range is looked up
 * again then: the allocation is found by address, not held. */
typedef struct sim_mwork_s {
    sim_t *s;
    uintptr_t p;
    size_t n;
    bool prefetch; /* else an access */
    bool to_dev;   /* prefetch: destination; access: always the device */
    bool write;    /* access */
} sim_mwork_t;

static uint64_t prefetch_locked(sim_t *s, sim_managed_t *m, size_t first, size_t last, bool dev)
{
    uint64_t ns = 0;
    for (size_t i = first; i <= last; i++) {
        sim_mpage_t *pg = &m->pages[i];
        bool copy = (pg->advice & ADV_READ_MOSTLY) != 0;
        if (dev) {
            pg->used = ++s->managed_tick;
            if (!(pg->where & ON_DEV) && !to_device(s, pg, copy, &ns))
                break; /* the device is all segments */
        } else if (pg->where != ON_HOST) {
            to_host(s, pg, copy, &ns);
        }
    }
    s->mstats.migrate_ns += ns;
    return ns;
}

static void run_work(void *ud)
{
    sim_mwork_t *w = ud;
    sim_t *s = w->s;
    uint64_t ns = 0;
    pthread_mutex_lock(&s->mu);
    sim_managed_t *m = find(s, w->p, w->n);
    if (m != NULL) {
        size_t first = (w->p - m->base) / SIM_MANAGED_PAGE;
        size_t last = (w->p + w->n - 1 - m->base) / SIM_MANAGED_PAGE;
        ns = w->prefetch ? prefetch_locked(s, m, first, last, w->to_dev)
                         : access_locked(s, m, first, last, true, w->write);
    }
    pthread_mutex_unlock(&s->mu);
    spend_on_stream(ns);
    free(w);
}

static int queue_work(sim_t *s, mt_stream_t *st, sim_mwork_t w)
{
    sim_mwork_t *q = malloc(sizeof *q);
    if (q == NULL)
        return MT_ENOMEM;
    *q = w;
    int rc = mt__sim_launch_host_func(&s->base, st, run_work, q);
    if (rc != 0)
        free(q);
    return rc;
}

int mt__sim_managed_touch_async(sim_t *s, mt_stream_t *st, const void *p, size_t n, bool write)
{
    pthread_mutex_lock(&s->mu);
    bool managed = mt__sim_managed_span_locked(s, p, n);
    pthread_mutex_unlock(&s->mu);
    if (!managed)
        return 0;
    return queue_work(s, st, (sim_mwork_t){s, (uintptr_t)p, n, false, true, write});
}

/* The sim keeps one device per managed allocation: the one it was allocated from. */
static int own_location(sim_t *s, int location)
{
    if (location == MT_MANAGED_HOST || location == s->base.device)
        return 0;
    mt__backend_log(&s->base, MT_LOG_ERROR,
                    "memtrace: sim managed memory of device %d lives on it or on the host, not "
                    "on device %d",
                    s->base.device, location);
    return MT_ENOTSUP;
}

int mt__sim_managed_prefetch(mt_backend_t *b, const void *ptr, size_t n, int location,
                             mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    int rc = own_location(s, location);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&s->mu);
    bool managed = mt__sim_managed_span_locked(s, ptr, n);
    if (managed) {
        s->mstats.prefetches++;
        s->mstats.prefetch_bytes += n;
    }
    pthread_mutex_unlock(&s->mu);
    if (!managed)
        return MT_EINVAL;
    return queue_work(s, st,
                      (sim_mwork_t){s, (uintptr_t)ptr, n, true, location != MT_MANAGED_HOST, 0});
}

int mt__sim_managed_advise(mt_backend_t *b, const void *ptr, size_t n, int advice, int location)
{
    sim_t *s = to_sim(b);
    int rc = advice > MT_ADVISE_UNSET_READ_MOSTLY ? own_location(s, location) : 0;
    if (rc != 0)
        return rc;
    bool dev = location != MT_MANAGED_HOST;
    pthread_mutex_lock(&s->mu);
    sim_managed_t *m = find(s, (uintptr_t)ptr, n);
    if (m == NULL) {
        pthread_mutex_unlock(&s->mu);
        return MT_EINVAL;
    }
    s->mstats.advises++;
    size_t first = ((uintptr_t)ptr - m->base) / SIM_MANAGED_PAGE;
    size_t last = ((uintptr_t)ptr + n - 1 - m->base) / SIM_MANAGED_PAGE;
    for (size_t i = first; i <= last; i++) {
        sim_mpage_t *pg = &m->pages[i];
        switch (advice) {
        case MT_ADVISE_SET_READ_MOSTLY:
            pg->advice |= ADV_READ_MOSTLY;
            break;
        case MT_ADVISE_UNSET_READ_MOSTLY:
            pg->advice &= (uint8_t)~ADV_READ_MOSTLY;
            if (pg->where == (ON_HOST | ON_DEV))
                set_where(s, pg, ON_DEV); /* the copies collapse to the device's */
            break;
        case MT_ADVISE_SET_PREFERRED_LOCATION:
            pg->advice &= (uint8_t) ~(ADV_PREF_HOST | ADV_PREF_DEV);
            pg->advice |= dev ? ADV_PREF_DEV : ADV_PREF_HOST;
            break;
        case MT_ADVISE_UNSET_PREFERRED_LOCATION:
            pg->advice &= (uint8_t) ~(ADV_PREF_HOST | ADV_PREF_DEV);
            break;
        case MT_ADVISE_SET_ACCESSED_BY:
            if (dev) /* the host's own mapping of host pages needs no advice */
                pg->advice |= ADV_ACCESSED_BY;
            break;
        case MT_ADVISE_UNSET_ACCESSED_BY:
            if (dev)
                pg->advice &= (uint8_t)~ADV_ACCESSED_BY;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mt__sim_managed_stats(mt_backend_t *b, mt_managed_stats_t *out)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    *out = s->mstats;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ---- test hook and checker ---- */

int mt__sim_managed_access(mt_backend_t *b, const void *ptr, size_t n, int location, bool write)
{
    if (!mt__sim_is_sim(b) || ptr == NULL || n == 0)
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    int rc = own_location(s, location);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&s->mu);
    sim_managed_t *m = find(s, (uintptr_t)ptr, n);
    if (m != NULL)
        access_locked(s, m, ((uintptr_t)ptr - m->base) / SIM_MANAGED_PAGE,
                      ((uintptr_t)ptr + n - 1 - m->base) / SIM_MANAGED_PAGE,
                      location != MT_MANAGED_HOST, write);
    pthread_mutex_unlock(&s->mu);
    return m != NULL ? 0 : MT_EINVAL;
}

int mt__sim_managed_check_locked(const sim_t *s)
{
    uint64_t dev = 0, host = 0, total = 0;
    for (const sim_managed_t *m = s->managed; m != NULL; m = m->next) {
        if (m->base % SIM_MANAGED_PAGE != 0 || m->npages == 0)
            return MT_EIO;
        total += m->npages * SIM_MANAGED_PAGE;
        for (size_t i = 0; i < m->npages; i++) {
            const sim_mpage_t *pg = &m->pages[i];
            if (pg->where == (ON_HOST | ON_DEV) && !(pg->advice & ADV_READ_MOSTLY))
                return MT_EIO;
            if ((pg->advice & ADV_PREF_HOST) && (pg->advice & ADV_PREF_DEV))
                return MT_EIO;
            dev += (pg->where & ON_DEV) ? SIM_MANAGED_PAGE : 0;
            host += (pg->where & ON_HOST) ? SIM_MANAGED_PAGE : 0;
        }
    }
    if (dev != s->mstats.device_bytes || host != s->mstats.host_bytes ||
        total != s->mstats.managed_bytes || dev > s->mstats.peak_device_bytes)
        return MT_EIO;
    return 0;
}
