/* Two report results compared (diff.h). Rows are gathered by key into one table per
 * dimension (sites, tags), both sides at once, then ranked by how much they changed. */
#include "analysis/diff.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

mt_diff_cfg_t mt__diff_cfg_default(void)
{
    return (mt_diff_cfg_t){.max_peak_growth_pct = -1, .max_site_growth = -1};
}

/* ---- rows by key ---- */

enum { BEFORE = 0, AFTER = 1 };

typedef struct row_s {
    const char *key;   /* borrowed from the table's index */
    int64_t peak[2];   /* bytes live at the peak, by side */
    int64_t nfreed[2]; /* bytes never freed, by side */
    bool seen[2];      /* the side names the key at all */
} row_t;

/* Invariant: index maps each key to its position in rows + 1 (as a JSON integer). */
typedef struct table_s {
    row_t *rows;
    size_t n, cap;
    json_t *index;
} table_t;

static row_t *row_get(table_t *t, const char *key)
{
    json_t *at = json_object_get(t->index, key);
    if (at != NULL)
        return &t->rows[json_integer_value(at) - 1];
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        row_t *v = realloc(t->rows, cap * sizeof *v);
        if (v == NULL)
            return NULL;
        t->rows = v;
        t->cap = cap;
    }
    if (json_object_set_new(t->index, key, json_integer((json_int_t)t->n + 1)) != 0)
        return NULL;
    row_t *r = &t->rows[t->n++];
    memset(r, 0, sizeof *r);
    /* the index's copy of the key lives as long as the table */
    r->key = json_object_iter_key(json_object_iter_at(t->index, key));
    return r;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    return b > 0 && a > INT64_MAX - b ? INT64_MAX : a + b;
}

static int64_t jnum(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? json_integer_value(v) : (int64_t)json_number_value(v);
}

/* Adds bytes to key's figure (peak or never freed) of side. 0 or MT_ENOMEM. */
static int add(table_t *t, const char *key, int side, bool never_freed, int64_t bytes)
{
    if (key == NULL)
        return 0;
    row_t *r = row_get(t, key);
    if (r == NULL)
        return MT_ENOMEM;
    r->seen[side] = true;
    int64_t *f = never_freed ? &r->nfreed[side] : &r->peak[side];
    *f = sat_add(*f, bytes > 0 ? bytes : 0);
    return 0;
}

static int add_rows(table_t *t, const json_t *rows, const char *key, const char *bytes, int side,
                    bool never_freed)
{
    size_t i;
    json_t *r;
    int rc = 0;
    json_array_foreach(rows, i, r)
    {
        rc = rc ? rc
                : add(t, json_string_value(json_object_get(r, key)), side, never_freed,
                      jnum(r, bytes));
    }
    return rc;
}

/* ---- one side ---- */

typedef struct totals_s {
    int64_t peak_allocated, peak_reserved, final_allocated, final_reserved;
} totals_t;

/* Whether process pid is a snapshot's: its sites are the snapshot's own rows. */
static bool is_snapshot_process(const json_t *res, json_int_t pid)
{
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(res, "snapshots"), i, s)
    {
        if (json_integer_value(json_object_get(s, "process")) == pid)
            return true;
    }
    return false;
}

const char *const mt__diff_process_members[] = {"pid",
                                                "peak_allocated",
                                                "peak_reserved",
                                                "final_allocated",
                                                "final_reserved",
                                                "peak_by_tag",
                                                "never_freed",
                                                "callsites",
                                                NULL};

/* (the members read of each process are mt__diff_process_members) */
static int add_side(const json_t *res, int side, table_t *sites, table_t *tags, totals_t *tot)
{
    int rc = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(res, "processes"), i, p)
    {
        tot->peak_allocated = sat_add(tot->peak_allocated, jnum(p, "peak_allocated"));
        tot->peak_reserved = sat_add(tot->peak_reserved, jnum(p, "peak_reserved"));
        tot->final_allocated = sat_add(tot->final_allocated, jnum(p, "final_allocated"));
        tot->final_reserved = sat_add(tot->final_reserved, jnum(p, "final_reserved"));
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(p, "peak_by_tag"), k, v)
        {
            rc = rc ? rc : add(tags, k, side, false, json_integer_value(v));
        }
        json_t *nf = json_object_get(p, "never_freed");
        rc = rc ? rc : add_rows(tags, json_object_get(nf, "groups"), "tag", "bytes", side, true);
        json_t *cs = json_object_get(p, "callsites");
        if (cs == NULL || is_snapshot_process(res, json_integer_value(json_object_get(p, "pid"))))
            continue;
        rc =
            rc ? rc : add_rows(sites, json_object_get(cs, "at_peak"), "site", "bytes", side, false);
        rc = rc ? rc
                : add_rows(sites, json_object_get(cs, "never_freed"), "site", "bytes", side, true);
    }
    json_t *s;
    json_array_foreach(json_object_get(res, "snapshots"), i, s)
    {
        size_t d;
        json_t *dev;
        json_array_foreach(json_object_get(s, "devices"), d, dev)
        {
            rc = rc ? rc
                    : add_rows(sites, json_object_get(dev, "call_sites_at_peak"), "site", "bytes",
                               side, false);
        }
    }
    return rc;
}

