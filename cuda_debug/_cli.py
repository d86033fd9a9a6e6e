"""The command line: ``python -m cuda_debug {run,dump,doctor,bench}`` (also ``cuda-debug``).

``run [--launch-blocking [--all-threads] | --no-watch] [--traceback] script.py args...``
(or ``run ... -m module args...``, or ``run ... - args...`` for a script read from stdin)
    runs the script as ``__main__`` (like ``python -m pdb``) inside
    ``cuda_debug.watch()`` (kernels stay asynchronous; a fault names its launch),
    or inside ``cuda_debug.launch_blocking()`` with ``--launch-blocking``, or
    neither with ``--no-watch``. A CUDA fault is printed as the short report
    (what, which kernel, which line, the device's assert text) instead of a long
    traceback (``--traceback``: the traceback too). Where there is no usable GPU
    or CUPTI, it says so once and runs the script without watching (the rule of
    every cuda_debug entry point). ``--guard`` (or ``CUDA_DEBUG_GUARD=1``) also
    runs it inside ``cuda_debug.guard(all_threads=True)``: an index, label or
    probability that would make a kernel assert raises a GuardError, printed as
    its short report, before anything is launched. Exit status:

    - the script's own (0 when it returns, its ``sys.exit`` code);
    - 1: it raised an exception that is not a sticky CUDA error (including
      non-sticky cuda_debug errors: LaunchError, CudaUnavailableError...);
    - 2: usage error (bad options, no such script);
    - 3: a sticky CUDA error (device assert, illegal address, trap...): the
      CUDA context is dead, the report says where.

``run --hang-after S ...``
    the same, and while a launch stays unfinished for S seconds (with later
    launches queued behind it, or nothing launched: the host waits) every
    stream's oldest unfinished launch is written to stderr; the script goes on.

``run --replay ...``
    the same; when the script dies of an illegal (or misaligned) address with no
    assert text, the report is printed, then the program is replayed (``replay``,
    below) to name the faulting thread, the address and the allocation.

``replay --launch N [--kernel NAME] [--from-watch] [--max-launches M] [--window W]
[--no-torch] [--traceback] script.py args...`` (or ``-m module``, or ``-``)
    re-runs the script with NVIDIA's Sanitizer API, instrumenting only launch N
    (as watch() counted it; with a kernel name, that kernel's launches from N-W
    on, M at most): the first access outside every allocation (for PyTorch:
    outside the live tensors) is reported with its thread, block, address,
    read/write and size, and the allocation it missed (size, offset, shape and
    dtype, the line that allocated it), then the launch fails at its line.
    Exit status 3 when found; 4 when the run did not repeat itself (said why,
    with hints); 1 when the replay cannot run (no Sanitizer API: where it
    looked, what to install); 2 on a usage error. compute-sanitizer's
    ``--kernel-name``, ``--launch-skip`` and ``--launch-count`` are read where
    they map (docs/cli.md).

``dump [--json] [--children] [--trace OUT.json] PID...`` (or ``--pid PID``, ``-p PID``,
py-spy's spelling), ``dump --job [HOST:PORT]``
    print, here, the unfinished launches of running processes that watch
    (``run``, ``watch()``): each answers from a thread of cuda_debug's (no
    signal is sent; a process without cuda_debug is never reached). A torchrun
    agent's PID (or ``--children``): every rank's report and one verdict line.
    ``--job``: every rank of the job, through its c10d TCPStore. Exit status 0
    when every process answered, 1 otherwise.

``doctor [--json]``
    driver, GPUs, where libcuda / CUPTI / cuBLAS were found, whether
    ``CUDA_LAUNCH_BLOCKING`` is set, whether CUPTI is free for
    ``launch_blocking()`` and ``watch()``. Exit status 0 when they work here; 1
    when they do not (no driver, no GPU, CUPTI missing or held by another tool:
    ``"ok": false`` and ``"problem"`` in the JSON, and the verdict says which).

``bench ...``
    the benchmarks (cuda_debug.bench._cli).

Help and usage name the command as it was invoked: ``cuda-debug`` (the console
script) or ``python -m cuda_debug``.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import contextlib
import importlib
import json
import os
import runpy
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _options

EXIT_ERROR, EXIT_USAGE, EXIT_STICKY, EXIT_NOT_REPRODUCED = 1, 2, 3, 4
#: the commands, as USAGE lists them
COMMANDS = ("run", "replay", "dump", "doctor", "bench")
MODULE_PROG = "python -m cuda_debug"

USAGE = """\
usage: {prog} <command> [options]

commands:
  run [--launch-blocking|--no-watch] [--guard] script.py [args...]
                                  run a script; a CUDA fault names its kernel and line
  run [--launch-blocking|--no-watch] [--guard] -m module [args...]
                                  the same for a module
  run [--launch-blocking|--no-watch] [--guard] - [args...]
                                  the same for a script read from stdin
  run --hang-after S script.py [args...]
                                  also report launches stuck S seconds
  run --replay script.py [args...]
                                  after an illegal address, replay it (below)
  replay --launch N [--kernel K] script.py [args...]
                                  re-run it, instrument that launch: the thread,
                                  the address, the tensor it missed
  dump [--json] PID...            the unfinished launches of a watching process
                                  (a torchrun agent: every rank, and a verdict)
  doctor [--json]                 driver, GPU, CUDA/CUPTI/cuBLAS, conflicts
  bench ...                       GEMM and launch-latency benchmarks

options:
  -h, --help                      this help
  --version                       print the version and exit

