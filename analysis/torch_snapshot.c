/* The snapshot model (torch_snapshot.h): building and checking (reading from a pickle:
 * torch_snapshot_read.c, with device_traces streamed: torch_snapshot_stream.c). The layout
 * is PyTorch's (torch/csrc/cuda/memory_snapshot.cpp for 2.x, the 1.13 Python binding for
 * the list of segments); docs/torch-snapshot.md lists every field. */
#include <stdlib.h>
#include <string.h>

#include "analysis/torch_snapshot_read.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "util/grow.h"

static const char *action_names[MT_TS_ACTION_COUNT] = {
    "alloc",        "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map",    "segment_unmap",  "oom",
    "snapshot",
};

uint32_t mt__ts_block_stack(const mt_ts_t *ts, const mt_ts_block_t *b)
{
    if (b->stack != 0 || b->nhistory == 0 || b->state == MT_TS_INACTIVE)
        return b->stack;
    return ts->history[b->first_history].stack;
}

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
int mt__ts_reserve(void **arr, size_t *cap, size_t need, size_t elem)
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
    if (mt__ts_reserve((void **)&ts->stacks, &ts->mem->cap_stacks, 1, sizeof *ts->stacks) < 0 ||
        mt__ts_reserve((void **)&ts->mem->stack_tag, &ts->mem->cap_stack_tag, 1, 1) < 0 ||
        mt__ts_reserve((void **)&ts->dev_first, &ts->mem->cap_dev, 1, sizeof *ts->dev_first) < 0)
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
    if (mt__ts_reserve((void **)&m->strs, &m->cap_strs, m->nstrs + 1, sizeof *m->strs) < 0)
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
int mt__ts_push_stack(mt_ts_t *ts, const mt_ts_frame_t *frames, size_t n, uint32_t *id)
{
    mt_ts_mem_t *m = ts->mem;
    if (ts->nstacks >= UINT32_MAX || ts->nframes + n >= UINT32_MAX)
        return MT_ENOMEM;
    if (mt__ts_reserve((void **)&ts->frames, &m->cap_frames, ts->nframes + n, sizeof *ts->frames) <
            0 ||
        mt__ts_reserve((void **)&ts->stacks, &m->cap_stacks, ts->nstacks + 1, sizeof *ts->stacks) <
            0 ||
        mt__ts_reserve((void **)&m->stack_tag, &m->cap_stack_tag, ts->nstacks + 1, 1) < 0)
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

int mt__ts_add_before_stack(mt_ts_t *ts)
{
    bool want = false;
    for (size_t i = 0; i < ts->nblocks && ts->nevents > 0 && !want; i++)
        want = ts->blocks[i].state == MT_TS_ACTIVE_ALLOCATED &&
               mt__ts_block_stack(ts, &ts->blocks[i]) == 0;
    if (!want || ts->before_stack != 0)
        return 0;
    mt_ts_mem_t *m = ts->mem;
    if (ts->nstacks >= UINT32_MAX ||
        mt__ts_reserve((void **)&ts->stacks, &m->cap_stacks, ts->nstacks + 1, sizeof *ts->stacks) <
            0 ||
        mt__ts_reserve((void **)&m->stack_tag, &m->cap_stack_tag, ts->nstacks + 1, 1) < 0)
        return MT_ENOMEM;
    ts->stacks[ts->nstacks] = (mt_ts_stack_t){(uint32_t)ts->nframes, 0};
    m->stack_tag[ts->nstacks] = 0xff;
    ts->before_stack = (uint32_t)ts->nstacks++;
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
        rc = mt__ts_push_stack(ts, copy, n, id);
    free(copy);
    return rc;
}

int mt__ts_add_event(mt_ts_t *ts, const mt_ts_event_t *ev)
{
    mt_ts_mem_t *m = ts->mem;
    if (ts->ndevices > 0 && ev->device + 1u < ts->ndevices)
        return MT_EINVAL; /* devices come in order */
    if (mt__ts_reserve((void **)&ts->events, &m->cap_events, ts->nevents + 1, sizeof *ts->events) <
            0 ||
        mt__ts_reserve((void **)&ts->dev_first, &m->cap_dev, ev->device + 2u,
                       sizeof *ts->dev_first) < 0)
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
    if (mt__ts_reserve((void **)&ts->segments, &m->cap_segments, ts->nsegments + 1,
                       sizeof *ts->segments) < 0 ||
        mt__ts_reserve((void **)&ts->blocks, &m->cap_blocks, ts->nblocks + nblocks,
                       sizeof *ts->blocks) < 0)
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
    if (mt__ts_reserve((void **)&ts->annotations, &ts->mem->cap_annotations, ts->nannotations + 1,
                       sizeof *ts->annotations) < 0)
        return MT_ENOMEM;
    mt_ts_annotation_t c = *a;
    if ((c.name = mt__ts_strdup(ts, a->name ? a->name : "")) == NULL)
        return MT_ENOMEM;
    ts->annotations[ts->nannotations++] = c;
    return 0;
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

/* ---- stages ---- */

static int cmp_by_name(const void *a, const void *b, void *arg)
{
    const mt_ts_t *ts = arg;
    const mt_ts_annotation_t *x = &ts->annotations[*(const size_t *)a];
    const mt_ts_annotation_t *y = &ts->annotations[*(const size_t *)b];
    int c = strcmp(x->name, y->name);
    if (c == 0)
        c = (x->device > y->device) - (x->device < y->device);
    if (c == 0)
        c = (x->time_us > y->time_us) - (x->time_us < y->time_us);
    if (c == 0)
        c = (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
    return c;
}

static int cmp_stage(const void *a, const void *b)
{
    const mt_ts_stage_t *x = a, *y = b;
    if (x->first_us != y->first_us)
        return x->first_us < y->first_us ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A file's times may be anything: the sums saturate instead of overflowing. */
static int64_t sat_add64(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

static int64_t sat_sub64(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_sub_overflow(a, b, &r) ? (b < 0 ? INT64_MAX : INT64_MIN) : r;
}

int mt__ts_stages(const mt_ts_t *ts, mt_ts_stage_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t na = ts->nannotations;
    if (na == 0)
        return 0;
    size_t *ix = malloc(na * sizeof *ix);
    mt_ts_stage_t *g = calloc(na, sizeof *g);
    if (ix == NULL || g == NULL) {
        free(ix);
        free(g);
        return MT_ENOMEM;
    }
    for (size_t i = 0; i < na; i++)
        ix[i] = i;
    qsort_r(ix, na, sizeof *ix, cmp_by_name, (void *)ts);
    size_t ng = 0;
    int depth = 0, dev = 0;
    int64_t open = 0;
    for (size_t i = 0; i < na; i++) {
        const mt_ts_annotation_t *a = &ts->annotations[ix[i]];
        if (i == 0 || strcmp(a->name, g[ng - 1].name) != 0) {
            g[ng++] = (mt_ts_stage_t){.name = a->name, .first_us = a->time_us};
            depth = 0;
            dev = a->device;
        } else if (a->device != dev) {
            depth = 0;
            dev = a->device;
        }
        mt_ts_stage_t *s = &g[ng - 1];
        if (a->time_us < s->first_us)
            s->first_us = a->time_us;
        if (a->time_us > s->last_us)
            s->last_us = a->time_us;
        if (a->start) {
            s->starts++;
            if (depth++ == 0)
                open = a->time_us;
        } else {
            s->ends++;
            if (depth > 0 && --depth == 0 && a->time_us > open)
                s->inside_us = sat_add64(s->inside_us, sat_sub64(a->time_us, open));
        }
    }
    free(ix);
    qsort(g, ng, sizeof *g, cmp_stage);
    *out = g;
    *n = ng;
    return 0;
}

const char *mt__ts_layout(const mt_ts_t *ts)
{
    return ts->era == 2 ? "2.x" : ts->list_2x ? "2.x list" : "1.13";
}
