/* Replay of a loaded allocation trace (trace_csv.h) through the caching allocator on the
 * sim backend. Used by `memtrace replay` and by the benchmark (bench/bench_alloc.c), so
 * both report the same figures measured the same way. Implemented in replay.c. */
#ifndef MT_ANALYSIS_REPLAY_H
#define MT_ANALYSIS_REPLAY_H

#include <stdbool.h>
#include <stdint.h>

#include "memtrace/alloc.h"
#include "analysis/trace_csv.h"

typedef struct mt_replay_cfg_s {
    const char *alloc_conf; /* "key:value,..." applied after MEMTRACE_ALLOC_CONF; NULL = none */
    size_t capacity;        /* sim device bytes; 0 = MEMTRACE_SIM_CAPACITY or 8 GiB */
    bool warmup;            /* a warm-up pass (mt_alloc_warmup_begin/end) before measuring */
    bool second_pass;       /* an unmeasured pass on the same allocator before measuring (a
                             * training loop's second iteration: cache kept, peaks reset) */
    bool sample_peak;       /* read the allocator's stats after every allocate to capture the
                             * state at peak allocated (fragmentation); slows the pass, so
                             * ns figures of a sampled run are not meaningful */
    unsigned rounds;        /* timed passes over the trace (>= 1); the fastest one counts */
    bool cpu_time;          /* mt__replay_passes only: time passes by the calling thread's CPU
                             * clock (its page faults included, preemption not), for a
                             * machine shared with other jobs; false = wall clock */
} mt_replay_cfg_t;

/* Defaults: no conf, default capacity, no warm-up, no sampling, one round. */
mt_replay_cfg_t mt__replay_cfg_default(void);
/* The sim capacity that holds a run which reserved peak_reserved bytes, twice over: 0 (the
 * sim's default) when that is within the default's 8 GiB. For replays of a program's own
 * record (a snapshot, a log), which have no --capacity of their own. */
size_t mt__replay_capacity_for(uint64_t peak_reserved);

typedef struct mt_replay_result_s {
    char backend[16];        /* mt_backend_name() */
    uint64_t capacity;       /* device bytes */
    uint64_t malloc_cost_ns; /* modelled cost of a segment malloc on this backend */
    uint64_t ops;            /* allocates + frees replayed per pass */
    uint64_t ooms;           /* allocates that failed with MT_ENOMEM in the measured pass */
    /* The measured pass (the last one, after the warm-up if any). */
    uint64_t peak_allocated;    /* bytes, allocated_bytes peak */
    uint64_t peak_reserved;     /* bytes, reserved_bytes peak */
    double utilization_at_peak; /* peak_allocated / peak_reserved; 1 when nothing reserved */
    uint64_t num_alloc_retries; /* allocator stats of the measured pass */
    uint64_t num_ooms;
    uint64_t backend_malloc;           /* backend calls during the measured pass: segment malloc */
    uint64_t backend_free;             /*   segment free */
    uint64_t backend_map;              /*   vm_map (expandable segments) */
    uint64_t backend_unmap;            /*   vm_unmap */
    uint64_t warmup_backend_calls;     /* malloc+free+map+unmap during the warm-up pass and
                                        * the reservation that ends it */
    uint64_t warmup_reserved;          /* bytes reserved when the warm-up ended */
    uint64_t first_pass_backend_calls; /* malloc+free+map+unmap of the unmeasured first pass
                                        * (second_pass only) */
    /* At the allocate that reached peak allocated (only with sample_peak). */
    bool sampled;
    double fragmentation_at_peak; /* 1 - largest free block / total free */
    uint64_t largest_free_at_peak;
    uint64_t total_free_at_peak;
    uint64_t reserved_at_peak;
    /* Time of the fastest measured pass. */
    uint64_t elapsed_ns;  /* wall clock, modelled backend cost included */
    uint64_t modelled_ns; /* of which the sim backend's busy-waited modelled cost */
} mt_replay_result_t;

