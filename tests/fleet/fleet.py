#!/usr/bin/env python3
"""A fleet through Prometheus: 3 memtraced daemons (each its own port, socket and
producers, standing in for 3 nodes, all on 127.0.0.1) scraped by a real Prometheus server
(one by a file_sd target file, two by static_configs). Checks that
  sum by (instance) (memtrace_allocated_bytes)   equals each daemon's /state,
  the process_info join gives each process its name,
  every family the Grafana dashboard (dashboards/memtrace.json) uses is scraped,
  each process's outside-the-allocator parts and reserved bytes make its device's used bytes,
  the example alert rules pass `promtool check rules`, the config `promtool check config`.

usage: fleet.py MEMTRACED WEB_PRODUCER SOURCE_ROOT
Exit 0 pass, 1 fail (the check is named), 77 skipped (no prometheus: apt-get install prometheus).
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

memtraced, producer, src = sys.argv[1:4]
procs = []
producers = []
BIG_RANK = 3
CONTEXT_MB, OUTSIDE_MB = 64, 24


def stop_all():
    """Producers first: a producer whose daemon goes away first takes over and writes a
    local log in the working directory."""
    for group in (producers, procs):
        for p in group:
            if p.poll() is None:
                p.terminate()
        for p in group:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    stop_all()
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


tokens = {}  # port -> the daemon's HTTP token, where it requires one (SOCKET.token)


def get(url):
    req = urllib.request.Request(url)
    tok = tokens.get(urllib.parse.urlparse(url).port)
    if tok:
        req.add_header("Authorization", "Bearer " + tok)
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def wait_for(what, fn, seconds=20):
    end = time.time() + seconds
    last = None
    while time.time() < end:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # the server may not answer yet
            last = repr(e)
        time.sleep(0.2)
    fail("%s (last: %s)" % (what, last))


for tool in ("prometheus", "promtool"):
    if not shutil.which(tool):
        print("SKIP: no %s (Debian package prometheus; ./dev.sh installs it)" % tool)
        sys.exit(77)

tmp = tempfile.mkdtemp(prefix="mt-fleet-")
try:
    rules = os.path.join(src, "dashboards", "memtrace-alerts.yml")
    rec_rules = os.path.join(src, "dashboards", "memtrace-rules.yml")
    out = subprocess.run(["promtool", "check", "rules", rules, rec_rules], capture_output=True,
                         text=True)
    if out.returncode != 0:
        fail("promtool check rules: " + out.stdout + out.stderr)
    # The rules' own unit tests: the job aggregates and the one-rank alert on made-up series.
    out = subprocess.run(["promtool", "test", "rules",
                          os.path.join(src, "dashboards", "memtrace-rules.test.yml")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail("promtool test rules: " + out.stdout + out.stderr)
    print("ok: promtool test rules (job aggregates, the rank-above-the-others alert)")

    # Prometheus scrapes /metrics without the daemon's token where the daemon has one.
    helptext = subprocess.run([memtraced, "--help"], capture_output=True, text=True).stdout
    metrics_open = ["--metrics-open"] if "--metrics-open" in helptext else []

    # Three nodes: a daemon each, 2, 2 and 1 producers (churn 1 s, then hold their blocks),
    # launched as ranks 0-4 of one job (RANK, WORLD_SIZE, MEMTRACE_JOB as torchrun sets them);
    # rank 3 holds 192 MiB more than the others.
    nodes = []
    rank = 0
    for i, nprod in enumerate((2, 2, 1)):
        port = free_port()
        sock = os.path.join(tmp, "node%d.sock" % i)
        d = subprocess.Popen([memtraced, "--foreground", "--quiet", "--socket", sock,
                              "--port", str(port)] + metrics_open)
        procs.append(d)
        wait_for("daemon %d's socket" % i, lambda: os.path.exists(sock))
        if os.path.exists(sock + ".token"):
            with open(sock + ".token") as f:
                tokens[port] = f.read().strip()
        wait_for("daemon %d to answer" % i, lambda: get("http://127.0.0.1:%d/healthz" % port) == "ok\n")
        for _ in range(nprod):
            # Each with a modelled context and a library's memory outside the allocator.
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="5", MEMTRACE_JOB="ddp-7",
                       MEMTRACE_SIM_CONTEXT="%dM" % CONTEXT_MB,
                       WEB_PRODUCER_OUTSIDE_MB=str(OUTSIDE_MB))
            if rank == BIG_RANK:
                env["WEB_PRODUCER_EXTRA_MB"] = "192"
            producers.append(subprocess.Popen([producer, sock, "1", "2000", "60"], env=env))
            rank += 1
        nodes.append({"port": port, "target": "127.0.0.1:%d" % port, "producers": nprod})

    # Scrape config: two static targets, one through file_sd (as docs/fleet.md shows).
    sd = os.path.join(tmp, "memtrace-targets.json")
    with open(sd, "w") as f:
        json.dump([{"targets": [nodes[2]["target"]], "labels": {"rack": "r2"}}], f)
    pport = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
  - %s
scrape_configs:
  - job_name: memtrace
    static_configs:
      - targets: ['%s', '%s']
    file_sd_configs:
      - files: ['%s']
        refresh_interval: 5s
""" % (rules, rec_rules, nodes[0]["target"], nodes[1]["target"], sd))
    out = subprocess.run(["promtool", "check", "config", cfg], capture_output=True, text=True)
    if out.returncode != 0:
        fail("promtool check config: " + out.stdout + out.stderr)
    prom = subprocess.Popen(["prometheus", "--config.file=" + cfg,
                             "--storage.tsdb.path=" + os.path.join(tmp, "data"),
                             "--web.listen-address=127.0.0.1:%d" % pport, "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(prom)
    api = "http://127.0.0.1:%d/api/v1/" % pport

    def query(q):
        r = json.loads(get(api + "query?" + urllib.parse.urlencode({"query": q})))
        if r.get("status") != "success":
            raise RuntimeError(str(r))
        return r["data"]["result"]

    # Wait for the producers to hold still, and for a scrape after that.
    time.sleep(2.5)

    def state_sum(node):
        st = json.loads(get("http://127.0.0.1:%d/state" % node["port"]))
        running = [p for p in st["processes"] if p["state"] == "running"]
        return len(running), sum(p["allocated_bytes"] for p in running)

    def matches():
        res = {r["metric"]["instance"]: float(r["value"][1])
               for r in query("sum by (instance) (memtrace_allocated_bytes)")}
        seen = []
        for node in nodes:
            n, want = state_sum(node)
            if n != node["producers"] or want == 0 or res.get(node["target"]) != want:
                return None
            seen.append((node["target"], want))
        return seen

    seen = wait_for("Prometheus's sum by (instance) to equal each daemon's /state", matches, 30)
    for target, v in seen:
        print("ok: %s allocated %d in Prometheus = /state" % (target, v))

    joined = query("memtrace_allocated_bytes * on(instance, pid) group_left(name) memtrace_process_info")
    if len(joined) != sum(n["producers"] for n in nodes) or any(r["metric"].get("name") != "web_producer" for r in joined):
        fail("process_info join: %s" % joined)
    rack = query('up{job="memtrace",rack="r2"}')
    if len(rack) != 1 or rack[0]["metric"]["instance"] != nodes[2]["target"]:
        fail("file_sd target not scraped with its labels: %s" % rack)
    print("ok: %d processes named through memtrace_process_info; file_sd target scraped" % len(joined))

    # Outside the allocator: for every process, its parts and its reserved bytes make the
    # device's used bytes; the library and the context have the bytes the producer took.
    def outside():
        key = "instance, pid, device"
        gap = query("sum by (%s) (memtrace_device_outside_allocator_bytes) + sum by (%s) "
                    "(memtrace_device_reserved_bytes) - sum by (%s) (memtrace_device_used_bytes)"
                    % (key, key, key))
        lib = query('memtrace_device_outside_allocator_bytes{library="libfakenccl.so"} == %d'
                    % (OUTSIDE_MB << 20))
        ctx = query('memtrace_device_outside_allocator_bytes{library="context"} == %d'
                    % (CONTEXT_MB << 20))
        n = sum(x["producers"] for x in nodes)
        if len(gap) != n or any(float(r["value"][1]) != 0 for r in gap) or len(lib) != n or len(ctx) != n:
            return None
        return gap
    wait_for("each process's outside parts + reserved = used, with the library and the context",
             outside, 20)
    print("ok: outside the allocator: parts + reserved = used for every process; "
          "libfakenccl.so %d MiB, context %d MiB" % (OUTSIDE_MB, CONTEXT_MB))

    # The job, rank by rank, across the three daemons: one series per rank, without pid or
    # instance, and the rank that holds more named by the recording rules and the alert.
    def by_rank():
        res = query('max by (job_id, rank) (memtrace_peak_allocated_bytes{job_id="ddp-7"})')
        return res if len(res) == 5 else None
    ranks = wait_for("a per-job query by rank over the 3 daemons", by_rank, 20)
    peaks = {int(r["metric"]["rank"]): float(r["value"][1]) for r in ranks}
    top = max(peaks, key=peaks.get)
    if sorted(peaks) != [0, 1, 2, 3, 4] or top != BIG_RANK:
        fail("per-rank peaks %s: want ranks 0-4, rank %d highest" % (peaks, BIG_RANK))
    print("ok: job ddp-7 by rank: %s" % {k: int(v) for k, v in sorted(peaks.items())})

    def recorded():
        res = query('job_id_rank:memtrace_peak_allocated_bytes:max{job_id="ddp-7"}')
        if len(res) != 5 or any(set(r["metric"]) - {"__name__", "job_id", "rank"} for r in res):
            return None
        return res
    wait_for("the recording rule's per-rank series (labels job_id and rank only)", recorded, 20)

    def alert():
        res = query('ALERTS{alertname="MemtraceRankPeakAboveOthers",job_id="ddp-7"}')
        return res if res else None
    fired = wait_for("the MemtraceRankPeakAboveOthers alert for ddp-7", alert, 20)
    if {r["metric"].get("rank") for r in fired} != {str(BIG_RANK)}:
        fail("the alert names %s, not rank %d" % ([r["metric"] for r in fired], BIG_RANK))
    print("ok: recording rules keep job_id and rank only; the alert names rank %d" % BIG_RANK)

    # Every family the dashboard uses is scraped.
    with open(os.path.join(src, "dashboards", "memtrace.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    families = set(re.findall(r"\bmemtrace_[a-z_]+", " ".join(exprs)))
    names = set(json.loads(get(api + "label/__name__/values"))["data"])
    missing = sorted(families - names)
    if missing:
        fail("the dashboard uses families Prometheus never scraped: %s" % missing)
    nonempty, empty = 0, []
    for e in exprs:
        m = re.match(r"label_values\((.*), *[a-z_]+\)$", e)
        q = re.sub(r"\$[a-z_]+", ".*", m.group(1) if m else e)
        try:
            got = bool(query(q))  # each query is valid PromQL, variables as .*
            nonempty += got
            if not got and not re.search(r"\b(rate|increase)\(", q):
                empty.append(q)  # rates need more scrapes than this short run has
        except Exception as ex:
            fail("dashboard query %r: %s" % (q, ex))
    if empty:
        fail("only %d of %d dashboard queries return series; empty: %s" % (nonempty, len(exprs), empty))
    print("ok: the dashboard's %d families are scraped; %d of %d queries return series"
          % (len(families), nonempty, len(exprs)))
finally:
    stop_all()
    shutil.rmtree(tmp, ignore_errors=True)
