/* Snapshots of a process from the daemon (docs/torch-snapshot.md):
 * - a snapshot's trace is the newest events (at most MT_D_SNAPSHOT_EVENTS) of the process's
 *   one recent-event buffer, the web tracker's window (web.h, MT_D_WEB_WINDOW events),
 *   which the page's history scrubbing reads too;
 * - {"type":"snapshot","pid":N} on the Unix socket answers one JSON line with the
 *   process's recent events and device segment map (what `memtrace snapshot PID` turns
 *   into a PyTorch snapshot);
 * - an OOM event makes the daemon write that snapshot into the OOM directory, as memtrace
 *   JSON and as a PyTorch snapshot: oom-<pid>-dev<d>-<n>.{json,pickle}, n counting the
 *   OOMs of that process on that device from 1, the name the allocator's OOM message gives;
 *   at most cfg.oom_max_snapshots pairs are kept (the oldest go). */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "analysis/torch_snapshot.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "memtrace/prof.h"
#include "profiler/internal.h"
#include "util/assert.h"

/* The newest events of t's window in order, gaps and stats left out, at most
 * MT_D_SNAPSHOT_EVENTS (malloc'ed, *n of them; t NULL: none). */
static mt_event_rec_t *events_of(const mt_d_web_proc_t *t, size_t *n)
{
    size_t have = t ? t->wcount : 0, take = 0, from = have;
    while (from > 0 && take < MT_D_SNAPSHOT_EVENTS) {
        const mt_event_rec_t *ev = mt__d_web_window_at(t, --from);
        take += ev->kind != MT_EV_GAP && ev->kind != MT_EV_STATS;
    }
    mt_event_rec_t *evs = malloc((take ? take : 1) * sizeof *evs);
    *n = 0;
    for (size_t i = from; evs != NULL && i < have; i++) {
        const mt_event_rec_t *ev = mt__d_web_window_at(t, i);
        if (ev->kind != MT_EV_GAP && ev->kind != MT_EV_STATS)
            evs[(*n)++] = *ev;
    }
    mt_assert(evs == NULL || *n == take);
    return evs;
}

/* ---- the reply: memtrace JSON of a process's snapshot ---- */

static json_t *hex(uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "0x%llx", (unsigned long long)v);
    return json_string(b);
}

/* {"v":1,"type":"snapshot","pid",..,"process":{..},"events":[..],"segments":[..],
 *  "blocks":[..],"tags":{"7":"kv cache"}}. New, or NULL. */
static json_t *snapshot_json(const mt_d_proc_t *p, const mt_event_rec_t *evs, size_t n)
{
    json_t *o = json_pack("{s:i, s:s, s:i, s:s, s:o}", "v", 1, "type", "snapshot", "pid", p->pid,
                          "name", p->name, "process", mt__d_proc_json(p, false));
    json_t *events = json_array(), *segs = json_array(), *blocks = json_array(),
           *tags = json_object();
    if (o == NULL || events == NULL || segs == NULL || blocks == NULL || tags == NULL)
        goto fail;
    char line[1024];
    for (size_t i = 0; i < n; i++) {
        size_t len =
            mt_prof_event_write(line, sizeof line, &evs[i], p->pid, mt__d_proc_label, (void *)p);
        json_t *e = len < sizeof line ? json_loadb(line, len, 0, NULL) : NULL;
        if (e != NULL)
            json_array_append_new(events, e);
    }
    mt_model_map_t map;
    if (mt_model_map(p->model, MT_MODEL_DEVICE, &map) == 0) {
        for (size_t i = 0; i < map.nsegs; i++) {
            const mt_model_seg_t *s = &map.segs[i];
            json_array_append_new(segs, json_pack("{s:o, s:I, s:I, s:s, s:b}", "addr", hex(s->addr),
                                                  "size", (json_int_t)s->size, "stream",
                                                  (json_int_t)s->stream, "pool",
                                                  mt_pool_name(s->pool), "expandable", s->mapped));
        }
        for (size_t i = 0; i < map.nblocks; i++) {
            const mt_model_block_t *b = &map.blocks[i];
            json_array_append_new(blocks, json_pack("{s:o, s:I, s:i, s:b}", "addr", hex(b->addr),
                                                    "size", (json_int_t)b->size, "tag_id", b->tag,
                                                    "pending", b->pending));
        }
        mt_model_map_free(&map);
    }
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++)
        if (p->labels[t][0] != '\0') {
            char k[8];
            snprintf(k, sizeof k, "%d", t);
            json_object_set_new(tags, k, json_string(p->labels[t]));
        }
    json_object_set_new(o, "events", events);
    json_object_set_new(o, "segments", segs);
    json_object_set_new(o, "blocks", blocks);
    json_object_set_new(o, "tags", tags);
    return o;
fail:
    json_decref(o);
    json_decref(events);
    json_decref(segs);
    json_decref(blocks);
    json_decref(tags);
    return NULL;
}

