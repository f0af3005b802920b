/* `memtrace diff BEFORE AFTER`: what changed between two runs, for a person or a CI gate.
 * Each side is read as `memtrace report` reads it (logs or snapshots); the comparison is
 * analysis/diff.c; this file reads the arguments, runs it and prints. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "analysis/diff.h"
#include "analysis/frames.h"
#include "analysis/report.h"
#include "analysis/torch_snapshot.h"
#include "tools/commands.h"
#include "tools/logs.h"
#include "tools/snapshot_in.h"
#include "util/text.h"

#define DIFF_CROSSED 4 /* exit status when a gate is crossed */

static void help(FILE *f)
{
    fprintf(f, "usage: memtrace diff [options] BEFORE AFTER\n"
               "\n"
               "Compares two runs, each a telemetry log or a PyTorch memory snapshot (any input\n"
               "`memtrace report` reads): peak and final allocated and reserved bytes, live\n"
               "bytes at the peak and never-freed bytes per call site (the user's frame, as\n"
               "`report --by` groups them) and per tag. It names the sites that are new, that\n"
               "grew, that are gone, that are freed now but were never freed before, and the\n"
               "reverse (docs/diff.md).\n"
               "\n"
               "options:\n"
               "  --json                   print the comparison as one JSON document\n"
               "  --max-peak-growth PCT    fail (exit 4) when peak allocated grew by more than\n"
               "                           PCT percent\n"
               "  --max-site-growth BYTES  fail (exit 4) when one site's live bytes at the peak\n"
               "                           grew by more than BYTES (suffixes K, M, G); a new\n"
               "                           site grows from 0\n"
               "  --by KEY                 group call stacks by site (default), function, file,\n"
               "                           module or stack\n"
               "  --frames all             no frame is skipped (the innermost is the site)\n"
               "  --top N                  rows printed per section (default 10; JSON has all)\n"
               "  -h, --help               this text\n"
               "\n"
               "exit status: 0 compared, no gate crossed; 4 a gate was crossed (named in the\n"
               "output); 1 an input could not be read; 2 bad usage or a malformed input.\n"
               "\n"
               "examples:\n"
               "  memtrace diff main.ndjson branch.ndjson\n"
               "  memtrace diff --max-peak-growth 5 --max-site-growth 64M before.pickle "
               "after.pickle\n"
               "  memtrace diff --json a.ndjson b.ndjson | jq '.new'\n");
}

/* One side as `memtrace report --json` would compute it, before its sections are fitted to
 * the input: every call-site row kept. Returns the exit status; *out new on 0. */
static int read_side(const char *prog, const char *path, const mt__report_cfg_t *cfg, json_t **out)
{
    *out = NULL;
    mt__report_t *r = NULL;
    if (mt__report_create(&r, cfg) != 0) {
        fprintf(stderr, "%s: %s: out of memory to start reading it\n", prog, path);
        return 1;
    }
    unsigned long bad = 0;
    mt_tool_inputs_t in;
    char *paths[1] = {(char *)path};
    int status = mt_tool_read_inputs(r, prog, paths, 1, &bad, &in);
    if (status == 0 && bad > 0) {
        fprintf(stderr, "%s: %s: %lu malformed lines\n", prog, path, bad);
        status = 2;
    }
    /* Streamed, a side holds of each process what the diff reads, not its whole report, and
     * each one's analysis goes once that is made: a side may be a job's thousands of ranks. */
    if (status == 0) {
        *out = cfg->stream ? mt__report_result_final(r, mt__diff_process_members)
                           : mt__report_result(r);
        if (*out == NULL || mt_tool_inputs_json(&in, *out, cfg) != 0) {
            fprintf(stderr, "%s: %s: out of memory analysing it\n", prog, path);
            status = 1;
        }
    }
    mt_tool_inputs_free(&in);
    mt__report_destroy(&r);
    return status;
}

