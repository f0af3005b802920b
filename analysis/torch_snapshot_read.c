/* Reading a PyTorch memory snapshot (torch_snapshot.h) from its pickle: segments, blocks
 * and their histories, device_traces (whole here; streamed as the file is parsed:
 * torch_snapshot_stream.c), annotations and settings, every value charged to a visit
 * budget (torch_snapshot_read.h). */
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "analysis/torch_snapshot_read.h"
#include "analysis/zsource.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"

__attribute__((format(printf, 3, 4))) static int bad(rd_t *r, const char *where, const char *fmt,
                                                     ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* NULL: a first attempt that is read again with where formatted when it fails */
    snprintf(r->err, r->errlen, "%s: %s: %s", r->name, where ? where : "?", msg);
    return MT_EPROTO;
}

int mt__ts_get_int(rd_t *r, const mt_pk_value_t *d, const char *key, bool required, int64_t *out,
                   const char *where)
{
    const mt_pk_value_t *v = mt__pk_get(d, key);
    if (v == NULL || (v->type == MT_PK_NONE && !required)) {
        *out = 0;
        return required ? bad(r, where, "'%s' missing", key) : 0;
    }
    if (v->type != MT_PK_INT && v->type != MT_PK_BOOL)
        return bad(r, where, "'%s' is a %s, not an int", key, mt__pk_type_name(v->type));
    *out = v->u.i;
    return 0;
}

static int get_size(rd_t *r, const mt_pk_value_t *d, const char *key, bool required, uint64_t *out,
                    const char *where)
{
    int64_t v = 0;
    int rc = mt__ts_get_int(r, d, key, required, &v, where);
    if (rc == 0 && v < 0)
        return bad(r, where, "'%s' is negative (%lld)", key, (long long)v);
    *out = (uint64_t)v;
    return rc;
}

const char *mt__ts_get_str(rd_t *r, const mt_pk_value_t *d, const char *key, bool required,
                           const char *where, int *rc)
{
    const mt_pk_value_t *v = mt__pk_get(d, key);
    *rc = 0;
    if (v == NULL || v->type == MT_PK_NONE) {
        if (required)
            *rc = bad(r, where, "'%s' missing", key);
        return NULL;
    }
    if (v->type != MT_PK_STR) {
        *rc = bad(r, where, "'%s' is a %s, not a str", key, mt__pk_type_name(v->type));
        return NULL;
    }
    return v->u.s;
}

const mt_pk_value_t *mt__ts_get_seq(rd_t *r, const mt_pk_value_t *d, const char *key, bool required,
                                    const char *where, int *rc)
{
    const mt_pk_value_t *v = mt__pk_get(d, key);
    *rc = 0;
    if (v == NULL || v->type == MT_PK_NONE) {
        if (required)
            *rc = bad(r, where, "'%s' missing", key);
        return NULL;
    }
    if (v->type != MT_PK_LIST && v->type != MT_PK_TUPLE) {
        *rc = bad(r, where, "'%s' is a %s, not a list", key, mt__pk_type_name(v->type));
        return NULL;
    }
    return v;
}

/* Charges n visits; past the budget the file is refused by name: only values shared
 * through the memo, followed again and again, get there. */
int mt__ts_visit(rd_t *r, size_t n, const char *where)
{
    r->visits += n;
    if (r->visits <= r->budget)
        return 0;
    return bad(r, where,
               "refused: the file's shared values (pickle memo references) expand to more than "
               "%llu values, %u per byte of the file (visit budget of this reader)",
               (unsigned long long)r->budget, VISITS_PER_BYTE);
}

/* A dict, charged its pairs: the lookups that follow scan them. */
int mt__ts_want_dict(rd_t *r, const mt_pk_value_t *v, const char *where)
{
    if (v->type != MT_PK_DICT)
        return bad(r, where, "a %s, not a dict", mt__pk_type_name(v->type));
    return mt__ts_visit(r, v->n + 1, where);
}

