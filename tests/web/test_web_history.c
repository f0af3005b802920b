/* The web page's per-process tracker (daemon/web.h), fed records directly: the allocator
 * state rebuilt at an event of the window equals the model fed the same prefix; history
 * buckets keep min <= last <= max and stay bounded over hours; the window stays bounded. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "analysis/model.h"
#include "analysis/model_gen.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "tests/common/test_main.h"

#define MIB (1ull << 20)
#define SEG 0x100000000ull

typedef struct stream_s {
    mt_event_rec_t *ev;
    size_t n, cap;
} stream_t;

static void push(stream_t *s, mt_event_rec_t ev)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->ev = realloc(s->ev, s->cap * sizeof *s->ev);
        assert_non_null(s->ev);
    }
    s->ev[s->n++] = ev;
}

/* A stream with segments, tagged blocks that live a while, frees requested before they
 * complete, and a second segment mapped and unmapped. */
static void make_stream(stream_t *s, unsigned nops)
{
    mgen_t g = {0};
    struct {
        uint64_t addr, size;
        int state; /* 0 free slot, 1 live, 2 free requested */
    } slot[64] = {{0}};
    push(s, mgen_rec(&g, MT_EV_SEGMENT_ALLOC, SEG, 64 * MIB, 0));
    unsigned rnd = 12345;
    for (unsigned i = 0; i < nops; i++) {
        rnd = rnd * 1103515245u + 12345u;
        unsigned k = (rnd >> 8) % 64;
        if (i % 500 == 250)
            push(s, mgen_rec(&g, MT_EV_SEGMENT_ALLOC, SEG + 128 * MIB + (i / 500) * 4 * MIB,
                             2 * MIB, 0));
        if (slot[k].state == 0) {
            slot[k].addr = SEG + (uint64_t)k * MIB;
            slot[k].size = (1 + (rnd >> 16) % 16) * 64 * 1024;
            slot[k].state = 1;
            push(s, mgen_rec(&g, MT_EV_ALLOC, slot[k].addr, slot[k].size, 1 + (int)(k % 7)));
        } else if (slot[k].state == 1) {
            slot[k].state = 2;
            push(s, mgen_rec(&g, MT_EV_FREE_REQUESTED, slot[k].addr, slot[k].size, 0));
        } else {
            slot[k].state = 0;
            push(s, mgen_rec(&g, MT_EV_FREE_COMPLETED, slot[k].addr, slot[k].size, 0));
        }
    }
}

static void same_state(const mt_model_t *a, const mt_model_t *b)
{
    mt_model_figures_t fa, fb;
    assert_int_equal(mt__model_figures(a, MT_MODEL_DEVICE, &fa), 0);
    assert_int_equal(mt__model_figures(b, MT_MODEL_DEVICE, &fb), 0);
    assert_int_equal(fa.allocated, fb.allocated);
    assert_int_equal(fa.reserved, fb.reserved);
    assert_int_equal(fa.blocks, fb.blocks);
    assert_int_equal(fa.total_free, fb.total_free);
    assert_int_equal(fa.largest_free, fb.largest_free);
    assert_false(fa.uncertain);
    mt_model_map_t ma, mb;
    assert_int_equal(mt__model_map(a, MT_MODEL_DEVICE, &ma), 0);
    assert_int_equal(mt__model_map(b, MT_MODEL_DEVICE, &mb), 0);
    assert_int_equal(ma.nblocks, mb.nblocks);
    assert_int_equal(ma.nsegs, mb.nsegs);
    for (size_t i = 0; i < ma.nblocks; i++) {
        assert_int_equal(ma.blocks[i].addr, mb.blocks[i].addr);
        assert_int_equal(ma.blocks[i].size, mb.blocks[i].size);
        assert_int_equal(ma.blocks[i].tag, mb.blocks[i].tag);
        assert_int_equal(ma.blocks[i].pending, mb.blocks[i].pending);
    }
    for (size_t i = 0; i < ma.nsegs; i++) {
        assert_int_equal(ma.segs[i].addr, mb.segs[i].addr);
        assert_int_equal(ma.segs[i].used, mb.segs[i].used);
    }
    mt__model_map_free(&ma);
    mt__model_map_free(&mb);
}

