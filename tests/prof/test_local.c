/* The recorder's modes: no daemon -> local NDJSON log written by the drainer thread;
 * a (minimal, in-test) daemon -> registration line, ring handed over and unlinked,
 * events read by the daemon, clean exit flag; a refusing daemon; mode off. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "allocator/internal.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "profiler/ring.h"
#include "tests/common/test_main.h"

typedef struct logrec_s {
    char msgs[8][256];
    int n;
} logrec_t;

static void log_cb(void *ud, mt_log_level_e lvl, const char *msg)
{
    (void)lvl;
    logrec_t *l = ud;
    if (l->n < 8)
        snprintf(l->msgs[l->n++], sizeof(l->msgs[0]), "%s", msg);
}

static bool logged(const logrec_t *l, const char *needle)
{
    for (int i = 0; i < l->n; i++)
        if (strstr(l->msgs[i], needle))
            return true;
    return false;
}

static mt_event_rec_t ev_of(int kind, uint64_t i)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = (uint8_t)kind;
    ev.addr = 0x10000 + i * 512;
    ev.size = 512;
    ev.requested = i;
    ev.tag = MT_TAG_ACTIVATIONS;
    ev.pool = MT_POOL_SMALL;
    return ev;
}

static void tmp_path(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "/tmp/mt_prof_test_%d_%s", (int)getpid(), what);
}

/* A sim backend and an allocator on it recording into p. */
static mt_alloc_t *alloc_into(mt_prof_t *p, mt_backend_t **b)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    assert_int_equal(mt_backend_create(b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = *b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    return a;
}

static void test_fallback_to_local_log(void **state)
{
    (void)state;
    char sock[108], logp[108];
    tmp_path(sock, sizeof(sock), "nosuch.sock");
    tmp_path(logp, sizeof(logp), "log.ndjson");
    unlink(logp);
    setenv("MEMTRACE_SOCKET", sock, 1); /* nobody listens there */
    setenv("MEMTRACE_LOG", logp, 1);
    logrec_t lr = {.n = 0};
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    assert_int_equal(mt_prof_cfg_from_env(&cfg), 0); /* the program's edge */
    cfg.log = log_cb;
    cfg.log_ud = &lr;
    cfg.drain_ms = 1;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    assert_string_equal(mt_prof_log_path(p), logp);
    assert_true(logged(&lr, "local log"));
    /* Through the sink, as the allocator calls it. */
    const mt_event_sink_t *sink = mt_prof_sink(p);
    for (uint64_t i = 0; i < 500; i++) {
        mt_event_rec_t ev = ev_of(i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC, i);
        sink->emit(sink->ud, &ev);
    }
    /* The background drainer writes without being asked. */
    mt_prof_stats_t st;
    for (int i = 0; i < 2000; i++) {
        mt_prof_stats(p, &st);
        if (st.written == 500)
            break;
        usleep(1000);
    }
    assert_int_equal(st.written, 500);
    assert_int_equal(st.emitted, 500);
    assert_int_equal(st.mode, MT_PROF_LOG);
    /* The ring's name was removed: nothing is left in /dev/shm. */
    mt_prof_destroy(&p);
    assert_null(p);

    FILE *f = fopen(logp, "r");
    assert_non_null(f);
    char line[1024];
    int n = 0, events = 0, hello = 0, exits = 0;
    while (fgets(line, sizeof(line), f)) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        assert_non_null(j);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (!type) { /* a module line of the stack table (docs/telemetry.md) */
            assert_string_equal(json_string_value(json_object_get(j, "kind")), "module");
            json_decref(j);
            continue;
        }
        if (strcmp(type, "event") == 0) {
            mt_event_rec_t ev;
            assert_int_equal(mt_prof_event_from_json(j, &ev, NULL, NULL, 0), 0);
            assert_int_equal(ev.seq, (uint64_t)events);
            assert_int_equal(ev.requested, (uint64_t)events);
            assert_true(ev.time_ns > 0); /* stamped by the recorder */
            assert_string_equal(json_string_value(json_object_get(j, "tag")), "activations");
            events++;
        } else if (strcmp(type, "hello") == 0) {
            assert_int_equal(n, 0);
            hello++;
        } else if (strcmp(type, "exit") == 0) {
            assert_true(json_is_true(json_object_get(j, "clean")));
            assert_int_equal(json_integer_value(json_object_get(j, "emitted")), 500);
            exits++;
        }
        json_decref(j);
        n++;
    }
    fclose(f);
    assert_int_equal(hello, 1);
    assert_int_equal(events, 500);
    assert_int_equal(exits, 1);
    unlink(logp);
    unsetenv("MEMTRACE_SOCKET");
    unsetenv("MEMTRACE_LOG");
}

