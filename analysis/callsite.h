/* Call-site views: one process's stacks ranked by a figure (live bytes now or at the peak,
 * never freed, growth), labelled through the symbolizer, as JSON (which the CLI and the
 * page print) or flame-graph input. Rows come from the model's per-stack figures; frames
 * are innermost first. Reader side only. Row and frame strings are borrowed for the
 * duration of each call. */
#ifndef MT_ANALYSIS_CALLSITE_H
#define MT_ANALYSIS_CALLSITE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "analysis/flame.h"
#include "analysis/symbolize.h"

/* One recorded frame: native (ip != 0, py_func NULL) or Python (py_func != NULL). */
typedef struct mt_cs_frame_s {
    uint64_t ip;         /* native return address, 0 for a Python frame */
    const char *py_func; /* Python function, or NULL */
    const char *py_file; /* Python file, or NULL */
    int py_line;         /* >= 0 */
} mt_cs_frame_t;

typedef struct mt_cs_row_s {
    uint32_t stack;              /* id in the process's table; 0: allocations with no stack */
    uint64_t bytes;              /* the figure ranked by */
    uint64_t blocks;             /* blocks behind it */
    double slope, r2;            /* growth rows: bytes per iteration, goodness of fit */
    bool detected;               /* growth rows: growth flagged */
    const mt_cs_frame_t *frames; /* innermost first; NULL: an id the table does not hold */
    int n_frames;                /* >= 0 */
    bool truncated;              /* cut at the recorder's depth cap */
} mt_cs_row_t;

/* Sorts by bytes, largest first, then by stack id (a stable, total order). */
void mt__cs_rows_sort(mt_cs_row_t *rows, size_t n);

/* Merges rows whose frames read the same (two stacks that differ only in ips of one line,
 * or in frames below the labels' reach): bytes and blocks add up (saturating), the lowest
 * id stays; rows without frames are kept apart. Then sorts as mt__cs_rows_sort. Not for
 * growth rows (fits do not add). 0 or MT_ENOMEM (rows left as they were). */
int mt__cs_rows_merge(mt_sym_t *s, uint32_t pid, mt_cs_row_t *rows, size_t *n);

/* Labels one frame of process pid into *out (see mt_sym_frame_t). 0 or MT_ENOMEM (then
 * out->label reads "unknown frame"). */
int mt__cs_frame_label(mt_sym_t *s, uint32_t pid, const mt_cs_frame_t *f, mt_sym_frame_t *out);

/* The first top rows as a JSON array (new reference, NULL without memory): each
 * {"stack", "bytes", "blocks", "site", "frames": [{"label", "function", "file", "line",
 * "module", "python"}], "truncated"} plus, with growth, {"slope", "r2", "detected"}; an
 * unknown id gives "site": "unknown stack N" and "unknown": true. */
json_t *mt__cs_rows_json(mt_sym_t *s, uint32_t pid, const mt_cs_row_t *rows, size_t n, size_t top,
                         bool growth);

/* Adds row's bytes to f under its frames, root first ("no stack recorded" / "unknown stack"
 * for id 0 or an unknown id). 0, MT_ENOMEM or MT_EOVERFLOW (flame caps). */
int mt__cs_flame_add(mt_flame_t *f, mt_sym_t *s, uint32_t pid, const mt_cs_row_t *row);

/* ---- from the event model ---- */

struct mt_model_s;

typedef enum mt_cs_which_e {
    MT_CS_LIVE = 0,   /* live bytes now (at the end of a log) */
    MT_CS_PEAK = 1,   /* live bytes at the peak of allocated device memory */
    MT_CS_LEAKED = 2, /* never freed: live at the end of the stream */
    MT_CS_GROWTH = 3, /* growth across iterations (slope > 0 only), by slope */
} mt_cs_which_e;

/* The device-memory stacks of m with something to show for which, ranked, as a new array
 * in *out (free() it; frames borrowed from m until it changes). 0 or MT_ENOMEM. */
int mt__cs_rows_from_model(const struct mt_model_s *m, int which, mt_cs_row_t **out, size_t *n);
/* Gives s process pid's module map as m holds it (idempotent). 0 or MT_ENOMEM (a module
 * missing: resolve nothing of pid then). */
int mt__cs_sym_sync(mt_sym_t *s, uint32_t pid, const struct mt_model_s *m);

#endif
