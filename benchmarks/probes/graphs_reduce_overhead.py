"""Probe (issue 27 item 1): what the report of a cudagraph-trees replay
(torch.compile(mode="reduce-overhead")) has to name the fused source line from.

Runs the scenario of tests/test_graphs_gpu.py::test_torch_compile_reduce_overhead...
in this process and prints, as one JSON document: the error's fields, the node's
launch stack (the frames cuda_debug kept at capture), the Inductor modules loaded,
which of them defines the kernel and the lines that launch it, and Inductor's line
map (PyCodeCache.stack_frames_for_code) for each of those lines.

    python3 benchmarks/probes/graphs_reduce_overhead.py > $OUT/reduce_overhead.json
"""
import json
import sys

import torch

import cuda_debug
from cuda_debug import _report


@torch.compile(mode="reduce-overhead")
def f(w, i):
    return w[i] * 2  # SOURCE


def main():
    w = torch.randn(100, 8, device="cuda")
    good = torch.zeros(4, dtype=torch.long, device="cuda")
    bad = torch.full((4,), 1000, dtype=torch.long, device="cuda")
    out = {}
    try:
        with cuda_debug.watch():
            for _ in range(4):
                f(w, good)  # CALL
            torch.cuda.synchronize()
            f(w, bad)  # BAD CALL
            torch.cuda.synchronize()
    except cuda_debug.CudaError as e:
        for k in ("kernel", "graph_node", "captured_at", "replayed_at", "recorded_at",
                  "provenance", "filename", "lineno", "compiled_function", "exact"):
            out[k] = getattr(e, k, None)
        stack = getattr(e, "launch_stack", None) or []
        out["launch_stack"] = ["%s:%s in %s" % (fs.filename, fs.lineno, fs.name) for fs in stack]
        name = (e.kernel or "").split("(")[0].strip()
        mods = sorted({m.__file__ for m in list(sys.modules.values())
                       if "torchinductor_" in (getattr(m, "__file__", None) or "")})
        out["inductor_modules"] = mods
        cc = sys.modules.get("torch._inductor.codecache")
        frames_for = getattr(getattr(cc, "PyCodeCache", None), "stack_frames_for_code", None)
        lm = getattr(getattr(cc, "PyCodeCache", None), "linemaps", None)
        out["linemap_keys"] = [str(k) for k in list(lm or {})][:20] if lm is not None else None
        per = {}
        for path in mods:
            lines = _report._read_lines(path)
            defines = any(l.startswith(name + " = ") for l in lines)
            calls = [i for i, l in enumerate(lines, 1) if name and name in l and
                     not l.startswith(name + " = ")]
            maps = {}
            for i in calls[:6]:
                try:
                    fr = frames_for(path, i) if frames_for else None
                    maps[i] = [(x.get("filename"), x.get("line"), x.get("name")) for x in fr or ()]
                except Exception as ex:
                    maps[i] = "%s: %s" % (type(ex).__name__, ex)
            per[path] = {"defines": defines, "calls": calls[:6],
                         "call_text": [lines[i - 1].strip()[:120] for i in calls[:6]],
                         "linemap": maps}
        out["modules"] = per
        raw = {}
        for path in mods:
            entry = (lm or {}).get(path)
            if entry:
                lines_, traces = entry[0], entry[1]
                raw[path] = [(l, (t or "")[-400:]) for l, t in zip(lines_, traces)]
            else:
                raw[path] = repr(entry)
        out["linemaps"] = raw
        out["wrapper_source"] = {p: _report._read_lines(p) for p in mods
                                 if per[p]["defines"]}
        out["generated_module"] = (lambda m: m and [m[0], m[2]])(
            _report._generated_module(name, stack))
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
