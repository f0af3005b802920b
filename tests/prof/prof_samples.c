/* Writes telemetry samples for the schema test (prof_schema, validated with ajv):
 * argv[1]: every record type straight from the encoders (every event kind, a gap,
 * hello, exit, process state and a snapshot) and the event line writer's output over
 * every kind, tag, pool, mark, extreme values and odd tag names; argv[2]: a real local log written
 * by the profiler in log mode. Exit status 0 when both were written. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/prof.h"
#include "profiler/internal.h"

static int put_line(FILE *f, void *j)
{
    if (!j)
        return -1;
    int rc = json_dumpf(j, f, JSON_COMPACT);
    fputc('\n', f);
    json_decref(j);
    return rc;
}

/* One event line from the line writer. */
static int put_event(FILE *f, const mt_event_rec_t *ev, int pid,
                     const char *(*tag_name)(void *ud, int tag), void *ud)
{
    char line[8192];
    size_t n = mt_prof_event_write(line, sizeof(line), ev, pid, tag_name, ud);
    if (n == 0 || n >= sizeof(line))
        return -1;
    return fwrite(line, 1, n, f) == n ? 0 : -1;
}

/* User tag names that need escaping or hold invalid UTF-8 (written as U+FFFD). */
static const char *odd_names(void *ud, int tag)
{
    (void)ud;
    static const char *const names[] = {
        "kv_cache",
        "quote\"back\\slash",
        "ctl\b\t\n\v\f\r\x01\x1f\x7f",
        "gr\xc3\xb6\xc3\x9f"
        "e \xe2\x82\xac",
        "bad\x80\xc0\xaf\xed\xa0\x80\xff",
    };
    int i = tag - MT_TAG_USER_FIRST;
    return i >= 0 && i < (int)(sizeof(names) / sizeof(names[0])) ? names[i] : NULL;
}

/* What the line writer writes, over every kind, tag, pool and mark, the extreme values
 * and odd tag names. */
static int put_event_sweep(FILE *f)
{
    int bad = 0;
    for (int k = MT_EV_ALLOC; k < MT_EV_GAP; k++)
        for (int tag = 0; tag < MT_TAG_MAX; tag++)
            for (int pool = MT_POOL_NONE; pool <= MT_POOL_HOST; pool++) {
                mt_event_rec_t ev = {
                    .seq = (uint64_t)k * 1000 + (uint64_t)tag,
                    .time_ns = 1234567890123ull,
                    .addr = k == MT_EV_MARK ? (uint64_t)(1 + tag % MT_MARK_WARMUP_END)
                                            : 0x7f12345678c0ull + (uint64_t)tag * 512,
                    .size = 4096ull << (tag % 30),
                    .requested = 4000,
                    .allocated = 1ull << 33,
                    .reserved = 3ull << 33,
                    .stream = (uint32_t)tag * 0x9e3779b9u,
                    .kind = (uint8_t)k,
                    .pool = (uint8_t)pool,
                    .tag = (uint8_t)tag,
                    .device = (uint8_t)(tag * 37),
                };
                bad |= put_event(f, &ev, 4242, odd_names, NULL);
            }
    mt_event_rec_t zero = {.kind = MT_EV_ALLOC};
    bad |= put_event(f, &zero, 0, NULL, NULL);
    mt_event_rec_t big = {
        .seq = UINT64_MAX,
        .time_ns = UINT64_MAX,
        .addr = UINT64_MAX,
        .size = UINT64_MAX,
        .requested = (uint64_t)INT64_MAX,
        .allocated = UINT64_MAX,
        .reserved = UINT64_MAX,
        .stream = UINT32_MAX,
        .kind = MT_EV_OOM,
        .pool = MT_POOL_HOST,
        .tag = MT_TAG_MAX - 1,
        .device = UINT8_MAX,
    };
    bad |= put_event(f, &big, INT32_MAX, NULL, NULL);
    big.kind = MT_EV_GAP;
    bad |= put_event(f, &big, INT32_MAX, NULL, NULL);
    /* Label announcements: the odd names above as labels, one cut at 24 bytes inside a
     * multi-byte character, and the widest values. */
    for (int tag = MT_TAG_USER_FIRST; tag < MT_TAG_MAX; tag++) {
        mt_event_rec_t lab = {.seq = (uint64_t)tag,
                              .time_ns = 5,
                              .kind = MT_EV_TAG_LABEL,
                              .tag = (uint8_t)tag,
                              .device = (uint8_t)tag};
        const char *name = odd_names(NULL, tag);
        mt_event_label_pack(&lab, name ? name
                                       : "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"
                                         "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"
                                         "\xe2\x82\xac");
        bad |= put_event(f, &lab, tag == MT_TAG_MAX - 1 ? INT32_MAX : 7, NULL, NULL);
    }
    /* Named marks: a short name and one cut at 16 bytes inside a multi-byte character. */
    const char *marks[] = {"epoch_end", "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"
                                        "\xe2\x82\xac\xe2\x82\xac"};
    for (int i = 0; i < 2; i++) {
        mt_event_rec_t mk = {.seq = (uint64_t)i, .time_ns = 6, .kind = MT_EV_MARK_NAMED};
        mt_event_mark_name_pack(&mk, marks[i]);
        bad |= put_event(f, &mk, 7, NULL, NULL);
    }
    return bad;
}

