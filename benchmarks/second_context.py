"""The launch hooks' cost in a second context: per-launch host time of a CUDA 12
runtime library's launches (.cu12rt/libcu12rt.so: tests/cuda12_runtime/build.sh)
under watch(), in the primary context once its kernel is known there (the warm
path: the kernel table's slot), and in a context made with cuCtxCreate (the
kernel's slot belongs to the primary context: csrc/hooks/runtime_launch.c's
kernel_of asks the driver each time, the cold path), its first launches apart.
The library alone in the process, so its runtime is the hooks' (routed).

    python benchmarks/second_context.py [--cu12rt DIR] [--n 20000] [--first 10]

Prints one JSON line: microseconds per launch (median of 5 rounds each) and the
hooks' counters over each phase.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cu12rt", default=os.environ.get("CD_TEST_CU12RT", os.path.join(ROOT, ".cu12rt")))
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--first", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import cuda_debug
    from cuda_debug import _core
    lib = ctypes.CDLL(os.path.join(a.cu12rt, "libcu12rt.so"))
    P, I, F, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t
    lib.cu12_alloc.restype, lib.cu12_alloc.argtypes = P, [Z]
    lib.cu12_scale_launch.restype, lib.cu12_scale_launch.argtypes = I, [P, I, F, P]
    lib.cu12_sync.restype = I
    cu = ctypes.CDLL("libcuda.so.1")
    launch = lib.cu12_scale_launch
    n_elems = 256

    def per_launch(buf, n):
        lib.cu12_sync()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            launch(buf, n_elems, 1.0, None)
        t1 = time.perf_counter_ns()
        assert lib.cu12_sync() == 0
        return (t1 - t0) / n / 1000.0

    def hooks():
        return dict(_core.stats()["launch_hooks"])

    def delta(h0, h1):
        return {k: h1[k] - h0[k] for k in ("routed", "asked", "handed_back")}

    out = {"n": a.n, "rounds": a.rounds}
    buf = lib.cu12_alloc(n_elems * 4)                  # primary context (the runtime's)
    per_launch(buf, 100)
    out["unwatched_us"] = statistics.median(per_launch(buf, a.n) for _ in range(a.rounds))
    with cuda_debug.watch():
        per_launch(buf, 100)                           # the kernel known in the primary context
        h0 = hooks()
        out["warm_us"] = statistics.median(per_launch(buf, a.n) for _ in range(a.rounds))
        out["warm_hooks"] = delta(h0, hooks())
    dev = ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx2 = P()
    if hasattr(cu, "cuCtxCreate_v2"):
        assert cu.cuCtxCreate_v2(ctypes.byref(ctx2), 0, dev) == 0
    else:
        assert cu.cuCtxCreate_v4(ctypes.byref(ctx2), (ctypes.c_char * 64)(), 0, dev) == 0
    buf2 = lib.cu12_alloc(n_elems * 4)                 # the second context's
    assert buf2
    with cuda_debug.watch():
        h0 = hooks()
        t0 = time.perf_counter_ns()
        for _ in range(a.first):                       # the first launches in the new context
            launch(buf2, n_elems, 1.0, None)
        t1 = time.perf_counter_ns()
        assert lib.cu12_sync() == 0
        out["second_first_us"] = (t1 - t0) / a.first / 1000.0
        out["second_first_hooks"] = delta(h0, hooks())
        h0 = hooks()
        out["second_us"] = statistics.median(per_launch(buf2, a.n) for _ in range(a.rounds))
        out["second_hooks"] = delta(h0, hooks())
    out["cold_over_warm"] = out["second_us"] / out["warm_us"]
    out["hooks_runtime"] = hooks()["runtime"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
