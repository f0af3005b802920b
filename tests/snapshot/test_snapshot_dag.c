/* Snapshots whose values are shared through the pickle memo. A hostile file refers to one
 * list or dict from many places (BINGET), so that a few hundred KB describe 10^10 trace
 * entries or blocks: the reader must refuse it by name, in bounded time and memory. Real
 * snapshots share too (PyTorch gives every entry of one traceback the same frames list,
 * made of shared frame dicts): those must still read, with the same model as before.
 * argv[1] is tests/snapshot/data, argv[2] and argv[3] snapshots of bench/gen_snapshot.py. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "analysis/pickle.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/common.h"
#include "tests/common/test_main.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static const char *data_dir;
static const char *gen_files[2]; /* bench/gen_snapshot.py's, argv[2] and argv[3] */

/* ---- a pickle written opcode by opcode ---- */

typedef struct pk_s {
    unsigned char *b;
    size_t n, cap;
    uint32_t memo; /* memo entries put so far */
} pk_t;

static void put(pk_t *p, const void *bytes, size_t n)
{
    if (p->n + n > p->cap) {
        p->cap = (p->n + n) * 2 + 4096;
        p->b = realloc(p->b, p->cap);
        assert_non_null(p->b);
    }
    memcpy(p->b + p->n, bytes, n);
    p->n += n;
}

static void op(pk_t *p, unsigned char o)
{
    put(p, &o, 1);
}

static void u32le(pk_t *p, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(p, b, 4);
}

static void str(pk_t *p, const char *s)
{
    size_t n = strlen(s);
    assert_true(n < 256);
    op(p, 0x8c); /* SHORT_BINUNICODE */
    op(p, (unsigned char)n);
    put(p, s, n);
}

static void int32(pk_t *p, int32_t v)
{
    op(p, 'J'); /* BININT */
    u32le(p, (uint32_t)v);
}

/* Puts the value on top of the stack in the memo (LONG_BINPUT); returns its index. */
static uint32_t memo_put(pk_t *p)
{
    op(p, 'r');
    u32le(p, p->memo);
    return p->memo++;
}

/* BINGET for small indexes (2 bytes), LONG_BINGET (5 bytes) else. */
static void memo_get(pk_t *p, uint32_t idx)
{
    if (idx < 256) {
        op(p, 'h');
        op(p, (unsigned char)idx);
    } else {
        op(p, 'j');
        u32le(p, idx);
    }
}

/* A list of n times one value, memoized: make writes the value (memoized) at the first
 * place and returns its memo index, every later place refers to it. Returns the list's
 * memo index. */
static uint32_t list_repeat(pk_t *p, size_t n, uint32_t (*make)(pk_t *p))
{
    op(p, ']'); /* EMPTY_LIST */
    uint32_t me = memo_put(p);
    uint32_t idx = 0;
    for (size_t done = 0; done < n;) {
        op(p, '('); /* MARK */
        for (size_t k = 0; k < 1000 && done < n; k++, done++)
            if (done == 0)
                idx = make(p);
            else
                memo_get(p, idx);
        op(p, 'e'); /* APPENDS */
    }
    return me;
}

static void begin(pk_t *p)
{
    memset(p, 0, sizeof *p);
    op(p, 0x80); /* PROTO 4 */
    op(p, 4);
}

/* ---- reading in a child, within a memory limit and a time limit ---- */

/* Reads p's pickle in a child with 512 MiB of address space (not under ASan, which
 * reserves terabytes of shadow) and 60 s of time; the child exits 0 when the read failed
 * with MT_EPROTO and a message holding want. The parent fails on anything else. */
static void expect_refused(const pk_t *p, const char *want)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!UNDER_ASAN) {
            struct rlimit rl = {.rlim_cur = (rlim_t)512 << 20, .rlim_max = (rlim_t)512 << 20};
            if (setrlimit(RLIMIT_AS, &rl) != 0)
                _exit(10);
        }
        alarm(60);
        char err[768] = "";
        mt_pk_doc_t *doc = NULL;
        int rc = mt__pk_parse(&doc, p->b, p->n, NULL, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "parse: %d %s\n", rc, err);
            _exit(11);
        }
        mt_ts_t *ts = NULL;
        rc = mt__ts_from_pickle(&ts, doc, "dag.pickle", err, sizeof err);
        fprintf(stderr, "convert: rc %d: %s\n", rc, err);
        _exit(rc == MT_EPROTO && ts == NULL && strstr(err, want) != NULL ? 0 : 12);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (WIFSIGNALED(st))
        fail_msg("the reader was killed by signal %d (%s) after %.1f s", WTERMSIG(st),
                 strsignal(WTERMSIG(st)), s);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the reader did not refuse the file with '%s' (status %d, %.1f s)", want,
                 WEXITSTATUS(st), s);
    printf("refused a %zu-byte file in %.2f s\n", p->n, s);
}

