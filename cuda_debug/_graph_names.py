"""Names for the nodes of CUDA graphs, shared by the exception (cuda_debug/_report.py)
and the in-flight records (cuda_debug/_hangs.py): why a replay's nodes are not
named, the tag torch.cuda.graph_annotations gave a node, and a node's candidates
as dicts (host memory only: csrc/capture/graph_read.c).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import re
import sys
import traceback
from typing import Optional

from . import _core, _locations

#: Why a graph replay's nodes are not named (csrc/capture/capture.h: CD_GRAPH_*).
GRAPH_NOTES = {
    _core.GRAPH_NO_MARKERS: "captured before watching: the graph has no markers inside it, so "
                            "its nodes are not named (capture it inside watch() to name them)",
    _core.GRAPH_NOT_CLOSED: "its capture did not end inside watch(): its markers are never "
                            "cleared, so its nodes are not named",
    _core.GRAPH_NOT_STARTED: "the replay had not begun (it waited for work that did not finish)",
    _core.GRAPH_ALL_DONE: "every node of the graph finished",
    _core.GRAPH_BROKEN: "its markers could not be captured (the driver refused a stream write "
                        "or memset: _core.graph_stats() says which)",
    _core.GRAPH_ADOPTED: "captured before watching: the graph has no markers inside it, and the "
                         "device's text names none of its %d kernel nodes (capture it inside "
                         "watch() to name them)",
}


def graph_annotation(tools_id: int, exec_ids=()) -> Optional[dict]:
    """The tag ``torch.cuda.graph_annotations.mark_kernels`` gave a node (PyTorch
    2.12+, a driver with cuGraphNodeGetToolsId: CUDA 13.1+), when that module is
    loaded and holds one; else None. Its tags are keyed by the node's id for
    tools: the graph's id above the node's, the capture's graph id until the
    graph is instantiated, the executable's after; C kept the node's id at
    capture and the ids of the executables made from it."""
    if not tools_id:
        return None
    mod = sys.modules.get("torch.cuda._graph_annotations") or \
        sys.modules.get("torch.cuda.graph_annotations")
    get = getattr(mod, "get_kernel_annotations", None)
    if get is None:
        return None
    try:
        table = get()
        low = tools_id & 0xFFFFFFFF
        for high in [tools_id >> 32] + [e for e in exec_ids if e]:
            tag = table.get(high << 32 | low)
            if isinstance(tag, (list, tuple)):
                tag = tag[0] if tag else None
            if tag:
                return dict(tag) if isinstance(tag, dict) else {"name": tag}
    except Exception:
        return None
    return None


#: Why a node of a graph captured before watching is named at the line that
#: ended its capture, not at the line that launched it (csrc/capture/capture.h:
#: CD_ADOPT_LINE_*; report/graph_report.c writes the same words on fd 2).
LINE_NOTES = {
    _core.ADOPT_LINE_UNSEEN: "the capture's beginning was not seen (it began before cuda_debug "
                             "was imported, or not by torch.cuda.CUDAGraph.capture_begin)",
    _core.ADOPT_LINE_TRACED: "a tracer (a debugger, coverage) was set during the capture, so "
                             "its launches' lines were not followed",
    _core.ADOPT_LINE_FULL: "the capture made more runs of nodes than are followed (4096)",
    _core.ADOPT_LINE_NO_USER: "no frame of the user's made it",
    _core.ADOPT_LINE_NO_FRAMES: "this Python's frames cannot be read",
}


def line_note(node: int) -> Optional[str]:
    """None when node's ``captured_at`` is the line that launched it (always, for
    a graph captured while watching), else why it is the line that ended its
    capture instead."""
    why = _core.graph_node_line(node)
    return None if why == _core.ADOPT_LINE_OWN else \
        "the line that ended its capture, not the launch's: " + LINE_NOTES.get(why, "unknown")


#: A graph captured before watching whose node the device's text names.
ADOPTED_NAMED = "captured before watching (no markers inside it): named by the device's text"


def node_candidates(info):
    """((node dict, ...), note) for a replay's (status, capture, [node]) from C
    (``_core.in_flight()``'s graph field): per node its number, kernel, short
    name, collective (NCCL), the line that captured it, its annotation; or no
    nodes and why (a graph captured before watching has no markers: nothing
    says which node runs)."""
    if info is None:
        return (), None
    status, capture, node_ids = info
    if status == _core.GRAPH_ADOPTED:
        return (), GRAPH_NOTES[_core.GRAPH_NO_MARKERS]
    cap = _core.graph_capture(capture) if capture >= 0 else None
    nodes = []
    for g in node_ids:
        got = _core.graph_node(g)
        if got is None:
            continue
        rec, index, collective, tools_id, inner = got
        name = rec[2].decode("utf-8", "replace")
        stack = _locations.stack_from_ids(_locations.merged_ids(rec[8], inner))
        nodes.append(dict(node=index, kernel=name,
                          short=_core.short_kernel_name(name) if name else None,
                          collective=collective, captured_at=_locations.where(stack),
                          captured_note=line_note(g),
                          annotation=graph_annotation(tools_id, cap[7] if cap else ())))
    return tuple(nodes), (None if nodes else GRAPH_NOTES.get(status))


def _trace_frames(text: str):
    """(filename, line, name) of each frame of an FX node's stack_trace text
    (traceback format), outermost first."""
    return [(f, int(l), n.strip())
            for f, l, n in re.findall(r'File "(.+)", line (\d+), in (.+)\n', text + "\n")]


def _model_file(model) -> Optional[str]:
    """The file of the function a cudagraph tree node records: Inductor's
    generated module for a graph partition (``partition_0``), through wrappers."""
    seen = 0
    while model is not None and seen < 8:
        code = getattr(model, "__code__", None)
        if code is not None:
            return code.co_filename
        model = getattr(model, "__wrapped__", None) or getattr(model, "func", None) or \
            getattr(model, "current_callable", None)
        seen += 1
    return None


class TreeFrame(traceback.FrameSummary):
    """A user frame read from cudagraph trees' output stack traces."""
    __slots__ = ()
    cd_how = "the graph's output, as cudagraph trees keep it"


def cudagraph_tree_source(module_path: Optional[str]):
    """The user's source line of what a graph recorded by cudagraph trees
    (``torch.compile(mode="reduce-overhead")``) computes, where Inductor wrote no
    line map (its graph partitions have none): the tree's nodes keep the stack
    traces of their graph's outputs (``CUDAGraphNode.stack_traces``, from the FX
    graph). Of the nodes whose recorded function is in `module_path` (the
    generated module that defines the kernel), the innermost user frame of those
    traces, when they agree on one: (FrameSummary, None); else (None, the
    distinct frames as "file:line" strings, for the report to list)."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    kind = getattr(trees, "CUDAGraphNode", None)
    if kind is None or not module_path:
        return None, []
    import gc
    found = []
    try:
        nodes = [o for o in gc.get_objects() if type(o) is kind]
    except Exception:
        return None, []
    for node in nodes:
        wrapped = getattr(node, "wrapped_function", None)
        if _model_file(getattr(wrapped, "model", None)) != module_path:
            continue
        for text in getattr(node, "stack_traces", None) or ():
            if not text:
                continue
            user = [f for f in _trace_frames(text) if _locations.is_user_file(f[0])]
            if user and user[-1] not in found:
                found.append(user[-1])
    if len(found) == 1:
        f, line, name = found[0]
        fs = TreeFrame(f, line, name)
        fs.line                               # linecache, now
        return fs, []
    return None, ["%s:%d in %s" % f for f in found]
