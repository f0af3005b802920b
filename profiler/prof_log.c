/* The recorder's local log: the NDJSON file the drainer thread writes when no daemon
 * reads the ring, and the watcher that switches to it when the daemon goes away. */
#include "util/safefile.h"
#include "profiler/prof_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_BATCH 4096
/* One write per buffer: 256 KiB writes to an ext4 file took 15 % less of the drainer's CPU
 * per line than 64 KiB ones (1 MiB, no less again). */
#define OUTBUF_SIZE (256 * 1024)
/* An event line is at most this long with the stream's labels (24 bytes); a drain takes
 * only as many records as surely fit the buffer's room, so that none is taken from the
 * ring that the buffer cannot hold while the disk is full. */
#define LINE_MAX_BYTES 512
#define OUT_LINES      (OUTBUF_SIZE / 16) /* lines (records) the buffer may hold (their seqs) */
/* The room a binary record is given in a drain's reckoning: an event and its tag's name. */
#define BIN_REC_BYTES 128
#define NO_SEQ        UINT64_MAX /* a line of no event: hello, exit */

/* Event and gap lines among the first n lines of the buffer. */
static uint64_t event_lines(const mt_prof_t *p, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p->out_seq[i] != NO_SEQ;
    return k;
}

/* Drops the first `bytes` (n whole lines) of the buffer: they are in the file. */
static void out_consume(mt_prof_t *p, size_t bytes, size_t n)
{
    p->written += event_lines(p, n);
    memmove(p->out, p->out + bytes, p->out_len - bytes);
    memmove(p->out_seq, p->out_seq + n, (p->out_nlines - n) * sizeof *p->out_seq);
    p->out_len -= bytes;
    p->out_nlines -= n;
}

/* The bytes a write at offset `at` of the log may take before the file size limit
 * (RLIMIT_FSIZE), or SIZE_MAX with no limit (or not a regular file, which has none). A
 * write that begins at or past the limit raises SIGXFSZ, whose default action kills the
 * program: the writer stops short of it instead, as on a full disk. */
