"""The one path from raw C records to the user's cuda_debug exception.

Capture is cheap at the event: the launch callback copies a few numbers, the
driver's text and the launching thread's frames as interned location ids,
without the GIL. Everything Python-shaped is built here, only when a fault is
reported: the short kernel name, the launching stack as a StackSummary, the
innermost frame of *user* code, the driver-log lines, the watch culprit.

Callers (scope and watch exit, ``check()``, ``last_error()``, ``cuda_debug.testing``,
``run``, the pytest plugin, the notebook) call :func:`error_for` and never
re-parse formatted text.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import sys
import threading
import traceback
from typing import List, NamedTuple, Optional, Sequence

from . import _core, _cuda_errors, _dispatch_fallback, _graph_names, _options, _replay_command
from . import _torch_ops
from . import _locations, _notes
from ._locations import compiled_frame, is_user_file, stack_from, stack_from_ids, user_frame
from ._errors import CudaError, class_for


class RawFault(NamedTuple):
    """A C fault record, named (csrc/report/report.h: cd_fault)."""
    seq: int
    code: int
    at_launch: int
    consequence: int          # the context was already dead: an echo of an earlier fault
    cbid: int
    kernel: bytes             # mangled, cut at 1023 bytes
    kernel_len: int
    grid: tuple
    block: tuple
    shared_mem: int
    stream: int
    context: int
    device: int
    thread_id: int
    thread_name: bytes        # raw: may be cut inside a UTF-8 character
    wall_time: float
    launch_seq: int           # the watch-ring seq of the launch, 0 when not watching
    frames: tuple             # location ids, innermost first
    frames_complete: int      # 1: the walk reached the outermost frame
    device_message: bytes     # what this thread got from the driver during its wait
    device_message_cut: int   # bytes that did not fit (all of them went to stderr)
    log_end: int
    ops: tuple                # at::_ops::<name> frames of the native stack, innermost first
    assert_level: int         # _core.ASSERT_*: how the assert text belongs to this kernel
    cause_seq: int            # a consequence: the record of its context's cause, 0 unknown
    cause_thread: int         # and that record's thread


class WatchRecord(NamedTuple):
    """A watch-ring record (csrc/capture/capture.h: cd_watch_record)."""
    seq: int
    stream: int
    kernel: bytes
    grid: tuple
    block: tuple
    shared_mem: int
    thread_id: int
    device: int
    frames: tuple
    flags: int
    cbid: int
    done: bool
    op: int                   # watch(ops=True): the op token of the launching thread, 0 none
    graph: int                # a replay: 1 + the capture it replays (0 unknown); a node: its capture
    origin: int               # _core.ORIGIN_*: whose kernel (user/JIT, generated, PyTorch's, a vendor's)


def faults(since: int = 0) -> List[RawFault]:
    return [RawFault(*t) for t in _core.faults(since)]


def watch_record(seq: int) -> Optional[WatchRecord]:
    t = _core.watch_record(seq)
    return WatchRecord(*t) if t is not None else None


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _generated_module(name: str, stack):
    """(path, lines, launch line) of the module Inductor generated that
    defines kernel `name`: the one in the launching stack (with the line of its
    `call` that launched), else the one loaded module that defines it (the
    launch line read from its source); None where not found."""
    for fs in reversed(stack or ()):
        if "torchinductor_" in fs.filename and fs.filename.endswith(".py"):
            lines = _read_lines(fs.filename)
            if any(line.startswith(name + " = ") for line in lines):
                return fs.filename, lines, fs.lineno
    found = [m.__file__ for m in list(sys.modules.values())
             if "torchinductor_" in (getattr(m, "__file__", None) or "") and
             m.__file__.endswith(".py") and name in getattr(m, "__dict__", {})]
    if len(set(found)) != 1:
        return None           # none, or several graphs reuse the name: not guessed
    lines = _read_lines(found[0])
    call = next((i for i, line in enumerate(lines, 1)
                 if line.lstrip().startswith((name + ".run(", name + "("))), None)
    return found[0], lines, call


def _read_lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _inductor_source(path: str, lineno: Optional[int]):
    """The user's frame Inductor's own line map gives for line `lineno` of its
    generated code (PyCodeCache.linemaps: per kernel launch, the stack trace of
    the last FX node the kernel fused), as a FrameSummary; None if unknown."""
    cc = sys.modules.get("torch._inductor.codecache")
    frames_for = getattr(getattr(cc, "PyCodeCache", None), "stack_frames_for_code", None)
    if frames_for is None or not lineno:
        return None
    try:
        frames = frames_for(path, lineno) or ()
        picked = next((f for f in frames if is_user_file(f["filename"])), None)
        if picked is None:
            return None
        fs = traceback.FrameSummary(picked["filename"], int(picked["line"]), picked["name"])
        fs.line                       # linecache, now
        return fs
    except Exception:
        return None


def inductor_source(kernel: Optional[str], stack, compiled=None):
    """(module, source): the generated module of an Inductor kernel
    (`_generated_module`), and the user's source line its line map gives for
    the launch (a FrameSummary in the compiled function's own file), or None
    for either."""
    inductor = bool(kernel) and kernel.startswith(("triton_", "cpp_fused"))
    module = _generated_module(kernel.split("(")[0].strip(), stack) if inductor else None
    source = _inductor_source(module[0], module[2]) if module else None
    if source is None and module is not None:
        # The launch's line has no entry in the line map (a graph partition's function,
        # under cudagraph trees): the module's other lines on the stack (its `call`)
        for fs in reversed(stack or ()):
            if fs.filename == module[0] and fs.lineno != module[2]:
                source = _inductor_source(fs.filename, fs.lineno)
                if source is not None:
                    break
    if source is None and module is not None:
        # Graph partitions (cudagraph trees) have no line map: the stack traces cudagraph
        # trees keep of the graph's outputs, when they name one line
        source, _ = _graph_names.cudagraph_tree_source(module[0])
    if source is not None and compiled is not None and source.filename != compiled.filename:
        # Inductor's caches reuse what was compiled for the same source elsewhere (another
        # script, an earlier run): the line map then names that file. The line is this
        # function's only where its own file has the same text there.
        import linecache
        here = linecache.getline(compiled.filename, source.lineno).strip()
        if here and here == (source.line or "").strip():
            name = source.name
            source = type(source)(compiled.filename, source.lineno, name)
            source.line
        else:
            source = None
    return module, source


def inductor_provenance(kernel: Optional[str], stack, compiled=None) -> Optional[str]:
    """For a kernel torch.compile generated (``triton_poi_fused_...``) or a
    launch from inside a torch.compile'd function (`compiled`, the frame
    TorchDynamo ran): the function, the source line Inductor's line map gives
    (the last node the kernel fused), and the source nodes it wrote above the
    kernel's definition (``Topologically Sorted Source Nodes: [getitem, mul],
    Original ATen: [aten.index, aten.mul]``); or sentences saying what is not
    known. None for other kernels."""
    inductor = bool(kernel) and kernel.startswith(("triton_", "cpp_fused"))
    if not inductor and compiled is None:
        return None
    out = []
    if compiled is not None:
        out.append("inside torch.compile'd %s (%s:%s)" % (compiled.name, compiled.filename,
                                                         compiled.lineno))
    module, source = inductor_source(kernel, stack, compiled)
    if source is not None:
        out.append("fused up to %s:%d in %s%s (%s)" % (
            source.filename, source.lineno, source.name,
            ":  " + source.line if source.line else "",
            getattr(source, "cd_how", None) or "Inductor's line map"))
    elif compiled is not None:
        out.append("source line unknown" + (
            " (Inductor's generated code for this kernel was not found)"
            if inductor and module is None else ""))
    if module is not None:
        path, lines, _ = module
        name = kernel.split("(")[0].strip()
        for i, line in enumerate(lines):
            if line.startswith(name + " = "):
                for back in lines[max(0, i - 40):i][::-1]:
                    if back.startswith("#") and "Source Nodes" in back:
                        out.append(back.lstrip("# ").strip() + " (Inductor's generated code: %s)"
                                   % path)
                        break
                break
    elif inductor and compiled is None:
        out.append("a kernel Inductor generated; which lines of the compiled function it fused "
                   "is not known (its generated code was not found)")
    return "; ".join(out) if out else None


def configure_core() -> None:
    """Hand the C fault path what Python owns (error names and texts, the
    library folders, the rank prefix), once, before the first scope."""
    if getattr(configure_core, "done", False):
        return
    from . import _errors, _options
    names = {code: (_cuda_errors.name(code), cls.what or _cuda_errors.name(code))
             for code, cls in _errors.BY_CODE.items()}
    rank = os.environ.get("RANK")
    _locations.configure()
    _core.configure(names=names, restart=_errors.RESTART, report=_options.OPTIONS.report,
                    prefix="[rank %s] " % rank if rank not in (None, "") else "",
                    error_file=os.environ.get("TORCHELASTIC_ERROR_FILE") or None,
                    signals=_options.OPTIONS.report)
    configure_core.done = True


# -- watch mode: the culprit ------------------------------------------------------

def _assert_site(text: str) -> Optional[dict]:
    """The first assert line's file, line and function (``file:line: FUNC: block: ...``)."""
    from ._errors import parse_device_message
    asserts = parse_device_message(text)
    return asserts[0] if asserts else None