/* Feeds s through a tracker of the given window; at several points of the window, the
 * rebuilt state is the model of that prefix, and at its end the live state. Returns the
 * tracker's checkpoints at the end (0: the base model instead). */
static size_t check_prefixes(const stream_t *s, size_t window)
{
    mt_d_t *d = calloc(1, sizeof *d);
    assert_non_null(d);
    mt__d_web_set_window(d, window);
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 7, "unit"), 0);
    for (size_t i = 0; i < s->n; i++) {
        assert_int_equal(mt__d_proc_apply(p, &s->ev[i]), 0);
        mt__d_web_record(d, p, &s->ev[i]);
    }
    mt_d_web_proc_t *t = mt__d_web_find(d, p);
    assert_non_null(t);
    assert_int_equal(t->wcount, window); /* the window is bounded */
    size_t evicted = s->n - t->wcount;
    for (size_t upto = 0; upto <= t->wcount; upto += 341) {
        mt_model_t *ref = NULL, *at = NULL;
        assert_int_equal(mt__model_create(&ref, NULL), 0);
        for (size_t i = 0; i < evicted + upto; i++)
            mt__model_apply(ref, &s->ev[i]);
        assert_int_equal(mt__d_web_state_at(t, upto, &at), 0);
        same_state(at, ref);
        mt__model_destroy(&at);
        mt__model_destroy(&ref);
    }
    mt_model_t *at = NULL;
    assert_int_equal(mt__d_web_state_at(t, t->wcount, &at), 0);
    same_state(at, p->model);
    mt__model_destroy(&at);
    size_t nck = t->nck;
    mt__d_web_forget(d, p);
    assert_null(mt__d_web_find(d, p));
    mt__d_web_free(d);
    mt__d_proc_destroy(&p);
    free(d);
    return nck;
}

static void test_state_at_equals_prefix(void **state)
{
    (void)state;
    stream_t s = {0};
    make_stream(&s, 6000);
    /* the window's state from a checkpoint of the live model and the events since */
    assert_true(check_prefixes(&s, 1024) > 0);
    free(s.ev);
}

/* A map larger than a checkpoint may copy: the tracker goes over to a base model, which
 * starts as the state before the window (rebuilt from the last checkpoint), and the past
 * states stay exact. */
static void test_state_at_large_map(void **state)
{
    (void)state;
    stream_t s = {0};
    mgen_t g = {0};
    push(&s, mgen_rec(&g, MT_EV_SEGMENT_ALLOC, SEG, 1024 * MIB, 0));
    for (unsigned i = 0; i < 3000; i++) /* churn, under the checkpoints' limit */
        push(&s, mgen_rec(&g, i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC,
                          SEG + 512 * MIB + (i / 2 % 8) * 4096, 4096, 1));
    for (unsigned i = 0; i < MT_D_WEB_CK_MAX + 200; i++) /* blocks that stay */
        push(&s, mgen_rec(&g, MT_EV_ALLOC, SEG + (uint64_t)i * 4096, 4096, 2));
    for (unsigned i = 0; i < 3000; i++)
        push(&s, mgen_rec(&g, i % 3 == 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC,
                          SEG + 512 * MIB + (i / 3 % 8) * 4096 * 2 + (i % 3 == 1) * 4096, 4096, 3));
    assert_int_equal(check_prefixes(&s, 1024), 0);
    free(s.ev);
}

/* Three hours of events, one every 2 s: the coarse history halves its resolution instead
 * of growing, buckets stay ordered and each keeps min <= last <= max; the last fine
 * bucket holds the figures now. */
