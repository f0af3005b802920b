/* Reader-side symbolization (symbolize.h): per-process module maps, elfutils libdwfl for
 * names and lines, a bounded cache of resolved ips, and interned strings. */
#include "analysis/symbolize.h"
#include "util/grow.h"

#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <zlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR_BYTES_MAX (64u << 20) /* interned text, all processes */

/* One mapped module of one process. The file is opened by libdwfl only when an ip in it is
 * first resolved (reported = true from then on). */
typedef struct module_s {
    uint32_t pid;
    char *path;       /* owned */
    char *build_id;   /* owned lowercase hex, or NULL when not recorded */
    uint64_t base;    /* load bias */
    uint64_t lo, hi;  /* [lo, hi) = [base, base + size) */
    Dwfl_Module *mod; /* in the process's Dwfl once reported, NULL if the file failed */
    bool reported;    /* the file was offered to libdwfl */
    bool trusted;     /* names may be read (file found, build ids agree) */
} module_t;

/* One process: its Dwfl session, rebuilt when a module is replaced. */
typedef struct proc_s {
    uint32_t pid;
    Dwfl *dwfl; /* NULL until first needed */
} proc_t;

typedef struct cache_ent_s {
    uint64_t ip;
    uint32_t pid;
    bool used;
    mt_sym_frame_t fr;
} cache_ent_t;

/* Invariants: modules[0, n_mod) of one pid do not overlap; n_mod <= MT_SYM_MODULES_MAX;
 * cache_n < MT_SYM_CACHE_MAX <= cache slots / 2 (the cache is cleared when it fills);
 * str_bytes <= STR_BYTES_MAX; every string a cached frame points to is in strs. */
struct mt_sym_s {
    module_t *mods;
    size_t n_mod, cap_mod;
    proc_t *procs;
    size_t n_proc, cap_proc;
    cache_ent_t *cache; /* 2 * MT_SYM_CACHE_MAX slots, open addressing; NULL until used */
    size_t cache_n;
    char **strs; /* interned strings, open addressing; NULL = free */
    size_t str_slots, str_n, str_bytes;
    mt_sym_stats_t st;
};

/* ---- where debug information comes from ---- */

static atomic_bool use_debuginfod;

void mt__sym_debuginfod(bool on)
{
    atomic_store(&use_debuginfod, on);
}

/* The CRC-32 of fd's whole contents (a .gnu_debuglink's check), from its start. */
static bool crc_matches(int fd, GElf_Word want)
{
    unsigned char buf[65536];
    uLong crc = crc32(0L, Z_NULL, 0);
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        crc = crc32(crc, buf, (uInt)n);
    return n == 0 && (GElf_Word)crc == want && lseek(fd, 0, SEEK_SET) == 0;
}

/* libdwfl's find_debuginfo: where dwfl_standard_find_debuginfo looks on this machine, by
 * build id (/usr/lib/debug/.build-id/), then by the file's .gnu_debuglink name beside it,
 * in its .debug/ and under /usr/lib/debug/ with its directory; its last resort, the
 * debuginfod servers of $DEBUGINFOD_URLS, only when asked (mt__sym_debuginfod). That one
 * downloads what no one asked for, sends the build ids of the program's modules out, and
 * dlopens a network client of thirty libraries even when no server is set: `memtrace
 * report` of a torch run on a host with debuginfod on (Ubuntu's default) would fetch
 * libtorch's debug information. */
