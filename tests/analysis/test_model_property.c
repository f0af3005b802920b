/* Property test: the event model against the allocator. Random workloads on the sim backend
 * (mixed sizes, three streams with record_stream, expandable segments on and off,
 * empty_cache, warm-up, reservations, OOMs, garbage collection); a sink feeds every event
 * to the model, and after every operation the model must equal the allocator's own stats
 * and snapshot exactly: allocated, reserved, per-tag bytes, blocks, segment map, free bytes
 * and largest free block. The same events feed the recorder's OOM-snapshot follower (the
 * snapshot written without a daemon): its segments and live blocks must equal the
 * allocator's segment by segment after every operation, and the pickle it writes at an OOM
 * must too. Then the recorded stream is replayed with random events dropped:
 * every figure must stay within bounds, and the model must mark as uncertain whatever it
 * cannot know. A run of repeated pairs compares only every few operations, so that the
 * thread cache serves pairs between the comparisons (which flush it) and records them.
 * Seeded; MT_MODEL_PROPERTY_OPS sets the operations per run (default 4000). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <unistd.h>

#include "analysis/model.h"
#include "analysis/model_internal.h"
#include "allocator/tcache_impl.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "profiler/internal.h"
#include "tests/common/test_main.h"
#include "util/evbatch.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* The sink: numbers the events as a recorder would, keeps them, feeds the model. */
typedef struct feed_s {
    mt_event_sink_t sink;
    mt_model_t *m;
    mt__oomsnap_t *o; /* the recorder's follower, writing into dir */
    char dir[64];
    unsigned ooms;     /* OOM events on device 0: the number in the next snapshot's name */
    uint64_t pickles;  /* snapshots the follower has written, as last seen */
    unsigned compared; /* of them, compared with the allocator's snapshot */
    mt_event_rec_t *ev;
    size_t n, cap;
    uint64_t seq;
} feed_t;

static void feed_emit(void *ud, const mt_event_rec_t *ev)
{
    feed_t *f = ud;
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 4096;
        f->ev = realloc(f->ev, f->cap * sizeof(*f->ev));
        if (!f->ev)
            abort();
    }
    mt_event_rec_t e = *ev;
    e.seq = f->seq++;
    f->ev[f->n++] = e;
    if (mt__model_apply(f->m, &e) != 0)
        abort();
    static const char labels[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
    if (f->o != NULL) {
        f->ooms += e.kind == MT_EV_OOM && e.device == 0;
        mt__oomsnap_record(f->o, &e, labels, NULL, NULL);
    }
}

/* A sink that takes a cache's batches in two steps (event.h, claim and write), as the
 * profiler's ring does: places are taken in order, filled later and at once by the
 * threads, and the events reach the model in the order of their places (slots_drain, with
 * the threads parked). Single events take a place and fill it at once. */
enum { SLOTS = 1 << 20 };
typedef struct slots_s {
    mt_event_sink_t sink;
    feed_t *feed;
    mt_event_rec_t *ev;
    _Atomic uint8_t *filled;
    _Atomic size_t claimed;
    size_t applied;
    int64_t total;                  /* allocated bytes the last event applied carried */
    uint32_t stacks;                /* stack callback's calls */
    _Atomic size_t batches, folded; /* write_batch's calls, and pop+free entries in them */
    _Atomic size_t repeats;         /* their pairs after the first (a loop's, in one entry) */
    void (*src_push)(void *);       /* the allocator's source (event.h): what it keeps back */
    void *src_arg;
} slots_t;

static void slots_source(void *ud, void (*push)(void *arg), void *arg, bool on)
{
    slots_t *s = ud;
    s->src_push = on ? push : NULL;
    s->src_arg = on ? arg : NULL;
}

static bool slots_claim(void *ud, size_t n, uint64_t tok[2])
{
    slots_t *s = ud;
    size_t pos = atomic_fetch_add(&s->claimed, n);
    if (pos + n > SLOTS)
        abort();
    tok[0] = pos;
    tok[1] = 0;
    return true;
}

static void slots_write(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    slots_t *s = ud;
    for (size_t i = 0; i < n; i++) {
        s->ev[tok[0] + i] = ev[i];
        atomic_store(&s->filled[tok[0] + i], 1);
    }
}

/* A cache's batch in compact form (util/evbatch.h), its events made here, as the ring's
 * reader makes them. */
typedef struct slots_fill_s {
    slots_t *s;
    size_t pos;
} slots_fill_t;

static void slots_fill_one(void *ud, const mt_event_rec_t *ev)
{
    slots_fill_t *f = ud;
    f->s->ev[f->pos] = *ev;
    f->s->ev[f->pos].seq = 0; /* the sink's to set, as for written events */
    atomic_store(&f->s->filled[f->pos], 1);
    f->pos++;
}

static void slots_write_batch(void *ud, const uint64_t tok[2], const void *hdr, const void *ents)
{
    slots_t *s = ud;
    const mt__evb_hdr_t *h = hdr;
    const mt__evb_ent_t *e = ents;
    atomic_fetch_add(&s->batches, 1);
    for (uint32_t i = 0; i < h->nent; i++) {
        atomic_fetch_add(&s->folded, e[i].op == MT__EVB_POP_FREE);
        atomic_fetch_add(&s->repeats, e[i].rep);
    }
    slots_fill_t f = {ud, tok[0]};
    if (mt__evb_expand(hdr, ents, 0, slots_fill_one, &f) != 0)
        abort(); /* the allocator's own batches are always whole */
}

