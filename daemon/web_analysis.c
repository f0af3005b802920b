/* memtraced: the page's routes that read the analysis layer (web.h): each answer is built
 * by the functions `memtrace report` and `memtrace diff` run, so the page and the report
 * say the same thing of the same events. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/callsite.h"
#include "analysis/frames.h"
#include "analysis/gap.h"
#include "analysis/model.h"
#include "analysis/report.h"
#include "analysis/scopes.h"
#include "analysis/torch_snapshot.h"
#include "analysis/torch_snapshot_timeline.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "util/json.h"

/* ---- allocator state: sites, gap, call sites ---- */

/* /sites?pid=: a snapshot's live bytes by site over its trace (the top sites, then
 * "other"): t[b] the buckets' starts, bytes[s][b] site s's bytes at bucket b's largest
 * total. 404 for a process that is not a snapshot. */
void mt__d_web_serve_sites(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    const mt_ts_timeline_t *tl = p->sites;
    if (!tl) {
        mt__d_web_bad(c, 404, "no sites: not a snapshot\n");
        return;
    }
    mt_d_buf_t o = {0};
    mt__d_buf_printf(&o, "{\"pid\":%d,\"by_time\":%s,\"sites\":[", p->pid,
                     tl->by_time ? "true" : "false");
    for (size_t s = 0; s < tl->nsites && !o.err; s++) {
        mt__d_buf_append(&o, s ? ",{\"name\":" : "{\"name\":", s ? 9 : 8);
        mt__d_web_json_str(&o, tl->names[s]);
        mt__d_buf_printf(&o, ",\"peak\":%" PRIu64 "}", tl->peak[s]);
    }
    mt__d_buf_append(&o, "],\"t\":[", 7);
    for (size_t b = 0; b < tl->nbuckets && !o.err; b++)
        mt__d_buf_printf(&o, "%s%.6f", b ? "," : "", tl->t[b]);
    mt__d_buf_append(&o, "],\"bytes\":[", 11);
    for (size_t s = 0; s < tl->nsites && !o.err; s++) {
        mt__d_buf_append(&o, s ? ",[" : "[", s ? 2 : 1);
        for (size_t b = 0; b < tl->nbuckets && !o.err; b++)
            mt__d_buf_printf(&o, "%s%" PRIu64, b ? "," : "", tl->bytes[b * tl->nsites + s]);
        mt__d_buf_append(&o, "]", 1);
    }
    mt__d_buf_append(&o, "]}\n", 3);
    mt__d_web_send(c, &o, head);
}

/* Answers {"pid", "live", "t", key: v} for the state after the window's first upto events
 * (live when !past), or a 500 when building v failed (rc, or v NULL). */
static void send_at(mt_d_conn_t *c, const mt_d_proc_t *p, mt_d_web_proc_t *t, bool past,
                    size_t upto, const char *key, int rc, json_t *v, bool head)
{
    const mt_event_rec_t *at = upto ? mt__d_web_window_at(t, upto - 1) : NULL;
    char *txt = NULL;
    if (rc == 0)
        rc = v ? mt__json_dumps(v, JSON_COMPACT, &txt, NULL) : MT_ENOMEM;
    mt_d_buf_t o = {0};
    if (rc)
        mt__d_buf_fail(&o, rc);
    else
        mt__d_buf_printf(&o, "{\"pid\":%d,\"live\":%s,\"t\":%.6f,\"%s\":%s}\n", p->pid,
                         past ? "false" : "true", at ? mt__d_web_secs(t, at->time_ns) : 0.0, key,
                         txt);
    free(txt);
    mt__d_web_send(c, &o, head);
}

/* /gap?pid=[&seq=|&t=]: why device reserved exceeds allocated now, or at an event of the
 * window (analysis/gap.h, the report's peak_gap and end_gap); a snapshot's pinning stacks
 * named by their user frame ("site"). */
