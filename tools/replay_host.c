/* jemalloc's row of `memtrace replay`, measured by a child with jemalloc preloaded
 * (replay_host.h says why not in this process). */
#include "tools/replay_host.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "analysis/replay.h"
#include "analysis/trace_csv.h"
#include "mt_config.h"

extern char **environ;

#define PRELOAD_VAR "LD_PRELOAD="

/* ---- parent ---- */

/* environ with LD_PRELOAD=lib first; a preload already set stays, after it. Returns a new
 * array whose new entry is *entry (new); NULL on allocation failure. */
static char **env_with_preload(const char *lib, char **entry)
{
    size_t n = 0;
    const char *old = "";
    for (char **e = environ; *e != NULL; e++) {
        if (strncmp(*e, PRELOAD_VAR, strlen(PRELOAD_VAR)) == 0)
            old = *e + strlen(PRELOAD_VAR);
        else
            n++;
    }
    size_t len = strlen(PRELOAD_VAR) + strlen(lib) + 1 + strlen(old) + 1;
    char **env = calloc(n + 2, sizeof *env);
    *entry = malloc(len);
    if (env == NULL || *entry == NULL) {
        free(env);
        free(*entry);
        *entry = NULL;
        return NULL;
    }
    snprintf(*entry, len, "%s%s%s%s", PRELOAD_VAR, lib, old[0] ? ":" : "", old);
    size_t k = 0;
    env[k++] = *entry;
    for (char **e = environ; *e != NULL; e++) {
        if (strncmp(*e, PRELOAD_VAR, strlen(PRELOAD_VAR)) != 0)
            env[k++] = *e;
    }
    env[k] = NULL;
    return env;
}

/* Reads fd to its end; keeps the first cap - 1 bytes, NUL-terminated. */
static void read_all(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    char sink[4096];
    for (;;) {
        char *to = len < cap - 1 ? buf + len : sink;
        size_t room = len < cap - 1 ? cap - 1 - len : sizeof sink;
        ssize_t r = read(fd, to, room);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (to != sink)
            len += (size_t)r;
    }
    buf[len] = '\0';
}

/* What the child's status and output (stdout and stderr, the loader's messages included)
 * say, as *out. The loader's text itself is never shown. */