static void slots_emit(void *ud, const mt_event_rec_t *ev)
{
    uint64_t tok[2];
    slots_claim(ud, 1, tok);
    slots_write(ud, tok, ev, 1);
}

/* An empty slots sink; batches: it takes a cache's batches in compact form. */
static void slots_init(slots_t *sl, bool batches)
{
    *sl = (slots_t){.sink = {.emit = slots_emit,
                             .claim = slots_claim,
                             .write = slots_write,
                             .write_batch = batches ? slots_write_batch : NULL,
                             .source = slots_source,
                             .ud = sl},
                    .ev = calloc(SLOTS, sizeof(mt_event_rec_t)),
                    .filled = calloc(SLOTS, 1)};
    assert_true(sl->ev != NULL && sl->filled != NULL);
}

/* Every place filled so far goes to the model, in order (none may be missing), each
 * event's allocated total the one before it plus what it tells: the order of the places
 * is the order of the totals. */
static void slots_drain(slots_t *s)
{
    size_t end = atomic_load(&s->claimed);
    for (; s->applied < end; s->applied++) {
        assert_true(atomic_load(&s->filled[s->applied]));
        const mt_event_rec_t *ev = &s->ev[s->applied];
        int64_t d = ev->kind == MT_EV_ALLOC            ? (int64_t)ev->size
                    : ev->kind == MT_EV_FREE_REQUESTED ? -(int64_t)ev->size
                                                       : 0;
        if (s->applied > 0 && (int64_t)ev->allocated != s->total + d)
            fail_msg("place %zu (%s): allocated %llu, expected %lld", s->applied,
                     mt_event_kind_name(ev->kind), (unsigned long long)ev->allocated,
                     (long long)(s->total + d));
        s->total = (int64_t)ev->allocated;
        feed_emit(s->feed, ev);
    }
}

static void check_model(const mt_model_t *m, const char *when)
{
    char why[256] = "";
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("%s: mt__model_check: %s", when, why);
}

/* ---- the model equals the allocator ---- */

typedef struct span_s {
    uint64_t a, e;
} span_t;

/* Address ranges, merged where they touch (an expandable segment is one range in the
 * snapshot; the model merges its adjacent mapped pages). Returns the count. */
static size_t coalesce(span_t *v, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && v[k - 1].e == v[i].a)
            v[k - 1].e = v[i].e;
        else
            v[k++] = v[i];
    }
    return k;
}

static void compare(mt_alloc_t *a, const mt_model_t *m, size_t op)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    const mt_alloc_stats_t *st = &snap->stats;
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(m, MT_MODEL_DEVICE, &f), 0);
    if (f.allocated != (uint64_t)st->allocated_bytes[MT_STAT_ALL].current ||
        f.reserved != (uint64_t)st->reserved_bytes[MT_STAT_ALL].current)
        fail_msg("op %zu: model allocated/reserved %llu/%llu, allocator %lld/%lld", op,
                 (unsigned long long)f.allocated, (unsigned long long)f.reserved,
                 (long long)st->allocated_bytes[MT_STAT_ALL].current,
                 (long long)st->reserved_bytes[MT_STAT_ALL].current);
    assert_false(f.uncertain);
    for (int t = 0; t < MT_TAG_MAX; t++) {
        mt_model_tag_t tg;
        mt__model_tag(m, MT_MODEL_DEVICE, t, &tg);
        if (tg.bytes != (uint64_t)st->tag_allocated_bytes[t].current)
            fail_msg("op %zu: tag %d model %llu, allocator %lld", op, t,
                     (unsigned long long)tg.bytes, (long long)st->tag_allocated_bytes[t].current);
    }
    if (f.total_free != st->total_free || f.largest_free != st->largest_free_block)
        fail_msg("op %zu: free %llu largest %llu, allocator %llu largest %llu", op,
                 (unsigned long long)f.total_free, (unsigned long long)f.largest_free,
                 (unsigned long long)st->total_free, (unsigned long long)st->largest_free_block);
    assert_true(f.fragmentation == mt__model_fragmentation(st->largest_free_block, st->total_free));

    /* The segment map and its blocks. */
    mt_model_map_t map;
    assert_int_equal(mt__model_map(m, MT_MODEL_DEVICE, &map), 0);
    span_t *ss = calloc(snap->nsegments + 1, sizeof(*ss));
    span_t *ms = calloc(map.nsegs + 1, sizeof(*ms));
    assert_true(ss && ms);
    size_t nb = 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        ss[i] = (span_t){s->addr, s->addr + s->size};
        for (size_t j = 0; j < s->nblocks; j++) {
            const mt_snapshot_block_t *b = &s->blocks[j];
            if (b->state == MT_BLOCK_INACTIVE)
                continue;
            if (nb >= map.nblocks || map.blocks[nb].addr != b->addr ||
                map.blocks[nb].size != b->size || map.blocks[nb].tag != b->tag ||
                map.blocks[nb].pending != (b->state == MT_BLOCK_ACTIVE_PENDING_FREE))
                fail_msg("op %zu: block %zu at %#llx (%llu bytes) differs from the model's", op, nb,
                         (unsigned long long)b->addr, (unsigned long long)b->size);
            nb++;
        }
    }
    assert_int_equal(nb, map.nblocks);
    for (size_t i = 0; i < map.nsegs; i++)
        ms[i] = (span_t){map.segs[i].addr, map.segs[i].addr + map.segs[i].size};
    size_t ns = coalesce(ss, snap->nsegments), nm = coalesce(ms, map.nsegs);
    if (ns != nm || memcmp(ss, ms, ns * sizeof(*ss)) != 0)
        fail_msg("op %zu: segment map differs (%zu ranges, model %zu)", op, ns, nm);
    free(ss);
    free(ms);
    mt__model_map_free(&map);
    mt_alloc_snapshot_free(&snap);
}

