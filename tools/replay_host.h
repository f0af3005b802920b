/* jemalloc beside memtrace in `memtrace replay`'s table, measured in a child process.
 *
 * Debian's libjemalloc uses initial-exec TLS: dlopen'ed into a running process it needs
 * static TLS that glibc may not have left ("cannot allocate memory in static TLS block").
 * A glibc tunable and a re-exec of the whole CLI would get it (bench/bench_alloc.c does
 * so), but would then run two mallocs in one process and change the environment of the
 * command the user started. Instead the trace is replayed once more by a child, this same
 * program, started with jemalloc preloaded: jemalloc is that process's malloc, as it is for
 * a program deployed with it, and the user's process is left as it was. */
#ifndef MT_TOOLS_REPLAY_HOST_H
#define MT_TOOLS_REPLAY_HOST_H

#include <stdbool.h>
#include <stdint.h>

/* The library preloaded: $MEMTRACE_JEMALLOC, else this soname (found as the dynamic loader
 * finds libraries). */
#define MT_TOOL_JEMALLOC_DEFAULT "libjemalloc.so.2"

/* The option of `memtrace replay` that makes the child: it times the process's malloc on the
 * trace and prints one line, MT_TOOL_HOST_TAG then "ns N version V" (exit 0) or "not
 * jemalloc" (exit 3, the preload did not take). Not in the usage text: only the parent
 * runs it. */
#define MT_TOOL_HOST_OPTION "measure-preloaded-malloc"
#define MT_TOOL_HOST_TAG    "preloaded malloc: "

typedef struct mt_tool_jemalloc_s {
    bool measured;
    uint64_t ns;      /* fastest pass over the trace's operations, wall ns */
    char version[32]; /* jemalloc's own, e.g. "5.3.0" */
    char note[256];   /* when not measured: one line, "jemalloc left out: <why>" */
} mt_tool_jemalloc_t;

/* Parent side: replays trace_path (rounds passes, the fastest counts) in a child with
 * jemalloc preloaded and fills *out. Never prints. */
void mt_tool_jemalloc_measure(const char *trace_path, unsigned rounds, mt_tool_jemalloc_t *out);

/* Child side (the option above): returns the exit status. */
int mt_tool_jemalloc_child(const char *trace_path, unsigned rounds);

#endif
