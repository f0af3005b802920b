/* memtraced's command line, shared by the `memtraced` executable and `memtrace daemon`. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [--socket PATH] [--port N|off] [--host ADDR] [--log FILE]\n"
            "       %*s [--max-exited N] [--queue-bytes N] [--foreground] [--quiet]\n"
            "       %*s [--metrics-open] [--http-name NAME] [--no-token]\n"
            "\n"
            "Runs memtraced, the memtrace profiler daemon: instrumented processes register\n"
            "their event rings on a Unix socket (mode 0600, same user only); the daemon\n"
            "drains them and serves the events live to `memtrace tail`, `memtrace top`, and\n"
            "over HTTP on 127.0.0.1: /events (Server-Sent Events), /metrics (Prometheus),\n"
            "/state (JSON of every process), /healthz, and the web page. Every HTTP route\n"
            "but /healthz and the page's static files needs the token of `memtrace token`\n"
            "(stored 0600 beside the socket), as 'Authorization: Bearer TOKEN' or\n"
            "'?token=TOKEN'; a browser opens http://localhost:PORT/#token=TOKEN.\n"
            "docs/telemetry.md, \"Security model\", says who can see what.\n"
            "\n"
            "options:\n"
            "  --socket PATH     Unix socket (default: $MEMTRACE_SOCKET, else\n"
            "                    $XDG_RUNTIME_DIR/memtrace.sock, else\n"
            "                    /tmp/memtrace-<uid>/memtrace.sock in a 0700 directory)\n"
            "  --port N|off      HTTP port on the host address (default %d; 0 = any free port)\n"
            "  --host ADDR       HTTP address (default 127.0.0.1)\n"
            "  --log FILE        append every event received to FILE as NDJSON\n"
            "                    (for `memtrace report FILE`; created 0600, an existing FILE\n"
            "                    must be ours and no symlink)\n"
            "  --metrics-open    /metrics without the token (for a Prometheus scraper); the\n"
            "                    other routes still need it\n"
            "  --http-name NAME  accept Host: NAME too (default: localhost, 127.0.0.1, [::1],\n"
            "                    the --host address)\n"
            "  --no-token        no token on any route: every local user reads every event\n"
            "  --max-exited N    exited processes kept in /state and /metrics (default 16)\n"
            "  --queue-bytes N   per-consumer queue limit before the oldest events are dropped\n"
            "                    (default 4194304)\n"
            "  --foreground      stay attached to the terminal (default: detach)\n"
            "  --quiet           no diagnostics on stderr\n"
            "\n"
            "examples:\n"
            "  %s --foreground --port 9477\n"
            "  %s --log run.ndjson && ./train &&\n"
            "    curl -s -H \"Authorization: Bearer $(memtrace token)\" localhost:9477/metrics\n"
            "  MEMTRACE_SOCKET=/tmp/mt.sock %s --port 0 --foreground\n",
            prog, (int)strlen(prog), "", (int)strlen(prog), "", MT_D_DEFAULT_PORT, prog, prog,
            prog);
}

static void log_stderr(void *ud, mt_log_level_e level, const char *msg)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "%s: %s: %s\n", (const char *)ud, names[level & 3], msg);
}

static bool parse_ulong(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v > max || s[0] == '-')
        return false;
    *out = v;
    return true;
}

/* What the command line asks for. Borrowed strings point into argv. */
typedef struct cli_opts_s {
    mt_d_cfg_t cfg;  /* the daemon's configuration, from the options alone */
    bool foreground; /* --foreground: no detaching */
    bool quiet;      /* --quiet: no diagnostics on stderr */
} cli_opts_t;

/* Below any exit status: parse_args's "the options are good, go on". */
#define CLI_RUN (-1)

/* The options into *o: CLI_RUN, or the exit status (0 for --help, 2 for a bad option, the
 * message printed). */
