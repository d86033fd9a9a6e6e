"""``python -m cuda_debug bench``: the GEMM and launch-latency benchmarks.

::

    python -m cuda_debug bench gemm --sizes 256,1024,4096,8192 --dtypes fp32,bf16
    python -m cuda_debug bench gemm --sizes 4096x4096x1024 --modes async,scope --flags sweep \\
        --json gemm.json --csv gemm.csv --plot gemm.png
    python -m cuda_debug bench latency [--modes async,sync] [--json latency.json]

Prints the table on stdout and a progress line on stderr (``--quiet``: none).
Exit status: 0 done, 1 CUDA unavailable or failed, 2 bad arguments.
"""
import argparse
import sys
from typing import List, Optional

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() returns a status."""

    def error(self, message):
        raise _UsageError("%s: error: %s" % (self.prog, message))


class _UsageError(Exception):
    pass


def _flags_arg(text: str):
    """``torch`` (default), ``default``, ``sweep``, or ``name=0|1,...`` with
    names allow_tf32 / tf32, allow_fp16_reduced_precision_reduction / fp16_rr,
    allow_bf16_reduced_precision_reduction / bf16_rr."""
    text = text.strip()
    if text in ("torch", "current", "default", "sweep"):
        return text
    flags = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or value.strip().lower() not in ("0", "1", "true", "false", "on", "off"):
            raise argparse.ArgumentTypeError(
                "%r: expected torch, default, sweep or name=0|1[,name=0|1...]" % item)
        flags[name.strip()] = value.strip().lower() in ("1", "true", "on")
    return flags


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m cuda_debug bench",
                description="GEMM and launch-latency microbenchmarks: what synchronous "
                            "launching costs (see cuda_debug.bench).")
    sub = p.add_subparsers(dest="what", metavar="{gemm,latency}")
    sub.required = True

    g = sub.add_parser("gemm", help="cuBLAS GEMM per launch mode",
                       description="Time cuBLAS GEMMs in each launch mode and print the "
                                   "comparison table (ms per GEMM, TFLOP/s, %% of peak, "
                                   "slowdown vs async).")
    g.add_argument("--sizes", default="256,1024,4096,8192",
                   help="comma-separated N (square) or MxNxK (default: %(default)s)")
    g.add_argument("--dtypes", default="fp32,tf32,bf16",
                   help="of fp32,tf32,fp16,bf16 (default: %(default)s)")
    g.add_argument("--modes", default="async,sync,scope,launch_blocking",
                   help="of async,sync,scope,launch_blocking (default: all)")
    g.add_argument("--flags", type=_flags_arg, default="torch",
                   help="torch.backends.cuda.matmul flags: torch (PyTorch's defaults here), "
                        "default, sweep, or e.g. allow_tf32=1,bf16_rr=0")
    g.add_argument("--api", default="gemmex",
                   help="gemmex (cublasGemmEx), lt (cublasLtMatmul, autotuned) or gemmex,lt")
    g.add_argument("--device", type=int, default=0)
    g.add_argument("--warmup", type=float, default=0.1, help="seconds per row (default 0.1)")
    g.add_argument("--repeats", type=int, default=10, help="timed loops per row (default 10)")
    g.add_argument("--loop-ms", type=float, default=20.0,
                   help="length of one timed loop in ms (default 20)")
    g.add_argument("--samples", type=int, default=None,
                   help="event-timed samples per row (default: 200 ms worth, 10..200)")
    g.add_argument("--no-flush", dest="flush", action="store_false",
                   help="do not flush L2 before the event-timed samples")
    g.add_argument("--check", dest="check", action="store_true", default=None,
                   help="check every product against float64 (default: sizes <= 512^3)")
    g.add_argument("--no-check", dest="check", action="store_false")
    g.add_argument("--json", metavar="PATH", help="write the rows and metadata as JSON")
    g.add_argument("--csv", metavar="PATH", help="write the rows as CSV")
    g.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib)")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress line")

    lat = sub.add_parser("latency", help="empty-kernel launch cost per launch mode",
                         description="Time empty-kernel launches in each launch mode.")
    lat.add_argument("--modes", default="async,sync,scope,launch_blocking")
    lat.add_argument("--device", type=int, default=0)
    lat.add_argument("--launches", type=int, default=1000, help="launches per loop")
    lat.add_argument("--repeats", type=int, default=20, help="timed loops")
    lat.add_argument("--samples", type=int, default=2000, help="single timed launches")
    lat.add_argument("--json", metavar="PATH")
    lat.add_argument("--csv", metavar="PATH")
    lat.add_argument("--quiet", "-q", action="store_true")
    return p


def _run_gemm(args) -> int:
    from . import bench
    res = bench.gemm(sizes=args.sizes, dtypes=args.dtypes, modes=args.modes, flags=args.flags,
                     api=args.api.split(","), device=args.device, warmup=args.warmup,
                     flush=args.flush, repeats=args.repeats, loop_ms=args.loop_ms,
                     samples=args.samples, check=args.check, progress=not args.quiet)
    print(res.table())
    written = []
    if args.json:
        res.to_json(args.json)
        written.append(args.json)
    if args.csv:
        res.to_csv(args.csv)
        written.append(args.csv)
    if args.plot:
        res.plot(args.plot)
        written.append(args.plot)
    if written:
        print("\nwrote " + ", ".join(written))
    return EXIT_OK


def _run_latency(args) -> int:
    from . import bench
    res = bench.launch_latency(modes=args.modes, device=args.device, launches=args.launches,
                               repeats=args.repeats, samples=args.samples,
                               progress=not args.quiet)
    print(res.table())
    if args.json:
        res.to_json(args.json)
    if args.csv:
        res.to_csv(args.csv)
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m cuda_debug bench ...``; `argv` is what follows ``bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        argv = argv[1:]
    try:
        args = parser().parse_args(argv)
    except _UsageError as e:
        sys.stderr.write("%s\n" % e)
        return EXIT_USAGE
    except SystemExit as e:           # --help
        return int(e.code or 0)
    try:
        return _run_gemm(args) if args.what == "gemm" else _run_latency(args)
    except ValueError as e:
        sys.stderr.write("cuda_debug bench %s: %s\n" % (args.what, e))
        return EXIT_USAGE
    except ImportError as e:          # --plot without matplotlib
        sys.stderr.write("cuda_debug bench %s: %s\n" % (args.what, e))
        return EXIT_ERROR
    except RuntimeError as e:         # CudaError and its kin, a failed child
        sys.stderr.write("cuda_debug bench %s: %s\n" % (args.what, e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
