"""``cuda-debug replay``: the program run again under NVIDIA's Sanitizer API,
instrumenting the culprit's launch (cuda_debug/_replay.py does the work), with
compute-sanitizer's spellings of the culprit read where they map.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from .common import (EXIT_ERROR, EXIT_NOT_REPRODUCED, EXIT_STICKY, MODULE_PROG, Program,
                     UsageError, _parse_program, _parser, _program, _program_words, _ranked,
                     _Valued)
from .run import _print_traceback, _report, _run


def _replay_max() -> int:
    from .._replay_command import MAX_CANDIDATES
    return MAX_CANDIDATES


def _launch_max() -> int:     # (the replay's numbers: imported when a replay is asked for)
    from .._replay_command import LAUNCH_MAX
    return LAUNCH_MAX


def _replay_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    # (for --help and the usage line: replay_main parses by hand, like run)
    from .._replay import DEFAULT_MAX_LAUNCHES, DEFAULT_WINDOW
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
    from .. import _replay
    o = p.opts
    assert p.target is not None
    spec = _replay.Target(
        launch=o["launch"], kernel=o["kernel"],
        max_launches=o["max_launches"] or _replay.DEFAULT_MAX_LAUNCHES,
        window=o["window"] if o["window"] is not None else _replay.DEFAULT_WINDOW,
        from_watch=o["from_watch"], launches=o["launches"])
    return _replay_run(spec, p.target, p.args, p.module, prog, o["traceback"],
                       torch=not o["no_torch"], command=p.command)


def _replay_run(spec, target: str, args: List[str], module: bool, prog: str,
                full_traceback: bool, torch: bool = True, command: bool = False) -> int:
    from .. import _replay, _sticky
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
                     "%s)%s\n" % (prog, " ".join(([("-m " + target) if module else
                                                   ("-c " + target) if command else target]
                                                  + list(args))[:4]),
                                  spec.describe(), found.path,
                                  "" if note is None else "; " + note))
    sys.stderr.flush()
    outcome = {}
    program = _program_words(target, args, module, command) if target != "-" else None

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
            _report(e, full_traceback, prog, program=program)
            finished = "raised %s" % type(e).__name__
        sys.stderr.write(_replay.outcome_text(spec, finished, prog) + "\n")
        return EXIT_NOT_REPRODUCED

    status = _run(target, args, module=module, mode="none", all_threads=False,
                  full_traceback=full_traceback, prog=prog, on_exception=on_exception,
                  command=command)
    if "exc" in outcome:
        return status
    inst = _replay.found()
    if inst is not None:                 # the program swallowed the failed launch
        return _replay_found(inst, None, full_traceback)
    sys.stderr.write(_replay.outcome_text(spec, "returned" if status == 0 else
                                          "exited with status %d" % status, prog) + "\n")
    return EXIT_NOT_REPRODUCED


def _replay_found(inst, exc: Optional[BaseException], full_traceback: bool) -> int:
    from .. import _replay, _sticky
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
    from .. import _report as rep
    rep.remember(err)
    return EXIT_STICKY

