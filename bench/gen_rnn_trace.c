/* Generates data/traces/rnn_varlen.csv: the allocation trace of a 2-layer LSTM language
 * model trained op by op (PyTorch-style autograd, one CUDA stream) on batches of random
 * sequence length. It is the variable-shape workload on which caching allocators fragment:
 * every iteration's activations and temporaries have sizes proportional to its sequence
 * length T, while weights, gradients and optimizer state are allocated once.
 *
 * Per iteration (B sequences of T tokens, T uniform in [T_MIN, T_MAX]):
 *   batch      token ids and targets (B*T int64)
 *   forward    embedding output (T*B*E); per layer: input projection of all steps at once
 *              (workspace T*B*4H), then per step gates (B*4H), cell (B*H), a tanh(c)
 *              temporary and h (B*H) that live until backward; the layer output (T*B*H);
 *              logits (T*B*V) and their log-softmax, loss
 *   backward   gradients of log-softmax and logits (T*B*V), per layer and step (in
 *              reverse) the gate gradient and the carried dh/dc, activations freed as
 *              backward passes them; parameter gradients allocated at first use
 *   optimizer  Adam state (exp_avg, exp_avg_sq) allocated at the first step; one
 *              temporary per parameter per step
 * Pointers come from a simple model of a caching allocator (exact-size reuse, otherwise
 * fresh addresses), so a pointer reappears after its free as in real traces.
 *
 * Deterministic: the same seed and arguments give the same file, byte for byte.
 * usage: gen_rnn_trace [OUT.csv] [--seed N] [--iterations N] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    BATCH = 32,    /* sequences per batch */
    EMBED = 512,   /* embedding width */
    HIDDEN = 1024, /* LSTM hidden size */
    LAYERS = 2,
    VOCAB = 8192,
    T_MIN = 8, /* sequence length range, tokens */
    T_MAX = 64,
    F32 = 4,
    I64 = 8,
};

#define THREAD_ID 4711u

typedef struct gen_s {
    FILE *out;
    uint64_t rng;      /* splitmix64 state */
    uint64_t clock_us; /* logical time of the next row */
    uint64_t next_addr;
    size_t rows;
    /* Freed addresses by exact size (a small open table of LIFO stacks). */
    struct {
        uint64_t size;
        uint64_t *addr;
        size_t n, cap;
    } reuse[256];
    size_t nreuse;
} gen_t;

typedef struct buf_s {
    uint64_t ptr;
    uint64_t size;
} buf_t;

