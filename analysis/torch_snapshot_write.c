/* Writing a snapshot (torch_snapshot.h) as PyTorch lays it out: era 2, the dict of
 * torch.cuda.memory._snapshot(); era 1, the list of segments of 1.13's
 * torch.cuda.memory_snapshot() with history on blocks. Each distinct call stack is written
 * once and referenced through the memo afterwards, as pickle.dump does for shared lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/common.h"

typedef struct wr_s {
    mt__pkw_t w;
    const mt_ts_t *ts;
    uint32_t *memo; /* per stack: memo index + 1, 0 = not written yet */
} wr_t;

static void key_int(wr_t *o, const char *k, int64_t v)
{
    mt__pkw_str(&o->w, k);
    mt__pkw_int(&o->w, v);
}

static void key_u64(wr_t *o, const char *k, uint64_t v)
{
    key_int(o, k, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

static void frames(wr_t *o, uint32_t stack)
{
    mt__pkw_str(&o->w, "frames");
    if (stack == 0) {
        mt__pkw_list_begin(&o->w);
        mt__pkw_list_end(&o->w);
        return;
    }
    if (o->memo[stack] != 0) {
        mt__pkw_get(&o->w, o->memo[stack] - 1);
        return;
    }
    o->memo[stack] = mt__pkw_put_next(&o->w) + 1;
    const mt_ts_stack_t *s = &o->ts->stacks[stack];
    mt__pkw_list_begin(&o->w);
    for (uint32_t i = 0; i < s->n; i++) {
        const mt_ts_frame_t *f = &o->ts->frames[s->first + i];
        mt__pkw_dict_begin(&o->w);
        mt__pkw_str(&o->w, "name");
        mt__pkw_str(&o->w, f->name);
        mt__pkw_str(&o->w, "filename");
        mt__pkw_str(&o->w, f->filename);
        key_int(o, "line", f->line);
        mt__pkw_dict_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
}

/* 1.13: the allocations that used the block; built from the block itself when the model
 * has no history (an allocated block is one allocation). */
static void history(wr_t *o, const mt_ts_block_t *b)
{
    const mt_ts_t *ts = o->ts;
    if (b->nhistory == 0 && b->state == MT_TS_INACTIVE)
        return; /* no key: _memory_viz then shows the state and size alone */
    mt__pkw_str(&o->w, "history");
    mt__pkw_list_begin(&o->w);
    for (uint32_t i = 0; i < b->nhistory; i++) {
        const mt_ts_history_t *h = &ts->history[b->first_history + i];
        mt__pkw_dict_begin(&o->w);
        key_u64(o, "addr", h->addr);
        key_u64(o, "real_size", h->real_size);
        frames(o, h->stack);
        mt__pkw_dict_end(&o->w);
    }
    if (b->nhistory == 0) {
        mt__pkw_dict_begin(&o->w);
        key_u64(o, "addr", b->addr);
        key_u64(o, "real_size", b->requested ? b->requested : b->size);
        frames(o, b->stack);
        mt__pkw_dict_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
}

static void segment(wr_t *o, const mt_ts_segment_t *s, int era)
{
    const mt_ts_t *ts = o->ts;
    mt__pkw_dict_begin(&o->w);
    key_int(o, "device", s->device);
    key_u64(o, "address", s->addr);
    key_u64(o, "total_size", s->total_size);
    key_u64(o, "allocated_size", s->allocated_size);
    key_u64(o, "active_size", s->active_size);
    if (era == 2)
        key_u64(o, "requested_size", s->requested_size);
    key_int(o, "stream", s->stream);
    mt__pkw_str(&o->w, "segment_type");
    mt__pkw_str(&o->w, s->large ? "large" : "small");
    if (era == 2) {
        mt__pkw_str(&o->w, "segment_pool_id");
        mt__pkw_tuple_begin(&o->w);
        mt__pkw_int(&o->w, s->pool_id[0]);
        mt__pkw_int(&o->w, s->pool_id[1]);
        mt__pkw_tuple_end(&o->w);
        mt__pkw_str(&o->w, "is_expandable");
        mt__pkw_bool(&o->w, s->expandable);
        frames(o, s->stack);
    }
    mt__pkw_str(&o->w, "blocks");
    mt__pkw_list_begin(&o->w);
    for (uint32_t j = 0; j < s->nblocks; j++) {
        const mt_ts_block_t *b = &ts->blocks[s->first_block + j];
        mt__pkw_dict_begin(&o->w);
        if (era == 2)
            key_u64(o, "address", b->addr);
        key_u64(o, "size", b->size);
        if (era == 2)
            key_u64(o, "requested_size", b->requested);
        mt__pkw_str(&o->w, "state");
        mt__pkw_str(&o->w, mt__ts_state_name(b->state));
        if (era == 2)
            frames(o, b->stack);
        else
            history(o, b);
        mt__pkw_dict_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
    mt__pkw_dict_end(&o->w);
}

/* event()'s bytes built in one buffer and written at once: its dozen calls into the writer
 * per event were most of a large export's writing. Byte for byte what the writer gives
 * (tests/snapshot/test_ts_write.c holds them to it), for an event in a list whose stack is
 * none or already memoized; event() writes the rest. */
typedef struct ebuf_s {
    unsigned char b[256];
    size_t n;
} ebuf_t;

static void eb_str(ebuf_t *b, const char *s, size_t n) /* n < 256: SHORT_BINUNICODE */
{
    b->b[b->n++] = 0x8c;
    b->b[b->n++] = (unsigned char)n;
    memcpy(b->b + b->n, s, n);
    b->n += n;
}

static void eb_le(ebuf_t *b, unsigned char op, uint64_t v, size_t n)
{
    b->b[b->n++] = op;
    for (size_t i = 0; i < n; i++)
        b->b[b->n++] = (unsigned char)(v >> (8 * i));
}

/* mt__pkw_int's opcodes: BININT1, BININT2, BININT, else LONG1 with the fewest bytes. */
static void eb_int(ebuf_t *b, int64_t v)
{
    if (v >= 0 && v < 256)
        eb_le(b, 'K', (uint64_t)v, 1);
    else if (v >= 0 && v < 65536)
        eb_le(b, 'M', (uint64_t)v, 2);
    else if (v >= INT32_MIN && v <= INT32_MAX)
        eb_le(b, 'J', (uint64_t)(uint32_t)(int32_t)v, 4);
    else {
        uint64_t u = (uint64_t)v;
        size_t n = 8;
        while (n > 1 && ((v >= 0 && ((u >> (8 * (n - 1) - 1)) & 0x1ff) == 0) ||
                         (v < 0 && ((u >> (8 * (n - 1) - 1)) & 0x1ff) == 0x1ff)))
            n--;
        b->b[b->n++] = 0x8a;
        eb_le(b, (unsigned char)n, u, n);
    }
}

static void eb_key_u64(ebuf_t *b, const char *k, size_t klen, uint64_t v)
{
    eb_str(b, k, klen);
    eb_int(b, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

#define EB_KEY(b, k) eb_str(b, k, sizeof k - 1)

enum { PKW_BATCH = 1000 }; /* the writer's list batch (pickle_write.c) */

/* false: not an event this path writes (nothing written). */
static bool event_fast(wr_t *o, const mt_ts_event_t *e)
{
    mt__pkw_t *w = &o->w;
    const char *action = mt__ts_action_name(e->action);
    size_t alen = strlen(action);
    if (w->err != 0 || w->put || w->depth == 0 || w->kind[w->depth - 1] != 'l' || alen >= 64 ||
        (e->stack != 0 && o->memo[e->stack] == 0))
        return false;
    unsigned d = w->depth - 1;
    ebuf_t b = {.n = 0};
    if (w->count[d] == 0)
        b.b[b.n++] = '('; /* the list's batch opens */
    b.b[b.n++] = '}';     /* EMPTY_DICT, then its items after a MARK */
    b.b[b.n++] = '(';
    EB_KEY(&b, "action");
    eb_str(&b, action, alen);
    if (e->action == MT_TS_OOM)
        eb_key_u64(&b, "device_free", 11, e->addr);
    else
        eb_key_u64(&b, "addr", 4, e->addr);
    eb_key_u64(&b, "size", 4, e->size);
    EB_KEY(&b, "stream");
    eb_int(&b, e->stream);
    EB_KEY(&b, "time_us");
    eb_int(&b, e->time_us);
    if (e->action == MT_TS_ALLOC && e->block_size != 0)
        eb_key_u64(&b, "memtrace_size", 13, e->block_size);
    EB_KEY(&b, "frames");
    if (e->stack == 0)
        b.b[b.n++] = ']'; /* EMPTY_LIST */
    else
        eb_le(&b, 'j', o->memo[e->stack] - 1, 4); /* LONG_BINGET */
    b.b[b.n++] = 'u';                             /* SETITEMS */
    if (++w->count[d] == PKW_BATCH) {
        b.b[b.n++] = 'e'; /* APPENDS: the list's batch closes */
        w->count[d] = 0;
    }
    if (fwrite_unlocked(b.b, 1, b.n, w->f) != b.n)
        w->err = MT_EIO;
    return true;
}

static void event(wr_t *o, const mt_ts_event_t *e)
{
    if (event_fast(o, e))
        return;
    mt__pkw_dict_begin(&o->w);
    mt__pkw_str(&o->w, "action");
    mt__pkw_str(&o->w, mt__ts_action_name(e->action));
    key_u64(o, e->action == MT_TS_OOM ? "device_free" : "addr", e->addr);
    key_u64(o, "size", e->size);
    key_int(o, "stream", e->stream);
    key_int(o, "time_us", e->time_us);
    if (e->action == MT_TS_ALLOC && e->block_size != 0)
        key_u64(o, "memtrace_size", e->block_size);
    frames(o, e->stack);
    mt__pkw_dict_end(&o->w);
}

static void settings(wr_t *o)
{
    mt__pkw_str(&o->w, "allocator_settings");
    mt__pkw_dict_begin(&o->w);
    mt__pkw_str(&o->w, "PYTORCH_CUDA_ALLOC_CONF");
    mt__pkw_str(&o->w, o->ts->alloc_conf ? o->ts->alloc_conf : "");
    mt__pkw_dict_end(&o->w);
}

static void annotations(wr_t *o)
{
    mt__pkw_str(&o->w, "external_annotations");
    mt__pkw_list_begin(&o->w);
    for (size_t i = 0; i < o->ts->nannotations; i++) {
        const mt_ts_annotation_t *a = &o->ts->annotations[i];
        mt__pkw_dict_begin(&o->w);
        mt__pkw_str(&o->w, "stage");
        mt__pkw_str(&o->w, a->start ? "START" : "END");
        mt__pkw_str(&o->w, "name");
        mt__pkw_str(&o->w, a->name);
        key_int(o, "device", a->device);
        key_int(o, "time_us", a->time_us);
        mt__pkw_dict_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
}

int mt__ts_write(const mt_ts_t *ts, FILE *f, int era)
{
    if (era != 1 && era != 2)
        return MT_EINVAL;
    wr_t o = {.ts = ts, .memo = calloc(ts->nstacks ? ts->nstacks : 1, sizeof *o.memo)};
    if (o.memo == NULL)
        return MT_ENOMEM;
    mt__pkw_init(&o.w, f);
    if (era == 2) {
        mt__pkw_dict_begin(&o.w);
        mt__pkw_str(&o.w, "segments");
    }
    mt__pkw_list_begin(&o.w);
    for (size_t i = 0; i < ts->nsegments; i++)
        segment(&o, &ts->segments[i], era);
    mt__pkw_list_end(&o.w);
    if (era == 2) {
        mt__pkw_str(&o.w, "device_traces");
        mt__pkw_list_begin(&o.w);
        for (unsigned d = 0; d < ts->ndevices; d++) {
            mt__pkw_list_begin(&o.w);
            for (uint32_t i = ts->dev_first[d]; i < ts->dev_first[d + 1]; i++)
                event(&o, &ts->events[i]);
            mt__pkw_list_end(&o.w);
        }
        mt__pkw_list_end(&o.w);
        settings(&o);
        annotations(&o);
        mt__pkw_dict_end(&o.w);
    }
    int rc = mt__pkw_finish(&o.w);
    free(o.memo);
    return rc;
}
