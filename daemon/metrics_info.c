/* memtraced: the /metrics families a dashboard joins on (dashboards/memtrace.json):
 *   memtrace_process_info{pid,name,state,backend} 1   the process's name, for
 *       `... * on(pid) group_left(name) memtrace_process_info`
 *   memtrace_device_allocated_bytes{pid,device}, memtrace_device_reserved_bytes{pid,device}
 *   memtrace_pool_allocated_bytes{pid,pool}           live block bytes by pool
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
    int rc = head(o, "memtrace_process_info",
                  "Always 1: the process's name, state and backend as labels, to join on pid.");
    for (const mt_d_proc_t *p = d->procs; p && !rc; p = p->next) {
        if (!mt__d_proc_newest(p))
            continue;
        rc |= mt__d_buf_printf(o, "memtrace_process_info{pid=\"%d\",name=\"", p->pid);
        rc |= mt__d_label_value(o, p->name);
        rc |= mt__d_buf_printf(o, "\",state=\"%s\",backend=\"", p->exited ? "exited" : "running");
        rc |= mt__d_label_value(o, p->backend);
        rc |= mt__d_buf_append(o, "\"} 1\n", 5);
    }
    static const char *const dev_fam[2][2] = {
        {"memtrace_device_allocated_bytes", "Device bytes handed out, by process and device."},
        {"memtrace_device_reserved_bytes",
         "Device bytes held from the device, by process and device."},
    };
    for (int f = 0; f < 2 && !rc; f++) {
        rc |= head(o, dev_fam[f][0], dev_fam[f][1]);
        for (const mt_d_proc_t *p = d->procs; p && !rc; p = p->next) {
            if (!mt__d_proc_newest(p))
                continue;
            for (unsigned dev = 0; dev < 256 && !rc; dev++) {
                uint64_t a, r;
                mt_model_device(p->model, dev, false, &a, &r);
                if (dev > 0 && a == 0 && r == 0)
                    continue; /* a device the process holds nothing on */
                rc |= mt__d_buf_printf(o, "%s{pid=\"%d\",device=\"%u\"} %" PRIu64 "\n",
                                       dev_fam[f][0], p->pid, dev, f == 0 ? a : r);
            }
        }
    }
    rc |= head(o, "memtrace_pool_allocated_bytes",
               "Bytes of live blocks, by process and pool (small, large, host).");
    static const int pools[] = {MT_POOL_SMALL, MT_POOL_LARGE, MT_POOL_HOST};
    for (const mt_d_proc_t *p = d->procs; p && !rc; p = p->next) {
        if (!mt__d_proc_newest(p))
            continue;
        for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++)
            rc |= mt__d_buf_printf(
                o, "memtrace_pool_allocated_bytes{pid=\"%d\",pool=\"%s\"} %" PRIu64 "\n", p->pid,
                mt_pool_name(pools[i]), mt_model_pool_bytes(p->model, pools[i]));
    }
    return rc;
}
