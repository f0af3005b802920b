/* The RNN module: descriptors, the flat weight and gradient buffers, named parameter
 * views (params.c: rebinding, compaction, replicate and flatten), and the
 * forward/backward entry points (warm-up: warmup.c), which allocate reserve and workspace from the
 * caching allocator with their tags and dispatch to a compute path. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "mt_config.h"
#include "rnn/internal.h"

/* ---- small helpers ---- */

#define rlog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

void mt__rnn_mark(mt_rnn_t *m, int which, uint64_t payload)
{
    mt_alloc_emit(m->alloc, MT_EV_MARK, (uint64_t)which, payload, MT_TAG_OTHER);
}

int mt__rnn_dmalloc(mt_rnn_t *m, size_t bytes, int tag, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return 0;
    return mt_alloc_malloc(m->alloc, bytes, m->cfg.stream, tag, out);
}

void mt__rnn_dfree(mt_rnn_t *m, void *p)
{
    if (p)
        mt_alloc_free(m->alloc, p);
}

/* The compute path for a backend: cuDNN on the cuda backend when built with it. */
static const mt__rnn_path_t *select_path(mt_backend_t *b)
{
    if (mt_backend_kind(b) == MT_BACKEND_SIM)
        return &mt__rnn_cpu_path;
#if MT_HAVE_CUDNN
    if (mt_backend_kind(b) == MT_BACKEND_CUDA)
        return &mt__rnn_cudnn_path;
#endif
    return NULL;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform(-1/sqrt(H), 1/sqrt(H)) for every weight and bias, as PyTorch's reset_parameters.
 * Written in host memory, then copied to the device buffer. */
static int init_weights(mt_rnn_t *m, uint64_t seed)
{
    size_t n = m->weight_floats;
    float *host = malloc(n * sizeof(float));
    if (!host)
        return MT_ENOMEM;
    float k = 1.0f / sqrtf((float)m->shape.hidden);
    uint64_t st = seed;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0);
        host[i] = (float)((2.0 * u - 1.0) * k);
    }
    int rc = mt_memcpy(m->backend, m->w, host, n * sizeof(float), MT_MEMCPY_HOST_TO_DEVICE);
    free(host);
    return rc;
}

/* The default GEMM library of the cpu path at one thread and at two or more, by measurement
 * (docs/blas.md: on an AMD EPYC with every large product in halves, BLIS ran the 2-thread
 * step at 85-92 % of the GEMM bound where oneDNN ran 71-84 %; oneDNN is as fast or faster at
 * one thread, and far faster on AVX-512). Builds with AddressSanitizer keep the linked CBLAS:
 * LeakSanitizer's exit-time tracer crashes in a process that runs oneDNN's or BLIS's OpenMP
 * threads (libgomp), failing every test at exit. */
#if defined(__SANITIZE_ADDRESS__)
#define MT__RNN_GEMM_DEFAULT    "cblas"
#define MT__RNN_GEMM_DEFAULT_MT "cblas"
#else
#define MT__RNN_GEMM_DEFAULT    "dnnl"
#define MT__RNN_GEMM_DEFAULT_MT "blis"
#endif

/* The default for threads (the next default if it cannot be loaded, then the linked CBLAS). */
static int default_gemm(int threads, const mt__rnn_gemm_t **out)
{
    if (threads >= 2 && mt__rnn_gemm_get(MT__RNN_GEMM_DEFAULT_MT, out) == 0)
        return 0;
    if (mt__rnn_gemm_get(MT__RNN_GEMM_DEFAULT, out) == 0)
        return 0;
    return mt__rnn_gemm_get("cblas", out);
}

