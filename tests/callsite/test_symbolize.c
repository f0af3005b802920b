/* Symbolization (analysis/symbolize.c) against real binaries: this test's own code resolves
 * to function and file:line through libdwfl where the binary has DWARF line info (it is
 * built with -g in every build type) and to "function (module+0x..)" where it has not; a
 * copy of a small program without its debug sections resolves to its function names and
 * module+offset, a stripped one to module+offset, an ip in no module to "unknown frame"; a
 * replaced mapping, a build-id mismatch, a missing file and bad arguments are each handled;
 * repeated ips come from the cache. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis/symbolize.h"
#include "tests/callsite/dwarf.h"
#include "tests/common/test_main.h"

#define PID_SELF 1u

static volatile uintptr_t sink;
static int call_line;

static __attribute__((noinline)) uintptr_t return_address(void)
{
    return (uintptr_t)__builtin_return_address(0);
}

static __attribute__((noinline)) uintptr_t callsite_probe_fn(void)
{
    uintptr_t ra = return_address();
    call_line = __LINE__ - 1;
    sink += ra;
    return ra;
}

/* ---- the module map of this process, as the recorder sends it ---- */

typedef struct add_ctx_s {
    mt_sym_t *s;
    uint32_t pid;
    int n;
} add_ctx_t;

static int add_one(struct dl_phdr_info *info, size_t size, void *data)
{
    add_ctx_t *c = data;
    char exe[4096];
    const char *path = info->dlpi_name;
    if (path == NULL || path[0] == '\0') {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0)
            return 0;
        exe[n] = '\0';
        path = exe;
    }
    if (path[0] != '/')
        return 0; /* the vDSO */
    uint64_t end = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && ph->p_vaddr + ph->p_memsz > end)
            end = ph->p_vaddr + ph->p_memsz;
    }
    if (end > 0 && mt__sym_add_module(c->s, c->pid, path, info->dlpi_addr, end, NULL) == 0)
        c->n++;
    return 0;
}

static void add_self(mt_sym_t *s, uint32_t pid)
{
    add_ctx_t c = {s, pid, 0};
    dl_iterate_phdr(add_one, &c);
    assert_true(c.n >= 2);
}

static void self_path(char *buf, size_t n)
{
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);
    assert_true(len > 0);
    buf[len] = '\0';
}

static void test_self_resolves_with_lines(void **state)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    add_self(s, PID_SELF);
    uintptr_t ra = callsite_probe_fn();
    mt_sym_frame_t fr;
    assert_int_equal(mt__sym_resolve(s, PID_SELF, ra, &fr), 0);
    assert_non_null(fr.func);
    assert_string_equal(fr.func, "callsite_probe_fn");
    assert_non_null(fr.module);
    assert_non_null(strstr(fr.module, "test_symbolize"));
    char exe[4096], want[128];
    self_path(exe, sizeof exe);
    if (mt_test_has_line_info(exe)) {
        assert_non_null(fr.file);
        assert_non_null(strstr(fr.file, "test_symbolize.c"));
        assert_int_equal(fr.line, call_line);
        snprintf(want, sizeof(want), "callsite_probe_fn (test_symbolize.c:%d)", call_line);
    } else {
        /* Built without -g: the name from the symbol table, the place as module+offset. */
        print_message("no DWARF line info in %s: expecting module+offset\n", exe);
        assert_null(fr.file);
        assert_int_equal(fr.line, 0);
        snprintf(want, sizeof(want), "callsite_probe_fn (test_symbolize+0x%jx)",
                 (uintmax_t)fr.offset);
    }
    assert_string_equal(fr.label, want);
    /* A libc function resolves by name through its symbol table. */
    assert_int_equal(mt__sym_resolve(s, PID_SELF, (uintptr_t)&getpid + 1, &fr), 0);
    assert_non_null(fr.func);
    assert_non_null(strstr(fr.func, "getpid"));
    assert_non_null(strstr(fr.module, "libc"));
    /* The second lookup of an ip is a cache hit with the same strings. */
    mt_sym_stats_t st0, st1;
    mt__sym_stats(s, &st0);
    mt_sym_frame_t again;
    assert_int_equal(mt__sym_resolve(s, PID_SELF, ra, &again), 0);
    mt__sym_stats(s, &st1);
    assert_true(st1.hits == st0.hits + 1 && st1.misses == st0.misses);
    assert_ptr_equal(again.label, mt__sym_resolve(s, PID_SELF, ra, &fr) == 0 ? fr.label : NULL);
    mt__sym_destroy(&s);
    assert_null(s);
}

static uint64_t stripme_offset(void)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "'%s'", getenv("MT_STRIPME"));
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    unsigned long long off = 0;
    assert_int_equal(fscanf(p, "%llx", &off), 1);
    assert_int_equal(pclose(p), 0);
    return off;
}

