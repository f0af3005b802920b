/* Call sites in the report and the plot (report.h, "call sites"): the model's per-stack
 * figures made rows (callsite.h), labelled by the report's symbolizer, as the process's
 * "callsites" member and as flame graphs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/callsite.h"
#include "analysis/frames.h"
#include "analysis/report.h"
#include "analysis/torch_snapshot.h"
#include "util/text.h"

/* A JSON frame (callsite.c's frame_json) as the rules see it. */
static mt_fr_frame_t rule_frame(json_t *f)
{
    return (mt_fr_frame_t){
        .func = json_string_value(json_object_get(f, "function")),
        .file = json_string_value(json_object_get(f, "file")),
        .line = json_integer_value(json_object_get(f, "line")),
        .module = json_string_value(json_object_get(f, "module")),
        .python = json_is_true(json_object_get(f, "python")),
    };
}

/* Names row by its user frame (the site keeps the label form of callsite.c) or by its key,
 * marks the frames the rules skip; the key into key. 0 or MT_ENOMEM. */
static int name_row(json_t *row, const mt__report_cfg_t *cfg, char *key, size_t keylen)
{
    json_t *frames = json_object_get(row, "frames");
    size_t n = json_array_size(frames);
    if (n == 0) {
        snprintf(key, keylen, "%s", json_string_value(json_object_get(row, "site")));
        return 0;
    }
    mt_fr_frame_t *fr = calloc(n, sizeof *fr);
    if (fr == NULL)
        return MT_ENOMEM;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_array_get(frames, i);
        fr[i] = rule_frame(f);
        const mt_fr_rule_t *m = mt__fr_match(cfg->frames, &fr[i]);
        if (m != NULL)
            bad |= json_object_set_new(f, "skipped", json_string(m->reason));
    }
    int u = mt__fr_pick(cfg->frames, fr, n);
    json_t *uf = json_array_get(frames, (size_t)u);
    bad |= json_object_set_new(row, "user_frame", json_integer(u));
    if (cfg->by == MT_FR_BY_SITE) {
        snprintf(key, keylen, "%s", json_string_value(json_object_get(uf, "label")));
    } else if (cfg->by == MT_FR_BY_STACK) {
        /* the stack as callsite.c merged it: its labels from the user's frame on */
        size_t used = 0;
        key[0] = '\0';
        for (size_t i = (size_t)u; i < n && used + 1 < keylen; i++) {
            if (i > (size_t)u && mt__fr_match(cfg->frames, &fr[i]) != NULL)
                continue;
            int w =
                snprintf(key + used, keylen - used, "%s%s", used ? " <- " : "",
                         json_string_value(json_object_get(json_array_get(frames, i), "label")));
            used = w < 0 ? keylen : used + (size_t)w;
        }
    } else if (cfg->by == MT_FR_BY_MODULES) {
        mt__fr_stack_key(cfg->frames, fr, n, MT_FR_BY_MODULES, key, keylen);
    } else {
        mt__fr_key(&fr[u], cfg->by, key, keylen);
    }
    const char *text = cfg->by != MT_FR_BY_STACK && cfg->by != MT_FR_BY_MODULES
                           ? key
                           : json_string_value(json_object_get(uf, "label"));
    json_t *site = json_string(text);
    if (site != NULL)
        bad |= json_object_set_new(row, "site", site);
    else /* a key cut inside a UTF-8 sequence keeps the label; else memory ran out */
        bad |= text != NULL && mt__text_is_utf8(text);
    free(fr);
    return bad ? MT_ENOMEM : 0;
}

int mt__report_name_row(json_t *row, const mt__report_cfg_t *cfg, char *key, size_t keylen)
{
    return name_row(row, cfg, key, keylen);
}

static json_int_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* A row and its place, for a stable sort by bytes. */
typedef struct ranked_s {
    json_int_t bytes;
    size_t at;
    json_t *row;
} ranked_t;