/* cfg->gemm, else $MEMTRACE_RNN_GEMM, else the default (*is_default). */
static int select_gemm(const mt_rnn_cfg_t *cfg, const mt__rnn_gemm_t **out, bool *is_default)
{
    const char *want = cfg->gemm && strcmp(cfg->gemm, "auto") != 0 ? cfg->gemm : NULL;
    const char *env = getenv("MEMTRACE_RNN_GEMM");
    if (!want && env && *env && strcmp(env, "auto") != 0)
        want = env;
    *is_default = !want;
    if (!want)
        return default_gemm(1, out);
    int rc = mt__rnn_gemm_get(want, out);
    if (rc)
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "rnn: GEMM library \"%s\"%s %s: expected cblas, blis or dnnl, loadable here "
                 "(libblis.so.4, libdnnl.so.2)",
                 want, want == env ? " (MEMTRACE_RNN_GEMM)" : "",
                 rc == MT_EINVAL ? "is unknown" : "cannot be loaded");
    return rc;
}

/* ---- lifecycle ---- */

mt_rnn_cfg_t mt_rnn_cfg_default(void)
{
    mt_rnn_cfg_t c;
    memset(&c, 0, sizeof c);
    c.mode = MT_RNN_LSTM;
    c.input_size = 1;
    c.hidden_size = 1;
    c.num_layers = 1;
    c.bias = true;
    c.seed = 1;
    return c;
}

const char *mt_rnn_mode_name(int mode)
{
    switch (mode) {
    case MT_RNN_TANH:
        return "rnn_tanh";
    case MT_RNN_RELU:
        return "rnn_relu";
    case MT_RNN_LSTM:
        return "lstm";
    case MT_RNN_GRU:
        return "gru";
    default:
        return "unknown";
    }
}

int mt_rnn_create(mt_rnn_t **out, const mt_rnn_cfg_t *cfg)
{
    if (!out || !cfg || !cfg->alloc)
        return MT_EINVAL;
    *out = NULL;
    if (!(cfg->dropout >= 0.0f && cfg->dropout < 1.0f)) {
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "rnn: dropout %g is outside [0, 1): it is the probability of zeroing an element",
                 (double)cfg->dropout);
        return MT_EINVAL;
    }
    mt__rnn_shape_t shape;
    memset(&shape, 0, sizeof shape);
    int rc = mt__rnn_shape_init(&shape, cfg);
    if (rc)
        return rc;
    if (cfg->chunk_steps < 0)
        return MT_EINVAL;
    shape.chunk = cfg->chunk_steps;
    mt_backend_t *b = mt_alloc_backend(cfg->alloc);
    const mt__rnn_path_t *path = select_path(b);
    if (!path)
        return MT_ENOTSUP;
    bool gemm_auto = false;
    if (path == &mt__rnn_cpu_path) {
        rc = select_gemm(cfg, &shape.gemm, &gemm_auto);
        if (rc)
            return rc;
    }

    mt_rnn_t *m = calloc(1, sizeof *m);
    if (!m)
        return MT_ENOMEM;
    m->cfg = *cfg;
    m->shape = shape;
    m->path = path;
    m->gemm_auto = gemm_auto;
    m->alloc = cfg->alloc;
    m->backend = b;
    m->drop_seed = cfg->dropout_seed;
    if (cfg->dropout > 0.0f && cfg->num_layers == 1)
        rlog(m, MT_LOG_WARN,
             "rnn: dropout %g has no effect with 1 layer: it applies to the output of every "
             "layer but the last",
             (double)cfg->dropout);
    m->weight_floats = mt__rnn_weight_floats(&shape);
    m->nviews = mt__rnn_view_count(&shape);
    size_t bytes = m->weight_floats * sizeof(float);

    rc = MT_ENOMEM;
    m->views = calloc(m->nviews, sizeof *m->views);
    if (!m->views)
        goto fail_views;
    rc = mt__rnn_dmalloc(m, bytes, MT_TAG_WEIGHTS, (void **)&m->w);
    if (rc)
        goto fail_weights;
    rc = mt__rnn_dmalloc(m, bytes, MT_TAG_GRADS, (void **)&m->dw);
    if (rc)
        goto fail_grads;
    rc = init_weights(m, cfg->seed);
    if (rc)
        goto fail_init;
    rc = path->zero(m, m->dw, bytes);
    if (rc)
        goto fail_init;
    mt__rnn_views_init(&shape, m->views, m->w);
    m->stats.weight_bytes = bytes;
    rc = mt__rnn_offload_check(m, cfg->offload_host, cfg->offload_window);
    if (rc)
        goto fail_init;
    if (path->init) {
        rc = path->init(m);
        if (rc)
            goto fail_init;
    }
    *out = m;
    return 0;

