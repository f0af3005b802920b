/* Flame graphs as SVG (flame.h). A prefix tree of frame labels with byte weights, drawn
 * bottom-up: the root ("all") spans the width, each frame sits on its caller, and widths
 * are proportional to bytes. */
#include "analysis/flame.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define FLAME_NODES_MAX (1u << 20) /* distinct prefixes kept; past it adds fail */

/* A node is one frame under one caller.
 * Invariants: bytes >= sum of the children's bytes (saturating at UINT64_MAX);
 * labels of one node's children are distinct; n_kids <= cap_kids. */
typedef struct node_s {
    char *label;          /* owned, NUL-terminated */
    uint64_t bytes;       /* of every stack through this frame */
    struct node_s **kids; /* owned array of owned nodes */
    uint32_t n_kids, cap_kids;
} node_t;

struct mt_flame_s {
    node_t root;    /* label "all" */
    size_t n_nodes; /* <= FLAME_NODES_MAX */
};

mt_flame_cfg_t mt__flame_cfg_default(void)
{
    return (mt_flame_cfg_t){
        .title = "Flame graph", .width = 1200, .frame_height = 16, .min_width_px = 0.1};
}

int mt__flame_create(mt_flame_t **out)
{
    *out = NULL;
    mt_flame_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        goto fail_struct;
    f->root.label = strdup("all");
    if (f->root.label == NULL)
        goto fail_label;
    *out = f;
    return 0;
fail_label:
    free(f);
fail_struct:
    return MT_ENOMEM;
}

static void node_free(node_t *n)
{
    for (uint32_t i = 0; i < n->n_kids; i++) {
        node_free(n->kids[i]);
        free(n->kids[i]);
    }
    free(n->kids);
    free(n->label);
}