void mt__d_snapshot_request(mt_d_conn_t *c, json_t *msg)
{
    mt_d_t *d = c->d;
    json_t *jp = json_object_get(msg, "pid");
    const mt_d_proc_t *p = NULL;
    for (const mt_d_proc_t *q = d->procs; q != NULL && json_is_integer(jp); q = q->next)
        if (q->pid == json_integer_value(jp))
            p = q;
    json_t *reply;
    if (!json_is_integer(jp))
        reply = json_pack("{s:s}", "error", "snapshot: \"pid\" must be an integer");
    else if (p == NULL)
        reply = json_pack("{s:s, s:I}", "error", "snapshot: no such process", "pid",
                          json_integer_value(jp));
    else {
        size_t n;
        mt_event_rec_t *evs = events_of(mt__d_web_find(d, p), &n);
        reply = evs ? snapshot_json(p, evs, n) : NULL;
        free(evs);
    }
    char *s = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    json_decref(reply);
    c->kind = MT_D_CONN_DONE;
    if (s == NULL) {
        static const char oom[] = "{\"error\":\"out of memory\"}\n";
        mt__d_conn_write(c, oom, sizeof oom - 1, true);
        return;
    }
    size_t len = strlen(s);
    s[len] = '\n'; /* json_dumps's NUL becomes the line's end */
    mt__d_conn_write(c, s, len + 1, true);
    free(s);
}

/* ---- OOM snapshots ---- */

int mt_d_oom_dir(char *buf, size_t len)
{
    return mt_prof_oom_dir(buf, len); /* one rule for the daemon and the recorder */
}

static const char *proc_label(void *ud, int tag)
{
    return mt__d_proc_label(ud, tag);
}

static void write_oom_snapshot(mt_d_t *d, const mt_d_proc_t *p, const mt_d_web_proc_t *t,
                               const mt_event_rec_t *ev)
{
    if (d->oom_dir[0] == '\0')
        return;
    if (mt__oomsnap_dir_prepare(d->oom_dir) < 0) {
        mt__d_log(d, MT_LOG_WARN, "OOM snapshot of %d: %s is not a private directory of ours",
                  p->pid, d->oom_dir);
        return;
    }
    char base[600], path[640];
    snprintf(base, sizeof base, "%s/oom-%d-dev%u-%u", d->oom_dir, p->pid, ev->device,
             t->ooms[ev->device]);
    size_t n;
    mt_event_rec_t *evs = events_of(t, &n);
    json_t *j = evs ? snapshot_json(p, evs, n) : NULL;
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    int rc = text ? 0 : MT_ENOMEM;
    snprintf(path, sizeof path, "%s.json", base);
    if (rc == 0)
        rc = mt__oomsnap_write_file(path, text, strlen(text));
    /* The PyTorch snapshot: the recent events as the trace, the model's map as segments. */
    mt_model_map_t map;
    mt_ts_t *ts = NULL;
    char err[256], *pk = NULL;
    size_t pklen = 0;
    if (rc == 0 && (rc = mt_model_map(p->model, MT_MODEL_DEVICE, &map)) == 0) {
        mt_ts_source_t src = {
            .evs = evs, .nevs = n, .map = &map, .tag_name = proc_label, .ud = (void *)p};
        rc = mt_ts_from_events(&ts, &src, err, sizeof err);
        mt_model_map_free(&map);
    }
    FILE *mem = rc == 0 ? open_memstream(&pk, &pklen) : NULL;
    if (rc == 0 && mem == NULL)
        rc = MT_ENOMEM;
    if (mem != NULL) {
        rc = mt_ts_write(ts, mem, 2);
        if (fclose(mem) != 0 && rc == 0)
            rc = MT_EIO;
    }
    snprintf(path, sizeof path, "%s.pickle", base);
    if (rc == 0)
        rc = mt__oomsnap_write_file(path, pk, pklen);
    if (rc == 0)
        mt__d_log(d, MT_LOG_INFO,
                  "process %d ran out of memory on device %u: wrote %s.json and "
                  ".pickle",
                  p->pid, ev->device, base);
    else
        mt__d_log(d, MT_LOG_WARN, "OOM snapshot %s: %s", base, mt_strerror(rc));
    mt_ts_destroy(&ts);
    free(pk);
    free(text);
    json_decref(j);
    free(evs);
    mt__oomsnap_prune(d->oom_dir, d->cfg.oom_max_snapshots);
}

void mt__d_snapshot_event(mt_d_t *d, const mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    if (ev->kind != MT_EV_OOM || ev->pool == MT_POOL_HOST)
        return;
    mt_d_web_proc_t *t = mt__d_web_find(d, p);
    if (t == NULL)
        return; /* not tracked (out of memory): no events to write */
    t->ooms[ev->device]++;
    write_oom_snapshot(d, p, t, ev);
}

void mt__d_snapshot_init(mt_d_t *d)
{
    d->oom_dir[0] = '\0';
    if (d->cfg.oom_dir != NULL)
        snprintf(d->oom_dir, sizeof d->oom_dir, "%s", d->cfg.oom_dir);
    else if (mt_d_oom_dir(d->oom_dir, sizeof d->oom_dir) < 0)
        d->oom_dir[0] = '\0'; /* no home: no OOM snapshots */
    if (strcmp(d->oom_dir, "off") == 0)
        d->oom_dir[0] = '\0';
}
