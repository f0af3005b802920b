/* libFuzzer harness: the restricted unpickler and the snapshot model (what `memtrace
 * replay|report|plot SNAPSHOT.pickle` run on a file). The input is the whole file. Checks
 * beyond "no crash": a refused file names the offset and what was wrong; an accepted one is
 * a tree whose depths are exact and bounded; a snapshot that loads passes mt__ts_check, and
 * writing it (both layouts) and reading that back keeps its segments, blocks and events. */
#include <string.h>

#include "analysis/pickle.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/common.h"
#include "tests/fuzz/fuzz.h"

/* Walks v; returns its depth as recomputed. Sealed containers were never changed after
 * their items were placed, so the stored depth must be exact. */
static unsigned walk(const mt_pk_value_t *v, unsigned budget)
{
    FUZZ_CHECK(budget > 0, "the tree is no deeper than the limit");
    unsigned d = 1;
    size_t n = v->type == MT_PK_DICT ? 2 * v->n : v->n;
    if (v->type == MT_PK_TUPLE || v->type == MT_PK_LIST || v->type == MT_PK_DICT)
        for (size_t i = 0; i < n; i++) {
            unsigned c = walk(v->u.items[i], budget - 1) + 1;
            d = c > d ? c : d;
        }
    else if (v->type == MT_PK_STR || v->type == MT_PK_BYTES)
        FUZZ_CHECK(v->u.s[v->n] == '\0', "strings are NUL-terminated");
    FUZZ_CHECK(d == v->depth, "the stored depth is exact");
    return d;
}

/* The records: n[0] of the trace, n[1] made up from the state before it, of which npend
 * are the free requests of blocks asked free before the trace (each right after its
 * block's own record); last: the previous record. */
typedef struct recs_s {
    size_t n[2], npend;
    mt_event_rec_t last;
    unsigned last_flags;
} recs_t;

static int count_rec(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    recs_t *c = ctx;
    FUZZ_CHECK(ev->kind >= MT_EV_ALLOC && ev->kind < MT_EV_KIND_COUNT, "records have a kind");
    bool before = (flags & MT_TS_REC_BEFORE) != 0;
    FUZZ_CHECK(!before || c->n[0] == 0, "the state before the trace comes first");
    bool pend = before && ev->kind == MT_EV_FREE_REQUESTED;
    FUZZ_CHECK(!before || pend || ev->kind == MT_EV_ALLOC || ev->kind == MT_EV_SEGMENT_ALLOC ||
                   ev->kind == MT_EV_SEGMENT_MAP,
               "the state before the trace is segments and blocks");
    FUZZ_CHECK(!pend || ((c->last_flags & MT_TS_REC_BEFORE) && c->last.kind == MT_EV_ALLOC &&
                         c->last.addr == ev->addr && c->last.size == ev->size),
               "a free asked before the trace follows its block's record");
    (void)stack;
    c->n[before]++;
    c->npend += pend;
    c->last = *ev;
    c->last_flags = flags;
    return 0;
}

static mt_ts_t *reread(const mt_ts_t *ts, int era)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    FUZZ_CHECK(f != NULL, "memstream");
    FUZZ_CHECK(mt__ts_write(ts, f, era) == 0, "a loaded snapshot can be written");
    fclose(f);
    char err[768];
    mt_pk_doc_t *d = NULL;
    int rc = mt__pk_parse(&d, buf, len, NULL, err, sizeof err);
    free(buf);
    FUZZ_CHECK(rc == 0, "our own output parses");
    mt_ts_t *back = NULL;
    FUZZ_CHECK(mt__ts_from_pickle(&back, d, "w", err, sizeof err) == 0, "and loads");
    return back;
}

/* Streaming every list: each batch's items walked while alive, then freed but for what
 * the memo reads back (pickle.h's mt_pk_stream_t). */
static int stream_all(void *ud, const mt_pk_value_t *const *stack, size_t sp, size_t pos,
                      const size_t *marks, size_t nmarks)
{
    (void)ud;
    (void)stack;
    (void)sp;
    (void)pos;
    (void)marks;
    (void)nmarks;
    return 1;
}

static int stream_walk(void *ud, const mt_pk_value_t *list, const mt_pk_value_t *const *items,
                       size_t n)
{
    FUZZ_CHECK(list->type == MT_PK_LIST && list->streamed == 1 && list->n == 0,
               "a streamed list stays empty");
    for (size_t i = 0; i < n; i++)
        walk(items[i], mt__pk_cfg_default().max_depth + 1);
    *(size_t *)ud += n;
    return 0;
}

