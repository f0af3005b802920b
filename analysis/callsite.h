/* Call-site views: one process's stacks ranked by a figure (live bytes at the peak, never
 * freed, growth), labelled through the symbolizer, as JSON, text or flame-graph input.
 * Rows come from the model's per-stack figures; frames are innermost first. Reader side
 * only. Row and frame strings are borrowed for the duration of each call. */
#ifndef MT_ANALYSIS_CALLSITE_H
#define MT_ANALYSIS_CALLSITE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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
void mt_cs_rows_sort(mt_cs_row_t *rows, size_t n);

/* Labels one frame of process pid into *out (see mt_sym_frame_t). 0 or MT_ENOMEM (then
 * out->label reads "unknown frame"). */
int mt_cs_frame_label(mt_sym_t *s, uint32_t pid, const mt_cs_frame_t *f, mt_sym_frame_t *out);

/* The first top rows as a JSON array (new reference, NULL without memory): each
 * {"stack", "bytes", "blocks", "site", "frames": [{"label", "function", "file", "line",
 * "module", "python"}], "truncated"} plus, with growth, {"slope", "r2", "detected"}; an
 * unknown id gives "site": "unknown stack N" and "unknown": true. */
json_t *mt_cs_rows_json(mt_sym_t *s, uint32_t pid, const mt_cs_row_t *rows, size_t n, size_t top,
                        bool growth);

/* The same as text: one row a line ("  12.0 MiB  34 blocks  site"), then up to depth
 * callers ("      <- caller"). Labels are printed with control characters escaped.
 * 0 or MT_EIO. */
int mt_cs_rows_text(FILE *out, mt_sym_t *s, uint32_t pid, const mt_cs_row_t *rows, size_t n,
                    size_t top, int depth, bool growth);

/* Adds row's bytes to f under its frames, root first ("no stack recorded" / "unknown stack"
 * for id 0 or an unknown id). 0, MT_ENOMEM or MT_EOVERFLOW (flame caps). */
int mt_cs_flame_add(mt_flame_t *f, mt_sym_t *s, uint32_t pid, const mt_cs_row_t *row);

/* Reads one module-map line ({"kind":"module","pid","path","base","size","build_id"},
 * docs/telemetry.md) into s. MT_EPROTO with a message in err for a malformed line. */
int mt_cs_module_line(mt_sym_t *s, const json_t *line, char *err, size_t errlen);

#endif
