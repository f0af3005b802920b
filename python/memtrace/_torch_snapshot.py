"""memtrace.snapshot(path, format="torch"): PyTorch's snapshot pickle, written by
memtrace's own converter (`memtrace export`) when this build has one."""
import json
import os
import shutil
import subprocess
import tempfile

from ._errors import MemtraceError


def _memtrace_cli():
    exe = os.environ.get("MEMTRACE_EXE") or shutil.which("memtrace")
    if exe is None:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(os.path.dirname(here))
        for d in ("build", "build-test", "build-release"):
            p = os.path.join(root, d, "tools", "memtrace")
            if os.path.exists(p):
                return p
    return exe


def write(recs, path):
    exe = _memtrace_cli()
    if exe is None:
        raise MemtraceError("memtrace.snapshot(format='torch'): the memtrace CLI was not "
                            "found (set MEMTRACE_EXE)")
    with tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False) as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
        tmp = f.name
    try:
        p = subprocess.run([exe, "export", "--format", "torch-snapshot", "-o", path, tmp],
                           capture_output=True, text=True)
    finally:
        os.unlink(tmp)
    if p.returncode != 0:
        raise MemtraceError("memtrace.snapshot(format='torch'): `memtrace export` failed: %s"
                            % (p.stderr.strip() or "exit %d" % p.returncode))
    return path