/* ---- the recorder's OOM snapshot equals the allocator ---- */

static int cmp_oblock(const void *x, const void *y)
{
    const mt__oomsnap_block_t *a = x, *b = y;
    return a->addr < b->addr ? -1 : a->addr > b->addr;
}

/* The follower's segment map and live blocks against the snapshot, segment by segment. */
static void compare_follower(const mt_alloc_snapshot_t *snap, const mt__oomsnap_t *o,
                             const char *when)
{
    char why[256] = "";
    if (mt__oomsnap_check(o, why, sizeof why) != 0)
        fail_msg("%s: mt__oomsnap_check: %s", when, why);
    const mt__segmap_t *segs;
    const mt__oomsnap_block_t *blocks;
    size_t nblocks;
    mt__oomsnap_view(o, &segs, &blocks, &nblocks);
    mt__oomsnap_block_t *v = malloc((nblocks + 1) * sizeof(*v));
    assert_non_null(v);
    memcpy(v, blocks, nblocks * sizeof(*v));
    qsort(v, nblocks, sizeof(*v), cmp_oblock);
    if (mt__segmap_count(segs) != snap->nsegments)
        fail_msg("%s: the follower has %zu segments, the allocator %zu", when,
                 mt__segmap_count(segs), snap->nsegments);
    size_t k = 0;
    mt__segmap_it_t it = mt__segmap_first(segs);
    for (size_t i = 0; i < snap->nsegments; i++, mt__segmap_next(&it)) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        const mt__seg_t *g = mt__segmap_get(it);
        if (g->addr != s->addr || g->size != s->size || g->mapped != s->expandable)
            fail_msg("%s: segment %zu: follower %#llx + %llu, allocator %#llx + %llu", when, i,
                     (unsigned long long)g->addr, (unsigned long long)g->size,
                     (unsigned long long)s->addr, (unsigned long long)s->size);
        for (size_t j = 0; j < s->nblocks; j++) {
            const mt_snapshot_block_t *b = &s->blocks[j];
            if (b->state == MT_BLOCK_INACTIVE)
                continue;
            if (k >= nblocks || v[k].addr != b->addr || v[k].size != b->size ||
                v[k].tag != b->tag || v[k].pending != (b->state == MT_BLOCK_ACTIVE_PENDING_FREE))
                fail_msg("%s: segment %zu: block %#llx (%llu bytes) differs from the follower's",
                         when, i, (unsigned long long)b->addr, (unsigned long long)b->size);
            k++;
        }
    }
    if (k != nblocks)
        fail_msg("%s: the follower has %zu live blocks, the allocator %zu", when, nblocks, k);
    free(v);
}

/* The pickle the follower wrote at the OOM just seen, if it wrote one, against the
 * snapshot. */
static void compare_pickle(const mt_alloc_snapshot_t *snap, feed_t *f, const char *when)
{
    mt__oomsnap_flush(f->o);
    uint64_t written, suppressed;
    mt__oomsnap_stats(f->o, &written, &suppressed);
    if (written == f->pickles)
        return; /* within the interval */
    f->pickles = written;
    f->compared++;
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/oom-%d-dev0-%u.pickle", f->dir, (int)getpid(), f->ooms);
    mt_ts_t *ts = NULL;
    if (mt__ts_read(&ts, path, err, sizeof err) != 0)
        fail_msg("%s: %s", when, err);
    if (ts->nsegments != snap->nsegments)
        fail_msg("%s: the OOM pickle has %zu segments, the allocator %zu", when, ts->nsegments,
                 snap->nsegments);
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        const mt_ts_segment_t *g = &ts->segments[i];
        uint64_t alloc = 0, active = 0;
        size_t live = 0, tlive = 0;
        for (size_t j = 0; j < s->nblocks; j++) {
            alloc += s->blocks[j].state == MT_BLOCK_ACTIVE_ALLOCATED ? s->blocks[j].size : 0;
            active += s->blocks[j].state != MT_BLOCK_INACTIVE ? s->blocks[j].size : 0;
            live += s->blocks[j].state != MT_BLOCK_INACTIVE;
        }
        for (uint32_t j = 0; j < g->nblocks; j++)
            tlive += ts->blocks[g->first_block + j].state != MT_TS_INACTIVE;
        if (g->addr != s->addr || g->total_size != s->size || g->expandable != s->expandable ||
            g->allocated_size != alloc || g->active_size != active || tlive != live)
            fail_msg("%s: OOM pickle segment %zu: %#llx + %llu (%llu allocated, %zu live "
                     "blocks), allocator %#llx + %llu (%llu, %zu)",
                     when, i, (unsigned long long)g->addr, (unsigned long long)g->total_size,
                     (unsigned long long)g->allocated_size, tlive, (unsigned long long)s->addr,
                     (unsigned long long)s->size, (unsigned long long)alloc, live);
    }
    mt__ts_destroy(&ts);
}

