/* One core per memory operation (core.c), shared by the runtime hooks (hooks_runtime.c)
 * and the driver hooks (hooks_driver.c). A core holds the rules: the guard, which device
 * and context serve the call, stream capture, the unknown-pointer rule (a pointer inside
 * one of memtrace's segments is never passed on), the stream-ordered set, the sticky-error
 * check and the counters. An entry point keeps only its signature, how its API names the
 * device and the stream, the call to the real function when the core says so, and the
 * translation of the core's answer into cudaError_t or CUresult.
 *
 * A core returns 0 or MT_E* when memtrace served the call, with op->drv the driver's own
 * code behind a failure (CUresult's number, 0 when none), or one of the two below. */
#ifndef MT_PRELOAD_CORE_H
#define MT_PRELOAD_CORE_H

#include <stdbool.h>
#include <stddef.h>

#include "preload/outside.h"
#include "preload/preload.h"

/* Not memtrace's to serve: the entry point calls the real runtime or driver (for a free,
 * then tells the core how it went: mt__preload_op_forwarded). */
#define MT_PRELOAD_REAL 1
/* A stream-ordered call on a capturing stream: the real one makes the graph's node, and
 * its memory is the graph's, so nothing is reported. */
#define MT_PRELOAD_CAPTURE 2

/* What a core learns besides its return. */
typedef struct mt__preload_op_s {
    int drv;  /* the driver's code behind a failure, or 0 */
    int dev;  /* malloc: the device the call was for; -1 for a context that is not primary */
    bool fwd; /* free: fr holds the record of memory that went to the driver */
    mt__preload_fwd_t fr;
} mt__preload_op_t;

/* What a core asks of the API it serves, in that API's own terms (held may be NULL). */
typedef struct mt__preload_api_s {
    /* The device the call is for, made ready as the API would (the runtime binds the
     * thread's context): 0, or MT_E* with *drv the driver's code behind it. */
    int (*device)(int *dev, int *drv);
    /* The sticky error the API knows the context holds, as a driver code, or 0. */
    int (*held)(void);
} mt__preload_api_t;

/* Driver failures that are no shortage of memory: faults of the context, a dead or
 * uninitialised driver, no context, the rules of stream capture. */
bool mt__preload_fatal_code(int drv);
/* The faults that corrupt a context: every later call returns them until a reset. */
bool mt__preload_sticky_code(int drv);

/* size bytes of device memory for the program. stream: the program's handle (NULL: the
 * legacy stream); ordered: a stream-ordered call (served from the stream's device's pool,
 * unless the program set its own pool there). *out on 0. */
int mt__preload_op_malloc(const mt__preload_api_t *api, size_t size, void *stream, bool ordered,
                          void **out, mt__preload_op_t *op);
/* Frees p, not NULL. sync: the synchronous form (it synchronises the device, except for
 * stream-ordered memory); stream: the async form's stream (NULL: the legacy stream).
 * can_forward: the API has a real free for pointers memtrace did not hand out (cuda
 * mode); without one such a pointer is an error. Unknown pointers are counted. */
int mt__preload_op_free(void *p, void *stream, bool sync, bool can_forward, mt__preload_op_t *op);
/* After MT_PRELOAD_REAL from mt__preload_op_free: the real free of p succeeded or not. */
void mt__preload_op_forwarded(void *p, const mt__preload_op_t *op, bool ok);
/* The driver's free and total bytes of dev, the cache's unallocated bytes counted free. */
int mt__preload_op_mem_info(int dev, size_t *free_b, size_t *total_b);
/* Device dev's primary context is reset or destroyed (cudaDeviceReset,
 * cuDevicePrimaryCtxReset, cuCtxDestroy): its cache and state are dropped first, while the
 * context can still free them, and the sticky errors known before no longer count. */
void mt__preload_op_reset(int dev);
/* How many resets there were so far, on any thread, through either API. */
unsigned mt__preload_op_resets(void);
/* Pinned host memory of b (flags reach the driver), counted; size > 0. */
int mt__preload_op_host_alloc(mt_backend_t *b, size_t size, unsigned flags, void **out);
/* Frees pinned host memory memtrace gave; MT_PRELOAD_REAL for other memory (cuda mode). */
int mt__preload_op_host_free(void *p);

/* Sim mode: the work of the served copies, memsets, streams and events on b, whose
 * stream handles and events are the backend's own. Work on the default stream (stream
 * NULL or a legacy or per-thread handle) drains the device first and is waited for;
 * other work is waited for when sync. */
int mt__preload_op_copy(mt_backend_t *b, void *dst, const void *src, size_t n,
                        mt_memcpy_kind_e kind, void *stream, bool sync);
int mt__preload_op_copy_peer(mt_backend_t *b, void *dst, int dst_dev, const void *src, int src_dev,
                             size_t n, void *stream, bool sync);
int mt__preload_op_set(mt_backend_t *b, void *dst, int value, size_t n, void *stream, bool sync);
int mt__preload_op_event_record(mt_backend_t *b, void *event, void *stream);
int mt__preload_op_stream_sync(mt_backend_t *b, void *stream);
/* The single-call operations: obj the stream or event (destroy, query, sync), *out the
 * one made (create). */
typedef enum mt__preload_sim_e {
    MT_PRELOAD_STREAM_CREATE,
    MT_PRELOAD_STREAM_DESTROY,
    MT_PRELOAD_EVENT_CREATE,
    MT_PRELOAD_EVENT_QUERY,
    MT_PRELOAD_EVENT_SYNC,
    MT_PRELOAD_EVENT_DESTROY,
    MT_PRELOAD_DEVICE_SYNC,
} mt__preload_sim_e;
int mt__preload_op_sim(mt_backend_t *b, mt__preload_sim_e what, void *obj, void **out);

#endif
