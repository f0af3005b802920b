/* `memtrace plot LOG`: one SVG of a process's memory from a telemetry log: device memory
 * over time stacked by tag with the reserved line above, pinned host memory apart, and the
 * segment map at the peak. The log is read by the report's parser (analysis/report.c); the
 * picture is analysis/plot.c; this file reads the arguments and the file. */
#include <errno.h>
#include <stdbool.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "analysis/callsite.h"
#include "analysis/plot.h"
#include "analysis/report.h"
#include "tools/commands.h"
#include "tools/logs.h"
#include "tools/snapshot_in.h"

static void help(FILE *f)
{
    fprintf(f,
            "usage: memtrace plot [options] LOG...\n"
            "\n"
            "Draws a memtrace telemetry log (NDJSON, schema v1: docs/telemetry.md; the input\n"
            "of 'memtrace report'; or a PyTorch memory snapshot, docs/torch-snapshot.md) as one "
            "self-contained SVG image (no scripts, fonts or\n"
            "files outside it; open it in a browser), to see where device memory went:\n"
            "  - top: device memory in use over time, stacked by tag (weights, grads,\n"
            "    optimizer, activations, workspace, batch, other, user labels), the\n"
            "    reserved bytes as a line above, the cache (reserved, not in use) shaded,\n"
            "    OOM events as red markers, iteration markers as ticks; the legend gives\n"
            "    each tag's peak;\n"
            "  - several devices: one lane per device (its allocated and reserved bytes);\n"
            "    the timeline above is their sum;\n"
            "  - pinned host memory (pool host), when there is any, in a panel of its own:\n"
            "    it is not device memory and is not counted in the device figures;\n"
            "  - bottom: the segment map at the peak of reserved memory, each segment a\n"
            "    bar proportional to its size, blocks coloured by tag, free space grey,\n"
            "    with utilization and fragmentation.\n"
            "Several logs are read in the order given, as one (as 'memtrace report' does:\n"
            "the daemon's log, then the program's own after the daemon went away).\n"
            "However long the log, the timeline is sampled to at most --buckets time\n"
            "buckets, each keeping its highest and lowest moment, so peaks are not lost.\n"
            "The events read wait for the end of the logs in an unlinked temporary file in\n"
            "$TMPDIR (else /tmp), 64 bytes each, not in memory.\n"
            "\n"
            "options:\n"
            "  -o, --output FILE   where to write the SVG (default: the first LOG, .svg in place\n"
            "                      of .ndjson; '-' standard output; LOG '-' reads stdin\n"
            "                      and writes to standard output)\n"
            "  --pid N             the process to draw (default: the one with the most\n"
            "                      events, for a daemon log of several)\n"
            "  --width W           image width in px (default 1200, at least 800)\n"
            "  --height H          image height in px (default 800, at least 600)\n"
            "  --buckets N         time buckets of the timeline (default 1000, at most one\n"
            "                      per pixel)\n"
            "  --flamegraph        draw instead a flame graph of the call stacks recorded\n"
            "                      with MEMTRACE_STACKS: live device bytes at the peak,\n"
            "                      width by bytes, callers below callees; hover a frame\n"
            "                      for its bytes\n"
            "  --leaked            with --flamegraph: the bytes never freed instead\n"
            "  -h, --help          this text\n"
            "\n"
            "exit status: 0 image written; 1 the log could not be read or the image not\n"
            "written; 2 bad usage, no such process, or malformed lines (each is named on\n"
            "stderr; the image is still drawn from the rest).\n"
            "\n"
            "examples:\n"
            "  MEMTRACE_PROF=log MEMTRACE_LOG=run.ndjson ./train && memtrace plot run.ndjson\n"
            "  memtrace plot -o run.svg --width 1600 --height 1000 run.ndjson\n"
            "  memtrace plot --pid 4242 -o - /var/log/memtraced.ndjson > p4242.svg\n"
            "  MEMTRACE_STACKS=all memtrace run -- ./train && memtrace plot --flamegraph \\\n"
            "      -o f.svg memtrace-<pid>.ndjson\n"
            "  rsvg-convert run.svg > run.png    # a PNG, to paste somewhere\n");
}

static int positive(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end || v == 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* LOG with its .ndjson (or .jsonl, .log) cut and .svg put in its place. */
static char *default_output(const char *log)
{
    size_t n = strlen(log);
    static const char *const exts[] = {".ndjson", ".jsonl", ".log"};
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++) {
        size_t e = strlen(exts[i]);
        if (n > e && strcmp(log + n - e, exts[i]) == 0) {
            n -= e;
            break;
        }
    }
    char *out = malloc(n + 5);
    if (out) {
        memcpy(out, log, n);
        memcpy(out + n, ".svg", 5);
    }
    return out;
}

typedef struct plot_opts_s {
    mt__plot_cfg_t cfg; /* pid, size, buckets */
    const char *output; /* -o, or NULL: named after the first log */
    bool flame, leaked; /* --flamegraph (of the peak, or --leaked bytes) */
    char **logs;        /* the LOGs, borrowed from argv */
    int nlogs;          /* >= 1 */
} plot_opts_t;

