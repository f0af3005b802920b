/* `memtrace replay`: replays an RMM logging CSV through the caching allocator on the sim
 * backend and reports what a user of the reference allocator would ask about it: peaks,
 * utilization, fragmentation, backend calls, cost per operation.
 *
 * The trace is loaded and checked completely first (trace_csv.c), so malformed input is
 * reported before anything runs and the timed loop does no parsing or hashing: pointers
 * became slot numbers and each slot holds our pointer. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "tools/commands.h"
#include "tools/replay.h"
#include "tools/trace_csv.h"

/* ---- the replay engine ---- */

mt_replay_cfg_t mt_replay_cfg_default(void)
{
    return (mt_replay_cfg_t){.rounds = 1};
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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
    for (size_t i = 0; i < s->nstreams; i++)
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
                     mt_trace_action_name(op->action), (unsigned long long)op->size,
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
    out->utilization_at_peak =
        out->peak_reserved ? (double)out->peak_allocated / (double)out->peak_reserved : 1.0;
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
        out->fragmentation_at_peak = ps.at.fragmentation;
        out->largest_free_at_peak = ps.at.largest_free_block;
        out->total_free_at_peak = ps.at.total_free;
        out->reserved_at_peak = (uint64_t)ps.at.reserved_bytes[MT_STAT_ALL].current;
    }
done:
    session_close(&s);
    return rc;
}

int mt_replay_run(const mt_trace_t *t, const mt_replay_cfg_t *cfg, mt_replay_result_t *out,
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
    out->malloc_cost_ns = bc.sim_malloc_cost_ns;
    return 0;
}

/* ---- the command ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: memtrace replay FILE [--alloc-conf STR] [--warmup] [--capacity BYTES]\n"
               "                            [--json] [--help]\n"
               "\n"
               "Replays an allocation trace through the memtrace caching allocator on the sim\n"
               "backend (host memory posing as a device) and reports peak allocated and\n"
               "reserved bytes, utilization and fragmentation at the peak, backend calls,\n"
               "retries/OOMs and the cost per operation.\n"
               "\n"
               "FILE is RMM's logging CSV: the header Thread,Time,Action,Pointer,Size,Stream,\n"
               "then rows like  2342727,15:47:02.841961,allocate,0x10012400000,1048576,0\n"
               "(Action allocate, free or 'allocate failure'; Pointer hex with 0x; Size\n"
               "decimal; Stream hex without 0x, 0 = default stream). Rows are replayed in file\n"
               "order on one thread; each trace stream becomes a stream of its own (a block is\n"
               "reused on the stream it was allocated on); 'allocate failure' rows are counted\n"
               "and skipped. The whole file is checked before anything runs.\n"
               "\n"
               "options:\n"
               "  --alloc-conf STR   allocator settings, as MEMTRACE_ALLOC_CONF (applied after\n"
               "                     it), e.g. expandable_segments:True,max_split_size_mb:64\n"
               "  --warmup           replay once to measure the peak (warm-up reservation),\n"
               "                     then replay again and report that second run\n"
               "  --capacity BYTES   size of the simulated device (suffixes K, M, G, T, binary;\n"
               "                     default MEMTRACE_SIM_CAPACITY or 8G)\n"
               "  --json             print one JSON object instead of the table\n"
               "  --help             this text\n"
               "\n"
               "ns per op is wall time per allocate or free and includes the sim backend's\n"
               "modelled cost of each segment malloc/free (MEMTRACE_SIM_MALLOC_COST_NS),\n"
               "which is also shown on its own.\n"
               "\n"
               "exit status: 0 replayed; 1 the allocator or backend failed; 2 bad usage or a\n"
               "malformed trace (the message names the line and the field).\n"
               "\n"
               "example:\n"
               "  memtrace replay data/traces/rnn_varlen.csv --warmup\n"
               "  memtrace replay data/traces/somas_resnet50.csv \\\n"
               "      --alloc-conf expandable_segments:True --json\n");
}

/* "12", "512K", "8G", "1.5GiB" → bytes. */
static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0)
        return MT_EINVAL;
    double mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    else if (mul == 1 && strcmp(end, "B") == 0)
        end++;
    if (*end != '\0' || v * mul >= 18446744073709551615.0 || v * mul < 1)
        return MT_EINVAL;
    *out = (size_t)(v * mul);
    return 0;
}

