/* A process's rank and job (docs/fleet.md "Ranks and jobs"): read from the launcher's
 * variables at the program's edge (mt_prof_cfg_from_env), written into the hello and the
 * local log's header, read back by the daemon and the report. */
#include "profiler/internal.h"
#include "util/log.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

mt_prof_job_t mt_prof_job_unknown(void)
{
    mt_prof_job_t j;
    memset(&j, 0, sizeof j);
    j.rank = j.local_rank = j.world_size = -1;
    return j;
}

static bool id_char_ok(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '@' || c == '+' || c == '-';
}

size_t mt_prof_job_id_sanitize(char *dst, size_t cap, const char *src)
{
    size_t changed = 0, i = 0;
    if (!dst || cap == 0)
        return 0;
    for (; src && src[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = id_char_ok(c) ? (char)c : '_';
        changed += !id_char_ok(c);
    }
    dst[i] = '\0';
    if (src)
        changed += strlen(src + i);
    return changed;
}

/* ---- JSON ---- */

int mt_prof_job_to_json(void *obj, const mt_prof_job_t *job)
{
    json_t *o = obj;
    int bad = 0;
    if (!o || !job)
        return MT_EINVAL;
    if (job->rank >= 0)
        bad |= json_object_set_new(o, "rank", json_integer(job->rank));
    if (job->local_rank >= 0)
        bad |= json_object_set_new(o, "local_rank", json_integer(job->local_rank));
    if (job->world_size >= 1)
        bad |= json_object_set_new(o, "world_size", json_integer(job->world_size));
    if (job->id[0])
        bad |= json_object_set_new(o, "job", json_string(job->id));
    return bad ? MT_ENOMEM : 0;
}

static int get_count(const json_t *o, const char *k, int lo)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < lo ||
        json_integer_value(v) > MT_PROF_RANK_MAX)
        return -1;
    return (int)json_integer_value(v);
}

bool mt_prof_job_from_json(const void *obj, mt_prof_job_t *job)
{
    const json_t *o = obj;
    *job = mt_prof_job_unknown();
    if (!json_is_object(o))
        return false;
    job->rank = get_count(o, "rank", 0);
    job->local_rank = get_count(o, "local_rank", 0);
    job->world_size = get_count(o, "world_size", 1);
    const char *id = json_string_value(json_object_get(o, "job"));
    if (id)
        mt_prof_job_id_sanitize(job->id, sizeof job->id, id);
    return job->rank >= 0 || job->local_rank >= 0 || job->world_size >= 1 || job->id[0];
}
