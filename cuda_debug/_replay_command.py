"""The ``cuda-debug replay`` command a fault's report prints.

A sticky fault without assert text (an illegal or misaligned address) names
its kernel and launch, but not the thread, the address or whose memory it
was; the replay finds those. The command re-runs the same program with the
same arguments, instrumenting that launch (its number, as watch() counted it,
and its kernel). Imported by the report (_report) and the command line
(cuda_debug/_cli/run.py: configure()); it imports nothing of the package's.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import shlex
import sys
from typing import List, Optional

#: Candidate launches a replay instruments at most (csrc/replay: CD_REPLAY_LAUNCHES).
MAX_CANDIDATES = 64
#: The largest launch number: watch() counts a process's launches in 64 bits (the
#: C core reads a number with the "K" format, which would wrap a larger one).
LAUNCH_MAX = 2 ** 64 - 1
#: The faults a replay can explain: an access the check sees as outside every
#: allocation, or not aligned to its size.
REPLAYABLE = {700: "an illegal address", 716: "a misaligned address"}

# Set by the command line, through configure(), and by nothing else:
#: True when ``cuda-debug run`` opened watch() before the script ran: its
#: launch numbers then count from the start of the program, as the replay's do.
#: Otherwise they count from the script's own first watch(), and the command
#: says so (``--from-watch``).
run_watch = False
#: The command as it was invoked (``cuda-debug``, ``python -m cuda_debug``).
prog: Optional[str] = None
#: The program ``cuda-debug run`` runs (``[script, args...]`` or ``["-m", module, args...]``);
#: else sys.argv (and ``__main__``'s spec) say what it is.
program: Optional[List[str]] = None


def configure(prog: Optional[str], program: Optional[List[str]], run_watch: bool) -> None:
    """What the command line knows of the program it runs, for the replay
    command a report prints: the command as invoked, the program's words (None:
    one that cannot be re-run, read from stdin), and whether run's own watch()
    counts its launches from its start."""
    globals().update(prog=prog, program=program, run_watch=run_watch)


def wanted(code: Optional[int], device_message: Optional[str]) -> bool:
    """A fault the replay can tell more about: an address fault with no
    device-side assert text (an assert names its own thread and condition)."""
    return code in REPLAYABLE and "Assertion" not in (device_message or "")


def _prog() -> str:
    if prog:
        return prog
    import shutil               # (here: shutil brings bz2 and lzma, a report needs neither)
    if shutil.which("cuda-debug"):
        return "cuda-debug"
    return "%s -m cuda_debug" % (os.path.basename(sys.executable) or "python")


def _program(argv: Optional[List[str]]) -> Optional[List[str]]:
    """The program to re-run, as the replay command line spells it: a script
    and its arguments, or ``-m module`` and its arguments; None for a program
    that cannot be re-run (``python -c``, an interactive session). `argv`
    None: this process's (sys.argv, and __main__'s spec for ``python -m``)."""
    if program is not None and argv is None:
        return list(program)
    spec = None
    if argv is None:
        argv = list(sys.argv)
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if not argv or argv[0] in ("", "-c", "-"):
        return None
    name = getattr(spec, "name", None)
    if name:                                   # python -m module
        return ["-m", name[:-len(".__main__")] if name.endswith(".__main__") else name] + \
            list(argv[1:])
    if not os.path.exists(argv[0]):
        return None
    return list(argv)


def candidate_seqs(exact: Optional[bool], candidates) -> List[int]:
    """The launch numbers of a watch report's other candidates (a report that is
    not exact), leaving out graph replays and nodes (the replay instruments
    launches, not nodes)."""
    if exact is not False:
        return []
    return [c.get("seq") for c in candidates or ()
            if isinstance(c, dict) and c.get("seq") and not c.get("graph") and
            c.get("graph_node") is None]


def options(kernel: Optional[str], launch: Optional[int], from_watch: Optional[bool] = None,
            candidates: Optional[List[int]] = None) -> Optional[List[str]]:
    """The replay's options for a culprit: ``--launch 1234 --kernel _ZN...``;
    with `candidates` (the other launches watch() could not rule out) all of
    them, ``--launch 1234,1235,...``, whatever their kernel. `from_watch`:
    launch numbers count from the script's own watch() (default: unless
    ``cuda-debug run`` opened watch for the whole script). None: nothing to
    name the launch by."""
    if not kernel and not launch:
        return None
    if from_watch is None:
        from_watch = bool(launch) and not run_watch
    words = []
    seqs = list(dict.fromkeys([launch] + [int(c) for c in candidates or ()]))[:MAX_CANDIDATES] \
        if launch else []
    if len(seqs) > 1:
        words += ["--launch", ",".join(str(q) for q in seqs)]
    else:
        if launch:
            words += ["--launch", str(launch)]
        if kernel:
            words += ["--kernel", kernel]
    if from_watch:
        words.append("--from-watch")
    return words


def command(kernel: Optional[str], launch: Optional[int], argv: Optional[List[str]] = None,
            from_watch: Optional[bool] = None,
            candidates: Optional[List[int]] = None) -> Optional[str]:
    """``cuda-debug replay --launch 1234 --kernel _ZN... train.py --lr 3e-4``
    (options()), or None when there is nothing to name the launch by or no
    program to re-run."""
    opts = options(kernel, launch, from_watch, candidates)
    if opts is None:
        return None
    program_words = _program(None if argv is None else list(argv))
    if program_words is None:
        return None
    words = shlex.split(_prog()) + ["replay"] + opts + program_words
    return " ".join(shlex.quote(w) for w in words)
