/* Ranks and jobs (docs/fleet.md): each launcher's variables reach mt_prof_cfg_t.job, in the
 * documented precedence; malformed values are skipped with a warning; the fields survive the
 * JSON round trip and reach the local log's header. */
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

#include "memtrace/prof.h"
#include "tests/common/test_main.h"

static const char *const all_vars[] = {
    "MEMTRACE_RANK",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "SLURM_PROCID",
    "MEMTRACE_LOCAL_RANK",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "MEMTRACE_WORLD_SIZE",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_NTASKS",
    "MEMTRACE_JOB",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "MEMTRACE_PROF",
};

static int clear_env(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
        unsetenv(all_vars[i]);
    return 0;
}

typedef struct warns_s {
    int n;
    char last[512];
} warns_t;

static void log_cb(void *ud, mt_log_level_e lvl, const char *msg)
{
    warns_t *w = ud;
    if (lvl == MT_LOG_WARN) {
        w->n++;
        snprintf(w->last, sizeof w->last, "%s", msg);
    }
}

static mt_prof_job_t from_env(warns_t *w)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    memset(w, 0, sizeof *w);
    cfg.log = log_cb;
    cfg.log_ud = w;
    assert_int_equal(mt_prof_cfg_from_env(&cfg), 0);
    return cfg.job;
}

static void test_unknown_by_default(void **state)
{
    (void)state;
    warns_t w;
    mt_prof_job_t j = from_env(&w);
    assert_int_equal(j.rank, -1);
    assert_int_equal(j.local_rank, -1);
    assert_int_equal(j.world_size, -1);
    assert_string_equal(j.id, "");
    assert_int_equal(w.n, 0);
}