static void test_history_bounded(void **state)
{
    (void)state;
    stream_t s = {0};
    make_stream(&s, 5400);
    mt_d_t *d = calloc(1, sizeof *d);
    assert_non_null(d);
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 8, "hours"), 0);
    for (size_t i = 0; i < s.n; i++) {
        s.ev[i].time_ns = 1000000000ull + (uint64_t)i * 2000000000ull;
        assert_int_equal(mt__d_proc_apply(p, &s.ev[i]), 0);
        mt__d_web_record(d, p, &s.ev[i]);
    }
    mt_d_web_proc_t *t = mt__d_web_find(d, p);
    assert_non_null(t);
    mt__d_web_history_flush(t);
    assert_true(t->ncoarse <= MT_D_WEB_COARSE);
    assert_true(t->coarse_ns >= 8 * MT_D_WEB_COARSE0_NS); /* 3 h in <= 1024 buckets */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < t->ncoarse; i++) {
        const mt_d_web_bkt_t *b = &t->coarse[i];
        if (i)
            assert_true(b->t0 > t->coarse[i - 1].t0);
        assert_true(b->amin <= b->alast && b->alast <= b->amax);
        assert_int_equal(b->t0 % t->coarse_ns, 0);
        lo = b->amin < lo ? b->amin : lo;
        hi = b->amax > hi ? b->amax : hi;
    }
    mt_model_figures_t f;
    mt__model_figures_totals(p->model, MT_MODEL_DEVICE, &f);
    assert_int_equal(t->coarse[t->ncoarse - 1].alast, f.allocated);
    assert_int_equal(hi, f.peak_allocated);
    const mt_d_web_bkt_t *fine = &t->fine[(t->last_ns / MT_D_WEB_FINE_NS) % MT_D_WEB_FINE];
    assert_int_equal(fine->alast, f.allocated);
    assert_int_equal(fine->rlast, f.reserved);
    mt__d_web_free(d);
    mt__d_proc_destroy(&p);
    free(d);
    free(s.ev);
}

/* ---- the history against a reference: the figures read in full and every bucket
 * copied whole, per event (what the tracker did before it copied only what changed) ---- */

typedef struct ref_hist_s {
    mt_d_web_bkt_t fine[MT_D_WEB_FINE], coarse[MT_D_WEB_COARSE], cur;
    size_t ncoarse;
    uint64_t coarse_ns, last_ns;
} ref_hist_t;

static void ref_fold(mt_d_web_bkt_t *b, uint64_t t0, const mt_d_web_bkt_t *cur, bool oom)
{
    if (b->t0 != t0) {
        *b = *cur;
        b->t0 = t0;
        b->amin = b->amax = cur->alast;
        b->rmax = cur->rlast;
        b->ooms = 0;
        b->events = 0;
    } else {
        b->amin = cur->alast < b->amin ? cur->alast : b->amin;
        b->amax = cur->alast > b->amax ? cur->alast : b->amax;
        b->rmax = cur->rlast > b->rmax ? cur->rlast : b->rmax;
        b->hmax = cur->hmax > b->hmax ? cur->hmax : b->hmax;
        b->alast = cur->alast;
        b->rlast = cur->rlast;
        b->peak = cur->peak;
        b->hres = cur->hres;
        memcpy(b->tag, cur->tag, sizeof b->tag);
    }
    b->ooms += oom;
    b->events++;
}

