/* Every event kind is complete where it must be: it has a name (util/names.c, which the
 * encoder, the parser, the daemon's filters and counters all use) and the telemetry schema
 * knows it (docs/telemetry.schema.json: the kind enum of event lines, or a record of its
 * own for the two kinds with another shape). A new kind that misses one fails here. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdbool.h>
#include <string.h>

#include <jansson.h>

#include "memtrace/event.h"
#include "tests/common/test_main.h"

static const char *schema_path;

static void test_every_kind_named_and_in_schema(void **state)
{
    (void)state;
    json_error_t err;
    json_t *s = json_load_file(schema_path, 0, &err);
    if (!s)
        fail_msg("%s: %s", schema_path, err.text);
    json_t *defs = json_object_get(s, "$defs");
    json_t *kinds = json_object_get(json_object_get(defs, "kind"), "enum");
    assert_true(json_is_array(kinds));
    for (int k = 1; k < MT_EV_KIND_COUNT; k++) {
        const char *name = mt_event_kind_name(k);
        if (strcmp(name, "unknown") == 0)
            fail_msg("event kind %d has no name in util/names.c", k);
        bool found = json_object_get(defs, name) != NULL; /* gap, tag_label */
        size_t i;
        json_t *v;
        json_array_foreach(kinds, i, v) found = found || strcmp(json_string_value(v), name) == 0;
        json_t *outside = json_object_get(
            json_object_get(json_object_get(json_object_get(defs, "outside"), "properties"),
                            "kind"),
            "enum");
        json_array_foreach(outside, i, v) found = found || strcmp(json_string_value(v), name) == 0;
        if (!found)
            fail_msg("event kind \"%s\" is not in %s", name, schema_path);
    }
    assert_string_equal(mt_event_kind_name(MT_EV_KIND_COUNT), "unknown");
    json_decref(s);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    schema_path = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_named_and_in_schema),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
