/* util/text.h's UTF-8 checks: well-formed text passes whatever its characters, and each
 * ill-formed form of Unicode table 3-7 (a lone continuation, a cut sequence, an overlong
 * form, a surrogate, a code point past U+10FFFF) fails, as does the same after valid text. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/test_main.h"
#include "util/text.h"

static void test_is_utf8(void **state)
{
    (void)state;
    assert_true(mt__text_is_utf8(""));
    assert_true(mt__text_is_utf8("forward (model.py)"));
    assert_true(mt__text_is_utf8("\t\x1b[0m\x7f")); /* controls are still UTF-8 */
    assert_true(mt__text_is_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80")); /* 2, 3, 4 bytes */
    assert_false(mt__text_is_utf8("\x80"));             /* a lone continuation */
    assert_false(mt__text_is_utf8("ab\xe2\x82"));       /* cut inside a sequence */
    assert_false(mt__text_is_utf8("\xc0\xaf"));         /* overlong */
    assert_false(mt__text_is_utf8("\xed\xa0\x80"));     /* a surrogate */
    assert_false(mt__text_is_utf8("\xf4\x90\x80\x80")); /* past U+10FFFF */
    /* is_clean says more: the same control characters are not clean */
    assert_false(mt__text_is_clean("\t"));
    assert_true(mt__text_is_clean("caf\xc3\xa9"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_is_utf8)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