void mt__d_web_serve_gap(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    size_t upto = t->wcount;
    bool past = mt__d_web_past_upto(t, query, &upto);
    mt_model_t *m = NULL;
    mt_gap_t g = {0};
    json_t *j = NULL;
    int rc = past ? mt__d_web_state_at(t, upto, &m) : 0;
    if (!rc)
        rc = mt__gap_of_model(past ? m : p->model, MT_MODEL_DEVICE, &g);
    if (!rc)
        j = mt__gap_json(&g, p->snap ? SIZE_MAX : 5); /* a snapshot's: joined by site, then cut */
    json_t *pins = json_object_get(j, "pins");
    for (size_t i = 0; p->snap && i < json_array_size(pins); i++) {
        json_t *pin = json_array_get(pins, i);
        uint32_t id = (uint32_t)json_integer_value(json_object_get(pin, "stack"));
        mt_fr_frame_t fr[MT_STACK_DEPTH_MAX * 4];
        char site[512];
        int frame;
        if (json_object_set_new(pin, "site",
                                json_string(mt__ts_stack_key(p->snap, id, NULL, MT_FR_BY_SITE, fr,
                                                             sizeof fr / sizeof fr[0], &frame, site,
                                                             sizeof site))) != 0)
            rc = MT_ENOMEM;
    }
    if (!rc && p->snap && mt__gap_pins_by_site(pins, 5) != 0)
        rc = MT_ENOMEM; /* (the answer is then the error) */
    send_at(c, p, t, past, upto, "gap", rc, j, head);
    json_decref(j);
    mt__gap_free(&g);
    mt__model_destroy(&m);
}

/* /callsites?pid=[&seq=|&t=]: live device bytes by call stack now, or at an event of the
 * window (the compare view). Frames come from the process's stack table, or a snapshot's
 * own (mt__ts_name_rows). */
void mt__d_web_serve_callsites(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    size_t upto = t->wcount;
    bool past = mt__d_web_past_upto(t, query, &upto);
    mt_model_t *m = NULL;
    mt_cs_row_t *rows = NULL;
    size_t n = 0;
    int rc = past ? mt__d_web_state_at(t, upto, &m) : 0;
    if (!rc)
        rc = mt__cs_rows_from_model(past ? m : p->model, MT_CS_LIVE, &rows, &n);
    for (size_t i = 0; !rc && i < n; i++) { /* the table is the live model's */
        const mt_model_frame_t *fr;
        rows[i].frames = NULL;
        if (mt__model_stack_frames(p->model, rows[i].stack, &fr, &rows[i].n_frames,
                                   &rows[i].truncated) == 0)
            rows[i].frames = (const mt_cs_frame_t *)fr;
    }
    json_t *a = NULL;
    if (!rc) {
        rc = mt__cs_sym_sync(p->sym, (uint32_t)p->pid, p->model);
        if (!rc)
            rc = mt__cs_rows_merge(p->sym, (uint32_t)p->pid, rows, &n);
    }
    if (!rc) {
        a = mt__cs_rows_json(p->sym, (uint32_t)p->pid, rows, n, MT_D_WEB_CALLSITES, false);
        if (a != NULL && p->snap != NULL && mt__ts_name_rows(p->snap, a) != 0)
            rc = MT_ENOMEM; /* (the answer is then the error) */
    }
    send_at(c, p, t, past, upto, "callsites", rc, a, head);
    json_decref(a);
    free(rows);
    mt__model_destroy(&m);
}

/* ---- scopes, temporary allocations, settings changed ---- */

static int tag_key(void *ctx, const mt_model_temp_t *row, char *key, size_t len)
{
    char nbuf[32];
    snprintf(key, len, "%s", mt__d_tag_name(ctx, (int)row->key, nbuf, sizeof nbuf));
    return 0;
}

/* A snapshot's stack named by its user frame, as /gap and the report name its sites. */
static int snap_key(void *ctx, const mt_model_temp_t *row, char *key, size_t len)
{
    const mt_d_proc_t *p = ctx;
    mt_fr_frame_t fr[MT_STACK_DEPTH_MAX * 4];
    int frame;
    mt__ts_stack_key(p->snap, row->key, NULL, MT_FR_BY_SITE, fr, sizeof fr / sizeof fr[0], &frame,
                     key, len);
    return 0;
}

/* The temporary-allocation rows of `memtrace report` (report_temp.c): by site when the
 * process recorded stacks (a snapshot's by its frames), else by tag. New, NULL without
 * memory; *by says which. */
