/* The memory operations of the drop-in, once for both APIs (see core.h): the runtime's
 * and the driver's entry points differ only in their signatures, how they name the device
 * and the stream, and their codes. */
#include <cuda.h>

#include "preload/core.h"
#include "preload/hooks_graph.h"

bool mt__preload_sticky_code(int drv)
{
    switch (drv) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
        return true;
    default:
        return false;
    }
}

bool mt__preload_fatal_code(int drv)
{
    switch (drv) {
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
        return true;
    default:
        return mt__preload_sticky_code(drv);
    }
}

/* A served call's answer: rc, with the driver's code behind a failure. */
static int served(mt__preload_op_t *op, int rc)
{
    op->drv = rc != 0 ? mt__preload_driver_result() : 0;
    return rc;
}

/* ---- device memory ---- */

int mt__preload_op_malloc(const mt__preload_api_t *api, size_t size, void *stream, bool ordered,
                          void **out, mt__preload_op_t *op)
{
    *op = (mt__preload_op_t){.dev = -1};
    /* On a capturing stream a device malloc of ours would break the capture. */
    void *graph = NULL;
    if (ordered && mt__preload_capture_graph(stream, &graph))
        return MT_PRELOAD_CAPTURE;
    int dev = -1;
    int rc = api->device(&dev, &op->drv);
    if (rc != 0)
        return rc;
    /* A stream-ordered allocation comes from the pool of the stream's device. */
    if (ordered)
        dev = mt__preload_stream_device(stream, dev);
    op->dev = dev;
    /* A context's own (cuCtxCreate), or a pool the program set: the real runtime's or
     * driver's, which keep what was asked of them. Decided before the device's allocator
     * is made, which would make its primary context. */
    if (dev < 0 || (ordered && mt__preload_own_pool(dev)) || !mt__preload_current_is_primary())
        return MT_PRELOAD_REAL;
    mt_alloc_t *a = NULL;
    rc = mt__preload_alloc(dev, &a);
    /* A cache hit makes no driver call: without this it would succeed where the real
     * allocation fails with the context's fault. */
    int held = api->held != NULL ? api->held() : 0;
    if (held != 0) {
        op->drv = held;
        return MT_EIO;
    }
    void *q = NULL;
    mt_stream_t *s = NULL;
    mt__guard_enter();
    if (rc == 0)
        rc = mt__preload_stream(mt_alloc_backend(a), stream, &s);
    if (rc == 0) {
        rc = mt_alloc_malloc(a, size, s, mt__preload_tag(), &q);
        if (rc == MT_ENOMEM && mt__preload_release_managed()) /* the same device memory */
            rc = mt_alloc_malloc(a, size, s, mt__preload_tag(), &q);
    }
    mt__guard_leave();
    /* Every other allocation takes its pointer from the ordered set too, so that an
     * address reused after a device reset is not mistaken for a stream-ordered one. */
    if (rc == 0 && ordered)
        mt__preload_ordered_add(q);
    else if (rc == 0)
        (void)mt__preload_ordered_take(q);
    served(op, rc);
    if (rc == MT_ENOMEM && !mt__preload_fatal_code(op->drv)) /* a fault is no OOM */
        mt__preload_note_oom(a, size);
    if (rc == 0)
        *out = q;
    return rc;
}

