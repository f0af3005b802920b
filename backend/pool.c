/* Dispatch of the stream-ordered pool entry points (include/memtrace/backend.h): argument
 * checks once for every backend, MT_ENOTSUP for a backend without a pool. */
#include "backend/backend.h"

int mt_backend_malloc_async(mt_backend_t *b, size_t size, mt_stream_t *s, void **out)
{
    if (b == NULL || out == NULL || size == 0)
        return MT_EINVAL;
    *out = NULL;
    if (b->ops->malloc_async == NULL)
        return MT_ENOTSUP;
    return b->ops->malloc_async(b, size, s, out);
}

int mt_backend_free_async(mt_backend_t *b, void *ptr, mt_stream_t *s)
{
    if (b == NULL)
        return MT_EINVAL;
    if (ptr == NULL)
        return 0;
    if (b->ops->free_async == NULL)
        return MT_ENOTSUP;
    return b->ops->free_async(b, ptr, s);
}

int mt_backend_pool_set_release_threshold(mt_backend_t *b, uint64_t bytes)
{
    if (b == NULL)
        return MT_EINVAL;
    if (b->ops->pool_set_release_threshold == NULL)
        return MT_ENOTSUP;
    return b->ops->pool_set_release_threshold(b, bytes);
}

int mt_backend_pool_trim_to(mt_backend_t *b, size_t keep)
{
    if (b == NULL)
        return MT_EINVAL;
    if (b->ops->pool_trim_to == NULL)
        return MT_ENOTSUP;
    return b->ops->pool_trim_to(b, keep);
}

int mt_backend_pool_usage(mt_backend_t *b, mt_pool_usage_t *out)
{
    if (b == NULL || out == NULL)
        return MT_EINVAL;
    if (b->ops->pool_usage == NULL)
        return MT_ENOTSUP;
    return b->ops->pool_usage(b, out);
}

int mt_backend_pool_reset_high(mt_backend_t *b)
{
    if (b == NULL)
        return MT_EINVAL;
    if (b->ops->pool_reset_high == NULL)
        return MT_ENOTSUP;
    return b->ops->pool_reset_high(b);
}
