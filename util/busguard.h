/* Guards for shared mappings that another process may shrink under us.
 *
 * A MAP_SHARED mapping of a file faults (SIGBUS) on a page past the file's end, and the
 * file's owner may truncate it at any moment: between any size check and any read, so no
 * check makes the reads safe. A range registered here turns such a fault into a read of
 * zeros instead: the SIGBUS handler maps an anonymous zero page over the faulting page,
 * marks the range hit and returns, and the access is retried and completes. A reader of
 * such memory already checks every value it reads (the other process may write anything
 * there), so zeros are one more bad value; after reading it asks mt__busguard_hit() and
 * lets go of the mapping. A fault outside every range goes on to the handler installed
 * before ours, or to the default action.
 *
 * Registering and the handler neither allocate nor lock: the table is a fixed array. */
#ifndef MT_UTIL_BUSGUARD_H
#define MT_UTIL_BUSGUARD_H

#include <stdbool.h>
#include <stddef.h>

#include "memtrace/common.h"

#define MT_BUSGUARD_MAX 4096 /* ranges guarded at once, in the whole process */

/* Guards [addr, addr + len), mapped with protection prot (PROT_READ, PROT_WRITE): a page
 * of it that faults is replaced by a zero page with that protection. Installs the handler
 * if it is not (or no longer) installed. Returns an id > 0, MT_ENOMEM when the table is
 * full, or MT_EIO when the handler cannot be installed. */
int mt__busguard_add(const void *addr, size_t len, int prot);
/* Stops guarding range id (0 is ignored); call before unmapping it. */
void mt__busguard_remove(int id);
/* Whether a page of range id faulted since it was added. */
bool mt__busguard_hit(int id);

#endif