/* The stack of a 'frames' list, made once per distinct list object. */
static int read_frames(rd_t *r, const mt_pk_value_t *d, const char *where, uint32_t *id)
{
    int rc;
    const mt_pk_value_t *fl = mt__ts_get_seq(r, d, "frames", false, where, &rc);
    *id = 0;
    if (rc < 0 || fl == NULL || fl->n == 0)
        return rc;
    uint64_t key = (uint64_t)(uintptr_t)fl, known;
    if (mt__amap_get(&r->seen, key, &known) == 0) {
        *id = (uint32_t)known;
        return mt__ts_visit(r, 1, where);
    }
    if (r->strm != NULL) {
        /* Streamed events' stacks are interned by content: these join them. */
        if ((rc = mt__ts_stream_frames(r, d, where, id)) == 0)
            rc = mt__amap_put(&r->seen, key, *id);
        return rc;
    }
    if ((rc = mt__ts_visit(r, fl->n, where)) < 0)
        return rc;
    mt_ts_frame_t stackbuf[64];
    mt_ts_frame_t *frames = fl->n <= 64 ? stackbuf : malloc(fl->n * sizeof *frames);
    if (frames == NULL)
        return MT_ENOMEM;
    char w[320];
    for (size_t i = 0; i < fl->n && rc == 0; i++) {
        const mt_pk_value_t *f = fl->u.items[i];
        snprintf(w, sizeof w, "%s.frames[%zu]", where, i);
        if ((rc = mt__ts_want_dict(r, f, w)) < 0)
            break;
        frames[i].name = mt__ts_get_str(r, f, "name", true, w, &rc);
        if (rc == 0)
            frames[i].filename = mt__ts_get_str(r, f, "filename", true, w, &rc);
        if (rc == 0)
            rc = mt__ts_get_int(r, f, "line", true, &frames[i].line, w);
    }
    if (rc == 0 && (rc = mt__ts_push_stack(r->ts, frames, fl->n, id)) == 0)
        rc = mt__amap_put(&r->seen, key, *id);
    if (frames != stackbuf)
        free(frames);
    return rc;
}

static int read_state(rd_t *r, const mt_pk_value_t *b, const char *where, uint8_t *state)
{
    int rc;
    const char *s = mt__ts_get_str(r, b, "state", true, where, &rc);
    if (rc < 0)
        return rc;
    if (strcmp(s, "active_allocated") == 0)
        *state = MT_TS_ACTIVE_ALLOCATED;
    else if (strcmp(s, "active_pending_free") == 0 || strcmp(s, "active_awaiting_free") == 0)
        *state = MT_TS_ACTIVE_PENDING_FREE;
    else if (strcmp(s, "inactive") == 0)
        *state = MT_TS_INACTIVE;
    else
        return bad(r, where,
                   "'state' is '%.40s', not active_allocated, active_pending_free "
                   "or inactive",
                   s);
    return 0;
}

static int read_history(rd_t *r, const mt_pk_value_t *b, const char *where, mt_ts_block_t *blk)
{
    int rc;
    const mt_pk_value_t *h = mt__ts_get_seq(r, b, "history", false, where, &rc);
    mt_ts_t *ts = r->ts;
    blk->first_history = (uint32_t)ts->nhistory;
    blk->nhistory = 0;
    if (rc < 0 || h == NULL || (rc = mt__ts_visit(r, h->n, where)) < 0)
        return rc;
    if (mt__ts_reserve((void **)&ts->history, &ts->mem->cap_history, ts->nhistory + h->n,
                       sizeof *ts->history) < 0)
        return MT_ENOMEM;
    char w[320];
    for (size_t i = 0; i < h->n; i++) {
        const mt_pk_value_t *e = h->u.items[i];
        mt_ts_history_t *o = &ts->history[ts->nhistory];
        snprintf(w, sizeof w, "%s.history[%zu]", where, i);
        if ((rc = mt__ts_want_dict(r, e, w)) < 0 ||
            (rc = get_size(r, e, "addr", true, &o->addr, w)) < 0 ||
            (rc = get_size(r, e, "real_size", true, &o->real_size, w)) < 0 ||
            (rc = read_frames(r, e, w, &o->stack)) < 0)
            return rc;
        ts->nhistory++;
        blk->nhistory++;
    }
    return 0;
}

