/* Internals of the fake driver shared by its two files: fake_libcuda.c (contexts,
 * streams, events, memory, VMM, the test controls) and fake_libcuda_more.c (what a real
 * driver does beyond the backend's needs: cuGetProcAddress and per-thread variants,
 * reset and teardown, capture, other allocations, ranges and IPC). Not an API. */
#ifndef MT_TESTS_CUDA_FAKE_INTERNAL_H
#define MT_TESTS_CUDA_FAKE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#define FAKE_API __attribute__((visibility("default")))
#define GRAN     ((size_t)2 << 20)
#define MAXLOG   8192
#define MAXDEV   64
#define MAXUCTX  8 /* contexts made by cuCtxCreate, live at once */
#define MAXSTACK 16
#define DEVSPAN  ((size_t)16 << 30) /* device address space, never reused */

typedef struct fake_call_s {
    const char *name;
    uint64_t a, b;
} fake_call_t;

typedef struct fake_ctx_s {
    int dev;
    struct fake_stream_s *null_stream; /* the context's default stream, made on demand */
    CUresult sticky;                   /* a fault every later call returns, or 0 */
    unsigned epoch;                    /* bumped by a reset: per-thread streams made before go */
    bool created; /* made by cuCtxCreate and not destroyed yet (slots from MAXDEV on) */
} fake_ctx_t;

/* Pending iff done_gen < rec_gen. refs counts queued operations naming the event, so a
 * destroyed event lives on until they ran. */
typedef struct fake_event_s {
    struct fake_event_s *next;
    fake_ctx_t *ctx;
    unsigned flags;
    uint64_t rec_gen, done_gen;
    uint64_t t_ns; /* host time the event's last record completed */
    int refs;
    bool dead;
    bool captured; /* last recorded into a capture: cuEventQuery/Synchronize refuse it
                    * (CUDA_ERROR_CAPTURED_EVENT) until it is recorded outside one */
} fake_event_t;

enum { OP_COPY, OP_SET, OP_HOSTFN, OP_RECORD, OP_WAIT, OP_FREE };

typedef struct fake_op_s {
    struct fake_op_s *next;
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    CUhostFn fn;
    void *ud;
    fake_event_t *ev;
    uint64_t gen; /* OP_RECORD: the generation it completes; OP_WAIT: the one it awaits */
} fake_op_t;

/* A stream: a FIFO run by its own worker thread. The worker frees the stream after
 * cuStreamDestroy once the queue is empty. */
typedef struct fake_stream_s {
    struct fake_stream_s *next; /* live streams */
    fake_ctx_t *ctx;
    fake_op_t *head, *tail;
    bool busy; /* the head is running */
    bool dead;
    bool blocking; /* a per-thread stream, or created without CU_STREAM_NON_BLOCKING: work
                    * on the legacy stream waits for it */
    pthread_t thread;
    /* capture: 0 none, 1 active, 2 invalidated; the graph collects the recorded work */
    int capture;
    CUstreamCaptureMode mode;
    uint64_t capture_id;
    struct fake_graph_s *graph;
    pthread_t capturer;
} fake_stream_t;

/* A graph made by stream capture (or cuGraphCreate, captured into with
 * cuStreamBeginCaptureToGraph): only how many operations it holds. */
typedef struct fake_graph_s {
    size_t nodes;
    bool created; /* made by cuGraphCreate: a failed capture into it leaves it to its owner */
} fake_graph_t;

typedef struct fake_blk_s {
    struct fake_blk_s *next;
    void *p;
    size_t size;
    bool host;
    fake_ctx_t *ctx; /* NULL for stream-ordered allocations (no context owns them) */
    int dev;         /* the device whose memory it is (a stream-ordered one: its stream's) */
    bool graph;      /* a graph allocation: cuMemAllocAsync on a capturing stream */
} fake_blk_t;

typedef struct fake_handle_s {
    size_t size;
    size_t gran;           /* its device's granularity: mappings of it are aligned to it */
    unsigned long long ht; /* CUmemAllocationHandleType bits it may be exported as */
    int dev;               /* prop->location.id: the device whose memory it is */
} fake_handle_t;

/* A reservation [base, base + size) and the mappings inside it. */
typedef struct fake_map_s {
    struct fake_map_s *next;
    CUdeviceptr p;
    size_t size;
    uint64_t access; /* bit d: cuMemSetAccess opened it to device d (d < 64) */
    int dev;         /* the device of the handle mapped here */
} fake_map_t;

typedef struct fake_resv_s {
    struct fake_resv_s *next;
    CUdeviceptr base;
    size_t size;
    fake_map_t *maps;
} fake_resv_t;

/* The whole fake device. used = bytes of live cuMemAlloc blocks + cuMemCreate handles;
 * used <= capacity at all times. Every queue and event field is guarded by mu; cv is
 * broadcast on every change of a queue, an event or the hold state. */
