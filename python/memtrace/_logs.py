"""memtrace.read_log(path): the records of a telemetry log, NDJSON or binary, as dicts.

One meaning, written once: a binary log (docs/telemetry.md, "The binary log") is read by
`memtrace convert`, whose lines are the recorder's own (profiler/encode.c), so the dicts are
json.loads of the very lines the NDJSON form holds.
"""
import json
import subprocess
import tempfile

from . import _lib
from ._errors import MemtraceError

MAGIC = b"\x89MTLOG\r\n"  # a binary log's first bytes (profiler/binlog.h)
_SHOWN = 5  # damaged parts named in the error


def _ndjson(path, bad):
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                bad.append("line %d: %s" % (n, e))
                continue
            if not isinstance(rec, dict):
                bad.append("line %d: not a JSON object" % n)
                continue
            yield rec


def _binary(path, bad, cli):
    exe = cli or _lib.memtrace_cli()
    if not exe:
        raise MemtraceError("memtrace.read_log(%r): a binary log is read by `memtrace convert`, "
                            "and no memtrace CLI was found (PATH, $MEMTRACE_EXE, or pass "
                            "memtrace_cli=)" % (path,))
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([exe, "convert", "--to", "ndjson", path, "-o", "-"],
                             stdout=subprocess.PIPE, stderr=err)
        try:
            for n, line in enumerate(p.stdout, 1):
                try:
                    yield json.loads(line)
                except ValueError as e:  # not from convert: say so rather than guess
                    bad.append("converted line %d: %s" % (n, e))
            rc = p.wait()
        finally:
            if p.poll() is None:  # the caller stopped early
                p.kill()
                p.wait()
            p.stdout.close()
        err.seek(0)
        text = err.read().decode("utf-8", "replace").strip()
    if rc != 0:
        lines = [l for l in text.splitlines() if l] or ["exit status %d" % rc]
        bad.extend(lines)


def read_log(path, skip_damaged=False, memtrace_cli=None):
    """Yields each record of the telemetry log at path (docs/telemetry.md, section 4) as a
    dict, in file order: NDJSON (json.loads of each line) or a binary log (told apart by
    its first bytes; read by `memtrace convert`, found on PATH, in the checkout's build
    directory, at $MEMTRACE_EXE, or given as memtrace_cli).

    Damage never costs the sound records: every one is yielded, then, unless
    skip_damaged, MemtraceError names the damaged parts (an NDJSON line that is not a
    JSON object; a binary block's byte offsets)."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    bad = []
    if head == MAGIC:
        yield from _binary(path, bad, memtrace_cli)
    else:
        yield from _ndjson(path, bad)
    if bad and not skip_damaged:
        more = "" if len(bad) <= _SHOWN else "; and %d more" % (len(bad) - _SHOWN)
        raise MemtraceError("memtrace.read_log(%r): %d damaged part%s: %s%s"
                            % (path, len(bad), "" if len(bad) == 1 else "s",
                               "; ".join(bad[:_SHOWN]), more))
