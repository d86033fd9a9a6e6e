"""``cuda-debug run``: the program as ``python`` runs it, inside ``watch()`` (or
``launch_blocking()``, or neither), and a CUDA fault said as the short report;
``--replay`` hands an illegal address to ``replay`` (cuda_debug/_cli/replay.py).

The runner's frames (this file's, runpy's) are left out of the tracebacks it
prints: _user_tb.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import contextlib
import json
import os
import runpy
import sys
import traceback
from typing import Any, List, NoReturn, Optional

from .. import _options
from .common import (EXIT_ERROR, EXIT_STICKY, MODULE_PROG, Program, UsageError, _exit_status,
                     _parse_program, _parser, _program, _program_words, _ranked)


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
    p.add_argument("-c", dest="code", metavar="code",
                   help="run the program passed as a string (like python -c)")
    p.add_argument("script", nargs="?", help="the script to run (-: read it from stdin)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


_RUN_FLAGS = {"--launch-blocking": "launch_blocking", "--no-watch": "no_watch",
              "--all-threads": "all_threads", "--traceback": "traceback", "--guard": "guard",
              "--exact": "exact", "--replay": "replay"}


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
                  exact=o["exact"] or None, command=p.command)
    if o["replay"] and status == EXIT_STICKY:
        _replay_after(p.target, p.args, p.module, prog, p.command)
    return status


def _replay_after(target: str, args: List[str], module: bool, prog: str,
                  command: bool = False) -> None:
    """run --replay: the script died of a sticky fault; when the report can be
    explained by a replay, run it in a fresh process (this one's CUDA context
    is dead), its output going where ours goes."""
    import subprocess
    from .._scope import last_error
    err = last_error()
    if err is None or not err.replay_command:
        sys.stderr.write("%s run: --replay: nothing to replay (%s)\n" % (prog, 
            "no cuda_debug report" if err is None else
            "a device-side assert names its own thread" if "Assertion" in (err.device_message
                                                                          or "")
            else "not an illegal or misaligned address, or its launch is not known"))
        return
    from .. import _replay_command
    opts = _replay_command.options(
        err.kernel_mangled, err.launch_seq,
        candidates=_replay_command.candidate_seqs(err.exact, err.candidates))
    if opts is None:
        return
    cmd = [sys.executable, "-m", "cuda_debug", "replay"] + opts + \
        _program_words(target, args, module, command)
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
    from .._errors import CudaUnavailableError, ToolConflictError
    from .._scope import launch_blocking, watch
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
    return scope


def _main_module(**attrs: Any):
    """A fresh ``__main__`` as `python` makes one: ``__builtins__`` the builtins
    module (not its dict, as runpy's), no spec, no package, an empty
    ``__annotations__`` where this interpreter's own ``__main__`` has one (before
    3.14), `attrs` (the file, the loader)."""
    import builtins
    import types
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None, __package__=None)
    if "__annotations__" in getattr(sys.modules.get("__main__"), "__dict__", {}):
        main.__dict__["__annotations__"] = {}
    main.__dict__.update(attrs)
    return main


def _exec_main(code, main) -> None:
    """Run `code` in `main`, sys.modules' ``__main__`` while it runs (pickle finds
    the program's classes there)."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _exec_stdin() -> None:
    """Run the program on stdin as ``__main__``, as ``python -`` does (``__file__``
    is ``<stdin>``); its lines go into linecache, so tracebacks show them."""
    import linecache
    from importlib.machinery import BuiltinImporter
    source = sys.stdin.read()
    code = compile(source, "<stdin>", "exec")
    linecache.cache["<stdin>"] = (len(source), None, source.splitlines(True), "<stdin>")
    _exec_main(code, _main_module(__file__="<stdin>", __cached__=None,
                                  __loader__=BuiltinImporter))


def _exec_command(text: str) -> None:
    """``-c text``, as ``python -c`` runs it: file name ``<string>``, no ``__file__``."""
    from importlib.machinery import BuiltinImporter
    _exec_main(compile(text, "<string>", "exec"), _main_module(__loader__=BuiltinImporter))


