"""Hangs: what is still running on the GPU, while watching.

A kernel that never finishes raises nothing: a spin on a flag, a deadlock, a
collective that one rank never joins. The watch ring knows, per stream, the
oldest launch whose completion marker has not come back (csrc/capture/
inflight.c), read from host memory while the GPU and the launching thread
are stuck. Three ways to ask:

- ``watch(hang_after=s)`` (``CUDA_DEBUG_HANG_AFTER``, ``run --hang-after``): a
  thread in C (csrc/hooks/hang_watcher.c) writes the report to fd 2 when a
  launch has stayed unfinished for s seconds while later launches queue behind
  it on its stream or the host launches nothing at all (it waits), once per
  stuck launch, and the process goes on;
- the dump signal (``SIGUSR1``; ``CUDA_DEBUG_DUMP_SIGNAL=SIGUSR2|off``), sent by
  ``python -m cuda_debug dump PID``: the same report, from the signal handler;
- :func:`in_flight`: the report's fields as records, for tools that print their own.
"""
import os
import threading
import warnings
from typing import List, NamedTuple, Optional

from . import _core, _locations, _options


class InFlight(NamedTuple):
    """One stream's oldest unfinished launch (:func:`in_flight`)."""
    kernel: Optional[str]          # demangled; None for a CUDA graph replay
    short: Optional[str]           # the short name the report prints
    collective: Optional[str]      # NCCL launches: "all_reduce", "broadcast"... else None
    graph: bool                    # a CUDA graph replay
    stream: int
    device: Optional[int]
    thread_id: int                 # the launching thread (gettid)
    thread_name: Optional[str]     # its Python name, when it is a Python thread alive now
    filename: Optional[str]        # the launching line (innermost frame of user code)
    lineno: Optional[int]
    function: Optional[str]
    age_s: float                   # since the launch
    queue_depth: int               # launches recorded after it on the same stream
    seq: int                       # its watch-ring number ("launch #seq" in the report)
    stack: list                    # (filename, lineno, function, line), outermost first


def in_flight() -> List[InFlight]:
    """Every stream's oldest unfinished launch among those recorded while
    watching (the last 65,536), oldest first; ``[]`` when all have finished.
    Reads host memory only: it never waits for the GPU, and works while
    another thread is stuck in a CUDA call."""
    rows, _ = _core.in_flight()
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = []
    for (seq, stream, kernel, short, collective, tid, device, frames, flags, age_ns, queued,
         _last, _cbid) in rows:
        graph = bool(flags & _core.WATCH_GRAPH)
        kernel = kernel.decode("utf-8", "replace")
        stack = _locations.stack_from_ids(frames)
        fs = _locations.user_frame(stack, complete=False)
        out.append(InFlight(
            kernel=None if graph or not kernel else (_core.demangle(kernel) or kernel),
            short=None if graph else short or None, collective=collective, graph=graph,
            stream=stream, device=device if device >= 0 else None, thread_id=tid,
            thread_name=names.get(tid), filename=fs.filename if fs else None,
            lineno=fs.lineno if fs else None, function=fs.name if fs else None,
            age_s=age_ns / 1e9, queue_depth=queued, seq=seq,
            stack=[(f.filename, f.lineno, f.name, f.line) for f in stack]))
    return out


# -- watch(hang_after=...) and the dump signal ---------------------------------------

_lock = threading.Lock()
_active = []                   # hang_after of each open watch() that has one
_warned = []


def _after_fork_in_child():
    """A forked child watches nothing (csrc/hooks/after_fork.c): the parent's
    open watches are not its own, and a lock another thread held is free."""
    global _lock
    _lock = threading.Lock()
    _active.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_hang_after(value) -> Optional[float]:
    """watch(hang_after)'s value: seconds, or None for off (None: the
    CUDA_DEBUG_HANG_AFTER default; 0: off)."""
    if value is None:
        return _options.OPTIONS.hang_after
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("watch(hang_after) takes a number of seconds (0: off), not %r" % (value,))
    if value == 0:
        return None
    if not 0 < value < 1e9:
        raise ValueError("watch(hang_after=%r): a number of seconds > 0 (0: off)" % (value,))
    why = _options.hang_after_too_short(value)
    if why:
        raise ValueError("watch(hang_after=%r): %s" % (value, why))
    return float(value)


def enter(hang_after: Optional[float]) -> None:
    """A watch() opened: the dump signal (installed again if something replaced
    it), and its hang_after, if any (the shortest of the open ones counts)."""
    sig = _options.OPTIONS.dump_signal
    if sig:
        import signal
        try:
            # Python's own handlers (signal.signal) tell C which C function is Python's.
            _core.install_dump_signal(sig, callable(signal.getsignal(sig)),
                                      callable(signal.getsignal(signal.SIGINT)))
        except OSError as e:
            if not _warned:
                _warned.append(sig)
                warnings.warn("cuda_debug: the dump signal (%d) could not be installed: %s"
                              % (sig, e), RuntimeWarning, stacklevel=3)
    if hang_after:
        with _lock:
            _active.append(hang_after)
            _core.set_hang_after(min(_active))


def leave(hang_after: Optional[float]) -> None:
    if hang_after:
        with _lock:
            if hang_after not in _active:
                return             # a watch() of the parent, left in a forked child
            _active.remove(hang_after)
            _core.set_hang_after(min(_active) if _active else 0)
