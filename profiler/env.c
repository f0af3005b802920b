/* The profiler's environment, read in this file only (docs/process-state.md): a program
 * that honours the MEMTRACE_* variables calls mt_prof_cfg_from_env (and
 * mt_prof_stacks_from_env) at its edge and hands the cfg to mt_prof_create, which reads
 * none. The resolvers of the documented defaults (the socket, the OOM directory and
 * interval) are here too, for the daemon's and the CLI's edges. */
#include "profiler/internal.h"
#include "util/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

/* ---- defaults the tools share ---- */

int mt_prof_socket_path(char *buf, size_t len)
{
    if (!buf || len == 0)
        return MT_EINVAL;
    const char *env = getenv("MEMTRACE_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env && *env)
        n = snprintf(buf, len, "%s", env);
    else if (xdg && *xdg)
        n = snprintf(buf, len, "%s/memtrace.sock", xdg);
    else
        return mt__prof_socket_default(buf, len);
    struct sockaddr_un sa;
    if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(sa.sun_path))
        return MT_EOVERFLOW;
    return 0;
}

int mt_prof_oom_dir(char *buf, size_t len)
{
    const char *env = getenv("MEMTRACE_OOM_DIR");
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env != NULL && strcmp(env, "off") == 0)
        return MT_ENOENT;
    if (env != NULL && env[0] != '\0')
        n = snprintf(buf, len, "%s", env);
    else if (xdg != NULL && xdg[0] == '/')
        n = snprintf(buf, len, "%s/memtrace/oom", xdg);
    else if (home != NULL && home[0] == '/')
        n = snprintf(buf, len, "%s/.local/state/memtrace/oom", home);
    else
        return MT_ENOENT;
    return n > 0 && (size_t)n < len ? 0 : MT_EINVAL;
}

/* A decimal count of ms in [0, a day]; MT_EINVAL otherwise. */
static int parse_interval(const char *e, unsigned *ms)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(e, &end, 10);
    if (e[0] < '0' || e[0] > '9' || *end != '\0' || errno != 0 || v > 86400000ul)
        return MT_EINVAL;
    *ms = (unsigned)v;
    return 0;
}

int mt_prof_oom_interval_ms(unsigned *ms)
{
    const char *e = getenv("MEMTRACE_OOM_INTERVAL_MS");
    *ms = MT_PROF_OOM_INTERVAL_MS;
    if (e == NULL || e[0] == '\0')
        return 0;
    return parse_interval(e, ms);
}

/* ---- the launcher's variables (docs/fleet.md "Ranks and jobs") ---- */

/* A decimal in [lo, MT_PROF_RANK_MAX], nothing else (no sign, no spaces, no suffix). */
static bool parse_count(const char *s, int lo, int *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > MT_PROF_RANK_MAX)
        return false;
    *out = (int)v;
    return true;
}

/* The first of names (NULL-terminated, in precedence order) set to a valid count; a set but
 * malformed one is warned about and skipped. Unset and "" are skipped silently. */
static void env_count(const mt_prof_cfg_t *cfg, const char *const *names, int lo, int *out)
{
    for (; *names; names++) {
        const char *e = getenv(*names);
        if (!e || !*e)
            continue;
        if (parse_count(e, lo, out))
            return;
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_WARN,
                 "memtrace: %s='%.32s' ignored: want a decimal in %d..%d", *names, e, lo,
                 MT_PROF_RANK_MAX);
    }
}

/* The job id: the first of names set; TORCHELASTIC_RUN_ID's "none" is torchrun's default for
 * a run without a rendezvous id, which names no job. */
static void env_job_id(const mt_prof_cfg_t *cfg, const char *const *names, char *out)
{
    for (; *names; names++) {
        const char *e = getenv(*names);
        if (!e || !*e || (strcmp(*names, "TORCHELASTIC_RUN_ID") == 0 && strcmp(e, "none") == 0))
            continue;
        if (mt_prof_job_id_sanitize(out, MT_PROF_JOB_MAX, e) != 0)
            mt__logf(cfg->log, cfg->log_ud, MT_LOG_WARN,
                     "memtrace: %s='%.32s' taken as job '%s' (at most %d bytes of "
                     "[A-Za-z0-9._:@+-])",
                     *names, e, out, MT_PROF_JOB_MAX - 1);
        return;
    }
}

