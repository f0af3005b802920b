/* memtraced: producer registration, ring draining, exit and eviction.
 *
 * A producer says hello once, naming its shared-memory ring; we map the ring and unlink
 * its name at once, so the mapping (and the events in it) survives the producer. Rings
 * are drained on a timer with a per-producer budget, and completely when the producer's
 * connection ends: that EOF is how we learn the process is gone, however it died. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/internal.h"
#include "profiler/internal.h"
#include "util/safefile.h"
#include "util/text.h"
#include "util/json.h"
#include "daemon/web.h"
#include "memtrace/prof.h"

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- registration ---- */

static void log_process_line(mt_d_t *d, const mt_d_proc_t *p, const char *what)
{
    if (!d->logf)
        return;
    json_t *o =
        json_pack("{s:i,s:s,s:s,s:i,s:s,s:I}", "v", 1, "type", "process_event", "event", what,
                  "pid", p->pid, "name", p->name, "time_realtime_ns", (json_int_t)realtime_ns());
    /* A line short of a member is none: the log's reader would take it as the whole. */
    int bad = o == NULL;
    if (!bad && p->exit_reason)
        bad |= json_object_set_new(o, "reason", json_string(p->exit_reason));
    if (!bad && p->backend[0])
        bad |= json_object_set_new(o, "backend", json_string(p->backend));
    if (!bad) /* so `memtrace view` of this log keeps them */
        bad |= mt_prof_job_to_json(o, &p->job);
    char *s = NULL;
    size_t n = 0;
    if (!bad && mt__json_dumps(o, JSON_COMPACT, &s, &n) == 0) {
        s[n] = '\n';
        mt__d_logfile_record(d, s, n + 1);
    }
    free(s);
    json_decref(o);
}

/* The ring caps (docs/telemetry.md, "Security model"): a process, and a user, may hold
 * only so many live rings; one process registering ring after ring would otherwise take
 * the daemon's memory and descriptors from every other producer. Keyed on the peer's
 * credentials (SO_PEERCRED), not on anything the hello says. */
static int ring_caps_admit(mt_d_conn_t *c, int pid, char *err, size_t errlen)
{
    mt_d_t *d = c->d;
    unsigned of_pid = 0, of_uid = 0;
    for (const mt_d_proc_t *p = d->procs; p; p = p->next) {
        if (!p->ring)
            continue;
        of_pid += p->pid == pid;
        of_uid += p->uid == c->peer_uid;
    }
    if (of_pid >= d->cfg.max_rings_per_proc)
        snprintf(err, errlen,
                 "too many rings for process %d: %u registered (the daemon's "
                 "max_rings_per_proc)",
                 pid, of_pid);
    else if (of_uid >= d->cfg.max_rings_per_uid)
        snprintf(err, errlen,
                 "too many rings for uid %u: %u registered (the daemon's max_rings_per_uid)",
                 (unsigned)c->peer_uid, of_uid);
    else
        return 0;
    mt__d_warn(d, &d->warn_rings, "refused a ring: %s", err);
    return MT_EBUSY;
}

/* Checks the hello as docs/telemetry.md §2 says: version 1, a ring name of ours
 * ("/memtrace.*"), the peer's own pid, a ring owned by the peer's uid (or a root peer). */
