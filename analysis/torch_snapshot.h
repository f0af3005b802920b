/* PyTorch CUDA memory snapshots (torch.cuda.memory._snapshot / _dump_snapshot and the
 * 1.13-era torch.cuda.memory_snapshot()): a model of one, read from and written to the
 * pickle (analysis/pickle.h), and its conversions to what memtrace runs on: an allocation
 * trace per device for the replay, event records for the report and plot.
 * docs/torch-snapshot.md describes both layouts field by field. */
#ifndef MT_ANALYSIS_TORCH_SNAPSHOT_H
#define MT_ANALYSIS_TORCH_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "analysis/pickle.h"
#include "analysis/model.h"
#include "analysis/report.h"
#include "analysis/trace_csv.h"
#include "memtrace/event.h"

typedef enum mt_ts_action_e {
    MT_TS_ALLOC = 0,
    MT_TS_FREE_REQUESTED,
    MT_TS_FREE_COMPLETED,
    MT_TS_SEGMENT_ALLOC,
    MT_TS_SEGMENT_FREE,
    MT_TS_SEGMENT_MAP,
    MT_TS_SEGMENT_UNMAP,
    MT_TS_OOM,
    MT_TS_SNAPSHOT,
    MT_TS_ACTION_COUNT,
} mt_ts_action_e;

typedef enum mt_ts_state_e {
    MT_TS_ACTIVE_ALLOCATED = 0,
    MT_TS_ACTIVE_PENDING_FREE,
    MT_TS_INACTIVE,
} mt_ts_state_e;

typedef struct mt_ts_frame_s {
    const char *name;     /* function */
    const char *filename; /* file */
    int64_t line;
} mt_ts_frame_t;

/* A call stack: frames[first, first + n), innermost first as PyTorch writes them. */
typedef struct mt_ts_stack_s {
    uint32_t first, n;
} mt_ts_stack_t;

/* 1.13: one allocation that used (part of) a block. */
typedef struct mt_ts_history_s {
    uint64_t addr, real_size; /* bytes */
    uint32_t stack;           /* index into stacks; 0 = none */
} mt_ts_history_t;

typedef struct mt_ts_block_s {
    uint64_t addr, size, requested; /* bytes; requested 0 when the file has none */
    uint8_t state;                  /* mt_ts_state_e */
    uint32_t stack;                 /* 0 = none */
    uint32_t first_history, nhistory;
    uint8_t tag; /* memtrace's tag from its (or its first history entry's) frames, else
                  * MT_TAG_OTHER; set when read */
} mt_ts_block_t;

/* Invariants (mt__ts_check): blocks[first_block, +nblocks) tile [addr, addr + total_size)
 * in address order; allocated_size <= active_size <= total_size. */
typedef struct mt_ts_segment_s {
    int device;
    uint64_t addr, total_size, allocated_size, active_size, requested_size; /* bytes */
    int64_t stream;
    bool large, expandable;
    int64_t pool_id[2];
    uint32_t stack;
    uint32_t first_block, nblocks;
} mt_ts_segment_t;

typedef struct mt_ts_event_s {
    uint64_t addr;       /* oom: device_free bytes */
    uint64_t size;       /* bytes: requested for alloc and frees; the segment's for segment_* */
    uint64_t block_size; /* alloc: the block's bytes when the file says ("memtrace_size",
                          * written by memtrace), else 0: requested rounded up to 512 */
    int64_t stream;      /* cudaStream_t as an integer */
    int64_t time_us;     /* 0 when the file has none */
    uint32_t stack;      /* 0 = none */
    uint8_t action;      /* mt_ts_action_e */
    uint8_t device;
    uint8_t tag; /* memtrace's tag when a frame carries one (docs), else MT_TAG_OTHER */
} mt_ts_event_t;

typedef struct mt_ts_annotation_s {
    bool start; /* stage START, else END */
    int device;
    int64_t time_us;
    const char *name;
} mt_ts_annotation_t;

/* A snapshot. stacks[0] is the empty stack. Events are in file order, device by device:
 * device d's are events[dev_first[d], dev_first[d + 1]). Strings are owned by the model. */
