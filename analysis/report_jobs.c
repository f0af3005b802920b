/* The report of one job's ranks (docs/fleet.md "Ranks and jobs"): the logs of N ranks, read
 * together, give one table per job of each rank's peaks, and name the rank that peaked
 * highest and by how much it exceeds the median rank: "rank 5 runs out and the others do
 * not" becomes a row that stands out, whose process section then says why.
 *
 * Peaks are each process's own maxima, so they compare across hosts whatever their clocks;
 * each rank's timeline starts at its own first event ("timeline_origin": "first_event"),
 * since the hosts' clocks may differ. */
#include "analysis/report.h"

#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

/* At most this many missing ranks are listed (the count is always given). */
#define MISSING_LISTED 64

typedef struct row_s {
    const json_t *p; /* the process's report (borrowed) */
    int rank;
    uint64_t peak_alloc, peak_res;
} row_t;

static uint64_t u(const json_t *o, const char *k)
{
    json_int_t v = json_integer_value(json_object_get(o, k));
    return v > 0 ? (uint64_t)v : 0;
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
        json_t *lr = json_object_get(p, "local_rank");
        bad |= !r || (lr && json_object_set(r, "local_rank", lr) != 0) ||
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
    g = json_pack("{s:s, s:o, s:{s:i, s:O, s:I, s:I, s:I}, s:I, s:I, s:I, s:O}", "timeline_origin",
                  "first_event", "ranks", ranks, "highest", "rank", h->rank, "pid",
                  json_object_get(h->p, "pid"), "peak_allocated", (json_int_t)h->peak_alloc,
                  "peak_reserved", (json_int_t)h->peak_res, "above_median_bytes",
                  (json_int_t)(h->peak_alloc - median), "median_peak_allocated", (json_int_t)median,
                  "spread_bytes", (json_int_t)(peaks[n - 1] - peaks[0]), "missing",
                  (json_int_t)nmissing, "missing_ranks", missing);
    ranks = NULL; /* g's, or freed by json_pack's failure */
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
            rows[nr++] = (row_t){p, (int)json_integer_value(json_object_get(p, "rank")),
                                 u(p, "peak_allocated"), u(p, "peak_reserved")};
        }
        qsort(rows, nr, sizeof *rows, cmp_rank);
        json_t *g = group_json(id, rows, nr);
        if (!g || json_array_append_new(jobs, g) != 0)
            goto fail;
    }
    free(rows);
    free(done);
    return jobs;
fail:
    json_decref(jobs);
    free(rows);
    free(done);
    return NULL;
}
