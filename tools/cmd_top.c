/* memtrace top: a live terminal view of every process the daemon knows: allocated,
 * reserved, peak, utilization, fragmentation, per-tag bars, event rate and drops, all of
 * device memory; the device's used bytes and the daemon's split of them (what is outside the
 * allocator, by part); pinned host memory on a line of its own.
 *
 * It polls the daemon's state ({"type":"state"} on the Unix socket) and redraws in place
 * with ANSI codes; the terminal is put in raw mode (no echo, no line buffering) so that a
 * single 'q' quits, and is restored on every way out (q, SIGINT, SIGTERM, errors). */
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "tools/commands.h"
#include "util/text.h"

#define MAX_RATES 256

static volatile sig_atomic_t quit_signal;

static void on_quit_signal(int sig)
{
    quit_signal = sig;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: memtrace top [--interval MS] [--once] [--json] [--pid N] [--socket PATH]\n"
               "\n"
               "Live view of the processes the memtrace daemon knows, refreshed in place:\n"
               "per process allocated, reserved and peak bytes of device memory, utilization\n"
               "(allocated / reserved), fragmentation (1 - largest free block / free bytes),\n"
               "event rate and drops; below each, one bar per tag (share of the process's\n"
               "allocated bytes) and, if it has a pinned host cache, a \"pinned host\" line\n"
               "(page-locked host memory, never counted in the device figures).\n"
               "USED is the device's used memory as the driver reports it (every process on\n"
               "it), OUTSIDE the part of it outside the process's allocators; a line per\n"
               "device splits used into reserved, the libraries that reported what they took,\n"
               "the context and what was not seen (docs/outside.md).\n"
               "Under the selected process (--pid, else the one with the most allocated\n"
               "bytes), its top call sites: live bytes by allocating stack (MEMTRACE_STACKS).\n"
               "Press q to quit.\n"
               "\n"
               "options:\n"
               "  --interval MS  refresh period (default 1000)\n"
               "  --once         print one plain-text view and exit (no ANSI codes)\n"
               "  --json         print the daemon's state JSON once and exit\n"
               "  --pid N        the process whose call sites are shown\n"
               "  --socket PATH  the daemon's socket (default: as `memtrace daemon`)\n"
               "\n"
               "examples:\n"
               "  memtrace top\n"
               "  memtrace top --once\n"
               "  memtrace top --json | jq '.processes[] | {pid, peak_allocated_bytes}'\n");
}

