/* The event-replay model: totals, blocks, tags and gaps (see model.h, docs/analysis.md).
 *
 * Gaps. Events lost between two records (a seq jump, an MT_EV_GAP record) may have freed
 * any block known so far, or allocated blocks never seen. At a gap every known block
 * becomes uncertain: its bytes leave the tag's figure for its uncertain figure. Later
 * events settle it: a free of it proves it was live (certain again, now pending); an
 * allocation overlapping it, or a segment free or unmap around it, proves it gone; and
 * the carried allocated total bounds what can still be live, since
 *     allocated = known + (uncertain blocks still live) + (allocations never seen),
 * so an uncertain block larger than allocated - known is gone, and all of them are when
 * allocated = known (a cleanly exited process ends with no phantom bytes). */
#include "analysis/model_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "memtrace/common.h"
#include "util/addrmap.h"
#include "util/assert.h"
#include "util/grow.h"

mt_model_cfg_t mt__model_cfg_default(void)
{
    return (mt_model_cfg_t){.keep_iterations = false,
                            .temporary_window_us = MT_MODEL_TEMP_WINDOW_US};
}

int mt__model_create(mt_model_t **out, const mt_model_cfg_t *cfg)
{
    *out = NULL;
    mt_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return MT_ENOMEM;
    m->cfg = cfg ? *cfg : mt__model_cfg_default();
    if (m->cfg.temporary_window_us > MT_MODEL_TEMP_WINDOW_MAX)
        m->cfg.temporary_window_us = MT_MODEL_TEMP_WINDOW_MAX;
    for (int k = 0; k < MT_MODEL_CLASSES; k++)
        m->cls[k].tmp_window_us = m->cfg.temporary_window_us;
    *out = m;
    return 0;
}

void mt__model_destroy(mt_model_t **pm)
{
    if (!pm || !*pm)
        return;
    mt_model_t *m = *pm;
    for (int k = 0; k < MT_MODEL_CLASSES; k++) {
        free(m->cls[k].blocks);
        mt__amap_fini(&m->cls[k].at);
        mt__bt_fini(&m->cls[k].stale);
        mt__model_big_fini(&m->cls[k].big);
        mt__model_big_fini(&m->cls[k].seg_big);
        mt__segmap_fini(&m->cls[k].segs);
        mt__model_segs_free(&m->cls[k]);
        mt__model_free_destroy(&m->cls[k]);
        mt__model_temp_free_all(&m->cls[k]);
    }
    mt__model_iterations_free(m);
    mt__model_stacks_free(m);
    mt__model_outside_free(m);
    mt__model_devs_free(m);
    free(m->settings);
    free(m);
    *pm = NULL;
}

/* ---- ratios: the one definition ---- */

double mt__model_utilization(uint64_t allocated, uint64_t reserved)
{
    if (reserved == 0 || allocated >= reserved)
        return 1.0;
    return (double)allocated / (double)reserved;
}

double mt__model_fragmentation(uint64_t largest_free, uint64_t total_free)
{
    if (total_free == 0 || largest_free >= total_free)
        return 0.0;
    double f = 1.0 - (double)largest_free / (double)total_free;
    return f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
}

/* ---- block table ---- */

/* Block indices by address: util's table, which holds no key 0, and c->zero for it. */
static bool index_get(const mt__mclass_t *c, uint64_t addr, size_t *i)
{
    uint64_t v;
    if (addr == 0)
        return c->zero != 0 && (*i = c->zero - 1, true);
    return mt__amap_get(&c->at, addr, &v) == 0 && (*i = (size_t)v, true);
}

static int index_put(mt__mclass_t *c, uint64_t addr, size_t i)
{
    if (addr != 0)
        return mt__amap_put(&c->at, addr, i);
    c->zero = i + 1;
    return 0;
}

static void index_del(mt__mclass_t *c, uint64_t addr)
{
    if (addr != 0)
        (void)mt__amap_del(&c->at, addr);
    else
        c->zero = 0;
}

/* The live block at addr, or NULL. Borrowed until the next insert or delete. */
static mt__mblock_t *block_find(const mt__mclass_t *c, uint64_t addr)
{
    size_t i;
    return index_get(c, addr, &i) ? &c->blocks[i] : NULL;
}

