/* train_charlm --devices 2 against the single-device run: the same seed
 * and global batch give the same loss curve within float tolerance; no compaction warning
 * fires; the report shows each device's memory; each step moves one flat copy per buffer
 * and replica; --rebind shows the non-flat case, warned once per replica, with the bytes
 * compacted. MT_CHARLM and MT_MEMTRACE name the programs; the runs go to a private
 * temporary directory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/test_main.h"
#include "tests/common/test_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static const char *env(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL)
        fail_msg("%s is not set", name);
    return v;
}

static int sh(const char *cmd)
{
    char full[4096];
    snprintf(full, sizeof full, "cd '%s' && %s", dir, cmd);
    int rc = system(full);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *slurp(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char bufs[4][1 << 16];
    static int k;
    char *buf = bufs[k++ % 4];
    size_t n = fread(buf, 1, sizeof bufs[0] - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

#define ARGS "--epochs 1 --hidden 32 --batch 6 --min-len 8 --max-len 24 --sample 0 --seed 5"

static void run(const char *tag, const char *extra)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "MEMTRACE_BACKEND=sim MEMTRACE_SIM_DEVICES=2 MEMTRACE_SIM_CAPACITY=1G "
             "MEMTRACE_PROF=log MEMTRACE_LOG=%s.ndjson '%s' " ARGS " %s > %s.out 2>&1",
             tag, env("MT_CHARLM"), extra, tag);
    int rc = sh(cmd);
    if (rc != 0) {
        char name[64];
        snprintf(name, sizeof name, "%s.out", tag);
        fprintf(stderr, "%s", slurp(name));
    }
    assert_int_equal(rc, 0);
}

static void test_same_loss_curve_flat_replicas(void **state)
{
    (void)state;
    run("one", "--loss-log one.loss");
    run("two", "--devices 2 --loss-log two.loss");
    FILE *a = fopen(strcat(strcpy((char[512]){0}, dir), "/one.loss"), "r");
    FILE *b = fopen(strcat(strcpy((char[512]){0}, dir), "/two.loss"), "r");
    assert_non_null(a);
    assert_non_null(b);
    double x, y, worst = 0;
    size_t n = 0;
    while (fscanf(a, "%lf", &x) == 1) {
        assert_int_equal(fscanf(b, "%lf", &y), 1);
        worst = fabs(x - y) > worst ? fabs(x - y) : worst;
        n++;
    }
    assert_int_equal(fscanf(b, "%lf", &y), EOF); /* as many batches */
    fclose(a);
    fclose(b);
    assert_true(n > 100);
    printf("%zu batches, largest loss difference %.3g bits/char\n", n, worst);
    assert_true(worst < 1e-4); /* float reordering of the sums only */

    char *out = slurp("two.out");
    assert_int_equal(mt_test_count(out, "not in the flat weight buffer"), 0);
    assert_non_null(strstr(out, "replica on device 1: weights flat, 0 compactions"));
    /* 2 out (LSTM and head weights), 2 back (their gradients) */
    assert_non_null(strstr(out, "per step: 4.0 peer copies"));
    assert_non_null(strstr(out, "self-check: passed"));

    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' report two.ndjson > two.report 2>&1", env("MT_MEMTRACE"));
    assert_int_equal(sh(cmd), 0);
    char *rep = slurp("two.report");
    assert_non_null(strstr(rep, "by device"));
    assert_non_null(strstr(rep, "    device 0   peak allocated"));
    assert_non_null(strstr(rep, "    device 1   peak allocated"));
}

static void test_rebind_warns_once_per_replica(void **state)
{
    (void)state;
    run("rebind", "--devices 2 --rebind");
    char *out = slurp("rebind.out");
    /* the model on device 0 and the replica on device 1: once each, not per step */
    assert_int_equal(mt_test_count(out, "not in the flat weight buffer"), 2);
    assert_non_null(strstr(out, "replica on device 1: weights NOT flat"));
    const char *c = strstr(out, "replica on device 1: weights NOT flat, ");
    unsigned long long comp = 0;
    double mib = 0;
    assert_int_equal(
        sscanf(c, "replica on device 1: weights NOT flat, %llu compactions, %lf MiB", &comp, &mib),
        2);
    assert_true(comp > 100);
    assert_true(mib > 1.0);
    /* the broadcast now goes parameter by parameter: 4 LSTM parameters + the head */
    assert_non_null(strstr(out, "per step: 7.0 peer copies"));
}

static void test_bad_device_count(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "MEMTRACE_BACKEND=sim MEMTRACE_SIM_DEVICES=1 MEMTRACE_PROF=off '%s' " ARGS
             " --devices 2 > bad.out 2>&1",
             env("MT_CHARLM"));
    assert_int_equal(sh(cmd), 2);
    assert_non_null(strstr(slurp("bad.out"), "--devices 2 but the sim backend has 1 device"));
    snprintf(cmd, sizeof cmd, "MEMTRACE_SIM_DEVICES=2x '%s' --devices 2 > bad2.out 2>&1",
             env("MT_CHARLM"));
    assert_int_equal(sh(cmd), 2);
    assert_non_null(strstr(slurp("bad2.out"), "MEMTRACE_SIM_DEVICES"));
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/mt-charlm-devices-XXXXXX", getenv("TMPDIR") ?: "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_loss_curve_flat_replicas),
        cmocka_unit_test(test_rebind_warns_once_per_replica),
        cmocka_unit_test(test_bad_device_count),
    };
    return MT_TEST_RUN(tests, setup, teardown);
}
