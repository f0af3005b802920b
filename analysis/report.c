/* Offline analysis of a telemetry log: replays each process's events through a model
 * of its allocator state (live blocks, segments, per-tag bytes) and produces peaks, a
 * timeline, never-freed allocations and the growth verdict (see report.h). Device memory
 * and pinned host memory (pool host) are replayed through two separate models, so that
 * host pages never appear in the device figures. */
#include "analysis/report.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/prof.h"

/* ---- small containers ---- */

typedef struct evvec_s {
    mt_event_rec_t *v;
    size_t n, cap;
} evvec_t;

static int evvec_push(evvec_t *e, const mt_event_rec_t *ev)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 1024;
        mt_event_rec_t *v = realloc(e->v, cap * sizeof(*v));
        if (!v)
            return MT_ENOMEM;
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = *ev;
    return 0;
}

/* Open-addressing map from a device address to a block or segment.
 * Invariants: cap is a power of two; used (live + tombstones) <= cap / 2. */
enum { SLOT_EMPTY = 0, SLOT_FULL = 1, SLOT_DEAD = 2 };

typedef struct entry_s {
    uint64_t addr;
    uint64_t size;
    uint8_t state; /* SLOT_* */
    uint8_t tag;
    uint8_t pending; /* blocks: free requested, not yet completed */
} entry_t;

typedef struct amap_s {
    entry_t *e;
    size_t cap, used, live;
} amap_t;

static size_t hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    return (size_t)x;
}

static int amap_grow(amap_t *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    while (m->live * 2 >= cap / 2)
        cap *= 2;
    entry_t *e = calloc(cap, sizeof(*e));
    if (!e)
        return MT_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->e[i].state != SLOT_FULL)
            continue;
        size_t j = hash64(m->e[i].addr) & (cap - 1);
        while (e[j].state == SLOT_FULL)
            j = (j + 1) & (cap - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->cap = cap;
    m->used = m->live;
    return 0;
}

static entry_t *amap_find(amap_t *m, uint64_t addr)
{
    if (!m->cap)
        return NULL;
    for (size_t j = hash64(addr) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        if (m->e[j].state == SLOT_EMPTY)
            return NULL;
        if (m->e[j].state == SLOT_FULL && m->e[j].addr == addr)
            return &m->e[j];
    }
}

/* Inserts or replaces the entry for addr. */
static entry_t *amap_put(amap_t *m, uint64_t addr)
{
    entry_t *old = amap_find(m, addr);
    if (old)
        return old;
    if ((m->used + 1) * 2 > m->cap && amap_grow(m) != 0)
        return NULL;
    size_t j = hash64(addr) & (m->cap - 1);
    while (m->e[j].state == SLOT_FULL)
        j = (j + 1) & (m->cap - 1);
    if (m->e[j].state == SLOT_EMPTY)
        m->used++;
    memset(&m->e[j], 0, sizeof(m->e[j]));
    m->e[j].state = SLOT_FULL;
    m->e[j].addr = addr;
    m->live++;
    return &m->e[j];
}

static void amap_del(amap_t *m, entry_t *e)
{
    e->state = SLOT_DEAD;
    m->live--;
}

static void amap_free(amap_t *m)
{
    free(m->e);
    memset(m, 0, sizeof(*m));
}

/* ---- the report ---- */

/* Invariant: while !unordered, evs is in strictly increasing seq order and next_seq is the
 * last seq + 1 (0 when empty). */
typedef struct proc_s {
    int pid;
    char name[64];
    int exit_state; /* 0 unknown, 1 clean, 2 unclean */
    uint64_t lost;  /* sum of gap records */
    evvec_t evs;
    uint64_t next_seq;
    bool unordered;              /* an event came with a seq below next_seq and was kept */
    uint64_t duplicates;         /* events dropped as already read from an earlier log */
    char *tag_names[MT_TAG_MAX]; /* as seen in the log; NULL = not seen */
} proc_t;

struct mt__report_s {
    mt__report_cfg_t cfg;
    proc_t *procs;
    size_t nprocs, cap;
    uint64_t lines, events, malformed;
    uint64_t lost_unattributed; /* gaps of consumer queues, no pid */
    uint64_t duplicates;        /* sum over the processes */
};

mt__report_cfg_t mt__report_cfg_default(void)
{
    return (mt__report_cfg_t){
        .timeline_steps = 20, .min_growth_bytes = 1u << 20, .min_r2 = 0.8, .top = 10};
}

