/* Offline analysis of a telemetry log (NDJSON, schema v1), for `memtrace report`.
 *
 * Lines are fed one at a time; the result is one JSON document (new json_t *) with,
 * per process: peaks (allocated, reserved, by tag), a timeline of allocated, reserved,
 * utilization and fragmentation, the allocations never freed grouped by tag and size,
 * why reserved exceeds allocated at the peak and at the end (peak_gap, end_gap:
 * analysis/gap.h), and the growth detector's verdict. All of these are device memory
 * only: pinned host memory (events of pool MT_POOL_HOST, from a pinned host cache) is
 * summarised apart, in the process's "host" member (peaks, final totals, peaks by tag,
 * never freed).
 *
 * Blocks allocated before lost events whose free may have been lost are never counted as
 * never freed: they are reported apart (never_freed.uncertain_*; docs/analysis.md).
 *
 * Growth detector (mt__model_growth): at each MT_MARK_ITERATION marker the process's
 * allocated total (and each tag's live bytes) is sampled; the first sample is dropped as
 * warm-up when there are at least five; a least-squares line is fitted over the rest.
 * Growth is flagged when the slope is positive, the fit explains the samples
 * (r2 >= min_r2), the rise over the fitted samples is at least min_growth_bytes, and at
 * least 3/4 of the steps do not go down: memory that rises steadily from one iteration to
 * the next, the sign of history kept alive (a list of tensors appended to every step). */
#ifndef MT_ANALYSIS_REPORT_H
#define MT_ANALYSIS_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "analysis/model.h"
#include "analysis/symbolize.h"
#include "memtrace/alloc.h"
#include "memtrace/event.h"

typedef struct mt__report_s mt__report_t;

typedef struct mt__report_cfg_s {
    unsigned timeline_steps;   /* samples in the timeline; 20 */
    uint64_t min_growth_bytes; /* rise needed to flag growth; 1 MiB */
    double min_r2;             /* goodness of fit needed to flag growth; 0.8 */
    unsigned top;              /* rows of never-freed groups kept; 10 */
    bool by_callsite;          /* add each process's "callsites" (report_callsite.c) */
    int by;                    /* callsites grouped by (mt_fr_by_e, analysis/frames.h); site */
    const struct mt_fr_rules_s *frames; /* which frames are the user's (borrowed); NULL:
                                         * the default rules */
    uint64_t temporary_window_us;       /* µs: a block freed this soon is temporary (model.h);
                                           MT_MODEL_TEMP_WINDOW_US; 0 = none tracked */
    bool general_reader; /* decode every line with jansson, never the event-line decoder
                          * (ndjson_fast.h): the benchmarks' and tests' baseline; false */
    bool stream;         /* keep no event: memory follows the model (live blocks, segments, sites),
                          * not the log; the replays (mt__report_replay, _map_at, _model, _trace,
                          * _flame_svg) then return MT_EINVAL. false */
    bool replay_only;    /* no analysis as events arrive, for readers that only replay them (plot,
                          * export): mt__report_result then returns NULL. false */
    const char *spill_dir; /* where the events kept for the replays go, 64 KiB at a time, in an
                            * unlinked file (event_spool.h), so that memory is a chunk per
                            * process; NULL keeps them in memory (borrowed). NULL */
} mt__report_cfg_t;

mt__report_cfg_t mt__report_cfg_default(void);
int mt__report_create(mt__report_t **out, const mt__report_cfg_t *cfg);
void mt__report_destroy(mt__report_t **r);
/* One log line (without or with its '\n'). Returns 0 (also for record types the
 * report does not use), MT_EPROTO with a message in err for a malformed line, or
 * MT_ENOMEM (the line is not counted). */
int mt__report_add_line(mt__report_t *r, const char *line, size_t len, char *err, size_t errlen);
/* An event line the event-line decoder already read (lines_pipe.h's MT_LINE_EVENT): counted
 * and kept as mt__report_add_line would keep that line. tag: its tag string (borrowed, not
 * NUL-terminated), NULL for none. 0 or MT_ENOMEM. */
