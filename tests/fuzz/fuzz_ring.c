/* libFuzzer harness: the daemon's side of a producer's shared-memory ring. The producer
 * is untrusted memory: the input becomes the ring's file (header, commit words, records)
 * and the daemon's consumer maps it (mt__ring_open), drains it and applies every record
 * to a process model and to the line writer, as daemon/producers.c does.
 *
 * Input: byte 0 picks the shape, the rest is the file's bytes.
 *   bit 0 = 1  raw: the file is exactly the rest of the input (sizes, magic, anything).
 *   bit 0 = 0  repaired: the identity block is made valid with 8 << bits 1-2 slots and the
 *              file gets the size those slots need, so the fuzzer spends its time on the
 *              counters, commit words and records; bit 5 names this process as the
 *              producer (alive: unpublished slots wait for the stuck timeout) instead of
 *              the input's pid; bit 6 marks the producer dead; bit 7 appends a small
 *              stack-table area (profiler/stack.h) after the records, its header's limits
 *              and offsets made valid and its counts and entries from the input: the
 *              daemon reads every stack and module it names (daemon/stacks.c).
 *              Bit 3 makes the window read_idx..claim whole (claim within a ring of
 *              read_idx) and publishes each of its records; with bit 4 too, a slot of
 *              kind MT__EVB_KIND in it becomes a thread cache's batch a producer could
 *              write (util/evbatch.h: header and entries repaired from the input's
 *              bytes), and the payload positions after its header are left unpublished,
 *              as mt__ring_write_batch leaves them. */
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "memtrace/prof.h"
#include "profiler/ring.h"
#include "profiler/stack.h"
#include "tests/fuzz/fuzz.h"

typedef struct sink_s {
    mt_d_proc_t *proc;
    uint64_t records, events; /* calls; calls with an event (not a gap) */
} sink_t;

static void on_record(void *ud, const mt_event_rec_t *ev)
{
    sink_t *s = ud;
    s->records++;
    s->events += ev->kind != MT_EV_GAP;
    FUZZ_CHECK(ev->kind != MT_EV_GAP || ev->size > 0, "a gap reports something lost");
    mt__d_proc_apply(s->proc, ev);
    char line[1024];
    size_t n = mt_prof_event_write(line, sizeof line, ev, s->proc->pid, mt__d_proc_label, s->proc);
    FUZZ_CHECK(n > 0 && n < sizeof line, "every record has a line");
    /* The daemon's consumers (memtrace tail, report) decode that line. */
    json_t *j = json_loadb(line, n, 0, NULL);
    FUZZ_CHECK(j != NULL, "the line is JSON");
    mt_event_rec_t back;
    char err[128] = "";
    int rc = mt_prof_event_from_json(j, &back, NULL, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "%.*s: %s\n", (int)n, line, err);
    FUZZ_CHECK(rc == 0, "a delivered record's line decodes");
    json_decref(j);
}

/* A table line the daemon read from the area: JSON its model takes (or names as bad). */
static void table_line(void *ud, const char *line, size_t len)
{
    mt_d_proc_t *p = ud;
    json_t *j = json_loadb(line, len, 0, NULL);
    FUZZ_CHECK(j != NULL, "a table line is JSON");
    char err[160] = "";
    int rc = mt__model_table_line(p->model, j, err, sizeof err);
    FUZZ_CHECK(rc == 1 || (rc == MT_EPROTO && err[0]) || rc == MT_ENOMEM,
               "a table line is read or named bad");
    json_decref(j);
}

#define FZ_AREA 65536u

/* The stack-table header of a small area at a (limits and offsets valid; counts as given). */
static void area_repair(uint8_t *a)
{
    mt__stab_hdr_t *h = (mt__stab_hdr_t *)(void *)a;
    h->magic = MT__STAB_MAGIC;
    h->version = 1;
    h->hdr_size = sizeof *h;
    h->max_stacks = 64;
    h->max_frames = 1024;
    h->max_modules = 8;
    h->max_py = 16;
    h->str_bytes = 4096;
    h->defs_off = 256;
    h->frames_off = h->defs_off + 64 * sizeof(mt__stab_def_t);
    h->mods_off = h->frames_off + 1024 * 8;
    h->py_off = h->mods_off + 8 * sizeof(mt__stab_mod_t);
    h->str_off = h->py_off + 16 * sizeof(mt__stab_py_t);
}

/* The batch whose header is the slot at position p, made one a producer writes from the
 * input's bytes, within room positions. Returns the positions it takes (1 when no batch
 * fits: the slot stays as it is). */
