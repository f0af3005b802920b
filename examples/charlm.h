/* train_charlm's parts (the README demo): the text and its batches through the prefetcher
 * (charlm_batches.c), the memory summary and the self-checks (charlm_report.c). Options,
 * the model and the training loop live in train_charlm.c. */
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
    const char *text;
} charlm_opts_t;

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
