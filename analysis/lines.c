/* Lines of a file, read in large blocks and cut in place (see lines.h). */
#include "analysis/lines.h"

#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

int mt__lines_open(mt__lines_t *ls, FILE *f, size_t max)
{
    /* A block always has room for one whole line beside its newline. */
    size_t cap = max + 2 <= MT_LINES_BLOCK ? MT_LINES_BLOCK : max + 2 + MT_LINES_BLOCK;
    *ls = (mt__lines_t){.f = f, .cap = cap, .max = max};
    ls->buf = malloc(cap + 1); /* one byte more: the NUL after a line that ends the block */
    if (!ls->buf)
        return MT_ENOMEM;
    ls->p = ls->end = ls->buf;
    return 0;
}

void mt__lines_close(mt__lines_t *ls)
{
    free(ls->buf);
    ls->buf = ls->p = ls->end = ls->kept = NULL;
}

/* Moves the unfinished line to the front and reads behind it. 0, or MT_EIO. */
static int refill(mt__lines_t *ls)
{
    size_t have = (size_t)(ls->end - ls->p);
    memmove(ls->buf, ls->p, have);
    ls->p = ls->buf;
    ls->end = ls->buf + have;
    size_t got = fread(ls->end, 1, ls->cap - have, ls->f);
    if (got == 0) {
        if (ferror(ls->f))
            return MT_EIO;
        ls->eof = true;
    }
    ls->end += got;
    return 0;
}

int mt__lines_next(mt__lines_t *ls, const char **line, size_t *len)
{
    if (ls->kept) {
        *ls->kept = ls->keep;
        ls->kept = NULL;
    }
    for (;;) {
        char *nl = memchr(ls->p, '\n', (size_t)(ls->end - ls->p));
        if (nl) {
            char *start = ls->p;
            size_t n = (size_t)(nl - start);
            ls->p = nl + 1;
            if (ls->skipping) { /* the end of a line already refused */
                ls->skipping = false;
                continue;
            }
            ls->lineno++;
            if (n > ls->max)
                return MT_EOVERFLOW;
            ls->kept = nl + 1; /* <= end <= buf + cap: inside buf's cap + 1 bytes */
            ls->keep = nl[1];
            nl[1] = '\0';
            *line = start;
            *len = n + 1;
            return 1;
        }
        size_t have = (size_t)(ls->end - ls->p);
        if (ls->skipping) {
            ls->p = ls->end = ls->buf;
            have = 0;
        } else if (have > ls->max) {
            ls->lineno++;
            ls->skipping = true;
            return MT_EOVERFLOW;
        }
        if (ls->eof) {
            if (have == 0) {
                ls->skipping = false;
                return 0;
            }
            /* The last line, without a newline. */
            ls->lineno++;
            *line = ls->p;
            *len = have;
            ls->kept = ls->end;
            ls->keep = *ls->end;
            *ls->end = '\0';
            ls->p = ls->end;
            return 1;
        }
        int rc = refill(ls);
        if (rc)
            return rc;
    }
}
