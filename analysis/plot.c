/* The SVG of `memtrace plot` (see plot.h). Two replays of the process's events through
 * the report's models: the first finds the extent, the peaks and the moment of the segment
 * map; the second fills the time buckets. Then the picture is written top to bottom (the
 * segment map by plot_map.c). */
#include "analysis/plot_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/text.h"

/* Colours: one fixed colour per built-in tag (the same in every plot, so people learn
 * them), a cycle for user tags; free space and the cache are greys. */
static const char *const builtin_colour[MT_TAG_USER_FIRST] = {
    "#9c755f", /* other */
    "#4e79a7", /* weights */
    "#f28e2b", /* grads */
    "#59a14f", /* optimizer */
    "#e15759", /* activations */
    "#76b7b2", /* workspace */
    "#edc948", /* batch */
};
static const char *const user_colour[] = {"#b07aa1", "#ff9da7", "#17becf", "#bcbd22",
                                          "#8c564b", "#1f77b4", "#d62728", "#7f7f7f"};
#define CACHE_COLOUR    "#eeeeee"
#define RESERVED_COLOUR "#222222"
#define HOST_COLOUR     "#8cd17d"

const char *mt__plot_colour(int tag)
{
    return tag < MT_TAG_USER_FIRST ? builtin_colour[tag]
                                   : user_colour[(tag - MT_TAG_USER_FIRST) %
                                                 (sizeof user_colour / sizeof *user_colour)];
}

/* Stacking order, bottom up: what lives long first (weights, grads, optimizer state), the
 * transient at the top where its rise and fall is easiest to see. */
static int stack_order(int *order)
{
    static const int first[] = {MT_TAG_WEIGHTS, MT_TAG_GRADS, MT_TAG_OPTIMIZER, MT_TAG_OTHER};
    static const int last[] = {MT_TAG_BATCH, MT_TAG_WORKSPACE, MT_TAG_ACTIVATIONS};
    int n = 0;
    for (size_t i = 0; i < sizeof first / sizeof *first; i++)
        order[n++] = first[i];
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++)
        order[n++] = t;
    for (size_t i = 0; i < sizeof last / sizeof *last; i++)
        order[n++] = last[i];
    return n;
}

mt__plot_cfg_t mt__plot_cfg_default(void)
{
    return (mt__plot_cfg_t){.pid = -1, .width = 1200, .height = 800, .max_buckets = 1000};
}

/* ---- pass 1: extent, peaks, the moment of the map ---- */

/* Lanes: one per device when a process used several (the first MAX_LANES seen). */
#define MAX_LANES 8

typedef struct scan_s {
    unsigned nlanes, lane_dev[MAX_LANES]; /* device ordinal of each lane, in order seen */
    uint64_t lane_peak_alloc[MAX_LANES], lane_peak_res[MAX_LANES];
    uint64_t t0, t1;
    uint64_t peak_alloc, peak_res;
    size_t map_index; /* the event after which the segment map is drawn */
    uint64_t map_res, map_alloc, map_t;
    uint64_t tag_peak[MT_TAG_MAX];
    uint64_t host_peak_alloc, host_peak_res, host_events;
    uint64_t capacity;     /* from the device allocator's config event; 0 unknown */
    mt_event_rec_t *marks; /* OOM events, iteration and named marks, in log order (copies: a
                            * replay's events live as long as their chunk) */
    size_t nmarks, cap_marks, n_oom, n_iter;
    bool untimed; /* the times are the events' order (mt__report_untimed): shown as events */
    bool state;   /* a snapshot's state alone (mt__report_state_only): its blocks in address
                   * order, no history */
} scan_t;

/* The moment t (ns since s->t0) as the plot writes it: seconds, or the event it counts when
 * the input has no clock. */
static const char *when(const scan_t *s, uint64_t t, char *buf, size_t len)
{
    if (s->untimed)
        snprintf(buf, len, "event %" PRIu64, t);
    else
        snprintf(buf, len, "%.3f s", (double)t / 1e9);
    return buf;
}

