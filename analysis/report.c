/* Offline analysis of a telemetry log: collects each process's records, replays them
 * through the event model (analysis/model.h, the daemon's too) and formats its figures:
 * peaks, a timeline, never-freed allocations and the growth verdict (see report.h). Device
 * memory and pinned host memory (pool host) are the model's two classes, so host pages
 * never appear in the device figures. */
#include "analysis/report.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/event_spool.h"
#include "analysis/frames.h"
#include "analysis/gap.h"
#include "analysis/model.h"
#include "analysis/model_internal.h"
#include "analysis/ndjson_fast.h"
#include "analysis/scopes.h"
#include "memtrace/prof.h"
#include "util/assert.h"
#include "analysis/report_internal.h"

/* ---- events already read ---- */

/* What tells an event read twice (logs read one after the other overlap by the events the
 * daemon read and never acknowledged, at most its ring): a hash of each of the newest
 * records, at its seq modulo the table's size, seen_cap. 8 bytes an event in a table that
 * grows with the seqs taken up to SEEN_MAX, then stays: memory that is new to the process
 * costs CPU time too, and this table is touched by every event. It starts small, for a job's
 * thousands of ranks of a few events each (a table of SEEN_MAX per process was 512 KiB of
 * each, and all of it touched once the allocator gave back freed memory).
 * Invariants, while the records taken came in order (!unordered: afterwards it is never
 * read), with s0 = seen_first, the seq of the first record taken: seen_cap a power of two in
 * [SEEN_FIRST, SEEN_MAX]; seen_cap < SEEN_MAX => every seq taken lies in
 * [s0, s0 + seen_cap); seen[s % seen_cap] = seen_hash of the last record of seq s taken, or of
 * one of a seq that leaves s % seen_cap as s does, or 0 (none yet). */
#define SEEN_MAX   65536 /* seqs (512 KiB): the profiler's default ring holds as many events */
#define SEEN_FIRST 64    /* seqs (512 bytes) */

/* The record's bytes hashed (its seq included), never 0. */
static uint64_t seen_hash(const mt_event_rec_t *ev)
{
    uint64_t w[sizeof(*ev) / 8], h = 0x9e3779b97f4a7c15u;
    memcpy(w, ev, sizeof w);
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
        h ^= w[i] + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdu;
    }
    return (h ^ (h >> 33)) | 1;
}

/* Takes ev's hash, before ev is counted in p (its next_seq). An event out of order makes the
 * table unread from then on: not taken. The table grows to hold the seqs taken since the
 * first (their hashes moved to their places in the larger table), up to SEEN_MAX. */
static int seen_push(proc_t *p, const mt_event_rec_t *ev)
{
    if (p->unordered || ev->seq < p->next_seq)
        return 0;
    if (p->seen == NULL) {
        if ((p->seen = calloc(SEEN_FIRST, sizeof *p->seen)) == NULL)
            return MT_ENOMEM;
        p->seen_cap = SEEN_FIRST;
        p->seen_first = ev->seq;
    }
    uint64_t span = ev->seq - p->seen_first; /* in order: the first one taken is the least */
    if (span >= p->seen_cap && p->seen_cap < SEEN_MAX) {
        size_t cap = p->seen_cap;
        while (cap < SEEN_MAX && span >= cap)
            cap *= 2;
        uint64_t *h = calloc(cap, sizeof *h);
        if (h == NULL)
            return MT_ENOMEM;
        for (size_t i = 0; i < p->seen_cap; i++) {
            /* the one seq of [s0, s0 + seen_cap) at i */
            uint64_t s = p->seen_first + ((i - p->seen_first) & (p->seen_cap - 1));
            if (p->seen[i] != 0)
                h[s & (cap - 1)] = p->seen[i];
        }
        free(p->seen);
        p->seen = h;
        p->seen_cap = cap;
    }
    mt_assert(p->seen_cap == SEEN_MAX || ev->seq - p->seen_first < p->seen_cap);
    p->seen[ev->seq & (p->seen_cap - 1)] = seen_hash(ev);
    return 0;
}

