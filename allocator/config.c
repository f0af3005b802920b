/* Allocator configuration: defaults, the PyTorch-style "key:value,key:value" string
 * (MEMTRACE_ALLOC_CONF), and validation. Parsing works on a copy so a bad string leaves
 * the caller's config untouched. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/internal.h"

mt_alloc_cfg_t mt_alloc_cfg_default(void)
{
    mt_alloc_cfg_t c;
    memset(&c, 0, sizeof c);
    c.max_split_size = SIZE_MAX;
    c.max_non_split_rounding = MT__LARGE_BUFFER;
    c.garbage_collection_threshold = 0.0;
    c.memory_fraction = 1.0;
    /* docs/allocator-policy.md: the policy table that chose these. */
    c.expandable_segments = true;
    c.release_to_fit = true;
    c.one_pool = true;
    c.place_high = MT__PLACE_HIGH;
    c.release_on_oom = true;
    c.release_smaller_segments = true;
    c.stats_period_ms = 1000;
    c.stacks = MT_STACKS_DEFAULT;
    c.tcache = true;
    c.atfork = true;
    c.lock_bias = true;
    return c;
}

/* The reference allocator's plain-segment rules: the policies beyond it that change where
 * blocks go and when memory returns to the device are off. */
static void set_reference(mt_alloc_cfg_t *c)
{
    c->expandable_segments = false;
    c->release_to_fit = false;
    c->one_pool = false;
    c->place_high = 0;
    c->fit_large_segments = false;
    c->split_large_tails = false;
}

static void seterr(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, fmt, a, b);
}

static int parse_bool(const char *v, bool *out)
{
    if (strcmp(v, "True") == 0 || strcmp(v, "true") == 0 || strcmp(v, "1") == 0) {
        *out = true;
        return 0;
    }
    if (strcmp(v, "False") == 0 || strcmp(v, "false") == 0 || strcmp(v, "0") == 0) {
        *out = false;
        return 0;
    }
    return MT_EINVAL;
}

static int parse_uint(const char *v, unsigned long long *out)
{
    if (*v == '\0' || !isdigit((unsigned char)*v))
        return MT_EINVAL;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || *end != '\0')
        return MT_EINVAL;
    *out = x;
    return 0;
}

static int parse_double(const char *v, double *out)
{
    if (*v == '\0')
        return MT_EINVAL;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno != 0 || *end != '\0' || !isfinite(x))
        return MT_EINVAL;
    *out = x;
    return 0;
}

#define MAX_DIVISIONS (1u << 30)

static bool divisions_ok(unsigned long long d)
{
    return d <= MAX_DIVISIONS && (d & (d - 1)) == 0;
}

/* roundup_power2_divisions: "N" for every interval, or "[K:N,...,>:N]" as PyTorch's
 * parser reads it: K a power of two in MiB names interval log2(K) (clamped to the table);
 * the first entry also fills the intervals below it; ">" fills from the last named
 * interval, that one included, to the end. */
static int parse_divisions(const char *val, unsigned out[MT_ALLOC_ROUNDUP_INTERVALS])
{
    unsigned long long u;
    if (val[0] != '[') {
        if (parse_uint(val, &u) != 0 || !divisions_ok(u))
            return MT_EINVAL;
        for (size_t i = 0; i < MT_ALLOC_ROUNDUP_INTERVALS; i++)
            out[i] = (unsigned)u;
        return 0;
    }
    size_t len = strlen(val);
    if (len < 2 || val[len - 1] != ']')
        return MT_EINVAL;
    char buf[256];
    if (len - 2 >= sizeof buf)
        return MT_EINVAL;
    memcpy(buf, val + 1, len - 2);
    buf[len - 2] = '\0';
    unsigned tab[MT_ALLOC_ROUNDUP_INTERVALS] = {0};
    size_t last = 0;
    bool first = true;
    char *save = NULL;
    for (char *e = strtok_r(buf, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*e))
            e++;
        char *colon = strchr(e, ':');
        if (colon == NULL)
            return MT_EINVAL;
        *colon = '\0';
        char *k = e, *v = colon + 1;
        for (char *t = colon; t > k && isspace((unsigned char)t[-1]);)
            *--t = '\0';
        while (isspace((unsigned char)*v))
            v++;
        for (char *t = v + strlen(v); t > v && isspace((unsigned char)t[-1]);)
            *--t = '\0';
        if (parse_uint(v, &u) != 0 || !divisions_ok(u))
            return MT_EINVAL;
        if (strcmp(k, ">") == 0) {
            for (size_t i = last; i < MT_ALLOC_ROUNDUP_INTERVALS; i++)
                tab[i] = (unsigned)u;
            continue;
        }
        unsigned long long key;
        if (parse_uint(k, &key) != 0 || key == 0 || (key & (key - 1)) != 0)
            return MT_EINVAL;
        size_t idx = (size_t)(63 - __builtin_clzll(key));
        if (idx >= MT_ALLOC_ROUNDUP_INTERVALS)
            idx = MT_ALLOC_ROUNDUP_INTERVALS - 1;
        if (first)
            for (size_t i = 0; i < idx; i++)
                tab[i] = (unsigned)u;
        first = false;
        tab[idx] = (unsigned)u;
        last = idx;
    }
    memcpy(out, tab, sizeof tab);
    return 0;
}

