"""What `cuda-debug dump PID` costs the process it asks, on CPU with the fake driver.

    python benchmarks/dump_overhead.py [--seconds 2] [--rounds 3] [--rate 10]

A target process (tests/fake_cuda's driver, so no GPU is needed) watches,
fills the watch ring (65,536 launches), leaves a kernel spinning, then times
every launch of a Python launch loop (perf_counter_ns around each
``cuda_debug.testing.empty()``) for `--seconds`, first with nobody asking,
then while another process runs `dump` against it `--rate` times a second
(0: back to back; each dump: the listener thread scans the whole ring and
sends the document). Printed per
round and phase: launches, the median, p99.9 and maximum launch time, and the
dumps answered with their median round trip. No signal is sent to the target:
its launching thread is never interrupted; what a dump can cost it is the
listener's scan competing for the CPU and the ring's cache lines.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

TARGET = textwrap.dedent('''
    import json, sys, time
    import cuda_debug, cuda_debug.testing as t
    fake.fake_set_async(1)
    seconds = float(sys.argv[1])
    with cuda_debug.watch():
        for _ in range(65536):
            t.empty()
        cuda_debug.check()
        side = fake.fake_stream_create()
        t.spin(600, stream=side)             # something unfinished to report
        for phase in ("alone", "dumped"):
            print("PHASE", phase, flush=True)
            sys.stdin.readline()             # go
            times, end = [], time.monotonic() + seconds
            clock = time.perf_counter_ns
            while time.monotonic() < end:
                a = clock()
                t.empty()
                times.append(clock() - a)
            fake.fake_stream_sync(0)
            print("TIMES " + json.dumps(times), flush=True)
''')

DUMPER = textwrap.dedent('''
    import sys, time
    from cuda_debug import _dump
    pid, seconds, rate = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    rts, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        a = time.perf_counter()
        doc = _dump.ask(pid)
        rts.append(time.perf_counter() - a)
        if rate:
            time.sleep(max(0.0, 1.0 / rate - rts[-1]))
    assert doc["scanned"] > 65000, doc["scanned"]     # (a record being written is skipped)
    print(len(rts), sorted(rts)[len(rts) // 2])
''')


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_round(folder, seconds, rate):
    from fake_cuda import PRELUDE, child_env
    env = dict(os.environ, **child_env(folder))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    target = subprocess.Popen([sys.executable, "-c", "import json, sys\n" + PRELUDE + TARGET,
                               str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    out = {}
    try:
        for phase in ("alone", "dumped"):
            line = target.stdout.readline()
            assert line.startswith("PHASE " + phase), line
            dumper = None
            if phase == "dumped":
                dumper = subprocess.Popen([sys.executable, "-c", DUMPER, str(target.pid),
                                           str(seconds), str(rate)], stdout=subprocess.PIPE,
                                          text=True, env=env)
                time.sleep(0.3)          # its imports
            target.stdin.write("\n")
            target.stdin.flush()
            line = target.stdout.readline()
            times = json.loads(line[len("TIMES "):])
            row = {"launches": len(times), "median_us": statistics.median(times) / 1e3,
                   "p999_us": pct(times, 0.999) / 1e3, "max_us": max(times) / 1e3}
            if dumper is not None:
                n, rt = dumper.communicate(timeout=seconds + 60)[0].split()
                row.update(dumps=int(n), dump_ms=float(rt) * 1e3)
            out[phase] = row
    finally:
        target.kill()
        target.wait()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=10.0, help="dumps a second (0: back to back)")
    ns = p.parse_args(argv)
    import fake_cuda
    folder = fake_cuda.build()
    for r in range(ns.rounds):
        res = one_round(folder, ns.seconds, ns.rate)
        for phase, row in res.items():
            print("round %d %-6s launches %6d  median %6.1f us  p99.9 %7.1f us  max %8.1f us%s"
                  % (r + 1, phase, row["launches"], row["median_us"], row["p999_us"],
                     row["max_us"], "  dumps %d (median %.1f ms each)"
                     % (row["dumps"], row["dump_ms"]) if "dumps" in row else ""))


if __name__ == "__main__":
    main()
