/* A snapshot's live bytes at the peak grouped by the user's frame of their stacks
 * (torch_snapshot.h, "call sites grouped"): PyTorch's stacks start with its unwinder, its
 * allocator and ATen, so the stacks' innermost frames all read the same; the rules of
 * analysis/frames.h find the frame the user wrote. */
#include <stdlib.h>
#include <string.h>

#include "analysis/flame.h"
#include "analysis/frames.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "util/text.h"

static bool is_py(const char *file)
{
    size_t n = file != NULL ? strlen(file) : 0;
    return n > 3 && strcmp(file + n - 3, ".py") == 0;
}

size_t mt__ts_stack_frames(const mt_ts_t *ts, uint32_t stack, mt_fr_frame_t *out, size_t cap)
{
    if (stack == 0 || stack >= ts->nstacks)
        return 0;
    const mt_ts_stack_t *s = &ts->stacks[stack];
    size_t n = s->n < cap ? s->n : cap;
    for (size_t i = 0; i < n; i++) {
        const mt_ts_frame_t *f = &ts->frames[s->first + i];
        out[i] = (mt_fr_frame_t){
            .func = f->name, .file = f->filename, .line = f->line, .python = is_py(f->filename)};
    }
    return n;
}

const char *mt__ts_stack_key(const mt_ts_t *ts, uint32_t stack, const mt_fr_rules_t *r, int by,
                             mt_fr_frame_t *fr, size_t cap, int *frame, char *buf, size_t len)
{
    size_t n = mt__ts_stack_frames(ts, stack, fr, cap);
    *frame = mt__fr_pick(r, fr, n);
    if (by == MT_FR_BY_TAG) {
        snprintf(buf, len, "other");
        for (size_t i = 0; i < n; i++)
            if (fr[i].file != NULL && strcmp(fr[i].file, "memtrace") == 0 &&
                strncmp(fr[i].func, "tag ", 4) == 0) {
                snprintf(buf, len, "%s", fr[i].func + 4);
                break;
            }
        return buf;
    }
    if (n == 0) {
        snprintf(buf, len,
                 stack != 0 && stack == ts->before_stack ? MT_TS_BEFORE_NO_STACK : MT_FR_NO_STACK);
        return buf;
    }
    size_t at = 0;
    if (mt__ts_free_stack(ts, stack) && len > sizeof MT_TS_FREED_AT) {
        memcpy(buf, MT_TS_FREED_AT, sizeof MT_TS_FREED_AT - 1);
        at = sizeof MT_TS_FREED_AT - 1;
    }
    mt__fr_stack_key(r, fr, n, by, buf + at, len - at);
    return buf;
}

static int by_key(const void *a, const void *b)
{
    const mt_ts_group_t *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c != 0)
        return c;
    return x->bytes != y->bytes ? (x->bytes < y->bytes ? 1 : -1)
                                : (x->stack > y->stack) - (x->stack < y->stack);
}

static int by_bytes(const void *a, const void *b)
{
    const mt_ts_group_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->key, y->key);
}

