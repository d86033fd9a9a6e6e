"""The CUDA_DEBUG_* switches: read once, when cuda_debug is imported, checked,
and handed to the C core before the first scope or watch opens.

    CUDA_DEBUG_REPORT=1|0          write the compact report to fd 2 at the fault (default 1)
    CUDA_DEBUG_CAPTURE=on|off      catch the device's assert text through a pass-through
                                   stderr (default on)
    CUDA_DEBUG_WAIT=sync|spin|none how a scope waits for a launch (none: measurements only)
    CUDA_DEBUG_PROFILE=0|1         time the launch callback (_core.stats())
    CUDA_DEBUG_CAPTURE_CHECK=1|0   0 skips the graph-capture check (measurements only)
    CUDA_DEBUG_WATCH_EXACT=0|1     watch() puts a completion marker behind every launch, as
                                   watch(exact=True): every fault names its launch, for a
                                   few percent more (default 0: the always-on mode)
    CUDA_DEBUG_WATCH_EVERY=K       the always-on watch() puts a completion marker behind
                                   every K-th launch of a stream (2..65536; default 16): a
                                   fault the device does not name is placed among at most K
    CUDA_DEBUG_WATCH_PROBE=dispatch|record|frames
                                   measurements only (benchmarks/always_on.py): a watched
                                   launch stops after CUPTI's dispatch, after a record
                                   without frames, or after a record with frames; no marker
    CUDA_DEBUG_CUPTI_DETACH=0|1    when the last scope or watch() closes, CUPTI leaves the
                                   process (cuptiFinalize, at the next launch: that launch
                                   waits for the GPU once) rather than staying loaded,
                                   unsubscribed, unless a profiler used it (default 0)
    CUDA_DEBUG_WATCH_OPS=0|1       watch() records each launch's PyTorch op and input
                                   shapes, as watch(ops=True) (default 0)
    CUDA_DEBUG_GUARD=0|1           `python -m cuda_debug run` and pytest run inside
                                   cuda_debug.guard(), as run --guard / --cuda-guard
                                   (default 0)
    CUDA_DEBUG_HANG_AFTER=S|off    watch() reports a launch unfinished for S seconds
                                   (a hang?), the process left alive, as
                                   watch(hang_after=S) (default off)
    CUDA_DEBUG_DUMP_SIGNAL=SIGUSR1|SIGUSR2|off
                                   the signal that asks a watching process to write the
                                   same report to its stderr (default SIGUSR1)
    CUDA_DEBUG_DUMP=on|off         the first watch() starts the thread that answers
                                   `python -m cuda_debug dump PID` (default on)
    CUDA_DEBUG_TRACE=out.json      at the first sticky fault reported while watching,
                                   write the last launches as Chrome/Perfetto trace
                                   events there (as `dump --trace`; default: none)
    CUDA_DEBUG_GRAPH_MARKERS=kernel|memop|0
                                   while watching, launches captured into a CUDA graph
                                   get completion markers captured with them: a one-thread
                                   kernel node (kernel, also 1, the default: the cheaper)
                                   or a stream write node (memop); 0: a replay is one
                                   launch, its nodes unnamed (benchmarks/RESULTS.md: what
                                   each costs a replay)
    CUDA_DEBUG_SANITIZER=PATH      cuda-debug replay: NVIDIA's libsanitizer-public.so (the
                                   file or its folder), instead of looking for it
    CUDA_DEBUG_REPLAY_TRACE=1      cuda-debug replay: each instrumented launch's steps and
                                   the Sanitizer API's results on stderr (read by the C core)
    CUDA_DEBUG_LAUNCH_HOOKS=0|1    while watching, PyTorch's launches (every library's calls
                                   of the runtime's __cudaLaunchKernel) are recorded without
                                   CUPTI's dispatch (default 1; read by the C core at each
                                   watch() entry; 0: every launch through CUPTI's callback)
    CUDA_DEBUG_GRAPH_MARKER_EVERY=K
                                   a marker behind every K-th launch of each stream of
                                   a capture, and behind every NCCL kernel (default 8:
                                   a fault or hang names one of at most K nodes, the
                                   device's text picks the kernel; 1: every node, exact,
                                   at 1.05x a transformer step's replay); 1 to 1024
    CUDA_DEBUG_GRAPH_ADOPT=1|0     torch.cuda.CUDAGraph captures made while nothing
                                   watches are read at their end (their kernels, the
                                   capture line: no CUPTI, nothing at replay), so a
                                   replay inside watch() can be named by the device's
                                   text (default 1; 0 leaves torch alone)
    CUDA_DEBUG_COMMIT=...          the commit benchmarks record (benchmarks/ only)
    CUDA_DEBUG_TEST_FRAME_READER=none  tests only: run as if this Python had no frame
                                   reader (read by the C core when it is imported)

An unknown name or value is warned about at import, naming the valid ones, and
the default is used. The warning points at the line that imported cuda_debug.

This module is imported by ``import cuda_debug``: it imports nothing that a bare
interpreter has not loaded already (``os``); ``warnings`` only to warn.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import sys

import _signal               # built in (signal.py would import enum)

_BOOL = {"1": True, "0": False, "on": True, "off": False, "true": True, "false": False,
         "yes": True, "no": False}
_CHOICES = {
    "CUDA_DEBUG_REPORT": (_BOOL, True),
    "CUDA_DEBUG_CAPTURE": (_BOOL, True),
    "CUDA_DEBUG_WAIT": ({"sync": 0, "spin": 1, "none": 2}, 0),
    "CUDA_DEBUG_PROFILE": (_BOOL, False),
    "CUDA_DEBUG_CAPTURE_CHECK": (_BOOL, True),
    "CUDA_DEBUG_WATCH_OPS": (_BOOL, False),
    "CUDA_DEBUG_WATCH_EXACT": (_BOOL, False),
    "CUDA_DEBUG_CUPTI_DETACH": (_BOOL, False),
    "CUDA_DEBUG_WATCH_PROBE": ({"off": 0, "0": 0, "dispatch": 1, "record": 2, "frames": 3}, 0),
    "CUDA_DEBUG_GUARD": (_BOOL, False),
    "CUDA_DEBUG_DUMP": (_BOOL, True),
    # kernel first: the warning names the default by its first name (not "1")
    "CUDA_DEBUG_GRAPH_MARKERS": (dict(kernel=2, memop=1, **{k: 2 * int(v) for k, v in _BOOL.items()}),
                                 2),
    "CUDA_DEBUG_GRAPH_ADOPT": (_BOOL, True),
    "CUDA_DEBUG_REPLAY_TRACE": (_BOOL, False),
    "CUDA_DEBUG_LAUNCH_HOOKS": (_BOOL, True),
}
_FREE = ("CUDA_DEBUG_COMMIT", "CUDA_DEBUG_TEST_FRAME_READER", "CUDA_DEBUG_TRACE",
         "CUDA_DEBUG_SANITIZER", "CUDA_DEBUG_WARPS", "CUDA_DEBUG_CUDA_GDB")
#: checked by read() itself: seconds, a signal, numbers of launches
_SPECIAL = ("CUDA_DEBUG_HANG_AFTER", "CUDA_DEBUG_DUMP_SIGNAL", "CUDA_DEBUG_WATCH_EVERY",
            "CUDA_DEBUG_GRAPH_MARKER_EVERY")
#: CUDA_DEBUG_GRAPH_MARKER_EVERY's default: a marker behind every 8th launch of a stream
#: of a capture (docs/costs.md, "Inside CUDA graphs": what 1, 4 and 8 cost a replay)
DEFAULT_MARKER_EVERY = 8
_OFF = ("", "0", "off", "no", "false")
#: settings a user may guess from PYTHONFAULTHANDLER's habit, and what does it
#: (docs/settings.md: a switch read at import cannot watch a program that never
#: imports cuda_debug, and would make every pytest run of the environment watch)
_GUESSES = {
    "CUDA_DEBUG_WATCH": ": to watch a whole program, run it with `cuda-debug run script.py` "
                        "(watching is its default; in code: `with cuda_debug.watch():`)",
    "CUDA_DEBUG_LAUNCH_BLOCKING": ": for synchronous launches in a whole program, run it with "
                                  "`cuda-debug run --launch-blocking script.py` (in code: `with "
                                  "cuda_debug.launch_blocking():`)",
}
#: CUDA_DEBUG_DUMP_SIGNAL's values: name -> number, 0 off
DUMP_SIGNALS = {"sigusr1": _signal.SIGUSR1, "usr1": _signal.SIGUSR1,
                "sigusr2": _signal.SIGUSR2, "usr2": _signal.SIGUSR2, "off": 0}


class Options:
    """The checked switches (a plain class: ``typing.NamedTuple`` would cost
    ``import typing``, several ms, at every ``import cuda_debug``)."""

    __slots__ = ("report", "capture", "wait", "profile", "capture_check", "watch_ops", "guard",
                 "hang_after", "dump_signal", "graph_markers", "watch_exact", "watch_every",
                 "watch_probe", "cupti_detach", "dump", "trace", "graph_marker_every",
                 "graph_adopt")

    def __init__(self, report: bool, capture: bool, wait: int, profile: bool,
                 capture_check: bool, watch_ops: bool, guard: bool = False,
                 hang_after: "float | None" = None, dump_signal: int = _signal.SIGUSR1,
                 graph_markers: int = 2, watch_exact: bool = False,
                 watch_every: int = 16, watch_probe: int = 0, cupti_detach: bool = False,
                 dump: bool = True, trace: "str | None" = None, graph_marker_every: int = 8,
                 graph_adopt: bool = True):
        self.report, self.capture, self.wait = report, capture, wait
        self.profile, self.capture_check, self.watch_ops = profile, capture_check, watch_ops
        self.guard = guard
        self.hang_after = hang_after        # seconds, None: off
        self.dump_signal = dump_signal      # signal number, 0: off
        self.graph_markers = graph_markers  # 0 off, 1 memop, 2 kernel
        self.watch_exact = watch_exact      # a marker behind every launch
        self.watch_every = watch_every      # else behind every K-th launch of a stream
        self.watch_probe = watch_probe      # measurements only: 0 off
        self.cupti_detach = cupti_detach    # cuptiFinalize when the last scope closes
        self.dump = dump                    # the dump listener (cuda-debug dump PID)
        self.trace = trace                  # CUDA_DEBUG_TRACE: a path, None: off
        self.graph_marker_every = graph_marker_every   # a marker every K launches (8)
        self.graph_adopt = graph_adopt      # torch's graphs captured before watch() adopted

    def __repr__(self):
        return "Options(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IMPORTLIB = os.path.join(os.path.dirname(os.path.abspath(os.__file__)), "importlib") + os.sep


def _outside_frame():
    """The innermost frame of the caller that is neither cuda_debug's nor the
    import system's (``<frozen importlib._bootstrap>``, ``importlib/``): the
    line that imported cuda_debug, where a setting warning belongs."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") if name.startswith("<") else
                os.path.abspath(name).startswith((_PACKAGE, _IMPORTLIB))):
            break
        frame = frame.f_back
    return frame


