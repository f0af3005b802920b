/* memtrace events: what the allocator (and the RNN engine through it) reports.
 *
 * The allocator defines this small sink interface and knows nothing of who listens;
 * the profiler implements it (shared-memory ring, daemon). A sink's emit() is called on
 * the allocating thread, with the allocator's lock held or inside a thread cache's fast
 * operation (under a recording lock of the allocator's: one allocator's calls never
 * overlap, and come in the order of the state changes they tell): it must not block, must
 * not allocate, and must not call back into the allocator. */
#ifndef MEMTRACE_EVENT_H
#define MEMTRACE_EVENT_H

#include <stdbool.h>

#include "memtrace/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_event_kind_e {
    MT_EV_ALLOC = 1,          /* block handed out: addr, size (rounded), requested */
    MT_EV_FREE_REQUESTED = 2, /* program freed it; may wait for stream events */
    MT_EV_FREE_COMPLETED = 3, /* block back in a free bin */
    MT_EV_SEGMENT_ALLOC = 4,  /* backend malloc of a segment: addr, size */
    MT_EV_SEGMENT_FREE = 5,   /* backend free of a segment */
    MT_EV_SEGMENT_MAP = 6,    /* expandable segment: pages mapped at addr, size */
    MT_EV_SEGMENT_UNMAP = 7,  /* expandable segment: pages unmapped */
    MT_EV_OOM = 8,            /* requested = request, size = free device bytes */
    MT_EV_RESERVE = 9,        /* warm-up reservation: size = bytes reserved */
    MT_EV_EMPTY_CACHE = 10,   /* size = bytes released to the device */
    MT_EV_CONFIG = 11,        /* allocator created; size = capacity */
    MT_EV_STATS = 12,         /* periodic (stats_period_ms): size = peak allocated bytes,
                                 requested = bytes requested by live allocations */
    MT_EV_MARK = 13,          /* program marker: addr = mt_mark_e, size = payload */
    MT_EV_COMPACTION = 14,    /* RNN weights compacted: size = bytes copied */
    MT_EV_GAP = 15,           /* consumer side: size = number of events lost */
    MT_EV_TAG_LABEL = 16,     /* user tag named: tag = id, label in addr/size/requested */
    MT_EV_MARK_NAMED = 17,    /* program's named marker: name packed as a label, in addr/size
                                 only (at most MT_EVENT_MARK_NAME_MAX bytes; requested = 0) */
    MT_EV_STACK_REF = 18,     /* the call stack of the MT_EV_ALLOC right after it (same batch):
                                 size = stack id (mt_stack_id_e), addr, pool, device = the
                                 alloc's; allocated, reserved = the alloc's totals */
    MT_EV_SETTING = 19,       /* a setting changed at run time (mt_alloc_set_settings): addr =
                               * mt_setting_e, size = new value, requested = old value */
    MT_EV_MANAGED = 20,       /* managed memory (cfg.managed_memory): tag = mt_managed_op_e,
                               * the rest as that enum says */
    MT_EV_DEVICE = 21,        /* the device's memory as the driver reports it (mem_get_info):
                               * size = used bytes (total - free), requested = total bytes,
                               * addr = this process's bytes on it (mt_backend_process_used;
                               * UINT64_MAX: not known).
                               * Sent at create (before any segment: the context's share), after
                               * each segment or outside change, at an OOM and with the stats */
    MT_EV_OUTSIDE_ALLOC = 22, /* device memory allocated outside the allocator, seen by the
                               * caller (the drop-in): addr, size; tag = library id (0: no
                               * library named), see MT_EV_LIBRARY_LABEL */
    MT_EV_OUTSIDE_FREE = 23,  /* that memory freed: addr, size and tag as at its alloc */
    MT_EV_LIBRARY_LABEL = 24, /* library id named: tag = id (1..MT_TAG_MAX - 1, the process's),
                               * label packed as a tag's */
} mt_event_kind_e;

#define MT_EV_KIND_COUNT 25 /* kinds are < MT_EV_KIND_COUNT */

/* What an MT_EV_MANAGED event records (in tag). allocated and reserved are the allocator's
 * totals, as in every event (reserved: the managed bytes its segments hold). */