static int find_debuginfo(Dwfl_Module *mod, void **userdata, const char *modname, Dwarf_Addr base,
                          const char *file_name, const char *debuglink_file,
                          GElf_Word debuglink_crc, char **debuginfo_file_name)
{
    if (atomic_load(&use_debuginfod))
        return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                            debuglink_crc, debuginfo_file_name);
    int fd = dwfl_build_id_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                          debuglink_crc, debuginfo_file_name);
    if (fd >= 0 || file_name == NULL || debuglink_file == NULL || debuglink_file[0] == '\0' ||
        strchr(debuglink_file, '/') != NULL)
        return fd >= 0 ? fd : -1;
    const char *slash = strrchr(file_name, '/');
    const char *dir = slash ? file_name : ".";
    int dlen = slash ? (int)(slash - file_name) : 1;
    static const char *const where[] = {"%.*s/%s", "%.*s/.debug/%s", "/usr/lib/debug%.*s/%s"};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        char path[PATH_MAX];
        int n = snprintf(path, sizeof path, where[i], dlen, dir, debuglink_file);
        if (n < 0 || (size_t)n >= sizeof path || (i == 2 && dir[0] != '/') ||
            strcmp(path, file_name) == 0)
            continue;
        struct stat st;
        int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (f < 0)
            continue;
        if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode) ||
            (debuglink_crc != 0 && !crc_matches(f, debuglink_crc))) {
            close(f);
            continue;
        }
        if ((*debuginfo_file_name = strdup(path)) == NULL) {
            close(f);
            return -1;
        }
        return f;
    }
    return -1;
}

static const Dwfl_Callbacks dwfl_cbs = {
    .find_elf = NULL,
    .find_debuginfo = find_debuginfo,
    .section_address = dwfl_offline_section_address,
};

/* ---- interned strings ---- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int strs_grow(mt_sym_t *s)
{
    size_t n = s->str_slots ? s->str_slots * 2 : 1024;
    char **t = calloc(n, sizeof(*t));
    if (t == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i < s->str_slots; i++) {
        if (s->strs[i] == NULL)
            continue;
        size_t j = hash_str(s->strs[i]) & (n - 1);
        while (t[j] != NULL)
            j = (j + 1) & (n - 1);
        t[j] = s->strs[i];
    }
    free(s->strs);
    s->strs = t;
    s->str_slots = n;
    return 0;
}

/* The interned copy of str in *out, or NULL past the text cap (STR_BYTES_MAX). 0, or
 * MT_ENOMEM when an allocation failed (*out NULL). */
static int intern(mt_sym_t *s, const char *str, const char **out)
{
    *out = NULL;
    if (2 * (s->str_n + 1) > s->str_slots && strs_grow(s) != 0)
        return MT_ENOMEM;
    size_t j = hash_str(str) & (s->str_slots - 1);
    while (s->strs[j] != NULL) {
        if (strcmp(s->strs[j], str) == 0) {
            *out = s->strs[j];
            return 0;
        }
        j = (j + 1) & (s->str_slots - 1);
    }
    size_t len = strlen(str) + 1;
    if (s->str_bytes + len > STR_BYTES_MAX)
        return 0;
    char *c = malloc(len);
    if (c == NULL)
        return MT_ENOMEM;
    memcpy(c, str, len);
    s->strs[j] = c;
    s->str_n++;
    s->str_bytes += len;
    *out = c;
    return 0;
}

/* ---- lifecycle ---- */

int mt__sym_create(mt_sym_t **out)
{
    *out = NULL;
    mt_sym_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto fail_struct;
    *out = s;
    return 0;
fail_struct:
    return MT_ENOMEM;
}

void mt__sym_destroy(mt_sym_t **p)
{
    mt_sym_t *s = *p;
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n_proc; i++) {
        if (s->procs[i].dwfl != NULL)
            dwfl_end(s->procs[i].dwfl);
    }
    for (size_t i = 0; i < s->n_mod; i++) {
        free(s->mods[i].path);
        free(s->mods[i].build_id);
    }
    for (size_t i = 0; i < s->str_slots; i++)
        free(s->strs[i]);
    free(s->strs);
    free(s->mods);
    free(s->procs);
    free(s->cache);
    free(s);
    *p = NULL;
}

/* ---- module map ---- */

