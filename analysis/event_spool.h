/* The events a report keeps for its replays (plot, export, the flame graph, report
 * --replay), in log order, with memory bounded by a chunk per process instead of 64 bytes an
 * event: full chunks of MT__SPOOL_CHUNK events go to a temporary file that every process of
 * one report shares, and only the newest chunk stays in memory. Replays read the chunks back
 * one at a time into a buffer of their own (pread: the file's pages are the kernel's cache,
 * never mapped into the process). Without a file (fd < 0: none asked for, or none could be
 * made) the chunk in memory grows instead and holds every event, as an array did before.
 * docs/readers.md, "Memory". */
#ifndef MT_ANALYSIS_EVENT_SPOOL_H
#define MT_ANALYSIS_EVENT_SPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/event.h"

#define MT__SPOOL_CHUNK 1024 /* events of one chunk in the file (64 KiB) */

/* The file the chunks go to, shared by the spools of one report.
 * Invariant: end is the file's size, a multiple of MT__SPOOL_CHUNK events; fd < 0: no file. */
typedef struct mt__spool_file_s {
    int fd;                /* an unlinked temporary file, or -1 */
    uint64_t end;          /* bytes written */
    mt_event_rec_t *cache; /* the chunk mt__spool_find read last (NULL: none yet) */
    uint64_t cache_off;    /* bytes, its offset in the file (chunks never change once written) */
} mt__spool_file_t;

/* One process's events.
 * Invariants: the events [0, nchunks * MT__SPOOL_CHUNK) are in the file at off[c] for chunk
 * c, the rest [nchunks * MT__SPOOL_CHUNK, n) in tail[0, n - nchunks * MT__SPOOL_CHUNK);
 * nchunks > 0 only with a file. */
typedef struct mt__spool_s {
    mt_event_rec_t *tail; /* the newest events, NULL before the first */
    size_t tail_cap;      /* events tail holds */
    uint64_t *off;        /* bytes, file offset of each full chunk */
    uint64_t *seq0;       /* the seq of each full chunk's first event (cap_off of them) */
    size_t nchunks, cap_off;
    size_t n; /* events in all */
} mt__spool_t;

/* Opens an unlinked temporary file in dir (NULL: none; the spools then keep everything in
 * memory). Never fails: without a file, memory it is. */
void mt__spool_file_open(mt__spool_file_t *f, const char *dir);
void mt__spool_file_close(mt__spool_file_t *f);

/* Appends a copy of ev. 0 or MT_ENOMEM (a chunk the file cannot take stays in memory). */
int mt__spool_push(mt__spool_t *s, mt__spool_file_t *f, const mt_event_rec_t *ev);
/* Event k (< s->n) into *out. 0 or MT_EIO. */
int mt__spool_get(const mt__spool_t *s, const mt__spool_file_t *f, size_t k, mt_event_rec_t *out);
/* Whether a record identical to ev is among s's events, which must be in strictly increasing
 * seq order: found by its seq, reading one chunk at most (the one read last is kept in f, so
 * that a run of events read twice costs one read per chunk). 0 or MT_EIO / MT_ENOMEM (then
 * *found is false). */
int mt__spool_find(const mt__spool_t *s, mt__spool_file_t *f, const mt_event_rec_t *ev,
                   bool *found);
/* The events of chunk c (0 <= c <= s->nchunks; the last is the tail, maybe empty): *evs
 * points into buf (MT__SPOOL_CHUNK events, the caller's) or into the spool's tail, valid
 * until the next call or push; *n of them. 0 or MT_EIO. */
int mt__spool_chunk(const mt__spool_t *s, const mt__spool_file_t *f, size_t c, mt_event_rec_t *buf,
                    const mt_event_rec_t **evs, size_t *n);
void mt__spool_free(mt__spool_t *s);

#endif
