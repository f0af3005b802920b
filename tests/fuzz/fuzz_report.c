/* libFuzzer harness: `memtrace report` over an arbitrary log (analysis/report.c, the
 * analysis tools/cmd_report.c runs): every line is added, malformed ones must be refused
 * with a message, and the analysis of whatever was accepted must come out as JSON (with
 * the call sites, named through the module lines' files, most of the time). */
#include <jansson.h>
#include <stdlib.h>
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
    /* Each process's model with its stack table: per-stack figures and frames
     * of any id, unknown ones included, stay within their bounds. */
    for (size_t i = 0; i < mt__report_process_count(r); i++) {
        mt_model_t *m = NULL;
        if (mt__report_model(r, i, &m) != 0)
            continue;
        for (int cls = 0; cls < MT_MODEL_CLASSES; cls++) {
            mt_model_stack_t *rows = NULL;
            size_t n = 0;
            FUZZ_CHECK(mt__model_stacks(m, cls, NULL, &rows, &n) == 0 || n == 0, "stack rows");
            mt_model_figures_t f;
            mt__model_figures_totals(m, cls, &f);
            for (size_t k = 0; k < n; k++) {
                FUZZ_CHECK(rows[k].peak_bytes <= f.peak_allocated && rows[k].bytes <= f.allocated,
                           "a stack's bytes are within the class's totals");
                const mt_model_frame_t *fr;
                int nf;
                bool tr;
                int rc = mt__model_stack_frames(m, rows[k].stack, &fr, &nf, &tr);
                FUZZ_CHECK(rc == 0 ? nf >= 0 && nf <= MT_STACK_DEPTH_MAX && (nf == 0 || fr)
                                   : fr == NULL && nf == 0,
                           "a stack's frames are bounded, an unknown one has none");
                for (int q = 0; rc == 0 && q < nf; q++)
                    FUZZ_CHECK(!fr[q].py_func || fr[q].py_file, "a Python frame has a file");
            }
            free(rows);
        }
        const mt_model_module_t *mods;
        size_t nm;
        mt__model_modules(m, &mods, &nm);
        for (size_t k = 0; k < nm; k++)
            FUZZ_CHECK(mods[k].size > 0 && mods[k].path[0], "modules are non-empty");
        char why[256];
        FUZZ_CHECK(mt__model_check(m, why, sizeof why) == 0, "the model's invariants hold");
        mt__model_destroy(&m);
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
