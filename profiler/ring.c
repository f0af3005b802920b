/* The shared-memory event ring: creation, mapping, lock-free push, drain.
 * The layout and protocol are described once, in ring.h. */
#include "profiler/ring.h"
#include "profiler/ring_impl.h"
#include "memtrace/alloc.h"
#include "util/assert.h"
#include "util/busguard.h"
#include "util/safefile.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint32_t round_slots(uint32_t slots)
{
    if (slots < MT_RING_MIN_SLOTS)
        return MT_RING_MIN_SLOTS;
    if (slots > MT_RING_MAX_SLOTS)
        return MT_RING_MAX_SLOTS;
    uint32_t s = MT_RING_MIN_SLOTS;
    while (s < slots)
        s <<= 1;
    mt_assert(s >= slots && s <= MT_RING_MAX_SLOTS && (s & (s - 1)) == 0);
    return s;
}

static size_t commit_bytes(uint32_t slots)
{
    return ((size_t)slots * sizeof(uint64_t) + 63) & ~(size_t)63;
}

size_t mt__ring_map_size(uint32_t slots)
{
    return MT_RING_HEADER_SIZE + commit_bytes(slots) + (size_t)slots * sizeof(mt_event_rec_t);
}

static void bind_layout(mt__ring_t *r, uint32_t slots)
{
    char *base = (char *)r->hdr;
    r->commit = (_Atomic uint64_t *)(void *)(base + MT_RING_HEADER_SIZE);
    r->recs = (mt_event_rec_t *)(void *)(base + MT_RING_HEADER_SIZE + commit_bytes(slots));
    r->mask = slots - 1;
    r->stuck_timeout_ns = DEFAULT_STUCK_NS;
    /* Commit words and records are whole cache lines from the mapping's start. */
    mt_assert((slots & r->mask) == 0 && (uintptr_t)r->recs % 64 == 0 &&
              (char *)(r->recs + slots) == base + mt__ring_map_size(slots));
}

/* ---- lifecycle ---- */

#define NAME_TRIES 16

/* A new shared-memory object for the ring: a name another user cannot guess (128 random
 * bits), created exclusively; a taken name (a squatter, or a vanishingly rare repeat) just
 * means another draw. Private: an unnamed memfd, for a ring no daemon will ever map. */
static int open_object(mt__ring_t *r, bool private)
{
    if (private) {
        r->name[0] = '\0';
        int fd = memfd_create("memtrace-ring", MFD_CLOEXEC);
        return fd >= 0 ? fd : -errno;
    }
    int err = EEXIST;
    for (unsigned n = 0; n < NAME_TRIES && err == EEXIST; n++) {
        char rnd[33];
        int rc = mt__sf_random_hex(rnd, 32);
        if (rc)
            return rc;
        snprintf(r->name, sizeof(r->name), "/memtrace.%u.%d.%s", (unsigned)getuid(), (int)getpid(),
                 rnd);
        int fd = shm_open(r->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0)
            return fd;
        err = errno;
    }
    return -err;
}

static size_t page_round(size_t n)
{
    return (n + 4095) & ~(size_t)4095;
}

/* ---- the file size limit ---- */

/* The area's bytes as ring_create makes them: whole pages, at most MT_RING_AREA_MAX. */
static size_t area_round(size_t area_size)
{
    return page_round(area_size > MT_RING_AREA_MAX ? MT_RING_AREA_MAX : area_size);
}

size_t mt__ring_file_size(uint32_t slots, size_t area_size)
{
    size_t size = mt__ring_map_size(round_slots(slots));
    area_size = area_round(area_size);
    return area_size ? page_round(size) + area_size : size;
}

uint64_t mt__ring_fsize_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return (uint64_t)rl.rlim_cur;
}

/* The stack table is kept only with at least this many slots beside it: a ring much
 * smaller drops events faster than the table saves. */
#define FIT_MIN_SLOTS_WITH_AREA 1024u

int mt__ring_fit(uint64_t limit, uint32_t *slots, size_t *area_size)
{
    uint32_t s = round_slots(*slots);
    size_t a = area_round(*area_size);
    if (mt__ring_file_size(s, a) <= limit) {
        *slots = s;
        *area_size = a;
        return 0;
    }
    if (a != 0) {
        uint32_t k = s;
        while (k > FIT_MIN_SLOTS_WITH_AREA && mt__ring_file_size(k, a) > limit)
            k >>= 1;
        if (k >= FIT_MIN_SLOTS_WITH_AREA && mt__ring_file_size(k, a) <= limit) {
            *slots = k;
            *area_size = a;
            return 0;
        }
    }
    while (s > MT_RING_MIN_SLOTS && mt__ring_file_size(s, 0) > limit)
        s >>= 1;
    if (mt__ring_file_size(s, 0) > limit)
        return MT_EFBIG;
    *slots = s;
    *area_size = 0;
    return 0;
}

