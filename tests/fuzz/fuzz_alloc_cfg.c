/* libFuzzer harness: the allocator's configuration string (MEMTRACE_ALLOC_CONF, e.g.
 * "max_split_size_mb:64,garbage_collection_threshold:0.8"), parsed onto the defaults and
 * then validated as mt_alloc_create would. A rejected string must name what was wrong. */
#include <string.h>

#include "allocator/internal.h"
#include "memtrace/alloc.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    FUZZ_CHECK(s != NULL, "out of memory");
    memcpy(s, data, size);
    s[size] = '\0';
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    char err[256] = "";
    int rc = mt_alloc_cfg_parse(&cfg, s, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(rc < 0, "errors are negative codes");
        FUZZ_CHECK(err[0] != '\0', "a rejected string gets a message");
    } else {
        err[0] = '\0';
        rc = mt__alloc_cfg_validate(&cfg, err, sizeof err);
        FUZZ_CHECK(rc <= 0, "errors are negative codes");
        FUZZ_CHECK(rc == 0 || err[0] != '\0', "an invalid configuration gets a message");
    }
    /* A small error buffer must be truncated, never overrun (ASan watches the tail). */
    char *small = malloc(8);
    FUZZ_CHECK(small != NULL, "out of memory");
    cfg = mt_alloc_cfg_default();
    mt_alloc_cfg_parse(&cfg, s, small, 8);
    free(small);
    free(s);
    return 0;
}
