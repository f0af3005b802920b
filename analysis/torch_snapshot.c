/* The snapshot model (torch_snapshot.h): building, reading from a pickle, checking. The
 * layout is PyTorch's (torch/csrc/cuda/memory_snapshot.cpp for 2.x, the 1.13 Python
 * binding for the list of segments); docs/torch-snapshot.md lists every field. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "util/grow.h"

/* What the model owns besides its arrays: capacities, copied strings, the pickle whose
 * strings it points into, and the tag each stack carries. */
typedef struct mt_ts_mem_s {
    size_t cap_segments, cap_blocks, cap_history, cap_events, cap_frames, cap_stacks,
        cap_annotations, cap_dev;
    char **strs;
    size_t nstrs, cap_strs;
    mt_pk_doc_t *doc;
    uint8_t *stack_tag; /* per stack: memtrace tag, 0xff none */
    size_t cap_stack_tag;
} mt_ts_mem_t;

static const char *action_names[MT_TS_ACTION_COUNT] = {
    "alloc",        "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map",    "segment_unmap",  "oom",
    "snapshot",
};

const char *mt__ts_action_name(int action)
{
    return action >= 0 && action < MT_TS_ACTION_COUNT ? action_names[action] : "unknown";
}

const char *mt__ts_state_name(int state)
{
    static const char *names[] = {"active_allocated", "active_pending_free", "inactive"};
    return state >= 0 && state <= MT_TS_INACTIVE ? names[state] : "unknown";
}

/* Grows *arr (of elem-byte entries) to hold need; MT_ENOMEM. */
static int reserve(void **arr, size_t *cap, size_t need, size_t elem)
{
    void *p = mt__grow(*arr, cap, need, elem, 16);
    if (p == NULL)
        return MT_ENOMEM;
    *arr = p;
    return 0;
}

int mt__ts_create(mt_ts_t **out)
{
    *out = NULL;
    mt_ts_t *ts = calloc(1, sizeof *ts);
    if (ts == NULL)
        return MT_ENOMEM;
    ts->era = 2;
    if ((ts->mem = calloc(1, sizeof *ts->mem)) == NULL)
        goto fail_mem;
    if (reserve((void **)&ts->stacks, &ts->mem->cap_stacks, 1, sizeof *ts->stacks) < 0 ||
        reserve((void **)&ts->mem->stack_tag, &ts->mem->cap_stack_tag, 1, 1) < 0 ||
        reserve((void **)&ts->dev_first, &ts->mem->cap_dev, 1, sizeof *ts->dev_first) < 0)
        goto fail_arrays;
    ts->stacks[0] = (mt_ts_stack_t){0, 0};
    ts->mem->stack_tag[0] = 0xff;
    ts->nstacks = 1;
    ts->dev_first[0] = 0;
    *out = ts;
    return 0;
fail_arrays:
    mt__ts_destroy(&ts);
    return MT_ENOMEM;
fail_mem:
    free(ts);
    return MT_ENOMEM;
}

void mt__ts_destroy(mt_ts_t **p)
{
    mt_ts_t *ts = *p;
    if (ts == NULL)
        return;
    free(ts->segments);
    free(ts->blocks);
    free(ts->history);
    free(ts->events);
    free(ts->dev_first);
    free(ts->frames);
    free(ts->stacks);
    free(ts->annotations);
    if (ts->mem != NULL) {
        for (size_t i = 0; i < ts->mem->nstrs; i++)
            free(ts->mem->strs[i]);
        free(ts->mem->strs);
        free(ts->mem->stack_tag);
        mt__pk_doc_destroy(&ts->mem->doc);
        free(ts->mem);
    }
    free(ts);
    *p = NULL;
}

const char *mt__ts_strdup(mt_ts_t *ts, const char *s)
{
    mt_ts_mem_t *m = ts->mem;
    if (reserve((void **)&m->strs, &m->cap_strs, m->nstrs + 1, sizeof *m->strs) < 0)
        return NULL;
    char *c = strdup(s);
    if (c != NULL)
        m->strs[m->nstrs++] = c;
    return c;
}

/* A frame "memtrace:<tag id>:tag <label>" names memtrace's tag of the allocation. */
static int frame_tag(const mt_ts_frame_t *f)
{
    if (f->filename != NULL && strcmp(f->filename, "memtrace") == 0 && f->name != NULL &&
        strncmp(f->name, "tag ", 4) == 0 && f->line >= 0 && f->line < MT_TAG_MAX)
        return (int)f->line;
    return -1;
}

/* Appends a stack of n frames (strings borrowed: the caller keeps them alive). */
static int push_stack(mt_ts_t *ts, const mt_ts_frame_t *frames, size_t n, uint32_t *id)
{
    mt_ts_mem_t *m = ts->mem;
    if (ts->nstacks >= UINT32_MAX || ts->nframes + n >= UINT32_MAX)
        return MT_ENOMEM;
    if (reserve((void **)&ts->frames, &m->cap_frames, ts->nframes + n, sizeof *ts->frames) < 0 ||
        reserve((void **)&ts->stacks, &m->cap_stacks, ts->nstacks + 1, sizeof *ts->stacks) < 0 ||
        reserve((void **)&m->stack_tag, &m->cap_stack_tag, ts->nstacks + 1, 1) < 0)
        return MT_ENOMEM;
    memcpy(ts->frames + ts->nframes, frames, n * sizeof *frames);
    ts->stacks[ts->nstacks] = (mt_ts_stack_t){(uint32_t)ts->nframes, (uint32_t)n};
    int tag = n ? frame_tag(&frames[0]) : -1;
    m->stack_tag[ts->nstacks] = tag < 0 ? 0xff : (uint8_t)tag;
    if (tag >= 0 && ts->tag_label[tag] == NULL) {
        const char *label = frames[0].name + 4;
        if ((ts->tag_label[tag] = (char *)mt__ts_strdup(ts, label)) == NULL)
            return MT_ENOMEM;
    }
    ts->nframes += n;
    *id = (uint32_t)ts->nstacks++;
    return 0;
}

