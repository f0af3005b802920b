/* What the files of `memtrace report`'s text share (report_print.c, report_print_jobs.c):
 * numbers and names as they print them. */
#ifndef MT_TOOLS_REPORT_PRINT_INTERNAL_H
#define MT_TOOLS_REPORT_PRINT_INTERNAL_H

#include <jansson.h>

#include "util/text.h"

static inline const char *human(double b, char *buf, size_t len)
{
    return mt__text_bytes(b, 1, buf, len);
}

static inline double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* Names and labels are the recorded processes' own strings: escaped, so that none can move
 * the cursor or forge a line of the report. */
typedef char esc_buf_t[MT_TEXT_ESC_SIZE(64)];
static inline const char *esc(const char *s, esc_buf_t buf)
{
    return mt__text_escape(s ? s : "?", buf, sizeof(esc_buf_t));
}

/* report_print_jobs.c: the report's "jobs" as text, on stdout. */
void mt__report_print_jobs(json_t *jobs);

#endif