/* A new zeroed entry for addr (none must exist), or NULL (no memory). */
static mt__mblock_t *block_insert(mt__mclass_t *c, uint64_t addr)
{
    if (c->live == c->cap) { /* the call only when it grows: this runs per alloc */
        mt__mblock_t *v = mt__grow(c->blocks, &c->cap, c->live + 1, sizeof *v, 8);
        if (!v)
            return NULL;
        c->blocks = v;
    }
    if (index_put(c, addr, c->live) != 0)
        return NULL;
    c->blocks[c->live] = (mt__mblock_t){.addr = addr};
    return &c->blocks[c->live++];
}

/* Takes b out of the figures it counts in (a block whose free was requested counts in
 * none). */
static void block_unaccount(mt__mclass_t *c, mt__mblock_t *b)
{
    if (b->pending)
        return;
    mt__model_stack_account(c, b, -1);
    if (b->uncertain) {
        mt_assert(c->unc_bytes[b->tag] >= b->size && c->unc_blocks[b->tag] > 0);
        c->unc_bytes[b->tag] -= b->size;
        c->unc_blocks[b->tag]--;
        c->unc -= b->size;
    } else {
        mt_assert(c->tag_bytes[b->tag] >= b->size && c->tag_blocks[b->tag] > 0);
        c->tag_bytes[b->tag] -= b->size;
        c->tag_blocks[b->tag]--;
        c->pool_bytes[b->pool & 3] -= b->size;
        c->known -= b->size;
    }
}

static void block_account(mt__mclass_t *c, mt__mblock_t *b)
{
    if (b->pending)
        return;
    mt__model_stack_account(c, b, 1);
    if (b->uncertain) {
        c->unc_bytes[b->tag] += b->size;
        c->unc_blocks[b->tag]++;
        c->unc += b->size;
        return;
    }
    c->tag_bytes[b->tag] += b->size;
    c->tag_blocks[b->tag]++;
    c->tags_held |= 1u << b->tag;
    c->pool_bytes[b->pool & 3] += b->size;
    c->known += b->size;
    uint64_t now = mt__model_sat(c->tag_bytes[b->tag]);
    if (now > c->tag_peak[b->tag])
        c->tag_peak[b->tag] = now;
}

/* Entry from moves into slot to (from's slot is then free to be written). */
static void block_move(mt__mclass_t *c, size_t from, size_t to)
{
    if (from == to)
        return;
    c->blocks[to] = c->blocks[from];
    (void)index_put(c, c->blocks[to].addr, to); /* replaces: no allocation */
}

/* Removes b. The uncertain blocks stay first: the last uncertain one fills an uncertain
 * b's slot, and the last block the slot freed. */
static void block_delete(mt__mclass_t *c, mt__mblock_t *b)
{
    size_t i = (size_t)(b - c->blocks);
    mt_assert(i < c->live);
    mt__model_free_note_block(c, b->addr, b->size, -1);
    block_unaccount(c, b);
    index_del(c, b->addr);
    if (b->uncertain) {
        mt__model_stale_del(c, b->addr);
        size_t u = --c->nuncertain;
        block_move(c, u, i);
        i = u;
    }
    block_move(c, --c->live, i);
}

/* The uncertain block is settled as live (a free of it was seen): certain again, moved to
 * the certain blocks' side. Returns its entry now. */
static mt__mblock_t *block_settle(mt__mclass_t *c, mt__mblock_t *b)
{
    if (!b->uncertain)
        return b;
    block_unaccount(c, b);
    mt__model_stale_del(c, b->addr);
    b->uncertain = 0;
    size_t i = (size_t)(b - c->blocks), u = --c->nuncertain;
    if (i != u) { /* b and the last uncertain block change places */
        mt__mblock_t t = c->blocks[u];
        block_move(c, i, u);
        c->blocks[i] = t;
        (void)index_put(c, t.addr, i); /* replaces: no allocation */
        b = &c->blocks[u];
    }
    block_account(c, b);
    return b;
}

