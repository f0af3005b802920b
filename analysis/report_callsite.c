/* Call sites in the report and the plot (report.h, "call sites"): the model's per-stack
 * figures made rows (callsite.h), labelled by the report's symbolizer, as the process's
 * "callsites" member and as flame graphs. */
#include <stdlib.h>
#include <string.h>

#include "analysis/callsite.h"
#include "analysis/report.h"

static json_t *section(const mt_model_t *m, mt_sym_t *s, uint32_t pid, int which, unsigned top)
{
    mt_cs_row_t *rows = NULL;
    size_t n = 0;
    if (mt_cs_rows_from_model(m, which, &rows, &n) != 0 ||
        (which != MT_CS_GROWTH && mt_cs_rows_merge(s, pid, rows, &n) != 0)) {
        free(rows);
        return NULL;
    }
    json_t *a = mt_cs_rows_json(s, pid, rows, n, top, which == MT_CS_GROWTH);
    free(rows);
    return a;
}

json_t *mt__report_callsites_json(const mt_model_t *m, mt_sym_t *s, uint32_t pid, unsigned top)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    mt_cs_sym_sync(s, pid, m);
    mt_model_stack_stats_t ss;
    mt_model_stack_stats(m, &ss);
    int bad = json_object_set_new(o, "stacks", json_integer((json_int_t)ss.defined));
    bad |= json_object_set_new(o, "at_peak", section(m, s, pid, MT_CS_PEAK, top));
    bad |= json_object_set_new(o, "never_freed", section(m, s, pid, MT_CS_LEAKED, top));
    bad |= json_object_set_new(o, "growth", section(m, s, pid, MT_CS_GROWTH, top));
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

int mt__report_flame_svg(mt__report_t *r, int pid, int which, FILE *out, char *err, size_t errlen)
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
        rc = mt_flame_create(&f);
    if (rc == 0)
        rc = mt_cs_rows_from_model(m, which, &rows, &n);
    mt_sym_t *s = mt__report_symbolizer(r);
    if (rc == 0)
        mt_cs_sym_sync(s, (uint32_t)ppid, m);
    for (size_t k = 0; rc == 0 && k < n; k++) {
        if (rows[k].bytes > 0)
            rc = mt_cs_flame_add(f, s, (uint32_t)ppid, &rows[k]);
    }
    if (rc == 0) {
        char title[160];
        snprintf(title, sizeof(title), "%s of %s (pid %d), by call stack",
                 which == MT_CS_LEAKED ? "Bytes never freed" : "Live device bytes at the peak",
                 name[0] ? name : "process", ppid);
        mt_flame_cfg_t cfg = mt_flame_cfg_default();
        cfg.title = title;
        rc = mt_flame_write_svg(f, &cfg, out);
        if (rc != 0)
            snprintf(err, errlen, "write error");
    } else {
        snprintf(err, errlen, "%s",
                 rc == MT_EOVERFLOW ? "too many distinct stacks to draw" : "out of memory");
    }
    free(rows);
    mt_flame_destroy(&f);
    mt_model_destroy(&m);
    return rc;
}
