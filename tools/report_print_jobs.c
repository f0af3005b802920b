/* The jobs of `memtrace report`'s text (report_print.c prints the rest): per job, a row per
 * rank, the rank that peaked highest and by which tags and sites it exceeds the median rank,
 * and the ranks side by side per iteration (docs/fleet.md). */
#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "tools/report_print_internal.h"

/* Columns of the per-iteration table: every rank up to this many, else the highest and the
 * median rank only. */
#define JOB_ITER_COLUMNS 8

/* The per-iteration table of a job aligned by its marks. */
static void print_job_iterations(json_t *g, json_t *ranks, json_t *h)
{
    json_t *its = json_object_get(g, "iterations"), *e, *r;
    size_t n = json_array_size(ranks), i, k;
    if (json_array_size(its) == 0) {
        printf("  no iteration that every rank marked\n");
        return;
    }
    bool all = n <= JOB_ITER_COLUMNS;
    printf("  peak allocated within each iteration (the newest every rank marked):\n    %9s",
           "ITERATION");
    json_array_foreach(ranks, k, r)
    {
        char col[24];
        snprintf(col, sizeof col, "rank %.0f", num(r, "rank"));
        if (all || num(r, "rank") == num(h, "rank") || num(r, "rank") == num(h, "median_rank"))
            printf(" %12s", col);
    }
    printf("\n");
    json_array_foreach(its, i, e)
    {
        char b[32];
        printf("    %9.0f", num(e, "iteration"));
        json_array_foreach(ranks, k, r)
        {
            if (all || num(r, "rank") == num(h, "rank") || num(r, "rank") == num(h, "median_rank"))
                printf(" %12s", human((double)json_integer_value(
                                          json_array_get(json_object_get(e, "peaks"), k)),
                                      b, sizeof b));
        }
        printf("\n");
    }
}

/* The report's "jobs": per job, a row per rank, the rank that peaked highest and by which
 * tags it exceeds the median rank, and the ranks side by side per iteration. */
void mt__report_print_jobs(json_t *jobs)
{
    size_t i, k;
    json_t *g, *r, *t;
    json_array_foreach(jobs, i, g)
    {
        char b1[32], b2[32], b3[32];
        esc_buf_t ej;
        const char *id = json_string_value(json_object_get(g, "job"));
        json_t *ranks = json_object_get(g, "ranks"), *h = json_object_get(g, "highest");
        json_t *unmarked = json_object_get(g, "unmarked_ranks");
        bool aligned = json_array_size(unmarked) == 0;
        printf("\njob %s: %zu rank%s", id ? esc(id, ej) : "(no job id)", json_array_size(ranks),
               json_array_size(ranks) == 1 ? "" : "s");
        if (json_object_get(g, "world_size"))
            printf(" of %.0f", num(g, "world_size"));
        if (num(g, "missing") > 0)
            printf(" (%.0f missing)", num(g, "missing"));
        if (aligned) {
            printf("; aligned by iteration marks (clocks of hosts differ)\n");
        } else {
            printf("; not aligned: rank");
            json_array_foreach(unmarked, k, r)
            {
                printf("%s %.0f", k ? "," : "", (double)json_integer_value(r));
            }
            printf(" marked no iterations, so each rank's timeline starts at its own first "
                   "event (clocks of hosts differ)\n");
        }
        printf("  %6s %8s %16s %16s %12s %6s %10s\n", "RANK", "PID", "PEAK ALLOCATED",
               "PEAK RESERVED", "OUTSIDE", "OOMS", "PEAK ITER");
        json_array_foreach(ranks, k, r)
        {
            bool top = num(r, "rank") == num(h, "rank") && json_array_size(ranks) > 1;
            json_t *pi = json_object_get(r, "peak_iteration");
            char it[24] = "-";
            if (json_is_integer(pi))
                snprintf(it, sizeof it, "%lld", (long long)json_integer_value(pi));
            char ob[32] = "-"; /* a log without device figures */
            if (json_object_get(r, "outside_bytes") != NULL)
                human(num(r, "outside_bytes"), ob, sizeof ob);
            printf("  %6.0f %8.0f %16s %16s %12s %6.0f %10s%s\n", num(r, "rank"), num(r, "pid"),
                   human(num(r, "peak_allocated"), b1, sizeof b1),
                   human(num(r, "peak_reserved"), b2, sizeof b2), ob, num(r, "ooms"), it,
                   top ? "  <- highest" : "");
        }
        if (json_array_size(ranks) < 2)
            continue;
        printf("  highest peak: rank %.0f, %s, %s above the median rank's %s (rank %.0f)\n",
               num(h, "rank"), human(num(h, "peak_allocated"), b1, sizeof b1),
               human(num(h, "above_median_bytes"), b2, sizeof b2),
               human(num(g, "median_peak_allocated"), b3, sizeof b3), num(h, "median_rank"));
        static const char *const diffs[][3] = {{"above_median_by_tag", "tag", "by tag"},
                                               {"above_median_by_site", "site", "by call site"}};
        for (int d = 0; d < 2; d++) {
            json_t *set = json_object_get(h, diffs[d][0]);
            if (json_array_size(set) == 0)
                continue;
            printf("    %s, at each one's peak:", diffs[d][2]);
            json_array_foreach(set, k, t)
            {
                esc_buf_t et;
                printf("%s %s +%s", k ? "," : "",
                       esc(json_string_value(json_object_get(t, diffs[d][1])), et),
                       human(num(t, "bytes"), b1, sizeof b1));
            }
            printf("\n");
        }
        if (aligned)
            print_job_iterations(g, ranks, h);
    }
}