mt__mblock_t *mt__model_block_find(const mt__mclass_t *c, uint64_t addr)
{
    return block_find(c, addr);
}

void mt__model_block_delete(mt__mclass_t *c, mt__mblock_t *b)
{
    block_delete(c, b);
}

/* ---- gaps ---- */

/* A gap: every known block and segment becomes uncertain. Only the blocks certain until now
 * (blocks[nuncertain, live)) join the stale index (model_stale.c), and only the segments
 * made certain since the last gap are walked (model_segs.c): a gap costs what changed since
 * the one before, and gaps in a row (a daemon that drops at each drain) stay linear however
 * many blocks and segments are live. MT_ENOMEM when the index cannot grow: no block is marked
 * then (the figures are no longer those the events determine: say so). */
static int mark_gap(mt__mclass_t *c)
{
    c->had_gap = true;
    mt__model_segs_mark_uncertain(c);
    size_t k = c->live - c->nuncertain; /* the certain blocks */
    if (k == 0)
        return 0;
    if (mt__model_stale_add(c, c->nuncertain, c->live) != 0)
        return MT_ENOMEM;
    for (size_t i = c->nuncertain; i < c->live; i++) {
        mt__mblock_t *b = &c->blocks[i];
        mt_assert(!b->uncertain);
        block_unaccount(c, b);
        b->uncertain = 1;
        block_account(c, b);
        if (!b->pending) {
            if (b->size > c->unc_max)
                c->unc_max = b->size;
            mt__model_stale_big_add(c, b->addr, b->size);
        }
    }
    c->nuncertain = c->live;
    mt_assert(c->stale.n == c->nuncertain);
    return 0;
}

/* mt__model_seg_touch, called only when there is an uncertain segment to settle (what it
 * does first): per block event, most often with none. */
static inline void touch_seg(mt__mclass_t *c, uint64_t addr)
{
    if (c->segs.unc != 0)
        mt__model_seg_touch(c, addr);
}

/* ---- what each kind does to a class (one entry per kind that changes blocks or segments;
 * kinds without one change only the totals, which every event carries) ---- */

static int on_alloc(mt__mclass_t *c, const mt_event_rec_t *ev)
{
    mt__mblock_t *b = block_find(c, ev->addr);
    if (b) /* its free was lost */
        block_delete(c, b);
    mt__model_drop_uncertain_in(c, ev->addr, ev->size);
    if ((b = block_insert(c, ev->addr)) == NULL) {
        c->had_gap = true; /* the block is missing: as good as a lost event */
        return MT_ENOMEM;
    }
    b->size = ev->size;
    mt__model_free_note_block(c, b->addr, b->size, 1);
    /* A request above the block's size is not one the allocator served: unknown. */
    b->requested = ev->requested <= ev->size ? ev->requested : 0;
    b->tag = ev->tag < MT_TAG_MAX ? ev->tag : MT_TAG_OTHER;
    b->pool = ev->pool & 3;
    b->sidx = c->next_sidx;
    b->t_alloc = ev->time_ns >= c->t_known ? ev->time_ns : 0; /* (0: unknown lifetime) */
    block_account(c, b);
    touch_seg(c, ev->addr);
    mt_assert(c->live <= c->cap && c->at.n + (c->zero != 0) == c->live);
    return 0;
}

static int on_free_requested(mt__mclass_t *c, const mt_event_rec_t *ev)
{
    mt__mblock_t *b = block_find(c, ev->addr);
    if (!b) {
        c->unmatched_frees++;
        return 0;
    }
    /* Only a block seen allocated and not hidden by a gap has a known lifetime. */
    int rc = 0;
    if (!b->uncertain && !b->pending && b->size == ev->size)
        rc = mt__model_temp_free(c, b, ev->time_ns);
    b = block_settle(c, b);
    block_unaccount(c, b);
    /* The free names the block as it is now (a gap may have hidden a reuse of the
     * address). */
    if (b->size != ev->size) {
        b->requested = 0; /* another block than the one allocated: its request is unknown */
        mt__model_free_note_block(c, b->addr, b->size, -1);
        mt__model_free_note_block(c, b->addr, ev->size, 1);
    }
    b->size = ev->size;
    b->tag = ev->tag < MT_TAG_MAX ? ev->tag : MT_TAG_OTHER;
    b->pool = ev->pool & 3;
    b->pending = 1;
    touch_seg(c, ev->addr);
    return rc; /* MT_ENOMEM: the temporary figures miss this free, the rest is applied */
}

