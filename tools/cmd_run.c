/* memtrace run: runs an unmodified CUDA program on the caching allocator through
 * libmemtrace-preload.so, then prints what happened to its device memory.
 *
 * The program's events go where the profiler sends them (a running daemon, else the
 * local NDJSON log: the profiler's own auto mode). The preload writes a JSON summary at
 * exit into a file named by MEMTRACE_SUMMARY_FILE, which this command reads back. On a
 * machine with no CUDA driver, a private directory whose libcuda.so.1 links to the
 * preload library goes first on LD_LIBRARY_PATH, so programs that dlopen the driver (as
 * the CUDA runtime does) find our sim-served driver functions (preload/hooks_driver.c and
 * hooks_driver_sim.c). */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "mt_config.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tools/commands.h"
#include "util/text.h"

#define PRELOAD_NAME "libmemtrace-preload.so"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: memtrace run [options] -- PROGRAM [ARGS...]\n"
            "\n"
            "Runs PROGRAM with its CUDA device allocations served by memtrace's caching\n"
            "allocator (LD_PRELOAD of " PRELOAD_NAME "), sends its allocator\n"
            "events to the memtrace daemon (or, when none runs, to a local NDJSON log),\n"
            "and prints a summary when it exits. PROGRAM's exit status is passed through\n"
            "(128 + N when it dies of signal N). Programs must link libcudart dynamically.\n"
            "Without a GPU, the memory API (allocation, copies, memsets, streams, events)\n"
            "is served on the sim backend, so programs that only move memory still run.\n"
            "\n"
            "options:\n"
            "  --backend auto|sim|cuda  device backend (default auto: cuda if a device\n"
            "                           answers, else sim)\n"
            "  --alloc-conf STR         allocator settings, e.g.\n"
            "                           expandable_segments:True,max_split_size_mb:128\n"
            "  --capacity BYTES         sim device size (K/M/G suffixes), default 8G\n"
            "  --context BYTES          sim: bytes each device's CUDA context holds, default 0\n"
            "  --devices N              sim devices (each --capacity), default 1\n"
            "  --telemetry MODE         auto|daemon|log|off (default auto)\n"
            "  --log FILE               local event log (default ./memtrace-<pid>.ndjson;\n"
            "                           a name ending in .mtlog: the binary log)\n"
            "  --log-format ndjson|binary  the local log's form; binary: 1/14 to 1/23 of the\n"
            "                           bytes, read by every memtrace reader\n"
            "  --lossless               the program waits for the recorder when its ring\n"
            "                           is full, instead of dropping events\n"
            "  --summary-json FILE      also write the summary as JSON to FILE\n"
            "  --quiet                  no summary on stderr, no memtrace notices\n"
            "  -h, --help               this help\n"
            "\n"
            "examples:\n"
            "  memtrace run -- ./train --epochs 1\n"
            "  memtrace run --backend sim --capacity 2G -- python3 infer.py\n"
            "  memtrace run --alloc-conf expandable_segments:True --summary-json s.json -- ./app\n"
            "\n"
            "environment: MEMTRACE_PRELOAD overrides where " PRELOAD_NAME " is found.\n");
}

static bool file_ok(const char *p)
{
    return access(p, R_OK) == 0;
}

/* The preload library: $MEMTRACE_PRELOAD, next to this binary (build tree: ../preload;
 * install: ../lib and ../lib/<multiarch>), then the build tree we came from. */
static int find_preload(char *out, size_t len)
{
    const char *env = getenv("MEMTRACE_PRELOAD");
    if (env != NULL && *env != '\0') {
        if (!file_ok(env))
            return -1;
        return realpath(env, out) ? 0 : -1;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL)
            *slash = '\0';
        const char *rel[] = {"../preload/", "../lib/", "../lib/x86_64-linux-gnu/", "../lib64/",
                             "./"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char cand[PATH_MAX + 64];
            snprintf(cand, sizeof cand, "%s/%s%s", exe, rel[i], PRELOAD_NAME);
            if (strlen(cand) < PATH_MAX && file_ok(cand) && realpath(cand, out))
                return 0;
        }
    }
    snprintf(out, len, "%s/preload/%s", MT_BUILD_ROOT, PRELOAD_NAME);
    return file_ok(out) ? 0 : -1;
}

