/* The device's peak of allocated as a process's events arrive, and the gap at it
 * (report_internal.h: proc_t's peak fields; docs/readers.md, "Memory: the model, not the
 * log"). A second model, pm, lags the process's model at the state right after the event
 * that set the peak, fed the events since at each new peak: a run that grows costs one more
 * apply per event, where a copy of the state per new peak cost the live blocks and segments
 * each time. */
#include <stdlib.h>

#include "analysis/gap.h"
#include "analysis/model.h"
#include "analysis/report_internal.h"

/* pm dropped, the gap at the peak taken from it first: each later new peak's gap is copied
 * when an event leaves it (peak_pending). 0 or MT_ENOMEM. */
static int drop(mt__report_t *r, proc_t *p)
{
    p->have_gap = mt__gap_of_model(p->pm, MT_MODEL_DEVICE, &p->peak_gap) == 0;
    if (!p->have_gap)
        return MT_ENOMEM;
    mt__model_destroy(&p->pm);
    free(p->lag);
    r->lag_total -= p->cap_lag;
    p->lag = NULL;
    p->nlag = p->cap_lag = 0;
    p->pm_off = true;
    return 0;
}

/* ev into p->pm's lag, and pm caught up when ev set a new peak. A lag that would pass its
 * own bound, or the report's for every process, drops pm. 0 or MT_ENOMEM. */
static int follow(mt__report_t *r, proc_t *p, const mt_event_rec_t *ev, bool new_peak)
{
    if (p->pm == NULL && mt__report_model_new(&r->cfg, p, &p->pm) != 0)
        return MT_ENOMEM;
    if (p->nlag == p->cap_lag) {
        size_t cap = p->cap_lag ? 2 * p->cap_lag : 64;
        if (cap > MT__REPORT_LAG_MAX || r->lag_total + (cap - p->cap_lag) > MT__REPORT_LAG_TOTAL)
            return drop(r, p);
        mt_event_rec_t *lag = realloc(p->lag, cap * sizeof *lag);
        if (!lag)
            return MT_ENOMEM;
        r->lag_total += cap - p->cap_lag;
        p->lag = lag;
        p->cap_lag = cap;
    }
    p->lag[p->nlag++] = *ev;
    if (!new_peak)
        return 0;
    for (size_t i = 0; i < p->nlag; i++)
        if (mt__model_apply(p->pm, &p->lag[i]) != 0)
            return MT_ENOMEM;
    p->nlag = 0;
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
    if (!p->pm_off)
        return follow(r, p, ev, new_peak);
    p->peak_pending |= new_peak;
    return 0;
}

json_t *mt__report_peak_gap(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                            mt_sym_t *sym)
{
    /* (a snapshot's pins are named again from its frames, and cut then: tools/) */
    size_t top = p->snapshot ? SIZE_MAX : cfg->top;
    if (p->pm != NULL) { /* the peak's state; its pins named from m, which has every table */
        mt_gap_t g;
        if (mt__gap_of_model(p->pm, MT_MODEL_DEVICE, &g) != 0)
            return NULL;
        json_t *j = mt__report_gap_named(&g, m, sym, (uint32_t)p->pid, cfg, top);
        mt__gap_free(&g);
        return j;
    }
    if (p->peak_pending || !p->have_gap) /* the state is the peak's still */
        return mt__report_gap_json(m, MT_MODEL_DEVICE, sym, (uint32_t)p->pid, cfg, top);
    return mt__report_gap_named(&p->peak_gap, m, sym, (uint32_t)p->pid, cfg, top);
}
