/* Static names for codes and enums shared by every module. */
#include <stdio.h>
#include <string.h>

#include "memtrace/alloc.h"

const char *mt_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
    case MT_EINVAL:
        return "invalid argument";
    case MT_ENOMEM:
        return "out of memory";
    case MT_EAGAIN:
        return "not ready";
    case MT_ENOENT:
        return "not found";
    case MT_EIO:
        return "backend or I/O error";
    case MT_ENOTSUP:
        return "not supported";
    case MT_EBUSY:
        return "busy";
    case MT_ENODEV:
        return "no such device";
    case MT_EPROTO:
        return "malformed input";
    case MT_EOVERFLOW:
        return "size overflow";
    case MT_EFBIG:
        return "file size limit (ulimit -f) too small";
    default:
        return code < 0 ? strerror(-code) : "unknown error";
    }
}

const char *mt_event_kind_name(int kind)
{
    static const char *const names[] = {
        [MT_EV_ALLOC] = "alloc",
        [MT_EV_FREE_REQUESTED] = "free_requested",
        [MT_EV_FREE_COMPLETED] = "free_completed",
        [MT_EV_SEGMENT_ALLOC] = "segment_alloc",
        [MT_EV_SEGMENT_FREE] = "segment_free",
        [MT_EV_SEGMENT_MAP] = "segment_map",
        [MT_EV_SEGMENT_UNMAP] = "segment_unmap",
        [MT_EV_OOM] = "oom",
        [MT_EV_RESERVE] = "reserve",
        [MT_EV_EMPTY_CACHE] = "empty_cache",
        [MT_EV_CONFIG] = "config",
        [MT_EV_STATS] = "stats",
        [MT_EV_MARK] = "mark",
        [MT_EV_COMPACTION] = "compaction",
        [MT_EV_GAP] = "gap",
        [MT_EV_TAG_LABEL] = "tag_label",
        [MT_EV_MARK_NAMED] = "mark_named",
        [MT_EV_STACK_REF] = "stack_ref",
        [MT_EV_SETTING] = "setting",
        [MT_EV_MANAGED] = "managed",
        [MT_EV_DEVICE] = "device",
        [MT_EV_OUTSIDE_ALLOC] = "outside_alloc",
        [MT_EV_OUTSIDE_FREE] = "outside_free",
        [MT_EV_LIBRARY_LABEL] = "library_label",
    };
    if (kind <= 0 || kind >= (int)(sizeof names / sizeof names[0]) || names[kind] == NULL)
        return "unknown";
    return names[kind];
}

const char *mt_setting_name(int id, char *buf, size_t len)
{
    static const char *const names[] = {
        [MT_SETTING_MAX_SPLIT_SIZE] = "max_split_size_mb",
        [MT_SETTING_MAX_NON_SPLIT_ROUNDING] = "max_non_split_rounding_mb",
        [MT_SETTING_GC_THRESHOLD] = "garbage_collection_threshold",
        [MT_SETTING_MEMORY_FRACTION] = "memory_fraction",
        [MT_SETTING_RELEASE_ON_OOM] = "release_on_oom",
        [MT_SETTING_RELEASE_SMALLER] = "release_smaller_segments",
        [MT_SETTING_RELEASE_TO_FIT] = "release_to_fit",
        [MT_SETTING_PLACE_HIGH] = "place_high_mb",
    };
    const char *n = "unknown";
    if (id >= MT_SETTING_ROUNDUP_0 && id < MT_SETTING_END) {
        snprintf(buf, len, "roundup_power2_divisions[%d]", id - MT_SETTING_ROUNDUP_0);
        return buf;
    }
    if (id > 0 && id < (int)(sizeof names / sizeof names[0]) && names[id] != NULL)
        n = names[id];
    snprintf(buf, len, "%s", n);
    return buf;
}

const char *mt_mark_name(int mark)
{
    static const char *const names[] = {
        [MT_MARK_ITERATION] = "iteration",       [MT_MARK_FORWARD_BEGIN] = "forward_begin",
        [MT_MARK_FORWARD_END] = "forward_end",   [MT_MARK_BACKWARD_BEGIN] = "backward_begin",
        [MT_MARK_BACKWARD_END] = "backward_end", [MT_MARK_WARMUP_BEGIN] = "warmup_begin",
        [MT_MARK_WARMUP_END] = "warmup_end",
    };
    if (mark <= 0 || mark >= (int)(sizeof names / sizeof names[0]) || names[mark] == NULL)
        return "unknown";
    return names[mark];
}

const char *mt_pool_name(int pool)
{
    switch (pool) {
    case MT_POOL_SMALL:
        return "small";
    case MT_POOL_LARGE:
        return "large";
    case MT_POOL_HOST:
        return "host";
    default:
        return "none";
    }
}

const char *mt_tag_builtin_name(int tag)
{
    static const char *const names[MT_TAG_USER_FIRST] = {
        "other", "weights", "grads", "optimizer", "activations", "workspace", "batch",
    };
    if (tag < 0 || tag >= MT_TAG_USER_FIRST)
        return "other";
    return names[tag];
}
