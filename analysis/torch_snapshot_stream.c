/* device_traces read as the pickle streams them (mt_pk_stream_t, torch_snapshot.h): entries
 * become events as the file is parsed and their values are freed batch by batch, their
 * strings and stacks interned by content. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "analysis/torch_snapshot_read.h"
#include "memtrace/common.h"

enum { STR_CACHE = 4096 };

typedef struct strm_s {
    rd_t *r;
    size_t lists;   /* lists streamed */
    size_t cur_dev; /* the device of the last entries, and how many it had */
    size_t cur_index;
    /* interned strings: the model's copy by content (open addressing, hash per slot) */
    const char **strs;
    uint64_t *str_hash;
    size_t str_cap, nstr;
    /* within one items call, the pickle's str values (alive until it returns) -> interned */
    const mt_pk_value_t *cache_v[STR_CACHE];
    const char *cache_s[STR_CACHE];
    uint32_t cache_gen[STR_CACHE], gen;
    /* interned stacks by their frames' (interned name, file, line) */
    uint32_t *stk;
    uint64_t *stk_hash;
    size_t stk_cap, nstk;
} strm_t;

static uint64_t hash_bytes(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int grow_table(const char ***keys, uint32_t **ids, uint64_t **hashes, size_t *cap)
{
    size_t ncap = *cap ? *cap * 2 : 4096;
    uint64_t *nh = calloc(ncap, sizeof *nh);
    const char **nk = keys ? calloc(ncap, sizeof *nk) : NULL;
    uint32_t *ni = ids ? calloc(ncap, sizeof *ni) : NULL;
    if (nh == NULL || (keys && nk == NULL) || (ids && ni == NULL)) {
        free(nh);
        free(nk);
        free(ni);
        return MT_ENOMEM;
    }
    for (size_t i = 0; i < *cap; i++) {
        bool used = keys ? (*keys)[i] != NULL : (*ids)[i] != 0;
        if (!used)
            continue;
        size_t h = (*hashes)[i] & (ncap - 1);
        while (keys ? nk[h] != NULL : ni[h] != 0)
            h = (h + 1) & (ncap - 1);
        nh[h] = (*hashes)[i];
        if (keys)
            nk[h] = (*keys)[i];
        else
            ni[h] = (*ids)[i];
    }
    free(*hashes);
    *hashes = nh;
    if (keys) {
        free(*keys);
        *keys = nk;
    } else {
        free(*ids);
        *ids = ni;
    }
    *cap = ncap;
    return 0;
}

/* The model's copy of the str value v, one per distinct content. */
static const char *intern(strm_t *st, const mt_pk_value_t *v)
{
    size_t c = ((uintptr_t)v >> 4) * 0x9e3779b97f4a7c15ull >> 52 & (STR_CACHE - 1);
    if (st->cache_gen[c] == st->gen && st->cache_v[c] == v)
        return st->cache_s[c];
    uint64_t h = hash_bytes(v->u.s, v->n, 0xcbf29ce484222325ull);
    if ((st->nstr + 1) * 2 > st->str_cap &&
        grow_table(&st->strs, NULL, &st->str_hash, &st->str_cap) < 0)
        return NULL;
    size_t i = h & (st->str_cap - 1);
    const char *s = NULL;
    for (; st->strs[i] != NULL; i = (i + 1) & (st->str_cap - 1))
        if (st->str_hash[i] == h && strlen(st->strs[i]) == v->n &&
            memcmp(st->strs[i], v->u.s, v->n) == 0) {
            s = st->strs[i];
            break;
        }
    if (s == NULL) {
        if ((s = mt__ts_strdup(st->r->ts, v->u.s)) == NULL)
            return NULL;
        st->strs[i] = s;
        st->str_hash[i] = h;
        st->nstr++;
    }
    st->cache_v[c] = v;
    st->cache_s[c] = s;
    st->cache_gen[c] = st->gen;
    return s;
}

static int intern_str(rd_t *r, const mt_pk_value_t *f, const char *key, const char *where,
                      const char **out)
{
    int rc;
    if (mt__ts_get_str(r, f, key, true, where, &rc) == NULL)
        return rc;
    if ((*out = intern(r->strm, mt__pk_get(f, key))) == NULL)
        return MT_ENOMEM;
    return 0;
}

/* The stack of e's frames, interned by content: the same frames in another entry (every
 * entry has lists and dicts of its own) give the same stack. */
int mt__ts_stream_frames(rd_t *r, const mt_pk_value_t *e, const char *where, uint32_t *id)
{
    strm_t *st = r->strm;
    mt_ts_t *ts = r->ts;
    int rc;
    const mt_pk_value_t *fl = mt__ts_get_seq(r, e, "frames", false, where, &rc);
    *id = 0;
    if (rc < 0 || fl == NULL || fl->n == 0)
        return rc;
    if ((rc = mt__ts_visit(r, fl->n, where)) < 0)
        return rc;
    mt_ts_frame_t stackbuf[64];
    mt_ts_frame_t *frames = fl->n <= 64 ? stackbuf : malloc(fl->n * sizeof *frames);
    if (frames == NULL)
        return MT_ENOMEM;
    char w[320];
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < fl->n && rc == 0; i++) {
        const mt_pk_value_t *f = fl->u.items[i];
        /* The usual frame without formatting where it is (the checks below name it). */
        const mt_pk_value_t *nv = mt__pk_get(f, "name"), *fv = mt__pk_get(f, "filename"),
                            *lv = mt__pk_get(f, "line");
        if (f->type == MT_PK_DICT && nv != NULL && nv->type == MT_PK_STR && fv != NULL &&
            fv->type == MT_PK_STR && lv != NULL &&
            (lv->type == MT_PK_INT || lv->type == MT_PK_BOOL)) {
            if ((rc = mt__ts_visit(r, f->n + 1, where)) < 0)
                break;
            if ((frames[i].name = intern(st, nv)) == NULL ||
                (frames[i].filename = intern(st, fv)) == NULL) {
                rc = MT_ENOMEM;
                break;
            }
            frames[i].line = lv->u.i;
            h = hash_bytes(&frames[i], sizeof frames[i], h);
            continue;
        }
        snprintf(w, sizeof w, "%s.frames[%zu]", where ? where : "?", i);
        if ((rc = mt__ts_want_dict(r, f, w)) < 0 ||
            (rc = intern_str(r, f, "name", w, &frames[i].name)) < 0 ||
            (rc = intern_str(r, f, "filename", w, &frames[i].filename)) < 0 ||
            (rc = mt__ts_get_int(r, f, "line", true, &frames[i].line, w)) < 0)
            break;
        h = hash_bytes(&frames[i], sizeof frames[i], h);
    }
    if (rc == 0 && (st->nstk + 1) * 2 > st->stk_cap &&
        grow_table(NULL, &st->stk, &st->stk_hash, &st->stk_cap) < 0)
        rc = MT_ENOMEM;
    if (rc == 0) {
        size_t i = h & (st->stk_cap - 1);
        for (; st->stk[i] != 0; i = (i + 1) & (st->stk_cap - 1)) {
            const mt_ts_stack_t *s = &ts->stacks[st->stk[i]];
            if (st->stk_hash[i] == h && s->n == fl->n &&
                memcmp(&ts->frames[s->first], frames, fl->n * sizeof *frames) == 0) {
                *id = st->stk[i];
                break;
            }
        }
        if (*id == 0 && (rc = mt__ts_push_stack(ts, frames, fl->n, id)) == 0) {
            st->stk[i] = *id;
            st->stk_hash[i] = h;
            st->nstk++;
        }
    }
    if (frames != stackbuf)
        free(frames);
    return rc;
}

