/* libFuzzer harness: `memtrace report` over an arbitrary log (analysis/report.c, the
 * analysis tools/cmd_report.c runs): every line is added, malformed ones must be refused
 * with a message, and the analysis of whatever was accepted must come out as JSON (with
 * the call sites, named through the module lines' files, most of the time). */
#include <jansson.h>
#include <string.h>

#include "memtrace/common.h"
#include "analysis/report.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mt__report_cfg_t cfg = mt__report_cfg_default();
    /* A few timeline steps and rows keep a run fast; the first byte varies them so the
     * sampling arithmetic sees odd sizes too. */
    if (size > 0) {
        cfg.timeline_steps = 1u + data[0] % 32u;
        cfg.top = data[0] % 8u;
        cfg.by_callsite = (data[0] & 0x40) != 0; /* the call-site views and symbolizer too */
        data++;
        size--;
    }
    mt__report_t *r = NULL;
    FUZZ_CHECK(mt__report_create(&r, &cfg) == 0, "report created");
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char err[256] = "";
        int rc = mt__report_add_line(r, p, len, err, sizeof err);
        FUZZ_CHECK(rc == 0 || (rc == MT_EPROTO && err[0] != '\0'), "a refused line gets a message");
        p += len + (nl ? 1 : 0);
    }
    json_t *res = mt__report_result(r);
    FUZZ_CHECK(res != NULL && json_is_object(res), "the analysis is a JSON object");
    char *s = json_dumps(res, JSON_COMPACT);
    FUZZ_CHECK(s != NULL, "the analysis serializes");
    free(s);
    json_decref(res);
    mt__report_destroy(&r);
    FUZZ_CHECK(r == NULL, "destroy clears the pointer");
    return 0;
}