static int parse_streamed(const uint8_t *data, size_t size, const mt_pk_cfg_t *cfg)
{
    size_t items = 0;
    mt_pk_stream_t st = {.match = stream_all, .items = stream_walk, .ud = &items};
    char err[768] = "";
    mt_pk_doc_t *doc = NULL;
    int rc = mt__pk_parse_stream(&doc, data, size, cfg, &st, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == MT_EPROTO || rc == MT_ENOMEM || rc == MT_EAGAIN,
               "streamed refusals are EPROTO, ENOMEM or EAGAIN (read it whole)");
    FUZZ_CHECK((rc == 0) == (doc != NULL), "a document exactly on success");
    if (doc != NULL)
        walk(mt__pk_root(doc), cfg->max_depth + 1);
    mt__pk_doc_destroy(&doc);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mt_pk_cfg_t cfg = mt__pk_cfg_default();
    cfg.max_memory = (size_t)256 << 20;
    char err[768] = "";
    mt_pk_doc_t *doc = NULL;
    int src = parse_streamed(data, size, &cfg);
    int rc = mt__pk_parse(&doc, data, size, &cfg, err, sizeof err);
    FUZZ_CHECK(rc != 0 || src != MT_EPROTO, "what reads whole does not fail streamed as malformed");
    if (rc != 0) {
        FUZZ_CHECK(rc == MT_EPROTO || rc == MT_ENOMEM, "refusals are EPROTO or ENOMEM");
        FUZZ_CHECK(doc == NULL, "no document on failure");
        FUZZ_CHECK(strncmp(err, "offset ", 7) == 0, "the message names the offset");
        FUZZ_CHECK(strlen(err) > 16, "the message says what was wrong");
        return 0;
    }
    walk(mt__pk_root(doc), cfg.max_depth + 1);
    mt_ts_t *ts = NULL;
    rc = mt__ts_from_pickle(&ts, doc, "fuzz.pickle", err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(ts == NULL, "no model on failure");
        FUZZ_CHECK(rc == MT_ENOMEM || strncmp(err, "fuzz.pickle: ", 13) == 0,
                   "the message names the file");
        return 0;
    }
    FUZZ_CHECK(mt__ts_check(ts, err, sizeof err) == 0, "a loaded model keeps its invariants");
    for (unsigned d = 0; d < ts->ndevices; d++) {
        mt_ts_figures_t f;
        mt_trace_t *t = NULL;
        FUZZ_CHECK(mt__ts_figures(ts, d, &f) == 0, "figures");
        FUZZ_CHECK(f.peak_reserved >= f.reserved_start && f.peak_reserved >= f.end_reserved,
                   "the peak bounds the start and the end");
        FUZZ_CHECK(mt__ts_to_trace(ts, d, &t, err, sizeof err) == 0, "trace");
        FUZZ_CHECK(t->nops == t->nallocs + t->nfrees && t->nfrees + t->leaked == t->nallocs,
                   "every allocate is freed once or leaked");
        FUZZ_CHECK(t->peak_live_bytes <= f.peak_allocated || f.peak_allocated == 0 ||
                       t->peak_live_bytes == f.peak_allocated,
                   "the trace's peak is PyTorch's");
        mt__trace_free(&t);
    }
    recs_t recs = {0};
    FUZZ_CHECK(mt__ts_records(ts, count_rec, &recs) == 0, "records");
    FUZZ_CHECK(ts->nevents == 0 || recs.n[0] <= ts->nevents + ts->nannotations,
               "one record per event or annotation at most");
    /* before the trace: a segment or block of the end, or one the trace frees (and the
     * free request of each such block asked free before the trace) */
    FUZZ_CHECK(recs.n[1] - recs.npend <= ts->nsegments + ts->nblocks + ts->nevents,
               "the state before the trace is the file's");
    for (unsigned d = 0; d < ts->ndevices; d++) {
        mt_ts_site_t sites[4];
        size_t ns;
        uint64_t peak, sum = 0;
        FUZZ_CHECK(mt__ts_sites_at_peak(ts, d, sites, 4, &ns, &peak) == 0, "sites");
        for (size_t i = 0; i < ns; i++)
            sum += sites[i].bytes;
        FUZZ_CHECK(sum <= peak, "the call sites hold no more than the peak");
    }
    for (int era = 1; era <= 2; era++) {
        mt_ts_t *back = reread(ts, era);
        FUZZ_CHECK(back->nsegments == ts->nsegments && back->nblocks == ts->nblocks,
                   "segments and blocks survive a write");
        FUZZ_CHECK(era == 1 || back->nevents == ts->nevents, "events survive a write");
        mt__ts_destroy(&back);
    }
    mt__ts_destroy(&ts);
    return 0;
}
