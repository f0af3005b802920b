/* Stream capture's private pools (hooks_graph.c), for the hooks that see a graph go and
 * the device teardown. */
#ifndef MT_PRELOAD_HOOKS_GRAPH_H
#define MT_PRELOAD_HOOKS_GRAPH_H

#include "memtrace/alloc.h"

/* The program destroyed graph (cudaGraphDestroy, cuGraphDestroy): its capture's pool is
 * released once no executable graph made from it remains and its blocks are free. */
void mt__preload_graph_destroyed(void *graph);
/* Allocator a is being destroyed (its device dropped): its captures are forgotten, their
 * pools going with it. */
void mt__preload_graph_forget(mt_alloc_t *a);

#endif