mt__report_cfg_t mt__report_cfg_default(void)
{
    return (mt__report_cfg_t){.timeline_steps = 20,
                              .min_growth_bytes = 1u << 20,
                              .min_r2 = 0.8,
                              .top = 10,
                              .temporary_window_us = MT_MODEL_TEMP_WINDOW_US};
}

int mt__report_create(mt__report_t **out, const mt__report_cfg_t *cfg)
{
    *out = NULL;
    mt__report_t *r = calloc(1, sizeof(*r));
    if (!r)
        return MT_ENOMEM;
    if (mt__sym_create(&r->sym) != 0) {
        free(r);
        return MT_ENOMEM;
    }
    r->cfg = cfg ? *cfg : mt__report_cfg_default();
    r->fast = !r->cfg.general_reader;
    mt__spool_file_open(&r->spool, r->cfg.stream ? NULL : r->cfg.spill_dir);
    if (r->cfg.timeline_steps == 0)
        r->cfg.timeline_steps = 1;
    *out = r;
    return 0;
}

void mt__report_release(mt__report_t *r, proc_t *p)
{
    free(p->seen);
    p->seen = NULL;
    p->seen_cap = 0;
    mt__model_destroy(&p->m);
    mt__model_destroy(&p->pm);
    free(p->lag);
    mt_assert(r->lag_total >= p->cap_lag);
    r->lag_total -= p->cap_lag;
    p->lag = NULL;
    p->nlag = p->npeak = p->cap_lag = 0;
    mt__report_outside_destroy(&p->outside);
    mt__scopes_fini(&p->sc);
    free(p->grid.pts);
    p->grid = (tl_grid_t){0};
    if (p->have_gap)
        mt__gap_free(&p->peak_gap);
    p->have_gap = false;
}

void mt__report_destroy(mt__report_t **pr)
{
    if (!pr || !*pr)
        return;
    mt__report_t *r = *pr;
    for (size_t i = 0; i < r->nprocs; i++) {
        proc_t *p = &r->procs[i];
        mt__spool_free(&p->evs);
        mt__report_release(r, p);
        mt__model_destroy(&r->procs[i].tables);
        for (int t = 0; t < MT_TAG_MAX; t++)
            free(r->procs[i].tag_names[t]);
    }
    free(r->procs);
    mt__amap_fini(&r->by_pid);
    mt__spool_file_close(&r->spool);
    mt__sym_destroy(&r->sym);
    free(r);
    *pr = NULL;
}

/* The key of pid in the report's index (util's table holds no key 0). */
static uint64_t pid_key(int pid)
{
    return (uint64_t)(uint32_t)pid + 1;
}

static proc_t *proc_get(mt__report_t *r, int pid)
{
    /* Lines of one process come in runs: the last one found first. At most one process of a
     * pid is not shadowed, the one the index names. */
    if (r->last < r->nprocs && r->procs[r->last].pid == pid && !r->procs[r->last].shadowed)
        return &r->procs[r->last];
    uint64_t i;
    if (mt__amap_get(&r->by_pid, pid_key(pid), &i) == 0) {
        mt_assert(i < r->nprocs && r->procs[i].pid == pid && !r->procs[i].shadowed);
        return &r->procs[r->last = (size_t)i];
    }
    if (mt__amap_put(&r->by_pid, pid_key(pid), r->nprocs) != 0)
        return NULL;
    if (r->nprocs == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 8;
        proc_t *p = realloc(r->procs, cap * sizeof(*p));
        if (!p) {
            (void)mt__amap_del(&r->by_pid, pid_key(pid));
            return NULL;
        }
        r->procs = p;
        r->cap = cap;
    }
    r->last = r->nprocs;
    proc_t *p = &r->procs[r->nprocs++];
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    p->job = mt_prof_job_unknown();
    mt__scopes_init(&p->sc);
    return p;
}

