/* A snapshot's live bytes over time by site (torch_snapshot_timeline.h). Two passes over
 * the records: the first finds each site's peak, which chooses the top sites; the second
 * fills the buckets. Memory is one entry per stack, per live block and per bucket. */
#include <stdlib.h>
#include <string.h>

#include "analysis/frames.h"
#include "analysis/torch_snapshot_timeline.h"
#include "memtrace/alloc.h"
#include "util/addrmap.h"
#include "util/grow.h"

/* ---- live blocks: address -> (group, bytes), dense, indexed through util/addrmap ---- */

typedef struct live_ent_s {
    uint64_t addr; /* != 0 (an allocation at address 0 is not tracked) */
    uint64_t size; /* bytes */
    uint32_t group;
} live_ent_t;

/* Invariants: v[0..n) are the live blocks, distinct addresses; at maps each one's addr to
 * its index (at.n = n); n <= cap. */
typedef struct live_s {
    live_ent_t *v;
    size_t n, cap;
    mt__amap_t at; /* addr -> index in v */
} live_t;

static void live_free(live_t *l)
{
    free(l->v);
    mt__amap_fini(&l->at);
    *l = (live_t){0};
}

static int live_init(live_t *l, size_t cap)
{
    *l = (live_t){0};
    l->v = mt__grow(NULL, &l->cap, cap, sizeof *l->v, cap);
    return l->v != NULL ? 0 : MT_ENOMEM;
}

/* Sets a's entry (an alloc at a live address replaces what was there). */
static int live_put(live_t *l, uint64_t a, uint32_t g, uint64_t sz)
{
    uint64_t i;
    if (mt__amap_get(&l->at, a, &i) == 0) {
        l->v[i] = (live_ent_t){a, sz, g};
        return 0;
    }
    live_ent_t *v = mt__grow(l->v, &l->cap, l->n + 1, sizeof *v, 1024);
    if (v == NULL)
        return MT_ENOMEM;
    l->v = v;
    int rc = mt__amap_put(&l->at, a, l->n);
    if (rc == 0)
        l->v[l->n++] = (live_ent_t){a, sz, g};
    return rc;
}

/* Removes a's entry into *g, *sz; false when a is not live. The last entry moves into its
 * place. */
static bool live_take(live_t *l, uint64_t a, uint32_t *g, uint64_t *sz)
{
    uint64_t i;
    if (mt__amap_get(&l->at, a, &i) != 0)
        return false;
    *g = l->v[i].group;
    *sz = l->v[i].size;
    mt__amap_del(&l->at, a);
    if (i + 1 < l->n) {
        l->v[i] = l->v[l->n - 1];
        mt__amap_put(&l->at, l->v[i].addr, i); /* replaces: no allocation */
    }
    l->n--;
    return true;
}

/* ---- the two passes ---- */

typedef struct pass_s {
    const mt_ts_timeline_t *tl;
    const uint32_t *group_of; /* nstacks */
    const uint32_t *slot_of;  /* group -> the column it adds to */
    size_t ncols;
    live_t live;
    uint64_t *cur;  /* ncols: live bytes now */
    uint64_t *peak; /* ncols (first pass) */
    uint32_t *best; /* ncols: the stack with most bytes at the column's peak (first pass) */
    uint64_t total; /* sum of cur */
    size_t index;   /* records seen */
    int64_t t0, t1; /* first and last time_ns > 0 */
    /* second pass */
    mt_ts_timeline_t *out;
    size_t bucket; /* the bucket being filled, or SIZE_MAX before the first record */
    uint64_t bmax; /* its largest total so far */
} pass_t;

static void bucket_copy(pass_t *p, size_t b)
{
    memcpy(&p->out->bytes[b * p->ncols], p->cur, p->ncols * sizeof *p->cur);
}

static size_t bucket_of(const pass_t *p, const mt_event_rec_t *ev)
{
    const mt_ts_timeline_t *tl = p->out;
    if (!tl->by_time)
        return p->index * tl->nbuckets / (size_t)p->t1; /* t1: the records' count */
    if (ev->time_ns == 0 || p->t1 <= p->t0)
        return p->bucket == SIZE_MAX ? 0 : p->bucket;
    double f = (double)((int64_t)ev->time_ns - p->t0) / (double)(p->t1 - p->t0);
    size_t b = f <= 0 ? 0 : (size_t)(f * (double)tl->nbuckets);
    return b >= tl->nbuckets ? tl->nbuckets - 1 : b;
}

