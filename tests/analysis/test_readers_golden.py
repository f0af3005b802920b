#!/usr/bin/env python3
"""`memtrace plot` and `memtrace export` give the very bytes they gave before their replays
were made cheaper (docs/readers.md, "Speed"): the SHA-256 of each output below was taken
with the tree at 7518b92, whose plot replayed a process three times and export twice; and
`memtrace report` (text and JSON) the bytes it gave before it was printed process by process
(docs/readers.md, "Memory"), with the tree at ce28f47.

The log is written here from a fixed generator (no library randomness): two processes, one
of ten devices (more than plot's 8 lanes; device 3 named first by a mark, which opens no
lane), allocations of every built-in tag and user tags, pinned host memory, OOM events,
markers, short-lived segments, sizes past 2^32, a large stream and lines a little late.
Each output's hash is compared; a difference names the command. Each command is also run
with MEMTRACE_READER_THREADS=1 (the log read on one thread) on that log and on its lines of
one process, and must give the bytes it gives on two. The log is then converted to the binary
log (`memtrace convert`, docs/telemetry.md "The binary log"), and each command, `report` and
`report --json` too, must give on it the bytes it gives on the NDJSON (the log's own name
aside); and the binary log converted back must be the NDJSON byte for byte. The log
compressed (gzip, xz, zstd) must give the same bytes too. After a change that is
meant to change an output, `test_readers_golden.py MEMTRACE --print` prints the new table.
The hashes are of x86-64 outputs: elsewhere a contracted multiply-add may move a plot's last
digit, and the test is skipped (77).

usage: test_readers_golden.py MEMTRACE [--print]
"""
import hashlib
import os
import platform
import subprocess
import sys
import tempfile

MT = os.path.abspath(sys.argv[1]) if os.sep in sys.argv[1] else sys.argv[1]  # (run elsewhere)
PRINT = len(sys.argv) > 2 and sys.argv[2] == "--print"

TAGS = ["other", "weights", "grads", "optimizer", "activations", "workspace", "batch"]
MARKS = ["iteration", "forward_begin", "forward_end", "backward_begin", "backward_end",
         "warmup_end"]


class Rng:
    """xorshift64: the same numbers on every Python."""

    def __init__(self, seed):
        self.s = seed

    def next(self):
        s = self.s
        s ^= (s << 13) & 0xFFFFFFFFFFFFFFFF
        s ^= s >> 7
        s ^= (s << 17) & 0xFFFFFFFFFFFFFFFF
        self.s = s
        return s

    def below(self, n):
        return self.next() % n

    def pick(self, xs):
        return xs[self.below(len(xs))]


