/* Streams and events of the sim backend: real asynchrony on worker threads.
 *
 * Each stream owns one worker thread and an unbounded FIFO of operations (copy, memset,
 * event record, wait for an event, host function). Enqueueing never waits for execution,
 * so the host runs ahead of the "device" exactly as with CUDA, and races between streams
 * are real races that tests can observe.
 *
 * Events follow CUDA: each record creates a fresh mark (a completion flag with a
 * timestamp) capturing everything queued on the stream so far, and the event points at
 * its latest mark, so a re-record replaces the earlier capture. stream_wait_event holds a
 * reference to the mark current at the time of the call, not to the event, so a later
 * re-record or destroy of the event does not change what the waiting stream waits for. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/sim_internal.h"

/* A captured point in a stream. Refcounted: one reference from the event while it is
 * the event's latest mark, one from each queued op that records or waits on it.
 * Guarded by sim_group_t.ev_mu (shared by the group's devices). */
struct sim_mark_s {
    unsigned refs;    /* > 0 while reachable */
    bool done;        /* the recording stream reached it */
    uint64_t time_ns; /* CLOCK_MONOTONIC at completion; 0 until done */
    sim_t *origin;    /* the device of the recording stream */
    uint32_t sid;     /* its stream id */
    uint64_t seq;     /* ops queued on that stream before the record (the pool's ordering) */
};

/* Guarded by sim_group_t.ev_mu. latest == NULL: never recorded (queries report
 * complete). */
struct mt_event_s {
    struct mt_event_s *prev, *next; /* owner->events list */
    sim_t *owner;                   /* the device that created it */
    sim_mark_t *latest;
};

typedef enum op_kind_e {
    OP_COPY,
    OP_SET,
    OP_RECORD,
    OP_WAIT,
    OP_HOST,
    OP_PEER,
} op_kind_e;

typedef struct sim_op_s {
    struct sim_op_s *next;
    op_kind_e kind;
    union {
        struct {
            void *dst;
            const void *src;
            size_t n;
            uint64_t cost_ns; /* OP_PEER: modelled time spent after the copy */
        } copy;
        struct {
            void *dst;
            int value;
            size_t n;
        } set;
        sim_mark_t *mark; /* OP_RECORD, OP_WAIT: one reference owned by the op */
        struct {
            void (*fn)(void *);
            void *ud;
        } host;
    } u;
} sim_op_t;

/* One stream and its worker.
 * The default stream (NULL handle, id 0) is a plain FIFO stream like
 * cudaStreamPerThread: it does not implicitly synchronise with other streams (no legacy
 * null-stream barrier); order across streams is expressed with events only.
 * Invariants (under mu): done_seq <= enq_seq; the queue holds enq_seq - done_seq ops,
 * minus the one the worker is running (running == true); ops run in enqueue order. */
