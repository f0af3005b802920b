/* The daemon's binary log (a log path ending in ".mtlog") and its binary consumers
 * ("format":"binary"): converted back, their event lines are the very lines the daemon sent
 * a JSON Lines consumer for the same records, in the same order, and nothing in them is
 * damaged. */
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
            /* memmem, bounded: ASan's strstr measures the whole rest at every call. */
            static const char ev[] = "\"type\":\"event\"";
            for (char *q = all + scanned;
                 (q = memmem(q, (size_t)(last - q), ev, sizeof ev - 1)) != NULL; q++)
                events++;
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

/* The binary log in as NDJSON (the readers' converter), every part sound; in is closed. */
static char *as_lines(FILE *in)
{
    char *conv = NULL;
    size_t convlen = 0;
    FILE *out = open_memstream(&conv, &convlen);
    unsigned bad = 0;
    uint64_t records = 0;
    assert_int_equal(mt__blog_to_ndjson(in, NULL, 0, out, count_bad, &bad, &records), 0);
    fclose(out);
    fclose(in);
    assert_int_equal(bad, 0);
    return conv;
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

    unsigned nsent, nlogged;
    char *sent = pick(got, "\"type\":\"event\"", &nsent);
    FILE *in = fopen(log, "rb");
    assert_non_null(in);
    char *conv = as_lines(in);
    char *logged = pick(conv, "\"type\":\"event\"", &nlogged);
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

/* Everything fd receives until it is quiet for quiet_ms (or 30 s pass); *len its bytes. */
static char *receive_all(int fd, int quiet_ms, size_t *len)
{
    size_t cap = 64u << 20;
    char *all = malloc(cap);
    assert_non_null(all);
    *len = 0;
    for (int waited = 0; waited < 30000;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, quiet_ms) <= 0)
            break;
        ssize_t got = recv(fd, all + *len, cap - *len, 0);
        if (got <= 0)
            break;
        *len += (size_t)got;
        assert_true(*len < cap);
        waited += 1;
    }
    return all;
}

/* A binary stream as NDJSON (the readers' converter), every part sound. */
static char *binary_as_lines(const char *data, size_t len)
{
    FILE *in = fmemopen((void *)data, len, "rb");
    assert_non_null(in);
    return as_lines(in);
}

/* Consumers that subscribe with "format":"binary" get binary blocks (profiler/binlog.h)
 * after the answer line: converted, they are the lines a JSON Lines consumer got, all of
 * them or those its filters pass; a format the daemon does not know is refused by name. */
static void test_binary_consumers_get_the_same_records(void **state)
{
    (void)state;
    mt_d_cfg_t cfg = th_cfg();
    cfg.consumer_queue_bytes = 64u << 20; /* three of them within the budget */
    cfg.consumer_budget_bytes = 256u << 20;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    int cons = th_consumer(t.sock, "");
    int all = th_consumer(t.sock, "\"format\":\"binary\"");
    int allocs = th_consumer(t.sock, "\"format\":\"binary\",\"kinds\":[\"alloc\"]");
    int bogus;
    assert_int_equal(mt__d_client_connect(t.sock, &bogus), 0);
    static const char req[] = "{\"type\":\"subscribe\",\"role\":\"consumer\",\"format\":\"csv\"}\n";
    assert_int_equal(mt__d_client_send(bogus, req, sizeof req - 1), 0);
    char ans[256];
    ssize_t an = recv(bogus, ans, sizeof ans - 1, 0);
    assert_true(an > 0);
    ans[an] = '\0';
    assert_non_null(strstr(ans, "\"ok\":false"));
    assert_non_null(strstr(ans, "format"));
    close(bogus);
    pid_t a = th_producer(t.sock, 20000, 65536, 500, -1);
    const char *args[5] = {t.sock, NULL};
    pid_t c = th_spawn("labels", args);
    char *got = receive(cons, 32004, 1000);
    assert_int_equal(th_wait(a), 0);
    assert_int_equal(th_wait(c), 0);
    size_t nall, nallocs;
    char *ball = receive_all(all, 1000, &nall), *ballocs = receive_all(allocs, 1000, &nallocs);
    close(cons);
    close(all);
    close(allocs);
    th_daemon_stop(&t);

    unsigned nsent, nsent_allocs, nconv, nconv_allocs;
    char *sent = pick(got, "\"type\":\"event\"", &nsent);
    char *sent_allocs = pick(sent, "\"kind\":\"alloc\"", &nsent_allocs);
    char *conv_all = binary_as_lines(ball, nall), *conv_allocs = binary_as_lines(ballocs, nallocs);
    char *got_all = pick(conv_all, "\"type\":\"event\"", &nconv);
    char *got_allocs = pick(conv_allocs, "\"type\":\"event\"", &nconv_allocs);
    fprintf(stderr, "%u event lines sent as text, %zu bytes as binary (%u events), %u allocs\n",
            nsent, nall, nconv, nconv_allocs);
    assert_true(nsent >= 32000);
    assert_true(nall * 8 < strlen(got)); /* the point of it */
    assert_int_equal(nconv, nsent);
    assert_string_equal(got_all, sent);
    assert_true(nsent_allocs > 10000);
    assert_int_equal(nconv_allocs, nsent_allocs);
    assert_string_equal(got_allocs, sent_allocs);
    assert_non_null(strstr(got_allocs, "\"tag\":\"kv cache, renamed\""));
    /* nothing but the filter's kind in the filtered stream's events */
    assert_null(strstr(got_allocs, "\"kind\":\"free_completed\""));
    free(got_all);
    free(got_allocs);
    free(conv_all);
    free(conv_allocs);
    free(ball);
    free(ballocs);
    free(sent_allocs);
    free(sent);
    free(got);
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
        cmocka_unit_test(test_binary_consumers_get_the_same_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
