"""The seed question, answered in full, in one run: does CUDA_LAUNCH_BLOCKING=1 slow
torch.backends.cuda.matmul, by how much, at which sizes, under which matmul flags?

Usage (from the repo root, on a GPU machine, after building cuda_debug; about
3-5 minutes on an H200; progress on stderr):

    python benchmarks/seed_question.py --out $OUT/seed.md --plot $OUT/seed.png \\
        [--json $OUT/seed.json] [--sizes 256,512,1024,2048,4096,8192] [--quick]
    python benchmarks/seed_question.py --render $OUT/seed.json --out seed.md   # tables again

What it measures, all in this one run:

1. ``cuda_debug.bench.gemm`` (cublasGemmEx, square n = --sizes) for fp32, tf32,
   fp16 and bf16, fp16/bf16 each with reduced-precision reduction allowed and
   disallowed (``allow_{fp16,bf16}_reduced_precision_reduction``), in the modes
   async / sync / scope / launch_blocking (a ``CUDA_LAUNCH_BLOCKING=1`` child), and
   ``watch`` when this build has ``cuda_debug.watch``.
2. ``torch.matmul(a, b, out=c)`` itself, async (here) and under
   ``CUDA_LAUNCH_BLOCKING=1`` (a child process), for bf16 and fp32 at every size,
   side by side with ``bench.gemm``'s async and launch_blocking rows.
3. The claim that ``torch.cuda.set_sync_debug_mode(1)`` is "equivalent" to
   CUDA_LAUNCH_BLOCKING=1: how long the launch of a ~200 ms kernel
   (``torch.cuda._sleep``) takes to return under each.
4. ``cuda_debug.bench.launch_latency``: the per-launch price behind it all.
5. The targets: ``bench.gemm`` >= 0.97x ``torch.matmul``'s TFLOP/s on every
   configuration, both APIs (cublasGemmEx, cublasLtMatmul with the heuristic's
   choice), timed interleaved, same loop length; p90/p10 <= 1.05 for sizes >= 2048.

The markdown (tables, versions of GPU, driver, CUDA, cuBLAS, PyTorch, the commit -
``$CUDA_DEBUG_COMMIT`` where there is no .git) goes into the ``seed_question``
section of --out (other sections of that file are kept), the plot to --plot,
every number to --json.
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import _common  # noqa: E402  (benchmarks/_common.py)

SECTION = "seed_question"
TITLE = "The seed question: CUDA_LAUNCH_BLOCKING=1 and torch matmuls (benchmarks/seed_question.py)"
SEED_CLAIM = {1024: (5.6, 8.9), 2048: (32.1, 51.7), 4096: (210.3, 332.6)}   # fp32, ms
CHILD_TAG = "SEED_QUESTION_CHILD "
RR_ON = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": True,
         "allow_bf16_reduced_precision_reduction": True}
RR_OFF = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": False,
          "allow_bf16_reduced_precision_reduction": False}
TORCH_DTYPES = ("bf16", "fp32")          # torch.matmul under CUDA_LAUNCH_BLOCKING=1
SLEEP_MS = 200.0


def log(msg: str) -> None:
    sys.stderr.write("[seed_question %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


# ------------------------------------------------------------ torch timing --

def torch_dtype(torch, dtype):
    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}[dtype]


def set_torch_flags(torch, flags: dict) -> None:
    m = torch.backends.cuda.matmul
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.allow_tf32 = bool(flags["allow_tf32"])
        m.allow_fp16_reduced_precision_reduction = bool(
            flags["allow_fp16_reduced_precision_reduction"])
        m.allow_bf16_reduced_precision_reduction = bool(
            flags["allow_bf16_reduced_precision_reduction"])


def time_torch(torch, n, dtype, loop_n, repeats, warmup_s):
    """ms per ``torch.matmul(a, b, out=c)`` in each of `repeats` loops of `loop_n`
    back-to-back calls with one synchronize at the end (bench.gemm's loop)."""
    tdt = torch_dtype(torch, dtype)
    a = torch.randn(n, n, device="cuda", dtype=tdt)
    b = torch.randn(n, n, device="cuda", dtype=tdt)
    c = torch.empty(n, n, device="cuda", dtype=tdt)
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    t0, batch = time.perf_counter(), 1
    while time.perf_counter() - t0 < warmup_s:
        for _ in range(batch):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        batch = min(batch * 2, loop_n)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(loop_n):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / loop_n * 1e3)
    del a, b, c
    return times


