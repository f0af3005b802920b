/* `memtrace export --format torch-snapshot LOG... -o out.pickle`: memtrace logs as a
 * PyTorch memory snapshot, for pytorch.org/memory_viz (2.x layout) or PyTorch 1.13's
 * torch.cuda._memory_viz (--torch-format 1). The conversion is analysis/torch_snapshot*. */
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/report.h"
#include "analysis/torch_snapshot.h"
#include "tools/commands.h"
#include "tools/logs.h"

static void help(FILE *f)
{
    fprintf(f,
            "usage: memtrace export --format torch-snapshot [options] LOG... -o OUT.pickle\n"
            "\n"
            "Writes one process of memtrace telemetry logs (NDJSON, as 'memtrace report'\n"
            "reads them) as a PyTorch CUDA memory snapshot (docs/torch-snapshot.md):\n"
            "  - the segments and blocks after the last event (allocated, pending free,\n"
            "    inactive), and every device's events as device_traces;\n"
            "  - each allocation's tag as a frame 'tag <name>' in file 'memtrace', which\n"
            "    memory_viz shows where it shows call stacks;\n"
            "  - forward/backward/warm-up/iteration markers as external_annotations.\n"
            "From a log that lost events, the trace keeps what memory_viz's state view can\n"
            "undo from the segments at the end; how many entries it left out is said.\n"
            "The events read wait for the end of the logs in an unlinked temporary file in\n"
            "$TMPDIR (else /tmp), 64 bytes each, not in memory.\n"
            "\n"
            "options:\n"
            "  --format torch-snapshot   the output format (the only one so far)\n"
            "  --torch-format 2|1        2 (default): the dict of torch.cuda.memory._snapshot()\n"
            "                            that pytorch.org/memory_viz loads; 1: PyTorch 1.13's\n"
            "                            list of segments with history on blocks, what\n"
            "                            'python3 -m torch.cuda._memory_viz' of 1.13 reads\n"
            "  --pid PID                 the process to write (default: the one with the most\n"
            "                            events)\n"
            "  -o, --output FILE         where to write ('-': standard output)\n"
            "  -h, --help                this text\n"
            "\n"
            "exit status: 0 written; 1 a log or the output could not be read or written;\n"
            "2 bad usage, malformed log lines, or no such process.\n"
            "\n"
            "examples:\n"
            "  memtrace export --format torch-snapshot memtrace-4242.ndjson -o run.pickle\n"
            "  memtrace export --format torch-snapshot --torch-format 1 run.ndjson -o old.pickle\n"
            "  python3 -m torch.cuda._memory_viz stats old.pickle\n");
}

typedef struct export_opts_s {
    const char *output; /* -o: the pickle, "-" for stdout */
    int era;            /* --torch-format: 1 or 2 */
    int pid;            /* --pid, or -1: the process with the most events */
    char **logs;        /* the LOGs, borrowed from argv */
    int nlogs;          /* >= 1 */
} export_opts_t;

