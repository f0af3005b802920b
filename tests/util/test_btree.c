/* The ordered map (util/btree.h) against a sorted array of keys: inserts, erases, searches
 * and rekeys over thousands of records (inner nodes split and merge, the height rises and
 * falls), the checker after each; and keys in order, which fill their leaves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memtrace/common.h"
#include "util/btree.h"
#include "tests/common/test_main.h"

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

typedef struct rec_s {
    uint64_t key, val;
} rec_t;

static void check_bt(const mt__bt_t *t)
{
    char why[160] = "";
    if (mt__bt_check(t, why, sizeof why) != 0)
        fail_msg("%s", why);
}

/* The first index of keys[0..n) at or above key. */
static size_t ref_lower_key(const uint64_t *keys, size_t n, uint64_t key)
{
    size_t i = 0;
    while (i < n && keys[i] < key)
        i++;
    return i;
}

static void assert_at(mt__bt_cur_t c, const uint64_t *keys, size_t n, size_t i)
{
    const rec_t *r = mt__bt_get(c);
    if (i == n) {
        assert_true(mt__bt_end(c));
        return;
    }
    assert_non_null(r);
    assert_int_equal(r->key, keys[i]);
    assert_int_equal(r->val, keys[i] * 3 + 1);
}

static void bt_random(uint64_t seed, size_t space, size_t ops)
{
    mt__bt_t t = {0};
    mt__bt_init(&t, sizeof(rec_t));
    uint64_t *keys = calloc(space + ops + 1, sizeof *keys); /* rekeys leave the grid */
    assert_non_null(keys);
    size_t n = 0;
    for (size_t op = 0; op < ops; op++) {
        uint64_t k = rng(&seed) % space * 8, r = rng(&seed) % 16;
        size_t i = ref_lower_key(keys, n, k);
        bool held = i < n && keys[i] == k;
        /* Grow to the space, then shrink: merges and a falling height too. */
        bool grow = (op / (ops / 4)) % 2 == 0;
        if (r < (grow ? 9u : 4u)) {
            mt__bt_cur_t at;
            int rc = mt__bt_insert(&t, &(rec_t){k, k * 3 + 1}, &at);
            assert_int_equal(rc, held ? MT_EINVAL : 0);
            if (!held) {
                memmove(&keys[i + 1], &keys[i], (n - i) * sizeof *keys);
                keys[i] = k;
                n++;
                assert_at(at, keys, n, i);
            }
        } else if (r < 14 && n > 0) {
            i = ref_lower_key(keys, n, k) % n;
            mt__bt_cur_t c = mt__bt_lower(&t, keys[i]);
            assert_at(c, keys, n, i);
            c = mt__bt_erase(&t, c);
            memmove(&keys[i], &keys[i + 1], (n - i - 1) * sizeof *keys);
            n--;
            assert_at(c, keys, n, i);
        } else if (n > 0) { /* a key moved between its neighbours */
            i = ref_lower_key(keys, n, k) % n;
            uint64_t lo = i > 0 ? keys[i - 1] + 1 : 0;
            uint64_t hi = i + 1 < n ? keys[i + 1] - 1 : keys[i] + 64;
            uint64_t to = lo + rng(&seed) % (hi - lo + 1);
            mt__bt_cur_t c = mt__bt_lower(&t, keys[i]);
            ((rec_t *)mt__bt_get(c))->val = to * 3 + 1;
            mt__bt_rekey(&t, c, to);
            keys[i] = to;
        }
        check_bt(&t);
        assert_int_equal(t.n, n);
        /* searches from a random key */
        uint64_t q = rng(&seed) % (space * 8 + 16);
        i = ref_lower_key(keys, n, q);
        assert_at(mt__bt_lower(&t, q), keys, n, i);
        size_t f = i < n && keys[i] == q ? i : i > 0 ? i - 1 : n;
        assert_at(mt__bt_floor(&t, q), keys, n, f);
    }
    /* every record in order, both ways */
    size_t i = 0;
    for (mt__bt_cur_t c = mt__bt_first(&t); !mt__bt_end(c); mt__bt_next(&c))
        assert_at(c, keys, n, i++);
    assert_int_equal(i, n);
    for (mt__bt_cur_t c = mt__bt_last(&t); !mt__bt_end(c); mt__bt_prev(&t, &c))
        assert_at(c, keys, n, --i);
    assert_int_equal(i, 0);
    mt__bt_fini(&t);
    check_bt(&t);
    free(keys);
}

static void test_btree_random(void **state)
{
    (void)state;
    bt_random(3, 64, 20000);   /* one leaf and a few: splits and merges at the root */
    bt_random(5, 6000, 60000); /* three levels */
}

/* Keys in order fill their leaves: a leaf per lcap records, not per half of it. */
static void test_btree_in_order(void **state)
{
    (void)state;
    for (int down = 0; down < 2; down++) {
        mt__bt_t t = {0};
        mt__bt_init(&t, sizeof(rec_t));
        enum { N = 5000 };
        for (uint64_t k = 0; k < N; k++) {
            uint64_t key = down ? (N - k) * 16 : k * 16;
            assert_int_equal(mt__bt_insert(&t, &(rec_t){key, key * 3 + 1}, NULL), 0);
        }
        check_bt(&t);
        size_t leaves = 0;
        for (mt__bt_cur_t c = mt__bt_first(&t); !mt__bt_end(c); mt__bt_next(&c))
            leaves += c.i == 0;
        assert_true(leaves <= N / t.lcap + 2);
        mt__bt_fini(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_btree_random),
        cmocka_unit_test(test_btree_in_order),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
