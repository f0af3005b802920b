/* The printers of `memtrace report`: its text, section by section, and the shaping of the
 * analysis (analysis/report.c) that both its text and its JSON go through. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "analysis/frames.h"
#include "analysis/report.h"
#include "tools/report_print.h"
#include "tools/report_print_internal.h"
#include "util/text.h"

/* Where the text goes: stdout, or a process's text kept for later (set by the entry points
 * below, for the printers they call). */
static FILE *pout;

static void bar(double frac, int width)
{
    int n = (int)(frac * width + 0.5);
    for (int i = 0; i < width; i++)
        fputs(i < n ? "#" : ".", pout);
}

static void print_growth(json_t *g)
{
    char b1[32];
    double iters = num(g, "iterations");
    fprintf(pout, "\n  growth across iterations: ");
    if (iters < 3) {
        fprintf(pout, "%.0f iteration markers, too few to tell\n", iters);
        return;
    }
    fprintf(pout, "%.0f iterations (%.0f..%.0f fitted), allocated %s%s per iteration (r2 %.2f)\n",
            iters, num(g, "first_iteration"), num(g, "last_iteration"),
            num(g, "slope_bytes_per_iteration") >= 0 ? "+" : "",
            human(num(g, "slope_bytes_per_iteration"), b1, sizeof(b1)), num(g, "r2"));
    if (json_is_true(json_object_get(g, "detected"))) {
        fprintf(pout,
                "    STEADY GROWTH: +%s over the fitted iterations; memory is kept alive from\n"
                "    one iteration to the next (history held by a reference?)\n",
                human(num(g, "rise_bytes"), b1, sizeof(b1)));
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(g, "tags"), i, t)
        {
            esc_buf_t e;
            fprintf(pout, "    - %s grows %s per iteration (r2 %.2f)\n",
                    esc(json_string_value(json_object_get(t, "tag")), e),
                    human(num(t, "slope_bytes_per_iteration"), b1, sizeof(b1)), num(t, "r2"));
        }
    } else {
        fprintf(pout, "    no steady growth\n");
    }
}

/* Pinned host memory, apart from the device figures; nothing when the process has none. */
static void print_host(json_t *h)
{
    char b1[32], b2[32], b3[32], b4[32];
    if (num(h, "events") <= 0)
        return;
    fprintf(pout, "\n  pinned host memory (not device memory): %.0f events\n", num(h, "events"));
    fprintf(pout, "    peak allocated %s, peak reserved %s; at the end %s allocated, %s reserved\n",
            human(num(h, "peak_allocated"), b1, sizeof(b1)),
            human(num(h, "peak_reserved"), b2, sizeof(b2)),
            human(num(h, "final_allocated"), b3, sizeof(b3)),
            human(num(h, "final_reserved"), b4, sizeof(b4)));
    json_t *tags = json_object_get(h, "peak_by_tag");
    const char *k;
    json_t *v;
    json_object_foreach(tags, k, v)
    {
        esc_buf_t e;
        fprintf(pout, "    %-14s %12s peak\n", esc(k, e),
                human(json_number_value(v), b1, sizeof(b1)));
    }
    json_t *nf = json_object_get(h, "never_freed");
    fprintf(pout, "    never freed: %.0f pinned blocks, %s\n", num(nf, "count"),
            human(num(nf, "bytes"), b1, sizeof(b1)));
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(nf, "groups"), i, g)
    {
        esc_buf_t e;
        fprintf(pout, "      %-14s %12s x %.0f\n",
                esc(json_string_value(json_object_get(g, "tag")), e),
                human(num(g, "size"), b1, sizeof(b1)), num(g, "count"));
    }
}

/* A label from the log (another process's text), escaped (util/text.h). */
static void put_plain(const char *s)
{
    char buf[MT_TEXT_ESC_SIZE(512)];
    fputs(mt__text_escape(s ? s : "?", buf, sizeof buf), pout);
}

/* How call sites are printed: the options of this run, set by the two entry points below
 * (mt__report_print_fit, mt__report_print_text) for the printers they call. */
