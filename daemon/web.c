/* memtraced: the web page's routes (web.h): its embedded files and the JSON it reads.
 * routes.c's table names them, http.c calls them after its own checks; every answer goes
 * through mt__d_http_respond (same headers, no CORS header: the page is same-origin). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "analysis/callsite.h"
#include "analysis/model.h"
#include "analysis/torch_snapshot_timeline.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "util/json.h"

#define MAX_BUCKETS 2000
#define MAX_BLOCKS  20000 /* blocks in one /map answer */
#define MAX_RANGES  4096
#define MAX_TAIL    1000
#define TOMB_ADDR   UINT64_MAX

/* ---- query strings ---- */

/* The value of key in query (a=1&b=2), copied into out; false if absent or too long. */
static bool qget(const char *query, const char *key, char *out, size_t n)
{
    size_t kl = strlen(key);
    for (const char *p = query; p && *p;) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
            size_t vl = len - kl - 1;
            if (vl >= n)
                return false;
            memcpy(out, p + kl + 1, vl);
            out[vl] = '\0';
            return true;
        }
        p = amp ? amp + 1 : NULL;
    }
    return false;
}

/* Whether the query has key (with any value). */
static bool qhas(const char *query, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = query; p && *p;) {
        if (strncmp(p, key, kl) == 0 && p[kl] == '=')
            return true;
        p = strchr(p, '&');
        p = p ? p + 1 : NULL;
    }
    return false;
}

static bool qnum(const char *query, const char *key, double *out)
{
    char v[64], *end;
    if (!query || !qget(query, key, v, sizeof v) || !v[0])
        return false;
    double x = strtod(v, &end);
    if (*end || !isfinite(x))
        return false;
    *out = x;
    return true;
}

static bool qu64(const char *query, const char *key, uint64_t *out)
{
    char v[64], *end;
    if (!query || !qget(query, key, v, sizeof v) || !v[0])
        return false;
    if (v[0] == '-' || v[0] == '+' || v[0] == ' ')
        return false; /* strtoull would wrap a minus sign */
    unsigned long long x = strtoull(v, &end, 0);
    if (*end)
        return false;
    *out = x;
    return true;
}

const char *mt__d_web_bad_param(const char *query)
{
    static const char *const nums[] = {"from", "to", "buckets", "span", "n", "t"};
    static const char *const ints[] = {"pid", "seq", "addr"};
    double x;
    uint64_t u;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (qhas(query, nums[i]) && !qnum(query, nums[i], &x))
            return nums[i];
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (qhas(query, ints[i]) && !qu64(query, ints[i], &u))
            return ints[i];
    return NULL;
}

/* Epoch seconds on t's clock as monotonic ns, clamped to [0, UINT64_MAX]. */
static uint64_t mono_of(const mt_d_web_proc_t *t, double epoch_s)
{
    double ns = epoch_s * 1e9 - (double)t->off_ns;
    return ns <= 0 ? 0 : ns >= 1.8e19 ? UINT64_MAX : (uint64_t)ns;
}

static uint64_t mono_now(void)
{
    struct timespec m;
    clock_gettime(CLOCK_MONOTONIC, &m);
    return (uint64_t)m.tv_sec * 1000000000u + (uint64_t)m.tv_nsec;
}

/* ---- answers ---- */

/* b as the answer, or a 500 if building it failed (b->err); b is freed. */
void mt__d_web_send(mt_d_conn_t *c, mt_d_buf_t *b, bool head)
{
    if (b->err)
        mt__d_http_respond(c, 500, "Internal Server Error", "text/plain; charset=utf-8",
                           "out of memory\n", 14, head);
    else
        mt__d_http_respond(c, 200, "OK", "application/json", b->p, b->len, head);
    mt__d_buf_free(b);
}

void mt__d_web_bad(mt_d_conn_t *c, int status, const char *msg)
{
    mt__d_http_respond(c, status, status == 404 ? "Not Found" : "Bad Request",
                       "text/plain; charset=utf-8", msg, strlen(msg), false);
}