int mt__report_add_decoded(mt__report_t *r, int pid, const mt_event_rec_t *ev, const char *tag,
                           size_t tag_len);
/* Whether event lines are to be decoded before mt__report_add_line (false when
 * cfg.general_reader asks for jansson alone). */
bool mt__report_decodes(const mt__report_t *r);
/* One record of process pid (ev borrowed), as a log line would give it; tag_name, when
 * not NULL, names ev's tag unless a label did already. For converters (snapshots) that
 * produce records, not lines. 0 or MT_ENOMEM. */
int mt__report_add_event(mt__report_t *r, int pid, const mt_event_rec_t *ev, const char *tag_name);
/* A record a converter adds that its input did not hold (a snapshot's stack ref): replayed
 * as mt__report_add_event's, not counted among the events read. 0 or MT_ENOMEM. */
int mt__report_add_ref(mt__report_t *r, int pid, const mt_event_rec_t *ev);
/* Names process pid (as a hello line would) and, when exit_state is 1 (clean) or 2
 * (unclean), says how it ended. 0 or MT_ENOMEM. */
int mt__report_set_process(mt__report_t *r, int pid, const char *name, int exit_state);
/* pid's event times are their order, not a clock's (a snapshot whose trace has no times,
 * which the converter numbers a nanosecond per event): its result says "clock":
 * "event_order", its times in seconds then count events (1e-9 each), and it has no
 * temporary allocations (lifetimes need a clock). 0 or MT_ENOMEM. */
int mt__report_set_untimed(mt__report_t *r, int pid);
/* pid was read from a PyTorch snapshot: its result says "source": "torch_snapshot", what is
 * live at its end was live when the snapshot was taken (not a leak); state_only: the file
 * had no trace, its events are the state as the allocations that would make it ("state_only":
 * true, no timeline or growth to read from their order); trace_ns (0: none): where its trace
 * began, blocks allocated before it having no known lifetime (mt__model_lifetimes_from);
 * skipped: its trace entries of actions the reader does not model ("skipped_entries").
 * 0 or MT_ENOMEM. */
int mt__report_set_snapshot(mt__report_t *r, int pid, bool state_only, uint64_t trace_ns,
                            size_t skipped);
/* Process i's events as the report counts them ("events"): without the records a converter
 * added or tag labels. 0 if there is no such process. */
size_t mt__report_events_read(const mt__report_t *r, size_t i);
/* Whether process i's times are its events' order (mt__report_set_untimed). */
bool mt__report_untimed(const mt__report_t *r, size_t i);
/* Whether process i is a snapshot's state alone (mt__report_set_snapshot's state_only). */
bool mt__report_state_only(const mt__report_t *r, size_t i);
/* The analysis of everything added so far. New reference, or NULL (no memory). */
json_t *mt__report_result(mt__report_t *r);
/* mt__report_result for a caller that wants nothing more of r but its process names and
 * counts (mt__report_process_count, mt__report_process) and its destruction: each process's
 * analysis is freed once its JSON is made, so that the analyses of a job's thousands of
 * ranks and their JSON do not add up. keep NULL: the same document as mt__report_result;
 * else a NULL-terminated list of member names, the only ones each process keeps (made, then
 * dropped as soon as its object is), and no "jobs" (made from whole processes). New
 * reference, or NULL (no memory). */
json_t *mt__report_result_final(mt__report_t *r, const char *const *keep);
/* mt__report_result_final(r, NULL) handed out process by process, so that no more than one
 * process's whole object is held at a time: each one goes to fn as soon as it is made (fn
 * may change it, and must not keep it: it is released after), and the document returned
 * holds of each one only its view for the jobs (mt__report_job_view), from which its "jobs"
 * are made as from the whole objects. A non-zero return of fn stops it. NULL: no memory, or
 * fn's failure. */
