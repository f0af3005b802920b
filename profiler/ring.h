/* The per-process event ring in POSIX shared memory.
 *
 * A producer process (the instrumented program) creates one ring with
 * shm_open("/memtrace.<uid>.<pid>.<n>", O_CREAT|O_EXCL|O_RDWR, 0600), and writes
 * events into it without ever blocking or allocating. Exactly one consumer reads
 * it: the daemon (which maps it by name, then unlinks the name so the mapping
 * outlives the producer), or the producer's own local drainer thread when no
 * daemon is reachable.
 *
 * Memory layout (all offsets fixed, little-endian host order, version 1):
 *
 *   [0, MT_RING_HEADER_SIZE)          mt__ring_hdr_t (identity, flags, counters)
 *   [commit_off, commit_off + 8*S)    _Atomic uint64_t commit[S]  (per-slot word)
 *   [recs_off, recs_off + 64*S)       mt_event_rec_t recs[S]
 *
 * with S = slots (a power of two), commit_off = MT_RING_HEADER_SIZE and
 * recs_off = commit_off + round_up(8*S, 64). mt__ring_map_size() gives the total.
 *
 * Protocol (a bounded multi-producer single-consumer queue, Vyukov-style commit words):
 * - The producer claims positions c..c+n-1 for the n events of one operation (claim:
 *   c -> c+n, by CAS, the only atomic read-modify-write, shared by the n events) only
 *   if c + n - read_idx <= S; otherwise it claims them one by one, and each event that
 *   finds the ring full is dropped and dropped++ is counted.
 * - The event at position c+i has seq c + i + the value of dropped read just before the
 *   claim: every event, dropped or not, has a number, and the consumer sees drops as
 *   holes.
 * - It writes recs[p % S] (with .seq = seq) and publishes with a release store of
 *   commit[p % S] = p + 1, for each of its positions p in order.
 * - The consumer at position p waits for commit[p % S] == p + 1 (acquire), copies the
 *   record, re-checks the commit word (a slot overwritten while being copied is
 *   counted lost, not delivered torn), then stores read_idx = p + 1 (release).
 * - A thread cache's batch of nev events (util/evbatch.h) takes nev positions with one
 *   claim, as push_n does, but fills only the first k = mt__evb_slots(nent) <= nev slots:
 *   its header (kind MT__EVB_KIND, .seq = the seq of its first event) at c, its entries two
 *   per slot at c+1..c+k-1, and publishes commit[c % S] alone. The slots and commit words
 *   of c+k..c+nev-1 are not touched. The consumer reads the header, copies the entries,
 *   delivers the nev events it expands them to (seqs seq..seq+nev-1) and moves on by nev.
 * - A slot claimed but never published (its producer was killed mid-write) is skipped
 *   and counted in lost once the producer is known dead (mt__ring_mark_dead, or its
 *   pid no longer exists), has exited (MT_RING_F_EXITED, acquire) or the slot stayed
 *   unpublished for stuck_timeout_ns; its commit word is read again after that is known,
 *   so a record published just before the exit or death is delivered, not skipped.
 *
 * Invariants: read_idx <= claim; claim - read_idx <= S; events emitted = claim + dropped;
 *   commit[i] is 0 (never written) or p + 1 for the last published p with p % S == i;
 *   seqs strictly increase with the position, also with concurrent producer threads
 *   (a claimer reads claim with acquire after its predecessor's acq_rel CAS, hence reads
 *   dropped no earlier than the predecessor did); the holes add up to the drops. */
#ifndef MT_PROFILER_RING_H
#define MT_PROFILER_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "memtrace/common.h"
#include "memtrace/event.h"
#include "util/evbatch.h"

#define MT_RING_MAGIC         UINT64_C(0x31474e4952544d00) /* "\0MTRING1" little-endian */
#define MT_RING_VERSION       1u   /* the area (2 header words once padding) is additive */
#define MT_RING_HEADER_SIZE   512u /* bytes; the header struct is padded to this */
#define MT_RING_NAME_MAX      64   /* bytes of the shm name, NUL included */
#define MT_RING_COMM_MAX      64   /* bytes of the process name, NUL included */
#define MT_RING_MIN_SLOTS     8u
#define MT_RING_MAX_SLOTS     (1u << 24) /* 1 GiB of records */
#define MT_RING_DEFAULT_SLOTS (1u << 16)