/* The newest registration of the pid in query, with its tracker. */
bool mt__d_web_find_proc(mt_d_conn_t *c, const char *query, const mt_d_proc_t **p,
                         mt_d_web_proc_t **t)
{
    uint64_t pid;
    if (!qu64(query, "pid", &pid)) {
        mt__d_web_bad(c, 400, "pid=N is required\n");
        return false;
    }
    *p = NULL;
    for (const mt_d_proc_t *q = c->d->procs; q; q = q->next)
        if ((uint64_t)q->pid == pid)
            *p = q;
    *t = *p ? mt__d_web_find(c->d, *p) : NULL;
    if (!*p || !*t) {
        mt__d_web_bad(c, 404, "no such process (or no events from it yet)\n");
        return false;
    }
    mt__d_web_history_flush(*t);
    return true;
}

int mt__d_web_json_str(mt_d_buf_t *o, const char *s)
{
    mt__d_buf_append(o, "\"", 1);
    for (; *s && !o->err; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            mt__d_buf_printf(o, "\\%c", ch);
        else if (ch < 0x20)
            mt__d_buf_printf(o, "\\u%04x", ch);
        else
            mt__d_buf_append(o, s, 1);
    }
    return mt__d_buf_append(o, "\"", 1);
}

double mt__d_web_secs(const mt_d_web_proc_t *t, uint64_t ns)
{
    return ((double)ns + (double)t->off_ns) / 1e9;
}

/* Epoch seconds of ns as exact decimal text with microseconds, rounded down (up: rounded
 * up), so that a range printed from..to still holds every event inside it when the page
 * sends it back (a run can fit its events in less than a millisecond). */
static int put_secs(mt_d_buf_t *o, const mt_d_web_proc_t *t, uint64_t ns, bool up)
{
    int64_t off = t->off_ns;
    uint64_t e;
    if (off >= 0) /* saturated: a far bound (to=1e300) must not wrap below from */
        e = __builtin_add_overflow(ns, (uint64_t)off, &e) ? UINT64_MAX : e;
    else
        e = ns > 0 - (uint64_t)off ? ns - (0 - (uint64_t)off) : 0;
    uint64_t us = e / 1000u + (up && e % 1000u ? 1u : 0u);
    return mt__d_buf_printf(o, "%" PRIu64 ".%06" PRIu64, us / 1000000u, us % 1000000u);
}

/* The latest time of p's figures: now while it runs, its last event once exited. */
static uint64_t proc_now(const mt_d_proc_t *p, const mt_d_web_proc_t *t)
{
    if (p->exited || !p->ring)
        return t->last_ns;
    uint64_t m = mono_now();
    return m > t->last_ns ? m : t->last_ns;
}

/* ---- history ---- */

/* Folds the source buckets with t0 in [from, to) into nb output buckets; valid[j] says
 * whether out[j] holds data (empty ones carry the previous figures forward). */
static void hist_query(const mt_d_web_proc_t *t, uint64_t from, uint64_t to, size_t nb,
                       mt_d_web_bkt_t *out, bool *valid)
{
    memset(valid, 0, nb * sizeof *valid);
    uint64_t w = (to - from + nb - 1) / nb;
    if (w == 0)
        w = 1;
    bool fine = from + t->fine_ns * (MT_D_WEB_FINE - 1) >= t->last_ns;
    size_t n = fine ? MT_D_WEB_FINE : t->ncoarse;
    size_t first = fine ? (t->last_ns / t->fine_ns + 1) % MT_D_WEB_FINE : 0;
    for (size_t k = 0; k < n; k++) {
        const mt_d_web_bkt_t *s = fine ? &t->fine[(first + k) % MT_D_WEB_FINE] : &t->coarse[k];
        if (s->t0 == 0 || s->t0 + (fine ? t->fine_ns : t->coarse_ns) <= from || s->t0 >= to)
            continue;
        size_t j = s->t0 <= from ? 0 : (size_t)((s->t0 - from) / w);
        if (j >= nb)
            j = nb - 1;
        if (!valid[j]) {
            out[j] = *s;
            valid[j] = true;
        } else {
            mt_d_web_bkt_t m = out[j];
            /* the fine ring is in time order from `first`; the coarse array is sorted */
            if (s->amin < m.amin)
                m.amin = s->amin;
            if (s->amax > m.amax)
                m.amax = s->amax;
            if (s->rmax > m.rmax)
                m.rmax = s->rmax;
            if (s->hmax > m.hmax)
                m.hmax = s->hmax;
            m.alast = s->alast;
            m.rlast = s->rlast;
            m.peak = s->peak;
            m.hres = s->hres;
            memcpy(m.tag, s->tag, sizeof m.tag);
            m.ooms += s->ooms;
            m.events += s->events;
            out[j] = m;
        }
    }
    for (size_t j = 0; j < nb; j++)
        out[j].t0 = from + j * w;
}