int mt_tool_diff(const char *prog, const char *before, const char *after, int by, bool all_frames,
                 const mt_diff_cfg_t *dc, json_t **out, int *crossed)
{
    *out = NULL;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    mt_fr_rules_t *rules = NULL;
    if (mt__fr_rules_create(&rules, all_frames) != 0) {
        fprintf(stderr, "%s: out of memory for the frame rules\n", prog);
        return 1;
    }
    cfg.frames = rules;
    cfg.by = by;
    cfg.general_reader = mt_tool_general_reader();
    /* Its analysis alone, no event kept, unless a snapshot's sites need the model
     * (snapshot_in.c). */
    cfg.stream = !mt__ts_is_pickle(before) && !mt__ts_is_pickle(after);
    cfg.by_callsite = true;
    cfg.top = UINT32_MAX; /* every site: one outside the top ten may be the one that grew */
    json_t *side[2] = {NULL, NULL};
    int status = read_side(prog, before, &cfg, &side[0]);
    if (status == 0)
        status = read_side(prog, after, &cfg, &side[1]);
    if (status == 0 && mt__diff_reports(side[0], side[1], dc, out, crossed) != 0) {
        fprintf(stderr, "%s: out of memory comparing the two runs\n", prog);
        status = 1;
    }
    json_decref(side[0]);
    json_decref(side[1]);
    mt__fr_rules_destroy(&rules);
    return status;
}

/* ---- text ---- */

static const char *human(double b, char *buf, size_t len)
{
    return mt__text_bytes(b, 1, buf, len);
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static void put_plain(const char *s)
{
    char buf[MT_TEXT_ESC_SIZE(512)];
    fputs(mt__text_escape(s ? s : "?", buf, sizeof buf), stdout);
}

static void print_figure(const char *what, const json_t *f)
{
    char a[32], b[32], d[32];
    printf("  %-16s %12s -> %-12s", what, human(num(f, "before"), a, sizeof a),
           human(num(f, "after"), b, sizeof b));
    printf(" %s%s", num(f, "delta") > 0 ? "+" : "", human(num(f, "delta"), d, sizeof d));
    json_t *pct = json_object_get(f, "growth_pct");
    if (json_is_number(pct))
        printf(" (%+.1f%%)", json_number_value(pct));
    printf("\n");
}

static void print_rows(const char *title, const json_t *rows, unsigned top)
{
    size_t shown = 0, i;
    json_t *r;
    printf("\n  %s:\n", title);
    json_array_foreach(rows, i, r)
    {
        const char *st = json_string_value(json_object_get(r, "status"));
        if (strcmp(st, "same") == 0)
            continue;
        if (shown++ == top) {
            printf("    ...\n");
            break;
        }
        char a[32], b[32], c[32], d[32];
        printf("    %-6s %12s -> %-12s", st, human(num(r, "before"), a, sizeof a),
               human(num(r, "after"), b, sizeof b));
        if (num(r, "never_freed_before") > 0 || num(r, "never_freed_after") > 0)
            printf(" never freed %s -> %s", human(num(r, "never_freed_before"), c, sizeof c),
                   human(num(r, "never_freed_after"), d, sizeof d));
        printf("  ");
        put_plain(json_string_value(json_object_get(r, "key")));
        printf("\n");
    }
    if (shown == 0)
        printf("    (no change)\n");
}

static void print_list(const char *title, const json_t *l, unsigned top)
{
    if (json_array_size(l) == 0)
        return;
    printf("  %s:", title);
    size_t i;
    json_t *s;
    json_array_foreach(l, i, s)
    {
        if (i == top) {
            printf(" ...");
            break;
        }
        printf("%s", i ? ";" : "");
        printf(" ");
        put_plain(json_string_value(s));
    }
    printf("\n");
}

static void print_text(const char *before, const char *after, const json_t *d, unsigned top)
{
    printf("memtrace diff: ");
    put_plain(before);
    printf(" -> ");
    put_plain(after);
    printf("\n");
    print_figure("peak allocated", json_object_get(d, "peak_allocated"));
    print_figure("peak reserved", json_object_get(d, "peak_reserved"));
    print_figure("final allocated", json_object_get(d, "final_allocated"));
    print_figure("final reserved", json_object_get(d, "final_reserved"));
    print_rows("by site (live bytes at the peak)", json_object_get(d, "sites"), top);
    /* Input without tags has every byte under "other": a section that says nothing. */
    json_t *tags = json_object_get(d, "tags");
    json_t *first = json_array_get(tags, 0);
    if (json_array_size(tags) > 1 ||
        (first && strcmp(json_string_value(json_object_get(first, "key")), "other") != 0))
        print_rows("by tag (peak bytes)", tags, top);
    printf("\n");
    print_list("new sites", json_object_get(d, "new"), top);
    print_list("grew", json_object_get(d, "grew"), top);
    print_list("gone", json_object_get(d, "gone"), top);
    print_list("freed now, never freed before", json_object_get(d, "freed_now"), top);
    print_list("never freed now, freed before", json_object_get(d, "never_freed_now"), top);
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(d, "gates"), i, g)
    {
        const char *name = json_string_value(json_object_get(g, "gate"));
        bool over = json_is_true(json_object_get(g, "crossed"));
        char a[32], b[32];
        if (strcmp(name, "max_peak_growth_pct") == 0) {
            json_t *v = json_object_get(g, "value");
            printf("gate --max-peak-growth %.1f%%: peak allocated grew ", num(g, "limit"));
            if (json_is_number(v))
                printf("%+.1f%%", json_number_value(v));
            else
                printf("from nothing");
        } else {
            printf("gate --max-site-growth %s: largest growth %s",
                   human(num(g, "limit"), a, sizeof a), human(num(g, "value"), b, sizeof b));
            const char *what = json_string_value(json_object_get(g, "what"));
            if (what && *what) {
                printf(" at ");
                put_plain(what);
            }
        }
        printf(": %s\n", over ? "CROSSED" : "ok");
    }
}

