/* The RNN module's lifecycle: configuration defaults, the choice of compute path and GEMM
 * library, create (the flat weight and gradient buffers, the parameter views, the initial
 * weights) and destroy, the settings a module takes after create, and the checker of the
 * invariants at mt_rnn_s. Also the allocation helpers every file of the module uses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "mt_config.h"
#include "rnn/internal.h"

#define rlog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

/* ---- allocation helpers ---- */

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

/* ---- path, GEMM library and initial weights ---- */

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

/* The default GEMM library of the cpu path at one thread and at two or more
 * (docs/rnn-cpu.md, GEMM libraries and their selection): oneDNN at one; at two or more the
 * linked OpenBLAS where its thread count can be set for each part, else BLIS. Builds with
 * AddressSanitizer keep the linked CBLAS: LeakSanitizer's exit-time tracer crashes in a
 * process that runs oneDNN's or BLIS's OpenMP threads (libgomp), failing every test at exit. */
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
    if (threads >= 2 && mt__rnn_gemm_get("cblas", out) == 0 && mt__rnn_gemm_halves(*out))
        return 0;
    if (threads >= 2 && mt__rnn_gemm_get(MT__RNN_GEMM_DEFAULT_MT, out) == 0)
        return 0;
    if (mt__rnn_gemm_get(MT__RNN_GEMM_DEFAULT, out) == 0)
        return 0;
    return mt__rnn_gemm_get("cblas", out);
}

/* cfg->gemm, else the default (*is_default). */
static int select_gemm(const mt_rnn_cfg_t *cfg, const mt__rnn_gemm_t **out, bool *is_default)
{
    const char *want = cfg->gemm && *cfg->gemm && strcmp(cfg->gemm, "auto") != 0 ? cfg->gemm : NULL;
    *is_default = !want;
    if (!want)
        return default_gemm(1, out);
    int rc = mt__rnn_gemm_get(want, out);
    if (rc)
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "rnn: GEMM library \"%s\" %s: expected cblas, blis or dnnl, loadable here "
                 "(libblis.so.4, libdnnl.so.2)",
                 want, rc == MT_EINVAL ? "is unknown" : "cannot be loaded");
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
        rc = mt__rnn_isa_check(cfg->log, cfg->log_ud);
        if (rc == 0)
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
    mt__rnn_par_destroy(&m->shape.par);
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
    /* One worker fewer than the parts a job is cut into; a pool too small is replaced. */
    int workers = threads < MT__RNN_PARTS_MAX ? threads - 1 : MT__RNN_PARTS_MAX - 1;
    if (workers > mt__rnn_par_workers(m->shape.par)) {
        mt__rnn_par_t *p;
        int rc = mt__rnn_par_create(&p, workers);
        if (rc)
            return rc;
        mt__rnn_par_destroy(&m->shape.par);
        m->shape.par = p;
    }
    int rc = mt__rnn_gemm_set_threads(g, threads);
    if (rc == 0) {
        m->shape.gemm = g;
        m->shape.threads = threads;
    }
    return rc;
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