static proc_t *proc_get(mt_sym_t *s, uint32_t pid, bool create)
{
    for (size_t i = 0; i < s->n_proc; i++) {
        if (s->procs[i].pid == pid)
            return &s->procs[i];
    }
    if (!create)
        return NULL;
    proc_t *procs = mt__grow(s->procs, &s->cap_proc, s->n_proc + 1, sizeof *procs, 8);
    if (procs == NULL)
        return NULL;
    s->procs = procs;
    proc_t *p = &s->procs[s->n_proc++];
    *p = (proc_t){.pid = pid};
    return p;
}

static void cache_clear(mt_sym_t *s)
{
    if (s->cache == NULL)
        return;
    memset(s->cache, 0, 2 * (size_t)MT_SYM_CACHE_MAX * sizeof(*s->cache));
    s->cache_n = 0;
}

/* Forgets the process's libdwfl session (after a module was replaced): every module of it
 * is reported again when next needed. */
static void proc_reset(mt_sym_t *s, proc_t *p)
{
    if (p->dwfl != NULL)
        dwfl_end(p->dwfl);
    p->dwfl = NULL;
    for (size_t i = 0; i < s->n_mod; i++) {
        if (s->mods[i].pid == p->pid) {
            s->mods[i].reported = false;
            s->mods[i].mod = NULL;
        }
    }
}

static void module_drop(mt_sym_t *s, size_t i)
{
    free(s->mods[i].path);
    free(s->mods[i].build_id);
    s->mods[i] = s->mods[--s->n_mod];
}

static bool hex_ok(const char *h)
{
    for (; *h; h++) {
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f') || (*h >= 'A' && *h <= 'F')))
            return false;
    }
    return true;
}

int mt__sym_add_module(mt_sym_t *s, uint32_t pid, const char *path, uint64_t base, uint64_t size,
                       const char *build_id)
{
    if (path == NULL || path[0] == '\0' || size == 0 || base > UINT64_MAX - size ||
        (build_id != NULL && !hex_ok(build_id)))
        return MT_EINVAL;
    proc_t *p = proc_get(s, pid, true);
    if (p == NULL)
        return MT_ENOMEM;
    uint64_t lo = base, hi = base + size;
    bool replaced = false;
    for (size_t i = 0; i < s->n_mod;) {
        module_t *m = &s->mods[i];
        if (m->pid == pid && m->lo < hi && lo < m->hi) {
            if (m->lo == lo && m->hi == hi && strcmp(m->path, path) == 0)
                return 0; /* the same mapping again (a module map re-sent) */
            module_drop(s, i);
            replaced = true;
            continue;
        }
        i++;
    }
    if (s->n_mod >= MT_SYM_MODULES_MAX)
        return MT_EOVERFLOW;
    module_t *mods = mt__grow(s->mods, &s->cap_mod, s->n_mod + 1, sizeof *mods, 64);
    if (mods == NULL)
        return MT_ENOMEM;
    s->mods = mods;
    module_t m = {.pid = pid, .base = base, .lo = lo, .hi = hi};
    m.path = strdup(path);
    m.build_id = build_id != NULL && build_id[0] != '\0' ? strdup(build_id) : NULL;
    if (m.path == NULL || (build_id != NULL && build_id[0] != '\0' && m.build_id == NULL)) {
        free(m.path);
        free(m.build_id);
        return MT_ENOMEM;
    }
    for (char *c = m.build_id; c != NULL && *c; c++) {
        if (*c >= 'A' && *c <= 'F')
            *c = (char)(*c - 'A' + 'a');
    }
    s->mods[s->n_mod++] = m;
    s->st.modules = s->n_mod;
    if (replaced)
        proc_reset(s, p);
    cache_clear(s); /* an ip may now lie in another module */
    return 0;
}

static module_t *module_at(mt_sym_t *s, uint32_t pid, uint64_t ip)
{
    for (size_t i = 0; i < s->n_mod; i++) {
        module_t *m = &s->mods[i];
        if (m->pid == pid && ip >= m->lo && ip < m->hi)
            return m;
    }
    return NULL;
}

