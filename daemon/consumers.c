/* memtraced: consumers (Unix JSON Lines subscribers, Unix binary-block subscribers and SSE
 * clients), their filters, and the bounded queues that keep a slow consumer from slowing
 * anyone else.
 *
 * Each drain batch becomes at most one chunk per consumer, holding the lines that pass
 * its filters. Chunks wait in the consumer's queue until libuv's write queue for that
 * stream is below write_high_water; the queue itself is bounded by consumer_queue_bytes,
 * and when it would exceed that the OLDEST chunks are dropped (newer events matter more
 * to a live view). The number of events lost is then sent, before the next chunk, as a
 * gap line {"v":1,"type":"gap","lost":N,"source":"daemon"}. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/internal.h"
#include "memtrace/prof.h"
#include "profiler/binlog.h"

/* ---- filters ---- */

static int kind_from_name(const char *s)
{
    for (int k = 1; k < MT_EV_KIND_COUNT; k++)
        if (strcmp(s, mt_event_kind_name(k)) == 0)
            return k;
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= 1 && v < 32 ? (int)v : -1;
}

static int tag_from_name(const char *s)
{
    for (int t = 0; t < MT_TAG_USER_FIRST; t++)
        if (strcmp(s, mt_tag_builtin_name(t)) == 0)
            return t;
    if (strncmp(s, "tag", 3) == 0)
        s += 3;
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= 0 && v < MT_TAG_MAX ? (int)v : -1;
}

static int add_pid(mt_d_sub_t *s, long v, char *err, size_t errlen)
{
    if (v <= 0 || v > INT32_MAX) {
        snprintf(err, errlen, "bad pid filter");
        return MT_EINVAL;
    }
    if (s->npids == MT_D_MAX_PIDS) {
        snprintf(err, errlen, "at most %d pids per subscription", MT_D_MAX_PIDS);
        return MT_EINVAL;
    }
    s->pids[s->npids++] = (int)v;
    return 0;
}

/* A tag filter item: a built-in name or "tag<n>" or an id sets its bit; anything else is
 * a user label, matched against each process's announced labels (ids differ between
 * processes). */
static int add_tag(mt_d_sub_t *s, const char *name, char *err, size_t errlen)
{
    int v = tag_from_name(name);
    if (v >= 0) {
        s->tags |= 1u << v;
        return 0;
    }
    if (!name[0] || mt_event_label_fit(name) != strlen(name)) {
        snprintf(err, errlen, "unknown tag '%.40s'", name);
        return MT_EINVAL;
    }
    if (s->ntag_labels == MT_D_MAX_TAG_LABELS) {
        snprintf(err, errlen, "at most %d tag labels per subscription", MT_D_MAX_TAG_LABELS);
        return MT_EINVAL;
    }
    snprintf(s->tag_labels[s->ntag_labels++], sizeof s->tag_labels[0], "%s", name);
    return 0;
}

static int add_named(uint32_t *mask, int (*lookup)(const char *), const char *name,
                     const char *what, char *err, size_t errlen)
{
    int v = lookup(name);
    if (v < 0) {
        snprintf(err, errlen, "unknown %s '%.40s'", what, name);
        return MT_EINVAL;
    }
    *mask |= 1u << v;
    return 0;
}

