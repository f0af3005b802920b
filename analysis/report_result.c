/* The report's figures for each process, as JSON (report.h: mt__report_result): peaks,
 * the timeline from its grid, never-freed allocations, growth, the gap at the peak and the
 * temporaries, from the model the events were applied to as they arrived (report.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/event_store.h"
#include "analysis/frames.h"
#include "analysis/report_internal.h"

const char *mt__report_tag_str(const proc_t *p, int tag, char *buf, size_t len)
{
    if (p->tag_names[tag])
        return p->tag_names[tag];
    if (tag < MT_TAG_USER_FIRST)
        return mt_tag_builtin_name(tag);
    snprintf(buf, len, "tag%d", tag);
    return buf;
}

/* JSON integers are signed: a figure above INT64_MAX is written as INT64_MAX. */
static json_int_t ji(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v;
}

json_t *mt__report_settings_json(const mt_model_t *m, uint64_t t0)
{
    const mt_model_setting_t *v;
    size_t n;
    uint64_t dropped;
    mt__model_settings(m, &v, &n, &dropped);
    if (n == 0)
        return NULL;
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++) {
        char name[48];
        json_t *e =
            json_pack("{s:f, s:i, s:s, s:I, s:I}", "t",
                      v[i].time_ns >= t0 ? (double)(v[i].time_ns - t0) / 1e9 : 0.0, "device",
                      (int)v[i].device, "key", mt_setting_name(v[i].id, name, sizeof name), "value",
                      ji(v[i].value), "before", ji(v[i].before));
        if (e == NULL || json_array_append_new(a, e) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* Managed memory totals (MT_EV_MANAGED); NULL when the process had no managed allocator. */
static json_t *managed_json(const mt_model_t *m)
{
    mt_model_managed_t g;
    mt__model_managed(m, &g);
    if (g.events == 0)
        return NULL;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "managed_peak_bytes",
                     ji(g.managed_peak), "device_peak_bytes", ji(g.device_peak), "migrated_bytes",
                     ji(g.migrated), "faults", ji(g.faults), "prefetches", ji(g.prefetches),
                     "prefetch_bytes", ji(g.prefetch_bytes), "advises", ji(g.advises));
}

/* ---- the analysis of one process, from its replay through the model ---- */

typedef struct group_s {
    uint64_t size, count;
    int tag;
} group_t;

static int cmp_group(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    uint64_t bx = mt_model_sat_mul(x->size, x->count), by = mt_model_sat_mul(y->size, y->count);
    if (bx != by)
        return bx > by ? -1 : 1;
    return x->tag - y->tag;
}

/* Blocks still allocated at the end (not freed, not pending), grouped by tag and size.
 * Blocks the model marks uncertain (allocated before a gap, their free maybe lost) are
 * counted apart, never as never-freed. */
static json_t *never_freed(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                           int cls)
{
    mt_model_map_t map;
    if (mt__model_map(m, cls, &map) != 0)
        return NULL;
    group_t *g = malloc((map.nblocks ? map.nblocks : 1) * sizeof(*g));
    if (!g) {
        mt__model_map_free(&map);
        return NULL;
    }
    size_t ng = 0;
    uint64_t count = 0, bytes = 0, ucount = 0, ubytes = 0;
    for (size_t i = 0; i < map.nblocks; i++) {
        const mt_model_block_t *b = &map.blocks[i];
        if (b->pending)
            continue;
        if (b->uncertain) {
            ucount++;
            ubytes = mt_model_sat_add(ubytes, b->size);
            continue;
        }
        count++;
        bytes = mt_model_sat_add(bytes, b->size);
        size_t k = 0;
        while (k < ng && !(g[k].size == b->size && g[k].tag == b->tag))
            k++;
        if (k == ng)
            g[ng++] = (group_t){b->size, 0, b->tag};
        g[k].count++;
    }
    mt__model_map_free(&map);
    qsort(g, ng, sizeof(*g), cmp_group);
    json_t *groups = json_array();
    for (size_t k = 0; groups && k < ng && k < cfg->top; k++) {
        char tb[16];
        if (json_array_append_new(groups,
                                  json_pack("{s:s, s:I, s:I, s:I}", "tag",
                                            mt__report_tag_str(p, g[k].tag, tb, sizeof(tb)), "size",
                                            ji(g[k].size), "count", ji(g[k].count), "bytes",
                                            ji(mt_model_sat_mul(g[k].size, g[k].count)))) != 0) {
            json_decref(groups);
            groups = NULL; /* out of memory: the pack below fails */
        }
    }
    free(g);
    json_t *o = json_pack("{s:I, s:I, s:I, s:o}", "count", ji(count), "bytes", ji(bytes),
                          "groups_total", ji(ng), "groups", groups);
    if (o && ucount &&
        (json_object_set_new(o, "uncertain_count", json_integer(ji(ucount))) != 0 ||
         json_object_set_new(o, "uncertain_bytes", json_integer(ji(ubytes))) != 0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *fit_json(const char *tag, const mt_model_fit_t *f)
{
    return json_pack("{s:s, s:f, s:f, s:f}", "tag", tag, "slope_bytes_per_iteration", f->slope,
                     "r2", f->r2, "rise_bytes", f->rise);
}

static json_t *growth(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m)
{
    mt_model_growth_cfg_t gc = {.min_growth_bytes = cfg->min_growth_bytes, .min_r2 = cfg->min_r2};
    mt_model_growth_t g;
    mt__model_growth(m, &gc, &g);
    json_t *jt = json_array();
    for (int t = 0; jt && t < MT_TAG_MAX; t++) {
        char tb[16];
        if (g.tag[t].detected &&
            json_array_append_new(
                jt, fit_json(mt__report_tag_str(p, t, tb, sizeof(tb)), &g.tag[t])) != 0) {
            json_decref(jt);
            jt = NULL; /* out of memory: the pack below fails */
        }
    }
    return json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:b, s:o}", "iterations",
                     ji(g.iterations), "fitted", ji(g.fitted), "first_iteration", ji(g.first),
                     "last_iteration", ji(g.last), "slope_bytes_per_iteration", g.total.slope, "r2",
                     g.total.r2, "rise_bytes", g.total.rise, "nondecreasing_steps", g.total.nondecr,
                     "detected", g.total.detected, "tags", jt);
}

static json_t *peaks_by_tag(const proc_t *p, const mt_model_t *m, int cls)
{
    json_t *peak_tags = json_object();
    for (int t = 0; peak_tags && t < MT_TAG_MAX; t++) {
        char tb[16];
        mt_model_tag_t tg;
        mt__model_tag(m, cls, t, &tg);
        if (tg.peak > 0 && json_object_set_new(peak_tags, mt__report_tag_str(p, t, tb, sizeof(tb)),
                                               json_integer(ji(tg.peak))) != 0) {
            json_decref(peak_tags);
            return NULL;
        }
    }
    return peak_tags;
}

/* What a gap left uncertain in a class, when anything: bytes the model cannot place.
 * Returns o, or NULL (o released) when there was no memory to say it. */
static json_t *uncertain_json(json_t *o, const mt_model_figures_t *f)
{
    if (!o || !f->uncertain)
        return o;
    if (json_object_set_new(o, "uncertain_bytes", json_integer(ji(f->uncertain_bytes))) != 0 ||
        json_object_set_new(o, "untracked_bytes", json_integer(ji(f->untracked_bytes))) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The pinned host memory of a process, summarised apart from its device memory. */
static json_t *host_summary(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                            uint64_t events)
{
    mt_model_figures_t h;
    if (mt__model_figures(m, MT_MODEL_HOST, &h) != 0)
        return NULL; /* no memory for the free extents: no figure rather than a wrong one */
    json_t *o =
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:I}", "events", ji(events),
                  "peak_allocated", ji(h.peak_allocated), "peak_reserved", ji(h.peak_reserved),
                  "final_allocated", ji(h.allocated), "final_reserved", ji(h.reserved),
                  "peak_by_tag", peaks_by_tag(p, m, MT_MODEL_HOST), "never_freed",
                  never_freed(cfg, p, m, MT_MODEL_HOST), "unmatched_frees", ji(h.unmatched_frees));
    return uncertain_json(o, &h);
}

static json_t *timeline_sample(const tl_pt_t *pt, uint64_t peak, double t_s)
{
    return json_pack("{s:f, s:I, s:I, s:I, s:f, s:f}", "t_s", t_s, "allocated", ji(pt->allocated),
                     "reserved", ji(pt->reserved), "peak_allocated", ji(peak), "utilization",
                     pt->utilization, "fragmentation", pt->fragmentation);
}

/* The timeline: timeline_steps samples at equal steps of the span t0..t1 (the last one after
 * every event), each the state at a grid point next to its step, with the most allocated
 * since the sample before. New reference, NULL without memory. */
static json_t *timeline(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                        uint64_t t0, uint64_t t1)
{
    const tl_grid_t *g = &p->grid;
    unsigned steps = cfg->timeline_steps;
    double step = (double)(t1 - t0) / steps;
    json_t *tl = json_array();
    size_t from = 0; /* the grid points not yet behind a sample */
    for (unsigned k = 1; tl && step > 0 && k < steps && g->next > 0; k++) {
        double at = (double)t0 + k * step - (double)g->origin;
        /* The point at or after the step is its very state when no event came between the
         * two; else the one before it, the very state when none came between those. */
        size_t j = at <= 0 ? 0 : (size_t)(at / (double)g->w);
        if (j + 1 < g->next && (double)j * (double)g->w < at && (double)g->pts[j + 1].last <= at)
            j++;
        j = j < g->next ? j : g->next - 1;
        j = j < from ? (from ? from - 1 : 0) : j;
        uint64_t peak = g->pts[j].allocated;
        for (size_t q = from; q <= j; q++)
            peak = g->pts[q].max > peak ? g->pts[q].max : peak;
        from = j + 1 > from ? j + 1 : from;
        if (json_array_append_new(tl, timeline_sample(&g->pts[j], peak, k * step / 1e9)) != 0) {
            json_decref(tl);
            return NULL;
        }
    }
    mt_model_figures_t f;
    if (!tl || mt__model_figures(m, MT_MODEL_DEVICE, &f) != 0) {
        json_decref(tl);
        return NULL;
    }
    tl_pt_t last = {f.allocated, f.reserved, f.utilization, f.fragmentation, 0, g->last};
    uint64_t peak = g->run > f.allocated ? g->run : f.allocated;
    for (size_t q = from; q < g->next; q++)
        peak = g->pts[q].max > peak ? g->pts[q].max : peak;
    if (json_array_append_new(tl, timeline_sample(&last, peak, (double)(t1 - t0) / 1e9)) != 0) {
        json_decref(tl);
        return NULL;
    }
    return tl;
}

/* Device memory per device, from the model: the process's final figures are the sums. */
static json_t *by_device(const mt_model_t *m)
{
    mt_model_dev_t d[256];
    size_t n = mt__model_devices(m, d, 256);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n && i < 256; i++)
        if (json_array_append_new(
                a, json_pack("{s:i, s:I, s:I, s:I, s:I}", "device", (int)d[i].device,
                             "final_allocated", ji(d[i].allocated), "final_reserved",
                             ji(d[i].reserved), "peak_allocated", ji(d[i].peak_allocated),
                             "peak_reserved", ji(d[i].peak_reserved))) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static int tag_key(void *ctx, const mt_model_temp_t *row, char *key, size_t len)
{
    char tb[32];
    snprintf(key, len, "%s", mt__report_tag_str(ctx, (int)row->key, tb, sizeof tb));
    return 0;
}

/* Temporary allocations by site when the input recorded stacks and the report groups by
 * them, else by tag. */
static int temporary(json_t *res, const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                     mt_sym_t *sym)
{
    mt_model_stack_stats_t ss;
    mt__model_stack_stats(m, &ss);
    bool by_tag = !cfg->by_callsite || cfg->by == MT_FR_BY_TAG || ss.defined == 0;
    json_t *t =
        mt__report_temporary_json(m, sym, (uint32_t)p->pid, cfg, by_tag, tag_key, (void *)p);
    if (t == NULL || json_object_set_new(res, "temporary", t) != 0)
        return MT_ENOMEM;
    /* By tag too, for a reader that shows tagged input by tag (the CLI without --by). */
    if (!by_tag && json_object_set_new(res, "temporary_by_tag",
                                       mt__report_temporary_json(m, sym, (uint32_t)p->pid, cfg,
                                                                 true, tag_key, (void *)p)) != 0)
        return MT_ENOMEM;
    return json_object_set_new(res, "temporary_window_us",
                               json_integer(ji(cfg->temporary_window_us))) ||
                   json_object_set_new(res, "temporary_by",
                                       json_string(by_tag ? "tag" : mt__fr_by_name(cfg->by)))
               ? MT_ENOMEM
               : 0;
}

static json_t *analyse(const mt__report_cfg_t *cfg, const proc_t *p, mt_sym_t *sym)
{
    if (cfg->replay_only || p->failed)
        return NULL;
    mt_model_t *m = p->m, *empty = NULL;
    json_t *tl = NULL, *res = NULL;
    const mt__report_outside_t *outside = p->outside;
    mt__report_outside_t *none = NULL;
    if (!m) { /* no event, no table: the analysis of nothing */
        mt_model_cfg_t mc = {.keep_iterations = true,
                             .temporary_window_us = cfg->temporary_window_us};
        if (mt__model_create(&empty, &mc) != 0 || mt__report_outside_create(&none) != 0 ||
            (p->tables && mt__model_tables_copy(empty, p->tables) != 0))
            goto out;
        m = empty;
        outside = none;
    }
    size_t n = p->nev;
    uint64_t t0 = n ? p->t_min : 0, t1 = n ? p->t_max : 0, host_events = p->host_events;
    if (!(tl = timeline(cfg, p, m, t0, t1)))
        goto out;

    mt_model_figures_t d;
    if (mt__model_figures(m, MT_MODEL_DEVICE, &d) != 0)
        goto out;
    static const char *const exits[] = {"unknown", "clean", "unclean"};
    uint64_t lost = p->lost > mt__model_lost(m) ? p->lost : mt__model_lost(m);
    res = json_pack(
        "{s:i, s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:I, s:o, s:o}", "pid",
        p->pid, "name", p->name, "events", ji(n - p->labels - p->added), "lost", ji(lost),
        "duplicates", ji(p->duplicates), "exit", exits[p->exit_state], "peak_allocated",
        ji(d.peak_allocated), "peak_reserved", ji(d.peak_reserved), "final_allocated",
        ji(d.allocated), "final_reserved", ji(d.reserved), "peak_by_tag",
        peaks_by_tag(p, m, MT_MODEL_DEVICE), "timeline", tl, "never_freed",
        never_freed(cfg, p, m, MT_MODEL_DEVICE), "unmatched_frees", ji(d.unmatched_frees), "growth",
        growth(cfg, p, m), "host", host_summary(cfg, p, m, host_events));
    tl = NULL; /* owned by res now */
    if (res != NULL && mt_prof_job_to_json(res, &p->job) != 0) {
        json_decref(res);
        res = NULL;
    }
    if (res != NULL && json_object_set_new(res, "devices", by_device(m)) != 0) {
        json_decref(res);
        res = NULL;
    }
    res = uncertain_json(res, &d);
    if (res != NULL &&
        (json_object_set_new(res, "end_gap",
                             mt__report_gap_json(m, MT_MODEL_DEVICE, sym, (uint32_t)p->pid, cfg,
                                                 p->snapshot ? SIZE_MAX : cfg->top)) != 0 ||
         json_object_set_new(res, "peak_gap", mt__report_peak_gap(cfg, p, m, sym)) != 0)) {
        json_decref(res);
        res = NULL;
    }
    json_t *scj = res != NULL ? mt__scopes_json(&p->sc) : NULL;
    if (scj != NULL && json_object_set_new(res, "scopes", scj) != 0) {
        json_decref(res);
        res = NULL;
    }
    json_t *sets = res != NULL ? mt__report_settings_json(m, t0) : NULL;
    if (sets != NULL && json_object_set_new(res, "settings_changes", sets) != 0) {
        json_decref(res);
        res = NULL;
    }
    json_t *spans = NULL;
    if (res != NULL && (mt__report_spans_json(m, &spans) != 0 ||
                        (spans != NULL && json_object_set_new(res, "spans", spans) != 0))) {
        json_decref(res);
        res = NULL;
    }
    if (res != NULL && mt__report_outside_json(outside, m, t0, res) != 0) {
        json_decref(res);
        res = NULL;
    }
    json_t *mgd = res != NULL ? managed_json(m) : NULL;
    if (mgd != NULL && json_object_set_new(res, "managed", mgd) != 0) {
        json_decref(res);
        res = NULL;
    }
    if (res != NULL && cfg->by_callsite &&
        json_object_set_new(res, "callsites",
                            mt__report_callsites_json(m, sym, (uint32_t)p->pid, cfg)) != 0) {
        json_decref(res);
        res = NULL;
    }
    /* Without a clock, lifetimes are unknown: no temporary allocations, and the reader is
     * told how to read the times. */
    if (res != NULL && (p->untimed ? json_object_set_new(res, "clock", json_string("event_order"))
                                   : temporary(res, cfg, p, m, sym)) != 0) {
        json_decref(res);
        res = NULL;
    }
    if (res != NULL && p->snapshot != 0 &&
        (json_object_set_new(res, "source", json_string("torch_snapshot")) != 0 ||
         json_object_set_new(res, "state_only", json_boolean(p->snapshot == 2)) != 0 ||
         json_object_set_new(res, "skipped_entries", json_integer(ji(p->snap_skipped))) != 0)) {
        json_decref(res);
        res = NULL;
    }
out:
    json_decref(tl);
    mt__report_outside_destroy(&none);
    mt__model_destroy(&empty);
    return res;
}

/* A new object of p's members named in keep (NULL-terminated), in keep's order (borrowed
 * from p). NULL: no memory. */
static json_t *keep_only(const json_t *p, const char *const *keep)
{
    json_t *out = json_object();
    for (size_t k = 0; out != NULL && keep[k] != NULL; k++) {
        json_t *v = json_object_get(p, keep[k]);
        if (v != NULL && json_object_set(out, keep[k], v) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

json_t *mt__report_result_head(const mt__report_t *r)
{
    return json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I}", "v", 1, "type", "report", "lines",
                     ji(r->lines), "events", ji(r->events), "malformed", ji(r->malformed),
                     "lost_unattributed", ji(r->lost_unattributed), "duplicates",
                     ji(r->duplicates));
}

/* The result; final: each process's analysis freed once its object is made, and of that
 * object only the members in keep (unless NULL), or with fn, what the jobs read of it after
 * fn had it whole. */
static json_t *result(mt__report_t *r, bool final, const char *const *keep, mt__report_proc_fn fn,
                      void *ctx)
{
    json_t *procs = json_array();
    if (!procs)
        return NULL;
    for (size_t i = 0; i < r->nprocs; i++) {
        json_t *p = mt__report_peak_settle(r, &r->procs[i]) == 0
                        ? analyse(&r->cfg, &r->procs[i], r->sym)
                        : NULL;
        if (final)
            mt__report_release(r, &r->procs[i]);
        json_t *whole = p;
        if (p != NULL && fn != NULL) {
            /* the view first: fn may change the object (the printers fit it) */
            p = mt__report_job_view(whole);
            if (p != NULL && fn(ctx, whole) != 0) {
                json_decref(p);
                p = NULL;
            }
            json_decref(whole);
        } else if (p != NULL && keep != NULL) {
            p = keep_only(whole, keep);
            json_decref(whole);
        }
        if (!p || json_array_append_new(procs, p) != 0) {
            json_decref(procs);
            return NULL;
        }
    }
    json_t *jobs = keep == NULL ? mt__report_jobs_json(procs) : json_array();
    json_t *res = jobs != NULL ? mt__report_result_head(r) : NULL;
    if (res == NULL)
        json_decref(procs);
    if (res == NULL || json_object_set_new(res, "processes", procs) != 0) {
        json_decref(res);
        json_decref(jobs);
        return NULL;
    }
    if (json_array_size(jobs) > 0 && json_object_set(res, "jobs", jobs) != 0) {
        json_decref(res);
        res = NULL;
    }
    json_decref(jobs);
    return res;
}

json_t *mt__report_result(mt__report_t *r)
{
    return result(r, false, NULL, NULL, NULL);
}

json_t *mt__report_result_final(mt__report_t *r, const char *const *keep)
{
    return result(r, true, keep, NULL, NULL);
}

json_t *mt__report_result_stream(mt__report_t *r, mt__report_proc_fn fn, void *ctx)
{
    return result(r, true, NULL, fn, ctx);
}