typedef enum mt_managed_op_e {
    MT_MANAGED_PREFETCH = 1,  /* addr, size = the range; requested = the location (a device
                               * ordinal; UINT64_MAX = the host) */
    MT_MANAGED_ADVISE = 2,    /* addr, size = the range; requested = advice (mt_managed_advice_e)
                               * | location << 32 (as uint32_t; 0xffffffff = the host) */
    MT_MANAGED_RESIDENCY = 3, /* the device's managed pages changed: addr = faults so far,
                               * size = bytes resident on the device now, requested = bytes
                               * migrated so far (both ways) */
} mt_managed_op_e;
#define MT_EVENT_MARK_NAME_MAX 16

/* The settings an MT_EV_SETTING names (in addr), with the unit of its values: bytes
 * (UINT64_MAX = unlimited), parts per million of a fraction, a count, or 0/1. */
typedef enum mt_setting_e {
    MT_SETTING_MAX_SPLIT_SIZE = 1,         /* bytes */
    MT_SETTING_MAX_NON_SPLIT_ROUNDING = 2, /* bytes */
    MT_SETTING_GC_THRESHOLD = 3,           /* ppm of the limit; 0 = off */
    MT_SETTING_MEMORY_FRACTION = 4,        /* ppm of the device */
    MT_SETTING_RELEASE_ON_OOM = 5,         /* 0/1 */
    MT_SETTING_RELEASE_SMALLER = 6,        /* 0/1 */
    MT_SETTING_RELEASE_TO_FIT = 7,         /* 0/1 */
    MT_SETTING_PLACE_HIGH = 8,             /* bytes; 0 = off */
    MT_SETTING_ROUNDUP_0 = 16,             /* + interval i: roundup_power2_divisions[i] */
    MT_SETTING_END = 32,
} mt_setting_e;

/* Markers the RNN engine and programs put into the stream (MT_EV_MARK, in addr). */
typedef enum mt_mark_e {
    MT_MARK_ITERATION = 1, /* size = iteration number */
    MT_MARK_FORWARD_BEGIN = 2,
    MT_MARK_FORWARD_END = 3,
    MT_MARK_BACKWARD_BEGIN = 4,
    MT_MARK_BACKWARD_END = 5,
    MT_MARK_WARMUP_BEGIN = 6,
    MT_MARK_WARMUP_END = 7,
} mt_mark_e;

typedef enum mt_pool_e {
    MT_POOL_NONE = 0,
    MT_POOL_SMALL = 1, /* requests <= 1 MiB, 2 MiB segments */
    MT_POOL_LARGE = 2,
    MT_POOL_HOST = 3, /* pinned host cache */
} mt_pool_e;

/* One event, 64 bytes, fixed layout: it is written as is into shared memory.
 * allocated/reserved are the allocator's totals after the event. */
typedef struct mt_event_rec_s {
    uint64_t seq;       /* per-producer sequence number, set by the recorder; gaps = drops */
    uint64_t time_ns;   /* CLOCK_MONOTONIC, ns */
    uint64_t addr;      /* device address (or marker id) */
    uint64_t size;      /* bytes (rounded block or segment size, or kind-specific) */
    uint64_t requested; /* bytes asked for, before rounding */
    uint64_t allocated; /* allocator total after the event, bytes */
    uint64_t reserved;  /* allocator total after the event, bytes */
    uint32_t stream;    /* mt_stream_id() */
    uint8_t kind;       /* mt_event_kind_e */
    uint8_t pool;       /* mt_pool_e */
    uint8_t tag;        /* mt_tag (see alloc.h) */
    uint8_t device;     /* device ordinal */
} mt_event_rec_t;

_Static_assert(sizeof(mt_event_rec_t) == 64, "events are one cache line");

/* Each allocator reports its own running totals (allocated/reserved). A process may have
 * several: one per device, and a pinned host cache per device (pool host). Consumers
 * sum the latest totals over sources to get the process's figures. */
#define MT_EVENT_SOURCES 512
static inline unsigned mt_event_source(const mt_event_rec_t *ev)
{
    return (ev->pool == MT_POOL_HOST ? 256u : 0u) + ev->device;
}

