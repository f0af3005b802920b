/* Free-memory callbacks: called on a cache miss before the device is asked for more, without
 * the allocator's lock (so they can free into it), their frees reused at once, one run at a
 * time, registration limits. */
#include "tests/alloc/helpers.h"
#include "tests/common/test_main.h"

/* A callback that holds some blocks of the allocator and frees them when asked. */
typedef struct holder_s {
    void *held[8];
    int nheld;
    int calls;
    size_t last_size;
    mt_stream_t *last_stream;
    bool allocate_inside; /* the callback itself allocates (must not recurse) */
    int inner_rc;
} holder_t;

static bool give_back(void *ud, mt_alloc_t *a, size_t size, mt_stream_t *stream)
{
    holder_t *h = ud;
    h->calls++;
    h->last_size = size;
    h->last_stream = stream;
    if (h->allocate_inside) {
        void *p = NULL;
        h->inner_rc = mt_alloc_malloc(a, 64 * MIB, NULL, MT_TAG_OTHER, &p);
        if (p != NULL)
            mt_alloc_free(a, p);
    }
    bool freed = h->nheld > 0;
    while (h->nheld > 0)
        assert_int_equal(mt_alloc_free(a, h->held[--h->nheld]), 0);
    return freed;
}

static bool never(void *ud, mt_alloc_t *a, size_t size, mt_stream_t *stream)
{
    (void)a;
    (void)size;
    (void)stream;
    (*(int *)ud)++;
    return false;
}

/* A 48 MiB device: two 20 MiB blocks held by the callback; a third request fits only if
 * they are given back, and with the callback it is served from the cache. */
static void test_callback_frees_and_cache_serves(void **state)
{
    mt_backend_t *b = sim_backend(48 * MIB);
    mt_alloc_t *a = make_alloc(b, "release_on_oom:false", NULL);
    holder_t h = {0};
    h.held[h.nheld++] = xmalloc_dev(a, 20 * MIB, NULL, MT_TAG_WEIGHTS);
    h.held[h.nheld++] = xmalloc_dev(a, 20 * MIB, NULL, MT_TAG_WEIGHTS);
    uint64_t mallocs = backend_mallocs(b);

    /* No callback: no cached block, the device has 8 MiB left: out of memory. */
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, 20 * MIB, NULL, MT_TAG_ACTIVATIONS, &p), MT_ENOMEM);

    assert_int_equal(mt_alloc_add_free_callback(a, give_back, &h), 0);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    /* On another stream the freed default-stream blocks are not usable: the callback runs
     * (told the stream), but the request still fails. */
    assert_int_equal(mt_alloc_malloc(a, 20 * MIB, s, MT_TAG_ACTIVATIONS, &p), MT_ENOMEM);
    assert_int_equal(h.calls, 1);
    assert_ptr_equal(h.last_stream, s);
    assert_int_equal(h.last_size, 20 * MIB);
    assert_int_equal(h.nheld, 0);
    /* Now the same request on the default stream is served by a block the callback freed:
     * no new device malloc. */
    h.held[h.nheld++] = xmalloc_dev(a, 20 * MIB, NULL, MT_TAG_WEIGHTS);
    h.held[h.nheld++] = xmalloc_dev(a, 20 * MIB, NULL, MT_TAG_WEIGHTS);
    int calls = h.calls;
    p = xmalloc_dev(a, 20 * MIB, NULL, MT_TAG_ACTIVATIONS);
    assert_int_equal(h.calls, calls + 1);
    assert_int_equal(backend_mallocs(b), mallocs);
    assert_int_equal(mt_alloc_check(a), 0);

    /* A cache hit does not call it. */
    mt_alloc_free(a, p);
    p = xmalloc_dev(a, 20 * MIB, NULL, MT_TAG_ACTIVATIONS);
    assert_int_equal(h.calls, calls + 1);
    mt_alloc_free(a, p);

    assert_int_equal(mt_alloc_remove_free_callback(a, give_back, &h), 0);
    assert_int_equal(mt_alloc_remove_free_callback(a, give_back, &h), MT_ENOENT);
    mt_stream_destroy(b, &s);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A callback that allocates from the same allocator does not call itself again, and
 * callbacks run in registration order, each once per miss. */
static void test_no_recursion_and_order(void **state)
{
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "", NULL);
    holder_t h = {.allocate_inside = true, .inner_rc = 1};
    int nevers = 0;
    assert_int_equal(mt_alloc_add_free_callback(a, never, &nevers), 0);
    assert_int_equal(mt_alloc_add_free_callback(a, give_back, &h), 0);
    void *p = xmalloc_dev(a, 4 * MIB, NULL, MT_TAG_OTHER);
    assert_int_equal(nevers, 1);
    assert_int_equal(h.calls, 1);
    assert_int_equal(h.inner_rc, 0); /* its own request went on without callbacks */
    mt_alloc_free(a, p);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_registration_limits(void **state)
{
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "", NULL);
    int n[9] = {0};
    for (int i = 0; i < 8; i++)
        assert_int_equal(mt_alloc_add_free_callback(a, never, &n[i]), 0);
    assert_int_equal(mt_alloc_add_free_callback(a, never, &n[8]), MT_EBUSY);
    assert_int_equal(mt_alloc_add_free_callback(a, NULL, &n[8]), MT_EINVAL);
    assert_int_equal(mt_alloc_remove_free_callback(a, never, &n[3]), 0);
    void *p = xmalloc_dev(a, 1 * MIB, NULL, MT_TAG_OTHER);
    for (int i = 0; i < 8; i++)
        assert_int_equal(n[i], i == 3 ? 0 : 1);
    mt_alloc_free(a, p);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_callback_frees_and_cache_serves),
        cmocka_unit_test(test_no_recursion_and_order),
        cmocka_unit_test(test_registration_limits),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
