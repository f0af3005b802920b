/* Sim backend virtual memory (expandable segments): reserve/map/unmap/release, their
 * accounting against capacity, and their error cases. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sim_fixture.h"
#include "tests/common/test_main.h"

static void test_reserve_is_free(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    void *r = NULL;
    assert_int_equal(mt_backend_vm_reserve(b, 3 * MIB, &r), MT_EINVAL); /* not 2 MiB units */
    assert_int_equal(mt_backend_vm_reserve(b, 0, &r), MT_EINVAL);
    /* A reservation larger than the capacity costs nothing until mapped. */
    assert_int_equal(mt_backend_vm_reserve(b, 64 * MIB, &r), 0);
    assert_int_equal((uintptr_t)r % (2 * MIB), 0);
    assert_true(mt_backend_is_device_ptr(b, r));
    assert_true(mt_backend_is_device_ptr(b, (char *)r + 64 * MIB - 1));
    assert_false(mt_backend_is_device_ptr(b, (char *)r + 64 * MIB));
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 16 * MIB);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_backend_vm_release(b, r, 64 * MIB), 0);
    assert_false(mt_backend_is_device_ptr(b, r));
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
}

static void test_map_unmap_accounting(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    char *r;
    assert_int_equal(mt_backend_vm_reserve(b, 32 * MIB, (void **)&r), 0);
    assert_int_equal(mt_backend_vm_map(b, r, 4 * MIB), 0);
    assert_int_equal(mt_backend_vm_map(b, r + 8 * MIB, 2 * MIB), 0);
    assert_int_equal(mt__sim_used_bytes(b), 6 * MIB);
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 10 * MIB);
    memset(r, 0x42, 4 * MIB); /* mapped pages are writable */
    memset(r + 8 * MIB, 0x43, 2 * MIB);
    assert_int_equal(mt__sim_check(b), 0);

    /* Segments and mapped pages share the capacity. */
    void *seg;
    assert_int_equal(mt_backend_malloc(b, 10 * MIB + 1, &seg), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, 8 * MIB, &seg), 0);
    assert_int_equal(mt_backend_vm_map(b, r + 12 * MIB, 4 * MIB), MT_ENOMEM);
    assert_int_equal(mt_backend_vm_map(b, r + 12 * MIB, 2 * MIB), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 0);
    assert_int_equal(mt_backend_free(b, seg), 0);

    /* Copies into mapped pages work; a span touching an unmapped page is refused. */
    char buf[4096];
    memset(buf, 7, sizeof buf);
    assert_int_equal(mt_memcpy(b, r + 8 * MIB, buf, sizeof buf, MT_MEMCPY_HOST_TO_DEVICE), 0);
    assert_int_equal(r[8 * MIB], 7);
    assert_int_equal(mt_memcpy(b, r + 4 * MIB - 100, buf, 200, MT_MEMCPY_HOST_TO_DEVICE),
                     MT_EINVAL);
    assert_int_equal(mt_memset_async(b, r + 6 * MIB, 0, 16, NULL), MT_EINVAL);

    assert_int_equal(mt_backend_vm_unmap(b, r, 2 * MIB), 0);
    assert_int_equal(mt__sim_used_bytes(b), 6 * MIB);
    assert_false(mt_backend_is_device_ptr(b, r + 32 * MIB));
    assert_true(mt_backend_is_device_ptr(b, r)); /* still reserved */
    /* The page left mapped kept its contents. */
    assert_int_equal(r[2 * MIB], 0x42);
    assert_int_equal(r[4 * MIB - 1], 0x42);
    assert_int_equal(mt__sim_check(b), 0);

    assert_int_equal(mt_backend_vm_unmap(b, r + 2 * MIB, 2 * MIB), 0);
    assert_int_equal(mt_backend_vm_unmap(b, r + 8 * MIB, 2 * MIB), 0);
    assert_int_equal(mt_backend_vm_unmap(b, r + 12 * MIB, 2 * MIB), 0);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_backend_vm_release(b, r, 32 * MIB), 0);

    mt_backend_counters_t c = counters_of(b);
    assert_int_equal(c.vm_reserve_calls, 1);
    assert_int_equal(c.vm_map_calls, 4);
    assert_int_equal(c.vm_unmap_calls, 4);
    assert_int_equal(c.vm_release_calls, 1);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
}

