#!/usr/bin/env python3
"""One job of eight ranks on this machine: eight job_worker processes launched together as
ranks 0-7 of job ddp-8 (RANK, WORLD_SIZE, MEMTRACE_JOB, as torchrun sets them), each
recording to its own local log; rank 5 keeps 8 MiB more in each iteration from iteration 4.
`memtrace report` of the eight logs must name rank 5 as the highest, say by which tag and
from which call site it exceeds the median rank, and align the ranks by iteration marks.

The report's JSON is also validated against docs/telemetry.schema.json (ajv, when
tests/prof's node modules are installed).

usage: job_ranks.py JOB_WORKER MEMTRACE SOURCE_ROOT
Exit 0 pass, 1 fail (the check is named).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

worker, memtrace, src = sys.argv[1:4]
RANKS, BIG, ITERS, FROM = 8, 5, 10, 4
MIB = 1 << 20


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


tmp = tempfile.mkdtemp(prefix="mt-job-")
try:
    logs, procs = [], []
    for r in range(RANKS):
        log = os.path.join(tmp, "rank%d.ndjson" % r)
        logs.append(log)
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r % 4), WORLD_SIZE=str(RANKS),
                   MEMTRACE_JOB="ddp-8", MEMTRACE_LOG=log, MEMTRACE_STACKS="all",
                   MEMTRACE_OOM_DIR="off")
        args = [worker, str(ITERS)] + ([str(FROM)] if r == BIG else [])
        procs.append(subprocess.Popen(args, env=env))
    for r, p in enumerate(procs):
        if p.wait(timeout=60) != 0:
            fail("rank %d exited %d" % (r, p.returncode))

    out = subprocess.run([memtrace, "report", "--json", "--by", "function"] + logs,
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail("memtrace report --json: exit %d: %s" % (out.returncode, out.stderr))
    rep = json.loads(out.stdout)
    path = os.path.join(tmp, "report.json")
    with open(path, "w") as f:
        f.write(json.dumps(rep) + "\n")
    v = subprocess.run(["node", os.path.join(src, "tests", "prof", "validate.mjs"),
                        os.path.join(src, "docs", "telemetry.schema.json"), path],
                       capture_output=True, text=True)
    if v.returncode not in (0, 77):
        fail("the report does not match docs/telemetry.schema.json: " + v.stdout + v.stderr)
    print("ok: report JSON %s" % ("matches the schema" if v.returncode == 0 else
                                  "not validated (no ajv: npm ci --prefix tests/prof)"))
    jobs = rep.get("jobs", [])
    if len(jobs) != 1 or jobs[0].get("job") != "ddp-8":
        fail("want one job ddp-8, got %s" % [j.get("job") for j in jobs])
    g = jobs[0]
    ranks = g["ranks"]
    if [r["rank"] for r in ranks] != list(range(RANKS)) or g.get("world_size") != RANKS:
        fail("ranks %s of %s" % ([r["rank"] for r in ranks], g.get("world_size")))
    if g["aligned_by"] != "iteration" or g["unmarked_ranks"]:
        fail("not aligned by iteration: %s, unmarked %s" % (g["aligned_by"], g["unmarked_ranks"]))
    h = g["highest"]
    extra = (ITERS - FROM) * 8 * MIB
    # Its peak (iteration 9: 4 MiB of activations) against the others' (iteration 2: 6 MiB).
    if (h["rank"] != BIG or h["median_rank"] == BIG or
            h["above_median_bytes"] != extra - 2 * MIB or
            h["above_median_bytes"] != h["peak_allocated"] - ranks[0]["peak_allocated"]):
        fail("highest %s: want rank %d, %d bytes above the median" % (h, BIG, extra - 2 * MIB))
    tags = h["above_median_by_tag"]
    if not tags or tags[0] != {"tag": "kv_cache", "bytes": extra}:
        fail("difference by tag %s: want kv_cache first, %d bytes" % (tags, extra))
    sites = h.get("above_median_by_site") or []
    if not sites or not sites[0]["site"].startswith("grow_cache") or sites[0]["bytes"] != extra:
        fail("difference by call site %s: want grow_cache first, %d bytes" % (sites, extra))
    piter = {r["rank"]: r["peak_iteration"] for r in ranks}
    if piter[BIG] != ITERS - 1 or any(piter[r] != 2 for r in piter if r != BIG):
        fail("peak iterations %s: want %d for rank %d, 2 for the others" % (piter, ITERS - 1, BIG))
    its = g["iterations"]
    if [e["iteration"] for e in its] != list(range(ITERS - 8, ITERS)):
        fail("aligned iterations %s" % [e["iteration"] for e in its])
    for e in its:
        i = e["iteration"]
        base = e["peaks"][0]
        if any(p != base for k, p in enumerate(e["peaks"]) if k != BIG):
            fail("iteration %d: ranks other than %d differ: %s" % (i, BIG, e["peaks"]))
        want = base + (max(0, i - FROM + 1) * 8 * MIB)
        if e["peaks"][BIG] != want:
            fail("iteration %d: rank %d peaks at %d, want %d" % (i, BIG, e["peaks"][BIG], want))
    print("ok: rank %d highest by %d MiB (kv_cache, grow_cache), peaks in iteration %d; others in 2; "
          "%d iterations aligned" % (BIG, extra >> 20, ITERS - 1, len(its)))

    # The text report says the same, and the highest rank's section names the call site.
    out = subprocess.run([memtrace, "report", "--by", "function"] + logs, capture_output=True,
                         text=True)
    if out.returncode != 0:
        fail("memtrace report: exit %d: %s" % (out.returncode, out.stderr))
    text = out.stdout
    for want in ("job ddp-8: 8 ranks of 8; aligned by iteration marks",
                 "highest peak: rank 5, ",
                 "by tag, at each one's peak: kv_cache +48.0 MiB",
                 # "grow_cache (job_worker.c)" with line info, "grow_cache" in a release
                 # build without it
                 "by call site, at each one's peak: grow_cache",
                 "peak allocated within each iteration"):
        if want not in text:
            fail("the text report lacks %r:\n%s" % (want, text[:3000]))
    site_line = text[text.index("by call site, at each one's peak:"):].split("\n")[0]
    if not site_line.split(": ", 1)[1].split(", ")[0].endswith(" +48.0 MiB"):
        fail("the first call site of rank 5's excess is not +48.0 MiB: " + site_line)
    sec = text[text.index("(rank 5 of job ddp-8)"):]
    nxt = sec.find("\nprocess ", 1)
    sec = sec[:nxt] if nxt > 0 else sec
    if "grow_cache" not in sec:
        fail("rank 5's section does not name grow_cache:\n%s" % sec[:3000])
    print("ok: the text report aligns the ranks and rank 5's section names grow_cache")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
