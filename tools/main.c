/* memtrace: the command-line front end. Dispatches to one subcommand per file. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "analysis/symbolize.h"
#include "mt_config.h"
#include "tools/commands.h"
#include "tools/logs.h"

static const mt_cmd_t commands[] = {
    {"replay", mt_cmd_replay, "replay an allocation trace (RMM CSV) through the allocator"},
    {"run", mt_cmd_run, "run an unmodified CUDA program on the caching allocator"},
    {"daemon", mt_cmd_daemon, "run memtraced, the profiler daemon (live events, metrics)"},
    {"token", mt_cmd_token, "print the daemon's HTTP token (for curl and the browser)"},
    {"tail", mt_cmd_tail, "print the daemon's live event stream (JSON Lines, or a binary log)"},
    {"top", mt_cmd_top, "live view of memory per process and tag"},
    {"report", mt_cmd_report, "analyse a telemetry log: peaks, timeline, leaks, growth"},
    {"diff", mt_cmd_diff, "compare two runs (logs or snapshots): what grew, what is new; CI gates"},
    {"plot", mt_cmd_plot, "draw a telemetry log as an SVG: memory by tag over time, segments"},
    {"view", mt_cmd_view, "serve the web page for recorded logs, on localhost"},
    {"export", mt_cmd_export, "write telemetry logs as a PyTorch memory snapshot (pickle)"},
    {"convert", mt_cmd_convert, "convert a telemetry log between NDJSON and the binary log"},
    {"snapshot", mt_cmd_snapshot, "write a live process's memory as a PyTorch snapshot"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: memtrace <command> [options]\n\n"
            "memtrace %s: a block-caching CUDA memory allocator and profiler.\n\n"
            "commands:\n",
            MT_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'memtrace <command> --help' describes each command, with examples.\n");
}

/* A report written to a full disk is a failure, not an empty success: what stdio still
 * holds is written now, and any error of stdout turns the status into 1. */
static int finish_stdout(int status)
{
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout) || fclose(stdout) != 0) {
        fprintf(stderr, "memtrace: writing standard output: %s\n",
                errno ? strerror(errno) : "I/O error");
        return status ? status : 1;
    }
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("memtrace %s\n", MT_VERSION);
        return 0;
    }
    mt__sym_debuginfod(mt_tool_debuginfod()); /* debug information from elsewhere when asked */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return finish_stdout(commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "memtrace: unknown command '%s' (see 'memtrace --help')\n", argv[1]);
    return 2;
}
