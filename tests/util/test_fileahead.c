/* mt__fa_ahead (util/fileahead.h): blocks reserved past the end of a growing file, never
 * its size; nothing for a small file or one that is not regular; a new file at the same
 * descriptor starts over; a failed reservation turns it off for that file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fileahead.h"
#include "tests/common/test_main.h"

#define MIB ((size_t)1 << 20)

static char dir[] = "/tmp/mt-fa-XXXXXX";

/* A new file in dir, open for appending. */
static int open_new(const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    return fd;
}

/* Appends n bytes through mt__fa_ahead, in writes of 256 KiB, as the log writers do. */
static void append(mt__fa_t *fa, int fd, size_t n)
{
    static char buf[256 << 10];
    memset(buf, 'x', sizeof buf);
    while (n > 0) {
        size_t k = n < sizeof buf ? n : sizeof buf;
        mt__fa_ahead(fa, fd, k);
        assert_int_equal(write(fd, buf, k), (ssize_t)k);
        n -= k;
    }
}

static uint64_t allocated(int fd, uint64_t *size)
{
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    *size = (uint64_t)st.st_size;
    return (uint64_t)st.st_blocks * 512;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_reserves_ahead_never_the_size(void **state)
{
    (void)state;
    mt__fa_t fa = {0};
    int fd = open_new("grow");
    uint64_t size;
    append(&fa, fd, MT__FA_MIN / 2);
    assert_int_equal(fa.end, 0); /* small: nothing reserved */
    assert_true(allocated(fd, &size) <= size + 64 * 1024);
    append(&fa, fd, 3 * MT__FA_MIN);
    uint64_t alloc = allocated(fd, &size);
    assert_int_equal(size, MT__FA_MIN / 2 + 3 * MT__FA_MIN); /* the size is what was written */
    assert_true(fa.end > size);
    assert_true(alloc >= fa.end - 64 * 1024);            /* the blocks are there ... */
    assert_true(fa.end <= size + 512 * 1024 + size / 8); /* ... an eighth ahead at most */
    append(&fa, fd, 12 * MT__FA_MIN);
    allocated(fd, &size);
    assert_true(fa.end > size && fa.end <= size + 512 * 1024 + MT__FA_STEP);
    close(fd);
}

static void test_not_a_regular_file(void **state)
{
    (void)state;
    mt__fa_t fa = {0};
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    mt__fa_ahead(&fa, fd, 64 * MIB);
    assert_int_equal(fa.end, 0);
    assert_false(fa.off);
    close(fd);
}

static void test_another_file_starts_over(void **state)
{
    (void)state;
    mt__fa_t fa = {0};
    int fd = open_new("first");
    append(&fa, fd, 2 * MT__FA_MIN);
    assert_true(fa.end > 2 * MT__FA_MIN);
    int other = open_new("second");
    assert_int_equal(dup2(other, fd), fd); /* the same descriptor, a new file */
    close(other);
    mt__fa_ahead(&fa, fd, 4096);
    assert_int_equal(fa.end, 0);
    append(&fa, fd, 2 * MT__FA_MIN);
    uint64_t size;
    uint64_t alloc = allocated(fd, &size);
    assert_true(fa.end > size && alloc >= fa.end - 64 * 1024);
    close(fd);
}

static void test_failure_turns_it_off(void **state)
{
    (void)state;
    mt__fa_t fa = {0};
    int fd = open_new("ro");
    append(&fa, fd, MT__FA_MIN);
    close(fd);
    char path[64];
    snprintf(path, sizeof path, "%s/ro", dir);
    fd = open(path, O_RDONLY | O_CLOEXEC); /* fallocate fails: EBADF */
    assert_true(fd >= 0);
    fa = (mt__fa_t){0};
    mt__fa_ahead(&fa, fd, MT__FA_MIN);
    assert_true(fa.off);
    assert_int_equal(fa.end, 0);
    mt__fa_ahead(&fa, fd, MT__FA_MIN); /* no more tries */
    assert_true(fa.off);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserves_ahead_never_the_size),
        cmocka_unit_test(test_not_a_regular_file),
        cmocka_unit_test(test_another_file_starts_over),
        cmocka_unit_test(test_failure_turns_it_off),
    };
    if (mkdtemp(dir) == NULL)
        return 1;
    /* the file system under /tmp must reserve, or there is nothing to see: a skip (77) */
    int fd = open_new("probe");
    int rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 4096);
    close(fd);
    if (rc != 0) {
        printf("fallocate in %s: %s; skipped\n", dir, strerror(errno));
        teardown(NULL);
        return 77;
    }
    return MT_TEST_RUN(tests, NULL, teardown);
}
