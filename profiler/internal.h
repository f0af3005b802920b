/* Private declarations shared by the profiler's files. */
#ifndef MT_PROFILER_INTERNAL_H
#define MT_PROFILER_INTERNAL_H

#include "memtrace/prof.h"
#include "profiler/ring.h"
#include "util/segmap.h"

/* Registers ring with the daemon at sock_path: connects, sends the hello line (with job's
 * known fields; job may be NULL), waits
 * up to timeout_ms for the reply. On success *out_fd is the open connection, to keep
 * for the process lifetime (closing it tells the daemon the producer ended). On
 * failure, a message goes to err. */
int mt__prof_client_register(const char *sock_path, const mt__ring_t *ring,
                             const mt_prof_job_t *job, int timeout_ms, int *out_fd, char *err,
                             size_t errlen);
/* The daemon's socket without environment: /tmp/memtrace-<euid>/memtrace.sock, what
 * mt_prof_socket_path falls back to. MT_EOVERFLOW if it does not fit. */
int mt__prof_socket_default(char *buf, size_t len);
/* Sends the optional {"type":"poke"} line (asks the daemon to drain now). */
int mt__prof_client_poke(int fd);

#define MT__PROF_SCHEMA_VERSION 1 /* "v" of every record */

/* The name of a tag in telemetry: tag_name's (when it gives a non-empty one), else the
 * built-in name, else "tag<n>" written into buf. tag_name may be NULL. Borrowed:
 * tag_name's string, a static one, or buf. */
#define MT__PROF_TAG_LABEL_MAX 16 /* "tag" + any int + NUL */
const char *mt__prof_tag_label(int tag, const char *(*tag_name)(void *ud, int tag), void *ud,
                               char buf[MT__PROF_TAG_LABEL_MAX]);

/* ---- the drainers' line writer (encode.c) ----
 *
 * One producer's event lines, byte for byte those of mt_prof_alloc_write, with what that
 * writer works out per line (the kind's, pool's and tag's names looked up, measured and
 * escaped; the pid formatted) done once: the daemon's drain and the local log's drainer
 * write millions of lines a second through it. Lines of the rarer shapes (marks, labels,
 * stack refs, gaps, outside memory) and user tags whose names are long go through
 * mt_prof_alloc_write itself.
 * Invariants: bit t of tags_known set => tag[t][0..tag_len[t]) is
 * ,"tag":<escaped name of t as tag_name gave it when filled>,"tag_id":t,"stream":
 * (the names are those of the last forget_tags: call it whenever tag_name may answer
 * differently, e.g. at each MT_EV_TAG_LABEL). */
#define MT__PROF_ENC_FRAG 64  /* bytes of a kind's, pool's or pid's piece */
#define MT__PROF_ENC_TAG  176 /* bytes of a tag's piece: a 24-byte label escaped, and more */
typedef struct mt__prof_enc_s {
    int pid;
    uint8_t pid_len; /* ,"pid":<pid>,"dev": */
    char pid_frag[MT__PROF_ENC_FRAG];
    uint8_t kind_len[MT_EV_KIND_COUNT];  /* ,"kind":"<name>","addr": ; 0 = not this way */
    uint8_t kind_name[MT_EV_KIND_COUNT]; /* bytes of the names (the room a line needs) */
    uint8_t pool_name[MT_POOL_HOST + 1];
    uint8_t tag_name[MT_TAG_MAX];
    char kind_frag[MT_EV_KIND_COUNT][MT__PROF_ENC_FRAG];
    uint8_t pool_len[MT_POOL_HOST + 1]; /* ,"pool":"<name>" */
    char pool_frag[MT_POOL_HOST + 1][MT__PROF_ENC_FRAG];
    uint32_t tags_known; /* bit t: tag[t] filled */
    uint32_t tags_long;  /* bit t: the name does not fit: general writer */
    uint8_t tag_len[MT_TAG_MAX];
    char tag[MT_TAG_MAX][MT__PROF_ENC_TAG];
} mt__prof_enc_t;
_Static_assert(MT_TAG_MAX <= 32, "tags_known is a 32-bit set");

/* Sets e up for the lines of process pid (no allocation; e is the caller's). */
void mt__prof_enc_init(mt__prof_enc_t *e, int pid);
/* Tag names may have changed: they are asked of tag_name again. */
void mt__prof_enc_forget_tags(mt__prof_enc_t *e);
/* As mt_prof_alloc_write(buf, cap, ev, e->pid, stack, tag_name, ud), same bytes, same
 * return value (the line's length, or the room it needs when cap is too small); unlike it,
 * it may change bytes past the line's NUL, below the room the line needs (its scratch). */