/* A list about to receive trace entries: device_traces[d] of the top-level dict, as
 * pickle.dump writes it (root dict, MARK, key, value, ..., 'device_traces', the list of
 * devices, [MARK,] the device lists). Gives d + 1, or 0 for any other list. */
static int stream_match(void *ud, const mt_pk_value_t *const *stack, size_t sp, size_t pos,
                        const size_t *marks, size_t nmarks)
{
    (void)ud;
    (void)sp;
    size_t outer, first;
    if (nmarks < 1 || marks[0] != 1 || stack[0]->type != MT_PK_DICT || nmarks > 2)
        return 0;
    if (nmarks == 2) {
        if (marks[1] < 3 || pos < marks[1])
            return 0;
        outer = marks[1] - 1;
        first = marks[1];
    } else {
        if (pos < 3)
            return 0;
        outer = pos - 1;
        first = pos;
    }
    const mt_pk_value_t *key = stack[outer - 1], *o = stack[outer];
    if ((outer - 1) % 2 != 1 || key->type != MT_PK_STR || strcmp(key->u.s, "device_traces") != 0 ||
        o->type != MT_PK_LIST || o->sealed)
        return 0;
    for (size_t i = first; i <= pos; i++)
        if (stack[i]->type != MT_PK_LIST)
            return 0;
    size_t d = o->n + (pos - first);
    return d > 255 ? 0 : (int)d + 1;
}

