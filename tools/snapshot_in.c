/* PyTorch memory snapshots as input to `memtrace replay`, `report` and `plot`
 * (snapshot_in.h). The model and its conversions are analysis/torch_snapshot*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "analysis/frames.h"
#include "analysis/gap.h"
#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "tools/snapshot_in.h"
#include "util/text.h"
#include "util/json.h"

/* A frame's text from the file (another program's strings), escaped (util/text.h). */
static void put_text(const char *s)
{
    char buf[MT_TEXT_ESC_SIZE(512)];
    fputs(mt__text_escape(s ? s : "?", buf, sizeof buf), stdout);
}

int mt_tool_read_snapshot(const char *prog, const char *path, mt_ts_t **out)
{
    char err[768];
    int rc = mt__ts_read(out, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return rc == MT_EPROTO ? 2 : 1;
    }
    return 0;
}

/* ---- replay ---- */

static void human(char *buf, size_t n, uint64_t bytes)
{
    mt__text_bytes((double)bytes, 2, buf, n);
}

static void row(const char *what, uint64_t theirs, uint64_t ours)
{
    char a[32], b[32];
    human(a, sizeof a, theirs);
    human(b, sizeof b, ours);
    printf("  %-22s %14s %14s", what, a, b);
    if (theirs > 0)
        printf("   (%+.1f%%)", 100.0 * ((double)ours - (double)theirs) / (double)theirs);
    putchar('\n');
}

