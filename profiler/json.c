/* Telemetry documents with jansson (schema v1: docs/telemetry.md,
 * docs/telemetry.schema.json): decoding event lines (the report tool), and building the
 * rare records (hello, exit, process state, snapshots). Event lines themselves are
 * written by the one line writer, encode.c. Addresses are "0x..." strings (64-bit values
 * do not survive JavaScript numbers); byte counts are integers. */
#include "profiler/internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *hex(uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
    return json_string(buf);
}

static json_t *u64(uint64_t v)
{
    /* json_int_t is signed 64-bit; larger values (never real byte counts) saturate. */
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

/* json_object_set_new that remembers a failure instead of leaking or crashing. */
static void put(json_t *o, const char *k, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(o, k, v) != 0)
        *ok = false;
}

static json_t *finish(json_t *o, bool ok)
{
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- decoding (the inverse, for the report tool and tests) ---- */

static int name_lookup(const char *s, const char *(*namef)(int), int lo, int hi)
{
    for (int i = lo; i <= hi; i++)
        if (strcmp(namef(i), s) == 0)
            return i;
    return -1;
}

static bool get_u64(json_t *o, const char *k, uint64_t *out)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static bool get_hex(json_t *o, const char *k, uint64_t *out)
{
    const char *s = json_string_value(json_object_get(o, k));
    if (!s || strncmp(s, "0x", 2) != 0 || s[2] == '\0')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s + 2, &end, 16);
    if (*end || errno)
        return false;
    *out = v;
    return true;
}

#define BAD(field)                                                                                 \
    do {                                                                                           \
        if (err)                                                                                   \
            snprintf(err, errlen, "bad or missing \"%s\"", field);                                 \
        return MT_EPROTO;                                                                          \
    } while (0)