static json_t *temporary_json(const mt_d_proc_t *p, const mt__report_cfg_t *cfg, const char **by)
{
    mt_model_stack_stats_t ss;
    mt__model_stack_stats(p->model, &ss);
    if (p->snap) {
        mt_model_temp_t *rows = NULL;
        size_t n = 0;
        *by = "site";
        if (mt__model_temporary(p->model, MT_MODEL_DEVICE, false, &rows, &n) != 0)
            return NULL;
        json_t *a = mt__report_temp_group(rows, n, mt__model_temp_buckets(p->model), snap_key,
                                          (void *)p, cfg->top);
        free(rows);
        return a;
    }
    bool by_tag = ss.defined == 0;
    *by = by_tag ? "tag" : "site";
    return mt__report_temporary_json(p->model, p->sym, (uint32_t)p->pid, cfg, by_tag, tag_key,
                                     (void *)p);
}

/* The settings changes of the report (t: seconds from the process's first event), each with
 * "at", its time in the page's epoch seconds, for the timeline's marks. */
static json_t *settings_json(const mt_d_proc_t *p, const mt_d_web_proc_t *t)
{
    json_t *a = mt__report_settings_json(p->model, p->first_ns);
    const mt_model_setting_t *v;
    size_t n;
    uint64_t dropped;
    mt__model_settings(p->model, &v, &n, &dropped);
    for (size_t i = 0; a && i < n && i < json_array_size(a); i++)
        if (json_object_set_new(json_array_get(a, i), "at",
                                json_real(mt__d_web_secs(t, v[i].time_ns))) != 0) {
            json_decref(a);
            return NULL;
        }
    return a ? a : json_array();
}

/* /analysis?pid=: what `memtrace report` says of the process's events so far in "scopes",
 * "temporary" and "settings_changes" (with the report's defaults: the top 10 rows, a block
 * freed within 1 ms is temporary). Empty arrays where there is nothing. */
void mt__d_web_serve_analysis(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    const char *by = "tag";
    json_t *sc = mt__scopes_json(p->scopes);
    /* (no clock: no lifetimes, so no rows; the page says why) */
    json_t *tmp = p->event_ns ? json_array() : temporary_json(p, &cfg, &by);
    json_t *o =
        json_pack("{s:i, s:o, s:o, s:s, s:I, s:o}", "pid", p->pid, "scopes", sc ? sc : json_array(),
                  "temporary", tmp, "temporary_by", by, "temporary_window_us",
                  (json_int_t)cfg.temporary_window_us, "settings_changes", settings_json(p, t));
    char *txt = NULL;
    int rc = o ? mt__json_dumps(o, JSON_COMPACT, &txt, NULL) : MT_ENOMEM;
    json_decref(o);
    mt_d_buf_t b = {0};
    if (rc == 0)
        mt__d_buf_printf(&b, "%s\n", txt);
    else
        mt__d_buf_fail(&b, MT_ENOMEM);
    free(txt);
    mt__d_web_send(c, &b, head);
}

/* ---- two runs compared ---- */

/* /diff: analysis/diff.h's document for `memtrace view --compare BEFORE AFTER` (made by the command
 * as `memtrace diff --json` makes it); 404 when the view was given one input. */
/* A document set by `memtrace view`, or 404 with why. */
static void serve_doc(mt_d_conn_t *c, const char *doc, const char *none, bool head)
{
    if (!doc) {
        mt__d_web_bad(c, 404, none);
        return;
    }
    mt__d_http_respond(c, 200, "OK", "application/json", doc, strlen(doc), head);
}

void mt__d_web_serve_diff(mt_d_conn_t *c, const char *query, bool head)
{
    (void)query;
    serve_doc(c, c->d->diff, "no comparison: memtrace view --compare BEFORE AFTER makes one\n",
              head);
}

void mt__d_web_serve_jobs(mt_d_conn_t *c, const char *query, bool head)
{
    (void)query;
    serve_doc(c, c->d->jobs, "no job: memtrace view of the logs of a job's ranks makes one\n",
              head);
}