static int read_segment(rd_t *r, const mt_pk_value_t *s, size_t si)
{
    char where[64], w[160];
    snprintf(where, sizeof where, "segments[%zu]", si);
    int rc;
    mt_ts_segment_t seg = {0};
    int64_t dev = 0;
    if ((rc = mt__ts_want_dict(r, s, where)) < 0 ||
        (rc = mt__ts_get_int(r, s, "device", true, &dev, where)) < 0 ||
        (rc = get_size(r, s, "address", true, &seg.addr, where)) < 0 ||
        (rc = get_size(r, s, "total_size", true, &seg.total_size, where)) < 0 ||
        (rc = get_size(r, s, "allocated_size", false, &seg.allocated_size, where)) < 0 ||
        (rc = get_size(r, s, "active_size", false, &seg.active_size, where)) < 0 ||
        (rc = get_size(r, s, "requested_size", false, &seg.requested_size, where)) < 0 ||
        (rc = mt__ts_get_int(r, s, "stream", false, &seg.stream, where)) < 0 ||
        (rc = read_frames(r, s, where, &seg.stack)) < 0)
        return rc;
    if (dev < 0 || dev > 255)
        return bad(r, where, "'device' %lld is not a device ordinal (0 to 255)", (long long)dev);
    seg.device = (int)dev;
    const char *type = mt__ts_get_str(r, s, "segment_type", false, where, &rc);
    if (rc < 0)
        return rc;
    if (type != NULL && strcmp(type, "large") != 0 && strcmp(type, "small") != 0)
        return bad(r, where, "'segment_type' is '%.40s', not large or small", type);
    seg.large = type != NULL ? strcmp(type, "large") == 0 : seg.total_size > ((uint64_t)2 << 20);
    const mt_pk_value_t *exp = mt__pk_get(s, "is_expandable");
    seg.expandable = exp != NULL && exp->type == MT_PK_BOOL && exp->u.i;
    if (exp != NULL || mt__pk_get(s, "requested_size") != NULL)
        r->ts->list_2x = r->ts->era == 1; /* (1.13 has neither field) */
    const mt_pk_value_t *pool = mt__pk_get(s, "segment_pool_id");
    if (pool != NULL && (pool->type == MT_PK_TUPLE || pool->type == MT_PK_LIST) && pool->n == 2)
        for (int i = 0; i < 2; i++)
            if (pool->u.items[i]->type == MT_PK_INT)
                seg.pool_id[i] = pool->u.items[i]->u.i;
    const mt_pk_value_t *bl = mt__ts_get_seq(r, s, "blocks", true, where, &rc);
    if (rc < 0 || (rc = mt__ts_visit(r, bl->n, where)) < 0)
        return rc;
    mt_ts_t *ts = r->ts;
    if (mt__ts_reserve((void **)&ts->blocks, &ts->mem->cap_blocks, ts->nblocks + bl->n,
                       sizeof *ts->blocks) < 0 ||
        mt__ts_reserve((void **)&ts->segments, &ts->mem->cap_segments, ts->nsegments + 1,
                       sizeof *ts->segments) < 0)
        return MT_ENOMEM;
    seg.first_block = (uint32_t)ts->nblocks;
    uint64_t addr = seg.addr;
    for (size_t i = 0; i < bl->n; i++) {
        const mt_pk_value_t *b = bl->u.items[i];
        mt_ts_block_t blk = {0};
        snprintf(w, sizeof w, "%s.blocks[%zu]", where, i);
        if ((rc = mt__ts_want_dict(r, b, w)) < 0 ||
            (rc = get_size(r, b, "size", true, &blk.size, w)) < 0 ||
            (rc = get_size(r, b, "requested_size", false, &blk.requested, w)) < 0 ||
            (rc = read_state(r, b, w, &blk.state)) < 0 ||
            (rc = read_frames(r, b, w, &blk.stack)) < 0 || (rc = read_history(r, b, w, &blk)) < 0)
            return rc;
        /* 1.13 blocks have no address: they tile the segment in order. */
        if (mt__pk_get(b, "address") != NULL) {
            if ((rc = get_size(r, b, "address", true, &blk.addr, w)) < 0)
                return rc;
        } else
            blk.addr = addr;
        addr = blk.addr + blk.size;
        uint32_t st = blk.nhistory ? ts->history[blk.first_history].stack : blk.stack;
        blk.tag = ts->mem->stack_tag[blk.stack ? blk.stack : st] == 0xff
                      ? MT_TAG_OTHER
                      : ts->mem->stack_tag[blk.stack ? blk.stack : st];
        ts->blocks[ts->nblocks++] = blk;
    }
    seg.nblocks = (uint32_t)bl->n;
    ts->segments[ts->nsegments++] = seg;
    return 0;
}