typedef enum { S_AMIN, S_AMAX, S_ALAST, S_RMAX, S_RLAST, S_PEAK, S_HMAX, S_HRES, S_OOMS } series_e;

static uint64_t series_value(const mt_d_web_bkt_t *b, series_e s)
{
    switch (s) {
    case S_AMIN:
        return b->amin;
    case S_AMAX:
        return b->amax;
    case S_ALAST:
        return b->alast;
    case S_RMAX:
        return b->rmax;
    case S_RLAST:
        return b->rlast;
    case S_PEAK:
        return b->peak;
    case S_HMAX:
        return b->hmax;
    case S_HRES:
        return b->hres;
    case S_OOMS:
        return b->ooms;
    }
    return 0;
}

/* One array of nb figures; an empty bucket repeats the last figure before it (OOM counts
 * are 0), or is null before any data. tag >= 0 picks a tag's bytes instead of s. */
static int put_series(mt_d_buf_t *o, const mt_d_web_bkt_t *b, const bool *valid, size_t nb,
                      series_e s, int tag)
{
    mt__d_buf_append(o, "[", 1);
    const mt_d_web_bkt_t *prev = NULL;
    for (size_t j = 0; j < nb && !o->err; j++) {
        if (j)
            mt__d_buf_append(o, ",", 1);
        const mt_d_web_bkt_t *x = valid[j] ? &b[j] : prev;
        if (valid[j])
            prev = &b[j];
        if (!x)
            mt__d_buf_append(o, "null", 4);
        else if (tag >= 0)
            mt__d_buf_printf(o, "%" PRIu64, x->tag[tag]);
        else if (s == S_OOMS || s == S_AMIN || s == S_AMAX)
            mt__d_buf_printf(o, "%" PRIu64,
                             valid[j] ? series_value(x, s) : (s == S_OOMS ? 0 : x->alast));
        else
            mt__d_buf_printf(o, "%" PRIu64, series_value(x, s));
    }
    return mt__d_buf_append(o, "]", 1);
}

void mt__d_web_serve_history(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    uint64_t now = proc_now(p, t);
    uint64_t first = t->ncoarse ? t->coarse[0].t0 : now;
    double from_s, to_s, nbd = 300;
    uint64_t from = qnum(query, "from", &from_s) ? mono_of(t, from_s) : first;
    uint64_t to = qnum(query, "to", &to_s) ? mono_of(t, to_s) : now + 1;
    qnum(query, "buckets", &nbd);
    if (from < first)
        from = first; /* nothing before the process's first event */
    if (!(nbd >= 1 && nbd <= MAX_BUCKETS) || to <= from) {
        mt__d_web_bad(c, 400, "need from < to and 1 <= buckets <= 2000\n");
        return;
    }
    size_t nb = (size_t)nbd;
    mt_d_web_bkt_t *b = malloc(nb * sizeof *b);
    bool *valid = malloc(nb * sizeof *valid);
    mt_d_buf_t o = {0};
    if (!b || !valid)
        mt__d_buf_fail(&o, MT_ENOMEM);
    if (!o.err) {
        hist_query(t, from, to, nb, b, valid);
        mt__d_buf_printf(&o, "{\"pid\":%d,\"from\":", p->pid);
        put_secs(&o, t, from, false);
        mt__d_buf_append(&o, ",\"to\":", 6);
        put_secs(&o, t, to, true);
        mt__d_buf_append(&o, ",\"first\":", 9);
        put_secs(&o, t, first, false);
        mt__d_buf_append(&o, ",\"now\":", 7);
        put_secs(&o, t, now, true);
        mt__d_buf_append(&o, ",\"t\":[", 6);
        for (size_t j = 0; j < nb && !o.err; j++)
            mt__d_buf_printf(&o, "%s%.3f", j ? "," : "", mt__d_web_secs(t, b[j].t0));
        mt__d_buf_append(&o, "]", 1);
        static const struct {
            const char *name;
            series_e s;
        } series[] = {{"amin", S_AMIN},          {"amax", S_AMAX}, {"alast", S_ALAST},
                      {"reserved", S_RMAX},      {"peak", S_PEAK}, {"host_allocated", S_HMAX},
                      {"host_reserved", S_HRES}, {"ooms", S_OOMS}};
        for (size_t k = 0; k < sizeof series / sizeof series[0] && !o.err; k++) {
            mt__d_buf_printf(&o, ",\"%s\":", series[k].name);
            put_series(&o, b, valid, nb, series[k].s, -1);
        }
        mt__d_buf_append(&o, ",\"tags\":{", 9);
        bool any = false;
        for (int tag = 0; tag < MT_TAG_MAX && !o.err; tag++) {
            bool used = false;
            for (size_t j = 0; j < nb && !used; j++)
                used = valid[j] && b[j].tag[tag] != 0;
            if (!used)
                continue;
            char nbuf[32];
            mt__d_buf_append(&o, any ? "," : "", any ? 1 : 0);
            mt__d_web_json_str(&o, mt__d_tag_name(p, tag, nbuf, sizeof nbuf));
            mt__d_buf_append(&o, ":", 1);
            put_series(&o, b, valid, nb, S_ALAST, tag);
            any = true;
        }
        mt__d_buf_append(&o, "}}\n", 3);
    }
    free(b);
    free(valid);
    mt__d_web_send(c, &o, head);
}

