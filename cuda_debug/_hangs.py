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
- ``python -m cuda_debug dump PID`` (cuda_debug/_dump.py): the same report in
  the caller's terminal, from a thread of ours that answers on a socket
  (csrc/hooks/dump_server.c; ``--json`` the fields below; no signal sent);
- the dump signal (``SIGUSR1``; ``CUDA_DEBUG_DUMP_SIGNAL=SIGUSR2|off``), sent by
  hand: the same report on the process's own stderr, from the signal handler;
- :func:`in_flight`: the report's fields as records, for tools that print their own.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import threading
import warnings
from typing import List, NamedTuple, Optional, Tuple

from . import _core, _locations, _options


class InFlight(NamedTuple):
    """One stream's oldest unfinished launch (:func:`in_flight`). For a CUDA
    graph replay, `kernel`, `short` and `collective` are those of the node of
    its graph still running (the first of `graph_nodes`), None when the graph's
    markers do not say (captured before watching); `filename`/`lineno` are
    the replay's line, `captured_at` the node's."""
    kernel: Optional[str]          # demangled
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
    stack: List[Tuple[str, int, str, Optional[str]]]   # (filename, lineno, function, line),
    #                                                    outermost first
    candidates: int                # 1: this launch is unfinished; n > 1 (the always-on
    #                                watch's sparse markers): this launch or one of the
    #                                next n - 1 of its stream is, the first unfinished one
    graph_node: Optional[int] = None       # a replay: the running node's number in its graph
    captured_at: Optional[str] = None      # a replay: "file:line in function" that captured it
    graph_nodes: tuple = ()        # a replay: every candidate, (node, short, collective, captured_at)
    graph_note: Optional[str] = None       # a replay whose nodes are not named: why
    graph_annotation: Optional[dict] = None    # torch.cuda.graph_annotations' tag of the node


def in_flight() -> List[InFlight]:
    """Every stream's oldest unfinished launch among those recorded while
    watching (the last 65,536), oldest first; ``[]`` when all have finished.
    Reads host memory only: it never waits for the GPU, and works while
    another thread is stuck in a CUDA call."""
    rows, _ = _core.in_flight()
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = []
    for (seq, stream, kernel, short, collective, tid, device, frames, flags, age_ns, queued,
         _last, _cbid, candidates, _open, graph_info) in rows:
        graph = bool(flags & _core.WATCH_GRAPH)
        nodes, note = _graph_candidates(graph_info) if graph else ((), None)
        out.append(record(seq=seq, stream=stream, kernel=kernel.decode("utf-8", "replace"),
                          short=short, collective=collective, graph=graph,
                          thread_id=tid, thread_name=names.get(tid), device=device,
                          stack=_locations.stack_from_ids(frames), age_ns=age_ns, queued=queued,
                          candidates=candidates, graph_nodes=nodes, graph_note=note))
    return out


def _demangled(kernel: str) -> str:
    """The kernel's name demangled, else as given (a name with bytes that are
    not UTF-8, which the document spells as lone surrogates, stays as given)."""
    try:
        return _core.demangle(kernel) or kernel
    except (UnicodeEncodeError, ValueError):
        return kernel


def record(seq, stream, kernel, short, collective, graph, thread_id, thread_name, device, stack,
           age_ns, queued, candidates=1, graph_nodes=(), graph_note=None) -> InFlight:
    """One InFlight from a stream's raw fields (this process's ring, or the
    document another process's dump listener sent: cuda_debug/_dump.py). For a
    graph replay, `graph_nodes` (dicts: node, kernel, short, collective,
    captured_at, annotation) are the candidates of its graph: the running node,
    or with markers every K nodes one of them (an NCCL kernel among them first:
    it waits for the other ranks, as C's report names it first)."""
    fs = _locations.user_frame(stack, complete=False)
    first = next((n for n in graph_nodes if n["collective"]),
                 graph_nodes[0] if graph_nodes else None)
    if graph:
        kernel = first["kernel"] if first else None
        short = first["short"] if first else None
        collective = first["collective"] if first else None
    return InFlight(
        kernel=_demangled(kernel) if kernel else None,
        short=short or None, collective=collective, graph=graph,
        stream=stream, device=device if device is not None and device >= 0 else None,
        thread_id=thread_id, thread_name=thread_name, filename=fs.filename if fs else None,
        lineno=fs.lineno if fs else None, function=fs.name if fs else None,
        age_s=age_ns / 1e9, queue_depth=queued, seq=seq,
        stack=[(f.filename, f.lineno, f.name, f.line) for f in stack], candidates=candidates,
        graph_node=first["node"] if first else None,
        captured_at=first["captured_at"] if first else None,
        graph_nodes=tuple((n["node"], n["short"], n["collective"], n["captured_at"])
                          for n in graph_nodes),
        graph_note=graph_note,
        graph_annotation=first["annotation"] if first else None)


def _graph_candidates(info):
    from . import _graph_names
    return _graph_names.node_candidates(info)


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
    _looker.clear()            # its thread is the parent's


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


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def enter(hang_after: Optional[float]) -> None:
    """A watch() opened: the dump listener (``cuda-debug dump PID``: once per
    process), the dump signal (installed again if something replaced it), and
    its hang_after, if any (the shortest of the open ones counts)."""
    if _options.OPTIONS.dump and _core.dump_listener(1)[0] != 1:
        try:
            _core.dump_listen(_env_int("RANK", -1), max(_env_int("WORLD_SIZE", 0), 0))
        except OSError as e:
            if "listen" not in _warned:
                _warned.append("listen")
                warnings.warn("cuda_debug: `cuda-debug dump` cannot ask this process (the "
                              "listener did not start: %s); SIGUSR1 still writes the report "
                              "to its stderr" % e, RuntimeWarning, stacklevel=3)
    if _options.OPTIONS.dump:
        from . import _dump_job as _job
        if _job.wanted():          # under torchrun: `dump --job` through the job's store
            _job.start()
    sig = _options.OPTIONS.dump_signal
    if sig:
        import signal
        try:
            # Python's own handlers (signal.signal) tell C which C function is Python's.
            _core.install_dump_signal(sig, callable(signal.getsignal(sig)),
                                      callable(signal.getsignal(signal.SIGINT)))
        except OSError as e:
            if sig not in _warned:
                _warned.append(sig)
                warnings.warn("cuda_debug: the dump signal (%d) could not be installed: %s"
                              % (sig, e), RuntimeWarning, stacklevel=3)
    if hang_after:
        with _lock:
            _active.append(hang_after)
            _core.set_hang_after(min(_active))
            _start_warps_looker()


_looker = []                   # the warps looker (CUDA_DEBUG_WARPS=1), once started


def _start_warps_looker() -> None:
    """Under _lock: with CUDA_DEBUG_WARPS=1, where the warps are after each
    hang report (_warps.HangLooker), while a hang_after watch is open."""
    if _looker and _looker[0]._thread.is_alive():
        return
    from . import _warps
    if not _warps.allowed():
        return
    _looker[:] = [_warps.HangLooker(_core.hang_state()[1], lambda: _core.hang_state()[1],
                                    lambda: bool(_active))]


def leave(hang_after: Optional[float]) -> None:
    if hang_after:
        with _lock:
            if hang_after not in _active:
                return             # a watch() of the parent, left in a forked child
            _active.remove(hang_after)
            _core.set_hang_after(min(_active) if _active else 0)
