/* The replay engine: a loaded allocation trace (trace_csv.h) through the caching allocator
 * on the sim backend, measured. Used by `memtrace replay` and bench_alloc, so both report
 * the same figures measured the same way.
 *
 * The trace is loaded and checked completely first (trace_csv.c), so the timed loop does
 * no parsing or hashing: pointers became slot numbers and each slot holds our pointer. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "analysis/model.h"
#include "analysis/replay.h"
#include "analysis/trace_csv.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"

mt_replay_cfg_t mt__replay_cfg_default(void)
{
    return (mt_replay_cfg_t){.rounds = 1};
}

size_t mt__replay_capacity_for(uint64_t peak_reserved)
{
    uint64_t need = peak_reserved > UINT64_MAX / 2 ? UINT64_MAX : peak_reserved * 2;
    return need > (UINT64_C(8) << 30) && need <= SIZE_MAX ? (size_t)need : 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One fresh backend and allocator, set up as cfg says. */
typedef struct session_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_stream_t **streams; /* per trace stream index; NULL = default stream */
    size_t nstreams;
    void **ptrs; /* per slot: our pointer while the slot is live, else NULL */
} session_t;

static void session_close(session_t *s)
{
    if (s->a != NULL)
        mt_alloc_destroy(&s->a);
    /* streams is NULL when its allocation failed in session_open */
    for (size_t i = 0; s->streams != NULL && i < s->nstreams; i++)
        if (s->streams[i] != NULL)
            mt_stream_destroy(s->b, &s->streams[i]);
    if (s->b != NULL)
        mt_backend_destroy(&s->b);
    free(s->streams);
    free(s->ptrs);
    memset(s, 0, sizeof *s);
}

static int session_open(session_t *s, const mt_trace_t *t, const mt_replay_cfg_t *cfg, char *err,
                        size_t errlen)
{
    memset(s, 0, sizeof *s);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    /* The replay models the sim the environment describes (docs/process-state.md: not
     * moved to the tool's edge yet); cmd_replay has refused a malformed variable. */
    (void)mt_backend_cfg_from_env(&bc, NULL, 0);
    bc.kind = MT_BACKEND_SIM;
    if (cfg->capacity != 0)
        bc.sim_capacity = cfg->capacity;
    int rc = mt_backend_create(&s->b, &bc);
    if (rc < 0) {
        snprintf(err, errlen, "cannot create the sim backend: %s", mt_strerror(rc));
        return rc;
    }
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = s->b;
    const char *source = "MEMTRACE_ALLOC_CONF";
    if ((rc = mt_alloc_cfg_from_env(&ac, err, errlen)) < 0)
        goto fail_conf;
    source = "--alloc-conf";
    if (cfg->alloc_conf != NULL && (rc = mt_alloc_cfg_parse(&ac, cfg->alloc_conf, err, errlen)) < 0)
        goto fail_conf;
    if ((rc = mt_alloc_create(&s->a, &ac)) < 0) {
        snprintf(err, errlen, "cannot create the allocator: %s", mt_strerror(rc));
        goto fail;
    }
    s->nstreams = t->nstreams;
    s->streams = calloc(t->nstreams ? t->nstreams : 1, sizeof *s->streams);
    s->ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *s->ptrs);
    if (s->streams == NULL || s->ptrs == NULL) {
        snprintf(err, errlen, "out of memory");
        rc = MT_ENOMEM;
        goto fail;
    }
    /* Trace streams become backend streams, except the default stream (0) which is NULL.
     * They are made before any timing: creating a stream starts a worker thread. */
    for (size_t i = 0; i < t->nstreams; i++) {
        if (t->streams[i] != 0 && (rc = mt_stream_create(s->b, &s->streams[i])) < 0) {
            snprintf(err, errlen, "cannot create stream %zu: %s", i, mt_strerror(rc));
            goto fail;
        }
    }
    return 0;
