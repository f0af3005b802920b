/* What the program watches: OOM observers (PyTorch's out-of-memory observer) and scoped
 * statistics (RMM's push_statistics / pop_statistics).
 *
 * A scope's peak must be the truth's even while thread caches hand blocks out without the
 * lock. The caches keep the counters at or above the truth and no fast pop raises them
 * (tcache.c), so one tracker suffices: scope_hw, the highest allocated bytes since the
 * last push or pop. Push and pop flush every cache (the counters are then the truth) and
 * fold scope_hw into every open scope; a global allocation that would pass scope_hw
 * flushes first (mt__tc_peak_guard), so every value scope_hw takes is one the truth had. */
#include <stdio.h>
#include <string.h>

#include "allocator/internal.h"
#include "allocator/tcache.h"

/* ---- OOM observers ---- */

int mt_alloc_add_oom_observer(mt_alloc_t *a, mt_alloc_oom_cb cb, void *ud)
{
    if (a == NULL || cb == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = a->noom_obs < MT__OOM_OBS_MAX ? 0 : MT_EBUSY;
    if (rc == 0)
        a->oom_obs[a->noom_obs++] = (mt__oom_obs_t){cb, ud};
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_remove_oom_observer(mt_alloc_t *a, mt_alloc_oom_cb cb, void *ud)
{
    if (a == NULL || cb == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = MT_ENOENT;
    for (unsigned i = 0; i < a->noom_obs; i++) {
        if (a->oom_obs[i].cb == cb && a->oom_obs[i].ud == ud) {
            memmove(&a->oom_obs[i], &a->oom_obs[i + 1],
                    (a->noom_obs - i - 1) * sizeof a->oom_obs[0]);
            a->noom_obs--;
            rc = 0;
            break;
        }
    }
    mt__alloc_unlock(a);
    return rc;
}

void mt__oom_prepare(mt_alloc_t *a, size_t size, mt__oom_call_t *call)
{
    mt__alloc_assert_owner(a);
    call->n = a->noom_obs;
    if (call->n == 0)
        return;
    memcpy(call->obs, a->oom_obs, call->n * sizeof call->obs[0]);
    /* The message is copied: another thread's failure may rewrite last_error meanwhile. */
    memcpy(call->msg, a->last_error, sizeof call->msg);
    call->msg[sizeof call->msg - 1] = '\0';
    size_t free_b = 0, total_b = 0;
    (void)mt_backend_mem_get_info(a->backend, &free_b, &total_b);
    call->info = (mt_alloc_oom_info_t){
        .device = a->device,
        .requested = size,
        .allocated = (uint64_t)a->st.allocated_bytes[MT_STAT_ALL].current,
        .reserved = (uint64_t)a->st.reserved_bytes[MT_STAT_ALL].current,
        .limit = a->limit,
        .free = free_b,
        .message = call->msg,
    };
}

void mt__oom_run(const mt__oom_call_t *call)
{
    for (unsigned i = 0; i < call->n; i++)
        call->obs[i].cb(call->obs[i].ud, &call->info);
}

/* ---- scoped statistics ---- */

/* The open scopes' peaks take in scope_hw; the counters are the truth (caches flushed). */
static void fold(mt_alloc_t *a)
{
    for (unsigned i = 0; i < a->nscopes; i++)
        if (a->scope_hw > a->scopes[i].peak)
            a->scopes[i].peak = a->scope_hw;
    a->scope_hw = a->st.allocated_bytes[MT_STAT_ALL].current;
}

static void emit_name(mt_alloc_t *a, const char *prefix, const char *name)
{
    if (name == NULL || name[0] == '\0' || a->cfg.sink == NULL)
        return;
    char b[MT_EVENT_MARK_NAME_MAX + 2];
    snprintf(b, sizeof b, "%s%s", prefix, name);
    mt_event_rec_t ev = {0};
    mt_event_mark_name_pack(&ev, b);
    mt__alloc_emit(a, MT_EV_MARK_NAMED, ev.addr, ev.size, 0, 0, MT_POOL_NONE, MT_TAG_OTHER);
}

int mt_alloc_stats_push(mt_alloc_t *a, const char *name)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = MT_EOVERFLOW;
    if (a->nscopes < MT_ALLOC_SCOPE_MAX) {
        mt__tc_flush_all(a);
        fold(a);
        const mt_alloc_stats_t *st = &a->st;
        int64_t cur = st->allocated_bytes[MT_STAT_ALL].current;
        a->scopes[a->nscopes++] = (mt__scope_t){
            .start = cur,
            .peak = cur,
            .alloc0 = st->allocated_bytes[MT_STAT_ALL].allocated,
            .count0 = st->allocation[MT_STAT_ALL].allocated,
            .ccount0 = st->allocation[MT_STAT_ALL].current,
        };
        mt__scope_t *s = &a->scopes[a->nscopes - 1];
        snprintf(s->name, sizeof s->name, "%s", name != NULL ? name : "");
        emit_name(a, "", s->name);
        rc = 0;
    }
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_stats_pop(mt_alloc_t *a, mt_alloc_scope_stats_t *out)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = MT_EINVAL;
    if (a->nscopes > 0) {
        mt__tc_flush_all(a);
        fold(a);
        const mt__scope_t *s = &a->scopes[--a->nscopes];
        const mt_alloc_stats_t *st = &a->st;
        int64_t cur = st->allocated_bytes[MT_STAT_ALL].current;
        uint64_t allocd = st->allocated_bytes[MT_STAT_ALL].allocated - s->alloc0;
        uint64_t count = st->allocation[MT_STAT_ALL].allocated - s->count0;
        int64_t dcount = st->allocation[MT_STAT_ALL].current - s->ccount0;
        mt_assert(s->start <= s->peak && cur <= s->peak);
        if (out != NULL)
            *out = (mt_alloc_scope_stats_t){
                .start_bytes = s->start,
                .peak_bytes = s->peak - s->start,
                .current_bytes = cur - s->start,
                .allocated_bytes = allocd,
                .freed_bytes = (uint64_t)((int64_t)allocd - (cur - s->start)),
                .allocations = count,
                .frees = (uint64_t)((int64_t)count - dcount),
            };
        emit_name(a, "/", s->name);
        rc = 0;
    }
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_stats_depth(mt_alloc_t *a)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int n = (int)a->nscopes;
    mt__alloc_unlock(a);
    return n;
}
