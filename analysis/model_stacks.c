/* Call stacks in the model: the producer's stack table and module map, each block's stack,
 * and per-stack figures (live now, live at the class's peak, growth across iterations).
 *
 * Stacks are kept in a dense array (index 0 is id 0, "no stack"), found by id through
 * util's address table (keyed by id + 1: its keys are never 0). The live bytes at the
 * class's peak are taken lazily: a class counts its new peaks (peak_ep); a stack about to
 * change stores its bytes as they were at the latest peak (snap, snap_ep) first, so a peak
 * costs O(1), not O(stacks). */
#include "analysis/model_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/addrmap.h"
#include "util/assert.h"

/* One stack's figures in one class. Invariants: bytes = sum of size over the class's FULL,
 * !pending, !uncertain blocks with this index, blocks = their count; unc likewise for
 * uncertain ones; snap_ep <= the class's peak_ep. */
typedef struct sfig_s {
    mt__u128 bytes, unc;
    uint64_t blocks, unc_blocks;
    uint64_t snap, snap_ep; /* bytes at the class's peak number snap_ep */
    uint64_t allocs, alloc_bytes;
    /* growth: samples at iterations 1.. (x = iteration index), sample 0 apart */
    double sy, sxy, syy, y0, y1, ylast;
    uint64_t dec, dec0; /* steps that went down (after the first; the first) */
} sfig_t;

typedef struct sdef_s {
    uint32_t id;
    uint32_t off; /* first frame in frames */
    uint16_t n;
    uint8_t truncated, defined;
} sdef_t;

/* Invariants: n <= cap; at holds n keys, defs[i].id + 1 -> i for every i < n (find());
 * defs[0].id = 0 once n > 0; nframes <= MT_MODEL_FRAMES_MAX; the frames of a defined
 * entry lie in [0, nframes); str_bytes <= MT_MODEL_PY_STR_MAX. */
struct mt__mstacks_s {
    mt__amap_t at; /* id + 1 -> index into defs */
    sdef_t *defs;
    sfig_t *fig[MT_MODEL_CLASSES];
    size_t n, cap;
    mt_model_frame_t *frames;
    size_t nframes, capframes;
    char **strs; /* interned Python names, open addressing */
    size_t scap, sn, str_bytes;
    mt_model_module_t *mods;
    size_t nmods, capmods;
    /* the ref waiting for its alloc */
    bool pending;
    uint64_t p_addr;
    uint8_t p_device, p_pool;
    uint32_t p_id;
    uint64_t nit; /* iteration samples taken */
    mt_model_stack_stats_t st;
};

static uint64_t sat(mt__u128 v)
{
    return mt__model_sat(v);
}

static mt__mstacks_t *stacks_get(mt_model_t *m)
{
    if (m->stacks)
        return m->stacks;
    m->stacks = calloc(1, sizeof(*m->stacks));
    for (int k = 0; k < MT_MODEL_CLASSES; k++) {
        m->cls[k].stk = m->stacks;
        m->cls[k].k = k;
    }
    return m->stacks;
}

static size_t find(const mt__mstacks_t *s, uint32_t id)
{
    uint64_t i;
    return mt__amap_get(&s->at, (uint64_t)id + 1, &i) == 0 ? (size_t)i : SIZE_MAX;
}

/* The index of id, added when new. SIZE_MAX without memory. */
static size_t intern_id(mt__mstacks_t *s, uint32_t id)
{
    size_t i = find(s, id);
    if (i != SIZE_MAX)
        return i;
    if (s->n == s->cap) {
        /* from 4: most processes of a job's thousands name a few stacks, or only id 0 */
        size_t cap = s->cap ? 2 * s->cap : 4;
        sdef_t *d = realloc(s->defs, cap * sizeof(*d));
        if (!d)
            return SIZE_MAX;
        s->defs = d;
        for (int k = 0; k < MT_MODEL_CLASSES; k++) {
            sfig_t *f = realloc(s->fig[k], cap * sizeof(*f));
            if (!f)
                return SIZE_MAX;
            s->fig[k] = f;
        }
        s->cap = cap;
    }
    i = s->n;
    if (mt__amap_put(&s->at, (uint64_t)id + 1, i) != 0)
        return SIZE_MAX;
    s->n++;
    s->defs[i] = (sdef_t){.id = id};
    for (int k = 0; k < MT_MODEL_CLASSES; k++)
        memset(&s->fig[k][i], 0, sizeof(sfig_t));
    return i;
}