size_t mt__prof_enc_write(mt__prof_enc_t *e, char *buf, size_t cap, const mt_event_rec_t *ev,
                          uint32_t stack, const char *(*tag_name)(void *ud, int tag), void *ud);

/* {"v":1,"type":"exit",...}: the last line of a local log. New json_t * or NULL. */
void *mt__prof_exit_to_json(int pid, bool clean, uint64_t emitted, uint64_t dropped, uint64_t lost,
                            uint64_t t_ns);

/* ---- OOM snapshots (oomsnap.c; docs/torch-snapshot.md) ---- */

#define MT__OOMSNAP_KEEP 8 /* pairs the recorder keeps, as the daemon's default */

/* Opens dir, made 0700 where missing, one component at a time from / or the working
 * directory: a symbolic link is followed only if it and the directory holding it are ours or
 * root's and nobody else could have put it there (a directory closed to others, or sticky
 * and the link ours); the last component must be a directory of ours closed to others.
 * *out_fd is new. 0, MT_EIO (not so) or MT_EINVAL. */
int mt__oomsnap_dir_open(const char *dir, int *out_fd);
/* Creates name in dfd (0600, never over a file or through a link) holding data, all at once:
 * it appears complete or not at all; a failed write leaves nothing. MT_EBUSY if it exists,
 * -ENOSPC/-EDQUOT/-EFBIG when there is no room, MT_EIO. */
int mt__oomsnap_write_at(int dfd, const char *name, const void *data, size_t n);
/* Keeps the keep newest oom-*.json in dfd, with their .pickle; never removes spare's pair
 * (spare: a name without .json, or NULL). */
void mt__oomsnap_prune_at(int dfd, unsigned keep, const char *spare);
/* One snapshot: opens dir, makes room first (keep - 1 older pairs stay), writes base.json then
 * base.pickle; a write that finds the disk full removes the oldest other pair and is tried
 * once more, so the newest snapshot is the one kept. 0 or as above. */
int mt__oomsnap_write_pair(const char *dir, unsigned keep, const char *base, const void *json,
                           size_t json_len, const void *pickle, size_t pickle_len);

/* The recorder's follower (local mode): segments, live blocks, recent events; its writer. */
typedef struct mt__oomsnap_s mt__oomsnap_t;
typedef struct mt__oomsnap_cfg_s {
    int pid;
    const char *dir;      /* borrowed */
    unsigned keep;        /* pairs kept, >= 1 */
    unsigned interval_ms; /* between snapshots; 0 = every OOM */
    mt_log_cb log;        /* optional; called from the drainer and the writer thread */
    void *log_ud;
} mt__oomsnap_cfg_t;
int mt__oomsnap_create(mt__oomsnap_t **out, const mt__oomsnap_cfg_t *cfg);
/* Writes what is pending, joins the writer, says how many OOMs got no snapshot. */
void mt__oomsnap_destroy(mt__oomsnap_t **p);
/* Follows ev (caller: the drainer, with drain_lock); an OOM that is due (the first, then one
 * per interval by the events' clock) is serialised and handed to the writer thread as
 * oom-<pid>-dev<d>-<n>.{json,pickle} (after the previous one is written); the others are
 * counted. */
void mt__oomsnap_record(mt__oomsnap_t *s, const mt_event_rec_t *ev,
                        const char (*labels)[MT_EVENT_LABEL_MAX + 1],
                        const char *(*tag_name)(void *, int), void *ud);
/* Waits until the snapshot handed to the writer, if any, is written (or failed). */
void mt__oomsnap_flush(mt__oomsnap_t *s);
/* A live block as the follower knows it: alloc seen, free_completed not. */
typedef struct mt__oomsnap_block_s {
    uint64_t addr, size, requested; /* bytes; requested 0 unknown */
    uint8_t tag, pending, device;   /* pending: free requested, still occupying */
} mt__oomsnap_block_t;
/* What the next snapshot would show: the segment map, and the live blocks in no order.
 * Borrowed until the next record. Caller: as for record. */
void mt__oomsnap_view(const mt__oomsnap_t *s, const mt__segmap_t **segs,
                      const mt__oomsnap_block_t **blocks, size_t *nblocks);
/* Walks the follower's invariants (segment map, live blocks and their address table): 0, or
 * MT_EPROTO with the first violation in why (may be NULL). Caller: as for record. */
int mt__oomsnap_check(const mt__oomsnap_t *s, char *why, size_t whylen);
/* Snapshots written so far, and OOMs that got none. */
void mt__oomsnap_stats(mt__oomsnap_t *s, uint64_t *written, uint64_t *suppressed);

#endif
