/* The event-replay model: what one process's event stream means. The one reader of
 * allocator events for the daemon (/state, /metrics, top), `memtrace report`, `memtrace
 * plot` and the replay's figures; docs/analysis.md explains the rules.
 *
 * Feed each producer's records in sequence order with mt__model_apply. Device memory and
 * pinned host memory (pool MT_POOL_HOST) are two classes, each with its own totals, blocks,
 * tags and segment map. Totals come from the running figures every event carries; blocks,
 * tags and segments are rebuilt from the events. After a gap (a seq jump or MT_EV_GAP) the
 * blocks and segments known so far become uncertain until an event proves them live or
 * gone; uncertain bytes are reported apart, never as allocated. Every figure is bounded:
 * tag bytes never above the allocated total, free extents never above the reserved total,
 * fractions in [0, 1], sums saturate at UINT64_MAX. */
#ifndef MT_ANALYSIS_MODEL_H
#define MT_ANALYSIS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/alloc.h"
#include "memtrace/event.h"

typedef struct mt_model_s mt_model_t;

typedef enum mt_model_class_e {
    MT_MODEL_DEVICE = 0, /* every pool but MT_POOL_HOST */
    MT_MODEL_HOST = 1,   /* pinned host memory */
    MT_MODEL_CLASSES = 2,
} mt_model_class_e;

typedef struct mt_model_cfg_s {
    bool keep_iterations;         /* sample totals and tags at each MT_MARK_ITERATION (growth) */
    uint64_t temporary_window_us; /* µs, <= MT_MODEL_TEMP_WINDOW_MAX: a block freed within this
                                     long of its alloc is temporary; 0 = not tracked */
} mt_model_cfg_t;

/* The default window (mt__model_cfg_default): long enough for an op's scratch and an
 * autograd temporary freed a few ops later, short of a step's saved activations. */
#define MT_MODEL_TEMP_WINDOW_US  1000u
#define MT_MODEL_TEMP_WINDOW_MAX (UINT64_C(1) << 40) /* µs, about 12.7 days */

mt_model_cfg_t mt__model_cfg_default(void);
int mt__model_create(mt_model_t **out, const mt_model_cfg_t *cfg);
void mt__model_destroy(mt_model_t **m);
/* Applies one record (ev borrowed). MT_ENOMEM when a table cannot grow: the totals are
 * updated anyway and the model stays consistent (the block or segment is then missing,
 * and the class is marked uncertain as after a gap; or the block's stack is, its bytes
 * then counted under no stack or none). */
int mt__model_apply(mt_model_t *m, const mt_event_rec_t *ev);
/* The device class's allocated total (as mt__model_figures_totals gives it) that applying ev
 * would leave, without applying it: for a reader that must keep the state at a peak and so
 * needs to know whether the next event passes it. */
uint64_t mt__model_allocated_after(const mt_model_t *m, const mt_event_rec_t *ev);
/* Walks every invariant written at the model's structs. 0, or MT_EPROTO naming the first
 * violation in why (may be NULL). */
int mt__model_check(const mt_model_t *m, char *why, size_t whylen);

/* ---- figures ---- */

/* The one definition of each ratio. utilization = allocated / reserved (1 when nothing is
 * reserved); fragmentation = 1 - largest free extent / total free (0 when nothing is free),
 * as the allocator defines it. Both clamped to [0, 1]. */