static mt__report_print_opts_t popt;
/* The process being printed has no clock (its "clock" is "event_order"): its times in
 * seconds count events, a nanosecond each (mt__report_set_untimed). */
static bool untimed;

/* A time of the process's JSON, in seconds, as the text shows it (10 columns). */
static void put_when(double t_s)
{
    if (untimed)
        fprintf(pout, "event %4.0f", t_s * 1e9);
    else
        fprintf(pout, "%9.3f s", t_s);
}

/* Under a site: the frames after its user frame that the rules keep (the next five; all
 * with --stacks; none for a function, file or module group unless --stacks), or every frame
 * of the stack with --frames all. */
static void print_frames(json_t *r)
{
    json_t *frames = json_object_get(r, "frames");
    size_t n = json_array_size(frames), shown = 0, cap = popt.stacks || popt.all ? SIZE_MAX : 5;
    size_t from = (size_t)json_integer_value(json_object_get(r, "user_frame")) + 1;
    if (!popt.all && !popt.stacks &&
        ((popt.by != MT_FR_BY_SITE && popt.by != MT_FR_BY_STACK) || num(r, "stacks") > 1))
        return; /* several stacks: the largest one's callers would speak for all */
    for (size_t k = from; k < n; k++) {
        json_t *f = json_array_get(frames, k);
        if (!popt.all && json_object_get(f, "skipped") != NULL)
            continue;
        if (shown++ == cap) {
            fprintf(pout, "        <- ...\n");
            return;
        }
        fprintf(pout, "        <- ");
        put_plain(json_string_value(json_object_get(f, "label")));
        fprintf(pout, "\n");
    }
    if (json_is_true(json_object_get(r, "truncated")))
        fprintf(pout, "        <- ...\n");
}

static void print_sites(const char *title, json_t *rows, bool growth)
{
    char b1[32];
    fprintf(pout, "\n  %s:\n", title);
    if (json_array_size(rows) == 0)
        fprintf(pout, "    (none)\n");
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r)
    {
        if (growth)
            fprintf(pout, "    %s%s/iter r2 %.2f%s  ", num(r, "slope") >= 0 ? "+" : "",
                    human(num(r, "slope"), b1, sizeof(b1)), num(r, "r2"),
                    json_is_true(json_object_get(r, "detected")) ? " GROWING" : "");
        else
            fprintf(pout, "    %10s %6.0f blocks  ", human(num(r, "bytes"), b1, sizeof(b1)),
                    num(r, "blocks"));
        put_plain(json_string_value(json_object_get(r, "site")));
        fprintf(pout, "\n");
        print_frames(r);
    }
}

/* Call sites: printed when asked for (--by), or for untagged input that recorded stacks. */
static void print_callsites(json_t *cs, bool tagged)
{
    if (!cs || popt.by == MT_FR_BY_TAG)
        return;
    if (!popt.explicit_by && (tagged || num(cs, "stacks") <= 0))
        return;
    char t[3][96];
    const char *by = popt.by == MT_FR_BY_SITE ? "call site" : mt__fr_by_name(popt.by);
    snprintf(t[0], sizeof t[0], "live bytes at the peak, by %s", by);
    snprintf(t[1], sizeof t[1], "never freed, by %s", by);
    snprintf(t[2], sizeof t[2], "growth per iteration, by %s", by);
    fprintf(pout, "\n  call sites: %.0f distinct stacks recorded\n", num(cs, "stacks"));
    print_sites(t[0], json_object_get(cs, "at_peak"), false);
    print_sites(t[1], json_object_get(cs, "never_freed"), false);
    print_sites(t[2], json_object_get(cs, "growth"), true);
}

static const char *lifetime(double us, char *buf, size_t len)
{
    if (us < 1000)
        snprintf(buf, len, "%.0f us", us);
    else if (us < 1e6)
        snprintf(buf, len, "%.1f ms", us / 1e3);
    else
        snprintf(buf, len, "%.1f s", us / 1e6);
    return buf;
}