/* flags (header word, set with atomic OR) */
enum {
    MT_RING_F_EXITED = 1u << 0,   /* producer shut down cleanly (mt_prof_destroy) */
    MT_RING_F_OOM = 1u << 1,      /* an MT_EV_OOM event was emitted */
    MT_RING_F_ATTACHED = 1u << 2, /* a daemon consumer has mapped the ring */
};

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared-memory atomics must be lock-free");
_Static_assert(sizeof(unsigned long long) == 8, "64-bit counters");

/* The shared header. Fields in the identity block are written once by the producer
 * before the ring's name is given to anyone, and never change. Each atomic group sits
 * on its own cache line so the producer's claims and the consumer's reads do not
 * false-share. */
typedef struct mt__ring_hdr_s {
    /* ---- identity (cache lines 0-1), immutable ---- */
    uint64_t magic;              /* MT_RING_MAGIC */
    uint32_t version;            /* MT_RING_VERSION */
    uint32_t header_size;        /* MT_RING_HEADER_SIZE; records start after it */
    uint32_t slots;              /* S, a power of two in [MIN_SLOTS, MAX_SLOTS] */
    uint32_t rec_size;           /* sizeof(mt_event_rec_t) = 64 */
    int32_t pid;                 /* producer pid */
    uint32_t uid;                /* producer uid */
    uint64_t start_realtime_ns;  /* CLOCK_REALTIME at creation, ns since the epoch */
    uint64_t start_mono_ns;      /* CLOCK_MONOTONIC at creation (events use this clock) */
    char comm[MT_RING_COMM_MAX]; /* process name, NUL-terminated */
    uint64_t area_off;           /* the stack table's area (profiler/stack.h): file offset, */
    uint64_t area_size;          /* page-aligned after the records; 0 bytes = none */
    /* ---- cache line 2: flags ---- */
    _Alignas(64) _Atomic uint32_t flags; /* MT_RING_F_* */
    /* ---- cache line 3: producer counters ---- */
    _Alignas(64) _Atomic uint64_t
        seq_unused;         /* 0; kept for the layout (emitted = claim + dropped) */
    _Atomic uint64_t claim; /* positions claimed (written or being written) */
    /* ---- cache line 4: drops (touched only when full) ---- */
    _Alignas(64) _Atomic uint64_t dropped; /* events dropped because the ring was full */
    /* ---- cache line 5: consumer, written only by the consumer ---- */
    _Alignas(64) _Atomic uint64_t read_idx; /* positions consumed (delivered or skipped) */
    _Atomic uint64_t lost;                  /* positions skipped: never published or torn */
    _Atomic uint64_t delivered;             /* records handed to the consumer's callback */
    uint8_t pad1[MT_RING_HEADER_SIZE - 320 - 3 * 8];
} mt__ring_hdr_t;

_Static_assert(sizeof(mt__ring_hdr_t) == MT_RING_HEADER_SIZE, "fixed header size");
_Static_assert(offsetof(mt__ring_hdr_t, comm) == 48, "fixed layout");
_Static_assert(offsetof(mt__ring_hdr_t, flags) == 128, "fixed layout");
_Static_assert(offsetof(mt__ring_hdr_t, area_off) == 112, "fixed layout");
_Static_assert(offsetof(mt__ring_hdr_t, seq_unused) == 192, "fixed layout");
_Static_assert(offsetof(mt__ring_hdr_t, claim) == 200, "fixed layout");
_Static_assert(offsetof(mt__ring_hdr_t, dropped) == 256, "fixed layout");
_Static_assert(offsetof(mt__ring_hdr_t, read_idx) == 320, "fixed layout");

/* A mapping of a ring, local to one process (never in shared memory). */
typedef struct mt__ring_s mt__ring_t;

/* Called by mt__ring_drain for each record, in ring order. ev is borrowed for the
 * call. A gap (events dropped or lost before this point) is delivered as a record
 * of kind MT_EV_GAP with size = number of events lost, seq = the first missing seq
 * as far as the consumer knows, time_ns = when the consumer noticed. */
typedef void (*mt__ring_cb)(void *ud, const mt_event_rec_t *ev);

typedef struct mt__ring_stats_s {
    uint64_t emitted;   /* claimed + dropped: events offered by the producer */
    uint64_t claimed;   /* positions claimed */
    uint64_t read;      /* read_idx */
    uint64_t dropped;   /* full-ring drops (producer side) */
    uint64_t lost;      /* skipped unpublished/torn slots (consumer side) */
    uint64_t delivered; /* records delivered to drain callbacks (gaps excluded) */
    uint32_t flags;     /* MT_RING_F_* */
    uint32_t slots;
} mt__ring_stats_t;