#define REFUSED "refused: the file's shared values (pickle memo references) expand"

static uint32_t make_event(pk_t *p)
{
    op(p, '}');
    uint32_t me = memo_put(p);
    op(p, '(');
    str(p, "action");
    str(p, "alloc");
    str(p, "addr");
    int32(p, 0);
    str(p, "size");
    int32(p, 512);
    op(p, 'u'); /* SETITEMS */
    return me;
}

static uint32_t make_trace(pk_t *p)
{
    return list_repeat(p, 100000, make_event);
}

/* device_traces: 200 devices, each the same list of 10^5 references to one event dict:
 * 2 * 10^7 events from 200 KB. */
static void test_shared_trace_lists(void **state)
{
    (void)state;
    pk_t p;
    begin(&p);
    op(&p, '}'); /* the root */
    memo_put(&p);
    op(&p, '(');
    str(&p, "segments");
    op(&p, ']');
    str(&p, "device_traces");
    list_repeat(&p, 200, make_trace);
    op(&p, 'u');
    op(&p, '.');
    assert_true(p.n < 256 * 1024);
    expect_refused(&p, REFUSED);
    free(p.b);
}

static uint32_t make_block(pk_t *p)
{
    op(p, '}');
    uint32_t me = memo_put(p);
    op(p, '(');
    str(p, "size");
    int32(p, 512);
    str(p, "state");
    str(p, "inactive");
    op(p, 'u');
    return me;
}

static uint32_t make_segment(pk_t *p)
{
    op(p, '}');
    uint32_t me = memo_put(p);
    op(p, '(');
    str(p, "device");
    int32(p, 0);
    str(p, "address");
    int32(p, 0);
    str(p, "total_size");
    int32(p, 512);
    str(p, "blocks");
    list_repeat(p, 100000, make_block);
    op(p, 'u');
    return me;
}

/* segments: 10^5 references to one segment whose blocks are 10^5 references to one block
 * dict: 10^10 blocks from 400 KB (era 1: the top level is the list). */
static void test_shared_segments_and_blocks(void **state)
{
    (void)state;
    pk_t p;
    begin(&p);
    list_repeat(&p, 100000, make_segment);
    op(&p, '.');
    assert_true(p.n < 512 * 1024);
    expect_refused(&p, REFUSED);
    free(p.b);
}

static uint32_t make_wide_frame(pk_t *p)
{
    op(p, '}');
    uint32_t me = memo_put(p);
    op(p, '(');
    str(p, "name"); /* first: a lookup scans from the last pair back */
    str(p, "f");
    str(p, "filename");
    str(p, "x.py");
    str(p, "line");
    int32(p, 1);
    for (int i = 0; i < 2000; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        str(p, k);
        int32(p, i);
    }
    op(p, 'u');
    return me;
}

/* One frame dict of 2000 pairs, 10^5 times in one frames list: every lookup in it scans
 * the pairs, so the work is 10^5 * 2000 * lookups though little is stored. */
static void test_shared_wide_frame(void **state)
{
    (void)state;
    pk_t p;
    begin(&p);
    op(&p, '}'); /* the root */
    memo_put(&p);
    op(&p, '(');
    str(&p, "segments");
    op(&p, ']');
    str(&p, "device_traces");
    op(&p, ']');
    memo_put(&p);
    op(&p, ']'); /* device 0's trace */
    memo_put(&p);
    op(&p, '}'); /* its one event */
    memo_put(&p);
    op(&p, '(');
    str(&p, "action");
    str(&p, "alloc");
    str(&p, "addr");
    int32(&p, 0);
    str(&p, "size");
    int32(&p, 512);
    str(&p, "frames");
    list_repeat(&p, 100000, make_wide_frame);
    op(&p, 'u');
    op(&p, 'a'); /* APPEND the event to the device's list */
    op(&p, 'a'); /* APPEND the device's list to device_traces */
    op(&p, 'u');
    op(&p, '.');
    expect_refused(&p, REFUSED);
    free(p.b);
}

/* ---- real shapes still read ---- */

enum { NFRAME = 64, NTB = 16, DEPTH = 30, NEV = 200000 };

