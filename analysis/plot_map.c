/* The plot's segment map (see plot.h): the segments at the moment of peak reserved
 * memory, each a bar of blocks coloured by tag, with utilization and fragmentation. */
#include "analysis/plot_internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define FREE_COLOUR "#dcdcdc"

typedef struct mapstat_s {
    uint64_t reserved, in_use, pending, free, largest_free, free_extents;
} mapstat_t;

static mapstat_t map_stats(const mt__report_map_t *m)
{
    mapstat_t st = {0};
    size_t b = 0;
    for (size_t i = 0; i < m->nsegs; i++) {
        uint64_t cur = m->segs[i].addr, end = cur + m->segs[i].size;
        st.reserved = mt_model_sat_add(st.reserved, m->segs[i].size);
        while (b < m->nblocks && m->blocks[b].addr < m->segs[i].addr)
            b++;
        for (; b <= m->nblocks; b++) {
            bool last = b == m->nblocks || m->blocks[b].addr >= end;
            uint64_t start = last ? end : m->blocks[b].addr;
            if (start > cur) {
                st.free += start - cur;
                st.free_extents++;
                st.largest_free = start - cur > st.largest_free ? start - cur : st.largest_free;
            }
            if (last)
                break;
            const mt__report_block_t *k = &m->blocks[b];
            uint64_t *sum = k->pending ? &st.pending : &st.in_use;
            *sum = mt_model_sat_add(*sum, k->size);
            cur = k->addr + k->size > cur ? k->addr + k->size : cur;
        }
    }
    return st;
}

/* Segments in address order, left to right in rows of the panel's width; a segment longer
 * than what is left of a row goes on in the next one. Widths are proportional to bytes. */
typedef struct flow_s {
    FILE *f;
    double x0, x1, y0, row_h, gap, bytes_per_px, x;
    int row, rows;
} flow_t;

static void map_part(flow_t *fl, const mt__report_map_t *m, size_t *bi, uint64_t a, uint64_t e)
{
    double w = (double)(e - a) / fl->bytes_per_px, y = fl->y0 + fl->row * (fl->row_h + fl->gap);
    fprintf(fl->f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n",
            fl->x, y, w < 0.5 ? 0.5 : w, fl->row_h, FREE_COLOUR);
    /* Blocks in [a, e), adjacent ones of one tag and state drawn as one run. */
    double rx = 0, rw = 0;
    int rtag = -1, rpend = 0;
    size_t b = *bi;
    while (b < m->nblocks && m->blocks[b].addr + m->blocks[b].size <= a)
        b++;
    for (;; b++) {
        const mt__report_block_t *k = b < m->nblocks && m->blocks[b].addr < e ? &m->blocks[b] : 0;
        double kx = 0, kw = 0;
        if (k) {
            uint64_t s = k->addr > a ? k->addr : a,
                     t = k->addr + k->size < e ? k->addr + k->size : e;
            kx = fl->x + (double)(s - a) / fl->bytes_per_px;
            kw = (double)(t - s) / fl->bytes_per_px;
        }
        if (rtag >= 0 && (!k || k->tag != rtag || k->pending != rpend || kx > rx + rw + 0.3)) {
            fprintf(fl->f,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s/>\n",
                    rx, y, rw, fl->row_h, mt__plot_colour(rtag),
                    rpend ? " fill-opacity=\"0.4\"" : "");
            rtag = -1;
        }
        if (!k)
            break;
        if (rtag < 0) {
            rx = kx;
            rw = kw;
            rtag = k->tag;
            rpend = k->pending;
        } else {
            rw = kx + kw - rx;
        }
    }
    *bi = b > 0 && b <= m->nblocks ? b - 1 : b; /* the last block may go on in the next part */
    fprintf(fl->f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#555\" stroke-width=\"0.8\"/>\n",
            fl->x, y, w < 0.5 ? 0.5 : w, fl->row_h);
    fl->x += w;
}

/* Rows the map takes: one per segment when they are few (each a bar from the left edge,
 * the largest the full width), else up to MAP_FLOW_ROWS rows that segments flow through. */
#define MAP_ONE_PER_ROW 8
#define MAP_FLOW_ROWS   6

int mt__plot_map_rows(const mt__report_map_t *m)
{
    return m->nsegs == 0 ? 1 : m->nsegs <= MAP_ONE_PER_ROW ? (int)m->nsegs : MAP_FLOW_ROWS;
}

