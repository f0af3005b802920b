/* libFuzzer harness: the fast event decoder (analysis/ndjson_fast.c) against the jansson
 * path, on one line. The decoder declines, or decodes the record, pid and tag jansson and
 * mt_prof_event_from_json decode (tests/analysis/fast_check.h); and two reports, one
 * reading each way, return the same code and message for the line and hold the same
 * processes with as many events after it. */
#include <string.h>

#include "analysis/report.h"
#include "tests/analysis/fast_check.h"
#include "tests/fuzz/fuzz.h"

/* Kept across inputs: both see the same lines in the same order, so they stay alike. */
static mt__report_t *fast, *slow;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fast) {
        mt__report_cfg_t general = mt__report_cfg_default();
        general.general_reader = true;
        FUZZ_CHECK(mt__report_create(&slow, &general) == 0, "a report");
        FUZZ_CHECK(mt__report_create(&fast, NULL) == 0, "a report");
    }
    const char *line = (const char *)data;
    char why[160] = "";
    fast_check_e rc = fast_check(line, size, why, sizeof why);
    if (rc == FAST_DIFFERS)
        fprintf(stderr, "fast decoder: %s\n", why);
    FUZZ_CHECK(rc != FAST_DIFFERS, "the fast decoder declines or agrees with jansson");
    char e1[256] = "", e2[256] = "";
    int r1 = mt__report_add_line(slow, line, size, e1, sizeof e1);
    int r2 = mt__report_add_line(fast, line, size, e2, sizeof e2);
    if (r1 != r2 || strcmp(e1, e2) != 0)
        fprintf(stderr, "jansson %d \"%s\", fast %d \"%s\"\n", r1, e1, r2, e2);
    FUZZ_CHECK(r1 == r2 && strcmp(e1, e2) == 0, "the report reads the line alike both ways");
    /* What it did with it: the same processes, each with as many events. */
    size_t n = mt__report_process_count(slow);
    FUZZ_CHECK(mt__report_process_count(fast) == n, "the same processes both ways");
    for (size_t i = 0; i < n; i++) {
        int p1, p2;
        const char *name;
        size_t ev1, ev2;
        FUZZ_CHECK(mt__report_process(slow, i, &p1, &name, &ev1) == 0, "a process");
        FUZZ_CHECK(mt__report_process(fast, i, &p2, &name, &ev2) == 0, "a process");
        FUZZ_CHECK(p1 == p2 && ev1 == ev2, "the same events both ways");
    }
    return 0;
}
