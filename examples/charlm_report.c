/* train_charlm's memory summary and self-checks (see charlm.h). */
#include <math.h>
#include <stdio.h>

#include "charlm.h"

double charlm_mib(double b)
{
    return b / (1024.0 * 1024.0);
}

/* bytes as "12.34 MiB" or "6.0 KiB", into buf. */
static const char *human(double bytes, char buf[32])
{
    if (bytes >= 1024.0 * 1024.0)
        snprintf(buf, 32, "%.2f MiB", charlm_mib(bytes));
    else
        snprintf(buf, 32, "%.1f KiB", bytes / 1024.0);
    return buf;
}

/* Mean bits/char of batches [from, to). */
static double mean_loss(const charlm_run_t *r, uint64_t from, uint64_t to)
{
    double s = 0;
    for (uint64_t i = from; i < to; i++)
        s += r->batch_loss[i];
    return to > from ? s / (double)(to - from) : 0;
}

void charlm_memory_summary(mt_alloc_t *a, mt_host_cache_t *host, const mt_alloc_stats_t *stp,
                           const mt_backend_counters_t *bcp, mt_rnn_t *rnn, const charlm_run_t *r,
                           const charlm_opts_t *o)
{
    const mt_alloc_stats_t st = *stp;
    const mt_backend_counters_t bc = *bcp;
    double pa = (double)st.allocated_bytes[MT_STAT_ALL].peak;
    double pr = (double)st.reserved_bytes[MT_STAT_ALL].peak;
    printf("\nmemory summary (%s backend; peaks: training)\n",
           mt_backend_name(mt_alloc_backend(a)));
    printf("  peak allocated   %8.2f MiB\n", charlm_mib(pa));
    printf("  peak reserved    %8.2f MiB   (now %.2f MiB)\n", charlm_mib(pr),
           charlm_mib((double)st.reserved_bytes[MT_STAT_ALL].current));
    printf("  utilization      %8.1f %%    (peak allocated / peak reserved)\n",
           pr > 0 ? 100.0 * pa / pr : 100.0);
    printf("  backend calls    %llu malloc, %llu free   (allocator requests: %llu)\n",
           (unsigned long long)(bc.malloc_calls + bc.vm_map_calls),
           (unsigned long long)(bc.free_calls + bc.vm_unmap_calls),
           (unsigned long long)st.allocation[MT_STAT_ALL].allocated);
    mt_alloc_stats_t hs;
    CHECK(mt_alloc_stats(mt_host_cache_alloc(host), &hs));
    char h1[32], h2[32];
    printf("  pinned host      %8.2f MiB   (peak held: batch staging%s; %llu pinned segments)\n",
           charlm_mib((double)hs.reserved_bytes[MT_STAT_ALL].peak),
           o->offload ? " + offloaded activations" : "", (unsigned long long)hs.num_device_alloc);
    printf("  per tag (peak / now):\n");
    for (int t = 0; t < MT_TAG_MAX; t++) {
        const mt_stat_t *s = &st.tag_allocated_bytes[t];
        if (s->peak == 0)
            continue;
        printf("    %-12s %10s / %s\n", mt_alloc_tag_name(a, t), human((double)s->peak, h1),
               human((double)s->current, h2));
    }
    mt_rnn_act_t act;
    CHECK(mt_rnn_activation_bytes(rnn, o->max_len, o->batch, &act));
    mt_rnn_stats_t rs;
    CHECK(mt_rnn_stats(rnn, &rs));
    printf("  LSTM activations per step: %.1f KiB kept (%.0f H-vectors per step, batch row and "
           "layer) vs %.1f KiB for an op-by-op cell (%g%s)\n",
           (double)act.engine_bytes_per_step / 1024.0, act.engine_hvec,
           (double)act.opbyop_bytes_per_step / 1024.0, act.opbyop_hvec,
           o->dropout > 0.0 && o->layers > 1 ? ", with dropout's kept outputs and masks" : "");
    printf("  LSTM activations of a pass: up to %s, at most %s on the device at once",
           human((double)r->reserve_bytes, h1), human((double)r->reserve_peak_bytes, h2));
    if (o->offload)
        printf(" (offload window %d x %d steps: %llu chunks out, %llu back, %.2f MiB each way)\n",
               o->offload, mt_rnn_cfg(rnn)->chunk_steps, (unsigned long long)rs.offloads,
               (unsigned long long)rs.restores, charlm_mib((double)rs.offload_bytes));
    else
        printf(" (no offload: see --offload)\n");
    if (r->act_padded > 0)
        printf("  packed batches: %llu real tokens of %llu padded to each batch's longest line "
               "(%.1f %%); LSTM activations %s per batch on average vs %s padded (%.1f %% "
               "saved)\n",
               (unsigned long long)r->tokens, (unsigned long long)r->padded_tokens,
               100.0 * (double)r->tokens / (double)r->padded_tokens,
               human(r->act_packed / (double)r->batches, h1),
               human(r->act_padded / (double)r->batches, h2),
               100.0 * (1.0 - r->act_packed / r->act_padded));
    printf("  weight compactions: %llu, %.2f MiB copied (weights %s)\n",
           (unsigned long long)rs.compactions, charlm_mib((double)rs.compacted_bytes),
           rs.flat ? "flat" : "NOT flat: see --rebind");
}

int charlm_self_check(const charlm_opts_t *o, const charlm_run_t *r, mt_alloc_t *a,
                      mt_prefetch_t *pf)
{
    int failed = 0;
    uint64_t n = r->batches, w = n / 10 ? n / 10 : 1;
    double head = mean_loss(r, 0, w), tail = mean_loss(r, n - w, n);
    if (n < 2 || !(tail < 0.98 * head)) { /* by 2 % at least: more than rounding noise */
        fprintf(stderr,
                "train_charlm: self-check FAILED: the loss did not fall (%.3f bits/char over "
                "the first %llu batches, %.3f over the last; want 2 %% lower)\n",
                head, (unsigned long long)w, tail);
        failed++;
    }
    if (o->warmup && r->mallocs_after_warmup != 0) {
        fprintf(stderr,
                "train_charlm: self-check FAILED: %llu backend mallocs after the warm-up "
                "(want 0)\n",
                (unsigned long long)r->mallocs_after_warmup);
        failed++;
    }
    mt_prefetch_stats_t ps;
    mt_prefetch_stats(pf, &ps);
    if (r->bad_batches != 0 || ps.submitted != n || ps.consumed != n) {
        fprintf(stderr,
                "train_charlm: self-check FAILED: %llu of %llu device batches were not the "
                "planned tokens; %llu submitted, %llu released\n",
                (unsigned long long)r->bad_batches, (unsigned long long)n,
                (unsigned long long)ps.submitted, (unsigned long long)ps.consumed);
        failed++;
    }
    if (mt_alloc_check(a) != 0) {
        fprintf(stderr, "train_charlm: self-check FAILED: allocator invariants (see the log)\n");
        failed++;
    }
    if (!failed)
        printf("self-check: passed (loss %.3f -> %.3f bits/char from the first to the last %llu "
               "batches; %s; %llu batches delivered intact)\n",
               head, tail, (unsigned long long)w,
               o->warmup ? "0 backend mallocs after warm-up" : "no warm-up", (unsigned long long)n);
    return failed;
}