static int parse_args(int argc, char **argv, plot_opts_t *o)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"pid", required_argument, NULL, 'p'},
        {"width", required_argument, NULL, 'W'},
        {"height", required_argument, NULL, 'H'},
        {"buckets", required_argument, NULL, 'b'},
        {"flamegraph", no_argument, NULL, 'f'},
        {"leaked", no_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (plot_opts_t){.cfg = mt__plot_cfg_default()};
    mt__plot_cfg_t *cfg = &o->cfg;
    unsigned long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            o->output = optarg;
            break;
        case 'p':
            if (positive(optarg, 0x7fffffff, &v) != 0) {
                fprintf(stderr, "memtrace plot: --pid wants a process id\n");
                return 2;
            }
            cfg->pid = (int)v;
            break;
        case 'W':
        case 'H':
            if (positive(optarg, 20000, &v) != 0 || v < (c == 'W' ? 800u : 600u)) {
                fprintf(stderr, "memtrace plot: --%s wants %s..20000 px\n",
                        c == 'W' ? "width" : "height", c == 'W' ? "800" : "600");
                return 2;
            }
            *(c == 'W' ? &cfg->width : &cfg->height) = (unsigned)v;
            break;
        case 'b':
            if (positive(optarg, 100000, &v) != 0) {
                fprintf(stderr, "memtrace plot: --buckets wants 1..100000\n");
                return 2;
            }
            cfg->max_buckets = (unsigned)v;
            break;
        case 'f':
            o->flame = true;
            break;
        case 'l':
            o->leaked = true;
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
    if (o->leaked && !o->flame) {
        fprintf(stderr, "memtrace plot: --leaked goes with --flamegraph\n");
        return 2;
    }
    o->logs = argv + optind;
    o->nlogs = argc - optind;
    return MT_TOOL_RUN;
}

/* Reads the logs and draws them: 0, 1 (I/O, memory), 2 (a malformed log, nothing to
 * draw). */
/* The snapshot read as process pid (mt_tool_read_inputs numbers them from 1), or NULL. */
static const mt_ts_t *input_snapshot(void *ud, int pid)
{
    const mt_tool_inputs_t *in = ud;
    return pid >= 1 && (size_t)pid <= in->n ? in->ts[pid - 1] : NULL;
}

static int run(const plot_opts_t *o)
{
    const mt__plot_cfg_t cfg = o->cfg;
    const char *output = o->output;
    const bool flame = o->flame, leaked = o->leaked;
    const char *path = o->logs[0]; /* the first log names the default output */
    mt__report_t *r = NULL;
    mt__report_cfg_t rcfg = mt__report_cfg_default();
    rcfg.general_reader = mt_tool_general_reader();
    rcfg.replay_only = true;              /* the events replayed, never analysed as a report */
    rcfg.spill_dir = mt_tool_spill_dir(); /* kept on disk, a chunk per process in memory */
    if (mt__report_create(&r, &rcfg) != 0) {
        fprintf(stderr, "memtrace plot: out of memory\n");
        return 1;
    }
    unsigned long bad = 0;
    mt_tool_inputs_t in; /* a LOG may be a PyTorch snapshot (its annotations become marks) */
    int status = mt_tool_read_inputs(r, "memtrace plot", o->logs, o->nlogs, &bad, &in);
    if (!flame) /* (a flame graph names a snapshot's stacks from its frames) */
        mt_tool_inputs_free(&in);
    char *dflt = NULL;
    if (!output && strcmp(path, "-") != 0)
        output = dflt = default_output(path);
    if (status == 0 && !output) /* LOG '-' and no -o: the image goes where the log came from */
        output = "-";
    FILE *out = NULL;
    if (status == 0) {
        out = strcmp(output, "-") == 0 ? stdout : fopen(output, "w");
        if (!out) {
            perror(output);
            status = 1;
        }
    }
    if (status == 0) {
        char err[256];
        int rc = flame ? mt__report_flame_svg(r, cfg.pid, leaked ? MT_CS_LEAKED : MT_CS_PEAK,
                                              input_snapshot, &in, out, err, sizeof err)
                       : mt__plot_svg(r, &cfg, out, err, sizeof err);
        errno = 0;
        bool werr = fflush(out) != 0 || ferror(out);
        if (out != stdout && fclose(out) != 0)
            werr = true;
        if (werr) {
            /* A full disk is the output's fault, not the log's: name the output. */
            fprintf(stderr, "memtrace plot: writing %s: %s\n", output,
                    errno ? strerror(errno) : "I/O error");
            if (out != stdout)
                mt_tool_remove_output(output);
            status = 1;
        } else if (rc != 0) {
            fprintf(stderr, "memtrace plot: %s: %s\n", path, err);
            if (out != stdout)
                mt_tool_remove_output(output);
            status = rc == MT_ENOENT ? 2 : 1;
        } else if (out != stdout) {
            fprintf(stderr, "memtrace plot: wrote %s\n", output);
        }
    }
    free(dflt);
    mt_tool_inputs_free(&in);
    mt__report_destroy(&r);
    return status ? status : bad ? 2 : 0;
}

int mt_cmd_plot(int argc, char **argv)
{
    plot_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
