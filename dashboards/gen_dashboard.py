#!/usr/bin/env python3
"""Writes dashboards/memtrace.json, the Grafana dashboard over memtraced's /metrics.

Run it after changing the panels below: python3 dashboards/gen_dashboard.py
(with a path argument it writes there instead: tests/grafana compares the two).
Every expression names only families that /metrics serves (checked by tests/fleet), and the
file is checked against Grafana's own dashboard schema (tests/grafana).
"""
import json
import os
import sys

SEL = 'instance=~"$instance",pid=~"$pid"'
NAME = ' * on(instance, pid) group_left(name) memtrace_process_info'
PROC_LEGEND = '{{instance}} {{name}} ({{pid}})'


def panel(pid, title, exprs, x, y, w=12, h=8, unit="bytes", stack=False, kind="timeseries"):
    targets = [{"refId": chr(65 + i), "expr": e, "legendFormat": l,
                "datasource": {"type": "prometheus", "uid": "${datasource}"}}
               for i, (e, l) in enumerate(exprs)]
    # Fields that Grafana's schema for the plugin marks required are written out, though
    # Grafana fills them in on load: tests/grafana checks this file against that schema.
    legend = {"showLegend": True, "displayMode": "table", "placement": "right",
              "calcs": ["lastNotNull", "max"]}
    defaults = {"unit": unit}
    if kind == "timeseries":
        custom = {"fillOpacity": 30 if stack else 0, "lineWidth": 1, "showPoints": "never"}
        if stack:
            custom["stacking"] = {"mode": "normal", "group": "A"}
        defaults["custom"] = custom
        options = {"legend": legend, "tooltip": {"mode": "multi", "sort": "none"}}
    elif kind == "bargauge":
        # A bar per series showing its last value, named on the bar (no legend); the
        # rest are Grafana's defaults. The bar gauge has no custom field config.
        options = {"legend": {"showLegend": False, "displayMode": "list", "placement": "bottom",
                              "calcs": []},
                   "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "orientation": "auto", "displayMode": "gradient",
                   "valueMode": "color", "namePlacement": "auto", "showUnfilled": True,
                   "sizing": "auto", "minVizWidth": 8, "minVizHeight": 16, "maxVizHeight": 300}
    else:
        raise ValueError("panel type %r: add its options here and its type to "
                         "tests/grafana/dashboard.ts" % kind)
    return {"id": pid, "type": kind, "title": title, "gridPos": {"x": x, "y": y, "w": w, "h": h},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options,
            "targets": targets}


def row(pid, title, y):
    return {"id": pid, "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


# No "definition" (the query as text, which Grafana's editor writes but its schema does not
# define): Grafana runs "query" and shows it when "definition" is absent.
def var(name, query, label, multi=True):
    return {"name": name, "label": label, "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name},
            "refresh": 2, "multi": multi, "includeAll": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}, "sort": 1}


panels = []
n = iter(range(1, 100))
y = 0
panels.append(row(next(n), "Fleet (one memtraced per node)", y)); y += 1
panels += [
    panel(next(n), "Device allocated by node", [('sum by (instance) (memtrace_allocated_bytes{instance=~"$instance"})', "{{instance}}")], 0, y),
    panel(next(n), "Device reserved by node", [('sum by (instance) (memtrace_reserved_bytes{instance=~"$instance"})', "{{instance}}")], 12, y),
]
y += 8
panels += [
    panel(next(n), "Running processes by node", [('memtrace_processes{instance=~"$instance",state="running"}', "{{instance}}")], 0, y, 8, 6, unit="short"),
    panel(next(n), "OOMs (last 5 min) by node", [('sum by (instance) (increase(memtrace_ooms_total{instance=~"$instance"}[5m]))', "{{instance}}")], 8, y, 8, 6, unit="short"),
    panel(next(n), "Events/s by node", [('rate(memtrace_daemon_events_total{instance=~"$instance"}[1m])', "{{instance}}"),
                                        ('sum by (instance) (rate(memtrace_events_dropped_total{instance=~"$instance"}[1m]))', "{{instance}} dropped")], 16, y, 8, 6, unit="ops"),
]
y += 6
panels.append(row(next(n), "Processes", y)); y += 1
panels += [
    panel(next(n), "Allocated (device) per process", [("memtrace_allocated_bytes{%s}%s" % (SEL, NAME), PROC_LEGEND)], 0, y),
    panel(next(n), "Reserved (device) per process", [("memtrace_reserved_bytes{%s}%s" % (SEL, NAME), PROC_LEGEND)], 12, y),
]
y += 8
panels += [
    panel(next(n), "Utilization (allocated / reserved)", [("memtrace_utilization_ratio{%s}%s" % (SEL, NAME), PROC_LEGEND)], 0, y, 8, 8, unit="percentunit"),
    panel(next(n), "Fragmentation (1 - largest free / free)", [("memtrace_fragmentation_ratio{%s}%s" % (SEL, NAME), PROC_LEGEND)], 8, y, 8, 8, unit="percentunit"),
    panel(next(n), "Peaks", [("memtrace_peak_allocated_bytes{%s}%s" % (SEL, NAME), "allocated " + PROC_LEGEND),
                              ("memtrace_peak_reserved_bytes{%s}%s" % (SEL, NAME), "reserved " + PROC_LEGEND)], 16, y, 8, 8),
]
y += 8
panels += [
    panel(next(n), "Pinned host memory per process", [("memtrace_host_allocated_bytes{%s}%s" % (SEL, NAME), "allocated " + PROC_LEGEND),
                                                       ("memtrace_host_reserved_bytes{%s}%s" % (SEL, NAME), "reserved " + PROC_LEGEND)], 0, y),
    panel(next(n), "Free cache and largest free block", [("memtrace_free_bytes{%s}%s" % (SEL, NAME), "free " + PROC_LEGEND),
                                                          ("memtrace_largest_free_block_bytes{%s}%s" % (SEL, NAME), "largest " + PROC_LEGEND)], 12, y),
]
y += 8
panels.append(row(next(n), "Tags", y)); y += 1
panels += [
    panel(next(n), "Device bytes by tag (stacked)", [('sum by (tag) (memtrace_tag_allocated_bytes{%s,tag=~"$tag"})' % SEL, "{{tag}}")], 0, y, stack=True),
    panel(next(n), "Peak by tag, per process", [('memtrace_tag_peak_bytes{%s,tag=~"$tag"}%s' % (SEL, NAME), "{{tag}} " + PROC_LEGEND)], 12, y),
]
y += 8
panels.append(row(next(n), "Devices and pools", y)); y += 1
panels += [
    panel(next(n), "Allocated by device", [('sum by (instance, device) (memtrace_device_allocated_bytes{%s,device=~"$device"})' % SEL, "{{instance}} device {{device}}")], 0, y, 8),
    panel(next(n), "Reserved by device", [('sum by (instance, device) (memtrace_device_reserved_bytes{%s,device=~"$device"})' % SEL, "{{instance}} device {{device}}")], 8, y, 8),
    panel(next(n), "Live blocks by pool", [('sum by (pool) (memtrace_pool_allocated_bytes{%s})' % SEL, "{{pool}}")], 16, y, 8, stack=True),
]
y += 8
# Outside the allocator (docs/outside.md): the parts of each device's used bytes, as the
# daemon's model splits them, per process (a device's used bytes count every process on it:
# a sum over processes would count them twice). Stacked on the allocator's reserved bytes,
# one process's parts make its device's used bytes, the line of the next panel.
panels += [
    panel(next(n), "Outside the allocator by library (stacked on reserved: one pid adds up to used)",
          [('memtrace_device_outside_allocator_bytes{%s,device=~"$device"}%s' % (SEL, NAME), "{{library}} device {{device}} " + PROC_LEGEND),
           ('memtrace_device_reserved_bytes{%s,device=~"$device"}%s' % (SEL, NAME), "reserved device {{device}} " + PROC_LEGEND)], 0, y, 12, 8, stack=True),
    panel(next(n), "Device used (as the driver reports it) and total",
          [('memtrace_device_used_bytes{%s,device=~"$device"}%s' % (SEL, NAME), "used device {{device}} " + PROC_LEGEND),
           ('memtrace_device_total_bytes{%s,device=~"$device"}%s' % (SEL, NAME), "total device {{device}} " + PROC_LEGEND)], 12, y, 12, 8),
]

