/* memtraced: a process as the daemon knows it: its counters, its tags' names, and the
 * event model (analysis/model.h) that gives every figure of /state, /metrics and `memtrace
 * top`, the same code `memtrace report` and `memtrace plot` read. Device memory and pinned
 * host memory (pool host) are the model's two classes, kept apart. */
#include <stdlib.h>
#include <string.h>

#include "analysis/callsite.h"
#include "analysis/model_internal.h"
#include "analysis/scopes.h"
#include "analysis/torch_snapshot.h"
#include "analysis/torch_snapshot_timeline.h"
#include "daemon/internal.h"
#include "util/text.h"

int mt__d_proc_create(mt_d_proc_t **out, int pid, const char *name)
{
    mt_d_proc_t *p = calloc(1, sizeof *p);
    if (!p)
        return MT_ENOMEM;
    if (mt__model_create(&p->model, NULL) != 0 || mt__sym_create(&p->sym) != 0) {
        mt__model_destroy(&p->model);
        free(p);
        return MT_ENOMEM;
    }
    p->pid = pid;
    p->job = mt_prof_job_unknown();
    snprintf(p->name, sizeof p->name, "%s", name ? name : "");
    *out = p;
    return 0;
}

void mt__d_proc_destroy(mt_d_proc_t **pp)
{
    if (!pp || !*pp)
        return;
    mt_d_proc_t *p = *pp;
    mt__model_destroy(&p->model);
    mt__d_stacks_free(p);
    mt__sym_destroy(&p->sym);
    mt__ts_timeline_destroy(&p->sites);
    mt__ts_destroy(&p->snap);
    if (p->scopes)
        mt__scopes_fini(p->scopes);
    free(p->scopes);
    free(p);
    *pp = NULL;
}

const char *mt__d_tag_name(const mt_d_proc_t *p, int tag, char *buf, size_t n)
{
    if (tag >= 0 && tag < MT_TAG_USER_FIRST)
        return mt_tag_builtin_name(tag);
    if (p && tag >= 0 && tag < MT_TAG_MAX && p->names[tag][0])
        return p->names[tag];
    snprintf(buf, n, "tag%d", tag);
    return buf;
}

const char *mt__d_proc_label(void *ud, int tag)
{
    const mt_d_proc_t *p = ud;
    return tag >= 0 && tag < MT_TAG_MAX && p->names[tag][0] ? p->names[tag] : NULL;
}