typedef struct mt_ts_s {
    int era;      /* 1: a list of segments (1.13's, or 2.x's memory_snapshot()); 2: 2.x dict */
    bool list_2x; /* era 1 with 2.x's segment fields (requested_size, is_expandable) */
    mt_ts_segment_t *segments;
    size_t nsegments;
    mt_ts_block_t *blocks;
    size_t nblocks;
    mt_ts_history_t *history;
    size_t nhistory;
    mt_ts_event_t *events;
    size_t nevents;
    uint32_t *dev_first; /* ndevices + 1 */
    unsigned ndevices;
    mt_ts_frame_t *frames;
    size_t nframes;
    mt_ts_stack_t *stacks;
    size_t nstacks;
    uint32_t before_stack; /* an empty stack: blocks live at the end that the trace did not
                            * allocate and the snapshot gives no frames for (0: none) */
    mt_ts_annotation_t *annotations;
    size_t nannotations;
    const char *alloc_conf;  /* allocator_settings' PYTORCH_CUDA_ALLOC_CONF, or NULL */
    size_t skipped_actions;  /* trace entries of actions this reader does not know */
    size_t viz_dropped;      /* trace entries a conversion left out (mt__ts_viz_safe) */
    char *tag_label[256];    /* memtrace tag names found in frames (or set for export) */
    struct mt_ts_mem_s *mem; /* owned strings, arrays' capacities, the pickle */
} mt_ts_t;

/* The layout's name for people: "2.x", "2.x list" (era 1 written by PyTorch 2.x) or
 * "1.13". */
const char *mt__ts_layout(const mt_ts_t *ts);

/* An empty snapshot of era 2, to fill with the mt_ts_add_* calls. */
int mt__ts_create(mt_ts_t **out);
void mt__ts_destroy(mt_ts_t **p);

/* Reads a snapshot file (either era). MT_EPROTO with "path: where: what" in err for a
 * malformed pickle or layout, MT_ENOENT/MT_EIO/MT_ENOMEM otherwise. */
int mt__ts_read(mt_ts_t **out, const char *path, char *err, size_t errlen);
/* The same from a parsed pickle; doc is taken (freed even on failure); name in messages. */
int mt__ts_from_pickle(mt_ts_t **out, mt_pk_doc_t *doc, const char *name, char *err, size_t errlen);
/* True when the file at path starts like a pickle (byte 0x80), for commands that take
 * snapshots and other inputs. */
bool mt__ts_is_pickle(const char *path);

/* Writes ts as era 2 (the dict) or era 1 (the list of segments with history on blocks,
 * built from the segments' blocks and the trace). MT_EIO, MT_EINVAL. */
int mt__ts_write(const mt_ts_t *ts, FILE *f, int era);

/* Checks the invariants above and that events, blocks and stacks index what exists.
 * 0 or MT_EPROTO with the first broken one in err. */
int mt__ts_check(const mt_ts_t *ts, char *err, size_t errlen);

/* ---- building ---- */
/* Interns a call stack (frames copied); *id is its index (0 for n == 0). */
int mt__ts_add_stack(mt_ts_t *ts, const mt_ts_frame_t *frames, size_t n, uint32_t *id);
/* Sets ts->before_stack where a snapshot with a trace has an allocated block without frames
 * (called by the readers; 0 or MT_ENOMEM). Its stack is named MT_TS_BEFORE_NO_STACK. */
int mt__ts_add_before_stack(mt_ts_t *ts);
/* Appends an event to device ev->device, which must be the last device so far or a new one. */
int mt__ts_add_event(mt_ts_t *ts, const mt_ts_event_t *ev);
/* Appends a segment and its blocks (copied; their history is left empty). */
int mt__ts_add_segment(mt_ts_t *ts, const mt_ts_segment_t *seg, const mt_ts_block_t *blocks,
                       size_t nblocks);
int mt__ts_add_annotation(mt_ts_t *ts, const mt_ts_annotation_t *a);
/* Copies s into the model's strings; NULL when out of memory. */
const char *mt__ts_strdup(mt_ts_t *ts, const char *s);

/* Static name of an action ("alloc", ...) or state ("active_allocated", ...). */
const char *mt__ts_action_name(int action);
const char *mt__ts_state_name(int state);
/* The stack of b's allocation: its own frames (2.x with history recorded), else, for an
 * active block, its newest history entry's (1.13 and 2.0 keep the frames there: history[0],
 * as PyTorch's _memory_viz reads them). 0 for none. */
uint32_t mt__ts_block_stack(const mt_ts_t *ts, const mt_ts_block_t *b);

/* ---- conversions ---- */

/* What a snapshot is made from: one process's events (any devices, in their order; the
 * trace) and its segment map at the end (segments and live blocks; NULL: none). */
typedef struct mt_ts_source_s {
    const mt_event_rec_t *evs;
    size_t nevs;
    const mt_model_map_t *map;
    const char *(*tag_name)(void *ud, int tag); /* a tag's label, or NULL: built-in name */
    void *ud;
} mt_ts_source_t;

/* A snapshot of src: the device events as device_traces, the map's segments and blocks
 * (free space as inactive blocks), each tag as a frame {"name": "tag <label>",
 * "filename": "memtrace", "line": tag id} on its allocations and blocks, markers as
 * external annotations. *out is new. MT_ENOMEM; message in err. */
