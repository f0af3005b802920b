/* train_charlm --devices N: data parallel over N sim devices (see charlm.h). The replicas'
 * LSTMs come from mt_rnn_replicate, so their weights are one flat buffer in their own
 * device's allocator and a whole broadcast is one peer copy per flat buffer. */
#include <pthread.h>
#include <string.h>

#include "charlm.h"

static float *dev_alloc(mt_alloc_t *a, size_t n, int tag)
{
    void *p = NULL;
    CHECK(mt_alloc_malloc(a, n * sizeof(float), NULL, tag, &p));
    return p;
}

void charlm_dp_init(charlm_dp_t *dp, charlm_model_t *md, mt_backend_t *b0,
                    const mt_alloc_cfg_t *acfg, int n, bool rebind)
{
    memset(dp, 0, sizeof *dp);
    dp->n = n;
    dp->rebind = rebind;
    dp->b[0] = b0;
    dp->a[0] = md->a;
    for (int d = 1; d < n; d++) {
        CHECK(mt_backend_get_device(b0, d, &dp->b[d]));
        mt_alloc_cfg_t c = *acfg;
        c.backend = dp->b[d];
        CHECK(mt_alloc_create(&dp->a[d], &c));
        charlm_model_t *r = &dp->rep[d];
        r->a = dp->a[d];
        r->V = md->V;
        r->H = md->H;
        r->L = md->L;
        CHECK(mt_alloc_tag_register(r->a, "logits", &r->logits_tag));
        CHECK(mt_rnn_replicate(md->rnn, r->a, &r->rnn));
        charlm_head_alloc(r, r->a, md->V, md->H);
        memcpy(r->hw, md->hw, md->hn * sizeof(float)); /* the first broadcast does it again */
        if (rebind) { /* as torch's replicate leaves a parameter: outside the flat buffer */
            mt_rnn_param_t p;
            CHECK(mt_rnn_param_find(r->rnn, "weight_hh_l0", &p));
            dp->moved[d] = dev_alloc(r->a, p.numel, MT_TAG_WEIGHTS);
            memcpy(dp->moved[d], p.data, p.numel * sizeof(float));
            CHECK(mt_rnn_bind_param(r->rnn, p.name, dp->moved[d]));
        }
    }
    size_t nr = 0;
    mt_rnn_grads(md->rnn, &nr);
    dp->recv_rnn = dev_alloc(md->a, nr, MT_TAG_GRADS);
    dp->recv_head = dev_alloc(md->a, md->hn, MT_TAG_GRADS);
}

/* One peer copy on dst_dev's default stream, counted. */
static void peer_copy(charlm_dp_t *dp, void *dst, int dst_dev, const void *src, int src_dev,
                      size_t bytes)
{
    mt_backend_t *b = dp->b[dst_dev];
    CHECK(mt_memcpy_peer_async(b, dst, dst_dev, src, src_dev, bytes, NULL));
    dp->copies++;
    dp->bytes += bytes;
}

/* Device 0's weights to replica d: one copy per flat buffer, or (rebind: the replica is not
 * flat) one per parameter, each to wherever the replica's parameter lives. */
static void broadcast(charlm_dp_t *dp, const charlm_model_t *md, int d)
{
    charlm_model_t *r = &dp->rep[d];
    size_t nr = 0;
    float *w0 = mt_rnn_weights(md->rnn, &nr), *wr = mt_rnn_weights(r->rnn, NULL);
    if (!dp->rebind && mt_rnn_is_flat(md->rnn) && mt_rnn_is_flat(r->rnn)) {
        peer_copy(dp, wr, d, w0, 0, nr * sizeof(float));
    } else {
        mt_rnn_param_t p0, pr;
        for (size_t i = 0; mt_rnn_param_get(md->rnn, i, &p0) == 0; i++) {
            CHECK(mt_rnn_param_get(r->rnn, i, &pr));
            peer_copy(dp, pr.data, d, p0.data, 0, p0.numel * sizeof(float));
        }
    }
    peer_copy(dp, r->hw, d, md->hw, 0, md->hn * sizeof(float));
    CHECK(mt_stream_synchronize(dp->b[d], NULL));
}

/* Replica d's gradients into device 0's: one copy per flat buffer, then a sum there. */
static void reduce(charlm_dp_t *dp, charlm_model_t *md, int d)
{
    charlm_model_t *r = &dp->rep[d];
    size_t nr = 0;
    float *g0 = mt_rnn_grads(md->rnn, &nr), *gr = mt_rnn_grads(r->rnn, NULL);
    peer_copy(dp, dp->recv_rnn, 0, gr, d, nr * sizeof(float));
    peer_copy(dp, dp->recv_head, 0, r->hg, d, md->hn * sizeof(float));
    CHECK(mt_stream_synchronize(dp->b[0], NULL));
    for (size_t k = 0; k < nr; k++)
        g0[k] += dp->recv_rnn[k];
    for (size_t k = 0; k < md->hn; k++)
        md->hg[k] += dp->recv_head[k];
}

/* Device d's share of a packed batch: its sequences (every n-th, from d; still in
 * decreasing length) with their tokens gathered into their own packed order. */
typedef struct share_s {
    charlm_model_t *md;
    mt_rnn_pack_t pack;
    unsigned char *in, *tg;
    size_t norm;
    double loss;
    bool empty;
} share_t;