int mt__report_create(mt__report_t **out, const mt__report_cfg_t *cfg)
{
    *out = NULL;
    mt__report_t *r = calloc(1, sizeof(*r));
    if (!r)
        return MT_ENOMEM;
    r->cfg = cfg ? *cfg : mt__report_cfg_default();
    if (r->cfg.timeline_steps == 0)
        r->cfg.timeline_steps = 1;
    *out = r;
    return 0;
}

void mt__report_destroy(mt__report_t **pr)
{
    if (!pr || !*pr)
        return;
    mt__report_t *r = *pr;
    for (size_t i = 0; i < r->nprocs; i++) {
        free(r->procs[i].evs.v);
        for (int t = 0; t < MT_TAG_MAX; t++)
            free(r->procs[i].tag_names[t]);
    }
    free(r->procs);
    free(r);
    *pr = NULL;
}

static proc_t *proc_get(mt__report_t *r, int pid)
{
    for (size_t i = 0; i < r->nprocs; i++)
        if (r->procs[i].pid == pid)
            return &r->procs[i];
    if (r->nprocs == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 8;
        proc_t *p = realloc(r->procs, cap * sizeof(*p));
        if (!p)
            return NULL;
        r->procs = p;
        r->cap = cap;
    }
    proc_t *p = &r->procs[r->nprocs++];
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    return p;
}

/* Is ev already among p's events? Logs read one after the other may hold the same event
 * twice: the daemon's log and the program's own, when the program took its ring over after
 * the daemon went away (a killed daemon may have read events it never acknowledged). Only
 * an identical record counts: a pid reused by a later process has seqs of its own. */
static bool already_read(const proc_t *p, const mt_event_rec_t *ev)
{
    if (p->unordered || ev->seq >= p->next_seq)
        return false;
    size_t lo = 0, hi = p->evs.n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->evs.v[mid].seq < ev->seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->evs.n && memcmp(&p->evs.v[lo], ev, sizeof(*ev)) == 0;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        rc = MT_EPROTO;                                                                            \
        goto out;                                                                                  \
    } while (0)

int mt__report_add_line(mt__report_t *r, const char *line, size_t len, char *err, size_t errlen)
{
    r->lines++;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    if (len == 0) {
        r->malformed++;
        snprintf(err, errlen, "empty line");
        return MT_EPROTO;
    }
    json_error_t jerr;
    json_t *j = json_loadb(line, len, 0, &jerr);
    int rc = 0;
    if (!j)
        FAIL("not JSON: %s (column %d)", jerr.text, jerr.column);
    if (!json_is_object(j))
        FAIL("not a JSON object");
    json_t *v = json_object_get(j, "v");
    if (!json_is_integer(v) || json_integer_value(v) != 1)
        FAIL("unsupported or missing schema version \"v\" (want 1)");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        FAIL("missing \"type\"");
    json_t *jp = json_object_get(j, "pid");
    if (strcmp(type, "event") == 0 || strcmp(type, "gap") == 0) {
        mt_event_rec_t ev;
        int pid;
        char why[128];
        if (mt_prof_event_from_json(j, &ev, &pid, why, sizeof(why)) != 0)
            FAIL("%s: %s", type, why);
        if (pid < 0) { /* a consumer queue's gap: no process named */
            r->lost_unattributed += ev.size;
            goto out;
        }
        proc_t *p = proc_get(r, pid);
        if (!p)
            FAIL("out of memory");
        if (ev.kind == MT_EV_GAP) {
            p->lost += ev.size;
        } else if (ev.kind == MT_EV_TAG_LABEL) {
            /* The allocator's announcement names the tag (it carries no figures, so it is
             * not replayed); a name taken from an earlier line gives way to it. */
            char label[MT_EVENT_LABEL_MAX + 1];
            mt_event_label_unpack(&ev, label);
            char *dup = strdup(label);
            if (!dup)
                FAIL("out of memory");
            free(p->tag_names[ev.tag]);
            p->tag_names[ev.tag] = dup;
        } else if (already_read(p, &ev)) {
            p->duplicates++;
            r->duplicates++;
        } else {
            if (evvec_push(&p->evs, &ev) != 0)
                FAIL("out of memory");
            if (ev.seq >= p->next_seq)
                p->next_seq = ev.seq + 1;
            else
                p->unordered = true;
            r->events++;
            const char *tn = json_string_value(json_object_get(j, "tag"));
            if (tn && !p->tag_names[ev.tag])
                p->tag_names[ev.tag] = strdup(tn);
        }
    } else if (strcmp(type, "process_event") == 0) {
        /* The daemon's log: {"event":"register"|"exit","pid","name","reason"}. */
        const char *what = json_string_value(json_object_get(j, "event"));
        if (!json_is_integer(jp) || !what)
            FAIL("process_event: missing \"pid\" or \"event\"");
        proc_t *p = proc_get(r, (int)json_integer_value(jp));
        if (!p)
            FAIL("out of memory");
        const char *name = json_string_value(json_object_get(j, "name"));
        if (name && !p->name[0])
            snprintf(p->name, sizeof(p->name), "%s", name);
        if (strcmp(what, "exit") == 0) {
            const char *why = json_string_value(json_object_get(j, "reason"));
            p->exit_state = why && strcmp(why, "clean") == 0 ? 1 : 2;
        }
    } else if (strcmp(type, "hello") == 0 || strcmp(type, "exit") == 0) {
        if (!json_is_integer(jp))
            FAIL("%s: missing \"pid\"", type);
        proc_t *p = proc_get(r, (int)json_integer_value(jp));
        if (!p)
            FAIL("out of memory");
        if (type[0] == 'h') {
            const char *name = json_string_value(json_object_get(j, "name"));
            snprintf(p->name, sizeof(p->name), "%s", name ? name : "");
        } else {
            p->exit_state = json_is_true(json_object_get(j, "clean")) ? 1 : 2;
        }
    }
    /* Other record types (process state, snapshots, daemon records) are not used. */
out:
    if (rc)
        r->malformed++;
    json_decref(j);
    return rc;
}