/* Total bytes of a ring with slots slots. */
size_t mt__ring_map_size(uint32_t slots);

/* Producer: creates and maps a new ring named "/memtrace.<uid>.<pid>.<32 random hex>",
 * exclusively, mode 0600 (a few draws if a name is taken). slots is rounded up to a power
 * of two within [MT_RING_MIN_SLOTS, MT_RING_MAX_SLOTS]; comm is copied (truncated). *out
 * is new. MT_EFBIG, with nothing made, when the file would pass RLIMIT_FSIZE; every
 * failure removes what it made. */
int mt__ring_create(mt__ring_t **out, uint32_t slots, const char *comm);
/* The same ring without a name (a memfd): for the local log only, when no named ring can
 * be made. mt__ring_name() is "". */
int mt__ring_create_private(mt__ring_t **out, uint32_t slots, const char *comm);
/* Either, with an area of area_size bytes (rounded up to pages, at most MT_RING_AREA_MAX)
 * after the records, mapped apart and not populated: the stack table (profiler/stack.h),
 * which the consumer maps read-only. */
#define MT_RING_AREA_MAX ((size_t)256 << 20)
int mt__ring_create_ex(mt__ring_t **out, uint32_t slots, const char *comm, bool private,
                       size_t area_size);
/* Bytes of the file a ring of slots slots and an area of area_size bytes takes (both
 * rounded as create rounds them). */
size_t mt__ring_file_size(uint32_t slots, size_t area_size);
/* The soft RLIMIT_FSIZE in bytes; UINT64_MAX when there is none. Create fails with
 * MT_EFBIG, making nothing, when the ring's file would be larger. */
uint64_t mt__ring_fsize_limit(void);
/* Shrinks *slots and *area_size (rounded as create rounds them) until the file fits limit
 * bytes: fewer slots first while at least 1024 remain beside the area, then no area and
 * fewer slots. 0 (values unchanged but rounded when they fit), MT_EFBIG if even
 * MT_RING_MIN_SLOTS without an area do not fit. */
int mt__ring_fit(uint64_t limit, uint32_t *slots, size_t *area_size);
/* The area: writable for the producer, read-only for a consumer; NULL and 0 when none. */
void *mt__ring_area(const mt__ring_t *r, size_t *size);
/* Consumer: maps an existing ring read/write after validating its header (magic,
 * version, sizes, file size). name must be "/memtrace.<...>" without further '/'.
 * MT_ENOENT if missing, MT_EPROTO if not a valid ring. *out is new. */
int mt__ring_open(mt__ring_t **out, const char *name);
/* Removes the ring's name (the mapping stays valid). Idempotent: 0 if already gone. */
int mt__ring_unlink(mt__ring_t *r);
/* Unmaps; a producer that still owns the name unlinks it. Sets *r = NULL. */
void mt__ring_close(mt__ring_t **r);

const char *mt__ring_name(const mt__ring_t *r);             /* borrowed */
const mt__ring_hdr_t *mt__ring_header(const mt__ring_t *r); /* borrowed, shared */
uint32_t mt__ring_owner_uid(const mt__ring_t *r);           /* st_uid of the shm object */
/* Consumer: whether a page of the mapping faulted since mt__ring_open, the producer having
 * shrunk its file (util/busguard.h): such a page reads as zeros. Let go of the ring. */
bool mt__ring_faulted(const mt__ring_t *r);
void mt__ring_stats(const mt__ring_t *r, mt__ring_stats_t *out);
void mt__ring_set_flags(mt__ring_t *r, uint32_t flags); /* atomic OR */

/* ---- producer side: lock-free, never blocks, never allocates ---- */

/* Records ev (its seq field is ignored and set by the ring). Returns 0, or MT_EAGAIN
 * when the ring was full and the event was dropped (counted). Async-signal-safe. */
int mt__ring_push(mt__ring_t *r, const mt_event_rec_t *ev);

/* Records ev[0..n) (one operation's events) with one claim for all, at consecutive
 * positions and seqs. When the ring has no room for all n, records as many as fit one
 * by one. Returns the number dropped (counted). Async-signal-safe. */
