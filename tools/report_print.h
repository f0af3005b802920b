/* The printers of `memtrace report` (report_print.c), for cmd_report.c: the report's text,
 * and the shaping of the analysis that its text and its JSON both go through. */
#ifndef MT_TOOLS_REPORT_PRINT_H
#define MT_TOOLS_REPORT_PRINT_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "analysis/report.h"

/* How call sites are printed (options of this run). */
typedef struct mt__report_print_opts_s {
    int by;           /* mt_fr_by_e */
    bool explicit_by; /* --by given */
    bool all;         /* --frames all: every frame under each site */
    bool stacks;      /* --stacks: every kept frame under each site */
    bool replay;      /* --replay: memtrace's allocator on the same sequence */
} mt__report_print_opts_t;

/* Untagged input: the sections by tag would say "other" for every byte. They are dropped
 * from res (text and JSON; "tagged": false says why) unless --by tag asks for them; the call
 * sites stand in for them. A tagged process run without --by keeps its report as it was.
 * res is borrowed and changed in place. 0, or MT_ENOMEM if "tagged" could not be added (the
 * report must not go out without it). */
int mt__report_print_fit(json_t *res, const mt__report_print_opts_t *o);
/* The same for one process p of res (res's "snapshots" read, its processes not), for a
 * report printed as its processes are made. */
int mt__report_print_fit_process(const json_t *res, json_t *p, const mt__report_print_opts_t *o);

/* The report res (borrowed, once fitted) as text on stdout: the line that names the logs,
 * with bad malformed lines, then each job and each process. */
void mt__report_print_text(json_t *res, const mt__report_print_opts_t *o, char *const *logs,
                           int nlogs, unsigned long bad);
/* mt__report_print_text in parts, for a report printed as its processes are made: the line
 * that names the logs (nprocs processes) and the jobs, on stdout; one process's text (its
 * blank line first) on out. */
void mt__report_print_head(json_t *res, size_t nprocs, const mt__report_print_opts_t *o,
                           char *const *logs, int nlogs, unsigned long bad);
void mt__report_print_process(FILE *out, json_t *p, const mt__report_print_opts_t *o);

/* report_stream.c: the report of r (streamed: no event kept, no snapshot input), fitted and
 * printed as text or as JSON (JSON_INDENT(2), then a newline), the same bytes as
 * mt__report_result, mt__report_print_fit and the printers above give, with one process's
 * object held at a time (mt__report_result_stream). r's analyses are freed; r can then only
 * be destroyed. Returns 0, or 1 after saying why on stderr (out of memory, a write error:
 * what was printed before stays). */
int mt__report_print_streamed(mt__report_t *r, const mt__report_print_opts_t *pr, bool as_json,
                              char *const *logs, int nlogs, unsigned long bad);

#endif