double mt__model_utilization(uint64_t allocated, uint64_t reserved);
double mt__model_fragmentation(uint64_t largest_free, uint64_t total_free);
/* a + b, UINT64_MAX when it does not fit. */
static inline uint64_t mt_model_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}
/* a * b, UINT64_MAX when it does not fit. */
static inline uint64_t mt_model_sat_mul(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

typedef struct mt_model_figures_s {
    uint64_t allocated;      /* bytes: sum over the class's sources of their latest total */
    uint64_t reserved;       /* bytes, likewise (>= allocated in any allocator's stream) */
    uint64_t peak_allocated; /* bytes, highest allocated seen */
    uint64_t peak_reserved;  /* bytes, highest reserved seen */
    uint64_t total_free;     /* bytes of known segments not covered by a block, <= reserved */
    uint64_t largest_free;   /* bytes, largest such extent, <= total_free */
    double utilization;      /* mt__model_utilization(allocated, reserved) */
    double fragmentation;    /* mt__model_fragmentation(largest_free, total_free) */
    uint64_t blocks;         /* live blocks known (pending frees included) */
    uint64_t segments;       /* segments (or mapped ranges) known */
    /* After a gap, allocated = known + (uncertain blocks still live) + (allocations never
     * seen), with room = allocated - known: */
    uint64_t uncertain_bytes; /* min(bytes of uncertain blocks, room): may be live or gone */
    uint64_t untracked_bytes; /* room - uncertain blocks' bytes, when > 0: never seen */
    uint64_t unmatched_frees; /* frees of blocks the model never saw allocated */
    bool uncertain;           /* a gap left figures the events no longer determine */
} mt_model_figures_t;

/* Figures of class cls. MT_ENOMEM only when the free extents cannot be computed (then
 * total_free and largest_free are 0 and the rest is filled). */
int mt__model_figures(const mt_model_t *m, int cls, mt_model_figures_t *out);
/* The same figures, the free extents kept from one call to the next (model_free.c): the
 * first call sorts the blocks as mt__model_figures does, each later one costs the blocks
 * and segments changed since, O(log n) each, in the shape an allocator's events give. For
 * figures at many moments of one replay (the report's timeline). */
int mt__model_figures_kept(mt_model_t *m, int cls, mt_model_figures_t *out);

/* A setting changed at run time (MT_EV_SETTING): when, which (mt_setting_e), the values. */
typedef struct mt_model_setting_s {
    uint64_t time_ns;
    unsigned device;
    int id;
    uint64_t value, before;
} mt_model_setting_t;
#define MT_MODEL_SETTINGS_MAX 4096
/* The changes seen, oldest first (*n of them; the array lives as long as m), and how many
 * past MT_MODEL_SETTINGS_MAX were only counted. */
void mt__model_settings(const mt_model_t *m, const mt_model_setting_t **out, size_t *n,
                        uint64_t *dropped);
/* Managed memory (MT_EV_MANAGED), summed over the devices whose allocators are managed. */
typedef struct mt_model_managed_s {
    uint64_t events;         /* MT_EV_MANAGED events seen; 0: no managed allocator */
    uint64_t prefetches;     /* MT_MANAGED_PREFETCH events */
    uint64_t prefetch_bytes; /* bytes they named */
    uint64_t advises;        /* MT_MANAGED_ADVISE events */
    uint64_t managed_peak;   /* highest sum of the managed allocators' reserved bytes */
    uint64_t device_now;     /* managed bytes resident on the devices at the last samples */
    uint64_t device_peak;    /* highest such sum */
    uint64_t faults;         /* faults so far, at the last samples */
    uint64_t migrated;       /* bytes migrated so far (both ways), at the last samples */
} mt_model_managed_t;
void mt__model_managed(const mt_model_t *m, mt_model_managed_t *out);
/* Device memory outside the allocator (docs/outside.md), per device with an MT_EV_DEVICE
 * figure. The parts add up to used, each taken from what the ones before it leave:
 * used = reserved' + libraries + context + other_processes + not_seen, with
 * reserved' = min(reserved, used). */
typedef struct mt_model_outside_s {
    unsigned device;
    uint64_t used, total;     /* bytes, as the driver reported them at the latest figure */
    uint64_t peak_used;       /* bytes, highest used seen */
    uint64_t reserved;        /* bytes, the allocators' reserved on the device now */
    uint64_t outside;         /* used - reserved, 0 when reserved is larger */
    uint64_t libraries;       /* bytes libraries hold outside, as reported (MT_EV_OUTSIDE_*) */
    uint64_t context;         /* bytes in use at the first figure that no event named */
    uint64_t other_processes; /* used - this process's bytes, when the driver tells them
                                 (self_known: NVML on cuda, the model on sim); else 0 */
    uint64_t not_seen;        /* the rest of outside: this process's, unnamed */
    bool self_known;
} mt_model_outside_t;
/* Fills out[0..min(n, max)) by ordinal and returns n, the devices with a figure. */
size_t mt__model_outside(const mt_model_t *m, mt_model_outside_t *out, size_t max);
typedef struct mt_model_library_s {
    unsigned id;      /* the producer's library id; 0 = unnamed */
    const char *name; /* borrowed until the model changes */
    uint64_t bytes;   /* held outside on the device now */
    uint64_t peak;    /* highest held */
} mt_model_library_t;
/* The libraries that held memory outside on device, by bytes then peak, largest first:
 * fills out[0..min(n, max)) and returns n. */
size_t mt__model_outside_libraries(const mt_model_t *m, unsigned device, mt_model_library_t *out,
                                   size_t max);
/* A library id's name ("unnamed" for 0). */
const char *mt__model_library_name(const mt_model_t *m, unsigned id);
/* The same without the free extents (total_free, largest_free, fragmentation are 0): O(1),
 * for a figure per event. */
void mt__model_figures_totals(const mt_model_t *m, int cls, mt_model_figures_t *out);

typedef struct mt_model_tag_s {
    uint64_t bytes;            /* live bytes known to hold tag t, <= the class's allocated */
    uint64_t blocks;           /* those blocks */
    uint64_t peak;             /* highest bytes seen */
    uint64_t uncertain_bytes;  /* min(bytes of tag-t uncertain blocks, room): see figures */
    uint64_t uncertain_blocks; /* those blocks */
} mt_model_tag_t;

void mt__model_tag(const mt_model_t *m, int cls, int tag, mt_model_tag_t *out);
/* Latest totals of one source (mt_event_source). MT_EINVAL: no such source. */
int mt__model_source(const mt_model_t *m, unsigned src, uint64_t *allocated, uint64_t *reserved);
/* Sums over the sources of one device ordinal (device memory: host = false). */
void mt__model_device(const mt_model_t *m, unsigned device, bool host, uint64_t *allocated,
                      uint64_t *reserved);
/* Device memory of one device ordinal. */
typedef struct mt_model_dev_s {
    unsigned device;
    uint64_t allocated, reserved;           /* bytes, its allocator's latest totals */
    uint64_t peak_allocated, peak_reserved; /* bytes, that device's own highest */
} mt_model_dev_t;
/* The devices whose allocators reported device-memory totals, by ordinal: fills
 * out[0..min(n, max)) and returns n. The class's allocated and reserved are the sums of
 * these (mt__model_figures); each peak is the device's own, so the peaks' sum may exceed
 * the process's peak, which is the peak of the sum. */
size_t mt__model_devices(const mt_model_t *m, mt_model_dev_t *out, size_t max);
/* Live bytes known in blocks of one pool (mt_pool_e), saturated. */
uint64_t mt__model_pool_bytes(const mt_model_t *m, int pool);
/* Events applied, and events known lost (gap records, seq jumps). */
uint64_t mt__model_events(const mt_model_t *m);
uint64_t mt__model_lost(const mt_model_t *m);

/* ---- segment map and blocks ---- */

typedef struct mt_model_seg_s {
    uint64_t addr, size; /* bytes; mapped pages of an expandable segment merge when adjacent */
    uint64_t used;       /* bytes of it covered by blocks */
    uint32_t stream;
    uint8_t pool;      /* mt_pool_e */
    uint8_t mapped;    /* 1: expandable pages, 0: a segment */
    uint8_t uncertain; /* known before a gap and not seen since */
} mt_model_seg_t;

typedef struct mt_model_block_s {
    uint64_t addr, size; /* bytes, rounded */
    uint32_t stack;      /* stack id (0: none recorded; see the call stacks section) */
    uint8_t tag;
    uint8_t pool;
    uint8_t pending;    /* freed by the program, not yet back in a free bin */
    uint8_t uncertain;  /* allocated before a gap; its free may have been lost */
    uint64_t requested; /* bytes the alloc asked for, <= size; 0 unknown (rounding = size -
                           requested, analysis/gap.h) */
} mt_model_block_t;

/* A class's segment map: segments and blocks, each sorted by address, with the free
 * extents' figures. Free with mt__model_map_free. */
typedef struct mt_model_map_s {
    mt_model_seg_t *segs;
    mt_model_block_t *blocks;
    size_t nsegs, nblocks;
    uint64_t total_free, largest_free; /* as in mt_model_figures_t */
} mt_model_map_t;

int mt__model_map(const mt_model_t *m, int cls, mt_model_map_t *out);
void mt__model_map_free(mt_model_map_t *map);

/* ---- iterations and growth (cfg.keep_iterations) ---- */

typedef struct mt_model_growth_cfg_s {
    uint64_t min_growth_bytes; /* rise needed to flag growth; 1 MiB */
    double min_r2;             /* goodness of fit needed; 0.8 */
} mt_model_growth_cfg_t;

typedef struct mt_model_fit_s {
    double slope;   /* bytes per iteration */
    double r2;      /* goodness of the least-squares fit, 0 when flat */
    double rise;    /* last - first fitted sample, bytes */
    double nondecr; /* fraction of steps that do not go down */
    bool detected;  /* growth flagged (see report.h) */
} mt_model_fit_t;

typedef struct mt_model_growth_s {
    size_t iterations;              /* samples taken (device memory, at MT_MARK_ITERATION) */
    size_t fitted;                  /* samples fitted: the first is warm-up when there are >= 5 */
    uint64_t first, last;           /* iteration numbers of the first fitted and the last sample */
    mt_model_fit_t total;           /* allocated bytes */
    mt_model_fit_t tag[MT_TAG_MAX]; /* bytes by tag (known + uncertain) */
} mt_model_growth_t;

void mt__model_growth(const mt_model_t *m, const mt_model_growth_cfg_t *cfg,
                      mt_model_growth_t *out);

/* Spans between iteration marks, for aligning processes whose clocks differ (the ranks of
 * one job): span k runs from the k-th MT_MARK_ITERATION to the next (the last to the end). */
typedef struct mt_model_span_s {
    uint64_t iteration;         /* the number the opening mark carried */
    uint64_t allocated_at_mark; /* device allocated bytes at the opening mark */
    uint64_t peak;              /* the device's peak allocated bytes within the span */
} mt_model_span_t;

size_t mt__model_spans(const mt_model_t *m);
/* 0, or MT_ENOENT when k >= mt__model_spans(m). */
int mt__model_span(const mt_model_t *m, size_t k, mt_model_span_t *out);
/* The span in which the device first reached its peak allocated bytes: 0 with *k, or
 * MT_ENOENT when the peak came before the first mark (or nothing was marked). */
int mt__model_peak_span(const mt_model_t *m, size_t *k);

/* ---- call stacks (docs/telemetry.md, "Call stacks") ----
 * Each block keeps the stack id its allocation carried (an MT_EV_STACK_REF record right
 * before the MT_EV_ALLOC; mt_prof_events_from_json makes that pair from an alloc line
 * with "stack"). The stack table and module map are the producer's, given with
 * mt__model_stack_define / mt__model_module_add (the daemon reads them from the producer,
 * report and plot from "stack" and "module" lines: mt__model_table_line). The table is
 * bounded: ids above MT_STACK_ID_MAX (other than MT_STACK_ID_OVERFLOW) count as id 0's
 * "bad id" figure; a definition that does not fit MT_MODEL_FRAMES_MAX is refused. */

/* frames held over all stacks of a model: the producer's own cap (MT__STAB_FRAMES), so a
 * daemon holds at most 64 MiB of frames per process */
#define MT_MODEL_FRAMES_MAX  (1u << 21)
#define MT_MODEL_MODULES_MAX 4096u
#define MT_MODEL_PY_STR_MAX  (4u << 20) /* bytes of Python function and file names */

/* One frame, innermost first: native (py_func NULL, ip the return address) or Python
 * (py_func, py_file, py_line; ip 0). Same layout as analysis/callsite.h's mt_cs_frame_t. */
typedef struct mt_model_frame_s {
    uint64_t ip;
    const char *py_func;
    const char *py_file;
    int py_line;
} mt_model_frame_t;

/* Defines stack id (1..MT_STACK_ID_MAX) as frames[0, n), n <= MT_STACK_DEPTH_MAX; Python
 * strings are copied. A second definition of an id replaces the first only when it
 * differs (a restarted recorder). MT_EINVAL (bad id or n), MT_EOVERFLOW (table full),
 * MT_ENOMEM. */
int mt__model_stack_define(mt_model_t *m, uint32_t id, const mt_model_frame_t *frames, int n,
                           bool truncated);
/* Frames of id (borrowed until the next define or destroy). MT_ENOENT for an id the
 * table does not hold (0, overflow, never defined): *frames = NULL, *n = 0. */
int mt__model_stack_frames(const mt_model_t *m, uint32_t id, const mt_model_frame_t **frames,
                           int *n, bool *truncated);

typedef struct mt_model_module_s {
    const char *path;     /* as the producer saw it */
    uint64_t base, size;  /* load bias (file vaddr = ip - base) and mapped span, bytes */
    const char *build_id; /* lowercase hex, "" when none */
} mt_model_module_t;

/* Adds a module (strings copied). A module overlapping a known one replaces it (dlclose
 * then dlopen at the same place). MT_EINVAL (empty path, size 0), MT_EOVERFLOW past
 * MT_MODEL_MODULES_MAX, MT_ENOMEM. */
int mt__model_module_add(mt_model_t *m, const char *path, uint64_t base, uint64_t size,
                         const char *build_id);
/* The module map, in the order added (borrowed until the next add or destroy). */
void mt__model_modules(const mt_model_t *m, const mt_model_module_t **mods, size_t *n);
/* The module holding ip, or NULL. */
const mt_model_module_t *mt__model_module_of(const mt_model_t *m, uint64_t ip);

/* Reads a "stack" or "module" line (a jansson json_t *) into the model. 1 when the line
 * is one of those (and was read), 0 when it is another kind of line, MT_EPROTO naming
 * the bad field in err for a malformed one (the model is unchanged), or a define's error. */
int mt__model_table_line(mt_model_t *m, const void *json, char *err, size_t errlen);

/* Copies src's stack table and module map into dst (blocks and figures untouched). 0, or
 * the first error of a define or add. */
int mt__model_tables_copy(mt_model_t *dst, const mt_model_t *src);

/* Per-stack figures of one class. */
typedef struct mt_model_stack_s {
    uint32_t stack;           /* id; 0 = allocations without a stack; MT_STACK_ID_OVERFLOW */
    uint64_t bytes;           /* live bytes now (known; pending frees excluded); figures are
                                 bounded by the class's allocated / peak_allocated */
    uint64_t blocks;          /* live blocks now */
    uint64_t peak_bytes;      /* live bytes at the class's peak (the last time allocated rose to
                                 peak_allocated) */
    uint64_t uncertain_bytes; /* live before a gap, not seen since */
    uint64_t allocs;          /* allocations seen */
    uint64_t alloc_bytes;     /* bytes allocated in total, saturated */
    mt_model_fit_t growth;    /* device class, with cfg.keep_iterations: known + uncertain bytes
                                 at each iteration, the rule of mt__model_growth */
} mt_model_stack_t;

/* Every stack that ever held a block of class cls, as a new array in *out (free() it),
 * in id order; never-freed bytes at the end of a stream are the bytes of the rows read
 * after the last event. cfg NULL: the defaults of mt__model_growth. 0 or MT_ENOMEM. */
int mt__model_stacks(const mt_model_t *m, int cls, const mt_model_growth_cfg_t *cfg,
                     mt_model_stack_t **out, size_t *n);
/* Counters: stack refs applied, allocations with a stack, refs with a bad id, refs whose
 * alloc did not follow, definitions refused. */
typedef struct mt_model_stack_stats_s {
    uint64_t refs, matched, bad_ids, orphan_refs, refused;
    size_t defined, frames;
} mt_model_stack_stats_t;
void mt__model_stack_stats(const mt_model_t *m, mt_model_stack_stats_t *out);

/* ---- temporary allocations (docs/analysis.md, "Temporary allocations") ----
 * A block is temporary when the program frees it (free_requested) at most
 * cfg.temporary_window_us after its alloc, both times known (time_ns != 0), the block
 * certain (not from before a gap). Lifetimes are kept per stack and per tag in a log-bucket
 * histogram of µs: exact below 2^MT_MODEL_TEMP_EXACT_BITS µs, then 2^MT_MODEL_TEMP_EXACT_BITS
 * buckets per power of two (a bucket's lower bound is within 1/32 of any lifetime in it). */
#define MT_MODEL_TEMP_EXACT_BITS 5

typedef struct mt_model_temp_s {
    uint32_t key;         /* stack id (by stack), or tag (by tag) */
    uint64_t count;       /* temporary allocations, > 0 */
    uint64_t bytes;       /* their bytes (rounded sizes), saturated */
    const uint64_t *hist; /* lifetimes: count per bucket, mt__model_temp_buckets(m) of them;
                             borrowed until m changes. NULL past the bound on histogram memory
                             (16 MiB per class): then the row has no lifetimes */
} mt_model_temp_t;

/* Buckets of every histogram of m (from its window; 0 when not tracked). */
size_t mt__model_temp_buckets(const mt_model_t *m);
/* The bucket of a lifetime of us µs, and a bucket's lower bound in µs. */
size_t mt__model_temp_bucket(uint64_t us);
uint64_t mt__model_temp_bucket_low(size_t b);
/* The lower median (the ceil(n/2)-th smallest lifetime) of a histogram, as its bucket's
 * lower bound in µs; 0 for an empty one. */
uint64_t mt__model_temp_median_us(const uint64_t *hist, size_t nb);
/* The rows of class cls with a temporary allocation, by stack (id order) or by tag (tag
 * order), as a new array in *out (free() it). 0 or MT_ENOMEM. */
/* Allocations before t_ns have unknown lifetimes (never temporary): a snapshot's trace that
 * began in the middle of a run, whose earlier blocks are made up from the state at its
 * start, stamped just before t_ns. */
void mt__model_lifetimes_from(mt_model_t *m, uint64_t t_ns);
int mt__model_temporary(const mt_model_t *m, int cls, bool by_tag, mt_model_temp_t **out,
                        size_t *n);

#endif