int mt__d_producer_hello(mt_d_conn_t *c, json_t *msg, char *err, size_t errlen)
{
    mt_d_t *d = c->d;
    json_t *jv = json_object_get(msg, "version");
    json_t *jpid = json_object_get(msg, "pid");
    const char *shm = json_string_value(json_object_get(msg, "shm"));
    const char *name = json_string_value(json_object_get(msg, "name"));
    const char *backend = json_string_value(json_object_get(msg, "backend"));
    if (!json_is_integer(jv) || json_integer_value(jv) != 1) {
        snprintf(err, errlen, "unsupported protocol version (this daemon speaks 1)");
        return MT_EPROTO;
    }
    if (!json_is_integer(jpid) || json_integer_value(jpid) <= 0 ||
        json_integer_value(jpid) > INT32_MAX) {
        snprintf(err, errlen, "hello needs a pid");
        return MT_EPROTO;
    }
    int pid = (int)json_integer_value(jpid);
    if (!shm || strncmp(shm, "/memtrace.", 10) != 0 || strchr(shm + 1, '/')) {
        snprintf(err, errlen, "shm must name a ring /memtrace.*");
        return MT_EPROTO;
    }
    if (c->peer_pid > 0 && c->peer_pid != pid) {
        snprintf(err, errlen, "pid %d is not the connecting process (%d)", pid, c->peer_pid);
        return MT_EPROTO;
    }
    int rc = ring_caps_admit(c, pid, err, errlen);
    if (rc)
        return rc;
    mt__ring_t *ring = NULL;
    rc = mt__ring_open(&ring, shm);
    if (rc) {
        snprintf(err, errlen, "cannot map ring %.80s: %s", shm, mt_strerror(rc));
        return rc;
    }
    const mt__ring_hdr_t *h = mt__ring_header(ring);
    if (h->pid != pid || (c->peer_uid != 0 && mt__ring_owner_uid(ring) != c->peer_uid) ||
        mt__ring_faulted(ring)) {
        snprintf(err, errlen, "ring %.80s does not belong to the connecting process", shm);
        mt__ring_close(&ring);
        return MT_EPROTO;
    }
    mt__ring_unlink(ring);
    /* read_idx moves only once what was drained is in the log (see ack_drained). */
    mt__ring_defer_ack(ring);
    mt_d_proc_t *p = NULL;
    rc = mt__d_proc_create(&p, h->pid, name && *name ? name : h->comm);
    if (rc) {
        mt__ring_close(&ring);
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    p->uid = c->peer_uid;
    if (backend)
        snprintf(p->backend, sizeof p->backend, "%s", backend);
    (void)mt_prof_job_from_json(msg, &p->job); /* checked there: bad fields are unknown */
    p->ring = ring;
    mt__d_stacks_attach(p);
    p->conn = c;
    p->registered_realtime = realtime_ns();
    mt__ring_set_flags(ring, MT_RING_F_ATTACHED);
    /* Newest last, so that the list is in registration order. */
    mt_d_proc_t **tail = &d->procs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    c->proc = p;
    c->kind = MT_D_CONN_PRODUCER;
    mt__d_buf_free(&c->in);
    d->ctr.producers++;
    log_process_line(d, p, "register");
    /* The name and the ring's name are the process's: escaped for the log. */
    char esc[MT_TEXT_ESC_SIZE(MT_RING_COMM_MAX)], esc_shm[MT_TEXT_ESC_SIZE(128)];
    mt__d_log(d, MT_LOG_INFO, "producer %d (%s) registered, ring %s", p->pid,
              mt__text_escape(p->name, esc, sizeof esc),
              mt__text_escape(shm, esc_shm, sizeof esc_shm));
    static const char ok[] = "{\"ok\":true}\n";
    return mt__d_conn_write(c, ok, sizeof ok - 1, false);
}

/* ---- draining ---- */

/* Every line drained so far written to the log (not flushed) and queued for consumers. */
static void process_batch(mt_d_t *d)
{
    mt__d_lines_sync(d);
}

static void on_record(void *ud, const mt_event_rec_t *ev)
{
    mt_d_t *d = ud;
    mt_d_proc_t *p = d->batch_proc;
    /* room for this record and the table lines a stack ref may bring */
    if (d->lines.fill->n + (ev->kind == MT_EV_STACK_REF ? MT__STAB_MODULES + 2 : 1) >
        MT_D_BATCH_CAP)
        mt__d_lines_handoff(d);
    if (ev->kind == MT_EV_GAP) {
        p->dropped += ev->size;
        d->ctr.producer_drops += ev->size;
    } else {
        p->events++;
        d->ctr.events++;
    }
    if (ev->kind == MT_EV_TAG_LABEL) {
        process_batch(d); /* the lines before it with the names before it */
        d->lines.stale = true;
    }
    mt__d_proc_apply(p, ev);
    (void)mt__d_web_record(d, p, ev); /* the one buffer of p's recent events (web.h) */
    mt__d_snapshot_event(d, p, ev);   /* an OOM writes a snapshot from it */
    uint32_t stack = mt__d_stacks_record(d, p, ev);
    if (!d->batch_lines)
        return;
    mt_d_batch_t *b = d->lines.fill;
    mt_d_batch_rec_t *r = &b->rec[b->n++];
    r->ev = *ev;
    r->proc = p;
    r->pid = p->pid;
    r->stack = stack;
}

/* Writes the log out, then acknowledges to every ring what was drained from it: a
 * producer that takes over after the daemon died starts its own log at read_idx, so
 * read_idx must never pass what is not yet in the daemon's log (a SIGKILL between the two
 * then gives an event twice, which the report counts once, never zero times). */
static void ack_drained(mt_d_t *d)
{
    mt__d_lines_sync(d);
    mt__d_logfile_flush(d);
    for (mt_d_proc_t *p = d->procs; p; p = p->next)
        if (p->ring)
            mt__ring_ack(p->ring);
}

/* Marks p's ring to be let go of (drop_corrupt, or its EOF), saying why once. */
static void mark_corrupt(mt_d_t *d, mt_d_proc_t *p, const char *why)
{
    if (p->corrupt)
        return;
    p->corrupt = true;
    d->ctr.rejected++;
    char esc[MT_TEXT_ESC_SIZE(MT_RING_COMM_MAX)];
    mt__d_log(d, MT_LOG_WARN, "producer %d (%s): %s; no longer reading it", p->pid,
              mt__text_escape(p->name, esc, sizeof esc), why);
}

static const char shrank_why[] = "its ring file shrank under the daemon's mapping (truncated)";

/* Does anyone read event lines: the log file, or a consumer (Unix or SSE)? */
static bool lines_read(const mt_d_t *d)
{
    if (d->logf)
        return true;
    for (const mt_d_conn_t *c = d->conns; c; c = c->next)
        if (!c->closing && (c->kind == MT_D_CONN_CONSUMER || c->kind == MT_D_CONN_SSE))
            return true;
    return false;
}

/* Drains up to budget records of p (everything when budget = SIZE_MAX). */
static void drain_one(mt_d_t *d, mt_d_proc_t *p, size_t budget)
{
    d->batch_proc = p;
    /* With no log file and no consumer, the lines would go nowhere: the drain keeps the
     * figures (model, web, OOM snapshots) and writes no JSON, the most of its time. */
    d->batch_lines = lines_read(d);
    while (budget > 0 && !p->corrupt) {
        size_t max = budget < MT_D_BATCH ? budget : MT_D_BATCH;
        int n = mt__ring_drain(p->ring, on_record, d, max);
        /* The producer shrank its ring file under our mapping: the pages that went read
         * as zeros (util/busguard.h), so the ring says nothing true any more. Or its
         * header lies (indices out of range). Either way its memory is not to be trusted
         * any more: what was read stays (records read as zeros were refused as invalid),
         * and the caller lets go of the ring. */
        if (mt__ring_faulted(p->ring))
            mark_corrupt(d, p, shrank_why);
        else if (n == MT_EPROTO)
            mark_corrupt(d, p, "its event ring is corrupt");
        if (n <= 0)
            break;
        /* a thread cache's batch comes whole: n may pass max, and the budget */
        budget -= (size_t)n < budget ? (size_t)n : budget;
    }
}

/* Lets go of a producer whose ring is corrupt: marked exited ("corrupt"), its connection
 * closed. Not evicted here: the callers are walking d->procs. */
static void drop_corrupt(mt_d_t *d, mt_d_proc_t *p)
{
    mt__d_stacks_detach(p);
    mt__ring_close(&p->ring);
    p->exit_reason = "corrupt";
    p->exited = true;
    p->exited_realtime = realtime_ns();
    mt_d_conn_t *c = p->conn;
    p->conn = NULL;
    log_process_line(d, p, "exit");
    if (c) {
        c->proc = NULL;
        mt__d_conn_close(c);
    }
}

/* One tick: at most cfg.drain_budget events in all, shared fairly by the live producers,
 * so that a tick stays short and what it queues for each consumer stays well below the
 * consumer's queue limit. When the budget ran out, the next tick comes at once (after the
 * loop has polled for I/O, so consumers are written to in between), not a period later.
 * Whenever nothing is left, the ring is next looked at by the periodic timer. */
void mt__d_drain_all(mt_d_t *d)
{
    if (d->stopping)
        return;
    unsigned live = 0;
    for (mt_d_proc_t *p = d->procs; p; p = p->next)
        live += p->ring != NULL;
    if (live == 0) {
        uv_idle_stop(&d->drain_idle);
        return;
    }
    size_t share = d->cfg.drain_budget / live;
    if (share < 64)
        share = 64;
    bool more = false;
    for (mt_d_proc_t *p = d->procs; p; p = p->next) {
        if (!p->ring)
            continue;
        size_t before = p->events;
        drain_one(d, p, share);
        if (p->corrupt) {
            drop_corrupt(d, p);
            continue;
        }
        more |= p->events - before >= share;
    }
    /* When another tick follows at once, the encoder goes on with this one's lines while
     * the loop polls; else the loop waits for them (lines.c). */
    if (!more || !mt__d_lines_handoff_acked(d)) {
        process_batch(d);
        ack_drained(d);
    }
    /* An idle handle, not a 0 ms timer: libuv 1.44 runs a timer re-armed from its own
     * callback again in the same pass, starving I/O; idle callbacks alternate with a
     * non-blocking poll. */
    if (more)
        uv_idle_start(&d->drain_idle, mt__d_on_drain_idle);
    else
        uv_idle_stop(&d->drain_idle);
}

void mt__d_procs_ack(mt_d_t *d, uint64_t k)
{
    unsigned slot = (unsigned)(k % MT_D_LINES_DEPTH);
    for (mt_d_proc_t *p = d->procs; p; p = p->next) {
        if (p->ack_at[slot] != k + 1)
            continue;
        p->ack_at[slot] = 0;
        mt__ring_ack_to(p->ring, p->ack_pos[slot]); /* (none: let go of meanwhile) */
    }
}

/* ---- exit and eviction ---- */

static void evict_exited(mt_d_t *d)
{
    for (;;) {
        unsigned exited = 0;
        mt_d_proc_t **oldest = NULL;
        for (mt_d_proc_t **pp = &d->procs; *pp; pp = &(*pp)->next) {
            if (!(*pp)->exited)
                continue;
            exited++;
            if (!oldest || (*pp)->exited_realtime < (*oldest)->exited_realtime)
                oldest = pp;
        }
        if (exited <= d->cfg.max_exited || !oldest)
            return;
        mt__d_lines_sync(d); /* no batch in the encoder's hands names it */
        d->lines.stale = true;
        mt_d_proc_t *victim = *oldest;
        *oldest = victim->next;
        mt__d_web_forget(d, victim);
        mt__d_proc_destroy(&victim);
    }
}

/* Whether r's file was cut short of its records, whatever the drains happened to read: a
 * producer that dies writing into a cut ring may leave nothing there that the last drain
 * reads (a claimed slot whose commit word is in the page that stays is skipped unread).
 * The area starts just after the records (profiler/ring.h), and its first page, the stack
 * table's header, exists (the daemon read it at registration): reading it allocates
 * nothing, and faults, on record in the guard, exactly when the file no longer reaches
 * past the records. A cut further into the table is found by the table's reads; a ring
 * without an area is judged by the drains' reads alone. */
static bool ring_shrank(mt__ring_t *r)
{
    size_t size;
    const volatile unsigned char *area = mt__ring_area(r, &size);
    if (area && size)
        (void)area[0];
    return mt__ring_faulted(r);
}

void mt__d_producer_eof(mt_d_conn_t *c)
{
    mt_d_t *d = c->d;
    mt_d_proc_t *p = c->proc;
    if (!p || !p->ring || d->stopping)
        return;
    /* The process is gone (or let go of us): a slot it claimed but never published will
     * never be, so the last drain may skip it instead of waiting. */
    mt__ring_mark_dead(p->ring);
    drain_one(d, p, SIZE_MAX);
    process_batch(d);
    ack_drained(d);
    if (ring_shrank(p->ring))
        mark_corrupt(d, p, shrank_why);
    mt__ring_stats_t st;
    mt__ring_stats(p->ring, &st);
    if (p->corrupt)
        p->exit_reason = "corrupt";
    else if (st.flags & MT_RING_F_EXITED)
        p->exit_reason = "clean";
    else if ((st.flags & MT_RING_F_OOM) || p->last_kind == MT_EV_OOM)
        p->exit_reason = "oom";
    else
        p->exit_reason = "killed";
    mt__d_stacks_detach(p);
    mt__ring_close(&p->ring);
    p->exited = true;
    p->exited_realtime = realtime_ns();
    p->conn = NULL;
    c->proc = NULL;
    log_process_line(d, p, "exit");
    mt__d_logfile_flush(d);
    char esc[MT_TEXT_ESC_SIZE(MT_RING_COMM_MAX)];
    mt__d_log(d, MT_LOG_INFO, "producer %d (%s) exited: %s, %llu events, %llu dropped", p->pid,
              mt__text_escape(p->name, esc, sizeof esc), p->exit_reason,
              (unsigned long long)p->events, (unsigned long long)p->dropped);
    evict_exited(d);
}

/* Lines a registered producer may send: {"type":"poke"} asks for a drain now (its ring is
 * filling up faster than our timer empties it). Other lines are ignored; a line longer
 * than MT_D_PRODUCER_LINE_MAX closes the connection (as EOF would: final drain, exit). */
void mt__d_producer_input(mt_d_conn_t *c, const char *data, size_t n)
{
    mt_d_t *d = c->d;
    bool poke = false;
    for (size_t i = 0; i < n; i++) {
        if (data[i] != '\n') {
            if (c->in.len < 64)
                mt__d_buf_append(&c->in, &data[i], 1);
            if (++c->line_len > MT_D_PRODUCER_LINE_MAX) {
                d->ctr.rejected++;
                mt__d_producer_eof(c);
                mt__d_conn_close(c);
                return;
            }
            continue;
        }
        if (c->in.len > 0 && strstr(c->in.p, "\"poke\""))
            poke = true;
        mt__d_buf_clear(&c->in);
        c->line_len = 0;
    }
    if (poke && c->proc && c->proc->ring && !d->stopping) {
        drain_one(d, c->proc, d->cfg.drain_budget);
        process_batch(d);
    }
}

unsigned mt__d_live_count(const mt_d_t *d)
{
    unsigned n = 0;
    for (const mt_d_proc_t *p = d->procs; p; p = p->next)
        n += !p->exited;
    return n;
}

void mt__d_procs_free(mt_d_t *d)
{
    mt__d_web_free(d);
    while (d->procs) {
        mt_d_proc_t *p = d->procs;
        d->procs = p->next;
        if (p->ring)
            mt__d_stacks_detach(p);
        mt__ring_close(&p->ring);
        mt__d_proc_destroy(&p);
    }
}