size_t mt__ring_push_n(mt__ring_t *r, const mt_event_rec_t *ev, size_t n);
/* mt__ring_push_n in two halves, for a producer that orders its batches under a lock of its
 * own and holds it only for the first: claim takes n positions (tok[0], and tok[1] the seq
 * of the first) or, when n are not free, counts all n dropped (tok[1] = UINT64_MAX); write
 * fills and publishes what claim took (nothing for a drop). */
void mt__ring_claim(mt__ring_t *r, size_t n, uint64_t tok[2]);
/* The ring's slots: a batch longer than that can never be claimed whole. */
size_t mt__ring_slots(const mt__ring_t *r);
void mt__ring_write(mt__ring_t *r, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n);
/* write for a thread cache's batch in compact form, tok from mt__ring_claim(r, h->nev, tok)
 * (nothing for a drop): writes the entries and the header into the first
 * mt__evb_slots(h->nent) of the claimed slots and publishes the header's position only.
 * Requires 2 <= mt__evb_slots(h->nent) <= h->nev, and h and ents a batch a producer writes
 * (util/evbatch.h); a consumer refuses any other as lost. */
void mt__ring_write_batch(mt__ring_t *r, const uint64_t tok[2], const mt__evb_hdr_t *h,
                          const mt__evb_ent_t *ents);

/* Records ev[0..n) as push_n does when there is room for all, and returns true; else
 * records nothing, counts nothing and returns false (the lossless producer then waits). */
bool mt__ring_try_push_n(mt__ring_t *r, const mt_event_rec_t *ev, size_t n);
/* How far the consumer has read (positions), to tell a slow consumer from a stalled one. */
uint64_t mt__ring_read_idx(const mt__ring_t *r);

/* The two halves of push, for tests that simulate a producer dying mid-write:
 * reserve takes a seq and claims a slot (MT_EAGAIN when full, counted dropped) and
 * returns the slot to fill; commit publishes it. */
int mt__ring_reserve(mt__ring_t *r, mt_event_rec_t **slot, uint64_t *pos);
void mt__ring_commit(mt__ring_t *r, uint64_t pos);

/* ---- consumer side: exactly one consumer per ring ---- */

/* Delivers up to max published records (plus gap records) to cb in ring order and
 * advances read_idx, up to the positions claimed when the call began (later ones are
 * left for the next call). Returns the number of event records delivered (gaps
 * excluded), 0 when nothing was ready, MT_EPROTO (nothing delivered) when the header's
 * indices are corrupt (claim behind read_idx or more than S ahead). A record no producer
 * could have written (a field out of range, or the consumer-only kind MT_EV_GAP) is
 * counted lost, like a torn one, not delivered. Never waits: an
 * unpublished slot ends the call unless it may be skipped (see the protocol above).
 * A batch's events are delivered all in one call: one that does not fit in what is left
 * of max ends the call, unless it comes first, when it is delivered whole: the result
 * then exceeds max, by less than MT__EVB_MAX_EV. A batch that cannot be expanded (a
 * header or entry no producer writes, a torn copy) counts its nev positions lost when
 * they lie within the claimed ones, else one position as any invalid record. */
int mt__ring_drain(mt__ring_t *r, mt__ring_cb cb, void *ud, size_t max);
/* From now on, drains keep their position to themselves and read_idx moves only at
 * mt__ring_ack: a consumer that writes what it drained somewhere durable (the daemon's
 * log) acknowledges after the write, so that a producer taking over after the consumer
 * died (its local log starts at read_idx) loses nothing the consumer had not written. */
void mt__ring_defer_ack(mt__ring_t *r);
/* Publishes read_idx = everything drained so far (deferred mode; no-op otherwise). */
void mt__ring_ack(mt__ring_t *r);
/* Deferred mode: the position mt__ring_ack would publish now (what was drained so far). */
uint64_t mt__ring_drained(const mt__ring_t *r);
/* Publishes read_idx = pos, a position mt__ring_drained gave; one at or below read_idx
 * already (an ack of everything since) is a no-op. */
void mt__ring_ack_to(mt__ring_t *r, uint64_t pos);
/* The producer is gone (its socket closed, or it was reaped): unpublished slots are
 * skipped at once from now on. */
void mt__ring_mark_dead(mt__ring_t *r);
/* How long an unpublished slot may hold the consumer while the producer lives
 * (default 500 ms). */
void mt__ring_set_stuck_timeout(mt__ring_t *r, uint64_t ns);
/* True when everything claimed has been consumed. */
bool mt__ring_empty(const mt__ring_t *r);

#endif
