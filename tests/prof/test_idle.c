/* An idle program's last events reach the recorder without a flush. The allocator keeps
 * back a thread cache's batch and the global path's events (allocator/emit.c); the
 * profiler's own thread (the local log's drainer, the daemon mode's watcher) asks for
 * them once the ring has been quiet for a drain period. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "profiler/ring.h"
#include "tests/common/test_main.h"

enum { GLOBAL = 3, PAIRS = 20, ALLOCS = GLOBAL + PAIRS, WAIT_MS = 5000 };

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* What a program does before it goes idle: GLOBAL allocations of distinct sizes, kept
 * (the global path's events), then PAIRS pairs of one size (after the first, the thread
 * cache's); returns the allocator, its blocks still live. */
static mt_alloc_t *work(mt_prof_t *p, mt_backend_t **b, void *live[GLOBAL])
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    assert_int_equal(mt_backend_create(b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = *b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    for (int i = 0; i < GLOBAL; i++)
        assert_int_equal(mt_alloc_malloc(a, (size_t)(1 + 2 * i) << 20, NULL, 1, &live[i]), 0);
    for (int i = 0; i < PAIRS; i++) {
        void *q;
        assert_int_equal(mt_alloc_malloc(a, 64 << 10, NULL, 1, &q), 0);
        assert_int_equal(mt_alloc_free(a, q), 0);
    }
    return a;
}

static void finish(mt_alloc_t *a, mt_backend_t *b, void *live[GLOBAL])
{
    for (int i = 0; i < GLOBAL; i++)
        assert_int_equal(mt_alloc_free(a, live[i]), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The alloc events in the log at path. */
static int allocs_in_log(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL)
        n += strstr(line, "\"kind\":\"alloc\"") != NULL;
    fclose(f);
    return n;
}

static void test_log_idle(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "/tmp/mt_prof_test_%d_idle.ndjson", (int)getpid());
    unlink(path);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = path;
    cfg.drain_ms = 10;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_backend_t *b = NULL;
    void *live[GLOBAL];
    mt_alloc_t *a = work(p, &b, live);
    double t0 = now_ms();
    int n = 0;
    while ((n = allocs_in_log(path)) < ALLOCS && now_ms() - t0 < WAIT_MS)
        usleep(5000);
    fprintf(stderr, "  log: %d of %d allocs after %.0f ms idle\n", n, ALLOCS, now_ms() - t0);
    assert_int_equal(n, ALLOCS);
    finish(a, b, live);
    mt_prof_destroy(&p);
    unlink(path);
}

/* A daemon that counts the allocs in the ring as they arrive, until ALLOCS or WAIT_MS. */
typedef struct daemon_s {
    int lfd;
    int allocs;
    double waited_ms;
    atomic_int done; /* allocs and waited_ms are final */
} daemon_t;

static void count_alloc(void *ud, const mt_event_rec_t *ev)
{
    *(int *)ud += ev->kind == MT_EV_ALLOC;
}

static void *daemon_main(void *arg)
{
    daemon_t *d = arg;
    int c = accept(d->lfd, NULL, NULL);
    if (c < 0)
        return NULL;
    char hello[1024];
    size_t n = 0;
    while (n + 1 < sizeof hello && read(c, hello + n, 1) == 1 && hello[n] != '\n')
        n++;
    hello[n] = '\0';
    json_error_t e;
    json_t *j = json_loads(hello, 0, &e);
    mt__ring_t *r = NULL;
    if (j != NULL && mt__ring_open(&r, json_string_value(json_object_get(j, "shm"))) == 0) {
        mt__ring_unlink(r);
        mt__ring_set_flags(r, MT_RING_F_ATTACHED);
    }
    json_decref(j);
    const char *ok = r ? "{\"ok\":true}\n" : "{\"ok\":false,\"error\":\"bad ring\"}\n";
    ssize_t w = write(c, ok, strlen(ok));
    (void)w;
    double t0 = now_ms();
    while (r != NULL && d->allocs < ALLOCS && now_ms() - t0 < WAIT_MS)
        if (mt__ring_drain(r, count_alloc, &d->allocs, SIZE_MAX) == 0)
            usleep(5000);
    d->waited_ms = now_ms() - t0;
    atomic_store(&d->done, 1);
    char buf[256];
    while (read(c, buf, sizeof buf) > 0) { /* until the producer ends */
    }
    close(c);
    mt__ring_close(&r);
    return NULL;
}

static void test_daemon_idle(void **state)
{
    (void)state;
    char sock[108];
    snprintf(sock, sizeof sock, "/tmp/mt_prof_test_%d_idle.sock", (int)getpid());
    unlink(sock);
    daemon_t d = {.lfd = socket(AF_UNIX, SOCK_STREAM, 0)};
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    assert_int_equal(bind(d.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(d.lfd, 1), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, daemon_main, &d), 0);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.drain_ms = 10;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_backend_t *b = NULL;
    void *live[GLOBAL];
    mt_alloc_t *a = work(p, &b, live);
    /* idle until the daemon has them all or gives up: only then does the program end */
    while (!atomic_load(&d.done))
        usleep(5000);
    fprintf(stderr, "  daemon: %d of %d allocs after %.0f ms idle\n", d.allocs, ALLOCS,
            d.waited_ms);
    assert_int_equal(d.allocs, ALLOCS);
    finish(a, b, live);
    mt_prof_destroy(&p);
    pthread_join(th, NULL);
    close(d.lfd);
    unlink(sock);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_idle),
        cmocka_unit_test(test_daemon_idle),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