static size_t room_below_limit(int fd, off_t at)
{
    struct rlimit rl;
    struct stat st;
    if (at < 0 || getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return SIZE_MAX;
    return (uint64_t)at >= (uint64_t)rl.rlim_cur ? 0
                                                 : (size_t)((uint64_t)rl.rlim_cur - (uint64_t)at);
}

static void held_since(mt_prof_t *p, int err);

/* Writes the buffer, one binary block, to the log: whole or not at all. A failed or short
 * write cuts the file back to where the block began and keeps it, as whole lines are kept
 * below. When the cut fails, a reader reads the cut block up to where the retried one
 * begins, so the records that reached the disk come twice (readers drop repeated records,
 * docs/telemetry.md). A block that would pass the file size limit is not begun. */
static int flush_block(mt_prof_t *p)
{
    if (p->out_len <= MT__BLOG_HDR) {
        p->out_len = 0;
        return 0;
    }
    mt__blog_header(p->out, (uint32_t)(p->out_len - MT__BLOG_HDR), p->pid, (uint32_t)p->out_nlines);
    off_t start = lseek(p->log_fd, 0, SEEK_END);
    size_t off = 0, room = room_below_limit(p->log_fd, start);
    int err = room != SIZE_MAX && room < p->out_len ? EFBIG : 0;
    if (room == SIZE_MAX) /* (under a size limit, nothing is reserved past it) */
        mt__fa_ahead(&p->log_fa, p->log_fd, p->out_len);
    while (err == 0 && off < p->out_len) {
        ssize_t w = write(p->log_fd, p->out + off, p->out_len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            err = w < 0 ? errno : ENOSPC;
        else
            off += (size_t)w;
    }
    if (err == 0) {
        out_consume(p, p->out_len, p->out_nlines);
        if (p->held)
            logf_(p, MT_LOG_WARN, "memtrace: writing %s again", p->log_path);
        p->held = false;
        p->write_err = 0;
        return 0;
    }
    if (off > 0 && start >= 0)
        (void)ftruncate(p->log_fd, start);
    held_since(p, err);
    return p->write_err;
}

/* Writes the buffer to the log, whole lines only. A failed or short write (disk full, a
 * file size limit, EIO) cuts the file back to its last whole line, keeps the unwritten
 * lines in the buffer and holds: drains stop, so later events stay in the ring, and the
 * next flush (the drainer's next round) tries again. The failure is said once, when it
 * begins; what is never written is counted at the end (finish). */
int mt__prof_log_flush(mt_prof_t *p)
{
    if (p->out_len == 0)
        return 0;
    if (p->bin)
        return flush_block(p);
    if (p->half_line && room_below_limit(p->log_fd, lseek(p->log_fd, 0, SEEK_END)) > 0 &&
        write(p->log_fd, "\n", 1) == 1)
        p->half_line = false;                    /* the reader skips the cut line as malformed */
    off_t start = lseek(p->log_fd, 0, SEEK_END); /* O_APPEND: where this write begins */
    size_t off = 0, room = room_below_limit(p->log_fd, start);
    int err = 0;
    if (room == SIZE_MAX)
        mt__fa_ahead(&p->log_fa, p->log_fd, p->out_len);
    while (off < p->out_len && !p->half_line) {
        size_t n = p->out_len - off;
        if (room != SIZE_MAX && n > room - off)
            n = room - off;
        if (n == 0) {
            err = EFBIG;
            break;
        }
        ssize_t w = write(p->log_fd, p->out + off, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            err = w < 0 ? errno : ENOSPC;
            break;
        }
        off += (size_t)w;
    }
    if (off == p->out_len) {
        out_consume(p, off, p->out_nlines);
        if (p->held)
            logf_(p, MT_LOG_WARN, "memtrace: writing %s again", p->log_path);
        p->held = false;
        p->write_err = 0;
        return 0;
    }
    /* Cut back to the last whole line written; the rest stays for the next try. */
    size_t whole = off, lines = 0;
    while (whole > 0 && p->out[whole - 1] != '\n')
        whole--;
    if (whole < off && (start < 0 || ftruncate(p->log_fd, start + (off_t)whole) != 0))
        p->half_line = true;
    for (size_t i = 0; i < whole; i++)
        lines += p->out[i] == '\n';
    out_consume(p, whole, lines);
    held_since(p, err);
    return p->write_err;
}

/* The write failed with err: says so once, when the holding begins. */
static void held_since(mt_prof_t *p, int err)
{
    if (!p->held) {
        uint64_t first = NO_SEQ;
        for (size_t i = 0; i < p->out_nlines && first == NO_SEQ; i++)
            first = p->out_seq[i];
        logf_(p, MT_LOG_ERROR,
              "memtrace: writing %s: %s; from seq %llu on, events are kept in memory (the "
              "ring, then dropped and counted when it is full) and written when it works again",
              p->log_path, strerror(err ? err : EIO), (unsigned long long)first);
    }
    p->held = true;
    p->write_err = -(err ? err : EIO);
}

/* Room for `bytes` more bytes and 8 more lines, flushing if needed; false if the buffer
 * is held that full. */
static bool out_room(mt_prof_t *p, size_t bytes)
{
    if (OUTBUF_SIZE - p->out_len > bytes && p->out_nlines + 8 <= OUT_LINES)
        return true;
    mt__prof_log_flush(p);
    return OUTBUF_SIZE - p->out_len > bytes && p->out_nlines + 8 <= OUT_LINES;
}

/* A binary block begun, if none is: its header's room first, the delta state afresh. */
static void bin_begin(mt_prof_t *p)
{
    if (p->out_len != 0)
        return;
    p->out_len = MT__BLOG_HDR;
    memset(&p->bst, 0, sizeof p->bst);
}

/* A line of text[0..n) (no newline) as a binary 'J' record; false without room. */
static bool bin_line(mt_prof_t *p, const char *text, size_t n)
{
    if (n > UINT32_MAX || !out_room(p, n + MT__BLOG_TEXT_EXTRA + MT__BLOG_HDR))
        return false;
    bin_begin(p);
    p->out_len += mt__blog_put_line(p->out + p->out_len, text, (uint32_t)n);
    p->out_seq[p->out_nlines++] = NO_SEQ;
    return true;
}

/* Appends one JSON document as a line (hello, exit); whole lines only reach the file (O_APPEND
 * keeps lines of processes sharing one log file from interleaving). */
void mt__prof_log_line(mt_prof_t *p, json_t *j)
{
    if (!j)
        return;
    if (p->bin) {
        char doc[1024]; /* these documents are < 1 KiB */
        size_t n = json_dumpb(j, doc, sizeof doc, JSON_COMPACT);
        json_decref(j);
        if (n > 0 && n <= sizeof doc)
            (void)bin_line(p, doc, n); /* held full: the log goes without it */
        return;
    }
    if (!out_room(p, 1024)) {
        json_decref(j); /* held full: the log goes without this hello or exit line */
        return;
    }
    size_t room = OUTBUF_SIZE - p->out_len - 1;
    size_t n = json_dumpb(j, p->out + p->out_len, room, JSON_COMPACT);
    json_decref(j);
    if (n == 0 || n > room)
        return; /* these documents are < 1 KiB */
    p->out_len += n;
    p->out[p->out_len++] = '\n';
    p->out_seq[p->out_nlines++] = NO_SEQ;
}

/* A tag's name in the log: the configured tag_name's when it gives one (an override),
 * else the label the stream announced, else NULL (built-in name or "tag<n>"). Called by
 * the line writer with drain_lock held. */
static const char *drain_tag_name(void *ud, int tag)
{
    mt_prof_t *p = ud;
    const char *s = p->tag_name ? p->tag_name(p->tag_ud, tag) : NULL;
    if (s && *s)
        return s;
    return tag >= 0 && tag < MT_TAG_MAX && p->labels[tag][0] ? p->labels[tag] : NULL;
}

/* Appends one event's line, written in place by the line writer. */
/* A table line (stack, module) into the log, before the lines that use it. Caller holds
 * drain_lock. */
static void drain_table_line(void *ud, const char *line, size_t len)
{
    mt_prof_t *p = ud;
    if (p->bin) {
        (void)bin_line(p, line, len > 0 && line[len - 1] == '\n' ? len - 1 : len);
        return; /* held full: the stack's frames read "unknown" */
    }
    if (!out_room(p, len))
        return; /* held full: the stack's frames read "unknown" */
    memcpy(p->out + p->out_len, line, len);
    p->out_len += len;
    p->out_seq[p->out_nlines++] = NO_SEQ;
}

/* Whether the name s (NULL: none) is the one tag's name record in this block gave. */
static bool bin_named(const mt_prof_t *p, int tag, const char *s)
{
    if (!(p->bst.named >> tag & 1))
        return false;
    if (p->tag_name == NULL) /* the names change only at a label, which forgets them */
        return true;
    return p->bname[tag] ? s && strcmp(s, p->bname[tag]) == 0 : !s || !*s;
}

/* ev (and the id of its stack) as a binary record, after its tag's name when this block
 * has not given it yet. An event no buffer can hold is lost and counted, as a line is. */
static void drain_bin(mt_prof_t *p, const mt_event_rec_t *ev, uint32_t stack)
{
    int tag = ev->tag;
    bool named = mt__blog_kind_named(ev->kind) && tag < MT_TAG_MAX;
    const char *s = named ? drain_tag_name(p, tag) : NULL;
    size_t n = s ? strlen(s) : 0;
    size_t need = MT__BLOG_HDR + MT__BLOG_EVENT_MAX + (named ? MT__BLOG_TEXT_EXTRA + n : 0);
    if (n > UINT32_MAX || p->out_nlines + 2 > OUT_LINES || OUTBUF_SIZE - p->out_len <= need) {
        if (need >= OUTBUF_SIZE || !out_room(p, need)) {
            if (p->unlogged++ == 0)
                p->unlogged_seq = ev->seq;
            return;
        }
    }
    bin_begin(p);
    if (named && !bin_named(p, tag, s)) {
        p->out_len += mt__blog_put_name(&p->bst, p->out + p->out_len, tag, s, (uint32_t)n);
        p->out_seq[p->out_nlines++] = NO_SEQ;
        if (p->tag_name != NULL) {
            free(p->bname[tag]);
            p->bname[tag] = s && *s ? strdup(s) : NULL;
            if (s && *s && !p->bname[tag])
                p->bst.named &= ~(1u << tag); /* no copy: named again next time */
        }
    }
    p->out_len += mt__blog_put_event(&p->bst, p->out + p->out_len, ev, stack);
    p->out_seq[p->out_nlines++] = ev->seq;
}

static void drain_cb(void *ud, const mt_event_rec_t *ev)
{
    mt_prof_t *p = ud;
    if (ev->kind == MT_EV_TAG_LABEL && ev->tag < MT_TAG_MAX) {
        mt_event_label_unpack(ev, p->labels[ev->tag]);
        if (p->enc)
            mt__prof_enc_forget_tags(p->enc);
        p->bst.named &= ~(1u << ev->tag);
    }
    uint32_t stack = 0;
    if (ev->kind == MT_EV_STACK_REF) {
        /* the stack's line (and modules found since) before the first line using it */
        (void)mt__stab_emit_for(&p->view, &p->seen, (uint32_t)ev->size, p->pid, drain_table_line,
                                p);
        p->pending_stack = (uint32_t)ev->size;
        p->pending_addr = ev->addr;
    } else {
        if (ev->kind == MT_EV_ALLOC && p->pending_stack && ev->addr == p->pending_addr)
            stack = p->pending_stack;
        p->pending_stack = 0;
    }
    if (p->bin) {
        drain_bin(p, ev, stack);
        goto out_oomsnap;
    }
    size_t room = p->out_nlines < OUT_LINES ? OUTBUF_SIZE - p->out_len : 0;
    size_t n =
        room == 0 ? 0
        : p->enc
            ? mt__prof_enc_write(p->enc, p->out + p->out_len, room, ev, stack, drain_tag_name, p)
            : mt_prof_alloc_write(p->out + p->out_len, room, ev, p->pid, stack, drain_tag_name, p);
    if (n == 0 || n >= room) {
        /* Only a tag name of over 10 KiB (a tag_name override), or a flush mid-drain that
         * failed, leaves no room: the event is lost, and counted. */
        n = out_room(p, LINE_MAX_BYTES)
                ? mt_prof_alloc_write(p->out + p->out_len, OUTBUF_SIZE - p->out_len, ev, p->pid,
                                      stack, drain_tag_name, p)
                : 0;
        if (n == 0 || n >= OUTBUF_SIZE - p->out_len) {
            if (p->unlogged++ == 0)
                p->unlogged_seq = ev->seq;
            return;
        }
    }
    p->out_len += n;
    p->out_seq[p->out_nlines++] = ev->seq;
out_oomsnap:
    if (p->oomsnap != NULL)
        mt__oomsnap_record(p->oomsnap, ev, (const char(*)[MT_EVENT_LABEL_MAX + 1]) p->labels,
                           drain_tag_name, p);
}

/* Drains everything published so far into the log. Caller holds drain_lock. */
int mt__prof_log_drain(mt_prof_t *p)
{
    int total = 0, n;
    do {
        /* Room for the records taken, each perhaps after a gap line, and a last gap. */
        if (!out_room(p, 8 * LINE_MAX_BYTES))
            break; /* held: the rest stays in the ring */
        size_t fit = (OUTBUF_SIZE - p->out_len) / (p->bin ? BIN_REC_BYTES : LINE_MAX_BYTES) - 2,
               lines = OUT_LINES - p->out_nlines - 2;
        n = mt__ring_drain(p->ring, drain_cb, p, (fit < lines ? fit : lines) / 2);
        total += n > 0 ? n : 0;
    } while (n > 0);
    mt__prof_log_flush(p);
    return total;
}

/* The drainer comes back after drain_ms while the ring is quiet, but after BUSY_DRAIN_MS
 * once a drain found at least 1/BUSY_FRACTION of the ring: a tight allocation loop fills
 * the default ring in a few ms, long before a 20 ms period ends, and what arrives in a
 * full ring is dropped however fast the lines are written. */
#define BUSY_DRAIN_MS 1
#define BUSY_FRACTION 16

static void *drainer_main(void *arg)
{
    mt_prof_t *p = arg;
    const int busy = (int)(mt__ring_header(p->ring)->slots / BUSY_FRACTION);
    unsigned wait_ms = p->drain_ms;
    uint64_t seen = 0; /* the ring's emitted count, for the sources' quiet push */
    pthread_mutex_lock(&p->stop_lock);
    while (!p->stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)wait_ms * 1000000u;
        dl.tv_sec += (time_t)(ns / 1000000000u);
        dl.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&p->stop_cond, &p->stop_lock, &dl);
        if (p->stop)
            break;
        pthread_mutex_unlock(&p->stop_lock);
        pthread_mutex_lock(&p->drain_lock);
        int n = mt__prof_log_drain(p);
        pthread_mutex_unlock(&p->drain_lock);
        if (n == 0) /* an idle program's last events, kept back by its allocators */
            mt__prof_push_sources(p, true, &seen);
        wait_ms = n >= busy && p->drain_ms > BUSY_DRAIN_MS ? BUSY_DRAIN_MS : p->drain_ms;
        pthread_mutex_lock(&p->stop_lock);
    }
    pthread_mutex_unlock(&p->stop_lock);
    return NULL;
}

