/* libFuzzer harness: the binary log's reader (analysis/binlog_read.c) on any bytes. It
 * never reads out of bounds or loops; every event it gives makes a line that is valid
 * JSON (the one encoder's, whatever the record holds); the readers' items (lines_pipe) are
 * one per record, damage included; and the conversion to NDJSON gives as many lines. */
#include <jansson.h>
#include <string.h>

#include "analysis/binlog_conv.h"
#include "memtrace/prof.h"
#include "tests/fuzz/fuzz.h"

typedef struct seen_s {
    unsigned long records, bad;
    char line[1 << 16];
} seen_t;

static int on_rec(void *ud, const mt__blog_rec_t *r, int32_t pid, const char *const *names)
{
    seen_t *s = ud;
    s->records++;
    if (r->type != MT__BLOG_EVENT)
        return 0;
    size_t n = mt_prof_alloc_write(s->line, sizeof s->line, &r->ev, pid, r->stack, mt__blog_name_of,
                                   (void *)names);
    FUZZ_CHECK(n > 0, "a line's room");
    if (n < sizeof s->line) {
        json_error_t e;
        json_t *j = json_loadb(s->line, n, 0, &e);
        FUZZ_CHECK(j != NULL, "an event's line is valid JSON");
        json_decref(j);
    }
    return 0;
}

static int on_bad(void *ud, const char *msg)
{
    seen_t *s = ud;
    FUZZ_CHECK(strlen(msg) > 0, "damage is named");
    s->bad++;
    return 0;
}

static int on_item(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    unsigned long *n = ud;
    FUZZ_CHECK(lineno == *n + 1, "items in order");
    FUZZ_CHECK(it->what != MT_LINE_RAW || it->text[it->len] == '\0', "a raw item's NUL");
    ++*n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static seen_t s;
    s.records = s.bad = 0;
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    FUZZ_CHECK(f != NULL, "fmemopen");
    if (size == 0)
        fgetc(f);
    int rc = mt__blog_read(f, NULL, 0, on_rec, on_bad, &s);
    FUZZ_CHECK(rc == 0, "the reader reads any bytes to their end");
    fclose(f);
    /* the readers' items: one per record or damaged part */
    for (int fast = 0; fast < 2; fast++) {
        unsigned long items = 0, lines = 0;
        f = fmemopen((void *)data, size ? size : 1, "rb");
        if (size == 0)
            fgetc(f);
        char head[MT__BLOG_MAGIC_LEN];
        size_t nh = fread(head, 1, sizeof head, f);
        mt__lines_pipe_cfg_t pc = {.max = 1 << 16, .fast = fast, .threads = 1};
        if (mt__blog_is_binary(head, nh)) {
            rc = mt__blog_pipe(f, head, nh, &pc, on_item, &items, &lines);
            FUZZ_CHECK(rc == 0 && lines == items, "the items");
            FUZZ_CHECK(items == s.records + s.bad, "an item per record and per damaged part");
        }
        fclose(f);
    }
    /* the conversion: a line per record */
    char *out = NULL;
    size_t outlen = 0;
    FILE *o = open_memstream(&out, &outlen);
    f = fmemopen((void *)data, size ? size : 1, "rb");
    if (size == 0)
        fgetc(f);
    uint64_t recs = 0;
    seen_t s2 = {0};
    rc = mt__blog_to_ndjson(f, NULL, 0, o, on_bad, &s2, &recs);
    FUZZ_CHECK(rc == 0 && recs == s.records, "the conversion");
    fclose(f);
    fclose(o);
    free(out);
    return 0;
}
