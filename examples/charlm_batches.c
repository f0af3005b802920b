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

static bool plan_next(charlm_loader_t *l, charlm_plan_t *out)
{
    if (l->pos + (size_t)l->min_len >= l->span) { /* this pass is done: start the next */
        l->epoch++;
        l->pos = 0;
    }
    if (l->epoch >= l->epochs || l->pos + (size_t)l->min_len >= l->span)
        return false;
    int T = l->min_len + (int)(charlm_rng_next(&l->rng) % (uint64_t)(l->max_len - l->min_len + 1));
    if (l->pos + (size_t)T > l->span)
        T = (int)(l->span - l->pos);
    *out = (charlm_plan_t){T, l->epoch, l->pos};
    l->pos += (size_t)T;
    return true;
}

/* Token of stream b at step t of plan p; the target is the one after it. */
static unsigned char token(const charlm_loader_t *l, const charlm_plan_t *p, int t, int b, int next)
{
    return l->text->ids[(size_t)b * l->span + p->pos + (size_t)t + (size_t)next];
}

/* The prefetcher's fill: writes the batch planned last into pinned staging, the inputs
 * [T, B] then the targets [T, B], t-major. */
static int fill_batch(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)index;
    const charlm_loader_t *l = ud;
    const charlm_plan_t *p = &l->queue[(l->head + l->count - 1) % CHARLM_AHEAD_MAX];
    size_t tb = (size_t)p->T * l->B;
    if (bytes != 2 * tb)
        return MT_EINVAL;
    unsigned char *in = dst, *tg = in + tb;
    for (int t = 0; t < p->T; t++) {
        for (int b = 0; b < l->B; b++) {
            in[(size_t)t * l->B + b] = token(l, p, t, b, 0);
            tg[(size_t)t * l->B + b] = token(l, p, t, b, 1);
        }
    }
    return 0;
}

bool charlm_submit_next(charlm_loader_t *l, mt_prefetch_t *pf)
{
    charlm_plan_t p;
    if (l->count == CHARLM_AHEAD_MAX || !plan_next(l, &p))
        return false;
    l->queue[(l->head + l->count++) % CHARLM_AHEAD_MAX] = p;
    CHECK(mt_prefetch_submit_fill(pf, 2 * (size_t)p.T * l->B, fill_batch, l));
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

bool charlm_batch_matches(const charlm_loader_t *l, const charlm_plan_t *p, const unsigned char *in,
                          const unsigned char *tg)
{
    for (int t = 0; t < p->T; t++)
        for (int b = 0; b < l->B; b++)
            if (in[(size_t)t * l->B + b] != token(l, p, t, b, 0) ||
                tg[(size_t)t * l->B + b] != token(l, p, t, b, 1))
                return false;
    return true;
}