static uint64_t batch_repair(mt_event_rec_t *recs, uint64_t mask, uint64_t p, uint64_t room)
{
    mt_event_rec_t *hs = &recs[p & mask];
    uint32_t want = 1 + (uint32_t)(hs->size % MT__EVB_MAX_EV), nent = 0, nev = 0;
    for (; nent < want; nent++) {
        mt__evb_ent_t *e = (mt__evb_ent_t *)(void *)&recs[(p + 1 + nent / 2) & mask] + nent % 2;
        bool timed = e->op & MT__EVB_TIMED; /* the global path's: a time each */
        uint8_t op = (uint8_t)(MT__EVB_STACK + e->op % 4);
        uint8_t rep = op == MT__EVB_POP_FREE && !timed ? (uint8_t)(e->rep % 4) : 0;
        unsigned k = mt__evb_op_events(op) * (1u + rep);
        /* (within room <= slots positions: no entry lands on the header or another) */
        if (nev + k > room || nev + k > MT__EVB_MAX_EV || mt__evb_slots(nent + 1) > room)
            break;
        e->op = op;
        e->pool %= MT_POOL_HOST + 1;
        e->tag %= MT_TAG_MAX;
        e->rep = rep;
        uint64_t dt = e->stream % 200000; /* ns after the header's time */
        if (e->op == MT__EVB_STACK) {
            e->size = 1 + e->size % MT_STACK_ID_MAX;
            e->requested = 0;
        } else {
            e->size = 1 + (e->size & (((uint64_t)1 << 40) - 1));
            e->requested = 1 + e->requested % e->size;
        }
        if (timed) {
            e->op |= MT__EVB_TIMED;
            e->requested %= (uint64_t)1 << MT__EVB_REQ_BITS;
            e->requested = e->requested == 0 && op != MT__EVB_STACK ? 1 : e->requested;
            e->requested |= dt << MT__EVB_REQ_BITS;
        }
        nev += k;
    }
    if (nev < 2 || mt__evb_slots(nent) > nev)
        return 1;
    /* a stack ref only just before an alloc (POP or POP_FREE): else it becomes a POP */
    for (uint32_t i = 0; i < nent; i++) {
        mt__evb_ent_t *e = (mt__evb_ent_t *)(void *)&recs[(p + 1 + i / 2) & mask] + i % 2;
        const mt__evb_ent_t *x =
            i + 1 < nent
                ? (mt__evb_ent_t *)(void *)&recs[(p + 1 + (i + 1) / 2) & mask] + (i + 1) % 2
                : NULL;
        if (mt__evb_op(e) == MT__EVB_STACK &&
            (x == NULL || (mt__evb_op(x) != MT__EVB_POP && mt__evb_op(x) != MT__EVB_POP_FREE))) {
            e->op = (uint8_t)(MT__EVB_POP | (e->op & MT__EVB_TIMED));
            e->requested = (e->requested & ~(((uint64_t)1 << MT__EVB_REQ_BITS) - 1)) | 1;
        }
    }
    if (nent % 2) /* the last slot's unused half */
        memset((mt__evb_ent_t *)(void *)&recs[(p + 1 + nent / 2) & mask] + 1, 0,
               sizeof(mt__evb_ent_t));
    mt__evb_hdr_t h = {.time_ns = hs->time_ns >> 1, /* room for the entries' times */
                       .allocated0 = (int64_t)(hs->addr & (((uint64_t)1 << 61) - 1)),
                       .reserved = hs->reserved,
                       .nent = nent,
                       .nev = nev,
                       .device = hs->device};
    uint64_t seq = hs->seq;
    mt__evb_hdr_pack(&h, hs);
    hs->seq = seq;
    return nev;
}

