/* `memtrace view LOG...`: the daemon's web page for recorded logs. The logs are loaded into
 * a daemon's state (daemon/view.c), which then serves its HTTP routes on 127.0.0.1 (its Unix
 * socket lives in a private temporary directory) until Ctrl-C. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "analysis/diff.h"
#include "analysis/frames.h"
#include "daemon/daemon.h"
#include "tools/commands.h"
#include "tools/logs.h"
#include "util/json.h"

#define VIEW_DEFAULT_PORT 9478
#define VIEW_MAX_GETS     32

static void help(FILE *f)
{
    fprintf(f,
            "usage: memtrace view [--port N] [--window N] LOG|SNAPSHOT...\n"
            "       memtrace view [--port N] [--window N] --compare BEFORE AFTER\n"
            "\n"
            "Serves the web page of 'memtrace daemon' for recorded telemetry logs (NDJSON,\n"
            "docs/telemetry.md: a daemon's --log, or a program's own log) and PyTorch memory\n"
            "snapshots (.pickle, each one process named after its file), on\n"
            "http://127.0.0.1:PORT/ only, until Ctrl-C. Every process of the logs is listed;\n"
            "its charts, segment map (with past states), event tail and comparisons work as\n"
            "for a live process. Several logs are read in the order given, as one recording\n"
            "(an event found twice counts once: a daemon's log and the program's own after\n"
            "a takeover). A program's own log carries its clocks (its hello line): its times\n"
            "are right wherever it was recorded. A daemon's log's are shown on this\n"
            "machine's clock: right for logs recorded since it last booted. A snapshot's\n"
            "are its own (time_us since the Unix epoch). The page's header says 'recorded'.\n"
            "\n"
            "With --compare, the two inputs are two runs, BEFORE and AFTER (logs or\n"
            "snapshots): each keeps its processes (a pid of both gets a new one in AFTER),\n"
            "and the page shows them compared: peak and final allocated and reserved, and\n"
            "the call sites that are new, grew or are gone, as 'memtrace diff --json BEFORE\n"
            "AFTER' computes them.\n"
            "\n"
            "options:\n"
            "  --port N     HTTP port (default %d; 0 = any free port)\n"
            "  --compare    BEFORE AFTER are two runs: the page compares them\n"
            "  --window N   events kept per process for past states (default 1048576,\n"
            "               64 bytes each in an unlinked temporary file in $TMPDIR, else\n"
            "               /tmp, not in memory; at least 1024)\n"
            "  --print-state  load the inputs, print what the page starts from as one JSON\n"
            "               line on standard output (the processes as the daemon's /state\n"
            "               lists them, the events each keeps for past states, the compare\n"
            "               and job documents or null), and exit without serving\n"
            "  --get TARGET load the inputs, print the body of the answer to GET TARGET (a\n"
            "               route of the page's data or the API: /state, /map?pid=N,\n"
            "               /history?pid=N&buckets=100, ...; docs/telemetry.md) on standard\n"
            "               output, and exit without serving; repeatable (at most %d), one\n"
            "               answer a line\n"
            "  -h, --help   this text\n"
            "\n"
            "exit status: 0 stopped by Ctrl-C (or printed); 1 a log could not be read, the port\n"
            "is taken, or memory ran out; 2 bad usage, or malformed lines (each log's first is\n"
            "named; the rest is shown).\n"
            "\n"
            "examples:\n"
            "  memtrace daemon --log /tmp/run.ndjson; ./train; memtrace view /tmp/run.ndjson\n"
            "  memtrace view --port 8080 memtrace-4242.ndjson\n"
            "  memtrace view snapshot.pickle\n"
            "  memtrace view --compare before.pickle after.pickle\n"
            "  memtrace view --get /state --get '/map?pid=4242' memtrace-4242.ndjson\n",
            VIEW_DEFAULT_PORT, VIEW_MAX_GETS);
}

static int number(const char *s, unsigned long min, unsigned long max, unsigned long *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* The compare view of two inputs: `memtrace diff --json`'s document, served at /diff. An
 * input diff cannot read was already refused by the load: one it cannot read now (memory,
 * said by mt_tool_diff) is 1; without memory here, 1 too. */