/* ---- lifecycle, continued ---- */

static int ring_create(mt__ring_t **out, uint32_t slots, const char *comm, bool private,
                       size_t area_size)
{
    if (!out)
        return MT_EINVAL;
    *out = NULL;
    slots = round_slots(slots);
    size_t size = mt__ring_map_size(slots);
    area_size = area_round(area_size);
    size_t area_off = page_round(size);
    /* Checked before anything exists: sizing a file past RLIMIT_FSIZE raises SIGXFSZ,
     * whose default action kills the program, before ftruncate can return EFBIG. */
    if (mt__ring_file_size(slots, area_size) > mt__ring_fsize_limit())
        return MT_EFBIG;
    mt__ring_t *r = calloc(1, sizeof(*r));
    if (!r)
        return MT_ENOMEM;
    int fd = open_object(r, private);
    int rc;
    if (fd < 0) {
        rc = fd;
        goto fail_open;
    }
    if (ftruncate(fd, (off_t)(area_size ? area_off + area_size : size)) != 0) {
        rc = -errno; /* EFBIG (MT_EFBIG) when the limit fell since the check */
        goto fail_truncate;
    }
    /* MAP_POPULATE: the pages are faulted in now, not by the first lap of pushes (a
     * shared-memory fault per 64 records cost the first lap several times a push). */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        goto fail_truncate;
    }
    if (area_size) {
        /* Not populated: the table's pages are touched only as stacks arrive. */
        r->area = mmap(NULL, area_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)area_off);
        if (r->area == MAP_FAILED) {
            rc = -errno;
            munmap(p, size);
            goto fail_truncate;
        }
        r->area_size = area_size;
    }
    close(fd);
    r->hdr = p;
    r->map_size = size;
    r->owner = true;
    r->linked = !private;
    r->owner_uid = (uint32_t)getuid();
    bind_layout(r, slots);

    /* The file is zero-filled by ftruncate: counters and commit words start at 0. */
    mt__ring_hdr_t *h = r->hdr;
    h->magic = MT_RING_MAGIC;
    h->version = MT_RING_VERSION;
    h->header_size = MT_RING_HEADER_SIZE;
    h->slots = slots;
    h->rec_size = sizeof(mt_event_rec_t);
    h->pid = (int32_t)getpid();
    h->uid = (uint32_t)getuid();
    h->start_realtime_ns = mt__ring_now_ns(CLOCK_REALTIME);
    h->start_mono_ns = mt__ring_now_ns(CLOCK_MONOTONIC);
    if (comm)
        snprintf(h->comm, sizeof(h->comm), "%s", comm);
    h->area_off = area_size ? area_off : 0;
    h->area_size = area_size;
    atomic_thread_fence(memory_order_release);
    *out = r;
    return 0;

fail_truncate:
    close(fd);
    if (!private)
        shm_unlink(r->name);
fail_open:
    free(r);
    return rc;
}

int mt__ring_create(mt__ring_t **out, uint32_t slots, const char *comm)
{
    return ring_create(out, slots, comm, false, 0);
}

int mt__ring_create_private(mt__ring_t **out, uint32_t slots, const char *comm)
{
    return ring_create(out, slots, comm, true, 0);
}

int mt__ring_create_ex(mt__ring_t **out, uint32_t slots, const char *comm, bool private,
                       size_t area_size)
{
    return ring_create(out, slots, comm, private, area_size);
}

void *mt__ring_area(const mt__ring_t *r, size_t *size)
{
    *size = r->area_size;
    return r->area;
}

static bool valid_name(const char *name)
{
    size_t len = strnlen(name, MT_RING_NAME_MAX);
    return len < MT_RING_NAME_MAX && strncmp(name, "/memtrace.", 10) == 0 && len > 10 &&
           strchr(name + 1, '/') == NULL;
}

/* Unmaps r's pages, their guards first (a consumer's; the producer's have none). */
static void unmap_all(mt__ring_t *r)
{
    mt__busguard_remove(r->guard_map);
    mt__busguard_remove(r->guard_area);
    r->guard_map = r->guard_area = 0;
    if (r->hdr)
        munmap(r->hdr, r->map_size);
    if (r->area)
        munmap(r->area, r->area_size);
}