/* ---- replay of one process ---- */

typedef struct sim_s {
    amap_t blocks, segs;
    uint64_t dev_alloc[MT_EVENT_SOURCES], dev_res[MT_EVENT_SOURCES]; /* latest, by source */
    uint64_t allocated, reserved;                                    /* sums over sources */
    int64_t tag_live[MT_TAG_MAX];
    int64_t tag_peak[MT_TAG_MAX];
    uint64_t peak_alloc, peak_res, interval_peak;
    uint64_t unmatched_frees;
} sim_t;

typedef struct range_s {
    uint64_t addr, size;
} range_t;

static int cmp_range(const void *a, const void *b)
{
    const range_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static size_t collect(const amap_t *m, range_t **out)
{
    range_t *v = malloc((m->live ? m->live : 1) * sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; v && i < m->cap; i++)
        if (m->e[i].state == SLOT_FULL)
            v[n++] = (range_t){m->e[i].addr, m->e[i].size};
    if (v)
        qsort(v, n, sizeof(*v), cmp_range);
    *out = v;
    return v ? n : 0;
}

/* 1 - largest free extent / total free, over the segments, from occupied blocks. */
static double fragmentation(const sim_t *s)
{
    range_t *segs, *blks;
    size_t ns = collect(&s->segs, &segs), nb = collect(&s->blocks, &blks);
    uint64_t total = 0, largest = 0;
    size_t b = 0;
    for (size_t i = 0; segs && blks && i < ns; i++) {
        uint64_t cur = segs[i].addr, end = segs[i].addr + segs[i].size;
        while (b < nb && blks[b].addr < segs[i].addr)
            b++;
        for (; b < nb && blks[b].addr < end; b++) {
            if (blks[b].addr > cur) {
                uint64_t gap = blks[b].addr - cur;
                total += gap;
                largest = gap > largest ? gap : largest;
            }
            if (blks[b].addr + blks[b].size > cur)
                cur = blks[b].addr + blks[b].size;
        }
        if (end > cur) {
            total += end - cur;
            largest = end - cur > largest ? end - cur : largest;
        }
    }
    free(segs);
    free(blks);
    return total ? 1.0 - (double)largest / (double)total : 0.0;
}

static void sim_event(sim_t *s, const mt_event_rec_t *ev)
{
    entry_t *e;
    switch (ev->kind) {
    case MT_EV_ALLOC:
        /* A live block at the same address means its free was lost (a gap). */
        if ((e = amap_find(&s->blocks, ev->addr)) != NULL && !e->pending)
            s->tag_live[e->tag] -= (int64_t)e->size;
        if ((e = amap_put(&s->blocks, ev->addr)) != NULL) {
            e->size = ev->size;
            e->tag = ev->tag;
            e->pending = 0;
            s->tag_live[ev->tag] += (int64_t)ev->size;
            if (s->tag_live[ev->tag] > s->tag_peak[ev->tag])
                s->tag_peak[ev->tag] = s->tag_live[ev->tag];
        }
        break;
    case MT_EV_FREE_REQUESTED:
    case MT_EV_FREE_COMPLETED:
        e = amap_find(&s->blocks, ev->addr);
        if (!e) {
            if (ev->kind == MT_EV_FREE_REQUESTED)
                s->unmatched_frees++;
            break;
        }
        if (!e->pending)
            s->tag_live[e->tag] -= (int64_t)e->size;
        e->pending = 1;
        if (ev->kind == MT_EV_FREE_COMPLETED)
            amap_del(&s->blocks, e);
        break;
    case MT_EV_SEGMENT_ALLOC:
    case MT_EV_SEGMENT_MAP:
        if ((e = amap_put(&s->segs, ev->addr)) != NULL)
            e->size = ev->size;
        break;
    case MT_EV_SEGMENT_FREE:
    case MT_EV_SEGMENT_UNMAP:
        if ((e = amap_find(&s->segs, ev->addr)) != NULL)
            amap_del(&s->segs, e);
        break;
    default:
        break;
    }
    /* Totals: each allocator (one per device; one pinned host cache per device, replayed in
     * a model of its own) reports its own; the model's figure is their sum. */
    unsigned src = mt_event_source(ev);
    s->allocated += ev->allocated - s->dev_alloc[src];
    s->reserved += ev->reserved - s->dev_res[src];
    s->dev_alloc[src] = ev->allocated;
    s->dev_res[src] = ev->reserved;
    if (s->allocated > s->peak_alloc)
        s->peak_alloc = s->allocated;
    if (s->reserved > s->peak_res)
        s->peak_res = s->reserved;
    if (s->allocated > s->interval_peak)
        s->interval_peak = s->allocated;
}

static void timeline_sample(sim_t *s, json_t *tl, double t_s)
{
    double util = s->reserved ? (double)s->allocated / (double)s->reserved : 1.0;
    json_array_append_new(tl,
                          json_pack("{s:f, s:I, s:I, s:I, s:f, s:f}", "t_s", t_s, "allocated",
                                    (json_int_t)s->allocated, "reserved", (json_int_t)s->reserved,
                                    "peak_allocated", (json_int_t)s->interval_peak, "utilization",
                                    util > 1.0 ? 1.0 : util, "fragmentation", fragmentation(s)));
    s->interval_peak = s->allocated;
}

/* Least squares y = a + b x over x = 0..n-1. */
typedef struct fit_s {
    double slope, r2;
    double rise;    /* y[n-1] - y[0] */
    double nondecr; /* fraction of steps with y[i+1] >= y[i] */
} fit_t;

static fit_t fit_line(const double *y, size_t n)
{
    fit_t f = {0, 0, 0, 0};
    if (n < 2)
        return f;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        sx += (double)i;
        sy += y[i];
        sxx += (double)i * (double)i;
        sxy += (double)i * y[i];
    }
    double dn = (double)n, den = dn * sxx - sx * sx;
    f.slope = (dn * sxy - sx * sy) / den;
    double a = (sy - f.slope * sx) / dn, mean = sy / dn, ssr = 0, sst = 0;
    size_t up = 0;
    for (size_t i = 0; i < n; i++) {
        double d = y[i] - (a + f.slope * (double)i);
        ssr += d * d;
        sst += (y[i] - mean) * (y[i] - mean);
        if (i + 1 < n && y[i + 1] >= y[i])
            up++;
    }
    f.r2 = sst > 0 ? 1.0 - ssr / sst : 0.0;
    f.rise = y[n - 1] - y[0];
    f.nondecr = (double)up / (double)(n - 1);
    return f;
}