static const char *human(double v, char *buf, size_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

static double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

typedef struct rate_s {
    int pid;
    double events;
} rate_t;

typedef struct top_s {
    rate_t prev[MAX_RATES];
    unsigned nprev;
    double prev_time;
    int pid; /* the process whose call sites are shown; 0: the one with most allocated */
} top_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Events per second of pid since the previous view (0 on the first). */
static double rate_of(const top_t *t, int pid, double events, double dt)
{
    for (unsigned i = 0; i < t->nprev; i++)
        if (t->prev[i].pid == pid && dt > 0)
            return (events - t->prev[i].events) / dt;
    return 0;
}

/* A label from another process, escaped (util/text.h) and cut at max bytes. */
static void put_plain(FILE *f, const char *s, size_t max)
{
    char buf[MT_TEXT_ESC_SIZE(160)];
    mt__text_escape(s, buf, max + 1 < sizeof buf ? max + 1 : sizeof buf);
    fputs(buf, f);
}

/* The top call sites of the selected process (/state's "callsites", live bytes now). */
static void render_callsites(FILE *f, json_t *procs, const top_t *t, const char *bold,
                             const char *norm)
{
    json_t *sel = NULL, *p;
    size_t i;
    json_array_foreach(procs, i, p)
    {
        if (t->pid != 0 ? num(p, "pid") == t->pid
                        : sel == NULL || num(p, "allocated_bytes") > num(sel, "allocated_bytes"))
            sel = p;
    }
    if (sel == NULL) {
        if (t->pid != 0)
            fprintf(f, "\nno process %d\n", t->pid);
        return;
    }
    json_t *cs = json_object_get(sel, "callsites");
    fprintf(f, "\n%stop call sites of %.0f (", bold, num(sel, "pid"));
    put_plain(f, json_string_value(json_object_get(sel, "name")) ?: "", 64);
    fprintf(f, ")%s\n", norm);
    if (json_array_size(cs) == 0) {
        fprintf(f, "  none recorded (run it with MEMTRACE_STACKS=sampled or all)\n");
        return;
    }
    json_t *row;
    json_array_foreach(cs, i, row)
    {
        char b[32];
        fprintf(f, "  %10s %6.0f blocks  ", human(num(row, "bytes"), b, sizeof b),
                num(row, "blocks"));
        put_plain(f, json_string_value(json_object_get(row, "site")) ?: "?", 120);
        json_t *caller = json_array_get(json_object_get(row, "frames"), 1);
        if (caller != NULL) {
            fputs("  <- ", f);
            put_plain(f, json_string_value(json_object_get(caller, "label")) ?: "?", 80);
        }
        fputc('\n', f);
    }
}

/* "5/8 job" (rank/world size, then the job id), "5", or "-" when the process has no rank.
 * The job id is escaped: it is the process's own. */
static const char *rank_cell(json_t *p, char *buf, size_t len)
{
    json_t *rank = json_object_get(p, "rank"), *world = json_object_get(p, "world_size");
    const char *job = json_string_value(json_object_get(p, "job"));
    char jb[MT_TEXT_ESC_SIZE(64)] = "";
    if (job)
        mt__text_escape(job, jb, sizeof jb);
    if (!json_is_integer(rank))
        snprintf(buf, len, "-");
    else if (json_is_integer(world))
        snprintf(buf, len, "%lld/%lld%s%s", (long long)json_integer_value(rank),
                 (long long)json_integer_value(world), job ? " " : "", jb);
    else
        snprintf(buf, len, "%lld%s%s", (long long)json_integer_value(rank), job ? " " : "", jb);
    return buf;
}

/* USED or OUTSIDE of a process: the sum of that member over the devices of its /state
 * "outside" (the daemon's model splits each device's used bytes), "-" without a figure. */
static const char *outside_cell(json_t *p, const char *k, char *buf, size_t n)
{
    json_t *devs = json_object_get(p, "outside"), *dv;
    size_t i;
    double v = 0;
    json_array_foreach(devs, i, dv) v += num(dv, k);
    if (json_array_size(devs) == 0)
        return snprintf(buf, n, "-"), buf;
    return human(v, buf, n);
}

/* One device's used bytes as the daemon's model splits them: "used U of T = reserved R +
 * the libraries' bytes (the largest few by name) + context C + not seen N". */
static void render_outside(FILE *f, json_t *dv)
{
    enum { SHOWN = 3 };
    char b[6][32], dn[24];
    snprintf(dn, sizeof dn, "outside dev %d", (int)num(dv, "device"));
    fprintf(f, "         %-14s used %s of %s = reserved %s", dn, human(num(dv, "used"), b[0], 32),
            human(num(dv, "total"), b[1], 32), human(num(dv, "reserved"), b[2], 32));
    /* The libraries one by one while their bytes make the model's total (they do unless the
     * device's figure lags the libraries' reports), the rest as one term. */
    json_t *libs = json_object_get(dv, "libraries"), *l;
    double listed = 0, rest = num(dv, "libraries_total");
    size_t i, shown = 0;
    json_array_foreach(libs, i, l) listed += num(l, "bytes");
    if (listed == rest) {
        json_array_foreach(libs, i, l)
        {
            if (num(l, "bytes") <= 0 || shown == SHOWN)
                continue;
            fputs(" + ", f);
            put_plain(f, json_string_value(json_object_get(l, "name")) ?: "?", 32);
            fprintf(f, " %s", human(num(l, "bytes"), b[3], 32));
            rest -= num(l, "bytes");
            shown++;
        }
    }
    if (rest > 0)
        fprintf(f, " + %s %s", shown ? "other libraries" : "libraries", human(rest, b[3], 32));
    fprintf(f, " + context %s", human(num(dv, "context"), b[4], 32));
    if (num(dv, "other_processes") > 0)
        fprintf(f, " + other processes %s", human(num(dv, "other_processes"), b[4], 32));
    fprintf(f, " + not seen %s\n", human(num(dv, "not_seen"), b[5], 32));
}

static void render(FILE *f, json_t *st, top_t *t, bool ansi)
{
    double now = now_s(), dt = t->nprev ? now - t->prev_time : 0;
    json_t *dm = json_object_get(st, "daemon");
    json_t *procs = json_object_get(st, "processes");
    unsigned running = 0;
    size_t i;
    json_t *p;
    json_array_foreach(procs, i, p) running +=
        strcmp(json_string_value(json_object_get(p, "state")) ?: "", "running") == 0;
    const char *bold = ansi ? "\033[1m" : "", *norm = ansi ? "\033[0m" : "";
    if (ansi)
        fputs("\033[H\033[2J", f);
    fprintf(f,
            "%smemtrace top%s  daemon pid %.0f: %zu processes (%u running), %.0f events, "
            "%.0f lost by producers, %.0f dropped for slow consumers%s\n\n",
            bold, norm, num(dm, "pid"), json_array_size(procs), running, num(dm, "events"),
            num(dm, "producer_dropped"), num(dm, "consumer_dropped"), ansi ? "   [q quits]" : "");
    /* A RANK column (rank/world size, then the job) once any process is a rank of a job. */
    bool ranked = false;
    json_array_foreach(procs, i, p) ranked |= json_object_get(p, "rank") != NULL;
    fprintf(f, "%s%-8s ", bold, "PID");
    if (ranked)
        fprintf(f, "%-20s ", "RANK");
    fprintf(f, "%-16s %-8s %11s %11s %11s %6s %6s %11s %11s %9s %14s%s\n", "NAME", "STATE",
            "ALLOCATED", "RESERVED", "PEAK", "UTIL", "FRAG", "USED", "OUTSIDE", "EVENTS/S",
            "DROPS (RATE)", norm);
    rate_t cur[MAX_RATES];
    unsigned ncur = 0;
    json_array_foreach(procs, i, p)
    {
        char a[32], r[32], pk[32], ub[32], ob[32], rk[MT_TEXT_ESC_SIZE(64) + 32];
        int pid = (int)num(p, "pid");
        double events = num(p, "events");
        const char *state = json_string_value(json_object_get(p, "state")) ?: "?";
        const char *reason = json_string_value(json_object_get(p, "exit_reason"));
        char st_buf[24];
        mt__text_escape(reason ? reason : state, st_buf, sizeof st_buf);
        /* The name is the process's own: escaped, so that it cannot move the cursor. */
        char name[MT_TEXT_ESC_SIZE(64)];
        mt__text_escape(json_string_value(json_object_get(p, "name")), name, sizeof name);
        fprintf(f, "%-8d ", pid);
        if (ranked)
            fprintf(f, "%-20.20s ", rank_cell(p, rk, sizeof rk));
        /* Drops as a share of what the process offered: the default mode's price. */
        double dropped = num(p, "dropped");
        char drops[48];
        if (dropped > 0)
            snprintf(drops, sizeof drops, "%.0f (%.1f%%)", dropped,
                     100 * dropped / (dropped + events));
        else
            snprintf(drops, sizeof drops, "0");
        fprintf(f, "%-16.16s %-8s %11s %11s %11s %5.1f%% %5.1f%% %11s %11s %9.0f %14s\n", name,
                st_buf, human(num(p, "allocated_bytes"), a, sizeof a),
                human(num(p, "reserved_bytes"), r, sizeof r),
                human(num(p, "peak_allocated_bytes"), pk, sizeof pk), 100 * num(p, "utilization"),
                100 * num(p, "fragmentation"), outside_cell(p, "used", ub, sizeof ub),
                outside_cell(p, "outside", ob, sizeof ob), rate_of(t, pid, events, dt), drops);
        if (ncur < MAX_RATES)
            cur[ncur++] = (rate_t){pid, events};
        double total = num(p, "allocated_bytes");
        size_t j;
        json_t *tg;
        json_array_foreach(json_object_get(p, "tags"), j, tg)
        {
            double v = num(tg, "allocated_bytes");
            int width = 30, fill = total > 0 ? (int)(width * v / total + 0.5) : 0;
            char bar[64];
            for (int k = 0; k < width; k++)
                bar[k] = k < fill ? '#' : '.';
            bar[width] = '\0';
            char vb[32], pb[32], ub[32], tn[MT_TEXT_ESC_SIZE(32)];
            fprintf(f, "         %-14.14s [%s] %10s  peak %s",
                    mt__text_escape(json_string_value(json_object_get(tg, "name")) ?: "?", tn,
                                    sizeof tn),
                    bar, human(v, vb, sizeof vb), human(num(tg, "peak_bytes"), pb, sizeof pb));
            /* After dropped events: blocks whose free may have been lost, not counted. */
            if (num(tg, "uncertain_bytes") > 0)
                fprintf(f, "  (+ up to %s uncertain)",
                        human(num(tg, "uncertain_bytes"), ub, sizeof ub));
            fputc('\n', f);
        }
        if (json_object_get(p, "uncertain_bytes")) {
            char ub[32], tb[32];
            fprintf(f,
                    "         %-14s events were lost: up to %s of blocks may be freed already, %s "
                    "allocated unseen\n",
                    "uncertain", human(num(p, "uncertain_bytes"), ub, sizeof ub),
                    human(num(p, "untracked_bytes"), tb, sizeof tb));
        }
        /* Several devices: one line each; the process line above is their sum. */
        json_t *devs = json_object_get(p, "devices"), *dv;
        if (json_array_size(devs) > 1)
            json_array_foreach(devs, j, dv)
            {
                char da[32], dr[32], dp[32], dn[16];
                snprintf(dn, sizeof dn, "device %d", (int)num(dv, "device"));
                fprintf(f, "         %-14s %s allocated, %s reserved, peak %s (of the sum above)\n",
                        dn, human(num(dv, "allocated_bytes"), da, sizeof da),
                        human(num(dv, "reserved_bytes"), dr, sizeof dr),
                        human(num(dv, "peak_allocated_bytes"), dp, sizeof dp));
            }
        json_array_foreach(json_object_get(p, "outside"), j, dv) render_outside(f, dv);
        /* Pinned host memory is not device memory: the figures above exclude it. */
        json_t *h = json_object_get(p, "host");
        if (num(h, "peak_reserved_bytes") > 0) {
            char ha[32], hr[32], hp[32];
            fprintf(f, "         %-14s %s allocated, %s reserved, peak %s\n", "pinned host",
                    human(num(h, "allocated_bytes"), ha, sizeof ha),
                    human(num(h, "reserved_bytes"), hr, sizeof hr),
                    human(num(h, "peak_allocated_bytes"), hp, sizeof hp));
        }
    }
    render_callsites(f, procs, t, bold, norm);
    memcpy(t->prev, cur, ncur * sizeof cur[0]);
    t->nprev = ncur;
    t->prev_time = now;
    fflush(f);
}

static json_t *fetch(const char *sock, char *err, size_t errlen)
{
    char *s = NULL;
    int rc = mt__d_client_state(sock, 5000, &s);
    if (rc) {
        snprintf(err, errlen, "no daemon (%s); start one with `memtrace daemon`", mt_strerror(rc));
        return NULL;
    }
    json_error_t jerr;
    json_t *st = json_loads(s, 0, &jerr);
    free(s);
    if (!st || !json_is_array(json_object_get(st, "processes"))) {
        snprintf(err, errlen, "unexpected answer from the daemon");
        json_decref(st);
        return NULL;
    }
    return st;
}

typedef struct top_opts_s {
    const char *sock; /* NULL: the default socket */
    long interval;    /* ms between views, 50..600000 */
    long pid;         /* the process whose call sites are shown; 0: the largest */
    bool once, json;  /* one plain view / the state JSON, then exit */
} top_opts_t;

static int parse_args(int argc, char **argv, top_opts_t *o)
{
    static const struct option opts[] = {
        {"interval", required_argument, NULL, 'i'},
        {"once", no_argument, NULL, 'o'},
        {"json", no_argument, NULL, 'j'},
        {"socket", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {"pid", required_argument, NULL, 'p'},
        {0},
    };
    *o = (top_opts_t){.interval = 1000};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'i':
            o->interval = strtol(optarg, NULL, 10);
            if (o->interval < 50 || o->interval > 600000) {
                fprintf(stderr, "memtrace top: --interval takes 50..600000 ms\n");
                return 2;
            }
            break;
        case 'o':
            o->once = true;
            break;
        case 'p': {
            char *end;
            o->pid = strtol(optarg, &end, 10);
            if (*end != '\0' || o->pid <= 0 || o->pid > INT32_MAX) {
                fprintf(stderr, "memtrace top: --pid wants a process id\n");
                return 2;
            }
            break;
        }
        case 'j':
            o->json = true;
            break;
        case 's':
            o->sock = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "memtrace top: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return MT_TOOL_RUN;
}

/* --json, --once: one state, printed. */
static int run_once(const top_opts_t *o)
{
    char err[160];
    top_t t = {.pid = (int)o->pid};
    json_t *st = fetch(o->sock, err, sizeof err);
    if (!st) {
        fprintf(stderr, "memtrace top: %s\n", err);
        return 1;
    }
    if (o->json) {
        json_dumpf(st, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
    } else {
        render(stdout, st, &t, false);
    }
    json_decref(st);
    return 0;
}

/* The live view, redrawn every interval until q, SIGINT or SIGTERM. */
static int run(const top_opts_t *o)
{
    if (o->json || o->once)
        return run_once(o);
    char err[160];
    top_t t = {.pid = (int)o->pid};
    struct termios saved;
    bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
    if (tty) {
        struct termios raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    struct sigaction sa = {.sa_handler = on_quit_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fputs("\033[?25l", stdout); /* hide the cursor while redrawing */
    int status = 0;
    bool stdin_open = true;
    while (!quit_signal) {
        json_t *st = fetch(o->sock, err, sizeof err);
        if (!st) {
            status = 1;
            break;
        }
        render(stdout, st, &t, true);
        json_decref(st);
        /* A closed stdin (not a terminal) is no longer watched: poll then just waits. */
        struct pollfd pfd = {.fd = stdin_open ? STDIN_FILENO : -1, .events = POLLIN};
        if (poll(&pfd, 1, (int)o->interval) > 0) {
            char c;
            ssize_t r = read(STDIN_FILENO, &c, 1);
            if (r == 1 && (c == 'q' || c == 'Q'))
                break;
            if (r == 0)
                stdin_open = false;
        }
    }
    fputs("\033[?25h", stdout);
    fflush(stdout);
    if (tty)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    if (status)
        fprintf(stderr, "memtrace top: %s\n", err);
    return status;
}

int mt_cmd_top(int argc, char **argv)
{
    top_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
