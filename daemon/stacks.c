/* memtraced: producers' call-stack tables (docs/telemetry.md, "Call stacks").
 *
 * A producer's stack table lives in its ring's area (profiler/stack.h), which the daemon
 * maps read-only with the ring. When a stack ref names an id the daemon has not read yet,
 * the daemon reads that stack (and the modules found since) into the process's model and
 * puts their "stack"/"module" lines into the batch just before the ref: the log file and
 * every consumer connected then get them before the first line that uses them. A consumer
 * that connects later first gets the tables of the processes it follows, from the models. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/internal.h"
#include "util/json.h"

void mt__d_stacks_attach(mt_d_proc_t *p)
{
    size_t size;
    const void *area = p->ring ? mt__ring_area(p->ring, &size) : NULL;
    if (!area || mt__stab_view(&p->stab, area, size) != 0)
        memset(&p->stab, 0, sizeof p->stab); /* no table: its stacks read "unknown" */
}

void mt__d_stacks_detach(mt_d_proc_t *p)
{
    memset(&p->stab, 0, sizeof p->stab); /* the area goes with the ring */
}

void mt__d_stacks_free(mt_d_proc_t *p)
{
    mt__stab_seen_free(&p->stab_seen);
}

typedef struct put_ctx_s {
    mt_d_t *d;
    mt_d_proc_t *p;
} put_ctx_t;

/* A table line read from the producer: into the model, then into the batch. */
static void put_line(void *ud, const char *line, size_t len)
{
    put_ctx_t *x = ud;
    json_t *j = json_loadb(line, len, 0, NULL);
    if (j) {
        (void)mt__model_table_line(x->p->model, j, NULL, 0);
        json_decref(j);
    }
    mt_d_batch_t *b = x->d->lines.fill;
    size_t off = b->pre.len;
    if (mt__d_buf_append(&b->pre, line, len) != 0) {
        mt__d_buf_clear(&b->pre); /* its sticky error goes; the lines kept so far stay */
        b->pre.len = off;
        return;
    }
    mt_d_batch_rec_t *r = &b->rec[b->n++];
    memset(r, 0, sizeof *r); /* kind 0: a table line, filtered by pid only */
    r->proc = x->p;
    r->pid = x->p->pid;
    r->off = (uint32_t)off;
    r->len = (uint32_t)len;
}

uint32_t mt__d_stacks_record(mt_d_t *d, mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    uint32_t stack = 0;
    if (ev->kind == MT_EV_STACK_REF) {
        put_ctx_t x = {d, p};
        /* room for the table lines is made by the caller's batch flush */
        (void)mt__stab_emit_for(&p->stab, &p->stab_seen, (uint32_t)ev->size, p->pid, put_line, &x);
        p->pending_stack = (uint32_t)ev->size;
        p->pending_addr = ev->addr;
        return 0;
    }
    if (ev->kind == MT_EV_ALLOC && p->pending_stack && ev->addr == p->pending_addr)
        stack = p->pending_stack;
    p->pending_stack = 0;
    return stack;
}

/* ---- a new consumer's tables ---- */

static json_t *hexs(uint64_t x)
{
    char b[24];
    snprintf(b, sizeof b, "0x%" PRIx64, x);
    return json_string(b);
}

static int append_json(mt_d_buf_t *b, json_t *o, bool sse)
{
    if (!o)
        return MT_ENOMEM;
    char *s;
    int rc = mt__json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII, &s, NULL);
    json_decref(o);
    if (rc)
        return rc;
    rc = mt__d_buf_printf(b, "%s%s\n%s", sse ? "data: " : "", s, sse ? "\n" : "");
    free(s);
    return rc;
}

int mt__d_stacks_tables(const mt_d_proc_t *p, bool sse, mt_d_buf_t *out)
{
    const mt_model_module_t *mods;
    size_t nm;
    int rc = 0;
    mt__model_modules(p->model, &mods, &nm);
    for (size_t i = 0; i < nm && rc == 0; i++)
        rc = append_json(out,
                         json_pack("{s:i, s:s, s:i, s:s, s:o, s:I, s:s}", "v", 1, "kind", "module",
                                   "pid", p->pid, "path", mods[i].path, "base", hexs(mods[i].base),
                                   "size", (json_int_t)mods[i].size, "build_id", mods[i].build_id),
                         sse);
    mt_model_stack_stats_t st;
    mt__model_stack_stats(p->model, &st);
    size_t left = st.defined; /* ids are given out in order: stop after the last */
    for (uint32_t id = 1; rc == 0 && left > 0 && id <= MT_STACK_ID_MAX; id++) {
        const mt_model_frame_t *f;
        int n;
        bool tr;
        if (mt__model_stack_frames(p->model, id, &f, &n, &tr) != 0)
            continue;
        left--;
        json_t *fr = json_array();
        for (int k = 0; fr && k < n; k++) {
            json_t *e = f[k].py_func
                            ? json_pack("{s:s, s:s, s:i}", "py", f[k].py_func, "file",
                                        f[k].py_file ? f[k].py_file : "?", "line", f[k].py_line)
                            : json_pack("{s:o}", "ip", hexs(f[k].ip));
            if (!e || json_array_append_new(fr, e) != 0) {
                json_decref(fr);
                fr = NULL;
            }
        }
        json_t *o = fr ? json_pack("{s:i, s:s, s:i, s:I, s:o}", "v", 1, "kind", "stack", "pid",
                                   p->pid, "id", (json_int_t)id, "frames", fr)
                       : NULL;
        if (o && tr && json_object_set_new(o, "truncated", json_true()) != 0) {
            json_decref(o); /* a stack not said truncated is a stack told wrong */
            o = NULL;
        }
        rc = append_json(out, o, sse);
    }
    return rc;
}
