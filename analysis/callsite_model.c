/* Call-site rows from the event model (analysis/model.h, call stacks): callsite.h. */
#include <stddef.h>
#include <stdlib.h>

#include "analysis/callsite.h"
#include "analysis/model.h"

/* ---- rows from the model ---- */

/* The model's frames are read as the views' frames: one layout. */
_Static_assert(sizeof(mt_model_frame_t) == sizeof(mt_cs_frame_t), "frame layouts differ");
_Static_assert(offsetof(mt_model_frame_t, py_func) == offsetof(mt_cs_frame_t, py_func) &&
                   offsetof(mt_model_frame_t, py_file) == offsetof(mt_cs_frame_t, py_file) &&
                   offsetof(mt_model_frame_t, py_line) == offsetof(mt_cs_frame_t, py_line),
               "frame layouts differ");

static int by_slope(const void *a, const void *b)
{
    const mt_cs_row_t *x = a, *y = b;
    if (x->slope != y->slope)
        return x->slope > y->slope ? -1 : 1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

int mt__cs_rows_from_model(const mt_model_t *m, int which, mt_cs_row_t **out, size_t *n)
{
    mt_model_stack_t *st = NULL;
    size_t ns = 0;
    *out = NULL;
    *n = 0;
    int rc = mt__model_stacks(m, MT_MODEL_DEVICE, NULL, &st, &ns);
    if (rc != 0)
        return rc;
    mt_cs_row_t *rows = calloc(ns ? ns : 1, sizeof(*rows));
    if (rows == NULL) {
        free(st);
        return MT_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < ns; i++) {
        mt_cs_row_t r = {.stack = st[i].stack};
        if (which == MT_CS_LIVE) {
            r.bytes = st[i].bytes;
            r.blocks = st[i].blocks;
        } else if (which == MT_CS_PEAK) {
            r.bytes = st[i].peak_bytes;
            r.blocks = st[i].allocs;
        } else if (which == MT_CS_LEAKED) {
            r.bytes = st[i].bytes;
            r.blocks = st[i].blocks;
        } else {
            r.slope = st[i].growth.slope;
            r.r2 = st[i].growth.r2;
            r.detected = st[i].growth.detected;
            r.bytes = st[i].growth.rise > 0 ? (uint64_t)st[i].growth.rise : 0;
            r.blocks = st[i].blocks;
        }
        if (which == MT_CS_GROWTH ? !(r.slope > 0) : r.bytes == 0)
            continue;
        const mt_model_frame_t *fr;
        int nf;
        if (mt__model_stack_frames(m, r.stack, &fr, &nf, &r.truncated) == 0) {
            r.frames = (const mt_cs_frame_t *)fr;
            r.n_frames = nf;
        }
        rows[k++] = r;
    }
    free(st);
    if (which == MT_CS_GROWTH)
        qsort(rows, k, sizeof(*rows), by_slope);
    else
        mt__cs_rows_sort(rows, k);
    *out = rows;
    *n = k;
    return 0;
}

int mt__cs_sym_sync(mt_sym_t *s, uint32_t pid, const mt_model_t *m)
{
    const mt_model_module_t *mods;
    size_t n;
    mt__model_modules(m, &mods, &n);
    for (size_t i = 0; i < n; i++) {
        /* A module refused (no path, past MT_SYM_MODULES_MAX) leaves its frames unknown, as
         * the input says; one missing for want of memory would name them wrongly. */
        if (mt__sym_add_module(s, pid, mods[i].path, mods[i].base, mods[i].size,
                               mods[i].build_id[0] ? mods[i].build_id : NULL) == MT_ENOMEM)
            return MT_ENOMEM;
    }
    return 0;
}
