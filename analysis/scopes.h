/* Scoped statistics read back from a log: the named marks "name" ... "/name" that
 * mt_alloc_stats_push / mt_alloc_stats_pop (RMM's push_statistics / pop_statistics) put in
 * the stream, each scope's peak of allocated bytes above its start, totalled per name. */
#ifndef MT_ANALYSIS_SCOPES_H
#define MT_ANALYSIS_SCOPES_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/event.h"

#define MT_SCOPES_OPEN_MAX  64   /* scopes open at once; an older one is dropped past it */
#define MT_SCOPES_NAMES_MAX 1024 /* distinct names kept; later ones are counted only */

typedef struct mt_scope_row_s {
    char name[MT_EVENT_LABEL_MAX + 1];
    uint64_t count;    /* scopes of this name closed */
    uint64_t peak_max; /* the highest (peak - start) bytes among them */
    uint64_t peak_sum; /* their (peak - start) summed, for the mean */
    uint64_t ns_sum;   /* their durations summed */
} mt_scope_row_t;

typedef struct mt_scope_open_s {
    char name[MT_EVENT_LABEL_MAX + 1];
    uint64_t start, peak, t;
} mt_scope_open_t;

/* Invariants: nopen <= capopen <= MT_SCOPES_OPEN_MAX (open NULL while capopen = 0: a process
 * without named marks, most of a job's ranks, pays nothing); each open scope's peak >= its
 * start; nrows <= MT_SCOPES_NAMES_MAX. An open scope's peak covers the events up to the next
 * scope opened above it; that one's is merged into it when it closes (scopes nest). */
typedef struct mt_scopes_s {
    mt_scope_open_t *open; /* the scopes open, innermost last */
    size_t nopen, capopen;
    mt_scope_row_t *rows;
    size_t nrows, cap;
    uint64_t unmatched; /* "/name" with no open "name" */
    uint64_t dropped;   /* scopes dropped: too many open, or names past the limit */
} mt_scopes_t;

void mt__scopes_init(mt_scopes_t *s);
void mt__scopes_fini(mt_scopes_t *s);
/* Feeds one event, with the device's allocated bytes after it. MT_ENOMEM. */
int mt__scopes_event(mt_scopes_t *s, const mt_event_rec_t *ev, uint64_t allocated);
/* The closed scopes per name, as the report's "scopes" and the page's /analysis give them:
 * [{name, count, peak_bytes (the highest), mean_peak_bytes, mean_seconds}]. New reference;
 * NULL when none closed (s may be NULL) or without memory. */
json_t *mt__scopes_json(const mt_scopes_t *s);

#endif