/* Bits 3 and 4 of the shape (see the top). */
static void window_repair(uint8_t *file, uint32_t slots, bool batches)
{
    mt__ring_hdr_t *h = (mt__ring_hdr_t *)(void *)file;
    _Atomic uint64_t *commit = (_Atomic uint64_t *)(void *)(file + MT_RING_HEADER_SIZE);
    mt_event_rec_t *recs =
        (mt_event_rec_t *)(void *)(file + mt__ring_map_size(slots) - slots * sizeof *recs);
    uint64_t rd = atomic_load(&h->read_idx), n = (atomic_load(&h->claim) - rd) % (slots + 1);
    atomic_store(&h->claim, rd + n);
    for (uint64_t i = 0; i < n;) {
        uint64_t p = rd + i;
        atomic_store(&commit[p & (slots - 1)], p + 1);
        if (batches && recs[p & (slots - 1)].kind == MT__EVB_KIND)
            i += batch_repair(recs, slots - 1, p, n - i);
        else
            i++;
    }
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    char name[MT_RING_NAME_MAX];
    snprintf(name, sizeof name, "/memtrace.fuzz.%d", (int)getpid());
    shm_unlink(name);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    FUZZ_CHECK(fd >= 0, "shm_open");
    if (mode & 1) {
        FUZZ_CHECK(write_all(fd, data, size) == 0, "writing the ring file");
    } else {
        uint32_t slots = MT_RING_MIN_SLOTS << ((mode >> 1) & 3);
        size_t rsize = mt__ring_map_size(slots), aoff = (rsize + 4095) & ~(size_t)4095;
        size_t fsize = mode & 0x80 ? aoff + FZ_AREA : rsize;
        uint8_t *file = calloc(1, fsize);
        FUZZ_CHECK(file != NULL, "out of memory");
        memcpy(file, data, size < fsize ? size : fsize);
        mt__ring_hdr_t *h = (mt__ring_hdr_t *)(void *)file;
        h->magic = MT_RING_MAGIC;
        h->version = MT_RING_VERSION;
        h->header_size = MT_RING_HEADER_SIZE;
        h->slots = slots;
        h->rec_size = sizeof(mt_event_rec_t);
        if (mode & 0x20)
            h->pid = (int32_t)getpid();
        if (mode & 0x40)
            h->flags |= MT_RING_F_EXITED;
        h->area_off = 0;
        h->area_size = 0;
        if (mode & 0x80) {
            /* the input's bytes past the ring land in the area */
            if (size > rsize)
                memcpy(file + aoff, data + rsize, size - rsize < FZ_AREA ? size - rsize : FZ_AREA);
            area_repair(file + aoff);
            h->area_off = aoff;
            h->area_size = FZ_AREA;
        }
        if (mode & 0x08)
            window_repair(file, slots, mode & 0x10);
        FUZZ_CHECK(write_all(fd, file, fsize) == 0, "writing the ring file");
        free(file);
    }
    close(fd);

    mt__ring_t *r = NULL;
    int rc = mt__ring_open(&r, name);
    shm_unlink(name);
    if (rc != 0) {
        FUZZ_CHECK(rc < 0 && r == NULL, "a refused ring is not mapped");
        return 0;
    }
    const mt__ring_hdr_t *h = mt__ring_header(r);
    FUZZ_CHECK(h->slots >= MT_RING_MIN_SLOTS && h->slots <= MT_RING_MAX_SLOTS,
               "a mapped ring has a valid slot count");
    mt_d_proc_t *p = NULL;
    FUZZ_CHECK(mt__d_proc_create(&p, h->pid, h->comm) == 0, "process model");
    sink_t s = {.proc = p};
    /* No waiting for a stuck slot: the second look at it skips it. */
    mt__ring_set_stuck_timeout(r, 0);
    /* Small budgets too: a batch that does not fit waits, or comes whole first. */
    size_t budget = mode & 0x10 ? 3 : 4u * h->slots + 64u;
    uint64_t returned = 0;
    for (int call = 0; call < (mode & 0x10 ? 64 : 8); call++) {
        int n = mt__ring_drain(r, on_record, &s, budget);
        FUZZ_CHECK(n >= 0 || n == MT_EPROTO, "drain: a count or a corrupt ring");
        FUZZ_CHECK(n < 0 || (size_t)n <= budget || (size_t)n <= MT__EVB_MAX_EV,
                   "drain respects its budget, but for one batch");
        if (n < 0)
            break;
        returned += (uint64_t)n;
        FUZZ_CHECK(returned == s.events, "drain counts the events it delivered");
    }
    /* the table in the area, read as the daemon reads it: every stack and module */
    size_t asz;
    const void *area = mt__ring_area(r, &asz);
    mt__stab_view_t v;
    if (area && mt__stab_view(&v, area, asz) == 0) {
        mt__stab_seen_t seen = {0};
        for (uint32_t id = 0; id <= mt__stab_view_nstacks(&v) + 1 && id <= 70; id++)
            FUZZ_CHECK(mt__stab_emit_for(&v, &seen, id, p->pid, table_line, p) == 0,
                       "the table is read");
        mt__stab_seen_free(&seen);
    }
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    mt_model_figures_t fr;
    FUZZ_CHECK(mt__model_figures(p->model, MT_MODEL_DEVICE, &fr) == 0, "model figures");
    FUZZ_CHECK(fr.fragmentation >= 0.0 && fr.fragmentation <= 1.0, "fragmentation in [0, 1]");
    FUZZ_CHECK(fr.total_free <= fr.reserved && fr.largest_free <= fr.total_free,
               "free extents within the reserved bytes");
    FUZZ_CHECK(mt__model_check(p->model, NULL, 0) == 0, "the model's invariants hold");
    json_t *j = mt__d_proc_json(p, true);
    FUZZ_CHECK(j != NULL, "the process model serializes");
    char *txt = json_dumps(j, JSON_COMPACT);
    FUZZ_CHECK(txt != NULL, "the process JSON dumps");
    free(txt);
    json_decref(j);
    mt__d_proc_destroy(&p);
    mt__ring_close(&r);
    FUZZ_CHECK(r == NULL, "close clears the pointer");
    return 0;
}
