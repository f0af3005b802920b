/* Shared by the plot's files: plot.c (the passes and the picture) and plot_map.c (the
 * segment map). */
#ifndef MT_ANALYSIS_PLOT_INTERNAL_H
#define MT_ANALYSIS_PLOT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "analysis/plot.h"

#define MT__PLOT_FONT        "font-family=\"DejaVu Sans,Helvetica,Arial,sans-serif\""
#define MT__PLOT_MAP_ROW_H   26 /* px of one row of the segment map */
#define MT__PLOT_MAP_ROW_GAP 6  /* px between rows */
#define MT__PLOT_OOM_COLOUR  "#d00000"

/* A tag's fill colour. Borrowed: a static string. */
const char *mt__plot_colour(int tag);
/* b bytes as "12.3 MiB" into buf; returns buf. */
const char *mt__plot_human(double b, char *buf, size_t len);

/* Rows the segment map of m takes (at least 1). */
int mt__plot_map_rows(const mt__report_map_t *m);
/* Draws the segment map panel of m at [x0, x1] from y: its title (the map's moment, at_s
 * seconds into the log), the bars and its figures. */
void mt__plot_map(FILE *f, const mt__report_map_t *m, double x0, double x1, double y,
                  const char *at);

/* s as XML text: markup escaped, control characters dropped, what is not UTF-8 as U+FFFD. */
void mt__plot_xml_text(FILE *f, const char *s);

struct mt_event_rec_s;
/* The marks of a timeline drawn over [x0, x1] x [y0, y1], t0 at x0 and span ns across
 * (plot_marks.c): iteration ticks along the top, named marks (a dashed line each, or ticks
 * labelled once with their count for a name marked more than 8 times), OOMs. */
void mt__plot_marks(FILE *f, const struct mt_event_rec_s *marks, size_t n, bool untimed,
                    uint64_t t0, double span, double x0, double x1, double y0, double y1);

#endif
