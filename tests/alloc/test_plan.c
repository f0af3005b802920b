/* The greedy placement of the warm-up planner (allocator/plan.c) against a reference: the
 * greedy as it was with one level of 512-op time blocks (each placed item filed in every
 * block its lifetime meets, the blocks of a query merged one after the other), copied here
 * unchanged but for its names. Its plan is the specification: plan.c's index may change
 * how the placed items overlapping an item are found, never where an item goes. Random
 * items of varied lifetimes and strips, and the bundled traces' items (argv[1]: the source
 * tree); the work the index does; the budget's give-up. */
#include <math.h>

#include "analysis/trace_csv.h"
#include "helpers.h"
#include "mt_config.h"
#include "tests/common/test_main.h"

static const char *src_root = ".";

/* ---- the reference: plan.c's greedy before its index changed ---- */

typedef struct ref_key_s {
    double prim; /* the order's key: larger first */
    size_t size;
    uint32_t life, t0, idx;
} ref_order_t;

/* The orders tried; the placement with the smallest extent is kept. By size alone is the
 * best on the bundled traces (within 0.3 % of the peak); weighing size by the square root
 * of the lifetime places long-lived blocks first, which wins where many large blocks
 * live long (random lifetimes: 1.008 against 1.053 of the peak in test_warmup.c). */
enum { REF_ORDER_SIZE, REF_ORDER_SIZE_SQRT_LIFE, REF_ORDER_N };

/* prim, then larger; then longer-lived; then earlier: a total order, so the plan is the
 * same on every platform's qsort. */
