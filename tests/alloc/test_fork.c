/* fork() while other threads use the allocator (cfg.atfork, allocator/fork.c): every child
 * must be able to allocate and free at once, and find the allocator whole. PyTorch's
 * DataLoader forks its workers from a process whose other threads keep allocating. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "tests/common/test_main.h"

#define WORKERS 3
/* 50; MT_TEST_FORKS lowers it where a fork is slow (qemu-user emulates every thread). */
static int forks(void)
{
    const char *e = getenv("MT_TEST_FORKS");
    int n = e != NULL ? atoi(e) : 0;
    return n > 0 && n <= 50 ? n : 50;
}
/* Seconds a child may take before its alarm ends it: far above what it needs (well under
 * a second even under ASan), so only a deadlock reaches it. */
#ifndef CHILD_TIMEOUT
#define CHILD_TIMEOUT 20
#endif

typedef struct worker_s {
    mt_alloc_t *a;
    void *keep; /* allocated before the forks, never freed by the worker */
    unsigned seed;
    int stop; /* atomic */
    uint64_t ops;
} worker_t;

/* Sizes that take every path: the thread caches (repeated sizes), the small and large
 * pools, new segments and expandable pages (a backend call with the lock held, or with it
 * released), and empty_cache's unmaps in flight. */
static const size_t sizes[] = {512, 4 * KIB, 100 * KIB, 1536 * KIB, 3 * MIB, 25 * MIB};

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    void *live[8] = {0};
    while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED)) {
        unsigned r = (unsigned)rand_r(&w->seed);
        void **slot = &live[r % 8];
        if (*slot != NULL) {
            assert_int_equal(mt_alloc_free(w->a, *slot), 0);
            *slot = NULL;
        } else {
            size_t n = sizes[(r >> 4) % (sizeof sizes / sizeof sizes[0])];
            if (mt_alloc_malloc(w->a, n, NULL, MT_TAG_OTHER, slot) != 0)
                *slot = NULL;
        }
        if (r % 256 == 0)
            mt_alloc_empty_cache(w->a);
        w->ops++;
    }
    for (int i = 0; i < 8; i++)
        if (live[i] != NULL)
            assert_int_equal(mt_alloc_free(w->a, live[i]), 0);
    return NULL;
}

/* The child: alone with the parent's allocator. Exit status 0 when it could allocate and
 * free (its own blocks and the blocks the gone threads left), and the allocator checks
 * whole; the alarm ends a child that deadlocks. */
static _Noreturn void child_main(mt_alloc_t *a, worker_t *w)
{
    alarm(CHILD_TIMEOUT);
    int bad = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        bad |= mt_alloc_malloc(a, sizes[i], NULL, MT_TAG_OTHER, &p) != 0;
        bad |= p == NULL || mt_alloc_free(a, p) != 0;
    }
    for (int i = 0; i < WORKERS; i++)
        bad |= mt_alloc_free(a, w[i].keep) != 0;
    bad |= mt_alloc_empty_cache(a) != 0;
    bad |= mt_alloc_check(a) != 0;
    _exit(bad ? 3 : 0);
}

static void fork_while_allocating(const char *conf)
{
    mt_backend_t *b = sim_backend(4096 * MIB);
    mt_alloc_t *a = make_alloc_default(b, conf, NULL);
    worker_t w[WORKERS];
    pthread_t th[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        w[i] = (worker_t){.a = a, .seed = 7u + (unsigned)i};
        assert_int_equal(mt_alloc_malloc(a, 2 * KIB, NULL, MT_TAG_OTHER, &w[i].keep), 0);
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    int ok = 0, hung = 0, failed = 0;
    const int nforks = forks();
    for (int k = 0; k < nforks; k++) {
        usleep(2000); /* the workers run between forks */
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child_main(a, w);
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            ok++;
        else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
            hung++;
        else
            failed++;
    }
    uint64_t ops = 0;
    for (int i = 0; i < WORKERS; i++) {
        __atomic_store_n(&w[i].stop, 1, __ATOMIC_RELAXED);
        assert_int_equal(pthread_join(th[i], NULL), 0);
        ops += w[i].ops;
        assert_int_equal(mt_alloc_free(a, w[i].keep), 0);
    }
    print_message("%d forks: %d children finished, %d deadlocked, %d failed; workers made "
                  "%llu operations meanwhile\n",
                  nforks, ok, hung, failed, (unsigned long long)ops);
    assert_int_equal(hung, 0);
    assert_int_equal(failed, 0);
    assert_int_equal(ok, nforks);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The defaults: expandable segments, thread caches. */
static void test_fork_default(void **state)
{
    (void)state;
    fork_while_allocating(NULL);
}

/* Plain segments: a backend malloc with the lock held. */
static void test_fork_plain_segments(void **state)
{
    (void)state;
    fork_while_allocating("rules:reference");
}

/* The switch: on by default, off by its key. */
static void test_atfork_config(void **state)
{
    (void)state;
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    assert_true(cfg.atfork);
    char err[128];
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "atfork:0", err, sizeof err), 0);
    assert_false(cfg.atfork);
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "atfork:maybe", err, sizeof err), MT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_default),
        cmocka_unit_test(test_fork_plain_segments),
        cmocka_unit_test(test_atfork_config),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