struct sim_stream_s {
    mt_stream_t hdr; /* must be first: mt_stream_id() reads it */
    sim_t *sim;
    sim_stream_t *prev, *next; /* sim_t.streams list, under streams_mu */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* signalled on enqueue and on stop */
    pthread_cond_t idle_cv; /* broadcast when an op finishes and someone synchronises */
    sim_op_t *head, *tail;
    uint64_t enq_seq;      /* ops enqueued so far */
    uint64_t done_seq;     /* ops finished so far */
    unsigned sync_waiters; /* threads waiting on idle_cv */
    bool stop;             /* set by destroy after draining */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static sim_t *to_sim(mt_backend_t *b)
{
    return (sim_t *)b;
}

/* Holds this stream's worker for d ns, as a copy engine busy with a transfer. A sleep to
 * an absolute deadline: peer copies are long enough that its overshoot does not matter,
 * and the worker does not burn a core meanwhile. */
static void spend_on_stream(uint64_t d)
{
    if (d == 0)
        return;
    uint64_t end = now_ns() + d;
    struct timespec ts = {(time_t)(end / 1000000000u), (long)(end % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* True if st is NULL or a stream of device s (a stream of another device is refused). */
static bool own_stream(sim_t *s, mt_stream_t *st)
{
    return st == NULL || ((sim_stream_t *)st)->sim == s;
}

static sim_stream_t *resolve(sim_t *s, mt_stream_t *st)
{
    return st == NULL ? s->default_s : (sim_stream_t *)st;
}

/* ---- marks (caller holds ev_mu) ---- */

static void mark_unref(sim_mark_t *m)
{
    if (m != NULL && --m->refs == 0)
        free(m);
}

/* ---- the worker ---- */

static void run_op(sim_stream_t *ss, sim_op_t *op)
{
    sim_t *s = ss->sim;
    switch (op->kind) {
    case OP_COPY:
        memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
        break;
    case OP_SET:
        memset(op->u.set.dst, op->u.set.value, op->u.set.n);
        break;
    case OP_RECORD:
        pthread_mutex_lock(&s->group->ev_mu);
        op->u.mark->time_ns = now_ns();
        op->u.mark->done = true;
        mark_unref(op->u.mark);
        pthread_cond_broadcast(&s->group->ev_cv);
        pthread_mutex_unlock(&s->group->ev_mu);
        break;
    case OP_WAIT:
        pthread_mutex_lock(&s->group->ev_mu);
        while (!op->u.mark->done)
            pthread_cond_wait(&s->group->ev_cv, &s->group->ev_mu);
        mark_unref(op->u.mark);
        pthread_mutex_unlock(&s->group->ev_mu);
        break;
    case OP_HOST:
        op->u.host.fn(op->u.host.ud);
        break;
    case OP_PEER:
        memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
        spend_on_stream(op->u.copy.cost_ns);
        break;
    }
}

static void *worker_main(void *arg)
{
    sim_stream_t *ss = arg;
    pthread_mutex_lock(&ss->mu);
    for (;;) {
        while (ss->head == NULL && !ss->stop)
            pthread_cond_wait(&ss->work_cv, &ss->mu);
        if (ss->head == NULL)
            break; /* stop is only set once the queue is drained */
        sim_op_t *op = ss->head;
        ss->head = op->next;
        if (ss->head == NULL)
            ss->tail = NULL;
        pthread_mutex_unlock(&ss->mu);
        run_op(ss, op);
        free(op);
        pthread_mutex_lock(&ss->mu);
        ss->done_seq++;
        if (ss->sync_waiters > 0)
            pthread_cond_broadcast(&ss->idle_cv);
    }
    pthread_mutex_unlock(&ss->mu);
    return NULL;
}

/* Takes ownership of op (and of any mark reference in it), even on failure. Returns the
 * number of ops queued on ss before op. */
static uint64_t enqueue(sim_stream_t *ss, sim_op_t *op)
{
    op->next = NULL;
    pthread_mutex_lock(&ss->mu);
    uint64_t before = ss->enq_seq;
    if (ss->tail != NULL)
        ss->tail->next = op;
    else
        ss->head = op;
    ss->tail = op;
    ss->enq_seq++;
    pthread_cond_signal(&ss->work_cv);
    pthread_mutex_unlock(&ss->mu);
    return before;
}

static sim_op_t *op_new(op_kind_e kind)
{
    sim_op_t *op = malloc(sizeof *op);
    if (op != NULL)
        op->kind = kind;
    return op;
}

static void drain(sim_stream_t *ss)
{
    pthread_mutex_lock(&ss->mu);
    uint64_t target = ss->enq_seq;
    ss->sync_waiters++;
    while (ss->done_seq < target)
        pthread_cond_wait(&ss->idle_cv, &ss->mu);
    ss->sync_waiters--;
    pthread_mutex_unlock(&ss->mu);
}

/* ---- stream lifecycle ---- */

static int stream_new(sim_t *s, uint32_t id, sim_stream_t **out)
{
    sim_stream_t *ss = calloc(1, sizeof *ss);
    if (ss == NULL)
        return MT_ENOMEM;
    ss->hdr.id = id;
    ss->sim = s;
    if (pthread_mutex_init(&ss->mu, NULL) != 0)
        goto fail_mu;
    if (pthread_cond_init(&ss->work_cv, NULL) != 0)
        goto fail_work;
    if (pthread_cond_init(&ss->idle_cv, NULL) != 0)
        goto fail_idle;
    if (pthread_create(&ss->thread, NULL, worker_main, ss) != 0)
        goto fail_thread;
    *out = ss;
    return 0;

fail_thread:
    pthread_cond_destroy(&ss->idle_cv);
fail_idle:
    pthread_cond_destroy(&ss->work_cv);
fail_work:
    pthread_mutex_destroy(&ss->mu);
fail_mu:
    free(ss);
    return MT_ENOMEM;
}

/* Drains, stops and joins the worker, frees the stream. Not linked any more. */
static void stream_free(sim_stream_t *ss)
{
    drain(ss);
    pthread_mutex_lock(&ss->mu);
    ss->stop = true;
    pthread_cond_signal(&ss->work_cv);
    pthread_mutex_unlock(&ss->mu);
    pthread_join(ss->thread, NULL);
    pthread_cond_destroy(&ss->idle_cv);
    pthread_cond_destroy(&ss->work_cv);
    pthread_mutex_destroy(&ss->mu);
    free(ss);
}

/* Caller holds streams_mu. */
static void link_stream(sim_t *s, sim_stream_t *ss)
{
    ss->prev = NULL;
    ss->next = s->streams;
    if (s->streams != NULL)
        s->streams->prev = ss;
    s->streams = ss;
}

static void unlink_stream(sim_t *s, sim_stream_t *ss)
{
    if (ss->prev != NULL)
        ss->prev->next = ss->next;
    else
        s->streams = ss->next;
    if (ss->next != NULL)
        ss->next->prev = ss->prev;
}

int mt__sim_streams_init(sim_t *s)
{
    s->next_stream_id = 1;
    if (pthread_mutex_init(&s->streams_mu, NULL) != 0)
        goto fail_streams_mu;
    if (stream_new(s, 0, &s->default_s) != 0)
        goto fail_default;
    link_stream(s, s->default_s);
    return 0;

fail_default:
    pthread_mutex_destroy(&s->streams_mu);
fail_streams_mu:
    return MT_ENOMEM;
}

void mt__sim_streams_fini(sim_t *s)
{
    /* Synchronise everything first: a stream may wait on a mark another stream records.
     * The group's owner synchronised every device before, for marks across devices. */
    mt__sim_device_synchronize(&s->base);
    while (s->streams != NULL) {
        sim_stream_t *ss = s->streams;
        unlink_stream(s, ss);
        stream_free(ss);
    }
    while (s->events != NULL) {
        struct mt_event_s *ev = s->events;
        s->events = ev->next;
        mark_unref(ev->latest);
        free(ev);
    }
    pthread_mutex_destroy(&s->streams_mu);
}

void mt__sim_streams_fork(sim_t *s, int phase)
{
    if (phase == MT__FORK_PREPARE) {
        pthread_mutex_lock(&s->streams_mu);
        for (sim_stream_t *ss = s->streams; ss != NULL; ss = ss->next)
            pthread_mutex_lock(&ss->mu);
        return;
    }
    for (sim_stream_t *ss = s->streams; ss != NULL; ss = ss->next) {
        if (phase == MT__FORK_PARENT) {
            pthread_mutex_unlock(&ss->mu);
            continue;
        }
        pthread_mutex_init(&ss->mu, NULL);
        pthread_cond_init(&ss->work_cv, NULL);
        pthread_cond_init(&ss->idle_cv, NULL);
        ss->sync_waiters = 0; /* the parent's waiters are not here */
    }
    if (phase == MT__FORK_PARENT)
        pthread_mutex_unlock(&s->streams_mu);
    else
        pthread_mutex_init(&s->streams_mu, NULL);
}

int mt__sim_stream_create(mt_backend_t *b, mt_stream_t **out)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->streams_mu);
    sim_stream_t *ss;
    int rc = stream_new(s, s->next_stream_id, &ss);
    if (rc == 0) {
        s->next_stream_id++;
        link_stream(s, ss);
        *out = &ss->hdr;
    }
    pthread_mutex_unlock(&s->streams_mu);
    return rc;
}

void mt__sim_stream_destroy(mt_backend_t *b, mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    sim_stream_t *ss = (sim_stream_t *)st;
    if (ss == s->default_s)
        return;
    pthread_mutex_lock(&s->streams_mu);
    unlink_stream(s, ss);
    pthread_mutex_unlock(&s->streams_mu);
    stream_free(ss);
}

int mt__sim_stream_synchronize(mt_backend_t *b, mt_stream_t *st)
{
    drain(resolve(to_sim(b), st));
    return 0;
}

int mt__sim_stream_progress(sim_t *s, uint32_t id, uint64_t *enq, uint64_t *done)
{
    int rc = MT_ENOENT;
    pthread_mutex_lock(&s->streams_mu);
    for (sim_stream_t *ss = s->streams; ss != NULL; ss = ss->next) {
        if (ss->hdr.id != id)
            continue;
        pthread_mutex_lock(&ss->mu);
        *enq = ss->enq_seq;
        *done = ss->done_seq;
        pthread_mutex_unlock(&ss->mu);
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&s->streams_mu);
    return rc;
}

int mt__sim_device_synchronize(mt_backend_t *b)
{
    sim_t *s = to_sim(b);
    /* Holding streams_mu keeps every stream alive while we wait on it. */
    pthread_mutex_lock(&s->streams_mu);
    for (sim_stream_t *ss = s->streams; ss != NULL; ss = ss->next)
        drain(ss);
    pthread_mutex_unlock(&s->streams_mu);
    return 0;
}

/* ---- work ---- */

int mt__sim_launch_host_func(mt_backend_t *b, mt_stream_t *st, void (*fn)(void *), void *ud)
{
    sim_op_t *op = op_new(OP_HOST);
    if (op == NULL)
        return MT_ENOMEM;
    op->u.host.fn = fn;
    op->u.host.ud = ud;
    enqueue(resolve(to_sim(b), st), op);
    return 0;
}

int mt__sim_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                         mt_memcpy_kind_e kind, mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    /* All memory is host-addressable, so only the claim of the kind is checked: a device
     * side that is not live device memory is a caller bug, reported here rather than as
     * a fault on the worker thread. */
    bool dst_dev = kind == MT_MEMCPY_HOST_TO_DEVICE || kind == MT_MEMCPY_DEVICE_TO_DEVICE;
    bool src_dev = kind == MT_MEMCPY_DEVICE_TO_HOST || kind == MT_MEMCPY_DEVICE_TO_DEVICE;
    if (!own_stream(s, st) || (dst_dev && !mt__sim_span_is_device(s, dst, n)) ||
        (src_dev && !mt__sim_span_is_device(s, src, n)))
        return MT_EINVAL;
    /* Copies run on the device's engines: a managed side is a device access. */
    int rc = mt__sim_managed_touch_async(s, st, src, n, false);
    if (rc == 0)
        rc = mt__sim_managed_touch_async(s, st, dst, n, true);
    if (rc != 0)
        return rc;
    sim_op_t *op = op_new(OP_COPY);
    if (op == NULL)
        return MT_ENOMEM;
    op->u.copy.dst = dst;
    op->u.copy.src = src;
    op->u.copy.n = n;
    enqueue(resolve(s, st), op);
    return 0;
}

int mt__sim_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                              int src_device, size_t n, mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    sim_group_t *g = s->group;
    /* backend.c checked both ordinals against g->n. */
    if (!own_stream(s, st) || !mt__sim_span_is_device(g->dev[dst_device], dst, n) ||
        !mt__sim_span_is_device(g->dev[src_device], src, n)) {
        mt__backend_log(b, MT_LOG_ERROR,
                        "memtrace: peer copy of %zu bytes from device %d to device %d: a span "
                        "is not live memory of its device (or the stream is not device %d's)",
                        n, src_device, dst_device, s->base.device);
        return MT_EINVAL;
    }
    sim_op_t *op = op_new(OP_PEER);
    if (op == NULL)
        return MT_ENOMEM;
    uint64_t bw = atomic_load_explicit(&g->peer_bandwidth, memory_order_relaxed);
    op->u.copy.dst = dst;
    op->u.copy.src = src;
    op->u.copy.n = n;
    op->u.copy.cost_ns = atomic_load_explicit(&g->peer_cost_ns, memory_order_relaxed) +
                         (uint64_t)((double)n * 1e9 / (double)bw);
    mt__backend_add_peer(b, n, op->u.copy.cost_ns);
    enqueue(resolve(s, st), op);
    return 0;
}