/* Blocks freed soon after their allocation, by site (or by tag without stacks). */
static void print_temporary(json_t *p)
{
    json_t *rows = json_object_get(p, "temporary");
    if (rows == NULL)
        return;
    char b1[32], b2[32];
    const char *by = json_string_value(json_object_get(p, "temporary_by"));
    bool tag = by != NULL && strcmp(by, "tag") == 0;
    fprintf(pout, "\n  temporary allocations (freed within %s of their allocation), by %s%s:\n",
            lifetime(num(p, "temporary_window_us"), b1, sizeof b1),
            tag ? "tag"
            : strcmp(by ? by : "site", "site") == 0 ? "call site"
                                                    : by,
            tag && popt.by != MT_FR_BY_TAG && !json_is_true(json_object_get(p, "tagged"))
                ? " (no stacks recorded)"
                : "");
    if (json_array_size(rows) == 0) {
        fprintf(pout, "    (none)\n");
        return;
    }
    fprintf(pout, "    %8s %10s %12s  %s\n", "count", "bytes", "median life", tag ? "tag" : "site");
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r)
    {
        fprintf(pout, "    %8.0f %10s %12s  ", num(r, "count"),
                human(num(r, "bytes"), b1, sizeof b1),
                lifetime(num(r, "median_lifetime_us"), b2, sizeof b2));
        put_plain(json_string_value(json_object_get(r, "site")));
        fprintf(pout, "\n");
    }
}

/* Whether a process's input carried tags: any byte under a tag other than "other". */
static bool is_tagged(json_t *p)
{
    const char *k;
    json_t *v;
    json_t *h = json_object_get(p, "host");
    json_object_foreach(json_object_get(p, "peak_by_tag"), k, v)
    {
        if (strcmp(k, "other") != 0)
            return true;
    }
    json_object_foreach(json_object_get(h, "peak_by_tag"), k, v)
    {
        if (strcmp(k, "other") != 0)
            return true;
    }
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(json_object_get(p, "never_freed"), "groups"), i, g)
    {
        const char *t = json_string_value(json_object_get(g, "tag"));
        if (t != NULL && strcmp(t, "other") != 0)
            return true;
    }
    return false;
}

/* Untagged input: the sections by tag would say "other" for every byte (report_print.h). */
int mt__report_print_fit(json_t *res, const mt__report_print_opts_t *o)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(res, "processes"), i, p)
    {
        if (mt__report_print_fit_process(res, p, o) != 0)
            return MT_ENOMEM;
    }
    return 0;
}

int mt__report_print_fit_process(const json_t *res, json_t *p, const mt__report_print_opts_t *o)
{
    popt = *o;
    bool tagged = is_tagged(p);
    if (json_object_set_new(p, "tagged", json_boolean(tagged)) != 0)
        return MT_ENOMEM;
    if (!tagged && popt.by != MT_FR_BY_TAG) {
        json_object_del(p, "peak_by_tag");
        json_object_del(json_object_get(p, "never_freed"), "groups");
        json_object_del(json_object_get(p, "never_freed"), "groups_total");
        json_t *h = json_object_get(p, "host");
        json_object_del(h, "peak_by_tag");
        json_object_del(json_object_get(h, "never_freed"), "groups");
    }
    json_t *cs = json_object_get(p, "callsites");
    /* A snapshot's stacks are its frames, grouped in "snapshots": its process has none. */
    size_t k;
    json_t *sn;
    json_array_foreach(json_object_get(res, "snapshots"), k, sn)
    {
        if (cs != NULL && num(cs, "stacks") <= 0 &&
            json_integer_value(json_object_get(sn, "process")) ==
                json_integer_value(json_object_get(p, "pid"))) {
            json_object_del(p, "callsites");
            cs = NULL;
        }
    }
    if (cs != NULL &&
        (popt.by == MT_FR_BY_TAG || (!popt.explicit_by && (tagged || num(cs, "stacks") <= 0))))
        json_object_del(p, "callsites");
    /* Temporary allocations follow the same rule: tagged input without --by, by tag. */
    json_t *tt = json_object_get(p, "temporary_by_tag");
    if (tt != NULL && (popt.by == MT_FR_BY_TAG || (!popt.explicit_by && tagged)) &&
        (json_object_set(p, "temporary", tt) != 0 ||
         json_object_set_new(p, "temporary_by", json_string("tag")) != 0))
        return MT_ENOMEM;
    json_object_del(p, "temporary_by_tag");
    return 0;
}