void mt__ts_groups_free(mt_ts_group_t **g, size_t n)
{
    if (*g == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free((*g)[i].key);
    free(*g);
    *g = NULL;
}

int mt__ts_groups_at_peak(const mt_ts_t *ts, unsigned device, const mt_fr_rules_t *r, int by,
                          mt_ts_group_t **out, size_t *nout, uint64_t *peak)
{
    *out = NULL;
    *nout = 0;
    size_t cap = ts->nstacks ? ts->nstacks : 1, ns = 0, maxf = 1;
    for (size_t i = 0; i < ts->nstacks; i++)
        maxf = ts->stacks[i].n > maxf ? ts->stacks[i].n : maxf;
    mt_ts_site_t *sites = calloc(cap, sizeof *sites);
    mt_ts_group_t *g = calloc(cap, sizeof *g);
    mt_fr_frame_t *fr = calloc(maxf, sizeof *fr);
    char *buf = malloc(4096);
    int rc = sites && g && fr && buf ? 0 : MT_ENOMEM;
    if (rc == 0)
        rc = mt__ts_sites_at_peak(ts, device, sites, cap, &ns, peak);
    for (size_t i = 0; rc == 0 && i < ns; i++) {
        int frame;
        g[i] = (mt_ts_group_t){
            .stack = sites[i].stack, .bytes = sites[i].bytes, .count = sites[i].count, .stacks = 1};
        g[i].key = strdup(mt__ts_stack_key(ts, sites[i].stack, r, by, fr, maxf, &frame, buf, 4096));
        g[i].frame = frame;
        if (g[i].key == NULL)
            rc = MT_ENOMEM;
    }
    size_t k = 0;
    if (rc == 0 && ns > 0) {
        /* Equal keys side by side, the one with the most bytes first: it stays, the rest
         * add to it. */
        qsort(g, ns, sizeof *g, by_key);
        for (size_t i = 0; i < ns; i++) {
            if (k > 0 && strcmp(g[k - 1].key, g[i].key) == 0) {
                g[k - 1].bytes += g[i].bytes;
                g[k - 1].count += g[i].count;
                g[k - 1].stacks++;
                free(g[i].key);
            } else {
                g[k++] = g[i];
            }
        }
        qsort(g, k, sizeof *g, by_bytes);
    }
    free(sites);
    free(fr);
    free(buf);
    if (rc != 0) {
        mt__ts_groups_free(&g, ns);
        return rc;
    }
    *out = g;
    *nout = k;
    return 0;
}

json_t *mt__ts_stack_view(const mt_ts_t *ts, uint32_t stack, const mt_fr_rules_t *r)
{
    size_t n = stack != 0 && stack < ts->nstacks ? ts->stacks[stack].n : 0;
    mt_fr_frame_t *fr = calloc(n ? n : 1, sizeof *fr);
    json_t *frames = json_array(), *v = NULL;
    char buf[512], site[1024], u8[1024], u8f[1024]; /* (as mt__text_utf8 may write them) */
    if (fr == NULL || frames == NULL)
        goto fail_alloc;
    int user; /* the site as every view names it, and fr filled */
    mt__ts_stack_key(ts, stack, r, MT_FR_BY_SITE, fr, n, &user, buf, sizeof buf);
    mt__text_utf8(buf, site, sizeof site);
    for (size_t k = user >= 0 ? (size_t)user : n; k < n; k++) {
        if ((int)k != user && mt__fr_match(r, &fr[k]) != NULL)
            continue;
        mt__text_utf8(mt__fr_site(&fr[k], buf, sizeof buf), u8, sizeof u8);
        mt__text_utf8(fr[k].file ? fr[k].file : "", u8f, sizeof u8f);
        if (json_array_append_new(frames, json_pack("{s:s,s:s,s:b}", "label", u8, "file", u8f,
                                                    "user", (int)k == user)) != 0)
            goto fail_alloc;
    }
    v = json_pack("{s:s,s:O,s:I}", "site", site, "frames", frames, "hidden",
                  (json_int_t)(n - json_array_size(frames)));
fail_alloc:
    json_decref(frames);
    free(fr);
    return v;
}

int mt__ts_name_rows(const mt_ts_t *ts, json_t *rows)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        uint32_t id = (uint32_t)json_integer_value(json_object_get(row, "stack"));
        json_t *v = mt__ts_stack_view(ts, id, NULL);
        json_t *frames = json_object_get(v, "frames");
        if (v == NULL || json_object_update(row, v) != 0 ||
            json_object_set_new(row, "user_frame", json_integer(0)) != 0 ||
            json_object_set_new(row, "unknown", json_boolean(json_array_size(frames) == 0)) != 0)
            rc = MT_ENOMEM;
        json_decref(v);
    }
    return rc;
}

int mt__ts_flame_add(mt_flame_t *f, const mt_ts_t *ts, uint32_t stack, uint64_t bytes)
{
    json_t *v = mt__ts_stack_view(ts, stack, NULL);
    json_t *frames = json_object_get(v, "frames");
    size_t n = json_array_size(frames);
    if (n > MT_FLAME_DEPTH_MAX)
        n = MT_FLAME_DEPTH_MAX; /* the outermost are cut: the user's frame is the leaf */
    const char **labels = malloc((n ? n : 1) * sizeof *labels);
    int rc = v != NULL && labels != NULL ? 0 : MT_ENOMEM;
    for (size_t k = 0; rc == 0 && k < n; k++) /* root first: the kept frames reversed */
        labels[k] = json_string_value(json_object_get(json_array_get(frames, n - 1 - k), "label"));
    if (rc == 0) /* the leaf is the user's frame, as the site names it (a free's: so said) */
        labels[n ? n - 1 : n++] = json_string_value(json_object_get(v, "site"));
    if (rc == 0)
        rc = mt__flame_add(f, labels, (int)n, bytes);
    free(labels);
    json_decref(v);
    return rc;
}