int mt__ts_from_events(mt_ts_t **out, const mt_ts_source_t *src, char *err, size_t errlen);

/* A snapshot of process proc of r (fed whole logs): its device events as device_traces,
 * the report's segment map after its last event as segments and blocks, each tag as a
 * frame {"name": "tag <label>", "filename": "memtrace", "line": tag id} on its allocations
 * and blocks, markers as external annotations. threads 2: the conversion on the caller's
 * thread, the model's replay to the map on one of its own (joined before return); 1: one
 * replay on the caller's; the snapshot is the same. *out is new. MT_ENOENT (no such process
 * or no events), MT_ENOMEM; message in err. */
int mt__ts_from_report(mt_ts_t **out, const mt__report_t *r, size_t proc, int threads, char *err,
                       size_t errlen);

/* Leaves out of ts's trace the entries memory_viz's state view could not undo from the
 * segments and blocks at the end (a log that lost events: docs/torch-snapshot.md, "What
 * memory_viz needs of a trace"); *dropped: how many. Both conversions above call it.
 * 0 or MT_ENOMEM (ts unchanged). */
int mt__ts_viz_safe(mt_ts_t *ts, size_t *dropped);

/* PyTorch's own figures for device d from its trace. reserved: segment_alloc/map minus
 * segment_free/unmap, starting from what the segments at the end imply was reserved
 * before the trace began; allocated: alloc minus free_completed, by requested bytes. */
typedef struct mt_ts_figures_s {
    uint64_t reserved_start, peak_reserved, end_reserved;
    uint64_t peak_allocated; /* requested bytes, the blocks live before the trace included */
    size_t allocs, frees, segment_events, ooms;
    size_t orphan_frees; /* frees of blocks allocated before the trace began */
    size_t pre_blocks;   /* blocks live before the trace began (torch_snapshot_walk.h) */
} mt_ts_figures_t;

int mt__ts_figures(const mt_ts_t *ts, unsigned device, mt_ts_figures_t *out);

/* Device d's trace as an allocation trace for mt__replay_run: the blocks live before the
 * trace began are allocated first (torch_snapshot_walk.h), then alloc opens a slot and the
 * first of free_requested/free_completed closes it. *out is new (mt__trace_free). */
int mt__ts_to_trace(const mt_ts_t *ts, unsigned device, mt_trace_t **out, char *err, size_t errlen);

/* All devices' events as memtrace records (kind, addr, size, requested, running allocated
 * and reserved, device, tag, pool by size), time_ns = time_us * 1000, or the record's place
 * in the order (1, 2, ...) when the entry has no time (see mt__ts_timed). What a trace began
 * in the middle of comes first, flagged MT_TS_REC_BEFORE, at its first event's time (1
 * untimed): its segments and blocks (torch_snapshot_walk.h), which the trace's frees then
 * close. A snapshot with no trace at all (1.13's layout, or recorded without history) gives
 * its state instead: a segment_alloc per segment, an alloc per active block, a free_requested
 * per pending one. Calls fn for each (ev borrowed; stack is the event's stack id; flags
 * MT_TS_REC_*); a nonzero return stops and is returned. */
#define MT_TS_REC_BEFORE 1u /* made from the state at the end, not read from the trace */
typedef int (*mt_ts_record_fn)(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags);
int mt__ts_records(const mt_ts_t *ts, mt_ts_record_fn fn, void *ctx);
/* True when some trace entry or annotation of ts has a time; false when mt__ts_records
 * can only number its records by their order (a trace without time_us, or no trace). */
bool mt__ts_timed(const mt_ts_t *ts);
/* The file holds its segments but no allocation history (the 1.13 list, or a 2.x dict taken
 * without _record_memory_history): one moment, the one it was taken at. */
bool mt__ts_state_only(const mt_ts_t *ts);
/* The earliest time_us of a device's first trace entry (where mt__ts_records puts what came
 * before, 1 ns earlier), or 0 when the trace has no times. */
int64_t mt__ts_trace_start_us(const mt_ts_t *ts);
/* Devices the model numbers (0 .. n-1: its traces' and its segments'), and whether device d
 * holds anything (a segment or an event). */
unsigned mt__ts_device_count(const mt_ts_t *ts);
bool mt__ts_device_used(const mt_ts_t *ts, unsigned d);

/* A call site's live bytes at the peak of allocated bytes on device d. */
typedef struct mt_ts_site_s {
    uint32_t stack;
    uint64_t bytes;
    size_t count;
} mt_ts_site_t;

/* The top n call sites (by live bytes) at the moment device d's allocated bytes peaked (a
 * state-only snapshot: its live blocks); *nout <= n are written to sites, largest first;
 * *peak the peak. */