static uint64_t next_rand(gen_t *g)
{
    uint64_t z = (g->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static unsigned uniform(gen_t *g, unsigned lo, unsigned hi)
{
    return lo + (unsigned)(next_rand(g) % (hi - lo + 1));
}

static void row(gen_t *g, const char *action, uint64_t ptr, uint64_t size)
{
    uint64_t us = g->clock_us;
    fprintf(g->out,
            "%u,%02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 ".%06" PRIu64 ",%s,0x%" PRIx64 ",%" PRIu64
            ",0\n",
            THREAD_ID, (us / 3600000000u) % 24, (us / 60000000u) % 60, (us / 1000000u) % 60,
            us % 1000000u, action, ptr, size);
    g->rows++;
    /* Kernels between allocator calls take a few to tens of microseconds. */
    g->clock_us += 1 + next_rand(g) % 40;
}

static size_t reuse_slot(gen_t *g, uint64_t size)
{
    for (size_t i = 0; i < g->nreuse; i++)
        if (g->reuse[i].size == size)
            return i;
    if (g->nreuse == sizeof g->reuse / sizeof g->reuse[0]) {
        fprintf(stderr, "gen_rnn_trace: too many distinct sizes\n");
        exit(1);
    }
    g->reuse[g->nreuse].size = size;
    return g->nreuse++;
}

static buf_t alloc(gen_t *g, uint64_t size)
{
    size_t i = reuse_slot(g, size);
    buf_t b = {0, size};
    if (g->reuse[i].n > 0) {
        b.ptr = g->reuse[i].addr[--g->reuse[i].n];
    } else {
        b.ptr = g->next_addr;
        g->next_addr += (size + 511) / 512 * 512;
    }
    row(g, "allocate", b.ptr, size);
    return b;
}

static void release(gen_t *g, buf_t *b)
{
    size_t i = reuse_slot(g, b->size);
    if (g->reuse[i].n == g->reuse[i].cap) {
        size_t cap = g->reuse[i].cap ? g->reuse[i].cap * 2 : 16;
        uint64_t *a = realloc(g->reuse[i].addr, cap * sizeof *a);
        if (a == NULL) {
            fprintf(stderr, "gen_rnn_trace: out of memory\n");
            exit(1);
        }
        g->reuse[i].addr = a;
        g->reuse[i].cap = cap;
    }
    g->reuse[i].addr[g->reuse[i].n++] = b->ptr;
    row(g, "free", b->ptr, b->size);
    b->ptr = 0;
}

/* ---- the model ---- */

enum { P_EMBED, P_W0, P_R0, P_B0, P_W1, P_R1, P_B1, P_PROJ, P_PROJ_B, NPARAM };

static uint64_t param_size(int p)
{
    switch (p) {
    case P_EMBED:
        return (uint64_t)VOCAB * EMBED * F32;
    case P_W0:
        return (uint64_t)4 * HIDDEN * EMBED * F32;
    case P_W1:
        return (uint64_t)4 * HIDDEN * HIDDEN * F32;
    case P_R0:
    case P_R1:
        return (uint64_t)4 * HIDDEN * HIDDEN * F32;
    case P_B0:
    case P_B1:
        return (uint64_t)8 * HIDDEN * F32; /* input and recurrent biases */
    case P_PROJ:
        return (uint64_t)HIDDEN * VOCAB * F32;
    default:
        return (uint64_t)VOCAB * F32;
    }
}

typedef struct model_s {
    buf_t w[NPARAM], grad[NPARAM], m[NPARAM], v[NPARAM];
    /* per layer and step: gates, cell, hidden; live from forward to backward */
    buf_t gates[LAYERS][T_MAX], cell[LAYERS][T_MAX], hid[LAYERS][T_MAX];
    buf_t y[LAYERS];
} model_t;

static void grad_at_first_use(gen_t *g, model_t *m, int p)
{
    if (m->grad[p].ptr == 0)
        m->grad[p] = alloc(g, param_size(p));
}

static void iteration(gen_t *g, model_t *m, unsigned T)
{
    const uint64_t B = BATCH, H = HIDDEN;
    buf_t tokens = alloc(g, B * T * I64);
    buf_t targets = alloc(g, B * T * I64);

    /* ---- forward ---- */
    buf_t emb = alloc(g, T * B * EMBED * F32);
    for (int l = 0; l < LAYERS; l++) {
        /* One GEMM projects the inputs of every step: x W^T for all T at once. */
        buf_t xproj = alloc(g, T * B * 4 * H * F32);
        for (unsigned t = 0; t < T; t++) {
            m->gates[l][t] = alloc(g, B * 4 * H * F32);
            m->cell[l][t] = alloc(g, B * H * F32);
            buf_t tanh_c = alloc(g, B * H * F32);
            m->hid[l][t] = alloc(g, B * H * F32);
            release(g, &tanh_c);
        }
        release(g, &xproj);
        m->y[l] = alloc(g, T * B * H * F32); /* stacked h, the next layer's input */
    }
    buf_t logits = alloc(g, T * B * VOCAB * F32);
    buf_t logp = alloc(g, T * B * VOCAB * F32);
    release(g, &logits);
    buf_t loss = alloc(g, F32);

    /* ---- backward ---- */
    buf_t dlogp = alloc(g, T * B * VOCAB * F32);
    release(g, &loss);
    buf_t dlogits = alloc(g, T * B * VOCAB * F32);
    release(g, &dlogp);
    release(g, &logp);
    grad_at_first_use(g, m, P_PROJ);
    grad_at_first_use(g, m, P_PROJ_B);
    buf_t dy = alloc(g, T * B * H * F32);
    release(g, &dlogits);
    for (int l = LAYERS - 1; l >= 0; l--) {
        int pw = l == 0 ? P_W0 : P_W1, pr = l == 0 ? P_R0 : P_R1, pb = l == 0 ? P_B0 : P_B1;
        uint64_t in = l == 0 ? EMBED : H;
        buf_t dgates_all = alloc(g, T * B * 4 * H * F32); /* for the merged weight GEMMs */
        buf_t dh = alloc(g, B * H * F32), dc = alloc(g, B * H * F32);
        for (int t = (int)T - 1; t >= 0; t--) {
            buf_t dh_prev = alloc(g, B * H * F32);
            buf_t dc_prev = alloc(g, B * H * F32);
            release(g, &m->hid[l][t]);
            release(g, &m->cell[l][t]);
            release(g, &m->gates[l][t]);
            release(g, &dh);
            release(g, &dc);
            dh = dh_prev;
            dc = dc_prev;
        }
        release(g, &dh);
        release(g, &dc);
        grad_at_first_use(g, m, pw);
        grad_at_first_use(g, m, pr);
        grad_at_first_use(g, m, pb);
        buf_t dx = alloc(g, T * B * in * F32);
        release(g, &dgates_all);
        release(g, &dy);
        release(g, &m->y[l]);
        dy = dx;
    }
    grad_at_first_use(g, m, P_EMBED);
    release(g, &dy);
    release(g, &emb);
    release(g, &targets);
    release(g, &tokens);

    /* ---- optimizer (Adam) ---- */
    for (int p = 0; p < NPARAM; p++) {
        if (m->m[p].ptr == 0) {
            m->m[p] = alloc(g, param_size(p));
            m->v[p] = alloc(g, param_size(p));
        }
        buf_t denom = alloc(g, param_size(p));
        release(g, &denom);
    }
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    uint64_t seed = 20261121;
    unsigned iterations = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
            iterations = (unsigned)strtoul(argv[++i], NULL, 0);
        else if (argv[i][0] != '-' && path == NULL)
            path = argv[i];
        else {
            fprintf(stderr, "usage: gen_rnn_trace [OUT.csv] [--seed N] [--iterations N]\n");
            return 2;
        }
    }
    gen_t g = {.out = stdout,
               .rng = seed,
               .clock_us = 10ull * 3600 * 1000000,
               .next_addr = 0x7f3a00000000ull};
    if (path != NULL && (g.out = fopen(path, "w")) == NULL) {
        perror(path);
        return 1;
    }
    fprintf(g.out, "Thread,Time,Action,Pointer,Size,Stream\n");
    static model_t m;
    for (int p = 0; p < NPARAM; p++)
        m.w[p] = alloc(&g, param_size(p));
    for (unsigned it = 0; it < iterations; it++)
        iteration(&g, &m, uniform(&g, T_MIN, T_MAX));
    /* End of training: the program frees its model. */
    for (int p = 0; p < NPARAM; p++) {
        release(&g, &m.v[p]);
        release(&g, &m.m[p]);
        release(&g, &m.grad[p]);
        release(&g, &m.w[p]);
    }
    for (size_t i = 0; i < g.nreuse; i++)
        free(g.reuse[i].addr);
    if (fflush(g.out) != 0 || (path != NULL && fclose(g.out) != 0)) {
        perror(path ? path : "stdout");
        return 1;
    }
    fprintf(stderr, "gen_rnn_trace: %zu rows, seed %" PRIu64 ", %u iterations\n", g.rows, seed,
            iterations);
    return 0;
}