static int scan_point(void *ctx, const mt__report_point_t *pt)
{
    scan_t *s = ctx;
    const mt_event_rec_t *ev = pt->ev;
    if (pt->index == 0)
        s->t0 = s->t1 = ev->time_ns;
    s->t0 = ev->time_ns < s->t0 ? ev->time_ns : s->t0;
    s->t1 = ev->time_ns > s->t1 ? ev->time_ns : s->t1;
    if (ev->pool == MT_POOL_HOST) {
        s->host_events++;
        s->host_peak_alloc =
            pt->host_allocated > s->host_peak_alloc ? pt->host_allocated : s->host_peak_alloc;
        s->host_peak_res =
            pt->host_reserved > s->host_peak_res ? pt->host_reserved : s->host_peak_res;
        return 0;
    }
    if (ev->kind == MT_EV_CONFIG && !s->capacity)
        s->capacity = ev->size;
    unsigned ln = 0;
    while (ln < s->nlanes && s->lane_dev[ln] != ev->device)
        ln++;
    bool totals = ev->kind != MT_EV_MARK && ev->kind != MT_EV_MARK_NAMED && ev->kind != MT_EV_GAP &&
                  ev->kind != MT_EV_TAG_LABEL &&
                  ev->kind != MT_EV_LIBRARY_LABEL; /* events that carry an allocator's totals */
    if (ln == s->nlanes && ln < MAX_LANES && totals)
        s->lane_dev[s->nlanes++] = ev->device;
    if (ln < s->nlanes) {
        uint64_t a, r;
        mt__model_device(pt->model, ev->device, false, &a, &r);
        s->lane_peak_alloc[ln] = a > s->lane_peak_alloc[ln] ? a : s->lane_peak_alloc[ln];
        s->lane_peak_res[ln] = r > s->lane_peak_res[ln] ? r : s->lane_peak_res[ln];
    }
    s->peak_alloc = pt->allocated > s->peak_alloc ? pt->allocated : s->peak_alloc;
    s->peak_res = pt->reserved > s->peak_res ? pt->reserved : s->peak_res;
    if (pt->reserved > s->map_res || (pt->reserved == s->map_res && pt->allocated > s->map_alloc)) {
        s->map_res = pt->reserved;
        s->map_alloc = pt->allocated;
        s->map_index = pt->index;
        s->map_t = ev->time_ns;
    }
    for (uint32_t held = pt->tag_mask; held != 0; held &= held - 1) {
        int t = __builtin_ctz(held);
        s->tag_peak[t] = pt->tag_live[t] > s->tag_peak[t] ? pt->tag_live[t] : s->tag_peak[t];
    }
    bool oom = ev->kind == MT_EV_OOM;
    bool iter = ev->kind == MT_EV_MARK && ev->addr == MT_MARK_ITERATION;
    if (!oom && !iter && ev->kind != MT_EV_MARK_NAMED)
        return 0;
    if (s->nmarks == s->cap_marks) {
        size_t cap = s->cap_marks ? 2 * s->cap_marks : 64;
        mt_event_rec_t *m = realloc(s->marks, cap * sizeof(*m));
        if (!m)
            return MT_ENOMEM;
        s->marks = m;
        s->cap_marks = cap;
    }
    s->marks[s->nmarks++] = *ev;
    s->n_oom += oom;
    s->n_iter += iter;
    return 0;
}

/* What the buckets need before the replay, from the events alone: the span and the lanes,
 * as scan_point finds them by the end. */
static int pre_event(void *ctx, const mt_event_rec_t *ev, size_t index)
{
    scan_t *s = ctx;
    if (index == 0)
        s->t0 = s->t1 = ev->time_ns;
    s->t0 = ev->time_ns < s->t0 ? ev->time_ns : s->t0;
    s->t1 = ev->time_ns > s->t1 ? ev->time_ns : s->t1;
    if (ev->pool == MT_POOL_HOST || s->nlanes == MAX_LANES)
        return 0;
    bool totals = ev->kind != MT_EV_MARK && ev->kind != MT_EV_MARK_NAMED && ev->kind != MT_EV_GAP &&
                  ev->kind != MT_EV_TAG_LABEL && ev->kind != MT_EV_LIBRARY_LABEL;
    unsigned ln = 0;
    while (ln < s->nlanes && s->lane_dev[ln] != ev->device)
        ln++;
    if (ln == s->nlanes && totals)
        s->lane_dev[s->nlanes++] = ev->device;
    return 0;
}

/* ---- pass 2: time buckets ---- */

/* One bucket: the moments of least and most device memory in use in its time span (lo
 * before hi when it came first), and the most reserved (device, host) in it. A bucket no
 * event falls in repeats the state its predecessor ended with. */
