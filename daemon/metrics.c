/* memtraced: the two pull views of the state: Prometheus text exposition and /state JSON.
 *
 * Metric naming follows the Prometheus conventions: memtrace_ prefix, base units in the
 * name (_bytes, _ratio), counters end in _total, every family has # HELP and # TYPE, and
 * labels stay low-cardinality (pid, tag, state; rank and job_id, one each per process, when
 * its hello gave them: not "job", which Prometheus sets on every target and would rename
 * ours to exported_job). A pid registered twice (a program with
 * two allocators, or pid reuse) is reported once, by its newest registration, so that no
 * series is duplicated. */
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "daemon/internal.h"

/* The newest registration of its pid? Older ones are shadowed in /metrics. */
static bool newest(const mt_d_proc_t *p)
{
    for (const mt_d_proc_t *q = p->next; q; q = q->next)
        if (q->pid == p->pid)
            return false;
    return true;
}

/* A label value as the text format wants it: backslash, double quote and line feed
 * escaped (a user's tag label may hold any of them). */
static int label_value(mt_d_buf_t *o, const char *s)
{
    for (; *s && !o->err; s++) {
        if (*s == '\\' || *s == '"')
            mt__d_buf_printf(o, "\\%c", *s);
        else if (*s == '\n')
            mt__d_buf_append(o, "\\n", 2);
        else
            mt__d_buf_append(o, s, 1);
    }
    return o->err;
}

/* For metrics_info.c: the same rules for its families. */
bool mt__d_proc_newest(const mt_d_proc_t *p)
{
    return newest(p);
}

int mt__d_label_value(mt_d_buf_t *o, const char *s)
{
    return label_value(o, s);
}

int mt__d_proc_labels(mt_d_buf_t *o, const mt_d_proc_t *p)
{
    mt__d_buf_printf(o, "pid=\"%d\"", p->pid);
    if (p->job.rank >= 0)
        mt__d_buf_printf(o, ",rank=\"%d\"", p->job.rank);
    if (p->job.id[0]) {
        /* sanitized by the hello's reader already; escaped all the same, as every value */
        mt__d_buf_append(o, ",job_id=\"", 9);
        label_value(o, p->job.id);
        mt__d_buf_append(o, "\"", 1);
    }
    return o->err;
}

typedef enum {
    F_ALLOC,
    F_RES,
    F_PEAK,
    F_PEAK_RES,
    F_UTIL,
    F_FRAG,
    F_FREE,
    F_LFB,
    F_HOST_ALLOC,
    F_HOST_RES,
    F_HOST_PEAK,
    F_HOST_PEAK_RES,
} field_e;

typedef struct family_s {
    const char *name, *type, *help;
} family_t;

static const family_t proc_families[] = {
    [F_ALLOC] = {"memtrace_allocated_bytes", "gauge",
                 "Device bytes handed out by the process's allocators (rounded block sizes); "
                 "pinned host memory is memtrace_host_allocated_bytes."},
    [F_RES] = {"memtrace_reserved_bytes", "gauge",
               "Bytes the process's allocators hold from the device (segments, mapped pages)."},
    [F_PEAK] = {"memtrace_peak_allocated_bytes", "gauge",
                "Highest device allocated bytes seen by the daemon for the process."},
    [F_PEAK_RES] = {"memtrace_peak_reserved_bytes", "gauge",
                    "Highest device reserved bytes seen by the daemon for the process."},
    [F_UTIL] = {"memtrace_utilization_ratio", "gauge",
                "Allocated over reserved bytes (1 when nothing is reserved)."},
    [F_FRAG] = {"memtrace_fragmentation_ratio", "gauge",
                "1 - largest free block / total free bytes inside reserved memory."},
    [F_FREE] = {"memtrace_free_bytes", "gauge",
                "Reserved bytes not covered by a live block (cached free space)."},
    [F_LFB] = {"memtrace_largest_free_block_bytes", "gauge",
               "Largest contiguous free piece of reserved memory."},
    [F_HOST_ALLOC] = {"memtrace_host_allocated_bytes", "gauge",
                      "Pinned host bytes handed out by the process's pinned host caches."},
    [F_HOST_RES] = {"memtrace_host_reserved_bytes", "gauge",
                    "Pinned host bytes the process's pinned host caches hold (page-locked)."},
    [F_HOST_PEAK] = {"memtrace_host_peak_allocated_bytes", "gauge",
                     "Highest pinned host allocated bytes seen by the daemon for the process."},
    [F_HOST_PEAK_RES] = {"memtrace_host_peak_reserved_bytes", "gauge",
                         "Highest pinned host reserved bytes seen by the daemon for the process."},
};