/* reserved - allocated at the peak and at the end, by cause (analysis/gap.h). */
static void print_gap(json_t *p)
{
    static const char *const what[][2] = {
        {"pinned_free", "free in segments that hold live blocks"},
        {"cached_segments", "whole free segments kept in the cache"},
        {"stream_pending", "freed, waiting on stream events"},
        {"expandable_slack", "free mapped pages of expandable segments"},
        {"untracked", "not in the segment map (before the log, lost events)"},
    };
    json_t *g[2] = {json_object_get(p, "peak_gap"), json_object_get(p, "end_gap")};
    if (!g[0] || !g[1] || (num(g[0], "reserved_bytes") <= 0 && num(g[1], "reserved_bytes") <= 0))
        return; /* no device memory reserved: nothing to explain */
    char b[4][32];
    fprintf(pout, "\n  %-46s %12s %14s\n", "why reserved exceeds allocated:", "at the peak",
            "at the end");
    fprintf(pout, "    %-44s %12s %14s\n", "reserved", human(num(g[0], "reserved_bytes"), b[0], 32),
            human(num(g[1], "reserved_bytes"), b[1], 32));
    fprintf(pout, "    %-44s %12s %14s\n", "allocated",
            human(num(g[0], "allocated_bytes"), b[0], 32),
            human(num(g[1], "allocated_bytes"), b[1], 32));
    fprintf(pout, "    %-44s %12s %14s\n", "reserved - allocated",
            human(num(g[0], "gap_bytes"), b[0], 32), human(num(g[1], "gap_bytes"), b[1], 32));
    for (size_t c = 0; c < sizeof what / sizeof what[0]; c++) {
        double v[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            size_t i;
            json_t *e;
            json_array_foreach(json_object_get(g[k], "causes"), i, e)
            {
                const char *name = json_string_value(json_object_get(e, "cause"));
                if (name && strcmp(name, what[c][0]) == 0)
                    v[k] = num(e, "bytes");
            }
        }
        if (v[0] == 0 && v[1] == 0)
            continue;
        fprintf(pout, "      %-42s %12s %14s\n", what[c][1], human(v[0], b[0], 32),
                human(v[1], b[1], 32));
    }
    if (num(g[0], "rounding_bytes") > 0 || num(g[1], "rounding_bytes") > 0)
        fprintf(pout, "    %-44s %12s %14s\n", "(inside allocated) rounding of requests",
                human(num(g[0], "rounding_bytes"), b[0], 32),
                human(num(g[1], "rounding_bytes"), b[1], 32));
    if (num(p, "replay_reserved_bytes") > 0) {
        fprintf(pout, "    %-44s %12s\n", "memtrace's allocator would reserve (peak)",
                human(num(p, "replay_reserved_bytes"), b[0], 32));
        /* (the requests replayed, rounded by memtrace's rules: what to read the reserve
         * against, since PyTorch's allocated above holds its own rounding) */
        fprintf(pout, "      %-42s %12s\n", "and allocate (peak), rounding its own way",
                human(num(p, "replay_allocated_bytes"), b[0], 32));
    }
    json_t *pins = json_object_get(g[0], "pins");
    if (json_array_size(pins) == 0)
        return;
    fprintf(pout,
            "    segments pinned at the peak, by the site of each one's largest live block:\n");
    size_t i;
    json_t *r;
    json_array_foreach(pins, i, r)
    {
        fprintf(pout, "      %10s free in %.0f segment%s  ", human(num(r, "bytes"), b[0], 32),
                num(r, "segments"), num(r, "segments") == 1 ? "" : "s");
        put_plain(json_string_value(json_object_get(r, "site")));
        fprintf(pout, "\n");
    }
}