static bool id_ok(uint32_t id)
{
    return id <= MT_STACK_ID_MAX || id == MT_STACK_ID_OVERFLOW;
}

/* ---- blocks ---- */

void mt__model_stack_account(mt__mclass_t *c, const mt__mblock_t *b, int sign)
{
    mt__mstacks_t *s = c->stk;
    if (b->pending || b->sidx == MT__SIDX_NONE || !s || b->sidx >= s->n)
        return;
    sfig_t *f = &s->fig[c->k][b->sidx];
    if (f->snap_ep != c->peak_ep) {
        f->snap = sat(f->bytes);
        f->snap_ep = c->peak_ep;
    }
    if (b->uncertain) {
        mt_assert(sign > 0 || (f->unc >= b->size && f->unc_blocks > 0));
        f->unc = sign > 0 ? f->unc + b->size : f->unc - b->size;
        f->unc_blocks = sign > 0 ? f->unc_blocks + 1 : f->unc_blocks - 1;
    } else {
        mt_assert(sign > 0 || (f->bytes >= b->size && f->blocks > 0));
        f->bytes = sign > 0 ? f->bytes + b->size : f->bytes - b->size;
        f->blocks = sign > 0 ? f->blocks + 1 : f->blocks - 1;
    }
}

int mt__model_stack_ref(mt_model_t *m, const mt_event_rec_t *ev)
{
    mt__mstacks_t *s = stacks_get(m);
    if (!s)
        return MT_ENOMEM;
    s->st.refs++;
    if (s->pending)
        s->st.orphan_refs++;
    s->pending = true;
    s->p_addr = ev->addr;
    s->p_device = ev->device;
    s->p_pool = ev->pool;
    s->p_id = ev->size > UINT32_MAX ? 0 : (uint32_t)ev->size;
    if (ev->size > UINT32_MAX || !id_ok(s->p_id)) {
        s->st.bad_ids++;
        s->p_id = 0;
    }
    return 0;
}

int mt__model_stack_before(mt_model_t *m, mt__mclass_t *c, const mt_event_rec_t *ev)
{
    mt__mstacks_t *s = m->stacks;
    c->next_sidx = MT__SIDX_NONE;
    uint32_t id = 0;
    if (s && s->pending) {
        bool match = ev->kind == MT_EV_ALLOC && ev->addr == s->p_addr &&
                     ev->device == s->p_device && ev->pool == s->p_pool;
        if (match) {
            id = s->p_id;
            s->st.matched++;
        } else {
            s->st.orphan_refs++;
        }
        s->pending = false;
    }
    if (ev->kind != MT_EV_ALLOC)
        return 0;
    if (!s && !(s = stacks_get(m)))
        return MT_ENOMEM;
    if (s->n == 0 && intern_id(s, 0) == SIZE_MAX)
        return MT_ENOMEM;
    int rc = 0;
    size_t i = intern_id(s, id);
    if (i == SIZE_MAX) {
        i = 0; /* no memory: counted as no stack */
        rc = MT_ENOMEM;
    }
    c->next_sidx = (uint32_t)i;
    sfig_t *f = &s->fig[c->k][i];
    f->allocs++;
    f->alloc_bytes = mt_model_sat_add(f->alloc_bytes, ev->size);
    return rc;
}

uint32_t mt__model_stack_id(const mt_model_t *m, uint32_t sidx)
{
    const mt__mstacks_t *s = m->stacks;
    return s && sidx < s->n ? s->defs[sidx].id : 0;
}

