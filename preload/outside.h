/* Device memory outside memtrace's allocators (outside.c): what the drop-in forwards to
 * the driver, or serves on sim from the backend directly, reported by calling library. */
#ifndef MT_PRELOAD_OUTSIDE_H
#define MT_PRELOAD_OUTSIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/alloc.h"

/* Pitch of a pitched allocation served on sim: rows rounded up to this many bytes, as
 * the driver's cuMemAllocPitch does on current GPUs. */
#define MT_PRELOAD_PITCH_ALIGN 512

/* What was reported of one outside allocation. */
typedef struct mt__preload_fwd_s {
    uint64_t size; /* bytes, < 2^48 */
    int device;    /* ordinal, < MT_PRELOAD_MAX_DEVICES */
    unsigned lib;  /* library index (outside.c), 0 = no name */
} mt__preload_fwd_t;

/* The caller a hook attributes memory to, expanded in the exported hook: its return
 * address (one that an enclosing runtime hook of the thread recorded wins, see below). */
#define MT__PRELOAD_RA() ((const void *)__builtin_return_address(0))
/* A runtime hook forwarding to the real runtime records ra (its caller) for the driver
 * hooks the runtime reaches on this thread, unless an outer one did; pop restores. */
const void *mt__preload_outer_push(const void *ra);
void mt__preload_outer_pop(const void *prev);

/* size bytes at key (a device address, or a cuMemCreate handle when handle) were taken on
 * device outside the allocators for the module of ra (or of the caller an enclosing
 * runtime hook recorded on this thread): remembered and reported (unless
 * device has no allocator and making one would make a context, see outside.c). */
void mt__preload_outside_alloc(int device, bool handle, uint64_t key, uint64_t size,
                               const void *ra);
/* Takes key's record out: true if key was reported by outside_alloc (*out filled). A
 * free takes the record before the driver frees, so the address cannot be handed out and
 * recorded again in between; untake puts it back when the driver refused the free;
 * freed reports a done free. */
bool mt__preload_outside_take(bool handle, uint64_t key, mt__preload_fwd_t *out);
void mt__preload_outside_untake(bool handle, uint64_t key, const mt__preload_fwd_t *r);
void mt__preload_outside_freed(uint64_t key, const mt__preload_fwd_t *r);
/* After the free of a pointer taken from the table (freed: the free succeeded): reported
 * freed, else put back. */
void mt__preload_outside_settle(uint64_t key, const mt__preload_fwd_t *r, bool freed);
/* Device d goes (reset, primary context destroyed, which free its memory): its records are
 * reported freed through a (when not NULL), and on sim freed from sim_backend. */
void mt__preload_outside_drop(int device, mt_alloc_t *a, mt_backend_t *sim_backend);
/* In a fork child: forgets the parent's records and the state of their lock. */
void mt__preload_outside_fork_child(void);

/* The device of driver pointer p (cuda mode: the driver's answer), else fallback. */
int mt__preload_ptr_device(uint64_t p, int fallback);

/* Sim: size bytes of device's backend, outside its allocator, as the driver would give
 * them (the caches are emptied and the call made again when the device is full). */
int mt__preload_outside_sim_malloc(int device, size_t size, void **out);
/* Sim: frees p, the outside allocation r, after the device's work. */
int mt__preload_outside_sim_free(void *p, const mt__preload_fwd_t *r);
/* Sim: a pitched allocation (depth slices of height rows of width bytes) on the current
 * device, reported for the module of ra. MT_EINVAL for an empty extent. */
int mt__preload_outside_sim_pitch(size_t width, size_t height, size_t depth, const void *ra,
                                  void **out, size_t *pitch);

#endif