static void human(char *buf, size_t n, uint64_t bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, n, "%.2f %s (%llu B)", v, unit[u], (unsigned long long)bytes);
}

static void print_text(const char *path, const mt_trace_t *t, const mt_replay_cfg_t *cfg,
                       const mt_replay_result_t *r)
{
    char b1[64], b2[64];
    double ops = r->ops ? (double)r->ops : 1;
    printf("memtrace replay: %s%s\n", path, cfg->warmup ? " (after a warm-up pass)" : "");
    human(b1, sizeof b1, r->capacity);
    printf("  %-24s %s, capacity %s, modelled segment malloc %llu ns\n", "backend", r->backend, b1,
           (unsigned long long)r->malloc_cost_ns);
    if (cfg->alloc_conf != NULL)
        printf("  %-24s %s\n", "alloc conf", cfg->alloc_conf);
    printf("  %-24s %zu (%zu allocate, %zu free, %zu allocate failure; %zu stream%s)\n", "events",
           t->nrows, t->nallocs, t->nfrees, t->nfailures, t->nstreams, t->nstreams == 1 ? "" : "s");
    human(b1, sizeof b1, t->peak_live_bytes);
    printf("  %-24s %s, %zu allocations\n", "trace peak live", b1, t->peak_live_count);
    if (t->leaked)
        printf("  %-24s %zu allocation%s never freed\n", "trace leaks", t->leaked,
               t->leaked == 1 ? "" : "s");
    human(b1, sizeof b1, r->peak_allocated);
    printf("  %-24s %s\n", "peak allocated", b1);
    human(b1, sizeof b1, r->peak_reserved);
    printf("  %-24s %s\n", "peak reserved", b1);
    printf("  %-24s %.4f (peak allocated / peak reserved)\n", "utilization at peak",
           r->utilization_at_peak);
    if (r->sampled) {
        human(b1, sizeof b1, r->largest_free_at_peak);
        human(b2, sizeof b2, r->total_free_at_peak);
        printf("  %-24s %.4f (largest free block %s of %s free)\n", "fragmentation at peak",
               r->fragmentation_at_peak, b1, b2);
    }
    if (cfg->warmup) {
        human(b1, sizeof b1, r->warmup_reserved);
        printf("  %-24s %llu backend calls, reserved %s\n", "warm-up",
               (unsigned long long)r->warmup_backend_calls, b1);
    }
    printf("  %-24s malloc %llu, free %llu, vm map %llu, vm unmap %llu\n", "backend calls",
           (unsigned long long)r->backend_malloc, (unsigned long long)r->backend_free,
           (unsigned long long)r->backend_map, (unsigned long long)r->backend_unmap);
    printf("  %-24s %llu / %llu\n", "retries / OOMs", (unsigned long long)r->num_alloc_retries,
           (unsigned long long)r->num_ooms);
    printf("  %-24s %.1f (wall; %.1f of it modelled backend cost, %.1f without)\n", "ns per op",
           (double)r->elapsed_ns / ops, (double)r->modelled_ns / ops,
           (double)(r->elapsed_ns -
                    (r->modelled_ns < r->elapsed_ns ? r->modelled_ns : r->elapsed_ns)) /
               ops);
}

/* Byte counts are uint64; JSON integers (jansson's json_int_t) are signed 64-bit. A count
 * beyond INT64_MAX (only a nonsense trace gets there) is written as a real, not wrapped. */