/* Call stacks (docs/telemetry.md, "Call stacks"). A stack id is per producer process:
 * 0 = no stack recorded, 1..MT_STACK_ID_MAX name an entry of the producer's stack table,
 * MT_STACK_ID_OVERFLOW = a stack was captured but the table was full (counted, not stored). */
#define MT_STACK_ID_MAX      (1u << 18)
#define MT_STACK_ID_OVERFLOW UINT32_MAX
#define MT_STACK_DEPTH_MAX   64 /* frames kept per stack (native and Python) */

/* Which allocations get a call stack (MEMTRACE_STACKS, the allocator config key "stacks",
 * mt_prof_set_stacks). Sampled is by bytes: every allocation of at least
 * MT_STACK_SAMPLE_MEAN bytes, and otherwise one at the end of each exponentially
 * distributed run of allocated bytes of that mean (per thread), so that big allocations
 * are always taken and small ones in proportion to their bytes. */
typedef enum mt_stacks_e {
    MT_STACKS_DEFAULT = -1, /* allocator config: the sink's (profiler's) setting */
    MT_STACKS_OFF = 0,
    MT_STACKS_SAMPLED = 1, /* the default */
    MT_STACKS_ALL = 2,
} mt_stacks_e;
#define MT_STACK_SAMPLE_MEAN (512u << 10) /* bytes */

typedef struct mt_event_sink_s {
    void (*emit)(void *ud, const mt_event_rec_t *ev); /* ev is borrowed */
    void *ud;
    /* Optional: n events of one operation at once, in order (ev[0..n) borrowed), so a
     * recorder can claim their slots together. NULL: emit is called for each. */
    void (*emit_n)(void *ud, const mt_event_rec_t *ev, size_t n);
    /* Optional: an allocator that ran out of memory asks where the snapshot of that OOM
     * (the n-th on device, counted from 1) is kept, to name it in its message. Called as
     * emit is (under the allocator's lock: no blocking, no allocation); writes a
     * NUL-terminated note into buf ("" or NULL member: nothing to say). */
    void (*oom_note)(void *ud, unsigned device, uint64_t n, char *buf, size_t len);
    /* Optional: the call stack of an allocation of bytes (pool: MT_POOL_HOST for pinned
     * host memory, else MT_POOL_NONE; mode: mt_stacks_e, the allocator's setting), asked on the
     * allocating thread BEFORE the allocator's lock is taken (it may unwind, intern and take the
     * sink's own locks). Returns a stack id, or 0 for none (not sampled, stacks off). With an id,
     * the allocator emits MT_EV_STACK_REF then MT_EV_ALLOC in one batch. */
    uint32_t (*stack)(void *ud, uint64_t bytes, int pool, int mode);
    /* Optional: false when the sink records nothing and never will (a profiler created
     * off). An allocator or cache given such a sink, asked once at create, works as with
     * none: it emits nothing and keeps its thread caches on. NULL: it records. */
    bool (*recording)(void *ud);
    /* Optional: an allocator whose thread caches keep their recent events back, to hand
     * them over many at a time (docs/allocator-tcache.md, "Recording"), registers at create
     * (on = true) and unregisters at destroy (on = false) how to make it hand them over:
     * push(arg), which takes the allocator's lock. A sink's flush calls push first, so that
     * it flushes what was recorded up to then. Not called under the allocator's lock. */
    void (*source)(void *ud, void (*push)(void *arg), void *arg, bool on);
    /* Optional, both or neither: emit_n in two steps, so that a caller that orders its
     * batches under a lock of its own holds it only for the first. claim takes n places in
     * the sink's order (tok: the sink's) and returns true, or returns false when it cannot
     * now (the caller then calls emit_n, still in order); write fills what claim took, and
     * may run while another thread's write of another claim does. */
    bool (*claim)(void *ud, size_t n, uint64_t tok[2]);
    void (*write)(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n);
    /* Optional, with claim: memtrace's own recorder's. Instead of write, fills what claim
     * took for a thread cache's batch (n = its events) with the batch in compact form, a
     * header and its entries (memtrace's util/evbatch.h), from which the events are made
     * where they are read. NULL for any other sink. */
    void (*write_batch)(void *ud, const uint64_t tok[2], const void *hdr, const void *ents);
} mt_event_sink_t;

