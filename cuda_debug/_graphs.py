"""CUDA graphs captured by PyTorch before watch() began, and the life of every graph.

Serving engines capture their graphs at start-up and replay them for hours; a
user who wraps the serving loop in ``with cuda_debug.watch():`` replays graphs
that were captured while nothing watched: no node records, no markers inside
them. PyTorch captures every graph through ``torch.cuda.CUDAGraph.capture_end``
(``torch.cuda.graph``, ``make_graphed_callables``, cudagraph trees of
``torch.compile(mode="reduce-overhead")``): this module wraps it, from the
moment ``torch.cuda.graphs`` is imported (a ``sys.meta_path`` hook set by
``import cuda_debug``; at once when torch came first). At the end of a capture
made while nothing watched, while the stream still captures, C reads the graph
being captured through the driver's graph API (cuStreamGetCaptureInfo,
cuGraphGetNodes, cuGraphKernelNodeGetParams, cuFuncGetName: no CUPTI) and keeps
its kernel nodes with the line that captured the graph
(csrc/capture/graph_adopt.c, cd_graph_adopt); the executable torch made is
paired with them (the executable table that replays look up). A fault in a
replay of such a graph, inside watch(), is named when the device's assert text
names one of its kernels: that node, its number, the line that launched it
during the capture, the replay line. Nothing else can say which node of a
graph without markers faulted or hangs: the report says so, with the graph's
capture line.

Each node's own line: nothing sees a launch outside watch(), so from
``capture_begin`` to ``capture_end`` a trace function on the capturing thread
(C, python/py_capture.c) reads the graph's node count at each event of a user
frame: the nodes made since the last one are the current user line's. Where a
node's line could not be known, it keeps the line that ended the capture and
``_core.graph_node_line(node)`` says why (``ADOPT_LINE_*``: the capture's
beginning was not seen; a tracer such as a debugger or coverage was set;
...). No tracer is replaced: with one set, lines are not followed.

The wrapper costs nothing on the launch path and nothing at replay: it runs
during each capture made while nothing watched (a driver call per event of a
user frame) and at ``reset()``/``instantiate()``. CUPTI stays untouched
outside watch(), free for profilers. ``CUDA_DEBUG_GRAPH_ADOPT=0`` leaves torch
alone.

It also ties a graph's executable to its CUDAGraph object: when the object goes
(or is reset), the executable's entry and its capture's hold on the markers are
dropped (cd_graph_release_exec), even when that happens while nothing is
subscribed to CUPTI (whose destruction callbacks would have said so while
watching).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import sys
import weakref

from . import _core, _libraries, _locations, _options

_installed = []                # the CUDAGraph classes wrapped
_pending = weakref.WeakSet()   # adopted captures whose executable is not made yet
_stats = {"adopted": 0, "paired": 0, "released": 0, "failed": 0}


def stats() -> dict:
    """Counters: captures adopted, executables paired and released, hook failures."""
    return dict(_stats)


def install(module=None) -> bool:
    """Wrap torch.cuda.CUDAGraph's capture_begin, capture_end, reset and
    instantiate (once)."""
    if not _options.OPTIONS.graph_adopt:
        return False
    module = module or sys.modules.get("torch.cuda.graphs")
    cls = getattr(module, "CUDAGraph", None)
    if cls is None or cls in _installed or getattr(cls.capture_end, "_cuda_debug", False):
        return False
    orig_end, orig_reset = cls.capture_end, cls.reset
    orig_begin = getattr(cls, "capture_begin", None)      # (a stand-in may have none)
    orig_instantiate = getattr(cls, "instantiate", None)

    def capture_begin(self, *args, **kwargs):
        out = orig_begin(self, *args, **kwargs)
        _follow(self)
        return out

    def capture_end(self):
        token = _before_end(self)
        orig_end(self)
        _after_end(self, token)

    def reset(self):
        _release(self)
        return orig_reset(self)

    capture_begin._cuda_debug = capture_end._cuda_debug = reset._cuda_debug = True
    capture_begin.__wrapped__ = orig_begin
    capture_end.__wrapped__, reset.__wrapped__ = orig_end, orig_reset
    capture_begin.__doc__ = orig_begin.__doc__
    capture_end.__doc__, reset.__doc__ = orig_end.__doc__, orig_reset.__doc__
    cls.capture_end, cls.reset = capture_end, reset
    if orig_begin is not None:
        cls.capture_begin = capture_begin
    if orig_instantiate is not None:
        def instantiate(self, *args, **kwargs):
            out = orig_instantiate(self, *args, **kwargs)
            try:
                _pair(self)
            except Exception:
                _stats["failed"] += 1
            return out
        instantiate._cuda_debug = True
        instantiate.__wrapped__, instantiate.__doc__ = orig_instantiate, orig_instantiate.__doc__
        cls.instantiate = instantiate
    _installed.append(cls)
    return True


def _stream_of(graph) -> int:
    import torch
    return torch.cuda.current_stream().cuda_stream


def _follow(graph) -> None:
    """At the beginning of a capture (the stream capturing): follow which user
    line makes each node, unless a watch() tracks the capture (C says so) or a
    tracer is set (then only why)."""
    try:
        if not _libraries.load(_libraries.CUDA).loaded:
            return
        _locations.configure()              # which frames are the user's
        why = _core.ADOPT_LINE_TRACED if sys.gettrace() is not None else 0
        _core.graph_adopt_follow(_stream_of(graph), why)
    except Exception:
        _stats["failed"] += 1


def _before_end(graph) -> int:
    """At the end of a capture, the stream still capturing: its nodes, when no
    watch() tracked the capture. The capture's token, or 0."""
    try:
        _release(graph)                     # captured again without reset(): the old one goes
        if not _libraries.load(_libraries.CUDA).loaded:
            return 0
        _locations.configure()              # which frames are the user's (the capture line)
        token = _core.graph_adopt(_stream_of(graph))
        if token > 0:
            _stats["adopted"] += 1
        return max(token, 0)
    except Exception:
        _stats["failed"] += 1
        return 0