/* The configured tag_name overrides the stream's label for the tag it names. */
static const char *override_name(void *ud, int tag)
{
    (void)ud;
    return tag == MT_TAG_USER_FIRST + 1 ? "renamed" : NULL;
}

/* The "tag" of each event line of the log at path for tag id tag, in order, into out. */
static int tag_names_in_log(const char *path, int tag, char out[][32], int max)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        const char *kind = json_string_value(json_object_get(j, "kind"));
        if (kind && strcmp(kind, "alloc") == 0 &&
            json_integer_value(json_object_get(j, "tag_id")) == tag)
            snprintf(out[n++], 32, "%s", json_string_value(json_object_get(j, "tag")));
        json_decref(j);
    }
    fclose(f);
    return n;
}

/* Labels come from the stream: a user tag's events after its announcement are named by
 * it in the local log with no tag_name callback; the callback, when it answers, wins. */
static void test_log_names_from_stream(void **state)
{
    (void)state;
    char logp[108];
    tmp_path(logp, sizeof(logp), "labels.ndjson");
    unlink(logp);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = logp;
    cfg.tag_name = override_name;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_backend_t *b = NULL;
    mt_alloc_t *a = alloc_into(p, &b);
    int logits, other;
    assert_int_equal(mt_alloc_tag_register(a, "logits", &logits), 0);
    assert_int_equal(mt_alloc_tag_register(a, "embeddings", &other), 0);
    assert_int_equal(logits, MT_TAG_USER_FIRST);
    assert_int_equal(other, MT_TAG_USER_FIRST + 1);
    void *x, *y;
    assert_int_equal(mt_alloc_malloc(a, 1000, NULL, logits, &x), 0);
    assert_int_equal(mt_alloc_malloc(a, 1000, NULL, other, &y), 0);
    mt_alloc_free(a, x);
    mt_alloc_free(a, y);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt_prof_destroy(&p);
    char names[4][32];
    assert_int_equal(tag_names_in_log(logp, logits, names, 4), 1);
    assert_string_equal(names[0], "logits");
    assert_int_equal(tag_names_in_log(logp, other, names, 4), 1);
    assert_string_equal(names[0], "renamed");
    unlink(logp);
}

static void test_log_mode_drops_counted(void **state)
{
    (void)state;
    char logp[108];
    tmp_path(logp, sizeof(logp), "drops.ndjson");
    unlink(logp);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = logp;
    cfg.slots = 8;
    cfg.drain_ms = 60000; /* the drainer stays asleep: the ring fills */
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    int dropped = 0;
    for (uint64_t i = 0; i < 20; i++) {
        mt_event_rec_t ev = ev_of(MT_EV_ALLOC, i);
        if (mt_prof_record(p, &ev) == MT_EAGAIN)
            dropped++;
    }
    assert_int_equal(dropped, 12);
    assert_int_equal(mt_prof_flush(p), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.dropped, 12);
    assert_int_equal(st.written, 8 + 1); /* 8 events and one gap line */
    mt_prof_destroy(&p);
    FILE *f = fopen(logp, "r");
    assert_non_null(f);
    char line[1024];
    bool gap = false;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "\"type\":\"gap\"") && strstr(line, "\"lost\":12"))
            gap = true;
    fclose(f);
    assert_true(gap);
    unlink(logp);
}

/* A thread cache hands its events over in batches longer than a small ring. Such a batch
 * goes through push_n, which keeps what fits, not a claim, which would drop it whole: with
 * 128 slots and a sleeping drainer, 90 cached pairs leave more than 100 events in the log
 * (before, the cache's first batch of 256 was lost whole and 32 lines were written). */
