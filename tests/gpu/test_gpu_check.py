"""Meson tests of gpu_check.sh (suite gpu-check).

  test_gpu_check.py fake BUILD   runs gpu_check.sh --fake BUILD and checks its table: every
                                 check is there; each verdict is pass, skip with a reason,
                                 or FAIL of a check in KNOWN_FAIL (memtrace bugs the check
                                 finds over the fakes); the C checks all run; nothing ERRORs.
  test_gpu_check.py nogpu        on a machine without a GPU, gpu_check.sh exits 77 and says
                                 why (the test skips itself where a GPU is present)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpu_check.sh")
ALL = ["1", "1-py", "2-plugin", "2-ctypes", "2-cupy", "3", "4", "5", "5-run", "6-shared", "6-static", "6-proc",
       "7", "7-reference", "8", "9", "10"]
# The checks in C, which must run over the fakes (not skip), except where a fake lacks
# what the check needs (the reason must say which).
C_CHECKS = {"1": None, "2-plugin": None, "2-ctypes": None, "6-shared": None, "6-proc": None, "7": None,
            "7-reference": None, "9": None, "10": None, "6-static": "static"}
# Memtrace bugs the checks find over the fakes, by finding (docs/gpu-check.md).
KNOWN_FAIL = {}


def fake(build):
    out = os.path.join(tempfile.mkdtemp(prefix="gpu-check-test-"), "t.json")
    p = subprocess.run([SCRIPT, "--fake", build, "--out", out], capture_output=True, text=True)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    bad = []
    if p.returncode not in (0, 1):
        bad.append(f"gpu_check.sh exited {p.returncode}")
    if not os.path.exists(out):
        sys.exit("FAIL: no JSON table written: " + "; ".join(bad))
    table = json.load(open(out))
    rows = {c["check"]: c for c in table["checks"]}
    if table.get("mode") != "fake":
        bad.append(f"mode {table.get('mode')}")
    for cid in ALL:
        if cid not in rows:
            bad.append(f"check {cid} missing from the table")
    fails = []
    for cid, c in rows.items():
        v = c["verdict"]
        if v == "skip":
            if not c["reason"]:
                bad.append(f"check {cid} skipped without a reason")
            want = C_CHECKS.get(cid, "")
            if cid in C_CHECKS and (want is None or want not in c["reason"]):
                bad.append(f"C check {cid} skipped: {c['reason']}")
        elif v == "FAIL":
            fails.append(cid)
            if cid not in KNOWN_FAIL:
                bad.append(f"check {cid} FAILs: {c['reason']}")
            if cid not in C_CHECKS and cid != "2-ctypes":
                bad.append(f"check {cid} ran over the fakes")
        elif v != "pass":
            bad.append(f"check {cid}: verdict {v}: {c['reason']}")
    # Exit status 0 exactly when no check FAILs.
    if (p.returncode == 1) != bool(fails):
        bad.append(f"exit status {p.returncode} with FAILs {fails}")
    for cid in KNOWN_FAIL:
        if cid in rows and rows[cid]["verdict"] == "pass":
            print(f"note: known-failing check {cid} ({KNOWN_FAIL[cid]}) passes now: "
                  "take it off KNOWN_FAIL", file=sys.stderr)
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    if bad:
        sys.exit("FAIL:\n  " + "\n  ".join(bad))
    print("ok: table complete; FAILs all known:", ", ".join(fails) or "none")


def nogpu():
    if shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0"):
        print("a GPU may be present: nothing to test")
        sys.exit(77)
    p = subprocess.run([SCRIPT], capture_output=True, text=True, timeout=60)
    print(p.stdout, p.stderr)
    if p.returncode != 77:
        sys.exit(f"FAIL: gpu_check.sh without a GPU exited {p.returncode}, not 77")
    if "no NVIDIA GPU" not in p.stderr:
        sys.exit("FAIL: gpu_check.sh did not say why it skipped")
    print("ok")


if __name__ == "__main__":
    if sys.argv[1] == "fake":
        fake(sys.argv[2])
    else:
        nogpu()
