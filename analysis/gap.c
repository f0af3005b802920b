/* The gap reserved - allocated by cause, from the model's segment map (gap.h). The map's
 * segments and blocks are both sorted by address: one pass over the two. */
#include "analysis/gap.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

typedef __int128 i128;

static const char *const cause_names[MT_GAP_CAUSES] = {
    [MT_GAP_PINNED_FREE] = "pinned_free",       [MT_GAP_CACHED_SEGMENTS] = "cached_segments",
    [MT_GAP_STREAM_PENDING] = "stream_pending", [MT_GAP_EXPANDABLE_SLACK] = "expandable_slack",
    [MT_GAP_UNTRACKED] = "untracked",
};

const char *mt__gap_cause_name(int cause)
{
    return cause >= 0 && cause < MT_GAP_CAUSES ? cause_names[cause] : NULL;
}

static int64_t clamp64(i128 v)
{
    return v > INT64_MAX ? INT64_MAX : v < INT64_MIN ? INT64_MIN : (int64_t)v;
}

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

/* What the blocks inside one segment say about it. */
typedef struct seg_use_s {
    uint64_t pending;   /* bytes of pending blocks, clipped to the segment */
    uint64_t live;      /* live (not pending) blocks */
    uint64_t top_size;  /* bytes, the largest live block */
    uint32_t top_stack; /* its stack */
} seg_use_t;