static json_t *jb(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *device_json(unsigned d, const mt_trace_t *t, const mt_ts_figures_t *f,
                           const mt_replay_result_t *r)
{
    return json_pack("{s:i, s:{s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I}, "
                     "s:{s:o, s:o, s:f, s:o, s:I, s:I, s:I, s:I, s:I}}",
                     "device", (int)d, "pytorch", "peak_reserved_bytes", jb(f->peak_reserved),
                     "reserved_at_start_bytes", jb(f->reserved_start), "reserved_at_end_bytes",
                     jb(f->end_reserved), "peak_allocated_bytes", jb(f->peak_allocated), "allocs",
                     (json_int_t)f->allocs, "frees", (json_int_t)f->frees, "ooms",
                     (json_int_t)f->ooms, "segment_events", (json_int_t)f->segment_events,
                     "orphan_frees", (json_int_t)f->orphan_frees, "blocks_before_trace",
                     (json_int_t)f->pre_blocks, "memtrace", "peak_reserved_bytes",
                     jb(r->peak_reserved), "peak_allocated_bytes", jb(r->peak_allocated),
                     "utilization_at_peak", r->utilization_at_peak, "trace_peak_live_bytes",
                     jb(t->peak_live_bytes), "backend_malloc_calls", (json_int_t)r->backend_malloc,
                     "backend_free_calls", (json_int_t)r->backend_free, "backend_vm_map_calls",
                     (json_int_t)r->backend_map, "num_alloc_retries",
                     (json_int_t)r->num_alloc_retries, "ooms", (json_int_t)r->ooms);
}

int mt_tool_replay_snapshot(const char *path, const mt_replay_cfg_t *cfg, bool json)
{
    mt_ts_t *ts;
    int status = mt_tool_read_snapshot("memtrace replay", path, &ts);
    if (status != 0)
        return status;
    json_t *devs = json ? json_array() : NULL;
    if (!json) {
        printf("memtrace replay: %s (PyTorch snapshot, %s layout)%s\n", path, mt__ts_layout(ts),
               cfg->warmup ? ", after a warm-up pass" : "");
        if (ts->alloc_conf != NULL && ts->alloc_conf[0] != '\0')
            printf("  the run had PYTORCH_CUDA_ALLOC_CONF=%s (pass --alloc-conf to replay "
                   "with memtrace's equivalent)\n",
                   ts->alloc_conf);
        if (cfg->alloc_conf != NULL)
            printf("  memtrace alloc conf: %s\n", cfg->alloc_conf);
        if (ts->era == 1 || ts->nevents == 0)
            printf("  the snapshot has no trace (device_traces): nothing to replay; it was "
                   "recorded without _record_memory_history, or is a list of segments\n");
        if (ts->skipped_actions)
            printf("  %zu trace entries of actions memtrace does not model were skipped\n",
                   ts->skipped_actions);
    }
    for (unsigned d = 0; d < ts->ndevices && status == 0; d++) {
        mt_ts_figures_t fig;
        mt_trace_t *t = NULL;
        mt_replay_result_t res;
        char err[512];
        if (ts->dev_first[d] == ts->dev_first[d + 1])
            continue;
        int rc = mt__ts_figures(ts, d, &fig);
        if (rc == 0)
            rc = mt__ts_to_trace(ts, d, &t, err, sizeof err);
        /* Without --capacity, the sim device holds what the program reserved (as report
         * --replay's): its 8 GiB default made a 44 GiB run replay as OOMs. */
        mt_replay_cfg_t dc = *cfg;
        if (dc.capacity == 0)
            dc.capacity = mt__replay_capacity_for(fig.peak_reserved);
        if (rc == 0 && (rc = mt__replay_run(t, &dc, &res, err, sizeof err)) < 0) {
            fprintf(stderr, "memtrace replay: %s: device %u: %s\n", path, d, err);
            status = rc == MT_EINVAL ? 2 : 1;
        } else if (rc < 0) {
            fprintf(stderr, "memtrace replay: %s: device %u: out of memory\n", path, d);
            status = 1;
        }
        if (status == 0 && json)
            json_array_append_new(devs, device_json(d, t, &fig, &res));
        else if (status == 0) {
            printf("device %u: %zu allocs, %zu frees, %zu OOMs, %zu segment events", d, fig.allocs,
                   fig.frees, fig.ooms, fig.segment_events);
            if (fig.pre_blocks)
                printf("; %zu blocks live before the trace began, allocated first (%zu of them "
                       "freed in it)",
                       fig.pre_blocks, fig.orphan_frees);
            printf("\n  %-22s %14s %14s\n", "", "PyTorch", "memtrace");
            row("peak reserved", fig.peak_reserved, res.peak_reserved);
            row("peak allocated", fig.peak_allocated, res.peak_allocated);
            printf("  %-22s %14.4f\n", "memtrace utilization", res.utilization_at_peak);
            printf("  %-22s malloc %llu, free %llu, vm map %llu; retries %llu, OOMs %llu\n",
                   "memtrace backend", (unsigned long long)res.backend_malloc,
                   (unsigned long long)res.backend_free, (unsigned long long)res.backend_map,
                   (unsigned long long)res.num_alloc_retries, (unsigned long long)res.ooms);
            printf("  (PyTorch reserved: from the trace's segment events, %s at its start; "
                   "allocated: requested bytes of live blocks)\n",
                   fig.reserved_start ? "with what the segments imply was reserved" : "none");
        }
        mt__trace_free(&t);
    }
    if (json && status == 0) {
        json_t *o = json_pack("{s:s, s:s, s:i, s:s?, s:s?, s:b, s:I, s:o}", "file", path, "format",
                              "torch-snapshot", "era", ts->era, "pytorch_alloc_conf",
                              ts->alloc_conf, "alloc_conf", cfg->alloc_conf, "warmup", cfg->warmup,
                              "skipped_actions", (json_int_t)ts->skipped_actions, "devices", devs);
        devs = NULL;
        if (o == NULL || json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0)
            status = 1;
        putchar('\n');
        json_decref(o);
    }
    json_decref(devs);
    mt__ts_destroy(&ts);
    return status;
}

/* ---- report ---- */

typedef struct feed_s {
    mt__report_t *r;
    const mt_ts_t *ts;
    uint64_t seq; /* the records' own sequence numbers are replaced by one count */
    int pid;
} feed_t;

static int feed_rec(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    feed_t *f = ctx;
    mt_event_rec_t e = *ev;
    if (ev->kind == MT_EV_ALLOC && stack != 0 && stack <= MT_STACK_ID_MAX) {
        /* The block keeps the snapshot's stack id, as memtrace's own capture keeps its
         * table's: the report's gap names the stacks that pin segments by it
         * (mt_tool_inputs_json). The id names no stack of the model's table. */
        mt_event_rec_t ref = *ev;
        ref.kind = MT_EV_STACK_REF;
        ref.size = stack;
        ref.requested = 0;
        ref.seq = ++f->seq;
        int rc = mt__report_add_ref(f->r, f->pid, &ref);
        if (rc != 0)
            return rc;
    }
    e.seq = ++f->seq;
    if (flags & MT_TS_REC_BEFORE) /* the state before the trace: not among its entries read */
        return mt__report_add_ref(f->r, f->pid, &e);
    /* memtrace's tags found in the frames keep their names (docs/torch-snapshot.md). */
    return mt__report_add_event(f->r, f->pid, &e, f->ts->tag_label[e.tag]);
}

/* The process name of a snapshot: its file's name, its end kept where the report's 63 bytes
 * cut it ("...memory_ctx128_forward.pickle": runs differ at the end of their names). */
static const char *snapshot_name(const char *path, char *buf, size_t len)
{
    const char *base = strrchr(path, '/');
    base = base != NULL && base[1] != '\0' ? base + 1 : path;
    size_t n = strlen(base);
    if (len < 64)
        return base;
    const char *tail = base;
    if (n > 63) {
        tail = base + n - 60;
        while ((*tail & 0xC0) == 0x80) /* not inside a UTF-8 character */
            tail++;
    }
    char raw[64];
    snprintf(raw, sizeof raw, "%s%s", n > 63 ? "..." : "", tail);
    return mt__text_utf8(raw, buf, len); /* (a name that is not UTF-8 is still a JSON string) */
}

int mt_tool_report_snapshot(mt__report_t *r, const mt_ts_t *ts, const char *path, int pid)
{
    feed_t f = {.r = r, .ts = ts, .pid = pid};
    char err[256] = "", nb[64];
    json_t *hello = mt_prof_hello_to_json(pid, snapshot_name(path, nb, sizeof nb), 0, 0);
    char *h = NULL;
    size_t hlen = 0;
    int rc = hello ? mt__json_dumps(hello, JSON_COMPACT, &h, &hlen) : MT_ENOMEM;
    json_decref(hello);
    if (rc == 0)
        rc = mt__report_add_line(r, h, hlen, err, sizeof err);
    free(h);
    if (rc == 0 && !mt__ts_timed(ts))
        rc = mt__report_set_untimed(r, pid);
    if (rc == 0)
        rc = mt__report_set_snapshot(r, pid, mt__ts_state_only(ts),
                                     (uint64_t)mt__ts_trace_start_us(ts) * 1000u,
                                     ts->skipped_actions);
    if (rc == 0)
        rc = mt__ts_records(ts, feed_rec, &f);
    if (rc != 0)
        fprintf(stderr, "%s: %s\n", path, err[0] ? err : mt_strerror(rc));
    return rc;
}

/* ---- report and plot inputs ---- */

#include "tools/logs.h"

int mt_tool_read_inputs(mt__report_t *r, const char *prog, char *const *paths, int n,
                        unsigned long *bad, mt_tool_inputs_t *in)
{
    memset(in, 0, sizeof *in);
    int i = 0;
    while (i < n) {
        int j = i;
        while (j < n && !mt__ts_is_pickle(paths[j]))
            j++;
        /* Logs are read together: one process may be split over several of them. */
        if (j > i && mt_tool_read_logs(r, prog, paths + i, j - i, bad) != 0)
            return 1;
        if (j == n)
            break;
        if (in->n == MT_TOOL_MAX_SNAPSHOTS) {
            fprintf(stderr, "%s: more than %d snapshots\n", prog, MT_TOOL_MAX_SNAPSHOTS);
            return 2;
        }
        int status = mt_tool_read_snapshot(prog, paths[j], &in->ts[in->n]);
        if (status != 0)
            return status;
        in->path[in->n] = paths[j];
        in->n++;
        if (mt_tool_report_snapshot(r, in->ts[in->n - 1], paths[j], (int)in->n) != 0)
            return 1;
        i = j + 1;
    }
    return 0;
}

/* The frames of one stack: each {name, filename, line}, and "skipped" (the rule's reason)
 * for a frame that is not the user's. NULL without memory. */
static json_t *frames_json(const mt_ts_t *ts, uint32_t stack, const mt_fr_rules_t *rules)
{
    json_t *frames = json_array();
    if (frames == NULL || stack == 0 || stack >= ts->nstacks)
        return frames;
    const mt_ts_stack_t *s = &ts->stacks[stack];
    for (uint32_t k = 0; k < s->n; k++) {
        const mt_ts_frame_t *f = &ts->frames[s->first + k];
        mt_fr_frame_t fr;
        fr = (mt_fr_frame_t){.func = f->name, .file = f->filename, .line = f->line};
        size_t len = strlen(f->filename);
        fr.python = len > 3 && strcmp(f->filename + len - 3, ".py") == 0;
        const mt_fr_rule_t *m = mt__fr_match(rules, &fr);
        if (json_array_append_new(frames,
                                  json_pack("{s:s, s:s, s:I, s:s*}", "name", f->name, "filename",
                                            f->filename, "line", (json_int_t)f->line, "skipped",
                                            m ? m->reason : NULL)) != 0) {
            json_decref(frames);
            return NULL;
        }
    }
    return frames;
}

static json_t *sites_json(const mt_ts_t *ts, unsigned d, const mt__report_cfg_t *cfg)
{
    mt_ts_group_t *g = NULL;
    size_t ng = 0;
    uint64_t peak;
    if (mt__ts_groups_at_peak(ts, d, cfg->frames, cfg->by, &g, &ng, &peak) != 0)
        return NULL;
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < ng && i < cfg->top; i++) {
        if (json_array_append_new(
                arr, json_pack("{s:s, s:o, s:I, s:I, s:i, s:o}", "site", g[i].key, "bytes",
                               jb(g[i].bytes), "count", (json_int_t)g[i].count, "stacks",
                               (json_int_t)g[i].stacks, "user_frame", g[i].frame, "frames",
                               frames_json(ts, g[i].stack, cfg->frames))) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    mt__ts_groups_free(&g, ng);
    if (arr == NULL)
        return NULL;
    return json_pack("{s:i, s:o, s:s, s:o}", "device", (int)d, "peak_allocated_bytes", jb(peak),
                     "by", mt__fr_by_name(cfg->by), "call_sites_at_peak", arr);
}

/* The gap's pins of snapshot process number proc (peak_gap, end_gap) carry the snapshot's
 * stack ids: named here from its frames, as its call sites are. 0 or MT_ENOMEM. */
static int name_gap_pins(const mt_ts_t *ts, json_t *res, int proc, const mt__report_cfg_t *cfg)
{
    size_t i, k;
    json_t *p, *pin;
    json_array_foreach(json_object_get(res, "processes"), i, p)
    {
        if (json_integer_value(json_object_get(p, "pid")) != proc)
            continue;
        static const char *const which[] = {"peak_gap", "end_gap"};
        for (int w = 0; w < 2; w++) {
            json_array_foreach(json_object_get(json_object_get(p, which[w]), "pins"), k, pin)
            {
                uint32_t stack = (uint32_t)json_integer_value(json_object_get(pin, "stack"));
                mt_fr_frame_t fr[MT_STACK_DEPTH_MAX * 4];
                char key[1024];
                int frame;
                if (json_object_set_new(
                        pin, "site",
                        json_string(mt__ts_stack_key(ts, stack, cfg->frames, cfg->by, fr,
                                                     sizeof fr / sizeof fr[0], &frame, key,
                                                     sizeof key))) != 0 ||
                    json_object_set_new(pin, "user_frame", json_integer(frame)) != 0 ||
                    json_object_set_new(pin, "frames", frames_json(ts, stack, cfg->frames)) != 0)
                    return MT_ENOMEM;
            }
            if (mt__gap_pins_by_site(json_object_get(json_object_get(p, which[w]), "pins"),
                                     cfg->top) != 0)
                return MT_ENOMEM;
        }
    }
    return 0;
}

/* One snapshot's member of "snapshots" (mt_tool_inputs_json). NULL without memory. */
static json_t *snapshot_json(const mt_ts_t *ts, const char *path, int proc,
                             const mt__report_cfg_t *cfg)
{
    json_t *devs = json_array(), *ann = json_array();
    int bad = devs == NULL || ann == NULL;
    for (unsigned d = 0; !bad && d < mt__ts_device_count(ts); d++)
        if (mt__ts_device_used(ts, d))
            bad = json_array_append_new(devs, sites_json(ts, d, cfg)) != 0;
    for (size_t k = 0; !bad && k < ts->nannotations; k++) {
        const mt_ts_annotation_t *a = &ts->annotations[k];
        char nb[1024];
        bad = json_array_append_new(
                  ann, json_pack("{s:s, s:s, s:i, s:I}", "stage", a->start ? "START" : "END",
                                 "name", mt__text_utf8(a->name, nb, sizeof nb), "device", a->device,
                                 "time_us", (json_int_t)a->time_us)) != 0;
    }
    if (bad) {
        json_decref(devs);
        json_decref(ann);
        return NULL;
    }
    char fb[4096];
    return json_pack("{s:s, s:i, s:s, s:b, s:o, s:o}", "file", mt__text_utf8(path, fb, sizeof fb),
                     "process", proc, "layout", mt__ts_layout(ts), "state_only",
                     mt__ts_state_only(ts), "devices", devs, "annotations", ann);
}

int mt_tool_inputs_json(const mt_tool_inputs_t *in, json_t *res, const mt__report_cfg_t *cfg)
{
    if (in->n == 0)
        return 0;
    for (size_t i = 0; i < in->n; i++)
        if (name_gap_pins(in->ts[i], res, (int)i + 1, cfg) != 0)
            return MT_ENOMEM;
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < in->n; i++) {
        if (json_array_append_new(arr, snapshot_json(in->ts[i], in->path[i], (int)i + 1, cfg)) !=
            0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    return json_object_set_new(res, "snapshots", arr) != 0 ? MT_ENOMEM : 0;
}

/* ---- temporary allocations by the snapshot's frames ---- */

typedef struct temp_ctx_s {
    const mt_ts_t *ts;
    const mt__report_cfg_t *cfg;
} temp_ctx_t;

static int temp_key(void *ctx, const mt_model_temp_t *row, char *key, size_t len)
{
    temp_ctx_t *c = ctx;
    mt_fr_frame_t fr[MT_STACK_DEPTH_MAX * 4];
    int frame;
    mt__ts_stack_key(c->ts, row->key, c->cfg->frames, c->cfg->by, fr, sizeof fr / sizeof fr[0],
                     &frame, key, len);
    return 0;
}

int mt_tool_inputs_temporary(const mt_tool_inputs_t *in, mt__report_t *r, json_t *res,
                             const mt__report_cfg_t *cfg)
{
    if (cfg->by == MT_FR_BY_TAG)
        return 0; /* the report's rows by tag stand */
    json_t *procs = json_object_get(res, "processes");
    for (size_t i = 0; i < json_array_size(procs); i++) {
        json_t *p = json_array_get(procs, i);
        json_int_t pid = json_integer_value(json_object_get(p, "pid"));
        if (pid < 1 || (size_t)pid > in->n || json_object_get(p, "clock") != NULL)
            continue; /* (no clock, no lifetimes: see mt__report_set_untimed) */
        /* the report numbers processes as the inputs first name them: find this one's */
        size_t idx = SIZE_MAX;
        for (size_t k = 0; k < mt__report_process_count(r); k++) {
            int kp;
            const char *name;
            size_t events;
            if (mt__report_process(r, k, &kp, &name, &events) == 0 && kp == pid)
                idx = k;
        }
        mt_model_t *m = NULL;
        mt_model_temp_t *rows = NULL;
        size_t n = 0;
        if (idx == SIZE_MAX)
            continue;
        int rc = mt__report_model(r, idx, &m);
        if (rc == 0)
            rc = mt__model_temporary(m, MT_MODEL_DEVICE, false, &rows, &n);
        temp_ctx_t c = {in->ts[pid - 1], cfg};
        json_t *a = rc == 0 ? mt__report_temp_group(rows, n, mt__model_temp_buckets(m), temp_key,
                                                    &c, cfg->top)
                            : NULL;
        free(rows);
        mt__model_destroy(&m);
        /* the report's rows (by tag: the snapshot has no stack table) stay beside */
        json_t *tags = json_object_get(p, "temporary");
        if (tags != NULL && json_object_get(p, "temporary_by_tag") == NULL &&
            json_object_set(p, "temporary_by_tag", tags) != 0) {
            json_decref(a);
            return MT_ENOMEM;
        }
        if (a == NULL || json_object_set_new(p, "temporary", a) != 0 ||
            json_object_set_new(p, "temporary_by", json_string(mt__fr_by_name(cfg->by))) != 0)
            return MT_ENOMEM;
    }
    return 0;
}

/* Under a group's line: its stack's frames after the user's that the rules keep (all of
 * them with stacks, else the next few; none when grouped by function, file or module), or
 * every frame of the stack with --frames all. */
static void print_stack(const mt_ts_t *ts, const mt_ts_group_t *g, const mt__report_cfg_t *cfg,
                        bool stacks)
{
    if (g->stack == 0 || g->stack >= ts->nstacks || g->frame < 0)
        return;
    const mt_ts_stack_t *s = &ts->stacks[g->stack];
    bool all = mt__fr_rules_all(cfg->frames);
    if (!stacks && !all && cfg->by != MT_FR_BY_SITE)
        return;
    if (!stacks && !all && g->stacks > 1)
        return; /* several stacks: the largest one's callers would speak for all */
    unsigned shown = 0, cap = stacks || all ? UINT32_MAX : 3;
    for (uint32_t k = (uint32_t)g->frame + 1; k < s->n; k++) {
        const mt_ts_frame_t *f = &ts->frames[s->first + k];
        mt_fr_frame_t fr = {.func = f->name, .file = f->filename, .line = f->line};
        size_t len = strlen(f->filename);
        fr.python = len > 3 && strcmp(f->filename + len - 3, ".py") == 0;
        if (!all && mt__fr_match(cfg->frames, &fr) != NULL)
            continue;
        if (shown++ == cap) {
            printf("                          <- ...\n");
            break;
        }
        char site[512];
        printf("                          <- ");
        put_text(mt__fr_site(&fr, site, sizeof site));
        printf("\n");
    }
}

/* The snapshot's annotations by name, the first top of them in time (a compiled model
 * writes hundreds of the same few; --json lists each one). Seconds from the trace's start. */
static int print_stages(const mt_ts_t *ts, uint32_t top)
{
    mt_ts_stage_t *st = NULL;
    size_t n = 0;
    if (ts->nannotations == 0)
        return 0;
    if (mt__ts_stages(ts, &st, &n) != 0)
        return MT_ENOMEM;
    int64_t t0 = mt__ts_trace_start_us(ts);
    for (size_t k = 0; k < n; k++) /* annotations before the trace's first event */
        if (st[k].first_us > 0 && (t0 == 0 || st[k].first_us < t0))
            t0 = st[k].first_us;
    bool timed = t0 > 0;
    printf("  annotations: %zu, %zu names%s\n", ts->nannotations, n,
           timed ? " (seconds from the trace's start)" : " (the file has no clock)");
    printf("    %6s %6s %10s %10s %10s  name\n", "starts", "ends", "first", "last", "inside");
    for (size_t k = 0; k < n && k < top; k++) {
        const mt_ts_stage_t *g = &st[k];
        if (timed)
            printf("    %6zu %6zu %10.3f %10.3f %10.3f  ", g->starts, g->ends,
                   ((double)g->first_us - (double)t0) / 1e6,
                   ((double)g->last_us - (double)t0) / 1e6, (double)g->inside_us / 1e6);
        else
            printf("    %6zu %6zu %10s %10s %10s  ", g->starts, g->ends, "-", "-", "-");
        put_text(g->name);
        printf("\n");
    }
    if (n > top)
        printf("    ... %zu more (--top)\n", n - top);
    free(st);
    return 0;
}

int mt_tool_inputs_print(const mt_tool_inputs_t *in, const mt__report_cfg_t *cfg, bool stacks)
{
    for (size_t i = 0; i < in->n; i++) {
        const mt_ts_t *ts = in->ts[i];
        printf("\nsnapshot %s (process %zu above; PyTorch %s layout)\n", in->path[i], i + 1,
               mt__ts_layout(ts));
        bool state = mt__ts_state_only(ts);
        if (state)
            printf("  a state snapshot: segments and blocks, no allocation history (taken "
                   "without\n  torch.cuda.memory._record_memory_history); its figures are "
                   "the moment it was taken\n");
        for (unsigned d = 0; d < mt__ts_device_count(ts); d++) {
            mt_ts_group_t *g = NULL;
            size_t ng;
            uint64_t peak;
            if (!mt__ts_device_used(ts, d))
                continue;
            if (mt__ts_groups_at_peak(ts, d, cfg->frames, cfg->by, &g, &ng, &peak) != 0)
                return MT_ENOMEM;
            char b[32];
            human(b, sizeof b, peak);
            printf("  device %u: live bytes %s (%s, requested), by %s%s\n", d,
                   state ? "when the snapshot was taken" : "at the peak of allocated bytes", b,
                   mt__fr_by_name(cfg->by),
                   mt__fr_rules_all(cfg->frames) ? " (every frame: --frames all)" : "");
            for (size_t k = 0; k < ng && k < cfg->top; k++) {
                human(b, sizeof b, g[k].bytes);
                printf("    %12s %6zu  ", b, g[k].count);
                put_text(g[k].key);
                printf("\n");
                print_stack(ts, &g[k], cfg, stacks);
            }
            if (ng > cfg->top)
                printf("    ... %zu more\n", ng - cfg->top);
            mt__ts_groups_free(&g, ng);
        }
        if (print_stages(ts, cfg->top) != 0)
            return MT_ENOMEM;
    }
    return 0;
}

void mt_tool_inputs_free(mt_tool_inputs_t *in)
{
    for (size_t i = 0; i < in->n; i++)
        mt__ts_destroy(&in->ts[i]);
    in->n = 0;
}