typedef struct bucket_s {
    double lo[MT_TAG_MAX], hi[MT_TAG_MAX];
    double lo_sum, hi_sum;
    size_t lo_idx, hi_idx;
    double res, host_alloc, host_res;
    double lane_alloc[MAX_LANES], lane_res[MAX_LANES]; /* the most in the span, per device */
    bool seen;
} bucket_t;

typedef struct fill_s {
    const scan_t *scan;
    bucket_t *b;
    size_t nb, cur;
    double last[MT_TAG_MAX], last_sum, last_res, last_halloc, last_hres;
    double last_lane_alloc[MAX_LANES], last_lane_res[MAX_LANES];
} fill_t;

static void bucket_fill_from_last(fill_t *f, bucket_t *b)
{
    memcpy(b->lo, f->last, sizeof(b->lo));
    memcpy(b->hi, f->last, sizeof(b->hi));
    b->lo_sum = b->hi_sum = f->last_sum;
    b->res = f->last_res;
    b->host_alloc = f->last_halloc;
    b->host_res = f->last_hres;
    memcpy(b->lane_alloc, f->last_lane_alloc, sizeof b->lane_alloc);
    memcpy(b->lane_res, f->last_lane_res, sizeof b->lane_res);
    b->seen = true;
}

static int fill_point(void *ctx, const mt__report_point_t *pt)
{
    fill_t *f = ctx;
    const scan_t *s = f->scan;
    double span = (double)(s->t1 - s->t0) + 1.0;
    size_t k = (size_t)((double)(pt->ev->time_ns - s->t0) / span * (double)f->nb);
    k = k >= f->nb ? f->nb - 1 : k;
    k = k < f->cur ? f->cur : k; /* a late line from another thread stays in place */
    for (; f->cur < k; f->cur++)
        if (!f->b[f->cur].seen)
            bucket_fill_from_last(f, &f->b[f->cur]);
    bucket_t *b = &f->b[k];
    /* Tags outside the mask are 0 in last (they always were): adding them changes no sum. */
    double sum = 0;
    for (uint32_t held = pt->tag_mask; held != 0; held &= held - 1) {
        int t = __builtin_ctz(held);
        f->last[t] = pt->tag_live[t] > 0 ? (double)pt->tag_live[t] : 0.0;
        sum += f->last[t];
    }
    f->last_sum = sum;
    f->last_res = (double)pt->reserved;
    f->last_halloc = (double)pt->host_allocated;
    f->last_hres = (double)pt->host_reserved;
    for (unsigned ln = 0; ln < s->nlanes; ln++)
        if (s->lane_dev[ln] == pt->ev->device && pt->ev->pool != MT_POOL_HOST) {
            uint64_t a, r;
            mt__model_device(pt->model, pt->ev->device, false, &a, &r);
            f->last_lane_alloc[ln] = (double)a;
            f->last_lane_res[ln] = (double)r;
            b->lane_alloc[ln] = b->seen && b->lane_alloc[ln] > a ? b->lane_alloc[ln] : (double)a;
            b->lane_res[ln] = b->seen && b->lane_res[ln] > r ? b->lane_res[ln] : (double)r;
        }
    if (!b->seen) {
        bucket_fill_from_last(f, b);
        b->lo_idx = b->hi_idx = pt->index;
        return 0;
    }
    if (sum < b->lo_sum) {
        memcpy(b->lo, f->last, sizeof(b->lo));
        b->lo_sum = sum;
        b->lo_idx = pt->index;
    }
    if (sum > b->hi_sum) {
        memcpy(b->hi, f->last, sizeof(b->hi));
        b->hi_sum = sum;
        b->hi_idx = pt->index;
    }
    b->res = f->last_res > b->res ? f->last_res : b->res;
    b->host_alloc = f->last_halloc > b->host_alloc ? f->last_halloc : b->host_alloc;
    b->host_res = f->last_hres > b->host_res ? f->last_hres : b->host_res;
    return 0;
}

/* The replay: the scan and the buckets at once (the buckets read the span and lanes from
 * pre_event's scan, never from the one this replay fills). */
typedef struct both_s {
    scan_t *scan;
    fill_t *fill;
} both_t;

static int both_point(void *ctx, const mt__report_point_t *pt)
{
    both_t *b = ctx;
    int rc = scan_point(b->scan, pt);
    return rc != 0 ? rc : fill_point(b->fill, pt);
}

/* ---- drawing helpers ---- */