static int family_head(mt_d_buf_t *o, const char *name, const char *type, const char *help)
{
    return mt__d_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int mt__d_metrics_text(mt_d_t *d, mt_d_buf_t *o)
{
    unsigned running = 0, exited = 0;
    for (const mt_d_proc_t *p = d->procs; p; p = p->next)
        p->exited ? exited++ : running++;
    family_head(o, "memtrace_processes", "gauge", "Processes known to the daemon.");
    mt__d_buf_printf(o, "memtrace_processes{state=\"running\"} %u\n", running);
    mt__d_buf_printf(o, "memtrace_processes{state=\"exited\"} %u\n", exited);

    for (size_t f = 0; f < sizeof proc_families / sizeof proc_families[0]; f++) {
        family_head(o, proc_families[f].name, proc_families[f].type, proc_families[f].help);
        for (const mt_d_proc_t *p = d->procs; p; p = p->next) {
            if (!newest(p))
                continue;
            mt_model_figures_t fd, fh;
            if (f == F_FRAG || f == F_FREE || f == F_LFB)
                mt__model_figures(p->model, MT_MODEL_DEVICE, &fd);
            else
                mt__model_figures_totals(p->model, MT_MODEL_DEVICE, &fd);
            mt__model_figures_totals(p->model, MT_MODEL_HOST, &fh);
            uint64_t v = 0;
            bool ratio = false;
            double r = 0;
            switch ((field_e)f) {
            case F_ALLOC:
                v = fd.allocated;
                break;
            case F_RES:
                v = fd.reserved;
                break;
            case F_PEAK:
                v = fd.peak_allocated;
                break;
            case F_PEAK_RES:
                v = fd.peak_reserved;
                break;
            case F_UTIL:
                ratio = true, r = fd.utilization;
                break;
            case F_FRAG:
                ratio = true, r = fd.fragmentation;
                break;
            case F_FREE:
                v = fd.total_free;
                break;
            case F_LFB:
                v = fd.largest_free;
                break;
            case F_HOST_ALLOC:
                v = fh.allocated;
                break;
            case F_HOST_RES:
                v = fh.reserved;
                break;
            case F_HOST_PEAK:
                v = fh.peak_allocated;
                break;
            case F_HOST_PEAK_RES:
                v = fh.peak_reserved;
                break;
            }
            mt__d_buf_printf(o, "%s{", proc_families[f].name);
            mt__d_proc_labels(o, p);
            if (ratio)
                mt__d_buf_printf(o, "} %.6g\n", r);
            else
                mt__d_buf_printf(o, "} %" PRIu64 "\n", v);
        }
    }

    static const char *tag_fam[2][2] = {
        {"memtrace_tag_allocated_bytes", "Device bytes allocated with this tag, by process."},
        {"memtrace_tag_peak_bytes", "Highest device bytes allocated with this tag, by process."},
    };
    for (int f = 0; f < 2; f++) {
        family_head(o, tag_fam[f][0], "gauge", tag_fam[f][1]);
        for (const mt_d_proc_t *p = d->procs; p; p = p->next) {
            if (!newest(p))
                continue;
            for (int t = 0; t < MT_TAG_MAX; t++) {
                mt_model_tag_t tg;
                mt__model_tag(p->model, MT_MODEL_DEVICE, t, &tg);
                if (!tg.peak)
                    continue;
                char nb[16];
                mt__d_buf_printf(o, "%s{", tag_fam[f][0]);
                mt__d_proc_labels(o, p);
                mt__d_buf_append(o, ",tag=\"", 6);
                label_value(o, mt__d_tag_name(p, t, nb, sizeof nb));
                mt__d_buf_printf(o, "\"} %" PRIu64 "\n", f == 0 ? tg.bytes : tg.peak);
            }
        }
    }

    static const char *ctr_fam[3][2] = {
        {"memtrace_events_total", "Events received from the process."},
        {"memtrace_events_dropped_total",
         "Events the process recorded but the daemon never received (full ring)."},
        {"memtrace_ooms_total", "Out-of-memory failures reported by the process."},
    };
    for (int f = 0; f < 3; f++) {
        family_head(o, ctr_fam[f][0], "counter", ctr_fam[f][1]);
        for (const mt_d_proc_t *p = d->procs; p; p = p->next) {
            if (!newest(p))
                continue;
            uint64_t v = f == 0 ? p->events : f == 1 ? p->dropped : p->ooms;
            mt__d_buf_printf(o, "%s{", ctr_fam[f][0]);
            mt__d_proc_labels(o, p);
            mt__d_buf_printf(o, "} %" PRIu64 "\n", v);
        }
    }

    mt__d_metrics_info(d, o); /* names, devices, pools: metrics_info.c */

    unsigned consumers = 0;
    for (const mt_d_conn_t *c = d->conns; c; c = c->next)
        consumers += !c->closing && (c->kind == MT_D_CONN_CONSUMER || c->kind == MT_D_CONN_SSE);
    family_head(o, "memtrace_consumers", "gauge", "Connected consumers (Unix and SSE).");
    mt__d_buf_printf(o, "memtrace_consumers %u\n", consumers);
    family_head(o, "memtrace_daemon_events_total", "counter",
                "Events received by the daemon from every process.");
    mt__d_buf_printf(o, "memtrace_daemon_events_total %" PRIu64 "\n", d->ctr.events);
    family_head(o, "memtrace_consumer_events_dropped_total", "counter",
                "Events dropped from slow consumers' queues.");
    mt__d_buf_printf(o, "memtrace_consumer_events_dropped_total %" PRIu64 "\n",
                     d->ctr.consumer_drops);
    family_head(o, "memtrace_rejected_connections_total", "counter",
                "Connections and requests refused (bad input, wrong uid, limits).");
    mt__d_buf_printf(o, "memtrace_rejected_connections_total %" PRIu64 "\n", d->ctr.rejected);
    family_head(o, "memtrace_daemon_oom_snapshots_total", "counter",
                "OOMs by what became of their snapshot: written, suppressed (at most one "
                "per interval per process, or the queue full), failed.");
    mt__d_buf_printf(o,
                     "memtrace_daemon_oom_snapshots_total{result=\"written\"} %" PRIu64 "\n"
                     "memtrace_daemon_oom_snapshots_total{result=\"suppressed\"} %" PRIu64 "\n"
                     "memtrace_daemon_oom_snapshots_total{result=\"failed\"} %" PRIu64 "\n",
                     d->ctr.oom_snapshots, d->ctr.oom_snapshots_suppressed,
                     d->ctr.oom_snapshots_failed);
    return o->err;
}

json_t *mt__d_state_json(mt_d_t *d)
{
    json_t *procs = json_array();
    json_t *o = json_pack("{s:i,s:s}", "v", 1, "type", "state");
    if (!procs || !o) {
        json_decref(procs);
        json_decref(o);
        return NULL;
    }
    for (const mt_d_proc_t *p = d->procs; p; p = p->next) {
        json_t *j = mt__d_proc_json(p, true);
        if (!j || json_array_append_new(procs, j) != 0) {
            json_decref(procs);
            json_decref(o);
            return NULL;
        }
    }
    unsigned consumers = 0;
    for (const mt_d_conn_t *c = d->conns; c; c = c->next)
        consumers += !c->closing && (c->kind == MT_D_CONN_CONSUMER || c->kind == MT_D_CONN_SSE);
    /* Both steal their value, also when they fail: a document short of a member is none. */
    int bad = json_object_set_new(
        o, "daemon",
        json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:i,s:I,s:b}", "pid", (int)getpid(),
                  "start_realtime_ns", (json_int_t)d->start_realtime, "events",
                  (json_int_t)d->ctr.events, "producer_dropped", (json_int_t)d->ctr.producer_drops,
                  "consumer_dropped", (json_int_t)d->ctr.consumer_drops, "producers",
                  (json_int_t)d->ctr.producers, "rejected", (json_int_t)d->ctr.rejected,
                  "consumers", (int)consumers, "max_exited", (json_int_t)d->cfg.max_exited,
                  "recorded", d->recorded));
    bad |= json_object_set_new(o, "processes", procs);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
