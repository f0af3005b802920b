/* A byte source that undoes xz, gzip or zstd compression while it reads, so that a reader
 * takes `trace.csv.xz` as it takes `trace.csv` (liblzma, zlib, libzstd; streaming, with the
 * memory each decoder may use bounded, concatenated streams and members read through).
 * Which one a file uses is read from its first bytes, never from its name. */
#ifndef MT_ANALYSIS_ZSOURCE_H
#define MT_ANALYSIS_ZSOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum mt__zcodec_e {
    MT__Z_NONE = 0,
    MT__Z_XZ = 1,
    MT__Z_GZIP = 2,
    MT__Z_ZSTD = 3,
} mt__zcodec_e;

/* The most memory a decoder may take (xz's dictionary, zstd's window): a file that needs
 * more is refused with a message saying so. xz -9 needs 65 MiB, zstd -19 8 MiB. */
#define MT__Z_MEMLIMIT ((size_t)256 << 20)

/* The compression the first n bytes of a file announce (MT__Z_NONE for anything else). */
int mt__zsrc_sniff(const void *p, size_t n);
/* "xz", "gzip", "zstd", or "none". */
const char *mt__zsrc_name(int codec);

typedef struct mt__zsrc_s mt__zsrc_t;

/* A decoder of codec (not MT__Z_NONE) over f (borrowed), whose first npre bytes were already
 * read into pre (copied). Returns 0, MT_EINVAL or MT_ENOMEM. */
int mt__zsrc_open(mt__zsrc_t **out, FILE *f, int codec, const void *pre, size_t npre);
/* Up to cap decompressed bytes into buf; *n = how many, 0 only at the end of the input.
 * Returns 0, MT_EPROTO (corrupt or truncated data, or past the memory limit), MT_EIO (a read
 * error) or MT_ENOMEM; the message is then in mt__zsrc_error, and later calls return the
 * same code. What was decoded before an error is returned first (as `xz -dc` writes it). */
int mt__zsrc_read(mt__zsrc_t *z, void *buf, size_t cap, size_t *n);
/* The last error, "" if none. Borrowed. */
const char *mt__zsrc_error(const mt__zsrc_t *z);
/* Frees the decoder (not the file). Sets *p = NULL. */
void mt__zsrc_close(mt__zsrc_t **p);
/* The first decompressed byte of p[0, n) (codec's data, maybe cut short) into *c: 1, 0 when
 * n bytes give none, or a negative MT_E* (corrupt, or cut where a byte was still due). */
int mt__zsrc_first_byte(const void *p, size_t n, int codec, unsigned char *c);
/* Up to cap of the bytes waiting in the pipe fd into buf, left in the pipe for its reader
 * (Linux's tee(2); a socket's MSG_PEEK); waits for a first byte. *n = how many; *ended = the writer
 * had gone before the look, so nothing follows the n bytes unless n = cap. Returns 0, or
 * MT_EINVAL where fd is not a pipe (or not Linux). */
int mt__zsrc_pipe_peek(int fd, void *buf, size_t cap, size_t *n, bool *ended);

/* A stream that reads a file as its uncompressed bytes, for readers that take a FILE (the
 * log readers): when the file's first bytes announce xz, gzip or zstd, the stream reads
 * through the decompression (a stream of fopencookie's); otherwise it is the file itself,
 * rewound, or, where it cannot be rewound (a pipe), a stream that gives back the bytes
 * taken to look before the rest. */
typedef struct mt__zfile_s mt__zfile_t;

/* Opens the stream over raw (borrowed; not closed). Returns 0, MT_EIO (raw cannot be read)
 * or MT_ENOMEM. */
int mt__zfile_open(mt__zfile_t **out, FILE *raw);
/* The stream to read (raw itself when it is plain and could be rewound). Borrowed. */
FILE *mt__zfile_stream(const mt__zfile_t *zf);
/* The decompression's mt__zcodec_e. */
int mt__zfile_codec(const mt__zfile_t *zf);
/* Why the stream failed to read, when the decompression said ("" otherwise: then errno). */
const char *mt__zfile_error(const mt__zfile_t *zf);
/* Closes the stream (not raw) and frees *p. Sets *p = NULL. */
void mt__zfile_close(mt__zfile_t **p);

#endif
