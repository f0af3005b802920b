/* A two-level segregated-fit allocator (TLSF, after Masmano et al., "TLSF: a new dynamic
 * memory allocator for real-time systems", ECRTS 2004) over one preallocated pool: malloc and
 * free in O(1), immediate coalescing, good fit. Bench-only: bench_alloc's replay table uses
 * it as the bound a one-pool allocator can reach on a trace (docs in data/traces/README.md).
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

#endif