static bool build_id_matches(Dwfl_Module *mod, const char *want)
{
    const unsigned char *bits;
    GElf_Addr vaddr;
    int n = dwfl_module_build_id(mod, &bits, &vaddr);
    if (want == NULL)
        return true; /* nothing recorded to compare with */
    if (n <= 0 || strlen(want) != 2 * (size_t)n)
        return false;
    for (int i = 0; i < n; i++) {
        char hx[3];
        snprintf(hx, sizeof(hx), "%02x", bits[i]);
        if (want[2 * i] != hx[0] || want[2 * i + 1] != hx[1])
            return false;
    }
    return true;
}

/* Offers m's file to the process's libdwfl session. 0 (then m->reported; a file that cannot
 * be read leaves m untrusted), or MT_ENOMEM (m is offered again at its next ip). */
static int module_report(mt_sym_t *s, module_t *m)
{
    proc_t *p = proc_get(s, m->pid, false);
    if (p == NULL) {
        m->reported = true;
        return 0;
    }
    if (p->dwfl == NULL && (p->dwfl = dwfl_begin(&dwfl_cbs)) == NULL)
        return MT_ENOMEM; /* (it fails only when its allocation does) */
    m->reported = true;
    /* The path comes from the producer: only a regular file is read (a FIFO or a device
     * would block or never end), opened without waiting. */
    int fd = open(m->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    dwfl_report_begin_add(p->dwfl);
    /* add_p_vaddr: base is the load bias (dlpi_addr), whatever the first PT_LOAD's vaddr.
     * On success the module owns fd. libdwfl says why it failed in its own codes, which it
     * does not publish: errno tells an allocation's failure from a file it cannot read. */
    errno = 0;
    m->mod = dwfl_report_elf(p->dwfl, m->path, m->path, fd, m->base, true);
    int err = errno;
    dwfl_report_end(p->dwfl, NULL, NULL);
    if (m->mod == NULL) {
        close(fd);
        if (err == ENOMEM) {
            m->reported = false;
            return MT_ENOMEM;
        }
    }
    m->trusted = m->mod != NULL && build_id_matches(m->mod, m->build_id);
    return 0;
}

/* ---- resolution ---- */

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b != NULL ? b + 1 : path;
}

/* m's function and source line of ip into fr (each left NULL where m has none). 0 or
 * MT_ENOMEM: a lookup that finds nothing with errno ENOMEM failed to allocate (see
 * module_report), which must not read as a frame without a name. */
static int resolve_names(mt_sym_t *s, const module_t *m, uint64_t ip, mt_sym_frame_t *fr)
{
    /* Recorded ips are return addresses: the call is the byte before. */
    GElf_Addr look = ip > m->lo ? ip - 1 : ip, off;
    GElf_Sym sym;
    errno = 0;
    const char *name = dwfl_module_addrinfo(m->mod, look, &off, &sym, NULL, NULL, NULL);
    if ((name == NULL && errno == ENOMEM) ||
        (name != NULL && name[0] != '\0' && intern(s, name, &fr->func) != 0))
        return MT_ENOMEM;
    errno = 0;
    Dwfl_Line *l = dwfl_module_getsrc(m->mod, look);
    int line = 0;
    const char *file = l != NULL ? dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL) : NULL;
    if (file == NULL && errno == ENOMEM)
        return MT_ENOMEM;
    if (file != NULL && line > 0) {
        if (intern(s, file, &fr->file) != 0)
            return MT_ENOMEM;
        fr->line = fr->file != NULL ? line : 0;
    }
    return 0;
}