/* Traceback t's frames list: its DEPTH frames drawn from the NFRAME shared dicts. */
static void frames_list(pk_t *p, int64_t *tb, int t, int64_t *frame)
{
    if (tb[t] >= 0) {
        memo_get(p, (uint32_t)tb[t]);
        return;
    }
    op(p, ']');
    tb[t] = memo_put(p);
    op(p, '(');
    for (int d = 0; d < DEPTH; d++) {
        int f = (t * 7 + d) % NFRAME;
        if (frame[f] >= 0) {
            memo_get(p, (uint32_t)frame[f]);
            continue;
        }
        char name[32];
        snprintf(name, sizeof name, "fn%d", f);
        op(p, '}');
        frame[f] = memo_put(p);
        op(p, '(');
        str(p, "name");
        str(p, name);
        str(p, "filename");
        str(p, "model.py");
        str(p, "line");
        int32(p, f);
        op(p, 'u');
    }
    op(p, 'e');
}

/* The shape PyTorch writes: every trace entry a distinct dict, the entries of one
 * traceback sharing one frames list, the lists sharing frame dicts (BINGET): 200 000
 * entries over 16 tracebacks of 30 frames from 64 frame dicts. */
static void test_shared_frames_lists_read(void **state)
{
    (void)state;
    pk_t p;
    begin(&p);
    op(&p, '}'); /* the root */
    memo_put(&p);
    op(&p, '(');
    str(&p, "segments");
    op(&p, ']');
    str(&p, "device_traces");
    op(&p, ']');
    memo_put(&p);
    op(&p, ']'); /* device 0's trace */
    memo_put(&p);
    /* As pickle.dump writes them: a shared value in full at its first use (memoized),
     * a reference (BINGET) at every later one. */
    int64_t frame[NFRAME], tb[NTB];
    for (int f = 0; f < NFRAME; f++)
        frame[f] = -1;
    for (int t = 0; t < NTB; t++)
        tb[t] = -1;
    uint32_t k_action = 0, k_alloc = 0;
    for (int i = 0; i < NEV; i += 1000) {
        op(&p, '(');
        for (int j = i; j < i + 1000; j++) {
            op(&p, '}');
            op(&p, '(');
            if (j == 0) {
                str(&p, "action");
                k_action = memo_put(&p);
                str(&p, "alloc");
                k_alloc = memo_put(&p);
            } else {
                memo_get(&p, k_action);
                memo_get(&p, k_alloc);
            }
            str(&p, "addr");
            int32(&p, j * 512);
            str(&p, "size");
            int32(&p, 512);
            str(&p, "frames");
            frames_list(&p, tb, j % NTB, frame);
            op(&p, 'u');
        }
        op(&p, 'e');
    }
    op(&p, 'a'); /* the trace into device_traces */
    op(&p, 'u');
    op(&p, '.');
    char err[768] = "";
    mt_pk_doc_t *doc = NULL;
    if (mt__pk_parse(&doc, p.b, p.n, NULL, err, sizeof err) != 0)
        fail_msg("parse: %s", err);
    mt_ts_t *ts = NULL;
    if (mt__ts_from_pickle(&ts, doc, "shared.pickle", err, sizeof err) != 0)
        fail_msg("convert: %s", err);
    assert_int_equal(ts->nevents, NEV);
    assert_int_equal(ts->nstacks, 1 + NTB); /* one stack per list object, and the empty one */
    assert_int_equal(ts->nframes, NTB * DEPTH);
    for (size_t i = 0; i < ts->nevents; i++) {
        assert_int_equal(ts->events[i].stack, 1 + i % NTB);
        assert_int_equal(ts->events[i].addr, i * 512);
    }
    const mt_ts_frame_t *f = &ts->frames[ts->stacks[3].first + 4];
    assert_string_equal(f->name, "fn18"); /* traceback 2, depth 4: (2 * 7 + 4) % 64 */
    assert_int_equal(f->line, 18);
    mt__ts_destroy(&ts);
    free(p.b);
}

/* The shipped snapshots read to the same model as before the budget: the size of each
 * array. */
static void test_fixtures_unchanged(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        size_t segments, blocks, history, events, stacks, frames;
    } want[] = {
        /* counted by the reader before the budget existed */
        {"v113_segments.pickle", 2, 4, 3, 0, 4, 5},
        {"v113_segments_p4.pickle", 2, 4, 3, 0, 4, 5},
        {"v2_all_actions_p2.pickle", 3, 9, 0, 25, 4, 5},
        {"v2_all_actions_p3.pickle", 3, 9, 0, 25, 4, 5},
        {"v2_all_actions_p4.pickle", 3, 9, 0, 25, 4, 5},
        {"v2_all_actions_p5.pickle", 3, 9, 0, 25, 4, 5},
        /* two of its frames lists hold the same frames: one stack since stacks are
         * interned by content (was 8 stacks, 204 frames) */
        {"v2_torch_frames.pickle", 0, 0, 0, 9, 7, 172},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[1024], err[768];
        snprintf(path, sizeof path, "%s/%s", data_dir, want[i].file);
        mt_ts_t *ts = NULL;
        if (mt__ts_read(&ts, path, err, sizeof err) != 0)
            fail_msg("%s", err);
        size_t got[6] = {ts->nsegments, ts->nblocks, ts->nhistory,
                         ts->nevents,   ts->nstacks, ts->nframes};
        size_t exp[6] = {want[i].segments, want[i].blocks, want[i].history,
                         want[i].events,   want[i].stacks, want[i].frames};
        for (int k = 0; k < 6; k++)
            if (got[k] != exp[k])
                fail_msg("%s: count %d is %zu, was %zu", want[i].file, k, got[k], exp[k]);
        mt__ts_destroy(&ts);
    }
}

