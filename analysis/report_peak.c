/* The device's peak of allocated as a process's events arrive, and the gap at it
 * (report_internal.h: proc_t's peak fields; docs/readers.md, "Memory: the model, not the
 * log"). The events since a second model's state wait in a list: that model, pm, plus the
 * list's first npeak events is the state right after the event that set the peak. pm is
 * made and caught up only when the list is full, and at the result: a run that grows costs
 * at most one more apply per event, where a copy of the state per new peak cost the live
 * blocks and segments each time, and a process of few events never makes one. */
#include <stdlib.h>
#include <string.h>

#include "analysis/gap.h"
#include "analysis/model.h"
#include "analysis/report_internal.h"
#include "util/assert.h"

/* The list's first npeak events applied to m: 0 or MT_ENOMEM. */
static int apply_to_peak(mt_model_t *m, const proc_t *p)
{
    for (size_t i = 0; i < p->npeak; i++)
        if (mt__model_apply(m, &p->lag[i]) != 0)
            return MT_ENOMEM;
    return 0;
}

/* pm made the peak's state: the list's first npeak events applied to it and taken off the
 * list. 0 or MT_ENOMEM. */
static int catch_up(mt__report_t *r, proc_t *p)
{
    if (p->npeak == 0)
        return 0;
    if (p->pm == NULL && mt__report_model_new(&r->cfg, p, &p->pm) != 0)
        return MT_ENOMEM;
    if (apply_to_peak(p->pm, p) != 0)
        return MT_ENOMEM;
    memmove(p->lag, p->lag + p->npeak, (p->nlag - p->npeak) * sizeof *p->lag);
    p->nlag -= p->npeak;
    p->npeak = 0;
    return 0;
}

/* The list and pm dropped (none of the list is the peak's: npeak = 0), the gap at the peak
 * taken from pm first: each later new peak's gap is copied when an event leaves it
 * (peak_pending). 0 or MT_ENOMEM. */
static int drop(mt__report_t *r, proc_t *p)
{
    mt_assert(p->npeak == 0);
    p->have_gap = false;
    if (p->pm != NULL) {
        p->have_gap = mt__gap_of_model(p->pm, MT_MODEL_DEVICE, &p->peak_gap) == 0;
        if (!p->have_gap)
            return MT_ENOMEM;
    }
    mt__model_destroy(&p->pm);
    free(p->lag);
    r->lag_total -= p->cap_lag;
    p->lag = NULL;
    p->nlag = p->cap_lag = 0;
    p->pm_off = true;
    return 0;
}

/* ev onto p's list (new_peak: it set a new peak). A full list grows within its bound and the
 * report's for every process, or makes room by catching pm up, or (all of it below the
 * peak) drops pm. 0 or MT_ENOMEM. */
static int follow(mt__report_t *r, proc_t *p, const mt_event_rec_t *ev, bool new_peak)
{
    if (p->nlag == p->cap_lag) {
        size_t cap = p->cap_lag ? 2 * p->cap_lag : 64;
        if (cap <= MT__REPORT_LAG_MAX &&
            r->lag_total + (cap - p->cap_lag) <= MT__REPORT_LAG_TOTAL) {
            mt_event_rec_t *lag = realloc(p->lag, cap * sizeof *lag);
            if (!lag)
                return MT_ENOMEM;
            r->lag_total += cap - p->cap_lag;
            p->lag = lag;
            p->cap_lag = cap;
        } else if (catch_up(r, p) != 0) {
            return MT_ENOMEM;
        } else if (p->nlag == p->cap_lag) {
            return drop(r, p);
        }
    }
    p->lag[p->nlag++] = *ev;
    if (new_peak)
        p->npeak = p->nlag;
    return 0;
}

int mt__report_peak_before(proc_t *p, const mt_model_t *m, const mt_event_rec_t *ev)
{
    /* An event that rises above the peak needs no copy: a ramp takes one, at its top. */
    if (mt__model_allocated_after(m, ev) > p->peak)
        return 0;
    if (p->have_gap)
        mt__gap_free(&p->peak_gap);
    p->have_gap = mt__gap_of_model(m, MT_MODEL_DEVICE, &p->peak_gap) == 0;
    if (!p->have_gap)
        return MT_ENOMEM;
    p->peak_pending = false;
    return 0;
}

int mt__report_peak_after(mt__report_t *r, proc_t *p, const mt_event_rec_t *ev, uint64_t allocated)
{
    /* The first event stands for the peak until allocated rises above 0. */
    bool new_peak = allocated > p->peak || p->nev == 0;
    if (allocated > p->peak)
        p->peak = allocated;
    if (!p->pm_off) {
        int rc = follow(r, p, ev, new_peak);
        if (rc != 0 || !p->pm_off)
            return rc;
    }
    p->peak_pending |= new_peak; /* (ev, if follow dropped pm, is not on the list) */
    return 0;
}

int mt__report_peak_settle(mt__report_t *r, proc_t *p)
{
    /* (without pm, the result applies the list to a model of its own: none kept) */
    if (p->pm_off || p->pm == NULL || p->npeak == p->nlag)
        return 0;
    return catch_up(r, p);
}

/* The gap at the peak when it is pm's (settled) or, without pm, that of the list's first
 * npeak events. 0 or MT_ENOMEM. */
static int gap_at_peak(const mt__report_cfg_t *cfg, const proc_t *p, mt_gap_t *g)
{
    if (p->pm != NULL)
        return p->npeak == 0 ? mt__gap_of_model(p->pm, MT_MODEL_DEVICE, g) : MT_ENOMEM;
    mt_model_t *tmp = NULL;
    int rc = mt__report_model_new(cfg, p, &tmp);
    if (rc == 0)
        rc = apply_to_peak(tmp, p);
    if (rc == 0)
        rc = mt__gap_of_model(tmp, MT_MODEL_DEVICE, g);
    mt__model_destroy(&tmp);
    return rc;
}

json_t *mt__report_peak_gap(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                            mt_sym_t *sym)
{
    /* (a snapshot's pins are named again from its frames, and cut then: tools/) */
    size_t top = p->snapshot ? SIZE_MAX : cfg->top;
    bool now = p->pm_off ? p->peak_pending || !p->have_gap : p->npeak == p->nlag;
    if (now) /* the state is the peak's still */
        return mt__report_gap_json(m, MT_MODEL_DEVICE, sym, (uint32_t)p->pid, cfg, top);
    if (p->pm_off)
        return mt__report_gap_named(&p->peak_gap, m, sym, (uint32_t)p->pid, cfg, top);
    mt_gap_t g; /* its pins named from m's tables, which has them all */
    if (gap_at_peak(cfg, p, &g) != 0)
        return NULL;
    json_t *j = mt__report_gap_named(&g, m, sym, (uint32_t)p->pid, cfg, top);
    mt__gap_free(&g);
    return j;
}
