/* train_charlm: a character-level LSTM language model trained on the bundled public-domain
 * text, on memtrace's allocator and RNN engine. The README demo.
 *
 * Model: embedding [V, E] -> LSTM (mt_rnn, L layers, hidden H) -> linear [V, H] -> softmax
 * cross-entropy; Adam. A batch is B lines of the text at their natural lengths (lines
 * longer than --max-len cut, shorter than --min-len joined with the next), packed as the
 * engine takes variable-length batches (docs/rnn-packed.md): no padding, so compute,
 * activations and tokens/s are those of the real tokens. Every line starts from a zero
 * state. After training it samples characters with the constant-memory step API.
 *
 * Everything allocates from the caching allocator with a tag (weights, grads, optimizer,
 * activations, batch, and the user tag "logits"), so the memory summary at the end says
 * where the bytes went, and the allocator's events go to the profiler (memtraced if it runs,
 * else a local NDJSON log that `memtrace report` reads), with one iteration mark per batch.
 * Batches reach the device through the prefetcher (U3): batch k+1's tokens are copied from
 * pinned host memory on a side stream while batch k trains; the inputs and targets of a
 * batch are two views of one device buffer. --offload moves older chunks of the LSTM's
 * activations to pinned host memory during the forward pass (U4).
 *
 * The embedding, linear layer, loss and Adam are computed here on the CPU with CBLAS, like
 * the engine's CPU path: the buffers are sim-device memory, which is host-addressable.
 *
 * The program checks itself and exits with status 3 if a check fails: no backend malloc
 * after the warm-up, the loss fell over the run, every device batch held exactly the
 * planned tokens, the allocator's invariants hold. The text and its batches are in
 * charlm_batches.c, the summary and the checks in charlm_report.c. */
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memtrace/alloc.h"
#include "memtrace/host.h"
#include "memtrace/prof.h"
#include "memtrace/rnn.h"
#include "charlm.h"
#include "mt_config.h"

#define EMBED CHARLM_EMBED

typedef charlm_param_t param_t;
typedef charlm_model_t model_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: train_charlm [options]\n"
            "  --epochs N        passes over the text (default 20)\n"
            "  --hidden H        LSTM hidden size (default 256)\n"
            "  --layers L        LSTM layers (default 1)\n"
            "  --dropout P       dropout between LSTM layers while training, probability in\n"
            "                    [0, 1) (default 0; needs --layers 2 or more to do anything)\n"
            "  --batch B         lines per batch, each at its own length (default 16)\n"
            "  --min-len T       shortest sequence: shorter lines join the next (default 8)\n"
            "  --max-len T       longest sequence: longer lines are cut (default 96)\n"
            "  --lr X            Adam learning rate (default 0.004)\n"
            "  --seed S          seed of the weights and sampling (default 1)\n"
            "  --sample N        characters to generate after training (default 400)\n"
            "  --text PATH       training text (default data/text/corpus.txt)\n"
            "  --offload W       activation offload (U4): keep W chunks of the LSTM's activations\n"
            "                    on the device during forward, older ones in pinned host memory\n"
            "                    (default 0 = off; e.g. --offload 1 --chunk-steps 16)\n"
            "  --chunk-steps N   time steps per activation chunk (default 64); backward holds\n"
            "                    W + 1 chunks, so offload pays off when T > (W + 1) x N\n"
            "  --no-prefetch     copy each batch on the compute stream when it is needed, instead\n"
            "                    of the next batch on a side stream while this one trains (U3)\n"
            "  --no-warmup       skip the warm-up step at the largest shape (U2)\n"
            "  --rebind          move weight_hh_l0 out of the flat weight buffer, as a replicated\n"
            "                    module's parameters would be (U1: the engine warns once and\n"
            "                    compacts on every call; with --devices, once per replica)\n"
            "  --devices N       data parallel over N sim devices (default 1): each batch's lines\n"
            "                    are dealt to the devices, weights broadcast and gradients\n"
            "                    reduced into device 0 every step (MEMTRACE_SIM_DEVICES >= N)\n"
            "  --loss-log FILE   write every batch's loss (bits/char), one a line\n"
            "  --help            this text\n"
            "environment: MEMTRACE_PROF=auto|daemon|log|off, MEMTRACE_LOG=path (telemetry),\n"
            "  MEMTRACE_ALLOC_CONF (allocator options), MEMTRACE_BACKEND, MEMTRACE_SIM_*\n");
}

