/* Files and names in shared places that another local user cannot squat, follow or read
 * (docs/telemetry.md, "Security model"). Every function returns 0 or a negative MT_E* code
 * (-errno values: -EPERM when a file or directory is there but not safely ours). */
#ifndef MT_UTIL_SAFEFILE_H
#define MT_UTIL_SAFEFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "memtrace/common.h"

#define MT_TOKEN_HEX 32 /* characters of an HTTP token: 128 random bits in hex */

/* n bytes from the kernel's random source (getrandom). */
int mt__sf_random(void *buf, size_t n);
/* n random lowercase hex characters and a NUL into buf (n + 1 bytes). */
int mt__sf_random_hex(char *buf, size_t n);
/* dir is a directory owned by the effective uid, mode 0700 (no group/other bits), not a
 * symlink. With create, it is made 0700 first when missing. */
int mt__sf_private_dir(const char *dir, bool create);
/* Opens path for appending: a new file is created exclusively, mode 0600; an existing one
 * must be a regular file owned by the effective uid with one link. Symlinks are never
 * followed. *out_fd is new (O_CLOEXEC). */
int mt__sf_open_append(const char *path, int *out_fd);
/* Reads a token file: a regular file owned by the effective uid (or root), mode 0600 or
 * stricter, holding MT_TOKEN_HEX hex characters. buf gets them and a NUL (len >= 33). */
int mt__sf_token_read(const char *path, char *buf, size_t len);
/* The daemon's side: keeps a valid token file of ours, else replaces it with a new random
 * token (created exclusively, 0600). buf gets the token (len >= 33). */
int mt__sf_token_ensure(const char *path, char *buf, size_t len);
/* The peer of a connected Unix socket is the effective uid or root (SO_PEERCRED).
 * *out_uid gets the peer's uid ((unsigned)-1 if unknown). 0, or -EPERM. */
int mt__sf_peer_trusted(int fd, unsigned *out_uid);
#endif