/* Two processes, not one: each names its rank or its job and they differ. */
static bool other_rank(const mt_prof_job_t *a, const mt_prof_job_t *b)
{
    return (a->rank >= 0 && b->rank >= 0 && a->rank != b->rank) ||
           (a->id[0] && b->id[0] && strcmp(a->id, b->id) != 0);
}

/* The process of a hello line: pid's, unless that one is another rank or job (ranks on two
 * hosts may have the same pid; their logs are read one after the other). NULL: no memory. */
static proc_t *proc_of_hello(mt__report_t *r, int pid, const json_t *hello)
{
    mt_prof_job_t job;
    bool ranked = mt_prof_job_from_json(hello, &job);
    proc_t *p = proc_get(r, pid);
    if (p && ranked && other_rank(&p->job, &job)) {
        p->shadowed = true; /* out of the index: the next of pid is a new process */
        (void)mt__amap_del(&r->by_pid, pid_key(pid));
        p = proc_get(r, pid);
    }
    if (p && ranked)
        p->job = job;
    return p;
}

/* Is ev already among p's events? Logs read one after the other may hold the same event
 * twice: the daemon's log and the program's own, when the program took its ring over after
 * the daemon went away (a killed daemon may have read events it never acknowledged). Only
 * an identical record counts: a pid reused by a later process has seqs of its own. Among
 * the events kept, or with cfg.stream by its hash (two records that differ have the same one
 * with a chance of 2^-63) among the newest SEEN_MAX seqs (as many as the profiler's default
 * ring, which bounds the overlap): an older one read again is then kept, as an event out of
 * order. */
static bool already_read(mt__report_t *r, const proc_t *p, const mt_event_rec_t *ev)
{
    if (p->unordered || ev->seq >= p->next_seq)
        return false;
    if (r->cfg.stream)
        return p->seen && p->next_seq - ev->seq <= SEEN_MAX &&
               p->seen[ev->seq & (p->seen_cap - 1)] == seen_hash(ev);
    /* An event the spool's file cannot give back counts as not read. */
    bool found;
    return mt__spool_find(&p->evs, &r->spool, ev, &found) == 0 && found;
}

/* ---- the analysis as events arrive ---- */

int mt__report_model_new(const mt__report_cfg_t *cfg, const proc_t *p, mt_model_t **out)
{
    mt_model_cfg_t mc = {.keep_iterations = true, .temporary_window_us = cfg->temporary_window_us};
    if (mt__model_create(out, &mc) != 0)
        return MT_ENOMEM;
    mt__model_lifetimes_from(*out, p->t_known);
    if (p->tables && mt__model_tables_copy(*out, p->tables) != 0) {
        mt__model_destroy(out);
        return MT_ENOMEM;
    }
    return 0;
}

/* p's model, created at its first event. NULL: no memory. */
static mt_model_t *proc_model(const mt__report_cfg_t *cfg, proc_t *p)
{
    if (p->m)
        return p->m;
    if (mt__report_model_new(cfg, p, &p->m) != 0)
        return NULL;
    if (mt__report_outside_create(&p->outside) != 0) {
        mt__model_destroy(&p->m);
        return NULL;
    }
    return p->m;
}

/* The grid's points crossed by an event at time t (before it is applied), from m's state:
 * its figures with the free extents kept from one point to the next (a sort of every live
 * block at each point was n log n per point). */
