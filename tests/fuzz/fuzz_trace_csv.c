/* libFuzzer harness: the RMM CSV reader and the loader's semantic checks (what
 * `memtrace replay` runs on a trace file). The input is the whole file. Checks beyond
 * "no crash": a rejected file names what was wrong, an accepted one keeps the loaded
 * trace's invariants (trace_csv.h). */
#include <string.h>

#include "memtrace/common.h"
#include "tests/fuzz/fuzz.h"
#include "tools/trace_csv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* fmemopen of zero bytes fails on glibc: an empty file is a 1-byte-less buffer. */
    FILE *f = size ? fmemopen((void *)data, size, "r") : fopen("/dev/null", "r");
    FUZZ_CHECK(f != NULL, "cannot open the input as a stream");
    char err[MT_TRACE_ERR_LEN] = "";
    mt_trace_t *t = NULL;
    int rc = mt_trace_load_file(&t, f, "fuzz.csv", err, sizeof err);
    fclose(f);
    if (rc != 0) {
        FUZZ_CHECK(rc < 0 && t == NULL, "a failed load returns a negative code and no trace");
        FUZZ_CHECK(strncmp(err, "fuzz.csv", 8) == 0, "the message names the file");
        FUZZ_CHECK(strlen(err) > 10, "the message says what was wrong");
        return 0;
    }
    FUZZ_CHECK(t != NULL, "a successful load returns a trace");
    /* Null-pointer rows (zero-byte allocates, frees of nullptr) are counted, not ops. */
    FUZZ_CHECK(t->nops <= t->nallocs + t->nfrees, "ops are allocates and frees");
    FUZZ_CHECK(t->nrows == t->nallocs + t->nfrees + t->nfailures, "every row is counted once");
    FUZZ_CHECK(t->nslots == t->nallocs, "one slot per allocate");
    FUZZ_CHECK(t->nops == 0 || t->nstreams >= 1, "ops have streams");
    size_t live = 0;
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        FUZZ_CHECK(op->slot < t->nslots, "slot in range");
        FUZZ_CHECK(op->stream < t->nstreams, "stream index in range");
        FUZZ_CHECK(op->action == MT_TRACE_ALLOCATE || op->action == MT_TRACE_FREE,
                   "only allocates and frees");
        live = op->action == MT_TRACE_ALLOCATE ? live + 1 : live - 1;
        FUZZ_CHECK(live <= t->peak_live_count, "peak count is a bound");
    }
    FUZZ_CHECK(live == t->leaked, "the live allocations at the end are the leaks");
    mt_trace_free(&t);
    FUZZ_CHECK(t == NULL, "free clears the pointer");
    return 0;
}
