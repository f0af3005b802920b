/* memtraced: the state model of one process, rebuilt from its event stream.
 *
 * Totals (allocated, reserved) come straight from the events, which carry the
 * allocator's running figures. What the events do not carry is rebuilt here: the live
 * blocks (alloc ... free_completed) with their tags, which give the per-tag breakdown, and
 * the segment map (segment_alloc/free, segment_map/unmap), which with the blocks gives the
 * free gaps and so the fragmentation figure, defined as the allocator defines it:
 * 1 - largest free gap / total free bytes.
 *
 * Device memory and pinned host memory (events of pool host, from a pinned host cache) are
 * accounted apart (mt_d_acct_t): host pages are visible, with their own totals, peaks, tags
 * and segment map, but never counted in the device figures. */
#include <stdlib.h>
#include <string.h>

#include "daemon/internal.h"

#define TOMB UINT64_MAX

int mt__d_proc_create(mt_d_proc_t **out, int pid, const char *name)
{
    mt_d_proc_t *p = calloc(1, sizeof *p);
    if (!p)
        return MT_ENOMEM;
    p->pid = pid;
    snprintf(p->name, sizeof p->name, "%s", name ? name : "");
    *out = p;
    return 0;
}

void mt__d_proc_destroy(mt_d_proc_t **pp)
{
    if (!pp || !*pp)
        return;
    mt_d_proc_t *p = *pp;
    free(p->dev.blocks);
    free(p->dev.ranges);
    free(p->host.blocks);
    free(p->host.ranges);
    free(p);
    *pp = NULL;
}

const char *mt__d_tag_name(const mt_d_proc_t *p, int tag, char *buf, size_t n)
{
    if (tag >= 0 && tag < MT_TAG_USER_FIRST)
        return mt_tag_builtin_name(tag);
    if (p && tag >= 0 && tag < MT_TAG_MAX && p->names[tag][0])
        return p->names[tag];
    snprintf(buf, n, "tag%d", tag);
    return buf;
}

const char *mt__d_proc_label(void *ud, int tag)
{
    const mt_d_proc_t *p = ud;
    return tag >= 0 && tag < MT_TAG_MAX && p->names[tag][0] ? p->names[tag] : NULL;
}

/* Well-formed UTF-8 without control characters? Only such a label names a tag: names go
 * into JSON strings and Prometheus label values as they are. */
static bool printable_utf8(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s;
        int n = c < 0x80                ? 1
                : c >= 0xc2 && c < 0xe0 ? 2
                : c >= 0xe0 && c < 0xf0 ? 3
                : c >= 0xf0 && c < 0xf5 ? 4
                                        : 0;
        if (n == 0 || c < 0x20 || c == 0x7f)
            return false;
        unsigned lo = 0x80, hi = 0xbf;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
        else if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
        for (int i = 1; i < n; i++, lo = 0x80, hi = 0xbf)
            if (s[i] < lo || s[i] > hi)
                return false;
        s += n;
    }
    return true;
}

