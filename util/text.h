/* Text from other processes (process names, tag labels, stage names) made safe to show:
 * on a terminal or in a log line (escaped) and in JSON (valid UTF-8). The one place that
 * decides what a control character is (docs/telemetry.md, "Security model"). */
#ifndef MT_UTIL_TEXT_H
#define MT_UTIL_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes a fully escaped string of n bytes may take, with its NUL: every byte "\xHH". */
#define MT_TEXT_ESC_SIZE(n) (4 * (n) + 1)

/* Length of the well-formed UTF-8 sequence starting at p (Unicode table 3-7: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0 if there is none. Reads no byte
 * past the first one out of range, so never past a terminating NUL. */
int mt__text_utf8_len(const unsigned char *p);
/* s is valid UTF-8 (control characters allowed). */
bool mt__text_is_utf8(const char *s);
/* s is valid UTF-8 and holds no control character: C0 (< 0x20), DEL (0x7f) or C1
 * (U+0080..U+009F). */
bool mt__text_is_clean(const char *s);
/* Copies s into buf with every control character (C0, DEL, C1), every byte that is not
 * valid UTF-8, and backslash written as a C escape: \n \r \t \e \\, else \xHH per byte.
 * Safe to print on a terminal or in a log line. Cut at a character (never inside an
 * escape) to fit len - 1 bytes; always NUL-terminated (len > 0). Returns buf. */
const char *mt__text_escape(const char *s, char *buf, size_t len);
/* Copies s into buf as valid UTF-8 (for JSON): each byte that starts no well-formed
 * sequence becomes U+FFFD. Cut at a character to fit len - 1 bytes; NUL-terminated
 * (len > 0). Returns buf. */
const char *mt__text_utf8(const char *s, char *buf, size_t len);
/* bytes as "512 B", "1.5 MiB" (decimals digits past B, the unit the largest of B..TiB that
 * leaves at least 1), a negative count with its sign ("-2.0 KiB"). Returns buf. */
const char *mt__text_bytes(double bytes, int decimals, char *buf, size_t len);

#endif
