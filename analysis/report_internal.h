/* The report engine's state (report.c: reading and applying events; report_result.c: the
 * figures as JSON), shared by its two files only. */
#ifndef MT_ANALYSIS_REPORT_INTERNAL_H
#define MT_ANALYSIS_REPORT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "analysis/event_spool.h"
#include "analysis/gap.h"
#include "analysis/model.h"
#include "analysis/report.h"
#include "analysis/scopes.h"
#include "memtrace/prof.h"
#include "util/addrmap.h"

/* ---- the timeline, sampled as events arrive ---- */

/* Grid points kept per timeline step: the grid's interval is between 1/TL_GRID_PER_STEP and
 * 2/TL_GRID_PER_STEP of a step, and each sample of the timeline is one of the two grid points
 * around its step (timeline()): the very state at the step unless events fall on both sides
 * of it within the interval, else the state half a step before it at most. */
#define TL_GRID_PER_STEP 4

typedef struct tl_pt_s {
    uint64_t allocated, reserved; /* bytes, device, at the point */
    double utilization, fragmentation;
    uint64_t max;  /* bytes, the most allocated since the point before (this one's included) */
    uint64_t last; /* ns from the origin: the last event applied before the point (0: none) */
} tl_pt_t;

/* The device figures at the points origin + j w of a time grid: point j is the state before
 * the first event whose time - origin exceeds j w, as the timeline's samples are taken. When
 * the log's span passes the grid's, w doubles and every other point goes: memory is the
 * grid's, whatever the span.
 * Invariants: next <= cap (cap even + 1, or 0 before the first event); w a power of two;
 * run >= the allocated bytes after every event since point next - 1. */
typedef struct tl_grid_s {
    tl_pt_t *pts;
    size_t next, cap;
    uint64_t origin; /* ns, the first event's time */
    uint64_t w;      /* ns between points */
    uint64_t run;    /* bytes */
    uint64_t last;   /* ns from the origin of the last event applied (0: none, or before it) */
} tl_grid_t;

/* ---- the report ---- */

/* Invariant: while !unordered, the events kept are in strictly increasing
 * seq order and next_seq is the last seq + 1 (0 when none). */
typedef struct proc_s {
    int pid;
    char name[64];
    int exit_state;  /* 0 unknown, 1 clean, 2 unclean */
    uint64_t lost;   /* sum of gap records */
    mt__spool_t evs; /* every event, for the replays (not with cfg.stream) */
    size_t nev;      /* events taken (the replays' count) */
    uint64_t *seen;  /* with cfg.stream: hashes of the newest records (NULL before; report.c) */
    /* seen's entries, and the seq of the first record taken */
    size_t seen_cap;
    uint64_t seen_first;
    uint64_t next_seq;
    uint64_t t_min, t_max;       /* the least and greatest time_ns among the events (0: none) */
    bool unordered;              /* an event came with a seq below next_seq and was kept */
    uint64_t duplicates;         /* events dropped as already read from an earlier log */
    uint64_t labels;             /* tag label records among evs (kept for their seqs) */
    uint64_t added;              /* records among evs no input held (mt__report_add_ref) */
    char *tag_names[MT_TAG_MAX]; /* as seen in the log; NULL = not seen */
    mt_model_t *tables;          /* its stack table and module map ("stack", "module" lines) */
    mt_prof_job_t job;           /* rank and job from its hello (docs/fleet.md); unknown if none */
    bool shadowed; /* a later hello of its pid named another rank or job: logs of two hosts
                    * whose pids collide; the pid's next lines are the other process's */
    /* The analysis, applied as events arrive (not with cfg.replay_only): the model with the
     * tables, what it keeps of outside memory, scopes and the timeline's grid; the device's
     * peak so far and its gap, taken when the next event leaves the peak. */
    mt_model_t *m; /* NULL until the first event or table line */
    mt__report_outside_t *outside;
    mt_scopes_t sc;
    tl_grid_t grid;
    uint64_t host_events;
    uint64_t peak; /* bytes, the device's highest allocated (0 before any) */
    /* The peak's state without a copy per new peak (report_peak.c): pm (NULL: empty) after
     * lag[0..npeak) is the state right after the event that set the peak, m's the state
     * after all of lag[0..nlag); nlag <= cap_lag <= MT__REPORT_LAG_MAX, and the report's
     * lag_total (the sum of cap_lag) <= MT__REPORT_LAG_TOTAL. When none of a full list may
     * go to pm (npeak = 0), the gap is taken from pm and pm dropped (pm_off); after that,
     * each new peak's gap is copied from m when an event leaves it (peak_pending). */
    mt_model_t *pm;
    mt_event_rec_t *lag;
    size_t npeak, nlag, cap_lag;
    bool pm_off;
    bool peak_pending; /* pm_off, and the state is still the peak's: its gap not yet taken */
    bool have_gap;     /* peak_gap holds the gap at the peak (pm_off) */
    mt_gap_t peak_gap;
    bool failed;         /* out of memory while applying: the analysis is not the events' */
    bool untimed;        /* its times are its events' order (mt__report_set_untimed) */
    size_t snap_skipped; /* a snapshot's trace entries of actions not modelled */
    uint8_t snapshot;    /* read from a PyTorch snapshot: 1, and 2 when state only
                          * (mt__report_set_snapshot) */
    uint64_t t_known;    /* ns, its trace's start: earlier blocks have unknown lifetimes */
} proc_t;