int mt__ring_open(mt__ring_t **out, const char *name)
{
    if (!out || !name)
        return MT_EINVAL;
    *out = NULL;
    if (!valid_name(name))
        return MT_EINVAL;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return -errno;
    int rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto fail_fd;
    }
    if (st.st_size < (off_t)MT_RING_HEADER_SIZE) {
        rc = MT_EPROTO;
        goto fail_fd;
    }
    /* Map the header alone first: slots must be validated before the size is trusted.
     * Every mapping of the producer's file is guarded: the file may shrink under it
     * (after the fstat above, too), and a faulting page then reads as zeros. */
    mt__ring_hdr_t *h = mmap(NULL, MT_RING_HEADER_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        rc = -errno;
        goto fail_fd;
    }
    int guard = mt__busguard_add(h, MT_RING_HEADER_SIZE, PROT_READ);
    if (guard < 0) {
        munmap(h, MT_RING_HEADER_SIZE);
        rc = guard;
        goto fail_fd;
    }
    uint32_t slots = h->slots;
    uint64_t area_off = h->area_off, area_size = h->area_size;
    bool ok = h->magic == MT_RING_MAGIC && h->version == MT_RING_VERSION &&
              h->header_size == MT_RING_HEADER_SIZE && h->rec_size == sizeof(mt_event_rec_t) &&
              slots >= MT_RING_MIN_SLOTS && slots <= MT_RING_MAX_SLOTS &&
              (slots & (slots - 1)) == 0;
    mt__busguard_remove(guard);
    munmap(h, MT_RING_HEADER_SIZE);
    /* The area, when there is one, is where the producer puts it, bounded, in the file. */
    if (ok && area_size != 0)
        ok = area_off == page_round(mt__ring_map_size(slots)) && area_size <= MT_RING_AREA_MAX &&
             area_size % 4096 == 0 && (uint64_t)st.st_size >= area_off + area_size;
    if (!ok || (size_t)st.st_size < mt__ring_map_size(slots)) {
        rc = MT_EPROTO;
        goto fail_fd;
    }
    mt__ring_t *r = calloc(1, sizeof(*r));
    if (!r) {
        rc = MT_ENOMEM;
        goto fail_fd;
    }
    size_t size = mt__ring_map_size(slots);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        goto fail_ring;
    }
    r->hdr = p;
    r->map_size = size;
    if ((rc = r->guard_map = mt__busguard_add(p, size, PROT_READ | PROT_WRITE)) < 0)
        goto fail_map;
    if (area_size != 0) {
        r->area = mmap(NULL, area_size, PROT_READ, MAP_SHARED, fd, (off_t)area_off);
        if (r->area == MAP_FAILED) {
            rc = -errno;
            r->area = NULL;
            goto fail_map;
        }
        r->area_size = area_size;
        if ((rc = r->guard_area = mt__busguard_add(r->area, area_size, PROT_READ)) < 0)
            goto fail_map;
    }
    close(fd);
    r->owner = false;
    r->linked = true;
    r->owner_uid = (uint32_t)st.st_uid;
    snprintf(r->name, sizeof(r->name), "%s", name);
    bind_layout(r, slots);
    *out = r;
    return 0;

fail_map:
    unmap_all(r);
fail_ring:
    free(r);
fail_fd:
    close(fd);
    return rc;
}

int mt__ring_unlink(mt__ring_t *r)
{
    if (!r)
        return MT_EINVAL;
    if (!r->linked)
        return 0;
    r->linked = false;
    if (shm_unlink(r->name) != 0 && errno != ENOENT)
        return -errno;
    return 0;
}

void mt__ring_close(mt__ring_t **pr)
{
    if (!pr || !*pr)
        return;
    mt__ring_t *r = *pr;
    if (r->owner && r->linked)
        mt__ring_unlink(r);
    unmap_all(r);
    free(r);
    *pr = NULL;
}

const char *mt__ring_name(const mt__ring_t *r)
{
    return r->name;
}

const mt__ring_hdr_t *mt__ring_header(const mt__ring_t *r)
{
    return r->hdr;
}

bool mt__ring_faulted(const mt__ring_t *r)
{
    return mt__busguard_hit(r->guard_map) || mt__busguard_hit(r->guard_area);
}

uint32_t mt__ring_owner_uid(const mt__ring_t *r)
{
    return r->owner_uid;
}

void mt__ring_stats(const mt__ring_t *r, mt__ring_stats_t *out)
{
    mt__ring_hdr_t *h = r->hdr;
    out->claimed = atomic_load_explicit(&h->claim, memory_order_relaxed);
    out->read = atomic_load_explicit(&h->read_idx, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&h->dropped, memory_order_relaxed);
    out->emitted = out->claimed + out->dropped;
    out->lost = atomic_load_explicit(&h->lost, memory_order_relaxed);
    out->delivered = atomic_load_explicit(&h->delivered, memory_order_relaxed);
    out->flags = atomic_load_explicit(&h->flags, memory_order_relaxed);
    out->slots = h->slots;
}

