/* memtraced: recorded logs and PyTorch snapshots loaded into the daemon's state, for
 * `memtrace view` (the page of a live daemon, served for a run that is over). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/lines_pipe.h"
#include "analysis/zsource.h"
#include "analysis/torch_snapshot.h"
#include "analysis/torch_snapshot_timeline.h"
#include "analysis/trace_csv.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "memtrace/prof.h"
#include "util/json.h"

#define VIEW_LINE_MAX (1u << 20) /* a longer line is malformed */

/* The newest registration of pid, created (as an exited process) if there is none. */
static mt_d_proc_t *view_proc(mt_d_t *d, int pid, const char *name)
{
    mt_d_proc_t *p = NULL, **tail = &d->procs;
    for (; *tail; tail = &(*tail)->next)
        if ((*tail)->pid == pid)
            p = *tail;
    char fallback[32];
    snprintf(fallback, sizeof fallback, "pid%d", pid);
    if (p && name && name[0] && strcmp(p->name, fallback) == 0)
        snprintf(p->name, sizeof p->name, "%s", name); /* its hello after its first events */
    if (p)
        return p;
    if (mt__d_proc_create(&p, pid, name ? name : fallback) != 0)
        return NULL;
    p->exited = true;
    p->exit_reason = "unknown";
    *tail = p;
    d->ctr.known_processes++;
    return p;
}

/* A file loaded as a run of its own (mt__d_view_load_run): its pids that a process of an
 * earlier file has are given new ones, so two runs never merge into one process.
 * Invariants: older is the last process before this file (NULL: none); from[i] -> to[i]. */
typedef struct view_map_s {
    const mt_d_proc_t *older;
    int *from, *to;
    size_t n, cap;
    /* The process the last event line's pid led to (NULL: none yet), so that a run of one
     * process's lines does not walk the list of processes for each: a registration is only
     * added for a pid that has none, so the one found stays the newest. */
    int last_pid;
    mt_d_proc_t *last;
} view_map_t;

/* The pid a line's pid stands for in d (pid itself unless m remaps it); -1 without memory. */
static int view_pid(mt_d_t *d, view_map_t *m, int pid)
{
    if (!m || !m->older)
        return pid;
    for (size_t i = 0; i < m->n; i++)
        if (m->from[i] == pid)
            return m->to[i];
    bool taken = false;
    for (const mt_d_proc_t *q = d->procs; q && !taken; q = q == m->older ? NULL : q->next)
        taken = q->pid == pid;
    if (!taken)
        return pid;
    int fresh = 1;
    for (const mt_d_proc_t *q = d->procs; q; q = q->next)
        fresh = q->pid >= fresh ? q->pid + 1 : fresh;
    for (size_t i = 0; i < m->n; i++) /* a remapped pid may not have its process yet */
        fresh = m->to[i] >= fresh ? m->to[i] + 1 : fresh;
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        int *f = realloc(m->from, cap * sizeof *f);
        if (f)
            m->from = f;
        int *t = f ? realloc(m->to, cap * sizeof *t) : NULL;
        if (!t)
            return -1;
        m->to = t;
        m->cap = cap;
    }
    m->from[m->n] = pid;
    m->to[m->n++] = fresh;
    return fresh;
}

static const char *static_reason(const char *r)
{
    static const char *const known[] = {"clean", "oom", "killed", "corrupt"};
    for (size_t i = 0; r && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(r, known[i]) == 0)
            return known[i];
    return "unknown";
}

/* ev into p's state and its page's window and history. A live daemon goes on without what
 * memory refused; a loaded file is refused: MT_ENOMEM, else 0. */
static int view_apply(mt_d_t *d, mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    int rc = mt__d_proc_apply(p, ev) == MT_ENOMEM ? MT_ENOMEM : 0;
    int wrc = mt__d_web_record(d, p, ev);
    return rc ? rc : wrc;
}

/* One event of a log's process pid (before remapping) into its model, window and history.
 * 0 or MT_ENOMEM. */
static int view_event(mt_d_t *d, view_map_t *m, const mt_event_rec_t *ev, int pid)
{
    mt_d_proc_t *p = m && m->last && m->last_pid == pid ? m->last : NULL;
    if (!p) {
        int vp = view_pid(d, m, pid);
        p = vp < 0 ? NULL : view_proc(d, vp, NULL);
        if (!p)
            return MT_ENOMEM;
        if (m) {
            m->last_pid = pid;
            m->last = p;
        }
    }
    mt_d_web_proc_t *t = mt__d_web_find(d, p);
    if (!t || t->wcount == 0 || ev->kind == MT_EV_GAP || ev->seq > t->wseq) {
        /* An event found twice (two logs of one run) counts once. */
        if (ev->kind == MT_EV_GAP)
            p->dropped += ev->size;
        else
            p->events++;
        d->ctr.events++;
        return view_apply(d, p, ev);
    }
    return 0;
}