static int pass_rec(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    (void)flags;
    pass_t *p = ctx;
    bool second = p->out != NULL;
    if (second) {
        size_t b = bucket_of(p, ev);
        if (p->bucket == SIZE_MAX || b > p->bucket) {
            /* Buckets without a record hold the state they start with. */
            for (size_t k = p->bucket == SIZE_MAX ? 0 : p->bucket + 1; k <= b; k++)
                bucket_copy(p, k);
            p->bucket = b;
            p->bmax = p->total;
        }
    } else if (ev->time_ns > 0) {
        p->t0 = p->t0 == 0 || (int64_t)ev->time_ns < p->t0 ? (int64_t)ev->time_ns : p->t0;
        p->t1 = (int64_t)ev->time_ns > p->t1 ? (int64_t)ev->time_ns : p->t1;
    }
    p->index++;
    if (ev->pool == MT_POOL_HOST || ev->addr == 0)
        return 0;
    uint32_t g;
    uint64_t sz;
    if (ev->kind == MT_EV_ALLOC) {
        uint32_t st = stack < p->tl->nstacks ? stack : 0;
        if (live_take(&p->live, ev->addr, &g, &sz)) { /* an alloc where one is live: replaced */
            p->cur[p->slot_of[g]] -= sz;
            p->total -= sz;
        }
        g = p->group_of[st];
        uint32_t c = p->slot_of[g];
        if (live_put(&p->live, ev->addr, g, ev->size) != 0)
            return MT_ENOMEM;
        p->cur[c] += ev->size;
        p->total += ev->size;
        if (!second && p->cur[c] > p->peak[c]) {
            p->peak[c] = p->cur[c];
            p->best[c] = st;
        }
    } else if ((ev->kind == MT_EV_FREE_REQUESTED || ev->kind == MT_EV_FREE_COMPLETED) &&
               live_take(&p->live, ev->addr, &g, &sz)) {
        p->cur[p->slot_of[g]] -= sz;
        p->total -= sz;
    }
    if (second && p->total >= p->bmax) {
        p->bmax = p->total;
        bucket_copy(p, p->bucket);
    }
    return 0;
}

/* ---- site keys ---- */

typedef struct keyed_s {
    char *key;
    uint32_t stack;
} keyed_t;

static int by_key(const void *a, const void *b)
{
    const keyed_t *x = a, *y = b;
    return strcmp(x->key, y->key);
}

/* group_of[stack] for every stack, groups numbered by key; *names[g] the key (owned). */
static int group_stacks(const mt_ts_t *ts, const mt_fr_rules_t *r, uint32_t *group_of,
                        char ***names, size_t *ngroups)
{
    size_t ns = ts->nstacks ? ts->nstacks : 1, maxf = 1;
    for (size_t i = 0; i < ts->nstacks; i++)
        maxf = ts->stacks[i].n > maxf ? ts->stacks[i].n : maxf;
    keyed_t *k = calloc(ns, sizeof *k);
    mt_fr_frame_t *fr = calloc(maxf, sizeof *fr);
    char **nm = calloc(ns, sizeof *nm);
    char buf[512];
    int rc = k && fr && nm ? 0 : MT_ENOMEM;
    for (size_t i = 0; rc == 0 && i < ns; i++) {
        int frame;
        k[i].stack = (uint32_t)i;
        k[i].key = strdup(
            mt__ts_stack_key(ts, (uint32_t)i, r, MT_FR_BY_SITE, fr, maxf, &frame, buf, sizeof buf));
        rc = k[i].key ? 0 : MT_ENOMEM;
    }
    size_t g = 0;
    if (rc == 0) {
        qsort(k, ns, sizeof *k, by_key);
        for (size_t i = 0; i < ns; i++) {
            if (g > 0 && strcmp(nm[g - 1], k[i].key) == 0) {
                free(k[i].key);
            } else {
                nm[g++] = k[i].key;
            }
            k[i].key = NULL;
            group_of[k[i].stack] = (uint32_t)(g - 1);
        }
    }
    for (size_t i = 0; k && i < ns; i++)
        free(k[i].key);
    free(k);
    free(fr);
    if (rc != 0) {
        for (size_t i = 0; nm && i < g; i++)
            free(nm[i]);
        free(nm);
        return rc;
    }
    *names = nm;
    *ngroups = g;
    return 0;
}

typedef struct rank_s {
    uint64_t peak;
    uint32_t group;
} rank_t;

static int by_peak(const void *a, const void *b)
{
    const rank_t *x = a, *y = b;
    if (x->peak != y->peak)
        return x->peak < y->peak ? 1 : -1;
    return (x->group > y->group) - (x->group < y->group);
}

void mt__ts_timeline_destroy(mt_ts_timeline_t **pp)
{
    if (!pp || !*pp)
        return;
    mt_ts_timeline_t *tl = *pp;
    for (size_t i = 0; tl->names && i < tl->nsites; i++)
        free(tl->names[i]);
    free(tl->names);
    free(tl->stack);
    free(tl->peak);
    free(tl->site_of);
    free(tl->t);
    free(tl->bytes);
    free(tl);
    *pp = NULL;
}