/* Draws the map from y0; returns the y below it. */
static double map_draw(FILE *f, const mt__report_map_t *m, const mapstat_t *st, double x0,
                       double x1, double y0)
{
    flow_t fl = {
        f, x0, x1, y0, MT__PLOT_MAP_ROW_H, MT__PLOT_MAP_ROW_GAP, 1, x0, 0, mt__plot_map_rows(m)};
    size_t bi = 0;
    if (m->nsegs <= MAP_ONE_PER_ROW) {
        uint64_t largest = 1;
        for (size_t i = 0; i < m->nsegs; i++)
            largest = m->segs[i].size > largest ? m->segs[i].size : largest;
        fl.bytes_per_px = (double)largest / (x1 - x0);
        fprintf(f, "<g " MT__PLOT_FONT " font-size=\"11\" fill=\"#444\" text-anchor=\"end\">");
        for (size_t i = 0; i < m->nsegs; i++) {
            char b1[32];
            fl.row = (int)i;
            fl.x = x0;
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>", x0 - 6,
                    y0 + i * (MT__PLOT_MAP_ROW_H + MT__PLOT_MAP_ROW_GAP) + MT__PLOT_MAP_ROW_H / 2 +
                        4,
                    mt__plot_human((double)m->segs[i].size, b1, sizeof b1));
        }
        fprintf(f, "</g>\n");
        for (size_t i = 0; i < m->nsegs; i++) {
            fl.row = (int)i;
            fl.x = x0;
            map_part(&fl, m, &bi, m->segs[i].addr, m->segs[i].addr + m->segs[i].size);
        }
        return y0 + fl.rows * (MT__PLOT_MAP_ROW_H + MT__PLOT_MAP_ROW_GAP);
    }
    double room = fl.rows * (x1 - x0), seg_gap = 4;
    while (seg_gap > 0.25 && m->nsegs * seg_gap > room / 4)
        seg_gap /= 2;
    fl.bytes_per_px = (double)st->reserved / (room - (double)m->nsegs * seg_gap);
    for (size_t i = 0; i < m->nsegs; i++) {
        uint64_t a = m->segs[i].addr, end = a + m->segs[i].size;
        if (fl.x > x0)
            fl.x += seg_gap;
        while (a < end) {
            if (fl.x >= x1 - 0.5 && fl.row + 1 < fl.rows) {
                fl.row++;
                fl.x = x0;
            }
            uint64_t fit = (uint64_t)((x1 - fl.x) * fl.bytes_per_px);
            uint64_t e = fl.row + 1 == fl.rows || end - a <= fit ? end : a + (fit ? fit : 1);
            map_part(&fl, m, &bi, a, e);
            a = e;
        }
    }
    return y0 + fl.rows * (MT__PLOT_MAP_ROW_H + MT__PLOT_MAP_ROW_GAP);
}

void mt__plot_map(FILE *f, const mt__report_map_t *mp, double x0, double x1, double y,
                  const char *at)
{
    const mt__report_map_t m = *mp;
    mapstat_t st = map_stats(&m);
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"13\" font-weight=\"bold\">"
            "segment map at %s (peak reserved): %zu segment%s, %s</text>\n",
            x0, y, at, m.nsegs, m.nsegs == 1 ? "" : "s",
            mt__plot_human((double)st.reserved, b1, sizeof b1));
    if (m.nsegs == 0) {
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"12\" fill=\"#666\">no "
                "segment events in the log</text>\n",
                x0, y + 24);
    } else {
        double bottom = map_draw(f, &m, &st, x0, x1, y + 12);
        /* The model's figures: one definition of each, as /state and the report give. */
        st.free = m.total_free;
        st.largest_free = m.largest_free;
        double util = mt__model_utilization(st.in_use, st.reserved);
        double frag = mt__model_fragmentation(st.largest_free, st.free);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"12\" fill=\"#333\">"
                "in use %s (utilization %.1f%%)",
                x0, bottom + 12, mt__plot_human((double)st.in_use, b1, sizeof b1), 100 * util);
        if (st.pending)
            fprintf(f, ", %s freed and waiting on a stream (faded)",
                    mt__plot_human((double)st.pending, b2, sizeof b2));
        fprintf(f, "; free %s in %llu extent%s, largest %s: fragmentation %.1f%%</text>\n",
                mt__plot_human((double)st.free, b3, sizeof b3), (unsigned long long)st.free_extents,
                st.free_extents == 1 ? "" : "s",
                mt__plot_human((double)st.largest_free, b4, sizeof b4), 100 * frag);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"11\" fill=\"#666\">"
                "fragmentation = 1 - largest free extent / free; %s; free space grey</text>\n",
                x0, bottom + 28,
                m.nsegs <= MAP_ONE_PER_ROW
                    ? "one bar per segment, width proportional to bytes"
                    : "segments in address order, wrapping at the end of a row");
    }
}