/* One line (without its newline) into d, through jansson: the lines the event-line decoder
 * declined (or all of them, with view_general_reader). */
static int view_line(mt_d_t *d, view_map_t *m, const char *line, size_t len, char *err,
                     size_t errlen)
{
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    if (!j || !json_is_object(j)) {
        snprintf(err, errlen, "not a JSON object (%.100s)", j ? "other value" : je.text);
        json_decref(j);
        return MT_EPROTO;
    }
    const char *type = json_string_value(json_object_get(j, "type"));
    int rc = 0;
    if (type && strcmp(type, "process_event") == 0) {
        json_t *jp = json_object_get(j, "pid");
        const char *ev = json_string_value(json_object_get(j, "event"));
        if (!json_is_integer(jp) || !ev) {
            snprintf(err, errlen, "process_event needs pid and event");
            rc = MT_EPROTO;
        } else {
            int vp = view_pid(d, m, (int)json_integer_value(jp));
            mt_d_proc_t *p =
                vp < 0 ? NULL : view_proc(d, vp, json_string_value(json_object_get(j, "name")));
            json_t *rt = json_object_get(j, "time_realtime_ns");
            if (!p) {
                rc = MT_ENOMEM;
            } else if (strcmp(ev, "register") == 0) {
                (void)mt_prof_job_from_json(j, &p->job);
                p->registered_realtime = json_is_integer(rt) ? (uint64_t)json_integer_value(rt) : 0;
            } else if (strcmp(ev, "exit") == 0) {
                p->exit_reason = static_reason(json_string_value(json_object_get(j, "reason")));
                p->exited_realtime = json_is_integer(rt) ? (uint64_t)json_integer_value(rt) : 0;
            }
        }
    } else if (type && strcmp(type, "hello") == 0 && json_is_integer(json_object_get(j, "pid"))) {
        /* a program's own log: its name, and its rank and job when launched as a rank */
        int vp = view_pid(d, m, (int)json_integer_value(json_object_get(j, "pid")));
        mt_d_proc_t *p =
            vp < 0 ? NULL : view_proc(d, vp, json_string_value(json_object_get(j, "name")));
        json_t *rt = json_object_get(j, "start_realtime_ns"),
               *mono = json_object_get(j, "start_mono_ns");
        if (p) {
            (void)mt_prof_job_from_json(j, &p->job);
            /* its clocks at its start: its times wherever and whenever it was recorded, the
             * same from one load to the next */
            if (json_integer_value(rt) > 0 && json_integer_value(mono) > 0) {
                p->clock_off_ns = json_integer_value(rt) - json_integer_value(mono);
                p->clock_known = true;
                mt_d_web_proc_t *t = mt__d_web_find(d, p);
                if (t != NULL)
                    t->off_ns = p->clock_off_ns;
            }
        } else {
            rc = MT_ENOMEM;
        }
    } else if (!type && json_is_integer(json_object_get(j, "pid"))) {
        /* a stack table or module map line: into the process's model */
        int vp = view_pid(d, m, (int)json_integer_value(json_object_get(j, "pid")));
        mt_d_proc_t *p = vp < 0 ? NULL : view_proc(d, vp, NULL);
        rc = p ? mt__model_table_line(p->model, j, err, errlen) : MT_ENOMEM;
        rc = rc > 0 ? 0 : rc;
    } else if (type && (strcmp(type, "event") == 0 || strcmp(type, "gap") == 0)) {
        mt_event_rec_t ev;
        int pid = -1;
        rc = mt_prof_event_from_json(j, &ev, &pid, err, errlen);
        if (!rc && pid >= 0)
            rc = view_event(d, m, &ev, pid);
    }
    json_decref(j);
    return rc;
}

/* ---- PyTorch snapshots ---- */

typedef struct snap_feed_s {
    mt_d_t *d;
    mt_d_proc_t *p;
    uint64_t seq;  /* the records' own sequence numbers are replaced by one count */
    uint64_t tmul; /* time_ns factor: 1, or a file without a clock's p->event_ns */
} snap_feed_t;