/* A setting's value as the config string writes it: MiB for sizes, fractions, counts. */
static void setting_value(const char *key, double v, char *buf, size_t len)
{
    if (v >= 1.8e19)
        snprintf(buf, len, "unlimited");
    else if (strstr(key, "_mb") != NULL)
        snprintf(buf, len, "%.0f", v / 1048576.0);
    else if (strstr(key, "threshold") != NULL || strstr(key, "fraction") != NULL)
        snprintf(buf, len, "%g", v / 1e6);
    else
        snprintf(buf, len, "%.0f", v);
}

static void print_settings(json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return;
    fprintf(pout, "\n  settings changed at run time:\n");
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        const char *key = json_string_value(json_object_get(e, "key"));
        char was[32], now[32];
        setting_value(key ? key : "", num(e, "before"), was, sizeof was);
        setting_value(key ? key : "", num(e, "value"), now, sizeof now);
        esc_buf_t k;
        fprintf(pout, "    ");
        put_when(num(e, "t"));
        fprintf(pout, "  device %.0f  %s: %s -> %s\n", num(e, "device"), esc(key ? key : "?", k),
                was, now);
    }
}

static void print_scopes(json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return;
    fprintf(pout, "\n  scoped statistics (push/pop; peak above the scope's start):\n");
    fprintf(pout, "    %-18s %8s %12s %12s %10s\n", "scope", "count", "peak", "mean peak",
            "mean time");
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        char b1[32], b2[32];
        esc_buf_t k;
        const char *name = json_string_value(json_object_get(e, "name"));
        fprintf(pout, "    %-18s %8.0f %12s %12s ", esc(name ? name : "?", k), num(e, "count"),
                human(num(e, "peak_bytes"), b1, sizeof b1),
                human(num(e, "mean_peak_bytes"), b2, sizeof b2));
        if (untimed)
            fprintf(pout, "%6.0f events\n", num(e, "mean_seconds") * 1e9);
        else
            fprintf(pout, "%9.3fs\n", num(e, "mean_seconds"));
    }
}

static void print_managed(json_t *v)
{
    if (!json_is_object(v))
        return;
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(pout,
            "\n  managed memory: %s managed at peak, %s resident on the device at peak, %s "
            "migrated, %.0f faults\n",
            human(num(v, "managed_peak_bytes"), b1, sizeof(b1)),
            human(num(v, "device_peak_bytes"), b2, sizeof(b2)),
            human(num(v, "migrated_bytes"), b3, sizeof(b3)), num(v, "faults"));
    fprintf(pout, "    %.0f prefetches (%s), %.0f advice calls\n", num(v, "prefetches"),
            human(num(v, "prefetch_bytes"), b4, sizeof(b4)), num(v, "advises"));
}

/* One line of the device memory table: a label, the figure at the end, at the peak of used. */
static void dm_row(const char *label, int indent, double end, double at_peak)
{
    char b[2][32];
    fprintf(pout, "    %*s%-*s %12s %14s\n", indent, "", 40 - indent, label, human(end, b[0], 32),
            human(at_peak, b[1], 32));
}

/* The device's used bytes as the driver reports them, split into memtrace's reserved bytes
 * and what is outside its allocator (docs/outside.md); nothing for logs without figures. */