typedef int (*mt__report_proc_fn)(void *ctx, json_t *proc);
json_t *mt__report_result_stream(mt__report_t *r, mt__report_proc_fn fn, void *ctx);
/* The document's members before "processes" ({v, type, lines, events, malformed,
 * lost_unattributed, duplicates}), as the result has them. New reference, NULL without
 * memory. */
json_t *mt__report_result_head(const mt__report_t *r);

/* ---- replay for plots (`memtrace plot`) ----
 * The same model as the analysis (analysis/model.h), exposed event by event: the state after each
 * event of one process, and the segment map at one moment. Processes are numbered 0..count-1 in the
 * order the log first names them; their events are in log order. */
size_t mt__report_process_count(const mt__report_t *r);
/* pid, name ("" unknown) and number of replayed events of process i. MT_EINVAL: no such. */
int mt__report_process(const mt__report_t *r, size_t i, int *pid, const char **name,
                       size_t *events);
/* Tag t of process i as the report names it: the label from the log, the built-in name, or
 * "tagN" written into buf. */
const char *mt__report_tag_name(const mt__report_t *r, size_t i, int tag, char *buf, size_t len);

typedef struct mt__report_point_s {
    const mt_event_rec_t *ev;               /* the event just replayed (borrowed) */
    size_t index;                           /* its position among the process's events */
    uint64_t allocated, reserved;           /* device totals after it */
    uint64_t host_allocated, host_reserved; /* pinned host totals after it */
    const uint64_t *tag_live;               /* [MT_TAG_MAX] device bytes in use by tag (known) */
    uint32_t tag_mask;                      /* bit t: tag_live[t] may be nonzero; the rest are 0 */
    const mt_model_t *model;                /* the model after it (per-device figures) */
} mt__report_point_t;

/* Called after each event; a nonzero return stops the replay and is returned by it. */
typedef int (*mt__report_point_fn)(void *ctx, const mt__report_point_t *pt);
int mt__report_replay(const mt__report_t *r, size_t i, mt__report_point_fn fn, void *ctx);

/* Forgets the events kept of process i (its replays then see none, its count stays): a
 * reader that replays one process frees the others' before it does. */
void mt__report_drop_events(mt__report_t *r, size_t i);

/* fn on each event of process i (borrowed) and its index, in log order; a nonzero return
 * stops the walk and is returned by it. */
typedef int (*mt__report_event_fn)(void *ctx, const mt_event_rec_t *ev, size_t index);
/* The events alone, no model: for what depends on the events, not the state after them. */
int mt__report_each(const mt__report_t *r, size_t i, mt__report_event_fn fn, void *ctx);

/* Process i's device allocations (requested sizes) and frees as a trace for mt__replay_run
 * (analysis/replay.h): what memtrace's allocator would reserve for the same sequence. An
 * alloc at an address still open (its free lost) is left out. *out new (mt__trace_free).
 * 0, MT_EINVAL (no such process), MT_ENOMEM, MT_EOVERFLOW (more than 65535 streams). */
struct mt_trace_s;
int mt__report_trace(const mt__report_t *r, size_t i, struct mt_trace_s **out);

/* A segment map: segments and live blocks, each sorted by address (the model's). */
typedef mt_model_block_t mt__report_block_t;
typedef mt_model_map_t mt__report_map_t;

/* The segment map of process i right after its event number index: device memory, or the
 * pinned host memory (pool host) when host. Free with mt__report_map_free. */
int mt__report_map_at(const mt__report_t *r, size_t i, size_t index, bool host,
                      mt__report_map_t *out);
/* One replay for a conversion: fn after each event is applied to the model (an event the
 * model refuses stops it, as mt__report_replay), then *out the device segment map after the
 * last event, as mt__report_map_at(r, i, events - 1, false, out) gives it. */
int mt__report_replay_map(const mt__report_t *r, size_t i, mt__report_event_fn fn, void *ctx,
                          mt__report_map_t *out);