void mt__d_web_serve_spark(mt_d_conn_t *c, const char *query, bool head)
{
    double span = 120, nbd = 60;
    if (query) {
        qnum(query, "span", &span);
        qnum(query, "buckets", &nbd);
    }
    if (!(span > 0 && span <= 86400 * 30) || !(nbd >= 1 && nbd <= 500)) {
        mt__d_web_bad(c, 400, "need 0 < span and 1 <= buckets <= 500\n");
        return;
    }
    size_t nb = (size_t)nbd;
    mt_d_web_bkt_t *b = malloc(nb * sizeof *b);
    bool *valid = malloc(nb * sizeof *valid);
    mt_d_buf_t o = {0};
    if (!b || !valid)
        mt__d_buf_fail(&o, MT_ENOMEM);
    mt__d_buf_append(&o, "{\"procs\":[", 10);
    bool any = false;
    for (const mt_d_proc_t *p = c->d->procs; p && !o.err; p = p->next) {
        mt_d_web_proc_t *t = mt__d_web_find(c->d, p);
        if (!t)
            continue;
        mt__d_web_history_flush(t);
        uint64_t now = proc_now(p, t) + 1, sp = (uint64_t)(span * 1e9);
        uint64_t first = t->ncoarse ? t->coarse[0].t0 : now - 1;
        uint64_t from = now > sp ? now - sp : 0;
        if (from < first)
            from = first;
        hist_query(t, from, now, nb, b, valid);
        mt__d_buf_printf(&o, "%s{\"pid\":%d,\"exited\":%s,\"v\":", any ? "," : "", p->pid,
                         p->exited ? "true" : "false");
        put_series(&o, b, valid, nb, S_AMAX, -1);
        mt__d_buf_append(&o, "}", 1);
        any = true;
    }
    mt__d_buf_append(&o, "]}\n", 3);
    free(b);
    free(valid);
    mt__d_web_send(c, &o, head);
}

/* ---- allocator state at an event ---- */

/* Applies the event that made each segment and block of map (seq numbers from *seq on),
 * with the class's totals as the running figures of its device 0 (or host 0) source. */
static void synth_class(mt_model_t *m, const mt_model_map_t *map, const mt_model_figures_t *f,
                        uint64_t t_ns, uint64_t *seq)
{
    mt_event_rec_t ev = {.time_ns = t_ns, .allocated = f->allocated, .reserved = f->reserved};
    for (size_t i = 0; i < map->nsegs; i++) {
        const mt_model_seg_t *g = &map->segs[i];
        ev.seq = (*seq)++;
        ev.kind = g->mapped ? MT_EV_SEGMENT_MAP : MT_EV_SEGMENT_ALLOC;
        ev.addr = g->addr;
        ev.size = ev.requested = g->size;
        ev.pool = g->pool;
        ev.stream = g->stream;
        ev.tag = 0;
        mt__model_apply(m, &ev);
    }
    for (size_t i = 0; i < map->nblocks; i++) {
        const mt_model_block_t *k = &map->blocks[i];
        if (k->stack != 0) { /* the block keeps its call stack */
            ev.seq = (*seq)++;
            ev.kind = MT_EV_STACK_REF;
            ev.addr = k->addr;
            ev.size = k->stack;
            ev.pool = k->pool;
            mt__model_apply(m, &ev);
        }
        ev.seq = (*seq)++;
        ev.kind = MT_EV_ALLOC;
        ev.addr = k->addr;
        ev.size = k->size;
        ev.requested = k->requested; /* 0: unknown, as it was */
        ev.pool = k->pool;
        ev.stream = 0;
        ev.tag = k->tag;
        mt__model_apply(m, &ev);
        if (k->pending) {
            ev.seq = (*seq)++;
            ev.kind = MT_EV_FREE_REQUESTED;
            mt__model_apply(m, &ev);
        }
    }
}

