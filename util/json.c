/* jansson documents as text (util/json.h). */
#include "util/json.h"

#include <stdlib.h>

#include "memtrace/common.h"

int mt__json_dumps(const json_t *v, size_t flags, char **out, size_t *out_len)
{
    *out = NULL;
    size_t need = json_dumpb(v, NULL, 0, flags);
    if (need == 0) /* its bookkeeping failed: the text of a value is never empty */
        goto fail_measure;
    char *buf = malloc(need + 1);
    if (buf == NULL)
        goto fail_alloc;
    /* Written into room enough: only that bookkeeping can fail, and fails the dump. */
    if (json_dumpb(v, buf, need, flags) != need)
        goto fail_write;
    buf[need] = '\0';
    *out = buf;
    if (out_len != NULL)
        *out_len = need;
    return 0;

fail_write:
    free(buf);
fail_alloc:
fail_measure:
    return MT_ENOMEM;
}