y += 8
panels.append(row(next(n), "Job (ranks of one training job; needs memtrace-rules.yml)", y)); y += 1
JOB = 'job_id=~"$job_id"'
panels += [
    panel(next(n), "Peak allocated per rank", [('job_id_rank:memtrace_peak_allocated_bytes:max{%s,rank=~"$rank"}' % JOB, "{{job_id}} rank {{rank}}")], 0, y, 12, 8, kind="bargauge"),
    panel(next(n), "Job: highest and median rank", [('job_id:memtrace_peak_allocated_bytes:max{%s}' % JOB, "{{job_id}} highest"),
                                                    ('job_id:memtrace_peak_allocated_bytes:median{%s}' % JOB, "{{job_id}} median")], 12, y, 12, 8),
]
y += 8
panels += [
    panel(next(n), "Ranks furthest above the median", [('topk(5, job_id_rank:memtrace_peak_allocated_bytes:max{%s} - on(job_id) group_left job_id:memtrace_peak_allocated_bytes:median)' % JOB, "{{job_id}} rank {{rank}}")], 0, y, 12, 8),
    panel(next(n), "Allocated now per rank", [('job_id_rank:memtrace_allocated_bytes:sum{%s,rank=~"$rank"}' % JOB, "{{job_id}} rank {{rank}}")], 12, y, 12, 8),
]

dashboard = {
    "title": "memtrace",
    "uid": "memtrace",
    "description": "Device and pinned host memory of every instrumented process, from memtraced's /metrics (one daemon per node).",
    "tags": ["memtrace", "gpu", "memory"],
    "timezone": "browser",
    "schemaVersion": 38,
    "version": 1,
    "editable": True,
    "refresh": "10s",
    "time": {"from": "now-1h", "to": "now"},
    # The datasource variable has no "current": the schema's option needs a text and a
    # value, and Grafana picks the default Prometheus data source when there is none.
    "templating": {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "hide": 0},
        var("instance", "label_values(memtrace_processes, instance)", "node"),
        var("name", 'label_values(memtrace_process_info{instance=~"$instance"}, name)', "process"),
        var("pid", 'label_values(memtrace_process_info{instance=~"$instance",name=~"$name"}, pid)', "pid"),
        var("tag", 'label_values(memtrace_tag_allocated_bytes{instance=~"$instance"}, tag)', "tag"),
        var("job_id", 'label_values(memtrace_process_info, job_id)', "job"),
        var("rank", 'label_values(memtrace_process_info{job_id=~"$job_id"}, rank)', "rank"),
        var("device", 'label_values(memtrace_device_allocated_bytes{instance=~"$instance"}, device)', "device"),
    ]},
    "panels": panels,
}

out = (sys.argv[1] if len(sys.argv) > 1 else
       os.path.join(os.path.dirname(os.path.abspath(__file__)), "memtrace.json"))
with open(out, "w") as f:
    json.dump(dashboard, f, indent=2)
    f.write("\n")