#define MT__REPORT_LAG_MAX   ((size_t)1 << 16) /* events pm may lag m by (64 B each) */
#define MT__REPORT_LAG_TOTAL ((size_t)1 << 20) /* lag entries of every process (64 MiB) */

/* Frees p's analysis (report.c): its model, the peak's state, outside figures, scopes,
 * timeline grid and seen records, each left empty. */
void mt__report_release(mt__report_t *r, proc_t *p);
/* A model for p with the tables read so far, in *out (report.c): 0 or MT_ENOMEM. */
int mt__report_model_new(const mt__report_cfg_t *cfg, const proc_t *p, mt_model_t **out);
/* The peak (report_peak.c), around ev's apply to p's model m: before, with peak_pending,
 * the gap of m's state taken if ev leaves the peak; after (allocated: m's now), the peak
 * and the state at it followed. 0 or MT_ENOMEM. */
int mt__report_peak_before(proc_t *p, const mt_model_t *m, const mt_event_rec_t *ev);
int mt__report_peak_after(mt__report_t *r, proc_t *p, const mt_event_rec_t *ev, uint64_t allocated);
/* Before the result: an existing pm caught up to the peak, unless the peak is the state
 * now. 0 or MT_ENOMEM. */
int mt__report_peak_settle(mt__report_t *r, proc_t *p);
/* The gap of device memory right after the event that first reached the peak of allocated
 * (the first event when allocated never rose above 0), its pins named from m. NULL: no
 * memory. */
json_t *mt__report_peak_gap(const mt__report_cfg_t *cfg, const proc_t *p, const mt_model_t *m,
                            mt_sym_t *sym);

struct mt__report_s {
    mt__report_cfg_t cfg;
    proc_t *procs;
    size_t nprocs, cap;
    uint64_t lines, events, malformed;
    uint64_t lost_unattributed; /* gaps of consumer queues, no pid */
    uint64_t duplicates;        /* sum over the processes */
    size_t lag_total;           /* sum over the processes of cap_lag */
    mt_sym_t *sym;              /* symbolizer of the processes' call stacks */
    bool fast;   /* event lines go to the fast decoder first (ndjson_fast.h); false only when
                  * cfg.general_reader asks for the general path alone (benchmarks) */
    size_t last; /* index of the process proc_get found last (a hint: checked before use) */
    /* pid + 1 -> index in procs of pid's process that is not shadowed, for each pid with
     * one (the others are not in it); a log of thousands of processes whose lines
     * interleave looked each line's process up in a walk of all of them */
    mt__amap_t by_pid;
    mt__spool_file_t spool; /* where the processes' spools put their full chunks */
};

/* The name of tag in p's log (its label, else the built-in name), in buf when built. */
const char *mt__report_tag_str(const proc_t *p, int tag, char *buf, size_t len);

#endif