void mt__flame_destroy(mt_flame_t **p)
{
    if (*p == NULL)
        return;
    node_free(&(*p)->root);
    free(*p);
    *p = NULL;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Children are kept sorted by label: lookups are a binary search, and drawing needs that
 * order. */
static node_t *kid_get(mt_flame_t *f, node_t *n, const char *label)
{
    uint32_t lo = 0, hi = n->n_kids;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(n->kids[mid]->label, label);
        if (c == 0)
            return n->kids[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (f->n_nodes >= FLAME_NODES_MAX)
        return NULL;
    if (n->n_kids == n->cap_kids) {
        uint32_t cap = n->cap_kids ? n->cap_kids * 2 : 4;
        node_t **k = realloc(n->kids, cap * sizeof(*k));
        if (k == NULL)
            return NULL;
        n->kids = k;
        n->cap_kids = cap;
    }
    node_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->label = strdup(label);
    if (c->label == NULL) {
        free(c);
        return NULL;
    }
    memmove(n->kids + lo + 1, n->kids + lo, (n->n_kids - lo) * sizeof(*n->kids));
    n->kids[lo] = c;
    n->n_kids++;
    f->n_nodes++;
    return c;
}

int mt__flame_add(mt_flame_t *f, const char *const *frames, int n, uint64_t bytes)
{
    if (n < 0 || n > MT_FLAME_DEPTH_MAX)
        return MT_EINVAL;
    for (int i = 0; i < n; i++) {
        if (frames[i] == NULL)
            return MT_EINVAL;
    }
    /* Find or make the whole path first, so that a failure leaves the sums untouched. */
    node_t *path[MT_FLAME_DEPTH_MAX];
    node_t *cur = &f->root;
    for (int i = 0; i < n; i++) {
        cur = kid_get(f, cur, frames[i]);
        if (cur == NULL)
            return f->n_nodes >= FLAME_NODES_MAX ? MT_EOVERFLOW : MT_ENOMEM;
        path[i] = cur;
    }
    f->root.bytes = sat_add(f->root.bytes, bytes);
    for (int i = 0; i < n; i++)
        path[i]->bytes = sat_add(path[i]->bytes, bytes);
    return 0;
}

uint64_t mt__flame_total(const mt_flame_t *f)
{
    return f->root.bytes;
}

/* ---- drawing ---- */

typedef struct draw_s {
    FILE *out;
    const mt_flame_cfg_t *cfg;
    double scale; /* pixels per byte */
    int height;   /* pixels */
    int err;
} draw_t;

static int depth_of(const node_t *n)
{
    int d = 0;
    for (uint32_t i = 0; i < n->n_kids; i++) {
        int k = depth_of(n->kids[i]);
        if (k > d)
            d = k;
    }
    return d + 1;
}

static void put_escaped(FILE *out, const char *s, size_t max)
{
    for (size_t i = 0; s[i] != '\0' && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '&':
            fputs("&amp;", out);
            break;
        case '<':
            fputs("&lt;", out);
            break;
        case '>':
            fputs("&gt;", out);
            break;
        case '"':
            fputs("&quot;", out);
            break;
        case '\'':
            fputs("&apos;", out);
            break;
        default:
            /* XML 1.0 forbids most control characters, even escaped. */
            if (c < 0x20 && c != '\t')
                fputc('?', out);
            else
                fputc(c, out);
        }
    }
}

static void human(uint64_t b, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%" PRIu64 " B", b);
    else
        snprintf(buf, n, "%.1f %s", v, unit[u]);
}

static unsigned colour_of(const char *label)
{
    uint32_t h = 2166136261u;
    for (const char *p = label; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    /* the usual warm palette: red 205-255, green 0-230, blue 0-55 */
    unsigned r = 205 + h % 51, g = (h >> 8) % 231, b = (h >> 16) % 56;
    return r << 16 | g << 8 | b;
}

static void draw_node(draw_t *d, const node_t *n, int depth, double x, uint64_t total)
{
    double w = (double)n->bytes * d->scale;
    if (w < d->cfg->min_width_px)
        return;
    int fh = d->cfg->frame_height;
    double y = d->height - 10.0 - (double)(depth + 1) * fh;
    char hb[32];
    human(n->bytes, hb, sizeof(hb));
    double pct = total ? 100.0 * (double)n->bytes / (double)total : 0.0;
    fputs("<g><title>", d->out);
    put_escaped(d->out, n->label, SIZE_MAX);
    fprintf(d->out, " (%s, %" PRIu64 " bytes, %.2f%%)</title>", hb, n->bytes, pct);
    fprintf(d->out,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"#%06x\" "
            "rx=\"2\" ry=\"2\"/>",
            x, y, w, fh - 1, colour_of(n->label));
    size_t fit = w > 12 ? (size_t)((w - 6) / (0.59 * 12)) : 0;
    if (fit >= 3) {
        fprintf(d->out, "<text x=\"%.1f\" y=\"%.1f\">", x + 3, y + fh - 4.5);
        size_t len = strlen(n->label);
        if (len <= fit) {
            put_escaped(d->out, n->label, len);
        } else {
            put_escaped(d->out, n->label, fit - 2);
            fputs("..", d->out);
        }
        fputs("</text>", d->out);
    }
    if (fputs("</g>\n", d->out) < 0)
        d->err = MT_EIO;
    double cx = x;
    for (uint32_t i = 0; i < n->n_kids; i++) {
        draw_node(d, n->kids[i], depth + 1, cx, total);
        cx += (double)n->kids[i]->bytes * d->scale;
    }
}

int mt__flame_write_svg(const mt_flame_t *f, const mt_flame_cfg_t *cfg, FILE *out)
{
    mt_flame_cfg_t c = cfg != NULL ? *cfg : mt__flame_cfg_default();
    if (c.width < 200)
        c.width = 200;
    if (c.frame_height < 10)
        c.frame_height = 10;
    int depth = depth_of(&f->root);
    draw_t d = {.out = out, .cfg = &c, .err = 0};
    d.height = depth * c.frame_height + 60;
    d.scale = f->root.bytes ? (double)(c.width - 20) / (double)f->root.bytes : 0.0;
    fprintf(out,
            "<?xml version=\"1.0\" standalone=\"no\"?>\n"
            "<svg version=\"1.1\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "xmlns=\"http://www.w3.org/2000/svg\">\n"
            "<style>text { font-family: Verdana, sans-serif; font-size: 12px; fill: #000; } "
            "rect:hover { stroke: #000; stroke-width: 0.5; }</style>\n"
            "<rect x=\"0\" y=\"0\" width=\"100%%\" height=\"100%%\" fill=\"#f8f8f8\"/>\n"
            "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" style=\"font-size:17px\">",
            c.width, d.height, c.width, d.height, c.width / 2);
    put_escaped(out, c.title != NULL ? c.title : "", SIZE_MAX);
    fputs("</text>\n", out);
    if (f->root.bytes == 0)
        fprintf(out, "<text x=\"%d\" y=\"44\" text-anchor=\"middle\">no bytes to show</text>\n",
                c.width / 2);
    else
        draw_node(&d, &f->root, 0, 10.0, f->root.bytes);
    if (fputs("</svg>\n", out) < 0 || fflush(out) != 0 || ferror(out))
        d.err = MT_EIO;
    return d.err;
}
