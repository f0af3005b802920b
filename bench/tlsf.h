/* A two-level segregated-fit allocator (TLSF, after Masmano et al., "TLSF: a new dynamic
 * memory allocator for real-time systems", ECRTS 2004) over one preallocated pool: malloc and
 * free in O(1), immediate coalescing, good fit. Bench-only: bench_alloc's replay table uses
 * it as the bound a one-pool allocator can reach on a trace (docs/bench-replay.md).
 * Not thread-safe: one pool per thread. */
#ifndef MT_BENCH_TLSF_H
#define MT_BENCH_TLSF_H

#include <stddef.h>

typedef struct mt_tlsf_s mt_tlsf_t;

/* Payload alignment and granularity, bytes. */
#define MT_TLSF_ALIGN 16
/* Largest request the pool can serve, bytes (the first level covers sizes below 2^40). */
#define MT_TLSF_MAX_REQUEST (((size_t)1 << 40) - 4096)

/* Makes a pool of pool_bytes (rounded up to pages) of fresh anonymous memory, reserved but
 * not touched: a cold pass pays its first touch. *out is new; free it with mt_tlsf_destroy.
 * Returns 0, MT_EINVAL (pool smaller than a page or past MT_TLSF_MAX_REQUEST) or MT_ENOMEM. */
int mt_tlsf_create(mt_tlsf_t **out, size_t pool_bytes);
/* Unmaps the pool and frees the control structure; sets *p = NULL. */
void mt_tlsf_destroy(mt_tlsf_t **p);
/* A block of at least size bytes aligned to MT_TLSF_ALIGN, or NULL when no free block is
 * large enough. size 0 is served as MT_TLSF_ALIGN bytes. */
void *mt_tlsf_malloc(mt_tlsf_t *t, size_t size);
/* Returns p (from mt_tlsf_malloc on t, or NULL) to the pool. */
void mt_tlsf_free(mt_tlsf_t *t, void *p);
/* Highest offset from the pool's start ever reached by a block in use, header included:
 * the memory a one-pool allocator had to have, bytes. */
size_t mt_tlsf_high_water(const mt_tlsf_t *t);
/* The pool: its first byte and its length in bytes. */
void mt_tlsf_bounds(const mt_tlsf_t *t, const char **base, size_t *bytes);
/* Bytes in use now (block payloads, after rounding). */
size_t mt_tlsf_in_use(const mt_tlsf_t *t);
/* Walks the pool and the free lists and checks every invariant of the control structure
 * (tlsf.c, at mt_tlsf_s). Returns 0 or MT_EPROTO. O(pool blocks): tests only. */
int mt_tlsf_check(const mt_tlsf_t *t);

/* ---- the same with its records out of band (tlsf_oob.c) ----
 * The bound for an allocator that may not touch the memory it hands out, as a device
 * allocator on the host may not: the pool is mapped PROT_NONE and never read or written.
 * Each block's record (its size and flags, its physical predecessor, its list links) lives
 * in a host table indexed by the block's first granule, which is also how a free finds it
 * (one load, no hash). Requests are rounded up to MT_TLSF_OOB_GRAN bytes, as memtrace and
 * PyTorch's allocator round them. Levels, lists and good fit as above. */
#define MT_TLSF_OOB_GRAN 512
/* Largest pool, bytes: granule counts and indices are 30-bit. */
#define MT_TLSF_OOB_MAX_POOL (((size_t)1 << 30) * MT_TLSF_OOB_GRAN - MT_TLSF_OOB_GRAN)

typedef struct mt_tlsf_oob_s mt_tlsf_oob_t;

/* A pool of pool_bytes (rounded up to granules) that nothing may touch, and its record table,
 * reserved but not touched. Returns 0, MT_EINVAL (below one granule or past
 * MT_TLSF_OOB_MAX_POOL) or MT_ENOMEM. */
int mt_tlsf_oob_create(mt_tlsf_oob_t **out, size_t pool_bytes);
void mt_tlsf_oob_destroy(mt_tlsf_oob_t **p);
/* A block of at least size bytes (size 0: one granule) aligned to MT_TLSF_OOB_GRAN, or NULL. */
void *mt_tlsf_oob_malloc(mt_tlsf_oob_t *t, size_t size);
void mt_tlsf_oob_free(mt_tlsf_oob_t *t, void *p);
/* As mt_tlsf_high_water, mt_tlsf_bounds, mt_tlsf_in_use and mt_tlsf_check. */
size_t mt_tlsf_oob_high_water(const mt_tlsf_oob_t *t);
void mt_tlsf_oob_bounds(const mt_tlsf_oob_t *t, const char **base, size_t *bytes);
size_t mt_tlsf_oob_in_use(const mt_tlsf_oob_t *t);
int mt_tlsf_oob_check(const mt_tlsf_oob_t *t);

#endif