int mt__sim_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    /* cudaMemsetAsync takes device memory only. */
    if (!own_stream(s, st) || !mt__sim_span_is_device(s, dst, n))
        return MT_EINVAL;
    int rc = mt__sim_managed_touch_async(s, st, dst, n, true);
    if (rc != 0)
        return rc;
    sim_op_t *op = op_new(OP_SET);
    if (op == NULL)
        return MT_ENOMEM;
    op->u.set.dst = dst;
    op->u.set.value = value;
    op->u.set.n = n;
    enqueue(resolve(s, st), op);
    return 0;
}

/* ---- events ---- */

int mt__sim_event_create(mt_backend_t *b, mt_event_t **out)
{
    sim_t *s = to_sim(b);
    struct mt_event_s *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return MT_ENOMEM;
    ev->owner = s;
    pthread_mutex_lock(&s->group->ev_mu);
    ev->next = s->events;
    if (s->events != NULL)
        s->events->prev = ev;
    s->events = ev;
    pthread_mutex_unlock(&s->group->ev_mu);
    *out = ev;
    return 0;
}

/* Like cudaEventDestroy, legal while the event is pending: queued ops hold their own
 * references to the marks. */
void mt__sim_event_destroy(mt_backend_t *b, mt_event_t *ev)
{
    sim_t *s = ev->owner; /* the list it is on, whichever device's handle is passed */
    (void)b;
    pthread_mutex_lock(&s->group->ev_mu);
    if (ev->prev != NULL)
        ev->prev->next = ev->next;
    else
        s->events = ev->next;
    if (ev->next != NULL)
        ev->next->prev = ev->prev;
    mark_unref(ev->latest);
    pthread_mutex_unlock(&s->group->ev_mu);
    free(ev);
}