static int grid_before(tl_grid_t *g, mt_model_t *m, uint64_t t, unsigned steps)
{
    if (g->cap == 0) {
        size_t cap = (size_t)steps * TL_GRID_PER_STEP + 1;
        if (!(g->pts = malloc(cap * sizeof(*g->pts))))
            return MT_ENOMEM;
        *g = (tl_grid_t){.pts = g->pts, .cap = cap, .origin = t, .w = 1};
    }
    if (t <= g->origin)
        return 0;
    unsigned __int128 d = t - g->origin;
    bool have = false;
    tl_pt_t pt;
    while (d > (unsigned __int128)g->next * g->w) {
        if (g->next == g->cap) { /* the span passed the grid's: every other point goes */
            size_t half = (g->cap - 1) / 2;
            for (size_t j = 1; j <= half; j++) {
                tl_pt_t a = g->pts[2 * j - 1], b = g->pts[2 * j];
                g->pts[j] = b;
                g->pts[j].max = a.max > b.max ? a.max : b.max;
            }
            g->next = half + 1;
            g->w *= 2;
            continue;
        }
        if (!have) {
            mt_model_figures_t f;
            if (mt__model_figures_kept(m, MT_MODEL_DEVICE, &f) != 0)
                return MT_ENOMEM;
            pt = (tl_pt_t){f.allocated, f.reserved, f.utilization, f.fragmentation, 0, g->last};
            have = true;
        }
        pt.max = g->run > pt.allocated ? g->run : pt.allocated;
        g->pts[g->next++] = pt;
        g->run = pt.allocated;
    }
    return 0;
}

/* ev into p's analysis: the timeline's grid, the model, outside memory, scopes, the peak. */
static int analyse_event(mt__report_t *r, proc_t *p, const mt_event_rec_t *ev)
{
    const mt__report_cfg_t *cfg = &r->cfg;
    mt_model_t *m = proc_model(cfg, p);
    if (!m)
        return MT_ENOMEM;
    if (grid_before(&p->grid, m, ev->time_ns, cfg->timeline_steps) != 0)
        return MT_ENOMEM;
    if (p->peak_pending && mt__report_peak_before(p, m, ev) != 0)
        return MT_ENOMEM;
    if (mt__model_apply(m, ev) != 0 || mt__report_outside_step(p->outside, m, ev) != 0)
        return MT_ENOMEM; /* only MT_ENOMEM: the analysis would not be the events' */
    p->host_events += ev->pool == MT_POOL_HOST && ev->kind != MT_EV_GAP;
    mt_model_figures_t f;
    mt__model_figures_totals(m, MT_MODEL_DEVICE, &f);
    p->grid.run = f.allocated > p->grid.run ? f.allocated : p->grid.run;
    if (ev->time_ns > p->grid.origin && ev->time_ns - p->grid.origin > p->grid.last)
        p->grid.last = ev->time_ns - p->grid.origin;
    if (mt__scopes_event(&p->sc, ev, f.allocated) != 0)
        return MT_ENOMEM;
    return mt__report_peak_after(r, p, ev, f.allocated);
}

/* mt__report_add_event with the tag's name as tag_name[0..tag_len) (NUL-terminated when
 * shorter), so that a name borrowed from a line needs no copy of its own. */
static int add_event(mt__report_t *r, int pid, const mt_event_rec_t *ev, const char *tag_name,
                     size_t tag_len)
{
    proc_t *p = proc_get(r, pid);
    if (!p)
        return MT_ENOMEM;
    if (ev->kind == MT_EV_TAG_LABEL) {
        /* The allocator's announcement names the tag (it carries no figures); a name taken
         * from an earlier line gives way to it. It is replayed too: it has a seq. */
        char label[MT_EVENT_LABEL_MAX + 1];
        mt_event_label_unpack(ev, label);
        char *dup = strdup(label);
        if (!dup)
            return MT_ENOMEM;
        free(p->tag_names[ev->tag % MT_TAG_MAX]);
        p->tag_names[ev->tag % MT_TAG_MAX] = dup;
    }
    if (ev->kind == MT_EV_GAP) { /* the model sees the gap as the seq jump it leaves */
        p->lost = mt_model_sat_add(p->lost, ev->size);
        return 0;
    }
    if (already_read(r, p, ev)) {
        p->duplicates++;
        r->duplicates++;
        return 0;
    }
    int rc = r->cfg.stream ? seen_push(p, ev) : mt__spool_push(&p->evs, &r->spool, ev);
    if (rc != 0)
        return rc;
    if (!r->cfg.replay_only && !p->failed && analyse_event(r, p, ev) != 0)
        p->failed = true;
    if (p->nev++ == 0 || ev->time_ns < p->t_min)
        p->t_min = ev->time_ns;
    if (ev->time_ns > p->t_max)
        p->t_max = ev->time_ns;
    if (ev->seq >= p->next_seq)
        p->next_seq = ev->seq + 1;
    else
        p->unordered = true;
    if (ev->kind == MT_EV_TAG_LABEL)
        p->labels++;
    else
        r->events++;
    if (tag_name && !p->tag_names[ev->tag % MT_TAG_MAX])
        p->tag_names[ev->tag % MT_TAG_MAX] = strndup(tag_name, tag_len);
    return 0;
}