def _assert_function(text: str) -> Optional[str]:
    """The kernel function an assert line names (``file:line: FUNC: block: ...``)."""
    site = _assert_site(text)
    return site["func"] if site else None


def _enclosing_function(path: str, lineno: int) -> Optional[str]:
    """The name of the innermost function defined around line `lineno` of the
    Python file `path` (a Triton kernel's source: Triton names its kernels
    after their function), None when unknown."""
    import ast
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.lineno <= lineno <= (getattr(node, "end_lineno", None) or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best.name if best is not None else None


def _source_named(text: str) -> Optional[str]:
    """Where the device's first assert line names no function (Triton prints
    ``unknown``), the function whose source holds the asserting line (Triton
    names its kernels after their functions; Inductor writes each kernel to a
    file of its own)."""
    site = _assert_site(text)
    if site is None or site["func"].strip() != "unknown" or not site["file"].endswith(".py"):
        return None
    try:
        return _enclosing_function(site["file"], int(site["line"]))
    except ValueError:
        return None


class Verdict(NamedTuple):
    """What report/verdict.c decided over the candidates (``_core.verdict``)."""
    candidates: list          # those kept, in the verdict's order
    named: bool               # the device's text names (or fits) them
    by_words: bool            # ... narrowed by its file's and message's words
    reordered: bool           # the likeliest were put first
    ruled_out: Optional[str]  # the function the text names, none of them (all ruled out)


def decide(cands: list, text: str) -> Verdict:
    """Which of `cands` (launch dicts) is guilty, by the one rule of the C core
    (csrc/report/verdict.c): named by the device's assert text, else ruled
    out by it, else the likeliest first. Python only hands down what needs
    Python: for Triton's ``unknown``, the function around the asserting
    source line (`_source_named`)."""
    raw = text.encode("utf-8", "surrogateescape") if text else b""
    order, named, _by_hint, by_words, reordered, ruled_out, function = _core.verdict(
        [(c.get("mangled"), c.get("origin") or 0, c.get("seq") or 0, bool(c.get("graph")))
         for c in cands], raw, _source_named(text) if text else None)
    return Verdict([cands[i] for i in order], bool(named), bool(by_words), bool(reordered),
                   function if ruled_out else None)


class CoverageGap(NamedTuple):
    """A stretch of the watch in which CUPTI was not cuda_debug's (a profiler
    held it): csrc/capture/coverage.c."""
    number: int
    why: int                  # _core.GAP_PROFILER | GAP_HELD
    from_seq: int
    to_seq: int               # 0 while open
    from_where: Optional[str]
    to_where: Optional[str]
    hooks_recording: bool     # PyTorch's own launches were recorded meanwhile
    closed: bool

    def describe(self) -> str:
        who = "a profiler held CUPTI from %s" % (self.from_where or "?") \
            if self.why == _core.GAP_PROFILER else \
            "another tool held CUPTI when watch() opened, at %s" % (self.from_where or "?")
        span = "%s (launch #%d) to %s (launch #%d)" % (
            who, self.from_seq, self.to_where or "the end of the watch", self.to_seq) \
            if self.closed else "%s (launch #%d) on, still (torch.profiler keeps CUPTI after it " \
            "stops)" % (who, self.from_seq)
        return span + (": launches outside PyTorch's runtime (Triton, cuBLAS/cuDNN, CuPy, the "
                       "driver's callers) were not recorded then" if self.hooks_recording
                       else ": no launch was recorded then")


def coverage_gaps(since: int = 0) -> List[CoverageGap]:
    """The gaps of the watch's coverage that reach past watch-ring seq `since`."""
    return [g for g in (CoverageGap(*t) for t in _core.coverage_gaps())
            if not g.closed or g.to_seq >= since]


def _unrecorded(name: Optional[str], ruled_out: list, gaps: List[CoverageGap]) -> dict:
    """The culprit the device's text names, whose launch the watch did not
    record, and why (each reason a sentence)."""
    why = [g.describe() for g in gaps]
    if not why:
        why = (["launched more than %d launches ago (the watch ring wrapped)" % _core.WATCH_RING]
               if _core.watch_seq() >= _core.WATCH_RING else []) + \
            ["launched before watch() opened, or by a caller cuda_debug does not see"]
    none = dict.fromkeys(("seq", "mangled", "short", "stream", "grid", "block", "shared_mem",
                          "device", "filename", "lineno", "function", "where", "compiled"))
    none.update(kernel=name, graph=False, captured=False, thread_id=0, stack=[], op=0,
                origin=_core.ORIGIN_UNKNOWN, recorded=False, not_recorded=why,
                ruled_out=ruled_out)
    return none


def _launch_dict(rec: WatchRecord, inner=()) -> dict:
    """A watch record's launch, named. `inner`: more of the launching thread's
    innermost frame ids (a graph node's), merged in before the record's own
    outer ones (the torch.compile'd frame, the user's)."""
    kernel = _text(rec.kernel)
    stack = stack_from_ids(_locations.merged_ids(rec.frames, inner))
    fs = user_frame(stack, complete=False)
    compiled = compiled_frame(stack, complete=False)
    return {
        "seq": rec.seq, "kernel": (_core.demangle(kernel) or kernel) if kernel else None,
        "mangled": kernel or None,
        "short": _core.short_kernel_name(kernel) if kernel else None,
        "graph": bool(rec.flags & _core.WATCH_GRAPH), "stream": rec.stream,
        "captured": bool(rec.flags & _core.WATCH_CAPTURED),
        "grid": rec.grid, "block": rec.block, "shared_mem": rec.shared_mem,
        "thread_id": rec.thread_id, "device": rec.device if rec.device >= 0 else None,
        "filename": fs.filename if fs else None, "lineno": fs.lineno if fs else None,
        "function": fs.name if fs else None,
        # "file:line in function" of the user frame, by the kinds C gave the frames (a
        # frame TorchDynamo ran is not the user's, though its file is): what
        # captured_at and replayed_at say
        "where": _where_str(stack),
        "stack": [(f.filename, f.lineno, f.name, f.line) for f in stack],
        "compiled": (compiled.filename, compiled.lineno, compiled.name) if compiled else None,
        "op": rec.op, "origin": rec.origin,
    }


GRAPH_NOTES, ADOPTED_NAMED = _graph_names.GRAPH_NOTES, _graph_names.ADOPTED_NAMED
graph_annotation = _graph_names.graph_annotation


def _graph_nodes(replay: dict, device_text: str = "") -> tuple:
    """(nodes, note, multi_stream, every): for a replay's launch dict, the
    candidates of the graph it ran (per stream of the capture, the nodes after
    the last marker written up to the first marker missing), each a launch
    dict of the capturing launch with ``graph_node`` (its number in the
    capture) and ``captured_at``; or no nodes and why. For a graph captured
    before watching (no markers), the nodes the device's assert text belongs to
    (`_named_by_device`)."""
    info = _core.graph_replay(replay["seq"])
    if info is None:
        return [], None, False, 1
    status, capture, node_ids = info
    cap = _core.graph_capture(capture) if capture >= 0 else None
    replayed_at = replay["where"]
    nodes = []
    for g in node_ids:
        got = _core.graph_node(g)
        if got is None:
            continue
        d = _launch_dict(WatchRecord(*got[0]), inner=got[4])
        why = _graph_names.line_note(g)
        d.update(graph_node=got[1], captured_at=d["where"] + ("  (%s)" % why if why else ""),
                 replayed_at=replayed_at, replay_seq=replay["seq"],
                 capture_id=cap[0] if cap else None, graph_nodes=cap[1] if cap else None,
                 graph_annotation=graph_annotation(got[3], cap[7] if cap else ()))
        nodes.append(d)
    note = GRAPH_NOTES.get(status)
    if status == _core.GRAPH_MATCHED:
        note = "paired with the graph whose markers were running (CUPTI did not say which " \
               "graph this replay runs)"
    elif status == _core.GRAPH_ADOPTED:
        v = decide(nodes, device_text)
        named = v.candidates if v.named else []
        note = ADOPTED_NAMED if named else note % (cap[1] if cap else len(nodes))
        nodes = named
    return nodes, note, bool(cap and cap[2]), (cap[5] if cap and cap[5] else 1)


def watch_culprit(since: int, device_text: str = "") -> Optional[dict]:
    """From host memory only (no CUDA call): the launch that faulted, while
    watching. Per stream, the launches from its last returned completion
    marker up to the first marker that did not come back (one launch when
    every launch has its marker, ``watch(exact=True)``; at most
    ``markers_every`` otherwise): the candidates, in launch order. Where the
    device's assert text names a kernel, the candidates that are that kernel.
    ``exact`` when one candidate is left. When no marker is missing, the
    launches not known to have finished are the candidates, as a guess.
    A graph replay among them is replaced by the candidates of its graph
    (csrc/capture/graph_read.c: per stream of the capture, the nodes after
    the last marker written up to the first missing; for a graph captured
    before watching, the nodes the device's text names)."""
    streams = _core.watch_streams(since)
    proven = [st for st in streams if st[3]]
    use = proven or streams
    seqs = sorted(q for st in use for q in st[7])
    total = sum(st[5] for st in use)
    launches = [d for d in (watch_record(q) for q in seqs) if d is not None]
    if not launches:
        # Nothing recorded is unfinished: the culprit is a launch the watch did
        # not see. Said so when the device's text names it, or the watch had gaps.
        gaps = coverage_gaps(since)
        name = decide([], device_text).ruled_out
        if name is None and not gaps:
            return None
        return {"culprit": _unrecorded(name, [], gaps), "exact": False, "candidates": [],
                "recent": [], "named_by_device": False, "proven": False, "candidate_count": 1,
                "markers_every": _core.stats()["watch_every"], "reordered": False,
                "ruled_out": [], "not_covered": [g.describe() for g in gaps]}
    cands, graph_exact = [], True
    for c in (_launch_dict(r) for r in launches):
        if not c["graph"]:
            cands.append(c)
            continue
        nodes, note, multi, every = _graph_nodes(c, device_text)
        c["graph_note"] = note
        c["replayed_at"] = c["where"]
        if nodes:
            graph_exact = graph_exact and len(nodes) == 1 and not multi and \
                note in (None, ADOPTED_NAMED)
            if len(nodes) > 1 and note is None and not multi:
                note = "one of the %d nodes after the last marker written (a marker every " \
                       "%d nodes)" % (len(nodes), every)
            for n in nodes:
                n["graph_note"] = note
            cands.extend(nodes)
            total += len(nodes) - 1
        else:
            cands.append(c)
    v = decide(cands, device_text)
    named = v.candidates if v.named else []
    ruled_out, reordered = [], v.reordered
    gaps = coverage_gaps(min(r.seq for r in launches))
    if named:
        cands, total = named, len(named)
        if len(named) == 1 and named[0].get("graph_note") != ADOPTED_NAMED:
            named[0]["graph_note"] = None     # the device's text named the node itself
    elif v.ruled_out is not None:
        ruled_out, cands, total = cands, [_unrecorded(v.ruled_out, cands, gaps)], 1
    else:
        cands = v.candidates
    pick = cands[0]
    exact = len(cands) == 1 and total == 1 and bool(proven or named) and \
        (graph_exact or bool(named)) and not ruled_out and not (gaps and not named)
    recent = []
    last = pick.get("replay_seq", pick["seq"])
    for q in range(max(since + 1, last - 5), last) if last else ():
        r = watch_record(q)
        if r is not None:
            recent.append(_launch_dict(r))
    every = _core.stats()["watch_every"]
    return {"culprit": pick, "exact": exact, "candidates": [c for c in cands if c is not pick],
            "recent": recent, "named_by_device": bool(named), "proven": bool(proven),
            "candidate_count": max(total, len(cands)), "markers_every": every,
            "reordered": reordered, "ruled_out": ruled_out,
            "not_covered": [g.describe() for g in gaps] if not named or ruled_out else []}


# -- building the exception -----------------------------------------------------

_state_lock = threading.Lock()
_claimed = set()                 # (fault seq, thread) already reported to that thread
_last_error: Optional[CudaError] = None
_log_marks = {}                  # fault seq -> log_end, to cut the driver log between faults


def _after_fork_in_child():
    """A forked child reports nothing of the parent's (csrc/hooks/after_fork.c:
    the parent's fault records are not read there): no last error, a free lock."""
    global _state_lock, _last_error
    _state_lock = threading.Lock()
    _last_error = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def claim(seq: int, thread_id: Optional[int] = None) -> bool:
    """True the first time a fault record is claimed for reporting to a thread
    (each thread that met the fault gets its report once)."""
    key = (seq, threading.get_native_id() if thread_id is None else thread_id)
    with _state_lock:
        if key in _claimed:
            return False
        _claimed.add(key)
        return True


def _claimed_here(seq: int, thread_id: int) -> bool:
    return (seq, thread_id) in _claimed


def remember(err: CudaError) -> CudaError:
    global _last_error
    _last_error = err
    if err.sticky:
        # The context is dead: from now on every CUDA error raised anywhere is
        # this fault's consequence, and carries its verdict (_notes).
        _core.sticky_seen(True)
        _notes.arm()
    return err


def verdict_error(exc: BaseException, watch_mark: Optional[int]) -> Optional[CudaError]:
    """For a CUDA error raised outside the watch's own ``with`` (_notes): the
    cuda_debug exception for the sticky fault `exc` speaks of: the one already
    built for it (last_error()), else one built now, claiming nothing (the
    watch that sees it later still reports it), from the cause among the
    fault records or, with none, the watch ring's culprit since `watch_mark`.
    None when `exc` is ours or no sticky CUDA error, or nothing is known."""
    from . import _sticky
    if isinstance(exc, CudaError):
        return None                       # ours: it says it all
    code = _sticky.sticky_code(exc)
    if code is None:
        return None
    if _last_error is not None and _last_error.sticky:
        return _last_error
    tb = exc.__traceback__
    thread_id = threading.get_native_id()
    records = [r for r in faults(0) if _cuda_errors.is_sticky(r.code)]
    cause, consequences = pick_cause(records, thread_id)
    if cause is not None:
        return remember(build(cause, tb=tb, consequences=consequences,
                              met_by=_met_by(cause, records, thread_id)))
    if watch_mark is None:
        return None
    w = watch_culprit(watch_mark, _text(_core.recent_asserts()))
    if w is None:
        return None
    return remember(build(None, code=code, watch=w, found_at="watch()",
                          surfaced=stack_from(tb=tb) if tb is not None else None))


def _previous_log_end(raw: RawFault) -> int:
    prev = max((v for k, v in _log_marks.items() if k < raw.seq), default=0)
    _log_marks[raw.seq] = raw.log_end
    return max(prev, raw.log_end - 16)


def _location_fields(stack: Optional[traceback.StackSummary], complete: bool) -> dict:
    if not stack:
        return {}
    fs = user_frame(stack, complete)
    if fs is None:
        return {"launch_stack": stack}
    return dict(launch_stack=stack, filename=fs.filename, lineno=fs.lineno, function=fs.name,
                line=fs.line)


_where_str = _locations.where


def assert_level(r: RawFault) -> int:
    """How the device's assert text belongs to a record's kernel (_core.ASSERT_*):
    as the fault path saw it, or the lines kept now (printed late)."""
    if r.code != 710 or r.at_launch:
        return _core.ASSERT_NONE
    return max(r.assert_level, _core.asserts_for(_text(r.kernel))[1])


def pick_cause(records: Sequence[RawFault], thread_id: Optional[int] = None):
    """(cause, consequences): the record to report among `records` (oldest
    first).

    The kernel the device's assert text belongs to is the cause: when the
    text names kernels, each of those faulted (two kernels that asserted at
    once); when it names none (a lambda's ``operator()``, Triton's ``unknown``)
    but fits some records' kernels, the first recorded of those; a thread
    whose wait met another thread's fault, its own kernel innocent, is never
    the cause (issue 25 item 4). Without assert text: the faults that are not
    echoes of an earlier one in their context. Among the causes, this thread's
    own first, else the earliest; with none, the earliest record."""
    if not records:
        return None, 0
    def first(rs):
        return rs[0] if rs else None
    sticky = [r for r in records if _cuda_errors.is_sticky(r.code)]
    levels = {r.seq: assert_level(r) for r in sticky}
    best = max(levels.values(), default=_core.ASSERT_NONE)
    if best == _core.ASSERT_NAMES:     # each kernel its own text names faulted
        causes = [r for r in sticky if levels[r.seq] == best]
    elif best == _core.ASSERT_FITS:    # which of the fitting ones: the first recorded
        fits = [r for r in sticky if levels[r.seq] == best]
        causes = [r for r in fits if not r.consequence] or fits
    else:
        causes = [r for r in sticky if not r.consequence]
    own = [r for r in causes if thread_id is not None and r.thread_id == thread_id]
    cause = first(own) or first(causes)
    if cause is None:
        own_any = [r for r in records if thread_id is not None and r.thread_id == thread_id]
        cause = first(own_any) or records[0]
    consequences = sum(1 for r in sticky if r is not cause and r not in causes)
    return cause, consequences


def _met_by(cause: RawFault, records: Sequence[RawFault], thread_id: Optional[int]):
    """When `cause` is another thread's fault and this thread has a record of
    its own among `records` (its wait or launch met the dead context): where
    this thread met it ("thread t (tid 4243) at its launch of k<...> at
    b.py:20 in worker_b"), else None."""
    if thread_id is None or cause.thread_id == thread_id:
        return None
    mine = next((r for r in records if r.thread_id == thread_id and r is not cause), None)
    if mine is None:
        return None
    kernel = _text(mine.kernel)
    s = "thread %s (tid %d) at its %s of %s" % (
        _text(mine.thread_name), mine.thread_id, "launch" if mine.at_launch else "wait after the launch",
        _core.short_kernel_name(kernel) if kernel else "a CUDA graph")
    where = _where_str(stack_from_ids(mine.frames)) if mine.frames else None
    if where:
        s += " at " + where
    return s


def build(raw: Optional[RawFault] = None, *, code: Optional[int] = None, tb=None, frame=None,
          found_at: str = "launch", watch: Optional[dict] = None, consequences: int = 0,
          before_scope: bool = False, surfaced: Optional[traceback.StackSummary] = None,
          met_by: Optional[str] = None) -> CudaError:
    """A cuda_debug exception: for a fault record `raw`, a watch culprit, or
    just a code. Located by the record's own frames (captured at the launch),
    else by the traceback `tb`, else by `frame`."""
    if raw is not None:
        code = raw.code
    fields = dict(found_at=found_at, consequences=consequences, before_scope=before_scope,
                  mechanism="cupti", met_by=met_by)
    stack, complete = None, True
    if raw is not None and raw.frames:
        stack, complete = stack_from_ids(raw.frames), raw.frames_complete == 1
    if not stack and (tb is not None or frame is not None):
        stack = stack_from(tb=tb, frame=frame)
    if watch is None or raw is not None:
        fields.update(_location_fields(stack, complete))
    if raw is not None:
        mangled = _text(raw.kernel)
        message = raw.device_message
        if not message and _cuda_errors.is_sticky(raw.code) and not raw.consequence:
            message = _core.asserts_for(mangled)[0]  # printed by another thread, or late
        compiled = compiled_frame(stack, complete) if stack else None
        fields.update(
            provenance=inductor_provenance(mangled, stack, compiled),
            compiled_function=compiled.name if compiled else None,
            kernel=(_core.demangle(mangled) or mangled) if mangled else None,
            kernel_mangled=mangled or None,
            grid=raw.grid, block=raw.block, shared_mem=raw.shared_mem,
            stream=raw.stream, device=raw.device if raw.device >= 0 else None,
            device_message=(_text(message) + (
                "\n[... %d more bytes of device output cut here; all of it went to stderr]"
                % raw.device_message_cut if raw.device_message_cut else "")) or None,
            device_message_cut=raw.device_message_cut,
            thread="%s (tid %d)" % (_text(raw.thread_name), raw.thread_id),
            launch_api=_core.CALLBACK_IDS.get(raw.cbid),
            launch_refused=bool(raw.at_launch),
            launch_seq=raw.launch_seq or None,
            driver_log=[_text(b).rstrip() for b in
                        _core.driver_log(_previous_log_end(raw), raw.log_end)] or None,
        )
        ops = _torch_ops.op_stack(raw.ops)
        if ops:
            fields.update(op=ops[0], op_stack=ops)
            # The tensors of the Python call that entered the op: only when
            # this thread's own launch raised there (not a backward thread's).
            if tb is not None and found_at == "launch" and \
                    raw.thread_id == threading.get_native_id():
                fields["inputs"] = _torch_ops.call_inputs(tb)
    if watch is not None:
        c = watch["culprit"]
        compiled = traceback.FrameSummary(*c["compiled"], lookup_line=False) \
            if c.get("compiled") else None
        fields.update(compiled_function=compiled.name if compiled else None,
                      provenance=inductor_provenance(
                          c["kernel"], traceback.StackSummary.from_list(c["stack"]), compiled))
        # Several kernels may be the culprit: none is named as the fact (.kernel),
        # the likeliest is .likely_kernel.
        kernels = {k.get("kernel") for k in [c] + watch["candidates"]}
        ambiguous = not watch["exact"] and len(kernels) > 1
        fields.update(
            kernel=None if ambiguous else c["kernel"], likely_kernel=c["kernel"],
            kernel_mangled=c.get("mangled"),
            not_covered=watch.get("not_covered") or None,
            ruled_out=watch.get("ruled_out") or None,
            not_recorded=c.get("not_recorded"), likeliest_first=watch.get("reordered") or None,
            launch_seq=None if c["graph"] or c.get("graph_node") is not None else c["seq"],
            grid=c["grid"], block=c["block"], shared_mem=c["shared_mem"],
            stream=c["stream"], device=c["device"], exact=watch["exact"],
            candidates=watch["candidates"], recent_launches=watch["recent"],
            markers_every=watch["markers_every"], candidate_count=watch["candidate_count"],
            named_by_device=watch["named_by_device"],
            launch_stack=traceback.StackSummary.from_list(c["stack"]), filename=c["filename"], lineno=c["lineno"],
            function=c["function"], thread="tid %d" % c["thread_id"],
            launch_api="cuGraphLaunch" if c["graph"] or c["captured"] else None,
            mechanism="watch", graph_node=c.get("graph_node"), graph_note=c.get("graph_note"),
            graph_annotation=c.get("graph_annotation"),
            captured_at=c.get("captured_at"), replayed_at=c.get("replayed_at"))
        if c.get("captured_at") and compiled is not None:
            # A node torch.compile captured (cudagraph trees record a graph while a call
            # of the compiled function runs): its line is the one Inductor fused into the
            # kernel, when its line map says; the recording call is recorded_at.
            _, source = inductor_source(c["kernel"], fields["launch_stack"], compiled)
            if source is not None:
                fields.update(recorded_at=c["captured_at"], filename=source.filename,
                              lineno=source.lineno, function=source.name,
                              captured_at=_where_str([source]))
            else:
                fields["captured_at"] += " (source line unknown: torch.compile generated " \
                                         "the kernel; this is the call that recorded it)"
        recorded = _torch_ops.recorded_op(c.get("op", 0))
        if recorded:
            fields.update(op=recorded[0], op_stack=[recorded[0]], inputs=recorded[1])
        if fields["filename"] and fields["lineno"]:
            import linecache
            fields["line"] = linecache.getline(fields["filename"], fields["lineno"]).strip() or None
        if fields.get("device_message") is None:
            text = _text(_core.recent_asserts())
            fields["device_message"] = text or None
        fields["surfaced_at"] = _where_str(surfaced) if surfaced else None
    fields["replay_command"] = _replay_command_for(code, fields)
    cls = class_for(code, at_launch=bool(raw.at_launch) if raw is not None else False)
    err = cls(code=code, **fields)
    if _options.OPTIONS.trace and err.sticky and (watch is not None or (raw and raw.launch_seq)):
        from . import _dump_trace
        c = watch["culprit"] if watch is not None else None
        _dump_trace.trace_at_fault(c.get("replay_seq", c["seq"]) if c else raw.launch_seq)
    return err


def _replay_command_for(code, fields) -> Optional[str]:
    """The ``cuda-debug replay`` command for an address fault with no assert
    text whose launch is known (not a graph node: the replay instruments a
    launch, not a node of a replayed graph)."""
    if not _replay_command.wanted(code, fields.get("device_message")) or \
            fields.get("graph_node") is not None or \
            (fields.get("launch_api") or "").startswith("cuGraphLaunch"):
        return None
    return _replay_command.command(
        fields.get("kernel_mangled"), fields.get("launch_seq"),
        candidates=_replay_command.candidate_seqs(fields.get("exact"), fields.get("candidates")))


def build_dispatch(rec: dict, *, tb=None, frame=None, found_at: str = "launch") -> CudaError:
    """The exception for a fault the dispatch fallback found after an op
    (_dispatch_fallback._record): the op, its inputs, the Python line that
    called it; the kernel only as the device's assert text names it."""
    fields = dict(found_at=found_at, mechanism="dispatch", op=rec["op"], op_stack=[rec["op"]],
                  inputs=rec["inputs"], device_message=rec["device_message"],
                  thread=rec["thread"], kernel=_assert_function(rec["device_message"] or ""))
    stack = rec["stack"]
    if (tb is not None or frame is not None) and \
            not any(is_user_file(f.filename) for f in stack or ()):
        # An autograd thread's op: no Python frames of the user's; the line is
        # where the exception reached this thread (the backward() call).
        stack = stack_from(tb=tb, frame=frame)
    fields.update(_location_fields(stack, True))
    return class_for(rec["code"])(code=rec["code"], **fields)


def raised_at_launch(exc: Optional[BaseException], err: CudaError) -> Optional[BaseException]:
    """When `exc`, the exception `err` translates, did not pass through the
    launching line (a framework's teardown met the dead context inside its
    `except` block and raised again, as Lightning's trainer.fit does): the
    exception of its __cause__/__context__ chain whose traceback holds that
    line, the one raised at the launch; else None."""
    if exc is None or exc.__traceback__ is None or not err.filename or not err.lineno or \
            _locations.holds_line(exc.__traceback__, err.filename, err.lineno):
        return None
    seen, todo = {id(exc)}, [exc.__cause__, exc.__context__]
    while todo and len(seen) < 64:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None and \
                _locations.holds_line(e.__traceback__, err.filename, err.lineno):
            return e
        todo += [e.__cause__, e.__context__]
    return None


def _note_later(err: Optional[CudaError], exc: Optional[BaseException]):
    """Name `exc` in `err`'s report when it is a later exception, raised while
    the one from the launch was handled: a consequence of the fault."""
    if err is not None and raised_at_launch(exc, err) is not None:
        from . import _sticky
        *_, (f, lineno) = traceback.walk_tb(exc.__traceback__)
        err.later_exception = "%s, raised at %s:%d in %s" % (
            _sticky.first_line(exc), f.f_code.co_filename, lineno, f.f_code.co_name)
    return err


def error_for(exc: Optional[BaseException] = None, **kw) -> Optional[CudaError]:
    """The cuda_debug exception for what happened since `mark` (a fault_seq()),
    or None to let `exc` go on as it is.

    A fault recorded by the launch callback and not yet reported is used when
    it is sticky (the context is dead: whatever exception is passing is its
    consequence; with none passing, the framework swallowed it), or when the
    passing exception speaks of it. Else, while watching (`watch_mark` given)
    and a sticky error surfaced (`code`, or named by `exc`), the watch ring
    names the culprit. Else, with a `code`, a report of the code alone.
    A passing exception raised after the one from the launch, while handling
    it, is named as a consequence (:func:`raised_at_launch`)."""
    return _note_later(_error_for(exc, **kw), exc)


def _error_for(exc: Optional[BaseException] = None, *, mark: int = 0,
               watch_mark: Optional[int] = None, code: Optional[int] = None,
               found_at: str = "launch", frame=None, thread_id: Optional[int] = None,
               require_sticky_or_mentioned: bool = True,
               include_claimed: bool = False) -> Optional[CudaError]:
    from . import _sticky
    if isinstance(exc, CudaError):
        return None                    # already ours (an inner scope, cuda_debug.testing)
    tb = exc.__traceback__ if exc is not None else None
    if thread_id is None:
        thread_id = threading.get_native_id()
    rec = _dispatch_fallback.take(thread_id)
    if rec is not None:
        return remember(build_dispatch(rec, tb=tb, frame=frame, found_at=found_at))
    records = [r for r in faults(mark) if include_claimed or not _claimed_here(r.seq, thread_id)]
    cause, consequences = pick_cause(records, thread_id)
    if cause is not None:
        sticky = _cuda_errors.is_sticky(cause.code)
        wanted = sticky or not require_sticky_or_mentioned or \
            (exc is not None and mentions(exc, cause.code)) or \
            (code is not None and code == cause.code)
        if wanted and (exc is not None or sticky or code is not None):
            for r in records:
                if r.consequence or r is cause:
                    claim(r.seq, thread_id)
            return remember(build(cause, tb=tb, frame=frame, found_at=found_at,
                                  consequences=consequences,
                                  met_by=_met_by(cause, records, thread_id) if sticky else None))
    surfaced_code = code if code is not None and _cuda_errors.is_sticky(code) else \
        (_sticky.sticky_code(exc) if exc is not None else None)
    if watch_mark is not None and surfaced_code is not None:
        text = _text(_core.recent_asserts())
        w = watch_culprit(watch_mark, text)
        if w is not None:
            surfaced = stack_from(tb=tb, frame=frame) if (tb is not None or frame is not None) \
                else None
            return remember(build(None, code=surfaced_code, watch=w, found_at=found_at,
                                  surfaced=surfaced))
    if code is not None:
        return remember(build(None, code=code, tb=tb, frame=frame, found_at=found_at))
    return None


def last_error() -> Optional[CudaError]:
    """The last fault report, even when the exception that carried it was
    swallowed: the last raised report, or a newer record not yet reported."""
    records = [r for r in faults(0) if not _claimed_here(r.seq, threading.get_native_id())]
    if records:
        cause, consequences = pick_cause(records)
        return build(cause, found_at="record", consequences=consequences)
    return _last_error


def mentions(exc: BaseException, code: int) -> bool:
    """Does a framework exception speak of this CUDA error? (By code, by name, or
    by the runtime's own description, as torch/CuPy/Triton word it.)"""
    if any(getattr(exc, a, None) == code for a in ("code", "status", "error_code")):
        return True
    try:
        text = "%s %s" % (type(exc).__name__, exc)
    except Exception:
        return False
    name = _cuda_errors.name(code)
    words = [name, "cudaError" + name[len("CUDA_ERROR_"):].title().replace("_", "")]
    driver_text = _core.error_string(code)
    if driver_text:
        words.append(driver_text)
    if code >= 100:
        words.append(str(code))
    return any(w in text for w in words)