def sleep_cycles(torch, ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that take about `ms` on this GPU."""
    probe = 20_000_000
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe // 10)
    torch.cuda.synchronize()
    s.record()
    torch.cuda._sleep(probe)
    e.record()
    torch.cuda.synchronize()
    per_ms = probe / max(s.elapsed_time(e), 1e-3)
    return int(per_ms * ms)


def launch_return_ms(torch, cycles: int):
    """(ms until the launch of a `cycles` sleep kernel returned, ms until it finished)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def sync_debug_rows(torch, cycles: int) -> list:
    """The launch of a ~200 ms kernel: when does it return? (in this process)"""
    import cuda_debug
    rows = []
    ms, total = launch_return_ms(torch, cycles)
    rows.append({"config": "async (default)", "launch_ms": ms, "kernel_ms": total})
    for mode, name in ((1, "torch.cuda.set_sync_debug_mode(1) (\"warn\")"),
                       (2, "torch.cuda.set_sync_debug_mode(2) (\"error\")")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.cuda.set_sync_debug_mode(mode)
            try:
                ms, _ = launch_return_ms_no_sync(torch, cycles)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        rows.append({"config": name, "launch_ms": ms, "kernel_ms": total})
    with cuda_debug.launch_blocking():
        ms, _ = launch_return_ms_no_sync(torch, cycles)
    torch.cuda.synchronize()
    rows.append({"config": "cuda_debug.launch_blocking() scope", "launch_ms": ms,
                 "kernel_ms": total})
    return rows


def launch_return_ms_no_sync(torch, cycles: int):
    """Like launch_return_ms, without the synchronize calls (sync debug mode
    "error" refuses them); the caller synchronises after."""
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    return (time.perf_counter() - t0) * 1e3, None


# --------------------------------------------------------------- the child --

def child_main() -> int:
    """Under CUDA_LAUNCH_BLOCKING=1: torch.matmul loops and the sleep launch."""
    out = {"env": os.environ.get("CUDA_LAUNCH_BLOCKING"), "rows": [], "sleep": None,
           "error": None}
    try:
        spec = json.loads(sys.stdin.read())
        import torch
        torch.zeros(1, device="cuda")
        for item in spec["torch"]:
            set_torch_flags(torch, item["flags"])
            sys.stderr.write("\r[child, CUDA_LAUNCH_BLOCKING=1] torch.matmul %s %d      "
                             % (item["dtype"], item["n"]))
            sys.stderr.flush()
            times = time_torch(torch, item["n"], item["dtype"], item["loop_n"],
                               item["repeats"], item["warmup_s"])
            out["rows"].append(dict(item, times=times))
        sys.stderr.write("\n")
        ms, total = launch_return_ms(torch, spec["sleep_cycles"])
        out["sleep"] = {"config": "CUDA_LAUNCH_BLOCKING=1 (child process)", "launch_ms": ms,
                        "kernel_ms": total}
    except Exception as e:  # reported to the parent, which says so in the results
        out["error"] = "%s: %s" % (type(e).__name__, e)
    sys.stdout.write(CHILD_TAG + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


def run_child(spec: dict) -> dict:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    root = os.path.dirname(HERE)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"],
                          input=json.dumps(spec), stdout=subprocess.PIPE, stderr=None,
                          text=True, env=env, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(CHILD_TAG):
            return json.loads(line[len(CHILD_TAG):])
    return {"env": None, "rows": [], "sleep": None,
            "error": "child exited with %d and no result: %s" % (proc.returncode,
                                                                  proc.stdout[-2000:])}


# --------------------------------------------------------------- measuring --

def measure(args) -> dict:
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("seed_question: torch sees no CUDA device")
    torch.zeros(1, device="cuda")        # torch's cuBLAS is loaded first: bench shares it
    import cuda_debug
    from cuda_debug import bench

    t_start = time.monotonic()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = list(bench.BASE_MODES) + (["watch"] if hasattr(cuda_debug, "watch") else [])
    doc = {"started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python benchmarks/seed_question.py " + " ".join(args.argv),
           "env": _common.environment(), "modes": modes, "sizes": sizes}
    try:
        doc["env"]["torch_blas"] = str(torch.backends.cuda.preferred_blas_library())
    except Exception:
        doc["env"]["torch_blas"] = None
    rep, warm, loop_ms = args.repeats, args.warmup, args.loop_ms
    saved = dict(bench.torch_flags())

    # 1. the sweep: every dtype and flag, every mode
    log("1/5 bench.gemm: %d sizes x fp32,tf32,fp16,bf16 (rr on/off) x %s"
        % (len(sizes), ",".join(modes)))
    res = bench.gemm(sizes=sizes, dtypes=["fp32", "tf32", "fp16", "bf16"], modes=modes,
                     flags=[RR_ON, RR_OFF], warmup=warm, repeats=rep, loop_ms=loop_ms,
                     sample_ms=args.sample_ms, max_samples=50, progress=True)
    doc["sweep"] = {"rows": res.rows(), "meta": res.meta}
    doc["env"]["cublas"] = res.meta.get("cublas")
    doc["env"]["sm_clock_seen_mhz"] = res.meta.get("sm_clock_seen_mhz")

    # 2. the targets: bench (both APIs) vs torch.matmul, interleaved per configuration
    configs = bench.plan(sizes, ["fp32", "tf32", "fp16", "bf16"], [RR_ON, RR_OFF])
    log("2/5 bench.gemm (gemmex, lt) vs torch.matmul, async: %d configurations" % len(configs))
    versus = []
    try:
        for i, cfg in enumerate(configs):
            sys.stderr.write("\r[%d/%d] vs torch: %s      " % (i + 1, len(configs),
                                                              cfg.describe()))
            sys.stderr.flush()
            r = bench.gemm(sizes=[(cfg.m, cfg.n, cfg.k)], dtypes=[cfg.dtype], modes=["async"],
                           flags=cfg.flags, api=["gemmex", "lt"], warmup=warm,
                           repeats=args.target_repeats, loop_ms=loop_ms, samples=3,
                           check=False, progress=False)
            rows = {row["api"]: row for row in r.rows()}
            set_torch_flags(torch, dict(cfg.flags, allow_tf32=bench.effective_dtype(
                cfg.dtype, cfg.flags) == "tf32"))
            times = time_torch(torch, cfg.m, cfg.dtype, int(rows["gemmex"]["loop_n"]),
                               args.target_repeats, warm)
            ms, p10, p90 = bench.summarize(times)
            versus.append({"dtype": cfg.dtype, "flags": cfg.flags_label, "n": cfg.m,
                           "torch": {"ms": ms, "p10": p10, "p90": p90,
                                     "tflops": cfg.flops / (ms * 1e-3) / 1e12},
                           "bench": {api: {k: row[k] for k in ("ms", "p10_ms", "p90_ms",
                                                                "tflops", "loop_n")}
                                     for api, row in rows.items()}})
    finally:
        set_torch_flags(torch, saved)
        sys.stderr.write("\n")
    doc["versus"] = versus

    # 3. torch.matmul itself under CUDA_LAUNCH_BLOCKING=1 (child), and the sleep kernel
    cycles = sleep_cycles(torch, SLEEP_MS)
    torch_rows = [v for v in versus if v["dtype"] in TORCH_DTYPES and v["flags"] in
                  ("rr=on", "tf32=off")]
    spec = {"torch": [{"dtype": v["dtype"], "n": v["n"], "flags": RR_ON,
                       "loop_n": int(v["bench"]["gemmex"]["loop_n"]),
                       "repeats": args.target_repeats, "warmup_s": warm}
                      for v in torch_rows],
            "sleep_cycles": cycles}
    log("3/5 torch.matmul under CUDA_LAUNCH_BLOCKING=1 (child): %d configurations"
        % len(spec["torch"]))
    child = run_child(spec)
    if child.get("error"):
        log("the CUDA_LAUNCH_BLOCKING=1 child failed: %s" % child["error"])
    doc["torch_clb"] = child

    # 4. set_sync_debug_mode vs CUDA_LAUNCH_BLOCKING=1
    log("4/5 a ~%d ms kernel's launch under set_sync_debug_mode and CLB" % SLEEP_MS)
    rows = sync_debug_rows(torch, cycles)
    if child.get("sleep"):
        rows.append(child["sleep"])
    doc["sync_debug"] = {"cycles": cycles, "rows": rows}

    # 5. the per-launch price
    log("5/5 bench.launch_latency")
    lat = bench.launch_latency(modes=modes, launches=500, repeats=10, samples=500,
                               progress=True)
    doc["latency"] = {"rows": lat.rows(), "meta": lat.meta}
    doc["duration_s"] = time.monotonic() - t_start
    log("measured in %.0f s" % doc["duration_s"])
    return doc


# --------------------------------------------------------------- rendering --

def _md(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _ms(v) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return "%.4g" % v


def _pct(new, base) -> str:
    if new is None or base is None or not base or not math.isfinite(new):
        return ""
    return " (%+.0f%%)" % (100.0 * (new / base - 1.0))


def _problems(rows):
    """(dtype, flags label) in run order."""
    from cuda_debug.bench import flags_label
    seen = {}
    for r in rows:
        key = (r["dtype"], flags_label(r["dtype"], r["allow_tf32"], r["allow_fp16_reduced"],
                                       r["allow_bf16_reduced"]))
        seen.setdefault(key, None)
    return list(seen)


def _by_problem(rows):
    from cuda_debug.bench import flags_label
    out = {}
    for r in rows:
        key = (r["dtype"], flags_label(r["dtype"], r["allow_tf32"], r["allow_fp16_reduced"],
                                       r["allow_bf16_reduced"]))
        out.setdefault(key, {}).setdefault(r["m"], {})[r["mode"]] = r
    return out


def _problem_title(dtype, flags):
    names = {"fp32": "fp32 (TF32 off)", "tf32": "tf32 (fp32 with allow_tf32=True)",
             "fp16": "fp16", "bf16": "bf16"}
    rr = {"rr=on": ", reduced-precision reduction allowed (PyTorch's default)",
          "rr=off": ", reduced-precision reduction disallowed"}
    return names[dtype] + rr.get(flags, "")


def render(doc: dict, plot_ref: str = None) -> str:
    env, modes = doc["env"], doc["modes"]
    rows = doc["sweep"]["rows"]
    by = _by_problem(rows)
    lines = []
    lines.append(
        "Run %s on **%s** (sm_%s), driver %s (CUDA %s), cuBLAS %s, PyTorch %s (CUDA %s), "
        "cuda_debug %s, commit `%s`; `%s`; measured in %.0f s."
        % (doc["started"], env.get("gpu"), str(env.get("compute_capability", "?")).replace(".", ""),
           env.get("driver"), env.get("driver_cuda"), env.get("cublas"), env.get("torch"),
           env.get("torch_cuda"), env.get("cuda_debug"), env.get("git_commit"), doc["command"],
           doc.get("duration_s", float("nan"))))
    clocks = env.get("sm_clock_seen_mhz")
    if clocks:
        lines.append("SM clock seen during the sweep: %.0f-%.0f MHz (median %.0f)."
                     % (clocks["min"], clocks["max"], clocks["median"]))

    # the answer in one table: extra us per GEMM, and the slowdown, under CLB
    lines += ["", "### The answer",
              "", "`CUDA_LAUNCH_BLOCKING=1` adds a roughly constant cost to every GEMM "
              "launch; what that costs in percent depends only on how long the GEMM itself "
              "takes. Extra microseconds per GEMM (launch_blocking minus async, ms per GEMM "
              "of a back-to-back loop) and, in brackets, the slowdown:", ""]
    problems = _problems(rows)
    sizes = sorted({r["m"] for r in rows})
    table = []
    for n in sizes:
        cells = [str(n)]
        for p in problems:
            r = by.get(p, {}).get(n, {})
            a, lb = r.get("async"), r.get("launch_blocking")
            if a and lb:
                cells.append("%+.1f us (%.2fx)" % ((lb["ms"] - a["ms"]) * 1e3, lb["ms"] / a["ms"]))
            else:
                cells.append("-")
        table.append(cells)
    lines.append(_md(["n"] + ["%s %s" % p for p in problems], table))
    extra = [(by[p][n]["launch_blocking"]["ms"] - by[p][n]["async"]["ms"]) * 1e3
             for p in problems for n in sizes
             if "launch_blocking" in by.get(p, {}).get(n, {}) and "async" in by[p][n]]
    if extra:
        extra.sort()
        lines += ["", "Over all %d configurations the extra time per GEMM is %.1f-%.1f us "
                  "(median %.1f us): a per-launch cost, not a percentage."
                  % (len(extra), extra[0], extra[-1], extra[len(extra) // 2])]

    # per problem: every mode
    lines += ["", "### Every dtype, flag and mode (bench.gemm, cublasGemmEx)", "",
              "ms per GEMM (C = A @ B, square n), wall time of a loop of back-to-back GEMMs "
              "with one sync at the end, median of loops; in brackets the change vs async. "
              "`launch_blocking` ran in a child with CUDA_LAUNCH_BLOCKING=1"
              + ("; `watch` inside `cuda_debug.watch()`" if "watch" in modes else "") + "."]
    for p in problems:
        lines += ["", "**%s**" % _problem_title(*p), ""]
        body = []
        for n in sizes:
            r = by.get(p, {}).get(n, {})
            a = r.get("async")
            base = a["ms"] if a else None
            body.append([n] + [(_ms(r[m]["ms"]) + _pct(r[m]["ms"], base)) if m in r else "-"
                               for m in modes]
                        + ["%.1f" % a["tflops"] if a else "-",
                           "%.0f%%" % a["pct_peak"] if a and math.isfinite(a["pct_peak"])
                           else "-"])
        lines.append(_md(["n"] + ["%s ms" % m for m in modes] + ["TFLOP/s async", "% peak"],
                         body))

    # the seed claim
    fp32 = by.get(("fp32", "tf32=off"), {})
    claim = [[n, "%.1f -> %.1f (%+.0f%%)" % (c[0], c[1], 100 * (c[1] / c[0] - 1)),
              "%s -> %s%s" % (_ms(fp32[n]["async"]["ms"]), _ms(fp32[n]["launch_blocking"]["ms"]),
                              _pct(fp32[n]["launch_blocking"]["ms"], fp32[n]["async"]["ms"]))]
             for n, c in SEED_CLAIM.items()
             if n in fp32 and "async" in fp32[n] and "launch_blocking" in fp32[n]]
    if claim:
        lines += ["", "The seed articles' claim (fp32, ms per matmul, no GPU named: a constant "
                  "~60%) vs this GPU:", "",
                  _md(["n", "seed articles", "here, async -> CUDA_LAUNCH_BLOCKING=1"], claim)]

    # torch.matmul under CLB, next to bench.gemm
    clb = doc.get("torch_clb") or {}
    lines += ["", "### torch.matmul itself under CUDA_LAUNCH_BLOCKING=1", ""]
    if clb.get("error"):
        lines.append("(the CUDA_LAUNCH_BLOCKING=1 child failed: %s)" % clb["error"])
    if clb.get("rows"):
        from cuda_debug.bench import summarize
        lines += ["ms per `torch.matmul(a, b, out=c)` (PyTorch's default flags), async here "
                  "and in a child with CUDA_LAUNCH_BLOCKING=%s, the same loop as bench.gemm; "
                  "next to bench.gemm's async and launch_blocking rows:" % clb.get("env"), ""]
        versus = {(v["dtype"], v["flags"], v["n"]): v for v in doc["versus"]}
        body = []
        for item in clb["rows"]:
            fl = "rr=on" if item["dtype"] == "bf16" else "tf32=off"     # PyTorch's defaults
            v = versus.get((item["dtype"], fl, item["n"]))
            t_async = v["torch"]["ms"] if v else None
            t_clb = summarize(item["times"])[0]
            b = by.get((item["dtype"], fl), {}).get(item["n"], {})
            body.append([item["dtype"], item["n"], _ms(t_async), _ms(t_clb) + _pct(t_clb, t_async),
                         "%+.1f" % ((t_clb - t_async) * 1e3) if t_async else "-",
                         _ms(b["async"]["ms"]) if "async" in b else "-",
                         (_ms(b["launch_blocking"]["ms"]) + _pct(b["launch_blocking"]["ms"],
                                                                 b["async"]["ms"]))
                         if "launch_blocking" in b and "async" in b else "-"])
        lines.append(_md(["dtype", "n", "torch async ms", "torch CLB ms", "extra us",
                          "bench async ms", "bench launch_blocking ms"], body))

    # sync debug mode
    sd = doc.get("sync_debug") or {}
    if sd.get("rows"):
        lines += ["", "### `torch.cuda.set_sync_debug_mode(1)` is not CUDA_LAUNCH_BLOCKING=1", "",
                  "A %.0f ms kernel (`torch.cuda._sleep`); how long its launch took to return "
                  "(a blocking launch returns when the kernel is done):" % SLEEP_MS, ""]
        lines.append(_md(["configuration", "launch returned after ms", "kernel ms"],
                         [[r["config"], "%.3f" % r["launch_ms"],
                           "%.1f" % r["kernel_ms"] if r.get("kernel_ms") else "-"]
                          for r in sd["rows"]]))
        lines += ["", "set_sync_debug_mode warns (1) or raises (2) when PyTorch code "
                  "synchronises with the host (`.item()`, `.cpu()`, ...): it finds hidden "
                  "synchronisations, it does not make launches synchronous."]

    # launch latency
    lat = (doc.get("latency") or {}).get("rows")
    if lat:
        lines += ["", "### The per-launch price (empty kernel, cuda_debug.bench.launch_latency)",
                  ""]
        lines.append(_md(["mode", "us per launch", "extra us vs async", "host us per call"],
                         [[r["mode"], "%.2f" % r["us"], "%+.2f" % r["extra_us"]
                           if r["extra_us"] is not None and math.isfinite(r["extra_us"]) else "-",
                           "%.2f" % r["call_us"]] for r in lat]))

    # targets
    lines += ["", "### Targets", ""]
    lines += ["bench.gemm vs torch.matmul, async, interleaved per configuration, the same loop "
              "length; ratio = bench TFLOP/s / torch TFLOP/s (target >= 0.97, both APIs; `lt` "
              "is cublasLtMatmul with the heuristic's first choice, as PyTorch's cuBLASLt "
              "path); p90/p10 over loops:", ""]
    body, misses, spreads = [], [], []
    for v in doc["versus"]:
        cells = [v["dtype"], v["flags"] or "-", v["n"], _ms(v["torch"]["ms"])]
        for api in ("gemmex", "lt"):
            b = v["bench"].get(api)
            if not b:
                cells += ["-", "-"]
                continue
            ratio = b["tflops"] / v["torch"]["tflops"] if v["torch"]["tflops"] else float("nan")
            cells += [_ms(b["ms"]), "%.3f%s" % (ratio, "" if ratio >= 0.97 else " **below**")]
            if not ratio >= 0.97:
                misses.append("%s %s %d %s %.3f" % (v["dtype"], v["flags"], v["n"], api, ratio))
            if v["n"] >= 2048:
                spreads.append((b["p90_ms"] / b["p10_ms"], "%s %s %d %s" % (
                    v["dtype"], v["flags"], v["n"], api)))
        if v["n"] >= 2048:
            spreads.append((v["torch"]["p90"] / v["torch"]["p10"], "%s %s %d torch" % (
                v["dtype"], v["flags"], v["n"])))
        body.append(cells)
    lines.append(_md(["dtype", "flags", "n", "torch ms", "gemmex ms", "gemmex ratio", "lt ms",
                      "lt ratio"], body))
    n_ratio = sum(1 for v in doc["versus"] for api in ("gemmex", "lt") if api in v["bench"])
    lines += ["", "Target bench >= 0.97x torch: %d of %d met%s." % (
        n_ratio - len(misses), n_ratio, "" if not misses else "; below: " + "; ".join(misses))]
    for r in rows:
        if r["m"] >= 2048 and r["p10_ms"] > 0:
            spreads.append((r["p90_ms"] / r["p10_ms"], "%s %s %d %s (sweep)" % (
                r["dtype"], r["mode"], r["m"], r["api"])))
    if spreads:
        spreads.sort(reverse=True)
        over = [s for s in spreads if s[0] > 1.05]
        lines.append("Target p90/p10 <= 1.05 for n >= 2048: %d of %d met; worst %.3f (%s)%s."
                     % (len(spreads) - len(over), len(spreads), spreads[0][0], spreads[0][1],
                        "" if not over else "; over: " + "; ".join(
                            "%.3f %s" % s for s in over[:8]) + (" ..." if len(over) > 8 else "")))
    if plot_ref:
        lines += ["", "![CUDA_LAUNCH_BLOCKING=1: extra us per GEMM and slowdown vs size](%s)"
                  % plot_ref]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str) -> str:
    """Left: extra us per GEMM under CUDA_LAUNCH_BLOCKING=1 vs n (flat = a per-launch
    cost); right: the slowdown vs n, one line per dtype and flag."""
    from matplotlib.figure import Figure
    rows = doc["sweep"]["rows"]
    by = _by_problem(rows)
    fig = Figure(figsize=(12, 4.8), dpi=110)
    ax1, ax2 = fig.subplots(1, 2)
    for i, p in enumerate(_problems(rows)):
        pts = sorted((n, r) for n, r in by[p].items() if "async" in r and "launch_blocking" in r)
        if not pts:
            continue
        x = [n for n, _ in pts]
        ls = "--" if p[1] == "rr=off" else "-"
        ax1.plot(x, [(r["launch_blocking"]["ms"] - r["async"]["ms"]) * 1e3 for _, r in pts],
                 ls, marker="o", color="C%d" % (i % 10), label="%s %s" % p)
        ax2.plot(x, [r["launch_blocking"]["ms"] / r["async"]["ms"] for _, r in pts], ls,
                 marker="o", color="C%d" % (i % 10), label="%s %s" % p)
    extra = sorted(y for line in ax1.get_lines() for y in line.get_ydata())
    if extra:   # large GEMMs' run-to-run noise must not hide the small ones' constant cost
        ax1.set_ylim(min(-5.0, extra[0]), max(30.0, 1.5 * extra[int(0.9 * (len(extra) - 1))]))
    sizes = sorted({r["m"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("n (square GEMM)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("extra us per GEMM under CUDA_LAUNCH_BLOCKING=1")
    ax1.set_title("The cost is per launch")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set_ylabel("slowdown vs async (ms per GEMM)")
    ax2.set_title("so it vanishes for large GEMMs (%s)" % doc["env"].get("gpu", ""))
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--child"]:
        return child_main()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="markdown file: its seed_question section is "
                   "written (the rest of the file is kept)")
    p.add_argument("--plot", default=None, help="PNG path (needs matplotlib)")
    p.add_argument("--json", default=None, help="every number, as JSON")
    p.add_argument("--render", metavar="JSON", default=None,
                   help="no GPU: render --out (and --plot) from an earlier --json")
    p.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    p.add_argument("--repeats", type=int, default=10, help="timed loops per sweep row")
    p.add_argument("--target-repeats", type=int, default=15,
                   help="timed loops per row of the torch comparison")
    p.add_argument("--warmup", type=float, default=0.05, help="seconds of warm-up per row")
    p.add_argument("--loop-ms", type=float, default=10.0, help="ms per timed loop")
    p.add_argument("--sample-ms", type=float, default=30.0,
                   help="ms of event-timed single GEMMs per row")
    p.add_argument("--quick", action="store_true", help="256,1024,4096 and shorter loops")
    args = p.parse_args(argv)
    args.argv = argv
    if args.quick:
        args.sizes, args.repeats, args.target_repeats, args.loop_ms = "256,1024,4096", 5, 5, 5.0
    for path in (args.out, args.plot, args.json):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            p.error("the folder of %s does not exist" % path)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:   # tables still written
            log("matplotlib is not installed: no plot")
            args.plot = None

    if args.render:
        with open(args.render, encoding="utf-8") as f:
            doc = json.load(f)
    else:
        doc = measure(args)
        if args.json:
            from cuda_debug.bench._results import jsonable
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(jsonable(doc), f, indent=1)
    plot_ref = None
    if args.plot:
        try:
            plot(doc, args.plot)
            plot_ref = os.path.relpath(os.path.abspath(args.plot),
                                       os.path.dirname(os.path.abspath(args.out)))
        except Exception as e:       # a plot must not cost the tables
            log("plot failed: %s" % e)
    text = render(doc, plot_ref)
    _common.write_results_section(args.out, SECTION, TITLE, text)
    print(text)
    log("wrote %s%s%s" % (args.out, ", " + args.plot if plot_ref else "",
                          ", " + args.json if args.json and not args.render else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