int mt__prof_log_start(mt_prof_t *p, const char *path)
{
    char def[64];
    const char *ext = p->log_format == MT_PROF_LOG_BINARY ? "mtlog" : "ndjson";
    if (!path || !*path) {
        snprintf(def, sizeof(def), "./memtrace-%d.%s", p->pid, ext);
        path = def;
    }
    size_t plen = strlen(path);
    p->bin =
        p->log_format == MT_PROF_LOG_BINARY ||
        (p->log_format == MT_PROF_LOG_AUTO && plen >= 6 && strcmp(path + plen - 6, ".mtlog") == 0);
    p->log_path = strdup(path);
    p->out = malloc(OUTBUF_SIZE);
    p->out_seq = malloc(OUT_LINES * sizeof *p->out_seq);
    if (!p->log_path || !p->out || !p->out_seq)
        return MT_ENOMEM;
    /* The names prepared once per tag: not with a tag_name override of the program's,
     * whose answers may change from one call to the next (then every line asks it). */
    if (!p->bin && p->tag_name == NULL && p->enc == NULL &&
        (p->enc = malloc(sizeof *p->enc)) != NULL)
        mt__prof_enc_init(p->enc, p->pid);
    /* Created 0600 and exclusively; an existing log must be a plain file of ours: never a
     * symlink or a file another user planted in a shared directory. */
    int rc = mt__sf_open_append(path, &p->log_fd);
    if (rc == -EPERM && path == def) {
        /* Another user planted our default name (a shared working directory): a name
         * they cannot guess instead. */
        char rnd[9];
        if (mt__sf_random_hex(rnd, 8) == 0) {
            snprintf(def, sizeof(def), "./memtrace-%d.%s.%s", p->pid, rnd, ext);
            free(p->log_path);
            p->log_path = strdup(def);
            rc = p->log_path ? mt__sf_open_append(def, &p->log_fd) : MT_ENOMEM;
        }
    }
    if (rc) {
        logf_(p, MT_LOG_ERROR, "memtrace: cannot open log %s: %s%s", path, mt_strerror(rc),
              rc == -EPERM ? " (a symlink, or a file of another user: not written)" : "");
        return rc;
    }
    const mt__ring_hdr_t *h = mt__ring_header(p->ring);
    json_t *hello = mt_prof_hello_to_json(p->pid, p->name, h->start_realtime_ns, h->start_mono_ns);
    if (hello)
        (void)mt_prof_job_to_json(hello, &p->job); /* a field that failed is just left out */
    mt__prof_log_line(p, hello);
    /* the module map at start; after a takeover from the daemon, the table again (this log
     * needs it before its first stack) */
    mt__stab_seen_free(&p->seen);
    p->pending_stack = 0;
    (void)mt__stab_emit_for(&p->view, &p->seen, 0, p->pid, drain_table_line, p);
    mt__prof_log_flush(p);
    p->written = 0; /* counts events and gaps only */
    /* No daemon to write OOM snapshots: the drainer does (the takeover from a daemon too). */
    mt__oomsnap_cfg_t oc = {.pid = p->pid,
                            .dir = p->oom_dir,
                            .keep = MT__OOMSNAP_KEEP,
                            .interval_ms = p->oom_interval_ms,
                            .log = p->log,
                            .log_ud = p->log_ud};
    if (p->oom_dir[0] != '\0' && p->oomsnap == NULL && mt__oomsnap_create(&p->oomsnap, &oc) != 0)
        logf_(p, MT_LOG_WARN, "memtrace: no memory for OOM snapshots");
    rc = -pthread_create(&p->drainer, NULL, drainer_main, p);
    if (rc) {
        close(p->log_fd);
        p->log_fd = -1;
    }
    return rc;
}

