"""GPU probe (branch dump): `cuda-debug dump PID` and `--json` against a process stuck
in a spinning kernel under watch, and the time the listener takes on the H200.

    python3 benchmarks/probes/dump_report.py

Starts a child that, inside cuda_debug.watch(exact=True), runs 5,000 empty kernels (so the
ring is not empty), launches cuda_debug.testing.spin(60) and waits in
torch.cuda.synchronize(); then, from this process, runs `python -m cuda_debug dump
PID`, `dump --json PID` and `dump --trace` (each timed), checks that the child
wrote nothing to its stderr, and kills it. Prints the two outputs as they are
(for the note and docs/dump.md), then one line:

    SUMMARY dump_rc=0 json_rc=0 names_spin=True line_ok=True child_stderr_clean=True
            dump_ms=... json_ms=... trace_launches=...

About 20 s. Writes only a trace file under a temporary folder (removed).
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

CHILD = textwrap.dedent('''
    import torch, cuda_debug, cuda_debug.testing as t
    torch.zeros(1, device="cuda")
    with cuda_debug.watch(exact=True):              # a marker behind each launch
        for _ in range(5000):
            t.empty()
        t.spin(60)                                   # SPIN
        print("READY", flush=True)
        torch.cuda.synchronize()
''')


def main():
    folder = tempfile.mkdtemp(prefix="cuda_debug_probe_")
    script = os.path.join(folder, "stuck.py")
    with open(script, "w") as f:
        f.write(CHILD)
    spin_line = next(i for i, l in enumerate(CHILD.splitlines(), 1) if "# SPIN" in l)
    child = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "READY", (line, child.stderr.read() if child.poll() else "")
        time.sleep(1.0)
        cmd = [sys.executable, "-m", "cuda_debug", "dump"]
        a = time.perf_counter()
        p = subprocess.run(cmd + [str(child.pid)], capture_output=True, text=True, timeout=60)
        dump_ms = (time.perf_counter() - a) * 1e3
        a = time.perf_counter()
        q = subprocess.run(cmd + ["--json", str(child.pid)], capture_output=True, text=True,
                           timeout=60)
        json_ms = (time.perf_counter() - a) * 1e3
        trace = os.path.join(folder, "t.json")
        subprocess.run(cmd + ["--trace", trace, str(child.pid)], capture_output=True, timeout=60)
        n_trace = 0
        if os.path.exists(trace):
            with open(trace) as f:
                n_trace = sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "launch")
        print("--- cuda-debug dump %d (rc %d)" % (child.pid, p.returncode))
        print(p.stdout + p.stderr)
        print("--- cuda-debug dump --json %d (rc %d)" % (child.pid, q.returncode))
        print(q.stdout[:3000] + q.stderr)
        names = "spin on stream" in p.stdout
        line_ok = "launched at %s:%d in <module>" % (script, spin_line) in p.stdout
        try:
            s = json.loads(q.stdout)["streams"][0]
            json_ok = s["short"] == "spin" and s["lineno"] == spin_line
        except (ValueError, KeyError, IndexError):
            json_ok = False
    finally:
        os.killpg(child.pid, 9)
        child.wait()
    err = child.stderr.read()
    print("SUMMARY dump_rc=%d json_rc=%d names_spin=%s line_ok=%s json_ok=%s "
          "child_stderr_clean=%s dump_ms=%.0f json_ms=%.0f trace_launches=%d"
          % (p.returncode, q.returncode, names, line_ok, json_ok,
             "cuda_debug (watch)" not in err, dump_ms, json_ms, n_trace))
    import shutil
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