static void ref_halve(ref_hist_t *h)
{
    uint64_t w2 = h->coarse_ns * 2;
    size_t n = 0;
    for (size_t i = 0; i < h->ncoarse; i++) {
        uint64_t t0 = h->coarse[i].t0 / w2 * w2;
        if (n > 0 && h->coarse[n - 1].t0 == t0) {
            mt_d_web_bkt_t *a = &h->coarse[n - 1];
            const mt_d_web_bkt_t *b = &h->coarse[i];
            a->amin = b->amin < a->amin ? b->amin : a->amin;
            a->amax = b->amax > a->amax ? b->amax : a->amax;
            a->rmax = b->rmax > a->rmax ? b->rmax : a->rmax;
            a->hmax = b->hmax > a->hmax ? b->hmax : a->hmax;
            a->alast = b->alast;
            a->rlast = b->rlast;
            a->peak = b->peak;
            a->hres = b->hres;
            memcpy(a->tag, b->tag, sizeof a->tag);
            a->ooms += b->ooms;
            a->events += b->events;
        } else {
            h->coarse[n] = h->coarse[i];
            h->coarse[n++].t0 = t0;
        }
    }
    h->ncoarse = n;
    h->coarse_ns = w2;
}

static void ref_record(ref_hist_t *h, const mt_model_t *m, const mt_event_rec_t *ev)
{
    if (ev->kind == MT_EV_GAP || ev->kind == MT_EV_TAG_LABEL || ev->kind == MT_EV_LIBRARY_LABEL)
        return;
    mt_model_figures_t dev, host;
    mt__model_figures_totals(m, MT_MODEL_DEVICE, &dev);
    mt__model_figures_totals(m, MT_MODEL_HOST, &host);
    h->cur.alast = dev.allocated;
    h->cur.rlast = dev.reserved;
    h->cur.peak = dev.peak_allocated;
    h->cur.hmax = host.allocated;
    h->cur.hres = host.reserved;
    if (ev->tag < MT_TAG_MAX && ev->pool != MT_POOL_HOST) {
        mt_model_tag_t tg;
        mt__model_tag(m, MT_MODEL_DEVICE, ev->tag, &tg);
        h->cur.tag[ev->tag] = tg.bytes;
    }
    uint64_t now = ev->time_ns ? ev->time_ns : 1;
    h->last_ns = now;
    bool oom = ev->kind == MT_EV_OOM;
    ref_fold(&h->fine[now / MT_D_WEB_FINE_NS % MT_D_WEB_FINE],
             now / MT_D_WEB_FINE_NS * MT_D_WEB_FINE_NS, &h->cur, oom);
    uint64_t c0 = now / h->coarse_ns * h->coarse_ns;
    if (h->ncoarse > 0 && c0 < h->coarse[h->ncoarse - 1].t0)
        c0 = h->coarse[h->ncoarse - 1].t0;
    if (h->ncoarse == 0 || h->coarse[h->ncoarse - 1].t0 != c0) {
        while (h->ncoarse == MT_D_WEB_COARSE)
            ref_halve(h);
        c0 = now / h->coarse_ns * h->coarse_ns;
        if (h->ncoarse > 0 && c0 < h->coarse[h->ncoarse - 1].t0)
            c0 = h->coarse[h->ncoarse - 1].t0;
        if (h->ncoarse == 0 || h->coarse[h->ncoarse - 1].t0 != c0)
            h->coarse[h->ncoarse++].t0 = 0;
    }
    ref_fold(&h->coarse[h->ncoarse - 1], c0, &h->cur, oom);
}

static void same_bucket(const mt_d_web_bkt_t *a, const mt_d_web_bkt_t *b)
{
    assert_int_equal(a->t0, b->t0);
    assert_int_equal(a->amin, b->amin);
    assert_int_equal(a->amax, b->amax);
    assert_int_equal(a->alast, b->alast);
    assert_int_equal(a->rmax, b->rmax);
    assert_int_equal(a->rlast, b->rlast);
    assert_int_equal(a->peak, b->peak);
    assert_int_equal(a->hmax, b->hmax);
    assert_int_equal(a->hres, b->hres);
    assert_int_equal(a->ooms, b->ooms);
    assert_int_equal(a->events, b->events);
    for (int k = 0; k < MT_TAG_MAX; k++)
        assert_int_equal(a->tag[k], b->tag[k]);
}

