/* The binary log: the local log's compact form, the same events as its NDJSON in 1/14 to
 * 1/23 of the bytes (docs/telemetry.md, "The binary log"). The file is a sequence of
 * blocks, each one write of one process, self-contained: its events' deltas and its tags'
 * names start afresh with it, so blocks of processes sharing a file may interleave and a
 * damaged block costs only itself. Every line of the NDJSON log has one record: an event
 * (its mt_event_rec_t and stack id, delta- and varint-coded), or a JSON line kept as text
 * (hello, exit, stack and module tables); a name record before the first event of a block
 * that shows a tag gives the name the NDJSON line would carry. So the NDJSON log is made
 * back from it byte for byte, by the one encoder (encode.c).
 *
 * A block: MT__BLOG_MAGIC, u16 version, u16 flags (0), u32 payload bytes, i32 pid, u32
 * records (all little-endian), then the payload's records:
 *   0x80|f, kind, fields  an event; f: MT__BLOG_F_* (what the fields leave out)
 *   'J', u32 n, n bytes   a JSON line, without its newline
 *   'N', tag, u32 n, n    the name tag's events carry from here on; n = 0: none given
 *                         (the built-in name or "tag<n>") */
#ifndef MT_PROFILER_BINLOG_H
#define MT_PROFILER_BINLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/event.h"

#define MT__BLOG_MAGIC      "\x89MTLOG\r\n" /* 8 bytes: 0x89 and CR LF catch text-mode copies */
#define MT__BLOG_MAGIC_LEN  8
#define MT__BLOG_HDR        24
#define MT__BLOG_VERSION    1
#define MT__BLOG_BLOCK_MAX  (16u << 20) /* payload bytes a reader takes in one block */
#define MT__BLOG_EVENT_MAX  96          /* bytes of one event record at most (2 + 9 x 10 + 3 + 1) */
#define MT__BLOG_TEXT_EXTRA 6           /* bytes of a 'J' or 'N' record besides its text */

enum {
    MT__BLOG_F_SEQ = 0x01,    /* seq = the block's previous event's + 1 (else zigzag delta) */
    MT__BLOG_F_REQ = 0x02,    /* requested = size (else a varint) */
    MT__BLOG_F_META = 0x04,   /* stream, pool, tag, device as the previous event's */
    MT__BLOG_F_STACK = 0x08,  /* a varint stack id follows (else 0) */
    MT__BLOG_F_TOTALS = 0x10, /* allocated and reserved as the previous event's */
};

/* The delta state of one block, the writer's or the reader's: the block's previous event
 * (zero at its start). Names: bit t of named set => a name record for tag t came earlier
 * in this block. */
typedef struct mt__blog_state_s {
    uint64_t seq, time_ns, addr, allocated, reserved;
    uint32_t stream;
    uint8_t pool, tag, device;
    uint32_t named;
} mt__blog_state_t;

/* Whether a line of this kind carries its tag's name (so a block names the tag first). */
bool mt__blog_kind_named(int kind);

/* ---- writing ---- */

/* The header of a block of payload bytes and records of process pid, into hdr. */
void mt__blog_header(char hdr[MT__BLOG_HDR], uint32_t payload, int32_t pid, uint32_t records);
/* An event record at w (MT__BLOG_EVENT_MAX bytes of room); its bytes. Updates st. */
size_t mt__blog_put_event(mt__blog_state_t *st, char *w, const mt_event_rec_t *ev, uint32_t stack);
/* A 'J' or 'N' record of text[0..n) at w (n + MT__BLOG_TEXT_EXTRA bytes of room); its
 * bytes. A name record sets tag's bit in st->named. */
size_t mt__blog_put_line(char *w, const char *text, uint32_t n);
/* A 'J' record's head alone (its text to follow: n bytes); its bytes, 5. */
size_t mt__blog_put_line_head(char *w, uint32_t n);
size_t mt__blog_put_name(mt__blog_state_t *st, char *w, int tag, const char *text, uint32_t n);

/* ---- reading ---- */

enum { MT__BLOG_EVENT = 1, MT__BLOG_LINE = 2, MT__BLOG_NAME = 3 };

typedef struct mt__blog_rec_s {
    int type; /* MT__BLOG_EVENT, _LINE or _NAME */
    mt_event_rec_t ev;
    uint32_t stack;
    int tag;          /* a name's */
    const char *text; /* a line's or name's bytes, borrowed from the payload */
    uint32_t len;
} mt__blog_rec_t;

/* Reads a block header: 0 and the fields, or MT_EPROTO with why in *err (a static
 * string): not the magic, a version this reader does not know, a payload over
 * MT__BLOG_BLOCK_MAX. */
int mt__blog_header_read(const void *hdr, uint32_t *payload, int32_t *pid, uint32_t *records,
                         const char **err);
/* The record at *p (p < end) into *r, *p moved past it: 0, or MT_EPROTO with why in *err,
 * *p left where it was. Never reads at or past end. */
int mt__blog_next(mt__blog_state_t *st, const unsigned char **p, const unsigned char *end,
                  mt__blog_rec_t *r, const char **err);

#endif