static int read_action(rd_t *r, const char *s, const char *where, int *action)
{
    for (int a = 0; a < MT_TS_ACTION_COUNT; a++)
        if (strcmp(s, mt__ts_action_name(a)) == 0) {
            *action = a;
            return 0;
        }
    *action = -1; /* newer actions ("annotate", ...) are skipped and counted */
    (void)r;
    (void)where;
    return 0;
}

/* One trace entry of device d as an event (skipped and counted when its action is newer
 * than this reader). streamed: its frames are interned by content (the values are freed
 * after the batch), else read once per frames list. */
int mt__ts_read_entry(rd_t *r, const mt_pk_value_t *e, size_t d, const char *where, bool streamed)
{
    mt_ts_t *ts = r->ts;
    int rc, action;
    mt_ts_event_t ev = {.device = (uint8_t)d, .tag = MT_TAG_OTHER};
    const char *as;
    if ((rc = mt__ts_want_dict(r, e, where)) < 0 ||
        (as = mt__ts_get_str(r, e, "action", true, where, &rc)) == NULL ||
        (rc = read_action(r, as, where, &action)) < 0)
        return rc < 0 ? rc : MT_EPROTO;
    if (action < 0) {
        ts->skipped_actions++;
        return 0;
    }
    ev.action = (uint8_t)action;
    const char *addr_key = action == MT_TS_OOM ? "device_free" : "addr";
    bool need_addr = action != MT_TS_OOM && action != MT_TS_SNAPSHOT;
    if ((rc = get_size(r, e, addr_key, need_addr, &ev.addr, where)) < 0 ||
        (rc = get_size(r, e, "size", action != MT_TS_SNAPSHOT, &ev.size, where)) < 0 ||
        (rc = mt__ts_get_int(r, e, "stream", false, &ev.stream, where)) < 0 ||
        (rc = mt__ts_get_int(r, e, "time_us", false, &ev.time_us, where)) < 0 ||
        (rc = get_size(r, e, "memtrace_size", false, &ev.block_size, where)) < 0 ||
        (rc = streamed ? mt__ts_stream_frames(r, e, where, &ev.stack)
                       : read_frames(r, e, where, &ev.stack)) < 0)
        return rc;
    uint8_t tag = ts->mem->stack_tag[ev.stack];
    ev.tag = tag == 0xff ? MT_TAG_OTHER : tag;
    if (mt__ts_reserve((void **)&ts->events, &ts->mem->cap_events, ts->nevents + 1,
                       sizeof *ts->events) < 0)
        return MT_ENOMEM;
    ts->events[ts->nevents++] = ev;
    return 0;
}