/* A snapshot without a clock: its records' times (their order, 1, 2, ...) this far apart,
 * so that the page's time buckets (250 ms) hold 25 events each. */
#define VIEW_EVENT_NS 10000000ull

/* counted: an event of the file (not one made up from its state before its trace) */
static int snap_apply(snap_feed_t *f, mt_event_rec_t *ev, bool counted)
{
    ev->seq = f->seq++;
    f->p->events += counted;
    f->d->ctr.events += counted;
    return view_apply(f->d, f->p, ev);
}

/* Sites kept by name on the page (the rest are "other") and the timeline's buckets. */
#define VIEW_SITES        10
#define VIEW_SITE_BUCKETS 400

static int snap_rec(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    snap_feed_t *f = ctx;
    if (ev->kind == MT_EV_ALLOC && stack != 0 && stack <= MT_STACK_ID_MAX) {
        /* The block keeps the snapshot's stack id, as a producer's block keeps its own:
         * the page finds the block's site and frames by it. Not an event of the file. */
        mt_event_rec_t ref = {.seq = f->seq++,
                              .time_ns = ev->time_ns * f->tmul,
                              .kind = MT_EV_STACK_REF,
                              .addr = ev->addr,
                              .size = stack,
                              .pool = ev->pool,
                              .device = ev->device};
        int rc = view_apply(f->d, f->p, &ref);
        if (rc)
            return rc;
    }
    mt_event_rec_t e = *ev;
    e.time_ns *= f->tmul;
    int rc = snap_apply(ctx, &e, !(flags & MT_TS_REC_BEFORE));
    if (rc == 0 && (flags & MT_TS_REC_BEFORE))
        f->p->snap_before = e.seq + 1;
    return rc;
}

/* A snapshot as one exited process named after the file, with the smallest pid no loaded
 * process has; its trace (or, with none, its state) as the process's events, memtrace's
 * tag names found in its frames as the tags' labels. */
static int view_snapshot(mt_d_t *d, const char *path, char *err, size_t errlen)
{
    mt_ts_t *ts = NULL;
    int rc = mt__ts_read(&ts, path, err, errlen);
    if (rc)
        return rc;
    int pid = 1;
    for (const mt_d_proc_t *q = d->procs; q; q = q->next)
        if (q->pid >= pid)
            pid = q->pid + 1;
    const char *base = strrchr(path, '/');
    snap_feed_t f = {.d = d, .p = view_proc(d, pid, base ? base + 1 : path), .tmul = 1};
    if (!f.p) {
        mt__ts_destroy(&ts);
        snprintf(err, errlen, "%s: out of memory", path);
        return MT_ENOMEM;
    }
    f.p->exit_reason = "clean";
    f.p->snapshot = mt__ts_state_only(ts) ? "state" : "trace";
    f.p->snap_skipped = ts->skipped_actions;
    /* a trace begun in the middle of a run: the blocks made up from before it have no
     * lifetimes (mt__ts_records) */
    mt__model_lifetimes_from(f.p->model, (uint64_t)mt__ts_trace_start_us(ts) * 1000u);
    if (!mt__ts_timed(ts))
        f.tmul = f.p->event_ns = VIEW_EVENT_NS;
    /* PyTorch's time_us count from the Unix epoch (the records' time_ns = time_us * 1000):
     * the page's times are epoch seconds as they are, not this machine's monotonic clock
     * moved to its wall clock. A file without times: event k at k * event_ns from 0, which
     * the page shows as event numbers (state.c says event_ns). A snapshot is often one
     * training step, under a second: its history's buckets are fitted to its span. */
    int64_t first_us = 0, last_us = 0;
    for (size_t i = 0; i < ts->nevents; i++) {
        int64_t us = ts->events[i].time_us;
        if (us > 0 && (first_us == 0 || us < first_us))
            first_us = us;
        last_us = us > last_us ? us : last_us;
    }
    size_t nrec = ts->nevents ? ts->nevents : ts->nsegments + ts->nblocks; /* (no trace: state) */
    uint64_t span = f.p->event_ns ? (uint64_t)(nrec + 1) * f.p->event_ns
                                  : (uint64_t)(last_us - first_us) * 1000u;
    if (span > 0)
        rc = mt__d_web_set_span(d, f.p, span);
    for (int t = MT_TAG_USER_FIRST; rc == 0 && t < MT_TAG_MAX; t++)
        if (ts->tag_label[t] != NULL) {
            mt_event_rec_t lab = {.kind = MT_EV_TAG_LABEL, .tag = (uint8_t)t};
            mt_event_label_pack(&lab, ts->tag_label[t]);
            rc = snap_apply(&f, &lab, true);
        }
    if (rc == 0)
        rc = mt__ts_records(ts, snap_rec, &f);
    /* (the page's sites over time; without them it would show none) */
    if (rc == 0 && f.p->sites == NULL &&
        (rc = mt__ts_timeline_create(&f.p->sites, ts, NULL, VIEW_SITES, VIEW_SITE_BUCKETS)) == 0) {
        f.p->snap = ts; /* the page names blocks' frames from it */
        ts = NULL;
    }
    mt_d_web_proc_t *t = mt__d_web_find(d, f.p);
    if (rc == 0 && t != NULL && first_us > 0) {
        t->off_ns = 0;
        f.p->registered_realtime = (uint64_t)first_us * 1000u;
        f.p->exited_realtime = (uint64_t)last_us * 1000u;
    } else if (rc == 0 && t != NULL && f.p->event_ns != 0) {
        t->off_ns = 0;
        f.p->registered_realtime = f.p->event_ns;
        f.p->exited_realtime = t->last_ns;
    }
    mt__ts_destroy(&ts);
    if (rc)
        snprintf(err, errlen, "%s: %s", path, mt_strerror(rc));
    return rc;
}

