"""What following a CUDA graph's nodes to their launching lines costs at capture time
(cuda_debug/_graphs.py: a C trace function on the capturing thread from capture_begin to
capture_end, for graphs captured while no watch() is open).

A graph of a 48-layer MLP forward written as a Python loop in this file (user code: every
layer's line is an event), captured 10 times per process, in fresh processes:

    never     cuda_debug never imported
    adopt0    imported, CUDA_DEBUG_GRAPH_ADOPT=0 (torch left alone)
    adopt1    imported, the default (nodes followed to their lines)

alternating, `--pairs` rounds; prints one JSON line: median capture time (ms) per mode and
the ratios against `never` (median, min, max).

    python benchmarks/adopt_capture.py [--pairs 3]
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
import os, sys, time, json, statistics
mode = sys.argv[1]
if mode != "never":
    sys.path.insert(0, %r)
    import cuda_debug                    # noqa: F401  (its wrappers of CUDAGraph)
import torch
layers = [torch.nn.Linear(256, 256).cuda() for _ in range(48)]
x = torch.randn(64, 256, device="cuda")
def forward(x):
    for layer in layers:
        x = layer(x)
        x = torch.relu(x)
    return x
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        forward(x)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
times = []
for _ in range(10):
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.cuda.graph(g):
        y = forward(x)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t) * 1e3)
    del g
out = dict(capture_ms=statistics.median(times))
if mode != "never":
    from cuda_debug import _core
    out["adopt_events"] = _core.graph_stats().get("adopt_events")
print("RESULT " + json.dumps(out))
""" % ROOT


def run(mode):
    env = dict(os.environ, **({"CUDA_DEBUG_GRAPH_ADOPT": "0"} if mode == "adopt0" else {}))
    return _common.child_result([sys.executable, "-c", CHILD, mode], env, 300, mode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    a = ap.parse_args()
    modes = ["never", "adopt0", "adopt1"]
    got = {m: [] for m in modes}
    for i in range(a.pairs):
        for m in modes[i % 3:] + modes[:i % 3]:
            got[m].append(run(m))
    out = {"pairs": a.pairs}
    for m in modes:
        v = [g["capture_ms"] for g in got[m]]
        out[m + "_capture_ms"] = round(statistics.median(v), 3)
        if m != "never":
            r = [x / y["capture_ms"] for x, y in zip(v, got["never"])]
            out[m + "_ratio"] = [round(statistics.median(r), 3), round(min(r), 3), round(max(r), 3)]
            out[m + "_adopt_events"] = got[m][0].get("adopt_events")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
