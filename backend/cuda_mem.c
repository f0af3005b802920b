/* Memory of the cuda backend: device segments (cuMemAlloc), virtual memory for
 * expandable segments (cuMemAddressReserve, one cuMemCreate per page) and pinned host
 * memory (cuMemHostAlloc). Each call pushes the device's primary context (CALL). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_cuda.h"
#include "backend/cuda_internal.h"
#include "util/grow.h"

static cuda_t *C(const mt_backend_t *b)
{
    return (cuda_t *)b;
}

static int grow(void **v, size_t *cap, size_t n, size_t elem)
{
    void *nv = mt__grow(*v, cap, n + 1, elem, 16);
    if (nv == NULL)
        return MT_ENOMEM;
    *v = nv;
    return 0;
}

/* ---- relaxed capture mode (see mt__cuda_capture_enter) ---- */

static _Thread_local unsigned tls_capture; /* enter minus leave on this thread */

void mt__cuda_capture_enter(void)
{
    tls_capture++;
}

void mt__cuda_capture_leave(void)
{
    tls_capture--;
}

/* cuMemAlloc, cuMemCreate and cuMemMap are "potentially unsafe" during a capture: in
 * global mode (any thread's global capture, or the thread's own non-relaxed one) the
 * driver refuses them and invalidates the capture. A request serving a capture switches
 * the thread to relaxed mode around them; *old receives the mode to restore (relax_end).
 * False: nothing switched. */
static bool relax_begin(cuda_t *c, CUstreamCaptureMode *old)
{
    if (tls_capture == 0 || c->drv.ThreadExchangeStreamCaptureMode == NULL)
        return false;
    *old = CU_STREAM_CAPTURE_MODE_RELAXED;
    return c->drv.ThreadExchangeStreamCaptureMode(old) == CUDA_SUCCESS;
}

static void relax_end(cuda_t *c, bool on, CUstreamCaptureMode old)
{
    if (on)
        (void)c->drv.ThreadExchangeStreamCaptureMode(&old);
}

/* ---- device memory ---- */

int mt__cuda_malloc(mt_backend_t *b, size_t size, void **out)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    int rc = grow((void **)&c->segs, &c->segs_cap, c->nsegs, sizeof *c->segs);
    pthread_mutex_unlock(&c->mu);
    if (rc != 0)
        return rc;
    CUdeviceptr p = 0;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    bool relaxed = relax_begin(c, &mode);
    rc = CALL(c, MemAlloc(&p, size));
    relax_end(c, relaxed, mode);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = grow((void **)&c->segs, &c->segs_cap, c->nsegs, sizeof *c->segs);
    if (rc == 0)
        c->segs[c->nsegs++] = (cuda_seg_t){p, size, false};
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        CALL(c, MemFree(p));
        return rc;
    }
    *out = (void *)(uintptr_t)p;
    return 0;
}

int mt__cuda_free(mt_backend_t *b, void *ptr)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->nsegs && (c->segs[i].ptr != (CUdeviceptr)(uintptr_t)ptr || c->segs[i].managed))
        i++;
    if (i == c->nsegs) {
        pthread_mutex_unlock(&c->mu);
        return MT_ENOENT;
    }
    c->segs[i] = c->segs[--c->nsegs];
    pthread_mutex_unlock(&c->mu);
    /* cuMemFree synchronises the device itself, which is the documented contract. A
     * release made for a capture's request (its OOM recovery) runs relaxed, like the
     * allocation: the capturing stream has no work queued to wait for. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    bool relaxed = relax_begin(c, &mode);
    int rc = CALL(c, MemFree((CUdeviceptr)(uintptr_t)ptr));
    relax_end(c, relaxed, mode);
    return rc;
}

int mt__cuda_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes)
{
    return CALL(C(b), MemGetInfo(free_bytes, total_bytes));
}

bool mt__cuda_is_device_ptr(const mt_backend_t *b, const void *ptr)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->nsegs && !found; i++)
        found = p >= c->segs[i].ptr && p - c->segs[i].ptr < c->segs[i].size;
    for (cuda_vm_t *v = c->vms; v != NULL && !found; v = v->next)
        if (p >= v->base && p - v->base < v->size)
            found = v->pages[(p - v->base) / c->granularity] != 0;
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* ---- virtual memory (expandable segments) ---- */

