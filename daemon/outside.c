/* memtraced: device memory outside the allocator (docs/outside.md) in /metrics and /state.
 *
 * The split of each device's used bytes is the model's (mt__model_outside): reserved +
 * libraries + context + not_seen = used. Nothing here computes a part; this file only names
 * the model's figures for the two views:
 *   memtrace_device_used_bytes{pid,device}, memtrace_device_total_bytes{pid,device}
 *   memtrace_device_outside_allocator_bytes{pid,device,library}: one series per library the
 *       process reported (its bytes now, 0 once it gave them back), "unnamed" for id 0, and
 *       "context" and "not_seen", the model's parts.
 *   /state: each process's "outside", one object per device with a figure.
 * Cardinality: per process and device with a figure, 2 + at most MT_TAG_MAX series. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/internal.h"
#include "util/text.h"

#define MAX_DEVICES 256

/* Could s be taken for a part's name or for another library's default name? */
static bool reserved_name(const char *s)
{
    if (strcmp(s, "context") == 0 || strcmp(s, "not_seen") == 0 || strcmp(s, "unnamed") == 0 ||
        strcmp(s, "other_processes") == 0)
        return true;
    if (strncmp(s, "library", 7) != 0)
        return false;
    for (s += 7; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* A library's name as a series label and a /state name: the model's, unless it is not clean
 * text, could be taken for a part or another library's default name, or an earlier row of
 * the same device has it (hostile or cut names): then "library<id>", so that every series
 * stays unique. Id 0 is the model's "unnamed". */
static const char *lib_label(const mt_model_library_t *rows, size_t i, char *buf, size_t n)
{
    const char *s = rows[i].name;
    if (rows[i].id == 0)
        return s;
    bool ok = mt__text_is_clean(s) && !reserved_name(s) && strcmp(s, "library?") != 0;
    for (size_t j = 0; ok && j < i; j++)
        ok = strcmp(s, rows[j].name) != 0;
    if (ok)
        return s;
    snprintf(buf, n, "library%u", rows[i].id);
    return buf;
}

static void head(mt_d_buf_t *o, const char *name, const char *help)
{
    mt__d_buf_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

static void series(mt_d_buf_t *o, const char *name, const mt_d_proc_t *p, unsigned dev,
                   const char *library, uint64_t v)
{
    mt__d_buf_printf(o, "%s{", name);
    mt__d_proc_labels(o, p);
    mt__d_buf_printf(o, ",device=\"%u\"", dev);
    if (library) {
        mt__d_buf_append(o, ",library=\"", 10);
        mt__d_label_value(o, library);
        mt__d_buf_append(o, "\"", 1);
    }
    mt__d_buf_printf(o, "} %" PRIu64 "\n", v);
}

int mt__d_metrics_outside(mt_d_t *d, mt_d_buf_t *o)
{
    static const char *const fam[3][2] = {
        {"memtrace_device_used_bytes",
         "Device bytes in use as the driver reports them (total - free, every process on the "
         "device), at the process's latest figure."},
        {"memtrace_device_total_bytes", "Device bytes in all, as the driver reports them."},
        {"memtrace_device_outside_allocator_bytes",
         "Device bytes in use outside the process's allocators, by part: one series per "
         "library that reported what it took (unnamed: no name given), context (in use before "
         "the first allocation), other_processes (where the driver tells this process's own "
         "bytes: NVML) and not_seen (the rest: unreported libraries; other processes too "
         "where the driver does not tell). Summed over library and added to "
         "memtrace_device_reserved_bytes (summed "
         "over device: memtrace_reserved_bytes) they make memtrace_device_used_bytes."},
    };
    mt_model_outside_t out[MAX_DEVICES];
    for (int f = 0; f < 3 && !o->err; f++) {
        head(o, fam[f][0], fam[f][1]);
        for (const mt_d_proc_t *p = d->procs; p && !o->err; p = p->next) {
            if (!mt__d_proc_newest(p))
                continue;
            size_t n = mt__model_outside(p->model, out, MAX_DEVICES);
            for (size_t i = 0; i < n && i < MAX_DEVICES; i++) {
                const mt_model_outside_t *x = &out[i];
                if (f < 2) {
                    series(o, fam[f][0], p, x->device, NULL, f == 0 ? x->used : x->total);
                    continue;
                }
                mt_model_library_t rows[MT_TAG_MAX];
                size_t nl = mt__model_outside_libraries(p->model, x->device, rows, MT_TAG_MAX);
                for (size_t k = 0; k < nl && k < MT_TAG_MAX; k++) {
                    char nb[24];
                    series(o, fam[f][0], p, x->device, lib_label(rows, k, nb, sizeof nb),
                           rows[k].bytes);
                }
                series(o, fam[f][0], p, x->device, "context", x->context);
                if (x->self_known)
                    series(o, fam[f][0], p, x->device, "other_processes", x->other_processes);
                series(o, fam[f][0], p, x->device, "not_seen", x->not_seen);
            }
        }
    }
    return o->err;
}

/* JSON integers are signed: a figure above INT64_MAX is written as INT64_MAX. */
static json_t *ju(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v);
}

static json_t *device_json(const mt_d_proc_t *p, const mt_model_outside_t *x)
{
    mt_model_library_t rows[MT_TAG_MAX];
    size_t nl = mt__model_outside_libraries(p->model, x->device, rows, MT_TAG_MAX);
    json_t *libs = json_array();
    for (size_t k = 0; libs && k < nl && k < MT_TAG_MAX; k++) {
        char nb[24];
        if (json_array_append_new(libs,
                                  json_pack("{s:i,s:s,s:o,s:o}", "id", (int)rows[k].id, "name",
                                            lib_label(rows, k, nb, sizeof nb), "bytes",
                                            ju(rows[k].bytes), "peak", ju(rows[k].peak))) != 0) {
            json_decref(libs);
            return NULL;
        }
    }
    /* json_pack steals libs, also when it fails (o: a NULL reference is an error);
     * other_processes is null where the driver does not tell this process's bytes. */
    return json_pack("{s:i,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "device", (int)x->device,
                     "used", ju(x->used), "total", ju(x->total), "peak_used", ju(x->peak_used),
                     "reserved", ju(x->reserved), "outside", ju(x->outside), "libraries_total",
                     ju(x->libraries), "libraries", libs, "context", ju(x->context),
                     "other_processes", x->self_known ? ju(x->other_processes) : json_null(),
                     "not_seen", ju(x->not_seen));
}

json_t *mt__d_outside_json(const mt_d_proc_t *p)
{
    mt_model_outside_t out[MAX_DEVICES];
    size_t n = mt__model_outside(p->model, out, MAX_DEVICES);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n && i < MAX_DEVICES; i++)
        if (json_array_append_new(a, device_json(p, &out[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}
