/* libFuzzer harness: the NDJSON event decoder (mt_prof_event_from_json), on one line of
 * a telemetry log. Beyond "no crash": a rejected line names the bad field; an accepted
 * event is one the line writer can write back, and that line decodes to the same event
 * (the writer and the decoder are each other's inverse, profiler/json.c). */
#include <jansson.h>
#include <string.h>

#include "memtrace/prof.h"
#include "tests/fuzz/fuzz.h"

static bool same_event(const mt_event_rec_t *a, const mt_event_rec_t *b)
{
    return a->seq == b->seq && a->time_ns == b->time_ns && a->addr == b->addr &&
           a->size == b->size && a->requested == b->requested && a->allocated == b->allocated &&
           a->reserved == b->reserved && a->stream == b->stream && a->kind == b->kind &&
           a->pool == b->pool && a->tag == b->tag && a->device == b->device;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    if (!j)
        return 0; /* not JSON: the callers' jansson error, not the decoder's */
    mt_event_rec_t ev;
    int pid = 0;
    char err[128] = "";
    int rc = mt_prof_event_from_json(j, &ev, &pid, err, sizeof err);
    json_decref(j);
    if (rc != 0) {
        FUZZ_CHECK(rc < 0, "errors are negative codes");
        FUZZ_CHECK(strncmp(err, "bad or missing \"", 16) == 0, "the message names the field");
        return 0;
    }
    FUZZ_CHECK(ev.kind < MT_EV_KIND_COUNT, "decoded kind in range");
    FUZZ_CHECK(ev.tag < MT_TAG_MAX, "decoded tag in range");
    if (pid < 0)
        return 0; /* a consumer queue's gap: the writer always names a process */
    char line[2048];
    size_t n = mt_prof_event_write(line, sizeof line, &ev, pid, NULL, NULL);
    FUZZ_CHECK(n < sizeof line, "a decoded event fits a line");
    json_t *back = json_loadb(line, n, 0, NULL);
    FUZZ_CHECK(back != NULL, "the writer writes JSON");
    mt_event_rec_t ev2;
    int pid2 = 0;
    rc = mt_prof_event_from_json(back, &ev2, &pid2, err, sizeof err);
    json_decref(back);
    if (rc != 0)
        fprintf(stderr, "re-decoding %.*s: %s\n", (int)n, line, err);
    FUZZ_CHECK(rc == 0, "what the writer writes decodes");
    FUZZ_CHECK(pid2 == pid, "the pid survives a round trip");
    FUZZ_CHECK(same_event(&ev, &ev2), "the event survives a round trip");
    return 0;
}