static int by_bytes_desc(const void *pa, const void *pb)
{
    const ranked_t *a = pa, *b = pb;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* rows sorted by bytes, the largest first, rows of equal bytes in their order. An insertion
 * sort here took time quadratic in the sites when merges reorder many (a log of 16,000
 * functions: 28 s). 0 or MT_ENOMEM (rows left unsorted). */
static int sort_rows(json_t *rows)
{
    size_t n = json_array_size(rows);
    if (n < 2)
        return 0;
    ranked_t *r = malloc(n * sizeof *r);
    if (r == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(rows, i);
        r[i] = (ranked_t){.bytes = jint(row, "bytes"), .at = i, .row = json_incref(row)};
    }
    qsort(r, n, sizeof *r, by_bytes_desc);
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        if (json_array_set_new(rows, i, r[i].row) != 0)
            rc = MT_ENOMEM; /* set_new took the reference even so */
    free(r);
    return rc;
}

/* Rows with one key made one (bytes and blocks add; the largest row's frames stay), then
 * the first top. Growth rows are never merged: fits do not add. */
static json_t *group_rows(json_t *rows, const mt__report_cfg_t *cfg, bool growth)
{
    json_t *out = json_array(), *seen = json_object();
    char key[2048];
    size_t i;
    json_t *r;
    if (out == NULL || seen == NULL)
        goto fail;
    json_array_foreach(rows, i, r)
    {
        if (name_row(r, cfg, key, sizeof key) != 0)
            goto fail;
        json_t *into = growth ? NULL : json_object_get(seen, key);
        if (into != NULL) {
            /* (a sum that cannot be stored is no answer: the section fails) */
            if (json_object_set_new(into, "bytes",
                                    json_integer(jint(into, "bytes") + jint(r, "bytes"))) != 0 ||
                json_object_set_new(into, "blocks",
                                    json_integer(jint(into, "blocks") + jint(r, "blocks"))) != 0 ||
                json_object_set_new(into, "stacks", json_integer(jint(into, "stacks") + 1)) != 0)
                goto fail;
            continue;
        }
        if (json_object_set_new(r, "stacks", json_integer(1)) != 0 ||
            json_array_append(out, r) != 0 ||
            (!growth && json_object_set_nocheck(seen, key, r) != 0))
            goto fail;
    }
    json_decref(seen);
    /* Merged rows may now outrank others: sort again by bytes (growth keeps its order). */
    if (!growth && sort_rows(out) != 0) {
        seen = NULL;
        goto fail;
    }
    while (json_array_size(out) > cfg->top)
        json_array_remove(out, json_array_size(out) - 1);
    return out;
fail:
    json_decref(out);
    json_decref(seen);
    return NULL;
}

static json_t *section(const mt_model_t *m, mt_sym_t *s, uint32_t pid, int which,
                       const mt__report_cfg_t *cfg)
{
    mt_cs_row_t *rows = NULL;
    size_t n = 0;
    if (mt__cs_rows_from_model(m, which, &rows, &n) != 0 ||
        (which != MT_CS_GROWTH && mt__cs_rows_merge(s, pid, rows, &n) != 0)) {
        free(rows);
        return NULL;
    }
    json_t *a = mt__cs_rows_json(s, pid, rows, n, n, which == MT_CS_GROWTH);
    free(rows);
    json_t *g = a ? group_rows(a, cfg, which == MT_CS_GROWTH) : NULL;
    json_decref(a);
    return g;
}

json_t *mt__report_callsites_json(const mt_model_t *m, mt_sym_t *s, uint32_t pid,
                                  const mt__report_cfg_t *cfg)
{
    json_t *o = json_object();
    if (o == NULL || mt__cs_sym_sync(s, pid, m) != 0) {
        json_decref(o);
        return NULL;
    }
    mt_model_stack_stats_t ss;
    mt__model_stack_stats(m, &ss);
    int bad = json_object_set_new(o, "stacks", json_integer((json_int_t)ss.defined));
    bad |= json_object_set_new(o, "by", json_string(mt__fr_by_name(cfg->by)));
    bad |= json_object_set_new(o, "at_peak", section(m, s, pid, MT_CS_PEAK, cfg));
    bad |= json_object_set_new(o, "never_freed", section(m, s, pid, MT_CS_LEAKED, cfg));
    bad |= json_object_set_new(o, "growth", section(m, s, pid, MT_CS_GROWTH, cfg));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- flame graphs ---- */

static int pick_process(const mt__report_t *r, int pid, size_t *idx)
{
    size_t best_events = 0;
    bool found = false;
    for (size_t i = 0; i < mt__report_process_count(r); i++) {
        int p;
        const char *name;
        size_t events;
        mt__report_process(r, i, &p, &name, &events);
        if (pid > 0 ? p == pid : !found || events > best_events) {
            *idx = i;
            best_events = events;
            found = true;
        }
    }
    return found ? 0 : MT_ENOENT;
}

int mt__report_flame_svg(mt__report_t *r, int pid, int which, mt__report_snap_fn snap, void *ud,
                         FILE *out, char *err, size_t errlen)
{
    size_t i = 0;
    if (pick_process(r, pid, &i) != 0) {
        if (pid > 0)
            snprintf(err, errlen, "no process %d in the log", pid);
        else
            snprintf(err, errlen, "no process in the log");
        return MT_ENOENT;
    }
    int ppid;
    const char *name;
    size_t events;
    mt__report_process(r, i, &ppid, &name, &events);
    mt_model_t *m = NULL;
    mt_flame_t *f = NULL;
    mt_cs_row_t *rows = NULL;
    size_t n = 0;
    int rc = mt__report_model(r, i, &m);
    if (rc == 0)
        rc = mt__flame_create(&f);
    if (rc == 0)
        rc = mt__cs_rows_from_model(m, which, &rows, &n);
    mt_sym_t *s = mt__report_symbolizer(r);
    if (rc == 0)
        rc = mt__cs_sym_sync(s, (uint32_t)ppid, m);
    const mt_ts_t *ts = snap != NULL ? snap(ud, ppid) : NULL;
    for (size_t k = 0; rc == 0 && k < n; k++) {
        if (rows[k].bytes > 0)
            rc = ts != NULL ? mt__ts_flame_add(f, ts, rows[k].stack, rows[k].bytes)
                            : mt__cs_flame_add(f, s, (uint32_t)ppid, &rows[k]);
    }
    if (rc == 0) {
        char title[160];
        snprintf(title, sizeof(title), "%s of %s (pid %d), by call stack",
                 which == MT_CS_LEAKED ? "Bytes never freed" : "Live device bytes at the peak",
                 name[0] ? name : "process", ppid);
        mt_flame_cfg_t cfg = mt__flame_cfg_default();
        cfg.title = title;
        rc = mt__flame_write_svg(f, &cfg, out);
        if (rc != 0)
            snprintf(err, errlen, "write error");
    } else {
        snprintf(err, errlen, "%s",
                 rc == MT_EOVERFLOW ? "too many distinct stacks to draw" : "out of memory");
    }
    free(rows);
    mt__flame_destroy(&f);
    mt__model_destroy(&m);
    return rc;
}
