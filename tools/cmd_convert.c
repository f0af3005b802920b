/* `memtrace convert IN -o OUT`: a telemetry log from NDJSON to the binary log or back
 * (analysis/binlog_conv.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "analysis/binlog_conv.h"
#include "analysis/zsource.h"
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
               "to binary and back gives the same bytes. LOG may be compressed with xz,\n"
               "gzip or zstd (read as it is; NDJSON from a file, not a pipe).\n"
               "\n"
               "options:\n"
               "  --to ndjson|binary   the output's form (default: the other one)\n"
               "  -o, --output FILE    where to write ('-': standard output)\n"
               "  -h, --help           this text\n"
               "\n"
               "exit status: 0 written; 1 the log or the output could not be read or\n"
               "written; 2 bad usage, or a damaged binary log or bad compressed data (what\n"
               "is sound before it is written).\n"
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

/* in from its first byte again, for the NDJSON path, which takes the bytes read to tell the
 * form again: a regular file is rewound (and its decompression opened again); a pipe cannot
 * be. 0 or -1 (*zf may then be NULL). */
static int restart(mt__zfile_t **zf, FILE *raw, FILE **in)
{
    if (mt__zfile_stream(*zf) == raw)
        return fseek(raw, 0, SEEK_SET);
    mt__zfile_close(zf);
    struct stat st;
    if (fstat(fileno(raw), &st) != 0 || !S_ISREG(st.st_mode) || fseek(raw, 0, SEEK_SET) != 0 ||
        mt__zfile_open(zf, raw) != 0)
        return -1;
    *in = mt__zfile_stream(*zf);
    return 0;
}

static void close_input(mt__zfile_t **zf, FILE *raw)
{
    mt__zfile_close(zf);
    if (raw != stdin)
        fclose(raw);
}

static int run(const convert_opts_t *o)
{
    FILE *raw = strcmp(o->input, "-") == 0 ? stdin : fopen(o->input, "rb");
    if (!raw) {
        perror(o->input);
        return 1;
    }
    /* A log compressed with xz, gzip or zstd reads as its text (analysis/zsource.h). */
    mt__zfile_t *zf = NULL;
    int zrc = mt__zfile_open(&zf, raw);
    if (zrc != 0) {
        fprintf(stderr, "memtrace convert: %s: %s\n", o->input, mt_strerror(zrc));
        close_input(&zf, raw);
        return 1;
    }
    FILE *in = mt__zfile_stream(zf);
    char head[MT__BLOG_MAGIC_LEN];
    size_t nhead = fread(head, 1, sizeof head, in);
    bool binary = mt__blog_is_binary(head, nhead);
    int to = o->to ? o->to : binary ? 1 : 2;
    if ((to == 2) == binary) {
        fprintf(stderr, "memtrace convert: %s is %s already\n", o->input,
                binary ? "a binary log" : "NDJSON");
        close_input(&zf, raw);
        return 2;
    }
    if (!binary && nhead > 0 && restart(&zf, raw, &in) != 0) {
        fprintf(stderr, "memtrace convert: %s: cannot read NDJSON from a pipe: give a file\n",
                o->input);
        close_input(&zf, raw);
        return 2;
    }
    FILE *out = strcmp(o->output, "-") == 0 ? stdout : fopen(o->output, "wb");
    if (!out) {
        perror(o->output);
        close_input(&zf, raw);
        return 1;
    }
    static char obuf[1 << 20];
    setvbuf(out, obuf, _IOFBF, sizeof obuf);
    damage_t d = {.path = o->input};
    uint64_t a = 0, b = 0;
    int rc = binary ? mt__blog_to_ndjson(in, head, nhead, out, damaged, &d, &a)
                    : mt__blog_from_ndjson(in, out, &a, &b);
    bool rd_err = ferror(in) != 0;
    char zerr[256]; /* bad compressed data, said as it is */
    snprintf(zerr, sizeof zerr, "%s", mt__zfile_error(zf));
    close_input(&zf, raw);
    if (out != stdout ? fclose(out) != 0 : fflush(out) != 0)
        rc = rc ? rc : MT_EIO;
    if (rc != 0) {
        fprintf(stderr, "memtrace convert: %s: %s\n", rd_err ? o->input : o->output,
                rc == MT_EOVERFLOW ? "a line longer than 8 MiB: not a memtrace log"
                : zerr[0] != '\0'  ? zerr
                : rd_err           ? "cannot read"
                                   : mt_strerror(rc));
        if (zerr[0] != '\0') /* as a damaged binary log's sound parts are: kept */
            fprintf(stderr, "memtrace convert: what came before it is in %s\n", o->output);
        else if (out != stdout)
            mt_tool_remove_output(o->output);
        return rc == MT_EOVERFLOW || zerr[0] != '\0' ? 2 : 1;
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
