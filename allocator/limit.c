/* The memory limit changed at run time (torch.cuda.set_per_process_memory_fraction through
 * the pluggable allocator's memory-fraction entry point). */
#include "allocator/internal.h"

int mt_alloc_set_memory_fraction(mt_alloc_t *a, double fraction)
{
    /* Written so that NaN fails too. */
    if (a == NULL || !(fraction > 0.0 && fraction <= 1.0))
        return MT_EINVAL;
    mt__alloc_lock(a);
    a->cfg.memory_fraction = fraction;
    a->limit = fraction >= 1.0 ? a->capacity : (size_t)((double)a->capacity * fraction);
    a->gc_limit = a->cfg.garbage_collection_threshold > 0.0
                      ? (size_t)((double)a->limit * a->cfg.garbage_collection_threshold)
                      : 0;
    a->st.limit = a->limit;
    mt__alloc_unlock(a);
    return 0;
}
