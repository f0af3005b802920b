/* Device memory outside the allocator in `memtrace report` (docs/outside.md): per device with a
 * figure from the driver (MT_EV_DEVICE), its used bytes split into memtrace's reserved bytes,
 * each library's, the context and what no event names ("not seen"), at the end of the log and
 * at the moment the device's used bytes peaked; and each OOM with the same split at that
 * moment (the allocator sends the device's figure right before its OOM event).
 *
 * The split is the model's (mt__model_outside); this file only keeps it at the moments the
 * report names while the process's events are replayed. */
#include <stdlib.h>
#include <string.h>

#include "analysis/report.h"

/* The OOMs listed per process, the first ones (the count is always given). */
#define OOMS_LISTED 16

/* One device's split at one moment, with each library's bytes then (by library id). */
typedef struct split_s {
    unsigned device;
    mt_model_outside_t s;
    uint64_t lib[MT_TAG_MAX]; /* bytes held outside by library id at that moment */
} split_t;

typedef struct oom_s {
    uint64_t t_ns, requested, free_bytes;
    unsigned device;
    bool known; /* the device had a figure: s is its split at the OOM */
    mt_model_outside_t s;
} oom_t;

/* Invariants: peak[0..npeak) strictly increasing by device, npeak <= cappeak; device d has
 * an entry iff d had a figure, its s.used the highest used seen on d, first reached;
 * nooms <= OOMS_LISTED, nooms <= ooms; oom holds OOMS_LISTED entries once an OOM came (NULL
 * before). Both arrays are made when needed: a job's ranks are thousands of these. */
struct mt__report_outside_s {
    split_t *peak;
    size_t npeak, cappeak;
    oom_t *oom;
    size_t nooms;
    uint64_t ooms; /* MT_EV_OOM events seen */
};

int mt__report_outside_create(mt__report_outside_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : MT_ENOMEM;
}

void mt__report_outside_destroy(mt__report_outside_t **po)
{
    if (po == NULL || *po == NULL)
        return;
    free((*po)->peak);
    free((*po)->oom);
    free(*po);
    *po = NULL;
}

/* The index of the first entry of peak whose device is >= d (npeak: none). */
static size_t peak_lower(const mt__report_outside_t *o, unsigned d)
{
    size_t lo = 0, hi = o->npeak;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->peak[mid].device < d)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Device d's entry, or NULL. */
static const split_t *peak_of(const mt__report_outside_t *o, unsigned d)
{
    size_t i = peak_lower(o, d);
    return i < o->npeak && o->peak[i].device == d ? &o->peak[i] : NULL;
}

/* Device d's entry, zeroed when new; NULL without memory. */
static split_t *peak_get(mt__report_outside_t *o, unsigned d)
{
    size_t i = peak_lower(o, d);
    if (i < o->npeak && o->peak[i].device == d)
        return &o->peak[i];
    if (o->npeak == o->cappeak) {
        size_t cap = o->cappeak ? 2 * o->cappeak : 2;
        split_t *v = realloc(o->peak, cap * sizeof *v);
        if (v == NULL)
            return NULL;
        o->peak = v;
        o->cappeak = cap;
    }
    memmove(&o->peak[i + 1], &o->peak[i], (o->npeak - i) * sizeof *o->peak);
    o->peak[i] = (split_t){.device = d};
    o->npeak++;
    return &o->peak[i];
}

/* Device d's split now; false when d has no figure yet. */
static bool split_now(const mt_model_t *m, unsigned d, mt_model_outside_t *out)
{
    mt_model_outside_t all[256];
    size_t n = mt__model_outside(m, all, 256);
    for (size_t i = 0; i < n && i < 256; i++)
        if (all[i].device == d) {
            *out = all[i];
            return true;
        }
    return false;
}

static void libs_now(const mt_model_t *m, unsigned d, uint64_t lib[MT_TAG_MAX])
{
    mt_model_library_t rows[MT_TAG_MAX];
    size_t n = mt__model_outside_libraries(m, d, rows, MT_TAG_MAX);
    memset(lib, 0, MT_TAG_MAX * sizeof lib[0]);
    for (size_t i = 0; i < n && i < MT_TAG_MAX; i++)
        lib[rows[i].id % MT_TAG_MAX] = rows[i].bytes;
}