int mt__d_web_state_at(const mt_d_web_proc_t *t, size_t upto, mt_model_t **out)
{
    mt_model_map_t own[MT_MODEL_CLASSES] = {{0}};
    mt_model_figures_t fown[MT_MODEL_CLASSES];
    const mt_model_map_t *map = own;
    const mt_model_figures_t *f = fown;
    mt_model_t *m = NULL;
    if (mt__model_create(&m, NULL) != 0)
        goto fail_create;
    /* From the window's checkpoint and the events kept since, or from the base. */
    size_t npre = t->nck ? t->npre : 0;
    if (t->nck) {
        map = t->ck[0].map;
        f = t->ck[0].f;
    } else {
        for (int cls = 0; cls < MT_MODEL_CLASSES; cls++) {
            if (mt__model_map(t->base, cls, &own[cls]) != 0)
                goto fail_map;
            mt__model_figures_totals(t->base, cls, &fown[cls]);
        }
    }
    size_t k = 0;
    for (int cls = 0; cls < MT_MODEL_CLASSES; cls++) {
        k += map[cls].nsegs + map[cls].nblocks;
        for (size_t i = 0; i < map[cls].nblocks; i++)
            k += map[cls].blocks[i].pending + (map[cls].blocks[i].stack != 0);
    }
    /* Seq numbers just before the first event replayed: the model sees no gap. */
    const mt_event_rec_t *e0 = npre        ? mt__d_web_pre_at(t, 0)
                               : t->wcount ? mt__d_web_window_at(t, 0)
                                           : NULL;
    uint64_t first = e0 ? e0->seq : 0;
    uint64_t seq = first >= k ? first - k : 0;
    uint64_t t0 = e0 ? e0->time_ns : 0;
    for (int cls = 0; cls < MT_MODEL_CLASSES; cls++)
        synth_class(m, &map[cls], &f[cls], t0, &seq);
    for (size_t i = 0; i < npre; i++)
        mt__model_apply(m, mt__d_web_pre_at(t, i));
    for (size_t i = 0; i < upto; i++)
        mt__model_apply(m, mt__d_web_window_at(t, i));
    for (int cls = 0; cls < MT_MODEL_CLASSES; cls++)
        mt__model_map_free(&own[cls]);
    *out = m;
    return 0;
fail_map:
    for (int cls = 0; cls < MT_MODEL_CLASSES; cls++)
        mt__model_map_free(&own[cls]);
    mt__model_destroy(&m);
fail_create:
    return MT_ENOMEM;
}