/* Could s be taken for another tag's default name? */
static bool default_like(const char *s)
{
    for (int t = 0; t < MT_TAG_USER_FIRST; t++)
        if (strcmp(s, mt_tag_builtin_name(t)) == 0)
            return true;
    if (strncmp(s, "tag", 3) != 0 || s[3] == '\0')
        return false;
    for (s += 3; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* Rebuilds names from labels (see mt_d_proc_t): a label names its tag only when no other
 * tag of the process has it, so that series and JSON keys stay unique. */
static void names_update(mt_d_proc_t *p)
{
    for (int t = 0; t < MT_TAG_MAX; t++) {
        const char *l = p->labels[t];
        bool ok = l[0] != '\0' && !default_like(l) && printable_utf8(l);
        for (int u = 0; ok && u < MT_TAG_MAX; u++)
            ok = u == t || strcmp(l, p->labels[u]) != 0;
        snprintf(p->names[t], sizeof p->names[t], "%s", ok ? l : "");
    }
}

/* ---- block table ---- */

static size_t hash_addr(uint64_t addr, size_t cap)
{
    uint64_t h = (addr >> 9) * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(h >> 20) & (cap - 1);
}

static mt_d_block_t *block_find(const mt_d_acct_t *a, uint64_t addr)
{
    if (!a->blocks_cap || addr == 0 || addr == TOMB)
        return NULL;
    for (size_t i = hash_addr(addr, a->blocks_cap);; i = (i + 1) & (a->blocks_cap - 1)) {
        mt_d_block_t *b = &a->blocks[i];
        if (b->addr == addr)
            return b;
        if (b->addr == 0)
            return NULL;
    }
}

static int blocks_grow(mt_d_acct_t *a)
{
    size_t cap = a->blocks_cap ? a->blocks_cap : 64;
    while ((a->nblocks + 1) * 2 > cap)
        cap *= 2;
    mt_d_block_t *nb = calloc(cap, sizeof *nb);
    if (!nb)
        return MT_ENOMEM;
    for (size_t i = 0; i < a->blocks_cap; i++) {
        mt_d_block_t *b = &a->blocks[i];
        if (b->addr == 0 || b->addr == TOMB)
            continue;
        size_t j = hash_addr(b->addr, cap);
        while (nb[j].addr)
            j = (j + 1) & (cap - 1);
        nb[j] = *b;
    }
    free(a->blocks);
    a->blocks = nb;
    a->blocks_cap = cap;
    a->ntomb = 0;
    return 0;
}

static mt_d_block_t *block_insert(mt_d_acct_t *a, uint64_t addr)
{
    if ((a->nblocks + a->ntomb + 1) * 2 > a->blocks_cap && blocks_grow(a) != 0)
        return NULL;
    size_t i = hash_addr(addr, a->blocks_cap);
    while (a->blocks[i].addr != 0 && a->blocks[i].addr != TOMB)
        i = (i + 1) & (a->blocks_cap - 1);
    if (a->blocks[i].addr == TOMB)
        a->ntomb--;
    a->nblocks++;
    a->blocks[i] = (mt_d_block_t){.addr = addr};
    return &a->blocks[i];
}

static void block_remove(mt_d_acct_t *a, mt_d_block_t *b)
{
    b->addr = TOMB;
    a->nblocks--;
    a->ntomb++;
}

static void block_unaccount(mt_d_acct_t *a, mt_d_block_t *b)
{
    if (b->freed)
        return;
    b->freed = 1;
    a->tag_allocated[b->tag] -= b->size;
    a->tag_blocks[b->tag]--;
}

/* ---- segment map ---- */

static size_t range_lower(const mt_d_acct_t *a, uint64_t addr)
{
    size_t lo = 0, hi = a->nranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->ranges[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int range_add(mt_d_acct_t *a, const mt_d_range_t *r)
{
    if (a->nranges == a->ranges_cap) {
        size_t cap = a->ranges_cap ? a->ranges_cap * 2 : 16;
        mt_d_range_t *nr = realloc(a->ranges, cap * sizeof *nr);
        if (!nr)
            return MT_ENOMEM;
        a->ranges = nr;
        a->ranges_cap = cap;
    }
    size_t i = range_lower(a, r->addr);
    memmove(&a->ranges[i + 1], &a->ranges[i], (a->nranges - i) * sizeof *r);
    a->ranges[i] = *r;
    a->nranges++;
    return 0;
}

static void range_del(mt_d_acct_t *a, size_t i)
{
    memmove(&a->ranges[i], &a->ranges[i + 1], (a->nranges - i - 1) * sizeof a->ranges[0]);
    a->nranges--;
}

static void segment_free(mt_d_acct_t *a, uint64_t addr)
{
    for (size_t i = range_lower(a, addr); i < a->nranges && a->ranges[i].addr == addr; i++) {
        if (!a->ranges[i].mapped) {
            range_del(a, i);
            return;
        }
    }
}

/* Removes [addr, addr + size) from the mapped ranges, splitting one if need be. */
static int unmap_pages(mt_d_acct_t *a, uint64_t addr, uint64_t size)
{
    uint64_t end = addr + size;
    for (size_t i = 0; i < a->nranges;) {
        mt_d_range_t r = a->ranges[i];
        uint64_t rend = r.addr + r.size;
        if (!r.mapped || rend <= addr || r.addr >= end) {
            i++;
            continue;
        }
        range_del(a, i);
        if (r.addr < addr) {
            mt_d_range_t left = r;
            left.size = addr - r.addr;
            if (range_add(a, &left))
                return MT_ENOMEM;
        }
        if (rend > end) {
            mt_d_range_t right = r;
            right.addr = end;
            right.size = rend - end;
            if (range_add(a, &right))
                return MT_ENOMEM;
        }
        i = range_lower(a, end);
    }
    return 0;
}

/* ---- applying events ---- */

/* Blocks and segments of one class of memory. */
static int acct_apply(mt_d_acct_t *a, const mt_event_rec_t *ev)
{
    int tag = ev->tag < MT_TAG_MAX ? ev->tag : MT_TAG_OTHER;
    mt_d_block_t *b;
    mt_d_range_t r = {.addr = ev->addr, .size = ev->size, .pool = ev->pool, .stream = ev->stream};
    switch (ev->kind) {
    case MT_EV_ALLOC:
        if ((b = block_find(a, ev->addr)) != NULL) {
            /* We missed its free (dropped events): forget the old block. */
            block_unaccount(a, b);
            block_remove(a, b);
        }
        if (ev->addr == 0 || (b = block_insert(a, ev->addr)) == NULL)
            return ev->addr == 0 ? 0 : MT_ENOMEM;
        b->size = ev->size;
        b->tag = (uint8_t)tag;
        a->tag_allocated[tag] += ev->size;
        a->tag_blocks[tag]++;
        if (a->tag_allocated[tag] > a->tag_peak[tag])
            a->tag_peak[tag] = a->tag_allocated[tag];
        return 0;
    case MT_EV_FREE_REQUESTED:
        /* The allocator stops counting it as allocated now; it still occupies its bytes
         * until free_completed (its streams may still use it). */
        if ((b = block_find(a, ev->addr)) != NULL)
            block_unaccount(a, b);
        return 0;
    case MT_EV_FREE_COMPLETED:
        if ((b = block_find(a, ev->addr)) != NULL) {
            block_unaccount(a, b);
            block_remove(a, b);
        }
        return 0;
    case MT_EV_SEGMENT_ALLOC:
        return range_add(a, &r);
    case MT_EV_SEGMENT_FREE:
        segment_free(a, ev->addr);
        return 0;
    case MT_EV_SEGMENT_MAP:
        r.mapped = 1;
        return range_add(a, &r);
    case MT_EV_SEGMENT_UNMAP:
        return unmap_pages(a, ev->addr, ev->size);
    default:
        return 0;
    }
}

int mt__d_proc_apply(mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    if (ev->kind < MT_EV_KIND_COUNT)
        p->kind_count[ev->kind]++;
    if (ev->kind == MT_EV_GAP)
        return 0; /* consumer-side record: carries no allocator figures */
    if (ev->kind == MT_EV_TAG_LABEL) {
        /* A label, not an allocator operation: it changes no figure. */
        if (ev->tag >= MT_TAG_USER_FIRST && ev->tag < MT_TAG_MAX) {
            mt_event_label_unpack(ev, p->labels[ev->tag]);
            names_update(p);
        }
        return 0;
    }
    p->last_kind = ev->kind;
    if (ev->kind == MT_EV_OOM) {
        p->ooms++;
        p->last_oom_requested = ev->requested;
        p->last_oom_free = ev->size;
    }
    /* Each allocator (a device's, or a pinned host cache) reports its own running totals;
     * a class's figure is the sum over its sources. Host pages never count as device
     * memory. */
    unsigned src = mt_event_source(ev);
    mt_d_acct_t *a = ev->pool == MT_POOL_HOST ? &p->host : &p->dev;
    a->allocated += ev->allocated - p->src_allocated[src];
    a->reserved += ev->reserved - p->src_reserved[src];
    p->src_allocated[src] = ev->allocated;
    p->src_reserved[src] = ev->reserved;
    if (a->allocated > a->peak_allocated)
        a->peak_allocated = a->allocated;
    if (a->reserved > a->peak_reserved)
        a->peak_reserved = a->reserved;
    return acct_apply(a, ev);
}

double mt__d_proc_utilization(const mt_d_proc_t *p)
{
    /* Clamped: totals from a stream with dropped events may be momentarily inconsistent. */
    if (!p->dev.reserved || p->dev.allocated >= p->dev.reserved)
        return 1.0;
    return (double)p->dev.allocated / (double)p->dev.reserved;
}

/* ---- free gaps ---- */

static int cmp_u64pair(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted (addr, end) pairs of the live blocks (freed-but-pending included: they still
 * occupy memory). *new*; NULL with *n = 0 when there are none or on allocation failure. */
static uint64_t *sorted_blocks(const mt_d_acct_t *a, size_t *n)
{
    *n = 0;
    if (!a->nblocks)
        return NULL;
    uint64_t *v = malloc(a->nblocks * 2 * sizeof *v);
    if (!v)
        return NULL;
    for (size_t i = 0; i < a->blocks_cap; i++) {
        const mt_d_block_t *b = &a->blocks[i];
        if (b->addr == 0 || b->addr == TOMB)
            continue;
        v[2 * *n] = b->addr;
        v[2 * *n + 1] = b->addr + b->size;
        (*n)++;
    }
    qsort(v, *n, 2 * sizeof *v, cmp_u64pair);
    return v;
}

/* Bytes of blocks inside [a, e), and the free gaps there, given blocks sorted by addr.
 * *k is a cursor into the blocks that only moves forward (ranges come in address order). */
static uint64_t sweep(const uint64_t *blk, size_t nb, size_t *k, uint64_t a, uint64_t e,
                      mt_d_frag_t *f)
{
    while (*k < nb && blk[2 * *k + 1] <= a)
        (*k)++;
    uint64_t cur = a, used = 0;
    for (size_t i = *k; i < nb && blk[2 * i] < e; i++) {
        uint64_t ba = blk[2 * i] > a ? blk[2 * i] : a;
        uint64_t be = blk[2 * i + 1] < e ? blk[2 * i + 1] : e;
        if (ba > cur && f) {
            f->total_free += ba - cur;
            if (ba - cur > f->largest_free_block)
                f->largest_free_block = ba - cur;
        }
        if (be > ba)
            used += be - ba;
        if (be > cur)
            cur = be;
    }
    if (e > cur && f) {
        f->total_free += e - cur;
        if (e - cur > f->largest_free_block)
            f->largest_free_block = e - cur;
    }
    return used;
}

void mt__d_acct_frag(const mt_d_acct_t *a, mt_d_frag_t *out)
{
    *out = (mt_d_frag_t){0};
    size_t nb;
    uint64_t *blk = sorted_blocks(a, &nb);
    /* Ranges may overlap across kinds (pages mapped inside a segment's virtual range):
     * walk their union, in address order. */
    size_t k = 0;
    uint64_t ua = 0, ue = 0;
    bool open = false;
    for (size_t i = 0; i < a->nranges; i++) {
        uint64_t ra = a->ranges[i].addr, e = ra + a->ranges[i].size;
        if (open && ra <= ue) {
            if (e > ue)
                ue = e;
            continue;
        }
        if (open)
            sweep(blk, nb, &k, ua, ue, out);
        ua = ra;
        ue = e;
        open = true;
    }
    if (open)
        sweep(blk, nb, &k, ua, ue, out);
    out->fragmentation =
        out->total_free ? 1.0 - (double)out->largest_free_block / (double)out->total_free : 0.0;
    free(blk);
}

void mt__d_proc_frag(const mt_d_proc_t *p, mt_d_frag_t *out)
{
    mt__d_acct_frag(&p->dev, out);
}

/* ---- JSON ---- */

#define MAX_SEGMENTS_JSON 4096 /* a /state answer stays bounded */

/* The figures of one class of memory into o: totals, peaks, free gaps, tags and,
 * optionally, its segment map. Returns 0 or MT_ENOMEM. */
static int acct_json(json_t *o, const mt_d_proc_t *p, const mt_d_acct_t *a, bool with_segments)
{
    mt_d_frag_t f;
    mt__d_acct_frag(a, &f);
    double util = !a->reserved || a->allocated >= a->reserved
                      ? 1.0
                      : (double)a->allocated / (double)a->reserved;
    json_object_set_new(o, "allocated_bytes", json_integer((json_int_t)a->allocated));
    json_object_set_new(o, "reserved_bytes", json_integer((json_int_t)a->reserved));
    json_object_set_new(o, "peak_allocated_bytes", json_integer((json_int_t)a->peak_allocated));
    json_object_set_new(o, "peak_reserved_bytes", json_integer((json_int_t)a->peak_reserved));
    json_object_set_new(o, "utilization", json_real(util));
    json_object_set_new(o, "fragmentation", json_real(f.fragmentation));
    json_object_set_new(o, "total_free_bytes", json_integer((json_int_t)f.total_free));
    json_object_set_new(o, "largest_free_block_bytes",
                        json_integer((json_int_t)f.largest_free_block));
    json_object_set_new(o, "blocks", json_integer((json_int_t)a->nblocks));
    json_t *tags = json_array();
    if (!tags)
        return MT_ENOMEM;
    for (int t = 0; t < MT_TAG_MAX; t++) {
        if (!a->tag_peak[t] && !a->tag_blocks[t])
            continue;
        char nb[16];
        json_array_append_new(tags, json_pack("{s:i,s:s,s:I,s:I,s:I}", "tag", t, "name",
                                              mt__d_tag_name(p, t, nb, sizeof nb),
                                              "allocated_bytes", (json_int_t)a->tag_allocated[t],
                                              "peak_bytes", (json_int_t)a->tag_peak[t], "blocks",
                                              (json_int_t)a->tag_blocks[t]));
    }
    json_object_set_new(o, "tags", tags);
    if (!with_segments)
        return 0;
    json_t *segs = json_array();
    if (!segs)
        return MT_ENOMEM;
    size_t nb, k = 0;
    uint64_t *blk = sorted_blocks(a, &nb);
    size_t n = a->nranges < MAX_SEGMENTS_JSON ? a->nranges : MAX_SEGMENTS_JSON;
    for (size_t i = 0; i < n; i++) {
        const mt_d_range_t *r = &a->ranges[i];
        /* Ranges come sorted by start, so the cursor only skips blocks ending before this
         * one and every later range starts after them too. */
        uint64_t used = sweep(blk, nb, &k, r->addr, r->addr + r->size, NULL);
        json_array_append_new(
            segs, json_pack("{s:I,s:I,s:s,s:s,s:I,s:I}", "addr", (json_int_t)r->addr, "size",
                            (json_int_t)r->size, "kind", r->mapped ? "mapped" : "segment", "pool",
                            mt_pool_name(r->pool), "stream", (json_int_t)r->stream, "used_bytes",
                            (json_int_t)used));
    }
    free(blk);
    json_object_set_new(o, "segments", segs);
    if (a->nranges > n)
        json_object_set_new(o, "segments_truncated", json_true());
    return 0;
}

json_t *mt__d_proc_json(const mt_d_proc_t *p, bool with_segments)
{
    json_t *o = json_object();
    json_t *host = json_object();
    json_t *kinds = json_object();
    if (!o || !host || !kinds)
        goto fail;
    json_object_set_new(o, "pid", json_integer(p->pid));
    json_object_set_new(o, "name", json_string(p->name));
    if (p->backend[0])
        json_object_set_new(o, "backend", json_string(p->backend));
    json_object_set_new(o, "state", json_string(p->exited ? "exited" : "running"));
    if (p->exited) {
        json_object_set_new(o, "exit_reason", json_string(p->exit_reason));
        json_object_set_new(o, "exited_realtime_ns", json_integer((json_int_t)p->exited_realtime));
    }
    json_object_set_new(o, "registered_realtime_ns",
                        json_integer((json_int_t)p->registered_realtime));
    json_object_set_new(o, "events", json_integer((json_int_t)p->events));
    json_object_set_new(o, "dropped", json_integer((json_int_t)p->dropped));
    json_object_set_new(o, "ooms", json_integer((json_int_t)p->ooms));
    if (p->ooms) {
        json_object_set_new(o, "last_oom",
                            json_pack("{s:I,s:I}", "requested_bytes",
                                      (json_int_t)p->last_oom_requested, "free_bytes",
                                      (json_int_t)p->last_oom_free));
    }
    /* Top level: device memory only. Pinned host memory has the same figures, apart. */
    if (acct_json(o, p, &p->dev, with_segments) != 0 ||
        acct_json(host, p, &p->host, with_segments) != 0)
        goto fail;
    json_object_set_new(o, "host", host);
    host = NULL;
    for (int k = 1; k < MT_EV_KIND_COUNT; k++)
        if (p->kind_count[k])
            json_object_set_new(kinds, mt_event_kind_name(k),
                                json_integer((json_int_t)p->kind_count[k]));
    json_object_set_new(o, "kinds", kinds);
    /* The labels as announced (names in "tags" may fall back to "tag<n>" when two
     * collide); only well-formed ones, since JSON strings must be UTF-8. */
    json_t *labels = NULL;
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++) {
        if (!p->labels[t][0] || !printable_utf8(p->labels[t]))
            continue;
        char id[8];
        snprintf(id, sizeof id, "%d", t);
        if (!labels && !(labels = json_object()))
            break;
        json_object_set_new(labels, id, json_string(p->labels[t]));
    }
    if (labels)
        json_object_set_new(o, "tag_labels", labels);
    return o;
fail:
    json_decref(o);
    json_decref(host);
    json_decref(kinds);
    return NULL;
}
