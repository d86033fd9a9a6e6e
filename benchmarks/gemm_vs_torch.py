"""cuda_debug.bench.gemm next to torch.matmul: same shapes, dtypes and flags.

Usage:
    python benchmarks/gemm_vs_torch.py [--sizes 256,1024,2048,4096,8192]
        [--dtypes fp32,tf32,fp16,bf16] [--flags default|sweep] [--api gemmex,lt]
        [--quick] [--repeats 10] [--warmup 0.25] [--loop-ms 25]
        [--results benchmarks/RESULTS.md] [--json out.json]
        [--no-write]

For every (size, dtype, flags) it times, in one process and one after the other:

    bench   cuda_debug.bench.gemm(mode="async"), for each --api (gemmex: the
            cublasGemmEx call PyTorch makes; lt: cublasLtMatmul with the
            heuristic's choice, as PyTorch's Lt path)
    torch   torch.matmul(a, b, out=c) on torch.randn data, with the same
            torch.backends.cuda.matmul flags (tf32 = fp32 with allow_tf32=True)

both as wall time per GEMM of a loop of back-to-back calls with one
torch.cuda.synchronize() / stream sync at the end (the same loop length), median
of --repeats loops, warm-up by time first. It checks the targets of the GEMM
issue: bench TFLOP/s >= 0.97 x torch's on the same configuration; bf16 8192^3
within 10% of the best matmul rate measured here (and of the 790 TFLOP/s
reference measured on an H200); p90/p10 < 1.05 for sizes >= 2048. Results go to
the "gemm_vs_torch" section of benchmarks/RESULTS.md.
--quick runs 1024,4096,8192 in fp32, tf32 and bf16 with shorter loops.
"""
import argparse
import datetime
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import _common  # noqa: E402  (benchmarks/_common.py)

REFERENCE_BF16_8192_TFLOPS = 790.0   # best matmul rate measured on the H200 (issue #3)


def time_torch(torch, m, n, k, dtype, loop_n, repeats, warmup_s):
    """(median, p10, p90) ms per torch.matmul(a, b, out=c) in loops of loop_n."""
    from cuda_debug.bench import summarize
    tdt = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
           "bf16": torch.bfloat16}[dtype]
    a = torch.randn(m, k, device="cuda", dtype=tdt)
    b = torch.randn(k, n, device="cuda", dtype=tdt)
    c = torch.empty(m, n, device="cuda", dtype=tdt)
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    batch = 1
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
    return summarize(times)


def set_torch_flags(torch, flags):
    m = torch.backends.cuda.matmul
    m.allow_tf32 = bool(flags["allow_tf32"])
    m.allow_fp16_reduced_precision_reduction = bool(flags["allow_fp16_reduced_precision_reduction"])
    m.allow_bf16_reduced_precision_reduction = bool(flags["allow_bf16_reduced_precision_reduction"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,1024,2048,4096,8192")
    p.add_argument("--dtypes", default="fp32,tf32,fp16,bf16")
    p.add_argument("--modes", default=None, help="ignored (async only); accepted for GEMM_ARGS")
    p.add_argument("--flags", default="default", help="default, sweep")
    p.add_argument("--api", default="gemmex,lt")
    p.add_argument("--quick", action="store_true", help="1024,4096,8192 x fp32,tf32,bf16")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=float, default=0.25)
    p.add_argument("--loop-ms", type=float, default=25.0)
    p.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--json", default=None)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.dtypes = "1024,4096,8192", "fp32,tf32,bf16"
        args.repeats, args.warmup, args.loop_ms = 6, 0.1, 10.0

    try:
        import torch
    except ImportError:
        print("gemm_vs_torch: PyTorch is not installed: nothing to compare with")
        return 1
    if not torch.cuda.is_available():
        print("gemm_vs_torch: torch sees no CUDA device")
        return 1
    torch.cuda.init()                     # torch's cuBLAS is loaded first: bench shares it
    torch.zeros(1, device="cuda")
    from cuda_debug import bench

    apis = [a.strip() for a in args.api.split(",") if a.strip()]
    configs = bench.plan(args.sizes, args.dtypes, args.flags, apis=("gemmex",))
    env = _common.environment()
    started = datetime.datetime.now(datetime.timezone.utc)
    m0 = torch.backends.cuda.matmul
    saved = (m0.allow_tf32, m0.allow_fp16_reduced_precision_reduction,
             m0.allow_bf16_reduced_precision_reduction)
    rows, meta = [], None
    try:
        for i, cfg in enumerate(configs):
            shape = (cfg.m, cfg.n, cfg.k)
            ours = {}
            for api in apis:
                res = bench.gemm(sizes=[shape], dtypes=[cfg.dtype], modes=["async"],
                                 flags=cfg.flags, api=api, repeats=args.repeats,
                                 warmup=args.warmup, loop_ms=args.loop_ms, check=False)
                ours[api] = res.rows()[0]
                meta = meta or res.meta
            loop_n = int(ours[apis[0]]["loop_n"])
            set_torch_flags(torch, dict(cfg.flags, allow_tf32=bench.effective_dtype(
                cfg.dtype, cfg.flags) == "tf32"))
            t_ms, t10, t90 = time_torch(torch, cfg.m, cfg.n, cfg.k, cfg.dtype, loop_n,
                                        args.repeats, args.warmup)
            torch_tflops = cfg.flops / (t_ms * 1e-3) / 1e12
            f = cfg.flags
            label = bench.flags_label(cfg.dtype, f["allow_tf32"],
                                      f["allow_fp16_reduced_precision_reduction"],
                                      f["allow_bf16_reduced_precision_reduction"])
            for api in apis:
                r = ours[api]
                rows.append(dict(size=cfg.label, m=cfg.m, dtype=cfg.dtype, api=api, flags=label,
                                 loop_n=loop_n, bench_ms=r["ms"], bench_tflops=r["tflops"],
                                 bench_spread=r["p90_ms"] / r["p10_ms"], torch_ms=t_ms,
                                 torch_tflops=torch_tflops, torch_spread=t90 / t10,
                                 ratio=r["tflops"] / torch_tflops, pct_peak=r["pct_peak"]))
            sys.stderr.write("[%d/%d] %s %s: torch %.4f ms, bench %s\n" % (
                i + 1, len(configs), cfg.label, cfg.dtype, t_ms,
                ", ".join("%s %.4f ms" % (a, ours[a]["ms"]) for a in apis)))
    finally:
        m0.allow_tf32, m0.allow_fp16_reduced_precision_reduction, \
            m0.allow_bf16_reduced_precision_reduction = saved

    env = dict(env, cublas=meta.get("cublas") if meta else None,
               sm_clock_seen_mhz=meta.get("sm_clock_seen_mhz") if meta else None)
    report = render(rows, env, started)
    print(report)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1, default=str)
    if not args.no_write:
        _common.write_results_section(
            args.results, "gemm_vs_torch",
            "GEMM: cuda_debug.bench.gemm vs torch.matmul (benchmarks/gemm_vs_torch.py)", report)
        print("wrote %s" % args.results)
    return 0