static void read_verdict(const char *lib, int status, const char *text, mt_tool_jemalloc_t *out)
{
    const char *tag = strstr(text, MT_TOOL_HOST_TAG);
    uint64_t ns = 0;
    char ver[sizeof out->version] = "";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && tag != NULL &&
        sscanf(tag + strlen(MT_TOOL_HOST_TAG), "ns %" SCNu64 " version %31s", &ns, ver) == 2) {
        out->measured = true;
        out->ns = ns;
        ver[strcspn(ver, "-")] = '\0'; /* "5.3.0-0-g54eaed1d..." reads 5.3.0 */
        snprintf(out->version, sizeof out->version, "%s", ver);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3 &&
        strstr(text, "cannot open shared object file") != NULL)
        snprintf(out->note, sizeof out->note, "jemalloc left out: not installed (%s not found)",
                 lib);
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 3 &&
             strstr(text, "cannot be preloaded") != NULL)
        snprintf(out->note, sizeof out->note, "jemalloc left out: %s did not load", lib);
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 3)
        snprintf(out->note, sizeof out->note, "jemalloc left out: %s is not jemalloc", lib);
    else if (strstr(text, "out of memory") != NULL || strstr(text, "Cannot allocate") != NULL)
        snprintf(out->note, sizeof out->note, "jemalloc left out: out of memory");
    else if (WIFSIGNALED(status))
        snprintf(out->note, sizeof out->note,
                 "jemalloc left out: the process measuring it was killed by signal %d",
                 WTERMSIG(status));
    else
        snprintf(out->note, sizeof out->note,
                 "jemalloc left out: the process measuring it failed (exit status %d)",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

void mt_tool_jemalloc_measure(const char *trace_path, unsigned rounds, mt_tool_jemalloc_t *out)
{
    *out = (mt_tool_jemalloc_t){0};
    if (MT_SANITIZED) {
        /* The sanitizer's runtime must stay the process's malloc. */
        snprintf(out->note, sizeof out->note,
                 "jemalloc left out: a sanitizer build cannot preload another malloc");
        return;
    }
    if (strcmp(trace_path, "-") == 0) { /* the process reads the trace again */
        snprintf(out->note, sizeof out->note,
                 "jemalloc left out: the trace came from standard input (give its file)");
        return;
    }
    const char *lib = getenv("MEMTRACE_JEMALLOC");
    if (lib == NULL || lib[0] == '\0')
        lib = MT_TOOL_JEMALLOC_DEFAULT;
    if (strpbrk(lib, ": \t") != NULL) {
        snprintf(out->note, sizeof out->note,
                 "jemalloc left out: MEMTRACE_JEMALLOC must name one library");
        return;
    }
    char rounds_s[16], text[4096];
    snprintf(rounds_s, sizeof rounds_s, "%u", rounds ? rounds : 1);
    char *argv[] = {"memtrace", "replay",           "--" MT_TOOL_HOST_OPTION,
                    rounds_s,   (char *)trace_path, NULL};
    char *entry = NULL;
    int fds[2], rc, status = 0;
    posix_spawn_file_actions_t fa;
    pid_t pid;

    char **env = env_with_preload(lib, &entry);
    if (env == NULL) {
        rc = ENOMEM;
        goto fail_env;
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        rc = errno;
        goto fail_pipe;
    }
    if ((rc = posix_spawn_file_actions_init(&fa)) != 0)
        goto fail_actions;
    /* Both of the child's outputs into the pipe: the loader's complaint about a missing
     * library is read here, not shown. */
    if ((rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO)) != 0 ||
        (rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO)) != 0)
        goto fail_spawn;
    fflush(NULL);
    if ((rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, env)) != 0)
        goto fail_spawn;
    close(fds[1]);
    fds[1] = -1;
    read_all(fds[0], text, sizeof text);
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            rc = errno;
            goto fail_spawn;
        }
    }
    read_verdict(lib, status, text, out);
    rc = 0;
fail_spawn:
    posix_spawn_file_actions_destroy(&fa);
fail_actions:
    close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
fail_pipe:
    free(env);
    free(entry);
fail_env:
    if (rc != 0)
        snprintf(out->note, sizeof out->note, "jemalloc left out: %s",
                 rc == ENOMEM ? "out of memory" : "cannot start the process that measures it");
}

/* ---- child ---- */

typedef int (*mallctl_fn)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);

int mt_tool_jemalloc_child(const char *trace_path, unsigned rounds)
{
    /* mallctl is jemalloc's alone: found, it is the library the parent preloaded, and its
     * malloc is the process's (a preloaded library comes before libc). */
    mallctl_fn mallctl;
    *(void **)&mallctl = dlsym(RTLD_DEFAULT, "mallctl");
    if (mallctl == NULL) {
        printf("%snot jemalloc\n", MT_TOOL_HOST_TAG);
        return 3;
    }
    const char *ver = NULL;
    size_t len = sizeof ver;
    if (mallctl("version", &ver, &len, NULL, 0) != 0 || ver == NULL)
        ver = "unknown";
    char err[MT_TRACE_ERR_LEN + 64];
    mt_trace_t *t = NULL;
    int rc = mt__trace_load(&t, trace_path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        return 1;
    }
    /* Through the same code as the glibc row: the process's malloc, jemalloc's here. */
    mt_host_alloc_t h;
    mt__host_alloc_load(&h, MT_HOST_GLIBC);
    uint64_t ns = mt__replay_host(&h, t, rounds);
    mt__trace_free(&t);
    if (ns == 0) {
        fprintf(stderr, "memtrace replay: out of memory\n");
        return 1;
    }
    printf("%sns %" PRIu64 " version %s\n", MT_TOOL_HOST_TAG, ns, ver);
    return 0;
}