def write_log(path, n):
    rng = Rng(0x9E3779B97F4A7C15)
    out = []
    seqs = {}

    def ev(pid, t, dev, kind, addr=0, mark=None, size=0, req=0, pool="small", tag=0, stream=0,
           al=0, res=0):
        seqs[pid] = seqs.get(pid, 0) + 1
        name = TAGS[tag] if tag < 7 else "user%d" % tag
        where = ('"mark":"%s"' % mark) if mark else ('"addr":"0x%x"' % addr)
        out.append('{"v":1,"type":"event","seq":%d,"t_ns":%d,"pid":%d,"dev":%d,"kind":"%s",%s,'
                   '"size":%d,"requested":%d,"pool":"%s","tag":"%s","tag_id":%d,"stream":%d,'
                   '"allocated":%d,"reserved":%d}'
                   % (seqs[pid], t, pid, dev, kind, where, size, req, pool, name, tag, stream,
                      al, res))

    for pid, ndev, count in ((11, 10, n), (12, 2, n // 4)):
        out.append('{"v":1,"type":"hello","pid":%d,"name":"gen%d","start_realtime_ns":1}'
                   % (pid, pid))
        out.append('{"v":1,"type":"event","seq":0,"t_ns":999,"pid":%d,"dev":0,'
                   '"kind":"tag_label","tag_id":8,"label":"kv cache"}' % pid)
        seqs[pid] = 0
        t = 1000
        al, res, live, nxt = [0] * ndev, [0] * ndev, {}, {}
        ev(pid, t, 3, "mark", mark="warmup_begin", pool="none")
        ev(pid, t, 0, "config", size=80 << 30, pool="none")
        for d in range(ndev):
            base = (d + 1) << 40
            nxt[d] = base
            t += 5
            res[d] += 1 << 30
            ev(pid, t, d, "segment_alloc", addr=base, size=1 << 30, req=1 << 30, pool="large",
               stream=d, al=al[d], res=res[d])
        host = 0
        for i in range(count):
            t += rng.pick([1, 3, 1000, 70000])
            late = t - rng.pick([0, 0, 0, 0, 5000]) if i > 10 else t
            d = rng.below(ndev)
            r = rng.below(100)
            if r < 45:
                size = rng.pick([512, 1024, 4096, 1 << 20, (3 << 31) if pid == 11 else 1 << 21,
                                 70000])
                base = (d + 1) << 40
                if nxt[d] + size > base + (1 << 30) and size < (1 << 30):
                    nxt[d] = base
                addr = nxt[d]
                nxt[d] += size
                if addr in live:
                    continue
                tag = rng.pick([0, 1, 2, 3, 4, 5, 6, 8, 9])
                al[d] += size
                live[addr] = (d, size, tag)
                ev(pid, late, d, "alloc", addr=addr, size=size,
                   req=rng.pick([0, size - 7, size]), tag=tag,
                   stream=rng.pick([0, 7, 3000000000]), al=al[d], res=res[d],
                   pool="large" if size > 1 << 20 else "small")
            elif r < 85 and live:
                addr = sorted(live)[rng.below(len(live))]
                d0, size, tag = live.pop(addr)
                ev(pid, late, d0, "free_requested", addr=addr, size=size, req=size, tag=tag,
                   al=al[d0], res=res[d0])
                al[d0] -= size
                ev(pid, late + 1, d0, "free_completed", addr=addr, size=size, req=size, tag=tag,
                   al=al[d0], res=res[d0])
            elif r < 90:
                host += 1
                ev(pid, late, 0, "alloc", addr=(7 << 44) + host * 4096, size=4096, req=4000,
                   pool="host", tag=1, al=host * 4096, res=host * 8192)
            elif r < 92:
                ev(pid, late, d, "oom", size=12345, req=1 << 33, pool="large", al=al[d],
                   res=res[d])
            elif r < 96:
                ev(pid, late, d, "mark", mark=rng.pick(MARKS), size=i, pool="none", al=al[d],
                   res=res[d])
            else:
                t += 1
                a = (d + 1) << 40 | 1 << 35 | i << 21
                ev(pid, t, d, "segment_alloc", addr=a, size=1 << 21, req=1 << 21, al=al[d],
                   res=res[d] + (1 << 21))
                ev(pid, t + 1, d, "segment_free", addr=a, size=1 << 21, req=1 << 21, al=al[d],
                   res=res[d])
        out.append('{"v":1,"type":"exit","pid":%d,"clean":true}' % pid)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


COMMANDS = [
    "plot -o -",
    "plot --pid 12 -o -",
    "plot --width 900 --buckets 37 -o -",
    "plot --flamegraph -o -",
    "export --format torch-snapshot -o -",
    "export --format torch-snapshot --pid 12 -o -",
    "export --format torch-snapshot --torch-format 1 -o -",
    "report",
    "report --json",
    "report --by function",
]

# sha256 of stdout, then of stderr, and the exit status, by the tree at 7518b92; the plots'
# since their title counts events as the report does (tag labels left out); process 11's
# exports since blocks and segments at the end tile and lie apart, and its trace keeps what
# memory_viz's state view can undo (310 entries left out, said on stderr: this log is
# random, not one allocator's, docs/torch-snapshot.md "What memory_viz needs of a trace").
EXPECTED = {
    "plot -o -":
        ("fc549a6e6921853d2ba59d1b03c6d60e",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "plot --pid 12 -o -":
        ("9c96f1f364498f57aa58d5bf542c8da0",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "plot --width 900 --buckets 37 -o -":
        ("65bac92455afe98aa5c03e0f489c5d59",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "plot --flamegraph -o -":
        ("e397eb96fa10a12cc7c3314ace13119e",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "export --format torch-snapshot -o -":
        ("31badbb839a001ecf0b3506e6e1c5bb8",
         "7b7b90596dcb1ac40e9b2797eaf0b8ab", 0),
    "export --format torch-snapshot --pid 12 -o -":
        ("64b6fdaadee6f1d913c409dc786f6692",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "export --format torch-snapshot --torch-format 1 -o -":
        ("08317855e8d1fcde17188c8bcc610a4b",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    # the report's, by the tree at ce28f47, before it was printed process by process
    "report":
        ("ad2e36fabe3a5f68f46e5bfecd480fc5",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "report --json":
        ("292f05d59737c4ecd88c3fde52e9f726",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
    "report --by function":
        ("e46cf9b18b3835eafcbca78a6463ccf9",
         "e3b0c44298fc1c149afbf4c8996fb924", 0),
}


def binary_same(log, tmp):
    """The commands on the log's binary form give the NDJSON's bytes; the names of what
    differs."""
    binlog, back = os.path.join(tmp, "varied.mtlog"), os.path.join(tmp, "back.ndjson")
    differ = []
    for args in (["--to", "binary", log, "-o", binlog], [binlog, "-o", back]):
        p = subprocess.run([MT, "convert"] + args, capture_output=True)
        if p.returncode != 0:
            return ["memtrace convert %s: status %d, %s" % (" ".join(args), p.returncode,
                                                              p.stderr.decode(errors="replace"))]
    with open(log, "rb") as f, open(back, "rb") as g:
        if f.read() != g.read():
            differ.append("NDJSON -> binary -> NDJSON is not the same bytes")
    with open(log, "rb") as f, open(binlog, "rb") as g:
        if len(g.read()) * 4 > len(f.read()):
            differ.append("the binary log is not a quarter of the NDJSON's bytes or less")
    env = dict(os.environ, TMPDIR=tmp)
    for cmd in COMMANDS:
        runs = []
        for path in (log, binlog):
            p = subprocess.run([MT] + cmd.split() + [path], capture_output=True, env=env)
            runs.append((p.stdout.replace(path.encode(), b"LOG"),
                         p.stderr.replace(path.encode(), b"LOG"), p.returncode))
        if runs[0] != runs[1] or runs[0][2] != 0:
            differ.append("memtrace %s LOG (status %d and %d)" % (cmd, runs[0][2], runs[1][2]))
    return differ


def compressed_same(log, tmp):
    """The commands on the log compressed by gzip, xz and zstd (Python's zlib and liblzma
    encoders, the zstd program where installed) give the plain log's bytes; so does the
    gzip'ed log on standard input; a log cut inside its compressed data is named and what
    came before it reported. The names of what differs."""
    import gzip
    import lzma
    import shutil
    with open(log, "rb") as f:
        text = f.read()
    forms = {"gz": gzip.compress(text, mtime=0), "xz": lzma.compress(text)}
    paths = {}
    for ext, data in forms.items():
        paths[ext] = os.path.join(tmp, "varied.ndjson." + ext)
        with open(paths[ext], "wb") as g:
            g.write(data)
    if shutil.which("zstd"):
        paths["zst"] = os.path.join(tmp, "varied.ndjson.zst")
        subprocess.run(["zstd", "-q", "-f", log, "-o", paths["zst"]], check=True)
    else:
        print("note: no zstd program: the zstd form is left to the C tests (tests/replay)")
    env = dict(os.environ, TMPDIR=tmp)
    differ = []
    for cmd in COMMANDS:
        p = subprocess.run([MT] + cmd.split() + [log], capture_output=True, env=env)
        want = (p.stdout.replace(log.encode(), b"LOG"), p.stderr.replace(log.encode(), b"LOG"),
                p.returncode)
        for ext, path in paths.items():
            q = subprocess.run([MT] + cmd.split() + [path], capture_output=True, env=env)
            got = (q.stdout.replace(path.encode(), b"LOG"),
                   q.stderr.replace(path.encode(), b"LOG"), q.returncode)
            if got != want:
                differ.append("memtrace %s on the %s log (status %d)" % (cmd, ext, q.returncode))
    with open(paths["gz"], "rb") as f:
        q = subprocess.run([MT, "report", "-"], stdin=f, capture_output=True, env=env)
    p = subprocess.run([MT, "report", log], capture_output=True, env=env)
    if q.returncode != 0 or q.stdout.replace(b"-", b"") != p.stdout.replace(log.encode(), b"")\
            .replace(b"-", b""):
        differ.append("memtrace report - < the gzip'ed log (status %d)" % q.returncode)
    # Through a pipe, on standard input and by a path (a FIFO, as `<(zcat log.gz)` gives):
    # looking at the input to tell its kind must not lose its first bytes.
    import threading
    want = p.stdout.replace(log.encode(), b"LOG")
    for data, what in ((text, "plain"), (forms["xz"], "xz")):
        q = subprocess.run([MT, "report", "-"], input=data, capture_output=True, env=env)
        if q.returncode != 0 or q.stdout.replace(b"memtrace report: -:", b"memtrace report: LOG:") \
                != want:
            differ.append("memtrace report - on a pipe of the %s log (status %d)"
                          % (what, q.returncode))
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)

        def feed(data=data):
            with open(fifo, "wb") as w:
                w.write(data)
        th = threading.Thread(target=feed, daemon=True)
        th.start()
        try:
            q = subprocess.run([MT, "report", fifo], capture_output=True, env=env, timeout=120)
            ok = q.returncode == 0 and q.stdout.replace(fifo.encode(), b"LOG") == want
        except subprocess.TimeoutExpired:  # it read the FIFO to look, then waited for more
            ok = False
        if not ok:
            differ.append("memtrace report FIFO of the %s log" % what)
        if th.is_alive():  # a writer left waiting for a reader
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            th.join(5)
        os.unlink(fifo)
    # convert: the gzip'ed NDJSON to the binary log gives the plain one's bytes, and the
    # binary log xz'ed back to NDJSON gives the log.
    bins = []
    for src in (log, paths["gz"]):
        bins.append(os.path.join(tmp, "conv%d.mtlog" % len(bins)))
        subprocess.run([MT, "convert", "--to", "binary", src, "-o", bins[-1]],
                       capture_output=True)
    back = os.path.join(tmp, "conv.ndjson")
    with open(bins[0], "rb") as f:
        data = f.read()
    with open(bins[0] + ".xz", "wb") as g:
        g.write(lzma.compress(data))
    subprocess.run([MT, "convert", bins[0] + ".xz", "-o", back], capture_output=True)
    contents = []
    for path in bins + [back]:
        with open(path, "rb") if os.path.exists(path) else open(os.devnull, "rb") as f:
            contents.append(f.read())
    if not contents[0] or contents[0] != contents[1] or contents[2] != text:
        differ.append("memtrace convert of the gzip'ed log, or of the xz'ed binary log")
    cut = os.path.join(tmp, "cut.ndjson.xz")
    with open(cut, "wb") as g:
        g.write(forms["xz"][: len(forms["xz"]) // 2])
    q = subprocess.run([MT, "report", cut], capture_output=True, env=env)
    if (q.returncode != 2 or b"xz: the file ends inside compressed data" not in q.stderr
            or b"events" not in q.stdout):
        differ.append("memtrace report on a cut xz log: status %d, %s"
                      % (q.returncode, q.stderr.decode(errors="replace")))
    return differ


def main():
    if not PRINT and platform.machine() not in ("x86_64", "AMD64"):
        print("SKIP: the hashes are of x86-64 outputs, this is %s" % platform.machine())
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "varied.ndjson")
        write_log(log, 12000)
        one = os.path.join(tmp, "one.ndjson")  # the lines of process 11 alone
        with open(log) as f, open(one, "w") as g:
            g.writelines(ln for ln in f if '"pid":11,' in ln or '"pid":11}' in ln)
        got, threads_differ = {}, []
        for cmd in COMMANDS:
            for path in (log, one):
                runs = []
                for threads in ("2", "1"):
                    env = dict(os.environ, TMPDIR=tmp)
                    if threads == "1":
                        env["MEMTRACE_READER_THREADS"] = "1"
                    else:
                        env.pop("MEMTRACE_READER_THREADS", None)
                    # (from the log's directory: the text report names the log as given)
                    p = subprocess.run([MT] + cmd.split() + [os.path.basename(path)],
                                       capture_output=True, env=env, cwd=os.path.dirname(path))
                    runs.append((p.stdout, p.stderr, p.returncode))
                if runs[0] != runs[1]:
                    threads_differ.append("%s %s" % (cmd, os.path.basename(path)))
                if path == log:
                    out, err, status = runs[0]
                    got[cmd] = (hashlib.sha256(out).hexdigest()[:32],
                                hashlib.sha256(err).hexdigest()[:32], status)
        binary_differ = binary_same(log, tmp)
        compressed_differ = compressed_same(log, tmp)
    if PRINT:
        for cmd in COMMANDS:
            print('    "%s":\n        ("%s",\n         "%s", %d),' % ((cmd,) + got[cmd]))
        return 0
    bad = [cmd for cmd in COMMANDS if got[cmd] != EXPECTED.get(cmd)]
    for cmd in bad:
        print("DIFFERS: memtrace %s LOG: %s, expected %s" % (cmd, got[cmd], EXPECTED.get(cmd)))
    for what in threads_differ:
        print("DIFFERS on one thread and on two: memtrace %s" % what)
    for what in binary_differ:
        print("DIFFERS on the binary log: %s" % what)
    for what in compressed_differ:
        print("DIFFERS compressed: %s" % what)
    print("%d outputs compared, %d differ; %d compared on one thread and two, %d differ; "
          "%d compared on the binary log, %d differ"
          % (len(COMMANDS), len(bad), 2 * len(COMMANDS), len(threads_differ),
             len(COMMANDS) + 3, len(binary_differ)))
    print("%d compressed comparisons differ" % len(compressed_differ))
    return 1 if bad or threads_differ or binary_differ or compressed_differ else 0


sys.exit(main())