/* Could s be taken for another tag's default name? */
static bool default_like(const char *s)
{
    for (int t = 0; t < MT_TAG_USER_FIRST; t++)
        if (strcmp(s, mt_tag_builtin_name(t)) == 0)
            return true;
    if (strncmp(s, "tag", 3) != 0 || s[3] == '\0')
        return false;
    for (s += 3; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* Rebuilds names from labels (see mt_d_proc_t): a label names its tag only when no other
 * tag of the process has it, so that series and JSON keys stay unique. */
static void names_update(mt_d_proc_t *p)
{
    for (int t = 0; t < MT_TAG_MAX; t++) {
        const char *l = p->labels[t];
        /* Only well-formed UTF-8 without control characters names a tag: names go into
         * JSON strings and Prometheus label values as they are. */
        bool ok = l[0] != '\0' && !default_like(l) && mt__text_is_clean(l);
        for (int u = 0; ok && u < MT_TAG_MAX; u++)
            ok = u == t || strcmp(l, p->labels[u]) != 0;
        snprintf(p->names[t], sizeof p->names[t], "%s", ok ? l : "");
    }
}

static int proc_apply(mt_d_proc_t *p, const mt_event_rec_t *ev);

/* After ev was applied: the scopes see it with the device's allocated bytes after it, as the
 * report's replay feeds them. MT_ENOMEM when a scope's row cannot be kept. */
static int scopes_apply(mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    if (!p->any_time || ev->time_ns < p->first_ns)
        p->first_ns = ev->time_ns;
    p->any_time = true;
    if (!p->scopes && ev->kind == MT_EV_MARK_NAMED) {
        if (!(p->scopes = malloc(sizeof *p->scopes)))
            return MT_ENOMEM;
        mt__scopes_init(p->scopes);
    }
    if (!p->scopes)
        return 0;
    uint64_t allocated, reserved, peak;
    mt__model_levels(p->model, MT_MODEL_DEVICE, &allocated, &reserved, &peak);
    return mt__scopes_event(p->scopes, ev, allocated);
}

int mt__d_proc_apply(mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    int rc = proc_apply(p, ev);
    int src = scopes_apply(p, ev);
    return rc ? rc : src;
}

static int proc_apply(mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    if (ev->kind < MT_EV_KIND_COUNT)
        p->kind_count[ev->kind]++;
    if (ev->kind == MT_EV_GAP) /* no figures, but what is known so far becomes uncertain */
        return mt__model_apply(p->model, ev);
    if (ev->kind == MT_EV_TAG_LABEL) {
        /* A label, not an allocator operation: it changes no figure (the model sees it for
         * its seq, so that no gap is taken for one). */
        if (ev->tag >= MT_TAG_USER_FIRST && ev->tag < MT_TAG_MAX) {
            mt_event_label_unpack(ev, p->labels[ev->tag]);
            names_update(p);
        }
        return mt__model_apply(p->model, ev);
    }
    p->last_kind = ev->kind;
    if (ev->kind == MT_EV_OOM) {
        p->ooms++;
        p->last_oom_requested = ev->requested;
        p->last_oom_free = ev->size;
    }
    return mt__model_apply(p->model, ev);
}

double mt__d_proc_utilization(const mt_d_proc_t *p)
{
    mt_model_figures_t f;
    mt__model_figures_totals(p->model, MT_MODEL_DEVICE, &f);
    return f.utilization;
}

/* ---- JSON ---- */

#define MAX_SEGMENTS_JSON 4096 /* a /state answer stays bounded */

/* A JSON string of s, which comes from another process (its name, its backend) and need not
 * be UTF-8: bytes of a malformed sequence become '?'. NULL only when out of memory. */
static json_t *js(const char *s)
{
    json_t *j = json_string(s);
    if (j || !s)
        return j;
    char buf[MT_RING_COMM_MAX + 64];
    size_t n = 0;
    for (; s[n] && n + 1 < sizeof buf; n++)
        buf[n] = (unsigned char)s[n] < 0x80 ? s[n] : '?';
    buf[n] = '\0';
    return json_string(buf);
}

/* JSON integers are signed: a figure above INT64_MAX is written as INT64_MAX. */
static json_t *ju(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v);
}

static int tags_json(json_t *o, const mt_d_proc_t *p, int cls)
{
    json_t *tags = json_array();
    if (!tags)
        return MT_ENOMEM;
    int bad = 0; /* a value that could not be made or added: out of memory */
    for (int t = 0; t < MT_TAG_MAX; t++) {
        mt_model_tag_t tg;
        mt__model_tag(p->model, cls, t, &tg);
        if (!tg.peak && !tg.blocks && !tg.uncertain_blocks)
            continue;
        char nb[16];
        json_t *j = json_pack("{s:i,s:s,s:o,s:o,s:o}", "tag", t, "name",
                              mt__d_tag_name(p, t, nb, sizeof nb), "allocated_bytes", ju(tg.bytes),
                              "peak_bytes", ju(tg.peak), "blocks", ju(tg.blocks));
        if (j && tg.uncertain_blocks) {
            bad |= json_object_set_new(j, "uncertain_bytes", ju(tg.uncertain_bytes));
            bad |= json_object_set_new(j, "uncertain_blocks", ju(tg.uncertain_blocks));
        }
        bad |= json_array_append_new(tags, j);
    }
    bad |= json_object_set_new(o, "tags", tags);
    return bad ? MT_ENOMEM : 0;
}

static int segments_json(json_t *o, const mt_d_proc_t *p, int cls)
{
    mt_model_map_t map;
    json_t *segs = json_array();
    if (!segs || mt__model_map(p->model, cls, &map) != 0) {
        json_decref(segs);
        return MT_ENOMEM;
    }
    int bad = 0;
    size_t n = map.nsegs < MAX_SEGMENTS_JSON ? map.nsegs : MAX_SEGMENTS_JSON;
    for (size_t i = 0; i < n; i++) {
        const mt_model_seg_t *r = &map.segs[i];
        json_t *j =
            json_pack("{s:o,s:o,s:s,s:s,s:I,s:o}", "addr", ju(r->addr), "size", ju(r->size), "kind",
                      r->mapped ? "mapped" : "segment", "pool", mt_pool_name(r->pool), "stream",
                      (json_int_t)r->stream, "used_bytes", ju(r->used));
        if (j && r->uncertain)
            bad |= json_object_set_new(j, "uncertain", json_true());
        bad |= json_array_append_new(segs, j);
    }
    bad |= json_object_set_new(o, "segments", segs);
    if (map.nsegs > n)
        bad |= json_object_set_new(o, "segments_truncated", json_true());
    mt__model_map_free(&map);
    return bad ? MT_ENOMEM : 0;
}

/* The figures of one class of memory into o, as the model gives them: totals, peaks, free
 * extents, tags, what a gap left uncertain and, optionally, the segment map. */
static int class_json(json_t *o, const mt_d_proc_t *p, int cls, bool with_segments)
{
    mt_model_figures_t f;
    if (mt__model_figures(p->model, cls, &f) != 0)
        return MT_ENOMEM;
    int bad = 0;
    bad |= json_object_set_new(o, "allocated_bytes", ju(f.allocated));
    bad |= json_object_set_new(o, "reserved_bytes", ju(f.reserved));
    bad |= json_object_set_new(o, "peak_allocated_bytes", ju(f.peak_allocated));
    bad |= json_object_set_new(o, "peak_reserved_bytes", ju(f.peak_reserved));
    bad |= json_object_set_new(o, "utilization", json_real(f.utilization));
    bad |= json_object_set_new(o, "fragmentation", json_real(f.fragmentation));
    bad |= json_object_set_new(o, "total_free_bytes", ju(f.total_free));
    bad |= json_object_set_new(o, "largest_free_block_bytes", ju(f.largest_free));
    bad |= json_object_set_new(o, "blocks", ju(f.blocks));
    if (f.uncertain) {
        bad |= json_object_set_new(o, "uncertain_bytes", ju(f.uncertain_bytes));
        bad |= json_object_set_new(o, "untracked_bytes", ju(f.untracked_bytes));
    }
    if (bad || tags_json(o, p, cls) != 0)
        return MT_ENOMEM;
    return with_segments ? segments_json(o, p, cls) : 0;
}

/* The process's top call sites by live device bytes now ("callsites"; empty without
 * stacks). Frames are named here, in the daemon, never in the producer. */
static int callsites_json(json_t *o, const mt_d_proc_t *p)
{
    mt_cs_row_t *rows = NULL;
    size_t n = 0;
    if (mt__cs_rows_from_model(p->model, MT_CS_LIVE, &rows, &n) != 0)
        return -1;
    if (mt__cs_sym_sync(p->sym, (uint32_t)p->pid, p->model) != 0 ||
        mt__cs_rows_merge(p->sym, (uint32_t)p->pid, rows, &n) != 0) {
        free(rows);
        return -1;
    }
    json_t *a = mt__cs_rows_json(p->sym, (uint32_t)p->pid, rows, n, MT_D_CALLSITES_TOP, false);
    free(rows);
    if (a != NULL && p->snap != NULL && mt__ts_name_rows(p->snap, a) != 0) {
        json_decref(a);
        return -1;
    }
    return json_object_set_new(o, "callsites", a);
}

/* Device memory per device (the model's): the top-level figures are their sums. */
static json_t *devices_json(const mt_d_proc_t *p)
{
    mt_model_dev_t d[256];
    size_t n = mt__model_devices(p->model, d, 256);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n && i < 256; i++)
        if (json_array_append_new(
                a, json_pack("{s:i,s:o,s:o,s:o,s:o}", "device", (int)d[i].device, "allocated_bytes",
                             ju(d[i].allocated), "reserved_bytes", ju(d[i].reserved),
                             "peak_allocated_bytes", ju(d[i].peak_allocated), "peak_reserved_bytes",
                             ju(d[i].peak_reserved))) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *mt__d_proc_json(const mt_d_proc_t *p, bool with_segments)
{
    json_t *o = json_object();
    json_t *host = json_object();
    json_t *kinds = json_object();
    int bad = 0;
    if (!o || !host || !kinds)
        goto fail;
    bad |= json_object_set_new(o, "pid", json_integer(p->pid));
    bad |= json_object_set_new(o, "name", js(p->name));
    if (p->backend[0])
        bad |= json_object_set_new(o, "backend", js(p->backend));
    bad |= mt_prof_job_to_json(o, &p->job) != 0;
    bad |= json_object_set_new(o, "state", json_string(p->exited ? "exited" : "running"));
    if (p->exited) {
        bad |= json_object_set_new(o, "exit_reason", json_string(p->exit_reason));
        bad |= json_object_set_new(o, "exited_realtime_ns",
                                   json_integer((json_int_t)p->exited_realtime));
    }
    bad |= json_object_set_new(o, "registered_realtime_ns",
                               json_integer((json_int_t)p->registered_realtime));
    if (p->snapshot) { /* a PyTorch snapshot: "trace", or "state" (no history) */
        bad |= json_object_set_new(o, "snapshot", json_string(p->snapshot));
        bad |= json_object_set_new(o, "skipped_entries", json_integer((json_int_t)p->snap_skipped));
    }
    if (p->event_ns) /* no clock: its times count events, event_ns each */
        bad |= json_object_set_new(o, "event_ns", json_integer((json_int_t)p->event_ns));
    bad |= json_object_set_new(o, "events", json_integer((json_int_t)p->events));
    bad |= json_object_set_new(o, "dropped", json_integer((json_int_t)p->dropped));
    bad |= json_object_set_new(o, "ooms", json_integer((json_int_t)p->ooms));
    if (p->ooms) {
        bad |= json_object_set_new(o, "last_oom",
                                   json_pack("{s:I,s:I}", "requested_bytes",
                                             (json_int_t)p->last_oom_requested, "free_bytes",
                                             (json_int_t)p->last_oom_free));
    }
    /* Top level: device memory only. Pinned host memory has the same figures, apart. */
    if (class_json(o, p, MT_MODEL_DEVICE, with_segments) != 0 ||
        class_json(host, p, MT_MODEL_HOST, with_segments) != 0)
        goto fail;
    bad |= json_object_set_new(o, "host", host);
    host = NULL; /* o's, even when the call failed */
    bad |= callsites_json(o, p);
    bad |= json_object_set_new(o, "devices", devices_json(p));
    bad |= json_object_set_new(o, "outside", mt__d_outside_json(p));
    for (int k = 1; k < MT_EV_KIND_COUNT; k++)
        if (p->kind_count[k])
            bad |= json_object_set_new(kinds, mt_event_kind_name(k),
                                       json_integer((json_int_t)p->kind_count[k]));
    bad |= json_object_set_new(o, "kinds", kinds);
    kinds = NULL;
    /* Every label as announced (names in "tags" may fall back to "tag<n>" when two
     * collide or a label holds control characters): control characters are escaped by
     * JSON, bytes that are not UTF-8 become U+FFFD. */
    json_t *labels = NULL;
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++) {
        char utf8[3 * MT_EVENT_LABEL_MAX + 1];
        if (!p->labels[t][0])
            continue;
        char id[8];
        snprintf(id, sizeof id, "%d", t);
        if (!labels && !(labels = json_object())) {
            bad = -1;
            break;
        }
        bad |= json_object_set_new(labels, id,
                                   json_string(mt__text_utf8(p->labels[t], utf8, sizeof utf8)));
    }
    if (labels)
        bad |= json_object_set_new(o, "tag_labels", labels);
    if (bad)
        goto fail;
    return o;
fail:
    json_decref(o);
    json_decref(host);
    json_decref(kinds);
    return NULL;
}