static int ref_key_cmp(const void *x, const void *y)
{
    const ref_order_t *a = x, *b = y;
    if (a->prim != b->prim)
        return a->prim > b->prim ? -1 : 1;
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    if (a->life != b->life)
        return a->life > b->life ? -1 : 1;
    if (a->t0 != b->t0)
        return a->t0 < b->t0 ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* The index as it was: blocks of 512 ops, each with every placed item whose lifetime meets
 * it, sorted by place; a query merges the blocks one after the other. */
#define REF_BLK_SHIFT 9

typedef struct ref_blist_s {
    uint64_t *key; /* strip << 40 | off / MT__MIN_BLOCK, ascending */
    uint32_t *idx; /* the item */
    uint32_t *t0;  /* its lifetime, beside it: the scan reads no item */
    uint32_t *t1;
    uint32_t n, cap;
} ref_blist_t;

typedef struct ref_grid_s {
    const mt__plan_item_t *items;
    ref_blist_t *blk;
    size_t nblk;
    uint32_t *seen; /* per item: the query that last took it (several blocks hold it) */
    uint32_t query;
    uint64_t *mk, *tk; /* the overlapping items of a query, in place order, and scratch */
    uint32_t *mi, *ti;
    size_t m, cap;
    uint64_t work, budget;
} ref_grid_t;

#define REF_KEY_OFF_BITS 40
static uint64_t ref_place_key(uint32_t strip, size_t off)
{
    return (uint64_t)strip << REF_KEY_OFF_BITS | (uint64_t)(off / MT__MIN_BLOCK);
}

static int ref_grid_init(ref_grid_t *g, const mt__plan_item_t *items, size_t n)
{
    uint32_t span = 0;
    for (size_t i = 0; i < n; i++)
        span = items[i].t1 > span ? items[i].t1 : span;
    *g = (ref_grid_t){.items = items, .nblk = ((size_t)span >> REF_BLK_SHIFT) + 1, .cap = 64};
    g->blk = calloc(g->nblk, sizeof *g->blk);
    g->seen = calloc(n, sizeof *g->seen);
    g->mk = malloc(g->cap * sizeof *g->mk);
    g->tk = malloc(g->cap * sizeof *g->tk);
    g->mi = malloc(g->cap * sizeof *g->mi);
    g->ti = malloc(g->cap * sizeof *g->ti);
    return g->blk && g->seen && g->mk && g->tk && g->mi && g->ti ? 0 : MT_ENOMEM;
}

static void ref_grid_reset(ref_grid_t *g, size_t n)
{
    for (size_t b = 0; b < g->nblk; b++)
        g->blk[b].n = 0;
    memset(g->seen, 0, n * sizeof *g->seen);
    g->query = 0;
}

static void ref_grid_fini(ref_grid_t *g)
{
    for (size_t b = 0; g->blk != NULL && b < g->nblk; b++) {
        free(g->blk[b].key);
        free(g->blk[b].idx);
        free(g->blk[b].t0);
        free(g->blk[b].t1);
    }
    free(g->blk);
    free(g->seen);
    free(g->mk);
    free(g->tk);
    free(g->mi);
    free(g->ti);
}

static int ref_grid_room(ref_grid_t *g, size_t need)
{
    if (need <= g->cap)
        return 0;
    size_t cap = g->cap;
    while (cap < need)
        cap *= 2;
    uint64_t *mk = realloc(g->mk, cap * sizeof *mk);
    if (mk != NULL)
        g->mk = mk;
    uint64_t *tk = realloc(g->tk, cap * sizeof *tk);
    if (tk != NULL)
        g->tk = tk;
    uint32_t *mi = realloc(g->mi, cap * sizeof *mi);
    if (mi != NULL)
        g->mi = mi;
    uint32_t *ti = realloc(g->ti, cap * sizeof *ti);
    if (ti != NULL)
        g->ti = ti;
    if (mk == NULL || tk == NULL || mi == NULL || ti == NULL)
        return MT_ENOMEM;
    g->cap = cap;
    return 0;
}

/* g->mk/mi[0..m) = the placed items overlapping [t0, t1) in time, in place order. */
static int ref_grid_query(ref_grid_t *g, uint32_t t0, uint32_t t1)
{
    g->query++;
    g->m = 0;
    for (size_t b = t0 >> REF_BLK_SHIFT; b <= (size_t)(t1 - 1) >> REF_BLK_SHIFT; b++) {
        const ref_blist_t *l = &g->blk[b];
        g->work += l->n;
        if (ref_grid_room(g, g->m + l->n) != 0)
            return MT_ENOMEM;
        /* Merge the block's new overlapping items into mk/mi, through tk/ti. */
        size_t i = 0, o = 0;
        for (uint32_t j = 0; j < l->n; j++) {
            if (!(l->t0[j] < t1 && t0 < l->t1[j]))
                continue;
            uint32_t x = l->idx[j];
            if (g->seen[x] == g->query)
                continue;
            g->seen[x] = g->query;
            while (i < g->m && g->mk[i] < l->key[j]) {
                g->tk[o] = g->mk[i];
                g->ti[o++] = g->mi[i++];
            }
            g->tk[o] = l->key[j];
            g->ti[o++] = x;
        }
        if (o == 0)
            continue;
        while (i < g->m) {
            g->tk[o] = g->mk[i];
            g->ti[o++] = g->mi[i++];
        }
        g->work += o;
        uint64_t *k = g->mk;
        uint32_t *x = g->mi;
        g->mk = g->tk;
        g->mi = g->ti;
        g->tk = k;
        g->ti = x;
        g->m = o;
    }
    return 0;
}

/* Files placed item x in the blocks its lifetime meets. */
static int ref_grid_insert(ref_grid_t *g, uint32_t x)
{
    const mt__plan_item_t *it = &g->items[x];
    uint64_t key = ref_place_key(it->strip, it->off);
    for (size_t b = it->t0 >> REF_BLK_SHIFT; b <= (size_t)(it->t1 - 1) >> REF_BLK_SHIFT; b++) {
        ref_blist_t *l = &g->blk[b];
        if (l->n == l->cap) {
            uint32_t cap = l->cap ? 2 * l->cap : 16;
            uint64_t *k = realloc(l->key, cap * sizeof *k);
            if (k != NULL)
                l->key = k;
            uint32_t *i = realloc(l->idx, cap * sizeof *i);
            if (i != NULL)
                l->idx = i;
            uint32_t *a = realloc(l->t0, cap * sizeof *a);
            if (a != NULL)
                l->t0 = a;
            uint32_t *z = realloc(l->t1, cap * sizeof *z);
            if (z != NULL)
                l->t1 = z;
            if (k == NULL || i == NULL || a == NULL || z == NULL)
                return MT_ENOMEM;
            l->cap = cap;
        }
        uint32_t lo = 0, hi = l->n;
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (l->key[mid] < key)
                lo = mid + 1;
            else
                hi = mid;
        }
        memmove(&l->key[lo + 1], &l->key[lo], (l->n - lo) * sizeof *l->key);
        memmove(&l->idx[lo + 1], &l->idx[lo], (l->n - lo) * sizeof *l->idx);
        memmove(&l->t0[lo + 1], &l->t0[lo], (l->n - lo) * sizeof *l->t0);
        memmove(&l->t1[lo + 1], &l->t1[lo], (l->n - lo) * sizeof *l->t1);
        l->key[lo] = key;
        l->idx[lo] = x;
        l->t0[lo] = it->t0;
        l->t1[lo] = it->t1;
        l->n++;
        g->work += l->n - lo;
    }
    return 0;
}