static void print_device_memory(json_t *devs)
{
    size_t i, k;
    json_t *d, *l;
    json_array_foreach(devs, i, d)
    {
        char b[3][32];
        json_t *e = json_object_get(d, "end"), *pk = json_object_get(d, "at_peak_used");
        fprintf(pout, "\n  device %.0f memory as the driver reports it: %s used of %s (peak %s)\n",
                num(d, "device"), human(num(e, "used"), b[0], 32), human(num(d, "total"), b[1], 32),
                human(num(d, "peak_used"), b[2], 32));
        fprintf(pout, "    %-40s %12s %14s\n", "", "at the end", "at peak used");
        dm_row("used", 0, num(e, "used"), num(pk, "used"));
        dm_row("memtrace reserved", 2, num(e, "reserved"), num(pk, "reserved"));
        dm_row("outside the allocator", 2, num(e, "outside"), num(pk, "outside"));
        json_array_foreach(json_object_get(d, "libraries"), k, l)
        {
            esc_buf_t el;
            const char *name = json_string_value(json_object_get(l, "library"));
            double peak = num(l, "peak");
            dm_row(esc(name, el), 4, num(l, "bytes"), num(l, "at_peak_used"));
            if (peak > num(l, "bytes") && peak > num(l, "at_peak_used"))
                fprintf(pout, "    %*s(its own peak %s)\n", 6, "", human(peak, b[0], 32));
        }
        dm_row("context", 4, num(e, "context"), num(pk, "context"));
        if (num(e, "other_processes") > 0 || num(pk, "other_processes") > 0)
            dm_row("other processes", 4, num(e, "other_processes"), num(pk, "other_processes"));
        dm_row("not seen", 4, num(e, "not_seen"), num(pk, "not_seen"));
        fprintf(pout,
                "    (context: in use when the allocator started, before its first segment; not "
                "seen:\n     no event names it: other allocators, other processes)\n");
    }
}

/* The first OOMs, each with the device's split at that moment when the log has it. */
static void print_ooms(json_t *o)
{
    if (!json_is_object(o))
        return;
    char b[6][32];
    fprintf(pout, "\n  out of memory: %.0f OOM%s\n", num(o, "count"),
            num(o, "count") == 1 ? "" : "s");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(o, "first"), i, e)
    {
        fprintf(pout, "    ");
        put_when(num(e, "t"));
        fprintf(pout, "  device %.0f: asked %s, %s free", num(e, "device"),
                human(num(e, "requested"), b[0], 32), human(num(e, "free"), b[1], 32));
        json_t *s = json_object_get(e, "device_memory");
        if (s != NULL) {
            fprintf(pout, "; used %s: memtrace reserved %s, outside %s (libraries %s, context %s, ",
                    human(num(s, "used"), b[0], 32), human(num(s, "reserved"), b[1], 32),
                    human(num(s, "outside"), b[2], 32), human(num(s, "libraries"), b[3], 32),
                    human(num(s, "context"), b[4], 32));
            if (num(s, "other_processes") > 0)
                fprintf(pout, "other processes %s, ", human(num(s, "other_processes"), b[0], 32));
            fprintf(pout, "not seen %s)", human(num(s, "not_seen"), b[5], 32));
        }
        fprintf(pout, "\n");
    }
    if (num(o, "count") > (double)json_array_size(json_object_get(o, "first")))
        fprintf(pout, "    ... %.0f more\n",
                num(o, "count") - (double)json_array_size(json_object_get(o, "first")));
}