static int compare(mt_d_t *d, const char *before, const char *after)
{
    mt_diff_cfg_t dc = mt__diff_cfg_default();
    json_t *doc = NULL;
    int crossed = 0;
    int status =
        mt_tool_diff("memtrace view", before, after, MT_FR_BY_SITE, false, &dc, &doc, &crossed);
    if (status == 1)
        return 1; /* a page without the compare view it was asked for is another answer */
    if (status != 0) {
        fprintf(stderr, "memtrace view: no compare view of %s and %s\n", before, after);
        return 0; /* malformed: the inputs are still served, each on its own */
    }
    json_t *o = json_pack("{s:s, s:s, s:O}", "before", before, "after", after, "diff", doc);
    char *txt = NULL;
    int rc = o ? mt__json_dumps(o, JSON_COMPACT, &txt, NULL) : MT_ENOMEM;
    if (rc == 0)
        rc = mt__d_view_set_diff(d, txt);
    free(txt);
    json_decref(o);
    json_decref(doc);
    if (rc) {
        fprintf(stderr, "memtrace view: out of memory\n");
        return 1;
    }
    return 0;
}

/* The job view of the logs of a job's ranks: the report's "jobs" (the code `memtrace
 * report` runs, with call sites by function), served at /jobs. The logs are read a second
 * time, by the report; only when a loaded process has a rank. 1 without memory, or when a
 * log read once cannot be read again (said by the reader); else 0, the page without a job
 * view only for a line too long for the report. */
static int jobs_view(mt_d_t *d, char *const *paths, int n)
{
    if (!mt__d_view_has_ranks(d))
        return 0;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    mt_fr_rules_t *rules = NULL;
    mt__report_t *r = NULL;
    json_t *res = NULL;
    char *txt = NULL;
    unsigned long bad = 0;
    int rc = MT_ENOMEM;
    if (mt__fr_rules_create(&rules, false) != 0)
        goto fail_rules;
    cfg.by_callsite = true;
    cfg.by = MT_FR_BY_FUNCTION;
    cfg.general_reader = mt_tool_general_reader();
    cfg.stream = true; /* its analysis alone: no event kept */
    cfg.frames = rules;
    if (mt__report_create(&r, &cfg) != 0)
        goto fail_report;
    int read = mt_tool_read_logs(r, "memtrace view", paths, n, &bad);
    if (read != 0) {
        /* said on stderr by the reader; a line too long: the processes are still served */
        rc = read == 2 ? 0 : MT_EIO;
        goto fail_read;
    }
    json_t *jobs = (res = mt__report_result(r)) ? json_object_get(res, "jobs") : NULL;
    rc = jobs ? 0 : res ? 0 : MT_ENOMEM;
    if (jobs && (mt__json_dumps(jobs, JSON_COMPACT, &txt, NULL) || mt__d_view_set_jobs(d, txt)))
        rc = MT_ENOMEM;
    free(txt);
    json_decref(res);
fail_read:
    mt__report_destroy(&r);
fail_report:
    mt__fr_rules_destroy(&rules);
fail_rules:
    if (rc == MT_ENOMEM)
        fprintf(stderr, "memtrace view: out of memory\n");
    return rc ? 1 : 0;
}

typedef struct view_opts_s {
    unsigned long port;              /* 0..65535, 0: any free one */
    unsigned long window;            /* events kept per process, 1024..2^26 */
    bool two_runs;                   /* --compare BEFORE AFTER */
    bool print_state;                /* --print-state: the loaded state on stdout, nothing served */
    const char *gets[VIEW_MAX_GETS]; /* --get TARGET...: their answers, nothing served */
    int ngets;
    char **inputs; /* logs or snapshots, borrowed from argv */
    int ninputs;   /* >= 1; 2 with two_runs */
} view_opts_t;

