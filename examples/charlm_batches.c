/* train_charlm's text and batches: the text as token ids with its unigram entropy, and the
 * batch plan that feeds the prefetcher (see charlm.h). */
#include <math.h>
#include <string.h>

#include "charlm.h"

int charlm_load_text(const char *path, charlm_text_t *t)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "train_charlm: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    t->ids = malloc((size_t)len + 1);
    t->n = fread(t->ids, 1, (size_t)len, f);
    fclose(f);
    size_t count[256] = {0};
    for (size_t i = 0; i < t->n; i++)
        count[t->ids[i]]++;
    int map[256];
    t->V = 0;
    t->entropy_bits = 0;
    for (int c = 0; c < 256; c++) {
        map[c] = -1;
        if (!count[c])
            continue;
        map[c] = t->V;
        t->chars[t->V++] = (unsigned char)c;
        double p = (double)count[c] / (double)t->n;
        t->entropy_bits -= p * log2(p);
    }
    for (size_t i = 0; i < t->n; i++)
        t->ids[i] = (unsigned char)map[t->ids[i]];
    return t->n > 1000 ? 0 : -1;
}

size_t charlm_segments(const charlm_text_t *t, int min_len, int max_len, charlm_seg_t **out)
{
    size_t cap = 1024, n = 0, start = 0;
    charlm_seg_t *seg = malloc(cap * sizeof *seg);
    if (!seg) {
        *out = NULL;
        return 0;
    }
    unsigned char nl = 0;
    for (int v = 0; v < t->V; v++)
        nl = t->chars[v] == '\n' ? (unsigned char)v : nl;
    /* Token i predicts i + 1: a sequence may end at n - 2 at the latest. */
    for (size_t i = 0; i + 1 < t->n; i++) {
        bool eol = t->ids[i + 1] == nl || i + 2 == t->n;
        size_t len = i + 1 - start; /* tokens [start, i] predict through the newline */
        if (!(eol && (int)len >= min_len) && (int)len < max_len)
            continue;
        if (n == cap) {
            charlm_seg_t *g = realloc(seg, 2 * cap * sizeof *seg);
            if (!g)
                break;
            seg = g;
            cap *= 2;
        }
        seg[n++] = (charlm_seg_t){start, (int)len};
        start = i + 1;
        /* The newline that ended a line starts no sequence of its own. */
        if (eol && t->ids[i + 1] == nl) {
            start = i + 2;
            i++;
        }
    }
    *out = seg;
    return n;
}

static bool plan_next(charlm_loader_t *l, charlm_plan_t *out)
{
    if (l->next >= l->nseg) { /* this pass is done: start the next */
        l->epoch++;
        l->next = 0;
    }
    if (l->epoch >= l->epochs || l->nseg == 0)
        return false;
    int count = l->nseg - l->next < (size_t)l->B ? (int)(l->nseg - l->next) : l->B;
    int *lens = malloc((size_t)count * sizeof *lens);
    if (!lens) {
        fprintf(stderr, "train_charlm: out of host memory\n");
        exit(1);
    }
    for (int i = 0; i < count; i++)
        lens[i] = l->seg[l->next + (size_t)i].len;
    *out = (charlm_plan_t){.epoch = l->epoch, .first = l->next, .count = count};
    /* The lengths as they come; the packing sorts them (enforce_sorted = false). */
    CHECK(mt_rnn_pack_init(&out->pack, lens, count, l->max_len, false, NULL, NULL));
    free(lens);
    l->next += (size_t)count;
    return true;
}

/* Token at step t of packed sequence i of plan p; the target is the one after it. */
static unsigned char token(const charlm_loader_t *l, const charlm_plan_t *p, int t, int i, int next)
{
    const charlm_seg_t *s = &l->seg[p->first + (size_t)p->pack.sorted_indices[i]];
    return l->text->ids[s->off + (size_t)t + (size_t)next];
}

/* The prefetcher's fill: writes the batch planned last into pinned staging, the inputs
 * [tokens] then the targets [tokens], in packed order (step-major, the sequences running at
 * each step longest first). */
static int fill_batch(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)index;
    const charlm_loader_t *l = ud;
    const charlm_plan_t *p = &l->queue[(l->head + l->count - 1) % CHARLM_AHEAD_MAX];
    size_t n = p->pack.tokens, row = 0;
    if (bytes != 2 * n)
        return MT_EINVAL;
    unsigned char *in = dst, *tg = in + n;
    for (int t = 0; t < p->pack.max_len; t++)
        for (int i = 0; i < p->pack.batch_sizes[t]; i++, row++) {
            in[row] = token(l, p, t, i, 0);
            tg[row] = token(l, p, t, i, 1);
        }
    return 0;
}

bool charlm_submit_next(charlm_loader_t *l, mt_prefetch_t *pf)
{
    charlm_plan_t p;
    if (l->count == CHARLM_AHEAD_MAX || !plan_next(l, &p))
        return false;
    l->queue[(l->head + l->count++) % CHARLM_AHEAD_MAX] = p;
    CHECK(mt_prefetch_submit_fill(pf, 2 * p.pack.tokens, fill_batch, l));
    return true;
}

bool charlm_pop(charlm_loader_t *l, charlm_plan_t *out)
{
    if (l->count == 0)
        return false;
    *out = l->queue[l->head];
    l->head = (l->head + 1) % CHARLM_AHEAD_MAX;
    l->count--;
    return true;
}

void charlm_plan_fini(charlm_plan_t *p)
{
    mt_rnn_pack_fini(&p->pack);
}

bool charlm_batch_matches(const charlm_loader_t *l, const charlm_plan_t *p, const unsigned char *in,
                          const unsigned char *tg)
{
    size_t row = 0;
    for (int t = 0; t < p->pack.max_len; t++)
        for (int i = 0; i < p->pack.batch_sizes[t]; i++, row++)
            if (in[row] != token(l, p, t, i, 0) || tg[row] != token(l, p, t, i, 1))
                return false;
    return true;
}