int mt__ts_timeline_create(mt_ts_timeline_t **out, const mt_ts_t *ts, const mt_fr_rules_t *r,
                           size_t top, size_t nbuckets)
{
    *out = NULL;
    if (top == 0 || nbuckets == 0)
        return MT_EINVAL;
    size_t ns = ts->nstacks ? ts->nstacks : 1, ngroups = 0;
    char **gname = NULL;
    mt_ts_timeline_t *tl = calloc(1, sizeof *tl);
    uint32_t *group_of = calloc(ns, sizeof *group_of);
    pass_t p = {.tl = tl, .group_of = group_of, .bucket = SIZE_MAX};
    uint32_t *ident = NULL;
    rank_t *rank = NULL;
    int rc = tl && group_of ? 0 : MT_ENOMEM;
    if (rc == 0)
        rc = group_stacks(ts, r, group_of, &gname, &ngroups);
    if (rc == 0) {
        tl->nstacks = ns;
        /* First pass: one column per group. */
        ident = malloc(ngroups * sizeof *ident);
        p.cur = calloc(ngroups, sizeof *p.cur);
        p.peak = calloc(ngroups, sizeof *p.peak);
        p.best = calloc(ngroups, sizeof *p.best);
        rc = ident && p.cur && p.peak && p.best ? live_init(&p.live, 1024) : MT_ENOMEM;
    }
    if (rc == 0) {
        for (size_t g = 0; g < ngroups; g++)
            ident[g] = (uint32_t)g;
        p.slot_of = ident;
        p.ncols = ngroups;
        rc = mt__ts_records(ts, pass_rec, &p);
    }
    if (rc == 0) {
        rank = malloc(ngroups * sizeof *rank);
        rc = rank ? 0 : MT_ENOMEM;
    }
    size_t keep = 0;
    if (rc == 0) {
        for (size_t g = 0; g < ngroups; g++)
            rank[g] = (rank_t){.peak = p.peak[g], .group = (uint32_t)g};
        qsort(rank, ngroups, sizeof *rank, by_peak);
        for (keep = 0; keep < ngroups && keep < top && rank[keep].peak > 0; keep++)
            ;
        tl->other = keep < ngroups;
        tl->nsites = keep + tl->other;
        tl->names = calloc(tl->nsites ? tl->nsites : 1, sizeof *tl->names);
        tl->stack = calloc(tl->nsites ? tl->nsites : 1, sizeof *tl->stack);
        tl->peak = calloc(tl->nsites ? tl->nsites : 1, sizeof *tl->peak);
        tl->site_of = malloc(ns * sizeof *tl->site_of);
        rc = tl->names && tl->stack && tl->peak && tl->site_of ? 0 : MT_ENOMEM;
    }
    if (rc == 0) {
        /* ident becomes group -> site. */
        for (size_t g = 0; g < ngroups; g++)
            ident[g] = (uint32_t)keep;
        for (size_t i = 0; i < keep; i++) {
            uint32_t g = rank[i].group;
            ident[g] = (uint32_t)i;
            tl->names[i] = gname[g];
            gname[g] = NULL;
            tl->stack[i] = p.best[g];
            tl->peak[i] = rank[i].peak;
        }
        if (tl->other && (tl->names[keep] = strdup("other")) == NULL)
            rc = MT_ENOMEM;
        for (size_t s = 0; s < ns; s++)
            tl->site_of[s] = ident[group_of[s]];
    }
    if (rc == 0 && p.index > 0) {
        /* Second pass: one column per site. */
        tl->by_time = mt__ts_timed(ts) && p.t1 > p.t0; /* (untimed: times are the order) */
        size_t nrec = p.index;
        tl->nbuckets = tl->by_time ? nbuckets : (nrec < nbuckets ? nrec : nbuckets);
        tl->t = calloc(tl->nbuckets, sizeof *tl->t);
        tl->bytes = calloc(tl->nbuckets * (tl->nsites ? tl->nsites : 1), sizeof *tl->bytes);
        live_free(&p.live);
        rc = tl->t && tl->bytes ? live_init(&p.live, 1024) : MT_ENOMEM;
        if (rc == 0) {
            for (size_t b = 0; b < tl->nbuckets; b++)
                tl->t[b] = tl->by_time ? ((double)p.t0 + (double)(p.t1 - p.t0) * (double)b /
                                                             (double)tl->nbuckets) /
                                             1e9
                                       : (double)(b * nrec / tl->nbuckets);
            memset(p.cur, 0, ngroups * sizeof *p.cur);
            p.ncols = tl->nsites;
            p.total = 0;
            p.index = 0;
            if (!tl->by_time)
                p.t1 = (int64_t)nrec;
            p.out = tl;
            rc = mt__ts_records(ts, pass_rec, &p);
            /* The buckets after the last record hold the state at the end. */
            for (size_t k = p.bucket + 1; rc == 0 && k < tl->nbuckets; k++)
                bucket_copy(&p, k);
        }
    }
    for (size_t g = 0; gname && g < ngroups; g++)
        free(gname[g]);
    free(gname);
    free(group_of);
    free(ident);
    free(rank);
    free(p.cur);
    free(p.peak);
    free(p.best);
    live_free(&p.live);
    if (rc != 0) {
        mt__ts_timeline_destroy(&tl);
        return rc;
    }
    *out = tl;
    return 0;
}