/* The end of a strip's scan: offers its tail (bounded strips) or notes it (the last). */
typedef struct ref_pick_s {
    size_t gap, gap_off, tail, tail_off, utail;
    uint32_t gap_strip, tail_strip;
} ref_pick_t;

static void ref_strip_done(ref_pick_t *k, uint32_t s, size_t cur, const size_t *cap, size_t nstrips,
                           size_t size)
{
    if (s + 1 == nstrips)
        k->utail = cur;
    else if (cap[s] >= cur && cap[s] - cur >= size && cur < k->tail) {
        k->tail = cur;
        k->tail_strip = s;
    }
}

/* Where item it goes, given the placed items overlapping it in time (g->mi, place order). */
static void ref_choose(const ref_grid_t *g, mt__plan_item_t *it, const size_t *cap, size_t nstrips)
{
    ref_pick_t k = {.gap = SIZE_MAX, .tail = SIZE_MAX};
    uint32_t s = 0;
    size_t cur = 0; /* end of the space taken below, in strip s, by items overlapping it */
    for (size_t h = 0; h < g->m; h++) {
        const mt__plan_item_t *p = &g->items[g->mi[h]];
        while (s < p->strip) {
            ref_strip_done(&k, s++, cur, cap, nstrips, it->size);
            cur = 0;
        }
        if (p->off > cur && p->off - cur >= it->size && p->off - cur < k.gap) {
            k.gap = p->off - cur;
            k.gap_strip = s;
            k.gap_off = cur;
        }
        if (p->off + p->size > cur)
            cur = p->off + p->size;
    }
    for (; s < nstrips; s++, cur = 0)
        ref_strip_done(&k, s, cur, cap, nstrips, it->size);
    if (k.gap != SIZE_MAX) {
        it->strip = k.gap_strip;
        it->off = k.gap_off;
    } else if (k.tail != SIZE_MAX) {
        it->strip = k.tail_strip;
        it->off = k.tail;
    } else {
        it->strip = (uint32_t)(nstrips - 1);
        it->off = k.utail;
    }
}

/* One greedy pass in the order of keys; *extent = the unbounded strip's. MT_EAGAIN when
 * the work passed the budget. */
static int ref_place_in_order(mt__plan_item_t *items, const ref_order_t *keys, size_t n,
                              ref_grid_t *g, const size_t *cap, size_t nstrips, size_t *extent)
{
    ref_grid_reset(g, n);
    *extent = 0;
    for (size_t k = 0; k < n; k++) {
        mt__plan_item_t *it = &items[keys[k].idx];
        int rc = ref_grid_query(g, it->t0, it->t1);
        if (rc != 0)
            return rc;
        ref_choose(g, it, cap, nstrips);
        if (it->strip + 1u == nstrips && it->off + it->size > *extent)
            *extent = it->off + it->size;
        if ((rc = ref_grid_insert(g, keys[k].idx)) != 0)
            return rc;
        if (g->work > g->budget)
            return MT_EAGAIN;
    }
    return 0;
}

static int ref_greedy(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                      size_t *extent, uint64_t budget, uint64_t *work)
{
    if (work != NULL)
        *work = 0;
    mt_assert(nstrips >= 1 && nstrips < ((size_t)1 << (64 - REF_KEY_OFF_BITS)) && n <= UINT32_MAX);
    *extent = 0;
    if (n == 0)
        return 0;
    ref_order_t *keys = malloc(n * sizeof *keys);
    mt__plan_item_t *best = malloc(n * sizeof *best);
    ref_grid_t g;
    int rc = ref_grid_init(&g, items, n);
    if (rc != 0 || keys == NULL || best == NULL) {
        rc = MT_ENOMEM;
        goto out;
    }
    g.budget = budget;
    *extent = SIZE_MAX;
    for (int order = 0; order < REF_ORDER_N; order++) {
        for (size_t i = 0; i < n; i++) {
            const mt__plan_item_t *it = &items[i];
            mt_assert(it->t0 < it->t1 && it->size > 0);
            uint32_t life = it->t1 - it->t0;
            double prim = (double)it->size;
            if (order == REF_ORDER_SIZE_SQRT_LIFE)
                prim *= sqrt((double)life);
            keys[i] = (ref_order_t){prim, it->size, life, it->t0, (uint32_t)i};
        }
        qsort(keys, n, sizeof *keys, ref_key_cmp);
        size_t e = 0;
        if ((rc = ref_place_in_order(items, keys, n, &g, cap, nstrips, &e)) != 0)
            goto out;
        if (e < *extent) {
            *extent = e;
            memcpy(best, items, n * sizeof *best);
        }
    }
    memcpy(items, best, n * sizeof *items);
out:
    if (work != NULL)
        *work = g.work;
    ref_grid_fini(&g);
    free(keys);
    free(best);
    return rc;
}

