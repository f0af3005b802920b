/* The report of one job's ranks (docs/fleet.md "Ranks and jobs"): the logs of N ranks, read
 * together, give one table per job of each rank's peaks, and name the rank that peaked
 * highest and by how much it exceeds the median rank: "rank 5 runs out and the others do
 * not" becomes a row that stands out, whose process section then says why.
 *
 * Peaks are each process's own maxima, so they compare across hosts whatever their clocks.
 * Timelines are aligned by iteration marks, not by wall clock (the hosts' clocks differ):
 * each rank's peak within the span of each iteration, for the newest iterations every rank
 * marked, and the iteration in which each rank peaked. A rank that marked nothing is named;
 * then the ranks are not aligned and each timeline starts at its own first event. The
 * highest rank's difference to the median rank is given by tag. Each rank's row also says
 * how much of its device was outside memtrace's allocator when the device was fullest (from
 * its process's "device_memory") and how many OOMs it had: a rank that runs out with the
 * same peaks as the others is told apart by what it holds outside. */
#include "analysis/report.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

/* At most this many missing ranks are listed (the count is always given). */
#define MISSING_LISTED 64
/* The iterations the ranks' table shows: the newest this many that every rank marked. */
#define ITERATIONS_SHOWN 8
/* Tags named in the highest rank's difference to the median rank. */
#define TAGS_SHOWN 8

/* One span: the opening mark's iteration number and the span's peak. */
typedef struct span_s {
    uint64_t it, peak;
} span_t;

typedef struct row_s {
    const json_t *p; /* the process's report (borrowed) */
    int rank;
    uint64_t peak_alloc, peak_res;
    span_t *spans; /* its "spans.last", sorted by iteration; NULL when it marked nothing */
    size_t nspans;
} row_t;

int mt__report_spans_json(const mt_model_t *m, json_t **out)
{
    size_t n = mt__model_spans(m), k;
    *out = NULL;
    if (n == 0)
        return 0;
    json_t *last = json_array();
    for (size_t i = n > MT_REPORT_SPANS_KEPT ? n - MT_REPORT_SPANS_KEPT : 0; last && i < n; i++) {
        mt_model_span_t sp;
        if (mt__model_span(m, i, &sp) != 0 ||
            json_array_append_new(
                last, json_pack("[I,I]", (json_int_t)sp.iteration, (json_int_t)sp.peak)) != 0) {
            json_decref(last);
            return MT_ENOMEM;
        }
    }
    json_t *pi = json_null();
    mt_model_span_t ps;
    if (mt__model_peak_span(m, &k) == 0 && mt__model_span(m, k, &ps) == 0)
        pi = json_integer((json_int_t)ps.iteration);
    *out = json_pack("{s:I, s:o, s:o}", "count", (json_int_t)n, "peak_iteration", pi, "last", last);
    return *out ? 0 : MT_ENOMEM;
}

static int cmp_span(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return (x->it > y->it) - (x->it < y->it);
}

/* r's spans from its process's report, sorted; 0, or MT_ENOMEM. */
static int read_spans(row_t *r)
{
    const json_t *last = json_object_get(json_object_get(r->p, "spans"), "last");
    size_t n = json_array_size(last);
    r->spans = NULL;
    r->nspans = 0;
    if (n == 0)
        return 0;
    if ((r->spans = malloc(n * sizeof *r->spans)) == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(last, i);
        json_int_t it = json_integer_value(json_array_get(e, 0));
        json_int_t pk = json_integer_value(json_array_get(e, 1));
        r->spans[r->nspans++] = (span_t){(uint64_t)it, pk > 0 ? (uint64_t)pk : 0};
    }
    qsort(r->spans, r->nspans, sizeof *r->spans, cmp_span);
    return 0;
}

static const span_t *span_of(const row_t *r, uint64_t it)
{
    span_t key = {it, 0};
    return r->spans ? bsearch(&key, r->spans, r->nspans, sizeof key, cmp_span) : NULL;
}

/* The newest ITERATIONS_SHOWN iterations every rank has a span for, with each rank's peak
 * in it, oldest first. Called only when every row has spans. NULL without memory. */
