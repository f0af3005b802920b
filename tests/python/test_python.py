"""The memtrace Python package (suite 'python'; run with Debian's /usr/bin/python3).

Environment (from tests/python/meson.build): MT_MEMTRACE (the CLI), MEMTRACE_PRELOAD (the
library), MT_CUDART (the shared libcudart the test program calls through ctypes),
MT_PYTHONPATH (the package's directory). Exit 77 = skipped.
"""
import ctypes
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.environ["MT_PYTHONPATH"]
sys.path.insert(0, PKG)
os.environ.setdefault("MEMTRACE_PROF", "off")  # in-process tests record nothing
os.environ.setdefault("MEMTRACE_BACKEND", "sim")
os.environ.setdefault("MEMTRACE_LOG_LEVEL", "error")

import memtrace  # noqa: E402

MiB = 1 << 20
STEPS = 12


def run(cmd, env=None, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (cmd, p.returncode, p.stdout, p.stderr))
    return p


class TrainingLoopUnderRun(unittest.TestCase):
    """A Python program under `memtrace run` (sim), allocating through libcudart."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mt-python-")
        cls.log = os.path.join(cls.tmp, "log.ndjson")
        cls.stats_path = os.path.join(cls.tmp, "stats.json")
        cls.snap = os.path.join(cls.tmp, "snap.ndjson")
        env = dict(os.environ, PYTHONPATH=PKG, MEMTRACE_PROF="auto")
        env.pop("MEMTRACE_BACKEND", None)
        run([os.environ["MT_MEMTRACE"], "run", "--backend", "sim", "--log", cls.log, "--quiet",
             "--", sys.executable, os.path.join(HERE, "prog_train.py"), os.environ["MT_CUDART"],
             cls.stats_path, cls.snap, str(STEPS)], env=env)
        rep = run([os.environ["MT_MEMTRACE"], "report", "--json", cls.log])
        doc = json.loads(rep.stdout)
        assert doc["malformed"] == 0, doc  # named marks decode too
        procs = doc["processes"]
        assert len(procs) == 1, procs
        cls.report = procs[0]
        with open(cls.stats_path) as f:
            cls.out = json.load(f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_report_names_tags(self):
        self.assertEqual(sorted(self.report["peak_by_tag"]),
                         ["activations", "attn_scratch", "kvcache", "optimizer", "weights"])
        text = run([os.environ["MT_MEMTRACE"], "report", self.log]).stdout
        for t in ("activations", "attn_scratch", "kvcache", "optimizer", "weights"):
            self.assertIn(t, text)

    def test_growth_flags_only_the_leaking_tag(self):
        g = self.report["growth"]
        self.assertTrue(g["detected"], g)
        self.assertEqual(g["iterations"], STEPS + 1)
        self.assertEqual([t["tag"] for t in g["tags"]], ["kvcache"])
        self.assertAlmostEqual(g["tags"][0]["slope_bytes_per_iteration"], 768 * 1024, delta=1)

    def test_stats_agree_with_report(self):
        s = self.out["stats"]
        self.assertEqual(s["allocated_bytes.all.peak"], self.report["peak_allocated"])
        self.assertEqual(s["reserved_bytes.all.peak"], self.report["peak_reserved"])
        for t, peak in self.report["peak_by_tag"].items():
            self.assertEqual(s["allocated_bytes.tag.%s.peak" % t], peak, t)
        self.assertEqual(s["allocated_bytes.tag.kvcache.current"], STEPS * 768 * 1024)
        self.assertEqual(s["allocated_bytes.tag.activations.current"], 0)
        self.assertEqual(s["allocated_bytes.tag.weights.current"], 16 * MiB)
        for k in ("num_alloc_retries", "num_ooms", "allocated_bytes.large_pool.current",
                  "requested_bytes.all.current", "segment.all.peak"):
            self.assertIn(k, s)
        self.assertEqual(s["num_ooms"], 0)
        self.assertEqual(self.out["tag_after"], "other")
        self.assertIn("kvcache", self.out["summary"])

    def test_marks_in_log(self):
        iters, named = 0, 0
        with open(self.log) as f:
            for line in f:
                r = json.loads(line)
                if r.get("kind") == "mark" and r.get("mark") == "iteration":
                    iters += 1
                if r.get("kind") == "mark_named":
                    self.assertEqual(r["name"], "step_done")
                    named += 1
        self.assertEqual((iters, named), (STEPS + 1, STEPS))

    def test_read_log_both_forms(self):
        """read_log gives the same dicts from the run's NDJSON log and its binary form, and
        they are the lines' own; damage costs only itself and is named."""
        with open(self.log) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        self.assertGreater(sum(r.get("kind") == "alloc" for r in lines), STEPS)
        binlog = os.path.join(self.tmp, "log.mtlog")
        run([os.environ["MT_MEMTRACE"], "convert", "--to", "binary", self.log, "-o", binlog])
        self.assertEqual(list(memtrace.read_log(self.log)), lines)
        self.assertEqual(list(memtrace.read_log(binlog, memtrace_cli=os.environ["MT_MEMTRACE"])),
                         lines)
        # A copy cut short inside its last block: every record before the cut, then the
        # error naming the bytes lost.
        with open(binlog, "rb") as f:
            data = f.read()
        cut = os.path.join(self.tmp, "cut.mtlog")
        with open(cut, "wb") as f:
            f.write(data[:len(data) - 7])
        got = []
        with self.assertRaisesRegex(memtrace.MemtraceError, "damaged binary log: bytes"):
            for r in memtrace.read_log(cut, memtrace_cli=os.environ["MT_MEMTRACE"]):
                got.append(r)
        self.assertTrue(got and got == lines[:len(got)], len(got))
        # An NDJSON line that is no record: the others, then its line number.
        bad = os.path.join(self.tmp, "bad.ndjson")
        with open(self.log) as src, open(bad, "w") as f:
            text = src.read().splitlines(True)
            f.writelines(text[:3] + ["{\"v\":1,\n"] + text[3:])
        got = []
        with self.assertRaisesRegex(memtrace.MemtraceError, "1 damaged part: line 4: "):
            for r in memtrace.read_log(bad):
                got.append(r)
        self.assertEqual(got, lines)
        self.assertEqual(list(memtrace.read_log(bad, skip_damaged=True)), lines)

    def test_log_and_snapshot_match_the_schema(self):
        node = shutil.which("node")
        if node is None:
            self.skipTest("node is not installed")
        root = os.path.dirname(os.path.dirname(HERE))
        p = run([node, os.path.join(root, "tests", "prof", "validate.mjs"),
                 os.path.join(root, "docs", "telemetry.schema.json"), self.log, self.snap],
                check=False)
        if p.returncode == 77:
            self.skipTest("ajv missing: npm ci --prefix tests/prof")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_snapshot_blocks_carry_tags(self):
        with open(self.snap) as f:
            recs = [json.loads(line) for line in f]
        self.assertEqual([r["type"] for r in recs], ["snapshot"])
        tags = [b["tag"] for seg in recs[0]["segments"] for b in seg["blocks"]
                if b["state"] == "allocated"]
        self.assertEqual(tags.count("kvcache"), STEPS)
        self.assertEqual(tags.count("weights"), 4)