const char *mt__plot_human(double b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
}

/* Text content: the five XML specials escaped; control bytes (never in a name we want)
 * dropped, since XML 1.0 forbids them. */
void mt__plot_xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            if ((unsigned char)*s >= 0x80) { /* a well-formed character, else U+FFFD */
                int n = mt__text_utf8_len((const unsigned char *)s);
                if (n > 0) {
                    fwrite(s, 1, (size_t)n, f);
                    s += n - 1;
                } else
                    fputs("\xef\xbf\xbd", f);
            } else if ((unsigned char)*s >= 0x20)
                fputc(*s, f);
        }
    }
}

/* A step of 1, 2 or 5 times a power of ten, giving about n ticks over [0, v]. */
static double nice_step(double v, int n)
{
    double raw = v / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
}

/* A panel's frame: plot area [x0,x1] x [y0,y1], byte ticks on the left up to vmax. */
typedef struct panel_s {
    double x0, x1, y0, y1, vmax;
} panel_t;

static double py(const panel_t *p, double v)
{
    return p->y1 - (p->vmax > 0 ? v / p->vmax : 0) * (p->y1 - p->y0);
}

static void byte_axis(FILE *f, const panel_t *p, int nticks)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double unit = 1;
    while (p->vmax / unit >= 1024 && u < 4) {
        unit *= 1024;
        u++;
    }
    double step = nice_step(p->vmax / unit, nticks);
    fprintf(f, "<g " MT__PLOT_FONT " font-size=\"11\" fill=\"#444\" text-anchor=\"end\">\n");
    for (double v = 0; v <= p->vmax / unit * 1.0001; v += step) {
        double y = py(p, v * unit);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                "<text x=\"%.1f\" y=\"%.1f\">%g %s</text>\n",
                p->x0, y, p->x1, y, p->x0 - 6, y + 4, v, units[u]);
    }
    fprintf(f, "</g>\n");
}

/* The timeline's x axis over seconds, or over events (untimed: seconds * 1e9 of them). */
static void time_axis(FILE *f, const panel_t *p, double seconds, bool untimed, bool state)
{
    if (untimed)
        seconds *= 1e9;
    double step = nice_step(seconds > 0 ? seconds : 1, 8);
    fprintf(f, "<g " MT__PLOT_FONT " font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">\n");
    for (double t = 0; t <= seconds * 1.0001; t += step) {
        double x = p->x0 + (seconds > 0 ? t / seconds : 0) * (p->x1 - p->x0);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>"
                "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n",
                x, p->y1, x, p->y1 + 4, x, p->y1 + 16, t);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n</g>\n", (p->x0 + p->x1) / 2, p->y1 + 32,
            state     ? "block, in address order (a state snapshot: no history)"
            : untimed ? "event (the input has no clock)"
                      : "time (s)");
}

/* A filled area under y(x) down to the panel's base, or a line (fill NULL): points on
 * a horizontal run are dropped, the rest at 0.1 px. */
static void series(FILE *f, const panel_t *p, const double *xs, const double *vs, size_t n,
                   const char *fill, const char *stroke, const char *extra)
{
    fprintf(f, "<path d=\"");
    double prev_y = NAN;
    for (size_t i = 0; i < n; i++) {
        double y = round(py(p, vs[i]) * 10) / 10;
        double next_y = i + 1 < n ? round(py(p, vs[i + 1]) * 10) / 10 : NAN;
        if (i > 0 && i + 1 < n && y == prev_y && y == next_y)
            continue;
        if (i == 0 && fill)
            fprintf(f, "M%.1f %.1fL%.1f %.1f", xs[0], p->y1, xs[0], y);
        else
            fprintf(f, "%s%.1f %.1f", i == 0 ? "M" : "L", xs[i], y);
        prev_y = y;
    }
    if (fill && n)
        fprintf(f, "L%.1f %.1fZ", xs[n - 1], p->y1);
    fprintf(f, "\" fill=\"%s\" stroke=\"%s\"%s/>\n", fill ? fill : "none", stroke ? stroke : "none",
            extra ? extra : "");
}

/* ---- the picture ---- */

static void legend_row(FILE *f, double x, double y, const char *swatch, const char *name,
                       const char *value)
{
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y - 10,
            swatch);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x + 18, y);
    mt__plot_xml_text(f, name);
    fprintf(f, "</text><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", x + 190, y,
            value);
}

