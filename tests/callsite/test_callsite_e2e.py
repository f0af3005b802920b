"""Call sites of real programs (issue 13's tests), with the system python3 as the driver.

- An unmodified CUDA runtime program (prog_sites.c) under `memtrace run` on the sim backend
  with MEMTRACE_STACKS=all: its cudaMalloc call sites appear under its own function names
  and file:line in `memtrace report --by callsite` (text and JSON, JSON in the schema's
  shape), in the flame graphs (peak and --leaked), never freed and at the peak.
- The same program stripped: module+offset, no crash.
- The system python3 calling the preload's memtrace_alloc through ctypes (prog_ctypes.py):
  the reported stacks hold the script's function names and line numbers, and growth per
  call site flags the one that keeps memory.
- examples/train_charlm under MEMTRACE_STACKS=all: the activations resolve to the RNN
  engine's forward function and its caller in the example.
- Bad input: a corrupt stack table line, an unknown stack id, a log ending mid-table.
Environment: MT_MEMTRACE, MT_PRELOAD, MT_PROG_SITES, MT_PROG_SITES_STRIPPED,
MT_TRAIN_CHARLM, MT_CHARLM_TEXT (optional)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.realpath(__file__))
MEMTRACE = os.environ["MT_MEMTRACE"]


def run(cmd, env=None, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (cmd, p.returncode, p.stdout[-4000:], p.stderr[-4000:]))
    return p


def base_env(**kw):
    env = dict(os.environ)
    for k in ("MEMTRACE_BACKEND", "MEMTRACE_PROF", "MEMTRACE_LOG", "MEMTRACE_STACKS"):
        env.pop(k, None)
    env.update(kw)
    return env


def report(log, *extra):
    p = run([MEMTRACE, "report", "--by", "callsite", "--json"] + list(extra) + [log])
    doc = json.loads(p.stdout)
    procs = [q for q in doc["processes"] if q.get("callsites", {}).get("stacks", 0) > 0]
    assert procs, "no process with call stacks in %s" % log
    return procs[0]


def functions(row):
    return [f["function"] for f in row["frames"]]


def find_row(rows, pred):
    for r in rows:
        if pred(r):
            return r
    return None


def line_of(path, marker):
    with open(path) as f:
        for i, text in enumerate(f, 1):
            if marker in text:
                return i
    raise AssertionError(marker)


def has_line_info(path):
    """Whether the ELF file at path has DWARF line info (a non-empty .debug_line section).
    A release build's binaries have none: their frames read "func (module+0x..)"."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sec = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = sec[shstrndx][4], sec[shstrndx][5]
    names = data[names_off:names_off + names_size]
    for name, _type, _flags, _addr, _off, size in sec:
        if names[name:names.index(b"\0", name)] == b".debug_line" and size > 0:
            return True
    return False


def check_svg(path, must):
    root = ET.parse(path).getroot()  # well-formed XML
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    for m in must:
        assert any(m in t for t in titles), "no frame titled %r in %s: %s" % (m, path, titles[:20])
    return titles


