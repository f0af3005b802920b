/* The daemon and call stacks: a consumer connected while a producer allocates gets each
 * stack line (and the module lines) before the first alloc line using it; a consumer that
 * connects later first gets the tables of the processes it follows; the process's model
 * in the daemon holds the stacks. A consumer of binary blocks gets the same lines, both
 * times (converted by the readers' converter). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/binlog_conv.h"
#include "daemon/harness.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"

#define NALLOC 6

__attribute__((noinline)) int stk_daemon_site(mt_alloc_t *a, void **out);
__attribute__((noinline)) int stk_daemon_site(mt_alloc_t *a, void **out)
{
    int rc = mt_alloc_malloc(a, 1u << 20, NULL, MT_TAG_OTHER, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

/* The producer: stacks=all, NALLOC allocations from one site and one from another. */
static void producer(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.stacks = MT_STACKS_ALL;
    mt_prof_t *p;
    if (mt_prof_create(&p, &cfg) != 0)
        _exit(3);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    if (mt_backend_create(&b, &bc) != 0)
        _exit(4);
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    if (mt_alloc_create(&a, &ac) != 0)
        _exit(5);
    void *x[NALLOC + 1];
    for (int i = 0; i < NALLOC; i++)
        if (stk_daemon_site(a, &x[i]) != 0)
            _exit(6);
    if (mt_alloc_malloc(a, 4096, NULL, MT_TAG_OTHER, &x[NALLOC]) != 0)
        _exit(7);
    mt_prof_destroy(&p); /* the blocks stay live: never freed */
    _exit(0);
}

/* Reads lines from fd for up to ms, into an array of parsed objects. */
static json_t *read_lines(int fd, int ms, size_t want_allocs)
{
    json_t *all = json_array();
    char buf[1 << 16];
    size_t len = 0, allocs = 0;
    uint64_t end = th_now_ms() + (uint64_t)ms;
    while (th_now_ms() < end && (want_allocs == 0 || allocs < want_allocs)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        ssize_t n = read(fd, buf + len, sizeof buf - len - 1);
        if (n <= 0)
            break;
        len += (size_t)n;
        char *s = buf, *nl;
        while ((nl = memchr(s, '\n', len - (size_t)(s - buf)))) {
            json_t *j = json_loadb(s, (size_t)(nl - s), 0, NULL);
            assert_non_null(j);
            const char *k = json_string_value(json_object_get(j, "kind"));
            allocs += k && strcmp(k, "alloc") == 0;
            json_array_append_new(all, j);
            s = nl + 1;
        }
        len -= (size_t)(s - buf);
        memmove(buf, s, len);
    }
    return all;
}

static int no_damage(void *ud, const char *msg)
{
    (void)ud;
    fail_msg("damaged binary stream: %s", msg);
    return 0;
}

/* What a binary consumer's fd brings in ms, converted to lines and parsed, as read_lines. */
static json_t *read_binary(int fd, int ms)
{
    size_t cap = 1 << 22, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (uint64_t end = th_now_ms() + (uint64_t)ms; th_now_ms() < end;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        ssize_t n = read(fd, buf + len, cap - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        assert_true(len < cap);
    }
    FILE *in = fmemopen(buf, len, "rb");
    char *text = NULL;
    size_t tlen = 0;
    FILE *out = open_memstream(&text, &tlen);
    uint64_t records = 0;
    assert_int_equal(mt__blog_to_ndjson(in, NULL, 0, out, no_damage, NULL, &records), 0);
    fclose(in);
    fclose(out);
    json_t *all = json_array();
    for (char *l = text, *nl; (nl = strchr(l, '\n')) != NULL; l = nl + 1) {
        json_t *j = json_loadb(l, (size_t)(nl - l), 0, NULL);
        assert_non_null(j);
        json_array_append_new(all, j);
    }
    free(text);
    free(buf);
    return all;
}

static const char *kind_of(const json_t *j)
{
    const char *k = json_string_value(json_object_get(j, "kind"));
    return k ? k : "";
}

static void test_consumers_get_tables(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    int early = th_consumer(t.sock, "");
    int early_bin = th_consumer(t.sock, "\"format\":\"binary\"");
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("stk_producer", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *ex = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(ex);
    json_decref(ex);

    /* the early consumer: stack lines before the allocs that use them, module lines
     * before the stack lines */
    json_t *all = read_lines(early, 5000, NALLOC + 1);
    size_t i, allocs = 0, stacks = 0, mods = 0;
    json_t *j;
    uint32_t site = 0;
    json_array_foreach(all, i, j)
    {
        const char *k = kind_of(j);
        if (strcmp(k, "module") == 0) {
            assert_int_equal(stacks, 0);
            mods++;
        }
        if (strcmp(k, "stack") == 0) {
            stacks++;
            assert_true(mods > 0);
        }
        if (strcmp(k, "alloc") != 0)
            continue;
        json_int_t id = json_integer_value(json_object_get(j, "stack"));
        assert_true(id > 0);
        bool seen = false;
        for (size_t q = 0; q < i && !seen; q++) {
            json_t *s = json_array_get(all, q);
            seen = strcmp(kind_of(s), "stack") == 0 &&
                   json_integer_value(json_object_get(s, "id")) == id;
        }
        assert_true(seen);
        if (allocs++ == 0)
            site = (uint32_t)id;
        else if (allocs <= NALLOC)
            assert_int_equal(id, site); /* one site, one id */
        else
            assert_true(id != site);
    }
    assert_int_equal(allocs, NALLOC + 1);
    assert_int_equal(stacks, 2);
    json_t *bin = read_binary(early_bin, 1000);
    assert_true(json_equal(bin, all)); /* the same lines, in order */
    json_decref(bin);
    json_decref(all);

    /* a consumer connected now: the process's tables first */
    char filter[64];
    snprintf(filter, sizeof filter, "\"pid\":[%d]", (int)pid);
    int late = th_consumer(t.sock, filter);
    char bfilter[96];
    snprintf(bfilter, sizeof bfilter, "%s,\"format\":\"binary\"", filter);
    int late_bin = th_consumer(t.sock, bfilter);
    all = read_lines(late, 1500, 0);
    bin = read_binary(late_bin, 500);
    assert_true(json_array_size(all) > 0);
    assert_true(json_equal(bin, all)); /* the tables, as blocks of text records */
    json_decref(bin);
    stacks = mods = 0;
    bool has_site = false;
    json_array_foreach(all, i, j)
    {
        if (strcmp(kind_of(j), "module") == 0)
            mods++;
        if (strcmp(kind_of(j), "stack") == 0) {
            stacks++;
            has_site = has_site || json_integer_value(json_object_get(j, "id")) == site;
            assert_true(json_array_size(json_object_get(j, "frames")) > 0);
        }
        assert_int_equal(json_integer_value(json_object_get(j, "pid")), pid);
    }
    assert_int_equal(stacks, 2);
    assert_true(has_site);
    assert_true(mods > 0);
    json_decref(all);
    close(early);
    close(late);
    close(early_bin);
    close(late_bin);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    char **args;
    const char *role = th_role(argc, argv, &args);
    if (role && strcmp(role, "stk_producer") == 0)
        producer(args[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consumers_get_tables),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
