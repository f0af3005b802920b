/* Call-site views (callsite.h): ranking, labelling, JSON and flame-graph input. */
#include "analysis/callsite.h"
#include "analysis/frames.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static int row_cmp(const void *a, const void *b)
{
    const mt_cs_row_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

void mt__cs_rows_sort(mt_cs_row_t *rows, size_t n)
{
    if (n > 1)
        qsort(rows, n, sizeof(*rows), row_cmp);
}

/* ---- merging rows that read the same ---- */

typedef struct chain_s {
    uint64_t hash;       /* of the label pointers (labels are interned: same text, same pointer) */
    size_t row;          /* index in rows */
    const char **labels; /* into one block of n_frames pointers per row */
} chain_t;

static int chain_cmp(const void *a, const void *b)
{
    const chain_t *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

static bool chain_eq(const chain_t *a, const chain_t *b, const mt_cs_row_t *rows)
{
    const mt_cs_row_t *x = &rows[a->row], *y = &rows[b->row];
    if (x->n_frames != y->n_frames || x->truncated != y->truncated)
        return false;
    for (int k = 0; k < x->n_frames; k++) {
        if (a->labels[k] != b->labels[k])
            return false;
    }
    return true;
}

int mt__cs_rows_merge(mt_sym_t *s, uint32_t pid, mt_cs_row_t *rows, size_t *n)
{
    size_t total = 0;
    for (size_t i = 0; i < *n; i++)
        total += rows[i].frames != NULL ? (size_t)rows[i].n_frames : 0;
    chain_t *ch = calloc(*n ? *n : 1, sizeof(*ch));
    const char **lab = calloc(total ? total : 1, sizeof(*lab));
    bool *gone = calloc(*n ? *n : 1, sizeof(*gone));
    if (ch == NULL || lab == NULL || gone == NULL) {
        free(ch);
        free(lab);
        free(gone);
        return MT_ENOMEM;
    }
    size_t used = 0;
    for (size_t i = 0; i < *n; i++) {
        uint64_t h = 1469598103934665603ull;
        ch[i] = (chain_t){.row = i, .labels = lab + used};
        int nf = rows[i].frames != NULL ? rows[i].n_frames : 0;
        for (int k = 0; k < nf; k++) {
            mt_sym_frame_t fr;
            if (mt__cs_frame_label(s, pid, &rows[i].frames[k], &fr) != 0) {
                /* a frame that reads "unknown frame" for want of memory merges wrongly */
                free(ch);
                free(lab);
                free(gone);
                return MT_ENOMEM;
            }
            ch[i].labels[k] = fr.label;
            h = (h ^ (uintptr_t)fr.label) * 1099511628211ull;
        }
        /* Rows without frames (id 0, unknown ids) never merge: their hash is their row. */
        ch[i].hash = nf > 0 ? h : ~(uint64_t)i;
        used += (size_t)nf;
    }
    qsort(ch, *n, sizeof(*ch), chain_cmp);
    for (size_t i = 0; i < *n;) {
        size_t j = i + 1;
        for (; j < *n && ch[j].hash == ch[i].hash; j++) {
            if (rows[ch[j].row].frames == NULL || !chain_eq(&ch[i], &ch[j], rows))
                continue;
            mt_cs_row_t *into = &rows[ch[i].row], *from = &rows[ch[j].row];
            into->bytes =
                into->bytes > UINT64_MAX - from->bytes ? UINT64_MAX : into->bytes + from->bytes;
            into->blocks += from->blocks;
            gone[ch[j].row] = true;
        }
        i = j;
    }
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        if (!gone[i])
            rows[k++] = rows[i];
    }
    *n = k;
    free(ch);
    free(lab);
    free(gone);
    mt__cs_rows_sort(rows, *n);
    return 0;
}

int mt__cs_frame_label(mt_sym_t *s, uint32_t pid, const mt_cs_frame_t *f, mt_sym_frame_t *out)
{
    if (f->py_func != NULL)
        return mt__sym_python(s, f->py_func, f->py_file, f->py_line, out);
    return mt__sym_resolve(s, pid, f->ip, out);
}

static void site_name(const mt_cs_row_t *row, char *buf, size_t len)
{
    if (row->stack == 0)
        snprintf(buf, len, MT_FR_NO_STACK);
    else
        snprintf(buf, len, "unknown stack %" PRIu32, row->stack);
}

/* ---- JSON ---- */

/* A JSON string of s; names from a producer may not be UTF-8: then its bytes >= 0x80 read
 * '?'. */
static json_t *jstr(const char *s)
{
    json_t *j = json_string(s);
    if (j != NULL || s == NULL)
        return j;
    char *c = strdup(s);
    if (c == NULL)
        return NULL;
    for (char *p = c; *p; p++) {
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    }
    j = json_string(c);
    free(c);
    return j;
}

static json_t *frame_json(const mt_sym_frame_t *fr, bool python)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    int bad = json_object_set_new(o, "label", jstr(fr->label));
    bad |= json_object_set_new(o, "function", fr->func ? jstr(fr->func) : json_null());
    bad |= json_object_set_new(o, "file", fr->file ? jstr(fr->file) : json_null());
    bad |= json_object_set_new(o, "line", json_integer(fr->line));
    bad |= json_object_set_new(o, "module", fr->module ? jstr(fr->module) : json_null());
    bad |= json_object_set_new(o, "python", json_boolean(python));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* f symbolized into fr, and as the frame rules see it into *ff (analysis/frames.h). 0 or
 * MT_ENOMEM. */
static int frame_of(mt_sym_t *s, uint32_t pid, const mt_cs_frame_t *f, mt_sym_frame_t *fr,
                    mt_fr_frame_t *ff)
{
    int rc = mt__cs_frame_label(s, pid, f, fr);
    *ff = (mt_fr_frame_t){.func = fr->func,
                          .file = fr->file,
                          .line = fr->line,
                          .module = fr->module,
                          .python = f->py_func != NULL};
    return rc;
}

static json_t *row_json(mt_sym_t *s, uint32_t pid, const mt_cs_row_t *row, bool growth)
{
    json_t *o = json_object(), *frames = json_array();
    char site[64];
    const char *site_label = NULL;
    int bad = o == NULL || frames == NULL;
    /* The site is the user's frame (analysis/frames.h, default rules), or mt__fr_pick's
     * fallback when there is none. */
    int n = row->frames != NULL ? row->n_frames : 0, user = 0;
    mt_sym_frame_t *fr = n > 0 ? malloc((size_t)n * sizeof *fr) : NULL;
    mt_fr_frame_t *ff = n > 0 ? malloc((size_t)n * sizeof *ff) : NULL;
    bad |= n > 0 && (fr == NULL || ff == NULL);
    for (int i = 0; !bad && i < n; i++) {
        bad |=
            frame_of(s, pid, &row->frames[i], &fr[i], &ff[i]) != 0 ||
            json_array_append_new(frames, frame_json(&fr[i], row->frames[i].py_func != NULL)) != 0;
    }
    int k = bad ? -1 : mt__fr_pick(NULL, ff, (size_t)n);
    if (k >= 0) {
        user = k;
        site_label = fr[k].label;
    }
    free(ff);
    if (site_label == NULL) {
        site_name(row, site, sizeof(site));
        site_label = site;
    }
    if (!bad) {
        bad |= json_object_set_new(o, "stack", json_integer(row->stack));
        bad |= json_object_set_new(
            o, "bytes",
            json_integer((json_int_t)(row->bytes > INT64_MAX ? INT64_MAX : row->bytes)));
        bad |= json_object_set_new(
            o, "blocks",
            json_integer((json_int_t)(row->blocks > INT64_MAX ? INT64_MAX : row->blocks)));
        bad |= json_object_set_new(o, "site", jstr(site_label));
        bad |= json_object_set_new(o, "user_frame", json_integer(user));
        bad |= json_object_set(o, "frames", frames);
        bad |= json_object_set_new(o, "truncated", json_boolean(row->truncated));
        if (row->stack != 0 && row->frames == NULL)
            bad |= json_object_set_new(o, "unknown", json_true());
        if (growth) {
            bad |= json_object_set_new(o, "slope", json_real(row->slope));
            bad |= json_object_set_new(o, "r2", json_real(row->r2));
            bad |= json_object_set_new(o, "detected", json_boolean(row->detected));
        }
    }
    json_decref(frames);
    free(fr);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *mt__cs_rows_json(mt_sym_t *s, uint32_t pid, const mt_cs_row_t *rows, size_t n, size_t top,
                         bool growth)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n && i < top; i++) {
        if (json_array_append_new(a, row_json(s, pid, &rows[i], growth)) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* ---- flame graph ---- */

int mt__cs_flame_add(mt_flame_t *f, mt_sym_t *s, uint32_t pid, const mt_cs_row_t *row)
{
    const char *labels[MT_FLAME_DEPTH_MAX];
    char site[64];
    int n = 0;
    if (row->frames == NULL || row->n_frames == 0) {
        site_name(row, site, sizeof(site));
        labels[n++] = site;
    } else {
        int depth = row->n_frames < MT_FLAME_DEPTH_MAX ? row->n_frames : MT_FLAME_DEPTH_MAX;
        for (int k = 0; k < depth; k++) {
            mt_sym_frame_t fr;
            int rc = mt__cs_frame_label(s, pid, &row->frames[depth - 1 - k], &fr);
            if (rc != 0)
                return rc;
            labels[n++] = fr.label;
        }
    }
    return mt__flame_add(f, labels, n, row->bytes);
}