static int find_process(const mt__report_t *r, int pid, size_t *out)
{
    size_t best_n = 0;
    bool found = false;
    for (size_t i = 0; i < mt__report_process_count(r); i++) {
        int p;
        const char *name;
        size_t n;
        mt__report_process(r, i, &p, &name, &n);
        if (pid >= 0 ? p == pid : !found || n > best_n) {
            *out = i;
            best_n = n;
            found = true;
        }
    }
    return found ? 0 : MT_ENOENT;
}

typedef struct layout_s {
    double w, h;
    panel_t tl, host;
    panel_t lane[MAX_LANES]; /* one per device when there are several (nlanes > 1) */
    unsigned nlanes;
    double map_y;
    bool has_host;
} layout_t;

#define LANE_H 100 /* px per device lane, added to the picture's height */

static layout_t layout(const mt__plot_cfg_t *cfg, bool has_host, int rows, unsigned nlanes)
{
    layout_t l;
    memset(&l, 0, sizeof l);
    l.w = cfg->width < 800 ? 800 : cfg->width;
    l.h = cfg->height < 600 ? 600 : cfg->height;
    l.has_host = has_host;
    l.nlanes = nlanes > 1 ? nlanes : 0;
    double lanes_block = l.nlanes * LANE_H;
    l.h += lanes_block;
    double x0 = 84, x1 = l.w - 226;
    double top = 78, map_block = 100 + rows * (MT__PLOT_MAP_ROW_H + MT__PLOT_MAP_ROW_GAP);
    double host_block = has_host ? (l.h - lanes_block) * 0.15 : 0;
    double tl_bottom = l.h - map_block - host_block - lanes_block - 20;
    l.tl = (panel_t){x0, x1, top, tl_bottom, 0};
    l.host = (panel_t){x0, x1, tl_bottom + 70, tl_bottom + 44 + host_block - 30, 0};
    double lane_top = tl_bottom + 44 + host_block;
    for (unsigned i = 0; i < l.nlanes; i++)
        l.lane[i] =
            (panel_t){x0, x1, lane_top + i * LANE_H + 26, lane_top + (i + 1) * LANE_H - 14, 0};
    l.map_y = l.h - map_block + 30;
    return l;
}

static void draw_title(FILE *f, const layout_t *l, int pid, const char *name, const scan_t *s,
                       size_t events)
{
    char b1[32], b2[32], b3[32];
    fprintf(f, "<text x=\"%.1f\" y=\"28\" " MT__PLOT_FONT " font-size=\"18\" font-weight=\"bold\">",
            l->tl.x0);
    mt__plot_xml_text(f, name && *name ? name : "process");
    fprintf(f, " (pid %d): device memory</text>\n", pid);
    fprintf(f,
            "<text x=\"%.1f\" y=\"50\" " MT__PLOT_FONT
            " font-size=\"13\" fill=\"#333\">peak allocated "
            "%s, peak reserved %s",
            l->tl.x0, mt__plot_human((double)s->peak_alloc, b1, sizeof b1),
            mt__plot_human((double)s->peak_res, b2, sizeof b2));
    if (s->capacity)
        fprintf(f, ", device capacity %s", mt__plot_human((double)s->capacity, b3, sizeof b3));
    if (s->state)
        fprintf(f, "; a state snapshot of %zu segments and blocks (no history)", events);
    else if (s->untimed)
        fprintf(f, "; %zu events (no clock in the input)", events);
    else
        fprintf(f, "; %zu events over %.3f s", events, (double)(s->t1 - s->t0) / 1e9);
    if (s->n_oom)
        fprintf(f, "; <tspan fill=\"%s\" font-weight=\"bold\">%zu OOM</tspan>", MT__PLOT_OOM_COLOUR,
                s->n_oom);
    fprintf(f, "</text>\n");
}

/* Stacked areas by tag (drawn from the full stack down, each over the last), the cache
 * under the reserved line, markers. xs/cum are the sampled points. */
