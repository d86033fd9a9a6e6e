"""``python -m cuda_debug bench``: the GEMM and launch-latency benchmarks.

::

    python -m cuda_debug bench gemm --sizes 256,1024,4096,8192 --dtypes fp32,bf16
    python -m cuda_debug bench gemm --sizes 4096x4096x1024 --modes async,scope --flags sweep \\
        --json gemm.json --csv gemm.csv --plot gemm.png [--force]
    python -m cuda_debug bench latency [--modes async,sync] [--json latency.json]

Prints the table on stdout and a progress line on stderr when stderr is a
terminal (``--progress`` / ``--no-progress`` to force). Every argument and
output path is checked before the GPU is touched: an output file that exists is
not overwritten without ``--force``; ``--plot`` needs matplotlib.
Exit status: 0 done, 1 CUDA unavailable or failed, 2 bad arguments.
Defaults are those of :func:`cuda_debug.bench.gemm` and
:func:`cuda_debug.bench.launch_latency` (read from their signatures).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import importlib.util
import inspect
import os
import sys
from typing import List, Optional

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() returns a status; no
    abbreviated options (``--size`` is not ``--sizes``), here and in every subparser."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(message, usage=self.format_usage())


class UsageError(Exception):
    """A bad command line (main() prints `usage` before it), or a bad output path."""

    def __init__(self, message, usage=""):
        super().__init__(message)
        self.usage = usage


def _default(func, name):
    """The default of `func`'s parameter `name`: the API's signature is the one source."""
    return inspect.signature(func).parameters[name].default


def _csv_default(value) -> str:
    return value if isinstance(value, str) else ",".join(str(v) for v in value)


def flags_arg(text: str):
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


def _progress_args(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show the progress line even when stderr is not a terminal")
    g.add_argument("--no-progress", "--quiet", "-q", dest="progress", action="store_false",
                   help="no progress line")


def _output_args(p, plot: bool):
    p.add_argument("--json", metavar="PATH", help="write the rows and metadata as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the rows as CSV")
    if plot:
        p.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib)")
    p.add_argument("--force", action="store_true", help="overwrite output files that exist")


PROG = "python -m cuda_debug bench"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    from ._gemm import gemm
    from ._latency import launch_latency
    d = lambda name: _default(gemm, name)              # noqa: E731
    p = _Parser(prog=prog,
                description="GEMM and launch-latency microbenchmarks: what synchronous "
                            "launching costs (see cuda_debug.bench).")
    sub = p.add_subparsers(dest="what", metavar="{gemm,latency}")
    sub.required = True

    g = sub.add_parser("gemm", help="cuBLAS GEMM per launch mode",
                       description="Time cuBLAS GEMMs in each launch mode and print the "
                                   "comparison table (ms per GEMM, TFLOP/s, % of peak, "
                                   "slowdown vs async).")
    g.add_argument("--sizes", default=_csv_default(d("sizes")),
                   help="comma-separated N (square) or MxNxK (default: %(default)s)")
    g.add_argument("--dtypes", default=_csv_default(d("dtypes")),
                   help="of fp32,tf32,fp16,bf16 (default: %(default)s)")
    g.add_argument("--modes", default=_csv_default(d("modes")),
                   help="of async,sync,scope,launch_blocking[,watch] (default: %(default)s)")
    g.add_argument("--flags", type=flags_arg, default="torch",
                   help="torch.backends.cuda.matmul flags: torch (the current settings; "
                        "PyTorch's defaults here), default, sweep, or e.g. allow_tf32=1,bf16_rr=0")
    g.add_argument("--api", default=_csv_default(d("api")),
                   help="gemmex (cublasGemmEx), lt (cublasLtMatmul) or gemmex,lt "
                        "(default: %(default)s)")
    g.add_argument("--lt-algos", type=int, default=d("lt_algos"),
                   help="cuBLASLt: 1 = the heuristic's choice (PyTorch's), more = timed "
                        "(default: %(default)s)")
    g.add_argument("--device", type=int, default=d("device"),
                   help="CUDA device ordinal (default: %(default)s)")
    g.add_argument("--warmup", type=float, default=d("warmup"),
                   help="seconds per row (default: %(default)s)")
    g.add_argument("--repeats", type=int, default=d("repeats"),
                   help="timed loops per row (default: %(default)s)")
    g.add_argument("--loop-ms", type=float, default=d("loop_ms"),
                   help="length of one timed loop in ms (default: %(default)s)")
    g.add_argument("--samples", type=int, default=d("samples"),
                   help="event-timed samples per row (default: --sample-ms worth)")
    g.add_argument("--sample-ms", type=float, default=d("sample_ms"),
                   help="time spent on event-timed samples (default: %(default)s)")
    g.add_argument("--no-flush", dest="flush", action="store_false", default=d("flush"),
                   help="do not flush L2 before the event-timed samples")
    g.add_argument("--check", dest="check", action="store_true", default=d("check"),
                   help="check every product against float64 (default: sizes <= 512^3)")
    g.add_argument("--no-check", dest="check", action="store_false",
                   help="check no product")
    _output_args(g, plot=True)
    _progress_args(g)

    dl = lambda name: _default(launch_latency, name)   # noqa: E731
    lat = sub.add_parser("latency", help="empty-kernel launch cost per launch mode",
                         description="Time empty-kernel launches in each launch mode.")
    lat.add_argument("--modes", default=_csv_default(dl("modes")),
                     help="of async,sync,scope,launch_blocking[,watch] (default: %(default)s)")
    lat.add_argument("--device", type=int, default=dl("device"),
                     help="CUDA device ordinal (default: %(default)s)")
    lat.add_argument("--launches", type=int, default=dl("launches"), help="launches per loop")
    lat.add_argument("--repeats", type=int, default=dl("repeats"), help="timed loops")
    lat.add_argument("--samples", type=int, default=dl("samples"), help="single timed launches")
    _output_args(lat, plot=False)
    _progress_args(lat)
    return p


def check_outputs(args) -> List[str]:
    """Output paths usable before any GPU work: their folder exists, they are
    new (or --force), --plot has matplotlib. UsageError / ImportError otherwise."""
    paths = []
    for opt in ("json", "csv", "plot"):
        path = getattr(args, opt, None)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError("--%s %s: the folder %s does not exist" % (opt, path, folder))
        if os.path.isdir(path):
            raise UsageError("--%s %s: is a folder, not a file" % (opt, path))
        if os.path.exists(path) and not args.force:
            raise UsageError("--%s %s: the file exists; use --force to overwrite it"
                             % (opt, path))
        if not os.access(folder, os.W_OK):
            raise UsageError("--%s %s: the folder %s is not writable" % (opt, path, folder))
        if path in paths:
            raise UsageError("--%s %s: the same file is named twice" % (opt, path))
        paths.append(path)
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        raise ImportError("--plot %s needs matplotlib (pip install matplotlib), and it is not "
                          "installed: nothing was run" % args.plot)
    return paths


def _gemm_kwargs(args) -> dict:
    return dict(sizes=args.sizes, dtypes=args.dtypes, modes=args.modes, flags=args.flags,
                api=args.api.split(","), device=args.device, warmup=args.warmup,
                flush=args.flush, repeats=args.repeats, loop_ms=args.loop_ms,
                samples=args.samples, sample_ms=args.sample_ms, check=args.check,
                lt_algos=args.lt_algos, progress=args.progress)


def validate_gemm(args) -> None:
    """The benchmark's own argument checks, without the GPU (ValueError)."""
    from ._config import (check_number, parse_modes, plan)
    parse_modes(args.modes)
    plan(args.sizes, args.dtypes, args.flags, args.api.split(","))
    for name in ("repeats", "lt_algos"):
        check_number(name, getattr(args, name), integer=True)
    for name in ("warmup", "loop_ms", "sample_ms"):
        check_number(name, getattr(args, name), allow_zero=True)
    if args.samples is not None:
        check_number("samples", args.samples, integer=True)
    if args.device < 0:
        raise ValueError("--device %d: expected a device ordinal >= 0" % args.device)