/* Replays t: creates a sim backend and an allocator (config: defaults, then the environment,
 * then cfg->alloc_conf), runs the optional warm-up pass, then cfg->rounds measured passes.
 * Allocations the trace never frees are freed after each pass (untimed). Returns 0, MT_EINVAL
 * for a bad alloc_conf, or a backend/allocator error; the message is in err. An allocate
 * that fails with MT_ENOMEM is counted (ooms), not an error. */
int mt__replay_run(const mt_trace_t *t, const mt_replay_cfg_t *cfg, mt_replay_result_t *out,
                   char *err, size_t errlen);

/* Passes in a row on one allocator, for cold against warm: replays t npasses times on one
 * fresh sim backend and allocator (configured as mt__replay_run does; cfg->rounds and
 * cfg->second_pass are not used). Pass 0 starts from the fresh allocator (cold); each later
 * pass starts from what the earlier ones left: cache kept, what a pass left live freed
 * untimed, peaks reset. With cfg->warmup, pass 0 runs between mt_alloc_warmup_begin and
 * mt_alloc_warmup_end (the end is not timed) and the later passes after it. ns[i] receives
 * pass i's wall ns without the sim backend's modelled cost, modelled[i] that cost (NULL: not
 * wanted). *out describes pass 0 (peaks, utilization, backend calls); peak_reserved_after
 * receives the highest reserved peak of the later passes (NULL: not wanted). Returns as
 * mt__replay_run. */
int mt__replay_passes(const mt_trace_t *t, const mt_replay_cfg_t *cfg, unsigned npasses,
                      uint64_t *ns, uint64_t *modelled, mt_replay_result_t *out,
                      uint64_t *peak_reserved_after, char *err, size_t errlen);

/* ---- host allocators on the same sequence ----
 * glibc malloc, jemalloc and mimalloc, for the per-operation cost beside memtrace's. jemalloc
 * and mimalloc are dlopen'ed RTLD_LOCAL (linking either would replace the process malloc);
 * an absent library leaves its entry's alloc NULL and says why in note, in one line
 * ("mimalloc left out: not installed (libmimalloc.so.2 not found)"). Debian's jemalloc needs static
 * TLS that a dlopen may not get: `memtrace replay` measures it in a child process that
 * preloads it instead (tools/replay_host.c), bench_alloc re-executes with more. */
enum { MT_HOST_GLIBC = 0, MT_HOST_JEMALLOC = 1, MT_HOST_MIMALLOC = 2, MT_HOST_N = 3 };
typedef struct mt_host_alloc_s {
    const char *name;
    void *(*alloc)(size_t size); /* NULL when the library could not be loaded */
    void (*free)(void *p);
    char note[192];
} mt_host_alloc_t;

/* Fills *out for one of them (MT_HOST_*); the library stays loaded for the life of the
 * process. glibc malloc is the process's malloc, whichever library provides it. */
void mt__host_alloc_load(mt_host_alloc_t *out, int which);
/* Fills out[MT_HOST_N]: each of them, as above. */
void mt__host_allocs_load(mt_host_alloc_t out[MT_HOST_N]);
/* Wall ns of the fastest of rounds passes of t's allocates and frees through h (sizes as
 * recorded; what a pass leaves live is freed untimed). 0 if h is not loaded. */
uint64_t mt__replay_host(const mt_host_alloc_t *h, const mt_trace_t *t, unsigned rounds);

/* Ns of each of npasses passes of t through h in a row (wall clock, or the calling thread's
 * CPU clock if cpu_time), h in whatever state the process
 * left it: pass 0 is a cold one only in a process that has not used h before. What a pass
 * leaves live is freed untimed. Returns 0, MT_EINVAL if h is not loaded, MT_ENOMEM. */
int mt__replay_host_passes(const mt_host_alloc_t *h, const mt_trace_t *t, unsigned npasses,
                           bool cpu_time, uint64_t *ns);

/* "CPU model, N cores online" of this machine, for tables that are compared within one run. */
void mt__replay_machine(char *buf, size_t n);

#endif