static int parse(int argc, char **argv, charlm_opts_t *o)
{
    *o = (charlm_opts_t){.epochs = 20,
                         .hidden = 256,
                         .layers = 1,
                         .batch = 16,
                         .min_len = 0, /* 0 = 32, or --max-len if that is shorter */
                         .max_len = 96,
                         .sample = 400,
                         .seed = 1,
                         .lr = 4e-3,
                         .warmup = true,
                         .prefetch = true,
                         .devices = 1,
                         .text = MT_SOURCE_ROOT "/data/text/corpus.txt"};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(k, "--no-warmup") || !strcmp(k, "--rebind") || !strcmp(k, "--no-prefetch")) {
            o->warmup &= strcmp(k, "--no-warmup") != 0;
            o->rebind |= !strcmp(k, "--rebind");
            o->prefetch &= strcmp(k, "--no-prefetch") != 0;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "train_charlm: %s needs a value (see --help)\n", k);
            return -1;
        }
        const char *v = argv[++i];
        char *end;
        long n = strtol(v, &end, 10);
        bool num = *v && !*end;
        if (!strcmp(k, "--epochs") && num && n > 0)
            o->epochs = (int)n;
        else if (!strcmp(k, "--hidden") && num && n > 0)
            o->hidden = (int)n;
        else if (!strcmp(k, "--layers") && num && n > 0)
            o->layers = (int)n;
        else if (!strcmp(k, "--batch") && num && n > 0)
            o->batch = (int)n;
        else if (!strcmp(k, "--min-len") && num && n > 0)
            o->min_len = (int)n;
        else if (!strcmp(k, "--max-len") && num && n > 0)
            o->max_len = (int)n;
        else if (!strcmp(k, "--sample") && num && n >= 0)
            o->sample = (int)n;
        else if (!strcmp(k, "--seed") && num)
            o->seed = (uint64_t)n;
        else if (!strcmp(k, "--offload") && num && n >= 0)
            o->offload = (int)n;
        else if (!strcmp(k, "--chunk-steps") && num && n > 0)
            o->chunk_steps = (int)n;
        else if (!strcmp(k, "--devices") && num && n >= 1 && n <= CHARLM_DEV_MAX)
            o->devices = (int)n;
        else if (!strcmp(k, "--loss-log"))
            o->loss_log = v;
        else if (!strcmp(k, "--lr") && (o->lr = strtod(v, &end)) > 0 && !*end)
            ;
        else if (!strcmp(k, "--dropout")) {
            o->dropout = strtod(v, &end);
            if (!*v || *end || !(o->dropout >= 0.0 && o->dropout < 1.0)) {
                fprintf(stderr,
                        "train_charlm: --dropout %s: expected a probability in [0, 1), e.g. "
                        "--dropout 0.3\n",
                        v);
                return -1;
            }
        } else if (!strcmp(k, "--text"))
            o->text = v;
        else {
            fprintf(stderr, "train_charlm: bad option or value: %s %s (see --help)\n", k, v);
            return -1;
        }
    }
    if (o->min_len == 0)
        o->min_len = o->max_len < 8 ? o->max_len : 8;
    if (o->min_len > o->max_len) {
        fprintf(stderr, "train_charlm: --min-len must be <= --max-len\n");
        return -1;
    }
    if (o->devices > 1 && (o->dropout > 0.0 || o->offload > 0)) {
        /* Masks are drawn per batch row, and a replica starts without offload. */
        fprintf(stderr, "train_charlm: --devices %d takes neither --dropout nor --offload\n",
                o->devices);
        return -1;
    }
    return 0;
}

