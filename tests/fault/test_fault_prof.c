/* Host-allocation failures in the profiler: create (ring, local log, drainer thread),
 * events from an allocator through the sink, flush (the drain and the line encoder), stats,
 * the JSON documents (jansson) and decoding, destroy. Each call returns 0 or MT_ENOMEM (a
 * JSON builder: NULL), and nothing leaks. Also checks the injector itself. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "util/json.h"
#include "inject.h"
#include "tests/common/test_main.h"

#define MIB ((size_t)1 << 20)

#define OK_OR_ENOMEM(call)                                                                         \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0 && rc_ != MT_ENOMEM)                                                          \
            fail_msg("%s returned %d (%s) with host allocation %ld failed", #call, rc_,            \
                     mt_strerror(rc_), fault_target());                                            \
    } while (0)

/* The injector fails what it is told to, in every family, jansson's included. */
static void test_injector(void **state)
{
    (void)state;
    fault_arm(1);
    void *p = malloc(16);
    assert_true(fault_disarm());
    assert_null(p);
    fault_arm(2);
    char *s = strdup("x");
    json_t *j = json_object();
    assert_true(fault_disarm());
    assert_non_null(s);
    assert_null(j);
    free(s);
    fault_arm(1);
    void *q = NULL;
    assert_int_equal(posix_memalign(&q, 64, 128), ENOMEM);
    assert_true(fault_disarm());
    long live = fault_live();
    fault_arm(0);
    char *line = NULL;
    assert_true(asprintf(&line, "%d", 42) > 0); /* inside glibc, numbered too */
    assert_false(fault_disarm());
    assert_true(fault_count() >= 1);
    assert_int_equal(fault_live(), live + 1);
    free(line);
    assert_int_equal(fault_live(), live);
}

typedef struct {
    char dir[64];
    char log[128];
} prof_case_t;

static void prof_scenario(void *ud)
{
    prof_case_t *c = ud;
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    pc.mode = MT_PROF_LOG;
    pc.log_path = c->log;
    pc.name = "fault";
    pc.slots = 64;
    mt_prof_t *p = NULL;
    OK_OR_ENOMEM(mt_prof_create(&p, &pc));
    if (p == NULL)
        goto out;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 256 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    mt_alloc_t *a = NULL;
    OK_OR_ENOMEM(mt_backend_create(&b, &bc));
    if (b != NULL) {
        mt_alloc_cfg_t ac = mt_alloc_cfg_default();
        ac.backend = b;
        ac.sink = mt_prof_sink(p);
        OK_OR_ENOMEM(mt_alloc_create(&a, &ac));
    }
    if (a != NULL) {
        int tag = 0;
        OK_OR_ENOMEM(mt_alloc_tag_register(a, "fault-tag", &tag));
        void *x = NULL, *y = NULL;
        OK_OR_ENOMEM(mt_alloc_malloc(a, 1000, NULL, tag, &x));
        OK_OR_ENOMEM(mt_alloc_malloc(a, 3 * MIB, NULL, 0, &y));
        OK_OR_ENOMEM(mt_prof_flush(p));
        mt_alloc_stats_t st;
        assert_int_equal(mt_alloc_stats(a, &st), 0);
        json_decref(mt_prof_stats_to_json(&st, 1, 0, NULL, NULL));
        mt_alloc_snapshot_t *snap = NULL;
        OK_OR_ENOMEM(mt_alloc_snapshot(a, &snap));
        if (snap != NULL)
            json_decref(mt_prof_snapshot_to_json(snap, 1, 0, NULL, NULL));
        mt_alloc_snapshot_free(&snap);
        OK_OR_ENOMEM(mt_alloc_free(a, x));
        OK_OR_ENOMEM(mt_alloc_free(a, y));
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_destroy(&a);
    }
    mt_backend_destroy(&b);
    OK_OR_ENOMEM(mt_prof_flush(p));
    mt_prof_stats_t ps;
    mt_prof_stats(p, &ps);
    assert_int_equal(ps.mode, MT_PROF_LOG);
    mt_prof_destroy(&p);
out:
    unlink(c->log);
}

/* Decoding the lines the encoder writes: jansson's parse and the event decoder. */
static void decode_scenario(void *ud)
{
    (void)ud;
    mt_event_rec_t ev = {
        .kind = MT_EV_ALLOC, .addr = 4096, .size = 512, .requested = 500, .seq = 3, .time_ns = 10};
    char line[1024];
    size_t n = mt_prof_event_write(line, sizeof line, &ev, 7, NULL, NULL);
    assert_true(n > 0 && n < sizeof line);
    json_error_t jerr;
    json_t *j = json_loadb(line, n, 0, &jerr);
    if (j == NULL)
        return; /* jansson ran out: nothing of ours to check */
    mt_event_rec_t back;
    int pid = 0;
    char err[256];
    OK_OR_ENOMEM(mt_prof_event_from_json(j, &back, &pid, err, sizeof err));
    json_decref(j);
    json_decref(mt_prof_hello_to_json(7, "fault", 1, 2));
}

static void test_prof(void **state)
{
    (void)state;
    prof_case_t c;
    snprintf(c.dir, sizeof c.dir, "/tmp/mt-fault-XXXXXX");
    assert_non_null(mkdtemp(c.dir));
    snprintf(c.log, sizeof c.log, "%s/log.ndjson", c.dir);
    assert_true(fault_loop("prof", prof_scenario, &c) > 20);
    assert_int_equal(rmdir(c.dir), 0);
}

static void test_decode(void **state)
{
    (void)state;
    assert_true(fault_loop("prof decode", decode_scenario, NULL) > 2);
}

typedef struct dump_case_s {
    json_t *doc;
    const char *clean; /* its text, dumped unarmed */
} dump_case_t;

/* The whole text or none: jansson's json_dumps, whose buffer grows as it writes, leaves a
 * key's text out when a growth fails on it, and says success. */
static void dumps_scenario(void *ud)
{
    const dump_case_t *c = ud;
    char *s = NULL;
    size_t n = 0;
    int rc = mt__json_dumps(c->doc, JSON_COMPACT, &s, &n);
    if (rc == 0) {
        assert_string_equal(s, c->clean);
        assert_int_equal(n, strlen(c->clean));
    } else {
        assert_int_equal(rc, MT_ENOMEM);
        assert_null(s);
    }
    free(s);
}

static void test_json_dumps(void **state)
{
    (void)state;
    /* Keys longer and longer: the text's buffer would grow on several of them. */
    json_t *doc = json_object();
    char key[200];
    for (int i = 0; doc != NULL && i < 12; i++) {
        snprintf(key, sizeof key, "key_%d_%0*d", i, 20 + 10 * i, 0);
        assert_int_equal(json_object_set_new(doc, key, json_integer(i)), 0);
    }
    assert_non_null(doc);
    char *clean = json_dumps(doc, JSON_COMPACT);
    assert_non_null(clean);
    dump_case_t c = {.doc = doc, .clean = clean};
    assert_true(fault_loop("mt__json_dumps", dumps_scenario, &c) >= 1);
    free(clean);
    json_decref(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_injector),
        cmocka_unit_test(test_prof),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_json_dumps),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