/* The same replay without fn, for a conversion fed on another thread (mt__report_each):
 * *out the device segment map after the last event. When it stops early, *stopped is the
 * index of the event it stopped at, and *refused whether the model refused that event
 * (else the events could not be read back before it); else *stopped is SIZE_MAX. */
int mt__report_map_end(const mt__report_t *r, size_t i, mt__report_map_t *out, size_t *stopped,
                       bool *refused);
/* The model of process i after all its events, with its stack table and module map
 * (keep_iterations on): for per-stack views (mt__model_stacks). *out is new. */
int mt__report_model(const mt__report_t *r, size_t i, mt_model_t **out);
void mt__report_map_free(mt__report_map_t *m);

/* The symbolizer holding the module maps of the log's processes (borrowed). */
mt_sym_t *mt__report_symbolizer(mt__report_t *r);

/* ---- call sites (report_callsite.c) ---- */

/* A process's "callsites" member: {"stacks", "by", "at_peak", "never_freed", "growth"}, the
 * first top rows of each (docs/telemetry.schema.json), grouped by cfg->by: each row's
 * "site" names its user frame (cfg->frames, analysis/frames.h) or its key, "user_frame" is
 * that frame's index and a frame the rules skip says why in "skipped". New reference, NULL
 * without memory. */
json_t *mt__report_callsites_json(const mt_model_t *m, mt_sym_t *s, uint32_t pid,
                                  const mt__report_cfg_t *cfg);

/* Names a row of mt__cs_rows_json as the "callsites" rows are named: its "site" by cfg->by,
 * "user_frame", "skipped" on the frames the rules skip; its key into key. 0 or MT_ENOMEM. */
int mt__report_name_row(json_t *row, const mt__report_cfg_t *cfg, char *key, size_t keylen);

/* ---- temporary allocations (report_temp.c) ---- */

/* Names one row of mt__model_temporary (a stack id or a tag) into key. 0 or MT_ENOMEM. */
typedef int (*mt__report_temp_key_fn)(void *ctx, const mt_model_temp_t *row, char *key,
                                      size_t keylen);
/* Rows (nb buckets each) with one key made one (counts, bytes, histograms add), sorted by
 * count then bytes, the first top as a JSON array of {site, count, bytes,
 * median_lifetime_us}. New reference, NULL without memory. */
json_t *mt__report_temp_group(const mt_model_temp_t *rows, size_t n, size_t nb,
                              mt__report_temp_key_fn key_fn, void *ctx, unsigned top);
/* The process's "temporary" member from m's device class: by tag (tag_key names a tag),
 * or by stack named as the "callsites" rows are (cfg->by, cfg->frames). The report adds
 * beside rows by stack the same by tag ("temporary_by_tag"), for a reader that shows tagged
 * input by tag: the CLI keeps one of them. */
json_t *mt__report_temporary_json(const mt_model_t *m, mt_sym_t *s, uint32_t pid,
                                  const mt__report_cfg_t *cfg, bool by_tag,
                                  mt__report_temp_key_fn tag_key, void *tag_ctx);

/* ---- settings changed at run time (report.c) ---- */

/* The process's "settings_changes" member from m (mt__model_settings): [{t (seconds from t0,
 * 0 before it), device, key (mt_setting_name), value, before}], oldest first. New reference;
 * NULL when there are none or without memory. */
json_t *mt__report_settings_json(const mt_model_t *m, uint64_t t0);

/* ---- ranks of a job (report_jobs.c) ---- */

/* The report's "jobs" member from its "processes" array (borrowed): the processes whose
 * hello named a rank, grouped by job id (those without one make one group without "job"),
 * each group {job, world_size, timeline_origin, ranks[{rank, local_rank, pid, name,
 * peak_allocated, peak_reserved, peak_iteration, outside_bytes (device memory outside the
 * allocator when the device's used bytes peaked, summed over the rank's devices; only when its
 * log has device figures), ooms}] by rank, highest{rank, pid, peak_allocated,
 * peak_reserved, above_median_bytes, median_rank, above_median_by_tag[{tag, bytes}]},
 * median_peak_allocated, spread_bytes, missing_ranks, aligned_by ("iteration" when every rank
 * marked iterations, else "first_event"), unmarked_ranks[], iterations[{iteration,
 * peaks[one per rank, null where that rank has no such span]}] for the newest iterations
 * all ranks share}. Empty when no process has a rank. New reference, NULL without memory. */