static bool same_frames(const mt_ts_t *ts, uint32_t id, const mt_ts_frame_t *f, size_t n)
{
    const mt_ts_stack_t *s = &ts->stacks[id];
    if (s->n != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        const mt_ts_frame_t *g = &ts->frames[s->first + i];
        if (g->line != f[i].line || strcmp(g->name, f[i].name) != 0 ||
            strcmp(g->filename, f[i].filename) != 0)
            return false;
    }
    return true;
}

int mt__ts_add_stack(mt_ts_t *ts, const mt_ts_frame_t *frames, size_t n, uint32_t *id)
{
    *id = 0;
    if (n == 0)
        return 0;
    for (uint32_t i = 1; i < ts->nstacks; i++)
        if (same_frames(ts, i, frames, n)) {
            *id = i;
            return 0;
        }
    mt_ts_frame_t *copy = malloc(n * sizeof *copy);
    if (copy == NULL)
        return MT_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        copy[i].line = frames[i].line;
        copy[i].name = mt__ts_strdup(ts, frames[i].name ? frames[i].name : "");
        copy[i].filename = mt__ts_strdup(ts, frames[i].filename ? frames[i].filename : "");
        if (copy[i].name == NULL || copy[i].filename == NULL)
            rc = MT_ENOMEM;
    }
    if (rc == 0)
        rc = push_stack(ts, copy, n, id);
    free(copy);
    return rc;
}

int mt__ts_add_event(mt_ts_t *ts, const mt_ts_event_t *ev)
{
    mt_ts_mem_t *m = ts->mem;
    if (ts->ndevices > 0 && ev->device + 1u < ts->ndevices)
        return MT_EINVAL; /* devices come in order */
    if (reserve((void **)&ts->events, &m->cap_events, ts->nevents + 1, sizeof *ts->events) < 0 ||
        reserve((void **)&ts->dev_first, &m->cap_dev, ev->device + 2u, sizeof *ts->dev_first) < 0)
        return MT_ENOMEM;
    while (ts->ndevices < ev->device + 1u) {
        ts->dev_first[ts->ndevices + 1] = (uint32_t)ts->nevents;
        ts->ndevices++;
    }
    ts->events[ts->nevents++] = *ev;
    ts->dev_first[ts->ndevices] = (uint32_t)ts->nevents;
    return 0;
}

int mt__ts_add_segment(mt_ts_t *ts, const mt_ts_segment_t *seg, const mt_ts_block_t *blocks,
                       size_t nblocks)
{
    mt_ts_mem_t *m = ts->mem;
    if (reserve((void **)&ts->segments, &m->cap_segments, ts->nsegments + 1, sizeof *ts->segments) <
            0 ||
        reserve((void **)&ts->blocks, &m->cap_blocks, ts->nblocks + nblocks, sizeof *ts->blocks) <
            0)
        return MT_ENOMEM;
    mt_ts_segment_t s = *seg;
    s.first_block = (uint32_t)ts->nblocks;
    s.nblocks = (uint32_t)nblocks;
    for (size_t i = 0; i < nblocks; i++) {
        ts->blocks[ts->nblocks + i] = blocks[i];
        ts->blocks[ts->nblocks + i].first_history = 0;
        ts->blocks[ts->nblocks + i].nhistory = 0;
    }
    ts->nblocks += nblocks;
    ts->segments[ts->nsegments++] = s;
    return 0;
}

int mt__ts_add_annotation(mt_ts_t *ts, const mt_ts_annotation_t *a)
{
    if (reserve((void **)&ts->annotations, &ts->mem->cap_annotations, ts->nannotations + 1,
                sizeof *ts->annotations) < 0)
        return MT_ENOMEM;
    mt_ts_annotation_t c = *a;
    if ((c.name = mt__ts_strdup(ts, a->name ? a->name : "")) == NULL)
        return MT_ENOMEM;
    ts->annotations[ts->nannotations++] = c;
    return 0;
}

/* ---- reading ---- */

/* The reader's work budget: values visited (list items, dict pairs, frames lookups) per
 * byte of the file, plus a floor for small files. A pickle can refer to one list or dict
 * from many places through the memo (BINGET: 2 bytes), so a file of a few hundred KB can
 * describe 10^12 trace entries as lists of lists of one shared dict. The reader charges
 * each visit once per reference it follows; in a file pickle.dump made from a snapshot,
 * every value followed is a distinct object of at least a byte of the file, except the
 * shared frames lists, read once each (by identity) and charged 1 per reference, and the
 * shared frame dicts (a few pairs, 2 bytes per reference). 16 per byte leaves such files
 * far below the budget and bounds the model at a few hundred times the file's size. */