int mt_prof_event_from_json(const void *json, mt_event_rec_t *ev, int *pid, char *err,
                            size_t errlen)
{
    json_t *o = (json_t *)json;
    if (!json_is_object(o))
        BAD("object");
    memset(ev, 0, sizeof(*ev));
    json_t *v = json_object_get(o, "v");
    if (!json_is_integer(v) || json_integer_value(v) != MT__PROF_SCHEMA_VERSION)
        BAD("v");
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!type)
        BAD("type");
    json_t *jp = json_object_get(o, "pid");
    if (strcmp(type, "gap") == 0) {
        /* A gap announced by a consumer queue (the daemon's) names no process or seq. */
        ev->kind = MT_EV_GAP;
        if (!get_u64(o, "lost", &ev->size) || ev->size == 0)
            BAD("lost");
        if (jp && !json_is_integer(jp))
            BAD("pid");
        if (pid)
            *pid = jp ? (int)json_integer_value(jp) : -1;
        if (json_object_get(o, "seq") && !get_u64(o, "seq", &ev->seq))
            BAD("seq");
        if (json_object_get(o, "t_ns") && !get_u64(o, "t_ns", &ev->time_ns))
            BAD("t_ns");
        return 0;
    }
    if (!json_is_integer(jp))
        BAD("pid");
    if (pid)
        *pid = (int)json_integer_value(jp);
    if (!get_u64(o, "seq", &ev->seq))
        BAD("seq");
    if (!get_u64(o, "t_ns", &ev->time_ns))
        BAD("t_ns");
    if (strcmp(type, "event") != 0)
        BAD("type");
    const char *kind = json_string_value(json_object_get(o, "kind"));
    int k = kind ? name_lookup(kind, mt_event_kind_name, 1, MT_EV_KIND_COUNT - 1) : -1;
    if (k < 0 || k == MT_EV_GAP)
        BAD("kind");
    ev->kind = (uint8_t)k;
    uint64_t dev, tag, stream;
    if (!get_u64(o, "dev", &dev) || dev > UINT8_MAX)
        BAD("dev");
    ev->device = (uint8_t)dev;
    if (k == MT_EV_TAG_LABEL) {
        /* Only the id and the label: the line writer writes no figures for it. A label
         * longer than an event holds (edited by hand) is cut as the allocator cuts it. */
        const char *label = json_string_value(json_object_get(o, "label"));
        if (!label || !label[0])
            BAD("label");
        if (!get_u64(o, "tag_id", &tag) || tag < MT_TAG_USER_FIRST || tag >= MT_TAG_MAX)
            BAD("tag_id");
        mt_event_label_pack(ev, label);
        ev->tag = (uint8_t)tag;
        return 0;
    }
    if (k == MT_EV_LIBRARY_LABEL) {
        const char *label = json_string_value(json_object_get(o, "label"));
        if (!label || !label[0])
            BAD("label");
        if (!get_u64(o, "library_id", &tag) || tag == 0 || tag >= MT_TAG_MAX)
            BAD("library_id");
        mt_event_label_pack(ev, label);
        ev->tag = (uint8_t)tag;
        return 0;
    }
    if (k == MT_EV_MARK_NAMED) {
        /* The name, cut as the preload cuts it (requested stays 0), and the totals. */
        const char *name = json_string_value(json_object_get(o, "name"));
        if (!name || !name[0])
            BAD("name");
        mt_event_mark_name_pack(ev, name);
        if (!get_u64(o, "allocated", &ev->allocated))
            BAD("allocated");
        if (!get_u64(o, "reserved", &ev->reserved))
            BAD("reserved");
        return 0;
    }
    if (k == MT_EV_STACK_REF) {
        /* The stack of the alloc that follows: addr, pool, stack (in size). */
        uint64_t id;
        const char *pool = json_string_value(json_object_get(o, "pool"));
        int pl = pool ? name_lookup(pool, mt_pool_name, 0, MT_POOL_HOST) : -1;
        if (!get_hex(o, "addr", &ev->addr))
            BAD("addr");
        if (pl < 0)
            BAD("pool");
        if (!get_u64(o, "stack", &id) || id == 0 || id > UINT32_MAX)
            BAD("stack");
        ev->pool = (uint8_t)pl;
        ev->size = id;
        return 0;
    }
    if (json_object_get(o, "stack") != NULL) {
        uint64_t id;
        if (k != MT_EV_ALLOC || !get_u64(o, "stack", &id) || id == 0 || id > UINT32_MAX)
            BAD("stack");
    }
    if (k == MT_EV_MARK) {
        const char *m = json_string_value(json_object_get(o, "mark"));
        int mk = m ? name_lookup(m, mt_mark_name, 1, MT_MARK_WARMUP_END) : -1;
        if (mk < 0)
            BAD("mark");
        ev->addr = (uint64_t)mk;
    } else if (!get_hex(o, "addr", &ev->addr)) {
        BAD("addr");
    }
    if (!get_u64(o, "size", &ev->size))
        BAD("size");
    if (!get_u64(o, "requested", &ev->requested))
        BAD("requested");
    if (!get_u64(o, "allocated", &ev->allocated))
        BAD("allocated");
    if (!get_u64(o, "reserved", &ev->reserved))
        BAD("reserved");
    if (!get_u64(o, "stream", &stream) || stream > UINT32_MAX)
        BAD("stream");
    const char *pool = json_string_value(json_object_get(o, "pool"));
    int pl = pool ? name_lookup(pool, mt_pool_name, 0, MT_POOL_HOST) : -1;
    if (pl < 0)
        BAD("pool");
    if (k == MT_EV_OUTSIDE_ALLOC || k == MT_EV_OUTSIDE_FREE) {
        if (!get_u64(o, "library_id", &tag) || tag >= MT_TAG_MAX)
            BAD("library_id");
    } else if (!get_u64(o, "tag_id", &tag) || tag >= MT_TAG_MAX) {
        BAD("tag_id");
    }
    ev->stream = (uint32_t)stream;
    ev->pool = (uint8_t)pl;
    ev->tag = (uint8_t)tag;
    return 0;
}

/* ---- process state and snapshots ---- */