class ManagedUnderRun(unittest.TestCase):
    """memtrace.reinitialize(managed_memory=True), RMM's words, then a program under
    `memtrace run` (sim): the pools' segments are managed memory and the report says so."""

    def test_managed_pool_in_report(self):
        with self.assertRaisesRegex(ValueError, "initial_pool_size"):
            memtrace.reinitialize(managed_memory=True, initial_pool_size=1 << 30)
        # Here the drop-in is loaded and its allocator made: not managed, and it stays so.
        memtrace.stats()
        saved = os.environ.get("MEMTRACE_ALLOC_CONF")
        with self.assertRaisesRegex(memtrace.MemtraceError, "managed_memory"):
            memtrace.reinitialize(managed_memory=True)
        self.assertEqual(os.environ.get("MEMTRACE_ALLOC_CONF"), saved)
        # A fresh process (no allocator made yet) composes the config for its children.
        env = dict(os.environ, PYTHONPATH=PKG,
                   MEMTRACE_ALLOC_CONF="max_split_size_mb:64,managed_memory:False")
        conf = run([sys.executable, "-c", "import memtrace, os; "
                    "c = memtrace.reinitialize(managed_memory=True); "
                    "assert os.environ['MEMTRACE_ALLOC_CONF'] == c; print(c)"],
                   env=env).stdout.strip()
        self.assertEqual(conf, "max_split_size_mb:64,managed_memory:True")
        env = dict(os.environ, PYTHONPATH=PKG, MEMTRACE_PROF="auto", MEMTRACE_ALLOC_CONF=conf)
        env.pop("MEMTRACE_BACKEND", None)
        tmp = tempfile.mkdtemp(prefix="mt-managed-")
        try:
            log = os.path.join(tmp, "log.ndjson")
            run([os.environ["MT_MEMTRACE"], "run", "--backend", "sim", "--log", log, "--quiet",
                 "--", sys.executable, os.path.join(HERE, "prog_train.py"),
                 os.environ["MT_CUDART"], os.path.join(tmp, "stats.json"),
                 os.path.join(tmp, "snap.ndjson"), "3"], env=env)
            doc = json.loads(run([os.environ["MT_MEMTRACE"], "report", "--json", log]).stdout)
            proc = doc["processes"][0]
            m = proc["managed"]
            self.assertEqual(m["managed_peak_bytes"], proc["peak_reserved"])
            self.assertGreater(m["managed_peak_bytes"], 0)
            text = run([os.environ["MT_MEMTRACE"], "report", log]).stdout
            self.assertIn("managed memory:", text)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class ManagedThroughDropIn(unittest.TestCase):
    """A program's own cudaMallocManaged under `memtrace run` (sim) is memtrace's, and
    memtrace.prefetch / memtrace.advise on it are recorded."""

    def test_prefetch_and_advise_recorded(self):
        env = dict(os.environ, PYTHONPATH=PKG, MEMTRACE_PROF="auto")
        env.pop("MEMTRACE_BACKEND", None)
        tmp = tempfile.mkdtemp(prefix="mt-mprefetch-")
        try:
            log, out = os.path.join(tmp, "log.ndjson"), os.path.join(tmp, "out.json")
            run([os.environ["MT_MEMTRACE"], "run", "--backend", "sim", "--log", log, "--quiet",
                 "--", sys.executable, os.path.join(HERE, "prog_managed.py"),
                 os.environ["MT_CUDART"], out], env=env)
            with open(out) as f:
                got = json.load(f)
            self.assertEqual(len(got["managed_devices"]), 1)
            m = got["managed_devices"][0]["managed"]
            self.assertEqual(m["prefetches"], 2)
            self.assertEqual(m["prefetch_bytes"], (4 << 20) + (2 << 20))
            self.assertEqual(m["advises"], 1)
            self.assertIn("memtrace.prefetch", got["refused"])
            proc = json.loads(run([os.environ["MT_MEMTRACE"], "report", "--json",
                                   log]).stdout)["processes"][0]
            self.assertEqual(proc["managed"]["prefetches"], 2)
            self.assertEqual(proc["managed"]["advises"], 1)
            with open(log) as f:
                kinds = [json.loads(l).get("kind") for l in f if '"type":"event"' in l]
            self.assertGreaterEqual(kinds.count("managed"), 3)
            self.assertEqual(kinds.count("alloc"), 1)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class LiveInTop(unittest.TestCase):
    """A daemon on a private socket; `memtrace top` shows the program's tags by name."""

    def test_top_shows_tags(self):
        tmp = tempfile.mkdtemp(prefix="mt-py-top-")
        sock = os.path.join(tmp, "d.sock")
        env = dict(os.environ, PYTHONPATH=PKG, MEMTRACE_SOCKET=sock, MEMTRACE_PROF="auto")
        env.pop("MEMTRACE_BACKEND", None)
        mt = os.environ["MT_MEMTRACE"]
        daemon = subprocess.Popen([mt, "daemon", "--foreground", "--quiet", "--port", "off",
                                   "--socket", sock], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        ready, stop = os.path.join(tmp, "ready"), os.path.join(tmp, "stop")
        prog = None
        try:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            prog = subprocess.Popen([mt, "run", "--backend", "sim", "--quiet", "--",
                                     sys.executable, os.path.join(HERE, "prog_hold.py"),
                                     os.environ["MT_CUDART"], ready, stop], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(400):
                if os.path.exists(ready):
                    break
                time.sleep(0.05)
            self.assertTrue(os.path.exists(ready), "the program never got ready")
            time.sleep(0.3)  # the daemon drains the ring on its own beat
            text = run([mt, "top", "--once", "--socket", sock], env=env).stdout
            if os.environ.get("MT_SHOW"):
                print(text)
            self.assertIn("encoder.lstm", text)
            self.assertIn("decoder.proj", text)
            state = json.loads(run([mt, "top", "--json", "--socket", sock], env=env).stdout)
            mine = [p for p in state["processes"] if p["pid"] != os.getpid()]
            tags = {t["name"]: t for p in mine for t in p["tags"]}
            self.assertIn("encoder.lstm", tags)
        finally:
            open(stop, "w").close()
            if prog is not None:
                prog.wait(30)
            daemon.terminate()
            daemon.wait(30)
            shutil.rmtree(tmp, ignore_errors=True)


class InProcess(unittest.TestCase):
    """The library loaded by path into this process (no `memtrace run`): the preload's own
    cudaMalloc is called through the handle, on the sim backend."""

    @classmethod
    def setUpClass(cls):
        L = memtrace._lib.lib()
        L.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        L.cudaFree.argtypes = [ctypes.c_void_p]
        cls.L = L

    def malloc(self, n):
        p = ctypes.c_void_p()
        self.assertEqual(self.L.cudaMalloc(ctypes.byref(p), n), 0)
        return p.value

    def test_tag_nests_and_restores(self):
        self.assertEqual(memtrace.current_tag(), "other")
        with memtrace.tag("outer_t"):
            self.assertEqual(memtrace.current_tag(), "outer_t")
            with memtrace.tag("weights"):
                self.assertEqual(memtrace.current_tag(), "weights")
            self.assertEqual(memtrace.current_tag(), "outer_t")
        self.assertEqual(memtrace.current_tag(), "other")
        self.assertEqual(memtrace.tag_id("weights"), 1)

    def test_tag_restored_on_exception(self):
        with self.assertRaises(ZeroDivisionError):
            with memtrace.tag("boom"):
                1 / 0
        self.assertEqual(memtrace.current_tag(), "other")

    def test_decorator(self):
        @memtrace.tag("deco")
        def f(x):
            return memtrace.current_tag(), x
        self.assertEqual(f(3), ("deco", 3))
        self.assertEqual(f.__name__, "f")
        self.assertEqual(memtrace.current_tag(), "other")

    def test_tag_is_per_thread(self):
        seen = {}
        inside, done = threading.Event(), threading.Event()

        def worker():
            with memtrace.tag("thread_t"):
                seen["worker"] = memtrace.current_tag()
                inside.set()
                done.wait(10)
        t = threading.Thread(target=worker)
        t.start()
        inside.wait(10)
        seen["main"] = memtrace.current_tag()
        done.set()
        t.join()
        self.assertEqual(seen, {"worker": "thread_t", "main": "other"})

    def test_allocations_carry_the_tag_and_stats(self):
        memtrace.reset_peak()
        with memtrace.tag("stats_t"):
            p = self.malloc(3 * MiB)
        q = self.malloc(1 * MiB)
        s = memtrace.stats()
        self.assertEqual(s["allocated_bytes.tag.stats_t.current"], 3 * MiB)
        self.assertGreaterEqual(s["allocated_bytes.all.current"], 4 * MiB)
        self.assertGreaterEqual(s["reserved_bytes.all.current"], s["allocated_bytes.all.current"])
        self.assertIn("stats_t", memtrace.summary())
        self.assertEqual(self.L.cudaFree(p), 0)
        self.assertEqual(self.L.cudaFree(q), 0)
        s = memtrace.stats()
        self.assertEqual(s["allocated_bytes.tag.stats_t.current"], 0)
        self.assertEqual(s["allocated_bytes.tag.stats_t.peak"], 3 * MiB)
        memtrace.reset_peak()
        self.assertEqual(memtrace.stats()["allocated_bytes.tag.stats_t.peak"], 0)
        self.assertGreater(memtrace.stats()["reserved_bytes.all.current"], 0)
        memtrace.empty_cache()
        self.assertEqual(memtrace.stats()["reserved_bytes.all.current"],
                         memtrace.stats()["allocated_bytes.all.current"])

    def test_oom_observer_gets_the_figures(self):
        seen = []

        def observer(device, alloc, device_allocated, device_free):
            # the allocator's lock is released: stats() may be called here
            seen.append((device, alloc, device_allocated, device_free,
                         memtrace.stats()["allocated_bytes.all.current"]))
        keep = self.malloc(2 * MiB)
        memtrace.attach_out_of_memory_observer(observer)
        try:
            huge = 1 << 50  # beyond the sim device, below the allocator's size bound
            p = ctypes.c_void_p()
            self.assertNotEqual(self.L.cudaMalloc(ctypes.byref(p), huge), 0)
            self.assertEqual(len(seen), 1)
            device, alloc, allocated, free, inside = seen[0]
            self.assertEqual((device, alloc), (0, huge))
            self.assertEqual(allocated, inside)
            self.assertGreaterEqual(allocated, 2 * MiB)
            raw = memtrace._raw_stats()["devices"][0]
            self.assertLessEqual(free, raw["capacity"])
            # an exception in the observer is printed, the request still just fails
            import io
            err, sys.stderr = sys.stderr, io.StringIO()

            def broken(*args):
                raise RuntimeError("observer boom")
            memtrace.attach_out_of_memory_observer(broken)
            try:
                self.assertNotEqual(self.L.cudaMalloc(ctypes.byref(p), huge), 0)
                printed = sys.stderr.getvalue()
            finally:
                sys.stderr = err
                memtrace.detach_out_of_memory_observer(broken)
            self.assertIn("observer boom", printed)
            self.assertEqual(len(seen), 2)
        finally:
            memtrace.detach_out_of_memory_observer(observer)
        self.assertNotEqual(self.L.cudaMalloc(ctypes.byref(p), huge), 0)
        self.assertEqual(len(seen), 2)  # detached
        self.assertEqual(self.L.cudaFree(keep), 0)

    def test_scoped_statistics(self):
        before = self.malloc(4 * MiB)
        with memtrace.statistics("outer_s") as outer:
            a = self.malloc(3 * MiB)
            memtrace.push_statistics("inner_s")
            b = self.malloc(2 * MiB)
            self.assertEqual(self.L.cudaFree(b), 0)
            c = self.malloc(1 * MiB)
            inner = memtrace.pop_statistics()
            self.assertEqual(self.L.cudaFree(a), 0)
            self.assertEqual(self.L.cudaFree(c), 0)
        self.assertEqual(inner["peak_bytes"], 2 * MiB)
        self.assertEqual(inner["allocated_bytes"], 3 * MiB)
        self.assertEqual(inner["total_bytes"], 3 * MiB)
        self.assertEqual(inner["freed_bytes"], 2 * MiB)
        self.assertEqual((inner["allocations"], inner["frees"]), (2, 1))
        self.assertEqual(outer.peak_bytes, 5 * MiB)
        self.assertEqual(outer.allocated_bytes, 6 * MiB)
        self.assertEqual(outer.freed_bytes, 6 * MiB)
        self.assertEqual(outer.allocations, 3)
        self.assertEqual(outer.current_bytes, 0)
        with self.assertRaises(memtrace.MemtraceError):
            memtrace.pop_statistics()  # none open
        self.assertEqual(self.L.cudaFree(before), 0)

    def test_memory_stats_has_torchs_keys_and_resets_accumulated(self):
        # torch.cuda.memory_stats()'s keys (torch 2.x, from its documentation), no others.
        want = {"%s.%s.%s" % (st, pool, f)
                for st in ("allocated_bytes", "reserved_bytes", "active_bytes",
                           "inactive_split_bytes", "requested_bytes", "allocation", "segment",
                           "active", "inactive_split")
                for pool in ("all", "small_pool", "large_pool")
                for f in ("current", "peak", "allocated", "freed")}
        want |= {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free", "max_split_size"}
        want |= {"%s.%s" % (st, f) for st in ("oversize_allocations", "oversize_segments")
                 for f in ("current", "peak", "allocated", "freed")}
        s = memtrace.memory_stats()
        self.assertEqual(set(s), want)
        self.assertEqual(s["max_split_size"], -1)  # unlimited, as torch reports it
        p = self.malloc(2 * MiB)
        s = memtrace.memory_stats()
        self.assertGreater(s["allocation.all.allocated"], 0)
        self.assertEqual(self.L.cudaFree(p), 0)
        memtrace.reset_accumulated_memory_stats()
        s = memtrace.memory_stats()
        self.assertEqual(s["allocation.all.allocated"], 0)
        self.assertEqual(s["allocation.all.freed"], 0)
        self.assertEqual(s["allocated_bytes.all.allocated"], 0)
        self.assertEqual(s["num_device_alloc"], 0)
        q = self.malloc(1 * MiB)
        self.assertEqual(self.L.cudaFree(q), 0)
        s = memtrace.memory_stats()
        self.assertEqual(s["allocation.all.allocated"], 1)
        self.assertEqual(s["allocation.all.freed"], 1)
        self.assertEqual(s["allocated_bytes.all.allocated"], s["allocated_bytes.all.freed"])

    def test_set_allocator_settings(self):
        memtrace.set_allocator_settings("max_split_size_mb:64,garbage_collection_threshold:0.9")
        self.assertEqual(memtrace.memory_stats()["max_split_size"], 64 * MiB)
        with self.assertRaisesRegex(memtrace.MemtraceError, "expandable_segments"):
            memtrace.set_allocator_settings("expandable_segments:%s" % (
                "False" if os.environ.get("MEMTRACE_ALLOC_CONF", "").find("expandable_segments:False") < 0
                else "True"))
        with self.assertRaisesRegex(memtrace.MemtraceError, "no_such_key"):
            memtrace.set_allocator_settings("no_such_key:1")
        self.assertEqual(memtrace.memory_stats()["max_split_size"], 64 * MiB)
        memtrace.set_allocator_settings("max_split_size_mb:%d" % (1 << 40))
        self.assertEqual(memtrace.memory_stats()["max_split_size"], (1 << 60))

    def test_pluggable_entry_points_through_ctypes(self):
        # As torch's CUDAPluggableAllocator calls them: function pointers of these signatures.
        L = self.L
        alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                 ctypes.c_void_p)(("memtrace_alloc", L))
        free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                ctypes.c_void_p)(("memtrace_free", L))
        fraction = ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int)(
            ("memtrace_memory_fraction", L))
        base = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_size_t))(("memtrace_base_alloc", L))
        reset = ctypes.CFUNCTYPE(None)(("memtrace_reset", L))
        fraction(1e-9, 0)  # torch.cuda.set_per_process_memory_fraction(1e-9)
        # Under torch a refused request stops the process (torch never checks for NULL);
        # this caller does check.
        os.environ["MEMTRACE_PLUGGABLE_OOM"] = "null"
        try:
            self.assertIsNone(alloc(64 * MiB, 0, None))
        finally:
            del os.environ["MEMTRACE_PLUGGABLE_OOM"]
        fraction(1.0, 0)
        p = alloc(64 * MiB, 0, None)
        self.assertIsNotNone(p)
        size = ctypes.c_size_t()
        self.assertEqual(base(p + 4096, ctypes.byref(size)), p)
        self.assertGreaterEqual(size.value, 64 * MiB)
        free(p, 64 * MiB, 0, None)
        reset()  # torch.cuda.empty_cache()
        s = memtrace.stats()
        self.assertEqual(s["reserved_bytes.all.current"], s["allocated_bytes.all.current"])

    def test_snapshot_file(self):
        with memtrace.tag("snap_t"):
            p = self.malloc(MiB)
        path = os.path.join(tempfile.mkdtemp(prefix="mt-py-snap-"), "s.ndjson")
        memtrace.snapshot(path)
        with open(path) as f:
            rec = json.loads(f.readline())
        self.assertEqual(rec["type"], "snapshot")
        self.assertIn("snap_t", [b["tag"] for s in rec["segments"] for b in s["blocks"]])
        torch_path = os.path.join(os.path.dirname(path), "s.pickle")
        memtrace.snapshot(torch_path, format="torch")
        with open(torch_path, "rb") as f:
            snap = pickle.load(f)  # PyTorch's layout; reading it needs no torch
        frames = [fr["name"] for s in snap["segments"] for b in s["blocks"]
                  for fr in b.get("frames", [])]
        self.assertIn("tag snap_t", frames)
        self.L.cudaFree(p)
        with self.assertRaisesRegex(ValueError, "format"):
            memtrace.snapshot(path, format="xml")
        shutil.rmtree(os.path.dirname(path))

    def test_bad_names(self):
        with self.assertRaisesRegex(ValueError, "empty"):
            memtrace.tag("")
        with self.assertRaisesRegex(ValueError, "at most 24"):
            memtrace.tag("x" * 25)
        with self.assertRaisesRegex(TypeError, "str"):
            memtrace.tag(5)
        with self.assertRaisesRegex(ValueError, "reserved"):
            memtrace.tag("tag9")
        with self.assertRaisesRegex(ValueError, "control"):
            memtrace.tag("a\nb")
        with self.assertRaisesRegex(KeyError, "unknown memtrace tag name 'never_seen'"):
            memtrace.tag("never_seen", create=False)
        with self.assertRaisesRegex(KeyError, "never_seen"):
            memtrace.tag_id("never_seen")

    def test_bad_marks(self):
        memtrace.mark_iteration(0)
        memtrace.mark("forward_begin")
        memtrace.mark("epoch")
        for bad in (-1, 1.5, "3", True):
            with self.assertRaisesRegex(ValueError, "int >= 0"):
                memtrace.mark_iteration(bad)
        with self.assertRaisesRegex(ValueError, "non-empty"):
            memtrace.mark("")
        with self.assertRaisesRegex(ValueError, "mark_iteration"):
            memtrace.mark("iteration")
        with self.assertRaisesRegex(ValueError, "at most 16 bytes"):
            memtrace.mark("a_very_long_mark_name")

    def test_nesting_limit_and_unbalanced_exit(self):
        t = memtrace.tag("deep")
        entered = 0
        with self.assertRaisesRegex(memtrace.MemtraceError, "deeper than 256"):
            for _ in range(300):
                t.__enter__()
                entered += 1
        self.assertEqual(entered, 256)
        for _ in range(entered):
            t.__exit__(None, None, None)
        self.assertEqual(memtrace.current_tag(), "other")
        with self.assertRaisesRegex(memtrace.MemtraceError, "without a matching enter"):
            t.__exit__(None, None, None)

    def test_z_user_tags_run_out(self):
        # Last (alphabetically): takes every remaining user id.
        names = []
        with self.assertRaisesRegex(memtrace.MemtraceError,
                                    r"no tag id left for 'u\d+': all 25 user tags are taken"):
            for i in range(40):
                names.append(memtrace.register_tag("u%d" % i))
        self.assertEqual(names[-1], 31)
        self.assertEqual(memtrace.register_tag("u0"), names[0])  # known names still resolve
        with memtrace.tag("u0"):
            self.assertEqual(memtrace.current_tag(), "u0")
        self.assertEqual(memtrace.current_tag(), "other")