/* Applies one key:value to c. */
static int apply(mt_alloc_cfg_t *c, const char *key, const char *val, char *err, size_t errlen)
{
    unsigned long long u;
    double d;
    bool b;
    if (strcmp(key, "max_split_size_mb") == 0) {
        /* The reference requires more than the 20 MiB large-segment size, else splitting
         * rules would contradict the segment sizes. */
        if (parse_uint(val, &u) != 0 || u <= MT__LARGE_BUFFER >> 20 || u > (SIZE_MAX >> 21))
            goto bad;
        c->max_split_size = (size_t)u << 20;
    } else if (strcmp(key, "max_non_split_rounding_mb") == 0) {
        /* As the reference: at least the 20 MiB large-segment size. */
        if (parse_uint(val, &u) != 0 || u < MT__LARGE_BUFFER >> 20 || u > (SIZE_MAX >> 21))
            goto bad;
        c->max_non_split_rounding = (size_t)u << 20;
    } else if (strcmp(key, "roundup_power2_divisions") == 0) {
        if (parse_divisions(val, c->roundup_power2_divisions) != 0)
            goto bad;
    } else if (strcmp(key, "garbage_collection_threshold") == 0) {
        if (parse_double(val, &d) != 0 || !(d > 0.0 && d < 1.0))
            goto bad;
        c->garbage_collection_threshold = d;
    } else if (strcmp(key, "memory_fraction") == 0) {
        if (parse_double(val, &d) != 0 || !(d > 0.0 && d <= 1.0))
            goto bad;
        c->memory_fraction = d;
    } else if (strcmp(key, "expandable_segments") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->expandable_segments = b;
    } else if (strcmp(key, "release_on_oom") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->release_on_oom = b;
    } else if (strcmp(key, "release_smaller_segments") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->release_smaller_segments = b;
    } else if (strcmp(key, "release_to_fit") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->release_to_fit = b;
    } else if (strcmp(key, "fit_large_segments") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->fit_large_segments = b;
    } else if (strcmp(key, "split_large_tails") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->split_large_tails = b;
    } else if (strcmp(key, "one_pool") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->one_pool = b;
    } else if (strcmp(key, "tcache") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->tcache = b;
    } else if (strcmp(key, "atfork") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->atfork = b;
    } else if (strcmp(key, "lock_bias") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->lock_bias = b;
    } else if (strcmp(key, "place_high_mb") == 0) {
        if (parse_uint(val, &u) != 0 || u > (SIZE_MAX >> 21))
            goto bad;
        c->place_high = (size_t)u << 20;
    } else if (strcmp(key, "rules") == 0) {
        if (strcmp(val, "reference") != 0)
            goto bad;
        set_reference(c);
    } else if (strcmp(key, "stacks") == 0) {
        if (strcmp(val, "off") == 0)
            c->stacks = MT_STACKS_OFF;
        else if (strcmp(val, "sampled") == 0)
            c->stacks = MT_STACKS_SAMPLED;
        else if (strcmp(val, "all") == 0)
            c->stacks = MT_STACKS_ALL;
        else
            goto bad;
    } else if (strcmp(key, "backend") == 0) {
        /* PyTorch's values; ROCm's build also takes hipMallocAsync, and so does memtrace. */
        if (strcmp(val, "native") == 0)
            c->alloc_backend = MT_ALLOC_BACKEND_NATIVE;
        else if (strcmp(val, "cudaMallocAsync") == 0 || strcmp(val, "hipMallocAsync") == 0)
            c->alloc_backend = MT_ALLOC_BACKEND_ASYNC;
        else {
            seterr(err, errlen,
                   "bad value for allocator config key '%s': '%s' (native or cudaMallocAsync)", key,
                   val);
            return MT_EINVAL;
        }
    } else if (strcmp(key, "managed_memory") == 0) {
        if (parse_bool(val, &b) != 0)
            goto bad;
        c->managed_memory = b;
    } else if (strcmp(key, "stats_period_ms") == 0) {
        if (parse_uint(val, &u) != 0 || u > 86400000u) /* a day */
            goto bad;
        c->stats_period_ms = (unsigned)u;
    } else {
        seterr(err, errlen, "unknown allocator config key '%s' (value '%s')", key, val);
        return MT_EINVAL;
    }
    return 0;
bad:
    seterr(err, errlen, "bad value for allocator config key '%s': '%s'", key, val);
    return MT_EINVAL;
}

