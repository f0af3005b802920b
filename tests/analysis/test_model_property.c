/* Property test: the event model against the allocator. Random workloads on the sim backend
 * (mixed sizes, three streams with record_stream, expandable segments on and off,
 * empty_cache, warm-up, reservations, OOMs, garbage collection); a sink feeds every event
 * to the model, and after every operation the model must equal the allocator's own stats
 * and snapshot exactly: allocated, reserved, per-tag bytes, blocks, segment map, free bytes
 * and largest free block. Then the recorded stream is replayed with random events dropped:
 * every figure must stay within bounds, and the model must mark as uncertain whatever it
 * cannot know. Seeded; MT_MODEL_PROPERTY_OPS sets the operations per run (default 4000). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/model.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "tests/common/test_main.h"

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
    if (mt_model_apply(f->m, &e) != 0)
        abort();
}

static void check_model(const mt_model_t *m, const char *when)
{
    char why[256] = "";
    if (mt_model_check(m, why, sizeof why) != 0)
        fail_msg("%s: mt_model_check: %s", when, why);
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
    assert_int_equal(mt_model_figures(m, MT_MODEL_DEVICE, &f), 0);
    if (f.allocated != (uint64_t)st->allocated_bytes[MT_STAT_ALL].current ||
        f.reserved != (uint64_t)st->reserved_bytes[MT_STAT_ALL].current)
        fail_msg("op %zu: model allocated/reserved %llu/%llu, allocator %lld/%lld", op,
                 (unsigned long long)f.allocated, (unsigned long long)f.reserved,
                 (long long)st->allocated_bytes[MT_STAT_ALL].current,
                 (long long)st->reserved_bytes[MT_STAT_ALL].current);
    assert_false(f.uncertain);
    for (int t = 0; t < MT_TAG_MAX; t++) {
        mt_model_tag_t tg;
        mt_model_tag(m, MT_MODEL_DEVICE, t, &tg);
        if (tg.bytes != (uint64_t)st->tag_allocated_bytes[t].current)
            fail_msg("op %zu: tag %d model %llu, allocator %lld", op, t,
                     (unsigned long long)tg.bytes, (long long)st->tag_allocated_bytes[t].current);
    }
    if (f.total_free != st->total_free || f.largest_free != st->largest_free_block)
        fail_msg("op %zu: free %llu largest %llu, allocator %llu largest %llu", op,
                 (unsigned long long)f.total_free, (unsigned long long)f.largest_free,
                 (unsigned long long)st->total_free, (unsigned long long)st->largest_free_block);
    assert_true(f.fragmentation == mt_model_fragmentation(st->largest_free_block, st->total_free));

    /* The segment map and its blocks. */
    mt_model_map_t map;
    assert_int_equal(mt_model_map(m, MT_MODEL_DEVICE, &map), 0);
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
    mt_model_map_free(&map);
    mt_alloc_snapshot_free(&snap);
}

/* ---- workloads ---- */

typedef struct live_s {
    void *p;
} live_t;

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

/* Runs nops random operations with the model compared after each; returns the events. */
static void run(const char *conf, size_t capacity, uint64_t seed, feed_t *feed)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = capacity;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    memset(feed, 0, sizeof(*feed));
    feed->sink.emit = feed_emit;
    feed->sink.ud = feed;
    assert_int_equal(mt_model_create(&feed->m, NULL), 0);
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
        if ((r < 540 && nlive < MAXLIVE) || nlive == 0) {
            int tag = rng(&seed) % 8 == 0 ? user_tag : (int)(rng(&seed) % MT_TAG_USER_FIRST);
            void *p = NULL;
            int rc = mt_alloc_malloc(a, random_size(&seed), streams[rng(&seed) % 3], tag, &p);
            if (rc == MT_ENOMEM)
                ooms++;
            else if (assert_int_equal(rc, 0), p)
                live[nlive++] = (live_t){p};
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
        char when[64];
        snprintf(when, sizeof when, "op %zu", op);
        check_model(feed->m, when);
        compare(a, feed->m, op);
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
        assert_true(ooms > 0);
}

/* ---- dropped events ---- */

/* Replays feed's events into a new model, dropping bursts of them at random, and checks
 * the bounds after every event it keeps. */
static void replay_with_drops(const feed_t *feed, uint64_t seed, unsigned drop_per_mille)
{
    mt_model_t *m = NULL;
    assert_int_equal(mt_model_create(&m, NULL), 0);
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
        assert_int_equal(mt_model_apply(m, ev), 0);
        last_kept = i + 1 == feed->n;
        if (i % 7 != 0 && !last_kept)
            continue; /* the walk below is the costly part */
        char when[64];
        snprintf(when, sizeof when, "replay event %zu", i);
        check_model(m, when);
        for (int cls = 0; cls < MT_MODEL_CLASSES; cls++) {
            mt_model_figures_t f;
            assert_int_equal(mt_model_figures(m, cls, &f), 0);
            assert_true(f.fragmentation >= 0.0 && f.fragmentation <= 1.0);
            assert_true(f.utilization >= 0.0 && f.utilization <= 1.0);
            assert_true(f.total_free <= f.reserved && f.largest_free <= f.total_free);
            assert_true(f.uncertain_bytes <= f.allocated && f.untracked_bytes <= f.allocated);
            uint64_t known = 0;
            for (int t = 0; t < MT_TAG_MAX; t++) {
                mt_model_tag_t tg;
                mt_model_tag(m, cls, t, &tg);
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
    assert_int_equal(mt_model_figures(m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.allocated, 0);
    assert_int_equal(f.uncertain_bytes, 0);
    for (int t = 0; t < MT_TAG_MAX; t++) {
        mt_model_tag_t tg;
        mt_model_tag(m, MT_MODEL_DEVICE, t, &tg);
        assert_int_equal(tg.bytes, 0);
        assert_int_equal(tg.uncertain_bytes, 0);
    }
    if (dropped > 0)
        assert_true(mt_model_lost(m) > 0 && uncertain_seen > 0);
    fprintf(stderr, "  dropped %llu of %zu events (%u per mille bursts): bounds held\n",
            (unsigned long long)dropped, feed->n, drop_per_mille);
    mt_model_destroy(&m);
}

static void free_feed(feed_t *f)
{
    mt_model_destroy(&f->m);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default),
        cmocka_unit_test(test_expandable),
        cmocka_unit_test(test_pressure_gc),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