/* fr is prog_stripme's work(), with a line of prog_stripme.c (from DWARF). */
static void assert_work_with_line(const mt_sym_frame_t *fr)
{
    assert_non_null(fr->func);
    assert_string_equal(fr->func, "work");
    assert_non_null(fr->file);
    assert_non_null(strstr(fr->file, "prog_stripme.c"));
    assert_true(fr->line > 0);
}

/* A symbolizer with module a as process pa's and b as pb's, both at base (1 MiB). */
static mt_sym_t *two_modules(uint32_t pa, const char *a, uint32_t pb, const char *b, uint64_t base)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    assert_int_equal(mt__sym_add_module(s, pa, a, base, 1 << 20, NULL), 0);
    assert_int_equal(mt__sym_add_module(s, pb, b, base, 1 << 20, NULL), 0);
    return s;
}

static void test_stripped_degrades(void **state)
{
    const char *full = getenv("MT_STRIPME"), *stripped = getenv("MT_STRIPPED");
    assert_non_null(full);
    assert_non_null(stripped);
    uint64_t off = stripme_offset(), base = 0x555500000000ull;
    mt_sym_t *s = two_modules(10, full, 11, stripped, base);
    mt_sym_frame_t fr;
    assert_int_equal(mt__sym_resolve(s, 10, base + off, &fr), 0);
    assert_true(mt_test_has_line_info(full)); /* built with -g whatever the build type */
    assert_work_with_line(&fr);
    assert_int_equal(mt__sym_resolve(s, 11, base + off, &fr), 0);
    assert_null(fr.func);
    assert_null(fr.file);
    assert_true(fr.offset == off);
    char want[128];
    snprintf(want, sizeof(want), "callsite_stripme.stripped+0x%jx", (uintmax_t)off);
    assert_string_equal(fr.label, want);
    /* The same range mapped anew (dlclose, then dlopen of another file) resolves anew. */
    assert_int_equal(mt__sym_add_module(s, 11, full, base, 1 << 20, NULL), 0);
    assert_int_equal(mt__sym_resolve(s, 11, base + off, &fr), 0);
    assert_non_null(fr.func);
    assert_string_equal(fr.func, "work");
    mt_sym_stats_t st;
    mt__sym_stats(s, &st);
    assert_int_equal(st.modules, 2);
    mt__sym_destroy(&s);
}

/* A copy of the same program without its debug sections (objcopy --strip-debug: a release
 * build's binary, or one whose DWARF went to a debug package): the function comes from the
 * symbol table and the place reads module+offset; no file, no line, no "??:0". */
static void test_no_dwarf_names_from_symtab(void **state)
{
    const char *nodebug = getenv("MT_NODEBUG");
    assert_non_null(nodebug);
    assert_false(mt_test_has_line_info(nodebug));
    uint64_t off = stripme_offset(), base = 0x7f0000000000ull;
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    assert_int_equal(mt__sym_add_module(s, 12, nodebug, base, 1 << 20, NULL), 0);
    mt_sym_frame_t fr;
    assert_int_equal(mt__sym_resolve(s, 12, base + off, &fr), 0);
    assert_non_null(fr.func);
    assert_string_equal(fr.func, "work");
    assert_null(fr.file);
    assert_int_equal(fr.line, 0);
    assert_non_null(fr.module);
    assert_string_equal(fr.module, nodebug);
    assert_true(fr.offset == off);
    char want[128];
    snprintf(want, sizeof(want), "work (callsite_stripme.nodebug+0x%jx)", (uintmax_t)off);
    assert_string_equal(fr.label, want);
    mt__sym_destroy(&s);
}

/* A copy whose DWARF is in a file of its own named by its .gnu_debuglink, beside it
 * (objcopy --only-keep-debug, then --strip-debug --add-gnu-debuglink): its lines come from
 * there, found on this machine. With a debuginfod server set ($DEBUGINFOD_URLS, by
 * meson.build) the symbolizer does not ask it, nor load libdw's client for it, unless told
 * to (mt__sym_debuginfod): the copy without debug information is asked of no server. */
