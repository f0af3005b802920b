/* Symbolization of recorded instruction pointers, on the reader side only (report, plot,
 * daemon): never call this from an allocating thread.
 *
 * A symbolizer holds each producer process's module map (the "module" lines of
 * docs/telemetry.md: path, load bias, size, build id) and resolves an ip of that process
 * to the function, plus file:line where the module has DWARF line info (elfutils libdwfl),
 * else to module+offset (a stripped binary), else to "unknown frame". Results are cached
 * per (pid, ip); the cache and the module table are bounded (MT_SYM_CACHE_MAX,
 * MT_SYM_MODULES_MAX; past them, entries are evicted or refused, never grown).
 * A module whose file on disk has another build id than the one recorded is not trusted
 * for names: its frames read module+offset. Not thread-safe: one thread per symbolizer. */
#ifndef MT_ANALYSIS_SYMBOLIZE_H
#define MT_ANALYSIS_SYMBOLIZE_H

#include <stdbool.h>
#include <stdint.h>
#include "memtrace/common.h"

#define MT_SYM_MODULES_MAX 4096u      /* modules over all processes */
#define MT_SYM_CACHE_MAX   (1u << 14) /* cached ips over all processes */

typedef struct mt_sym_s mt_sym_t;

/* One resolved frame. Strings are owned by the symbolizer and stay valid until
 * mt__sym_destroy; module is NULL when the ip lies in no known module, func NULL when no
 * symbol covers it, file NULL when there is no line info. */
typedef struct mt_sym_frame_s {
    const char *func;   /* demangled-as-recorded symbol name, or NULL */
    const char *file;   /* source file, or NULL */
    int line;           /* >= 1 with file, else 0 */
    const char *module; /* module path, or NULL */
    uint64_t offset;    /* ip - load bias within module (file vaddr), else the ip */
    const char *label;  /* one-line form: "func (file:line)", "func (module+0x..)",
                           "module+0x..", "unknown frame 0x.." */
} mt_sym_frame_t;

/* new (small: the cache is allocated at the first resolve); *out is NULL on failure
 * (MT_ENOMEM). */
int mt__sym_create(mt_sym_t **out);
void mt__sym_destroy(mt_sym_t **p);
/* Whether the symbolizers of this process may ask the debuginfod servers of
 * $DEBUGINFOD_URLS for debug information this machine lacks (default: no; the programs,
 * memtrace and memtraced, set it from MEMTRACE_DEBUGINFOD=1 at their edge). Without, debug
 * information is looked for where dwfl_standard_find_debuginfo looks on this machine, and nowhere
 * else. */
void mt__sym_debuginfod(bool on);

/* Records that process pid mapped path at load bias base for size bytes. An entry that
 * overlaps one already known for pid replaces it (a dlclose then a dlopen). build_id is
 * hex or NULL. MT_EINVAL for an empty path or size 0; MT_EOVERFLOW past MT_SYM_MODULES_MAX. */
int mt__sym_add_module(mt_sym_t *s, uint32_t pid, const char *path, uint64_t base, uint64_t size,
                       const char *build_id);

/* Resolves ip of process pid into *out (always filled, even for an unknown ip).
 * Returns 0, or MT_ENOMEM when any allocation failed, its own or libdwfl's (then *out reads
 * "unknown frame", and nothing of it is cached: it is no answer to print). Past the bound
 * on interned text (64 MiB) a frame reads "unknown frame" too, with 0. */
int mt__sym_resolve(mt_sym_t *s, uint32_t pid, uint64_t ip, mt_sym_frame_t *out);

/* A Python frame (recorded as function, file, line) in the same form: func, file and line
 * interned, module NULL, label "func (file.py:line)". NULL strings read "?". 0 or
 * MT_ENOMEM (then label reads "unknown frame"). */
int mt__sym_python(mt_sym_t *s, const char *func, const char *file, int line, mt_sym_frame_t *out);

/* Counters: ips resolved through the cache, through libdwfl, and left unknown. */
typedef struct mt_sym_stats_s {
    uint64_t hits, misses, unknown, modules;
} mt_sym_stats_t;
void mt__sym_stats(const mt_sym_t *s, mt_sym_stats_t *out);

#endif
