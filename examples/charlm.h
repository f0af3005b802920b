/* train_charlm's parts (the README demo): the text and its batches through the prefetcher
 * (charlm_batches.c), the memory summary and the self-checks (charlm_report.c), the
 * data-parallel step over several devices (charlm_dp.c). Options, the model and the
 * training loop live in train_charlm.c. */
#ifndef CHARLM_H
#define CHARLM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "memtrace/alloc.h"
#include "memtrace/host.h"
#include "memtrace/rnn.h"

/* A failed memtrace call ends the program: it is a demo, every failure is fatal. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) {                                                                                 \
            fprintf(stderr, "train_charlm: %s failed: %s\n", #call, mt_strerror(rc_));             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct charlm_opts_s {
    int epochs, hidden, layers, batch, min_len, max_len, sample;
    int offload, chunk_steps; /* activation offload window (chunks), steps per chunk */
    uint64_t seed;
    double lr;
    double dropout; /* between LSTM layers, in [0, 1); 0 = none */
    bool warmup;
    bool prefetch; /* false: each batch is copied on the compute stream when needed */
    bool rebind;   /* U1 demo: move one LSTM weight out of the flat buffer */
    int devices;   /* data parallel over this many (sim) devices; 1 = none */
    const char *text;
    const char *loss_log; /* every batch's loss (bits/char), one a line; NULL = none */
} charlm_opts_t;

#define CHARLM_EMBED   64
#define CHARLM_DEV_MAX 8

/* One trainable tensor with its gradient and Adam moments (all allocator memory). */
typedef struct charlm_param_s {
    float *w, *g, *m, *v;
    size_t n;
} charlm_param_t;

/* The model on one device. The head (embedding, linear layer) is one flat buffer hw of hn
 * floats, emb | wo | bo, and its gradients one flat buffer hg in the same layout, so that
 * a replica is refreshed by one copy of each flat buffer. A replica (charlm_dp.c) has no
 * Adam moments (p[i].m, .v NULL): the optimizer steps on device 0 only. */
typedef struct charlm_model_s {
    mt_alloc_t *a;
    mt_rnn_t *rnn;
    int V, H, L;
    int logits_tag;      /* user tag of the [T*B, V] logits */
    float *hw, *hg;      /* head weights and gradients, hn floats each */
    size_t hn;           /* V*EMBED + V*H + V */
    float *emb, *demb;   /* [V, EMBED], views of hw / hg */
    float *wo, *dwo;     /* [V, H] */
    float *bo, *dbo;     /* [V] */
    charlm_param_t p[4]; /* rnn flat, emb, wo, bo */
    long adam_t;
    float *h[2], *c[2]; /* ping-pong states [L, B, H] */
    int cur;            /* which of h/c holds the current state */
} charlm_model_t;

/* train_charlm.c: forward + backward of the packed batch p (tokens in -> targets tg, packed
 * order) on md's device; gradients accumulate, scaled by 1 / norm_tokens (the global
 * batch's tokens, so that devices' gradients sum to the whole batch's). Returns the summed
 * cross-entropy in nats. */
double charlm_train_step(charlm_model_t *md, const unsigned char *in, const unsigned char *tg,
                         const mt_rnn_pack_t *p, size_t norm_tokens);
/* The head's flat buffers and their views on allocator a (weights not initialised). */
void charlm_head_alloc(charlm_model_t *md, mt_alloc_t *a, int V, int H);

/* ---- data parallel over devices (charlm_dp.c) ---- */

/* Replicas of the model on devices 1..n-1 of b0's group, each with its own allocator (into
 * the same event sink). Per step: the weights are broadcast (one peer copy per flat buffer
 * and replica: the LSTM's and the head's), the batch's sequences are dealt round-robin to
 * the devices, each device runs forward and backward on its own thread and stream, the
 * gradients come back to device 0 (one peer copy per flat buffer and replica, then a sum),
 * and the caller takes the optimizer step on device 0. With rebind, each replica's
 * weight_hh_l0 lives outside its flat buffer (as torch's replicate leaves parameters): the
 * broadcast then copies parameter by parameter and each replica warns once and compacts on
 * every call. Invariants: n <= CHARLM_DEV_MAX; rep[d] for 1 <= d < n is a replica on a[d]. */
typedef struct charlm_dp_s {
    int n;
    mt_backend_t *b[CHARLM_DEV_MAX];
    mt_alloc_t *a[CHARLM_DEV_MAX]; /* a[0] = the model's */
    charlm_model_t rep[CHARLM_DEV_MAX];
    float *moved[CHARLM_DEV_MAX]; /* rebind: the replica's weight_hh_l0 */
    float *recv_rnn, *recv_head;  /* device 0: gradients received from a replica */
    bool rebind;
    uint64_t steps, copies, bytes; /* peer copies and bytes of the training steps */
} charlm_dp_t;

/* 2 <= n <= the backend's devices; model md on device 0 with allocator md->a over backend b0; acfg is the
 * template of the replicas' allocators (backend replaced). */
void charlm_dp_init(charlm_dp_t *dp, charlm_model_t *md, mt_backend_t *b0,
                    const mt_alloc_cfg_t *acfg, int n, bool rebind);
