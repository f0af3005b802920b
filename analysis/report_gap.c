/* The report's peak_gap and end_gap (report.h): analysis/gap.h's figures, each pinning
 * stack named by its site as the "callsites" rows are. */
#include <stdlib.h>

#include "analysis/callsite.h"
#include "analysis/gap.h"
#include "analysis/report.h"

/* Adds "site" (and "frames", "user_frame") to pin row p of stack id. 0 or MT_ENOMEM. */
static int name_pin(json_t *p, const mt_model_t *m, mt_sym_t *s, uint32_t pid, uint32_t stack,
                    const mt__report_cfg_t *cfg)
{
    mt_cs_row_t row = {.stack = stack};
    const mt_model_frame_t *fr = NULL;
    int nf = 0;
    if (mt__model_stack_frames(m, stack, &fr, &nf, &row.truncated) == 0) {
        row.frames = (const mt_cs_frame_t *)fr; /* same layout: callsite_model.c asserts it */
        row.n_frames = nf;
    }
    json_t *a = mt__cs_rows_json(s, pid, &row, 1, 1, false);
    json_t *r = json_array_get(a, 0);
    char key[1024];
    int rc = r != NULL ? mt__report_name_row(r, cfg, key, sizeof key) : MT_ENOMEM;
    if (rc == 0 && (json_object_set(p, "site", json_object_get(r, "site")) != 0 ||
                    json_object_set(p, "frames", json_object_get(r, "frames")) != 0 ||
                    (json_object_get(r, "user_frame") != NULL &&
                     json_object_set(p, "user_frame", json_object_get(r, "user_frame")) != 0)))
        rc = MT_ENOMEM;
    json_decref(a);
    return rc;
}

json_t *mt__report_gap_json(const mt_model_t *m, int cls, mt_sym_t *s, uint32_t pid,
                            const mt__report_cfg_t *cfg, size_t top)
{
    mt_gap_t g;
    if (mt__gap_of_model(m, cls, &g) != 0)
        return NULL;
    json_t *o = mt__report_gap_named(&g, m, s, pid, cfg, top);
    mt__gap_free(&g);
    return o;
}

json_t *mt__report_gap_named(const mt_gap_t *g, const mt_model_t *m, mt_sym_t *s, uint32_t pid,
                             const mt__report_cfg_t *cfg, size_t top)
{
    json_t *o = mt__gap_json(g, SIZE_MAX); /* every pin: rows of one site join before the cut */
    if (o != NULL && mt__cs_sym_sync(s, pid, m) != 0) {
        json_decref(o);
        o = NULL;
    }
    json_t *pins = json_object_get(o, "pins");
    for (size_t i = 0; o != NULL && i < json_array_size(pins); i++) {
        if (name_pin(json_array_get(pins, i), m, s, pid, g->pins[i].stack, cfg) != 0) {
            json_decref(o);
            o = NULL;
        }
    }
    if (o != NULL && mt__gap_pins_by_site(pins, top) != 0) {
        json_decref(o);
        o = NULL;
    }
    return o;
}
