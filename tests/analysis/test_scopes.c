/* Scoped statistics read back from the stream (analysis/scopes.c): nested and repeated
 * scopes, a close that skips an open scope, a "/name" with none open, a plain mark. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>

#include "analysis/scopes.h"
#include "tests/common/test_main.h"

static uint64_t now;

static void feed(mt_scopes_t *s, const char *mark, uint64_t allocated)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.time_ns = (now += 1000);
    ev.kind = mark ? MT_EV_MARK_NAMED : MT_EV_ALLOC;
    if (mark)
        mt_event_mark_name_pack(&ev, mark);
    assert_int_equal(mt__scopes_event(s, &ev, allocated), 0);
}

static const mt_scope_row_t *row(const mt_scopes_t *s, const char *name)
{
    for (size_t i = 0; i < s->nrows; i++)
        if (strcmp(s->rows[i].name, name) == 0)
            return &s->rows[i];
    fail_msg("no scope row '%s'", name);
    return NULL;
}

static void test_nested_and_repeated(void **state)
{
    (void)state;
    mt_scopes_t s;
    mt__scopes_init(&s);
    feed(&s, NULL, 100);
    feed(&s, "step", 100); /* step 1 starts at 100 */
    feed(&s, NULL, 150);
    feed(&s, "fwd", 150); /* fwd starts at 150 */
    feed(&s, NULL, 400);  /* fwd peak 400: +250; step peak +300 */
    feed(&s, NULL, 200);
    feed(&s, "/fwd", 200);
    feed(&s, NULL, 120);
    feed(&s, "/step", 120);
    feed(&s, "step", 120); /* step 2 starts at 120 */
    feed(&s, NULL, 170);   /* +50 */
    feed(&s, "/step", 100);
    const mt_scope_row_t *st = row(&s, "step"), *f = row(&s, "fwd");
    assert_int_equal(st->count, 2);
    assert_int_equal(st->peak_max, 300);
    assert_int_equal(st->peak_sum, 350);
    assert_int_equal(f->count, 1);
    assert_int_equal(f->peak_max, 250);
    assert_int_equal(s.nopen, 0);
    mt__scopes_fini(&s);
}

static void test_unbalanced(void **state)
{
    (void)state;
    mt_scopes_t s;
    mt__scopes_init(&s);
    feed(&s, "/nothing", 10); /* no scope open */
    assert_int_equal(s.unmatched, 1);
    feed(&s, "outer", 10);
    feed(&s, "inner", 10);
    feed(&s, NULL, 90);     /* inner's peak, and outer's through it */
    feed(&s, "/outer", 20); /* closes inner with it */
    assert_int_equal(s.nopen, 0);
    assert_int_equal(row(&s, "outer")->peak_max, 80);
    assert_int_equal(s.nrows, 1); /* inner closed unnamed: counted only in outer */
    /* Plain marks that never close do not hold scopes past the bound. */
    for (int i = 0; i < MT_SCOPES_OPEN_MAX + 5; i++)
        feed(&s, "epoch", 10);
    assert_int_equal(s.nopen, MT_SCOPES_OPEN_MAX);
    assert_int_equal(s.dropped, 5);
    mt__scopes_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_and_repeated),
        cmocka_unit_test(test_unbalanced),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