fail_init:
    mt__rnn_dfree(m, m->dw);
fail_grads:
    mt__rnn_dfree(m, m->w);
fail_weights:
    free(m->views);
fail_views:
    free(m);
    return rc;
}

void mt_rnn_destroy(mt_rnn_t **p)
{
    if (!p || !*p)
        return;
    mt_rnn_t *m = *p;
    if (m->path->fini)
        m->path->fini(m);
    mt__rnn_offload_fini(m);
    mt__rnn_dfree(m, m->step_ws);
    mt__rnn_dfree(m, m->dw);
    mt__rnn_dfree(m, m->w);
    free(m->views);
    free(m);
    *p = NULL;
}

int mt_rnn_set_offload(mt_rnn_t *m, mt_host_cache_t *host, int window)
{
    if (!m)
        return MT_EINVAL;
    int rc = mt__rnn_offload_check(m, host, window);
    if (rc)
        return rc;
    m->cfg.offload_window = window;
    m->cfg.offload_host = window > 0 ? host : NULL;
    return 0;
}

const mt_rnn_cfg_t *mt_rnn_cfg(const mt_rnn_t *m)
{
    return &m->cfg;
}

const char *mt_rnn_path_name(const mt_rnn_t *m)
{
    return m->path->name;
}

const char *mt_rnn_gemm_name(const mt_rnn_t *m)
{
    return m->path == &mt__rnn_cpu_path ? mt__rnn_gemm_name(m->shape.gemm) : m->path->name;
}

const char *mt_rnn_gemm_info(const mt_rnn_t *m)
{
    return m->path == &mt__rnn_cpu_path ? mt__rnn_gemm_info(m->shape.gemm, m->shape.xsmm)
                                        : m->path->name;
}

int mt_rnn_set_gemm_threads(mt_rnn_t *m, int threads)
{
    if (!m || threads < 1)
        return MT_EINVAL;
    if (m->path != &mt__rnn_cpu_path)
        return MT_ENOTSUP;
    const mt__rnn_gemm_t *g = m->shape.gemm;
    if (m->gemm_auto) {
        int rc = default_gemm(threads, &g);
        if (rc)
            return rc;
    }
    int rc = mt__rnn_gemm_set_threads(g, threads);
    if (rc == 0) {
        m->shape.gemm = g;
        m->shape.threads = threads;
    }
    return rc;
}

/* ---- compute ---- */

static int check_io(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    if (!io || io->seq_len < 1 || io->batch < 1 || !io->x || !io->y)
        return MT_EINVAL;
    return mt__rnn_seq_check(io, m->cfg.log, m->cfg.log_ud);
}

/* Rows of x and y. */
static size_t io_rows(const mt_rnn_io_t *io)
{
    return io->batch_sizes ? io->tokens : (size_t)io->seq_len * (size_t)io->batch;
}

/* What backward reads back from the caller, in the order of mt_rnn_reserve_s.sums. */
static const char *const summed_name[4] = {"y", "x", "hx", "cx"};

static void io_summed(const mt_rnn_t *m, const mt_rnn_io_t *io, const float *p[4], size_t n[4])
{
    const mt__rnn_shape_t *s = &m->shape;
    size_t st = (size_t)s->layers * (size_t)s->dirs * (size_t)io->batch * (size_t)s->hidden;
    p[0] = io->y;
    n[0] = io_rows(io) * (size_t)s->dirs * (size_t)s->hidden;
    p[1] = io->x;
    n[1] = io_rows(io) * (size_t)s->input;
    p[2] = io->hx;
    n[2] = io->hx ? st : 0;
    p[3] = s->mode == MT_RNN_LSTM ? io->cx : NULL;
    n[3] = p[3] ? st : 0;
}