/* A filter value may be one item or an array of items; items are numbers or names. */
static int parse_json_list(mt_d_sub_t *s, json_t *v, int which, char *err, size_t errlen)
{
    if (!v || json_is_null(v))
        return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *it = json_is_array(v) ? json_array_get(v, i) : v;
        char num[32];
        const char *name = json_string_value(it);
        if (json_is_integer(it)) {
            snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(it));
            name = num;
        }
        if (!name) {
            snprintf(err, errlen, "filters take numbers or names");
            return MT_EINVAL;
        }
        int rc = which == 0   ? add_pid(s, strtol(name, NULL, 10), err, errlen)
                 : which == 1 ? add_named(&s->kinds, kind_from_name, name, "kind", err, errlen)
                              : add_tag(s, name, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int mt__d_sub_parse_json(mt_d_sub_t *s, json_t *msg, char *err, size_t errlen)
{
    json_t *f = json_object_get(msg, "format");
    const char *form = json_string_value(f);
    if (f != NULL &&
        (form == NULL || (strcmp(form, "ndjson") != 0 && strcmp(form, "binary") != 0))) {
        snprintf(err, errlen, "format: \"ndjson\" (the default) or \"binary\"");
        return MT_EINVAL;
    }
    s->binary = form != NULL && strcmp(form, "binary") == 0;
    int rc = parse_json_list(s, json_object_get(msg, "pid"), 0, err, errlen);
    if (!rc)
        rc = parse_json_list(s, json_object_get(msg, "kinds"), 1, err, errlen);
    if (!rc)
        rc = parse_json_list(s, json_object_get(msg, "tags"), 2, err, errlen);
    return rc;
}

/* "pid=1,2&kind=alloc&tag=weights" (also pids=, kinds=, tags=). */
int mt__d_sub_parse_query(mt_d_sub_t *s, const char *query, char *err, size_t errlen)
{
    char buf[512];
    if (strlen(query) >= sizeof buf) {
        snprintf(err, errlen, "query too long");
        return MT_EINVAL;
    }
    snprintf(buf, sizeof buf, "%s", query);
    char *save1 = NULL;
    for (char *kv = strtok_r(buf, "&", &save1); kv; kv = strtok_r(NULL, "&", &save1)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(err, errlen, "bad query parameter '%.40s'", kv);
            return MT_EINVAL;
        }
        *eq = '\0';
        int which = strcmp(kv, "pid") == 0 || strcmp(kv, "pids") == 0     ? 0
                    : strcmp(kv, "kind") == 0 || strcmp(kv, "kinds") == 0 ? 1
                    : strcmp(kv, "tag") == 0 || strcmp(kv, "tags") == 0   ? 2
                                                                          : -1;
        if (which < 0) {
            snprintf(err, errlen, "unknown query parameter '%.40s'", kv);
            return MT_EINVAL;
        }
        char *save2 = NULL;
        for (char *v = strtok_r(eq + 1, ",", &save2); v; v = strtok_r(NULL, ",", &save2)) {
            int rc;
            if (which == 0) {
                char *end;
                long pid = strtol(v, &end, 10);
                rc = *end ? MT_EINVAL : add_pid(s, pid, err, errlen);
                if (*end)
                    snprintf(err, errlen, "bad pid '%.40s'", v);
            } else if (which == 1) {
                rc = add_named(&s->kinds, kind_from_name, v, "kind", err, errlen);
            } else {
                rc = add_tag(s, v, err, errlen);
            }
            if (rc)
                return rc;
        }
    }
    return 0;
}

bool mt__d_sub_all(const mt_d_sub_t *s)
{
    return s->npids == 0 && s->kinds == 0 && s->tags == 0 && s->ntag_labels == 0;
}

bool mt__d_sub_matches(const mt_d_sub_t *s, const mt_d_batch_rec_t *r)
{
    if (s->npids) {
        bool hit = false;
        for (unsigned i = 0; i < s->npids && !hit; i++)
            hit = s->pids[i] == r->pid;
        if (!hit)
            return false;
    }
    if (r->ev.kind == MT_EV_GAP || r->ev.kind == 0)
        return true; /* whoever sees a process's events must see its gaps and its tables */
    if (s->kinds && !(r->ev.kind < 32 && (s->kinds >> r->ev.kind) & 1))
        return false;
    if (!s->tags && !s->ntag_labels)
        return true;
    if (r->ev.tag < 32 && (s->tags >> r->ev.tag) & 1)
        return true;
    const char *label = r->ev.tag < MT_TAG_MAX && r->proc ? r->proc->labels[r->ev.tag] : "";
    for (unsigned i = 0; i < s->ntag_labels && label[0]; i++)
        if (strcmp(label, s->tag_labels[i]) == 0)
            return true;
    return false;
}

/* ---- queue ---- */

static void flush(mt_d_conn_t *c);

static void on_chunk_written(uv_write_t *req, int status)
{
    mt_d_chunk_t *ch = (mt_d_chunk_t *)((char *)req - offsetof(mt_d_chunk_t, req));
    mt_d_conn_t *c = ch->conn;
    free(ch);
    if (status < 0)
        mt__d_conn_close(c);
    else if (!c->closing)
        flush(c);
}

/* Lines as binary blocks of 'J' records (a binary consumer's tables and gaps), pid's,
 * appended to out, a block ended after MT_D_BIN_BLOCK_BYTES of payload. 0 or MT_ENOMEM. */