/* ---- inputs ---- */

static unsigned next_rand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) & 0xffffff;
}

static uint32_t rand32(unsigned *s)
{
    return (uint32_t)next_rand(s) << 8 ^ next_rand(s);
}

enum {
    SHAPE_SHORT,
    SHAPE_LONG,
    SHAPE_MIXED,
    SHAPE_RANDOM_TIMES,
    SHAPE_ALL_LIVE,
    SHAPE_EDGES,
    SHAPE_WIDE,
    SHAPE_N
};

/* n items of a shape: lifetimes short, long, mixed (mostly short, some spanning much of
 * the sequence), at random (repeated) times, all live at once, at the edges of blocks of
 * 2^6..2^19 ops (starts and lengths a power of two, give or take one), or a few over a wide
 * span; sizes varied or from a few values (ties in the orders). */
static void make_items(mt__plan_item_t *it, uint32_t n, int shape, unsigned seed)
{
    unsigned rs = seed * 7919u + (unsigned)shape;
    bool few_sizes = seed % 2 == 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = next_rand(&rs), t0 = i, life;
        switch (shape) {
        case SHAPE_SHORT:
            life = 1 + r % 20;
            break;
        case SHAPE_LONG:
            life = 1 + r % 40000;
            break;
        case SHAPE_MIXED:
            life = r % 100 < 80   ? 1 + next_rand(&rs) % 20
                   : r % 100 < 95 ? 1 + next_rand(&rs) % 600
                                  : 1 + next_rand(&rs) % (4 * n);
            break;
        case SHAPE_RANDOM_TIMES:
            t0 = next_rand(&rs) % (2 * n);
            life = r % 4 == 0 ? 1 + next_rand(&rs) % (2 * n) : 1 + next_rand(&rs) % 40;
            break;
        case SHAPE_ALL_LIVE:
            life = n + 1;
            break;
        case SHAPE_EDGES: {
            uint32_t sh = 6 + r % 13;
            t0 = ((next_rand(&rs) % 8) << sh) + next_rand(&rs) % 3;
            life = ((uint32_t)1 << (6 + next_rand(&rs) % 14)) + next_rand(&rs) % 3;
            t0 = t0 > 0 ? t0 - 1 : t0;
            life = life > 1 ? life - 1 : life;
            break;
        }
        default: /* SHAPE_WIDE */
            t0 = rand32(&rs) % (1u << 22);
            life = r % 8 == 0 ? 1 + rand32(&rs) % (1u << 22) : 1 + next_rand(&rs) % 3000;
            break;
        }
        size_t size = few_sizes ? (size_t)512 << (next_rand(&rs) % 3)
                                : (1 + next_rand(&rs) % 64) * 512 * (1 + i % 7);
        it[i] = (mt__plan_item_t){.size = size, .t0 = t0, .t1 = t0 + life};
    }
}

/* Places a copy of it[0..n) with plan.c's greedy and with the reference: the same plan,
 * item by item. *work / *ref_work: each one's. */