void mt__model_stacks_iteration(mt_model_t *m)
{
    mt__mstacks_t *s = m->stacks;
    if (!s)
        return;
    uint64_t it = s->nit++;
    for (size_t i = 0; i < s->n; i++) {
        sfig_t *f = &s->fig[MT_MODEL_DEVICE][i];
        double y = (double)sat(f->bytes + f->unc);
        if (it == 0) {
            f->y0 = y;
        } else {
            if (it == 1)
                f->y1 = y;
            f->sy += y;
            f->sxy += (double)it * y;
            f->syy += y * y;
            if (y < f->ylast) {
                if (it == 1)
                    f->dec0++;
                else
                    f->dec++;
            }
        }
        f->ylast = y;
    }
}

/* Stacks interned after some iterations had all-zero samples before: nothing to add. */
static mt_model_fit_t fit(const mt__mstacks_t *s, const sfig_t *f, const mt_model_growth_cfg_t *g)
{
    mt_model_fit_t r = {0};
    uint64_t n = s->nit;
    bool skip = n >= 5;
    uint64_t N = skip ? n - 1 : n;
    if (N < 2)
        return r;
    /* x over the samples fitted: 1..n-1 when skipping sample 0, else 0..n-1 */
    double sx = (double)(n - 1) * (double)n / 2.0;
    double sxx = (double)(n - 1) * (double)n * (double)(2 * n - 1) / 6.0;
    double sy = f->sy, sxy = f->sxy, syy = f->syy, dn = (double)N;
    if (!skip)
        sy += f->y0, syy += f->y0 * f->y0;
    double den = dn * sxx - sx * sx;
    if (den <= 0)
        return r;
    r.slope = (dn * sxy - sx * sy) / den;
    double sst = syy - sy * sy / dn;
    double cov = sxy - sx * sy / dn;
    double vx = sxx - sx * sx / dn;
    r.r2 = sst > 1e-9 && vx > 0 ? (cov * cov) / (vx * sst) : 0.0;
    if (r.r2 > 1.0)
        r.r2 = 1.0;
    r.rise = f->ylast - (skip ? f->y1 : f->y0);
    uint64_t dec = f->dec + (skip ? 0 : f->dec0);
    r.nondecr = 1.0 - (double)dec / (double)(N - 1);
    r.detected = N >= 3 && r.slope > 0 && r.r2 >= g->min_r2 &&
                 r.rise >= (double)g->min_growth_bytes && r.nondecr >= 0.75;
    return r;
}

int mt__model_stacks(const mt_model_t *m, int cls, const mt_model_growth_cfg_t *cfg,
                     mt_model_stack_t **out, size_t *n)
{
    static const mt_model_growth_cfg_t defaults = {.min_growth_bytes = 1u << 20, .min_r2 = 0.8};
    const mt__mstacks_t *s = m->stacks;
    int k = cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE;
    const mt__mclass_t *c = &m->cls[k];
    *out = NULL;
    *n = 0;
    if (!s || s->n == 0)
        return 0;
    mt_model_stack_t *v = calloc(s->n, sizeof(*v));
    if (!v)
        return MT_ENOMEM;
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++) {
        const sfig_t *f = &s->fig[k][i];
        if (f->allocs == 0 && f->blocks == 0 && f->unc_blocks == 0)
            continue;
        mt_model_stack_t *r = &v[w++];
        r->stack = s->defs[i].id;
        /* bounded as every figure is: never above the class's allocated (peak) total */
        uint64_t alloc = sat(c->asum);
        r->bytes = sat(f->bytes);
        r->peak_bytes = f->snap_ep == c->peak_ep ? f->snap : r->bytes;
        r->bytes = r->bytes < alloc ? r->bytes : alloc;
        r->peak_bytes = r->peak_bytes < c->peak_alloc ? r->peak_bytes : c->peak_alloc;
        r->blocks = f->blocks;
        r->uncertain_bytes = sat(f->unc);
        r->allocs = f->allocs;
        r->alloc_bytes = f->alloc_bytes;
        if (k == MT_MODEL_DEVICE)
            r->growth = fit(s, f, cfg ? cfg : &defaults);
    }
    /* id order */
    for (size_t i = 1; i < w; i++) {
        mt_model_stack_t t = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1].stack > t.stack; j--)
            v[j] = v[j - 1];
        v[j] = t;
    }
    *out = v;
    *n = w;
    return 0;
}