def _runs_as_file(target: str) -> bool:
    """A source file `python` reads itself (not a folder, a zip or a .pyc: runpy
    runs those, as python does)."""
    if os.path.isdir(target) or target.endswith((".pyc", ".pyo")):
        return False
    if not os.path.isfile(target):      # a pipe (`run <(...)`): read once, as source
        return True
    with open(target, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04" or not target.endswith(".py"):
        import zipfile
        return not zipfile.is_zipfile(target)
    return True


def _exec_file(target: str) -> None:
    """The script as ``python script.py`` runs it: ``__file__`` and the code's file
    name absolute (relative file names are library code to the user-frame rule:
    _report.is_user_file), a SourceFileLoader, sys.argv[0] as typed."""
    from importlib.machinery import SourceFileLoader
    path = os.path.abspath(target)
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    _exec_main(code, _main_module(__file__=path, __cached__=None,
                                  __loader__=SourceFileLoader("__main__", path)))


class _NoMain(Exception):
    """A folder or zip without ``__main__.py``: python's words, exit status 1."""


def _run_path(target: str) -> None:
    """A folder or zip file with ``__main__.py`` (or a .pyc): runpy runs it, as
    python does; sys.path[0] is the folder (runpy puts it there)."""
    del sys.path[0:1]
    try:
        runpy.run_path(target, run_name="__main__")
    except ImportError as e:
        if "can't find '__main__' module" in str(e):
            raise _NoMain(str(e)) from None
        raise


def _interrupted(e: KeyboardInterrupt) -> "NoReturn":
    """Ctrl-C: raise it on, out of the command, once everything here is closed, as
    `python` would: the interpreter prints it (through sys.excepthook: the
    program's frames only), runs atexit, and dies of SIGINT (exit status 130 in
    a shell) so that the shell and the caller see the interruption."""
    tb = e.__traceback__
    hook = sys.excepthook

    def print_it(kind, value, traceback_):
        sys.excepthook = hook
        if value is e:
            traceback.print_exception(type(e), e, _user_tb(tb), file=sys.stderr)
        else:
            hook(kind, value, traceback_)
    sys.excepthook = print_it
    raise e


def _run(target: str, args: List[str], module: bool, mode: str, all_threads: bool,
         full_traceback: bool, prog: str = MODULE_PROG, guard: bool = False,
         hang_after: Optional[float] = None, exact: Optional[bool] = None,
         on_exception=None, command: bool = False) -> int:
    """Run the program as __main__, as `python` would (the same sys.argv,
    sys.path[0], ``__main__`` attributes); its exit status. `command`: -c, the
    program is `target`'s text. `on_exception(e)` (default _report) prints what
    an exception means and returns the status. Ctrl-C (KeyboardInterrupt) is
    raised on, once the scopes are closed: _interrupted."""
    from .. import _replay_command
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    program = _program_words(target, args, module, command) if target != "-" else None
    interrupted = None
    try:
        if module:
            sys.argv = [target] + args          # runpy sets argv[0] to the module's file
            # `python -m` puts the current directory first on sys.path.
            sys.path[0:1] = [os.getcwd()]
        elif command or target == "-":
            sys.argv = ["-c" if command else "-"] + args
            sys.path[0:1] = [""]                # as `python -c`/`python -`: the current dir
        else:
            sys.argv = [target] + args          # as typed, as python leaves it
            # the folder of the script itself (a symlink's target), as python puts it
            sys.path[0:1] = [os.path.dirname(os.path.realpath(target))]
        try:
            scope = _enter(mode, all_threads, hang_after, exact, prog)
            # What a report's replay command says: with run's own watch() open, launch
            # numbers count from the program's start.
            _replay_command.configure(prog, program, run_watch=mode == "watch" and
                                      scope is not None)
            with contextlib.ExitStack() as stack:
                if scope is not None:
                    stack.push(scope)
                if guard:
                    from .._guard import guard as guard_region
                    stack.enter_context(guard_region(all_threads=True))
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                elif command:
                    _exec_command(target)
                elif target == "-":
                    _exec_stdin()
                elif _runs_as_file(target):
                    _exec_file(target)
                else:
                    _run_path(target)
        except SystemExit as e:
            return _exit_status(e.code)
        except KeyboardInterrupt as e:
            interrupted = e
        except _NoMain as e:
            sys.stderr.write("%s run: %s\n" % (prog, e))
            return EXIT_ERROR
        except BaseException as e:
            return (on_exception or (lambda exc: _report(exc, full_traceback, prog, mode, program)))(e)
        return 0
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if interrupted is not None:
            _interrupted(interrupted)



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


def _report(e: BaseException, full_traceback: bool, prog: str = MODULE_PROG,
            mode: Optional[str] = None, program: Optional[List[str]] = None) -> int:
    """Print what happened; the exit status. `mode`: how run ran the program
    (watch, block, none), and `program` what it ran (None: stdin), for the advice."""
    from .. import _report as rep, _sticky
    from .._errors import CudaError, GuardError
    from .._scope import watch_epoch
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
    _print_traceback(e)
    # Words alone do not make the context dead (a program may raise them, or relay a
    # child's): only the driver, asked now, says so, as pytest's fail fast asks it.
    named = _sticky.sticky_code(e)
    if named is None and not (_sticky.is_gpu_exception(e) and _sticky.speaks_of_cuda(e)):
        return EXIT_ERROR
    from .. import _environment
    code = _environment.context_dead()
    if code is None:
        return EXIT_ERROR
    words = " ".join(program or ["-"])
    advice = "%s run --launch-blocking %s (the fault raised at its launching line)" % (
        prog, words) if mode == "watch" else \
        "%s run %s (watch, the default) or --launch-blocking" % (prog, words)
    sys.stderr.write(
        "\ncuda_debug: %s is a sticky CUDA error: the CUDA context is dead.\n"
        "Kernels run asynchronously: the line above may not be where the faulting kernel was "
        "launched.\nTo name the kernel, the line and the assert text: %s\n"
        % (_sticky.describe(code), advice))
    return EXIT_STICKY

