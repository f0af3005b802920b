/* Host-allocation fault injection (see inject.h). */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <jansson.h>
#include <malloc.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <unwind.h>
#ifdef MT_HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#endif
#include <cmocka.h>

#include "inject.h"

/* glibc's allocator, always present. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);
/* ASan's allocator, when the test is built with it (weak: NULL otherwise). */
extern void *__interceptor_malloc(size_t n) __attribute__((weak));
extern void *__interceptor_calloc(size_t k, size_t n) __attribute__((weak));
extern void *__interceptor_realloc(void *p, size_t n) __attribute__((weak));
extern void __interceptor_free(void *p) __attribute__((weak));
extern int __interceptor_posix_memalign(void **out, size_t align, size_t n) __attribute__((weak));

static atomic_bool armed;
/* Only the thread that armed counts: numbering stays the same from run to run, and the
 * runtime's own allocations in threads starting meanwhile (ASan's) are left alone. */
static _Thread_local bool arming_thread;
static atomic_bool injected;
static atomic_long fail_at;
static atomic_long counted;
static atomic_long live;
static bool announce; /* say so on stderr when failing (tools: fault_arm_from_env) */
/* Inside one of jansson's parsers (see json_loadb below): depth, and whether the allocation
 * to fail fell inside. */
static _Thread_local int in_parse;
static _Thread_local bool parse_failed;

/* "mt-fault: host allocation N failed" on stderr, without allocating. */
static void say_failed(long n)
{
    char msg[64] = "\nmt-fault: host allocation ";
    size_t len = strlen(msg);
    char digits[24];
    size_t nd = 0;
    do {
        digits[nd++] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0 && nd < sizeof digits);
    while (nd > 0)
        msg[len++] = digits[--nd];
    memcpy(msg + len, " failed\n", 8);
    (void)!write(STDERR_FILENO, msg, len + 8);
}

/* ---- sites ----
 * A site is a call stack (SITE_FRAMES return addresses). Only the first PER_SITE
 * allocations of each site in a run are numbered: a loop then fails every site (and its
 * second use, where growth code differs) without failing the thousandth parse of the same
 * line shape, which would make a scenario's cost quadratic in its length. */
#define SITE_FRAMES 10
#define PER_SITE    2
/* A tool's run is a process: its loop fails only the first use of each site. */
static uint8_t per_site = PER_SITE;
#define SITE_SLOTS 8192

static uint64_t site_key[SITE_SLOTS]; /* 0 = empty; reset by fault_arm */
static uint8_t site_uses[SITE_SLOTS];
static _Thread_local bool in_site; /* the unwinder may allocate: not numbered */

/* The site's key: a hash of its SITE_FRAMES innermost return addresses.
 * With libunwind (linked whenever the library is, see meson.build), its cached
 * unw_backtrace: libunwind also exports _Unwind_Backtrace, which then wins over libgcc's,
 * and that compatibility walk takes a global lock with two sigprocmask calls per frame,
 * for every host allocation of a loop: fault_prof spent three quarters of its time there
 * and, on a loaded machine, ran past its timeout. Without libunwind, libgcc's unwinder
 * directly: glibc's backtrace() dlopens it, and LeakSanitizer then reports the loader's
 * bookkeeping (allocated through this file's malloc) as leaked. */
#ifdef MT_HAVE_LIBUNWIND
static void unwinder_init(void)
{
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
    void *ips[SITE_FRAMES];
    (void)unw_backtrace(ips, SITE_FRAMES); /* first-use set-up, not while armed */
}

static uint64_t site_key_now(void)
{
    void *ips[SITE_FRAMES];
    int n = unw_backtrace(ips, SITE_FRAMES);
    uint64_t key = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        key = (key ^ (uint64_t)(uintptr_t)ips[i]) * 0x100000001b3ull;
    return key;
}
#else
typedef struct {
    uint64_t key;
    int depth;
} walk_t;