class AsyncBackend(unittest.TestCase):
    """MEMTRACE_ALLOC_CONF=backend:cudaMallocAsync (PyTorch's key): requests go to the
    backend's stream-ordered pool (the sim's model of it), and the package's statistics,
    settings and empty_cache work under it. A child process: the allocator is made once."""

    def test_memory_stats_settings_and_empty_cache(self):
        code = """
import ctypes, memtrace
MiB = 1 << 20
L = memtrace._lib.lib()
L.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
L.cudaFree.argtypes = [ctypes.c_void_p]
p = ctypes.c_void_p()
assert L.cudaMalloc(ctypes.byref(p), 3 * MiB) == 0
s = memtrace.memory_stats()
assert s["allocated_bytes.all.current"] == 3 * MiB, s["allocated_bytes.all.current"]
assert s["reserved_bytes.all.current"] >= 3 * MiB, s["reserved_bytes.all.current"]
assert s["segment.all.current"] == 0 and s["allocated_bytes.large_pool.current"] == 0
try:
    memtrace.set_allocator_settings("backend:native")
    raise SystemExit("backend changed at run time")
except memtrace.MemtraceError as e:
    assert "backend" in str(e), e
memtrace.set_allocator_settings("memory_fraction:0.5")
assert L.cudaFree(p) == 0
assert memtrace.memory_stats()["reserved_bytes.all.current"] >= 3 * MiB  # the pool keeps it
memtrace.empty_cache()
s = memtrace.memory_stats()
assert s["reserved_bytes.all.current"] == 0, s["reserved_bytes.all.current"]
assert s["allocated_bytes.all.peak"] == 3 * MiB
print("ok")
"""
        env = dict(os.environ, MEMTRACE_ALLOC_CONF="backend:cudaMallocAsync",
                   MEMTRACE_BACKEND="sim", PYTHONPATH=PKG)
        p = run([sys.executable, "-c", code], env=env)
        self.assertEqual(p.stdout.strip(), "ok", p.stdout + p.stderr)


class WithoutLibrary(unittest.TestCase):
    def test_clear_error(self):
        tmp = tempfile.mkdtemp(prefix="mt-py-nolib-")
        shutil.copytree(os.path.join(PKG, "memtrace"), os.path.join(tmp, "pkg", "memtrace"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("MEMTRACE_PRELOAD", "LD_PRELOAD", "LD_LIBRARY_PATH")}
        env["PYTHONPATH"] = os.path.join(tmp, "pkg")
        code = ("import memtrace\n"
                "assert not memtrace.available()\n"
                "for f in (lambda: memtrace.mark_iteration(1), lambda: memtrace.mark('x'),\n"
                "          lambda: memtrace.tag('a'), memtrace.stats):\n"
                "    try:\n"
                "        f()\n"
                "    except memtrace.MemtraceUnavailable as e:\n"
                "        print('ERR', e)\n")
        p = run([sys.executable, "-c", code], env=env)
        shutil.rmtree(tmp)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 4, p.stdout + p.stderr)
        for line in lines:
            self.assertIn("memtrace library not found", line)
            self.assertIn("MEMTRACE_PRELOAD", line)


if __name__ == "__main__":
    unittest.main(verbosity=2)
