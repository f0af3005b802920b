/* Writing a snapshot (torch_snapshot.h) as PyTorch lays it out: era 2, the dict of
 * torch.cuda.memory._snapshot(); era 1, the list of segments of 1.13's
 * torch.cuda.memory_snapshot() with history on blocks. Each distinct call stack is written
 * once and referenced through the memo afterwards, as pickle.dump does for shared lists. */
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

static void event(wr_t *o, const mt_ts_event_t *e)
{
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
