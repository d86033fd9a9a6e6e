"""What does synchronous launching cost a matmul? The seed articles' table, on this GPU.

Usage:
    python benchmarks/gemm_launch_blocking.py [--sizes 256,512,1024,2048,4096,8192]
        [--dtypes fp32,tf32,bf16] [--modes async,sync,scope,launch_blocking]
        [--quick] [--repeats 10] [--warmup 0.25] [--loop-ms 25]
        [--results benchmarks/RESULTS.md]
        [--png benchmarks/gemm_launch_blocking.png] [--json out.json] [--no-write]

The seed articles claim a constant ~60% slowdown of fp32 matmuls under
CUDA_LAUNCH_BLOCKING=1 (1024: 5.6 -> 8.9, 2048: 32.1 -> 51.7, 4096: 210.3 -> 332.6
"ms per matmul", no GPU named). This script measures, with cuda_debug.bench.gemm
(cuBLAS from C, the same call torch.matmul(a, b, out=c) makes):

    ms per GEMM of a back-to-back loop (one sync at the end), median of loops, in
    async, sync (stream sync after each GEMM), scope (inside
    cuda_debug.launch_blocking()) and launch_blocking (a child process started with
    CUDA_LAUNCH_BLOCKING=1) modes, for fp32 / tf32 / bf16 and sizes 256..8192;

and cuda_debug.bench.launch_latency (empty-kernel launch cost per mode), which
explains the slowdowns: a roughly constant cost per launch, so the relative
slowdown falls with size and rises with faster dtypes.

It prints the tables and writes them to the "gemm_launch_blocking" section of
benchmarks/RESULTS.md (GPU, driver, CUDA, cuBLAS, PyTorch versions and the git
commit included) with a PNG beside it (when matplotlib is installed).
--quick skips 512 and times shorter loops (6 loops of ~10 ms, 0.1 s warm-up):
about half a minute on an H200.
"""
import argparse
import datetime
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import _common  # noqa: E402  (benchmarks/_common.py)

