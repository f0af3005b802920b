/* What the ring's tests share: a consumer callback that collects events and gaps, and
 * a plain event. */
#ifndef MT_TESTS_PROF_RING_TEST_UTIL_H
#define MT_TESTS_PROF_RING_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "profiler/ring.h"

typedef struct collect_s {
    mt_event_rec_t *evs; /* events delivered, in order */
    size_t n, cap;
    uint64_t gaps;  /* sum of gap sizes */
    size_t ngaps;   /* number of gap records */
    int gap_before; /* index in evs before which the first gap arrived; -1 none */
} collect_t;

static inline void collect_cb(void *ud, const mt_event_rec_t *ev)
{
    collect_t *c = ud;
    if (ev->kind == MT_EV_GAP) {
        if (c->ngaps == 0)
            c->gap_before = (int)c->n;
        c->gaps += ev->size;
        c->ngaps++;
        return;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->evs = realloc(c->evs, c->cap * sizeof(*c->evs));
        assert_non_null(c->evs);
    }
    c->evs[c->n++] = *ev;
}

static inline void collect_init(collect_t *c)
{
    memset(c, 0, sizeof(*c));
    c->gap_before = -1;
}

static inline mt_event_rec_t mkev(uint64_t i)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = MT_EV_ALLOC;
    ev.addr = 0x1000 + i * 512;
    ev.size = 512;
    ev.requested = i;
    ev.time_ns = i;
    return ev;
}

#endif
