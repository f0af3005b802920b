/* Temporary allocations in the report (report.h, "temporary allocations"): the model's rows
 * (model.h) named by site or tag, rows of one name added up (counts, bytes and histograms
 * bucket by bucket), the first top by count. */
#include <stdlib.h>
#include <string.h>

#include "analysis/callsite.h"
#include "analysis/report.h"

typedef struct group_s {
    char *key;
    uint64_t count, bytes;
    uint64_t *hist;
} group_t;

static int by_count(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->key, y->key);
}

static json_int_t ji(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v;
}

json_t *mt__report_temp_group(const mt_model_temp_t *rows, size_t n, size_t nb,
                              mt__report_temp_key_fn key_fn, void *ctx, unsigned top)
{
    group_t *g = calloc(n ? n : 1, sizeof *g);
    json_t *out = NULL, *index = json_object();
    char key[2048];
    size_t k = 0;
    if (g == NULL || index == NULL)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if (key_fn(ctx, &rows[i], key, sizeof key) != 0)
            goto out;
        json_t *at = json_object_get(index, key);
        group_t *d;
        if (at != NULL) {
            d = &g[json_integer_value(at)];
        } else {
            d = &g[k];
            d->key = strdup(key);
            d->hist = calloc(nb ? nb : 1, sizeof *d->hist);
            if (d->key == NULL || d->hist == NULL ||
                json_object_set_new(index, key, json_integer((json_int_t)k)) != 0) {
                k++; /* freed below */
                goto out;
            }
            k++;
        }
        d->count = mt_model_sat_add(d->count, rows[i].count);
        d->bytes = mt_model_sat_add(d->bytes, rows[i].bytes);
        for (size_t b = 0; rows[i].hist != NULL && b < nb; b++)
            d->hist[b] = mt_model_sat_add(d->hist[b], rows[i].hist[b]);
    }
    qsort(g, k, sizeof *g, by_count);
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < k && i < top; i++) {
        json_t *o = json_pack("{s:s, s:I, s:I, s:I}", "site", g[i].key, "count", ji(g[i].count),
                              "bytes", ji(g[i].bytes), "median_lifetime_us",
                              ji(mt__model_temp_median_us(g[i].hist, nb)));
        if (o == NULL || json_array_append_new(a, o) != 0) {
            json_decref(a);
            a = NULL;
        }
    }
    out = a;
out:
    for (size_t i = 0; g != NULL && i < k; i++) {
        free(g[i].key);
        free(g[i].hist);
    }
    free(g);
    json_decref(index);
    return out;
}

/* ---- a log's rows: by stack, named as the call sites are ---- */

typedef struct site_ctx_s {
    const mt_model_t *m;
    mt_sym_t *s;
    uint32_t pid;
    const mt__report_cfg_t *cfg;
} site_ctx_t;

static int site_key(void *ctx, const mt_model_temp_t *row, char *key, size_t len)
{
    site_ctx_t *c = ctx;
    mt_cs_row_t r = {.stack = row->key, .bytes = row->bytes, .blocks = row->count};
    const mt_model_frame_t *fr;
    int nf;
    if (mt__model_stack_frames(c->m, r.stack, &fr, &nf, &r.truncated) == 0) {
        r.frames = (const mt_cs_frame_t *)fr;
        r.n_frames = nf;
    }
    json_t *a = mt__cs_rows_json(c->s, c->pid, &r, 1, 1, false);
    json_t *o = json_array_get(a, 0);
    int rc = o != NULL ? mt__report_name_row(o, c->cfg, key, len) : MT_ENOMEM;
    json_decref(a);
    return rc;
}

json_t *mt__report_temporary_json(const mt_model_t *m, mt_sym_t *s, uint32_t pid,
                                  const mt__report_cfg_t *cfg, bool by_tag,
                                  mt__report_temp_key_fn tag_key, void *tag_ctx)
{
    mt_model_temp_t *rows = NULL;
    size_t n = 0;
    if (mt__model_temporary(m, MT_MODEL_DEVICE, by_tag, &rows, &n) != 0)
        return NULL;
    site_ctx_t sc = {m, s, pid, cfg};
    if (!by_tag && mt__cs_sym_sync(s, pid, m) != 0) {
        free(rows);
        return NULL;
    }
    json_t *a =
        mt__report_temp_group(rows, n, mt__model_temp_buckets(m), by_tag ? tag_key : site_key,
                              by_tag ? tag_ctx : &sc, cfg->top);
    free(rows);
    return a;
}