static void draw_timeline(FILE *f, const layout_t *l, const scan_t *s, const bucket_t *bk,
                          size_t nb, const int *tags, int ntags, double *xs, double *vs,
                          double **cum, size_t npts)
{
    const panel_t *p = &l->tl;
    double seconds = (double)(s->t1 - s->t0) / 1e9, span = (double)(s->t1 - s->t0) + 1.0;
    for (size_t k = 0; k < nb; k++)
        vs[2 * k] = vs[2 * k + 1] = bk[k].res;
    series(f, p, xs, vs, npts, CACHE_COLOUR, NULL, NULL);
    byte_axis(f, p, 6);
    for (int j = ntags - 1; j >= 0; j--) {
        char extra[64];
        snprintf(extra, sizeof extra, " class=\"area tag-%d\"", tags[j]);
        series(f, p, xs, cum[j], npts, mt__plot_colour(tags[j]), NULL, extra);
    }
    series(f, p, xs, vs, npts, NULL, RESERVED_COLOUR, " stroke-width=\"1.5\"");
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#888\"/>\n",
            p->x0, p->y0, p->x1 - p->x0, p->y1 - p->y0);
    time_axis(f, p, seconds, s->untimed, s->state);

    mt__plot_marks(f, s->marks, s->nmarks, s->untimed, s->t0, span, p->x0, p->x1, p->y0, p->y1);
    /* The peak of memory in use, and the moment of the segment map below. */
    size_t pk = 0;
    for (size_t i = 1; i < npts; i++)
        pk = ntags && cum[ntags - 1][i] > cum[ntags - 1][pk] ? i : pk;
    if (ntags) {
        char b1[32];
        double y = py(p, cum[ntags - 1][pk]);
        fprintf(f,
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#000\"/><text x=\"%.1f\" "
                "y=\"%.1f\" " MT__PLOT_FONT " font-size=\"11\"%s>peak in use %s</text>\n",
                xs[pk], y, xs[pk] + (xs[pk] > (p->x0 + p->x1) / 2 ? -6 : 6), y - 6,
                xs[pk] > (p->x0 + p->x1) / 2 ? " text-anchor=\"end\"" : "",
                mt__plot_human(cum[ntags - 1][pk], b1, sizeof b1));
    }
    double mx = p->x0 + (double)(s->map_t - s->t0) / span * (p->x1 - p->x0);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" "
            "stroke-dasharray=\"3 3\"/><text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT
            " font-size=\"10\" "
            "fill=\"#333\"%s>segment map</text>\n",
            mx, p->y0 - 10, mx, p->y1, mx + (mx > (p->x0 + p->x1) / 2 ? -4 : 4), p->y0 - 4,
            mx > (p->x0 + p->x1) / 2 ? " text-anchor=\"end\"" : "");
}

static void draw_legend(FILE *f, const layout_t *l, const mt__report_t *r, size_t pi,
                        const scan_t *s, const int *tags, int ntags)
{
    char b1[32], tb[16];
    double x = l->tl.x1 + 18, y = l->tl.y0 + 12;
    fprintf(f, "<g " MT__PLOT_FONT " font-size=\"12\" fill=\"#222\">\n");
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">tag</text>"
            "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\" text-anchor=\"end\">peak</text>\n",
            x, y, x + 190, y);
    y += 20;
    for (int j = ntags - 1; j >= 0; j--, y += 18) /* top of the stack first, as drawn */
        legend_row(f, x, y, mt__plot_colour(tags[j]),
                   mt__report_tag_name(r, pi, tags[j], tb, sizeof tb),
                   mt__plot_human((double)s->tag_peak[tags[j]], b1, sizeof b1));
    y += 8;
    legend_row(f, x, y, CACHE_COLOUR, "cached (reserved, free)", "");
    y += 18;
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"1.5\"/>",
            x, y - 4, x + 12, y - 4, RESERVED_COLOUR);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\">reserved</text><text x=\"%.1f\" y=\"%.1f\" "
            "text-anchor=\"end\">%s</text>\n",
            x + 18, y, x + 190, y, mt__plot_human((double)s->peak_res, b1, sizeof b1));
    if (s->n_iter) {
        y += 18;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\"/>"
                "<text x=\"%.1f\" y=\"%.1f\">iterations</text><text x=\"%.1f\" y=\"%.1f\" "
                "text-anchor=\"end\">%zu</text>\n",
                x + 6, y - 10, x + 6, y, x + 18, y, x + 190, y, s->n_iter);
    }
    if (s->n_oom) {
        y += 18;
        fprintf(f,
                "<path d=\"M%.1f %.1fl-5 -8h10z\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">"
                "out of memory</text><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%zu</text>\n",
                x + 6, y, MT__PLOT_OOM_COLOUR, x + 18, y, x + 190, y, s->n_oom);
    }
    fprintf(f, "</g>\n");
}