static int on_free_completed(mt__mclass_t *c, const mt_event_rec_t *ev)
{
    mt__mblock_t *b = block_find(c, ev->addr);
    if (b) {
        block_delete(c, b);
        touch_seg(c, ev->addr);
    }
    return 0;
}

static int on_segment_alloc(mt__mclass_t *c, const mt_event_rec_t *ev)
{
    return mt__model_seg_add(c, ev, false);
}

static int on_segment_map(mt__mclass_t *c, const mt_event_rec_t *ev)
{
    return mt__model_seg_add(c, ev, true);
}

/* A segment free and an unmap both release [addr, addr + size), whatever maps it covers. */
static int on_segment_release(mt__mclass_t *c, const mt_event_rec_t *ev)
{
    return mt__model_seg_cut(c, ev->addr, ev->size);
}

typedef int (*apply_fn)(mt__mclass_t *c, const mt_event_rec_t *ev);

static const apply_fn apply_kind[MT_EV_KIND_COUNT] = {
    [MT_EV_ALLOC] = on_alloc,
    [MT_EV_FREE_REQUESTED] = on_free_requested,
    [MT_EV_FREE_COMPLETED] = on_free_completed,
    [MT_EV_SEGMENT_ALLOC] = on_segment_alloc,
    [MT_EV_SEGMENT_FREE] = on_segment_release,
    [MT_EV_SEGMENT_MAP] = on_segment_map,
    [MT_EV_SEGMENT_UNMAP] = on_segment_release,
};

/* ---- applying events ---- */

static int gap(mt_model_t *m)
{
    int rc = 0;
    for (int k = 0; k < MT_MODEL_CLASSES; k++) {
        int krc = mark_gap(&m->cls[k]);
        rc = rc ? rc : krc;
    }
    return rc;
}

/* Each allocator (source) reports its own running totals; a class's are their sum. v is
 * ev's device. */
static void totals(mt_model_t *m, mt__mclass_t *c, mt__mdevice_t *v, const mt_event_rec_t *ev)
{
    int h = ev->pool == MT_POOL_HOST; /* the source: mt_event_source */
    c->asum = c->asum - v->alloc[h] + ev->allocated;
    c->rsum = c->rsum - v->res[h] + ev->reserved;
    v->alloc[h] = ev->allocated;
    v->res[h] = ev->reserved;
    v->seen[h] = true;
    if (ev->allocated > v->peak_alloc[h])
        v->peak_alloc[h] = ev->allocated;
    if (ev->reserved > v->peak_res[h])
        v->peak_res[h] = ev->reserved;
    uint64_t a = mt__model_sat(c->asum), r = mt__model_sat(c->rsum);
    if (c == &m->cls[MT_MODEL_DEVICE]) {
        m->span_peak = a > m->span_peak ? a : m->span_peak;
        if (a > c->peak_alloc)
            m->peak_span = m->nit;
    }
    c->peak_alloc = a > c->peak_alloc ? a : c->peak_alloc;
    c->peak_res = r > c->peak_res ? r : c->peak_res;
    mt_assert(c->asum >= v->alloc[h] && c->rsum >= v->res[h]);
}

static bool setting(mt_model_t *m, const mt_event_rec_t *ev)
{
    if (m->nsettings == MT_MODEL_SETTINGS_MAX) {
        m->settings_dropped++;
        return true;
    }
    if (m->nsettings == m->capsettings) {
        size_t cap = m->capsettings ? m->capsettings * 2 : 16;
        mt_model_setting_t *v = realloc(m->settings, cap * sizeof *v);
        if (v == NULL)
            return false;
        m->settings = v;
        m->capsettings = cap;
    }
    m->settings[m->nsettings++] = (mt_model_setting_t){
        .time_ns = ev->time_ns,
        .device = ev->device,
        .id = ev->addr < MT_SETTING_END ? (int)ev->addr : 0,
        .value = ev->size,
        .before = ev->requested,
    };
    return true;
}