void mt__ring_set_flags(mt__ring_t *r, uint32_t flags)
{
    atomic_fetch_or_explicit(&r->hdr->flags, flags, memory_order_release);
}

/* ---- producer ---- */

/* Claims n consecutive positions with one CAS (the only atomic read-modify-write of a
 * record: a locked instruction, which also waits for the previous record's stores).
 * seq of position c + i = c + i + (drops seen before the claim); a claimer reads claim
 * (acquire) after its predecessor's CAS (acq_rel), so it reads dropped no earlier than
 * the predecessor did: seqs strictly increase in ring order and the holes between them
 * add up to the drops. Returns false, counting nothing, when n positions are not free. */
static inline bool claim_n(mt__ring_t *r, uint64_t n, uint64_t *pos, uint64_t *seq)
{
    mt__ring_hdr_t *h = r->hdr;
    uint64_t c = atomic_load_explicit(&h->claim, memory_order_acquire);
    const int64_t slots = (int64_t)(r->mask + 1);
    for (;;) {
        uint64_t rd = atomic_load_explicit(&r->cached_read, memory_order_acquire);
        /* Signed: a stale c may lag a newer read_idx; the CAS then fails and reloads. */
        if ((int64_t)(c + n - rd) > slots) {
            rd = atomic_load_explicit(&h->read_idx, memory_order_acquire);
            atomic_store_explicit(&r->cached_read, rd, memory_order_release);
            if ((int64_t)(c + n - rd) > slots)
                return false;
        }
        uint64_t d = atomic_load_explicit(&h->dropped, memory_order_relaxed);
        if (atomic_compare_exchange_weak_explicit(&h->claim, &c, c + n, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            /* n positions at most a ring ahead of what this producer saw consumed. */
            mt_assert(n >= 1 && (int64_t)(c + n - rd) <= slots);
            *pos = c;
            *seq = c + d;
            return true;
        }
    }
}

/* Asks for the line at p in exclusive state ahead of the write: the next records' lines
 * were last read by the consumer's core, and a locked claim would otherwise wait for
 * their ownership to arrive. */
static inline void prefetch_write(const void *p)
{
#if defined(__x86_64__)
    __asm__ __volatile__("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1);
#endif
}

static inline void publish(mt__ring_t *r, uint64_t pos)
{
    /* Only producers write claim: a position is published after its claim, once. The
     * commit word is checked only in the expensive build: reading it before the store
     * fetched its line shared and then again to own it, a second transfer from the
     * consumer's core on every record. */
    mt_assert(pos < atomic_load_explicit(&r->hdr->claim, memory_order_relaxed));
    mt_assert_expensive(atomic_load_explicit(&r->commit[pos & r->mask], memory_order_relaxed) !=
                        pos + 1);
    atomic_store_explicit(&r->commit[pos & r->mask], pos + 1, memory_order_release);
}

int mt__ring_reserve(mt__ring_t *r, mt_event_rec_t **slot, uint64_t *pos)
{
    uint64_t seq;
    if (!claim_n(r, 1, pos, &seq)) {
        atomic_fetch_add_explicit(&r->hdr->dropped, 1, memory_order_relaxed);
        return MT_EAGAIN;
    }
    mt_event_rec_t *rec = &r->recs[*pos & r->mask];
    rec->seq = seq;
    *slot = rec;
    return 0;
}

void mt__ring_commit(mt__ring_t *r, uint64_t pos)
{
    publish(r, pos);
}

/* Writes ev[0..n) at the claimed positions pos.. and publishes them. Inlined into the
 * pushes: a call and its register saves were a fifth of a push's instructions. */
static inline __attribute__((always_inline)) void
write_claimed(mt__ring_t *r, const mt_event_rec_t *ev, size_t n, uint64_t pos, uint64_t seq)
{
    for (size_t i = 0; i < n; i++) {
        mt_event_rec_t *rec = &r->recs[(pos + i) & r->mask];
        *rec = ev[i];
        rec->seq = seq + i;
        publish(r, pos + i);
    }
    prefetch_write(&r->recs[(pos + n + PREFETCH_AHEAD) & r->mask]);
    prefetch_write(&r->recs[(pos + n + PREFETCH_AHEAD + 1) & r->mask]);
    prefetch_write(&r->commit[(pos + n + 8) & r->mask]);
}

bool mt__ring_try_push_n(mt__ring_t *r, const mt_event_rec_t *ev, size_t n)
{
    uint64_t pos, seq;
    if (n == 0)
        return true;
    if (n > (size_t)r->mask + 1 || !claim_n(r, n, &pos, &seq))
        return false;
    write_claimed(r, ev, n, pos, seq);
    return true;
}

uint64_t mt__ring_read_idx(const mt__ring_t *r)
{
    return atomic_load_explicit(&r->hdr->read_idx, memory_order_acquire);
}

/* The ring full for n: as many as fit, one by one, the rest counted dropped. */
static __attribute__((noinline, cold)) size_t push_full(mt__ring_t *r, const mt_event_rec_t *ev,
                                                        size_t n)
{
    uint64_t pos, seq;
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        if (claim_n(r, 1, &pos, &seq)) {
            write_claimed(r, &ev[i], 1, pos, seq);
        } else {
            atomic_fetch_add_explicit(&r->hdr->dropped, 1, memory_order_relaxed);
            dropped++;
        }
    }
    return dropped;
}

size_t mt__ring_slots(const mt__ring_t *r)
{
    return (size_t)r->mask + 1;
}

void mt__ring_claim(mt__ring_t *r, size_t n, uint64_t tok[2])
{
    if (n == 0 || n > (size_t)r->mask + 1 || !claim_n(r, n, &tok[0], &tok[1])) {
        atomic_fetch_add_explicit(&r->hdr->dropped, n, memory_order_relaxed);
        tok[0] = 0;
        tok[1] = UINT64_MAX;
    }
}

void mt__ring_write(mt__ring_t *r, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    if (tok[1] != UINT64_MAX && n > 0)
        write_claimed(r, ev, n, tok[0], tok[1]);
}

#define BATCH_PREFETCH_MAX 64 /* lines asked for after a batch (a global one writes <= 33) */

void mt__ring_write_batch(mt__ring_t *r, const uint64_t tok[2], const mt__evb_hdr_t *h,
                          const mt__evb_ent_t *ents)
{
    if (tok[1] == UINT64_MAX)
        return;
    const uint64_t pos = tok[0];
    const size_t k = mt__evb_slots(h->nent);
    mt_assert(k >= 2 && k <= h->nev && h->nev <= MT__EVB_MAX_EV &&
              pos + h->nev <= atomic_load_explicit(&r->hdr->claim, memory_order_relaxed));
    /* The entries two per slot, the last slot's unused half zeroed (a consumer copies
     * whole slots: no stale bytes of an older record are passed on). */
    for (size_t j = 1; j < k; j++) {
        char *slot = (char *)&r->recs[(pos + j) & r->mask];
        size_t i = 2 * (j - 1);
        if (i + 1 < h->nent) {
            memcpy(slot, &ents[i], 2 * sizeof(mt__evb_ent_t));
        } else {
            memcpy(slot, &ents[i], sizeof(mt__evb_ent_t));
            memset(slot + sizeof(mt__evb_ent_t), 0, sizeof(mt__evb_ent_t));
        }
    }
    mt_event_rec_t *hs = &r->recs[pos & r->mask];
    mt__evb_hdr_pack(h, hs);
    hs->seq = tok[1];
    /* One commit word for the batch: its release orders every store above before it. */
    publish(r, pos);
    /* The next claim starts at pos + nev (slots pos+k.. are left untouched): ask for the
     * lines of a batch as long as this one there, and the next commit word, so that their
     * ownership comes while the producer does other work (bench_record: 0.5 ns an event
     * less than the header's line and the one after alone). */
    for (size_t j = 0; j < k && j < BATCH_PREFETCH_MAX; j++)
        prefetch_write(&r->recs[(pos + h->nev + j) & r->mask]);
    prefetch_write(&r->commit[(pos + h->nev) & r->mask]);
}

size_t mt__ring_push_n(mt__ring_t *r, const mt_event_rec_t *ev, size_t n)
{
    uint64_t pos, seq;
    if (n == 0)
        return 0;
    if (__builtin_expect(!claim_n(r, n, &pos, &seq), 0))
        return push_full(r, ev, n);
    write_claimed(r, ev, n, pos, seq);
    return 0;
}

int mt__ring_push(mt__ring_t *r, const mt_event_rec_t *ev)
{
    uint64_t pos, seq;
    if (__builtin_expect(!claim_n(r, 1, &pos, &seq), 0))
        return push_full(r, ev, 1) == 0 ? 0 : MT_EAGAIN;
    write_claimed(r, ev, 1, pos, seq);
    return 0;
}
