"""The command line: ``python -m cuda_debug {run,dump,doctor,bench}`` (also ``cuda-debug``).

``run [--launch-blocking [--all-threads] | --no-watch] [--traceback] script.py args...``
(or ``run ... -m module args...``, ``run ... -c code args...``, or ``run ... - args...``
for a script read from stdin)
    runs the script as ``__main__``, as ``python`` would (the same ``sys.argv``,
    ``sys.path[0]``, ``__main__``; Ctrl-C ends the process by SIGINT), inside
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
      CUDA context is dead, the report says where (a framework's words alone
      are not enough: the driver, asked then, must say the context is dead).

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

A room per command: ``run.py``, ``replay.py``, ``dump.py``, ``doctor.py``,
each with its parser, its parse_*() and its *_main(); ``common.py`` what they
share (exit statuses, the usage error, a program's command line as python
parses it). This file: the usage, the dispatch, and check_command_line().

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import importlib
import os
import sys
from typing import List, Optional

from .common import EXIT_ERROR, EXIT_USAGE, MODULE_PROG, UsageError
from .doctor import _doctor_parser, doctor_main
from .dump import dump_main, parse_dump
from .replay import parse_replay, replay_main
from .run import parse_run, run_main

__all__ = ["COMMANDS", "USAGE", "MODULE_PROG", "UsageError", "main", "prog_name",
           "check_command_line", "parse_run", "parse_replay", "parse_dump"]

#: the commands, as USAGE lists them
COMMANDS = ("run", "replay", "dump", "doctor", "bench")

USAGE = """\
usage: {prog} <command> [options]

commands:
  run [--launch-blocking|--no-watch] [--guard] script.py [args...]
                                  run a script; a CUDA fault names its kernel and line
  run [--launch-blocking|--no-watch] [--guard] -m module [args...]
                                  the same for a module
  run [--launch-blocking|--no-watch] [--guard] - [args...]
                                  the same for a script read from stdin
  run [--launch-blocking|--no-watch] [--guard] -c code [args...]
                                  the same for a program given as text
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
    if argv[:1] == ["help"] and len(argv) == 2 and argv[1] in COMMANDS:
        return main([argv[1], "--help"], prog)          # `help run`: run's own help
    if argv[:1] == ["help"] and len(argv) > 1:
        sys.stderr.write("%s: error: help takes a command (%s), not %s\n"
                         % (prog, ", ".join(COMMANDS), " ".join(argv[1:])))
        return EXIT_USAGE
    if not argv or argv[0] in ("-h", "--help", "help"):
        (sys.stdout if argv else sys.stderr).write(usage)
        return 0 if argv else EXIT_USAGE
    cmd, rest = argv[0], argv[1:]
    if cmd in ("-V", "--version"):
        if rest:
            sys.stderr.write("%s: error: %s takes no arguments, not %s\n"
                             % (prog, cmd, " ".join(rest)))
            return EXIT_USAGE
        from .. import __version__
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
    hint = ""
    if cmd.endswith((".py", ".pyw")) or (not cmd.startswith("-") and os.path.isfile(cmd)):
        hint = " (a script: %s run %s)" % (prog, " ".join(argv))
    elif cmd == "-m" and rest:
        hint = " (a module: %s run %s)" % (prog, " ".join(argv))
    sys.stderr.write("%s: error: unknown command %r%s\n\n%s" % (prog, cmd, hint, usage))
    return EXIT_USAGE


def check_command_line(argv: List[str]) -> None:
    """Parse `argv` (what follows ``cuda-debug``) as its command does, running
    nothing: UsageError, or argparse's SystemExit (said on stderr), when the
    command refuses it. A script's existence is not checked. For tests: a page
    of docs/ cannot show a command or an option that does not exist."""
    if not argv:
        raise UsageError("a command is required")
    cmd, rest = argv[0], argv[1:]
    if cmd == "help" and len(rest) == 1 and rest[0] in COMMANDS:
        pass
    elif cmd in ("-h", "--help", "help", "-V", "--version"):
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
        from ..bench import _cli as bench_cli
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