#: where the first frame outside cuda_debug is a test runner's plugin loading, not a
#: line of the user's: pytest imports cuda_debug through its pytest11 entry point
_LOADERS = ("_pytest", "pluggy", "pytest")


def _variable(message: str) -> str:
    """The CUDA_DEBUG_* name a setting warning is about (the first in `message`)."""
    i = message.find("CUDA_DEBUG_")
    j = i
    while j < len(message) and (message[j].isupper() or message[j].isdigit() or
                                message[j] == "_"):
        j += 1
    return message[i:j] if i >= 0 else "CUDA_DEBUG_*"


def _warn(message: str) -> None:
    """A RuntimeWarning at the caller's line outside cuda_debug and importlib
    (what ``warnings.warn(stacklevel=...)`` does, with the level found by walking
    the frames: it depends on how cuda_debug was reached). Where a test runner
    imported cuda_debug (pytest loads its plugin in every run of the
    environment), no line of the user's did: the warning points at the variable.
    A setting never stops a program: where a filter makes warnings errors
    (``-W error``, pytest's ``filterwarnings = error``), it is written to stderr
    as the warning would have been, and nothing is raised."""
    import warnings
    frame = _outside_frame()
    g = frame.f_globals
    module = g.get("__name__", "<string>")
    if str(module).split(".")[0] in _LOADERS:
        filename, lineno, module, registry = "<environment %s>" % _variable(message), 0, \
            "cuda_debug", None
    else:
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
        registry = g.setdefault("__warningregistry__", {})
    try:
        warnings.warn_explicit(message, RuntimeWarning, filename, lineno, module=module,
                               registry=registry)
    except Exception:
        try:
            sys.stderr.write(warnings.formatwarning(message, RuntimeWarning, filename, lineno,
                                                    line=""))
        except Exception:
            pass