int mt__preload_op_free(void *p, void *stream, bool sync, bool can_forward, mt__preload_op_t *op)
{
    *op = (mt__preload_op_t){.dev = -1};
    mt_alloc_t *a = NULL;
    int rc = mt__preload()->init_rc;
    mt__guard_enter();
    if (rc == 0)
        rc = mt__preload_alloc_of(p, &a);
    /* A double free, or a pointer inside one of our segments: the program's error, counted
     * below and answered as the real call would; never passed on, as the real free would
     * release the whole segment under its live blocks. */
    bool ours = rc == MT_ENOENT && mt__preload_held(p);
    mt__guard_leave();
    /* Memory that went to the driver (or, on sim, to the backend directly): its record is
     * taken first, so the address cannot be handed out and recorded again meanwhile. */
    uint64_t key = (uintptr_t)p;
    op->fwd = rc == MT_ENOENT && !ours && mt__preload_outside_take(false, key, &op->fr);
    if (rc == MT_ENOENT && !ours && can_forward && !mt__preload()->sim)
        return MT_PRELOAD_REAL; /* managed, pitch, pool, graph memory: the real free's */
    if (op->fwd) {
        int frc = mt__preload_outside_sim_free(p, &op->fr);
        mt__preload_outside_settle(key, &op->fr, frc == 0);
        return served(op, frc);
    }
    /* During capture a stream-ordered free takes only a graph allocation, which ours never
     * are: the real call refuses it, and invalidates the capture, as without memtrace. */
    void *graph = NULL;
    if (rc == 0 && !sync && can_forward && mt__preload_capture_graph(stream, &graph))
        return MT_PRELOAD_CAPTURE;
    int kept = rc == 0 ? mt__preload_graph_keep(a, p) : 0; /* a captured graph uses it */
    if (kept != 0) {
        if (kept < 0)
            atomic_fetch_add(&mt__preload()->unknown_frees, 1);
        return served(op, kept < 0 ? kept : 0);
    }
    mt__guard_enter();
    mt_stream_t *s = NULL;
    if (rc == 0 && stream != NULL)
        rc = mt__preload_stream(mt_alloc_backend(a), stream, &s);
    /* The synchronous free synchronises the device; programs may rely on it, so it still
     * does, except for stream-ordered memory, where CUDA documents no sync: its reuse is
     * ordered after the legacy stream instead. An async free orders the reuse after its
     * stream's work, the legacy stream's too (s NULL). */
    bool ordered = rc == 0 && mt__preload_ordered_take(p);
    if (rc == 0 && sync && !ordered)
        rc = mt_device_synchronize(mt_alloc_backend(a));
    if (rc == 0 && (s != NULL || !sync || ordered) &&
        mt_alloc_block_info(a, p, NULL, NULL, NULL) == 0)
        rc = mt_alloc_record_stream(a, p, s);
    if (rc == 0)
        rc = mt_alloc_free(a, p);
    mt__guard_leave();
    if (rc == MT_ENOENT)
        atomic_fetch_add(&mt__preload()->unknown_frees, 1);
    return served(op, rc);
}

void mt__preload_op_forwarded(void *p, const mt__preload_op_t *op, bool ok)
{
    if (op->fwd)
        mt__preload_outside_settle((uintptr_t)p, &op->fr, ok);
}

/* What the program may still get: free device memory plus what the cache holds unused. */
int mt__preload_op_mem_info(int dev, size_t *free_b, size_t *total_b)
{
    mt_alloc_t *a = NULL;
    int rc = mt__preload_alloc(dev, &a);
    mt_alloc_stats_t st;
    mt__guard_enter();
    if (rc == 0)
        rc = mt_backend_mem_get_info(mt_alloc_backend(a), free_b, total_b);
    if (rc == 0)
        rc = mt_alloc_stats(a, &st);
    mt__guard_leave();
    if (rc == 0) {
        *free_b += st.total_free;
        if (*free_b > *total_b)
            *free_b = *total_b;
    }
    return rc;
}

/* Context resets and destroys of a primary context so far, through either API. */
static _Atomic unsigned resets;

void mt__preload_op_reset(int dev)
{
    mt__preload_drop_device(dev);
    atomic_fetch_add(&resets, 1);
}

unsigned mt__preload_op_resets(void)
{
    return atomic_load(&resets);
}

/* ---- pinned host memory ---- */

int mt__preload_op_host_alloc(mt_backend_t *b, size_t size, unsigned flags, void **out)
{
    mt__guard_enter();
    int rc = mt_backend_host_malloc_flags(b, size, flags, out);
    mt__guard_leave();
    if (rc == 0) {
        atomic_fetch_add(&mt__preload()->host_allocs, 1);
        atomic_fetch_add(&mt__preload()->host_bytes, size);
    }
    return rc;
}