static void compare_recorder(mt_alloc_t *a, feed_t *f, bool oom, const char *when)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    compare_follower(snap, f->o, when);
    if (oom)
        compare_pickle(snap, f, when);
    mt_alloc_snapshot_free(&snap);
}

/* A source to register (event.h): with one, the allocator keeps the global path's events
 * back (emit.c); a comparison's snapshot hands them over. */
static void feed_source(void *ud, void (*push)(void *arg), void *arg, bool on)
{
    (void)ud, (void)push, (void)arg, (void)on;
}

/* interval_ms: between two OOM snapshots of the follower (0: at every OOM). */
static void feed_open(feed_t *feed, unsigned interval_ms)
{
    memset(feed, 0, sizeof(*feed));
    feed->sink.emit = feed_emit;
    feed->sink.source = feed_source;
    feed->sink.ud = feed;
    assert_int_equal(mt__model_create(&feed->m, NULL), 0);
    snprintf(feed->dir, sizeof feed->dir, "/tmp/mt-test-prop-XXXXXX");
    assert_non_null(mkdtemp(feed->dir));
    mt__oomsnap_cfg_t oc = {
        .pid = (int)getpid(), .dir = feed->dir, .keep = 1, .interval_ms = interval_ms};
    assert_int_equal(mt__oomsnap_create(&feed->o, &oc), 0);
}

/* ---- workloads ---- */

typedef struct live_s {
    void *p;
    size_t size;
    mt_stream_t *s;
    int tag;
} live_t;

/* The run's shape: a comparison every compare_every operations; pair_per_mille of the
 * operations free a live block and ask its size again on its stream at once. */
static size_t compare_every = 1;
static unsigned pair_per_mille = 0;
static size_t cached_pairs; /* pairs whose free went into the thread cache (recorded there) */
static size_t cached_pops;  /* of them, those whose request took the block back from it */

enum { MAXLIVE = 192 };

static size_t random_size(uint64_t *seed)
{
    uint64_t r = rng(seed) % 100;
    if (r < 60)
        return 1 + rng(seed) % (64 * KIB);
    if (r < 92)
        return 1 + rng(seed) % (4 * MIB);
    return 1 + rng(seed) % (48 * MIB);
}

static size_t ops_per_run(void)
{
    const char *e = getenv("MT_MODEL_PROPERTY_OPS");
    long v = e ? strtol(e, NULL, 10) : 0;
    return v > 0 ? (size_t)v : 4000;
}

/* Blocks the calling thread's cache holds (freed into it, not yet taken back or flushed). */
static size_t held_here(const mt_alloc_t *a)
{
    const mt__tcache_t *c = mt__tc_mine(a);
    return c != NULL ? __atomic_load_n(&c->nheld, __ATOMIC_RELAXED) : 0; /* flushes race */
}

/* A sim device of capacity bytes whose mallocs cost no time. */
static mt_backend_t *sim_backend(size_t capacity)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = capacity;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    return b;
}

/* Runs nops random operations with the model compared after each; returns the events. */
static void run(const char *conf, size_t capacity, uint64_t seed, feed_t *feed)
{
    mt_backend_t *b = sim_backend(capacity);
    feed_open(feed, 60000); /* the first OOM's pickle: serialising each would be slow */
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = &feed->sink;
    char err[256];
    assert_int_equal(mt_alloc_cfg_parse(&cfg, conf, err, sizeof err), 0);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    int user_tag = 0;
    assert_int_equal(mt_alloc_tag_register(a, "kv_cache", &user_tag), 0);
    mt_stream_t *streams[3] = {NULL, NULL, NULL};
    assert_int_equal(mt_stream_create(b, &streams[1]), 0);
    assert_int_equal(mt_stream_create(b, &streams[2]), 0);
    live_t live[MAXLIVE];
    size_t nlive = 0, nops = ops_per_run(), ooms = 0;
    bool warming = false;
    for (size_t op = 0; op < nops; op++) {
        uint64_t r = rng(&seed) % 1000;
        unsigned ooms_before = feed->ooms;
        if (nlive > 0 && rng(&seed) % 1000 < pair_per_mille) {
            live_t *l = &live[rng(&seed) % nlive];
            size_t held = held_here(a);
            assert_int_equal(mt_alloc_free(a, l->p), 0);
            cached_pairs += held_here(a) > held;
            held = held_here(a);
            int rc = mt_alloc_malloc(a, l->size, l->s, l->tag, &l->p);
            cached_pops += held_here(a) < held;
            if (rc == MT_ENOMEM) {
                ooms++;
                *l = live[--nlive];
            } else {
                assert_int_equal(rc, 0);
            }
        } else if ((r < 540 && nlive < MAXLIVE) || nlive == 0) {
            int tag = rng(&seed) % 8 == 0 ? user_tag : (int)(rng(&seed) % MT_TAG_USER_FIRST);
            void *p = NULL;
            size_t size = random_size(&seed);
            mt_stream_t *s = streams[rng(&seed) % 3];
            int rc = mt_alloc_malloc(a, size, s, tag, &p);
            if (rc == MT_ENOMEM)
                ooms++;
            else if (assert_int_equal(rc, 0), p)
                live[nlive++] = (live_t){p, size, s, tag};
        } else if (r < 975) {
            size_t i = rng(&seed) % nlive;
            if (r % 5 == 0)
                assert_int_equal(mt_alloc_record_stream(a, live[i].p, streams[rng(&seed) % 3]), 0);
            assert_int_equal(mt_alloc_free(a, live[i].p), 0);
            live[i] = live[--nlive];
        } else if (r < 985) {
            assert_int_equal(mt_alloc_empty_cache(a), 0);
        } else if (r < 992) {
            if (warming) {
                int rc = mt_alloc_warmup_end(a, streams[rng(&seed) % 3]);
                assert_true(rc == 0 || rc == MT_ENOMEM); /* the reservation may not fit */
            } else
                assert_int_equal(mt_alloc_warmup_begin(a), 0);
            warming = !warming;
        } else {
            int rc = mt_alloc_reserve(a, random_size(&seed), streams[rng(&seed) % 3]);
            assert_true(rc == 0 || rc == MT_ENOMEM);
        }
        if ((op + 1) % compare_every != 0 && feed->ooms == ooms_before)
            continue;
        char when[64];
        snprintf(when, sizeof when, "op %zu", op);
        check_model(feed->m, when);
        compare(a, feed->m, op);
        compare_recorder(a, feed, feed->ooms != ooms_before, when);
    }
    for (size_t i = 0; i < nlive; i++)
        assert_int_equal(mt_alloc_free(a, live[i].p), 0);
    if (warming)
        assert_true(mt_alloc_warmup_end(a, NULL) <= 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    compare(a, feed->m, nops);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &streams[1]);
    mt_stream_destroy(b, &streams[2]);
    mt_backend_destroy(&b);
    size_t kinds[MT_EV_KIND_COUNT] = {0};
    for (size_t i = 0; i < feed->n; i++)
        kinds[feed->ev[i].kind % MT_EV_KIND_COUNT]++;
    fprintf(stderr,
            "%s: %zu ops, %zu events (%zu alloc, %zu segment alloc, %zu map, %zu unmap, "
            "%zu reserve), %zu OOMs\n",
            conf ? conf : "default", nops, feed->n, kinds[MT_EV_ALLOC], kinds[MT_EV_SEGMENT_ALLOC],
            kinds[MT_EV_SEGMENT_MAP], kinds[MT_EV_SEGMENT_UNMAP], kinds[MT_EV_RESERVE], ooms);
    assert_true(kinds[MT_EV_ALLOC] > nops / 3);
    if (capacity < 256 * MIB)
        assert_true(ooms > 0 && feed->compared == 1);
}