def launch_hooks_wanted(environ=os.environ) -> bool:
    """CUDA_DEBUG_LAUNCH_HOOKS as every reader reads it (read at each watch()
    entry, so that it can change between watches; the C core is handed this
    value, it never parses the variable itself): `read()`'s table, after
    strip() and lower(); an unknown value is the default (read() warned)."""
    raw = environ.get("CUDA_DEBUG_LAUNCH_HOOKS")
    if raw is None or raw.strip() == "":
        return True
    return _BOOL.get(raw.strip().lower(), True)


def read(environ=os.environ) -> Options:
    values = {}
    for name, (table, default) in _CHOICES.items():
        raw = environ.get(name)
        if raw is None or raw == "":
            values[name] = default
            continue
        key = raw.strip().lower()
        if key not in table:
            _warn("cuda_debug: %s=%r is not one of %s; using the default (%s)"
                  % (name, raw, "|".join(table), _default_name(table, default)))
            values[name] = default
        else:
            values[name] = table[key]
    hang_after = hang_after_seconds(environ.get("CUDA_DEBUG_HANG_AFTER"))
    raw = environ.get("CUDA_DEBUG_DUMP_SIGNAL")
    dump_signal = DUMP_SIGNALS.get((raw or "sigusr1").strip().lower())
    if dump_signal is None:
        _warn("cuda_debug: CUDA_DEBUG_DUMP_SIGNAL=%r is not one of SIGUSR1|SIGUSR2|off; "
              "using the default (SIGUSR1)" % raw)
        dump_signal = _signal.SIGUSR1
    watch_every = watch_every_launches(environ.get("CUDA_DEBUG_WATCH_EVERY"))
    raw = environ.get("CUDA_DEBUG_GRAPH_MARKER_EVERY")
    every = DEFAULT_MARKER_EVERY
    if raw not in (None, ""):
        try:
            every = int(raw.strip())
        except ValueError:
            every = 0
        if not 1 <= every <= 1024:
            _warn("cuda_debug: CUDA_DEBUG_GRAPH_MARKER_EVERY=%r is not a whole number from 1 "
                  "to 1024; using the default (%d)" % (raw, DEFAULT_MARKER_EVERY))
            every = DEFAULT_MARKER_EVERY
    known = set(_CHOICES) | set(_FREE) | set(_SPECIAL)
    for name in environ:
        if name.startswith("CUDA_DEBUG_") and name not in known:
            _warn("cuda_debug: unknown setting %s%s (known: %s)" % (
                name, _GUESSES.get(name, ""), ", ".join(sorted(known))))
    return Options(report=values["CUDA_DEBUG_REPORT"], capture=values["CUDA_DEBUG_CAPTURE"],
                   wait=values["CUDA_DEBUG_WAIT"], profile=values["CUDA_DEBUG_PROFILE"],
                   capture_check=values["CUDA_DEBUG_CAPTURE_CHECK"],
                   watch_ops=values["CUDA_DEBUG_WATCH_OPS"],
                   guard=values["CUDA_DEBUG_GUARD"],
                   hang_after=hang_after, dump_signal=int(dump_signal),
                   graph_markers=values["CUDA_DEBUG_GRAPH_MARKERS"],
                   watch_exact=values["CUDA_DEBUG_WATCH_EXACT"], watch_every=watch_every,
                   watch_probe=values["CUDA_DEBUG_WATCH_PROBE"],
                   cupti_detach=values["CUDA_DEBUG_CUPTI_DETACH"],
                   dump=values["CUDA_DEBUG_DUMP"],
                   trace=environ.get("CUDA_DEBUG_TRACE") or None,
                   graph_marker_every=every,
                   graph_adopt=values["CUDA_DEBUG_GRAPH_ADOPT"])