static bool grows(const mt__report_cfg_t *cfg, const fit_t *f)
{
    return f->slope > 0 && f->r2 >= cfg->min_r2 && f->rise >= (double)cfg->min_growth_bytes &&
           f->nondecr >= 0.75;
}

static const char *tag_str(const proc_t *p, int tag, char *buf, size_t len)
{
    if (p->tag_names[tag])
        return p->tag_names[tag];
    if (tag < MT_TAG_USER_FIRST)
        return mt_tag_builtin_name(tag);
    snprintf(buf, len, "tag%d", tag);
    return buf;
}

typedef struct group_s {
    uint64_t size, count;
    int tag;
} group_t;

static int cmp_group(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    uint64_t bx = x->size * x->count, by = y->size * y->count;
    if (bx != by)
        return bx > by ? -1 : 1;
    return x->tag - y->tag;
}

static json_t *never_freed(const mt__report_cfg_t *cfg, const proc_t *p, const sim_t *s)
{
    group_t *g = malloc((s->blocks.live ? s->blocks.live : 1) * sizeof(*g));
    size_t ng = 0;
    uint64_t count = 0, bytes = 0;
    for (size_t i = 0; g && i < s->blocks.cap; i++) {
        const entry_t *e = &s->blocks.e[i];
        if (e->state != SLOT_FULL || e->pending)
            continue;
        count++;
        bytes += e->size;
        size_t k = 0;
        while (k < ng && !(g[k].size == e->size && g[k].tag == e->tag))
            k++;
        if (k == ng)
            g[ng++] = (group_t){e->size, 0, e->tag};
        g[k].count++;
    }
    if (g)
        qsort(g, ng, sizeof(*g), cmp_group);
    json_t *groups = json_array();
    for (size_t k = 0; k < ng && k < cfg->top; k++) {
        char tb[16];
        json_array_append_new(
            groups, json_pack("{s:s, s:I, s:I, s:I}", "tag", tag_str(p, g[k].tag, tb, sizeof(tb)),
                              "size", (json_int_t)g[k].size, "count", (json_int_t)g[k].count,
                              "bytes", (json_int_t)(g[k].size * g[k].count)));
    }
    free(g);
    return json_pack("{s:I, s:I, s:I, s:o}", "count", (json_int_t)count, "bytes", (json_int_t)bytes,
                     "groups_total", (json_int_t)ng, "groups", groups);
}