static void same_plan(const mt__plan_item_t *it, size_t n, const size_t *cap, size_t nstrips,
                      uint64_t *work, uint64_t *ref_work, const char *what)
{
    mt__plan_item_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    memcpy(a, it, n * sizeof *a);
    memcpy(b, it, n * sizeof *b);
    size_t ea = 0, eb = 0;
    assert_int_equal(mt__plan_place_greedy(a, n, cap, nstrips, &ea, UINT64_MAX, work), 0);
    assert_int_equal(ref_greedy(b, n, cap, nstrips, &eb, UINT64_MAX, ref_work), 0);
    size_t diff = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (a[i].strip != b[i].strip || a[i].off != b[i].off) {
            first = diff++ == 0 ? i : first;
        }
    if (diff > 0 || ea != eb)
        print_message("%s: %zu of %zu items placed elsewhere (first %zu: strip %u off %zu, "
                      "reference strip %u off %zu); extent %zu, reference %zu\n",
                      what, diff, n, first, first < n ? a[first].strip : 0,
                      first < n ? a[first].off : 0, first < n ? b[first].strip : 0,
                      first < n ? b[first].off : 0, ea, eb);
    assert_int_equal(diff, 0);
    assert_int_equal(ea, eb);
    free(a);
    free(b);
}

/* Random items of every shape, with one unbounded strip, with small bounded strips beside it
 * (capacities multiples of MT__ALIGN, as free blocks are; one empty), and with bounded
 * strips as large as the whole: the same plan as the reference's. */
static void test_greedy_same_plan_random(void **state)
{
    (void)state;
    enum { N = MT_TEST_LIGHT ? 600 : 1800 }; /* the reference's work grows as N^2 */
    mt__plan_item_t *it = malloc(N * sizeof *it);
    assert_non_null(it);
    uint64_t work = 0, ref_work = 0, w, rw;
    for (int shape = 0; shape < SHAPE_N; shape++)
        for (unsigned seed = 1; seed <= 4; seed++) {
            uint32_t n = seed == 4 ? 37 : N;
            make_items(it, n, shape, seed);
            size_t total = 0;
            for (uint32_t i = 0; i < n; i++)
                total += it[i].size;
            unsigned rs = seed;
            size_t small[4] = {96 * KIB + 256, 0, 1 * MIB, 0};
            size_t many[6];
            for (int s = 0; s < 5; s++)
                many[s] = (size_t)(next_rand(&rs) % 4096) * 256;
            many[5] = 0;
            size_t large[3] = {total / 3 + 256, total, 0};
            static const char *const name[] = {"one strip", "small strips", "many strips",
                                               "large strips"};
            for (int st = 0; st < 4; st++) {
                size_t one[2] = {0, 0};
                const size_t *cap = st == 0 ? one : st == 1 ? small : st == 2 ? many : large;
                size_t ns = st == 0 ? 1 : st == 1 ? 4 : st == 2 ? 6 : 3;
                char what[96];
                snprintf(what, sizeof what, "shape %d, seed %u, %s", shape, seed, name[st]);
                same_plan(it, n, cap, ns, &w, &rw, what);
                work += w;
                ref_work += rw;
            }
        }
    print_message("random items: work %llu, reference %llu\n", (unsigned long long)work,
                  (unsigned long long)ref_work);
    free(it);
}

/* The items reserve.c makes of a whole trace as one warm-up: its allocations freed within
 * it, sizes rounded up to MT__MIN_BLOCK, times the indices of its operations. */
static void trace_items(const char *name, mt__plan_item_t **out, size_t *n, size_t *peak)
{
    char path[4096], err[MT_TRACE_ERR_LEN + 256];
    snprintf(path, sizeof path, "%s/data/traces/%s", src_root, name);
    mt_trace_t *t = NULL;
    if (mt__trace_load(&t, path, err, sizeof err) != 0) /* (xz or plain) */
        fail_msg("%s", err);
    mt__plan_item_t *it = calloc(t->nslots + 1, sizeof *it);
    assert_non_null(it);
    for (size_t i = 0; i < t->nops; i++) {
        mt__plan_item_t *x = &it[t->ops[i].slot];
        if (t->ops[i].action == MT_TRACE_ALLOCATE)
            *x = (mt__plan_item_t){.size = (t->ops[i].size + MT__MIN_BLOCK - 1) / MT__MIN_BLOCK *
                                           MT__MIN_BLOCK,
                                   .t0 = (uint32_t)i};
        else
            x->t1 = (uint32_t)i;
    }
    size_t live = 0;
    *peak = 0;
    for (size_t i = 0; i < t->nops; i++) {
        const mt__plan_item_t *x = &it[t->ops[i].slot];
        if (x->t1 == 0)
            continue; /* not freed: no item */
        live = t->ops[i].action == MT_TRACE_ALLOCATE ? live + x->size : live - x->size;
        *peak = live > *peak ? live : *peak;
    }
    *n = 0;
    for (size_t s = 0; s < t->nslots; s++)
        if (it[s].t1 > 0) {
            assert_true(it[s].size > 0 && it[s].t0 < it[s].t1);
            it[(*n)++] = it[s];
        }
    mt__trace_free(&t);
    *out = it;
}