static json_t *jbytes(uint64_t v)
{
    return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static int print_json(const char *path, const mt_trace_t *t, const mt_replay_cfg_t *cfg,
                      const mt_replay_result_t *r)
{
    double ops = r->ops ? (double)r->ops : 1;
    json_t *o = json_object();
    if (o == NULL)
        return MT_ENOMEM;
    json_object_set_new(o, "file", json_string(path));
    json_object_set_new(o, "backend", json_string(r->backend));
    json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)r->capacity));
    json_object_set_new(o, "modelled_segment_malloc_ns",
                        json_integer((json_int_t)r->malloc_cost_ns));
    json_object_set_new(o, "alloc_conf",
                        cfg->alloc_conf ? json_string(cfg->alloc_conf) : json_null());
    json_object_set_new(o, "warmup", json_boolean(cfg->warmup));
    json_object_set_new(o, "events", json_integer((json_int_t)t->nrows));
    json_object_set_new(o, "allocates", json_integer((json_int_t)t->nallocs));
    json_object_set_new(o, "frees", json_integer((json_int_t)t->nfrees));
    json_object_set_new(o, "allocate_failures", json_integer((json_int_t)t->nfailures));
    json_object_set_new(o, "streams", json_integer((json_int_t)t->nstreams));
    json_object_set_new(o, "trace_leaks", json_integer((json_int_t)t->leaked));
    json_object_set_new(o, "trace_peak_live_bytes", jbytes(t->peak_live_bytes));
    json_object_set_new(o, "peak_allocated_bytes", json_integer((json_int_t)r->peak_allocated));
    json_object_set_new(o, "peak_reserved_bytes", json_integer((json_int_t)r->peak_reserved));
    json_object_set_new(o, "utilization_at_peak", json_real(r->utilization_at_peak));
    json_object_set_new(o, "fragmentation_at_peak",
                        r->sampled ? json_real(r->fragmentation_at_peak) : json_null());
    json_object_set_new(o, "largest_free_block_at_peak_bytes",
                        json_integer((json_int_t)r->largest_free_at_peak));
    json_object_set_new(o, "total_free_at_peak_bytes",
                        json_integer((json_int_t)r->total_free_at_peak));
    json_object_set_new(o, "backend_malloc_calls", json_integer((json_int_t)r->backend_malloc));
    json_object_set_new(o, "backend_free_calls", json_integer((json_int_t)r->backend_free));
    json_object_set_new(o, "backend_vm_map_calls", json_integer((json_int_t)r->backend_map));
    json_object_set_new(o, "backend_vm_unmap_calls", json_integer((json_int_t)r->backend_unmap));
    json_object_set_new(o, "warmup_backend_calls",
                        json_integer((json_int_t)r->warmup_backend_calls));
    json_object_set_new(o, "warmup_reserved_bytes", json_integer((json_int_t)r->warmup_reserved));
    json_object_set_new(o, "num_alloc_retries", json_integer((json_int_t)r->num_alloc_retries));
    json_object_set_new(o, "num_ooms", json_integer((json_int_t)r->num_ooms));
    json_object_set_new(o, "ns_per_op", json_real((double)r->elapsed_ns / ops));
    json_object_set_new(o, "modelled_ns_per_op", json_real((double)r->modelled_ns / ops));
    int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (rc == 0)
        putchar('\n');
    return rc == 0 ? 0 : MT_EIO;
}

int mt_cmd_replay(int argc, char **argv)
{
    static const struct option opts[] = {
        {"alloc-conf", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"warmup", no_argument, NULL, 'w'},
        {"capacity", required_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    mt_replay_cfg_t cfg = mt_replay_cfg_default();
    cfg.sample_peak = true;
    cfg.rounds = 3; /* the fastest of three passes: one pass of a short trace is noisy */
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cfg.alloc_conf = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'w':
            cfg.warmup = true;
            break;
        case 'C':
            if (parse_bytes(optarg, &cfg.capacity) < 0) {
                fprintf(stderr, "memtrace replay: --capacity: not a size in bytes: '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr,
                    "memtrace replay: unknown or incomplete option '%s' "
                    "(see 'memtrace replay --help')\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "memtrace replay: %s (see 'memtrace replay --help')\n",
                argc - optind == 0 ? "missing the trace FILE" : "more than one FILE given");
        return 2;
    }
    const char *path = argv[optind];
    char err[MT_TRACE_ERR_LEN + 256] = "";
    mt_backend_cfg_t env_bc = mt_backend_cfg_default();
    if (mt_backend_cfg_from_env(&env_bc, err, sizeof err) != 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        return 2;
    }
    mt_trace_t *t = NULL;
    int rc = mt_trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        return rc == MT_ENOMEM || rc == MT_EIO ? 1 : 2;
    }
    mt_replay_result_t res;
    rc = mt_replay_run(t, &cfg, &res, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        mt_trace_free(&t);
        return rc == MT_EINVAL ? 2 : 1;
    }
    if (json)
        rc = print_json(path, t, &cfg, &res);
    else
        print_text(path, t, &cfg, &res);
    mt_trace_free(&t);
    return rc < 0 ? 1 : 0;
}
