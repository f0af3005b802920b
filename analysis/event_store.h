/* Storing an event into a large array that is written once and read much later (the report's
 * events): one whole cache line written around the cache. */
#ifndef MT_ANALYSIS_EVENT_STORE_H
#define MT_ANALYSIS_EVENT_STORE_H

#include "memtrace/event.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* *dst = *src, dst 64-byte aligned. With SSE2 the line is streamed to memory: such arrays are
 * far larger than the cache, and an ordinary store first reads the line it overwrites (a fifth
 * of `memtrace report`'s time went to that stall). For arrays the storing thread reads back
 * itself (a thread always sees its own streaming stores); another thread would need an sfence
 * before the hand-over. */
static inline void mt__event_store(mt_event_rec_t *dst, const mt_event_rec_t *src)
{
#if defined(__SSE2__)
    _Static_assert(sizeof(mt_event_rec_t) == 64, "an event is one cache line");
    const __m128i *s = (const __m128i *)src;
    __m128i *d = (__m128i *)dst;
    _mm_stream_si128(d, _mm_loadu_si128(s));
    _mm_stream_si128(d + 1, _mm_loadu_si128(s + 1));
    _mm_stream_si128(d + 2, _mm_loadu_si128(s + 2));
    _mm_stream_si128(d + 3, _mm_loadu_si128(s + 3));
#else
    *dst = *src;
#endif
}

#endif