static void log_cb(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    if (level <= MT_LOG_INFO)
        fprintf(stderr, "[memtrace %s] %s\n",
                level == MT_LOG_ERROR  ? "error"
                : level == MT_LOG_WARN ? "warning"
                                       : "info",
                msg);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double rng_unit(uint64_t *s)
{
    return (double)(charlm_rng_next(s) >> 11) / 9007199254740992.0;
}

static float *dev(mt_alloc_t *a, size_t n, int tag)
{
    void *p = NULL;
    CHECK(mt_alloc_malloc(a, n * sizeof(float), NULL, tag, &p));
    return p;
}

/* ---- the model ---- */

static void uniform_fill(float *w, size_t n, double k, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        w[i] = (float)((2.0 * rng_unit(s) - 1.0) * k);
}

static void model_init(model_t *md, mt_alloc_t *a, mt_host_cache_t *host, const charlm_opts_t *o,
                       int V)
{
    memset(md, 0, sizeof *md);
    md->a = a;
    md->V = V;
    md->H = o->hidden;
    md->L = o->layers;
    mt_rnn_cfg_t rc = mt_rnn_cfg_default();
    (void)mt_rnn_cfg_from_env(&rc); /* MEMTRACE_RNN_GEMM */
    rc.mode = MT_RNN_LSTM;
    rc.input_size = EMBED;
    rc.hidden_size = o->hidden;
    rc.num_layers = o->layers;
    rc.seed = o->seed;
    rc.alloc = a;
    rc.log = log_cb;
    rc.chunk_steps = o->chunk_steps;
    rc.offload_window = o->offload;
    rc.offload_host = host;
    rc.dropout = (float)o->dropout;
    rc.dropout_seed = o->seed;
    CHECK(mt_rnn_create(&md->rnn, &rc));
    uint64_t s = o->seed * 7919 + 1;
    charlm_head_alloc(md, a, V, o->hidden);
    uniform_fill(md->emb, (size_t)V * EMBED, 1.0, &s);
    uniform_fill(md->wo, (size_t)V * o->hidden, 1.0 / sqrt((double)o->hidden), &s);
    memset(md->bo, 0, (size_t)V * sizeof(float));
    size_t nr;
    float *rw = mt_rnn_weights(md->rnn, &nr);
    md->p[0] = (param_t){rw, mt_rnn_grads(md->rnn, NULL), NULL, NULL, nr};
    md->p[1] = (param_t){md->emb, md->demb, NULL, NULL, (size_t)V * EMBED};
    md->p[2] = (param_t){md->wo, md->dwo, NULL, NULL, (size_t)V * o->hidden};
    md->p[3] = (param_t){md->bo, md->dbo, NULL, NULL, (size_t)V};
    for (int i = 0; i < 4; i++) {
        md->p[i].m = dev(a, md->p[i].n, MT_TAG_OPTIMIZER);
        md->p[i].v = dev(a, md->p[i].n, MT_TAG_OPTIMIZER);
        memset(md->p[i].m, 0, md->p[i].n * sizeof(float));
        memset(md->p[i].v, 0, md->p[i].n * sizeof(float));
        if (i > 0)
            memset(md->p[i].g, 0, md->p[i].n * sizeof(float));
    }
    size_t ns = (size_t)o->layers * o->batch * o->hidden;
    for (int i = 0; i < 2; i++) {
        md->h[i] = dev(a, ns, MT_TAG_ACTIVATIONS);
        md->c[i] = dev(a, ns, MT_TAG_ACTIVATIONS);
        memset(md->h[i], 0, ns * sizeof(float));
        memset(md->c[i], 0, ns * sizeof(float));
    }
}

static void model_free(model_t *md)
{
    for (int i = 0; i < 4; i++) {
        mt_alloc_free(md->a, md->p[i].m);
        mt_alloc_free(md->a, md->p[i].v);
    }
    float *bufs[] = {md->hw, md->hg, md->h[0], md->h[1], md->c[0], md->c[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        mt_alloc_free(md->a, bufs[i]);
    mt_rnn_destroy(&md->rnn);
}

static void zero_grads(model_t *md)
{
    CHECK(mt_rnn_zero_grads(md->rnn));
    for (int i = 1; i < 4; i++)
        memset(md->p[i].g, 0, md->p[i].n * sizeof(float));
}

/* Adam with global-norm gradient clipping at 5. */
static void adam_update(float *w, const float *g, float *m, float *v, size_t n, double scale,
                        double lr, double c1, double c2)
{
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (size_t k = 0; k < n; k++) {
        double gk = g[k] * scale;
        m[k] = (float)(b1 * m[k] + (1 - b1) * gk);
        v[k] = (float)(b2 * v[k] + (1 - b2) * gk * gk);
        w[k] -= (float)(lr * (m[k] / c1) / (sqrt(v[k] / c2) + eps));
    }
}

/* Adam with global-norm gradient clipping at 5. The LSTM's parameters are updated through
 * their views, wherever they live (with --rebind, weight_hh_l0 is not in the flat buffer);
 * their moments sit at the same offsets as in the flat layout. */
static void adam_step(model_t *md, double lr)
{
    const double clip = 5.0;
    double norm2 = 0;
    for (int i = 0; i < 4; i++)
        for (size_t k = 0; k < md->p[i].n; k++)
            norm2 += (double)md->p[i].g[k] * md->p[i].g[k];
    double scale = sqrt(norm2) > clip ? clip / sqrt(norm2) : 1.0;
    md->adam_t++;
    double c1 = 1.0 - pow(0.9, (double)md->adam_t), c2 = 1.0 - pow(0.999, (double)md->adam_t);
    mt_rnn_param_t rp;
    for (size_t i = 0; mt_rnn_param_get(md->rnn, i, &rp) == 0; i++)
        adam_update(rp.data, rp.grad, md->p[0].m + rp.offset, md->p[0].v + rp.offset, rp.numel,
                    scale, lr, c1, c2);
    for (int i = 1; i < 4; i++) {
        param_t *p = &md->p[i];
        adam_update(p->w, p->g, p->m, p->v, p->n, scale, lr, c1, c2);
    }
}

void charlm_head_alloc(model_t *md, mt_alloc_t *a, int V, int H)
{
    md->hn = (size_t)V * EMBED + (size_t)V * H + (size_t)V;
    md->hw = dev(a, md->hn, MT_TAG_WEIGHTS);
    md->hg = dev(a, md->hn, MT_TAG_GRADS);
    md->emb = md->hw;
    md->wo = md->emb + (size_t)V * EMBED;
    md->bo = md->wo + (size_t)V * H;
    md->demb = md->hg;
    md->dwo = md->demb + (size_t)V * EMBED;
    md->dbo = md->dwo + (size_t)V * H;
}

/* One forward + backward over the packed batch p: tokens in[N] -> targets tg[N], in packed
 * order (N = p->tokens; every sequence from a zero state). Returns the summed cross-entropy
 * in nats. */
double charlm_train_step(model_t *md, const unsigned char *in, const unsigned char *tg,
                         const mt_rnn_pack_t *p, size_t norm_tokens)
{
    mt_alloc_t *a = md->a;
    int V = md->V, H = md->H;
    size_t tb = p->tokens;
    float *x = dev(a, tb * EMBED, MT_TAG_ACTIVATIONS);
    float *y = dev(a, tb * H, MT_TAG_ACTIVATIONS);
    for (size_t r = 0; r < tb; r++)
        memcpy(x + r * EMBED, md->emb + (size_t)in[r] * EMBED, EMBED * sizeof(float));
    mt_rnn_io_t io = {.x = x, .y = y};
    mt_rnn_pack_io(p, &io);
    mt_rnn_reserve_t *res;
    CHECK(mt_rnn_forward(md->rnn, &io, &res));

    /* logits = y Wo^T + bo, then softmax cross-entropy; dlogits in place. */
    float *lg = dev(a, tb * V, md->logits_tag);
    for (size_t r = 0; r < tb; r++)
        memcpy(lg + r * V, md->bo, (size_t)V * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tb, V, H, 1.0f, y, H, md->wo, H, 1.0f,
                lg, V);
    double loss = 0;
    float inv = 1.0f / (float)norm_tokens;
    for (size_t r = 0; r < tb; r++) {
        float *l = lg + r * V, mx = l[0];
        for (int k = 1; k < V; k++)
            mx = l[k] > mx ? l[k] : mx;
        double sum = 0;
        for (int k = 0; k < V; k++) {
            l[k] = expf(l[k] - mx);
            sum += l[k];
        }
        loss -= log(l[tg[r]] / sum);
        for (int k = 0; k < V; k++)
            l[k] = (float)(l[k] / sum) * inv;
        l[tg[r]] -= inv;
    }
    /* Linear layer backward, then the RNN, then the embedding. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, H, (int)tb, 1.0f, lg, V, y, H, 1.0f,
                md->dwo, H);
    for (size_t r = 0; r < tb; r++)
        for (int k = 0; k < V; k++)
            md->dbo[k] += lg[r * V + k];
    float *dy = dev(a, tb * H, MT_TAG_ACTIVATIONS);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tb, H, V, 1.0f, lg, V, md->wo, H,
                0.0f, dy, H);
    mt_alloc_free(a, lg);
    float *dx = dev(a, tb * EMBED, MT_TAG_ACTIVATIONS);
    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx}; /* dhy = NULL: the state is detached */
    CHECK(mt_rnn_backward(md->rnn, &res, &g));
    for (size_t r = 0; r < tb; r++) {
        float *d = md->demb + (size_t)in[r] * EMBED;
        for (int k = 0; k < EMBED; k++)
            d[k] += dx[r * EMBED + k];
    }
    mt_alloc_free(a, dx);
    mt_alloc_free(a, dy);
    mt_alloc_free(a, y);
    mt_alloc_free(a, x);
    return loss;
}

/* Samples n characters with the step API (constant memory), starting from a zero state
 * (every training line does) and the given character. */
static void sample(model_t *md, const charlm_text_t *t, int n, int first, uint64_t *s, int B)
{
    mt_alloc_t *a = md->a;
    int V = md->V, H = md->H, L = md->L;
    size_t ns = (size_t)L * H;
    float *h[2] = {dev(a, ns, MT_TAG_ACTIVATIONS), dev(a, ns, MT_TAG_ACTIVATIONS)};
    float *c[2] = {dev(a, ns, MT_TAG_ACTIVATIONS), dev(a, ns, MT_TAG_ACTIVATIONS)};
    /* Batch row 0 of each layer's training state. */
    for (int l = 0; l < L; l++) {
        memcpy(h[0] + (size_t)l * H, md->h[md->cur] + (size_t)l * B * H, H * sizeof(float));
        memcpy(c[0] + (size_t)l * H, md->c[md->cur] + (size_t)l * B * H, H * sizeof(float));
    }
    float *x = dev(a, EMBED, MT_TAG_ACTIVATIONS), *y = dev(a, H, MT_TAG_ACTIVATIONS);
    float *p = dev(a, V, MT_TAG_ACTIVATIONS);
    int ch = first;
    putchar(t->chars[ch]);
    for (int i = 0; i < n; i++) {
        memcpy(x, md->emb + (size_t)ch * EMBED, EMBED * sizeof(float));
        CHECK(mt_rnn_step(md->rnn, 1, x, h[i & 1], c[i & 1], y, h[!(i & 1)], c[!(i & 1)]));
        memcpy(p, md->bo, V * sizeof(float));
        cblas_sgemv(CblasRowMajor, CblasNoTrans, V, H, 1.0f, md->wo, H, y, 1, 1.0f, p, 1);
        double mx = p[0], sum = 0;
        for (int k = 1; k < V; k++)
            mx = p[k] > mx ? p[k] : mx;
        for (int k = 0; k < V; k++) /* temperature 0.8 */
            sum += (p[k] = (float)exp((p[k] - mx) / 0.8));
        double u = rng_unit(s) * sum;
        for (ch = 0; ch < V - 1 && (u -= p[ch]) > 0; ch++)
            ;
        putchar(t->chars[ch]);
    }
    putchar('\n');
    float *bufs[] = {h[0], h[1], c[0], c[1], x, y, p};
    for (int i = 0; i < 7; i++)
        mt_alloc_free(a, bufs[i]);
}

/* ---- telemetry ---- */

/* A user tag: the allocator announces its label in the event stream, so the profiler's
 * log, the daemon and `memtrace report` name it with no help from the program. */
static int register_tag(mt_alloc_t *a, const char *label)
{
    int tag;
    CHECK(mt_alloc_tag_register(a, label, &tag));
    return tag;
}

/* ---- the run ---- */

/* Loss and time of the epoch being trained. */
typedef struct epoch_acc_s {
    int epoch, steps;
    double t0, loss; /* loss: nats, summed */
    size_t toks;
} epoch_acc_t;

static void epoch_done(const epoch_acc_t *e, const charlm_text_t *text, charlm_run_t *r)
{
    double bits = e->loss / (double)e->toks / log(2.0), dt = now_s() - e->t0;
    if (e->epoch == 0)
        r->first_loss = bits;
    r->last_loss = bits;
    printf("epoch %2d  train loss %.3f bits/char (unigram %.3f)  %4d batches  %7.0f tokens/s  "
           "%.1f s\n",
           e->epoch + 1, bits, text->entropy_bits, e->steps, (double)e->toks / dt, dt);
    fflush(stdout);
}

/* Training: batch k+1 is submitted (copied on the side stream) before batch k trains; with
 * --no-prefetch a batch is submitted only once the previous one is released, and its copy
 * runs on the compute stream. */
static void train(model_t *md, charlm_dp_t *dp, mt_prefetch_t *pf, charlm_loader_t *ld,
                  const charlm_opts_t *o, const charlm_text_t *text, charlm_run_t *r)
{
    size_t cap = 0;
    unsigned ahead = o->prefetch ? 2 : 1;
    while (ld->count < ahead && charlm_submit_next(ld, pf))
        ;
    epoch_acc_t e = {.t0 = now_s()};
    charlm_plan_t p;
    while (charlm_pop(ld, &p)) {
        mt_prefetch_batch_t pb;
        CHECK(mt_prefetch_next(pf, &pb));
        uint64_t c0, c1;
        r->ready += mt_prefetch_copy_times(pf, pb.index, &c0, &c1) == 0;
        double tw = now_s();
        CHECK(mt_prefetch_wait(pf, &pb)); /* the CPU path computes on this thread */
        r->wait_s += now_s() - tw;
        size_t tb = p.pack.tokens;
        void *in, *tg;
        CHECK(mt_prefetch_slice(&pb, 0, tb, &in));
        CHECK(mt_prefetch_slice(&pb, tb, tb, &tg));
        r->bad_batches += !charlm_batch_matches(ld, &p, in, tg);
        if (p.epoch != e.epoch) {
            epoch_done(&e, text, r);
            e = (epoch_acc_t){.epoch = p.epoch, .t0 = now_s()};
        }
        /* An iteration marker, so a profiler can line memory up with training steps. */
        mt_alloc_emit(md->a, MT_EV_MARK, MT_MARK_ITERATION, r->batches, MT_TAG_OTHER);
        double l = dp ? charlm_dp_step(dp, md, in, tg, &p.pack)
                      : charlm_train_step(md, in, tg, &p.pack, p.pack.tokens);
        /* What padding every line to the batch's longest would have kept and computed. */
        mt_rnn_act_t pk, pad;
        CHECK(mt_rnn_activation_bytes_packed(md->rnn, p.pack.max_len, p.pack.batch_sizes, &pk));
        CHECK(mt_rnn_activation_bytes(md->rnn, p.pack.max_len, p.pack.batch, &pad));
        r->act_packed += (double)pk.reserve_bytes;
        r->act_padded += (double)pad.reserve_bytes;
        r->tokens += tb;
        r->padded_tokens += (uint64_t)p.pack.max_len * (uint64_t)p.pack.batch;
        charlm_plan_fini(&p);
        adam_step(md, o->lr);
        zero_grads(md);
        CHECK(mt_prefetch_release(pf, &pb));
        while (ld->count < ahead && charlm_submit_next(ld, pf))
            ;

        mt_rnn_stats_t rs;
        CHECK(mt_rnn_stats(md->rnn, &rs));
        if (rs.pass_reserve_bytes > r->reserve_bytes)
            r->reserve_bytes = rs.pass_reserve_bytes;
        if (rs.pass_reserve_peak_bytes > r->reserve_peak_bytes)
            r->reserve_peak_bytes = rs.pass_reserve_peak_bytes;
        if (r->batches == cap) {
            cap = cap ? 2 * cap : 1024;
            r->batch_loss = realloc(r->batch_loss, cap * sizeof *r->batch_loss);
            if (!r->batch_loss) {
                fprintf(stderr, "train_charlm: out of host memory\n");
                exit(1);
            }
        }
        r->batch_loss[r->batches++] = l / (double)tb / log(2.0);
        e.loss += l;
        e.toks += tb;
        e.steps++;
    }
    if (e.steps > 0)
        epoch_done(&e, text, r);
}

int main(int argc, char **argv)
{
    /* A program's choice the library leaves to it: oneDNN's OpenMP team sleeps between
     * calls instead of spinning on cores the cell math needs (docs/blas.md). */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    charlm_opts_t o;
    if (parse(argc, argv, &o))
        return 2;
    charlm_text_t text;
    if (charlm_load_text(o.text, &text))
        return 1;

    mt_backend_cfg_t bcfg = mt_backend_cfg_default();
    char err[256];
    if (mt_backend_cfg_from_env(&bcfg, err, sizeof err) != 0) {
        fprintf(stderr, "train_charlm: %s\n", err);
        free(text.ids);
        return 2;
    }
    bcfg.log = log_cb;
    mt_backend_t *b;
    CHECK(mt_backend_create(&b, &bcfg));
    if (mt_backend_kind(b) != MT_BACKEND_SIM) {
        /* The embedding, output layer, loss and Adam here run on the CPU and write the
         * allocator's memory directly, which only the sim backend makes host-addressable. */
        fprintf(stderr,
                "train_charlm: the %s backend is not host-addressable; this program computes "
                "its non-RNN layers on the CPU, so it runs on the sim backend\n",
                mt_backend_name(b));
        mt_backend_destroy(&b);
        bcfg.kind = MT_BACKEND_SIM;
        CHECK(mt_backend_create(&b, &bcfg));
    }

    if (o.devices > mt_backend_device_count(b)) {
        fprintf(stderr,
                "train_charlm: --devices %d but the %s backend has %d device%s (set "
                "MEMTRACE_SIM_DEVICES=%d)\n",
                o.devices, mt_backend_name(b), mt_backend_device_count(b),
                mt_backend_device_count(b) == 1 ? "" : "s", o.devices);
        mt_backend_destroy(&b);
        free(text.ids);
        return 2;
    }

    /* Telemetry: memtraced if it runs (auto), else a local NDJSON log. */
    mt_prof_cfg_t pcfg = mt_prof_cfg_default();
    if (mt_prof_cfg_from_env(&pcfg)) {
        fprintf(stderr, "train_charlm: MEMTRACE_PROF must be auto, daemon, log or off\n");
        return 2;
    }
    char serr[128];
    if (mt_prof_stacks_from_env(&pcfg, serr, sizeof serr)) {
        fprintf(stderr, "train_charlm: %s\n", serr);
        return 2;
    }
    pcfg.log = log_cb;
    mt_prof_t *prof;
    CHECK(mt_prof_create(&prof, &pcfg));

    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    if (mt_alloc_cfg_from_env(&acfg, err, sizeof err)) {
        fprintf(stderr, "train_charlm: MEMTRACE_ALLOC_CONF: %s\n", err);
        return 2;
    }
    acfg.backend = b;
    acfg.sink = mt_prof_sink(prof);
    acfg.log = log_cb;
    mt_alloc_t *a;
    CHECK(mt_alloc_create(&a, &acfg));
    /* The pinned cache (batch staging, offloaded activations) records into the same
     * profiler: its events say pool "host", and consumers keep its totals apart from the
     * device allocator's. */
    mt_host_cfg_t hcfg = mt_host_cfg_default();
    hcfg.backend = b;
    hcfg.sink = mt_prof_sink(prof);
    hcfg.log = log_cb;
    mt_host_cache_t *host;
    CHECK(mt_host_cache_create(&host, &hcfg));

    printf("backend: %s\n", mt_backend_name(b));
    mt_prof_stats_t ps;
    mt_prof_stats(prof, &ps);
    const char *log_path = mt_prof_log_path(prof);
    printf("telemetry: %s%s%s\n", mt_prof_mode_name(ps.mode),
           log_path                    ? ", events -> "
           : ps.mode == MT_PROF_DAEMON ? ", events -> memtraced"
                                       : "",
           log_path ? log_path : "");
    printf("text: %s, %zu characters, vocabulary %d, unigram entropy %.3f bits/char\n", o.text,
           text.n, text.V, text.entropy_bits);
    model_t md;
    model_init(&md, a, host, &o, text.V);
    md.logits_tag = register_tag(a, "logits");
    float *moved = NULL;
    if (o.rebind) {
        mt_rnn_param_t p;
        CHECK(mt_rnn_param_find(md.rnn, "weight_hh_l0", &p));
        moved = dev(a, p.numel, MT_TAG_WEIGHTS);
        memcpy(moved, p.data, p.numel * sizeof(float));
        CHECK(mt_rnn_bind_param(md.rnn, p.name, moved));
        printf("rebind: weight_hh_l0 moved out of the flat buffer (%zu floats)\n", p.numel);
    }
    charlm_seg_t *seg;
    size_t nseg = charlm_segments(&text, o.min_len, o.max_len, &seg);
    size_t seg_tokens = 0;
    for (size_t i = 0; i < nseg; i++)
        seg_tokens += (size_t)seg[i].len;
    printf("model: embedding %d -> LSTM %d x %d (%s path, GEMM %s) -> linear %d; Adam lr %g\n",
           EMBED, o.layers, o.hidden, mt_rnn_path_name(md.rnn), mt_rnn_gemm_name(md.rnn), text.V,
           o.lr);
    printf("batches: %d lines each, packed at their natural lengths (%d..%d, mean %.1f; %zu "
           "lines, %zu tokens per pass)\n",
           o.batch, o.min_len, o.max_len, nseg ? (double)seg_tokens / (double)nseg : 0.0, nseg,
           seg_tokens);
    if (o.dropout > 0.0 && o.layers > 1)
        printf("dropout: %g on the output of LSTM layer%s 0..%d while training (none when "
               "sampling)\n",
               o.dropout, o.layers > 2 ? "s" : "", o.layers - 2);
    if (o.offload)
        printf("activation offload: %d chunk%s of %d steps kept on the device during forward\n",
               o.offload, o.offload > 1 ? "s" : "", mt_rnn_cfg(md.rnn)->chunk_steps);

    charlm_dp_t dp = {0};
    if (o.devices > 1) {
        mt_alloc_cfg_t rcfg = acfg;
        charlm_dp_init(&dp, &md, b, &rcfg, o.devices, o.rebind);
        printf("data parallel: %d devices, each batch's lines dealt round-robin; per step the "
               "weights are broadcast and the gradients reduced into device 0 with peer "
               "copies\n",
               o.devices);
    }
    int B = o.batch;
    mt_prefetch_cfg_t pfc = mt_prefetch_cfg_default();
    pfc.alloc = a;
    pfc.host = host;
    pfc.compute = NULL; /* the default stream: the engine's */
    pfc.batch_bytes = 2 * (size_t)o.max_len * B * sizeof(unsigned char); /* inputs, targets */
    pfc.overlap = o.prefetch;
    mt_prefetch_t *pf;
    CHECK(mt_prefetch_create(&pf, &pfc));

    if (o.warmup) {
        /* U2: one full step at the largest batch (B lines of --max-len: the most tokens
         * and sequences a batch can have), measured, then reserved; any packed batch within
         * those bounds then fits. It leaves no trace in the model (gradients zeroed, no
         * update). */
        unsigned char *zeros = calloc((size_t)o.max_len * B, 1);
        int *lens = malloc((size_t)B * sizeof *lens);
        if (!zeros || !lens)
            return 1;
        for (int i = 0; i < B; i++)
            lens[i] = o.max_len;
        mt_rnn_pack_t wp;
        CHECK(mt_rnn_pack_init(&wp, lens, B, o.max_len, true, NULL, NULL));
        CHECK(mt_alloc_warmup_begin(a));
        for (int d = 1; d < o.devices; d++)
            CHECK(mt_alloc_warmup_begin(dp.a[d]));
        if (o.devices > 1)
            charlm_dp_step(&dp, &md, zeros, zeros, &wp);
        else
            charlm_train_step(&md, zeros, zeros, &wp, wp.tokens);
        zero_grads(&md);
        CHECK(mt_alloc_warmup_end(a, NULL));
        for (int d = 1; d < o.devices; d++)
            CHECK(mt_alloc_warmup_end(dp.a[d], NULL));
        mt_rnn_pack_fini(&wp);
        free(lens);
        free(zeros);
        mt_alloc_stats_t st;
        CHECK(mt_alloc_stats(a, &st));
        printf("warm-up: one step at %d tokens, B=%d; reserved %.2f MiB\n", o.max_len * B, B,
               charlm_mib((double)st.reserved_bytes[MT_STAT_ALL].current));
    } else {
        printf("warm-up: skipped (--no-warmup)\n");
    }
    mt_backend_counters_t c0;
    mt_backend_counters(b, &c0);
    uint64_t dp_allocs0 = o.devices > 1 ? charlm_dp_backend_allocs(&dp) : 0;
    dp.steps = dp.copies = dp.bytes = 0; /* the training steps' own */
    mt_alloc_stats_t st0;
    CHECK(mt_alloc_stats(a, &st0));
    mt_alloc_reset_peak(a); /* peaks below are those of training, not of the warm-up step */
    mt_alloc_reset_peak(mt_host_cache_alloc(host));

    charlm_loader_t ld = {
        .text = &text, .seg = seg, .nseg = nseg, .B = B, .max_len = o.max_len, .epochs = o.epochs};
    uint64_t rng = o.seed * 1000003u + 17;
    charlm_run_t run = {0};
    train(&md, o.devices > 1 ? &dp : NULL, pf, &ld, &o, &text, &run);
    if (run.batches == 0) {
        fprintf(stderr, "train_charlm: the text has no line of %d characters\n", o.min_len);
        return 1;
    }
    mt_backend_counters_t c1;
    mt_backend_counters(b, &c1);
    run.mallocs_after_warmup =
        c1.malloc_calls + c1.vm_map_calls - c0.malloc_calls - c0.vm_map_calls;
    if (o.devices > 1)
        run.mallocs_after_warmup += charlm_dp_backend_allocs(&dp) - dp_allocs0;
    if (o.loss_log) {
        FILE *lf = fopen(o.loss_log, "w");
        for (uint64_t i = 0; lf && i < run.batches; i++)
            fprintf(lf, "%.9g\n", run.batch_loss[i]);
        if (!lf || fclose(lf) != 0) {
            fprintf(stderr, "train_charlm: cannot write %s\n", o.loss_log);
            return 1;
        }
    }
    printf("train loss: %.3f -> %.3f bits/char, %.3f %s the unigram entropy\n", run.first_loss,
           run.last_loss, fabs(text.entropy_bits - run.last_loss),
           run.last_loss < text.entropy_bits ? "below" : "ABOVE");
    mt_alloc_stats_t train_st;
    CHECK(mt_alloc_stats(a, &train_st));
    printf("during training (%s): %llu backend mallocs; reserved %.2f -> %.2f MiB\n",
           o.warmup ? "after warm-up" : "no warm-up", (unsigned long long)run.mallocs_after_warmup,
           charlm_mib((double)st0.reserved_bytes[MT_STAT_ALL].current),
           charlm_mib((double)train_st.reserved_bytes[MT_STAT_ALL].peak));
    mt_prefetch_stats_t pst;
    mt_prefetch_stats(pf, &pst);
    printf("prefetch: %llu batches, %.2f MiB copied host -> device %s; %llu/%llu copies had "
           "finished when their batch was needed; host waited %.1f ms for copies\n",
           (unsigned long long)pst.consumed, charlm_mib((double)pst.bytes_copied),
           o.prefetch ? "on a side stream while the previous batch trained"
                      : "on the compute stream (--no-prefetch)",
           (unsigned long long)run.ready, (unsigned long long)run.batches, run.wait_s * 1e3);
    if (o.sample > 0) {
        mt_alloc_reset_peak(a);
        mt_alloc_stats_t st;
        CHECK(mt_alloc_stats(a, &st));
        int64_t before = st.allocated_bytes[MT_STAT_ALL].current;
        printf("\nsample (%d characters, temperature 0.8):\n", o.sample);
        int first = text.ids[(size_t)(charlm_rng_next(&rng) % (uint64_t)text.n)];
        sample(&md, &text, o.sample, first, &rng, B);
        CHECK(mt_alloc_stats(a, &st));
        printf("sampling peak: %.1f KiB above the model (constant in the number of "
               "characters)\n",
               (double)(st.allocated_bytes[MT_STAT_ALL].peak - before) / 1024.0);
    }
    charlm_memory_summary(a, host, &train_st, &c1, md.rnn, &run, &o);
    if (o.devices > 1)
        charlm_dp_summary(&dp);
    printf("\n");
    int failed = charlm_self_check(&o, &run, a, pf);

    free(run.batch_loss);
    free(seg);
    free(text.ids);
    model_free(&md);
    mt_alloc_free(a, moved);
    mt_prefetch_destroy(&pf);
    if (o.devices > 1)
        charlm_dp_fini(&dp);
    mt_alloc_destroy(&a);
    mt_host_cache_destroy(&host);
    mt_prof_flush(prof);
    mt_prof_stats(prof, &ps);
    if (log_path)
        printf("telemetry: %llu events, %llu dropped, %llu lines in %s; read it with: memtrace "
               "report %s\n",
               (unsigned long long)ps.emitted, (unsigned long long)ps.dropped,
               (unsigned long long)ps.written, log_path, log_path);
    else
        printf("telemetry: %llu events, %llu dropped (%s)\n", (unsigned long long)ps.emitted,
               (unsigned long long)ps.dropped, mt_prof_mode_name(ps.mode));
    mt_prof_destroy(&prof); /* the final drain */
    mt_backend_destroy(&b);
    return failed ? 3 : 0;
}