/* The bundled traces, each a whole warm-up: the same plan as the reference's, in one
 * unbounded strip and beside two bounded ones. The recorded torch_* traces have lifetimes
 * from one op to the whole run (GRU: 16 ops at the median, 9 063 at p99): there the index
 * visits several times fewer entries than the reference's. */
static void test_greedy_same_plan_traces(void **state)
{
    (void)state;
    static const char *const trace[] = {"rnn_varlen.csv",       "somas_resnet50.csv",
                                        "somas_pangu_2.6B.csv", "torch_transformer.csv.xz",
                                        "torch_lstm.csv.xz",    "torch_gru.csv.xz"};
    size_t read = 0;
    for (size_t k = 0; k < sizeof trace / sizeof *trace; k++) {
        mt__plan_item_t *it = NULL;
        size_t n = 0, peak = 0;
        if (MT_TEST_LIGHT && k >= 4) {
            print_message("%s: left out in this build (MT_TEST_LIGHT: minutes here)\n", trace[k]);
            continue;
        }
        trace_items(trace[k], &it, &n, &peak);
        read++;
        uint64_t w = 0, rw = 0, w2 = 0, rw2 = 0;
        size_t one[2] = {0, 0};
        same_plan(it, n, one, 1, &w, &rw, trace[k]);
        bool big = n > 50000;
        if (!big) { /* the large ones once: the reference takes seconds there */
            size_t cap[3] = {peak / 4 + 256, peak / 16, 0};
            same_plan(it, n, cap, 3, &w2, &rw2, trace[k]);
        }
        print_message("%s: %zu items, work %.3f G, reference %.3f G (%.1fx)\n", trace[k], n,
                      (double)w * 1e-9, (double)rw * 1e-9, (double)rw / (double)w);
        if (strncmp(trace[k], "torch_", 6) == 0 && n > 50000)
            assert_true(w * 3 < rw);
        free(it);
    }
    assert_true(read >= (MT_TEST_LIGHT ? 4 : 6));
}

/* The budget: a pass gives up with MT_EAGAIN as soon as its work passes it, and the work
 * reported is what it counted, so a budget of exactly that much lets it finish. */
static void test_greedy_budget(void **state)
{
    (void)state;
    enum { N = 3000 };
    mt__plan_item_t *it = malloc(N * sizeof *it), *a = malloc(N * sizeof *a);
    assert_non_null(it);
    assert_non_null(a);
    make_items(it, N, SHAPE_MIXED, 3);
    size_t one[2] = {0, 0}, e = 0;
    uint64_t work = 0, w = 0;
    memcpy(a, it, N * sizeof *a);
    assert_int_equal(mt__plan_place_greedy(a, N, one, 1, &e, UINT64_MAX, &work), 0);
    assert_true(work > N);
    memcpy(a, it, N * sizeof *a);
    assert_int_equal(mt__plan_place_greedy(a, N, one, 1, &e, work, &w), 0);
    assert_int_equal(w, work);
    memcpy(a, it, N * sizeof *a);
    assert_int_equal(mt__plan_place_greedy(a, N, one, 1, &e, work - 1, &w), MT_EAGAIN);
    assert_true(w > work - 1);
    memcpy(a, it, N * sizeof *a);
    assert_int_equal(mt__plan_place_greedy(a, N, one, 1, &e, work / 3, &w), MT_EAGAIN);
    assert_true(w > work / 3 && w < work);
    /* All live at once: O(n^2) entries; the default budget of 3000 items still holds it, a
     * budget of 100 entries per item does not. */
    make_items(it, N, SHAPE_ALL_LIVE, 1);
    memcpy(a, it, N * sizeof *a);
    assert_int_equal(mt__plan_place_greedy(a, N, one, 1, &e, mt__plan_budget(N), &w), 0);
    memcpy(a, it, N * sizeof *a);
    assert_int_equal(mt__plan_place_greedy(a, N, one, 1, &e, 100 * N, &w), MT_EAGAIN);
    free(it);
    free(a);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        src_root = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_same_plan_random),
        cmocka_unit_test(test_greedy_same_plan_traces),
        cmocka_unit_test(test_greedy_budget),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