/* ---- the table ---- */

static const char *str_intern(mt__mstacks_t *s, const char *str)
{
    size_t len = strlen(str);
    if (2 * (s->sn + 1) > s->scap) {
        size_t cap = s->scap ? 2 * s->scap : 256;
        char **t = calloc(cap, sizeof(*t));
        if (!t)
            return NULL;
        for (size_t j = 0; j < s->scap; j++) {
            if (!s->strs[j])
                continue;
            size_t h = 5381;
            for (const char *p = s->strs[j]; *p; p++)
                h = h * 33 + (unsigned char)*p;
            size_t q = h & (cap - 1);
            while (t[q])
                q = (q + 1) & (cap - 1);
            t[q] = s->strs[j];
        }
        free(s->strs);
        s->strs = t;
        s->scap = cap;
    }
    size_t h = 5381;
    for (const char *p = str; *p; p++)
        h = h * 33 + (unsigned char)*p;
    size_t q = h & (s->scap - 1);
    for (; s->strs[q]; q = (q + 1) & (s->scap - 1))
        if (strcmp(s->strs[q], str) == 0)
            return s->strs[q];
    if (s->str_bytes + len + 1 > MT_MODEL_PY_STR_MAX)
        return "?";
    char *d = malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, str, len + 1);
    s->strs[q] = d;
    s->sn++;
    s->str_bytes += len + 1;
    return d;
}

int mt__model_stack_define(mt_model_t *m, uint32_t id, const mt_model_frame_t *frames, int n,
                           bool truncated)
{
    if (id == 0 || id > MT_STACK_ID_MAX || n < 0 || n > MT_STACK_DEPTH_MAX || (n > 0 && !frames))
        return MT_EINVAL;
    mt__mstacks_t *s = stacks_get(m);
    if (!s)
        return MT_ENOMEM;
    if (s->n == 0 && intern_id(s, 0) == SIZE_MAX)
        return MT_ENOMEM;
    size_t i = intern_id(s, id);
    if (i == SIZE_MAX)
        return MT_ENOMEM;
    sdef_t *d = &s->defs[i];
    if (d->defined && d->n == n) {
        bool same = d->truncated == truncated;
        for (int j = 0; j < n && same; j++) {
            const mt_model_frame_t *a = &s->frames[d->off + (uint32_t)j], *b = &frames[j];
            same = a->ip == b->ip && a->py_line == b->py_line && !a->py_func == !b->py_func &&
                   (!a->py_func ||
                    (strcmp(a->py_func, b->py_func) == 0 &&
                     strcmp(a->py_file ? a->py_file : "", b->py_file ? b->py_file : "") == 0));
        }
        if (same)
            return 0;
    }
    if (s->nframes + (size_t)n > MT_MODEL_FRAMES_MAX) {
        s->st.refused++;
        return MT_EOVERFLOW;
    }
    if (s->nframes + (size_t)n > s->capframes) {
        size_t cap = s->capframes ? 2 * s->capframes : 1024;
        while (cap < s->nframes + (size_t)n)
            cap *= 2;
        mt_model_frame_t *f = realloc(s->frames, cap * sizeof(*f));
        if (!f)
            return MT_ENOMEM;
        s->frames = f;
        s->capframes = cap;
    }
    /* An empty stack owns no frames: with none stored yet, frames is NULL, and even
     * NULL + 0 is undefined in C. */
    mt_model_frame_t *dst = n > 0 ? &s->frames[s->nframes] : NULL;
    for (int j = 0; j < n; j++) {
        dst[j] = frames[j];
        if (frames[j].py_func) {
            const char *fn = str_intern(s, frames[j].py_func);
            const char *fl = str_intern(s, frames[j].py_file ? frames[j].py_file : "?");
            if (!fn || !fl)
                return MT_ENOMEM;
            dst[j].ip = 0;
            dst[j].py_func = fn;
            dst[j].py_file = fl;
            dst[j].py_line = frames[j].py_line < 0 ? 0 : frames[j].py_line;
        } else {
            dst[j].py_file = NULL;
            dst[j].py_line = 0;
        }
    }
    if (!d->defined)
        s->st.defined++;
    d->off = (uint32_t)s->nframes;
    d->n = (uint16_t)n;
    d->truncated = truncated;
    d->defined = 1;
    s->nframes += (size_t)n;
    s->st.frames = s->nframes;
    return 0;
}