static json_t *stat_json(const mt_stat_t *s)
{
    return json_pack("{s:I, s:I, s:I, s:I}", "current", (json_int_t)s->current, "peak",
                     (json_int_t)s->peak, "allocated", (json_int_t)s->allocated, "freed",
                     (json_int_t)s->freed);
}

static json_t *stat3_json(const mt_stat_t s[MT_STAT_N])
{
    json_t *o = json_object();
    bool ok = o != NULL;
    if (o) {
        put(o, "all", stat_json(&s[MT_STAT_ALL]), &ok);
        put(o, "small", stat_json(&s[MT_STAT_SMALL]), &ok);
        put(o, "large", stat_json(&s[MT_STAT_LARGE]), &ok);
    }
    return o ? finish(o, ok) : NULL;
}

/* The statistics members shared by "process" and the "stats" of a snapshot. */
static bool put_stats(json_t *o, const mt_alloc_stats_t *st,
                      const char *(*tag_name)(void *ud, int tag), void *ud)
{
    bool ok = true;
    put(o, "allocated_bytes", stat3_json(st->allocated_bytes), &ok);
    put(o, "reserved_bytes", stat3_json(st->reserved_bytes), &ok);
    put(o, "active_bytes", stat3_json(st->active_bytes), &ok);
    put(o, "inactive_split_bytes", stat3_json(st->inactive_split_bytes), &ok);
    put(o, "requested_bytes", stat3_json(st->requested_bytes), &ok);
    put(o, "allocation", stat3_json(st->allocation), &ok);
    put(o, "segment", stat3_json(st->segment), &ok);
    put(o, "active", stat3_json(st->active), &ok);
    put(o, "inactive_split", stat3_json(st->inactive_split), &ok);
    json_t *tags = json_object();
    for (int t = 0; tags && t < MT_TAG_MAX; t++) {
        const mt_stat_t *a = &st->tag_allocated_bytes[t];
        if (a->current == 0 && a->peak == 0 && a->allocated == 0)
            continue;
        char tbuf[MT__PROF_TAG_LABEL_MAX];
        json_t *e = json_object();
        if (e) {
            put(e, "id", json_integer(t), &ok);
            put(e, "allocated_bytes", stat_json(a), &ok);
            put(e, "requested_bytes", stat_json(&st->tag_requested_bytes[t]), &ok);
        }
        put(tags, mt__prof_tag_label(t, tag_name, ud, tbuf), e, &ok);
    }
    put(o, "tags", tags, &ok);
    put(o, "num_alloc_retries", u64(st->num_alloc_retries), &ok);
    put(o, "num_ooms", u64(st->num_ooms), &ok);
    put(o, "num_device_alloc", u64(st->num_device_alloc), &ok);
    put(o, "num_device_free", u64(st->num_device_free), &ok);
    put(o, "num_sync_all_streams", u64(st->num_sync_all_streams), &ok);
    put(o, "oversize_allocations", stat_json(&st->oversize_allocations), &ok);
    put(o, "oversize_segments", stat_json(&st->oversize_segments), &ok);
    put(o, "max_split_size",
        json_integer(st->max_split_size >= (uint64_t)INT64_MAX ? -1
                                                               : (json_int_t)st->max_split_size),
        &ok);
    put(o, "largest_free_block", u64(st->largest_free_block), &ok);
    put(o, "total_free", u64(st->total_free), &ok);
    put(o, "utilization", json_real(st->utilization), &ok);
    put(o, "fragmentation", json_real(st->fragmentation), &ok);
    put(o, "capacity", u64(st->capacity), &ok);
    put(o, "limit", u64(st->limit), &ok);
    return ok;
}

void *mt_prof_stats_to_json(const mt_alloc_stats_t *st, int pid, int device,
                            const char *(*tag_name)(void *ud, int tag), void *ud)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    bool ok = true;
    put(o, "v", json_integer(MT__PROF_SCHEMA_VERSION), &ok);
    put(o, "type", json_string("process"), &ok);
    put(o, "pid", json_integer(pid), &ok);
    put(o, "dev", json_integer(device), &ok);
    ok = put_stats(o, st, tag_name, ud) && ok;
    return finish(o, ok);
}