static int cmp_pin_stack(const void *a, const void *b)
{
    const mt_gap_pin_t *x = a, *y = b;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static int cmp_pin_bytes(const void *a, const void *b)
{
    const mt_gap_pin_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return cmp_pin_stack(a, b);
}

/* One row per stack: rows of one stack add up (bytes saturate), then largest first. */
static void pins_merge(mt_gap_t *g)
{
    if (g->npins == 0)
        return;
    qsort(g->pins, g->npins, sizeof *g->pins, cmp_pin_stack);
    size_t k = 0;
    for (size_t i = 1; i < g->npins; i++) {
        mt_gap_pin_t *p = &g->pins[k], *q = &g->pins[i];
        if (q->stack == p->stack) {
            p->bytes = mt_model_sat_add(p->bytes, q->bytes);
            p->segments++;
            p->block = q->block > p->block ? q->block : p->block;
        } else {
            g->pins[++k] = *q;
        }
    }
    g->npins = k + 1;
    qsort(g->pins, g->npins, sizeof *g->pins, cmp_pin_bytes);
}

/* The blocks from *k on that start inside [a, e) (blocks before a were passed). */
static seg_use_t seg_use(const mt_model_map_t *map, size_t *k, uint64_t a, uint64_t e)
{
    seg_use_t u = {0};
    while (*k < map->nblocks && map->blocks[*k].addr < a)
        (*k)++;
    for (; *k < map->nblocks && map->blocks[*k].addr < e; (*k)++) {
        const mt_model_block_t *b = &map->blocks[*k];
        if (b->pending) {
            uint64_t be = end_of(b->addr, b->size);
            u.pending = mt_model_sat_add(u.pending, (be < e ? be : e) - b->addr);
            continue;
        }
        u.live++;
        if (u.live == 1 || b->size > u.top_size) {
            u.top_size = b->size;
            u.top_stack = b->stack;
        }
    }
    return u;
}

static void rounding(const mt_model_map_t *map, mt_gap_t *g)
{
    for (size_t i = 0; i < map->nblocks; i++) {
        const mt_model_block_t *b = &map->blocks[i];
        if (b->pending || b->uncertain)
            continue; /* not in the allocated total */
        if (b->requested == 0 || b->requested > b->size) {
            g->blocks_unknown++;
            continue;
        }
        g->rounding = mt_model_sat_add(g->rounding, b->size - b->requested);
        g->requested_known = mt_model_sat_add(g->requested_known, b->requested);
    }
}

int mt__gap_of_map(const mt_model_map_t *map, uint64_t allocated, uint64_t reserved, mt_gap_t *out)
{
    memset(out, 0, sizeof *out);
    out->reserved = reserved;
    out->allocated = allocated;
    out->segments = map->nsegs;
    rounding(map, out);
    out->pins = malloc((map->nsegs ? map->nsegs : 1) * sizeof *out->pins);
    int rc = out->pins ? 0 : MT_ENOMEM;
    i128 part[MT_GAP_CAUSES] = {0};
    size_t k = 0;
    for (size_t i = 0; i < map->nsegs; i++) {
        const mt_model_seg_t *s = &map->segs[i];
        seg_use_t u = seg_use(map, &k, s->addr, end_of(s->addr, s->size));
        uint64_t used = s->used < s->size ? s->used : s->size;
        uint64_t pend = u.pending < used ? u.pending : used;
        uint64_t free_b = s->size - used;
        part[MT_GAP_STREAM_PENDING] += pend;
        if (s->mapped)
            part[MT_GAP_EXPANDABLE_SLACK] += free_b;
        else if (u.live > 0)
            part[MT_GAP_PINNED_FREE] += free_b;
        else if (pend > 0)
            part[MT_GAP_STREAM_PENDING] += free_b; /* goes back once the events complete */
        else
            part[MT_GAP_CACHED_SEGMENTS] += s->size; /* no block in it: used is 0 */
        if (!s->mapped && u.live > 0 && free_b > 0 && out->pins)
            out->pins[out->npins++] = (mt_gap_pin_t){
                .stack = u.top_stack, .bytes = free_b, .segments = 1, .block = u.top_size};
    }
    /* Live blocks the allocated total does not count (uncertain ones, after a gap) and
     * reserved bytes no known segment holds are what untracked adds up. */
    i128 sum = 0;
    for (int c = 0; c < MT_GAP_UNTRACKED; c++)
        sum += part[c];
    part[MT_GAP_UNTRACKED] = (i128)reserved - (i128)allocated - sum;
    for (int c = 0; c < MT_GAP_CAUSES; c++)
        out->cause[c] = clamp64(part[c]);
    pins_merge(out);
    return rc;
}

int mt__gap_of_model(const mt_model_t *m, int cls, mt_gap_t *out)
{
    memset(out, 0, sizeof *out);
    mt_model_figures_t f;
    mt__model_figures_totals(m, cls, &f);
    mt_model_map_t map;
    int rc = mt__model_map(m, cls, &map);
    if (rc != 0)
        return rc;
    rc = mt__gap_of_map(&map, f.allocated, f.reserved, out);
    mt__model_map_free(&map);
    return rc;
}

void mt__gap_free(mt_gap_t *g)
{
    free(g->pins);
    g->pins = NULL;
    g->npins = 0;
}

static json_int_t ji(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v;
}

json_t *mt__gap_json(const mt_gap_t *g, size_t top)
{
    json_t *causes = json_array(), *pins = json_array();
    for (int c = 0; causes && c < MT_GAP_CAUSES; c++)
        if (json_array_append_new(causes, json_pack("{s:s, s:I}", "cause", cause_names[c], "bytes",
                                                    (json_int_t)g->cause[c])) != 0) {
            json_decref(causes);
            causes = NULL;
        }
    for (size_t i = 0; pins && i < g->npins && i < top; i++)
        if (json_array_append_new(
                pins, json_pack("{s:I, s:I, s:I, s:I}", "stack", (json_int_t)g->pins[i].stack,
                                "bytes", ji(g->pins[i].bytes), "segments", ji(g->pins[i].segments),
                                "largest_block_bytes", ji(g->pins[i].block))) != 0) {
            json_decref(pins);
            pins = NULL;
        }
    i128 gap = (i128)g->reserved - (i128)g->allocated;
    return json_pack("{s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:o}", "reserved_bytes",
                     ji(g->reserved), "allocated_bytes", ji(g->allocated), "gap_bytes",
                     (json_int_t)clamp64(gap), "causes", causes, "rounding_bytes", ji(g->rounding),
                     "requested_known_bytes", ji(g->requested_known), "blocks_request_unknown",
                     ji(g->blocks_unknown), "segments", ji(g->segments), "pins", pins);
}

static json_int_t pin_int(json_t *r, const char *k)
{
    json_int_t v = json_integer_value(json_object_get(r, k));
    return v > 0 ? v : 0;
}

static json_int_t sat_add(json_int_t a, json_int_t b)
{
    return a > LLONG_MAX - b ? LLONG_MAX : a + b; /* (json_int_t is long long here) */
}

/* A row's key in the two sorts of mt__gap_pins_by_site. */
typedef struct pin_key_s {
    const char *site; /* by site: its text, NULL for a row without one */
    json_int_t bytes; /* by size: its bytes */
    size_t i;         /* its place before the sort: ties keep the rows' order */
} pin_key_t;

static int by_site(const void *x, const void *y)
{
    const pin_key_t *a = x, *b = y;
    int c = strcmp(a->site, b->site);
    return c != 0 ? c : (a->i > b->i) - (a->i < b->i);
}

static int by_bytes_desc(const void *x, const void *y)
{
    const pin_key_t *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? 1 : -1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Rows of one site are found by a sort of the sites and ranked again by a sort of the sums
 * (N log N: a log's pins are per stack, and a log can have many). */
int mt__gap_pins_by_site(json_t *pins, size_t top)
{
    size_t n = json_array_size(pins), nsite = 0, nkeep = 0;
    int rc = MT_ENOMEM;
    pin_key_t *k = calloc(n ? n : 1, sizeof *k);
    json_t **keep = calloc(n ? n : 1, sizeof *keep);
    bool *gone = calloc(n ? n : 1, sizeof *gone);
    if (k == NULL || keep == NULL || gone == NULL)
        goto out_alloc;
    for (size_t i = 0; i < n; i++) {
        const char *site = json_string_value(json_object_get(json_array_get(pins, i), "site"));
        if (site != NULL)
            k[nsite++] = (pin_key_t){.site = site, .i = i};
    }
    qsort(k, nsite, sizeof *k, by_site);
    /* Each run of one site adds its later rows into its first (the earliest in the array). */
    for (size_t g = 0; g < nsite;) {
        json_t *a = json_array_get(pins, k[g].i);
        size_t e = g + 1;
        for (; e < nsite && strcmp(k[e].site, k[g].site) == 0; e++) {
            json_t *b = json_array_get(pins, k[e].i);
            json_int_t big = pin_int(a, "largest_block_bytes"),
                       bb = pin_int(b, "largest_block_bytes");
            /* (a failed set leaves the old figure: the sum would read short) */
            if (json_object_set_new(
                    a, "bytes", json_integer(sat_add(pin_int(a, "bytes"), pin_int(b, "bytes")))) ||
                json_object_set_new(
                    a, "segments",
                    json_integer(sat_add(pin_int(a, "segments"), pin_int(b, "segments")))) ||
                json_object_set_new(a, "largest_block_bytes", json_integer(big > bb ? big : bb)))
                goto out_set;
            gone[k[e].i] = true;
        }
        g = e;
    }
    /* largest first, ties in the rows' order (as the rows were before the merge) */
    for (size_t i = 0; i < n; i++)
        if (!gone[i])
            k[nkeep++] = (pin_key_t){.bytes = pin_int(json_array_get(pins, i), "bytes"), .i = i};
    qsort(k, nkeep, sizeof *k, by_bytes_desc);
    if (nkeep > top)
        nkeep = top;
    for (size_t j = 0; j < nkeep; j++)
        keep[j] = json_incref(json_array_get(pins, k[j].i));
    /* The array's room only shrinks from here: clear keeps it, so no append allocates. */
    json_array_clear(pins);
    rc = 0;
    for (size_t j = 0; j < nkeep; j++)
        if (json_array_append_new(pins, keep[j]) != 0 && rc == 0)
            rc = MT_ENOMEM;
out_set:
out_alloc:
    free(k);
    free(keep);
    free(gone);
    return rc;
}
