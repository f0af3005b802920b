/* The one property of the fast event decoder (analysis/ndjson_fast.h), shared by its test
 * and its fuzz harness: on any line, it declines, or it gives exactly what jansson and
 * mt_prof_event_from_json give (the record byte for byte, the pid, the "tag" string). */
#ifndef MT_TESTS_ANALYSIS_FAST_CHECK_H
#define MT_TESTS_ANALYSIS_FAST_CHECK_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "analysis/ndjson_fast.h"
#include "memtrace/prof.h"

typedef enum fast_check_e {
    FAST_DECLINED = 0, /* the fast decoder left the line to jansson */
    FAST_SAME = 1,     /* accepted, and the jansson path gives the same */
    FAST_DIFFERS = 2,  /* accepted, and the jansson path gives something else: a bug */
} fast_check_e;

/* Checks line[0..len); on FAST_DIFFERS writes why into why. */
static inline fast_check_e fast_check(const char *line, size_t len, char *why, size_t whylen)
{
    mt_event_rec_t fast;
    int fpid = 0;
    const char *tag;
    size_t tag_len;
    if (!mt__ndjson_event(line, len, &fast, &fpid, &tag, &tag_len))
        return FAST_DECLINED;
    json_t *j = json_loadb(line, len, 0, NULL);
    mt_event_rec_t slow;
    int spid = 0;
    char err[128] = "";
    const char *type = j ? json_string_value(json_object_get(j, "type")) : NULL;
    fast_check_e rc = FAST_SAME;
    if (!j) {
        snprintf(why, whylen, "jansson rejects the line");
        rc = FAST_DIFFERS;
    } else if (!type || strcmp(type, "event") != 0) {
        snprintf(why, whylen, "not an event line for jansson");
        rc = FAST_DIFFERS;
    } else if (mt_prof_event_from_json(j, &slow, &spid, err, sizeof err) != 0) {
        snprintf(why, whylen, "the decoder rejects it: %s", err);
        rc = FAST_DIFFERS;
    } else if (memcmp(&fast, &slow, sizeof fast) != 0) {
        snprintf(why, whylen, "another record (kind %d/%d seq %llu/%llu)", fast.kind, slow.kind,
                 (unsigned long long)fast.seq, (unsigned long long)slow.seq);
        rc = FAST_DIFFERS;
    } else if (fpid != spid) {
        snprintf(why, whylen, "another pid (%d, %d)", fpid, spid);
        rc = FAST_DIFFERS;
    } else {
        json_t *jt = json_object_get(j, "tag");
        const char *st = json_string_value(jt);
        if (!st != !tag ||
            (st && (json_string_length(jt) != tag_len || memcmp(st, tag, tag_len) != 0))) {
            snprintf(why, whylen, "another tag string");
            rc = FAST_DIFFERS;
        }
    }
    json_decref(j);
    return rc;
}

#endif
