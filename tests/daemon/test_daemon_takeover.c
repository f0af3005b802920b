/* A producer whose daemon goes away keeps recording: the profiler's watcher sees the
 * connection close and moves the ring's reading to the local log, from where the daemon
 * stopped. The daemon runs in a child process so that it can be stopped by SIGTERM (clean
 * shutdown: its final drain has a budget, the rest must reach the local log, none twice)
 * or killed by SIGKILL. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "memtrace/prof.h"
#include "analysis/report.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

#define MAX_SEQ 40000

typedef struct seqs_s {
    unsigned char seen[MAX_SEQ]; /* times each seq of our pid was logged */
    unsigned hellos, exits;
} seqs_t;

/* Counts, per seq, the event lines of pid in the NDJSON file at path (a missing file
 * counts nothing). */
static void read_log(const char *path, int pid, seqs_t *s)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (j == NULL)
            continue; /* a line a killed daemon did not finish */
        if (json_integer_value(json_object_get(j, "pid")) == pid) {
            const char *type = json_string_value(json_object_get(j, "type"));
            if (type && strcmp(type, "event") == 0) {
                json_int_t seq = json_integer_value(json_object_get(j, "seq"));
                assert_true(seq >= 0 && seq < MAX_SEQ);
                s->seen[seq]++;
            } else if (type && strcmp(type, "hello") == 0) {
                s->hellos++;
            } else if (type && strcmp(type, "exit") == 0) {
                s->exits++;
            }
        }
        json_decref(j);
    }
    fclose(f);
}

/* `memtrace report DAEMON LOCAL`'s reading: both logs into one report (events of our pid). */
static void report_of(const char *const paths[2], uint64_t *events, uint64_t *dups)
{
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(paths[i], "r");
        assert_non_null(f);
        char line[4096], err[128];
        while (fgets(line, sizeof line, f))
            (void)mt__report_add_line(r, line, strlen(line), err, sizeof err);
        fclose(f);
    }
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    *events = *dups = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(res, "processes"), i, p)
    {
        if (json_integer_value(json_object_get(p, "pid")) == getpid()) {
            *events = (uint64_t)json_integer_value(json_object_get(p, "events"));
            *dups = (uint64_t)json_integer_value(json_object_get(p, "duplicates"));
        }
    }
    json_decref(res);
    mt__report_destroy(&r);
}

static void record(mt_prof_t *p, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        mt_event_rec_t ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = (i & 1) ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC;
        ev.time_ns = 1 + i;
        ev.addr = 0x10000 + 512 * (uint64_t)(i / 2);
        ev.size = 512;
        ev.tag = MT_TAG_ACTIVATIONS;
        ev.pool = MT_POOL_SMALL;
        assert_int_equal(mt_prof_record(p, &ev), 0);
    }
}