static void io_sums(mt_rnn_t *m, const mt_rnn_io_t *io, uint64_t sums[4])
{
    const float *p[4];
    size_t n[4];
    io_summed(m, io, p, n);
    for (int i = 0; i < 4; i++)
        sums[i] = p[i] ? m->path->checksum(m, p[i], n[i]) : 0;
}

/* MT_EINVAL, logged, if something backward reads back changed since forward. */
static int check_sums(mt_rnn_t *m, const mt_rnn_reserve_t *r)
{
    if (!r->summed)
        return 0;
    uint64_t now[4];
    io_sums(m, &r->io, now);
    for (int i = 0; i < 4; i++) {
        if (now[i] != r->sums[i]) {
            rlog(m, MT_LOG_ERROR,
                 "rnn: backward: %s changed since the training forward (its checksum in the "
                 "reserve differs); backward reads the forward's %s back, so its gradients "
                 "would be wrong. Keep it unchanged until backward, or run forward again",
                 summed_name[i], summed_name[i]);
            return MT_EINVAL;
        }
    }
    return 0;
}

/* The path's reserve: its own handle (reserve_new) or one block tagged activations. */
static int reserve_new(mt_rnn_t *m, mt_rnn_reserve_t *r)
{
    r->bytes = m->path->reserve_bytes(m, &r->io);
    if (m->path->reserve_new)
        return m->path->reserve_new(m, &r->io, &r->space);
    return mt__rnn_dmalloc(m, r->bytes, MT_TAG_ACTIVATIONS, &r->space);
}

static void reserve_free(mt_rnn_t *m, mt_rnn_reserve_t *r)
{
    if (m->path->reserve_free)
        m->path->reserve_free(m, r->space);
    else
        mt__rnn_dfree(m, r->space);
    r->space = NULL;
}

static void release(mt_rnn_t *m, mt_rnn_reserve_t *r)
{
    reserve_free(m, r);
    mt__rnn_dfree(m, r->wcopy);
    free(r->batch_sizes);
    free(r);
}

void mt_rnn_reserve_release(mt_rnn_t *m, mt_rnn_reserve_t **reserve)
{
    if (!m || !reserve || !*reserve)
        return;
    release(m, *reserve);
    *reserve = NULL;
}

/* Forward without marks or argument checks; shared by mt_rnn_forward and mt_rnn_step.
 * step_work: a workspace the caller keeps (mt_rnn_step), or NULL to allocate one. */
static int forward(mt_rnn_t *m, const mt_rnn_io_t *io, mt_rnn_reserve_t **reserve, void *step_work)
{
    bool training = reserve != NULL;
    mt_rnn_reserve_t *res = NULL;
    const float *w;
    float *copy;
    void *work = step_work;
    int rc = mt__rnn_weights_for_call(m, &w, &copy);
    if (rc)
        return rc;
    if (training) {
        rc = MT_ENOMEM;
        res = calloc(1, sizeof *res);
        if (!res)
            goto fail_res;
        res->m = m;
        res->io = *io;
        if (io->batch_sizes) {
            /* Backward needs the batch's shape; the caller's array may be gone by then. */
            size_t n = (size_t)io->seq_len * sizeof(int);
            res->batch_sizes = malloc(n);
            if (!res->batch_sizes)
                goto fail_space;
            memcpy(res->batch_sizes, io->batch_sizes, n);
            res->io.batch_sizes = res->batch_sizes;
        }
        rc = reserve_new(m, res);
        if (rc)
            goto fail_space;
    }
    if (!step_work) {
        rc = mt__rnn_dmalloc(m, m->path->fwd_work_bytes(m, io, training), MT_TAG_WORKSPACE, &work);
        if (rc)
            goto fail_work;
    }
    /* A training pass's masks: the key of the module's seed and training-forward count. */
    uint64_t key = training ? mt__rnn_drop_key(m->drop_seed, m->drop_counter) : 0;
    rc = m->path->forward(m, w, io, training, key, res ? res->space : NULL, work);
    if (!step_work)
        mt__rnn_dfree(m, work);
    if (rc)
        goto fail_work;
    m->stats.forwards++;
    if (training) {
        m->drop_counter++;
        res->drop_key = key;
        if (m->path->checksum) {
            io_sums(m, io, res->sums);
            res->summed = true;
        }
        /* The compacted copy lives until backward, which needs the same weights. */
        res->wcopy = copy;
        *reserve = res;
    } else {
        mt__rnn_dfree(m, copy);
    }
    return 0;

fail_work:
    if (res)
        reserve_free(m, res);
fail_space:
    if (res)
        free(res->batch_sizes);
    free(res);
fail_res:
    mt__rnn_dfree(m, copy);
    return rc;
}