/* One data-parallel step of packed batch p (as charlm_train_step, whole batch). */
double charlm_dp_step(charlm_dp_t *dp, charlm_model_t *md, const unsigned char *in,
                      const unsigned char *tg, const mt_rnn_pack_t *p);
/* Backend mallocs and maps of the replicas' devices so far. */
uint64_t charlm_dp_backend_allocs(const charlm_dp_t *dp);
/* Per-device memory and the copies per step, then the replicas' compactions. */
void charlm_dp_summary(const charlm_dp_t *dp);
void charlm_dp_fini(charlm_dp_t *dp);

/* splitmix64: the seeded sequence of weights, batch lengths and sampling. */
static inline uint64_t charlm_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- the text and its batches (charlm_batches.c) ---- */

typedef struct charlm_text_s {
    unsigned char *ids; /* token ids, n */
    size_t n;
    int V;
    unsigned char chars[256]; /* id -> byte */
    double entropy_bits;      /* unigram entropy of the text, bits per character */
} charlm_text_t;

int charlm_load_text(const char *path, charlm_text_t *t);

#define CHARLM_AHEAD_MAX 4 /* batches submitted to the prefetcher and not yet trained, at most */

/* A sequence of the text: the tokens [off, off + len) predict [off + 1, off + len + 1). */
typedef struct charlm_seg_s {
    size_t off;
    int len;
} charlm_seg_t;

/* Splits the text into its lines (each with its newline as the last target), the lines
 * longer than max_len cut into pieces of max_len, those shorter than min_len (empty lines
 * too) joined with the line after them. *out is new (free). Returns the count. */
size_t charlm_segments(const charlm_text_t *t, int min_len, int max_len, charlm_seg_t **out);

/* One planned batch: `count` consecutive sequences from `first`, packed (sorted by length,
 * as the engine takes them; pack is owned by the plan). */
typedef struct charlm_plan_s {
    int epoch;
    size_t first;
    int count;
    mt_rnn_pack_t pack;
} charlm_plan_t;

/* The batch plan: B sequences (lines) at a time at their natural lengths, pass after pass
 * over the text. A batch is planned when it is submitted to the prefetcher, which knows
 * bytes only, so the plans of the batches in flight wait in queue. Invariants: count <=
 * CHARLM_AHEAD_MAX; queue[(head + i) % CHARLM_AHEAD_MAX] for i < count are the batches
 * submitted and not yet trained, oldest first. */
typedef struct charlm_loader_s {
    const charlm_text_t *text;
    const charlm_seg_t *seg;
    size_t nseg;
    int B, max_len, epochs;
    size_t next; /* the sequence the next plan starts with, in epoch */
    int epoch;
    charlm_plan_t queue[CHARLM_AHEAD_MAX];
    unsigned head, count;
} charlm_loader_t;

/* Plans the next batch and queues its copy (inputs then targets, each in packed order);
 * false when the run has no batch left (or CHARLM_AHEAD_MAX are in flight). */
bool charlm_submit_next(charlm_loader_t *l, mt_prefetch_t *pf);
/* Takes the plan of the oldest batch in flight (the caller owns it: charlm_plan_fini);
 * false if none is. */
bool charlm_pop(charlm_loader_t *l, charlm_plan_t *out);
void charlm_plan_fini(charlm_plan_t *p);
/* True if the device batch holds exactly the planned tokens (so its copy had completed
 * before the CPU read it). */
bool charlm_batch_matches(const charlm_loader_t *l, const charlm_plan_t *p, const unsigned char *in,
                          const unsigned char *tg);

/* ---- reporting (charlm_report.c) ---- */

/* What the training loop measured, for the summary and the self-checks. */
typedef struct charlm_run_s {
    double first_loss, last_loss;             /* bits/char of the first and last epoch */
    double *batch_loss;                       /* bits/char of every batch, batches */
    uint64_t batches, bad_batches;            /* bad: the device batch was not the planned tokens */
    uint64_t ready;                           /* batches whose copy had completed when handed out */
    double wait_s;                            /* host time spent waiting for batch copies */
    uint64_t mallocs_after_warmup;            /* backend mallocs during training */
    size_t reserve_bytes, reserve_peak_bytes; /* largest LSTM reserve of a pass; most of one
                                               * on the device at once */
    double act_packed, act_padded;  /* LSTM reserve bytes summed over batches, packed and as
                                     * they would be padded to each batch's longest line */
    uint64_t tokens, padded_tokens; /* real tokens trained, and with that padding */
} charlm_run_t;

double charlm_mib(double bytes);
/* st and bc: taken at the end of training (sampling resets the peak afterwards). */
void charlm_memory_summary(mt_alloc_t *a, mt_host_cache_t *host, const mt_alloc_stats_t *st,
                           const mt_backend_counters_t *bc, mt_rnn_t *rnn, const charlm_run_t *r,
                           const charlm_opts_t *o);
/* The program's own checks, for conditions that do not depend on timing. Returns the
 * number that failed, after saying which on stderr. */
int charlm_self_check(const charlm_opts_t *o, const charlm_run_t *r, mt_alloc_t *a,
                      mt_prefetch_t *pf);

#endif