static void print_process(json_t *p)
{
    char b1[32], b2[32], b3[32], b4[32];
    untimed = json_object_get(p, "clock") != NULL;
    const char *name = json_string_value(json_object_get(p, "name"));
    esc_buf_t en, ex, ej;
    fprintf(pout, "process %d%s%s%s", (int)json_integer_value(json_object_get(p, "pid")),
            name && *name ? " \"" : "", name && *name ? esc(name, en) : "",
            name && *name ? "\"" : "");
    if (json_object_get(p, "rank")) {
        const char *job = json_string_value(json_object_get(p, "job"));
        fprintf(pout, " (rank %.0f%s%s)", num(p, "rank"), job ? " of job " : "",
                job ? esc(job, ej) : "");
    }
    fprintf(pout, ": %.0f events, %.0f lost, exit %s\n", num(p, "events"), num(p, "lost"),
            esc(json_string_value(json_object_get(p, "exit")), ex));
    if (num(p, "skipped_entries") > 0)
        fprintf(pout, "  %.0f trace entries of actions memtrace does not model were skipped\n",
                num(p, "skipped_entries"));
    double peak = num(p, "peak_allocated");
    fprintf(pout,
            "  device memory: peak allocated %s, peak reserved %s; at the end %s allocated, %s "
            "reserved\n",
            human(peak, b1, sizeof(b1)), human(num(p, "peak_reserved"), b2, sizeof(b2)),
            human(num(p, "final_allocated"), b3, sizeof(b3)),
            human(num(p, "final_reserved"), b4, sizeof(b4)));

    /* Several devices: each one's figures, the line above being their sum. */
    json_t *devs = json_object_get(p, "devices");
    if (json_array_size(devs) > 1) {
        fprintf(pout,
                "  by device (the process's figures at the end are the sums; each peak is the "
                "device's own):\n");
        size_t i;
        json_t *d;
        json_array_foreach(devs, i, d)
        {
            fprintf(pout,
                    "    device %-3.0f peak allocated %s, peak reserved %s; at the end %s "
                    "allocated, %s reserved\n",
                    num(d, "device"), human(num(d, "peak_allocated"), b1, sizeof(b1)),
                    human(num(d, "peak_reserved"), b2, sizeof(b2)),
                    human(num(d, "final_allocated"), b3, sizeof(b3)),
                    human(num(d, "final_reserved"), b4, sizeof(b4)));
        }
    }

    json_t *tags = json_object_get(p, "peak_by_tag");
    if (json_object_size(tags)) {
        fprintf(pout, "\n  peak by tag:\n");
        double top = 0;
        const char *k;
        json_t *v;
        json_object_foreach(tags, k, v) top = num(tags, k) > top ? num(tags, k) : top;
        json_object_foreach(tags, k, v)
        {
            esc_buf_t e;
            fprintf(pout, "    %-14s %12s  ", esc(k, e),
                    human(json_number_value(v), b1, sizeof(b1)));
            bar(top > 0 ? json_number_value(v) / top : 0, 30);
            fprintf(pout, "\n");
        }
    }

    /* A snapshot is a moment of a run, not its end: what is live then was not leaked. A
     * state-only one holds that moment alone: no timeline or growth to read. */
    bool snapshot = json_object_get(p, "source") != NULL;
    bool state = json_is_true(json_object_get(p, "state_only"));
    if (state)
        fprintf(pout, "\n  a state snapshot (no allocation history): the figures are the moment it "
                      "was taken;\n  no timeline, lifetimes or growth\n");
    json_t *tl = json_object_get(p, "timeline");
    if (json_array_size(tl) && !state) {
        fprintf(pout, "\n  timeline%s:\n    %9s %12s %12s %12s %6s %6s\n",
                untimed ? " (the input has no clock: by event; no lifetimes, so no temporary "
                          "allocations)"
                        : "",
                untimed ? "event" : "t (s)", "allocated", "peak", "reserved", "util", "frag");
        size_t i;
        json_t *s;
        json_array_foreach(tl, i, s)
        {
            fprintf(pout,
                    untimed ? "    %9.0f %12s %12s %12s %5.1f%% %5.1f%%\n"
                            : "    %9.3f %12s %12s %12s %5.1f%% %5.1f%%\n",
                    num(s, "t_s") * (untimed ? 1e9 : 1), human(num(s, "allocated"), b1, sizeof(b1)),
                    human(num(s, "peak_allocated"), b2, sizeof(b2)),
                    human(num(s, "reserved"), b3, sizeof(b3)), 100 * num(s, "utilization"),
                    100 * num(s, "fragmentation"));
        }
    }

    json_t *nf = json_object_get(p, "never_freed");
    fprintf(pout, "\n  %s: %.0f allocations, %s",
            snapshot ? "live when the snapshot was taken" : "never freed", num(nf, "count"),
            human(num(nf, "bytes"), b1, sizeof(b1)));
    if (num(p, "unmatched_frees") > 0)
        fprintf(pout, " (%.0f frees of blocks allocated before the log began)",
                num(p, "unmatched_frees"));
    fprintf(pout, "\n");
    /* Blocks from before a gap whose free may be among the lost events: not counted above. */
    if (num(nf, "uncertain_count") > 0)
        fprintf(pout,
                "  uncertain (events lost): %.0f allocations, %s, whose free may have been lost\n",
                num(nf, "uncertain_count"), human(num(nf, "uncertain_bytes"), b1, sizeof(b1)));
    json_t *groups = json_object_get(nf, "groups");
    if (json_array_size(groups)) {
        fprintf(pout, "    %-14s %12s %8s %12s\n", "tag", "size", "count", "bytes");
        size_t i;
        json_t *g;
        json_array_foreach(groups, i, g)
        {
            esc_buf_t e;
            fprintf(pout, "    %-14s %12s %8.0f %12s\n",
                    esc(json_string_value(json_object_get(g, "tag")), e),
                    human(num(g, "size"), b1, sizeof(b1)), num(g, "count"),
                    human(num(g, "bytes"), b2, sizeof(b2)));
        }
        if (num(nf, "groups_total") > (double)json_array_size(groups))
            fprintf(pout, "    ... %.0f more groups\n",
                    num(nf, "groups_total") - (double)json_array_size(groups));
    }

    print_device_memory(json_object_get(p, "device_memory"));
    print_ooms(json_object_get(p, "ooms"));
    print_gap(p);
    print_settings(json_object_get(p, "settings_changes"));
    print_managed(json_object_get(p, "managed"));
    print_scopes(json_object_get(p, "scopes"));
    if (!state)
        print_growth(json_object_get(p, "growth"));
    print_host(json_object_get(p, "host"));
    print_callsites(json_object_get(p, "callsites"), json_is_true(json_object_get(p, "tagged")));
    print_temporary(p);
}