static json_t *growth(const mt__report_cfg_t *cfg, const proc_t *p, const double *alloc,
                      double *const *tags, const uint64_t *iters, size_t n)
{
    /* The first iteration is warm-up (caches fill, workspaces appear) when there are
     * enough to spare one. */
    size_t skip = n >= 5 ? 1 : 0;
    size_t m = n - skip;
    fit_t f = fit_line(alloc + skip, m);
    bool detected = m >= 3 && grows(cfg, &f);
    json_t *jt = json_array();
    for (int t = 0; m >= 3 && t < MT_TAG_MAX; t++) {
        fit_t ft = fit_line(tags[t] + skip, m);
        if (!grows(cfg, &ft))
            continue;
        char tb[16];
        json_array_append_new(jt,
                              json_pack("{s:s, s:f, s:f, s:f}", "tag",
                                        tag_str(p, t, tb, sizeof(tb)), "slope_bytes_per_iteration",
                                        ft.slope, "r2", ft.r2, "rise_bytes", ft.rise));
    }
    return json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:b, s:o}", "iterations",
                     (json_int_t)n, "fitted", (json_int_t)m, "first_iteration",
                     (json_int_t)(n ? iters[skip < n ? skip : 0] : 0), "last_iteration",
                     (json_int_t)(n ? iters[n - 1] : 0), "slope_bytes_per_iteration", f.slope, "r2",
                     f.r2, "rise_bytes", f.rise, "nondecreasing_steps", f.nondecr, "detected",
                     detected, "tags", jt);
}

static json_t *peaks_by_tag(const proc_t *p, const sim_t *s)
{
    json_t *peak_tags = json_object();
    for (int t = 0; peak_tags && t < MT_TAG_MAX; t++) {
        char tb[16];
        if (s->tag_peak[t] > 0)
            json_object_set_new(peak_tags, tag_str(p, t, tb, sizeof(tb)),
                                json_integer(s->tag_peak[t]));
    }
    return peak_tags;
}