static void test_debug_file_local_only(void **state)
{
    const char *linked = getenv("MT_LINKED"), *nodebug = getenv("MT_NODEBUG");
    assert_non_null(linked);
    assert_non_null(nodebug);
    assert_false(mt_test_has_line_info(linked));
    assert_non_null(getenv("DEBUGINFOD_URLS"));
    uint64_t off = stripme_offset(), base = 0x7f1000000000ull;
    mt_sym_t *s = two_modules(13, linked, 14, nodebug, base);
    mt_sym_frame_t fr;
    assert_int_equal(mt__sym_resolve(s, 13, base + off, &fr), 0);
    assert_work_with_line(&fr);
    assert_int_equal(mt__sym_resolve(s, 14, base + off, &fr), 0);
    assert_null(fr.file);
    assert_null(dlopen("libdebuginfod.so.1", RTLD_LAZY | RTLD_NOLOAD)); /* not asked */
    mt__sym_destroy(&s);
    /* Told to, libdw's client is used (where the system has it). */
    struct stat st;
    if (stat("/usr/lib/x86_64-linux-gnu/libdebuginfod.so.1", &st) != 0 &&
        stat("/usr/lib/aarch64-linux-gnu/libdebuginfod.so.1", &st) != 0)
        return;
    mt__sym_debuginfod(true);
    assert_int_equal(mt__sym_create(&s), 0);
    assert_int_equal(mt__sym_add_module(s, 14, nodebug, base, 1 << 20, NULL), 0);
    setenv("DEBUGINFOD_TIMEOUT", "1", 1);
    assert_int_equal(mt__sym_resolve(s, 14, base + off, &fr), 0);
    assert_null(fr.file);
    void *h = dlopen("libdebuginfod.so.1", RTLD_LAZY | RTLD_NOLOAD);
    assert_non_null(h);
    dlclose(h);
    mt__sym_debuginfod(false);
    mt__sym_destroy(&s);
}

static void test_untrusted_and_unknown(void **state)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    const char *full = getenv("MT_STRIPME");
    uint64_t off = stripme_offset(), base = 0x10000000;
    /* Another build than the one recorded: names are not trusted. */
    assert_int_equal(mt__sym_add_module(s, 20, full, base, 1 << 20, "00112233AABB"), 0);
    mt_sym_frame_t fr;
    assert_int_equal(mt__sym_resolve(s, 20, base + off, &fr), 0);
    assert_null(fr.func);
    assert_non_null(strstr(fr.label, "callsite_stripme+0x"));
    /* A file that is gone. */
    assert_int_equal(mt__sym_add_module(s, 21, "/nonexistent/libgone.so", base, 4096, NULL), 0);
    assert_int_equal(mt__sym_resolve(s, 21, base + 0x10, &fr), 0);
    assert_string_equal(fr.label, "libgone.so+0x10");
    /* A FIFO as a module (a hostile producer's map): not opened for reading, no hang. */
    char fifo[] = "/tmp/mt-sym-fifo-XXXXXX";
    assert_non_null(mkdtemp(fifo));
    char fpath[64];
    snprintf(fpath, sizeof(fpath), "%s/libfifo.so", fifo);
    assert_int_equal(mkfifo(fpath, 0600), 0);
    assert_int_equal(mt__sym_add_module(s, 22, fpath, base, 4096, NULL), 0);
    assert_int_equal(mt__sym_resolve(s, 22, base + 0x20, &fr), 0);
    assert_string_equal(fr.label, "libfifo.so+0x20");
    unlink(fpath);
    rmdir(fifo);
    /* No module: an unknown frame, for a pid never seen too. */
    assert_int_equal(mt__sym_resolve(s, 21, 0x1234, &fr), 0);
    assert_string_equal(fr.label, "unknown frame 0x1234");
    assert_null(fr.module);
    assert_int_equal(mt__sym_resolve(s, 999, base + 0x10, &fr), 0);
    assert_string_equal(fr.label, "unknown frame 0x10000010");
    mt_sym_stats_t st;
    mt__sym_stats(s, &st);
    assert_int_equal(st.unknown, 2);
    /* Bad arguments. */
    assert_int_equal(mt__sym_add_module(s, 1, "", 0, 10, NULL), MT_EINVAL);
    assert_int_equal(mt__sym_add_module(s, 1, NULL, 0, 10, NULL), MT_EINVAL);
    assert_int_equal(mt__sym_add_module(s, 1, "/x", 0, 0, NULL), MT_EINVAL);
    assert_int_equal(mt__sym_add_module(s, 1, "/x", UINT64_MAX - 5, 10, NULL), MT_EINVAL);
    assert_int_equal(mt__sym_add_module(s, 1, "/x", 0, 10, "zz"), MT_EINVAL);
    mt__sym_destroy(&s);
}

static void test_module_cap(void **state)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    for (uint32_t i = 0; i < MT_SYM_MODULES_MAX; i++)
        assert_int_equal(mt__sym_add_module(s, 5, "/x/lib.so", (uint64_t)i << 20, 4096, NULL), 0);
    assert_int_equal(mt__sym_add_module(s, 5, "/x/lib.so", UINT64_C(1) << 40, 4096, NULL),
                     MT_EOVERFLOW);
    mt_sym_frame_t fr;
    assert_int_equal(mt__sym_resolve(s, 5, (UINT64_C(7) << 20) + 8, &fr), 0);
    assert_string_equal(fr.label, "lib.so+0x8");
    mt__sym_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_resolves_with_lines),
        cmocka_unit_test(test_stripped_degrades),
        cmocka_unit_test(test_no_dwarf_names_from_symtab),
        cmocka_unit_test(test_debug_file_local_only),
        cmocka_unit_test(test_untrusted_and_unknown),
        cmocka_unit_test(test_module_cap),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
