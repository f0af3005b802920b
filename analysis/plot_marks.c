/* The plot's marks along its timeline (plot_internal.h): iteration ticks, named marks (a
 * program's mark("name"), a snapshot's external annotations) and OOMs. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/plot_internal.h"
#include "memtrace/event.h"

/* Marks of one name drawn each as a dashed line; past it, as ticks. */
#define MARKS_DRAWN 8

static int cmp_mark_name(const void *a, const void *b, void *arg)
{
    const mt_event_rec_t *m = arg;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    char x[MT_EVENT_LABEL_MAX + 1], y[MT_EVENT_LABEL_MAX + 1];
    mt_event_label_unpack(&m[i], x);
    mt_event_label_unpack(&m[j], y);
    int c = strcmp(x, y);
    return c != 0 ? c : (i > j) - (i < j);
}

/* For each named mark i of marks[0, n): cnt[2i] = the marks of its name, cnt[2i + 1] = how
 * many of them come before it. */
static void mark_counts(const mt_event_rec_t *marks, size_t n, size_t *cnt)
{
    size_t *ix = malloc((n + 1) * sizeof *ix), k = 0;
    if (ix == NULL) {
        for (size_t i = 0; i < n; i++)
            cnt[2 * i] = 1, cnt[2 * i + 1] = 0;
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (marks[i].kind == MT_EV_MARK_NAMED)
            ix[k++] = i;
    qsort_r(ix, k, sizeof *ix, cmp_mark_name, (void *)marks);
    char x[MT_EVENT_LABEL_MAX + 1], y[MT_EVENT_LABEL_MAX + 1];
    for (size_t a = 0; a < k;) {
        size_t b = a + 1;
        mt_event_label_unpack(&marks[ix[a]], x);
        while (b < k && (mt_event_label_unpack(&marks[ix[b]], y), strcmp(x, y) == 0))
            b++;
        for (size_t r = a; r < b; r++)
            cnt[2 * ix[r]] = b - a, cnt[2 * ix[r] + 1] = r - a;
        a = b;
    }
    free(ix);
}

/* The moment t (ns since the start) as the plot writes it: seconds, or the event it counts
 * when the input has no clock. */
static const char *when(bool untimed, uint64_t t, char *buf, size_t len)
{
    if (untimed)
        snprintf(buf, len, "event %" PRIu64, t);
    else
        snprintf(buf, len, "%.3f s", (double)t / 1e9);
    return buf;
}

void mt__plot_marks(FILE *f, const struct mt_event_rec_s *marks, size_t n, bool untimed,
                    uint64_t t0, double span, double x0, double x1, double y0, double y1)
{
    /* Iteration ticks along the top edge, one per pixel at most. */
    fprintf(f, "<g stroke=\"#555\" stroke-opacity=\"0.45\">");
    long last_px = -1;
    for (size_t i = 0; i < n; i++) {
        const mt_event_rec_t *ev = &marks[i];
        double x = x0 + (double)(ev->time_ns - t0) / span * (x1 - x0);
        if (ev->kind != MT_EV_MARK || (long)x == last_px)
            continue;
        last_px = (long)x;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, y0, x, y0 + 7);
    }
    fprintf(f, "</g>\n");
    /* Named marks (a program's mark("name"), a snapshot's external annotations): a dashed
     * line with the name at its top, hover for the time. A name marked more than
     * MARKS_DRAWN times (a compiled model's hundreds of pad_mm_benchmark) is a tick at the
     * top instead, labelled once with its count; a label that would overlap the one before
     * is left to the hover. */
    double label_end = -1;
    size_t *cnt = calloc(n + 1, 2 * sizeof *cnt); /* [2i] its name's, [2i+1] its rank */
    if (cnt != NULL)
        mark_counts(marks, n, cnt);
    for (size_t i = 0; i < n; i++) {
        const mt_event_rec_t *ev = &marks[i];
        if (ev->kind != MT_EV_MARK_NAMED)
            continue;
        char name[MT_EVENT_LABEL_MAX + 1];
        mt_event_label_unpack(ev, name);
        size_t count = cnt != NULL ? cnt[2 * i] : 1, before = cnt != NULL ? cnt[2 * i + 1] : 0;
        bool many = count > MARKS_DRAWN;
        double x = x0 + (double)(ev->time_ns - t0) / span * (x1 - x0);
        char at[40];
        fprintf(f, "<g class=\"mark\"><title>");
        mt__plot_xml_text(f, name);
        fprintf(f,
                " at %s</title><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"#555\" stroke-dasharray=\"%s\" stroke-opacity=\"0.6\"/>",
                when(untimed, ev->time_ns - t0, at, sizeof at), x, y0, x, many ? y0 + 10 : y1,
                many ? "none" : "3 3");
        if ((!many || before == 0) && x >= label_end) {
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"10\" fill=\"#333\">",
                    x + 2, y0 + 18);
            mt__plot_xml_text(f, name);
            if (many)
                fprintf(f, " \u00d7%zu", count);
            fprintf(f, "</text>");
            label_end = x + 2 + 6.0 * (double)(strlen(name) + (many ? 7 : 0));
        }
        fprintf(f, "</g>\n");
    }
    free(cnt);
    for (size_t i = 0; i < n; i++) {
        const mt_event_rec_t *ev = &marks[i];
        if (ev->kind != MT_EV_OOM)
            continue;
        char b1[32], b2[32], at[40];
        double x = x0 + (double)(ev->time_ns - t0) / span * (x1 - x0);
        fprintf(f,
                "<g class=\"oom\"><title>OOM at %s: %s requested, %s free on the "
                "device</title><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"%s\" stroke-opacity=\"0.5\"/><path d=\"M%.1f %.1fl-5 -8h10z\" "
                "fill=\"%s\"/></g>\n",
                when(untimed, ev->time_ns - t0, at, sizeof at),
                mt__plot_human((double)ev->requested, b1, sizeof b1),
                mt__plot_human((double)ev->size, b2, sizeof b2), x, y0, x, y1, MT__PLOT_OOM_COLOUR,
                x, y0 + 9, MT__PLOT_OOM_COLOUR);
    }
}
