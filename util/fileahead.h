/* Disk blocks reserved ahead of an appending log writer.
 *
 * ext4 allocates a file's blocks as buffered writes dirty its pages, page by page (delayed
 * allocation: a reservation and an extent-status entry per page), which costs a log that
 * writes gigabytes about as much as the copy into the page cache. Reserving them ahead
 * (fallocate with FALLOC_FL_KEEP_SIZE: the size, and so what readers see, does not change)
 * makes a write into them little more than the copy: 38 -> 22 ns per 240-byte line here
 * (docs/telemetry.md, "Record and drain rates").
 *
 * What is reserved past the end stays allocated when the writer stops: `du` counts it, the
 * size does not. It is never cut off at close, since another process may be appending to
 * the same log (a truncation to the size we saw would cut its lines); it is kept small
 * instead: nothing while the file is under MT__FA_MIN, then an eighth of the size ahead,
 * at most MT__FA_STEP. Where the file system has no fallocate, or it fails (a full disk),
 * the writer goes on as before: this is only speed. */
#ifndef MT_UTIL_FILEAHEAD_H
#define MT_UTIL_FILEAHEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT__FA_MIN  ((uint64_t)8 << 20)
#define MT__FA_STEP ((uint64_t)8 << 20)

/* Invariant: off, or end = 0, or end is the reserved end of file (dev, ino). */
typedef struct mt__fa_s {
    uint64_t dev, ino; /* the file reserved in */
    uint64_t end;      /* bytes reserved from 0 (0: none yet) */
    bool off;          /* fallocate failed: no more tries in this file */
} mt__fa_t;

/* Before len bytes are appended to fd: if it is a regular file of at least MT__FA_MIN
 * bytes (with them), its blocks reserved past size + len. Another file at fd than last
 * time starts over. */
void mt__fa_ahead(mt__fa_t *fa, int fd, size_t len);

#endif