static int stream_items(void *ud, const mt_pk_value_t *list, const mt_pk_value_t *const *items,
                        size_t n)
{
    strm_t *st = ud;
    size_t d = list->streamed - 1;
    if (st->lists == 0 || d != st->cur_dev) {
        /* Devices one after the other, each list whole before the next: pickle.dump's
         * order; anything else is read without streaming. */
        if (st->lists > 0 && d < st->cur_dev)
            return MT_EAGAIN;
        st->lists++;
        st->cur_dev = d;
        st->cur_index = 0;
    }
    st->gen++;
    char where[64];
    for (size_t i = 0; i < n; i++) {
        /* where is formatted only when read_entry fails: it then reads the entry again to
         * say what is wrong and where (its first attempt changed nothing but counters). */
        int rc = mt__ts_read_entry(st->r, items[i], d, NULL, true);
        if (rc == MT_EPROTO) {
            snprintf(where, sizeof where, "device_traces[%zu][%zu]", d, st->cur_index);
            rc = mt__ts_read_entry(st->r, items[i], d, where, true);
        }
        st->cur_index++;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* After streaming: events grouped by device (streamed ones came first), dev_first. */
int mt__ts_sort_streamed(rd_t *r, size_t ndev, size_t streamed)
{
    mt_ts_t *ts = r->ts;
    if (streamed != r->strm->lists)
        return MT_EAGAIN; /* a streamed list that is not in the final device_traces */
    if (mt__ts_reserve((void **)&ts->dev_first, &ts->mem->cap_dev, ndev + 1,
                       sizeof *ts->dev_first) < 0)
        return MT_ENOMEM;
    memset(ts->dev_first, 0, (ndev + 1) * sizeof *ts->dev_first);
    bool sorted = true;
    for (size_t i = 0; i < ts->nevents; i++) {
        if (ts->events[i].device >= ndev)
            return MT_EAGAIN;
        if (i > 0 && ts->events[i].device < ts->events[i - 1].device)
            sorted = false;
        ts->dev_first[ts->events[i].device + 1]++;
    }
    for (size_t d = 0; d < ndev; d++)
        ts->dev_first[d + 1] += ts->dev_first[d];
    if (!sorted) {
        mt_ts_event_t *ev = malloc((ts->nevents ? ts->nevents : 1) * sizeof *ev);
        uint32_t *at = malloc((ndev + 1) * sizeof *at);
        if (ev == NULL || at == NULL) {
            free(ev);
            free(at);
            return MT_ENOMEM;
        }
        memcpy(at, ts->dev_first, (ndev + 1) * sizeof *at);
        for (size_t i = 0; i < ts->nevents; i++)
            ev[at[ts->events[i].device]++] = ts->events[i];
        memcpy(ts->events, ev, ts->nevents * sizeof *ev);
        free(ev);
        free(at);
    }
    ts->ndevices = (unsigned)ndev;
    return 0;
}

/* Reads with device_traces streamed: MT_EAGAIN when the file is not laid out as
 * pickle.dump writes a snapshot (the caller reads it whole instead). */
/* The budget from the pickle's own bytes: a compressed file's size says too little. */
static void stream_begin(void *ud, size_t len)
{
    strm_t *st = ud;
    st->r->budget = (uint64_t)VISITS_PER_BYTE * (uint64_t)len + VISITS_FLOOR;
}

int mt__ts_read_streamed(mt_ts_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct stat sb = {0};
    if (strcmp(path, "-") != 0 && stat(path, &sb) != 0)
        return MT_EAGAIN; /* the whole read says why */
    mt_ts_t *ts;
    int rc = mt__ts_create(&ts);
    if (rc < 0) {
        snprintf(err, errlen, "%s: out of memory", path);
        return rc;
    }
    strm_t *st = calloc(1, sizeof *st);
    rd_t r = {.ts = ts,
              .name = path,
              .err = err,
              .errlen = errlen,
              .budget = (uint64_t)VISITS_PER_BYTE * (uint64_t)sb.st_size + VISITS_FLOOR,
              .strm = st};
    if (st == NULL) {
        rc = MT_ENOMEM;
        goto done;
    }
    st->r = &r;
    err[0] = '\0';
    mt_pk_stream_t stream = {
        .match = stream_match, .items = stream_items, .begin = stream_begin, .ud = st};
    char perr[512];
    mt_pk_doc_t *doc = NULL;
    rc = mt__pk_parse_file_stream(&doc, path, NULL, &stream, perr, sizeof perr);
    if (rc < 0) {
        if (err[0] == '\0' || rc == MT_EAGAIN) /* else the entry's own message */
            snprintf(err, errlen, "%s", perr);
        goto done;
    }
    ts->mem->doc = doc;
    st->gen++; /* the cache's values of the last batch are freed */
    rc = mt__ts_read_root(&r, mt__pk_root(doc));
    if (rc == 0 && (rc = mt__ts_check(ts, err, errlen)) < 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", err);
        snprintf(err, errlen, "%s: %s", path, msg);
    }
done:
    mt__amap_fini(&r.seen);
    if (st != NULL) {
        free(st->strs);
        free(st->str_hash);
        free(st->stk);
        free(st->stk_hash);
        free(st);
    }
    if (rc < 0) {
        if (rc == MT_ENOMEM)
            snprintf(err, errlen, "%s: out of memory", path);
        mt__ts_destroy(&ts);
        return rc;
    }
    *out = ts;
    return 0;
}