static const char *block_state_name(int s)
{
    switch (s) {
    case MT_BLOCK_ACTIVE_ALLOCATED:
        return "allocated";
    case MT_BLOCK_ACTIVE_PENDING_FREE:
        return "pending_free";
    default:
        return "inactive";
    }
}

void *mt_prof_snapshot_to_json(const mt_alloc_snapshot_t *snap, int pid, int device,
                               const char *(*tag_name)(void *ud, int tag), void *ud)
{
    json_t *o = json_object();
    json_t *segs = json_array();
    json_t *stats = json_object();
    bool ok = o && segs && stats;
    for (size_t i = 0; ok && i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        json_t *js = json_object();
        json_t *blocks = json_array();
        if (!js || !blocks) {
            json_decref(js);
            json_decref(blocks);
            ok = false;
            break;
        }
        put(js, "addr", hex(s->addr), &ok);
        put(js, "size", u64(s->size), &ok);
        put(js, "pool", json_string(mt_pool_name(s->pool)), &ok);
        put(js, "stream", json_integer(s->stream), &ok);
        put(js, "expandable", json_boolean(s->expandable), &ok);
        put(js, "reserved", json_boolean(s->reserved), &ok);
        for (size_t b = 0; b < s->nblocks; b++) {
            const mt_snapshot_block_t *bl = &s->blocks[b];
            char tbuf[MT__PROF_TAG_LABEL_MAX];
            json_t *jb = json_object();
            if (!jb) {
                ok = false;
                break;
            }
            put(jb, "addr", hex(bl->addr), &ok);
            put(jb, "size", u64(bl->size), &ok);
            put(jb, "requested", u64(bl->requested), &ok);
            put(jb, "state", json_string(block_state_name(bl->state)), &ok);
            put(jb, "tag", json_string(mt__prof_tag_label(bl->tag, tag_name, ud, tbuf)), &ok);
            if (json_array_append_new(blocks, jb) != 0)
                ok = false;
        }
        put(js, "blocks", blocks, &ok);
        if (json_array_append_new(segs, js) != 0)
            ok = false;
    }
    if (!ok) {
        json_decref(o);
        json_decref(segs);
        json_decref(stats);
        return NULL;
    }
    put(o, "v", json_integer(MT__PROF_SCHEMA_VERSION), &ok);
    put(o, "type", json_string("snapshot"), &ok);
    put(o, "pid", json_integer(pid), &ok);
    put(o, "dev", json_integer(device), &ok);
    put(o, "segments", segs, &ok);
    ok = put_stats(stats, &snap->stats, tag_name, ud) && ok;
    put(o, "stats", stats, &ok);
    return finish(o, ok);
}

void *mt_prof_hello_to_json(int pid, const char *name, uint64_t start_realtime_ns,
                            uint64_t start_mono_ns)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    bool ok = true;
    put(o, "v", json_integer(MT__PROF_SCHEMA_VERSION), &ok);
    put(o, "type", json_string("hello"), &ok);
    put(o, "pid", json_integer(pid), &ok);
    put(o, "name", json_string(name ? name : ""), &ok);
    put(o, "start_realtime_ns", u64(start_realtime_ns), &ok);
    put(o, "start_mono_ns", u64(start_mono_ns), &ok);
    return finish(o, ok);
}

void *mt__prof_exit_to_json(int pid, bool clean, uint64_t emitted, uint64_t dropped, uint64_t lost,
                            uint64_t t_ns)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    bool ok = true;
    put(o, "v", json_integer(MT__PROF_SCHEMA_VERSION), &ok);
    put(o, "type", json_string("exit"), &ok);
    put(o, "pid", json_integer(pid), &ok);
    put(o, "t_ns", u64(t_ns), &ok);
    put(o, "clean", json_boolean(clean), &ok);
    put(o, "emitted", u64(emitted), &ok);
    put(o, "dropped", u64(dropped), &ok);
    put(o, "lost", u64(lost), &ok);
    return finish(o, ok);
}