static int set_doc(char **doc, const char *json)
{
    char *copy = strdup(json);
    if (!copy)
        return MT_ENOMEM;
    free(*doc);
    *doc = copy;
    return 0;
}

int mt__d_view_set_diff(mt_d_t *d, const char *json)
{
    return set_doc(&d->diff, json);
}

int mt__d_view_set_jobs(mt_d_t *d, const char *json)
{
    return set_doc(&d->jobs, json);
}

bool mt__d_view_has_ranks(const mt_d_t *d)
{
    for (const mt_d_proc_t *p = d->procs; p; p = p->next)
        if (p->job.rank >= 0)
            return true;
    return false;
}

int mt__d_view_print(mt_d_t *d, FILE *f)
{
    char *procs = NULL;
    json_t *st = mt__d_state_json(d);
    int rc = MT_ENOMEM;
    if (st == NULL)
        goto fail_state;
    /* (its "daemon" is this process's: its pid and start, not the files') */
    rc = mt__json_dumps(json_object_get(st, "processes"), JSON_COMPACT, &procs, NULL);
    if (rc)
        goto fail_dump;
    fprintf(f, "{\"processes\":%s,\"windows\":[", procs);
    for (const mt_d_proc_t *p = d->procs; p; p = p->next) {
        const mt_d_web_proc_t *t = mt__d_web_find(d, p);
        fprintf(f, "%s%zu", p == d->procs ? "" : ",", t ? t->wcount : 0);
    }
    fprintf(f, "],\"diff\":%s,\"jobs\":%s}\n", d->diff ? d->diff : "null",
            d->jobs ? d->jobs : "null");
    rc = fflush(f) != 0 || ferror(f) ? MT_EIO : 0;
    free(procs);
fail_dump:
    json_decref(st);
fail_state:
    return rc;
}

int mt__d_view_get(mt_d_t *d, const char *target, FILE *f, int *status, char *msg, size_t msglen)
{
    mt_d_buf_t out = {0};
    msg[0] = '\0';
    int rc = mt__d_http_get(d, target, &out, status);
    if (rc)
        goto out;
    const char *end = strstr(out.p, "\r\n\r\n");
    const char *body = end ? end + 4 : out.p + out.len;
    size_t n = (size_t)(out.p + out.len - body);
    if (*status != 200) {
        size_t line = strcspn(body, "\r\n");
        snprintf(msg, msglen, "%.*s", (int)(line < n ? line : n), body);
    } else if ((n && fwrite(body, 1, n, f) != n) ||
               (n && body[n - 1] != '\n' && putc('\n', f) == EOF) || fflush(f) != 0) {
        rc = MT_EIO;
    }
out:
    mt__d_buf_free(&out);
    return rc;
}

static int view_load(mt_d_t *d, view_map_t *m, const char *path, unsigned long *events,
                     unsigned long *bad, char *err, size_t errlen);

int mt__d_view_load(mt_d_t *d, const char *path, unsigned long *events, unsigned long *bad,
                    char *err, size_t errlen)
{
    view_map_t m = {0}; /* no older process: pids kept as they are */
    return view_load(d, &m, path, events, bad, err, errlen);
}