`{prog} <command> --help` for a command's options.
"""


def prog_name(argv0: Optional[str]) -> str:
    """The command as invoked: ``python -m cuda_debug`` when `argv0` (sys.argv[0])
    is this package's __main__.py, else its file name (``cuda-debug``, the console
    script)."""
    if not argv0 or argv0 in ("-c", "-m"):
        return MODULE_PROG
    name = os.path.basename(argv0)
    if name == "__main__.py":
        return MODULE_PROG
    return name[:-4] if name.lower().endswith(".exe") else name


def main(argv: Optional[List[str]] = None, prog: str = MODULE_PROG) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = USAGE.format(prog=prog)
    if not argv or argv[0] in ("-h", "--help", "help"):
        (sys.stdout if argv else sys.stderr).write(usage)
        return 0 if argv else EXIT_USAGE
    cmd, rest = argv[0], argv[1:]
    if cmd in ("-V", "--version"):
        if rest:
            sys.stderr.write("%s: error: %s takes no arguments, not %s\n"
                             % (prog, cmd, " ".join(rest)))
            return EXIT_USAGE
        from . import __version__
        print("cuda_debug %s" % __version__)
        return 0
    if cmd == "run":
        return run_main(rest, prog)
    if cmd == "replay":
        return replay_main(rest, prog)
    if cmd == "doctor":
        return doctor_main(rest, prog)
    if cmd == "dump":
        return dump_main(rest, prog)
    if cmd == "bench":
        return bench_main(rest, prog)
    sys.stderr.write("%s: error: unknown command %r\n\n%s" % (prog, cmd, usage))
    return EXIT_USAGE


def check_command_line(argv: List[str]) -> None:
    """Parse `argv` (what follows ``cuda-debug``) as its command does, running
    nothing: UsageError, or argparse's SystemExit (said on stderr), when the
    command refuses it. A script's existence is not checked. For tests: a page
    of docs/ cannot show a command or an option that does not exist."""
    if not argv:
        raise UsageError("a command is required")
    cmd, rest = argv[0], argv[1:]
    if cmd in ("-h", "--help", "help", "-V", "--version"):
        if rest:
            raise UsageError("%s takes no arguments, not %s" % (cmd, " ".join(rest)))
    elif cmd == "run":
        parse_run(rest)
    elif cmd == "replay":
        parse_replay(rest)
    elif cmd == "dump":
        parse_dump(rest)
    elif cmd == "doctor":
        _doctor_parser().parse_args(rest)
    elif cmd == "bench":
        from .bench import _cli as bench_cli
        bench_cli.parser().parse_args(rest)
    else:
        raise UsageError("unknown command %r" % cmd)


# -- bench: another module, imported only when asked for ------------------------------

def bench_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    try:
        mod = importlib.import_module("cuda_debug.bench._cli")
    except ModuleNotFoundError as e:
        if e.name != "cuda_debug.bench._cli":
            raise
        sys.stderr.write("%s bench: the bench command is not available in this build "
                         "(cuda_debug.bench._cli is missing)\n" % prog)
        return EXIT_ERROR
    return int(mod.main(argv, prog=prog + " bench") or 0)


# -- run ------------------------------------------------------------------------------

def _parser(prog: str, command: str, description: str) -> argparse.ArgumentParser:
    """A command's parser: named as typed (``cuda-debug run``), options in full
    (no abbreviations: ``--size`` is not ``--sizes``)."""
    return argparse.ArgumentParser(prog="%s %s" % (prog, command), allow_abbrev=False,
                                   description=description)


def _run_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    # (for --help and the usage line: run_main parses by hand)
    p = _parser(prog, "run",
        "Run a Python script (or module, or - for a script read from stdin) as "
        "__main__ inside cuda_debug.watch(); a CUDA fault is reported as "
        "cuda_debug's short report, naming the kernel and the launching line. "
        "Exit status: the script's own; 1 on an exception; 2 on a usage error; 3 "
        "on a sticky CUDA error.")
    p.add_argument("--launch-blocking", action="store_true",
                   help="run the whole script inside cuda_debug.launch_blocking() instead: "
                        "synchronous launches (about 2x slower), the fault raised at its "
                        "launching line")
    p.add_argument("--no-watch", action="store_true",
                   help="neither watch nor block: only translate the errors")
    p.add_argument("--exact", action="store_true",
                   help="watch(exact=True): a completion marker behind every launch, so every "
                        "fault names its launch (a few percent slower); by default the "
                        "always-on watch() names it exactly when the device names the kernel "
                        "(device asserts), else among at most 16 candidates (also "
                        "CUDA_DEBUG_WATCH_EXACT=1)")
    p.add_argument("--all-threads", action="store_true",
                   help="with --launch-blocking: block launches from every thread")
    p.add_argument("--guard", action="store_true",
                   help="also inside cuda_debug.guard(all_threads=True): an index, class label or "
                        "probability that would make a kernel assert raises a GuardError before "
                        "anything is launched (also CUDA_DEBUG_GUARD=1)")
    p.add_argument("--traceback", action="store_true",
                   help="print the full Python traceback too, not only the short report")
    p.add_argument("--replay", action="store_true",
                   help="after an illegal or misaligned address with no assert text, replay the "
                        "program (cuda-debug replay) to name the thread, the address and the "
                        "allocation it missed")
    p.add_argument("--hang-after", metavar="S", type=float,
                   help="while watching: when a launch stays unfinished S seconds (with later "
                        "launches queued behind it, or none launched: the host waits), write "
                        "every stream's oldest unfinished launch to stderr, once per stuck "
                        "launch; the script goes on (default: CUDA_DEBUG_HANG_AFTER, else off)")
    p.add_argument("-m", dest="module", metavar="module",
                   help="run a library module as a script (like python -m)")
    p.add_argument("script", nargs="?", help="the script to run (-: read it from stdin)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


_RUN_FLAGS = {"--launch-blocking": "launch_blocking", "--no-watch": "no_watch",
              "--all-threads": "all_threads", "--traceback": "traceback", "--guard": "guard",
              "--exact": "exact", "--replay": "replay"}


class UsageError(Exception):
    """A command line its command refuses: said as argparse says it (the usage,
    then ``PROG CMD: error: message``), exit status 2."""


def _is_module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """As argparse says it: the usage, then ``PROG CMD: error: message`` (the
    command as typed: ``cuda-debug`` or ``python -m cuda_debug``)."""
    parser.print_usage(sys.stderr)
    sys.stderr.write("%s: error: %s\n" % (parser.prog, message))
    return EXIT_USAGE


#: a valued option of run or replay: (its key, convert(option, value or None))
_Valued = Dict[str, Tuple[str, Callable[[str, Optional[str]], Any]]]


class Program:
    """A command line of run or replay, parsed: our options (`opts`), then the
    program (`target`: a script, a module when `module`, or - for stdin) and its
    own arguments (`args`). `help`: -h or --help came before the program."""

    def __init__(self, opts: Dict[str, Any]):
        self.opts = opts
        self.target: Optional[str] = None
        self.module = False
        self.args: List[str] = []
        self.help = False


def _parse_program(argv: List[str], opts: Dict[str, Any], flags: Dict[str, str],
                   valued: _Valued) -> Program:
    """Parsed by hand, like `python` does: our options come before the script (or
    -m module, or - for stdin); everything after it is the script's, --help
    included. Our options are spelled out in full (no abbreviations, no
    --opt=value). UsageError for what is refused."""
    p = Program(opts)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            p.help = True
            return p
        if a in flags:
            p.opts[flags[a]] = True
        elif a in valued:
            key, convert = valued[a]
            p.opts[key] = convert(a, argv[i + 1] if i + 1 < len(argv) else None)
            i += 1
        elif a == "-m" or (a.startswith("-m") and len(a) > 2):
            p.target = a[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            p.module, p.args = True, argv[i + (1 if a[2:] else 2):]
            break
        elif a in ("--", "-") or not a.startswith("-"):
            j = i + 1 if a == "--" else i
            p.target, p.args = (argv[j], argv[j + 1:]) if j < len(argv) else (None, [])
            break
        else:
            raise UsageError("unknown option %s (options go before the script; the script's "
                             "own after it)" % a)
        i += 1
    if not p.target:
        raise UsageError("-m needs a module name" if p.module else
                         "a script (or -m module) is required")
    if p.module and not _is_module_name(p.target):
        raise UsageError("-m %s: not a module name (dotted Python identifiers, as python -m "
                         "takes; for a file, leave out -m)" % p.target)
    return p


def _check_program_file(p: Program) -> None:
    """The script must be there (not checked when only parsing)."""
    if p.module or p.target == "-" or p.target is None:
        return
    if not os.path.exists(p.target):
        raise UsageError("no such file: %s" % p.target)
    if os.path.isdir(p.target) and not os.path.exists(os.path.join(p.target, "__main__.py")):
        raise UsageError("%s is a folder without __main__.py" % p.target)


def _program(parse: Callable[[List[str]], Program], parser: argparse.ArgumentParser,
             argv: List[str]) -> Tuple[Optional[Program], int]:
    """(the program `parse` found in `argv`, its script there, 0), or (None, the
    exit status) once --help is printed (0) or a usage error said (2)."""
    try:
        p = parse(argv)
        if p.help:
            parser.print_help()
            return None, 0
        _check_program_file(p)
    except UsageError as e:
        return None, _usage_error(parser, str(e))
    return p, 0


def _hang_after_value(option: str, raw: Optional[str]) -> float:
    value = _options.parse_seconds(raw)
    if value is None:
        raise UsageError("%s takes a number of seconds > 0" % option)
    too_short = _options.hang_after_too_short(value)
    if too_short:
        raise UsageError("%s %s: %s" % (option, raw, too_short))
    return value


def parse_run(argv: List[str]) -> Program:
    """run's command line, checked (UsageError), the script's existence aside."""
    p = _parse_program(argv, dict.fromkeys(_RUN_FLAGS.values(), False), _RUN_FLAGS,
                       {"--hang-after": ("hang_after", _hang_after_value)})
    if p.help:
        return p
    o = p.opts
    blocking = "--launch-blocking" if o["launch_blocking"] else "--no-watch" \
        if o["no_watch"] else None
    if o["launch_blocking"] and o["no_watch"]:
        raise UsageError("--launch-blocking and --no-watch exclude each other")
    if o["all_threads"] and not o["launch_blocking"]:
        raise UsageError("--all-threads goes with --launch-blocking")
    if o["exact"] and blocking:
        raise UsageError("--exact goes with watching (not with %s)" % blocking)
    if o.get("hang_after") is not None and blocking:
        raise UsageError("--hang-after goes with watching (not with %s)" % blocking)
    if o["replay"] and p.target == "-":
        raise UsageError("--replay re-runs the program: not one read from stdin")
    return p


def run_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    p, status = _program(parse_run, _run_parser(prog), argv)
    if p is None:
        return status
    o = p.opts
    assert p.target is not None
    mode = "block" if o["launch_blocking"] else "none" if o["no_watch"] else "watch"
    status = _run(p.target, p.args, module=p.module, mode=mode, all_threads=o["all_threads"],
                  full_traceback=o["traceback"], prog=prog,
                  guard=o["guard"] or _options.OPTIONS.guard, hang_after=o.get("hang_after"),
                  exact=o["exact"] or None)
    if o["replay"] and status == EXIT_STICKY:
        _replay_after(p.target, p.args, p.module, prog)
    return status


def _replay_after(target: str, args: List[str], module: bool, prog: str) -> None:
    """run --replay: the script died of a sticky fault; when the report can be
    explained by a replay, run it in a fresh process (this one's CUDA context
    is dead), its output going where ours goes."""
    import subprocess
    from ._scope import last_error
    err = last_error()
    if err is None or not err.replay_command:
        sys.stderr.write("%s run: --replay: nothing to replay (%s)\n" % (prog, 
            "no cuda_debug report" if err is None else
            "a device-side assert names its own thread" if "Assertion" in (err.device_message
                                                                          or "")
            else "not an illegal or misaligned address, or its launch is not known"))
        return
    from . import _replay_command
    opts = _replay_command.options(
        err.kernel_mangled, err.launch_seq,
        candidates=_replay_command.candidate_seqs(err.exact, err.candidates))
    if opts is None:
        return
    cmd = [sys.executable, "-m", "cuda_debug", "replay"] + opts + \
        (["-m", target] if module else [target]) + list(args)
    sys.stderr.write("\n%s run: replaying it to find the thread, the address and the "
                     "allocation: %s\n" % (prog, err.replay_command))
    sys.stderr.flush()
    sys.stdout.flush()
    subprocess.run(cmd)


def _enter(mode: str, all_threads: bool, hang_after: Optional[float] = None,
           exact: Optional[bool] = None, prog: str = MODULE_PROG):
    """The entered scope for `mode`, or None: where it cannot be had (no GPU,
    no CUPTI, a profiler holds it) say so once and run without it."""
    if mode == "none":
        return None
    from ._errors import CudaUnavailableError, ToolConflictError
    from ._scope import launch_blocking, watch
    if mode == "watch" and _options.OPTIONS.watch_ops and "torch" not in sys.modules:
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            import torch  # noqa: F401  (the op recorder is a PyTorch dispatch mode)
    scope = watch(hang_after=hang_after, exact=exact) if mode == "watch" else \
        launch_blocking(True, all_threads=all_threads)
    try:
        scope.__enter__()
    except (CudaUnavailableError, ToolConflictError) as e:
        sys.stderr.write("%s run: running without %s: %s\n"
                         % (prog, "watch()" if mode == "watch" else "launch_blocking()", e))
        return None
    if mode == "watch":
        from . import _replay_command
        _replay_command.run_watch = True     # launch numbers count from the program's start
    return scope


def _exec_stdin() -> None:
    """Run the program on stdin as ``__main__``, as ``python -`` does (``__file__``
    is ``<stdin>``); its lines go into linecache, so tracebacks show them."""
    import linecache
    import types
    source = sys.stdin.read()
    code = compile(source, "<stdin>", "exec")
    linecache.cache["<stdin>"] = (len(source), None, source.splitlines(True), "<stdin>")
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__="<stdin>", __cached__=None, __loader__=None, __spec__=None,
                         __package__=None)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _run(target: str, args: List[str], module: bool, mode: str, all_threads: bool,
         full_traceback: bool, prog: str = MODULE_PROG, guard: bool = False,
         hang_after: Optional[float] = None, exact: Optional[bool] = None,
         on_exception=None) -> int:
    """Run the program as __main__; its exit status. `on_exception(e)` (default
    _report) prints what an exception means and returns the status."""
    from . import _replay_command
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    _replay_command.prog = prog
    _replay_command.program = (["-m", target] if module else [target]) + list(args) \
        if target != "-" else None
    try:
        if module:
            sys.argv = [target] + args          # runpy sets argv[0] to the module's file
            # `python -m` puts the current directory first on sys.path.
            sys.path[0:1] = [os.getcwd()] if sys.path else [os.getcwd()]
        elif target == "-":
            sys.argv = ["-"] + args
            sys.path[0:1] = [""]                # as `python -`: the current directory
        else:
            sys.argv = [target] + args
            sys.path[0:1] = [os.path.dirname(os.path.abspath(target))]
        try:
            scope = _enter(mode, all_threads, hang_after, exact, prog)
            with contextlib.ExitStack() as stack:
                if scope is not None:
                    stack.push(scope)
                if guard:
                    from ._guard import guard as guard_region
                    stack.enter_context(guard_region(all_threads=True))
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                elif target == "-":
                    _exec_stdin()
                else:
                    # absolute, as `python script.py` makes it: relative file names
                    # are library code to the user-frame rule (_report.is_user_file)
                    runpy.run_path(os.path.abspath(target), run_name="__main__")
        except SystemExit as e:
            return _exit_status(e.code)
        except KeyboardInterrupt:
            traceback.print_exc()
            return 130
        except BaseException as e:
            return (on_exception or (lambda exc: _report(exc, full_traceback, prog)))(e)
        return 0
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _ranked(text: str) -> str:
    """Every line prefixed ``[rank k] `` when RANK is set (torchrun)."""
    rank = os.environ.get("RANK")
    if rank in (None, ""):
        return text
    return "\n".join("[rank %s] %s" % (rank, line) for line in text.splitlines())


def _write_elastic_error(text: str, prog: str = MODULE_PROG) -> None:
    """torchrun's failure summary names this as the root cause: the format of
    torch.distributed.elastic's ErrorHandler.record_exception (TORCHELASTIC_ERROR_FILE)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import time
    data = {"message": {"message": text.splitlines()[0],
                        "extraInfo": {"py_callstack": text,
                                      "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError as exc:
        sys.stderr.write("%s run: could not write %s: %s\n" % (prog, path, exc))


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write("%s\n" % code)
    return EXIT_ERROR


def _user_tb(tb):
    """Skip the frames of this runner (this file, runpy) at the top of `tb`."""
    skip = {os.path.normcase(os.path.abspath(f)) for f in (__file__, runpy.__file__)}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen runpy") or
                os.path.normcase(os.path.abspath(name)) in skip):
            break
        tb = tb.tb_next
    return tb


def _print_traceback(e: BaseException) -> None:
    traceback.print_exception(type(e), e, _user_tb(e.__traceback__), file=sys.stderr)


def _report(e: BaseException, full_traceback: bool, prog: str = MODULE_PROG) -> int:
    """Print what happened; the exit status."""
    from . import _report as rep, _sticky
    from ._errors import CudaError, GuardError
    from ._scope import watch_epoch
    if isinstance(e, GuardError):             # nothing was launched: its own short report
        if full_traceback:
            _print_traceback(e)
            sys.stderr.write("\n")
        sys.stderr.write(_ranked("%s: %s" % (type(e).__name__, e)) + "\n")
        return EXIT_ERROR
    err = e if isinstance(e, CudaError) else rep.error_for(
        e, watch_mark=watch_epoch(), found_at="run")
    if err is not None:
        if full_traceback:
            _print_traceback(e)
            sys.stderr.write("\n")
        text = "%s: %s" % (type(err).__name__, err)
        if err is not e:
            text += "\n  (raised as %s)" % _sticky.first_line(e)
        sys.stderr.write(_ranked(text) + "\n")
        _write_elastic_error(text, prog)
        return EXIT_STICKY if err.sticky else EXIT_ERROR
    code = _sticky.sticky_code(e)
    _print_traceback(e)
    if code is None:
        return EXIT_ERROR
    sys.stderr.write(
        "\ncuda_debug: %s is a sticky CUDA error: the CUDA context is dead.\n"
        "Kernels run asynchronously: the line above may not be where the faulting kernel was "
        "launched.\nTo name the kernel, the line and the assert text: %s run "
        "%s (watch, the default) or --launch-blocking\n"
        % (_sticky.describe(code), prog, " ".join(sys.argv) or "..."))
    return EXIT_STICKY


# -- replay ---------------------------------------------------------------------------

def _replay_max() -> int:
    from ._replay_command import MAX_CANDIDATES
    return MAX_CANDIDATES


def _launch_max() -> int:     # (the replay's numbers: imported when a replay is asked for)
    from ._replay_command import LAUNCH_MAX
    return LAUNCH_MAX


def _replay_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    # (for --help and the usage line: replay_main parses by hand, like run)
    from ._replay import DEFAULT_MAX_LAUNCHES, DEFAULT_WINDOW
    p = _parser(prog, "replay",
        "Re-run a program that died of an illegal (or misaligned) address, with "
        "NVIDIA's Sanitizer API, instrumenting only the culprit's launch: a bad "
        "access (where an overrun starts, or an underrun ends) is reported with its "
        "thread, block, address, read/write and size, and the allocation it missed "
        "(for PyTorch: the tensor, its shape and dtype, the line that allocated "
        "it). The report of the fault prints this command. Exit status: 3 found; 4 "
        "the run did not repeat itself; 1 the replay cannot run; 2 usage error.")
    p.add_argument("--launch", metavar="N",
                   help="the culprit's launch number, as the report names it (watch() counts "
                        "every launch of the program from its start, from 1); or the candidates "
                        "watch() could not tell apart, N1,N2,... (up to %d): each is "
                        "instrumented" % _replay_max())
    p.add_argument("--kernel", metavar="NAME",
                   help="the culprit's kernel: its mangled name as the report gives it (a "
                        "prefix of the launch's), or a part of its name")
    p.add_argument("--from-watch", action="store_true",
                   help="launch numbers count from the script's own first watch() (the "
                        "report came from there, not from cuda-debug run)")
    p.add_argument("--max-launches", metavar="M", type=int,
                   help="with --kernel: instrument at most M of its launches (default %d)"
                        % DEFAULT_MAX_LAUNCHES)
    p.add_argument("--window", metavar="W", type=int,
                   help="with --launch and --kernel: instrument the kernel's launches from "
                        "launch N-W on (default %d: from N)" % DEFAULT_WINDOW)
    p.add_argument("--no-torch", action="store_true",
                   help="do not import PyTorch to record its allocations (a program without "
                        "PyTorch: addresses and threads only)")
    p.add_argument("--traceback", action="store_true",
                   help="print the full Python traceback too, not only the short report")
    group = p.add_argument_group(
        "compute-sanitizer's spellings", "each maps onto the options above (docs/cli.md)")
    group.add_argument("--kernel-name", metavar="NAME",
                       help="--kernel NAME (also kns=NAME: a part of the name)")
    group.add_argument("--launch-skip", metavar="N", type=int,
                       help="skip the first N launches: --launch N+1 (with --launch-count M: "
                            "launches N+1 to N+M)")
    group.add_argument("--launch-count", metavar="M", type=int,
                       help="instrument M launches: with --kernel, --max-launches M; else the "
                            "M launches from --launch-skip on")
    p.add_argument("-m", dest="module", metavar="module",
                   help="run a library module as a script (like python -m)")
    p.add_argument("script", nargs="?", help="the script to run (-: read it from stdin)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _whole(least: int) -> Callable[[str, Optional[str]], int]:
    """convert(option, value): a whole number >= `least` (1_000 and 1,000 too)."""
    def convert(option: str, raw: Optional[str]) -> int:
        if raw is None:
            raise UsageError("%s needs a value" % option)
        try:
            v = int(raw.replace(",", "").replace("_", ""))
        except ValueError:
            v = least - 1
        if not least <= v <= _launch_max():
            raise UsageError("%s takes a whole number%s, not %r" % (
                option, "" if least <= 0 else " > %d" % (least - 1), raw))
        return v
    return convert


def _launch_value(option: str, raw: Optional[str]) -> Tuple[int, ...]:
    """--launch N, or N1,N2,... (watch's candidates): each a launch number
    (1 to _launch_max()), each once, at most _replay_max() of them."""
    many = "up to %d of them separated by commas" % _replay_max()
    if raw is None:
        raise UsageError("%s needs a value" % option)
    words = [w.strip() for w in raw.split(",")] if "," in raw else [raw.replace("_", "")]
    if "" in words:                    # "1,,2", "1,": a candidate left out is not dropped
        raise UsageError("%s %r has an empty item: %s" % (option, raw, many))
    try:
        launches = tuple(int(w) for w in words)
    except ValueError:
        launches = ()
    if not launches or min(launches) < 1:
        raise UsageError("%s takes a whole number > 0, or %s, not %r" % (option, many, raw))
    big = [n for n in launches if n > _launch_max()]
    if big:
        raise UsageError("%s %s: no launch has the number %d (watch() counts launches up to "
                         "%d)" % (option, raw, big[0], _launch_max()))
    if len(launches) > _replay_max():
        raise UsageError("%s takes one launch number, or %s, not %d" % (option, many,
                                                                        len(launches)))
    twice = sorted({n for n in launches if launches.count(n) > 1})
    if twice:
        raise UsageError("%s %s names launch %s more than once: each candidate once"
                         % (option, raw, " and ".join(str(n) for n in twice)))
    return launches


def _kernel_value(option: str, raw: Optional[str]) -> str:
    if raw is None:
        raise UsageError("%s needs a value" % option)
    if option == "--kernel-name":
        if raw.startswith(("kne=", "regex:", "regex=", "kernel=")):
            raise UsageError("--kernel-name %s: replay matches a part of the name (as "
                             "compute-sanitizer's kns=), not %s" % (raw, raw.split("=")[0]
                                                                   .split(":")[0]))
        raw = raw[4:] if raw.startswith("kns=") else raw
    if not raw.strip():
        raise UsageError("%s needs a name" % option)
    return raw


_REPLAY_FLAGS = {"--from-watch": "from_watch", "--no-torch": "no_torch",
                 "--traceback": "traceback"}
_REPLAY_VALUED: _Valued = {
    "--launch": ("launches", _launch_value), "--kernel": ("kernel", _kernel_value),
    "--kernel-name": ("kernel_name", _kernel_value), "--max-launches": ("max_launches", _whole(1)),
    "--window": ("window", _whole(0)), "--launch-skip": ("launch_skip", _whole(0)),
    "--launch-count": ("launch_count", _whole(1))}


def _sanitizer_spellings(o: Dict[str, Any]) -> None:
    """compute-sanitizer's --kernel-name, --launch-skip and --launch-count, as
    replay's own options (docs/cli.md: how each maps)."""
    if o.get("kernel_name") is not None:
        if o.get("kernel") is not None:
            raise UsageError("--kernel-name is --kernel: one of them")
        o["kernel"] = o["kernel_name"]
    skip, count = o.get("launch_skip"), o.get("launch_count")
    if skip is None and count is None:
        return
    if o.get("launches"):
        raise UsageError("--launch-skip and --launch-count count launches as compute-sanitizer "
                         "does; --launch names them: one or the other")
    if o.get("kernel") is not None:
        if skip:
            raise UsageError("--launch-skip with a kernel: replay counts every launch of the "
                             "program, not one kernel's: give --launch N (the number the "
                             "report names) with --kernel")
        if count is not None:
            if o.get("max_launches") is not None:
                raise UsageError("--launch-count with --kernel is --max-launches: one of them")
            o["max_launches"] = count
        return
    first, count = (skip or 0) + 1, count or 1
    if count > _replay_max():
        raise UsageError("--launch-count %d: at most %d launches are instrumented, each on its "
                         "own (with --kernel, --max-launches)" % (count, _replay_max()))
    if first + count - 1 > _launch_max():
        raise UsageError("--launch-skip %d: no launch has the number %d" % (skip, first))
    o["launches"] = tuple(range(first, first + count))


def parse_replay(argv: List[str]) -> Program:
    """replay's command line, checked (UsageError), the script's existence aside."""
    opts: Dict[str, Any] = {"launches": (), "kernel": None, "max_launches": None,
                            "window": None, "from_watch": False, "no_torch": False,
                            "traceback": False}
    p = _parse_program(argv, opts, _REPLAY_FLAGS, _REPLAY_VALUED)
    if p.help:
        return p
    o = p.opts
    _sanitizer_spellings(o)
    launches = o["launches"]
    o["launch"] = launches[0] if launches else None
    if len(launches) == 1:
        o["launches"] = ()              # one launch: as --launch N always meant
    if not o["launch"] and not o["kernel"]:
        raise UsageError("name the culprit: --launch N and/or --kernel NAME (the report that "
                         "printed the replay command has them)")
    if o["window"] is not None and not (o["launch"] and o["kernel"]):
        raise UsageError("--window goes with --launch and --kernel")
    if len(launches) > 1 and (o["kernel"] or o["window"] is not None or
                              o["max_launches"] is not None):
        raise UsageError("several launches are each instrumented, whatever their kernel: no "
                         "--kernel, --window or --max-launches with them")
    if o["max_launches"] is not None and not o["kernel"]:
        raise UsageError("--max-launches goes with --kernel")
    return p


def replay_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    p, status = _program(parse_replay, _replay_parser(prog), argv)
    if p is None:
        return status
    from . import _replay
    o = p.opts
    assert p.target is not None
    spec = _replay.Target(
        launch=o["launch"], kernel=o["kernel"],
        max_launches=o["max_launches"] or _replay.DEFAULT_MAX_LAUNCHES,
        window=o["window"] if o["window"] is not None else _replay.DEFAULT_WINDOW,
        from_watch=o["from_watch"], launches=o["launches"])
    return _replay_run(spec, p.target, p.args, p.module, prog, o["traceback"],
                       torch=not o["no_torch"])


def _replay_run(spec, target: str, args: List[str], module: bool, prog: str,
                full_traceback: bool, torch: bool = True) -> int:
    from . import _replay, _sticky
    found = _replay.find_library()
    if not found.path:
        sys.stderr.write("%s replay: %s\n" % (prog, _replay.not_found_message(found)))
        return EXIT_ERROR
    try:
        _replay.start(spec, found)
    except _replay.ReplayError as e:
        sys.stderr.write("%s replay: %s. The original report stands.\n" % (prog, e))
        return EXIT_ERROR
    note = _replay.record_torch_history_at_import() if torch else None
    sys.stderr.write("%s replay: re-running %s, instrumenting %s (NVIDIA's Sanitizer API: "
                     "%s)%s\n" % (prog, " ".join(([("-m " + target) if module else target]
                                                  + list(args))[:4]),
                                  spec.describe(), found.path,
                                  "" if note is None else "; " + note))
    sys.stderr.flush()
    outcome = {}

    def on_exception(e: BaseException) -> int:
        outcome["exc"] = e
        inst = _replay.found()
        if inst is not None:
            return _replay_found(inst, e, full_traceback)
        code = _sticky.sticky_code(e)
        if code is not None:           # a real fault, where nothing was instrumented
            if full_traceback:
                _print_traceback(e)
            sys.stderr.write("%s replay: the program faulted for real, in a launch that was "
                             "not instrumented: %s (raised as %s)\n"
                             % (prog, _sticky.describe(code), _sticky.first_line(e)))
            finished = "faulted"
        else:                          # an ordinary exception: as run reports it
            _report(e, full_traceback, prog)
            finished = "raised %s" % type(e).__name__
        sys.stderr.write(_replay.outcome_text(spec, finished, prog) + "\n")
        return EXIT_NOT_REPRODUCED

    status = _run(target, args, module=module, mode="none", all_threads=False,
                  full_traceback=full_traceback, prog=prog, on_exception=on_exception)
    if "exc" in outcome:
        return status
    inst = _replay.found()
    if inst is not None:                 # the program swallowed the failed launch
        return _replay_found(inst, None, full_traceback)
    sys.stderr.write(_replay.outcome_text(spec, "returned" if status == 0 else
                                          "exited with status %d" % status, prog) + "\n")
    return EXIT_NOT_REPRODUCED


def _replay_found(inst, exc: Optional[BaseException], full_traceback: bool) -> int:
    from . import _replay, _sticky
    err = _replay.build_error(inst, tb=exc.__traceback__ if exc is not None else None)
    if full_traceback and exc is not None:
        _print_traceback(exc)
        sys.stderr.write("\n")
    text = "%s: %s" % (type(err).__name__, err)
    if exc is not None:
        text += "\n  (raised as %s)" % _sticky.first_line(exc)
    else:
        text += "\n  (the program went on after the failed launch: it swallowed the error)"
    sys.stderr.write(_ranked(text) + "\n")
    from . import _report as rep
    rep.remember(err)
    return EXIT_STICKY


# -- dump -----------------------------------------------------------------------------

def _dump_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    p = _parser(prog, "dump",
        "Print, here, every stream's oldest unfinished launch of processes that "
        "watch (%s run, cuda_debug.watch()): kernel or NCCL collective, launching "
        "line, age, launches queued behind it. The process answers from a thread "
        "of cuda_debug's, also while its Python threads are stuck in a CUDA call; "
        "no signal is sent, and its stderr gets nothing. A PID without cuda_debug "
        "whose child processes have it (a torchrun agent) is asked through them: "
        "each rank's report, then one verdict line. Exit status 0 when every "
        "process answered, 1 otherwise, 2 on a usage error." % prog)
    p.add_argument("pid", nargs="*", help="the process (several: each rank; a torchrun agent: "
                                          "its ranks)")
    p.add_argument("-p", "--pid", dest="pid_option", metavar="PID", action="append",
                   default=[], help="a process, as py-spy takes it (py-spy dump --pid PID): "
                                    "the same as PID")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead: pid, rank, time, and one object per stream with "
                        "the fields of cuda_debug.in_flight() (several processes: "
                        "{\"ranks\": [...], \"verdict\": ...})")
    p.add_argument("--children", action="store_true",
                   help="ask the processes below each PID (its ranks), not the PID itself")
    p.add_argument("--trace", metavar="OUT.json",
                   help="also write the last launches as Chrome/Perfetto trace events (open in "
                        "ui.perfetto.dev or chrome://tracing)")
    p.add_argument("--last", metavar="N", type=int, default=None,
                   help="launches per process in the trace (default %d)" % 2000)
    p.add_argument("--job", metavar="HOST:PORT", nargs="?", const="",
                   help="every rank of a torchrun job, on any node, through the job's c10d "
                        "TCPStore (default: MASTER_ADDR:MASTER_PORT here); needs torch")
    p.add_argument("--timeout", metavar="S", type=float, default=None,
                   help="seconds to wait for each answer (default 5; --job: 10)")
    return p


def parse_dump(argv: List[str], parser: Optional[argparse.ArgumentParser] = None
               ) -> argparse.Namespace:
    """dump's command line, checked: argparse's own errors exit (SystemExit 2,
    said on stderr), ours raise UsageError. ``ns.pid``: the PIDs as typed
    (positional and --pid)."""
    ns = (parser or _dump_parser()).parse_args(argv)
    ns.pid = list(ns.pid) + list(ns.pid_option)
    if ns.last is not None and not 1 <= ns.last <= 65536:
        raise UsageError("--last takes 1 to 65536 launches")
    if ns.timeout is not None and not 0 < ns.timeout <= 3600:
        raise UsageError("--timeout takes seconds, more than 0 (at most 3600)")
    if ns.job is not None and (ns.pid or ns.children):
        raise UsageError("--job asks the ranks through the job's store: no PID, no --children")
    if ns.job is None and not ns.pid:
        raise UsageError("a PID is required (or --job)")
    return ns


def _say(where: str, message: str) -> None:
    """One line on stderr headed by the command as typed (``cuda-debug dump: ...``)."""
    sys.stderr.write("%s: %s\n" % (where, message))


def dump_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    p = _dump_parser(prog)
    try:
        ns = parse_dump(argv, p)
    except SystemExit as e:
        return _exit_status(e.code)
    except UsageError as e:
        return _usage_error(p, str(e))
    from . import _dump
    where = p.prog
    if ns.job is not None:
        from . import _job
        try:
            host, port = _job.address(ns.job)
        except ValueError as e:
            return _usage_error(p, str(e))
        return _dump_job(host, port, where, as_json=ns.json, trace=ns.trace, last=ns.last,
                         timeout=ns.timeout)
    try:
        pids = [_dump.parse_pid(t) for t in ns.pid]
    except _dump.DumpError as e:
        _say(where, str(e))
        return EXIT_ERROR
    status, targets, ranked = 0, [], bool(ns.children) or len(pids) > 1
    for pid in pids:
        try:
            found, agent = _dump_targets(pid, ns.children)
        except _dump.DumpError as e:
            _say(where, str(e))
            status = EXIT_ERROR
            continue
        ranked = ranked or agent
        targets += [t for t in found if t not in targets]
    recent = (ns.last or _dump.RECENT_DEFAULT) if ns.trace else 1 if ranked else 0
    docs = []
    for pid in targets:
        try:
            docs.append(_dump.ask(pid, recent=recent, timeout=ns.timeout or _dump.TIMEOUT_S))
        except _dump.DumpError as e:
            _say(where, _run_not_watching(pid, prog) or str(e))
            status = EXIT_ERROR
    docs.sort(key=lambda d: (d.get("rank") is None, d.get("rank") or 0, d["pid"]))
    try:
        _print_dump(docs, ranked, ns.json)
        sys.stdout.flush()
    except BrokenPipeError:        # `dump PID | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return status
    if ns.trace and docs and not _write_dump_trace(ns.trace, docs, where):
        status = EXIT_ERROR
    return status


def _is_run(cmdline: List[str]) -> bool:
    """Is this command line ``cuda-debug run ...`` or ``python -m cuda_debug run ...``?"""
    for i, word in enumerate(cmdline[:-1]):
        if cmdline[i + 1] == "run" and (os.path.basename(word) == "cuda-debug" or (
                word == "cuda_debug" and i and cmdline[i - 1] == "-m")):
            return True
    return False


def _run_not_watching(pid: int, prog: str) -> Optional[str]:
    """For a process started by ``run`` that does not answer (its dump listener
    is not there): why, since suggesting ``run`` would not help. Else None."""
    from . import _core, _dump
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if not _is_run(cmdline):
        return None
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(b"\0" + _core.dump_listener(pid)[1])
        return None                           # it listens: the error was another one
    except OSError:
        pass
    finally:
        s.close()
    return ("process %d%s runs under `run`, and does not answer: `run` could not watch "
            "(no usable GPU or CUPTI there: it said so on its stderr, then ran the script "
            "unwatched), or its CUDA_DEBUG_DUMP is off; `%s doctor` says what this machine "
            "lacks" % (pid, _dump.command_of(pid), prog))


def _dump_job(host: str, port: int, where: str, as_json: bool = False,
              trace: Optional[str] = None, last: Optional[int] = None,
              timeout: Optional[float] = None) -> int:
    from . import _dump, _job
    recent = (last or _dump.RECENT_DEFAULT) if trace else 1
    import time
    try:
        docs, missing = _job.ask_job(host, port, recent, timeout or _job.TIMEOUT_S)
    except (LookupError, OSError, ValueError) as e:
        _say(where, "--job %s:%d: %s" % (host, port, e))
        return EXIT_ERROR
    for r, (why, hang) in sorted(missing.items()):
        _say(where, "rank %d %s%s" % (r, why, "; its last hang report follows" if hang else ""))
    hangs = [hang for _, (_, hang) in sorted(missing.items()) if hang]
    if as_json:
        out = {"ranks": [_dump.as_json(d) for d in docs],
               "missing": {str(r): why for r, (why, _) in missing.items()},
               "last_hang_reports": [_dump.as_json(h) for h in hangs],
               "verdict": _dump.verdict(docs + hangs) if docs or hangs else None}
        print(json.dumps(out, indent=2))
    else:
        for d in docs:
            sys.stdout.write(_dump.prefixed(d))
        for h in hangs:
            sys.stdout.write(_dump.prefixed(h, "(its last hang report, %.0f s ago)\n" % (
                time.time() - float(h["time"])) + (h.get("text") or "")))
        if docs or hangs:
            for line in _dump.verdict_lines(docs + hangs):
                print(line)
    if trace and docs and not _write_dump_trace(trace, docs, where):
        return EXIT_ERROR
    return EXIT_ERROR if missing else 0


def _dump_targets(pid: int, children: bool):
    """(the processes to ask for `pid`, whether they are its ranks)."""
    from . import _dump
    proc = _dump.process(pid)
    _dump.check_askable(proc)
    has = _dump.has_cuda_debug(pid)
    if has is None:
        raise _dump.DumpError("not allowed to read /proc/%d/maps (process %d%s is not "
                              "dumpable): not asked" % (pid, pid, proc.command))
    if has and not children:
        return [pid], False
    # The topmost processes with cuda_debug below it (its ranks), not their own
    # children (DataLoader workers forked by a rank have its extension mapped too).
    procs = {}
    for c in _dump.descendants(pid):
        try:
            p = _dump.process(c)
            _dump.check_askable(p)
        except _dump.DumpError:
            continue
        if _dump.has_cuda_debug(c):
            procs[c] = p
    ranks = [c for c, p in procs.items() if p.ppid not in procs]
    if ranks:
        return ranks, True
    raise _dump.DumpError(
        "process %d%s has %s: nothing was sent to it" % (
            pid, proc.command, "no process below it with cuda_debug loaded" if children else
            "not loaded cuda_debug (no cuda_debug/_core in /proc/%d/maps), nor has any process "
            "below it" % pid))


def _print_dump(docs, ranked: bool, as_json: bool) -> None:
    from . import _dump
    if as_json:
        if ranked:
            out = {"ranks": [_dump.as_json(d) for d in docs],
                   "verdict": _dump.verdict(docs) if docs else None,
                   "flight_recorder": _dump.flight_recorder_lines(docs)}
        else:
            out = _dump.as_json(docs[0]) if docs else None
        if out is not None:
            print(json.dumps(out, indent=2))
        return
    for d in docs:
        sys.stdout.write(_dump.prefixed(d) if ranked else _dump.report_text(d))
    if ranked and docs:
        for line in _dump.verdict_lines(docs):
            print(line)


def _write_dump_trace(path: str, docs, where: str = MODULE_PROG + " dump") -> bool:
    """The trace written (said on stderr, with where); False (why, said) when not."""
    from . import _dump
    try:
        _dump.write_trace(path, docs)
    except OSError as e:
        _say(where, "--trace %s: not written: %s" % (path, e.strerror or e))
        return False
    n = sum(len(d.get("recent") or ()) for d in docs)
    _say(where, "%d launches of %d process%s written to %s (open it in ui.perfetto.dev or "
                "chrome://tracing)" % (n, len(docs), "" if len(docs) == 1 else "es", path))
    return True


# -- doctor ---------------------------------------------------------------------------

def _doctor_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    p = _parser(prog, "doctor",
        "What cuda_debug finds here: driver, GPUs, libcuda / CUPTI / cuBLAS and "
        "where from, CUDA_LAUNCH_BLOCKING, whether CUPTI is free. Exit status 0 "
        "when watch() and launch_blocking() work here; 1 when they do not (no "
        "driver, no GPU, CUPTI missing or held): the verdict says why.")
    p.add_argument("--json", action="store_true",
                   help="print the facts as JSON (\"ok\": whether watch() and "
                        "launch_blocking() work here; \"problem\": why not)")
    return p


def doctor_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    try:
        ns = _doctor_parser(prog).parse_args(argv)
    except SystemExit as e:       # --help (0) or a usage error (2): a status, not an exit
        return _exit_status(e.code)
    from . import _environment
    facts = _environment.full(probe_cupti=True)
    problem, verdict = _verdict(facts)
    facts["verdict"] = verdict
    facts["ok"] = problem is None
    facts["problem"] = problem
    if ns.json:
        print(json.dumps(_doctor_json(facts), indent=2, sort_keys=True, default=str))
    else:
        print(_doctor_text(facts))
    return 0 if problem is None else EXIT_ERROR


#: doctor's "problem" values: why watch() and launch_blocking() cannot work here
PROBLEMS = ("no_driver", "no_gpu", "no_cupti", "cupti_held", "cupti_error")


def _verdict(d: dict) -> (Optional[str], str):
    """(problem, verdict): problem is None when watch() and launch_blocking() work
    here, else one of PROBLEMS; the verdict says it in words, and what to do."""
    if not d["libcuda"]["found"]:
        found = [name for name, key in (("CUPTI", "cupti"), ("cuBLAS", "cublas"))
                 if (d.get(key) or {}).get("found")]
        return "no_driver", (
            "not usable here: no NVIDIA driver (libcuda.so.1 not found): watch() and "
            "launch_blocking() need an NVIDIA GPU and its driver%s. cuda_debug still "
            "imports, and translates the CUDA errors that frameworks raise."
            % (" (%s %s installed)" % (" and ".join(found), "are" if len(found) > 1 else "is")
               if found else ""))
    init = d.get("init") or {}
    if init.get("code") or not d["devices"]:
        return "no_gpu", ("not usable here: no usable GPU (cuInit: %s), so watch() and "
                          "launch_blocking() cannot work; they need an NVIDIA GPU."
                          % (init.get("name") or "no device"))
    if not d["cupti"]["found"]:
        return "no_cupti", ("not usable here: CUPTI was not found, and watch() and "
                            "launch_blocking() need it. Install the CUDA toolkit or the "
                            "nvidia-cuda-cupti wheel, or set CUDA_HOME.")
    free = d.get("cupti_free") or {}
    if free.get("free") is False:
        return "cupti_held", (
            "not usable now: CUPTI is held by another tool (%s): watch() and launch_blocking() "
            "would raise ToolConflictError, or with PyTorch imported synchronise after every "
            "op instead." % (free.get("holder") or "a profiler"))
    if free.get("free") is None:
        return "cupti_error", "not usable here: CUPTI could not be subscribed: %s" % \
            free.get("error")
    return None, "watch() and launch_blocking() work here."


def _lib_line(lib: Optional[dict]) -> str:
    if not lib:
        return "not looked for"
    if lib["found"]:
        return "%s (%s)" % (lib["path"], lib["how"])
    return "not found (%s)" % lib["error"]


#: doctor's `assert text` row for each assert_text "state" (the JSON says the state)
_ASSERT_TEXT = {
    "off": "not captured: CUDA_DEBUG_CAPTURE=off (it still reaches stderr)",
    "not_checked": "not checked (no libcuda)",
    "not_captured": "not captured: libcuda has no reference to stderr that can be redirected "
                    "(the device's assert text reaches stderr, but not the reports)",
    "captured": "captured from libcuda's writes to stderr (libc's stderr is left alone)",
}


def _assert_text_line(a: dict) -> str:
    return _ASSERT_TEXT[a.get("state", "not_checked")]


def _doctor_json(facts: dict) -> dict:
    """What --json prints: the facts the text shows, with one list of GPUs,
    ``devices``: the driver's (``"source": "driver"``), or where the driver
    lists none, the kernel module's (``"source": "/proc/driver/nvidia"``)."""
    out = dict(facts)
    models = out.pop("gpus", None) or []
    out["devices"] = [dict(dev, source="driver") for dev in facts.get("devices") or []]
    if not out["devices"]:
        out["devices"] = [{"index": i, "name": m, "source": "/proc/driver/nvidia"}
                          for i, m in enumerate(models)]
    return out


def _doctor_text(d: dict) -> str:
    rows = [("cuda_debug", "%s, Python %s (%s)" % (d["cuda_debug"], d["python"], d["executable"])),
            ("built with", "CUDA %s headers, CUPTI %s" % (d["cuda_headers"], d["cupti_headers"])),
            ("frame reader", d["frame_reader"])]
    if d.get("free_threaded"):
        rows.append(("free-threaded", "GIL re-enabled: cuda_debug._core does not declare itself "
                     "safe without it" if d["gil_enabled"] else
                     "GIL disabled (PYTHON_GIL=0): cuda_debug._core was not made safe without it"))
    drv = d["driver"] or "?"
    if d["libcuda"]["found"]:
        rows.append(("driver", "%s, supports CUDA %s" % (drv, d.get("driver_cuda") or "?")))
    else:
        rows.append(("driver", "none%s" % (" (kernel module %s)" % d["driver"] if d["driver"] else "")))
    rows.append(("libcuda", _lib_line(d["libcuda"])))
    init = d.get("init")
    if init and init["code"]:
        rows.append(("cuInit", "%s (%d)%s" % (init["name"], init["code"],
                                             ": no GPU visible" if init["code"] == 100 else "")))
    if d["devices"]:
        for dev in d["devices"]:
            if "error" in dev:
                rows.append(("GPU %d" % dev["index"], "error %s" % dev["error"]))
            else:
                rows.append(("GPU %d" % dev["index"], "%s: %s, %s GiB, %d SMs" % (
                    dev["name"], dev["sm"], dev["memory_gib"], dev["sms"])))
    elif d["gpus"]:
        rows.append(("GPUs (/proc)", ", ".join(d["gpus"])))
    else:
        rows.append(("GPU", "none found"))
    rows.append(("CUDA toolkit", ", ".join(d["toolkits"]) or "none found (CUDA_HOME, /usr/local/cuda)"))
    rows.append(("cuda.pathfinder", d.get("pathfinder") or
                 "not installed: CUPTI and cuBLAS cannot be looked for (pip install cuda-pathfinder)"))
    cupti = _lib_line(d["cupti"])
    if d.get("cupti_version"):
        cupti = "%s: %s" % (d["cupti_version"], cupti)
    rows.append(("CUPTI", cupti))
    rows.append(("cuBLAS", _lib_line(d["cublas"])))
    free = d.get("cupti_free")
    if free is None:
        rows.append(("CUPTI free", "not checked (no GPU)" if not d["devices"] else "not checked"))
    elif free.get("free"):
        rows.append(("CUPTI free", "yes: launch_blocking() subscribed and let go"))
    else:
        rows.append(("CUPTI free", "no: %s" % free.get("error")))
    rows.append(("assert text", _assert_text_line(d.get("assert_text") or {})))
    env = d["env"]
    clb = env.get("CUDA_LAUNCH_BLOCKING")
    rows.append(("CUDA_LAUNCH_BLOCKING", "not set" if clb is None else
                 "%r: every launch of processes started from this environment is synchronous "
                 "(read once, when the context is created)" % clb))
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH"):
        if k in env:
            note = " (a tool injected into CUDA: it may hold CUPTI)" if "INJECTION" in k else ""
            rows.append((k, env[k] + note))
    if d["frameworks"]:
        rows.append(("frameworks", ", ".join("%s %s" % kv for kv in sorted(d["frameworks"].items()))))
    width = max(len(k) for k, _ in rows)
    lines = ["%-*s  %s" % (width, k, v) for k, v in rows]
    lines.append("")
    lines.append("verdict: " + d["verdict"])
    return "\n".join(lines)