typedef struct diff_opts_s {
    mt_diff_cfg_t dc;           /* the gates */
    int by;                     /* mt_fr_by_e, not MT_FR_BY_TAG */
    bool as_json, all;          /* --json; --frames all */
    unsigned top;               /* rows per table, > 0 */
    const char *before, *after; /* the two inputs, borrowed from argv */
} diff_opts_t;

static int parse_args(int argc, char **argv, diff_opts_t *o)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"max-peak-growth", required_argument, NULL, 'p'},
        {"max-site-growth", required_argument, NULL, 's'},
        {"by", required_argument, NULL, 'b'},
        {"frames", required_argument, NULL, 'f'},
        {"top", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (diff_opts_t){.dc = mt__diff_cfg_default(), .by = mt__report_cfg_default().by, .top = 10};
    mt_diff_cfg_t *dc = &o->dc;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'j':
            o->as_json = true;
            break;
        case 'p':
            dc->max_peak_growth_pct = strtod(optarg, &end);
            if (end == optarg || *end || !(dc->max_peak_growth_pct >= 0) ||
                !isfinite(dc->max_peak_growth_pct)) {
                fprintf(stderr, "memtrace diff: --max-peak-growth wants a percentage >= 0\n");
                return 2;
            }
            break;
        case 's': {
            uint64_t bytes;
            if (mt_tool_parse_bytes(optarg, &bytes) != 0 || bytes > (uint64_t)INT64_MAX) {
                fprintf(stderr, "memtrace diff: --max-site-growth wants bytes (e.g. 64M)\n");
                return 2;
            }
            dc->max_site_growth = (int64_t)bytes;
            break;
        }
        case 'b':
            o->by = mt__fr_by_parse(optarg);
            if (o->by < 0 || o->by == MT_FR_BY_TAG) {
                fprintf(stderr, "memtrace diff: --by wants site, function, file, module or "
                                "stack (tags are always compared)\n");
                return 2;
            }
            break;
        case 'f':
            if (strcmp(optarg, "all") != 0 && strcmp(optarg, "user") != 0) {
                fprintf(stderr, "memtrace diff: --frames wants all or user\n");
                return 2;
            }
            o->all = strcmp(optarg, "all") == 0;
            break;
        case 't':
            o->top = (unsigned)strtoul(optarg, &end, 10);
            if (*end || o->top == 0) {
                fprintf(stderr, "memtrace diff: --top wants a number > 0\n");
                return 2;
            }
            break;
        case 'h':
            help(stdout);
            return 0;
        default:
            help(stderr);
            return 2;
        }
    }
    if (argc - optind != 2) {
        help(stderr);
        return 2;
    }
    o->before = argv[optind];
    o->after = argv[optind + 1];
    return MT_TOOL_RUN;
}

/* Compares the two inputs and prints the result: 0, 1 (unreadable), 2 (malformed),
 * DIFF_CROSSED (a gate crossed). */
static int run(const diff_opts_t *o)
{
    json_t *d = NULL;
    int crossed = 0;
    int status =
        mt_tool_diff("memtrace diff", o->before, o->after, o->by, o->all, &o->dc, &d, &crossed);
    if (status == 0 && o->as_json) {
        errno = 0; /* jansson reports a failure without a reason: errno tells */
        if (json_dumpf(d, stdout, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "memtrace diff: cannot write the result: %s\n",
                    errno == ENOMEM ? "out of memory" : "write error");
            status = 1;
        }
        printf("\n");
    } else if (status == 0) {
        print_text(o->before, o->after, d, o->top);
    }
    if (status == 0 && crossed > 0)
        status = DIFF_CROSSED;
    json_decref(d);
    return status;
}

int mt_cmd_diff(int argc, char **argv)
{
    diff_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