static void share_make(share_t *s, const mt_rnn_pack_t *p, const unsigned char *in,
                       const unsigned char *tg, int d, int n)
{
    int cnt = p->batch > d ? (p->batch - d + n - 1) / n : 0;
    s->empty = cnt == 0;
    s->norm = p->tokens;
    if (s->empty)
        return;
    int *lens = malloc((size_t)cnt * sizeof *lens);
    if (!lens)
        exit(1);
    for (int k = 0; k < cnt; k++)
        lens[k] = p->lengths[d + k * n];
    CHECK(mt_rnn_pack_init(&s->pack, lens, cnt, p->capacity, true, NULL, NULL));
    free(lens);
    s->in = malloc(s->pack.tokens);
    s->tg = malloc(s->pack.tokens);
    if (!s->in || !s->tg)
        exit(1);
    size_t row = 0, sub = 0; /* first rows of step t in the whole batch and in the share */
    for (int t = 0; t < s->pack.max_len; t++) {
        for (int k = 0; k < s->pack.batch_sizes[t]; k++) {
            s->in[sub + (size_t)k] = in[row + (size_t)(d + k * n)];
            s->tg[sub + (size_t)k] = tg[row + (size_t)(d + k * n)];
        }
        row += (size_t)p->batch_sizes[t];
        sub += (size_t)s->pack.batch_sizes[t];
    }
}

static void share_fini(share_t *s)
{
    if (s->empty)
        return;
    mt_rnn_pack_fini(&s->pack);
    free(s->in);
    free(s->tg);
}

static void *share_run(void *arg)
{
    share_t *s = arg;
    s->loss = s->empty ? 0.0 : charlm_train_step(s->md, s->in, s->tg, &s->pack, s->norm);
    return NULL;
}

double charlm_dp_step(charlm_dp_t *dp, charlm_model_t *md, const unsigned char *in,
                      const unsigned char *tg, const mt_rnn_pack_t *p)
{
    share_t sh[CHARLM_DEV_MAX] = {0};
    pthread_t th[CHARLM_DEV_MAX];
    for (int d = 0; d < dp->n; d++) {
        if (d > 0) {
            broadcast(dp, md, d);
            CHECK(mt_rnn_zero_grads(dp->rep[d].rnn));
            memset(dp->rep[d].hg, 0, md->hn * sizeof(float));
        }
        share_make(&sh[d], p, in, tg, d, dp->n);
        sh[d].md = d ? &dp->rep[d] : md;
    }
    /* Each replica on a thread of its own, device 0 on this one. */
    for (int d = 1; d < dp->n; d++)
        if (pthread_create(&th[d], NULL, share_run, &sh[d]) != 0)
            exit(1);
    share_run(&sh[0]);
    double loss = sh[0].loss;
    for (int d = 1; d < dp->n; d++) {
        pthread_join(th[d], NULL);
        loss += sh[d].loss;
        if (!sh[d].empty)
            reduce(dp, md, d);
    }
    for (int d = 0; d < dp->n; d++)
        share_fini(&sh[d]);
    dp->steps++;
    return loss;
}

uint64_t charlm_dp_backend_allocs(const charlm_dp_t *dp)
{
    uint64_t n = 0;
    for (int d = 1; d < dp->n; d++) {
        mt_backend_counters_t c;
        mt_backend_counters(dp->b[d], &c);
        n += c.malloc_calls + c.vm_map_calls;
    }
    return n;
}

void charlm_dp_summary(const charlm_dp_t *dp)
{
    printf("  data parallel over %d devices (per device; the figures above are device 0's):\n",
           dp->n);
    for (int d = 0; d < dp->n; d++) {
        mt_alloc_stats_t st;
        mt_backend_counters_t c;
        CHECK(mt_alloc_stats(dp->a[d], &st));
        mt_backend_counters(dp->b[d], &c);
        printf("    device %d: peak allocated %.2f MiB, reserved %.2f MiB; %llu peer copies "
               "(%.2f MiB) landed here, %.3f ms of modelled copy time\n",
               d, charlm_mib((double)st.allocated_bytes[MT_STAT_ALL].peak),
               charlm_mib((double)st.reserved_bytes[MT_STAT_ALL].peak),
               (unsigned long long)c.peer_copies, charlm_mib((double)c.peer_bytes),
               (double)c.peer_ns / 1e6);
    }
    double per = dp->steps ? 1.0 / (double)dp->steps : 0.0;
    printf("    per step: %.1f peer copies, %.2f MiB moved (%d replica%s; %s)\n",
           (double)dp->copies * per, charlm_mib((double)dp->bytes * per), dp->n - 1,
           dp->n > 2 ? "s" : "",
           dp->rebind ? "--rebind: the broadcast copies parameter by parameter"
                      : "one copy per flat buffer: LSTM and head weights out, gradients back");
    for (int d = 1; d < dp->n; d++) {
        mt_rnn_stats_t rs;
        CHECK(mt_rnn_stats(dp->rep[d].rnn, &rs));
        printf("    replica on device %d: weights %s, %llu compactions, %.2f MiB copied\n", d,
               rs.flat ? "flat" : "NOT flat", (unsigned long long)rs.compactions,
               charlm_mib((double)rs.compacted_bytes));
    }
}

void charlm_dp_fini(charlm_dp_t *dp)
{
    mt_alloc_free(dp->a[0], dp->recv_rnn);
    mt_alloc_free(dp->a[0], dp->recv_head);
    for (int d = 1; d < dp->n; d++) {
        charlm_model_t *r = &dp->rep[d];
        mt_alloc_free(r->a, r->hw);
        mt_alloc_free(r->a, r->hg);
        mt_rnn_destroy(&r->rnn);
        mt_alloc_free(r->a, dp->moved[d]);
        mt_alloc_destroy(&dp->a[d]);
    }
}