static int parse_args(int argc, char **argv, const char *prog, cli_opts_t *o)
{
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"port", required_argument, NULL, 'p'},
        {"host", required_argument, NULL, 'H'},
        {"log", required_argument, NULL, 'l'},
        {"max-exited", required_argument, NULL, 'm'},
        {"queue-bytes", required_argument, NULL, 'q'},
        {"foreground", no_argument, NULL, 'f'},
        {"metrics-open", no_argument, NULL, 'M'},
        {"http-name", required_argument, NULL, 'N'},
        {"no-token", no_argument, NULL, 'T'},
        {"quiet", no_argument, NULL, 'Q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    mt_d_cfg_t *cfg = &o->cfg;
    *cfg = mt__d_cfg_default();
    o->foreground = false;
    o->quiet = false;
    optind = 1;
    int ch;
    unsigned long v;
    int li = -1;
    while ((ch = getopt_long(argc, argv, "", opts, &li)) != -1) {
        switch (ch) {
        case 's':
            cfg->socket_path = optarg;
            break;
        case 'p':
            if (strcmp(optarg, "off") == 0)
                cfg->http_port = -1;
            else if (parse_ulong(optarg, 65535, &v))
                cfg->http_port = (int)v;
            else
                goto bad;
            break;
        case 'H':
            cfg->http_host = optarg;
            break;
        case 'l':
            cfg->log_path = optarg;
            break;
        case 'm':
            if (!parse_ulong(optarg, 1u << 20, &v))
                goto bad;
            cfg->max_exited = (unsigned)v;
            break;
        case 'q':
            if (!parse_ulong(optarg, 1ul << 34, &v) || v < 4096)
                goto bad;
            cfg->consumer_queue_bytes = v;
            break;
        case 'f':
            o->foreground = true;
            break;
        case 'M':
            cfg->metrics_open = true;
            break;
        case 'N':
            cfg->http_name = optarg;
            break;
        case 'T':
            cfg->http_auth = false;
            break;
        case 'Q':
            o->quiet = true;
            break;
        case 'h':
            usage(stdout, prog);
            return 0;
        default:
            usage(stderr, prog);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return 2;
    }
    return CLI_RUN;

bad:
    fprintf(stderr, "%s: --%s: bad value '%s'%s (see --help)\n", prog, opts[li].name, optarg,
            ch == 'p'   ? ": a port 0-65535 or 'off'"
            : ch == 'm' ? ": a count up to 1048576"
                        : ": bytes, 4096 up to 2^34");
    return 2;
}

/* Detaching: the parent returns only once the child has bound its sockets (or failed), so
 * that a script may connect right after `memtrace daemon` returns. In the child, CLI_RUN
 * with ready[1] the pipe to report on; in the parent (or on failure), the exit status. */
static int detach(const char *prog, int ready[2])
{
    if (pipe2(ready, O_CLOEXEC) != 0) {
        perror(prog);
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror(prog);
        return 1;
    }
    if (pid > 0) {
        close(ready[1]);
        char msg[256] = {0};
        ssize_t n = read(ready[0], msg, sizeof msg - 1);
        close(ready[0]);
        if (n <= 0 || strncmp(msg, "ok", 2) != 0) {
            fprintf(stderr, "%s: daemon failed to start%s%s\n", prog, n > 0 ? ": " : "",
                    n > 0 ? msg : "");
            return 1;
        }
        printf("%s: started, pid %d%s\n", prog, (int)pid, msg + 2);
        return 0;
    }
    close(ready[0]);
    setsid();
    return CLI_RUN;
}

/* Why mt__d_create failed with rc, in words, into why. */
static void why_not_started(int rc, const mt_d_cfg_t *cfg, char *why, size_t len)
{
    if (rc == -EADDRINUSE)
        snprintf(why, len,
                 "HTTP port %d on %s is taken by another program (--port N, or --port off)",
                 cfg->http_port, cfg->http_host);
    else if (rc == MT_EBUSY)
        snprintf(why, len, "%s is in use (another daemon answers there, or it is not a socket)",
                 cfg->socket_path ? cfg->socket_path : "the default socket");
    else
        snprintf(why, len, "%s", mt_strerror(rc));
}

/* The daemon from the options: 0 once it stopped (or, detaching, once it started), 1 if it
 * could not start or failed, 2 for an environment it cannot use. */
static int run(cli_opts_t *o, const char *prog)
{
    mt_d_cfg_t *cfg = &o->cfg;
    if (cfg->http_host && cfg->http_port >= 0 && strncmp(cfg->http_host, "127.", 4) != 0 &&
        strcmp(cfg->http_host, "::1") != 0 && strcmp(cfg->http_host, "localhost") != 0)
        fprintf(stderr,
                "%s: warning: HTTP on %s is reachable from other hosts: anyone who can reach "
                "the port sees every process of this user (names, pids, memory figures, "
                "events) at /, /state, /events, /metrics and the web page routes. Limit "
                "who can reach it (firewall).\n",
                prog, cfg->http_host);
    cfg->handle_signals = true;
    if (!o->quiet) {
        cfg->log = log_stderr;
        cfg->log_ud = (void *)prog;
    }
    /* The executables honour the environment (the socket, the OOM directory and interval);
     * the daemon core reads none. */
    if (mt__d_cfg_from_env(cfg) != 0 && cfg->socket_path == NULL) {
        fprintf(stderr, "%s: the socket path of MEMTRACE_SOCKET or XDG_RUNTIME_DIR is too long\n",
                prog);
        return 2;
    }

    int ready[2] = {-1, -1};
    if (!o->foreground) {
        int status = detach(prog, ready);
        if (status != CLI_RUN)
            return status;
    }

    mt_d_t *d = NULL;
    int rc = mt__d_create(&d, cfg);
    if (rc) {
        char why[320];
        why_not_started(rc, cfg, why, sizeof why);
        if (ready[1] >= 0) {
            dprintf(ready[1], "%s", why);
            _exit(1);
        }
        fprintf(stderr, "%s: cannot start: %s\n", prog, why);
        return 1;
    }
    if (ready[1] >= 0) {
        dprintf(ready[1], "ok, socket %s, http %d", mt__d_socket_path(d), mt__d_http_port(d));
        close(ready[1]);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
            if (nul > 2)
                close(nul);
        }
    } else if (!o->quiet) {
        fprintf(stderr, "%s: listening on %s", prog, mt__d_socket_path(d));
        if (mt__d_http_port(d) >= 0)
            fprintf(stderr, " and http://%s:%d/", cfg->http_host, mt__d_http_port(d));
        fprintf(stderr, "\n");
    }
    rc = mt__d_run(d);
    mt__d_destroy(&d);
    return rc ? 1 : 0;
}

int mt__d_cli_main(int argc, char **argv, const char *prog)
{
    cli_opts_t o;
    int status = parse_args(argc, argv, prog, &o);
    return status == CLI_RUN ? run(&o, prog) : status;
}