CUmemAllocationProp mt__cuda_pinned_prop(const cuda_t *c)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = c->dev;
    prop.requestedHandleTypes = c->handle_types;
    return prop;
}

/* Read-write access to [p, p + size), all mapped, for c's own device and every device
 * that enabled peer access to it: cudaDeviceEnablePeerAccess covers cuMemAlloc memory
 * only, VMM mappings need each accessor named. Caller holds mu. */
static int grant_access(cuda_t *c, CUdeviceptr p, size_t size)
{
    int n = c->group ? c->group->n : 1;
    CUmemAccessDesc *acc = calloc((size_t)n + 1, sizeof *acc);
    if (acc == NULL)
        return MT_ENOMEM;
    size_t k = 0;
    acc[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[k++].location.id = c->dev;
    for (int i = 0; c->peer_access != NULL && i < n; i++)
        if (c->peer_access[i] && i != c->dev) {
            acc[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            acc[k++].location.id = i;
        }
    for (size_t i = 0; i < k; i++)
        acc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int rc = CALL(c, MemSetAccess(p, size, acc, k));
    free(acc);
    return rc;
}

size_t mt__cuda_vm_granularity(const mt_backend_t *b)
{
    return C(b)->granularity;
}

int mt__cuda_vm_reserve(mt_backend_t *b, size_t size, void **out)
{
    cuda_t *c = C(b);
    cuda_vm_t *v = calloc(1, sizeof *v);
    if (v == NULL)
        return MT_ENOMEM;
    v->size = size;
    v->npages = size / c->granularity;
    v->pages = calloc(v->npages, sizeof *v->pages);
    if (v->pages == NULL) {
        free(v);
        return MT_ENOMEM;
    }
    int rc = CALL(c, MemAddressReserve(&v->base, size, c->granularity, 0, 0));
    if (rc != 0) {
        free(v->pages);
        free(v);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    v->next = c->vms;
    c->vms = v;
    pthread_mutex_unlock(&c->mu);
    *out = (void *)(uintptr_t)v->base;
    return 0;
}

/* The reservation holding [p, p + size), or NULL. Caller holds mu. */
static cuda_vm_t *vm_find(cuda_t *c, CUdeviceptr p, size_t size)
{
    for (cuda_vm_t *v = c->vms; v != NULL; v = v->next)
        if (p >= v->base && p - v->base <= v->size && size <= v->size - (p - v->base))
            return v;
    return NULL;
}

int mt__cuda_vm_release(mt_backend_t *b, void *base, size_t size)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)base;
    pthread_mutex_lock(&c->mu);
    cuda_vm_t **pp = &c->vms;
    while (*pp != NULL && ((*pp)->base != p || (*pp)->size != size))
        pp = &(*pp)->next;
    cuda_vm_t *v = *pp;
    int rc = v == NULL ? MT_ENOENT : 0;
    for (size_t i = 0; rc == 0 && i < v->npages; i++)
        if (v->pages[i] != 0)
            rc = MT_EBUSY; /* the contract: unmap every page first */
    if (rc == 0)
        *pp = v->next;
    pthread_mutex_unlock(&c->mu);
    if (rc != 0)
        return rc;
    rc = CALL(c, MemAddressFree(v->base, v->size));
    free(v->pages);
    free(v);
    return rc;
}

/* Unmaps and releases pages [first, first + n) of v, all mapped. One cuMemUnmap per
 * page: the driver only unmaps whole mappings, and each page is its own. Caller holds
 * mu. Returns the first failure but carries on, so no page is left half-accounted. */
static int unmap_pages(cuda_t *c, cuda_vm_t *v, size_t first, size_t n)
{
    int rc = 0;
    for (size_t i = first; i < first + n; i++) {
        int r = CALL(c, MemUnmap(v->base + i * c->granularity, c->granularity));
        if (r == 0)
            r = CALL(c, MemRelease(v->pages[i]));
        if (r != 0 && rc == 0)
            rc = r;
        v->pages[i] = 0;
    }
    return rc;
}

/* One physical allocation per page, so that any page-aligned sub-range can be unmapped
 * later: cuMemUnmap must cover whole mappings, and the allocator shrinks expandable
 * segments page by page. Access is granted once for the whole range. */
int mt__cuda_vm_map(mt_backend_t *b, void *addr, size_t size)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
    CUmemAllocationProp prop = mt__cuda_pinned_prop(c);
    pthread_mutex_lock(&c->mu);
    cuda_vm_t *v = vm_find(c, p, size);
    size_t first = v ? (p - v->base) / c->granularity : 0;
    size_t n = size / c->granularity;
    int rc = v == NULL ? MT_ENOENT : 0;
    for (size_t i = first; rc == 0 && i < first + n; i++)
        if (v->pages[i] != 0)
            rc = MT_EBUSY;
    size_t done = 0;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    bool relaxed = rc == 0 && relax_begin(c, &mode);
    while (rc == 0 && done < n) {
        CUmemGenericAllocationHandle h = 0;
        rc = CALL(c, MemCreate(&h, c->granularity, &prop, 0));
        if (rc != 0)
            break;
        rc = CALL(c, MemMap(p + done * c->granularity, c->granularity, 0, h, 0));
        if (rc != 0) {
            CALL(c, MemRelease(h));
            break;
        }
        v->pages[first + done++] = h;
    }
    if (rc == 0)
        rc = grant_access(c, p, size);
    if (rc != 0 && v != NULL && done > 0)
        unmap_pages(c, v, first, done); /* all or nothing */
    relax_end(c, relaxed, mode);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int mt__cuda_vm_unmap(mt_backend_t *b, void *addr, size_t size)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
    pthread_mutex_lock(&c->mu);
    cuda_vm_t *v = vm_find(c, p, size);
    size_t first = v ? (p - v->base) / c->granularity : 0;
    size_t n = size / c->granularity;
    int rc = v == NULL ? MT_ENOENT : 0;
    for (size_t i = first; rc == 0 && i < first + n; i++)
        if (v->pages[i] == 0)
            rc = MT_EINVAL;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    bool relaxed = rc == 0 && relax_begin(c, &mode);
    if (rc == 0)
        rc = unmap_pages(c, v, first, n);
    relax_end(c, relaxed, mode);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- pinned host memory ---- */

/* flags are cuMemHostAlloc's (the runtime's cudaHostAlloc flags have the same values);
 * portable is always added, since the backend serves every context of the process. */
int mt__cuda_host_malloc_flags(mt_backend_t *b, size_t size, unsigned flags, void **out)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    int rc = grow((void **)&c->hosts, &c->hosts_cap, c->nhosts, sizeof *c->hosts);
    pthread_mutex_unlock(&c->mu);
    if (rc != 0)
        return rc;
    void *p = NULL;
    rc = CALL(c, MemHostAlloc(&p, size, flags | CU_MEMHOSTALLOC_PORTABLE));
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = grow((void **)&c->hosts, &c->hosts_cap, c->nhosts, sizeof *c->hosts);
    if (rc == 0)
        c->hosts[c->nhosts++] = p;
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        CALL(c, MemFreeHost(p));
        return rc;
    }
    *out = p;
    return 0;
}

int mt__cuda_host_malloc(mt_backend_t *b, size_t size, void **out)
{
    return mt__cuda_host_malloc_flags(b, size, 0, out);
}

int mt__cuda_host_free(mt_backend_t *b, void *ptr)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->nhosts && c->hosts[i] != ptr)
        i++;
    bool found = i < c->nhosts;
    if (found)
        c->hosts[i] = c->hosts[--c->nhosts];
    pthread_mutex_unlock(&c->mu);
    if (!found)
        return MT_ENOENT;
    return CALL(c, MemFreeHost(ptr));
}
