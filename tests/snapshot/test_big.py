#!/usr/bin/env python3
"""A large PyTorch snapshot in bounded memory: `memtrace report`, `report --json` and
`memtrace diff` on files of bench/gen_snapshot.py (~50 MB, separate frame dicts per entry as
PyTorch 2.0 writes them) peak at no more than twice the file's size in RSS (diff: twice both
files'), and read every trace entry (report's event count is the file's).

  test_big.py MEMTRACE GEN_SNAPSHOT [MB]
"""
import os
import subprocess
import sys
import tempfile


def peak(argv):
    """(exit status, stdout, peak RSS in bytes) of argv run as a child."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
        _, status, ru = os.wait4(p.pid, 0)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode(), ru.ru_maxrss * 1024


def main():
    args = sys.argv[1:]
    # Under ASan the RSS holds its quarantine (256 MiB by default) and shadow memory: the
    # bound is the reader's, checked in the other builds; here the reads must still succeed.
    bounded = "--no-rss-bound" not in args
    args = [x for x in args if x != "--no-rss-bound"]
    mt, gen = args[0], args[1]
    mb = float(args[2]) if len(args) > 2 else 50
    if not bounded:
        print("RSS bound not checked: a sanitizer build (ASan's quarantine and shadow memory)")
    entries = int(mb * 1e6 / 930)
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        files = []
        for seed in (1, 2):
            f = os.path.join(d, f"s{seed}.pickle")
            subprocess.run([sys.executable, gen, f, "--entries", str(entries), "--seed",
                            str(seed)], check=True)
            files.append(f)
        a, b = files
        sa, sb = os.path.getsize(a), os.path.getsize(b)
        for name, argv, size in (("report", [mt, "report", a], sa),
                                 ("report --json", [mt, "report", "--json", a], sa),
                                 ("diff", [mt, "diff", a, b], sa + sb)):
            rc, out, rss = peak(argv)
            ok = rc in (0, 4) and (rss <= 2 * size or not bounded)  # diff: 4 when they differ
            print(f"{'ok' if ok else 'FAIL'}: {name}: exit {rc}, peak RSS {rss / 2**20:.0f} MiB"
                  f" for {size / 2**20:.0f} MiB of input ({rss / size:.2f}x, "
                  f"{'bound 2x' if bounded else 'not bounded'})")
            fails += not ok
            if name == "report" and f"{entries} events" not in out and \
                    f"{entries + 1} events" not in out:
                print(f"FAIL: report does not count the file's {entries} trace entries:\n"
                      + out[:300])
                fails += 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
