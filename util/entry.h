/* Where the program called into memtrace, per thread: the return address into the caller
 * of the outermost memtrace entry point (mt_alloc_malloc, the host cache, the preload's
 * hooks). The stack capture cuts the unwound stack there, so that the first frame shown
 * is the program's, not memtrace's (allocator, preload hooks, CUDA runtime shims). */
#ifndef MT_UTIL_ENTRY_H
#define MT_UTIL_ENTRY_H

#include <stdint.h>

extern _Thread_local uintptr_t mt__entry_ra;

/* Marks this thread as entering memtrace from ra (__builtin_return_address(0)) unless it
 * already is inside; returns what to give mt__entry_leave. */
static inline uintptr_t mt__entry_enter(uintptr_t ra)
{
    uintptr_t saved = mt__entry_ra;
    if (saved == 0)
        mt__entry_ra = ra;
    return saved;
}

static inline void mt__entry_leave(uintptr_t saved)
{
    mt__entry_ra = saved;
}

#endif