static int parse_args(int argc, char **argv, view_opts_t *o)
{
    *o = (view_opts_t){.port = VIEW_DEFAULT_PORT, .window = 1ul << 20};
    static const struct option opts[] = {{"port", required_argument, NULL, 'p'},
                                         {"window", required_argument, NULL, 'w'},
                                         {"compare", no_argument, NULL, 'c'},
                                         {"print-state", no_argument, NULL, 's'},
                                         {"get", required_argument, NULL, 'g'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ch == 'h') {
            help(stdout);
            return 0;
        }
        if (ch == 'c' || ch == 's') {
            *(ch == 'c' ? &o->two_runs : &o->print_state) = true;
            continue;
        }
        if (ch == 'g' && o->ngets < VIEW_MAX_GETS && optarg[0] == '/') {
            o->gets[o->ngets++] = optarg;
            continue;
        }
        if (ch == 'g') {
            fprintf(stderr, "memtrace view: --get '%s': %s (see --help)\n", optarg,
                    optarg[0] != '/' ? "not a path such as /state" : "too many");
            return 2;
        }
        if (ch == 'p' && number(optarg, 0, 65535, &o->port) == 0)
            continue;
        if (ch == 'w' && number(optarg, 1024, 1ul << 26, &o->window) == 0)
            continue;
        if (ch == 'p' || ch == 'w')
            fprintf(stderr, "memtrace view: --%s: bad value '%s' (see --help)\n",
                    ch == 'p' ? "port" : "window", optarg);
        else
            help(stderr);
        return 2;
    }
    if (optind >= argc) {
        fprintf(stderr, "memtrace view: no LOG or SNAPSHOT given (see --help)\n");
        return 2;
    }
    if (o->two_runs && argc - optind != 2) {
        fprintf(stderr, "memtrace view: --compare takes two inputs, BEFORE and AFTER; %d given\n",
                argc - optind);
        return 2;
    }
    o->inputs = argv + optind;
    o->ninputs = argc - optind;
    return MT_TOOL_RUN;
}

/* --get's answers, in the order given: 0, or 1 after the first that failed (named). */
static int gets(mt_d_t *d, const view_opts_t *o)
{
    for (int i = 0; i < o->ngets; i++) {
        int code;
        char msg[200];
        int rc = mt__d_view_get(d, o->gets[i], stdout, &code, msg, sizeof msg);
        if (rc == MT_EINVAL)
            fprintf(stderr,
                    "memtrace view: --get '%s': not a target to answer once (a path without "
                    "spaces; the event stream is memtrace tail's)\n",
                    o->gets[i]);
        else if (rc)
            fprintf(stderr, "memtrace view: --get '%s': %s\n", o->gets[i],
                    rc == MT_ENOMEM ? "out of memory" : "cannot write the answer");
        else if (code != 200)
            fprintf(stderr, "memtrace view: --get '%s': HTTP %d: %s\n", o->gets[i], code, msg);
        if (rc || code != 200)
            return 1;
    }
    return 0;
}

/* Loads the inputs into a daemon of recorded files (daemon/view.c), then serves them
 * until Ctrl-C: 0, 1 (cannot serve, unreadable input), 2 (malformed lines skipped). */
