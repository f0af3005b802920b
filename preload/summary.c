/* What the preload library does at exit (preload.h): the summary (MEMTRACE_SUMMARY_FILE,
 * one JSON object of what every device's allocators served, the OOMs, the tags, the events
 * counted and the profiler's figures), every device's final totals to the profiler, and the
 * profiler's end. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "preload/preload.h"

static void write_summary(mt_preload_t *P, FILE *f)
{
    mt_alloc_stats_t tot;
    memset(&tot, 0, sizeof tot);
    pthread_mutex_lock(&P->mu); /* what dropped devices served: counters, not levels */
    tot.allocation[0].allocated = P->gone.allocation[0].allocated;
    tot.allocation[0].freed = P->gone.allocation[0].freed;
    tot.num_device_alloc = P->gone.num_device_alloc;
    tot.num_device_free = P->gone.num_device_free;
    tot.num_ooms = P->gone.num_ooms;
    tot.num_alloc_retries = P->gone.num_alloc_retries;
    pthread_mutex_unlock(&P->mu);
    const char *tag_names[MT_TAG_MAX] = {0};
    int ndev = 0;
    /* The program's managed memory served by memtrace (its managed allocators). */
    uint64_t m_allocs = 0, m_bytes = 0, m_peak = 0, m_prefetches = 0, m_advises = 0;
    for (int d = 0; d < 2 * P->ndevices; d++) {
        mt_alloc_t *a = mt__preload_nth(P, d);
        mt_alloc_stats_t st;
        if (a == NULL || mt_alloc_stats(a, &st) != 0)
            continue;
        mt_managed_stats_t ms;
        if (d >= P->ndevices && mt_alloc_managed_stats(a, &ms) == 0) {
            m_allocs += st.allocation[0].allocated;
            m_bytes += (uint64_t)st.allocated_bytes[0].current;
            m_peak += (uint64_t)st.allocated_bytes[0].peak;
            m_prefetches += ms.prefetches;
            m_advises += ms.advises;
        }
        ndev += d < P->ndevices;
        tot.allocated_bytes[0].peak += st.allocated_bytes[0].peak;
        tot.allocated_bytes[0].current += st.allocated_bytes[0].current;
        tot.reserved_bytes[0].peak += st.reserved_bytes[0].peak;
        tot.reserved_bytes[0].current += st.reserved_bytes[0].current;
        tot.allocation[0].allocated += st.allocation[0].allocated;
        tot.allocation[0].freed += st.allocation[0].freed;
        tot.num_device_alloc += st.num_device_alloc;
        tot.num_device_free += st.num_device_free;
        tot.num_ooms += st.num_ooms;
        tot.num_alloc_retries += st.num_alloc_retries;
        tot.capacity += st.capacity;
        for (int t = 0; t < MT_TAG_MAX; t++) {
            tot.tag_allocated_bytes[t].peak += st.tag_allocated_bytes[t].peak;
            tot.tag_allocated_bytes[t].allocated += st.tag_allocated_bytes[t].allocated;
            if (st.tag_allocated_bytes[t].allocated > 0 && tag_names[t] == NULL)
                tag_names[t] = mt_alloc_tag_name(a, t);
        }
    }
    const char *bname = P->init_rc != 0 ? "none" : P->sim ? "sim" : "cuda";
    double util = tot.reserved_bytes[0].peak > 0
                      ? (double)tot.allocated_bytes[0].peak / (double)tot.reserved_bytes[0].peak
                      : 1.0;
    fprintf(f, "{\"v\":1,\"pid\":%d,\"backend\":\"%s\",\"devices_used\":%d,", (int)getpid(), bname,
            ndev);
    fprintf(f, "\"capacity\":%llu,", (unsigned long long)tot.capacity);
    fprintf(f, "\"peak_allocated\":%lld,\"peak_reserved\":%lld,",
            (long long)tot.allocated_bytes[0].peak, (long long)tot.reserved_bytes[0].peak);
    fprintf(f, "\"allocated\":%lld,\"reserved\":%lld,\"utilization\":%.4f,",
            (long long)tot.allocated_bytes[0].current, (long long)tot.reserved_bytes[0].current,
            util);
    fprintf(f, "\"requests\":%llu,\"frees\":%llu,\"backend_mallocs\":%llu,",
            (unsigned long long)tot.allocation[0].allocated,
            (unsigned long long)tot.allocation[0].freed, (unsigned long long)tot.num_device_alloc);
    fprintf(f, "\"backend_frees\":%llu,\"alloc_retries\":%llu,",
            (unsigned long long)tot.num_device_free, (unsigned long long)tot.num_alloc_retries);
    fprintf(f, "\"host_allocs\":%llu,\"unknown_frees\":%llu,",
            (unsigned long long)atomic_load(&P->host_allocs),
            (unsigned long long)atomic_load(&P->unknown_frees));
    fprintf(f,
            "\"managed\":{\"requests\":%llu,\"allocated\":%llu,\"peak_allocated\":%llu,"
            "\"prefetches\":%llu,\"advises\":%llu},",
            (unsigned long long)m_allocs, (unsigned long long)m_bytes, (unsigned long long)m_peak,
            (unsigned long long)m_prefetches, (unsigned long long)m_advises);
    fprintf(f, "\"ooms\":%llu,\"oom_message\":\"", (unsigned long long)atomic_load(&P->ooms));
    pthread_mutex_lock(&P->oom_mu);
    for (const char *c = P->oom_msg; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if ((unsigned char)*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    pthread_mutex_unlock(&P->oom_mu);
    fprintf(f, "\",\"tags\":{");
    bool first = true;
    for (int t = 0; t < MT_TAG_MAX; t++) {
        if (tot.tag_allocated_bytes[t].allocated == 0)
            continue;
        fprintf(f, "%s\"%s\":{\"peak\":%lld,\"total\":%llu}", first ? "" : ",",
                tag_names[t] ? tag_names[t] : mt_tag_builtin_name(t),
                (long long)tot.tag_allocated_bytes[t].peak,
                (unsigned long long)tot.tag_allocated_bytes[t].allocated);
        first = false;
    }
    fprintf(f, "},\"events\":{");
    first = true;
    for (int k = 1; k < MT_EV_KIND_COUNT; k++) {
        uint64_t n = atomic_load(&P->ev_count[k]);
        if (n == 0)
            continue;
        fprintf(f, "%s\"%s\":%llu", first ? "" : ",", mt_event_kind_name(k), (unsigned long long)n);
        first = false;
    }
    fprintf(f, "}");
    if (P->prof != NULL) {
        mt_prof_stats_t ps;
        mt_prof_stats(P->prof, &ps);
        const char *lp = mt_prof_log_path(P->prof);
        fprintf(f,
                ",\"telemetry\":\"%s\",\"events_emitted\":%llu,\"events_dropped\":%llu,"
                "\"lossless\":%s,\"lossless_waits\":%llu,\"lossless_stalls\":%llu",
                mt_prof_mode_name(ps.mode), (unsigned long long)ps.emitted,
                (unsigned long long)ps.dropped, ps.lossless ? "true" : "false",
                (unsigned long long)ps.lossless_waits, (unsigned long long)ps.lossless_stalls);
        if (lp != NULL)
            fprintf(f, ",\"event_log\":\"%s\"", lp);
    }
    fprintf(f, "}\n");
}

void mt__preload_at_exit(void)
{
    mt_preload_t *P = mt__preload();
    mt__guard_enter();
    if (P->summary_path != NULL) {
        FILE *f = fopen(P->summary_path, "w");
        if (f != NULL) {
            write_summary(P, f);
            fclose(f);
        }
    }
    /* The final totals of every device, to the profiler too (a stats event each). */
    for (int d = 0; d < 2 * P->ndevices; d++) {
        mt_alloc_t *a = mt__preload_nth(P, d);
        if (a != NULL)
            mt_alloc_emit(a, MT_EV_STATS, 0, 0, MT_TAG_OTHER);
    }
    if (P->prof != NULL) {
        /* Stop forwarding, then take every allocator's lock once (mt_alloc_stats) so
         * that no emit still running can touch the profiler we are about to destroy. */
        atomic_store(&P->prof_live, false);
        for (int d = 0; d < 2 * P->ndevices; d++) {
            mt_alloc_t *a = mt__preload_nth(P, d);
            mt_alloc_stats_t st;
            if (a != NULL)
                mt_alloc_stats(a, &st);
        }
        mt_prof_destroy(&P->prof);
    }
    mt__guard_leave();
}