/* ---- the result ---- */

static const char *status_of(const row_t *r)
{
    bool b = r->peak[BEFORE] > 0 || r->nfreed[BEFORE] > 0;
    bool a = r->peak[AFTER] > 0 || r->nfreed[AFTER] > 0;
    if (!b && a)
        return "new";
    if (b && !a)
        return "gone";
    if (r->peak[AFTER] > r->peak[BEFORE] || r->nfreed[AFTER] > r->nfreed[BEFORE])
        return "grew";
    if (r->peak[AFTER] < r->peak[BEFORE] || r->nfreed[AFTER] < r->nfreed[BEFORE])
        return "shrank";
    return "same";
}

static int64_t change(const row_t *r)
{
    int64_t d = r->peak[AFTER] - r->peak[BEFORE], e = r->nfreed[AFTER] - r->nfreed[BEFORE];
    d = d < 0 ? -d : d;
    e = e < 0 ? -e : e;
    return d > e ? d : e;
}

static int cmp_row(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    int64_t cx = change(x), cy = change(y);
    if (cx != cy)
        return cx > cy ? -1 : 1;
    return strcmp(x->key, y->key);
}

static json_t *figure(int64_t before, int64_t after)
{
    double pct = before > 0 ? 100.0 * ((double)after - (double)before) / (double)before
                            : (after > 0 ? INFINITY : 0.0);
    json_t *o = json_pack("{s:I, s:I, s:I}", "before", (json_int_t)before, "after",
                          (json_int_t)after, "delta", (json_int_t)(after - before));
    /* JSON has no infinity: growth from nothing has no percentage (null). */
    if (o != NULL &&
        json_object_set_new(o, "growth_pct", isfinite(pct) ? json_real(pct) : json_null()) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *rows_json(table_t *t)
{
    if (t->n > 0) /* (no rows: rows may be NULL, which qsort must not be given) */
        qsort(t->rows, t->n, sizeof *t->rows, cmp_row);
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < t->n; i++) {
        const row_t *r = &t->rows[i];
        if (json_array_append_new(
                a, json_pack("{s:s, s:I, s:I, s:I, s:s, s:I, s:I}", "key", r->key, "before",
                             (json_int_t)r->peak[BEFORE], "after", (json_int_t)r->peak[AFTER],
                             "delta", (json_int_t)(r->peak[AFTER] - r->peak[BEFORE]), "status",
                             status_of(r), "never_freed_before", (json_int_t)r->nfreed[BEFORE],
                             "never_freed_after", (json_int_t)r->nfreed[AFTER])) != 0) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

/* Keys of the sites in one of the summary lists. */
typedef enum list_e { L_NEW, L_GREW, L_GONE, L_FREED_NOW, L_NEVER_FREED_NOW, L_N } list_e;

static bool in_list(const row_t *r, int l)
{
    switch (l) {
    case L_NEW:
        return strcmp(status_of(r), "new") == 0;
    case L_GREW:
        return r->peak[BEFORE] > 0 && r->peak[AFTER] > r->peak[BEFORE];
    case L_GONE:
        return strcmp(status_of(r), "gone") == 0;
    case L_FREED_NOW: /* a site of both runs that no longer keeps memory to the end */
        return r->nfreed[BEFORE] > 0 && r->nfreed[AFTER] == 0 && r->peak[AFTER] > 0;
    default: /* a site of both runs that now keeps memory to the end (a new one is "new") */
        return r->nfreed[BEFORE] == 0 && r->nfreed[AFTER] > 0 && r->peak[BEFORE] > 0;
    }
}

static json_t *gates(const mt_diff_cfg_t *cfg, const totals_t *tb, const totals_t *ta,
                     const table_t *sites, int *crossed)
{
    json_t *g = json_array();
    if (g == NULL)
        return NULL;
    if (cfg->max_peak_growth_pct >= 0) {
        double pct = tb->peak_allocated > 0
                         ? 100.0 * ((double)ta->peak_allocated - (double)tb->peak_allocated) /
                               (double)tb->peak_allocated
                         : (ta->peak_allocated > 0 ? INFINITY : 0.0);
        bool over = pct > cfg->max_peak_growth_pct;
        *crossed += over;
        if (json_array_append_new(g, json_pack("{s:s, s:f, s:o, s:b, s:s}", "gate",
                                               "max_peak_growth_pct", "limit",
                                               cfg->max_peak_growth_pct, "value",
                                               isfinite(pct) ? json_real(pct) : json_null(),
                                               "crossed", over, "what", "peak allocated")) != 0)
            goto fail;
    }
    if (cfg->max_site_growth >= 0) {
        const row_t *worst = NULL;
        for (size_t i = 0; i < sites->n; i++) {
            const row_t *r = &sites->rows[i];
            if (worst == NULL ||
                r->peak[AFTER] - r->peak[BEFORE] > worst->peak[AFTER] - worst->peak[BEFORE])
                worst = r;
        }
        int64_t grew = worst ? worst->peak[AFTER] - worst->peak[BEFORE] : 0;
        bool over = grew > cfg->max_site_growth;
        *crossed += over;
        if (json_array_append_new(
                g, json_pack("{s:s, s:I, s:I, s:b, s:s}", "gate", "max_site_growth_bytes", "limit",
                             (json_int_t)cfg->max_site_growth, "value", (json_int_t)grew, "crossed",
                             over, "what", worst ? worst->key : "")) != 0)
            goto fail;
    }
    return g;
fail:
    json_decref(g);
    return NULL;
}

int mt__diff_reports(const json_t *before, const json_t *after, const mt_diff_cfg_t *cfg,
                     json_t **out, int *crossed)
{
    *out = NULL;
    int ncrossed = 0, rc = MT_ENOMEM;
    mt_diff_cfg_t c = cfg ? *cfg : mt__diff_cfg_default();
    table_t sites = {.index = json_object()}, tags = {.index = json_object()};
    totals_t tot[2] = {{0}};
    json_t *lists[L_N] = {0}, *res = NULL;
    if (sites.index == NULL || tags.index == NULL ||
        add_side(before, BEFORE, &sites, &tags, &tot[BEFORE]) != 0 ||
        add_side(after, AFTER, &sites, &tags, &tot[AFTER]) != 0)
        goto done;
    /* Gates read the table in gathering order; the lists in ranked order, after rows_json. */
    json_t *g = gates(&c, &tot[BEFORE], &tot[AFTER], &sites, &ncrossed);
    json_t *jsites = rows_json(&sites), *jtags = rows_json(&tags);
    for (int l = 0; l < L_N; l++) {
        lists[l] = json_array();
        for (size_t i = 0; lists[l] != NULL && i < sites.n; i++)
            if (in_list(&sites.rows[i], l) &&
                json_array_append_new(lists[l], json_string(sites.rows[i].key)) != 0) {
                json_decref(lists[l]);
                lists[l] = NULL;
            }
    }
    res = json_pack("{s:i, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, "
                    "s:b}",
                    "v", 1, "type", "diff", "peak_allocated",
                    figure(tot[BEFORE].peak_allocated, tot[AFTER].peak_allocated), "peak_reserved",
                    figure(tot[BEFORE].peak_reserved, tot[AFTER].peak_reserved), "final_allocated",
                    figure(tot[BEFORE].final_allocated, tot[AFTER].final_allocated),
                    "final_reserved", figure(tot[BEFORE].final_reserved, tot[AFTER].final_reserved),
                    "sites", jsites, "tags", jtags, "new", lists[L_NEW], "grew", lists[L_GREW],
                    "gone", lists[L_GONE], "freed_now", lists[L_FREED_NOW], "never_freed_now",
                    lists[L_NEVER_FREED_NOW], "gates", g, "crossed", ncrossed > 0);
    if (res != NULL)
        rc = 0;
done:
    free(sites.rows);
    free(tags.rows);
    json_decref(sites.index);
    json_decref(tags.index);
    *out = res;
    if (crossed)
        *crossed = ncrossed;
    return rc;
}