int mt__ts_sites_at_peak(const mt_ts_t *ts, unsigned device, mt_ts_site_t *sites, size_t n,
                         size_t *nout, uint64_t *peak);
/* A snapshot's annotations by name (its stages: record_function's and dynamo_timed's names,
 * memtrace's marks), a compiled model writes hundreds of the same few. Times are the file's
 * microseconds (0: it has no clock). */
typedef struct mt_ts_stage_s {
    const char *name;          /* borrowed from the model */
    size_t starts, ends;       /* its START and END annotations */
    int64_t first_us, last_us; /* the earliest and the latest of them */
    int64_t inside_us;         /* time between a START and its END (nested ones once) */
} mt_ts_stage_t;
/* Every name, in the order of its first annotation in time, into *out (new; free()). 0 or
 * MT_ENOMEM. */
int mt__ts_stages(const mt_ts_t *ts, mt_ts_stage_t **out, size_t *n);

/* ---- call sites grouped by the user's frame (torch_snapshot_sites.c, analysis/frames.h) ---- */

struct mt_fr_rules_s;
struct mt_fr_frame_s;

/* Live bytes at device d's peak grouped by a key of their stacks (mt_fr_by_e; by tag: the
 * memtrace tag frame's label, else "other"). */
typedef struct mt_ts_group_s {
    char *key;      /* owned */
    uint32_t stack; /* the group's stack with the most bytes */
    int frame;      /* index of its user frame (mt__fr_pick), -1 for the empty stack */
    uint64_t bytes; /* requested bytes live at the peak */
    size_t count;   /* blocks */
    size_t stacks;  /* distinct stacks merged */
} mt_ts_group_t;

/* All groups, largest first (ties by key), into *out (new; mt__ts_groups_free); *peak the
 * peak. r NULL: the default rules. 0 or MT_ENOMEM. */
int mt__ts_groups_at_peak(const mt_ts_t *ts, unsigned device, const struct mt_fr_rules_s *r, int by,
                          mt_ts_group_t **out, size_t *n, uint64_t *peak);
void mt__ts_groups_free(mt_ts_group_t **g, size_t n);
/* A stack taken in the allocator's free (PyTorch records the free's own with
 * context='all'): where a block the trace did not allocate was dropped. Its names start
 * with MT_TS_FREED_AT. */
#define MT_TS_FREED_AT "before the trace, freed at "
/* The name of a block allocated before the trace began whose frames the snapshot lacks
 * (record_memory_history started after the model was built, say). */
#define MT_TS_BEFORE_NO_STACK "before the trace, no stack recorded"
bool mt__ts_free_stack(const mt_ts_t *ts, uint32_t stack);
/* The key of stack for by (mt__fr_stack_key; by tag: its memtrace tag frame's label, else
 * "other"; MT_FR_NO_STACK without frames; a free's stack prefixed MT_TS_FREED_AT) into
 * buf; fr[cap] scratch, *frame its user frame's index (-1: none). Returns buf. */
const char *mt__ts_stack_key(const mt_ts_t *ts, uint32_t stack, const struct mt_fr_rules_s *r,
                             int by, struct mt_fr_frame_s *fr, size_t cap, int *frame, char *buf,
                             size_t len);
/* The frames of stack as the rules see them, into out[cap]; returns how many (<= cap). */
size_t mt__ts_stack_frames(const mt_ts_t *ts, uint32_t stack, struct mt_fr_frame_s *out,
                           size_t cap);
/* stack as the page shows it: {"site": its user frame's site, or MT_FR_NO_STACK; "frames":
 * [{"label","file","user"}] from the user's frame out, those r skips left out; "hidden": how
 * many were}. r NULL: the default rules. New reference; NULL when memory ran out. */
json_t *mt__ts_stack_view(const mt_ts_t *ts, uint32_t stack, const struct mt_fr_rules_s *r);
/* Call-site rows (mt__cs_rows_json's, whose stacks a snapshot's model knows by id only)
 * named from ts's frames: each row's "site", "frames" and "hidden" from mt__ts_stack_view,
 * "user_frame" 0, "unknown" when the stack has no frames. 0 or MT_ENOMEM. */
int mt__ts_name_rows(const mt_ts_t *ts, json_t *rows);
/* Adds bytes to f under stack's frames as mt__ts_stack_view keeps them, the outermost as the
 * root and the user's frame as the leaf (MT_FR_NO_STACK alone for none). 0, MT_ENOMEM,
 * MT_EOVERFLOW (mt__flame_add). */
struct mt_flame_s;
int mt__ts_flame_add(struct mt_flame_s *f, const mt_ts_t *ts, uint32_t stack, uint64_t bytes);

#endif