int mt__preload_op_host_free(void *p)
{
    mt__guard_enter();
    int rc = mt__preload_host_free(p);
    mt__guard_leave();
    return rc == MT_ENOENT && !mt__preload()->sim ? MT_PRELOAD_REAL : rc;
}

/* ---- work on streams, served on sim ---- */

/* On sim, work the program puts on the default stream (0, the legacy and per-thread
 * handles) is done synchronously after draining the device: stricter than CUDA's
 * legacy-stream barrier, never weaker, so programs stay correct. Begin raises the guard,
 * end lowers it. */
static int work_begin(mt_backend_t *b, void *stream, mt_stream_t **s)
{
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, s);
    if (rc == 0 && *s == NULL)
        rc = mt_device_synchronize(b);
    return rc;
}

static int work_end(mt_backend_t *b, mt_stream_t *s, bool sync, int rc)
{
    if (rc == 0 && (sync || s == NULL))
        rc = mt_stream_synchronize(b, s);
    mt__guard_leave();
    return rc;
}

int mt__preload_op_copy(mt_backend_t *b, void *dst, const void *src, size_t n,
                        mt_memcpy_kind_e kind, void *stream, bool sync)
{
    mt_stream_t *s = NULL;
    int rc = work_begin(b, stream, &s);
    if (rc == 0)
        rc = mt_memcpy_async(b, dst, src, n, kind, s);
    return work_end(b, s, sync, rc);
}

int mt__preload_op_copy_peer(mt_backend_t *b, void *dst, int dst_dev, const void *src, int src_dev,
                             size_t n, void *stream, bool sync)
{
    mt_stream_t *s = NULL;
    int rc = work_begin(b, stream, &s);
    if (rc == 0)
        rc = mt_memcpy_peer_async(b, dst, dst_dev, src, src_dev, n, s);
    return work_end(b, s, sync, rc);
}

int mt__preload_op_set(mt_backend_t *b, void *dst, int value, size_t n, void *stream, bool sync)
{
    mt_stream_t *s = NULL;
    int rc = work_begin(b, stream, &s);
    if (rc == 0)
        rc = mt_memset_async(b, dst, value, n, s);
    return work_end(b, s, sync, rc);
}

int mt__preload_op_event_record(mt_backend_t *b, void *event, void *stream)
{
    mt_stream_t *s = NULL;
    int rc = work_begin(b, stream, &s);
    if (rc == 0)
        rc = mt_event_record(b, event, s);
    mt__guard_leave();
    return rc;
}

/* The legacy default stream waits for every blocking stream. */
int mt__preload_op_stream_sync(mt_backend_t *b, void *stream)
{
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    if (rc == 0)
        rc = s == NULL ? mt_device_synchronize(b) : mt_stream_synchronize(b, s);
    mt__guard_leave();
    return rc;
}

int mt__preload_op_sim(mt_backend_t *b, mt__preload_sim_e what, void *obj, void **out)
{
    int rc = 0;
    mt_stream_t *s = NULL;
    mt_event_t *ev = NULL;
    mt__guard_enter();
    switch (what) {
    case MT_PRELOAD_STREAM_CREATE:
        rc = mt_stream_create(b, &s);
        if (rc == 0)
            *out = s;
        break;
    case MT_PRELOAD_STREAM_DESTROY:
        mt_stream_destroy(b, (mt_stream_t **)&obj);
        break;
    case MT_PRELOAD_EVENT_CREATE:
        rc = mt_event_create(b, &ev);
        if (rc == 0)
            *out = ev;
        break;
    case MT_PRELOAD_EVENT_QUERY:
        rc = mt_event_query(b, obj);
        break;
    case MT_PRELOAD_EVENT_SYNC:
        rc = mt_event_synchronize(b, obj);
        break;
    case MT_PRELOAD_EVENT_DESTROY:
        mt_event_destroy(b, (mt_event_t **)&obj);
        break;
    case MT_PRELOAD_DEVICE_SYNC:
        rc = mt_device_synchronize(b);
        break;
    }
    mt__guard_leave();
    return rc;
}