int mt__sim_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    if (ev->owner != s || !own_stream(s, st))
        return MT_EINVAL; /* cudaEventRecord: event and stream of the same device */
    sim_op_t *op = op_new(OP_RECORD);
    sim_mark_t *m = calloc(1, sizeof *m);
    if (op == NULL || m == NULL) {
        free(op);
        free(m);
        return MT_ENOMEM;
    }
    m->refs = 2; /* the event and the op */
    op->u.mark = m;
    /* The mark becomes the event's capture before the op is queued, so a query right
     * after this call sees it pending. */
    sim_stream_t *ss = resolve(s, st);
    m->origin = s;
    m->sid = ss->hdr.id;
    pthread_mutex_lock(&s->group->ev_mu);
    mark_unref(ev->latest);
    ev->latest = m;
    m->refs++; /* kept until its seq is written (the op may complete and unref first) */
    pthread_mutex_unlock(&s->group->ev_mu);
    uint64_t seq = enqueue(ss, op);
    pthread_mutex_lock(&s->group->ev_mu);
    m->seq = seq;
    mark_unref(m);
    pthread_mutex_unlock(&s->group->ev_mu);
    return 0;
}

int mt__sim_stream_wait_event(mt_backend_t *b, mt_stream_t *st, mt_event_t *ev)
{
    sim_t *s = to_sim(b);
    if (ev->owner->group != s->group || !own_stream(s, st))
        return MT_EINVAL;
    sim_op_t *op = op_new(OP_WAIT);
    if (op == NULL)
        return MT_ENOMEM;
    pthread_mutex_lock(&s->group->ev_mu);
    sim_mark_t *m = ev->latest;
    bool needed = m != NULL && !m->done;
    if (needed)
        m->refs++;
    sim_t *origin = m != NULL ? m->origin : NULL;
    uint32_t sid = m != NULL ? m->sid : 0;
    uint64_t seq = m != NULL ? m->seq : 0;
    pthread_mutex_unlock(&s->group->ev_mu);
    /* Later allocations on st may reuse what the recording stream freed before the record. */
    if (origin == s)
        mt__sim_pool_note_wait(s, resolve(s, st)->hdr.id, sid, seq);
    if (!needed) {
        /* Never recorded or already complete: nothing to wait for (cudaStreamWaitEvent
         * on such an event is a no-op). */
        free(op);
        return 0;
    }
    op->u.mark = m;
    enqueue(resolve(s, st), op);
    return 0;
}

int mt__sim_event_query(mt_backend_t *b, mt_event_t *ev)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->group->ev_mu);
    bool done = ev->latest == NULL || ev->latest->done;
    pthread_mutex_unlock(&s->group->ev_mu);
    return done ? 0 : MT_EAGAIN;
}

int mt__sim_event_synchronize(mt_backend_t *b, mt_event_t *ev)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->group->ev_mu);
    sim_mark_t *m = ev->latest;
    if (m != NULL) {
        m->refs++; /* the event may be re-recorded while we wait */
        while (!m->done)
            pthread_cond_wait(&s->group->ev_cv, &s->group->ev_mu);
        mark_unref(m);
    }
    pthread_mutex_unlock(&s->group->ev_mu);
    return 0;
}

uint64_t mt__sim_event_time_ns(mt_backend_t *b, mt_event_t *ev)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->group->ev_mu);
    uint64_t t = ev->latest != NULL && ev->latest->done ? ev->latest->time_ns : 0;
    pthread_mutex_unlock(&s->group->ev_mu);
    return t;
}