int mt_rnn_forward(mt_rnn_t *m, const mt_rnn_io_t *io, mt_rnn_reserve_t **reserve)
{
    if (!m)
        return MT_EINVAL;
    if (reserve)
        *reserve = NULL;
    int rc = check_io(m, io);
    if (rc)
        return rc;
    mt__rnn_mark(m, MT_MARK_FORWARD_BEGIN, (uint64_t)io->seq_len);
    rc = forward(m, io, reserve, NULL);
    mt__rnn_mark(m, MT_MARK_FORWARD_END, (uint64_t)io->seq_len);
    return rc;
}

int mt_rnn_backward(mt_rnn_t *m, mt_rnn_reserve_t **reserve, const mt_rnn_grad_io_t *g)
{
    if (!m || !reserve || !*reserve)
        return MT_EINVAL;
    mt_rnn_reserve_t *res = *reserve;
    *reserve = NULL;
    if (res->m != m || !g || !g->dy) {
        release(res->m, res);
        return MT_EINVAL;
    }
    mt__rnn_mark(m, MT_MARK_BACKWARD_BEGIN, (uint64_t)res->io.seq_len);
    const float *w = res->wcopy;
    float *copy = NULL;
    void *work = NULL;
    int rc = 0;
    if (!w)
        rc = mt__rnn_weights_for_call(m, &w, &copy);
    if (rc == 0)
        rc = check_sums(m, res);
    if (rc == 0)
        rc = mt__rnn_dmalloc(m, m->path->bwd_work_bytes(m, &res->io), MT_TAG_WORKSPACE, &work);
    if (rc == 0) {
        rc = m->path->backward(m, w, m->dw, &res->io, res->drop_key, res->space, g, work);
        m->stats.backwards++;
    }
    mt__rnn_dfree(m, work);
    mt__rnn_dfree(m, copy);
    release(m, res);
    mt__rnn_mark(m, MT_MARK_BACKWARD_END, (uint64_t)0);
    return rc;
}

int mt_rnn_step(mt_rnn_t *m, int batch, const float *x, const float *hx, const float *cx, float *y,
                float *hy, float *cy)
{
    if (!m || batch < 1 || !x || !hy || m->shape.dirs != 1)
        return MT_EINVAL;
    if (hx && hx == hy)
        return MT_EINVAL;
    if (m->shape.mode == MT_RNN_LSTM && (!cy || (cx && cx == cy)))
        return MT_EINVAL;
    /* The step workspace (and y, if the caller passes none) stays with the module between
     * steps: generation makes no allocator call per step, and its memory is that of one
     * step whatever the number of steps. */
    size_t ybytes = (size_t)batch * (size_t)m->shape.hidden * sizeof(float);
    /* y sits after the path's workspace, whose size may be any byte count (cuDNN's is):
     * round it up so y stays aligned for floats (and vector loads). */
    mt_rnn_io_t shape = {.seq_len = 1, .batch = batch};
    size_t wbytes = (m->path->fwd_work_bytes(m, &shape, false) + 255) & ~(size_t)255;
    size_t need = wbytes + ybytes;
    if (need > m->step_ws_bytes) {
        mt__rnn_dfree(m, m->step_ws);
        m->step_ws = NULL;
        m->step_ws_bytes = 0;
        int rc = mt__rnn_dmalloc(m, need, MT_TAG_WORKSPACE, &m->step_ws);
        if (rc)
            return rc;
        m->step_ws_bytes = need;
    }
    if (!y)
        y = (float *)((char *)m->step_ws + wbytes);
    mt_rnn_io_t io = {
        .seq_len = 1, .batch = batch, .x = x, .y = y, .hx = hx, .cx = cx, .hy = hy, .cy = cy};
    return forward(m, &io, NULL, m->step_ws);
}