static _Unwind_Reason_Code walk_frame(struct _Unwind_Context *ctx, void *arg)
{
    walk_t *w = arg;
    w->key = (w->key ^ (uint64_t)_Unwind_GetIP(ctx)) * 0x100000001b3ull;
    return ++w->depth < SITE_FRAMES ? _URC_NO_REASON : _URC_END_OF_STACK;
}

static void unwinder_init(void)
{
    walk_t w = {0, 0};
    _Unwind_Backtrace(walk_frame, &w); /* first-use set-up, not while armed */
}

static uint64_t site_key_now(void)
{
    walk_t w = {0xcbf29ce484222325ull, 0};
    _Unwind_Backtrace(walk_frame, &w);
    return w.key;
}
#endif

/* True when the calling allocation's site has been numbered per_site times already. */
static bool site_spent(void)
{
    in_site = true;
    uint64_t k = site_key_now() | 1;
    in_site = false;
    size_t i = (size_t)(k >> 17) & (SITE_SLOTS - 1);
    for (size_t probes = 0; site_key[i] != 0 && site_key[i] != k; probes++) {
        if (probes == SITE_SLOTS)
            return false; /* table full: number everything */
        i = (i + 1) & (SITE_SLOTS - 1);
    }
    site_key[i] = k;
    if (site_uses[i] >= per_site)
        return true;
    site_uses[i]++;
    return false;
}

/* ---- which library called ----
 * Two libraries' allocations are treated apart: elfutils' are neither failed nor numbered
 * (it does not check every allocation: a failed malloc inside dwarf_getsrclines
 * dereferences NULL, and its handling is not ours to test; the symbolizer's own allocations
 * around its calls still are), and libuv's reallocs are not failed (it grows a loop's array
 * of watchers with realloc and aborts when that fails, unix/core.c maybe_resize; its
 * mallocs and callocs answer UV_ENOMEM and stay failed and numbered). Objects loaded after
 * the injector was armed are not the program's either: they are a library's plugins, here
 * elfutils' debuginfod client and the thirty libraries it needs (curl, gnutls, krb5, ...),
 * which libdw dlopens at its first module without local debug information; they are
 * treated as elfutils' are (their initialisers' allocations were a fifth of a report's
 * sites). The objects' address ranges are read when armed, and again when an address is in
 * none of them (dl_iterate_phdr): dladdr at every allocation, which searches the object's
 * symbols for the nearest one, was four fifths of a tool run's instructions under the
 * injector. An address in no object at all is named by dladdr. */
enum { OBJ_OTHER, OBJ_ELFUTILS, OBJ_LIBUV };
#define OBJ_RANGES 512

typedef struct obj_range_s {
    uintptr_t lo, hi;
    uint8_t kind;
} obj_range_t;
static obj_range_t obj_range[OBJ_RANGES];
static size_t n_obj_ranges;
/* Objects loaded when first armed in this process; later ones are plugins (so that every
 * run of an in-process loop numbers the same allocations). 0: not armed yet. */
static size_t n_armed_objects;
static size_t n_objects; /* during a walk: objects seen so far */

static uint8_t kind_of_path(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    if (strncmp(b, "libdw.", 6) == 0 || strncmp(b, "libdw-", 6) == 0 ||
        strncmp(b, "libelf.", 7) == 0 || strncmp(b, "libelf-", 7) == 0)
        return OBJ_ELFUTILS;
    return strncmp(b, "libuv.", 6) == 0 ? OBJ_LIBUV : OBJ_OTHER;
}

static int note_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    uint8_t kind = kind_of_path(info->dlpi_name ? info->dlpi_name : "");
    if (kind == OBJ_OTHER && n_armed_objects != 0 && n_objects >= n_armed_objects)
        kind = OBJ_ELFUTILS; /* (a plugin, loaded since) */
    n_objects++;
    for (int i = 0; i < info->dlpi_phnum && n_obj_ranges < OBJ_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD) {
            uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
            obj_range[n_obj_ranges++] = (obj_range_t){lo, lo + ph->p_memsz, kind};
        }
    }
    return 0;
}