static void same_history(const mt_d_web_proc_t *t, const ref_hist_t *h, bool all)
{
    assert_int_equal(t->last_ns, h->last_ns);
    assert_int_equal(t->ncoarse, h->ncoarse);
    assert_int_equal(t->coarse_ns, h->coarse_ns);
    same_bucket(&t->cur, &h->cur);
    size_t fi = h->last_ns / MT_D_WEB_FINE_NS % MT_D_WEB_FINE;
    same_bucket(&t->fine[fi], &h->fine[fi]);
    same_bucket(&t->coarse[t->ncoarse - 1], &h->coarse[h->ncoarse - 1]);
    for (size_t i = 0; all && i < MT_D_WEB_FINE; i++)
        same_bucket(&t->fine[i], &h->fine[i]);
    for (size_t i = 0; all && i < h->ncoarse; i++)
        same_bucket(&t->coarse[i], &h->coarse[i]);
}

/* Tags of blocks freed under tag 0, host (pinned) events between device ones, times that go
 * back (within the fine ring and past it), stand still, are 0, jump by exactly the fine
 * ring's span (same fine bucket, new start) and by hours (the coarse history halves): the
 * tracker's buckets, its pending events folded, equal the reference's, which folds every
 * event at once. */
static void test_history_equals_reference(void **state)
{
    (void)state;
    stream_t s = {0};
    make_stream(&s, 20000);
    mt_d_t *d = calloc(1, sizeof *d);
    ref_hist_t *h = calloc(1, sizeof *h);
    assert_non_null(d);
    assert_non_null(h);
    h->coarse_ns = MT_D_WEB_COARSE0_NS;
    mt__d_web_set_window(d, 1024);
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 9, "reference"), 0);
    uint64_t t = 100000000ull; /* 0.1 s: the first buckets start at 0 */
    uint64_t rnd = 777;
    for (size_t i = 0; i < s.n; i++) {
        rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
        unsigned r = (unsigned)(rnd >> 33) % 100;
        uint64_t v = rnd >> 20; /* 44 random bits */
        if (r < 70)
            t += v % 50000000ull; /* < 50 ms on */
        else if (r < 80)
            t -= v % 3000000000ull < t - 1 ? v % 3000000000ull : 0; /* < 3 s back */
        else if (r < 88)
            t += v % 400000000000ull; /* < 400 s on */
        else if (r < 91)
            t += MT_D_WEB_FINE_NS * MT_D_WEB_FINE; /* the fine ring's span */
        else if (r < 93)
            t -= t > 200000000000ull ? 200000000000ull : 0; /* back past the fine ring */
        s.ev[i].time_ns = r == 99 ? 0 : t;
        if (r >= 95 && r < 98)
            s.ev[i].pool = MT_POOL_HOST;
        if (r == 94)
            s.ev[i].kind = MT_EV_OOM;
        assert_int_equal(mt__d_proc_apply(p, &s.ev[i]) == MT_ENOMEM, 0);
        mt__d_web_record(d, p, &s.ev[i]);
        ref_record(h, p->model, &s.ev[i]);
        mt_d_web_proc_t *tr = mt__d_web_find(d, p);
        assert_non_null(tr);
        /* compared (its pending events folded) after about one event in four, so that
         * folds of several events at once are compared too */
        bool all = i % 997 == 0 || i + 1 == s.n;
        if (all || (rnd >> 8) % 4 == 0) {
            mt__d_web_history_flush(tr);
            same_history(tr, h, all);
        }
    }
    const mt_d_web_proc_t *tr = mt__d_web_find(d, p);
    assert_true(tr->coarse_ns > MT_D_WEB_COARSE0_NS); /* the coarse history did halve */
    mt__d_web_free(d);
    mt__d_proc_destroy(&p);
    free(h);
    free(d);
    free(s.ev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_at_equals_prefix),
        cmocka_unit_test(test_state_at_large_map),
        cmocka_unit_test(test_history_bounded),
        cmocka_unit_test(test_history_equals_reference),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