/* ---- dropped events ---- */

/* Replays feed's events into a new model, dropping bursts of them at random, and checks
 * the bounds after every event it keeps. */
static void replay_with_drops(const feed_t *feed, uint64_t seed, unsigned drop_per_mille)
{
    mt_model_t *m = NULL;
    assert_int_equal(mt__model_create(&m, NULL), 0);
    uint64_t dropped = 0, uncertain_seen = 0;
    bool last_kept = false;
    for (size_t i = 0; i < feed->n; i++) {
        if (i + 1 < feed->n && rng(&seed) % 1000 < drop_per_mille) {
            size_t burst = 1 + rng(&seed) % 8;
            burst = burst < feed->n - 1 - i ? burst : feed->n - 1 - i;
            dropped += burst;
            i += burst - 1;
            last_kept = false;
            continue;
        }
        const mt_event_rec_t *ev = &feed->ev[i];
        assert_int_equal(mt__model_apply(m, ev), 0);
        last_kept = i + 1 == feed->n;
        if (i % 7 != 0 && !last_kept)
            continue; /* the walk below is the costly part */
        char when[64];
        snprintf(when, sizeof when, "replay event %zu", i);
        check_model(m, when);
        for (int cls = 0; cls < MT_MODEL_CLASSES; cls++) {
            mt_model_figures_t f;
            assert_int_equal(mt__model_figures(m, cls, &f), 0);
            assert_true(f.fragmentation >= 0.0 && f.fragmentation <= 1.0);
            assert_true(f.utilization >= 0.0 && f.utilization <= 1.0);
            assert_true(f.total_free <= f.reserved && f.largest_free <= f.total_free);
            assert_true(f.uncertain_bytes <= f.allocated && f.untracked_bytes <= f.allocated);
            /* the per-event readers' shortcuts (the daemon's history) give the same */
            uint64_t la, lr, lp;
            mt__model_levels(m, cls, &la, &lr, &lp);
            assert_int_equal(la, f.allocated);
            assert_int_equal(lr, f.reserved);
            assert_int_equal(lp, f.peak_allocated);
            uint64_t known = 0;
            for (int t = 0; t < MT_TAG_MAX; t++) {
                mt_model_tag_t tg;
                mt__model_tag(m, cls, t, &tg);
                assert_int_equal(mt__model_tag_bytes(m, cls, t), tg.bytes);
                assert_true(tg.bytes <= f.allocated && tg.uncertain_bytes <= f.allocated);
                known = mt_model_sat_add(known, tg.bytes);
            }
            /* The known tags never claim more than the allocator holds; when they do not
             * add up to it, the model says it is uncertain. */
            assert_true(known <= f.allocated);
            if (known != f.allocated)
                assert_true(f.uncertain);
            uncertain_seen += f.uncertain;
            if (cls == MT_MODEL_DEVICE && ev->pool != MT_POOL_HOST)
                assert_int_equal(f.allocated, ev->allocated);
        }
    }
    /* The stream ends with everything freed and the cache emptied (that event is kept):
     * no phantom bytes are left anywhere. */
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.allocated, 0);
    assert_int_equal(f.uncertain_bytes, 0);
    for (int t = 0; t < MT_TAG_MAX; t++) {
        mt_model_tag_t tg;
        mt__model_tag(m, MT_MODEL_DEVICE, t, &tg);
        assert_int_equal(tg.bytes, 0);
        assert_int_equal(tg.uncertain_bytes, 0);
    }
    if (dropped > 0)
        assert_true(mt__model_lost(m) > 0 && uncertain_seen > 0);
    fprintf(stderr, "  dropped %llu of %zu events (%u per mille bursts): bounds held\n",
            (unsigned long long)dropped, feed->n, drop_per_mille);
    mt__model_destroy(&m);
}