int mt__model_stack_frames(const mt_model_t *m, uint32_t id, const mt_model_frame_t **frames,
                           int *n, bool *truncated)
{
    *frames = NULL;
    *n = 0;
    if (truncated)
        *truncated = false;
    const mt__mstacks_t *s = m->stacks;
    size_t i = s ? find(s, id) : SIZE_MAX;
    if (id == 0 || i == SIZE_MAX || !s->defs[i].defined)
        return MT_ENOENT;
    *frames = s->defs[i].n ? &s->frames[s->defs[i].off] : s->frames;
    *n = s->defs[i].n;
    if (truncated)
        *truncated = s->defs[i].truncated;
    return 0;
}

int mt__model_module_add(mt_model_t *m, const char *path, uint64_t base, uint64_t size,
                         const char *build_id)
{
    if (!path || !*path || size == 0 || base > UINT64_MAX - size)
        return MT_EINVAL;
    mt__mstacks_t *s = stacks_get(m);
    if (!s)
        return MT_ENOMEM;
    for (size_t i = 0; i < s->nmods; i++) {
        mt_model_module_t *o = &s->mods[i];
        if (o->base == base && o->size == size && strcmp(o->path, path) == 0)
            return 0; /* already known */
    }
    char *p = strdup(path), *b = strdup(build_id ? build_id : "");
    if (!p || !b)
        goto nomem;
    /* an overlapped module is gone (dlclose, then something else mapped there) */
    size_t w = 0;
    for (size_t i = 0; i < s->nmods; i++) {
        mt_model_module_t *o = &s->mods[i];
        if (o->base < base + size && base < o->base + o->size) {
            free((char *)o->path);
            free((char *)o->build_id);
            continue;
        }
        s->mods[w++] = *o;
    }
    s->nmods = w;
    if (s->nmods >= MT_MODEL_MODULES_MAX) {
        free(p);
        free(b);
        return MT_EOVERFLOW;
    }
    if (s->nmods == s->capmods) {
        size_t cap = s->capmods ? 2 * s->capmods : 32;
        mt_model_module_t *v = realloc(s->mods, cap * sizeof(*v));
        if (!v)
            goto nomem;
        s->mods = v;
        s->capmods = cap;
    }
    s->mods[s->nmods++] = (mt_model_module_t){p, base, size, b};
    return 0;
nomem:
    free(p);
    free(b);
    return MT_ENOMEM;
}

void mt__model_modules(const mt_model_t *m, const mt_model_module_t **mods, size_t *n)
{
    *mods = m->stacks ? m->stacks->mods : NULL;
    *n = m->stacks ? m->stacks->nmods : 0;
}

const mt_model_module_t *mt__model_module_of(const mt_model_t *m, uint64_t ip)
{
    const mt__mstacks_t *s = m->stacks;
    for (size_t i = 0; s && i < s->nmods; i++)
        if (ip >= s->mods[i].base && ip - s->mods[i].base < s->mods[i].size)
            return &s->mods[i];
    return NULL;
}