static void test_torchrun(void **state)
{
    (void)state;
    setenv("RANK", "5", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("TORCHELASTIC_RUN_ID", "ddp-42", 1);
    warns_t w;
    mt_prof_job_t j = from_env(&w);
    assert_int_equal(j.rank, 5);
    assert_int_equal(j.local_rank, 1);
    assert_int_equal(j.world_size, 8);
    assert_string_equal(j.id, "ddp-42");
    assert_int_equal(w.n, 0);
}

static void test_mpirun(void **state)
{
    (void)state;
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    warns_t w;
    mt_prof_job_t j = from_env(&w);
    assert_int_equal(j.rank, 3);
    assert_int_equal(j.local_rank, 0);
    assert_int_equal(j.world_size, 4);
    assert_string_equal(j.id, "");
}

static void test_slurm(void **state)
{
    (void)state;
    setenv("SLURM_PROCID", "12", 1);
    setenv("SLURM_LOCALID", "2", 1);
    setenv("SLURM_NTASKS", "16", 1);
    setenv("SLURM_JOB_ID", "778899", 1);
    warns_t w;
    mt_prof_job_t j = from_env(&w);
    assert_int_equal(j.rank, 12);
    assert_int_equal(j.local_rank, 2);
    assert_int_equal(j.world_size, 16);
    assert_string_equal(j.id, "778899");
}

/* torchrun inside a Slurm allocation, with the user's override of the rank only. */
static void test_precedence(void **state)
{
    (void)state;
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_JOB_ID", "555", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("RANK", "6", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("TORCHELASTIC_RUN_ID", "none", 1); /* torchrun's default: no job */
    warns_t w;
    mt_prof_job_t j = from_env(&w);
    assert_int_equal(j.rank, 6);
    assert_int_equal(j.world_size, 8);
    assert_string_equal(j.id, "555");
    setenv("TORCHELASTIC_RUN_ID", "elastic-1", 1);
    j = from_env(&w);
    assert_string_equal(j.id, "elastic-1");
    setenv("MEMTRACE_RANK", "7", 1);
    setenv("MEMTRACE_JOB", "mine", 1);
    j = from_env(&w);
    assert_int_equal(j.rank, 7);
    assert_int_equal(j.world_size, 8);
    assert_string_equal(j.id, "mine");
    unsetenv("RANK");
    unsetenv("MEMTRACE_RANK");
    unsetenv("WORLD_SIZE");
    j = from_env(&w);
    assert_int_equal(j.rank, 2); /* OMPI before SLURM */
    assert_int_equal(j.world_size, 3);
    assert_int_equal(w.n, 0);
}

/* A malformed value is skipped with a warning naming it; the next source is used. */
static void test_bad_values(void **state)
{
    (void)state;
    static const char *const bad[] = {"3x", "-1", " 4", "+4", "", "99999999999", "16777216"};
    setenv("SLURM_PROCID", "4", 1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("RANK", bad[i], 1);
        warns_t w;
        mt_prof_job_t j = from_env(&w);
        assert_int_equal(j.rank, 4);
        assert_int_equal(w.n, bad[i][0] ? 1 : 0); /* "" is unset, silently */
        if (bad[i][0])
            assert_non_null(strstr(w.last, "RANK="));
    }
    setenv("RANK", "16777215", 1);
    warns_t w;
    assert_int_equal(from_env(&w).rank, 16777215);
    setenv("WORLD_SIZE", "0", 1); /* a job has at least one rank */
    assert_int_equal(from_env(&w).world_size, -1);
    assert_int_equal(w.n, 1);
    assert_non_null(strstr(w.last, "WORLD_SIZE='0'"));
    /* A bad MEMTRACE_PROF fails, and the job is read all the same. */
    setenv("MEMTRACE_PROF", "loud", 1);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    assert_int_equal(mt_prof_cfg_from_env(&cfg), MT_EINVAL);
    assert_int_equal(cfg.job.rank, 16777215);
}

static void test_job_id_sanitized(void **state)
{
    (void)state;
    setenv("MEMTRACE_JOB", "a b\"c\\d\n{e}", 1);
    warns_t w;
    mt_prof_job_t j = from_env(&w);
    assert_string_equal(j.id, "a_b_c_d__e_");
    assert_int_equal(w.n, 1);
    char longid[200];
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    setenv("MEMTRACE_JOB", longid, 1);
    j = from_env(&w);
    assert_int_equal(strlen(j.id), MT_PROF_JOB_MAX - 1);
    assert_int_equal(w.n, 1);
    setenv("MEMTRACE_JOB", "slurm-12:step.0@host+1", 1);
    j = from_env(&w);
    assert_string_equal(j.id, "slurm-12:step.0@host+1");
    assert_int_equal(w.n, 0);
}

static json_t *reparse(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    assert_non_null(s);
    json_t *back = json_loads(s, 0, NULL);
    assert_non_null(back);
    free(s);
    json_decref(j);
    return back;
}

static void test_hello_round_trip(void **state)
{
    (void)state;
    mt_prof_job_t j = {.rank = 5, .local_rank = 1, .world_size = 8, .id = "job-9"};
    json_t *h = mt_prof_hello_to_json(42, "train", 1, 2);
    assert_non_null(h);
    assert_int_equal(mt_prof_job_to_json(h, &j), 0);
    h = reparse(h);
    mt_prof_job_t back;
    assert_true(mt_prof_job_from_json(h, &back));
    assert_int_equal(back.rank, 5);
    assert_int_equal(back.local_rank, 1);
    assert_int_equal(back.world_size, 8);
    assert_string_equal(back.id, "job-9");
    json_decref(h);

    /* Unknown fields are left out, and read back unknown. */
    mt_prof_job_t u = mt_prof_job_unknown();
    h = mt_prof_hello_to_json(42, "train", 1, 2);
    assert_int_equal(mt_prof_job_to_json(h, &u), 0);
    assert_null(json_object_get(h, "rank"));
    assert_null(json_object_get(h, "job"));
    assert_false(mt_prof_job_from_json(h, &back));
    assert_int_equal(back.rank, -1);
    json_decref(h);

    /* A hostile hello: out-of-range counts are unknown, the id sanitized. */
    h = json_loads("{\"rank\":-3,\"local_rank\":\"1\",\"world_size\":0,\"job\":\"x\\\"}\"}", 0,
                   NULL);
    assert_non_null(h);
    assert_true(mt_prof_job_from_json(h, &back));
    assert_int_equal(back.rank, -1);
    assert_int_equal(back.local_rank, -1);
    assert_int_equal(back.world_size, -1);
    assert_string_equal(back.id, "x__");
    json_decref(h);
}

/* The local log's first line carries the job, and a job filled by hand is checked. */
static void test_log_header(void **state)
{
    (void)state;
    char logp[96], sock[96];
    snprintf(logp, sizeof logp, "/tmp/mt_prof_job_%d.ndjson", (int)getpid());
    snprintf(sock, sizeof sock, "/tmp/mt_prof_job_%d.nosuch.sock", (int)getpid());
    unlink(logp);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = logp;
    cfg.socket = sock;
    cfg.job.rank = 3;
    cfg.job.world_size = 4;
    cfg.job.local_rank = -7; /* out of range: unknown */
    snprintf(cfg.job.id, sizeof cfg.job.id, "run 1");
    mt_prof_t *p = NULL;
    setenv("MEMTRACE_OOM_DIR", "off", 1);
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_prof_destroy(&p);
    FILE *f = fopen(logp, "r");
    assert_non_null(f);
    char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    unlink(logp);
    json_t *h = json_loads(line, 0, NULL);
    assert_non_null(h);
    assert_string_equal(json_string_value(json_object_get(h, "type")), "hello");
    assert_int_equal(json_integer_value(json_object_get(h, "rank")), 3);
    assert_int_equal(json_integer_value(json_object_get(h, "world_size")), 4);
    assert_null(json_object_get(h, "local_rank"));
    assert_string_equal(json_string_value(json_object_get(h, "job")), "run_1");
    json_decref(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_unknown_by_default, clear_env),
        cmocka_unit_test_setup(test_torchrun, clear_env),
        cmocka_unit_test_setup(test_mpirun, clear_env),
        cmocka_unit_test_setup(test_slurm, clear_env),
        cmocka_unit_test_setup(test_precedence, clear_env),
        cmocka_unit_test_setup(test_bad_values, clear_env),
        cmocka_unit_test_setup(test_job_id_sanitized, clear_env),
        cmocka_unit_test_setup(test_hello_round_trip, clear_env),
        cmocka_unit_test_setup(test_log_header, clear_env),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
