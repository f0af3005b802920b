/* Temporary allocations in the model (model.h, "temporary allocations"): blocks the program
 * frees soon after allocating them, counted per stack and per tag when the free is seen, so
 * the report and the daemon read the same figures.
 *
 * Lifetimes go into a log-bucket histogram per row rather than a list: its size is bounded
 * by the window (224 buckets for the default 1 ms), rows of one site add up bucket by bucket
 * (a median of medians would not), and the median read from it is within 1/32 of the exact
 * one (exact below 32 µs). */
#include "analysis/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

#define EXACT ((uint64_t)1 << MT_MODEL_TEMP_EXACT_BITS) /* buckets below the log scale */

/* Histogram memory of a class is bounded (a forged stream may bring 2^18 stacks): past this,
 * rows still count and add bytes, without lifetimes. */
#define HIST_BYTES_MAX (UINT64_C(16) << 20)

/* One row's figures. Invariant: count = sum of hist + unbinned (hist NULL: all unbinned). */
typedef struct tfig_s {
    uint64_t count;
    uint64_t bytes;    /* saturated */
    uint64_t *hist;    /* nb counts, or NULL */
    uint64_t unbinned; /* counted without a histogram (the bound above) */
} tfig_t;

/* Invariants: st[i] is the row of the stack index i (model_stacks.c), i < nst <= cap;
 * nb = mt__model_temp_bucket(window) + 1; sum over tags of tag[t].count = sum over stacks of
 * st[i].count + unstacked. */
typedef struct mt__mtemp_s {
    size_t nb;
    tfig_t tag[MT_TAG_MAX];
    tfig_t *st;
    size_t nst, cap;
    uint64_t unstacked; /* temporaries of blocks counted in no stack (MT__SIDX_NONE) */
    size_t nhist;       /* histograms allocated; nhist * nb * 8 <= HIST_BYTES_MAX */
} mt__mtemp_t;

size_t mt__model_temp_bucket(uint64_t us)
{
    if (us < EXACT)
        return (size_t)us;
    int e = 63 - __builtin_clzll(us); /* >= MT_MODEL_TEMP_EXACT_BITS */
    int sh = e - MT_MODEL_TEMP_EXACT_BITS;
    return (size_t)(EXACT + (uint64_t)sh * EXACT + ((us >> sh) & (EXACT - 1)));
}

uint64_t mt__model_temp_bucket_low(size_t b)
{
    if (b < EXACT)
        return b;
    uint64_t sh = (b - EXACT) / EXACT, sub = (b - EXACT) % EXACT;
    return (EXACT + sub) << sh;
}

size_t mt__model_temp_buckets(const mt_model_t *m)
{
    uint64_t w = m->cfg.temporary_window_us;
    return w ? mt__model_temp_bucket(w) + 1 : 0;
}

uint64_t mt__model_temp_median_us(const uint64_t *hist, size_t nb)
{
    uint64_t n = 0;
    for (size_t b = 0; b < nb; b++)
        n = mt_model_sat_add(n, hist[b]);
    if (n == 0)
        return 0;
    uint64_t rank = n / 2 + n % 2, seen = 0;
    for (size_t b = 0; b < nb; b++) {
        seen = mt_model_sat_add(seen, hist[b]);
        if (seen >= rank)
            return mt__model_temp_bucket_low(b);
    }
    return mt__model_temp_bucket_low(nb - 1);
}

/* Gives f its histogram unless past the bound. 0 or MT_ENOMEM. */
static int ensure_hist(mt__mtemp_t *t, tfig_t *f)
{
    if (f->hist != NULL || (t->nhist + 1) * t->nb * sizeof *f->hist > HIST_BYTES_MAX)
        return 0;
    if ((f->hist = calloc(t->nb, sizeof *f->hist)) == NULL)
        return MT_ENOMEM;
    t->nhist++;
    return 0;
}

/* Adds one lifetime (without it past the bound). */
static void fig_add(tfig_t *f, uint64_t bytes, size_t bucket)
{
    f->count++;
    f->bytes = mt_model_sat_add(f->bytes, bytes);
    if (f->hist != NULL)
        f->hist[bucket]++;
    else
        f->unbinned++;
}

static mt__mtemp_t *temp_get(mt__mclass_t *c)
{
    if (c->tmp == NULL && (c->tmp = calloc(1, sizeof *c->tmp)) != NULL)
        c->tmp->nb = mt__model_temp_bucket(c->tmp_window_us) + 1;
    return c->tmp;
}