def _exec_of(graph) -> int:
    try:
        return int(graph.raw_cuda_graph_exec() or 0)
    except Exception:                       # keep_graph=True: not instantiated yet
        return 0


def _after_end(graph, token: int) -> None:
    try:
        graph._cuda_debug_token = token
        if token:
            _pending.add(graph)
        _pair(graph)
    except Exception:
        _stats["failed"] += 1


def _pair(graph) -> None:
    """Tie the graph's executable (new, or made again by instantiate()) to its
    capture (an adopted one) and to the object's life."""
    exe = _exec_of(graph)
    old = getattr(graph, "_cuda_debug_exec", 0)
    if not exe or exe == old:
        return
    _pending.discard(graph)
    token = getattr(graph, "_cuda_debug_token", 0)
    if token and _core.graph_adopt_exec(token, exe):
        _stats["paired"] += 1
    fin = getattr(graph, "_cuda_debug_finalizer", None)
    if fin is not None:
        fin.detach()
    if old and _core.graph_release_exec(old):   # made again: the one before is gone
        _stats["released"] += 1
    graph._cuda_debug_exec = exe
    graph._cuda_debug_finalizer = weakref.finalize(graph, _gone, exe, token)


def _gone(exe: int, token: int) -> None:
    if _core.graph_release_exec(exe):
        _stats["released"] += 1
    if token:
        _core.graph_adopt_drop(token)


def _release(graph) -> None:
    fin = getattr(graph, "_cuda_debug_finalizer", None)
    if fin is not None:
        graph._cuda_debug_finalizer = None
        fin()
    elif getattr(graph, "_cuda_debug_token", 0):
        _core.graph_adopt_drop(graph._cuda_debug_token)
    graph._cuda_debug_token = 0
    graph._cuda_debug_exec = 0
    _pending.discard(graph)


def pair_pending() -> None:
    """At watch() entry: adopted graphs instantiated since (keep_graph=True,
    instantiated by their first replay) get their executable paired."""
    for graph in list(_pending):
        try:
            _pair(graph)
        except Exception:
            _stats["failed"] += 1
