"""Markers inside CUDA graphs, and a context reset, on a real GPU.

Each program runs in its own Python (a sticky fault kills the CUDA context of
its process), with a timeout, and reports what it caught as JSON. The fault in
a graph is made the way users meet it: the graph is captured and replayed
with good data, then a bad index is copied into its static input and the
graph replayed again.
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu

CATCH = """
import cuda_debug
from cuda_debug import _core
def describe(e):
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, node=e.graph_node,
                captured_at=e.captured_at, replayed_at=e.replayed_at, exact=e.exact,
                filename=e.filename, lineno=e.lineno, note=e.graph_note, text=str(e),
                candidates=[(c.get("kernel"), c.get("graph_node")) for c in e.candidates or ()],
                graph_stats=_core.graph_stats(), device_message=e.device_message)
"""

TORCH = CATCH + """
import torch
w = torch.randn(100, 8, device="cuda")
idx = torch.zeros(1, dtype=torch.long, device="cuda")
o = torch.empty(1, 8, device="cuda")
torch.index_select(w, 0, idx, out=o)           # warm-up: kernels loaded before any capture
torch.zeros(16, device="cuda").add_(1)
torch.cuda.synchronize()
"""


def _where(c, marker):
    return "%s:%d" % (c.script, c.line_of(marker))


@pytest.mark.parametrize("markers", ["memop", "kernel"])
def test_fault_in_node_37_of_a_60_kernel_graph_is_named_exactly(child, markers):
    """One kernel per op: x.add_(1) (vectorized elementwise), index_select
    with out= (indexSelectSmallIndex). Node 37 faults at the fourth replay.
    Markers as stream writes (the default) or as kernels of cuda_debug's."""
    needs("torch")
    c = child(TORCH + """
xs = [torch.zeros(16, device="cuda") for _ in range(60)]
g = torch.cuda.CUDAGraph()
out = {}
try:
    with cuda_debug.watch():
        with torch.cuda.graph(g):
            for i in range(60):
                if i == 37:
                    torch.index_select(w, 0, idx, out=o)  # NODE37
                else:
                    xs[i].add_(1)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        out["after_3"] = [float(xs[0][0]), float(xs[59][0])]
        idx.fill_(1000)                        # the bad index, into the static input
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", env={"CUDA_DEBUG_GRAPH_MARKERS": markers})
    r = c.result
    assert r is not None, c
    assert r["after_3"] == [3.0, 3.0], r
    assert r["cls"] == "DeviceAssertError", r
    assert r["node"] == 37, r
    assert "indexSelect" in r["kernel"], r
    assert r["exact"] is True, r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# NODE37"), r
    assert r["captured_at"] == _where(c, "# NODE37"), r
    assert r["replayed_at"] == _where(c, "# REPLAY"), r
    assert "node 37 of a CUDA graph" in r["text"], r["text"]
    assert r["graph_stats"]["nodes_marked"] == 60 and r["graph_stats"]["clear_rc"] == 0, r
    assert r["graph_stats"]["write_rc"] == 0 and r["graph_stats"]["kernel_rc"] == 0, r
    # the block on fd 2, written at the fault
    assert "(node 37 of a CUDA graph; replay launch #" in c.stderr, c.stderr[-3000:]
    assert "captured at %s in <module>" % _where(c, "# NODE37") in c.stderr, c.stderr[-3000:]
    assert "replayed at %s in <module>" % _where(c, "# REPLAY") in c.stderr, c.stderr[-3000:]


def test_fork_join_capture_gives_the_frontier(child):
    """A side stream forked from the capture and joined back: not exact; the
    assert text picks the faulting node; the main stream's first unfinished
    node is the other candidate."""
    needs("torch")
    c = child(TORCH + """
a, b, cc, d = (torch.zeros(16, device="cuda") for _ in range(4))
side = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
out = {}
try:
    with cuda_debug.watch():
        with torch.cuda.graph(g):
            a.add_(1)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.index_select(w, 0, idx, out=o)  # SIDE
                b.add_(1)
            cc.add_(1)
            torch.cuda.current_stream().wait_stream(side)
            d.add_(1)
        g.replay()
        torch.cuda.synchronize()
        out["good"] = [float(a[0]), float(b[0]), float(cc[0]), float(d[0])]
        idx.fill_(1000)
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["good"] == [1.0, 1.0, 1.0, 1.0], r
    assert r["node"] == 1 and "indexSelect" in r["kernel"], r
    assert r["lineno"] == c.line_of("# SIDE"), r
    assert r["exact"] is False, r
    nodes = [n for _, n in r["candidates"]]
    assert nodes and set(nodes) <= {3, 4}, r          # the main stream's first unfinished
    assert r["replayed_at"] == _where(c, "# REPLAY"), r


def test_torch_compile_reduce_overhead_names_the_kernel_and_the_function(child):
    needs("torch", "triton")
    c = child(CATCH + """
import torch
@torch.compile(mode="reduce-overhead")
def f(w, i):
    return w[i] * 2  # SOURCE
w = torch.randn(100, 8, device="cuda")
good = torch.zeros(4, dtype=torch.long, device="cuda")
bad = torch.full((4,), 1000, dtype=torch.long, device="cuda")
out = {}
try:
    with cuda_debug.watch():
        for _ in range(4):                     # warm-up, record, replays
            y = f(w, good)  # CALL
        torch.cuda.synchronize()
        out["captures"] = _core.graph_stats()["captures"]
        y = f(w, bad)  # BAD CALL
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", timeout=300)
    r = c.result
    assert r is not None, c
    assert r["captures"] >= 1, r                      # cudagraph trees captured inside watch()
    assert r["node"] is not None, r
    assert r["kernel"].startswith("triton_") or "index" in r["kernel"].lower(), r
    lines = {c.line_of("# SOURCE"), c.line_of("# CALL"), c.line_of("def f(w, i)"),
             c.line_of("@torch.compile")}
    assert r["filename"] == c.script and r["lineno"] in lines, r
    if r["lineno"] != c.line_of("# SOURCE"):
        assert "source line unknown" in r["text"], r["text"]
    assert r["replayed_at"].startswith(c.script + ":"), r
    assert "\n  torch.compile: " in r["text"], r["text"]


def test_graph_captured_before_watch_says_so(child):
    needs("torch")
    c = child(TORCH + """
xs = [torch.zeros(16, device="cuda") for _ in range(5)]
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for i in range(5):
        if i == 3:
            torch.index_select(w, 0, idx, out=o)
        else:
            xs[i].add_(1)
g.replay()
torch.cuda.synchronize()
idx.fill_(1000)
out = {}
try:
    with cuda_debug.watch():
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["node"] is None and r["kernel"] is None, r
    assert "captured before watching" in r["text"], r["text"]
    assert r["lineno"] == c.line_of("# REPLAY"), r
    assert "a CUDA graph replay (captured before watching" in c.stderr, c.stderr[-3000:]


def test_graph_results_are_the_same_with_and_without_watch(child):
    """A small training-like step (matmuls, a softmax, a reduction) captured
    twice, unwatched and watched, replayed on the same inputs: the outputs are
    bit for bit equal; the watched graph had markers (and a clear memset)."""
    needs("torch")
    c = child(CATCH + """
import torch
torch.manual_seed(0)
lin = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                          torch.nn.Linear(128, 10)).cuda()
x = torch.randn(32, 64, device="cuda")
def step():
    return torch.softmax(lin(x), dim=-1).sum(0)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step()                                  # warm-up outside the captures
torch.cuda.current_stream().wait_stream(s)
eager = step()
def capture():
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = step()
    return g, y
g0, y0 = capture()
with cuda_debug.watch():
    g1, y1 = capture()
    outs = []
    for g, y in ((g0, y0), (g1, y1)):
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        outs.append(y.clone())
report(dict(same=bool(torch.equal(outs[0], outs[1])), eager=bool(torch.equal(outs[0], eager)),
            marked=_core.graph_stats()["nodes_marked"], clear_rc=_core.graph_stats()["clear_rc"]))
""")
    r = c.result
    assert r is not None, c
    assert r["same"] is True, r
    assert r["marked"] >= 4 and r["clear_rc"] == 0, r


def test_fault_after_a_context_reset_is_named_and_nothing_crashes(child):
    """cuDevicePrimaryCtxReset (what cudaDeviceReset does) between two watch()
    blocks, then a real fault in the new context: the slots of the old one are
    never read (this segfaulted), and the fault is the cause, named."""
    c = child(CATCH + """
import ctypes
import cuda_debug.testing as t
cuda = ctypes.CDLL("libcuda.so.1")
def primary():
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    cuda.cuDevicePrimaryCtxRelease_v2(0)
    return ctx.value
out = {}
t.empty()                                      # a context before watch(): its entry is made there
with cuda_debug.watch():
    for _ in range(3):
        t.empty()
    cuda_debug.check()
    out["contexts_before"] = _core.graph_stats()["contexts"]
before = primary()
out["reset"] = cuda.cuDevicePrimaryCtxReset_v2(0)
out["same_pointer"] = primary() == before
try:
    with cuda_debug.watch():
        t.empty()
        out["incomplete"] = len(_core.watch_streams(0))      # read the slots: no SIGSEGV
        t.illegal_address()  # CULPRIT
        t.empty()
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
out["contexts_after"] = _core.graph_stats()["contexts"]
out["write_rc"] = _core.stats()["watch_write_rc"]
report(out)
""")
    assert c.returncode == 0, c
    r = c.result
    assert r is not None, c
    assert r["reset"] == 0, r
    # made at watch() entry by cuptiGetContextId, found by the launches' contextUid:
    # CUPTI's two ids of a context agree
    assert r["contexts_before"] == 1, r
    assert r["cls"] == "IllegalAddressError" and "write_wild" in r["kernel"], r
    assert r["lineno"] == c.line_of("# CULPRIT") and r["exact"] is True, r
    assert r["write_rc"] == 0, r                   # every marker of the new context written
    assert r["contexts_after"] == 1, r             # the old context's slots retired
    assert "already dead" not in c.stderr, c.stderr[-3000:]