static int parse_args(int argc, char **argv, export_opts_t *o)
{
    static const struct option opts[] = {
        {"format", required_argument, NULL, 'f'}, {"torch-format", required_argument, NULL, 't'},
        {"pid", required_argument, NULL, 'p'},    {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    const char *format = NULL;
    *o = (export_opts_t){.era = 2, .pid = -1};
    int c;
    char *end;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            format = optarg;
            break;
        case 't':
            if (strcmp(optarg, "1") != 0 && strcmp(optarg, "2") != 0) {
                fprintf(stderr, "memtrace export: --torch-format wants 1 or 2, not '%s'\n", optarg);
                return 2;
            }
            o->era = optarg[0] - '0';
            break;
        case 'p':
            o->pid = (int)strtol(optarg, &end, 10);
            if (*end != '\0' || o->pid < 0) {
                fprintf(stderr, "memtrace export: --pid wants a process id, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'o':
            o->output = optarg;
            break;
        case 'h':
            help(stdout);
            return 0;
        default:
            fprintf(stderr,
                    "memtrace export: unknown or incomplete option '%s' (see 'memtrace "
                    "export --help')\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (format == NULL || strcmp(format, "torch-snapshot") != 0) {
        fprintf(stderr, "memtrace export: --format torch-snapshot is required (the only "
                        "format so far)\n");
        return 2;
    }
    if (optind >= argc || o->output == NULL) {
        fprintf(stderr, "memtrace export: %s (see 'memtrace export --help')\n",
                optind >= argc ? "no LOG given" : "no output given (-o FILE)");
        return 2;
    }
    o->logs = argv + optind;
    o->nlogs = argc - optind;
    /* A snapshot given where a log is due would read as lines of garbage, one error each. */
    for (int i = 0; i < o->nlogs; i++) {
        if (mt__ts_is_pickle(o->logs[i])) {
            fprintf(stderr,
                    "memtrace export: %s is a PyTorch snapshot already, not a telemetry log: "
                    "export writes logs as snapshots ('memtrace report', 'plot', 'diff' and "
                    "'view' read snapshots)\n",
                    o->logs[i]);
            return 2;
        }
    }
    return MT_TOOL_RUN;
}

/* Reads the logs and writes the process's snapshot: 0, 1 (I/O, memory), 2 (malformed
 * logs, no such process). */
static int run(const export_opts_t *o)
{
    const char *output = o->output;
    const int era = o->era, pid = o->pid;
    mt__report_t *r = NULL;
    mt__report_cfg_t rcfg = mt__report_cfg_default();
    rcfg.general_reader = mt_tool_general_reader();
    rcfg.replay_only = true;              /* the events replayed, never analysed as a report */
    rcfg.spill_dir = mt_tool_spill_dir(); /* kept on disk, a chunk per process in memory */
    if (mt__report_create(&r, &rcfg) != 0) {
        fprintf(stderr, "memtrace export: out of memory\n");
        return 1;
    }
    unsigned long bad = 0;
    int status = mt_tool_read_logs(r, "memtrace export", o->logs, o->nlogs, &bad);
    size_t proc = 0, most = 0;
    bool found = false;
    for (size_t i = 0; status == 0 && i < mt__report_process_count(r); i++) {
        int p;
        const char *name;
        size_t n;
        if (mt__report_process(r, i, &p, &name, &n) == 0 && (pid >= 0 ? p == pid : n > most)) {
            proc = i;
            most = n;
            found = true;
        }
    }
    if (status == 0 && !found) {
        if (pid >= 0)
            fprintf(stderr, "memtrace export: no process %d in the logs\n", pid);
        else
            fprintf(stderr, "memtrace export: the logs hold no events\n");
        status = 2;
    }
    /* The other processes' newest events (up to a 64 KiB chunk each in memory) go before
     * the snapshot is built, and their pages back to the system (29 processes: 1.9 MB). */
    for (size_t i = 0; status == 0 && i < mt__report_process_count(r); i++)
        if (i != proc)
            mt__report_drop_events(r, i);
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    mt_ts_t *ts = NULL;
    char err[512];
    if (status == 0 && mt__ts_from_report(&ts, r, proc, mt_tool_threads(), err, sizeof err) < 0) {
        fprintf(stderr, "memtrace export: %s\n", err);
        status = 1;
    }
    /* The snapshot holds what it needs: the log's events go before the output is written,
     * so that both are never in memory at once. */
    mt__report_destroy(&r);
    if (status == 0) {
        FILE *f = strcmp(output, "-") == 0 ? stdout : fopen(output, "wb");
        /* 64 KiB writes instead of stdio's 4 KiB: a tenth of the system calls. */
        static char obuf[64 << 10];
        if (f != NULL)
            setvbuf(f, obuf, _IOFBF, sizeof obuf);
        int rc = f ? mt__ts_write(ts, f, era) : MT_EIO;
        if (f != NULL && f != stdout && fclose(f) != 0 && rc == 0)
            rc = MT_EIO;
        if (rc < 0) {
            fprintf(stderr, "memtrace export: %s: cannot write: %s\n", output, mt_strerror(rc));
            if (f != NULL && f != stdout)
                mt_tool_remove_output(output);
            status = 1;
        } else {
            if (f != stdout)
                fprintf(stderr,
                        "memtrace export: wrote %s (%zu segments, %zu events, PyTorch %s "
                        "layout)\n",
                        output, ts->nsegments, era == 2 ? ts->nevents : 0,
                        era == 2 ? "2.x" : "1.13");
            if (era == 2) /* (on stderr: said with -o - too) */
                mt_tool_viz_dropped("memtrace export", ts->viz_dropped);
        }
    }
    mt__ts_destroy(&ts);
    mt__report_destroy(&r);
    return status ? status : bad ? 2 : 0;
}

int mt_cmd_export(int argc, char **argv)
{
    export_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
