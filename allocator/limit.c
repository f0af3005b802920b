/* The memory limit changed at run time (torch.cuda.set_per_process_memory_fraction through
 * the pluggable allocator's memory-fraction entry point). */
#include <stdio.h>
#include <string.h>

#include "allocator/tcache.h"

int mt_alloc_set_memory_fraction(mt_alloc_t *a, double fraction)
{
    /* Written so that NaN fails too. */
    if (a == NULL || !(fraction > 0.0 && fraction <= 1.0))
        return MT_EINVAL;
    mt__alloc_lock(a);
    a->cfg.memory_fraction = fraction;
    a->limit = fraction >= 1.0 ? a->capacity : (size_t)((double)a->capacity * fraction);
    a->gc_limit = a->cfg.garbage_collection_threshold > 0.0
                      ? (size_t)((double)a->limit * a->cfg.garbage_collection_threshold)
                      : 0;
    a->st.limit = a->limit;
    mt__alloc_unlock(a);
    return 0;
}

/* ---- settings changed at run time ----
 * PyTorch's _set_allocator_settings: the keys whose change needs no new segment layout.
 * expandable_segments, one_pool, tcache, stacks and the segment-size policies shape the
 * ranges and caches that exist, and lock_bias the lock every thread takes, so a change to
 * them is refused. */

static const char *fixed_key(const mt_alloc_cfg_t *o, const mt_alloc_cfg_t *n)
{
    /* PyTorch refuses it too: the backend parsed at run time must be the one at load time. */
    if (o->alloc_backend != n->alloc_backend)
        return "backend";
    if (o->managed_memory != n->managed_memory)
        return "managed_memory";
    if (o->expandable_segments != n->expandable_segments)
        return "expandable_segments";
    if (o->one_pool != n->one_pool)
        return "one_pool";
    if (o->tcache != n->tcache)
        return "tcache";
    if (o->lock_bias != n->lock_bias)
        return "lock_bias";
    if (o->stacks != n->stacks)
        return "stacks";
    if (o->fit_large_segments != n->fit_large_segments)
        return "fit_large_segments";
    if (o->split_large_tails != n->split_large_tails)
        return "split_large_tails";
    if (o->stats_period_ms != n->stats_period_ms)
        return "stats_period_ms";
    return NULL;
}

static uint64_t ppm(double f)
{
    return (uint64_t)(f * 1e6 + 0.5);
}

static uint64_t bytes(size_t v)
{
    return v == SIZE_MAX ? UINT64_MAX : (uint64_t)v;
}

static void note(mt_alloc_t *a, int id, uint64_t now, uint64_t before)
{
    if (now != before)
        mt__alloc_emit(a, MT_EV_SETTING, (uint64_t)id, now, before, 0, MT_POOL_NONE, 0);
}

/* Live blocks the thread caches own were handed out under the old rounding and oversize
 * rule: they leave the caches, and the oversize counters are taken again from the blocks. */
static void rebase_blocks(mt_alloc_t *a)
{
    mt__tc_quiesce(a);
    int64_t n = 0;
    for (size_t i = 0; i < a->map.cap; i++) {
        mt_block_t *b = mt__addrmap_at(&a->map, i);
        if (b == NULL)
            continue;
        if (b->tce != NULL)
            (void)mt__tc_disown(a, b);
        n += b->state == MT_BLOCK_ACTIVE_ALLOCATED && b->size >= a->cfg.max_split_size;
    }
    mt_stat_t *s = &a->st.oversize_allocations;
    if (n > s->current)
        s->allocated += (uint64_t)(n - s->current);
    s->current = n;
    s->peak = n > s->peak ? n : s->peak;
    int64_t m = 0;
    for (const mt_segment_t *g = a->segs; g != NULL; g = g->next)
        m += !g->expandable && g->size >= a->cfg.max_split_size;
    s = &a->st.oversize_segments;
    if (m > s->current)
        s->allocated += (uint64_t)(m - s->current);
    s->current = m;
    s->peak = m > s->peak ? m : s->peak;
}

int mt_alloc_set_settings(mt_alloc_t *a, const char *conf, char *err, size_t errlen)
{
    if (a == NULL || conf == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    mt_alloc_cfg_t o = a->cfg, n = a->cfg;
    int rc = mt_alloc_cfg_parse(&n, conf, err, errlen);
    if (rc == 0)
        rc = mt__alloc_cfg_validate(&n, err, errlen);
    const char *k = rc == 0 ? fixed_key(&o, &n) : NULL;
    if (k != NULL) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "allocator setting '%s' cannot change at run time", k);
        rc = MT_ENOTSUP;
    }
    if (rc != 0)
        goto out;
    bool rules = o.max_split_size != n.max_split_size ||
                 memcmp(o.roundup_power2_divisions, n.roundup_power2_divisions,
                        sizeof o.roundup_power2_divisions) != 0;
    if (rules) {
        mt__tc_quiesce(a);
        a->cfg.max_split_size = n.max_split_size;
        bool any = false;
        for (size_t i = 0; i < MT_ALLOC_ROUNDUP_INTERVALS; i++) {
            /* read by the thread caches' fast path without the lock */
            __atomic_store_n(&a->cfg.roundup_power2_divisions[i], n.roundup_power2_divisions[i],
                             __ATOMIC_RELAXED);
            any |= n.roundup_power2_divisions[i] > 1;
        }
        __atomic_store_n(&a->round_pow2, any, __ATOMIC_RELAXED);
        rebase_blocks(a);
    }
    a->cfg.max_non_split_rounding = n.max_non_split_rounding;
    a->cfg.release_on_oom = n.release_on_oom;
    a->cfg.release_smaller_segments = n.release_smaller_segments;
    a->cfg.release_to_fit = n.release_to_fit;
    a->cfg.place_high = n.place_high;
    a->cfg.garbage_collection_threshold = n.garbage_collection_threshold;
    a->cfg.memory_fraction = n.memory_fraction;
    a->limit =
        n.memory_fraction >= 1.0 ? a->capacity : (size_t)((double)a->capacity * n.memory_fraction);
    a->gc_limit = n.garbage_collection_threshold > 0.0
                      ? (size_t)((double)a->limit * n.garbage_collection_threshold)
                      : 0;
    a->st.limit = a->limit;
    if (rules)
        mt__tc_resume(a);
    note(a, MT_SETTING_MAX_SPLIT_SIZE, bytes(n.max_split_size), bytes(o.max_split_size));
    note(a, MT_SETTING_MAX_NON_SPLIT_ROUNDING, n.max_non_split_rounding, o.max_non_split_rounding);
    note(a, MT_SETTING_GC_THRESHOLD, ppm(n.garbage_collection_threshold),
         ppm(o.garbage_collection_threshold));
    note(a, MT_SETTING_MEMORY_FRACTION, ppm(n.memory_fraction), ppm(o.memory_fraction));
    note(a, MT_SETTING_RELEASE_ON_OOM, n.release_on_oom, o.release_on_oom);
    note(a, MT_SETTING_RELEASE_SMALLER, n.release_smaller_segments, o.release_smaller_segments);
    note(a, MT_SETTING_RELEASE_TO_FIT, n.release_to_fit, o.release_to_fit);
    note(a, MT_SETTING_PLACE_HIGH, n.place_high, o.place_high);
    for (int i = 0; i < MT_ALLOC_ROUNDUP_INTERVALS; i++)
        note(a, MT_SETTING_ROUNDUP_0 + i, n.roundup_power2_divisions[i],
             o.roundup_power2_divisions[i]);
out:
    mt__alloc_unlock(a);
    return rc;
}