def validate_latency(args) -> None:
    from ._config import check_number, parse_modes
    parse_modes(args.modes)
    for name in ("launches", "repeats", "samples"):
        check_number(name, getattr(args, name), integer=True)
    if args.device < 0:
        raise ValueError("--device %d: expected a device ordinal >= 0" % args.device)


def _write_outputs(res, args) -> List[str]:
    written = []
    if args.json:
        res.to_json(args.json)
        written.append(args.json)
    if args.csv:
        res.to_csv(args.csv)
        written.append(args.csv)
    if getattr(args, "plot", None):
        res.plot(args.plot)
        written.append(args.plot)
    return written


def _run(args) -> int:
    from . import gemm, launch_latency
    if args.what == "gemm":
        res = gemm(**_gemm_kwargs(args))
    else:
        res = launch_latency(modes=args.modes, device=args.device, launches=args.launches,
                             repeats=args.repeats, samples=args.samples,
                             progress=args.progress)
    print(res.table())
    written = _write_outputs(res, args)
    if written:
        print("\nwrote " + ", ".join(written))
    return EXIT_OK


def _unrecognized(top: argparse.ArgumentParser, what: str, extra: List[str]) -> UsageError:
    """``bench gemm --size 256``: the subcommand's usage, and the option meant."""
    import difflib
    sub = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)][0]
    p = sub.choices[what]
    known = [o for o in p._option_string_actions if o.startswith("--")]
    hints = []
    for a in extra:
        if a.startswith("--"):
            hints += ["%s: did you mean %s?" % (a.split("=")[0], m)
                      for m in difflib.get_close_matches(a.split("=")[0], known, n=1)]
    return UsageError("unrecognized arguments: %s%s" % (
        " ".join(extra), " (%s)" % "; ".join(hints) if hints else ""), usage=p.format_usage())


def main(argv: Optional[List[str]] = None, prog: str = PROG) -> int:
    """``python -m cuda_debug bench ...``; `argv` is what follows ``bench``, `prog`
    the command as invoked (``cuda-debug bench``), for help and usage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        argv = argv[1:]
    what = prog                       # messages name the command as typed
    try:
        top = parser(prog)
        args, extra = top.parse_known_args(argv)
        what = "%s %s" % (prog, args.what)
        if extra:                     # said by the command that refused them: bench gemm
            raise _unrecognized(top, args.what, extra)
        (validate_gemm if args.what == "gemm" else validate_latency)(args)
        check_outputs(args)
    except (UsageError, ValueError, TypeError) as e:
        sys.stderr.write("%s%s: error: %s\n" % (getattr(e, "usage", ""), what, e))
        return EXIT_USAGE
    except ImportError as e:          # --plot without matplotlib
        sys.stderr.write("%s: %s\n" % (what, e))
        return EXIT_ERROR
    except SystemExit as e:           # --help
        return int(e.code or 0)
    try:
        return _run(args)
    except (ValueError, TypeError) as e:
        sys.stderr.write("%s: error: %s\n" % (what, e))
        return EXIT_USAGE
    except RuntimeError as e:         # CudaError and its kin, a failed child
        sys.stderr.write("%s: %s\n" % (what, e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