/* The index just past the last window event with seq <= seq (or time <= t_ns). */
static size_t window_upto(const mt_d_web_proc_t *t, bool by_time, uint64_t v)
{
    size_t lo = 0, hi = t->wcount; /* sequence numbers and times only grow within a process */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const mt_event_rec_t *e = mt__d_web_window_at(t, mid);
        if ((by_time ? e->time_ns : e->seq) <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int put_window(mt_d_buf_t *o, const mt_d_web_proc_t *t)
{
    if (!t->wcount)
        return mt__d_buf_append(o, "\"window\":null", 13);
    const mt_event_rec_t a = *mt__d_web_window_at(t, 0); /* a copy: the next read may move it */
    const mt_event_rec_t *z = mt__d_web_window_at(t, t->wcount - 1);
    return mt__d_buf_printf(o,
                            "\"window\":{\"count\":%zu,\"first_seq\":%" PRIu64
                            ",\"last_seq\":%" PRIu64 ",\"first_t\":%.6f,\"last_t\":%.6f}",
                            t->wcount, a.seq, z->seq, mt__d_web_secs(t, a.time_ns),
                            mt__d_web_secs(t, z->time_ns));
}

static int put_map(mt_d_buf_t *o, const mt_model_t *m, const mt_d_proc_t *p)
{
    mt_model_figures_t f;
    mt_model_map_t map;
    if (mt__model_figures(m, MT_MODEL_DEVICE, &f) != 0 ||
        mt__model_map(m, MT_MODEL_DEVICE, &map) != 0)
        return mt__d_buf_fail(o, MT_ENOMEM);
    mt__d_buf_printf(o,
                     ",\"allocated\":%" PRIu64 ",\"reserved\":%" PRIu64 ",\"total_free\":%" PRIu64
                     ",\"largest_free\":%" PRIu64 ",\"fragmentation\":%.4f,\"nblocks\":%" PRIu64
                     ",\"tag_names\":{",
                     f.allocated, f.reserved, f.total_free, f.largest_free, f.fragmentation,
                     f.blocks);
    bool any = false;
    for (int tag = 0; tag < MT_TAG_MAX && !o->err; tag++) {
        mt_model_tag_t tg;
        mt__model_tag(m, MT_MODEL_DEVICE, tag, &tg);
        if (!tg.blocks && !tg.peak && !tg.uncertain_blocks)
            continue;
        char nbuf[32];
        mt__d_buf_printf(o, "%s\"%d\":", any ? "," : "", tag);
        mt__d_web_json_str(o, mt__d_tag_name(p, tag, nbuf, sizeof nbuf));
        any = true;
    }
    mt__d_buf_append(o, "}", 1);
    const mt_ts_timeline_t *tl = p->sites;
    if (tl) { /* a snapshot: its blocks by site (the site's index after each block) */
        mt__d_buf_append(o, ",\"sites\":[", 10);
        for (size_t i = 0; i < tl->nsites && !o->err; i++) {
            mt__d_buf_append(o, i ? "," : "", i ? 1 : 0);
            mt__d_web_json_str(o, tl->names[i]);
        }
        mt__d_buf_append(o, "]", 1);
    }
    mt__d_buf_append(o, ",\"ranges\":[", 11);
    for (size_t i = 0; i < map.nsegs && i < MAX_RANGES && !o->err; i++) {
        const mt_model_seg_t *r = &map.segs[i];
        mt__d_buf_printf(o, "%s[\"0x%" PRIx64 "\",%" PRIu64 ",%u,%u,%u]", i ? "," : "", r->addr,
                         r->size, r->mapped, r->pool, r->stream);
    }
    mt__d_buf_append(o, "],\"blocks\":[", 12);
    size_t n = map.nblocks < MAX_BLOCKS ? map.nblocks : MAX_BLOCKS;
    for (size_t i = 0; i < n && !o->err; i++) {
        const mt_model_block_t *b = &map.blocks[i];
        mt__d_buf_printf(o, "%s[\"0x%" PRIx64 "\",%" PRIu64 ",%u,%u", i ? "," : "", b->addr,
                         b->size, b->tag, b->pending);
        if (tl) {
            uint32_t s = b->stack < tl->nstacks ? tl->site_of[b->stack] : MT_TS_TIMELINE_NONE;
            mt__d_buf_printf(o, ",%d", s == MT_TS_TIMELINE_NONE ? -1 : (int)s);
        }
        mt__d_buf_append(o, "]", 1);
    }
    mt__d_buf_printf(o, "],\"blocks_truncated\":%s", n < map.nblocks ? "true" : "false");
    mt__model_map_free(&map);
    return o->err;
}

/* Where the query asks for a past state: the window index (seq= or t=), else false. */
bool mt__d_web_past_upto(const mt_d_web_proc_t *t, const char *query, size_t *upto)
{
    uint64_t seq;
    double ts;
    if (qu64(query, "seq", &seq)) {
        *upto = window_upto(t, false, seq);
        return true;
    }
    if (qnum(query, "t", &ts)) {
        *upto = window_upto(t, true, mono_of(t, ts));
        return true;
    }
    return false;
}

void mt__d_web_serve_map(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    size_t upto = t->wcount;
    bool past = mt__d_web_past_upto(t, query, &upto);
    mt_model_t *m = NULL;
    mt_d_buf_t o = {0};
    int rc = past ? mt__d_web_state_at(t, upto, &m) : 0;
    if (rc)
        mt__d_buf_fail(&o, rc);
    const mt_event_rec_t *at = upto ? mt__d_web_window_at(t, upto - 1) : NULL;
    mt__d_buf_printf(&o, "{\"pid\":%d,\"live\":%s,\"seq\":%" PRIu64 ",\"t\":%.6f,", p->pid,
                     past ? "false" : "true", at ? at->seq : 0,
                     at ? mt__d_web_secs(t, at->time_ns) : 0.0);
    put_window(&o, t);
    if (!o.err)
        put_map(&o, past ? m : p->model, p);
    mt__d_buf_append(&o, "}\n", 2);
    mt__model_destroy(&m);
    mt__d_web_send(c, &o, head);
}

/* ---- call stacks ---- */

/* Appends ,"stack":N,"frames":[...] (frames named by the daemon's symbolizer; an id the
 * table does not hold reads "unknown stack N"). */
static int put_stack(mt_d_buf_t *o, const mt_d_proc_t *p, uint32_t id)
{
    mt_cs_row_t row = {.stack = id};
    const mt_model_frame_t *fr;
    if (mt__model_stack_frames(p->model, id, &fr, &row.n_frames, &row.truncated) == 0)
        row.frames = (const mt_cs_frame_t *)fr;
    json_t *a = mt__cs_sym_sync(p->sym, (uint32_t)p->pid, p->model) == 0
                    ? mt__cs_rows_json(p->sym, (uint32_t)p->pid, &row, 1, 1, false)
                    : NULL;
    json_t *row0 = a ? json_array_get(a, 0) : NULL;
    char *txt = NULL;
    int rc = row0 ? mt__json_dumps(row0, JSON_COMPACT, &txt, NULL) : MT_ENOMEM;
    json_decref(a);
    if (rc)
        return mt__d_buf_fail(o, rc);
    /* {"stack":N,...}: its members go into the block's object. */
    mt__d_buf_printf(o, ",\"call_stack\":%s", txt);
    free(txt);
    return o->err;
}

/* ,"call_stack":{"site":S,"frames":[...],"hidden":K,"stack":N} of a snapshot's stack, named
 * as its call sites are (mt__ts_stack_view). */
static int put_snap_stack(mt_d_buf_t *o, const mt_d_proc_t *p, uint32_t id)
{
    json_t *v = mt__ts_stack_view(p->snap, id, NULL);
    char *txt = NULL;
    int rc = v == NULL || json_object_set_new(v, "stack", json_integer(id)) != 0
                 ? MT_ENOMEM
                 : mt__json_dumps(v, JSON_COMPACT, &txt, NULL);
    json_decref(v);
    if (rc)
        return mt__d_buf_fail(o, rc);
    mt__d_buf_printf(o, ",\"call_stack\":%s", txt);
    free(txt);
    return o->err;
}

void mt__d_web_serve_block(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    uint64_t addr;
    if (!qu64(query, "addr", &addr)) {
        mt__d_web_bad(c, 400, "addr=0x... is required\n");
        return;
    }
    size_t upto = t->wcount;
    bool past = mt__d_web_past_upto(t, query, &upto);
    uint64_t at_ns = past && upto ? mt__d_web_window_at(t, upto - 1)->time_ns : proc_now(p, t);
    const mt_event_rec_t *al = NULL, *ref = NULL;
    mt_event_rec_t alc, frc; /* copies: reading the event before may move a spooled one */
    bool freed = false;
    for (size_t i = upto; i-- > 0;) {
        const mt_event_rec_t *e = mt__d_web_window_at(t, i);
        if (e->kind == MT_EV_ALLOC && e->addr == addr && e->pool != MT_POOL_HOST) {
            alc = *e;
            al = &alc;
            ref = i > 0 ? mt__d_web_window_at(t, i - 1)
                        : NULL; /* its call stack comes right before it */
            break;
        }
        if (e->kind == MT_EV_FREE_COMPLETED && e->addr == addr && e->pool != MT_POOL_HOST) {
            frc = *e; /* nothing lives there now: the last block there was freed */
            freed = true;
            break;
        }
    }
    /* With every event of the process kept (from its first, none evicted, none lost), an
     * address no event names never held a block. */
    if (!al && !freed && t->nrec == t->wcount &&
        (t->wcount == 0 || mt__d_web_window_at(t, 0)->seq == 0) && mt__model_lost(p->model) == 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "no block has started at 0x%" PRIx64 " in this process%s\n", addr,
                 past ? " by then" : "");
        mt__d_web_bad(c, 404, msg);
        return;
    }
    mt_d_buf_t o = {0};
    mt__d_buf_printf(&o, "{\"pid\":%d,\"addr\":\"0x%" PRIx64 "\"", p->pid, addr);
    if (freed) {
        mt__d_buf_printf(
            &o,
            ",\"live\":false,\"size\":%" PRIu64
            ",\"stream\":%u,\"pool\":\"%s\",\"freed_seq\":%" PRIu64 ",\"freed_t\":%.6f",
            frc.size, frc.stream, mt_pool_name(frc.pool), frc.seq, mt__d_web_secs(t, frc.time_ns));
    } else if (al) {
        char nbuf[32];
        mt__d_buf_printf(&o,
                         ",\"live\":true,\"size\":%" PRIu64 ",\"requested\":%" PRIu64
                         ",\"stream\":%u,\"pool\":\"%s\",\"seq\":%" PRIu64,
                         al->size, al->requested, al->stream, mt_pool_name(al->pool), al->seq);
        if (al->seq < p->snap_before) /* a snapshot's block from before its trace: no time */
            mt__d_buf_printf(&o, ",\"before_trace\":true,\"allocated_t\":null,\"age_s\":null");
        else
            mt__d_buf_printf(&o, ",\"allocated_t\":%.6f,\"age_s\":%.3f",
                             mt__d_web_secs(t, al->time_ns), (double)(at_ns - al->time_ns) / 1e9);
        mt__d_buf_append(&o, ",\"tag\":", 7);
        mt__d_web_json_str(&o, mt__d_tag_name(p, al->tag, nbuf, sizeof nbuf));
        if (ref && ref->kind == MT_EV_STACK_REF && ref->addr == al->addr)
            p->snap ? put_snap_stack(&o, p, (uint32_t)ref->size)
                    : put_stack(&o, p, (uint32_t)ref->size);
    } else {
        mt__d_buf_append(&o, ",\"before_window\":true", 21); /* live, or never: unknown */
    }
    mt__d_buf_append(&o, "}\n", 2);
    mt__d_web_send(c, &o, head);
}

/* ---- event tail ---- */

void mt__d_web_serve_tail(mt_d_conn_t *c, const char *query, bool head)
{
    const mt_d_proc_t *p;
    mt_d_web_proc_t *t;
    if (!mt__d_web_find_proc(c, query, &p, &t))
        return;
    double nd = 200;
    qnum(query, "n", &nd);
    if (!(nd >= 1 && nd <= MAX_TAIL)) {
        mt__d_web_bad(c, 400, "need 1 <= n <= 1000\n");
        return;
    }
    char kind[32] = "", tag[MT_EVENT_LABEL_MAX + 8] = "", pool[16] = "";
    qget(query, "kind", kind, sizeof kind);
    qget(query, "tag", tag, sizeof tag);
    qget(query, "pool", pool, sizeof pool);
    mt_d_buf_t o = {0};
    mt__d_buf_printf(&o, "{\"pid\":%d,\"matched_of\":%zu,\"events\":[", p->pid, t->wcount);
    size_t n = 0;
    for (size_t i = t->wcount; i-- > 0 && n < (size_t)nd && !o.err;) {
        const mt_event_rec_t *e = mt__d_web_window_at(t, i);
        char nbuf[32];
        const char *tn = mt__d_tag_name(p, e->tag, nbuf, sizeof nbuf);
        const char *kn = mt_event_kind_name(e->kind), *pn = mt_pool_name(e->pool);
        if ((kind[0] && strcmp(kind, kn) != 0) || (tag[0] && strcmp(tag, tn) != 0) ||
            (pool[0] && strcmp(pool, pn) != 0))
            continue;
        mt__d_buf_printf(&o,
                         "%s{\"seq\":%" PRIu64 ",\"t\":%.6f,\"kind\":\"%s\",\"addr\":\"0x%" PRIx64
                         "\",\"size\":%" PRIu64 ",\"requested\":%" PRIu64
                         ",\"pool\":\"%s\",\"stream\":%u,\"allocated\":%" PRIu64
                         ",\"reserved\":%" PRIu64 ",\"tag\":",
                         n ? "," : "", e->seq, mt__d_web_secs(t, e->time_ns), kn, e->addr, e->size,
                         e->requested, pn, e->stream, e->allocated, e->reserved);
        mt__d_web_json_str(&o, tn);
        mt__d_buf_append(&o, "}", 1);
        n++;
    }
    mt__d_buf_append(&o, "]}\n", 3);
    mt__d_web_send(c, &o, head);
}