/* ip resolved into fr: 0 (fr->label NULL past the text cap) or MT_ENOMEM. */
static int resolve_uncached(mt_sym_t *s, uint32_t pid, uint64_t ip, mt_sym_frame_t *fr)
{
    char buf[1024];
    *fr = (mt_sym_frame_t){.offset = ip};
    module_t *m = module_at(s, pid, ip);
    if (m != NULL) {
        if (intern(s, m->path, &fr->module) != 0)
            return MT_ENOMEM;
        fr->offset = ip - m->base;
        if (!m->reported && module_report(s, m) != 0)
            return MT_ENOMEM;
    }
    if (m != NULL && m->trusted && resolve_names(s, m, ip, fr) != 0)
        return MT_ENOMEM;
    if (fr->func != NULL && fr->file != NULL)
        snprintf(buf, sizeof(buf), "%s (%s:%d)", fr->func, base_name(fr->file), fr->line);
    else if (fr->func != NULL && fr->module != NULL)
        snprintf(buf, sizeof(buf), "%s (%s+0x%" PRIx64 ")", fr->func, base_name(fr->module),
                 fr->offset);
    else if (fr->module != NULL)
        snprintf(buf, sizeof(buf), "%s+0x%" PRIx64, base_name(fr->module), fr->offset);
    else
        snprintf(buf, sizeof(buf), "unknown frame 0x%" PRIx64, ip);
    return intern(s, buf, &fr->label);
}

static const char *const unknown_label = "unknown frame";

int mt__sym_resolve(mt_sym_t *s, uint32_t pid, uint64_t ip, mt_sym_frame_t *out)
{
    size_t slots = 2 * (size_t)MT_SYM_CACHE_MAX;
    if (s->cache == NULL && (s->cache = calloc(slots, sizeof(*s->cache))) == NULL) {
        *out = (mt_sym_frame_t){.offset = ip, .label = unknown_label};
        return MT_ENOMEM;
    }
    size_t j = (size_t)((ip * 0x9E3779B97F4A7C15ull) ^ (pid * 0xC2B2AE3D27D4EB4Full)) & (slots - 1);
    while (s->cache[j].used) {
        if (s->cache[j].ip == ip && s->cache[j].pid == pid) {
            *out = s->cache[j].fr;
            s->st.hits++;
            return 0;
        }
        j = (j + 1) & (slots - 1);
    }
    s->st.misses++;
    if (resolve_uncached(s, pid, ip, out) != 0) {
        /* Nothing of it cached: the same ip resolves whole once there is memory. */
        *out = (mt_sym_frame_t){.offset = ip, .label = unknown_label};
        s->st.unknown++;
        return MT_ENOMEM;
    }
    if (out->label == NULL) {
        /* Past the text cap: keep what resolved, read "unknown frame", do not cache. */
        out->label = unknown_label;
        s->st.unknown++;
        return 0;
    }
    if (out->module == NULL)
        s->st.unknown++;
    if (s->cache_n + 1 >= MT_SYM_CACHE_MAX) {
        cache_clear(s);
        return 0;
    }
    s->cache[j] = (cache_ent_t){.ip = ip, .pid = pid, .used = true, .fr = *out};
    s->cache_n++;
    return 0;
}

int mt__sym_python(mt_sym_t *s, const char *func, const char *file, int line, mt_sym_frame_t *out)
{
    char buf[1024];
    *out = (mt_sym_frame_t){0};
    out->line = line > 0 ? line : 0;
    snprintf(buf, sizeof(buf), "%s (%s:%d)", func != NULL ? func : "?",
             base_name(file != NULL ? file : "?"), out->line);
    if (intern(s, func != NULL ? func : "?", &out->func) != 0 ||
        intern(s, file != NULL ? file : "?", &out->file) != 0 || intern(s, buf, &out->label) != 0) {
        *out = (mt_sym_frame_t){.label = unknown_label};
        return MT_ENOMEM;
    }
    if (out->label == NULL || out->func == NULL || out->file == NULL)
        out->label = unknown_label; /* past the text cap, as mt__sym_resolve */
    return 0;
}

void mt__sym_stats(const mt_sym_t *s, mt_sym_stats_t *out)
{
    *out = s->st;
}