int mt__report_outside_step(mt__report_outside_t *o, const mt_model_t *m, const mt_event_rec_t *ev)
{
    unsigned d = ev->device;
    if (ev->kind == MT_EV_OOM) {
        if (o->oom == NULL && (o->oom = calloc(OOMS_LISTED, sizeof *o->oom)) == NULL)
            return MT_ENOMEM;
        o->ooms++;
        if (o->nooms < OOMS_LISTED) {
            oom_t *x = &o->oom[o->nooms++];
            *x = (oom_t){.t_ns = ev->time_ns,
                         .requested = ev->requested,
                         .free_bytes = ev->size,
                         .device = d};
            x->known = split_now(m, d, &x->s);
        }
        return 0;
    }
    if (ev->kind != MT_EV_DEVICE)
        return 0;
    const split_t *was = peak_of(o, d);
    if (was != NULL && ev->size <= was->s.used)
        return 0;
    split_t *pk = peak_get(o, d);
    if (pk == NULL)
        return MT_ENOMEM;
    if (!split_now(m, d, &pk->s))
        return 0; /* not reached: the event just applied gave d its figure */
    libs_now(m, d, pk->lib);
    return 0;
}

/* JSON integers are signed: a figure above INT64_MAX is written as INT64_MAX. */
static json_int_t ji(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v;
}

static json_t *split_json(const mt_model_outside_t *s)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "used", ji(s->used), "reserved",
                     ji(s->reserved), "outside", ji(s->outside), "libraries", ji(s->libraries),
                     "context", ji(s->context), "other_processes", ji(s->other_processes),
                     "not_seen", ji(s->not_seen));
}

/* Device d's libraries: each one's bytes at the end, its peak, and its bytes at d's peak of
 * used, largest at the end first. */
static json_t *libraries_json(const mt_model_t *m, unsigned d, const split_t *pk)
{
    mt_model_library_t rows[MT_TAG_MAX];
    size_t n = mt__model_outside_libraries(m, d, rows, MT_TAG_MAX);
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n && i < MT_TAG_MAX; i++)
        if (json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:I}", "library", rows[i].name,
                                               "bytes", ji(rows[i].bytes), "peak", ji(rows[i].peak),
                                               "at_peak_used",
                                               ji(pk->lib[rows[i].id % MT_TAG_MAX]))) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *devices_json(const mt__report_outside_t *o, const mt_model_t *m)
{
    mt_model_outside_t all[256];
    size_t n = mt__model_outside(m, all, 256);
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n && i < 256; i++) {
        const mt_model_outside_t *e = &all[i];
        const split_t *pk = peak_of(o, e->device);
        if (pk == NULL)
            continue; /* not reached: every figure the model has went through step */
        if (json_array_append_new(a, json_pack("{s:i, s:I, s:I, s:o, s:o, s:o}", "device",
                                               (int)e->device, "total", ji(e->total), "peak_used",
                                               ji(e->peak_used), "end", split_json(e),
                                               "at_peak_used", split_json(&pk->s), "libraries",
                                               libraries_json(m, e->device, pk))) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *ooms_json(const mt__report_outside_t *o, uint64_t t0)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < o->nooms; i++) {
        const oom_t *x = &o->oom[i];
        json_t *e = json_pack(
            "{s:f, s:i, s:I, s:I}", "t", x->t_ns >= t0 ? (double)(x->t_ns - t0) / 1e9 : 0.0,
            "device", (int)x->device, "requested", ji(x->requested), "free", ji(x->free_bytes));
        if (e != NULL && x->known && json_object_set_new(e, "device_memory", split_json(&x->s)))
            json_decref(e), e = NULL;
        if (e == NULL || json_array_append_new(a, e) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return json_pack("{s:I, s:o}", "count", ji(o->ooms), "first", a);
}

int mt__report_outside_json(const mt__report_outside_t *o, const mt_model_t *m, uint64_t t0,
                            json_t *res)
{
    if (mt__model_outside(m, NULL, 0) > 0 &&
        json_object_set_new(res, "device_memory", devices_json(o, m)) != 0)
        return MT_ENOMEM;
    if (o->ooms > 0 && json_object_set_new(res, "ooms", ooms_json(o, t0)) != 0)
        return MT_ENOMEM;
    return 0;
}