static int lines_block(const char *text, size_t len, int pid, mt_d_buf_t *out)
{
    size_t start = 0;
    uint32_t nrec = 0;
    for (const char *l = text, *end = text + len; l < end;) {
        const char *nl = memchr(l, '\n', (size_t)(end - l));
        size_t n = nl ? (size_t)(nl - l) : (size_t)(end - l);
        if (n > 0) {
            if (nrec > 0 && out->len - start - MT__BLOG_HDR > MT_D_BIN_BLOCK_BYTES) {
                mt__blog_header(out->p + start, (uint32_t)(out->len - start - MT__BLOG_HDR), pid,
                                nrec);
                nrec = 0;
            }
            if (mt__d_buf_reserve(out, MT__BLOG_HDR + MT__BLOG_TEXT_EXTRA + n) != 0)
                return MT_ENOMEM;
            if (nrec == 0) {
                start = out->len;
                out->len += MT__BLOG_HDR;
            }
            out->len += mt__blog_put_line(out->p + out->len, l, (uint32_t)n);
            nrec++;
        }
        l += n + 1;
    }
    if (nrec > 0)
        mt__blog_header(out->p + start, (uint32_t)(out->len - start - MT__BLOG_HDR), pid, nrec);
    return 0;
}

static void send_gap(mt_d_conn_t *c)
{
    char line[160];
    int n = snprintf(line, sizeof line,
                     "%s{\"v\":1,\"type\":\"gap\",\"lost\":%" PRIu64 ",\"source\":\"daemon\"}\n%s",
                     c->sub.sse ? "event: gap\ndata: " : "", c->sub.lost, c->sub.sse ? "\n" : "");
    c->sub.lost = 0;
    if (c->sub.binary) {
        mt_d_buf_t b = {0};
        if (lines_block(line, (size_t)n, 0, &b) == 0)
            mt__d_conn_write(c, b.p, b.len, false);
        mt__d_buf_free(&b);
        return;
    }
    mt__d_conn_write(c, line, (size_t)n, false);
}

static void flush(mt_d_conn_t *c)
{
    mt_d_sub_t *s = &c->sub;
    while (!c->closing && (s->head || s->lost) &&
           uv_stream_get_write_queue_size(&c->u.stream) < c->d->cfg.write_high_water) {
        if (s->lost) {
            send_gap(c);
            continue;
        }
        mt_d_chunk_t *ch = s->head;
        s->head = ch->next;
        if (!s->head)
            s->tail = NULL;
        s->queued_bytes -= ch->len;
        s->sent_events += ch->nevents;
        uv_buf_t buf = uv_buf_init(ch->data, (unsigned)ch->len);
        if (uv_write(&ch->req, &c->u.stream, &buf, 1, on_chunk_written) != 0) {
            free(ch);
            mt__d_conn_close(c);
        }
    }
}

static void enqueue(mt_d_conn_t *c, mt_d_chunk_t *ch)
{
    mt_d_sub_t *s = &c->sub;
    ch->next = NULL;
    if (s->tail)
        s->tail->next = ch;
    else
        s->head = ch;
    s->tail = ch;
    s->queued_bytes += ch->len;
    /* What libuv can take now is no longer ours to drop: write first, then trim. */
    flush(c);
    while (s->queued_bytes > s->queue_limit && s->head) {
        mt_d_chunk_t *old = s->head;
        s->head = old->next;
        if (!s->head)
            s->tail = NULL;
        s->queued_bytes -= old->len;
        s->lost += old->nevents;
        s->lost_total += old->nevents;
        c->d->ctr.consumer_drops += old->nevents;
        free(old);
    }
}

#define MIN_QUEUE_BYTES (64u << 10)

int mt__d_consumer_admit(mt_d_conn_t *c)
{
    mt_d_t *d = c->d;
    size_t hw = d->cfg.write_high_water;
    size_t avail = d->cfg.consumer_budget_bytes > d->consumer_reserved + hw
                       ? d->cfg.consumer_budget_bytes - d->consumer_reserved - hw
                       : 0;
    size_t limit = avail < d->cfg.consumer_queue_bytes ? avail : d->cfg.consumer_queue_bytes;
    size_t floor = d->cfg.consumer_queue_bytes < MIN_QUEUE_BYTES ? d->cfg.consumer_queue_bytes
                                                                 : MIN_QUEUE_BYTES;
    if (d->nconsumers >= d->cfg.max_consumers || limit < floor) {
        mt__d_log(d, MT_LOG_WARN, "refused a consumer: %u connected, %zu of %zu budget bytes used",
                  d->nconsumers, d->consumer_reserved, d->cfg.consumer_budget_bytes);
        return MT_EBUSY;
    }
    c->sub.queue_limit = limit;
    d->consumer_reserved += limit + hw;
    d->nconsumers++;
    return 0;
}

