/* Stream capture's private pools (hooks_graph.c), for the hooks that see a graph go and
 * the device teardown. */
#ifndef MT_PRELOAD_HOOKS_GRAPH_H
#define MT_PRELOAD_HOOKS_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "memtrace/alloc.h"

/* The program destroyed graph (cudaGraphDestroy, cuGraphDestroy): its capture's pool is
 * released once no executable graph made from it remains and its blocks are free. */
void mt__preload_graph_destroyed(void *graph);
/* Allocator a is being destroyed (its device dropped): its captures are forgotten, their
 * pools and kept blocks going with it. */
void mt__preload_graph_forget(mt_alloc_t *a);
/* memtrace_record_stream(ptr, handle) while handle is capturing: true if the use is noted
 * with the capture instead of the allocator (no event on the capturing stream). */
bool mt__preload_graph_use(mt_alloc_t *a, void *ptr, void *handle);
/* Before a free of ptr (allocator a): 1 if a live capture used the block, which it now
 * keeps until the capture is released (the free is done); MT_ENOENT if the capture keeps
 * it already (a double free); 0 otherwise. */
int mt__preload_graph_keep(mt_alloc_t *a, void *ptr);
/* Whether s's requests serve a capture now: s is routed to a capture's pool, or the driver
 * says s is capturing (a capture no hook saw), and s is routed from now on. */
bool mt__preload_graph_routed(const mt_stream_t *s);
/* torch's beginAllocateToPool / endAllocateToPool / releasePool for its pool id (id0, id1)
 * on device (memtrace_begin_allocate_to_pool etc., api.c). */
void mt__preload_graph_pool_begin(int device, uint64_t id0, uint64_t id1);
void mt__preload_graph_pool_end(int device, uint64_t id0, uint64_t id1);
void mt__preload_graph_pool_release(int device, uint64_t id0, uint64_t id1);
/* The capture hooks (hooks_capture.c), after the real call succeeded as the outermost one:
 * a capture began on the program's stream handle (device: the caller's), it ended (graph:
 * what it made, NULL if it failed), graph was instantiated as exec, exec was destroyed. */
void mt__preload_graph_begun(void *handle, int device);
void mt__preload_graph_ended(void *handle, void *graph);
void mt__preload_graph_instantiated(void *graph, void *exec);
void mt__preload_graph_exec_gone(void *exec);

#endif
