/* `memtrace report LOG`: reads a telemetry log (NDJSON from the local fallback or the
 * daemon's log file) and prints, per process, peaks by tag, utilization and
 * fragmentation over time, allocations never freed, and the growth detector's verdict
 * across iterations. The analysis is analysis/report.c; this file reads the options and the
 * logs, report_print.c prints. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "analysis/frames.h"
#include "analysis/replay.h"
#include "analysis/torch_snapshot.h"
#include "analysis/report.h"
#include "tools/commands.h"
#include "tools/logs.h"
#include "tools/report_print.h"
#include "tools/snapshot_in.h"

static void help(FILE *f)
{
    fprintf(f, "usage: memtrace report [options] LOG...\n"
               "\n"
               "Analyses a memtrace telemetry log (NDJSON, schema v1: docs/telemetry.md), as\n"
               "written by an instrumented program with no daemon (./memtrace-<pid>.ndjson or\n"
               "$MEMTRACE_LOG) or by the daemon's log file. LOG '-' reads standard input.\n"
               "Several logs are read in the order given, as one: a program whose daemon went\n"
               "away carries on in its own log, so give the daemon's log first, then the\n"
               "program's; an event found in both counts once.\n"
               "\n"
               "For each process it prints, for its device memory:\n"
               "  - peak allocated and reserved bytes, and the peak of each tag;\n"
               "  - a timeline of allocated, reserved, utilization and fragmentation;\n"
               "  - allocations never freed, grouped by tag and size;\n"
               "  - growth across iterations: allocated bytes at each iteration marker\n"
               "    (MT_MARK_ITERATION) fitted with a line; steady growth is flagged, the sign\n"
               "    of history kept alive from one iteration to the next.\n"
               "  - the device's used memory as the driver reports it (logs that carry it),\n"
               "    split into memtrace's reserved bytes and what is outside its allocator:\n"
               "    each library that reported its own allocations, the context, and the\n"
               "    rest, not seen; at the end and when used peaked (docs/outside.md);\n"
               "  - out-of-memory errors, each with that split at its moment.\n"
               "Logs of several ranks of a job (their hello names a rank) give a table per\n"
               "job: each rank's peaks, its bytes outside the allocator and its OOMs.\n"
               "Pinned host memory (a pinned host cache's blocks, pool host) is not device\n"
               "memory: it is summarised apart (peaks, peak of each tag, never freed).\n"
               "\n"
               "A LOG may also be a PyTorch memory snapshot (the pickle of\n"
               "torch.cuda.memory._dump_snapshot, docs/torch-snapshot.md): its trace is\n"
               "reported as a process of its own, with the top call sites at the peak from\n"
               "its frames and its external annotations.\n"
               "\n"
               "options:\n"
               "  --json              print the analysis as one JSON document\n"
               "  --steps N           timeline samples (default 20)\n"
               "  --min-growth BYTES  rise over the iterations needed to flag growth\n"
               "                      (default 1048576; suffixes K, M, G)\n"
               "  --min-r2 X          goodness of fit needed to flag growth (default 0.8)\n"
               "  --top N             never-freed groups (and call sites) shown (default 10)\n"
               "  --by KEY            group the call stacks (recorded with MEMTRACE_STACKS, or a\n"
               "                      snapshot's frames) by KEY: site (the user's frame,\n"
               "                      'transformer.py:54 forward'; 'callsite' says the same),\n"
               "                      function, file, module, stack (the user's frames),\n"
               "                      modules (the nn.Module chain: each module's forward,\n"
               "                      outermost first), or tag (memtrace's tags).\n"
               "                      Ranks live bytes at the peak, never freed, growth per\n"
               "                      iteration. Default: tag for tagged input, else site\n"
               "  --frames all        no frame is skipped: each stack's innermost frame is its\n"
               "                      site, and every frame is printed under it\n"
               "  --frames rules      print the default rules and exit\n"
               "  --skip-frames PAT   also skip frames matching PAT: func:PREFIX, file:TEXT,\n"
               "                      module:TEXT, or TEXT (a function prefix or file text);\n"
               "                      repeatable. The default rules (docs/frames.md) skip the\n"
               "                      recorder, the allocator, PyTorch's C++ and dispatcher,\n"
               "                      CPython's eval loop and installed packages\n"
               "  --stacks            under each site, its whole stack of kept frames\n"
               "  --replay            beside why reserved exceeds allocated, the peak reserved\n"
               "                      of memtrace's allocator replaying the same allocations\n"
               "                      (the sim backend, as `memtrace replay`)\n"
               "  --temporary-window T  a block freed within T of its allocation is temporary\n"
               "                      (N in us, or Nus, Nms, Ns; default 1ms; 0: none); the\n"
               "                      top temporary sites are shown by count, with their\n"
               "                      bytes and median lifetime\n"
               "  -h, --help          this text\n"
               "\n"
               "exit status: 0 report printed; 1 the log could not be read; 2 bad usage, or\n"
               "malformed lines (each is named on stderr; the rest is still reported).\n"
               "\n"
               "examples:\n"
               "  memtrace report memtrace-4242.ndjson\n"
               "  memtrace report --json run.ndjson | jq '.processes[].growth'\n"
               "  MEMTRACE_LOG=run.ndjson ./train && memtrace report --steps 40 run.ndjson\n"
               "  memtrace report daemon.ndjson memtrace-4242.ndjson\n"
               "  memtrace report --by file --stacks snapshot.pickle\n"
               "  memtrace report --skip-frames file:my_utils.py snapshot.pickle\n");
}

int mt_tool_parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1; /* no sign, no space: strtoull would take "-1" as 2^64 - 1 */
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno == ERANGE || v > (UINT64_MAX >> 30))
        return -1;
    switch (*end) {
    case 'K':
    case 'k':
        v <<= 10;
        end++;
        break;
    case 'M':
    case 'm':
        v <<= 20;
        end++;
        break;
    case 'G':
    case 'g':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    if (*end)
        return -1;
    *out = v;
    return 0;
}

