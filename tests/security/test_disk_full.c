/* The local log on a full disk. Each case runs in a child whose file
 * size is limited (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG past it) or, as
 * root, whose log is on a 64 KiB tmpfs mounted in a mount namespace of its own (ENOSPC; the
 * mount goes with the child). The recorder must keep whole lines only, count in `written`
 * only what is in the file, say so once, keep the events it could not write in memory
 * (written when the disk has room again) and, at the end, name how many it lost and the
 * first of them. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "memtrace/prof.h"
#include "tests/security/common.h"
#include "tests/common/test_main.h"
#include "tests/common/test_text.h"

#define N     3000 /* about 600 KB of lines: far past 64 KiB */
#define LIMIT (64 << 10)

/* What a log file holds: whole lines only, each a JSON object; its event seqs. */
typedef struct file_s {
    unsigned events; /* "type":"event" lines */
    unsigned gaps;
    int64_t first_seq, last_seq;
    bool contiguous; /* event seqs first..last, each once, in order */
} file_t;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static file_t read_log(const char *path)
{
    file_t f = {.first_seq = -1, .last_seq = -1, .contiguous = true};
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, fp)) > 0) {
        CHECK(line[n - 1] == '\n', "a half line at the end: '%s'", line);
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        CHECK(j != NULL, "not JSON: '%s'", line);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "event") == 0) {
            int64_t seq = json_integer_value(json_object_get(j, "seq"));
            if (f.events == 0)
                f.first_seq = seq;
            else if (seq != f.last_seq + 1)
                f.contiguous = false;
            f.last_seq = seq;
            f.events++;
        } else if (type && strcmp(type, "gap") == 0) {
            f.gaps++;
        }
        json_decref(j);
    }
    free(line);
    fclose(fp);
    return f;
}

/* With `limit`, the file size limit is set once the ring exists (a shared-memory ring is
 * a file too, and bigger than the limit). */
static mt_prof_t *start(const char *log, sec_log_t *msgs, bool limit)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = log;
    cfg.slots = 4096; /* holds all N while the disk is full */
    cfg.log = sec_log_cb;
    cfg.log_ud = msgs;
    mt_prof_t *p = NULL;
    CHECK(mt_prof_create(&p, &cfg) == 0, "create");
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_FSIZE, &rl) == 0, "getrlimit");
    rl.rlim_cur = LIMIT;
    CHECK(!limit || setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    for (unsigned i = 0; i < N; i++) {
        mt_event_rec_t ev = {
            .kind = MT_EV_ALLOC, .addr = 0x100000 + 512u * i, .size = 512, .requested = 500};
        CHECK(mt_prof_record(p, &ev) == 0, "record %u", i);
    }
    return p;
}

/* The disk fills, then has room again: every event reaches the file, once. */
static void full_then_room(const char *dir)
{
    char log[256];
    snprintf(log, sizeof log, "%s/full.ndjson", dir);
    static sec_log_t msgs;
    mt_prof_t *p = start(log, &msgs, true);
    CHECK(mt_prof_flush(p) != 0, "a flush on a full disk reports the error");
    for (int i = 0; i < 3; i++)
        mt_prof_flush(p); /* retried, not announced again */
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    file_t f = read_log(log);
    CHECK(f.events > 0 && f.events < N, "%u events in the file", f.events);
    CHECK(st.written == f.events + f.gaps, "written %llu, in the file %u",
          (unsigned long long)st.written, f.events + f.gaps);
    CHECK(mt_test_count(msgs.text, "kept in memory") == 1, "said once: %s", msgs.text);
    CHECK(strstr(msgs.text, "File too large") != NULL, "names the error: %s", msgs.text);

    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_FSIZE, &rl) == 0, "getrlimit");
    rl.rlim_cur = rl.rlim_max; /* room again */
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    CHECK(mt_prof_flush(p) == 0, "a flush with room writes what was kept");
    mt_prof_destroy(&p);
    f = read_log(log);
    CHECK(f.events == N && f.gaps == 0 && f.contiguous, "%u events, %u gaps, contiguous %d",
          f.events, f.gaps, f.contiguous);
    CHECK(mt_test_count(msgs.text, ".ndjson again") == 1, "says it writes again: %s", msgs.text);
    CHECK(strstr(msgs.text, "were not written") == NULL, "nothing lost: %s", msgs.text);
}

/* The disk stays full to the end: the file holds whole lines, `written` counts them, and
 * the loss is named with its count and its first seq. */
static void full_to_the_end(const char *dir, const char *errname, bool limit)
{
    char log[256];
    snprintf(log, sizeof log, "%s/full.ndjson", dir);
    static sec_log_t msgs;
    mt_prof_t *p = start(log, &msgs, limit);
    CHECK(mt_prof_flush(p) != 0, "a flush on a full disk reports the error");
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    mt_prof_destroy(&p);
    file_t f = read_log(log);
    CHECK(f.events > 0 && f.events < N && f.contiguous, "%u events", f.events);
    CHECK(st.written == f.events, "written %llu, in the file %u", (unsigned long long)st.written,
          f.events);
    char want[512];
    snprintf(want, sizeof want, "%u events were not written to %s (%s), the first of them seq %lld",
             N - f.events, log, errname, (long long)f.last_seq + 1);
    CHECK(strstr(msgs.text, want) != NULL, "want '%s' in: %s", want, msgs.text);
    CHECK(mt_test_count(msgs.text, "kept in memory") == 1, "said once: %s", msgs.text);
}

static int run_child(void (*body)(const char *, const char *), const char *dir, const char *arg,
                     bool tmpfs)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        if (tmpfs) {
            /* A mount of our own, gone with this process. */
            if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
                mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700") != 0)
                _exit(77);
        }
        body(dir, arg);
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void body_room(const char *dir, const char *arg)
{
    (void)arg;
    full_then_room(dir);
}

/* arg: the error's name; EFBIG is the file size limit's. */
static void body_end(const char *dir, const char *arg)
{
    full_to_the_end(dir, arg, strcmp(arg, "File too large") == 0);
}

static void test_fsize_full_then_room(void **state)
{
    (void)state;
    char dir[64];
    sec_tmpdir(dir, sizeof dir);
    assert_int_equal(run_child(body_room, dir, NULL, false), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_fsize_full_to_the_end(void **state)
{
    (void)state;
    char dir[64];
    sec_tmpdir(dir, sizeof dir);
    assert_int_equal(run_child(body_end, dir, "File too large", false), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A real full file system (ENOSPC), where a tmpfs can be mounted. */
static void test_tmpfs_full_to_the_end(void **state)
{
    (void)state;
    char dir[64];
    sec_tmpdir(dir, sizeof dir);
    int rc = run_child(body_end, dir, "No space left on device", true);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    if (rc == 77) {
        printf("skipped: cannot mount a tmpfs in a mount namespace of our own (not root, or "
               "no CAP_SYS_ADMIN); the RLIMIT_FSIZE cases cover the same code\n");
        skip();
    }
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsize_full_then_room),
        cmocka_unit_test(test_fsize_full_to_the_end),
        cmocka_unit_test(test_tmpfs_full_to_the_end),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