int mt__model_tables_copy(mt_model_t *dst, const mt_model_t *src)
{
    const mt__mstacks_t *s = src->stacks;
    for (size_t i = 0; s && i < s->nmods; i++) {
        const mt_model_module_t *o = &s->mods[i];
        int rc = mt__model_module_add(dst, o->path, o->base, o->size, o->build_id);
        if (rc)
            return rc;
    }
    for (size_t i = 0; s && i < s->n; i++) {
        const sdef_t *d = &s->defs[i];
        if (!d->defined)
            continue;
        const mt_model_frame_t *f = d->n ? &s->frames[d->off] : NULL; /* none stored: NULL */
        int rc = mt__model_stack_define(dst, d->id, f, d->n, d->truncated);
        if (rc)
            return rc;
    }
    return 0;
}

void mt__model_stack_stats(const mt_model_t *m, mt_model_stack_stats_t *out)
{
    *out = m->stacks ? m->stacks->st : (mt_model_stack_stats_t){0};
}

void mt__model_stacks_free(mt_model_t *m)
{
    mt__mstacks_t *s = m->stacks;
    if (!s)
        return;
    mt__amap_fini(&s->at);
    free(s->defs);
    for (int k = 0; k < MT_MODEL_CLASSES; k++)
        free(s->fig[k]);
    free(s->frames);
    for (size_t j = 0; j < s->scap; j++)
        free(s->strs[j]);
    free(s->strs);
    for (size_t i = 0; i < s->nmods; i++) {
        free((char *)s->mods[i].path);
        free((char *)s->mods[i].build_id);
    }
    free(s->mods);
    free(s);
    m->stacks = NULL;
}

int mt__model_stacks_check(const mt_model_t *m, char *why, size_t whylen)
{
    const mt__mstacks_t *s = m->stacks;
    if (!s)
        return 0;
    MT__MCHECK(s->n <= s->cap && s->at.n == s->n, "stacks: table sizes");
    if (mt__amap_check(&s->at, why, whylen) != 0)
        return MT_EPROTO;
    MT__MCHECK(s->nframes <= MT_MODEL_FRAMES_MAX && s->str_bytes <= MT_MODEL_PY_STR_MAX,
               "stacks: bounds");
    for (size_t i = 0; i < s->n; i++) {
        MT__MCHECK(find(s, s->defs[i].id) == i, "stacks: id %u not found", s->defs[i].id);
        MT__MCHECK(!s->defs[i].defined || s->defs[i].off + s->defs[i].n <= s->nframes,
                   "stacks: id %u frames out of range", s->defs[i].id);
    }
    for (int k = 0; k < MT_MODEL_CLASSES; k++) {
        const mt__mclass_t *c = &m->cls[k];
        mt__u128 *b = calloc(s->n ? s->n : 1, sizeof(*b)), *u = calloc(s->n ? s->n : 1, sizeof(*u));
        if (!b || !u) {
            free(b);
            free(u);
            return 0; /* cannot walk without memory: nothing proven wrong */
        }
        for (size_t i = 0; i < c->live; i++) {
            const mt__mblock_t *bl = &c->blocks[i];
            if (bl->pending || bl->sidx == MT__SIDX_NONE || bl->sidx >= s->n)
                continue;
            if (bl->uncertain)
                u[bl->sidx] += bl->size;
            else
                b[bl->sidx] += bl->size;
        }
        int bad = -1;
        for (size_t i = 0; i < s->n && bad < 0; i++)
            if (b[i] != s->fig[k][i].bytes || u[i] != s->fig[k][i].unc ||
                s->fig[k][i].snap_ep > c->peak_ep)
                bad = (int)i;
        free(b);
        free(u);
        MT__MCHECK(bad < 0, "class %d: stack %u bytes differ from its blocks", k,
                   s->defs[bad < 0 ? 0 : bad].id);
    }
    return 0;
}

/* ---- "stack" and "module" lines ---- */