static json_t *aligned_json(const row_t *rows, size_t n)
{
    json_t *out = json_array();
    uint64_t picked[ITERATIONS_SHOWN];
    size_t np = 0;
    /* Candidates: rank rows[0]'s iterations, newest first; dropping duplicates. */
    for (size_t c = rows[0].nspans; out && c-- > 0 && np < ITERATIONS_SHOWN;) {
        uint64_t it = rows[0].spans[c].it;
        if (c + 1 < rows[0].nspans && rows[0].spans[c + 1].it == it)
            continue;
        bool all = true;
        for (size_t i = 1; i < n && all; i++)
            all = span_of(&rows[i], it) != NULL;
        if (all)
            picked[np++] = it;
    }
    for (size_t j = np; out && j-- > 0;) {
        json_t *peaks = json_array();
        for (size_t i = 0; peaks && i < n; i++) {
            const span_t *sp = span_of(&rows[i], picked[j]);
            if (json_array_append_new(peaks, json_integer((json_int_t)sp->peak)) != 0) {
                json_decref(peaks);
                peaks = NULL;
            }
        }
        if (json_array_append_new(out, json_pack("{s:I, s:o}", "iteration", (json_int_t)picked[j],
                                                 "peaks", peaks)) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

typedef struct tagdiff_s {
    const char *tag;
    uint64_t bytes;
} tagdiff_t;

static int cmp_tagdiff(const void *a, const void *b)
{
    const tagdiff_t *x = a, *y = b;
    return (x->bytes < y->bytes) - (x->bytes > y->bytes);
}

/* Bytes of one name (a tag, or a call site) in a process's report: from an object (name ->
 * bytes) or from an array of rows (row[key] = name, row["bytes"]). */
static json_int_t bytes_of(const json_t *set, const char *key, const char *name)
{
    if (json_is_object(set))
        return json_integer_value(json_object_get(set, name));
    size_t i;
    const json_t *row;
    json_array_foreach(set, i, row)
    {
        const char *n = json_string_value(json_object_get(row, key));
        if (n && strcmp(n, name) == 0)
            return json_integer_value(json_object_get(row, "bytes"));
    }
    return 0;
}

/* The names whose bytes in hs (the highest rank's) exceed those in ms (the median rank's),
 * largest difference first, at most TAGS_SHOWN, as [{out_key: name, bytes}]. hs and ms are
 * both objects (peak_by_tag) or both arrays of rows named by key (callsites.at_peak). */
static json_t *diff_json(const json_t *hs, const json_t *ms, const char *key, const char *out_key)
{
    size_t n = json_is_object(hs) ? json_object_size(hs) : json_array_size(hs), nd = 0, i;
    tagdiff_t *d = malloc((n ? n : 1) * sizeof *d);
    json_t *out = json_array();
    const char *k;
    const json_t *v;
    if (!d || !out)
        goto fail;
    if (json_is_object(hs)) {
        json_object_foreach((json_t *)hs, k, v)
        {
            json_int_t a = json_integer_value(v), b = bytes_of(ms, key, k);
            if (a > b)
                d[nd++] = (tagdiff_t){k, (uint64_t)(a - b)};
        }
    } else {
        json_array_foreach(hs, i, v)
        {
            k = json_string_value(json_object_get(v, key));
            json_int_t a = json_integer_value(json_object_get(v, "bytes"));
            json_int_t b = k ? bytes_of(ms, key, k) : 0;
            if (k && a > b)
                d[nd++] = (tagdiff_t){k, (uint64_t)(a - b)};
        }
    }
    qsort(d, nd, sizeof *d, cmp_tagdiff);
    for (i = 0; i < nd && i < TAGS_SHOWN; i++)
        if (json_array_append_new(out, json_pack("{s:s, s:I}", out_key, d[i].tag, "bytes",
                                                 (json_int_t)d[i].bytes)) != 0)
            goto fail;
    free(d);
    return out;
fail:
    free(d);
    json_decref(out);
    return NULL;
}

/* Adds to highest its difference to the median rank's process by tag, and by call site when
 * the processes' reports have call sites at their peaks. 0, or MT_ENOMEM. */
static int add_diffs(json_t *highest, const json_t *hi, const json_t *med)
{
    json_t *tags = diff_json(json_object_get(hi, "peak_by_tag"),
                             json_object_get(med, "peak_by_tag"), NULL, "tag");
    if (!tags || json_object_set_new(highest, "above_median_by_tag", tags) != 0)
        return MT_ENOMEM;
    const json_t *hs = json_object_get(json_object_get(hi, "callsites"), "at_peak");
    if (!json_is_array(hs))
        return 0;
    const json_t *ms = json_object_get(json_object_get(med, "callsites"), "at_peak");
    json_t *empty = json_array();
    json_t *sites = empty ? diff_json(hs, json_is_array(ms) ? ms : empty, "site", "site") : NULL;
    json_decref(empty);
    if (!sites || json_object_set_new(highest, "above_median_by_site", sites) != 0)
        return MT_ENOMEM;
    return 0;
}

static uint64_t u(const json_t *o, const char *k)
{
    json_int_t v = json_integer_value(json_object_get(o, k));
    return v > 0 ? (uint64_t)v : 0;
}

/* A rank's outside bytes: on each of its devices, the bytes outside memtrace's allocator
 * (used - reserved) when that device's used bytes peaked, summed. The moment the device was
 * fullest is the one that decides an OOM, so that is where outside is read, not its own
 * maximum at another time. */
static json_int_t outside_at_peak(const json_t *devices)
{
    uint64_t sum = 0;
    size_t i;
    const json_t *d;
    json_array_foreach(devices, i, d)
    {
        uint64_t v = u(json_object_get(d, "at_peak_used"), "outside");
        sum = sum + v < sum ? UINT64_MAX : sum + v;
    }
    return sum > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)sum;
}

static int cmp_rank(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static const char *job_of(const json_t *p)
{
    const char *j = json_string_value(json_object_get(p, "job"));
    return j ? j : "";
}

/* The group of job id, rows[0..n) sorted by rank. */
static json_t *group_json(const char *id, row_t *rows, size_t n)
{
    json_t *ranks = json_array(), *missing = json_array();
    uint64_t *peaks = malloc(n * sizeof *peaks);
    json_t *g = NULL;
    int bad = !ranks || !missing || !peaks;
    size_t hi = 0;
    int world = -1;
    for (size_t i = 0; i < n && !bad; i++) {
        const json_t *p = rows[i].p;
        json_t *r = json_pack(
            "{s:i, s:O, s:s, s:I, s:I}", "rank", rows[i].rank, "pid", json_object_get(p, "pid"),
            "name", json_string_value(json_object_get(p, "name")) ?: "", "peak_allocated",
            (json_int_t)rows[i].peak_alloc, "peak_reserved", (json_int_t)rows[i].peak_res);
        const json_t *dm = json_object_get(p, "device_memory");
        if (r && json_is_array(dm) &&
            json_object_set_new(r, "outside_bytes", json_integer(outside_at_peak(dm))) != 0)
            bad = 1;
        if (r &&
            json_object_set_new(
                r, "ooms", json_integer((json_int_t)u(json_object_get(p, "ooms"), "count"))) != 0)
            bad = 1;
        json_t *lr = json_object_get(p, "local_rank");
        json_t *pi = json_object_get(json_object_get(p, "spans"), "peak_iteration");
        bad |= !r || (lr && json_object_set(r, "local_rank", lr) != 0) ||
               json_object_set(r, "peak_iteration", pi ? pi : json_null()) != 0 ||
               json_array_append_new(ranks, r) != 0;
        peaks[i] = rows[i].peak_alloc;
        if (rows[i].peak_alloc > rows[hi].peak_alloc)
            hi = i; /* ties: the lowest rank */
        json_t *w = json_object_get(p, "world_size");
        if (json_is_integer(w) && json_integer_value(w) > world)
            world = (int)json_integer_value(w);
    }
    if (bad)
        goto done;
    qsort(peaks, n, sizeof *peaks, cmp_u64);
    uint64_t median = peaks[(n - 1) / 2]; /* an even count: the lower middle one */
    /* Ranks 0..world_size-1 with no log among those read. */
    size_t nmissing = 0, k = 0;
    for (int r = 0; r < world && !bad; r++) {
        while (k < n && rows[k].rank < r)
            k++;
        if (k < n && rows[k].rank == r)
            continue;
        if (nmissing++ < MISSING_LISTED)
            bad |= json_array_append_new(missing, json_integer(r)) != 0;
    }
    const row_t *h = &rows[hi];
    size_t med = 0; /* the rank whose peak is the median: the lowest such */
    while (med < n && rows[med].peak_alloc != median)
        med++;
    json_t *unmarked = json_array();
    bool all_marked = true;
    for (size_t i = 0; i < n && unmarked; i++) {
        if (rows[i].nspans == 0) {
            all_marked = false;
            if (json_array_append_new(unmarked, json_integer(rows[i].rank)) != 0) {
                json_decref(unmarked);
                unmarked = NULL;
            }
        }
    }
    json_t *aligned = all_marked ? aligned_json(rows, n) : json_array();
    bad |= !unmarked || !aligned;
    if (bad) {
        json_decref(unmarked);
        json_decref(aligned);
        goto done;
    }
    g = json_pack("{s:s, s:s, s:o, s:o, s:o, s:{s:i, s:O, s:I, s:I, s:I, s:i}, s:I, s:I, "
                  "s:I, s:O}",
                  "timeline_origin", "first_event", "aligned_by",
                  all_marked ? "iteration" : "first_event", "unmarked_ranks", unmarked,
                  "iterations", aligned, "ranks", ranks, "highest", "rank", h->rank, "pid",
                  json_object_get(h->p, "pid"), "peak_allocated", (json_int_t)h->peak_alloc,
                  "peak_reserved", (json_int_t)h->peak_res, "above_median_bytes",
                  (json_int_t)(h->peak_alloc - median), "median_rank",
                  rows[med < n ? med : hi].rank, "median_peak_allocated", (json_int_t)median,
                  "spread_bytes", (json_int_t)(peaks[n - 1] - peaks[0]), "missing",
                  (json_int_t)nmissing, "missing_ranks", missing);
    ranks = NULL; /* g's, or freed by json_pack's failure */
    if (g && add_diffs(json_object_get(g, "highest"), h->p, rows[med < n ? med : hi].p) != 0) {
        json_decref(g);
        g = NULL;
    }
    if (g && ((id[0] && json_object_set_new(g, "job", json_string(id)) != 0) ||
              (world > 0 && json_object_set_new(g, "world_size", json_integer(world)) != 0))) {
        json_decref(g);
        g = NULL;
    }
done:
    json_decref(ranks);
    json_decref(missing);
    free(peaks);
    return g;
}

json_t *mt__report_job_view(const json_t *p)
{
    /* every member read above, and in mt__report_jobs_json */
    static const char *const members[] = {
        "rank",          "job",        "pid",        "name",  "peak_allocated", "peak_reserved",
        "device_memory", "local_rank", "world_size", "spans", "ooms",           "peak_by_tag"};
    json_t *v = json_object();
    if (v == NULL || !json_is_integer(json_object_get(p, "rank")))
        return v;
    for (size_t k = 0; k < sizeof members / sizeof *members; k++) {
        json_t *m = json_object_get(p, members[k]);
        if (m != NULL && json_object_set(v, members[k], m) != 0) {
            json_decref(v);
            return NULL;
        }
    }
    json_t *at = json_object_get(json_object_get(p, "callsites"), "at_peak");
    if (at != NULL && json_object_set_new(v, "callsites", json_pack("{s:O}", "at_peak", at)) != 0) {
        json_decref(v);
        return NULL;
    }
    return v;
}

json_t *mt__report_jobs_json(const json_t *procs)
{
    size_t n = json_array_size(procs), nr = 0;
    json_t *jobs = json_array();
    row_t *rows = malloc((n ? n : 1) * sizeof *rows);
    bool *done = calloc(n ? n : 1, sizeof *done);
    if (!jobs || !rows || !done)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_array_get(procs, i);
        done[i] = !json_is_integer(json_object_get(p, "rank"));
    }
    /* One group per job id, in the order of the first process of each. */
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        const char *id = job_of(json_array_get(procs, i));
        nr = 0;
        for (size_t j = i; j < n; j++) {
            const json_t *p = json_array_get(procs, j);
            if (done[j] || strcmp(job_of(p), id) != 0)
                continue;
            done[j] = true;
            rows[nr] = (row_t){p,
                               (int)json_integer_value(json_object_get(p, "rank")),
                               u(p, "peak_allocated"),
                               u(p, "peak_reserved"),
                               NULL,
                               0};
            if (read_spans(&rows[nr++]) != 0)
                goto fail_rows;
        }
        qsort(rows, nr, sizeof *rows, cmp_rank);
        json_t *g = group_json(id, rows, nr);
        for (size_t j = 0; j < nr; j++)
            free(rows[j].spans);
        nr = 0;
        if (!g || json_array_append_new(jobs, g) != 0)
            goto fail;
    }
    free(rows);
    free(done);
    return jobs;
fail_rows:
    for (size_t j = 0; j < nr; j++)
        free(rows[j].spans);
fail:
    json_decref(jobs);
    free(rows);
    free(done);
    return NULL;
}