int mt__model_temp_free(mt__mclass_t *c, const mt__mblock_t *b, uint64_t t_free)
{
    /* Without both clocks the lifetime is unknown: never temporary. */
    if (c->tmp_window_us == 0 || b->t_alloc == 0 || t_free < b->t_alloc)
        return 0;
    uint64_t us = (t_free - b->t_alloc) / 1000u;
    if (us > c->tmp_window_us)
        return 0;
    mt__mtemp_t *t = temp_get(c);
    if (t == NULL)
        return MT_ENOMEM;
    size_t bk = mt__model_temp_bucket(us);
    /* Every row's memory first, so a failure adds to neither view (they must agree). */
    tfig_t *ft = &t->tag[b->tag], *fs = NULL;
    if (ensure_hist(t, ft) != 0)
        return MT_ENOMEM;
    if (b->sidx != MT__SIDX_NONE) {
        if (b->sidx >= t->cap) {
            size_t cap = t->cap ? t->cap : 4;
            while (cap <= b->sidx)
                cap *= 2;
            tfig_t *st = realloc(t->st, cap * sizeof *st);
            if (st == NULL)
                return MT_ENOMEM;
            memset(st + t->cap, 0, (cap - t->cap) * sizeof *st);
            t->st = st;
            t->cap = cap;
        }
        fs = &t->st[b->sidx];
        if (ensure_hist(t, fs) != 0)
            return MT_ENOMEM;
        t->nst = b->sidx >= t->nst ? b->sidx + 1 : t->nst;
        fig_add(fs, b->size, bk);
    } else {
        t->unstacked++;
    }
    fig_add(ft, b->size, bk);
    return 0;
}

void mt__model_temp_free_all(mt__mclass_t *c)
{
    mt__mtemp_t *t = c->tmp;
    if (t == NULL)
        return;
    for (int k = 0; k < MT_TAG_MAX; k++)
        free(t->tag[k].hist);
    for (size_t i = 0; i < t->nst; i++)
        free(t->st[i].hist);
    free(t->st);
    free(t);
    c->tmp = NULL;
}

void mt__model_lifetimes_from(mt_model_t *m, uint64_t t_ns)
{
    for (size_t k = 0; k < sizeof m->cls / sizeof m->cls[0]; k++)
        m->cls[k].t_known = t_ns;
}

int mt__model_temporary(const mt_model_t *m, int cls, bool by_tag, mt_model_temp_t **out, size_t *n)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    const mt__mtemp_t *t = c->tmp;
    *out = NULL;
    *n = 0;
    size_t rows = t == NULL ? 0 : by_tag ? MT_TAG_MAX : t->nst;
    mt_model_temp_t *v = calloc(rows ? rows : 1, sizeof *v);
    if (v == NULL)
        return MT_ENOMEM;
    size_t w = 0;
    for (size_t i = 0; i < rows; i++) {
        const tfig_t *f = by_tag ? &t->tag[i] : &t->st[i];
        if (f->count == 0)
            continue;
        v[w++] = (mt_model_temp_t){
            .key = by_tag ? (uint32_t)i : mt__model_stack_id(m, (uint32_t)i),
            .count = f->count,
            .bytes = f->bytes,
            .hist = f->hist,
        };
    }
    *out = v;
    *n = w;
    return 0;
}

static int fig_check(const tfig_t *f, size_t nb, char *why, size_t whylen, const char *what,
                     size_t i)
{
    uint64_t sum = f->unbinned;
    for (size_t b = 0; f->hist != NULL && b < nb; b++)
        sum += f->hist[b];
    if (sum != f->count) {
        if (why)
            snprintf(why, whylen, "temporary %s %zu: count %llu, histogram %llu", what, i,
                     (unsigned long long)f->count, (unsigned long long)sum);
        return MT_EPROTO;
    }
    return 0;
}

int mt__model_temp_check(const mt__mclass_t *c, char *why, size_t whylen)
{
    const mt__mtemp_t *t = c->tmp;
    if (t == NULL)
        return 0;
    uint64_t by_tag = 0, by_stack = t->unstacked;
    size_t nhist = 0;
    for (size_t k = 0; k < MT_TAG_MAX; k++) {
        if (fig_check(&t->tag[k], t->nb, why, whylen, "tag", k) != 0)
            return MT_EPROTO;
        by_tag += t->tag[k].count;
        nhist += t->tag[k].hist != NULL;
    }
    for (size_t i = 0; i < t->nst; i++) {
        if (fig_check(&t->st[i], t->nb, why, whylen, "stack index", i) != 0)
            return MT_EPROTO;
        by_stack += t->st[i].count;
        nhist += t->st[i].hist != NULL;
    }
    if (t->nst > t->cap || by_tag != by_stack || nhist != t->nhist ||
        t->nhist * t->nb * sizeof(uint64_t) > HIST_BYTES_MAX ||
        t->nb != mt__model_temp_bucket(c->tmp_window_us) + 1) {
        if (why)
            snprintf(why, whylen, "temporary: %llu by tag, %llu by stack, %zu buckets",
                     (unsigned long long)by_tag, (unsigned long long)by_stack, t->nb);
        return MT_EPROTO;
    }
    return 0;
}