static int read_traces(rd_t *r, const mt_pk_value_t *traces)
{
    char where[64];
    mt_ts_t *ts = r->ts;
    size_t streamed = 0;
    for (size_t d = 0; d < traces->n; d++) {
        const mt_pk_value_t *tl = traces->u.items[d];
        if (d > 255)
            return bad(r, "device_traces", "more than 256 devices");
        snprintf(where, sizeof where, "device_traces[%zu]", d);
        if (tl->type != MT_PK_LIST && tl->type != MT_PK_TUPLE)
            return bad(r, where, "a %s, not a list", mt__pk_type_name(tl->type));
        if (tl->streamed) {
            /* Its events came as the file was read; it must be where the stream saw it. */
            if (tl->streamed != d + 1)
                return MT_EAGAIN;
            streamed++;
            continue;
        }
        int vrc = mt__ts_visit(r, tl->n, where);
        if (vrc < 0)
            return vrc;
        if (mt__ts_reserve((void **)&ts->events, &ts->mem->cap_events, ts->nevents + tl->n,
                           sizeof *ts->events) < 0 ||
            mt__ts_reserve((void **)&ts->dev_first, &ts->mem->cap_dev, d + 2,
                           sizeof *ts->dev_first) < 0)
            return MT_ENOMEM;
        for (size_t i = 0; i < tl->n; i++) {
            snprintf(where, sizeof where, "device_traces[%zu][%zu]", d, i);
            int rc = mt__ts_read_entry(r, tl->u.items[i], d, where, false);
            if (rc < 0)
                return rc;
        }
        ts->dev_first[d + 1] = (uint32_t)ts->nevents;
        ts->ndevices = (unsigned)d + 1;
    }
    if (r->strm != NULL)
        return mt__ts_sort_streamed(r, traces->n, streamed);
    return 0;
}

static int read_annotations(rd_t *r, const mt_pk_value_t *list)
{
    char where[64];
    int vrc = mt__ts_visit(r, list->n, "external_annotations");
    if (vrc < 0)
        return vrc;
    for (size_t i = 0; i < list->n; i++) {
        const mt_pk_value_t *a = list->u.items[i];
        snprintf(where, sizeof where, "external_annotations[%zu]", i);
        int rc;
        int64_t dev = 0;
        mt_ts_annotation_t an = {0};
        const char *stage;
        if ((rc = mt__ts_want_dict(r, a, where)) < 0 ||
            (stage = mt__ts_get_str(r, a, "stage", true, where, &rc)) == NULL ||
            (an.name = mt__ts_get_str(r, a, "name", true, where, &rc)) == NULL ||
            (rc = mt__ts_get_int(r, a, "device", false, &dev, where)) < 0 ||
            (rc = mt__ts_get_int(r, a, "time_us", false, &an.time_us, where)) < 0)
            return rc < 0 ? rc : MT_EPROTO;
        if (strcmp(stage, "START") != 0 && strcmp(stage, "END") != 0)
            return bad(r, where, "'stage' is '%.40s', not START or END", stage);
        an.start = stage[0] == 'S';
        an.device = (int)dev;
        /* The name stays in the pickle, which the model keeps. */
        mt_ts_t *ts = r->ts;
        if (mt__ts_reserve((void **)&ts->annotations, &ts->mem->cap_annotations,
                           ts->nannotations + 1, sizeof *ts->annotations) < 0)
            return MT_ENOMEM;
        ts->annotations[ts->nannotations++] = an;
    }
    return 0;
}