#define VISITS_PER_BYTE 16u
#define VISITS_FLOOR    ((uint64_t)1 << 20)

/* Where in the file a value is, for messages: "device_traces[0][17]".
 * Invariant: visits <= budget while the read goes on. */
typedef struct rd_s {
    mt_ts_t *ts;
    const char *name;
    char *err;
    size_t errlen;
    /* frames lists seen, by pickle value: the stack made of them (open addressing) */
    const mt_pk_value_t **seen;
    uint32_t *seen_id;
    size_t seen_cap, nseen;
    uint64_t visits;     /* values visited so far, shared ones once per reference */
    uint64_t budget;     /* VISITS_PER_BYTE * file bytes + VISITS_FLOOR */
    struct strm_s *strm; /* device_traces read as the pickle streams them, or NULL */
} rd_t;

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

static int get_int(rd_t *r, const mt_pk_value_t *d, const char *key, bool required, int64_t *out,
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
    int rc = get_int(r, d, key, required, &v, where);
    if (rc == 0 && v < 0)
        return bad(r, where, "'%s' is negative (%lld)", key, (long long)v);
    *out = (uint64_t)v;
    return rc;
}

static const char *get_str(rd_t *r, const mt_pk_value_t *d, const char *key, bool required,
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

static const mt_pk_value_t *get_seq(rd_t *r, const mt_pk_value_t *d, const char *key, bool required,
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
static int visit(rd_t *r, size_t n, const char *where)
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
static int want_dict(rd_t *r, const mt_pk_value_t *v, const char *where)
{
    if (v->type != MT_PK_DICT)
        return bad(r, where, "a %s, not a dict", mt__pk_type_name(v->type));
    return visit(r, v->n + 1, where);
}

static int stream_frames(rd_t *r, const mt_pk_value_t *e, const char *where, uint32_t *id);

/* The stack of a 'frames' list, made once per distinct list object. */
static int read_frames(rd_t *r, const mt_pk_value_t *d, const char *where, uint32_t *id)
{
    int rc;
    const mt_pk_value_t *fl = get_seq(r, d, "frames", false, where, &rc);
    *id = 0;
    if (rc < 0 || fl == NULL || fl->n == 0)
        return rc;
    if (r->nseen * 2 >= r->seen_cap) {
        size_t ncap = r->seen_cap ? r->seen_cap * 2 : 1024;
        const mt_pk_value_t **ns = calloc(ncap, sizeof *ns);
        uint32_t *ni = calloc(ncap, sizeof *ni);
        if (ns == NULL || ni == NULL) {
            free(ns);
            free(ni);
            return MT_ENOMEM;
        }
        for (size_t i = 0; i < r->seen_cap; i++)
            if (r->seen[i] != NULL) {
                size_t h = ((uintptr_t)r->seen[i] >> 4) * 0x9e3779b97f4a7c15ull & (ncap - 1);
                while (ns[h] != NULL)
                    h = (h + 1) & (ncap - 1);
                ns[h] = r->seen[i];
                ni[h] = r->seen_id[i];
            }
        free(r->seen);
        free(r->seen_id);
        r->seen = ns;
        r->seen_id = ni;
        r->seen_cap = ncap;
    }
    size_t h = ((uintptr_t)fl >> 4) * 0x9e3779b97f4a7c15ull & (r->seen_cap - 1);
    while (r->seen[h] != NULL) {
        if (r->seen[h] == fl) {
            *id = r->seen_id[h];
            return visit(r, 1, where);
        }
        h = (h + 1) & (r->seen_cap - 1);
    }
    if (r->strm != NULL) {
        /* Streamed events' stacks are interned by content: these join them. */
        if ((rc = stream_frames(r, d, where, id)) == 0) {
            r->seen[h] = fl;
            r->seen_id[h] = *id;
            r->nseen++;
        }
        return rc;
    }
    if ((rc = visit(r, fl->n, where)) < 0)
        return rc;
    mt_ts_frame_t stackbuf[64];
    mt_ts_frame_t *frames = fl->n <= 64 ? stackbuf : malloc(fl->n * sizeof *frames);
    if (frames == NULL)
        return MT_ENOMEM;
    char w[320];
    for (size_t i = 0; i < fl->n && rc == 0; i++) {
        const mt_pk_value_t *f = fl->u.items[i];
        snprintf(w, sizeof w, "%s.frames[%zu]", where, i);
        if ((rc = want_dict(r, f, w)) < 0)
            break;
        frames[i].name = get_str(r, f, "name", true, w, &rc);
        if (rc == 0)
            frames[i].filename = get_str(r, f, "filename", true, w, &rc);
        if (rc == 0)
            rc = get_int(r, f, "line", true, &frames[i].line, w);
    }
    if (rc == 0 && (rc = push_stack(r->ts, frames, fl->n, id)) == 0) {
        r->seen[h] = fl;
        r->seen_id[h] = *id;
        r->nseen++;
    }
    if (frames != stackbuf)
        free(frames);
    return rc;
}

static int read_state(rd_t *r, const mt_pk_value_t *b, const char *where, uint8_t *state)
{
    int rc;
    const char *s = get_str(r, b, "state", true, where, &rc);
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
    const mt_pk_value_t *h = get_seq(r, b, "history", false, where, &rc);
    mt_ts_t *ts = r->ts;
    blk->first_history = (uint32_t)ts->nhistory;
    blk->nhistory = 0;
    if (rc < 0 || h == NULL || (rc = visit(r, h->n, where)) < 0)
        return rc;
    if (reserve((void **)&ts->history, &ts->mem->cap_history, ts->nhistory + h->n,
                sizeof *ts->history) < 0)
        return MT_ENOMEM;
    char w[320];
    for (size_t i = 0; i < h->n; i++) {
        const mt_pk_value_t *e = h->u.items[i];
        mt_ts_history_t *o = &ts->history[ts->nhistory];
        snprintf(w, sizeof w, "%s.history[%zu]", where, i);
        if ((rc = want_dict(r, e, w)) < 0 || (rc = get_size(r, e, "addr", true, &o->addr, w)) < 0 ||
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
    if ((rc = want_dict(r, s, where)) < 0 ||
        (rc = get_int(r, s, "device", true, &dev, where)) < 0 ||
        (rc = get_size(r, s, "address", true, &seg.addr, where)) < 0 ||
        (rc = get_size(r, s, "total_size", true, &seg.total_size, where)) < 0 ||
        (rc = get_size(r, s, "allocated_size", false, &seg.allocated_size, where)) < 0 ||
        (rc = get_size(r, s, "active_size", false, &seg.active_size, where)) < 0 ||
        (rc = get_size(r, s, "requested_size", false, &seg.requested_size, where)) < 0 ||
        (rc = get_int(r, s, "stream", false, &seg.stream, where)) < 0 ||
        (rc = read_frames(r, s, where, &seg.stack)) < 0)
        return rc;
    if (dev < 0 || dev > 255)
        return bad(r, where, "'device' %lld is not a device ordinal (0 to 255)", (long long)dev);
    seg.device = (int)dev;
    const char *type = get_str(r, s, "segment_type", false, where, &rc);
    if (rc < 0)
        return rc;
    if (type != NULL && strcmp(type, "large") != 0 && strcmp(type, "small") != 0)
        return bad(r, where, "'segment_type' is '%.40s', not large or small", type);
    seg.large = type != NULL ? strcmp(type, "large") == 0 : seg.total_size > ((uint64_t)2 << 20);
    const mt_pk_value_t *exp = mt__pk_get(s, "is_expandable");
    seg.expandable = exp != NULL && exp->type == MT_PK_BOOL && exp->u.i;
    const mt_pk_value_t *pool = mt__pk_get(s, "segment_pool_id");
    if (pool != NULL && (pool->type == MT_PK_TUPLE || pool->type == MT_PK_LIST) && pool->n == 2)
        for (int i = 0; i < 2; i++)
            if (pool->u.items[i]->type == MT_PK_INT)
                seg.pool_id[i] = pool->u.items[i]->u.i;
    const mt_pk_value_t *bl = get_seq(r, s, "blocks", true, where, &rc);
    if (rc < 0 || (rc = visit(r, bl->n, where)) < 0)
        return rc;
    mt_ts_t *ts = r->ts;
    if (reserve((void **)&ts->blocks, &ts->mem->cap_blocks, ts->nblocks + bl->n,
                sizeof *ts->blocks) < 0 ||
        reserve((void **)&ts->segments, &ts->mem->cap_segments, ts->nsegments + 1,
                sizeof *ts->segments) < 0)
        return MT_ENOMEM;
    seg.first_block = (uint32_t)ts->nblocks;
    uint64_t addr = seg.addr;
    for (size_t i = 0; i < bl->n; i++) {
        const mt_pk_value_t *b = bl->u.items[i];
        mt_ts_block_t blk = {0};
        snprintf(w, sizeof w, "%s.blocks[%zu]", where, i);
        if ((rc = want_dict(r, b, w)) < 0 ||
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
        if (strcmp(s, action_names[a]) == 0) {
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
static int read_entry(rd_t *r, const mt_pk_value_t *e, size_t d, const char *where, bool streamed)
{
    mt_ts_t *ts = r->ts;
    int rc, action;
    mt_ts_event_t ev = {.device = (uint8_t)d, .tag = MT_TAG_OTHER};
    const char *as;
    if ((rc = want_dict(r, e, where)) < 0 ||
        (as = get_str(r, e, "action", true, where, &rc)) == NULL ||
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
        (rc = get_int(r, e, "stream", false, &ev.stream, where)) < 0 ||
        (rc = get_int(r, e, "time_us", false, &ev.time_us, where)) < 0 ||
        (rc = get_size(r, e, "memtrace_size", false, &ev.block_size, where)) < 0 ||
        (rc = streamed ? stream_frames(r, e, where, &ev.stack)
                       : read_frames(r, e, where, &ev.stack)) < 0)
        return rc;
    uint8_t tag = ts->mem->stack_tag[ev.stack];
    ev.tag = tag == 0xff ? MT_TAG_OTHER : tag;
    if (reserve((void **)&ts->events, &ts->mem->cap_events, ts->nevents + 1, sizeof *ts->events) <
        0)
        return MT_ENOMEM;
    ts->events[ts->nevents++] = ev;
    return 0;
}

static int sort_streamed(rd_t *r, size_t ndev, size_t streamed);

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
        int vrc = visit(r, tl->n, where);
        if (vrc < 0)
            return vrc;
        if (reserve((void **)&ts->events, &ts->mem->cap_events, ts->nevents + tl->n,
                    sizeof *ts->events) < 0 ||
            reserve((void **)&ts->dev_first, &ts->mem->cap_dev, d + 2, sizeof *ts->dev_first) < 0)
            return MT_ENOMEM;
        for (size_t i = 0; i < tl->n; i++) {
            snprintf(where, sizeof where, "device_traces[%zu][%zu]", d, i);
            int rc = read_entry(r, tl->u.items[i], d, where, false);
            if (rc < 0)
                return rc;
        }
        ts->dev_first[d + 1] = (uint32_t)ts->nevents;
        ts->ndevices = (unsigned)d + 1;
    }
    if (r->strm != NULL)
        return sort_streamed(r, traces->n, streamed);
    return 0;
}

/* ---- device_traces streamed (mt_pk_stream_t): entries become events as the pickle is
 * read, and their values are freed batch by batch ---- */

enum { STR_CACHE = 4096 };

typedef struct strm_s {
    rd_t *r;
    size_t lists;   /* lists streamed */
    size_t cur_dev; /* the device of the last entries, and how many it had */
    size_t cur_index;
    /* interned strings: the model's copy by content (open addressing, hash per slot) */
    const char **strs;
    uint64_t *str_hash;
    size_t str_cap, nstr;
    /* within one items call, the pickle's str values (alive until it returns) -> interned */
    const mt_pk_value_t *cache_v[STR_CACHE];
    const char *cache_s[STR_CACHE];
    uint32_t cache_gen[STR_CACHE], gen;
    /* interned stacks by their frames' (interned name, file, line) */
    uint32_t *stk;
    uint64_t *stk_hash;
    size_t stk_cap, nstk;
} strm_t;

static uint64_t hash_bytes(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int grow_table(const char ***keys, uint32_t **ids, uint64_t **hashes, size_t *cap)
{
    size_t ncap = *cap ? *cap * 2 : 4096;
    uint64_t *nh = calloc(ncap, sizeof *nh);
    const char **nk = keys ? calloc(ncap, sizeof *nk) : NULL;
    uint32_t *ni = ids ? calloc(ncap, sizeof *ni) : NULL;
    if (nh == NULL || (keys && nk == NULL) || (ids && ni == NULL)) {
        free(nh);
        free(nk);
        free(ni);
        return MT_ENOMEM;
    }
    for (size_t i = 0; i < *cap; i++) {
        bool used = keys ? (*keys)[i] != NULL : (*ids)[i] != 0;
        if (!used)
            continue;
        size_t h = (*hashes)[i] & (ncap - 1);
        while (keys ? nk[h] != NULL : ni[h] != 0)
            h = (h + 1) & (ncap - 1);
        nh[h] = (*hashes)[i];
        if (keys)
            nk[h] = (*keys)[i];
        else
            ni[h] = (*ids)[i];
    }
    free(*hashes);
    *hashes = nh;
    if (keys) {
        free(*keys);
        *keys = nk;
    } else {
        free(*ids);
        *ids = ni;
    }
    *cap = ncap;
    return 0;
}

/* The model's copy of the str value v, one per distinct content. */
static const char *intern(strm_t *st, const mt_pk_value_t *v)
{
    size_t c = ((uintptr_t)v >> 4) * 0x9e3779b97f4a7c15ull >> 52 & (STR_CACHE - 1);
    if (st->cache_gen[c] == st->gen && st->cache_v[c] == v)
        return st->cache_s[c];
    uint64_t h = hash_bytes(v->u.s, v->n, 0xcbf29ce484222325ull);
    if ((st->nstr + 1) * 2 > st->str_cap &&
        grow_table(&st->strs, NULL, &st->str_hash, &st->str_cap) < 0)
        return NULL;
    size_t i = h & (st->str_cap - 1);
    const char *s = NULL;
    for (; st->strs[i] != NULL; i = (i + 1) & (st->str_cap - 1))
        if (st->str_hash[i] == h && strlen(st->strs[i]) == v->n &&
            memcmp(st->strs[i], v->u.s, v->n) == 0) {
            s = st->strs[i];
            break;
        }
    if (s == NULL) {
        if ((s = mt__ts_strdup(st->r->ts, v->u.s)) == NULL)
            return NULL;
        st->strs[i] = s;
        st->str_hash[i] = h;
        st->nstr++;
    }
    st->cache_v[c] = v;
    st->cache_s[c] = s;
    st->cache_gen[c] = st->gen;
    return s;
}

static int intern_str(rd_t *r, const mt_pk_value_t *f, const char *key, const char *where,
                      const char **out)
{
    int rc;
    if (get_str(r, f, key, true, where, &rc) == NULL)
        return rc;
    if ((*out = intern(r->strm, mt__pk_get(f, key))) == NULL)
        return MT_ENOMEM;
    return 0;
}

/* The stack of e's frames, interned by content: the same frames in another entry (every
 * entry has lists and dicts of its own) give the same stack. */
static int stream_frames(rd_t *r, const mt_pk_value_t *e, const char *where, uint32_t *id)
{
    strm_t *st = r->strm;
    mt_ts_t *ts = r->ts;
    int rc;
    const mt_pk_value_t *fl = get_seq(r, e, "frames", false, where, &rc);
    *id = 0;
    if (rc < 0 || fl == NULL || fl->n == 0)
        return rc;
    if ((rc = visit(r, fl->n, where)) < 0)
        return rc;
    mt_ts_frame_t stackbuf[64];
    mt_ts_frame_t *frames = fl->n <= 64 ? stackbuf : malloc(fl->n * sizeof *frames);
    if (frames == NULL)
        return MT_ENOMEM;
    char w[320];
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < fl->n && rc == 0; i++) {
        const mt_pk_value_t *f = fl->u.items[i];
        /* The usual frame without formatting where it is (the checks below name it). */
        const mt_pk_value_t *nv = mt__pk_get(f, "name"), *fv = mt__pk_get(f, "filename"),
                            *lv = mt__pk_get(f, "line");
        if (f->type == MT_PK_DICT && nv != NULL && nv->type == MT_PK_STR && fv != NULL &&
            fv->type == MT_PK_STR && lv != NULL &&
            (lv->type == MT_PK_INT || lv->type == MT_PK_BOOL)) {
            if ((rc = visit(r, f->n + 1, where)) < 0)
                break;
            if ((frames[i].name = intern(st, nv)) == NULL ||
                (frames[i].filename = intern(st, fv)) == NULL) {
                rc = MT_ENOMEM;
                break;
            }
            frames[i].line = lv->u.i;
            h = hash_bytes(&frames[i], sizeof frames[i], h);
            continue;
        }
        snprintf(w, sizeof w, "%s.frames[%zu]", where ? where : "?", i);
        if ((rc = want_dict(r, f, w)) < 0 ||
            (rc = intern_str(r, f, "name", w, &frames[i].name)) < 0 ||
            (rc = intern_str(r, f, "filename", w, &frames[i].filename)) < 0 ||
            (rc = get_int(r, f, "line", true, &frames[i].line, w)) < 0)
            break;
        h = hash_bytes(&frames[i], sizeof frames[i], h);
    }
    if (rc == 0 && (st->nstk + 1) * 2 > st->stk_cap &&
        grow_table(NULL, &st->stk, &st->stk_hash, &st->stk_cap) < 0)
        rc = MT_ENOMEM;
    if (rc == 0) {
        size_t i = h & (st->stk_cap - 1);
        for (; st->stk[i] != 0; i = (i + 1) & (st->stk_cap - 1)) {
            const mt_ts_stack_t *s = &ts->stacks[st->stk[i]];
            if (st->stk_hash[i] == h && s->n == fl->n &&
                memcmp(&ts->frames[s->first], frames, fl->n * sizeof *frames) == 0) {
                *id = st->stk[i];
                break;
            }
        }
        if (*id == 0 && (rc = push_stack(ts, frames, fl->n, id)) == 0) {
            st->stk[i] = *id;
            st->stk_hash[i] = h;
            st->nstk++;
        }
    }
    if (frames != stackbuf)
        free(frames);
    return rc;
}

/* A list about to receive trace entries: device_traces[d] of the top-level dict, as
 * pickle.dump writes it (root dict, MARK, key, value, ..., 'device_traces', the list of
 * devices, [MARK,] the device lists). Gives d + 1, or 0 for any other list. */
static int stream_match(void *ud, const mt_pk_value_t *const *stack, size_t sp, size_t pos,
                        const size_t *marks, size_t nmarks)
{
    (void)ud;
    (void)sp;
    size_t outer, first;
    if (nmarks < 1 || marks[0] != 1 || stack[0]->type != MT_PK_DICT || nmarks > 2)
        return 0;
    if (nmarks == 2) {
        if (marks[1] < 3 || pos < marks[1])
            return 0;
        outer = marks[1] - 1;
        first = marks[1];
    } else {
        if (pos < 3)
            return 0;
        outer = pos - 1;
        first = pos;
    }
    const mt_pk_value_t *key = stack[outer - 1], *o = stack[outer];
    if ((outer - 1) % 2 != 1 || key->type != MT_PK_STR || strcmp(key->u.s, "device_traces") != 0 ||
        o->type != MT_PK_LIST || o->sealed)
        return 0;
    for (size_t i = first; i <= pos; i++)
        if (stack[i]->type != MT_PK_LIST)
            return 0;
    size_t d = o->n + (pos - first);
    return d > 255 ? 0 : (int)d + 1;
}

static int stream_items(void *ud, const mt_pk_value_t *list, const mt_pk_value_t *const *items,
                        size_t n)
{
    strm_t *st = ud;
    size_t d = list->streamed - 1;
    if (st->lists == 0 || d != st->cur_dev) {
        /* Devices one after the other, each list whole before the next: pickle.dump's
         * order; anything else is read without streaming. */
        if (st->lists > 0 && d < st->cur_dev)
            return MT_EAGAIN;
        st->lists++;
        st->cur_dev = d;
        st->cur_index = 0;
    }
    st->gen++;
    char where[64];
    for (size_t i = 0; i < n; i++) {
        /* where is formatted only when read_entry fails: it then reads the entry again to
         * say what is wrong and where (its first attempt changed nothing but counters). */
        int rc = read_entry(st->r, items[i], d, NULL, true);
        if (rc == MT_EPROTO) {
            snprintf(where, sizeof where, "device_traces[%zu][%zu]", d, st->cur_index);
            rc = read_entry(st->r, items[i], d, where, true);
        }
        st->cur_index++;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* After streaming: events grouped by device (streamed ones came first), dev_first. */
static int sort_streamed(rd_t *r, size_t ndev, size_t streamed)
{
    mt_ts_t *ts = r->ts;
    if (streamed != r->strm->lists)
        return MT_EAGAIN; /* a streamed list that is not in the final device_traces */
    if (reserve((void **)&ts->dev_first, &ts->mem->cap_dev, ndev + 1, sizeof *ts->dev_first) < 0)
        return MT_ENOMEM;
    memset(ts->dev_first, 0, (ndev + 1) * sizeof *ts->dev_first);
    bool sorted = true;
    for (size_t i = 0; i < ts->nevents; i++) {
        if (ts->events[i].device >= ndev)
            return MT_EAGAIN;
        if (i > 0 && ts->events[i].device < ts->events[i - 1].device)
            sorted = false;
        ts->dev_first[ts->events[i].device + 1]++;
    }
    for (size_t d = 0; d < ndev; d++)
        ts->dev_first[d + 1] += ts->dev_first[d];
    if (!sorted) {
        mt_ts_event_t *ev = malloc((ts->nevents ? ts->nevents : 1) * sizeof *ev);
        uint32_t *at = malloc((ndev + 1) * sizeof *at);
        if (ev == NULL || at == NULL) {
            free(ev);
            free(at);
            return MT_ENOMEM;
        }
        memcpy(at, ts->dev_first, (ndev + 1) * sizeof *at);
        for (size_t i = 0; i < ts->nevents; i++)
            ev[at[ts->events[i].device]++] = ts->events[i];
        memcpy(ts->events, ev, ts->nevents * sizeof *ev);
        free(ev);
        free(at);
    }
    ts->ndevices = (unsigned)ndev;
    return 0;
}

static int read_annotations(rd_t *r, const mt_pk_value_t *list)
{
    char where[64];
    int vrc = visit(r, list->n, "external_annotations");
    if (vrc < 0)
        return vrc;
    for (size_t i = 0; i < list->n; i++) {
        const mt_pk_value_t *a = list->u.items[i];
        snprintf(where, sizeof where, "external_annotations[%zu]", i);
        int rc;
        int64_t dev = 0;
        mt_ts_annotation_t an = {0};
        const char *stage;
        if ((rc = want_dict(r, a, where)) < 0 ||
            (stage = get_str(r, a, "stage", true, where, &rc)) == NULL ||
            (an.name = get_str(r, a, "name", true, where, &rc)) == NULL ||
            (rc = get_int(r, a, "device", false, &dev, where)) < 0 ||
            (rc = get_int(r, a, "time_us", false, &an.time_us, where)) < 0)
            return rc < 0 ? rc : MT_EPROTO;
        if (strcmp(stage, "START") != 0 && strcmp(stage, "END") != 0)
            return bad(r, where, "'stage' is '%.40s', not START or END", stage);
        an.start = stage[0] == 'S';
        an.device = (int)dev;
        /* The name stays in the pickle, which the model keeps. */
        mt_ts_t *ts = r->ts;
        if (reserve((void **)&ts->annotations, &ts->mem->cap_annotations, ts->nannotations + 1,
                    sizeof *ts->annotations) < 0)
            return MT_ENOMEM;
        ts->annotations[ts->nannotations++] = an;
    }
    return 0;
}

static int read_root(rd_t *r, const mt_pk_value_t *root)
{
    int rc;
    const mt_pk_value_t *segs;
    if (root->type == MT_PK_LIST) {
        r->ts->era = 1;
        segs = root;
    } else if (root->type == MT_PK_DICT) {
        r->ts->era = 2;
        if ((segs = get_seq(r, root, "segments", true, "top level", &rc)) == NULL)
            return rc;
    } else
        return bad(r, "top level",
                   "a %s; a snapshot is a dict (PyTorch 2.x) or a list of "
                   "segments (1.13)",
                   mt__pk_type_name(root->type));
    if ((rc = visit(r, segs->n, "segments")) < 0)
        return rc;
    for (size_t i = 0; i < segs->n; i++)
        if ((rc = read_segment(r, segs->u.items[i], i)) < 0)
            return rc;
    if (r->ts->era == 1)
        return 0;
    const mt_pk_value_t *traces = get_seq(r, root, "device_traces", false, "top level", &rc);
    if (rc < 0 || (traces != NULL && (rc = read_traces(r, traces)) < 0))
        return rc;
    const mt_pk_value_t *ann = get_seq(r, root, "external_annotations", false, "top level", &rc);
    if (rc < 0 || (ann != NULL && (rc = read_annotations(r, ann)) < 0))
        return rc;
    const mt_pk_value_t *settings = mt__pk_get(root, "allocator_settings");
    if (settings != NULL && settings->type == MT_PK_DICT) {
        r->ts->alloc_conf =
            get_str(r, settings, "PYTORCH_CUDA_ALLOC_CONF", false, "allocator_settings", &rc);
        if (rc < 0)
            return rc;
    }
    return 0;
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
    rc = read_root(&r, mt__pk_root(doc));
    free(r.seen);
    free(r.seen_id);
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

/* Reads with device_traces streamed: MT_EAGAIN when the file is not laid out as
 * pickle.dump writes a snapshot (the caller reads it whole instead). */
static int read_streamed(mt_ts_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return MT_EAGAIN; /* the whole read says why */
    mt_ts_t *ts;
    int rc = mt__ts_create(&ts);
    if (rc < 0) {
        snprintf(err, errlen, "%s: out of memory", path);
        return rc;
    }
    strm_t *st = calloc(1, sizeof *st);
    rd_t r = {.ts = ts,
              .name = path,
              .err = err,
              .errlen = errlen,
              .budget = (uint64_t)VISITS_PER_BYTE * (uint64_t)sb.st_size + VISITS_FLOOR,
              .strm = st};
    if (st == NULL) {
        rc = MT_ENOMEM;
        goto done;
    }
    st->r = &r;
    err[0] = '\0';
    mt_pk_stream_t stream = {.match = stream_match, .items = stream_items, .ud = st};
    char perr[512];
    mt_pk_doc_t *doc = NULL;
    rc = mt__pk_parse_file_stream(&doc, path, NULL, &stream, perr, sizeof perr);
    if (rc < 0) {
        if (err[0] == '\0' || rc == MT_EAGAIN) /* else the entry's own message */
            snprintf(err, errlen, "%s", perr);
        goto done;
    }
    ts->mem->doc = doc;
    st->gen++; /* the cache's values of the last batch are freed */
    rc = read_root(&r, mt__pk_root(doc));
    if (rc == 0 && (rc = mt__ts_check(ts, err, errlen)) < 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", err);
        snprintf(err, errlen, "%s: %s", path, msg);
    }
done:
    free(r.seen);
    free(r.seen_id);
    if (st != NULL) {
        free(st->strs);
        free(st->str_hash);
        free(st->stk);
        free(st->stk_hash);
        free(st);
    }
    if (rc < 0) {
        if (rc == MT_ENOMEM)
            snprintf(err, errlen, "%s: out of memory", path);
        mt__ts_destroy(&ts);
        return rc;
    }
    *out = ts;
    return 0;
}

int mt__ts_read(mt_ts_t **out, const char *path, char *err, size_t errlen)
{
    mt_pk_doc_t *doc;
    *out = NULL;
    int rc = read_streamed(out, path, err, errlen);
    if (rc != MT_EAGAIN)
        return rc;
    rc = mt__pk_parse_file(&doc, path, NULL, err, errlen);
    if (rc < 0)
        return rc;
    return mt__ts_from_pickle(out, doc, path, err, errlen);
}

bool mt__ts_is_pickle(const char *path)
{
    size_t n = strlen(path);
    if ((n > 7 && strcmp(path + n - 7, ".pickle") == 0) ||
        (n > 4 && strcmp(path + n - 4, ".pkl") == 0))
        return true;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    int c = fgetc(f);
    fclose(f);
    return c == 0x80;
}

/* ---- checking ---- */

int mt__ts_check(const mt_ts_t *ts, char *err, size_t errlen)
{
    if (ts->era != 1 && ts->era != 2)
        goto bad_era;
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *s = &ts->segments[i];
        if ((size_t)s->first_block + s->nblocks > ts->nblocks) {
            snprintf(err, errlen, "segments[%zu]: blocks out of range", i);
            return MT_EPROTO;
        }
        uint64_t addr = s->addr;
        for (uint32_t j = 0; j < s->nblocks; j++) {
            const mt_ts_block_t *b = &ts->blocks[s->first_block + j];
            if (b->addr != addr || b->size > s->addr + s->total_size - addr) {
                snprintf(err, errlen,
                         "segments[%zu].blocks[%u]: block at 0x%llx of %llu bytes does not "
                         "follow the previous one inside the segment (0x%llx, %llu bytes)",
                         i, j, (unsigned long long)b->addr, (unsigned long long)b->size,
                         (unsigned long long)s->addr, (unsigned long long)s->total_size);
                return MT_EPROTO;
            }
            if (b->stack >= ts->nstacks || (size_t)b->first_history + b->nhistory > ts->nhistory) {
                snprintf(err, errlen, "segments[%zu].blocks[%u]: frames out of range", i, j);
                return MT_EPROTO;
            }
            addr += b->size;
        }
        if (s->nblocks > 0 && addr != s->addr + s->total_size) {
            snprintf(err, errlen,
                     "segments[%zu]: blocks sum to %llu bytes, the segment's total_size is %llu", i,
                     (unsigned long long)(addr - s->addr), (unsigned long long)s->total_size);
            return MT_EPROTO;
        }
        if (s->allocated_size > s->total_size || s->active_size > s->total_size) {
            snprintf(err, errlen, "segments[%zu]: allocated or active size above total_size", i);
            return MT_EPROTO;
        }
    }
    for (unsigned d = 0; d < ts->ndevices; d++)
        if (ts->dev_first[d] > ts->dev_first[d + 1] || ts->dev_first[d + 1] > ts->nevents) {
            snprintf(err, errlen, "device_traces[%u]: events out of range", d);
            return MT_EPROTO;
        }
    for (size_t i = 0; i < ts->nevents; i++)
        if (ts->events[i].stack >= ts->nstacks || ts->events[i].action >= MT_TS_ACTION_COUNT) {
            snprintf(err, errlen, "event %zu: frames or action out of range", i);
            return MT_EPROTO;
        }
    for (size_t i = 0; i < ts->nstacks; i++)
        if ((size_t)ts->stacks[i].first + ts->stacks[i].n > ts->nframes) {
            snprintf(err, errlen, "stack %zu: frames out of range", i);
            return MT_EPROTO;
        }
    return 0;
bad_era:
    snprintf(err, errlen, "era %d is neither 1 nor 2", ts->era);
    return MT_EPROTO;
}