void mt__model_settings(const mt_model_t *m, const mt_model_setting_t **out, size_t *n,
                        uint64_t *dropped)
{
    *out = m->settings;
    *n = m->nsettings;
    if (dropped != NULL)
        *dropped = m->settings_dropped;
}

/* Managed figures: every event of a managed device (v, ev's) moves its reserved bytes; the
 * managed events bring the rest. */
static void managed(mt_model_t *m, mt__mdevice_t *v, const mt_event_rec_t *ev)
{
    mt_model_managed_t *g = &m->managed;
    if (ev->kind == MT_EV_MANAGED)
        v->managed = true;
    if (!v->managed || ev->pool == MT_POOL_HOST)
        return;
    m->mres_sum = m->mres_sum - v->mres + ev->reserved;
    v->mres = ev->reserved;
    if (m->mres_sum > g->managed_peak)
        g->managed_peak = m->mres_sum;
    if (ev->kind != MT_EV_MANAGED)
        return;
    g->events++;
    switch (ev->tag) {
    case MT_MANAGED_PREFETCH:
        g->prefetches++;
        g->prefetch_bytes = mt_model_sat_add(g->prefetch_bytes, ev->size);
        break;
    case MT_MANAGED_ADVISE:
        g->advises++;
        break;
    case MT_MANAGED_RESIDENCY:
        g->device_now = g->device_now - v->mdev + ev->size;
        g->faults = g->faults - v->mfaults + ev->addr;
        g->migrated = g->migrated - v->mmoved + ev->requested;
        v->mdev = ev->size;
        v->mfaults = ev->addr;
        v->mmoved = ev->requested;
        if (g->device_now > g->device_peak)
            g->device_peak = g->device_now;
        break;
    default:
        break;
    }
}

void mt__model_managed(const mt_model_t *m, mt_model_managed_t *out)
{
    *out = m->managed;
}

/* Whether ev moves its device's figures (totals, managed, outside), past the kinds that
 * carry none (mt__model_apply returns for them before). */
static bool names_device(const mt_event_rec_t *ev)
{
    return ev->kind != MT_EV_GAP && ev->kind != MT_EV_TAG_LABEL &&
           ev->kind != MT_EV_LIBRARY_LABEL && ev->kind != MT_EV_STACK_REF &&
           ev->kind != MT_EV_SETTING;
}