typedef struct report_opts_s {
    mt__report_cfg_t cfg;          /* what the report computes (frames and by set by run) */
    mt__report_print_opts_t print; /* how it is printed */
    bool as_json;                  /* --json */
    /* Rules are made once the options are read: --frames all may come after --skip-frames. */
    const char *skips[64]; /* --skip-frames patterns, borrowed from argv */
    int nskips;
    char **logs; /* the LOGs, borrowed from argv */
    int nlogs;   /* >= 1 */
} report_opts_t;

static int report_run(const mt__report_cfg_t *cfgp, const mt__report_print_opts_t *pr, bool as_json,
                      char **logs, int nlogs);

/* "250", "250us", "2ms", "0.5s" into µs. 0 or MT_EINVAL. */
static int parse_window(const char *s, uint64_t *us)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || !(v >= 0))
        return MT_EINVAL;
    double scale = strcmp(end, "") == 0 || strcmp(end, "us") == 0 ? 1
                   : strcmp(end, "ms") == 0                       ? 1e3
                   : strcmp(end, "s") == 0                        ? 1e6
                                                                  : -1;
    if (scale < 0 || v * scale > (double)MT_MODEL_TEMP_WINDOW_MAX)
        return MT_EINVAL;
    *us = (uint64_t)(v * scale + 0.5);
    return 0;
}

/* `--frames rules`: the default table, as docs/frames.md lists it. */
static void print_rules(void)
{
    static const char *const kinds[] = {"function", "file",        "file is",
                                        "module",   "native file", "native, no file"};
    size_t n;
    const mt_fr_rule_t *r = mt__fr_default_rules(&n);
    printf("%-16s %-44s %-10s %s\n", "kind", "pattern", "class", "why");
    for (size_t i = 0; i < n; i++)
        printf("%-16s %-44s %-10s %s\n", r[i].kind < 6 ? kinds[r[i].kind] : "?",
               r[i].pattern[0] ? r[i].pattern : "-",
               r[i].cls == MT_FR_RECORDER ? "recorder" : "framework", r[i].reason);
}