static void test_vm_errors(void **state)
{
    mt_backend_t *b = sim_new(64 * MIB);
    char *r, *r2;
    assert_int_equal(mt_backend_vm_reserve(b, 8 * MIB, (void **)&r), 0);
    assert_int_equal(mt_backend_vm_reserve(b, 4 * MIB, (void **)&r2), 0);
    assert_int_equal(mt_backend_vm_map(b, r + 2 * MIB, 4 * MIB), 0);

    /* Mapping over a mapped page, however partly. */
    assert_int_equal(mt_backend_vm_map(b, r + 2 * MIB, 2 * MIB), MT_EINVAL);
    assert_int_equal(mt_backend_vm_map(b, r, 4 * MIB), MT_EINVAL);
    /* Past the end of the reservation, or outside any reservation. */
    assert_int_equal(mt_backend_vm_map(b, r + 6 * MIB, 4 * MIB), MT_EINVAL);
    int local;
    char *outside = (char *)(((uintptr_t)&local) & ~(uintptr_t)(2 * MIB - 1));
    assert_int_equal(mt_backend_vm_map(b, outside, 2 * MIB), MT_EINVAL);
    /* Unaligned address or size (checked by the seam for every backend). */
    assert_int_equal(mt_backend_vm_map(b, r + 4096, 2 * MIB), MT_EINVAL);
    assert_int_equal(mt_backend_vm_map(b, r, MIB), MT_EINVAL);

    /* Unmapping pages that are not (all) mapped changes nothing. */
    assert_int_equal(mt_backend_vm_unmap(b, r, 2 * MIB), MT_EINVAL);
    assert_int_equal(mt_backend_vm_unmap(b, r, 4 * MIB), MT_EINVAL);
    assert_int_equal(mt_backend_vm_unmap(b, r2, 2 * MIB), MT_EINVAL);
    assert_int_equal(mt__sim_used_bytes(b), 4 * MIB);

    /* Release: only whole reservations, only when nothing is mapped. */
    assert_int_equal(mt_backend_vm_release(b, r, 8 * MIB), MT_EBUSY);
    assert_int_equal(mt_backend_vm_release(b, r2, 2 * MIB), MT_EINVAL);
    assert_int_equal(mt_backend_vm_release(b, r + 2 * MIB, 2 * MIB), MT_ENOENT);
    assert_int_equal(mt_backend_vm_unmap(b, r + 2 * MIB, 4 * MIB), 0);
    assert_int_equal(mt_backend_vm_release(b, r, 8 * MIB), 0);
    assert_int_equal(mt_backend_vm_release(b, r, 8 * MIB), MT_ENOENT);
    assert_int_equal(mt__sim_check(b), 0);

    /* Injected failures hit vm_map too, and leave nothing mapped. */
    assert_int_equal(mt__sim_inject_malloc_failures(b, 1), 0);
    assert_int_equal(mt_backend_vm_map(b, r2, 2 * MIB), MT_ENOMEM);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_backend_vm_map(b, r2, 2 * MIB), 0);
    assert_int_equal(mt__sim_used_bytes(b), 2 * MIB);
    /* Destroy releases a reservation that still has pages mapped. */
    mt_backend_destroy(&b);
}

static void test_vm_costs(void **state)
{
    mt_backend_t *b = sim_new(64 * MIB);
    mt__sim_set_costs(b, 1000, 500);
    void *r;
    assert_int_equal(mt_backend_vm_reserve(b, 4 * MIB, &r), 0);
    assert_int_equal(counters_of(b).modelled_ns, 0); /* reserving is cheap */
    assert_int_equal(mt_backend_vm_map(b, r, 4 * MIB), 0);
    assert_int_equal(counters_of(b).modelled_ns, 1000);
    assert_int_equal(mt_backend_vm_unmap(b, r, 4 * MIB), 0);
    assert_int_equal(counters_of(b).modelled_ns, 1500);
    assert_int_equal(mt_backend_vm_release(b, r, 4 * MIB), 0);
    mt_backend_destroy(&b);
}

/* An access to an unmapped page faults, as on a GPU. Checked in a child process. */
static void test_unmapped_access_faults(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    volatile char *r;
    assert_int_equal(mt_backend_vm_reserve(b, 4 * MIB, (void **)&r), 0);
    assert_int_equal(mt_backend_vm_map(b, (void *)r, 2 * MIB), 0);
    r[0] = 1;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not cmocka's handler, which would carry on testing */
        r[2 * MIB] = 1;           /* unmapped page: must not return */
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* Killed by SIGSEGV, or (under ASan, which catches it) a non-zero exit. */
    assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0));
    assert_int_equal(mt_backend_vm_unmap(b, (void *)r, 2 * MIB), 0);
    assert_int_equal(mt_backend_vm_release(b, (void *)r, 4 * MIB), 0);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_is_free),
        cmocka_unit_test(test_map_unmap_accounting),
        cmocka_unit_test(test_vm_errors),
        cmocka_unit_test(test_vm_costs),
        cmocka_unit_test(test_unmapped_access_faults),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