/* Frees the step workspace (it is re-made by the next mt_rnn_step). */
int mt_rnn_step_release(mt_rnn_t *m)
{
    if (!m)
        return MT_EINVAL;
    mt__rnn_dfree(m, m->step_ws);
    m->step_ws = NULL;
    m->step_ws_bytes = 0;
    return 0;
}

/* ---- invariants ---- */

static int violated(const mt_rnn_t *m, const char *what)
{
    rlog(m, MT_LOG_ERROR, "rnn: invariant violated: %s", what);
    return MT_EIO;
}

int mt__rnn_check(const mt_rnn_t *m)
{
    size_t rebound = 0, next = 0;
    for (size_t i = 0; i < m->nviews; i++) {
        const mt__rnn_view_t *v = &m->views[i];
        if (v->offset != next)
            return violated(m, "views do not tile the flat buffer in order");
        next += (size_t)v->rows * (size_t)v->cols;
        rebound += v->data != m->w + v->offset;
    }
    if (next != m->weight_floats)
        return violated(m, "views do not cover the flat buffer");
    if (rebound != m->rebound)
        return violated(m, "rebound count differs from the views");
    struct {
        void *p;
        size_t bytes;
        int tag;
    } blocks[] = {{m->w, m->weight_floats * sizeof(float), MT_TAG_WEIGHTS},
                  {m->dw, m->weight_floats * sizeof(float), MT_TAG_GRADS},
                  {m->step_ws, m->step_ws_bytes, MT_TAG_WORKSPACE}};
    for (int i = 0; i < 3; i++) {
        if (!blocks[i].p)
            continue;
        void *base;
        size_t size;
        int tag;
        if (mt_alloc_block_info(m->alloc, blocks[i].p, &base, &size, &tag) != 0 ||
            base != blocks[i].p || size < blocks[i].bytes || tag != blocks[i].tag)
            return violated(m, "a module buffer is not its own allocator block with its tag");
    }
    if ((m->step_ws == NULL) != (m->step_ws_bytes == 0))
        return violated(m, "step workspace and its size disagree");
    return 0;
}

/* ---- reporting ---- */

int mt_rnn_stats(const mt_rnn_t *m, mt_rnn_stats_t *out)
{
    if (!m || !out)
        return MT_EINVAL;
    *out = m->stats;
    out->flat = m->rebound == 0;
    return 0;
}

int mt_rnn_activation_bytes(const mt_rnn_t *m, int seq_len, int batch, mt_rnn_act_t *out)
{
    if (!m || !out || seq_len < 1 || batch < 1)
        return MT_EINVAL;
    mt__rnn_activation(&m->shape, seq_len, batch, out);
    mt_rnn_io_t io = {.seq_len = seq_len, .batch = batch};
    out->reserve_bytes = m->path->reserve_bytes(m, &io);
    return 0;
}

int mt_rnn_activation_bytes_packed(const mt_rnn_t *m, int seq_len, const int *batch_sizes,
                                   mt_rnn_act_t *out)
{
    if (!m || !out || seq_len < 1 || !batch_sizes)
        return MT_EINVAL;
    mt_rnn_io_t io = {.seq_len = seq_len, .batch = batch_sizes[0], .batch_sizes = batch_sizes};
    for (int t = 0; t < seq_len; t++)
        io.tokens += batch_sizes[t] > 0 ? (size_t)batch_sizes[t] : 0;
    int rc = mt__rnn_seq_check(&io, m->cfg.log, m->cfg.log_ud);
    if (rc)
        return rc;
    mt__rnn_activation(&m->shape, seq_len, io.batch, out);
    out->reserve_bytes = m->path->reserve_bytes(m, &io);
    return 0;
}