static int run(const view_opts_t *o)
{
    const unsigned long port = o->port;
    const bool two_runs = o->two_runs;
    char dir[] = "/tmp/memtrace-view-XXXXXX", sock[sizeof dir + 8];
    if (!mkdtemp(dir)) {
        perror("memtrace view: cannot make a private directory for the socket");
        return 1;
    }
    snprintf(sock, sizeof sock, "%s/sock", dir);
    /* Where the daemon requires a token on its routes, it keeps it in SOCKET.token (0600, in
     * our private directory): the address to open carries it. The daemon keeps the file
     * for its next start; this directory has none, so it goes with the directory. */
    char tpath[sizeof sock + 8];
    snprintf(tpath, sizeof tpath, "%s.token", sock);
    mt_d_cfg_t cfg = mt__d_cfg_default();
    cfg.socket_path = sock;
    const bool serve = !o->print_state && o->ngets == 0;
    cfg.http_port = serve ? (int)port : -1; /* (nothing served: no port taken) */
    cfg.handle_signals = true;
    cfg.max_exited = 1u << 16; /* every process of the logs stays */
    cfg.view_general_reader = mt_tool_general_reader();
    mt_d_t *d = NULL;
    int rc = mt__d_create(&d, &cfg), status = 0;
    if (rc && !serve) {
        fprintf(stderr, "memtrace view: cannot load: %s\n", mt_strerror(rc));
        rmdir(dir);
        return 1;
    } else if (rc) {
        fprintf(stderr, "memtrace view: cannot serve on 127.0.0.1:%lu: %s\n", port,
                mt_strerror(rc));
        unlink(tpath);
        rmdir(dir);
        return 1;
    }
    mt__d_set_event_window(d, o->window);
    /* The windows of the logs' processes on disk ($TMPDIR, else /tmp; unlinked), a chunk each
     * in memory: the memory is the models', not the logs'. */
    if (mt__d_set_event_spool(d, mt_tool_spill_dir()) != 0) {
        fprintf(stderr, "memtrace view: out of memory\n");
        mt__d_destroy(&d);
        unlink(tpath);
        rmdir(dir);
        return 1;
    }
    unsigned long events = 0, bad_total = 0;
    for (int i = 0; i < o->ninputs && status == 0; i++) {
        unsigned long bad = 0;
        char err[320] = "";
        /* Two runs compared: each keeps its processes. */
        rc = two_runs ? mt__d_view_load_run(d, o->inputs[i], &events, &bad, err, sizeof err)
                      : mt__d_view_load(d, o->inputs[i], &events, &bad, err, sizeof err);
        if (rc) {
            fprintf(stderr, "memtrace view: %s\n", err);
            status = rc == MT_EPROTO ? 2 : 1; /* a malformed snapshot, as the other readers */
        } else if (bad) {
            fprintf(stderr, "memtrace view: %lu malformed line(s) skipped; the first: %s\n", bad,
                    err);
            bad_total += bad;
        }
    }
    if (status == 0 && two_runs)
        status = compare(d, o->inputs[0], o->inputs[1]);
    else if (status == 0)
        status = jobs_view(d, o->inputs, o->ninputs);
    if (status == 0 && !serve) { /* the state, then the answers, as asked */
        rc = o->print_state ? mt__d_view_print(d, stdout) : 0;
        if (rc)
            fprintf(stderr, "memtrace view: %s\n",
                    rc == MT_ENOMEM ? "out of memory" : "cannot write the state");
        status = rc || gets(d, o) ? 1 : bad_total ? 2 : 0;
    } else if (status == 0) {
        char tok[80] = "";
        FILE *tf = fopen(tpath, "r");
        if (tf) {
            if (!fgets(tok, sizeof tok, tf))
                tok[0] = '\0';
            tok[strcspn(tok, "\r\n")] = '\0';
            fclose(tf);
        }
        fprintf(stderr,
                "memtrace view: %lu events from %d log(s); open http://127.0.0.1:%d/%s%s "
                "(Ctrl-C stops)\n",
                events, o->ninputs, mt__d_http_port(d), tok[0] ? "#token=" : "", tok);
        rc = mt__d_run(d);
        status = rc ? 1 : bad_total ? 2 : 0;
    }
    mt__d_destroy(&d);
    unlink(tpath);
    if (rmdir(dir) != 0)
        fprintf(stderr, "memtrace view: cannot remove %s: %s\n", dir, strerror(errno));
    return status;
}

int mt_cmd_view(int argc, char **argv)
{
    view_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