int mt__model_apply(mt_model_t *m, const mt_event_rec_t *ev)
{
    /* The device's figures first (made at its first event): without memory for them the
     * model is as it was. */
    mt__mdevice_t *v = NULL;
    if (names_device(ev) && (v = mt__model_dev_get(m, ev->device)) == NULL)
        return MT_ENOMEM;
    m->events++;
    if (ev->kind == MT_EV_GAP) { /* consumer side: carries no allocator figures */
        m->lost_rec = mt_model_sat_add(m->lost_rec, ev->size);
        return gap(m);
    }
    int grc = 0; /* the gap's, returned after the event is applied */
    if (m->seq_seen && ev->seq > m->next_seq) {
        m->lost_seq = mt_model_sat_add(m->lost_seq, ev->seq - m->next_seq);
        grc = gap(m);
    }
    if (!m->seq_seen || ev->seq >= m->next_seq)
        m->next_seq = ev->seq + 1;
    m->seq_seen = true;
    if (ev->kind == MT_EV_TAG_LABEL) /* a name, not an operation */
        return grc;
    if (ev->kind == MT_EV_LIBRARY_LABEL) {
        int orc = mt__model_outside_apply(m, ev);
        return orc ? orc : grc;
    }
    if (ev->kind == MT_EV_STACK_REF) { /* the stack of the alloc that follows */
        int src = mt__model_stack_ref(m, ev);
        m->ref_applied = true;
        return src ? src : grc;
    }
    if (ev->kind == MT_EV_SETTING) /* a change of the rules, no operation on memory */
        return setting(m, ev) ? grc : MT_ENOMEM;
    if (ev->kind == MT_EV_DEVICE || ev->kind == MT_EV_OUTSIDE_ALLOC ||
        ev->kind == MT_EV_OUTSIDE_FREE) {
        int orc = mt__model_outside_apply(m, ev);
        if (orc)
            grc = orc;
    }
    managed(m, v, ev);
    mt__mclass_t *c = &m->cls[ev->pool == MT_POOL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    uint64_t peak = c->peak_alloc;
    int src = 0; /* the stacks' MT_ENOMEM: the event is applied all the same */
    totals(m, c, v, ev);
    /* Only an alloc, or the event after a ref, has anything for the stacks to do (the
     * rest only say no stack); this runs twice per event in the daemon. */
    if (ev->kind == MT_EV_ALLOC || m->ref_applied) {
        src = mt__model_stack_before(m, c, ev);
        m->ref_applied = false;
    } else {
        c->next_sidx = MT__SIDX_NONE;
    }
    int rc = ev->kind < MT_EV_KIND_COUNT && apply_kind[ev->kind] ? apply_kind[ev->kind](c, ev) : 0;
    if (c->peak_alloc > peak)
        c->peak_ep++; /* every stack's bytes at the peak are now its bytes */
    mt__model_prune_by_totals(c);
    if (c->segs.unc != 0 || c->seg_unc_max != 0) /* what it does with none uncertain */
        mt__model_segs_prune(c);
    if (ev->kind == MT_EV_MARK && ev->addr == MT_MARK_ITERATION && m->cfg.keep_iterations) {
        int irc = mt__model_iteration(m, ev->size);
        mt__model_stacks_iteration(m);
        rc = rc ? rc : irc;
    }
#if MT_ASSERT_LEVEL >= 2
    /* The walk after every 64th event (the tests call the checker themselves where they
     * want every step), so that a run's cost stays linear in its events. */
    char why[160];
    if (m->events % 64 == 0)
        mt_assert_valid(mt__model_check(m, why, sizeof why) != 0 ? why : NULL);
#endif
    rc = rc ? rc : src;
    return rc ? rc : grc;
}

uint64_t mt__model_allocated_after(const mt_model_t *m, const mt_event_rec_t *ev)
{
    /* The kinds mt__model_apply returns for before totals() and the host class leave the
     * device's sum as it is. */
    const mt__mclass_t *c = &m->cls[MT_MODEL_DEVICE];
    if (ev->kind == MT_EV_GAP || ev->kind == MT_EV_TAG_LABEL || ev->kind == MT_EV_LIBRARY_LABEL ||
        ev->kind == MT_EV_STACK_REF || ev->kind == MT_EV_SETTING || ev->pool == MT_POOL_HOST)
        return mt__model_sat(c->asum);
    const mt__mdevice_t *v = mt__model_dev_find(m, ev->device);
    return mt__model_sat(c->asum - (v != NULL ? v->alloc[0] : 0) + ev->allocated);
}

/* ---- checker ---- */

static int class_check(const mt_model_t *m, int k, char *why, size_t whylen)
{
    const mt__mclass_t *c = &m->cls[k];
    MT__MCHECK(c->live <= c->cap, "class %d: %zu blocks in %zu entries", k, c->live, c->cap);
    MT__MCHECK(c->at.n + (c->zero != 0) == c->live,
               "class %d: %zu blocks, %zu in the address table", k, c->live,
               c->at.n + (c->zero != 0));
    char amap_why[128] = "";
    MT__MCHECK(mt__amap_check(&c->at, amap_why, sizeof amap_why) == 0, "class %d: %s", k, amap_why);
    mt__u128 tb[MT_TAG_MAX] = {0}, ub[MT_TAG_MAX] = {0}, pb[4] = {0}, known = 0, unc = 0;
    uint64_t tn[MT_TAG_MAX] = {0}, un[MT_TAG_MAX] = {0};
    size_t live = 0, nunc = 0;
    for (size_t i = 0; i < c->live; i++) {
        const mt__mblock_t *b = &c->blocks[i];
        live++;
        MT__MCHECK(b->tag < MT_TAG_MAX, "class %d: block %#llx tag %d", k,
                   (unsigned long long)b->addr, b->tag);
        MT__MCHECK(block_find(c, b->addr) == b, "class %d: block %#llx not found by address", k,
                   (unsigned long long)b->addr);
        MT__MCHECK(!b->uncertain == (i >= c->nuncertain),
                   "class %d: block %zu %scertain, uncertain ones are [0, %zu)", k, i,
                   b->uncertain ? "un" : "", c->nuncertain);
        if (b->uncertain) { /* (in the stale index: mt__model_stale_check) */
            nunc++;
            MT__MCHECK(b->pending || b->size <= c->unc_max, "class %d: unc_max %llu < %llu", k,
                       (unsigned long long)c->unc_max, (unsigned long long)b->size);
        }
        if (b->pending)
            continue;
        if (b->uncertain) {
            ub[b->tag] += b->size;
            un[b->tag]++;
            unc += b->size;
        } else {
            tb[b->tag] += b->size;
            tn[b->tag]++;
            pb[b->pool & 3] += b->size;
            known += b->size;
        }
    }
    MT__MCHECK(live == c->live, "class %d: live %zu/%zu", k, live, c->live);
    MT__MCHECK(nunc == c->nuncertain, "class %d: uncertain blocks %zu, counted %zu", k, nunc,
               c->nuncertain);
    MT__MCHECK(known == c->known && unc == c->unc, "class %d: known/uncertain sums differ", k);
    for (int t = 0; t < MT_TAG_MAX; t++) {
        MT__MCHECK(tb[t] == c->tag_bytes[t] && tn[t] == c->tag_blocks[t],
                   "class %d: tag %d bytes %llu, blocks say %llu", k, t,
                   (unsigned long long)mt__model_sat(c->tag_bytes[t]),
                   (unsigned long long)mt__model_sat(tb[t]));
        MT__MCHECK(ub[t] == c->unc_bytes[t] && un[t] == c->unc_blocks[t],
                   "class %d: tag %d uncertain bytes differ", k, t);
        MT__MCHECK(c->tag_peak[t] >= mt__model_sat(c->tag_bytes[t]), "class %d: tag %d peak", k, t);
        MT__MCHECK(c->tag_bytes[t] == 0 || (c->tags_held >> t & 1), "class %d: tag %d not held", k,
                   t);
    }
    for (int p = 0; p < 4; p++)
        MT__MCHECK(pb[p] == c->pool_bytes[p], "class %d: pool %d bytes differ", k, p);
    mt__u128 a = 0, r = 0;
    for (size_t i = 0; i < m->ndev; i++) {
        a += m->dev[i].alloc[k == MT_MODEL_HOST];
        r += m->dev[i].res[k == MT_MODEL_HOST];
    }
    MT__MCHECK(a == c->asum && r == c->rsum, "class %d: totals differ from the sources' sum", k);
    MT__MCHECK(c->peak_alloc >= mt__model_sat(a) && c->peak_res >= mt__model_sat(r),
               "class %d: peaks", k);
    MT__MCHECK(
        k != MT_MODEL_DEVICE || (m->span_peak >= mt__model_sat(a) && m->peak_span <= m->nit),
        "the open span's peak is below the allocated bytes, or the peak's span is past the last");
    int rc = mt__model_temp_check(c, why, whylen);
    rc = rc ? rc : mt__model_stale_check(c, why, whylen);
    rc = rc ? rc : mt__model_segs_check(c, why, whylen);
    return rc ? rc : mt__model_free_check(c, why, whylen);
}

int mt__model_check(const mt_model_t *m, char *why, size_t whylen)
{
    for (int k = 0; k < MT_MODEL_CLASSES; k++) {
        int rc = class_check(m, k, why, whylen);
        if (rc)
            return rc;
    }
    int orc = mt__model_outside_check(m, why, whylen);
    if (orc)
        return orc;
    MT__MCHECK(m->nit <= m->capit, "iterations %zu > capacity %zu", m->nit, m->capit);
    int drc = mt__model_devs_check(m, why, whylen);
    return drc ? drc : mt__model_stacks_check(m, why, whylen);
}
