/* Flame graphs as SVG: stacks (frame labels root-first) with a weight in bytes. Frames
 * with the same label under the same parent merge; a frame's width is the bytes of all
 * stacks through it; children sit on their parent, sorted by label (the usual
 * flamegraph.pl form). Each frame carries a <title> (label, bytes, share) for hover;
 * all text is XML-escaped. Memory is bounded by the number of distinct prefixes. */
#ifndef MT_ANALYSIS_FLAME_H
#define MT_ANALYSIS_FLAME_H

#include <stdint.h>
#include <stdio.h>
#include "memtrace/common.h"

#define MT_FLAME_DEPTH_MAX 1024 /* frames per stack */

typedef struct mt_flame_s mt_flame_t;

typedef struct mt_flame_cfg_s {
    const char *title;   /* heading drawn at the top (borrowed), e.g. "live bytes at peak" */
    int width;           /* pixels, >= 200 */
    int frame_height;    /* pixels per row, >= 10 */
    double min_width_px; /* frames narrower than this are not drawn (still counted) */
} mt_flame_cfg_t;
mt_flame_cfg_t mt__flame_cfg_default(void);

/* new; MT_ENOMEM. */
int mt__flame_create(mt_flame_t **out);
void mt__flame_destroy(mt_flame_t **p);

/* Adds bytes under the stack frames[0] (root) .. frames[n - 1] (leaf). Labels are copied.
 * n == 0 adds to the root itself. MT_EINVAL for a NULL label or n outside
 * [0, MT_FLAME_DEPTH_MAX]; MT_EOVERFLOW past the cap on distinct prefixes; MT_ENOMEM. */
int mt__flame_add(mt_flame_t *f, const char *const *frames, int n, uint64_t bytes);

/* Total bytes added (saturating). */
uint64_t mt__flame_total(const mt_flame_t *f);

/* Writes the SVG document. MT_EIO on a write error. A graph with no bytes draws a
 * document saying so. */
int mt__flame_write_svg(const mt_flame_t *f, const mt_flame_cfg_t *cfg, FILE *out);

#endif
