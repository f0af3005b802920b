/* Call-site views (callsite.h): ranking, labelling, JSON, text and flame-graph input. */
#include "analysis/callsite.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int row_cmp(const void *a, const void *b)
{
    const mt_cs_row_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

void mt_cs_rows_sort(mt_cs_row_t *rows, size_t n)
{
    if (n > 1)
        qsort(rows, n, sizeof(*rows), row_cmp);
}

int mt_cs_frame_label(mt_sym_t *s, uint32_t pid, const mt_cs_frame_t *f, mt_sym_frame_t *out)
{
    if (f->py_func != NULL)
        return mt_sym_python(s, f->py_func, f->py_file, f->py_line, out);
    return mt_sym_resolve(s, pid, f->ip, out);
}

static void site_name(const mt_cs_row_t *row, char *buf, size_t len)
{
    if (row->stack == 0)
        snprintf(buf, len, "no stack recorded");
    else
        snprintf(buf, len, "unknown stack %" PRIu32, row->stack);
}

/* ---- JSON ---- */

static json_t *frame_json(const mt_sym_frame_t *fr, bool python)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    int bad = json_object_set_new(o, "label", json_string(fr->label));
    bad |= json_object_set_new(o, "function", fr->func ? json_string(fr->func) : json_null());
    bad |= json_object_set_new(o, "file", fr->file ? json_string(fr->file) : json_null());
    bad |= json_object_set_new(o, "line", json_integer(fr->line));
    bad |= json_object_set_new(o, "module", fr->module ? json_string(fr->module) : json_null());
    bad |= json_object_set_new(o, "python", json_boolean(python));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *row_json(mt_sym_t *s, uint32_t pid, const mt_cs_row_t *row, bool growth)
{
    json_t *o = json_object(), *frames = json_array();
    char site[64];
    const char *site_label = NULL;
    int bad = o == NULL || frames == NULL;
    for (int i = 0; !bad && row->frames != NULL && i < row->n_frames; i++) {
        mt_sym_frame_t fr;
        mt_cs_frame_label(s, pid, &row->frames[i], &fr);
        if (i == 0)
            site_label = fr.label;
        bad |= json_array_append_new(frames, frame_json(&fr, row->frames[i].py_func != NULL));
    }
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
        bad |= json_object_set_new(o, "site", json_string(site_label));
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
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *mt_cs_rows_json(mt_sym_t *s, uint32_t pid, const mt_cs_row_t *rows, size_t n, size_t top,
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

/* ---- text ---- */

static void put_label(FILE *out, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
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

int mt_cs_rows_text(FILE *out, mt_sym_t *s, uint32_t pid, const mt_cs_row_t *rows, size_t n,
                    size_t top, int depth, bool growth)
{
    if (n == 0)
        fprintf(out, "    (none)\n");
    for (size_t i = 0; i < n && i < top; i++) {
        const mt_cs_row_t *r = &rows[i];
        char hb[32], site[64];
        if (growth) {
            double a = r->slope < 0 ? -r->slope : r->slope;
            human((uint64_t)a, hb, sizeof(hb));
            fprintf(out, "  %s%10s/iter  r2 %.2f%s  ", r->slope < 0 ? "-" : "+", hb, r->r2,
                    r->detected ? "  GROWING" : "");
        } else {
            human(r->bytes, hb, sizeof(hb));
            fprintf(out, "  %10s  %6" PRIu64 " blocks  ", hb, r->blocks);
        }
        if (r->frames == NULL || r->n_frames == 0) {
            site_name(r, site, sizeof(site));
            fprintf(out, "%s\n", site);
            continue;
        }
        for (int k = 0; k < r->n_frames && k <= depth; k++) {
            mt_sym_frame_t fr;
            mt_cs_frame_label(s, pid, &r->frames[k], &fr);
            if (k > 0)
                fprintf(out, "      <- ");
            put_label(out, fr.label);
            fputc('\n', out);
        }
        if (r->n_frames > depth + 1 || r->truncated)
            fprintf(out, "      <- ...\n");
    }
    return ferror(out) ? MT_EIO : 0;
}

/* ---- flame graph ---- */

int mt_cs_flame_add(mt_flame_t *f, mt_sym_t *s, uint32_t pid, const mt_cs_row_t *row)
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
            mt_cs_frame_label(s, pid, &row->frames[depth - 1 - k], &fr);
            labels[n++] = fr.label;
        }
    }
    return mt_flame_add(f, labels, n, row->bytes);
}

/* ---- module lines ---- */

static int hex_u64(const json_t *v, uint64_t *out)
{
    const char *s = json_string_value(v);
    if (s == NULL || strncmp(s, "0x", 2) != 0 || s[2] == '\0' || strlen(s) > 18)
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s + 2, &end, 16);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = x;
    return 0;
}

int mt_cs_module_line(mt_sym_t *s, const json_t *line, char *err, size_t errlen)
{
    json_t *pid = json_object_get(line, "pid"), *path = json_object_get(line, "path");
    json_t *size = json_object_get(line, "size"), *bid = json_object_get(line, "build_id");
    uint64_t base;
    const char *what = NULL;
    if (!json_is_integer(pid) || json_integer_value(pid) < 0 ||
        json_integer_value(pid) > UINT32_MAX)
        what = "pid";
    else if (!json_is_string(path) || json_string_length(path) == 0)
        what = "path";
    else if (hex_u64(json_object_get(line, "base"), &base) != 0)
        what = "base";
    else if (!json_is_integer(size) || json_integer_value(size) <= 0)
        what = "size";
    else if (bid != NULL && !json_is_null(bid) && !json_is_string(bid))
        what = "build_id";
    if (what == NULL) {
        int rc =
            mt_sym_add_module(s, (uint32_t)json_integer_value(pid), json_string_value(path), base,
                              (uint64_t)json_integer_value(size), json_string_value(bid));
        if (rc == MT_EINVAL)
            what = "base, size or build_id";
        else if (rc != 0) {
            snprintf(err, errlen, "module line: %s",
                     rc == MT_EOVERFLOW ? "too many modules" : "out of memory");
            return rc;
        }
    }
    if (what != NULL) {
        snprintf(err, errlen, "module line: missing or invalid \"%s\"", what);
        return MT_EPROTO;
    }
    return 0;
}