static void free_feed(feed_t *f)
{
    mt__oomsnap_destroy(&f->o);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    mt__model_destroy(&f->m);
    free(f->ev);
    memset(f, 0, sizeof(*f));
}

static void one(const char *conf, size_t capacity, uint64_t seed)
{
    feed_t feed;
    run(conf, capacity, seed, &feed);
    replay_with_drops(&feed, seed ^ 0x5bd1e995, 5);
    replay_with_drops(&feed, seed ^ 0x1b873593, 60);
    free_feed(&feed);
}

/* The default (expandable segments, release_to_fit, one_pool, place_high) and the
 * reference's plain segments. */
static void test_default(void **state)
{
    (void)state;
    one(NULL, 1024 * MIB, 1);
    one("rules:reference", 1024 * MIB, 5);
}

/* Expandable segments with a range per pool, pages placed without place_high. */
static void test_expandable(void **state)
{
    (void)state;
    one("expandable_segments:True,one_pool:False,place_high_mb:0", 1024 * MIB, 2);
}

static void test_pressure_gc(void **state)
{
    (void)state;
    /* Too small a device: OOMs, release-and-retry, garbage collection. */
    one("rules:reference,garbage_collection_threshold:0.5,max_split_size_mb:24", 192 * MIB, 3);
    one("expandable_segments:True,garbage_collection_threshold:0.6", 160 * MIB, 4);
}

/* Repeated pairs, compared every 16 operations: the thread cache serves and records many
 * of them (a free into it, then the same block back), and the model, the follower and the
 * replays with drops hold as they do without it. */
static void test_cached_pairs(void **state)
{
    (void)state;
    compare_every = 16;
    pair_per_mille = 500;
    cached_pairs = cached_pops = 0;
    one(NULL, 1024 * MIB, 6);
    size_t frees = cached_pairs, pops = cached_pops;
    one("tcache:0", 1024 * MIB, 6);
    fprintf(stderr,
            "  pairs through the thread cache: %zu frees, %zu taken back (%zu, %zu with "
            "tcache:0)\n",
            frees, pops, cached_pairs - frees, cached_pops - pops);
    assert_true(pops > ops_per_run() / 40 && frees >= pops);
    assert_int_equal(cached_pairs, frees);
    assert_int_equal(cached_pops, pops);
    compare_every = 1;
    pair_per_mille = 0;
}

/* Two threads, each on its own stream, run pairs at once with recording on, into a sink
 * that takes batches in two steps (slots_t): the fast paths of both emit while the other's
 * and the global path's do. After each round (both
 * threads parked) the model equals the allocator, and its peak is never above the
 * allocator's (a fast free after a peak guard's flush makes the counters' peak a little
 * above the truth's). */
typedef struct two_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    pthread_barrier_t *bar;
    uint64_t seed;
    size_t rounds, frees_cached;
} two_t;

static void *two_thread(void *arg)
{
    two_t *t = arg;
    void *p[16] = {0};
    size_t sz[16] = {0};
    for (size_t r = 0; r < t->rounds; r++) {
        /* pairs of one size: the caches serve them, both threads handing batches over */
        size_t one = 4096 * (1 + t->seed % 16);
        for (int k = 0; k < 2000; k++) {
            void *q;
            if (mt_alloc_malloc(t->a, one, t->s, MT_TAG_ACTIVATIONS, &q) != 0)
                abort();
            size_t held = held_here(t->a);
            if (mt_alloc_free(t->a, q) != 0)
                abort();
            t->frees_cached += held_here(t->a) > held;
        }
        for (int k = 0; k < 400; k++) {
            unsigned i = (unsigned)(rng(&t->seed) % 16);
            if (p[i] == NULL) {
                if (sz[i] == 0 || rng(&t->seed) % 8 == 0) /* mostly the slot's size again */
                    sz[i] = 1 + rng(&t->seed) % (256 * KIB);
                if (mt_alloc_malloc(t->a, sz[i], t->s, MT_TAG_ACTIVATIONS, &p[i]) != 0)
                    abort();
                continue;
            }
            size_t held = held_here(t->a);
            if (mt_alloc_free(t->a, p[i]) != 0)
                abort();
            t->frees_cached += held_here(t->a) > held;
            p[i] = NULL;
            if (rng(&t->seed) % 4 != 0 && /* the pair */
                mt_alloc_malloc(t->a, sz[i], t->s, MT_TAG_ACTIVATIONS, &p[i]) != 0)
                abort();
        }
        pthread_barrier_wait(t->bar); /* round done */
        pthread_barrier_wait(t->bar); /* compared */
    }
    for (int i = 0; i < 16; i++)
        if (p[i] != NULL && mt_alloc_free(t->a, p[i]) != 0)
            abort();
    return NULL;
}

/* With batches, the caches' events reach the sink in compact form (write_batch), as they
 * reach the profiler's ring; without, as events (write). */
