/* Test hooks of the sim backend. Internal (mt__ prefix): reachable from tests and tools
 * that link the static library, not exported from the shared one. Each returns MT_EINVAL
 * (or 0 / false) when b is not a sim backend. */
#ifndef MT_ALLOCATOR_BACKEND_SIM_H
#define MT_ALLOCATOR_BACKEND_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/backend.h"

/* True if b was made by the sim backend. */
bool mt__sim_is_sim(const mt_backend_t *b);
/* The next n segment mallocs and vm_maps fail with MT_ENOMEM (replaces any previous n). */
int mt__sim_inject_malloc_failures(mt_backend_t *b, unsigned n);
/* The same with another code (rc < 0): a device malloc that fails for a reason other than memory.
 */
int mt__sim_inject_malloc_errors(mt_backend_t *b, unsigned n, int rc);
/* Replaces the modelled cost (busy-waited and added to modelled_ns) of one segment
 * malloc or vm_map (malloc_ns) and of one segment free or vm_unmap (free_ns). */
void mt__sim_set_costs(mt_backend_t *b, uint64_t malloc_ns, uint64_t free_ns);
/* Device bytes in use: live segments (rounded as accounted) plus mapped VM pages. */
size_t mt__sim_used_bytes(const mt_backend_t *b);
/* Number of live segments. */
size_t mt__sim_segment_count(const mt_backend_t *b);
/* Calls cb(ud, name) at the start of every call that can block or take the driver's
 * locks: device/stream/event synchronize and vm_reserve/release/map/unmap as the backend's
 * user makes them (not the device synchronise inside a segment free). cb = NULL removes it.
 * cb runs on the calling thread, without any lock of the sim held. */
int mt__sim_set_call_hook(mt_backend_t *b, void (*cb)(void *ud, const char *call), void *ud);
/* The next n event creations fail with MT_ENOMEM (replaces any previous n). */
int mt__sim_inject_event_failures(mt_backend_t *b, unsigned n);
/* An access of [ptr, ptr+n) of managed memory from location (MT_MANAGED_HOST: the CPU;
 * b's ordinal: a kernel), made now on the calling thread: faults, migrations and evictions
 * as docs/managed-memory.md says, counted in mt_backend_managed_stats. MT_EINVAL when the
 * span is not inside one managed allocation of b. */
int mt__sim_managed_access(mt_backend_t *b, const void *ptr, size_t n, int location, bool write);
/* Walks the invariants of the memory state (sim_internal.h, at sim_t); 0 if they hold,
 * MT_EIO on the first violation. */
int mt__sim_check(const mt_backend_t *b);
/* Walks the invariants of the stream-ordered pool (sim_async.c, at sim_pool_t); 0 if they
 * hold, MT_EIO on a violation. */
int mt__sim_pool_check(const mt_backend_t *b);
/* Chunks (device segments) the stream-ordered pool holds. */
size_t mt__sim_pool_chunk_count(const mt_backend_t *b);

#endif