/* A small panel under the timeline: allocated bytes filled, reserved as a line, from the
 * buckets' doubles at byte offsets alloc_off and res_off; the title is already written. */
static void draw_band(FILE *f, const panel_t *p, const bucket_t *bk, size_t nb, size_t alloc_off,
                      size_t res_off, const char *fill, const char *cls, double *xs, double *vs,
                      size_t npts)
{
    byte_axis(f, p, 2);
    for (size_t k = 0; k < nb; k++)
        vs[2 * k] = vs[2 * k + 1] = *(const double *)((const char *)&bk[k] + alloc_off);
    series(f, p, xs, vs, npts, fill, NULL, cls);
    for (size_t k = 0; k < nb; k++)
        vs[2 * k] = vs[2 * k + 1] = *(const double *)((const char *)&bk[k] + res_off);
    series(f, p, xs, vs, npts, NULL, RESERVED_COLOUR, " stroke-width=\"1.2\"");
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#888\"/>\n",
            p->x0, p->y0, p->x1 - p->x0, p->y1 - p->y0);
}

static void draw_host(FILE *f, const layout_t *l, const scan_t *s, const bucket_t *bk, size_t nb,
                      double *xs, double *vs, size_t npts)
{
    panel_t p = l->host;
    p.vmax = (double)s->host_peak_res * 1.1;
    p.vmax = p.vmax > 0 ? p.vmax : 1;
    char b1[32], b2[32];
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"13\" font-weight=\"bold\">"
            "pinned host memory (pool host, not device memory): peak allocated %s, peak "
            "reserved %s</text>\n",
            p.x0, p.y0 - 10, mt__plot_human((double)s->host_peak_alloc, b1, sizeof b1),
            mt__plot_human((double)s->host_peak_res, b2, sizeof b2));
    draw_band(f, &p, bk, nb, offsetof(bucket_t, host_alloc), offsetof(bucket_t, host_res),
              HOST_COLOUR, " class=\"host\"", xs, vs, npts);
}

/* Lane i: device s->lane_dev[i]'s allocated (filled) and reserved (line); the timeline
 * above is the process's, the sum over these. */
static void draw_lane(FILE *f, const layout_t *l, unsigned i, const scan_t *s, const bucket_t *bk,
                      size_t nb, double *xs, double *vs, size_t npts)
{
    panel_t p = l->lane[i];
    p.vmax = (double)s->lane_peak_res[i] * 1.1;
    p.vmax = p.vmax > 0 ? p.vmax : 1;
    char b1[32], b2[32];
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" " MT__PLOT_FONT " font-size=\"13\" font-weight=\"bold\" "
            "class=\"lane\">device %u: peak allocated %s, peak reserved %s (the timeline above "
            "is the sum of the devices)</text>\n",
            p.x0, p.y0 - 8, s->lane_dev[i],
            mt__plot_human((double)s->lane_peak_alloc[i], b1, sizeof b1),
            mt__plot_human((double)s->lane_peak_res[i], b2, sizeof b2));
    draw_band(f, &p, bk, nb, offsetof(bucket_t, lane_alloc) + i * sizeof(double),
              offsetof(bucket_t, lane_res) + i * sizeof(double), builtin_colour[MT_TAG_WEIGHTS],
              " class=\"device\"", xs, vs, npts);
}