int mt__report_add_event(mt__report_t *r, int pid, const mt_event_rec_t *ev, const char *tag_name)
{
    return add_event(r, pid, ev, tag_name, SIZE_MAX);
}

int mt__report_add_ref(mt__report_t *r, int pid, const mt_event_rec_t *ev)
{
    uint64_t n = r->events;
    int rc = mt__report_add_event(r, pid, ev, NULL);
    if (rc == 0 && r->events > n) {
        r->events = n;
        proc_get(r, pid)->added++; /* found: the event was just added to it */
    }
    return rc;
}

int mt__report_set_process(mt__report_t *r, int pid, const char *name, int exit_state)
{
    proc_t *p = proc_get(r, pid);
    if (!p)
        return MT_ENOMEM;
    if (name)
        snprintf(p->name, sizeof(p->name), "%s", name);
    if (exit_state == 1 || exit_state == 2)
        p->exit_state = exit_state;
    return 0;
}

int mt__report_set_untimed(mt__report_t *r, int pid)
{
    proc_t *p = proc_get(r, pid);
    if (!p)
        return MT_ENOMEM;
    p->untimed = true;
    return 0;
}

int mt__report_set_snapshot(mt__report_t *r, int pid, bool state_only, uint64_t trace_ns,
                            size_t skipped)
{
    proc_t *p = proc_get(r, pid);
    if (!p)
        return MT_ENOMEM;
    p->snapshot = state_only ? 2 : 1;
    p->snap_skipped = skipped;
    p->t_known = trace_ns;
    if (p->m != NULL)
        mt__model_lifetimes_from(p->m, trace_ns);
    return 0;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        rc = MT_EPROTO;                                                                            \
        goto out;                                                                                  \
    } while (0)
/* Not the line's fault: no host memory to hold what it says. */
#define NOMEM()                                                                                    \
    do {                                                                                           \
        snprintf(err, errlen, "out of memory");                                                    \
        rc = MT_ENOMEM;                                                                            \
        goto out;                                                                                  \
    } while (0)

int mt__report_add_decoded(mt__report_t *r, int pid, const mt_event_rec_t *ev, const char *tag,
                           size_t tag_len)
{
    r->lines++;
    return add_event(r, pid, ev, tag, tag_len);
}

