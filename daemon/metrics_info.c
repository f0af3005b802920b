/* memtraced: the /metrics families a dashboard joins on (dashboards/memtrace.json):
 *   memtrace_process_info{pid,name,state,backend} 1   the process's name, for
 *       `... * on(pid) group_left(name) memtrace_process_info`
 *   memtrace_device_allocated_bytes{pid,device}, memtrace_device_reserved_bytes{pid,device}
 *   memtrace_pool_allocated_bytes{pid,pool}           live block bytes by pool
 *   memtrace_device_used_bytes, _total_bytes and _outside_allocator_bytes{library}: outside.c
 * Cardinality stays bounded: one series per live or kept-exited process (cfg.max_exited),
 * per device the process holds memory on (device 0 always; <= 256), per pool (3). A pid registered
 * twice is reported by its newest registration, as in metrics.c. */
#include <inttypes.h>
#include <string.h>

#include "analysis/model.h"
#include "daemon/internal.h"

static int head(mt_d_buf_t *o, const char *name, const char *help)
{
    return mt__d_buf_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

int mt__d_metrics_info(mt_d_t *d, mt_d_buf_t *o)
{
    head(o, "memtrace_process_info",
         "Always 1: the process's name, state and backend as labels, to join on pid.");
    for (const mt_d_proc_t *p = d->procs; p && !o->err; p = p->next) {
        if (!mt__d_proc_newest(p))
            continue;
        mt__d_buf_append(o, "memtrace_process_info{", 22);
        mt__d_proc_labels(o, p);
        mt__d_buf_append(o, ",name=\"", 7);
        mt__d_label_value(o, p->name);
        mt__d_buf_printf(o, "\",state=\"%s\",backend=\"", p->exited ? "exited" : "running");
        mt__d_label_value(o, p->backend);
        mt__d_buf_append(o, "\"} 1\n", 5);
    }
    /* Per device, as the model has them; a process's memtrace_allocated_bytes and
     * memtrace_reserved_bytes are the sums of these over its devices. */
    static const char *const dev_fam[4][2] = {
        {"memtrace_device_allocated_bytes", "Device bytes handed out, by process and device."},
        {"memtrace_device_reserved_bytes",
         "Device bytes held from the device, by process and device."},
        {"memtrace_device_peak_allocated_bytes",
         "Highest device bytes handed out on this device, by process and device."},
        {"memtrace_device_peak_reserved_bytes",
         "Highest device bytes held on this device, by process and device."},
    };
    for (int f = 0; f < 4 && !o->err; f++) {
        head(o, dev_fam[f][0], dev_fam[f][1]);
        for (const mt_d_proc_t *p = d->procs; p && !o->err; p = p->next) {
            if (!mt__d_proc_newest(p))
                continue;
            mt_model_dev_t dv[256];
            size_t n = mt__model_devices(p->model, dv, 256);
            for (size_t i = 0; i < n && i < 256 && !o->err; i++) {
                uint64_t v = f == 0   ? dv[i].allocated
                             : f == 1 ? dv[i].reserved
                             : f == 2 ? dv[i].peak_allocated
                                      : dv[i].peak_reserved;
                mt__d_buf_printf(o, "%s{", dev_fam[f][0]);
                mt__d_proc_labels(o, p);
                mt__d_buf_printf(o, ",device=\"%u\"} %" PRIu64 "\n", dv[i].device, v);
            }
        }
    }
    mt__d_metrics_outside(d, o); /* used, total and the split: outside.c */
    head(o, "memtrace_pool_allocated_bytes",
         "Bytes of live blocks, by process and pool (small, large, host).");
    static const int pools[] = {MT_POOL_SMALL, MT_POOL_LARGE, MT_POOL_HOST};
    for (const mt_d_proc_t *p = d->procs; p && !o->err; p = p->next) {
        if (!mt__d_proc_newest(p))
            continue;
        for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
            mt__d_buf_append(o, "memtrace_pool_allocated_bytes{", 30);
            mt__d_proc_labels(o, p);
            mt__d_buf_printf(o, ",pool=\"%s\"} %" PRIu64 "\n", mt_pool_name(pools[i]),
                             mt__model_pool_bytes(p->model, pools[i]));
        }
    }
    return o->err;
}