/* Streaming (mt__ts_read) gives the model of the whole read (mt__pk_parse_file then
 * mt__ts_from_pickle): the same events, each with the same frames, the same segments and
 * annotations; only stack ids may differ (streamed stacks are interned by content). The
 * generated files (argv[2], argv[3]) are bench/gen_snapshot.py's, both layouts. */
static void same_stack(const mt_ts_t *a, uint32_t sa, const mt_ts_t *b, uint32_t sb)
{
    assert_int_equal(a->stacks[sa].n, b->stacks[sb].n);
    for (uint32_t k = 0; k < a->stacks[sa].n; k++) {
        const mt_ts_frame_t *x = &a->frames[a->stacks[sa].first + k];
        const mt_ts_frame_t *y = &b->frames[b->stacks[sb].first + k];
        assert_string_equal(x->name, y->name);
        assert_string_equal(x->filename, y->filename);
        assert_int_equal(x->line, y->line);
    }
}

static void test_streamed_equals_whole(void **state)
{
    (void)state;
    const char *files[] = {"v2_all_actions_p2.pickle", "v2_all_actions_p4.pickle",
                           "v2_torch_frames.pickle", gen_files[0], gen_files[1]};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024], err[768];
        if (files[i] == NULL)
            fail_msg("no generated snapshot given (argv[2], argv[3])");
        if (strchr(files[i], '/') != NULL) /* a generated file, as meson names it */
            snprintf(path, sizeof path, "%s", files[i]);
        else
            snprintf(path, sizeof path, "%s/%s", data_dir, files[i]);
        mt_ts_t *s = NULL, *w = NULL;
        mt_pk_doc_t *doc = NULL;
        if (mt__ts_read(&s, path, err, sizeof err) != 0)
            fail_msg("%s", err);
        if (mt__pk_parse_file(&doc, path, NULL, err, sizeof err) != 0 ||
            mt__ts_from_pickle(&w, doc, path, err, sizeof err) != 0)
            fail_msg("%s", err);
        assert_int_equal(s->nevents, w->nevents);
        assert_int_equal(s->ndevices, w->ndevices);
        assert_int_equal(s->skipped_actions, w->skipped_actions);
        for (unsigned d = 0; d <= s->ndevices; d++)
            assert_int_equal(s->dev_first[d], w->dev_first[d]);
        for (size_t k = 0; k < s->nevents; k++) {
            const mt_ts_event_t *x = &s->events[k], *y = &w->events[k];
            assert_int_equal(x->addr, y->addr);
            assert_int_equal(x->size, y->size);
            assert_int_equal(x->stream, y->stream);
            assert_int_equal(x->time_us, y->time_us);
            assert_int_equal(x->action, y->action);
            assert_int_equal(x->device, y->device);
            assert_int_equal(x->tag, y->tag);
            same_stack(s, x->stack, w, y->stack);
        }
        assert_int_equal(s->nsegments, w->nsegments);
        assert_int_equal(s->nblocks, w->nblocks);
        for (size_t k = 0; k < s->nblocks; k++) {
            assert_int_equal(s->blocks[k].addr, w->blocks[k].addr);
            assert_int_equal(s->blocks[k].state, w->blocks[k].state);
            same_stack(s, s->blocks[k].stack, w, w->blocks[k].stack);
        }
        assert_int_equal(s->nannotations, w->nannotations);
        assert_true(s->nstacks <= w->nstacks);
        mt__ts_destroy(&s);
        mt__ts_destroy(&w);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR GEN_SEPARATE.pickle GEN_SHARED.pickle\n", argv[0]);
        return 2;
    }
    data_dir = argv[1];
    if (argc > 3) {
        gen_files[0] = argv[2];
        gen_files[1] = argv[3];
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_trace_lists),
        cmocka_unit_test(test_shared_segments_and_blocks),
        cmocka_unit_test(test_shared_wide_frame),
        cmocka_unit_test(test_shared_frames_lists_read),
        cmocka_unit_test(test_fixtures_unchanged),
        cmocka_unit_test(test_streamed_equals_whole),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
