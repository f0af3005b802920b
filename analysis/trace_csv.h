/* Allocation traces in RMM's logging CSV (the interchange format of design.md §1).
 *
 * The file starts with the exact header `Thread,Time,Action,Pointer,Size,Stream`; each row
 * is one event, e.g. `2342727,15:47:02.841961,allocate,0x10012400000,1048576,0`:
 *   Thread  decimal thread id
 *   Time    HH:MM:SS.micro (six digits of microseconds)
 *   Action  `allocate`, `free` or `allocate failure`
 *   Pointer %p-style hex with 0x (0x0 for a failed allocation)
 *   Size    decimal bytes
 *   Stream  hex without 0x, 0 = the default stream
 *
 * Two layers:
 * - mt_trace_reader_*: a streaming reader that checks the syntax of one row at a time and
 *   never holds more than one line in memory.
 * - mt__trace_load: reads a whole file through the reader, checks its meaning (a free must
 *   name a live pointer, an allocate must not reuse one, sizes must match) and produces a
 *   compact operation list in which pointers became slot numbers, so a replay runs with no
 *   parsing or hashing in its timed loop.
 *
 * Every error message names the file, the line and, for a bad field, the field:
 *   trace.csv:17: field 'Size': not a decimal number: "12a"
 * Not thread-safe: one reader or trace per thread. */
#ifndef MT_ANALYSIS_TRACE_CSV_H
#define MT_ANALYSIS_TRACE_CSV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The one header line the format allows (without its line ending). */
#define MT_TRACE_HEADER "Thread,Time,Action,Pointer,Size,Stream"
/* Longest accepted line, bytes, without its line ending. A valid row is under 120
 * bytes; the limit only exists so that a binary or corrupt file cannot grow a buffer. */
#define MT_TRACE_MAX_LINE 1024
/* Room for an error message: the name of the file, the line, the field and an excerpt. */
#define MT_TRACE_ERR_LEN 512

/* True when a file's first line (text, len bytes) starts with MT_TRACE_HEADER: an RMM log,
 * for the commands that read memtrace's logs and must name one given to them instead (they
 * look at the line they read, so a pipe or a compressed file is read once). */
bool mt__trace_is_header(const char *text, size_t len);

typedef enum mt_trace_action_e {
    MT_TRACE_ALLOCATE = 0,
    MT_TRACE_FREE = 1,
    MT_TRACE_ALLOCATE_FAILURE = 2,
} mt_trace_action_e;

/* One row, as written in the file. */
typedef struct mt_trace_row_s {
    uint64_t line;    /* 1-based line number in the file; the header is line 1 */
    uint64_t thread;  /* Thread column */
    uint64_t time_us; /* Time column, microseconds since 00:00:00.000000 (or the epoch) */
    int action;       /* mt_trace_action_e */
    uint64_t ptr;     /* Pointer column */
    uint64_t size;    /* Size column, bytes */
    uint64_t stream;  /* Stream column, 0 = default stream */
} mt_trace_row_t;

typedef struct mt_trace_reader_s mt_trace_reader_t;

/* Opens path for reading ("-": standard input, not closed) and checks the header. A file
 * compressed with xz, gzip or zstd (zsource.h) is read through its decompression. *out is
 * new; close it with mt__trace_reader_close. Returns MT_ENOENT if the file cannot be opened
 * and MT_EPROTO for a missing or wrong header or bad compressed data; the message is then in
 * err (if err != NULL). */
int mt__trace_reader_open(mt_trace_reader_t **out, const char *path, char *err, size_t errlen);
/* Like mt__trace_reader_open on an open stream. f is borrowed (not closed); name is copied
 * and only used in messages. */
int mt__trace_reader_from_file(mt_trace_reader_t **out, FILE *f, const char *name, char *err,
                               size_t errlen);
/* Reads the next row into *row. Returns 1 for a row, 0 at the end of the file, MT_EPROTO for
 * a malformed row and MT_EIO for a read error; after an error every later call returns the
 * same error. The message is in mt__trace_reader_error(). */
int mt__trace_reader_next(mt_trace_reader_t *r, mt_trace_row_t *row);
/* The last error message, "" if none. Borrowed; valid until the reader is closed. */
const char *mt__trace_reader_error(const mt_trace_reader_t *r);
/* The name used in messages. Borrowed. */
const char *mt__trace_reader_name(const mt_trace_reader_t *r);
/* Closes the file if the reader opened it and frees the reader. Sets *p = NULL. */
void mt__trace_reader_close(mt_trace_reader_t **p);

/* ---- whole traces ---- */

/* One operation of a loaded trace. A slot is one allocation's lifetime: the allocate that
 * opens it and the free that closes it carry the same slot, numbered 0, 1, ... in order of
 * the allocates. */
typedef struct mt_trace_op_s {
    uint64_t size;   /* bytes (of the allocation, on a free too) */
    uint32_t slot;   /* < nslots */
    uint16_t stream; /* index into mt_trace_t.streams */
    uint8_t action;  /* MT_TRACE_ALLOCATE or MT_TRACE_FREE */
    uint8_t pad;
} mt_trace_op_t;

/* A loaded trace. Invariants: every free's slot was opened by an earlier allocate and is
 * closed once; ops contains no allocate failures (they are only counted); nstreams >= 1
 * when nops > 0 and streams[] holds distinct values in order of first use. */
typedef struct mt_trace_s {
    mt_trace_op_t *ops;       /* nops */
    size_t nops;              /* allocates + frees */
    size_t nallocs;           /* allocate rows (= slots) */
    size_t nfrees;            /* free rows */
    size_t nfailures;         /* `allocate failure` rows, skipped */
    size_t nrows;             /* data rows (events), header excluded */
    size_t nslots;            /* = nallocs */
    size_t nstreams;          /* distinct streams used by ops */
    uint64_t *streams;        /* nstreams Stream values, in order of first use */
    uint64_t peak_live_bytes; /* highest sum of live allocation sizes, as requested
                               * (saturates at UINT64_MAX) */
    size_t peak_live_count;   /* highest number of live allocations */
    size_t leaked;            /* allocations never freed by the end of the trace */
} mt_trace_t;

/* Reads and checks the trace at path. *out is new; free it with mt__trace_free. Returns
 * MT_ENOENT, MT_EPROTO (malformed file, message names line and field), MT_EIO or MT_ENOMEM;
 * the message is in err. Semantic errors: a free of a pointer that is not live (never
 * allocated, or already freed), an allocate of a pointer that is still live, a free whose
 * size differs from its allocate's, a zero Pointer on allocate or free. */
int mt__trace_load(mt_trace_t **out, const char *path, char *err, size_t errlen);
/* The same from an open stream (borrowed); name is used in messages. */
int mt__trace_load_file(mt_trace_t **out, FILE *f, const char *name, char *err, size_t errlen);
void mt__trace_free(mt_trace_t **p);
/* The index of stream in t's streams, appended if new (*cap: the streams array's capacity,
 * 0 at first): 0, MT_EOVERFLOW past UINT16_MAX streams, or MT_ENOMEM. */
int mt__trace_stream_index(mt_trace_t *t, size_t *cap, uint64_t stream, uint16_t *out);

/* Static name of an action as written in the file. */
const char *mt__trace_action_name(int action);

#endif