/* The objects loaded now (dl_iterate_phdr, in load order, does not allocate); those past
 * the ones loaded when first armed are plugins. */
static void objects_init(void)
{
    n_obj_ranges = n_objects = 0;
    in_site = true;
    dl_iterate_phdr(note_object, NULL);
    in_site = false;
    if (n_armed_objects == 0)
        n_armed_objects = n_objects;
}

static int range_kind(uintptr_t a)
{
    for (size_t i = 0; i < n_obj_ranges; i++)
        if (a - obj_range[i].lo < obj_range[i].hi - obj_range[i].lo)
            return obj_range[i].kind;
    return -1;
}

/* The kind of the object that holds ra: from the ranges, read again when ra is in none
 * (libdw dlopens its debuginfod client, which loads a dozen more), else by dladdr. dladdr
 * does not allocate; in_site covers it if a libc ever did. */
static uint8_t object_kind(const void *ra)
{
    int k = range_kind((uintptr_t)ra);
    if (k < 0) {
        size_t had = n_obj_ranges;
        objects_init();
        k = n_obj_ranges != had ? range_kind((uintptr_t)ra) : -1;
    }
    if (k >= 0)
        return (uint8_t)k;
    Dl_info di;
    in_site = true;
    bool found = ra != NULL && dladdr(ra, &di) != 0 && di.dli_fname != NULL;
    in_site = false;
    return found ? kind_of_path(di.dli_fname) : OBJ_OTHER;
}

static bool from_elfutils(const void *ra)
{
    return object_kind(ra) == OBJ_ELFUTILS;
}

static bool from_libuv(const void *ra)
{
    return object_kind(ra) == OBJ_LIBUV;
}

/* True when this allocation, called from ra, is the one to fail. */
static bool fail_now(const void *ra)
{
    if (!arming_thread || in_site || !atomic_load_explicit(&armed, memory_order_acquire))
        return false;
    if (from_elfutils(ra) || site_spent())
        return false;
    long n = atomic_fetch_add(&counted, 1) + 1;
    if (n != atomic_load(&fail_at))
        return false;
    atomic_store(&injected, true);
    if (in_parse > 0) {
        parse_failed = true; /* failed when the parser returns, see json_loadb */
        return false;
    }
    if (announce)
        say_failed(n);
    errno = ENOMEM;
    return true;
}

static void *got(void *p)
{
    if (p != NULL)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

void *malloc(size_t n)
{
    if (fail_now(__builtin_return_address(0)))
        return NULL;
    return got(__interceptor_malloc ? __interceptor_malloc(n) : __libc_malloc(n));
}

void *calloc(size_t k, size_t n)
{
    if (fail_now(__builtin_return_address(0)))
        return NULL;
    return got(__interceptor_calloc ? __interceptor_calloc(k, n) : __libc_calloc(k, n));
}

void free(void *p)
{
    if (p == NULL)
        return;
    atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
    if (__interceptor_free)
        __interceptor_free(p);
    else
        __libc_free(p);
}

void *realloc(void *p, size_t n)
{
    const void *ra = __builtin_return_address(0);
    bool spare = arming_thread && !in_site && armed && from_libuv(ra);
    if (p == NULL && spare)
        return got(__interceptor_malloc ? __interceptor_malloc(n) : __libc_malloc(n));
    if (p == NULL)
        return malloc(n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    if (!spare && fail_now(ra))
        return NULL;
    return __interceptor_realloc ? __interceptor_realloc(p, n) : __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t k, size_t n)
{
    if (n != 0 && k > SIZE_MAX / n) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, k * n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    if (fail_now(__builtin_return_address(0)))
        return ENOMEM;
    if (__interceptor_posix_memalign) {
        int rc = __interceptor_posix_memalign(out, align, n);
        if (rc == 0)
            got(*out);
        return rc;
    }
    void *p = __libc_memalign(align, n);
    if (p == NULL)
        return ENOMEM;
    *out = got(p);
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, n) == 0 ? p : NULL;
}

void *memalign(size_t align, size_t n)
{
    return aligned_alloc(align, n);
}

void *valloc(size_t n)
{
    return aligned_alloc((size_t)sysconf(_SC_PAGESIZE), n);
}

char *strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    return d != NULL ? memcpy(d, s, n) : NULL;
}