fail_conf : {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", err);
    snprintf(err, errlen, "%s: %s", source, msg);
}
fail:
    session_close(s);
    return rc;
}

/* Peak state seen by a sampled pass. */
typedef struct peak_sample_s {
    int64_t allocated;
    mt_alloc_stats_t at;
} peak_sample_t;

/* Runs every op once. Returns 0 or an allocator error other than MT_ENOMEM. */
static int pass(session_t *s, const mt_trace_t *t, peak_sample_t *sample, uint64_t *ooms, char *err,
                size_t errlen)
{
    mt_alloc_stats_t st;
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        int rc;
        if (op->action == MT_TRACE_ALLOCATE) {
            rc = mt_alloc_malloc(s->a, op->size, s->streams[op->stream], MT_TAG_OTHER,
                                 &s->ptrs[op->slot]);
            if (rc == MT_ENOMEM) {
                s->ptrs[op->slot] = NULL;
                (*ooms)++;
                continue;
            }
            if (rc == 0 && sample != NULL && mt_alloc_stats(s->a, &st) == 0 &&
                st.allocated_bytes[MT_STAT_ALL].current > sample->allocated) {
                sample->allocated = st.allocated_bytes[MT_STAT_ALL].current;
                sample->at = st;
            }
        } else {
            rc = mt_alloc_free(s->a, s->ptrs[op->slot]);
            s->ptrs[op->slot] = NULL;
        }
        if (rc < 0) {
            snprintf(err, errlen, "op %zu (%s of %llu bytes): %s", i,
                     mt__trace_action_name(op->action), (unsigned long long)op->size,
                     mt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* Frees what the trace left live, so the next pass (or the warm-up's end) starts empty. */
static void free_leftovers(session_t *s, const mt_trace_t *t)
{
    for (size_t i = 0; i < t->nslots; i++)
        if (s->ptrs[i] != NULL) {
            mt_alloc_free(s->a, s->ptrs[i]);
            s->ptrs[i] = NULL;
        }
}

static uint64_t backend_calls(const mt_backend_counters_t *c)
{
    return c->malloc_calls + c->free_calls + c->vm_map_calls + c->vm_unmap_calls;
}

/* One fresh session: warm-up if asked, then one measured pass; fills out. */
static int run_once(const mt_trace_t *t, const mt_replay_cfg_t *cfg, bool sampled,
                    mt_replay_result_t *out, char *err, size_t errlen)
{
    session_t s;
    int rc = session_open(&s, t, cfg, err, errlen);
    if (rc < 0)
        return rc;
    uint64_t ooms = 0;
    mt_backend_counters_t c0, c1;
    mt_alloc_stats_t st;
    mt_backend_counters(s.b, &c0);
    if (cfg->warmup) {
        /* The warm-up reservation is made on the stream most of the trace runs on: the
         * first one it uses (a block is only reused on its own stream). */
        mt_stream_t *ws = t->nstreams ? s.streams[0] : NULL;
        if ((rc = mt_alloc_warmup_begin(s.a)) < 0 ||
            (rc = pass(&s, t, NULL, &ooms, err, errlen)) < 0)
            goto done;
        free_leftovers(&s, t);
        if ((rc = mt_alloc_warmup_end(s.a, ws)) < 0) {
            snprintf(err, errlen, "warm-up: %s", mt_strerror(rc));
            goto done;
        }
        mt_alloc_reset_peak(s.a);
        mt_backend_counters(s.b, &c1);
        out->warmup_backend_calls = backend_calls(&c1) - backend_calls(&c0);
        if (mt_alloc_stats(s.a, &st) == 0)
            out->warmup_reserved = (uint64_t)st.reserved_bytes[MT_STAT_ALL].current;
        c0 = c1;
        ooms = 0;
    }
    if (cfg->second_pass && !cfg->warmup) {
        if ((rc = pass(&s, t, NULL, &ooms, err, errlen)) < 0)
            goto done;
        free_leftovers(&s, t);
        mt_alloc_reset_peak(s.a);
        mt_backend_counters(s.b, &c1);
        out->first_pass_backend_calls = backend_calls(&c1) - backend_calls(&c0);
        c0 = c1;
        ooms = 0;
    }
    peak_sample_t ps = {.allocated = -1};
    uint64_t t0 = now_ns();
    rc = pass(&s, t, sampled ? &ps : NULL, &ooms, err, errlen);
    uint64_t t1 = now_ns();
    if (rc < 0)
        goto done;
    mt_backend_counters(s.b, &c1);
    if ((rc = mt_alloc_stats(s.a, &st)) < 0) {
        snprintf(err, errlen, "stats: %s", mt_strerror(rc));
        goto done;
    }
    free_leftovers(&s, t);
    snprintf(out->backend, sizeof out->backend, "%s", mt_backend_name(s.b));
    out->capacity = st.capacity;
    out->ops = t->nops;
    out->ooms = ooms;
    out->peak_allocated = (uint64_t)st.allocated_bytes[MT_STAT_ALL].peak;
    out->peak_reserved = (uint64_t)st.reserved_bytes[MT_STAT_ALL].peak;
    out->utilization_at_peak = mt__model_utilization(out->peak_allocated, out->peak_reserved);
    out->num_alloc_retries = st.num_alloc_retries;
    out->num_ooms = st.num_ooms;
    out->backend_malloc = c1.malloc_calls - c0.malloc_calls;
    out->backend_free = c1.free_calls - c0.free_calls;
    out->backend_map = c1.vm_map_calls - c0.vm_map_calls;
    out->backend_unmap = c1.vm_unmap_calls - c0.vm_unmap_calls;
    out->elapsed_ns = t1 - t0;
    out->modelled_ns = c1.modelled_ns - c0.modelled_ns;
    if (sampled && ps.allocated >= 0) {
        out->sampled = true;
        /* The model's definition, as every other figure of fragmentation. */
        out->fragmentation_at_peak =
            mt__model_fragmentation(ps.at.largest_free_block, ps.at.total_free);
        out->largest_free_at_peak = ps.at.largest_free_block;
        out->total_free_at_peak = ps.at.total_free;
        out->reserved_at_peak = (uint64_t)ps.at.reserved_bytes[MT_STAT_ALL].current;
    }
done:
    session_close(&s);
    return rc;
}

int mt__replay_run(const mt_trace_t *t, const mt_replay_cfg_t *cfg, mt_replay_result_t *out,
                   char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    unsigned rounds = cfg->rounds ? cfg->rounds : 1;
    /* Each round is a fresh device and allocator, so every round pays the same cold start
     * and the figures describe one real run; the fastest round is the least disturbed. */
    for (unsigned r = 0; r < rounds; r++) {
        mt_replay_result_t one = {0};
        int rc = run_once(t, cfg, false, &one, err, errlen);
        if (rc < 0)
            return rc;
        if (r == 0 || one.elapsed_ns < out->elapsed_ns)
            *out = one;
    }
    if (cfg->sample_peak) {
        mt_replay_result_t one = {0};
        int rc = run_once(t, cfg, true, &one, err, errlen);
        if (rc < 0)
            return rc;
        out->sampled = one.sampled;
        out->fragmentation_at_peak = one.fragmentation_at_peak;
        out->largest_free_at_peak = one.largest_free_at_peak;
        out->total_free_at_peak = one.total_free_at_peak;
        out->reserved_at_peak = one.reserved_at_peak;
    }
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    (void)mt_backend_cfg_from_env(&bc, NULL, 0); /* as session_open */
    out->malloc_cost_ns = bc.sim_malloc_cost_ns;
    return 0;
}

int mt__replay_passes(const mt_trace_t *t, const mt_replay_cfg_t *cfg, unsigned npasses,
                      uint64_t *ns, uint64_t *modelled, mt_replay_result_t *out,
                      uint64_t *peak_reserved_after, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (peak_reserved_after != NULL)
        *peak_reserved_after = 0;
    session_t s;
    int rc = session_open(&s, t, cfg, err, errlen);
    if (rc < 0)
        return rc;
    uint64_t ooms = 0;
    mt_backend_counters_t c0, c1;
    mt_alloc_stats_t st;
    if (cfg->warmup && (rc = mt_alloc_warmup_begin(s.a)) < 0) {
        snprintf(err, errlen, "warm-up: %s", mt_strerror(rc));
        goto done;
    }
    for (unsigned i = 0; i < npasses; i++) {
        mt_backend_counters(s.b, &c0);
        uint64_t t0 = cfg->cpu_time ? cpu_ns() : now_ns();
        rc = pass(&s, t, NULL, &ooms, err, errlen);
        uint64_t t1 = cfg->cpu_time ? cpu_ns() : now_ns();
        if (rc < 0)
            goto done;
        mt_backend_counters(s.b, &c1);
        uint64_t model = c1.modelled_ns - c0.modelled_ns;
        ns[i] = t1 - t0 - (model < t1 - t0 ? model : t1 - t0);
        if (modelled != NULL)
            modelled[i] = model;
        if ((rc = mt_alloc_stats(s.a, &st)) < 0) {
            snprintf(err, errlen, "stats: %s", mt_strerror(rc));
            goto done;
        }
        free_leftovers(&s, t);
        if (i == 0) {
            snprintf(out->backend, sizeof out->backend, "%s", mt_backend_name(s.b));
            out->capacity = st.capacity;
            out->ops = t->nops;
            out->ooms = ooms;
            out->peak_allocated = (uint64_t)st.allocated_bytes[MT_STAT_ALL].peak;
            out->peak_reserved = (uint64_t)st.reserved_bytes[MT_STAT_ALL].peak;
            out->utilization_at_peak =
                mt__model_utilization(out->peak_allocated, out->peak_reserved);
            out->num_alloc_retries = st.num_alloc_retries;
            out->num_ooms = st.num_ooms;
            out->backend_malloc = c1.malloc_calls - c0.malloc_calls;
            out->backend_free = c1.free_calls - c0.free_calls;
            out->backend_map = c1.vm_map_calls - c0.vm_map_calls;
            out->backend_unmap = c1.vm_unmap_calls - c0.vm_unmap_calls;
            out->elapsed_ns = t1 - t0;
            out->modelled_ns = model;
            if (cfg->warmup &&
                (rc = mt_alloc_warmup_end(s.a, t->nstreams ? s.streams[0] : NULL)) < 0) {
                snprintf(err, errlen, "warm-up: %s", mt_strerror(rc));
                goto done;
            }
        } else if (peak_reserved_after != NULL &&
                   (uint64_t)st.reserved_bytes[MT_STAT_ALL].peak > *peak_reserved_after) {
            *peak_reserved_after = (uint64_t)st.reserved_bytes[MT_STAT_ALL].peak;
        }
        mt_alloc_reset_peak(s.a);
    }
done:
    session_close(&s);
    return rc;
}

/* ---- host allocators ---- */

static void *glibc_alloc(size_t size)
{
    return malloc(size);
}

static void glibc_free(void *p)
{
    free(p);
}

static void load_lib(mt_host_alloc_t *h, const char *const libs[], const char *sym_alloc,
                     const char *sym_free)
{
    void *lib = NULL;
    const char *why = NULL;
    bool absent = true; /* every name failed for want of the file */
    for (size_t i = 0; libs[i] != NULL && lib == NULL; i++) {
        lib = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            why = dlerror();
            absent = absent && why != NULL && strstr(why, "cannot open shared object") != NULL;
        }
    }
    if (lib == NULL && absent) {
        /* The loader's own text ("cannot open shared object file: No such file...") says
         * less to a reader of the table than this. */
        snprintf(h->note, sizeof h->note, "%s left out: not installed (%s not found)", h->name,
                 libs[0]);
        return;
    }
    if (lib == NULL) {
        snprintf(h->note, sizeof h->note, "%s left out: %s did not load (%s)", h->name, libs[0],
                 why ? why : "no reason given");
        return;
    }
    void *a = dlsym(lib, sym_alloc), *f = dlsym(lib, sym_free);
    if (a == NULL || f == NULL) {
        snprintf(h->note, sizeof h->note, "%s left out: no %s/%s in %s", h->name, sym_alloc,
                 sym_free, libs[0]);
        return;
    }
    *(void **)&h->alloc = a;
    *(void **)&h->free = f;
}

void mt__host_alloc_load(mt_host_alloc_t *out, int which)
{
    static const char *const je_libs[] = {"libjemalloc.so.2", "libjemalloc.so", NULL};
    static const char *const mi_libs[] = {"libmimalloc.so.2", "libmimalloc.so", NULL};
    memset(out, 0, sizeof *out);
    switch (which) {
    case MT_HOST_GLIBC:
        *out = (mt_host_alloc_t){.name = "glibc malloc", .alloc = glibc_alloc, .free = glibc_free};
        break;
    case MT_HOST_JEMALLOC:
        /* The library's own malloc/free (a handle's dlsym looks in that library first). */
        out->name = "jemalloc";
        load_lib(out, je_libs, "malloc", "free");
        break;
    case MT_HOST_MIMALLOC:
        out->name = "mimalloc";
        load_lib(out, mi_libs, "mi_malloc", "mi_free");
        break;
    default:
        out->name = "?";
        snprintf(out->note, sizeof out->note, "no host allocator %d", which);
        break;
    }
}

void mt__host_allocs_load(mt_host_alloc_t out[MT_HOST_N])
{
    for (int i = 0; i < MT_HOST_N; i++)
        mt__host_alloc_load(&out[i], i);
}

int mt__replay_host_passes(const mt_host_alloc_t *h, const mt_trace_t *t, unsigned npasses,
                           bool cpu_time, uint64_t *ns)
{
    if (h->alloc == NULL)
        return MT_EINVAL;
    void **ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *ptrs);
    if (ptrs == NULL)
        return MT_ENOMEM;
    for (unsigned r = 0; r < npasses; r++) {
        uint64_t t0 = cpu_time ? cpu_ns() : now_ns();
        for (size_t i = 0; i < t->nops; i++) {
            const mt_trace_op_t *op = &t->ops[i];
            if (op->action == MT_TRACE_ALLOCATE) {
                ptrs[op->slot] = op->size ? h->alloc(op->size) : NULL;
            } else if (ptrs[op->slot] != NULL) {
                h->free(ptrs[op->slot]);
                ptrs[op->slot] = NULL;
            }
        }
        ns[r] = (cpu_time ? cpu_ns() : now_ns()) - t0;
        for (size_t i = 0; i < t->nslots; i++)
            if (ptrs[i] != NULL) {
                h->free(ptrs[i]);
                ptrs[i] = NULL;
            }
    }
    free(ptrs);
    return 0;
}

uint64_t mt__replay_host(const mt_host_alloc_t *h, const mt_trace_t *t, unsigned rounds)
{
    uint64_t best = 0;
    for (unsigned r = 0; r < (rounds ? rounds : 1); r++) {
        uint64_t ns;
        if (mt__replay_host_passes(h, t, 1, false, &ns) < 0)
            return 0;
        best = r == 0 || ns < best ? ns : best;
    }
    return best;
}

void mt__replay_machine(char *buf, size_t n)
{
    char model[128] = "unknown CPU", line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
            snprintf(model, sizeof model, "%s", colon + 2);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    }
    if (f != NULL)
        fclose(f);
    snprintf(buf, n, "%s, %ld cores online", model, sysconf(_SC_NPROCESSORS_ONLN));
}
