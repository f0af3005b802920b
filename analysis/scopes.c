/* Scoped statistics from the stream's named marks (scopes.h). */
#include "analysis/scopes.h"

#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

/* JSON integers are signed: a figure above INT64_MAX is written as INT64_MAX. */
static json_int_t ji(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v;
}

void mt__scopes_init(mt_scopes_t *s)
{
    memset(s, 0, sizeof *s);
}

void mt__scopes_fini(mt_scopes_t *s)
{
    free(s->open);
    free(s->rows);
    memset(s, 0, sizeof *s);
}

static int close_scope(mt_scopes_t *s, size_t k, uint64_t t)
{
    /* The scopes above k close with it: their peaks are within its time. */
    for (size_t j = s->nopen - 1; j > k; j--)
        if (s->open[j].peak > s->open[k].peak)
            s->open[k].peak = s->open[j].peak;
    uint64_t rel = s->open[k].peak - s->open[k].start;
    uint64_t ns = t >= s->open[k].t ? t - s->open[k].t : 0;
    if (k > 0 && s->open[k].peak > s->open[k - 1].peak) /* the parent's time holds it */
        s->open[k - 1].peak = s->open[k].peak;
    char name[MT_EVENT_LABEL_MAX + 1];
    memcpy(name, s->open[k].name, sizeof name);
    s->nopen = k;
    mt_scope_row_t *r = NULL;
    for (size_t i = 0; i < s->nrows && r == NULL; i++)
        if (strcmp(s->rows[i].name, name) == 0)
            r = &s->rows[i];
    if (r == NULL) {
        if (s->nrows == MT_SCOPES_NAMES_MAX) {
            s->dropped++;
            return 0;
        }
        if (s->nrows == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 8;
            mt_scope_row_t *v = realloc(s->rows, cap * sizeof *v);
            if (v == NULL)
                return MT_ENOMEM;
            s->rows = v;
            s->cap = cap;
        }
        r = &s->rows[s->nrows++];
        memset(r, 0, sizeof *r);
        memcpy(r->name, name, sizeof r->name);
    }
    r->count++;
    r->peak_max = rel > r->peak_max ? rel : r->peak_max;
    r->peak_sum += rel;
    r->ns_sum += ns;
    return 0;
}

int mt__scopes_event(mt_scopes_t *s, const mt_event_rec_t *ev, uint64_t allocated)
{
    if (s->nopen > 0 && allocated > s->open[s->nopen - 1].peak)
        s->open[s->nopen - 1].peak = allocated;
    if (ev->kind != MT_EV_MARK_NAMED)
        return 0;
    char name[MT_EVENT_LABEL_MAX + 1];
    mt_event_label_unpack(ev, name);
    if (name[0] == '/') {
        for (size_t k = s->nopen; k-- > 0;)
            if (strcmp(s->open[k].name, name + 1) == 0)
                return close_scope(s, k, ev->time_ns);
        s->unmatched++;
        return 0;
    }
    if (s->nopen == MT_SCOPES_OPEN_MAX) { /* the outermost, a mark that is no scope likely */
        memmove(&s->open[0], &s->open[1], (MT_SCOPES_OPEN_MAX - 1) * sizeof s->open[0]);
        s->nopen--;
        s->dropped++;
    }
    if (s->nopen == s->capopen) {
        size_t cap = s->capopen ? 2 * s->capopen : 4;
        mt_scope_open_t *v = realloc(s->open, cap * sizeof *v);
        if (v == NULL)
            return MT_ENOMEM;
        s->open = v;
        s->capopen = cap;
    }
    size_t k = s->nopen++;
    memcpy(s->open[k].name, name, sizeof name);
    s->open[k].start = s->open[k].peak = allocated;
    s->open[k].t = ev->time_ns;
    return 0;
}

json_t *mt__scopes_json(const mt_scopes_t *sc)
{
    if (sc == NULL || sc->nrows == 0)
        return NULL;
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < sc->nrows; i++) {
        const mt_scope_row_t *r = &sc->rows[i];
        json_t *e =
            json_pack("{s:s, s:I, s:I, s:I, s:f}", "name", r->name, "count", ji(r->count),
                      "peak_bytes", ji(r->peak_max), "mean_peak_bytes", ji(r->peak_sum / r->count),
                      "mean_seconds", (double)r->ns_sum / (double)r->count / 1e9);
        if (e == NULL || json_array_append_new(a, e) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}