static void job_from_env(mt_prof_cfg_t *cfg)
{
    /* Precedence: the user's override, then torchrun (and DeepSpeed's launcher, which sets
     * the same variables), then Open MPI's mpirun, then Slurm's srun: a launcher started
     * inside another's allocation sets its own variables, the more specific ones. */
    static const char *const rank[] = {"MEMTRACE_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                       "SLURM_PROCID", NULL};
    static const char *const local[] = {"MEMTRACE_LOCAL_RANK", "LOCAL_RANK",
                                        "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", NULL};
    static const char *const world[] = {"MEMTRACE_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                        "SLURM_NTASKS", NULL};
    static const char *const job[] = {"MEMTRACE_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", NULL};
    env_count(cfg, rank, 0, &cfg->job.rank);
    env_count(cfg, local, 0, &cfg->job.local_rank);
    env_count(cfg, world, 1, &cfg->job.world_size);
    env_job_id(cfg, job, cfg->job.id);
}

/* ---- the program's edge ---- */

int mt_prof_stacks_from_env(mt_prof_cfg_t *cfg, char *err, size_t errlen)
{
    const char *e = getenv("MEMTRACE_STACKS");
    if (!cfg)
        return MT_EINVAL;
    if (!e)
        return 0;
    int mode;
    if (mt_prof_stacks_parse(e, &mode) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "MEMTRACE_STACKS='%.64s': want off, sampled or all", e);
        return MT_EINVAL;
    }
    cfg->stacks = mode;
    return 0;
}

/* The OOM snapshots' directory and interval, as mt_prof_create used to resolve them. */
static void oom_from_env(mt_prof_cfg_t *cfg)
{
    if (mt_prof_oom_dir(cfg->oom_dir, sizeof cfg->oom_dir) != 0)
        cfg->oom_dir[0] = '\0'; /* "off", no home, or too long: none */
    const char *e = getenv("MEMTRACE_OOM_INTERVAL_MS");
    if (e != NULL && e[0] != '\0' && parse_interval(e, &cfg->oom_interval_ms) != 0)
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_WARN,
                 "memtrace: MEMTRACE_OOM_INTERVAL_MS='%.32s': want ms (0-86400000); using %u", e,
                 cfg->oom_interval_ms);
}

int mt_prof_cfg_from_env(mt_prof_cfg_t *cfg)
{
    if (!cfg)
        return MT_EINVAL;
    int rc = 0;
    job_from_env(cfg);
    oom_from_env(cfg);
    if (mt_prof_socket_path(cfg->default_socket, sizeof cfg->default_socket) != 0)
        cfg->default_socket[0] = '\0'; /* too long for a socket: the fixed default */
    const char *log = getenv("MEMTRACE_LOG");
    if (log && *log)
        cfg->log_path = log;
    const char *lf = getenv("MEMTRACE_LOG_FORMAT");
    if (lf && *lf) {
        if (strcmp(lf, "ndjson") == 0)
            cfg->log_format = MT_PROF_LOG_NDJSON;
        else if (strcmp(lf, "binary") == 0)
            cfg->log_format = MT_PROF_LOG_BINARY;
        else
            rc = MT_EINVAL;
    }
    const char *l = getenv("MEMTRACE_PROF_LOSSLESS");
    if (l && *l) {
        if (strcmp(l, "1") == 0 || strcmp(l, "on") == 0)
            cfg->lossless_stall_ms = MT_PROF_LOSSLESS_STALL_MS;
        else if (strcmp(l, "0") == 0 || strcmp(l, "off") == 0)
            cfg->lossless_stall_ms = 0;
        else
            rc = MT_EINVAL;
    }
    const char *e = getenv("MEMTRACE_PROF");
    if (!e || !*e)
        return rc;
    static const char *const names[] = {"auto", "daemon", "log", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(e, names[i]) == 0) {
            cfg->mode = i;
            return rc;
        }
    }
    return MT_EINVAL;
}