static int parse_hex(const json_t *v, uint64_t *out)
{
    const char *s = json_string_value(v);
    if (!s || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') || !s[2] || strlen(s) > 18)
        return -1;
    uint64_t x = 0;
    for (const char *p = s + 2; *p; p++) {
        int d = *p >= '0' && *p <= '9'   ? *p - '0'
                : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                : *p >= 'A' && *p <= 'F' ? *p - 'A' + 10
                                         : -1;
        if (d < 0)
            return -1;
        x = x << 4 | (uint64_t)d;
    }
    *out = x;
    return 0;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (err)                                                                                   \
            snprintf(err, errlen, __VA_ARGS__);                                                    \
        return MT_EPROTO;                                                                          \
    } while (0)

int mt__model_table_line(mt_model_t *m, const void *json, char *err, size_t errlen)
{
    const json_t *j = json;
    const char *kind = json_string_value(json_object_get(j, "kind"));
    if (!json_is_object(j) || !kind || json_object_get(j, "type"))
        return 0;
    if (strcmp(kind, "module") == 0) {
        const char *path = json_string_value(json_object_get(j, "path"));
        const json_t *bid = json_object_get(j, "build_id");
        json_int_t size = json_integer_value(json_object_get(j, "size"));
        uint64_t base;
        if (!path || !*path)
            BAD("module line: \"path\" missing or not a non-empty string");
        if (parse_hex(json_object_get(j, "base"), &base) != 0)
            BAD("module line: \"base\" is not a hex string \"0x...\"");
        if (!json_is_integer(json_object_get(j, "size")) || size <= 0)
            BAD("module line: \"size\" missing or not a positive integer");
        if (bid && !json_is_string(bid))
            BAD("module line: \"build_id\" is not a string");
        int rc = mt__model_module_add(m, path, base, (uint64_t)size, json_string_value(bid));
        if (rc == MT_EINVAL)
            BAD("module line: base + size beyond the address space");
        return rc == 0 || rc == MT_EOVERFLOW ? 1 : rc;
    }
    if (strcmp(kind, "stack") != 0)
        return 0;
    const json_t *idv = json_object_get(j, "id"), *fr = json_object_get(j, "frames");
    json_int_t id = json_integer_value(idv);
    if (!json_is_integer(idv) || id <= 0 || id > (json_int_t)MT_STACK_ID_MAX)
        BAD("stack line: \"id\" missing or not in 1..%u", MT_STACK_ID_MAX);
    if (!json_is_array(fr) || json_array_size(fr) > MT_STACK_DEPTH_MAX)
        BAD("stack line %lld: \"frames\" is not an array of at most %d frames", (long long)id,
            MT_STACK_DEPTH_MAX);
    const json_t *tr = json_object_get(j, "truncated");
    if (tr && !json_is_boolean(tr))
        BAD("stack line %lld: \"truncated\" is not a boolean", (long long)id);
    mt_model_frame_t f[MT_STACK_DEPTH_MAX];
    size_t i;
    const json_t *v;
    json_array_foreach(fr, i, v)
    {
        f[i] = (mt_model_frame_t){0};
        const json_t *ip = json_object_get(v, "ip"), *py = json_object_get(v, "py");
        if (ip) {
            if (parse_hex(ip, &f[i].ip) != 0)
                BAD("stack line %lld: frame %zu: \"ip\" is not a hex string", (long long)id, i);
        } else if (json_is_string(py)) {
            const json_t *file = json_object_get(v, "file"), *line = json_object_get(v, "line");
            if ((file && !json_is_string(file)) || (line && !json_is_integer(line)))
                BAD("stack line %lld: frame %zu: \"file\" or \"line\" of the wrong type",
                    (long long)id, i);
            json_int_t ln = json_integer_value(line);
            f[i].py_func = json_string_value(py);
            f[i].py_file = file ? json_string_value(file) : "?";
            f[i].py_line = ln < 0 || ln > INT32_MAX ? 0 : (int)ln;
        } else {
            BAD("stack line %lld: frame %zu has neither \"ip\" nor \"py\"", (long long)id, i);
        }
    }
    int rc = mt__model_stack_define(m, (uint32_t)id, f, (int)json_array_size(fr), json_is_true(tr));
    return rc == 0 || rc == MT_EOVERFLOW ? 1 : rc;
}