bool mt__report_decodes(const mt__report_t *r)
{
    return r->fast;
}

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
    if (r->fast) {
        mt_event_rec_t ev;
        int pid;
        const char *tag;
        size_t tag_len;
        /* A negative pid is left to the general path, which reads it as a consumer
         * queue's gap whatever the type. */
        if (mt__ndjson_event(line, len, &ev, &pid, &tag, &tag_len) && pid >= 0) {
            if (add_event(r, pid, &ev, tag, tag_len) != 0) {
                snprintf(err, errlen, "out of memory");
                return MT_ENOMEM;
            }
            return 0;
        }
    }
    json_error_t jerr;
    errno = 0; /* jansson 2.14 leaves jerr empty when an allocation fails: errno says it */
    json_t *j = json_loadb(line, len, 0, &jerr);
    int rc = 0;
    if (!j && (json_error_code(&jerr) == json_error_out_of_memory || errno == ENOMEM))
        NOMEM();
    if (!j)
        FAIL("not JSON: %s (column %d)", jerr.text, jerr.column);
    if (!json_is_object(j))
        FAIL("not a JSON object");
    json_t *v = json_object_get(j, "v");
    if (!json_is_integer(v) || json_integer_value(v) != 1)
        FAIL("unsupported or missing schema version \"v\" (want 1)");
    const char *type = json_string_value(json_object_get(j, "type"));
    json_t *jp = json_object_get(j, "pid");
    if (!type && json_object_get(j, "kind")) { /* a stack table or module map line */
        char why[160] = "";
        if (!json_is_integer(jp))
            FAIL("%s: missing \"pid\"", json_string_value(json_object_get(j, "kind")));
        proc_t *p = proc_get(r, (int)json_integer_value(jp));
        if (!p || (!p->tables && mt__model_create(&p->tables, NULL) != 0))
            NOMEM();
        int trc = mt__model_table_line(p->tables, j, why, sizeof why);
        if (trc == MT_ENOMEM)
            NOMEM();
        /* The analysis's model takes it too when it exists (else it copies the tables when
         * created). */
        if (trc > 0 && p->m && mt__model_table_line(p->m, j, why, sizeof why) == MT_ENOMEM)
            p->failed = true;
        if (trc < 0)
            FAIL("%s", why);
        if (trc == 0)
            FAIL("unknown line kind \"%s\"", json_string_value(json_object_get(j, "kind")));
        goto out;
    }
    if (!type)
        FAIL("missing \"type\"");
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
        const char *tn = json_string_value(json_object_get(j, "tag"));
        if (mt__report_add_event(r, pid, &ev, tn) != 0)
            NOMEM();
    } else if (strcmp(type, "process_event") == 0) {
        /* The daemon's log: {"event":"register"|"exit","pid","name","reason"}. */
        const char *what = json_string_value(json_object_get(j, "event"));
        if (!json_is_integer(jp) || !what)
            FAIL("process_event: missing \"pid\" or \"event\"");
        proc_t *p = proc_get(r, (int)json_integer_value(jp));
        if (!p)
            NOMEM();
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
        proc_t *p = type[0] == 'h' ? proc_of_hello(r, (int)json_integer_value(jp), j)
                                   : proc_get(r, (int)json_integer_value(jp));
        if (!p)
            NOMEM();
        if (type[0] == 'h') {
            const char *name = json_string_value(json_object_get(j, "name"));
            snprintf(p->name, sizeof(p->name), "%s", name ? name : "");
        } else {
            p->exit_state = json_is_true(json_object_get(j, "clean")) ? 1 : 2;
        }
    }
    /* Other record types (process state, snapshots, daemon records) are not used. */
out:
    if (rc == MT_EPROTO)
        r->malformed++;
    json_decref(j);
    return rc;
}

/* ---- replay for plots ---- */

size_t mt__report_process_count(const mt__report_t *r)
{
    return r->nprocs;
}

size_t mt__report_events_read(const mt__report_t *r, size_t i)
{
    if (i >= r->nprocs)
        return 0;
    const proc_t *p = &r->procs[i];
    return p->nev - p->labels - p->added;
}

bool mt__report_untimed(const mt__report_t *r, size_t i)
{
    return i < r->nprocs && r->procs[i].untimed;
}

bool mt__report_state_only(const mt__report_t *r, size_t i)
{
    return i < r->nprocs && r->procs[i].snapshot == 2;
}

int mt__report_process(const mt__report_t *r, size_t i, int *pid, const char **name, size_t *events)
{
    if (i >= r->nprocs)
        return MT_EINVAL;
    *pid = r->procs[i].pid;
    *name = r->procs[i].name;
    *events = r->procs[i].nev;
    return 0;
}

const char *mt__report_tag_name(const mt__report_t *r, size_t i, int tag, char *buf, size_t len)
{
    return mt__report_tag_str(&r->procs[i], tag, buf, len);
}

mt_sym_t *mt__report_symbolizer(mt__report_t *r)
{
    return r->sym;
}
