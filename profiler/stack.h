/* Call stacks of allocations: capture on the allocating thread, interning into a bounded
 * table that lives in the ring's area (shared memory the consumer maps read-only), and
 * reading that table back as "stack" and "module" JSON lines (docs/telemetry.md, "Call
 * stacks").
 *
 * Area layout (offsets from the area's start, all fixed at create; the producer writes,
 * consumers read and validate every offset and length before use):
 *   mt__stab_hdr_t                       limits, offsets, published counts
 *   defs[max_stacks]   mt__stab_def_t    stack id i is defs[i - 1]
 *   frames[max_frames] uint64_t          a native frame's return address, or a Python
 *                                        frame: MT__STAB_PY_BIT | pyid << 32 | line
 *   mods[max_modules]  mt__stab_mod_t    module map, in the order found
 *   py[max_py]         mt__stab_py_t     Python (function, file) pair pyid is py[pyid - 1]
 *   str[str_bytes]                       names: module paths, Python functions and files
 * Publication: entries are appended under the producer's table lock, then the count
 * (nstacks, nmods, npy) is release-stored; a consumer acquire-loads the count and reads
 * only entries below it. Stack ids are 1..nstacks, given out in order.
 *
 * Invariants (producer): nstacks <= max_stacks; frames_used <= max_frames; every
 * published def's frames lie in [0, frames_used); str_used <= str_bytes; the private
 * index holds exactly the published ids, each under the hash of its frames. */
#ifndef MT_PROFILER_STACK_H
#define MT_PROFILER_STACK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "memtrace/event.h"

#define MT__STAB_MAGIC    UINT64_C(0x3142415453544d00) /* "\0MTSTAB1" little-endian */
#define MT__STAB_FRAMES   (1u << 21)                   /* frames over all stacks (16 MiB) */
#define MT__STAB_MODULES  4096u
#define MT__STAB_PY       (1u << 16) /* Python (function, file) pairs */
#define MT__STAB_STR      (4u << 20) /* bytes of names */
#define MT__STAB_PY_BIT   (UINT64_C(1) << 63)
#define MT__STAB_PATH_MAX 4096u

typedef struct mt__stab_hdr_s {
    uint64_t magic;
    uint32_t version, hdr_size;
    uint32_t max_stacks, max_frames, max_modules, max_py, str_bytes, pad;
    uint64_t defs_off, frames_off, mods_off, py_off, str_off;
    _Alignas(64) _Atomic uint32_t nstacks; /* published stack ids */
    _Atomic uint32_t nmods;                /* published modules */
    _Atomic uint32_t npy;                  /* published Python pairs */
    uint32_t pad2;
    _Atomic uint64_t overflow; /* captures whose new stack did not fit: counted, not stored */
    _Atomic uint64_t captures; /* stacks captured (sampled in) */
} mt__stab_hdr_t;

typedef struct mt__stab_def_s {
    uint32_t off;   /* first frame */
    uint16_t n;     /* frames, <= MT_STACK_DEPTH_MAX */
    uint16_t flags; /* bit 0: truncated at the depth cap */
} mt__stab_def_t;

typedef struct mt__stab_mod_s {
    uint64_t base, size; /* load bias; the module spans [base, base + size) */
    uint32_t path_off, path_len;
    uint8_t bid_len;
    uint8_t bid[23];
} mt__stab_mod_t;

typedef struct mt__stab_py_s {
    uint32_t func_off, func_len, file_off, file_len;
} mt__stab_py_t;

_Static_assert(sizeof(mt__stab_mod_t) == 48, "fixed layout");

/* Bytes of the area for the default limits (MT_STACK_ID_MAX stacks). */
size_t mt__stab_area_size(void);

/* ---- producer ---- */

typedef struct mt__stab_s mt__stab_t;

typedef struct mt__stab_stats_s {
    uint64_t captures;    /* stacks captured */
    uint64_t overflow;    /* captured, table full: counted, not stored */
    uint32_t stacks;      /* distinct stacks stored */
    uint32_t modules;     /* modules recorded */
    uint64_t frames;      /* frames stored */
    uint64_t table_bytes; /* bytes of the area and the private index the table uses now */
    uint64_t bound_bytes; /* what they may grow to: the documented bound */
} mt__stab_stats_t;

/* Formats area (size bytes, zero-filled, >= mt__stab_area_size()) and records the module
 * map. *out is new. MT_EINVAL (area too small), MT_ENOMEM. */
int mt__stab_create(mt__stab_t **out, void *area, size_t size);
void mt__stab_destroy(mt__stab_t **t);
/* The stack of an allocation of bytes, captured now on this thread (mode: MT_STACKS_*;
 * sampled takes every allocation >= MT_STACK_SAMPLE_MEAN and otherwise one at the end of
 * each exponentially distributed run of bytes of that mean). Returns its id, 0 (not
 * taken, or the thread is already capturing) or MT_STACK_ID_OVERFLOW. Never allocates
 * after create; takes the table's lock only for a stack not seen before. */
uint32_t mt__stab_capture(mt__stab_t *t, int mode, uint64_t bytes);
/* Interns frames (words as in the area), as capture does after unwinding. */
uint32_t mt__stab_intern(mt__stab_t *t, const uint64_t *words, int n, bool truncated);
void mt__stab_stats(const mt__stab_t *t, mt__stab_stats_t *out);

/* ---- consumer: reading an area (untrusted) ---- */

typedef struct mt__stab_view_s {
    const uint8_t *base;
    size_t size;
    mt__stab_hdr_t h; /* copy of the header's limits and offsets, validated */
} mt__stab_view_t;

/* Validates the header. MT_EPROTO for an area that is not a table (then no stacks). */
int mt__stab_view(mt__stab_view_t *v, const void *area, size_t size);
uint32_t mt__stab_view_nstacks(const mt__stab_view_t *v);
uint32_t mt__stab_view_nmods(const mt__stab_view_t *v);
uint64_t mt__stab_view_overflow(const mt__stab_view_t *v);

/* The "stack" line of id ({"v":1,"kind":"stack","pid":..,"id":..,"frames":[..]}, '\n'
 * and NUL included) into buf. Returns its length, 0 when id is not published or its entry
 * is corrupt, or a size that is enough (>= cap). */
size_t mt__stab_stack_line(const mt__stab_view_t *v, uint32_t id, int pid, char *buf, size_t cap);
/* The "module" line of module index i (0-based, < nmods), likewise. */
size_t mt__stab_module_line(const mt__stab_view_t *v, uint32_t i, int pid, char *buf, size_t cap);

/* What one consumer has written of one producer's table: stack lines by id, modules by
 * count. */
typedef struct mt__stab_seen_s {
    uint64_t *bits; /* MT_STACK_ID_MAX + 1 bits, allocated at the first stack */
    uint32_t mods;
} mt__stab_seen_t;

/* Writes, through put(ud, line, len), the module lines not yet written and, when id is a
 * stack id not yet written, its line (marking it). 0, or MT_ENOMEM. */
int mt__stab_emit_for(const mt__stab_view_t *v, mt__stab_seen_t *seen, uint32_t id, int pid,
                      void (*put)(void *ud, const char *line, size_t len), void *ud);
void mt__stab_seen_free(mt__stab_seen_t *s);

#endif
