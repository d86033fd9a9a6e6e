"""What carrying the verdict onto every CUDA error costs while no fault has happened
(cuda_debug/_notes.py: sys.monitoring's RAISE event with a C callback, 3.12+).

The only thing it adds is one C call per exception raised in Python code, armed from
the first watch() until the last one closes. Measured: nanoseconds per raise-and-catch
of a KeyError (a dict miss in try/except, the commonest raise in hot Python code), and a
tiny torch op loop (no raise: should not move), in

    never    a fresh process that never imported cuda_debug
    watched  inside watch() (armed, no fault)
    after    after the watch closed (disarmed)

fresh processes, alternating, `--pairs` times; prints one JSON line of medians and
ranges, ratios against `never`.

    python benchmarks/verdict_notes.py [--pairs 5] [--n 200000]
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _common  # noqa: E402  (beside this file)

CHILD = r"""
import sys, time, json
mode, n = sys.argv[1], int(sys.argv[2])
import torch
x = torch.ones(16, device="cuda")
torch.cuda.synchronize()
def raises():
    d = {}
    t = time.perf_counter()
    for i in range(n):
        try:
            d[i]
        except KeyError:
            pass
    return (time.perf_counter() - t) / n * 1e9
def ops(k=20000):
    global x
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(k):
        x = x + 1
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / k * 1e6
raises(); ops(2000)
out = {}
if mode == "never":
    out = dict(raise_ns=min(raises() for _ in range(3)), op_us=min(ops() for _ in range(3)))
else:
    sys.path.insert(0, %r)
    import cuda_debug
    from cuda_debug import _notes
    if mode == "watched":
        with cuda_debug.watch():
            out = dict(raise_ns=min(raises() for _ in range(3)), op_us=min(ops() for _ in range(3)),
                       armed=_notes.armed())
    else:
        with cuda_debug.watch():
            ops(2000)
        out = dict(raise_ns=min(raises() for _ in range(3)), op_us=min(ops() for _ in range(3)),
                   armed=_notes.armed())
print("RESULT " + json.dumps(out))
""" % ROOT


def run(mode, n):
    return _common.child_result([sys.executable, "-c", CHILD, mode, str(n)], dict(os.environ),
                                300, mode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--n", type=int, default=200000)
    a = ap.parse_args()
    modes = ["never", "watched", "after"]
    got = {m: [] for m in modes}
    for i in range(a.pairs):
        for m in modes[i % 3:] + modes[:i % 3]:          # rotating order
            got[m].append(run(m, a.n))
    out = {"python": sys.version.split()[0], "pairs": a.pairs}
    for m in modes:
        for k in ("raise_ns", "op_us"):
            v = [g[k] for g in got[m]]
            out["%s_%s" % (m, k)] = round(statistics.median(v), 2)
            if m != "never":
                base = [g[k] for g in got["never"]]
                r = [x / y for x, y in zip(v, base)]
                out["%s_%s_ratio" % (m, k)] = [round(statistics.median(r), 3),
                                               round(min(r), 3), round(max(r), 3)]
        if m != "never":
            out["%s_armed" % m] = got[m][0].get("armed")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
