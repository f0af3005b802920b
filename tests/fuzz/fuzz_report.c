/* libFuzzer harness: `memtrace report` over an arbitrary log (analysis/report.c, the
 * analysis tools/cmd_report.c runs): every line is added, malformed ones must be refused
 * with a message, and the analysis of whatever was accepted must come out as JSON (with
 * the call sites, named through the module lines' files, most of the time). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "analysis/report.h"
#include "analysis/torch_snapshot.h"
#include "tests/fuzz/fuzz.h"

/* The first process as `memtrace export` writes it: blocks tile their segment, a device's
 * segments lie apart, and its trace is one memory_viz's state view walks whole (a second
 * walk leaves nothing out). */
static void check_export(const mt__report_t *r)
{
    mt_ts_t *ts = NULL;
    char err[256];
    if (mt__ts_from_report(&ts, r, 0, 1, err, sizeof err) != 0)
        return;
    uint64_t end[256] = {0};
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *g = &ts->segments[i];
        FUZZ_CHECK(g->addr >= end[(uint8_t)g->device], "a device's segments lie apart");
        end[(uint8_t)g->device] = g->addr + g->total_size;
        uint64_t at = g->addr;
        for (uint32_t k = 0; k < g->nblocks; k++) {
            FUZZ_CHECK(ts->blocks[g->first_block + k].addr == at, "blocks tile their segment");
            at += ts->blocks[g->first_block + k].size;
        }
        FUZZ_CHECK(g->nblocks == 0 || at == g->addr + g->total_size, "blocks fill the segment");
    }
    size_t again = 1;
    FUZZ_CHECK(mt__ts_viz_safe(ts, &again) == 0 && again == 0, "one walk leaves the trace whole");
    mt__ts_destroy(&ts);
}

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
    if (mt__report_process_count(r) > 0)
        check_export(r);
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
