/* jansson documents as text, whole or not at all. */
#ifndef MT_UTIL_JSON_H
#define MT_UTIL_JSON_H

#include <stddef.h>

#include <jansson.h>

/* v as text (json_dumps's flags), NUL-terminated, in a new buffer *out; its length, without
 * the NUL, in *out_len (may be NULL). 0, or MT_ENOMEM with *out NULL.
 *
 * Use this, not json_dumps: jansson 2.14's dump of an object ignores the failure of writing
 * a member's key, so json_dumps, whose buffer grows as it writes, returns success with the
 * key's text left out (`{":1}`) when that growth fails. The text here is measured by a dump
 * that writes nowhere, then written into a buffer of its size: no write can fail, and a
 * failure of the dump's own bookkeeping fails the whole. */
int mt__json_dumps(const json_t *v, size_t flags, char **out, size_t *out_len);

#endif