char *strndup(const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    char *d = malloc(n + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* ---- jansson's parsers ----
 * jansson 2.14 does not survive an allocation failure inside its lexer: lex_save drops
 * the failure, the saved token loses a character, and lex_scan_string then copies past
 * the token's end (a heap overflow; upstream issue akheron/jansson#362, unfixed in 2.14).
 * That is not memtrace's to fix, and a loop that crashes there tests nothing further.
 * So an allocation to fail inside a parse succeeds, and the parse then fails as a fixed
 * jansson would: NULL, error code json_error_out_of_memory, errno ENOMEM. */

static json_t *parse_result(json_t *j, json_error_t *error)
{
    in_parse--;
    if (!parse_failed || in_parse > 0)
        return j;
    parse_failed = false;
    json_decref(j);
    if (error != NULL) {
        memset(error, 0, sizeof *error);
        snprintf(error->text, sizeof error->text, "out of memory");
        error->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
    }
    if (announce)
        say_failed(atomic_load(&fail_at));
    errno = ENOMEM;
    return NULL;
}

#define REAL(name, type) ((type)dlsym(RTLD_NEXT, name))

json_t *json_loadb(const char *buf, size_t len, size_t flags, json_error_t *error)
{
    json_t *(*real)(const char *, size_t, size_t, json_error_t *) =
        REAL("json_loadb", json_t * (*)(const char *, size_t, size_t, json_error_t *));
    in_parse++;
    return parse_result(real(buf, len, flags, error), error);
}

json_t *json_loads(const char *s, size_t flags, json_error_t *error)
{
    json_t *(*real)(const char *, size_t, json_error_t *) =
        REAL("json_loads", json_t * (*)(const char *, size_t, json_error_t *));
    in_parse++;
    return parse_result(real(s, flags, error), error);
}

json_t *json_load_file(const char *path, size_t flags, json_error_t *error)
{
    json_t *(*real)(const char *, size_t, json_error_t *) =
        REAL("json_load_file", json_t * (*)(const char *, size_t, json_error_t *));
    in_parse++;
    return parse_result(real(path, flags, error), error);
}

/* ---- control ---- */

void fault_arm(long n)
{
    unwinder_init();
    objects_init();
    memset(site_key, 0, sizeof site_key);
    memset(site_uses, 0, sizeof site_uses);
    atomic_store(&fail_at, n);
    atomic_store(&counted, 0);
    atomic_store(&injected, false);
    arming_thread = true;
    atomic_store_explicit(&armed, true, memory_order_release);
}

bool fault_disarm(void)
{
    atomic_store_explicit(&armed, false, memory_order_release);
    arming_thread = false;
    return atomic_load(&injected);
}

void fault_arm_from_env(void)
{
    const char *s = getenv("MT_FAULT_AT");
    if (s == NULL)
        return;
    announce = true;
    per_site = 1;
    fault_arm(strtol(s, NULL, 10));
}

long fault_target(void)
{
    return atomic_load(&fail_at);
}

long fault_count(void)
{
    return atomic_load(&counted);
}

long fault_live(void)
{
    return atomic_load(&live);
}

long fault_loop(const char *name, fault_scenario_fn fn, void *ud)
{
    fault_arm(0);
    fn(ud);
    fault_disarm();
    long sites = fault_count();
    for (long n = 1;; n++) {
        long before = fault_live();
        fault_arm(n);
        fn(ud);
        bool hit = fault_disarm();
        long after = fault_live();
        if (after != before)
            fail_msg("%s: failing host allocation %ld leaked %ld allocation(s)", name, n,
                     after - before);
        if (!hit) {
            fprintf(stderr, "%s: %ld allocation sites failed, one at a time (%ld in a clean run)\n",
                    name, n - 1, sites);
            return n - 1;
        }
    }
}