typedef struct fake_state_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t capacity;
    size_t used;
    int devices;
    fake_ctx_t ctxs[MAXDEV + MAXUCTX]; /* primary ones [0, devices), then cuCtxCreate's */
    fake_blk_t *blks;
    fake_stream_t *streams;
    fake_event_t *events;
    fake_resv_t *resvs;
    fake_call_t log[MAXLOG];
    size_t nlog;
    const char *fail_name; /* the next fail_count calls of fail_name return fail_res */
    unsigned fail_count;
    CUresult fail_res;
    uintptr_t dev_base, shadow_base; /* DEVSPAN bytes each; shadow of d is d - dev + shadow */
    size_t dev_next;                 /* bytes of the device range handed out */
    bool hold;
    int drain;      /* synchronising calls waiting: queues run despite hold */
    long ctx_depth; /* pushes minus pops, all threads */
    bool inited;    /* cuInit ran in this process (or the parent of this fork child) */
    bool forked;    /* this process is a fork child of one that used the driver */
    uint64_t next_capture_id;
    unsigned long long handle_types; /* OR of every cuMemCreate's requestedHandleTypes */
    uint64_t peer[MAXDEV];           /* bit j of peer[i]: device i enabled access to device j */
} fake_state_t;
extern fake_state_t fake;

/* The calling thread's context stack, and whether it is a stream worker running a host
 * function (where the driver refuses every call). */
extern __thread fake_ctx_t *stack[MAXSTACK];
extern __thread int depth;
extern __thread bool in_hostfn;
/* The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode);
 * CU_STREAM_CAPTURE_MODE_GLOBAL until changed. */
extern __thread CUstreamCaptureMode tls_capture_mode;
/* The calling thread's per-thread default stream of each context, and the context epoch
 * it was made in. */
extern __thread struct fake_stream_s *ptds[MAXDEV + MAXUCTX];
extern __thread unsigned ptds_epoch[MAXDEV + MAXUCTX];

#define ENTER(name, a, b)                                                                          \
    do {                                                                                           \
        CUresult r_ = enter(name, (uint64_t)(a), (uint64_t)(b));                                   \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
    } while (0)

/* ENTER, then CUDA_ERROR_INVALID_CONTEXT unless a context is current, and the context's
 * sticky fault if it has one. */
#define ENTER_CTX(name, a, b)                                                                      \
    do {                                                                                           \
        ENTER(name, a, b);                                                                         \
        if (cur() == NULL)                                                                         \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
        if (cur()->sticky != CUDA_SUCCESS)                                                         \
            return cur()->sticky;                                                                  \
    } while (0)

#define UNSAFE()                                                                                   \
    do {                                                                                           \
        CUresult u_ = unsafe_call();                                                               \
        if (u_ != CUDA_SUCCESS)                                                                    \
            return u_;                                                                             \
    } while (0)

/* Helpers of fake_libcuda.c; "Caller holds mu" where its comment says so. */
fake_ctx_t *cur(void);
CUresult enter(const char *name, uint64_t a, uint64_t b);
CUresult unsafe_call(void);
bool ctx_idle(void *ctx);
bool stream_idle(void *s);
void event_unref(fake_event_t *e);
void give(size_t size);
void dev_drop(uintptr_t p, size_t size);
CUresult blk_new(void **out, size_t size, bool host);
CUresult blk_free(void *p, bool host);
fake_stream_t *stream_of(CUstream h, CUresult *r);
fake_stream_t *stream_any(CUstream h, CUresult *r);
CUresult submit(CUstream h, fake_op_t op);
fake_ctx_t *ctx_of(CUcontext c);
size_t mapped_bytes(const struct fake_resv_s *v, CUdeviceptr p, size_t size);
bool capture_forbids(void);
CUresult capture_begin(CUstream h, CUstreamCaptureMode mode, struct fake_graph_s *into);
/* fake_libcuda_graph.c: graphs made empty, captured into, instantiated. */
FAKE_API CUresult cuGraphCreate(CUgraph *g, unsigned int flags);
FAKE_API CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode *deps,
                                              const CUgraphEdgeData *edges, size_t n,
                                              CUstreamCaptureMode mode);
FAKE_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph g, const CUgraphNode *deps,
                                                   const CUgraphEdgeData *edges, size_t n,
                                                   CUstreamCaptureMode mode);
FAKE_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
FAKE_API CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS *params);
FAKE_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS *params);
FAKE_API CUresult cuGraphExecDestroy(CUgraphExec e);
FAKE_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
bool is_dev(uintptr_t p);
fake_event_t *event_of(CUevent h);
void drain_until(bool (*done)(void *), void *arg);
/* fake_libcuda_managed.c: remembers a cuMemAllocManaged range (prefetch and advice check
 * their ranges against these and the live blocks). */
void fake_managed_note(uintptr_t p, size_t size);

#endif