SEED_CLAIM = {1024: (5.6, 8.9), 2048: (32.1, 51.7), 4096: (210.3, 332.6)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    p.add_argument("--dtypes", default="fp32,tf32,bf16")
    p.add_argument("--modes", default="async,sync,scope,launch_blocking")
    p.add_argument("--quick", action="store_true",
                   help="no 512, shorter loops: about half the time")
    p.add_argument("--repeats", type=int, default=10, help="timed loops per row")
    p.add_argument("--warmup", type=float, default=0.25, help="seconds per row")
    p.add_argument("--loop-ms", type=float, default=25.0, help="length of one timed loop")
    p.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--png", default=os.path.join(HERE, "gemm_launch_blocking.png"))
    p.add_argument("--json", default=None)
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = "256,1024,2048,4096,8192"
        args.repeats, args.warmup, args.loop_ms = 6, 0.1, 10.0

    try:                      # share PyTorch's cuBLAS and record its version, when present
        import torch  # noqa: F401
    except ImportError:
        pass
    from cuda_debug import bench

    env = _common.environment()
    started = datetime.datetime.now(datetime.timezone.utc)
    res = bench.gemm(sizes=args.sizes, dtypes=args.dtypes, modes=args.modes, flags="default",
                     repeats=args.repeats, warmup=args.warmup, loop_ms=args.loop_ms,
                     progress=True)
    lat = bench.launch_latency(modes=args.modes, progress=True)
    env = dict(env, cublas=res.meta.get("cublas"),
               sm_clock_seen_mhz=res.meta.get("sm_clock_seen_mhz"))

    report = render(res, lat, env, started)
    print(report)
    if args.json:
        res.to_json(args.json, samples=True)
    if args.no_write:
        return 0
    png_note = ""
    try:
        res.plot(args.png)
        png_note = "\n![slowdown vs size](%s)\n" % os.path.relpath(
            args.png, os.path.dirname(os.path.abspath(args.results)))
    except ImportError as e:
        png_note = "\n(no PNG: %s)\n" % e
    _common.write_results_section(
        args.results, "gemm_launch_blocking",
        "GEMM: what synchronous launching costs (benchmarks/gemm_launch_blocking.py)",
        report + png_note)
    print("\nwrote %s and %s"
          % (args.results, args.png if png_note.startswith("\n!") else "no PNG"))
    return 0


def _md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _cell(r) -> str:
    if r is None:
        return "-"
    if r["mode"] == "async":
        return "%.4g" % r["ms"]
    return "%.4g (%+.0f%%)" % (r["ms"], 100 * (r["slowdown"] - 1)) if math.isfinite(
        r["slowdown"]) else "%.4g" % r["ms"]


def render(res, lat, env, started) -> str:
    rows = res.rows()
    modes = [m for m in ("async", "sync", "scope", "launch_blocking")
             if any(r["mode"] == m for r in rows)]
    lines = ["Run %s on **%s** (sm_%s), driver %s (CUDA %s), cuBLAS %s, PyTorch %s, "
             "cuda_debug %s, commit `%s`." % (
                 started.strftime("%Y-%m-%d %H:%M UTC"), env.get("gpu"),
                 str(env.get("compute_capability", "?")).replace(".", ""), env.get("driver"),
                 env.get("driver_cuda"), env.get("cublas"), env.get("torch", "not installed"),
                 env.get("cuda_debug"), env.get("git_commit"))]
    clocks = env.get("sm_clock_seen_mhz")
    if clocks:
        lines.append("SM clock seen during the GEMMs: %.0f-%.0f MHz (max rated %s MHz)."
                     % (clocks["min"], clocks["max"], env.get("max_sm_clock_mhz")))
    lines.append("")
    lines.append("ms per GEMM (C = A @ B, square n), wall time of a loop of back-to-back "
                 "GEMMs with one sync at the end, median of %d loops; in brackets the "
                 "slowdown vs async. `launch_blocking` ran in a child with "
                 "CUDA_LAUNCH_BLOCKING=%s." % (
                     int(res.array["loops"][0]) if len(res) else 0,
                     (res.meta.get("launch_blocking_child") or {}).get("CUDA_LAUNCH_BLOCKING")))
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        table = []
        for n in sorted(dict.fromkeys(r["m"] for r in rows if r["dtype"] == dtype)):
            by_mode = {r["mode"]: r for r in rows if r["dtype"] == dtype and r["m"] == n}
            asy = by_mode.get("async")
            table.append([str(n)] + [_cell(by_mode.get(m)) for m in modes] +
                         ["%.1f" % asy["tflops"] if asy else "-",
                          "%.0f%%" % asy["pct_peak"] if asy and math.isfinite(asy["pct_peak"])
                          else "-"])
        lines += ["", "**%s**" % dtype, "",
                  _md_table(["n"] + ["%s ms" % m for m in modes] + ["TFLOP/s async", "% peak"],
                            table)]

    seed_rows = []
    for n, (a, b) in SEED_CLAIM.items():
        here = {r["mode"]: r for r in rows
                if r["dtype"] == "fp32" and r["m"] == r["n"] == r["k"] == n}
        if "async" not in here:
            continue
        lb = here.get("launch_blocking") or here.get("scope")
        seed_rows.append([str(n), "%.1f -> %.1f (+%.0f%%)" % (a, b, 100 * (b / a - 1)),
                          "%.4g -> %.4g (%+.0f%%, %s)" % (here["async"]["ms"], lb["ms"],
                                                         100 * (lb["slowdown"] - 1), lb["mode"])
                          if lb else "-"])
    if seed_rows:
        lines += ["", "The seed's claim vs this GPU (fp32, async -> CUDA_LAUNCH_BLOCKING=1):", "",
                  _md_table(["n", "seed articles (ms, no GPU named)", "here (ms per GEMM)"],
                            seed_rows)]

    big = [r for r in rows if min(r["m"], r["n"], r["k"]) >= 2048 and r["p10_ms"] > 0]
    if big:
        def worst(sel):
            w = max(sel, key=lambda r: r["p90_ms"] / r["p10_ms"])
            return "%.3f (%s %d %s)" % (w["p90_ms"] / w["p10_ms"], w["dtype"], w["m"], w["mode"])
        asy = [r for r in big if r["mode"] == "async"]
        lines += ["", "Run-to-run spread for sizes >= 2048, worst p90/p10 over loops: async %s; "
                  "all modes %s (target < 1.05)." % (worst(asy) if asy else "-", worst(big))]

    lines += ["", "Empty-kernel launch cost (cuda_debug.bench.launch_latency), the per-launch "
              "price behind the slowdowns:", "",
              _md_table(["mode", "us per launch", "extra us vs async", "host us per call"],
                        [[r["mode"], "%.2f" % r["us"],
                          "%+.2f" % r["extra_us"] if math.isfinite(r["extra_us"]) else "-",
                          "%.2f" % r["call_us"]] for r in lat.rows()])]
    lines += ["", "Full table:", "", "```", res.table(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