static void test_batch_longer_than_ring(void **state)
{
    (void)state;
    char logp[108];
    tmp_path(logp, sizeof(logp), "bigbatch.ndjson");
    unlink(logp);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = logp;
    cfg.slots = 128;
    cfg.drain_ms = 60000; /* the drainer stays asleep */
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_backend_t *b = NULL;
    mt_alloc_t *a = alloc_into(p, &b);
    for (int i = 0; i < 90; i++) {
        void *x;
        assert_int_equal(mt_alloc_malloc(a, 65536, NULL, MT_TAG_ACTIVATIONS, &x), 0);
        mt_alloc_free(a, x);
    }
    assert_int_equal(mt_prof_flush(p), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    print_message("written %llu, dropped %llu\n", (unsigned long long)st.written,
                  (unsigned long long)st.dropped);
    assert_true(st.written > 100);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt_prof_destroy(&p);
    unlink(logp);
}

/* The same stream in lossless mode: the producer wakes the sleeping drainer and waits for
 * room, so nothing is dropped. */
static void test_lossless_waits(void **state)
{
    (void)state;
    char logp[108];
    tmp_path(logp, sizeof(logp), "lossless.ndjson");
    unlink(logp);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = logp;
    cfg.slots = 8;
    cfg.drain_ms = 60000; /* asleep unless woken */
    cfg.lossless_stall_ms = 10000;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    for (uint64_t i = 0; i < 200; i++) {
        mt_event_rec_t ev = ev_of(MT_EV_ALLOC, i);
        assert_int_equal(mt_prof_record(p, &ev), 0);
    }
    assert_int_equal(mt_prof_flush(p), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.dropped, 0);
    assert_int_equal(st.written, 200);
    assert_true(st.lossless);
    assert_true(st.lossless_waits > 0);
    assert_int_equal(st.lossless_stalls, 0);
    mt_prof_destroy(&p);
    FILE *f = fopen(logp, "r");
    assert_non_null(f);
    char line[1024];
    uint64_t events = 0, gaps = 0;
    while (fgets(line, sizeof(line), f)) {
        events += strstr(line, "\"kind\":\"alloc\"") != NULL;
        gaps += strstr(line, "\"type\":\"gap\"") != NULL;
    }
    fclose(f);
    assert_int_equal(events, 200);
    assert_int_equal(gaps, 0);
    unlink(logp);
}

/* A consumer that reads nothing (the log held at the file size limit) ends lossless mode
 * after the stall time: the producer is not held forever, and the drops are counted. */
static void test_lossless_stall_ends(void **state)
{
    (void)state;
    char logp[108];
    tmp_path(logp, sizeof(logp), "lossless-stall.ndjson");
    unlink(logp);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        rl.rlim_cur = 16 * 1024;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(11);
        logrec_t lr = {.n = 0};
        mt_prof_cfg_t cfg = mt_prof_cfg_default();
        cfg.mode = MT_PROF_LOG;
        cfg.log_path = logp;
        cfg.log = log_cb;
        cfg.log_ud = &lr;
        cfg.slots = 64;
        cfg.drain_ms = 1;
        cfg.lossless_stall_ms = 100;
        mt_prof_t *p = NULL;
        if (mt_prof_create(&p, &cfg) != 0)
            _exit(12);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (uint64_t i = 0; i < 4000; i++) {
            mt_event_rec_t ev = ev_of(MT_EV_ALLOC, i);
            mt_prof_record(p, &ev);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        mt_prof_stats_t st;
        mt_prof_stats(p, &st);
        if (st.lossless_stalls != 1 || st.lossless)
            _exit(13);
        if (st.dropped == 0)
            _exit(14);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (s < 0.1 || s > 30) /* waited once for the stall, not once per event */
            _exit(15);
        mt_prof_destroy(&p);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        fail_msg("the child was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    unlink(logp);
}

static void test_off_mode(void **state)
{
    (void)state;
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_OFF;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_event_rec_t ev = ev_of(MT_EV_ALLOC, 1);
    const mt_event_sink_t *s = mt_prof_sink(p);
    s->emit(s->ud, &ev);
    s->emit(s->ud, &ev);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.emitted, 2);
    assert_int_equal(st.mode, MT_PROF_OFF);
    assert_null(mt_prof_log_path(p));
    mt_prof_destroy(&p);
}

/* A profiler that is off costs nothing: an allocator given its sink works as with none (no
 * sink), and one given a recording profiler's sink keeps it; the thread caches are on in
 * both. */
static void test_off_profiler_is_no_sink(void **state)
{
    (void)state;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    for (int mode = MT_PROF_LOG; mode <= MT_PROF_OFF; mode += MT_PROF_OFF - MT_PROF_LOG) {
        mt_prof_cfg_t cfg = mt_prof_cfg_default();
        cfg.mode = mode;
        cfg.log_path = "/dev/null";
        mt_prof_t *p = NULL;
        assert_int_equal(mt_prof_create(&p, &cfg), 0);
        mt_alloc_cfg_t ac = mt_alloc_cfg_default();
        ac.backend = b;
        ac.sink = mt_prof_sink(p);
        mt_alloc_t *a = NULL;
        assert_int_equal(mt_alloc_create(&a, &ac), 0);
        void *x = NULL;
        assert_int_equal(mt_alloc_malloc(a, 65536, NULL, MT_TAG_ACTIVATIONS, &x), 0);
        assert_int_equal(mt_alloc_free(a, x), 0);
        bool off = mode == MT_PROF_OFF;
        assert_true((a->cfg.sink == NULL) == off);
        assert_int_equal(__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED), 1);
        assert_int_equal(a->rec, !off);
        mt_prof_stats_t st;
        mt_prof_stats(p, &st);
        if (off)
            assert_int_equal(st.emitted, 0); /* nothing even reached the sink */
        else
            assert_true(st.emitted > 0);
        mt_alloc_destroy(&a);
        mt_prof_destroy(&p);
    }
    mt_backend_destroy(&b);
}

/* The null device is a log a user may ask for (MEMTRACE_LOG=/dev/null discards events):
 * the checks against planted files let it through, and recording stays on. */
static void test_log_to_dev_null(void **state)
{
    (void)state;
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = "/dev/null";
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_event_rec_t ev = ev_of(MT_EV_ALLOC, 1);
    assert_int_equal(mt_prof_record(p, &ev), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_LOG);
    mt_prof_destroy(&p);
}

/* Auto mode never stops the program: no daemon and an unwritable log -> recording off. */
static void test_auto_degrades_to_off(void **state)
{
    (void)state;
    char sock[108];
    tmp_path(sock, sizeof(sock), "none.sock");
    logrec_t lr = {.n = 0};
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.socket = sock;
    cfg.log_path = "/nonexistent-dir/memtrace.ndjson";
    cfg.log = log_cb;
    cfg.log_ud = &lr;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    assert_true(logged(&lr, "profiler off"));
    mt_event_rec_t ev = ev_of(MT_EV_ALLOC, 1);
    assert_int_equal(mt_prof_record(p, &ev), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_OFF);
    assert_int_equal(st.emitted, 1);
    mt_prof_destroy(&p);
    /* In explicit log mode the same failure is an error. */
    cfg.mode = MT_PROF_LOG;
    assert_int_equal(mt_prof_create(&p, &cfg), MT_ENOENT);
    assert_null(p);
}

static void test_env_mode(void **state)
{
    (void)state;
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    setenv("MEMTRACE_PROF", "log", 1);
    assert_int_equal(mt_prof_cfg_from_env(&cfg), 0);
    assert_int_equal(cfg.mode, MT_PROF_LOG);
    setenv("MEMTRACE_PROF", "loud", 1);
    assert_int_equal(mt_prof_cfg_from_env(&cfg), MT_EINVAL);
    assert_int_equal(cfg.mode, MT_PROF_LOG);
    unsetenv("MEMTRACE_PROF");
    char buf[108];
    setenv("MEMTRACE_SOCKET", "/run/x.sock", 1);
    assert_int_equal(mt_prof_socket_path(buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/x.sock");
    unsetenv("MEMTRACE_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/5", 1);
    assert_int_equal(mt_prof_socket_path(buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/user/5/memtrace.sock");
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(mt_prof_socket_path(buf, sizeof(buf)), 0);
    char want[64];
    snprintf(want, sizeof(want), "/tmp/memtrace-%u/memtrace.sock", (unsigned)geteuid());
    assert_string_equal(buf, want);
    assert_int_equal(mt_prof_socket_path(buf, 8), MT_EOVERFLOW);
}

/* mt_prof_create reads no environment (docs/process-state.md): MEMTRACE_LOG and the
 * others reach it only through the cfg the program's edge filled. */
static void test_create_reads_no_env(void **state)
{
    (void)state;
    char logp[108], def[64];
    tmp_path(logp, sizeof(logp), "env.ndjson");
    unlink(logp);
    snprintf(def, sizeof(def), "./memtrace-%d.ndjson", (int)getpid());
    setenv("MEMTRACE_LOG", logp, 1);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    const char *got = mt_prof_log_path(p);
    bool is_default = got != NULL && strcmp(got, def) == 0;
    mt_prof_destroy(&p);
    unlink(def);
    unlink(logp);
    unsetenv("MEMTRACE_LOG");
    assert_true(is_default);
}

/* What mt_prof_cfg_from_env takes from the environment into the cfg. */
static void test_cfg_from_env_fields(void **state)
{
    (void)state;
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    assert_string_equal(cfg.oom_dir, "");
    assert_string_equal(cfg.default_socket, "");
    assert_int_equal(cfg.oom_interval_ms, MT_PROF_OOM_INTERVAL_MS);
    setenv("MEMTRACE_LOG", "/tmp/mt-env.ndjson", 1);
    setenv("MEMTRACE_OOM_DIR", "/tmp/mt-env-oom", 1);
    setenv("MEMTRACE_OOM_INTERVAL_MS", "0", 1);
    setenv("MEMTRACE_SOCKET", "/nonexistent/env.sock", 1);
    assert_int_equal(mt_prof_cfg_from_env(&cfg), 0);
    assert_string_equal(cfg.log_path, "/tmp/mt-env.ndjson");
    assert_string_equal(cfg.oom_dir, "/tmp/mt-env-oom");
    assert_int_equal(cfg.oom_interval_ms, 0);
    assert_string_equal(cfg.default_socket, "/nonexistent/env.sock");
    /* "off" names no directory; a malformed interval leaves the cfg's (warned). */
    setenv("MEMTRACE_OOM_DIR", "off", 1);
    setenv("MEMTRACE_OOM_INTERVAL_MS", "soon", 1);
    logrec_t lr = {.n = 0};
    cfg = mt_prof_cfg_default();
    cfg.log = log_cb;
    cfg.log_ud = &lr;
    assert_int_equal(mt_prof_cfg_from_env(&cfg), 0);
    assert_string_equal(cfg.oom_dir, "");
    assert_int_equal(cfg.oom_interval_ms, MT_PROF_OOM_INTERVAL_MS);
    assert_true(logged(&lr, "MEMTRACE_OOM_INTERVAL_MS='soon'"));
    unsetenv("MEMTRACE_LOG");
    unsetenv("MEMTRACE_OOM_DIR");
    unsetenv("MEMTRACE_OOM_INTERVAL_MS");
    unsetenv("MEMTRACE_SOCKET");
}

/* ---- a minimal daemon: the server side of the registration, as docs/telemetry.md
 * describes it, enough to test the producer side ---- */

typedef struct fake_daemon_s {
    int lfd;
    bool refuse;
    char hello[512]; /* the line received */
    uint64_t events; /* events read after the producer's EOF */
    uint32_t flags;  /* ring flags seen at EOF */
    bool name_gone;  /* the shm name no longer opens after the daemon unlinked it */
} fake_daemon_t;

static void count_cb(void *ud, const mt_event_rec_t *ev)
{
    if (ev->kind != MT_EV_GAP)
        (*(uint64_t *)ud)++;
}

static void *daemon_main(void *arg)
{
    fake_daemon_t *d = arg;
    int c = accept(d->lfd, NULL, NULL);
    if (c < 0)
        return NULL;
    size_t n = 0;
    while (n + 1 < sizeof(d->hello) && read(c, d->hello + n, 1) == 1 && d->hello[n] != '\n')
        n++;
    d->hello[n] = '\0';
    if (d->refuse) {
        const char *no = "{\"ok\":false,\"error\":\"too many producers\"}\n";
        ssize_t w = write(c, no, strlen(no));
        (void)w;
        close(c);
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loads(d->hello, 0, &e);
    mt__ring_t *r = NULL;
    if (j && mt__ring_open(&r, json_string_value(json_object_get(j, "shm"))) == 0) {
        mt__ring_unlink(r);
        mt__ring_t *again = NULL;
        d->name_gone =
            mt__ring_open(&again, json_string_value(json_object_get(j, "shm"))) == MT_ENOENT;
        mt__ring_set_flags(r, MT_RING_F_ATTACHED);
    }
    json_decref(j);
    const char *ok = r ? "{\"ok\":true}\n" : "{\"ok\":false,\"error\":\"bad ring\"}\n";
    ssize_t w = write(c, ok, strlen(ok));
    (void)w;
    /* Wait for EOF: the producer ended. Then drain once more. */
    char buf[256];
    while (read(c, buf, sizeof(buf)) > 0) {
    }
    close(c);
    if (r) {
        mt__ring_mark_dead(r);
        while (mt__ring_drain(r, count_cb, &d->events, SIZE_MAX) > 0) {
        }
        mt__ring_stats_t st;
        mt__ring_stats(r, &st);
        d->flags = st.flags;
        mt__ring_close(&r);
    }
    return NULL;
}

static int listen_on(const char *path)
{
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

static void test_daemon_mode(void **state)
{
    (void)state;
    char sock[108];
    tmp_path(sock, sizeof(sock), "d.sock");
    fake_daemon_t d = {.lfd = listen_on(sock)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, daemon_main, &d), 0);
    logrec_t lr = {.n = 0};
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "trainer";
    cfg.log = log_cb;
    cfg.log_ud = &lr;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    assert_true(logged(&lr, "daemon"));
    assert_null(mt_prof_log_path(p));
    for (uint64_t i = 0; i < 100; i++) {
        mt_event_rec_t ev = ev_of(MT_EV_ALLOC, i);
        assert_int_equal(mt_prof_record(p, &ev), 0);
    }
    assert_int_equal(mt_prof_flush(p), 0); /* a poke line */
    mt_prof_destroy(&p);
    pthread_join(th, NULL);
    close(d.lfd);
    unlink(sock);

    json_error_t e;
    json_t *h = json_loads(d.hello, 0, &e);
    assert_non_null(h);
    assert_string_equal(json_string_value(json_object_get(h, "type")), "hello");
    assert_string_equal(json_string_value(json_object_get(h, "role")), "producer");
    assert_int_equal(json_integer_value(json_object_get(h, "version")), 1);
    assert_int_equal(json_integer_value(json_object_get(h, "pid")), getpid());
    assert_string_equal(json_string_value(json_object_get(h, "name")), "trainer");
    assert_int_equal(json_integer_value(json_object_get(h, "slots")), MT_RING_DEFAULT_SLOTS);
    assert_non_null(strstr(json_string_value(json_object_get(h, "shm")), "/memtrace."));
    json_decref(h);
    assert_true(d.name_gone);
    assert_int_equal(d.events, 100);
    assert_true(d.flags & MT_RING_F_EXITED);
    assert_true(d.flags & MT_RING_F_ATTACHED);
}

static void test_daemon_refuses(void **state)
{
    (void)state;
    char sock[108], logp[108];
    tmp_path(sock, sizeof(sock), "r.sock");
    tmp_path(logp, sizeof(logp), "refused.ndjson");
    fake_daemon_t d = {.lfd = listen_on(sock), .refuse = true};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, daemon_main, &d), 0);
    logrec_t lr = {.n = 0};
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.log = log_cb;
    cfg.log_ud = &lr;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), MT_EPROTO);
    assert_null(p);
    assert_true(logged(&lr, "too many producers"));
    pthread_join(th, NULL);

    /* In auto mode a refusal falls back to the local log. */
    d.refuse = true;
    assert_int_equal(pthread_create(&th, NULL, daemon_main, &d), 0);
    cfg.mode = MT_PROF_AUTO;
    cfg.log_path = logp;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_LOG);
    mt_prof_destroy(&p);
    pthread_join(th, NULL);
    close(d.lfd);
    unlink(sock);
    unlink(logp);
}

/* A file size limit (ulimit -f) of 1 MiB, below the 24 MiB of the default ring and stack
 * table: the program is not killed by SIGXFSZ, records into a smaller ring, says so in a
 * warning, and leaves nothing in /dev/shm. In a child: the limit is per process. */
static void test_fsize_limit_smaller_ring(void **state)
{
    (void)state;
    char sock[108], logp[108];
    tmp_path(sock, sizeof(sock), "fsize.sock");
    tmp_path(logp, sizeof(logp), "fsize.ndjson");
    unlink(logp);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        rl.rlim_cur = 1 << 20;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(11);
        logrec_t lr = {.n = 0};
        mt_prof_cfg_t cfg = mt_prof_cfg_default();
        cfg.socket = sock; /* nobody listens there */
        cfg.log_path = logp;
        cfg.log = log_cb;
        cfg.log_ud = &lr;
        cfg.drain_ms = 1;
        mt_prof_t *p = NULL;
        if (mt_prof_create(&p, &cfg) != 0)
            _exit(12);
        if (!logged(&lr, "file size limit (ulimit -f, 1048576 bytes)"))
            _exit(13);
        for (uint64_t i = 0; i < 100; i++) {
            mt_event_rec_t ev = ev_of(MT_EV_ALLOC, i);
            mt_prof_record(p, &ev);
        }
        mt_prof_flush(p);
        mt_prof_stats_t st;
        mt_prof_stats(p, &st);
        if (st.mode != MT_PROF_LOG || st.written != 100)
            _exit(14);
        mt_prof_destroy(&p);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        fail_msg("the child was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "memtrace.%u.%d.", (unsigned)getuid(), (int)pid);
    DIR *d = opendir("/dev/shm");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            fail_msg("/dev/shm/%s was left behind", e->d_name);
    closedir(d);
    unlink(logp);
}

/* The local log reaches the file size limit (ulimit -f): a write that begins at the limit
 * raises SIGXFSZ, which kills the program. The log is held instead, as on a full disk:
 * the program lives on, what was written is whole lines, and the failure is said. */
static void test_fsize_limit_log_held(void **state)
{
    (void)state;
    char sock[108], logp[108];
    tmp_path(sock, sizeof(sock), "fsize2.sock");
    tmp_path(logp, sizeof(logp), "fsize2.ndjson");
    unlink(logp);
    const long limit = 64 * 1024;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        rl.rlim_cur = (rlim_t)limit;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(11);
        logrec_t lr = {.n = 0};
        mt_prof_cfg_t cfg = mt_prof_cfg_default();
        cfg.socket = sock;
        cfg.log_path = logp;
        cfg.log = log_cb;
        cfg.log_ud = &lr;
        cfg.drain_ms = 1;
        mt_prof_t *p = NULL;
        if (mt_prof_create(&p, &cfg) != 0)
            _exit(12);
        for (uint64_t i = 0; i < 4000; i++) {
            mt_event_rec_t ev = ev_of(i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC, i);
            mt_prof_record(p, &ev);
            if (i % 64 == 0)
                mt_prof_flush(p);
        }
        mt_prof_flush(p);
        mt_prof_stats_t st;
        mt_prof_stats(p, &st);
        if (st.written == 0 || st.written >= 4000)
            _exit(13);
        if (!logged(&lr, "File too large"))
            _exit(14);
        mt_prof_destroy(&p);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        fail_msg("the child was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    /* The file stops at the limit on a whole line. */
    FILE *f = fopen(logp, "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    assert_true(size > 0 && size <= limit);
    fseek(f, size - 1, SEEK_SET);
    assert_int_equal(fgetc(f), '\n');
    fclose(f);
    unlink(logp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_to_local_log),
        cmocka_unit_test(test_log_mode_drops_counted),
        cmocka_unit_test(test_batch_longer_than_ring),
        cmocka_unit_test(test_log_names_from_stream),
        cmocka_unit_test(test_off_mode),
        cmocka_unit_test(test_off_profiler_is_no_sink),
        cmocka_unit_test(test_log_to_dev_null),
        cmocka_unit_test(test_auto_degrades_to_off),
        cmocka_unit_test(test_env_mode),
        cmocka_unit_test(test_create_reads_no_env),
        cmocka_unit_test(test_cfg_from_env_fields),
        cmocka_unit_test(test_daemon_mode),
        cmocka_unit_test(test_daemon_refuses),
        cmocka_unit_test(test_fsize_limit_smaller_ring),
        cmocka_unit_test(test_fsize_limit_log_held),
        cmocka_unit_test(test_lossless_waits),
        cmocka_unit_test(test_lossless_stall_ends),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