json_t *mt__report_jobs_json(const json_t *procs);
/* Of process p's report, what mt__report_jobs_json reads (borrowed from p, not copied): p's
 * members it reads, of "callsites" only "at_peak"; an empty object for a process without a
 * rank. Jobs made from these views are those made from the whole objects. New reference,
 * NULL without memory. */
json_t *mt__report_job_view(const json_t *p);

/* The process's "spans" member: {count, peak_iteration (the opening mark's number of the span
 * holding the device's peak; null when it came before the first mark), last[[iteration,
 * peak] of at most MT_REPORT_SPANS_KEPT spans, the newest, oldest first]}, as a new reference
 * in *out; *out NULL when nothing was marked. 0 or MT_ENOMEM. */
#define MT_REPORT_SPANS_KEPT 512
int mt__report_spans_json(const mt_model_t *m, json_t **out);

/* ---- device memory outside the allocator (report_outside.c) ---- */

/* What a replay keeps for the process's "device_memory" and "ooms" members: each device's
 * split of its used bytes (mt__model_outside) when used peaked, and the first OOMs with the
 * split at each. */
typedef struct mt__report_outside_s mt__report_outside_t;
int mt__report_outside_create(mt__report_outside_t **out);
void mt__report_outside_destroy(mt__report_outside_t **o);
/* After ev was applied to m. 0 or MT_ENOMEM. */
int mt__report_outside_step(mt__report_outside_t *o, const mt_model_t *m, const mt_event_rec_t *ev);
/* Adds to res "device_memory" ([{device, total, peak_used, end, at_peak_used, libraries}],
 * only when a device had a figure: old logs get none) and "ooms" ({count, first[{t (seconds
 * from t0), device, requested, free, device_memory}]}, only when there was one), with m the
 * model after the last event. 0 or MT_ENOMEM. */
int mt__report_outside_json(const mt__report_outside_t *o, const mt_model_t *m, uint64_t t0,
                            json_t *res);

/* ---- the gap (report_gap.c) ---- */

/* The gap of class cls of m now (analysis/gap.h's mt__gap_json), each pin named by its site
 * (cfg->by, cfg->frames) with its frames, the pins of one site joined and the first top
 * kept (SIZE_MAX: all, for a caller that names them again). New reference, NULL without
 * memory. */
json_t *mt__report_gap_json(const mt_model_t *m, int cls, mt_sym_t *s, uint32_t pid,
                            const mt__report_cfg_t *cfg, size_t top);
/* The same of a gap taken earlier (g borrowed), its pins named from m (a model holding at
 * least the stacks g names, e.g. the same process's model later on). */
struct mt_gap_s;
json_t *mt__report_gap_named(const struct mt_gap_s *g, const mt_model_t *m, mt_sym_t *s,
                             uint32_t pid, const mt__report_cfg_t *cfg, size_t top);

/* The flame graph of process pid (<= 0: the one with the most events) by which
 * (MT_CS_PEAK or MT_CS_LEAKED, callsite.h). snap(ud, pid): the snapshot whose events process
 * pid is, whose frames then name its stacks (mt__ts_flame_add); NULL or returning NULL: the
 * process's own stack table. MT_ENOENT (no such process), MT_EIO, MT_ENOMEM, each with a
 * message in err. */
struct mt_ts_s;
typedef const struct mt_ts_s *(*mt__report_snap_fn)(void *ud, int pid);
int mt__report_flame_svg(mt__report_t *r, int pid, int which, mt__report_snap_fn snap, void *ud,
                         FILE *out, char *err, size_t errlen);

#endif