static void run(int sig)
{
    char dir[64], sock[128], dlog[128], llog[128];
    snprintf(dir, sizeof dir, "/tmp/mt-takeover-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(dlog, sizeof dlog, "%s/daemon.ndjson", dir);
    snprintf(llog, sizeof llog, "%s/local.ndjson", dir);
    pid_t dpid = th_daemon_child(sock, dlog);

    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_AUTO;
    cfg.socket = sock;
    cfg.log_path = llog;
    cfg.slots = 1 << 15;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_DAEMON);
    assert_null(mt_prof_log_path(p));

    /* Part read by the daemon, then more than its final drain's budget (4096) left in the
     * ring when it is told to stop. */
    enum { FIRST = 3000, UNREAD = 10000, AFTER = 5000 };
    record(p, FIRST);
    for (int i = 0; i < 200; i++) {
        mt_prof_stats(p, &st);
        if (st.delivered == FIRST)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st.delivered, FIRST);
    record(p, UNREAD);
    assert_int_equal(kill(dpid, sig), 0);
    int wst = th_wait(dpid);
    if (sig == SIGTERM)
        assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);

    /* The watcher takes over: the mode turns to the local log. */
    const char *path = NULL;
    for (int i = 0; i < 300 && path == NULL; i++) {
        path = mt_prof_log_path(p);
        if (path == NULL) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    assert_non_null(path);
    assert_string_equal(path, llog);
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_LOG);
    record(p, AFTER);
    mt_prof_destroy(&p);

    const unsigned total = FIRST + UNREAD + AFTER;
    seqs_t *d = calloc(1, sizeof *d), *l = calloc(1, sizeof *l);
    assert_non_null(d);
    assert_non_null(l);
    read_log(dlog, getpid(), d);
    read_log(llog, getpid(), l);
    assert_int_equal(l->hellos, 1);
    assert_int_equal(l->exits, 1);
    /* The local log holds one unbroken run of seqs, to the last event recorded. */
    unsigned first_local = 0;
    while (first_local < total && l->seen[first_local] == 0)
        first_local++;
    assert_true(first_local <= FIRST + UNREAD); /* everything after the stop, at least */
    for (unsigned s = first_local; s < total; s++)
        assert_int_equal(l->seen[s], 1);
    assert_int_equal(l->seen[total], 0);
    if (sig == SIGTERM) {
        /* A clean stop: the two logs together hold every event exactly once. */
        for (unsigned s = 0; s < total; s++)
            assert_int_equal(d->seen[s] + l->seen[s], 1);
        assert_true(first_local > FIRST); /* the daemon's final drain read some */
    } else {
        /* Killed: the daemon's log may lack what it had not written out, but whatever it
         * read before the kill and did not acknowledge is in the local log again. */
        for (unsigned s = 0; s < FIRST; s++)
            assert_true(d->seen[s] + l->seen[s] >= 1);
    }
    /* Read together, the two logs give each event once. */
    unsigned distinct = 0, twice = 0;
    for (unsigned q = 0; q < total; q++) {
        distinct += d->seen[q] + l->seen[q] > 0;
        twice += d->seen[q] + l->seen[q] > 1;
    }
    const char *const paths[2] = {dlog, llog};
    uint64_t events, dups;
    report_of(paths, &events, &dups);
    assert_int_equal(events, distinct);
    assert_int_equal(dups, twice);
    if (sig == SIGTERM)
        assert_int_equal(events, total);
    free(d);
    free(l);
    unlink(dlog);
    unlink(llog);
    unlink(sock);
    rmdir(dir);
}

static void test_daemon_stopped(void **state)
{
    (void)state;
    run(SIGTERM);
}

static void test_daemon_killed(void **state)
{
    (void)state;
    run(SIGKILL);
}

/* The state ("running" or "exited") the daemon shows for pid, "" if it does not know it. */
static const char *state_of(const char *sock, int pid, char *buf, size_t len)
{
    json_t *st = th_state(sock);
    buf[0] = '\0';
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(st, "processes"), i, p)
    {
        if (json_integer_value(json_object_get(p, "pid")) == pid)
            snprintf(buf, len, "%s", json_string_value(json_object_get(p, "state")));
    }
    json_decref(st);
    return buf;
}

/* A forked child that destroys its copy of the profiler (its atexit, say) leaves the
 * parent's recording alone: no exit flag, no shutdown of the shared connection, so no
 * takeover, and the parent's later events still reach the daemon. */
static void test_forked_child_leaves_parent(void **state)
{
    (void)state;
    char dir[64], sock[128];
    snprintf(dir, sizeof dir, "/tmp/mt-takeover-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    pid_t dpid = th_daemon_child(sock, NULL);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.socket = sock;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    record(p, 100);
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        mt_prof_destroy(&p);
        _exit(p == NULL ? 0 : 1);
    }
    int wst = th_wait(child);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    record(p, 100);
    assert_int_equal(mt_prof_flush(p), 0);
    mt_prof_stats_t st;
    for (int i = 0; i < 300; i++) {
        mt_prof_stats(p, &st);
        if (st.delivered == 200)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st.delivered, 200);
    assert_int_equal(st.mode, MT_PROF_DAEMON);
    assert_null(mt_prof_log_path(p));
    char buf[32];
    assert_string_equal(state_of(sock, getpid(), buf, sizeof buf), "running");
    mt_prof_destroy(&p);
    assert_int_equal(kill(dpid, SIGTERM), 0);
    wst = th_wait(dpid);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_stopped),
        cmocka_unit_test(test_daemon_killed),
        cmocka_unit_test(test_forked_child_leaves_parent),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