/* Whether s is a sink that records (not NULL, with emit, and recording() not false). */
static inline bool mt_event_sink_records(const mt_event_sink_t *s)
{
    return s != NULL && s->emit != NULL && (s->recording == NULL || s->recording(s->ud));
}

/* ---- tag labels (MT_EV_TAG_LABEL) ----
 * Events carry only a tag id; the allocator announces each user tag's label once, when it
 * is registered (mt_alloc_tag_register, every call, so calling it again re-announces it),
 * so that consumers (the daemon, the local log, the report) can name the tag. The label's
 * bytes fill addr, size and requested in memory order (MT_EVENT_LABEL_MAX bytes, NUL-padded,
 * not NUL-terminated when it uses all of them); the ring is read on the same machine, so
 * the byte order needs no care. A longer label is cut to at most MT_EVENT_LABEL_MAX bytes
 * at a UTF-8 sequence boundary (a multi-byte character is never split); two labels that
 * agree on those bytes look the same to consumers. */
#define MT_EVENT_LABEL_MAX 24

/* Bytes of label that fit: the largest n <= MT_EVENT_LABEL_MAX with label[n] not a UTF-8
 * continuation byte (or n = strlen(label) when that is shorter). */
static inline size_t mt_event_label_fit(const char *label)
{
    size_t n = 0;
    while (n < MT_EVENT_LABEL_MAX && label[n] != '\0')
        n++;
    if (n == MT_EVENT_LABEL_MAX)
        while (n > 0 && ((unsigned char)label[n] & 0xc0u) == 0x80u)
            n--;
    return n;
}

/* Packs label into ev's addr, size and requested (cut as described above). */
static inline void mt_event_label_pack(mt_event_rec_t *ev, const char *label)
{
    unsigned char b[MT_EVENT_LABEL_MAX] = {0};
    size_t n = mt_event_label_fit(label);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)label[i];
    __builtin_memcpy(&ev->addr, b, 8);
    __builtin_memcpy(&ev->size, b + 8, 8);
    __builtin_memcpy(&ev->requested, b + 16, 8);
}

/* Packs a named mark's name into ev's addr and size (MT_EV_MARK_NAMED): cut to at most
 * MT_EVENT_MARK_NAME_MAX bytes as a label is cut; requested = 0. Unpack it as a label. */
static inline void mt_event_mark_name_pack(mt_event_rec_t *ev, const char *name)
{
    char b[MT_EVENT_MARK_NAME_MAX + 1];
    size_t n = 0;
    while (n < MT_EVENT_MARK_NAME_MAX && name[n] != '\0')
        n++;
    if (n == MT_EVENT_MARK_NAME_MAX)
        while (n > 0 && ((unsigned char)name[n] & 0xc0u) == 0x80u)
            n--;
    for (size_t i = 0; i < n; i++)
        b[i] = name[i];
    b[n] = '\0';
    mt_event_label_pack(ev, b);
    ev->requested = 0;
}

/* The label of an MT_EV_TAG_LABEL event as a NUL-terminated string in out. Returns its
 * length (0: the event carries no label). */
static inline size_t mt_event_label_unpack(const mt_event_rec_t *ev,
                                           char out[MT_EVENT_LABEL_MAX + 1])
{
    __builtin_memcpy(out, &ev->addr, 8);
    __builtin_memcpy(out + 8, &ev->size, 8);
    __builtin_memcpy(out + 16, &ev->requested, 8);
    out[MT_EVENT_LABEL_MAX] = '\0';
    size_t n = 0;
    while (out[n] != '\0')
        n++;
    return n;
}

/* Static name of an event kind ("alloc", "free_requested", ...), or "unknown". */
MT_API const char *mt_event_kind_name(int kind);
MT_API const char *mt_mark_name(int mark);
/* The config key of an mt_setting_e ("max_split_size_mb", "roundup_power2_divisions[3]"
 * for interval 3), written into buf (>= 40 bytes); "unknown" for an id outside the enum. */
MT_API const char *mt_setting_name(int id, char *buf, size_t len);
MT_API const char *mt_pool_name(int pool);

#ifdef __cplusplus
}
#endif
#endif