/* Prepends value to the colon-separated list in env var name. */
static int env_prepend(const char *name, const char *value)
{
    const char *old = getenv(name);
    if (old == NULL || *old == '\0')
        return setenv(name, value, 1);
    size_t len = strlen(value) + strlen(old) + 2;
    char *v = malloc(len);
    if (v == NULL)
        return -1;
    snprintf(v, len, "%s:%s", value, old);
    int rc = setenv(name, v, 1);
    free(v);
    return rc;
}

/* A real CUDA driver loads here? (Then no libcuda.so.1 shim.) */
static bool have_driver(void)
{
    const char *p = getenv("MEMTRACE_LIBCUDA");
    void *h = dlopen(p && *p ? p : "libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h == NULL)
        return false;
    dlclose(h);
    return true;
}

static void human(char *buf, size_t len, double bytes)
{
    mt__text_bytes(bytes, 2, buf, len);
}

static double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static void print_summary(json_t *s, const char *prog, int status_code, int sig)
{
    char a[32], b[32], c[32];
    FILE *f = stderr;
    if (sig)
        fprintf(f, "memtrace run: %s was killed by signal %d (%s)\n", prog, sig, strsignal(sig));
    else
        fprintf(f, "memtrace run: %s exited with status %d\n", prog, status_code);
    if (s == NULL && sig) {
        fprintf(f, "  no summary: the process died before its exit handlers ran (the daemon, "
                   "if one ran, holds its last events)\n");
        return;
    }
    if (s == NULL) {
        fprintf(f, "  no summary: the program made no CUDA memory call that memtrace saw "
                   "(is libcudart linked statically? build with -cudart shared)\n");
        return;
    }
    human(a, sizeof a, num(s, "capacity"));
    fprintf(f, "  backend           %s (device capacity %s)\n",
            json_string_value(json_object_get(s, "backend")), a);
    double req = num(s, "requests"), bm = num(s, "backend_mallocs");
    fprintf(f, "  requests served   %.0f allocations, %.0f frees\n", req, num(s, "frees"));
    fprintf(f, "  backend mallocs   %.0f (backend calls saved: %.0f, %.1f %%)\n", bm,
            req > bm ? req - bm : 0, req > 0 && req > bm ? 100.0 * (req - bm) / req : 0.0);
    human(a, sizeof a, num(s, "peak_allocated"));
    human(b, sizeof b, num(s, "peak_reserved"));
    fprintf(f, "  peak allocated    %s\n  peak reserved     %s\n", a, b);
    fprintf(f, "  utilization       %.1f %% (peak allocated / peak reserved)\n",
            100.0 * num(s, "utilization"));
    json_t *tags = json_object_get(s, "tags");
    const char *tk;
    json_t *tv;
    json_object_foreach(tags, tk, tv)
    {
        human(a, sizeof a, num(tv, "peak"));
        human(b, sizeof b, num(tv, "total"));
        char e[MT_TEXT_ESC_SIZE(64)]; /* the program's own label: escaped for the terminal */
        fprintf(f, "  tag %-13s peak %s, %s allocated in total\n", mt__text_escape(tk, e, sizeof e),
                a, b);
    }
    if (num(s, "host_allocs") > 0)
        fprintf(f, "  pinned host       %.0f allocations\n", num(s, "host_allocs"));
    if (num(s, "unknown_frees") > 0)
        fprintf(f, "  unknown frees     %.0f (rejected with the CUDA invalid-value error)\n",
                num(s, "unknown_frees"));
    const char *tel = json_string_value(json_object_get(s, "telemetry"));
    const char *log = json_string_value(json_object_get(s, "event_log"));
    json_t *ev = json_object_get(s, "events");
    bool recorded = tel != NULL && strcmp(tel, "off") != 0;
    fprintf(f, "  events            %.0f alloc, %.0f free, %.0f segment allocs -> %s%s%s\n",
            num(ev, "alloc"), num(ev, "free_requested"), num(ev, "segment_alloc"),
            recorded ? tel : "not recorded (telemetry off)", log ? " " : "", log ? log : "");
    if (recorded) {
        /* The default mode drops what finds the ring full; say how much, and the way out. */
        double emitted = num(s, "events_emitted"), dropped = num(s, "events_dropped");
        bool lossless = json_is_true(json_object_get(s, "lossless"));
        double stalls = num(s, "lossless_stalls");
        if (dropped > 0)
            fprintf(f, "  events dropped    %.0f of %.0f (%.2f %%)%s\n", dropped, emitted,
                    emitted > 0 ? 100.0 * dropped / emitted : 0.0,
                    stalls > 0 ? ": lossless mode ended, its consumer stopped reading"
                    : lossless ? ""
                               : ": the ring was full; --lossless waits instead");
        else
            fprintf(f, "  events dropped    none of %.0f%s\n", emitted,
                    lossless ? " (lossless)" : "");
        if (lossless && num(s, "lossless_waits") > 0)
            fprintf(f, "  lossless waits    %.0f (the program waited for the recorder)\n",
                    num(s, "lossless_waits"));
    }
    double ooms = num(s, "ooms");
    if (ooms == 0) {
        fprintf(f, "  out of memory     no\n");
        return;
    }
    human(a, sizeof a, num(s, "allocated"));
    human(b, sizeof b, num(s, "reserved"));
    human(c, sizeof c, num(s, "capacity"));
    if (sig || status_code != 0)
        fprintf(f,
                "  out of memory     YES: the process failed after %.0f out-of-memory "
                "error(s)\n",
                ooms);
    else
        fprintf(f, "  out of memory     %.0f failed allocation(s), which the process survived\n",
                ooms);
    fprintf(f, "  final state       allocated %s, reserved %s of %s\n", a, b, c);
    char e[MT_TEXT_ESC_SIZE(512)];
    fprintf(f, "  last OOM          %s\n",
            mt__text_escape(json_string_value(json_object_get(s, "oom_message")), e, sizeof e));
}

static pid_t child_pid;

static void forward_signal(int sig)
{
    if (child_pid > 0)
        kill(child_pid, sig);
}

/* The options that only set the environment the program's preload reads. */
static const struct {
    const char *opt, *env;
} env_opts[] = {
    {"--backend", "MEMTRACE_BACKEND"},
    {"--alloc-conf", "MEMTRACE_ALLOC_CONF"},
    {"--capacity", "MEMTRACE_SIM_CAPACITY"},
    {"--context", "MEMTRACE_SIM_CONTEXT"},
    {"--devices", "MEMTRACE_SIM_DEVICES"},
    {"--telemetry", "MEMTRACE_PROF"},
    {"--log", "MEMTRACE_LOG"},
    {"--log-format", "MEMTRACE_LOG_FORMAT"},
};
#define NENV (sizeof env_opts / sizeof env_opts[0])

typedef struct run_opts_s {
    const char *env[NENV];    /* env_opts[i]'s value, or NULL: the environment's */
    bool lossless;            /* --lossless: MEMTRACE_PROF_LOSSLESS=1 */
    bool quiet;               /* no summary; the preload's log quiet unless set */
    const char *summary_json; /* --summary-json FILE, or NULL */
    char **prog;              /* the program and its arguments (argv's), NULL if none */
} run_opts_t;

static int parse_args(int argc, char **argv, run_opts_t *o)
{
    *o = (run_opts_t){0};
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = true;
            continue;
        } else if (strcmp(a, "--lossless") == 0) {
            o->lossless = true;
            continue;
        } else if (a[0] != '-') {
            break; /* the program, without "--" */
        }
        if (v == NULL) {
            fprintf(stderr, "memtrace run: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        size_t k = 0;
        while (k < NENV && strcmp(a, env_opts[k].opt) != 0)
            k++;
        if (k == 0 && strcmp(v, "auto") && strcmp(v, "sim") && strcmp(v, "cuda")) {
            fprintf(stderr, "memtrace run: --backend must be auto, sim or cuda\n");
            return 2;
        }
        if (k < NENV) {
            o->env[k] = v;
        } else if (strcmp(a, "--summary-json") == 0) {
            o->summary_json = v;
        } else {
            fprintf(stderr, "memtrace run: unknown option %s (see --help)\n", a);
            return 2;
        }
    }
    o->prog = i < argc ? argv + i : NULL;
    return MT_TOOL_RUN;
}

/* Sets the environment from the options, then refuses what the program's preload would
 * only warn about, before it runs; and a missing program. MT_TOOL_RUN or 2. */
static int apply_settings(const run_opts_t *o)
{
    for (size_t k = 0; k < NENV; k++)
        if (o->env[k])
            setenv(env_opts[k].env, o->env[k], 1);
    if (o->lossless)
        setenv("MEMTRACE_PROF_LOSSLESS", "1", 1);
    char err[256];
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    if (mt_backend_cfg_from_env(&bc, err, sizeof err) != 0) {
        fprintf(stderr, "memtrace run: %s%s\n", err,
                strncmp(err, "MEMTRACE_SIM_CAPACITY", 21) == 0  ? " (--capacity)"
                : strncmp(err, "MEMTRACE_SIM_DEVICES", 20) == 0 ? " (--devices)"
                                                                : "");
        return 2;
    }
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    if (mt_alloc_cfg_from_env(&ac, err, sizeof err) != 0) {
        fprintf(stderr, "memtrace run: MEMTRACE_ALLOC_CONF (--alloc-conf): %s\n", err);
        return 2;
    }
    const char *lf = getenv("MEMTRACE_LOG_FORMAT");
    if (lf && *lf && strcmp(lf, "ndjson") != 0 && strcmp(lf, "binary") != 0) {
        fprintf(stderr,
                "memtrace run: --log-format (MEMTRACE_LOG_FORMAT) must be ndjson or binary, "
                "not '%s'\n",
                lf);
        return 2;
    }
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    if (mt_prof_cfg_from_env(&pc) != 0) {
        fprintf(stderr,
                "memtrace run: --telemetry (MEMTRACE_PROF) must be auto, daemon, log or "
                "off, not '%s', and MEMTRACE_PROF_LOSSLESS 1, on, 0 or off, not '%s'\n",
                getenv("MEMTRACE_PROF") ? getenv("MEMTRACE_PROF") : "",
                getenv("MEMTRACE_PROF_LOSSLESS") ? getenv("MEMTRACE_PROF_LOSSLESS") : "");
        return 2;
    }
    if (mt_prof_stacks_from_env(&pc, err, sizeof err) != 0) {
        fprintf(stderr, "memtrace run: %s\n", err);
        return 2;
    }
    if (o->prog == NULL) {
        fprintf(stderr, "memtrace run: no program given\n");
        usage(stderr);
        return 2;
    }
    return MT_TOOL_RUN;
}

/* Runs prog with signals forwarded to it; its wait status in *st. 0, or 1 (no fork). */
static int spawn_and_wait(char **prog, int *st)
{
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    child_pid = fork();
    if (child_pid < 0) {
        fprintf(stderr, "memtrace run: fork: %s\n", strerror(errno));
        return 1;
    }
    if (child_pid == 0) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        execvp(prog[0], prog);
        fprintf(stderr, "memtrace run: cannot run %s: %s\n", prog[0], strerror(errno));
        _exit(127);
    }
    *st = 0;
    while (waitpid(child_pid, st, 0) < 0 && errno == EINTR)
        ;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return 0;
}