class CudaRuntimeProgram(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mt-callsite-")
        cls.logs = {}
        for name, prog in (("full", os.environ["MT_PROG_SITES"]),
                           ("stripped", os.environ["MT_PROG_SITES_STRIPPED"])):
            log = os.path.join(cls.tmp, name + ".ndjson")
            p = run([MEMTRACE, "run", "--backend", "sim", "--log", log, "--quiet", "--", prog],
                    env=base_env(MEMTRACE_STACKS="all"))
            assert "ok" in p.stdout, p.stdout
            cls.logs[name] = log

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_sites_under_the_programs_own_names(self):
        cs = report(self.logs["full"])["callsites"]
        src = os.path.join(HERE, "prog_sites.c")
        w = find_row(cs["at_peak"], lambda r: r["frames"] and r["frames"][0]["function"] == "load_weights")
        self.assertIsNotNone(w, json.dumps(cs["at_peak"], indent=1)[:3000])
        self.assertEqual(w["bytes"], 8 << 20)
        self.assertEqual(functions(w)[1], "main")
        self.assertTrue(w["frames"][0]["file"].endswith("prog_sites.c"))
        self.assertEqual(w["frames"][0]["line"], line_of(src, "cudaMalloc(&p, 8u << 20)"))
        a = find_row(cs["at_peak"], lambda r: functions(r)[:2] == ["make_activations", "train_step"])
        self.assertIsNotNone(a)
        self.assertEqual(a["bytes"], 4 << 20)
        self.assertEqual(functions(a)[2], "main")
        # Never freed: the weights and the history (8 x 256 KiB), not the activations.
        nf = {functions(r)[0]: r["bytes"] for r in cs["never_freed"]}
        self.assertEqual(nf.get("load_weights"), 8 << 20)
        self.assertEqual(nf.get("grow_history"), 8 * (256 << 10))
        self.assertNotIn("make_activations", nf)

    def test_text_report(self):
        p = run([MEMTRACE, "report", "--by", "callsite", self.logs["full"]])
        self.assertIn("live bytes at the peak, by call site", p.stdout)
        self.assertRegex(p.stdout, r"8\.0 MiB +\d+ blocks +load_weights \(prog_sites\.c:\d+\)")
        self.assertRegex(p.stdout, r"<- train_step \(prog_sites\.c:\d+\)")

    def test_flamegraphs(self):
        out = os.path.join(self.tmp, "peak.svg")
        run([MEMTRACE, "plot", "--flamegraph", "-o", out, self.logs["full"]])
        check_svg(out, ["load_weights (prog_sites.c:", "make_activations (prog_sites.c:",
                        "main (prog_sites.c:"])
        leak = os.path.join(self.tmp, "leak.svg")
        run([MEMTRACE, "plot", "--flamegraph", "--leaked", "-o", leak, self.logs["full"]])
        titles = check_svg(leak, ["load_weights (", "grow_history ("])
        self.assertFalse(any("make_activations" in t for t in titles))
        p = run([MEMTRACE, "plot", "--leaked", "-o", leak, self.logs["full"]], check=False)
        self.assertEqual(p.returncode, 2)

    def test_stripped_binary_degrades(self):
        cs = report(self.logs["stripped"])["callsites"]
        labels = [f["label"] for r in cs["at_peak"] for f in r["frames"]]
        self.assertTrue(any(re.match(r"callsite_sites\.stripped\+0x[0-9a-f]+$", l) for l in labels),
                        labels)
        self.assertFalse(any("load_weights" in l for l in labels))
        out = os.path.join(self.tmp, "stripped.svg")
        run([MEMTRACE, "plot", "--flamegraph", "-o", out, self.logs["stripped"]])
        check_svg(out, ["callsite_sites.stripped+0x"])


def elf_is_pie(path):
    with open(path, "rb") as f:
        head = f.read(18)
    return int.from_bytes(head[16:18], "little") == 3  # ET_DYN


def symbol(path, name):
    out = run(["nm", path]).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise AssertionError("no symbol %s in %s" % (name, path))


def crafted_log(tmp):
    """A real log of prog_sites.c (stacks off) given a stack table by hand: stack 1
    (the 8 MiB weights) is two native frames inside load_weights and main of the real
    binary at a made-up load bias, stack 2 (the 4 MiB activations) two Python frames,
    stack 3 (the history) an id no line defines. Returns (lines, table line indexes)."""
    prog = os.environ["MT_PROG_SITES"]
    log = os.path.join(tmp, "plain.ndjson")
    run([MEMTRACE, "run", "--backend", "sim", "--log", log, "--quiet", "--", prog],
        env=base_env(MEMTRACE_STACKS="off"))
    with open(log) as f:
        lines = f.read().splitlines()
    assert not any('"stack' in l for l in lines), "stacks recorded with MEMTRACE_STACKS=off"
    base = 0x555555554000 if elf_is_pie(prog) else 0
    pid = json.loads(lines[0])["pid"]
    ip = lambda name: "0x%x" % (base + symbol(prog, name) + 4)
    table = [
        {"v": 1, "kind": "module", "pid": pid, "path": prog, "base": "0x%x" % base,
         "size": 1 << 24},
        {"v": 1, "kind": "stack", "pid": pid, "id": 1,
         "frames": [{"ip": ip("load_weights")}, {"ip": ip("main")}]},
        {"v": 1, "kind": "stack", "pid": pid, "id": 2,
         "frames": [{"py": "Model.forward", "file": "/src/train.py", "line": 10},
                    {"py": "main", "file": "/src/train.py", "line": 20}], "truncated": True},
    ]
    # Each alloc with a stack follows its stack_ref event (one seq each: later seqs move).
    out, at, shift = [], [], 0
    by_size = {8 << 20: 1, 4 << 20: 2, 256 << 10: 3}
    for l in lines:
        d = json.loads(l)
        if "seq" in d:
            d["seq"] += shift
            l = json.dumps(d)
        if d.get("type") == "event" and d.get("kind") == "alloc" and d.get("size") in by_size:
            if table:
                for t in table:
                    at.append(len(out))
                    out.append(json.dumps(t))
                table = []
            sid = by_size[d["size"]]
            ref = {k: d[k] for k in ("v", "type", "seq", "t_ns", "pid", "dev")}
            ref.update(kind="stack_ref", addr=d["addr"], pool=d["pool"], stack=sid)
            out.append(json.dumps(ref))
            d["seq"] += 1
            shift += 1
            d["stack"] = sid
            l = json.dumps(d)
        out.append(l)
    return out, at


class CraftedLog(unittest.TestCase):
    """The views on a log whose stack table is known: names from the real binary's debug
    info through the module map, Python frames, an unknown id, JSON, text and flames."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mt-callsite-crafted-")
        lines, _ = crafted_log(cls.tmp)
        cls.log = os.path.join(cls.tmp, "crafted.ndjson")
        with open(cls.log, "w") as f:
            f.write("\n".join(lines) + "\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_json(self):
        cs = report(self.log)["callsites"]
        self.assertEqual(cs["stacks"], 2)
        peak = {r["stack"]: r for r in cs["at_peak"]}
        w = peak[1]
        self.assertEqual(w["bytes"], 8 << 20)
        self.assertEqual(functions(w), ["load_weights", "main"])
        self.assertTrue(w["frames"][0]["file"].endswith("prog_sites.c"))
        # The ip is 4 bytes into load_weights: a line of its first statements.
        src = os.path.join(HERE, "prog_sites.c")
        self.assertIn(w["frames"][0]["line"], range(line_of(src, "noinline)) void *load_weights"),
                                                    line_of(src, "cudaMalloc(&p, 8u << 20)") + 1))
        self.assertEqual(w["site"], "load_weights (prog_sites.c:%d)" % w["frames"][0]["line"])
        a = peak[2]
        self.assertEqual(a["bytes"], 4 << 20)
        self.assertEqual([(f["function"], f["line"], f["python"]) for f in a["frames"]],
                         [("Model.forward", 10, True), ("main", 20, True)])
        self.assertTrue(a["truncated"])
        self.assertEqual(peak[3]["site"], "unknown stack 3")
        self.assertTrue(peak[3]["unknown"])
        nf = {r["stack"]: r["bytes"] for r in cs["never_freed"]}
        self.assertEqual(nf, {1: 8 << 20, 3: 8 * (256 << 10)})
        self.assertEqual(cs["growth"], [])  # no iteration marks

    def test_text(self):
        p = run([MEMTRACE, "report", "--by", "callsite", self.log])
        self.assertIn("call sites: 2 distinct stacks recorded", p.stdout)
        self.assertRegex(p.stdout, r"8\.0 MiB +\d+ blocks +load_weights \(prog_sites\.c:\d+\)\n"
                                   r" +<- main \(prog_sites\.c:\d+\)")
        self.assertRegex(p.stdout, r"Model\.forward \(train\.py:10\)\n +<- main \(train\.py:20\)"
                                   r"\n +<- \.\.\.")
        self.assertIn("unknown stack 3", p.stdout)

    def test_flames(self):
        out = os.path.join(self.tmp, "peak.svg")
        run([MEMTRACE, "plot", "--flamegraph", "-o", out, self.log])
        titles = check_svg(out, ["load_weights (prog_sites.c:", "main (prog_sites.c:",
                                 "Model.forward (train.py:10)", "unknown stack 3"])
        self.assertTrue(any(t.startswith("all (14.0 MiB") for t in titles), titles[:3])
        leak = os.path.join(self.tmp, "leak.svg")
        run([MEMTRACE, "plot", "--flamegraph", "--leaked", "-o", leak, self.log])
        titles = check_svg(leak, ["load_weights (", "unknown stack 3"])
        self.assertFalse(any("Model.forward" in t for t in titles))
        self.assertTrue(any(t.startswith("all (10.0 MiB") for t in titles), titles[:3])
        p = run([MEMTRACE, "plot", "--leaked", "-o", leak, self.log], check=False)
        self.assertEqual(p.returncode, 2)
        p = run([MEMTRACE, "plot", "--flamegraph", "--pid", "1", "-o", leak, self.log], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no process 1", p.stderr)


    def test_web(self):
        node = shutil.which("node")
        if node is None:
            self.skipTest("no node")
        p = run([node, os.path.join(HERE, "web_callsite.mjs"), MEMTRACE, self.log], check=False)
        if p.returncode == 77:
            self.skipTest(p.stdout.strip())
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("clicking the weights block shows its call stack", p.stdout)


class LiveDaemon(unittest.TestCase):
    """The CUDA runtime program reporting to a live daemon with MEMTRACE_STACKS=all: /state
    (read through `top --json`) lists its call sites by name, and `top --once` shows them
    under the selected process."""

    def test_state_and_top(self):
        import time
        tmp = tempfile.mkdtemp(prefix="mt-callsite-d-")
        sock = os.path.join(tmp, "mt.sock")
        d = subprocess.Popen([MEMTRACE, "daemon", "--socket", sock, "--port", "off",
                              "--foreground", "--quiet"])
        try:
            for _ in range(100):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            run([MEMTRACE, "run", "--backend", "sim", "--telemetry", "daemon", "--quiet", "--",
                 os.environ["MT_PROG_SITES"]],
                env=base_env(MEMTRACE_STACKS="all", MEMTRACE_SOCKET=sock))
            # The daemon drains the exited process's ring: wait for its call sites (bounded).
            proc = None
            for _ in range(100):
                st = json.loads(run([MEMTRACE, "top", "--json", "--socket", sock]).stdout)
                procs = [q for q in st["processes"] if q.get("callsites")]
                proc = procs[0] if procs else None
                if proc and any(r["site"].startswith("load_weights") for r in proc["callsites"]):
                    break
                time.sleep(0.05)
            self.assertIsNotNone(proc, st)
            top = proc["callsites"][0]
            self.assertTrue(top["site"].startswith("load_weights (prog_sites.c:"), proc["callsites"])
            self.assertEqual(top["bytes"], 8 << 20)
            self.assertTrue(top["frames"][1]["label"].startswith("main (prog_sites.c:"))
            out = run([MEMTRACE, "top", "--once", "--socket", sock, "--pid", str(proc["pid"])]).stdout
            self.assertIn("top call sites of %d" % proc["pid"], out)
            self.assertRegex(out, r"8\.0 MiB +1 blocks +load_weights \(prog_sites\.c:\d+\)"
                                  r" +<- main \(prog_sites\.c:\d+\)")
            out = run([MEMTRACE, "top", "--once", "--socket", sock, "--pid", "1"]).stdout
            self.assertIn("no process 1", out)
        finally:
            d.terminate()
            d.wait(30)
            shutil.rmtree(tmp, ignore_errors=True)


class BadInput(unittest.TestCase):
    """The crafted log damaged three ways: each gives a named error or "unknown stack", the
    rest of the log is still reported, and nothing crashes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mt-callsite-bad-")
        cls.lines, cls.table_at = crafted_log(cls.tmp)
        cls.stack_at = [i for i in cls.table_at if '"kind": "stack"' in cls.lines[i]]
        assert cls.stack_at

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def write(self, name, lines, tail=""):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n" + tail)
        return path

    def report_of(self, path):
        p = run([MEMTRACE, "report", "--by", "callsite", "--json", path], check=False)
        self.assertIn(p.returncode, (0, 2), p.stderr)
        doc = json.loads(p.stdout)
        return p, doc["processes"][0]

    def test_corrupt_stack_line(self):
        lines = list(self.lines)
        first = self.stack_at[0]
        d = json.loads(lines[first])
        d["id"] = "x"
        lines[first] = json.dumps(d)
        p, proc = self.report_of(self.write("corrupt.ndjson", lines))
        self.assertEqual(p.returncode, 2)
        self.assertRegex(p.stderr, r"stack line.*\"id\"")
        self.assertGreater(proc["peak_allocated"], 0)
        sites = [r["site"] for r in proc["callsites"]["at_peak"]]
        self.assertTrue(any(s.startswith("unknown stack") for s in sites), sites)

    def test_unknown_stack_ids(self):
        lines = [l for i, l in enumerate(self.lines) if i not in set(self.table_at)]
        path = self.write("unknown.ndjson", lines)
        p, proc = self.report_of(path)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = proc["callsites"]["at_peak"]
        self.assertTrue(any(r.get("unknown") for r in rows), rows)
        self.assertTrue(all(r.get("unknown") or r["stack"] == 0 for r in rows), rows)
        out = os.path.join(self.tmp, "unknown.svg")
        run([MEMTRACE, "plot", "--flamegraph", "-o", out, path])
        check_svg(out, ["unknown stack "])

    def test_log_ends_mid_table(self):
        last = self.stack_at[-1]
        cut = self.lines[last][: len(self.lines[last]) // 2]
        p, proc = self.report_of(self.write("cut.ndjson", self.lines[:last], cut))
        self.assertEqual(p.returncode, 2)
        self.assertIn("not JSON", p.stderr)
        self.assertGreater(proc["events"], 0)


class PythonCtypes(unittest.TestCase):
    def test_python_frames_in_stacks(self):
        tmp = tempfile.mkdtemp(prefix="mt-callsite-py-")
        try:
            log = os.path.join(tmp, "py.ndjson")
            prog = os.path.join(HERE, "prog_ctypes.py")
            run(["/usr/bin/python3", prog, os.environ["MT_PRELOAD"], "12"],
                env=base_env(MEMTRACE_BACKEND="sim", MEMTRACE_PROF="log", MEMTRACE_LOG=log,
                             MEMTRACE_STACKS="all", PYTHONDONTWRITEBYTECODE="1"))
            # By stack: alloc() serves every site, so grouped by site they would be one row.
            cs = report(log, "--by", "stack")["callsites"]

            def py(r):
                return [(f["function"], f["line"]) for f in r["frames"] if f["python"]]

            w = find_row(cs["at_peak"], lambda r: ("Encoder.weights", line_of(prog, "SITE-weights")) in py(r))
            self.assertIsNotNone(w, json.dumps(cs["at_peak"], indent=1)[:3000])
            chain = py(w)
            self.assertEqual(chain[0], ("alloc", line_of(prog, "SITE-alloc")))
            self.assertEqual(chain[2], ("main", line_of(prog, "SITE-main-weights")))
            self.assertTrue(all(f["file"].endswith("prog_ctypes.py") for f in w["frames"] if f["python"]))
            self.assertEqual(w["bytes"], 6 << 20)
            g = cs["growth"][0] if cs["growth"] else None
            self.assertIsNotNone(g)
            self.assertIn(("Encoder.forward", line_of(prog, "SITE-history")), py(g))
            self.assertTrue(g["detected"])
            self.assertAlmostEqual(g["slope"], 512 * 1024, delta=1024)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class TrainCharlm(unittest.TestCase):
    def test_activations_resolve_to_forward_and_caller(self):
        tmp = tempfile.mkdtemp(prefix="mt-callsite-charlm-")
        try:
            log = os.path.join(tmp, "charlm.ndjson")
            run([os.environ["MT_TRAIN_CHARLM"], "--epochs", "1", "--hidden", "32", "--batch", "4",
                 "--min-len", "8", "--max-len", "24", "--sample", "20"],
                env=base_env(MEMTRACE_BACKEND="sim", MEMTRACE_SIM_CAPACITY="1G",
                             MEMTRACE_PROF="log", MEMTRACE_LOG=log, MEMTRACE_STACKS="all"))
            cs = report(log, "--top", "50")["callsites"]
            rows = cs["at_peak"]

            # train_charlm and the library linked into it carry DWARF only in builds with
            # debug info: a release build's frames name the function from the symbol table
            # and read train_charlm+0x.. (never "??:0", never a crash).
            exe = os.environ["MT_TRAIN_CHARLM"]
            dwarf = has_line_info(exe)
            mod = os.path.basename(exe)

            def in_example(f):
                if dwarf:
                    return (f["file"] or "").endswith("train_charlm.c")
                return (f["module"] or "").endswith("/" + mod)

            def forward_then_caller(r):
                """The engine's forward function, then a function of the example."""
                fs = r["frames"]
                for i, f in enumerate(fs):
                    if (f["function"] or "").startswith("mt_rnn_forward"):
                        rest = [x for x in fs[i + 1:] if x["function"]]
                        return bool(rest) and in_example(rest[0])
                return False

            a = find_row(rows, forward_then_caller)
            self.assertIsNotNone(a, json.dumps([[f["label"] for f in r["frames"]] for r in rows], indent=1)[:4000])
            i = next(k for k, f in enumerate(a["frames"]) if f["function"].startswith("mt_rnn_forward"))
            fwd = a["frames"][i]
            caller = next(f for f in a["frames"][i + 1:] if f["function"])
            if dwarf:
                self.assertTrue(fwd["file"].endswith("module.c"))
                self.assertGreater(caller["line"], 0)
            else:
                for f in (fwd, caller):
                    self.assertIsNone(f["file"])
                    self.assertEqual(f["line"], 0)
                    self.assertRegex(f["label"], r"^%s \(%s\+0x[0-9a-f]+\)$"
                                     % (re.escape(f["function"]), re.escape(mod)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
