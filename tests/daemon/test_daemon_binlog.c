/* The daemon's binary log (a log path ending in ".mtlog"): converted back, its event lines are
 * the very lines the daemon sent its consumer for the same records, in the same order, and
 * nothing in it is damaged. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "analysis/binlog_conv.h"
#include "harness.h"

/* The lines of a text, those containing needle, as one string each ("\n"-joined). */
static char *pick(const char *all, const char *needle, unsigned *n)
{
    size_t len = strlen(all);
    char *out = malloc(len + 1), *w = out;
    assert_non_null(out);
    *n = 0;
    for (const char *l = all; *l;) {
        const char *e = strchr(l, '\n');
        size_t k = e ? (size_t)(e - l) : strlen(l);
        if (memmem(l, k, needle, strlen(needle)) != NULL) {
            memcpy(w, l, k);
            w += k;
            *w++ = '\n';
            ++*n;
        }
        l += k + (e != NULL);
    }
    *w = '\0';
    return out;
}

/* What the consumer fd receives until it has `want` event lines and is quiet for quiet_ms,
 * or for 30 s at most. */
static char *receive(int fd, unsigned want, int quiet_ms)
{
    size_t cap = 64u << 20, len = 0, scanned = 0;
    unsigned events = 0;
    char *all = malloc(cap);
    assert_non_null(all);
    for (int waited = 0; waited < 30000;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, quiet_ms);
        if (r <= 0) {
            waited += quiet_ms;
            if (events >= want)
                break;
            continue;
        }
        ssize_t got = recv(fd, all + len, cap - 1 - len, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
        assert_true(len < cap - 1);
        all[len] = '\0';
        char *last = memrchr(all + scanned, '\n', len - scanned); /* whole lines only */
        if (last != NULL) {
            *last = '\0';
            for (char *q = all + scanned; (q = strstr(q, "\"type\":\"event\"")) != NULL; q++)
                events++;
            *last = '\n';
            scanned = (size_t)(last - all) + 1;
        }
    }
    all[len] = '\0';
    return all;
}

/* A producer of user tags named and named again: each tag's events carry the label it had
 * when they were recorded. */
static void labels_body(const char *sock)
{
    mt_prof_t *p = NULL;
    if (th_prof_open(sock, "th-labels", &p) != 0)
        _exit(10);
    static const char *const names[] = {"kv cache", "embeddings", "kv cache, renamed", "moe"};
    uint64_t t = 1000, seq_addr = 0x7f0000000000ull;
    for (int round = 0; round < 4; round++) {
        mt_event_rec_t lab = {
            .kind = MT_EV_TAG_LABEL, .tag = (uint8_t)(7 + round % 2), .time_ns = t++};
        mt_event_label_pack(&lab, names[round]);
        mt_prof_record(p, &lab);
        for (int i = 0; i < 3000; i++) {
            mt_event_rec_t ev = {.kind = i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC,
                                 .tag = (uint8_t)(7 + i % 3),
                                 .pool = MT_POOL_SMALL,
                                 .time_ns = t += 37,
                                 .addr = seq_addr + (uint64_t)(i / 2) * 512,
                                 .size = 512,
                                 .requested = 500};
            mt_prof_record(p, &ev);
            if (i % 500 == 0)
                usleep(2000); /* drained in many batches */
        }
    }
    mt_prof_destroy(&p);
    _exit(0);
}

static int count_bad(void *ud, const char *msg)
{
    fprintf(stderr, "damaged: %s\n", msg);
    ++*(unsigned *)ud;
    return 0;
}

static void test_binary_log_is_the_consumers_lines(void **state)
{
    (void)state;
    char log[96];
    snprintf(log, sizeof log, "/tmp/mt-dtest-binlog-%d.mtlog", (int)getpid());
    unlink(log);
    mt_d_cfg_t cfg = th_cfg();
    cfg.log_path = log;
    cfg.consumer_queue_bytes = 256u << 20; /* a slow reader here is dropped nothing */
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    int cons = th_consumer(t.sock, "");
    pid_t a = th_producer(t.sock, 20000, 65536, 500, -1);
    pid_t b = th_producer(t.sock, 5000, 65536, 100, -1);
    const char *args[5] = {t.sock, NULL};
    pid_t c = th_spawn("labels", args);
    char *got = receive(cons, 37004, 1000);
    assert_int_equal(th_wait(a), 0);
    assert_int_equal(th_wait(b), 0);
    assert_int_equal(th_wait(c), 0);
    close(cons);
    th_daemon_stop(&t);

    unsigned nsent, nlogged, bad = 0;
    char *sent = pick(got, "\"type\":\"event\"", &nsent);
    FILE *in = fopen(log, "rb");
    assert_non_null(in);
    char *conv = NULL;
    size_t convlen = 0;
    FILE *out = open_memstream(&conv, &convlen);
    uint64_t records = 0;
    assert_int_equal(mt__blog_to_ndjson(in, NULL, 0, out, count_bad, &bad, &records), 0);
    fclose(out);
    fclose(in);
    char *logged = pick(conv, "\"type\":\"event\"", &nlogged);
    assert_int_equal(bad, 0);
    fprintf(stderr, "%u event lines sent, %u logged\n", nsent, nlogged);
    assert_true(nsent >= 37000); /* every event of the three (with their tag labels) */
    /* user tags under each of their names (the lines compared carry them) */
    assert_non_null(strstr(logged, "\"tag\":\"kv cache, renamed\""));
    assert_non_null(strstr(logged, "\"tag\":\"moe\""));
    assert_int_equal(nlogged, nsent);
    assert_string_equal(logged, sent);
    /* the process lines the daemon writes itself are there too, as text */
    unsigned nproc;
    free(pick(conv, "\"type\":\"process_event\"", &nproc));
    assert_true(nproc >= 4); /* each producer's register and exit */
    free(logged);
    free(sent);
    free(conv);
    free(got);
    unlink(log);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    char **rargs;
    const char *role = th_role(argc, argv, &rargs);
    if (role != NULL && strcmp(role, "labels") == 0)
        labels_body(rargs[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_log_is_the_consumers_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