/* Runs the program under the preload, then prints its summary: the program's status
 * (128 + N if killed by signal N), or 1 when it could not be started. */
static int run(const run_opts_t *o)
{
    char **prog = o->prog;
    const bool quiet = o->quiet;
    if (quiet)
        setenv("MEMTRACE_LOG_LEVEL", "quiet", 0);

    char preload[PATH_MAX];
    if (find_preload(preload, sizeof preload) != 0) {
        fprintf(stderr, "memtrace run: cannot find %s (set MEMTRACE_PRELOAD)\n", PRELOAD_NAME);
        return 1;
    }
    if (env_prepend("LD_PRELOAD", preload) != 0)
        return 1;

    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/memtrace-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "memtrace run: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char summary[PATH_MAX + 32], shim[PATH_MAX + 32];
    snprintf(summary, sizeof summary, "%s/summary.json", dir);
    snprintf(shim, sizeof shim, "%s/libcuda.so.1", dir);
    setenv("MEMTRACE_SUMMARY_FILE", summary, 1);
    bool shimmed = false;
    if (!have_driver() && getenv("MEMTRACE_LIBCUDA") == NULL) {
        if (symlink(preload, shim) == 0 && env_prepend("LD_LIBRARY_PATH", dir) == 0)
            shimmed = true;
    }

    int st = 0;
    if (spawn_and_wait(prog, &st) != 0)
        return 1;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;

    json_error_t jerr;
    json_t *s = json_load_file(summary, 0, &jerr);
    if (!quiet && !(WIFEXITED(st) && code == 127 && s == NULL))
        print_summary(s, prog[0], code, sig);
    if (o->summary_json != NULL) {
        if (s == NULL || json_dump_file(s, o->summary_json, JSON_INDENT(2)) != 0)
            fprintf(stderr, "memtrace run: no summary written to %s\n", o->summary_json);
    }
    json_decref(s);
    unlink(summary);
    if (shimmed)
        unlink(shim);
    rmdir(dir);
    return sig ? 128 + sig : code;
}

int mt_cmd_run(int argc, char **argv)
{
    run_opts_t o;
    int status = parse_args(argc, argv, &o);
    if (status == MT_TOOL_RUN)
        status = apply_settings(&o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