static int parse_args(int argc, char **argv, report_opts_t *o)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"steps", required_argument, NULL, 's'},
        {"min-growth", required_argument, NULL, 'g'},
        {"min-r2", required_argument, NULL, 'r'},
        {"top", required_argument, NULL, 't'},
        {"by", required_argument, NULL, 'b'},
        {"frames", required_argument, NULL, 'f'},
        {"skip-frames", required_argument, NULL, 'k'},
        {"stacks", no_argument, NULL, 'S'},
        {"replay", no_argument, NULL, 'R'},
        {"temporary-window", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    o->cfg = mt__report_cfg_default();
    mt__report_cfg_t *cfg = &o->cfg;
    /* The benchmarks' baseline (bench/bench_readers.c): every line through jansson. */
    cfg->general_reader = mt_tool_general_reader();
    o->as_json = false;
    o->nskips = 0;
    mt__report_print_opts_t *pr = &o->print;
    *pr = (mt__report_print_opts_t){.by = MT_FR_BY_SITE};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'j':
            o->as_json = true;
            break;
        case 's':
            cfg->timeline_steps = (unsigned)strtoul(optarg, &end, 10);
            if (*end || cfg->timeline_steps == 0 || cfg->timeline_steps > 10000) {
                fprintf(stderr, "memtrace report: --steps wants 1..10000\n");
                return 2;
            }
            break;
        case 'g':
            if (mt_tool_parse_bytes(optarg, &cfg->min_growth_bytes) != 0) {
                fprintf(stderr, "memtrace report: --min-growth wants bytes (e.g. 4M)\n");
                return 2;
            }
            break;
        case 'r':
            cfg->min_r2 = strtod(optarg, &end);
            if (end == optarg || *end || !(cfg->min_r2 >= 0 && cfg->min_r2 <= 1)) { /* NaN too */
                fprintf(stderr, "memtrace report: --min-r2 wants 0..1\n");
                return 2;
            }
            break;
        case 't':
            cfg->top = (unsigned)strtoul(optarg, &end, 10);
            if (*end) {
                fprintf(stderr, "memtrace report: --top wants a number\n");
                return 2;
            }
            break;
        case 'b':
            pr->by = mt__fr_by_parse(optarg);
            if (pr->by < 0) {
                fprintf(stderr, "memtrace report: --by wants site, function, file, module, "
                                "stack, modules or tag\n");
                return 2;
            }
            pr->explicit_by = true;
            break;
        case 'f':
            if (strcmp(optarg, "rules") == 0) {
                print_rules();
                return 0;
            }
            if (strcmp(optarg, "all") != 0 && strcmp(optarg, "user") != 0) {
                fprintf(stderr, "memtrace report: --frames wants all, user (the default) or "
                                "rules\n");
                return 2;
            }
            pr->all = strcmp(optarg, "all") == 0;
            break;
        case 'k':
            if (o->nskips == (int)(sizeof o->skips / sizeof o->skips[0]) || optarg[0] == '\0') {
                fprintf(stderr, "memtrace report: --skip-frames wants a pattern (64 at most)\n");
                return 2;
            }
            o->skips[o->nskips++] = optarg;
            break;
        case 'S':
            pr->stacks = true;
            break;
        case 'R':
            pr->replay = true;
            break;
        case 'T':
            if (parse_window(optarg, &cfg->temporary_window_us) != 0) {
                fprintf(stderr, "memtrace report: --temporary-window wants a time: N (us), Nus, "
                                "Nms or Ns, at most 2^40 us; 0 turns it off\n");
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
    if (optind >= argc) {
        help(stderr);
        return 2;
    }
    o->logs = argv + optind;
    o->nlogs = argc - optind;
    return MT_TOOL_RUN;
}

/* The frame rules from the options, then the report: 0, 1 (I/O, memory), 2 (malformed
 * lines, a bad pattern). */
static int run(const report_opts_t *o)
{
    mt__report_cfg_t cfg = o->cfg;
    const mt__report_print_opts_t *pr = &o->print;
    mt_fr_rules_t *rules = NULL;
    if (mt__fr_rules_create(&rules, pr->all) != 0) {
        fprintf(stderr, "memtrace report: out of memory\n");
        return 1;
    }
    for (int i = 0; i < o->nskips; i++) {
        int rc = mt__fr_rules_add(rules, o->skips[i]);
        if (rc != 0) {
            fprintf(stderr, "memtrace report: --skip-frames %s: %s\n", o->skips[i],
                    rc == MT_EINVAL ? "empty pattern" : "out of memory");
            mt__fr_rules_destroy(&rules);
            return rc == MT_EINVAL ? 2 : 1;
        }
    }
    /* Call sites are computed for every process: untagged input shows them by default. */
    cfg.by = pr->by;
    cfg.frames = rules;
    cfg.by_callsite = pr->by != MT_FR_BY_TAG;
    int status = report_run(&cfg, pr, o->as_json, o->logs, o->nlogs);
    mt__fr_rules_destroy(&rules);
    return status;
}

int mt_cmd_report(int argc, char **argv)
{
    report_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}

/* --replay: beside each process's gap, the peak reserved of memtrace's allocator replaying
 * its allocations (analysis/replay.h, on the sim backend). A process whose replay fails
 * gets no figure; the reason goes to stderr. */
static void add_replay(mt__report_t *r, json_t *res)
{
    json_t *procs = json_object_get(res, "processes");
    for (size_t i = 0; i < json_array_size(procs); i++) {
        json_t *p = json_array_get(procs, i);
        mt_trace_t *t = NULL;
        mt_replay_result_t out;
        char err[256] = "out of memory";
        mt_replay_cfg_t rc = mt__replay_cfg_default();
        /* the sim device must hold what the program reserved */
        rc.capacity = mt__replay_capacity_for(
            (uint64_t)json_number_value(json_object_get(p, "peak_reserved")));
        int st = mt__report_trace(r, i, &t);
        if (st == 0)
            st = mt__replay_run(t, &rc, &out, err, sizeof err);
        if (st == 0) {
            json_object_set_new(p, "replay_reserved_bytes",
                                json_integer((json_int_t)(out.peak_reserved & INT64_MAX)));
            json_object_set_new(p, "replay_allocated_bytes",
                                json_integer((json_int_t)(out.peak_allocated & INT64_MAX)));
            json_object_set_new(p, "replay_ooms", json_integer((json_int_t)out.ooms));
        } else {
            fprintf(stderr, "memtrace report: --replay of process %d: %s\n",
                    (int)json_integer_value(json_object_get(p, "pid")), err);
        }
        mt__trace_free(&t);
    }
}

static int report_run(const mt__report_cfg_t *cfgp, const mt__report_print_opts_t *pr, bool as_json,
                      char **logs, int nlogs)
{
    mt__report_cfg_t cfg = *cfgp;
    /* The analysis is made as the events are read, and none is kept, unless --replay replays
     * them or a snapshot's sites need its model (snapshot_in.c): memory follows the model. */
    cfg.stream = !pr->replay;
    for (int i = 0; i < nlogs && cfg.stream; i++)
        cfg.stream = !mt__ts_is_pickle(logs[i]);
    mt__report_t *r = NULL;
    if (mt__report_create(&r, &cfg) != 0) {
        fprintf(stderr, "memtrace report: out of memory\n");
        return 1;
    }
    unsigned long bad = 0;
    mt_tool_inputs_t in;
    int status = mt_tool_read_inputs(r, "memtrace report", logs, nlogs, &bad, &in);
    if (status != 0) {
        mt_tool_inputs_free(&in);
        mt__report_destroy(&r);
        return status;
    }
    if (cfg.stream && in.n == 0) {
        /* Nothing replayed after, no snapshot's sites to add: each process is printed (or its
         * text kept) as it is made, and its analysis freed, so that a job's thousands of ranks
         * hold neither all their JSON nor their analyses beside it. */
        status = mt__report_print_streamed(r, pr, as_json, logs, nlogs, bad);
        mt__report_destroy(&r);
        if (status == 0 && !as_json && mt_tool_inputs_print(&in, &cfg, pr->stacks) != 0) {
            fprintf(stderr, "memtrace report: out of memory for the snapshots' call sites\n");
            status = 1;
        }
        mt_tool_inputs_free(&in);
        return status != 0 ? status : bad ? 2 : 0;
    }
    json_t *res = mt__report_result(r);
    if (res != NULL && pr->replay)
        add_replay(r, res);
    if (res != NULL && mt_tool_inputs_temporary(&in, r, res, &cfg) != 0) {
        json_decref(res);
        res = NULL;
    }
    mt__report_destroy(&r);
    if (!res) {
        fprintf(stderr, "memtrace report: out of memory\n");
        mt_tool_inputs_free(&in);
        return 1;
    }
    if (mt_tool_inputs_json(&in, res, &cfg) != 0 || mt__report_print_fit(res, pr) != 0) {
        fprintf(stderr, "memtrace report: out of memory\n");
        json_decref(res);
        mt_tool_inputs_free(&in);
        return 1;
    }
    if (as_json) {
        errno = 0; /* jansson reports a failure without a reason: errno tells */
        if (json_dumpf(res, stdout, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "memtrace report: cannot write the report: %s\n",
                    errno == ENOMEM ? "out of memory" : "write error");
            json_decref(res);
            return 1;
        }
        printf("\n");
    } else {
        mt__report_print_text(res, pr, logs, nlogs, bad);
        if (mt_tool_inputs_print(&in, &cfg, pr->stacks) != 0) {
            fprintf(stderr, "memtrace report: out of memory for the snapshots' call sites\n");
            mt_tool_inputs_free(&in);
            json_decref(res);
            return 1;
        }
    }
    mt_tool_inputs_free(&in);
    json_decref(res);
    return bad ? 2 : 0;
}
