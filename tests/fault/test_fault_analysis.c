/* Host-allocation failures in the offline readers: the trace CSV reader and loader
 * (fopen, getline, the op and stream arrays, the pointer table) and the replay through
 * the allocator (backend, allocator, warm-up, sampled peak). Each returns 0 or MT_ENOMEM
 * with a message, and nothing leaks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/common.h"
#include "analysis/replay.h"
#include "analysis/trace_csv.h"
#include "inject.h"
#include "tests/common/test_main.h"

#define OK_OR_ENOMEM(call)                                                                         \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0 && rc_ != MT_ENOMEM)                                                          \
            fail_msg("%s returned %d (%s) with host allocation %ld failed", #call, rc_,            \
                     mt_strerror(rc_), fault_target());                                            \
    } while (0)

typedef struct {
    char dir[64];
    char path[128];
    const char *conf;
} trace_case_t;

static void write_trace(trace_case_t *c)
{
    FILE *f = fopen(c->path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", MT_TRACE_HEADER);
    unsigned long long t = 0;
    /* Two streams, sizes across both pools, an allocate failure, a leak at the end. */
    for (int i = 0; i < 24; i++) {
        unsigned long long size = (i % 3 == 0) ? (3ull << 20) + (unsigned)i * 4096 : 1000u + i;
        fprintf(f, "1,00:00:00.%06llu,allocate,0x%llx,%llu,%x\n", t++,
                0x10000000ull + i * 0x1000000ull, size, (unsigned)(i % 2) * 0x5a);
        if (i >= 2 && i % 2 == 0) {
            unsigned long long fs =
                ((i - 2) % 3 == 0) ? (3ull << 20) + (unsigned)(i - 2) * 4096 : 1000u + (i - 2);
            fprintf(f, "1,00:00:00.%06llu,free,0x%llx,%llu,0\n", t++,
                    0x10000000ull + (i - 2) * 0x1000000ull, fs);
        }
    }
    fprintf(f, "1,00:00:00.%06llu,allocate failure,0x0,1073741824000,0\n", t++);
    assert_int_equal(fclose(f), 0);
}

static void trace_scenario(void *ud)
{
    trace_case_t *c = ud;
    char err[MT_TRACE_ERR_LEN] = "";
    mt_trace_t *t = NULL;
    int rc = mt__trace_load(&t, c->path, err, sizeof err);
    OK_OR_ENOMEM(rc);
    if (rc != 0) {
        assert_non_null(strstr(err, c->path)); /* the message names the file */
        assert_null(t);
        return;
    }
    assert_int_equal(t->nfailures, 1);
    mt_replay_cfg_t cfg = mt__replay_cfg_default();
    cfg.alloc_conf = c->conf;
    cfg.capacity = (size_t)1 << 30;
    cfg.warmup = true;
    cfg.sample_peak = true;
    mt_replay_result_t res;
    err[0] = '\0';
    rc = mt__replay_run(t, &cfg, &res, err, sizeof err);
    OK_OR_ENOMEM(rc);
    if (rc != 0)
        assert_true(err[0] != '\0');
    mt__trace_free(&t);
    assert_null(t);
}

static void run_case(const char *name, const char *conf)
{
    trace_case_t c = {.conf = conf};
    snprintf(c.dir, sizeof c.dir, "/tmp/mt-fault-XXXXXX");
    assert_non_null(mkdtemp(c.dir));
    snprintf(c.path, sizeof c.path, "%s/trace.csv", c.dir);
    write_trace(&c);
    assert_true(fault_loop(name, trace_scenario, &c) > 10);
    assert_int_equal(unlink(c.path), 0);
    assert_int_equal(rmdir(c.dir), 0);
}

static void test_trace_replay(void **state)
{
    (void)state;
    run_case("trace+replay", NULL);
}

static void test_trace_replay_expandable(void **state)
{
    (void)state;
    run_case("trace+replay expandable", "expandable_segments:True");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_replay),
        cmocka_unit_test(test_trace_replay_expandable),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
