/* memtrace tail: subscribes to the daemon and copies the event stream (JSON Lines) to
 * stdout, optionally filtered by pid, event kind and tag. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "tools/commands.h"
#include "util/json.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: memtrace tail [--pid N] [--kind K] [--tag T] [--count N | --binary]\n"
               "                     [--socket PATH]\n"
               "\n"
               "Prints the live event stream of the memtrace daemon as JSON Lines, one event\n"
               "per line (schema: docs/telemetry.md). Filters may be repeated or given as\n"
               "comma-separated lists; events must pass every filter given. A line\n"
               "{\"type\":\"gap\",\"lost\":N} means N events were lost before this point.\n"
               "\n"
               "options:\n"
               "  --pid N       only events of process N\n"
               "  --kind K      only events of kind K (alloc, free_requested, free_completed,\n"
               "                segment_alloc, segment_free, segment_map, segment_unmap, oom,\n"
               "                reserve, empty_cache, config, stats, mark, compaction)\n"
               "  --tag T       only events tagged T (weights, grads, optimizer, activations,\n"
               "                workspace, batch, other, tagN, or a user tag's label)\n"
               "  --count N     exit after N lines\n"
               "  --binary      write the stream as a binary log (docs/telemetry.md, \"The\n"
               "                binary log\"; 1/14 to 1/23 of the bytes, and the daemon makes\n"
               "                no JSON for it) to standard output, which must not be a\n"
               "                terminal; every reader reads the file\n"
               "  --socket PATH the daemon's socket (default: as `memtrace daemon`)\n"
               "\n"
               "examples:\n"
               "  memtrace tail\n"
               "  memtrace tail --pid 4242 --kind alloc,free_completed\n"
               "  memtrace tail --tag activations | jq .size\n"
               "  memtrace tail --binary > live.mtlog; memtrace report live.mtlog\n");
}

/* Appends each comma-separated item of s to arr (numbers stay numbers). */
static int add_items(json_t *arr, const char *s, bool numeric)
{
    char *copy = strdup(s);
    if (!copy)
        return -1;
    char *save = NULL;
    for (char *it = strtok_r(copy, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        if (numeric) {
            char *end;
            long v = strtol(it, &end, 10);
            if (*end || v <= 0) {
                free(copy);
                return -1;
            }
            json_array_append_new(arr, json_integer(v));
        } else {
            json_array_append_new(arr, json_string(it));
        }
    }
    free(copy);
    return 0;
}

#define TAIL_LINE_MAX (1 << 20) /* bytes of one line from the daemon, newline included */

/* The stream from the daemon: what was read but not yet used, buf[0, have). */
typedef struct tail_in_s {
    int fd;
    char *buf; /* TAIL_LINE_MAX bytes */
    size_t have;
} tail_in_t;

/* Reads more into in: > 0 bytes read, 0 at EOF, -1 on an error. */
static ssize_t fill(tail_in_t *in)
{
    ssize_t r;
    do
        r = read(in->fd, in->buf + in->have, TAIL_LINE_MAX - in->have);
    while (r < 0 && errno == EINTR);
    if (r > 0)
        in->have += (size_t)r;
    return r;
}

/* The first line (the daemon's answer) into *line, NUL-terminated, newline cut; the caller
 * frees it. Its length, 0 at EOF before a newline, -1 on an error, -2 if too long. */
static ssize_t answer_line(tail_in_t *in, char **line)
{
    char *nl;
    while ((nl = memchr(in->buf, '\n', in->have)) == NULL) {
        if (in->have == TAIL_LINE_MAX)
            return -2;
        ssize_t r = fill(in);
        if (r <= 0)
            return r;
    }
    size_t n = (size_t)(nl - in->buf);
    if ((*line = strndup(in->buf, n)) == NULL)
        return -1;
    in->have -= n + 1;
    memmove(in->buf, nl + 1, in->have);
    return (ssize_t)n;
}

/* Copies whole lines to stdout until EOF or count lines (count < 0: no bound). Each read's
 * complete lines go out in one write and one flush, so a fast stream costs a few system calls
 * per 64 KiB instead of one per line, and a slow one still shows each line as it comes.
 * 0 at EOF, at count or when stdout closes (`| head`); -2 on a line over TAIL_LINE_MAX. */
static int copy_lines(tail_in_t *in, long count)
{
    for (;;) {
        const char *end = in->buf, *nl;
        while (count != 0 && (nl = memchr(end, '\n', (size_t)(in->buf + in->have - end))) != NULL) {
            end = nl + 1;
            count -= count > 0;
        }
        size_t out = (size_t)(end - in->buf);
        if (out > 0) {
            if (fwrite(in->buf, 1, out, stdout) != out || fflush(stdout) != 0)
                return 0; /* stdout closed: done, not an error */
            in->have -= out;
            memmove(in->buf, end, in->have);
        }
        if (count == 0)
            return 0;
        if (in->have == TAIL_LINE_MAX)
            return -2;
        if (fill(in) <= 0) {
            /* The stream ended: a last line without its newline is shown as it is. */
            if (in->have > 0 && fwrite(in->buf, 1, in->have, stdout) == in->have)
                fflush(stdout);
            return 0;
        }
    }
}

/* What to subscribe to. The arrays are owned (tail_opts_free). */
typedef struct tail_opts_s {
    json_t *pids, *kinds, *tags; /* filters, each empty when not given */
    const char *sock;            /* NULL: the default socket */
    long count;                  /* lines to print, -1: until the stream ends */
    bool binary;                 /* the stream as binary blocks, copied as they come */
} tail_opts_t;

static void tail_opts_free(tail_opts_t *o)
{
    json_decref(o->pids);
    json_decref(o->kinds);
    json_decref(o->tags);
}

static int parse_args(int argc, char **argv, tail_opts_t *o)
{
    static const struct option opts[] = {
        {"pid", required_argument, NULL, 'p'},    {"kind", required_argument, NULL, 'k'},
        {"tag", required_argument, NULL, 't'},    {"count", required_argument, NULL, 'n'},
        {"socket", required_argument, NULL, 's'}, {"binary", no_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},         {0},
    };
    *o = (tail_opts_t){json_array(), json_array(), json_array(), NULL, -1, false};
    int ch;
    optind = 1;
    int li = -1;
    while ((ch = getopt_long(argc, argv, "", opts, &li)) != -1) {
        int bad = 0;
        switch (ch) {
        case 'p':
            bad = add_items(o->pids, optarg, true);
            break;
        case 'k':
            bad = add_items(o->kinds, optarg, false);
            break;
        case 't':
            bad = add_items(o->tags, optarg, false);
            break;
        case 'n': {
            char *end;
            o->count = strtol(optarg, &end, 10);
            bad = *end != '\0' || o->count <= 0;
        } break;
        case 's':
            o->sock = optarg;
            break;
        case 'b':
            o->binary = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "memtrace tail: --%s: bad value '%s'%s\n", opts[li].name, optarg,
                    ch == 'p'   ? ": comma-separated process ids"
                    : ch == 'n' ? ": a count above 0"
                                : ": a comma-separated list of names");
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "memtrace tail: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->binary && o->count > 0) {
        fprintf(stderr, "memtrace tail: --count counts lines, and --binary writes none\n");
        return 2;
    }
    if (o->binary && isatty(STDOUT_FILENO)) {
        fprintf(stderr, "memtrace tail: --binary writes a binary log: send standard output to "
                        "a file or a pipe\n");
        return 2;
    }
    return MT_TOOL_RUN;
}

/* Copies what follows the answer, binary blocks, to stdout as it comes: 0 at EOF or when
 * stdout closes. (Whole blocks are not waited for: a reader takes a cut last block for
 * the damage it is, and the blocks before it.) */
static int copy_bytes(tail_in_t *in)
{
    for (;;) {
        if (in->have > 0 &&
            (fwrite(in->buf, 1, in->have, stdout) != in->have || fflush(stdout) != 0))
            return 0;
        in->have = 0;
        if (fill(in) <= 0)
            return 0;
    }
}

/* Copies the stream to stdout: 0, or 1 when the daemon is missing, refuses or breaks. */
static int run(const tail_opts_t *o)
{
    json_t *req = json_pack("{s:s,s:s}", "type", "subscribe", "role", "consumer");
    /* A request short of a filter would subscribe to more than asked: none is sent. */
    int bad = req == NULL;
    if (!bad && o->binary)
        bad |= json_object_set_new(req, "format", json_string("binary"));
    if (!bad && json_array_size(o->pids))
        bad |= json_object_set(req, "pid", o->pids);
    if (!bad && json_array_size(o->kinds))
        bad |= json_object_set(req, "kinds", o->kinds);
    if (!bad && json_array_size(o->tags))
        bad |= json_object_set(req, "tags", o->tags);
    char *line = NULL;
    if (!bad)
        (void)mt__json_dumps(req, JSON_COMPACT, &line, NULL); /* NULL: said below */
    json_decref(req);
    int fd;
    int rc = mt__d_client_connect(o->sock, &fd);
    if (rc) {
        fprintf(stderr, "memtrace tail: no daemon (%s); start one with `memtrace daemon`\n",
                mt_strerror(rc));
        free(line);
        return 1;
    }
    rc = line ? mt__d_client_send(fd, line, strlen(line)) : MT_ENOMEM;
    if (!rc)
        rc = mt__d_client_send(fd, "\n", 1);
    free(line);
    signal(SIGPIPE, SIG_IGN);
    if (rc) {
        close(fd);
        fprintf(stderr, "memtrace tail: cannot talk to the daemon\n");
        return 1;
    }
    int status = 1;
    /* Lines are bounded as the daemon bounds its own: a server that never sends a newline
     * costs TAIL_LINE_MAX bytes, not all of memory. */
    tail_in_t in = {fd, malloc(TAIL_LINE_MAX), 0};
    /* The first line is the daemon's answer; then every line is an event. */
    char *ans = NULL;
    ssize_t n = in.buf != NULL ? answer_line(&in, &ans) : -1;
    json_t *rep = n > 0 ? json_loadb(ans, (size_t)n, 0, NULL) : NULL;
    if (!json_is_true(json_object_get(rep, "ok"))) {
        const char *why = json_string_value(json_object_get(rep, "error"));
        fprintf(stderr, "memtrace tail: refused: %s\n",
                n == -2 ? "an answer line over 1 MiB"
                : why   ? why
                        : "no answer");
    } else if (o->binary) {
        status = copy_bytes(&in);
    } else if (copy_lines(&in, o->count) == -2) {
        fprintf(stderr, "memtrace tail: the daemon sent a line over %d bytes: stopped\n",
                TAIL_LINE_MAX);
    } else {
        status = 0;
    }
    json_decref(rep);
    free(ans);
    free(in.buf);
    close(fd);
    return status;
}

int mt_cmd_tail(int argc, char **argv)
{
    tail_opts_t o;
    int status = parse_args(argc, argv, &o);
    if (status == MT_TOOL_RUN)
        status = run(&o);
    tail_opts_free(&o);
    return status;
}
