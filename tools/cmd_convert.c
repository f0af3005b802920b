/* `memtrace convert IN -o OUT`: a telemetry log from NDJSON to the binary log or back
 * (analysis/binlog_conv.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/binlog_conv.h"
#include "memtrace/common.h"
#include "tools/commands.h"
#include "tools/logs.h"

static void help(FILE *f)
{
    fprintf(f, "usage: memtrace convert [--to ndjson|binary] LOG -o OUT\n"
               "\n"
               "Converts a telemetry log between its two forms (docs/telemetry.md, \"The\n"
               "binary log\"): NDJSON, and the binary log the recorder writes with\n"
               "MEMTRACE_LOG_FORMAT=binary or a log path ending in .mtlog. Every reader\n"
               "(report, plot, export, diff, view) reads both; convert is for other tools.\n"
               "Binary to NDJSON gives the lines the recorder would have written; NDJSON\n"
               "to binary and back gives the same bytes.\n"
               "\n"
               "options:\n"
               "  --to ndjson|binary   the output's form (default: the other one)\n"
               "  -o, --output FILE    where to write ('-': standard output)\n"
               "  -h, --help           this text\n"
               "\n"
               "exit status: 0 written; 1 the log or the output could not be read or\n"
               "written; 2 bad usage, or a damaged binary log (its sound parts are written).\n"
               "\n"
               "examples:\n"
               "  memtrace convert memtrace-4242.mtlog -o memtrace-4242.ndjson\n"
               "  memtrace convert --to binary run.ndjson -o run.mtlog\n");
}

typedef struct convert_opts_s {
    const char *input, *output;
    int to; /* 0: the other form, 1: NDJSON, 2: binary */
} convert_opts_t;

static int parse_args(int argc, char **argv, convert_opts_t *o)
{
    static const struct option opts[] = {
        {"to", required_argument, NULL, 't'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (convert_opts_t){0};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (strcmp(optarg, "ndjson") != 0 && strcmp(optarg, "binary") != 0) {
                fprintf(stderr, "memtrace convert: --to wants ndjson or binary, not '%s'\n",
                        optarg);
                return 2;
            }
            o->to = optarg[0] == 'n' ? 1 : 2;
            break;
        case 'o':
            o->output = optarg;
            break;
        case 'h':
            help(stdout);
            return 0;
        default:
            fprintf(stderr,
                    "memtrace convert: unknown or incomplete option '%s' (see 'memtrace "
                    "convert --help')\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind != argc - 1 || o->output == NULL) {
        fprintf(stderr, "memtrace convert: %s (see 'memtrace convert --help')\n",
                optind >= argc      ? "no LOG given"
                : optind < argc - 1 ? "one LOG at a time"
                                    : "no output given (-o FILE)");
        return 2;
    }
    o->input = argv[optind];
    return MT_TOOL_RUN;
}

typedef struct damage_s {
    const char *path;
    unsigned long n;
} damage_t;

static int damaged(void *ud, const char *msg)
{
    damage_t *d = ud;
    if (d->n++ < 10)
        fprintf(stderr, "memtrace convert: %s: damaged binary log: %s\n", d->path, msg);
    return 0;
}

static int run(const convert_opts_t *o)
{
    FILE *in = strcmp(o->input, "-") == 0 ? stdin : fopen(o->input, "rb");
    if (!in) {
        perror(o->input);
        return 1;
    }
    char head[MT__BLOG_MAGIC_LEN];
    size_t nhead = fread(head, 1, sizeof head, in);
    bool binary = mt__blog_is_binary(head, nhead);
    int to = o->to ? o->to : binary ? 1 : 2;
    if ((to == 2) == binary) {
        fprintf(stderr, "memtrace convert: %s is %s already\n", o->input,
                binary ? "a binary log" : "NDJSON");
        if (in != stdin)
            fclose(in);
        return 2;
    }
    if (!binary && nhead > 0 && fseek(in, 0, SEEK_SET) != 0) {
        fprintf(stderr, "memtrace convert: %s: cannot read NDJSON from a pipe: give a file\n",
                o->input);
        if (in != stdin)
            fclose(in);
        return 2;
    }
    FILE *out = strcmp(o->output, "-") == 0 ? stdout : fopen(o->output, "wb");
    if (!out) {
        perror(o->output);
        if (in != stdin)
            fclose(in);
        return 1;
    }
    static char obuf[1 << 20];
    setvbuf(out, obuf, _IOFBF, sizeof obuf);
    damage_t d = {.path = o->input};
    uint64_t a = 0, b = 0;
    int rc = binary ? mt__blog_to_ndjson(in, head, nhead, out, damaged, &d, &a)
                    : mt__blog_from_ndjson(in, out, &a, &b);
    bool rd_err = ferror(in) != 0;
    if (in != stdin)
        fclose(in);
    if (out != stdout ? fclose(out) != 0 : fflush(out) != 0)
        rc = rc ? rc : MT_EIO;
    if (rc != 0) {
        fprintf(stderr, "memtrace convert: %s: %s\n", rd_err ? o->input : o->output,
                rc == MT_EOVERFLOW ? "a line longer than 8 MiB: not a memtrace log"
                : rd_err           ? "cannot read"
                                   : mt_strerror(rc));
        if (out != stdout)
            mt_tool_remove_output(o->output);
        return rc == MT_EOVERFLOW ? 2 : 1;
    }
    if (d.n > 10)
        fprintf(stderr, "memtrace convert: %s: %lu damaged parts in all\n", o->input, d.n);
    if (out != stdout) {
        if (binary)
            fprintf(stderr, "memtrace convert: wrote %s (%llu lines)\n", o->output,
                    (unsigned long long)a);
        else
            fprintf(stderr, "memtrace convert: wrote %s (%llu lines, %llu as event records)\n",
                    o->output, (unsigned long long)a, (unsigned long long)b);
    }
    return d.n ? 2 : 0;
}

int mt_cmd_convert(int argc, char **argv)
{
    convert_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