def _md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def render(rows, env, started) -> str:
    lines = ["Run %s on **%s**, driver %s (CUDA %s), cuBLAS %s, PyTorch %s (CUDA %s), "
             "cuda_debug %s, commit `%s`." % (
                 started.strftime("%Y-%m-%d %H:%M UTC"), env.get("gpu"), env.get("driver"),
                 env.get("driver_cuda"), env.get("cublas"), env.get("torch"),
                 env.get("torch_cuda"), env.get("cuda_debug"), env.get("git_commit")), "",
             "ms per GEMM, async, back-to-back loop with one sync at the end (same loop length "
             "for both), median of loops; ratio = bench TFLOP/s / torch TFLOP/s (target >= 0.97)."]
    table = [[r["dtype"], r["flags"] or "-", r["size"], r["api"], "%.4f" % r["torch_ms"],
              "%.4f" % r["bench_ms"], "%.1f" % r["torch_tflops"], "%.1f" % r["bench_tflops"],
              "%.3f" % r["ratio"], "%.3f / %.3f" % (r["bench_spread"], r["torch_spread"]),
              "ok" if r["ratio"] >= 0.97 else "**below**"] for r in rows]
    lines += ["", _md_table(["dtype", "flags", "size", "api", "torch ms", "bench ms",
                             "torch TFLOP/s", "bench TFLOP/s", "ratio", "p90/p10 bench / torch",
                             "target"], table)]

    gemmex = [r for r in rows if r["api"] == "gemmex"]
    n_ok = sum(r["ratio"] >= 0.97 for r in gemmex)
    lines += ["", "Target 1 (bench >= 0.97 x torch, cublasGemmEx): %d of %d configurations%s."
              % (n_ok, len(gemmex), "" if n_ok == len(gemmex) else "; below: " + ", ".join(
                  "%s %s %.3f" % (r["dtype"], r["size"], r["ratio"])
                  for r in gemmex if r["ratio"] < 0.97))]
    best_rows = [r for r in rows if r["dtype"] == "bf16" and r["size"] == "8192"
                 and r["flags"] == "rr=on"]
    if best_rows:
        best = max([REFERENCE_BF16_8192_TFLOPS] + [r["torch_tflops"] for r in best_rows]
                   + [r["bench_tflops"] for r in best_rows])
        parts = ["%s %.1f TFLOP/s = %.1f%%" % (r["api"], r["bench_tflops"],
                                               100 * r["bench_tflops"] / best) for r in best_rows]
        top = max(r["bench_tflops"] for r in best_rows)
        lines.append("Target 2 (bf16 8192^3 within 10%% of the best rate measured, %.1f "
                     "TFLOP/s incl. the 790 reference): %s: %s." % (
                         best, ", ".join(parts), "met" if top >= 0.9 * best else "**not met**"))
    big = [r for r in rows if r["m"] >= 2048]
    if big:
        worst = max(big, key=lambda r: r["bench_spread"])
        lines.append("Target 3 (p90/p10 < 1.05 for sizes >= 2048): worst %.3f (%s %s %s): %s."
                     % (worst["bench_spread"], worst["dtype"], worst["size"], worst["api"],
                        "met" if worst["bench_spread"] < 1.05 else "**not met**"))
    clocks = env.get("sm_clock_seen_mhz")
    if clocks:
        lines.append("SM clock seen during bench.gemm: %.0f-%.0f MHz." % (clocks["min"],
                                                                        clocks["max"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