int mt__d_view_load_run(mt_d_t *d, const char *path, unsigned long *events, unsigned long *bad,
                        char *err, size_t errlen)
{
    view_map_t m = {0};
    for (const mt_d_proc_t *q = d->procs; q; q = q->next)
        m.older = q;
    int rc = view_load(d, &m, path, events, bad, err, errlen);
    free(m.from);
    free(m.to);
    return rc;
}

/* The state of one log's loading, for view_take. */
typedef struct view_reader_s {
    mt_d_t *d;
    view_map_t *m;
    const char *path;
    unsigned long *bad; /* malformed lines so far */
    char *err;          /* the first one's message */
    size_t errlen;
    bool rmm; /* the first line is an RMM log's header (the reading stopped) */
} view_reader_t;

/* One line of the log, in file order (lines_pipe.h): a malformed or over-long one is
 * counted and skipped. 0, or MT_ENOMEM or MT_EPROTO (an RMM log: the loading stops). */
static int view_take(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    view_reader_t *vr = ud;
    char why[160];
    int rc;
    if (lineno == 1 && it->what == MT_LINE_RAW && mt__trace_is_header(it->text, it->len)) {
        vr->rmm = true; /* an RMM log: the reading stops (view_load names it) */
        return MT_EPROTO;
    }
    if (it->what == MT_LINE_EVENT) {
        rc = view_event(vr->d, vr->m, &it->ev, it->pid);
    } else if (it->what == MT_LINE_LONG) {
        snprintf(why, sizeof why, "line too long");
        rc = MT_EOVERFLOW;
    } else if (it->what == MT_LINE_BAD) {
        snprintf(why, sizeof why, "damaged binary log: %.*s", (int)it->len, it->text);
        rc = MT_EPROTO;
    } else {
        size_t n = it->len;
        while (n > 0 && (it->text[n - 1] == '\n' || it->text[n - 1] == '\r'))
            n--;
        /* The decoder has seen (and declined) it already: the general path alone. */
        rc = n == 0 ? 0 : view_line(vr->d, vr->m, it->text, n, why, sizeof why);
    }
    if (rc == MT_ENOMEM)
        return rc;
    if (rc && (*vr->bad)++ == 0)
        snprintf(vr->err, vr->errlen, "%s:%lu: %s", vr->path, lineno, why);
    return 0;
}

static int view_load(mt_d_t *d, view_map_t *m, const char *path, unsigned long *events,
                     unsigned long *bad, char *err, size_t errlen)
{
    d->recorded = true;
    if (mt__ts_is_pickle(path)) {
        uint64_t before = d->ctr.events;
        int rc = view_snapshot(d, path, err, errlen);
        *events += (unsigned long)(d->ctr.events - before);
        return rc;
    }
    FILE *raw = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!raw) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return MT_EIO;
    }
    mt__zfile_t *zf = NULL; /* a compressed log reads as its text (analysis/zsource.h) */
    int zrc = mt__zfile_open(&zf, raw);
    if (zrc != 0) {
        snprintf(err, errlen, "cannot read %s: %s", path, mt_strerror(zrc));
        if (raw != stdin)
            fclose(raw);
        return zrc;
    }
    FILE *f = mt__zfile_stream(zf);
    view_reader_t vr = {.d = d, .m = m, .path = path, .bad = bad, .err = err, .errlen = errlen};
    mt__lines_pipe_cfg_t pc = {.max = VIEW_LINE_MAX,
                               .fast = !d->cfg.view_general_reader,
                               .threads = mt__lines_pipe_threads()};
    uint64_t before = d->ctr.events;
    unsigned long lineno = 0;
    int rc = mt__lines_pipe_run(f, &pc, view_take, &vr, &lineno);
    if (vr.rmm) /* (read, it is all garbage) */
        snprintf(err, errlen,
                 "%s is an RMM log (CSV), not a memtrace log: 'memtrace replay' reads it", path);
    else if (rc == MT_ENOMEM)
        snprintf(err, errlen, "%s:%lu: out of memory", path, lineno);
    else if (rc == MT_EIO && mt__zfile_error(zf)[0] != '\0') {
        /* Bad compressed data: counted as a malformed line is, what came before it kept. */
        if ((*bad)++ == 0)
            snprintf(err, errlen, "%s: %s", path, mt__zfile_error(zf));
        rc = 0;
    } else if (rc == MT_EIO)
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    mt__zfile_close(&zf);
    if (raw != stdin)
        fclose(raw);
    *events += (unsigned long)(d->ctr.events - before);
    return rc;
}
