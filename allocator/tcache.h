/* Per-thread caches (tcache.c, docs/allocator-tcache.md): the calls the allocator's other
 * files make into them. */
#ifndef MT_ALLOCATOR_TCACHE_H
#define MT_ALLOCATOR_TCACHE_H

#include "allocator/internal.h"

/* The fast paths run without mu, excluded from a cache by a thread holding mu that claims
 * it (tcache.c); a claimer takes no other lock meanwhile. */
/* Fast paths, without mu (a cached pair), each ending in a tail call of the global path
 * when it cannot serve: mt_alloc_malloc's and mt_alloc_free's results (arguments checked;
 * size > 0, *out = NULL; ra: the program's return address, where its stack is cut). */
int mt__tc_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out,
                  uintptr_t ra);
int mt__tc_free(mt_alloc_t *a, void *ptr);
/* The global paths (alloc.c, free.c); mine: the calling thread's cache for a, or NULL. */
int mt__alloc_malloc_global(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out,
                            uintptr_t ra, mt__tcache_t *mine);
int mt__alloc_free_global(mt_alloc_t *a, void *ptr, mt__tcache_t *mine);
/* Before taking mu on a global path (mt__tc_prepare, tcache_impl.h): frees a TLS entry for
 * a when every one is taken (mu not held). */
void mt__tc_prepare_slow(mt_alloc_t *a);
/* The calling thread's cache for a, or NULL. */
mt__tcache_t *mt__tc_mine(const mt_alloc_t *a);
/* Registers a in the registry of live allocators (create) / removes it and frees its
 * caches (destroy: unregister before taking mu, free_all with mu held). */
int mt__tc_register(mt_alloc_t *a);
void mt__tc_unregister(mt_alloc_t *a);
void mt__tc_free_all(mt_alloc_t *a);
/* Global-path malloc: the calling thread's cache (mine, from mt__tc_prepare) is flushed
 * (so the search sees its free blocks merged), before the search. */
void mt__tc_flush_mine(mt_alloc_t *a, mt__tcache_t *mine);
/* Flushes every cache, and hands over the global path's events held back (emit.c); true when
 * a held block went back to the bins. */
bool mt__tc_flush_all(mt_alloc_t *a);
/* Flushes every cache but the calling thread's (flushed already by the global path) that
 * owns planned blocks (the plan's global path: it must see them freed). */
void mt__tc_flush_others(mt_alloc_t *a);
/* Before counting a global-path allocation of a size-byte block, req requested, in stat
 * slot sp (mt__stat_slot) with tag: flushes every cache if a counter would pass its peak
 * (then the new peak is exact). */
void mt__tc_peak_guard(mt_alloc_t *a, const mt__tcache_t *mine, int sp, size_t size, size_t req,
                       int tag);
/* After a global-path allocation: the calling thread's cache owns b (so its free may take
 * the fast path), if repeat: b's pair would leave a warm-up plan as it is. */
void mt__tc_own(mt_alloc_t *a, mt__tcache_t *mine, mt_block_t *b, int sp, bool repeat);
/* A global-path free of owned block b (b->tce != NULL): MT_ENOENT when b is held in its
 * cache (freed already); else b leaves its owner, its counters made the program's. */
int mt__tc_disown(mt_alloc_t *a, mt_block_t *b);
/* Claims/releases b's owner's cache (b->tce != NULL) around a read or record_stream. */
void mt__tc_lock_owner(mt_block_t *b);
void mt__tc_unlock_owner(mt_block_t *b);
/* Owned block b (its owner claimed): whether the program freed it into the cache. */
bool mt__tc_held(const mt_block_t *b);
/* Owned block b's streams (nuses) changed (its owner claimed): its fast free sees it. */
void mt__tc_used(mt_block_t *b);
/* Hands c's recorded fast operations to the sink (a->rec; the owner inside its exclusion,
 * or mu held and c claimed: mt__tc_claim does it). */
void mt__tc_push(mt_alloc_t *a, mt__tcache_t *c);
/* Every cache's, then the global path's held back (mu held): a program's marker, the
 * periodic stats, the sink's flush. */
void mt__tc_push_all(mt_alloc_t *a);
/* Fast paths off and every cache flushed (before reserve or warm-up change the state),
 * then back on when the state allows (after). */
void mt__tc_quiesce(mt_alloc_t *a);
void mt__tc_resume(mt_alloc_t *a);
/* ---- fork (fork.c) ----
 * The registry of live allocators, in the fork handlers: its lock (taken before any
 * allocator's mu), its size and its i-th allocator (lock held). */
void mt__tc_reg_lock(void);
void mt__tc_reg_unlock(void);
size_t mt__tc_reg_count(void);
mt_alloc_t *mt__tc_reg_get(size_t i);
/* Claims / releases every cache of a but the calling thread's (mu held). */
void mt__tc_claim_all(mt_alloc_t *a);
void mt__tc_unclaim_all(mt_alloc_t *a);
/* In a fork child: the registry's lock made anew (the parent's handler held it). */
void mt__tc_fork_child_reg(void);
/* In a fork child, mu held: every gate opened, and every cache but the calling thread's
 * given back and freed (their threads do not exist in the child). */
void mt__tc_fork_child(mt_alloc_t *a);
/* Owned block b is in its owner's live table (mu held; the checker's walk). */
bool mt__tc_in_owner(const mt_block_t *b);
/* Caches registered with a (mu held). */
size_t mt__tc_count(const mt_alloc_t *a);
/* The caches' invariants (mt__tcache_t); static text of the first violation, or NULL. */
const char *mt__tc_check(mt_alloc_t *a);

#endif