/* The pinned host memory of a process, summarised apart from its device memory. */
static json_t *host_summary(const mt__report_cfg_t *cfg, const proc_t *p, const sim_t *h,
                            uint64_t events)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:I}", "events", (json_int_t)events,
                     "peak_allocated", (json_int_t)h->peak_alloc, "peak_reserved",
                     (json_int_t)h->peak_res, "final_allocated", (json_int_t)h->allocated,
                     "final_reserved", (json_int_t)h->reserved, "peak_by_tag", peaks_by_tag(p, h),
                     "never_freed", never_freed(cfg, p, h), "unmatched_frees",
                     (json_int_t)h->unmatched_frees);
}

static json_t *analyse(const mt__report_cfg_t *cfg, const proc_t *p)
{
    sim_t *s = calloc(1, sizeof(*s)); /* device memory */
    sim_t *h = calloc(1, sizeof(*h)); /* pinned host memory */
    uint64_t host_events = 0;
    size_t cap_it = 16, n_it = 0;
    double *alloc_it = malloc(cap_it * sizeof(double));
    uint64_t *iters = malloc(cap_it * sizeof(uint64_t));
    double *tag_it[MT_TAG_MAX];
    bool ok = s && h && alloc_it && iters;
    for (int t = 0; t < MT_TAG_MAX; t++) {
        tag_it[t] = malloc(cap_it * sizeof(double));
        ok = ok && tag_it[t];
    }
    json_t *tl = json_array();
    json_t *res = NULL;
    if (!ok || !tl)
        goto out;

    const mt_event_rec_t *ev = p->evs.v;
    size_t n = p->evs.n;
    uint64_t t0 = n ? ev[0].time_ns : 0, t1 = n ? ev[n - 1].time_ns : 0;
    for (size_t i = 0; i < n; i++) {
        t0 = ev[i].time_ns < t0 ? ev[i].time_ns : t0;
        t1 = ev[i].time_ns > t1 ? ev[i].time_ns : t1;
    }
    unsigned steps = cfg->timeline_steps;
    double step = (double)(t1 - t0) / steps;
    unsigned k = 1;
    for (size_t i = 0; i < n; i++) {
        while (step > 0 && k < steps && (double)(ev[i].time_ns - t0) > k * step) {
            timeline_sample(s, tl, k * step / 1e9);
            k++;
        }
        if (ev[i].pool == MT_POOL_HOST) {
            sim_event(h, &ev[i]);
            host_events++;
            continue;
        }
        sim_event(s, &ev[i]);
        if (ev[i].kind == MT_EV_MARK && ev[i].addr == MT_MARK_ITERATION) {
            if (n_it == cap_it) {
                cap_it *= 2;
                double *a = realloc(alloc_it, cap_it * sizeof(double));
                uint64_t *it = realloc(iters, cap_it * sizeof(uint64_t));
                alloc_it = a ? a : alloc_it;
                iters = it ? it : iters;
                ok = a && it;
                for (int t = 0; t < MT_TAG_MAX; t++) {
                    double *tt = realloc(tag_it[t], cap_it * sizeof(double));
                    tag_it[t] = tt ? tt : tag_it[t];
                    ok = ok && tt;
                }
                if (!ok)
                    goto out;
            }
            alloc_it[n_it] = (double)s->allocated;
            iters[n_it] = ev[i].size;
            for (int t = 0; t < MT_TAG_MAX; t++)
                tag_it[t][n_it] = (double)s->tag_live[t];
            n_it++;
        }
    }
    timeline_sample(s, tl, (double)(t1 - t0) / 1e9);

    json_t *peak_tags = peaks_by_tag(p, s);
    static const char *const exits[] = {"unknown", "clean", "unclean"};
    res = json_pack(
        "{s:i, s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:I, s:o, s:o}", "pid",
        p->pid, "name", p->name, "events", (json_int_t)n, "lost", (json_int_t)p->lost, "duplicates",
        (json_int_t)p->duplicates, "exit", exits[p->exit_state], "peak_allocated",
        (json_int_t)s->peak_alloc, "peak_reserved", (json_int_t)s->peak_res, "final_allocated",
        (json_int_t)s->allocated, "final_reserved", (json_int_t)s->reserved, "peak_by_tag",
        peak_tags, "timeline", tl, "never_freed", never_freed(cfg, p, s), "unmatched_frees",
        (json_int_t)s->unmatched_frees, "growth", growth(cfg, p, alloc_it, tag_it, iters, n_it),
        "host", host_summary(cfg, p, h, host_events));
    tl = NULL; /* owned by res now */
out:
    json_decref(tl);
    for (int m = 0; m < 2; m++) {
        sim_t *x = m ? h : s;
        if (x) {
            amap_free(&x->blocks);
            amap_free(&x->segs);
        }
        free(x);
    }
    free(alloc_it);
    free(iters);
    for (int t = 0; t < MT_TAG_MAX; t++)
        free(tag_it[t]);
    return res;
}