static mt_event_rec_t sample(int kind, uint64_t i)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.time_ns = 1000 + i;
    ev.kind = (uint8_t)kind;
    ev.addr = kind == MT_EV_MARK ? MT_MARK_ITERATION : 0x7f0000001000 + i * 512;
    ev.size = kind == MT_EV_MARK ? i : 512 * (i + 1);
    ev.requested = ev.size - (ev.size > 3 ? 3 : 0);
    ev.allocated = 1 << 20;
    ev.reserved = 2 << 20;
    ev.pool = MT_POOL_SMALL;
    ev.tag = (uint8_t)(i % 9);
    ev.stream = (uint32_t)i;
    return ev;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SAMPLES.ndjson LOG.ndjson\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 1;
    int bad = 0;
    for (int k = MT_EV_ALLOC; k < MT_EV_GAP; k++) {
        mt_event_rec_t ev = sample(k, (uint64_t)k);
        ev.seq = (uint64_t)k;
        bad |= put_event(f, &ev, 100, NULL, NULL);
    }
    mt_event_rec_t gap = {.kind = MT_EV_GAP, .seq = 20, .size = 3, .time_ns = 9};
    bad |= put_event(f, &gap, 100, NULL, NULL);
    bad |= put_event_sweep(f);
    bad |= put_line(f, mt_prof_hello_to_json(100, "train", 1700000000000000000ull, 5));
    {
        /* a rank of a job: the hello with its job fields */
        json_t *h = mt_prof_hello_to_json(101, "train", 1700000000000000000ull, 5);
        mt_prof_job_t j = {.rank = 5, .local_rank = 1, .world_size = 8, .id = "slurm-77:0"};
        bad |= !h || mt_prof_job_to_json(h, &j) != 0;
        bad |= put_line(f, h);
    }
    bad |= put_line(f, mt__prof_exit_to_json(100, false, 10, 1, 1, 99));

    mt_snapshot_block_t blocks[3] = {
        {.addr = 0x1000,
         .size = 512,
         .requested = 500,
         .state = MT_BLOCK_ACTIVE_ALLOCATED,
         .tag = MT_TAG_WEIGHTS},
        {.addr = 0x1200,
         .size = 1024,
         .requested = 1000,
         .state = MT_BLOCK_ACTIVE_PENDING_FREE,
         .tag = MT_TAG_USER_FIRST},
        {.addr = 0x1600, .size = (2 << 20) - 1536, .state = MT_BLOCK_INACTIVE},
    };
    mt_snapshot_segment_t seg = {.addr = 0x1000,
                                 .size = 2 << 20,
                                 .pool = MT_POOL_SMALL,
                                 .stream = 3,
                                 .nblocks = 3,
                                 .blocks = blocks};
    mt_alloc_snapshot_t snap = {.nsegments = 1, .segments = &seg};
    snap.stats.allocated_bytes[MT_STAT_ALL] = (mt_stat_t){1536, 4096, 8192, 6656};
    snap.stats.reserved_bytes[MT_STAT_ALL] = (mt_stat_t){2 << 20, 2 << 20, 2 << 20, 0};
    snap.stats.tag_allocated_bytes[MT_TAG_WEIGHTS] = (mt_stat_t){512, 512, 512, 0};
    snap.stats.tag_allocated_bytes[MT_TAG_USER_FIRST] = (mt_stat_t){1024, 1024, 1024, 0};
    snap.stats.utilization = 1536.0 / (2 << 20);
    snap.stats.fragmentation = 0.25;
    snap.stats.capacity = 16ull << 30;
    snap.stats.limit = 16ull << 30;
    bad |= put_line(f, mt_prof_stats_to_json(&snap.stats, 100, 0, NULL, NULL));
    bad |= put_line(f, mt_prof_snapshot_to_json(&snap, 100, 0, NULL, NULL));
    if (fclose(f) != 0 || bad)
        return 1;

    /* A real local log: the profiler in log mode, a few events of every kind. */
    unlink(argv[2]);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = argv[2];
    cfg.name = "samples";
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &cfg) != 0)
        return 1;
    for (uint64_t i = 0; i < 3; i++)
        for (int k = MT_EV_ALLOC; k < MT_EV_GAP; k++) {
            mt_event_rec_t ev = sample(k, i);
            mt_prof_record(p, &ev);
        }
    /* And what the real allocator emits (sim backend): config, segments, alloc/free,
     * marks, empty_cache. */
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    if (mt_backend_create(&b, &bc) != 0)
        return 1;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    if (mt_alloc_create(&a, &ac) != 0)
        return 1;
    for (int it = 0; it < 3; it++) {
        mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        void *x, *y;
        if (mt_alloc_malloc(a, 1000, NULL, MT_TAG_BATCH, &x) != 0 ||
            mt_alloc_malloc(a, 5u << 20, NULL, MT_TAG_ACTIVATIONS, &y) != 0)
            return 1;
        mt_alloc_free(a, x);
        mt_alloc_free(a, y);
    }
    /* A user tag: its label announcement, then events named by it. */
    int logits;
    void *z;
    if (mt_alloc_tag_register(a, "logits", &logits) != 0 ||
        mt_alloc_malloc(a, 3000, NULL, logits, &z) != 0)
        return 1;
    mt_alloc_free(a, z);
    mt_alloc_empty_cache(a);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt_prof_destroy(&p);
    return 0;
}