void mt__d_consumer_release(mt_d_conn_t *c)
{
    if (!c->sub.queue_limit)
        return;
    c->d->consumer_reserved -= c->sub.queue_limit + c->d->cfg.write_high_water;
    c->d->nconsumers--;
    c->sub.queue_limit = 0;
}

/* A new consumer first gets the stack tables and module maps of the processes it follows
 * (daemon/stacks.c): the stack ids of the events it gets from now on resolve. */
static void send_tables(mt_d_conn_t *c)
{
    for (mt_d_proc_t *p = c->d->procs; p; p = p->next) {
        bool hit = c->sub.npids == 0;
        for (unsigned i = 0; i < c->sub.npids && !hit; i++)
            hit = c->sub.pids[i] == p->pid;
        if (!hit)
            continue;
        mt_d_buf_t b = {0}, blk = {0};
        if (mt__d_stacks_tables(p, c->sub.sse, &b) == 0 && b.len > 0 &&
            (!c->sub.binary || lines_block(b.p, b.len, p->pid, &blk) == 0)) {
            const mt_d_buf_t *out = c->sub.binary ? &blk : &b;
            mt_d_chunk_t *ch = malloc(sizeof *ch + out->len);
            if (ch) {
                ch->conn = c;
                ch->nevents = 0;
                memcpy(ch->data, out->p, out->len);
                ch->len = out->len;
                enqueue(c, ch);
            }
        }
        mt__d_buf_free(&blk);
        mt__d_buf_free(&b);
    }
}

void mt__d_consumer_start(mt_d_conn_t *c)
{
    send_tables(c);
    c->last_active_ms = uv_now(c->d->loop);
    /* A larger kernel buffer means fewer, larger writes and wake-ups at high rates; the
     * kernel caps it (net.core.wmem_max), and failing to raise it is harmless. */
    int size = 1 << 20;
    uv_send_buffer_size(&c->u.handle, &size);
    flush(c);
}

void mt__d_consumers_fanout(mt_d_t *d, const mt_d_batch_t *b)
{
    for (mt_d_conn_t *c = d->conns; c; c = c->next) {
        if (c->closing || (c->kind != MT_D_CONN_CONSUMER && c->kind != MT_D_CONN_SSE))
            continue;
        bool sse = c->sub.sse;
        size_t need = 0;
        uint32_t n = 0;
        for (size_t i = 0; i < b->n; i++) {
            if (!b->rec[i].len || !mt__d_sub_matches(&c->sub, &b->rec[i]))
                continue;
            need += b->rec[i].len + (sse ? 40 : 0);
            n++;
        }
        if (n == 0)
            continue;
        /* (the loop's fallback, after an allocation failed: lines only; a binary consumer
         * is told of the batch as lost) */
        mt_d_chunk_t *ch = c->sub.binary ? NULL : malloc(sizeof *ch + need);
        if (!ch) {
            c->sub.lost += n; /* as if dropped: the consumer learns of it */
            c->sub.lost_total += n;
            d->ctr.consumer_drops += n;
            continue;
        }
        ch->conn = c;
        ch->nevents = n;
        char *w = ch->data;
        for (size_t i = 0; i < b->n; i++) {
            const mt_d_batch_rec_t *r = &b->rec[i];
            if (!r->len || !mt__d_sub_matches(&c->sub, r))
                continue;
            if (sse)
                w += sprintf(w, "id: %" PRIu64 "\ndata: ", r->ev.seq);
            memcpy(w, b->text.p + r->off, r->len);
            w += r->len;
            if (sse)
                *w++ = '\n'; /* the line's own '\n' plus this blank line end the event */
        }
        ch->len = (size_t)(w - ch->data);
        enqueue(c, ch);
    }
}

static bool is_consumer(const mt_d_conn_t *c)
{
    return !c->closing && (c->kind == MT_D_CONN_CONSUMER || c->kind == MT_D_CONN_SSE);
}

int mt__d_consumers_prepare(mt_d_t *d, mt_d_batch_t *b)
{
    size_t n = 0;
    for (mt_d_conn_t *c = d->conns; c; c = c->next)
        n += is_consumer(c);
    if (n > b->outs_cap) {
        mt_d_batch_out_t *o = realloc(b->outs, n * sizeof *o);
        if (!o)
            return MT_ENOMEM;
        b->outs = o;
        b->outs_cap = n;
    }
    b->nouts = 0;
    for (mt_d_conn_t *c = d->conns; c; c = c->next)
        if (is_consumer(c))
            b->outs[b->nouts++] = (mt_d_batch_out_t){.conn = c};
    return 0;
}