/* The daemon closes our connection only once it has stopped reading the ring (it exited,
 * was killed, or let go of a corrupt ring): from then on this process is the ring's only
 * consumer, and what the daemon had not read yet goes to the local log with the rest.
 * A daemon killed in the middle of a drain may have sent up to 63 records it had not yet
 * acknowledged in read_idx: those reach the log again (same seq), none is lost. */
void *mt__prof_watcher_main(void *arg)
{
    mt_prof_t *p = arg;
    char buf[256];
    uint64_t seen = 0; /* the ring's emitted count, for the sources' quiet push */
    for (;;) {
        /* Every drain period without news: an idle program's last events, kept back by
         * its allocators, go to the daemon. */
        struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)p->drain_ms);
        if (r == 0) {
            mt__prof_push_sources(p, true, &seen);
            continue;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        ssize_t n = read(p->fd, buf, sizeof buf); /* the daemon sends nothing after hello */
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        break;
    }
    pthread_mutex_lock(&p->stop_lock);
    if (!p->stop) {
        int rc = mt__prof_log_start(p, p->cfg_log_path);
        if (rc == 0) {
            atomic_store_explicit(&p->mode, MT_PROF_LOG, memory_order_release);
            logf_(p, MT_LOG_WARN,
                  "memtrace: the daemon went away; recording continues in the local log %s",
                  p->log_path);
        } else {
            logf_(p, MT_LOG_ERROR,
                  "memtrace: the daemon went away and the local log cannot be opened (%s): "
                  "further events are dropped and counted",
                  mt_strerror(rc));
        }
    }
    pthread_mutex_unlock(&p->stop_lock);
    return NULL;
}

/* At the end, with the log still failing: says once how many events never reached it
 * (held in the buffer, left in the ring, or taken with no room) and the first one. */
void mt__prof_log_lost_report(mt_prof_t *p)
{
    if (!p->held && p->unlogged == 0)
        return;
    mt__ring_stats_t st;
    mt__ring_stats(p->ring, &st);
    uint64_t first = p->unlogged ? p->unlogged_seq : NO_SEQ;
    for (size_t i = 0; i < p->out_nlines; i++)
        if (p->out_seq[i] < first)
            first = p->out_seq[i];
    uint64_t n = event_lines(p, p->out_nlines) + (st.claimed - st.read) + p->unlogged;
    logf_(p, MT_LOG_ERROR,
          "memtrace: %llu events were not written to %s (%s), the first of them seq %llu; "
          "the file ends with whole lines",
          (unsigned long long)n, p->log_path, p->write_err ? strerror(-p->write_err) : "no room",
          (unsigned long long)first);
}
