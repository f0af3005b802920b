/* Escaping of other processes' text (util/text.h). */
#include "util/text.h"

#include <stdio.h>
#include <string.h>

int mt__text_utf8_len(const unsigned char *p)
{
    unsigned c = p[0], lo = 0x80, hi = 0xbf;
    int n;
    if (c < 0x80)
        return 1;
    if (c < 0xc2)
        return 0;
    if (c < 0xe0) {
        n = 2;
    } else if (c < 0xf0) {
        n = 3;
        lo = c == 0xe0 ? 0xa0 : lo;
        hi = c == 0xed ? 0x9f : hi;
    } else if (c < 0xf5) {
        n = 4;
        lo = c == 0xf0 ? 0x90 : lo;
        hi = c == 0xf4 ? 0x8f : hi;
    } else {
        return 0;
    }
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

/* A control character of n bytes at p (C0, DEL, or C1 as the two bytes C2 80..C2 9F). */
static bool is_control(const unsigned char *p, int n)
{
    return (n == 1 && (p[0] < 0x20 || p[0] == 0x7f)) || (n == 2 && p[0] == 0xc2 && p[1] < 0xa0);
}

bool mt__text_is_clean(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = mt__text_utf8_len(p);
        if (n == 0 || is_control(p, n))
            return false;
        p += n;
    }
    return true;
}

bool mt__text_is_utf8(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = mt__text_utf8_len(p);
        if (n == 0)
            return false;
        p += n;
    }
    return true;
}

/* The escape of the one byte b: 2 or 4 characters into e. */
static size_t escape_byte(unsigned char b, char e[5])
{
    static const char hx[] = "0123456789abcdef";
    const char *named = b == '\n'   ? "n"
                        : b == '\r' ? "r"
                        : b == '\t' ? "t"
                        : b == 0x1b ? "e"
                        : b == '\\' ? "\\"
                                    : NULL;
    e[0] = '\\';
    if (named) {
        e[1] = named[0];
        return 2;
    }
    e[1] = 'x';
    e[2] = hx[b >> 4];
    e[3] = hx[b & 15];
    return 4;
}

const char *mt__text_escape(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return buf;
    for (const unsigned char *p = (const unsigned char *)s; p && *p;) {
        char e[8];
        size_t k = 0;
        int n = mt__text_utf8_len(p);
        if (n == 0 || *p == '\\' || is_control(p, n)) {
            int m = n ? n : 1; /* a C1 character: both of its bytes */
            for (int i = 0; i < m; i++)
                k += escape_byte(p[i], e + k);
            n = m;
        } else {
            memcpy(e, p, (size_t)n);
            k = (size_t)n;
        }
        if (o + k >= len)
            break;
        memcpy(buf + o, e, k);
        o += k;
        p += n;
    }
    buf[o] = '\0';
    return buf;
}

const char *mt__text_utf8(const char *s, char *buf, size_t len)
{
    static const char fffd[] = "\xef\xbf\xbd";
    size_t o = 0;
    if (len == 0)
        return buf;
    for (const unsigned char *p = (const unsigned char *)s; p && *p;) {
        int n = mt__text_utf8_len(p);
        const char *src = n ? (const char *)p : fffd;
        size_t k = n ? (size_t)n : 3;
        if (o + k >= len)
            break;
        memcpy(buf + o, src, k);
        o += k;
        p += n ? n : 1;
    }
    buf[o] = '\0';
    return buf;
}

const char *mt__text_bytes(double bytes, int decimals, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double a = bytes < 0 ? -bytes : bytes;
    int u = 0;
    while (a >= 1024 && u < 4) {
        a /= 1024;
        u++;
    }
    snprintf(buf, len, "%s%.*f %s", bytes < 0 ? "-" : "", u ? decimals : 0, a, units[u]);
    return buf;
}