/* ---- the report as text ---- */

void mt__report_print_head(json_t *res, size_t nprocs, const mt__report_print_opts_t *o,
                           char *const *logs, int nlogs, unsigned long bad)
{
    popt = *o;
    pout = stdout;
    fprintf(pout, "memtrace report: ");
    for (int i = 0; i < nlogs; i++)
        fprintf(pout, "%s%s", logs[i], i + 1 < nlogs ? ", " : ": ");
    /* (a snapshot is fed as one line of its own, its process's hello: not a line read) */
    size_t nsnap = json_array_size(json_object_get(res, "snapshots"));
    double lines = num(res, "lines") - (double)nsnap;
    if (nsnap == 0 || lines > 0)
        fprintf(pout, "%.0f lines, ", lines);
    if (nsnap > 0)
        fprintf(pout, "%zu snapshot%s, ", nsnap, nsnap == 1 ? "" : "s");
    fprintf(pout, "%.0f events, %zu process%s", num(res, "events"), nprocs,
            nprocs == 1 ? "" : "es");
    if (num(res, "duplicates") > 0)
        fprintf(pout, ", %.0f events found in two logs counted once", num(res, "duplicates"));
    if (bad)
        fprintf(pout, ", %lu malformed lines skipped", bad);
    if (num(res, "lost_unattributed") > 0)
        fprintf(pout, ", %.0f events lost by a consumer queue", num(res, "lost_unattributed"));
    fprintf(pout, "\n");
    mt__report_print_jobs(json_object_get(res, "jobs"));
}

void mt__report_print_process(FILE *out, json_t *p, const mt__report_print_opts_t *o)
{
    popt = *o;
    pout = out;
    fprintf(pout, "\n");
    print_process(p);
}

void mt__report_print_text(json_t *res, const mt__report_print_opts_t *o, char *const *logs,
                           int nlogs, unsigned long bad)
{
    json_t *procs = json_object_get(res, "processes");
    mt__report_print_head(res, json_array_size(procs), o, logs, nlogs, bad);
    size_t i;
    json_t *p;
    json_array_foreach(procs, i, p)
    {
        mt__report_print_process(stdout, p, o);
    }
}