int mt__ts_read_root(rd_t *r, const mt_pk_value_t *root)
{
    int rc;
    const mt_pk_value_t *segs;
    if (root->type == MT_PK_LIST) {
        r->ts->era = 1;
        segs = root;
    } else if (root->type == MT_PK_DICT) {
        r->ts->era = 2;
        if ((segs = mt__ts_get_seq(r, root, "segments", true, "top level", &rc)) == NULL)
            return rc;
    } else
        return bad(r, "top level",
                   "a %s; a snapshot is a dict (PyTorch 2.x) or a list of "
                   "segments (1.13)",
                   mt__pk_type_name(root->type));
    if ((rc = mt__ts_visit(r, segs->n, "segments")) < 0)
        return rc;
    for (size_t i = 0; i < segs->n; i++)
        if ((rc = read_segment(r, segs->u.items[i], i)) < 0)
            return rc;
    if (r->ts->era == 1)
        return 0;
    const mt_pk_value_t *traces = mt__ts_get_seq(r, root, "device_traces", false, "top level", &rc);
    if (rc < 0 || (traces != NULL && (rc = read_traces(r, traces)) < 0))
        return rc;
    const mt_pk_value_t *ann =
        mt__ts_get_seq(r, root, "external_annotations", false, "top level", &rc);
    if (rc < 0 || (ann != NULL && (rc = read_annotations(r, ann)) < 0))
        return rc;
    const mt_pk_value_t *settings = mt__pk_get(root, "allocator_settings");
    if (settings != NULL && settings->type == MT_PK_DICT) {
        r->ts->alloc_conf = mt__ts_get_str(r, settings, "PYTORCH_CUDA_ALLOC_CONF", false,
                                           "allocator_settings", &rc);
        if (rc < 0)
            return rc;
    }
    return mt__ts_add_before_stack(r->ts);
}

int mt__ts_from_pickle(mt_ts_t **out, mt_pk_doc_t *doc, const char *name, char *err, size_t errlen)
{
    *out = NULL;
    mt_ts_t *ts;
    int rc = mt__ts_create(&ts);
    if (rc < 0) {
        mt__pk_doc_destroy(&doc);
        snprintf(err, errlen, "%s: out of memory", name);
        return rc;
    }
    ts->mem->doc = doc;
    rd_t r = {.ts = ts,
              .name = name,
              .err = err,
              .errlen = errlen,
              .budget = (uint64_t)VISITS_PER_BYTE * mt__pk_input_size(doc) + VISITS_FLOOR};
    rc = mt__ts_read_root(&r, mt__pk_root(doc));
    mt__amap_fini(&r.seen);
    if (rc == 0 && (rc = mt__ts_check(ts, err, errlen)) < 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", err);
        snprintf(err, errlen, "%s: %s", name, msg);
    }
    if (rc < 0) {
        if (rc == MT_ENOMEM)
            snprintf(err, errlen, "%s: out of memory", name);
        mt__ts_destroy(&ts);
        return rc;
    }
    *out = ts;
    return 0;
}

static bool read_once(const char *path);

int mt__ts_read(mt_ts_t **out, const char *path, char *err, size_t errlen)
{
    mt_pk_doc_t *doc;
    *out = NULL;
    /* The streamed read may give up (MT_EAGAIN) and the whole read start again: a pipe
     * cannot be read twice, so it is read whole at once. */
    int rc = read_once(path) ? MT_EAGAIN : mt__ts_read_streamed(out, path, err, errlen);
    if (rc != MT_EAGAIN)
        return rc;
    rc = mt__pk_parse_file(&doc, path, NULL, err, errlen);
    if (rc < 0)
        return rc;
    return mt__ts_from_pickle(out, doc, path, err, errlen);
}

/* The descriptor a path names without opening anything: "-" is standard input, /dev/fd/N
 * and /proc/self/fd/N (a shell's <(...)) are N; -1 for any other path. */
static int path_fd(const char *path)
{
    const char *n = NULL;
    if (strcmp(path, "-") == 0 || strcmp(path, "/dev/stdin") == 0)
        return 0;
    if (strncmp(path, "/dev/fd/", 8) == 0)
        n = path + 8;
    else if (strncmp(path, "/proc/self/fd/", 14) == 0)
        n = path + 14;
    if (n == NULL || *n < '0' || *n > '9')
        return -1;
    char *end;
    long fd = strtol(n, &end, 10);
    return *end == '\0' && fd <= INT_MAX ? (int)fd : -1;
}