int mt_alloc_cfg_parse(mt_alloc_cfg_t *cfg, const char *conf, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (cfg == NULL) {
        seterr(err, errlen, "%s%s", "no config to apply the string to", "");
        return MT_EINVAL;
    }
    if (conf == NULL)
        return 0;
    mt_alloc_cfg_t c = *cfg;
    char *copy = strdup(conf);
    if (copy == NULL) {
        seterr(err, errlen, "%s%s", "out of memory", "");
        return MT_ENOMEM;
    }
    int rc = 0;
    /* Items end at commas outside brackets (a per-interval list has its own). */
    char *next = copy;
    while (next != NULL) {
        char *item = next;
        int depth = 0;
        char *p = item;
        for (; *p != '\0' && !(*p == ',' && depth == 0); p++)
            depth += (*p == '[') - (*p == ']');
        next = *p == ',' ? p + 1 : NULL;
        *p = '\0';
        while (isspace((unsigned char)*item))
            item++;
        char *end = item + strlen(item);
        while (end > item && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (*item == '\0')
            continue;
        char *colon = strchr(item, ':');
        if (colon == NULL) {
            seterr(err, errlen, "allocator config item '%s' has no ':value'%s", item, "");
            rc = MT_EINVAL;
            break;
        }
        *colon = '\0';
        char *key = item, *val = colon + 1;
        for (char *k = colon; k > key && isspace((unsigned char)k[-1]);)
            *--k = '\0';
        while (isspace((unsigned char)*val))
            val++;
        rc = apply(&c, key, val, err, errlen);
        if (rc != 0)
            break;
    }
    free(copy);
    /* Managed memory has plain segments: the default's expandable segments give way, and
     * a string that asks for both is refused. */
    if (rc == 0 && c.managed_memory && c.expandable_segments) {
        if (strstr(conf, "expandable_segments") != NULL) {
            seterr(err, errlen,
                   "allocator config keys '%s' and '%s' exclude each other (expandable segments "
                   "map cuMemCreate memory, which cannot be managed)",
                   "managed_memory", "expandable_segments");
            rc = MT_EINVAL;
        } else {
            c.expandable_segments = false;
        }
    }
    if (rc == 0)
        *cfg = c;
    return rc;
}

int mt_alloc_cfg_from_env(mt_alloc_cfg_t *cfg, char *err, size_t errlen)
{
    const char *s = getenv("MEMTRACE_ALLOC_CONF");
    if (s == NULL) {
        if (err != NULL && errlen > 0)
            err[0] = '\0';
        return 0;
    }
    return mt_alloc_cfg_parse(cfg, s, err, errlen);
}

int mt__alloc_cfg_validate(const mt_alloc_cfg_t *c, char *err, size_t errlen)
{
    char v[64];
    if (c->backend == NULL) {
        seterr(err, errlen, "allocator config: %s%s", "backend is required", "");
        return MT_EINVAL;
    }
    if (c->max_split_size != SIZE_MAX && c->max_split_size <= MT__LARGE_BUFFER) {
        snprintf(v, sizeof v, "%zu", c->max_split_size);
        seterr(err, errlen, "bad value for allocator config key '%s': '%s' (must exceed 20 MiB)",
               "max_split_size", v);
        return MT_EINVAL;
    }
    for (size_t i = 0; i < MT_ALLOC_ROUNDUP_INTERVALS; i++) {
        unsigned d = c->roundup_power2_divisions[i];
        if (!divisions_ok(d)) {
            snprintf(v, sizeof v, "[%zu] = %u", i, d);
            seterr(err, errlen, "bad value for allocator config key '%s': '%s'",
                   "roundup_power2_divisions", v);
            return MT_EINVAL;
        }
    }
    if (c->max_non_split_rounding < MT__LARGE_BUFFER) {
        snprintf(v, sizeof v, "%zu", c->max_non_split_rounding);
        seterr(err, errlen, "bad value for allocator config key '%s': '%s' (at least 20 MiB)",
               "max_non_split_rounding", v);
        return MT_EINVAL;
    }
    double g = c->garbage_collection_threshold;
    if (!(g == 0.0 || (g > 0.0 && g < 1.0))) {
        snprintf(v, sizeof v, "%g", g);
        seterr(err, errlen, "bad value for allocator config key '%s': '%s'",
               "garbage_collection_threshold", v);
        return MT_EINVAL;
    }
    if (c->alloc_backend != MT_ALLOC_BACKEND_NATIVE && c->alloc_backend != MT_ALLOC_BACKEND_ASYNC) {
        snprintf(v, sizeof v, "%d", c->alloc_backend);
        seterr(err, errlen, "bad value for allocator config key '%s': '%s'", "backend", v);
        return MT_EINVAL;
    }
    double f = c->memory_fraction;
    if (!(f > 0.0 && f <= 1.0)) {
        snprintf(v, sizeof v, "%g", f);
        seterr(err, errlen, "bad value for allocator config key '%s': '%s'", "memory_fraction", v);
        return MT_EINVAL;
    }
    return mt__managed_cfg_validate(c, err, errlen);
}
