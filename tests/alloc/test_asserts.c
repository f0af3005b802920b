/* The debug assertions (util/assert.h) fire: each case breaks an invariant in a forked
 * child and expects it to die of SIGABRT with "file:line: function: ... expr" on stderr.
 * Skipped in builds without them (release: MT_ASSERT_LEVEL 0). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "mt_config.h"
#include "tests/common/test_main.h"

typedef void (*breaker_fn)(void);

/* Runs fn in a child with stderr piped; returns what it printed, the child's status in
 * *status. */
static char *run_child(breaker_fn fn, int *status)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        fn();
        _exit(0); /* the assertion did not fire */
    }
    close(fds[1]);
    static char out[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(fds[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fds[0]);
    assert_int_equal(waitpid(pid, status, 0), pid);
    return out;
}

static void expect_abort(breaker_fn fn, const char *where, const char *what)
{
    int status = 0;
    const char *err = run_child(fn, &status);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT || strstr(err, where) == NULL ||
        strstr(err, what) == NULL)
        fail_msg("expected an abort naming %s and %s; status %#x, stderr: %s", where, what, status,
                 err);
    assert_non_null(strstr(err, "memtrace assertion failed"));
}

static void skip_without_asserts(void)
{
    if (MT_ASSERT_LEVEL < 1)
        skip();
}

/* ---- breakers (run in the child) ---- */

static void call_without_lock(void)
{
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    (void)mt__alloc_streamrec(a, NULL); /* requires a->mu */
}

static void remove_twice(void)
{
    mt_binset_t *bs = mt__bins_create(MT__BP_SMALL, NULL);
    mt_segment_t seg = {.bins = bs};
    mt_block_t blk = {.addr = 4096, .size = 4096, .seg = &seg, .state = MT_BLOCK_INACTIVE};
    mt__bins_insert(bs, &blk);
    mt__bins_remove(bs, &blk);
    mt__bins_remove(bs, &blk);
}

static void put_twice(void)
{
    mt_addrmap_t m;
    assert_int_equal(mt__addrmap_init(&m), 0);
    mt_block_t x = {.addr = 8192, .size = 512, .state = MT_BLOCK_ACTIVE_ALLOCATED};
    mt_block_t y = x;
    (void)mt__addrmap_put(&m, &x);
    (void)mt__addrmap_put(&m, &y); /* a second live block at the same address */
}

static void corrupt_stat(void)
{
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    void *p = xmalloc_dev(a, 1000, NULL, 0);
    a->st.allocated_bytes[MT_STAT_SMALL].current += 512;
    /* The whole check is amortized over operations: a few hundred small ones reach it. */
    for (int i = 0; i < 1000; i++)
        (void)stats_of(a);
    (void)p;
}

/* ---- tests ---- */

static void test_lock_owner(void **state)
{
    (void)state;
    skip_without_asserts();
    expect_abort(call_without_lock, "alloc.c:", "mt__alloc_streamrec");
}

static void test_bins_double_remove(void **state)
{
    (void)state;
    skip_without_asserts();
    expect_abort(remove_twice, "bins.c:", "mt__bins_remove");
}

static void test_addrmap_duplicate(void **state)
{
    (void)state;
    skip_without_asserts();
    expect_abort(put_twice, "blocks.h:", "|| had == b");
}

static void test_expensive_check(void **state)
{
    (void)state;
    if (MT_ASSERT_LEVEL < 2)
        skip();
    expect_abort(corrupt_stat, "allocated_bytes stat", "mt__alloc_is_valid");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lock_owner),
        cmocka_unit_test(test_bins_double_remove),
        cmocka_unit_test(test_addrmap_duplicate),
        cmocka_unit_test(test_expensive_check),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
