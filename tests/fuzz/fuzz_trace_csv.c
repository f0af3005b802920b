/* libFuzzer harness: the RMM CSV reader and the loader's semantic checks (what
 * `memtrace replay` runs on a trace file). The input is the whole file. Checks beyond
 * "no crash": a rejected file names what was wrong, an accepted one keeps the loaded
 * trace's invariants (trace_csv.h). */
#include <string.h>

#include "memtrace/common.h"
#include "tests/fuzz/fuzz.h"
#include "analysis/trace_csv.h"

enum { READ_CHUNK = 64 * 1024 }; /* the reader's buffer (trace_csv.c CHUNK) */

/* Boundary mode (input starts with 0xff, then a byte k): the rest of the input is put
 * after the header and rows of "allocate failure" that end k bytes before the reader's
 * first refill, so that the fuzzer's short inputs meet a line cut by a refill. Returns
 * the new file (malloc'ed) or NULL. */
static char *boundary_file(const uint8_t *data, size_t size, size_t *len, unsigned long *lines)
{
    /* Rows of two lengths (Size 0 or 10) fill the prefix to the exact byte. */
    static const char row[] = "1,00:00:00.000000,allocate failure,0x0,0,0\n";
    static const char row1[] = "1,00:00:00.000000,allocate failure,0x0,10,0\n";
    size_t rowlen = sizeof row - 1, k = data[1];
    size_t prefix = READ_CHUNK - k, hlen = sizeof MT_TRACE_HEADER; /* with its '\n' */
    size_t nrows = (prefix - hlen) / rowlen, longer = (prefix - hlen) % rowlen;
    char *f = malloc(prefix + size);
    if (!f)
        return NULL;
    memcpy(f, MT_TRACE_HEADER "\n", hlen);
    size_t o = hlen;
    for (size_t i = 0; i < nrows; i++) {
        memcpy(f + o, i < longer ? row1 : row, rowlen + (i < longer));
        o += rowlen + (i < longer);
    }
    *lines = 1 + nrows;
    memcpy(f + o, data + 2, size - 2);
    *len = o + size - 2;
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *built = NULL;
    unsigned long prefix_lines = 0;
    if (size >= 2 && data[0] == 0xff) {
        built = boundary_file(data, size, &size, &prefix_lines);
        FUZZ_CHECK(built != NULL, "out of memory");
        data = (const uint8_t *)built;
    }
    /* fmemopen of zero bytes fails on glibc: an empty file is a 1-byte-less buffer. */
    FILE *f = size ? fmemopen((void *)data, size, "r") : fopen("/dev/null", "r");
    FUZZ_CHECK(f != NULL, "cannot open the input as a stream");
    char err[MT_TRACE_ERR_LEN] = "";
    mt_trace_t *t = NULL;
    int rc = mt__trace_load_file(&t, f, "fuzz.csv", err, sizeof err);
    fclose(f);
    free(built);
    if (rc != 0) {
        FUZZ_CHECK(rc < 0 && t == NULL, "a failed load returns a negative code and no trace");
        FUZZ_CHECK(strncmp(err, "fuzz.csv", 8) == 0, "the message names the file");
        FUZZ_CHECK(strlen(err) > 10, "the message says what was wrong");
        /* In boundary mode the prefix is valid: the error is in the fuzzer's part. */
        if (prefix_lines && strncmp(err, "fuzz.csv:", 9) == 0 && err[9] >= '0' && err[9] <= '9' &&
            strtoul(err + 9, NULL, 10) <= prefix_lines)
            fprintf(stderr, "%s (the prefix has %lu lines)\n", err, prefix_lines);
        if (prefix_lines && strncmp(err, "fuzz.csv:", 9) == 0 && err[9] >= '0' && err[9] <= '9')
            FUZZ_CHECK(strtoul(err + 9, NULL, 10) > prefix_lines, "the prefix loads");
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
    mt__trace_free(&t);
    FUZZ_CHECK(t == NULL, "free clears the pointer");
    return 0;
}