/* The input cannot be read twice: a pipe, standard input or a FIFO, not a regular file. */
static bool read_once(const char *path)
{
    int fd = path_fd(path);
    struct stat st;
    return (fd >= 0 ? fstat(fd, &st) : stat(path, &st)) == 0 && !S_ISREG(st.st_mode);
}

/* The pickle's first byte, PROTO (0x80), opens what waits in pipe fd, maybe compressed:
 * looked at without taking it (the reader gets every byte). Compressed data is looked at
 * until it gives a first byte, the pipe holds 64 KiB, or the writer has gone: a reader would
 * wait for that data as well, and two looks at one pipe then always agree. */
static bool pipe_is_pickle(int fd)
{
    enum { LOOK = 64 * 1024 }; /* a pipe's buffer: more never waits in it */
    unsigned char *buf = malloc(LOOK);
    bool yes = false, known = buf == NULL;
    long wait_ns = 100000;
    while (!known) {
        size_t n = 0;
        bool ended = false;
        if (mt__zsrc_pipe_peek(fd, buf, LOOK, &n, &ended) != 0 || n == 0)
            break;
        int codec = mt__zsrc_sniff(buf, n);
        unsigned char c = 0;
        if (codec == MT__Z_NONE && (n >= 6 || ended || buf[0] == 0x80 ||
                                    (buf[0] != 0xfd && buf[0] != 0x1f && buf[0] != 0x28))) {
            yes = buf[0] == 0x80; /* (a magic's first byte waits for the rest) */
            known = true;
        } else if (codec != MT__Z_NONE && mt__zsrc_first_byte(buf, n, codec, &c) == 1) {
            yes = c == 0x80;
            known = true;
        } else if (ended || n == LOOK) {
            known = true;
        } else { /* more is due: look again soon, then less often (at most 10 ms) */
            struct timespec t = {0, wait_ns};
            nanosleep(&t, NULL);
            wait_ns = wait_ns < 10000000 ? wait_ns * 2 : wait_ns;
        }
    }
    free(buf);
    return yes;
}

bool mt__ts_is_pickle(const char *path)
{
    size_t n = strlen(path);
    if ((n > 7 && strcmp(path + n - 7, ".pickle") == 0) ||
        (n > 4 && strcmp(path + n - 4, ".pkl") == 0))
        return true;
    /* A pipe is looked into without taking its bytes, where its descriptor is known
     * ("-", <(...)); a named FIFO is not opened to look (closing it would end its writer). */
    int fd = path_fd(path);
    struct stat st;
    if (fd >= 0 ? fstat(fd, &st) != 0 : stat(path, &st) != 0)
        return false;
    if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
        return fd >= 0 && pipe_is_pickle(fd);
    if (!S_ISREG(st.st_mode))
        return false;
    char proc[40];
    if (fd >= 0) { /* standard input given a file, or <(...) of one */
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        path = proc;
    }
    unsigned char head[6];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    /* A compressed snapshot is one too (pickle.c decompresses it). */
    size_t nh = fread(head, 1, sizeof head, f);
    int codec = mt__zsrc_sniff(head, nh);
    mt__zsrc_t *z = NULL;
    unsigned char c = nh > 0 ? head[0] : 0;
    size_t got = 0;
    if (codec != MT__Z_NONE && mt__zsrc_open(&z, f, codec, head, nh) == 0 &&
        mt__zsrc_read(z, &c, 1, &got) != 0)
        got = 0;
    mt__zsrc_close(&z);
    fclose(f);
    return (codec == MT__Z_NONE ? nh > 0 : got == 1) && c == 0x80;
}