/* o's chunk of binary blocks: b->binbuf's copy when its consumer takes every record, else
 * its records encoded (before b->text is written: table lines are in b->pre). */
static void build_binary(mt_d_batch_t *b, mt_d_batch_out_t *o)
{
    const mt_d_sub_t *s = &o->conn->sub;
    mt_d_buf_t own = {0};
    const mt_d_buf_t *blk = &b->binbuf;
    uint32_t n = (uint32_t)b->n;
    if (!mt__d_sub_all(s)) {
        if (mt__d_encode_bin(b, &own, s, &n) != 0) { /* told of its records as lost */
            own.len = n = 0;
            for (size_t i = 0; i < b->n; i++)
                n += mt__d_sub_matches(s, &b->rec[i]);
        }
        blk = &own;
    }
    o->n = n;
    o->ch = n > 0 && blk->len > 0 ? malloc(sizeof *o->ch + blk->len) : NULL;
    if (o->ch != NULL) {
        o->ch->conn = o->conn;
        o->ch->nevents = n;
        memcpy(o->ch->data, blk->p, blk->len);
        o->ch->len = blk->len;
    }
    mt__d_buf_free(&own);
}

void mt__d_consumers_build_binary(mt_d_batch_t *b)
{
    for (size_t k = 0; k < b->nouts; k++)
        if (b->outs[k].conn->sub.binary)
            build_binary(b, &b->outs[k]);
}

void mt__d_consumers_build(mt_d_batch_t *b)
{
    for (size_t k = 0; k < b->nouts; k++) {
        mt_d_batch_out_t *o = &b->outs[k];
        const mt_d_sub_t *s = &o->conn->sub;
        if (s->binary)
            continue;
        size_t need = 0;
        uint32_t n = 0;
        for (size_t i = 0; i < b->n; i++) {
            if (!b->rec[i].len || !mt__d_sub_matches(s, &b->rec[i]))
                continue;
            need += b->rec[i].len + (s->sse ? 40 : 0);
            n++;
        }
        o->n = n;
        o->ch = n ? malloc(sizeof *o->ch + need) : NULL;
        if (!o->ch)
            continue;
        o->ch->conn = o->conn;
        o->ch->nevents = n;
        char *w = o->ch->data;
        for (size_t i = 0; i < b->n; i++) {
            const mt_d_batch_rec_t *r = &b->rec[i];
            if (!r->len || !mt__d_sub_matches(s, r))
                continue;
            if (s->sse)
                w += sprintf(w, "id: %" PRIu64 "\ndata: ", r->ev.seq);
            memcpy(w, b->text.p + r->off, r->len);
            w += r->len;
            if (s->sse)
                *w++ = '\n';
        }
        o->ch->len = (size_t)(w - o->ch->data);
    }
}

void mt__d_consumers_deliver(mt_d_t *d, mt_d_batch_t *b)
{
    for (size_t k = 0; k < b->nouts; k++) {
        mt_d_batch_out_t *o = &b->outs[k];
        mt_d_conn_t *c = o->conn;
        if (c->closing) {
            free(o->ch);
        } else if (o->ch) {
            enqueue(c, o->ch);
        } else if (o->n) {
            c->sub.lost += o->n; /* as if dropped: the consumer learns of it */
            c->sub.lost_total += o->n;
            d->ctr.consumer_drops += o->n;
        }
    }
    b->nouts = 0;
}

void mt__d_consumers_keepalive(mt_d_t *d)
{
    static const char ka[] = ": keep-alive\n\n";
    for (mt_d_conn_t *c = d->conns; c; c = c->next) {
        if (c->closing || c->kind != MT_D_CONN_SSE || c->sub.head)
            continue;
        if (uv_stream_get_write_queue_size(&c->u.stream) < d->cfg.write_high_water)
            mt__d_conn_write(c, ka, sizeof ka - 1, false);
    }
}

void mt__d_sub_free(mt_d_sub_t *s)
{
    while (s->head) {
        mt_d_chunk_t *ch = s->head;
        s->head = ch->next;
        free(ch);
    }
    s->tail = NULL;
    s->queued_bytes = 0;
}