#: The always-on watch's default: a marker behind every 16th launch of a stream
#: (benchmarks/RESULTS.md: what 8, 16 and 32 cost).
WATCH_EVERY = 16


def watch_every_launches(raw):
    """CUDA_DEBUG_WATCH_EVERY's value: K in 2..65536 (warned about, and the
    default, when it is not)."""
    if raw is None or raw.strip() == "":
        return WATCH_EVERY
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 2 <= value <= 65536:
        _warn("cuda_debug: CUDA_DEBUG_WATCH_EVERY=%r is not a number of launches from 2 to "
              "65536 (for a marker behind every launch: CUDA_DEBUG_WATCH_EXACT=1); using the "
              "default (%d)" % (raw, WATCH_EVERY))
        return WATCH_EVERY
    return value


def parse_seconds(text):
    """A number of seconds > 0 written as `text`, or None."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if 0 < value < 1e9 else None


#: The shortest hang_after the hang watcher honours: it looks at the launches
#: every hang_after/4, 50 ms at the shortest (csrc/hooks/hang_watcher.c,
#: _core.HANG_STEP_MIN_NS), so below two of its steps a report would come late
#: by more than half the time asked for; and its report gives tenths of a second.
HANG_AFTER_MIN = 0.1


def hang_after_too_short(value) -> "str | None":
    """Why `value` seconds (> 0) cannot be a hang_after, or None when it can."""
    if value >= HANG_AFTER_MIN:
        return None
    return ("%g s is below %g s, the shortest the hang watcher honours (it looks at the "
            "launches every 50 ms at the shortest); 0 turns it off" % (value, HANG_AFTER_MIN))


def hang_after_seconds(raw):
    """CUDA_DEBUG_HANG_AFTER's value: seconds (>= HANG_AFTER_MIN), or None for
    off (warned about, and off, when it is neither)."""
    if raw is None or raw.strip().lower() in _OFF:
        return None
    value = parse_seconds(raw)
    if value is None:
        _warn("cuda_debug: CUDA_DEBUG_HANG_AFTER=%r is not a number of seconds > 0 "
              "(or off); the hang report is off" % raw)
    elif hang_after_too_short(value):
        _warn("cuda_debug: CUDA_DEBUG_HANG_AFTER=%r refused: %s; the hang report is off"
              % (raw, hang_after_too_short(value)))
        return None
    return value


def _default_name(table, default) -> str:
    for k, v in table.items():
        if v == default:
            return k
    return str(default)


OPTIONS = read()
_applied = False


def apply() -> None:
    """Hand the options to the C core (once, before the first scope opens)."""
    global _applied
    if _applied:
        return
    from . import _core
    _core.set_options(wait=OPTIONS.wait, tee_stderr=OPTIONS.capture, profile=OPTIONS.profile,
                      capture_check=OPTIONS.capture_check,
                      graph_markers=OPTIONS.graph_markers, watch_probe=OPTIONS.watch_probe,
                      detach=OPTIONS.cupti_detach,
                      graph_marker_every=OPTIONS.graph_marker_every)
    _applied = True