int mt__plot_svg(const mt__report_t *r, const mt__plot_cfg_t *cfg, FILE *f, char *err,
                 size_t errlen)
{
    size_t pi = 0;
    if (find_process(r, cfg->pid, &pi) != 0) {
        snprintf(err, errlen, cfg->pid >= 0 ? "no process %d in the log" : "no process in the log",
                 cfg->pid);
        return MT_ENOENT;
    }
    int pid;
    const char *name;
    size_t events;
    mt__report_process(r, pi, &pid, &name, &events);
    if (events == 0) {
        snprintf(err, errlen, "process %d has no events in the log", pid);
        return MT_ENOENT;
    }
    /* Three walks over the events: the span and lanes (no model), the replay (scan and
     * buckets), the replay up to the map's moment. */
    scan_t s, pre;
    memset(&s, 0, sizeof s);
    memset(&pre, 0, sizeof pre);
    s.untimed = pre.untimed = mt__report_untimed(r, pi);
    s.state = pre.state = mt__report_state_only(r, pi);
    mt__report_map_t map = {0};
    layout_t l = layout(cfg, false, 0, 0); /* the timeline's width: cfg's alone */
    size_t nb = cfg->max_buckets ? cfg->max_buckets : 1;
    nb = nb > (size_t)(l.tl.x1 - l.tl.x0) ? (size_t)(l.tl.x1 - l.tl.x0) : nb;
    size_t npts = 2 * nb;
    int tags[MT_TAG_MAX], all[MT_TAG_MAX], ntags = 0, nall = stack_order(all);
    fill_t fl = {.scan = &pre, .nb = nb};
    fl.b = calloc(nb, sizeof(*fl.b));
    double *xs = malloc(npts * sizeof(double)), *vs = malloc(npts * sizeof(double));
    double *cum[MT_TAG_MAX] = {0};
    int rc = fl.b && xs && vs ? 0 : MT_ENOMEM;
    if (rc == 0)
        rc = mt__report_each(r, pi, pre_event, &pre);
    both_t both = {&s, &fl};
    if (rc == 0)
        rc = mt__report_replay(r, pi, both_point, &both);
    if (rc == 0)
        rc = mt__report_map_at(r, pi, s.map_index, false, &map);
    if (rc != 0)
        goto out;
    l = layout(cfg, s.host_events > 0, mt__plot_map_rows(&map), s.nlanes);
    for (int j = 0; j < nall; j++)
        if (s.tag_peak[all[j]] > 0)
            tags[ntags++] = all[j];
    for (int j = 0; j < ntags; j++)
        if ((cum[j] = malloc(npts * sizeof(double))) == NULL) {
            rc = MT_ENOMEM;
            goto out;
        }
    for (; fl.cur < nb; fl.cur++)
        if (!fl.b[fl.cur].seen)
            bucket_fill_from_last(&fl, &fl.b[fl.cur]);
    /* Two points per bucket, lo and hi in the order they happened. */
    double peak_sum = 0;
    for (size_t k = 0; k < nb; k++) {
        const bucket_t *b = &fl.b[k];
        bool lo_first = b->lo_idx <= b->hi_idx;
        const double *first = lo_first ? b->lo : b->hi, *second = lo_first ? b->hi : b->lo;
        xs[2 * k] = l.tl.x0 + (k + 0.25) / nb * (l.tl.x1 - l.tl.x0);
        xs[2 * k + 1] = l.tl.x0 + (k + 0.75) / nb * (l.tl.x1 - l.tl.x0);
        double c0 = 0, c1 = 0;
        for (int j = 0; j < ntags; j++) {
            c0 += first[tags[j]];
            c1 += second[tags[j]];
            cum[j][2 * k] = c0;
            cum[j][2 * k + 1] = c1;
        }
        peak_sum = c0 > peak_sum ? c0 : c1 > peak_sum ? c1 : peak_sum;
    }
    l.tl.vmax = (double)s.peak_res > peak_sum ? (double)s.peak_res : peak_sum;
    l.tl.vmax = l.tl.vmax > 0 ? l.tl.vmax * 1.08 : 1;

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\">\n<title>memtrace plot: ",
            l.w, l.h, l.w, l.h);
    mt__plot_xml_text(f, name);
    fprintf(f, " (pid %d)</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n", pid);
    draw_title(f, &l, pid, name, &s, mt__report_events_read(r, pi)); /* (the report's count) */
    draw_timeline(f, &l, &s, fl.b, nb, tags, ntags, xs, vs, cum, npts);
    draw_legend(f, &l, r, pi, &s, tags, ntags);
    if (l.has_host)
        draw_host(f, &l, &s, fl.b, nb, xs, vs, npts);
    for (unsigned i = 0; i < l.nlanes; i++)
        draw_lane(f, &l, i, &s, fl.b, nb, xs, vs, npts);
    char at[40];
    mt__plot_map(f, &map, l.tl.x0, l.tl.x1, l.map_y, when(&s, s.map_t - s.t0, at, sizeof at));
    fprintf(f, "</svg>\n");
    rc = ferror(f) ? MT_EIO : 0;
out:
    if (rc == MT_ENOMEM)
        snprintf(err, errlen, "out of memory");
    else if (rc == MT_EIO)
        snprintf(err, errlen, "write error");
    mt__report_map_free(&map);
    free(s.marks);
    free(fl.b);
    free(xs);
    free(vs);
    for (int j = 0; j < ntags; j++)
        free(cum[j]);
    return rc;
}