static void two_threads(bool batches)
{
    mt_backend_t *b = sim_backend(1024 * MIB);
    feed_t feed;
    feed_open(&feed, 60000);
    slots_t sl;
    slots_init(&sl, batches);
    sl.feed = &feed;
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = &sl.sink;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    pthread_barrier_t bar;
    assert_int_equal(pthread_barrier_init(&bar, NULL, 3), 0);
    two_t t[2];
    pthread_t th[2];
    size_t rounds = ops_per_run() / 200;
    for (int i = 0; i < 2; i++) {
        t[i] = (two_t){a, NULL, &bar, 77 + (uint64_t)i, rounds, 0};
        assert_int_equal(mt_stream_create(b, &t[i].s), 0);
        assert_int_equal(pthread_create(&th[i], NULL, two_thread, &t[i]), 0);
    }
    for (size_t r = 0; r < rounds; r++) {
        pthread_barrier_wait(&bar);
        mt_alloc_stats_t st0;
        assert_int_equal(mt_alloc_stats(a, &st0), 0); /* every cache's batch handed over */
        slots_drain(&sl);
        check_model(feed.m, "two threads");
        compare(a, feed.m, r);
        mt_model_figures_t f;
        assert_int_equal(mt__model_figures(feed.m, MT_MODEL_DEVICE, &f), 0);
        mt_alloc_stats_t st;
        assert_int_equal(mt_alloc_stats(a, &st), 0);
        assert_true(f.peak_allocated <= (uint64_t)st.allocated_bytes[MT_STAT_ALL].peak);
        pthread_barrier_wait(&bar);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    slots_drain(&sl);
    compare(a, feed.m, rounds);
    fprintf(stderr, "  two threads: %zu events, frees into the caches %zu + %zu\n", feed.n,
            t[0].frees_cached, t[1].frees_cached);
    assert_true(t[0].frees_cached > rounds && t[1].frees_cached > rounds);
    mt_alloc_destroy(&a);
    for (int i = 0; i < 2; i++)
        mt_stream_destroy(b, &t[i].s);
    pthread_barrier_destroy(&bar);
    mt_backend_destroy(&b);
    slots_drain(&sl);
    replay_with_drops(&feed, 11, 5);
    free_feed(&feed);
    free(sl.ev);
    free((void *)sl.filled);
}

/* ---- the same events with and without batches in compact form ---- */

static uint32_t every_third_stack(void *ud, uint64_t bytes, int pool, int mode)
{
    (void)bytes, (void)pool, (void)mode;
    slots_t *s = ud;
    return ++s->stacks % 3 == 0 ? s->stacks : 0;
}

/* One thread's operations (pairs the cache serves, frees into it, global allocations of
 * three sizes, stacks on a third of the allocations) into a slots sink; the events it
 * received, in order, into *out. mode 0: no thread caches (the global path builds every
 * event); 1: caches, the sink taking events; 2: caches, the sink taking compact batches. */
static size_t run_recorded(int mode, mt_event_rec_t **out)
{
    bool batches = mode == 2;
    mt_backend_t *b = sim_backend(1024 * MIB);
    slots_t sl;
    slots_init(&sl, batches);
    sl.sink.stack = every_third_stack;
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = &sl.sink;
    cfg.stacks = MT_STACKS_ALL;
    cfg.tcache = mode != 0;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    static const size_t sizes[] = {64 * KIB, 200 * KIB, 3 * MIB};
    void *p[16] = {0};
    size_t sz[16] = {0};
    uint64_t r = 12345;
    for (int i = 0; i < 20000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        unsigned k = (unsigned)(r >> 33) % 16, what = (unsigned)(r >> 40) % 4;
        if (p[k] != NULL && what == 1) {
            /* a tight loop of pairs: the cache's pops, each freed at once */
            for (int j = 0; j < 4; j++) {
                assert_int_equal(mt_alloc_free(a, p[k]), 0);
                assert_int_equal(mt_alloc_malloc(a, sz[k], NULL, 1, &p[k]), 0);
            }
        } else if (p[k] != NULL) {
            assert_int_equal(mt_alloc_free(a, p[k]), 0);
            p[k] = NULL;
            if (what != 0) /* its size again at once, with another tag: not the cache's */
                assert_int_equal(mt_alloc_malloc(a, sz[k], NULL, (int)what, &p[k]), 0);
        } else {
            sz[k] = sizes[what % 3] - (what == 3 ? 100 : 0);
            assert_int_equal(mt_alloc_malloc(a, sz[k], NULL, 1, &p[k]), 0);
        }
    }
    for (int k = 0; k < 16; k++)
        if (p[k] != NULL)
            assert_int_equal(mt_alloc_free(a, p[k]), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    size_t n = atomic_load(&sl.claimed);
    for (size_t i = 0; i < n; i++)
        assert_true(atomic_load(&sl.filled[i]));
    if (batches) /* the compact path was taken */
        fprintf(stderr,
                "  %zu events, %zu batches in compact form, %zu pop+free entries, %zu repeats\n", n,
                (size_t)sl.batches, (size_t)sl.folded, (size_t)sl.repeats);
    if (batches) /* and its loops' pairs were folded into repeats */
        assert_true(sl.batches > 50 && sl.folded > 1000 && sl.repeats > 1000);
    free((void *)sl.filled);
    *out = sl.ev;
    return n;
}

/* The index of addr among the addresses seen so far (runs map their blocks elsewhere). */
static size_t addr_index(uint64_t *seen, size_t *nseen, uint64_t addr)
{
    for (size_t i = 0; i < *nseen; i++)
        if (seen[i] == addr)
            return i;
    seen[*nseen] = addr;
    return (*nseen)++;
}

/* The program's events of a run (allocations, frees, stacks), without the segments' and
 * the reserved totals, whose timing the caches' deferred frees move. */
static size_t program_events(mt_event_rec_t *ev, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == MT_EV_ALLOC || ev[i].kind == MT_EV_FREE_REQUESTED ||
            ev[i].kind == MT_EV_FREE_COMPLETED || ev[i].kind == MT_EV_STACK_REF)
            ev[k++] = ev[i];
    return k;
}

/* Field for field (addresses by order of first appearance: runs map their blocks elsewhere). */
static void same_events(const mt_event_rec_t *x, size_t nx, const mt_event_rec_t *y, size_t ny,
                        const char *what)
{
    assert_int_equal(nx, ny);
    uint64_t *sx = calloc(nx, 8), *sy = calloc(ny, 8);
    assert_true(sx != NULL && sy != NULL);
    size_t kx = 0, ky = 0;
    for (size_t i = 0; i < nx; i++) {
        const mt_event_rec_t *e = &x[i], *f = &y[i];
        if (e->kind != f->kind || e->size != f->size || e->requested != f->requested ||
            e->allocated != f->allocated || e->stream != f->stream || e->pool != f->pool ||
            e->tag != f->tag || e->device != f->device ||
            addr_index(sx, &kx, e->addr) != addr_index(sy, &ky, f->addr))
            fail_msg("%s: event %zu of %zu differs: %s size %llu requested %llu allocated %llu "
                     "against %s size %llu requested %llu allocated %llu",
                     what, i, nx, mt_event_kind_name(e->kind), (unsigned long long)e->size,
                     (unsigned long long)e->requested, (unsigned long long)e->allocated,
                     mt_event_kind_name(f->kind), (unsigned long long)f->size,
                     (unsigned long long)f->requested, (unsigned long long)f->allocated);
    }
    free(sx);
    free(sy);
}

/* The caches' events, made from compact batches or not, are the ones the global path
 * builds for the same operations with the caches off. */
static void test_batches_same_events(void **state)
{
    (void)state;
    mt_event_rec_t *ref, *x, *y;
    size_t nref = run_recorded(0, &ref), nx = run_recorded(1, &x), ny = run_recorded(2, &y);
    nref = program_events(ref, nref);
    nx = program_events(x, nx);
    ny = program_events(y, ny);
    same_events(ref, nref, x, nx, "caches, events");
    same_events(ref, nref, y, ny, "caches, compact batches");
    free(ref);
    free(x);
    free(y);
}

static void test_two_threads(void **state)
{
    (void)state;
    two_threads(false);
}

static void test_two_threads_batches(void **state)
{
    (void)state;
    two_threads(true);
}

/* Pages unmapped from the middle of a run (the run splits), then mapped again by a request
 * that fits the gap (the runs join), then an OOM: the model and the recorder's follower
 * equal the allocator at each step, and so does the OOM pickle. */
static void test_middle_unmap(void **state)
{
    (void)state;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 256 * MIB;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    feed_t feed;
    feed_open(&feed, 0);
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default(); /* expandable segments */
    cfg.backend = b;
    cfg.sink = &feed.sink;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    void *x[6], *y;
    for (int i = 0; i < 6; i++)
        assert_int_equal(mt_alloc_malloc(a, 8 * MIB, NULL, MT_TAG_ACTIVATIONS, &x[i]), 0);
    compare(a, feed.m, 0);
    compare_recorder(a, &feed, false, "one run");
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(feed.m, MT_MODEL_DEVICE, &f), 0);
    uint64_t before = f.segments;
    assert_int_equal(mt_alloc_free(a, x[2]), 0);
    assert_int_equal(mt_alloc_free(a, x[3]), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(mt__model_figures(feed.m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.segments, before + 1); /* the middle pages went: two runs */
    check_model(feed.m, "split");
    compare(a, feed.m, 1);
    compare_recorder(a, &feed, false, "split");
    assert_int_equal(mt_alloc_malloc(a, (size_t)1 << 40, NULL, MT_TAG_WEIGHTS, &y), MT_ENOMEM);
    compare_recorder(a, &feed, true, "OOM after the split");
    assert_int_equal(mt_alloc_malloc(a, 16 * MIB, NULL, MT_TAG_WEIGHTS, &x[2]), 0);
    assert_int_equal(mt__model_figures(feed.m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.segments, before); /* the gap mapped again: one run */
    check_model(feed.m, "joined");
    compare(a, feed.m, 2);
    compare_recorder(a, &feed, false, "joined");
    assert_int_equal(mt_alloc_malloc(a, (size_t)1 << 40, NULL, MT_TAG_WEIGHTS, &y), MT_ENOMEM);
    compare_recorder(a, &feed, true, "OOM after the join");
    assert_int_equal(feed.compared, 2);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    free_feed(&feed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default),
        cmocka_unit_test(test_expandable),
        cmocka_unit_test(test_pressure_gc),
        cmocka_unit_test(test_middle_unmap),
        cmocka_unit_test(test_cached_pairs),
        cmocka_unit_test(test_two_threads),
        cmocka_unit_test(test_two_threads_batches),
        cmocka_unit_test(test_batches_same_events),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