json_t *mt__report_result(mt__report_t *r)
{
    json_t *procs = json_array();
    if (!procs)
        return NULL;
    for (size_t i = 0; i < r->nprocs; i++) {
        json_t *p = analyse(&r->cfg, &r->procs[i]);
        if (!p || json_array_append_new(procs, p) != 0) {
            json_decref(procs);
            return NULL;
        }
    }
    return json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:o}", "v", 1, "type", "report", "lines",
                     (json_int_t)r->lines, "events", (json_int_t)r->events, "malformed",
                     (json_int_t)r->malformed, "lost_unattributed",
                     (json_int_t)r->lost_unattributed, "duplicates", (json_int_t)r->duplicates,
                     "processes", procs);
}

/* ---- replay for plots ---- */

size_t mt__report_process_count(const mt__report_t *r)
{
    return r->nprocs;
}

int mt__report_process(const mt__report_t *r, size_t i, int *pid, const char **name, size_t *events)
{
    if (i >= r->nprocs)
        return MT_EINVAL;
    *pid = r->procs[i].pid;
    *name = r->procs[i].name;
    *events = r->procs[i].evs.n;
    return 0;
}

const char *mt__report_tag_name(const mt__report_t *r, size_t i, int tag, char *buf, size_t len)
{
    return tag_str(&r->procs[i], tag, buf, len);
}

static void sim_free(sim_t *s)
{
    if (!s)
        return;
    amap_free(&s->blocks);
    amap_free(&s->segs);
    free(s);
}

int mt__report_replay(const mt__report_t *r, size_t i, mt__report_point_fn fn, void *ctx)
{
    if (i >= r->nprocs)
        return MT_EINVAL;
    const proc_t *p = &r->procs[i];
    sim_t *s = calloc(1, sizeof(*s)), *h = calloc(1, sizeof(*h));
    int rc = s && h ? 0 : MT_ENOMEM;
    for (size_t k = 0; rc == 0 && k < p->evs.n; k++) {
        const mt_event_rec_t *ev = &p->evs.v[k];
        sim_event(ev->pool == MT_POOL_HOST ? h : s, ev);
        mt__report_point_t pt = {ev,           k,           s->allocated, s->reserved,
                                 h->allocated, h->reserved, s->tag_live};
        rc = fn(ctx, &pt);
    }
    sim_free(s);
    sim_free(h);
    return rc;
}

static int cmp_block(const void *a, const void *b)
{
    const mt__report_block_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static mt__report_block_t *map_list(const amap_t *m, size_t *n)
{
    mt__report_block_t *v = malloc((m->live ? m->live : 1) * sizeof(*v));
    *n = 0;
    for (size_t k = 0; v && k < m->cap; k++) {
        const entry_t *e = &m->e[k];
        if (e->state == SLOT_FULL)
            v[(*n)++] = (mt__report_block_t){e->addr, e->size, e->tag, e->pending};
    }
    if (v)
        qsort(v, *n, sizeof(*v), cmp_block);
    return v;
}

int mt__report_map_at(const mt__report_t *r, size_t i, size_t index, bool host,
                      mt__report_map_t *out)
{
    memset(out, 0, sizeof(*out));
    if (i >= r->nprocs)
        return MT_EINVAL;
    const proc_t *p = &r->procs[i];
    sim_t *s = calloc(1, sizeof(*s));
    if (!s)
        return MT_ENOMEM;
    for (size_t k = 0; k < p->evs.n && k <= index; k++)
        if ((p->evs.v[k].pool == MT_POOL_HOST) == host)
            sim_event(s, &p->evs.v[k]);
    out->segs = map_list(&s->segs, &out->nsegs);
    out->blocks = map_list(&s->blocks, &out->nblocks);
    sim_free(s);
    if (!out->segs || !out->blocks) {
        mt__report_map_free(out);
        return MT_ENOMEM;
    }
    return 0;
}

void mt__report_map_free(mt__report_map_t *m)
{
    free(m->segs);
    free(m->blocks);
    memset(m, 0, sizeof(*m));
}
